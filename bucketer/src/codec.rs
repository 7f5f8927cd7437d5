//! The persisted bucket value format and the merge logic of the `buckets` and `latest` column
//! families.
//!
//! A bucket value holds the readings of one device in one hour; this module only sees the
//! readings, never the key, so it assumes nothing about hours: any `i64` timestamp encodes,
//! including ones before 1970 and the extremes of `i64`. It owns the bytes of a value —
//! [`encode`], [`decode`], [`count`] — and the merge operators' logic — [`merge`] for
//! `buckets`, [`merge_latest`] for `latest`, [`sort_dedup_last_wins`] for both. It must not
//! know key layouts (`keys`) or touch RocksDB (`store` registers the operators).
//!
//! # Format v1
//!
//! All integers are unsigned LEB128 varints (7 bits a byte, least significant group first, high
//! bit set on every byte but the last; at most 10 bytes) unless marked `u8`. A *zigzag* varint
//! holds an `i64` `v` as the varint of `(v << 1) ^ (v >> 63)`.
//!
//! | what                      | encoding                     | meaning |
//! |---------------------------|------------------------------|---------|
//! | version                   | `u8` = 1 ([`FORMAT_V1`])     | the first byte of every version to come |
//! | `n`                       | varint                       | number of readings, at least 1 |
//! | first timestamp           | zigzag varint                | `ts[0]` |
//! | first delta               | zigzag varint                | `ts[1] - ts[0]`, only when `n > 1` |
//! | delta of delta, `n - 2` × | zigzag varint                | `(ts[i] - ts[i-1]) - (ts[i-1] - ts[i-2])` for `i` in `2..n` |
//! | `m`                       | varint                       | number of fields |
//! | `m` × field, ascending by name bytes: | |  |
//! | — name length             | varint                       | bytes |
//! | — name                    | UTF-8                        | no name twice |
//! | — presence                | `u8`                         | 0: present in every reading; 1: a bitmap follows |
//! | — bitmap                  | `ceil(n / 8)` bytes          | only for presence 1: bit `i` (byte `i / 8`, bit `i % 8`, LSB first) set when reading `i` has the field; padding bits 0; at least one bit set |
//! | — encoding                | `u8`                         | of the value stream: 0 Gorilla, 1 decimal with varint deltas, 2 decimal with packed deltas |
//! | — stream length           | varint                       | bytes of the value stream |
//! | — value stream            | as the encoding says         | the field's `c` values in reading order, present ones only |
//!
//! Timestamps are strictly increasing: readings are sorted by `ts` with no `ts` twice. Timestamp
//! arithmetic wraps (`i64::wrapping_sub` / `wrapping_add`), so deltas between timestamps near
//! `i64::MIN` and `i64::MAX` round-trip. A field a reading does not carry is absent from the
//! bitmap, never stored as a value.
//!
//! ## Decimal value streams (encodings 1 and 2)
//!
//! Sensors report decimals — `512.3`, `40.12345` — and a decimal parsed from text is the `f64`
//! nearest `i / 10^k`, which is what dividing the integer `i` by `10^k` gives (both round
//! correctly). A decimal stream stores each value `v` as such an integer `i`, at one scale `k`
//! for the whole stream, where `i as f64 / 10^k` (`10^k` an exact `f64`) is bit for bit `v`
//! and `|i| <= 2^53`, so that `i` converts to `f64` exactly:
//!
//! | what                      | encoding                     | meaning |
//! |---------------------------|------------------------------|---------|
//! | scale                     | `u8`                         | `k`, at most 15 |
//! | first integer             | zigzag varint                | `i[0]` |
//! | encoding 1: `c - 1` ×     | zigzag varint                | delta `i[j] - i[j-1]` for `j` in `1..c` |
//! | encoding 2, when `c > 1`: |                              | |
//! | — minimum                 | zigzag varint                | `min`, the smallest delta |
//! | — width                   | `u8`                         | `w`, bits of each packed delta, at most 56 |
//! | — packed deltas           | `c - 1` × `w` bits, MSB first | `i[j] - i[j-1] - min`; zero bits to the byte boundary |
//!
//! The encoder uses the smallest scale at which every value of the stream is such a decimal;
//! there is none when a value is NaN, infinite or `-0.0` (it would come back as `0.0`), lies
//! past `2^53 / 10^k`, or has more than 15 decimals. Of the Gorilla stream and the decimal
//! streams it writes the shortest: of equally short ones decimal over Gorilla, and varints over
//! packed deltas. A decoder computes `i as f64 / 10^k`, the very expression with which the
//! encoder checked each value, so values come back bit for bit.
//!
//! ## Gorilla value streams (encoding 0)
//!
//! A Gorilla stream (the XOR scheme of Facebook's Gorilla paper) stores the first value as its
//! 64 raw bits (`f64::to_bits`), then for each further value the XOR `x` with the value before:
//!
//! | bits                                   | when |
//! |----------------------------------------|------|
//! | `0`                                    | `x == 0`: the same value again |
//! | `10` · meaningful bits                 | `x` fits the window of the last `11` entry: at least as many leading and trailing zeros; stores the `64 - lead - trail` bits of that window |
//! | `11` · lead (5 bits) · len (6 bits) · meaningful bits | otherwise; `lead` is `x`'s leading zeros capped at 31, `len` the count of meaningful bits (64 stored as 0), which end at `x`'s lowest set bit; this sets the window |
//!
//! The stream ends with zero bits to the byte boundary. Values are stored bit-exactly: NaN
//! payloads, `-0.0`, infinities and subnormals come back as they went in.
//!
//! ## Validation
//!
//! The decoder rejects what the encoder never writes where it is cheap to see: an unknown
//! version, `n == 0`, timestamps not strictly increasing, field names out of order or twice,
//! a field present in no reading, an unknown encoding, a scale above 15, a decimal integer past
//! `±2^53`, a packed width above 56, non-zero padding, stream bytes left over, bytes after the
//! last field. It does not check that a decimal stream's scale is the smallest or that its
//! encoding is the shortest. [`merge`] therefore fails on a corrupt operand instead of dropping
//! readings.
//!
//! # Merging
//!
//! Last write wins per reading: when two buckets hold the same `ts`, the reading of the later
//! bucket replaces the earlier one as a whole, fields it lacks included. The encoding of a set of
//! readings is unique, so [`merge`] is associative byte for byte, and a partial merge followed
//! by a full merge gives the bytes a single full merge gives.
//!
//! ```
//! use bucketer::codec;
//! use model::Reading;
//!
//! let first = vec![
//!     Reading::new(-10_000, vec![("temp".into(), 21.5)]),
//!     Reading::new(0, vec![("temp".into(), 21.5), ("rpm".into(), 900.0)]),
//! ];
//! let mut old = Vec::new();
//! codec::encode(&first, &mut old);
//! assert_eq!(codec::count(&old)?, 2);
//!
//! let mut new = Vec::new();
//! codec::encode(&[Reading::new(0, vec![("temp".into(), 22.0)])], &mut new);
//! let merged = codec::merge([old.as_slice(), new.as_slice()])?;
//!
//! let mut back = Vec::new();
//! codec::decode(&merged, &mut back)?;
//! assert_eq!(back[0], first[0]);
//! // The newer reading at ts 0 replaced the older one whole: no `rpm` any more.
//! assert_eq!(back[1], Reading::new(0, vec![("temp".into(), 22.0)]));
//! # Ok::<(), codec::Error>(())
//! ```

use std::sync::Arc;

use model::{FieldName, Reading};

/// Version byte of format v1, the first byte of its values.
pub const FORMAT_V1: u8 = 1;

/// Presence code: the field is present in every reading of the bucket.
const PRESENT_IN_ALL: u8 = 0;
/// Presence code: a bitmap of the readings that carry the field follows.
const PRESENT_BITMAP: u8 = 1;

/// Encoding of a value stream: Gorilla XOR bits.
const ENCODING_GORILLA: u8 = 0;
/// Encoding of a value stream: decimal integers, first value and deltas as zigzag varints.
const ENCODING_DECIMAL_VARINT: u8 = 1;
/// Encoding of a value stream: decimal integers, deltas bit-packed above their minimum.
const ENCODING_DECIMAL_PACKED: u8 = 2;

/// Largest decimal scale: values with up to 15 decimals are stored as integers.
const MAX_SCALE: u8 = 15;
/// Largest magnitude of a decimal integer: every integer up to it is exact in an `f64`.
const MAX_DECIMAL: i64 = 1 << 53;
/// Largest bit width of a packed delta: deltas of decimal integers span less than `2^56`.
const MAX_WIDTH: u8 = 56;

/// Leading-zero counts above this are stored as this (5 bits).
const MAX_LEAD: u32 = 31;

