//! The archive tier on the TSBS-style workload: how many bytes a field value takes in the
//! Parquet files, how fast partitions spill, and how long an archived read of one device takes.
//!
//! [`run`] writes a workload in process into a store whose two tables have a hot retention of
//! one hour (so the workload, in 2024, has long expired), spills every partition with
//! [`bucketer::Store::spill_expired_partitions`], and then reads devices back from the archive
//! through [`bucketer::Store::read_range`]. Timing stays out of tests: numbers go to
//! BENCHMARKS.md with the command that produced them.

use std::sync::Arc;
use std::time::Instant;

use bucketer::{Store, TableSpec};
use model::{DeviceReading, PartitionSize, TimeRange};

use crate::workload::{FieldNames, Generator, Point, TableKind, WorkloadSpec};

/// What to write and read.
#[derive(Debug, Clone)]
pub struct ArchiveSpec {
    /// The workload.
    pub workload: WorkloadSpec,
    /// Points a WriteBatch.
    pub batch_points: usize,
    /// Archived reads of one device's `readings` over the whole workload.
    pub reads: u64,
    /// Late readings written after the spill into the first archived partition of `readings`
    /// (one each for the first `late` devices), then timed through one more spill run: 0 for
    /// none.
    pub late: u64,
}

/// One table's part of the archive.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableArchive {
    /// Table name.
    pub table: String,
    /// Partitions (files) written.
    pub files: usize,
    /// Rows in them.
    pub rows: u64,
    /// Field values in them (rows × the table's fields).
    pub values: u64,
    /// File bytes.
    pub bytes: u64,
    /// File bytes per field value.
    pub bytes_per_value: f64,
}

/// What [`run`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveReport {
    /// Points written.
    pub points: u64,
    /// Seconds the writes took.
    pub write_seconds: f64,
    /// Seconds the spill took (every partition of both tables).
    pub spill_seconds: f64,
    /// Rows spilled a second.
    pub spill_rows_per_second: f64,
    /// Per table.
    pub tables: Vec<TableArchive>,
    /// All files' bytes per field value.
    pub bytes_per_value: f64,
    /// RocksDB `buckets` SST bytes per value of the same data before the spill, after a full
    /// compaction, for comparison.
    pub rocksdb_bytes_per_value: f64,
    /// Readings one archived read returned (the last).
    pub read_readings: u64,
    /// Archived read latency, ms: p50, p90, p99, max.
    pub read_ms: [f64; 4],
    /// With [`ArchiveSpec::late`]: the spill run after the late readings.
    pub late: Option<LateRun>,
}

/// The spill run after [`ArchiveSpec::late`] late readings.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LateRun {
    /// Late readings written.
    pub readings: u64,
    /// Seconds the run took.
    pub seconds: f64,
    /// Partitions it rewrote, and their rows.
    pub rewritten: usize,
    /// Rows in the rewritten files.
    pub rewritten_rows: u64,
    /// Partitions whose late readings it left waiting in RocksDB.
    pub deferred: usize,
    /// Readings of the late devices read back over the whole workload afterwards (archive and
    /// RocksDB as one timeline), checked against what was written.
    pub read_back: u64,
}

