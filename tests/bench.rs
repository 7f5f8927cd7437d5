//! The load-test harness end to end: `hourglass bench record` writes a workload and its line
//! protocol; `hourglass bench replay` sends the recording through the embedded broker (and
//! through the in-process driver) and every point and field value is stored exactly once.
//! Timing goals are not asserted here: they live in BENCHMARKS.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::process::Command;

use serde_json::Value;
use util::run_for_json as hourglass;

#[test]
fn record_then_replay_stores_every_point_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let workload = ["--devices", "300", "--duration", "5m", "--interval", "10s", "--out-of-order-share", "0.05"];
    let mut args = vec!["bench", "record", "--out", "w.hgwl", "--line-protocol", "w.lp", "--frame-points", "1000"];
    args.extend(workload);
    let rec = hourglass(&args, dir.path());
    let (readings, diagnostics) =
        (rec["counts"]["readings"].as_u64().unwrap(), rec["counts"]["diagnostics"].as_u64().unwrap());
    let points = readings + diagnostics;
    let values = rec["field_values"].as_u64().unwrap();
    assert_eq!(values, readings * 7 + diagnostics * 4);
    assert!(rec["counts"]["missing"].as_u64().unwrap() > 0 && rec["counts"]["late"].as_u64().unwrap() > 0);
    assert_eq!(points + rec["counts"]["missing"].as_u64().unwrap(), 300 * 30 * 2);
    let lp = std::fs::read_to_string(dir.path().join("w.lp")).unwrap();
    assert_eq!(lp.lines().count() as u64, points);
    let meta: Value = serde_json::from_slice(&std::fs::read(dir.path().join("w.lp.meta.json")).unwrap()).unwrap();
    assert_eq!((meta["lines"].as_u64(), meta["field_values"].as_u64()), (Some(points), Some(values)));

    // Through the embedded broker at QoS 1, open loop at a set rate, with the report files.
    let args = "bench replay --file w.hgwl --driver mqtt --qos 1 --connections 3 --per-message 50 --rate 20000 \
                --query-rate 50 --report-dir report --data-dir mqtt-data";
    let mqtt = hourglass(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    assert_eq!(mqtt["sent"].as_u64(), Some(points));
    assert_eq!(mqtt["stored"].as_u64(), Some(points));
    assert_eq!(mqtt["stored_values"].as_u64(), Some(values), "a full scan finds every value once");
    // Compacted on the store reopened alone, each compaction split across every core.
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    let compaction = &mqtt["compaction"];
    assert_eq!(compaction["subcompactions"].as_u64(), Some(cores), "{compaction}");
    assert!(compaction["seconds"].as_f64().unwrap() > 0.0, "{compaction}");
    assert!(compaction["data_dir_bytes_after"].as_u64().unwrap() > 0, "{compaction}");
    assert_eq!(mqtt["values"].as_u64(), Some(values));
    // What the run's store ran with, from the OPTIONS file RocksDB wrote (before the compaction
    // reopened it with one subcompaction a core).
    let options = &mqtt["setup"]["store_options"];
    let buckets = &options["buckets"];
    let limits = [
        &buckets["level0_file_num_compaction_trigger"],
        &buckets["level0_slowdown_writes_trigger"],
        &buckets["level0_stop_writes_trigger"],
    ];
    let want = [
        bucketer::store::BUCKETS_L0_COMPACTION_TRIGGER,
        bucketer::store::BUCKETS_L0_SLOWDOWN,
        bucketer::store::BUCKETS_L0_STOP,
    ]
    .map(|n| Value::from(n.to_string()));
    assert_eq!(limits, want.each_ref(), "{options}");
    assert_eq!(buckets["max_bytes_for_level_base"], bucketer::store::BUCKETS_LEVEL_BASE_BYTES.to_string());
    assert_eq!(buckets["compaction_style"], "kCompactionStyleLevel", "{options}");
    assert_eq!(buckets.as_object().unwrap().len(), 9, "{options}");
    assert_eq!(options["db"]["max_subcompactions"], bucketer::DEFAULT_SUBCOMPACTIONS.to_string(), "{options}");
    let e2e = mqtt["e2e_latency"]["count"].as_u64().unwrap();
    // Samples of devices' later points (ticks 1–29 of 30) are a part of all samples.
    let known = mqtt["e2e_latency_known"]["count"].as_u64().unwrap();
    assert!(e2e > 0 && known > 0 && known <= e2e, "{mqtt}");
    assert!(mqtt["queries"]["latest"]["count"].as_u64().unwrap() > 0, "{mqtt}");
    // Five minutes of data close no hour while the run goes: every roll-up answer is empty,
    // and the report says so.
    let rollups = mqtt["queries"]["rollup"]["count"].as_u64().unwrap();
    assert!(rollups > 0, "{mqtt}");
    assert_eq!(mqtt["queries"]["rollup_empty"].as_u64(), Some(rollups), "{mqtt}");
    // The series ends with the run (when the last point was stored); its last window, when
    // there are others, is at least half a second.
    let ends: Vec<f64> = mqtt["seconds"].as_array().unwrap().iter().map(|s| s["t_s"].as_f64().unwrap()).collect();
    assert!(!ends.is_empty());
    let wall = mqtt["wall_seconds"].as_f64().unwrap();
    let last = *ends.last().unwrap();
    assert!((last - wall).abs() < 1e-9, "{ends:?}: the last window ends with the run at {wall} s");
    // Its windows add up to every point stored.
    let mut from = 0.0;
    let summed: f64 = mqtt["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let t = s["t_s"].as_f64().unwrap();
            s["stored_per_s"].as_f64().unwrap() * (t - std::mem::replace(&mut from, t))
        })
        .sum();
    assert!((summed - points as f64).abs() < 1e-6 * points as f64, "{summed} of {points}");
    assert!(ends.windows(2).all(|w| w[0] < w[1]), "{ends:?}");
    if let [.., before, last] = ends[..] {
        assert!(last - before >= 0.5, "a last window {before}..{last} s in {ends:?}");
    }
    assert!(mqtt["peak_rss_bytes"].as_u64().unwrap() > 0);
    for f in ["report.json", "report.md", "report.png"] {
        assert!(dir.path().join("report").join(f).exists(), "{f}");
    }
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains("CPU over the run, by thread name:"), "{md}");
    assert!(md.contains("CPU a stored point: **"), "{md}");
    assert!(md.contains(&format!("s, split across {cores} threads; data dir ")), "{md}");
    // The publishers run on a runtime of their own: its worker and the source's reader.
    let load = harness_load(&mqtt);
    assert!(load["threads"].as_u64().unwrap() >= 2 && load["seconds"].as_f64().unwrap() > 0.0, "{load}");
    check_cpu_per_point(&mqtt);
    // The workload's integer field is an i64 also when it came as JSON (the harness declares
    // it): as line protocol and the in-process driver store it.
    let hg = util::Hourglass::start(&dir.path().join("mqtt-data"), None);
    let (status, def) = hg.get("/v1/tables/iot.diagnostics");
    assert_eq!(status, 200, "{def}");
    let types: Vec<(&str, &str)> = def["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap(), f["type"].as_str().unwrap()))
        .collect();
    assert_eq!(types.len(), 4, "{def}");
    for (name, ty) in types {
        assert_eq!(ty, if name == "status" { "i64" } else { "f64" }, "{def}");
    }
    let (_, latest) = hg.get("/v1/tables/iot.diagnostics/latest?devices=truck_0");
    assert!(latest["latest"][0]["reading"]["status"].is_i64(), "{latest}");
    drop(hg);

    // As fast as possible through the embedded broker, with at most 2,000 points sent and
    // not stored: the publishers wait for the store, and every point is stored; each table read
    // on a connection of its own.
    let args = "bench replay --file w.hgwl --driver mqtt --max-backlog 2000 --query-rate 0 --no-compaction \
                --subscription-per-table";
    let fast = hourglass(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    assert_eq!(fast["sent"].as_u64(), Some(points));
    assert_eq!(fast["stored"].as_u64(), Some(points));
    assert_eq!(
        fast["setup"]["subscriptions"],
        serde_json::json!(["hourglass/iot.readings/#", "hourglass/iot.diagnostics/#"]),
        "{}",
        fast["setup"]
    );
    assert_eq!(mqtt["setup"]["subscriptions"], serde_json::json!([]));
    assert_eq!(fast["setup"]["max_backlog_points"].as_u64(), Some(2000), "{}", fast["setup"]);
    assert_eq!(fast["setup"]["rate_points_per_s"], "max");
    assert_eq!((&fast["compaction"], &fast["bytes_per_value"]), (&Value::Null, &Value::Null), "--no-compaction");
    assert_eq!(mqtt["setup"]["max_backlog_points"], Value::Null, "none at a set rate");

    // The same workload generated on the fly, in process, as fast as possible.
    let mut args = vec!["bench", "replay", "--driver", "in-process", "--batch-points", "777", "--query-rate", "0"];
    args.extend(workload);
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(&args)
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // No MQTT beside the in-process driver.
    assert!(err.contains("MQTT is off") && !err.contains("embedded MQTT broker listening"), "{err}");
    // Logged in plain text, stderr being no terminal: no colours' escapes (QA50 L5).
    assert!(err.contains("  INFO hourglass::serve: MQTT is off") && !err.contains('\u{1b}'), "{err}");
    let inproc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inproc["stored"].as_u64(), Some(points));
    assert_eq!(inproc["stored_values"].as_u64(), Some(values));
    // However short the run, its series has a window, ending with it.
    let series = inproc["seconds"].as_array().unwrap();
    let (last, wall) = (series.last().unwrap()["t_s"].as_f64().unwrap(), inproc["wall_seconds"].as_f64().unwrap());
    assert!(last <= wall && wall - last < 0.5, "{series:?} of a run of {wall} s");
    // CPU by thread name: the in-process driver writes on the runtime's blocking threads and
    // builds the readings on one thread of the harness.
    let cpu = inproc["cpu"].as_array().unwrap();
    let tokio: f64 = cpu
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("tokio-")))
        .map(|t| t["seconds"].as_f64().unwrap())
        .sum();
    assert!(tokio > 0.0, "{cpu:?}");
    let load = harness_load(&inproc);
    assert!(load["threads"].as_u64() == Some(1) && load["seconds"].as_f64().unwrap() > 0.0, "{load}");
    check_cpu_per_point(&inproc);
}

