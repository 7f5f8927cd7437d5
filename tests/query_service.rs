//! The query service's contract end to end: paged raw reads and their limits, the CSV and
//! Arrow formats, bearer tokens on the API and MQTT logins on the embedded broker, and the
//! OpenAPI document. Real `hourglass serve`, real RocksDB in temp dirs, real HTTP and MQTT.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::io::Cursor;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, TimestampMillisecondType, UInt64Type};
use arrow_array::{Array, RecordBatch};
use serde_json::{json, Map, Value};
use util::{publish_qos1_as, wait_for, Hourglass};

const TABLE: &str = "q.test";
/// 2024-01-01T00:00:00Z.
const T0: i64 = 1_704_067_200_000;
const DAY: i64 = 86_400_000;
/// Readings of `d1`: one device-day at 10 s.
const N: i64 = 8_640;

/// An HTTP answer: status, `Content-Type`, `x-next-cursor`, body.
struct Answer {
    status: u16,
    content_type: String,
    next_cursor: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }

    /// The one record batch of an Arrow IPC stream answer.
    fn arrow(&self) -> RecordBatch {
        assert_eq!(self.status, 200, "{}", String::from_utf8_lossy(&self.body));
        let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(self.body.clone()), None).unwrap();
        let mut batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        assert_eq!(batches.len(), 1);
        batches.pop().unwrap()
    }
}

fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    let mut req = ureq::request(method, url).timeout(Duration::from_secs(30));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let res = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    let r = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let status = r.status();
    let content_type = r.header("content-type").unwrap_or_default().to_string();
    let next_cursor = r.header("x-next-cursor").map(str::to_string);
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut body).unwrap();
    Answer { status, content_type, next_cursor, body }
}

fn get(hg: &Hourglass, path: &str, headers: &[(&str, &str)]) -> Answer {
    request("GET", &format!("http://{}{path}", hg.http), headers, None)
}

fn reading(ts: i64, fields: &[(&str, f64)]) -> Value {
    let mut m = Map::new();
    m.insert("ts".into(), json!(ts));
    for (k, v) in fields {
        m.insert((*k).into(), json!(v));
    }
    Value::Object(m)
}

/// `d1`'s reading `i`: `temp` always, `rpm` on every third.
fn d1(i: i64) -> Value {
    let temp = i as f64 * 0.25 - 100.0;
    if i % 3 == 0 {
        reading(T0 + i * 10_000, &[("temp", temp), ("rpm", i as f64 + 0.5)])
    } else {
        reading(T0 + i * 10_000, &[("temp", temp)])
    }
}

/// Messages of 100 readings each on `{prefix}/{table}/{device}`.
fn messages(table: &str, device: &str, readings: &[Value]) -> Vec<(String, Vec<u8>)> {
    readings
        .chunks(100)
        .map(|c| (format!("hourglass/{table}/{device}"), serde_json::to_vec(&Value::Array(c.to_vec())).unwrap()))
        .collect()
}

fn publish(hg: &Hourglass, login: Option<(&str, &str)>, msgs: &[(String, Vec<u8>)]) -> usize {
    publish_qos1_as(hg.mqtt_port, "query-test-publisher", login, msgs, Duration::from_secs(60), |_| {})
}

/// Waits until the store has committed `n` readings since the start.
fn wait_stored(hg: &Hourglass, headers: &[(&str, &str)], n: u64) {
    let ok = wait_for(Duration::from_secs(60), || {
        let a = get(hg, "/v1/stats", headers);
        (a.status == 200 && a.json()["store"]["readings"].as_u64() == Some(n)).then_some(())
    });
    assert!(ok.is_some(), "{n} readings stored");
}

