//! An outlier on real RocksDB: a device at 100 Hz beside devices at one reading a minute
//! overflows into per-minute sub-buckets once past the threshold; its readings, rewrites and
//! roll-ups read back exactly, the others keep one bucket an hour, and the flag survives a
//! restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

#[path = "util/logged.rs"]
mod logged;

use bucketer::{Store, StoreConfig};
use model::{DeviceReading, Hour, Reading, TimeRange, HOUR_MS};
use rollup::period::Level;
use rollup::record::Record;

const T: &str = "plant.vibration";
/// 2024-01-02T00:00:00Z.
const T0: i64 = 1_704_153_600_000;
const LIMIT: u64 = 1000;

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreConfig { bucket_max_readings: LIMIT, ..StoreConfig::default() }).unwrap()
}

fn row(device: &str, ts: i64, v: f64) -> DeviceReading {
    DeviceReading { table: T.into(), device: device.into(), reading: Reading::new(ts, vec![("v".into(), v)]) }
}

/// The flag is logged with the table's and the device's names (QA46 F9: their ids were), also
/// when both are new in the batch that flags the device.
#[test]
fn a_device_flagged_as_an_outlier_is_logged_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rows: Vec<DeviceReading> = (0..1001).map(|k| row("burst_1", T0 + k * 10, k as f64)).collect();
    let (_, said) = logged::logged(tracing::Level::INFO, || store.write(rows, &[]).unwrap());
    let flagged: Vec<&String> = said.iter().filter(|l| l.contains("flagged as an outlier")).collect();
    assert_eq!(
        flagged,
        ["INFO bucketer: device flagged as an outlier: its hours overflow into per-minute sub-buckets \
             table=plant.vibration device=burst_1 limit=1000"],
        "{said:#?}"
    );
    assert!(store.is_outlier(T, "burst_1"));
}

#[test]
fn a_100_hz_device_overflows_into_sub_buckets_and_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let hour = TimeRange::new(T0, T0 + HOUR_MS).unwrap();
    // device → ts → value: what every read must return.
    let mut oracle: BTreeMap<&str, BTreeMap<i64, f64>> = BTreeMap::new();
    {
        let store = open(dir.path());
        // Three minutes at 100 Hz in batches of 5 s (500 readings), the slow devices' minute
        // readings in the batch of their time.
        for batch in 0..36i64 {
            let mut rows = Vec::new();
            for k in 0..500 {
                let ts = T0 + batch * 5_000 + k * 10;
                let v = (ts % 977) as f64 * 0.5;
                rows.push(row("fast", ts, v));
                oracle.entry("fast").or_default().insert(ts, v);
            }
            if batch % 12 == 0 {
                for d in ["slow_0", "slow_1", "slow_2"] {
                    let ts = T0 + batch * 5_000;
                    rows.push(row(d, ts, batch as f64));
                    oracle.entry(d).or_default().insert(ts, batch as f64);
                }
            }
            store.write(rows, &[]).unwrap();
            // 500 and 1,000 readings are within the limit; the third batch crosses it.
            assert_eq!(store.is_outlier(T, "fast"), batch >= 2, "after batch {batch}");
        }
        // A rewrite of a reading stored in the hour's bucket before the flag: the new value wins.
        store.write(vec![row("fast", T0 + 10, -1.0)], &[]).unwrap();
        oracle.get_mut("fast").unwrap().insert(T0 + 10, -1.0);
        assert!(!store.is_outlier(T, "slow_0"));
        assert_eq!(store.sub_buckets(T, "fast", Hour::of(T0)).unwrap(), 3, "one per minute written");
        assert_eq!(store.sub_buckets(T, "slow_0", Hour::of(T0)).unwrap(), 0);
        // The hour's own bucket kept the 1,000 readings written before the flag.
        let mut base = Vec::new();
        bucketer::codec::decode(&store.bucket_bytes(T, "fast", Hour::of(T0)).unwrap().unwrap(), &mut base).unwrap();
        assert_eq!(base.len(), 1000);
        for (device, want) in &oracle {
            let got = store.read_range(T, device, hour).unwrap().unwrap();
            let got: Vec<(i64, f64)> = got.iter().map(|r| (r.ts, r.get_f64("v").unwrap())).collect();
            assert_eq!(got, want.iter().map(|(t, v)| (*t, *v)).collect::<Vec<_>>(), "{device}");
        }
        // A sub-range cutting through the sub-buckets.
        let part = TimeRange::new(T0 + 59_990, T0 + 60_020).unwrap();
        let got: Vec<i64> = store.read_range(T, "fast", part).unwrap().unwrap().iter().map(|r| r.ts).collect();
        assert_eq!(got, [T0 + 59_990, T0 + 60_000, T0 + 60_010]);
    }
    // Reopened: the flag is kept, new readings go to their sub-buckets, roll-ups are exact.
    let store = open(dir.path());
    assert!(store.is_outlier(T, "fast"));
    store.write(vec![row("fast", T0 + 30 * 60_000, 4.25)], &[]).unwrap();
    oracle.get_mut("fast").unwrap().insert(T0 + 30 * 60_000, 4.25);
    assert_eq!(store.sub_buckets(T, "fast", Hour::of(T0)).unwrap(), 4);
    store.write(vec![row("clock", T0 + 2 * HOUR_MS, 0.0)], &[]).unwrap();
    store.process_rollups(0, usize::MAX).unwrap();
    for (device, want) in &oracle {
        let readings: Vec<Reading> = want.iter().map(|(ts, v)| Reading::new(*ts, vec![("v".into(), *v)])).collect();
        let got = store.rollups(T, device, Level::Hour, hour).unwrap().unwrap();
        assert_eq!(got, vec![(T0, Record::of_readings(&readings))], "{device}");
        let got = store.read_range(T, device, hour).unwrap().unwrap();
        assert_eq!(got, readings, "{device}");
    }
    assert_eq!(oracle["fast"].len(), 18_001);
}

