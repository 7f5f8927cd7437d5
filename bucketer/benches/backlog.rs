//! The roll-up of a backlog: devices offline for days upload their readings at once, and the
//! roll-up stage works through them. Once a day's first hour is past its table's hour roll-up
//! retention, its roll-up is made again from its buckets (`bucketer::rollups`, "Retention"),
//! which costs more than rolling up hours on time; this measures how much.
//!
//! `cargo bench --workspace --bench backlog` (`-- --devices N --days D --per-hour R --runs K`).
//! For each mode, a store in a temp dir is written `--devices` devices' backlog of `--days`
//! whole days (ending two days before today, UTC), `--per-hour` readings an hour of the TSBS
//! `readings` table's seven decimal fields, one device's days after another as they upload
//! them; then roll-up passes of 10,000 marks (as `serve`'s) run until none is left. Modes:
//! `kept`, the table keeping its hour roll-ups forever (each hour rolled up from its bucket);
//! `past`, the table keeping its hour roll-ups 2 days and its day roll-ups 30 (every day of the
//! backlog past the hour retention); `archived`, the table keeping its partitions (days) one day
//! in RocksDB, with an archive, spilled before the roll-up (every hour rolled up from its
//! Parquet file, as when retention moves a backlog's days to the archive before the roll-up
//! stage reaches them); `archived-hours`, the same with hour partitions (a Parquet file an
//! hour, every device's hour in it). Each run checks the table's day rows: every reading counted once.
//! Prints each run's roll-up time and passes (with a pass's time at each tenth of the roll-up)
//! and the bytes of its `rollups` column family after a full compaction (every roll-up record,
//! LZ4-compressed), and the median time per mode; `--modes a,b` picks some.
//!
//! `--wide N` gives each reading N fields more (`x0`…, f64), as a table of many fields has
//! (QA60 F4: a pass's memory grows with the fields of the hours a chunk holds).
//!
//! `--glitch f32max` makes each device-hour's first `velocity` reading 3.4e38 (the largest
//! 32-bit float, a common "no reading" of sensors), `--glitch widest` its first two 1e-8 and
//! 1e308 (the quantile sketch's whole span): sketches thousands of bins wide, which a pass holds
//! packed (`rollup::approx::Quantiles::pack_if_wide`). Each run also prints the process's peak
//! resident memory so far (`VmHWM`: the allocator keeps what it took, as `hourglass` does).

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use bucketer::archive::ArchiveConfig;
use bucketer::store::CF_ROLLUPS;
use bucketer::{RollupRetention, Store, StoreConfig, TableSpec};
use model::{DeviceReading, PartitionSize, Reading, TimeRange, Value, DAY_MS, HOUR_MS};
use rollup::period::Level;

mod fleet;

const TABLE: &str = "fleet.readings";
/// Marks a pass takes at most (`serve`'s `ROLLUP_MAX_HOURS_PER_PASS`).
const PASS_MARKS: usize = 10_000;
/// How the table keeps what the backlog brings.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Hour roll-ups forever.
    Kept,
    /// Hour roll-ups 2 days, day roll-ups 30.
    Past,
    /// Day partitions kept one day in RocksDB, then in the archive: spilled before the roll-up.
    Archived,
    /// The same with hour partitions: a file an hour, each holding every device's hour.
    ArchivedHours,
}

/// What one run measured.
struct Run {
    /// Seconds the roll-up took.
    took: f64,
    /// Each pass's milliseconds.
    passes: Vec<f64>,
    /// Bytes of the `rollups` column family's SST files after a full compaction.
    rollup_bytes: u64,
}

/// What a device-hour's first `velocity` readings are made (`--glitch`).
#[derive(Clone, Copy, PartialEq)]
enum Glitch {
    None,
    /// The first 3.4e38.
    F32Max,
    /// The first 1e-8, the second 1e308.
    Widest,
}

