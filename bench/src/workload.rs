//! The TSBS IoT workload: a seeded fleet of trucks with tags, two tables (`readings` and
//! `diagnostics`), a configurable interval, and a share of missing and of out-of-order points.
//!
//! Every tag and value is a pure function of (seed, device, tick), so the generator streams any
//! device count: it holds one batch of points and the identities (table, device, tick: no
//! values) of the late points not yet due, never the fleet's readings. Values are generated as
//! integers scaled by a power of ten per field ([`FieldSpec::decimals`]) and become `f64` by one
//! division, so the decimal text written to line protocol or JSON parses back to the very same
//! `f64` (IEEE division and decimal parsing are both correctly rounded).
//!
//! Emission order, as TSBS writes its files: tick by tick; within a tick, device by device, the
//! `readings` point then the `diagnostics` point, skipping the missing ones and holding back
//! the late ones; then the late points due at this tick (each is `1..=max_delay_ticks` ticks
//! late, drawn per point); after the last tick, the late points still pending, by due tick.
//!
//! ```
//! use bench::workload::{Generator, WorkloadSpec};
//!
//! let spec = WorkloadSpec { devices: 10, ticks: 3, ..WorkloadSpec::default() };
//! let mut generator = Generator::new(spec.clone()).unwrap();
//! let mut points = Vec::new();
//! while generator.next_batch(1000, &mut points) {}
//! let counts = generator.counts();
//! assert_eq!(counts.points() + counts.missing, 10 * 3 * 2);
//! ```

use std::collections::BTreeMap;
use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::fleet::{mix, unit};
use crate::{Error, Result};

/// One field of a table: its name and the decimal places its values carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    /// Field name.
    pub name: &'static str,
    /// Decimal places: a value is an integer divided by `10^decimals`.
    pub decimals: u32,
    /// Written as a line protocol integer (`2i`) rather than a float.
    pub integer: bool,
}

const fn float(name: &'static str, decimals: u32) -> FieldSpec {
    FieldSpec { name, decimals, integer: false }
}

/// The two tables of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TableKind {
    /// `readings`: position and motion, 7 fields.
    Readings,
    /// `diagnostics`: load, fuel and status, 4 fields.
    Diagnostics,
}

impl TableKind {
    /// Both tables, in emission order.
    pub const ALL: [TableKind; 2] = [TableKind::Readings, TableKind::Diagnostics];

    /// The measurement name (also the table name's suffix).
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Readings => "readings",
            TableKind::Diagnostics => "diagnostics",
        }
    }

    /// The table's fields, in line protocol order (the TSBS order).
    pub fn fields(self) -> &'static [FieldSpec] {
        match self {
            TableKind::Readings => &READINGS_FIELDS,
            TableKind::Diagnostics => &DIAGNOSTICS_FIELDS,
        }
    }

    /// The code of the table in recordings.
    pub fn code(self) -> u8 {
        match self {
            TableKind::Readings => 0,
            TableKind::Diagnostics => 1,
        }
    }

    /// The table of a recording code.
    pub fn from_code(code: u8) -> Option<TableKind> {
        match code {
            0 => Some(TableKind::Readings),
            1 => Some(TableKind::Diagnostics),
            _ => None,
        }
    }
}

/// Fields of `readings`, with TSBS's rounding.
pub const READINGS_FIELDS: [FieldSpec; 7] = [
    float("latitude", 5),
    float("longitude", 5),
    float("elevation", 0),
    float("velocity", 0),
    float("heading", 0),
    float("grade", 0),
    float("fuel_consumption", 1),
];

/// Fields of `diagnostics`; `status` is an integer.
pub const DIAGNOSTICS_FIELDS: [FieldSpec; 4] = [
    float("load", 2),
    float("fuel_state", 1),
    float("current_load", 0),
    FieldSpec { name: "status", decimals: 0, integer: true },
];

/// Most fields a table has.
pub const MAX_FIELDS: usize = 7;

/// Most points [`Generator::next_batch`] reserves room for at once (a larger batch grows).
const MAX_RESERVED_POINTS: usize = 1 << 16;

const FLEETS: [&str; 4] = ["East", "West", "North", "South"];
/// Driver names of the trucks' tags.
pub const DRIVERS: [&str; 6] = ["Derek", "Rodney", "Albert", "Andy", "Seth", "Trish"];
/// Model name, load capacity, fuel capacity, nominal fuel consumption (as in TSBS).
const MODELS: [(&str, i64, i64, i64); 3] =
    [("F-150", 2000, 200, 15), ("G-2000", 5000, 300, 19), ("H-2", 1500, 150, 12)];
const DEVICE_VERSIONS: [&str; 4] = ["v1.0", "v1.5", "v2.0", "v2.3"];

