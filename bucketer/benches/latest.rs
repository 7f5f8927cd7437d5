//! `Store::latest` of a fleet at one reading a second, as its open hour fills: the read takes
//! each device's newest reading from the hour bucket its `latest` entry points to, and that
//! bucket gets a merge operand every write-buffer flush.
//!
//! `cargo bench --workspace --bench latest` (`-- --devices N --minutes M,M,...`). A store in a
//! temp dir, the write buffer flushed every 5 s of event time as its default age flushes it
//! at this rate, is written [`DEVICES`] devices of the TSBS `readings` table (seven decimal
//! fields), one reading a device a second from the top of an hour; at each checkpoint minute
//! the writes stop and `latest` of every device is timed [`REPEATS`] times (each answer
//! checked: every device's reading of the last second written). Prints the median, lowest and
//! highest time of each checkpoint, in ms.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucketer::{Store, StoreConfig, WriteBufferConfig};
use model::{DeviceReading, Reading};

mod fleet;

/// Devices written (QA14's fleet).
const DEVICES: usize = 3_000;
/// Timed `latest` calls at each checkpoint.
const REPEATS: usize = 15;
/// Seconds of event time between write-buffer flushes (its default age).
const FLUSH_EVERY_S: i64 = 5;
/// The hour written: 2016-01-01T00:00Z.
const START_MS: i64 = 1_451_606_400_000;
const TABLE: &str = "fleet.readings";

/// The reading of device `d` at second `s` of the hour.
fn reading(names: &[Arc<str>], d: usize, s: i64) -> Reading {
    fleet::reading(names, d, START_MS + s * 1_000)
}

fn main() {
    fleet::tune_allocator();
    let args: Vec<String> = std::env::args().collect();
    let devices = fleet::number(&args, "--devices", DEVICES);
    let checkpoints: Vec<i64> = fleet::flag(&args, "--minutes")
        .unwrap_or("5,15,30,59")
        .split(',')
        .map(|m| m.parse().expect("--minutes: numbers, comma separated"))
        .collect();
    let dir = tempfile::tempdir().expect("a temp dir");
    // Flushed by the bench alone, every FLUSH_EVERY_S of event time.
    let buffer = WriteBufferConfig { max_age: Duration::from_secs(86_400), ..WriteBufferConfig::default() };
    let store =
        Store::open(dir.path(), StoreConfig { write_buffer: Some(buffer), ..StoreConfig::default() }).expect("a store");
    let names = fleet::names();
    let table: Arc<str> = Arc::from(TABLE);
    let device_names: Vec<Arc<str>> = (0..devices).map(|d| Arc::from(format!("truck_{d}"))).collect();

    let mut out = std::io::stdout().lock();
    let header = format!(
        "latest of {devices} devices at 1 Hz, {REPEATS} calls a checkpoint (ms)\n\
         | minute | readings a device | median | lowest | highest |\n|---|---|---|---|---|"
    );
    writeln!(out, "{header}").expect("stdout");
    let mut second = 0i64;
    for &minute in &checkpoints {
        let written = Instant::now();
        while second < minute * 60 {
            let batch: Vec<DeviceReading> = (0..devices)
                .map(|d| DeviceReading {
                    table: Arc::clone(&table),
                    device: Arc::clone(&device_names[d]),
                    reading: reading(&names, d, second),
                })
                .collect();
            store.write(batch, &[]).expect("a write");
            second += 1;
            if second % FLUSH_EVERY_S == 0 {
                store.flush_write_buffer().expect("a flush");
            }
        }
        eprintln!("minute {minute}: written in {:.1} s", written.elapsed().as_secs_f64());
        let mut times = Vec::with_capacity(REPEATS);
        for _ in 0..REPEATS {
            let t = Instant::now();
            let got = store.latest(TABLE, &device_names).expect("a read").expect("the table");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            for (d, r) in got.iter().enumerate() {
                assert_eq!(r.as_ref(), Some(&reading(&names, d, second - 1)), "device {d}");
            }
        }
        times.sort_by(f64::total_cmp);
        let (median, lowest, highest) = (times[REPEATS / 2], times[0], times[REPEATS - 1]);
        writeln!(out, "| {minute} | {second} | {median:.1} | {lowest:.1} | {highest:.1} |").expect("stdout");
    }
}
