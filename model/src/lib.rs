//! Small shared types of Hourglass: readings, time arithmetic, ingest batches and their acks.
//!
//! This crate owns the vocabulary every stage speaks — [`Reading`] and its typed [`Value`]s, [`Hour`], [`TimeRange`],
//! [`PartitionSize`], [`IngestBatch`] and its [`Ack`] — and nothing else. It does no I/O and
//! knows nothing of RocksDB, MQTT or HTTP: key bytes live in `bucketer::keys`, payload formats
//! in `ingest::wire`.
//!
//! ```
//! use model::{Hour, PartitionSize, TimeRange};
//! let ts = -1; // one millisecond before 1970: floors into the hour before the epoch
//! assert_eq!(Hour::of(ts), Hour(-1));
//! assert_eq!(PartitionSize::Day.index_of(ts), -1);
//! let range = TimeRange::new(0, 7_200_000).expect("start < end");
//! assert_eq!(range.hours().count(), 2);
//! ```

use std::fmt;
use std::sync::Arc;

/// Milliseconds in one hour.
pub const HOUR_MS: i64 = 3_600_000;
/// Milliseconds in one day.
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// A field name, shared between the many readings that carry it (cloning is a refcount bump).
pub type FieldName = Arc<str>;

/// The type of a field: what a table's schema declares and what a [`Value`] holds.
///
/// The order of the variants is the order of their [`FieldType::code`]s, which persisted
/// formats (the catalog's schemas, the bucket codec) store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FieldType {
    /// A 64-bit float.
    F64,
    /// A 64-bit signed integer.
    I64,
    /// `true` or `false`.
    Bool,
    /// A UTF-8 string.
    Str,
}

impl FieldType {
    /// Every type, in code order.
    pub const ALL: [FieldType; 4] = [FieldType::F64, FieldType::I64, FieldType::Bool, FieldType::Str];

    /// Stable one-byte code, used where the type is persisted.
    pub fn code(self) -> u8 {
        match self {
            FieldType::F64 => 0,
            FieldType::I64 => 1,
            FieldType::Bool => 2,
            FieldType::Str => 3,
        }
    }

    /// Inverse of [`FieldType::code`].
    pub fn from_code(code: u8) -> Option<FieldType> {
        FieldType::ALL.get(usize::from(code)).copied()
    }

    /// The stable name of the type as the API and the config write it: `f64`, `i64`, `bool`,
    /// `string`.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldType::F64 => "f64",
            FieldType::I64 => "i64",
            FieldType::Bool => "bool",
            FieldType::Str => "string",
        }
    }

    /// Inverse of [`FieldType::as_str`].
    pub fn parse(name: &str) -> Option<FieldType> {
        FieldType::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The magnitude from which an `f64` no longer holds every integer (2^53 is what 2^53 + 1
/// reads as): JSON's integers from here on are kept exact as [`Value::UntypedInt`]s, and the
/// schema check takes whole floats for `i64` fields only below it. One bound for both, so
/// every JSON integer within the `i64` range is an exact float or an untyped integer.
pub const UNTYPED_INT_FROM: u64 = 1 << 53;

/// One field value of a reading. `F64` is the common case and costs no allocation; a string
/// is shared (cloning is a refcount bump), as a device tends to repeat the same one.
///
/// Equality compares floats by value (`NaN != NaN`), like `f64` itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A float.
    F64(f64),
    /// A signed integer.
    I64(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(Arc<str>),
    /// An integer sent where numbers carry no type (JSON), too large in magnitude for an `f64`
    /// to hold exactly (from ±2^53 on), kept exact until a table's schema gives it a type:
    /// never stored as such. The schema check makes it an `I64` for an `i64` field and the
    /// nearest `F64` for an `f64` field or a new one, as any other JSON number.
    UntypedInt(i64),
}

impl Value {
    /// The type of the value; an [`Value::UntypedInt`] counts as the `f64` it is unless a
    /// schema says otherwise (see [`Value::typed`]).
    #[inline]
    pub fn field_type(&self) -> FieldType {
        match self {
            Value::F64(_) | Value::UntypedInt(_) => FieldType::F64,
            Value::I64(_) => FieldType::I64,
            Value::Bool(_) => FieldType::Bool,
            Value::Str(_) => FieldType::Str,
        }
    }

    /// The type the value is stored as: its [`Value::field_type`], or `None` for an
    /// [`Value::UntypedInt`], which a schema must first give one.
    #[inline]
    pub fn typed(&self) -> Option<FieldType> {
        match self {
            Value::UntypedInt(_) => None,
            value => Some(value.field_type()),
        }
    }

    /// The value as a number for aggregation: a float as it is, an integer converted to the
    /// nearest `f64` (exact up to 2^53 in magnitude); `None` for booleans and strings.
    #[inline]
    pub fn as_number(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::I64(v) | Value::UntypedInt(v) => Some(*v as f64),
            Value::Bool(_) | Value::Str(_) => None,
        }
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::I64(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.into())
    }
}

impl From<Arc<str>> for Value {
    fn from(v: Arc<str>) -> Value {
        Value::Str(v)
    }
}

impl fmt::Display for Value {
    /// Floats and integers as Rust prints them, booleans as `true`/`false`, strings quoted
    /// (as JSON would write them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::F64(v) => write!(f, "{v}"),
            Value::I64(v) | Value::UntypedInt(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(v) => write!(f, "{v:?}"),
        }
    }
}

