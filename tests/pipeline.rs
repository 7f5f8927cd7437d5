//! End-to-end tests of `hourglass serve`: real brokers (embedded rumqttd, Debian's mosquitto),
//! real RocksDB in temp dirs, the HTTP API. One binary; helpers in `util`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Map, Value};
use util::{publish_qos1, wait_for, Hourglass, Mosquitto};

const TABLE: &str = "plant.sensors";
/// 2024-01-01T23:50:00Z: readings every minute from here cross an hour and a day boundary.
const T0: i64 = 1_704_153_000_000;
const MIDNIGHT: i64 = 1_704_153_600_000;

type Oracle = BTreeMap<(String, i64), Map<String, Value>>;

fn reading(ts: i64, fields: &[(&str, f64)]) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("ts".into(), json!(ts));
    for (k, v) in fields {
        m.insert((*k).into(), json!(v));
    }
    m
}

/// Messages covering three devices over two hours and two day partitions, out of order, with
/// duplicates and rewrites, through both topic layouts; and what must be stored (last write
/// wins per device and timestamp).
fn scenario() -> (Vec<(String, Vec<u8>)>, Oracle) {
    let mut msgs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut oracle = Oracle::new();
    let mut send =
        |msgs: &mut Vec<(String, Vec<u8>)>, topic: String, items: Vec<(String, Map<String, Value>)>, array: bool| {
            let mut bodies = Vec::new();
            for (dev, r) in items {
                let ts = r["ts"].as_i64().unwrap();
                let mut stored = r.clone();
                stored.remove("device");
                oracle.insert((dev, ts), stored);
                bodies.push(Value::Object(r));
            }
            let payload = if array { Value::Array(bodies) } else { bodies.pop().unwrap() };
            msgs.push((topic, serde_json::to_vec(&payload).unwrap()));
        };
    // truck_a on its own topic, one reading per message, minutes in a scrambled order:
    // 0, 19, 1, 18, ... so later minutes arrive before earlier ones.
    let order: Vec<i64> = (0..10).flat_map(|k| [k, 19 - k]).collect();
    for &k in &order {
        let ts = T0 + k * 60_000;
        let mut fields = vec![("temp", 20.25 + k as f64), ("rpm", 1000.5 + k as f64 * 3.0)];
        if k % 4 == 0 {
            fields.pop(); // rpm absent in some readings: absent, not zero
        }
        send(&mut msgs, format!("hourglass/{TABLE}/truck_a"), vec![("truck_a".into(), reading(ts, &fields))], false);
    }
    // Two more writes of truck_a's minute 12 (first with rpm added, then temp alone): the last wins.
    let ts12 = T0 + 12 * 60_000;
    send(
        &mut msgs,
        format!("hourglass/{TABLE}/truck_a"),
        vec![("truck_a".into(), reading(ts12, &[("temp", 32.25), ("rpm", 1036.5)]))],
        false,
    );
    send(
        &mut msgs,
        format!("hourglass/{TABLE}/truck_a"),
        vec![("truck_a".into(), reading(ts12, &[("temp", -7.5)]))],
        false,
    );
    // A gateway batching truck_b and truck_c, RFC 3339 timestamps on some readings, arrays
    // out of order, crossing midnight.
    for batch in 0..4i64 {
        let mut items = Vec::new();
        for j in (0..5i64).rev() {
            let ts = T0 + (batch * 5 + j) * 60_000 + 30_000;
            for dev in ["truck_b", "truck_c"] {
                let mut r = reading(ts, &[("level", 0.125 * (batch * 5 + j) as f64), ("pressure", 101.325 - j as f64)]);
                r.insert("device".into(), json!(dev));
                items.push((dev.to_string(), r));
            }
        }
        send(&mut msgs, format!("hourglass/{TABLE}"), items, true);
    }
    // A reading given with an RFC 3339 timestamp in another offset; stored as epoch ms.
    let rfc_ts = MIDNIGHT + 5 * 60_000 + 30_000; // 2024-01-02T00:05:30Z = 01:05:30+01:00
    let payload = json!([{"device": "truck_c", "ts": "2024-01-02T01:05:30+01:00", "level": 99.5}]);
    msgs.push((format!("hourglass/{TABLE}"), serde_json::to_vec(&payload).unwrap()));
    oracle.insert(("truck_c".into(), rfc_ts), reading(rfc_ts, &[("level", 99.5)]));
    (msgs, oracle)
}

fn expected_for(oracle: &Oracle, dev: &str, from: i64, to: i64) -> Vec<Value> {
    oracle
        .iter()
        .filter(|((d, ts), _)| d == dev && (from..to).contains(ts))
        .map(|(_, r)| Value::Object(r.clone()))
        .collect()
}

fn readings_path(dev: &str, from: &str, to: &str) -> String {
    format!("/v1/tables/{TABLE}/devices/{dev}/readings?from={from}&to={to}")
}

/// Publishes the scenario to `hg`'s broker and checks every read path against the oracle.
fn run_scenario(hg: &Hourglass, broker_port: u16) {
    let (msgs, oracle) = scenario();
    let acked = publish_qos1(broker_port, "scenario-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len(), "every message acked by the broker");

    // Stored asynchronously after the broker's ack: wait until the store has committed every
    // published reading (duplicates and rewrites included — a rewrite does not change how many
    // readings a device has, so counting a device's readings would not wait for it).
    let published: u64 = msgs
        .iter()
        .map(|(_, p)| match serde_json::from_slice::<Value>(p).unwrap() {
            Value::Array(a) => a.len() as u64,
            _ => 1,
        })
        .sum();
    assert_eq!(published, 63);
    let committed = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get("/v1/stats");
        let n = body["store"]["readings"].as_u64().filter(|_| status == 200)?;
        (n >= published).then_some(n)
    });
    assert_eq!(committed, Some(published), "every published reading committed once");

    let from = T0 - 3_600_000;
    let to = T0 + 3 * 3_600_000;
    for dev in ["truck_a", "truck_b", "truck_c"] {
        let expected = expected_for(&oracle, dev, from, to);
        assert!(expected.len() >= 20);
        let (status, got) = hg.get(&readings_path(dev, &from.to_string(), &to.to_string()));
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["table"], TABLE);
        assert_eq!(got["device"], dev);
        assert_eq!(got["readings"], Value::Array(expected), "{dev}: exact readings in order");
    }

    // Half-open ranges, RFC 3339 bounds, across the day boundary.
    let (status, body) = hg.get(&readings_path("truck_a", "2024-01-01T23:58:00Z", &(MIDNIGHT + 120_000).to_string()));
    assert_eq!(status, 200);
    let expected = expected_for(&oracle, "truck_a", MIDNIGHT - 120_000, MIDNIGHT + 120_000);
    assert_eq!(expected.len(), 4);
    assert_eq!(body["readings"], Value::Array(expected));
    let minute12 = &oracle[&("truck_a".to_string(), T0 + 12 * 60_000)];
    assert_eq!(Value::Object(minute12.clone()), json!({"ts": T0 + 12 * 60_000, "temp": -7.5}));

    // Latest of many devices in one request; an unknown device is null.
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/latest?devices=truck_c,truck_a,nobody"));
    assert_eq!(status, 200);
    let newest = |dev: &str| Value::Object(oracle.iter().rfind(|((d, _), _)| d == dev).unwrap().1.clone());
    assert_eq!(
        body,
        json!({"table": TABLE, "latest": [
            {"device": "truck_c", "reading": newest("truck_c")},
            {"device": "truck_a", "reading": newest("truck_a")},
            {"device": "nobody", "reading": null},
        ]})
    );

    // Errors: 404 for unknown table or device, 400 for bad parameters.
    let (status, body) = hg.get(&readings_path("nobody", "0", "1"));
    assert_eq!((status, body["error"].as_str().unwrap()), (404, "unknown device `nobody` in table `plant.sensors`"));
    let (status, body) = hg.get("/v1/tables/no.such/devices/truck_a/readings?from=0&to=1");
    assert_eq!((status, body["error"].as_str().unwrap()), (404, "unknown table `no.such`"));
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/truck_a/readings?from=yesterday&to=1"));
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().starts_with("parameter `from`: "), "{body}");
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/truck_a/readings?from=5"));
    assert_eq!(
        (status, body["error"].as_str().unwrap()),
        (400, "missing parameter `to` (epoch ms, RFC 3339 or relative such as now-1h)")
    );
    let (status, _) = hg.get(&format!("/v1/tables/{TABLE}/devices/truck_a/readings?from=5&to=5"));
    assert_eq!(status, 400);
    let (status, _) = hg.get("/v1/tables/no.such/latest?devices=a");
    assert_eq!(status, 404);
}

/// The README's main job: `hourglass demo`'s simulated trucks keep their connections — tick
/// after tick reaches the store while the broker sees no client leave (a connection opened and
/// closed per tick had it log each departure as an error) — and the demo stops in order.
#[test]
fn the_demo_fleet_publishes_tick_after_tick_over_the_same_connections() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_demo(dir.path(), &["--devices", "20", "--interval-ms", "200", "--backfill-hours", "0"]);
    let names: Vec<String> = (0..20).map(|d| format!("truck_{d}")).collect();
    let path = format!("/v1/tables/fleet.readings/latest?devices={}", names.join(","));
    // Each truck's latest reading time, once every truck has one.
    let latest = || -> Option<Vec<i64>> {
        let (status, body) = hg.get(&path);
        (status == 200).then_some(())?;
        body["latest"].as_array()?.iter().map(|l| l["reading"]["ts"].as_i64()).collect()
    };
    let first = wait_for(Duration::from_secs(30), latest).expect("every truck's first reading is stored");
    assert_eq!(first.len(), 20);
    // Five ticks later (200 ms apart) for every truck.
    let later = wait_for(Duration::from_secs(30), || {
        latest().filter(|now| now.iter().zip(&first).all(|(n, f)| *n >= f + 5 * 200))
    });
    assert!(later.is_some(), "the trucks kept publishing after {first:?}");
    let logs = hg.terminate();
    let running: Vec<&String> = logs.iter().take_while(|l| !l.contains("shutting down")).collect();
    assert!(!running.is_empty() && running.len() < logs.len(), "the demo logged its shutdown");
    let departures: Vec<&&String> =
        running.iter().filter(|l| l.contains("router-drop") || l.contains("already gone")).collect();
    assert!(departures.is_empty(), "clients left the broker while the demo ran: {departures:?}");
    // Stopped as `serve` stops (a second signal would quit at once: QA56 F9), its trucks
    // disconnecting first: the broker logged each of their connections reset as an error (F10).
    assert!(logs.iter().any(|l| l.contains("stopping in order (a second SIGINT")), "{logs:#?}");
    let errors: Vec<&String> = logs.iter().filter(|l| l.contains(r#""level":"ERROR""#)).collect();
    assert!(errors.is_empty(), "the demo's stop logged errors: {errors:#?}");
}

/// The demo refuses a fleet, interval or backfill out of range before it starts anything:
/// `--devices 4294967296` grew it to 23 GB, deaf to Ctrl-C, until the kernel killed it (QA56 F1).
#[test]
fn the_demo_refuses_sizes_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |args: &[&str]| {
        let http = if args.contains(&"--http-listen") { &[][..] } else { &["--http-listen", "127.0.0.1:0"][..] };
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["demo", "--data-dir", "d", "--mqtt-listen", "127.0.0.1:0"])
            .args(http)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    let devices = "Error: --devices must be from 1 to 10000000 (the demo holds its trucks' names in memory; \
                   `hourglass bench` replays larger fleets)";
    assert_eq!(refused(&["--devices", "4294967296"]), (Some(1), devices.to_string()));
    assert_eq!(refused(&["--devices", "0"]), (Some(1), devices.to_string()));
    let interval = "Error: --interval-ms must be from 100 to 86400000 (a day)".to_string();
    assert_eq!(refused(&["--interval-ms", "86400001"]), (Some(1), interval));
    let backfill = "Error: --backfill-hours must be at most 87600 (ten years)".to_string();
    assert_eq!(refused(&["--backfill-hours", "87601"]), (Some(1), backfill));
    // Without tokens on loopback only, in the demo's words (QA56 F11: it blamed auth.enabled).
    let public = "Error: the demo runs without tokens, so it listens on loopback only: give --http-listen and \
                  --mqtt-listen a loopback address such as 127.0.0.1:8080 (they are 0.0.0.0:0 and 127.0.0.1:0); for \
                  other hosts run `hourglass serve` with auth"
        .to_string();
    assert_eq!(refused(&["--http-listen", "0.0.0.0:0"]), (Some(1), public));
    assert!(!dir.path().join("d").exists(), "a refused demo made its data directory");
}

