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
const REASONS: [&str; 11] = [
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
        serde_json::to_vec(&json!([{"ts": T0 + 9000, "temp": 9.5}, {"ts": T0, "temp": "x"}])).unwrap(),
    ));
    // Bad messages, one reason each (invalid_json twice).
    msgs.extend([
        (topic("dev_a"), b"{not json".to_vec()),
        (topic("dev_a"), b"[1, 2".to_vec()),
        (topic("dev_a"), br#""hello""#.to_vec()),
        (topic("dev_a"), br#"{"temp": 1.5}"#.to_vec()),
        (topic("dev_a"), format!(r#"{{"ts": {T0}}}"#).into_bytes()),
        (topic("dev_a"), format!(r#"{{"ts": {T0}, "temp": "hot"}}"#).into_bytes()),
        ("hourglass/bad table!/dev_a".into(), one(1)),
    ]);
    let bytes: usize = msgs.iter().map(|(_, p)| p.len()).sum();
    let acked = publish_qos1(hg.mqtt_port, "metrics-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());

    // The broker acks on receipt; wait until the store committed everything.
    let m = wait_for(Duration::from_secs(30), || {
        let m = scrape(&hg);
        let dead: f64 =
            REASONS.iter().map(|r| sample(&m, &format!("hourglass_dead_letters_total{{reason=\"{r}\"}}"))).sum();
        (sample(&m, "hourglass_store_readings_total") == 10.0 && dead == 8.0).then_some(m)
    })
    .expect("10 readings and 8 dead letters committed");

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
                "connects": 1, "subscribed": true}])
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

#[test]
fn ready_follows_the_broker_connection() {
    let broker = Mosquitto::start();
    let port = broker.port;
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), Some(&broker.url()));
    assert_eq!(hg.get("/ready"), (200, json!({"status": "ready"})));

    drop(broker);
    let not_ready = json!({"status": "not_ready",
        "reasons": ["mqtt: not subscribed to the broker (connecting or reconnecting)"]});
    let got = wait_for(Duration::from_secs(30), || {
        let r = hg.get("/ready");
        (r.0 == 503).then_some(r)
    });
    assert_eq!(got, Some((503, not_ready)));
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
    let node_modules = node_dir().join("node_modules/playwright-core");
    assert!(
        node_modules.is_dir() && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Debian's chromium and playwright-core in {}: run scripts/test.sh, which installs both",
        node_modules.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);

    // pump_7: 24 readings five minutes apart, two fields; pump_8 and valve_1 so the search
    // has something to leave out; two dead letters.
    let reading =
        |k: i64| json!({"ts": T0 + k * 300_000, "temp": 20.5 + k as f64 * 0.25, "pressure": 101.325 - k as f64});
    let mut msgs: Vec<(String, Vec<u8>)> =
        (0..24).map(|k| (format!("hourglass/{TABLE}/pump_7"), serde_json::to_vec(&reading(k)).unwrap())).collect();
    msgs.push((format!("hourglass/{TABLE}/pump_8"), serde_json::to_vec(&reading(0)).unwrap()));
    msgs.push((format!("hourglass/{TABLE}/valve_1"), serde_json::to_vec(&reading(0)).unwrap()));
    msgs.push((format!("hourglass/{TABLE}/pump_7"), b"{oops".to_vec()));
    msgs.push((format!("hourglass/{TABLE}/pump_7"), br#"{"ts": 1704153000000, "temp": "warm"}"#.to_vec()));
    let acked = publish_qos1(hg.mqtt_port, "dashboard-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());
    let stored = wait_for(Duration::from_secs(30), || {
        let (_, s) = hg.get("/v1/stats");
        (s["store"]["readings"] == 26 && s["store"]["commit_count"].as_u64() >= Some(1)).then_some(())
    });
    assert!(stored.is_some(), "26 readings committed");
    let (_, dead) = hg.get("/v1/dead-letters?limit=10");
    assert_eq!(dead["dead_letters"].as_array().map(Vec::len), Some(2));

    // Readings 4..=19: from 20 minutes after T0 up to (not including) 100 minutes after.
    let (from, to) = ("2024-01-02T00:10:00Z".to_string(), (T0 + 100 * 60_000).to_string());
    let (_, bad_range) = hg.get(&format!("/v1/tables/{TABLE}/devices/pump_7/readings?from=yesterday&to={to}"));
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/check.mjs"))
        .arg(format!("http://{}/", hg.http))
        .args([TABLE, "pump", "pump_7", from.as_str(), to.as_str()])
        .arg(&shot)
        .env("HG_TEST_NODE_DIR", node_dir())
        .output()
        .expect("run node (scripts/test.sh installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "check.mjs failed ({}):\n{stderr}", out.status);
    eprintln!("dashboard screenshot: {}", shot.display());
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("check.mjs printed no JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout))
    });

    assert_eq!(seen["tables"], json!([TABLE]));
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
    assert_eq!(seen["dead_letters"], json!(["non_numeric_field", "invalid_json"]));
    assert_eq!(seen["stored"], "26");
    assert_eq!(seen["ready"], "ready");
    // A bad range shows the API's own message where the chart would be.
    assert_eq!(seen["range_error"], format!("400: {}", bad_range["error"].as_str().unwrap()));
    assert_eq!(seen["charts_after_error"], 0);
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "screenshot is a PNG");
}
