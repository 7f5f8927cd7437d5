//! The device payload format of the MQTT path: topic → table and device, JSON → readings.
//!
//! This module owns the wire format devices publish and every rule a message must pass before
//! its readings reach the bucketer. It does no I/O and never fails: [`decode_mqtt`] turns one
//! message into an [`IngestBatch`] whose readings are valid and whose [`DeadLetter`]s say
//! precisely what was wrong with the rest. It must not know about brokers or storage.
//!
//! # Topics
//!
//! | topic                         | payload                                                  |
//! |-------------------------------|----------------------------------------------------------|
//! | `{prefix}/{table}/{device}`   | one reading, or an array of readings of that device      |
//! | `{prefix}/{table}`            | one reading or an array; every reading names `"device"`  |
//! | `{prefix}/lp`                 | InfluxDB line protocol, see [`crate::lpwire`]             |
//!
//! The prefix is [`WireConfig::topic_prefix`] (default `hourglass`). Names follow
//! [`valid_table_name`] and [`valid_device_name`].
//!
//! # Readings
//!
//! A reading is a JSON object: `{"ts": 1704067200000, "speed": 3.5, "temp": -4}`.
//!
//! * `ts` is epoch milliseconds as a JSON number (an integral value such as `1.7e12` is fine,
//!   `1.5` is not) or an RFC 3339 string (`"2024-01-01T01:00:00+01:00"`; digits below the
//!   millisecond are floored). It must lie in `[MIN_TS, MAX_TS)`: 1900 up to, not including, 2200.
//! * `device` is the device name; required when the topic names none, and otherwise equal to it.
//!   `"ts": null` counts as missing; a `"device"` that is not a string is invalid.
//! * Every other member is a field: a name per [`valid_field_name`] and a JSON number (an `f64`
//!   value), `true` or `false` (a `bool`) or a string (a string value). `null` means the field
//!   is absent; an array or an object is a [`DeadLetterReason::NonNumericField`]. A reading
//!   needs at least one field. Numbers are `f64`s here, but for an integer (no fraction, no
//!   exponent) from ±2^53 on, where `f64`s no longer hold every integer: that one is kept
//!   exact, within the `i64` range, as an untyped integer (`model::Value::UntypedInt`). The
//!   store takes a whole number below ±2^53, and an untyped integer exactly, for a field its
//!   table's schema declares `i64`, and an untyped integer as the nearest `f64` otherwise (see
//!   `bucketer::schema`).
//!
//! # What becomes a dead letter
//!
//! Problems of the whole message (size, topic, table, topic device, UTF-8 or JSON syntax) turn
//! the whole message into one dead letter and yield no readings. Problems of one reading in an
//! array turn only that element into a dead letter, its payload being the element's bytes as
//! received; the other elements are still decoded. A reading's members are checked in document
//! order and the first problem decides the reason; a missing `ts`, a missing `device` and the
//! lack of fields are found only at the end of the object, in that order. A member given twice
//! is checked each time and the last value wins (a last `null`: the field is absent).
//!
//! # JSON
//!
//! The JSON is read by `serde_json` with its `float_roundtrip` feature, so field values are the
//! `f64` nearest to the decimal text (without it, some values came back changed), and `raw_value`,
//! which yields each array element's exact bytes. What `serde_json` rejects is invalid JSON, with
//! its message and position in the detail: this includes a number beyond the `f64` range
//! (`1e400`), a lone surrogate in a `\u` escape, and nesting of 128 levels or more. `ts` numbers
//! are judged on their text, so `1700000000000.0000001` is not a whole number of milliseconds.
//!
//! Payloads in the plain form nearly every device sends (no escapes, no nested values, nothing
//! rejected) are first read by a scanner of our own (the private `plain` module), which yields
//! exactly the readings `serde_json`'s reading would, in less time; anything else, or anything it
//! is unsure of, is read by `serde_json` as described above.
//!
//! ```
//! use ingest::wire::{decode_mqtt, WireConfig};
//! use model::DeadLetterReason;
//!
//! let payload = br#"[{"device": "truck_1", "ts": "2024-01-01T00:00:00Z", "speed": 3.5},
//!                    {"device": "truck_2", "ts": 1704067200000, "speed": [3]}]"#;
//! let batch = decode_mqtt(&WireConfig::default(), "hourglass/fleet", payload, 0);
//! assert_eq!(batch.readings.len(), 1);
//! assert_eq!(&*batch.readings[0].device, "truck_1");
//! assert_eq!(batch.readings[0].reading.ts, 1_704_067_200_000);
//! assert_eq!(batch.dead_letters[0].reason, DeadLetterReason::NonNumericField);
//! assert_eq!(
//!     batch.dead_letters[0].detail,
//!     r#"array element 1: field "speed": expected a number, a boolean or a string, got array"#
//! );
//! ```

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use chrono::DateTime;
use model::{DeadLetter, DeadLetterReason, DeviceReading, FieldName, IngestBatch, Reading};
use serde::de::value::SeqAccessDeserializer;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

mod plain;

/// First accepted event time: 1900-01-01T00:00:00Z in epoch milliseconds.
pub const MIN_TS: i64 = -2_208_988_800_000;
/// First event time no longer accepted: 2200-01-01T00:00:00Z in epoch milliseconds. Readings
/// must have `ts < MAX_TS`; [`parse_timestamp_param`] accepts `MAX_TS` itself as a range end.
pub const MAX_TS: i64 = 7_258_118_400_000;

/// Default [`WireConfig::topic_prefix`].
pub const DEFAULT_TOPIC_PREFIX: &str = "hourglass";
/// Default [`WireConfig::max_payload_bytes`]: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// How much of an oversized payload a [`DeadLetterReason::PayloadTooLarge`] letter keeps.
pub const KEPT_OVERSIZED_BYTES: usize = 64 << 10;

/// Longest excerpt of a name or value quoted in a dead letter's detail, in characters.
const PREVIEW_CHARS: usize = 64;

/// How MQTT messages map to readings.
#[derive(Debug, Clone)]
pub struct WireConfig {
    /// Topic levels before `{table}[/{device}]`, without the trailing `/`; default `hourglass`.
    /// Matched literally, so it may span several levels (`site1/hourglass`).
    pub topic_prefix: String,
    /// Largest payload decoded, in bytes; larger ones become one
    /// [`DeadLetterReason::PayloadTooLarge`] letter. Default 1 MiB (1 048 576).
    pub max_payload_bytes: usize,
    /// How line-protocol payloads (topic `{topic_prefix}/lp`) map to readings.
    pub lp: crate::lpwire::LpConfig,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            topic_prefix: DEFAULT_TOPIC_PREFIX.to_string(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            lp: crate::lpwire::LpConfig::default(),
        }
    }
}