/// A demo stopped during its backfill stops its trucks first: they went on publishing through
/// the ordered stop (the broker is closed to outside clients only), which read on for its 30 s
/// and lost what the broker held then (QA56 F8). Ten hours of 200 trucks at 1 s (7.2M readings)
/// through a broker holding 8 MiB, stopped once 100,000 readings are stored: the trucks
/// disconnect, the stop reads what the broker acked them (at most the pace's 10,485 readings
/// the broker may hold, and what the four connections had in flight: 100 messages each), and
/// nothing is left in the broker, no error logged.
#[test]
fn a_demo_stopped_during_its_backfill_stops_its_trucks_first() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--devices", "200", "--interval-ms", "1000", "--backfill-hours", "10"];
    let hg = Hourglass::start_demo_with_env(dir.path(), &args, &[("HOURGLASS_MQTT__BROKER_BACKLOG_MB", "8")]);
    let stored = || hg.get("/v1/stats").1["store"]["readings"].as_u64().unwrap_or(0);
    assert!(wait_for(Duration::from_secs(120), || (stored() >= 100_000).then_some(())).is_some());
    let (exit, logs) = hg.stop(Duration::from_secs(60));
    assert!(exit.success(), "{exit}: {logs:#?}");
    let message = |l: &Value| l["fields"]["message"].as_str().unwrap_or_default().to_string();
    let lines: Vec<Value> = logs.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(lines.iter().any(|l| message(l) == "backfill stopped: its publishers disconnected"), "{logs:#?}");
    let drained = lines
        .iter()
        .find(|l| message(l) == "embedded MQTT broker closed to its clients and read to its end")
        .unwrap_or_else(|| panic!("no drain line (the broker held messages left unread?): {logs:#?}"));
    let read = drained["fields"]["messages"].as_u64().unwrap();
    assert!(read <= 10_485 / 100 + 1 + 4 * 100, "the stop read {read} messages: the trucks went on publishing");
    let errors: Vec<&Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// The demo's backfill, published as fast as the broker acks, waits for the store: the
/// embedded broker acks on receipt and drops what its backlog cannot hold, and an hour of 3,000
/// trucks at 1 s lost 29% of itself there. Here an hour of 200 trucks at 1 s (720,000 readings,
/// about 120 MB of JSON) through a broker holding 8 MiB: no message dropped, and each truck's
/// readings before the demo's start all stored.
#[test]
fn the_demos_backfill_waits_for_the_store_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A truck has a reading each whole second of the 3,000 s before this: the backfill's (ticks
    // to the second the demo's clock reads at its start, `now`, excluded), and the first live
    // tick's (at that second) when `now` is in the same second as this.
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let args = ["--devices", "200", "--interval-ms", "1000", "--backfill-hours", "1"];
    let hg = Hourglass::start_demo_with_env(dir.path(), &args, &[("HOURGLASS_MQTT__BROKER_BACKLOG_MB", "8")]);
    let (from, to) = ((started - 3_000_000).to_string(), started.to_string());
    // The times of a truck's readings stored in the window.
    let times = |truck: &str| -> Vec<i64> {
        let (mut out, mut cursor) = (Vec::new(), String::new());
        loop {
            let path = format!("/v1/tables/fleet.readings/devices/{truck}/readings?from={from}&to={to}{cursor}");
            let (status, page) = hg.get(&path);
            if status == 404 && out.is_empty() {
                // No reading of the table stored yet.
                return out;
            }
            assert_eq!(status, 200, "{page}");
            out.extend(page["readings"].as_array().into_iter().flatten().filter_map(|r| r["ts"].as_i64()));
            match page["next_cursor"].as_str() {
                Some(next) => cursor = format!("&cursor={next}"),
                None => return out,
            }
        }
    };
    let count = |truck: &str| times(truck).len();
    // A truck of each of the backfill's four publishing connections (50 trucks each, which
    // finish at their own pace), and the whole backfill in the store.
    let trucks = ["truck_0", "truck_50", "truck_100", "truck_199"];
    let whole = || {
        let (_, stats) = hg.get("/v1/stats");
        stats["store"]["readings"].as_u64().is_some_and(|n| n >= 720_000)
    };
    let stored =
        wait_for(Duration::from_secs(180), || (trucks.iter().all(|t| count(t) == 3_000) && whole()).then_some(()));
    let (_, stats) = hg.get("/v1/stats");
    let mqtt = stats["sources"].as_array().unwrap().iter().find(|s| s["source"] == "mqtt").unwrap().clone();
    assert_eq!((mqtt["broker_skips"].as_u64(), mqtt["broker_skipped_messages"].as_u64()), (Some(0), Some(0)));
    if stored.is_none() {
        // What is missing, and what the demo logged of it.
        let counts: Vec<usize> = trucks.iter().map(|t| count(t)).collect();
        let first = (started - 3_000_000 + 999).div_euclid(1000) * 1000;
        let missing: Vec<(&str, Vec<i64>)> = trucks
            .iter()
            .map(|t| {
                let have: std::collections::HashSet<i64> = times(t).into_iter().collect();
                (*t, (first..started).step_by(1000).filter(|ts| !have.contains(ts)).take(10).collect())
            })
            .collect();
        let logs = hg.terminate();
        let told: Vec<&String> = logs.iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
        panic!(
            "{trucks:?}: {counts:?} of 3,000 readings stored (started {started}); missing {missing:?}; {stats}\n{told:#?}"
        );
    }
    // Said once the publishers are done (the last PUBACK in, the connections closed), which can
    // be after the store holds it all: the test stopped the demo before it once (CI at 8249d9c).
    let published = hg.wait_for_log(Duration::from_secs(60), |l| l["fields"]["message"] == "backfill published");
    let logs = hg.terminate();
    assert_eq!(published.map(|l| l["fields"]["readings"].clone()), Some(json!(720000)), "{}", logs.join("\n"));
}

#[test]
fn end_to_end_through_the_embedded_broker() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    run_scenario(&hg, hg.mqtt_port);
    // A clean stop and a restart keep everything.
    let (from, to) = ((T0 - 86_400_000).to_string(), (T0 + 86_400_000).to_string());
    let (status, before) = hg.get(&readings_path("truck_b", &from, &to));
    assert_eq!(status, 200);
    assert_eq!(before["readings"].as_array().map(Vec::len), Some(20));
    hg.terminate();
    let hg = Hourglass::start(dir.path(), None);
    let (status, after) = hg.get(&readings_path("truck_b", &from, &to));
    assert_eq!(status, 200);
    assert_eq!(before, after);
}

/// With `mqtt.subscriptions`, each filter is read on a connection of its own: what is published
/// under either is stored, in order; a topic under neither is not read.
#[test]
fn each_subscription_is_read_on_a_connection_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_MQTT__SUBSCRIPTIONS", TWO_SUBSCRIPTIONS)]);
    let port = hg.mqtt_port;
    read_on_two_connections(hg, port);
}

/// [`each_subscription_is_read_on_a_connection_of_its_own`] through mosquitto (a session a
/// connection, each under the configured client id and a hash of its filter).
#[test]
fn each_subscription_is_read_on_a_connection_of_its_own_through_mosquitto() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let vars = [("HOURGLASS_MQTT__SUBSCRIPTIONS", TWO_SUBSCRIPTIONS)];
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &broker.url(), &vars);
    read_on_two_connections(hg, broker.port);
}

const TWO_SUBSCRIPTIONS: &str = r#"["hourglass/plant.a/#", "hourglass/plant.b/#"]"#;

/// Publishes to `port` under each of [`TWO_SUBSCRIPTIONS`] and under neither, and checks what
/// `hg` stored, its two connections, and that each stopped in order.
fn read_on_two_connections(hg: Hourglass, port: u16) {
    let message =
        |topic: &str, i: i64| (topic.to_string(), format!(r#"{{"ts":{},"v":{i}.5}}"#, T0 + i * 1000).into_bytes());
    let mut msgs: Vec<(String, Vec<u8>)> = (0..3).map(|i| message("hourglass/plant.c/d3", i)).collect();
    msgs.extend((0..10).flat_map(|i| [message("hourglass/plant.a/d1", i), message("hourglass/plant.b/d2", i)]));
    let acked = publish_qos1(port, "two-tables", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, 23);

    let stored = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get("/v1/stats");
        let n = body["store"]["readings"].as_u64().filter(|_| status == 200)?;
        (n >= 20).then_some(body)
    })
    .expect("the readings of both subscriptions stored");
    assert_eq!(stored["store"]["readings"], 20);
    let mqtt = &stored["sources"][0];
    assert_eq!((mqtt["source"].as_str(), mqtt["messages"].as_u64()), (Some("mqtt"), Some(20)));
    assert_eq!((mqtt["connects"].as_u64(), mqtt["subscribed"].as_bool()), (Some(2), Some(true)), "{mqtt}");
    for (table, device) in [("plant.a", "d1"), ("plant.b", "d2")] {
        let path = format!("/v1/tables/{table}/devices/{device}/readings?from={T0}&to={}", T0 + 60_000);
        let (status, body) = hg.get(&path);
        assert_eq!(status, 200, "{body}");
        let expected: Vec<Value> = (0..10).map(|i| json!({"ts": T0 + i * 1000, "v": i as f64 + 0.5})).collect();
        assert_eq!(body["readings"], Value::Array(expected), "{table}");
    }
    let (status, _) = hg.get(&format!("/v1/tables/plant.c/devices/d3/readings?from={T0}&to={}", T0 + 60_000));
    assert_eq!(status, 404, "a topic under no subscription is not read");
    let logs = hg.terminate();
    for filter in ["hourglass/plant.a/#", "hourglass/plant.b/#"] {
        let stopped = logs.iter().filter(|l| l.contains("MQTT consumer stopped") && l.contains(filter)).count();
        assert_eq!(stopped, 1, "the connection of {filter} stopped in order: {logs:#?}");
    }
}

#[test]
fn end_to_end_through_mosquitto() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), Some(&broker.url()));
    run_scenario(&hg, broker.port);
}

/// An external broker that lets Hourglass in only by its login, over TLS, with a client
/// certificate (mosquitto: a password file and `require_certificate` on its TLS listener, the
/// sensors on a plain one): the scenario is stored exactly as through a plain broker.
#[test]
fn end_to_end_through_mosquitto_over_tls_with_a_login() {
    let pki = util::TestPki::new();
    let broker = secured_mosquitto(&pki);
    let (ca, cert, key) =
        (pki.ca.to_str().unwrap(), pki.client_cert.to_str().unwrap(), pki.client_key.to_str().unwrap());
    let vars = [
        ("HOURGLASS_MQTT__USERNAME", "hourglass"),
        ("HOURGLASS_MQTT__PASSWORD", "s3cret pass"),
        ("HOURGLASS_MQTT__CA_FILE", ca),
        ("HOURGLASS_MQTT__CERT_FILE", cert),
        ("HOURGLASS_MQTT__KEY_FILE", key),
    ];
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_with_env(dir.path(), Some(&broker.1), &vars);
    run_scenario(&hg, broker.0.port);
}

/// The same broker with one setting wrong: Hourglass is not let in, is not ready, and its log
/// says which settings to check, without the password; an interrupt stops it in order. Also a
/// plain `mqtt://` url of the TLS port, and a broker whose certificate is X.509 version 1.
#[test]
fn a_refused_login_or_an_unknown_ca_says_which_setting_to_check() {
    let pki = util::TestPki::new();
    let (_broker, tls_url) = secured_mosquitto(&pki);
    let (ca, cert, key) =
        (pki.ca.to_str().unwrap(), pki.client_cert.to_str().unwrap(), pki.client_key.to_str().unwrap());
    let other_ca = pki.other_ca.to_str().unwrap();
    let tls_hint = "mqtt.ca_file (the CA of the broker's certificate)";
    let plain_url = tls_url.replacen("mqtts://", "mqtt://", 1);
    // A TLS listener with an X.509 v1 certificate (mosquitto takes it; rustls does not).
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let v1_broker = Mosquitto::start_with_conf(|port| {
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\ncertfile {}\nkeyfile {}\n",
            fixtures.join("client-v1.pem").display(),
            fixtures.join("client-v1.key").display()
        )
    });
    let v1_url = v1_broker.url().replacen("mqtt://", "mqtts://", 1);
    let cases = [
        (
            &tls_url,
            "s3cret-wrong",
            ca,
            Some((cert, key)),
            "Connection refused",
            "check mqtt.username and mqtt.password",
        ),
        (&tls_url, "s3cret pass", other_ca, Some((cert, key)), "UnknownIssuer", tls_hint),
        (&tls_url, "s3cret pass", ca, None, "CertificateRequired", tls_hint),
        (&plain_url, "s3cret pass", "", None, "Mqtt state", "is the url's port a TLS listener (then mqtts://host:port"),
        (&v1_url, "", ca, None, "UnsupportedCertVersion", "the broker's certificate is X.509 version 1"),
    ];
    for (url, password, ca_file, client, error, hint) in cases {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let args = ["serve", "--data-dir", data.to_str().unwrap(), "--http-listen", "127.0.0.1:0", "--mqtt-url", url];
        let vars = [
            ("HOURGLASS_AUTH__ENABLED", "false"),
            ("HOURGLASS_MQTT__USERNAME", if password.is_empty() { "" } else { "hourglass" }),
            ("HOURGLASS_MQTT__PASSWORD", password),
            ("HOURGLASS_MQTT__CA_FILE", ca_file),
            ("HOURGLASS_MQTT__CERT_FILE", client.map_or("", |c| c.0)),
            ("HOURGLASS_MQTT__KEY_FILE", client.map_or("", |c| c.1)),
        ];
        let hg = util::Watched::start_with_env(&args, dir.path(), &vars);
        let refused = hg.find_log(Duration::from_secs(30), |l| {
            (l["fields"]["message"] == "MQTT connection error; reconnecting").then(|| l["fields"].clone())
        });
        let refused = refused.expect("a connection error logged");
        assert!(refused["error"].as_str().unwrap().contains(error), "{refused}");
        assert!(refused["hint"].as_str().unwrap().contains(hint), "{refused}");
        hg.interrupt();
        let (status, logs, stdout) = hg.finish(Duration::from_secs(30));
        assert!(status.success(), "{logs:#?}");
        assert!(!stdout.contains("hourglass ready"), "{stdout}");
        assert!(logs.iter().any(|l| l.contains("asked to stop before the consumers were subscribed")), "{logs:#?}");
        assert!(!logs.iter().any(|l| l.contains("s3cret")), "the password is not logged: {logs:#?}");
    }
}

