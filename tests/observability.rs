//! What an operator and a person see of a running `hourglass serve`: `/metrics` counts exactly
//! what was published, `/ready` follows the broker connection, the device listing, and the
//! dashboard page driven in headless Chromium (`tests/dashboard/check.mjs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use util::{publish_qos1, wait_for, Hourglass, Mosquitto};

/// 2024-01-01T23:50:00Z.
const T0: i64 = 1_704_153_000_000;

/// Every dead-letter reason label, in `model::DeadLetterReason::ALL` order.
const REASONS: [&str; 15] = [
    "invalid_json",
    "invalid_shape",
    "non_numeric_field",
    "invalid_field_name",
    "no_fields",
    "missing_timestamp",
    "invalid_timestamp",
    "payload_too_large",
    "invalid_table",
    "invalid_device",
    "invalid_topic",
    "invalid_line_protocol",
    "wrong_field_type",
    "unknown_field",
    "integer_out_of_range",
];

/// `GET path`: (status, content type, body text).
fn get_text(hg: &Hourglass, path: &str) -> (u16, String, String) {
    let url = format!("http://{}{}", hg.http, path);
    let r = match ureq::get(&url).timeout(Duration::from_secs(30)).call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let (status, ctype) = (r.status(), r.header("content-type").unwrap_or("").to_string());
    (status, ctype, r.into_string().unwrap())
}

/// The samples of a text exposition: `name{labels}` → value. Comment lines are skipped.
fn scrape(hg: &Hourglass) -> BTreeMap<String, f64> {
    let (status, ctype, text) = get_text(hg, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert_eq!(ctype, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(text.ends_with("# EOF\n"), "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("sample line {l:?}"));
            (series.to_string(), value.parse::<f64>().unwrap_or_else(|_| panic!("value of {l:?}")))
        })
        .collect()
}

fn sample(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series).unwrap_or_else(|| panic!("no series {series} in {m:#?}"))
}

