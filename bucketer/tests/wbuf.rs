//! The write buffer of open hour buckets on real RocksDB in temp dirs: a store with the buffer
//! on reads, lists and rolls up exactly like one without it, whatever the interleaving of
//! writes, rewrites, late readings, outlier hours, flushes and restarts; a process killed with
//! readings only in the buffer's records loses none of them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use bucketer::{Store, StoreConfig, WriteBufferConfig};
use model::{DeviceReading, Reading, TimeRange, HOUR_MS};
use proptest::prelude::*;
use rollup::period::Level;

const T: &str = "plant.wbuf";
/// 2024-01-31T22:00:00Z: four hours from here cross a day (partition) and a month boundary.
const BASE: i64 = 1_706_738_400_000;
const HOURS: i64 = 4;
/// `fast` writes enough to be flagged as an outlier (see `config`).
const DEVICES: [&str; 4] = ["d0", "d1", "d2", "fast"];
const ALL: TimeRange = TimeRange { start: BASE - 10 * HOUR_MS, end: BASE + 10 * HOUR_MS };

fn config(buffer_bytes: Option<usize>) -> StoreConfig {
    config_bypass(buffer_bytes, 0.0)
}

/// A store whose write buffer (if any) goes straight through for the rest of the test once it
/// fills with fewer than `bypass_below` operands a device-hour.
fn config_bypass(buffer_bytes: Option<usize>, bypass_below: f64) -> StoreConfig {
    StoreConfig {
        // Low, so `fast` overflows into per-minute sub-buckets within a scenario.
        bucket_max_readings: 12,
        write_buffer: buffer_bytes.map(|max_bytes| WriteBufferConfig {
            max_bytes,
            max_age: Duration::from_secs(3600),
            bypass_below,
            bypass_for: Duration::from_secs(3600),
        }),
        ..StoreConfig::default()
    }
}

fn row(device: &str, ts: i64, v: f64) -> DeviceReading {
    DeviceReading { table: T.into(), device: device.into(), reading: Reading::new(ts, vec![("v".into(), v)]) }
}

/// Everything a reader can see of `store`, for comparison.
fn view(store: &Store) -> String {
    let mut out = String::new();
    for d in DEVICES {
        let all = store.read_range(T, d, ALL).unwrap();
        let part = store.read_range(T, d, TimeRange::new(BASE + HOUR_MS + 30 * 60_000, BASE + 3 * HOUR_MS).unwrap());
        out.push_str(&format!("{d}: {all:?}\n  part {:?}\n  outlier {}\n", part.unwrap(), store.is_outlier(T, d)));
    }
    out.push_str(&format!("latest {:?}\n", store.latest(T, &DEVICES).unwrap()));
    out.push_str(&format!("listed {:?}\n", store.devices_with_data(T, "", 100).unwrap().map(|l| l.devices)));
    out
}

fn rollups(store: &Store) -> String {
    let mut out = String::new();
    for d in DEVICES {
        for level in Level::ALL {
            out.push_str(&format!("{d} {level:?} {:?}\n", store.rollups(T, d, level, ALL).unwrap()));
        }
    }
    for level in Level::ALL {
        out.push_str(&format!("table {level:?} {:?}\n", store.group_rollups(T, "", level, ALL).unwrap()));
    }
    out
}