/// Whether `name` may name a table: 1 to 64 ASCII letters, digits, `_`, `-` or `.`, starting
/// with a letter or digit (e.g. `fleet.readings`).
pub fn valid_table_name(name: &str) -> bool {
    valid_name(name, 64, |b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether `name` may name a device: 1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`,
/// starting with a letter or digit (e.g. `truck_4711`, `gw-3:sensor.2`).
pub fn valid_device_name(name: &str) -> bool {
    valid_name(name, 128, |b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// Whether `name` may name a field: 1 to 64 ASCII letters, digits or `_`, not starting with a
/// digit, and none of [`RESERVED_FIELD_NAMES`].
pub fn valid_field_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=64).contains(&bytes.len())
        && !bytes[0].is_ascii_digit()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && !RESERVED_FIELD_NAMES.contains(&name)
}

/// Names no field may have: the query API answers them beside the fields, in one JSON object —
/// a reading's `ts`, a latest value's `device`, a roll-up row's `period`, `devices` and
/// `periods` (rows grouped by `group_level`; reserved since 2026-12-06).
pub const RESERVED_FIELD_NAMES: [&str; 5] = ["ts", "device", "period", "devices", "periods"];

fn valid_name(name: &str, max_len: usize, allowed: impl Fn(u8) -> bool) -> bool {
    let bytes = name.as_bytes();
    (1..=max_len).contains(&bytes.len()) && bytes[0].is_ascii_alphanumeric() && bytes.iter().all(|b| allowed(*b))
}

/// Parses a timestamp given as epoch-millisecond digits (`1700000000000`, `-5`), RFC 3339
/// (`2024-01-01T00:00:00Z`, floored to the millisecond), or relative to `now_ms`: `now`,
/// `now-15m`, `now+1h` (a duration as [`model::parse_duration_ms`] reads it: a whole number of
/// `ms`, `s`, `m`, `h`, `d` or `w`). Used by the HTTP API for `from` and `to`, so the accepted
/// window is closed: `MIN_TS..=MAX_TS`, letting `to` end at `MAX_TS`.
///
/// The error is a human message naming the input.
pub fn parse_timestamp_param(s: &str, now_ms: i64) -> Result<i64, String> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let ms = if let Some(offset) = s.strip_prefix("now") {
        let duration = |d: &str| {
            let unit = d.trim_start_matches(|c: char| c.is_ascii_digit());
            let form = unit.len() < d.len() && model::parse_duration_ms(&format!("1{unit}")).is_some();
            // `now-0m` is now (a duration of none, which `parse_duration_ms` refuses).
            if form && d.trim_start_matches('0') == unit {
                return Some(0);
            }
            // One too long for milliseconds is past the accepted years, as that check says.
            let ms = model::parse_duration_ms(d).and_then(|ms| i64::try_from(ms).ok());
            ms.or(form.then_some(i64::MAX))
        };
        let at = if offset.is_empty() {
            Some(now_ms)
        } else if let Some(d) = offset.strip_prefix('-') {
            duration(d).map(|ms| now_ms.saturating_sub(ms))
        } else {
            offset.strip_prefix('+').and_then(duration).map(|ms| now_ms.saturating_add(ms))
        };
        at.ok_or_else(|| {
            // `now+1h` unencoded in a query string arrives as `now 1h`.
            let plus = if offset.starts_with(' ') { PLUS_AS_SPACE } else { "" };
            format!(
                "{} is not `now` nor `now` less or plus a duration such as now-15m (a whole number of ms, s, m, h, d \
                 or w){plus}",
                preview(s)
            )
        })?
    } else if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<i64>().map_err(|_| format!("{} is out of range of epoch milliseconds", preview(s)))?
    } else {
        DateTime::parse_from_rfc3339(s)
            .map_err(|e| {
                // The parser's reason helps with what looks like a date ("input is out of range"),
                // not with anything else ("premature end of input" for `abc`).
                let looks_like_a_date =
                    s.len() > 10 && s.as_bytes()[..4].iter().all(u8::is_ascii_digit) && s.as_bytes()[4] == b'-';
                let reason = if looks_like_a_date { format!(" ({e}{})", no_offset(s)) } else { String::new() };
                // `…T01:00:00+02:00` unencoded in a query string arrives as `…T01:00:00 02:00`.
                let plus = s
                    .rfind(' ')
                    .filter(|&i| DateTime::parse_from_rfc3339(&format!("{}+{}", &s[..i], &s[i + 1..])).is_ok())
                    .map_or("", |_| PLUS_AS_SPACE);
                format!(
                    "{} is neither epoch milliseconds, an RFC 3339 timestamp such as 2024-01-01T00:00:00Z, nor \
                     relative to now such as now-15m{reason}{plus}",
                    preview(s)
                )
            })?
            .timestamp_millis()
    };
    if (MIN_TS..=MAX_TS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("{} is {}", preview(s), OUTSIDE_WINDOW))
    }
}

pub(crate) const OUTSIDE_WINDOW: &str = "outside the accepted years 1900 to 2199";

/// The hint for a time whose `+` a query string made a space.
const PLUS_AS_SPACE: &str = "; a `+` in a query string reads as a space: send it as %2B";

/// What to add to chrono's reason ("premature end of input") for a date and time that lacks
/// only its UTC offset: "" for any other text.
fn no_offset(text: &str) -> &'static str {
    match DateTime::parse_from_rfc3339(&format!("{text}Z")) {
        Ok(_) => ": it has no UTC offset; end it with Z, or one such as +02:00",
        Err(_) => "",
    }
}

/// Decodes one MQTT message published on `topic`. `received_ms` stamps its dead letters.
///
/// Never panics and never fails: whatever cannot be stored becomes a [`DeadLetter`] whose
/// `source` is the topic. The returned batch carries no acks.
pub fn decode_mqtt(cfg: &WireConfig, topic: &str, payload: &[u8], received_ms: i64) -> IngestBatch {
    let mut out = Out { source: topic, received_ms, batch: IngestBatch::default() };
    if payload.is_empty() {
        // A zero-byte message clears a topic's retained message, and brokers forward it to the
        // topic's subscribers: it carries no reading, and nothing is wrong with it.
        return out.batch;
    }
    if reject_oversized(cfg, payload, &mut out) {
        return out.batch;
    }
    if topic.strip_prefix(cfg.topic_prefix.as_str()).and_then(|rest| rest.strip_prefix('/')) == Some(LP_TOPIC_LEVEL) {
        return crate::lpwire::decode_lines(&cfg.lp, topic, None, payload, received_ms);
    }
    let (table, device) = match route(&cfg.topic_prefix, topic) {
        Ok(route) => route,
        Err((reason, detail)) => {
            out.reject(reason, detail, payload);
            return out.batch;
        }
    };
    decode_json_into(table, Named::topic(device), payload, out)
}

/// The topic level of MQTT line-protocol messages: `{prefix}/lp`. Each line names its table
/// (the measurement), so the topic names none. JSON for a table called `lp` must name its
/// device in the topic (`{prefix}/lp/{device}`): the gateway form `{prefix}/lp` is taken.
pub const LP_TOPIC_LEVEL: &str = "lp";

/// Decodes one JSON payload (one reading or an array, as on MQTT) for `table`, its readings
/// naming `device` unless they name their own (a Kafka message's key). `source` names the
/// origin in dead letters. Checks the size limit and the table and device names.
pub fn decode_json(
    cfg: &WireConfig,
    source: &str,
    table: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    received_ms: i64,
) -> IngestBatch {
    let mut out = Out { source, received_ms, batch: IngestBatch::default() };
    if reject_oversized(cfg, payload, &mut out) {
        return out.batch;
    }
    if !valid_table_name(table) {
        out.reject(
            DeadLetterReason::InvalidTable,
            format!("table {} is not allowed ({TABLE_RULE})", preview(table)),
            payload,
        );
        return out.batch;
    }
    // A key that cannot name a device (binary, or not a valid name: a partitioning key) names
    // none: readings that name their own device keep it, the others are dead letters.
    let named = match key.filter(|k| !k.is_empty()).map(std::str::from_utf8) {
        None => Named::Nothing,
        Some(Ok(device)) if valid_device_name(device) => Named::Key(device),
        Some(_) => Named::UnusableKey(key.unwrap_or_default()),
    };
    decode_json_into(table, named, payload, out)
}

/// Decodes one line-protocol payload (see [`crate::lpwire`]) after the size check; `key` is the
/// message key, whose text names the device of lines without a device tag; `memory` holds the
/// tags the consumer's devices last reported.
pub fn decode_lp(
    cfg: &WireConfig,
    source: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    received_ms: i64,
    memory: &mut crate::lpwire::TagMemory,
) -> IngestBatch {
    let mut out = Out { source, received_ms, batch: IngestBatch::default() };
    if reject_oversized(cfg, payload, &mut out) {
        return out.batch;
    }
    crate::lpwire::decode_lines_remembering(&cfg.lp, source, key, payload, received_ms, memory)
}

/// Turns an oversized payload into its one dead letter; `true` if it was one.
fn reject_oversized(cfg: &WireConfig, payload: &[u8], out: &mut Out<'_>) -> bool {
    if payload.len() <= cfg.max_payload_bytes {
        return false;
    }
    let kept = payload.len().min(KEPT_OVERSIZED_BYTES);
    out.reject(
        DeadLetterReason::PayloadTooLarge,
        format!(
            "payload of {} bytes exceeds the limit of {} bytes; the first {kept} bytes are kept",
            payload.len(),
            cfg.max_payload_bytes
        ),
        &payload[..kept],
    );
    true
}

/// Decodes a JSON payload whose table and device names have been checked. A message that
/// gives the table no reading (every one a dead letter) is counted as one of the table's
/// messages here ([`IngestBatch::count_message_of`]; the consumer counts the others by their
/// readings), so that `/messages` counts what was received, not only what was stored.
fn decode_json_into(table: &str, device: Named<'_>, payload: &[u8], out: Out<'_>) -> IngestBatch {
    let mut batch = decode_json_checked(table, device, payload, out);
    if batch.readings.is_empty() {
        batch.count_message_of(&Arc::from(table));
    }
    batch
}

/// [`decode_json_into`] but the count.
fn decode_json_checked(table: &str, device: Named<'_>, payload: &[u8], mut out: Out<'_>) -> IngestBatch {
    // The SIMD check (several times the standard library's speed), with the same error.
    let src = match simdutf8::compat::from_utf8(payload) {
        Ok(src) => src,
        Err(e) => {
            let detail = format!("payload is not UTF-8 (invalid byte at offset {})", e.valid_up_to());
            out.reject(DeadLetterReason::InvalidJson, detail, payload);
            return out.batch;
        }
    };
    if plain::readings(&mut Decoder::new(table, device), src, &mut out.batch.readings).is_some() {
        return out.batch;
    }
    out.batch.readings.clear();
    decode_json_generally(table, device, src, out)
}

/// Decodes a JSON payload whose table and device names have been checked, with `serde_json`:
/// the general decoder, for any payload (the fast path reads the common ones).
fn decode_json_generally(table: &str, device: Named<'_>, src: &str, mut out: Out<'_>) -> IngestBatch {
    let mut decoder = Decoder::new(table, device);
    if let Err(e) = decoder.message(src, &mut out) {
        // A syntax error anywhere voids the whole message, including readings decoded before it.
        out.batch.readings.clear();
        out.batch.dead_letters.clear();
        let detail = if src.trim_start().is_empty() {
            "empty payload".to_string()
        } else {
            let lp = if looks_like_line_protocol(src) { LINE_PROTOCOL_HINT } else { "" };
            format!("invalid JSON at line {}, column {}: {}{lp}", e.line(), e.column(), message(&e))
        };
        out.reject(DeadLetterReason::InvalidJson, detail, src.as_bytes());
    }
    out.batch
}

/// The hint for line protocol sent where JSON is read.
const LINE_PROTOCOL_HINT: &str = " (line protocol? this source reads JSON: line protocol goes to the topic \
     `{topic_prefix}/lp`, or to Kafka with kafka.format = \"lp\")";

/// Whether `src` that is not JSON reads as InfluxDB line protocol: its first line not a
/// comment is a measurement (a letter first), a space, and a field (`key=value`).
fn looks_like_line_protocol(src: &str) -> bool {
    let line = src.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
    line.and_then(|l| l.split_once(' ')).is_some_and(|(head, rest)| {
        head.starts_with(|c: char| c.is_ascii_alphabetic()) && rest.split(' ').next().is_some_and(|f| f.contains('='))
    })
}

/// Splits `topic` into its table and optional device, checking the layout and both names.
fn route<'t>(prefix: &str, topic: &'t str) -> Result<(&'t str, Option<&'t str>), (DeadLetterReason, String)> {
    let invalid = |why: String| (DeadLetterReason::InvalidTopic, format!("topic {}: {why}", preview(topic)));
    let rest = topic
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| invalid(format!("expected {prefix}/{{table}} or {prefix}/{{table}}/{{device}}")))?;
    // An empty level first: `t//d` has one too many levels only for want of a device name.
    if rest.split('/').any(str::is_empty) {
        return Err(invalid("empty topic level".to_string()));
    }
    let mut levels = rest.split('/');
    let table = levels.next().unwrap_or_default();
    let device = levels.next();
    if levels.next().is_some() {
        return Err(invalid(format!("too many levels; expected {prefix}/{{table}} or {prefix}/{{table}}/{{device}}")));
    }
    if !valid_table_name(table) {
        return Err((
            DeadLetterReason::InvalidTable,
            format!("table {} in the topic is not allowed ({TABLE_RULE})", preview(table)),
        ));
    }
    if let Some(device) = device.filter(|d| !valid_device_name(d)) {
        return Err((
            DeadLetterReason::InvalidDevice,
            format!("device {} in the topic is not allowed ({DEVICE_RULE})", preview(device)),
        ));
    }
    Ok((table, device))
}

pub(crate) const TABLE_RULE: &str = "1 to 64 ASCII letters, digits, `_`, `-` or `.`, starting with a letter or digit";
pub(crate) const DEVICE_RULE: &str =
    "1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a letter or digit";
/// The rule of [`valid_field_name`], for the messages that refuse a name.
pub const FIELD_RULE: &str =
    "1 to 64 ASCII letters, digits or `_`, not starting with a digit, and none of `ts`, `device`, \
     `period`, `devices`, `periods` (the API answers those beside a reading's or a roll-up's fields)";

/// The batch being built for one message.
struct Out<'t> {
    source: &'t str,
    received_ms: i64,
    batch: IngestBatch,
}

impl Out<'_> {
    fn reject(&mut self, reason: DeadLetterReason, detail: String, payload: &[u8]) {
        self.batch.dead_letters.push(DeadLetter {
            received_ms: self.received_ms,
            source: self.source.to_string(),
            reason,
            detail,
            payload: payload.to_vec(),
        });
    }

    /// Files the decoded elements of the top-level array `src`.
    fn elements(&mut self, src: &str, elements: Vec<Result<DeviceReading, Problem>>) -> serde_json::Result<()> {
        let mut bad = Vec::new();
        for (index, element) in elements.into_iter().enumerate() {
            match element {
                Ok(reading) => self.batch.readings.push(reading),
                Err(problem) => bad.push((index, problem)),
            }
        }
        if !bad.is_empty() {
            // Only now, for the dead letters, read each element's bytes in a second pass.
            let elements = parse(src, PhantomData::<Vec<&RawValue>>)?;
            for (index, (reason, detail)) in bad {
                let element = elements.get(index).map_or("", |element| element.get());
                self.reject(reason, format!("array element {index}: {detail}"), element.as_bytes());
            }
        }
        Ok(())
    }
}

/// Why one reading was rejected.
type Problem = (DeadLetterReason, String);

