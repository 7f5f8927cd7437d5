//! Table definitions and retention on real RocksDB files in temp dirs: expired time partitions
//! are gone after one call, every other partition and table is byte for byte as it was, and
//! the definitions and the drops hold across a reopen and a full compaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bucketer::{Error, Store, StoreConfig, TableDefinition};
use model::{DeviceReading, Hour, PartitionSize, Reading, TimeRange, DAY_MS, HOUR_MS};

#[path = "util/logged.rs"]
mod logged;

/// 2024-01-01T00:00:00Z, day 19723 since the epoch; hour 473352.
const JAN1: i64 = 1_704_067_200_000;
/// 2024-01-05T00:00:00Z: the fixed "now" of the drops.
const JAN5: i64 = JAN1 + 4 * DAY_MS;
/// Everything written lies in here.
const ALL: TimeRange = TimeRange { start: JAN1 - DAY_MS, end: JAN1 + 6 * DAY_MS };

const A: &str = "a.daily"; // day partitions, hot retention 2 days
const B: &str = "b.forever"; // created by its first write: day partitions, kept forever
const C: &str = "c.hourly"; // hour partitions, hot retention 3 hours

/// What was written, per (table, device): readings by timestamp.
type Oracle = BTreeMap<(&'static str, &'static str), BTreeMap<i64, Reading>>;

fn reading(ts: i64, k: i64) -> Reading {
    Reading::new(ts, vec![(Arc::from("v"), k as f64 + 0.25), (Arc::from("w"), -(k as f64) * 1.5)])
}

/// Readings of tables A and B on four consecutive days (Jan 1–4, three hours of each day, two
/// readings an hour), a device of A seen only on Jan 1, and table C with readings in hour 05 of
/// Jan 1 and hours 20–23 of Jan 4.
fn scenario() -> (Vec<DeviceReading>, Oracle) {
    let mut rows = Vec::new();
    let mut oracle = Oracle::new();
    let mut k = 0i64;
    let mut add = |table: &'static str, device: &'static str, ts: i64| {
        k += 1;
        let r = reading(ts, k);
        oracle.entry((table, device)).or_default().insert(ts, r.clone());
        rows.push(DeviceReading { table: table.into(), device: device.into(), reading: r });
    };
    for day in 0..4 {
        for hour in [0, 7, 23] {
            for minute in [1, 59] {
                let ts = JAN1 + day * DAY_MS + hour * HOUR_MS + minute * 60_000;
                for table in [A, B] {
                    for device in ["dev_1", "dev_2"] {
                        add(table, device, ts);
                    }
                }
            }
        }
    }
    add(A, "dev_old", JAN1 + 12 * HOUR_MS);
    add(C, "dev_1", JAN1 + 5 * HOUR_MS + 30_000);
    for hour in 20..24 {
        add(C, "dev_1", JAN1 + 3 * DAY_MS + hour * HOUR_MS);
        add(C, "dev_2", JAN1 + 3 * DAY_MS + hour * HOUR_MS + 3_599_999);
    }
    (rows, oracle)
}

/// The stored bytes of every hour bucket that holds a reading of the oracle.
fn all_buckets(store: &Store, oracle: &Oracle) -> BTreeMap<(&'static str, &'static str, i64), Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    for ((table, device), readings) in oracle {
        for ts in readings.keys() {
            let hour = Hour::of(*ts);
            out.insert((*table, *device, hour.0), store.bucket_bytes(table, device, hour).unwrap());
        }
    }
    out
}

/// Checks every (table, device) of the oracle against the store: `read_range` returns exactly
/// the readings `keep` keeps, and the latest reading is the newest ever written.
fn assert_reads(store: &Store, oracle: &Oracle, keep: impl Fn(&str, i64) -> bool) {
    for ((table, device), readings) in oracle {
        let expected: Vec<Reading> = readings.values().filter(|r| keep(table, r.ts)).cloned().collect();
        let got = store.read_range(table, device, ALL).unwrap();
        assert_eq!(got, Some(expected), "{table}/{device}");
        let newest = readings.values().next_back().cloned();
        assert_eq!(store.latest(table, &[*device]).unwrap(), Some(vec![newest]), "latest {table}/{device}");
    }
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreConfig::default()).unwrap()
}

fn dropped(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(t, p)| (t.to_string(), *p)).collect()
}

