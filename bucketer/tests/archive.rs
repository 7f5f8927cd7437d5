//! The archive tier on real RocksDB and Parquet files in temp dirs: spilled partitions read
//! back exactly as before (raw reads and roll-up recomputations), late readings for an
//! archived partition are merged into it at a later spill (the next one unless they are set to
//! wait, as they do by default), cold retention deletes files, and
//! a process killed at any step of a spill loses nothing and duplicates nothing.
//!
//! Every check compares with a twin store that got the same writes and never spilled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[path = "util/logged.rs"]
mod logged;

use bucketer::archive::{ArchiveConfig, ReadHook, SpillStep};
use bucketer::{Store, StoreConfig, TableSpec};
use model::{DeviceReading, FieldType, Hour, PartitionSize, Reading, TimeRange, Value, DAY_MS, HOUR_MS};
use rollup::period::Level;

/// 2024-01-01T00:00:00Z, day 19723.
const JAN1: i64 = 1_704_067_200_000;
const DAY1: i64 = 19_723;
/// Everything written lies in here.
const ALL: TimeRange = TimeRange { start: JAN1 - DAY_MS, end: JAN1 + 10 * DAY_MS };
const T: &str = "fleet.trucks";
const DEVICES: [&str; 3] = ["truck_b", "truck_a", "truck_c"];

fn spec() -> TableSpec {
    TableSpec {
        partition: PartitionSize::Day,
        hot_retention_ms: Some(2 * DAY_MS as u64),
        cold_retention_ms: Some(5 * DAY_MS as u64),
        rollup_retention: bucketer::RollupRetention::FOREVER,
        strict: false,
        fields: vec![
            ("speed".into(), FieldType::F64),
            ("odometer".into(), FieldType::I64),
            ("moving".into(), FieldType::Bool),
            ("status".into(), FieldType::Str),
        ],
    }
}

/// Reading `k` of a device: every field typed, some missing on some readings.
fn reading(ts: i64, k: i64) -> Reading {
    let mut fields: Vec<(Arc<str>, Value)> =
        vec![("speed".into(), Value::F64(k as f64 * 0.5 + 0.125)), ("odometer".into(), Value::I64(1_000_000 + k * 7))];
    if k % 3 != 0 {
        fields.push(("moving".into(), Value::Bool(k % 2 == 0)));
    }
    if k % 4 == 0 {
        fields.push(("status".into(), Value::Str(Arc::from(format!("s{}", k % 5)))));
    }
    Reading::new(ts, fields)
}

/// Four days (Jan 1–4) of each device: hours 0, 7 and 23, readings at minutes 1, 20 and 59.
fn days() -> Vec<DeviceReading> {
    let mut rows = Vec::new();
    let mut k = 0;
    for day in 0..4 {
        for hour in [0, 7, 23] {
            for minute in [1, 20, 59] {
                for device in DEVICES {
                    k += 1;
                    let ts = JAN1 + day * DAY_MS + hour * HOUR_MS + minute * 60_000;
                    rows.push(DeviceReading { table: T.into(), device: device.into(), reading: reading(ts, k) });
                }
            }
        }
    }
    rows
}

fn config(archive: Option<&Path>) -> StoreConfig {
    StoreConfig {
        archive: archive.map(|root| {
            let mut cfg = ArchiveConfig::new(root);
            // Small row groups, so a file has several and pruning is exercised.
            cfg.file.row_group_rows = 20;
            // Late readings merged at the next spill.
            cfg.late_rewrite_wait = std::time::Duration::ZERO;
            cfg
        }),
        ..StoreConfig::default()
    }
}

/// [`config`] with late readings for archived partitions waiting as long as they do by
/// default ([`bucketer::archive::LATE_REWRITE_WAIT`]).
fn config_waiting(archive: Option<&Path>) -> StoreConfig {
    let mut cfg = config(archive);
    if let Some(a) = &mut cfg.archive {
        a.late_rewrite_wait = bucketer::archive::LATE_REWRITE_WAIT;
    }
    cfg
}

/// A store with the archive under `dir/archive`, and its twin without one.
struct Pair {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: Store,
    twin: Store,
}

/// [`config`] with a write buffer (`bucketer::wbuf`) that only flushes when asked to (spills,
/// roll-up passes, inspection helpers do).
fn config_buffered(archive: Option<&Path>) -> StoreConfig {
    let write_buffer = bucketer::WriteBufferConfig {
        max_bytes: 1 << 30,
        max_age: std::time::Duration::from_secs(3600),
        ..bucketer::WriteBufferConfig::default()
    };
    StoreConfig { write_buffer: Some(write_buffer), ..config(archive) }
}

impl Pair {
    fn new() -> Pair {
        Pair::with(config)
    }

    /// A pair whose archived store is opened with `cfg` (the twin as always).
    fn with(cfg: fn(Option<&Path>) -> StoreConfig) -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("archive");
        let store = Store::open(&dir.path().join("db"), cfg(Some(&root))).unwrap();
        let twin = Store::open(&dir.path().join("twin"), config(None)).unwrap();
        for s in [&store, &twin] {
            s.define_table_with(T, &spec()).unwrap();
        }
        Pair { _dir: dir, root, store, twin }
    }

    fn write(&self, rows: Vec<DeviceReading>) {
        self.store.write(rows.clone(), &[]).unwrap();
        self.twin.write(rows, &[]).unwrap();
    }

    fn rollups(&self) {
        for s in [&self.store, &self.twin] {
            s.process_rollups(0, 1_000_000).unwrap();
        }
    }

    /// Raw reads of every device over everything, and over ranges that start and end inside
    /// partitions, and every roll-up, equal the twin's.
    fn assert_same(&self, what: &str) {
        assert_same_reads(&self.store, &self.twin, what);
    }
}

/// Raw reads of every device over everything, and over ranges that start and end inside
/// partitions, every roll-up and the latest readings of `store` equal `twin`'s.
fn assert_same_reads(store: &Store, twin: &Store, what: &str) {
    let ranges = [
        ALL,
        TimeRange { start: JAN1 + 7 * HOUR_MS + 60_000, end: JAN1 + DAY_MS + 23 * HOUR_MS + 1_200_001 },
        TimeRange { start: JAN1 + 7 * HOUR_MS, end: JAN1 + 7 * HOUR_MS + 1_200_000 },
    ];
    for device in DEVICES {
        for range in ranges {
            assert_eq!(
                store.read_range(T, device, range).unwrap(),
                twin.read_range(T, device, range).unwrap(),
                "{what}: {device} {range:?}"
            );
        }
        for level in [Level::Hour, Level::Day] {
            assert_eq!(
                store.rollups(T, device, level, ALL).unwrap(),
                twin.rollups(T, device, level, ALL).unwrap(),
                "{what}: {device} roll-ups {level:?}"
            );
        }
    }
    assert_eq!(
        store.group_rollups(T, "", Level::Day, ALL).unwrap(),
        twin.group_rollups(T, "", Level::Day, ALL).unwrap(),
        "{what}: table roll-ups"
    );
    assert_eq!(store.latest(T, &DEVICES).unwrap(), twin.latest(T, &DEVICES).unwrap(), "{what}: latest");
}

/// Every `*.parquet*` file under `root`, relative to it, sorted (not the owner files).
fn files(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if ![
                bucketer::archive::OWNER_FILE,
                bucketer::archive::OWNER_ID_FILE,
                bucketer::archive::GENERATION_FILE,
            ]
            .iter()
            .any(|f| p == root.join(f))
            {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

const JAN5: i64 = JAN1 + 4 * DAY_MS;

#[test]
fn a_spilled_partition_reads_back_exactly_and_takes_late_readings() {
    spilled_partition_scenario(config);
}

/// The same with a write buffer in front of the archived store: readings wait in memory (and
/// in its log records) until a spill, a roll-up pass or a reopen.
#[test]
fn a_spilled_partition_reads_back_exactly_behind_a_write_buffer() {
    spilled_partition_scenario(config_buffered);
}

/// Late readings for an archived partition wait in RocksDB, read with the file all the while,
/// until a day after the run that first found them, or until their buckets hold a sixteenth of
/// the file's bytes; then one run merges them into a new part file.
#[test]
fn late_readings_wait_a_day_or_a_sixteenth_of_the_file() {
    assert_eq!(bucketer::archive::LATE_REWRITE_WAIT.as_millis(), DAY_MS as u128);
    let p = Pair::with(config_waiting);
    p.write(days());
    p.rollups();
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(
        report.spilled.iter().map(|s| (s.partition, s.rows)).collect::<Vec<_>>(),
        vec![(DAY1, 27), (DAY1 + 1, 27)]
    );
    let late = |device: &str, ts: i64, k: i64| DeviceReading {
        table: T.into(),
        device: device.into(),
        reading: reading(ts, k),
    };
    p.write(vec![late("truck_a", JAN1 + 7 * HOUR_MS + 30_000, 1001), late("truck_b", JAN1 + DAY_MS + HOUR_MS, 1002)]);
    p.rollups();

    // Found an hour later: both wait, readable as if merged, in RocksDB beside part 0.
    let found = JAN5 + HOUR_MS;
    let waiting = |since: i64, parts: &[i64]| -> Vec<(String, i64, i64)> {
        parts.iter().map(|&d| (T.to_string(), d, since)).collect()
    };
    let report = p.store.spill_expired_partitions(found, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.deferred), (0, waiting(found, &[DAY1, DAY1 + 1])));
    p.assert_same("late readings waiting");
    assert!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1 + 7 * HOUR_MS)).unwrap().is_some());
    let parts = |p: &Pair| [DAY1, DAY1 + 1].map(|d| p.store.archived_partition(T, d).unwrap().part);
    assert_eq!(parts(&p), [0, 0]);
    // A day less a millisecond after that run: still waiting, since then (Jan 3, past its hot
    // retention now, spilled as any).
    let almost = found + DAY_MS - 1;
    let report = p.store.spill_expired_partitions(almost, |_| ()).unwrap();
    let spilled: Vec<(i64, u64, u64)> =
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect();
    assert_eq!((spilled, report.deferred), (vec![(DAY1 + 2, 27, 0)], waiting(found, &[DAY1, DAY1 + 1])));

    // Jan 2 takes late readings, one at a time, until its buckets hold a sixteenth of its
    // file's bytes: the first run after that rewrites it; Jan 1 still waits.
    let file_bytes = p.store.archived_partition(T, DAY1 + 1).unwrap().bytes;
    let (hour_b, hour_c) = (Hour::of(JAN1 + DAY_MS + HOUR_MS), Hour::of(JAN1 + DAY_MS + 5 * HOUR_MS));
    let mut written = 0;
    loop {
        let held: usize = [("truck_b", hour_b), ("truck_c", hour_c)]
            .iter()
            .map(|&(d, h)| p.store.bucket_bytes(T, d, h).unwrap().map_or(0, |b| b.len()))
            .sum();
        let report = p.store.spill_expired_partitions(almost, |_| ()).unwrap();
        if (held as u64) * 16 < file_bytes {
            assert_eq!((report.spilled.len(), report.deferred), (0, waiting(found, &[DAY1, DAY1 + 1])), "{held} bytes");
        } else {
            assert_eq!(report.deferred, waiting(found, &[DAY1]), "{held} bytes");
            let spilled: Vec<(i64, u64, u64)> =
                report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect();
            assert_eq!(spilled, vec![(DAY1 + 1, 27 + 1 + written, 27)], "{held} of {file_bytes} bytes");
            break;
        }
        assert!(written < 2_000, "{held} bytes after {written} readings; the file has {file_bytes}");
        written += 1;
        p.write(vec![late("truck_c", JAN1 + DAY_MS + 5 * HOUR_MS + written as i64 * 1_000, 2000 + written as i64)]);
    }
    assert!(written > 1, "{written} readings to a sixteenth of {file_bytes} bytes");
    assert_eq!(parts(&p), [0, 1]);
    p.rollups();
    p.assert_same("Jan 2 rewritten, Jan 1 waiting");

    // A day after the run that found it, Jan 1 is rewritten; nothing waits after.
    let report = p.store.spill_expired_partitions(found + DAY_MS, |_| ()).unwrap();
    let spilled: Vec<(i64, u64, u64)> =
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect();
    assert_eq!((spilled, report.deferred), (vec![(DAY1, 28, 27)], vec![]));
    assert_eq!(parts(&p), [1, 1]);
    assert_eq!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1 + 7 * HOUR_MS)).unwrap(), None);
    p.assert_same("both rewritten");

    // A late reading that arrives after that waits from the run that finds it, and a reopened
    // store goes on waiting from that run (it started again from its own first run: a store
    // restarted more often than the wait never rewrote the partition).
    p.write(vec![late("truck_c", JAN1 + DAY_MS + 23 * HOUR_MS, 1003)]);
    let again = found + DAY_MS + HOUR_MS;
    let report = p.store.spill_expired_partitions(again, |_| ()).unwrap();
    assert_eq!(report.deferred, waiting(again, &[DAY1 + 1]));
    let reopen = |p: Pair| {
        let Pair { _dir, root, store, twin } = p;
        let db = store_path(&root);
        drop(store);
        let store = Store::open(&db, config_waiting(Some(&root))).unwrap();
        Pair { _dir, root, store, twin }
    };
    let p = reopen(p);
    assert_eq!(p.store.archive_held().waiting, 1);
    let reopened = again + HOUR_MS;
    let report = p.store.spill_expired_partitions(reopened, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.deferred), (0, waiting(again, &[DAY1 + 1])));
    p.assert_same("a late reading waiting after a reopen");
    // Reopened again, a day after the run that found it: Jan 2 is rewritten (Jan 1 is past its
    // cold retention by then, Jan 4 past its hot one).
    let p = reopen(p);
    let rows = p.store.archived_partition(T, DAY1 + 1).unwrap().rows;
    let report = p.store.spill_expired_partitions(again + DAY_MS, |_| ()).unwrap();
    let spilled: Vec<(i64, u64, u64)> =
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect();
    assert_eq!((spilled, report.deferred), (vec![(DAY1 + 1, rows + 1, rows), (DAY1 + 3, 27, 0)], vec![]));
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1)]);
    // The rewrite ended the wait for good: nothing waits after a reopen.
    let p = reopen(p);
    assert_eq!(p.store.archive_held().waiting, 0);
    assert_eq!(p.store.archived_partition(T, DAY1 + 1).unwrap().part, 2);
}

fn spilled_partition_scenario(cfg: fn(Option<&Path>) -> StoreConfig) {
    let p = Pair::with(cfg);
    p.write(days());
    p.rollups();
    p.assert_same("before any spill");

    // At Jan 5 the hot retention (2 days) has passed for Jan 1 and Jan 2.
    let mut heard = Vec::new();
    let report = p.store.spill_expired_partitions(JAN5, |s| heard.push(s.partition)).unwrap();
    assert_eq!(heard, vec![DAY1, DAY1 + 1]);
    let spilled: Vec<(String, i64, u64, u64)> =
        report.spilled.iter().map(|s| (s.table.clone(), s.partition, s.rows, s.rows_from_archive)).collect();
    // 3 hours × 3 minutes × 3 devices a day.
    assert_eq!(spilled, vec![(T.into(), DAY1, 27, 0), (T.into(), DAY1 + 1, 27, 0)]);
    assert_eq!((report.deleted.clone(), report.leftovers_removed), (vec![], 0));
    assert_eq!(
        files(&p.root),
        vec![
            "table=fleet.trucks/partition=2024-01-01/part-0.parquet",
            "table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );
    for s in &report.spilled {
        assert_eq!(std::fs::metadata(&s.path).unwrap().len(), s.bytes);
        assert_eq!((s.object.as_deref(), s.location()), (None, s.path.display().to_string()));
    }
    let entry = p.store.archived_partition(T, DAY1).unwrap();
    assert_eq!((entry.part, entry.rows), (0, 27));
    assert_eq!((entry.min_ts, entry.max_ts), (JAN1 + 60_000, JAN1 + 23 * HOUR_MS + 59 * 60_000));
    // The partitions are gone from RocksDB; Jan 3 is not.
    assert_eq!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1)).unwrap(), None);
    assert_eq!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1 + DAY_MS)).unwrap(), None);
    assert!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1 + 2 * DAY_MS)).unwrap().is_some());
    p.assert_same("after the spill");
    // A second run at the same time has nothing to do.
    assert_eq!(p.store.spill_expired_partitions(JAN5, |_| ()).unwrap(), Default::default());

    // Late readings for archived Jan 1: a new one, and one that replaces an archived reading
    // (same time, other values). Both are readable at once, and their hours' roll-ups are
    // recomputed from the archive and RocksDB together.
    let replaced_ts = JAN1 + 7 * HOUR_MS + 20 * 60_000;
    let late = vec![
        DeviceReading {
            table: T.into(),
            device: "truck_a".into(),
            reading: reading(JAN1 + 7 * HOUR_MS + 30_000, 1001),
        },
        DeviceReading { table: T.into(), device: "truck_c".into(), reading: reading(replaced_ts, 1004) },
        // A device the archive has never seen.
        DeviceReading { table: T.into(), device: "truck_0".into(), reading: reading(JAN1 + HOUR_MS, 1002) },
    ];
    p.write(late);
    p.rollups();
    p.assert_same("after late readings");
    let c = p.store.read_range(T, "truck_c", TimeRange { start: replaced_ts, end: replaced_ts + 1 }).unwrap();
    assert_eq!(c, Some(vec![reading(replaced_ts, 1004)]));
    assert_eq!(p.store.read_range(T, "truck_0", ALL).unwrap(), Some(vec![reading(JAN1 + HOUR_MS, 1002)]));

    // The next spill merges them into part 1 of Jan 1 (27 + 2 new rows, one replaced).
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let spilled: Vec<(i64, u64, u64)> =
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect();
    assert_eq!(spilled, vec![(DAY1, 29, 27)]);
    assert_eq!(p.store.archived_partition(T, DAY1).unwrap().part, 1);
    p.assert_same("after merging late readings");
    // Part 0 stays until the next run sweeps it.
    assert_eq!(files(&p.root).len(), 3);
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.leftovers_removed), (0, 1));
    assert_eq!(
        files(&p.root),
        vec![
            "table=fleet.trucks/partition=2024-01-01/part-1.parquet",
            "table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );

    // Across a reopen the manifest holds.
    let Pair { _dir, root, store, twin } = p;
    let db = store_path(&root);
    drop(store);
    let store = Store::open(&db, cfg(Some(&root))).unwrap();
    let p = Pair { _dir, root, store, twin };
    p.assert_same("after a reopen");

    // Jan 8: Jan 1 and 2 are past the cold retention (5 days) and deleted, with the late
    // reading RocksDB got for Jan 2 meanwhile; Jan 3 and 4 are spilled.
    p.store
        .write(
            vec![DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + DAY_MS + 5, 7) }],
            &[],
        )
        .unwrap();
    let report = p.store.spill_expired_partitions(JAN1 + 7 * DAY_MS, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    let held = p.store.archive_held();
    assert_eq!((held.partitions, held.rows), (2, 54), "Jan 3 and 4 spilled, Jan 1 and 2 deleted");
    let spilled: Vec<(i64, u64)> = report.spilled.iter().map(|s| (s.partition, s.rows)).collect();
    assert_eq!(spilled, vec![(DAY1 + 2, 27), (DAY1 + 3, 27)]);
    assert_eq!(
        files(&p.root),
        vec![
            "table=fleet.trucks/partition=2024-01-03/part-0.parquet",
            "table=fleet.trucks/partition=2024-01-04/part-0.parquet"
        ]
    );
    assert_eq!(p.store.archived_partition(T, DAY1), None);
    let twin_from_jan3: Vec<Reading> = p
        .twin
        .read_range(T, "truck_a", ALL)
        .unwrap()
        .unwrap()
        .into_iter()
        .filter(|r| r.ts >= JAN1 + 2 * DAY_MS)
        .collect();
    assert_eq!(p.store.read_range(T, "truck_a", ALL).unwrap(), Some(twin_from_jan3));
}