/// One reading of one device: a timestamp in epoch milliseconds and its field values.
///
/// A field that a reading does not carry is absent from `fields`, never zero. `fields` is kept
/// sorted by name with no name twice (see [`Reading::new`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// Event time, milliseconds since 1970-01-01T00:00:00Z (negative before).
    pub ts: i64,
    /// Field values, sorted by name, each name once.
    pub fields: Vec<(FieldName, Value)>,
}

impl Reading {
    /// Builds a reading, sorting fields by name; for a name given twice the last value wins.
    /// Values may be given as [`Value`]s or as anything that converts into one (`f64`, `i64`,
    /// `bool`, `&str`); a `Vec<(FieldName, Value)>` is taken over without a copy.
    pub fn new<V: Into<Value>>(ts: i64, fields: Vec<(FieldName, V)>) -> Reading {
        // Collecting a mapped `vec::IntoIter` into a `Vec` of the same layout reuses the
        // allocation, so `Value`s (the ingest path) pass through unchanged.
        let mut fields: Vec<(FieldName, Value)> = fields.into_iter().map(|(n, v)| (n, v.into())).collect();
        // Sources that send fields in name order without repeats (most do) skip the copy.
        if fields.windows(2).all(|w| w[0].0 < w[1].0) {
            return Reading { ts, fields };
        }
        // A stable sort keeps equal names in input order, so keeping the last of a run keeps
        // the value given last: `dedup_by` hands each element with the one kept before it, and
        // removes it after its value moved into the kept one. All in place, without a second
        // vector (JSON from devices often lists fields in the device's own order).
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        fields.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        Reading { ts, fields }
    }

    /// The value of field `name`, if the reading carries it.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.binary_search_by(|(n, _)| (**n).cmp(name)).ok().map(|i| &self.fields[i].1)
    }

    /// The value of field `name` when the reading carries it as a float.
    pub fn get_f64(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Some(Value::F64(v)) => Some(*v),
            _ => None,
        }
    }
}

/// An hour since the epoch: `Hour(0)` is 1970-01-01T00:00Z, `Hour(-1)` the hour before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hour(pub i64);

impl Hour {
    /// The hour holding timestamp `ts` (floored, also before 1970).
    pub fn of(ts: i64) -> Hour {
        Hour(ts.div_euclid(HOUR_MS))
    }

    /// First millisecond of this hour.
    pub fn start_ms(self) -> i64 {
        self.0 * HOUR_MS
    }

    /// First millisecond after this hour: the hour is `start_ms()..end_ms()`, and it is closed
    /// for a watermark `w` once `end_ms() <= w`.
    pub fn end_ms(self) -> i64 {
        self.start_ms() + HOUR_MS
    }
}

/// How much time one partition of a table covers. Partitions are what retention and archiving
/// drop or spill as one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PartitionSize {
    /// One partition per hour.
    Hour,
    /// One partition per UTC day (the default).
    #[default]
    Day,
    /// One partition per UTC calendar month.
    Month,
}

impl PartitionSize {
    /// Stable one-byte code, used where the size is persisted.
    pub fn code(self) -> u8 {
        match self {
            PartitionSize::Hour => 1,
            PartitionSize::Day => 2,
            PartitionSize::Month => 3,
        }
    }

    /// Inverse of [`PartitionSize::code`].
    pub fn from_code(code: u8) -> Option<PartitionSize> {
        match code {
            1 => Some(PartitionSize::Hour),
            2 => Some(PartitionSize::Day),
            3 => Some(PartitionSize::Month),
            _ => None,
        }
    }

    /// Index of the partition holding `ts`: hours, days or months since the epoch (floored).
    pub fn index_of(self, ts: i64) -> i64 {
        match self {
            PartitionSize::Hour => ts.div_euclid(HOUR_MS),
            PartitionSize::Day => ts.div_euclid(DAY_MS),
            PartitionSize::Month => {
                let (y, m, _) = civil_from_days(ts.div_euclid(DAY_MS));
                (y - 1970) * 12 + (m as i64 - 1)
            }
        }
    }

