//! Ordered shutdown under load: SIGTERM while a QoS 1 publisher streams through mosquitto,
//! which holds Hourglass's persistent session; then a restart on the same data. Nothing acked
//! is lost, and nothing stored is delivered again: the readings each run commits add up to
//! exactly the readings published.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::{free_addr, publish_qos1, publish_qos1_reconnecting, wait_for, Hourglass, Mosquitto, Watched};

const TABLE: &str = "shutdown.test";
/// 2024-01-01T23:50:00Z.
const T0: i64 = 1_704_153_000_000;
const DEVICES: i64 = 30;
const MESSAGES: i64 = 3000;
const PER_MESSAGE: i64 = 5;

/// Message `i`: five readings of device `i % 30`, one second apart.
fn readings_of(i: i64) -> Vec<Value> {
    (0..PER_MESSAGE)
        .map(|j| json!({"ts": T0 + (i / DEVICES) * 5_000 + j * 1_000, "v": (i * 5 + j) as f64 + 0.5}))
        .collect()
}

/// Every message of the test, with its topic.
fn all_messages() -> Vec<(String, Vec<u8>)> {
    (0..MESSAGES)
        .map(|i| (format!("hourglass/{TABLE}/dev_{}", i % DEVICES), serde_json::to_vec(&readings_of(i)).unwrap()))
        .collect()
}

/// Publishes `msgs` at QoS 1 to the broker on `port` on a thread of its own (which answers the
/// messages acked), and returns once 600 are acked: the stream is in full flow.
fn publish_in_flow(port: u16, client_id: &str, msgs: &[(String, Vec<u8>)]) -> std::thread::JoinHandle<usize> {
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let (msgs, acked, client_id) = (msgs.to_vec(), acked.clone(), client_id.to_string());
        std::thread::spawn(move || {
            publish_qos1(port, &client_id, &msgs, Duration::from_secs(120), |i| {
                acked.store(i + 1, Ordering::SeqCst);
            })
        })
    };
    let mid = wait_for(Duration::from_secs(60), || {
        let n = acked.load(Ordering::SeqCst);
        (n >= 600).then_some(n)
    });
    assert!(mid.is_some(), "publisher made progress");
    publisher
}

/// Hourglass's own log messages (target `hourglass::*`) from its JSON log lines, with fields.
fn messages(logs: &[String]) -> Vec<(String, Value)> {
    logs.iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"].as_str().is_some_and(|t| t.starts_with("hourglass")))
        .map(|v| (v["fields"]["message"].as_str().unwrap_or_default().to_string(), v["fields"].clone()))
        .collect()
}

/// The shutdown steps in the logs, in order; and the readings the bucketer had committed.
fn shutdown_steps(logs: &[String]) -> (Vec<String>, u64) {
    let msgs = messages(logs);
    let start = msgs.iter().position(|(m, _)| m == "shutting down: stopping intake").unwrap_or_else(|| {
        panic!("no shutdown in the logs:\n{}", logs.join("\n"));
    });
    let steps: Vec<String> = msgs[start..].iter().map(|(m, _)| m.clone()).collect();
    let committed = msgs[start..]
        .iter()
        .find(|(m, _)| m == "bucketer drained; stopping the roll-up task")
        .and_then(|(_, f)| f["committed"].as_u64())
        .unwrap_or_else(|| panic!("no committed count:\n{}", logs.join("\n")));
    (steps, committed)
}

const STEPS: [&str; 7] = [
    "shutting down: stopping intake",
    "retention task stopped",
    "bucketer drained; stopping the roll-up task",
    "roll-up task stopped; flushing acks",
    "acks flushed; flushing RocksDB",
    "RocksDB flushed and its compactions stopped; stopping the query service",
    "stopped",
];

/// `steps` holds [`STEPS`] in order (other lines may sit between) and ends with the last.
fn assert_ordered(steps: &[String]) {
    let mut at = 0;
    for s in steps {
        if at < STEPS.len() && s == STEPS[at] {
            at += 1;
        }
    }
    assert_eq!(at, STEPS.len(), "ordered shutdown steps, got {steps:?}");
    assert_eq!(steps.last().map(String::as_str), Some("stopped"));
}