/// A broker that refuses the subscription outright (SUBACK 0x80; a fake one, as mosquitto 2.0
/// acknowledges one its ACL denies): logged with a hint, `/ready` 503, and asked again every
/// 10 s (it was asked once, and never again while the connection stayed up).
#[test]
fn a_refused_subscription_is_said_and_asked_for_again() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    fn packet(s: &mut std::net::TcpStream) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 1];
        s.read_exact(&mut head).ok()?;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).ok()?;
            len |= usize::from(b[0] & 0x7f) << shift;
            shift += 7;
            if b[0] & 0x80 == 0 || shift > 21 {
                break;
            }
        }
        let mut body = vec![0; len];
        s.read_exact(&mut body).ok()?;
        Some((head[0], body))
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (subscribes, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let broker = {
        let (subscribes, done) = (subscribes.clone(), done.clone());
        std::thread::spawn(move || {
            listener.set_nonblocking(true).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(90);
            while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
                while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    match packet(&mut s) {
                        Some((0x10, _)) => s.write_all(&[0x20, 2, 0, 0]).unwrap(),
                        Some((0x82, body)) => {
                            subscribes.fetch_add(1, Ordering::SeqCst);
                            s.write_all(&[0x90, 3, body[0], body[1], 0x80]).unwrap();
                        }
                        Some((0xc0, _)) => s.write_all(&[0xd0, 0]).unwrap(),
                        Some((0xe0, _)) => break,
                        Some(_) => {}
                        None => {}
                    }
                }
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("mqtt://127.0.0.1:{port}");
    let args = ["serve", "--data-dir", "data", "--http-listen", "127.0.0.1:0", "--mqtt-url", &url];
    let hg = util::Watched::start_with_env(&args, dir.path(), &[("HOURGLASS_AUTH__ENABLED", "false")]);
    let http = hg
        .find_log(Duration::from_secs(60), |l| {
            (l["fields"]["message"] == "query service listening").then(|| l["fields"]["http_addr"].clone())
        })
        .expect("the query service listens");
    let refused = hg
        .find_log(Duration::from_secs(30), |l| {
            let m = l["fields"]["message"].as_str()?;
            m.starts_with("MQTT broker refused the subscription").then(|| l["fields"].clone())
        })
        .expect("the refusal logged");
    assert_eq!(refused["message"], "MQTT broker refused the subscription; asking again in 10 s");
    assert_eq!(refused["hint"], "the broker's ACL must let Hourglass's login (mqtt.username) read the filter");
    let again = wait_for(Duration::from_secs(40), || (subscribes.load(Ordering::SeqCst) >= 2).then_some(()));
    assert!(again.is_some(), "asked again: {} subscribe(s)", subscribes.load(Ordering::SeqCst));
    let (status, ready) = util::get_json(&format!("http://{}/ready", http.as_str().unwrap()));
    assert_eq!(status, 503, "{ready}");
    assert_eq!(
        ready["reasons"][0],
        "mqtt: not subscribed to the broker: the broker refused the subscription to hourglass/# (its ACL?), asked again \
         every 10 s (see the log)"
    );
    hg.interrupt();
    let (status, logs, _) = hg.finish(Duration::from_secs(60));
    done.store(true, Ordering::SeqCst);
    broker.join().unwrap();
    assert!(status.success(), "{logs:#?}");
}

/// `serve` on the external broker at `url` with `mqtt.silence_warning_s` = 1 and auth off; the
/// query service's address once it listens.
fn serve_warning_of_silence_after_1_s(dir: &std::path::Path, url: &str) -> (util::Watched, String) {
    let args = ["serve", "--data-dir", "data", "--http-listen", "127.0.0.1:0", "--mqtt-url", url];
    let vars = [
        ("HOURGLASS_AUTH__ENABLED", "false"),
        ("HOURGLASS_MQTT__SILENCE_WARNING_S", "1"),
        // The consumer's info lines too (the end of a silence).
        ("RUST_LOG", "warn,hourglass=info,ingest=info"),
    ];
    let hg = util::Watched::start_with_env(&args, dir, &vars);
    let http = hg
        .find_log(Duration::from_secs(60), |l| {
            (l["fields"]["message"] == "query service listening").then(|| l["fields"]["http_addr"].clone())
        })
        .expect("the query service listens");
    (hg, http.as_str().unwrap().to_string())
}

/// The warning of a silent subscription in `hg`'s log, within 30 s: its fields.
fn silence_warning(hg: &util::Watched) -> Value {
    hg.find_log(Duration::from_secs(30), |l| {
        (l["fields"]["message"] == ingest::mqtt::SILENT_SUBSCRIPTION).then(|| {
            assert_eq!(l["level"], "WARN", "{l}");
            l["fields"].clone()
        })
    })
    .expect("the silence warned of")
}

/// mosquitto 2.0 grants a subscription its ACL denies, then drops every message: the only sign
/// of readings lost. Hourglass warns once the subscription granted has delivered nothing for
/// `mqtt.silence_warning_s`, naming the filter and the ACL to check; `/ready` stays 200.
/// Before, it was ready and silent while every reading published was acked and dropped.
#[test]
fn a_subscription_granted_and_denied_by_the_acl_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    // Anonymous clients (sensors and Hourglass) may publish under `hourglass/`, not read it.
    let acl = dir.path().join("acl");
    std::fs::write(&acl, "topic write hourglass/#\n").unwrap();
    let broker = Mosquitto::start_with(&format!("acl_file {}\n", acl.display()));
    let (hg, http) = serve_warning_of_silence_after_1_s(dir.path(), &broker.url());
    let reading = vec![("hourglass/plant.acl/d1".to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes())];
    assert_eq!(publish_qos1(broker.port, "sensor", &reading, Duration::from_secs(10), |_| {}), 1, "acked");
    let warned = silence_warning(&hg);
    assert_eq!(warned["filter"], "hourglass/#");
    assert_eq!(warned["seconds"], 1);
    assert!(warned["hint"].as_str().unwrap().contains("the ACL must let mqtt.username read the filter"), "{warned}");
    // The reading acked is not stored: the broker dropped it, and Hourglass received nothing.
    let path = format!("http://{http}/v1/tables/plant.acl/devices/d1/readings?from={T0}&to={}", T0 + 1);
    let (status, body) = util::get_json(&path);
    assert_eq!((status, body), (404, json!({"error": "unknown table `plant.acl`"})));
    let (_, stats) = util::get_json(&format!("http://{http}/v1/stats"));
    assert_eq!(stats["sources"][0]["messages"], 0, "{stats}");
    let (status, ready) = util::get_json(&format!("http://{http}/ready"));
    assert_eq!(status, 200, "{ready}");
    hg.interrupt();
    let (exit, logs, _) = hg.finish(Duration::from_secs(60));
    assert!(exit.success(), "{logs:#?}");
}

/// A quiet subscription is warned of once; when a message arrives after all, an INFO line says
/// so and the reading is stored; no second warning follows.
#[test]
fn a_silent_subscription_that_then_delivers_is_warned_of_once() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let (hg, http) = serve_warning_of_silence_after_1_s(dir.path(), &broker.url());
    assert_eq!(silence_warning(&hg)["filter"], "hourglass/#");
    let reading = vec![("hourglass/plant.quiet/d1".to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes())];
    assert_eq!(publish_qos1(broker.port, "sensor", &reading, Duration::from_secs(10), |_| {}), 1);
    let over = hg.find_log(Duration::from_secs(30), |l| {
        (l["fields"]["message"] == ingest::mqtt::SILENCE_OVER).then(|| l["fields"]["filter"].clone())
    });
    assert_eq!(over, Some(json!("hourglass/#")));
    let path = format!("http://{http}/v1/tables/plant.quiet/devices/d1/readings?from={T0}&to={}", T0 + 1);
    let stored = wait_for(Duration::from_secs(30), || {
        let (status, body) = util::get_json(&path);
        (status == 200).then_some(body)
    });
    assert_eq!(stored.expect("stored")["readings"], json!([{"ts": T0, "v": 1.5}]));
    // Past another window of silence: still the one warning.
    std::thread::sleep(Duration::from_secs(2));
    hg.interrupt();
    let (exit, logs, _) = hg.finish(Duration::from_secs(60));
    assert!(exit.success(), "{logs:#?}");
    let warnings = logs.iter().filter(|l| l.contains(ingest::mqtt::SILENT_SUBSCRIPTION)).count();
    assert_eq!(warnings, 1, "{logs:#?}");
}

/// mosquitto with a plain listener for anyone (the sensors) and a TLS listener (the test PKI's
/// server certificate) that takes only a client with a certificate of the test CA and the
/// login `hourglass` / `s3cret pass`; and the `mqtts://` url of the second.
fn secured_mosquitto(pki: &util::TestPki) -> (Mosquitto, String) {
    let passwd = pki.path("passwd");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-b", "-c"])
        .arg(&passwd)
        .args(["hourglass", "s3cret pass"])
        .status()
        .expect("mosquitto_passwd runs (Debian's mosquitto)");
    assert!(made.success());
    let mut tls_port = 0;
    let broker = Mosquitto::start_with_conf(|port| {
        tls_port = util::free_addr().port();
        format!(
            "per_listener_settings true\nlistener {port} 127.0.0.1\nallow_anonymous true\n\
             listener {tls_port} 127.0.0.1\nallow_anonymous false\npassword_file {}\ncafile {}\ncertfile {}\n\
             keyfile {}\nrequire_certificate true\n",
            passwd.display(),
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display()
        )
    });
    (broker, format!("mqtts://127.0.0.1:{tls_port}"))
}

/// Two Hourglass consuming under one client id throw each other off the broker: each such
/// connection error says what to check (it said only that the peer closed the connection).
#[test]
fn two_consumers_under_one_client_id_are_told_to_take_their_own() {
    let broker = Mosquitto::start();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let vars = [("HOURGLASS_MQTT__CLIENT_ID", "hourglass-twice")];
    let first = Hourglass::start_logged_with_broker_and_env(one.path(), &broker.url(), &vars);
    let second = Hourglass::start_logged_with_broker_and_env(two.path(), &broker.url(), &vars);
    let thrown_off = |hg: &Hourglass| {
        hg.wait_for_log(Duration::from_secs(30), |l| l["fields"]["message"] == "MQTT connection error; reconnecting")
            .expect("thrown off the broker")
    };
    // The first, thrown off when the second connected.
    let said = thrown_off(&first);
    assert_eq!(
        said["fields"]["hint"],
        "if this repeats every few seconds, another client connects under Hourglass's client id and the broker throws \
         this one off: each Hourglass on a broker needs a mqtt.client_id of its own"
    );
    drop(second.terminate());
    drop(first.terminate());
}

/// A message far past `mqtt.max_payload_bytes` from an external broker (which takes messages
/// of any size) is a dead letter, and what follows it is read: the consumer's client takes every
/// packet MQTT can carry. Before, one past four times the limit broke the connection, and the
/// resumed session sent it again at every reconnect, so nothing behind it was ever stored.
#[test]
fn a_message_past_any_limit_of_the_consumer_is_a_dead_letter_and_the_next_is_read() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let vars = [("HOURGLASS_MQTT__MAX_PAYLOAD_BYTES", "1024")];
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &broker.url(), &vars);
    let mut big = format!(r#"{{"ts":{T0},"s":""#).into_bytes();
    big.resize(big.len() + (3 << 20), b'a');
    big.extend_from_slice(b"\"}");
    let msgs = vec![
        ("hourglass/plant.big/d1".to_string(), big),
        ("hourglass/plant.small/d1".to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes()),
    ];
    assert_eq!(publish_qos1(broker.port, "big-publisher", &msgs, Duration::from_secs(30), |_| {}), 2);
    let path = format!("/v1/tables/plant.small/devices/d1/readings?from={T0}&to={}", T0 + 1);
    let stored = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&path);
        (status == 200).then_some(body)
    });
    assert_eq!(stored.expect("the message after the big one is stored")["readings"], json!([{"ts": T0, "v": 1.5}]));
    let (_, stats) = hg.get("/v1/stats");
    assert_eq!(stats["dead_letters"]["payload_too_large"], 1, "{stats}");
    assert_eq!(stats["sources"][0]["connects"], 1, "one connection all along: {stats}");
    let (status, letters) = hg.get("/v1/dead-letters?limit=10");
    assert_eq!(status, 200);
    assert_eq!(letters["dead_letters"][0]["reason"], "payload_too_large");
    assert_eq!(letters["dead_letters"][0]["payload"].as_str().map(str::len), Some(64 << 10), "a 64 KiB preview kept");
}

/// A second instance started on the first one's HTTP port fails before it touches the broker:
/// the first keeps its MQTT session (one connect) and goes on storing. Before, the second
/// connected under the same client id first, which closed the first's connection.
#[test]
fn a_second_instance_on_a_taken_port_leaves_the_first_connected() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), Some(&broker.url()));
    let other = tempfile::tempdir().unwrap();
    let (http, url, data) = (hg.http.to_string(), broker.url(), other.path().display().to_string());
    let args = ["serve", "--data-dir", data.as_str(), "--http-listen", http.as_str(), "--mqtt-url", url.as_str()];
    let (status, logs, _) = util::Watched::start(&args, other.path()).finish(Duration::from_secs(60));
    assert!(!status.success());
    assert!(logs.iter().any(|l| l.contains("query service cannot listen on")), "{logs:#?}");
    let reading = vec![("hourglass/plant.x/d1".to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes())];
    assert_eq!(publish_qos1(broker.port, "p1", &reading, Duration::from_secs(10), |_| {}), 1);
    let path = format!("/v1/tables/plant.x/devices/d1/readings?from={T0}&to={}", T0 + 1);
    assert!(wait_for(Duration::from_secs(30), || (hg.get(&path).0 == 200).then_some(())).is_some());
    let (_, stats) = hg.get("/v1/stats");
    assert_eq!(stats["sources"][0]["connects"], 1, "{stats}");
}