#[test]
fn expired_partitions_are_dropped_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let two_days = 2 * DAY_MS as u64;
    let three_hours = 3 * HOUR_MS as u64;

    // Definitions: created once, the same again is fine, other settings are refused.
    let def_a = TableDefinition {
        name: A.into(),
        id: 1,
        partition: PartitionSize::Day,
        hot_retention_ms: Some(two_days),
        cold_retention_ms: None,
        rollup_retention: bucketer::RollupRetention::FOREVER,
        rollup_floor: bucketer::RollupFloor::NONE,
        schema: Default::default(),
    };
    assert_eq!(store.define_table(A, PartitionSize::Day, Some(two_days)).unwrap(), (def_a.clone(), true));
    assert_eq!(store.define_table(A, PartitionSize::Day, Some(two_days)).unwrap(), (def_a.clone(), false));
    let conflict = store.define_table(A, PartitionSize::Hour, Some(two_days)).unwrap_err();
    assert!(matches!(conflict, Error::TableExists { .. }));
    assert_eq!(
        conflict.to_string(),
        format!(
            "table `a.daily` already exists with partition day, hot retention 2d; \
             the request asks for partition hour, hot retention 2d ({})",
            bucketer::catalog::FIXED_AT_CREATION
        )
    );
    assert_eq!(
        store.define_table(A, PartitionSize::Day, None).unwrap_err().to_string(),
        format!(
            "table `a.daily` already exists with partition day, hot retention 2d; \
             the request asks for partition day, no hot retention (kept forever) ({})",
            bucketer::catalog::FIXED_AT_CREATION
        )
    );
    assert_eq!(
        store.define_table("zero", PartitionSize::Day, Some(0)).unwrap_err().to_string(),
        "invalid definition of table `zero`: the hot retention must be from 1 to 2^63-1 milliseconds"
    );
    assert_eq!(store.table_definition("zero"), None);
    let def_c = TableDefinition {
        name: C.into(),
        id: 2,
        partition: PartitionSize::Hour,
        hot_retention_ms: Some(three_hours),
        cold_retention_ms: None,
        rollup_retention: bucketer::RollupRetention::FOREVER,
        rollup_floor: bucketer::RollupFloor::NONE,
        schema: Default::default(),
    };
    assert_eq!(store.define_table(C, PartitionSize::Hour, Some(three_hours)).unwrap(), (def_c.clone(), true));

    let (rows, oracle) = scenario();
    store.write(rows, &[]).unwrap();
    // B came into being with its first write: the default partition, no retention, and the
    // fields written (schema version 1).
    let mut schema = bucketer::schema::Schema::default();
    schema.add("v".into(), model::FieldType::F64, 1);
    schema.add("w".into(), model::FieldType::F64, 1);
    schema.version = 1;
    let def_b = TableDefinition {
        name: B.into(),
        id: 3,
        partition: PartitionSize::Day,
        hot_retention_ms: None,
        cold_retention_ms: None,
        rollup_retention: bucketer::RollupRetention::FOREVER,
        rollup_floor: bucketer::RollupFloor::NONE,
        schema,
    };
    assert_eq!(store.table_definition(B), Some(def_b.clone()));
    assert_reads(&store, &oracle, |_, _| true);
    let before = all_buckets(&store, &oracle);
    assert!(before.values().all(Option::is_some));

    // One millisecond before Jan 5: A's Jan 1 (day 19723) ended before the cutoff Jan 2
    // 23:59:59.999, Jan 2 did not; C's cutoff is Jan 4 20:59:59.999, so of its partitions only
    // Jan 1 05:00 (hour 473357) has expired, Jan 4 20:00 (hour 473444) has not.
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723), (C, 473_357)]));
    // At Jan 5 00:00 A's Jan 2 ends exactly at the cutoff (expired) and C's Jan 4 20:00 ends
    // exactly at its cutoff, 21:00.
    assert_eq!(store.drop_expired_partitions(JAN5).unwrap(), dropped(&[(A, 19_724), (C, 473_444)]));
    // Nothing left to drop at the same time.
    assert_eq!(store.drop_expired_partitions(JAN5).unwrap(), dropped(&[]));

    let a_kept_from = JAN1 + 2 * DAY_MS; // Jan 3
    let c_kept_from = JAN1 + 3 * DAY_MS + 21 * HOUR_MS; // Jan 4 21:00
    let keep = move |table: &str, ts: i64| match table {
        A => ts >= a_kept_from,
        C => ts >= c_kept_from,
        _ => true,
    };
    // Exactly the surviving readings come back; latest values stay, also of dev_old, whose
    // readings all lay in a dropped partition.
    assert_reads(&store, &oracle, keep);
    assert_eq!(store.read_range(A, "dev_old", ALL).unwrap(), Some(vec![]));
    // Every surviving bucket is byte for byte what it was; every dropped one is gone.
    let after = all_buckets(&store, &oracle);
    for ((table, device, hour), bytes) in &before {
        let expected = if keep(table, Hour(*hour).start_ms()) { bytes.clone() } else { None };
        assert_eq!(after[&(*table, *device, *hour)], expected, "{table}/{device} hour {hour}");
    }
    assert_eq!(after.values().filter(|b| b.is_none()).count(), 2 * 3 * 2 + 1 + 1 + 2);

    // Across a full compaction and a reopen: the definitions, the reads and the drops hold.
    store.compact().unwrap();
    drop(store);
    let store = open(dir.path());
    // A and C, defined before any write, gained the fields written, as B did.
    let (mut def_a, mut def_c) = (def_a, def_c);
    def_a.schema = def_b.schema.clone();
    def_c.schema = def_b.schema.clone();
    assert_eq!(store.table_definition(A), Some(def_a));
    assert_eq!(store.table_definition(B), Some(def_b));
    assert_eq!(store.table_definition(C), Some(def_c));
    assert_eq!(store.drop_expired_partitions(JAN5).unwrap(), dropped(&[]));
    assert_reads(&store, &oracle, keep);
    assert_eq!(all_buckets(&store, &oracle), after);

    // A day later: A's Jan 3 and C's remaining three hours expire; B still keeps everything.
    assert_eq!(
        store.drop_expired_partitions(JAN5 + DAY_MS).unwrap(),
        dropped(&[(A, 19_725), (C, 473_445), (C, 473_446), (C, 473_447)])
    );
    let a_kept_from = JAN1 + 3 * DAY_MS;
    assert_reads(&store, &oracle, |table, ts| match table {
        A => ts >= a_kept_from,
        C => false,
        _ => true,
    });
}

