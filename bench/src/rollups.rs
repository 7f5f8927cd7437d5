//! The roll-up stage under load, in process (no broker): how fast it recomputes dirty hours,
//! whether it keeps up with a sustained ingest rate, and how fast roll-ups are read back.
//!
//! - [`catch_up`]: write some hours of the fleet with no roll-up running, then time the passes
//!   that roll them all up (device-hours/s, readings/s recomputed).
//! - [`sustained`]: ingest paced at a rate (open loop: each batch has an intended start time)
//!   while a roll-up thread runs passes like `serve` does, sampling each second how far the
//!   roll-ups lag behind the hour being written.
//! - [`query_latency`]: a device's daily records for a month and a group's hourly records for
//!   a day, read and rendered as the API's JSON, p50/p99.
//!
//! Every device is placed in one of `groups` groups under ten sites, so each device-hour also
//! updates three group records (its group, its site, the table).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucketer::rollups::Record;
use bucketer::Store;
use model::{DeviceReading, Reading, TimeRange, DAY_MS, HOUR_MS};
use rollup::period::Level;

use crate::fleet::Fleet;

/// Readings per WriteBatch in every phase.
const BATCH_READINGS: u64 = 50_000;
/// Dirty hours one roll-up pass takes at most (as `serve`).
const PASS_HOURS: usize = 10_000;

/// The group path of device `d` when the fleet is spread over `groups` groups.
pub fn group_of(d: u64, groups: u64) -> String {
    let g = d % groups.max(1);
    format!("site_{}/group_{g}", g % 10)
}

/// Places every device of `fleet` in its group ([`group_of`]).
pub fn place_devices(store: &Store, fleet: &Fleet, groups: u64) -> bucketer::Result<()> {
    for d in 0..fleet.spec().devices {
        store.set_device(fleet.device_name(d), None, Default::default(), Some(&group_of(d, groups)))?;
    }
    Ok(())
}

fn write_ticks(store: &Store, fleet: &Fleet, ticks: std::ops::Range<u64>) -> bucketer::Result<u64> {
    let devices = fleet.spec().devices;
    let per_batch = (BATCH_READINGS / devices.max(1)).max(1);
    let mut written = 0;
    let mut t = ticks.start;
    while t < ticks.end {
        let end = (t + per_batch).min(ticks.end);
        let batch: Vec<DeviceReading> = (t..end)
            .flat_map(|tick| (0..devices).map(move |d| (d, tick)))
            .map(|(d, tick)| fleet.device_reading(d, tick))
            .collect();
        written += store.write(batch, &[])?.readings as u64;
        t = end;
    }
    Ok(written)
}

/// A reading of a device outside the fleet at `ts`: moves the watermark to `ts`.
fn clock(fleet: &Fleet, ts: i64) -> DeviceReading {
    DeviceReading {
        table: fleet.spec().table.as_str().into(),
        device: "bench_clock".into(),
        reading: Reading::new(ts, vec![("tick".into(), 1.0)]),
    }
}

/// What [`catch_up`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CatchUpReport {
    /// Simulated hours written.
    pub hours: u64,
    /// Readings written.
    pub readings: u64,
    /// Seconds writing them (no roll-up running).
    pub write_seconds: f64,
    /// Device-hours (buckets) the passes recomputed.
    pub device_hours: u64,
    /// Readings read back from buckets to recompute them.
    pub readings_recomputed: u64,
    /// Passes run.
    pub passes: u64,
    /// Seconds the passes took.
    pub rollup_seconds: f64,
    /// device_hours / rollup_seconds.
    pub device_hours_per_second: f64,
    /// readings_recomputed / rollup_seconds.
    pub readings_per_second: f64,
}

/// Writes ticks `0..` covering `hours` simulated hours, then rolls them all up.
pub fn catch_up(store: &Store, fleet: &Fleet, hours: u64) -> bucketer::Result<CatchUpReport> {
    let ticks = ticks_per_hour(fleet) * hours;
    let started = Instant::now();
    let readings = write_ticks(store, fleet, 0..ticks)?;
    // One reading at the end of the last hour makes every hour written due.
    store.write(vec![clock(fleet, fleet.tick_ts(0) + hours as i64 * HOUR_MS)], &[])?;
    let write_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let (mut device_hours, mut recomputed, mut passes) = (0u64, 0u64, 0u64);
    loop {
        let s = store.process_rollups(0, PASS_HOURS)?;
        if s.hours == 0 {
            break;
        }
        device_hours += s.hours as u64;
        recomputed += s.readings as u64;
        passes += 1;
    }
    let rollup_seconds = started.elapsed().as_secs_f64();
    Ok(CatchUpReport {
        hours,
        readings,
        write_seconds,
        device_hours,
        readings_recomputed: recomputed,
        passes,
        rollup_seconds,
        device_hours_per_second: device_hours as f64 / rollup_seconds.max(1e-9),
        readings_per_second: recomputed as f64 / rollup_seconds.max(1e-9),
    })
}