/// The device a message names outside its readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named<'a> {
    /// None: each reading names its own `"device"`.
    Nothing,
    /// By the MQTT topic: every reading is that device's, and one naming another is refused.
    Topic(&'a str),
    /// By the Kafka message key: the device of the readings that name none (a gateway's
    /// readings naming their own devices keep them).
    Key(&'a str),
    /// A Kafka message key that cannot name a device (not UTF-8, or not a valid name): the
    /// readings must name their own.
    UnusableKey(&'a [u8]),
}

impl<'a> Named<'a> {
    /// The device a topic names, if it names one.
    fn topic(device: Option<&'a str>) -> Named<'a> {
        device.map_or(Named::Nothing, Named::Topic)
    }
}

/// Decodes the readings of one message whose topic has been checked.
struct Decoder<'a> {
    table: Arc<str>,
    /// The device named outside the readings.
    named: Named<'a>,
    /// That device as the name shared by its readings.
    named_device: Option<Arc<str>>,
    fields: Interner,
    /// Devices named by the readings (topics without a device).
    devices: Interner,
    /// Fields of the previous reading, to size the next one's vector.
    field_capacity: usize,
}

/// What a reading has said about `ts` so far.
enum Ts {
    Missing,
    Null,
    At(i64),
}

/// One reading while its object is being read.
struct Draft {
    ts: Ts,
    device: Option<Arc<str>>,
    fields: Vec<(FieldName, model::Value)>,
    problem: Option<Problem>,
}

impl Draft {
    /// A `null` member: the field is absent, whatever an earlier member of the same name said
    /// (the last of a name given twice wins, `null` as any value).
    fn absent(&mut self, field: &FieldName) {
        self.fields.retain(|(name, _)| name != field);
    }
}

impl<'a> Decoder<'a> {
    /// A decoder of readings for `table`, of a message that names `named` outside them.
    fn new(table: &str, named: Named<'a>) -> Self {
        let named_device = match named {
            Named::Topic(d) | Named::Key(d) => Some(Arc::from(d)),
            Named::Nothing | Named::UnusableKey(_) => None,
        };
        Decoder {
            table: Arc::from(table),
            named,
            named_device,
            fields: Interner::default(),
            devices: Interner::default(),
            field_capacity: 8,
        }
    }

    /// An empty draft for the next reading, its field names expected in the previous one's order.
    fn start_reading(&mut self) -> Draft {
        self.fields.restart();
        Draft { ts: Ts::Missing, device: None, fields: Vec::with_capacity(self.field_capacity), problem: None }
    }

    /// Reads the whole payload `src`: one reading, or an array of them.
    fn message(&mut self, src: &str, out: &mut Out<'_>) -> serde_json::Result<()> {
        let (reason, detail) = match parse(src, ItemSeed { decoder: self, top: true })? {
            Item::Array(elements) => return out.elements(src, elements),
            Item::Reading(Ok(reading)) => {
                out.batch.readings.push(reading);
                return Ok(());
            }
            Item::Reading(Err(problem)) => problem,
            Item::Other(value) => (
                DeadLetterReason::InvalidShape,
                format!("expected a reading object or an array of reading objects, got {}", describe(&value)),
            ),
        };
        out.reject(reason, detail, src.as_bytes());
        Ok(())
    }

    /// Reads the members of one object as a reading. The outer error is a syntax error of the
    /// message; the inner one rejects only this reading.
    fn reading<'de, A: MapAccess<'de>>(&mut self, mut map: A) -> Result<Result<DeviceReading, Problem>, A::Error> {
        let mut draft = self.start_reading();
        while let Some(Key(key)) = map.next_key()? {
            if draft.problem.is_some() {
                map.next_value::<Value>()?;
                continue;
            }
            let checked = match &*key {
                "ts" => {
                    let text = map.next_value::<&RawValue>()?.get();
                    if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
                        ts_from_json_number(text).map(|ms| draft.ts = Ts::At(ms)).map_err(invalid_ts)
                    } else {
                        let value = serde_json::from_str(text).map_err(|e| A::Error::custom(message(&e)))?;
                        ts_value(&mut draft, value)
                    }
                }
                "device" => {
                    // Read as its text: a name without escapes (nearly all) is taken from the
                    // payload as it stands, without a `String` of its own.
                    let text = map.next_value::<&RawValue>()?.get();
                    match plain_string(text) {
                        Some(name) => self.device(&mut draft, name),
                        None => match serde_json::from_str(text).map_err(|e| A::Error::custom(message(&e)))? {
                            Value::String(name) => self.device(&mut draft, &name),
                            other => Err((
                                DeadLetterReason::InvalidDevice,
                                format!("\"device\": expected a string, got {}", describe(&other)),
                            )),
                        },
                    }
                }
                name => self.field(&mut draft, name, map.next_value()?),
            };
            if let Err(problem) = checked {
                draft.problem = Some(problem);
            }
        }
        Ok(self.finish(draft))
    }

    fn device(&mut self, draft: &mut Draft, name: &str) -> Result<(), Problem> {
        let invalid = |detail| Err((DeadLetterReason::InvalidDevice, detail));
        match self.named {
            Named::Topic(topic_device) if name != topic_device => invalid(format!(
                "\"device\" {} differs from the device {} named by the topic",
                preview(name),
                preview(topic_device)
            )),
            Named::Topic(_) => Ok(()),
            Named::Key(key_device) if name == key_device => {
                // The key's device, as a reading naming none gets: the last of two members wins.
                draft.device = None;
                Ok(())
            }
            Named::Nothing | Named::Key(_) | Named::UnusableKey(_) => {
                match self.devices.intern_if(name, valid_device_name) {
                    Some(device) => {
                        draft.device = Some(device);
                        Ok(())
                    }
                    None => invalid(format!("\"device\" {} is not allowed ({DEVICE_RULE})", preview(name))),
                }
            }
        }
    }

    /// The shared name of the field `name`, if it may name a field.
    fn field_name(&mut self, name: &str) -> Result<FieldName, Problem> {
        self.fields.intern_if(name, valid_field_name).ok_or_else(|| {
            let detail = format!("field name {} is not allowed ({FIELD_RULE})", preview(name));
            (DeadLetterReason::InvalidFieldName, detail)
        })
    }

    fn field(&mut self, draft: &mut Draft, name: &str, value: Value) -> Result<(), Problem> {
        let field = self.field_name(name)?;
        let why = match value {
            Value::Null => {
                draft.absent(&field);
                return Ok(());
            }
            Value::Number(n) => match number_value(&n) {
                Some(v) => {
                    draft.fields.push((field, v));
                    return Ok(());
                }
                // Only with serde_json's `arbitrary_precision`, which is not enabled.
                None => format!("{} is out of range of a 64-bit float", cut(&n.to_string())),
            },
            Value::Bool(b) => {
                draft.fields.push((field, model::Value::Bool(b)));
                return Ok(());
            }
            Value::String(text) => {
                draft.fields.push((field, model::Value::Str(text.into())));
                return Ok(());
            }
            other => format!("expected a number, a boolean or a string, got {}", describe(&other)),
        };
        Err((DeadLetterReason::NonNumericField, format!("field {}: {why}", preview(name))))
    }

    /// Turns a fully read object into a reading, or the reason it is not one.
    fn finish(&mut self, draft: Draft) -> Result<DeviceReading, Problem> {
        if let Some(problem) = draft.problem {
            return Err(problem);
        }
        let ts = match draft.ts {
            Ts::At(ts) => ts,
            Ts::Missing => return Err((DeadLetterReason::MissingTimestamp, "missing \"ts\"".to_string())),
            Ts::Null => return Err((DeadLetterReason::MissingTimestamp, "\"ts\" is null".to_string())),
        };
        let device = match (&self.named_device, draft.device) {
            (Some(device), None) => Arc::clone(device),
            (Some(device), Some(_)) if matches!(self.named, Named::Topic(_)) => Arc::clone(device),
            (_, Some(device)) => device,
            (None, None) if matches!(self.named, Named::UnusableKey(_)) => {
                let Named::UnusableKey(key) = self.named else { unreachable!("matched above") };
                return Err((
                    DeadLetterReason::InvalidDevice,
                    format!("missing \"device\", and {}", unusable_key(key)),
                ));
            }
            (None, None) => {
                return Err((
                    DeadLetterReason::InvalidDevice,
                    "missing \"device\" (required because the topic names no device)".to_string(),
                ))
            }
        };
        if draft.fields.is_empty() {
            return Err((DeadLetterReason::NoFields, "reading has no field values".to_string()));
        }
        self.field_capacity = draft.fields.len();
        Ok(DeviceReading { table: Arc::clone(&self.table), device, reading: Reading::new(ts, draft.fields) })
    }
}

/// The contents of `text`, a JSON value's text, if it is a string without escapes (the text
/// between its quotes is then the string itself).
fn plain_string(text: &str) -> Option<&str> {
    text.strip_prefix('"')?.strip_suffix('"').filter(|inner| !inner.contains('\\'))
}

/// A JSON number as a field value: an integer (no fraction, no exponent) from ±2^53 on within
/// the `i64` range exactly, as a [`model::Value::UntypedInt`] the schema check types; any other
/// number as the nearest `f64`. `None` only for a number beyond the `f64` range, which
/// `serde_json` without `arbitrary_precision` never yields.
fn number_value(n: &serde_json::Number) -> Option<model::Value> {
    match n.as_i64() {
        Some(i) if i.unsigned_abs() >= model::UNTYPED_INT_FROM => Some(model::Value::UntypedInt(i)),
        _ => n.as_f64().map(model::Value::F64),
    }
}

/// Applies a `ts` that is not a JSON number.
fn ts_value(draft: &mut Draft, value: Value) -> Result<(), Problem> {
    draft.ts = match value {
        Value::Null => Ts::Null,
        Value::String(text) => Ts::At(ts_from_rfc3339(&text).map_err(invalid_ts)?),
        other => {
            return Err(invalid_ts(format!(
                "expected epoch milliseconds (a JSON number) or an RFC 3339 string, got {}",
                describe(&other)
            )))
        }
    };
    Ok(())
}

fn invalid_ts(why: String) -> Problem {
    (DeadLetterReason::InvalidTimestamp, format!("\"ts\": {why}"))
}

/// Epoch milliseconds of a JSON number (already checked against the grammar), exactly: the
/// decimal value must be a whole number, however it is written (`1.7e12`, `17e11`, `1700000000000.0`).
fn ts_from_json_number(text: &str) -> Result<i64, String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], &unsigned[i + 1..]),
        None => (unsigned, ""),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let exponent = {
        let (sign, digits) = match exponent.as_bytes().first() {
            Some(b'-') => (-1, &exponent[1..]),
            Some(b'+') => (1, &exponent[1..]),
            _ => (1, exponent),
        };
        // Saturates far beyond any digit count a payload can hold, so the scale stays exact.
        sign * digits.bytes().fold(0i64, |acc, b| (acc * 10 + i64::from(b - b'0')).min(1_000_000_000))
    };
    // The value is digits(int ++ frac) × 10^scale. Trailing zeros move into the scale so that a
    // negative scale means a fraction.
    let all = || int.bytes().chain(frac.bytes());
    let zeros = all().rev().take_while(|b| *b == b'0').count();
    let significant = int.len() + frac.len() - zeros;
    let scale = exponent - frac.len() as i64 + zeros as i64;
    let out_of_range = || format!("{} is {OUTSIDE_WINDOW}", cut(text));
    if significant == 0 {
        return Ok(0);
    }
    if scale < 0 {
        return Err(format!("{} is not a whole number of milliseconds", cut(text)));
    }
    let mut ms: i64 = 0;
    for b in all().take(significant) {
        ms = ms.checked_mul(10).and_then(|ms| ms.checked_add(i64::from(b - b'0'))).ok_or_else(out_of_range)?;
    }
    for _ in 0..scale.min(20) {
        ms = ms.checked_mul(10).ok_or_else(out_of_range)?;
    }
    let ms = if negative { -ms } else { ms };
    if (MIN_TS..MAX_TS).contains(&ms) {
        Ok(ms)
    } else {
        Err(out_of_range())
    }
}

/// Epoch milliseconds of an RFC 3339 string, floored to the millisecond.
fn ts_from_rfc3339(text: &str) -> Result<i64, String> {
    let ms = DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("{} is not an RFC 3339 timestamp ({e}{})", preview(text), no_offset(text)))?
        .timestamp_millis();
    if (MIN_TS..MAX_TS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("{} is {OUTSIDE_WINDOW}", preview(text)))
    }
}

/// Hands out one shared `Arc<str>` per distinct name within a message.
///
/// Readings of one message usually list their fields in the same order, so the name expected
/// next is tried first; the map catches the rest without a linear scan.
#[derive(Default)]
struct Interner {
    /// Names in order of first appearance.
    names: Vec<Arc<str>>,
    /// Positions in `names`, by the name's hash: a name new to the message (each device of a
    /// gateway's) is hashed once for its lookup and its insert.
    index: hashbrown::HashTable<usize>,
    /// ahash (random keys), not SipHash.
    hasher: ahash::RandomState,
    /// Position in `names` of the name expected next.
    cursor: usize,
}