/// A replay into a store that holds the workload's tables already (a `--data-dir` used before)
/// measures no end-to-end latency (`latest` would answer the old readings at once) and does not
/// check the values a full scan finds (the old ones are among them); into a fresh store it
/// checks them.
/// Through an external broker as Debian ships it (mosquitto queues 1,000 messages for a
/// subscriber and drops the rest), a replay as fast as possible keeps by default within that
/// queue and stores every point (with the embedded broker's default of 500,000 points, about
/// 15% of this workload was dropped and the run failed).
#[test]
fn a_replay_through_a_stock_mosquitto_keeps_within_its_queue() {
    let broker = util::Mosquitto::start_with("");
    let dir = tempfile::tempdir().unwrap();
    let url = broker.url();
    let args = format!(
        "bench replay --devices 1000 --duration 10m --interval 10s --driver mqtt --mqtt-url {url} --query-rate 0 \
         --no-compaction"
    );
    let args: Vec<&str> = args.split_whitespace().collect();
    let report = hourglass(&args, dir.path());
    // 1,000 trucks × 60 ticks × 2 tables less the seed's 1,176 missing points.
    let points = 118_824;
    assert_eq!(report["points"].as_u64(), Some(points));
    assert_eq!((report["sent"].as_u64(), report["stored"].as_u64()), (Some(points), Some(points)));
    assert_eq!(report["setup"]["max_backlog_points"].as_u64(), Some(250 * 100));
    assert_eq!(report["setup"]["broker"].as_str(), Some(url.as_str()));
    // The pipeline's session (a client id of the run's own) was ended after the run, so the
    // broker queues nothing more for it: taken up again, there is none.
    let ids = report["setup"]["mqtt_client_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].as_str().unwrap();
    assert!(id.starts_with("hourglass-bench-"), "{id}");
    let mut options = rumqttc::MqttOptions::new(id, "127.0.0.1", broker.port);
    options.set_clean_session(false);
    let (_client, mut connection) = rumqttc::Client::new(options, 4);
    let present = connection.iter().take(10).find_map(|event| match event {
        Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack))) => Some(ack.session_present),
        _ => None,
    });
    assert_eq!(present, Some(false), "the run's session on the broker is still there");
}