/// Why bytes are not a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A bucket that holds no readings, or a merge given no bucket.
    #[error("bucket holds no readings")]
    Empty,
    /// The first byte is not a version this build knows.
    #[error("unknown bucket format version {0}")]
    UnknownVersion(u8),
    /// The bytes end before the bucket does.
    #[error("bucket truncated in {what}")]
    Truncated {
        /// The part being read when the bytes ran out.
        what: &'static str,
    },
    /// A field name is not UTF-8.
    #[error("bucket field name is not UTF-8")]
    InvalidUtf8,
    /// The bytes break a rule of the format.
    #[error("invalid bucket: {0}")]
    Invalid(&'static str),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Encodes `readings` as one bucket, appending to `out` (which is not cleared).
///
/// `readings` must be sorted by `ts` with no `ts` twice, hold at least one reading, and each
/// reading's fields must be sorted by name with no name twice (as [`Reading::new`] leaves them).
/// Debug builds assert this. Release builds never write a bucket [`decode`] rejects: unsorted
/// input is sorted and deduplicated first ([`sort_dedup_last_wins`], on a copy), and an empty
/// slice writes a bucket that decodes to [`Error::Empty`].
pub fn encode(readings: &[Reading], out: &mut Vec<u8>) {
    debug_assert!(!readings.is_empty(), "encoding an empty bucket");
    debug_assert!(strictly_sorted(readings), "encoding readings not sorted by ts, or with a ts twice");
    debug_assert!(
        readings.iter().all(|r| r.fields.windows(2).all(|w| w[0].0 < w[1].0)),
        "encoding a reading whose fields are not sorted by name, or hold a name twice"
    );
    if strictly_sorted(readings) {
        encode_sorted(readings, out);
    } else {
        let mut owned = readings.to_vec();
        sort_dedup_last_wins(&mut owned);
        encode_sorted(&owned, out);
    }
}

/// Decodes a bucket of any version ever written (only v1 so far), appending its readings to
/// `out` in `ts` order. On error `out` is left as it was.
pub fn decode(bytes: &[u8], out: &mut Vec<Reading>) -> Result<()> {
    let start = out.len();
    let result = decode_v1(bytes, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Number of readings in an encoded bucket, read from its header alone: the rest of the bucket
/// is not checked.
pub fn count(bytes: &[u8]) -> Result<usize> {
    header(&mut Input::new(bytes))
}

/// Sorts `readings` by `ts` (stably) and keeps, of readings with equal `ts`, the one that came
/// last: last write wins. Linear when `readings` is already sorted.
pub fn sort_dedup_last_wins(readings: &mut Vec<Reading>) {
    if strictly_sorted(readings) {
        return;
    }
    if !readings.windows(2).all(|w| w[0].ts <= w[1].ts) {
        // Stable: equal timestamps keep their input order, so the last of a run is the last
        // written. The standard stable sort is linear on presorted runs, as merged buckets are.
        readings.sort_by_key(|r| r.ts);
    }
    // `dedup_by` keeps the first of a run; swapping each later duplicate into the kept slot
    // before dropping the slot's old occupant keeps the last instead.
    readings.dedup_by(|later, kept| {
        if later.ts == kept.ts {
            std::mem::swap(later, kept);
            true
        } else {
            false
        }
    });
}

/// Merges encoded buckets given oldest write first into one: all their readings, sorted by
/// `ts`, the latest write winning for a `ts` held twice. Serves the `buckets` merge operator,
/// for a full merge (the existing value, then the operands) and a partial merge (operands only).
///
/// Fails if any input is not a valid bucket, or if there is no input.
pub fn merge<'a>(inputs: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>> {
    let mut readings = Vec::new();
    let mut input_bytes = 0;
    for bytes in inputs {
        decode(bytes, &mut readings)?;
        input_bytes += bytes.len();
    }
    if readings.is_empty() {
        return Err(Error::Empty);
    }
    sort_dedup_last_wins(&mut readings);
    let mut out = Vec::with_capacity(input_bytes);
    encode(&readings, &mut out);
    Ok(out)
}

/// Of encoded buckets given oldest write first, the reading with the greatest `ts` (for a `ts`
/// held twice, the one in the later input), encoded as a one-reading bucket. Serves the `latest`
/// merge operator.
///
/// Fails if any input is not a valid bucket, or if there is no input.
pub fn merge_latest<'a>(inputs: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>> {
    let mut scratch = Vec::new();
    let mut best: Option<Reading> = None;
    for bytes in inputs {
        scratch.clear();
        decode(bytes, &mut scratch)?;
        // A decoded bucket is in ts order: its last reading is its newest.
        if let Some(newest) = scratch.pop() {
            if best.as_ref().is_none_or(|b| newest.ts >= b.ts) {
                best = Some(newest);
            }
        }
    }
    let best = best.ok_or(Error::Empty)?;
    let mut out = Vec::new();
    encode(std::slice::from_ref(&best), &mut out);
    Ok(out)
}

fn strictly_sorted(readings: &[Reading]) -> bool {
    readings.windows(2).all(|w| w[0].ts < w[1].ts)
}

// ---------------------------------------------------------------------------------------------
// Encoding

fn encode_sorted(readings: &[Reading], out: &mut Vec<u8>) {
    out.push(FORMAT_V1);
    put_varint(out, readings.len() as u64);

    let (mut prev_ts, mut prev_delta) = (0i64, 0i64);
    for (i, r) in readings.iter().enumerate() {
        let v = match i {
            0 => r.ts,
            _ => {
                let delta = r.ts.wrapping_sub(prev_ts);
                let v = if i == 1 { delta } else { delta.wrapping_sub(prev_delta) };
                prev_delta = delta;
                v
            }
        };
        put_varint(out, zigzag(v));
        prev_ts = r.ts;
    }

    let mut scratch = Scratch::default();
    if same_fields_everywhere(readings) {
        encode_fields_dense(readings, out, &mut scratch);
    } else {
        encode_fields_sparse(readings, out, &mut scratch);
    }
}

/// Buffers reused from field to field.
#[derive(Default)]
struct Scratch {
    /// The field's values, present ones only.
    values: Vec<f64>,
    /// The values as decimal integers, when they are decimals.
    ints: Vec<i64>,
    /// The Gorilla stream, built before its length is known.
    stream: Vec<u8>,
}

/// Whether every reading carries exactly the fields of the first, whose names ascend strictly
/// — the usual case of a device sending the same fields every time.
fn same_fields_everywhere(readings: &[Reading]) -> bool {
    let Some((first, rest)) = readings.split_first() else {
        return true;
    };
    first.fields.windows(2).all(|w| w[0].0 < w[1].0)
        && rest.iter().all(|r| {
            r.fields.len() == first.fields.len() && r.fields.iter().zip(&first.fields).all(|(a, b)| a.0 == b.0)
        })
}

/// Fields section when every reading has the same fields: field `j` is at index `j` everywhere.
fn encode_fields_dense(readings: &[Reading], out: &mut Vec<u8>, scratch: &mut Scratch) {
    let names = readings.first().map_or(&[][..], |r| &r.fields[..]);
    put_varint(out, names.len() as u64);
    for (j, (name, _)) in names.iter().enumerate() {
        put_name(out, name);
        out.push(PRESENT_IN_ALL);
        scratch.values.clear();
        scratch.values.extend(readings.iter().map(|r| r.fields[j].1));
        put_values(out, scratch);
    }
}

/// Fields section in general: the union of the readings' field names, each with the readings
/// that carry it.
fn encode_fields_sparse(readings: &[Reading], out: &mut Vec<u8>, scratch: &mut Scratch) {
    let mut names: Vec<&FieldName> = readings.iter().flat_map(|r| r.fields.iter().map(|(name, _)| name)).collect();
    names.sort_unstable();
    names.dedup();
    put_varint(out, names.len() as u64);

    let n = readings.len();
    // Per reading, the index of its first field not yet stored: names are visited in ascending
    // order, as each reading's fields are sorted, so every field is looked at once.
    let mut cursor = vec![0usize; n];
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    for name in names {
        bitmap.fill(0);
        scratch.values.clear();
        for (i, (r, c)) in readings.iter().zip(cursor.iter_mut()).enumerate() {
            while r.fields.get(*c).is_some_and(|(f, _)| f < name) {
                *c += 1;
            }
            if let Some((_, value)) = r.fields.get(*c).filter(|(f, _)| f == name) {
                bitmap[i / 8] |= 1 << (i % 8);
                scratch.values.push(*value);
                *c += 1;
            }
        }
        put_name(out, name);
        if scratch.values.len() == n {
            out.push(PRESENT_IN_ALL);
        } else {
            out.push(PRESENT_BITMAP);
            out.extend_from_slice(&bitmap);
        }
        put_values(out, scratch);
    }
}

/// Writes the encoding code, stream length and value stream of `scratch.values` (at least one
/// value), choosing the shortest stream: of equally short ones decimal over Gorilla, and of the
/// two decimal ones varints over packed bits.
fn put_values(out: &mut Vec<u8>, scratch: &mut Scratch) {
    let Scratch { values, ints, stream } = scratch;
    let decimal = decimal_scale(values, ints).map(|k| DecimalPlan::new(k, ints));
    // A decimal stream no longer than the shortest Gorilla stream could be wins without building
    // the Gorilla one.
    if let Some(plan) = decimal.as_ref().filter(|p| p.len() <= gorilla_floor(values)) {
        plan.write(out, ints);
        return;
    }
    stream.clear();
    let mut enc = GorillaEncoder::new(stream);
    values.iter().for_each(|v| enc.push(v.to_bits()));
    enc.finish();
    match decimal {
        Some(plan) if plan.len() <= stream.len() => plan.write(out, ints),
        _ => {
            out.push(ENCODING_GORILLA);
            put_stream(out, stream);
        }
    }
}

/// A lower bound of the length of the Gorilla stream of `values`: 64 bits of the first value,
/// then one bit for a repeat and for any other value two bits and at least the meaningful bits
/// of its XOR with the value before (the window of a `10` entry holds them all).
fn gorilla_floor(values: &[f64]) -> usize {
    let bits: usize = values
        .windows(2)
        .map(|w| match w[0].to_bits() ^ w[1].to_bits() {
            0 => 1,
            x => 2 + 64 - x.leading_zeros().min(MAX_LEAD) as usize - x.trailing_zeros() as usize,
        })
        .sum();
    (64 + bits).div_ceil(8)
}

/// `10^k` for every decimal scale `k`, each exact in an `f64`.
const POW10: [f64; MAX_SCALE as usize + 1] =
    [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// The value a decimal integer `i` at scale `k` stands for. The encoder checks each value it
/// stores as a decimal with this very function, so what it verified is what [`decode`] returns.
#[inline]
fn from_decimal(i: i64, k: u8) -> f64 {
    i as f64 / POW10[usize::from(k)]
}

/// `v` as a decimal integer at scale `k`: the `i` with `from_decimal(i, k)` bit for bit `v`,
/// `|i| <= 2^53`. `None` for NaN, infinities, `-0.0` and values with more decimals than `k`.
#[inline]
fn to_decimal(v: f64, k: u8) -> Option<i64> {
    let scaled = v * POW10[usize::from(k)];
    // Within the bound `i` and its conversion to f64 are exact.
    if scaled.is_nan() || scaled.abs() > MAX_DECIMAL as f64 {
        return None;
    }
    // `scaled.round()` without a call into libm: truncate, then step away from zero when the
    // (exact) fraction is at least a half.
    let t = scaled as i64;
    let i = t + ((scaled - t as f64) * 2.0) as i64;
    (from_decimal(i, k).to_bits() == v.to_bits()).then_some(i)
}

/// The smallest scale at which every value is a decimal, filling `ints` with the values at that
/// scale; `None` when there is none up to [`MAX_SCALE`].
fn decimal_scale(values: &[f64], ints: &mut Vec<i64>) -> Option<u8> {
    let mut k = 0;
    'scale: loop {
        ints.clear();
        for &v in values {
            match to_decimal(v, k) {
                Some(i) => ints.push(i),
                None => {
                    // On to the smallest scale that fits this value, checking all values again.
                    k = (k + 1..=MAX_SCALE).find(|&k| to_decimal(v, k).is_some())?;
                    continue 'scale;
                }
            }
        }
        return Some(k);
    }
}

/// A decimal value stream about to be written, with the length of either form.
struct DecimalPlan {
    k: u8,
    /// Smallest delta and bits per packed delta.
    min: i64,
    width: u32,
    varint_len: usize,
    packed_len: usize,
}

impl DecimalPlan {
    /// `ints` holds at least one value, each within `±2^53`, so deltas cannot overflow.
    fn new(k: u8, ints: &[i64]) -> DecimalPlan {
        let head = 1 + varint_len(zigzag(ints[0]));
        let (mut min, mut max, mut delta_bytes) = (i64::MAX, i64::MIN, 0);
        for w in ints.windows(2) {
            let d = w[1] - w[0];
            min = min.min(d);
            max = max.max(d);
            delta_bytes += varint_len(zigzag(d));
        }
        if ints.len() == 1 {
            return DecimalPlan { k, min: 0, width: 0, varint_len: head, packed_len: head };
        }
        let width = 64 - (max - min).leading_zeros();
        let packed_bits = (ints.len() - 1) * width as usize;
        let packed_len = head + varint_len(zigzag(min)) + 1 + packed_bits.div_ceil(8);
        DecimalPlan { k, min, width, varint_len: head + delta_bytes, packed_len }
    }

    fn packed(&self) -> bool {
        self.packed_len < self.varint_len
    }

    /// Length of the stream.
    fn len(&self) -> usize {
        self.varint_len.min(self.packed_len)
    }

    fn write(&self, out: &mut Vec<u8>, ints: &[i64]) {
        out.push(if self.packed() { ENCODING_DECIMAL_PACKED } else { ENCODING_DECIMAL_VARINT });
        put_varint(out, self.len() as u64);
        let start = out.len();
        out.push(self.k);
        put_varint(out, zigzag(ints[0]));
        if !self.packed() {
            for w in ints.windows(2) {
                put_varint(out, zigzag(w[1] - w[0]));
            }
        } else if ints.len() > 1 {
            put_varint(out, zigzag(self.min));
            out.push(self.width as u8);
            let mut bits = BitWriter::new(out);
            if self.width > 0 {
                for w in ints.windows(2) {
                    bits.write((w[1] - w[0] - self.min) as u64, self.width);
                }
            }
            bits.finish();
        }
        debug_assert_eq!(out.len() - start, self.len(), "decimal stream length planned wrong");
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    put_varint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
}

fn put_stream(out: &mut Vec<u8>, stream: &[u8]) {
    put_varint(out, stream.len() as u64);
    out.extend_from_slice(stream);
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes of the varint of `v`.
fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros()).max(1).div_ceil(7) as usize
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(u: u64) -> i64 {
    (u >> 1) as i64 ^ -((u & 1) as i64)
}

/// Writes bits MSB first, 64 at a time.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Pending bits, right-aligned; fewer than 64.
    acc: u64,
    /// Number of pending bits.
    len: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, len: 0 }
    }

    /// Appends the low `k` bits of `v` (`1 <= k <= 64`; the bits above them are zero).
    #[inline]
    fn write(&mut self, v: u64, k: u32) {
        debug_assert!((1..=64).contains(&k) && (k == 64 || v >> k == 0));
        if self.len + k < 64 {
            self.acc = (self.acc << k) | v;
            self.len += k;
        } else {
            let fill = 64 - self.len; // 1..=64 bits complete the word
            let rest = k - fill; // 0..=63 bits are left over
            let high = if fill == 64 { 0 } else { self.acc << fill };
            self.out.extend_from_slice(&(high | (v >> rest)).to_be_bytes());
            self.acc = v & ((1u64 << rest) - 1);
            self.len = rest;
        }
    }

    /// Writes the pending bits, zero-padded to a byte boundary.
    fn finish(self) {
        if self.len > 0 {
            let word = (self.acc << (64 - self.len)).to_be_bytes();
            self.out.extend_from_slice(&word[..self.len.div_ceil(8) as usize]);
        }
    }
}

