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
//! Values are typed ([`model::Value`]): floats, integers, booleans and strings, each stored in a
//! stream of its own kind. Format v2 is written; v1 (floats only, written before typed fields)
//! is still read, and [`merge`] rewrites it as v2.
//!
//! # Format v2
//!
//! Format v2 is format v1 below with three changes:
//!
//! 1. After the version byte (`u8` = 2, [`FORMAT_V2`]) comes the **schema version**, a varint:
//!    the version of the table's schema the readings were checked against when written (0 for
//!    none; [`schema_version`] reads it). A merged bucket records the greatest version of its
//!    inputs. The bucket itself says every field's name and type, so decoding needs no schema:
//!    a reader decodes buckets of every schema version ever written alike.
//! 2. The **encoding** byte of a field also names its type: 0–2 floats (as in v1), 3 and 4
//!    integers, 5 booleans, 6 strings (below).
//! 3. Fields are in ascending order of (name bytes, type code of [`model::FieldType::code`]),
//!    no pair twice. One name may appear under two types — a field that a table stored as a
//!    float before it had a schema and as an integer since — but a reading holds at most one
//!    of them.
//!
//! ## Integer value streams (encodings 3 and 4)
//!
//! Like the decimal streams without the scale, for any `i64`: deltas are wrapping
//! (`i64::wrapping_sub`), so every pair of values has one.
//!
//! | what                      | encoding                     | meaning |
//! |---------------------------|------------------------------|---------|
//! | first value               | zigzag varint                | `v[0]` |
//! | encoding 3: `c - 1` ×     | zigzag varint                | delta `v[j] - v[j-1]` |
//! | encoding 4, when `c > 1`: |                              | |
//! | — minimum                 | zigzag varint                | `min`, the smallest delta |
//! | — width                   | `u8`                         | `w`, bits of each packed delta, at most 64 |
//! | — packed deltas           | `c - 1` × `w` bits, MSB first | `v[j] - v[j-1] - min` (wrapping, as `u64`); zero bits to the byte boundary |
//!
//! The shorter of the two is written, varints on a tie. A counter or a status code that rarely
//! changes packs into a few bits a value, or none (width 0) when its deltas are all equal.
//!
//! ## Boolean value streams (encoding 5)
//!
//! `ceil(c / 8)` bytes: bit `j` (byte `j / 8`, bit `j % 8`, LSB first) is value `j`; padding
//! bits 0.
//!
//! ## String value streams (encoding 6)
//!
//! Dictionary-encoded per bucket:
//!
//! | what                      | encoding                     | meaning |
//! |---------------------------|------------------------------|---------|
//! | `d`                       | varint                       | distinct strings, at least 1 |
//! | `d` × string              | varint length · UTF-8        | in order of first use, no string twice |
//! | `c` × index               | `ceil(log2(d))` bits each, MSB first | index of value `j` in the dictionary; none when `d == 1`; zero bits to the byte boundary |
//!
//! Every dictionary entry is used, and entry `k` first appears after entries `0..k` did, so the
//! encoding of a set of strings is unique. A device whose string rarely changes (a driver's
//! name, a firmware version) costs its string once a bucket and no bits a value.
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
//! Format v1 has no schema version and only encodings 0–2; its field names ascend strictly.
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

use model::{FieldName, FieldType, Reading, Value};
/// The varints and zigzag of the roll-up records, written the same way here.
pub(crate) use rollup::varint::{put as put_varint, unzigzag, zigzag};

/// Version byte of format v1, the first byte of its values (written before typed fields).
pub const FORMAT_V1: u8 = 1;
/// Version byte of format v2, the format written now.
pub const FORMAT_V2: u8 = 2;

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
/// Encoding of a value stream (v2): `i64`s, first value and wrapping deltas as zigzag varints.
const ENCODING_INT_VARINT: u8 = 3;
/// Encoding of a value stream (v2): `i64`s, wrapping deltas bit-packed above their minimum.
const ENCODING_INT_PACKED: u8 = 4;
/// Encoding of a value stream (v2): booleans, one bit each.
const ENCODING_BOOL_BITS: u8 = 5;
/// Encoding of a value stream (v2): strings, a dictionary and bit-packed indexes into it.
const ENCODING_STR_DICT: u8 = 6;

/// The type of the values of a stream of encoding `encoding`; `None` for an unknown encoding.
fn encoding_type(encoding: u8) -> Option<FieldType> {
    match encoding {
        ENCODING_GORILLA | ENCODING_DECIMAL_VARINT | ENCODING_DECIMAL_PACKED => Some(FieldType::F64),
        ENCODING_INT_VARINT | ENCODING_INT_PACKED => Some(FieldType::I64),
        ENCODING_BOOL_BITS => Some(FieldType::Bool),
        ENCODING_STR_DICT => Some(FieldType::Str),
        _ => None,
    }
}

/// Largest decimal scale: values with up to 15 decimals are stored as integers.
const MAX_SCALE: u8 = 15;
/// Largest magnitude of a decimal integer: every integer up to it is exact in an `f64`.
const MAX_DECIMAL: i64 = 1 << 53;
/// Largest bit width of a packed delta: deltas of decimal integers span less than `2^56`.
const MAX_WIDTH: u8 = 56;
/// Largest magnitude of a decimal integer whose scale the merge may change without the encoder
/// checking it (see [`FloatAcc`]): for `|i| <= 2^50` at scale `k`, [`to_decimal`] of
/// [`from_decimal`]`(i, k)` at `k` is `i` again. The product `v · 10^k` of that value is within
/// `|i| · 2^-52 <= 1/4` of `i` (two roundings of relative error `2^-53`), so it rounds to `i`.
/// Rescaling `i` to `i · 10^d` at scale `k + d` names the same rational, which both
/// divisions round to the same `f64`.
const KNOWN_DECIMAL: u64 = 1 << 50;

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
    encode_versioned(readings, 0, out);
}

/// Like [`encode`], recording `schema_version`: the version of the table schema the readings
/// were checked against (0 for none).
pub fn encode_versioned(readings: &[Reading], schema_version: u32, out: &mut Vec<u8>) {
    debug_assert!(!readings.is_empty(), "encoding an empty bucket");
    debug_assert!(strictly_sorted(readings), "encoding readings not sorted by ts, or with a ts twice");
    debug_assert!(
        readings.iter().all(|r| r.fields.windows(2).all(|w| w[0].0 < w[1].0)),
        "encoding a reading whose fields are not sorted by name, or hold a name twice"
    );
    if strictly_sorted(readings) {
        encode_sorted(readings, schema_version, out);
    } else {
        let mut owned = readings.to_vec();
        sort_dedup_last_wins(&mut owned);
        encode_sorted(&owned, schema_version, out);
    }
}