#[test]
fn a_replay_into_a_store_holding_the_workload_measures_no_e2e_latency() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "replay",
        "--driver",
        "in-process",
        "--devices",
        "100",
        "--duration",
        "2m",
        "--interval",
        "10s",
        "--rate",
        "4000",
        "--batch-points",
        "100",
        "--query-rate",
        "0",
        "--data-dir",
        "data",
    ];
    let first = hourglass(&args, dir.path());
    let values = first["values"].as_u64().unwrap();
    assert_eq!(first["setup"]["store_held_workload_tables"], serde_json::json!([]));
    assert_eq!((first["stored_values"].as_u64(), first["expected_values"].as_u64()), (Some(values), Some(values)));
    assert!(first["e2e_latency"]["count"].as_u64().unwrap() > 0, "{}", first["e2e_latency"]);

    let again = hourglass(&args, dir.path());
    assert_eq!(again["setup"]["store_held_workload_tables"], serde_json::json!(["iot.readings", "iot.diagnostics"]));
    assert_eq!(again["e2e_latency"]["count"].as_u64(), Some(0), "{}", again["e2e_latency"]);
    assert_eq!(again["stored"].as_u64(), first["stored"].as_u64());
    // The same points again replace themselves: the scan finds each once, unchecked.
    assert_eq!((again["stored_values"].as_u64(), &again["expected_values"]), (Some(values), &Value::Null));

    // Under another prefix the workload's tables are new, but the scan counts the first run's
    // values too: unchecked (it failed the run with "found 2x where x were sent").
    let mut other = args.to_vec();
    other.extend(["--table-prefix", "other"]);
    let beside = hourglass(&other, dir.path());
    assert_eq!(beside["setup"]["store_held_workload_tables"], serde_json::json!([]));
    assert_eq!(beside["setup"]["store_held_other_tables"], serde_json::json!(["iot.diagnostics", "iot.readings"]));
    assert!(beside["e2e_latency"]["count"].as_u64().unwrap() > 0, "{}", beside["e2e_latency"]);
    assert_eq!((beside["stored_values"].as_u64(), &beside["expected_values"]), (Some(2 * values), &Value::Null));
}

/// A recording cut short is refused before the replay starts: the run fails with the reason and
/// sends nothing (it used to fail once the replay reached the cut, its report lost).
#[test]
fn a_recording_cut_short_fails_the_replay_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let args = "bench record --out w.hgwl --devices 200 --duration 10m --interval 10s --frame-points 500";
    hourglass(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    let path = dir.path().join("w.hgwl");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["bench", "replay", "--file", "w.hgwl", "--driver", "in-process", "--query-rate", "0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a cut recording replayed: {err}");
    assert!(err.contains("w.hgwl: truncated (no end marker)"), "{err}");
    assert!(!err.contains("embedded MQTT broker listening"), "the pipeline was started: {err}");
}