/// Runs the benchmark on `store` (empty, opened with an archive).
pub fn run(store: &Store, spec: &ArchiveSpec, mut progress: impl FnMut(&str)) -> anyhow::Result<ArchiveReport> {
    let w = &spec.workload;
    for kind in TableKind::ALL {
        let table = TableSpec {
            partition: PartitionSize::Day,
            hot_retention_ms: Some(model::HOUR_MS as u64),
            ..TableSpec::default()
        };
        store.define_table_with(&w.table_name(kind), &table)?;
    }
    let names = FieldNames::default();
    let tables: Vec<Arc<str>> = TableKind::ALL.iter().map(|k| Arc::from(w.table_name(*k))).collect();
    let devices: Vec<Arc<str>> = (0..w.devices).map(|d| Arc::from(crate::workload::device_name(d))).collect();
    let mut generator = Generator::new(w.clone())?;
    let mut points: Vec<Point> = Vec::new();
    let started = Instant::now();
    let mut written = 0u64;
    while generator.next_batch(spec.batch_points.max(1), &mut points) {
        let batch: Vec<DeviceReading> = points
            .drain(..)
            .map(|p| DeviceReading {
                table: tables[usize::from(p.kind == TableKind::Diagnostics)].clone(),
                device: devices[p.device as usize].clone(),
                reading: p.reading(w, &names),
            })
            .collect();
        written += batch.len() as u64;
        store.write(batch, &[])?;
    }
    let write_seconds = started.elapsed().as_secs_f64();
    progress(&format!("{written} points written in {write_seconds:.1} s; compacting"));
    store.compact()?;
    let (_, _, stored_values) = store.bucket_scan_stats()?;
    let rocksdb_bytes_per_value = store.bucket_sst_bytes()? as f64 / stored_values.max(1) as f64;
    progress("spilling");
    let started = Instant::now();
    let report = store.spill_expired_partitions(model::now_ms(), |s| {
        progress(&format!("archived {} partition {}: {} rows, {} bytes", s.table, s.partition, s.rows, s.bytes))
    })?;
    let spill_seconds = started.elapsed().as_secs_f64();
    let mut per_table = Vec::new();
    for kind in TableKind::ALL {
        let name = w.table_name(kind);
        let mine: Vec<_> = report.spilled.iter().filter(|s| s.table == name).collect();
        let rows: u64 = mine.iter().map(|s| s.rows).sum();
        let bytes: u64 = mine.iter().map(|s| s.bytes).sum();
        let values = rows * kind.fields().len() as u64;
        per_table.push(TableArchive {
            table: name,
            files: mine.len(),
            rows,
            values,
            bytes,
            bytes_per_value: bytes as f64 / values.max(1) as f64,
        });
    }
    let (rows, bytes, values) = per_table.iter().fold((0, 0, 0), |a, t| (a.0 + t.rows, a.1 + t.bytes, a.2 + t.values));
    anyhow::ensure!(rows == written, "{rows} rows archived, {written} points written");

    let readings = w.table_name(TableKind::Readings);
    let whole = TimeRange { start: w.start_ms, end: w.end_ms() + w.max_delay_ticks as i64 * w.interval_ms + 1 };
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut read_readings = 0;
    for k in 0..spec.reads {
        let device = crate::workload::device_name(k.wrapping_mul(7919) % w.devices.max(1));
        let t = Instant::now();
        let got = store.read_range(&readings, &device, whole)?.unwrap_or_default();
        hist.record(t.elapsed().as_micros().max(1) as u64)?;
        read_readings = got.len() as u64;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let late = (spec.late > 0).then(|| late_run(store, spec, &report, whole, &mut progress)).transpose()?;
    Ok(ArchiveReport {
        points: written,
        write_seconds,
        spill_seconds,
        spill_rows_per_second: rows as f64 / spill_seconds.max(1e-9),
        tables: per_table,
        bytes_per_value: bytes as f64 / values.max(1) as f64,
        rocksdb_bytes_per_value,
        read_readings,
        read_ms: [ms(0.5), ms(0.9), ms(0.99), hist.max() as f64 / 1000.0],
        late,
    })
}

/// Writes [`ArchiveSpec::late`] late readings (a millisecond after a truck's first reading of
/// the first archived partition of `readings`, so none replaces one) and times the spill run
/// after them; checks that each late device reads back with one reading more.
fn late_run(
    store: &Store,
    spec: &ArchiveSpec,
    spilled: &bucketer::archive::SpillReport,
    whole: TimeRange,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<LateRun> {
    let w = &spec.workload;
    let readings = w.table_name(TableKind::Readings);
    let first = spilled
        .spilled
        .iter()
        .find(|s| s.table == readings)
        .ok_or_else(|| anyhow::anyhow!("no partition of {readings} archived"))?;
    anyhow::ensure!(spec.late <= w.devices, "--late {} is more than the {} trucks", spec.late, w.devices);
    let mut batch = Vec::new();
    let mut before = Vec::new();
    for d in 0..spec.late {
        let device = crate::workload::device_name(d);
        let had = store.read_range(&readings, &device, whole)?.unwrap_or_default();
        let at = had
            .first()
            .map(|r| r.ts + 1)
            .filter(|ts| PartitionSize::Day.index_of(*ts) == first.partition)
            .ok_or_else(|| anyhow::anyhow!("{device} has no reading in partition {}", first.partition))?;
        before.push(had.len() as u64);
        let fields = vec![(Arc::from("velocity"), model::Value::F64(1.5))];
        batch.push(DeviceReading {
            table: Arc::from(readings.as_str()),
            device: Arc::from(device),
            reading: model::Reading::new(at, fields),
        });
    }
    store.write(batch, &[])?;
    progress(&format!("{} late readings written into {readings} partition {}; spilling", spec.late, first.partition));
    let started = Instant::now();
    let report = store.spill_expired_partitions(model::now_ms(), |_| ())?;
    let seconds = started.elapsed().as_secs_f64();
    let mut read_back = 0;
    for (d, had) in before.iter().enumerate() {
        let device = crate::workload::device_name(d as u64);
        let got = store.read_range(&readings, &device, whole)?.unwrap_or_default().len() as u64;
        anyhow::ensure!(got == had + 1, "{device}: {got} readings after its late one, {had} before");
        read_back += got;
    }
    Ok(LateRun {
        readings: spec.late,
        seconds,
        rewritten: report.spilled.len(),
        rewritten_rows: report.spilled.iter().map(|s| s.rows).sum(),
        deferred: report.deferred.len(),
        read_back,
    })
}