/// A spill that merges late readings into a new file while a reader is between the old file
/// and RocksDB (the hook runs it there, once): the reader reads again, so a raw read and the
/// hour's roll-up both have the late readings. Before, both missed them (the old file has
/// none, RocksDB no longer did), and the hour's record stayed wrong for good, its mark done.
#[test]
fn a_spill_between_a_readers_file_and_rocksdb_loses_no_late_reading() {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    let store = Arc::new(Store::open(&dir.path().join("db"), config(Some(&root))).unwrap());
    let twin = Store::open(&dir.path().join("twin"), config(None)).unwrap();
    let write = |rows: Vec<DeviceReading>| {
        store.write(rows.clone(), &[]).unwrap();
        twin.write(rows, &[]).unwrap();
    };
    for s in [&*store, &twin] {
        s.define_table_with(T, &spec()).unwrap();
    }
    write(days());
    let spilled = store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len();
    assert_eq!(spilled, 2, "Jan 1 and 2");
    // Each reader of an archived partition spills first, once per `armed`: late readings of
    // Jan 1 go to its next part then, between the reader's two reads.
    let (armed, spills, at) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicI64::new(JAN5)));
    let hook = {
        let (weak, armed, spills, at) = (Arc::downgrade(&store), armed.clone(), spills.clone(), at.clone());
        ReadHook(Arc::new(move || {
            if armed.swap(0, SeqCst) == 1 {
                let store = weak.upgrade().expect("the store");
                let now = at.load(SeqCst);
                spills.fetch_add(store.spill_expired_partitions(now, |_| ()).unwrap().spilled.len(), SeqCst);
            }
        }))
    };
    store.set_between_archive_reads(Some(hook));
    let late = |device: &str, ts: i64, k: i64| DeviceReading {
        table: T.into(),
        device: device.into(),
        reading: reading(ts, k),
    };
    let replaced_ts = JAN1 + 7 * HOUR_MS + 20 * 60_000;

    // A raw read: a new reading and one that replaces an archived one.
    write(vec![late("truck_a", JAN1 + 7 * HOUR_MS + 30_000, 1001), late("truck_c", replaced_ts, 1004)]);
    armed.store(1, SeqCst);
    let range = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    for device in ["truck_c", "truck_a"] {
        assert_eq!(store.read_range(T, device, range).unwrap(), twin.read_range(T, device, range).unwrap(), "{device}");
    }
    assert_eq!((spills.load(SeqCst), store.archived_partition(T, DAY1).unwrap().part), (1, 1));

    // The roll-up pass: late readings again, in hours 7 (truck_a) and 0 (truck_b, replaced).
    write(vec![late("truck_a", JAN1 + 7 * HOUR_MS + 40_000, 1005), late("truck_b", JAN1 + 60_000, 1006)]);
    armed.store(1, SeqCst);
    for s in [&*store, &twin] {
        s.process_rollups(0, 1_000_000).unwrap();
    }
    assert_eq!((spills.load(SeqCst), store.archived_partition(T, DAY1).unwrap().part), (2, 2));

    // A partition first archived between a reader's look at the manifest and its read of
    // RocksDB (Jan 3, at Jan 6): read from the archive.
    at.store(JAN5 + DAY_MS, SeqCst);
    armed.store(1, SeqCst);
    let jan3 = TimeRange { start: JAN1 + 2 * DAY_MS, end: JAN1 + 3 * DAY_MS };
    let read = store.read_range(T, "truck_b", jan3).unwrap();
    assert_eq!((spills.load(SeqCst), store.archived_partition(T, DAY1 + 2).map(|e| e.part)), (3, Some(0)));
    assert_eq!(read.as_ref().map(Vec::len), Some(9));
    assert_eq!(read, twin.read_range(T, "truck_b", jan3).unwrap());
    store.set_between_archive_reads(None);
    assert_same_reads(&store, &twin, "after spills between a reader's two reads");
}

/// A spill run sweeps the archive's files that the manifest does not name, and a reader's
/// download from the bucket is one until its rename: one written in the last ten minutes is
/// left to its reader, an older one (a stopped process's) is removed. Before, the sweep removed
/// a download in flight and the reader's read failed (`cache …: No such file or directory`).
#[test]
fn a_spill_run_leaves_a_download_in_flight_to_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    let store = Store::open(&dir.path().join("db"), config(Some(&root))).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    let jan1 = "table=fleet.trucks/partition=2024-01-01";
    let download = root.join(jan1).join("part-0.00000000000000ab.parquet.download");
    std::fs::write(&download, b"the first bytes of a download").unwrap();
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.leftovers_removed), (0, 0));
    assert!(download.exists());
    // Eleven minutes old: its process stopped before the rename.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(11 * 60);
    std::fs::File::options().write(true).open(&download).unwrap().set_modified(old).unwrap();
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.leftovers_removed), (0, 1));
    assert_eq!(
        files(&root),
        vec![format!("{jan1}/part-0.parquet"), "table=fleet.trucks/partition=2024-01-02/part-0.parquet".to_string()]
    );
}

fn store_path(root: &Path) -> PathBuf {
    root.parent().unwrap().join("db")
}

/// Run by [`a_spill_killed_at_any_step_loses_and_duplicates_nothing`] in a child process: opens
/// the store in `HG_SPILL_DIR` with the abort step `HG_SPILL_ABORT` and spills at Jan 5.
#[test]
#[ignore = "a child process of a_spill_killed_at_any_step_loses_and_duplicates_nothing"]
fn child_spill() {
    let dir = PathBuf::from(std::env::var("HG_SPILL_DIR").expect("HG_SPILL_DIR"));
    let step = SpillStep::parse(&std::env::var("HG_SPILL_ABORT").expect("HG_SPILL_ABORT")).expect("a step");
    let mut cfg = config(Some(&dir.join("archive")));
    if let Some(a) = cfg.archive.as_mut() {
        a.abort_at = Some(step);
    }
    let store = Store::open(&dir.join("db"), cfg).unwrap();
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    panic!("the spill should have aborted at {step:?}");
}

#[test]
fn a_spill_killed_at_any_step_loses_and_duplicates_nothing() {
    for (step, name) in [
        (SpillStep::MidFile, "mid-file"),
        (SpillStep::FileSynced, "file-synced"),
        (SpillStep::FileRenamed, "file-renamed"),
        (SpillStep::Committed, "committed"),
    ] {
        assert_eq!(SpillStep::parse(name), Some(step));
        for merge in [false, true] {
            let what = format!("killed at {name}, {}", if merge { "merging late readings" } else { "first spill" });
            let p = Pair::new();
            p.write(days());
            if merge {
                // Jan 1 and 2 archived; then late readings for Jan 1 wait in RocksDB.
                p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
                p.write(vec![
                    DeviceReading { table: T.into(), device: "truck_b".into(), reading: reading(JAN1 + 5, 2001) },
                    DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + 60_000, 2002) },
                ]);
            }
            let Pair { _dir, root, store, twin } = p;
            drop(store);
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_spill", "--ignored", "--nocapture", "--test-threads=1"])
                .env("HG_SPILL_DIR", root.parent().unwrap())
                .env("HG_SPILL_ABORT", name)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            // Aborted: ended by a signal, not by an exit code.
            assert_eq!(status.code(), None, "{what}: {status}");

            let store = Store::open(&store_path(&root), config(Some(&root))).unwrap();
            let p = Pair { _dir, root, store, twin };
            p.rollups();
            p.assert_same(&format!("{what}, after the restart"));
            // The files on disk are exactly the manifest's.
            let listed: Vec<String> = p
                .store
                .archived_partitions(T)
                .iter()
                .map(|(_, _, path)| path.strip_prefix(&p.root).unwrap().display().to_string())
                .collect();
            assert_eq!(files(&p.root), listed, "{what}");
            // The spill, redone or finished, leaves each partition once in the archive.
            p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
            p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
            p.assert_same(&format!("{what}, after the spill is done"));
            let rows: Vec<u64> = p.store.archived_partitions(T).iter().map(|(_, e, _)| e.rows).collect();
            assert_eq!(rows, if merge { vec![28, 27] } else { vec![27, 27] }, "{what}");
            assert_eq!(files(&p.root).len(), 2, "{what}");
        }
    }
}

/// Reads every archive file under `root` with pyarrow (its Hive partitioning) or DuckDB
/// (`read_parquet` with `hive_partitioning`), in Python from `HG_TEST_PYTHON`: one JSON object
/// per row with `table`, `partition`, `device`, `ts` (epoch ms) and the non-null fields.
fn read_with(reader: &str, root: &Path) -> Vec<serde_json::Value> {
    let python = std::env::var_os("HG_TEST_PYTHON").expect(
        "HG_TEST_PYTHON names a Python with pyarrow and duckdb (scripts/test.sh installs them from PyPI into a venv)",
    );
    let script = match reader {
        "pyarrow" => {
            r#"
import json, sys
import pyarrow as pa, pyarrow.dataset as ds
t = ds.dataset(sys.argv[1], format="parquet", partitioning="hive").to_table()
t = t.set_column(t.schema.get_field_index("ts"), "ts", t.column("ts").cast(pa.int64()))
rows = [{k: v for k, v in r.items() if v is not None} for r in t.to_pylist()]
print(json.dumps(rows))
"#
        }
        _ => {
            r#"
import json, sys, duckdb
q = f"select * exclude (ts), epoch_ms(ts) as ts from read_parquet('{sys.argv[1]}/*/*/*.parquet', hive_partitioning = true, hive_types_autocast = false)"
cur = duckdb.sql(q)
names = cur.columns
rows = [{k: v for k, v in zip(names, r) if v is not None} for r in cur.fetchall()]
print(json.dumps(rows))
"#
        }
    };
    let out = std::process::Command::new(python).arg("-c").arg(script).arg(root).output().unwrap();
    assert!(out.status.success(), "{reader}: {}", String::from_utf8_lossy(&out.stderr));
    let mut rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.sort_by_key(|r| (r["device"].as_str().unwrap_or_default().to_string(), r["ts"].as_i64()));
    rows
}

/// The archive files are plain Parquet: pyarrow and DuckDB read from them exactly the rows and
/// typed values Hourglass returns for the archived days.
#[test]
fn independent_readers_read_what_hourglass_returns() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let mut expected = Vec::new();
    let mut devices = DEVICES;
    devices.sort();
    for device in devices {
        let archived = TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS };
        for r in p.store.read_range(T, device, archived).unwrap().unwrap() {
            let day = if r.ts < JAN1 + DAY_MS { "2024-01-01" } else { "2024-01-02" };
            let mut row = serde_json::json!({"table": T, "partition": day, "device": device, "ts": r.ts});
            for (name, v) in &r.fields {
                row[name.as_ref()] = match v {
                    Value::F64(x) => serde_json::json!(x),
                    Value::I64(x) | Value::UntypedInt(x) => serde_json::json!(x),
                    Value::Bool(x) => serde_json::json!(x),
                    Value::Str(x) => serde_json::json!(x.as_ref()),
                };
            }
            expected.push(row);
        }
    }
    assert_eq!(expected.len(), 54);
    for reader in ["pyarrow", "duckdb"] {
        assert_eq!(read_with(reader, &p.root), expected, "{reader}");
    }
}

/// An S3-compatible server on loopback: moto's, from the venv of `HG_TEST_PYTHON`; stopped on
/// drop.
struct S3Server {
    child: std::process::Child,
    endpoint: String,
}