#[test]
fn raw_reads_page_by_cursor_within_the_configured_limits_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(
        dir.path(),
        &[
            ("HOURGLASS_QUERY__MAX_PAGE_ROWS", "1000"),
            ("HOURGLASS_QUERY__MAX_RANGE_MS", "172800000"),
            ("HOURGLASS_QUERY__MAX_DEVICES_PER_REQUEST", "3"),
            ("HOURGLASS_ROLLUP__INTERVAL_MS", "50"),
            ("HOURGLASS_ROLLUP__ALLOWED_LATENESS_MS", "60000"),
        ],
    );
    let day: Vec<Value> = (0..N).map(d1).collect();
    let mut msgs = messages(TABLE, "d1", &day);
    // d2's reading two hours into the next day moves the watermark past d1's whole day.
    msgs.extend(messages(TABLE, "d2", &[reading(T0 + DAY + 7_200_000, &[("temp", 1.5)])]));
    msgs.extend(messages(TABLE, "d3", &[reading(T0, &[("temp", 3.0)])]));
    assert_eq!(publish(&hg, None, &msgs), msgs.len());
    wait_stored(&hg, &[], N as u64 + 2);

    // Pages of the default size (query.max_page_rows = 1000), followed by cursor.
    let base = format!("/v1/tables/{TABLE}/devices/d1/readings?from={T0}&to={}", T0 + DAY);
    let (mut all, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let path = match &cursor {
            Some(c) => format!("{base}&cursor={c}"),
            None => base.clone(),
        };
        let a = get(&hg, &path, &[]);
        assert_eq!((a.status, a.content_type.as_str()), (200, "application/json"));
        let body = a.json();
        let rows = body["readings"].as_array().unwrap().clone();
        pages += 1;
        assert_eq!(rows.len(), if pages <= 8 { 1000 } else { 640 }, "page {pages}");
        all.extend(rows);
        assert_eq!(body["next_cursor"].as_str().map(str::to_string), a.next_cursor);
        match a.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(pages, 9);
    assert_eq!(all, day, "every reading once, in order, exactly");
    let first = get(&hg, &base, &[]).json();
    assert_eq!(first["table"], TABLE);
    assert_eq!(first["device"], "d1");
    assert_eq!(first["next_cursor"], json!(format!("r1.{}", T0 + 1000 * 10_000)));
    // The day relative to now, a minute's margin each side (one "now" for both ends): the same
    // first page, the same cursor.
    let seconds_ago = |ms: i64| (model::now_ms() - ms) / 1000;
    let relative = format!(
        "/v1/tables/{TABLE}/devices/d1/readings?from=now-{}s&to=now-{}s",
        seconds_ago(T0) + 60,
        seconds_ago(T0 + DAY) - 60
    );
    assert_eq!(get(&hg, &relative, &[]).json(), first);
    assert_eq!(
        get(&hg, &format!("/v1/tables/{TABLE}/devices/d1/readings?from=now-15x&to=now"), &[]).json(),
        json!({"error": "parameter `from`: \"now-15x\" is not `now` nor `now` less or plus a duration such as now-15m \
                         (a whole number of ms, s, m, h, d or w)"})
    );
    // A smaller page from a cursor.
    let a = get(&hg, &format!("{base}&limit=7&cursor=r1.{}", T0 + 20 * 10_000), &[]);
    assert_eq!(a.json()["readings"], Value::Array(day[20..27].to_vec()));
    assert_eq!(a.next_cursor, Some(format!("r1.{}", T0 + 27 * 10_000)));

    // Limits, each named.
    let bad = |path: &str| {
        let a = get(&hg, path, &[]);
        (a.status, a.json()["error"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(
        bad(&format!("{base}&limit=1001")),
        (
            400,
            "parameter `limit`: 1001 readings per page is above the limit of 1000 (query.max_page_rows); follow \
             `next_cursor` for more"
                .into()
        )
    );
    assert_eq!(
        bad(&format!("/v1/tables/{TABLE}/devices/d1/readings?from={T0}&to={}", T0 + 3 * DAY)),
        (400, "range of 259200000 ms is longer than the limit of 172800000 ms (2d, query.max_range_ms)".into())
    );
    assert_eq!(
        bad(&format!("/v1/tables/{TABLE}/latest?devices=d1,d2,d3,d4")),
        (400, "4 devices requested; at most 3 per request (query.max_devices_per_request)".into())
    );
    let cursor_error = "parameter `cursor`: \"r1.5\" is not a cursor of this range; pass back `next_cursor` with the \
                        same `from` and `to`";
    assert_eq!(bad(&format!("{base}&cursor=r1.5")), (400, cursor_error.into()));
    assert_eq!(bad(&format!("{base}&cursor=zzz")).0, 400);
    assert_eq!(
        bad(&format!("{base}&format=xml")),
        (400, "parameter `format`: \"xml\" is not one of \"json\", \"csv\", \"arrow\"".into())
    );
    // A parameter the route does not take is refused, naming those it takes: a misspelt
    // `field=` would otherwise answer every field without a word.
    assert_eq!(
        bad(&format!("{base}&fields=rpm")),
        (400, "unknown parameter `fields`: this route takes `from`, `to`, `cursor`, `limit`, `format`".into())
    );
    assert_eq!(
        bad(&format!("/v1/tables/{TABLE}/latest?device=d1")),
        (400, "unknown parameter `device`: this route takes `devices` or `format`".into())
    );
    assert_eq!(
        bad(&format!("/v1/tables/{TABLE}/rollups?device=d1&from={T0}&to={}&agg=count", T0 + DAY)),
        (
            400,
            "unknown parameter `agg`: this route takes `format`, `device`, `devices`, `group`, `level`, `from`, \
             `to`, `fields`, `aggs`, `group_level`"
                .into()
        )
    );

    // CSV, by parameter and by Accept.
    let five = format!("{base}&limit=5");
    let by_param = get(&hg, &format!("{five}&format=csv"), &[]);
    let by_accept = get(&hg, &five, &[("Accept", "text/csv")]);
    assert_eq!((by_param.status, by_param.content_type.as_str()), (200, "text/csv; charset=utf-8"));
    assert_eq!(by_param.body, by_accept.body);
    assert_eq!(by_param.next_cursor, Some(format!("r1.{}", T0 + 50_000)));
    let mut csv = csv::Reader::from_reader(by_param.body.as_slice());
    assert_eq!(csv.headers().unwrap(), vec!["ts", "rpm", "temp"]);
    let rows: Vec<Vec<String>> =
        csv.records().map(|r| r.unwrap().iter().map(str::to_string).collect()).collect::<Vec<_>>();
    let expected: Vec<Vec<String>> = (0..5)
        .map(|i| {
            let rpm = if i % 3 == 0 { (i as f64 + 0.5).to_string() } else { String::new() };
            vec![(T0 + i * 10_000).to_string(), rpm, (i as f64 * 0.25 - 100.0).to_string()]
        })
        .collect();
    assert_eq!(rows, expected);
    assert_eq!(by_param.text().lines().nth(1), Some("1704067200000,0.5,-100"));
    // Every page has the table's columns, a page without `rpm` and an empty one too.
    let no_rpm = get(&hg, &format!("{base}&limit=2&cursor=r1.{}&format=csv", T0 + 10_000), &[]);
    assert_eq!(no_rpm.text(), format!("ts,rpm,temp\n{},,-99.75\n{},,-99.5\n", T0 + 10_000, T0 + 20_000));
    let empty = format!("/v1/tables/{TABLE}/devices/d1/readings?from={}&to={}", T0 - DAY, T0 - 1);
    assert_eq!(get(&hg, &format!("{empty}&format=csv"), &[]).text(), "ts,rpm,temp\n");
    let names = |b: arrow_array::RecordBatch| b.schema().fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
    assert_eq!(names(get(&hg, &format!("{empty}&format=arrow"), &[]).arrow()), ["ts", "rpm", "temp"]);

    // Arrow IPC stream, by Accept and by parameter.
    let a = get(&hg, &format!("{base}&limit=1000"), &[("Accept", "application/vnd.apache.arrow.stream")]);
    assert_eq!((a.status, a.content_type.as_str()), (200, "application/vnd.apache.arrow.stream"));
    assert_eq!(a.next_cursor, Some(format!("r1.{}", T0 + 10_000_000)));
    let batch = a.arrow();
    assert_eq!(batch.num_rows(), 1000);
    let names: Vec<String> = batch.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["ts", "rpm", "temp"]);
    assert_eq!(batch.schema().field(0).data_type(), &arrow_schema_ts(), "timestamps are milliseconds in UTC");
    let ts = batch.column(0).as_primitive::<TimestampMillisecondType>();
    let rpm = batch.column(1).as_primitive::<Float64Type>();
    let temp = batch.column(2).as_primitive::<Float64Type>();
    for i in 0..1000usize {
        let n = i as i64;
        assert_eq!(ts.value(i), T0 + n * 10_000);
        assert_eq!(temp.value(i), n as f64 * 0.25 - 100.0);
        assert_eq!(rpm.is_valid(i), n % 3 == 0, "row {i}");
        if n % 3 == 0 {
            assert_eq!(rpm.value(i), n as f64 + 0.5);
        }
    }
    assert_eq!(get(&hg, &format!("{base}&limit=1000&format=arrow"), &[]).body, a.body);

    // Latest values of three devices, one unknown, in every format.
    let latest = format!("/v1/tables/{TABLE}/latest?devices=d1,nobody,d2");
    let j = get(&hg, &latest, &[]).json();
    assert_eq!(
        j,
        json!({"table": TABLE, "latest": [
            {"device": "d1", "reading": d1(N - 1)},
            {"device": "nobody", "reading": null},
            {"device": "d2", "reading": {"ts": T0 + DAY + 7_200_000, "temp": 1.5}},
        ]})
    );
    let c = get(&hg, &format!("{latest}&format=csv"), &[]);
    assert_eq!(
        c.text(),
        format!("device,ts,rpm,temp\nd1,{},,2059.75\nnobody,,,\nd2,{},,1.5\n", T0 + DAY - 10_000, T0 + DAY + 7_200_000)
    );
    let batch = get(&hg, &latest, &[("Accept", "application/vnd.apache.arrow.stream")]).arrow();
    let devices: Vec<&str> = batch.column(0).as_string::<i32>().iter().map(Option::unwrap).collect();
    assert_eq!(devices, ["d1", "nobody", "d2"]);
    let ts = batch.column(1).as_primitive::<TimestampMillisecondType>();
    assert_eq!(ts.iter().collect::<Vec<_>>(), [Some(T0 + DAY - 10_000), None, Some(T0 + DAY + 7_200_000)]);
    let rpm = batch.column(2).as_primitive::<Float64Type>();
    assert_eq!((batch.schema().field(2).name().as_str(), rpm.null_count()), ("rpm", 3));
    let temp = batch.column(3).as_primitive::<Float64Type>();
    assert_eq!(temp.iter().collect::<Vec<_>>(), [Some(2059.75), None, Some(1.5)]);
    // Nullable by column: the device never, a latest value's time and the fields always.
    let nullable: Vec<bool> = batch.schema().fields().iter().map(|f| f.is_nullable()).collect();
    assert_eq!(nullable, [false, true, true, true]);
    // The same by POST, the devices in a JSON body.
    let post = |query: &str, body: &str| {
        request("POST", &format!("http://{}/v1/tables/{TABLE}/latest{query}", hg.http), &[], Some(body))
    };
    let three = r#"{"devices": ["d1", "nobody", "d2"]}"#;
    let p = post("", three);
    assert_eq!((p.status, p.json()), (200, j.clone()));
    assert_eq!(post("?format=csv", three).text(), c.text());
    for (body, error) in [
        (r#"{"devices": "d1"}"#, r#"the body must be {"devices": ["name", ...]}"#.to_string()),
        (r#"{"devices": ["d1"], "x": 1}"#, r#"the body must be {"devices": ["name", ...]}"#.into()),
        (r#"{"devices": []}"#, "`devices` names no device".into()),
        (r#"{"devices": ["d1", 7]}"#, "`devices`: 7 is not a device name".into()),
        (
            r#"{"devices": ["d1", "bad name"]}"#,
            "`devices`: \"bad name\" is not a device name (1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, \
             starting with a letter or digit)"
                .into(),
        ),
        ("d1,d2", "the body is not JSON: expected value at line 1 column 1".into()),
    ] {
        let p = post("", body);
        assert_eq!((p.status, p.json()), (400, json!({ "error": error })), "{body}");
    }
    // A list too long for a URL (hyper refuses one over 64 KiB, with an empty 414) reaches the
    // handler by POST, which applies the device limit.
    let many: Vec<String> = (0..7000).map(|i| format!("a_device_named_rather_long_{i:05}")).collect();
    let long = get(&hg, &format!("/v1/tables/{TABLE}/latest?devices={}", many.join(",")), &[]);
    assert_eq!((long.status, long.body.len()), (414, 0));
    let p = post("", &json!({ "devices": many }).to_string());
    assert_eq!(
        (p.status, p.json()),
        (400, json!({"error": "7000 devices requested; at most 3 per request (query.max_devices_per_request)"}))
    );

    // The day's roll-up of d1, once rolled up, in every format.
    let rollup = format!(
        "/v1/tables/{TABLE}/rollups?device=d1&level=day&from={T0}&to={}&aggs=count,min,max,sum,first,last",
        T0 + DAY
    );
    let j = wait_for(Duration::from_secs(60), || {
        let j = get(&hg, &rollup, &[]).json();
        (j["rows"][0]["temp"]["count"] == json!(N)).then_some(j)
    })
    .expect("the day is rolled up");
    let temp = json!({"count": 8640, "sum": 8_466_120.0, "min": -100.0, "max": 2059.75,
        "first": {"ts": T0, "value": -100.0}, "last": {"ts": T0 + DAY - 10_000, "value": 2059.75}});
    let rpm = json!({"count": 2880, "sum": 12_438_720.0, "min": 0.5, "max": 8637.5,
        "first": {"ts": T0, "value": 0.5}, "last": {"ts": T0 + 8637 * 10_000, "value": 8637.5}});
    assert_eq!(j["rows"], json!([{"period": T0, "temp": temp, "rpm": rpm}]));
    let c = get(&hg, &format!("{rollup}&format=csv"), &[]);
    assert_eq!(
        c.text(),
        format!(
            "period,rpm.count,rpm.sum,rpm.min,rpm.max,rpm.first_ts,rpm.first,rpm.last_ts,rpm.last,temp.count,temp.sum,\
             temp.min,temp.max,temp.first_ts,temp.first,temp.last_ts,temp.last\n\
             {T0},2880,12438720,0.5,8637.5,{T0},0.5,{},8637.5,8640,8466120,-100,2059.75,{T0},-100,{},2059.75\n",
            T0 + 8637 * 10_000,
            T0 + DAY - 10_000
        )
    );
    let batch = get(&hg, &format!("{rollup}&format=arrow"), &[]).arrow();
    assert_eq!(batch.num_rows(), 1);
    let col = |name: &str| batch.column_by_name(name).unwrap_or_else(|| panic!("column {name}")).clone();
    assert_eq!(col("period").as_primitive::<TimestampMillisecondType>().value(0), T0);
    assert_eq!(col("temp.count").as_primitive::<UInt64Type>().value(0), 8640);
    assert_eq!(col("temp.sum").as_primitive::<Float64Type>().value(0), 8_466_120.0);
    assert_eq!(col("rpm.last_ts").as_primitive::<TimestampMillisecondType>().value(0), T0 + 8637 * 10_000);
    assert_eq!(col("rpm.max").as_primitive::<Float64Type>().value(0), 8637.5);
}

fn arrow_schema_ts() -> arrow_schema::DataType {
    arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Millisecond, Some("UTC".into()))
}

#[test]
fn pages_end_before_the_response_size_limit_and_larger_answers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(
        dir.path(),
        &[
            ("HOURGLASS_QUERY__MAX_RESPONSE_BYTES", "1024"),
            ("HOURGLASS_ROLLUP__INTERVAL_MS", "50"),
            ("HOURGLASS_ROLLUP__ALLOWED_LATENESS_MS", "60000"),
        ],
    );
    // 60 readings three minutes apart (three hours), and one four hours in.
    let mut readings: Vec<Value> =
        (0..60).map(|i| reading(T0 + i * 180_000, &[("temp", i as f64), ("rpm", 0.5 * i as f64)])).collect();
    readings.push(reading(T0 + 4 * 3_600_000, &[("temp", 7.0)]));
    let msgs = messages(TABLE, "s1", &readings);
    assert_eq!(publish(&hg, None, &msgs), msgs.len());
    wait_stored(&hg, &[], 61);
    // Every page of `device` within the limit: its readings and the number of pages.
    let read_all = |device: &str| {
        let base = format!("/v1/tables/{TABLE}/devices/{device}/readings?from={T0}&to={}", T0 + DAY);
        let (mut all, mut pages, mut cursor) = (Vec::new(), 0, String::new());
        loop {
            let a = get(&hg, &format!("{base}{cursor}"), &[]);
            assert_eq!(a.status, 200);
            assert!(a.body.len() <= 1024, "page of {} bytes", a.body.len());
            let rows = a.json()["readings"].as_array().unwrap().clone();
            assert!(!rows.is_empty());
            all.extend(rows);
            pages += 1;
            match a.next_cursor {
                Some(c) => cursor = format!("&cursor={c}"),
                None => return (all, pages),
            }
        }
    };
    let (all, pages) = read_all("s1");
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(all, readings);
    // A string counts its length and its escapes: four readings of a 300-byte note, two a page
    // (before, the 24 bytes a value counted put all four in one page of 1.4 KB).
    let notes: Vec<Value> =
        (0..4).map(|i| json!({"ts": T0 + i * 1000, "note": format!("\"{}", "n".repeat(299))})).collect();
    assert_eq!(publish(&hg, None, &messages(TABLE, "s2", &notes)), 1);
    wait_stored(&hg, &[], 65);
    assert_eq!(read_all("s2"), (notes, 2));
    // Three hourly rows with every aggregate are above 1024 bytes: refused, the limit named.
    let rollups = format!("/v1/tables/{TABLE}/rollups?device=s1&from={T0}&to={}", T0 + 3 * 3_600_000);
    let rolled = wait_for(Duration::from_secs(60), || {
        let j = get(&hg, &format!("{rollups}&aggs=count&fields=rpm"), &[]).json();
        (j["rows"].as_array().map(Vec::len) == Some(3)).then_some(())
    });
    assert!(rolled.is_some(), "three hours rolled up");
    // Fields that are not rolled up: named.
    let refused = |fields: &str| {
        let a = get(&hg, &format!("{rollups}&fields=rpm,{fields}"), &[]);
        (a.status, a.json())
    };
    let no_such = json!({"error": "parameter `fields`: the table has no field `nosuch`"});
    assert_eq!(refused("nosuch"), (400, no_such));
    let string =
        json!({"error": "parameter `fields`: `note` is a string field; only f64 and i64 fields are rolled up"});
    assert_eq!(refused("note"), (400, string));
    let a = get(&hg, &rollups, &[]);
    assert_eq!(a.status, 400);
    let message = a.json()["error"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("the answer would be ")
            && message.ends_with(
                "bytes, above the limit of 1024 (query.max_response_bytes); ask for a shorter range, fewer fields or \
                 fewer aggregates"
            ),
        "{message}"
    );
    // CSV and Arrow have a column for every field of the table: a device whose 40 readings
    // hold one new field each still reads in pages within the limit (counted as JSON, a CSV
    // page of 17 such rows was 1.9 KB, an Arrow one 8 KB). A page holds one row at least.
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let sprawl: Vec<Value> = names.iter().enumerate().map(|(i, n)| reading(T0 + i as i64, &[(n, 0.5)])).collect();
    assert_eq!(publish(&hg, None, &messages(TABLE, "s3", &sprawl)), 1);
    wait_stored(&hg, &[], 105);
    for format in ["csv", "arrow"] {
        let base = format!("/v1/tables/{TABLE}/devices/s3/readings?from={T0}&to={}&format={format}", T0 + DAY);
        let (mut rows, mut pages, mut cursor) = (0, 0, String::new());
        while pages < 100 {
            let a = get(&hg, &format!("{base}{cursor}"), &[]);
            let n = if format == "csv" { a.text().lines().count() - 1 } else { a.arrow().num_rows() };
            assert!(a.body.len() <= 1024 || n == 1, "{format}: a page of {n} rows in {} bytes", a.body.len());
            (rows, pages) = (rows + n, pages + 1);
            match a.next_cursor {
                Some(c) => cursor = format!("&cursor={c}"),
                None => break,
            }
        }
        assert_eq!(rows, 40, "{format}: every reading, once, in {pages} pages");
    }
    // `latest` in CSV and Arrow has a cell of every field in each row too: a list of devices
    // whose answer would pass twice the limit is refused before the answer is built (a device
    // without data is a row too); one device is answered in CSV.
    let fields = get(&hg, &format!("/v1/tables/{TABLE}"), &[]).json()["fields"].as_array().unwrap().len();
    let many: Vec<String> = (0..60).map(|i| format!("x{i}")).collect();
    for (format, name) in [("csv", "CSV"), ("arrow", "Arrow")] {
        let a = get(&hg, &format!("/v1/tables/{TABLE}/latest?devices=s3,{}&format={format}", many.join(",")), &[]);
        assert_eq!(
            (a.status, a.json()["error"].as_str().unwrap()),
            (
                400,
                format!(
                    "the answer would be over 2048 bytes, above the limit of 1024 (query.max_response_bytes; counted \
                     before it was built: a {name} row has a cell of each of the table's {fields} fields); ask for \
                     fewer devices, or for JSON"
                )
                .as_str()
            )
        );
    }
    let a = get(&hg, &format!("/v1/tables/{TABLE}/latest?devices=s3&format=csv"), &[]);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text().lines().count(), 2, "{}", a.text());
    // Roll-up answers are counted as their rows are read, and the read stops once they pass
    // the limit (a year of hours of 300 devices, read whole, took the server's 24 GB). 30
    // hours of one reading each, of which the first 28 are rolled up once the watermark (a
    // minute behind the last reading) has passed them.
    let hourly: Vec<Value> = (0..30).map(|h| reading(T0 + h * 3_600_000 + 1000, &[("temp", h as f64)])).collect();
    assert_eq!(publish(&hg, None, &messages(TABLE, "s4", &hourly)), 1);
    let last =
        format!("/v1/tables/{TABLE}/rollups?device=s4&from={}&to={}&aggs=count", T0 + 27 * 3_600_000, T0 + 2 * DAY);
    let rolled = wait_for(Duration::from_secs(60), || {
        get(&hg, &last, &[]).json()["rows"].as_array().is_some_and(|r| !r.is_empty()).then_some(())
    });
    assert!(rolled.is_some(), "hour 27 rolled up");
    let over = |query: &str, row: usize, devices: bool| {
        let a = get(&hg, &format!("/v1/tables/{TABLE}/rollups?from={T0}&to={}&{query}", T0 + 2 * DAY), &[]);
        let fewer = if devices { "fewer devices, " } else { "" };
        let expected = format!(
            "the answer would be above the limit of 1024 bytes (query.max_response_bytes; counted as its rows were \
             read, it passed the limit at row {row}); ask for {fewer}a shorter range, fewer fields or fewer aggregates"
        );
        assert_eq!((a.status, a.json()["error"].as_str().unwrap_or_default()), (400, expected.as_str()), "{query}");
    };
    // JSON counts a row at least `{"period":1704067200000,"temp":{"count":1}}`, 43 bytes:
    // 24 rows pass 1024 (the whole answer, 28 rows, is 1.3 KB).
    over("device=s4&fields=temp&aggs=count", 24, false);
    // The table's rows add `,"devices":3` (12 bytes) and, in hours 0 to 2, s1's 20 readings
    // (a count of 21): 3 · 56 + 16 · 55 = 1048 at row 19.
    over("fields=temp&aggs=count", 19, false);
    // CSV counts a row's cells at their shortest and their commas: the period and its line
    // end (14), `count` (2), four numbers (2 each), `first` and `last` with their times (16
    // each) and five quantiles (2 each): 66 bytes, over 1024 at row 16. Arrow counts 8 bytes
    // a slot (16 for `first` and `last`): 120 bytes, over at row 9.
    over("device=s4&fields=temp&format=csv", 16, false);
    over("devices=s4&fields=temp&format=arrow", 9, true);
    // Within the limit, the same rows are answered: 10 hours.
    let a = get(
        &hg,
        &format!("/v1/tables/{TABLE}/rollups?device=s4&fields=temp&aggs=count&from={T0}&to={}", T0 + 36_000_000),
        &[],
    );
    let counts: Vec<u64> =
        a.json()["rows"].as_array().unwrap().iter().map(|r| r["temp"]["count"].as_u64().unwrap()).collect();
    assert_eq!(counts, vec![1; 10]);
}

/// Logs in to the embedded broker; whether the broker accepted the connection.
fn mqtt_login(port: u16, user: &str, pass: &str) -> bool {
    mqtt_login_as(port, "login-probe", user, pass)
}

/// [`mqtt_login`] under `client_id`.
fn mqtt_login_as(port: u16, client_id: &str, user: &str, pass: &str) -> bool {
    let mut o = rumqttc::MqttOptions::new(client_id, "127.0.0.1", port);
    o.set_credentials(user, pass);
    let (_client, mut conn) = rumqttc::Client::new(o, 4);
    for _ in 0..20 {
        match conn.recv_timeout(Duration::from_millis(500)) {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack)))) => {
                return ack.code == rumqttc::ConnectReturnCode::Success
            }
            Ok(Ok(_)) | Err(rumqttc::RecvTimeoutError::Timeout) => {}
            Ok(Err(_)) | Err(rumqttc::RecvTimeoutError::Disconnected) => return false,
        }
    }
    false
}