#[test]
fn sigterm_under_load_loses_nothing_acked_and_stores_nothing_twice() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged(dir.path(), Some(&broker.url()));
    let msgs = all_messages();
    // SIGTERM while the stream is in full flow; the publisher goes on while Hourglass is down.
    let publisher = publish_in_flow(broker.port, "shutdown-publisher", &msgs);
    let first_logs = hg.terminate();
    let (steps, committed_first) = shutdown_steps(&first_logs);
    assert_ordered(&steps);
    // The bucketer commits whole messages.
    assert_eq!(committed_first % PER_MESSAGE as u64, 0, "{committed_first}");

    let n_acked = publisher.join().unwrap();
    assert_eq!(n_acked, msgs.len(), "mosquitto acked every message");

    // Restart on the same data: mosquitto redelivers what the first run had not acked.
    let hg = Hourglass::start_logged(dir.path(), Some(&broker.url()));
    let (from, to) = (T0, T0 + 86_400_000);
    let mut total = 0;
    for d in 0..DEVICES {
        let expected: Vec<Value> = (d..MESSAGES).step_by(DEVICES as usize).flat_map(readings_of).collect();
        let path = format!("/v1/tables/{TABLE}/devices/dev_{d}/readings?from={from}&to={to}");
        let got = wait_for(Duration::from_secs(60), || {
            let (status, body) = hg.get(&path);
            (status == 200 && body["readings"].as_array().map(Vec::len) == Some(expected.len())).then_some(body)
        });
        let got = got.unwrap_or_else(|| panic!("dev_{d}: not every acked reading is stored: {:?}", hg.get(&path)));
        // Exact values in timestamp order: no reading lost, none twice.
        assert_eq!(got["readings"], Value::Array(expected.clone()), "dev_{d}");
        total += expected.len();
    }
    assert_eq!(total, (MESSAGES * PER_MESSAGE) as usize);
    let (status, tables) = hg.get("/v1/tables");
    assert_eq!(status, 200);
    assert_eq!(tables, json!({"tables": [TABLE]}));

    let logs = hg.terminate();
    let (steps, committed_second) = shutdown_steps(&logs);
    assert_ordered(&steps);
    // What the first run committed it also acked, so the broker did not deliver it again:
    // the two runs together committed each published reading exactly once.
    assert_eq!(
        committed_first + committed_second,
        (MESSAGES * PER_MESSAGE) as u64,
        "first run committed {committed_first}, second {committed_second}; logs of the first run:\n{}\nof the second:\n{}",
        first_logs.join("\n"),
        logs.join("\n")
    );
}

/// SIGTERM while the consumer still waits to subscribe (to a broker that is not there): the
/// ordered stop, every step of it, and an exit of 0, not the signal's default end. SIGHUP (a
/// terminal closed) the same: it ended the process at once, as a crash (exit 129).
#[test]
fn sigterm_or_sighup_before_the_consumer_is_subscribed_stops_in_order() {
    for signal in ["-TERM", "-HUP"] {
        stops_in_order_before_subscribed(signal);
    }
}

fn stops_in_order_before_subscribed(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("mqtt://{}", free_addr());
    let args = ["serve", "--data-dir", "data", "--http-listen", "127.0.0.1:0", "--mqtt-url", &url];
    let hg = Watched::start_with_env(&args, dir.path(), &[("HOURGLASS_AUTH__ENABLED", "false")]);
    let listening = |v: &Value| (v["fields"]["message"] == "query service listening").then_some(());
    hg.find_log(Duration::from_secs(60), listening).expect("the query service listens");
    hg.signal(signal);
    let (exit, logs, out) = hg.finish(Duration::from_secs(30));
    assert!(exit.success(), "exit {exit}; logs:\n{}", logs.join("\n"));
    assert!(!out.contains("hourglass ready"), "{out}");
    let msgs = messages(&logs);
    assert!(msgs.iter().any(|(m, _)| m == "asked to stop before the consumers were subscribed"), "{logs:?}");
    // With an external broker, auth off opens the HTTP service only: the one at the port bound.
    let (_, listening) = msgs.iter().find(|(m, _)| m == "query service listening").unwrap();
    let addr = listening["http_addr"].as_str().unwrap();
    assert!(!addr.ends_with(":0"), "{addr}");
    let open = format!("AUTH IS OFF: anyone who reaches {addr} (HTTP) can read and write every table.");
    assert!(msgs.iter().any(|(m, _)| m.starts_with(&open)), "{logs:?}");
    let (steps, committed) = shutdown_steps(&logs);
    assert_ordered(&steps);
    assert_eq!(committed, 0);
}