#[test]
fn metrics_count_exactly_what_was_published() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);

    // Before any input: every reason is there, at zero; the consumer is connected once.
    let m = scrape(&hg);
    for r in REASONS {
        assert_eq!(sample(&m, &format!("hourglass_dead_letters_total{{reason=\"{r}\"}}")), 0.0, "{r}");
    }
    assert_eq!(sample(&m, r#"hourglass_ingest_messages_total{source="mqtt"}"#), 0.0);
    assert_eq!(sample(&m, r#"hourglass_ingest_subscribed{source="mqtt"}"#), 1.0);
    assert_eq!(sample(&m, r#"hourglass_ingest_connects_total{source="mqtt"}"#), 1.0);
    assert_eq!(sample(&m, "hourglass_store_commit_duration_seconds_count"), 0.0);
    // The HTTP write API is a source without a broker: its counters, not a broker's.
    assert_eq!(sample(&m, r#"hourglass_ingest_messages_total{source="http"}"#), 0.0);
    let http: Vec<&str> = m.keys().filter_map(|k| k.strip_suffix(r#"{source="http"}"#)).collect();
    assert_eq!(
        http,
        [
            "hourglass_ingest_bytes_total",
            "hourglass_ingest_dead_letters_total",
            "hourglass_ingest_messages_total",
            "hourglass_ingest_readings_total"
        ]
    );

    let topic = |dev: &str| format!("hourglass/obs.test/{dev}");
    let one = |k: i64| serde_json::to_vec(&json!({"ts": T0 + k * 1000, "temp": k as f64 + 0.25})).unwrap();
    let mut msgs: Vec<(String, Vec<u8>)> = (0..5).map(|k| (topic("dev_a"), one(k))).collect();
    // A gateway message: four readings of two devices.
    let gateway: Vec<Value> = (0..4)
        .map(|k| json!({"device": if k % 2 == 0 { "dev_b" } else { "dev_c" }, "ts": T0 + k * 1000, "rpm": 1000.5}))
        .collect();
    msgs.push(("hourglass/obs.test".into(), serde_json::to_vec(&gateway).unwrap()));
    // One good and one bad element.
    msgs.push((
        topic("dev_a"),
        serde_json::to_vec(&json!([{"ts": T0 + 9000, "temp": 9.5}, {"ts": T0, "temp": ["x"]}])).unwrap(),
    ));
    // Bad messages, one reason each (invalid_json twice).
    msgs.extend([
        (topic("dev_a"), b"{not json".to_vec()),
        (topic("dev_a"), b"[1, 2".to_vec()),
        (topic("dev_a"), br#""hello""#.to_vec()),
        (topic("dev_a"), br#"{"temp": 1.5}"#.to_vec()),
        (topic("dev_a"), format!(r#"{{"ts": {T0}}}"#).into_bytes()),
        (topic("dev_a"), format!(r#"{{"ts": {T0}, "temp": ["hot"]}}"#).into_bytes()),
        ("hourglass/bad table!/dev_a".into(), one(1)),
    ]);
    let bytes: usize = msgs.iter().map(|(_, p)| p.len()).sum();
    // Three on a topic outside the prefix: acked by the broker, matched by no subscription.
    msgs.extend((0..3).map(|k| ("elsewhere/obs.test/dev_a".to_string(), one(k))));
    let acked = publish_qos1(hg.mqtt_port, "metrics-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());

    // The broker acks on receipt; wait until the store committed everything.
    let m = wait_for(Duration::from_secs(30), || {
        let m = scrape(&hg);
        let dead: f64 =
            REASONS.iter().map(|r| sample(&m, &format!("hourglass_dead_letters_total{{reason=\"{r}\"}}"))).sum();
        let unmatched = sample(&m, r#"hourglass_ingest_broker_unmatched_messages_total{source="mqtt"}"#);
        (sample(&m, "hourglass_store_readings_total") == 10.0 && dead == 8.0 && unmatched == 3.0).then_some(m)
    })
    .expect("10 readings and 8 dead letters committed, 3 messages counted unmatched");

    let expect = [
        (r#"hourglass_ingest_messages_total{source="mqtt"}"#, 14.0),
        (r#"hourglass_ingest_bytes_total{source="mqtt"}"#, bytes as f64),
        (r#"hourglass_ingest_readings_total{source="mqtt"}"#, 10.0),
        (r#"hourglass_ingest_dead_letters_total{source="mqtt"}"#, 8.0),
        (r#"hourglass_ingest_connects_total{source="mqtt"}"#, 1.0),
        (r#"hourglass_ingest_subscribed{source="mqtt"}"#, 1.0),
        ("hourglass_store_readings_total", 10.0),
        ("hourglass_store_tables", 1.0),
        ("hourglass_store_devices", 3.0),
        ("hourglass_rocksdb_stats_available", 1.0),
        ("hourglass_rocksdb_background_errors", 0.0),
        ("hourglass_rocksdb_write_stopped", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(sample(&m, series), value, "{series}");
    }
    let by_reason: BTreeMap<&str, f64> =
        REASONS.iter().map(|r| (*r, sample(&m, &format!("hourglass_dead_letters_total{{reason=\"{r}\"}}")))).collect();
    let mut expected: BTreeMap<&str, f64> = REASONS.iter().map(|r| (*r, 0.0)).collect();
    expected.extend([
        ("invalid_json", 2.0),
        ("invalid_shape", 1.0),
        ("non_numeric_field", 2.0),
        ("missing_timestamp", 1.0),
        ("no_fields", 1.0),
        ("invalid_table", 1.0),
    ]);
    assert_eq!(by_reason, expected);

    // The histogram has one observation per committed batch; buckets are cumulative.
    let batches = sample(&m, "hourglass_store_batches_total");
    assert!(batches >= 1.0);
    assert_eq!(sample(&m, "hourglass_store_commit_duration_seconds_count"), batches);
    assert_eq!(sample(&m, r#"hourglass_store_commit_duration_seconds_bucket{le="+Inf"}"#), batches);
    let buckets: Vec<f64> = m
        .iter()
        .filter(|(k, _)| k.starts_with("hourglass_store_commit_duration_seconds_bucket{"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(buckets.len(), 17);
    assert!(sample(&m, "hourglass_store_commit_duration_seconds_sum") > 0.0);
    for cf in ["buckets", "latest", "dead_letters", "registry", "catalog"] {
        for g in ["pending_compaction_bytes", "live_sst_bytes", "l0_files", "estimated_keys"] {
            assert!(sample(&m, &format!("hourglass_rocksdb_{g}{{cf=\"{cf}\"}}")) >= 0.0);
        }
        assert!(sample(&m, &format!("hourglass_rocksdb_memtable_bytes{{cf=\"{cf}\"}}")) > 0.0, "{cf}");
    }

    // The JSON stats the dashboard reads say the same.
    let (status, stats) = hg.get("/v1/stats");
    assert_eq!(status, 200);
    assert_eq!(
        stats["sources"],
        json!([{"source": "mqtt", "messages": 14, "bytes": bytes, "readings": 10, "dead_letters": 8,
                "connects": 1, "subscribed": true, "broker_skips": 0, "broker_skipped_messages": 0,
                "broker_unmatched_messages": 3, "broker_backlog": 0, "broker_backlog_bytes": 0, "redelivered": 0},
               // The InfluxDB write API's intake: nothing written to it here, and no broker.
               {"source": "http", "messages": 0, "bytes": 0, "readings": 0, "dead_letters": 0}])
    );
    assert_eq!(stats["store"]["readings"], 10);
    assert_eq!(stats["store"]["tables"], 1);
    assert_eq!(stats["store"]["devices"], 3);
    assert_eq!(stats["store"]["batches"], batches as u64);
    assert_eq!(stats["store"]["commit_count"], batches as u64);
    let dl: BTreeMap<String, f64> =
        stats["dead_letters"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_f64().unwrap())).collect();
    assert_eq!(dl, expected.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>());

    // The device listing: devices with data in the table, by name prefix, bounded by limit.
    let (status, body) = hg.get("/v1/tables/obs.test/devices");
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"table": "obs.test", "prefix": "", "devices": ["dev_a", "dev_b", "dev_c"], "complete": true})
    );
    let (_, body) = hg.get("/v1/tables/obs.test/devices?prefix=dev_&limit=2");
    assert_eq!(body, json!({"table": "obs.test", "prefix": "dev_", "devices": ["dev_a", "dev_b"], "complete": false}));
    let (_, body) = hg.get("/v1/tables/obs.test/devices?prefix=dev_c");
    assert_eq!(body, json!({"table": "obs.test", "prefix": "dev_c", "devices": ["dev_c"], "complete": true}));
    let (_, body) = hg.get("/v1/tables/obs.test/devices?prefix=truck");
    assert_eq!(body, json!({"table": "obs.test", "prefix": "truck", "devices": [], "complete": true}));
    let (status, body) = hg.get("/v1/tables/obs.test/devices?limit=0");
    assert_eq!(
        (status, body),
        (400, json!({"error": "parameter `limit`: \"0\" is not a whole number from 1 to 10000"}))
    );
    let (status, body) = hg.get("/v1/tables/nope/devices");
    assert_eq!((status, body), (404, json!({"error": "unknown table `nope`"})));
}

/// `/ready` follows the consumer's connection; a broker that comes back without the session
/// (here restarted without persistence) is warned of: it lost what it queued meanwhile.
#[test]
fn ready_follows_the_broker_connection() {
    let broker = Mosquitto::start();
    let port = broker.port;
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged(dir.path(), Some(&broker.url()));
    assert_eq!(hg.get("/ready"), (200, json!({"status": "ready"})));

    drop(broker);
    // With the reason the consumer last met: the broker gone, its reconnects refused.
    let not_ready = json!({"status": "not_ready",
        "reasons": ["mqtt: not subscribed to the broker: hourglass/#: I/O: Connection refused (os error 111) (see the log)"]});
    let got = wait_for(Duration::from_secs(30), || {
        let r = hg.get("/ready");
        (r.1 == not_ready).then_some(r)
    });
    assert_eq!(got, Some((503, not_ready)), "{:?}", hg.get("/ready"));
    // Liveness is not readiness: the process still answers.
    assert_eq!(hg.get("/health"), (200, json!({"status": "ok"})));
    assert_eq!(sample(&scrape(&hg), r#"hourglass_ingest_subscribed{source="mqtt"}"#), 0.0);

    // A new broker on the same port: the consumer reconnects and subscribes again.
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("mosquitto.conf");
    std::fs::write(&conf, format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")).unwrap();
    let _broker = Mosquitto::start_with_config(&conf, port);
    let got = wait_for(Duration::from_secs(30), || {
        let r = hg.get("/ready");
        (r.0 == 200).then_some(r)
    });
    assert_eq!(got, Some((200, json!({"status": "ready"}))));
    let m = scrape(&hg);
    assert_eq!(sample(&m, r#"hourglass_ingest_subscribed{source="mqtt"}"#), 1.0);
    assert_eq!(sample(&m, r#"hourglass_ingest_connects_total{source="mqtt"}"#), 2.0);
    let logs = hg.terminate();
    let warned: Vec<&String> = logs.iter().filter(|l| l.contains("MQTT reconnected without the session")).collect();
    assert_eq!(warned.len(), 1, "{logs:#?}");
    assert!(warned[0].contains("\"level\":\"WARN\""), "{}", warned[0]);
}

/// Where the npm packages of the browser test live (`scripts/test.sh` installs them there).
fn node_dir() -> PathBuf {
    match std::env::var_os("HG_TEST_NODE_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(&std::env::var_os("HOME").expect("HOME is set")).join(".cache/hourglass-node"),
    }
}

#[test]
fn dashboard_shows_the_published_readings() {
    const TABLE: &str = "dash.test";
    // The table the page switches to at the end.
    const OTHER: &str = "dash.big";
    let node_modules = node_dir().join("node_modules/playwright-core");
    assert!(
        node_modules.is_dir() && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Debian's chromium and playwright-core in {}: run scripts/test.sh, which installs both",
        node_modules.display()
    );
    let dir = tempfile::tempdir().unwrap();
    // Roll-ups are computed once an hour ends a minute before the newest reading.
    // Pages of 5 readings: the chart of 16 follows the API's cursor through 4.
    let hg = Hourglass::start_logged_with_env(
        dir.path(),
        &[
            ("HOURGLASS_ROLLUP__ALLOWED_LATENESS_MS", "60000"),
            ("HOURGLASS_ROLLUP__INTERVAL_MS", "50"),
            ("HOURGLASS_QUERY__MAX_PAGE_ROWS", "5"),
            // No archive: the other table's line says its partitions are deleted at its hot
            // retention (it named the archive's retention: QA54 F6).
            ("HOURGLASS_STORAGE__ARCHIVE", "false"),
        ],
    );

    // pump_7: 24 readings five minutes apart over three hours (23:50 to 01:45), two fields;
    // pump_8 and valve_1 so the search has something to leave out, valve_1's reading two days
    // ahead so the roll-up watermark passes every hour of pump_7; two dead letters.
    let reading =
        |k: i64| json!({"ts": T0 + k * 300_000, "temp": 20.5 + k as f64 * 0.25, "pressure": 101.325 - k as f64});
    let mut msgs: Vec<(String, Vec<u8>)> =
        (0..24).map(|k| (format!("hourglass/{TABLE}/pump_7"), serde_json::to_vec(&reading(k)).unwrap())).collect();
    msgs.push((format!("hourglass/{TABLE}/pump_8"), serde_json::to_vec(&reading(0)).unwrap()));
    msgs.push((format!("hourglass/{TABLE}/valve_1"), serde_json::to_vec(&reading(576)).unwrap()));
    msgs.push((format!("hourglass/{TABLE}/pump_7"), b"{oops".to_vec()));
    msgs.push((format!("hourglass/{TABLE}/pump_7"), br#"{"ts": 1704153000000, "temp": ["warm"]}"#.to_vec()));
    // The table is defined first with roll-ups kept 100 years, then 200: the dashboard's line
    // about the table names them, and the first hour and day the 100 years kept (its floor).
    let body = r#"{"name": "dash.test", "hour_rollup_retention": "36500d", "day_rollup_retention": "36500d"}"#;
    assert_eq!(hg.post("/v1/tables", body).0, 201);
    let before = model::now_ms();
    let (status, longer) = hg.post(
        "/v1/tables",
        r#"{"name": "dash.test", "hour_rollup_retention": "73000d", "day_rollup_retention": "73000d"}"#,
    );
    let after = model::now_ms();
    assert_eq!(status, 200, "{longer}");
    let floor = |key: &str, period: i64| {
        let at = longer[key].as_i64().unwrap();
        let first_kept = |now: i64| (now + HOUR - 36_500 * DAY).div_euclid(period) * period;
        assert!(at == first_kept(before) || at == first_kept(after), "{longer}");
        at
    };
    let (hour_floor, day_floor) = (floor("hour_rollup_floor_ms", HOUR), floor("day_rollup_floor_ms", DAY));
    let acked = publish_qos1(hg.mqtt_port, "dashboard-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());
    // Another table with a device of the same name: i64 values past 2^53 (2^53 + 1 and + 3,
    // which doubles round to 2^53 and 2^53 + 4) and a string.
    let (t1, t2) = (T0 + 23 * 300_000 - 60_000, T0 + 23 * 300_000);
    let big = format!(r#"{{"name": "{OTHER}", "hot_retention": "36500d", "cold_retention": "73000d"}}"#);
    assert_eq!(hg.post("/v1/tables", &big).0, 201);
    let lp = format!(
        "{OTHER},name=pump_7 n=9007199254740993i {t1}\n{OTHER},name=pump_7 n=9007199254740995i,note=\"x\" {t2}\n"
    );
    let written = ureq::post(&format!("http://{}/write?precision=ms", hg.http)).send_string(&lp).map(|r| r.status());
    assert_eq!(written.ok(), Some(204));
    let stored = wait_for(Duration::from_secs(30), || {
        let (_, s) = hg.get("/v1/stats");
        (s["store"]["readings"] == 28 && s["store"]["commit_count"].as_u64() >= Some(1)).then_some(())
    });
    assert!(stored.is_some(), "28 readings committed");
    // The last message's dead letter may commit in a WriteBatch after the readings'.
    let dead = wait_for(Duration::from_secs(30), || {
        let (_, dead) = hg.get("/v1/dead-letters?limit=10");
        let n = dead["dead_letters"].as_array().map(Vec::len);
        (n >= Some(2)).then_some(n)
    });
    assert_eq!(dead, Some(Some(2)), "2 dead letters committed");

    // pump_7's roll-ups, computed here: wait (bounded) until the API has them all.
    let pump_7: Vec<(i64, f64, f64)> =
        (0..24).map(|k| (T0 + k * 300_000, 20.5 + k as f64 * 0.25, 101.325 - k as f64)).collect();
    for (level, len, n) in [("hour", HOUR, 3), ("day", DAY, 2)] {
        let want = expected_rollups(&pump_7, len, i64::MIN, i64::MAX);
        assert_eq!(want.len(), n);
        let want: Vec<Value> = want
            .iter()
            .map(|p| {
                let f = |a: &Agg| json!({"count": a.count, "min": a.min, "max": a.max, "mean": a.mean});
                json!({"period": p.start, "pressure": f(&p.pressure), "temp": f(&p.temp)})
            })
            .collect();
        let path = format!(
            "/v1/tables/{TABLE}/rollups?device=pump_7&level={level}&from=2024-01-01T00:00:00Z&to=2024-01-03T00:00:00Z\
             &aggs=count,min,max,mean"
        );
        let got = wait_for(Duration::from_secs(30), || {
            let (status, body) = hg.get(&path);
            (status == 200 && body["rows"] == json!(want)).then_some(())
        });
        assert!(got.is_some(), "{level} roll-ups: got {:#}, want {want:#?}", hg.get(&path).1);
    }

    // Readings 4..=19: from 20 minutes after T0 up to (not including) 100 minutes after.
    let (from, to) = ("2024-01-02T00:10:00Z".to_string(), (T0 + 100 * 60_000).to_string());
    let (_, bad_range) = hg.get(&format!("/v1/tables/{TABLE}/devices/pump_7/readings?from=yesterday&to={to}"));
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/check.mjs"))
        .arg(format!("http://{}/", hg.http))
        .args([TABLE, "pump", "pump_7", from.as_str(), to.as_str()])
        .arg(&shot)
        .arg(OTHER)
        .env("HG_TEST_NODE_DIR", node_dir())
        .output()
        .expect("run node (scripts/test.sh installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "check.mjs failed ({}):\n{stderr}", out.status);
    eprintln!("dashboard screenshot: {}", shot.display());
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("check.mjs printed no JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout))
    });

    assert_eq!(seen["tables"], json!([OTHER, TABLE]));
    // The table's line with its roll-ups kept `days`, from the first 100 years' floor.
    let line = |days: u32| {
        format!(
            "day partitions · readings kept forever · hour roll-ups kept {days}d from {} · day roll-ups kept {days}d \
             from {} · fields: pressure f64, temp f64",
            iso(hour_floor),
            iso(day_floor)
        )
    };
    assert_eq!(seen["table_info"], line(73_000));
    // 80,000 days from the page: a lengthening again, which keeps the floor of the first one.
    assert_eq!(seen["redefined"], 200);
    assert_eq!(seen["table_info_refreshed"], line(80_000));
    assert_eq!(seen["devices"], json!(["pump_7", "pump_8"]), "search by the prefix `pump`");
    assert_eq!(seen["title"], "pump_7 in dash.test");
    // The newest reading (k = 23), exactly as published.
    let latest = json!({"temp": format!("{}", 20.5 + 23.0 * 0.25), "pressure": format!("{}", 101.325 - 23.0)});
    assert_eq!(latest, json!({"temp": "26.25", "pressure": "78.325"}));
    assert_eq!(seen["latest"], latest);
    assert_eq!(seen["latest_ts"], format!("at 2024-01-02T01:45:00.000Z ({})", T0 + 23 * 300_000));
    // The chart: one SVG per field (in the API's field order: by name), one point per reading
    // in [from, to).
    let ks: Vec<i64> = (4..20).collect();
    let ts: Vec<String> = ks.iter().map(|k| (T0 + k * 300_000).to_string()).collect();
    let temps: Vec<String> = ks.iter().map(|k| format!("{}", 20.5 + *k as f64 * 0.25)).collect();
    let pressures: Vec<String> = ks.iter().map(|k| format!("{}", 101.325 - *k as f64)).collect();
    assert_eq!(
        seen["charts"],
        json!([
            {"field": "pressure", "points": "16", "ts": ts, "values": pressures},
            {"field": "temp", "points": "16", "ts": ts, "values": temps},
        ])
    );
    assert_eq!(seen["chart_status"], "16 reading(s) from 2024-01-02T00:10:00.000Z to 2024-01-02T01:25:00.000Z");
    // The range typed relative to now, each end 30 s (and up to a second more, as whole
    // seconds) before the one above: asked as epoch ms, the same readings.
    let asked: Vec<i64> = seen["relative_request"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().parse().unwrap_or_else(|_| panic!("not epoch ms: {v}")))
        .collect();
    let (from_ms, to_ms) = (T0 + 20 * 60_000, T0 + 100 * 60_000);
    assert!(
        (from_ms - 31_000..from_ms).contains(&asked[0]) && (to_ms - 31_000..to_ms).contains(&asked[1]),
        "{asked:?}"
    );
    assert_eq!(seen["relative_chart_status"], seen["chart_status"]);
    assert_eq!(seen["dead_letters"], json!(["non_numeric_field", "invalid_json"]));
    // The panel's filter: by reason, by a source prefix none has, by the topics' prefix.
    assert_eq!(seen["dead_invalid_json"], json!(["invalid_json"]));
    assert_eq!(seen["dead_no_source"], json!(["No dead letters match."]));
    assert_eq!(seen["dead_older_hidden"], json!(true));
    assert_eq!(seen["dead_topic"], json!(["non_numeric_field", "invalid_json"]));
    assert_eq!(seen["stored"], "28");
    // Nothing waits in the embedded broker once all is stored, and nothing was dropped.
    assert_eq!(seen["broker"], "0 · 0 B · 0 · 0 · 0");
    assert_eq!(seen["broker_skipped"], json!(["1,205 · 3.0 MiB · 3 · 1,700 · 7", "lost"]));
    assert_eq!(seen["broker_unmatched"], json!(["0 · 0 B · 0 · 0 · 2", "lost"]));
    // A burst of 2,000 readings every 10 s reads 200/s from the first 20 s on (it read 0 between
    // bursts and 1,000/s at them: QA56 F3); before, over what the samples span.
    let rates: Vec<Option<f64>> = seen["burst_rates"].as_array().unwrap().iter().map(Value::as_f64).collect();
    let mut expected = vec![None, Some(0.0), Some(0.0)];
    expected.extend([2000.0 / 6.0, 2000.0 / 8.0, 2000.0 / 10.0, 2000.0 / 12.0, 2000.0 / 14.0].map(Some));
    expected.extend([4000.0 / 16.0, 4000.0 / 18.0].map(Some));
    expected.extend([Some(200.0); 11]);
    assert_eq!(rates, expected);
    assert_eq!(seen["sizes"], json!(["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "1.0 MiB", "1.5 MiB", "2.25 GiB"]));
    assert_eq!(seen["ready"], "ready");
    // A bad range shows the API's own message where the chart would be.
    assert_eq!(seen["range_error"], format!("400: {}", bad_range["error"].as_str().unwrap()));
    assert_eq!(seen["charts_after_error"], 0);
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "screenshot is a PNG");

    // Roll-ups: the periods overlapping the range (`from` goes back to its period's start), per
    // field the mean of each period on the line, min and max as the band, the count in the title.
    assert_eq!(iso(from_ms), "2024-01-02T00:10:00.000Z");
    assert_eq!(seen["hour_same_range"], rollup_view(&pump_7, "hour", from_ms, to_ms));
    assert_eq!(seen["hour_same_range"]["charts"][0]["points"], "2");
    // The 6 h preset ends just after the latest reading: hours 23:00, 00:00 and 01:00.
    let end = T0 + 23 * 300_000 + 1;
    assert_eq!(seen["range_6h"], json!([iso(end - 6 * HOUR), iso(end)]));
    assert_eq!(seen["hour_6h"], rollup_view(&pump_7, "hour", end - 6 * HOUR, end));
    assert_eq!(seen["hour_6h"]["charts"][1]["points"], "3");
    assert_eq!(seen["hour_6h"]["charts"][1]["period"][0], (T0 - 50 * 60_000).to_string());
    assert_eq!(seen["day_6h"], rollup_view(&pump_7, "day", end - 6 * HOUR, end));
    assert_eq!(seen["day_6h"]["charts"][0]["points"], "2");
    eprintln!("roll-up screenshot: {}", shot.with_file_name("dashboard-hour.png").display());
    let (status, bad) =
        hg.get(&format!("/v1/tables/{TABLE}/rollups?device=pump_7&level=day&from=yesterday&to={}", iso(end)));
    assert_eq!(status, 400);
    assert_eq!(
        seen["rollup_range_error"],
        json!({"status": "", "error": format!("400: {}", bad["error"].as_str().unwrap()), "charts": []})
    );
    let local = format!("/v1/tables/{TABLE}/rollups?device=pump_7&level=day&from=2024-01-02T00:10:00&to={}", iso(end));
    let (status, bad) = hg.get(&local);
    assert_eq!(status, 400);
    assert_eq!(
        seen["rollup_local_time"],
        json!({"status": "", "error": format!("400: {}", bad["error"].as_str().unwrap()), "charts": []})
    );
    let png = std::fs::read(shot.with_file_name("dashboard-hour.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "roll-up screenshot is a PNG");

    // Another table picked: the device panel empties (it kept dash.test's pump_7, and charted
    // the other table's pump_7 under its title: QA54 F2).
    assert_eq!(
        seen["switched"],
        json!({"title": "Pick a table and a device", "latest_hidden": true, "charts": 0, "load_disabled": true})
    );
    assert_eq!(
        seen["big_table_info"],
        "day partitions · readings kept 36500d, then deleted (no archive) · hour roll-ups kept forever · day roll-ups \
         kept forever · fields: n i64, note string"
    );
    // Its pump_7: integers past 2^53 exactly as stored (they showed as the nearest double:
    // QA54 F1), the string in the latest values and not charted (an empty chart "note (0)":
    // F3), a y axis of distinct ticks over a span of 2 (50 copies of one label: F4): widened
    // to a millionth of the magnitude each side of the middle, 2^53 + 2 ± 9.007e9, padded 6%,
    // [9007189.17e9, 9007209.34e9], ticks a quarter of it apart rounded up to 1e10.
    assert_eq!(seen["big_latest"], json!({"n": "9007199254740995", "note": "x"}));
    assert_eq!(
        seen["big_chart_status"],
        format!("2 reading(s) from {} to {}; not charted (not numbers): note", iso(t1), iso(t2))
    );
    assert_eq!(
        seen["big_charts"],
        json!([{
            "field": "n",
            "values": ["9007199254740993", "9007199254740995"],
            "cy_finite": true,
            "y_ticks": ["9007190000000000", "9007200000000000"],
        }])
    );
}

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// Epoch ms as the page shows it (`Date.toISOString`).
fn iso(ms: i64) -> String {
    model::utc_text_ms(ms)
}

/// Count, min, max and mean of one field in one period.
#[derive(Debug)]
struct Agg {
    count: usize,
    min: f64,
    max: f64,
    mean: f64,
}

impl Agg {
    /// The mean is the exact sum rounded once, then divided: every value here is a multiple of
    /// 2^-60 below 2^63, so it is an exact integer in units of 2^-60 and an `i128` sums them
    /// exactly; `i128 as f64` rounds to nearest.
    fn of(values: &[f64]) -> Agg {
        const UNIT: f64 = (1u64 << 60) as f64;
        let sum: i128 = values
            .iter()
            .map(|v| {
                let scaled = v * UNIT;
                assert!(scaled.fract() == 0.0 && scaled.abs() < 2f64.powi(100), "{v}");
                scaled as i128
            })
            .sum();
        Agg {
            count: values.len(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean: (sum as f64 / UNIT) / values.len() as f64,
        }
    }
}

/// One period of pump_7's roll-ups.
#[derive(Debug)]
struct Period {
    start: i64,
    pressure: Agg,
    temp: Agg,
}

/// The periods of length `len` (UTC-aligned) starting in `[from, to)` that hold readings
/// `(ts, temp, pressure)`.
fn expected_rollups(readings: &[(i64, f64, f64)], len: i64, from: i64, to: i64) -> Vec<Period> {
    let mut by_start: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
    for &(ts, temp, pressure) in readings {
        by_start.entry(ts.div_euclid(len) * len).or_default().push((temp, pressure));
    }
    by_start
        .into_iter()
        .filter(|(start, _)| (from..to).contains(start))
        .map(|(start, v)| Period {
            start,
            pressure: Agg::of(&v.iter().map(|p| p.1).collect::<Vec<_>>()),
            temp: Agg::of(&v.iter().map(|p| p.0).collect::<Vec<_>>()),
        })
        .collect()
}

/// What check.mjs reads of the page at a roll-up `level` over the chosen `[from, to)`: the
/// status line, no error, and one chart per field (by name) of the periods overlapping it.
fn rollup_view(readings: &[(i64, f64, f64)], level: &str, from: i64, to: i64) -> Value {
    let (len, many) = match level {
        "hour" => (HOUR, "hours"),
        "day" => (DAY, "days"),
        _ => unreachable!(),
    };
    let periods = expected_rollups(readings, len, from.div_euclid(len) * len, to);
    assert!(periods.len() > 1);
    let chart = |field: &str, agg: &dyn Fn(&Period) -> &Agg| {
        let text = |f: &dyn Fn(&Agg) -> String| periods.iter().map(|p| f(agg(p))).collect::<Vec<String>>();
        let titles: Vec<String> = periods
            .iter()
            .map(|p| {
                let a = agg(p);
                format!(
                    "{} {level}: mean {}, min {}, max {}, {} reading(s)",
                    iso(p.start),
                    a.mean,
                    a.min,
                    a.max,
                    a.count
                )
            })
            .collect();
        json!({
            "field": field,
            "level": level,
            "points": periods.len().to_string(),
            "line_points": periods.len(),
            "band": true,
            "period": periods.iter().map(|p| p.start.to_string()).collect::<Vec<_>>(),
            "mean": text(&|a| a.mean.to_string()),
            "min": text(&|a| a.min.to_string()),
            "max": text(&|a| a.max.to_string()),
            "count": text(&|a| a.count.to_string()),
            "titles": titles,
        })
    };
    let last = periods.last().unwrap().start + len;
    json!({
        "status": format!("{} {many} from {} to {}", periods.len(), iso(periods[0].start), iso(last)),
        "error": null,
        "charts": [chart("pressure", &|p| &p.pressure), chart("temp", &|p| &p.temp)],
    })
}

/// The embedded broker's log says ERROR only for errors: sensors that publish and disconnect
/// cleanly, a TCP probe that closes before its CONNECT, and the pipeline's own consumer leaving
/// at the stop log none (rumqttd 0.20 logs each at ERROR); a login with an unknown token still
/// logs its one.
#[test]
fn the_broker_logs_no_error_for_normal_traffic_and_still_logs_a_refused_login() {
    const ADMIN: &str = "admin-secret-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let env = [("HOURGLASS_AUTH__ENABLED", "true"), ("HOURGLASS_AUTH__ADMIN_TOKEN", ADMIN)];
    let hg = Hourglass::start_logged_with_env(dir.path(), &env);
    let admin = format!("Bearer {ADMIN}");
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let issued: Value = agent
        .post(&format!("http://{}/v1/tokens", hg.http))
        .set("Authorization", &admin)
        .send_string(r#"{"tables": {"o.logs": "write"}}"#)
        .unwrap()
        .into_json()
        .unwrap();
    let token = issued["token"].as_str().unwrap();
    for sensor in 0..3 {
        let msgs = vec![(format!("hourglass/o.logs/s{sensor}"), format!(r#"{{"ts":{T0},"v":{sensor}}}"#).into_bytes())];
        let login = Some(("o.logs", token));
        let acked =
            util::publish_qos1_as(hg.mqtt_port, &format!("s{sensor}"), login, &msgs, Duration::from_secs(30), |_| {});
        assert_eq!(acked, 1, "sensor {sensor}");
    }
    drop(std::net::TcpStream::connect(("127.0.0.1", hg.mqtt_port)).unwrap());
    let refused = util::publish_qos1_as(
        hg.mqtt_port,
        "intruder",
        Some(("o.logs", "hg_unknown")),
        &[("hourglass/o.logs/x".into(), b"{}".to_vec())],
        Duration::from_secs(10),
        |_| {},
    );
    assert_eq!(refused, 0);
    let stored = wait_for(Duration::from_secs(30), || {
        let stats: Value = agent
            .get(&format!("http://{}/v1/stats", hg.http))
            .set("Authorization", &admin)
            .call()
            .ok()?
            .into_json()
            .ok()?;
        stats["store"]["readings"].as_u64().filter(|&n| n == 3)
    });
    assert_eq!(stored, Some(3));
    let logs = hg.terminate();
    let errors: Vec<(String, String)> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == "ERROR")
        .map(|v| {
            let field = |k: &str| v["fields"][k].as_str().unwrap_or_default().to_string();
            (field("message"), field("error"))
        })
        .collect();
    assert_eq!(
        errors,
        vec![("Error while handling MQTT connect packet".to_string(), "InvalidAuth".to_string())],
        "{}",
        logs.join("\n")
    );
}
