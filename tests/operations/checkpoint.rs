//! `POST /v1/checkpoints`: a copy of a running store, taken between two writes, opened by
//! `hourglass serve` as a data directory of its own holds exactly the readings acknowledged
//! before it (the write buffer on: its records too), while the store goes on.

use serde_json::json;

use crate::compact::{assert_minutes, line, post_lines, WBUF};
use crate::util::Hourglass;

const DEVICES: i64 = 5;

/// The lines of every device for minutes `minutes`.
fn lines(minutes: std::ops::Range<i64>) -> String {
    minutes.flat_map(|m| (0..DEVICES).map(move |d| line(d, m))).collect()
}

/// Each device's readings of the hour after T0 are its lines of minutes `0..minutes`.
fn assert_readings(hg: &Hourglass, minutes: i64) {
    for d in 0..DEVICES {
        assert_minutes(hg, d, minutes);
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