#[derive(Debug, Clone)]
enum Step {
    /// One batch: (device, ts, value).
    Write(Vec<(usize, i64, f64)>),
    Flush,
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    let reading = (0..DEVICES.len(), 0..HOURS, 0i64..8, -1000i64..1000)
        .prop_map(|(d, h, m, v)| (d, BASE + h * HOUR_MS + m * 60_000 + (d as i64) * 7, v as f64 / 4.0));
    prop_oneof![
        8 => prop::collection::vec(reading, 1..12).prop_map(Step::Write),
        1 => Just(Step::Flush),
        1 => Just(Step::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Twin stores, one buffered (a budget of a few operands, so writes flush it at varying
    /// points), one writing straight through, see the same readings after every step, and the
    /// same roll-ups at the end.
    #[test]
    fn a_buffered_store_reads_like_a_direct_one(
        steps in prop::collection::vec(step(), 1..30),
        budget in 200usize..3000,
        bypass_below in prop_oneof![Just(0.0), Just(1.5), Just(3.0)],
    ) {
        let (bdir, ddir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let cfg = || config_bypass(Some(budget), bypass_below);
        let mut buffered = Store::open(bdir.path(), cfg()).unwrap();
        let mut direct = Store::open(ddir.path(), config(None)).unwrap();
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Write(batch) => {
                    let rows = || batch.iter().map(|&(d, ts, v)| row(DEVICES[d], ts, v)).collect::<Vec<_>>();
                    let a = buffered.write(rows(), &[]).unwrap();
                    let b = direct.write(rows(), &[]).unwrap();
                    prop_assert_eq!(a, b);
                }
                Step::Flush => buffered.flush_write_buffer().unwrap(),
                Step::Restart => {
                    drop(buffered);
                    buffered = Store::open(bdir.path(), cfg()).unwrap();
                    // The twin restarts too: outlier counting starts over at open.
                    drop(direct);
                    direct = Store::open(ddir.path(), config(None)).unwrap();
                }
            }
            prop_assert_eq!(view(&buffered), view(&direct), "after step {} ({:?})", i, s);
        }
        // A reading far ahead moves the watermark past every hour; then roll everything up.
        for store in [&buffered, &direct] {
            store.write(vec![row("d0", BASE + 30 * HOUR_MS, 1.0)], &[]).unwrap();
            store.process_rollups(0, usize::MAX).unwrap();
        }
        prop_assert_eq!(rollups(&buffered), rollups(&direct));
        prop_assert_eq!(view(&buffered), view(&direct));
    }
}

/// A batch goes into one record and the buffer, not into `buckets`, until a flush writes one
/// operand a device-hour for all the batches before it.
#[test]
fn batches_are_buffered_until_a_flush_writes_one_operand_a_device_hour() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), config(Some(1 << 30))).unwrap();
    for i in 0..10 {
        // Three devices, ten batches, each batch one reading of each in hour 0; d0 also in hour 1.
        let mut batch: Vec<DeviceReading> =
            ["d0", "d1", "d2"].iter().map(|d| row(d, BASE + i * 1000, i as f64)).collect();
        batch.push(row("d0", BASE + HOUR_MS + i * 1000, -(i as f64)));
        assert_eq!(store.write(batch, &[]).unwrap().buckets, 4);
    }
    assert_eq!(store.write_buffer_operands(), 40);
    assert_eq!(store.stats().bucket_operands.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(store.dirty_marks().unwrap(), 0, "marks come with the flush");
    // Readable before the flush.
    assert_eq!(store.read_range(T, "d1", ALL).unwrap().unwrap().len(), 10);
    assert_eq!(store.latest(T, &["d0"]).unwrap().unwrap()[0].as_ref().unwrap().ts, BASE + HOUR_MS + 9000);
    store.flush_write_buffer().unwrap();
    assert_eq!(store.write_buffer_operands(), 0);
    assert_eq!(store.stats().bucket_operands.load(std::sync::atomic::Ordering::Relaxed), 4);
    assert_eq!(store.stats().write_buffer_flushes.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(store.dirty_marks().unwrap(), 4);
    let r = store.read_range(T, "d0", ALL).unwrap().unwrap();
    assert_eq!(r.len(), 20);
    assert_eq!((r[0].ts, r[19].ts), (BASE, BASE + HOUR_MS + 9000));
    assert_eq!(store.latest(T, &["d0"]).unwrap().unwrap()[0].as_ref().unwrap().ts, BASE + HOUR_MS + 9000);
    // A roll-up pass that can roll up a buffered hour flushes first; the hour that is not due
    // stays in the buffer (carried over).
    store.write(vec![row("d2", BASE + 500, 100.0), row("d2", BASE + 3 * HOUR_MS, 1.0)], &[]).unwrap();
    assert_eq!(store.write_buffer_operands(), 2);
    let s = store.process_rollups(0, usize::MAX).unwrap();
    assert_eq!(store.write_buffer_operands(), 1);
    // Hour 0 of d0, d1 and d2 (10 + 10 + 11 readings) and hour 1 of d0 (10); d2's hour 3 is not due.
    assert_eq!((s.hours, s.readings), (4, 41));
    assert_eq!(store.dirty_marks().unwrap(), 0);
    store.flush_write_buffer().unwrap();
    assert_eq!(store.dirty_marks().unwrap(), 1);
}

/// A roll-up pass's flush writes the hours it can roll up, one operand a device-hour, and keeps
/// the hour that has only begun in the buffer, with the records that hold it: nothing of it is
/// lost when the store closes without a flush, the kept record's operands of the flushed hour
/// replay without undoing a later rewrite, and each hour reaches its bucket whole.
#[test]
fn a_pass_flush_carries_the_open_hour_over_and_loses_none_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let operands = |store: &Store| store.stats().bucket_operands.load(std::sync::atomic::Ordering::Relaxed);
    let h1 = BASE + HOUR_MS;
    {
        let store = Store::open(dir.path(), config(Some(1 << 30))).unwrap();
        // Hour 0 of d0 and d1, then a batch with d0 still in hour 0 and d1 in hour 1.
        store.write(vec![row("d0", BASE, 1.0), row("d1", BASE, 2.0)], &[]).unwrap();
        store.write(vec![row("d0", BASE + 60_000, 3.0), row("d1", h1, 4.0)], &[]).unwrap();
        assert_eq!(store.write_buffer_operands(), 4);
        let s = store.process_rollups(0, usize::MAX).unwrap();
        // Hour 0 of both devices rolled up, each written as one operand; d1's hour 1 buffered.
        assert_eq!((s.hours, s.readings), (2, 3));
        assert_eq!((operands(&store), store.write_buffer_operands(), store.dirty_marks().unwrap()), (2, 1, 0));
        // A late reading and a rewrite of d0's hour 0, then more of d1's hour 1; the store
        // closes without a flush (as a crash would leave it).
        store.write(vec![row("d0", BASE + 120_000, 5.0), row("d0", BASE + 60_000, 30.0)], &[]).unwrap();
        store.write(vec![row("d1", h1 + 60_000, 6.0)], &[]).unwrap();
        assert_eq!(store.write_buffer_operands(), 3);
    }
    let points = |store: &Store, d: &str| -> Vec<(i64, f64)> {
        let rs = store.read_range(T, d, ALL).unwrap().unwrap();
        rs.iter().map(|r| (r.ts, r.get_f64("v").unwrap())).collect()
    };
    let d0 = [(BASE, 1.0), (BASE + 60_000, 30.0), (BASE + 120_000, 5.0)];
    let d1 = [(BASE, 2.0), (h1, 4.0), (h1 + 60_000, 6.0)];
    for buffer in [Some(1 << 30), None] {
        // With the buffer on, the kept records are read back in order — the straddling batch's
        // d0 operand too (2 + 1 + 1) — and the store closes again without a flush; with it off,
        // they are flushed at open, one operand a device-hour (d0 hour 0, d1 hour 1).
        let store = Store::open(dir.path(), config(buffer)).unwrap();
        let (buffered, flushed) = if buffer.is_some() { (4, 0) } else { (0, 2) };
        assert_eq!((store.write_buffer_operands(), operands(&store)), (buffered, flushed));
        assert_eq!(points(&store, "d0"), d0);
        assert_eq!(points(&store, "d1"), d1);
    }
    // Every hour rolls up from what was last written to it.
    let store = Store::open(dir.path(), config(Some(1 << 30))).unwrap();
    store.write(vec![row("d2", BASE + 5 * HOUR_MS, 1.0)], &[]).unwrap();
    store.process_rollups(0, usize::MAX).unwrap();
    for (d, start, count, sum) in [("d0", BASE, 3, 36.0), ("d1", BASE, 1, 2.0), ("d1", h1, 2, 10.0)] {
        let rows = store.rollups(T, d, Level::Hour, ALL).unwrap().unwrap();
        let record = &rows.iter().find(|(s, _)| *s == start).unwrap().1;
        assert_eq!((record.fields["v"].exact.count(), record.fields["v"].exact.sum()), (count, sum), "{d} {start}");
    }
}