    /// First millisecond of partition `index`.
    pub fn start_ms(self, index: i64) -> i64 {
        match self {
            PartitionSize::Hour => index * HOUR_MS,
            PartitionSize::Day => index * DAY_MS,
            PartitionSize::Month => {
                let y = 1970 + index.div_euclid(12);
                let m = index.rem_euclid(12) as u32 + 1;
                days_from_civil(y, m, 1) * DAY_MS
            }
        }
    }
}

impl fmt::Display for PartitionSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionSize::Hour => "hour",
            PartitionSize::Day => "day",
            PartitionSize::Month => "month",
        })
    }
}

/// Units a duration may be written in, largest first, with their length in milliseconds.
const DURATION_UNITS: [(&str, u64); 6] =
    [("w", 7 * DAY_MS as u64), ("d", DAY_MS as u64), ("h", HOUR_MS as u64), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// Parses a duration written as a whole number and a unit — `ms`, `s`, `m`, `h`, `d` or `w`
/// (`250ms`, `90s`, `12h`, `30d`) — into milliseconds. `None` for anything else: no unit, a
/// fraction, a sign, spaces, zero, or more milliseconds than an `i64` holds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let (_, unit_ms) = DURATION_UNITS.iter().find(|(u, _)| *u == unit)?;
    let ms = n.checked_mul(*unit_ms)?;
    (1..=i64::MAX as u64).contains(&ms).then_some(ms)
}

/// Writes a duration in milliseconds in the largest unit that divides it exactly (`30d`,
/// `90m`, `1500ms`); the inverse of [`parse_duration_ms`] for every value it accepts.
pub fn format_duration_ms(ms: u64) -> String {
    match DURATION_UNITS.iter().find(|(_, unit_ms)| ms != 0 && ms.is_multiple_of(*unit_ms)) {
        Some((unit, unit_ms)) => format!("{}{unit}", ms / unit_ms),
        None => format!("{ms}ms"),
    }
}

/// `ms` as RFC 3339 in UTC to the second, e.g. `2024-01-02T00:00:00Z`.
pub fn utc_text(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// `ms` as RFC 3339 in UTC to the millisecond, e.g. `2024-01-02T00:00:00.250Z`.
pub fn utc_text_ms(ms: i64) -> String {
    let seconds = utc_text(ms);
    format!("{}.{:03}Z", seconds.trim_end_matches('Z'), ms.rem_euclid(1000))
}

/// (year, month 1..=12, day 1..=31) of a day number since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days-to-civil algorithm: shift to an era starting 0000-03-01.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Day number since 1970-01-01 of a (year, month 1..=12, day) date (proleptic Gregorian).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A half-open time range `[start, end)` in epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    /// First millisecond included.
    pub start: i64,
    /// First millisecond excluded.
    pub end: i64,
}

impl TimeRange {
    /// A range `[start, end)`; `None` when it would be empty (`start >= end`).
    pub fn new(start: i64, end: i64) -> Option<TimeRange> {
        (start < end).then_some(TimeRange { start, end })
    }

    /// Whether `ts` lies in the range.
    pub fn contains(&self, ts: i64) -> bool {
        self.start <= ts && ts < self.end
    }

    /// The hours the range touches, oldest first.
    pub fn hours(&self) -> impl Iterator<Item = Hour> {
        (Hour::of(self.start).0..=Hour::of(self.end - 1).0).map(Hour)
    }

    /// Length in milliseconds.
    pub fn len_ms(&self) -> i64 {
        self.end.saturating_sub(self.start)
    }
}

/// A reading addressed to a table and a device, as ingest hands it to the bucketer.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReading {
    /// Virtual table name, e.g. `fleet.readings`.
    pub table: Arc<str>,
    /// Device name as the sensor calls itself, e.g. `truck_4711`.
    pub device: Arc<str>,
    /// The reading itself.
    pub reading: Reading,
}

/// Input that could not be stored as readings, with the reason why. Kept, counted and listed,
/// never silently dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// When Hourglass received it, epoch milliseconds.
    pub received_ms: i64,
    /// Where it came from: an MQTT topic, `kafka:{topic}/{partition}@{offset}`, `http`; for a
    /// field a schema refused, its reading's message, or `schema of table …` when none is known.
    pub source: String,
    /// Why it was rejected; [`DeadLetterReason::as_str`] is the stable label.
    pub reason: DeadLetterReason,
    /// A human-readable detail (which field, which value).
    pub detail: String,
    /// The offending bytes, as received (a single reading for an array element).
    pub payload: Vec<u8>,
}

