//! InfluxDB line protocol: payload text → typed [`Line`]s, one result per line.
//!
//! This module owns the grammar of line protocol as the InfluxDB v1 and v2 references describe
//! it (syntax, data types, quoting, special characters and escaping, comments) and the
//! conversion of its timestamps to epoch milliseconds. It is a pure parser: no I/O, no
//! allocation beyond the [`Line`]s it returns and the names and strings that needed unescaping,
//! and no knowledge of tables, devices, name rules or the accepted time window. Mapping a
//! [`Line`] to readings (measurement → table, a tag → device, the `wire` name rules, the
//! 1900–2200 window) is the caller's job.
//!
//! [`parse_lines`] yields one `Result<Line, LineError>` per line that is neither blank nor a
//! comment, in payload order. A bad line yields a [`LineError`] with its 1-based line number and
//! a precise reason, and does not stop the lines after it.
//!
//! # Grammar
//!
//! ```text
//! <measurement>[,<tag_key>=<tag_value>...] <field_key>=<field_value>[,<field_key>=<field_value>...] [<timestamp>]
//! ```
//!
//! * Lines end at `\n`. Spaces, tabs and carriage returns at the start and end of a line are
//!   ignored, so CRLF payloads read like LF ones. A line whose first other character is `#` is
//!   a comment. Blank lines and comments yield nothing but still count for line numbers.
//! * The three sections are separated by one or more spaces. Tags are optional; a tag value
//!   cannot be empty, and a tag key given twice is an error. At least one field is required; a
//!   field key given twice keeps the position of its first occurrence and the value of its
//!   last ("last wins").
//! * Field values ([`FieldValue`]): a float (`1`, `1.0`, `1.`, `.5`, `-1.234e+10`, `1E5`; NaN
//!   and infinities are rejected, and so is a value beyond the `f64` range), an integer with a
//!   trailing `i` (`-9223372036854775808i` to `9223372036854775807i`), an unsigned integer with
//!   a trailing `u` (`0u` to `18446744073709551615u`), a boolean (`t`, `T`, `true`, `True`,
//!   `TRUE`, `f`, `F`, `false`, `False`, `FALSE`), or a double-quoted string.
//! * Strings (names, tag values and string field values) hold at most [`MAX_STRING_BYTES`]
//!   bytes after unescaping.
//! * The timestamp is an optional signed integer in the payload's [`Precision`]; a line without
//!   one takes the caller's `now_ms`.
//!
//! # Escaping
//!
//! | element                        | a backslash escapes                   |
//! |--------------------------------|---------------------------------------|
//! | measurement                    | comma, space, backslash               |
//! | tag key, tag value, field key  | comma, equals sign, space, backslash  |
//! | string field value             | double quote, backslash               |
//!
//! A backslash before any other character, or at the end of an element, is a literal
//! backslash: `field_k\ey` is the key `field_k\ey`. Two backslashes are one backslash, as the
//! reference's table has it (`\\\` reads as `\\`). Double and single quotes in names and tag
//! values are ordinary characters. An unescaped `=` in a tag value is taken literally. A newline
//! cannot be part of any value: it always ends the line.
//!
//! Names and values that contain no escape are borrowed from the payload ([`Cow::Borrowed`]);
//! only those with an escape are copied.
//!
//! Naming rules are not the grammar's business and are not checked here: InfluxDB's reserved
//! `_` prefix and `time` key, and Hourglass's own table, device and field name rules, belong to
//! whoever maps lines to readings.
//!
//! # Speed
//!
//! The parser reads each byte about once, with no separate pass to split lines: delimiters
//! are found eight bytes at a time (SWAR), the usual numbers (`-?d+`, `-?d+.d*`, `d+i`,
//! `d+u`, up to 19 digits) are converted while they are read, and timestamps eight digits at a
//! time; anything else goes through a general path (`f64::from_str` for floats). Apart from
//! the unescaped copies, a line costs two allocations (its tag and field vectors). A caller
//! that knows a line's series key and expects its field keys has it read with none
//! ([`Lines::next_expecting`]): the keys are matched byte for byte and the values read in the
//! same pass. The criterion benchmark `cargo bench -p ingest --bench lineproto` measures
//! TSBS-style lines.
//!
//! # Bytes that are not UTF-8
//!
//! The parser takes `&str`. A caller holding bytes checks them with [`payload_str`], whose
//! [`NotUtf8`] error names the offset and line of the first invalid byte; then [`utf8_lines`]
//! gives the payload with the lines that are not UTF-8 left empty (every other line keeps its
//! number), and where each of those goes wrong, so that only they are refused.
//!
//! ```
//! use ingest::lineproto::{parse_lines, FieldValue, Precision};
//!
//! let payload = "# fleet\n\
//!                readings,name=truck_0,fleet=South velocity=3.5,heading=221i 1451606400000000000\n\
//!                readings,name=truck_1 velocity=12..5\n";
//! let mut lines = parse_lines(payload, Precision::Nanoseconds, 0);
//!
//! let line = lines.next().unwrap().unwrap();
//! assert_eq!(line.number, 2);
//! assert_eq!(line.measurement, "readings");
//! assert_eq!(line.tag("name"), Some("truck_0"));
//! assert_eq!(line.field("heading"), Some(&FieldValue::Int(221)));
//! assert_eq!(line.timestamp_ms, 1_451_606_400_000);
//!
//! let error = lines.next().unwrap().unwrap_err();
//! assert_eq!(error.to_string(), "line 3: field `velocity`: invalid number `12..5`");
//! assert!(lines.next().is_none());
//! ```

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Longest string (measurement, key, tag value or string field value) accepted, in bytes after
/// unescaping: 64 KiB, the limit of the line protocol reference.
pub const MAX_STRING_BYTES: usize = 64 << 10;

/// Longest excerpt of the input quoted in an error reason, in characters.
const PREVIEW_CHARS: usize = 64;

/// Up to this many keys, duplicates are looked for pairwise; beyond, with a hash set, so that a
/// line with thousands of fields stays linear.
const PAIRWISE_KEYS: usize = 16;

/// The unit of the timestamps of a payload. Default: nanoseconds, as in InfluxDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Precision {
    /// Nanoseconds (`ns`).
    #[default]
    #[serde(rename = "ns")]
    Nanoseconds,
    /// Microseconds (`us`).
    #[serde(rename = "us")]
    Microseconds,
    /// Milliseconds (`ms`).
    #[serde(rename = "ms")]
    Milliseconds,
    /// Seconds (`s`).
    #[serde(rename = "s")]
    Seconds,
    /// Minutes (`m`; InfluxDB 1's write API).
    #[serde(rename = "m")]
    Minutes,
    /// Hours (`h`; InfluxDB 1's write API).
    #[serde(rename = "h")]
    Hours,
}

impl Precision {
    /// Every precision.
    pub const ALL: [Precision; 6] = [
        Precision::Nanoseconds,
        Precision::Microseconds,
        Precision::Milliseconds,
        Precision::Seconds,
        Precision::Minutes,
        Precision::Hours,
    ];

    /// The label InfluxDB's write API uses: `ns`, `us`, `ms`, `s`, or InfluxDB 1's `m`, `h`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Nanoseconds => "ns",
            Precision::Microseconds => "us",
            Precision::Milliseconds => "ms",
            Precision::Seconds => "s",
            Precision::Minutes => "m",
            Precision::Hours => "h",
        }
    }

    /// Inverse of [`Precision::as_str`].
    pub fn parse(label: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.as_str() == label)
    }

    /// Converts a timestamp in this precision to epoch milliseconds.
    ///
    /// Finer precisions round toward negative infinity (`div_euclid`), so every instant maps to
    /// the millisecond that contains it: `-1` ns is `-1` ms, `1_999_999` ns is `1` ms. Seconds
    /// are multiplied by 1000 (minutes by 60,000, hours by 3,600,000); `None` when that
    /// overflows `i64`.
    pub fn to_epoch_ms(self, timestamp: i64) -> Option<i64> {
        match self {
            Precision::Nanoseconds => Some(timestamp.div_euclid(1_000_000)),
            Precision::Microseconds => Some(timestamp.div_euclid(1_000)),
            Precision::Milliseconds => Some(timestamp),
            Precision::Seconds => timestamp.checked_mul(1_000),
            Precision::Minutes => timestamp.checked_mul(60_000),
            Precision::Hours => timestamp.checked_mul(3_600_000),
        }
    }
}

/// A field value with its line protocol type.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// A float: `1`, `-1.234e+10`. Always finite.
    Float(f64),
    /// An integer: `-12i`.
    Int(i64),
    /// An unsigned integer: `12u`.
    UInt(u64),
    /// A boolean: `t`, `FALSE`, ….
    Bool(bool),
    /// A double-quoted string, unescaped.
    Str(Cow<'a, str>),
}

impl FieldValue<'_> {
    /// The type's name in the line protocol reference: `float`, `integer`, `uinteger`,
    /// `boolean` or `string`.
    pub fn type_name(&self) -> &'static str {
        match self {
            FieldValue::Float(_) => "float",
            FieldValue::Int(_) => "integer",
            FieldValue::UInt(_) => "uinteger",
            FieldValue::Bool(_) => "boolean",
            FieldValue::Str(_) => "string",
        }
    }

    /// This value, no longer borrowing from the payload.
    pub fn into_owned(self) -> FieldValue<'static> {
        match self {
            FieldValue::Float(v) => FieldValue::Float(v),
            FieldValue::Int(v) => FieldValue::Int(v),
            FieldValue::UInt(v) => FieldValue::UInt(v),
            FieldValue::Bool(v) => FieldValue::Bool(v),
            FieldValue::Str(s) => FieldValue::Str(Cow::Owned(s.into_owned())),
        }
    }
}

/// One parsed line (one point).
#[derive(Debug, Clone, PartialEq)]
pub struct Line<'a> {
    /// 1-based number of the line in its payload, comments and blank lines included.
    pub number: usize,
    /// The measurement, unescaped.
    pub measurement: Cow<'a, str>,
    /// Tag keys and values, unescaped, in the order of the line. Keys are distinct.
    pub tags: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Field keys and values in the order of the line; never empty. Keys are distinct.
    pub fields: Vec<(Cow<'a, str>, FieldValue<'a>)>,
    /// The timestamp in epoch milliseconds (see [`Precision::to_epoch_ms`]), or the caller's
    /// `now_ms` when the line has none.
    pub timestamp_ms: i64,
    /// Whether the line has a timestamp (else `timestamp_ms` is the caller's `now_ms`).
    pub timestamped: bool,
}

impl<'a> Line<'a> {
    /// The value of tag `key`.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// The value of field `key`.
    pub fn field(&self, key: &str) -> Option<&FieldValue<'a>> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// This line, no longer borrowing from the payload.
    pub fn into_owned(self) -> Line<'static> {
        let owned = |s: Cow<'_, str>| Cow::Owned(s.into_owned());
        Line {
            number: self.number,
            measurement: owned(self.measurement),
            tags: self.tags.into_iter().map(|(k, v)| (owned(k), owned(v))).collect(),
            fields: self.fields.into_iter().map(|(k, v)| (owned(k), v.into_owned())).collect(),
            timestamp_ms: self.timestamp_ms,
            timestamped: self.timestamped,
        }
    }
}

/// What kind of problem made a line invalid, for callers that classify rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineErrorKind {
    /// The structure is wrong: a missing or empty measurement, key or tag value, a missing
    /// `=`, an unclosed string, a duplicate tag key, a string over [`MAX_STRING_BYTES`].
    Syntax,
    /// A field value is not a valid number, integer, unsigned integer or boolean, or is out of
    /// its type's range.
    FieldValue,
    /// The line has no field.
    NoFields,
    /// The timestamp is not an integer, or is out of range.
    Timestamp,
}

/// Why one line of a payload was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// 1-based line number in the payload.
    pub line: usize,
    /// The class of the problem.
    pub kind: LineErrorKind,
    /// The reason, naming the element and quoting the offending text (cut to 64 characters),
    /// e.g. ``field `temp`: invalid number `12..5` ``.
    pub reason: String,
}

/// A payload that is not UTF-8, rejected as a whole by [`payload_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payload is not UTF-8: invalid byte at offset {offset} (line {line})")]
pub struct NotUtf8 {
    /// Byte offset of the first invalid byte.
    pub offset: usize,
    /// 1-based line holding that byte.
    pub line: usize,
}

/// The payload as text for [`parse_lines`], or where its first invalid UTF-8 byte is.
pub fn payload_str(payload: &[u8]) -> Result<&str, NotUtf8> {
    // The SIMD check first (several times the standard library's speed on these bodies); the
    // standard one finds where a payload that fails it goes wrong.
    if let Ok(text) = simdutf8::basic::from_utf8(payload) {
        return Ok(text);
    }
    std::str::from_utf8(payload).map_err(|e| {
        let offset = e.valid_up_to();
        NotUtf8 { offset, line: 1 + payload[..offset].iter().filter(|&&b| b == b'\n').count() }
    })
}

/// `payload` with each line that is not UTF-8 left empty (its newline kept, so that every line
/// keeps its number), and the first invalid byte of each such line, in line order. For a
/// payload [`payload_str`] refuses, so that its other lines are read.
pub fn utf8_lines(payload: &[u8]) -> (String, Vec<NotUtf8>) {
    let mut text = String::with_capacity(payload.len());
    let mut bad = Vec::new();
    let mut start = 0;
    for (i, line) in payload.split_inclusive(|&b| b == b'\n').enumerate() {
        match std::str::from_utf8(line) {
            Ok(line) => text.push_str(line),
            Err(e) => {
                bad.push(NotUtf8 { offset: start + e.valid_up_to(), line: i + 1 });
                if line.ends_with(b"\n") {
                    text.push('\n');
                }
            }
        }
        start += line.len();
    }
    (text, bad)
}

/// Parses every line of `payload` whose timestamps are in `precision`; a line without a
/// timestamp gets `now_ms` (epoch milliseconds, taken as is).
///
/// Yields one result per line that is neither blank nor a comment, in order. The iterator does
/// no work ahead of the caller: each call to `next` parses one line.
pub fn parse_lines(payload: &str, precision: Precision, now_ms: i64) -> Lines<'_> {
    Lines { payload, next: Some(0), number: 0, precision, now_ms, tags_hint: 0, fields_hint: 1 }
}