/// What workload to generate. Persisted in recordings (as JSON in the header).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Number of trucks, named `truck_0` ….
    pub devices: u64,
    /// Ticks (points per truck and table before drops).
    pub ticks: u64,
    /// Time between two ticks, ms.
    pub interval_ms: i64,
    /// Timestamp of tick 0, epoch ms.
    pub start_ms: i64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Share of points dropped, in [0, 1].
    pub missing_share: f64,
    /// Share of points emitted late, in [0, 1]; with `missing_share` at most 1.
    pub out_of_order_share: f64,
    /// A late point comes after the points of 1 to this many later ticks.
    pub max_delay_ticks: u64,
    /// Table names are `{table_prefix}.readings` and `{table_prefix}.diagnostics`.
    pub table_prefix: String,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            devices: 1000,
            ticks: 360,
            interval_ms: 10_000,
            start_ms: 1_704_067_200_000, // 2024-01-01T00:00:00Z, as the peers' generator
            seed: 42,
            missing_share: 0.01,
            out_of_order_share: 0.01,
            max_delay_ticks: 30,
            table_prefix: "iot".into(),
        }
    }
}

impl WorkloadSpec {
    /// Checks every setting, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Spec(what));
        if self.devices == 0 {
            return bad("devices must be at least 1".into());
        }
        if self.devices > u32::MAX as u64 {
            return bad(format!("devices must be at most {}", u32::MAX));
        }
        if self.interval_ms <= 0 {
            return bad("interval must be positive".into());
        }
        let in_unit = |v: f64| (0.0..=1.0).contains(&v);
        if !in_unit(self.missing_share) || !in_unit(self.out_of_order_share) {
            return bad("missing and out-of-order shares must be in [0, 1]".into());
        }
        if self.missing_share >= 1.0 {
            return bad("the missing share must be below 1 (at 1 every point is dropped: nothing to send)".into());
        }
        if self.missing_share + self.out_of_order_share > 1.0 {
            return bad("missing + out-of-order shares exceed 1".into());
        }
        if self.out_of_order_share > 0.0 && self.max_delay_ticks == 0 {
            return bad("max delay must be at least 1 tick when points come out of order".into());
        }
        let (latest, earliest) = (7_258_118_400_000, -2_208_988_800_000);
        let end = self.ticks as i128 * self.interval_ms as i128 + self.start_ms as i128;
        if end > latest || self.start_ms < earliest {
            return bad("timestamps must stay within 1900–2200".into());
        }
        // A late point keeps its tick's time; `replay --close-hours` writes its closing reading
        // the longest delay past the end.
        if end + self.max_delay_ticks as i128 * self.interval_ms as i128 > latest {
            return bad(format!(
                "max delay of {} ticks: the workload's end plus that many intervals must stay before 2200 (where \
                 `replay --close-hours` writes its closing reading)",
                self.max_delay_ticks
            ));
        }
        if !self.table_prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            || self.table_prefix.is_empty()
        {
            return bad(format!("table prefix `{}`: use letters, digits, `_` and `.`", self.table_prefix));
        }
        Ok(())
    }

    /// Points the workload is expected to emit: every (device, tick, table) slot but the
    /// missing share of them. Each slot is dropped by its own draw ([`point_state`]), so a
    /// workload's own count differs from this by about the square root of its drops: a
    /// progress total, not a check.
    pub fn expected_points(&self) -> u64 {
        let slots = self.devices.saturating_mul(self.ticks).saturating_mul(TableKind::ALL.len() as u64);
        slots.saturating_sub((slots as f64 * self.missing_share).round() as u64)
    }

    /// Full table name of `kind`.
    pub fn table_name(&self, kind: TableKind) -> String {
        format!("{}.{}", self.table_prefix, kind.name())
    }

    /// Timestamp of tick `t`.
    pub fn tick_ts(&self, t: u64) -> i64 {
        self.start_ms + t as i64 * self.interval_ms
    }

    /// End of the workload's time range (exclusive): one interval after the last tick.
    pub fn end_ms(&self) -> i64 {
        self.tick_ts(self.ticks)
    }
}

/// The tags of one truck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tags {
    /// `truck_{d}`.
    pub name: String,
    /// East, West, North or South.
    pub fleet: &'static str,
    /// The driver's first name.
    pub driver: &'static str,
    /// Truck model.
    pub model: &'static str,
    /// Firmware version.
    pub device_version: &'static str,
    /// The model's load capacity.
    pub load_capacity: i64,
    /// The model's fuel capacity.
    pub fuel_capacity: i64,
    /// The model's nominal fuel consumption.
    pub nominal_fuel_consumption: i64,
}