/// Decodes a bucket of any version ever written (v1 and v2), appending its readings to `out`
/// in `ts` order. On error `out` is left as it was.
pub fn decode(bytes: &[u8], out: &mut Vec<Reading>) -> Result<()> {
    let start = out.len();
    let result = decode_any(bytes, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Number of readings in an encoded bucket, read from its header alone: the rest of the bucket
/// is not checked.
pub fn count(bytes: &[u8]) -> Result<usize> {
    header(&mut Input::new(bytes)).map(|h| h.n)
}

/// The schema version an encoded bucket records, read from its header alone: 0 for a v1
/// bucket (written before schemas) and for readings checked against no schema.
pub fn schema_version(bytes: &[u8]) -> Result<u32> {
    header(&mut Input::new(bytes)).map(|h| h.schema_version)
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
/// Fails if any input is not a valid bucket, or if there is no input. (A lone input of the
/// current format is checked for its layout and order only: its values are checked when read.)
///
/// The result records the greatest schema version of the inputs: schemas only ever add fields,
/// so the newest schema any input was written with covers the readings of all of them.
pub fn merge<'a>(inputs: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>> {
    let inputs: Vec<&[u8]> = inputs.into_iter().collect();
    // One bucket of the current format is its own merge (the encoding of a set of readings is
    // unique): copied once its layout and order are checked. RocksDB full-merges a lone operand
    // too — a read of a bucket written whole, as a write-buffer flush writes them — and decoding
    // and re-encoding it was most of the cost of such a read.
    if let [only] = inputs[..] {
        if only.first() == Some(&FORMAT_V2) {
            let (mut prev, mut sorted) = (None, true);
            let (_, parsed) = parse(only, |t| {
                sorted &= prev.is_none_or(|p| t > p);
                prev = Some(t);
            })?;
            one_field_a_reading(&parsed)?;
            if sorted {
                return Ok(only.to_vec());
            }
        }
    }
    match merge_in_order(&inputs)? {
        Some(out) => Ok(out),
        None => merge_readings(&inputs),
    }
}

/// [`merge`] by way of readings: any inputs.
fn merge_readings(inputs: &[&[u8]]) -> Result<Vec<u8>> {
    let mut readings = Vec::new();
    let mut input_bytes = 0;
    let mut version = 0;
    for bytes in inputs {
        version = version.max(decode_with_version(bytes, &mut readings)?);
        input_bytes += bytes.len();
    }
    if readings.is_empty() {
        return Err(Error::Empty);
    }
    sort_dedup_last_wins(&mut readings);
    let mut out = Vec::with_capacity(input_bytes);
    encode_versioned(&readings, version, &mut out);
    Ok(out)
}

/// [`merge`] of inputs that follow one another in time (each input's first reading after the
/// input before's last) — a device's batches stored in the order they were written, the usual
/// case — done on columns, without a [`Reading`] per reading: the same bytes [`merge`] writes
/// by way of readings. `None` when two inputs overlap in time (at the first such input).
fn merge_in_order(inputs: &[&[u8]]) -> Result<Option<Vec<u8>>> {
    /// One (name, type) of the merged bucket: its values from every input, in input order.
    struct Acc<'a> {
        name: &'a str,
        ty: FieldType,
        floats: FloatAcc,
        ints: Vec<i64>,
        bools: Vec<bool>,
        strs: Vec<Arc<str>>,
        /// Values held.
        count: usize,
        /// The inputs that carry it: offset of their first reading, their reading count and
        /// presence bitmap.
        parts: Vec<(usize, usize, Option<&'a [u8]>)>,
    }
    if inputs.is_empty() {
        return Err(Error::Empty);
    }
    let mut ts: Vec<i64> = Vec::with_capacity(inputs.iter().map(|b| count(b).unwrap_or(0)).sum());
    let mut accs: Vec<Acc<'_>> = Vec::new();
    let mut version = 0;
    for bytes in inputs {
        let offset = ts.len();
        let (n, mut parsed) = parse(bytes, |t| ts.push(t))?;
        if offset > 0 && ts[offset] <= ts[offset - 1] {
            return Ok(None);
        }
        one_field_a_reading(&parsed)?;
        for (j, f) in parsed.fields.iter_mut().enumerate() {
            // Inputs mostly carry the same fields in the same order.
            let at = match accs.get(j).filter(|a| a.name == f.name && a.ty == f.ty) {
                Some(_) => j,
                None => match accs.iter().position(|a| a.name == f.name && a.ty == f.ty) {
                    Some(i) => i,
                    None => {
                        accs.push(Acc {
                            name: f.name,
                            ty: f.ty,
                            floats: FloatAcc::default(),
                            ints: Vec::new(),
                            bools: Vec::new(),
                            strs: Vec::new(),
                            count: 0,
                            parts: Vec::new(),
                        });
                        accs.len() - 1
                    }
                },
            };
            let acc = &mut accs[at];
            let present = f.present;
            match &mut f.values {
                ValueDecoder::Gorilla(d) => {
                    let values = acc.floats.values();
                    values.reserve(present);
                    for _ in 0..present {
                        values.push(f64::from_bits(d.next()?));
                    }
                }
                ValueDecoder::Decimal(d) => acc.floats.push_decimals(d, present)?,
                ValueDecoder::Int(d) => d.push_ints(present, &mut acc.ints)?,
                ValueDecoder::Bool(d) => {
                    for _ in 0..present {
                        acc.bools.push(d.next()?);
                    }
                }
                ValueDecoder::Str(d) => {
                    for _ in 0..present {
                        acc.strs.push(d.next()?);
                    }
                }
            }
            acc.count += present;
            acc.parts.push((offset, n, f.bitmap));
        }
        parsed.finish()?;
        version = version.max(schema_version(bytes)?);
    }
    let n = ts.len();
    let mut out = Vec::with_capacity(inputs.iter().map(|b| b.len()).sum());
    let mut columns: Vec<ColumnIn<'_>> = accs
        .iter_mut()
        .map(|acc| {
            let mut c = ColumnIn::in_all(acc.name, acc.ty);
            if acc.count != n {
                c.bitmap = vec![0; n.div_ceil(8)];
                for &(offset, len, presence) in &acc.parts {
                    for i in (0..len).filter(|&i| presence.is_none_or(|b| b[i / 8] >> (i % 8) & 1 == 1)) {
                        c.bitmap[(offset + i) / 8] |= 1 << ((offset + i) % 8);
                    }
                }
            }
            c.count = acc.count;
            c.min_scale = acc.floats.min_scale;
            if acc.floats.exact {
                c.decimal = Some(acc.floats.min_scale);
                c.ints = std::mem::take(&mut acc.floats.decimals);
            } else {
                c.values = std::mem::take(&mut acc.floats.values);
                c.ints = std::mem::take(&mut acc.ints);
            }
            c.bools = std::mem::take(&mut acc.bools);
            let acc: &Acc<'_> = acc;
            c.strs = acc.strs.iter().map(|s| &**s).collect();
            c
        })
        .collect();
    // The fields section as `encode_fields_sparse` writes it — which is also what
    // `encode_fields_dense` writes when every reading carries every field.
    encode_columns(&ts, version, &mut columns, &mut out);
    Ok(Some(out))
}

/// The values of a float field gathered by [`merge_in_order`], from the inputs in order: while
/// every input stored them as decimals and each fits [`KNOWN_DECIMAL`] at the largest of their
/// scales, as decimal integers at that scale, which the encoder takes as they are (nothing is
/// divided or rounded per value); otherwise as floats.
#[derive(Default)]
struct FloatAcc {
    /// Whether the values are `decimals` (else `values`). False until a first input is read
    /// (`min_scale` is 0 then): it is set by the first, if decimal.
    exact: bool,
    /// The values as decimal integers at scale `min_scale`, while `exact`.
    decimals: Vec<i64>,
    /// The largest magnitude in `decimals`.
    max_abs: u64,
    values: Vec<f64>,
    /// The largest scale of an input's decimal stream: no smaller scale holds all the values
    /// (an encoder's scale is the smallest that holds its input's).
    min_scale: u8,
}

/// `10^d` for every difference `d` of two decimal scales.
const POW10_INT: [u64; MAX_SCALE as usize + 1] = {
    let mut p = [1u64; MAX_SCALE as usize + 1];
    let mut d = 1;
    while d < p.len() {
        p[d] = p[d - 1] * 10;
        d += 1;
    }
    p
};

impl FloatAcc {
    /// The float values, for an input of floats: the decimals held so far become floats.
    fn values(&mut self) -> &mut Vec<f64> {
        self.leave_decimals(self.decimals.len(), self.min_scale);
        &mut self.values
    }

    /// Turns `decimals` into floats — the first `held` of them at `min_scale`, the rest (an
    /// input being added) at that input's scale `rest_scale` — and leaves `exact`. Each float is
    /// the value its input stored (see [`KNOWN_DECIMAL`]).
    fn leave_decimals(&mut self, held: usize, rest_scale: u8) {
        if !self.exact {
            return;
        }
        let (head, rest) = self.decimals.split_at(held);
        self.values.extend(head.iter().map(|&i| from_decimal(i, self.min_scale)));
        self.values.extend(rest.iter().map(|&i| from_decimal(i, rest_scale)));
        self.decimals.clear();
        self.exact = false;
    }

    /// Adds the `present` values of a decimal stream.
    fn push_decimals(&mut self, d: &mut DecimalDecoder<'_>, present: usize) -> Result<()> {
        // None held is none read: parsing refuses a field present in no reading.
        if self.decimals.is_empty() && self.values.is_empty() {
            self.exact = true;
            self.min_scale = d.k;
        }
        let scale = self.min_scale.max(d.k);
        if !self.exact {
            self.min_scale = scale;
            self.values.reserve(present);
            for _ in 0..present {
                self.values.push(d.next()?);
            }
            return Ok(());
        }
        let start = self.decimals.len();
        let part_max = d.push_ints(present, &mut self.decimals)?;
        // Both the values held and the new ones at the larger scale, within the bound.
        let (up_held, up_new) = (POW10_INT[usize::from(scale - self.min_scale)], POW10_INT[usize::from(scale - d.k)]);
        let rescaled = |max: u64, by: u64| max.checked_mul(by).filter(|&m| m <= KNOWN_DECIMAL);
        match (rescaled(self.max_abs, up_held), rescaled(part_max, up_new)) {
            (Some(held), Some(new)) => {
                let (head, rest) = self.decimals.split_at_mut(start);
                if up_held > 1 {
                    head.iter_mut().for_each(|i| *i *= up_held as i64);
                }
                if up_new > 1 {
                    rest.iter_mut().for_each(|i| *i *= up_new as i64);
                }
                self.max_abs = held.max(new);
            }
            _ => self.leave_decimals(start, d.k),
        }
        self.min_scale = scale;
        Ok(())
    }
}

/// [`decode`], answering the schema version the bucket records.
fn decode_with_version(bytes: &[u8], out: &mut Vec<Reading>) -> Result<u32> {
    decode(bytes, out)?;
    // The header was just read successfully.
    schema_version(bytes)
}

/// Of encoded buckets given oldest write first, the reading with the greatest `ts` (for a `ts`
/// held twice, the one in the later input), encoded as a one-reading bucket. Serves the `latest`
/// merge operator.
///
/// Fails if any input is not a valid bucket, or if there is no input.
pub fn merge_latest<'a>(inputs: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>> {
    let inputs: Vec<&[u8]> = inputs.into_iter().collect();
    match newest_of_singles(&inputs)? {
        Some(newest) => Ok(newest.to_vec()),
        None => merge_latest_decoding(&inputs),
    }
}

/// [`merge_latest`] by decoding every input.
fn merge_latest_decoding(inputs: &[&[u8]]) -> Result<Vec<u8>> {
    let mut scratch = Vec::new();
    let mut best: Option<Reading> = None;
    let mut version = 0;
    for &bytes in inputs {
        scratch.clear();
        version = version.max(decode_with_version(bytes, &mut scratch)?);
        // A decoded bucket is in ts order: its last reading is its newest.
        if let Some(newest) = scratch.pop() {
            if best.as_ref().is_none_or(|b| newest.ts >= b.ts) {
                best = Some(newest);
            }
        }
    }
    let best = best.ok_or(Error::Empty)?;
    let mut out = Vec::new();
    encode_versioned(std::slice::from_ref(&best), version, &mut out);
    Ok(out)
}

/// [`merge_latest`] without decoding a reading, when it can be: every input holds one reading
/// (as `latest` values and operands do) and the newest, in the current format, records the
/// greatest schema version of them all. Then that input's bytes are the answer (the encoding
/// of one reading is canonical), found from the headers and first timestamps; only the one
/// answered is read to its end, so a damaged answer is refused as [`merge_latest`] refuses it.
/// `None` when it cannot be (the caller merges by decoding); an input whose header or first
/// timestamp is damaged fails, as there.
///
/// Compactions of the `latest` column family call the merge for every device written again:
/// at 10M devices a tick, decoding and re-encoding each operand kept the compaction thread busy.
fn newest_of_singles<'a>(inputs: &[&'a [u8]]) -> Result<Option<&'a [u8]>> {
    // (ts, format version, schema version, bytes) of the newest input so far.
    let mut best: Option<(i64, u8, u32, &[u8])> = None;
    let mut greatest_schema = 0;
    for &bytes in inputs {
        let mut input = Input::new(bytes);
        let Header { version, schema_version, n } = header(&mut input)?;
        if n != 1 {
            return Ok(None);
        }
        let ts = unzigzag(input.varint("timestamps")?);
        greatest_schema = greatest_schema.max(schema_version);
        if best.is_none_or(|b| ts >= b.0) {
            best = Some((ts, version, schema_version, bytes));
        }
    }
    match best {
        Some((_, FORMAT_V2, schema, bytes)) if schema == greatest_schema => {
            decode_columns(bytes)?;
            Ok(Some(bytes))
        }
        _ => Ok(None),
    }
}

/// The newest reading of one bucket value as a `latest` operand: the bytes of
/// `merge_latest([bytes])`, read from the bucket's columns instead of a [`Reading`] per
/// reading (a write-buffer flush takes each device's newest reading from an hour it has just
/// merged).
pub fn newest(bytes: &[u8]) -> Result<Vec<u8>> {
    let (reading, schema_version) = newest_reading(bytes)?;
    let mut out = Vec::new();
    encode_versioned(std::slice::from_ref(&reading), schema_version, &mut out);
    Ok(out)
}

/// The newest reading of one bucket value and the bucket's schema version (a `latest` read
/// takes it from the hour its `latest` entry points to). Each value stream is read to its end
/// and only its last value kept: nothing is gathered a reading or a value at a time. Refuses
/// what [`decode`] refuses.
pub fn newest_reading(bytes: &[u8]) -> Result<(Reading, u32)> {
    let mut last_ts = None;
    let (n, mut parsed) = parse(bytes, |ts| last_ts = Some(ts))?;
    one_field_a_reading(&parsed)?;
    let (Some(ts), Some(last)) = (last_ts, n.checked_sub(1)) else {
        return Err(Error::Empty);
    };
    let mut fields = Vec::new();
    for f in &mut parsed.fields {
        let mut value = None;
        for _ in 0..f.present {
            value = Some(f.values.next()?);
        }
        // A column holds the values of the readings that carry it: the last reading's is the
        // column's last value.
        if let Some(value) = value.filter(|_| f.has(last)) {
            fields.push((Arc::from(f.name), value));
        }
    }
    parsed.finish()?;
    Ok((Reading { ts, fields }, schema_version(bytes)?))
}

/// Of encoded buckets given oldest write first, the newest reading as a one-reading bucket:
/// the bytes of [`merge_latest`] of them, and of [`newest`] of their [`merge`]. Only the
/// inputs' headers and timestamps are read, and the fields of the one input
/// that holds the greatest `ts` (the later input for a `ts` held twice): a `latest` read of
/// an open hour took its newest reading from the merge of the hour's operands, which decodes
/// and encodes every reading of the hour, so the read grew with the hour (QA14: `latest` of
/// 3,000 devices at one reading a second from 319 to 878 ms between minutes 6 and 25).
///
/// Fails if there is no input, if an input's header or timestamps are not valid, or if the
/// answering input is not valid throughout; the rest of the others is not read (a raw read
/// or a compaction of the bucket refuses it if damaged).
pub fn newest_of_buckets<'a>(inputs: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>> {
    // (greatest ts, input) so far.
    let mut best: Option<(i64, &[u8])> = None;
    let mut greatest_schema = 0;
    for bytes in inputs {
        let mut input = Input::new(bytes);
        let Header { schema_version, n, .. } = header(&mut input)?;
        let mut last = None;
        timestamps(&mut input, n, |ts| last = Some(ts))?;
        let last = last.ok_or(Error::Empty)?;
        greatest_schema = greatest_schema.max(schema_version);
        if best.is_none_or(|b| last >= b.0) {
            best = Some((last, bytes));
        }
    }
    let (_, bytes) = best.ok_or(Error::Empty)?;
    let (reading, _) = newest_reading(bytes)?;
    let mut out = Vec::new();
    encode_versioned(std::slice::from_ref(&reading), greatest_schema, &mut out);
    Ok(out)
}