impl S3Server {
    fn start() -> S3Server {
        let python = PathBuf::from(std::env::var_os("HG_TEST_PYTHON").expect(
            "HG_TEST_PYTHON names a Python with moto[server] (scripts/test.sh installs it from PyPI into a venv)",
        ));
        // Ports handed to a server in this process: the kernel may give a port a stopped one
        // released to the next one, or to another test's listener meanwhile; a server that
        // could not bind its port exits. Ready when it answers S3's bucket list itself: a
        // connect alone was once another listener's, and the test's first request refused.
        static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        for _ in 0..5 {
            let port = loop {
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                if GIVEN.lock().unwrap().insert(port) {
                    break port;
                }
            };
            let mut child = std::process::Command::new(python.with_file_name("moto_server"))
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("moto_server beside HG_TEST_PYTHON");
            let endpoint = format!("http://127.0.0.1:{port}");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let answer = ureq::get(&format!("{endpoint}/")).call().ok().and_then(|r| r.into_string().ok());
                let exited = child.try_wait().unwrap().is_some();
                if answer.is_some_and(|a| a.contains("ListAllMyBucketsResult")) && !exited {
                    return S3Server { child, endpoint };
                }
                if exited {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "moto_server did not answer within 30 s");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        panic!("moto_server exited five times (ports taken?)");
    }

    /// An S3 client of the server, signing as the stores do (moto refuses unsigned reads).
    fn client(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap()
    }

    /// The bytes of object `key` in `bucket`.
    fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        use object_store::ObjectStore;
        let client = self.client(bucket);
        let bytes = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { client.get(&object_store::path::Path::from(key)).await.unwrap().bytes().await.unwrap() });
        bytes.to_vec()
    }

    /// The text of object `key` in `bucket`.
    fn text(&self, bucket: &str, key: &str) -> String {
        String::from_utf8(self.get(bucket, key)).unwrap()
    }

    /// Writes `body` as object `key` in `bucket`.
    fn put(&self, bucket: &str, key: &str, body: impl Into<Vec<u8>>) {
        use object_store::ObjectStore;
        let client = self.client(bucket);
        let payload = object_store::PutPayload::from(body.into());
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { client.put(&object_store::path::Path::from(key), payload).await.unwrap() });
    }

    /// Deletes object `key` in `bucket`.
    fn delete(&self, bucket: &str, key: &str) {
        use object_store::ObjectStore;
        let client = self.client(bucket);
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { client.delete(&object_store::path::Path::from(key)).await.unwrap() });
    }

    /// Runs `work` on a thread of its own while the server answers nothing (stopped by
    /// SIGSTOP; its connections stay open), and `end` 300 ms into it; returns what `work` did.
    fn silent_while<T: Send>(&self, work: impl FnOnce() -> T + Send, end: impl FnOnce()) -> T {
        let pid = i32::try_from(self.child.id()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: signals to the child process this server started, which it still holds.
        let signal = |sig| assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        signal(libc::SIGSTOP);
        let done = std::thread::scope(|s| {
            let work = s.spawn(work);
            std::thread::sleep(std::time::Duration::from_millis(300));
            end();
            work.join()
        });
        signal(libc::SIGCONT);
        done.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Deletes `bucket` and its objects, and returns them (keys and bytes): a request into it
    /// fails at once (`NoSuchBucket`) until [`S3Server::restore`].
    fn take(&self, bucket: &str) -> Vec<(String, Vec<u8>)> {
        let objects: Vec<(String, Vec<u8>)> =
            self.keys(bucket).into_iter().map(|k| (k.clone(), self.get(bucket, &k))).collect();
        for (key, _) in &objects {
            self.delete(bucket, key);
        }
        ureq::delete(&format!("{}/{bucket}", self.endpoint)).call().unwrap();
        objects
    }

    /// Makes `bucket` again with `objects` (what [`S3Server::take`] took).
    fn restore(&self, bucket: &str, objects: &[(String, Vec<u8>)]) {
        ureq::put(&format!("{}/{bucket}", self.endpoint)).call().unwrap();
        for (key, bytes) in objects {
            self.put(bucket, key, bytes.clone());
        }
    }

    /// The keys in `bucket`, sorted (ListObjectsV2, one page).
    fn keys(&self, bucket: &str) -> Vec<String> {
        let body = ureq::get(&format!("{}/{bucket}?list-type=2", self.endpoint)).call().unwrap().into_string().unwrap();
        let mut keys: Vec<String> =
            body.split("<Key>").skip(1).filter_map(|s| s.split("</Key>").next()).map(str::to_string).collect();
        keys.sort();
        keys
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With an S3-compatible bucket as the archive's home, spills upload the files (none stays on
/// local disk), reads download them and answer as before, late readings merge into a new part
/// whose predecessor is deleted from the bucket, and cold retention deletes objects.
#[test]
fn an_s3_compatible_bucket_holds_the_archive() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-archive", s3.endpoint)).call().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("archive-cache");
    let cfg = s3_config(&local, &s3.endpoint, "s3://hg-archive/tier");
    let store = Store::open(&dir.path().join("db"), cfg).unwrap();
    let twin = Store::open(&dir.path().join("twin"), config(None)).unwrap();
    for s in [&store, &twin] {
        s.define_table_with(T, &spec()).unwrap();
    }
    let p = Pair { _dir: dir, root: local.clone(), store, twin };
    p.write(days());
    p.rollups();
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(report.spilled.iter().map(|s| s.rows).collect::<Vec<_>>(), vec![27, 27]);
    // Where each file went is its object, its local path being gone.
    assert_eq!(
        report.spilled[0].location(),
        "s3://hg-archive/tier/table=fleet.trucks/partition=2024-01-01/part-0.parquet"
    );
    assert_eq!(
        s3.keys("hg-archive"),
        vec![
            "tier/.hourglass-archive-generation",
            "tier/.hourglass-store",
            "tier/table=fleet.trucks/partition=2024-01-01/part-0.parquet",
            "tier/table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );
    assert_eq!(files(&local), Vec::<String>::new(), "nothing stays on local disk after a spill");
    p.assert_same("read from the bucket");
    // Reads left local copies, which the manifest names.
    assert_eq!(files(&local).len(), 2);

    p.write(vec![DeviceReading {
        table: T.into(),
        device: "truck_a".into(),
        reading: reading(JAN1 + 7 * HOUR_MS + 30_000, 3001),
    }]);
    p.rollups();
    p.assert_same("late reading beside the bucket's file");
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(report.spilled.iter().map(|s| (s.rows, s.rows_from_archive)).collect::<Vec<_>>(), vec![(28, 27)]);
    p.assert_same("after merging into part 1");
    // What the archive holds: part 1 in place of part 0 for Jan 1.
    let held = p.store.archive_held();
    assert_eq!((held.partitions, held.rows), (2, 55));
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    // Part 0 of Jan 1 in the bucket and its local copy.
    assert_eq!(report.leftovers_removed, 2);
    assert_eq!(
        s3.keys("hg-archive"),
        vec![
            "tier/.hourglass-archive-generation",
            "tier/.hourglass-store",
            "tier/table=fleet.trucks/partition=2024-01-01/part-1.parquet",
            "tier/table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );
    // An object the manifest names gone from the bucket (as after a checkpoint restored with no
    // object versions), and its local copy too: a read says so, not the service's XML.
    let jan2 = "table=fleet.trucks/partition=2024-01-02/part-0.parquet";
    s3.delete("hg-archive", &format!("tier/{jan2}"));
    std::fs::remove_file(local.join(jan2)).unwrap();
    let err = p.store.read_range(T, "truck_a", TimeRange { start: JAN1 + DAY_MS, end: JAN1 + 2 * DAY_MS }).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "archive: the bucket has no s3://hg-archive/tier/{jan2}, which this store's manifest names: was this \
             store restored from a checkpoint taken before the partition's file was rewritten or deleted, or did the \
             bucket lose its objects (emptied, or an S3 service without persistence restarted)? Without the bucket's \
             object versions for as long as the checkpoints are kept (README, Backups), its readings are lost"
        )
    );
    // Cold retention deletes the objects.
    let report = p.store.spill_expired_partitions(JAN1 + 7 * DAY_MS, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    assert_eq!(
        s3.keys("hg-archive"),
        vec![
            "tier/.hourglass-archive-generation",
            "tier/.hourglass-store",
            "tier/table=fleet.trucks/partition=2024-01-03/part-0.parquet",
            "tier/table=fleet.trucks/partition=2024-01-04/part-0.parquet"
        ]
    );
    // The store may be dropped inside an async context (serve's shutdown): the bucket's own
    // runtime must not panic there.
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop(p) });
}

/// Reads that find an archived partition's file missing from the local cache at the same
/// moment each download it under a name of its own, and all answer (one shared temporary name
/// was truncated under another's rename: a reader saw a partial file, another's rename
/// failed). Eight readers at once, ten rounds.
#[test]
fn first_reads_of_an_archived_object_at_once_all_answer() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-reads", s3.endpoint)).call().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("cache");
    let store = Store::open(&dir.path().join("db"), s3_config(&local, &s3.endpoint, "s3://hg-reads/t")).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    let jan1 = local.join("table=fleet.trucks/partition=2024-01-01/part-0.parquet");
    let day = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    for round in 0..10 {
        match std::fs::remove_file(&jan1) {
            Ok(()) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "round {round}"),
        }
        let gate = std::sync::Barrier::new(8);
        let reads: Vec<usize> = std::thread::scope(|s| {
            let readers: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        gate.wait();
                        store.read_range(T, "truck_a", day).map(|r| r.map_or(0, |r| r.len()))
                    })
                })
                .collect();
            readers.into_iter().map(|r| r.join().unwrap().unwrap_or_else(|e| panic!("round {round}: {e}"))).collect()
        });
        assert_eq!(reads, vec![9; 8], "round {round}");
    }
    let left: Vec<String> = files(&local).into_iter().filter(|f| f.ends_with(".download")).collect();
    assert_eq!(left, Vec::<String>::new());
}

/// A store under `dir` archiving into `bucket` (made here) of `s3`, under the prefix `t`, its
/// roll-up passes on one thread (the hours read in order), after a failed request leaving the
/// bucket alone for `quiet` (the default if `None`): [`days`] written and rolled up, its two
/// oldest days spilled (Jan 1 and 2), then a late reading of truck_a at 07:00:30 of each of
/// `late` (days after Jan 1), which makes those hours dirty again.
fn late_into_spilled(
    s3: &S3Server,
    bucket: &str,
    dir: &Path,
    quiet: Option<std::time::Duration>,
    late: &[i64],
) -> Store {
    ureq::put(&format!("{}/{bucket}", s3.endpoint)).call().unwrap();
    let mut cfg = s3_config(&dir.join("cache"), &s3.endpoint, &format!("s3://{bucket}/t"));
    cfg.rollup_workers = 1;
    if let (Some(a), Some(quiet)) = (cfg.archive.as_mut(), quiet) {
        a.failure_quiet = quiet;
    }
    let store = Store::open(&dir.join("db"), cfg).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    let at = |day: i64| DeviceReading {
        table: T.into(),
        device: "truck_a".into(),
        reading: reading(JAN1 + day * DAY_MS + 7 * HOUR_MS + 30_000, 9),
    };
    store.write(late.iter().map(|&d| at(d)).collect(), &[]).unwrap();
    store
}

/// An ordered stop ends the archive bucket's requests in flight: a roll-up pass reading an
/// archived hour from a bucket that does not answer (moto stopped by SIGSTOP) ends with the
/// hour unreadable, "the store is stopping", its mark kept, where it waited out each request's
/// retries (30 s and more an hour: a stop took minutes). Reopened, the store rolls it up.
#[test]
fn a_stop_ends_the_requests_to_a_bucket_that_does_not_answer() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (db, local) = (dir.path().join("db"), dir.path().join("cache"));
    let cfg = || s3_config(&local, &s3.endpoint, "s3://hg-stop/t");
    // A late reading into the archived Jan 1, whose file is not in the local cache.
    let store = late_into_spilled(&s3, "hg-stop", dir.path(), None, &[0]);
    assert!(!local.join("table=fleet.trucks/partition=2024-01-01/part-0.parquet").exists());
    let pass = s3.silent_while(|| store.process_rollups(0, 1_000_000), || store.stop_archive_requests()).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (0, 1), "{pass:?}");
    let reason = pass.unreadable_reason.unwrap();
    assert!(reason.contains("the store is stopping: request abandoned"), "{reason}");
    // Later requests are refused at once.
    let err = store.read_range(T, "truck_a", TimeRange { start: JAN1, end: JAN1 + DAY_MS }).unwrap_err().to_string();
    assert!(err.contains("the store is stopping"), "{err}");
    drop(store);
    let store = Store::open(&db, cfg()).unwrap();
    let pass = store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (1, 0), "{pass:?}");
    assert_eq!(
        store.read_range(T, "truck_a", TimeRange { start: JAN1, end: JAN1 + DAY_MS }).unwrap().map(|r| r.len()),
        Some(10)
    );
}

/// Once a request to the archive's bucket fails, a roll-up pass reads no more archived hours:
/// each waited out its request's retries (30 s and more against a bucket that does not
/// answer) before the hot hours were rolled up. Two archived hours and a hot one dirty, the
/// bucket silent (moto stopped by SIGSTOP) until its request is ended: one request fails, the
/// other archived hour is not tried, the hot hour is rolled up.
#[test]
fn a_pass_stops_reading_the_archive_after_a_failed_request() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    // Late readings into the archived Jan 1 and Jan 2, and one into the hot Jan 4.
    let store = late_into_spilled(&s3, "hg-fail", dir.path(), None, &[0, 1, 3]);
    assert_eq!(store.archive_request_failures(), 0);
    let pass = s3.silent_while(|| store.process_rollups(0, 1_000_000), || store.stop_archive_requests()).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (1, 2), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1, "the second archived hour was not tried");
    // Nor does the next pass, within the minute after the failure, ask the bucket.
    let pass = store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (0, 2), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1, "no request within the minute");
}

/// A cold delete right after a failed request to the archive's bucket (passes read no archived
/// hour for a minute then) leaves the partitions whose due hours it could not roll up, for a
/// later run, where it deleted them and what they held that no pass had rolled up (QA27 F1:
/// late readings and first-time device-hours lost from the roll-ups). A late reading in the
/// archived Jan 1; the bucket gone for one pass (a request fails), back for the delete at Jan
/// 8 (cold retention 5 days): nothing deleted, the mark kept; reopened, the run rolls the late
/// reading up and deletes both days.
#[test]
fn a_cold_delete_after_a_failed_request_leaves_what_it_cannot_roll_up() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let store = late_into_spilled(&s3, "hg-blip", dir.path(), None, &[0]);
    let objects = s3.take("hg-blip");
    let pass = store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (0, 1), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1);
    s3.restore("hg-blip", &objects);
    let jan8 = JAN1 + 7 * DAY_MS;
    let marks = store.dirty_marks().unwrap();
    let report = store.spill_expired_partitions(jan8, |_| ()).unwrap();
    assert_eq!(report.deleted, Vec::<(String, i64)>::new());
    assert!(store.archived_partition(T, DAY1).is_some());
    assert_eq!(store.dirty_marks().unwrap(), marks);
    drop(store);
    let mut cfg = s3_config(&dir.path().join("cache"), &s3.endpoint, "s3://hg-blip/t");
    cfg.rollup_workers = 1;
    let store = Store::open(&dir.path().join("db"), cfg).unwrap();
    let report = store.spill_expired_partitions(jan8, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    // truck_a's Jan 1 07:00: its three readings and the late one (k 9: 4.625).
    let seven = JAN1 + 7 * HOUR_MS;
    let hour = store.rollups(T, "truck_a", Level::Hour, TimeRange { start: seven, end: seven + HOUR_MS }).unwrap();
    let speed = &hour.unwrap()[0].1.fields["speed"].exact;
    assert_eq!(speed.count(), 4);
    assert_eq!(store.archived_partition(T, DAY1), None);
}

/// After a failed request, roll-up passes leave archived hours to a probe of the bucket in the
/// background (a quiet window after the failure, then a `HEAD` of the owner object): they never
/// wait on it, where the first pass after a minute read an hour itself and waited out its
/// retries (30 s and more, every minute, with a bucket that does not answer). The bucket gone
/// (deleted: `NoSuchBucket` fails a request at once), a pass fails one request; the bucket
/// back, the first pass past the window starts the probe while the server answers nothing
/// (SIGSTOP), and leaves both archived hours, asking nothing itself; once the server answers,
/// the probe's answer lets a pass read them.
#[test]
fn a_probe_in_the_background_asks_the_bucket_again_after_a_failure() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let quiet = std::time::Duration::from_millis(200);
    let store = late_into_spilled(&s3, "hg-probe", dir.path(), Some(quiet), &[0, 1]);
    let objects = s3.take("hg-probe");
    assert_eq!(objects.len(), 4, "two part files, the owner object and the generation object");
    let pass = store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (0, 2), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1);

    s3.restore("hg-probe", &objects);
    std::thread::sleep(quiet + std::time::Duration::from_millis(50));
    let pass = s3.silent_while(|| store.process_rollups(0, 1_000_000), || ()).unwrap();
    assert_eq!((pass.hours, pass.unreadable), (0, 2), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1, "the pass asked the silent bucket nothing");
    // The server answers again: the probe's answer reaches the passes (bounded: 10 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let pass = loop {
        let pass = store.process_rollups(0, 1_000_000).unwrap();
        if pass.unreadable == 0 || std::time::Instant::now() > deadline {
            break pass;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!((pass.hours, pass.unreadable), (2, 0), "{pass:?}");
    assert_eq!(store.archive_request_failures(), 1);
    assert_eq!(
        store.read_range(T, "truck_a", TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS }).unwrap().map(|r| r.len()),
        Some(20)
    );
}

/// A bucket prefix without an owner object that holds none of the objects the store's manifest
/// names (the bucket emptied, an S3 service without persistence restarted, another bucket) is
/// not claimed: the spill run fails, counted, saying so, where it claimed the prefix and
/// spilled on while the archived partitions answered errors. Written by hand, the owner
/// object lets it archive there again. A bucket that does not exist is named as such.
#[test]
fn a_bucket_that_lost_the_stores_objects_is_not_claimed_again() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-lost", s3.endpoint)).call().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (db, local) = (dir.path().join("db"), dir.path().join("cache"));
    let store = Store::open(&db, s3_config(&local, &s3.endpoint, "s3://hg-lost/t")).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    for key in s3.keys("hg-lost") {
        s3.delete("hg-lost", &key);
    }
    let id = store.store_id().unwrap();
    let err = store.spill_expired_partitions(JAN5, |_| ()).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "archive: s3://hg-lost/t holds none of the 2 archive objects this store's manifest names \
             (s3://hg-lost/t/table=fleet.trucks/partition=2024-01-01/part-0.parquet among them), and no owner object: \
             is storage.archive_url (with storage.archive_s3_endpoint) the bucket this store spilled to? Nothing is \
             archived until it is (the partitions stay in RocksDB). If the bucket lost them (emptied, or an S3 service \
             without persistence restarted), their readings are lost, but for the local copies reads left in \
             archive_dir; to archive into s3://hg-lost/t anyway, write this store's id as its owner object: printf \
             '{id}\\n' | aws s3 cp - s3://hg-lost/t/.hourglass-store --endpoint-url {}",
            s3.endpoint
        )
    );
    assert_eq!(store.stats().archive_run_failures.load(std::sync::atomic::Ordering::Relaxed), 1);
    // Both files the manifest names are missing (the count stayed 0: QA61 F1).
    assert_eq!(store.archive_held().files_missing, 2);
    assert_eq!(s3.keys("hg-lost"), Vec::<String>::new(), "nothing claimed or uploaded");
    s3.put("hg-lost", &format!("t/{}", bucketer::archive::OWNER_FILE), format!("{id}\n"));
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(store.stats().archive_run_failures.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(store);

    // The same store with a bucket that does not exist: its reads and spill runs say so.
    let store = Store::open(&db, s3_config(&dir.path().join("cache2"), &s3.endpoint, "s3://hg-none/t")).unwrap();
    let missing = format!(
        "the bucket hg-none does not exist at {}: are storage.archive_url and storage.archive_s3_endpoint this \
         store's? (A service without persistence that restarted has lost the bucket, and with it the partitions \
         archived there)",
        s3.endpoint
    );
    let err = store.read_range(T, "truck_a", TimeRange { start: JAN1, end: JAN1 + DAY_MS }).unwrap_err().to_string();
    assert_eq!(err, format!("archive: object store: download: {missing}"));
    let err = store.spill_expired_partitions(JAN5, |_| ()).unwrap_err().to_string();
    assert_eq!(err, format!("archive: object store: read: {missing}"));
}

/// [`config`] with its archive in `url` at the S3-compatible `endpoint` (moto's), cached under
/// `local`.
fn s3_config(local: &Path, endpoint: &str, url: &str) -> StoreConfig {
    let mut cfg = config(Some(local));
    if let Some(a) = cfg.archive.as_mut() {
        a.object_store = Some(bucketer::archive::S3Archive {
            url: url.into(),
            endpoint: Some(endpoint.into()),
            region: Some("us-east-1".into()),
            credentials: Some(("test".into(), "test".into())),
        });
    }
    cfg
}

/// An S3 server with bucket `bucket`, and a store (in the temp dir: `db`, its cache `cache`)
/// that has spilled Jan 1 and 2 of [`days`] to `s3://{bucket}/tier`.
fn spilled_to_bucket(bucket: &str) -> (S3Server, tempfile::TempDir, Store) {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/{bucket}", s3.endpoint)).call().unwrap();
    let url = format!("s3://{bucket}/tier");
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db"), s3_config(&dir.path().join("cache"), &s3.endpoint, &url)).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    (s3, dir, store)
}

