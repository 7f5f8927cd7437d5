//! The store against an oracle, on real RocksDB files in temp dirs: merge results do not depend
//! on how operands were merged (at read, partially in compaction, across restarts), and reads
//! equal a `BTreeMap` model where the last write of a (table, device, ts) wins.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bucketer::{Store, StoreConfig};
use model::{DeviceReading, Hour, Reading, TimeRange};
use proptest::prelude::*;

const HOUR: i64 = model::HOUR_MS;

fn dr(table: &str, device: &str, ts: i64, fields: &[(&str, f64)]) -> DeviceReading {
    DeviceReading {
        table: table.into(),
        device: device.into(),
        reading: Reading::new(ts, fields.iter().map(|(n, v)| (Arc::from(*n), *v)).collect()),
    }
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreConfig::default()).unwrap()
}

/// One write: readings of one device in one hour.
fn operand() -> impl Strategy<Value = Vec<(i64, Option<f64>, Option<f64>)>> {
    prop::collection::vec((0i64..60, prop::option::of(-1e6f64..1e6), prop::option::of(0u8..200)), 1..12)
        .prop_map(|v| v.into_iter().map(|(m, a, b)| (m * 60_000, a, b.map(|b| b as f64 * 0.5))).collect::<Vec<_>>())
}

fn to_readings(op: &[(i64, Option<f64>, Option<f64>)], base: i64) -> Vec<DeviceReading> {
    op.iter()
        .map(|(off, a, b)| {
            let mut f = Vec::new();
            if let Some(a) = a {
                f.push(("a", *a));
            }
            // A reading needs a field; ingest guarantees it, the generator does too.
            f.push(("b", b.unwrap_or(1.0)));
            dr("t.one", "dev", base + off, &f)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// The same operands give byte-identical buckets whether merged at read time, partially by
    /// compactions between writes, across a reopen, or through the write buffer (flushed, and
    /// its records replayed at a reopen, on the way).
    #[test]
    fn merge_is_the_same_full_partial_or_across_compaction(ops in prop::collection::vec(operand(), 1..8)) {
        let base = -HOUR; // the hour before 1970
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        // 1: everything in the memtable, merged on read.
        let s1 = open(dirs[0].path());
        for op in &ops {
            s1.write(to_readings(op, base), &[]).unwrap();
        }
        // 2: an SST per operand, then a full compaction (partial merges of operands).
        let s2 = open(dirs[1].path());
        for op in &ops {
            s2.write(to_readings(op, base), &[]).unwrap();
            s2.flush().unwrap();
        }
        s2.compact().unwrap();
        // 3: compaction after every other operand, and a reopen in the middle.
        let mut s3 = open(dirs[2].path());
        for (i, op) in ops.iter().enumerate() {
            s3.write(to_readings(op, base), &[]).unwrap();
            if i % 2 == 1 {
                s3.compact().unwrap();
            }
            if i == ops.len() / 2 {
                drop(s3);
                s3 = open(dirs[2].path());
            }
        }
        // 4: through the write buffer: flushed after the first operand, the rest replayed from
        // its records at a reopen, then flushed.
        let buffered = || StoreConfig { write_buffer: bucketer::WriteBufferConfig::of_mib(64), ..StoreConfig::default() };
        let mut s4 = Store::open(dirs[3].path(), buffered()).unwrap();
        for (i, op) in ops.iter().enumerate() {
            s4.write(to_readings(op, base), &[]).unwrap();
            if i == 0 {
                s4.flush_write_buffer().unwrap();
            }
        }
        drop(s4);
        s4 = Store::open(dirs[3].path(), buffered()).unwrap();
        let b1 = s1.bucket_bytes("t.one", "dev", Hour(-1)).unwrap().expect("bucket");
        let b4 = s4.bucket_bytes("t.one", "dev", Hour(-1)).unwrap().expect("bucket");
        prop_assert_eq!(&b1, &b4);
        let b2 = s2.bucket_bytes("t.one", "dev", Hour(-1)).unwrap().expect("bucket");
        let b3 = s3.bucket_bytes("t.one", "dev", Hour(-1)).unwrap().expect("bucket");
        prop_assert_eq!(&b1, &b2);
        prop_assert_eq!(&b1, &b3);

        // And the bucket holds exactly the last write of each timestamp.
        let mut oracle = BTreeMap::new();
        for op in &ops {
            for r in to_readings(op, base) {
                oracle.insert(r.reading.ts, r.reading);
            }
        }
        let got = s3.read_range("t.one", "dev", TimeRange::new(base, 0).unwrap()).unwrap().unwrap();
        let want: Vec<Reading> = oracle.into_values().collect();
        prop_assert_eq!(got, want);
    }

    /// Random writes over several tables, devices, hours and day partitions (both sides of
    /// 1970), with compactions and reopens in between, read back as the model says.
    #[test]
    fn store_matches_a_btreemap_model(
        writes in prop::collection::vec(
            prop::collection::vec((0usize..2, 0usize..3, -50i64..50, -100i32..100), 1..30),
            1..6,
        ),
        compact_after in prop::collection::vec(any::<bool>(), 6),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let tables = ["t.a", "t.b"];
        let devices = ["d0", "d1", "d2"];
        // Steps of 37 minutes from 25 hours before 1970: crosses hours and days.
        let ts_of = |step: i64| step * 37 * 60_000 - 25 * HOUR + 1234;
        let mut model: BTreeMap<(usize, usize, i64), Reading> = BTreeMap::new();
        for (w, batch) in writes.iter().enumerate() {
            let readings: Vec<DeviceReading> = batch
                .iter()
                .map(|&(t, d, step, v)| dr(tables[t], devices[d], ts_of(step), &[("v", v as f64 / 4.0)]))
                .collect();
            for (r, &(t, d, step, _)) in readings.iter().zip(batch) {
                model.insert((t, d, ts_of(step)), r.reading.clone());
            }
            store.write(readings, &[]).unwrap();
            if compact_after[w] {
                store.compact().unwrap();
                drop(store);
                store = open(dir.path());
            }
        }
        let all = TimeRange::new(ts_of(-60), ts_of(60)).unwrap();
        for (t, table) in tables.iter().enumerate() {
            for (d, device) in devices.iter().enumerate() {
                let want: Vec<Reading> =
                    model.range((t, d, i64::MIN)..=(t, d, i64::MAX)).map(|(_, r)| r.clone()).collect();
                let got = store.read_range(table, device, all).unwrap();
                if want.is_empty() {
                    // Unknown table, or a device that never wrote to this table.
                    prop_assert!(got.is_none());
                    continue;
                }
                prop_assert_eq!(got.as_ref(), Some(&want));
                // A sub-range is the model's sub-range (half-open).
                let sub = TimeRange::new(ts_of(-10), ts_of(10)).unwrap();
                let want_sub: Vec<Reading> = want.iter().filter(|r| sub.contains(r.ts)).cloned().collect();
                prop_assert_eq!(store.read_range(table, device, sub).unwrap(), Some(want_sub));
                let latest = store.latest(table, &[*device]).unwrap().unwrap();
                prop_assert_eq!(&latest[0], &want.last().cloned());
            }
        }
    }
}

#[test]
fn latest_answers_in_request_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .write(
            vec![
                dr("fleet", "a", 5_000, &[("x", 1.0)]),
                dr("fleet", "b", 7_000, &[("x", 2.0)]),
                dr("fleet", "a", 3_000, &[("x", 3.0)]), // older: not the latest
                dr("other", "c", 9_000, &[("x", 4.0)]),
            ],
            &[],
        )
        .unwrap();
    store.write(vec![dr("fleet", "b", 7_000, &[("y", 5.0)])], &[]).unwrap(); // same ts: last wins
    let got = store.latest("fleet", &["b", "zz", "a", "c"]).unwrap().unwrap();
    assert_eq!(
        got,
        vec![
            Some(Reading::new(7_000, vec![("y".into(), 5.0)])),
            None,
            Some(Reading::new(5_000, vec![("x".into(), 1.0)])),
            None, // c exists, but not in this table
        ]
    );
    assert_eq!(store.latest("nope", &["a"]).unwrap(), None);
}

/// An `invalid_json` dead letter received at `ms` whose detail and payload are `detail`.
fn letter(ms: i64, detail: &str) -> model::DeadLetter {
    model::DeadLetter {
        received_ms: ms,
        source: "hourglass/t/d".into(),
        reason: model::DeadLetterReason::InvalidJson,
        detail: detail.into(),
        payload: detail.as_bytes().to_vec(),
    }
}

#[test]
fn dead_letters_are_listed_newest_first_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.write(vec![], &[letter(10, "first"), letter(10, "second")]).unwrap();
    }
    let store = open(dir.path());
    store.write(vec![], &[letter(5, "third, older clock")]).unwrap();
    let got = store.dead_letters(10).unwrap();
    let details: Vec<(&str, i64, u64)> = got.iter().map(|d| (d.detail.as_str(), d.received_ms, d.seq)).collect();
    assert_eq!(details, [("second", 10, 1), ("first", 10, 0), ("third, older clock", 5, 2)]);
    assert_eq!(got[0].reason, "invalid_json");
    assert_eq!(got[0].payload, b"second");
    assert_eq!(store.dead_letters(1).unwrap().len(), 1);
}

