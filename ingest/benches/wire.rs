//! JSON decoding throughput of gateway messages (a JSON array of readings, each naming its
//! device), the value format of the MQTT gateway topic and of Kafka messages, in readings/s.
//!
//! `cargo bench --workspace --bench wire`. Each iteration decodes one message of [`READINGS`]
//! readings like `hourglass bench kafka` produces: 1,000 trucks at one tick, each reading
//! `{"device":"truck_N","ts":…}` with the seven TSBS `readings` fields (about 170 bytes): in
//! name order (`readings`), and in the table's order as `hourglass bench replay` and TSBS send
//! them (`readings_table_order`), which the decoder has to sort.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ingest::wire::{decode_json, WireConfig};

/// Readings per message.
const READINGS: usize = 1_000;

/// A small deterministic generator (64-bit LCG, upper bits), so runs compare.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// The `readings` fields in name order.
const BY_NAME: [&str; 7] = ["elevation", "fuel_consumption", "grade", "heading", "latitude", "longitude", "velocity"];
/// The same in the table's order (TSBS's), as positions in [`BY_NAME`].
const TABLE_ORDER: [usize; 7] = [4, 5, 0, 6, 3, 2, 1];

/// A gateway message; each reading's fields in name order, or in the table's order.
fn gateway_payload(table_order: bool) -> Vec<u8> {
    let mut rng = Lcg(42);
    let mut out = String::from("[");
    for truck in 0..READINGS {
        if truck > 0 {
            out.push(',');
        }
        let values: [String; 7] = [
            format!("{}.{}", rng.next(500), rng.next(100)),
            format!("{}.{}", rng.next(50), rng.next(10)),
            format!("{}.{}", rng.next(100), rng.next(10)),
            format!("{}.{}", rng.next(360), rng.next(1000)),
            format!("{}.{:05}", rng.next(90), rng.next(100_000)),
            format!("-{}.{:05}", rng.next(180), rng.next(100_000)),
            format!("{}.{}", rng.next(100), rng.next(10)),
        ];
        out.push_str(&format!("{{\"device\":\"truck_{truck}\",\"ts\":{}", 1_451_606_400_000_i64 + truck as i64));
        let order = if table_order { TABLE_ORDER } else { [0, 1, 2, 3, 4, 5, 6] };
        for f in order {
            out.push_str(&format!(",\"{}\":{}", BY_NAME[f], values[f]));
        }
        out.push('}');
    }
    out.push(']');
    out.into_bytes()
}

fn wire(c: &mut Criterion) {
    let cfg = WireConfig::default();
    let mut group = c.benchmark_group("wire/json_gateway");
    group.throughput(Throughput::Elements(READINGS as u64));
    let by_name = gateway_payload(false);
    let table_order = gateway_payload(true);
    let decoded = |payload: &[u8]| decode_json(&cfg, "bench", "readings", None, payload, 0).readings;
    assert_eq!(decoded(&by_name), decoded(&table_order), "the same readings either way");
    let readings = decoded(&by_name);
    assert_eq!(readings.len(), READINGS);
    let names: Vec<&str> = readings[0].reading.fields.iter().map(|(n, _)| &**n).collect();
    assert_eq!(names, BY_NAME);
    for (name, payload) in [("readings", &by_name), ("readings_table_order", &table_order)] {
        group.bench_function(name, |b| b.iter(|| decode_json(&cfg, "bench", "readings", None, black_box(payload), 0)));
    }
    group.finish();
}

criterion_group!(benches, wire);
criterion_main!(benches);
