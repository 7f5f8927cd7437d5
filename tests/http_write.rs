//! InfluxDB's write API on the query service (`POST /write`, `POST /api/v2/write`): line
//! protocol stored and answered only once committed, partial writes, gzip, limits, and write
//! permission per table. Real `hourglass serve`, real RocksDB in temp dirs, real HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::io::Write;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use util::Hourglass;

/// 2024-01-01T00:00:00Z, ms.
const T0: i64 = 1_704_067_200_000;
const ADMIN: &str = "hg_admin_token_for_the_http_write_tests";

/// `POST {path}` with `body` and `headers`: (status, body text).
fn post(hg: &Hourglass, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut req = ureq::post(&format!("http://{}{path}", hg.http)).timeout(Duration::from_secs(30));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.send_bytes(body) {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("POST {path}: {e}"),
    }
}

fn get(hg: &Hourglass, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = ureq::get(&format!("http://{}{path}", hg.http)).timeout(Duration::from_secs(30));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn readings(hg: &Hourglass, table: &str, device: &str, headers: &[(&str, &str)]) -> Value {
    let path = format!("/v1/tables/{table}/devices/{device}/readings?from={T0}&to={}", T0 + 3_600_000);
    let (status, body) = get(hg, &path, headers);
    assert_eq!(status, 200, "{body}");
    body["readings"].clone()
}

/// Sends `request` (head only) on a new connection and reads the answer to its end.
fn head_only(hg: &Hourglass, request: &str) -> String {
    let mut conn = std::net::TcpStream::connect(hg.http).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the server closes, or the JSON body is complete.
    while !answer.ends_with(b"}") {
        match std::io::Read::read(&mut conn, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8(answer).unwrap()
}

/// Posts `times` chunks of `chunk` to `/write?precision=ms` with `Transfer-Encoding: chunked`
/// (no Content-Length) and returns the answer's head and body. Stops sending when the server
/// has answered and closed.
fn chunked(hg: &Hourglass, chunk: &str, times: usize) -> String {
    let mut conn = std::net::TcpStream::connect(hg.http).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head =
        "POST /write?precision=ms HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    conn.write_all(head.as_bytes()).unwrap();
    let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
    for _ in 0..times {
        if conn.write_all(framed.as_bytes()).is_err() {
            break;
        }
    }
    let _ = conn.write_all(b"0\r\n\r\n");
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut conn, &mut answer);
    String::from_utf8(answer).unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// With `mqtt.enabled = false` the pipeline runs no broker and no MQTT consumer: it listens on
/// its HTTP port alone, is ready without MQTT, and stores what the write API is sent.
#[test]
fn with_mqtt_off_only_http_listens_and_writes_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_MQTT__ENABLED", "false")]);
    assert_eq!(hg.mqtt_port, 0, "the ready line says mqtt=off");
    assert_eq!(util::listening_ports(hg.child.id()), [hg.http.port()]);
    let (status, ready) = get(&hg, "/ready", &[]);
    assert_eq!(status, 200, "{ready}");
    let (status, body) = post(&hg, "/write?precision=ms", &[], format!("plant.m,name=d1 v=1.5 {T0}").as_bytes());
    assert_eq!((status, body.as_str()), (204, ""));
    assert_eq!(readings(&hg, "plant.m", "d1", &[]), json!([{"ts": T0, "v": 1.5}]));
    // Lines without a timestamp take the receive time; a device's requests received in one
    // millisecond each take their own, not replacing each other (300 such requests, back to
    // back, were once stored as 45 readings).
    let from = model::now_ms() - 60_000;
    for i in 0..300 {
        let (status, body) = post(&hg, "/write", &[], format!("plant.n,name=u1 v={i}").as_bytes());
        assert_eq!((status, body.as_str()), (204, ""), "request {i}");
    }
    let path = format!("/v1/tables/plant.n/devices/u1/readings?from={from}&to={}", model::now_ms() + 60_000);
    let (status, body) = get(&hg, &path, &[]);
    assert_eq!(status, 200, "{body}");
    let values: Vec<i64> =
        body["readings"].as_array().unwrap().iter().map(|r| r["v"].as_f64().unwrap() as i64).collect();
    assert_eq!(values, (0..300).collect::<Vec<i64>>());
    let metrics = ureq::get(&format!("http://{}/metrics", hg.http)).call().unwrap().into_string().unwrap();
    assert!(!metrics.contains("source=\"mqtt\""), "{metrics}");
    let logs = hg.terminate();
    assert!(logs.iter().any(|l| l.contains("MQTT is off (mqtt.enabled = false): no broker, no consumer")), "{logs:?}");
}

#[test]
fn line_protocol_over_http_is_readable_as_soon_as_it_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);

    // InfluxDB's ping, which client libraries call before writing: 204, for GET and HEAD.
    for method in ["GET", "HEAD"] {
        let r = ureq::request(method, &format!("http://{}/ping", hg.http)).call().unwrap();
        let version = r.header("x-influxdb-version").map(str::to_string);
        assert_eq!(
            (r.status(), version, r.into_string().unwrap()),
            (204, Some("hourglass-0.1.0".into()), String::new())
        );
    }

    // Two tables, milliseconds; the answer comes after the commit, so no waiting before reads.
    let body = format!(
        "readings,name=truck_1,fleet=East velocity=3.5,heading=120i {t0}\n\
         readings,name=truck_1,fleet=East velocity=4.25,heading=121i {t1}\n\
         diagnostics,name=truck_1,fleet=East load=1500i,status=\"ok\" {t0}\n\
         readings,name=truck_2,fleet=West velocity=0.5 {t0}\n",
        t0 = T0,
        t1 = T0 + 60_000
    );
    assert_eq!(post(&hg, "/write?db=iot&precision=ms", &[], body.as_bytes()), (204, String::new()));
    assert_eq!(
        readings(&hg, "readings", "truck_1", &[]),
        json!([{"ts": T0, "velocity": 3.5, "heading": 120}, {"ts": T0 + 60_000, "velocity": 4.25, "heading": 121}])
    );
    assert_eq!(readings(&hg, "diagnostics", "truck_1", &[]), json!([{"ts": T0, "load": 1500, "status": "ok"}]));
    assert_eq!(readings(&hg, "readings", "truck_2", &[]), json!([{"ts": T0, "velocity": 0.5}]));
    // The other tags became the device's tags.
    let (_, record) = get(&hg, "/v1/tables/readings/devices/truck_2", &[]);
    assert_eq!(record["tags"], json!({"fleet": "West"}));

    // InfluxDB 2's path, seconds, a gzip body.
    let v2 = format!("readings,name=truck_2 velocity=0.75 {}\n", T0 / 1000 + 120);
    let (status, text) =
        post(&hg, "/api/v2/write?org=o&bucket=b&precision=s", &[("Content-Encoding", "gzip")], &gzip(v2.as_bytes()));
    assert_eq!((status, text.as_str()), (204, ""));
    assert_eq!(
        readings(&hg, "readings", "truck_2", &[]),
        json!([{"ts": T0, "velocity": 0.5}, {"ts": T0 + 120_000, "velocity": 0.75}])
    );
    // InfluxDB 1's minutes and hours.
    let v1 = format!("readings,name=truck_2 velocity=1 {}\n", T0 / 60_000 + 3);
    assert_eq!(post(&hg, "/write?precision=m", &[], v1.as_bytes()), (204, String::new()));
    let v1 = format!("readings,name=truck_9 velocity=2 {}\n", T0 / 3_600_000);
    assert_eq!(post(&hg, "/write?precision=h", &[], v1.as_bytes()), (204, String::new()));
    assert_eq!(
        readings(&hg, "readings", "truck_2", &[]),
        json!([{"ts": T0, "velocity": 0.5}, {"ts": T0 + 120_000, "velocity": 0.75}, {"ts": T0 + 180_000, "velocity": 1.0}])
    );
    assert_eq!(readings(&hg, "readings", "truck_9", &[]), json!([{"ts": T0, "velocity": 2.0}]));

    // A bad line: the good ones are stored, the bad one is a dead letter, the answer says so.
    let partial = format!(
        "readings,name=truck_3 velocity=1 {t}\nreadings,name=truck_3 velocity=oops {t}\n",
        t = (T0 + 180_000) * 1_000_000
    );
    let (status, text) = post(&hg, "/write", &[], partial.as_bytes());
    assert_eq!(status, 400, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    let error = error["error"].as_str().unwrap();
    assert!(
        error.starts_with("partial write: 1 line(s) rejected or stored in part and kept as dead letters (GET /v1/dead-letters), 1 line(s) stored; first rejected line: line 2: "),
        "{error}"
    );
    assert_eq!(readings(&hg, "readings", "truck_3", &[]), json!([{"ts": T0 + 180_000, "velocity": 1.0}]));
    let (_, letters) = get(&hg, "/v1/dead-letters", &[]);
    let letters = letters["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["source"], "http");
    assert_eq!(letters[0]["reason"], "invalid_line_protocol");

    // A line that is not UTF-8: that line alone.
    let mut partial =
        format!("readings,name=truck_6 velocity=1 {}\nreadings,name=truck_6 s=\"", (T0 + 180_000) * 1_000_000);
    partial.push_str(&format!(
        "\u{fffd}\" {}\nreadings,name=truck_6 velocity=3 {}\n",
        T0 * 1_000_000,
        (T0 + 240_000) * 1_000_000
    ));
    let mut body = partial.into_bytes();
    let at = body.iter().position(|&b| b == 0xef).unwrap();
    body.splice(at..at + 3, [0xff]);
    let (status, text) = post(&hg, "/write", &[], &body);
    assert_eq!(status, 400, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        error["error"],
        format!(
            "partial write: 1 line(s) rejected or stored in part and kept as dead letters (GET /v1/dead-letters), 2 line(s) stored; \
             first rejected line: line 2: not UTF-8 (invalid byte at offset {at} of the payload)"
        )
    );
    assert_eq!(
        readings(&hg, "readings", "truck_6", &[]),
        json!([{"ts": T0 + 180_000, "velocity": 1.0}, {"ts": T0 + 240_000, "velocity": 3.0}])
    );

    // Refusals, each storing nothing.
    let line = format!("readings,name=truck_4 velocity=9 {T0}\n");
    let (status, text) = post(&hg, "/write?precision=d", &[], line.as_bytes());
    assert_eq!(
        (status, text.as_str()),
        (
            400,
            r#"{"error":"precision `d` is not supported: one of ns (the default), us, ms, s, or InfluxDB 1's n, u, m, h"}"#
        )
    );
    let (status, text) = post(&hg, "/write?precision=ms", &[("Content-Encoding", "br")], line.as_bytes());
    assert_eq!(
        (status, text.as_str()),
        (415, r#"{"error":"Content-Encoding `br` is not supported: gzip or identity"}"#)
    );
    let (status, text) = post(&hg, "/write?precision=ms", &[("Content-Encoding", "gzip")], line.as_bytes());
    assert_eq!(status, 400, "{text}");
    // Refused on its Content-Length, before a byte of it is read (so none is sent here).
    let answer = head_only(&hg, "POST /write?precision=ms HTTP/1.1\r\nHost: x\r\nContent-Length: 25000001\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(
        answer.ends_with(r#"{"error":"the write body is larger than 25000000 bytes; send smaller batches"}"#),
        "{answer}"
    );
    let huge = line.repeat(25_000_000 / line.len() + 1);
    let (status, text) = post(&hg, "/write?precision=ms", &[("Content-Encoding", "gzip")], &gzip(huge.as_bytes()));
    assert_eq!(
        (status, text.as_str()),
        (413, r#"{"error":"the decompressed write body is larger than 25000000 bytes; send smaller batches"}"#)
    );
    // Without a Content-Length, counted as it comes: a chunked body past the limit.
    let answer = chunked(&hg, &line.repeat(1_048_576 / line.len() + 1), 24);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(
        answer.ends_with(r#"{"error":"the write body is larger than 25000000 bytes; send smaller batches"}"#),
        "{answer}"
    );
    // A malformed chunked body is a 400 saying so (it was a 413, "larger than": QA60 F1).
    let answer = head_only(
        &hg,
        "POST /write?precision=ms HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains(r#"{"error":"the write body could not be read whole ("#), "{answer}");
    assert!(answer.ends_with(r#"): cut short, or a malformed chunked encoding"}"#), "{answer}");
    let (status, body) = get(&hg, "/v1/tables/readings/devices/truck_4", &[]);
    assert_eq!(status, 404, "{body}");
    // A chunked body within it is stored.
    let answer = chunked(&hg, &format!("readings,name=truck_5 velocity=5 {T0}\n"), 2);
    assert!(answer.starts_with("HTTP/1.1 204 "), "{answer}");
    assert_eq!(readings(&hg, "readings", "truck_5", &[]), json!([{"ts": T0, "velocity": 5.0}]));

    // The intake's counters: the seven bodies decoded (the refused ones never were); the chunked
    // one holds its line twice, one reading stored.
    let (_, stats) = get(&hg, "/v1/stats", &[]);
    let http = stats["sources"].as_array().unwrap().iter().find(|s| s["source"] == "http").unwrap().clone();
    assert_eq!((&http["messages"], &http["readings"], &http["dead_letters"]), (&json!(7), &json!(12), &json!(2)));
    // No broker, so none of a broker's counters.
    let keys: Vec<&String> = http.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["bytes", "dead_letters", "messages", "readings", "source"]);
    // A line stored without an unsigned field too large to keep: a dead letter all the same.
    let line = format!("readings,name=truck_7 velocity=2,odometer=18446744073709551615u {T0}\n");
    let (status, text) = post(&hg, "/write?precision=ms", &[], line.as_bytes());
    assert_eq!(
        (status, serde_json::from_str::<Value>(&text).unwrap()["error"].clone()),
        (
            400,
            json!(
                "partial write: 1 line(s) rejected or stored in part and kept as dead letters (GET /v1/dead-letters), \
                 1 line(s) stored; first rejected line: line 1: unsigned field(s) `odometer` not stored: above 2^63 - 1, the \
                 largest integer stored; its other fields are stored"
            )
        )
    );
    assert_eq!(readings(&hg, "readings", "truck_7", &[]), json!([{"ts": T0, "velocity": 2.0}]));
    hg.terminate();
}

/// A token issued by the admin (`admin`: its `Authorization` value) with `grants` (the body of
/// `POST /v1/tokens`).
fn issue(hg: &Hourglass, admin: &str, grants: &str) -> String {
    let headers = [("Authorization", admin), ("Content-Type", "application/json")];
    let (status, issued) = post(hg, "/v1/tokens", &headers, grants.as_bytes());
    assert_eq!(status, 201, "{issued}");
    let issued: Value = serde_json::from_str(&issued).unwrap();
    issued["token"].as_str().unwrap().to_string()
}

/// Hourglass in `dir` with auth on, with the admin's `Authorization` value and that of a token
/// issued with `grants` (InfluxDB's `Token` scheme).
fn with_auth(dir: &std::path::Path, grants: &str) -> (Hourglass, String, String) {
    let env = [("HOURGLASS_AUTH__ENABLED", "true"), ("HOURGLASS_AUTH__ADMIN_TOKEN", ADMIN)];
    let hg = Hourglass::start_with_env(dir, None, &env);
    let admin = format!("Bearer {ADMIN}");
    let token = format!("Token {}", issue(&hg, &admin, grants));
    (hg, admin, token)
}

#[test]
fn a_write_needs_write_permission_on_every_table_of_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let (hg, admin, token) = with_auth(dir.path(), r#"{"label": "telegraf", "tables": {"readings": "write"}}"#);

    let ok = format!("readings,name=truck_1 velocity=1 {T0}\n");
    let both = format!("readings,name=truck_1 velocity=2 {t}\ndiagnostics,name=truck_1 load=3i {t}\n", t = T0 + 60_000);
    let (status, text) = post(&hg, "/write?precision=ms", &[], ok.as_bytes());
    assert_eq!(
        (status, text.as_str()),
        (
            401,
            r#"{"error":"missing `Authorization: Bearer <token>` header (or `Token <token>`, or `Basic` with the token as the password; `/write` also takes it as `p=`)"}"#
        )
    );
    let (status, _) = post(&hg, "/write?precision=ms", &[("Authorization", "Token hg_unknown")], ok.as_bytes());
    assert_eq!(status, 401);
    // InfluxDB clients' `Token` scheme.
    assert_eq!(post(&hg, "/api/v2/write?precision=ms", &[("Authorization", &token)], ok.as_bytes()).0, 204);
    // InfluxDB 1's user and password (the token): `Basic`, or `u` and `p`, which a header
    // overrides.
    let secret = token.strip_prefix("Token ").unwrap();
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("telegraf:{secret}")));
    let minute = |m: i64| format!("readings,name=truck_7 velocity={m} {}\n", T0 + m * 60_000);
    assert_eq!(post(&hg, "/write?precision=ms", &[("Authorization", &basic)], minute(0).as_bytes()).0, 204);
    let with_p = format!("/write?precision=ms&db=telegraf&u=telegraf&p={secret}");
    assert_eq!(post(&hg, &with_p, &[], minute(1).as_bytes()).0, 204);
    assert_eq!(post(&hg, "/write?precision=ms&u=telegraf&p=hg_unknown", &[], minute(2).as_bytes()).0, 401);
    let (status, text) =
        post(&hg, "/write?precision=ms&p=hg_unknown", &[("Authorization", &basic)], minute(3).as_bytes());
    assert_eq!(status, 204, "{text}");
    assert_eq!(
        readings(&hg, "readings", "truck_7", &[("Authorization", &admin)]),
        json!([{"ts": T0, "velocity": 0.0}, {"ts": T0 + 60_000, "velocity": 1.0}, {"ts": T0 + 180_000, "velocity": 3.0}])
    );
    // One table of the body it may not write: nothing of the body is stored, nor counted as
    // taken in by the `http` source.
    let http_source = || {
        let (_, stats) = get(&hg, "/v1/stats", &[("Authorization", &admin)]);
        let http = stats["sources"].as_array().unwrap().iter().find(|s| s["source"] == "http").unwrap().clone();
        ["messages", "bytes", "readings", "dead_letters"].map(|k| http[k].as_u64().unwrap())
    };
    let before = http_source();
    let (status, text) = post(&hg, "/write?precision=ms", &[("Authorization", &token)], both.as_bytes());
    assert_eq!(
        (status, text.as_str()),
        (403, r#"{"error":"this token lacks write permission on table `diagnostics`"}"#)
    );
    assert_eq!(http_source(), before);
    assert_eq!(
        readings(&hg, "readings", "truck_1", &[("Authorization", &admin)]),
        json!([{"ts": T0, "velocity": 1.0}])
    );
    let (status, _) = get(&hg, "/v1/tables/diagnostics/devices/truck_1", &[("Authorization", &admin)]);
    assert_eq!(status, 404);
    // A token that may write no table is refused before its body is read: not even its bad
    // lines are kept.
    let reader = format!("Bearer {}", issue(&hg, &admin, r#"{"label": "dashboard", "tables": {"readings": "read"}}"#));
    let bad = format!("readings,name=truck_1 velocity=oops {T0}\nnowhere,name=x v=1 99999999999999999\n");
    let (status, text) = post(&hg, "/write?precision=ms", &[("Authorization", &reader)], bad.as_bytes());
    assert_eq!((status, text.as_str()), (403, r#"{"error":"this token lacks write permission on any table"}"#));
    let (_, letters) = get(&hg, "/v1/dead-letters", &[("Authorization", &admin)]);
    assert_eq!(letters["dead_letters"], json!([]));
    // The admin token writes anywhere.
    assert_eq!(post(&hg, "/write?precision=ms", &[("Authorization", &admin)], both.as_bytes()).0, 204);
    assert_eq!(
        readings(&hg, "diagnostics", "truck_1", &[("Authorization", &admin)]),
        json!([{"ts": T0 + 60_000, "load": 3}])
    );
    hg.terminate();
}

/// Lines the store refuses by its table's schema (a value of another type) are dead letters
/// too, and the answer says so: 204 only when every line was stored. Before, the answer knew
/// only the decoder's dead letters and said 204.
#[test]
fn a_line_the_tables_schema_refuses_is_not_answered_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let (status, text) = post(
        &hg,
        "/v1/tables",
        &[("Content-Type", "application/json")],
        br#"{"name": "typed", "fields": {"v": "f64"}}"#,
    );
    assert_eq!(status, 201, "{text}");
    let write = |body: String| post(&hg, "/write?precision=ms", &[], body.as_bytes());
    assert_eq!(write(format!("typed,name=d1 v=1.5 {T0}\n")), (204, String::new()));
    let error = |(status, text): (u16, String)| -> String {
        assert_eq!(status, 400, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()["error"].as_str().unwrap().to_string()
    };
    let refused = error(write(format!("typed,name=d1 v=2i {}\n", T0 + 1000)));
    let detail = format!("table `typed` device `d1` ts {}: field `v` is f64 in schema version 1, got i64 2", T0 + 1000);
    assert!(
        refused.starts_with(&format!(
            "nothing stored: 1 refusal(s) of values by their table's schema and kept as dead letters (GET \
             /v1/dead-letters), 0 line(s) stored; first refusal: {detail}"
        )),
        "{refused}"
    );
    let partial = error(write(format!("typed,name=d1 v=2.5 {}\ntyped,name=d1 v=\"x\" {}\n", T0 + 2000, T0 + 3000)));
    assert!(
        partial.starts_with(
            "partial write: 1 refusal(s) of values by their table's schema and kept as dead letters (GET \
             /v1/dead-letters), 1 line(s) stored; first refusal: table `typed` device `d1`"
        ),
        "{partial}"
    );
    assert_eq!(readings(&hg, "typed", "d1", &[]), json!([{"ts": T0, "v": 1.5}, {"ts": T0 + 2000, "v": 2.5}]));
    let (_, letters) = get(&hg, "/v1/dead-letters", &[]);
    let reasons: Vec<(&str, &str)> = letters["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["reason"].as_str().unwrap(), l["source"].as_str().unwrap()))
        .collect();
    assert_eq!(reasons, [("wrong_field_type", "http"), ("wrong_field_type", "http")]);
    // The http source counts them, and the metrics by source agree.
    let (_, stats) = get(&hg, "/v1/stats", &[]);
    let http = stats["sources"].as_array().unwrap().iter().find(|s| s["source"] == "http").unwrap().clone();
    assert_eq!(http["dead_letters"], json!(2), "{http}");
    let metrics = ureq::get(&format!("http://{}/metrics", hg.http)).call().unwrap().into_string().unwrap();
    assert!(metrics.contains("hourglass_ingest_dead_letters_total{source=\"http\"} 2\n"), "{metrics}");
    hg.terminate();
}

/// A table takes at most 10,000 fields: a line that brings more has the first ones added and
/// the rest refused in one dead letter, and the answer says so. Unbounded, one device naming
/// fields by a serial number grew a table past 65,535 fields, whose hour roll-up records could
/// not be written: every roll-up pass of the store failed from then on (QA pass 6).
#[test]
fn a_table_takes_at_most_ten_thousand_fields() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let fields: Vec<String> = (0..10_003).map(|i| format!("f{i:05}={i}")).collect();
    let line = format!("wide,name=d1 {} {T0}\n", fields.join(","));
    let (status, text) = post(&hg, "/write?precision=ms", &[], line.as_bytes());
    assert_eq!(status, 400, "{text}");
    let error = serde_json::from_str::<Value>(&text).unwrap()["error"].as_str().unwrap().to_string();
    let detail = format!(
        "table `wide` device `d1` ts {T0}: schema version 1 has no field `f10000` (got f64 10000) nor 2 other \
         field(s) of the reading and 10000 fields, the most a table takes (a device naming fields by a serial number \
         or a time?); the reading's other fields are stored"
    );
    assert!(
        error.starts_with(&format!(
            "partial write: 1 refusal(s) of values by their table's schema and kept as dead letters (GET \
             /v1/dead-letters), 1 line(s) stored; first refusal: {detail}"
        )),
        "{error}"
    );
    let (_, table) = get(&hg, "/v1/tables/wide", &[]);
    assert_eq!(table["fields"].as_array().map(Vec::len), Some(10_000));
    let stored = readings(&hg, "wide", "d1", &[]);
    let row = stored[0].as_object().unwrap();
    assert_eq!((row.len(), &row["f09999"], row.get("f10000")), (10_001, &json!(9999.0), None));
    // The fields it has still take values; a new one is refused alone.
    let next = format!("wide,name=d1 f00007=7.5,brand_new=1 {}\n", T0 + 1000);
    assert_eq!(post(&hg, "/write?precision=ms", &[], next.as_bytes()).0, 400);
    let (_, letters) = get(&hg, "/v1/dead-letters", &[]);
    let details: Vec<&str> =
        letters["dead_letters"].as_array().unwrap().iter().map(|l| l["detail"].as_str().unwrap()).collect();
    assert_eq!(details.len(), 2, "{details:?}");
    assert!(details.iter().any(|d| d.contains("no field `brand_new` (got f64 1) and 10000 fields")), "{details:?}");
    // Nor are more declared.
    let declared: Vec<String> = (0..10_001).map(|i| format!("\"g{i}\": \"f64\"")).collect();
    let body = format!("{{\"name\": \"declared\", \"fields\": {{{}}}}}", declared.join(", "));
    let (status, text) = post(&hg, "/v1/tables", &[("Content-Type", "application/json")], body.as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("10001 fields; a table takes at most 10000"), "{text}");
    hg.terminate();
}

/// With the write buffer on, the readings of tables and devices the store holds are prepared
/// for it as their lines are decoded; a new device's line and the lines after it go to the
/// writer as readings. Either way what is read back is what was written, the later of two
/// readings at one time kept.
#[test]
fn line_protocol_prepared_as_it_is_decoded_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_with_env(dir.path(), None, &[("HOURGLASS_STORAGE__WRITE_BUFFER_MB", "64")]);
    let (t1, t2) = (T0 + 60_000, T0 + 120_000);
    let first = format!(
        "readings,name=truck_1 velocity=1.5,heading=10i {T0}\n\
         diagnostics,name=truck_1 load=5i {T0}\n\
         readings,name=truck_2 velocity=2.5,heading=20i {T0}\n"
    );
    assert_eq!(post(&hg, "/write?precision=ms", &[], first.as_bytes()), (204, String::new()));
    let second = format!(
        "readings,name=truck_1 velocity=3.5,heading=11i {t1}\n\
         readings,name=truck_2 velocity=4.5,heading=21i {t1}\n\
         readings,name=truck_1 velocity=5.5,heading=12i {t1}\n\
         diagnostics,name=truck_1 load=6i {t1}\n\
         readings,name=truck_9 velocity=9.5,heading=90i {t1}\n\
         readings,name=truck_1 velocity=6.5,heading=13i {t2}\n\
         readings,name=truck_1 velocity=7.5,heading=14i {t2}\n"
    );
    assert_eq!(post(&hg, "/write?precision=ms", &[], second.as_bytes()), (204, String::new()));
    assert_eq!(
        readings(&hg, "readings", "truck_1", &[]),
        json!([
            {"ts": T0, "velocity": 1.5, "heading": 10},
            {"ts": t1, "velocity": 5.5, "heading": 12},
            {"ts": t2, "velocity": 7.5, "heading": 14}
        ])
    );
    assert_eq!(
        readings(&hg, "readings", "truck_2", &[]),
        json!([{"ts": T0, "velocity": 2.5, "heading": 20}, {"ts": t1, "velocity": 4.5, "heading": 21}])
    );
    assert_eq!(readings(&hg, "readings", "truck_9", &[]), json!([{"ts": t1, "velocity": 9.5, "heading": 90}]));
    assert_eq!(readings(&hg, "diagnostics", "truck_1", &[]), json!([{"ts": T0, "load": 5}, {"ts": t1, "load": 6}]));
    let (_, stats) = get(&hg, "/v1/stats", &[]);
    let http = stats["sources"].as_array().unwrap().iter().find(|s| s["source"] == "http").unwrap().clone();
    assert_eq!((&http["messages"], &http["readings"], &http["dead_letters"]), (&json!(2), &json!(10), &json!(0)));
    hg.terminate();
}

/// A device's record is one for every table it has data in: tags a token reports over `/write`
/// are taken only when it may write each of them, as `PUT …/devices/{device}` asks (QA46 F12: a
/// token with write on one table rewrote the tags a device of another table showed). Its
/// readings are stored; a device only in tables it may write takes its tags; the same tags
/// from the admin afterwards are taken (the refused report is not remembered as made).
#[test]
fn tags_are_taken_only_from_a_token_that_may_write_every_table_of_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let (hg, admin, token) = with_auth(dir.path(), r#"{"label": "acme", "tables": {"acme.temp": "write"}}"#);
    let write = |auth: &str, body: String| {
        assert_eq!(post(&hg, "/write?precision=ms", &[("Authorization", auth)], body.as_bytes()), (204, String::new()));
    };
    write(&admin, format!("acme.temp,name=shared,site=a t=1 {T0}\nother.t,name=shared v=1 {T0}\n"));
    let tags = |device: &str| {
        let (status, record) =
            get(&hg, &format!("/v1/tables/acme.temp/devices/{device}"), &[("Authorization", &admin)]);
        assert_eq!(status, 200, "{record}");
        record["tags"].clone()
    };
    assert_eq!(tags("shared"), json!({"site": "a"}));
    for i in 1..=2 {
        write(
            &token,
            format!(
                "acme.temp,name=shared,site=zzz t={i} {t}\nacme.temp,name=own,site=b t={i} {t}\n",
                t = T0 + i * 1000
            ),
        );
        assert_eq!((tags("shared"), tags("own")), (json!({"site": "a"}), json!({"site": "b"})), "write {i}");
    }
    assert_eq!(
        readings(&hg, "acme.temp", "shared", &[("Authorization", &admin)]),
        json!([{"ts": T0, "t": 1.0}, {"ts": T0 + 1000, "t": 1.0}, {"ts": T0 + 2000, "t": 2.0}])
    );
    write(&admin, format!("acme.temp,name=shared,site=zzz t=3 {}\n", T0 + 3000));
    assert_eq!(tags("shared"), json!({"site": "zzz"}));
    hg.terminate();
}

/// Tags changed back over HTTP after another source (line protocol over MQTT) changed them are
/// stored: every memory of reported tags reads the store's tag changes. (Before: x over HTTP,
/// y over MQTT, x over HTTP left y, HTTP's memory having noted x.)
#[test]
fn tags_another_source_changed_are_reported_again_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let line = |site: &str, i: i64| format!("fleet,name=truck_1,site={site} v={i} {}\n", T0 + i * 1000);
    let write = |site: &str, i: i64| {
        assert_eq!(post(&hg, "/write?precision=ms", &[], line(site, i).as_bytes()), (204, String::new()));
    };
    let site = || {
        let (status, record) = get(&hg, "/v1/tables/fleet/devices/truck_1", &[]);
        assert_eq!(status, 200, "{record}");
        record["tags"]["site"].as_str().unwrap_or_default().to_string()
    };
    // Both of HTTP's memories (requests one after another take them in turn) note x.
    write("x", 0);
    write("x", 1);
    assert_eq!(site(), "x");
    // MQTT's line protocol is read at `lineproto.precision`, nanoseconds by default.
    let ns = format!("fleet,name=truck_1,site=y v=2 {}\n", (T0 + 2000) * 1_000_000);
    let msg = ("hourglass/lp".to_string(), ns.into_bytes());
    assert_eq!(util::publish_qos1(hg.mqtt_port, "tags-test", &[msg], Duration::from_secs(30), |_| {}), 1);
    let changed = util::wait_for(Duration::from_secs(30), || (site() == "y").then_some(()));
    assert!(changed.is_some(), "the MQTT line's tags stored: {}", site());
    write("x", 3);
    assert_eq!(site(), "x");
    write("x", 4);
    assert_eq!(site(), "x");
    // Tags replaced through the API: the next report of a tag is merged in again, by both
    // memories.
    let (status, record) = hg.put("/v1/tables/fleet/devices/truck_1", r#"{"tags": {"manual": "w"}}"#);
    assert_eq!((status, &record["tags"]), (200, &json!({"manual": "w"})));
    for i in [5, 6] {
        write("x", i);
        let (_, record) = get(&hg, "/v1/tables/fleet/devices/truck_1", &[]);
        assert_eq!(record["tags"], json!({"manual": "w", "site": "x"}), "write {i}");
        let (status, _) = hg.put("/v1/tables/fleet/devices/truck_1", r#"{"tags": {"manual": "w"}}"#);
        assert_eq!(status, 200);
    }
    assert_eq!(readings(&hg, "fleet", "truck_1", &[]).as_array().unwrap().len(), 7);
    hg.terminate();
}

/// Telegraf's InfluxDB output sends `CREATE DATABASE` before writing (again before each write
/// until it succeeds): answered as done, as a form body or in the query string, for a token
/// that may write; other InfluxQL is refused with what to do instead.
#[test]
fn create_database_is_answered_as_done_and_other_influxql_refused() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("HOURGLASS_AUTH__ENABLED", "true"), ("HOURGLASS_AUTH__ADMIN_TOKEN", ADMIN)];
    let hg = Hourglass::start_with_env(dir.path(), None, &env);
    let admin = format!("Bearer {ADMIN}");
    let secret = issue(&hg, &admin, r#"{"label": "telegraf", "tables": {"readings": "write"}}"#);
    let reader = format!("Bearer {}", issue(&hg, &admin, r#"{"label": "dash", "tables": {"readings": "read"}}"#));
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("telegraf:{secret}")));
    let form = [("Authorization", basic.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
    let done = (200, r#"{"results":[{"statement_id":0}]}"#.to_string());
    // Telegraf's request: the statement in a form body.
    assert_eq!(post(&hg, "/query", &form, b"q=CREATE+DATABASE+%22telegraf%22"), done);
    assert_eq!(post(&hg, &format!("/query?q=create%20database%20iot&u=telegraf&p={secret}"), &[], b""), done);
    let (status, text) = post(&hg, "/query", &form, b"q=SHOW+DATABASES");
    assert_eq!(
        (status, text.as_str()),
        (
            400,
            r#"{"error":"only CREATE DATABASE is answered here (as done: a line's measurement names its table); InfluxQL is not read, reads are under /v1 (GET /openapi.json): got `SHOW DATABASES`"}"#
        )
    );
    assert_eq!(post(&hg, "/query", &form, b"db=telegraf").0, 400);
    assert_eq!(post(&hg, "/query?q=CREATE%20DATABASE%20x", &[], b"").0, 401);
    assert_eq!(post(&hg, "/query?q=CREATE%20DATABASE%20x", &[("Authorization", &reader)], b"").0, 403);
    hg.terminate();
}