/// The iterator of [`parse_lines`].
///
/// Lines are not split off the payload beforehand: the parser stops at the `\n` that ends a
/// line as it reads the line's last element, which spares a second pass over every byte.
#[derive(Debug, Clone)]
pub struct Lines<'a> {
    payload: &'a str,
    /// Offset of the next line, `None` after the last one.
    next: Option<usize>,
    /// Number of the last line taken.
    number: usize,
    precision: Precision,
    now_ms: i64,
    /// Tag count of the last good line with parsed tags, and the most fields of a good line
    /// (at most [`FIELDS_HINT_MAX`]), to size the next line's vectors.
    tags_hint: usize,
    fields_hint: usize,
}

impl<'a> Iterator for Lines<'a> {
    type Item = Result<Line<'a>, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.advance(None::<&mut fn(&'a str) -> bool>, None).map(|(line, _)| line)
    }
}

/// What [`Lines::next_keyed`] found of a line's series key: the text before its first space
/// (the measurement and the tag set), when that text holds no backslash and no newline and is
/// at most [`MAX_SERIES_KEY_BYTES`] long.
///
/// Within such a key every space, comma and `=` is unescaped, so the tag set of a line ends at
/// its first space, and two lines whose keys are the same bytes have the same measurement and
/// tags. A caller that remembers the keys of lines it decoded can skip parsing those again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesKey<'a> {
    /// The caller knew this key: the line's tags were not parsed, and [`Line::tags`] is empty.
    Known(&'a str),
    /// A key the caller did not know; the line was parsed in full.
    New(&'a str),
    /// A known key whose line carried the fields the caller expected ([`Lines::next_expecting`]):
    /// their values went to the caller's vector, and [`Line::tags`] and [`Line::fields`] are
    /// empty.
    Quick(&'a str),
    /// The line has no such key (a backslash or a newline before its first space, or a longer
    /// key), or it was rejected.
    None,
}

/// The most fields a line's vector is sized for before it is parsed.
const FIELDS_HINT_MAX: usize = 32;

/// The longest series key [`Lines::next_keyed`] offers.
pub const MAX_SERIES_KEY_BYTES: usize = 1024;

impl<'a> Lines<'a> {
    /// The next line, as [`Iterator::next`] parses it, and its series key. `known` is asked
    /// about the key first: when it says `true` the tags are not parsed (the caller answers for
    /// them, having decoded a line of that key before) and the line comes with
    /// [`SeriesKey::Known`].
    pub fn next_keyed(
        &mut self,
        mut known: impl FnMut(&'a str) -> bool,
    ) -> Option<(Result<Line<'a>, LineError>, SeriesKey<'a>)> {
        self.advance(Some(&mut known), None)
    }

    /// [`Lines::next_keyed`], and for a line whose key `known` knew, `expect` is asked which
    /// fields it expects of it. When the line carries exactly those keys in that order, each
    /// with a number of the common forms (`-?d+`, `-?d+.d*`, `-?d+i`, `d+u`, at most 19
    /// digits), and a valid end, the values (in line order) are put in `expect`'s vector and
    /// the line comes with [`SeriesKey::Quick`]: no [`Line::fields`] were built. Any other line
    /// is parsed as [`Lines::next_keyed`] parses it, with the same result.
    pub fn next_expecting(
        &mut self,
        mut known: impl FnMut(&'a str) -> bool,
        expect: &mut dyn Expect<'a>,
    ) -> Option<(Result<Line<'a>, LineError>, SeriesKey<'a>)> {
        self.advance(Some(&mut known), Some(expect))
    }

    fn advance<K: FnMut(&'a str) -> bool>(
        &mut self,
        mut known: Option<&mut K>,
        mut expect: Option<&mut dyn Expect<'a>>,
    ) -> Option<(Result<Line<'a>, LineError>, SeriesKey<'a>)> {
        let b = self.payload.as_bytes();
        loop {
            let start = self.next?;
            self.number += 1;
            let mut i = start;
            while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
                i += 1;
            }
            if i == b.len() || b[i] == b'\n' || b[i] == b'#' {
                // Blank or comment.
                self.next = self.after_newline(i);
                continue;
            }
            let key = match known.as_deref_mut() {
                Some(known) => match series_key_end(b, i) {
                    Some(end) => {
                        let key = &self.payload[i..end];
                        if known(key) {
                            SeriesKey::Known(key)
                        } else {
                            SeriesKey::New(key)
                        }
                    }
                    None => SeriesKey::None,
                },
                None => SeriesKey::None,
            };
            if let (SeriesKey::Known(key), Some(expect)) = (key, expect.as_deref_mut()) {
                let measurement = measurement_of(key);
                if let Some((keys, values)) = expect.fields(measurement) {
                    if let Some((ts, end)) = self.quick_fields(i + key.len(), keys, values) {
                        self.next = (end < b.len()).then_some(end + 1);
                        let measurement = Cow::Borrowed(measurement);
                        let line = Line {
                            number: self.number,
                            measurement,
                            tags: Vec::new(),
                            fields: Vec::new(),
                            timestamp_ms: ts.unwrap_or(self.now_ms),
                            timestamped: ts.is_some(),
                        };
                        return Some((Ok(line), SeriesKey::Quick(key)));
                    }
                }
            }
            let parsed = self.line(i, key);
            return Some(match parsed {
                Ok((line, end)) => {
                    self.next = (end < b.len()).then_some(end + 1);
                    if !matches!(key, SeriesKey::Known(_)) {
                        self.tags_hint = line.tags.len();
                    }
                    // The most of the lines so far, to a bound: measurements of a payload take
                    // turns, and sizing for the last one grew the next one's vector.
                    self.fields_hint = self.fields_hint.max(line.fields.len().min(FIELDS_HINT_MAX));
                    (Ok(line), key)
                }
                Err((kind, reason)) => {
                    self.next = self.after_newline(i);
                    (Err(LineError { line: self.number, kind, reason }), SeriesKey::None)
                }
            });
        }
    }
}

/// The index of the first space of the line starting at `start`, if no backslash or newline
/// comes before it and it is at most [`MAX_SERIES_KEY_BYTES`] in (see [`SeriesKey`]).
#[inline(always)]
fn series_key_end(b: &[u8], start: usize) -> Option<usize> {
    let window = &b[start..b.len().min(start + MAX_SERIES_KEY_BYTES + 1)];
    let at = memchr::memchr3(b' ', b'\\', b'\n', window)?;
    (window[at] == b' ').then_some(start + at)
}

/// The measurement of a series key (as [`SeriesKey`] offers them): the key up to its first
/// comma.
fn measurement_of(key: &str) -> &str {
    &key[..memchr::memchr(b',', key.as_bytes()).unwrap_or(key.len())]
}

/// What a caller of [`Lines::next_expecting`] expects of the lines of a series key it knows.
pub trait Expect<'a> {
    /// The field keys expected of a line of a known series key whose measurement (the key up
    /// to its first comma) is `measurement`, in line order, and the vector their values are to
    /// be put in (emptied first); `None` to parse the line in full.
    fn fields(&mut self, measurement: &'a str) -> Option<(&PlainKeys, &mut Vec<FieldValue<'static>>)>;
}

/// Distinct field keys that need no escaping: each non-empty, at most [`MAX_STRING_BYTES`]
/// long, with no comma, `=`, space, backslash or newline. Such a key is the same bytes in a
/// line as unescaped, which is what lets [`Lines::next_expecting`] match it byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainKeys(Vec<Box<str>>);

impl PlainKeys {
    /// The keys, if each needs no escaping and none repeats.
    pub fn new<'k>(keys: impl IntoIterator<Item = &'k str>) -> Option<PlainKeys> {
        let keys: Vec<&str> = keys.into_iter().collect();
        let plain = |k: &str| {
            !k.is_empty() && k.len() <= MAX_STRING_BYTES && !k.bytes().any(|c| FIELD_KEY.stops[usize::from(c)])
        };
        let distinct = if keys.len() <= 16 {
            (1..keys.len()).all(|i| !keys[..i].contains(&keys[i]))
        } else {
            // Sorted, neighbours compared: a line of 50,000 fields took 3 s with every pair
            // compared, and held the HTTP writers behind it (QA60 F2).
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            sorted.windows(2).all(|w| w[0] != w[1])
        };
        // Each kept with the `=` that follows it in a line, to be matched at once.
        (!keys.is_empty() && keys.iter().all(|k| plain(k)) && distinct)
            .then(|| PlainKeys(keys.iter().map(|k| format!("{k}=").into_boxed_str()).collect()))
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.0.iter().map(|k| &k[..k.len() - 1])
    }
}

/// Whether `a` and `b`, of the same length, are the same bytes: for the short keys of
/// [`PlainKeys`], two overlapping word loads instead of a call to `memcmp`.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let word = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], i: usize| u32::from_le_bytes(s[i..i + 4].try_into().unwrap_or([0; 4]));
    match n {
        0..=3 => a == b,
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

impl std::iter::FusedIterator for Lines<'_> {}

/// A rejected line before its number is attached.
type Problem = (LineErrorKind, String);

/// A line's tags, as [`Line::tags`] holds them.
type Tags<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

fn syntax<T>(reason: String) -> Result<T, Problem> {
    Err((LineErrorKind::Syntax, reason))
}

fn too_long<T>(what: &str, len: usize) -> Result<T, Problem> {
    syntax(format!("{what} is {len} bytes long, more than the limit of {MAX_STRING_BYTES}"))
}

/// One flag per byte value.
type ByteSet = [bool; 256];

const fn byte_set(bytes: &[u8]) -> ByteSet {
    let mut set = [false; 256];
    let mut i = 0;
    while i < bytes.len() {
        set[bytes[i] as usize] = true;
        i += 1;
    }
    set
}

/// How one kind of element ends and what a backslash escapes in it.
struct Element {
    /// Bytes that end the element when unescaped, plus the backslash.
    stops: ByteSet,
    /// The same bytes (at most five) each repeated in all eight bytes of a word, for
    /// [`Element::next_stop`]; unused entries repeat the first.
    stop_words: [u64; 5],
    /// Bytes a backslash escapes.
    escapes: ByteSet,
}

// Every element also ends at a newline, which ends the line.
const MEASUREMENT: Element = Element::new(b", \\\n", b", \\");
const TAG_KEY: Element = Element::new(b",= \\\n", b",= \\");
const TAG_VALUE: Element = Element::new(b", \\\n", b",= \\");
const FIELD_KEY: Element = Element::new(b",= \\\n", b",= \\");
const STRING_VALUE: Element = Element::new(b"\"\\\n", b"\"\\");

/// Each byte of a word set to `byte`.
const fn broadcast(byte: u8) -> u64 {
    u64::from_ne_bytes([byte; 8])
}

/// The high bit of each byte of `x` that is zero, and possibly of bytes above a zero byte
/// (borrows), so only the lowest flagged byte is certain.
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(broadcast(0x01)) & !x & broadcast(0x80)
}

impl Element {
    const fn new(stops: &[u8], escapes: &[u8]) -> Element {
        let mut stop_words = [broadcast(stops[0]); 5];
        let mut i = 0;
        while i < stops.len() {
            stop_words[i] = broadcast(stops[i]);
            i += 1;
        }
        Element { stops: byte_set(stops), stop_words, escapes: byte_set(escapes) }
    }

    /// The index of the first byte from `i` that is a stop byte, or `b.len()`. Looks at eight
    /// bytes at a time.
    #[inline(always)]
    fn next_stop(&self, b: &[u8], mut i: usize) -> usize {
        while let Some(chunk) = b.get(i..i + 8) {
            let Ok(bytes) = <[u8; 8]>::try_from(chunk) else { break };
            let w = u64::from_le_bytes(bytes);
            let [s0, s1, s2, s3, s4] = self.stop_words;
            let hits =
                zero_bytes(w ^ s0) | zero_bytes(w ^ s1) | zero_bytes(w ^ s2) | zero_bytes(w ^ s3) | zero_bytes(w ^ s4);
            if hits != 0 {
                // Little-endian: the lowest flagged byte is the first stop byte.
                return i + (hits.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < b.len() && !self.stops[usize::from(b[i])] {
            i += 1;
        }
        i
    }

    /// The end of the element starting at `start` (the index of its unescaped stop byte, or
    /// `b.len()`), and whether it contains an escape.
    #[inline(always)]
    fn scan(&self, b: &[u8], start: usize) -> (usize, bool) {
        let mut i = start;
        let mut escaped = false;
        loop {
            i = self.next_stop(b, i);
            if i < b.len() && b[i] == b'\\' {
                if i + 1 < b.len() && self.escapes[usize::from(b[i + 1])] {
                    escaped = true;
                    i += 2;
                } else {
                    i += 1;
                }
            } else {
                return (i, escaped);
            }
        }
    }

    /// `text[start..end]`, unescaped when `escaped`. `start` and `end` lie on ASCII bytes or
    /// the ends of `text`, so on character boundaries.
    #[inline(always)]
    fn take<'a>(&self, text: &'a str, start: usize, end: usize, escaped: bool) -> Cow<'a, str> {
        let raw = &text[start..end];
        if escaped {
            Cow::Owned(self.unescape(raw))
        } else {
            Cow::Borrowed(raw)
        }
    }

    /// The length of `text[start..end]` unescaped, if it is more than [`MAX_STRING_BYTES`].
    #[inline(always)]
    fn too_long(&self, text: &str, start: usize, end: usize, escaped: bool) -> Option<usize> {
        // Unescaping only shortens, so short raw text needs no closer look.
        if end - start <= MAX_STRING_BYTES {
            return None;
        }
        Some(self.take(text, start, end, escaped).len()).filter(|&len| len > MAX_STRING_BYTES)
    }

    fn unescape(&self, raw: &str) -> String {
        let b = raw.as_bytes();
        let mut out = String::with_capacity(raw.len());
        let mut kept = 0;
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 1 < b.len() && self.escapes[usize::from(b[i + 1])] {
                // Drop the backslash; the escaped byte starts the next kept run.
                out.push_str(&raw[kept..i]);
                kept = i + 1;
                i += 2;
            } else {
                i += 1;
            }
        }
        out.push_str(&raw[kept..]);
        out
    }
}

/// If only spaces, tabs and carriage returns separate `i` from the end of its line, the index
/// of that end (its `\n`, or `b.len()`).
#[inline(always)]
fn eol(b: &[u8], mut i: usize) -> Option<usize> {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    (i == b.len() || b[i] == b'\n').then_some(i)
}

/// `end`, moved back over the spaces, tabs and carriage returns that end a line; for elements
/// that reach the line's end, which must not include them.
fn trim_line_end(b: &[u8], start: usize, mut end: usize) -> usize {
    if eol(b, end).is_some() {
        while end > start && matches!(b[end - 1], b' ' | b'\t' | b'\r') {
            end -= 1;
        }
    }
    end
}

impl<'a> Lines<'a> {
    /// The start of the line after the one holding `i`, or `None` if that was the last.
    fn after_newline(&self, i: usize) -> Option<usize> {
        self.payload[i..].find('\n').map(|at| i + at + 1)
    }

    /// Parses the line whose first character (not a blank, `#` or `\n`) is at `start`; on
    /// success also returns the index of the line's end (its `\n`, or the payload's end).
    ///
    /// Names are turned into `Cow`s only where they are pushed, and error reasons are built
    /// only on the way out: this keeps the hot path free of copies through memory.
    ///
    /// For a [`SeriesKey::Known`] key, the measurement is the key up to its first comma and the
    /// tags are not parsed.
    fn line(&self, start: usize, key: SeriesKey<'a>) -> Result<(Line<'a>, usize), Problem> {
        let text = self.payload;
        let b = text.as_bytes();
        let no_fields = || Err((LineErrorKind::NoFields, "no fields: a line needs at least one field".to_string()));

        let (measurement, tags, mut i) = match key {
            SeriesKey::Known(key) => (Cow::Borrowed(measurement_of(key)), Vec::new(), start + key.len()),
            _ => self.series(start)?,
        };

        // The measurement or the last tag value ends at a space or at the end of the line.
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if eol(b, i).is_some() {
            return no_fields();
        }

        let mut fields = Vec::with_capacity(self.fields_hint);
        loop {
            let key_start = i;
            let (key_end, key_escaped) = FIELD_KEY.scan(b, key_start);
            let key = || FIELD_KEY.take(text, key_start, trim_line_end(b, key_start, key_end), key_escaped);
            if key_end == key_start || eol(b, key_start).is_some() {
                return syntax(match b.get(key_end) {
                    None | Some(b' ' | b'\n' | b'\t' | b'\r') => "the field set ends with `,`".to_string(),
                    _ => "empty field key".to_string(),
                });
            }
            if let Some(len) = FIELD_KEY.too_long(text, key_start, key_end, key_escaped) {
                return too_long("a field key", len);
            }
            if b.get(key_end) != Some(&b'=') {
                return syntax(format!("field {}: missing `=` and value", quote(&key())));
            }
            i = key_end + 1;
            // Each kind of value is pushed where it is made (see `push_with`).
            if b.get(i) == Some(&b'"') {
                let start = i + 1;
                let (end, escaped) = STRING_VALUE.scan(b, start);
                if end == b.len() || b[end] == b'\n' {
                    return syntax(format!("field {}: the string has no closing `\"`", quote(&key())));
                }
                if let Some(len) = STRING_VALUE.too_long(text, start, end, escaped) {
                    return too_long(&format!("the string of field {}", quote(&key())), len);
                }
                i = end + 1;
                if i < b.len() && b[i] != b',' && b[i] != b' ' && eol(b, i).is_none() {
                    let rest = &text[i..trim_line_end(b, i, i + text[i..].find('\n').unwrap_or(text.len() - i))];
                    let after = rest.split([',', ' ']).next().unwrap_or_default();
                    return syntax(format!(
                        "field {}: unexpected {} after the closing `\"`",
                        quote(&key()),
                        quote(after)
                    ));
                }
                push_with(&mut fields, || (key(), FieldValue::Str(STRING_VALUE.take(text, start, end, escaped))));
            } else if let Some((number, end)) = fast_number(b, i) {
                i = end;
                if key_escaped {
                    fields.push((key(), number.into()));
                } else {
                    push_number(&mut fields, &text[key_start..key_end], number);
                }
            } else {
                let start = i;
                while i < b.len() && !matches!(b[i], b',' | b' ' | b'\n') {
                    i += 1;
                }
                // A value at the end of the line stops before the line's trailing blanks.
                i = trim_line_end(b, start, i);
                match field_value(&text[start..i]) {
                    Ok(value) => push_with(&mut fields, || (key(), value)),
                    Err(why) => {
                        return Err((LineErrorKind::FieldValue, format!("field {}: {why}", quote(&key()))));
                    }
                }
            }
            if i == b.len() || b[i] != b',' {
                break;
            }
            i += 1;
        }
        if first_duplicate(&fields).is_some() {
            fields = last_wins(fields);
        }
        let (ts, end) = self.line_end(i)?;
        let (timestamp_ms, timestamped) = (ts.unwrap_or(self.now_ms), ts.is_some());
        Ok((Line { number: self.number, measurement, tags, fields, timestamp_ms, timestamped }, end))
    }

    /// What follows a line's field set, which ends at `i` (not at a comma): its timestamp
    /// (`None` if it has none) and the index of the line's end.
    #[inline(always)]
    fn line_end(&self, mut i: usize) -> Result<(Option<i64>, usize), Problem> {
        let text = self.payload;
        let b = text.as_bytes();
        // The field set ends at a space or at the end of the line.
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        match eol(b, i) {
            Some(end) => Ok((None, end)),
            None => {
                let start = i;
                while i < b.len() && b[i] != b' ' && b[i] != b'\n' {
                    i += 1;
                }
                let token_end = trim_line_end(b, start, i);
                let Some(end) = eol(b, token_end) else {
                    let rest = &text[token_end..];
                    let rest = rest[..rest.find('\n').unwrap_or(rest.len())].trim_matches([' ', '\t', '\r']);
                    return syntax(format!("unexpected {} after the timestamp", quote(rest)));
                };
                Ok((Some(self.timestamp(&text[start..token_end])?), end))
            }
        }
    }

    /// For a line whose series key ends at `i`: if its fields are `keys` in order, each with a
    /// value [`fast_number`] reads, and its end is valid, the values in `values` (in line order),
    /// its timestamp (`None` if it has none) and the index of its end. Then [`Lines::line`] would have parsed the line
    /// into these very keys and values (plain keys read as they are; distinct, so no "last
    /// wins"), and this timestamp and end. `None` otherwise: nothing is decided, and the line is
    /// parsed in full.
    #[inline(always)]
    fn quick_fields(
        &self,
        mut i: usize,
        keys: &PlainKeys,
        values: &mut Vec<FieldValue<'static>>,
    ) -> Option<(Option<i64>, usize)> {
        let b = self.payload.as_bytes();
        values.clear();
        // The key ends at a space.
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        for (n, key) in keys.0.iter().enumerate() {
            if n > 0 {
                if b.get(i) != Some(&b',') {
                    return None;
                }
                i += 1;
            }
            // The key and its `=`.
            let key = key.as_bytes();
            match b.get(i..i + key.len()) {
                Some(got) if same_bytes(got, key) => {}
                _ => return None,
            }
            let (number, end) = fast_number(b, i + key.len())?;
            values.push(number.into());
            i = end;
        }
        if b.get(i) == Some(&b',') {
            return None;
        }
        self.line_end(i).ok()
    }

    /// The measurement and tags of the line starting at `start`, and the index after them.
    #[inline(always)]
    fn series(&self, start: usize) -> Result<(Cow<'a, str>, Tags<'a>, usize), Problem> {
        let text = self.payload;
        let b = text.as_bytes();
        let (end, escaped) = MEASUREMENT.scan(b, start);
        if end == start {
            return syntax("missing measurement: the line starts with `,`".to_string());
        }
        if let Some(len) = MEASUREMENT.too_long(text, start, end, escaped) {
            return too_long("the measurement", len);
        }
        let measurement = MEASUREMENT.take(text, start, end, escaped);
        let mut i = end;

        let mut tags = Vec::new();
        if i < b.len() && b[i] == b',' {
            tags.reserve(self.tags_hint.max(1));
            loop {
                let key_start = i + 1;
                let (key_end, key_escaped) = TAG_KEY.scan(b, key_start);
                let key = || TAG_KEY.take(text, key_start, trim_line_end(b, key_start, key_end), key_escaped);
                if key_end == key_start || eol(b, key_start).is_some() {
                    return syntax(match b.get(key_end) {
                        None | Some(b' ' | b'\n' | b'\t' | b'\r') => "the tag set ends with `,`".to_string(),
                        _ => "empty tag key".to_string(),
                    });
                }
                if let Some(len) = TAG_KEY.too_long(text, key_start, key_end, key_escaped) {
                    return too_long("a tag key", len);
                }
                if b.get(key_end) != Some(&b'=') {
                    return syntax(format!("tag {}: missing `=` and value", quote(&key())));
                }
                let start = key_end + 1;
                let (end, escaped) = TAG_VALUE.scan(b, start);
                if trim_line_end(b, start, end) == start {
                    return syntax(format!("tag {}: empty value", quote(&key())));
                }
                if let Some(len) = TAG_VALUE.too_long(text, start, end, escaped) {
                    return too_long(&format!("the value of tag {}", quote(&key())), len);
                }
                if key_escaped || escaped {
                    tags.push((key(), TAG_VALUE.take(text, start, end, escaped)));
                } else {
                    push_tag(&mut tags, &text[key_start..key_end], &text[start..end]);
                }
                i = end;
                if i == b.len() || b[i] != b',' {
                    break;
                }
            }
            if let Some(dup) = first_duplicate(&tags) {
                return syntax(format!("duplicate tag key {}", quote(&tags[dup].0)));
            }
        }

        Ok((measurement, tags, i))
    }

    fn timestamp(&self, token: &str) -> Result<i64, Problem> {
        let invalid = |why: &str| Err((LineErrorKind::Timestamp, format!("timestamp {}: {why}", quote(token))));
        let value = match parse_i64(token) {
            Ok(value) => value,
            Err(IntError::Invalid) => return invalid("not an integer"),
            Err(IntError::Overflow) => return invalid("out of range of a 64-bit integer"),
        };
        match self.precision.to_epoch_ms(value) {
            Some(ms) => Ok(ms),
            None => invalid(&format!("out of range of epoch milliseconds in precision {}", self.precision.as_str())),
        }
    }
}

/// Appends the element `make` returns to `v`.
///
/// Unlike `push(make())`, this builds the element after the capacity check, so that it goes
/// from registers straight into the vector. With `push`, the element is kept on the stack
/// across the (rarely taken) call that grows the vector, and copying it from there with wider
/// loads than the stores that wrote it stalls store forwarding, which took about a fifth of
/// the parse time of a TSBS line.
#[inline(always)]
fn push_with<T>(v: &mut Vec<T>, make: impl FnOnce() -> T) {
    v.extend(std::iter::once_with(make));
}

/// Pushes a tag whose key and value need no unescaping. Out of line and with every argument
/// in a register, so that the tag is built where it is stored (see [`push_with`]).
#[inline(never)]
fn push_tag<'a>(tags: &mut Vec<(Cow<'a, str>, Cow<'a, str>)>, key: &'a str, value: &'a str) {
    push_with(tags, || (Cow::Borrowed(key), Cow::Borrowed(value)));
}