/// Dead letters filtered by reason and source prefix, paged with `before`, and a filter few
/// letters pass stopped after [`bucketer::MAX_EXAMINED_DEAD_LETTERS`] with a cursor to go on.
#[test]
fn dead_letter_pages_filter_and_stop_after_the_examined_budget() {
    use bucketer::{DeadLetterFilter, MAX_EXAMINED_DEAD_LETTERS};
    use model::DeadLetterReason as R;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let letter = |ms: i64, reason: R, source: &str| model::DeadLetter {
        received_ms: ms,
        source: source.into(),
        reason,
        detail: String::new(),
        payload: format!("{ms}").into_bytes(),
    };
    // The three oldest are the only `wrong_field_type` ones; then a budget's worth and two more
    // of `invalid_json`, from two topics.
    let mut letters = vec![
        letter(1, R::WrongFieldType, "kafka:t/0@7"),
        letter(2, R::WrongFieldType, "hourglass/a/d1"),
        letter(3, R::WrongFieldType, "kafka:t/1@9"),
    ];
    let newer = MAX_EXAMINED_DEAD_LETTERS as i64 + 2;
    letters.extend(
        (0..newer)
            .map(|i| letter(10 + i, R::InvalidJson, if i % 2 == 0 { "hourglass/a/d1" } else { "hourglass/b/d2" })),
    );
    for chunk in letters.chunks(10_000) {
        store.write(vec![], chunk).unwrap();
    }
    let ms = |page: &bucketer::DeadLetterPage| -> Vec<i64> { page.letters.iter().map(|d| d.received_ms).collect() };
    let newest = 10 + newer - 1;

    // Unfiltered pages of 2, followed by their cursors.
    let first = store.dead_letters_page(&DeadLetterFilter::default(), 2).unwrap();
    assert_eq!(ms(&first), [newest, newest - 1]);
    let cursor = first.next.unwrap();
    assert_eq!((cursor.received_ms, cursor.seq), (newest - 1, newer as u64 + 1));
    let second = store.dead_letters_page(&DeadLetterFilter { before: Some(cursor), ..Default::default() }, 2).unwrap();
    assert_eq!(ms(&second), [newest - 2, newest - 3]);
    assert_eq!(
        store.dead_letters(3).unwrap().iter().map(|d| d.received_ms).collect::<Vec<_>>(),
        [newest, newest - 1, newest - 2]
    );

    // By source prefix and reason: the last page ends with no cursor.
    let kafka = DeadLetterFilter { source_prefix: Some("kafka:t/".into()), ..Default::default() };
    let tail =
        DeadLetterFilter { before: Some(bucketer::keys::DeadLetterKey { received_ms: 12, seq: 5 }), ..kafka.clone() };
    let page = store.dead_letters_page(&tail, 10).unwrap();
    assert_eq!((ms(&page), page.next), (vec![3, 1], None));
    let d2 = DeadLetterFilter { source_prefix: Some("hourglass/b/".into()), ..Default::default() };
    let page = store.dead_letters_page(&d2, 3).unwrap();
    assert_eq!(ms(&page), [newest, newest - 2, newest - 4]);
    assert!(page.letters.iter().all(|d| d.source == "hourglass/b/d2" && d.reason == "invalid_json"));

    // `wrong_field_type`: the first page examines its budget, all `invalid_json`, and finds
    // none; the second finds the three, the last two of the newer ones before them.
    let wrong = DeadLetterFilter { reason: Some("wrong_field_type".into()), ..Default::default() };
    let page = store.dead_letters_page(&wrong, 100).unwrap();
    assert_eq!(ms(&page), Vec::<i64>::new());
    let cursor = page.next.expect("a cursor after the budget");
    assert_eq!(cursor.received_ms, newest - MAX_EXAMINED_DEAD_LETTERS as i64 + 1);
    let page = store.dead_letters_page(&DeadLetterFilter { before: Some(cursor), ..wrong.clone() }, 100).unwrap();
    assert_eq!((ms(&page), page.next), (vec![3, 2, 1], None));
    assert_eq!(page.letters[0].source, "kafka:t/1@9");
    assert_eq!(page.letters[0].payload, b"3");
}