/// Partitions far apart in time are found by seeking, not by walking the indexes between
/// them: a table with data in 1900 and 2200 drops both at once.
#[test]
fn partitions_far_apart_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.define_table("sparse", PartitionSize::Hour, Some(1)).unwrap();
    let y1900 = -2_208_988_800_000; // 1900-01-01T00:00Z, hour -613608
    let y2200 = 7_258_118_400_000; // 2200-01-01T00:00Z, hour 2016144
    let rows = [y1900, y2200]
        .map(|ts| DeviceReading { table: "sparse".into(), device: "d".into(), reading: reading(ts, 1) })
        .to_vec();
    store.write(rows, &[]).unwrap();
    assert_eq!(store.drop_expired_partitions(y2200).unwrap(), dropped(&[("sparse", -613_608)]));
    assert_eq!(store.drop_expired_partitions(y2200 + HOUR_MS + 1).unwrap(), dropped(&[("sparse", 2_016_144)]));
    let whole = TimeRange::new(y1900, y2200 + HOUR_MS).unwrap();
    assert_eq!(store.read_range("sparse", "d", whole).unwrap(), Some(vec![]));
}

/// A dropped partition's files are freed at once, under either compaction style, where a range
/// delete alone would leave them until a compaction reached them: a day compacted alone into
/// the bottommost level, then a newer day flushed beside it, then the first day dropped.
#[test]
fn a_dropped_partition_frees_its_files_at_once() {
    use bucketer::{Compaction, DbOptions};
    for compaction in [Compaction::Leveled, Compaction::Universal] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig { db: DbOptions { compaction, ..DbOptions::default() }, ..StoreConfig::default() };
        let store = Store::open(dir.path(), cfg).unwrap();
        store.define_table(A, PartitionSize::Day, Some(2 * DAY_MS as u64)).unwrap();
        let mut oracle = Oracle::new();
        let mut day = |d: i64| -> Vec<DeviceReading> {
            let devices = ["dev_1", "dev_2", "dev_3"];
            (0..300)
                .map(|i| {
                    let r = reading(JAN1 + d * DAY_MS + i * 60_000, i);
                    let device = devices[i as usize % 3];
                    oracle.entry((A, device)).or_default().insert(r.ts, r.clone());
                    DeviceReading { table: A.into(), device: device.into(), reading: r }
                })
                .collect()
        };
        store.write(day(0), &[]).unwrap();
        store.compact().unwrap();
        let jan1 = store.bucket_sst_bytes().unwrap();
        store.write(day(3), &[]).unwrap();
        store.flush().unwrap();
        let both = store.bucket_sst_bytes().unwrap();
        assert!(jan1 > 0 && both > jan1, "{compaction:?}: {jan1} then {both} bytes");
        assert_eq!(store.drop_expired_partitions(JAN5).unwrap(), dropped(&[(A, 19_723)]));
        assert_eq!(store.bucket_sst_bytes().unwrap(), both - jan1, "{compaction:?}");
        // Jan 4 as written; Jan 1 gone, also after a full compaction.
        assert_reads(&store, &oracle, |_, ts| ts >= JAN1 + 3 * DAY_MS);
        store.compact().unwrap();
        assert_reads(&store, &oracle, |_, ts| ts >= JAN1 + 3 * DAY_MS);
    }
}

