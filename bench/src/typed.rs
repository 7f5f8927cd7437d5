//! Bytes per value of typed fields: the TSBS diagnostics `status` as an `i64`, an engine-on
//! `bool` and a driver `string`, each written alone into a store of its own and measured after
//! a full compaction; `status` and `engine_on` also as the `f64`s every field was before typed
//! fields, for comparison.
//!
//! The data (deterministic for a seed):
//! - `status`: the diagnostics status of [`crate::workload::values`] (an integer 0–5 following a
//!   slow wave with noise, as TSBS generates it): it changes a few times an hour.
//! - `engine_on`: on while a slow per-truck wave (a period of about 12 h at 10 s ticks) is above
//!   -0.3: long runs, a change every few hours.
//! - `driver`: one of the workload's six driver names, rotating at each 8-hour shift, offset per
//!   truck: one change per shift.
//!
//! Two figures per variant: SST bytes of the `buckets` column family per value after a full
//! compaction (keys, timestamps and RocksDB's block compression included, as the storage bench
//! counts), and *value-stream* bytes per value — the bucket codec's stream of the field alone,
//! before RocksDB: the bytes of each device-hour bucket minus the bytes of the same bucket
//! without the field.

use std::time::Instant;

use bucketer::{codec, Store, StoreConfig};
use model::{DeviceReading, FieldName, Reading, Value};

use crate::workload::{self, TableKind, WorkloadSpec};

/// What to generate.
#[derive(Debug, Clone)]
pub struct TypedSpec {
    /// Trucks.
    pub devices: u64,
    /// Readings per truck.
    pub ticks: u64,
    /// Milliseconds between two readings of a truck.
    pub interval_ms: i64,
    /// Seed of the workload's random choices.
    pub seed: u64,
}

/// One variant's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TypedResult {
    /// `status_i64`, `status_as_f64`, `engine_on_bool`, `engine_on_as_f64`, `driver_string`.
    pub variant: &'static str,
    /// Values written (= stored).
    pub values: u64,
    /// SST bytes of `buckets` after a full compaction, per value.
    pub sst_bytes_per_value: f64,
    /// Key and value bytes of `buckets` before RocksDB's compression, per value.
    pub key_plus_value_bytes_per_value: f64,
    /// The field's value stream alone, per value (see the module documentation).
    pub value_stream_bytes_per_value: f64,
    /// Seconds to write, compact and measure.
    pub seconds: f64,
}

/// The value of variant `variant` for truck `d` at tick `t`.
fn value(spec: &TypedSpec, wspec: &WorkloadSpec, variant: &str, d: u64, t: u64) -> Value {
    let phase = crate::fleet::unit(crate::fleet::mix(spec.seed ^ d.wrapping_mul(0x9e37_79b9))) * std::f64::consts::TAU;
    let engine_on = || (t as f64 / 6875.0 * std::f64::consts::TAU + phase).sin() > -0.3;
    match variant {
        "status_i64" => Value::I64(workload::values(wspec, TableKind::Diagnostics, d, t)[3]),
        "status_as_f64" => Value::F64(workload::values(wspec, TableKind::Diagnostics, d, t)[3] as f64),
        "engine_on_bool" => Value::Bool(engine_on()),
        "engine_on_as_f64" => Value::F64(if engine_on() { 1.0 } else { 0.0 }),
        _ => {
            let shift = (wspec.tick_ts(t) - wspec.start_ms) / (8 * model::HOUR_MS);
            let drivers = workload::DRIVERS;
            Value::from(drivers[((d as i64 + shift) as usize) % drivers.len()])
        }
    }
}

/// Every variant, in report order.
pub const VARIANTS: [&str; 5] = ["status_i64", "status_as_f64", "engine_on_bool", "engine_on_as_f64", "driver_string"];

/// Writes each variant into a fresh store under `dir` (one subdirectory each) and measures it.
pub fn run(dir: &std::path::Path, spec: &TypedSpec) -> bucketer::Result<Vec<TypedResult>> {
    let wspec = WorkloadSpec {
        devices: spec.devices,
        ticks: spec.ticks,
        interval_ms: spec.interval_ms,
        seed: spec.seed,
        ..WorkloadSpec::default()
    };
    let table: std::sync::Arc<str> = "diag.typed".into();
    let names: Vec<std::sync::Arc<str>> = (0..spec.devices).map(|d| format!("truck_{d}").into()).collect();
    let mut results = Vec::new();
    for variant in VARIANTS {
        let started = Instant::now();
        let field: FieldName = field_name(variant).into();
        let store = Store::open(&dir.join(variant), StoreConfig::default())?;
        let (mut values, mut stream_bytes) = (0u64, 0u64);
        let ticks_per_hour = (model::HOUR_MS / spec.interval_ms.max(1)).max(1) as u64;
        // One hour of the whole fleet a batch (the workload starts on the hour): every
        // device-hour bucket is one operand, so the value-stream figure is taken on exactly the
        // buckets stored.
        let mut t = 0;
        while t < spec.ticks {
            let end = (t + ticks_per_hour).min(spec.ticks);
            let mut batch = Vec::with_capacity(((end - t) * spec.devices) as usize);
            for d in 0..spec.devices {
                let readings: Vec<Reading> = (t..end)
                    .map(|tick| {
                        Reading::new(wspec.tick_ts(tick), vec![(field.clone(), value(spec, &wspec, variant, d, tick))])
                    })
                    .collect();
                stream_bytes += stream_len(&readings) as u64;
                values += readings.len() as u64;
                batch.extend(readings.into_iter().map(|reading| DeviceReading {
                    table: table.clone(),
                    device: names[d as usize].clone(),
                    reading,
                }));
            }
            store.write(batch, &[])?;
            t = end;
        }
        store.compact()?;
        let sst = store.bucket_sst_bytes()?;
        let (_, raw, stored) = store.bucket_scan_stats()?;
        if stored != values {
            return Err(bucketer::Error::Corrupt {
                what: "typed-fields bench",
                detail: format!("{variant}: stored {stored} values, wrote {values}"),
            });
        }
        results.push(TypedResult {
            variant,
            values,
            sst_bytes_per_value: sst as f64 / values as f64,
            key_plus_value_bytes_per_value: raw as f64 / values as f64,
            value_stream_bytes_per_value: stream_bytes as f64 / values as f64,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    Ok(results)
}

/// The field name of a variant: `status`, `engine_on` or `driver`.
fn field_name(variant: &str) -> &'static str {
    if variant.starts_with("status") {
        "status"
    } else if variant.starts_with("engine_on") {
        "engine_on"
    } else {
        "driver"
    }
}

/// Bytes of the bucket of `readings` minus those of the same bucket without fields.
fn stream_len(readings: &[Reading]) -> usize {
    let mut with = Vec::new();
    codec::encode(readings, &mut with);
    let bare: Vec<Reading> = readings.iter().map(|r| Reading { ts: r.ts, fields: Vec::new() }).collect();
    let mut without = Vec::new();
    codec::encode(&bare, &mut without);
    with.len() - without.len()
}