/// Powers of ten that are exact in an `f64`.
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// The common numeric field values in one pass: `-?d+` (float), `-?d+i`, `d+u` and `-?d+.d*`,
/// with at most 19 digits (so that they fit a `u64`). Returns the value and the index after
/// it, or `None` for anything else, valid or not, which [`field_value`] then parses or
/// explains.
///
/// A decimal fraction is computed as `mantissa / 10^k`, which is exact in its operands when the
/// mantissa is at most 2^53 and `k` at most 22, so the one rounding of the division gives the
/// correctly rounded result, as `f64::from_str` does (Clinger's fast path).
#[inline(always)]
fn fast_number(b: &[u8], start: usize) -> Option<(Number, usize)> {
    let ends_at = |j: usize| match b.get(j) {
        None | Some(b',' | b' ' | b'\n') => true,
        Some(b'\t' | b'\r') => eol(b, j).is_some(),
        Some(_) => false,
    };
    let negative = b.get(start) == Some(&b'-');
    let mut i = start + usize::from(negative);
    let digits_start = i;
    let mut mantissa: u64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(b[i] - b'0'));
        i += 1;
    }
    let int_digits = i - digits_start;
    if int_digits == 0 || int_digits > 19 {
        return None;
    }
    let value = match b.get(i) {
        Some(b'i') if ends_at(i + 1) => {
            i += 1;
            if negative {
                // `as` maps 2^63 to i64::MIN, whose negation is itself.
                (mantissa <= 1 << 63).then(|| Number::Int((mantissa as i64).wrapping_neg()))?
            } else {
                Number::Int(i64::try_from(mantissa).ok()?)
            }
        }
        Some(b'u') if !negative && ends_at(i + 1) => {
            i += 1;
            Number::UInt(mantissa)
        }
        Some(b'.') => {
            i += 1;
            let fraction_start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(b[i] - b'0'));
                i += 1;
            }
            let fraction_digits = i - fraction_start;
            if int_digits + fraction_digits > 19 || mantissa > 1 << 53 || !ends_at(i) {
                return None;
            }
            let v = mantissa as f64 / EXACT_POWERS_OF_TEN[fraction_digits];
            Number::Float(if negative { -v } else { v })
        }
        // An integer: `as` rounds to the nearest `f64`, as parsing the digits would.
        _ if ends_at(i) => {
            let v = mantissa as f64;
            Number::Float(if negative { -v } else { v })
        }
        _ => return None,
    };
    Some((value, i))
}

/// A numeric field value: 16 bytes, so it travels in two registers.
#[derive(Clone, Copy)]
enum Number {
    Float(f64),
    Int(i64),
    UInt(u64),
}

impl From<Number> for FieldValue<'_> {
    fn from(number: Number) -> Self {
        match number {
            Number::Float(v) => FieldValue::Float(v),
            Number::Int(v) => FieldValue::Int(v),
            Number::UInt(v) => FieldValue::UInt(v),
        }
    }
}

/// The fields of a [`Line`].
type Fields<'a> = Vec<(Cow<'a, str>, FieldValue<'a>)>;

/// Pushes a numeric field whose key needs no unescaping. Out of line and with every argument
/// in a register (a `Number` would be passed through memory), so that the field is built
/// where it is stored (see [`push_with`]).
#[inline(always)]
fn push_number<'a>(fields: &mut Fields<'a>, key: &'a str, number: Number) {
    #[inline(never)]
    fn float<'a>(fields: &mut Fields<'a>, key: &'a str, v: f64) {
        push_with(fields, || (Cow::Borrowed(key), FieldValue::Float(v)));
    }
    #[inline(never)]
    fn int<'a>(fields: &mut Fields<'a>, key: &'a str, v: i64) {
        push_with(fields, || (Cow::Borrowed(key), FieldValue::Int(v)));
    }
    #[inline(never)]
    fn uint<'a>(fields: &mut Fields<'a>, key: &'a str, v: u64) {
        push_with(fields, || (Cow::Borrowed(key), FieldValue::UInt(v)));
    }
    match number {
        Number::Float(v) => float(fields, key, v),
        Number::Int(v) => int(fields, key, v),
        Number::UInt(v) => uint(fields, key, v),
    }
}