/// The `latest` entries of a closed store, as stored (`store.compact()` merged every operand),
/// in key order: (time, fields) of each one-reading value.
fn stored_latest(dir: &std::path::Path) -> Vec<(i64, usize)> {
    let opts = rocksdb::Options::default();
    let cfs = rocksdb::DB::list_cf(&opts, dir).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&opts, dir, &cfs, false).unwrap();
    let latest = db.cf_handle(bucketer::store::CF_LATEST).unwrap();
    db.iterator_cf(latest, rocksdb::IteratorMode::Start)
        .map(|kv| {
            let mut rs = Vec::new();
            bucketer::codec::decode(&kv.unwrap().1, &mut rs).unwrap();
            assert_eq!(rs.len(), 1);
            (rs[0].ts, rs[0].fields.len())
        })
        .collect()
}

/// A write's `latest` entry is a pointer, the time of a reading in the hour its write marks
/// without the fields (the hour bucket has them); the roll-up pass that reads the hour puts
/// the hour's newest reading whole, as a drop or spill of the partition may delete the
/// bucket afterwards. Reads see the whole newest reading either way.
#[test]
fn a_written_latest_entry_is_a_pointer_until_a_pass_settles_it() {
    let dir = tempfile::tempdir().unwrap();
    let at = |m: i64| JAN1 + 10 * HOUR_MS + m * 60_000;
    let row = |device: &str, ts: i64, k: i64| DeviceReading {
        table: A.into(),
        device: device.into(),
        reading: reading(ts, k),
    };
    {
        let store = open(dir.path());
        store.write(vec![row("dev_1", at(1), 1)], &[]).unwrap();
        store.write(vec![row("dev_1", at(3), 3)], &[]).unwrap();
        assert_eq!(store.latest(A, &["dev_1"]).unwrap(), Some(vec![Some(reading(at(3), 3))]));
        store.compact().unwrap();
    }
    // The first batch marked the hour and wrote the entry: its time, no fields.
    assert_eq!(stored_latest(dir.path()), [(at(1), 0)]);
    {
        let store = open(dir.path());
        assert_eq!(store.latest(A, &["dev_1"]).unwrap(), Some(vec![Some(reading(at(3), 3))]));
        // A reading of Jan 2 closes the hour; the pass settles dev_1's entry.
        store.write(vec![row("dev_2", JAN1 + DAY_MS, 9)], &[]).unwrap();
        assert_eq!(store.process_rollups(0, 100).unwrap().hours, 1);
        store.compact().unwrap();
    }
    // dev_1 (first id): the hour's newest reading, both fields; dev_2: a pointer.
    assert_eq!(stored_latest(dir.path()), [(at(3), 2), (JAN1 + DAY_MS, 0)]);
    let store = open(dir.path());
    assert_eq!(
        store.latest(A, &["dev_1", "dev_2"]).unwrap(),
        Some(vec![Some(reading(at(3), 3)), Some(reading(JAN1 + DAY_MS, 9))])
    );
}