/// The newest reading of a decoded bucket ([`decode_columns`]).
pub fn newest_of_columns(columns: &Columns<'_>) -> Result<Reading> {
    let last = columns.ts.len().checked_sub(1).ok_or(Error::Empty)?;
    // The values of a column are those of the readings that carry it: the last reading's is
    // the column's last value.
    let fields = columns
        .fields
        .iter()
        .filter(|c| c.has(last))
        .filter_map(|c| {
            let value = match &c.values {
                ColumnValues::F64(v) => Value::F64(*v.last()?),
                ColumnValues::I64(v) => Value::I64(*v.last()?),
                ColumnValues::Bool(v) => Value::Bool(*v.last()?),
                ColumnValues::Str(v) => Value::Str(v.last()?.clone()),
            };
            Some((Arc::from(c.name), value))
        })
        .collect();
    Ok(Reading { ts: columns.ts[last], fields })
}

fn strictly_sorted(readings: &[Reading]) -> bool {
    readings.windows(2).all(|w| w[0].ts < w[1].ts)
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Writes the version, the schema version, `n` and the `n` timestamps `ts`.
fn put_timestamps(out: &mut Vec<u8>, schema_version: u32, n: usize, ts: impl Iterator<Item = i64>) {
    out.push(FORMAT_V2);
    put_varint(out, u64::from(schema_version));
    put_varint(out, n as u64);

    let (mut prev_ts, mut prev_delta) = (0i64, 0i64);
    for (i, ts) in ts.enumerate() {
        let v = match i {
            0 => ts,
            _ => {
                let delta = ts.wrapping_sub(prev_ts);
                let v = if i == 1 { delta } else { delta.wrapping_sub(prev_delta) };
                prev_delta = delta;
                v
            }
        };
        put_varint(out, zigzag(v));
        prev_ts = ts;
    }
}

fn encode_sorted(readings: &[Reading], schema_version: u32, out: &mut Vec<u8>) {
    put_timestamps(out, schema_version, readings.len(), readings.iter().map(|r| r.ts));

    let mut scratch = Scratch::default();
    if same_fields_everywhere(readings) {
        encode_fields_dense(readings, out, &mut scratch);
    } else {
        encode_fields_sparse(readings, out, &mut scratch);
    }
}

/// One field of a set of readings, gathered for [`encode_columns`]: which readings carry it
/// and its values in reading order.
#[derive(Debug)]
pub(crate) struct ColumnIn<'a> {
    pub(crate) name: &'a str,
    pub(crate) ty: FieldType,
    /// Bit `i` (byte `i / 8`, bit `i % 8`) set when reading `i` carries the field: `n` bits.
    /// Not read when every reading carries the field (`count` is `n`), and empty then if the
    /// column was made by [`ColumnIn::in_all`].
    pub(crate) bitmap: Vec<u8>,
    /// Values held: set bits of `bitmap`, or `n` when every reading carries the field.
    pub(crate) count: usize,
    /// A decimal scale below which the float values are known not to be decimals (0: none
    /// known; a hint that spares the encoder trying smaller scales).
    pub(crate) min_scale: u8,
    /// For a float column, `Some(k)` when `ints` holds its values instead of `values`, as
    /// decimal integers at scale `k`, each within `±2^50` ([`KNOWN_DECIMAL`]), and no smaller
    /// scale holds them all: the encoder then takes them as they are.
    pub(crate) decimal: Option<u8>,
    /// The values, in the vector of the field's type.
    pub(crate) values: Vec<f64>,
    pub(crate) ints: Vec<i64>,
    pub(crate) bools: Vec<bool>,
    pub(crate) strs: Vec<&'a str>,
}

impl<'a> ColumnIn<'a> {
    /// An empty column of a field of `n` readings.
    pub(crate) fn new(name: &'a str, ty: FieldType, n: usize) -> ColumnIn<'a> {
        ColumnIn { bitmap: vec![0; n.div_ceil(8)], ..ColumnIn::in_all(name, ty) }
    }

    /// An empty column without a bitmap, for a field every reading will carry.
    pub(crate) fn in_all(name: &'a str, ty: FieldType) -> ColumnIn<'a> {
        ColumnIn {
            name,
            ty,
            bitmap: Vec::new(),
            count: 0,
            min_scale: 0,
            decimal: None,
            values: Vec::new(),
            ints: Vec::new(),
            bools: Vec::new(),
            strs: Vec::new(),
        }
    }
}

/// Encodes readings given as columns — timestamps `ts` (strictly ascending) and each field's
/// [`ColumnIn`], in any order, no (name, type) twice, each holding at least one value — into
/// the very bytes [`encode_versioned`] writes for the same readings (the encoding of a set of
/// readings is unique), without a [`Reading`] per reading. Appends to `out`.
pub(crate) fn encode_columns(ts: &[i64], schema_version: u32, columns: &mut [ColumnIn<'_>], out: &mut Vec<u8>) {
    debug_assert!(ts.windows(2).all(|w| w[0] < w[1]), "encoding columns not sorted by ts, or with a ts twice");
    let n = ts.len();
    put_timestamps(out, schema_version, n, ts.iter().copied());
    // The fields section as `encode_fields_sparse` writes it.
    columns.sort_unstable_by(|a, b| (a.name, a.ty).cmp(&(b.name, b.ty)));
    put_varint(out, columns.len() as u64);
    let mut scratch = Scratch::default();
    for c in columns.iter_mut() {
        put_name(out, c.name);
        if c.count == n {
            out.push(PRESENT_IN_ALL);
        } else {
            out.push(PRESENT_BITMAP);
            out.extend_from_slice(&c.bitmap);
        }
        scratch.clear();
        // The column's own vector only: a float column's decimal integers go to the scratch's,
        // which keeps its size from field to field.
        match c.ty {
            FieldType::F64 if c.decimal.is_some() => std::mem::swap(&mut scratch.ints, &mut c.ints),
            FieldType::F64 => std::mem::swap(&mut scratch.values, &mut c.values),
            FieldType::I64 => std::mem::swap(&mut scratch.ints, &mut c.ints),
            FieldType::Bool => std::mem::swap(&mut scratch.bools, &mut c.bools),
            FieldType::Str => std::mem::swap(&mut scratch.strs, &mut c.strs),
        }
        scratch.min_scale = c.min_scale;
        scratch.decimal = c.decimal;
        put_values(out, c.ty, &mut scratch);
    }
}

/// Buffers reused from field to field.
#[derive(Default)]
struct Scratch<'r> {
    /// The field's values, present ones only, of whichever type the field has: one of these is
    /// filled at a time.
    values: Vec<f64>,
    /// Integer values; for float values, the values as decimal integers, when they are decimals.
    ints: Vec<i64>,
    bools: Vec<bool>,
    strs: Vec<&'r str>,
    /// The Gorilla stream, built before its length is known.
    stream: Vec<u8>,
    /// For float values, a scale below which they are known not to be decimals (0: none
    /// known).
    min_scale: u8,
    /// For float values, `Some(k)` when `ints` holds them already, as [`ColumnIn::decimal`]
    /// says, and `values` may be empty.
    decimal: Option<u8>,
}

impl<'r> Scratch<'r> {
    fn clear(&mut self) {
        self.values.clear();
        self.ints.clear();
        self.bools.clear();
        self.strs.clear();
        self.min_scale = 0;
        self.decimal = None;
    }

    /// Adds a value of the field's type `ty` (the caller groups values by type).
    #[inline]
    fn push(&mut self, value: &'r Value) {
        match value {
            Value::F64(v) => self.values.push(*v),
            // Stored as the `f64` it is (the schema check types these before a write).
            Value::UntypedInt(v) => self.values.push(*v as f64),
            Value::I64(v) => self.ints.push(*v),
            Value::Bool(v) => self.bools.push(*v),
            Value::Str(v) => self.strs.push(v),
        }
    }

    fn len(&self, ty: FieldType) -> usize {
        match ty {
            FieldType::F64 => self.values.len(),
            FieldType::I64 => self.ints.len(),
            FieldType::Bool => self.bools.len(),
            FieldType::Str => self.strs.len(),
        }
    }
}

/// Whether every reading carries exactly the fields of the first, with the same types, whose
/// names ascend strictly — the usual case of a device sending the same fields every time.
fn same_fields_everywhere(readings: &[Reading]) -> bool {
    let Some((first, rest)) = readings.split_first() else {
        return true;
    };
    let same = |a: &(FieldName, Value), b: &(FieldName, Value)| {
        a.0 == b.0 && std::mem::discriminant(&a.1) == std::mem::discriminant(&b.1)
    };
    first.fields.windows(2).all(|w| w[0].0 < w[1].0)
        && rest.iter().all(|r| {
            r.fields.len() == first.fields.len() && r.fields.iter().zip(&first.fields).all(|(a, b)| same(a, b))
        })
}

/// Fields section when every reading has the same fields: field `j` is at index `j` everywhere.
fn encode_fields_dense<'r>(readings: &'r [Reading], out: &mut Vec<u8>, scratch: &mut Scratch<'r>) {
    let names = readings.first().map_or(&[][..], |r| &r.fields[..]);
    put_varint(out, names.len() as u64);
    for (j, (name, first)) in names.iter().enumerate() {
        put_name(out, name);
        out.push(PRESENT_IN_ALL);
        scratch.clear();
        if let Value::F64(_) = first {
            // The common case, without a match per value.
            scratch.values.extend(readings.iter().map(|r| match r.fields[j].1 {
                Value::F64(v) => v,
                _ => f64::NAN,
            }));
        } else {
            readings.iter().for_each(|r| scratch.push(&r.fields[j].1));
        }
        put_values(out, first.field_type(), scratch);
    }
}

/// Fields section in general: the union of the readings' (field name, type) pairs, each with
/// the readings that carry it.
fn encode_fields_sparse<'r>(readings: &'r [Reading], out: &mut Vec<u8>, scratch: &mut Scratch<'r>) {
    let mut keys: Vec<(&FieldName, FieldType)> =
        readings.iter().flat_map(|r| r.fields.iter().map(|(name, v)| (name, v.field_type()))).collect();
    keys.sort_unstable();
    keys.dedup();
    put_varint(out, keys.len() as u64);

    let n = readings.len();
    // Per reading, the index of its first field not yet stored: keys are visited in ascending
    // order, as each reading's fields are sorted by name, so every field is looked at once. A
    // field whose name matches but whose type does not is left for a later key of that name.
    let mut cursor = vec![0usize; n];
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    for (name, ty) in keys {
        bitmap.fill(0);
        scratch.clear();
        for (i, (r, c)) in readings.iter().zip(cursor.iter_mut()).enumerate() {
            while r.fields.get(*c).is_some_and(|(f, _)| f < name) {
                *c += 1;
            }
            if let Some((_, value)) = r.fields.get(*c).filter(|(f, v)| f == name && v.field_type() == ty) {
                bitmap[i / 8] |= 1 << (i % 8);
                scratch.push(value);
                *c += 1;
            }
        }
        put_name(out, name);
        if scratch.len(ty) == n {
            out.push(PRESENT_IN_ALL);
        } else {
            out.push(PRESENT_BITMAP);
            out.extend_from_slice(&bitmap);
        }
        put_values(out, ty, scratch);
    }
}