/// Output paths that cannot work are refused before the run: one file for the recording and
/// its line protocol, a report directory that is a file.
#[test]
fn unusable_output_paths_are_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let fail = |args: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(args.split_whitespace())
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args}");
        (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (_, err) = fail("bench record --devices 2 --duration 20s --out same.bin --line-protocol ./same.bin");
    assert!(err.contains("--out and --line-protocol name one file, same.bin: give each its own"), "{err}");
    assert!(!dir.path().join("same.bin").exists());
    // One path that cannot be written leaves neither file behind.
    let (_, err) = fail("bench record --devices 2 --duration 20s --out w.hgwl --line-protocol no/such/dir/w.lp");
    assert!(err.contains("--line-protocol no/such/dir/w.lp: No such file or directory"), "{err}");
    let (_, err) = fail("bench record --devices 2 --duration 20s --out no/such/dir/w.hgwl --line-protocol w.lp");
    assert!(err.contains("Error: no/such/dir/w.hgwl: No such file or directory"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::write(dir.path().join("afile"), b"x").unwrap();
    let (out, err) = fail("bench replay --devices 2 --duration 20s --query-rate 0 --report-dir afile");
    assert!(
        err.contains("Error: --report-dir afile: not a directory (the report's files are written into one)"),
        "{err}"
    );
    assert!(!err.contains("embedded MQTT broker listening"), "the run started: {err}");
    assert_eq!(out, "");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("dangling")).unwrap();
    let (out, err) = fail("bench replay --devices 2 --duration 20s --query-rate 0 --report-dir dangling");
    assert!(
        err.contains("Error: --report-dir dangling: not a directory (the report's files are written into one)"),
        "{err}"
    );
    assert_eq!(out, "");
}

/// The report's `bench-load` threads: the workload's generation and sending.
fn harness_load(report: &Value) -> Value {
    let cpu = report["cpu"].as_array().unwrap();
    cpu.iter().find(|t| t["name"] == "bench-load").unwrap_or_else(|| panic!("no bench-load in {cpu:?}")).clone()
}

/// `cpu_per_point` is the report's CPU over its stored points, the `bench-*` threads apart.
fn check_cpu_per_point(report: &Value) {
    let stored = report["stored"].as_f64().unwrap();
    let (mut harness, mut pipeline) = (0.0, 0.0);
    for t in report["cpu"].as_array().unwrap() {
        let us = t["seconds"].as_f64().unwrap() * 1e6 / stored;
        match t["name"].as_str().unwrap().starts_with("bench-") {
            true => harness += us,
            false => pipeline += us,
        }
    }
    let per_point = &report["cpu_per_point"];
    for (got, want) in [(&per_point["harness_us"], harness), (&per_point["pipeline_us"], pipeline)] {
        let got = got.as_f64().unwrap();
        assert!(want > 0.0 && (got - want).abs() <= want * 1e-9, "{per_point} against {harness} / {pipeline}");
    }
}

#[test]
fn bad_replay_input_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk.hgwl"), b"not a recording at all").unwrap();
    for (args, reason) in [
        (vec!["bench", "replay", "--file", "junk.hgwl"], "magic"),
        (vec!["bench", "replay", "--qos", "2"], "--qos"),
        (vec!["bench", "replay", "--driver", "kafka"], "--driver kafka needs --kafka-brokers"),
        (vec!["bench", "record", "--out", "x", "--duration", "ten"], "--duration"),
        (vec!["bench", "record", "--out", "x", "--missing-share", "0.8", "--out-of-order-share", "0.8"], "exceed"),
        (
            vec!["bench", "record", "--out", "x", "--duration", "65s"],
            "--duration 65s is not a whole number of --interval 10s (6 ticks and 5000 ms more)",
        ),
        // Flags the run would ignore.
        (vec!["bench", "replay", "--file", "w.hgwl", "--devices", "5"], "'--file <FILE>' cannot be used with"),
        (vec!["bench", "replay", "--file", "w.hgwl", "--batch-points", "5"], "cannot be used with '--batch-points"),
        (
            vec!["bench", "replay", "--driver", "in-process", "--qos", "0", "--per-message", "5", "--kafka-preload"],
            "--qos, --per-message, --kafka-preload would be ignored by this run's driver, in-process",
        ),
        (
            vec!["bench", "replay", "--driver", "kafka", "--kafka-brokers", "h:1", "--connections", "2"],
            "--connections would be ignored by this run's driver, kafka",
        ),
        (
            vec!["bench", "replay", "--driver", "kafka", "--kafka-brokers", "h:1", "--kafka-preload", "--rate", "5"],
            "--rate would be ignored with --kafka-preload: the workload is produced as fast as possible",
        ),
        (
            vec!["bench", "replay", "--mqtt-url", "mqtt://127.0.0.1:1", "--mqtt-listen", "127.0.0.1:0"],
            "--mqtt-listen would be ignored with --mqtt-url: the run publishes through that broker and starts none of \
             its own",
        ),
        (vec!["bench", "replay", "--query-rate", "NaN"], "--query-rate must be 0 (no queries) or at least 0.001"),
        (vec!["bench", "replay", "--rate", "1e-300"], "--rate must be 0 (as fast as possible) or at least 0.001"),
        (
            vec!["bench", "replay", "--driver", "kafka", "--kafka-brokers", "127.0.0.1:1", "--query-rate", "1e-300"],
            "--query-rate must be 0 (no queries) or at least 0.001",
        ),
        (vec!["bench", "record", "--out", "x", "--missing-share", "1"], "the missing share must be below 1"),
        // A message the pipeline would take as a dead letter: 20,000 points of JSON, above 1 MiB.
        (
            "bench replay --devices 1000 --duration 10m --per-message 20000 --batch-points 40000 --query-rate 0"
                .split_whitespace()
                .collect(),
            "the pipeline takes (mqtt.max_payload_bytes): lower --per-message",
        ),
        // A broker that is not there: the connection's own error, not the client's.
        (
            vec!["bench", "replay", "--devices", "10", "--duration", "1m", "--mqtt-url", "mqtt://127.0.0.1:1"],
            "MQTT connection 0 to 127.0.0.1:1: I/O: Connection refused",
        ),
        // A host that does not resolve (`.invalid` never does), said before the run.
        (
            vec!["bench", "replay", "--devices", "10", "--mqtt-url", "no-such-broker.invalid"],
            "--mqtt-url no-such-broker.invalid: the host \"no-such-broker.invalid\" does not resolve",
        ),
        // A TLS listener: the harness's clients reach a broker over plain TCP.
        (
            vec![
                "bench",
                "replay",
                "--devices",
                "10",
                "--duration",
                "1m",
                "--mqtt-url",
                "mqtts://127.0.0.1:8883",
                "--report-dir",
                "never",
            ],
            "--mqtt-url mqtts://127.0.0.1:8883: a load test reaches its broker over plain TCP without a login",
        ),
        (
            vec!["bench", "mqtt", "--devices", "10", "--mqtt-url", "ssl://127.0.0.1"],
            "--mqtt-url ssl://127.0.0.1: a load test reaches its broker over plain TCP without a login",
        ),
        // Hours after the clock cannot be closed (2100-01-01).
        (
            vec![
                "bench",
                "replay",
                "--driver",
                "in-process",
                "--devices",
                "1",
                "--close-hours",
                "--start-ms",
                "4102444800000",
            ],
            "--close-hours needs the workload's hours in the past: closing them takes a reading at \
             2100-01-01T02:10:00.000Z, after the clock",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hourglass")).args(&args).current_dir(dir.path()).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(reason), "{args:?}: {err}");
    }
    // A run refused before it starts leaves no report directory.
    assert!(!dir.path().join("never").exists());
}

/// Runs hourglass with `args` (split at whitespace) in `dir`: its output, and its stderr as text.
fn run_in(args: &str, dir: &std::path::Path) -> (std::process::Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass")).args(args.split_whitespace()).current_dir(dir).output();
    let out = out.unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

/// Starts `bench replay` with `args` in `dir` and waits for its query service's address (at
/// most 120 s), then for its first stored readings (at most 60 s): the replay, and how many
/// readings were stored then (`None`: none within the wait).
fn replay_until_stored(args: &str, dir: &std::path::Path) -> (util::Watched, Option<u64>) {
    use std::time::Duration;

    let replay = util::Watched::start(&args.split_whitespace().collect::<Vec<_>>(), dir);
    let http = replay
        .find_log(Duration::from_secs(120), |v| v["fields"]["http_addr"].as_str().map(str::to_owned))
        .expect("the replay's query service says where it listens within 120 s");
    let stored = util::wait_for(Duration::from_secs(60), || {
        let (_, stats) = util::get_json(&format!("http://{http}/v1/stats"));
        stats["store"]["readings"].as_u64().filter(|&n| n > 0)
    });
    (replay, stored)
}

/// An interrupt stops a long replay early: the driver sends nothing more, waits until what it
/// sent is stored, and reports those points, saying it stopped early.
#[test]
fn an_interrupted_replay_reports_what_it_sent_and_stored() {
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    // 2,000 devices × 1 h at 1 s, both tables: 14.4M points, about 48 min at the set rate.
    let planned = 2_000 * 3_600 * 2;
    let args = "bench replay --devices 2000 --duration 1h --interval 1s --driver mqtt --rate 5000 --query-rate 5 \
                --report-dir report";
    let (replay, stored) = replay_until_stored(args, dir.path());
    assert!(stored.is_some(), "nothing stored within 60 s");
    replay.interrupt();
    let (exit, logs, out) = replay.finish(Duration::from_secs(120));
    let report: Value = serde_json::from_str(&out).expect("a JSON report on stdout");
    let (sent, stored) = (report["sent"].as_u64().unwrap(), report["stored"].as_u64().unwrap());
    // The report of part of the workload, and an exit that says so.
    assert_eq!(exit.code(), Some(130), "exit {exit} after SIGINT; logs:\n{}", logs.join("\n"));
    let end =
        format!("interrupted: the report covers the {sent} points sent before the interrupt, not the whole workload");
    assert!(logs.iter().any(|l| l.contains(&end)), "{}", logs.join("\n"));
    assert_eq!(report["interrupted"], true);
    assert!(sent > 0 && sent < planned, "{sent} of {planned}");
    assert_eq!(stored, sent, "everything sent before the interrupt is stored");
    // No compaction after an interrupt: no bytes per value.
    assert_eq!(report["bytes_per_value"], Value::Null);
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains(&format!("**Stopped early** by an interrupt, after {sent} points were sent")), "{md}");
    assert!(md.contains(&format!("| points (stored / sent, stopped early) | {sent} / {sent} |")), "{md}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report").join("report.json")).unwrap()).unwrap();
    assert_eq!((json["interrupted"].as_bool(), json["sent"].as_u64()), (Some(true), Some(sent)));
    assert!(logs.iter().any(|l| l.contains("interrupted: nothing more is sent")), "{}", logs.join("\n"));
}

