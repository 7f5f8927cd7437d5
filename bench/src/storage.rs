//! In-process driver: the fleet written straight into a [`bucketer::Store`], no broker.
//!
//! This measures the storage write path's ceiling: grouping by device-hour, bucket encoding,
//! one WriteBatch per batch with the WAL on. Generation happens outside the timed region (as
//! TSBS pre-generates its files); each batch is timed from `Store::write` call to return.

use std::time::{Duration, Instant};

use bucketer::Store;

use crate::fleet::Fleet;

/// What to write.
#[derive(Debug, Clone)]
pub struct StorageSpec {
    /// Ticks of the whole fleet to write (readings = devices × ticks).
    pub ticks: u64,
    /// Readings per WriteBatch (rounded to whole ticks of the fleet, at least one tick).
    pub batch_readings: usize,
}

/// What a run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageReport {
    /// Devices in the fleet.
    pub devices: u64,
    /// Readings written.
    pub readings: u64,
    /// Field values written.
    pub values: u64,
    /// WriteBatches committed.
    pub batches: u64,
    /// Bucket merge operands written (device-hours per batch, summed).
    pub bucket_operands: u64,
    /// Roll-up dirty marks written: a device-hour of an hour still open is marked once.
    pub dirty_marks: u64,
    /// Seconds spent inside `Store::write`.
    pub write_seconds: f64,
    /// readings / write_seconds.
    pub readings_per_second: f64,
    /// 50th and 99th percentile of one WriteBatch commit, ms.
    pub batch_p50_ms: f64,
    /// 99th percentile of one WriteBatch commit, ms.
    pub batch_p99_ms: f64,
    /// CPU time of this process's threads from the first batch to the last commit, by thread
    /// name ([`crate::cpu`]): the writing thread (generation included), RocksDB's memtable
    /// flushes (`rocksdb:high`) and compactions (`rocksdb:low`), the write buffer's flusher.
    pub cpu: Vec<crate::cpu::ThreadCpu>,
}

/// Writes `spec.ticks` ticks of `fleet` into `store`.
pub fn run(
    store: &Store,
    fleet: &Fleet,
    spec: &StorageSpec,
    mut progress: impl FnMut(u64, u64),
) -> bucketer::Result<StorageReport> {
    let devices = fleet.spec().devices;
    let ticks_per_batch = (spec.batch_readings as u64 / devices.max(1)).max(1);
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)
        .map_err(|e| bucketer::Error::Corrupt { what: "histogram", detail: e.to_string() })?;
    let (mut readings, mut values, mut batches, mut operands) = (0u64, 0u64, 0u64, 0u64);
    let mut spent = Duration::ZERO;
    let marks_before = store.stats().dirty_marks.load(std::sync::atomic::Ordering::Relaxed);
    let cpu_start = crate::cpu::Start::now();
    let mut t = 0;
    while t < spec.ticks {
        let end = (t + ticks_per_batch).min(spec.ticks);
        let mut batch = Vec::with_capacity(((end - t) * devices) as usize);
        for tick in t..end {
            for d in 0..devices {
                batch.push(fleet.device_reading(d, tick));
            }
        }
        values += batch.iter().map(|r| r.reading.fields.len() as u64).sum::<u64>();
        let started = Instant::now();
        let summary = store.write(batch, &[])?;
        let took = started.elapsed();
        spent += took;
        let _ = hist.record(took.as_micros().max(1) as u64);
        readings += summary.readings as u64;
        operands += summary.buckets as u64;
        batches += 1;
        t = end;
        progress(t, spec.ticks);
    }
    let secs = spent.as_secs_f64();
    let cpu = cpu_start.since(0.0);
    Ok(StorageReport {
        devices,
        readings,
        values,
        batches,
        bucket_operands: operands,
        dirty_marks: store.stats().dirty_marks.load(std::sync::atomic::Ordering::Relaxed) - marks_before,
        write_seconds: secs,
        readings_per_second: readings as f64 / secs.max(1e-9),
        batch_p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        batch_p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        cpu,
    })
}