/// Why an input became a dead letter. The labels are stable: metrics and the API use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// The payload is not valid JSON.
    InvalidJson,
    /// The payload is JSON but not a reading or an array of readings.
    InvalidShape,
    /// A field value is of no type a field can hold (a JSON array or object). The label keeps
    /// its name from when fields held numbers only.
    NonNumericField,
    /// A field name is not allowed.
    InvalidFieldName,
    /// The reading carries no field values.
    NoFields,
    /// `ts` is missing.
    MissingTimestamp,
    /// `ts` is not a timestamp, or lies outside the accepted years.
    InvalidTimestamp,
    /// The payload is larger than the configured limit.
    PayloadTooLarge,
    /// The table name (from the topic or the measurement) is not allowed.
    InvalidTable,
    /// The device name is missing or not allowed.
    InvalidDevice,
    /// The topic does not follow the expected layout.
    InvalidTopic,
    /// A line of an InfluxDB line-protocol payload is malformed (syntax, a field value that is
    /// not of its type, or a payload that is not UTF-8).
    InvalidLineProtocol,
    /// A field value's type is not the type the table's schema gives the field (an `i64` field
    /// sent a string or a fractional number, ...). The reading's other fields are stored.
    WrongFieldType,
    /// A field the schema of a `strict` table does not have. The reading's other fields are
    /// stored.
    UnknownField,
    /// An integer field value outside the range of `i64` (a line-protocol unsigned value above
    /// 2^63 - 1). The reading's other fields are stored.
    IntegerOutOfRange,
}

impl DeadLetterReason {
    /// Every reason, for metrics that list all of them.
    pub const ALL: [DeadLetterReason; 15] = [
        DeadLetterReason::InvalidJson,
        DeadLetterReason::InvalidShape,
        DeadLetterReason::NonNumericField,
        DeadLetterReason::InvalidFieldName,
        DeadLetterReason::NoFields,
        DeadLetterReason::MissingTimestamp,
        DeadLetterReason::InvalidTimestamp,
        DeadLetterReason::PayloadTooLarge,
        DeadLetterReason::InvalidTable,
        DeadLetterReason::InvalidDevice,
        DeadLetterReason::InvalidTopic,
        DeadLetterReason::InvalidLineProtocol,
        DeadLetterReason::WrongFieldType,
        DeadLetterReason::UnknownField,
        DeadLetterReason::IntegerOutOfRange,
    ];

    /// The stable snake_case label of this reason.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::InvalidJson => "invalid_json",
            DeadLetterReason::InvalidShape => "invalid_shape",
            DeadLetterReason::NonNumericField => "non_numeric_field",
            DeadLetterReason::InvalidFieldName => "invalid_field_name",
            DeadLetterReason::NoFields => "no_fields",
            DeadLetterReason::MissingTimestamp => "missing_timestamp",
            DeadLetterReason::InvalidTimestamp => "invalid_timestamp",
            DeadLetterReason::PayloadTooLarge => "payload_too_large",
            DeadLetterReason::InvalidTable => "invalid_table",
            DeadLetterReason::InvalidDevice => "invalid_device",
            DeadLetterReason::InvalidTopic => "invalid_topic",
            DeadLetterReason::InvalidLineProtocol => "invalid_line_protocol",
            DeadLetterReason::WrongFieldType => "wrong_field_type",
            DeadLetterReason::UnknownField => "unknown_field",
            DeadLetterReason::IntegerOutOfRange => "integer_out_of_range",
        }
    }

    /// Inverse of [`DeadLetterReason::as_str`].
    pub fn parse(label: &str) -> Option<DeadLetterReason> {
        DeadLetterReason::ALL.into_iter().find(|r| r.as_str() == label)
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Called once the batch that holds an input is durable; releases the input upstream
/// (an MQTT PUBACK, a Kafka offset commit, an HTTP answer). Never called for a batch that failed
/// to commit.
pub struct Ack(Box<dyn FnOnce(&Committed) + Send>);

impl Ack {
    /// Wraps the action that acknowledges an input upstream.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Ack {
        Ack(Box::new(move |_| f()))
    }

    /// Wraps an action that is told what the store made of the batch: meaningful for a batch
    /// committed alone ([`IngestBatch::alone`]), as an HTTP write is, whose answer says which
    /// of its readings the store refused.
    pub fn told(f: impl FnOnce(&Committed) + Send + 'static) -> Ack {
        Ack(Box::new(f))
    }

    /// Acknowledges upstream, telling nothing of the commit.
    pub fn send(self) {
        self.send_committed(&Committed::default())
    }

    /// Acknowledges upstream, telling what the commit stored.
    pub fn send_committed(self, committed: &Committed) {
        (self.0)(committed)
    }
}