const ADMIN: &str = "admin-secret-0123456789";

#[test]
fn tokens_grant_per_table_on_the_api_and_the_broker_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("HOURGLASS_AUTH__ENABLED", "true"), ("HOURGLASS_AUTH__ADMIN_TOKEN", ADMIN)];
    let hg = Hourglass::start_logged_with_env(dir.path(), &env);
    let admin = format!("Bearer {ADMIN}");
    let auth = |t: &str| format!("Bearer {t}");

    // Open without a token: health, readiness, metrics, the document, the dashboard.
    for path in ["/health", "/ready", "/metrics", "/openapi.json", "/", "/dashboard.js", "/dashboard.css"] {
        assert_eq!(get(&hg, path, &[]).status, 200, "{path}");
    }
    // 401 without a usable token.
    let a = get(&hg, "/v1/tables", &[]);
    assert_eq!(
        (a.status, a.json()),
        (
            401,
            json!({"error": "missing `Authorization: Bearer <token>` header (or `Token <token>`, or `Basic` with the token as the password; `/write` also takes it as `p=`)"})
        )
    );
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", "Basic YTpi")]).status, 401);
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", "Bearer nope")]).json(), json!({"error": "unknown token"}));

    // Issuing tokens: admin only; the token is returned once.
    let issue = |who: Option<&str>, body: &str| {
        let headers: Vec<(&str, &str)> = who.map(|w| vec![("Authorization", w)]).unwrap_or_default();
        let a = request("POST", &format!("http://{}/v1/tokens", hg.http), &headers, Some(body));
        (a.status, a.json())
    };
    let before = now_ms();
    let (status, writer) = issue(Some(&admin), r#"{"label": "sensors", "tables": {"q.a": "write"}}"#);
    assert_eq!(status, 201);
    let w = writer["token"].as_str().unwrap().to_string();
    assert!(w.starts_with("hg_") && w.len() == 67);
    let issued = writer["issued_ms"].as_i64().unwrap();
    assert!((before..=now_ms()).contains(&issued), "{writer}");
    assert_eq!(
        writer,
        json!({"token": w, "id": token_id(&w), "label": "sensors", "admin": false, "tables": {"q.a": "write"},
            "issued_ms": issued})
    );
    let r = issue(Some(&admin), r#"{"tables": {"q.a": "read"}}"#).1["token"].as_str().unwrap().to_string();
    let rb = issue(Some(&admin), r#"{"tables": {"q.b": "read,write"}}"#).1["token"].as_str().unwrap().to_string();
    assert_eq!(issue(None, r#"{"admin": true}"#).0, 401);
    assert_eq!(
        issue(Some(&auth(&r)), r#"{"admin": true}"#),
        (403, json!({"error": "this token lacks admin rights (this request needs an admin token)"}))
    );
    assert_eq!(
        issue(Some(&admin), r#"{"tables": {"q.a": "all"}}"#),
        (
            400,
            json!({"error": "`tables`: the permission of `q.a` must be \"read\", \"write\" or \"read,write\", not \"all\""})
        )
    );
    assert_eq!(
        issue(Some(&admin), r#"{"label": "x"}"#),
        (400, json!({"error": "a token must be an admin (`\"admin\": true`) or name tables in `tables`"}))
    );

    // Checkpoints: admin only, to take, list and delete.
    let checkpoint = |method: &str, path: &str, who: Option<&str>| {
        let headers: Vec<(&str, &str)> = who.map(|w| vec![("Authorization", w)]).unwrap_or_default();
        let a = request(method, &format!("http://{}/v1/checkpoints{path}", hg.http), &headers, Some(""));
        (a.status, a.json())
    };
    let lacks = (403, json!({"error": "this token lacks admin rights (this request needs an admin token)"}));
    assert_eq!(checkpoint("POST", "", None).0, 401);
    assert_eq!(checkpoint("POST", "", Some(&auth(&r))), lacks);
    let (status, taken) = checkpoint("POST", "", Some(&admin));
    assert_eq!(status, 201, "{taken}");
    assert!(std::path::Path::new(taken["path"].as_str().unwrap()).join("rocksdb/CURRENT").is_file(), "{taken}");
    let one = format!("/{}", taken["name"].as_str().unwrap());
    for (method, path) in [("GET", ""), ("DELETE", one.as_str())] {
        assert_eq!(checkpoint(method, path, None).0, 401, "{method}");
        assert_eq!(checkpoint(method, path, Some(&auth(&r))), lacks, "{method}");
    }
    // A method the route does not take: 405, in JSON.
    let allowed = json!({"error": "method not allowed on this route (GET /openapi.json lists each route's)"});
    assert_eq!(checkpoint("DELETE", "", Some(&admin)), (405, allowed));
    let (status, listed) = checkpoint("GET", "", Some(&admin));
    assert_eq!((status, listed["checkpoints"][0]["path"].clone()), (200, taken["path"].clone()), "{listed}");
    assert_eq!(checkpoint("DELETE", &one, Some(&admin)).1["path"], taken["path"]);

    // MQTT: username = table, password = a token with write permission on it.
    assert!(!mqtt_login(hg.mqtt_port, "q.a", &r), "a read token cannot publish");
    assert!(!mqtt_login(hg.mqtt_port, "q.a", "hg_unknown"), "an unknown token cannot publish");
    assert!(!mqtt_login(hg.mqtt_port, "q.b", &w), "the write token is for q.a only");
    // A token given as the username is refused and not logged (below); a username that is no
    // table's name is said to be one.
    assert!(!mqtt_login(hg.mqtt_port, &w, "q.a"));
    assert!(!mqtt_login(hg.mqtt_port, ADMIN, "q.a"));
    assert!(!mqtt_login(hg.mqtt_port, "not a table!", ADMIN));
    // Nor under the client id of Hourglass's own consumer (it would throw the consumer off),
    // made at each start: the configured one is free.
    let starting = hg.wait_for_log(Duration::from_secs(10), |l| l["fields"]["message"] == "MQTT consumer starting");
    let consumer = starting.unwrap()["fields"]["client_id"].as_str().unwrap().to_string();
    let suffix = consumer.strip_prefix("hourglass-ingest-").unwrap_or_else(|| panic!("{consumer}"));
    assert!(suffix.len() == 16 && suffix.bytes().all(|b| b.is_ascii_hexdigit()), "{consumer}");
    assert!(!mqtt_login_as(hg.mqtt_port, &consumer, "q.a", &w), "the consumer's client id is taken");
    assert!(mqtt_login_as(hg.mqtt_port, "hourglass-ingest", "q.a", &w), "the configured one is not the consumer's");
    let readings: Vec<Value> = (0..5).map(|i| reading(T0 + i * 1000, &[("v", i as f64)])).collect();
    let msgs = messages("q.a", "dev", &readings);
    assert_eq!(publish(&hg, Some(("q.a", &w)), &msgs), msgs.len());
    wait_stored(&hg, &[("Authorization", &admin)], 5);

    // Reads need read permission on the table.
    let path = format!("/v1/tables/q.a/devices/dev/readings?from={T0}&to={}", T0 + 10_000);
    let a = get(&hg, &path, &[("Authorization", &auth(&r))]);
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["readings"], Value::Array(readings.clone()));
    assert_eq!(get(&hg, &path, &[("Authorization", &admin)]).status, 200);
    let a = get(&hg, &path, &[("Authorization", &auth(&w))]);
    assert_eq!((a.status, a.json()), (403, json!({"error": "this token lacks read permission on table `q.a`"})));
    assert_eq!(get(&hg, &path, &[("Authorization", &auth(&rb))]).status, 403);
    assert_eq!(get(&hg, &path, &[]).status, 401);
    let latest = "/v1/tables/q.a/latest?devices=dev";
    assert_eq!(get(&hg, latest, &[("Authorization", &auth(&rb))]).status, 403);
    // The caller is checked before the parameters: no token, 401, and a token without read on
    // the table, 403, whatever the parameters say.
    assert_eq!(get(&hg, "/v1/tables/q.a/latest", &[]).status, 401);
    assert_eq!(get(&hg, &format!("{path}&format=xml"), &[]).status, 401);
    assert_eq!(get(&hg, &format!("{path}&cursor=bad"), &[("Authorization", &auth(&rb))]).status, 403);
    assert_eq!(get(&hg, &format!("{path}&from=2"), &[("Authorization", &auth(&rb))]).status, 403);
    // Then a bad query string or path answers 400 in JSON, as every error does.
    let a = get(&hg, &format!("{path}&from=2"), &[("Authorization", &admin)]);
    assert_eq!(
        (a.status, a.json()),
        (400, json!({"error": "parameter `from` is given more than once: give it once (a list is comma-separated)"}))
    );
    let a =
        get(&hg, &format!("/v1/tables/q.a/devices/%FF/readings?from={T0}&to={}", T0 + 1), &[("Authorization", &admin)]);
    assert_eq!((a.status, a.json()), (400, json!({"error": "Invalid URL: Invalid UTF-8 in `device`"})));
    // A path or a body that cannot be read is answered only to a caller with a valid token.
    let bad_path = format!("/v1/tables/q.a/devices/%FF/readings?from={T0}&to={}", T0 + 1);
    assert_eq!(get(&hg, &bad_path, &[]).status, 401);
    assert_eq!(get(&hg, &bad_path, &[("Authorization", "Bearer hg_unknown")]).status, 401);
    assert_eq!(get(&hg, &bad_path, &[("Authorization", &auth(&rb))]).status, 400);
    let too_big = format!("{{\"kind\": \"{}\"}}", "k".repeat(2 << 20));
    let put_big = |headers: &[(&str, &str)]| {
        request("PUT", &format!("http://{}/v1/tables/q.a/devices/dev", hg.http), headers, Some(&too_big))
    };
    assert_eq!(put_big(&[]).status, 401);
    assert_eq!(put_big(&[("Authorization", &auth(&r))]).status, 403);
    let a = put_big(&[("Authorization", &admin)]);
    assert_eq!(
        (a.status, a.json()),
        (413, json!({"error": "the request body is larger than 2097152 bytes, the most a JSON body may be"}))
    );
    assert_eq!(get(&hg, latest, &[("Authorization", &auth(&r))]).json()["latest"][0]["reading"], readings[4]);
    // Writes through the API need write permission.
    let put = |who: &str| {
        let headers = [("Authorization", who)];
        request("PUT", &format!("http://{}/v1/tables/q.a/devices/dev", hg.http), &headers, Some(r#"{"kind":"k"}"#))
            .status
    };
    assert_eq!(put(&auth(&r)), 403);
    assert_eq!(put(&auth(&w)), 200);
    // A device with no data in the table: only the admin registers it (GET finds it once it has).
    let put_new = |who: &str| {
        let url = format!("http://{}/v1/tables/q.a/devices/new_dev", hg.http);
        let a = request("PUT", &url, &[("Authorization", who)], Some(r#"{"kind":"k"}"#));
        (a.status, a.json())
    };
    let unknown = "unknown device `new_dev` in table `q.a` (only an admin token sets the record of a device before \
                   it has data)";
    assert_eq!(put_new(&auth(&w)), (404, json!({ "error": unknown })));
    assert_eq!(put_new(&admin).1["kind"], "k");
    // Table lists show a token its own tables; admin-only routes refuse others.
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", &auth(&r))]).json(), json!({"tables": ["q.a"]}));
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", &auth(&rb))]).json(), json!({"tables": []}));
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", &admin)]).json(), json!({"tables": ["q.a"]}));
    assert_eq!(get(&hg, "/v1/dead-letters", &[("Authorization", &auth(&r))]).status, 403);
    assert_eq!(get(&hg, "/v1/dead-letters", &[("Authorization", &admin)]).status, 200);
    let create = |who: &str| {
        request("POST", &format!("http://{}/v1/tables", hg.http), &[("Authorization", who)], Some(r#"{"name":"q.c"}"#))
            .status
    };
    assert_eq!(create(&auth(&w)), 403);
    assert_eq!(create(&admin), 201);
    // A device's record is shared by every table it has data in: once `dev` has data in q.b
    // too, neither q.a's writer nor q.b's may set it; the admin may.
    let more = messages("q.b", "dev", &[reading(T0, &[("v", 9.0)])]);
    assert_eq!(publish(&hg, Some(("q.b", &rb)), &more), 1);
    wait_stored(&hg, &[("Authorization", &admin)], 6);
    let put_in = |table: &str, who: &str| {
        let url = format!("http://{}/v1/tables/{table}/devices/dev", hg.http);
        request("PUT", &url, &[("Authorization", who)], Some(r#"{"kind":"k2"}"#))
    };
    let a = put_in("q.a", &auth(&w));
    let shared = "device `dev` also has data in table `q.b`, which this token may not write: its record is shared \
                  by every table it is in";
    assert_eq!((a.status, a.json()), (403, json!({ "error": shared })));
    assert_eq!(put_in("q.b", &auth(&rb)).status, 403);
    assert_eq!(put_in("q.a", &admin).status, 200);

    // Tokens are listed (never shown again) and revoked by id: `rb`'s requests are refused.
    let tokens = |who: &str| get(&hg, "/v1/tokens", &[("Authorization", who)]);
    assert_eq!(tokens(&auth(&r)).status, 403);
    let listed = tokens(&admin).json();
    // Oldest first (`r` and `rb` may share a millisecond: then in id order).
    let listed_tokens = listed["tokens"].as_array().unwrap();
    let mut ids: Vec<String> = listed_tokens.iter().map(|t| t["id"].as_str().unwrap().to_string()).collect();
    let times: Vec<i64> = listed_tokens.iter().map(|t| t["issued_ms"].as_i64().unwrap()).collect();
    assert!(times.windows(2).all(|t| t[0] <= t[1]), "{listed}");
    ids.sort();
    let mut expected = [token_id(&w), token_id(&r), token_id(&rb)];
    expected.sort();
    assert_eq!(ids, expected);
    let mut shown = writer.clone();
    shown.as_object_mut().unwrap().remove("token");
    assert_eq!(listed_tokens.iter().find(|t| t["id"] == shown["id"]), Some(&shown));
    let revoke = |id: &str| {
        let a = request("DELETE", &format!("http://{}/v1/tokens/{id}", hg.http), &[("Authorization", &admin)], None);
        (a.status, a.json())
    };
    let (status, revoked) = revoke(&token_id(&rb));
    assert_eq!(
        (status, &revoked["id"], &revoked["tables"]),
        (200, &json!(token_id(&rb)), &json!({"q.b": "read,write"}))
    );
    let unknown = (401, json!({"error": "unknown token"}));
    assert_eq!(get(&hg, "/v1/tables", &[("Authorization", &auth(&rb))]).json(), unknown.1);
    assert_eq!(revoke(&token_id(&rb)), (404, json!({"error": format!("no token with id {}", token_id(&rb))})));
    assert_eq!(revoke("abc").0, 400);
    // A token pasted for its id is refused without being echoed back.
    let (status, pasted) = revoke(&w);
    assert_eq!(status, 400);
    assert!(!pasted.to_string().contains(&w), "{pasted}");
    assert!(pasted["error"].as_str().unwrap().starts_with("that is a token, not a token id"), "{pasted}");
    assert!(!mqtt_login(hg.mqtt_port, "q.b", &rb), "a revoked token cannot publish");

    // The refusals, each logged with its reason, and the table only when the username is no
    // token; each (reason, table) once a minute: the second for q.a, and the last for q.b, not.
    let logs = hg.terminate();
    assert!(!logs.iter().any(|l| l.contains(&w) || l.contains(ADMIN)), "a token logged");
    let refusals = |logs: &[String]| -> Vec<(String, String)> {
        logs.iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("MQTT client refused")))
            .map(|l| {
                let field = |name: &str| l["fields"][name].as_str().unwrap().to_string();
                (field("table"), field("message"))
            })
            .collect()
    };
    let hidden = "(not shown: it may be a token; the username is the table's name)";
    let no_token = "MQTT client refused: no token with write permission on the table";
    let not_a_table = "MQTT client refused: its username is not a table's name (1 to 64 ASCII letters, digits, `_`, \
                       `-` or `.`): the username names the table, the password is a token with write permission on it";
    let expected = [
        ("q.a", no_token),
        ("q.b", no_token),
        (hidden, not_a_table),
        (hidden, no_token),
        ("not a table!", not_a_table),
        (
            "q.a",
            "MQTT client refused: its client id is Hourglass's own consumer's (mqtt.client_id); a device needs another",
        ),
    ];
    assert_eq!(refusals(&logs), expected.map(|(t, m)| (t.to_string(), m.to_string())));

    // Tokens are stored: they work after a restart (and a revoked one does not).
    let hg = Hourglass::start_logged_with_env(dir.path(), &env);
    let a = get(&hg, &path, &[("Authorization", &auth(&r))]);
    assert_eq!((a.status, a.json()["readings"].clone()), (200, Value::Array(readings)));
    assert!(mqtt_login(hg.mqtt_port, "q.a", &w));
    assert!(mqtt_login(hg.mqtt_port, "q.a", ADMIN), "the admin token may publish anywhere");
    let a = get(&hg, "/v1/tables", &[("Authorization", &auth(&rb))]);
    assert_eq!((a.status, a.json()), unknown);

    // A name no table has, as long as an admin token and without spaces, is not shown either:
    // it may be a token Hourglass does not know, a rotated-out admin token, say (QA49 R9). A
    // table's name is shown, however long.
    let long = "q.a-table-of-long-name";
    let body = format!(r#"{{"name":"{long}"}}"#);
    let created = request("POST", &format!("http://{}/v1/tables", hg.http), &[("Authorization", &admin)], Some(&body));
    assert_eq!(created.status, 201);
    let rotated = "rotated-admin-token-0123456789";
    assert!(!mqtt_login(hg.mqtt_port, long, &r));
    assert!(!mqtt_login(hg.mqtt_port, rotated, &w));
    assert!(!mqtt_login(hg.mqtt_port, "q.short", &w));
    let logs = hg.terminate();
    assert!(!logs.iter().any(|l| l.contains(rotated)), "a rotated-out token logged");
    let hidden = "(not shown: no table has this name of 30 characters, which may be a token; the username is the \
                  table's name)";
    let expected = [(long, no_token), (hidden, no_token), ("q.short", no_token)];
    assert_eq!(refusals(&logs), expected.map(|(t, m)| (t.to_string(), m.to_string())));
}

/// A token's id as the API gives it: its SHA-256, in hex.
fn token_id(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

#[test]
fn the_openapi_document_lists_every_route_of_the_router() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let a = get(&hg, "/openapi.json", &[]);
    assert_eq!((a.status, a.content_type.as_str()), (200, "application/json"));
    let doc = a.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let routes = query::api::routes();
    assert!(routes.len() >= 18);
    let mut served = Vec::new();
    for route in &routes {
        for method in route.methods {
            let op = &paths.get(route.path).unwrap_or_else(|| panic!("{} is not in the document", route.path))
                [method.to_lowercase()];
            assert!(op.is_object(), "{method} {} is not in the document", route.path);
            served.push(format!("{method} {}", route.path));
        }
    }
    // And the document has nothing the router does not serve.
    let mut documented: Vec<String> = paths
        .iter()
        .flat_map(|(path, ops)| ops.as_object().unwrap().keys().map(move |m| format!("{} {path}", m.to_uppercase())))
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served);
    // Secured routes name the bearer scheme; open ones do not.
    assert_eq!(doc["components"]["securitySchemes"]["bearer"], json!({"type": "http", "scheme": "bearer"}));
    assert_eq!(paths["/v1/tables/{table}/devices/{device}/readings"]["get"]["security"], json!([{"bearer": []}]));
    assert!(paths["/health"]["get"].get("security").is_none());
}

/// `GET path` over HTTPS at `addr`, trusting the CA certificates of `ca`: the whole answer, or
/// the client's error (a handshake refused).
fn https_get(addr: std::net::SocketAddr, ca: &std::path::Path, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(addr.ip().to_string()).unwrap();
    let client = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(client, tcp);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).map_err(|e| e.to_string())?;
    Ok(String::from_utf8(answer).unwrap())
}

/// With `http.tls_cert_file` and `http.tls_key_file` the query service speaks HTTPS only: a
/// client that trusts its CA is answered; one that trusts another CA is refused in the
/// handshake, and a plain HTTP request is answered 400 in plain HTTP, told to ask https://,
/// both logged.
#[test]
fn the_query_service_speaks_https_with_its_certificate() {
    let pki = util::TestPki::new();
    let dir = tempfile::tempdir().unwrap();
    let vars = [
        ("HOURGLASS_HTTP__TLS_CERT_FILE", pki.server_cert.to_str().unwrap()),
        ("HOURGLASS_HTTP__TLS_KEY_FILE", pki.server_key.to_str().unwrap()),
    ];
    let hg = Hourglass::start_logged_with_env(dir.path(), &vars);
    assert!(hg.greeting.contains(&format!("http=https://{} ", hg.http)), "{}", hg.greeting);

    let answer = https_get(hg.http, &pki.ca, "/v1/tables").unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n{\"tables\":[]}"), "{answer}");
    let refused = https_get(hg.http, &pki.other_ca, "/health").unwrap_err();
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    match ureq::get(&format!("http://{}/health", hg.http)).call() {
        Err(ureq::Error::Status(400, plain)) => {
            assert_eq!(
                plain.into_string().unwrap(),
                "This is Hourglass's query service over HTTPS: ask https:// instead.\n"
            )
        }
        other => panic!("{other:?}"),
    }

    let logs = hg.terminate();
    let mut failed: Vec<String> = logs
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("a TLS handshake failed")))
        .map(|l| l["fields"]["reason"].as_str().unwrap().to_string())
        .collect();
    // In the order the server read them, which the refused client does not wait for.
    failed.sort();
    assert_eq!(failed, ["a plain HTTP request, answered 400", "received fatal alert: UnknownCA"]);
}

/// A client has `http.read_timeout_ms` for each request header and each part of a body (QA49
/// R7): a connection that sends nothing is closed, a kept-alive one idle after its answer too,
/// and a request whose body stalls is answered 408 and closed. Each read here waits at most
/// 20 s, far past the 300 ms the service is given.
#[test]
fn silent_connections_and_stalled_bodies_are_closed_at_the_read_timeout() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_HTTP__READ_TIMEOUT_MS", "300")]);
    let connect = |sent: &[u8]| {
        let mut tcp = std::net::TcpStream::connect(hg.http).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        tcp.write_all(sent).unwrap();
        tcp
    };
    // What the service sent until it closed the connection (an error if it did not in 20 s).
    let until_closed = |mut tcp: std::net::TcpStream| {
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).map(|_| String::from_utf8(answer).unwrap()).map_err(|e| e.kind())
    };

    assert_eq!(until_closed(connect(b"")), Ok(String::new()));
    assert_eq!(until_closed(connect(b"GET /health HTTP/1.1\r\nHost: x\r\n")), Ok(String::new()));
    let idle = until_closed(connect(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")).unwrap();
    assert!(idle.starts_with("HTTP/1.1 200 OK\r\n"), "{idle}");
    assert!(idle.ends_with("\r\n\r\n{\"status\":\"ok\"}"), "{idle}");

    let stalled = b"POST /write?precision=ms HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nplant.m,name=d1 ";
    let answer = until_closed(connect(stalled)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{answer}");
    assert!(
        answer.ends_with(
            "\r\n\r\n{\"error\":\"the request body stalled: no part of it came within the read timeout \
             (http.read_timeout_ms); send it whole, without pauses\"}"
        ),
        "{answer}"
    );
    // The same for a JSON body, read before its handler runs.
    let stalled = b"POST /v1/tables HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"name\":";
    let answer = until_closed(connect(stalled)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{answer}");
    // Nothing was stored, and the service answers on.
    let tables = get(&hg, "/v1/tables", &[]);
    assert_eq!((tables.status, tables.json()), (200, json!({"tables": []})));
}

/// A stop lets requests in flight finish for `query::server::STOP_GRACE` (5 s), then closes
/// their connections: a client sending its body a byte every 100 ms (each within the 300 ms
/// read timeout) held the stop for as long as it went on (QA60 F3), here up to 10,000 s.
#[test]
fn a_stop_closes_a_request_still_trickling_in_after_its_grace() {
    use std::io::Write;
    assert_eq!(query::server::STOP_GRACE, Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_logged_with_env(dir.path(), &[("HOURGLASS_HTTP__READ_TIMEOUT_MS", "300")]);
    let mut tcp = std::net::TcpStream::connect(hg.http).unwrap();
    tcp.write_all(b"POST /v1/tables HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n").unwrap();
    let trickle = std::thread::spawn(move || {
        for sent in 0..100_000 {
            if tcp.write_all(b" ").is_err() {
                return sent;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        100_000
    });
    std::thread::sleep(Duration::from_secs(1));
    let (exit, logs) = hg.stop(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", logs.join("\n"));
    let sent = trickle.join().unwrap();
    assert!(sent < 100_000, "the trickle went on to its end");
    let closed: Vec<&String> =
        logs.iter().filter(|l| l.contains("still being read or answered 5 s into the stop")).collect();
    assert_eq!(closed.len(), 1, "{}", logs.join("\n"));
    assert!(closed[0].contains("\"connections\":1"), "{}", closed[0]);
}