/// A device's `latest` entry is written when a write marks the device's newest hour, so the
/// later writes into that open hour leave it at the hour's first reading and reads take the
/// rest from the bucket. Once the hour's partition is dropped, the newest reading is still
/// the latest: settled by the drop (the hour not rolled up yet) or by the roll-up pass before
/// it (and then the drop has nothing to settle).
#[test]
fn latest_stays_the_newest_reading_when_its_hour_is_dropped() {
    use std::sync::atomic::Ordering::Relaxed;
    for rolled_up in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.define_table(A, PartitionSize::Day, Some(2 * DAY_MS as u64)).unwrap();
        let operands = |s: &Store| s.stats().latest_operands.load(Relaxed);
        let devices = ["dev_1", "dev_2"];
        // Minutes 1, 2 and 3 of Jan 1 10:00, one batch a minute: the hour stays open.
        let at = |m: i64| JAN1 + 10 * HOUR_MS + m * 60_000;
        let minute = |m: i64| -> Vec<DeviceReading> {
            devices
                .iter()
                .enumerate()
                .map(|(i, d)| DeviceReading {
                    table: A.into(),
                    device: (*d).into(),
                    reading: reading(at(m), 10 * m + i as i64),
                })
                .collect()
        };
        let newest: Vec<Option<Reading>> = (0..2).map(|i| Some(reading(at(3), 30 + i))).collect();
        for m in 1..=3 {
            store.write(minute(m), &[]).unwrap();
        }
        // One operand a device: the first batch marked the hour, the others found the mark.
        assert_eq!(operands(&store), 2, "rolled up: {rolled_up}");
        assert_eq!(store.latest(A, &devices).unwrap(), Some(newest.clone()));
        let mut expected_operands = 2;
        if rolled_up {
            // A reading of Jan 2 closes the hour (no lateness allowed): the pass reads both
            // device-hours and settles each device's entry.
            let jan2 = DeviceReading { table: A.into(), device: "dev_3".into(), reading: reading(JAN1 + DAY_MS, 0) };
            store.write(vec![jan2], &[]).unwrap();
            let s = store.process_rollups(0, 100).unwrap();
            assert_eq!((s.hours, s.readings), (2, 6));
            expected_operands += 1 + 2;
        } else {
            // Not rolled up: the drop settles both.
            expected_operands += 2;
        }
        // Jan 1 alone expires one millisecond before Jan 5.
        assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
        for d in devices {
            assert_eq!(store.read_range(A, d, ALL).unwrap(), Some(vec![]), "{d}");
        }
        assert_eq!(store.latest(A, &devices).unwrap(), Some(newest.clone()), "rolled up: {rolled_up}");
        assert_eq!(operands(&store), expected_operands, "rolled up: {rolled_up}");
        store.compact().unwrap();
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.latest(A, &devices).unwrap(), Some(newest), "rolled up: {rolled_up}, reopened");
    }
}

/// A partition deleted for good while its last hour is still open by the watermark (a fleet
/// quiet for longer than the hot retention: its newest reading is in that hour) has that hour
/// rolled up before the delete, as its closed ones: the day counts every reading. Before, the
/// hour went with the delete (QA46 F8: 276 of 288 readings in the day, said nowhere).
#[test]
fn a_partition_deleted_while_its_last_hour_is_open_rolls_that_hour_up_first() {
    use rollup::period::Level;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.define_table(A, PartitionSize::Day, Some(2 * DAY_MS as u64)).unwrap();
    let rows: Vec<DeviceReading> = ["dev_1", "dev_2"]
        .into_iter()
        .flat_map(|d| {
            (0..144).map(move |i| DeviceReading {
                table: A.into(),
                device: d.into(),
                reading: reading(JAN1 + i * 600_000, i),
            })
        })
        .collect();
    store.write(rows, &[]).unwrap();
    // A pass with no lateness rolls up the 23 closed hours of each device; 23:00 stays open.
    assert_eq!(store.process_rollups(0, 1000).unwrap().hours, 46);
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    let day = store.group_rollups(A, "", Level::Day, ALL).unwrap().unwrap();
    assert_eq!(day.len(), 1);
    assert_eq!((day[0].0, day[0].1.fields["v"].exact.count()), (JAN1, 288));
    let hours = store.rollups(A, "dev_2", Level::Hour, ALL).unwrap().unwrap();
    assert_eq!(hours.len(), 24);
    assert_eq!((hours[23].0, hours[23].1.fields["v"].exact.count()), (JAN1 + 23 * HOUR_MS, 6));
}