impl Interner {
    /// Starts a new reading: its first name is expected to be the first name seen.
    fn restart(&mut self) {
        self.cursor = 0;
    }

    /// The shared name equal to `name`, interning it if `valid(name)`; `None` if it is not.
    fn intern_if(&mut self, name: &str, valid: impl Fn(&str) -> bool) -> Option<Arc<str>> {
        if let Some(next) = self.names.get(self.cursor) {
            if **next == *name {
                self.cursor += 1;
                return Some(Arc::clone(next));
            }
        }
        let hash = self.hasher.hash_one(name);
        let names = &self.names;
        let i = match self.index.find(hash, |&i| *names[i] == *name) {
            Some(&i) => i,
            None if valid(name) => {
                self.names.push(Arc::from(name));
                let (names, hasher) = (&self.names, &self.hasher);
                self.index.insert_unique(hash, names.len() - 1, |&j| hasher.hash_one(&*names[j]));
                names.len() - 1
            }
            None => return None,
        };
        self.cursor = i + 1;
        self.names.get(i).cloned()
    }
}

/// What a JSON value at the top level or in the top-level array is to the decoder.
enum Item {
    Reading(Result<DeviceReading, Problem>),
    /// The top-level array: each element's reading or problem.
    Array(Vec<Result<DeviceReading, Problem>>),
    Other(Value),
}

