//! A seeded TSBS-style IoT fleet: trucks reporting seven float fields at a fixed interval.
//!
//! Every value is a pure function of (seed, device, tick), so a workload is reproducible and
//! any tick of any device can be produced without generating the ones before it.

use std::sync::Arc;

use model::{DeviceReading, FieldName, Reading, Value};

/// The fields of the TSBS `readings` measurement, in name order.
pub const READING_FIELDS: [&str; 7] =
    ["elevation", "fuel_consumption", "grade", "heading", "latitude", "longitude", "velocity"];

/// What fleet to generate.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// Number of trucks.
    pub devices: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Time between two readings of a truck, ms.
    pub interval_ms: i64,
    /// Timestamp of tick 0, epoch ms.
    pub start_ms: i64,
    /// Table the readings go to.
    pub table: String,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            devices: 1000,
            seed: 42,
            interval_ms: 10_000,
            start_ms: 1_700_000_000_000,
            table: "fleet.readings".into(),
        }
    }
}

/// A fleet ready to generate readings.
#[derive(Debug, Clone)]
pub struct Fleet {
    spec: FleetSpec,
    table: Arc<str>,
    names: Vec<Arc<str>>,
    fields: [FieldName; 7],
}

/// SplitMix64: a tiny, good-enough mixer for reproducible per-(device, tick) randomness.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `v` rounded half away from zero to a multiple of `1 / scale` (scale a power of ten), as a
/// sensor reporting that many decimals would: a cast instead of a libm `round` call.
fn round(v: f64, scale: f64) -> f64 {
    let scaled = v * scale;
    (scaled + 0.5f64.copysign(scaled)) as i64 as f64 / scale
}

/// A uniform float in [0, 1) from a hash.
pub(crate) fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Fleet {
    /// A fleet of `spec.devices` trucks named `truck_0`, `truck_1`, ...
    pub fn new(spec: FleetSpec) -> Fleet {
        let names = (0..spec.devices).map(|d| Arc::from(format!("truck_{d}"))).collect();
        let fields = READING_FIELDS.map(Arc::from);
        Fleet { table: Arc::from(spec.table.as_str()), spec, names, fields }
    }

    /// The spec.
    pub fn spec(&self) -> &FleetSpec {
        &self.spec
    }

    /// Name of device `d`.
    pub fn device_name(&self, d: u64) -> &Arc<str> {
        &self.names[d as usize]
    }

    /// Timestamp of tick `t`.
    pub fn tick_ts(&self, t: u64) -> i64 {
        self.spec.start_ms + t as i64 * self.spec.interval_ms
    }

    /// The reading of device `d` at tick `t`. Values drift smoothly over ticks (a slow sine
    /// per device plus small noise, rounded as real sensors report), as fleet telemetry does.
    pub fn reading(&self, d: u64, t: u64) -> Reading {
        let h = mix(self.spec.seed ^ mix(d));
        let phase = unit(h) * std::f64::consts::TAU;
        let x = t as f64 / 360.0 + phase;
        // One sin_cos of x/2 gives every angle the fields use (x, 2x, 3x, 1.5x) by the double-
        // and triple-angle identities: the generator runs beside the pipeline in the in-process
        // benchmarks, so its cost is kept small.
        let (s, c) = (0.5 * x).sin_cos();
        let (sin1, cos1) = (2.0 * s * c, 1.0 - 2.0 * s * s);
        let sin2 = 2.0 * sin1 * cos1;
        let sin3 = sin1 * (3.0 - 4.0 * sin1 * sin1);
        let sin15 = sin1 * c + cos1 * s;
        let tick = mix(h ^ mix(t));
        let noise = |k: u64| unit(mix(tick.wrapping_add(k))) - 0.5;
        let lat = round(40.0 + 10.0 * unit(mix(h ^ 1)) + 0.01 * sin1, 1e5);
        let lon = round(-100.0 + 20.0 * unit(mix(h ^ 2)) + 0.01 * cos1, 1e5);
        let values = [
            round(500.0 + 100.0 * sin1 + noise(0), 10.0), // elevation
            round(25.0 + 5.0 * sin2 + noise(1), 10.0),    // fuel_consumption
            round(3.0 * sin3 + noise(2), 1.0),            // grade
            round(180.0 + 90.0 * cos1 + noise(3), 1.0),   // heading
            lat,
            lon,
            round(60.0 + 20.0 * sin15 + 2.0 * noise(4), 1.0), // velocity
        ];
        Reading { ts: self.tick_ts(t), fields: self.fields.iter().cloned().zip(values.map(Value::F64)).collect() }
    }

    /// Every device's reading at tick `t`.
    pub fn tick(&self, t: u64) -> Vec<DeviceReading> {
        (0..self.spec.devices).map(|d| self.device_reading(d, t)).collect()
    }

    /// Device `d`'s reading at tick `t`, addressed to the fleet's table.
    pub fn device_reading(&self, d: u64, t: u64) -> DeviceReading {
        DeviceReading { table: self.table.clone(), device: self.names[d as usize].clone(), reading: self.reading(d, t) }
    }

    /// A JSON payload for the gateway topic `{prefix}/{table}`: an array of readings, each
    /// naming its device.
    pub fn json_payload(&self, devices: std::ops::Range<u64>, ticks: std::ops::Range<u64>) -> Vec<u8> {
        let mut out = Vec::with_capacity(((devices.end - devices.start) * (ticks.end - ticks.start)) as usize * 200);
        let (mut ints, mut floats) = (itoa::Buffer::new(), ryu::Buffer::new());
        out.push(b'[');
        let mut first = true;
        for t in ticks {
            for d in devices.clone() {
                if !first {
                    out.push(b',');
                }
                first = false;
                let r = self.reading(d, t);
                out.extend_from_slice(b"{\"device\":\"");
                out.extend_from_slice(self.names[d as usize].as_bytes());
                out.extend_from_slice(b"\",\"ts\":");
                out.extend_from_slice(ints.format(r.ts).as_bytes());
                for (name, v) in &r.fields {
                    out.extend_from_slice(b",\"");
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b"\":");
                    // The fleet's readings hold floats only.
                    out.extend_from_slice(format_f64(&mut floats, v.as_number().unwrap_or(f64::NAN)).as_bytes());
                }
                out.push(b'}');
            }
        }
        out.push(b']');
        out
    }
}