fn ticks_per_hour(fleet: &Fleet) -> u64 {
    (HOUR_MS / fleet.spec().interval_ms.max(1)).max(1) as u64
}

/// One second of [`sustained`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct LagSample {
    /// Wall seconds since the phase started.
    pub second: u64,
    /// Readings written in this second.
    pub readings: u64,
    /// Device-hours rolled up in this second.
    pub device_hours: u64,
    /// Simulated time the roll-ups lag behind the hour being written: the start of the hour
    /// being written minus the start of the oldest dirty hour (0: only that hour is dirty).
    pub lag_ms: i64,
}

/// What [`sustained`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SustainedReport {
    /// Target ingest rate, readings/s.
    pub target_rate: f64,
    /// Readings written / wall seconds.
    pub achieved_rate: f64,
    /// Simulated hours one wall second covers at the achieved rate.
    pub simulated_hours_per_second: f64,
    /// Device-hours rolled up during the phase.
    pub device_hours: u64,
    /// Largest lag sampled, simulated ms (see [`LagSample::lag_ms`]).
    pub max_lag_ms: i64,
    /// Lag at the last sample.
    pub final_lag_ms: i64,
    /// Seconds the roll-ups took, after ingest stopped, to finish every due hour.
    pub drain_seconds: f64,
    /// Per-second samples.
    pub samples: Vec<LagSample>,
    /// CPU time of the process's threads by name from the start of ingest to the end of the
    /// drain ([`crate::cpu`]): the writer, `rollup-passes`, RocksDB's `rocksdb:high` and
    /// `rocksdb:low`.
    pub cpu: Vec<crate::cpu::ThreadCpu>,
}

/// Ingests from tick `first_tick` at `rate` readings/s for `seconds` while a roll-up thread
/// runs passes (a pause of `idle` when a pass finds nothing due, as `serve`'s interval).
pub fn sustained(
    store: &Arc<Store>,
    fleet: &Fleet,
    first_tick: u64,
    rate: f64,
    seconds: u64,
    idle: Duration,
) -> anyhow::Result<SustainedReport> {
    let cpu_start = crate::cpu::Start::now();
    let stop = Arc::new(AtomicBool::new(false));
    let roller = {
        let (store, stop) = (store.clone(), stop.clone());
        let pass = std::thread::Builder::new().name("rollup-passes".into());
        pass.spawn(move || -> bucketer::Result<u64> {
            let mut hours = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let s = store.process_rollups(0, PASS_HOURS)?;
                hours += s.hours as u64;
                if s.hours == 0 {
                    std::thread::sleep(idle);
                }
            }
            Ok(hours)
        })?
    };
    let devices = fleet.spec().devices;
    let per_batch = (BATCH_READINGS / devices.max(1)).max(1);
    let batch_readings = per_batch * devices;
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut samples = Vec::new();
    let (mut written, mut batches) = (0u64, 0u64);
    let (mut sample_written, mut sample_hours) = (0u64, store.stats().rollup_hours_processed.load(Ordering::Relaxed));
    let mut next_sample = started + Duration::from_secs(1);
    let mut t = first_tick;
    while Instant::now() < end {
        // Open loop: batch k is due at k · batch / rate, whatever happened before it.
        if rate > 0.0 {
            let due = started + Duration::from_secs_f64(batches as f64 * batch_readings as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait.min(end.saturating_duration_since(Instant::now())));
            }
        }
        written += write_ticks(store, fleet, t..t + per_batch)?;
        t += per_batch;
        batches += 1;
        if Instant::now() >= next_sample {
            let hours_now = store.stats().rollup_hours_processed.load(Ordering::Relaxed);
            samples.push(LagSample {
                second: samples.len() as u64 + 1,
                readings: written - sample_written,
                device_hours: hours_now - sample_hours,
                lag_ms: lag_behind_current_hour(store),
            });
            (sample_written, sample_hours) = (written, hours_now);
            next_sample += Duration::from_secs(1);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    // Drain: make every written hour due and wait until none is dirty but the clock's.
    store.write(vec![clock(fleet, fleet.tick_ts(t))], &[])?;
    let drain_started = Instant::now();
    while lag_behind_current_hour(store) > 0 && drain_started.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let drain_seconds = drain_started.elapsed().as_secs_f64();
    // Read while the roll-up thread is still there to be counted.
    let cpu = cpu_start.since(0.0);
    stop.store(true, Ordering::Relaxed);
    let device_hours = roller.join().map_err(|_| anyhow::anyhow!("the roll-up thread panicked"))??;
    let achieved = written as f64 / wall;
    let ticks_per_s = achieved / devices as f64;
    Ok(SustainedReport {
        target_rate: rate,
        achieved_rate: achieved,
        simulated_hours_per_second: ticks_per_s * fleet.spec().interval_ms as f64 / HOUR_MS as f64,
        device_hours,
        max_lag_ms: samples.iter().map(|s| s.lag_ms).max().unwrap_or(0),
        final_lag_ms: samples.last().map_or(0, |s| s.lag_ms),
        drain_seconds,
        samples,
        cpu,
    })
}