/// With auth off, a client under the configured `mqtt.client_id` (a device given it, another
/// Hourglass consuming from this one's embedded broker) takes nothing from the consumer, whose
/// client id on the embedded broker is made at each start: every reading is stored, over one
/// connection. It took the consumer's session, and the readings acked into it.
#[test]
fn a_client_under_the_configured_client_id_leaves_the_embedded_consumer_alone() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let mut options = rumqttc::MqttOptions::new("hourglass-ingest", "127.0.0.1", hg.mqtt_port);
    options.set_clean_session(false);
    let (other, mut connection) = rumqttc::Client::new(options, 10);
    other.subscribe("nothing/here", rumqttc::QoS::AtLeastOnce).unwrap();
    let taken = (0..40).find_map(|_| match connection.recv_timeout(Duration::from_millis(500)) {
        Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)))) => Some(()),
        _ => None,
    });
    assert!(taken.is_some(), "the other client connected and subscribed");
    let readings: Vec<(String, Vec<u8>)> = (0..50)
        .map(|i| ("hourglass/plant.y/d1".to_string(), format!(r#"{{"ts":{},"v":{i}}}"#, T0 + i).into_bytes()))
        .collect();
    assert_eq!(publish_qos1(hg.mqtt_port, "p1", &readings, Duration::from_secs(30), |_| {}), 50);
    let path = format!("/v1/tables/plant.y/devices/d1/readings?from={T0}&to={}", T0 + 50);
    let all = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&path);
        (status == 200 && body["readings"].as_array().map(Vec::len) == Some(50)).then_some(())
    });
    assert!(all.is_some(), "{:?}", hg.get(&path));
    // Whatever the other client gets: nothing of the consumer's session.
    let mut received = 0;
    while let Ok(Ok(event)) = connection.recv_timeout(Duration::from_millis(200)) {
        received += usize::from(matches!(event, rumqttc::Event::Incoming(rumqttc::Packet::Publish(_))));
    }
    assert_eq!(received, 0);
    let (_, stats) = hg.get("/v1/stats");
    assert_eq!(stats["sources"][0]["connects"], 1, "the consumer was never thrown off: {stats}");
    drop(other);
}

/// A broker that cannot be reached: its connection error is logged at the first attempt, then
/// once a minute while it repeats (it was logged at every attempt, a line a second).
#[test]
fn a_connection_error_that_repeats_is_logged_once_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens there.
    let url = format!("mqtt://{}", util::free_addr());
    let data = dir.path().join("data");
    let args = ["serve", "--data-dir", data.to_str().unwrap(), "--http-listen", "127.0.0.1:0", "--mqtt-url", &url];
    let hg = util::Watched::start_with_env(&args, dir.path(), &[("HOURGLASS_AUTH__ENABLED", "false")]);
    let first = hg.find_log(Duration::from_secs(30), |l| {
        (l["fields"]["message"] == "MQTT connection error; reconnecting").then(|| l["fields"].clone())
    });
    assert_eq!(first.expect("the first attempt's error logged")["repeats"], 0);
    // The attempts of the next seconds, one a second: not logged.
    std::thread::sleep(Duration::from_secs(4));
    hg.interrupt();
    let (status, logs, _) = hg.finish(Duration::from_secs(30));
    assert!(status.success(), "{logs:#?}");
    let errors = logs.iter().filter(|l| l.contains("MQTT connection error; reconnecting")).count();
    assert_eq!(errors, 1, "{logs:#?}");
}

/// A broker that grants the subscription at QoS 0 only (mosquitto's `max_qos 0`) is warned of:
/// nothing is kept for Hourglass, nor waits for its acks. It was taken in silence.
#[test]
fn a_subscription_granted_at_qos_0_is_warned_of() {
    let broker = Mosquitto::start_with("max_qos 0\n");
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &broker.url(), &[]);
    let warned = hg.wait_for_log(Duration::from_secs(30), |l| l["fields"]["message"] == ingest::mqtt::QOS0_GRANTED);
    let warned = warned.expect("the grant warned of");
    assert_eq!(warned["level"], "WARN");
    assert_eq!(
        warned["fields"]["hint"],
        "let the broker grant QoS 1 to Hourglass's login (mosquitto: max_qos on its listener)"
    );
    drop(hg.terminate());
}

/// A start whose broker holds no session for the consumer's client id, under which the store
/// consumed from that broker before, is warned of: what the broker queued meanwhile is lost. A
/// first start, a start that resumes its session, and a first start on another broker of a
/// store that holds devices (QA49 R8: warned of) are not.
#[test]
fn a_start_without_its_session_is_warned_of_when_the_store_consumed_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let warned = |logs: &[String]| {
        logs.iter().filter(|l| l.contains("MQTT connected without a session for this client id")).count()
    };
    let broker = Mosquitto::start();
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &broker.url(), &[]);
    let reading = vec![("hourglass/plant.x/d1".to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes())];
    assert_eq!(publish_qos1(broker.port, "p1", &reading, Duration::from_secs(10), |_| {}), 1);
    let path = format!("/v1/tables/plant.x/devices/d1/readings?from={T0}&to={}", T0 + 1);
    assert!(wait_for(Duration::from_secs(30), || (hg.get(&path).0 == 200).then_some(())).is_some());
    assert_eq!(warned(&hg.terminate()), 0, "a first start");
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &broker.url(), &[]);
    assert_eq!(warned(&hg.terminate()), 0, "the session resumed");
    let other = Mosquitto::start();
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &other.url(), &[]);
    assert_eq!(warned(&hg.terminate()), 0, "another broker, never consumed from");
    // The first broker restarted without persistence, on its port.
    let (port, url) = (broker.port, broker.url());
    drop(broker);
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(&conf, format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")).unwrap();
    let _restarted = Mosquitto::start_with_config(&conf, port);
    let hg = Hourglass::start_logged_with_broker_and_env(dir.path(), &url, &[]);
    assert_eq!(warned(&hg.terminate()), 1);
    let noted = std::fs::read_to_string(dir.path().join("mqtt-sessions")).unwrap();
    let line = |port: u16| format!("127.0.0.1:{port} hourglass-ingest");
    assert_eq!(noted.lines().collect::<Vec<_>>(), [line(port), line(other.port)]);
}

/// A session the broker kept is subscribed again on reconnect: after a restart with another
/// `mqtt.topic_prefix` under the same client id, mosquitto resumes the session that holds the
/// old prefix's subscription, and what is published under the new prefix is still read.
#[test]
fn a_resumed_session_is_subscribed_to_the_topics_of_now() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let reading = |topic: &str| vec![(topic.to_string(), format!(r#"{{"ts":{T0},"v":1.5}}"#).into_bytes())];
    let first = Hourglass::start_with_env(dir.path(), Some(&broker.url()), &[("HOURGLASS_MQTT__TOPIC_PREFIX", "old")]);
    assert_eq!(publish_qos1(broker.port, "p1", &reading("old/plant.x/d1"), Duration::from_secs(10), |_| {}), 1);
    let path = |dev: &str| format!("/v1/tables/plant.x/devices/{dev}/readings?from={T0}&to={}", T0 + 1);
    let stored = wait_for(Duration::from_secs(30), || (first.get(&path("d1")).0 == 200).then_some(()));
    assert!(stored.is_some(), "the reading under the first prefix is stored");
    first.terminate();

    let hg = Hourglass::start_with_env(dir.path(), Some(&broker.url()), &[("HOURGLASS_MQTT__TOPIC_PREFIX", "new")]);
    assert_eq!(publish_qos1(broker.port, "p2", &reading("new/plant.x/d2"), Duration::from_secs(10), |_| {}), 1);
    let got = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&path("d2"));
        (status == 200).then_some(body)
    });
    let got = got.expect("the reading under the new prefix is stored");
    assert_eq!(got["readings"], json!([{"ts": T0, "v": 1.5}]));
    // The session still holds the old subscription: what arrives there is a dead letter.
    assert_eq!(publish_qos1(broker.port, "p3", &reading("old/plant.x/d3"), Duration::from_secs(10), |_| {}), 1);
    let dead = wait_for(Duration::from_secs(30), || {
        let (_, stats) = hg.get("/v1/stats");
        stats["dead_letters"]["invalid_topic"].as_u64().filter(|&n| n > 0)
    });
    assert_eq!(dead, Some(1), "{:?}", hg.get("/v1/stats"));
}

/// kill -9 while a publisher sends at QoS 1 through mosquitto (which holds the persistent
/// session of Hourglass's consumer); after a restart every message the broker acked is
/// stored, exactly once per (device, ts). With the write buffer off: each batch written
/// straight to its buckets.
#[test]
fn every_acked_reading_survives_kill_9() {
    acked_readings_survive_kill_9(&[("HOURGLASS_STORAGE__WRITE_BUFFER_MB", "0")]);
}

/// The same with two subscriptions, a table each: two connections, each with its own session
/// in mosquitto and its own acks.
#[test]
fn every_acked_reading_survives_kill_9_on_two_connections() {
    let subscriptions = r#"["hourglass/crash.a/#", "hourglass/crash.b/#"]"#;
    acked_readings_survive_kill_9_in(&["crash.a", "crash.b"], &[("HOURGLASS_MQTT__SUBSCRIPTIONS", subscriptions)]);
}

/// The same with the write buffer on (the default): what was acked lives only in its log
/// records and in memory when the process dies, and is all there after the restart.
#[test]
fn every_acked_reading_survives_kill_9_with_the_write_buffer() {
    acked_readings_survive_kill_9(&[]);
}

/// The same under universal compaction (`storage.compaction`), which the store's RocksDB
/// options then name for the buckets.
#[test]
fn every_acked_reading_survives_kill_9_under_universal_compaction() {
    acked_readings_survive_kill_9(&[("HOURGLASS_STORAGE__COMPACTION", "universal")]);
}

/// The compaction style RocksDB persisted for the `buckets` column family of the store under
/// `data_dir`, from its newest OPTIONS file.
fn buckets_compaction_style(data_dir: &std::path::Path) -> String {
    let sections = bucketer::store::persisted_options(&data_dir.join("rocksdb")).unwrap().unwrap();
    sections["CFOptions \"buckets\""]["compaction_style"].clone()
}

fn acked_readings_survive_kill_9(env: &[(&str, &str)]) {
    acked_readings_survive_kill_9_in(&["crash.test"], env);
}

/// [`acked_readings_survive_kill_9`] with device `d`'s readings in table `tables[d % len]`.
fn acked_readings_survive_kill_9_in(tables: &[&str], env: &[(&str, &str)]) {
    let table_of = |d: i64| tables[d as usize % tables.len()];
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_with_env(dir.path(), Some(&broker.url()), env);
    // 3,000 messages of 5 readings each for 30 devices.
    let msgs: Vec<(String, Vec<u8>)> = (0..3000i64)
        .map(|i| {
            let dev = format!("dev_{}", i % 30);
            let body: Vec<Value> = (0..5)
                .map(|j| json!({"ts": T0 + (i / 30) * 5_000 + j * 1_000, "v": (i * 5 + j) as f64 + 0.5}))
                .collect();
            (format!("hourglass/{}/{dev}", table_of(i % 30)), serde_json::to_vec(&body).unwrap())
        })
        .collect();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let publisher = {
        let msgs = msgs.clone();
        let acked = acked.clone();
        let port = broker.port;
        std::thread::spawn(move || {
            publish_qos1(port, "crash-publisher", &msgs, Duration::from_secs(120), |i| {
                acked.store(i + 1, std::sync::atomic::Ordering::SeqCst);
            })
        })
    };
    // Kill while the stream is in full flow.
    let mid = wait_for(Duration::from_secs(60), || {
        let n = acked.load(std::sync::atomic::Ordering::SeqCst);
        (n >= 600).then_some(n)
    });
    assert!(mid.is_some(), "publisher made progress");
    hg.kill9();
    let n_acked = publisher.join().unwrap();
    assert_eq!(n_acked, msgs.len(), "mosquitto acked every message");

    let hg = Hourglass::start_with_env(dir.path(), Some(&broker.url()), env);
    for d in 0..30i64 {
        let dev = format!("dev_{d}");
        let mut expected: Vec<Value> = Vec::new();
        for i in (d..3000).step_by(30) {
            for j in 0..5 {
                expected.push(json!({"ts": T0 + (i / 30) * 5_000 + j * 1_000, "v": (i * 5 + j) as f64 + 0.5}));
            }
        }
        let table = table_of(d);
        let path = format!("/v1/tables/{table}/devices/{dev}/readings?from={T0}&to={}", T0 + 86_400_000);
        let got = wait_for(Duration::from_secs(60), || {
            let (status, body) = hg.get(&path);
            (status == 200 && body["readings"].as_array().map(Vec::len) == Some(expected.len())).then_some(body)
        });
        let got = got.unwrap_or_else(|| panic!("{dev}: not every acked reading is stored: {:?}", hg.get(&path)));
        assert_eq!(got["readings"], Value::Array(expected), "{dev}");
    }
    let universal = env.contains(&("HOURGLASS_STORAGE__COMPACTION", "universal"));
    let style = if universal { "kCompactionStyleUniversal" } else { "kCompactionStyleLevel" };
    assert_eq!(buckets_compaction_style(dir.path()), style);
}