/// What the store made of a committed batch, for [`Ack::told`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Committed {
    /// Readings stored (those the store refused whole not counted).
    pub readings: usize,
    /// Dead letters the store added to the batch's own: readings or fields its table's schema
    /// refused.
    pub rejected: Vec<DeadLetter>,
}

impl fmt::Debug for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ack")
    }
}

/// The position reached in one partition of a Kafka topic: the offset of the next message to
/// read, i.e. one past the last message a batch covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOffset {
    /// Kafka topic.
    pub topic: Arc<str>,
    /// Partition of the topic.
    pub partition: i32,
    /// Offset of the next message to consume from the partition.
    pub next_offset: i64,
}

/// Wall-clock time in epoch milliseconds (stamps dead letters, receipt hours of counts).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// What one ingested message (or a group of them) turned into: readings to store, dead letters
/// to keep, source positions to record, and the acks to send once all are durable.
#[derive(Debug, Default)]
pub struct IngestBatch {
    /// Valid readings.
    pub readings: Vec<DeviceReading>,
    /// Where [`IngestBatch::readings`] came from, a run at a time: (index of a run's first
    /// reading, the source of the message it came from, named as its decoder's dead letters
    /// name it), in order. The store names it in the dead letter of a field its schema refuses;
    /// readings before the first run, or in a run of an empty source, have no source known.
    pub sources: Vec<(usize, String)>,
    /// Rejected inputs.
    pub dead_letters: Vec<DeadLetter>,
    /// Positions the readings and dead letters above bring their partitions to; stored in the
    /// same WriteBatch as them (exactly-once effect for Kafka). In batch order: when a partition
    /// appears twice the later entry is the further one.
    pub offsets: Vec<SourceOffset>,
    /// Sent after the WriteBatch holding all of the above commits.
    pub acks: Vec<Ack>,
    /// Broker messages the batch holds readings of, per table: one for each message and each
    /// table it has readings in ([`IngestBatch::count_as_message`]); the store's approximate
    /// message counter adds them up.
    pub messages: Vec<(Arc<str>, u64)>,
    /// Tags the source reported for devices (line protocol's tags besides the one naming the
    /// device), in arrival order; the store merges them into the device records.
    pub device_tags: Vec<DeviceTags>,
    /// Readings the store prepared on the producer's thread ([`PrepareBatch`]), in arrival
    /// order; they are stored before [`IngestBatch::readings`] (see [`IngestBatch::append`]).
    pub prepared: Vec<Prepared>,
    /// Committed in a WriteBatch of its own, never gathered with other batches, so that its
    /// acks are told ([`Ack::told`]) what the store made of this batch alone.
    pub alone: bool,
}

/// Readings a store turned into its own form on the producer's thread ([`PrepareBatch`]), so
/// that its single writer only commits them: opaque to everyone else.
pub struct Prepared {
    /// Readings it holds.
    pub readings: usize,
    /// The store's form of them.
    pub inner: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("readings", &self.readings).finish_non_exhaustive()
    }
}

/// The devices whose stored tags a store changed, in order, as a source's memory of reported
/// tags reads them: a memory that noted other tags for one of them must report the device's
/// tags again (whichever source changed them). A source holds one as a trait object.
pub trait TagChanges: Send + Sync {
    /// The sequence number the next change will have.
    fn next_change(&self) -> u64;

    /// Appends to `out` the devices changed from sequence number `since` on and returns the
    /// next one; `Err(next)` when changes from `since` on are no longer all kept (the caller
    /// must forget every note).
    fn changes_since(&self, since: u64, out: &mut Vec<Arc<str>>) -> Result<u64, u64>;
}

/// Work a store does on a batch on the thread that decoded it, before its writer gets it: a
/// source holds one as a trait object, without knowing the store.
pub trait PrepareBatch: Send + Sync {
    /// A preparation of a batch's readings one at a time, as a source decodes them, so that
    /// they need not be built as [`Reading`]s first; `None` when the store prepares nothing
    /// now. `memo` is the source's: what the store learned from its batches before.
    fn rows<'a>(&'a self, memo: &'a mut PrepareMemo) -> Option<Box<dyn PrepareRows + 'a>>;
}

/// A batch being prepared reading by reading ([`PrepareBatch::rows`]). The readings it takes
/// are stored before any the source keeps as [`Reading`]s, so once it refuses one the source
/// gives it no more (the refused reading and every later one stay readings): arrival order is
/// kept.
pub trait PrepareRows {
    /// Takes the reading at `ts` of `device` in `table`, of fields `names` (ascending, distinct)
    /// with `values` (in the same order); `false`, taking nothing, when the store cannot
    /// prepare it (a table or device not stored yet, a field its table's schema does not admit
    /// as it is, a time outside the key range).
    fn push(&mut self, table: &Arc<str>, device: &Arc<str>, ts: i64, names: &[FieldName], values: &[Value]) -> bool;