/// Writes the encoding code, stream length and value stream of the field's values in `scratch`
/// (at least one value of type `ty`).
fn put_values(out: &mut Vec<u8>, ty: FieldType, scratch: &mut Scratch<'_>) {
    match ty {
        FieldType::F64 => put_floats(out, scratch),
        FieldType::I64 => IntPlan::new(&scratch.ints).write(out, &scratch.ints),
        FieldType::Bool => put_bools(out, &scratch.bools),
        FieldType::Str => put_strs(out, &scratch.strs),
    }
}

/// Writes the float stream of `scratch.values` (or of `scratch.ints` at `scratch.decimal`),
/// choosing the shortest stream: of equally short ones decimal over Gorilla, and of the two
/// decimal ones varints over packed bits.
fn put_floats(out: &mut Vec<u8>, scratch: &mut Scratch<'_>) {
    let Scratch { values, ints, stream, min_scale, decimal, .. } = scratch;
    let plan = match *decimal {
        Some(k) => Some((k, DecimalPlan::new(k, ints))),
        None => decimal_scale_from(values, ints, *min_scale).map(|k| (k, DecimalPlan::new(k, ints))),
    };
    if let Some((k, plan)) = &plan {
        // A decimal stream no longer than the shortest Gorilla stream could be wins without
        // building the Gorilla one. The floor is summed until it reaches the plan's length, and
        // of values known only as decimals only the values it looks at are computed.
        let reaches = match decimal {
            Some(_) => gorilla_floor_upto(ints.iter().map(|&i| from_decimal(i, *k).to_bits()), plan.len()),
            None => gorilla_floor_upto(values.iter().map(|v| v.to_bits()), plan.len()),
        };
        if reaches >= plan.len() {
            plan.write(out, ints);
            return;
        }
    }
    if let Some(k) = *decimal {
        values.clear();
        values.extend(ints.iter().map(|&i| from_decimal(i, k)));
    }
    stream.clear();
    let mut enc = GorillaEncoder::new(stream);
    values.iter().for_each(|v| enc.push(v.to_bits()));
    enc.finish();
    match plan {
        Some((_, plan)) if plan.len() <= stream.len() => plan.write(out, ints),
        _ => {
            out.push(ENCODING_GORILLA);
            put_stream(out, stream);
        }
    }
}

/// A lower bound of the length of the Gorilla stream of `values`: 64 bits of the first value,
/// then one bit for a repeat and for any other value two bits and at least the meaningful bits
/// of its XOR with the value before (the window of a `10` entry holds them all).
#[cfg(test)]
fn gorilla_floor(values: &[f64]) -> usize {
    gorilla_floor_upto(values.iter().map(|v| v.to_bits()), usize::MAX)
}

/// The gorilla floor of values given as bit patterns, or — once it reaches `enough` bytes — a
/// number of bytes at least `enough` and at most the floor, without looking at the rest.
fn gorilla_floor_upto(mut bits: impl Iterator<Item = u64>, enough: usize) -> usize {
    let Some(mut prev) = bits.next() else {
        return 8;
    };
    // The floor exceeds `enough` bytes once the bits after the first value exceed this.
    let stop = enough.saturating_mul(8).saturating_sub(64);
    let mut sum = 0;
    for b in bits {
        sum += match prev ^ b {
            0 => 1,
            x => 2 + 64 - x.leading_zeros().min(MAX_LEAD) as usize - x.trailing_zeros() as usize,
        };
        prev = b;
        if sum >= stop {
            break;
        }
    }
    (64 + sum).div_ceil(8)
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
#[cfg(test)]
fn decimal_scale(values: &[f64], ints: &mut Vec<i64>) -> Option<u8> {
    decimal_scale_from(values, ints, 0)
}

/// [`decimal_scale`] knowing that no scale below `min` holds every value: the same answer,
/// without trying those.
fn decimal_scale_from(values: &[f64], ints: &mut Vec<i64>, min: u8) -> Option<u8> {
    let mut k = min;
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

/// A decimal value stream about to be written: the scale byte, then the scaled integers'
/// stream as [`IntPlan`] lays it out (each within `±2^53`, so its wrapping deltas are the plain
/// ones), in whichever of the two forms is shorter.
struct DecimalPlan {
    k: u8,
    ints: IntPlan,
}

impl DecimalPlan {
    /// `ints` holds at least one value, each within `±2^53`.
    fn new(k: u8, ints: &[i64]) -> DecimalPlan {
        DecimalPlan { k, ints: IntPlan::new(ints) }
    }

    fn packed(&self) -> bool {
        self.ints.packed()
    }

    /// Length of the stream.
    fn len(&self) -> usize {
        1 + self.ints.len()
    }

    fn write(&self, out: &mut Vec<u8>, ints: &[i64]) {
        out.push(if self.packed() { ENCODING_DECIMAL_PACKED } else { ENCODING_DECIMAL_VARINT });
        put_varint(out, self.len() as u64);
        let start = out.len();
        out.push(self.k);
        self.ints.write_body(out, ints);
        debug_assert_eq!(out.len() - start, self.len(), "decimal stream length planned wrong");
    }
}

/// An integer value stream about to be written, with the length of either form. Deltas wrap
/// (`i64::wrapping_sub`), so any two `i64`s have one.
struct IntPlan {
    /// Smallest delta and bits per packed delta (0 to 64).
    min: i64,
    width: u32,
    varint_len: usize,
    packed_len: usize,
}

impl IntPlan {
    /// `ints` holds at least one value.
    fn new(ints: &[i64]) -> IntPlan {
        let head = varint_len(zigzag(ints[0]));
        if ints.len() == 1 {
            return IntPlan { min: 0, width: 0, varint_len: head, packed_len: head };
        }
        let (mut min, mut max, mut delta_bytes) = (i64::MAX, i64::MIN, 0);
        for w in ints.windows(2) {
            let d = w[1].wrapping_sub(w[0]);
            min = min.min(d);
            max = max.max(d);
            delta_bytes += varint_len(zigzag(d));
        }
        // `max - min` as an unsigned number: exact, as both are i64s.
        let width = 64 - (max.wrapping_sub(min) as u64).leading_zeros();
        let packed_bits = (ints.len() - 1) * width as usize;
        let packed_len = head + varint_len(zigzag(min)) + 1 + packed_bits.div_ceil(8);
        IntPlan { min, width, varint_len: head + delta_bytes, packed_len }
    }

    fn packed(&self) -> bool {
        self.packed_len < self.varint_len
    }

    fn len(&self) -> usize {
        self.varint_len.min(self.packed_len)
    }

    fn write(&self, out: &mut Vec<u8>, ints: &[i64]) {
        out.push(if self.packed() { ENCODING_INT_PACKED } else { ENCODING_INT_VARINT });
        put_varint(out, self.len() as u64);
        let start = out.len();
        self.write_body(out, ints);
        debug_assert_eq!(out.len() - start, self.len(), "integer stream length planned wrong");
    }

    /// The stream after its encoding byte and length: the first value, then the deltas.
    fn write_body(&self, out: &mut Vec<u8>, ints: &[i64]) {
        put_varint(out, zigzag(ints[0]));
        if !self.packed() {
            for w in ints.windows(2) {
                put_varint(out, zigzag(w[1].wrapping_sub(w[0])));
            }
        } else if ints.len() > 1 {
            put_varint(out, zigzag(self.min));
            out.push(self.width as u8);
            let mut bits = BitWriter::new(out);
            if self.width > 0 {
                for w in ints.windows(2) {
                    bits.write(w[1].wrapping_sub(w[0]).wrapping_sub(self.min) as u64, self.width);
                }
            }
            bits.finish();
        }
    }
}

/// Writes a boolean stream: bit `j` (byte `j / 8`, bit `j % 8`, LSB first) is value `j`.
fn put_bools(out: &mut Vec<u8>, bools: &[bool]) {
    out.push(ENCODING_BOOL_BITS);
    put_varint(out, bools.len().div_ceil(8) as u64);
    for chunk in bools.chunks(8) {
        out.push(chunk.iter().enumerate().fold(0u8, |byte, (i, &b)| byte | (u8::from(b) << i)));
    }
}

/// Bits of an index into a dictionary of `d` entries: 0 for one entry.
fn index_width(d: usize) -> u32 {
    64 - (d as u64).saturating_sub(1).leading_zeros()
}

/// Writes a string stream: the distinct strings in order of first appearance, then each
/// value's index into them, packed.
fn put_strs(out: &mut Vec<u8>, strs: &[&str]) {
    // Most buckets hold one or a few distinct strings: a linear search beats hashing there.
    let mut dict: Vec<&str> = Vec::new();
    let mut indexes: Vec<u64> = Vec::with_capacity(strs.len());
    for s in strs {
        let i = match dict.iter().position(|d| d == s) {
            Some(i) => i,
            None => {
                dict.push(s);
                dict.len() - 1
            }
        };
        indexes.push(i as u64);
    }
    let mut stream = Vec::new();
    put_varint(&mut stream, dict.len() as u64);
    for s in &dict {
        put_name(&mut stream, s);
    }
    let width = index_width(dict.len());
    let mut bits = BitWriter::new(&mut stream);
    if width > 0 {
        indexes.iter().for_each(|&i| bits.write(i, width));
    }
    bits.finish();
    out.push(ENCODING_STR_DICT);
    put_stream(out, &stream);
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    put_varint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
}

fn put_stream(out: &mut Vec<u8>, stream: &[u8]) {
    put_varint(out, stream.len() as u64);
    out.extend_from_slice(stream);
}

/// Bytes of the varint of `v`.
#[inline]
fn varint_len(v: u64) -> usize {
    usize::from(VARINT_LEN_BY_ZEROS[v.leading_zeros() as usize])
}

/// Bytes of the varint of a value with `z` leading zero bits, for each `z` from 0 to 64.
const VARINT_LEN_BY_ZEROS: [u8; 65] = {
    let mut t = [0u8; 65];
    let mut z = 0;
    while z <= 64 {
        let bits = if z == 64 { 1 } else { 64 - z };
        t[z] = bits.div_ceil(7) as u8;
        z += 1;
    }
    t
};

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

    #[inline]
    fn varint(&mut self, what: &'static str) -> Result<u64> {
        // Most varints of a bucket (timestamps' second differences, small deltas) are one byte.
        if let Some((&b, rest)) = self.rest.split_first() {
            if b < 0x80 {
                self.rest = rest;
                return Ok(u64::from(b));
            }
        }
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

/// What a bucket's header says.
struct Header {
    version: u8,
    schema_version: u32,
    /// Number of readings, at least one.
    n: usize,
}

/// Reads the version, the schema version (v2) and the reading count.
fn header(input: &mut Input<'_>) -> Result<Header> {
    let version = input.u8("version")?;
    let schema_version = match version {
        FORMAT_V1 => 0,
        FORMAT_V2 => u32::try_from(input.varint("schema version")?)
            .map_err(|_| Error::Invalid("schema version above 2^32 - 1"))?,
        v => return Err(Error::UnknownVersion(v)),
    };
    // Each reading takes at least one byte of timestamp.
    match input.count("timestamps")? {
        0 => Err(Error::Empty),
        n => Ok(Header { version, schema_version, n }),
    }
}

/// One field of a bucket being decoded.
struct FieldDecoder<'a> {
    name: &'a str,
    ty: FieldType,
    /// Whether the field before has the same name (under another type).
    repeats_name: bool,
    /// `None` when every reading has the field.
    bitmap: Option<&'a [u8]>,
    /// Number of readings that carry the field.
    present: usize,
    values: ValueDecoder<'a>,
}

impl FieldDecoder<'_> {
    fn has(&self, i: usize) -> bool {
        self.bitmap.is_none_or(|b| b[i / 8] >> (i % 8) & 1 == 1)
    }
}

/// A bucket with its header and fields section read: its timestamps decoded, each field's
/// value stream ready to decode.
struct Parsed<'a> {
    fields: Vec<FieldDecoder<'a>>,
}