/// Roll-ups outlive raw data: once a partition's readings are dropped, a reading written into
/// an hour of it again (here a replay of one the hour already counts) leaves the hour's record,
/// its day's and the table's as they were, across a reopen, until the next drop deletes the
/// reading again. Before, the pass recomputed the hour from the one reading left in it.
#[test]
fn a_write_into_a_dropped_partition_leaves_its_roll_ups_as_they_were() {
    use rollup::period::Level;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.define_table(A, PartitionSize::Day, Some(2 * DAY_MS as u64)).unwrap();
    let row = |ts: i64, k: i64| DeviceReading { table: A.into(), device: "dev_1".into(), reading: reading(ts, k) };
    let first = vec![row(JAN1 + 1000, 1), row(JAN1 + 2000, 2), row(JAN1 + 3000, 3), row(JAN1 + HOUR_MS, 4)];
    store.write(first, &[]).unwrap();
    // A reading of Jan 2 closes Jan 1's hours (no lateness allowed).
    store.write(vec![row(JAN1 + DAY_MS, 5)], &[]).unwrap();
    assert_eq!(store.process_rollups(0, 100).unwrap().hours, 2);
    let records = |s: &Store| {
        let device = |level| s.rollups(A, "dev_1", level, ALL).unwrap().unwrap();
        (device(Level::Hour), device(Level::Day), s.group_rollups(A, "", Level::Day, ALL).unwrap().unwrap())
    };
    let before = records(&store);
    let counts = |r: &(Vec<(i64, bucketer::rollups::Record)>, _, _)| -> Vec<(i64, u64)> {
        r.0.iter().map(|(start, rec)| (*start, rec.fields["v"].exact.count())).collect()
    };
    assert_eq!(counts(&before), [(JAN1, 3), (JAN1 + HOUR_MS, 1)]);
    assert_eq!(before.1[0].1.fields["v"].exact.count(), 4);

    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    store.write(vec![row(JAN1 + 2000, 2)], &[]).unwrap();
    let pass = store.process_rollups(0, 100).unwrap();
    assert_eq!(records(&store), before);
    assert_eq!((pass.hours, pass.kept_past_retention), (1, 1));
    // Counted as an hour left past a retention (QA47 N3: it was counted nowhere).
    let counted = |s: &Store| s.stats().rollup_hours_past_retention.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(counted(&store), 1);
    // The same after a reopen (the drop is remembered), and the next drop deletes the replay.
    drop(store);
    let store = open(dir.path());
    store.write(vec![row(JAN1 + HOUR_MS, 4)], &[]).unwrap();
    let pass = store.process_rollups(0, 100).unwrap();
    assert_eq!(records(&store), before);
    assert_eq!((pass.hours, pass.kept_past_retention), (1, 1));
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    // A drop that finds such an hour still marked leaves it as it was, and says so rather than
    // that it rolled it up (QA47 N3: each retention run did).
    store.write(vec![row(JAN1 + HOUR_MS + 1000, 8)], &[]).unwrap();
    let (drop, said) = logged::logged(tracing::Level::INFO, || store.drop_expired_partitions(JAN5 - 1).unwrap());
    assert_eq!(drop, dropped(&[(A, 19_723)]));
    assert_eq!(records(&store), before);
    assert_eq!(counted(&store), 2);
    let said: Vec<&str> = said.iter().filter(|l| l.contains("for good")).map(String::as_str).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("deleted for good readings written into hours after their roll-up"), "{}", said[0]);
    assert!(said[0].contains("hours=1 partitions=1"), "{}", said[0]);
    assert_eq!(store.read_range(A, "dev_1", TimeRange { start: JAN1, end: JAN1 + DAY_MS }).unwrap(), Some(vec![]));

    // An hour first rolled up after the delete (a backlog arriving in two parts) counts what
    // its bucket holds, both parts, as any hour does; until its partition is deleted again.
    let five = JAN1 + 5 * HOUR_MS;
    let count = |s: &Store| -> Vec<u64> {
        let hours =
            s.rollups(A, "dev_1", Level::Hour, TimeRange { start: five, end: five + HOUR_MS }).unwrap().unwrap();
        hours.iter().map(|(_, r)| r.fields["v"].exact.count()).collect()
    };
    store.write(vec![row(five, 6)], &[]).unwrap();
    assert_eq!(store.process_rollups(0, 100).unwrap().kept_past_retention, 0);
    assert_eq!(count(&store), [1]);
    store.write(vec![row(five + 1000, 7)], &[]).unwrap();
    assert_eq!(store.process_rollups(0, 100).unwrap().kept_past_retention, 0);
    assert_eq!(count(&store), [2]);
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    store.write(vec![row(five + 1000, 7)], &[]).unwrap();
    assert_eq!(store.process_rollups(0, 100).unwrap().kept_past_retention, 1);
    assert_eq!(count(&store), [2], "the replay after the second delete leaves the hour as it was");
}

/// Jan 1 10:00, the hour of [`first_readings_into_a_dropped_hour`].
const TEN: i64 = JAN1 + 10 * HOUR_MS;

/// A reading of device `device` of table A.
fn row(device: &str, ts: i64, k: i64) -> DeviceReading {
    DeviceReading { table: A.into(), device: device.into(), reading: reading(ts, k) }
}

