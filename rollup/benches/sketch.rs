//! A field's quantile sketch through a roll-up, per device-hour: 60 readings added, the sketch
//! packed as a record stores it, read back and merged into the table's, in device-hours/s.
//!
//! `cargo bench --workspace --bench sketch`. Three hours: `usual` (values 20 to 36), `f32_max`
//! (the same and one reading of 3.4e38, the largest 32-bit float, a common "no reading" of
//! sensors: 4,400 bins of 2 % above 1) and `widest` (the same and readings of 1e-8 and 1e308:
//! the sketch's whole span, 36,500 bins). A sketch's bins run from its lowest key to its
//! highest, so what a device-hour costs grows with the span of its values.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rollup::approx::Quantiles;

/// Device-hours per iteration.
const DEVICES: u32 = 200;

/// One device-hour's sketch through a pass: added, packed, read back, merged into `table`.
fn device_hour(d: u32, glitches: &[f64], table: &mut Quantiles, out: &mut Vec<u8>) {
    let mut q = Quantiles::default();
    for i in 0..60 {
        q.add(20.0 + f64::from((d + i) % 17));
    }
    for &g in glitches {
        q.add(g);
    }
    out.clear();
    q.write_packed(0.0, 0.0, out);
    let back = Quantiles::from_packed(out, 0.0, 0.0).expect("its own bytes");
    table.merge(&back);
}

fn sketch(c: &mut Criterion) {
    let mut group = c.benchmark_group("sketch");
    group.throughput(Throughput::Elements(u64::from(DEVICES)));
    let cases: [(&str, &[f64]); 3] =
        [("usual", &[]), ("f32_max", &[3.402_823_466_385_288_6e38]), ("widest", &[1e-8, 1e308])];
    for (name, glitches) in cases {
        group.bench_function(name, |b| {
            let mut out = Vec::new();
            b.iter(|| {
                let mut table = Quantiles::default();
                for d in 0..DEVICES {
                    device_hour(d, glitches, &mut table, &mut out);
                }
                black_box(table.quantile(0.5))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, sketch);
criterion_main!(benches);