/// Parses an unquoted field value; the error is the reason without the field's name.
fn field_value(token: &str) -> Result<FieldValue<'static>, String> {
    let b = token.as_bytes();
    let Some((&first, &last)) = b.first().zip(b.last()) else {
        return Err("missing value".to_string());
    };
    match first {
        b'0'..=b'9' | b'-' | b'.' => {}
        b't' | b'T' | b'f' | b'F' => {
            return match token {
                "t" | "T" | "true" | "True" | "TRUE" => Ok(FieldValue::Bool(true)),
                "f" | "F" | "false" | "False" | "FALSE" => Ok(FieldValue::Bool(false)),
                _ => Err(format!("invalid boolean {}", quote(token))),
            };
        }
        _ => {
            return Err(not_finite_or(token, || {
                format!(
                    "invalid value {} (expected a number, an integer such as `1i`, an unsigned integer such as \
                     `1u`, a boolean or a double-quoted string)",
                    quote(token)
                )
            }))
        }
    }
    // Only sliced when the last byte is the ASCII `i` or `u`, so on a character boundary.
    let digits = || &token[..token.len() - 1];
    match last {
        b'i' => match parse_i64(digits()) {
            Ok(v) => Ok(FieldValue::Int(v)),
            Err(IntError::Invalid) => Err(format!("invalid integer {}", quote(token))),
            Err(IntError::Overflow) => Err(format!("integer {} is out of range of a 64-bit integer", quote(token))),
        },
        b'u' => match parse_u64(digits()) {
            Ok(v) => Ok(FieldValue::UInt(v)),
            Err(IntError::Invalid) => Err(format!("invalid unsigned integer {}", quote(token))),
            Err(IntError::Overflow) => {
                Err(format!("unsigned integer {} is out of range of a 64-bit unsigned integer", quote(token)))
            }
        },
        _ if !is_float(b) => Err(not_finite_or(token, || format!("invalid number {}", quote(token)))),
        _ => match token.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(FieldValue::Float(v)),
            _ => Err(format!("number {} is out of range of a 64-bit float", quote(token))),
        },
    }
}

/// The refusal of a value that is no field value: for a NaN or an infinity as `f64::from_str`
/// would take it (`NaN`, `-inf`, `+Infinity`), one saying so whatever its sign (line
/// protocol's floats are finite, as InfluxDB's); for any other token, `otherwise`'s. Called on
/// the error paths only.
fn not_finite_or(token: &str, otherwise: impl FnOnce() -> String) -> String {
    let word = token.strip_prefix(['-', '+']).unwrap_or(token);
    if ["nan", "inf", "infinity"].iter().any(|w| word.eq_ignore_ascii_case(w)) {
        format!("invalid value {} (line protocol has no NaN or infinite numbers)", quote(token))
    } else {
        otherwise()
    }
}

/// Whether `b` is a float in line protocol's decimal syntax: `-?(d+(.d*)?|.d+)([eE][+-]?d+)?`.
/// Everything else that `f64::from_str` would take (`inf`, `NaN`, `+1`) is not.
fn is_float(b: &[u8]) -> bool {
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let mut i = usize::from(b.first() == Some(&b'-'));
    let mut mantissa = digits(&mut i);
    if b.get(i) == Some(&b'.') {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

enum IntError {
    Invalid,
    Overflow,
}

/// Parses `-?[0-9]+` into an `i64`.
fn parse_i64(s: &str) -> Result<i64, IntError> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, s),
    };
    let magnitude = parse_u64(digits)?;
    if negative {
        // The magnitude of i64::MIN is i64::MAX + 1.
        match magnitude {
            m if m <= i64::MAX as u64 => Ok(-(m as i64)),
            m if m == i64::MAX as u64 + 1 => Ok(i64::MIN),
            _ => Err(IntError::Overflow),
        }
    } else {
        i64::try_from(magnitude).map_err(|_| IntError::Overflow)
    }
}

/// Parses `[0-9]+` into a `u64`.
fn parse_u64(s: &str) -> Result<u64, IntError> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(IntError::Invalid);
    }
    // Up to 19 digits cannot overflow a u64 (its maximum has 20): eight at a time, then one
    // at a time.
    if b.len() <= 19 {
        let mut value = 0;
        let mut i = 0;
        while let Some(chunk) = b.get(i..i + 8) {
            let Ok(bytes) = <[u8; 8]>::try_from(chunk) else { break };
            value = value * 100_000_000 + eight_digits(u64::from_le_bytes(bytes)).ok_or(IntError::Invalid)?;
            i += 8;
        }
        for &c in &b[i..] {
            if !c.is_ascii_digit() {
                return Err(IntError::Invalid);
            }
            value = value * 10 + u64::from(c - b'0');
        }
        return Ok(value);
    }
    if !b.iter().all(u8::is_ascii_digit) {
        return Err(IntError::Invalid);
    }
    b.iter().try_fold(0u64, |v, &c| v.checked_mul(10)?.checked_add(u64::from(c - b'0'))).ok_or(IntError::Overflow)
}

/// The value of eight ASCII digits read as a little-endian word (first digit in the lowest
/// byte), or `None` if a byte is not a digit. Three multiplications instead of eight.
#[inline(always)]
fn eight_digits(w: u64) -> Option<u64> {
    // A digit byte has the high nibble 3, and adding 6 to it does not carry into that nibble.
    let high = broadcast(0xF0);
    if (w & high) | ((w.wrapping_add(broadcast(0x06)) & high) >> 4) != broadcast(0x33) {
        return None;
    }
    let v = w - broadcast(b'0');
    // Each byte pair (d0, d1) becomes 10 * d0 + d1 in the lower byte of the pair...
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    // ...then pairs combine into the four-digit halves, and the halves into the result.
    let pairs = 0x0000_00FF_0000_00FF;
    let v = (v & pairs)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & pairs).wrapping_mul(1 + (10_000 << 32)))
        >> 32;
    Some(v)
}