/// A set rate the run cannot hold is said: `rate_held` false in the report, a warning and a
/// line in the summary (the run exits 0: its figures stand, of another rate). A rate it holds
/// is `rate_held` true.
#[test]
fn a_rate_the_run_cannot_hold_is_said() {
    let dir = tempfile::tempdir().unwrap();
    // 10,000 trucks × 1 h at 10 s: 7.1M points (1% missing), asked in about 7 ms; they take seconds.
    // Queries asked at a million a second: they fall behind too (QA62 F11).
    let args = "bench replay --devices 10000 --duration 1h --driver in-process --rate 1000000000 --query-rate 1000000 \
                --no-compaction --report-dir report";
    let (out, err) = run_in(args, dir.path());
    assert!(out.status.success(), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rate_held"], false, "{report}");
    assert!(report["send_behind_seconds"].as_f64().unwrap() > 1.0, "{report}");
    assert!(err.contains("Rate not held: 1000000000 points/s were asked, and "), "{err}");
    assert!(err.contains(&format!("the last of the {} points was sent ", report["sent"])), "{err}");
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains("**Rate not held**: 1000000000 points/s were asked, and "), "{md}");
    assert!(report["queries"]["behind_seconds"].as_f64().unwrap() > 1.0, "{report}");
    assert!(md.contains("**Query rate not held**: 1000000 queries/s were asked and "), "{md}");
    assert!(err.contains("Query rate not held: 1000000 queries/s were asked and "), "{err}");

    let held = hourglass(
        &"bench replay --devices 10 --duration 5m --driver in-process --rate 200 --query-rate 0 --no-compaction"
            .split_whitespace()
            .collect::<Vec<_>>(),
        dir.path(),
    );
    assert_eq!(held["rate_held"].as_bool(), Some(true), "{held}");
    assert_eq!(held["stored"], held["sent"], "{held}");
}

