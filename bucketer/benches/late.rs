//! Late readings into hours already rolled up: each such device-hour is recomputed, and every
//! group it rolls up into (the table, at least) has the shard of its hour that the device is
//! in recomputed from the shard's devices' hour records, that shard's super-shard from its
//! shards, and its hour from its super-shards (`bucketer::rollups`, step 2). This measures a
//! pass's cost of that against the table's size.
//!
//! `cargo bench --workspace --bench late` (`-- --devices N --late K --rounds R [--tombstones]
//! [--under PATH]`): a temp-dir store, `--devices` devices' one hour (two days ago) of the TSBS
//! `readings` fields at 12 an hour, rolled up; then `--rounds` rounds of `--late` devices each
//! writing one late reading into that hour and one pass. Prints each round's pass time and the
//! median. With `--under`, every device is placed under group path PATH first (registered in
//! id order), so each of PATH's groups (`a/b`: `a` and `a/b`) holds them all too: registry
//! groups find a shard's devices otherwise than the table does.
//!
//! The store is compacted after the hour's roll-up: the pass that rolled it up deleted one
//! work-queue mark a device, and until a compaction drops those tombstones each pass's scan
//! of the queue steps over them (some 0.1 ms a thousand), which is what a store is like only
//! for the minutes after a large hour's roll-up. `--tombstones` leaves them, for that case.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use bucketer::{Store, StoreConfig};
use model::{DeviceReading, DAY_MS, HOUR_MS};
use rollup::period::Level;

mod fleet;

const TABLE: &str = "fleet.readings";

fn main() {
    fleet::tune_allocator();
    let args: Vec<String> = std::env::args().collect();
    let devices = fleet::number(&args, "--devices", 10_000);
    let late = fleet::number(&args, "--late", 10);
    let rounds = fleet::number(&args, "--rounds", 5);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path(), StoreConfig::default()).expect("open");
    let names = fleet::names();
    let now = model::now_ms();
    let hour = Level::Day.period_start(now) - 2 * DAY_MS + 12 * HOUR_MS;
    let step = HOUR_MS / 12;
    if let Some(path) = fleet::flag(&args, "--under") {
        for d in 0..devices {
            store.set_device(&format!("truck_{d}"), None, Default::default(), Some(path)).expect("place");
        }
    }
    for chunk in (0..devices).collect::<Vec<_>>().chunks(1_000) {
        let mut batch = Vec::new();
        for &d in chunk {
            let device: Arc<str> = Arc::from(format!("truck_{d}"));
            for i in 0..12 {
                batch.push(DeviceReading {
                    table: TABLE.into(),
                    device: device.clone(),
                    reading: fleet::reading(&names, d, hour + i * step),
                });
            }
        }
        store.write(batch, &[]).expect("write");
    }
    let clock =
        vec![DeviceReading { table: TABLE.into(), device: "now".into(), reading: fleet::reading(&names, 0, now) }];
    store.write(clock, &[]).expect("write");
    while store.process_rollups(0, 10_000).expect("pass").hours > 0 {}
    if !args.iter().any(|a| a == "--tombstones") {
        store.compact().expect("compact");
    }
    let mut out = std::io::stdout().lock();
    let mut times = Vec::new();
    for r in 0..rounds {
        let batch = (0..late)
            .map(|k| {
                let d = (r * late + k) * 7_919 % devices;
                DeviceReading {
                    table: TABLE.into(),
                    device: format!("truck_{d}").into(),
                    reading: fleet::reading(&names, d, hour + step / 2 + r as i64),
                }
            })
            .collect();
        store.write(batch, &[]).expect("write");
        let start = Instant::now();
        let s = store.process_rollups(0, 10_000).expect("pass");
        let took = start.elapsed().as_secs_f64() * 1e3;
        writeln!(out, "round {}: {} marks, pass {took:.1} ms", r + 1, s.hours).expect("stdout");
        times.push(took);
    }
    times.sort_by(f64::total_cmp);
    writeln!(out, "{devices} devices, {late} late readings a pass: median pass {:.1} ms", times[times.len() / 2])
        .expect("stdout");
}