/// A buffer that fills at one operand a device-hour (more devices than it holds) is bypassed:
/// after its flush, batches go straight to their buckets.
#[test]
fn a_buffer_that_saves_nothing_is_bypassed() {
    let flushes = |s: &Store| s.stats().write_buffer_flushes.load(std::sync::atomic::Ordering::Relaxed);
    let ops = |s: &Store| s.stats().bucket_operands.load(std::sync::atomic::Ordering::Relaxed);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), config_bypass(Some(4_000), 2.0)).unwrap();
    let mut batches = 0;
    while flushes(&store) == 0 {
        // Each batch: one reading of 10 devices never seen before.
        let batch = (0..10).map(|d| row(&format!("dev_{batches}_{d}"), BASE, 1.0)).collect();
        store.write(batch, &[]).unwrap();
        batches += 1;
        assert!(batches < 100, "the buffer never filled");
    }
    assert_eq!(ops(&store), 10 * batches, "one operand a device-hour, flushed");
    assert_eq!(store.write_buffer_operands(), 0);
    // Now straight through: operands are written with the batch, nothing is buffered.
    store.write(vec![row("d0", BASE, 1.0), row("d1", BASE, 1.0)], &[]).unwrap();
    assert_eq!(ops(&store), 10 * batches + 2);
    assert_eq!(store.write_buffer_operands(), 0);
    assert_eq!(store.read_range(T, "d1", ALL).unwrap().unwrap().len(), 1);

    // A buffer that fills at several operands a device-hour stays on.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), config_bypass(Some(4_000), 2.0)).unwrap();
    let mut i = 0;
    while flushes(&store) == 0 {
        store.write(vec![row("d0", BASE + i, 1.0), row("d1", BASE + i, 1.0)], &[]).unwrap();
        i += 1;
        assert!(i < 1000, "the buffer never filled");
    }
    assert_eq!(ops(&store), 2);
    store.write(vec![row("d0", BASE + i, 1.0)], &[]).unwrap();
    assert_eq!(store.write_buffer_operands(), 1);
}