/// A store in `dir` whose table A (day partitions, hot retention 2 days) had dev_1's hour
/// [`TEN`] rolled up (closed by a reading of Jan 2) and Jan 1 dropped, and then got dev_2's
/// first readings into that hour (`v` 10.25 and 20.25), not rolled up yet.
fn first_readings_into_a_dropped_hour(dir: &std::path::Path) -> Store {
    let store = open(dir);
    store.define_table(A, PartitionSize::Day, Some(2 * DAY_MS as u64)).unwrap();
    store.write(vec![row("dev_1", TEN + 1000, 1), row("dev_1", JAN1 + DAY_MS, 2)], &[]).unwrap();
    assert_eq!(store.process_rollups(0, 100).unwrap().hours, 1);
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    store.write(vec![row("dev_2", TEN + 2000, 10), row("dev_2", TEN + 3000, 20)], &[]).unwrap();
    store
}

/// (start, count, sum) of `v` in each record.
fn v_sums(records: Vec<(i64, bucketer::rollups::Record)>) -> Vec<(i64, u64, f64)> {
    records.iter().map(|(start, r)| (*start, r.fields["v"].exact.count(), r.fields["v"].exact.sum())).collect()
}

/// What was stored into a partition deleted for good and not rolled up yet when the next drop
/// deletes it again (here a device's first readings into an hour of it: a backlog, a replay)
/// is rolled up by the drop before it goes (QA23 F1). Before, a pass a moment later found the
/// bucket gone and left the device-hour without a record, and the device's next reading into
/// the hour was then rolled up as if it were its first.
#[test]
fn a_drop_rolls_up_what_was_stored_into_its_partitions_first() {
    use rollup::period::Level;
    let dir = tempfile::tempdir().unwrap();
    let store = first_readings_into_a_dropped_hour(dir.path());
    // The next drop, before any pass.
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    let hour = TimeRange { start: TEN, end: TEN + HOUR_MS };
    // dev_2's hour and the table's.
    let sums = |s: &Store| {
        (
            v_sums(s.rollups(A, "dev_2", Level::Hour, hour).unwrap().unwrap()),
            v_sums(s.group_rollups(A, "", Level::Hour, hour).unwrap().unwrap()),
        )
    };
    let expected = (vec![(TEN, 2, 30.5)], vec![(TEN, 3, 31.75)]);
    assert_eq!(sums(&store), expected, "dev_2's hour and the table's, rolled up by the drop");
    assert_eq!(store.read_range(A, "dev_2", ALL).unwrap(), Some(vec![]));
    // Its next reading into the hour finds it rolled up and deleted: left as it was.
    store.write(vec![row("dev_2", TEN + 4000, 40)], &[]).unwrap();
    let pass = store.process_rollups(0, 100).unwrap();
    assert_eq!((pass.hours, pass.kept_past_retention), (1, 1));
    assert_eq!(sums(&store), expected);
}

/// Once roll-ups are stopped (an ordered stop), a drop leaves a partition with readings not
/// rolled up yet, where it went on and deleted them before (QA25 F1): the next start rolls
/// them up and deletes it.
#[test]
fn a_drop_after_roll_ups_stopped_leaves_what_it_cannot_roll_up() {
    use rollup::period::Level;
    let dir = tempfile::tempdir().unwrap();
    let store = first_readings_into_a_dropped_hour(dir.path());
    store.stop_rollups();
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[]));
    let jan1 = TimeRange { start: JAN1, end: JAN1 + DAY_MS };
    let stored = vec![reading(TEN + 2000, 10), reading(TEN + 3000, 20)];
    assert_eq!(store.read_range(A, "dev_2", jan1).unwrap(), Some(stored));
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(A, 19_723)]));
    let hour = TimeRange { start: TEN, end: TEN + HOUR_MS };
    assert_eq!(v_sums(store.rollups(A, "dev_2", Level::Hour, hour).unwrap().unwrap()), [(TEN, 2, 30.5)]);
    assert_eq!(store.read_range(A, "dev_2", jan1).unwrap(), Some(vec![]));
}

/// The `catalog` keys of a store closed as `serve` closes it (flushed), of its partitions deleted
/// for good and of its device-hours first rolled up after such a delete: (`b'x'`, `b'y'`) keys.
fn deleted_marks(dir: &std::path::Path) -> (usize, usize) {
    let opts = rocksdb::Options::default();
    let cfs = rocksdb::DB::list_cf(&opts, dir).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&opts, dir, &cfs, false).unwrap();
    let catalog = db.cf_handle(bucketer::store::CF_CATALOG).unwrap();
    let keys: Vec<_> = db.iterator_cf(catalog, rocksdb::IteratorMode::Start).map(|kv| kv.unwrap().0).collect();
    let count = |prefix: u8| keys.iter().filter(|k| k[0] == prefix).count();
    (count(bucketer::keys::DELETED_PREFIX), count(bucketer::keys::AFTER_DELETE_PREFIX))
}