/// A bucket's object that reads wrong is read from a fresh download once it is mended in the
/// bucket: a damaged object's local copy was kept, failing, for good (QA61 F3). Another
/// partition's object downloaded in a partition's place is refused, by reads (its local copy
/// read through the footer of the one it replaced answered nothing: QA61 F2) and by a late
/// readings' rewrite (which took its rows and deleted the partition's own object).
#[test]
fn a_bucket_object_put_right_is_downloaded_again() {
    let (s3, dir, store) = spilled_to_bucket("hg-mend");
    let cache = dir.path().join("cache");
    let rel1 = "table=fleet.trucks/partition=2024-01-01/part-0.parquet";
    let (key1, key2) = (format!("tier/{rel1}"), "tier/table=fleet.trucks/partition=2024-01-02/part-0.parquet");
    let (good, other) = (s3.get("hg-mend", &key1), s3.get("hg-mend", key2));
    let day1 = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    let want = store.read_range(T, "truck_a", day1).unwrap().unwrap();
    assert_eq!(want.len(), 9);
    // S3 keeps an object's time in whole seconds: a mended one is written a second after the
    // copy that failed.
    let a_second = || std::thread::sleep(std::time::Duration::from_millis(1100));

    // Damaged in the bucket, the local copy gone: the read downloads it and fails, and again.
    s3.put("hg-mend", &key1, vec![7u8; good.len()]);
    std::fs::remove_file(cache.join(rel1)).unwrap();
    for _ in 0..2 {
        let err = store.read_range(T, "truck_a", day1).unwrap_err().to_string();
        assert!(err.contains(rel1), "{err}");
    }
    a_second();
    s3.put("hg-mend", &key1, good.clone());
    assert_eq!(store.read_range(T, "truck_a", day1).unwrap(), Some(want.clone()));
    assert_eq!(std::fs::read(cache.join(rel1)).unwrap(), good);

    // Jan 2's object in Jan 1's place, the local copy gone: refused by the read and by the
    // rewrite of a late reading; the object is left in the bucket.
    s3.put("hg-mend", &key1, other.clone());
    std::fs::remove_file(cache.join(rel1)).unwrap();
    let refused = jan2_refused(&cache.join(rel1));
    let err = store.read_range(T, "truck_a", day1).unwrap_err().to_string();
    assert!(err.ends_with(&refused), "{err}");
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + 30_000, 1001) };
    store.write(vec![late.clone()], &[]).unwrap();
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(report.failed[0].2.ends_with(&refused), "{report:?}");
    assert_eq!(s3.get("hg-mend", &key1), other, "left in the bucket");
    assert_eq!(store.archived_partition(T, DAY1).unwrap().part, 0);

    // Put right in the bucket: the next run downloads it again and merges the late reading.
    a_second();
    s3.put("hg-mend", &key1, good);
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect::<Vec<_>>(),
        vec![(DAY1, 28, 27)]
    );
    // The late reading at 00:00:30, before the day's first (00:01).
    let mut with_late = vec![late.reading];
    with_late.extend(want);
    assert_eq!(store.read_range(T, "truck_a", day1).unwrap(), Some(with_late));
}

/// A bucket prefix belongs to one store, as a local root does: its owner object names the
/// store's id. A checkpoint restored beside the live store with the same `archive_url` (which
/// a RocksDB checkpoint's missing id file tells apart) and a new store pointed at the prefix
/// are refused at their first spill run, deleting nothing; where no owner object is, a store
/// that has archived nothing is refused at a prefix holding part objects, and the store whose
/// manifest names them claims it again.
#[test]
fn another_store_cannot_spill_into_a_stores_bucket_prefix() {
    let (s3, dir, store) = spilled_to_bucket("hg-own");
    let url = "s3://hg-own/tier";
    let id = store.store_id().unwrap();
    assert_eq!(id.len(), 32, "{id}");
    let id_file = dir.path().join("db").join(bucketer::archive::STORE_ID_FILE);
    assert_eq!(std::fs::read_to_string(&id_file).unwrap(), format!("{id}\n"));
    let owner_object = format!("tier/{}", bucketer::archive::OWNER_FILE);
    assert_eq!(s3.text("hg-own", &owner_object), format!("{id}\n"));
    assert_eq!(count_of(&s3.text("hg-own", &format!("tier/{}", bucketer::archive::GENERATION_FILE))), 2);
    let keys = s3.keys("hg-own");
    assert_eq!(keys.len(), 4, "{keys:?}");

    let refusal = |other: &Store| match other.spill_expired_partitions(JAN5, |_| ()) {
        Ok(report) => panic!("a second store spilled into the first's prefix: {report:?}"),
        Err(e) => e.to_string(),
    };
    // A checkpoint, restored beside the live store: a new id.
    let checkpoint = dir.path().join("checkpoint");
    store.checkpoint(&checkpoint).unwrap();
    assert!(!checkpoint.join(bucketer::archive::STORE_ID_FILE).exists());
    let restored = Store::open(&checkpoint, s3_config(&dir.path().join("cache2"), &s3.endpoint, url)).unwrap();
    let restored_id = restored.store_id().unwrap();
    assert_ne!(restored_id, id);
    assert_eq!(
        refusal(&restored),
        format!(
            "archive: {url} is the archive of another store (id {id}, says {url}/.hourglass-store), not of this one \
             (id {restored_id}, in {}): two stores cannot share a bucket prefix (each would delete the other's \
             objects). Give this store its own storage.archive_url; if this store replaces the one that wrote it (a \
             checkpoint restored in its place), delete {url}/.hourglass-store: it then deletes the objects that \
             store wrote since this one's state as leftovers (its manifest does not name them), and reads none of the \
             partitions whose objects that store replaced since, unless the bucket keeps versions to bring them back",
            checkpoint.join(bucketer::archive::STORE_ID_FILE).display()
        )
    );
    assert_eq!(s3.keys("hg-own"), keys);
    drop(restored);
    // Without the owner object (a prefix written by an older build): a store that has archived
    // nothing is refused at its part objects.
    s3.delete("hg-own", &owner_object);
    let fresh = Store::open(&dir.path().join("db2"), s3_config(&dir.path().join("cache3"), &s3.endpoint, url)).unwrap();
    let err = refusal(&fresh);
    assert!(
        err.starts_with(&format!("archive: {url} holds archive objects (tier/table=fleet.trucks/partition="))
            && err.ends_with(
                "but this store has archived nothing: another store's archive? Give this store its own \
                 storage.archive_url (or, if they are what this store's first spill left when it was cut short, \
                 delete them)"
            ),
        "{err}"
    );
    assert_eq!(
        s3.keys("hg-own"),
        keys.iter().filter(|k| !k.ends_with(".hourglass-store")).cloned().collect::<Vec<_>>()
    );
    // The store whose manifest names them claims the prefix again, with its id.
    drop(store);
    let store = Store::open(&dir.path().join("db"), s3_config(&dir.path().join("cache"), &s3.endpoint, url)).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 0);
    assert_eq!(s3.text("hg-own", &owner_object), format!("{id}\n"));
    assert_eq!(s3.keys("hg-own"), keys);
    // And the fresh store is refused by the owner object now.
    let fresh_id = fresh.store_id().unwrap();
    assert!(refusal(&fresh).contains(&format!("is the archive of another store (id {id},")), "{}", refusal(&fresh));
    // Each run checks the object: one another store wrote over it (two claiming an empty prefix
    // at once) stops the store whose claim it was.
    s3.put("hg-own", &owner_object, format!("{fresh_id}\n"));
    assert!(
        refusal(&store).contains(&format!("is the archive of another store (id {fresh_id},")),
        "{}",
        refusal(&store)
    );
    assert_eq!(s3.keys("hg-own"), keys);
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop((store, fresh)) });
}

/// A cold copy of a store with its archive in a bucket, restored in place: it opens (the open
/// does not ask the bucket), and its spill runs are refused by the prefix's generation object,
/// deleting and uploading nothing, where they deleted the newer Jan 1 object as a leftover, its
/// own Jan 1 object being replaced. With the object deleted, a run takes the prefix as it is.
#[test]
fn a_cold_copy_restored_in_place_cannot_take_the_stores_newer_bucket_prefix() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-cold", s3.endpoint)).call().unwrap();
    let url = "s3://hg-cold/tier";
    let dir = tempfile::tempdir().unwrap();
    let (db, cache) = (dir.path().join("db"), dir.path().join("cache"));
    let store = Store::open(&db, s3_config(&cache, &s3.endpoint, url)).unwrap();
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    let generation = format!("tier/{}", bucketer::archive::GENERATION_FILE);
    assert_eq!(count_of(&s3.text("hg-cold", &generation)), 2);
    drop(store);
    copy_dir(&db, &dir.path().join("db.copy"));
    let store = Store::open(&db, s3_config(&cache, &s3.endpoint, url)).unwrap();
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + HOUR_MS, 999) };
    store.write(vec![late], &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 1);
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(count_of(&s3.text("hg-cold", &generation)), 3);
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop(store) });
    let live = s3.keys("hg-cold");
    assert_eq!(
        live,
        [
            "tier/.hourglass-archive-generation",
            "tier/.hourglass-store",
            "tier/table=fleet.trucks/partition=2024-01-01/part-1.parquet",
            "tier/table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );

    std::fs::remove_dir_all(&db).unwrap();
    std::fs::rename(dir.path().join("db.copy"), &db).unwrap();
    let copy = Store::open(&db, s3_config(&cache, &s3.endpoint, url)).unwrap();
    let err = copy.spill_expired_partitions(JAN5, |_| ()).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "archive: {url} is at generation 3 ({url}/.hourglass-archive-generation says so: the manifest of the \
             store that archived there changed 3 times), and this store's manifest at 2: this store's RocksDB \
             directory is an older copy of that store (restored from a copy of a stopped store)? Its manifest may \
             name objects replaced since, and it would delete the objects written since as leftovers: nothing is \
             archived meanwhile (the partitions stay in RocksDB). To run it on this prefix (the partitions whose \
             objects were replaced since unreadable unless the bucket keeps versions to bring them back, the newer \
             objects deleted), delete {url}/.hourglass-archive-generation"
        )
    );
    assert_eq!(s3.keys("hg-cold"), live, "nothing deleted");
    // Taken as it is: the newer Jan 1 object deleted, the copy's generation written.
    s3.delete("hg-cold", &generation);
    copy.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(count_of(&s3.text("hg-cold", &generation)), 2);
    assert_eq!(
        s3.keys("hg-cold"),
        [
            "tier/.hourglass-archive-generation",
            "tier/.hourglass-store",
            "tier/table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop(copy) });
}

/// The bucket branches of the refusals of an archive that does not go with the store's RocksDB
/// directory, at each spill run, deleting nothing: the prefix put back as it was a commit before
/// (its generation object behind, an object the manifest names gone), then run to the store's
/// count by other changes (another tag). With every object there, a generation object behind (a
/// crash after a commit) is brought up.
#[test]
fn a_store_cannot_take_an_older_or_diverged_bucket_prefix() {
    let (s3, _dir, store) = spilled_to_bucket("hg-back");
    let url = "s3://hg-back/tier";
    let generation = format!("tier/{}", bucketer::archive::GENERATION_FILE);
    let (part0, part1) = (
        "tier/table=fleet.trucks/partition=2024-01-01/part-0.parquet",
        "tier/table=fleet.trucks/partition=2024-01-01/part-1.parquet",
    );
    let (before, jan1_before) = (s3.text("hg-back", &generation), s3.get("hg-back", part0));
    assert_eq!(count_of(&before), 2);
    // Jan 1 takes a late reading: part 1 written, part 0 swept.
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + HOUR_MS, 999) };
    store.write(vec![late], &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 1);
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert!(!s3.keys("hg-back").iter().any(|k| k == part0));
    let (now, jan1_now) = (s3.text("hg-back", &generation), s3.get("hg-back", part1));
    assert_eq!(count_of(&now), 3);

    // The prefix as it was at generation 2.
    s3.delete("hg-back", part1);
    s3.put("hg-back", part0, jan1_before);
    s3.put("hg-back", &generation, before.clone());
    let older = s3.keys("hg-back");
    let err = store.spill_expired_partitions(JAN5, |_| ()).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "archive: {url} is at generation 2 ({url}/.hourglass-archive-generation says so), behind this store's \
             manifest at 3, and 1 of the 2 files that manifest names are not in it: an archive restored from an \
             older copy than this store's RocksDB directory? The store would delete its older files as leftovers \
             (the only copies of the partitions rewritten since). Restore the archive copied with this RocksDB \
             directory; to start anyway (the partitions whose files are not there unreadable, the older files \
             deleted), delete {url}/.hourglass-archive-generation"
        )
    );
    assert_eq!(s3.keys("hg-back"), older, "nothing deleted");
    assert_eq!(s3.text("hg-back", &generation), before);

    // The store's own objects back, the prefix run on by another copy to generation 3: the same
    // count, another tag.
    s3.delete("hg-back", part0);
    s3.put("hg-back", part1, jan1_now);
    let own = s3.keys("hg-back");
    let (_, tag) = now.trim_end().split_once(' ').unwrap();
    let other = format!("3 {:016x}\n", u64::from_str_radix(tag, 16).unwrap() ^ 0xff);
    s3.put("hg-back", &generation, other.clone());
    let err = store.spill_expired_partitions(JAN5, |_| ()).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "archive: {url} and this store's manifest are both at generation 3 ({url}/.hourglass-archive-generation \
             says so) by other changes: the archive and this store's RocksDB directory were each run on its own \
             since a common copy (one restored and run, then the other put back?). It holds the 2 files this \
             store's manifest names, but this store would delete the files the other run wrote as leftovers. \
             Restore the archive that goes with this RocksDB directory; to start anyway (the partitions whose files \
             are not there unreadable, the other run's files deleted), delete {url}/.hourglass-archive-generation"
        )
    );
    assert_eq!(s3.keys("hg-back"), own, "nothing deleted");
    assert_eq!(s3.text("hg-back", &generation), other);

    // Its generation object one commit behind (a crash after a commit): brought up.
    s3.put("hg-back", &generation, before);
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.leftovers_removed), (0, 0));
    assert_eq!(s3.text("hg-back", &generation), now);
    assert_eq!(store.archived_partition(T, DAY1).unwrap().part, 1);
    // Read from part 1: the 18 readings of `days()` and the late one.
    let days = TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS };
    assert_eq!(store.read_range(T, "truck_a", days).unwrap().map(|rows| rows.len()), Some(19));
    assert_eq!(store.archive_held().files_missing, 0);
    // An object gone: counted by the next spill run.
    s3.delete("hg-back", part1);
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(store.archive_held().files_missing, 1);
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop(store) });
}

/// A store whose bucket prefix holds another store's prefix (`s3://b` and `s3://b/sub`), or an
/// operator's copies under a folder of their own, leaves their objects alone: its sweep deletes
/// only the part objects of the layout right under its prefix that its manifest does not name.
/// (It deleted every `part-*.parquet` at any depth: the nested store's archive with them.)
#[test]
fn a_store_leaves_the_objects_nested_under_its_prefix() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-nest", s3.endpoint)).call().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str, url: &str| {
        let cache = dir.path().join(format!("{name}-cache"));
        let store = Store::open(&dir.path().join(name), s3_config(&cache, &s3.endpoint, url)).unwrap();
        store.define_table_with(T, &spec()).unwrap();
        store.write(days(), &[]).unwrap();
        assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
        store
    };
    let outer = open("outer", "s3://hg-nest");
    let inner = open("inner", "s3://hg-nest/sub");
    let jan1 = "table=fleet.trucks/partition=2024-01-01/part-0.parquet";
    let copy = s3.get("hg-nest", jan1);
    s3.put("hg-nest", &format!("backup/{jan1}"), copy.clone());
    // A leftover of the outer store's own: a part its manifest does not name.
    let leftover = "table=fleet.trucks/partition=2024-01-01/part-7.parquet";
    s3.put("hg-nest", leftover, copy);
    let report = outer.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((report.spilled.len(), report.leftovers_removed), (0, 1));
    assert_eq!(
        s3.keys("hg-nest"),
        vec![
            ".hourglass-archive-generation",
            ".hourglass-store",
            "backup/table=fleet.trucks/partition=2024-01-01/part-0.parquet",
            "sub/.hourglass-archive-generation",
            "sub/.hourglass-store",
            "sub/table=fleet.trucks/partition=2024-01-01/part-0.parquet",
            "sub/table=fleet.trucks/partition=2024-01-02/part-0.parquet",
            "table=fleet.trucks/partition=2024-01-01/part-0.parquet",
            "table=fleet.trucks/partition=2024-01-02/part-0.parquet",
        ]
    );
    let days = TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS };
    let read = |store: &Store| store.read_range(T, "truck_a", days).unwrap().map(|rows| rows.len());
    assert_eq!(read(&inner), Some(18));
    assert_eq!(read(&inner), read(&outer));
    tokio::runtime::Runtime::new().unwrap().block_on(async move { drop((outer, inner)) });
}

/// Runs `a` and `b` at the same moment (each on a thread of its own, released together).
fn at_once<T: Send>(a: impl FnOnce() -> T + Send, b: impl FnOnce() -> T + Send) -> (T, T) {
    let gate = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            gate.wait();
            a()
        });
        let b = s.spawn(|| {
            gate.wait();
            b()
        });
        (a.join().unwrap(), b.join().unwrap())
    })
}