/// `bench report` draws a run's summary and chart again from its JSON: the same bytes the run
/// wrote, beside the JSON under its name (dots and all) or in `--out-dir`; a file that is not
/// a report is refused with the reason.
#[test]
fn a_runs_summary_and_chart_are_drawn_again_from_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let args = "bench replay --devices 10 --duration 5m --driver in-process --query-rate 0 --no-compaction \
                --report-dir report";
    let (out, err) = run_in(args, dir.path());
    assert!(out.status.success(), "{err}");
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    std::fs::write(dir.path().join("run.v2.json"), read("report/report.json")).unwrap();
    let (out, err) = run_in("bench report run.v2.json", dir.path());
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "wrote run.v2.md and run.v2.png\n");
    assert_eq!(read("run.v2.md"), read("report/report.md"));
    assert_eq!(read("run.v2.png"), read("report/report.png"));
    let (out, err) = run_in("bench report report/report.json --out-dir again", dir.path());
    assert!(out.status.success(), "{err}");
    assert_eq!(read("again/report.png"), read("report/report.png"));
    let (out, err) = run_in("bench report missing.json", dir.path());
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("read missing.json") && err.contains("No such file or directory"), "{err}");
    std::fs::write(dir.path().join("other.json"), br#"{"points": 1}"#).unwrap();
    let (out, err) = run_in("bench report other.json", dir.path());
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("other.json") && err.contains("report: not a run's report.json: missing field"), "{err}");
    assert!(!dir.path().join("other.md").exists());
}

/// The run's query service and embedded broker listen where `--http-listen` and
/// `--mqtt-listen` say (they took free ports whatever was asked, so a host that allows a range
/// of ports could not hold a run to it).
#[test]
fn a_replay_listens_where_it_is_told() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (http, mqtt) = (free(), free());
    let dir = tempfile::tempdir().unwrap();
    let args = format!(
        "bench replay --log-json --devices 10 --duration 1m --driver mqtt --query-rate 0 --no-compaction \
         --http-listen {http} --mqtt-listen {mqtt}"
    );
    let (out, err) = run_in(&args, dir.path());
    assert!(out.status.success(), "{err}");
    let logs: Vec<Value> = err.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let field = |name: &str| logs.iter().filter_map(|l| l["fields"][name].as_str().map(str::to_owned)).next();
    assert_eq!(field("http_addr"), Some(http.to_string()), "{err}");
    let port =
        logs.iter().find_map(|l| (l["fields"]["message"] == "MQTT consumer starting").then(|| &l["fields"]["port"]));
    assert_eq!(port.and_then(Value::as_u64), Some(u64::from(mqtt.port())), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["stored"], report["sent"]);
    // A variable of `serve`'s configuration is not read by a replay, and it says so.
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["bench", "replay", "--devices", "2", "--duration", "20s", "--driver", "in-process", "--query-rate", "0"])
        .env("HOURGLASS_HTTP__LISTEN", "127.0.0.1:1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let said = "a replay's pipeline is set by its flags alone: these HOURGLASS_* variables are not read";
    assert!(err.contains(said) && err.contains("HOURGLASS_HTTP__LISTEN"), "{err}");
}

/// At a low rate an interrupt ends the wait for the next batch's intended time: the run sends
/// nothing more and reports at once, in-process and through MQTT (it slept until the next batch
/// was due, 100 s here, and then sent it).
#[test]
fn an_interrupt_ends_the_wait_for_the_next_batch() {
    use std::time::Duration;

    for driver in ["in-process", "mqtt"] {
        let dir = tempfile::tempdir().unwrap();
        // One point every 100 s: the first at the start, the second 100 s later.
        let args = format!(
            "bench replay --devices 10 --duration 1m --driver {driver} --rate 0.01 --query-rate 0 --no-compaction"
        );
        let (replay, stored) = replay_until_stored(&args, dir.path());
        assert_eq!(stored, Some(1), "{driver}: the first point within 60 s");
        replay.interrupt();
        let (exit, logs, out) = replay.finish(Duration::from_secs(60));
        assert_eq!(exit.code(), Some(130), "{driver}: exit {exit}; logs:\n{}", logs.join("\n"));
        let report: Value = serde_json::from_str(&out).expect("a JSON report on stdout");
        assert_eq!((report["sent"].as_u64(), report["stored"].as_u64()), (Some(1), Some(1)), "{driver}");
        assert_eq!(report["interrupted"], true);
    }
}