/// Reads one JSON value as an [`Item`] with a [`Decoder`].
struct ItemSeed<'s, 'a> {
    decoder: &'s mut Decoder<'a>,
    /// Whether this is the whole payload, so an array is one of readings.
    top: bool,
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_, '_> {
    type Value = Item;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Item, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_, '_> {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a reading object or an array of reading objects")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
        self.decoder.reading(map).map(Item::Reading)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        if !self.top {
            return Value::deserialize(SeqAccessDeserializer::new(seq)).map(Item::Other);
        }
        let mut elements = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(ItemSeed { decoder: &mut *self.decoder, top: false })? {
            elements.push(match item {
                Item::Reading(result) => result,
                Item::Other(value) => Err((
                    DeadLetterReason::InvalidShape,
                    format!("expected a reading object, got {}", describe(&value)),
                )),
                // Not read below the top level.
                Item::Array(_) => Err((DeadLetterReason::InvalidShape, "expected a reading object, got array".into())),
            });
        }
        Ok(Item::Array(elements))
    }

    fn visit_unit<E>(self) -> Result<Item, E> {
        Ok(Item::Other(Value::Null))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Item, E> {
        Ok(Item::Other(v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Item, E> {
        Ok(Item::Other(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Item, E> {
        Ok(Item::Other(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Item, E> {
        Ok(Item::Other(v.into()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Item, E> {
        Ok(Item::Other(v.into()))
    }
}

/// A member name, borrowed from the payload unless it has escapes.
#[derive(Deserialize)]
#[serde(transparent)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

/// A JSON value's type and, for scalars, a short excerpt: `string "fast"`, `bool true`.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) => format!("number {}", cut(&n.to_string())),
        Value::String(s) => format!("string {}", preview(s)),
        Value::Array(_) => "array".to_string(),
        Value::Object(_) => "object".to_string(),
    }
}

/// Parses all of `src` with `seed`.
fn parse<'a, S: DeserializeSeed<'a>>(src: &'a str, seed: S) -> serde_json::Result<S::Value> {
    let mut de = serde_json::Deserializer::from_str(src);
    let value = seed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// `serde_json`'s message for `e`, without its position.
fn message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    match full.strip_suffix(&format!(" at line {} column {}", e.line(), e.column())) {
        Some(what) => what.to_string(),
        None => full,
    }
}

/// Why a Kafka message key names no device, showing the key: text as text, other bytes in hex
/// (each cut to a preview).
pub fn unusable_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => format!("the message key {} cannot name one (it is not {DEVICE_RULE})", preview(text)),
        Err(_) => {
            let shown: String = key.iter().take(PREVIEW_CHARS / 2).map(|b| format!("{b:02x}")).collect();
            let more = if key.len() > PREVIEW_CHARS / 2 { "…" } else { "" };
            let unit = if key.len() == 1 { "byte" } else { "bytes" };
            format!("the message key cannot name one (it is not UTF-8: {} {unit}, 0x{shown}{more})", key.len())
        }
    }
}

/// `s` quoted and escaped as in Rust source, cut to [`PREVIEW_CHARS`] characters.
pub(crate) fn preview(s: &str) -> String {
    match s.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => format!("{:?}…", &s[..end]),
        None => format!("{s:?}"),
    }
}

/// `s` unquoted, cut to [`PREVIEW_CHARS`] characters (for number texts, which need no escaping).
fn cut(s: &str) -> Cow<'_, str> {
    match s.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => Cow::Owned(format!("{}…", &s[..end])),
        None => Cow::Borrowed(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::DeadLetterReason as R;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const RECEIVED: i64 = 42;

    fn decode(topic: &str, payload: &str) -> IngestBatch {
        decode_mqtt(&WireConfig::default(), topic, payload.as_bytes(), RECEIVED)
    }

    #[test]
    fn line_protocol_on_the_lp_topic_and_json_elsewhere() {
        let b = decode("hourglass/lp", "cpu,name=h1 load=0.5 1704067200000000000\nmem,name=h1 used=3i\n");
        let got: Vec<(&str, &str, i64)> = b.readings.iter().map(|r| (&*r.table, &*r.device, r.reading.ts)).collect();
        assert_eq!(got, vec![("cpu", "h1", 1_704_067_200_000), ("mem", "h1", RECEIVED)]);
        // A table called `lp` still takes JSON when the topic names the device.
        let b = decode("hourglass/lp/dev_1", r#"{"ts": 1000, "v": 1}"#);
        assert_eq!(b.readings, vec![reading("lp", "dev_1", 1000, &[("v", 1.0)])]);
        // The size limit applies to line protocol too.
        let cfg = WireConfig { max_payload_bytes: 8, ..WireConfig::default() };
        let b = decode_mqtt(&cfg, "hourglass/lp", b"cpu,name=h1 load=0.5", RECEIVED);
        assert_eq!(b.dead_letters[0].reason, DeadLetterReason::PayloadTooLarge);
    }

    #[test]
    fn kafka_json_checks_the_table_and_the_key_device() {
        let cfg = WireConfig::default();
        let b = decode_json(&cfg, "kafka:t/0@5", "fleet", Some(&b"truck_1"[..]), br#"[{"ts": 1, "v": 2}]"#, RECEIVED);
        assert_eq!(b.readings, vec![reading("fleet", "truck_1", 1, &[("v", 2.0)])]);
        let b = decode_json(&cfg, "kafka:t/0@6", "bad table", None, b"{}", RECEIVED);
        assert_eq!(
            (b.dead_letters[0].reason, b.dead_letters[0].source.as_str()),
            (DeadLetterReason::InvalidTable, "kafka:t/0@6")
        );
        // A key that cannot name a device (not a valid name, not UTF-8: a partitioning key)
        // names none: a reading naming its own device is stored, one naming none is refused.
        // The dead letter shows the key.
        let long = [7u8; 40];
        for (key, why) in [
            (&b"bad device"[..], format!("the message key \"bad device\" cannot name one (it is not {DEVICE_RULE})")),
            (
                b"site-7/gateway-3",
                format!("the message key \"site-7/gateway-3\" cannot name one (it is not {DEVICE_RULE})"),
            ),
            (b"\x00\x00\x01\x9a", "the message key cannot name one (it is not UTF-8: 4 bytes, 0x0000019a)".into()),
            (b"\xff", "the message key cannot name one (it is not UTF-8: 1 byte, 0xff)".into()),
            (
                &[&b"\xff"[..], &long].concat(),
                format!("the message key cannot name one (it is not UTF-8: 41 bytes, 0xff{}…)", "07".repeat(31)),
            ),
        ] {
            let payload = br#"[{"device": "own", "ts": 1, "v": 2}, {"ts": 2, "v": 3}]"#;
            let b = decode_json(&cfg, "kafka:t/0@7", "fleet", Some(key), payload, RECEIVED);
            assert_eq!(b.readings, vec![reading("fleet", "own", 1, &[("v", 2.0)])], "{key:?}");
            let letters: Vec<_> = b.dead_letters.iter().map(|d| (d.reason, d.detail.clone())).collect();
            assert_eq!(
                letters,
                [(DeadLetterReason::InvalidDevice, format!("array element 1: missing \"device\", and {why}"))]
            );
        }
    }

    /// A member given twice: the last wins, `null` (absent) as any value; by the fast path and
    /// the general decoder alike (an escaped string sends a payload to the general one).
    #[test]
    fn a_null_given_last_removes_the_field() {
        for escape in ["", r#","s":"a\"b""#] {
            let fields = |payload: String| -> Vec<(String, model::Value)> {
                let b = decode("hourglass/j/d1", &payload);
                assert!(b.dead_letters.is_empty(), "{payload}: {:?}", b.dead_letters);
                b.readings[0]
                    .reading
                    .fields
                    .iter()
                    .filter(|(n, _)| &**n != "s")
                    .map(|(n, v)| (n.to_string(), v.clone()))
                    .collect()
            };
            let w = ("w".to_string(), model::Value::F64(2.0));
            assert_eq!(fields(format!(r#"{{"ts":1,"w":2,"v":1,"v":null{escape}}}"#)), std::slice::from_ref(&w));
            assert_eq!(
                fields(format!(r#"{{"ts":1,"w":2,"v":null,"v":3{escape}}}"#)),
                [("v".to_string(), model::Value::F64(3.0)), w]
            );
        }
        assert_eq!(reason(r#"{"ts":1,"v":1,"v":null}"#), R::NoFields);
    }

    /// A Kafka key names the device of the readings that name none; a gateway's readings
    /// naming their own devices keep them (on an MQTT device topic they would be refused), by
    /// the fast path and the general decoder alike (an escaped string sends the second
    /// payload to the general one).
    #[test]
    fn a_kafka_key_names_the_device_of_readings_that_name_none() {
        let cfg = WireConfig::default();
        let fast =
            br#"[{"device": "truck_9", "ts": 1, "v": 2}, {"ts": 2, "v": 3}, {"device": "gw1", "ts": 3, "v": 4}]"#;
        let general = br#"[{"device": "truck_9", "ts": 1, "v": 2, "s": "a\"b"}, {"ts": 2, "v": 3}]"#;
        for payload in [&fast[..], &general[..]] {
            let b = decode_json(&cfg, "kafka:t/0@8", "fleet", Some(&b"gw1"[..]), payload, RECEIVED);
            let devices: Vec<(&str, i64)> = b.readings.iter().map(|r| (&*r.device, r.reading.ts)).collect();
            let expected: &[(&str, i64)] = if payload == &fast[..] {
                &[("truck_9", 1), ("gw1", 2), ("gw1", 3)]
            } else {
                &[("truck_9", 1), ("gw1", 2)]
            };
            assert_eq!((devices.as_slice(), b.dead_letters.len()), (expected, 0));
        }
        let b = decode_json(
            &cfg,
            "kafka:t/0@9",
            "fleet",
            Some(&b"gw1"[..]),
            br#"{"device": "bad device", "ts": 1, "v": 2}"#,
            RECEIVED,
        );
        assert_eq!(b.dead_letters[0].reason, DeadLetterReason::InvalidDevice);
        // The last of two members wins, the key's device too.
        for (payload, device) in [
            (&br#"{"device":"x","device":"gw1","ts":1,"v":2}"#[..], "gw1"),
            (br#"{"device":"gw1","device":"x","ts":1,"v":2}"#, "x"),
        ] {
            let b = decode_json(&cfg, "kafka:t/0@10", "fleet", Some(&b"gw1"[..]), payload, RECEIVED);
            assert_eq!(&*b.readings[0].device, device);
        }
        // On an MQTT device topic, another device is refused.
        let b = decode("hourglass/fleet/gw1", r#"{"device": "truck_9", "ts": 1, "v": 2}"#);
        assert_eq!(b.dead_letters[0].reason, DeadLetterReason::InvalidDevice);
    }

    fn reading(table: &str, device: &str, ts: i64, fields: &[(&str, f64)]) -> DeviceReading {
        DeviceReading {
            table: table.into(),
            device: device.into(),
            reading: Reading::new(ts, fields.iter().map(|(n, v)| (FieldName::from(*n), *v)).collect()),
        }
    }

    /// The only dead letter of a batch that has no readings.
    fn only_dead(batch: &IngestBatch) -> &DeadLetter {
        assert!(batch.readings.is_empty(), "unexpected readings: {:?}", batch.readings);
        assert_eq!(batch.dead_letters.len(), 1, "{:?}", batch.dead_letters);
        &batch.dead_letters[0]
    }

    /// Reason and detail of the single dead letter `payload` decodes to on `hourglass/t/d`.
    fn reject(payload: &str) -> (DeadLetterReason, String) {
        let batch = decode("hourglass/t/d", payload);
        let dead = only_dead(&batch);
        (dead.reason, dead.detail.clone())
    }

    fn reason(payload: &str) -> DeadLetterReason {
        reject(payload).0
    }

    /// The timestamp `ts_json` decodes to, or the reason it is rejected.
    fn ts_of(ts_json: &str) -> Result<i64, DeadLetterReason> {
        let batch = decode("hourglass/t/d", &format!(r#"{{"ts": {ts_json}, "v": 1}}"#));
        match (batch.readings.as_slice(), batch.dead_letters.as_slice()) {
            ([r], []) => Ok(r.reading.ts),
            ([], [d]) => Err(d.reason),
            other => panic!("unexpected batch {other:?}"),
        }
    }

    #[test]
    fn default_config() {
        let cfg = WireConfig::default();
        assert_eq!(cfg.topic_prefix, "hourglass");
        assert_eq!(cfg.max_payload_bytes, 1_048_576);
    }

    #[test]
    fn window_constants_are_the_years_1900_to_2199() {
        assert_eq!(MIN_TS, model::days_from_civil(1900, 1, 1) * model::DAY_MS);
        assert_eq!(MAX_TS, model::days_from_civil(2200, 1, 1) * model::DAY_MS);
    }

    #[test]
    fn one_reading_on_a_device_topic() {
        let batch = decode("hourglass/fleet.readings/truck_1", r#"{"ts": 1000, "speed": 3.5, "temp": -4}"#);
        assert_eq!(batch.readings, vec![reading("fleet.readings", "truck_1", 1000, &[("speed", 3.5), ("temp", -4.0)])]);
        assert!(batch.dead_letters.is_empty());
        assert!(batch.acks.is_empty());
    }

    #[test]
    fn array_on_a_device_topic_shares_names() {
        let batch = decode(
            "hourglass/fleet/truck_1",
            r#"[{"ts": 1, "a": 1, "b": 2}, {"b": 4, "ts": 2, "a": 3, "device": "truck_1"}]"#,
        );
        assert_eq!(
            batch.readings,
            vec![
                reading("fleet", "truck_1", 1, &[("a", 1.0), ("b", 2.0)]),
                reading("fleet", "truck_1", 2, &[("a", 3.0), ("b", 4.0)]),
            ]
        );
        let [first, second] = batch.readings.as_slice() else { panic!("two readings") };
        assert!(Arc::ptr_eq(&first.table, &second.table));
        assert!(Arc::ptr_eq(&first.device, &second.device));
        for i in 0..2 {
            assert!(Arc::ptr_eq(&first.reading.fields[i].0, &second.reading.fields[i].0));
        }
    }

    #[test]
    fn gateway_topic_takes_devices_from_readings() {
        let batch = decode(
            "hourglass/fleet",
            r#"[{"device": "truck_1", "ts": 1, "v": 1},
                {"device": "truck_2", "ts": 1, "v": 2},
                {"device": "truck_1", "ts": 2, "v": 3}]"#,
        );
        assert_eq!(
            batch.readings,
            vec![
                reading("fleet", "truck_1", 1, &[("v", 1.0)]),
                reading("fleet", "truck_2", 1, &[("v", 2.0)]),
                reading("fleet", "truck_1", 2, &[("v", 3.0)]),
            ]
        );
        assert!(Arc::ptr_eq(&batch.readings[0].device, &batch.readings[2].device));
        // A name written with escapes is the same name (read through the JSON parser, where
        // a plain one is taken from the payload as it stands).
        let escaped = decode(
            "hourglass/fleet",
            r#"[{"device": "truck_1", "ts": 1, "v": 1}, {"device": "truck\u005f1", "ts": 2, "v": 2},
                {"device": "\u0074ruck_2", "ts": 3, "v": 3}]"#,
        );
        assert_eq!(
            escaped.readings,
            vec![
                reading("fleet", "truck_1", 1, &[("v", 1.0)]),
                reading("fleet", "truck_1", 2, &[("v", 2.0)]),
                reading("fleet", "truck_2", 3, &[("v", 3.0)]),
            ]
        );
        assert!(Arc::ptr_eq(&escaped.readings[0].device, &escaped.readings[1].device));
        let on_topic = decode("hourglass/fleet/d", r#"{"device": "\u0064", "ts": 4, "v": 1}"#);
        assert_eq!(on_topic.readings, vec![reading("fleet", "d", 4, &[("v", 1.0)])]);
        let single = decode("hourglass/fleet", r#"{"device": "gw-3:s.1", "ts": 5, "v": 1}"#);
        assert_eq!(single.readings, vec![reading("fleet", "gw-3:s.1", 5, &[("v", 1.0)])]);
    }

    #[test]
    fn prefix_is_configurable_and_may_span_levels() {
        let cfg = WireConfig { topic_prefix: "site1/hg".into(), ..WireConfig::default() };
        let batch = decode_mqtt(&cfg, "site1/hg/t/d", br#"{"ts": 1, "v": 1}"#, 0);
        assert_eq!(batch.readings, vec![reading("t", "d", 1, &[("v", 1.0)])]);
        let batch = decode_mqtt(&cfg, "hourglass/t/d", br#"{"ts": 1, "v": 1}"#, 0);
        assert_eq!(only_dead(&batch).reason, R::InvalidTopic);
    }

    #[test]
    fn good_readings_around_bad_ones_are_kept() {
        let payload = r#"[{"ts": 1, "v": 1}, {"ts": 2, "v": {"high": 1}} , 7, {"ts": 3, "v": 3}]"#;
        let batch = decode("hourglass/t/d", payload);
        assert_eq!(batch.readings, vec![reading("t", "d", 1, &[("v", 1.0)]), reading("t", "d", 3, &[("v", 3.0)])]);
        assert_eq!(
            batch.dead_letters,
            vec![
                DeadLetter {
                    received_ms: RECEIVED,
                    source: "hourglass/t/d".into(),
                    reason: R::NonNumericField,
                    detail: r#"array element 1: field "v": expected a number, a boolean or a string, got object"#
                        .into(),
                    payload: br#"{"ts": 2, "v": {"high": 1}}"#.to_vec(),
                },
                DeadLetter {
                    received_ms: RECEIVED,
                    source: "hourglass/t/d".into(),
                    reason: R::InvalidShape,
                    detail: "array element 2: expected a reading object, got number 7".into(),
                    payload: b"7".to_vec(),
                },
            ]
        );
    }

    #[test]
    fn whole_message_dead_letters_keep_the_payload() {
        let payload = br#"{"ts": 1, "v": 1}"#;
        let batch = decode_mqtt(&WireConfig::default(), "elsewhere/t/d", payload, 7);
        assert_eq!(
            batch.dead_letters,
            vec![DeadLetter {
                received_ms: 7,
                source: "elsewhere/t/d".into(),
                reason: R::InvalidTopic,
                detail: r#"topic "elsewhere/t/d": expected hourglass/{table} or hourglass/{table}/{device}"#.into(),
                payload: payload.to_vec(),
            }]
        );
        assert!(batch.readings.is_empty());
    }

    #[test]
    fn payload_too_large() {
        let cfg = WireConfig { max_payload_bytes: 10, ..WireConfig::default() };
        let payload = br#"{"ts": 1, "v": 1}"#;
        let batch = decode_mqtt(&cfg, "hourglass/t/d", payload, 0);
        let dead = only_dead(&batch);
        assert_eq!(dead.reason, R::PayloadTooLarge);
        assert_eq!(dead.detail, "payload of 17 bytes exceeds the limit of 10 bytes; the first 17 bytes are kept");
        assert_eq!(dead.payload, payload);
        // Exactly at the limit is fine.
        let cfg = WireConfig { max_payload_bytes: 17, ..WireConfig::default() };
        assert_eq!(decode_mqtt(&cfg, "hourglass/t/d", payload, 0).readings.len(), 1);
        // A huge payload keeps only its first 64 KiB, and is rejected before the topic is looked at.
        let huge = vec![b' '; DEFAULT_MAX_PAYLOAD_BYTES + 1];
        let batch = decode_mqtt(&WireConfig::default(), "not/a/valid/topic", &huge, 0);
        let dead = only_dead(&batch);
        assert_eq!(dead.reason, R::PayloadTooLarge);
        assert_eq!(dead.payload.len(), 65_536);
        assert_eq!(
            dead.detail,
            "payload of 1048577 bytes exceeds the limit of 1048576 bytes; the first 65536 bytes are kept"
        );
    }

    #[test]
    fn invalid_topics() {
        for topic in [
            "",
            "hourglass",
            "hourglass/",
            "hourglassx/t/d",
            "other/t/d",
            "/hourglass/t/d",
            "hourglass/t/d/extra",
            "hourglass//d",
            "hourglass/t/",
        ] {
            let batch = decode(topic, r#"{"ts": 1, "v": 1}"#);
            assert_eq!(only_dead(&batch).reason, R::InvalidTopic, "{topic:?}");
        }
        let batch = decode("hourglass/t/d/x", "{}");
        assert_eq!(
            only_dead(&batch).detail,
            r#"topic "hourglass/t/d/x": too many levels; expected hourglass/{table} or hourglass/{table}/{device}"#
        );
        assert_eq!(only_dead(&decode("hourglass//d", "{}")).detail, r#"topic "hourglass//d": empty topic level"#);
        // An empty level is named as such even where the levels are one too many.
        assert_eq!(only_dead(&decode("hourglass/t//d", "{}")).detail, r#"topic "hourglass/t//d": empty topic level"#);
    }

    #[test]
    fn invalid_tables() {
        let long = "t".repeat(65);
        for table in ["_t", "-t", ".t", "t t", "t+", "tä", long.as_str()] {
            let batch = decode(&format!("hourglass/{table}/d"), r#"{"ts": 1, "v": 1}"#);
            assert_eq!(only_dead(&batch).reason, R::InvalidTable, "{table:?}");
        }
        assert_eq!(
            only_dead(&decode("hourglass/t+/d", "{}")).detail,
            "table \"t+\" in the topic is not allowed \
             (1 to 64 ASCII letters, digits, `_`, `-` or `.`, starting with a letter or digit)"
        );
        let longest = "t".repeat(64);
        assert_eq!(decode(&format!("hourglass/{longest}/d"), r#"{"ts": 1, "v": 1}"#).readings.len(), 1);
    }

    #[test]
    fn invalid_devices_in_topics() {
        let long = "d".repeat(129);
        for device in ["_d", ":d", "d d", "d+", "dé", long.as_str()] {
            let batch = decode(&format!("hourglass/t/{device}"), r#"{"ts": 1, "v": 1}"#);
            assert_eq!(only_dead(&batch).reason, R::InvalidDevice, "{device:?}");
        }
        let longest = "d".repeat(128);
        assert_eq!(decode(&format!("hourglass/t/{longest}"), r#"{"ts": 1, "v": 1}"#).readings.len(), 1);
    }

    #[test]
    fn invalid_devices_in_readings() {
        let gateway = |payload: &str| {
            let batch = decode("hourglass/t", payload);
            let dead = only_dead(&batch);
            (dead.reason, dead.detail.clone())
        };
        assert_eq!(
            gateway(r#"{"ts": 1, "v": 1}"#),
            (R::InvalidDevice, r#"missing "device" (required because the topic names no device)"#.into())
        );
        assert_eq!(
            gateway(r#"{"ts": 1, "v": 1, "device": 17}"#),
            (R::InvalidDevice, r#""device": expected a string, got number 17"#.into())
        );
        assert_eq!(gateway(r#"{"ts": 1, "v": 1, "device": null}"#).0, R::InvalidDevice);
        assert_eq!(
            gateway(r#"{"ts": 1, "v": 1, "device": "a b"}"#),
            (
                R::InvalidDevice,
                "\"device\" \"a b\" is not allowed \
                 (1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a letter or digit)"
                    .into()
            )
        );
        assert_eq!(gateway(r#"{"ts": 1, "v": 1, "device": ""}"#).0, R::InvalidDevice);
        assert_eq!(
            gateway(r#"{"ts": 1, "v": 1, "device": ["truck_1"]}"#),
            (R::InvalidDevice, r#""device": expected a string, got array"#.into())
        );
        assert_eq!(
            gateway(r#"{"ts": 1, "v": 1, "device": "a\"b"}"#),
            (R::InvalidDevice, r#""device" "a\"b" is not allowed (1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a letter or digit)"#.into())
        );
        assert_eq!(
            reject(r#"{"ts": 1, "v": 1, "device": "e"}"#),
            (R::InvalidDevice, r#""device" "e" differs from the device "d" named by the topic"#.into())
        );
    }

    #[test]
    fn invalid_json() {
        assert_eq!(
            reject(r#"{"ts": 1, "v": 1"#),
            (R::InvalidJson, "invalid JSON at line 1, column 16: EOF while parsing an object".into())
        );
        // Line protocol sent where JSON is read is named (a comment line before it too); what
        // merely is not JSON is not.
        for lp in ["weather,name=s7 temp=21.5 1704153000000", "# sensors\nm v=1i"] {
            let (reason, detail) = reject(lp);
            assert_eq!(reason, R::InvalidJson);
            assert!(detail.ends_with(LINE_PROTOCOL_HINT), "{detail}");
        }
        for not_lp in ["hello world", "v=1", "1 v=2", "{\"v\" 1}"] {
            assert!(!reject(not_lp).1.contains("line protocol?"), "{not_lp}");
        }
        assert_eq!(
            reject("[{\"ts\": 1,\n  \"v\": 1,}]"),
            (R::InvalidJson, "invalid JSON at line 2, column 10: trailing comma".into())
        );
        // What serde_json rejects inside an array element voids the whole message too; an error in
        // a `ts` string is placed at the string's end.
        assert_eq!(
            reject("[{\"ts\": 1, \"v\": 1},\n {\"ts\": 2, \"v\": 1e400}]"),
            (R::InvalidJson, "invalid JSON at line 2, column 21: number out of range".into())
        );
        assert_eq!(
            reject("[{\"ts\": 1, \"v\": 1},\n   {\"ts\": \"\\ud800x\", \"v\": 1}]"),
            (R::InvalidJson, "invalid JSON at line 2, column 19: unexpected end of hex escape".into())
        );
        // A zero-byte message (clearing a retained message) is no reading and no dead letter,
        // on a device topic and on the line-protocol one; white space is an empty payload.
        for topic in ["hourglass/t/d", "hourglass/lp"] {
            let b = decode(topic, "");
            assert_eq!((b.readings.len(), b.dead_letters.len()), (0, 0), "{topic}");
        }
        assert_eq!(reject(" \n"), (R::InvalidJson, "empty payload".into()));
        let b = decode_json(&WireConfig::default(), "kafka:t/0@1", "t", None, b"", RECEIVED);
        assert_eq!(only_dead(&b).detail, "empty payload");
        for payload in [
            r#"{"ts": 1, "v": 1} x"#,
            r#"{"ts": 1, "v": 01}"#,
            r#"{"ts": 1, "v": 1.}"#,
            r#"{"ts": 1, "v": .5}"#,
            r#"{"ts": 1, "v": +1}"#,
            r#"{"ts": 1, "v": NaN}"#,
            r#"{'ts': 1}"#,
            r#"{"ts": 1, "v": "\x"}"#,
            r#"{"ts": 1, "v": "\ud800"}"#,
            r#"{"ts": 1, "v": "\udc00"}"#,
            "{\"ts\": 1, \"v\": \"a\tb\"}",
            r#"{"ts": 1, "v": tru}"#,
            r#"[{"ts": 1, "v": 1}"#,
            r#"[{"ts": 1, "v": 1},]"#,
            "\u{feff}{\"ts\": 1, \"v\": 1}",
        ] {
            assert_eq!(reason(payload), R::InvalidJson, "{payload:?}");
        }
        let batch = decode_mqtt(&WireConfig::default(), "hourglass/t/d", b"{\"ts\": 1, \"v\": \"\xff\"}", 0);
        assert_eq!(only_dead(&batch).detail, "payload is not UTF-8 (invalid byte at offset 16)");
    }

    #[test]
    fn a_syntax_error_anywhere_voids_the_whole_message() {
        let payload = r#"[{"ts": 1, "v": 1}, {"ts": 2, "v": "x"}, {"ts": 3, "v": 3} {"ts": 4, "v": 4}]"#;
        let dead = reject(payload);
        assert_eq!(dead.0, R::InvalidJson);
        let batch = decode("hourglass/t/d", payload);
        assert_eq!(batch.dead_letters[0].payload, payload.as_bytes());
    }

    #[test]
    fn nesting_is_limited_to_128_levels() {
        let nested = |depth: usize| format!(r#"{{"ts": 1, "v": 1, "x": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        // serde_json's limit stops at the 128th level (the hand-written reader allowed 128): the
        // reading object is level 1, so 126 arrays inside it still fit and the 127th `[` is the error.
        assert_eq!(reason(&nested(126)), R::NonNumericField);
        assert_eq!(
            reject(&nested(127)),
            (R::InvalidJson, "invalid JSON at line 1, column 150: recursion limit exceeded".into())
        );
        // In an array the reading object is level 2.
        assert_eq!(reason(&format!("[{}]", nested(125))), R::NonNumericField);
        assert_eq!(reason(&format!("[{}]", nested(126))), R::InvalidJson);
        // Deep enough to overflow the stack if the limit were missing.
        assert_eq!(reason(&"[".repeat(100_000)), R::InvalidJson);
        assert_eq!(reason(&format!("[{}]", "[".repeat(100_000))), R::InvalidJson);
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(reason(&deep), R::InvalidJson);
    }

    #[test]
    fn values_no_rule_reads_are_still_checked() {
        for payload in [
            r#"{"ts": 1, "v": [1e400]}"#,
            r#"{"ts": 1, "v": [{"\udc00": 1}]}"#,
            r#"{"ts": 1, "v": [1], "w": "\ud800"}"#,
            r#"[{"ts": 1, "v": 1}, [1e400]]"#,
        ] {
            assert_eq!(reason(payload), R::InvalidJson, "{payload}");
        }
    }

    #[test]
    fn invalid_shapes() {
        for (payload, got) in
            [("42", "number 42"), (r#""x""#, r#"string "x""#), ("null", "null"), ("true", "bool true")]
        {
            assert_eq!(
                reject(payload),
                (R::InvalidShape, format!("expected a reading object or an array of reading objects, got {got}"))
            );
        }
        let batch = decode("hourglass/t/d", r#"[[{"ts": 1, "v": 1}], {"ts": 2, "v": 2}, null]"#);
        assert_eq!(batch.readings, vec![reading("t", "d", 2, &[("v", 2.0)])]);
        let dead: Vec<_> =
            batch.dead_letters.iter().map(|d| (d.reason, d.detail.as_str(), d.payload.as_slice())).collect();
        assert_eq!(
            dead,
            vec![
                (
                    R::InvalidShape,
                    "array element 0: expected a reading object, got array",
                    &br#"[{"ts": 1, "v": 1}]"#[..]
                ),
                (R::InvalidShape, "array element 2: expected a reading object, got null", &b"null"[..]),
            ]
        );
    }

    #[test]
    fn an_empty_array_is_an_empty_batch() {
        assert!(decode("hourglass/t/d", " [ ] ").is_empty());
    }

    #[test]
    fn missing_timestamps() {
        assert_eq!(reject(r#"{"v": 1}"#), (R::MissingTimestamp, r#"missing "ts""#.into()));
        assert_eq!(reject(r#"{"ts": null, "v": 1}"#), (R::MissingTimestamp, r#""ts" is null"#.into()));
    }

    #[test]
    fn invalid_timestamps() {
        for ts in [
            "1.5",
            "1700000000000.5",
            "1700000000000.0000001",
            "1e-3",
            "1e300",
            "-1e300",
            "123456789012345678901234567890",
            "\"1700000000000\"",
            "\"yesterday\"",
            "\"2024-01-01\"",
            "\"2024-01-01T00:00:00\"",
            "\"2024-02-30T00:00:00Z\"",
            "true",
            "{}",
            "[1]",
        ] {
            assert_eq!(ts_of(ts), Err(R::InvalidTimestamp), "{ts}");
        }
        assert_eq!(reject(r#"{"ts": 1.5, "v": 1}"#).1, r#""ts": 1.5 is not a whole number of milliseconds"#);
        assert_eq!(
            reject(r#"{"ts": true, "v": 1}"#).1,
            r#""ts": expected epoch milliseconds (a JSON number) or an RFC 3339 string, got bool true"#
        );
        assert_eq!(
            reject(r#"{"ts": "yesterday", "v": 1}"#).1,
            r#""ts": "yesterday" is not an RFC 3339 timestamp (premature end of input)"#
        );
        assert_eq!(reject(r#"{"ts": 1e300, "v": 1}"#).1, r#""ts": 1e300 is outside the accepted years 1900 to 2199"#);
    }

    #[test]
    fn timestamp_window_bounds_are_exact() {
        assert_eq!(ts_of(&MIN_TS.to_string()), Ok(MIN_TS));
        assert_eq!(ts_of(&(MIN_TS - 1).to_string()), Err(R::InvalidTimestamp));
        assert_eq!(ts_of(&(MAX_TS - 1).to_string()), Ok(MAX_TS - 1));
        assert_eq!(ts_of(&MAX_TS.to_string()), Err(R::InvalidTimestamp));
        assert_eq!(ts_of(r#""1900-01-01T00:00:00Z""#), Ok(MIN_TS));
        assert_eq!(ts_of(r#""1899-12-31T23:59:59.999Z""#), Err(R::InvalidTimestamp));
        assert_eq!(ts_of(r#""2199-12-31T23:59:59.999Z""#), Ok(MAX_TS - 1));
        assert_eq!(ts_of(r#""2200-01-01T00:00:00Z""#), Err(R::InvalidTimestamp));
        // An offset moves the instant across the bound.
        assert_eq!(ts_of(r#""1900-01-01T00:59:59.999+01:00""#), Err(R::InvalidTimestamp));
        assert_eq!(ts_of(r#""2199-12-31T23:00:00-01:00""#), Err(R::InvalidTimestamp));
    }

    #[test]
    fn numeric_timestamps() {
        assert_eq!(ts_of("0"), Ok(0));
        assert_eq!(ts_of("-0"), Ok(0));
        assert_eq!(ts_of("0.0e5"), Ok(0));
        assert_eq!(ts_of("-1"), Ok(-1));
        assert_eq!(ts_of("1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("1.7e12"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("1.7E+12"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("17e11"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("1700000000000.000"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("170000000000000e-2"), Ok(1_700_000_000_000));
        assert_eq!(ts_of("1700000000001.0"), Ok(1_700_000_000_001));
        assert_eq!(ts_of("-2.2e12"), Ok(-2_200_000_000_000));
    }

    #[test]
    fn rfc3339_timestamps() {
        assert_eq!(ts_of(r#""2024-01-01T00:00:00Z""#), Ok(1_704_067_200_000));
        assert_eq!(ts_of(r#""2024-01-01T01:00:00+01:00""#), Ok(1_704_067_200_000));
        assert_eq!(ts_of(r#""2023-12-31T19:30:00-04:30""#), Ok(1_704_067_200_000));
        assert_eq!(ts_of(r#""2024-01-01T00:00:00.123456Z""#), Ok(1_704_067_200_123));
        assert_eq!(ts_of(r#""1970-01-01T00:00:00Z""#), Ok(0));
        assert_eq!(ts_of(r#""1969-12-31T23:59:59.999Z""#), Ok(-1));
        // Sub-millisecond digits floor, also before 1970.
        assert_eq!(ts_of(r#""1969-12-31T23:59:59.9995Z""#), Ok(-1));
        assert_eq!(ts_of(r#""1969-12-31T23:59:59.000001Z""#), Ok(-1000));
        assert_eq!(ts_of(r#""1970-01-01T00:00:00.0009Z""#), Ok(0));
        assert_eq!(
            ts_of(r#""1950-06-15T12:00:00Z""#),
            Ok(model::days_from_civil(1950, 6, 15) * model::DAY_MS + 12 * model::HOUR_MS)
        );
        assert_eq!(ts_of(r#""1950-06-15T12:00:00Z""#), Ok(-616_852_800_000));
        // A space for the `T` is RFC 3339's too; a missing UTC offset is named.
        assert_eq!(ts_of(r#""2024-01-01 00:00:00Z""#), Ok(1_704_067_200_000));
        let no_offset = r#""ts": "2024-01-01 00:00:00" is not an RFC 3339 timestamp (premature end of input: it has no UTC offset; end it with Z, or one such as +02:00)"#;
        assert_eq!(reject(r#"{"ts": "2024-01-01 00:00:00", "v": 1}"#).1, no_offset);
    }

    #[test]
    fn booleans_and_strings_are_typed_values() {
        let long = "x".repeat(100);
        let batch = decode(
            "hourglass/t/d",
            &format!(r#"{{"ts": 1, "on": true, "off": false, "driver": "Bo \"B\" ü", "long": "{long}", "n": 2}}"#),
        );
        let expected: Vec<(FieldName, model::Value)> = vec![
            ("driver".into(), model::Value::from("Bo \"B\" ü")),
            ("long".into(), model::Value::from(long.as_str())),
            ("n".into(), model::Value::F64(2.0)),
            ("off".into(), model::Value::Bool(false)),
            ("on".into(), model::Value::Bool(true)),
        ];
        assert_eq!(only_reading(&batch).fields, expected);
    }

    #[test]
    fn non_numeric_fields() {
        for (value, got) in [(r#"{"x": 1}"#, "object"), ("[1, 2]", "array"), ("[]", "array")] {
            assert_eq!(
                reject(&format!(r#"{{"ts": 1, "speed": {value}}}"#)),
                (R::NonNumericField, format!(r#"field "speed": expected a number, a boolean or a string, got {got}"#))
            );
        }
        // serde_json rejects a number beyond the f64 range as invalid JSON.
        assert_eq!(
            reject(r#"{"ts": 1, "v": 1e400}"#),
            (R::InvalidJson, "invalid JSON at line 1, column 20: number out of range".into())
        );
    }

    #[test]
    fn field_values_are_parsed_exactly() {
        let batch = decode(
            "hourglass/t/d",
            r#"{"ts": 1, "a": 0.1, "b": -0.0, "c": 1e-320, "d": 1.7976931348623157e308, "e": 123456789012345678901234567890, "f": 5e-324}"#,
        );
        let fields = &only_reading(&batch).fields;
        let expected = [0.1, -0.0, 1e-320, f64::MAX, 123456789012345678901234567890.0, 5e-324];
        let got: Vec<u64> = fields.iter().map(|(_, v)| v.as_number().map(f64::to_bits).expect("a number")).collect();
        assert_eq!(got, expected.map(f64::to_bits));
    }

    fn only_reading(batch: &IngestBatch) -> &Reading {
        assert!(batch.dead_letters.is_empty(), "{:?}", batch.dead_letters);
        assert_eq!(batch.readings.len(), 1);
        &batch.readings[0].reading
    }

    #[test]
    fn null_fields_are_absent() {
        let batch = decode("hourglass/t/d", r#"{"ts": 1, "a": null, "b": 2}"#);
        assert_eq!(batch.readings, vec![reading("t", "d", 1, &[("b", 2.0)])]);
        assert_eq!(only_reading(&batch).get("a"), None);
    }

    #[test]
    fn invalid_field_names() {
        let long = "f".repeat(65);
        for name in ["", "1a", "a-b", "a.b", "a b", "ä", "TS:", long.as_str(), "period", "devices", "periods"] {
            let payload = serde_json::json!({"ts": 1, name: 1}).to_string();
            assert_eq!(reason(&payload), R::InvalidFieldName, "{name:?}");
        }
        assert_eq!(
            reject(r#"{"ts": 1, "1a": 1}"#),
            (R::InvalidFieldName, format!("field name \"1a\" is not allowed ({FIELD_RULE})"))
        );
        let longest = "f".repeat(64);
        let ok = serde_json::json!({"ts": 1, "_x": 1, "TS": 2, "Device": 3, longest.as_str(): 4}).to_string();
        assert_eq!(only_reading(&decode("hourglass/t/d", &ok)).fields.len(), 4);
        // Escapes in names are decoded first.
        let escaped = decode("hourglass/t/d", r#"{"\u0074s": 9, "\u0073peed": 1}"#);
        assert_eq!(escaped.readings, vec![reading("t", "d", 9, &[("speed", 1.0)])]);
    }

    #[test]
    fn readings_without_fields() {
        assert_eq!(reject(r#"{"ts": 1}"#), (R::NoFields, "reading has no field values".into()));
        assert_eq!(reason(r#"{"ts": 1, "a": null}"#), R::NoFields);
        assert_eq!(reason(r#"{"ts": 1, "device": "d"}"#), R::NoFields);
        let batch = decode("hourglass/t", r#"{"ts": 1, "device": "d"}"#);
        assert_eq!(only_dead(&batch).reason, R::NoFields);
        assert_eq!(reason("{}"), R::MissingTimestamp);
    }

    #[test]
    fn duplicate_members_last_value_wins_but_each_is_checked() {
        let batch = decode("hourglass/t/d", r#"{"ts": 1, "a": 1, "a": 2, "ts": 5}"#);
        assert_eq!(batch.readings, vec![reading("t", "d", 5, &[("a", 2.0)])]);
        // `null` is a last value too: the field is absent.
        let batch = decode("hourglass/t/d", r#"{"ts": 1, "a": 1, "b": 3, "a": null}"#);
        assert_eq!(batch.readings, vec![reading("t", "d", 1, &[("b", 3.0)])]);
        assert_eq!(reason(r#"{"ts": 1, "a": [], "a": 2}"#), R::NonNumericField);
        assert_eq!(reason(r#"{"ts": 1, "ts": null, "a": 1}"#), R::MissingTimestamp);
        assert_eq!(reason(r#"{"ts": "bad", "ts": 1, "a": 1}"#), R::InvalidTimestamp);
        let batch = decode("hourglass/t", r#"{"ts": 1, "a": 1, "device": "x", "device": "y"}"#);
        assert_eq!(batch.readings, vec![reading("t", "y", 1, &[("a", 1.0)])]);
    }

    #[test]
    fn the_first_problem_in_document_order_decides() {
        assert_eq!(reason(r#"{"ts": 1, "a": [], "1b": 2}"#), R::NonNumericField);
        assert_eq!(reason(r#"{"ts": 1, "1b": 2, "a": []}"#), R::InvalidFieldName);
        assert_eq!(reason(r#"{"a": [], "ts": "bad"}"#), R::NonNumericField);
        assert_eq!(reason(r#"{"ts": "bad", "a": []}"#), R::InvalidTimestamp);
        assert_eq!(reason(r#"{"device": "e", "ts": "bad"}"#), R::InvalidDevice);
        // Found only at the end of the object: missing ts, then missing device, then no fields.
        assert_eq!(reason(r#"{"a": []}"#), R::NonNumericField);
        let batch = decode("hourglass/t", "{}");
        assert_eq!(only_dead(&batch).reason, R::MissingTimestamp);
        let batch = decode("hourglass/t", r#"{"ts": 1}"#);
        assert_eq!(only_dead(&batch).reason, R::InvalidDevice);
        // Whole-message checks come first: size, topic, table, device, JSON.
        let batch = decode("hourglass/t+/d+", "not json");
        assert_eq!(only_dead(&batch).reason, R::InvalidTable);
        let batch = decode("hourglass/t/d+", "not json");
        assert_eq!(only_dead(&batch).reason, R::InvalidDevice);
    }

    #[test]
    fn name_rules() {
        assert!(valid_table_name("fleet.readings-2_b"));
        assert!(valid_table_name("0"));
        assert!(!valid_table_name(""));
        assert!(!valid_table_name("a:b"));
        assert!(valid_device_name("gw-3:sensor.2_a"));
        assert!(!valid_device_name(".a"));
        assert!(!valid_device_name("a/b"));
        assert!(valid_field_name("_"));
        assert!(valid_field_name("a1"));
        assert!(!valid_field_name("ts"));
        assert!(!valid_field_name("device"));
        assert!(!valid_field_name("9"));
        assert!(!valid_field_name("a.b"));
    }

    #[test]
    fn timestamp_params() {
        // 2024-01-01T00:00:00Z.
        const NOW: i64 = 1_704_067_200_000;
        let parse = |s: &str| parse_timestamp_param(s, NOW);
        assert_eq!(parse("1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(parse("-5"), Ok(-5));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("2024-01-01T01:00:00+01:00"), Ok(1_704_067_200_000));
        assert_eq!(parse("1969-12-31T23:59:59.9999Z"), Ok(-1));
        assert_eq!(parse(&MIN_TS.to_string()), Ok(MIN_TS));
        assert_eq!(parse(&MAX_TS.to_string()), Ok(MAX_TS));
        assert_eq!(parse("2200-01-01T00:00:00Z"), Ok(MAX_TS));
        assert_eq!(
            parse(&(MAX_TS + 1).to_string()),
            Err(r#""7258118400001" is outside the accepted years 1900 to 2199"#.into())
        );
        assert!(parse(&(MIN_TS - 1).to_string()).is_err());
        assert_eq!(
            parse("99999999999999999999"),
            Err(r#""99999999999999999999" is out of range of epoch milliseconds"#.into())
        );
        assert_eq!(
            parse("yesterday"),
            Err(r#""yesterday" is neither epoch milliseconds, an RFC 3339 timestamp such as 2024-01-01T00:00:00Z, nor relative to now such as now-15m"#.into())
        );
        assert_eq!(
            parse("2024-13-01T00:00:00Z"),
            Err(r#""2024-13-01T00:00:00Z" is neither epoch milliseconds, an RFC 3339 timestamp such as 2024-01-01T00:00:00Z, nor relative to now such as now-15m (input is out of range)"#.into())
        );
        // A date and time without its UTC offset: named.
        assert_eq!(
            parse("2024-01-01T00:00:00"),
            Err(r#""2024-01-01T00:00:00" is neither epoch milliseconds, an RFC 3339 timestamp such as 2024-01-01T00:00:00Z, nor relative to now such as now-15m (premature end of input: it has no UTC offset; end it with Z, or one such as +02:00)"#.into())
        );
        // An epoch with a fraction is no date: no chrono reason ("premature end of input").
        assert_eq!(
            parse("1704067200000.5"),
            Err(r#""1704067200000.5" is neither epoch milliseconds, an RFC 3339 timestamp such as 2024-01-01T00:00:00Z, nor relative to now such as now-15m"#.into())
        );
        for bad in ["", "-", "+5", " 5", "1.5", "1e3", "2024-01-01"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Relative to now, in every unit; past the window as any other time.
        assert_eq!(parse("now"), Ok(NOW));
        assert_eq!(parse("now-15m"), Ok(NOW - 15 * 60_000));
        assert_eq!(parse("now+1h"), Ok(NOW + 3_600_000));
        assert_eq!(parse("now-250ms"), Ok(NOW - 250));
        assert_eq!(parse("now-90s"), Ok(NOW - 90_000));
        assert_eq!(parse("now-2d"), Ok(NOW - 2 * 86_400_000));
        assert_eq!(parse("now+2w"), Ok(NOW + 14 * 86_400_000));
        // A duration of none is now.
        assert_eq!((parse("now-0s"), parse("now+00h"), parse("now-0ms")), (Ok(NOW), Ok(NOW), Ok(NOW)));
        assert_eq!(
            parse("now-9223372036854775807ms"),
            Err(format!(r#""now-9223372036854775807ms" is {OUTSIDE_WINDOW}"#))
        );
        assert_eq!(parse("now+200000w"), Err(format!(r#""now+200000w" is {OUTSIDE_WINDOW}"#)));
        // Too long for milliseconds (or for 64 bits) is past the window too, not another form.
        for far in ["now-9999999999999w", "now+99999999999999999999ms"] {
            assert_eq!(parse(far), Err(format!("{far:?} is {OUTSIDE_WINDOW}")), "{far}");
        }
        assert_eq!(parse("now-00000000000000000000001w"), Ok(NOW - 7 * 86_400_000));
        let not_relative = |s: &str| {
            format!(
                "{s:?} is not `now` nor `now` less or plus a duration such as now-15m (a whole number of ms, s, m, h, \
                 d or w)"
            )
        };
        for bad in [
            "now-", "now-15", "now-15x", "now-1.5h", "now-0", "now-0x", "now*2", "now-+1h", "now--1h", "nowhere",
            "now€", "now-1€",
        ] {
            assert_eq!(parse(bad), Err(not_relative(bad)), "{bad:?}");
        }
        let plus = "; a `+` in a query string reads as a space: send it as %2B";
        assert_eq!(parse("now 15m"), Err(not_relative("now 15m") + plus));
        // An offset's `+` too.
        let spaced = "2024-01-02T01:00:00 02:00";
        let err = parse(spaced).expect_err("a space for the offset's +");
        assert!(err.starts_with(&format!("{spaced:?} is neither epoch milliseconds")) && err.ends_with(plus), "{err}");
        assert_eq!(parse("2024-01-02T01:00:00+02:00"), Ok(1_704_150_000_000));
        assert!(parse("NOW").is_err());
    }

    /// Decodes a JSON string literal (with its quotes) as a field value, returning the stored
    /// string as a dead letter's detail would quote it (see [`preview`]), or `None` if it is not
    /// valid JSON.
    fn json_string(literal: &str) -> Option<String> {
        let batch = decode("hourglass/t/d", &format!(r#"{{"ts": 1, "v": {literal}}}"#));
        if batch.dead_letters.first().is_some_and(|d| d.reason == R::InvalidJson) {
            return None;
        }
        match only_reading(&batch).get("v") {
            Some(model::Value::Str(s)) => Some(preview(s)),
            other => panic!("not a string value: {other:?}"),
        }
    }

    #[test]
    fn string_escapes() {
        let q = |s: &str| Some(preview(s));
        assert_eq!(json_string(r#""a\"\\\/\b\f\n\r\tz""#), q("a\"\\/\u{8}\u{c}\n\r\tz"));
        assert_eq!(json_string(r#""\u00e9\u00E9\ud83d\ude00""#), q("éé😀"));
        assert_eq!(json_string(r#""plain ü""#), q("plain ü"));
        assert_eq!(json_string(r#""\ud83d""#), None);
        assert_eq!(json_string(r#""\ud83d\u0041""#), None);
        assert_eq!(json_string(r#""\u12""#), None);
        assert_eq!(json_string("\"a\u{1f}\""), None);
        assert_eq!(json_string("\"a\u{7f}\""), q("a\u{7f}"));
        // Escaped names and devices are decoded before they are checked.
        let batch = decode("hourglass/t", r#"{"\u0074s": 9, "\u0064evice": "\u0064\u0031", "v": 1}"#);
        assert_eq!(batch.readings, vec![reading("t", "d1", 9, &[("v", 1.0)])]);
    }

    /// Every character as a `\u` escape (surrogate pairs above U+FFFF).
    fn escape_all(s: &str, upper: bool) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                if upper {
                    out.push_str(&format!("\\u{unit:04X}"));
                } else {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        out.push('"');
        out
    }

    /// A valid reading to encode: the device, ts, whether ts is written as RFC 3339 (with an
    /// offset in minutes), and its fields.
    #[derive(Debug, Clone)]
    struct Sample {
        device: String,
        ts: i64,
        rfc3339_offset_min: Option<i32>,
        fields: BTreeMap<String, f64>,
    }

    fn field_value() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>().prop_filter("finite", |v| v.is_finite()),
            -1e6..1e6f64,
            (-100_000i64..100_000).prop_map(|i| i as f64 / 100.0),
        ]
    }

    fn sample() -> impl Strategy<Value = Sample> {
        (
            "[a-zA-Z0-9][a-zA-Z0-9_.:-]{0,127}",
            MIN_TS..MAX_TS,
            proptest::option::of(-1439i32..=1439),
            proptest::collection::btree_map(
                "[a-zA-Z_][a-zA-Z0-9_]{0,63}".prop_filter("reserved", |n| !RESERVED_FIELD_NAMES.contains(&n.as_str())),
                field_value(),
                1..8,
            ),
        )
            .prop_map(|(device, ts, rfc3339_offset_min, fields)| Sample {
                device,
                ts,
                rfc3339_offset_min,
                fields,
            })
    }

    fn encode(sample: &Sample, with_device: bool) -> serde_json::Value {
        let mut object = serde_json::Map::new();
        let ts = match sample.rfc3339_offset_min {
            None => serde_json::Value::from(sample.ts),
            Some(minutes) => {
                let utc = DateTime::from_timestamp_millis(sample.ts).expect("in chrono's range");
                let offset = chrono::FixedOffset::east_opt(minutes * 60).expect("under a day");
                let text = utc.with_timezone(&offset).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
                serde_json::Value::from(text)
            }
        };
        object.insert("ts".into(), ts);
        if with_device {
            object.insert("device".into(), sample.device.clone().into());
        }
        for (name, value) in &sample.fields {
            object.insert(name.clone(), serde_json::Value::from(*value));
        }
        serde_json::Value::Object(object)
    }

    fn expected(table: &str, device: &str, sample: &Sample) -> DeviceReading {
        let fields = sample.fields.iter().map(|(n, v)| (FieldName::from(n.as_str()), *v)).collect();
        DeviceReading { table: table.into(), device: device.into(), reading: Reading::new(sample.ts, fields) }
    }

    fn bits(readings: &[DeviceReading]) -> Vec<Vec<u64>> {
        readings
            .iter()
            .map(|r| r.reading.fields.iter().map(|(_, v)| v.as_number().map(f64::to_bits).expect("a number")).collect())
            .collect()
    }

    /// A JSON value of any shape, a few levels deep.
    fn any_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            field_value().prop_map(serde_json::Value::from),
            any::<String>().prop_map(serde_json::Value::from),
            Just(serde_json::Value::from("ts")),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
                proptest::collection::vec((prop_oneof!["ts|device|v|[a-z]{1,3}", any::<String>()], inner), 0..5)
                    .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn valid_readings_round_trip_exactly(
            table in "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}",
            samples in proptest::collection::vec(sample(), 1..6),
            gateway in any::<bool>(),
            repeat_device in any::<bool>(),
            pretty in any::<bool>(),
        ) {
            let device = samples[0].device.clone();
            let (topic, want): (String, Vec<DeviceReading>) = if gateway {
                (format!("hourglass/{table}"), samples.iter().map(|s| expected(&table, &s.device, s)).collect())
            } else {
                (format!("hourglass/{table}/{device}"), samples.iter().map(|s| expected(&table, &device, s)).collect())
            };
            let values: Vec<serde_json::Value> = samples
                .iter()
                .map(|s| {
                    let s = Sample { device: device.clone(), ..s.clone() };
                    let named = if gateway { samples.iter().find(|x| x.ts == s.ts).map_or(&s, |x| x) } else { &s };
                    encode(named, gateway || repeat_device)
                })
                .collect();
            let doc = if values.len() == 1 && !pretty { values[0].clone() } else { serde_json::Value::Array(values) };
            let payload = if pretty { serde_json::to_string_pretty(&doc) } else { serde_json::to_string(&doc) }
                .expect("serializable");
            let batch = decode_mqtt(&WireConfig::default(), &topic, payload.as_bytes(), 0);
            prop_assert!(batch.dead_letters.is_empty(), "{:?}\n{}", batch.dead_letters, payload);
            prop_assert_eq!(bits(&batch.readings), bits(&want));
            prop_assert_eq!(batch.readings, want);
        }

        #[test]
        fn the_json_reader_agrees_with_serde_json(
            doc in any_json(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, proptest::sample::select(
                b"{}[],:\"\\ 0123456789.eE+-tnrufalsxu".to_vec())), 0..3),
        ) {
            let mut bytes = serde_json::to_vec(&doc).expect("serializable");
            for (at, op, b) in edits {
                let i = at.index(bytes.len() + 1);
                match op {
                    0 if i < bytes.len() => { bytes.remove(i); }
                    1 if i < bytes.len() => bytes[i] = b,
                    _ => bytes.insert(i, b),
                }
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let theirs = serde_json::from_str::<serde_json::Value>(&text);
            if let Err(e) = &theirs {
                prop_assume!(!e.to_string().contains("number out of range"));
            }
            // As a device topic's message would be (where a zero-byte one is skipped instead).
            let batch = decode_json(&WireConfig::default(), "hourglass/t/d", "t", Some(b"d"), text.as_bytes(), RECEIVED);
            let ours = !batch.dead_letters.iter().any(|d| d.reason == R::InvalidJson);
            prop_assert_eq!(ours, theirs.is_ok(), "{:?}: {:?}", text, batch.dead_letters);
        }

        #[test]
        fn strings_decode_like_serde_json(s in any::<String>(), upper in any::<bool>()) {
            let encoded = serde_json::to_string(&s).expect("serializable");
            prop_assert_eq!(json_string(&encoded), Some(preview(&s)));
            prop_assert_eq!(json_string(&escape_all(&s, upper)), Some(preview(&s)));
        }

        #[test]
        fn any_input_decodes_without_panicking(
            topic in "(hourglass|x)(/[a-z_+.]{0,3}){0,4}",
            payload in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let batch = decode_mqtt(&WireConfig::default(), &topic, &payload, 0);
            // Only a zero-byte message (clearing a retained one) is nothing.
            prop_assert_eq!(batch.is_empty(), payload.is_empty());
        }
    }
}