/// Two stores claiming one empty bucket prefix at the same moment (their first spill runs at
/// once): the owner object is made by a conditional put, so exactly one spills and the other
/// is refused before it uploads anything (both spilled, each the other's objects' owner in
/// turn, before). Five rounds, each on a new prefix.
#[test]
fn of_two_stores_claiming_one_bucket_prefix_at_once_one_wins() {
    let s3 = S3Server::start();
    ureq::put(&format!("{}/hg-race", s3.endpoint)).call().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let url = format!("s3://hg-race/r{round}");
        let open = |name: &str| {
            let local = dir.path().join(format!("{name}{round}"));
            let store = Store::open(&local.join("db"), s3_config(&local.join("cache"), &s3.endpoint, &url)).unwrap();
            store.define_table_with(T, &spec()).unwrap();
            store.write(days(), &[]).unwrap();
            store
        };
        let (a, b) = (open("a"), open("b"));
        let spill = |store: &Store| store.spill_expired_partitions(JAN5, |_| ()).map(|r| r.spilled.len());
        let (spilled_a, spilled_b) = at_once(|| spill(&a), || spill(&b));
        let (winner, refusal) = match (spilled_a, spilled_b) {
            (Ok(n), Err(e)) => ((&a, n), e.to_string()),
            (Err(e), Ok(n)) => ((&b, n), e.to_string()),
            other => panic!("round {round}: not one spill of two: {other:?}"),
        };
        assert_eq!(winner.1, 2, "round {round}");
        let id = winner.0.store_id().unwrap();
        assert!(
            refusal.contains(&format!("is the archive of another store (id {id},"))
                || refusal.contains("holds archive objects"),
            "round {round}: {refusal}"
        );
        let keys = s3.keys("hg-race");
        let ours: Vec<&String> = keys.iter().filter(|k| k.starts_with(&format!("r{round}/"))).collect();
        assert_eq!(ours.len(), 4, "round {round}: the owner, the generation and the winner's two parts: {ours:?}");
        assert_eq!(s3.text("hg-race", &format!("r{round}/{}", bucketer::archive::OWNER_FILE)), format!("{id}\n"));
    }
}

/// Two stores opening with one unclaimed archive root at the same moment: the owner file is
/// made by a hard link, which never replaces a file, so exactly one opens and the other is
/// refused (both opened, the later rename's owner named in the file, or one failed on the
/// other's temporary file, before: not at every round, hence twenty).
#[test]
fn of_two_stores_opening_with_one_archive_root_at_once_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let root = dir.path().join(format!("archive{round}"));
        let open = |name: &str| Store::open(&dir.path().join(format!("{name}{round}")), config(Some(&root)));
        let (a, b) = at_once(|| open("a"), || open("b"));
        let (winner, refusal) = match (a, b) {
            (Ok(_), Err(e)) => ("a", e.to_string()),
            (Err(e), Ok(_)) => ("b", e.to_string()),
            (a, b) => panic!("round {round}: not one open of two: {:?}, {:?}", a.err(), b.err()),
        };
        let owner = std::fs::canonicalize(dir.path()).unwrap().join(format!("{winner}{round}"));
        let owner_file = root.join(bucketer::archive::OWNER_FILE);
        assert_eq!(std::fs::read_to_string(&owner_file).unwrap(), format!("{}\n", owner.display()));
        assert!(
            refusal.contains(&format!("is the archive of the store in {} (", owner.display())),
            "round {round}: {refusal}"
        );
        let mut names: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(
            names,
            [bucketer::archive::GENERATION_FILE, bucketer::archive::OWNER_FILE, bucketer::archive::OWNER_ID_FILE],
            "round {round}: no temporary file left"
        );
    }
}

/// A copy of a stopped store's directory (its RocksDB directory and the archive/ beside it,
/// `cp -a`) opened at its new path is refused with what applies to it: delete the owner file
/// to make the copied archive its own (QA52 F6: it was told to give the store an archive_dir of
/// its own, which it had); done, it opens and reads its archived partitions.
#[test]
fn a_copy_of_a_stores_directory_is_told_to_take_its_archive_over() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let Pair { _dir, root, store, twin } = p;
    drop(store);
    let copy = tempfile::tempdir().unwrap();
    let copied =
        std::process::Command::new("cp").arg("-a").arg(_dir.path().join("db")).arg(&root).arg(copy.path()).status();
    assert!(copied.unwrap().success());
    let (db, archive) = (copy.path().join("db"), copy.path().join("archive"));
    let owner = std::fs::canonicalize(_dir.path().join("db")).unwrap();
    let ours = std::fs::canonicalize(copy.path()).unwrap().join("db");
    let file = archive.join(bucketer::archive::OWNER_FILE);
    let refused = match Store::open(&db, config(Some(&archive))) {
        Ok(_) => panic!("the copy opened with the archive claimed by the store it was copied from"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        refused,
        format!(
            "archive: {archive} is the archive of the store in {owner} ({file} says so), and it is the archive/ \
             beside this store ({ours}): a copy of that store's data directory, or that store moved here? Delete \
             {file} to make it this store's",
            archive = archive.display(),
            owner = owner.display(),
            file = file.display(),
            ours = ours.display(),
        )
    );
    std::fs::remove_file(&file).unwrap();
    let store = Store::open(&db, config(Some(&archive))).unwrap();
    let jan1 = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    for device in DEVICES {
        assert_eq!(store.read_range(T, device, jan1).unwrap(), twin.read_range(T, device, jan1).unwrap(), "{device}");
        assert_eq!(store.read_range(T, device, jan1).unwrap().map(|r| r.len()), Some(9), "{device}");
    }
}

/// An archive root belongs to one store: another store opened with it (a checkpoint restored
/// with the live store's `archive_dir`, a new store pointed at an existing archive) is refused
/// and deletes nothing, where it deleted every file of the other's as a leftover; so is a new
/// store at a root holding part files that no owner file claims (an archive made before it).
#[test]
fn another_store_cannot_open_with_a_stores_archive() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let before = files(&p.root);
    assert_eq!(before.len(), 2);
    let owner_file = p.root.join(bucketer::archive::OWNER_FILE);
    let owner = std::fs::canonicalize(p._dir.path().join("db")).unwrap();
    assert_eq!(std::fs::read_to_string(&owner_file).unwrap(), format!("{}\n", owner.display()));
    let other = tempfile::tempdir().unwrap();
    let refused = |db: &str| match Store::open(&other.path().join(db), config(Some(&p.root))) {
        Ok(_) => panic!("a second store opened with the archive of the first"),
        Err(e) => e.to_string(),
    };
    let ours = std::fs::canonicalize(other.path()).unwrap().join("db");
    assert_eq!(
        refused("db"),
        format!(
            "archive: {root} is the archive of the store in {owner} ({file} says so), not of this one ({ours}): two \
             stores cannot share an archive (each would delete the other's files). Give this store its own \
             storage.archive_dir (a restored checkpoint: \"\" for the archive/ inside its data_dir); if this store \
             moved here from {owner}, delete {file}",
            root = p.root.display(),
            owner = owner.display(),
            file = owner_file.display(),
            ours = ours.display(),
        )
    );
    assert_eq!(files(&p.root), before);
    std::fs::remove_file(&owner_file).unwrap();
    let err = refused("db2");
    assert!(
        err.contains("holds archive files")
            && err.ends_with(
                "but this store has archived nothing: another store's archive, or the archive of a store whose \
             RocksDB directory was lost and made anew? Give this store its own storage.archive_dir (or, if they are \
             what this store's first spill left when it was cut short, delete them)"
            ),
        "{err}"
    );
    assert_eq!(files(&p.root), before);
    let Pair { _dir, root, store, twin } = p;
    drop(store);
    // Opened with another archive directory, which holds none of its files (a
    // `storage.archive_dir` left out, here an unowned archive of an older build's): it opens,
    // but does not claim that directory, nor sweep it (it deleted the part files there as
    // leftovers), nor spill into it.
    let wrong = tempfile::tempdir().unwrap();
    let theirs = wrong.path().join("table=other/partition=2024-01-01");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::copy(root.join(&before[0]), theirs.join("part-0.parquet")).unwrap();
    let stray = Store::open(&_dir.path().join("db"), config(Some(wrong.path()))).unwrap();
    assert!(!wrong.path().join(bucketer::archive::OWNER_FILE).exists());
    let err = stray.spill_expired_partitions(JAN1 + 6 * DAY_MS, |_| ()).unwrap_err().to_string();
    assert!(err.ends_with("is storage.archive_dir the directory it spilled to?)"), "{err}");
    drop(stray);
    assert_eq!(files(wrong.path()), ["table=other/partition=2024-01-01/part-0.parquet"]);
    // The store whose manifest names them claims the root again at its next open.
    let store = Store::open(&_dir.path().join("db"), config(Some(&root))).unwrap();
    assert_eq!(std::fs::read_to_string(&owner_file).unwrap(), format!("{}\n", owner.display()));
    let p = Pair { _dir, root, store, twin };
    p.assert_same("reopened");
}

/// A store made anew where one was (its RocksDB directory lost or wiped, the archive on a disk
/// of its own) has the owner's path, another id and an empty manifest: refused by the id file,
/// where it deleted every file of the archive as a leftover at start; and without an id file
/// (a root claimed by a build before it), by its files.
#[test]
fn a_store_made_anew_where_one_was_cannot_take_its_archive() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let before = files(&p.root);
    assert_eq!(before.len(), 2);
    let Pair { _dir, root, store, twin: _ } = p;
    drop(store);
    let db = _dir.path().join("db");
    for round in ["the id file kept", "the id file gone"] {
        std::fs::remove_dir_all(&db).unwrap();
        let err = refused(&db, &root, &format!("{round}: a new store took the archive"));
        let why = match round {
            "the id file kept" => "or a store made anew where its RocksDB directory was?",
            _ => {
                "but this store has archived nothing: another store's archive, or the archive of a store whose \
                  RocksDB directory was lost and made anew?"
            }
        };
        assert!(err.contains(why), "{round}: {err}");
        assert_eq!(files(&root), before, "{round}: nothing deleted");
        let _ = std::fs::remove_file(root.join(bucketer::archive::OWNER_ID_FILE));
    }
}

/// A checkpoint restored in place of its store (at the store's RocksDB path) with the store's
/// archive directory is refused, the archive naming the store's id and the checkpoint having
/// its own: it passed the path check, deleted as leftovers the part files written after the
/// checkpoint, and then could not read the partition. With its own `archive/` it opens and
/// reads what the store held at the checkpoint; the store put back opens with its archive; with
/// the id file deleted, the checkpoint takes the archive over.
#[test]
fn a_checkpoint_restored_in_place_cannot_take_the_stores_archive() {
    let p = Pair::new();
    p.write(days());
    p.rollups();
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let db = p._dir.path().join("db");
    let id = p.store.store_id().unwrap();
    let id_file = p.root.join(bucketer::archive::OWNER_ID_FILE);
    assert_eq!(std::fs::read_to_string(&id_file).unwrap(), format!("{id}\n"));
    let cp = p._dir.path().join("checkpoints").join("first");
    p.store.checkpoint(&cp).unwrap();
    // After the checkpoint Jan 1 takes a late reading (the twin does not: it stays the
    // checkpoint's): part 1 written, part 0 swept.
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + HOUR_MS, 999) };
    p.store.write(vec![late], &[]).unwrap();
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(p.store.spill_expired_partitions(JAN5, |_| ()).unwrap().leftovers_removed, 1);
    let live = files(&p.root);
    assert_eq!(
        live,
        [
            "table=fleet.trucks/partition=2024-01-01/part-1.parquet",
            "table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );

    let Pair { _dir, root, store, twin } = p;
    drop(store);
    std::fs::rename(&db, _dir.path().join("db.old")).unwrap();
    std::fs::rename(cp.join("rocksdb"), &db).unwrap();
    let err = refused(&db, &root, "restored in place with the store's archive");
    let restored = std::fs::read_to_string(db.join(bucketer::archive::STORE_ID_FILE)).unwrap();
    let restored = restored.trim_end();
    assert_ne!(restored, id);
    assert_eq!(
        err,
        format!(
            "archive: {root} is the archive of the store with id {id} ({file} says so), and this store's id is \
             {restored} (HOURGLASS-STORE-ID in its RocksDB directory): a checkpoint or a copy restored in place of \
             the store that archived there, or a store made anew where its RocksDB directory was? Its manifest may \
             name files that store has replaced since (2 named, 1 not in this archive), and it would delete that \
             store's newer files as leftovers. Start it with storage.archive_dir = \"\" (the archive/ its \
             checkpoint holds); if it is meant to take this archive over, copy into it the files it lacks from the \
             archive/ its checkpoint holds (they are unreadable otherwise), then delete {file}",
            root = root.display(),
            file = id_file.display(),
        )
    );
    assert_eq!(files(&root), live, "nothing deleted");
    let copy = Store::open(&db, config(Some(&cp.join("archive")))).unwrap();
    assert_same_reads(&copy, &twin, "the checkpoint restored in place with its own archive");
    drop(copy);
    std::fs::rename(&db, _dir.path().join("db.checkpoint")).unwrap();
    std::fs::rename(_dir.path().join("db.old"), &db).unwrap();
    let store = Store::open(&db, config(Some(&root))).unwrap();
    assert_eq!(store.archived_partition(T, DAY1).unwrap().part, 1);
    assert_eq!(files(&root), live);
    let generation = root.join(bucketer::archive::GENERATION_FILE);
    assert_eq!(generation_at(&generation), 3);

    // Taken over on purpose, the id file deleted: the checkpoint opens with the store's archive
    // at once (its generation, behind the archive's, goes with the decision), and deletes the
    // file the store wrote since as a leftover.
    drop(store);
    std::fs::rename(&db, _dir.path().join("db.live")).unwrap();
    std::fs::rename(_dir.path().join("db.checkpoint"), &db).unwrap();
    std::fs::remove_file(&id_file).unwrap();
    let taken = Store::open(&db, config(Some(&root))).unwrap();
    assert_eq!(std::fs::read_to_string(&id_file).unwrap(), format!("{restored}\n"));
    assert_eq!(generation_at(&generation), 2);
    assert_eq!(files(&root), ["table=fleet.trucks/partition=2024-01-02/part-0.parquet"]);
    drop(taken);
}

/// The store at `db` opened with the archive at `root` (or its error), with the lines it logs at
/// ERROR.
fn open_logged(db: &Path, root: &Path) -> (bucketer::Result<Store>, Vec<String>) {
    logged::logged(tracing::Level::ERROR, || Store::open(db, config(Some(root))))
}

/// A store that finds some of the files its manifest names gone from its archive directory at
/// open says so at ERROR, naming them, and goes on with the rest (reads of the lost partition
/// fail; the others are read); a directory that holds none of them is not taken for its own.
#[test]
fn a_start_without_some_archive_files_names_them() {
    let p = Pair::new();
    p.write(days());
    p.rollups();
    assert_eq!(p.store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    let Pair { _dir, root, store, twin } = p;
    drop(store);
    let db = _dir.path().join("db");
    let jan1 = "table=fleet.trucks/partition=2024-01-01/part-0.parquet";
    let jan1_bytes = std::fs::read(root.join(jan1)).unwrap();
    std::fs::remove_file(root.join(jan1)).unwrap();
    // The ERROR of a start without `missing` of the two files, `files` those it names.
    let gone = |missing: usize, files: &str| {
        format!(
            "ERROR bucketer::archive: archive files this store's manifest names are not in its archive directory: \
             reads of their partitions fail, and their hours are not rolled up, until the files are put back \
             missing={missing} named=2 archive_dir={} files=[{files}]",
            root.display()
        )
    };
    let (store, errors) = open_logged(&db, &root);
    let store = store.unwrap();
    assert_eq!(errors, [gone(1, &format!("\"{jan1}\""))]);
    assert_eq!(store.archive_held().files_missing, 1);
    assert_eq!(files(&root), ["table=fleet.trucks/partition=2024-01-02/part-0.parquet"]);
    let day = |d: i64| TimeRange { start: JAN1 + d * DAY_MS, end: JAN1 + (d + 1) * DAY_MS };
    assert!(store.read_range(T, "truck_a", day(0)).is_err());
    assert_eq!(store.read_range(T, "truck_a", day(1)).unwrap(), twin.read_range(T, "truck_a", day(1)).unwrap());
    drop(store);

    // Every file gone, the owner file left: said the same way (it was said by nothing).
    let jan2 = "table=fleet.trucks/partition=2024-01-02/part-0.parquet";
    let jan2_bytes = std::fs::read(root.join(jan2)).unwrap();
    std::fs::remove_file(root.join(jan2)).unwrap();
    let (store, errors) = open_logged(&db, &root);
    assert_eq!(errors, [gone(2, &format!("\"{jan1}\", \"{jan2}\""))]);
    assert_eq!(store.unwrap().archive_held().files_missing, 2);

    // The owner file gone too: not taken for the store's directory, left unclaimed.
    let owner = root.join(bucketer::archive::OWNER_FILE);
    std::fs::remove_file(&owner).unwrap();
    let (store, errors) = open_logged(&db, &root);
    assert_eq!(store.unwrap().archive_held().files_missing, 2);
    assert_eq!(
        errors,
        [format!(
            "ERROR bucketer::archive: this store has archived partitions, and none of their files is in its archive \
             directory: is storage.archive_dir the directory it spilled to? Reads of archived partitions fail until \
             it is (the directory is not claimed for this store) archive_dir={} partitions=2",
            root.display()
        )]
    );
    assert!(!owner.exists());

    // Put back: claimed again, said no more. Into the directories named: the starts kept them
    // (QA47 N2: the sweep removed them, empty, and putting a file back failed).
    for (rel, bytes) in [(jan1, jan1_bytes), (jan2, jan2_bytes)] {
        std::fs::write(root.join(rel), bytes).unwrap();
    }
    let (store, errors) = open_logged(&db, &root);
    let store = store.unwrap();
    assert_eq!(errors, Vec::<String>::new());
    assert!(owner.exists());
    assert_eq!(store.archive_held().files_missing, 0);
    assert_same_reads(&store, &twin, "the files put back");
    // Looked at again by each spill run.
    std::fs::remove_file(root.join(jan2)).unwrap();
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(store.archive_held().files_missing, 1);
    assert!(root.join(jan2).parent().unwrap().is_dir(), "the directory to put it back into");
}

/// The count of a generation file's text (`COUNT TAG`), checked for its form.
fn count_of(text: &str) -> u64 {
    let (count, tag) = text.trim_end().split_once(' ').unwrap_or_else(|| panic!("{text:?}"));
    assert!(tag.len() == 16 && u64::from_str_radix(tag, 16).is_ok_and(|t| t != 0), "{text:?}");
    count.parse().unwrap()
}

/// The count of the generation file at `path`.
fn generation_at(path: &Path) -> u64 {
    count_of(&std::fs::read_to_string(path).unwrap())
}

/// The error of opening the store at `db` with the archive at `root`, which must be refused
/// (`taken` says what an open would have done).
fn refused(db: &Path, root: &Path, taken: &str) -> String {
    match Store::open(db, config(Some(root))) {
        Ok(_) => panic!("{taken}"),
        Err(e) => e.to_string(),
    }
}

/// `cp -a from to`: a copy as an operator takes one of a stopped store.
fn copy_dir(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(status.success(), "cp -a {} {}", from.display(), to.display());
}

/// A cold copy of a store's RocksDB directory (`cp -a` while it is stopped) restored in place,
/// with the store's archive directory outside it, has the store's path and id: it is refused by
/// the archive's generation, which the store's spills moved past the copy's, where it opened,
/// deleted the newer Jan 1 file as a leftover and could not read Jan 1 (its own file replaced).
/// With the archive directory copied with it, it opens and reads what the store held then; the
/// store with that older archive is refused in turn. A generation file behind the store (a crash
/// after a commit) is brought up at the next open.
#[test]
fn a_cold_copy_restored_in_place_cannot_take_the_stores_newer_archive() {
    let p = Pair::new();
    p.write(days());
    p.rollups();
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let generation = p.root.join(bucketer::archive::GENERATION_FILE);
    // Jan 1 and Jan 2 spilled, a commit each.
    assert_eq!(generation_at(&generation), 2);
    let Pair { _dir, root, store, twin } = p;
    drop(store);
    let db = _dir.path().join("db");
    let (db_copy, root_copy) = (_dir.path().join("db.copy"), _dir.path().join("archive.copy"));
    copy_dir(&db, &db_copy);
    copy_dir(&root, &root_copy);
    // After the copy Jan 1 takes a late reading (the twin does not: it stays the copy's): part 1
    // written, part 0 swept.
    let store = Store::open(&db, config(Some(&root))).unwrap();
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + HOUR_MS, 999) };
    store.write(vec![late], &[]).unwrap();
    store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().leftovers_removed, 1);
    assert_eq!(generation_at(&generation), 3);
    drop(store);
    let live = files(&root);
    assert_eq!(
        live,
        [
            "table=fleet.trucks/partition=2024-01-01/part-1.parquet",
            "table=fleet.trucks/partition=2024-01-02/part-0.parquet"
        ]
    );

    std::fs::rename(&db, _dir.path().join("db.old")).unwrap();
    copy_dir(&db_copy, &db);
    let err = refused(&db, &root, "an older copy restored in place took the store's newer archive");
    assert_eq!(
        err,
        format!(
            "archive: {root} is at generation 3 ({file} says so: the manifest of the store that archived there \
             changed 3 times), and this store's manifest at 2: this store's RocksDB directory is an older copy of \
             that store (restored from a copy of a stopped store, without the archive directory copied with it)? 1 \
             of the 2 files its manifest names are gone (replaced since), and it would delete the files written \
             since as leftovers. Restore it with the archive directory copied with it; to run it on this archive \
             anyway (the partitions whose files are gone unreadable, the newer files deleted), delete {file}",
            root = root.display(),
            file = generation.display(),
        )
    );
    assert_eq!(files(&root), live, "nothing deleted");
    assert_eq!(generation_at(&generation), 3);

    // The archive copied with it, in place of the store's.
    std::fs::rename(&root, _dir.path().join("archive.old")).unwrap();
    std::fs::rename(&root_copy, &root).unwrap();
    let copy = Store::open(&db, config(Some(&root))).unwrap();
    assert_same_reads(&copy, &twin, "the copy restored in place with its archive");
    drop(copy);

    // The other way round: the store put back with that older archive (at generation 2, behind
    // the store's by one, as a crash leaves it), which lacks Jan 1's part 1 and holds its part 0,
    // which the store would delete as a leftover: refused, nothing deleted.
    let (live_db, copy_db) = (_dir.path().join("db.old"), _dir.path().join("db.copy-run"));
    std::fs::rename(&db, &copy_db).unwrap();
    std::fs::rename(&live_db, &db).unwrap();
    let older = files(&root);
    assert_eq!(older[0], "table=fleet.trucks/partition=2024-01-01/part-0.parquet");
    let err = refused(&db, &root, "the store took an older archive");
    assert_eq!(
        err,
        format!(
            "archive: {root} is at generation 2 ({file} says so), behind this store's manifest at 3, and 1 of the 2 \
             files that manifest names are not in it: an archive restored from an older copy than this store's \
             RocksDB directory? The store would delete its older files as leftovers (the only copies of the \
             partitions rewritten since). Restore the archive copied with this RocksDB directory; to start anyway \
             (the partitions whose files are not there unreadable, the older files deleted), delete {file}",
            root = root.display(),
            file = generation.display(),
        )
    );
    assert_eq!(files(&root), older, "nothing deleted");

    // Nor once the copy has run on that archive to the store's count by a commit of its own (a
    // late Jan 2 reading rewritten: generation 3 too), which its tag tells (QA45 N1: the store
    // took it, deleting the copy's files).
    std::fs::rename(&db, &live_db).unwrap();
    std::fs::rename(&copy_db, &db).unwrap();
    let copy = Store::open(&db, config(Some(&root))).unwrap();
    let late =
        DeviceReading { table: T.into(), device: "truck_b".into(), reading: reading(JAN1 + DAY_MS + HOUR_MS, 998) };
    copy.write(vec![late], &[]).unwrap();
    assert_eq!(copy.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 1);
    drop(copy);
    assert_eq!(generation_at(&generation), 3);
    std::fs::rename(&db, &copy_db).unwrap();
    std::fs::rename(&live_db, &db).unwrap();
    let theirs = files(&root);
    let err = refused(&db, &root, "the store took an archive another run changed");
    assert_eq!(
        err,
        format!(
            "archive: {root} and this store's manifest are both at generation 3 ({file} says so) by other changes: \
             the archive and this store's RocksDB directory were each run on its own since a common copy (one \
             restored and run, then the other put back?). 1 of the 2 files this store's manifest names are not in \
             it, and it would delete the files the other run wrote as leftovers. Restore the archive that goes with \
             this RocksDB directory; to start anyway (the partitions whose files are not there unreadable, the other \
             run's files deleted), delete {file}",
            root = root.display(),
            file = generation.display(),
        )
    );
    assert_eq!(files(&root), theirs, "nothing deleted");

    // The store with its own archive, a crash having left the file behind (every file there).
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::rename(_dir.path().join("archive.old"), &root).unwrap();
    std::fs::write(&generation, "2\n").unwrap();
    let store = Store::open(&db, config(Some(&root))).unwrap();
    assert_eq!(generation_at(&generation), 3);
    assert_eq!(store.archived_partition(T, DAY1).unwrap().part, 1);
    assert_eq!(files(&root), live);
}