/// Letters of large payloads: a page stops once it examined
/// [`bucketer::MAX_EXAMINED_DEAD_LETTER_BYTES`], with a cursor, and always examines one.
#[test]
fn dead_letter_pages_stop_after_the_examined_bytes() {
    use bucketer::{DeadLetterFilter, MAX_EXAMINED_DEAD_LETTER_BYTES};
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Five letters of 6 MiB (16 MiB is reached after three); then one of 20 MiB, newest.
    let big = |ms: i64, mib: usize| model::DeadLetter { payload: vec![b'{'; mib << 20], ..letter(ms, "big") };
    assert_eq!(MAX_EXAMINED_DEAD_LETTER_BYTES, 16 << 20);
    store.write(vec![], &(1..=5).map(|ms| big(ms, 6)).collect::<Vec<_>>()).unwrap();
    store.write(vec![], &[big(6, 20)]).unwrap();
    let ms = |page: &bucketer::DeadLetterPage| -> Vec<i64> { page.letters.iter().map(|d| d.received_ms).collect() };
    let mut filter = DeadLetterFilter::default();
    let mut pages = Vec::new();
    loop {
        let page = store.dead_letters_page(&filter, 100).unwrap();
        pages.push(ms(&page));
        match page.next {
            Some(next) => filter.before = Some(next),
            None => break,
        }
        assert!(pages.len() < 6, "{pages:?}");
    }
    assert_eq!(pages, [vec![6], vec![5, 4, 3], vec![2, 1]]);
}