impl Tags {
    /// As `key=value` pairs in line protocol order.
    pub fn pairs(&self) -> [(&'static str, String); 8] {
        [
            ("name", self.name.clone()),
            ("fleet", self.fleet.into()),
            ("driver", self.driver.into()),
            ("model", self.model.into()),
            ("device_version", self.device_version.into()),
            ("load_capacity", self.load_capacity.to_string()),
            ("fuel_capacity", self.fuel_capacity.to_string()),
            ("nominal_fuel_consumption", self.nominal_fuel_consumption.to_string()),
        ]
    }
}

/// Name of device `d`.
pub fn device_name(d: u64) -> String {
    format!("truck_{d}")
}

fn device_hash(seed: u64, d: u64) -> u64 {
    mix(seed ^ mix(d ^ 0x5EED))
}

fn model_of(seed: u64, d: u64) -> usize {
    (mix(device_hash(seed, d) ^ 3) % MODELS.len() as u64) as usize
}

/// The tags of device `d`.
pub fn tags(spec: &WorkloadSpec, d: u64) -> Tags {
    let h = device_hash(spec.seed, d);
    let pick = |k: u64, n: usize| (mix(h ^ k) % n as u64) as usize;
    let (model, load_capacity, fuel_capacity, nominal_fuel_consumption) = MODELS[model_of(spec.seed, d)];
    Tags {
        name: device_name(d),
        fleet: FLEETS[pick(1, FLEETS.len())],
        driver: DRIVERS[pick(2, DRIVERS.len())],
        model,
        device_version: DEVICE_VERSIONS[pick(4, DEVICE_VERSIONS.len())],
        load_capacity,
        fuel_capacity,
        nominal_fuel_consumption,
    }
}

/// How one (device, tick, table) point is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointState {
    /// In its tick, in device order.
    InOrder,
    /// Not at all.
    Missing,
    /// After the points of this many later ticks.
    Late(u64),
}

/// The emission state of a point: a pure function of the spec's seed and shares.
pub fn point_state(spec: &WorkloadSpec, kind: TableKind, d: u64, t: u64) -> PointState {
    let h = mix(mix(spec.seed ^ 0x0D0E_5EED) ^ mix(d) ^ mix((t << 1) | kind.code() as u64));
    let u = unit(h);
    if u < spec.missing_share {
        PointState::Missing
    } else if u < spec.missing_share + spec.out_of_order_share {
        PointState::Late(1 + mix(h) % spec.max_delay_ticks.max(1))
    } else {
        PointState::InOrder
    }
}

/// Values of a point as scaled integers (see [`FieldSpec::decimals`]); the first
/// `kind.fields().len()` entries are used.
pub fn values(spec: &WorkloadSpec, kind: TableKind, d: u64, t: u64) -> [i64; MAX_FIELDS] {
    let h = device_hash(spec.seed, d);
    let x = t as f64 / 360.0 + unit(h) * std::f64::consts::TAU;
    let noise = |k: u64| unit(mix(h ^ mix(t.wrapping_mul(16).wrapping_add(k)))) - 0.5;
    let scaled = |v: f64, lo: f64, hi: f64, decimals: i32| (v.clamp(lo, hi) * 10f64.powi(decimals)).round() as i64;
    let mut out = [0i64; MAX_FIELDS];
    match kind {
        TableKind::Readings => {
            out[0] = scaled(-60.0 + 120.0 * unit(mix(h ^ 11)) + 0.05 * x.sin(), -90.0, 90.0, 5);
            out[1] = scaled(-170.0 + 340.0 * unit(mix(h ^ 12)) + 0.05 * x.cos(), -180.0, 180.0, 5);
            out[2] = scaled(300.0 + 250.0 * x.sin() + 10.0 * noise(0), 0.0, 5000.0, 0);
            out[3] = scaled(50.0 + 45.0 * (1.5 * x).sin() + 5.0 * noise(1), 0.0, 100.0, 0);
            out[4] = scaled(180.0 + 175.0 * x.cos() + 2.0 * noise(2), 0.0, 360.0, 0);
            out[5] = scaled(10.0 + 9.0 * (3.0 * x).sin() + noise(3), 0.0, 100.0, 0);
            out[6] = scaled(25.0 + 20.0 * (2.0 * x).sin() + noise(4), 0.0, 50.0, 1);
        }
        TableKind::Diagnostics => {
            let capacity = MODELS[model_of(spec.seed, d)].1;
            let current = scaled(capacity as f64 * (0.5 + 0.45 * (x / 2.0).sin()) + 20.0 * noise(5), 0.0, 5000.0, 0);
            // load = current_load / load_capacity, two decimals, in integers.
            out[0] = (current * 100 + capacity / 2) / capacity;
            out[1] = scaled(0.55 + 0.45 * (x / 3.0).cos(), 0.0, 1.0, 1);
            out[2] = current;
            out[3] = scaled(2.5 + 2.5 * (5.0 * x).sin() + noise(6), 0.0, 5.0, 0);
        }
    }
    out
}

/// `10^decimals` as `f64`.
fn scale(decimals: u32) -> f64 {
    10f64.powi(decimals as i32)
}