/// Writes `days()` to both stores, rolls them up, archives the days before Jan 5 and cuts the
/// store's Jan 1 file short; returns the store's dirty marks then (the last hour's, not due
/// yet), the file and its whole bytes.
fn damage_jan1(p: &Pair) -> (usize, std::path::PathBuf, Vec<u8>) {
    p.write(days());
    p.rollups();
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let open = p.store.dirty_marks().unwrap();
    let file = p.root.join("table=fleet.trucks/partition=2024-01-01/part-0.parquet");
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(&file, &whole[..1000]).unwrap();
    (open, file, whole)
}

/// Writes `days()` to both stores, archives the days before Jan 5 and copies the store's Jan 2
/// file in place of its Jan 1 file; returns that file and its own bytes.
fn jan2_in_jan1s_place(p: &Pair) -> (PathBuf, Vec<u8>) {
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let jan1 = p.root.join("table=fleet.trucks/partition=2024-01-01/part-0.parquet");
    let whole = std::fs::read(&jan1).unwrap();
    std::fs::copy(p.root.join("table=fleet.trucks/partition=2024-01-02/part-0.parquet"), &jan1).unwrap();
    (jan1, whole)
}

/// How Jan 2's file at `file`, Jan 1's place, is refused.
fn jan2_refused(file: &Path) -> String {
    format!(
        "{}: not the file archived for this partition: it holds 27 rows from 2024-01-02T00:01:00Z to \
         2024-01-02T23:59:00Z, and the archive's manifest says 27 rows from 2024-01-01T00:01:00Z to \
         2024-01-01T23:59:00Z (a file of another partition or part copied in its place? put back this partition's file)",
        file.display()
    )
}

/// A whole Parquet file of another partition put in a partition's place (a restore by hand into
/// the wrong directory) is refused, naming what it holds and what the manifest says: it was
/// read as this partition's, its readings served from outside the range, twice over a range
/// covering both days (QA57 F6). Put back, the partition reads as its twin's.
#[test]
fn another_partitions_file_in_a_partitions_place_is_refused() {
    let p = Pair::new();
    let (jan1, whole) = jan2_in_jan1s_place(&p);
    let two_days = TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS };
    let err = p.store.read_range(T, "truck_a", two_days).unwrap_err().to_string();
    assert!(err.ends_with(&jan2_refused(&jan1)), "{err}");
    std::fs::write(&jan1, &whole).unwrap();
    assert_eq!(p.store.read_range(T, "truck_a", two_days).unwrap(), p.twin.read_range(T, "truck_a", two_days).unwrap());
}

/// A late readings' rewrite of an archived partition whose file is another partition's (put
/// in its place by hand) is refused as its reads are: the rewrite took the other partition's
/// rows into the partition's next part and deleted its own file, its readings lost for good
/// (QA61 F2). The file is left as it is, the late reading waits in RocksDB, and once the
/// partition's own file is back the next run merges it.
#[test]
fn a_rewrite_refuses_another_partitions_file_in_its_place() {
    let p = Pair::new();
    let (jan1, whole) = jan2_in_jan1s_place(&p);
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + 30_000, 1001) };
    p.write(vec![late]);
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert!(report.spilled.is_empty(), "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    let (table, partition, error) = &report.failed[0];
    assert_eq!((table.as_str(), *partition), (T, DAY1));
    assert!(error.ends_with(&jan2_refused(&jan1)), "{error}");
    assert_eq!(p.store.archived_partition(T, DAY1).unwrap().part, 0);
    let jan2 = std::fs::read(p.root.join("table=fleet.trucks/partition=2024-01-02/part-0.parquet")).unwrap();
    assert_eq!(std::fs::read(&jan1).unwrap(), jan2, "left as it is");
    std::fs::write(&jan1, &whole).unwrap();
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(
        report.spilled.iter().map(|s| (s.partition, s.rows, s.rows_from_archive)).collect::<Vec<_>>(),
        vec![(DAY1, 28, 27)]
    );
    p.rollups();
    p.assert_same("after the partition's own file was put back and rewritten");
}

/// An archived hour whose file cannot be read (damaged) stops its own roll-up, not the pass:
/// its mark stays for the next pass while the other hours are rolled up; once the file is
/// whole again the hour is rolled up too. (Before, every pass failed on it, and no hour of the
/// store was rolled up.)
#[test]
fn a_damaged_archive_file_stops_its_hours_roll_up_only() {
    let p = Pair::new();
    let (open, file, whole) = damage_jan1(&p);
    // A late reading in the archived Jan 1 and one in the hot Jan 4, both in hours rolled up.
    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + 30 * 60_000, 9) };
    let jan4_7h = JAN1 + 3 * DAY_MS + 7 * HOUR_MS;
    let hot = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(jan4_7h + 30 * 60_000, 10) };
    p.write(vec![late, hot]);
    let s = p.store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((s.hours, s.unreadable), (1, 1), "{s:?}");
    let reason = s.unreadable_reason.unwrap();
    assert!(reason.contains("part-0.parquet"), "{reason}");
    assert_eq!(p.store.dirty_marks().unwrap(), open + 1);
    // The hot hour is rolled up as its twin's.
    let hot_hour = TimeRange { start: jan4_7h, end: jan4_7h + HOUR_MS };
    let rolled = |s: &Store| s.rollups(T, "truck_a", Level::Hour, hot_hour).unwrap().unwrap();
    p.twin.process_rollups(0, 1_000_000).unwrap();
    assert_eq!(rolled(&p.store).len(), 1);
    assert_eq!(rolled(&p.store), rolled(&p.twin));
    // Whole again: the next pass rolls the late hour up, and everything is the twin's.
    std::fs::write(&file, &whole).unwrap();
    let s = p.store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((s.hours, s.unreadable), (1, 0));
    assert_eq!(p.store.dirty_marks().unwrap(), open);
    p.assert_same("after the file was mended");
}

/// Hours archived before any roll-up (a backlog's days spilled before the roll-up stage reached
/// them) are rolled up from one read of each device's archived day, its hours cut from it,
/// each with its late readings from RocksDB: a pass over Jan 1–2 (three hours a device-day,
/// three devices, late readings of truck_a into an archived hour and into an hour of Jan 2
/// with none archived) reads the archive 6 times, where it read it once an hour (19), and
/// every record is the twin's. Two roll-up workers: the pass's 34 marks split in two shares
/// of 17 would cut truck_c's Jan 2 (marks 16–18), read by both; a share ends at a day's end.
#[test]
fn archived_hours_are_rolled_up_from_one_read_of_each_device_day() {
    let p = Pair::with(|root| StoreConfig { rollup_workers: 2, ..config(root) });
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(files(&p.root).len(), 2, "Jan 1 and 2 archived");
    let late = |ts: i64, k: i64| DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(ts, k) };
    p.write(vec![late(JAN1 + 7 * HOUR_MS + 30 * 60_000, 90), late(JAN1 + DAY_MS + 12 * HOUR_MS, 91)]);
    let reads = || p.store.stats().archive_device_reads.load(std::sync::atomic::Ordering::Relaxed);
    let before = reads();
    let s = p.store.process_rollups(0, 1_000_000).unwrap();
    // 4 days × 3 hours × 3 devices (but Jan 4 23:00, which the watermark, 23:59, has not
    // ended), and truck_a's Jan 2 12:00.
    assert_eq!((s.hours, s.unreadable), (34, 0), "{s:?}");
    assert_eq!(reads() - before, 6);
    p.twin.process_rollups(0, 1_000_000).unwrap();
    let hour = |s: &Store, start: i64| {
        let range = TimeRange { start, end: start + HOUR_MS };
        s.rollups(T, "truck_a", Level::Hour, range).unwrap().unwrap()[0].1.fields["speed"].exact.count()
    };
    // Jan 1 07:00: its three archived readings and the late one; Jan 2 12:00: the late one.
    assert_eq!((hour(&p.store, JAN1 + 7 * HOUR_MS), hour(&p.store, JAN1 + DAY_MS + 12 * HOUR_MS)), (4, 1));
    p.assert_same("rolled up from the archive");
}

