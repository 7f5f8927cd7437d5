//! JSON decoding throughput of gateway messages (a JSON array of readings, each naming its
//! device), the value format of the MQTT gateway topic and of Kafka messages, in readings/s.
//!
//! `cargo bench --workspace --bench wire`. Each iteration decodes one message of [`READINGS`]
//! readings like `hourglass bench kafka` produces: 1,000 trucks at one tick, each reading
//! `{"device":"truck_N","ts":…}` with the seven TSBS `readings` fields (about 170 bytes).

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

fn gateway_payload() -> Vec<u8> {
    let mut rng = Lcg(42);
    let mut out = String::from("[");
    for truck in 0..READINGS {
        if truck > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{{\"device\":\"truck_{truck}\",\"ts\":{},\"elevation\":{}.{},\"fuel_consumption\":{}.{},\"grade\":{}.{},\
             \"heading\":{}.{},\"latitude\":{}.{:05},\"longitude\":-{}.{:05},\"velocity\":{}.{}}}",
            1_451_606_400_000_i64 + truck as i64,
            rng.next(500),
            rng.next(100),
            rng.next(50),
            rng.next(10),
            rng.next(100),
            rng.next(10),
            rng.next(360),
            rng.next(1000),
            rng.next(90),
            rng.next(100_000),
            rng.next(180),
            rng.next(100_000),
            rng.next(100),
            rng.next(10),
        ));
    }
    out.push(']');
    out.into_bytes()
}

fn wire(c: &mut Criterion) {
    let payload = gateway_payload();
    let cfg = WireConfig::default();
    let batch = decode_json(&cfg, "bench", "readings", None, &payload, 0);
    assert_eq!((batch.readings.len(), batch.dead_letters.len()), (READINGS, 0));
    assert_eq!(batch.readings[0].reading.fields.len(), 7);

    let mut group = c.benchmark_group("wire/json_gateway");
    group.throughput(Throughput::Elements(READINGS as u64));
    group.bench_function("readings", |b| {
        b.iter(|| decode_json(&cfg, "bench", "readings", None, black_box(&payload), 0))
    });
    group.finish();
}

criterion_group!(benches, wire);
criterion_main!(benches);