/// The `f64` of a scaled value of `field`.
pub fn to_f64(field: &FieldSpec, scaled: i64) -> f64 {
    scaled as f64 / scale(field.decimals)
}

/// The reading value of a scaled value of `field`: an `i64` for an integer field (as line
/// protocol's `2i` is stored), else its `f64`.
pub fn typed_value(field: &FieldSpec, scaled: i64) -> model::Value {
    if field.integer {
        model::Value::I64(scaled)
    } else {
        model::Value::F64(to_f64(field, scaled))
    }
}

/// Writes a scaled value as decimal text (`-12.34567`, `500`), the same text the value parses
/// back from.
pub fn write_decimal(out: &mut Vec<u8>, scaled: i64, decimals: u32) {
    let mut buf = itoa::Buffer::new();
    if decimals == 0 {
        out.extend_from_slice(buf.format(scaled).as_bytes());
        return;
    }
    if scaled < 0 {
        out.push(b'-');
    }
    let abs = scaled.unsigned_abs();
    let p = 10u64.pow(decimals);
    out.extend_from_slice(buf.format(abs / p).as_bytes());
    out.push(b'.');
    let frac = buf.format(abs % p);
    for _ in frac.len()..decimals as usize {
        out.push(b'0');
    }
    out.extend_from_slice(frac.as_bytes());
}

/// One point of the workload: a table's values of one device at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// The table.
    pub kind: TableKind,
    /// Device index (`truck_{device}`).
    pub device: u64,
    /// Tick; the timestamp is [`WorkloadSpec::tick_ts`].
    pub tick: u64,
    /// Scaled values; the first `kind.fields().len()` are used.
    pub values: [i64; MAX_FIELDS],
}

impl Point {
    /// The point's values, one per field of its table.
    pub fn values(&self) -> &[i64] {
        &self.values[..self.kind.fields().len()]
    }

    /// As a Hourglass reading. Its fields are built in name order, which
    /// [`model::Reading::new`] takes as they are (the table's field order would cost it a sort
    /// and a copy a reading, on the thread that writes).
    pub fn reading(&self, spec: &WorkloadSpec, names: &FieldNames) -> model::Reading {
        let (fields, values) = (self.kind.fields(), self.values());
        model::Reading::new(
            spec.tick_ts(self.tick),
            names.by_name(self.kind).iter().map(|(i, n)| (n.clone(), typed_value(&fields[*i], values[*i]))).collect(),
        )
    }

    /// Appends the point as one JSON object of a gateway message (`{"device": …, "ts": …,
    /// fields…}`).
    pub fn write_json(&self, spec: &WorkloadSpec, out: &mut Vec<u8>) {
        let mut ints = itoa::Buffer::new();
        out.extend_from_slice(b"{\"device\":\"truck_");
        out.extend_from_slice(ints.format(self.device).as_bytes());
        out.extend_from_slice(b"\",\"ts\":");
        out.extend_from_slice(ints.format(spec.tick_ts(self.tick)).as_bytes());
        for (f, &v) in self.kind.fields().iter().zip(self.values()) {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(f.name.as_bytes());
            out.extend_from_slice(b"\":");
            write_decimal(out, v, f.decimals);
        }
        out.push(b'}');
    }

    /// Appends the point as one line of InfluxDB line protocol (ms timestamps), after the
    /// line's `measurement,tags ` prefix (see [`lp_prefix`]).
    pub fn write_line(&self, spec: &WorkloadSpec, prefix: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(prefix);
        for (i, (f, &v)) in self.kind.fields().iter().zip(self.values()).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(f.name.as_bytes());
            out.push(b'=');
            write_decimal(out, v, f.decimals);
            if f.integer {
                out.push(b'i');
            }
        }
        out.push(b' ');
        out.extend_from_slice(itoa::Buffer::new().format(spec.tick_ts(self.tick)).as_bytes());
        out.push(b'\n');
    }
}

/// The `measurement,tag=value,… ` start of a device's lines: the measurement is the table's
/// kind (`readings`, `diagnostics`), as the peers' files have it.
pub fn lp_prefix(spec: &WorkloadSpec, kind: TableKind, d: u64) -> Vec<u8> {
    lp_prefix_as(kind.name(), spec, d)
}

/// The `measurement,tag=value,… ` start of a device's lines with the given measurement (a
/// Hourglass table name, for line protocol sent to Hourglass).
pub fn lp_prefix_as(measurement: &str, spec: &WorkloadSpec, d: u64) -> Vec<u8> {
    let mut out = measurement.as_bytes().to_vec();
    // Tag values of the generator hold no character line protocol needs escaped.
    for (k, v) in tags(spec, d).pairs() {
        out.push(b',');
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
    }
    out.push(b' ');
    out
}