/// A day past its table's hour roll-up retention, made again from all its hours' buckets when a
/// late reading reaches it, waits while one of them is archived in a file that cannot be read
/// (its mark stays, nothing of it is written), and is made once the file is whole, as its
/// twin's without an archive. (Hour partitions: the late reading's own hour reads well.)
#[test]
fn a_day_made_from_its_buckets_waits_for_an_unreadable_archive() {
    let spec = TableSpec {
        partition: PartitionSize::Hour,
        rollup_retention: bucketer::RollupRetention { hour_ms: Some(2 * DAY_MS as u64), day_ms: None },
        ..spec()
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    let store = Store::open(&dir.path().join("db"), config(Some(&root))).unwrap();
    let twin = Store::open(&dir.path().join("twin"), config(None)).unwrap();
    store.define_table_with(T, &spec).unwrap();
    // Without an archive, a hot retention deletes: the twin keeps everything in RocksDB.
    twin.define_table_with(T, &TableSpec { hot_retention_ms: None, cold_retention_ms: None, ..spec.clone() }).unwrap();
    let p = Pair { _dir: dir, root, store, twin };
    // Rolled up as on Jan 5: Jan 1–3 past the hour retention, made from their buckets.
    let pass = |s: &Store| s.process_rollups_at(0, 1_000_000, JAN5).unwrap();
    p.write(days());
    for s in [&p.store, &p.twin] {
        assert_eq!(pass(s).days_from_buckets, 3 * DEVICES.len());
    }
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let file = p.root.join("table=fleet.trucks/partition=2024-01-01T07/part-0.parquet");
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(&file, &whole[..1000]).unwrap();
    // A late reading at Jan 1 05:30, an hour that had no reading (none archived): the day's
    // hour 07 cannot be read.
    let late = DeviceReading {
        table: T.into(),
        device: "truck_a".into(),
        reading: reading(JAN1 + 5 * HOUR_MS + 1_800_000, 9),
    };
    p.write(vec![late]);
    let marks = p.store.dirty_marks().unwrap();
    let day_of = |s: &Store| s.rollups(T, "truck_a", Level::Day, ALL).unwrap().unwrap();
    let before = day_of(&p.store);
    let s = pass(&p.store);
    assert_eq!((s.hours, s.unreadable, s.days_from_buckets), (0, 1, 0), "{s:?}");
    assert!(s.unreadable_reason.as_deref().is_some_and(|r| r.contains("part-0.parquet")), "{s:?}");
    assert_eq!(p.store.dirty_marks().unwrap(), marks);
    assert_eq!(day_of(&p.store), before);
    // Whole again: made, and equal to the twin's.
    std::fs::write(&file, &whole).unwrap();
    let s = pass(&p.store);
    assert_eq!((s.hours, s.unreadable, s.days_from_buckets), (1, 0, 1), "{s:?}");
    assert_eq!(pass(&p.twin).days_from_buckets, 1);
    assert_eq!(p.store.dirty_marks().unwrap(), marks - 1);
    let jan1 = |s: &Store| day_of(s).into_iter().find(|(start, _)| *start == JAN1).unwrap().1;
    assert_eq!(jan1(&p.store).fields["speed"].exact.count(), jan1(&p.twin).fields["speed"].exact.count());
    assert_eq!(jan1(&p.store).fields["speed"].exact.count(), 10);
    assert_eq!(day_of(&p.store), day_of(&p.twin));
}

/// Hours whose archive cannot be read do not hold back the others when they would fill a
/// pass's budget: a pass gives it to the other due hours first and tries the unreadable ones in
/// the room left. (Before, the oldest unreadable hours took the whole budget of every pass, and
/// no later hour of their table was rolled up until the file was mended.)
#[test]
fn unreadable_hours_do_not_take_the_budget_of_every_pass() {
    let p = Pair::new();
    let (open, file, whole) = damage_jan1(&p);
    // Late readings in two archived Jan 1 hours (of two devices: a device's archived day is
    // taken whole), and one in the hot Jan 4 (all rolled up before).
    let at = |device: &str, ts: i64, v: i64| DeviceReading {
        table: T.into(),
        device: device.into(),
        reading: reading(ts, v),
    };
    let jan4_7h = JAN1 + 3 * DAY_MS + 7 * HOUR_MS;
    p.write(vec![
        at("truck_a", JAN1 + 30 * 60_000, 9),
        at("truck_b", JAN1 + HOUR_MS + 30 * 60_000, 9),
        at("truck_a", jan4_7h + 30 * 60_000, 10),
    ]);
    let pass = |budget: usize| {
        let s = p.store.process_rollups(0, budget).unwrap();
        (s.hours, s.unreadable, p.store.dirty_marks().unwrap() - open)
    };
    // The oldest hour first: (hours done, unreadable, marks left).
    assert_eq!(pass(1), (0, 1, 3));
    // Then the hours not known to be unreadable: the second Jan 1 hour, then the hot one.
    assert_eq!(pass(1), (0, 1, 3));
    assert_eq!(pass(1), (1, 0, 2));
    let hot_hour = TimeRange { start: jan4_7h, end: jan4_7h + HOUR_MS };
    let rolled = |s: &Store| s.rollups(T, "truck_a", Level::Hour, hot_hour).unwrap().unwrap();
    p.twin.process_rollups(0, 1_000_000).unwrap();
    assert_eq!(rolled(&p.store), rolled(&p.twin));
    // Only unreadable hours left: a pass tries them again, as much as its budget allows.
    assert_eq!(pass(1), (0, 1, 2));
    assert_eq!(pass(5), (0, 2, 2));
    // Whole again: they are rolled up, and everything is the twin's.
    std::fs::write(&file, &whole).unwrap();
    assert_eq!(pass(5), (2, 0, 0));
    p.assert_same("after the file was mended");
}

/// A partition that cannot be archived (here: a field named like the archive's `device`
/// column) stays in RocksDB, is reported with the reason, and does not hold up other tables.
#[test]
fn a_partition_that_cannot_be_archived_stays_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    let store = Store::open(&dir.path().join("db"), config(Some(&root))).unwrap();
    let hot = TableSpec { hot_retention_ms: Some(DAY_MS as u64), ..TableSpec::default() };
    for t in ["a.bad", "b.good"] {
        store.define_table_with(t, &hot).unwrap();
    }
    let bad = Reading::new(JAN1, vec![(Arc::<str>::from("device"), 1.0)]);
    let good = Reading::new(JAN1, vec![(Arc::<str>::from("v"), 2.0)]);
    store
        .write(
            vec![
                DeviceReading { table: "a.bad".into(), device: "d".into(), reading: bad.clone() },
                DeviceReading { table: "b.good".into(), device: "d".into(), reading: good },
            ],
            &[],
        )
        .unwrap();
    let report = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(report.spilled.iter().map(|s| s.table.as_str()).collect::<Vec<_>>(), ["b.good"]);
    assert_eq!(report.failed.len(), 1);
    let (table, partition, error) = &report.failed[0];
    assert_eq!((table.as_str(), *partition), ("a.bad", DAY1));
    assert!(error.ends_with("the table has a field named `device`, which is an archive key column"), "{error}");
    assert_eq!(store.read_range("a.bad", "d", ALL).unwrap(), Some(vec![bad]));
    assert_eq!(store.archived_partition("a.bad", DAY1), None);
    // The check comes before any file is written; the next run fails the same way.
    let again = store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!((again.leftovers_removed, again.failed.len()), (0, 1));
    assert_eq!(files(&root), ["table=b.good/partition=2024-01-01/part-0.parquet"]);
}

/// A spilled partition's SST files are freed at the spill, where the range delete alone would
/// leave them until a compaction reached them: Jan 1 compacted alone into the bottommost level,
/// Jan 4 flushed beside it, then Jan 1 spilled. Reads stay the twin's.
#[test]
fn a_spilled_partition_frees_its_files_at_once() {
    let p = Pair::new();
    let (jan1, later): (Vec<_>, Vec<_>) = days().into_iter().partition(|r| r.reading.ts < JAN1 + DAY_MS);
    let jan4: Vec<_> = later.into_iter().filter(|r| r.reading.ts >= JAN1 + 3 * DAY_MS).collect();
    p.write(jan1);
    p.store.compact().unwrap();
    let jan1_bytes = p.store.bucket_sst_bytes().unwrap();
    p.write(jan4);
    p.store.flush().unwrap();
    let both = p.store.bucket_sst_bytes().unwrap();
    assert!(jan1_bytes > 0 && both > jan1_bytes, "{jan1_bytes} then {both} bytes");
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let spilled: Vec<(i64, u64)> = report.spilled.iter().map(|s| (s.partition, s.rows)).collect();
    assert_eq!(spilled, vec![(DAY1, 27)]);
    assert_eq!(p.store.bucket_sst_bytes().unwrap(), both - jan1_bytes);
    p.assert_same("after the spill");
}

/// A spill settles the `latest` entries still taken from a bucket of its partition (hours not
/// rolled up yet: writes into a device-hour after the one that marked it leave the entry at
/// that write's reading), in the WriteBatch that deletes the partition from RocksDB. Each
/// device's latest stays its newest reading, the twin's.
#[test]
fn a_spill_keeps_each_newest_reading_as_the_latest() {
    use std::sync::atomic::Ordering::Relaxed;
    let p = Pair::new();
    // Jan 1 07:00, minutes 1, 2 and 3, one batch a minute: the hour stays open, so only the
    // first batch writes the devices' `latest` entries.
    for m in 1..=3 {
        let rows = DEVICES
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceReading {
                table: T.into(),
                device: (*d).into(),
                reading: reading(JAN1 + 7 * HOUR_MS + m * 60_000, 10 * m + i as i64),
            })
            .collect();
        p.write(rows);
    }
    assert_eq!(p.store.stats().latest_operands.load(Relaxed), 3);
    let newest: Vec<Option<Reading>> =
        DEVICES.iter().map(|d| p.twin.read_range(T, d, ALL).unwrap().unwrap().pop()).collect();
    assert_eq!(
        newest.iter().map(|r| r.as_ref().map(|r| r.ts)).collect::<Vec<_>>(),
        vec![Some(JAN1 + 7 * HOUR_MS + 180_000); 3]
    );
    assert_eq!(p.store.latest(T, &DEVICES).unwrap(), Some(newest.clone()));
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let spilled: Vec<(i64, u64)> = report.spilled.iter().map(|s| (s.partition, s.rows)).collect();
    assert_eq!(spilled, vec![(DAY1, 9)]);
    assert_eq!(p.store.latest(T, &DEVICES).unwrap(), Some(newest));
    // The spill settled the three devices' entries.
    assert_eq!(p.store.stats().latest_operands.load(Relaxed), 6);
    p.assert_same("after the spill");
}

/// A checkpoint taken after a spill holds the store and the archive's files as they were: opened
/// as a store of its own (its `archive/` the archive), it reads exactly what the twin does,
/// which got the same writes up to the checkpoint, while the store goes on: a late reading
/// merged into an archived partition (a new file), a spill and a cold delete of the files it
/// links change nothing in it.
#[test]
fn a_checkpoint_holds_the_store_and_its_archive_as_they_were() {
    let p = Pair::new();
    p.write(days());
    p.rollups();
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let cp = p._dir.path().join("checkpoints").join("first");
    let done = p.store.checkpoint(&cp).unwrap();
    assert_eq!((done.dir.as_path(), done.archive_files, done.archive_in_bucket), (cp.as_path(), 2, false));
    let archived = vec![
        "table=fleet.trucks/partition=2024-01-01/part-0.parquet".to_string(),
        "table=fleet.trucks/partition=2024-01-02/part-0.parquet".to_string(),
    ];
    assert_eq!(files(&cp.join("archive")), archived);
    let again = p.store.checkpoint(&cp).unwrap_err().to_string();
    assert_eq!(again, format!("checkpoint: {} exists already", cp.display()));

    let late = DeviceReading { table: T.into(), device: "truck_a".into(), reading: reading(JAN1 + HOUR_MS, 999) };
    p.store.write(vec![late], &[]).unwrap();
    p.store.spill_expired_partitions(JAN5 + DAY_MS, |_| ()).unwrap();
    assert_eq!(p.store.archived_partition(T, DAY1).unwrap().part, 1, "Jan 1 merged with the late reading");
    // At Jan 8 Jan 1 and 2 are past the cold retention (5 days): deleted, files and all.
    let report = p.store.spill_expired_partitions(JAN1 + 7 * DAY_MS, |_| ()).unwrap();
    assert_eq!(report.deleted, [(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    assert!(!files(&p.root).iter().any(|f| archived.contains(f)), "{:?}", files(&p.root));

    let copy = Store::open(&cp.join("rocksdb"), config(Some(&cp.join("archive")))).unwrap();
    assert_eq!(copy.archived_partitions(T).len(), 2);
    assert_same_reads(&copy, &p.twin, "the checkpoint");
    assert_eq!(files(&cp.join("archive")), archived);
}

/// A checkpoint that cannot be completed (an archived file that cannot be linked or copied: a
/// directory in its place here) fails with the file named, and leaves no directory that could
/// pass for a backup.
#[test]
fn a_checkpoint_cut_short_leaves_nothing() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let gone = p.root.join("table=fleet.trucks/partition=2024-01-02/part-0.parquet");
    std::fs::remove_file(&gone).unwrap();
    std::fs::create_dir(&gone).unwrap();
    let cp = p._dir.path().join("checkpoints").join("cut");
    let e = p.store.checkpoint(&cp).unwrap_err().to_string();
    assert!(e.starts_with(&format!("checkpoint: copying {}: ", gone.display())), "{e}");
    assert!(!cp.exists());
    // Nor the hidden directory it was written in.
    assert_eq!(files(&p._dir.path().join("checkpoints")), Vec::<String>::new());
    assert!(p._dir.path().join("checkpoints").is_dir());
}

/// An archive file gone from the archive (deleted by hand, lost with a disk) does not keep a
/// checkpoint from being taken: it holds the rest, names the missing file in its summary and in
/// its `MISSING-ARCHIVE-FILES`, and opened as a store reads the other partitions as the store
/// does (the missing one fails there as in the store).
#[test]
fn a_checkpoint_names_the_archive_files_that_are_gone_and_holds_the_rest() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let rel = "table=fleet.trucks/partition=2024-01-02/part-0.parquet";
    std::fs::remove_file(p.root.join(rel)).unwrap();
    let cp = p._dir.path().join("checkpoints").join("partial");
    let done = p.store.checkpoint(&cp).unwrap();
    assert_eq!((done.archive_files, done.missing_archive_files.clone()), (1, vec![rel.to_string()]));
    assert_eq!(std::fs::read_to_string(cp.join(bucketer::MISSING_ARCHIVE_FILES)).unwrap(), format!("{rel}\n"));
    assert_eq!(files(&cp.join("archive")), ["table=fleet.trucks/partition=2024-01-01/part-0.parquet"]);
    let copy = Store::open(&cp.join("rocksdb"), config(Some(&cp.join("archive")))).unwrap();
    let jan1 = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    let jan2 = TimeRange { start: JAN1 + DAY_MS, end: JAN1 + 2 * DAY_MS };
    for device in DEVICES {
        assert_eq!(copy.read_range(T, device, jan1).unwrap(), p.twin.read_range(T, device, jan1).unwrap(), "{device}");
        assert_eq!(copy.read_range(T, device, jan1).unwrap().map(|r| r.len()), Some(9), "{device}");
        let (in_copy, in_store) = (copy.read_range(T, device, jan2), p.store.read_range(T, device, jan2));
        assert!(in_copy.is_err() && in_store.is_err(), "{device}: {in_copy:?} {in_store:?}");
    }
    // A checkpoint of a whole archive has no such file.
    let whole = Pair::new();
    whole.write(days());
    whole.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let cp = whole._dir.path().join("checkpoints").join("whole");
    assert_eq!(whole.store.checkpoint(&cp).unwrap().missing_archive_files, Vec::<String>::new());
    assert!(!cp.join(bucketer::MISSING_ARCHIVE_FILES).exists());
}

/// An archive file that is a symbolic link (moved to another disk, linked back) is held by a
/// checkpoint as its data, not as the link (QA52 F1: a copy of the checkpoint elsewhere held a
/// link to nothing); one whose link leads nowhere is named missing.
#[test]
fn a_checkpoint_holds_the_data_of_an_archive_file_that_is_a_symbolic_link() {
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let (moved, gone) = (
        "table=fleet.trucks/partition=2024-01-01/part-0.parquet",
        "table=fleet.trucks/partition=2024-01-02/part-0.parquet",
    );
    let elsewhere = p._dir.path().join("other-disk");
    std::fs::create_dir(&elsewhere).unwrap();
    let bytes = std::fs::read(p.root.join(moved)).unwrap();
    std::fs::rename(p.root.join(moved), elsewhere.join("moved.parquet")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("moved.parquet"), p.root.join(moved)).unwrap();
    std::fs::remove_file(p.root.join(gone)).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("nothing.parquet"), p.root.join(gone)).unwrap();
    let cp = p._dir.path().join("checkpoints").join("linked");
    let done = p.store.checkpoint(&cp).unwrap();
    assert_eq!((done.archive_files, done.missing_archive_files.clone()), (1, vec![gone.to_string()]));
    let held = cp.join("archive").join(moved);
    assert!(std::fs::symlink_metadata(&held).unwrap().is_file(), "a file, not a link");
    assert_eq!(std::fs::read(&held).unwrap(), bytes);
    assert_eq!(files(&cp.join("archive")), [moved]);
}

