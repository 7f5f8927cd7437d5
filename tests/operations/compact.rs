//! `hourglass compact`: a store left by a killed `serve` (its write buffer not flushed, its
//! memtables only in the WAL) compacted offline, then served again with every reading intact;
//! and the clear refusals (a store in use, no store at all); its sizes leave checkpoints out.

use std::time::Duration;

use serde_json::Value;

use crate::hourglass;
use crate::util::Hourglass;

/// 2024-01-01T00:00:00Z, ms.
const T0: i64 = 1_704_067_200_000;
const DEVICES: i64 = 20;
const MINUTES: i64 = 30;
/// The write buffer on, so the readings are in its records when `serve` is killed.
pub(crate) const WBUF: (&str, &str) = ("HOURGLASS_STORAGE__WRITE_BUFFER_MB", "64");

/// The line of device `d` at minute `m`.
pub(crate) fn line(d: i64, m: i64) -> String {
    format!("trucks,name=t{d} speed={}.5,fuel={}i {}\n", d * 100 + m, m, T0 + m * 60_000)
}

/// Writes `body` (lines) through `POST /write`: committed once answered.
pub(crate) fn post_lines(hg: &Hourglass, body: &str) {
    let url = format!("http://{}/write?precision=ms", hg.http);
    let answer = ureq::post(&url).timeout(Duration::from_secs(30)).send_string(body).unwrap();
    assert_eq!(answer.status(), 204);
}

/// Device `t{d}`'s readings of the hour after T0 are exactly its lines of minutes `0..minutes`.
pub(crate) fn assert_minutes(hg: &Hourglass, d: i64, minutes: i64) {
    let (status, body) = hg.get(&format!("/v1/tables/trucks/devices/t{d}/readings?from={T0}&to={}", T0 + 3_600_000));
    assert_eq!(status, 200, "{body}");
    let expected: Vec<Value> = (0..minutes)
        .map(|m| serde_json::json!({"ts": T0 + m * 60_000, "fuel": m, "speed": (d * 100 + m) as f64 + 0.5}))
        .collect();
    assert_eq!(body["readings"], Value::Array(expected), "device t{d}");
}

/// Bytes of the files under `dir`, RocksDB's text logs (`LOG`, `LOG.old.*`) left out.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            let name = e.file_name().into_string().unwrap();
            if meta.is_dir() {
                dir_bytes(&e.path())
            } else if name == "LOG" || name.starts_with("LOG.old.") {
                0
            } else {
                meta.len()
            }
        })
        .sum()
}

fn compact(data_dir: &str, vars: &[(&str, &str)]) -> std::process::Output {
    hourglass(&["compact", "--data-dir", data_dir], vars)
}

#[test]
fn a_killed_stores_readings_survive_an_offline_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let hg = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    // One request a minute of the fleet: each device-hour gets one operand a request.
    for m in 0..MINUTES {
        post_lines(&hg, &(0..DEVICES).map(|d| line(d, m)).collect::<String>());
    }
    hg.kill9();

    // Compacting while `serve` holds the store is refused, naming the likely cause.
    let running = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    let out = compact(data, &[WBUF]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(is a `hourglass serve` using it?)"), "{stderr}");
    running.kill9();
    // Compacting while `file` holds `contents` is refused for another reason than RocksDB's
    // lock: `expected` is in the error, without the lock's hint. The file is put back after.
    let refused_without_the_hint = |file: &std::path::Path, contents: &[u8], expected: &str| {
        let kept = std::fs::read(file).unwrap();
        std::fs::write(file, contents).unwrap();
        let out = compact(data, &[WBUF]);
        std::fs::write(file, kept).unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!stderr.contains("hourglass serve"), "{stderr}");
    };
    // Refused by the archive's owner check: its message.
    let owner_file = dir.path().join("archive").join(".hourglass-store");
    refused_without_the_hint(&owner_file, b"/elsewhere/rocksdb\n", "is the archive of the store in /elsewhere/rocksdb");
    // Refused by RocksDB for another reason than its lock (a damaged CURRENT file): its error
    // (the hint was on every error RocksDB gave, a read-only disk's too).
    let current = dir.path().join("rocksdb").join("CURRENT");
    refused_without_the_hint(&current, b"no manifest named here", "CURRENT file does not end with newline");

    // A checkpoint's bytes (`POST /v1/checkpoints`) are not the store's: left out of its sizes.
    std::fs::create_dir_all(dir.path().join("checkpoints/one")).unwrap();
    std::fs::write(dir.path().join("checkpoints/one/file"), [7u8; 1000]).unwrap();
    let before = dir_bytes(dir.path()) - 1000;
    let out = compact(data, &[WBUF]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["bytes_before"], before, "{report}");
    assert_eq!(report["bytes_after"], dir_bytes(dir.path()) - 1000, "{report}");
    // Compacting again does not make the store look larger (its text logs grow at each open).
    let again: Value = serde_json::from_slice(&compact(data, &[WBUF]).stdout).unwrap();
    assert_eq!(again["bytes_before"], report["bytes_after"]);
    assert!(again["bytes_after"].as_u64() <= again["bytes_before"].as_u64(), "{again}");
    // The readings left in the WAL and the write buffer's records are in `buckets` files now.
    assert!(report["buckets_sst_bytes"].as_u64().unwrap() > 0, "{report}");

    let hg = Hourglass::start_with_env(dir.path(), None, &[WBUF]);
    for d in [0, 7, DEVICES - 1] {
        assert_minutes(&hg, d, MINUTES);
    }
    hg.terminate();
}

#[test]
fn compacting_where_there_is_no_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = compact(dir.path().to_str().unwrap(), &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("no store in {}", dir.path().display())), "{stderr}");
    // Nothing was created there.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
