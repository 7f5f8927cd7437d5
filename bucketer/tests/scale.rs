//! Scale of the data model on real RocksDB: 30,000 virtual tables share the column families
//! (one key prefix each), are created, written, read back, reloaded, rolled up and swept by
//! retention without touching each other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bucketer::{Store, StoreConfig};
use model::{DeviceReading, PartitionSize, Reading, TimeRange, DAY_MS, HOUR_MS};
use rollup::period::Level;

const TABLES: usize = 30_000;
/// 2024-01-02T00:00:00Z.
const T0: i64 = 1_704_153_600_000;

fn name(i: usize) -> String {
    format!("plant_{}.line_{}", i / 100, i % 100)
}

/// Table i's two readings: device `d{i % 7}`, values derived from i.
fn readings(i: usize) -> Vec<DeviceReading> {
    [(T0 + i as i64, i as f64 * 0.25), (T0 + HOUR_MS + i as i64, -(i as f64))]
        .into_iter()
        .map(|(ts, v)| DeviceReading {
            table: name(i).as_str().into(),
            device: format!("d{}", i % 7).as_str().into(),
            reading: Reading::new(ts, vec![("v".into(), v)]),
        })
        .collect()
}

#[test]
fn thirty_thousand_tables_in_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let day = TimeRange::new(T0, T0 + DAY_MS).unwrap();
    {
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        // A few tables defined first, with hour partitions and a two-hour retention.
        for i in (0..TABLES).step_by(1000) {
            let (def, created) = store.define_table(&name(i), PartitionSize::Hour, Some(2 * HOUR_MS as u64)).unwrap();
            assert!(created);
            assert_eq!(def.id as usize, i / 1000 + 1, "ids are dense from 1, in creation order");
        }
        // Every table created by writing to it: 60,000 readings in batches of 10,000.
        let all: Vec<DeviceReading> = (0..TABLES).flat_map(readings).collect();
        for chunk in all.chunks(10_000) {
            store.write(chunk.to_vec(), &[]).unwrap();
        }
        assert_eq!(store.tables().len(), TABLES);
        // Far ahead in one table: moves the watermark past both hours of every table.
        let clock = DeviceReading {
            table: name(1).as_str().into(),
            device: "clock".into(),
            reading: Reading::new(T0 + 3 * HOUR_MS, vec![("v".into(), 0.0)]),
        };
        store.write(vec![clock], &[]).unwrap();
        let s = store.process_rollups(0, usize::MAX).unwrap();
        assert_eq!(s.hours, 2 * TABLES);
    }
    // Reopened: the catalog loads every table; a sample reads back exactly, raw and rolled up.
    let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
    assert_eq!(store.tables().len(), TABLES);
    for i in (0..TABLES).step_by(97).chain([TABLES - 1]) {
        let want: Vec<Reading> = readings(i).into_iter().map(|r| r.reading).collect();
        let device = format!("d{}", i % 7);
        assert_eq!(store.read_range(&name(i), &device, day).unwrap(), Some(want), "table {i}");
        let hours = store.group_rollups(&name(i), "", Level::Hour, day).unwrap().unwrap();
        let sums: Vec<(i64, u64, f64)> =
            hours.iter().map(|(h, r)| (*h, r.fields["v"].exact.count(), r.fields["v"].exact.sum())).collect();
        assert_eq!(sums, [(T0, 1, i as f64 * 0.25), (T0 + HOUR_MS, 1, -(i as f64))], "table {i}");
        // No other table's device leaks in.
        assert_eq!(store.read_range(&name(i), &format!("d{}", (i + 1) % 7), day).unwrap(), None, "table {i}");
    }
    // Retention at T0 + 3 h 1 ms (the first hour ended over two hours ago) drops that hour of
    // the 30 tables with a retention only.
    let dropped = store.drop_expired_partitions(T0 + 3 * HOUR_MS + 1).unwrap();
    let mut expected: Vec<(String, i64)> =
        (0..TABLES).step_by(1000).map(|i| (name(i), PartitionSize::Hour.index_of(T0))).collect();
    let mut dropped = dropped;
    dropped.sort();
    expected.sort();
    assert_eq!(dropped, expected);
    let kept = store.read_range(&name(1000), "d6", day).unwrap().unwrap();
    assert_eq!(kept.iter().map(|r| r.ts).collect::<Vec<_>>(), [T0 + HOUR_MS + 1000]);
    assert_eq!(store.read_range(&name(1001), "d0", day).unwrap().unwrap().len(), 2, "a neighbour keeps both");
}
