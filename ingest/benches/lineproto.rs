//! Line protocol decoding throughput on TSBS-style IoT lines, in lines/s and values/s.
//!
//! `cargo bench -p ingest --bench lineproto`. Each iteration parses one payload of
//! [`LINES`] lines (about 210 bytes each, 5 tags and 7 fields: latitude and longitude with
//! five decimals, four integers, and a fuel consumption written half the time without a
//! decimal point) and touches every field, as a consumer would. The `lines`, `values` and
//! `bytes` groups time the same work and differ only in the unit criterion reports. The
//! `lpwire` group times the whole mapping into an ingest batch ([`ingest::lpwire::decode_lines`]:
//! validation, readings, the trucks' reported tags), in lines/s: `tsbs` with a fresh memory of
//! the devices' tags for each payload (the MQTT path), `tsbs-remembering` with one memory kept
//! across payloads, as the HTTP intake and a Kafka consumer keep it.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ingest::lineproto::{parse_lines, FieldValue, Precision};

/// Lines per payload.
const LINES: usize = 10_000;
/// Fields per line.
const VALUES_PER_LINE: usize = 7;

const FLEETS: [&str; 5] = ["South", "North", "East", "West", "Central"];
const DRIVERS: [&str; 8] = ["Trish", "Albert", "Derek", "Seth", "Rodney", "Andy", "Annie", "Zack"];
const MODELS: [&str; 3] = ["H-2", "F-150", "G-2000"];
const VERSIONS: [&str; 3] = ["v1.0", "v1.5", "v2.3"];

/// A small deterministic generator (64-bit LCG, upper bits), so runs compare.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// `LINES` lines like `tsbs generate_data --use-case=iot --format=influx` writes, for 1000 trucks
/// reporting every 10 s from 2016-01-01.
fn tsbs_payload() -> String {
    let mut rng = Lcg(42);
    let mut out = String::with_capacity(LINES * 260);
    for i in 0..LINES {
        let truck = i % 1000;
        let ts = 1_451_606_400_000_000_000_i64 + (i / 1000) as i64 * 10_000_000_000;
        let latitude = rng.next(9_000_000) as f64 / 100_000.0;
        let longitude = rng.next(18_000_000) as f64 / 100_000.0 - 90.0;
        let fuel =
            if rng.next(2) == 0 { format!("{}", rng.next(50)) } else { format!("{}.{}", rng.next(50), rng.next(10)) };
        out.push_str(&format!(
            "readings,name=truck_{truck},fleet={},driver={},model={},device_version={} \
             latitude={latitude:.5},longitude={longitude:.5},elevation={}i,velocity={}i,heading={}i,grade={}i,\
             fuel_consumption={fuel} {ts}\n",
            FLEETS[truck % FLEETS.len()],
            DRIVERS[truck % DRIVERS.len()],
            MODELS[truck % MODELS.len()],
            VERSIONS[truck % VERSIONS.len()],
            rng.next(500),
            rng.next(100),
            rng.next(360),
            rng.next(100),
        ));
    }
    out
}

/// Parses `payload` and folds every value, so that nothing is optimised away. Returns the
/// number of values.
fn parse_all(payload: &str) -> usize {
    let mut values = 0;
    let mut sum = 0.0;
    for line in parse_lines(payload, Precision::Nanoseconds, 0) {
        let Ok(line) = line else { panic!("benchmark payload has a bad line") };
        for (_, value) in &line.fields {
            values += 1;
            sum += match value {
                FieldValue::Float(v) => *v,
                FieldValue::Int(v) => *v as f64,
                FieldValue::UInt(v) => *v as f64,
                FieldValue::Bool(v) => f64::from(u8::from(*v)),
                FieldValue::Str(s) => s.len() as f64,
            };
        }
        black_box(&line.tags);
        black_box(line.timestamp_ms);
    }
    black_box(sum);
    values
}

fn lineproto(c: &mut Criterion) {
    let payload = tsbs_payload();
    assert_eq!(parse_all(&payload), LINES * VALUES_PER_LINE);

    let mut lines = c.benchmark_group("lineproto/lines");
    lines.throughput(Throughput::Elements(LINES as u64));
    lines.bench_function("tsbs", |b| b.iter(|| parse_all(black_box(&payload))));
    lines.finish();

    let mut values = c.benchmark_group("lineproto/values");
    values.throughput(Throughput::Elements((LINES * VALUES_PER_LINE) as u64));
    values.bench_function("tsbs", |b| b.iter(|| parse_all(black_box(&payload))));
    values.finish();

    let mut bytes = c.benchmark_group("lineproto/bytes");
    bytes.throughput(Throughput::Bytes(payload.len() as u64));
    bytes.bench_function("tsbs", |b| b.iter(|| parse_all(black_box(&payload))));
    bytes.finish();

    let cfg = ingest::lpwire::LpConfig { precision: Precision::Nanoseconds, ..Default::default() };
    let batch = ingest::lpwire::decode_lines(&cfg, "bench", None, payload.as_bytes(), 0);
    assert_eq!((batch.readings.len(), batch.dead_letters.len()), (LINES, 0));
    let mut mapped = c.benchmark_group("lpwire/lines");
    mapped.throughput(Throughput::Elements(LINES as u64));
    mapped.bench_function("tsbs", |b| {
        b.iter(|| ingest::lpwire::decode_lines(&cfg, "bench", None, black_box(payload.as_bytes()), 0))
    });
    // As a consumer decodes (the HTTP intake, a Kafka partition): with its memory of the
    // devices' tags and of the lines' series keys, warm from the payloads before.
    let mut memory = ingest::lpwire::TagMemory::default();
    let first = ingest::lpwire::decode_lines_remembering(&cfg, "bench", None, payload.as_bytes(), 0, &mut memory);
    assert_eq!((first.readings.len(), first.device_tags.len()), (LINES, 1000));
    mapped.bench_function("tsbs-remembering", |b| {
        b.iter(|| {
            ingest::lpwire::decode_lines_remembering(&cfg, "bench", None, black_box(payload.as_bytes()), 0, &mut memory)
        })
    });
    mapped.finish();
}

criterion_group!(benches, lineproto);
criterion_main!(benches);