/// Two checkpoints asked for one directory at once: one is written, the other refused as the
/// directory exists (not failing half-way, its files renamed onto the first's).
#[test]
fn of_two_checkpoints_into_one_directory_at_once_one_is_refused() {
    let p = Pair::new();
    p.write(days());
    let cp = p._dir.path().join("checkpoints").join("same");
    let start = std::sync::Barrier::new(2);
    let outcomes: Vec<Result<usize, String>> = std::thread::scope(|s| {
        let take = || {
            start.wait();
            p.store.checkpoint(&cp).map(|c| c.archive_files).map_err(|e| e.to_string())
        };
        let (a, b) = (s.spawn(take), s.spawn(take));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let refused = format!("checkpoint: {} exists already", cp.display());
    assert!(outcomes.contains(&Ok(0)) && outcomes.contains(&Err(refused)), "{outcomes:?}");
    assert_eq!(files(&p._dir.path().join("checkpoints")).iter().filter(|f| !f.starts_with("same/")).count(), 0);
}

/// The bytes of the files under `dir` whose paths contain none of `shared`, and of all of them.
fn bytes_but(dir: &Path, shared: &[&str]) -> (u64, u64) {
    let sizes: Vec<(String, u64)> =
        files(dir).into_iter().map(|f| (f.clone(), std::fs::metadata(dir.join(&f)).unwrap().len())).collect();
    let unshared = sizes.iter().filter(|(f, _)| !shared.iter().any(|s| f.contains(s))).map(|(_, n)| n).sum();
    (unshared, sizes.iter().map(|(_, n)| n).sum())
}

/// The files a RocksDB checkpoint links rather than copies (never written again once complete:
/// SST and options files), and the archive's.
const SHARED: &[&str] = &[".sst", "/OPTIONS-", ".parquet"];

/// Checkpoints are listed by name, each with its files, their bytes and the bytes it alone
/// holds: not the SST, options and Parquet files it links, while the store or another checkpoint holds
/// them too. Deleting one by name frees what it alone held; nothing but a listed checkpoint is
/// deleted, and a checkpoint a crash cut short is neither listed nor left by the next.
#[test]
fn checkpoints_are_listed_with_what_each_alone_holds_and_deleted_by_name() {
    use bucketer::{delete_checkpoint, list_checkpoints};
    let p = Pair::new();
    p.write(days());
    p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    let cps = tempfile::tempdir().unwrap();
    let root = cps.path().join("checkpoints");
    assert_eq!(list_checkpoints(&root).unwrap(), []);
    // What a crash left of checkpoint "b", and a directory that is no checkpoint.
    std::fs::create_dir_all(root.join(".b.partial/rocksdb")).unwrap();
    std::fs::write(root.join(".b.partial/rocksdb/CURRENT"), "MANIFEST-000001\n").unwrap();
    std::fs::create_dir_all(root.join("notes/rocksdb")).unwrap();
    assert_eq!(list_checkpoints(&root).unwrap(), []);

    p.store.checkpoint(&root.join("a")).unwrap();
    assert!(!root.join(".b.partial").exists(), "removed by the next checkpoint");
    p.store.checkpoint(&root.join("b")).unwrap();
    let listed = list_checkpoints(&root).unwrap();
    assert_eq!(listed.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    for c in &listed {
        assert_eq!(c.dir, root.join(&c.name));
        assert_eq!(c.files, files(&c.dir).len() as u64);
        assert!(c.files > 4 && files(&c.dir).iter().filter(|f| f.ends_with(".parquet")).count() == 2, "{c:?}");
        let (unshared, bytes) = bytes_but(&c.dir, SHARED);
        assert_eq!((c.unshared_bytes, c.bytes), (unshared, bytes), "{c:?}");
        assert!(unshared < bytes, "{c:?}");
    }

    for name in ["notes", ".b.partial", "../checkpoints/a", "", "c"] {
        assert_eq!(delete_checkpoint(&root, name).unwrap(), None, "{name:?}");
    }
    assert!(root.join("notes").is_dir() && root.join("a").is_dir());
    // With the store gone, "a" and "b" share those files; once "b" is deleted,
    // "a" alone holds every file it has.
    let store_dir = p._dir.path().to_path_buf();
    drop(p);
    assert!(!store_dir.exists());
    let a = list_checkpoints(&root).unwrap().remove(0);
    assert_eq!(a.unshared_bytes, bytes_but(&a.dir, SHARED).0);
    assert_eq!(delete_checkpoint(&root, "b").unwrap().as_ref(), Some(&listed[1]));
    assert!(!root.join("b").exists());
    let a = list_checkpoints(&root).unwrap();
    assert_eq!(a, [bucketer::CheckpointEntry { unshared_bytes: listed[0].bytes, ..listed[0].clone() }]);
    assert_eq!(delete_checkpoint(&root, "a").unwrap().map(|c| c.unshared_bytes), Some(listed[0].bytes));
    assert_eq!(list_checkpoints(&root).unwrap(), []);
    assert!(root.join("notes/rocksdb").is_dir());
}

/// A device's first readings into a day deleted for good (past the cold retention), still in
/// the write buffer when the next retention run comes, are rolled up by that run before it
/// deletes them again (QA23 F1: the run flushed the buffer and deleted them before any pass
/// saw their marks, so the hour had no record).
#[test]
fn a_cold_delete_rolls_up_what_was_stored_into_its_partitions_first() {
    let p = Pair::with(config_buffered);
    p.store.write(days(), &[]).unwrap();
    p.store.process_rollups(0, 1000).unwrap();
    let jan8 = JAN1 + 7 * DAY_MS;
    let report = p.store.spill_expired_partitions(jan8, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    let seven = JAN1 + 7 * HOUR_MS;
    let new = |ts: i64, k: i64| DeviceReading { table: T.into(), device: "truck_new".into(), reading: reading(ts, k) };
    p.store.write(vec![new(seven + 1000, 100), new(seven + 2000, 101)], &[]).unwrap();
    let report = p.store.spill_expired_partitions(jan8, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1)]);
    let hour = TimeRange { start: seven, end: seven + HOUR_MS };
    let counts = |records: Vec<(i64, bucketer::rollups::Record)>| -> Vec<(i64, u64, f64)> {
        records
            .iter()
            .map(|(start, r)| (*start, r.fields["speed"].exact.count(), r.fields["speed"].exact.sum()))
            .collect()
    };
    assert_eq!(counts(p.store.rollups(T, "truck_new", Level::Hour, hour).unwrap().unwrap()), [(seven, 2, 100.75)]);
    // The table's hour: its three trucks' nine readings (k 10 to 18) and the new two.
    let trucks: f64 = (10..=18).map(|k| k as f64 * 0.5 + 0.125).sum();
    assert_eq!(
        counts(p.store.group_rollups(T, "", Level::Hour, hour).unwrap().unwrap()),
        [(seven, 11, trucks + 100.75)]
    );
    assert_eq!(p.store.read_range(T, "truck_new", ALL).unwrap(), Some(vec![]));
}

/// A cold delete of archived partitions one of whose files is missing, its hours never rolled
/// up, deletes them all the same and says at ERROR how many device-hours went without roll-up
/// and from which hour (QA47 N6: nothing was said, and `files_missing` went back to 0); the
/// other partition's hours are rolled up first.
#[test]
fn a_cold_delete_past_a_missing_file_says_what_it_could_not_roll_up() {
    let p = Pair::new();
    p.store.write(days(), &[]).unwrap();
    assert_eq!(p.store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    std::fs::remove_file(p.root.join("table=fleet.trucks/partition=2024-01-01/part-0.parquet")).unwrap();
    let jan8 = JAN1 + 7 * DAY_MS;
    let (report, errors) = logged::logged(tracing::Level::ERROR, || p.store.spill_expired_partitions(jan8, |_| ()));
    assert_eq!(report.unwrap().deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    assert_eq!(
        errors,
        ["ERROR bucketer::rollups: archived hours whose file could not be read (damaged or missing) were deleted \
             for good without being rolled up: their readings not rolled up before are in no roll-up device_hours=9 \
             first_hour=2024-01-01T00:00:00Z partitions=2"]
    );
    // Jan 2's three hours of three trucks rolled up; Jan 1 in no roll-up.
    let days = TimeRange { start: JAN1, end: JAN1 + 2 * DAY_MS };
    let hours = p.store.group_rollups(T, "", Level::Hour, days).unwrap().unwrap();
    let starts: Vec<i64> = hours.iter().map(|(start, _)| *start).collect();
    assert_eq!(starts, [JAN1 + DAY_MS, JAN1 + DAY_MS + 7 * HOUR_MS, JAN1 + DAY_MS + 23 * HOUR_MS]);
    assert!(hours.iter().all(|(_, r)| r.fields["speed"].exact.count() == 9));
}

/// A store (in its temp dir) with [`days`] rolled up and Jan 1 and 2 archived.
fn archived_jan1_and_2() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db"), config(Some(&dir.path().join("archive")))).unwrap());
    store.define_table_with(T, &spec()).unwrap();
    store.write(days(), &[]).unwrap();
    store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 2);
    (dir, store)
}

/// The first reading of device `new_{k}`, `k` seconds into the hour from `hour`.
fn new_device_at(hour: i64, k: usize) -> DeviceReading {
    DeviceReading {
        table: T.into(),
        device: format!("new_{k}").into(),
        reading: reading(hour + k as i64 * 1000, k as i64),
    }
}

/// A cold delete gives the readings written into its partitions while it rolls them up more
/// than three rounds while each round has fewer new ones than the round before (QA27: writers
/// that stopped during the third round lost what they wrote in it, 1,005,000 device-hours,
/// where a fourth round would have rolled them up). Here first readings of new devices into the
/// archived Jan 1 10:00 (new_1 before the run), written between the rounds' reads: 3 in round
/// 1, 2 in round 2, 1 in round 3; a fourth round rolls up the last, and the table's hour counts
/// all 7 (6 with three rounds).
#[test]
fn a_cold_delete_rolls_up_while_its_rounds_gain_on_the_writers() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (_dir, store) = archived_jan1_and_2();
    let ten = JAN1 + 10 * HOUR_MS;
    let new = move |k: usize| new_device_at(ten, k);
    store.write(vec![new(1)], &[]).unwrap();
    // Reads in the rounds: 1 (new_1), then 3 (new_2..4), 2 (new_5, 6), 1 (new_7).
    let reads = Arc::new(AtomicUsize::new(0));
    let hook = {
        let (weak, reads) = (Arc::downgrade(&store), reads.clone());
        ReadHook(Arc::new(move || {
            let written: &[usize] = match reads.fetch_add(1, SeqCst) {
                0 => &[2, 3, 4],
                1 => &[5, 6],
                4 => &[7],
                _ => &[],
            };
            if !written.is_empty() {
                let store = weak.upgrade().expect("the store");
                store.write(written.iter().map(|&k| new(k)).collect(), &[]).unwrap();
            }
        }))
    };
    store.set_between_archive_reads(Some(hook));
    let jan8 = JAN1 + 7 * DAY_MS;
    let report = store.spill_expired_partitions(jan8, |_| ()).unwrap();
    store.set_between_archive_reads(None);
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    assert_eq!(reads.load(SeqCst), 7);
    let hour = TimeRange { start: ten, end: ten + HOUR_MS };
    let table = store.group_rollups(T, "", Level::Hour, hour).unwrap().unwrap();
    assert_eq!(
        table.iter().map(|(start, r)| (*start, r.fields["speed"].exact.count())).collect::<Vec<_>>(),
        [(ten, 7)]
    );
}

/// A pass deletes its done marks in range deletes where they lie in a row of the work queue
/// (`bucketer::rollups::RANGE_DELETE_MIN_MARKS`), and a write between its reads and its commit
/// keeps its mark: one into a device-hour inside such a row that had none (its mark is new) and
/// one into a device-hour the pass read (its mark rewritten). The next pass rolls both up.
#[test]
fn marks_written_during_a_pass_stay_inside_its_ranges_of_done_marks() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("archive");
    // One worker: the hook runs at the first hour read, before device 20's is read.
    let cfg = StoreConfig { rollup_workers: 1, ..config(Some(&root)) };
    let store = Arc::new(Store::open(&dir.path().join("db"), cfg).unwrap());
    store.define_table_with(T, &spec()).unwrap();
    let row = |d: usize, ts: i64, k: i64| DeviceReading {
        table: T.into(),
        device: format!("d{d:02}").into(),
        reading: reading(ts, k),
    };
    // Jan 1 00:00 of 40 devices (ids in this order), 01:00 of the even ones; Jan 4 10:00 ends
    // both hours.
    let one = JAN1 + HOUR_MS;
    let mut rows: Vec<DeviceReading> = (0..40).map(|d| row(d, JAN1 + 60_000, d as i64)).collect();
    rows.extend((0..40).step_by(2).map(|d| row(d, one + 60_000, d as i64)));
    rows.push(row(0, JAN1 + 3 * DAY_MS + 10 * HOUR_MS, 1));
    store.write(rows, &[]).unwrap();
    assert_eq!(store.spill_expired_partitions(JAN5, |_| ()).unwrap().spilled.len(), 1, "Jan 1");
    let armed = Arc::new(AtomicBool::new(true));
    let hook = {
        let (weak, armed) = (Arc::downgrade(&store), armed.clone());
        ReadHook(Arc::new(move || {
            if armed.swap(false, SeqCst) {
                let store = weak.upgrade().expect("the store");
                store.write(vec![row(13, one + 120_000, 7), row(20, one + 120_000, 8)], &[]).unwrap();
            }
        }))
    };
    store.set_between_archive_reads(Some(hook));
    let hour_one = |s: &Store| {
        let range = TimeRange { start: one, end: one + HOUR_MS };
        let table = s.group_rollups(T, "", Level::Hour, range).unwrap().unwrap();
        table.iter().map(|(start, r)| (*start, r.fields["speed"].exact.count())).collect::<Vec<_>>()
    };
    let s = store.process_rollups(0, 1_000_000).unwrap();
    assert!(!armed.load(SeqCst), "the hook ran");
    // 60 hours; d20's second reading read with its hour, d13's not.
    assert_eq!((s.hours, s.rewritten), (60, 1), "{s:?}");
    assert_eq!(store.dirty_marks().unwrap(), 3, "d13 and d20 at 01:00, Jan 4 10:00");
    assert_eq!(hour_one(&store), [(one, 21)]);
    let s = store.process_rollups(0, 1_000_000).unwrap();
    assert_eq!((s.hours, s.rewritten), (2, 0), "{s:?}");
    assert_eq!(store.dirty_marks().unwrap(), 1);
    assert_eq!(hour_one(&store), [(one, 22)]);
    let range = TimeRange { start: one, end: one + HOUR_MS };
    let d13 = store.rollups(T, "d13", Level::Hour, range).unwrap().unwrap();
    assert_eq!(d13.iter().map(|(start, r)| (*start, r.fields["speed"].exact.count())).collect::<Vec<_>>(), [(one, 1)]);
    store.set_between_archive_reads(None);
}

/// A cold delete whose rounds of roll-ups fall behind its writers leaves its partitions for a
/// later run, where it deleted them with what the writers stored during the last round (QA29
/// F1: a writer faster than the roll-up that stopped during the third round lost 534,500
/// device-hours). Here each read of the archived Jan 1 10:00 writes two new devices' first
/// readings into it: rounds of 1, 2 and 4 marks leave 8, and the partitions stay; the next run
/// (the writers stopped) rolls up the 8 and deletes them, and the table's hour counts all 15.
#[test]
fn a_cold_delete_outrun_by_its_writers_waits_for_a_later_run() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let (_dir, store) = archived_jan1_and_2();
    let ten = JAN1 + 10 * HOUR_MS;
    let new = move |k: usize| new_device_at(ten, k);
    store.write(vec![new(0)], &[]).unwrap();
    let (writing, written) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(1)));
    let hook = {
        let (weak, writing, written) = (Arc::downgrade(&store), writing.clone(), written.clone());
        ReadHook(Arc::new(move || {
            if writing.load(SeqCst) {
                let store = weak.upgrade().expect("the store");
                let k = written.fetch_add(2, SeqCst);
                store.write(vec![new(k), new(k + 1)], &[]).unwrap();
            }
        }))
    };
    store.set_between_archive_reads(Some(hook));
    let jan8 = JAN1 + 7 * DAY_MS;
    let report = store.spill_expired_partitions(jan8, |_| ()).unwrap();
    assert_eq!(report.deleted, vec![], "outrun: left for a later run");
    assert_eq!(written.load(SeqCst), 15, "rounds of 1, 2 and 4 reads");
    writing.store(false, SeqCst);
    let report = store.spill_expired_partitions(jan8, |_| ()).unwrap();
    store.set_between_archive_reads(None);
    assert_eq!(report.deleted, vec![(T.to_string(), DAY1), (T.to_string(), DAY1 + 1)]);
    let hour = TimeRange { start: ten, end: ten + HOUR_MS };
    let table = store.group_rollups(T, "", Level::Hour, hour).unwrap().unwrap();
    assert_eq!(
        table.iter().map(|(start, r)| (*start, r.fields["speed"].exact.count())).collect::<Vec<_>>(),
        [(ten, 15)]
    );
}

/// Archived reads prune by the page index: a device's rows span pages of the `device` column
/// (parquet writes about 20,000 rows a page) within row groups of the default size, and reads
/// of each device over ranges starting and ending anywhere (inside pages, at their edges)
/// equal the twin's, which never spilled.
#[test]
fn archived_reads_across_pages_equal_the_twins() {
    fn big_row_groups(archive: Option<&Path>) -> StoreConfig {
        let mut cfg = config(archive);
        if let Some(a) = &mut cfg.archive {
            a.file.row_group_rows = 65_536;
        }
        cfg
    }
    let p = Pair::with(big_row_groups);
    // 3 devices × 25,000 readings every 3 s (20.8 hours of Jan 1): 75,000 rows in two row
    // groups, pages of `device` starting inside truck_a's rows, truck_b's and truck_c's.
    const EACH: i64 = 25_000;
    let mut rows = Vec::new();
    for (d, device) in DEVICES.iter().enumerate() {
        for k in 0..EACH {
            let ts = JAN1 + k * 3_000 + d as i64;
            rows.push(DeviceReading { table: T.into(), device: (*device).into(), reading: reading(ts, k) });
        }
    }
    p.write(rows.clone());
    let report = p.store.spill_expired_partitions(JAN5, |_| ()).unwrap();
    assert_eq!(report.spilled.iter().map(|s| (s.partition, s.rows)).collect::<Vec<_>>(), vec![(DAY1, 75_000)]);
    assert_eq!(p.store.bucket_bytes(T, "truck_a", Hour::of(JAN1)).unwrap(), None);
    let mut ranges = vec![ALL, TimeRange { start: JAN1, end: JAN1 + 3_000 }];
    // Ranges around each 10,240th reading (page edges fall on multiples of 1,024 rows).
    for k in (0..EACH).step_by(10_240).chain([EACH - 1]) {
        let at = JAN1 + k * 3_000;
        ranges.push(TimeRange { start: at - 7 * 3_000, end: at + 5 * 3_000 + 1 });
        ranges.push(TimeRange { start: at, end: JAN1 + DAY_MS });
        ranges.push(TimeRange { start: JAN1 - DAY_MS, end: at + 1 });
    }
    for device in DEVICES {
        // Compared by count first, so a failure does not print 25,000 readings.
        let same = |got: Vec<Reading>, want: Vec<Reading>, what: String| {
            assert_eq!(got.len(), want.len(), "{what}: readings");
            assert!(got == want, "{what}: the readings differ");
        };
        let written: Vec<Reading> =
            rows.iter().filter(|r| r.device.as_ref() == device).map(|r| r.reading.clone()).collect();
        same(p.store.read_range(T, device, ALL).unwrap().unwrap(), written, format!("{device} written"));
        for range in &ranges {
            let want = p.twin.read_range(T, device, *range).unwrap().unwrap_or_default();
            same(
                p.store.read_range(T, device, *range).unwrap().unwrap_or_default(),
                want,
                format!("{device} {range:?}"),
            );
        }
    }
}