/// Gorilla XOR compression of a stream of `f64` bit patterns.
struct GorillaEncoder<'a> {
    bits: BitWriter<'a>,
    prev: u64,
    started: bool,
    /// Window of the last `11` entry; `lead == u32::MAX` before the first, which no XOR fits.
    lead: u32,
    trail: u32,
}

impl<'a> GorillaEncoder<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        GorillaEncoder { bits: BitWriter::new(out), prev: 0, started: false, lead: u32::MAX, trail: 0 }
    }

    #[inline]
    fn push(&mut self, value: u64) {
        if !self.started {
            self.started = true;
            self.prev = value;
            self.bits.write(value, 64);
            return;
        }
        let x = value ^ self.prev;
        self.prev = value;
        if x == 0 {
            self.bits.write(0, 1);
            return;
        }
        let lead = x.leading_zeros().min(MAX_LEAD);
        let trail = x.trailing_zeros();
        if lead >= self.lead && trail >= self.trail {
            let len = 64 - self.lead - self.trail;
            let meaningful = x >> self.trail;
            if len <= 62 {
                self.bits.write((0b10 << len) | meaningful, len + 2);
            } else {
                self.bits.write(0b10, 2);
                self.bits.write(meaningful, len);
            }
        } else {
            let len = 64 - lead - trail;
            let header = (0b11 << 11) | (u64::from(lead) << 6) | u64::from(len & 63);
            let meaningful = x >> trail;
            if len <= 51 {
                self.bits.write((header << len) | meaningful, 13 + len);
            } else {
                self.bits.write(header, 13);
                self.bits.write(meaningful, len);
            }
            self.lead = lead;
            self.trail = trail;
        }
    }

    fn finish(self) {
        self.bits.finish();
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Bytes being read front to back.
struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Input { rest: bytes }
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        let (&b, rest) = self.rest.split_first().ok_or(Error::Truncated { what })?;
        self.rest = rest;
        Ok(b)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8(what)?;
            // The tenth byte holds the 64th bit alone.
            if shift == 63 && b > 1 {
                return Err(Error::Invalid("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::Invalid("varint overflows 64 bits"))
    }

    /// A varint that counts things each taking at least one of the remaining bytes, so that a
    /// corrupt count cannot ask for a huge allocation.
    fn count(&mut self, what: &'static str) -> Result<usize> {
        let v = self.varint(what)?;
        if v > self.rest.len() as u64 {
            return Err(Error::Truncated { what });
        }
        Ok(v as usize)
    }

    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8]> {
        if len > self.rest.len() {
            return Err(Error::Truncated { what });
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(taken)
    }
}

/// Reads the version and the reading count.
fn header(input: &mut Input<'_>) -> Result<usize> {
    match input.u8("version")? {
        FORMAT_V1 => {}
        v => return Err(Error::UnknownVersion(v)),
    }
    // Each reading takes at least one byte of timestamp.
    match input.count("timestamps")? {
        0 => Err(Error::Empty),
        n => Ok(n),
    }
}

/// One field of a bucket being decoded.
struct FieldDecoder<'a> {
    name: FieldName,
    /// `None` when every reading has the field.
    bitmap: Option<&'a [u8]>,
    values: ValueDecoder<'a>,
}

impl FieldDecoder<'_> {
    fn has(&self, i: usize) -> bool {
        self.bitmap.is_none_or(|b| b[i / 8] >> (i % 8) & 1 == 1)
    }
}