/// A partition deleted for good stays marked while a pass may still roll up one of its hours,
/// and is forgotten by the first pass after its last hour has left the table's hour roll-up
/// retention (a pass leaves such hours as they are), with its device-hours' after-delete
/// marks; across a reopen. A table keeping its roll-ups forever keeps the marks.
#[test]
fn a_deleted_partition_is_forgotten_once_its_hours_are_past_the_roll_up_retention() {
    const P: &str = "p.three_days"; // hour roll-ups kept 3 days
    const Q: &str = "q.forever"; // roll-ups kept forever
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let spec = |rollup_retention| bucketer::TableSpec {
        partition: PartitionSize::Day,
        hot_retention_ms: Some(2 * DAY_MS as u64),
        rollup_retention,
        ..bucketer::TableSpec::default()
    };
    let three_days = bucketer::RollupRetention { hour_ms: Some(3 * DAY_MS as u64), day_ms: Some(10 * DAY_MS as u64) };
    store.define_table_with(P, &spec(three_days)).unwrap();
    store.define_table_with(Q, &spec(bucketer::RollupRetention::FOREVER)).unwrap();
    let row = |table: &str, ts: i64, k: i64| DeviceReading {
        table: table.into(),
        device: "dev_1".into(),
        reading: reading(ts, k),
    };
    let both = |ts: i64, k: i64| vec![row(P, ts, k), row(Q, ts, k)];
    store.write([both(JAN1 + 1000, 1), both(JAN1 + DAY_MS, 2)].concat(), &[]).unwrap();
    assert_eq!(store.process_rollups_at(0, 100, JAN1 + DAY_MS).unwrap().hours, 2);
    assert_eq!(store.drop_expired_partitions(JAN5 - 1).unwrap(), dropped(&[(P, 19_723), (Q, 19_723)]));
    // A backlog of Jan 1 after the delete: its hour is rolled up, and marked as such.
    store.write(both(JAN1 + 5 * HOUR_MS, 3), &[]).unwrap();
    let pass = store.process_rollups_at(0, 100, JAN1 + DAY_MS).unwrap();
    assert_eq!((pass.hours, pass.past_rollup_retention, pass.deleted_partitions_forgotten), (2, 0, 0));
    // Jan 1's last hour is the first one kept until Jan 5: the partition stays marked.
    assert_eq!(store.process_rollups_at(0, 100, JAN5 - 1).unwrap().deleted_partitions_forgotten, 0);
    store.flush().unwrap();
    drop(store);
    assert_eq!(deleted_marks(dir.path()), (2, 2));

    let store = open(dir.path());
    // Jan 1's hours are past the hour retention, its day is not: a pass would recompute it
    // from its buckets but for the mark (they hold only the backlog).
    assert_eq!(store.process_rollups_at(0, 100, JAN5).unwrap().deleted_partitions_forgotten, 0);
    // Another backlog of Jan 1: past the hour retention, its partition deleted: left as it is.
    store.write(vec![row(P, JAN1 + 5 * HOUR_MS + 1000, 4)], &[]).unwrap();
    let pass = store.process_rollups_at(0, 100, JAN5).unwrap();
    let left = (pass.hours, pass.past_rollup_retention, pass.kept_past_retention, pass.days_from_buckets);
    assert_eq!(left, (1, 1, 0, 0));
    // Forgotten once Jan 1 is past the day retention too: 10 days after its end.
    let jan12 = JAN1 + 11 * DAY_MS;
    assert_eq!(store.process_rollups_at(0, 100, jan12 - 1).unwrap().deleted_partitions_forgotten, 0);
    assert_eq!(store.process_rollups_at(0, 100, jan12).unwrap().deleted_partitions_forgotten, 1);
    assert_eq!(store.process_rollups_at(0, 100, jan12).unwrap().deleted_partitions_forgotten, 0);
    store.flush().unwrap();
    drop(store);
    assert_eq!(deleted_marks(dir.path()), (1, 1), "the table keeping its roll-ups forever keeps its marks");
    let store = open(dir.path());
    assert_eq!(store.process_rollups_at(0, 100, JAN5 + 400 * DAY_MS).unwrap().deleted_partitions_forgotten, 0);
}