/// Shared field names of both tables (cloning one is a refcount bump).
#[derive(Debug, Clone)]
pub struct FieldNames {
    /// Per table, by [`TableKind::code`]: (index in [`TableKind::fields`], name), in name order.
    sorted: [Vec<(usize, model::FieldName)>; 2],
}

impl Default for FieldNames {
    fn default() -> Self {
        let mut sorted: [Vec<(usize, model::FieldName)>; 2] = Default::default();
        for k in TableKind::ALL {
            let by_name = &mut sorted[usize::from(k.code())];
            by_name.extend(k.fields().iter().map(|f| model::FieldName::from(f.name)).enumerate());
            by_name.sort_by(|a, b| a.1.cmp(&b.1));
        }
        FieldNames { sorted }
    }
}

impl FieldNames {
    /// `kind`'s fields in name order: (index in [`TableKind::fields`], name).
    pub fn by_name(&self, kind: TableKind) -> &[(usize, model::FieldName)] {
        &self.sorted[usize::from(kind.code())]
    }
}

/// Points emitted and dropped so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// `readings` points emitted.
    pub readings: u64,
    /// `diagnostics` points emitted.
    pub diagnostics: u64,
    /// Points dropped.
    pub missing: u64,
    /// Points emitted late (included in `readings` and `diagnostics`).
    pub late: u64,
}

impl Counts {
    /// Points emitted.
    pub fn points(&self) -> u64 {
        self.readings + self.diagnostics
    }

    /// Field values emitted.
    pub fn values(&self) -> u64 {
        self.readings * READINGS_FIELDS.len() as u64 + self.diagnostics * DIAGNOSTICS_FIELDS.len() as u64
    }

    fn add(&mut self, kind: TableKind) {
        match kind {
            TableKind::Readings => self.readings += 1,
            TableKind::Diagnostics => self.diagnostics += 1,
        }
    }
}

/// A point's identity: table, device, tick.
type PointId = (TableKind, u64, u64);

/// The streaming generator: batches of points in emission order.
#[derive(Debug)]
pub struct Generator {
    spec: WorkloadSpec,
    /// Next (tick, device, table) of the in-order scan.
    tick: u64,
    device: u64,
    table: usize,
    /// Late points by due tick: identities only, values are recomputed when emitted.
    pending: BTreeMap<u64, Vec<PointId>>,
    /// The late points being emitted (due at the tick just scanned) and the position in them.
    draining: Option<(Vec<PointId>, usize)>,
    counts: Counts,
}

impl Generator {
    /// A generator at the start of `spec`'s workload.
    pub fn new(spec: WorkloadSpec) -> Result<Generator> {
        spec.validate()?;
        Ok(Generator {
            spec,
            tick: 0,
            device: 0,
            table: 0,
            pending: BTreeMap::new(),
            draining: None,
            counts: Counts::default(),
        })
    }

    /// The spec.
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// Points emitted and dropped so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    fn point(&self, kind: TableKind, device: u64, tick: u64) -> Point {
        Point { kind, device, tick, values: values(&self.spec, kind, device, tick) }
    }

    /// Replaces `out` with the next at most `max` points (at least 1); false once the workload
    /// is exhausted (then `out` is empty).
    pub fn next_batch(&mut self, max: usize, out: &mut Vec<Point>) -> bool {
        out.clear();
        let max = max.max(1);
        // The replay's reader hands each batch on in a new vector: grown from empty, it copied
        // every point about once more (3% of the publishers' thread in a profile).
        out.reserve(max.min(MAX_RESERVED_POINTS));
        while out.len() < max {
            if let Some((list, pos)) = &mut self.draining {
                if let Some(&(kind, device, tick)) = list.get(*pos) {
                    *pos += 1;
                    let p = self.point(kind, device, tick);
                    self.counts.add(kind);
                    out.push(p);
                    continue;
                }
                self.draining = None;
                continue;
            }
            if self.tick >= self.spec.ticks {
                // The late points due after the last tick, by due tick.
                match self.pending.pop_first() {
                    Some((_, list)) => {
                        self.draining = Some((list, 0));
                        continue;
                    }
                    None => break,
                }
            }
            let (kind, d, t) = (TableKind::ALL[self.table], self.device, self.tick);
            self.table += 1;
            if self.table == TableKind::ALL.len() {
                self.table = 0;
                self.device += 1;
                if self.device == self.spec.devices {
                    self.device = 0;
                    self.tick += 1;
                    if let Some(list) = self.pending.remove(&t) {
                        self.draining = Some((list, 0));
                    }
                }
            }
            match point_state(&self.spec, kind, d, t) {
                PointState::InOrder => {
                    self.counts.add(kind);
                    out.push(self.point(kind, d, t));
                }
                PointState::Missing => self.counts.missing += 1,
                PointState::Late(delay) => {
                    self.counts.late += 1;
                    self.pending.entry(t + delay).or_default().push((kind, d, t));
                }
            }
        }
        !out.is_empty()
    }
}