/// Run by [`readings_only_in_the_buffer_survive_a_kill`] in a child process: writes
/// [`kill_batches`] into the store in `HG_WBUF_DIR` with a buffer that never fills, then
/// aborts.
#[test]
#[ignore = "a child process of readings_only_in_the_buffer_survive_a_kill"]
fn child_write_and_abort() {
    let dir = std::path::PathBuf::from(std::env::var("HG_WBUF_DIR").expect("HG_WBUF_DIR"));
    let store = Store::open(&dir, config(Some(1 << 30))).unwrap();
    for batch in kill_batches() {
        store.write(batch, &[]).unwrap();
    }
    assert_eq!(store.write_buffer_operands(), 3 * 20);
    std::process::abort();
}

/// 20 batches: each a reading of d0, d1 and d2, hours 0–3, some rewritten.
fn kill_batches() -> Vec<Vec<DeviceReading>> {
    (0..20)
        .map(|i| {
            let ts = BASE + (i % 4) * HOUR_MS + (i / 4) * 60_000 % (2 * 60_000);
            vec![row("d0", ts, i as f64), row("d1", ts + 1, 2.0 * i as f64), row("d2", BASE + i, -(i as f64))]
        })
        .collect()
}

#[test]
fn readings_only_in_the_buffer_survive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let twin_dir = tempfile::tempdir().unwrap();
    let twin = Store::open(twin_dir.path(), config(None)).unwrap();
    for batch in kill_batches() {
        twin.write(batch, &[]).unwrap();
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_write_and_abort", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HG_WBUF_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    // Aborted: ended by a signal, not by an exit code (a failed assertion exits with 101).
    assert_eq!(status.code(), None, "{status}");

    // Reopened with the buffer on: the records are read back into the buffer.
    let store = Store::open(dir.path(), config(Some(1 << 30))).unwrap();
    assert_eq!(store.write_buffer_operands(), 60);
    assert_eq!(view(&store), view(&twin));
    assert_eq!(store.read_range(T, "d2", ALL).unwrap().unwrap().len(), 20);
    drop(store);
    // Reopened with the buffer off: the records are flushed at open.
    let store = Store::open(dir.path(), config(None)).unwrap();
    assert_eq!(store.write_buffer_operands(), 0);
    assert_eq!(store.dirty_marks().unwrap(), twin.dirty_marks().unwrap());
    assert_eq!(view(&store), view(&twin));
    for s in [&store, &twin] {
        s.write(vec![row("d0", BASE + 30 * HOUR_MS, 1.0)], &[]).unwrap();
        s.process_rollups(0, usize::MAX).unwrap();
    }
    assert_eq!(rollups(&store), rollups(&twin));
}