#[test]
fn bad_input_goes_to_dead_letters_and_good_input_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let t = |k: i64| T0 + k * 1000;
    let good = |k: i64| serde_json::to_vec(&json!({"ts": t(k), "x": k as f64 + 0.5})).unwrap();
    let topic = "hourglass/dl.test/sensor_1".to_string();
    let mut oversize = br#"{"ts": 1704153000000, "x": 1.0, "pad": ""#.to_vec();
    oversize.extend(std::iter::repeat_n(b'a', 1 << 20));
    oversize.extend_from_slice(br#""}"#);
    let msgs: Vec<(String, Vec<u8>)> = vec![
        (topic.clone(), good(1)),
        (topic.clone(), b"{not json".to_vec()),
        (topic.clone(), br#"{"ts": 1704153000000, "x": ["hot"]}"#.to_vec()),
        (topic.clone(), br#"{"x": 1.5}"#.to_vec()),
        (topic.clone(), br#"{"ts": 99999999999999999, "x": 1.5}"#.to_vec()),
        (topic.clone(), oversize),
        ("hourglass/bad table!/sensor_1".to_string(), good(2)),
        ("hourglass/dl.test/bad device!".to_string(), good(3)),
        // An array: the good element is stored, the bad one dead-lettered by the schema check (a
        // bool for the f64 field `x`).
        (topic.clone(), serde_json::to_vec(&json!([{"ts": t(4), "x": 4.5}, {"ts": t(5), "x": true}])).unwrap()),
        (topic.clone(), good(6)),
    ];
    let acked = publish_qos1(hg.mqtt_port, "bad-input-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());

    let letters = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get("/v1/dead-letters?limit=100");
        (status == 200 && body["dead_letters"].as_array().map(Vec::len) == Some(8)).then_some(body)
    })
    .expect("eight dead letters");
    // Newest first; reverse to publish order.
    let reasons: Vec<&str> =
        letters["dead_letters"].as_array().unwrap().iter().rev().map(|d| d["reason"].as_str().unwrap()).collect();
    assert_eq!(
        reasons,
        [
            "invalid_json",
            "non_numeric_field",
            "missing_timestamp",
            "invalid_timestamp",
            "payload_too_large",
            "invalid_table",
            "invalid_device",
            "wrong_field_type",
        ]
    );
    let newest = &letters["dead_letters"][0];
    // The schema check's dead letter names the message's topic, as the decoder's do.
    assert_eq!(newest["source"], "hourglass/dl.test/sensor_1");
    assert_eq!(newest["payload"], r#"{"device":"sensor_1","ts":1704153005000,"x":true}"#);
    assert_eq!(
        newest["detail"],
        "table `dl.test` device `sensor_1` ts 1704153005000: field `x` is f64 in schema version 1, got bool true; \
         the reading has no other field"
    );
    // The broker acks on receipt: the last message may still be on its way to the store.
    let path = format!("/v1/tables/dl.test/devices/sensor_1/readings?from={}&to={}", t(0), t(10));
    let want = json!([{"ts": t(1), "x": 1.5}, {"ts": t(4), "x": 4.5}, {"ts": t(6), "x": 6.5}]);
    let stored = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&path);
        (status == 200 && body["readings"] == want).then_some(())
    });
    assert!(stored.is_some(), "good readings stored: {:?}", hg.get(&path));
    let (status, body) = hg.get("/v1/dead-letters?limit=0");
    assert_eq!(status, 400, "{body}");
    // The table's messages: the seven read for it, stored or not (not the one over the size
    // limit, nor those whose topic names no valid table or device).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let messages = format!("/v1/tables/dl.test/messages?from={}&to={}", now - 7_200_000, now + 3_600_000);
    let count = || -> u64 {
        let (_, body) = hg.get(&messages);
        body["hours"].as_array().map_or(0, |h| h.iter().map(|h| h["messages"].as_u64().unwrap()).sum())
    };
    let counted = wait_for(Duration::from_secs(30), || (count() >= 7).then_some(()));
    assert!(counted.is_some(), "{}", count());
    assert_eq!(count(), 7);
}

