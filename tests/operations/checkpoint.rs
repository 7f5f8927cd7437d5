//! `POST /v1/checkpoints`: a copy of a running store, taken between two writes, opened by
//! `hourglass serve` as a data directory of its own holds exactly the readings acknowledged
//! before it (the write buffer's too), while the store goes on.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::Hourglass;

/// 2024-01-01T00:00:00Z, ms.
const T0: i64 = 1_704_067_200_000;
const DEVICES: i64 = 5;
/// The write buffer on: the readings before the checkpoint wait in its records, not in buckets.
const WBUF: (&str, &str) = ("HOURGLASS_STORAGE__WRITE_BUFFER_MB", "64");

/// The lines of every device for minutes `minutes`.
fn lines(minutes: std::ops::Range<i64>) -> String {
    minutes
        .flat_map(|m| {
            (0..DEVICES)
                .map(move |d| format!("trucks,name=t{d} speed={}.5,fuel={m}i {}\n", d * 100 + m, T0 + m * 60_000))
        })
        .collect()
}

fn post_lines(hg: &Hourglass, body: &str) {
    let url = format!("http://{}/write?precision=ms", hg.http);
    let answer = ureq::post(&url).timeout(Duration::from_secs(30)).send_string(body).unwrap();
    assert_eq!(answer.status(), 204);
}

/// Each device's readings of the hour after T0 equal minutes `0..minutes` as written.
fn assert_readings(hg: &Hourglass, minutes: i64) {
    for d in 0..DEVICES {
        let (status, body) =
            hg.get(&format!("/v1/tables/trucks/devices/t{d}/readings?from={T0}&to={}", T0 + 3_600_000));
        assert_eq!(status, 200, "{body}");
        let expected: Vec<Value> = (0..minutes)
            .map(|m| json!({"ts": T0 + m * 60_000, "fuel": m, "speed": (d * 100 + m) as f64 + 0.5}))
            .collect();
        assert_eq!(body["readings"], Value::Array(expected), "device t{d}");
    }
}

#[test]
fn a_checkpoint_opens_as_the_store_was_when_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    post_lines(&hg, &lines(0..10));
    let (status, taken) = hg.post("/v1/checkpoints", "");
    assert_eq!(status, 201, "{taken}");
    let path = std::path::PathBuf::from(taken["path"].as_str().unwrap());
    assert_eq!(path.parent(), Some(dir.path().join("checkpoints").as_path()), "{taken}");
    assert_eq!((taken["archive_files"].clone(), taken["archive_in_bucket"].clone()), (json!(0), json!(false)));
    // Named by its UTC time: 2026-12-03T14-40-00.123Z.
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(name.len() == 24 && name.ends_with('Z') && !name.contains(':'), "{name}");
    // The store goes on.
    post_lines(&hg, &lines(10..20));
    assert_readings(&hg, 20);

    // The checkpoint, served on its own beside the store: the first ten minutes only.
    let copy = Hourglass::start_with_env(&path, None, &[WBUF]);
    assert_readings(&copy, 10);
    copy.terminate();
    hg.terminate();
    // And the store, served again, all twenty.
    let hg = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    assert_readings(&hg, 20);
    hg.terminate();
}