#[test]
fn a_store_of_the_direct_path_opens_with_the_buffer_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let path: &Path = dir.path();
    let store = Store::open(path, config(None)).unwrap();
    store.write(vec![row("d0", BASE, 1.0)], &[]).unwrap();
    drop(store);
    let store = Store::open(path, config(Some(1 << 20))).unwrap();
    store.write(vec![row("d0", BASE + 1, 2.0)], &[]).unwrap();
    assert_eq!(store.write_buffer_operands(), 1);
    let vs: Vec<f64> =
        store.read_range(T, "d0", ALL).unwrap().unwrap().iter().map(|r| r.get_f64("v").unwrap()).collect();
    assert_eq!(vs, vec![1.0, 2.0]);
    drop(store);
    let store = Store::open(path, config(None)).unwrap();
    let vs: Vec<f64> =
        store.read_range(T, "d0", ALL).unwrap().unwrap().iter().map(|r| r.get_f64("v").unwrap()).collect();
    assert_eq!(vs, vec![1.0, 2.0]);
}

/// Readers racing flushes: a reading acked by a write is visible to every read that starts
/// after the ack, whether the reader meets it in the buffer or, flushed a moment before, in
/// RocksDB. One thread writes a reading (a new time each) then flushes, 2,000 times; another
/// reads the device's latest reading, its readings and the device listing meanwhile, each read
/// started after the ack of the reading it must see.
#[test]
fn a_read_racing_a_flush_sees_every_acked_reading() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path(), config(Some(1 << 30))).unwrap());
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(-1));
    const WRITES: i64 = 2_000;
    let writer = {
        let (store, acked) = (store.clone(), acked.clone());
        std::thread::spawn(move || {
            for i in 0..WRITES {
                store.write(vec![row("d0", BASE + i * 1000, i as f64)], &[]).unwrap();
                acked.store(i, std::sync::atomic::Ordering::SeqCst);
                store.flush_write_buffer().unwrap();
            }
        })
    };
    let mut checks = 0u64;
    loop {
        let must_see = acked.load(std::sync::atomic::Ordering::SeqCst);
        if must_see >= 0 {
            let latest = store.latest(T, &["d0"]).unwrap().unwrap().remove(0).expect("an acked reading");
            assert!(latest.ts >= BASE + must_see * 1000, "latest {} after reading {must_see} was acked", latest.ts);
            let n = store.read_range(T, "d0", ALL).unwrap().unwrap().len() as i64;
            assert!(n > must_see, "{n} readings after reading {must_see} was acked");
            let listed = store.devices_with_data(T, "", 10).unwrap().unwrap().devices;
            assert_eq!(listed, ["d0"]);
            checks += 1;
        }
        if must_see == WRITES - 1 {
            break;
        }
    }
    writer.join().unwrap();
    assert!(checks > 0);
}