/// The embedded broker acks a QoS 1 publish as soon as it holds it, before Hourglass reads it.
/// SIGTERM under a publisher closes the broker to it first and reads the broker to its end
/// before intake stops: every reading the broker acked is stored (and at most the one message
/// in flight besides, which it may have taken without its ack reaching the publisher). Before,
/// the broker went on acking while the stop ran, and those readings were lost.
#[test]
fn sigterm_with_the_embedded_broker_stores_every_reading_it_acked() {
    let msgs = all_messages();
    // On a loaded machine the publisher may have sent every message before the stop reaches
    // the broker: the run then shows nothing, and is made again (three runs at most).
    for run in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let hg = Hourglass::start_logged(dir.path(), None);
        // The publisher returns at its first connection error: when the stop closes its
        // connection.
        let publisher = publish_in_flow(hg.mqtt_port, "embedded-publisher", &msgs);
        let logs = hg.terminate();
        let n_acked = publisher.join().unwrap();
        if n_acked < msgs.len() || run == 3 {
            assert_every_acked_reading_stored(dir.path(), &logs, n_acked);
            return;
        }
    }
}

/// Devices reconnect at once when their connection closes. The stop first stops the broker
/// taking connections, so such a publisher is refused from then on: its one connection is
/// closed, the broker is read to its end, and every reading it acked is stored. Before, the
/// broker took each reconnection and acked on it until the drain's 30 s limit, and the stop
/// then warned that what was published in its last second may be lost.
#[test]
fn sigterm_with_the_embedded_broker_refuses_a_publisher_that_reconnects() {
    let msgs = all_messages();
    // As above: a publisher that sent every message before the stop reached the broker shows
    // nothing, and the run is made again (three runs at most).
    for run in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let hg = Hourglass::start_logged(dir.path(), None);
        let (acked, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let publisher = {
            let (msgs, acked, stop, port) = (msgs.clone(), acked.clone(), stop.clone(), hg.mqtt_port);
            std::thread::spawn(move || {
                publish_qos1_reconnecting(port, "reconnecting-publisher", &stop, &msgs, Duration::from_secs(150), |i| {
                    acked.store(i + 1, Ordering::SeqCst);
                })
            })
        };
        assert!(wait_for(Duration::from_secs(60), || (acked.load(Ordering::SeqCst) >= 600).then_some(())).is_some());
        let (exit, logs) = hg.stop(Duration::from_secs(60));
        stop.store(true, Ordering::SeqCst);
        let (n_acked, errors) = publisher.join().unwrap();
        assert!(exit.success(), "{exit}; logs:\n{}", logs.join("\n"));
        if n_acked < msgs.len() || run == 3 {
            // It lost its connection, tried again and was refused until the process was gone.
            assert!(errors >= 2, "{errors} connection errors, {n_acked} messages acked");
            assert_every_acked_reading_stored(dir.path(), &logs, n_acked);
            return;
        }
    }
}

/// The stop's logs say the embedded broker was closed to one client and read to its end, and
/// the readings committed are those of the `n_acked` messages acked (and at most the one in
/// flight besides), as a restart reads them back.
fn assert_every_acked_reading_stored(dir: &std::path::Path, logs: &[String], n_acked: usize) {
    let msgs = all_messages();
    assert!(n_acked < msgs.len(), "the stop came before the publisher was done ({n_acked} acked)");
    let (steps, committed) = shutdown_steps(logs);
    assert_ordered(&steps);
    let msgs_log = messages(logs);
    let closed = msgs_log
        .iter()
        .find(|(m, _)| m == "embedded MQTT broker closed to its clients and read to its end")
        .unwrap_or_else(|| panic!("no drain in the logs:\n{}", logs.join("\n")));
    assert_eq!(closed.1["clients_closed"], 1, "{:?}", closed.1);
    let per = PER_MESSAGE as u64;
    let stored_msgs = committed / per;
    assert_eq!(committed % per, 0, "{committed}");
    assert!(
        stored_msgs == n_acked as u64 || stored_msgs == n_acked as u64 + 1,
        "{n_acked} messages acked, {stored_msgs} stored; logs:\n{}",
        logs.join("\n")
    );

    // Read back after a restart: each device holds exactly the readings of the messages stored,
    // in order, once each.
    let hg = Hourglass::start(dir, None);
    let (from, to) = (T0, T0 + 86_400_000);
    for d in 0..DEVICES {
        let expected: Vec<Value> = (d..stored_msgs as i64).step_by(DEVICES as usize).flat_map(readings_of).collect();
        let path = format!("/v1/tables/{TABLE}/devices/dev_{d}/readings?from={from}&to={to}");
        let (status, body) = hg.get(&path);
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["readings"], Value::Array(expected), "dev_{d}");
    }
}