#[test]
fn expired_dead_letters_are_deleted_and_their_numbers_never_given_again() {
    let dir = tempfile::tempdir().unwrap();
    let listed = |store: &Store| -> Vec<(String, i64, u64)> {
        store.dead_letters(100).unwrap().into_iter().map(|d| (d.detail, d.received_ms, d.seq)).collect()
    };
    {
        let store = open(dir.path());
        // Numbers 0..=4; the clock went back once (number 3 is older than 2).
        store.write(vec![], &[letter(-5, "a"), letter(10, "b"), letter(20, "c")]).unwrap();
        store.write(vec![], &[letter(15, "d"), letter(30, "e")]).unwrap();
        // Nothing before -5: nothing deleted, nothing changed.
        assert_eq!(store.expire_dead_letters(-5).unwrap(), bucketer::ExpiredDeadLetters::default());
        assert_eq!(listed(&store).len(), 5);
        // Before 20: -5, 10 and 15 go; 20 itself stays.
        let expired = store.expire_dead_letters(20).unwrap();
        assert_eq!(expired, bucketer::ExpiredDeadLetters { count: 3, oldest_ms: Some(-5) });
        assert_eq!(listed(&store), [("e".to_string(), 30, 4), ("c".to_string(), 20, 2)]);
        // The same cut again deletes nothing.
        assert_eq!(store.expire_dead_letters(20).unwrap().count, 0);
        store.write(vec![], &[letter(40, "f")]).unwrap();
        assert_eq!(
            store.expire_dead_letters(i64::MAX).unwrap(),
            bucketer::ExpiredDeadLetters { count: 3, oldest_ms: Some(20) }
        );
        assert_eq!(listed(&store), []);
    }
    // Every letter expired: the next one is numbered after the last given (5), not from 0.
    let store = open(dir.path());
    assert_eq!(listed(&store), []);
    store.write(vec![], &[letter(50, "g")]).unwrap();
    assert_eq!(listed(&store), [("g".to_string(), 50, 6)]);
    // A letter with a larger number than the newest kept one (an older clock) expires: the
    // numbers go on after it, not after the newest letter kept (6).
    store.write(vec![], &[letter(1, "h, older clock")]).unwrap();
    assert_eq!(store.expire_dead_letters(2).unwrap().count, 1);
    drop(store);
    let store = open(dir.path());
    store.write(vec![], &[letter(60, "i")]).unwrap();
    assert_eq!(listed(&store), [("i".to_string(), 60, 8), ("g".to_string(), 50, 6)]);
}