/// Reads the `n` timestamps that follow a header, handing each to `on_ts` in order.
fn timestamps(input: &mut Input<'_>, n: usize, mut on_ts: impl FnMut(i64)) -> Result<()> {
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
        on_ts(ts);
    }
    Ok(())
}

/// Reads a bucket up to its value streams, handing each timestamp to `on_ts` in order: the
/// checks of every rule of the format but those about the values themselves.
fn parse<'a>(bytes: &'a [u8], on_ts: impl FnMut(i64)) -> Result<(usize, Parsed<'a>)> {
    let mut input = Input::new(bytes);
    let Header { version, n, .. } = header(&mut input)?;
    timestamps(&mut input, n, on_ts)?;

    let m = input.count("field count")?;
    let mut fields: Vec<FieldDecoder<'_>> = Vec::with_capacity(m);
    for _ in 0..m {
        let name_len = input.count("field name")?;
        let name = std::str::from_utf8(input.take(name_len, "field name")?).map_err(|_| Error::InvalidUtf8)?;
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
        let ty = encoding_type(encoding)
            .filter(|ty| version >= FORMAT_V2 || *ty == FieldType::F64)
            .ok_or(Error::Invalid("unknown value encoding"))?;
        // v1: names strictly ascending; v2: (name, type) strictly ascending.
        if fields.last().is_some_and(|f| (f.name, f.ty) >= (name, ty) || (version == FORMAT_V1 && f.name == name)) {
            return Err(Error::Invalid("field names not strictly ascending"));
        }
        let stream_len = input.count("value stream")?;
        let stream = input.take(stream_len, "value stream")?;
        let present = bitmap.map_or(n, |b| b.iter().map(|b| b.count_ones() as usize).sum());
        let values = match encoding {
            ENCODING_GORILLA => ValueDecoder::Gorilla(GorillaDecoder::new(stream)),
            ENCODING_DECIMAL_VARINT | ENCODING_DECIMAL_PACKED => {
                ValueDecoder::Decimal(DecimalDecoder::new(stream, encoding == ENCODING_DECIMAL_PACKED, present)?)
            }
            ENCODING_INT_VARINT | ENCODING_INT_PACKED => {
                ValueDecoder::Int(IntDecoder::new(stream, encoding == ENCODING_INT_PACKED, present)?)
            }
            ENCODING_BOOL_BITS => ValueDecoder::Bool(BoolDecoder::new(stream, present)?),
            _ => ValueDecoder::Str(StrDecoder::new(stream)?),
        };
        let repeats_name = fields.last().is_some_and(|f| f.name == name);
        fields.push(FieldDecoder { name, ty, repeats_name, bitmap, present, values });
    }
    if !input.rest.is_empty() {
        return Err(Error::Invalid("bytes after the last field"));
    }
    Ok((n, Parsed { fields }))
}

impl Parsed<'_> {
    /// Checks, once every value was read, that no stream holds more.
    fn finish(&self) -> Result<()> {
        self.fields.iter().try_for_each(|f| f.values.finish())?;
        if self.fields.iter().any(|f| matches!(&f.values, ValueDecoder::Str(d) if d.used != d.dict.len())) {
            return Err(Error::Invalid("string dictionary holds a string no value uses"));
        }
        Ok(())
    }
}

fn decode_any(bytes: &[u8], out: &mut Vec<Reading>) -> Result<()> {
    let start = out.len();
    let (n, mut parsed) = parse(bytes, |ts| out.push(Reading { ts, fields: Vec::new() }))?;
    debug_assert_eq!(out.len() - start, n);
    let fields = &mut parsed.fields;
    let names: Vec<FieldName> = fields.iter().map(|f| FieldName::from(f.name)).collect();
    let all_dense = fields.iter().all(|f| f.bitmap.is_none());
    for (i, reading) in out[start..].iter_mut().enumerate() {
        let len = if all_dense { fields.len() } else { fields.iter().filter(|f| f.has(i)).count() };
        let mut values: Vec<(FieldName, Value)> = Vec::with_capacity(len);
        for (f, name) in fields.iter_mut().zip(&names) {
            if f.has(i) {
                // One name under two types (v2): a reading holds at most one of them.
                if f.repeats_name && values.last().is_some_and(|(last, _)| **last == *f.name) {
                    return Err(Error::Invalid("a reading holds a field twice"));
                }
                values.push((Arc::clone(name), f.values.next()?));
            }
        }
        reading.fields = values;
    }
    parsed.finish()
}

/// A bucket decoded into columns: its timestamps and, per field, the values of the readings
/// that carry it — what [`decode`] returns without a [`Reading`] per reading, for work that
/// goes field by field (roll-ups, merges of buckets that follow one another in time).
#[derive(Debug, Clone, PartialEq)]
pub struct Columns<'a> {
    /// Timestamps, strictly increasing.
    pub ts: Vec<i64>,
    /// Fields in the bucket's order: ascending (name, type).
    pub fields: Vec<Column<'a>>,
    /// The schema version the bucket records ([`schema_version`]).
    pub schema_version: u32,
}

/// One field of [`Columns`].
#[derive(Debug, Clone, PartialEq)]
pub struct Column<'a> {
    /// Field name.
    pub name: &'a str,
    /// Bit `i` (byte `i / 8`, LSB first) set when reading `i` carries the field; `None` when
    /// every reading does.
    pub presence: Option<&'a [u8]>,
    /// The values of the readings that carry the field, in time order.
    pub values: ColumnValues,
}

/// The values of a [`Column`], of its field's type.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValues {
    /// Floats.
    F64(Vec<f64>),
    /// Integers.
    I64(Vec<i64>),
    /// Booleans.
    Bool(Vec<bool>),
    /// Strings.
    Str(Vec<Arc<str>>),
}

impl Column<'_> {
    /// The field's type.
    pub fn field_type(&self) -> FieldType {
        match self.values {
            ColumnValues::F64(_) => FieldType::F64,
            ColumnValues::I64(_) => FieldType::I64,
            ColumnValues::Bool(_) => FieldType::Bool,
            ColumnValues::Str(_) => FieldType::Str,
        }
    }

    /// Whether reading `i` carries the field.
    pub fn has(&self, i: usize) -> bool {
        self.presence.is_none_or(|b| b[i / 8] >> (i % 8) & 1 == 1)
    }

    /// For a numeric field ([`Value::as_number`]), `(ts, value)` of each reading that carries
    /// it, given the bucket's timestamps; `None` for booleans and strings.
    pub fn numbers<'c>(&'c self, ts: &'c [i64]) -> Option<impl Iterator<Item = (i64, f64)> + 'c> {
        let at = ts.iter().enumerate().filter(|&(i, _)| self.has(i)).map(|(_, &t)| t);
        match &self.values {
            ColumnValues::F64(v) => Some(Numbers::F64(at.zip(v.iter().copied()))),
            ColumnValues::I64(v) => Some(Numbers::I64(at.zip(v.iter().map(|&i| i as f64)))),
            ColumnValues::Bool(_) | ColumnValues::Str(_) => None,
        }
    }
}

/// The iterator of [`Column::numbers`], over floats or integers.
enum Numbers<F, I> {
    F64(F),
    I64(I),
}

impl<F: Iterator<Item = (i64, f64)>, I: Iterator<Item = (i64, f64)>> Iterator for Numbers<F, I> {
    type Item = (i64, f64);

    #[inline]
    fn next(&mut self) -> Option<(i64, f64)> {
        match self {
            Numbers::F64(it) => it.next(),
            Numbers::I64(it) => it.next(),
        }
    }
}

/// Checks that no reading holds one name under two types (v2), as [`decode`] does reading by
/// reading.
fn one_field_a_reading(parsed: &Parsed<'_>) -> Result<()> {
    for (i, f) in parsed.fields.iter().enumerate() {
        if !f.repeats_name {
            continue;
        }
        for g in parsed.fields[..i].iter().rev().take_while(|g| g.name == f.name) {
            let both = match (f.bitmap, g.bitmap) {
                (Some(a), Some(b)) => a.iter().zip(b).any(|(a, b)| a & b != 0),
                // Either is in every reading, the other in at least one.
                _ => true,
            };
            if both {
                return Err(Error::Invalid("a reading holds a field twice"));
            }
        }
    }
    Ok(())
}

/// Decodes a bucket of any version ever written into columns. Accepts exactly the buckets
/// [`decode`] accepts, with the same values.
pub fn decode_columns(bytes: &[u8]) -> Result<Columns<'_>> {
    let mut ts = Vec::new();
    let (n, mut parsed) = parse(bytes, |t| ts.push(t))?;
    one_field_a_reading(&parsed)?;
    let mut fields = Vec::with_capacity(parsed.fields.len());
    for f in &mut parsed.fields {
        let present = f.present;
        let values = match &mut f.values {
            ValueDecoder::Gorilla(d) => {
                ColumnValues::F64((0..present).map(|_| d.next().map(f64::from_bits)).collect::<Result<_>>()?)
            }
            ValueDecoder::Decimal(d) => ColumnValues::F64((0..present).map(|_| d.next()).collect::<Result<_>>()?),
            ValueDecoder::Int(d) => ColumnValues::I64((0..present).map(|_| d.next()).collect::<Result<_>>()?),
            ValueDecoder::Bool(d) => ColumnValues::Bool((0..present).map(|_| d.next()).collect::<Result<_>>()?),
            ValueDecoder::Str(d) => ColumnValues::Str((0..present).map(|_| d.next()).collect::<Result<_>>()?),
        };
        fields.push(Column { name: f.name, presence: f.bitmap, values });
    }
    parsed.finish()?;
    debug_assert_eq!(ts.len(), n);
    Ok(Columns { ts, fields, schema_version: schema_version(bytes)? })
}