/// What [`registry_scale`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RegistryScaleReport {
    /// Devices.
    pub devices: u64,
    /// Readings per WriteBatch.
    pub batch_readings: u64,
    /// Tick 0: every device new (registered in the batch that writes its first reading).
    pub register_readings_per_second: f64,
    /// Tick 1: every device known, resolved from the in-memory registry.
    pub known_readings_per_second: f64,
    /// Peak resident set size of the process after registering, bytes (`VmHWM`).
    pub peak_rss_after_register_bytes: u64,
    /// Peak resident set size at the end, bytes.
    pub peak_rss_bytes: u64,
    /// CPU time of the process's threads by name over both ticks ([`crate::cpu`]).
    pub cpu: Vec<crate::cpu::ThreadCpu>,
}

/// The process's peak resident set size (`VmHWM` of `/proc/self/status`), bytes; 0 where
/// there is no procfs.
pub fn peak_rss_bytes() -> u64 {
    crate::run::rss_bytes().1
}

/// Registers every device of `fleet` by writing its first reading (tick 0), then writes a
/// reading for each again (tick 1), in batches of `batch_readings` devices, timing each tick.
pub fn registry_scale(
    store: &Store,
    fleet: &Fleet,
    batch_readings: u64,
    mut progress: impl FnMut(u64, u64),
) -> bucketer::Result<RegistryScaleReport> {
    let devices = fleet.spec().devices;
    let batch = batch_readings.max(1);
    let mut rates = [0.0; 2];
    let mut peak_after_register = 0;
    let cpu_start = crate::cpu::Start::now();
    for tick in 0..2u64 {
        let mut spent = Duration::ZERO;
        let mut d = 0;
        while d < devices {
            let end = (d + batch).min(devices);
            let rows: Vec<_> = (d..end).map(|dev| fleet.device_reading(dev, tick)).collect();
            let started = Instant::now();
            store.write(rows, &[])?;
            spent += started.elapsed();
            d = end;
            progress(tick * devices + d, 2 * devices);
        }
        rates[tick as usize] = devices as f64 / spent.as_secs_f64().max(1e-9);
        if tick == 0 {
            peak_after_register = peak_rss_bytes();
        }
    }
    Ok(RegistryScaleReport {
        devices,
        batch_readings: batch,
        register_readings_per_second: rates[0],
        known_readings_per_second: rates[1],
        peak_rss_after_register_bytes: peak_after_register,
        peak_rss_bytes: peak_rss_bytes(),
        cpu: cpu_start.since(0.0),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::fleet::FleetSpec;

    /// 50 devices in batches of 20: all registered by the first tick, and this thread's CPU
    /// is in the report.
    #[test]
    fn registry_scale_registers_the_fleet_and_reports_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), bucketer::StoreConfig::default()).unwrap();
        let fleet = Fleet::new(FleetSpec { devices: 50, ..FleetSpec::default() });
        let mut calls = Vec::new();
        let r = registry_scale(&store, &fleet, 20, |done, total| calls.push((done, total))).unwrap();
        assert_eq!(store.device_count(), 50);
        assert_eq!((r.devices, r.batch_readings), (50, 20));
        assert_eq!(calls, [(20, 100), (40, 100), (50, 100), (70, 100), (90, 100), (100, 100)]);
        assert!(r.register_readings_per_second > 0.0 && r.known_readings_per_second > 0.0);
        let cpu: f64 = r.cpu.iter().map(|t| t.seconds).sum();
        assert!(cpu > 0.0, "{:?}", r.cpu);
    }

    /// 40 trucks at 10 s for two hours and a half, a tick a batch: every reading is a bucket
    /// operand, and each truck's three device-hours are marked once each.
    #[test]
    fn a_run_marks_each_device_hour_once_while_it_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), bucketer::StoreConfig::default()).unwrap();
        // 2024-01-01T00:00:00Z: ticks 0-359 are the first hour, 360-719 the second.
        let fleet = Fleet::new(FleetSpec { devices: 40, start_ms: 1_704_067_200_000, ..FleetSpec::default() });
        let report = run(&store, &fleet, &StorageSpec { ticks: 900, batch_readings: 40 }, |_, _| {}).unwrap();
        assert_eq!((report.readings, report.batches, report.bucket_operands), (36_000, 900, 36_000));
        assert_eq!(report.dirty_marks, 40 * 3);
        // The writes ran on this test's thread: this process spent CPU on them.
        let cpu: f64 = report.cpu.iter().map(|t| t.seconds).sum();
        assert!(cpu > 0.0, "{:?}", report.cpu);
    }
}