/// The compaction style of each column family, as RocksDB persisted it in the newest OPTIONS
/// file of the store at `dir`.
fn compaction_styles(dir: &std::path::Path) -> BTreeMap<String, String> {
    cf_option(dir, "compaction_style")
}

/// The value of option `key` of each column family, from the newest OPTIONS file of `dir`.
fn cf_option(dir: &std::path::Path, key: &str) -> BTreeMap<String, String> {
    let sections = bucketer::store::persisted_options(dir).unwrap().unwrap();
    sections
        .iter()
        .filter_map(|(section, options)| {
            let cf = section.strip_prefix("CFOptions \"")?.strip_suffix('"')?;
            Some((cf.to_string(), options.get(key)?.clone()))
        })
        .collect()
}

/// A store written under one compaction style opens under the other and keeps every reading,
/// in both directions, with files in level 0 and in the bottommost level at each switch.
#[test]
fn a_store_reopens_under_the_other_compaction_style() {
    use bucketer::{Compaction, DbOptions};
    let dir = tempfile::tempdir().unwrap();
    let open_as = |compaction| {
        Store::open(
            dir.path(),
            StoreConfig { db: DbOptions { compaction, ..DbOptions::default() }, ..StoreConfig::default() },
        )
        .unwrap()
    };
    let reading = |i: i64| dr("t.one", &format!("d{}", i % 3), i * 60_000, &[("v", i as f64)]);
    let mut store = open_as(Compaction::Leveled);
    let styles = compaction_styles(dir.path());
    assert_eq!(styles["buckets"], "kCompactionStyleLevel");
    // Three rounds of 40 minutes, each under the other style: a flushed round compacted to the
    // bottom, then one left in level 0 (an SST per flush), then the switch.
    for (round, compaction) in
        [Compaction::Universal, Compaction::Leveled, Compaction::Universal].into_iter().enumerate()
    {
        let start = round as i64 * 40;
        for chunk in (start..start + 40).collect::<Vec<_>>().chunks(10) {
            store.write(chunk.iter().map(|&i| reading(i)).collect(), &[]).unwrap();
            store.flush().unwrap();
            if chunk[0] == start + 10 {
                store.compact().unwrap();
            }
        }
        drop(store);
        store = open_as(compaction);
        let style =
            if compaction == Compaction::Universal { "kCompactionStyleUniversal" } else { "kCompactionStyleLevel" };
        let styles = compaction_styles(dir.path());
        assert_eq!((styles["buckets"].as_str(), styles["latest"].as_str()), (style, style));
        assert_eq!(styles["registry"], "kCompactionStyleLevel");
        // Every reading so far, per device, in time order; the latest is the newest.
        for d in 0..3 {
            let want: Vec<Reading> = (0..start + 40).filter(|i| i % 3 == d).map(|i| reading(i).reading).collect();
            let all = TimeRange::new(0, 3 * HOUR).unwrap();
            assert_eq!(store.read_range("t.one", &format!("d{d}"), all).unwrap(), Some(want.clone()));
            assert_eq!(store.latest("t.one", &[format!("d{d}").as_str()]).unwrap(), Some(vec![want.last().cloned()]));
        }
    }
    store.compact().unwrap();
    let want: Vec<Reading> = (0..120).filter(|i| i % 3 == 1).map(|i| reading(i).reading).collect();
    assert_eq!(store.read_range("t.one", "d1", TimeRange::new(0, 3 * HOUR).unwrap()).unwrap(), Some(want));
}