/// The index of the first key that repeats an earlier one.
fn first_duplicate<V>(pairs: &[(Cow<'_, str>, V)]) -> Option<usize> {
    if pairs.len() <= PAIRWISE_KEYS {
        // Length and last byte first: distinct keys mostly differ there, which spares a
        // `memcmp` call per pair.
        let same = |a: &str, b: &str| a.len() == b.len() && a.as_bytes().last() == b.as_bytes().last() && a == b;
        (1..pairs.len()).find(|&i| pairs[..i].iter().any(|(k, _)| same(k, &pairs[i].0)))
    } else {
        let mut seen = HashSet::with_capacity(pairs.len());
        pairs.iter().position(|(k, _)| !seen.insert(&**k))
    }
}

/// Merges repeated field keys: each key keeps its first position and its last value.
fn last_wins<'a>(fields: Vec<(Cow<'a, str>, FieldValue<'a>)>) -> Vec<(Cow<'a, str>, FieldValue<'a>)> {
    let mut index: HashMap<Cow<'a, str>, usize> = HashMap::with_capacity(fields.len());
    let mut out: Vec<(Cow<'a, str>, FieldValue<'a>)> = Vec::with_capacity(fields.len());
    for (key, value) in fields {
        match index.get(&key) {
            Some(&at) => out[at].1 = value,
            None => {
                index.insert(key.clone(), out.len());
                out.push((key, value));
            }
        }
    }
    out
}

/// `s` in backticks for an error reason, cut to [`PREVIEW_CHARS`] characters, with control
/// characters escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(4 * PREVIEW_CHARS) + 2);
    out.push('`');
    for (n, c) in s.chars().enumerate() {
        if n == PREVIEW_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            let _ = write!(out, "{}", c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.push('`');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use FieldValue::{Bool, Float, Int, Str, UInt};

    const NOW: i64 = 1_700_000_000_123;

    fn parse(payload: &str) -> Vec<Result<Line<'_>, LineError>> {
        parse_lines(payload, Precision::Nanoseconds, NOW).collect()
    }

    /// The only line of `payload`, which must parse.
    fn one(payload: &str) -> Line<'_> {
        let mut all = parse(payload);
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0).unwrap()
    }

    /// The error of the only line of `payload`, which must not parse.
    fn error(payload: &str) -> LineError {
        let mut all = parse(payload);
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0).unwrap_err()
    }

    /// The message of the only line's error, checking its kind.
    fn fails(payload: &str, kind: LineErrorKind) -> String {
        let e = error(payload);
        assert_eq!(e.kind, kind, "{e}");
        e.to_string()
    }

    fn s(text: &str) -> FieldValue<'static> {
        Str(Cow::Owned(text.to_string()))
    }

    /// The expected line number 1 (without a timestamp when `timestamp_ms` is [`NOW`]).
    fn expect(
        measurement: &str,
        tags: &[(&str, &str)],
        fields: &[(&str, FieldValue<'static>)],
        timestamp_ms: i64,
    ) -> Line<'static> {
        Line {
            number: 1,
            measurement: Cow::Owned(measurement.to_string()),
            tags: tags.iter().map(|(k, v)| (Cow::Owned(k.to_string()), Cow::Owned(v.to_string()))).collect(),
            fields: fields.iter().map(|(k, v)| (Cow::Owned(k.to_string()), v.clone())).collect(),
            timestamp_ms,
            timestamped: timestamp_ms != NOW,
        }
    }

    /// The single field value of a one-line payload.
    fn value(payload: &str) -> FieldValue<'_> {
        let line = one(payload);
        assert_eq!(line.fields.len(), 1, "{line:?}");
        line.fields.into_iter().next().unwrap().1
    }

    // ---- The reference's syntax examples -------------------------------------------------

    #[test]
    fn syntax_example() {
        assert_eq!(
            one(r#"myMeasurement,tag1=value1,tag2=value2 fieldKey="fieldValue" 1556813561098000000"#),
            expect(
                "myMeasurement",
                &[("tag1", "value1"), ("tag2", "value2")],
                &[("fieldKey", s("fieldValue"))],
                1_556_813_561_098
            )
        );
    }

    #[test]
    fn elements_example_with_zero_padded_timestamp() {
        assert_eq!(
            one(r#"myMeasurement,tag1=val1,tag2=val2 field1="v1",field2=1i 0000000000000000000"#),
            expect(
                "myMeasurement",
                &[("tag1", "val1"), ("tag2", "val2")],
                &[("field1", s("v1")), ("field2", Int(1))],
                0
            )
        );
    }

    #[test]
    fn string_field_note_example() {
        assert_eq!(
            one(r#"measurementName fieldKey="field string value" 1556813561098000000"#),
            expect("measurementName", &[], &[("fieldKey", s("field string value"))], 1_556_813_561_098)
        );
    }

    #[test]
    fn tutorial_example() {
        assert_eq!(
            one("weather,location=us-midwest temperature=82 1465839830100400200"),
            expect("weather", &[("location", "us-midwest")], &[("temperature", Float(82.0))], 1_465_839_830_100)
        );
    }

    #[test]
    fn missing_timestamp_takes_now() {
        assert_eq!(one("myMeasurement fieldKey=1.0"), expect("myMeasurement", &[], &[("fieldKey", Float(1.0))], NOW));
    }

    /// An [`Expect`] of one measurement's keys, counting the lines it was asked about.
    struct Expecting {
        measurement: &'static str,
        keys: PlainKeys,
        values: Vec<FieldValue<'static>>,
        asked: usize,
    }

    impl<'a> Expect<'a> for Expecting {
        fn fields(&mut self, measurement: &'a str) -> Option<(&PlainKeys, &mut Vec<FieldValue<'static>>)> {
            self.asked += 1;
            (measurement == self.measurement).then_some((&self.keys, &mut self.values))
        }
    }

    fn expecting(measurement: &'static str, keys: &[&str]) -> Expecting {
        Expecting { measurement, keys: PlainKeys::new(keys.iter().copied()).unwrap(), values: Vec::new(), asked: 0 }
    }

    /// Each line of `payload` as `next_expecting` gives it with every key known: the line, its
    /// series key, and for a quick one, the values read.
    fn expected(
        payload: &str,
        expect: &mut Expecting,
    ) -> Vec<(Result<Line<'static>, LineError>, String, Vec<FieldValue<'static>>)> {
        let mut lines = parse_lines(payload, Precision::Nanoseconds, NOW);
        let mut out = Vec::new();
        while let Some((line, key)) = lines.next_expecting(|_| true, expect) {
            let values = if matches!(key, SeriesKey::Quick(_)) { expect.values.clone() } else { Vec::new() };
            out.push((line.map(Line::into_owned), format!("{key:?}"), values));
        }
        out
    }

    #[test]
    fn lines_of_the_expected_keys_are_read_quick_and_others_in_full() {
        let payload = "m,t=1 a=1,b=-2.5 1000000\n\
                       m,t=1 a=3i,b=4u\n\
                       \n\
                       m,t=1  a=5,b=6   7000000 \r\n\
                       m,t=1 a=1,b=2,c=3 1000000\n\
                       m,t=1 b=1,a=2 1000000\n\
                       m,t=1 a=1e3,b=2 1000000\n\
                       m,t=1 a=1,b=2 x\n\
                       m,t=1 a=9223372036854775808u,b=2 1000000\n\
                       n,t=1 a=1,b=2 1000000\n";
        let mut expect = expecting("m", &["a", "b"]);
        let got = expected(payload, &mut expect);
        // Every line's key is known: `expect` is asked about each, blank lines aside.
        assert_eq!(expect.asked, 9);
        let quick = |number: usize, ts: i64, values: Vec<FieldValue<'static>>| {
            let line = Line {
                number,
                measurement: "m".into(),
                tags: Vec::new(),
                fields: Vec::new(),
                timestamp_ms: ts,
                timestamped: ts != NOW,
            };
            (Ok(line), "Quick(\"m,t=1\")".to_string(), values)
        };
        assert_eq!(got[0], quick(1, 1, vec![FieldValue::Float(1.0), FieldValue::Float(-2.5)]));
        assert_eq!(got[1], quick(2, NOW, vec![FieldValue::Int(3), FieldValue::UInt(4)]));
        assert_eq!(got[2], quick(4, 7, vec![FieldValue::Float(5.0), FieldValue::Float(6.0)]));
        // The others, as parsed in full with the key known; the unsigned value past i64 is the
        // caller's to refuse, so it is read quick.
        let full: Vec<_> = {
            let mut lines = parse_lines(payload, Precision::Nanoseconds, NOW);
            std::iter::from_fn(|| lines.next_keyed(|_| true))
                .map(|(l, k)| (l.map(Line::into_owned), format!("{k:?}")))
                .collect()
        };
        for (i, (line, key, values)) in got.iter().enumerate().skip(3) {
            if i == 7 {
                assert_eq!(values, &[FieldValue::UInt(1 << 63), FieldValue::Float(2.0)]);
                assert_eq!(key, "Quick(\"m,t=1\")");
                continue;
            }
            assert_eq!((line, key, values.is_empty()), (&full[i].0, &full[i].1, true), "line {}", i + 2);
        }
        assert_eq!(full[4].0.as_ref().map(|l| l.fields.len()), Ok(2));
        assert_eq!(full[6].0.as_ref().unwrap_err().kind, LineErrorKind::Timestamp);
        assert_eq!(got.len(), 9);
        // Keys that need escaping, repeat or are none are not offered.
        assert!(PlainKeys::new(["a", "b c"]).is_none());
        assert!(PlainKeys::new(["a=", "b"]).is_none());
        assert!(PlainKeys::new(["a\\b"]).is_none());
        assert!(PlainKeys::new(["a", "a"]).is_none());
        assert!(PlainKeys::new(["", "a"]).is_none());
        assert!(PlainKeys::new(std::iter::empty()).is_none());
        assert_eq!(PlainKeys::new(["b", "a"]).unwrap().keys().collect::<Vec<_>>(), ["b", "a"]);
        // Many keys (checked sorted): distinct ones are offered in their order, with one
        // repeated they are not.
        let many: Vec<String> = (0..50_000).rev().map(|i| format!("z{i}")).collect();
        let keys = PlainKeys::new(many.iter().map(String::as_str)).unwrap();
        assert!(keys.keys().eq(many.iter().map(String::as_str)));
        assert!(PlainKeys::new(many.iter().map(String::as_str).chain(["z17"])).is_none());
        assert!(PlainKeys::new((0..17).map(|i| ["a", "b", "c", "d", "e", "f", "g", "h", "i"][i % 9])).is_none());
    }

    /// `same_bytes` agrees with `==` at every length and wherever one byte differs.
    #[test]
    fn same_bytes_is_equality() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "length {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!same_bytes(&a, &b), "length {n}, byte {at}");
            }
        }
    }

    #[test]
    fn tsbs_line() {
        let line = one(
            "readings,name=truck_0,fleet=South,driver=Trish,model=H-2,device_version=v2.3 latitude=52.31854,\
             longitude=4.72037,elevation=124i,velocity=0i,heading=221i,grade=0i,fuel_consumption=25 1451606400000000000",
        );
        assert_eq!(
            line,
            expect(
                "readings",
                &[
                    ("name", "truck_0"),
                    ("fleet", "South"),
                    ("driver", "Trish"),
                    ("model", "H-2"),
                    ("device_version", "v2.3")
                ],
                &[
                    ("latitude", Float(52.31854)),
                    ("longitude", Float(4.72037)),
                    ("elevation", Int(124)),
                    ("velocity", Int(0)),
                    ("heading", Int(221)),
                    ("grade", Int(0)),
                    ("fuel_consumption", Float(25.0)),
                ],
                1_451_606_400_000
            )
        );
        assert_eq!(line.tag("driver"), Some("Trish"));
        assert_eq!(line.tag("nope"), None);
        assert_eq!(line.field("heading"), Some(&Int(221)));
        assert_eq!(line.field("nope"), None);
    }

    // ---- Data types: floats ----------------------------------------------------------------

    #[test]
    fn float_examples_from_the_reference() {
        // v2 reference.
        assert_eq!(value("myMeasurement fieldKey=1.0"), Float(1.0));
        assert_eq!(value("myMeasurement fieldKey=1"), Float(1.0));
        assert_eq!(value("myMeasurement fieldKey=-1.234456e+78"), Float(-1.234456e78));
        // v1 reference: data types table and examples.
        assert_eq!(value("mymeas value=1.e+78"), Float(1e78));
        assert_eq!(value("mymeas value=1.E+78"), Float(1e78));
        assert_eq!(value("mymeas value=-1.234456e+78"), Float(-1.234456e78));
        assert_eq!(value("mymeas value=1.0"), Float(1.0));
        assert_eq!(value("mymeas value=1"), Float(1.0));
    }

    #[test]
    fn float_forms() {
        for (text, expected) in [
            ("0", 0.0),
            ("-0", -0.0),
            ("1.", 1.0),
            (".5", 0.5),
            ("-.5", -0.5),
            ("1e5", 1e5),
            ("1E5", 1e5),
            ("1e-5", 1e-5),
            ("-1.234e+10", -1.234e10),
            ("007.50", 7.5),
            ("52.31854", 52.31854),
            ("1.7976931348623157e308", f64::MAX),
            ("-1.7976931348623157e308", f64::MIN),
            ("5e-324", 5e-324),
            ("1e-400", 0.0),
            ("0.1", 0.1),
        ] {
            let payload = format!("m f={text}");
            let v = value(&payload);
            assert_eq!(v, Float(expected), "{text}");
            let Float(v) = v else { unreachable!() };
            assert_eq!(v.to_bits(), expected.to_bits(), "{text}");
        }
    }

    #[test]
    fn invalid_floats() {
        for text in
            ["12..5", "1.1.1", "1e", "1e+", "1e5.5", "-", ".", "-.", "1x", "0x10", "1_000", "--1", "1-", "1e5e5"]
        {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid number `{text}`")
            );
        }
        // Only digits, a point, an exponent and a leading minus: no NaN, infinities or plus.
        for text in ["NaN", "nan", "inf", "Infinity", "+inf", "-inf", "-NaN", "-INFINITY", "+nan"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid value `{text}` (line protocol has no NaN or infinite numbers)")
            );
        }
        for text in ["+1", "infinite", "nan1"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!(
                    "line 1: field `f`: invalid value `{text}` (expected a number, an integer such as `1i`, an \
                     unsigned integer such as `1u`, a boolean or a double-quoted string)"
                )
            );
        }
        for text in ["-infinite", "-nan1"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid number `{text}`")
            );
        }
        for text in ["1e400", "-1e400", "1.8e308"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: number `{text}` is out of range of a 64-bit float")
            );
        }
    }

    #[test]
    fn invalid_number_of_the_brief_at_line_3() {
        let all = parse("m temp=1\nm temp=2\nm temp=12..5\n");
        assert_eq!(all[2].as_ref().unwrap_err().to_string(), "line 3: field `temp`: invalid number `12..5`");
    }

    // ---- Data types: integers and unsigned integers ----------------------------------------

    #[test]
    fn integer_examples_and_bounds() {
        assert_eq!(value("myMeasurement fieldKey=1i"), Int(1));
        assert_eq!(value("myMeasurement fieldKey=12485903i"), Int(12_485_903));
        assert_eq!(value("myMeasurement fieldKey=-12485903i"), Int(-12_485_903));
        assert_eq!(value("myMeasurement fieldKey=-9223372036854775808i"), Int(i64::MIN));
        assert_eq!(value("myMeasurement fieldKey=9223372036854775807i"), Int(i64::MAX));
        assert_eq!(value("mymeas value=1i"), Int(1));
        assert_eq!(value("m f=0i"), Int(0));
        assert_eq!(value("m f=-0i"), Int(0));
        assert_eq!(value("m f=0009i"), Int(9));
    }

    #[test]
    fn integer_errors() {
        for text in ["9223372036854775808i", "-9223372036854775809i", "99999999999999999999i"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: integer `{text}` is out of range of a 64-bit integer")
            );
        }
        for text in ["1.5i", "1e3i", "-i", "1ii", "--1i", "1-1i", "99999999999999999999xi"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid integer `{text}`")
            );
        }
        assert!(fails("m f=+1i", LineErrorKind::FieldValue).starts_with("line 1: field `f`: invalid value `+1i` ("));
        assert!(fails("m f=i", LineErrorKind::FieldValue).starts_with("line 1: field `f`: invalid value `i` ("));
    }

    #[test]
    fn unsigned_examples_and_bounds() {
        assert_eq!(value("myMeasurement fieldKey=1u"), UInt(1));
        assert_eq!(value("myMeasurement fieldKey=12485903u"), UInt(12_485_903));
        assert_eq!(value("myMeasurement fieldKey=0u"), UInt(0));
        assert_eq!(value("myMeasurement fieldKey=18446744073709551615u"), UInt(u64::MAX));
    }

    #[test]
    fn unsigned_errors() {
        for text in ["18446744073709551616u", "99999999999999999999999u"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: unsigned integer `{text}` is out of range of a 64-bit unsigned integer")
            );
        }
        for text in ["-1u", "-0u", "1.0u", "1e3u", "1uu", "-u"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid unsigned integer `{text}`")
            );
        }
    }

    // ---- Data types: strings and booleans ---------------------------------------------------

    #[test]
    fn string_examples() {
        assert_eq!(value(r#"myMeasurement fieldKey="this is a string""#), s("this is a string"));
        assert_eq!(value(r#"mymeas value="stringing along""#), s("stringing along"));
        // A quoted boolean is a string.
        assert_eq!(value(r#"mymeas value="true""#), s("true"));
        assert_eq!(value(r#"m f="""#), s(""));
        assert_eq!(value(r#"m f="a, b=c d #e 'f' \n""#), s(r"a, b=c d #e 'f' \n"));
        assert_eq!(value(r#"m f="1i""#), s("1i"));
    }

    #[test]
    fn string_length_limit() {
        let at_limit = "x".repeat(MAX_STRING_BYTES);
        assert_eq!(value(&format!("m f=\"{at_limit}\"")), s(&at_limit));
        // Escapes count once: 32 Ki escaped quotes are 64 KiB after unescaping.
        let quotes = "\\\"".repeat(MAX_STRING_BYTES / 2);
        assert_eq!(value(&format!("m f=\"{quotes}\"")), s(&"\"".repeat(MAX_STRING_BYTES / 2)));
        let over = "x".repeat(MAX_STRING_BYTES + 1);
        assert_eq!(
            fails(&format!("m f=\"{over}\""), LineErrorKind::Syntax),
            "line 1: the string of field `f` is 65537 bytes long, more than the limit of 65536"
        );
        assert_eq!(
            fails(&format!("{over} f=1"), LineErrorKind::Syntax),
            "line 1: the measurement is 65537 bytes long, more than the limit of 65536"
        );
        assert_eq!(
            fails(&format!("m,{over}=1 f=1"), LineErrorKind::Syntax),
            "line 1: a tag key is 65537 bytes long, more than the limit of 65536"
        );
        assert_eq!(
            fails(&format!("m,t={over} f=1"), LineErrorKind::Syntax),
            "line 1: the value of tag `t` is 65537 bytes long, more than the limit of 65536"
        );
        assert_eq!(
            fails(&format!("m {over}=1"), LineErrorKind::Syntax),
            "line 1: a field key is 65537 bytes long, more than the limit of 65536"
        );
    }

    #[test]
    fn string_errors() {
        assert_eq!(fails(r#"m f="abc"#, LineErrorKind::Syntax), "line 1: field `f`: the string has no closing `\"`");
        assert_eq!(fails(r#"m f="abc\""#, LineErrorKind::Syntax), "line 1: field `f`: the string has no closing `\"`");
        assert_eq!(
            fails(r#"m f="a"b,g=1"#, LineErrorKind::Syntax),
            "line 1: field `f`: unexpected `b` after the closing `\"`"
        );
        assert_eq!(
            fails(r#"m f="a""b""#, LineErrorKind::Syntax),
            "line 1: field `f`: unexpected `\"b\"` after the closing `\"`"
        );
        // A newline always ends the line, even inside quotes.
        let all = parse("m f=\"a\nb\" 1\n");
        assert_eq!(all[0].as_ref().unwrap_err().to_string(), "line 1: field `f`: the string has no closing `\"`");
        assert_eq!(all[1].as_ref().unwrap_err().to_string(), "line 2: field `1`: missing `=` and value");
    }

    #[test]
    fn boolean_forms() {
        for text in ["t", "T", "true", "True", "TRUE"] {
            assert_eq!(value(&format!("myMeasurement fieldKey={text}")), Bool(true), "{text}");
        }
        for text in ["f", "F", "false", "False", "FALSE"] {
            assert_eq!(value(&format!("myMeasurement fieldKey={text}")), Bool(false), "{text}");
        }
        assert_eq!(value("mymeas value=true"), Bool(true));
        for text in ["tru", "truE", "tRUE", "Tr", "falsey", "fals", "ff", "t1"] {
            assert_eq!(
                fails(&format!("m f={text}"), LineErrorKind::FieldValue),
                format!("line 1: field `f`: invalid boolean `{text}`")
            );
        }
        assert!(fails("m f=yes", LineErrorKind::FieldValue).starts_with("line 1: field `f`: invalid value `yes` ("));
    }

    #[test]
    fn every_type_in_one_line() {
        assert_eq!(
            one(r#"m a=1.5,b=-2i,c=3u,d=T,e="x" 5000000"#),
            expect("m", &[], &[("a", Float(1.5)), ("b", Int(-2)), ("c", UInt(3)), ("d", Bool(true)), ("e", s("x"))], 5)
        );
        let types: Vec<_> = one(r#"m a=1.5,b=-2i,c=3u,d=T,e="x""#).fields.iter().map(|(_, v)| v.type_name()).collect();
        assert_eq!(types, ["float", "integer", "uinteger", "boolean", "string"]);
    }

    // ---- Timestamps and precision ----------------------------------------------------------

    #[test]
    fn timestamp_examples_and_bounds() {
        assert_eq!(
            one(r#"myMeasurementName fieldKey="fieldValue" 1556813561098000000"#).timestamp_ms,
            1_556_813_561_098
        );
        // The reference's minimum and maximum, in nanoseconds, floored to milliseconds.
        assert_eq!(one("m f=1 -9223372036854775806").timestamp_ms, -9_223_372_036_855);
        assert_eq!(one("m f=1 9223372036854775806").timestamp_ms, 9_223_372_036_854);
        assert_eq!(one("m f=1 -9223372036854775808").timestamp_ms, -9_223_372_036_855);
        assert_eq!(one("m f=1 9223372036854775807").timestamp_ms, 9_223_372_036_854);
    }

    #[test]
    fn timestamp_errors() {
        // The v1 reference's "double quote the timestamp" example.
        assert_eq!(
            fails(r#"mymeas value=9 "1466625759000000000""#, LineErrorKind::Timestamp),
            r#"line 1: timestamp `"1466625759000000000"`: not an integer"#
        );
        for text in ["1.5", "1e9", "abc", "-", "+1", "1i", "0x10"] {
            assert_eq!(
                fails(&format!("m f=1 {text}"), LineErrorKind::Timestamp),
                format!("line 1: timestamp `{text}`: not an integer")
            );
        }
        for text in ["9223372036854775808", "-9223372036854775809", "100000000000000000000"] {
            assert_eq!(
                fails(&format!("m f=1 {text}"), LineErrorKind::Timestamp),
                format!("line 1: timestamp `{text}`: out of range of a 64-bit integer")
            );
        }
        assert_eq!(fails("m f=1 2 3", LineErrorKind::Syntax), "line 1: unexpected `3` after the timestamp");
        assert_eq!(fails("m f=1 2  3 4", LineErrorKind::Syntax), "line 1: unexpected `3 4` after the timestamp");
    }

    #[test]
    fn a_non_digit_anywhere_is_caught() {
        // Eight digits are checked at once; the bytes next to `0` and `9` must fail the check
        // in every position, in integers, unsigned integers and timestamps.
        let digits = "1234567890123456789";
        for at in 0..digits.len() {
            for bad in ['/', ':', 'a', '\u{7f}', '\u{0}', 'é'] {
                let mut text = digits.to_string();
                text.replace_range(at..=at, &bad.to_string());
                assert_eq!(
                    fails(&format!("m f=1 {text}"), LineErrorKind::Timestamp),
                    format!("line 1: timestamp {}: not an integer", quote(&text))
                );
                // A value starting with a non-digit is not a number at all.
                if at > 0 {
                    assert_eq!(
                        fails(&format!("m f={text}u"), LineErrorKind::FieldValue),
                        format!("line 1: field `f`: invalid unsigned integer {}", quote(&format!("{text}u")))
                    );
                    assert_eq!(
                        fails(&format!("m f={text}i"), LineErrorKind::FieldValue),
                        format!("line 1: field `f`: invalid integer {}", quote(&format!("{text}i")))
                    );
                }
            }
        }
    }

    #[test]
    fn precision_conversion_floors() {
        use Precision::*;
        for (precision, timestamp, ms) in [
            (Nanoseconds, 0, 0),
            (Nanoseconds, 999_999, 0),
            (Nanoseconds, 1_000_000, 1),
            (Nanoseconds, 1_999_999, 1),
            (Nanoseconds, -1, -1),
            (Nanoseconds, -999_999, -1),
            (Nanoseconds, -1_000_000, -1),
            (Nanoseconds, -1_000_001, -2),
            (Nanoseconds, i64::MIN, -9_223_372_036_855),
            (Microseconds, 1_999, 1),
            (Microseconds, -1, -1),
            (Microseconds, -1_000, -1),
            (Microseconds, -1_001, -2),
            (Microseconds, 1_451_606_400_000_000, 1_451_606_400_000),
            (Milliseconds, -1, -1),
            (Milliseconds, i64::MIN, i64::MIN),
            (Milliseconds, i64::MAX, i64::MAX),
            (Seconds, -2, -2_000),
            (Seconds, 1_451_606_400, 1_451_606_400_000),
            (Seconds, i64::MAX / 1_000, i64::MAX / 1_000 * 1_000),
            (Seconds, i64::MIN / 1_000, i64::MIN / 1_000 * 1_000),
        ] {
            assert_eq!(precision.to_epoch_ms(timestamp), Some(ms), "{precision:?} {timestamp}");
            let payload = format!("m f=1 {timestamp}");
            let line = parse_lines(&payload, precision, NOW).next().unwrap().unwrap();
            assert_eq!(line.timestamp_ms, ms, "{precision:?} {timestamp}");
        }
        assert_eq!(Seconds.to_epoch_ms(i64::MAX / 1_000 + 1), None);
        assert_eq!(Seconds.to_epoch_ms(i64::MIN / 1_000 - 1), None);
        let e = parse_lines("m f=1 9223372036854776", Seconds, NOW).next().unwrap().unwrap_err();
        assert_eq!(e.kind, LineErrorKind::Timestamp);
        assert_eq!(
            e.to_string(),
            "line 1: timestamp `9223372036854776`: out of range of epoch milliseconds in precision s"
        );
        // A missing timestamp takes `now_ms` as is, whatever the precision.
        for precision in Precision::ALL {
            assert_eq!(parse_lines("m f=1", precision, NOW).next().unwrap().unwrap().timestamp_ms, NOW);
        }
    }

    #[test]
    fn precision_labels() {
        assert_eq!(Precision::default(), Precision::Nanoseconds);
        for precision in Precision::ALL {
            assert_eq!(Precision::parse(precision.as_str()), Some(precision));
            let json = format!("\"{}\"", precision.as_str());
            assert_eq!(serde_json::from_str::<Precision>(&json).unwrap(), precision);
            assert_eq!(serde_json::to_string(&precision).unwrap(), json);
        }
        assert_eq!(Precision::parse("d"), None);
        assert_eq!(Precision::parse("NS"), None);
        assert_eq!(Precision::Minutes.to_epoch_ms(28_401_120), Some(1_704_067_200_000));
        assert_eq!(Precision::Hours.to_epoch_ms(473_352), Some(1_704_067_200_000));
        assert_eq!(Precision::Hours.to_epoch_ms(i64::MAX / 1_000_000), None);
    }

    // ---- Special characters and escaping ---------------------------------------------------

    #[test]
    fn special_character_examples_v2() {
        assert_eq!(
            one(r#"my\ Measurement fieldKey="string value""#),
            expect("my Measurement", &[], &[("fieldKey", s("string value"))], NOW)
        );
        assert_eq!(
            one(r#"myMeasurement fieldKey="\"string\" within a string""#),
            expect("myMeasurement", &[], &[("fieldKey", s(r#""string" within a string"#))], NOW)
        );
        assert_eq!(
            one(r"myMeasurement,tag\ Key1=tag\ Value1,tag\ Key2=tag\ Value2 fieldKey=100"),
            expect(
                "myMeasurement",
                &[("tag Key1", "tag Value1"), ("tag Key2", "tag Value2")],
                &[("fieldKey", Float(100.0))],
                NOW
            )
        );
        assert_eq!(
            one(r#"myMeasurement,tagKey=🍭 fieldKey="Launch 🚀" 1556813561098000000"#),
            expect("myMeasurement", &[("tagKey", "🍭")], &[("fieldKey", s("Launch 🚀"))], 1_556_813_561_098)
        );
    }

    #[test]
    fn special_character_example_v1() {
        let line = one(
            r#""measurement\ with\ quo⚡️es\ and\ emoji",tag\ key\ with\ sp🚀ces=tag\,value\,with"commas" field_k\ey="string field value, only \" need be esc🍭ped""#,
        );
        assert_eq!(
            line,
            expect(
                r#""measurement with quo⚡️es and emoji""#,
                &[("tag key with sp🚀ces", r#"tag,value,with"commas""#)],
                &[("field_k\\ey", s(r#"string field value, only " need be esc🍭ped"#))],
                NOW
            )
        );
        // `\e` escapes nothing, so the field key is borrowed as is.
        assert!(matches!(line.fields[0].0, Cow::Borrowed(r"field_k\ey")));
    }

    #[test]
    fn tutorial_escape_examples() {
        let parsed = |text| {
            let line = one(text);
            (
                line.measurement.into_owned(),
                line.tags[0].0.to_string(),
                line.tags[0].1.to_string(),
                line.fields[0].0.to_string(),
            )
        };
        let owned = |m: &str, k: &str, v: &str, f: &str| (m.to_string(), k.to_string(), v.to_string(), f.to_string());
        assert_eq!(
            parsed(r"weather,location=us\,midwest temperature=82 1465839830100400200"),
            owned("weather", "location", "us,midwest", "temperature")
        );
        assert_eq!(
            parsed(r"weather,location=us-midwest temp\=rature=82 1465839830100400200"),
            owned("weather", "location", "us-midwest", "temp=rature")
        );
        assert_eq!(
            parsed(r"weather,location\ place=us-midwest temperature=82 1465839830100400200"),
            owned("weather", "location place", "us-midwest", "temperature")
        );
        assert_eq!(
            parsed(r"wea\,ther,location=us-midwest temperature=82 1465839830100400200"),
            owned("wea,ther", "location", "us-midwest", "temperature")
        );
        assert_eq!(
            parsed(r"wea\ ther,location=us-midwest temperature=82 1465839830100400200"),
            owned("wea ther", "location", "us-midwest", "temperature")
        );
    }

    #[test]
    fn quotes_in_names_are_ordinary() {
        // The v1 reference's "double quote a measurement name" example.
        assert_eq!(one(r#""mymeas" value=200"#), expect(r#""mymeas""#, &[], &[("value", Float(200.0))], NOW));
        assert_eq!(one(r#"'m',"t"='v' 'f'=1i"#), expect("'m'", &[(r#""t""#, "'v'")], &[("'f'", Int(1))], NOW));
    }

    #[test]
    fn escaping_backslashes_table() {
        // The reference's table: written → read.
        let table =
            [(r"\", r"\"), (r"\\", r"\"), (r"\\\", r"\\"), (r"\\\\", r"\\"), (r"\\\\\", r"\\\"), (r"\\\\\\", r"\\\")];
        for (written, read) in table {
            let text = format!("x{written}y");
            let expected = format!("x{read}y");
            let payload = format!(r#"{text},{text}={text} {text}="{text}""#);
            let line = one(&payload);
            assert_eq!(line.measurement, expected, "measurement {written}");
            assert_eq!(
                line.tags,
                [(Cow::Borrowed(expected.as_str()), Cow::Borrowed(expected.as_str()))],
                "tag {written}"
            );
            assert_eq!(line.fields[0], (Cow::Borrowed(expected.as_str()), s(&expected)), "field {written}");
        }
        // At the end of a string value, the backslashes meet the closing quote.
        assert_eq!(value(r#"m f="a\\""#), s(r"a\"));
        assert_eq!(value(r#"m f="a\\\\""#), s(r"a\\"));
        assert_eq!(value(r#"m f="\\\"""#), s(r#"\""#));
    }

    #[test]
    fn escapes_per_element() {
        // Measurement: comma, space and backslash; `=` needs no escape and `\=` is literal.
        assert_eq!(one(r"a\,b\ c=d\=e f=1").measurement, r"a,b c=d\=e");
        // A backslash before any other character is literal, in every element.
        assert_eq!(
            one(r#"m\t\a\",t\x\"=v\n\' f\1=1,g="\n\t\a\,\ \=""#),
            expect(r#"m\t\a\""#, &[(r#"t\x\""#, r"v\n\'")], &[(r"f\1", Float(1.0)), ("g", s(r"\n\t\a\,\ \="))], NOW)
        );
        // Tag keys, tag values and field keys: comma, equals sign, space.
        assert_eq!(
            one(r"m,k\,\=\ k=v\,\=\ v f\,\=\ f=1"),
            expect("m", &[("k,= k", "v,= v")], &[("f,= f", Float(1.0))], NOW)
        );
        // An unescaped `=` in a tag value is part of it.
        assert_eq!(one("m,t=a=b f=1").tags, [(Cow::Borrowed("t"), Cow::Borrowed("a=b"))]);
        // A backslash at the end of an element is literal; doubled, it lets a space follow.
        assert_eq!(one(r"m\\ f=1").measurement, r"m\");
        assert_eq!(one(r"m,t=v\\ f=1").tags[0].1, r"v\");
        assert_eq!(one(r"m\  f=1").measurement, "m ");
        // An escaped comma or space does not end the element.
        assert_eq!(one(r"m,t=a\ b\,c f=1,g=2").tags[0].1, "a b,c");
    }

    #[test]
    fn borrows_unless_unescaping() {
        let line = one(r#"m,t=v f="s",g=1"#);
        assert!(matches!(line.measurement, Cow::Borrowed("m")));
        assert!(matches!(line.tags[0], (Cow::Borrowed("t"), Cow::Borrowed("v"))));
        assert!(matches!(line.fields[0], (Cow::Borrowed("f"), Str(Cow::Borrowed("s")))));
        let line = one(r#"m\ 1,t\ 1=v\ 1 f\ 1="s\"1""#);
        assert!(matches!(line.measurement, Cow::Owned(_)));
        assert!(matches!(line.tags[0], (Cow::Owned(_), Cow::Owned(_))));
        assert!(matches!(line.fields[0], (Cow::Owned(_), Str(Cow::Owned(_)))));
        let owned = line.clone().into_owned();
        assert_eq!(owned, line);
    }

    // ---- Comments, blank lines, whitespace -------------------------------------------------

    #[test]
    fn comment_example() {
        let all = parse("# This is a comment\nmyMeasurement fieldKey=\"string value\" 1556813561098000000");
        assert_eq!(all.len(), 1);
        let line = all.into_iter().next().unwrap().unwrap();
        assert_eq!(
            line,
            Line { number: 2, ..expect("myMeasurement", &[], &[("fieldKey", s("string value"))], 1_556_813_561_098) }
        );
    }

    #[test]
    fn comments_blank_lines_and_line_numbers() {
        let payload =
            "\n# comment\n   \n\t# indented comment\nm f=1\n\n  m  f=2   3000000  \n#m f=3\nm#x f=4\nm f=\"#\"\n";
        let lines: Vec<_> = parse(payload).into_iter().map(Result::unwrap).collect();
        let seen: Vec<_> = lines.iter().map(|l| (l.number, l.measurement.to_string(), l.fields[0].1.clone())).collect();
        assert_eq!(
            seen,
            [
                (5, "m".to_string(), Float(1.0)),
                (7, "m".to_string(), Float(2.0)),
                (9, "m#x".to_string(), Float(4.0)),
                (10, "m".to_string(), s("#")),
            ]
        );
        assert_eq!(lines[1].timestamp_ms, 3);
        assert!(parse("").is_empty());
        assert!(parse("\n\n# only comments\r\n  \r\n").is_empty());
    }

    #[test]
    fn crlf_is_tolerated() {
        let lf = parse("a,t=1 f=\"x\" 1000000\nb g=2i\n");
        let crlf = parse("a,t=1 f=\"x\" 1000000\r\nb g=2i\r\n");
        assert_eq!(lf, crlf);
        assert_eq!(lf.len(), 2);
        assert_eq!(crlf[0].as_ref().unwrap().fields[0].1, s("x"));
        assert_eq!(crlf[1].as_ref().unwrap().fields[0].1, Int(2));
        // A bare `\r` is not a line end.
        assert_eq!(parse("a f=1\rb g=2").len(), 1);
    }

    #[test]
    fn blanks_at_line_ends_are_ignored() {
        for payload in ["m f=1 5000000\r\n", "m f=1 5000000 \t\r\n", " \t\rm f=1 5000000", "m f=1  5000000\t"] {
            assert_eq!(one(payload), expect("m", &[], &[("f", Float(1.0))], 5), "{payload:?}");
        }
        for (payload, v) in [
            ("m f=1\r\n", Float(1.0)),
            ("m f=1.5\t\r\n", Float(1.5)),
            ("m f=1i \r", Int(1)),
            ("m f=1u\t\n", UInt(1)),
            ("m f=t\r\n", Bool(true)),
            ("m f=1e3\r\n", Float(1000.0)),
            ("m f=\"a\"\t\r\n", s("a")),
            ("m f=\"a\r\"\r\n", s("a\r")),
        ] {
            assert_eq!(one(payload), expect("m", &[], &[("f", v)], NOW), "{payload:?}");
        }
        for (payload, message) in [
            ("m,t=v\r\n", "line 1: no fields: a line needs at least one field"),
            ("m,\r\n", "line 1: the tag set ends with `,`"),
            ("m,t=\r\n", "line 1: tag `t`: empty value"),
            ("m,t\t\r\n", "line 1: tag `t`: missing `=` and value"),
            ("m f=1,\r\n", "line 1: the field set ends with `,`"),
            ("m f\r\n", "line 1: field `f`: missing `=` and value"),
            ("m f=1\t2\r\n", "line 1: field `f`: invalid number `1\\t2`"),
            ("m f=\"a\"\tb\r\n", "line 1: field `f`: unexpected `\\tb` after the closing `\"`"),
            ("m f=1 2\t3\r\n", "line 1: timestamp `2\\t3`: not an integer"),
            ("m f=1 2 \t3 \r\n", "line 1: unexpected `3` after the timestamp"),
        ] {
            assert_eq!(error(payload).to_string(), message, "{payload:?}");
        }
        let numbers: Vec<_> = parse("a f=1\n\r\n \t\n# c\r\nb f=2\r").into_iter().map(|r| r.unwrap().number).collect();
        assert_eq!(numbers, [1, 5]);
    }

    // ---- Structure errors -----------------------------------------------------------------

    #[test]
    fn structure_errors() {
        use LineErrorKind::{NoFields, Syntax};
        for (payload, kind, message) in [
            ("m", NoFields, "no fields: a line needs at least one field"),
            ("m,t=1", NoFields, "no fields: a line needs at least one field"),
            (r"m\ ", NoFields, "no fields: a line needs at least one field"),
            (",t=1 f=1", Syntax, "missing measurement: the line starts with `,`"),
            ("m, f=1", Syntax, "the tag set ends with `,`"),
            ("m,t=a, f=1", Syntax, "the tag set ends with `,`"),
            ("m,", Syntax, "the tag set ends with `,`"),
            ("m,=v f=1", Syntax, "empty tag key"),
            ("m,,t=v f=1", Syntax, "empty tag key"),
            ("m,t f=1", Syntax, "tag `t`: missing `=` and value"),
            ("m,t,u=v f=1", Syntax, "tag `t`: missing `=` and value"),
            ("m,t= f=1", Syntax, "tag `t`: empty value"),
            ("m,t=,u=v f=1", Syntax, "tag `t`: empty value"),
            ("m,t=a,t=b f=1", Syntax, "duplicate tag key `t`"),
            (r"m,t\ 1=a,t\ 1=b f=1", Syntax, "duplicate tag key `t 1`"),
            ("m f", Syntax, "field `f`: missing `=` and value"),
            ("m f,g=1", Syntax, "field `f`: missing `=` and value"),
            ("m 1556813561098000000", Syntax, "field `1556813561098000000`: missing `=` and value"),
            ("m =1", Syntax, "empty field key"),
            ("m ,f=1", Syntax, "empty field key"),
            ("m f=1,,g=2", Syntax, "empty field key"),
            ("m f=1,", Syntax, "the field set ends with `,`"),
            ("m f=1, 5", Syntax, "the field set ends with `,`"),
            ("m f=", LineErrorKind::FieldValue, "field `f`: missing value"),
            ("m f= 1", LineErrorKind::FieldValue, "field `f`: missing value"),
            ("m f=,g=1", LineErrorKind::FieldValue, "field `f`: missing value"),
        ] {
            let e = error(payload);
            assert_eq!((e.line, e.kind, e.reason.as_str()), (1, kind, message), "{payload}");
        }
    }

    #[test]
    fn error_quotes_are_cut_and_escaped() {
        let long = "9".repeat(100);
        assert_eq!(
            fails(&format!("m f={long}.5.5"), LineErrorKind::FieldValue),
            format!("line 1: field `f`: invalid number `{}…`", "9".repeat(64))
        );
        assert_eq!(
            fails("m f=\u{1}", LineErrorKind::FieldValue).split(" (").next().unwrap(),
            "line 1: field `f`: invalid value `\\u{1}`"
        );
    }

    // ---- Duplicate fields -----------------------------------------------------------------

    #[test]
    fn duplicate_fields_last_wins() {
        assert_eq!(
            one(r#"m a=1,b=2,a=3i,c=t,b="x""#),
            expect("m", &[], &[("a", Int(3)), ("b", s("x")), ("c", Bool(true))], NOW)
        );
        // Beyond the pairwise limit, with the hash path.
        let mut text = String::from("m ");
        for i in 0..40 {
            text.push_str(&format!("f{i}={i}i,"));
        }
        text.push_str("f7=-7i,f39=t");
        let line = one(&text);
        assert_eq!(line.fields.len(), 40);
        assert_eq!(line.fields[7], (Cow::Borrowed("f7"), Int(-7)));
        assert_eq!(line.fields[39], (Cow::Borrowed("f39"), Bool(true)));
        assert_eq!(line.fields[8], (Cow::Borrowed("f8"), Int(8)));
        // Duplicate tags beyond the pairwise limit are found too.
        let tags: String = (0..40).map(|i| format!(",t{i}=v")).collect();
        assert_eq!(fails(&format!("m{tags},t33=w f=1"), LineErrorKind::Syntax), "line 1: duplicate tag key `t33`");
        assert_eq!(one(&format!("m{tags} f=1")).tags.len(), 40);
    }

    // ---- Bad lines among good ones -------------------------------------------------------

    #[test]
    fn bad_lines_do_not_stop_good_ones() {
        let payload = "# header\n\
                       cpu,host=a usage=1.5 1000000\n\
                       cpu,host=b usage=12..5 2000000\n\
                       \n\
                       cpu,host=c usage=3i 3000000\r\n\
                       cpu,host=d\n\
                       cpu,host=e usage=\"open 5000000\n\
                       cpu,host=f usage=6u,ok=T 6000000\n\
                       cpu,host=g usage=1 7x\n\
                       cpu,host=h usage=8";
        let results: Vec<_> = parse(payload)
            .into_iter()
            .map(|r| r.map(|l| (l.number, l.tag("host").unwrap().to_string(), l.fields, l.timestamp_ms)))
            .collect();
        assert_eq!(
            results,
            [
                Ok((2, "a".to_string(), vec![(Cow::Borrowed("usage"), Float(1.5))], 1)),
                Err(LineError {
                    line: 3,
                    kind: LineErrorKind::FieldValue,
                    reason: "field `usage`: invalid number `12..5`".to_string()
                }),
                Ok((5, "c".to_string(), vec![(Cow::Borrowed("usage"), Int(3))], 3)),
                Err(LineError {
                    line: 6,
                    kind: LineErrorKind::NoFields,
                    reason: "no fields: a line needs at least one field".to_string()
                }),
                Err(LineError {
                    line: 7,
                    kind: LineErrorKind::Syntax,
                    reason: "field `usage`: the string has no closing `\"`".to_string()
                }),
                Ok((8, "f".to_string(), vec![(Cow::Borrowed("usage"), UInt(6)), (Cow::Borrowed("ok"), Bool(true))], 6)),
                Err(LineError {
                    line: 9,
                    kind: LineErrorKind::Timestamp,
                    reason: "timestamp `7x`: not an integer".to_string()
                }),
                Ok((10, "h".to_string(), vec![(Cow::Borrowed("usage"), Float(8.0))], NOW)),
            ]
        );
    }

    #[test]
    fn invalid_utf8_is_rejected_by_the_caller() {
        assert_eq!(payload_str(b"m f=1\n"), Ok("m f=1\n"));
        let e = payload_str(b"m f=1\nm f=2\nm,t=\xff f=3\n").unwrap_err();
        assert_eq!(e, NotUtf8 { offset: 16, line: 3 });
        assert_eq!(e.to_string(), "payload is not UTF-8: invalid byte at offset 16 (line 3)");
        assert_eq!(payload_str(b"\xe2\x82").unwrap_err(), NotUtf8 { offset: 0, line: 1 });
        // Then the payload without its lines that are not UTF-8, each line at its number.
        let (text, bad) = utf8_lines(b"m f=1\nm,t=\xff f=2\n\nm f=\"\xc3\xa9\xc3\" f=3\nm f=4\r\n\xe2\x82");
        assert_eq!(text, "m f=1\n\n\n\nm f=4\r\n");
        assert_eq!(
            bad,
            [NotUtf8 { offset: 10, line: 2 }, NotUtf8 { offset: 24, line: 4 }, NotUtf8 { offset: 38, line: 6 }]
        );
        let lines: Vec<(usize, f64)> = parse_lines(&text, Precision::Milliseconds, 0)
            .map(|l| l.map(|l| (l.number, if let Some(FieldValue::Float(f)) = l.field("f") { *f } else { -1.0 })))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(lines, [(1, 1.0), (5, 4.0)]);
        assert_eq!(utf8_lines(b"m f=1\n"), ("m f=1\n".to_string(), vec![]));
    }

    // ---- Properties -------------------------------------------------------------------------

    /// Characters that names and strings are drawn from: every special character of the
    /// grammar, a few ordinary ones, and multi-byte ones.
    const ALPHABET: &[char] =
        &['a', 'Z', '0', '9', '_', '-', '.', ' ', ',', '=', '\\', '"', '\'', '#', 'i', 'u', 't', 'é', '🚀'];

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(ALPHABET), 1..=max).prop_map(String::from_iter)
    }

    /// Field keys from a tiny pool half of the time, so that duplicates happen.
    fn field_key() -> impl Strategy<Value = String> {
        prop_oneof![text(6), prop::sample::select(vec!["a".to_string(), "b\\".to_string(), "c d".to_string()])]
    }

    /// A field value and the spelling of a boolean (index into the accepted forms).
    fn field_value_strategy() -> impl Strategy<Value = (FieldValue<'static>, usize)> {
        prop_oneof![
            any::<f64>().prop_filter("finite", |v| v.is_finite()).prop_map(Float),
            any::<i64>().prop_map(Int),
            any::<u64>().prop_map(UInt),
            any::<bool>().prop_map(Bool),
            prop::collection::vec(prop::sample::select(ALPHABET), 0..10)
                .prop_map(|c| Str(Cow::Owned(String::from_iter(c)))),
        ]
        .prop_flat_map(|v| (Just(v), 0..5usize))
    }

    #[derive(Debug, Clone)]
    struct Point {
        measurement: String,
        tags: Vec<(String, String)>,
        fields: Vec<(String, FieldValue<'static>, usize)>,
        timestamp: Option<i64>,
    }

    fn point() -> impl Strategy<Value = Point> {
        (
            text(8).prop_filter("a leading `#` makes a comment", |m| !m.starts_with('#')),
            prop::collection::vec((text(6), text(6)), 0..4),
            prop::collection::vec((field_key(), field_value_strategy()), 1..6),
            prop::option::of(i64::MIN / 1_000..=i64::MAX / 1_000),
        )
            .prop_map(|(measurement, mut tags, fields, timestamp)| {
                let mut seen = HashSet::new();
                tags.retain(|(k, _)| seen.insert(k.clone()));
                let fields = fields.into_iter().map(|(k, (v, spelling))| (k, v, spelling)).collect();
                Point { measurement, tags, fields, timestamp }
            })
    }

    /// Writes `s` escaping the bytes in `escapes`. `minimal` doubles a backslash only where it
    /// would otherwise escape the next character (or the delimiter after the element), which
    /// exercises the rule that other backslashes are literal.
    fn write_escaped(out: &mut String, s: &str, escapes: &str, minimal: bool) {
        let chars: Vec<char> = s.chars().collect();
        for (i, &c) in chars.iter().enumerate() {
            let next_escapable = chars.get(i + 1).is_none_or(|n| escapes.contains(*n));
            if c == '\\' && minimal && !next_escapable {
                out.push('\\');
            } else if escapes.contains(c) {
                out.push('\\');
                out.push(c);
            } else {
                out.push(c);
            }
        }
    }

    /// The line protocol text of `p`.
    fn write_point(p: &Point, minimal: bool) -> String {
        let mut out = String::new();
        write_escaped(&mut out, &p.measurement, ", \\", minimal);
        for (k, v) in &p.tags {
            out.push(',');
            write_escaped(&mut out, k, ",= \\", minimal);
            out.push('=');
            // `=` needs no escape in a tag value, but a backslash before it must be doubled.
            if minimal {
                let chars: Vec<char> = v.chars().collect();
                for (i, &c) in chars.iter().enumerate() {
                    match c {
                        '\\' if chars.get(i + 1).is_none_or(|n| ",= \\".contains(*n)) => out.push_str("\\\\"),
                        ',' | ' ' => {
                            out.push('\\');
                            out.push(c);
                        }
                        _ => out.push(c),
                    }
                }
            } else {
                write_escaped(&mut out, v, ",= \\", false);
            }
        }
        for (i, (k, v, spelling)) in p.fields.iter().enumerate() {
            out.push(if i == 0 { ' ' } else { ',' });
            write_escaped(&mut out, k, ",= \\", minimal);
            out.push('=');
            match v {
                Float(v) => out.push_str(&format!("{v:?}")),
                Int(v) => out.push_str(&format!("{v}i")),
                UInt(v) => out.push_str(&format!("{v}u")),
                Bool(true) => out.push_str(["t", "T", "true", "True", "TRUE"][*spelling]),
                Bool(false) => out.push_str(["f", "F", "false", "False", "FALSE"][*spelling]),
                Str(s) => {
                    out.push('"');
                    write_escaped(&mut out, s, "\"\\", minimal);
                    out.push('"');
                }
            }
        }
        if let Some(ts) = p.timestamp {
            out.push_str(&format!(" {ts}"));
        }
        out
    }

    /// What parsing the text of `p` must give: repeated field keys keep their first position
    /// and last value.
    fn oracle(p: &Point, number: usize, precision: Precision) -> Line<'static> {
        let mut fields: Vec<(Cow<'static, str>, FieldValue<'static>)> = Vec::new();
        for (k, v, _) in &p.fields {
            match fields.iter_mut().find(|(key, _)| key == k) {
                Some(slot) => slot.1 = v.clone(),
                None => fields.push((Cow::Owned(k.clone()), v.clone())),
            }
        }
        let floor =
            |divisor: i128| p.timestamp.map_or(NOW, |ts| i64::try_from((i128::from(ts)).div_euclid(divisor)).unwrap());
        Line {
            number,
            measurement: Cow::Owned(p.measurement.clone()),
            tags: p.tags.iter().map(|(k, v)| (Cow::Owned(k.clone()), Cow::Owned(v.clone()))).collect(),
            fields,
            timestamp_ms: match precision {
                Precision::Nanoseconds => floor(1_000_000),
                Precision::Microseconds => floor(1_000),
                Precision::Milliseconds => floor(1),
                Precision::Seconds => p.timestamp.map_or(NOW, |ts| ts * 1_000),
                Precision::Minutes => p.timestamp.map_or(NOW, |ts| ts * 60_000),
                Precision::Hours => p.timestamp.map_or(NOW, |ts| ts * 3_600_000),
            },
            timestamped: p.timestamp.is_some(),
        }
    }

    #[test]
    fn series_keys_are_offered_and_a_known_one_skips_the_tags() {
        let payload = "m,name=a,site=x v=1 5\nm,name=a\\ b v=2 6\nm v=3 7\nm,name=a,site=x v=4 8\n";
        let mut offered = Vec::new();
        let mut lines = parse_lines(payload, Precision::Nanoseconds, NOW);
        let mut got = Vec::new();
        while let Some((line, key)) = lines.next_keyed(|key| {
            offered.push(key);
            key == "m,name=a,site=x" && offered.len() > 1
        }) {
            got.push((line.unwrap(), key));
        }
        // The line with a backslash before its first space is not offered.
        assert_eq!(offered, ["m,name=a,site=x", "m", "m,name=a,site=x"]);
        let summary: Vec<(usize, &str, usize, SeriesKey<'_>)> =
            got.iter().map(|(l, k)| (l.number, &*l.measurement, l.tags.len(), *k)).collect();
        assert_eq!(
            summary,
            [
                (1, "m", 2, SeriesKey::New("m,name=a,site=x")),
                (2, "m", 1, SeriesKey::None),
                (3, "m", 0, SeriesKey::New("m")),
                (4, "m", 0, SeriesKey::Known("m,name=a,site=x")),
            ]
        );
        assert_eq!(got[1].0.tags[0].1, "a b");
        assert_eq!(got[3].0.fields, [(Cow::Borrowed("v"), Float(4.0))]);
        assert_eq!(got[3].0.timestamp_ms, 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// A line read quick is the line parsed in full, with the expected keys and the values
        /// read; any other line is as parsed in full.
        #[test]
        fn quick_lines_read_as_in_full(
            lines in prop::collection::vec(
                (
                    prop::sample::select(&["m,t=1", "m,t=1", "m,t=1", "m", "n,t=1", " m,t=1", "m,t=1\t"][..]),
                    prop::sample::select(&[" ", " ", "  ", "\t", " \t"][..]),
                    {
                        let value = || prop::sample::select(&[
                            "1", "-2.5", "3i", "4u", "-4u", "9223372036854775808u", "99999999999999999999",
                            "1e5", ".5", "7.", "\"s\"", "t", "", "9223372036854775808i", "1.0\t", "1\r", "-",
                            "12345678901234567890", "0.000001", "-0", "1i2",
                        ][..]);
                        let field = (
                            prop::sample::select(&["a", "b", "c", "a b", "a\\ b", "", "ab"][..]),
                            prop::sample::select(&["=", "=", "", "=="][..]),
                            value(),
                        );
                        prop_oneof![
                            3 => (value(), value()).prop_map(|(x, y)| vec![("a", "=", x), ("b", "=", y)]),
                            1 => (prop::sample::select(&["", "==", "=", "x="][..]), value(), value())
                                .prop_map(|(eq, x, y)| vec![("a", eq, x), ("b", "=", y)]),
                            2 => prop::collection::vec(field, 0..4),
                        ]
                    },
                    prop::sample::select(&[",", ",", ",,", ", "][..]),
                    prop::sample::select(&[
                        "", " 12", " 12", " -7", "  12  ", " 12\r", " x", " 99999999999999999999", "\t", " 12 13",
                        ",", " 1.5", " 9223372036854775807", ",c=1 12",
                    ][..]),
                ),
                0..8,
            )
        ) {
            let payload: String = lines
                .iter()
                .map(|(key, sep, fields, comma, tail)| {
                    let fields: Vec<String> = fields.iter().map(|(k, eq, v)| format!("{k}{eq}{v}")).collect();
                    format!("{key}{sep}{}{tail}\n", fields.join(comma))
                })
                .collect();
            let mut full = parse_lines(&payload, Precision::Nanoseconds, NOW);
            let mut quick = parse_lines(&payload, Precision::Nanoseconds, NOW);
            let mut expect = expecting("m", &["a", "b"]);
            loop {
                let want = full.next_keyed(|_| true);
                let got = quick.next_expecting(|_| true, &mut expect);
                let (Some((want, want_key)), Some((got, got_key))) = (want, got) else {
                    prop_assert!(quick.next_expecting(|_| true, &mut expect).is_none());
                    break;
                };
                match got_key {
                    SeriesKey::Quick(key) => {
                        let line = want.expect("a line read quick parses in full");
                        prop_assert_eq!(want_key, SeriesKey::Known(key));
                        let fields = vec![("a".into(), expect.values[0].clone()), ("b".into(), expect.values[1].clone())];
                        let got = got.expect("read quick");
                        prop_assert_eq!(Line { fields, ..got }, line);
                    }
                    key => {
                        prop_assert_eq!(key, want_key);
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }

        #[test]
        fn round_trip(
            points in prop::collection::vec((point(), any::<bool>(), 0..3usize), 1..6),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            crlf in any::<bool>(),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut payload = String::new();
            let mut expected = Vec::new();
            let mut number = 0;
            // Timestamps in range of epoch milliseconds in every precision: the points' range
            // (seconds') scaled down for minutes and hours.
            let scale = match precision {
                Precision::Minutes => 60,
                Precision::Hours => 3_600,
                _ => 1,
            };
            let points: Vec<_> = points
                .into_iter()
                .map(|(p, minimal, filler)| (Point { timestamp: p.timestamp.map(|t| t / scale), ..p }, minimal, filler))
                .collect();
            for (p, minimal, filler) in &points {
                // Blank and comment lines between points shift the line numbers.
                for k in 0..*filler {
                    payload.push_str(if k == 0 { "# a, comment=\"x\"" } else { "  " });
                    payload.push_str(eol);
                    number += 1;
                }
                payload.push_str(&write_point(p, *minimal));
                payload.push_str(eol);
                number += 1;
                expected.push(oracle(p, number, precision));
            }
            let parsed: Vec<Line<'_>> = parse_lines(&payload, precision, NOW)
                .collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(format!("{e} in {payload:?}")))?;
            prop_assert_eq!(&parsed, &expected, "payload {:?}", payload);
            // Floats come back bit for bit (`==` would not tell 0.0 from -0.0).
            for (got, want) in parsed.iter().zip(&expected) {
                for ((_, g), (_, w)) in got.fields.iter().zip(&want.fields) {
                    if let (Float(g), Float(w)) = (g, w) {
                        prop_assert_eq!(g.to_bits(), w.to_bits());
                    }
                }
            }
        }

        /// Lines do not leak into each other: a payload parses as its lines parsed one by
        /// one, and line numbers only grow.
        #[test]
        fn lines_are_independent(
            payload in prop::collection::vec(
                prop::sample::select(&['a', '1', '-', '.', 'e', 'i', 'u', 't', 'F', ' ', ',', '=', '"',
                    '\\', '#', '\n', '\r', '\t', 'é'][..]),
                0..80,
            ).prop_map(String::from_iter),
            precision in prop::sample::select(Precision::ALL.to_vec()),
        ) {
            let whole: Vec<_> = parse_lines(&payload, precision, NOW).collect();
            let mut one_by_one = Vec::new();
            for (k, text) in payload.split('\n').enumerate() {
                for result in parse_lines(text, precision, NOW) {
                    one_by_one.push(match result {
                        Ok(line) => Ok(Line { number: line.number + k, ..line }),
                        Err(e) => Err(LineError { line: e.line + k, ..e }),
                    });
                }
            }
            prop_assert_eq!(&whole, &one_by_one);
            let physical_lines = payload.split('\n').count();
            let mut last = 0;
            for result in &whole {
                let number = match result {
                    Ok(line) => {
                        prop_assert!(!line.fields.is_empty());
                        line.number
                    }
                    Err(e) => {
                        prop_assert!(!e.reason.is_empty());
                        e.line
                    }
                };
                prop_assert!(number > last && number <= physical_lines);
                last = number;
            }
        }

        /// A line whose series key the caller knows parses as it does in full, without its
        /// tags; keys are offered exactly for the lines of the rule (no backslash or newline
        /// before the first space).
        #[test]
        fn known_series_keys_parse_as_in_full(
            payload in prop::collection::vec(
                prop::sample::select(&["m", "n", ",", "=", " ", "a", "b=x", "1", "2i", "\\", "\n", "\t", "\"", "#"][..]),
                0..40,
            ).prop_map(|parts| parts.concat()),
        ) {
            let full: Vec<_> = parse_lines(&payload, Precision::Nanoseconds, NOW).collect();
            // First pass: nothing known; note the keys of the lines that parsed.
            let mut lines = parse_lines(&payload, Precision::Nanoseconds, NOW);
            let mut first = Vec::new();
            while let Some((line, key)) = lines.next_keyed(|_| false) {
                first.push((line, key));
            }
            prop_assert_eq!(first.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(), full.clone());
            let mut learned = std::collections::HashSet::new();
            for (line, key) in &first {
                match (line, key) {
                    (Ok(line), SeriesKey::New(key)) => {
                        let start = payload.find(&format!("{key} ")).unwrap();
                        prop_assert!(!key.contains(['\\', '\n']) && key.len() <= MAX_SERIES_KEY_BYTES);
                        prop_assert!(key.starts_with(&*line.measurement));
                        prop_assert_eq!(payload.as_bytes()[start + key.len()], b' ');
                        learned.insert(*key);
                    }
                    (Ok(_), SeriesKey::None) => {}
                    (Err(_), SeriesKey::None) => {}
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
            // Second pass: the learned keys are known.
            let mut lines = parse_lines(&payload, Precision::Nanoseconds, NOW);
            let mut k = 0;
            while let Some((line, key)) = lines.next_keyed(|key| learned.contains(key)) {
                match key {
                    SeriesKey::Known(_) => {
                        let want = full[k].clone().map(|l| Line { tags: Vec::new(), ..l });
                        prop_assert_eq!(line, want);
                    }
                    _ => prop_assert_eq!(line, full[k].clone()),
                }
                k += 1;
            }
            prop_assert_eq!(k, full.len());
        }

        #[test]
        fn any_unicode_never_panics(payload in "\\PC{0,80}") {
            for result in parse_lines(&payload, Precision::Nanoseconds, NOW) {
                let _ = result;
            }
        }

        /// The one-pass number parser agrees with the standard library, digit for digit.
        #[test]
        fn numbers_match_std(text in "-?[0-9]{1,22}(\\.[0-9]{0,22})?") {
            let payload = format!("m f={text}");
            let expected = text.parse::<f64>().unwrap();
            match value(&payload) {
                Float(v) => prop_assert_eq!(v.to_bits(), expected.to_bits(), "{}", text),
                other => prop_assert!(false, "{} parsed as {:?}", text, other),
            }
        }

        #[test]
        fn integers_match_std(digits in "-?[0-9]{1,21}") {
            let payload = format!("m f={digits}i");
            let got = parse(&payload).remove(0);
            match digits.parse::<i64>() {
                Ok(v) => prop_assert_eq!(got.unwrap().fields[0].1.clone(), Int(v)),
                Err(_) => prop_assert_eq!(
                    got.unwrap_err().reason,
                    format!("field `f`: integer `{digits}i` is out of range of a 64-bit integer")
                ),
            }
        }

        #[test]
        fn unsigned_match_std(digits in "[0-9]{1,22}") {
            let payload = format!("m f={digits}u");
            let got = parse(&payload).remove(0);
            match digits.parse::<u64>() {
                Ok(v) => prop_assert_eq!(got.unwrap().fields[0].1.clone(), UInt(v)),
                Err(_) => prop_assert_eq!(
                    got.unwrap_err().reason,
                    format!("field `f`: unsigned integer `{digits}u` is out of range of a 64-bit unsigned integer")
                ),
            }
        }

        #[test]
        fn timestamps_match_std(digits in "-?[0-9]{1,21}") {
            let payload = format!("m f=1 {digits}");
            let got = parse(&payload).remove(0);
            match digits.parse::<i64>() {
                Ok(v) => prop_assert_eq!(got.unwrap().timestamp_ms, v.div_euclid(1_000_000)),
                Err(_) => prop_assert_eq!(
                    got.unwrap_err().reason,
                    format!("timestamp `{digits}`: out of range of a 64-bit integer")
                ),
            }
        }

        #[test]
        fn precision_floors_like_i128(timestamp in any::<i64>()) {
            let floor = |d: i128| i64::try_from(i128::from(timestamp).div_euclid(d)).ok();
            prop_assert_eq!(Precision::Nanoseconds.to_epoch_ms(timestamp), floor(1_000_000));
            prop_assert_eq!(Precision::Microseconds.to_epoch_ms(timestamp), floor(1_000));
            prop_assert_eq!(Precision::Milliseconds.to_epoch_ms(timestamp), Some(timestamp));
            prop_assert_eq!(
                Precision::Seconds.to_epoch_ms(timestamp),
                i64::try_from(i128::from(timestamp) * 1_000).ok()
            );
        }
    }
}
