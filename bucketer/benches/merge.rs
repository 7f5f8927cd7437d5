//! The `buckets` merge operator ([`bucketer::codec::merge`]) on the merges a compaction does
//! late in the hour: a device's bucket of earlier minutes (the value in the output level)
//! followed by the newer minutes (from level 0) in one operand, or in one operand a minute
//! (the `x1` cases), in readings merged/s.
//!
//! `cargo bench --workspace --bench merge`. Each iteration merges [`DEVICES`] device-hours of
//! the TSBS `readings` table (seven decimal fields at the workload's scales) or `diagnostics`
//! (three decimal fields and an integer), one reading a minute.
//!
//! The `encode` group ([`bucketer::codec::encode`]) encodes the same readings as the writer
//! encodes a batch's operands: one reading a device-hour (`x1`), in readings encoded/s.

use std::hint::black_box;
use std::sync::Arc;

use bucketer::codec::{encode, merge};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use model::{Reading, Value};

/// Device-hours per iteration.
const DEVICES: u64 = 200;

/// A small deterministic generator (64-bit LCG, upper bits), so runs compare.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// A field: name, decimal places, lowest and highest scaled value, and whether it is an integer.
type Spec = (&'static str, u32, i64, i64, bool);

/// `readings` (sorted by name) with the workload's decimals.
const READINGS: [Spec; 7] = [
    ("elevation", 0, 0, 5_000, false),
    ("fuel_consumption", 1, 0, 500, false),
    ("grade", 0, 0, 100, false),
    ("heading", 0, 0, 360, false),
    ("latitude", 5, -9_000_000, 9_000_000, false),
    ("longitude", 5, -18_000_000, 18_000_000, false),
    ("velocity", 0, 0, 100, false),
];

/// `diagnostics` (sorted by name).
const DIAGNOSTICS: [Spec; 4] = [
    ("current_load", 0, 0, 5_000, false),
    ("fuel_state", 1, 0, 10, false),
    ("load", 2, 0, 100, false),
    ("status", 0, 0, 5, true),
];

/// One device's readings for `minutes` minutes: each field a bounded random walk.
fn device_hour(rng: &mut Lcg, specs: &[Spec], minutes: usize) -> Vec<Reading> {
    let names: Vec<Arc<str>> = specs.iter().map(|s| Arc::from(s.0)).collect();
    let mut scaled: Vec<i64> =
        specs.iter().map(|&(_, _, lo, hi, _)| lo + rng.next((hi - lo + 1) as u64) as i64).collect();
    let start = 1_451_606_400_000_i64 + rng.next(60_000) as i64;
    (0..minutes)
        .map(|m| {
            let fields = specs
                .iter()
                .zip(&mut scaled)
                .zip(&names)
                .map(|((&(_, decimals, lo, hi, integer), v), name)| {
                    let step = ((hi - lo) / 50).max(1);
                    *v = (*v + rng.next(2 * step as u64 + 1) as i64 - step).clamp(lo, hi);
                    let value =
                        if integer { Value::I64(*v) } else { Value::F64(*v as f64 / 10f64.powi(decimals as i32)) };
                    (Arc::clone(name), value)
                })
                .collect();
            Reading { ts: start + 60_000 * m as i64, fields }
        })
        .collect()
}

/// Per device, the inputs of one merge: its bucket of the first `before` minutes, then the
/// `after` minutes after them in one operand or (`singles`) in one operand a minute, as a
/// compaction meets them when each memtable flushed held one reading of the device.
fn inputs(specs: &[Spec], before: usize, after: usize, singles: bool) -> Vec<Vec<Vec<u8>>> {
    let mut rng = Lcg(42);
    (0..DEVICES)
        .map(|_| {
            let readings = device_hour(&mut rng, specs, before + after);
            let mut old = Vec::new();
            encode(&readings[..before], &mut old);
            let newer: Vec<&[Reading]> =
                if singles { readings[before..].chunks(1).collect() } else { vec![&readings[before..]] };
            std::iter::once(old)
                .chain(newer.into_iter().map(|part| {
                    let mut bytes = Vec::new();
                    encode(part, &mut bytes);
                    bytes
                }))
                .collect()
        })
        .collect()
}

fn bench_merge(c: &mut Criterion) {
    let mut group = c.benchmark_group("merge");
    for (table, specs) in [("readings", &READINGS[..]), ("diagnostics", &DIAGNOSTICS[..])] {
        for (before, after, singles) in [(30, 1, false), (30, 10, false), (50, 10, false), (30, 10, true)] {
            let inputs = inputs(specs, before, after, singles);
            group.throughput(Throughput::Elements(DEVICES * (before + after) as u64));
            let name =
                if singles { format!("{table}/{before}+{after}x1") } else { format!("{table}/{before}+{after}") };
            group.bench_function(name, |b| {
                b.iter(|| {
                    for device in &inputs {
                        black_box(merge(device.iter().map(|b| &b[..])).expect("valid buckets"));
                    }
                })
            });
        }
    }
    group.finish();
}

fn bench_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (table, specs) in [("readings", &READINGS[..]), ("diagnostics", &DIAGNOSTICS[..])] {
        let mut rng = Lcg(42);
        let readings: Vec<Reading> = (0..DEVICES).flat_map(|_| device_hour(&mut rng, specs, 1)).collect();
        group.throughput(Throughput::Elements(DEVICES));
        group.bench_function(format!("{table}/x1"), |b| {
            let mut out = Vec::new();
            b.iter(|| {
                for r in &readings {
                    out.clear();
                    encode(std::slice::from_ref(r), &mut out);
                    black_box(&out);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_merge, bench_encode);
criterion_main!(benches);