/// The newest time of an hour written before the flag and rewritten after it reads back as
/// the rewrite in `latest` (which reads the hour bucket and the sub-bucket of the entry's
/// minute), and a rewrite before the flag stays the latest when the flag comes with an older
/// reading. (Found by the write buffer's twin-store property test: `latest` read only the
/// hour bucket, whose older value won at the equal time.)
#[test]
fn latest_sees_a_rewrite_on_either_side_of_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let latest = |d: &str| {
        let r = store.latest(T, &[d]).unwrap().unwrap().remove(0).unwrap();
        (r.ts, r.get_f64("v").unwrap())
    };
    // 999 readings each (one under the limit), 10 ms apart; newest at T0 + 9,980.
    let newest = T0 + 9_980;
    for d in ["after", "before"] {
        store.write((0..999).map(|k| row(d, T0 + k * 10, 1.0)).collect(), &[]).unwrap();
        assert_eq!(latest(d), (newest, 1.0));
    }
    // `after`: the rewrite of its newest time comes in the batch that crosses the limit.
    store.write(vec![row("after", newest, 2.0), row("after", T0 + 1, 2.0)], &[]).unwrap();
    assert!(store.is_outlier(T, "after"));
    assert_eq!(latest("after"), (newest, 2.0));
    // `before`: the rewrite is the 1,000th reading (into the hour bucket), then an older
    // reading crosses the limit.
    store.write(vec![row("before", newest, 3.0)], &[]).unwrap();
    assert!(!store.is_outlier(T, "before"));
    store.write(vec![row("before", T0 + 5, 4.0)], &[]).unwrap();
    assert!(store.is_outlier(T, "before"));
    assert_eq!(latest("before"), (newest, 3.0));
    let got = store.read_range(T, "before", TimeRange::new(newest, newest + 1).unwrap()).unwrap().unwrap();
    assert_eq!((got[0].ts, got[0].get_f64("v")), (newest, Some(3.0)));
    // A restart reads the same.
    drop(store);
    let store = open(dir.path());
    let r = store.latest(T, &["after", "before"]).unwrap().unwrap();
    let r: Vec<_> = r.iter().map(|r| r.as_ref().map(|r| (r.ts, r.get_f64("v").unwrap()))).collect();
    assert_eq!(r, [Some((newest, 2.0)), Some((newest, 3.0))]);
}