    /// The readings taken, prepared; `None` when it took none.
    fn finish(self: Box<Self>) -> Option<Prepared>;
}

/// What a store's [`PrepareBatch`] keeps between batches of one source (say, the ids of the
/// devices its decoder names by shared `Arc`s): the source holds it, opaque, beside its own
/// memory of the devices.
#[derive(Default)]
pub struct PrepareMemo(pub Option<Box<dyn std::any::Any + Send>>);

impl std::fmt::Debug for PrepareMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "PrepareMemo(kept)" } else { "PrepareMemo(empty)" })
    }
}

/// Adds one message of `table` to `messages`, unless it counts one of it already.
fn count_table_once(messages: &mut Vec<(Arc<str>, u64)>, table: &Arc<str>) {
    if !messages.iter().any(|(t, _)| Arc::ptr_eq(t, table) || t == table) {
        messages.push((Arc::clone(table), 1));
    }
}

/// Tags a source reported for a device: (device, [(key, value)]).
pub type DeviceTags = (Arc<str>, Vec<(String, String)>);

impl IngestBatch {
    /// Moves everything of `other` into `self`. Into an empty batch the readings move without
    /// a copy. Prepared readings are stored before the others: append a batch holding prepared
    /// readings only to one holding no readings unprepared ([`IngestBatch::appends_in_order`]),
    /// or a device's readings may be stored out of arrival order.
    pub fn append(&mut self, other: IngestBatch) {
        debug_assert!(self.appends_in_order(&other), "prepared readings appended after unprepared ones");
        self.prepared.extend(other.prepared);
        let before = self.readings.len();
        if !other.readings.is_empty() && other.sources.first().is_none_or(|(start, _)| *start > 0) {
            // Its first readings come from nowhere known: not from the run before them.
            if self.sources.last().is_some_and(|(_, source)| !source.is_empty()) {
                self.sources.push((before, String::new()));
            }
        }
        self.sources.extend(other.sources.into_iter().map(|(start, source)| (before + start, source)));
        if self.readings.is_empty() && self.readings.capacity() < other.readings.capacity() {
            self.readings = other.readings;
        } else {
            self.readings.extend(other.readings);
        }
        self.dead_letters.extend(other.dead_letters);
        self.offsets.extend(other.offsets);
        self.acks.extend(other.acks);
        self.messages.extend(other.messages);
        self.device_tags.extend(other.device_tags);
    }

    /// Notes `source` as where the batch's readings came from (one message, or a body).
    pub fn set_source(&mut self, source: String) {
        self.sources.clear();
        if !self.readings.is_empty() {
            self.sources.push((0, source));
        }
    }

    /// The source of reading `index` of [`IngestBatch::readings`], if known.
    pub fn source_of(sources: &[(usize, String)], index: usize) -> Option<&str> {
        let run = sources.partition_point(|(start, _)| *start <= index);
        run.checked_sub(1).map(|run| sources[run].1.as_str()).filter(|source| !source.is_empty())
    }

    /// Notes the batch as the decoding of one broker message: one message for each table its
    /// readings are in.
    pub fn count_as_message(&mut self) {
        for r in &self.readings {
            count_table_once(&mut self.messages, &r.table);
        }
    }

    /// Counts the message as one of `table`'s, unless it is already ([`IngestBatch::count_as_message`]
    /// for a reading kept in another form, say [`IngestBatch::prepared`]).
    pub fn count_message_of(&mut self, table: &Arc<str>) {
        count_table_once(&mut self.messages, table);
    }

    /// Whether there is nothing to store (acks may still be pending).
    pub fn is_empty(&self) -> bool {
        self.readings.is_empty() && self.prepared.is_empty() && self.dead_letters.is_empty() && self.offsets.is_empty()
    }

    /// Readings to store, prepared or not.
    pub fn reading_count(&self) -> usize {
        self.readings.len() + self.prepared.iter().map(|p| p.readings).sum::<usize>()
    }

    /// Whether `other` appended to this batch keeps arrival order: prepared readings are
    /// stored first, so none may follow unprepared ones.
    pub fn appends_in_order(&self, other: &IngestBatch) -> bool {
        self.readings.is_empty() || other.prepared.is_empty()
    }