/// `buckets` takes more level-0 files than RocksDB's defaults before it compacts them (12),
/// slows (100) and stops (140) the writes, and flushes 256 MiB memtables rather than the others'
/// 64 MiB; the other column families keep the defaults (4, 20 and 36). Its level 0 is
/// compacted for its size only at 1 GiB, not the default 256 MiB.
#[test]
fn buckets_take_more_level0_files_before_writes_slow() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path(), StoreConfig::default()).unwrap());
    let memtable = cf_option(dir.path(), "write_buffer_size");
    assert_eq!((memtable["buckets"].as_str(), memtable["latest"].as_str()), ("268435456", "67108864"));
    let compact = cf_option(dir.path(), "level0_file_num_compaction_trigger");
    let slowdown = cf_option(dir.path(), "level0_slowdown_writes_trigger");
    let stop = cf_option(dir.path(), "level0_stop_writes_trigger");
    let at = |name: &str| (compact[name].as_str(), slowdown[name].as_str(), stop[name].as_str());
    assert_eq!(at("buckets"), ("12", "100", "140"));
    for name in ["latest", "registry", "dirty", "rollups", "wbuf"] {
        assert_eq!(at(name), ("4", "20", "36"), "{name}");
    }
    // … and level 0 is not compacted for its bytes before it holds 1 GiB (the others: 256 MiB).
    let level_base = cf_option(dir.path(), "max_bytes_for_level_base");
    assert_eq!((level_base["buckets"].as_str(), level_base["latest"].as_str()), ("1073741824", "268435456"));
}

/// Bytes of write-ahead log in the store's directory.
fn wal_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// The write-ahead log stays near `DbOptions::max_wal_bytes` when column families written once
/// (the catalog, the registry, each device-hour's `latest` entry and dirty mark) would hold
/// their memtables, and with them every log file written since: RocksDB flushes them so the
/// oldest file can go. The same writes under RocksDB's own limit (`max_wal_bytes: 0`, four
/// times all the memtables) keep all of their log (more than 16 MiB). Every reading is there
/// after a reopen.
#[test]
fn the_write_ahead_log_stays_within_its_limit() {
    use bucketer::DbOptions;
    const LIMIT: u64 = 4 << 20;
    const DEVICES: i64 = 500;
    const BATCHES: i64 = 1_000;
    let config = |max_wal_bytes| StoreConfig {
        db: DbOptions { max_wal_bytes, ..DbOptions::default() },
        ..StoreConfig::default()
    };
    let reading = |batch: i64, d: i64| {
        dr("t.one", &format!("d{d}"), batch * 1_000, &[("a", (batch * DEVICES + d) as f64), ("b", 0.5)])
    };
    let write_all = |store: &Store| {
        for batch in 0..BATCHES {
            store.write((0..DEVICES).map(|d| reading(batch, d)).collect(), &[]).unwrap();
        }
    };

    let unlimited = tempfile::tempdir().unwrap();
    let store = Store::open(unlimited.path(), config(0)).unwrap();
    write_all(&store);
    let kept = wal_bytes(unlimited.path());
    assert!(kept > 4 * LIMIT, "under RocksDB's own limit all {kept} bytes of log stay");
    drop(store);

    let limited = tempfile::tempdir().unwrap();
    let store = Store::open(limited.path(), config(LIMIT)).unwrap();
    write_all(&store);
    // The flushes that free the oldest files run in the background: wait for them, boundedly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while wal_bytes(limited.path()) > 2 * LIMIT && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left = wal_bytes(limited.path());
    assert!(left <= 2 * LIMIT, "{left} bytes of log left of {kept} written, limit {LIMIT}");
    drop(store);

    let store = Store::open(limited.path(), config(LIMIT)).unwrap();
    let all = TimeRange::new(0, HOUR).unwrap();
    for d in [0, 1, DEVICES - 1] {
        let want: Vec<Reading> = (0..BATCHES).map(|b| reading(b, d).reading).collect();
        assert_eq!(store.read_range("t.one", &format!("d{d}"), all).unwrap(), Some(want));
    }
}