/// The values of one field, in reading order.
enum ValueDecoder<'a> {
    Gorilla(GorillaDecoder<'a>),
    Decimal(DecimalDecoder<'a>),
    Int(IntDecoder<'a>),
    Bool(BoolDecoder<'a>),
    Str(StrDecoder<'a>),
}

impl ValueDecoder<'_> {
    #[inline]
    fn next(&mut self) -> Result<Value> {
        match self {
            ValueDecoder::Gorilla(d) => d.next().map(|bits| Value::F64(f64::from_bits(bits))),
            ValueDecoder::Decimal(d) => d.next().map(Value::F64),
            ValueDecoder::Int(d) => d.next().map(Value::I64),
            ValueDecoder::Bool(d) => d.next().map(Value::Bool),
            ValueDecoder::Str(d) => d.next().map(Value::Str),
        }
    }

    /// Checks that the stream holds nothing after the values read.
    fn finish(&self) -> Result<()> {
        match self {
            ValueDecoder::Gorilla(d) => d.bits.finish(),
            ValueDecoder::Decimal(d) => d.finish(),
            ValueDecoder::Int(d) => d.finish(),
            ValueDecoder::Bool(d) => d.finish(),
            ValueDecoder::Str(d) => d.bits.finish(),
        }
    }
}

/// An integer value stream.
struct IntDecoder<'a> {
    prev: i64,
    at_first: bool,
    deltas: Deltas<'a>,
}

impl<'a> IntDecoder<'a> {
    /// Reads the stream's head; `present` is the number of values it holds, at least one.
    fn new(stream: &'a [u8], packed: bool, present: usize) -> Result<Self> {
        let mut input = Input::new(stream);
        let first = unzigzag(input.varint("value stream")?);
        let deltas = Deltas::read(input, packed && present > 1, 64, "packed deltas wider than 64 bits")?;
        Ok(IntDecoder { prev: first, at_first: true, deltas })
    }

    #[inline]
    fn next(&mut self) -> Result<i64> {
        if self.at_first {
            self.at_first = false;
        } else {
            let delta = match &mut self.deltas {
                Deltas::Varint(input) => unzigzag(input.varint("value stream")?),
                Deltas::Packed { width: 0, min, .. } => *min,
                Deltas::Packed { bits, min, width } => min.wrapping_add(bits.read_wide(*width)? as i64),
            };
            self.prev = self.prev.wrapping_add(delta);
        }
        Ok(self.prev)
    }

    /// [`next`](Self::next) `count` times, appending to `out`, one loop per kind of delta.
    fn push_ints(&mut self, count: usize, out: &mut Vec<i64>) -> Result<()> {
        out.reserve(count);
        let mut left = count;
        if left > 0 && self.at_first {
            self.at_first = false;
            out.push(self.prev);
            left -= 1;
        }
        let mut prev = self.prev;
        match &mut self.deltas {
            Deltas::Varint(input) => {
                for _ in 0..left {
                    prev = prev.wrapping_add(unzigzag(input.varint("value stream")?));
                    out.push(prev);
                }
            }
            Deltas::Packed { width: 0, min, .. } => {
                for _ in 0..left {
                    prev = prev.wrapping_add(*min);
                    out.push(prev);
                }
            }
            Deltas::Packed { bits, min, width } => {
                for _ in 0..left {
                    prev = prev.wrapping_add(min.wrapping_add(bits.read_wide(*width)? as i64));
                    out.push(prev);
                }
            }
        }
        self.prev = prev;
        Ok(())
    }

    fn finish(&self) -> Result<()> {
        self.deltas.finish()
    }
}

/// A boolean value stream.
struct BoolDecoder<'a> {
    bytes: &'a [u8],
    next: usize,
}

impl<'a> BoolDecoder<'a> {
    /// `present` is the number of values the stream holds.
    fn new(bytes: &'a [u8], present: usize) -> Result<Self> {
        if bytes.len() != present.div_ceil(8) {
            return Err(Error::Invalid("boolean stream length is not one bit a value"));
        }
        if !present.is_multiple_of(8) && bytes.last().is_some_and(|last| last >> (present % 8) != 0) {
            return Err(Error::Invalid("boolean stream padding is not zero"));
        }
        Ok(BoolDecoder { bytes, next: 0 })
    }

    #[inline]
    fn next(&mut self) -> Result<bool> {
        let byte = self.bytes.get(self.next / 8).ok_or(Error::Truncated { what: "value stream" })?;
        let bit = byte >> (self.next % 8) & 1 == 1;
        self.next += 1;
        Ok(bit)
    }

    fn finish(&self) -> Result<()> {
        if self.next.div_ceil(8) == self.bytes.len() {
            Ok(())
        } else {
            Err(Error::Invalid("value stream longer than its values"))
        }
    }
}

/// A string value stream: the dictionary, then packed indexes into it.
struct StrDecoder<'a> {
    dict: Vec<Arc<str>>,
    width: u32,
    /// Entries of `dict` used so far: entries appear in order of first use.
    used: usize,
    bits: BitReader<'a>,
}

impl<'a> StrDecoder<'a> {
    fn new(stream: &'a [u8]) -> Result<Self> {
        let mut input = Input::new(stream);
        let d = input.count("string dictionary")?;
        if d == 0 {
            return Err(Error::Invalid("empty string dictionary"));
        }
        let mut dict: Vec<Arc<str>> = Vec::with_capacity(d);
        for _ in 0..d {
            let len = input.count("string dictionary")?;
            let s = std::str::from_utf8(input.take(len, "string dictionary")?).map_err(|_| Error::InvalidUtf8)?;
            if dict.iter().any(|e| &**e == s) {
                return Err(Error::Invalid("string dictionary holds a string twice"));
            }
            dict.push(s.into());
        }
        Ok(StrDecoder { width: index_width(d), dict, used: 0, bits: BitReader::new(input.rest) })
    }

    #[inline]
    fn next(&mut self) -> Result<Arc<str>> {
        let i = if self.width == 0 { 0 } else { self.bits.read_wide(self.width)? as usize };
        match i.cmp(&self.used) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal if i < self.dict.len() => self.used += 1,
            _ => return Err(Error::Invalid("string index out of dictionary order")),
        }
        Ok(Arc::clone(&self.dict[i]))
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

impl<'a> Deltas<'a> {
    /// The deltas after a stream's first integer: with `packed`, a minimum, a width (at most
    /// `max_width`, else `too_wide`) and the bit-packed offsets; otherwise varints (also a
    /// packed stream of one value, which ends after the first integer).
    fn read(mut input: Input<'a>, packed: bool, max_width: u8, too_wide: &'static str) -> Result<Self> {
        if !packed {
            return Ok(Deltas::Varint(input));
        }
        let min = unzigzag(input.varint("value stream")?);
        let width = input.u8("value stream")?;
        if width > max_width {
            return Err(Error::Invalid(too_wide));
        }
        Ok(Deltas::Packed { bits: BitReader::new(input.rest), min, width: u32::from(width) })
    }