/// A stop while the store's commits fail (a full disk; here a file-size limit that the
/// write-ahead log runs into) ends instead of retrying for ever: the failing commit is given
/// up, unacknowledged, and Hourglass exits with status 1 and the count of readings not stored.
/// A restart reads back exactly the writes answered 204, and nothing of the one given up.
#[test]
fn sigterm_while_commits_fail_gives_the_commit_up_and_exits_with_its_count() {
    const LINES: usize = 50;
    const FILE_LIMIT_KIB: u64 = 1024;
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_file_limit(dir.path(), FILE_LIMIT_KIB, &[]);
    let pad = "x".repeat(1000);
    // Write `w`: LINES readings of `d1`, one a second from T0 + w minutes, `v` = w * 1000 + line.
    let body = |w: usize| -> String {
        (0..LINES)
            .map(|i| {
                format!("shutdown.disk,name=d1 v={}i,pad=\"{pad}\" {}\n", w * 1000 + i, T0 + (w * 60 + i) as i64 * 1000)
            })
            .collect()
    };
    let url = format!("http://{}/write?precision=ms", hg.http);
    // About 50 KB of log a write: the 1 MiB limit is met in some twenty; a write that gets no
    // answer in 5 s is the one whose commit fails (it is retried, unanswered).
    let mut acked = 0;
    let unanswered = (0..200).find(|&w| match ureq::post(&url).timeout(Duration::from_secs(5)).send_string(&body(w)) {
        Ok(answer) => {
            assert_eq!(answer.status(), 204, "write {w}");
            acked += 1;
            false
        }
        Err(ureq::Error::Transport(t)) => {
            assert_eq!(t.kind(), ureq::ErrorKind::Io, "write {w}: {t}");
            true
        }
        Err(e) => panic!("write {w}: {e}"),
    });
    assert!(unanswered.is_some(), "a write ran into the {FILE_LIMIT_KIB} KiB limit within 200 writes");
    assert!(acked > 0, "writes before the limit were stored");
    let (status, ready) = hg.get("/ready");
    assert_eq!(status, 503, "{ready}");
    assert!(ready["reasons"].to_string().contains("commit"), "{ready}");
    // A write meanwhile is refused at once (it waited unanswered beside the failing one). One
    // line: the refusal comes before the body is read, and the client, still sending a body of
    // 50 KB then, met a closed connection (a broken pipe) instead of the answer.
    let line = format!("shutdown.disk,name=d1 v=999000i {}\n", T0 + 999 * 60_000);
    match ureq::post(&url).timeout(Duration::from_secs(5)).send_string(&line) {
        Err(ureq::Error::Status(503, answer)) => {
            let text = answer.into_string().unwrap();
            assert!(text.contains("the store's commits are failing ("), "{text}");
        }
        other => panic!("a write while commits fail: {other:?}"),
    }

    let (exit, logs) = hg.stop(Duration::from_secs(60));
    assert_eq!(exit.code(), Some(1), "exit {exit}; logs:\n{}", logs.join("\n"));
    let msgs = messages(&logs);
    let steps: Vec<&str> = msgs.iter().map(|(m, _)| m.as_str()).collect();
    for step in ["shutting down: stopping intake", "retention task stopped", "acks flushed; flushing RocksDB"] {
        assert!(steps.contains(&step), "{step:?} in {steps:?}");
    }
    // The bucketer's own count (its log target is `bucketer::writer`).
    let given_up = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["fields"]["message"]
                == "stopped while commits failed: these readings were neither stored nor acknowledged"
        })
        .unwrap_or_else(|| panic!("no count of what was given up:\n{}", logs.join("\n")));
    let given_up = &given_up["fields"];
    assert_eq!((given_up["readings"].as_u64(), given_up["batches"].as_u64()), (Some(LINES as u64), Some(1)));
    // The error the process ends with (a log line, as the logs are JSON).
    let fatal = format!(
        "the store's commits failed until the stop: {LINES} readings (1 batch) were neither stored nor acknowledged"
    );
    assert!(steps.last().is_some_and(|m| m.starts_with(&fatal)), "{fatal:?} last in {steps:?}");
    assert!(!steps.contains(&"stopped"), "{steps:?}");

    // Without the limit: exactly the acknowledged writes, in order.
    let hg = Hourglass::start(dir.path(), None);
    let path = format!("/v1/tables/shutdown.disk/devices/d1/readings?from={T0}&to={}&limit=10000", T0 + 86_400_000);
    let (status, got) = hg.get(&path);
    assert_eq!(status, 200, "{got}");
    let got: Vec<(i64, i64)> = got["readings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["ts"].as_i64().unwrap(), r["v"].as_i64().unwrap()))
        .collect();
    let expected: Vec<(i64, i64)> = (0..acked)
        .flat_map(|w| (0..LINES).map(move |i| (T0 + (w * 60 + i) as i64 * 1000, (w * 1000 + i) as i64)))
        .collect();
    assert_eq!(got, expected);
}