/// Shortest JSON text that parses back to exactly `v` (finite values only; the generator
/// makes no others), e.g. `1.0`, `0.125`, `1e16`.
pub fn format_f64(buf: &mut ryu::Buffer, v: f64) -> &str {
    // ryu prints the shortest round-tripping digits, always with a `.` or an exponent.
    buf.format_finite(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_reproducible_and_complete() {
        let a = Fleet::new(FleetSpec::default());
        let b = Fleet::new(FleetSpec::default());
        assert_eq!(a.reading(7, 11), b.reading(7, 11));
        assert_ne!(a.reading(7, 11), a.reading(8, 11));
        let r = a.reading(3, 2);
        assert_eq!(r.ts, 1_700_000_020_000);
        let names: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, READING_FIELDS);
    }

    #[test]
    fn readings_follow_their_curves_rounded_as_sensors_report() {
        assert_eq!(round(52.318_544, 1e5), 52.31854);
        assert_eq!(round(2.5, 1.0), 3.0);
        assert_eq!(round(-2.5, 1.0), -3.0);
        assert_eq!(round(-0.04, 10.0), -0.0);
        let fleet = Fleet::new(FleetSpec::default());
        for (d, t) in [(0, 0), (1, 1), (7, 359), (123, 10_000), (999, 77_777)] {
            let h = mix(fleet.spec.seed ^ mix(d));
            let x = t as f64 / 360.0 + unit(h) * std::f64::consts::TAU;
            let r = fleet.reading(d, t);
            // Each field within its noise and rounding of the curve it follows.
            let near = |name: &str, curve: f64, noise: f64, step: f64| {
                let v = r.get_f64(name).expect("every field in every reading");
                assert!((v - curve).abs() <= noise + step / 2.0 + 1e-9, "{name} {v} vs {curve} ({d}, {t})");
                assert!(((v / step).round() * step - v).abs() < 1e-9, "{name} {v} not a multiple of {step}");
            };
            near("elevation", 500.0 + 100.0 * x.sin(), 0.5, 0.1);
            near("fuel_consumption", 25.0 + 5.0 * (2.0 * x).sin(), 0.5, 0.1);
            near("grade", 3.0 * (3.0 * x).sin(), 0.5, 1.0);
            near("heading", 180.0 + 90.0 * x.cos(), 0.5, 1.0);
            near("velocity", 60.0 + 20.0 * (1.5 * x).sin(), 1.0, 1.0);
            near("latitude", 40.0 + 10.0 * unit(mix(h ^ 1)) + 0.01 * x.sin(), 0.0, 1e-5);
            near("longitude", -100.0 + 20.0 * unit(mix(h ^ 2)) + 0.01 * x.cos(), 0.0, 1e-5);
        }
    }

    #[test]
    fn format_f64_is_shortest_and_round_trips() {
        let mut buf = ryu::Buffer::new();
        assert_eq!(format_f64(&mut buf, 1.0), "1.0");
        assert_eq!(format_f64(&mut buf, -0.125), "-0.125");
        assert_eq!(format_f64(&mut buf, 52.31854), "52.31854");
        assert_eq!(format_f64(&mut buf, 1e16), "1e16");
        for v in [0.1, 1.0 / 3.0, -123.456e-7, f64::MAX, f64::MIN_POSITIVE] {
            let text = format_f64(&mut buf, v).to_string();
            assert_eq!(serde_json::from_str::<f64>(&text).expect("a JSON number"), v, "{text}");
        }
    }

    #[test]
    fn json_payload_round_trips_through_the_wire_format() {
        let fleet = Fleet::new(FleetSpec { devices: 4, ..Default::default() });
        let payload = fleet.json_payload(1..3, 5..7);
        let v: serde_json::Value = serde_json::from_slice(&payload).expect("valid JSON");
        let arr = v.as_array().expect("array");
        assert_eq!(arr.len(), 4);
        assert_eq!(arr[0]["device"], "truck_1");
        assert_eq!(arr[0]["ts"], fleet.tick_ts(5));
        assert_eq!(arr[3]["device"], "truck_2");
        assert_eq!(arr[3]["velocity"].as_f64(), fleet.reading(2, 6).get_f64("velocity"));
    }
}