#[test]
fn an_interrupt_during_the_compaction_reports_the_whole_run_without_it() {
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    // 10,000 trucks × 1 h at 10 s: 7.1M points in process, then a full compaction and scan of
    // a few seconds, which the interrupt comes in.
    let args = "bench replay --devices 10000 --duration 1h --interval 10s --driver in-process --query-rate 0 \
                --report-dir report";
    let replay = util::Watched::start(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    let compacting = replay.find_log(Duration::from_secs(300), |v| {
        v["fields"]["message"].as_str().filter(|m| m.starts_with("compacting every column family fully")).map(|_| ())
    });
    assert!(compacting.is_some(), "no compaction began within 300 s");
    replay.interrupt();
    let (exit, logs, out) = replay.finish(Duration::from_secs(120));
    let all = logs.join("\n");
    assert_eq!(exit.code(), Some(130), "exit {exit} after SIGINT; logs:\n{all}");
    assert!(all.contains("interrupted during the compaction after the run: reporting without it"), "{all}");
    let report: Value = serde_json::from_str(&out).expect("a JSON report on stdout");
    let points = report["points"].as_u64().unwrap();
    // The whole workload (10,000 × 360 × 2 slots less the missing share), every point stored.
    assert!(points > 7_100_000 && points < 7_200_000, "{points}");
    assert_eq!((report["sent"].as_u64(), report["stored"].as_u64()), (Some(points), Some(points)));
    assert_eq!(
        (report["interrupted"].as_bool(), report["interrupted_after_sending"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!((&report["bytes_per_value"], &report["compaction"]), (&Value::Null, &Value::Null));
    let end = format!("interrupted once the whole workload ({points} points) was sent and stored");
    assert!(all.contains(&end), "{all}");
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains("**Interrupted** once the whole workload was sent"), "{md}");
    assert!(!md.contains("Stopped early"), "{md}");
}

/// An interrupted `record` removes the files it had begun (a line protocol cut short would
/// load into a peer as if it were the workload) and exits 130, saying so. They are written
/// under temporary names: a recording that was at `--out` before the run is left as it was
/// (the recording was written in place, and an interrupt removed whatever `--out` named, a
/// device such as `/dev/null` included).
#[test]
fn an_interrupted_recording_removes_its_files() {
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let earlier = b"an earlier recording".to_vec();
    std::fs::write(dir.path().join("w.hgwl"), &earlier).unwrap();
    // 50,000 trucks × 1 h at 10 s: 36M points, many seconds of writing.
    let args = "bench record --devices 50000 --duration 1h --out w.hgwl --line-protocol w.lp";
    let record = util::Watched::start(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    let temp = dir.path().join(format!(".w.hgwl.partial-{}", record.id()));
    let begun = util::wait_for(Duration::from_secs(60), || {
        std::fs::metadata(&temp).ok().filter(|m| m.len() > 1 << 20).map(|_| ())
    });
    assert!(begun.is_some(), "no recording begun within 60 s");
    assert_eq!(std::fs::read(dir.path().join("w.hgwl")).unwrap(), earlier, "replaced before it was whole");
    record.interrupt();
    let (exit, logs, out) = record.finish(Duration::from_secs(60));
    let all = logs.join("\n");
    assert_eq!(exit.code(), Some(130), "exit {exit}; logs:\n{all}");
    let said = "interrupted: the recording and its line protocol, cut short, were removed; what was at --out and \
                --line-protocol before the run is as it was";
    assert!(all.contains(said), "{all}");
    assert_eq!(out, "", "no summary of a recording cut short");
    assert_eq!(std::fs::read(dir.path().join("w.hgwl")).unwrap(), earlier);
    let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["w.hgwl"]);
}

/// `record`'s outputs through a symbolic link and into a FIFO: the link stays a link, its target
/// becomes the recording; the FIFO stays a FIFO (written in place, as `/dev/null` is), its reader
/// gets the whole line protocol, and no `.meta.json` is written beside it.
#[test]
fn a_recording_follows_a_link_and_writes_into_a_fifo_in_place() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;

    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("target.hgwl", dir.path().join("link.hgwl")).unwrap();
    let fifo = dir.path().join("lp.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Read on a thread of its own; waited for at most 60 s (an open of a FIFO no one writes
    // waits for ever).
    let (tx, read) = std::sync::mpsc::channel();
    {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            std::fs::File::open(fifo).unwrap().read_to_string(&mut text).unwrap();
            tx.send(text).unwrap();
        });
    }
    let args = "bench record --devices 20 --duration 5m --out link.hgwl --line-protocol lp.fifo";
    let rec = hourglass(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    let text = read.recv_timeout(std::time::Duration::from_secs(60)).expect("the line protocol through the FIFO");
    let points = rec["counts"]["readings"].as_u64().unwrap() + rec["counts"]["diagnostics"].as_u64().unwrap();
    assert_eq!(text.lines().count() as u64, points);
    assert_eq!(rec["line_protocol"]["bytes"].as_u64(), Some(text.len() as u64));
    assert_eq!(rec["line_protocol"]["meta"], Value::Null);
    assert!(std::fs::symlink_metadata(dir.path().join("link.hgwl")).unwrap().file_type().is_symlink());
    let target = dir.path().join("target.hgwl");
    assert_eq!(rec["bytes"].as_u64(), Some(std::fs::metadata(&target).unwrap().len()));
    let mut reader = bench::record::RecordReader::open(&target).unwrap();
    let mut read = 0u64;
    let mut frame = Vec::new();
    while reader.next_frame(&mut frame).unwrap() {
        read += frame.len() as u64;
    }
    assert_eq!((read, reader.recorded_points()), (points, Some(points)));
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["link.hgwl", "lp.fifo", "target.hgwl"]);
}

/// A run whose points stop being stored (a broker that drops what its queue cannot hold, here
/// mosquitto queueing 10 messages, and no backlog limit) fails after the stall limit (60 s),
/// saying why, and still reports the run until then.
#[test]
fn a_run_the_system_stops_storing_fails_with_its_report() {
    let broker = util::Mosquitto::start_with("max_queued_messages 10\n");
    let dir = tempfile::tempdir().unwrap();
    let args = format!(
        "bench replay --devices 1000 --duration 10m --interval 10s --driver mqtt --mqtt-url {} --max-backlog 0 \
         --query-rate 0 --report-dir report",
        broker.url()
    );
    let (out, err) = run_in(&args, dir.path());
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the run failed (its report is of the run until then)"), "{err}");
    assert!(err.contains("were not all stored: a broker drops what its queue for a subscriber cannot hold"), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report on stdout");
    let (sent, stored) = (report["sent"].as_u64().unwrap(), report["stored"].as_u64().unwrap());
    assert_eq!(sent, 118_824, "every point was sent (acked by the broker)");
    assert!(stored < sent, "{stored} of {sent}");
    let failed = report["failed"].as_str().unwrap();
    assert!(
        failed.starts_with(&format!("stalled: stored count stuck at {stored} of {sent} points for 60s")),
        "{failed}"
    );
    assert_eq!(report["compaction"], Value::Null, "no compaction after a failed run");
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains("**Failed**: stalled: stored count stuck at"), "{md}");
    // Why, in the report too (it was on stderr only).
    assert!(failed.contains("; points sent through mqtt://"), "{failed}");
}

/// A driver that fails once points were sent (here the external broker killed while the run
/// publishes through it) still gets the report of the run until then, failed by the driver;
/// before, the run ended with the error alone. Nothing is said of a broker's queue: the broker
/// is gone, not full.
#[test]
fn a_run_whose_broker_goes_away_fails_with_its_report() {
    use rumqttc::{Client, Event, MqttOptions, Packet, QoS};
    let broker = util::Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let args = format!(
        "bench replay --devices 1000 --duration 10m --interval 10s --driver mqtt --mqtt-url {} --rate 2000 \
         --query-rate 0 --report-dir report",
        broker.url()
    );
    // A watcher of the run's topics: the broker is killed once the run publishes.
    let (watcher, mut events) = Client::new(MqttOptions::new("watcher", "127.0.0.1", broker.port), 16);
    watcher.subscribe("hourglass/#", QoS::AtMostOnce).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args.split_whitespace())
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // 50 messages in (a second of the run): the broker has acked the first ones, so points were
    // sent when it goes.
    let published = events
        .iter()
        .take_while(|_| std::time::Instant::now() < deadline)
        .filter(|e| matches!(e, Ok(Event::Incoming(Packet::Publish(_)))))
        .nth(49)
        .is_some();
    assert!(published, "the run published 50 messages within 60 s");
    drop(broker);
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the run failed (its report is of the run until then)"), "{err}");
    assert!(!err.contains("a broker drops what its queue"), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report on stdout");
    let (sent, stored) = (report["sent"].as_u64().unwrap(), report["stored"].as_u64().unwrap());
    // A point is sent once its PUBACK came: messages the broker took whose acks were lost with
    // it may be stored beyond those (at most the 100 in flight a connection).
    let setup = &report["setup"];
    let in_flight = 100 * setup["connections"].as_u64().unwrap() * setup["per_message"].as_u64().unwrap();
    assert!(sent > 0 && sent < 118_824 && stored <= sent + in_flight, "{stored} of {sent}");
    if stored > sent {
        let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
        let row = format!("| … stored, not counted as sent | {} (the broker took them;", stored - sent);
        assert!(md.contains(&row), "{md}");
    }
    let failed = report["failed"].as_str().unwrap();
    assert!(failed.starts_with("driver: MQTT connection "), "{failed}");
    assert_eq!(report["failed_by_driver"], true);
    assert_eq!(report["compaction"], Value::Null, "no compaction after a failed run");
    // The rate is over the time the run stored, the stall limit it waited out left out.
    let series = report["seconds"].as_array().unwrap();
    let storing = series.iter().rev().find(|s| s["stored_per_s"].as_f64().unwrap() > 0.0).unwrap();
    let storing = storing["t_s"].as_f64().unwrap().min(report["wall_seconds"].as_f64().unwrap());
    assert_eq!(report["points_per_second"].as_f64().unwrap(), stored as f64 / storing.max(1e-9), "{report}");
    let md = std::fs::read_to_string(dir.path().join("report").join("report.md")).unwrap();
    assert!(md.contains("**Failed**: driver: MQTT connection "), "{md}");
}

/// Roll-up queries under load count the answers without a row: all of them while no hour has
/// closed, none once a run before closed the workload's hours (`--close-hours`).
#[test]
fn roll_up_queries_count_their_empty_answers() {
    let dir = tempfile::tempdir().unwrap();
    let args = "bench replay --driver in-process --devices 50 --duration 10m --interval 10s --rate 2000 \
                --query-rate 60 --no-compaction --data-dir data";
    let mut first: Vec<&str> = args.split_whitespace().collect();
    first.push("--close-hours");
    let first = hourglass(&first, dir.path());
    let rollups = first["queries"]["rollup"]["count"].as_u64().unwrap();
    assert!(rollups > 0, "{}", first["queries"]);
    assert_eq!(first["queries"]["rollup_empty"].as_u64(), Some(rollups), "{}", first["queries"]);
    assert!(first["setup"]["rollup_close_seconds"].as_f64().is_some(), "{}", first["setup"]);
    let again = hourglass(&args.split_whitespace().collect::<Vec<_>>(), dir.path());
    assert!(again["queries"]["rollup"]["count"].as_u64().unwrap() > 0, "{}", again["queries"]);
    assert_eq!(again["queries"]["rollup_empty"].as_u64(), Some(0), "{}", again["queries"]);
}