/// JSON integers from 2^53 on, which no `f64` holds, sent through the broker: stored exactly
/// for a field the table declares `i64`, as the nearest float for an `f64` one; a number with a
/// fraction from 2^53 on is refused for the `i64` field, and the dead letter says how to send it.
#[test]
fn json_integers_past_2_53_are_stored_exactly_in_i64_fields() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let (status, def) = hg.post("/v1/tables", r#"{"name": "big.ints", "fields": {"boot_ns": "i64", "temp": "f64"}}"#);
    assert_eq!(status, 201, "{def}");
    let topic = "hourglass/big.ints/sensor_1".to_string();
    let t = |k: i64| T0 + k * 1000;
    // Raw texts: what a device sends, not what a JSON library in the test would write.
    let msgs: Vec<(String, Vec<u8>)> = [
        format!(r#"{{"ts":{},"boot_ns":1732550400123456789,"temp":9007199254740993}}"#, t(1)),
        format!(r#"[{{"ts":{},"boot_ns":-9223372036854775808,"temp":21.5}},{{"ts":{},"boot_ns":12}}]"#, t(2), t(3)),
        format!(r#"{{"ts":{},"boot_ns":9007199254740993.0,"temp":22.5}}"#, t(4)),
    ]
    .into_iter()
    .map(|payload| (topic.clone(), payload.into_bytes()))
    .collect();
    assert_eq!(publish_qos1(hg.mqtt_port, "big-ints", &msgs, Duration::from_secs(30), |_| {}), msgs.len());

    let path = format!("/v1/tables/big.ints/devices/sensor_1/readings?from={}&to={}", t(0), t(10));
    let want = json!([
        {"ts": t(1), "boot_ns": 1_732_550_400_123_456_789i64, "temp": 9_007_199_254_740_992.0},
        {"ts": t(2), "boot_ns": i64::MIN, "temp": 21.5},
        {"ts": t(3), "boot_ns": 12},
        {"ts": t(4), "temp": 22.5},
    ]);
    let stored = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&path);
        (status == 200 && body["readings"] == want).then_some(())
    });
    assert!(stored.is_some(), "stored exactly: {:?}", hg.get(&path));
    let (status, letters) = hg.get("/v1/dead-letters?limit=10");
    assert_eq!(status, 200, "{letters}");
    let letters = letters["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((&letters[0]["reason"], &letters[0]["source"]), (&json!("wrong_field_type"), &json!(topic)));
    assert_eq!(letters[0]["payload"], format!(r#"{{"device":"sensor_1","ts":{},"boot_ns":9007199254740992.0}}"#, t(4)));
    assert_eq!(
        letters[0]["detail"],
        format!(
            "table `big.ints` device `sensor_1` ts {}: field `boot_ns` is i64 in schema version 1, got f64 \
             9007199254740992 (a float from ±2^53 on may not be the integer sent: send it as an integer, in JSON \
             without fraction or exponent, in line protocol as `…i`); the reading's other fields are stored",
            t(4)
        )
    );
}

/// Without the archive a cold retention keeps nothing: `serve` warns of each table that has
/// one, defined over the API or in `storage.tables`.
#[test]
fn serve_warns_of_cold_retentions_without_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let api = r#"{"name": "api.cold", "partition": "hour", "hot_retention": "2h", "cold_retention": "3h"}"#;
    let (status, created) = hg.post("/v1/tables", api);
    assert_eq!((status, &created["warning"]), (201, &Value::Null), "with the archive: {created}");
    assert_eq!(hg.post("/v1/tables", r#"{"name": "api.hot", "hot_retention": "2h"}"#).0, 201);
    hg.terminate();
    let tables = r#"{ "cfg.cold" = { hot_retention = "1d", cold_retention = "400d" } }"#;
    let vars = [("HOURGLASS_STORAGE__ARCHIVE", "false"), ("HOURGLASS_STORAGE__TABLES", tables)];
    let hg = Hourglass::start_logged_with_env(dir.path(), &vars);
    // A table defined then is told in the answer.
    let (status, created) =
        hg.post("/v1/tables", r#"{"name": "api.later", "hot_retention": "1d", "cold_retention": "30d"}"#);
    assert_eq!(status, 201, "{created}");
    let no_archive = "this store has no archive (storage.archive = false): the table's partitions are deleted for \
                      good at the hot retention, none is kept for the cold one";
    assert_eq!(created["warning"], no_archive);
    // The definition says the store has no archive (the dashboard says so of the table).
    assert_eq!(
        (&created["store_archive"], &hg.get("/v1/tables/api.cold").1["store_archive"]),
        (&json!(false), &json!(false))
    );
    let warned: Vec<String> = hg
        .terminate()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| {
            line["level"] == "WARN" && line["fields"]["message"].as_str().is_some_and(|m| m.contains("cold"))
        })
        .map(|line| line["fields"]["message"].as_str().unwrap().to_string())
        .collect();
    let warning = |table: &str, cold: &str| {
        format!(
            "table \"{table}\" has a cold retention ({cold}) but storage.archive is false: its partitions are deleted \
             for good at the hot retention, none is kept for the cold one (set storage.archive = true to keep them)"
        )
    };
    assert_eq!(warned, [warning("api.cold", "3h"), warning("cfg.cold", "400d"), no_archive.to_string()]);
}

/// What a 409 for a table defined again with other settings adds.
const FIXED: &str = "(partition, hot and cold retention and strictness are fixed when a table is created; a later \
                     definition changes only roll-up retentions and adds fields)";

/// Table definitions over HTTP, and the retention task of `serve` archiving the expired
/// partitions of a table with a short hot retention, deleting those of a table past its cold
/// retention, while a table without one keeps its data.
#[test]
fn tables_are_defined_over_http_and_retention_archives_and_deletes_expired_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_STORAGE__RETENTION_INTERVAL_S", "1")]);
    let hourly = json!({"name": "ret.hourly", "id": 1, "partition": "hour", "hot_retention_ms": 7_200_000,
                        "cold_retention_ms": null, "hour_rollup_retention_ms": null, "day_rollup_retention_ms": null,
                        "hour_rollup_floor_ms": null, "day_rollup_floor_ms": null,
                        "strict": false, "schema_version": 0, "fields": [],
                        "store_archive": true});
    let body = r#"{"name": "ret.hourly", "partition": "hour", "hot_retention": "2h"}"#;
    assert_eq!(hg.post("/v1/tables", body), (201, hourly.clone()));
    // The same definition again is accepted and changes nothing; the number form is the same.
    assert_eq!(hg.post("/v1/tables", body), (200, hourly.clone()));
    let same = r#"{"name": "ret.hourly", "partition": "hour", "hot_retention": 7200000}"#;
    assert_eq!(hg.post("/v1/tables", same), (200, hourly.clone()));
    assert_eq!(hg.get("/v1/tables/ret.hourly"), (200, hourly.clone()));
    // No partition and no retention: day partitions, kept forever.
    let forever = json!({"name": "keep.all", "id": 2, "partition": "day", "hot_retention_ms": null,
                         "cold_retention_ms": null, "hour_rollup_retention_ms": null, "day_rollup_retention_ms": null,
                        "hour_rollup_floor_ms": null, "day_rollup_floor_ms": null,
                         "strict": false, "schema_version": 0, "fields": [],
                        "store_archive": true});
    assert_eq!(hg.post("/v1/tables", r#"{"name": "keep.all"}"#), (201, forever.clone()));
    assert_eq!(hg.get("/v1/tables/keep.all"), (200, forever));
    assert_eq!(hg.get("/v1/tables"), (200, json!({"tables": ["keep.all", "ret.hourly"]})));

    let error = |(status, body): (u16, Value)| (status, body["error"].as_str().unwrap_or_default().to_string());
    assert_eq!(error(hg.get("/v1/tables/no.such")), (404, "unknown table `no.such`".into()));
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "ret.hourly", "partition": "day", "hot_retention": "2h"}"#)),
        (
            409,
            format!(
                "table `ret.hourly` already exists with partition hour, hot retention 2h; \
                 the request asks for partition day, hot retention 2h {FIXED}"
            )
        )
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "ret.hourly", "partition": "hour"}"#)),
        (
            409,
            format!(
                "table `ret.hourly` already exists with partition hour, hot retention 2h; \
                 the request asks for partition hour, no hot retention (kept forever) {FIXED}"
            )
        )
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "bad/name", "partition": "hour"}"#)),
        (
            400,
            "`name`: \"bad/name\" is not a valid table name (1 to 64 ASCII letters, digits, `_`, `-` or `.`, \
             starting with a letter or digit)"
                .into()
        )
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "partition": "fortnight"}"#)),
        (400, "`partition`: \"fortnight\" is not one of \"hour\", \"day\", \"month\"".into())
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "hot_retention": "2 hours"}"#)),
        (
            400,
            "`hot_retention`: \"2 hours\" is not a duration (a whole number followed by ms, s, m, h, d or w, such \
             as \"12h\" or \"30d\") nor a number of milliseconds (JSON, unquoted) from 1 to 9223372036854775807"
                .into()
        )
    );
    assert_eq!(error(hg.post("/v1/tables", "{")).0, 400);
    // A cold retention needs a hot one, and must be longer.
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "cold_retention": "400d"}"#)),
        (
            400,
            "invalid definition of table `t`: a cold retention needs a hot retention (data leaves RocksDB only after \
             the hot one)"
                .into()
        )
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "hot_retention": "30d", "cold_retention": "30d"}"#)),
        (
            400,
            "invalid definition of table `t`: the cold retention must be longer than the hot retention (both count \
             from a partition's end)"
                .into()
        )
    );
    // A day roll-up retention needs an hour one, no longer than it.
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "day_rollup_retention": "730d"}"#)),
        (
            400,
            "invalid definition of table `t`: a day roll-up retention needs an hour roll-up retention no longer \
             than it"
                .into()
        )
    );
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "hour_rollup_retention": "30d", "day_rollup_retention": "7d"}"#)),
        (
            400,
            "invalid definition of table `t`: the day roll-up retention must be at least the hour roll-up retention"
                .into()
        )
    );
    // An hour roll-up retention too short for a day's hours to be rolled up (the default
    // lateness, 5 min).
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "t", "hour_rollup_retention": "12h"}"#)),
        (
            400,
            "an hour roll-up retention of 12h would expire each day's first hour before its last is rolled up (a \
             day's roll-up is made from its hours while its first hour is kept, else read again from all its \
             readings): it must be at least a day and an hour plus \
             rollup.allowed_lateness_ms (300000), 90300000 ms; \"2d\" would do"
                .into()
        )
    );
    // Nothing of the refused requests was created.
    assert_eq!(hg.get("/v1/tables"), (200, json!({"tables": ["keep.all", "ret.hourly"]})));
    // Roll-up retentions are part of the definition (`bucketer::rollups` reads and compacts by
    // them; its tests show that), and set again by each definition of an existing table.
    let kept = json!({"name": "ret.rollups", "id": 3, "partition": "day", "hot_retention_ms": null,
                      "cold_retention_ms": null, "hour_rollup_retention_ms": 7_776_000_000_u64,
                      "day_rollup_retention_ms": 63_072_000_000_u64, "hour_rollup_floor_ms": null,
                      "day_rollup_floor_ms": null, "strict": false, "schema_version": 0, "fields": [],
                        "store_archive": true});
    let body = r#"{"name": "ret.rollups", "hour_rollup_retention": "90d", "day_rollup_retention": "730d"}"#;
    assert_eq!(hg.post("/v1/tables", body), (201, kept.clone()));
    assert_eq!(hg.get("/v1/tables/ret.rollups"), (200, kept.clone()));
    let mut shorter = kept.clone();
    shorter["day_rollup_retention_ms"] = Value::Null;
    shorter["hour_rollup_retention_ms"] = json!(2_592_000_000_u64);
    // The day roll-ups, kept 730 days until now, are kept forever from now on: what the 730
    // days hid stays hidden, the day floor the first day they kept (the day holding the cutoff,
    // 730 days before the request). Then the hours lengthened to 90 days: the hour floor the
    // first hour the 30 days kept; the day floor stays.
    // (As an hour from now: an hour leaving the retention within it is not written any more.)
    let first_kept =
        |now: i64, days: i64, period: i64| (now + 3_600_000 - days * 86_400_000).div_euclid(period) * period;
    let define = |body: &str, floor: &str, days: i64, period: i64| {
        let before = model::now_ms();
        let (status, def) = hg.post("/v1/tables", body);
        let after = model::now_ms();
        assert_eq!(status, 200, "{def}");
        let at = def[floor].as_i64().unwrap();
        assert!(at == first_kept(before, days, period) || at == first_kept(after, days, period), "{def}");
        (def, at)
    };
    let (mut def, day_floor) =
        define(r#"{"name": "ret.rollups", "hour_rollup_retention": "30d"}"#, "day_rollup_floor_ms", 730, 86_400_000);
    shorter["day_rollup_floor_ms"] = json!(day_floor);
    // The answer says the day retention the definition left out is gone (QA34 F6).
    let removed = "this definition has no `day_rollup_retention`: the table's day roll-ups are kept forever from now \
                   on (a definition sets the roll-up retentions it states and removes those it leaves out; state them \
                   to keep them)";
    assert_eq!(def.as_object_mut().unwrap().remove("warning"), Some(json!(removed)));
    assert_eq!(def, shorter);
    assert_eq!(hg.get("/v1/tables/ret.rollups"), (200, shorter.clone()));
    let (longer, hour_floor) =
        define(r#"{"name": "ret.rollups", "hour_rollup_retention": "90d"}"#, "hour_rollup_floor_ms", 30, 3_600_000);
    let mut expected = shorter;
    expected["hour_rollup_retention_ms"] = json!(7_776_000_000_u64);
    expected["hour_rollup_floor_ms"] = json!(hour_floor);
    assert_eq!(longer, expected);
    assert_eq!(hg.get("/v1/tables/ret.rollups"), (200, expected.clone()));
    // A definition without either (adding a field, say) removes both, and says so.
    // (The hour floor stays where the 30 days put it: a floor only moves forward.)
    let (status, mut bare) = hg.post("/v1/tables", r#"{"name": "ret.rollups", "fields": {"w": "f64"}}"#);
    assert_eq!((status, &bare["hour_rollup_floor_ms"]), (200, &json!(hour_floor)), "{bare}");
    assert_eq!(
        bare.as_object_mut().unwrap().remove("warning"),
        Some(json!(
            "this definition has no `hour_rollup_retention`: the table's hour roll-ups are kept forever from now on (a \
             definition sets the roll-up retentions it states and removes those it leaves out; state them to keep \
             them)"
        ))
    );
    assert_eq!((&bare["hour_rollup_retention_ms"], &bare["schema_version"]), (&Value::Null, &json!(1)));
    // Stated again: no warning.
    let again = r#"{"name": "ret.rollups", "hour_rollup_retention": "90d", "fields": {"w": "f64"}}"#;
    let (status, restated) = hg.post("/v1/tables", again);
    assert_eq!((status, &restated["warning"]), (200, &Value::Null), "{restated}");
    // But not the partition, as before.
    assert_eq!(
        error(hg.post("/v1/tables", r#"{"name": "ret.rollups", "partition": "hour"}"#)),
        (
            409,
            format!(
                "table `ret.rollups` already exists with partition day, no hot retention (kept forever); the request \
                 asks for partition hour, no hot retention (kept forever) {FIXED}"
            )
        )
    );
    // A table whose archive is kept 3 hours from a partition's end.
    let cold = r#"{"name": "ret.cold", "partition": "hour", "hot_retention": "2h", "cold_retention": "3h"}"#;
    assert_eq!(hg.post("/v1/tables", cold).0, 201);

    // Readings of 2024 in two hour partitions of each table. The retention task (every second,
    // on the real clock) moves the hourly table's partitions, long expired, to the Parquet
    // archive, from which they still read; deletes ret.cold's, long past its cold retention;
    // and leaves the table without a retention alone. The latest readings stay in RocksDB.
    let tables = ["ret.hourly", "keep.all", "ret.cold"];
    let msgs: Vec<(String, Vec<u8>)> = tables
        .iter()
        .map(|t| {
            let body = json!([{"ts": T0, "v": 1.5}, {"ts": T0 + 1_200_000, "v": 2.5}]);
            (format!("hourglass/{t}/dev_1"), serde_json::to_vec(&body).unwrap())
        })
        .collect();
    assert_eq!(publish_qos1(hg.mqtt_port, "retention-publisher", &msgs, Duration::from_secs(30), |_| {}), 3);
    let both = json!([{"ts": T0, "v": 1.5}, {"ts": T0 + 1_200_000, "v": 2.5}]);
    let range = format!("from={}&to={}", T0 - 3_600_000, T0 + 3_600_000);
    let readings = |table: &str| hg.get(&format!("/v1/tables/{table}/devices/dev_1/readings?{range}"));
    let kept = wait_for(Duration::from_secs(30), || (readings("keep.all").1["readings"] == both).then_some(()));
    assert!(kept.is_some(), "keep.all keeps its readings");
    let archive = dir.path().join("archive").join("table=ret.hourly");
    let files = [
        archive.join("partition=2024-01-01T23").join("part-0.parquet"),
        archive.join("partition=2024-01-02T00").join("part-0.parquet"),
    ];
    let archived = wait_for(Duration::from_secs(30), || files.iter().all(|f| f.exists()).then_some(()));
    assert!(archived.is_some(), "ret.hourly's partitions are archived");
    let (status, body) = readings("ret.hourly");
    assert_eq!((status, &body["readings"]), (200, &both), "ret.hourly reads from the archive");
    let latest =
        json!({"table": "ret.cold", "latest": [{"device": "dev_1", "reading": {"ts": T0 + 1_200_000, "v": 2.5}}]});
    let deleted = wait_for(Duration::from_secs(30), || {
        let (_, latest_now) = hg.get("/v1/tables/ret.cold/latest?devices=dev_1");
        let (status, body) = readings("ret.cold");
        (latest_now == latest && status == 200 && body["readings"] == json!([])).then_some(())
    });
    assert!(deleted.is_some(), "ret.cold's readings were stored, then deleted");
    assert!(!dir.path().join("archive").join("table=ret.cold").exists());
    assert_eq!(readings("keep.all").1["readings"], both);
    // What the archive holds now, in /v1/stats: those two files (the manifest's commit follows
    // a file's rename).
    let bytes: u64 = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    let held = json!({"partitions": 2, "rows": 2, "bytes": bytes, "partitions_waiting": 0, "files_missing": 0});
    let seen = wait_for(Duration::from_secs(30), || (hg.get("/v1/stats").1["archive"] == held).then_some(()));
    assert!(seen.is_some(), "{held} in {}", hg.get("/v1/stats").1);
    // And /metrics counts them: ret.hourly's two one-reading partitions archived, ret.cold's two
    // deleted (past the cold retention already, so never archived), no failure; and holds them.
    // The counters are added to once a partition's spill returns, a moment after its manifest
    // entry (which `archive` above shows) is in: waited for, then checked.
    let want = [
        ("hourglass_archive_partitions_spilled_total ", 2),
        ("hourglass_archive_rows_spilled_total ", 2),
        ("hourglass_archive_spill_failures_total ", 0),
        ("hourglass_archive_run_failures_total ", 0),
        ("hourglass_archive_request_failures_total ", 0),
        ("hourglass_store_partitions_deleted_total ", 2),
        ("hourglass_archive_partitions ", 2),
        ("hourglass_archive_rows ", 2),
        ("hourglass_archive_bytes ", bytes),
    ];
    let value = |metrics: &str, name: &str| {
        metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).map(str::to_string)
    };
    let scrape = || ureq::get(&format!("http://{}/metrics", hg.http)).call().unwrap().into_string().unwrap();
    let counted = |metrics: &String| want.iter().all(|(name, n)| value(metrics, name) == Some(n.to_string()));
    let _ = wait_for(Duration::from_secs(30), || Some(scrape()).filter(counted));
    let metrics = scrape();
    for (name, n) in want {
        assert_eq!(value(&metrics, name), Some(n.to_string()), "{name} in {metrics}");
    }

    // A late reading into archived hour 473375 waits in RocksDB (`storage.archive_late_wait`, a
    // day by default): read with the file at once, counted as waiting, the file not rewritten.
    let late = vec![("hourglass/ret.hourly/dev_1".to_string(), br#"[{"ts": 1704153060000, "v": 9.5}]"#.to_vec())];
    assert_eq!(publish_qos1(hg.mqtt_port, "late-publisher", &late, Duration::from_secs(30), |_| {}), 1);
    let three = json!([{"ts": T0, "v": 1.5}, {"ts": T0 + 60_000, "v": 9.5}, {"ts": T0 + 1_200_000, "v": 2.5}]);
    let waiting = json!({"partitions": 2, "rows": 2, "bytes": bytes, "partitions_waiting": 1, "files_missing": 0});
    let seen = wait_for(Duration::from_secs(30), || {
        (readings("ret.hourly").1["readings"] == three && hg.get("/v1/stats").1["archive"] == waiting).then_some(())
    });
    assert!(seen.is_some(), "{} {}", readings("ret.hourly").1, hg.get("/v1/stats").1);
    assert_eq!(value(&scrape(), "hourglass_archive_partitions_waiting "), Some("1".to_string()));
    assert!(!archive.join("partition=2024-01-01T23").join("part-1.parquet").exists());

    // The log names each partition moved or deleted, as the archive does: hour 2024-01-01T23
    // and the first of Jan 2, of each table with a retention.
    let logs = hg.terminate();
    let events: Vec<Value> = logs.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    let mut moved: Vec<(String, String, u64)> = events
        .iter()
        .filter(|v| v["fields"]["message"] == "retention archived an expired partition")
        .map(|v| {
            let f = &v["fields"];
            (
                f["table"].as_str().unwrap_or_default().to_string(),
                f["partition"].as_str().unwrap_or_default().to_string(),
                f["rows"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    moved.sort();
    assert_eq!(
        moved,
        [
            ("ret.hourly".to_string(), "2024-01-01T23".to_string(), 1),
            ("ret.hourly".to_string(), "2024-01-02T00".to_string(), 1)
        ],
        "{}",
        logs.join("\n")
    );
    // And, once, the hour whose late reading waits.
    let waits: Vec<(String, String)> = events
        .iter()
        .filter(|v| {
            v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("late readings for an archived partition"))
        })
        .map(|v| {
            (
                v["fields"]["table"].as_str().unwrap_or_default().to_string(),
                v["fields"]["partition"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(waits, [("ret.hourly".to_string(), "2024-01-01T23".to_string())], "{}", logs.join("\n"));
    let mut drops: Vec<(String, String, String, String)> = events
        .iter()
        .filter(|v| v["fields"]["message"] == "retention deleted an expired partition")
        .map(|v| {
            let f = &v["fields"];
            let text = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (text("table"), text("partition"), text("from"), text("to"))
        })
        .collect();
    drops.sort();
    assert_eq!(
        drops,
        [
            ("ret.cold".into(), "2024-01-01T23".into(), "2024-01-01T23:00:00Z".into(), "2024-01-02T00:00:00Z".into()),
            ("ret.cold".into(), "2024-01-02T00".into(), "2024-01-02T00:00:00Z".into(), "2024-01-02T01:00:00Z".into()),
        ],
        "{}",
        logs.join("\n")
    );
}

/// Dead letters older than `storage.dead_letter_retention` (7 days unless set) are deleted by
/// the retention task, and logged; a newer one stays, and the next dead letter is numbered after
/// every one ever given, the deleted ones too. `GET /v1/dead-letters` filters by reason and
/// source and pages with a cursor.
#[test]
fn dead_letters_are_filtered_paged_and_deleted_past_their_retention() {
    let dir = tempfile::tempdir().unwrap();
    // 2024-01-01T00:00:00.123Z and a day later: long past 7 days. And one an hour ago.
    let (old, older_by_a_day) = (1_704_067_200_123, 1_704_067_200_123 + 86_400_000);
    let recent = ingest::now_ms() - 3_600_000;
    let letter = |received_ms: i64, payload: &str| model::DeadLetter {
        received_ms,
        source: "hourglass/dl.test/d1".into(),
        reason: model::DeadLetterReason::InvalidJson,
        detail: "not JSON".into(),
        payload: payload.as_bytes().to_vec(),
    };
    {
        let store = bucketer::Store::open(&dir.path().join("rocksdb"), bucketer::StoreConfig::default()).unwrap();
        // Numbered 0, 1, 2: the one an hour ago has the middle number.
        store
            .write(vec![], &[letter(older_by_a_day, "second"), letter(recent, "recent"), letter(old, "first")])
            .unwrap();
    }
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_STORAGE__RETENTION_INTERVAL_S", "1")]);
    let listed = || -> Vec<(String, u64)> {
        let (status, body) = hg.get("/v1/dead-letters?limit=10");
        assert_eq!(status, 200, "{body}");
        body["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| (d["payload"].as_str().unwrap().to_string(), d["seq"].as_u64().unwrap()))
            .collect()
    };
    let kept = wait_for(Duration::from_secs(30), || (listed().len() == 1).then_some(()));
    assert!(kept.is_some(), "the two old dead letters are deleted: {:?}", listed());
    assert_eq!(listed(), [("recent".to_string(), 1)]);
    let list = r#"{"ts":1704067200000,"v":[1]}"#;
    let msgs = vec![
        ("hourglass/dl.test/d2".to_string(), b"{oops".to_vec()),
        ("hourglass/dl.test/d3".to_string(), list.as_bytes().to_vec()),
    ];
    assert_eq!(publish_qos1(hg.mqtt_port, "dead-letter-publisher", &msgs, Duration::from_secs(30), |_| {}), 2);
    let three = wait_for(Duration::from_secs(30), || (listed().len() == 3).then_some(()));
    assert!(three.is_some(), "the new dead letters are listed: {:?}", listed());
    // Numbered on from 3: the deleted letters' 0 and 2 are never given again.
    assert_eq!(listed(), [(list.to_string(), 4), ("{oops".to_string(), 3), ("recent".to_string(), 1)]);

    // Filters, and pages followed by their cursors.
    let page = |query: &str| -> (Vec<String>, Value) {
        let (status, body) = hg.get(&format!("/v1/dead-letters?{query}"));
        assert_eq!(status, 200, "{query}: {body}");
        let payloads = body["dead_letters"].as_array().unwrap().iter();
        (payloads.map(|d| d["payload"].as_str().unwrap().to_string()).collect(), body["next_cursor"].clone())
    };
    let payloads = |query: &str| page(query).0;
    assert_eq!(payloads("reason=invalid_json"), ["{oops", "recent"]);
    assert_eq!(payloads("reason=non_numeric_field"), [list]);
    assert_eq!(payloads("reason=wrong_field_type"), Vec::<String>::new());
    assert_eq!(payloads("source=hourglass/dl.test/d2"), ["{oops"]);
    assert_eq!(payloads("source=hourglass/dl.test/&reason=invalid_json"), ["{oops", "recent"]);
    assert_eq!(payloads("source=kafka:"), Vec::<String>::new());
    let (mut all, mut cursor) = (Vec::new(), page("limit=1"));
    loop {
        all.extend(cursor.0);
        let Some(next) = cursor.1.as_str().map(str::to_string) else { break };
        assert!(all.len() < 4, "a cursor after the last letter: {next}");
        cursor = page(&format!("limit=1&cursor={next}"));
    }
    assert_eq!(all, [list, "{oops", "recent"]);
    let (first, next) = page("limit=1&reason=invalid_json");
    assert_eq!(first, ["{oops"]);
    assert_eq!(
        page(&format!("limit=1&reason=invalid_json&cursor={}", next.as_str().unwrap())),
        (vec!["recent".to_string()], Value::Null)
    );
    let error = |query: &str| {
        let (status, body) = hg.get(&format!("/v1/dead-letters?{query}"));
        (status, body["error"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(error("reason=oops").0, 400);
    assert!(
        error("reason=oops").1.starts_with("parameter `reason`: \"oops\" is not one of invalid_json, "),
        "{:?}",
        error("reason=oops")
    );
    assert_eq!(
        error("cursor=r1.5"),
        (400, "parameter `cursor`: \"r1.5\" is not a dead-letter cursor; pass back `next_cursor`".to_string())
    );

    // A payload that is not UTF-8 is given exactly in base64 too; the UTF-8 ones are not.
    let binary = vec![("hourglass/dl.test/d4".to_string(), vec![0xff, 0x00, 0x80, b'{'])];
    assert_eq!(publish_qos1(hg.mqtt_port, "binary-publisher", &binary, Duration::from_secs(30), |_| {}), 1);
    let letter = wait_for(Duration::from_secs(30), || {
        let (_, body) = hg.get("/v1/dead-letters?source=hourglass/dl.test/d4");
        body["dead_letters"].as_array().and_then(|a| a.first().cloned())
    });
    let letter = letter.expect("the binary payload's dead letter is listed");
    assert_eq!(letter["reason"], "invalid_json");
    assert_eq!(letter["detail"], "payload is not UTF-8 (invalid byte at offset 0)");
    assert_eq!(letter["payload"], "\u{fffd}\u{0}\u{fffd}{");
    assert_eq!(letter["payload_base64"], "/wCAew==");
    let (_, body) = hg.get("/v1/dead-letters?limit=10");
    let letters = body["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 4, "{body}");
    let with_base64: Vec<&Value> = letters.iter().filter(|d| d.get("payload_base64").is_some()).collect();
    assert_eq!(with_base64, [&letter]);

    let logs = hg.terminate();
    let deleted: Vec<(u64, String)> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "retention deleted expired dead letters")
        .map(|v| {
            let f = &v["fields"];
            (f["count"].as_u64().unwrap_or_default(), f["oldest"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    assert_eq!(deleted, [(2, "2024-01-01T00:00:00.123Z".to_string())], "{}", logs.join("\n"));
}

/// The aggregates of `points` computed here, independently of `rollup`: the values are
/// multiples of 1/4, so a plain `f64` sum is exact.
fn aggregates(points: &[(i64, f64)]) -> Value {
    let count = points.len();
    let sum: f64 = points.iter().map(|p| p.1).sum();
    let min = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let max = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let first = points.iter().min_by_key(|p| p.0).unwrap();
    let last = points.iter().max_by_key(|p| p.0).unwrap();
    json!({
        "count": count,
        "sum": sum,
        "min": min,
        "max": max,
        "mean": sum / count as f64,
        "first": {"ts": first.0, "value": first.1},
        "last": {"ts": last.0, "value": last.1},
    })
}

/// Readings of one device: ts → fields.
type DeviceReadings = BTreeMap<i64, Vec<(&'static str, f64)>>;

/// Rows `{"period", "<field>": aggregates}` of `readings` (ts, fields) grouped by `period_of`.
fn expected_rows<'a>(
    readings: impl IntoIterator<Item = (&'a i64, &'a Vec<(&'static str, f64)>)>,
    period_of: impl Fn(i64) -> i64,
) -> Value {
    // period start → field → points
    type Points<'a> = BTreeMap<&'a str, Vec<(i64, f64)>>;
    let mut periods: BTreeMap<i64, Points<'_>> = BTreeMap::new();
    for (ts, fields) in readings {
        for (name, v) in fields {
            periods.entry(period_of(*ts)).or_default().entry(name).or_default().push((*ts, *v));
        }
    }
    let rows: Vec<Value> = periods
        .into_iter()
        .map(|(start, fields)| {
            let mut row = Map::new();
            row.insert("period".into(), json!(start));
            for (name, points) in fields {
                row.insert(name.into(), aggregates(&points));
            }
            Value::Object(row)
        })
        .collect();
    Value::Array(rows)
}

/// [`expected_rows`] of several devices' readings together, each row with `devices`: how many
/// of them reported in its period.
fn expected_group_rows(devices: &[&DeviceReadings], period_of: impl Fn(i64) -> i64) -> Value {
    let mut rows = expected_rows(devices.iter().flat_map(|d| d.iter()), &period_of);
    for row in rows.as_array_mut().unwrap() {
        let period = row["period"].as_i64().unwrap();
        let n = devices.iter().filter(|d| d.keys().any(|ts| period_of(*ts) == period)).count();
        row.as_object_mut().unwrap().insert("devices".into(), json!(n));
    }
    rows
}

/// `rows` of periods of `group_of` as a `group_level` answers them: each with `periods`, how many
/// periods of `period_of` with readings it merged.
fn with_periods(
    mut rows: Value,
    readings: &DeviceReadings,
    period_of: impl Fn(i64) -> i64,
    group_of: impl Fn(i64) -> i64,
) -> Value {
    for row in rows.as_array_mut().unwrap() {
        let group = row["period"].as_i64().unwrap();
        let periods: BTreeSet<i64> =
            readings.keys().filter(|ts| group_of(**ts) == group).map(|ts| period_of(*ts)).collect();
        row.as_object_mut().unwrap().insert("periods".into(), json!(periods.len()));
    }
    rows
}

/// The q-quantiles of each field of `readings` per period (`{"period", "<field>": {"p50",
/// ...}}`), exactly: the value of rank ⌊q·(n−1)⌋ among the period's sorted values.
fn exact_quantiles(readings: &DeviceReadings, period_of: impl Fn(i64) -> i64) -> Vec<(i64, String, [f64; 3])> {
    let mut values: BTreeMap<(i64, &str), Vec<f64>> = BTreeMap::new();
    for (ts, fields) in readings {
        for (name, v) in fields {
            values.entry((period_of(*ts), name)).or_default().push(*v);
        }
    }
    values
        .into_iter()
        .map(|((period, name), mut vs)| {
            vs.sort_by(f64::total_cmp);
            let at = |q: f64| vs[(q * (vs.len() as f64 - 1.0)) as usize];
            (period, name.to_string(), [at(0.5), at(0.9), at(0.99)])
        })
        .collect()
}

/// Readings published over MQTT — out of order, rewritten, one arriving late after its hour
/// was rolled up — come back from `GET /rollups` as the hourly, daily and monthly aggregates
/// computed in the test, once a reading far ahead moves the watermark past them all.
#[test]
fn rollups_end_to_end() {
    const T: &str = "plant.rollups";
    // 2024-01-31T22:00:00Z: four hours from here cross a day and a month boundary.
    const START: i64 = 1_706_738_400_000;
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(
        dir.path(),
        &[("HOURGLASS_ROLLUP__ALLOWED_LATENESS_MS", "60000"), ("HOURGLASS_ROLLUP__INTERVAL_MS", "50")],
    );
    // Groups in the registry: truck_a under site/north, truck_b under site/south.
    let (status, _) = hg.post("/v1/tables", &format!(r#"{{"name": "{T}", "partition": "day"}}"#));
    assert_eq!(status, 201);
    for (device, parent) in [("truck_a", "site/north"), ("truck_b", "site/south")] {
        let (status, body) =
            hg.put(&format!("/v1/tables/{T}/devices/{device}"), &format!(r#"{{"parent": "{parent}"}}"#));
        assert_eq!(status, 200, "{body}");
    }
    // truck_a: a reading every 10 minutes, in reverse order; temp always, rpm every other one.
    let mut readings: DeviceReadings = BTreeMap::new();
    let mut truck_b: DeviceReadings = BTreeMap::new();
    let mut msgs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut publish = |msgs: &mut Vec<(String, Vec<u8>)>, device: &str, ts: i64, fields: Vec<(&'static str, f64)>| {
        let mut body = Map::new();
        body.insert("ts".into(), json!(ts));
        for (k, v) in &fields {
            body.insert((*k).into(), json!(v));
        }
        match device {
            "truck_a" => {
                readings.insert(ts, fields);
            }
            "truck_b" => {
                truck_b.insert(ts, fields);
            }
            _ => {}
        }
        msgs.push((format!("hourglass/{T}/{device}"), serde_json::to_vec(&Value::Object(body)).unwrap()));
    };
    for k in (1..24i64).rev() {
        let mut fields = vec![("temp", 20.0 + k as f64 * 0.25)];
        if k % 2 == 0 {
            fields.push(("rpm", 900.0 - k as f64 * 1.5));
        }
        publish(&mut msgs, "truck_a", START + k * 600_000, fields);
    }
    // Another device in the same table, which must not leak into truck_a's roll-ups.
    publish(&mut msgs, "truck_b", START + 5 * 600_000 + 1, vec![("temp", 1000.0)]);
    publish(&mut msgs, "truck_b", START + 25 * 600_000, vec![("temp", 990.5), ("rpm", 10.0)]);
    // A rewrite of minute 30: the last write wins.
    publish(&mut msgs, "truck_a", START + 3 * 600_000, vec![("temp", -3.75)]);
    let acked = publish_qos1(hg.mqtt_port, "rollup-publisher", &msgs, Duration::from_secs(30), |_| {});
    assert_eq!(acked, msgs.len());
    // Let the first hours be rolled up, then send a late reading into the first hour.
    // The exact aggregates (the quantiles are checked on their own below).
    const EXACT: &str = "aggs=count,sum,min,max,mean,first,last";
    let hour_path =
        format!("/v1/tables/{T}/rollups?device=truck_a&level=hour&from={}&to={}&{EXACT}", START, START + 10 * HOUR);
    wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&hour_path);
        (status == 200 && !body["rows"].as_array().unwrap().is_empty()).then_some(())
    })
    .expect("the first hours are rolled up before the watermark moves on");
    let mut late = Vec::new();
    publish(&mut late, "truck_a", START, vec![("temp", 7.5), ("rpm", 1000.25)]);
    // A reading far ahead moves the watermark past every hour above.
    publish(&mut late, "clock", START + 30 * 24 * HOUR, vec![("tick", 1.0)]);
    assert_eq!(publish_qos1(hg.mqtt_port, "rollup-publisher-2", &late, Duration::from_secs(30), |_| {}), 2);

    let hour_of = |ts: i64| ts.div_euclid(HOUR) * HOUR;
    let day_of = |ts: i64| ts.div_euclid(24 * HOUR) * 24 * HOUR;
    let month_of = |ts: i64| if ts < 1_706_745_600_000 { 1_704_067_200_000 } else { 1_706_745_600_000 };
    let expected_hours = expected_rows(&readings, hour_of);
    assert_eq!(expected_hours.as_array().unwrap().len(), 4);
    let got = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&hour_path);
        (status == 200 && body["rows"] == expected_hours).then_some(body)
    });
    let (_, body) = hg.get(&hour_path);
    assert!(got.is_some(), "hourly roll-ups converge: got {body:#}, want {expected_hours:#}");
    assert_eq!((&body["table"], &body["device"], &body["level"]), (&json!(T), &json!("truck_a"), &json!("hour")));

    let range = format!("from=2024-01-01T00:00:00Z&to={}", START + 10 * HOUR);
    let days = format!("/v1/tables/{T}/rollups?device=truck_a&level=day&{range}&{EXACT}");
    let expected_days = expected_rows(&readings, day_of);
    assert_eq!(expected_days.as_array().unwrap().len(), 2);
    let got = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get(&days);
        (status == 200 && body["rows"] == expected_days).then_some(body)
    });
    assert!(got.is_some(), "daily roll-ups: got {:#}, want {expected_days:#}", hg.get(&days).1);
    let expected_months = expected_rows(&readings, month_of);
    // Grouped, each row says how many rows it merged: January's one day, February's one.
    let days_by_month = with_periods(expected_months.clone(), &readings, day_of, month_of);
    assert_eq!((days_by_month[0]["periods"].clone(), days_by_month[1]["periods"].clone()), (json!(1), json!(1)));
    let (status, body) =
        hg.get(&format!("/v1/tables/{T}/rollups?device=truck_a&level=day&{range}&group_level=month&{EXACT}"));
    assert_eq!((status, &body["rows"], &body["group_level"]), (200, &days_by_month, &json!("month")));
    let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?device=truck_a&level=month&{range}&{EXACT}"));
    assert_eq!((status, &body["rows"]), (200, &expected_months));
    // Fields and aggregates chosen; the hours grouped by day equal the days.
    let (status, body) =
        hg.get(&format!("/v1/tables/{T}/rollups?device=truck_a&level=hour&{range}&fields=rpm&aggs=max,count"));
    assert_eq!(status, 200);
    let first = &body["rows"][0];
    assert_eq!(first, &json!({"period": START, "rpm": {"count": 3, "max": 1000.25}}));
    let (status, body) =
        hg.get(&format!("/v1/tables/{T}/rollups?device=truck_a&level=hour&{range}&group_level=day&{EXACT}"));
    let hours_by_day = with_periods(expected_days.clone(), &readings, hour_of, day_of);
    assert_eq!((status, &body["rows"]), (200, &hours_by_day));
    // January 31st's two hours (22:00, 23:00), February 1st's two.
    let merged: Vec<&Value> = body["rows"].as_array().unwrap().iter().map(|r| &r["periods"]).collect();
    assert_eq!(merged, [&json!(2), &json!(2)]);
    let (status, csv) = util::get_text(&format!(
        "http://{}/v1/tables/{T}/rollups?device=truck_a&level=hour&{range}&group_level=day&fields=rpm&aggs=count&format=csv",
        hg.http
    ));
    let mut want_csv = String::from("period,periods,rpm.count\n");
    for row in hours_by_day.as_array().unwrap() {
        let count = row.get("rpm").map_or(String::new(), |r| r["count"].to_string());
        want_csv.push_str(&format!("{},{},{count}\n", row["period"], row["periods"]));
    }
    assert_eq!((status, csv), (200, want_csv));

    // Quantiles from the sketches: within 1 % of the exact ones.
    for (level, period_of) in [("hour", &hour_of as &dyn Fn(i64) -> i64), ("day", &day_of)] {
        let (status, body) =
            hg.get(&format!("/v1/tables/{T}/rollups?device=truck_a&level={level}&{range}&aggs=p50,p90,p99"));
        assert_eq!(status, 200);
        let rows = body["rows"].as_array().unwrap();
        let want = exact_quantiles(&readings, period_of);
        assert_eq!(want.len(), rows.iter().map(|r| r.as_object().unwrap().len() - 1).sum::<usize>());
        for (period, field, exact) in want {
            let row = rows.iter().find(|r| r["period"] == period).unwrap_or_else(|| panic!("{level} {period}"));
            for (agg, x) in ["p50", "p90", "p99"].into_iter().zip(exact) {
                let got = row[&field][agg].as_f64().unwrap();
                assert!((got - x).abs() <= 0.01 * x.abs(), "{level} {period} {field} {agg}: {got} vs exact {x}");
            }
        }
    }

    // Groups and the table: the merge of their devices, with the devices that reported.
    let group_rows = |query: &str| {
        let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?{query}&{range}&{EXACT}"));
        assert_eq!(status, 200, "{body}");
        body
    };
    let both = expected_group_rows(&[&readings, &truck_b], hour_of);
    let body = group_rows("level=hour");
    assert_eq!((&body["rows"], &body["device"], &body["group"]), (&both, &Value::Null, &Value::Null));
    assert_eq!(group_rows("group=site&level=hour")["rows"], both);
    assert_eq!(group_rows("group=site&level=day")["rows"], expected_group_rows(&[&readings, &truck_b], day_of));
    assert_eq!(group_rows("group=site/north&level=day")["rows"], expected_group_rows(&[&readings], day_of));
    let body = group_rows("group=site/south&level=hour");
    assert_eq!((&body["rows"], &body["group"]), (&expected_group_rows(&[&truck_b], hour_of), &json!("site/south")));
    // A path no device is under is a 404, as an unknown device is (QA34 F3); a group with
    // devices but no row in the range answers none.
    let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?group=elsewhere&level=hour&{range}"));
    assert_eq!(
        (status, body["error"].as_str().unwrap_or_default()),
        (
            404,
            "no device is under group `elsewhere` (and it has no roll-ups in the range): group paths are those of \
             the devices' `parent`, see /v1/tables/plant.rollups/devices?under="
        )
    );
    let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?group=site/north&level=hour&from=0&to=3600000"));
    assert_eq!((status, &body["rows"]), (200, &json!([])), "{body}");

    // Several devices in one request: each device's own rows, in request order.
    let body = group_rows("devices=truck_b,truck_a&level=hour");
    assert_eq!(body["devices"], json!(["truck_b", "truck_a"]));
    let want = json!([
        {"device": "truck_b", "rows": expected_rows(&truck_b, hour_of)},
        {"device": "truck_a", "rows": expected_rows(&readings, hour_of)},
    ]);
    assert_eq!(body["series"], want);
    let body = group_rows("devices=truck_a,truck_b&level=day&group_level=month");
    assert_eq!(body["series"][1]["rows"], with_periods(expected_rows(&truck_b, month_of), &truck_b, day_of, month_of));
    let (status, csv) = util::get_text(&format!(
        "http://{}/v1/tables/{T}/rollups?devices=truck_b,truck_a&level=hour&{range}&fields=rpm&aggs=max&format=csv",
        hg.http
    ));
    let mut want_csv = String::from("device,period,rpm.max\n");
    for (device, readings) in [("truck_b", &truck_b), ("truck_a", &readings)] {
        for row in expected_rows(readings, hour_of).as_array().unwrap() {
            let max = row.get("rpm").map_or(String::new(), |r| r["max"].as_f64().unwrap().to_string());
            want_csv.push_str(&format!("{device},{},{max}\n", row["period"]));
        }
    }
    assert_eq!((status, csv), (200, want_csv));

    // Errors: 400 for bad parameters, 404 for an unknown table or device.
    let bad = |query: &str| {
        let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        body["error"].as_str().unwrap().to_string()
    };
    assert_eq!(bad(&format!("device=truck_a&group=site&{range}")), "give one of `device`, `devices` and `group`");
    let message = bad(&format!("group=site//x&{range}"));
    assert!(message.starts_with("group path \"site//x\" is not 1 to "), "{message}");
    assert_eq!(
        bad(&format!("device=truck_a&level=week&{range}")),
        "parameter `level`: \"week\" is not one of \"hour\", \"day\", \"month\""
    );
    assert_eq!(
        bad(&format!("device=truck_a&aggs=p98&{range}")),
        "parameter `aggs`: \"p98\" is not one of count, sum, min, max, mean, first, last, p50, p90, p95, p99, p999"
    );
    assert_eq!(
        bad(&format!("device=truck_a&group_level=week&{range}")),
        "parameter `group_level`: \"week\" is not one of \"year\", \"month\", \"day\""
    );
    assert_eq!(bad("device=truck_a&from=10&to=5"), "empty range: `from` (10) must be before `to` (5)");
    assert_eq!(bad("device=truck_a&from=5"), "missing parameter `to` (epoch ms, RFC 3339 or relative such as now-1h)");
    let (status, body) = hg.get(&format!("/v1/tables/no.such/rollups?device=truck_a&{range}"));
    assert_eq!((status, body["error"].as_str().unwrap()), (404, "unknown table `no.such`"));
    let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?device=nobody&{range}"));
    assert_eq!((status, body["error"].as_str().unwrap()), (404, "unknown device `nobody` in table `plant.rollups`"));
    let (status, body) = hg.get(&format!("/v1/tables/{T}/rollups?devices=truck_a,nobody&{range}"));
    assert_eq!((status, body["error"].as_str().unwrap()), (404, "unknown device `nobody` in table `plant.rollups`"));
    assert_eq!(bad(&format!("devices=,&{range}")), "parameter `devices` names no device");
    // `truck_a, nobody` (a space after the comma) names ` nobody`, which no device may be.
    assert_eq!(
        bad(&format!("devices=truck_a,%20nobody&{range}")),
        "parameter `devices`: \" nobody\" is not a device name (1 to 128 ASCII letters, digits, `_`, `-`, `.` or \
         `:`, starting with a letter or digit)"
    );
    assert_eq!(
        bad(&format!("devices=truck_a&devices=truck_b&{range}")),
        "parameter `devices` is given more than once: give it once (a list is comma-separated)"
    );
    assert_eq!(bad(&format!("devices=truck_a&device=truck_a&{range}")), "give one of `device`, `devices` and `group`");

    // Every message was counted once for the table (no crash: the approximate counter is
    // exact here), in the wall-clock hours of the test.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let (status, body) = hg.get(&format!("/v1/tables/{T}/messages?from={}&to={}", now - 2 * HOUR, now + HOUR));
    assert_eq!((status, &body["approximate"]), (200, &json!(true)), "{body}");
    let counted: u64 = body["hours"].as_array().unwrap().iter().map(|h| h["messages"].as_u64().unwrap()).sum();
    assert_eq!(counted, (msgs.len() + late.len()) as u64, "{body}");
    // In JSON only; `format=json` is fine, another is refused.
    let json_too = hg.get(&format!("/v1/tables/{T}/messages?from={}&to={}&format=json", now - 2 * HOUR, now + HOUR));
    assert_eq!(json_too, (200, body.clone()));
    let (status, refused) =
        hg.get(&format!("/v1/tables/{T}/messages?from={}&to={}&format=csv", now - 2 * HOUR, now + HOUR));
    assert_eq!(
        (status, refused),
        (400, json!({"error": "parameter `format`: \"csv\": message counts are answered in JSON only"}))
    );

    // The work is counted, and nothing due is left: only the far reading's hour is dirty.
    let metrics = ureq::get(&format!("http://{}/metrics", hg.http)).call().unwrap().into_string().unwrap();
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("hourglass_rollup_hours_processed_total ") >= 6.0, "{metrics}");
    assert_eq!(value("hourglass_rollup_lag_seconds "), 0.0, "{metrics}");
    hg.terminate();
}