/// Start of the hour holding the newest reading minus start of the oldest dirty hour.
fn lag_behind_current_hour(store: &Store) -> i64 {
    let stats = store.stats();
    let newest = stats.max_event_ts.load(Ordering::Relaxed);
    let oldest = stats.rollup_oldest_dirty_hour_ms.load(Ordering::Relaxed);
    if newest == i64::MIN || oldest == i64::MAX {
        return 0;
    }
    (Level::Hour.period_start(newest) - oldest).max(0)
}

/// Latency of one kind of roll-up query.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryLatency {
    /// Queries run.
    pub queries: u64,
    /// Rows each returned (all the same).
    pub rows: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

/// What [`query_latency`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryReport {
    /// Readings written (`days` days of the fleet).
    pub readings: u64,
    /// A device's daily records of a 31-day month.
    pub device_days_of_month: QueryLatency,
    /// A group's hourly records of one day.
    pub group_hours_of_day: QueryLatency,
    /// The table's hourly records of one day.
    pub table_hours_of_day: QueryLatency,
}

/// Renders roll-up rows as an answer's bytes, returning their number.
pub type Render<'a> = dyn Fn(&[(i64, Record)]) -> usize + 'a;

/// xorshift64: reproducible picks of devices, groups and days.
struct Picks(u64);