fn decode_v1(bytes: &[u8], out: &mut Vec<Reading>) -> Result<()> {
    let mut input = Input::new(bytes);
    let n = header(&mut input)?;

    let start = out.len();
    out.reserve(n);
    let (mut ts, mut delta) = (0i64, 0i64);
    for i in 0..n {
        let v = unzigzag(input.varint("timestamps")?);
        let prev = ts;
        match i {
            0 => ts = v,
            1 => {
                delta = v;
                ts = ts.wrapping_add(delta);
            }
            _ => {
                delta = delta.wrapping_add(v);
                ts = ts.wrapping_add(delta);
            }
        }
        if i > 0 && ts <= prev {
            return Err(Error::Invalid("timestamps not strictly increasing"));
        }
        out.push(Reading { ts, fields: Vec::new() });
    }

    let m = input.count("field count")?;
    let mut fields: Vec<FieldDecoder<'_>> = Vec::with_capacity(m);
    for _ in 0..m {
        let name_len = input.count("field name")?;
        let name = std::str::from_utf8(input.take(name_len, "field name")?).map_err(|_| Error::InvalidUtf8)?;
        if fields.last().is_some_and(|f| *f.name >= *name) {
            return Err(Error::Invalid("field names not strictly ascending"));
        }
        let bitmap = match input.u8("presence")? {
            PRESENT_IN_ALL => None,
            PRESENT_BITMAP => {
                let bitmap = input.take(n.div_ceil(8), "presence bitmap")?;
                if let Some(&last) = bitmap.last() {
                    if n % 8 != 0 && last >> (n % 8) != 0 {
                        return Err(Error::Invalid("presence bitmap padding is not zero"));
                    }
                }
                if bitmap.iter().all(|&b| b == 0) {
                    return Err(Error::Invalid("field present in no reading"));
                }
                Some(bitmap)
            }
            _ => return Err(Error::Invalid("unknown presence code")),
        };
        let encoding = input.u8("value encoding")?;
        let stream_len = input.count("value stream")?;
        let stream = input.take(stream_len, "value stream")?;
        let values = match encoding {
            ENCODING_GORILLA => ValueDecoder::Gorilla(GorillaDecoder::new(stream)),
            ENCODING_DECIMAL_VARINT | ENCODING_DECIMAL_PACKED => {
                let present = bitmap.map_or(n, |b| b.iter().map(|b| b.count_ones() as usize).sum());
                ValueDecoder::Decimal(DecimalDecoder::new(stream, encoding == ENCODING_DECIMAL_PACKED, present)?)
            }
            _ => return Err(Error::Invalid("unknown value encoding")),
        };
        fields.push(FieldDecoder { name: name.into(), bitmap, values });
    }
    if !input.rest.is_empty() {
        return Err(Error::Invalid("bytes after the last field"));
    }

    let all_dense = fields.iter().all(|f| f.bitmap.is_none());
    for (i, reading) in out[start..].iter_mut().enumerate() {
        let len = if all_dense { fields.len() } else { fields.iter().filter(|f| f.has(i)).count() };
        let mut values = Vec::with_capacity(len);
        for f in &mut fields {
            if f.has(i) {
                values.push((Arc::clone(&f.name), f.values.next()?));
            }
        }
        reading.fields = values;
    }
    fields.iter().try_for_each(|f| f.values.finish())
}

/// The values of one field, in reading order.
enum ValueDecoder<'a> {
    Gorilla(GorillaDecoder<'a>),
    Decimal(DecimalDecoder<'a>),
}

impl ValueDecoder<'_> {
    #[inline]
    fn next(&mut self) -> Result<f64> {
        match self {
            ValueDecoder::Gorilla(d) => d.next().map(f64::from_bits),
            ValueDecoder::Decimal(d) => d.next(),
        }
    }

    /// Checks that the stream holds nothing after the values read.
    fn finish(&self) -> Result<()> {
        match self {
            ValueDecoder::Gorilla(d) => d.bits.finish(),
            ValueDecoder::Decimal(d) => d.finish(),
        }
    }
}

/// A decimal value stream: the integers, then [`from_decimal`] of each.
struct DecimalDecoder<'a> {
    k: u8,
    /// The integer last returned, or the first value before it is returned.
    prev: i64,
    /// Whether the first value is still to be returned.
    at_first: bool,
    deltas: Deltas<'a>,
}

/// Where the deltas after the first integer come from.
enum Deltas<'a> {
    Varint(Input<'a>),
    Packed { bits: BitReader<'a>, min: i64, width: u32 },
}

impl<'a> DecimalDecoder<'a> {
    /// Reads the stream's head; `present` is the number of values it holds, at least one.
    fn new(stream: &'a [u8], packed: bool, present: usize) -> Result<Self> {
        let mut input = Input::new(stream);
        let k = input.u8("value stream")?;
        if k > MAX_SCALE {
            return Err(Error::Invalid("decimal scale above 15"));
        }
        let first = decimal_in_range(Some(unzigzag(input.varint("value stream")?)))?;
        let deltas = if packed && present > 1 {
            let min = unzigzag(input.varint("value stream")?);
            let width = input.u8("value stream")?;
            if width > MAX_WIDTH {
                return Err(Error::Invalid("packed deltas wider than 56 bits"));
            }
            Deltas::Packed { bits: BitReader::new(input.rest), min, width: u32::from(width) }
        } else {
            // Also a packed stream of one value, which ends after the first integer.
            Deltas::Varint(input)
        };
        Ok(DecimalDecoder { k, prev: first, at_first: true, deltas })
    }

    #[inline]
    fn next(&mut self) -> Result<f64> {
        if self.at_first {
            self.at_first = false;
        } else {
            let delta = match &mut self.deltas {
                Deltas::Varint(input) => Some(unzigzag(input.varint("value stream")?)),
                Deltas::Packed { width: 0, min, .. } => Some(*min),
                Deltas::Packed { bits, min, width } => min.checked_add(bits.read(*width)? as i64),
            };
            self.prev = decimal_in_range(delta.and_then(|d| self.prev.checked_add(d)))?;
        }
        Ok(from_decimal(self.prev, self.k))
    }

    fn finish(&self) -> Result<()> {
        let done = match &self.deltas {
            Deltas::Varint(input) => input.rest.is_empty(),
            Deltas::Packed { bits, .. } => bits.finish().is_ok(),
        };
        if done {
            Ok(())
        } else {
            Err(Error::Invalid("value stream longer than its values"))
        }
    }
}

/// A decoded decimal integer, if it is one the encoder can write.
fn decimal_in_range(i: Option<i64>) -> Result<i64> {
    i.filter(|i| i.unsigned_abs() <= MAX_DECIMAL as u64).ok_or(Error::Invalid("decimal integer out of range"))
}

/// Reads bits MSB first, refilling 64 at a time.
struct BitReader<'a> {
    bytes: &'a [u8],
    /// Next byte of `bytes` not yet counted in `len`.
    pos: usize,
    /// Bits left-aligned: the top `len` bits are the next to read. Bits below them are zero or
    /// the next bits of `bytes` already (an early look at bytes from `pos` on).
    acc: u64,
    len: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        BitReader { bytes, pos: 0, acc: 0, len: 0 }
    }

    /// Tops `acc` up to at least 57 bits, or to all that is left.
    #[inline]
    fn refill(&mut self) {
        if let Some(word) = self.bytes.get(self.pos..).and_then(|b| b.first_chunk::<8>()) {
            // Whole bytes that fit go in; a part of the next byte may come along, and is ORed
            // in again, unchanged, by the next refill.
            self.acc |= u64::from_be_bytes(*word) >> self.len;
            let whole = (64 - self.len) / 8;
            self.pos += whole as usize;
            self.len += whole * 8;
        } else {
            while self.len <= 56 {
                let Some(&b) = self.bytes.get(self.pos) else {
                    break;
                };
                self.acc |= u64::from(b) << (56 - self.len);
                self.len += 8;
                self.pos += 1;
            }
        }
    }

    /// The next `k` bits, `1 <= k <= 56`.
    #[inline]
    fn read(&mut self, k: u32) -> Result<u64> {
        debug_assert!((1..=56).contains(&k));
        if self.len < k {
            self.refill();
            if self.len < k {
                return Err(Error::Truncated { what: "value stream" });
            }
        }
        let v = self.acc >> (64 - k);
        self.acc <<= k;
        self.len -= k;
        Ok(v)
    }

    /// The next `k` bits, `1 <= k <= 64`.
    #[inline]
    fn read_wide(&mut self, k: u32) -> Result<u64> {
        if k <= 56 {
            self.read(k)
        } else {
            Ok((self.read(k - 32)? << 32) | self.read(32)?)
        }
    }

    /// Checks that only zero padding, less than a byte of it, is left.
    fn finish(&self) -> Result<()> {
        if self.pos == self.bytes.len() && self.len < 8 && self.acc == 0 {
            Ok(())
        } else {
            Err(Error::Invalid("value stream longer than its values"))
        }
    }
}

