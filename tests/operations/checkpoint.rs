//! `POST /v1/checkpoints`: a copy of a running store, taken between two writes, opened by
//! `hourglass serve` as a data directory of its own holds exactly the readings acknowledged
//! before it (the write buffer on: its records too), while the store goes on. `GET` lists it,
//! `DELETE` deletes it.

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
    assert_eq!(hg.get("/v1/checkpoints"), (200, json!({"checkpoints": []})));
    let before = now_ms();
    let (status, taken) = hg.post("/v1/checkpoints", "");
    let after = now_ms();
    assert_eq!(status, 201, "{taken}");
    let path = std::path::PathBuf::from(taken["path"].as_str().unwrap());
    assert_eq!(path.parent(), Some(dir.path().join("checkpoints").as_path()), "{taken}");
    assert_eq!(
        (taken["archive_files"].clone(), taken["archive_in_bucket"].clone(), taken["missing_archive_files"].clone()),
        (json!(0), json!(false), json!([]))
    );
    // Named by its UTC time: 2026-12-03T14-40-00.123Z.
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(name.len() == 24 && name.ends_with('Z') && !name.contains(':'), "{name}");
    assert_eq!(taken["name"], json!(name));
    // Listed, with its time and sizes.
    let (status, listed) = hg.get("/v1/checkpoints");
    assert_eq!(status, 200, "{listed}");
    let entry = &listed["checkpoints"][0];
    assert_eq!(listed["checkpoints"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!((&entry["name"], &entry["path"]), (&json!(name), &taken["path"]));
    let taken_ms = entry["taken_ms"].as_i64().unwrap();
    assert!((before..=after).contains(&taken_ms), "{before} {taken_ms} {after}");
    let (files, bytes) = files_and_bytes(&path);
    assert_eq!((entry["files"].as_u64(), entry["bytes"].as_u64()), (Some(files), Some(bytes)), "{entry}");
    // The SST files are the store's too.
    assert!(entry["unshared_bytes"].as_u64().unwrap() < bytes, "{entry}");
    // The store goes on.
    post_lines(&hg, &lines(10..20));
    assert_readings(&hg, 20);

    // The checkpoint, served on its own beside the store: the first ten minutes only.
    let copy = Hourglass::start_with_env(&path, None, &[WBUF]);
    assert_readings(&copy, 10);
    // Not deleted while a process has it open as its store (which would go on acknowledging
    // writes into files gone): 409, and it stays.
    let in_use = || {
        let (status, refused) = hg.delete(&format!("/v1/checkpoints/{name}"));
        assert_eq!(status, 409, "{refused}");
        let why = refused["error"].as_str().unwrap();
        assert!(why.starts_with(&format!("checkpoint {name} is open as a store by process ")), "{why}");
    };
    in_use();
    assert!(path.join("rocksdb").join("CURRENT").is_file());
    assert_readings(&copy, 10);
    // Nor while a checkpoint inside it (the copy's own) is open as a store (QA52 F7: only the
    // checkpoint's own store was looked at, and the nested one was deleted under its process).
    let (status, inner) = copy.post("/v1/checkpoints", "");
    assert_eq!(status, 201, "{inner}");
    copy.terminate();
    let inner = std::path::PathBuf::from(inner["path"].as_str().unwrap());
    assert!(inner.starts_with(&path), "{}", inner.display());
    let nested = Hourglass::start_with_env(&inner, None, &[WBUF]);
    in_use();
    assert!(inner.join("rocksdb").join("CURRENT").is_file());
    assert_readings(&nested, 10);
    nested.terminate();
    hg.terminate();
    // And the store, served again, all twenty.
    let hg = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    assert_readings(&hg, 20);

    // Deleted by name, once.
    assert_eq!(hg.delete("/v1/checkpoints/nope"), (404, json!({"error": "no checkpoint named \"nope\""})));
    let (status, gone) = hg.delete(&format!("/v1/checkpoints/{name}"));
    assert_eq!(status, 200, "{gone}");
    assert_eq!((&gone["name"], &gone["taken_ms"]), (&json!(name), &json!(taken_ms)));
    assert!(!path.exists());
    assert_eq!(hg.get("/v1/checkpoints"), (200, json!({"checkpoints": []})));
    assert_eq!(hg.delete(&format!("/v1/checkpoints/{name}")).0, 404);
    assert_readings(&hg, 20);
    hg.terminate();
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// The files under `dir` and their bytes.
fn files_and_bytes(dir: &std::path::Path) -> (u64, u64) {
    let mut found = (0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let (files, bytes) = if path.is_dir() { files_and_bytes(&path) } else { (1, path.metadata().unwrap().len()) };
        found = (found.0 + files, found.1 + bytes);
    }
    found
}