/// Flushes beside writers and roll-up passes: one thread writes 300 batches (a reading of each
/// device a minute, one minute in five rewritten later), the buffer small enough for the
/// flusher thread to flush it often; another runs roll-up passes all along, which flush it whenever an hour is
/// due. Afterwards (in each of 8 rounds) every reading reads back and every roll-up equals a twin store's that took
/// the same batches without a buffer and rolled up once at the end: no mark deleted by a pass
/// while a flush rewrote it, no buffered reading lost between the hand-over and the commit.
#[test]
fn flushes_beside_writes_and_roll_up_passes_lose_nothing() {
    // Rounds: the races it looks for are a matter of timing.
    for _ in 0..8 {
        flushes_beside_writes_and_roll_up_passes_round();
    }
}

fn flushes_beside_writes_and_roll_up_passes_round() {
    let (bdir, ddir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let buffered = std::sync::Arc::new(Store::open(bdir.path(), config(Some(1_000))).unwrap());
    // Due buffers are flushed by the flusher thread (or, when it is a buffer behind, by the
    // write), on top of the passes' flushes.
    let flusher = buffered.start_flusher().unwrap();
    let direct = Store::open(ddir.path(), config(None)).unwrap();
    let batch = |i: i64| -> Vec<DeviceReading> {
        let mut rows: Vec<DeviceReading> = DEVICES[..3].iter().map(|d| row(d, BASE + i * 60_000, i as f64)).collect();
        if i % 5 == 4 {
            // A rewrite of a minute 40 minutes back (an hour already due, later on).
            rows.push(row("d1", BASE + (i - 40).max(0) * 60_000, -(i as f64)));
        }
        rows
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let roller = {
        let (store, stop) = (buffered.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut passes = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && passes < 100_000 {
                store.process_rollups(0, usize::MAX).unwrap();
                passes += 1;
            }
        })
    };
    for i in 0..300 {
        buffered.write(batch(i), &[]).unwrap();
        direct.write(batch(i), &[]).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    roller.join().unwrap();
    drop(flusher);
    let flushes = buffered.stats().write_buffer_flushes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(flushes >= 5, "{flushes} flushes");
    for store in [&*buffered, &direct] {
        store.write(vec![row("d0", BASE + 30 * HOUR_MS, 1.0)], &[]).unwrap();
        store.process_rollups(0, usize::MAX).unwrap();
        // The far reading may still be in the buffer: its mark comes with the flush.
        store.flush_write_buffer().unwrap();
        assert_eq!(store.dirty_marks().unwrap(), 1, "only the far reading's hour is left");
    }
    assert_eq!(view(&buffered), view(&direct));
    assert_eq!(rollups(&buffered), rollups(&direct));
}

/// With the flusher thread, a write that finds the buffer due leaves the flush to it: writes
/// return, and the buffer empties into the buckets without another call. Once stopped, the
/// write that finds the buffer due flushes it itself.
#[test]
fn the_flusher_thread_flushes_a_due_buffer() {
    let (bdir, ddir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Due at every write (age 0), never a whole buffer behind.
    let cfg = StoreConfig {
        write_buffer: Some(WriteBufferConfig {
            max_bytes: 1 << 30,
            max_age: Duration::ZERO,
            bypass_below: 0.0,
            bypass_for: Duration::from_secs(3600),
        }),
        ..config(None)
    };
    let buffered = std::sync::Arc::new(Store::open(bdir.path(), cfg).unwrap());
    let direct = Store::open(ddir.path(), config(None)).unwrap();
    let flusher = buffered.start_flusher().unwrap().expect("the buffer is on");
    let batch = |i: i64| vec![row("d0", BASE + i * 1000, i as f64), row("d1", BASE + i * 1000, -(i as f64))];
    for i in 0..50 {
        buffered.write(batch(i), &[]).unwrap();
        direct.write(batch(i), &[]).unwrap();
    }
    let flushes = || buffered.stats().write_buffer_flushes.load(std::sync::atomic::Ordering::Relaxed);
    // Waits (at most 30 s) for the flusher thread to empty the buffer.
    let drained = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while buffered.write_buffer_operands() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    drained();
    assert_eq!(buffered.write_buffer_operands(), 0, "the flusher thread emptied the buffer");
    assert!(flushes() >= 1);
    assert_eq!(view(&buffered), view(&direct));
    flusher.stop();
    let before = flushes();
    buffered.write(batch(50), &[]).unwrap();
    direct.write(batch(50), &[]).unwrap();
    // Flushed by the write itself, before it returned.
    assert_eq!((buffered.write_buffer_operands(), flushes()), (0, before + 1));
    assert_eq!(view(&buffered), view(&direct));
    // A flusher started again takes the flushes again.
    let _flusher = buffered.start_flusher().unwrap().expect("the buffer is on");
    buffered.write(batch(51), &[]).unwrap();
    direct.write(batch(51), &[]).unwrap();
    drained();
    assert_eq!((buffered.write_buffer_operands(), flushes()), (0, before + 2));
    assert_eq!(view(&buffered), view(&direct));
}

/// A flush writes a device's `latest` entry when it marks the device's newest hour: the
/// flushes after it into the same open hour find the mark and write none, and reads take the
/// newest reading from the bucket. The roll-up pass over the hour settles each entry.
#[test]
fn flushes_into_a_marked_open_hour_write_no_latest_operand() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), config(Some(1 << 30))).unwrap();
    let ops = |store: &Store| store.stats().latest_operands.load(std::sync::atomic::Ordering::Relaxed);
    let latest = |store: &Store| -> Vec<Option<Reading>> { store.latest(T, &["d0", "d1"]).unwrap().unwrap() };
    for i in 0..3 {
        let (d0, d1) = (row("d0", BASE + i * 60_000, i as f64), row("d1", BASE + i * 60_000, 10.0 + i as f64));
        store.write(vec![d0.clone(), d1.clone()], &[]).unwrap();
        store.flush_write_buffer().unwrap();
        assert_eq!(ops(&store), 2, "flush {i}");
        assert_eq!(latest(&store), vec![Some(d0.reading), Some(d1.reading)], "flush {i}");
    }
    // A reading of the next hour closes this one: the pass reads both device-hours and puts
    // their newest readings; d2's hour stays in the buffer, carried over.
    store.write(vec![row("d2", BASE + HOUR_MS, 0.0)], &[]).unwrap();
    let s = store.process_rollups(0, usize::MAX).unwrap();
    assert_eq!((s.hours, s.readings), (2, 6));
    assert_eq!((ops(&store), store.write_buffer_operands()), (4, 1));
    store.flush_write_buffer().unwrap();
    assert_eq!(ops(&store), 5);
    let newest = |d: &str, v: f64| Some(row(d, BASE + 120_000, v).reading);
    assert_eq!(latest(&store), vec![newest("d0", 2.0), newest("d1", 12.0)]);
    assert_eq!(store.latest(T, &["d2"]).unwrap().unwrap(), vec![Some(row("d2", BASE + HOUR_MS, 0.0).reading)]);
}