/// What a line protocol export wrote, as the peers' `.meta.json` has it.
#[derive(Debug, Clone, Serialize)]
pub struct LineProtocolMeta {
    /// Generator name and format version.
    pub generator: &'static str,
    /// The spec.
    pub spec: WorkloadSpec,
    /// Devices.
    pub devices: u64,
    /// Ticks.
    pub ticks: u64,
    /// Interval, ms.
    pub interval_ms: i64,
    /// First tick's timestamp.
    pub start_ms: i64,
    /// One interval after the last tick.
    pub end_ms: i64,
    /// Lines written.
    pub lines: u64,
    /// `readings` lines.
    pub lines_readings: u64,
    /// `diagnostics` lines.
    pub lines_diagnostics: u64,
    /// Points dropped.
    pub points_missing: u64,
    /// Points written late.
    pub points_late: u64,
    /// Field values written.
    pub field_values: u64,
    /// Bytes written.
    pub bytes: u64,
    /// SHA-256 of the bytes written, hex (the peers' scripts copy it into their results, to
    /// tell which file they loaded).
    pub sha256: String,
}

/// Writes the whole workload as line protocol (ms timestamps) to `out`; returns what it wrote.
///
/// `on_lines` is told the lines of each batch written (a progress bar's); once it answers
/// `false` (an interrupt), the writing stops with [`Error::Stopped`].
pub fn write_line_protocol(
    spec: &WorkloadSpec,
    out: &mut impl Write,
    on_lines: &mut dyn FnMut(u64) -> bool,
) -> Result<LineProtocolMeta> {
    let mut generator = Generator::new(spec.clone())?;
    let mut points = Vec::new();
    let mut buf = Vec::with_capacity(1 << 20);
    let mut bytes = 0u64;
    let mut digest = sha2::Sha256::default();
    // Prefixes of the devices in the batch, cached per device (the scan visits devices in order).
    let mut prefix_cache: Option<(u64, [Vec<u8>; 2])> = None;
    while generator.next_batch(4096, &mut points) {
        buf.clear();
        for p in &points {
            match &prefix_cache {
                Some((d, _)) if *d == p.device => {}
                _ => {
                    prefix_cache = Some((
                        p.device,
                        [
                            lp_prefix(spec, TableKind::Readings, p.device),
                            lp_prefix(spec, TableKind::Diagnostics, p.device),
                        ],
                    ))
                }
            }
            if let Some((_, prefixes)) = &prefix_cache {
                p.write_line(spec, &prefixes[p.kind.code() as usize], &mut buf);
            }
        }
        out.write_all(&buf).map_err(|e| Error::io("line protocol output", e))?;
        sha2::Digest::update(&mut digest, &buf);
        bytes += buf.len() as u64;
        if !on_lines(points.len() as u64) {
            return Err(Error::Stopped);
        }
    }
    out.flush().map_err(|e| Error::io("line protocol output", e))?;
    let c = generator.counts();
    Ok(LineProtocolMeta {
        generator: "hourglass-bench-workload/1",
        spec: spec.clone(),
        devices: spec.devices,
        ticks: spec.ticks,
        interval_ms: spec.interval_ms,
        start_ms: spec.start_ms,
        end_ms: spec.end_ms(),
        lines: c.points(),
        lines_readings: c.readings,
        lines_diagnostics: c.diagnostics,
        points_missing: c.missing,
        points_late: c.late,
        field_values: c.values(),
        bytes,
        sha256: sha2::Digest::finalize(digest).iter().map(|b| format!("{b:02x}")).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_points(spec: &WorkloadSpec, batch: usize) -> (Vec<Point>, Counts) {
        let mut g = Generator::new(spec.clone()).expect("valid spec");
        let (mut all, mut out) = (Vec::new(), Vec::new());
        while g.next_batch(batch, &mut out) {
            all.extend_from_slice(&out);
        }
        (all, g.counts())
    }

    /// A point's reading carries every field of its table with its value, in name order (so
    /// `Reading::new` keeps it as built), the same reading as fields given in table order.
    #[test]
    fn readings_are_built_in_field_name_order() {
        let spec = WorkloadSpec { devices: 3, ticks: 2, ..WorkloadSpec::default() };
        let (points, _) = all_points(&spec, 100);
        let names = FieldNames::default();
        for kind in TableKind::ALL {
            let p = points.iter().find(|p| p.kind == kind).expect("a point of each table");
            let r = p.reading(&spec, &names);
            let in_table_order: Vec<(model::FieldName, model::Value)> = kind
                .fields()
                .iter()
                .zip(p.values())
                .map(|(f, &v)| (model::FieldName::from(f.name), typed_value(f, v)))
                .collect();
            assert_eq!(r, model::Reading::new(spec.tick_ts(p.tick), in_table_order));
            let got: Vec<&str> = r.fields.iter().map(|(n, _)| &**n).collect();
            let mut want: Vec<&str> = kind.fields().iter().map(|f| f.name).collect();
            want.sort_unstable();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn decimals_are_written_as_they_parse_back() {
        let cases = [(-1234567, 5, "-12.34567"), (5, 2, "0.05"), (-5, 1, "-0.5"), (500, 0, "500"), (10, 1, "1.0")];
        for (v, d, text) in cases {
            let mut out = Vec::new();
            write_decimal(&mut out, v, d);
            assert_eq!(std::str::from_utf8(&out).expect("ascii"), text);
            let parsed: f64 = text.parse().expect("a number");
            assert_eq!(parsed, to_f64(&float("x", d), v));
        }
    }

    #[test]
    fn same_seed_same_points_any_batch_size() {
        let spec = WorkloadSpec { devices: 50, ticks: 40, max_delay_ticks: 5, ..WorkloadSpec::default() };
        let (a, ca) = all_points(&spec, 7);
        let (b, cb) = all_points(&spec, 1000);
        assert_eq!(a, b);
        assert_eq!(ca, cb);
        let (c, _) = all_points(&WorkloadSpec { seed: 43, ..spec.clone() }, 1000);
        assert_ne!(a, c);
    }

    #[test]
    fn every_point_once_missing_ones_never() {
        let spec = WorkloadSpec {
            devices: 30,
            ticks: 50,
            missing_share: 0.1,
            out_of_order_share: 0.2,
            max_delay_ticks: 8,
            ..WorkloadSpec::default()
        };
        let (points, counts) = all_points(&spec, 64);
        let mut seen = std::collections::BTreeSet::new();
        for p in &points {
            assert!(seen.insert((p.kind, p.device, p.tick)), "{p:?} twice");
            assert_eq!(p.values, values(&spec, p.kind, p.device, p.tick));
        }
        let mut expected = std::collections::BTreeSet::new();
        let (mut missing, mut late) = (0, 0);
        for t in 0..spec.ticks {
            for d in 0..spec.devices {
                for kind in TableKind::ALL {
                    match point_state(&spec, kind, d, t) {
                        PointState::Missing => missing += 1,
                        PointState::Late(_) => {
                            late += 1;
                            expected.insert((kind, d, t));
                        }
                        PointState::InOrder => {
                            expected.insert((kind, d, t));
                        }
                    }
                }
            }
        }
        assert_eq!(seen, expected);
        assert_eq!((counts.missing, counts.late), (missing, late));
        assert_eq!(counts.points(), points.len() as u64);
        // Late points come after a later tick's points; in-order ones never go back in time.
        // (A late point of the last tick comes at the very end, after no later tick.)
        let mut max_tick = 0;
        let mut out_of_order = 0;
        for p in &points {
            if p.tick < max_tick {
                out_of_order += 1;
                assert!(matches!(point_state(&spec, p.kind, p.device, p.tick), PointState::Late(_)), "{p:?}");
            }
            max_tick = max_tick.max(p.tick);
        }
        let late_before_last = expected
            .iter()
            .filter(|&&(k, d, t)| t + 1 < spec.ticks && matches!(point_state(&spec, k, d, t), PointState::Late(_)))
            .count();
        assert_eq!(out_of_order, late_before_last);
    }

    #[test]
    fn shares_are_exact_for_a_seed() {
        // Golden counts of seed 42: a change of the generator's randomness shows here.
        let spec = WorkloadSpec { devices: 1000, ticks: 100, ..WorkloadSpec::default() };
        let (_, c) = all_points(&spec, 10_000);
        assert_eq!(c.points() + c.missing, 200_000);
        assert_eq!((c.missing, c.late), (GOLDEN_MISSING, GOLDEN_LATE));
        // Within 5% of the configured 1% each.
        assert!((1900..=2100).contains(&c.missing), "{c:?}");
        assert!((1900..=2100).contains(&c.late), "{c:?}");
    }

    const GOLDEN_MISSING: u64 = 2002;
    const GOLDEN_LATE: u64 = 1992;

    #[test]
    fn expected_points_are_the_slots_less_the_missing_share() {
        // 200,000 slots less 1%: the seed's own count (200,000 - GOLDEN_MISSING) is 198,000 - 2.
        let spec = WorkloadSpec { devices: 1000, ticks: 100, ..WorkloadSpec::default() };
        assert_eq!(spec.expected_points(), 198_000);
        assert_eq!(all_points(&spec, 10_000).1.points(), 197_998);
        let none_missing = WorkloadSpec { missing_share: 0.0, ..spec.clone() };
        assert_eq!(none_missing.expected_points(), 200_000);
        assert_eq!(all_points(&none_missing, 10_000).1.points(), 200_000);
        let all_missing = WorkloadSpec { missing_share: 1.0, out_of_order_share: 0.0, ..spec.clone() };
        assert_eq!(all_missing.expected_points(), 0);
        // The 10M-truck hour of BENCHMARKS.md: 1.2 billion slots.
        let hour = WorkloadSpec { devices: 10_000_000, ticks: 60, ..spec };
        assert_eq!(hour.expected_points(), 1_188_000_000);
    }

    #[test]
    fn tags_follow_the_model() {
        let spec = WorkloadSpec::default();
        let t = tags(&spec, 17);
        assert_eq!(t.name, "truck_17");
        let (_, cap, fuel, nominal) = MODELS.iter().copied().find(|m| m.0 == t.model).expect("a model");
        assert_eq!((t.load_capacity, t.fuel_capacity, t.nominal_fuel_consumption), (cap, fuel, nominal));
        assert_eq!(tags(&spec, 17), t);
    }

    #[test]
    fn bad_specs_are_refused() {
        for (spec, why) in [
            (WorkloadSpec { devices: 0, ..WorkloadSpec::default() }, "devices must be at least 1"),
            (
                WorkloadSpec { missing_share: 0.7, out_of_order_share: 0.7, ..WorkloadSpec::default() },
                "missing + out-of-order shares exceed 1",
            ),
            (
                WorkloadSpec { missing_share: 1.0, out_of_order_share: 0.0, ..WorkloadSpec::default() },
                "the missing share must be below 1",
            ),
            (WorkloadSpec { interval_ms: 0, ..WorkloadSpec::default() }, "interval must be positive"),
            (WorkloadSpec { table_prefix: "a/b".into(), ..WorkloadSpec::default() }, "table prefix `a/b`"),
            (WorkloadSpec { ticks: 1 << 40, ..WorkloadSpec::default() }, "timestamps must stay within 1900–2200"),
            (
                WorkloadSpec { max_delay_ticks: u64::MAX, ..WorkloadSpec::default() },
                "max delay of 18446744073709551615 ticks: the workload's end plus",
            ),
        ] {
            let err = Generator::new(spec).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(why), "{err}");
        }
        // A delay of more ticks than the workload has is a point sent at its end.
        assert!(
            Generator::new(WorkloadSpec { ticks: 6, max_delay_ticks: 1_000_000, ..WorkloadSpec::default() }).is_ok()
        );
    }
}

#[cfg(test)]
mod line_protocol_tests {
    use ingest::lineproto::{parse_lines, FieldValue, Precision};

    use super::*;

    #[test]
    fn line_protocol_parses_back_exactly() {
        let spec = WorkloadSpec {
            devices: 40,
            ticks: 25,
            missing_share: 0.05,
            out_of_order_share: 0.05,
            max_delay_ticks: 4,
            ..WorkloadSpec::default()
        };
        let mut text = Vec::new();
        let mut told = 0;
        let meta = write_line_protocol(&spec, &mut text, &mut |n| {
            told += n;
            true
        })
        .expect("written");
        assert_eq!(told, meta.lines);
        let stopped = write_line_protocol(&spec, &mut Vec::new(), &mut |_| false).map(|_| ()).expect_err("stopped");
        assert_eq!(stopped.to_string(), "stopped by an interrupt");
        let (points, counts) = {
            let mut g = Generator::new(spec.clone()).expect("valid");
            let (mut all, mut out) = (Vec::new(), Vec::new());
            while g.next_batch(100, &mut out) {
                all.extend_from_slice(&out);
            }
            (all, g.counts())
        };
        assert_eq!((meta.lines, meta.field_values, meta.bytes), (counts.points(), counts.values(), text.len() as u64));
        let digest: String = <sha2::Sha256 as sha2::Digest>::digest(&text).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!((meta.sha256.len(), meta.sha256), (64, digest), "the digest of the whole file");
        let text = std::str::from_utf8(&text).expect("UTF-8");
        let lines: Vec<_> =
            parse_lines(text, Precision::Milliseconds, 0).collect::<Result<_, _>>().expect("every line parses");
        assert_eq!(lines.len(), points.len());
        for (line, p) in lines.iter().zip(&points) {
            assert_eq!(line.measurement, p.kind.name());
            let expected_tags: Vec<(String, String)> =
                tags(&spec, p.device).pairs().iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            let got_tags: Vec<(String, String)> =
                line.tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(got_tags, expected_tags);
            assert_eq!(line.timestamp_ms, spec.tick_ts(p.tick));
            let expected: Vec<(String, FieldValue<'_>)> = p
                .kind
                .fields()
                .iter()
                .zip(p.values())
                .map(|(f, &v)| {
                    let value = if f.integer { FieldValue::Int(v) } else { FieldValue::Float(to_f64(f, v)) };
                    (f.name.to_string(), value)
                })
                .collect();
            let got: Vec<(String, FieldValue<'_>)> =
                line.fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            assert_eq!(got, expected, "line {}", line.number);
        }
    }
}