impl Glitch {
    /// The value of `velocity` for the `i`th reading of an hour, `v` as the fleet has it.
    fn velocity(self, i: i64, v: f64) -> f64 {
        match (self, i) {
            (Glitch::F32Max, 0) => f64::from(f32::MAX),
            (Glitch::Widest, 0) => 1e-8,
            (Glitch::Widest, 1) => 1e308,
            _ => v,
        }
    }
}

/// The reading of device `d` at `ts`, the `i`th of its hour, glitched, with a field of each
/// of `wide`'s names besides the fleet's (`--wide`).
fn reading(names: &[Arc<str>], d: usize, ts: i64, i: i64, glitch: Glitch, wide: &[Arc<str>]) -> Reading {
    let mut reading = fleet::reading(names, d, ts);
    if glitch != Glitch::None {
        if let Some((_, Value::F64(v))) = reading.fields.iter_mut().find(|(n, _)| &**n == "velocity") {
            *v = glitch.velocity(i, *v);
        }
    }
    if !wide.is_empty() {
        let mut fields = std::mem::take(&mut reading.fields);
        fields.extend(wide.iter().enumerate().map(|(k, n)| (n.clone(), Value::F64((d + k) as f64 + 0.5 * i as f64))));
        reading = Reading::new(ts, fields);
    }
    reading
}

/// The process's peak resident memory (`VmHWM`), in MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kb / 1e3
}

/// One run of `mode`.
fn run(mode: Mode, devices: usize, days: i64, per_hour: i64, parts: i64, glitch: Glitch, wide: &[Arc<str>]) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = StoreConfig {
        archive: matches!(mode, Mode::Archived | Mode::ArchivedHours)
            .then(|| ArchiveConfig::new(dir.path().join("archive"))),
        ..StoreConfig::default()
    };
    let store = Store::open(&dir.path().join("data"), cfg).expect("open");
    let spec = match mode {
        Mode::Kept => TableSpec::default(),
        Mode::Past => TableSpec {
            rollup_retention: RollupRetention { hour_ms: Some(2 * DAY_MS as u64), day_ms: Some(30 * DAY_MS as u64) },
            ..TableSpec::default()
        },
        Mode::Archived => {
            TableSpec { partition: PartitionSize::Day, hot_retention_ms: Some(DAY_MS as u64), ..TableSpec::default() }
        }
        Mode::ArchivedHours => {
            TableSpec { partition: PartitionSize::Hour, hot_retention_ms: Some(DAY_MS as u64), ..TableSpec::default() }
        }
    };
    store.define_table_with(TABLE, &spec).expect("define");
    let names = fleet::names();
    let now = model::now_ms();
    let first_day = Level::Day.period_start(now) - (days + 2) * DAY_MS;
    let step = HOUR_MS / per_hour;
    let per_device = days * 24 * per_hour;
    let mut took = 0.0;
    let mut passes = Vec::new();
    for part in 0..parts {
        let (from, to) = (per_device * part / parts, per_device * (part + 1) / parts);
        for d in 0..devices {
            let device: Arc<str> = Arc::from(format!("truck_{d}"));
            let mut batch = Vec::with_capacity((to - from) as usize);
            for i in from..to {
                let ts = first_day + i * step + (d as i64 % 1000);
                batch.push(DeviceReading {
                    table: TABLE.into(),
                    device: device.clone(),
                    reading: reading(&names, d, ts, i % per_hour, glitch, wide),
                });
            }
            store.write(batch, &[]).expect("write");
        }
        // The watermark at the clock: every hour of the backlog is due.
        store
            .write(
                vec![DeviceReading {
                    table: TABLE.into(),
                    device: "now".into(),
                    reading: fleet::reading(&names, 0, now),
                }],
                &[],
            )
            .expect("write");
        if matches!(mode, Mode::Archived | Mode::ArchivedHours) {
            let report = store.spill_expired_partitions(now, |_| ()).expect("spill");
            assert!(report.failed.is_empty(), "spill failed: {:?}", report.failed);
            let partitions = if mode == Mode::Archived { days } else { days * 24 };
            assert_eq!(report.spilled.len() as i64, partitions, "a partition a day (or hour) archived");
        }
        let start = Instant::now();
        loop {
            let pass = Instant::now();
            let summary = store.process_rollups_at(0, PASS_MARKS, now).expect("pass");
            passes.push(pass.elapsed().as_secs_f64() * 1e3);
            if summary.hours == 0 {
                break;
            }
        }
        took += start.elapsed().as_secs_f64();
    }
    let range = TimeRange::new(first_day, first_day + days * DAY_MS).expect("range");
    let rows = store.group_rollups(TABLE, "", Level::Day, range).expect("read").expect("table");
    let want = devices as u64 * 24 * per_hour as u64;
    assert_eq!(rows.len(), days as usize, "a day row each day");
    for (start, record) in &rows {
        assert_eq!(record.fields["velocity"].exact.count(), want, "day {start}: every reading counted once");
    }
    store.compact().expect("compact");
    let stats = store.db_stats().expect("stats");
    let rollups = stats.column_families.iter().find(|c| c.name == CF_ROLLUPS).expect("the rollups column family");
    Run { took, passes, rollup_bytes: rollups.live_sst_bytes }
}