struct GorillaDecoder<'a> {
    bits: BitReader<'a>,
    prev: u64,
    started: bool,
    /// Window of the last `11` entry; `len == 0` before the first.
    lead: u32,
    len: u32,
}

impl<'a> GorillaDecoder<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        GorillaDecoder { bits: BitReader::new(bytes), prev: 0, started: false, lead: 0, len: 0 }
    }

    #[inline]
    fn next(&mut self) -> Result<u64> {
        if !self.started {
            self.started = true;
            self.prev = self.bits.read_wide(64)?;
            return Ok(self.prev);
        }
        if self.bits.read(1)? == 0 {
            return Ok(self.prev);
        }
        if self.bits.read(1)? == 1 {
            let header = self.bits.read(11)? as u32;
            let lead = header >> 6;
            let len = match header & 63 {
                0 => 64,
                len => len,
            };
            if lead + len > 64 {
                return Err(Error::Invalid("value window wider than 64 bits"));
            }
            self.lead = lead;
            self.len = len;
        } else if self.len == 0 {
            return Err(Error::Invalid("value reuses a window before one is set"));
        }
        let meaningful = self.bits.read_wide(self.len)?;
        self.prev ^= meaningful << (64 - self.lead - self.len);
        Ok(self.prev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Field names the generated readings draw from; subsets exercise presence bitmaps.
    const NAMES: [&str; 6] = ["", "a", "b", "hum", "temp", "ü-säure"];

    /// A reading as plain comparable data, values by bits (NaN == NaN, 0.0 != -0.0).
    type Plain = (i64, Vec<(String, u64)>);

    fn plain(readings: &[Reading]) -> Vec<Plain> {
        readings
            .iter()
            .map(|r| {
                let fields = r.fields.iter().map(|(n, v)| (n.to_string(), v.to_bits()));
                (r.ts, fields.collect())
            })
            .collect()
    }

    fn encoded(readings: &[Reading]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(readings, &mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Vec<Reading> {
        let mut out = Vec::new();
        decode(bytes, &mut out).expect("a valid bucket");
        out
    }

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            // Every bit pattern: signalling and quiet NaNs with payloads, subnormals, ...
            any::<u64>().prop_map(f64::from_bits),
            prop::sample::select(vec![
                f64::NAN,
                -f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                0.0,
                -0.0,
                f64::MIN_POSITIVE / 3.0,
                f64::from_bits(1),
                f64::MAX,
            ]),
            // Few distinct, close values: repeats and reused windows.
            (0..8i32).prop_map(|v| 20.0 + f64::from(v) * 0.25),
            decimal(),
        ]
    }

    /// A decimal number as a sensor sends it: `i · 10^-k` parsed from text, which rounds
    /// correctly, as dividing does.
    fn decimal_at(i: i64, k: u8) -> f64 {
        format!("{i}e-{k}").parse().expect("a number")
    }

    /// Integers of decimal values: small ones, ones near the largest [`MAX_DECIMAL`], any.
    fn decimal_int() -> impl Strategy<Value = i64> {
        prop_oneof![
            -2_000i64..2_000,
            (MAX_DECIMAL - 1_000..=MAX_DECIMAL),
            (-MAX_DECIMAL..=-MAX_DECIMAL + 1_000),
            -MAX_DECIMAL..=MAX_DECIMAL,
        ]
    }

    fn decimal() -> impl Strategy<Value = f64> {
        (decimal_int(), 0..=MAX_SCALE).prop_map(|(i, k)| decimal_at(i, k))
    }

    /// The integers of a stream of decimals: a random walk with small steps, or anywhere.
    fn decimal_ints() -> impl Strategy<Value = Vec<i64>> {
        prop_oneof![
            (decimal_int(), prop::collection::vec(-50i64..50, 0..100)).prop_map(|(start, steps)| {
                let walk = steps.into_iter().scan(start, |i, step| {
                    *i = (*i + step).clamp(-MAX_DECIMAL, MAX_DECIMAL);
                    Some(*i)
                });
                std::iter::once(start).chain(walk).collect()
            }),
            prop::collection::vec(decimal_int(), 1..100),
        ]
    }

    /// Values that are no decimal the encoder can store.
    fn non_decimal() -> impl Strategy<Value = f64> {
        prop_oneof![
            prop::sample::select(vec![
                -0.0,
                f64::NAN,
                -f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                0.1 + 0.2,
                f64::from_bits(1),
                (MAX_DECIMAL + 2) as f64,
                -1e300,
                1e-16,
            ]),
            // A shortest decimal form of 17 digits: no integer of at most 16 digits (2^53 has 16)
            // divided by a power of ten rounds to it.
            any::<u64>().prop_map(f64::from_bits).prop_filter("17 significant digits", |v| {
                let text = format!("{:e}", v.abs());
                text.split('e').next().is_some_and(|m| m.bytes().filter(u8::is_ascii_digit).count() == 17)
            }),
        ]
    }

    /// The encoding byte of each field of a valid bucket, in name order.
    fn field_encodings(bytes: &[u8]) -> Vec<u8> {
        let mut input = Input::new(bytes);
        let n = header(&mut input).expect("a valid header");
        for _ in 0..n {
            input.varint("timestamps").expect("a timestamp");
        }
        let m = input.count("field count").expect("a field count");
        (0..m)
            .map(|_| {
                let name_len = input.count("field name").expect("a name length");
                input.take(name_len, "field name").expect("a name");
                if input.u8("presence").expect("a presence code") == PRESENT_BITMAP {
                    input.take(n.div_ceil(8), "presence bitmap").expect("a bitmap");
                }
                let encoding = input.u8("value encoding").expect("an encoding");
                let len = input.count("value stream").expect("a stream length");
                input.take(len, "value stream").expect("a stream");
                encoding
            })
            .collect()
    }

    /// One reading per value, a second apart, with the value as field "v".
    fn series(values: &[f64]) -> Vec<Reading> {
        values.iter().zip(0..).map(|(&v, i)| Reading::new(i * 1_000, vec![("v".into(), v)])).collect()
    }

    fn timestamp() -> impl Strategy<Value = i64> + Clone {
        prop_oneof![
            any::<i64>(),
            i64::MIN..i64::MIN + 64,
            i64::MAX - 64..=i64::MAX,
            -100_000i64..100_000,
            (-20i64..20).prop_map(|k| 1_700_000_000_000 + k * 10_000),
        ]
    }

    fn fields() -> impl Strategy<Value = Vec<(FieldName, f64)>> {
        prop::collection::vec((0..NAMES.len(), value()), 0..=NAMES.len())
            .prop_map(|fs| fs.into_iter().map(|(i, v)| (NAMES[i].into(), v)).collect())
    }

    /// Sorted, unique-ts readings: half of the time each with its own field subset, half of the
    /// time all with the same fields (the dense layout).
    fn bucket_with(ts: impl Strategy<Value = i64> + Clone) -> impl Strategy<Value = Vec<Reading>> {
        let times = prop::collection::btree_set(ts, 1..40);
        prop_oneof![
            times.clone().prop_flat_map(|times| {
                let n = times.len();
                (Just(times), prop::collection::vec(fields(), n)).prop_map(|(times, fields)| {
                    times.into_iter().zip(fields).map(|(ts, f)| Reading::new(ts, f)).collect()
                })
            }),
            (times, prop::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len())).prop_flat_map(|(times, names)| {
                let n = times.len();
                let len = n * names.len();
                let values = prop_oneof![
                    prop::collection::vec(value(), len),
                    // Decimal fields, of the same scale or not.
                    prop::collection::vec(decimal(), len),
                    (0..=MAX_SCALE).prop_flat_map(move |k| {
                        prop::collection::vec((-300i64..300).prop_map(move |i| decimal_at(20_000 + i, k)), len)
                    }),
                ];
                (Just(times), Just(names), values).prop_map(|(times, names, values)| {
                    let names: Vec<FieldName> = names.into_iter().map(Into::into).collect();
                    times
                        .into_iter()
                        .enumerate()
                        .map(|(i, ts)| {
                            let row = &values[i * names.len()..(i + 1) * names.len()];
                            let fs = names.iter().cloned().zip(row.iter().copied()).collect();
                            Reading::new(ts, fs)
                        })
                        .collect()
                })
            }),
        ]
    }

    fn bucket() -> impl Strategy<Value = Vec<Reading>> {
        bucket_with(timestamp())
    }

    /// Buckets whose timestamps overlap each other's.
    fn overlapping_bucket() -> impl Strategy<Value = Vec<Reading>> {
        bucket_with((-10i64..30).prop_map(|k| k * 1_000))
    }

    /// The merge oracle: every reading inserted in write order, later ones overwriting.
    fn oracle(buckets: &[Vec<Reading>]) -> Vec<Reading> {
        let mut map = BTreeMap::new();
        for r in buckets.iter().flatten() {
            map.insert(r.ts, r.clone());
        }
        map.into_values().collect()
    }

    proptest! {
        #[test]
        fn round_trip_is_exact(readings in bucket()) {
            let bytes = encoded(&readings);
            prop_assert_eq!(count(&bytes), Ok(readings.len()));
            prop_assert_eq!(plain(&decoded(&bytes)), plain(&readings));
        }

        #[test]
        fn dense_and_sparse_layouts_write_the_same_bytes(readings in bucket()) {
            prop_assume!(same_fields_everywhere(&readings));
            let (mut dense, mut sparse) = (Vec::new(), Vec::new());
            encode_fields_dense(&readings, &mut dense, &mut Scratch::default());
            encode_fields_sparse(&readings, &mut sparse, &mut Scratch::default());
            prop_assert_eq!(dense, sparse);
        }

        #[test]
        fn encode_and_decode_append(a in bucket(), b in bucket()) {
            let mut bytes = encoded(&a);
            let split = bytes.len();
            encode(&b, &mut bytes);
            prop_assert_eq!(&bytes[split..], &encoded(&b)[..]);
            let mut out = decoded(&bytes[..split]);
            decode(&bytes[split..], &mut out).expect("a valid bucket");
            prop_assert_eq!(plain(&out), plain(&[a, b].concat()));
        }

        #[test]
        fn merge_equals_oracle(buckets in prop::collection::vec(overlapping_bucket(), 1..5)) {
            let operands: Vec<Vec<u8>> = buckets.iter().map(|b| encoded(b)).collect();
            let merged = merge(operands.iter().map(Vec::as_slice)).expect("valid operands");
            prop_assert_eq!(plain(&decoded(&merged)), plain(&oracle(&buckets)));
            prop_assert_eq!(merged, encoded(&oracle(&buckets)));
        }

        #[test]
        fn merge_is_associative(
            a in overlapping_bucket(),
            b in overlapping_bucket(),
            c in overlapping_bucket(),
        ) {
            let (a, b, c) = (encoded(&a), encoded(&b), encoded(&c));
            let m = |inputs: &[&[u8]]| merge(inputs.iter().copied()).expect("valid operands");
            let all = m(&[&a, &b, &c]);
            prop_assert_eq!(&m(&[&m(&[&a, &b]), &c]), &all);
            prop_assert_eq!(&m(&[&a, &m(&[&b, &c])]), &all);
        }

        #[test]
        fn merge_latest_picks_max_ts_later_input_on_ties(
            buckets in prop::collection::vec(overlapping_bucket(), 1..5),
        ) {
            let operands: Vec<Vec<u8>> = buckets.iter().map(|b| encoded(b)).collect();
            let latest = merge_latest(operands.iter().map(Vec::as_slice)).expect("valid operands");
            // Greatest (ts, input index): timestamps are unique within an input.
            let expected = buckets
                .iter()
                .enumerate()
                .flat_map(|(i, b)| b.iter().map(move |r| ((r.ts, i), r)))
                .max_by_key(|(key, _)| *key)
                .map(|(_, r)| r.clone())
                .expect("at least one reading");
            prop_assert_eq!(plain(&decoded(&latest)), plain(&[expected]));
        }

        #[test]
        fn sort_dedup_keeps_the_last_write(
            input in prop::collection::vec((-5i64..5, any::<u32>()), 0..40),
        ) {
            let mut readings: Vec<Reading> = input
                .iter()
                .map(|&(ts, v)| Reading::new(ts, vec![("v".into(), f64::from(v))]))
                .collect();
            let expected = oracle(std::slice::from_ref(&readings));
            sort_dedup_last_wins(&mut readings);
            prop_assert_eq!(plain(&readings), plain(&expected));
        }

        #[test]
        fn every_truncation_is_an_error(readings in bucket()) {
            let bytes = encoded(&readings);
            for len in 0..bytes.len() {
                let mut out = Vec::new();
                prop_assert!(decode(&bytes[..len], &mut out).is_err(), "prefix of {} bytes", len);
                prop_assert!(out.is_empty());
                prop_assert!(merge([&bytes[..], &bytes[..len]]).is_err());
                prop_assert!(merge_latest([&bytes[..len]]).is_err());
            }
        }

        #[test]
        fn random_bytes_do_not_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = decode(&bytes, &mut Vec::new());
            let _ = count(&bytes);
            // Mostly past the version byte.
            if let Some(first) = bytes.first_mut() {
                *first = FORMAT_V1;
            }
            let _ = decode(&bytes, &mut Vec::new());
            let _ = merge([&bytes[..]]);
        }

        #[test]
        fn flipped_bits_do_not_panic(readings in bucket(), flips in prop::collection::vec(any::<prop::sample::Index>(), 1..4)) {
            let mut bytes = encoded(&readings);
            for at in flips {
                let bit = at.index(bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            let mut out = Vec::new();
            if decode(&bytes, &mut out).is_ok() {
                // Whatever decodes re-encodes to a valid bucket.
                let again = encoded(&out);
                prop_assert_eq!(plain(&decoded(&again)), plain(&out));
            }
        }

        #[test]
        fn gorilla_streams_round_trip(
            start in any::<u64>(),
            steps in prop::collection::vec((0..4u32, any::<u64>()), 0..200),
        ) {
            // Random walks over the bit pattern: repeats, small and wide XORs.
            let mut values = vec![start];
            for (kind, r) in steps {
                let prev = *values.last().expect("not empty");
                values.push(match kind {
                    0 => prev,
                    1 => prev ^ (r & 0xff) << 20,
                    2 => prev ^ (r & 0x0fff_ffff_ffff),
                    _ => r,
                });
            }
            let mut bytes = Vec::new();
            let mut enc = GorillaEncoder::new(&mut bytes);
            values.iter().for_each(|&v| enc.push(v));
            enc.finish();
            let mut dec = GorillaDecoder::new(&bytes);
            for &v in &values {
                prop_assert_eq!(dec.next(), Ok(v));
            }
            prop_assert_eq!(dec.bits.finish(), Ok(()));
        }
    }

    proptest! {
        #[test]
        fn decimals_are_stored_as_decimals(k in 0..=MAX_SCALE, ints in decimal_ints()) {
            let values: Vec<f64> = ints.iter().map(|&i| decimal_at(i, k)).collect();
            let mut found = Vec::new();
            let scale = decimal_scale(&values, &mut found);
            // Below 2^51 the scaled value is within a quarter of its integer, so the scale of the
            // values is found (or a smaller one, when they have fewer decimals); at scale 0 the
            // integers are the values.
            if k == 0 || ints.iter().all(|i| i.unsigned_abs() < 1 << 51) {
                prop_assert!(scale.is_some_and(|s| s <= k), "scale {:?} for k = {}", scale, k);
            }
            let bytes = encoded(&series(&values));
            prop_assert_eq!(plain(&decoded(&bytes)), plain(&series(&values)));
            // The shortest stream wins, decimal on a tie.
            let mut gorilla = Vec::new();
            let mut enc = GorillaEncoder::new(&mut gorilla);
            values.iter().for_each(|v| enc.push(v.to_bits()));
            enc.finish();
            prop_assert!(gorilla_floor(&values) <= gorilla.len());
            let expected = match scale.map(|k| DecimalPlan::new(k, &found)) {
                Some(plan) if plan.len() <= gorilla.len() && plan.packed() => ENCODING_DECIMAL_PACKED,
                Some(plan) if plan.len() <= gorilla.len() => ENCODING_DECIMAL_VARINT,
                _ => ENCODING_GORILLA,
            };
            prop_assert_eq!(field_encodings(&bytes), [expected]);
            if let Some(k) = scale {
                for (&i, &v) in found.iter().zip(&values) {
                    prop_assert_eq!(from_decimal(i, k).to_bits(), v.to_bits());
                }
            }
        }

        #[test]
        fn one_value_that_is_no_decimal_forces_gorilla(
            k in 0..=MAX_SCALE,
            ints in decimal_ints(),
            at in any::<prop::sample::Index>(),
            odd in non_decimal(),
        ) {
            let mut values: Vec<f64> = ints.iter().map(|&i| decimal_at(i, k)).collect();
            let at = at.index(values.len());
            values[at] = odd;
            prop_assert_eq!(decimal_scale(&values, &mut Vec::new()), None);
            let bytes = encoded(&series(&values));
            prop_assert_eq!(field_encodings(&bytes), [ENCODING_GORILLA]);
            prop_assert_eq!(plain(&decoded(&bytes)), plain(&series(&values)));
        }

        #[test]
        fn gorilla_floor_is_a_lower_bound(values in prop::collection::vec(value(), 1..100)) {
            let mut gorilla = Vec::new();
            let mut enc = GorillaEncoder::new(&mut gorilla);
            values.iter().for_each(|v| enc.push(v.to_bits()));
            enc.finish();
            prop_assert!(gorilla_floor(&values) <= gorilla.len());
        }

        #[test]
        fn to_decimal_rounds_as_round_does(v in prop_oneof![value(), decimal()], k in 0..=MAX_SCALE) {
            let scaled = v * POW10[usize::from(k)];
            if let Some(i) = to_decimal(v, k) {
                prop_assert_eq!(i, scaled.round() as i64);
            } else if scaled.abs() <= MAX_DECIMAL as f64 {
                prop_assert_ne!(from_decimal(scaled.round() as i64, k).to_bits(), v.to_bits());
            }
        }
    }

    #[test]
    fn mixed_bucket() {
        let readings: Vec<Reading> = (0..20i32)
            .map(|i| {
                let mut fields: Vec<(FieldName, f64)> = vec![
                    // A counter: constant deltas pack into no bits at all.
                    ("big".into(), 1e12 + f64::from(i) * 1_000.0),
                    ("dec".into(), decimal_at(i64::from(205 + i % 3 - i % 5), 1)),
                    ("nan".into(), if i == 7 { f64::NAN } else { 21.5 }),
                    ("neg0".into(), if i % 4 == 0 { -0.0 } else { f64::from(i % 3) }),
                ];
                if i == 3 || i == 11 {
                    fields.push(("two".into(), if i == 3 { 1.5 } else { 1.25 }));
                }
                Reading::new(1_700_000_000_000 + i64::from(i) * 10_000, fields)
            })
            .collect();
        let bytes = encoded(&readings);
        assert_eq!(
            field_encodings(&bytes),
            [
                ENCODING_DECIMAL_PACKED, // big
                ENCODING_DECIMAL_PACKED, // dec
                ENCODING_GORILLA,        // nan
                ENCODING_GORILLA,        // neg0
                ENCODING_DECIMAL_VARINT, // two: 150 then -25, 4 bytes; packed takes 5
            ]
        );
        assert_eq!(plain(&decoded(&bytes)), plain(&readings));
    }

    #[test]
    fn gorilla_wins_where_shorter() {
        // Decimals (scale 3) that repeat, but for one far off: Gorilla stores a repeat in a bit,
        // varints in a byte, and packing gives every delta the width of the spike.
        let values: Vec<f64> = (0..100).map(|i| if i == 50 { 0.001 } else { 1_234_567.891 }).collect();
        let mut ints = Vec::new();
        assert_eq!(decimal_scale(&values, &mut ints), Some(3));
        let plan = DecimalPlan::new(3, &ints);
        // Scale byte and 5-byte first value; then 97 one-byte deltas and two of 5 bytes, or a
        // 5-byte minimum, the width byte and 99 deltas of 32 bits (they span 2 · 1,234,567,890).
        assert_eq!((plan.varint_len, plan.packed_len), (6 + 97 + 2 * 5, 6 + 5 + 1 + 99 * 4));
        let bytes = encoded(&series(&values));
        assert_eq!(field_encodings(&bytes), [ENCODING_GORILLA]);
        assert_eq!(plain(&decoded(&bytes)), plain(&series(&values)));
    }

    #[test]
    fn hand_computed_encoding() {
        let readings = [Reading::new(1_000, vec![("t".into(), 1.0)]), Reading::new(1_010, vec![("t".into(), 1.5)])];
        #[rustfmt::skip]
        let expected = [
            0x01,             // version 1
            0x02,             // 2 readings
            0xd0, 0x0f,       // ts[0] = 1000: zigzag 2000 = 0b1111_1010000 -> 0x80|0x50, 0x0f
            0x14,             // ts[1] - ts[0] = 10: zigzag 20
            0x01,             // 1 field
            0x01, b't',       // name "t"
            0x00,             // present in every reading
            // 1.0 and 1.5 are 10 and 15 tenths (1.5 is no integer). As varints: 3 bytes; packed,
            // the delta 5 would be a minimum and a width of 0 bits: 4 bytes; Gorilla: 10 bytes.
            0x01,             // decimal, varint deltas
            0x03,             // value stream of 3 bytes:
            0x01,             // scale 1
            0x14,             // 10: zigzag 20
            0x0a,             // 15 - 10 = 5: zigzag 10
        ];
        assert_eq!(encoded(&readings), expected);
        assert_eq!(plain(&decoded(&expected)), plain(&readings));
    }

    #[test]
    fn hand_computed_packed_decimals() {
        let values = [20.5, 20.7, 20.6, 20.9, 21.0, 21.0, 20.8, 20.9];
        #[rustfmt::skip]
        let expected = [
            0x01, 0x08,       // version 1, 8 readings
            0x00,             // ts[0] = 0
            0xd0, 0x0f,       // ts[1] - ts[0] = 1000: zigzag 2000
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // deltas of delta 0
            0x01, 0x01, b'v', 0x00, // one field "v", in every reading
            // Tenths 205 207 206 209 210 210 208 209; deltas 2 -1 3 1 0 -2 1 span -2..=3, 6
            // values: 3 bits each above the minimum -2. Packed: 8 bytes; as varints: 10.
            0x02,             // decimal, packed deltas
            0x08,             // value stream of 8 bytes:
            0x01,             // scale 1
            0x9a, 0x03,       // 205: zigzag 410 = 0b11_0011010 -> 0x80|0x1a, 0x03
            0x03,             // smallest delta -2: zigzag 3
            0x03,             // 3 bits per delta
            // delta + 2 = 4 1 5 3 2 0 3: 100 001 101 011 010 000 011 and 3 bits of padding
            // = 1000_0110 1011_0100 0001_1000
            0x86, 0xb4, 0x18,
        ];
        assert_eq!(encoded(&series(&values)), expected);
        assert_eq!(plain(&decoded(&expected)), plain(&series(&values)));
    }

    #[test]
    fn hand_computed_presence_bitmap() {
        let readings =
            [Reading::new(-1, vec![("a".into(), 2.0)]), Reading::new(0, vec![("a".into(), 2.0), ("b".into(), -0.0)])];
        #[rustfmt::skip]
        let expected = [
            0x01, 0x02,
            0x01,             // ts[0] = -1: zigzag 1
            0x02,             // ts[1] - ts[0] = 1: zigzag 2
            0x02,             // 2 fields
            0x01, b'a', 0x00, // "a" in every reading
            0x01, 0x03,       // decimal with varint deltas, 3 bytes:
            0x00, 0x04, 0x00, // scale 0, 2: zigzag 4, delta 0
            0x01, b'b', 0x01, // "b" with a bitmap
            0b0000_0010,      // only in reading 1
            0x00, 0x08,       // -0.0 is no decimal: Gorilla, 8 bytes
            0x80, 0, 0, 0, 0, 0, 0, 0, // -0.0 raw
        ];
        assert_eq!(encoded(&readings), expected);
        assert_eq!(plain(&decoded(&expected)), plain(&readings));
    }

    #[test]
    fn hand_computed_value_stream() {
        let values = [
            0x3ff0_0000_0000_0000u64, // 1.0
            0x3ff0_0000_0000_0001,    // x = 1
            0x3ff0_0000_0000_0003,    // x = 2
            0x3ff0_0000_0000_0003,    // x = 0
            0xbff0_0000_0000_0002,    // x = 0x8000_0000_0000_0001
        ];
        #[rustfmt::skip]
        let expected = [
            // 1.0 raw
            0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            // x = 1 has 63 leading zeros, stored as 31: 11 · 11111 · 100001 (33 bits) · 0…01
            // x = 2 fits that window: 10 · 0…010 (33 bits)
            // x = 0: 0
            // x = 0x8000_0000_0000_0001, 64 bits: 11 · 00000 · 000000 · x
            // and a 0 of padding: 223 bits in all.
            0xff, 0x08, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x01, 0x30, 0x01, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        ];
        let mut bytes = Vec::new();
        let mut enc = GorillaEncoder::new(&mut bytes);
        values.iter().for_each(|&v| enc.push(v));
        enc.finish();
        assert_eq!(bytes, expected);
        let mut dec = GorillaDecoder::new(&expected);
        for v in values {
            assert_eq!(dec.next(), Ok(v));
        }
        assert_eq!(dec.bits.finish(), Ok(()));
    }

    #[test]
    fn rejects_stream_padding_that_is_not_canonical() {
        let longer = Error::Invalid("value stream longer than its values");
        // Gorilla, decimal with varints, decimal packed into 3 bits a delta.
        let cases = [
            (series(&[1.0, -0.0]), ENCODING_GORILLA),
            (series(&[1.0, 1.5]), ENCODING_DECIMAL_VARINT),
            (series(&[20.5, 20.7, 20.6, 20.9, 21.0, 21.0, 20.8, 20.9]), ENCODING_DECIMAL_PACKED),
        ];
        for (readings, encoding) in cases {
            let bytes = encoded(&readings);
            assert_eq!(field_encodings(&bytes), [encoding]);
            // The stream length follows name length, name, presence and encoding byte.
            let len_at = bytes.windows(3).position(|w| w == [1, b'v', PRESENT_IN_ALL]).expect("field v") + 4;
            // A stream one zero byte longer.
            let mut extra_byte = bytes.clone();
            extra_byte[len_at] += 1;
            extra_byte.push(0);
            assert_eq!(decode(&extra_byte, &mut Vec::new()), Err(longer.clone()), "{encoding}");
            if encoding != ENCODING_DECIMAL_VARINT {
                // A padding bit set.
                let mut padding = bytes.clone();
                *padding.last_mut().expect("not empty") |= 1;
                assert_eq!(decode(&padding, &mut Vec::new()), Err(longer.clone()), "{encoding}");
            }
        }
    }

    #[test]
    fn header_errors() {
        assert_eq!(count(&[]), Err(Error::Truncated { what: "version" }));
        assert_eq!(count(&[2, 1, 0]), Err(Error::UnknownVersion(2)));
        assert_eq!(count(&[1, 0]), Err(Error::Empty));
        assert_eq!(decode(&[1, 0], &mut Vec::new()), Err(Error::Empty));
        assert_eq!(count(&[1, 2, 0]), Err(Error::Truncated { what: "timestamps" }));
        assert_eq!(merge([]), Err(Error::Empty));
        assert_eq!(merge_latest([]), Err(Error::Empty));
        // Eleven continuation bytes: longer than any u64.
        let long = [1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(count(&long), Err(Error::Invalid(_))));
    }

    #[test]
    fn rejects_what_the_encoder_never_writes() {
        let r = |ts: i64| Reading::new(ts, vec![("a".into(), 1.0)]);
        let valid = encoded(&[r(5), r(7)]);
        let mut trailing = valid.clone();
        trailing.push(0);
        assert!(decode(&trailing, &mut Vec::new()).is_err());
        // Second timestamp delta 0: ts twice.
        let mut same_ts = valid.clone();
        same_ts[3] = 0;
        assert_eq!(decode(&same_ts, &mut Vec::new()), Err(Error::Invalid("timestamps not strictly increasing")));
        // Fields out of order: "b" then "a".
        let mut out_of_order = vec![1, 1, 0, 2];
        for name in [b'b', b'a'] {
            out_of_order.extend([1, name, 0, ENCODING_GORILLA, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        assert_eq!(decode(&out_of_order, &mut Vec::new()), Err(Error::Invalid("field names not strictly ascending")));
        let bad_utf8 = [1, 1, 0, 1, 1, 0xff, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(&bad_utf8, &mut Vec::new()), Err(Error::InvalidUtf8));
        let no_reading = [1, 1, 0, 1, 1, b'a', 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(&no_reading, &mut Vec::new()), Err(Error::Invalid("field present in no reading")));
        // Two readings; the bitmap also sets bit 2, past the last reading.
        let padding = [1, 2, 0, 2, 1, 1, b'a', 1, 0b110, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(&padding, &mut Vec::new()), Err(Error::Invalid("presence bitmap padding is not zero")));
        let presence = [1, 1, 0, 1, 1, b'a', 2, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(&presence, &mut Vec::new()), Err(Error::Invalid("unknown presence code")));
        let encoding = [1, 1, 0, 1, 1, b'a', 0, 3, 1, 0];
        assert_eq!(decode(&encoding, &mut Vec::new()), Err(Error::Invalid("unknown value encoding")));
    }

    #[test]
    fn rejects_decimal_streams_the_encoder_never_writes() {
        // A bucket of `n` readings at ts 0, 1, ... with field "a" of encoding `encoding`.
        let bucket = |n: u8, encoding: u8, stream: &[u8]| {
            let mut bytes = vec![FORMAT_V1, n, 0];
            bytes.extend((1..n).map(|i| if i == 1 { 2 } else { 0 }));
            bytes.extend([1, 1, b'a', PRESENT_IN_ALL, encoding, stream.len() as u8]);
            bytes.extend_from_slice(stream);
            bytes
        };
        let varints = |ints: &[i64]| {
            let mut out = Vec::new();
            ints.iter().for_each(|&i| put_varint(&mut out, zigzag(i)));
            out
        };
        let decode_err = |bytes: &[u8]| decode(bytes, &mut Vec::new()).expect_err("an invalid bucket");
        let range = Error::Invalid("decimal integer out of range");
        let truncated = Error::Truncated { what: "value stream" };

        // The largest integers decode; one more does not.
        for i in [MAX_DECIMAL, -MAX_DECIMAL] {
            let ok = bucket(1, ENCODING_DECIMAL_VARINT, &[&[0][..], &varints(&[i])].concat());
            assert_eq!(plain(&decoded(&ok)), plain(&[Reading::new(0, vec![("a".into(), i as f64)])]));
        }
        for stream in [varints(&[0, MAX_DECIMAL + 1]), varints(&[0, -MAX_DECIMAL - 1]), varints(&[0, i64::MIN])] {
            assert_eq!(decode_err(&bucket(1, ENCODING_DECIMAL_VARINT, &stream)), range);
        }
        // A delta past the largest, or past i64.
        for deltas in [[MAX_DECIMAL, 1], [MAX_DECIMAL, i64::MAX], [-MAX_DECIMAL, i64::MIN]] {
            let stream = [&[0][..], &varints(&deltas)].concat();
            assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_VARINT, &stream)), range);
        }
        // Packed: 2^53, then a minimum delta of 1 and no bits.
        let stream = [&[0][..], &varints(&[MAX_DECIMAL, 1]), &[0]].concat();
        assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_PACKED, &stream)), range);

        assert_eq!(decode_err(&bucket(1, ENCODING_DECIMAL_VARINT, &[16, 0])), Error::Invalid("decimal scale above 15"));
        assert_eq!(
            decode_err(&bucket(2, ENCODING_DECIMAL_PACKED, &[0, 0, 0, 57])),
            Error::Invalid("packed deltas wider than 56 bits")
        );
        // Values missing: a second varint, packed bits, the packed head.
        assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_VARINT, &[0, 0])), truncated);
        assert_eq!(decode_err(&bucket(3, ENCODING_DECIMAL_PACKED, &[0, 0, 0, 8, 0xff])), truncated);
        assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_PACKED, &[0, 0])), truncated);
        // Bytes left over: a third varint, a byte of bits of width 0, a packed head for one value.
        let longer = Error::Invalid("value stream longer than its values");
        assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_VARINT, &[0, 0, 0, 0])), longer);
        assert_eq!(decode_err(&bucket(2, ENCODING_DECIMAL_PACKED, &[0, 0, 0, 0, 0])), longer);
        assert_eq!(decode_err(&bucket(1, ENCODING_DECIMAL_PACKED, &[0, 0, 0, 0])), longer);
        // What decodes: three values from one byte of 4-bit deltas 3 and 0 above minimum 1.
        let ok = bucket(3, ENCODING_DECIMAL_PACKED, &[1, 0x14, 0x02, 4, 0x30]);
        let expected: Vec<Reading> =
            [1.0, 1.4, 1.5].iter().zip(0..).map(|(&v, ts)| Reading::new(ts, vec![("a".into(), v)])).collect();
        assert_eq!(plain(&decoded(&ok)), plain(&expected));
    }

    #[test]
    fn decode_error_leaves_out_untouched() {
        let before = vec![Reading::new(1, vec![])];
        let bytes = encoded(&[Reading::new(2, vec![("a".into(), 1.0)])]);
        let mut out = before.clone();
        assert!(decode(&bytes[..bytes.len() - 1], &mut out).is_err());
        assert_eq!(out, before);
    }

    #[test]
    fn merge_latest_ties_go_to_the_later_input() {
        let one = |ts: i64, v: f64| encoded(&[Reading::new(ts, vec![("v".into(), v)])]);
        let (old, new, older_ts) = (one(10, 1.0), one(10, 2.0), one(9, 3.0));
        let latest = merge_latest([&old[..], &new[..], &older_ts[..]]).expect("valid");
        assert_eq!(decoded(&latest), [Reading::new(10, vec![("v".into(), 2.0)])]);
        let latest = merge_latest([&new[..], &old[..]]).expect("valid");
        assert_eq!(decoded(&latest), [Reading::new(10, vec![("v".into(), 1.0)])]);
    }

    /// Only without debug assertions: a debug build asserts the input is sorted instead.
    #[cfg(not(debug_assertions))]
    #[test]
    fn release_encode_sorts_unsorted_input() {
        let r = |ts: i64, v: f64| Reading::new(ts, vec![("v".into(), v)]);
        let bytes = encoded(&[r(3, 1.0), r(1, 2.0), r(3, 4.0)]);
        assert_eq!(decoded(&bytes), [r(1, 2.0), r(3, 4.0)]);
        assert_eq!(decode(&encoded(&[]), &mut Vec::new()), Err(Error::Empty));
    }

    /// One hour at a 10 s interval, 7 fields of slowly changing sensor values with 2 decimals:
    /// the shape most buckets have.
    #[test]
    fn realistic_bucket_size() {
        // splitmix64: deterministic without a dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let names: Vec<FieldName> =
            ["battery", "humidity", "lat", "lon", "pressure", "speed", "temp"].into_iter().map(Into::into).collect();
        let mut values: [f64; 7] = [3.70, 55.0, 48.14, 11.58, 1013.25, 42.0, 21.5];
        let readings: Vec<Reading> = (0..360)
            .map(|i| {
                for v in &mut values {
                    // Steps of -0.02..=0.02, kept at 2 decimals.
                    let step = (next() % 5) as f64 - 2.0;
                    *v = ((*v * 100.0).round() + step) / 100.0;
                }
                let fields = names.iter().cloned().zip(values).collect();
                Reading::new(1_700_000_000_000 + i * 10_000, fields)
            })
            .collect();
        let bytes = encoded(&readings);
        assert_eq!(plain(&decoded(&bytes)), plain(&readings));
        // Steps of -2..=2 hundredths pack into 3 bits a value.
        assert_eq!(field_encodings(&bytes), [ENCODING_DECIMAL_PACKED; 7]);
        let per_value = bytes.len() as f64 / (360.0 * 7.0);
        // Measured: 1,425 bytes, 0.565 bytes per value, of which timestamps take 360 bytes
        // (Gorilla alone took 13,161 bytes, 5.22 bytes per value).
        assert!(per_value < 0.6, "{per_value} bytes per value");
    }
}