/// The open reads with RocksDB's automatic compactions off and turns them on before it returns:
/// level 0 of `buckets` filled to its trigger is compacted without being asked.
#[test]
fn automatic_compactions_run_once_the_store_is_open() {
    let trigger = bucketer::store::BUCKETS_L0_COMPACTION_TRIGGER as u64;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
    let l0_files = || {
        let stats = store.db_stats().unwrap();
        stats.column_families.iter().find(|c| c.name == "buckets").unwrap().l0_files
    };
    for batch in 0..trigger as i64 {
        let readings = (0..50).map(|d| dr("t.one", &format!("d{d}"), batch * 1_000, &[("a", d as f64)])).collect();
        store.write(readings, &[]).unwrap();
        store.flush().unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = l0_files();
    while seen >= trigger && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        seen = l0_files();
    }
    assert!(seen < trigger, "{seen} level-0 files of `buckets` after 60 s; the trigger is {trigger}");
    let all = TimeRange::new(0, HOUR).unwrap();
    assert_eq!(store.read_range("t.one", "d7", all).unwrap().map(|r| r.len()), Some(trigger as usize));
}

/// Once the store stops its background work (as the process stops, after the last flush), no
/// flush or compaction runs: a full compaction asked for is refused and the level-0 files stay
/// where they are, where the same request compacts them all on a store still running. Reads go
/// on either way.
#[test]
fn no_compaction_runs_once_background_work_is_stopped() {
    let readings = |batch: i64| -> Vec<DeviceReading> {
        (0..50).map(|d| dr("t.one", &format!("d{d}"), batch * 1_000, &[("a", (batch * 50 + d) as f64)])).collect()
    };
    let l0_files = |store: &Store| {
        let stats = store.db_stats().unwrap();
        stats.column_families.iter().find(|c| c.name == "buckets").unwrap().l0_files
    };
    let all = TimeRange::new(0, HOUR).unwrap();
    let want: Vec<Reading> = (0..3).map(|b| readings(b)[7].reading.clone()).collect();
    for stop in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        for batch in 0..3 {
            store.write(readings(batch), &[]).unwrap();
            store.flush().unwrap();
        }
        assert_eq!(l0_files(&store), 3, "one level-0 file a flush");
        if stop {
            store.stop_background_work();
            let refused = store.compact().unwrap_err().to_string();
            assert!(refused.contains("Shutdown in progress"), "{refused}");
        } else {
            store.compact().unwrap();
        }
        assert_eq!(l0_files(&store), if stop { 3 } else { 0 }, "stopped: {stop}");
        if stop {
            // A running store may start a compaction of its own at any time; a stopped one not.
            assert_eq!(store.db_stats().unwrap().running_compactions, 0);
        }
        assert_eq!(store.read_range("t.one", "d7", all).unwrap(), Some(want.clone()));
    }
}

/// A store whose directory is deleted or replaced while it is open acknowledges nothing more:
/// RocksDB wrote on into the deleted files, so writes were answered as stored while a restart
/// found a new, empty store there (the QA's `rm -rf` of a running data_dir: 102,000 readings
/// acknowledged, then lost).
#[test]
fn a_store_whose_directory_is_gone_acknowledges_no_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = open(&path);
    store.write(vec![dr("t", "d", 1_000, &[("v", 1.0)])], &[]).unwrap();
    assert!(store.directory_intact().is_ok());
    std::fs::rename(&path, dir.path().join("moved")).unwrap();
    let gone = format!(
        "the store's directory {} was deleted or replaced while the store was open: what is written now is lost at \
         the next start, so nothing is acknowledged; restart Hourglass once its data_dir is what it should be",
        path.display()
    );
    let err = store.write(vec![dr("t", "d", 2_000, &[("v", 2.0)])], &[]).unwrap_err();
    assert_eq!(err.to_string(), gone);
    // Another directory in its place is not it either.
    std::fs::create_dir(&path).unwrap();
    assert_eq!(store.directory_intact().unwrap_err().to_string(), gone);
}