fn main() {
    fleet::tune_allocator();
    let args: Vec<String> = std::env::args().collect();
    let devices = fleet::number(&args, "--devices", 2_000);
    let days = fleet::number(&args, "--days", 3) as i64;
    let per_hour = fleet::number(&args, "--per-hour", 12) as i64;
    let runs = fleet::number(&args, "--runs", 3);
    let parts = fleet::number(&args, "--parts", 1).max(1) as i64;
    let glitch = match fleet::flag(&args, "--glitch") {
        None | Some("none") => Glitch::None,
        Some("f32max") => Glitch::F32Max,
        Some("widest") => Glitch::Widest,
        Some(other) => panic!("--glitch takes none, f32max or widest, not {other:?}"),
    };
    let wide: Vec<Arc<str>> = (0..fleet::number(&args, "--wide", 0)).map(|k| Arc::from(format!("x{k}"))).collect();
    let readings = devices as i64 * days * 24 * per_hour;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{devices} devices × {days} days × {per_hour} readings an hour = {readings} readings")
        .expect("stdout");
    let picked = args.iter().position(|a| a == "--modes").and_then(|i| args.get(i + 1)).map(String::as_str);
    let modes = [
        ("kept", Mode::Kept),
        ("past", Mode::Past),
        ("archived", Mode::Archived),
        ("archived-hours", Mode::ArchivedHours),
    ];
    for (name, mode) in modes {
        if picked.is_some_and(|p| !p.split(',').any(|m| m == name)) {
            continue;
        }
        let mut times = Vec::new();
        for r in 0..runs {
            let Run { took, passes, rollup_bytes } = run(mode, devices, days, per_hour, parts, glitch, &wide);
            let device_hours = devices as f64 * days as f64 * 24.0;
            // A pass's time at each tenth of the roll-up, in order: how it changes as it goes.
            let tenths: Vec<String> = (0..10).map(|i| format!("{:.0}", passes[i * passes.len() / 10])).collect();
            writeln!(
                out,
                "{name} run {}: roll-up {took:.2} s in {} passes; a pass at each tenth, ms: {}; \
                 rollups {:.1} MB compacted ({:.0} bytes a device-hour); peak RSS so far {:.0} MB",
                r + 1,
                passes.len(),
                tenths.join(" "),
                rollup_bytes as f64 / 1e6,
                rollup_bytes as f64 / device_hours,
                peak_rss_mb()
            )
            .expect("stdout");
            times.push(took);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let rate = readings as f64 / median;
        writeln!(out, "{name}: median {median:.2} s ({rate:.0} readings/s)").expect("stdout");
    }
}