impl Picks {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Runs `query` `n` times, timing each from the call until `render` has made its answer.
fn time_queries(
    n: u64,
    render: &Render<'_>,
    mut query: impl FnMut() -> anyhow::Result<Vec<(i64, Record)>>,
) -> anyhow::Result<QueryLatency> {
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut rows = 0;
    for _ in 0..n {
        let started = Instant::now();
        let got = query()?;
        let bytes = render(&got);
        hist.record(started.elapsed().as_micros().max(1) as u64)?;
        anyhow::ensure!(bytes > 0, "empty answer");
        rows = got.len() as u64;
    }
    Ok(QueryLatency {
        queries: n,
        rows,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        max_ms: hist.max() as f64 / 1000.0,
    })
}

/// Writes `days` days of the fleet (at least 32), rolls them up, then times `queries` queries
/// of each kind on random devices, groups and days; `render` turns the rows into the bytes an
/// answer carries (the API's JSON).
pub fn query_latency(
    store: &Store,
    fleet: &Fleet,
    days: u64,
    groups: u64,
    queries: u64,
    render: &Render<'_>,
) -> anyhow::Result<QueryReport> {
    anyhow::ensure!(days >= 32, "31 daily records after the first (partial) day need at least 32 days, not {days}");
    let ticks = ticks_per_hour(fleet) * 24 * days;
    let readings = write_ticks(store, fleet, 0..ticks)?;
    store.write(vec![clock(fleet, fleet.tick_ts(ticks))], &[])?;
    while store.process_rollups(0, PASS_HOURS)?.hours > 0 {}
    let table = fleet.spec().table.clone();
    // Day k (from 0) is the k-th whole day after the fleet's first reading.
    let day = |k: u64| Level::Day.period_start(fleet.tick_ts(0)) + DAY_MS * (1 + k as i64);
    let mut picks = Picks(0x9E37_79B9_7F4A_7C15);
    let devices = fleet.spec().devices;
    let device_days_of_month = time_queries(queries, render, || {
        let month = TimeRange { start: day(0), end: day(31) };
        let name = fleet.device_name(picks.below(devices));
        store.rollups(&table, name, Level::Day, month)?.ok_or_else(|| anyhow::anyhow!("no device {name}"))
    })?;
    let one_day = |k: u64| TimeRange { start: day(k), end: day(k + 1) };
    let group_hours_of_day = time_queries(queries, render, || {
        let group = group_of(picks.below(groups), groups);
        Ok(store.group_rollups(&table, &group, Level::Hour, one_day(picks.below(days - 2)))?.unwrap_or_default())
    })?;
    let table_hours_of_day = time_queries(queries, render, || {
        Ok(store.group_rollups(&table, "", Level::Hour, one_day(picks.below(days - 2)))?.unwrap_or_default())
    })?;
    Ok(QueryReport { readings, device_days_of_month, group_hours_of_day, table_hours_of_day })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::fleet::FleetSpec;

    /// Two seconds of ingest beside the roll-up thread: every hour written is rolled up by the
    /// end of the drain, and the CPU report has the roll-up thread's time.
    #[test]
    fn sustained_rolls_up_what_it_wrote_and_reports_the_cpu_of_its_threads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), bucketer::StoreConfig::default()).unwrap());
        let fleet = Fleet::new(FleetSpec { devices: 20, interval_ms: 600_000, ..FleetSpec::default() });
        let r = sustained(&store, &fleet, 0, 0.0, 2, Duration::from_millis(5)).unwrap();
        assert_eq!(r.final_lag_ms, r.samples.last().unwrap().lag_ms);
        assert_eq!(lag_behind_current_hour(&store), 0, "drained");
        assert!(r.device_hours > 0, "{r:?}");
        let passes = r.cpu.iter().find(|t| t.name == "rollup-passes").expect("the roll-up thread");
        assert_eq!(passes.threads, 1);
        assert!(passes.seconds > 0.0, "{passes:?}");
    }

    #[test]
    fn catch_up_rolls_up_every_due_hour_and_its_groups() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), bucketer::StoreConfig::default()).unwrap();
        let fleet = Fleet::new(FleetSpec { devices: 10, interval_ms: 600_000, ..FleetSpec::default() });
        place_devices(&store, &fleet, 4).unwrap();
        let r = catch_up(&store, &fleet, 2).unwrap();
        // The clock reading at start + 2 h makes due every hour that ends by then.
        let clock = fleet.tick_ts(0) + 2 * HOUR_MS;
        let due = |ts: i64| Level::Hour.period_start(ts) + HOUR_MS <= clock;
        let ticks: Vec<i64> = (0..12).map(|t| fleet.tick_ts(t)).collect();
        let hours: std::collections::BTreeSet<i64> =
            ticks.iter().filter(|ts| due(**ts)).map(|ts| Level::Hour.period_start(*ts)).collect();
        assert_eq!(r.readings, 120);
        assert_eq!(r.device_hours, 10 * hours.len() as u64);
        assert_eq!(r.readings_recomputed, 10 * ticks.iter().filter(|ts| due(**ts)).count() as u64);
        // The table's and a group's records count every reading of their devices.
        let all = TimeRange::new(fleet.tick_ts(0) - DAY_MS, clock + DAY_MS).unwrap();
        let table = store.group_rollups(&fleet.spec().table, "", Level::Hour, all).unwrap().unwrap();
        let count = |rows: &[(i64, Record)]| rows.iter().map(|(_, r)| r.fields["velocity"].exact.count()).sum::<u64>();
        assert_eq!(count(&table), r.readings_recomputed);
        let group = store.group_rollups(&fleet.spec().table, &group_of(1, 4), Level::Hour, all).unwrap().unwrap();
        // Devices 1, 5 and 9 are in group 1 of 4.
        assert_eq!(count(&group), 3 * r.readings_recomputed / 10);
        assert_eq!(group[0].1.devices.as_ref().unwrap().estimate(), 3);
        assert_eq!(group_of(1, 4), "site_1/group_1");
    }
}