    /// Whether `other` may be committed in one WriteBatch with this one: neither is to be
    /// committed [`alone`](IngestBatch::alone), and the order holds
    /// ([`IngestBatch::appends_in_order`]).
    pub fn gathers(&self, other: &IngestBatch) -> bool {
        !self.alone && !other.alone && self.appends_in_order(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Appended batches keep each reading's source: runs move by the readings before them.
    #[test]
    fn appended_batches_keep_their_readings_sources() {
        let batch = |n: usize, source: Option<&str>| {
            let mut b = IngestBatch {
                readings: (0..n)
                    .map(|i| DeviceReading {
                        table: "t".into(),
                        device: "d".into(),
                        reading: Reading::new(i as i64, vec![("v".into(), 1.0)]),
                    })
                    .collect(),
                ..IngestBatch::default()
            };
            if let Some(source) = source {
                b.set_source(source.to_string());
            }
            b
        };
        let mut all = batch(0, Some("empty"));
        assert!(all.sources.is_empty(), "a batch without readings names no source");
        all.append(batch(2, Some("a")));
        all.append(batch(1, None));
        all.append(batch(0, Some("empty")));
        all.append(batch(3, Some("b")));
        all.append(batch(1, None));
        all.append(batch(1, None));
        assert_eq!(all.sources, [(0, "a".into()), (2, String::new()), (3, "b".into()), (6, String::new())]);
        let of: Vec<Option<&str>> = (0..8).map(|i| IngestBatch::source_of(&all.sources, i)).collect();
        assert_eq!(of, [Some("a"), Some("a"), None, Some("b"), Some("b"), Some("b"), None, None]);
        // Into a batch whose readings have no source: nothing to end.
        let mut none = batch(2, None);
        none.append(batch(1, None));
        none.append(batch(1, Some("c")));
        assert_eq!(none.sources, [(3, "c".to_string())]);
        let of: Vec<Option<&str>> = (0..4).map(|i| IngestBatch::source_of(&none.sources, i)).collect();
        assert_eq!(of, [None, None, None, Some("c")]);
    }

    /// A batch to be committed alone gathers nothing and is gathered by nothing; others
    /// gather as their order allows.
    #[test]
    fn batches_committed_alone_are_never_gathered() {
        let plain = || IngestBatch::default();
        let alone = || IngestBatch { alone: true, ..IngestBatch::default() };
        assert!(plain().gathers(&plain()));
        assert!(!alone().gathers(&plain()));
        assert!(!plain().gathers(&alone()));
        assert!(!alone().gathers(&alone()));
        let with_readings = IngestBatch {
            readings: vec![DeviceReading {
                table: "t".into(),
                device: "d".into(),
                reading: Reading::new(1, vec![("v".into(), 1.0)]),
            }],
            ..IngestBatch::default()
        };
        let prepared =
            IngestBatch { prepared: vec![Prepared { readings: 1, inner: Box::new(()) }], ..IngestBatch::default() };
        assert!(!with_readings.gathers(&prepared), "prepared readings after unprepared ones");
        // The outcome reaches an action that asks for it.
        let (tx, rx) = std::sync::mpsc::channel();
        Ack::told(move |c: &Committed| {
            let _ = tx.send(c.readings);
        })
        .send_committed(&Committed { readings: 7, rejected: vec![] });
        assert_eq!(rx.try_recv(), Ok(7));
    }

    #[test]
    fn hours_floor_before_epoch() {
        assert_eq!(Hour::of(0), Hour(0));
        assert_eq!(Hour::of(HOUR_MS - 1), Hour(0));
        assert_eq!(Hour::of(-1), Hour(-1));
        assert_eq!(Hour::of(-HOUR_MS), Hour(-1));
        assert_eq!(Hour::of(-HOUR_MS - 1), Hour(-2));
        assert_eq!((Hour(-1).start_ms(), Hour(-1).end_ms()), (-HOUR_MS, 0));
        assert_eq!(Hour::of(HOUR_MS - 1).end_ms(), HOUR_MS);
    }

    #[test]
    fn utc_text_formats_spans() {
        assert_eq!(utc_text(1_704_153_600_000), "2024-01-02T00:00:00Z");
        assert_eq!(utc_text(1_704_153_600_000 + 3_723_999), "2024-01-02T01:02:03Z");
        assert_eq!(utc_text(-1), "1969-12-31T23:59:59Z");
        assert_eq!(utc_text_ms(1_704_153_600_000 + 3_723_007), "2024-01-02T01:02:03.007Z");
        assert_eq!(utc_text_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn month_partitions_follow_the_calendar() {
        // 2024-02-29T12:00Z is in February 2024: month index (2024-1970)*12 + 1.
        let ts = days_from_civil(2024, 2, 29) * DAY_MS + 12 * HOUR_MS;
        assert_eq!(PartitionSize::Month.index_of(ts), 54 * 12 + 1);
        assert_eq!(PartitionSize::Month.start_ms(54 * 12 + 1), days_from_civil(2024, 2, 1) * DAY_MS);
        assert_eq!(PartitionSize::Month.index_of(-1), -1);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn reading_new_sorts_and_keeps_last_duplicate() {
        let r = Reading::new(5, vec![("b".into(), 1.0), ("a".into(), 2.0), ("b".into(), 3.0)]);
        assert_eq!(r.fields, vec![("a".into(), Value::F64(2.0)), ("b".into(), Value::F64(3.0))]);
        assert_eq!(r.get("b"), Some(&Value::F64(3.0)));
        assert_eq!(r.get_f64("b"), Some(3.0));
        assert_eq!(r.get("c"), None);
        let typed = Reading::new(
            1,
            vec![("s".into(), Value::from("on")), ("i".into(), Value::I64(-3)), ("b".into(), Value::Bool(true))],
        );
        assert_eq!(typed.get("i"), Some(&Value::I64(-3)));
        assert_eq!(typed.get_f64("i"), None);
        assert_eq!(typed.fields.iter().map(|(n, _)| &**n).collect::<Vec<_>>(), ["b", "i", "s"]);
    }

    #[test]
    fn field_types_and_values_name_themselves() {
        for t in FieldType::ALL {
            assert_eq!(FieldType::from_code(t.code()), Some(t));
            assert_eq!(FieldType::parse(t.as_str()), Some(t));
        }
        assert_eq!(FieldType::from_code(4), None);
        assert_eq!(FieldType::parse("int"), None);
        assert_eq!(Value::I64(7).as_number(), Some(7.0));
        assert_eq!(Value::Bool(true).as_number(), None);
        assert_eq!(Value::from("x").field_type(), FieldType::Str);
        assert_eq!(Value::from("a\"b").to_string(), r#""a\"b""#);
        assert_eq!(Value::I64(-5).to_string(), "-5");
    }

    #[test]
    fn durations_parse_in_every_unit_and_reject_the_rest() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("12h"), Some(12 * HOUR_MS as u64));
        assert_eq!(parse_duration_ms("30d"), Some(30 * DAY_MS as u64));
        assert_eq!(parse_duration_ms("2w"), Some(14 * DAY_MS as u64));
        for bad in ["", "12", "h", "0h", "0ms", "-1h", "+1h", "1.5h", " 1h", "1h ", "1 h", "1H", "1y", "1hh", "1dd"] {
            assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
        }
        // i64::MAX ms is the longest duration; one more overflows the store's arithmetic.
        assert_eq!(parse_duration_ms(&format!("{}ms", i64::MAX)), Some(i64::MAX as u64));
        assert_eq!(parse_duration_ms(&format!("{}ms", i64::MAX as u64 + 1)), None);
        assert_eq!(parse_duration_ms("99999999999999999999w"), None);
    }

    #[test]
    fn durations_format_in_the_largest_exact_unit() {
        assert_eq!(format_duration_ms(30 * DAY_MS as u64), "30d");
        assert_eq!(format_duration_ms(14 * DAY_MS as u64), "2w");
        assert_eq!(format_duration_ms(90 * 60_000), "90m");
        assert_eq!(format_duration_ms(1_500), "1500ms");
        assert_eq!(format_duration_ms(0), "0ms");
    }

    proptest! {
        #[test]
        fn civil_round_trip(day in -800_000i64..800_000) {
            let (y, m, d) = civil_from_days(day);
            prop_assert_eq!(days_from_civil(y, m, d), day);
        }

        #[test]
        fn format_then_parse_is_identity(ms in 1u64..=i64::MAX as u64) {
            prop_assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Some(ms));
        }

        /// Whatever the order and repeats of the names given, the fields come out sorted, each
        /// name once with the value given last (against a map filled in input order).
        #[test]
        fn reading_new_is_sorted_and_last_wins(given in proptest::collection::vec(("[a-e]{1,2}", -3i64..3), 0..12)) {
            let fields: Vec<(FieldName, Value)> =
                given.iter().map(|(n, v)| (FieldName::from(n.as_str()), Value::I64(*v))).collect();
            let want: std::collections::BTreeMap<&str, i64> = given.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let got = Reading::new(0, fields).fields;
            let got: Vec<(&str, Value)> = got.iter().map(|(n, v)| (&**n, v.clone())).collect();
            let want: Vec<(&str, Value)> = want.into_iter().map(|(n, v)| (n, Value::I64(v))).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn partition_start_is_at_or_before_ts(ts in -5_000_000_000_000i64..5_000_000_000_000) {
            for size in [PartitionSize::Hour, PartitionSize::Day, PartitionSize::Month] {
                let p = size.index_of(ts);
                prop_assert!(size.start_ms(p) <= ts);
                prop_assert!(ts < size.start_ms(p + 1));
            }
        }
    }
}