    /// Checks that nothing follows the deltas read.
    fn finish(&self) -> Result<()> {
        let done = match self {
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

impl<'a> DecimalDecoder<'a> {
    /// Reads the stream's head; `present` is the number of values it holds, at least one.
    fn new(stream: &'a [u8], packed: bool, present: usize) -> Result<Self> {
        let mut input = Input::new(stream);
        let k = input.u8("value stream")?;
        if k > MAX_SCALE {
            return Err(Error::Invalid("decimal scale above 15"));
        }
        let first = decimal_in_range(Some(unzigzag(input.varint("value stream")?)))?;
        let deltas = Deltas::read(input, packed && present > 1, MAX_WIDTH, "packed deltas wider than 56 bits")?;
        Ok(DecimalDecoder { k, prev: first, at_first: true, deltas })
    }

    #[inline]
    fn next(&mut self) -> Result<f64> {
        self.next_int().map(|i| from_decimal(i, self.k))
    }

    /// The next value as its decimal integer at scale `k` (within `±2^53`).
    #[inline]
    fn next_int(&mut self) -> Result<i64> {
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
        Ok(self.prev)
    }

    /// [`next_int`](Self::next_int) `count` times, appending to `out` (one loop per kind of
    /// delta instead of a match per value); answers the largest magnitude appended (0 for none).
    fn push_ints(&mut self, count: usize, out: &mut Vec<i64>) -> Result<u64> {
        out.reserve(count);
        let mut left = count;
        let mut max = 0;
        if left > 0 && self.at_first {
            self.at_first = false;
            out.push(self.prev);
            max = self.prev.unsigned_abs();
            left -= 1;
        }
        let mut prev = self.prev;
        let mut step = |delta: Option<i64>| -> Result<i64> {
            prev = decimal_in_range(delta.and_then(|d| prev.checked_add(d)))?;
            max = max.max(prev.unsigned_abs());
            Ok(prev)
        };
        match &mut self.deltas {
            Deltas::Varint(input) => {
                for _ in 0..left {
                    out.push(step(Some(unzigzag(input.varint("value stream")?)))?);
                }
            }
            Deltas::Packed { width: 0, min, .. } => {
                for _ in 0..left {
                    out.push(step(Some(*min))?);
                }
            }
            Deltas::Packed { bits, min, width } => {
                for _ in 0..left {
                    out.push(step(min.checked_add(bits.read(*width)? as i64))?);
                }
            }
        }
        self.prev = prev;
        Ok(max)
    }

    fn finish(&self) -> Result<()> {
        self.deltas.finish()
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

    /// A value as plain comparable data, floats by bits (NaN == NaN, 0.0 != -0.0).
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum PlainValue {
        F64(u64),
        I64(i64),
        Bool(bool),
        Str(String),
    }

    /// A reading as plain comparable data.
    type Plain = (i64, Vec<(String, PlainValue)>);

    fn plain_value(v: &Value) -> PlainValue {
        match v {
            Value::F64(v) => PlainValue::F64(v.to_bits()),
            // Encoded as the `f64` it is.
            Value::UntypedInt(v) => PlainValue::F64((*v as f64).to_bits()),
            Value::I64(v) => PlainValue::I64(*v),
            Value::Bool(v) => PlainValue::Bool(*v),
            Value::Str(v) => PlainValue::Str(v.to_string()),
        }
    }

    fn plain(readings: &[Reading]) -> Vec<Plain> {
        readings
            .iter()
            .map(|r| {
                let fields = r.fields.iter().map(|(n, v)| (n.to_string(), plain_value(v)));
                (r.ts, fields.collect())
            })
            .collect()
    }

    /// The v2 bytes of a bucket of floats given as v1 bytes: the same after the header.
    fn as_v2(v1: &[u8], schema_version: u8) -> Vec<u8> {
        assert!(schema_version < 0x80 && v1[0] == FORMAT_V1);
        [&[FORMAT_V2, schema_version][..], &v1[1..]].concat()
    }

    /// Columns as readings of plain comparable data.
    fn plain_columns(columns: &Columns<'_>) -> Vec<Plain> {
        let mut next = vec![0usize; columns.fields.len()];
        columns
            .ts
            .iter()
            .enumerate()
            .map(|(i, &ts)| {
                let mut fields = Vec::new();
                for (f, next) in columns.fields.iter().zip(&mut next).filter(|(f, _)| f.has(i)) {
                    let value = match &f.values {
                        ColumnValues::F64(v) => PlainValue::F64(v[*next].to_bits()),
                        ColumnValues::I64(v) => PlainValue::I64(v[*next]),
                        ColumnValues::Bool(v) => PlainValue::Bool(v[*next]),
                        ColumnValues::Str(v) => PlainValue::Str(v[*next].to_string()),
                    };
                    *next += 1;
                    fields.push((f.name.to_string(), value));
                }
                (ts, fields)
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

    /// Decimal integers near `2^49` to `2^53` divided by a power of ten — so that rescaling them
    /// by that power lands on either side of the largest a merge rescales ([`KNOWN_DECIMAL`])
    /// and of where rescaling stops being exact — or any.
    fn rescale_bound_int() -> impl Strategy<Value = i64> {
        prop_oneof![
            (prop_oneof![0..=3u8, 0..=MAX_SCALE], 49..=53u32, -3i64..=3, any::<bool>()).prop_map(|(d, m, off, neg)| {
                let i = (1i64 << m) / POW10_INT[usize::from(d)] as i64 + off;
                if neg {
                    -i
                } else {
                    i
                }
            }),
            decimal_int(),
        ]
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
        let n = header(&mut input).expect("a valid header").n;
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

    /// Values of every type: one name draws several types across readings.
    fn typed_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => value().prop_map(Value::F64),
            1 => any::<i64>().prop_map(Value::I64),
            1 => (-3i64..3).prop_map(Value::I64),
            1 => any::<bool>().prop_map(Value::Bool),
            1 => prop::sample::select(vec!["", "on", "off", "ünï"]).prop_map(Value::from),
            1 => "[a-z]{0,3}".prop_map(|s| Value::from(s.as_str())),
        ]
    }

    fn fields() -> impl Strategy<Value = Vec<(FieldName, Value)>> {
        prop::collection::vec((0..NAMES.len(), typed_value()), 0..=NAMES.len())
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
                    prop::collection::vec(value().prop_map(Value::F64), len),
                    prop::collection::vec((-1000i64..1000).prop_map(Value::I64), len),
                    prop::collection::vec(any::<i64>().prop_map(Value::I64), len),
                    prop::collection::vec(any::<bool>().prop_map(Value::Bool), len),
                    prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]).prop_map(Value::from), len),
                    // Decimal fields, of the same scale or not.
                    prop::collection::vec(decimal().prop_map(Value::F64), len),
                    (0..=MAX_SCALE).prop_flat_map(move |k| {
                        prop::collection::vec(
                            (-300i64..300).prop_map(move |i| Value::F64(decimal_at(20_000 + i, k))),
                            len,
                        )
                    }),
                ];
                (Just(times), Just(names), values).prop_map(|(times, names, values)| {
                    let names: Vec<FieldName> = names.into_iter().map(Into::into).collect();
                    times
                        .into_iter()
                        .enumerate()
                        .map(|(i, ts)| {
                            let row = &values[i * names.len()..(i + 1) * names.len()];
                            let fs: Vec<(FieldName, Value)> = names.iter().cloned().zip(row.iter().cloned()).collect();
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

    /// `readings` encoded at schema version `version`, or in the first format when `v1` and
    /// they hold floats alone (v1 knows floats only, and no schema version: the byte after the
    /// first).
    fn encoded_in(readings: &[Reading], version: u32, v1: bool) -> Vec<u8> {
        let mut out = Vec::new();
        encode_versioned(readings, version, &mut out);
        let floats = readings.iter().all(|r| r.fields.iter().all(|(_, v)| matches!(v, Value::F64(_))));
        if v1 && floats {
            out.remove(1);
            out[0] = FORMAT_V1;
        }
        out
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
        fn latest_of_one_reading_inputs_is_the_decoding_merge_byte_for_byte(
            inputs in prop::collection::vec((overlapping_bucket(), 0u32..3, any::<bool>()), 1..5),
        ) {
            // One-reading inputs (as `latest` holds), of assorted schema versions, some in the
            // first format: the answer without decoding is the one by decoding.
            let operands: Vec<Vec<u8>> =
                inputs.iter().map(|(b, version, v1)| encoded_in(&b[..1], *version, *v1)).collect();
            let slices: Vec<&[u8]> = operands.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(merge_latest(slices.iter().copied()), merge_latest_decoding(&slices));
        }

        #[test]
        fn newest_of_buckets_is_the_newest_of_their_merge(
            inputs in prop::collection::vec((overlapping_bucket(), 0u32..3, any::<bool>()), 1..5),
        ) {
            // Overlapping inputs of assorted schema versions, some in the first format.
            let operands: Vec<Vec<u8>> =
                inputs.iter().map(|(b, version, v1)| encoded_in(b, *version, *v1)).collect();
            let slices: Vec<&[u8]> = operands.iter().map(Vec::as_slice).collect();
            let newest_only = newest_of_buckets(slices.iter().copied()).expect("valid operands");
            let merged = merge(slices.iter().copied()).expect("valid operands");
            prop_assert_eq!(&newest_only, &newest(&merged).expect("a merged bucket"));
            prop_assert_eq!(&newest_only, &merge_latest_decoding(&slices).expect("valid operands"));
        }

        #[test]
        fn newest_is_the_latest_operand_of_one_bucket(readings in bucket(), version in 0u32..4) {
            let mut bytes = Vec::new();
            encode_versioned(&readings, version, &mut bytes);
            prop_assert_eq!(newest(&bytes), merge_latest([&bytes[..]]));
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
                prop_assert!(newest_reading(&bytes[..len]).is_err());
                prop_assert!(newest_of_buckets([&bytes[..], &bytes[..len]]).is_err());
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
            let mut out = Vec::new();
            let result = decode(&bytes, &mut out);
            let columns = decode_columns(&bytes);
            prop_assert_eq!(columns.is_ok(), result.is_ok());
            prop_assert_eq!(newest_reading(&bytes).is_ok(), result.is_ok());
            if let Ok(columns) = columns {
                prop_assert_eq!(plain_columns(&columns), plain(&out));
            }
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
            let columns = decode_columns(&bytes);
            // Both reject the same buckets (not always for the same first reason: they read
            // the value streams in another order).
            prop_assert_eq!(columns.is_ok(), decode(&bytes, &mut out).is_ok());
            prop_assert_eq!(newest_reading(&bytes).is_ok(), columns.is_ok());
            if let Ok(columns) = columns {
                prop_assert_eq!(plain_columns(&columns), plain(&out));
                prop_assert_eq!(
                    newest_reading(&bytes).map(|(r, _)| plain(&[r])),
                    Ok(plain(&out[out.len() - 1..])),
                );
                // Whatever decodes re-encodes to a valid bucket.
                let again = encoded(&out);
                prop_assert_eq!(plain(&decoded(&again)), plain(&out));
            }
        }

        #[test]
        fn columns_hold_what_readings_hold(readings in bucket(), version in 0u32..3) {
            let mut bytes = Vec::new();
            encode_versioned(&readings, version, &mut bytes);
            let columns = decode_columns(&bytes).expect("a valid bucket");
            prop_assert_eq!(plain_columns(&columns), plain(&readings));
            prop_assert_eq!(columns.schema_version, version);
        }

        #[test]
        fn merging_buckets_in_time_order_by_columns_writes_what_merging_readings_writes(
            buckets in prop::collection::vec(overlapping_bucket(), 1..5),
            versions in prop::collection::vec(0u32..3, 5),
        ) {
            // Each bucket moved past the one before: inputs in time order.
            let operands: Vec<Vec<u8>> = buckets
                .iter()
                .zip(&versions)
                .enumerate()
                .map(|(k, (b, &version))| {
                    let moved: Vec<Reading> =
                        b.iter().map(|r| Reading { ts: r.ts + k as i64 * 100_000, ..r.clone() }).collect();
                    let mut out = Vec::new();
                    encode_versioned(&moved, version, &mut out);
                    out
                })
                .collect();
            let inputs: Vec<&[u8]> = operands.iter().map(Vec::as_slice).collect();
            let by_columns = merge_in_order(&inputs).expect("valid operands").expect("inputs in time order");
            prop_assert_eq!(&by_columns, &merge_readings(&inputs).expect("valid operands"));
            prop_assert_eq!(schema_version(&by_columns).expect("valid"), *versions[..inputs.len()].iter().max().expect("one"));
        }

        #[test]
        fn merging_decimals_of_several_scales_by_columns_writes_what_merging_readings_writes(
            buckets in prop::collection::vec(
                (
                    prop_oneof![0..=3u8, 0..=MAX_SCALE],
                    prop::collection::vec((rescale_bound_int(), prop::option::weighted(0.05, non_decimal())), 1..20),
                ),
                1..5,
            ),
        ) {
            // Each input a decimal field at a scale of its own, with values at the bound a
            // rescale may reach, some inputs stored as Gorilla (a value that is no decimal).
            let operands: Vec<Vec<u8>> = buckets
                .iter()
                .enumerate()
                .map(|(b, (k, values))| {
                    let readings: Vec<Reading> = values
                        .iter()
                        .enumerate()
                        .map(|(j, &(i, odd))| {
                            let v = odd.unwrap_or_else(|| decimal_at(i, *k));
                            Reading::new(b as i64 * 1_000 + j as i64, vec![("v".into(), v)])
                        })
                        .collect();
                    encoded(&readings)
                })
                .collect();
            let inputs: Vec<&[u8]> = operands.iter().map(Vec::as_slice).collect();
            let by_columns = merge_in_order(&inputs).expect("valid operands").expect("inputs in time order");
            prop_assert_eq!(&by_columns, &merge_readings(&inputs).expect("valid operands"));
        }

        #[test]
        fn inputs_that_overlap_in_time_are_merged_by_readings(
            buckets in prop::collection::vec(overlapping_bucket(), 2..5),
        ) {
            let operands: Vec<Vec<u8>> = buckets.iter().map(|b| encoded(b)).collect();
            let inputs: Vec<&[u8]> = operands.iter().map(Vec::as_slice).collect();
            let in_order = buckets.windows(2).all(|w| w[0].last().map(|r| r.ts) < w[1].first().map(|r| r.ts));
            prop_assert_eq!(merge_in_order(&inputs).expect("valid operands").is_some(), in_order);
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
        assert_eq!((1 + plan.ints.varint_len, 1 + plan.ints.packed_len), (6 + 97 + 2 * 5, 6 + 5 + 1 + 99 * 4));
        let bytes = encoded(&series(&values));
        assert_eq!(field_encodings(&bytes), [ENCODING_GORILLA]);
        assert_eq!(plain(&decoded(&bytes)), plain(&series(&values)));
    }

    #[test]
    fn merged_decimals_change_scale_only_where_the_encoder_finds_them() {
        // 45035996273704.7 is 450359962737047 at scale 1; at scale 2 its product with 100
        // rounds to another integer than 4503599627370470, so no scale from 2 holds it.
        let big = 45_035_996_273_704.7;
        assert_eq!(to_decimal(big, 1), Some(450_359_962_737_047));
        assert_eq!((2..=MAX_SCALE).find_map(|k| to_decimal(big, k)), None);
        // Twenty decimals of scale 1 up to it, then one of scale 2: merged, they are no
        // decimals, and Gorilla stores them. From 1,234.5 they rescale to scale 2 exactly as the
        // encoder finds them, and stay decimals.
        for (last, stays_decimal) in [(450_359_962_737_047, false), (12_345, true)] {
            let mut values: Vec<f64> = (last - 19..=last).map(|i| from_decimal(i, 1)).collect();
            values.push(0.25);
            let readings = series(&values);
            let (old, new) = (encoded(&readings[..20]), encoded(&readings[20..]));
            let decimal = |bytes: &[u8]| field_encodings(bytes) != [ENCODING_GORILLA];
            assert!(decimal(&old));
            let inputs = [&old[..], &new[..]];
            let merged = merge_in_order(&inputs).expect("valid").expect("in time order");
            assert_eq!(merged, merge_readings(&inputs).expect("valid"));
            assert_eq!(merged, encoded(&readings));
            assert_eq!(decimal(&merged), stays_decimal);
            assert_eq!(plain(&decoded(&merged)), plain(&readings));
        }
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
        assert_eq!(encoded(&readings), as_v2(&expected, 0));
        assert_eq!(plain(&decoded(&expected)), plain(&readings));
    }

    #[test]
    fn varint_len_is_the_length_put_varint_writes() {
        let mut lens = Vec::new();
        for bits in 0..64 {
            for v in [(1u64 << bits) - 1, 1 << bits, (1 << bits) + 1] {
                let mut out = Vec::new();
                put_varint(&mut out, v);
                assert_eq!(varint_len(v), out.len(), "{v}");
                lens.push(out.len());
            }
        }
        assert_eq!(varint_len(u64::MAX), 10);
        // One byte up to 2^7 - 1, two up to 2^14 - 1, …: the lengths of 0, 2^7 - 1 and 2^7.
        assert_eq!(lens[..3], [1, 1, 1]);
        assert_eq!(lens[21..24], [1, 2, 2]);
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
        assert_eq!(encoded(&series(&values)), as_v2(&expected, 0));
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
        assert_eq!(encoded(&readings), as_v2(&expected, 0));
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
        assert_eq!(count(&[3, 1, 0]), Err(Error::UnknownVersion(3)));
        assert_eq!(count(&[2, 1, 0]), Err(Error::Empty));
        assert_eq!((count(&[2, 0x87, 0x01, 1, 0]), schema_version(&[2, 0x87, 0x01, 1, 0])), (Ok(1), Ok(135)));
        assert_eq!(schema_version(&[1, 1, 0]), Ok(0));
        assert_eq!(count(&[2]), Err(Error::Truncated { what: "schema version" }));
        assert_eq!(count(&[2, 0x80, 0x80, 0x80, 0x80, 0x10, 1]), Err(Error::Invalid("schema version above 2^32 - 1")));
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
        // Second timestamp delta 0: ts twice (after version, schema version, count, first ts).
        let mut same_ts = valid.clone();
        same_ts[4] = 0;
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
        let before = vec![Reading::new(1, Vec::<(FieldName, Value)>::new())];
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
    fn realistic_readings() -> Vec<Reading> {
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
        (0..360)
            .map(|i| {
                for v in &mut values {
                    // Steps of -0.02..=0.02, kept at 2 decimals.
                    let step = (next() % 5) as f64 - 2.0;
                    *v = ((*v * 100.0).round() + step) / 100.0;
                }
                let fields: Vec<(FieldName, f64)> = names.iter().cloned().zip(values).collect();
                Reading::new(1_700_000_000_000 + i * 10_000, fields)
            })
            .collect()
    }

    #[test]
    fn realistic_bucket_size() {
        let readings = realistic_readings();
        let bytes = encoded(&readings);
        assert_eq!(plain(&decoded(&bytes)), plain(&readings));
        // Steps of -2..=2 hundredths pack into 3 bits a value.
        assert_eq!(field_encodings(&bytes), [ENCODING_DECIMAL_PACKED; 7]);
        let per_value = bytes.len() as f64 / (360.0 * 7.0);
        // Measured: 1,426 bytes, 0.566 bytes per value, of which timestamps take 360 bytes
        // (Gorilla alone took 13,161 bytes, 5.22 bytes per value).
        assert!(per_value < 0.6, "{per_value} bytes per value");
    }

    /// Integers, booleans and strings, byte for byte as the module documentation says.
    #[test]
    fn hand_computed_typed_streams() {
        let readings: Vec<Reading> = [(3i64, true, "ann"), (3, false, "ann"), (5, true, "bo"), (4, true, "ann")]
            .iter()
            .zip(0..)
            .map(|(&(status, on, driver), i)| {
                let fields: Vec<(FieldName, Value)> = vec![
                    ("driver".into(), Value::from(driver)),
                    ("on".into(), Value::Bool(on)),
                    ("status".into(), Value::I64(status)),
                ];
                Reading::new(i * 10, fields)
            })
            .collect();
        #[rustfmt::skip]
        let expected = [
            0x02, 0x07, 0x04,       // version 2, schema version 7, 4 readings
            0x00, 0x14, 0x00, 0x00, // ts 0, delta 10, deltas of delta 0
            0x03,                   // 3 fields
            0x06, b'd', b'r', b'i', b'v', b'e', b'r', 0x00,
            0x06, 0x09,             // strings, 9 bytes:
            0x02,                   // 2 distinct
            0x03, b'a', b'n', b'n', 0x02, b'b', b'o',
            0b0010_0000,            // indexes 0 0 1 0, one bit each, padded
            0x02, b'o', b'n', 0x00,
            0x05, 0x01,             // booleans, 1 byte:
            0b0000_1101,            // true false true true, LSB first
            0x06, b's', b't', b'a', b't', b'u', b's', 0x00,
            // 3 3 5 4: deltas 0 2 -1 as varints, 4 bytes; packed above -1 in 2 bits: 4 bytes
            // (first, minimum, width, one byte of bits); varints win the tie.
            0x03, 0x04,             // integers, varint deltas, 4 bytes:
            0x06, 0x00, 0x04, 0x01, // 3: zigzag 6; 0; 2: zigzag 4; -1: zigzag 1
        ];
        let mut bytes = Vec::new();
        encode_versioned(&readings, 7, &mut bytes);
        assert_eq!(bytes, expected);
        assert_eq!(decoded(&expected), readings);
        assert_eq!(schema_version(&expected), Ok(7));
    }

    #[test]
    fn integer_streams_take_any_i64_and_pack_steady_ones() {
        for ints in [
            vec![i64::MIN, i64::MAX, 0, -1, i64::MIN],
            vec![7; 50],
            (0..100).map(|i| 1_000_000 + i * 3).collect(),
            (0..100).map(|i| if i % 10 == 0 { 200 } else { 0 }).collect::<Vec<i64>>(),
        ] {
            let readings: Vec<Reading> =
                ints.iter().zip(0..).map(|(&v, ts)| Reading::new(ts, vec![("v".into(), v)])).collect();
            let bytes = encoded(&readings);
            assert_eq!(decoded(&bytes), readings);
            let plan = IntPlan::new(&ints);
            let expected = if plan.packed() { ENCODING_INT_PACKED } else { ENCODING_INT_VARINT };
            assert_eq!(field_encodings(&bytes), [expected]);
        }
        // A constant counter step: width 0, the stream is first value, minimum and width alone.
        let steady: Vec<i64> = (0..100).map(|i| 1_000_000 + i * 3).collect();
        let plan = IntPlan::new(&steady);
        assert_eq!((plan.width, plan.packed_len), (0, 3 + 1 + 1));
    }

    /// A field stored as a float before the table had a schema and as an integer since: one
    /// name under two types, each reading with its own.
    #[test]
    fn one_name_under_two_types() {
        let old =
            encoded(&[Reading::new(0, vec![("status".into(), 3.0)]), Reading::new(20, vec![("status".into(), 4.0)])]);
        let mut new = Vec::new();
        encode_versioned(&[Reading::new(10, vec![("status".into(), 5i64)])], 2, &mut new);
        let merged = merge([old.as_slice(), new.as_slice()]).expect("valid operands");
        assert_eq!(
            decoded(&merged),
            [
                Reading::new(0, vec![("status".into(), 3.0)]),
                Reading::new(10, vec![("status".into(), 5i64)]),
                Reading::new(20, vec![("status".into(), 4.0)]),
            ]
        );
        assert_eq!(schema_version(&merged), Ok(2));
        assert_eq!(field_encodings(&merged), [ENCODING_DECIMAL_VARINT, ENCODING_INT_VARINT]);
        // Both bitmaps claiming reading 0 is a reading with the field twice.
        #[rustfmt::skip]
        let twice = [
            2, 0, 1, 0, 2,
            1, b'a', PRESENT_IN_ALL, ENCODING_INT_VARINT, 1, 0,
            1, b'a', PRESENT_IN_ALL, ENCODING_BOOL_BITS, 1, 1,
        ];
        assert_eq!(decode(&twice, &mut Vec::new()), Err(Error::Invalid("a reading holds a field twice")));
        // The same (name, type) twice, or types descending.
        #[rustfmt::skip]
        let descending = [
            2, 0, 1, 0, 2,
            1, b'a', PRESENT_IN_ALL, ENCODING_BOOL_BITS, 1, 1,
            1, b'a', PRESENT_IN_ALL, ENCODING_INT_VARINT, 1, 0,
        ];
        assert_eq!(decode(&descending, &mut Vec::new()), Err(Error::Invalid("field names not strictly ascending")));
    }

    #[test]
    fn rejects_typed_streams_the_encoder_never_writes() {
        // One reading at ts 0 (two for `two`) with field "a" of `encoding` and `stream`.
        let bucket = |two: bool, encoding: u8, stream: &[u8]| {
            let mut bytes = if two { vec![FORMAT_V2, 0, 2, 0, 2] } else { vec![FORMAT_V2, 0, 1, 0] };
            bytes.extend([1, 1, b'a', PRESENT_IN_ALL, encoding, stream.len() as u8]);
            bytes.extend_from_slice(stream);
            bytes
        };
        let err = |bytes: &[u8]| decode(bytes, &mut Vec::new()).expect_err("an invalid bucket");
        let longer = Error::Invalid("value stream longer than its values");
        assert_eq!(
            err(&bucket(false, ENCODING_BOOL_BITS, &[0b10])),
            Error::Invalid("boolean stream padding is not zero")
        );
        assert_eq!(
            err(&bucket(false, ENCODING_BOOL_BITS, &[1, 0])),
            Error::Invalid("boolean stream length is not one bit a value")
        );
        assert_eq!(err(&bucket(false, ENCODING_INT_VARINT, &[2, 2])), longer);
        assert_eq!(
            err(&bucket(true, ENCODING_INT_PACKED, &[0, 0, 65])),
            Error::Invalid("packed deltas wider than 64 bits")
        );
        assert_eq!(err(&bucket(false, ENCODING_STR_DICT, &[0])), Error::Invalid("empty string dictionary"));
        assert_eq!(err(&bucket(false, ENCODING_STR_DICT, &[1, 1, 0xff])), Error::InvalidUtf8);
        assert_eq!(
            err(&bucket(false, ENCODING_STR_DICT, &[2, 1, b'x', 1, b'x', 0])),
            Error::Invalid("string dictionary holds a string twice")
        );
        // Index 1 before index 0 was used; an entry no value uses.
        assert_eq!(
            err(&bucket(false, ENCODING_STR_DICT, &[2, 1, b'x', 1, b'y', 0x80])),
            Error::Invalid("string index out of dictionary order")
        );
        assert_eq!(
            err(&bucket(false, ENCODING_STR_DICT, &[2, 1, b'x', 1, b'y', 0])),
            Error::Invalid("string dictionary holds a string no value uses")
        );
        // v1 knows floats only.
        let mut v1 = bucket(false, ENCODING_INT_VARINT, &[2]);
        v1.remove(1);
        v1[0] = FORMAT_V1;
        assert_eq!(err(&v1), Error::Invalid("unknown value encoding"));
        // What decodes: a one-entry dictionary takes no index bits.
        let ok = bucket(true, ENCODING_STR_DICT, &[1, 2, b'h', b'i']);
        assert_eq!(
            decoded(&ok),
            [Reading::new(0, vec![("a".into(), "hi")]), Reading::new(1, vec![("a".into(), "hi")])]
        );
    }

    /// Bytes the v1 codec wrote (before typed fields existed) decode to exactly what was
    /// written, and a merge rewrites them as v2 with the same readings.
    #[test]
    fn v1_bytes_written_before_typed_fields_still_decode() {
        let fixtures = include_str!("testdata/v1_buckets.txt");
        let bucket = |name: &str| -> Vec<u8> {
            let line = fixtures.lines().find(|l| l.starts_with(&format!("{name} "))).expect("fixture line");
            let hex = &line[name.len() + 1..];
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect()
        };
        let sparse = vec![
            Reading::new(-5_000, vec![("status".into(), 3.0), ("temp".into(), -0.0)]),
            Reading::new(0, vec![("temp".into(), 21.25)]),
            Reading::new(7, vec![("engine_on".into(), 1.0), ("status".into(), 4.0), ("temp".into(), f64::NAN)]),
        ];
        for (name, readings) in [("realistic", realistic_readings()), ("sparse", sparse)] {
            let v1 = bucket(name);
            assert_eq!(v1[0], FORMAT_V1, "{name}");
            assert_eq!(count(&v1), Ok(readings.len()));
            assert_eq!(schema_version(&v1), Ok(0));
            assert_eq!(plain(&decoded(&v1)), plain(&readings), "{name}");
            let merged = merge([v1.as_slice()]).expect("a valid bucket");
            assert_eq!(merged, as_v2(&v1, 0), "{name}: v2 of floats is v1 with a schema version");
            assert_eq!(plain(&decoded(&merged)), plain(&readings), "{name}");
        }
    }
}
