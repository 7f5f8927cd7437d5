//! Approximate aggregates, mergeable like the exact ones (day = merge of hours, group = merge
//! of devices), with a documented error:
//!
//! - [`Quantiles`]: a DDSketch (`sketches-ddsketch`) with relative accuracy
//!   [`QUANTILE_RELATIVE_ACCURACY`]: the estimate `y` of the q-quantile `x` (the value of rank
//!   `⌊q·(n−1)⌋` among the sorted values) satisfies `|y − x| ≤ 0.01·|x|`, for any data and any
//!   merge order. Values of magnitude `1e-9` or below count as zero; non-finite values are not
//!   sketched (the exact aggregates still count them). The bins cover every finite magnitude
//!   from `1e-9` up, so no span of values, a glitch reading far above the rest say, costs the
//!   others their accuracy. Sketches stored before had 2,048 bins a sign (about 17 decades,
//!   past which the lowest collapsed into one): they read as they were, under today's limit.
//! - [`Distinct`]: a HyperLogLog (`cardinality-estimator`, precision 14, 2^14 six-bit
//!   registers; up to 128 items it keeps their hashes in a list, and counts exactly but for a
//!   collision of hashes): the estimate of the number of distinct items has a standard error of
//!   1.04 / √16384 ≈ 0.81 % (QA18 saw 150 counted as 151 and 500 as 492, QA30 129 as 127 and
//!   2,000 as 1,976; over 100 sets each of 129 to 11,000 items the root mean square error was
//!   0.5–0.8 % with no bias, no better by linear counting over the registers).
//!
//! Both persist through `postcard` (their serde layouts): [`Quantiles::to_bytes`],
//! [`Distinct::to_bytes`] and the matching `from_bytes`. A crate upgrade that changes those
//! layouts is a format change of the roll-up records. Roll-up records store them in a
//! *compact* form ([`Quantiles::write_compact`], [`Distinct::write_compact`] and the matching
//! `from_compact`): the postcard bytes with each run of zero bytes written as `0x00, n` (`n`
//! zeros, 1 to 255), and a quantile sketch without its configuration, which is the same in
//! every sketch. A sketch's bins are varints in a dense array grown 128 at a time, mostly zero
//! bytes: an hour of a field's readings takes about 100 bytes instead of 210.
//!
//! Records from version 6 on store a field's sketch *packed* ([`Quantiles::write_packed`],
//! [`Quantiles::from_packed`]), beside the field's exact min and max:
//!
//! ```text
//! u8 flags: 1 positive store · 2 negative store · 4 zeros · 8 min and max
//!           · 16 positive store's extras · 32 negative store's extras (0x80 alone: the
//!           compact form follows instead)
//! · [varint count of zeros] · [f64 min · f64 max, big-endian, when not the field's]
//! · per store written (positive, then negative; a store not written is empty):
//!     varint bins · zigzag varint key of the first bin · varint n non-empty bins
//!     · n × (varint gap << 1 | 1 for a count of 1 · [varint count − 2 otherwise])
//!     · [u8 extras: 1 collapsed · 2 keys · 4 count · 8 bin limit, then each written one:
//!        zigzag min key · zigzag max key · varint count · varint bin limit]
//! ```
//!
//! A gap is a bin's distance from the one after the last (from bin 0 for the first). Without
//! its extras byte a store is *usual*: not collapsed, its count the sum of its bins, its keys
//! those of its lowest and highest non-empty bins, the configuration's bin limit. The sketch's
//! sum is not kept: it reads back as 0, and nothing reads it (quantiles come from the bins,
//! the sum from the exact aggregates). The sketch reads back to the same bins, keys, counts,
//! min and max, so it answers and merges as it did. An hour of 60 readings of the TSBS
//! `readings` table's seven fields: a record of 1,005 bytes with its sketches compact, 661
//! with them packed (585 with version 6's times as distances too).
//!
//! ```
//! use rollup::approx::{Distinct, Quantiles};
//! let mut q = Quantiles::default();
//! for v in 1..=1000 {
//!     q.add(f64::from(v));
//! }
//! let p99 = q.quantile(0.99).expect("not empty");
//! assert!((p99 - 990.0).abs() <= 0.01 * 990.0);
//! let mut d = Distinct::default();
//! d.insert(7);
//! d.insert(7);
//! d.insert(8);
//! assert_eq!(d.estimate(), 2);
//! ```

use std::cell::RefCell;
use std::sync::OnceLock;

use cardinality_estimator::CardinalityEstimator;
use sketches_ddsketch::{Config, DDSketch};

use crate::varint;

/// Relative accuracy of [`Quantiles`].
pub const QUANTILE_RELATIVE_ACCURACY: f64 = 0.01;

/// Most bins a sketch keeps per sign: as many as the keys of every finite magnitude from
/// [`QUANTILE_MIN_VALUE`] to `f64::MAX` (−1,037 to 35,487 in 2 % steps), rounded up to the
/// crate's chunks of 128, so a store never collapses its lowest bins (what it does past its
/// limit, losing their accuracy: with the crate's 2,048 bins, about 17 decades, one glitch
/// reading of 1e25 in an hour of values 1 to 10 made its p50 about 3.3e7). A store holds bins
/// from its lowest key to its highest only, so the limit costs nothing to a sketch of a usual
/// span; one from 1e-9 to 1e308 takes 286 KiB while it is merged or read (packed, it keeps its
/// non-empty bins only).
const QUANTILE_MAX_BINS: u32 = 36_608;

/// The bin limit of sketches written before [`QUANTILE_MAX_BINS`] covered every magnitude:
/// their configuration says it, and their stores are read with the new one
/// ([`Quantiles::from_postcard`]).
const QUANTILE_MAX_BINS_BEFORE: u32 = 2048;

/// Magnitudes below this count as zero.
const QUANTILE_MIN_VALUE: f64 = 1e-9;

fn quantile_config() -> Config {
    Config::new(QUANTILE_RELATIVE_ACCURACY, QUANTILE_MAX_BINS, QUANTILE_MIN_VALUE)
}

/// The configuration of sketches written before: [`QUANTILE_MAX_BINS_BEFORE`].
fn quantile_config_before() -> Config {
    Config::new(QUANTILE_RELATIVE_ACCURACY, QUANTILE_MAX_BINS_BEFORE, QUANTILE_MIN_VALUE)
}

/// The postcard bytes of [`quantile_config`]: the first bytes of every sketch's.
fn config_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| postcard::to_allocvec(&quantile_config()).unwrap_or_default())
}

/// Appends `bytes` to `out` with each run of zero bytes written as `0x00, n` (`n` zeros, 1 to
/// 255; a longer run takes several pairs): what [`ZeroPacker`] writes.
#[cfg(test)]
fn pack_zeros(bytes: &[u8], out: &mut Vec<u8>) {
    use postcard::ser_flavors::Flavor;
    let mut packer = ZeroPacker::new(out, &[]);
    for &b in bytes {
        let _ = packer.try_push(b);
    }
    let _ = packer.finalize();
}

/// A postcard output that appends the bytes it is given to `out` with each run of zero bytes
/// written as `0x00, n` (`n` zeros, 1 to 255; a longer run takes several pairs), as they come,
/// past a `prefix` it leaves out: a sketch written into a `Vec` first (each of its dense
/// bins' varints a `memcpy` there), then packed, was a fifth of a large roll-up's time.
struct ZeroPacker<'a> {
    out: &'a mut Vec<u8>,
    /// The bytes still to leave out (what they must be, checked in debug builds).
    prefix: &'static [u8],
    /// Zeros met and not written yet: 0 to 255.
    zeros: u8,
}

impl<'a> ZeroPacker<'a> {
    fn new(out: &'a mut Vec<u8>, prefix: &'static [u8]) -> ZeroPacker<'a> {
        ZeroPacker { out, prefix, zeros: 0 }
    }
}

impl postcard::ser_flavors::Flavor for ZeroPacker<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        if let Some((&first, rest)) = self.prefix.split_first() {
            debug_assert_eq!(byte, first, "the sketch's configuration");
            self.prefix = rest;
        } else if byte == 0 {
            if self.zeros == u8::MAX {
                self.out.extend_from_slice(&[0, u8::MAX]);
                self.zeros = 0;
            }
            self.zeros += 1;
        } else {
            if self.zeros > 0 {
                self.out.extend_from_slice(&[0, self.zeros]);
                self.zeros = 0;
            }
            self.out.push(byte);
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        if self.zeros > 0 {
            self.out.extend_from_slice(&[0, self.zeros]);
        }
        Ok(())
    }
}

/// Inverse of [`pack_zeros`]: appends the bytes `packed` stands for to `out`.
fn unpack_zeros(packed: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut rest = packed;
    while let Some(at) = rest.iter().position(|&b| b == 0) {
        out.extend_from_slice(&rest[..at]);
        match rest.get(at + 1) {
            Some(&n) if n > 0 => out.resize(out.len() + usize::from(n), 0),
            _ => return Err("a run of zeros without its length".to_string()),
        }
        rest = &rest[at + 2..];
    }
    out.extend_from_slice(rest);
    Ok(())
}

/// A mergeable quantile sketch of one field's values (see the module docs for its error).
///
/// A wide sketch may be kept packed while nothing changes it ([`Quantiles::pack_if_wide`]):
/// the crate's stores are dense, so one spanning 1e-9 to 1e308 holds 286 KiB, where its packed
/// bytes are its non-empty bins. It is read back when it is added to, merged into or asked
/// (and a merge from it reads it back for that merge only).
#[derive(Clone)]
pub struct Quantiles(Repr);

#[derive(Clone)]
enum Repr {
    /// The crate's sketch.
    Dense(DDSketch),
    /// A wide sketch at rest.
    Packed(Box<PackedSketch>),
}

/// What [`Quantiles::write_packed`] wrote of a sketch given `min` and `max`, with its count.
#[derive(Clone)]
struct PackedSketch {
    bytes: Box<[u8]>,
    min: f64,
    max: f64,
    count: u64,
}

impl PackedSketch {
    /// The sketch its bytes were written from. They read back (the packed form's tests; the
    /// bytes are the process's own, never stored ones): were they not, the sketch would read
    /// back empty, failing debug builds.
    fn unpack(&self) -> DDSketch {
        match Quantiles::from_packed(&self.bytes, self.min, self.max) {
            Ok(q) => q.into_dense(),
            Err(e) => {
                debug_assert!(false, "a sketch packed at rest does not read back: {e}");
                DDSketch::new(quantile_config())
            }
        }
    }
}

/// A sketch wider than this many bins (both stores' together, 8 bytes each) is packed at rest
/// by [`Quantiles::pack_if_wide`]: at most 8 KiB of dense bins (values over about 9 decades);
/// usual ones (a few hundred bins) stay as they are.
const WIDE_BINS: usize = 1024;

impl Default for Quantiles {
    fn default() -> Self {
        Quantiles(Repr::Dense(DDSketch::new(quantile_config())))
    }
}

impl std::fmt::Debug for Quantiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quantiles")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

/// Equal when they hold the same number of values and agree on every percentile from 0 to
/// 100 (what two sketches of one multiset always do, whatever the order of adds and merges;
/// the sketch's internal layout may differ).
impl PartialEq for Quantiles {
    fn eq(&self, other: &Quantiles) -> bool {
        self.count() == other.count()
            && (0..=100).all(|p| {
                let q = f64::from(p) / 100.0;
                self.quantile(q).map(f64::to_bits) == other.quantile(q).map(f64::to_bits)
            })
    }
}

impl Quantiles {
    /// Adds one value; non-finite values are left out.
    pub fn add(&mut self, v: f64) {
        if v.is_finite() {
            self.dense_mut().add(v);
        }
    }

    /// Folds in another sketch.
    pub fn merge(&mut self, other: &Quantiles) {
        // Into an empty sketch, the crate's merge copies the other's stores: a packed one is
        // copied as it is.
        if self.count() == 0 {
            if let Repr::Packed(_) = other.0 {
                *self = other.clone();
                return;
            }
        }
        let other = other.dense();
        // Every sketch here is built with `quantile_config`, and `from_bytes` rejects any other
        // configuration, so the configurations always match.
        if let Err(e) = self.dense_mut().merge(&other) {
            debug_assert!(false, "sketch configurations differ: {e}");
        }
    }

    /// Number of values sketched.
    pub fn count(&self) -> u64 {
        match &self.0 {
            Repr::Dense(s) => s.count() as u64,
            Repr::Packed(p) => p.count,
        }
    }

    /// The estimate of the `q`-quantile (`0 ≤ q ≤ 1`); `None` when the sketch is empty or `q`
    /// is out of range.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.dense().quantile(q).ok().flatten()
    }

    /// The persisted bytes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain numbers and vectors into a Vec cannot fail.
        postcard::to_allocvec(&*self.dense()).unwrap_or_default()
    }

    /// Packs the sketch, if it is wider than 1,024 bins (8 KiB of dense bins, values over
    /// about 9 decades), until it is next changed or asked (the type's docs), given its
    /// field's exact `min` and `max` (as [`Quantiles::write_packed`] is, which then only copies
    /// its bytes).
    pub fn pack_if_wide(&mut self, min: f64, max: f64) {
        let Repr::Dense(sketch) = &self.0 else {
            return;
        };
        if sketch.length() <= WIDE_BINS {
            return;
        }
        let mut bytes = Vec::new();
        self.write_packed(min, max, &mut bytes);
        let count = self.count();
        self.0 = Repr::Packed(Box::new(PackedSketch { bytes: bytes.into_boxed_slice(), min, max, count }));
    }

    /// Whether the sketch is packed at rest ([`Quantiles::pack_if_wide`]).
    pub fn is_packed(&self) -> bool {
        matches!(self.0, Repr::Packed(_))
    }

    /// The crate's sketch, read back from its packed bytes if packed.
    fn into_dense(self) -> DDSketch {
        match self.0 {
            Repr::Dense(s) => s,
            Repr::Packed(p) => p.unpack(),
        }
    }

    /// The crate's sketch: read back from its packed bytes, if packed.
    fn dense(&self) -> std::borrow::Cow<'_, DDSketch> {
        match &self.0 {
            Repr::Dense(s) => std::borrow::Cow::Borrowed(s),
            Repr::Packed(p) => std::borrow::Cow::Owned(p.unpack()),
        }
    }

    /// The crate's sketch, to be changed: read back for good, if packed.
    fn dense_mut(&mut self) -> &mut DDSketch {
        if let Repr::Packed(p) = &self.0 {
            self.0 = Repr::Dense(p.unpack());
        }
        match &mut self.0 {
            Repr::Dense(s) => s,
            // Made dense just above.
            Repr::Packed(_) => unreachable!("a packed sketch was just read back"),
        }
    }

    /// Inverse of [`Quantiles::to_bytes`]; rejects sketches of another configuration than ours
    /// or the one before (2,048 bins a sign; see the module docs).
    pub fn from_bytes(bytes: &[u8]) -> Result<Quantiles, String> {
        Quantiles::from_postcard(bytes)
    }

    /// A sketch of its postcard bytes, of our configuration or the one before, its stores' bin
    /// limits raised to ours: a store is the same store under a higher limit (the crate grows
    /// bins to the limit and past it collapses the lowest, so a store that never reached the
    /// old limit is as it would be under the new one, and a collapsed one keeps its lowest bin
    /// holding all below). Without it, a merge would carry the old limit on: the crate's merge
    /// into an empty sketch copies the other's stores whole.
    fn from_postcard(bytes: &[u8]) -> Result<Quantiles, String> {
        let e = |e: postcard::Error| format!("quantile sketch: {e}");
        let mut parts: SketchParts = postcard::from_bytes(bytes).map_err(e)?;
        if parts.config != quantile_config() && parts.config != quantile_config_before() {
            return Err("quantile sketch of another configuration".to_string());
        }
        parts.config = quantile_config();
        for store in [&mut parts.store, &mut parts.negative_store] {
            store.bin_limit = store.bin_limit.max(QUANTILE_MAX_BINS as usize);
        }
        let bytes = postcard::to_allocvec(&parts).map_err(e)?;
        postcard::from_bytes(&bytes).map(|s| Quantiles(Repr::Dense(s))).map_err(e)
    }

    /// Appends the compact persisted bytes (module docs) to `out`.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        // The sketch's first field is its configuration, always `quantile_config`. Writing
        // plain numbers and vectors into a Vec cannot fail.
        let _ = postcard::serialize_with_flavor(&*self.dense(), ZeroPacker::new(out, config_bytes()));
    }

    /// Inverse of [`Quantiles::write_compact`].
    pub fn from_compact(packed: &[u8]) -> Result<Quantiles, String> {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(config_bytes());
        unpack_zeros(packed, &mut bytes).map_err(|e| format!("quantile sketch: {e}"))?;
        // Compact sketches were written before the bin limit was raised: their stores say
        // the old one.
        Quantiles::from_postcard(&bytes)
    }
}

/// A sketch's parts in the order of its serde layout (`sketches-ddsketch` 0.4): what the
/// packed form assumes, catching them from the sketch's `Serialize` ([`Catcher`]) and writing
/// the postcard bytes a sketch reads back from ([`Quantiles::from_packed`]); the tests check
/// both against serde's (a crate upgrade that changes the layout fails them); sketches written
/// before are read through it ([`Quantiles::from_postcard`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct SketchParts {
    config: Config,
    store: StoreParts,
    negative_store: StoreParts,
    min: f64,
    max: f64,
    sum: f64,
    zero_count: u64,
}

/// One sign's store in the crate's serde layout (see [`SketchParts`]): the crate's dense store,
/// bin `i` counting the values of key `offset + i`.
#[cfg_attr(test, derive(Debug))]
#[derive(PartialEq, Default, serde::Serialize, serde::Deserialize)]
struct StoreParts {
    bins: Vec<u64>,
    count: u64,
    min_key: i32,
    max_key: i32,
    offset: i32,
    bin_limit: usize,
    is_collapsed: bool,
}

/// What a store's bins make of its other parts.
struct BinSummary {
    /// Non-empty bins.
    filled: u64,
    /// Their counts' sum; `None` past `u64`.
    sum: Option<u64>,
    /// The keys of the lowest and highest non-empty bins.
    extent: Option<(i64, i64)>,
}

impl StoreParts {
    /// A store nothing was added to (the crate's `Store::new` of our configuration).
    fn fresh() -> StoreParts {
        StoreParts {
            bins: Vec::new(),
            count: 0,
            min_key: i32::MAX,
            max_key: i32::MIN,
            offset: 0,
            bin_limit: QUANTILE_MAX_BINS as usize,
            is_collapsed: false,
        }
    }
}

/// One sign's store as [`Catcher`] takes it: [`StoreParts`] with its bins as their number and
/// the non-empty ones. A sketch's store is dense, its bins from its lowest key to its highest:
/// one spanning 1e-8 to 1e308 has 36,000 bins, a few of them filled, and keeping each empty
/// one was half the work of packing it.
#[cfg_attr(test, derive(Debug, PartialEq))]
#[derive(Default)]
struct CaughtStore {
    /// Its bins, empty ones too.
    len: u64,
    /// Its non-empty bins, as (index, count), in index order.
    filled: Vec<(u64, u64)>,
    /// Its other parts (`bins` left empty).
    parts: StoreParts,
}

impl CaughtStore {
    /// The store of `parts` (what the tests compare the catch with).
    #[cfg(test)]
    fn of(parts: &StoreParts) -> CaughtStore {
        let StoreParts { bins, count, min_key, max_key, offset, bin_limit, is_collapsed } = parts;
        CaughtStore {
            len: bins.len() as u64,
            filled: bins.iter().enumerate().filter(|&(_, &c)| c > 0).map(|(i, &c)| (i as u64, c)).collect(),
            parts: StoreParts {
                bins: Vec::new(),
                count: *count,
                min_key: *min_key,
                max_key: *max_key,
                offset: *offset,
                bin_limit: *bin_limit,
                is_collapsed: *is_collapsed,
            },
        }
    }

    /// Whether nothing was added to it ([`StoreParts::fresh`]).
    fn is_fresh(&self) -> bool {
        self.len == 0 && self.parts == StoreParts::fresh()
    }

    /// Its non-empty bins, as (index, count).
    fn filled(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.filled.iter().copied()
    }

    fn summary(&self) -> BinSummary {
        let mut s = BinSummary { filled: 0, sum: Some(0), extent: None };
        for (i, c) in self.filled() {
            s.filled += 1;
            s.sum = s.sum.and_then(|a| a.checked_add(c));
            let key = i64::from(self.parts.offset) + i as i64;
            s.extent = Some((s.extent.map_or(key, |e| e.0), key));
        }
        s
    }

    /// Whether its other parts are what its bins make of them (as every store has them that
    /// never collapsed its lowest bins): its count their sum, its keys their extent, the
    /// configuration's bin limit.
    fn usual(&self, s: &BinSummary) -> bool {
        !self.parts.is_collapsed
            && self.parts.bin_limit == QUANTILE_MAX_BINS as usize
            && s.sum == Some(self.parts.count)
            && s.extent == Some((i64::from(self.parts.min_key), i64::from(self.parts.max_key)))
    }

    /// Appends the packed store: its number of bins, the key of the first, then each
    /// non-empty bin as a varint of its distance from the one before (from index 0 for the
    /// first), shifted left by one with the low bit set for a count of 1; any other count
    /// follows, less 2. Then, when not `usual` ([`CaughtStore::usual`], which the caller has
    /// flagged already), its extras byte and what that says.
    fn put_packed(&self, s: &BinSummary, usual: bool, out: &mut Vec<u8>) {
        varint::put(out, self.len);
        varint::put_signed(out, i64::from(self.parts.offset));
        varint::put(out, s.filled);
        let mut next = 0u64;
        for (i, c) in self.filled() {
            let gap = i - next;
            next = i + 1;
            if c == 1 {
                varint::put(out, gap << 1 | 1);
            } else {
                varint::put(out, gap << 1);
                varint::put(out, c - 2);
            }
        }
        if usual {
            return;
        }
        let keys = s.extent != Some((i64::from(self.parts.min_key), i64::from(self.parts.max_key)));
        let count = s.sum != Some(self.parts.count);
        let limit = self.parts.bin_limit != QUANTILE_MAX_BINS as usize;
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        out.push(
            flag(self.parts.is_collapsed, EXTRAS_COLLAPSED)
                | flag(keys, EXTRAS_KEYS)
                | flag(count, EXTRAS_COUNT)
                | flag(limit, EXTRAS_BIN_LIMIT),
        );
        if keys {
            varint::put_signed(out, i64::from(self.parts.min_key));
            varint::put_signed(out, i64::from(self.parts.max_key));
        }
        if count {
            varint::put(out, self.parts.count);
        }
        if limit {
            varint::put(out, self.parts.bin_limit as u64);
        }
    }
}

/// Packed form flags: the positive store written (else empty), the negative one, the count of
/// zeros (else 0), min and max (else the exact ones), each store's extras byte (else usual).
const PACKED_POSITIVE: u8 = 1;
const PACKED_NEGATIVE: u8 = 2;
const PACKED_ZEROS: u8 = 4;
const PACKED_MIN_MAX: u8 = 8;
const PACKED_POSITIVE_EXTRAS: u8 = 16;
const PACKED_NEGATIVE_EXTRAS: u8 = 32;
/// Instead of flags: the compact form follows (for a sketch whose bytes could not be read).
const PACKED_COMPACT: u8 = 0x80;
/// A store's extras byte: collapsed; its min and max keys written; its count; its bin limit.
const EXTRAS_COLLAPSED: u8 = 1;
const EXTRAS_KEYS: u8 = 2;
const EXTRAS_COUNT: u8 = 4;
const EXTRAS_BIN_LIMIT: u8 = 8;

/// The most bins a packed store may say it has (the crate grows a store to its bin limit,
/// [`QUANTILE_MAX_BINS`]): what a damaged length could make a reader allocate.
const PACKED_MAX_BINS: u64 = 1 << 16;

/// Reads varints, bytes and floats off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated".to_string());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn varint(&mut self) -> Result<u64, String> {
        let (n, len) = varint::read(self.0)?;
        self.0 = &self.0[len..];
        Ok(n)
    }

    fn i32(&mut self) -> Result<i32, String> {
        i32::try_from(varint::unzigzag(self.varint()?)).map_err(|_| "a key past i32".to_string())
    }

    /// A float as the packed form writes it (big-endian, as the records do).
    fn f64_be(&mut self) -> Result<f64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(f64::from_be_bytes(b))
    }
}

/// What a sketch's `Serialize` hands over, caught by field name ([`Catcher`]): its stores, its
/// own min and max and its count of zeros (its configuration, always ours, and its sum are
/// passed over).
#[derive(Default)]
struct Caught {
    /// The positive store, then the negative one.
    stores: [CaughtStore; 2],
    min: f64,
    max: f64,
    zero_count: u64,
    /// A bit for each of the fields above and the stores' seven caught: all of them, or the
    /// sketch's layout is not the one [`SketchParts`] has.
    seen: u32,
}

/// The bits of [`Caught::seen`] when every field was caught.
const CAUGHT_ALL: u32 = (1 << 17) - 1;

/// A serde serializer that catches a sketch's parts by field name into [`Caught`], its bins as
/// they are (postcard would write each as a varint, to be read back here).
#[derive(Default)]
struct Catcher {
    caught: Caught,
    /// The store being serialized: 0 positive, 1 negative.
    store: Option<usize>,
    /// The field being serialized.
    key: &'static str,
    /// The store whose bins are being serialized (each bin a `serialize_u64`: checked first).
    bins: Option<usize>,
}

/// A sketch serialized otherwise than [`Catcher`] expects.
#[derive(Debug)]
struct CatchError;

impl std::fmt::Display for CatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a sketch of another layout")
    }
}

impl std::error::Error for CatchError {}

impl serde::ser::Error for CatchError {
    fn custom<T: std::fmt::Display>(_: T) -> CatchError {
        CatchError
    }
}

impl Catcher {
    /// Marks field `bit` (of the current store, if any) caught.
    fn saw(&mut self, bit: u32) {
        let at = self.store.map_or(0, |s| 3 + 7 * s as u32);
        self.caught.seen |= 1 << (at + bit);
    }

    fn current(&mut self) -> Result<&mut CaughtStore, CatchError> {
        let s = self.store.ok_or(CatchError)?;
        Ok(&mut self.caught.stores[s])
    }
}

/// The serializer methods a sketch never calls: each refuses.
macro_rules! refuse {
    ($($name:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(fn $name(self, $(_: $arg),*) -> Result<$ok, CatchError> {
            Err(CatchError)
        })*
    };
}

impl serde::Serializer for &mut Catcher {
    type Ok = ();
    type Error = CatchError;
    type SerializeSeq = Self;
    type SerializeTuple = serde::ser::Impossible<(), CatchError>;
    type SerializeTupleStruct = serde::ser::Impossible<(), CatchError>;
    type SerializeTupleVariant = serde::ser::Impossible<(), CatchError>;
    type SerializeMap = serde::ser::Impossible<(), CatchError>;
    type SerializeStruct = Self;
    type SerializeStructVariant = serde::ser::Impossible<(), CatchError>;

    fn serialize_bool(self, v: bool) -> Result<(), CatchError> {
        match self.key {
            "is_collapsed" => self.current()?.parts.is_collapsed = v,
            _ => return Err(CatchError),
        }
        self.saw(6);
        Ok(())
    }

    fn serialize_i32(self, v: i32) -> Result<(), CatchError> {
        let bit = match self.key {
            "min_key" => 2,
            "max_key" => 3,
            "offset" => 4,
            _ => return Err(CatchError),
        };
        let s = &mut self.current()?.parts;
        *[&mut s.min_key, &mut s.max_key, &mut s.offset][bit - 2] = v;
        self.saw(bit as u32);
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result<(), CatchError> {
        if let Some(s) = self.bins {
            let store = &mut self.caught.stores[s];
            if v > 0 {
                store.filled.push((store.len, v));
            }
            store.len += 1;
            return Ok(());
        }
        match (self.store, self.key) {
            (Some(_), "count") => {
                self.current()?.parts.count = v;
                self.saw(1);
            }
            (Some(_), "bin_limit") => {
                self.current()?.parts.bin_limit = usize::try_from(v).map_err(|_| CatchError)?;
                self.saw(5);
            }
            (None, "zero_count") => {
                self.caught.zero_count = v;
                self.saw(2);
            }
            _ => return Err(CatchError),
        }
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), CatchError> {
        match (self.store, self.key) {
            (None, "min") => self.caught.min = v,
            (None, "max") => self.caught.max = v,
            _ => return Err(CatchError),
        }
        self.saw(u32::from(self.key == "max"));
        Ok(())
    }

    /// The bins: only the non-empty ones are kept, so no room is made for all of them.
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, CatchError> {
        if self.key != "bins" {
            return Err(CatchError);
        }
        let s = self.current()?;
        s.filled.clear();
        s.len = 0;
        self.saw(0);
        self.bins = self.store;
        Ok(self)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, CatchError> {
        Ok(self)
    }

    fn serialize_some<T: ?Sized + serde::Serialize>(self, _: &T) -> Result<(), CatchError> {
        Err(CatchError)
    }

    fn serialize_newtype_struct<T: ?Sized + serde::Serialize>(self, _: &'static str, _: &T) -> Result<(), CatchError> {
        Err(CatchError)
    }

    fn serialize_newtype_variant<T: ?Sized + serde::Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), CatchError> {
        Err(CatchError)
    }

    refuse! {
        serialize_i8(i8) -> ();
        serialize_i16(i16) -> ();
        serialize_i64(i64) -> ();
        serialize_u8(u8) -> ();
        serialize_u16(u16) -> ();
        serialize_u32(u32) -> ();
        serialize_f32(f32) -> ();
        serialize_char(char) -> ();
        serialize_str(&str) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_struct(&'static str) -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }
}

impl serde::ser::SerializeSeq for &mut Catcher {
    type Ok = ();
    type Error = CatchError;

    fn serialize_element<T: ?Sized + serde::Serialize>(&mut self, value: &T) -> Result<(), CatchError> {
        value.serialize(&mut **self)
    }

    fn end(self) -> Result<(), CatchError> {
        self.bins = None;
        Ok(())
    }
}

impl serde::ser::SerializeStruct for &mut Catcher {
    type Ok = ();
    type Error = CatchError;

    fn serialize_field<T: ?Sized + serde::Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), CatchError> {
        match (self.store, key) {
            // Always `quantile_config` (every sketch here is built with it); never read.
            (None, "config" | "sum") => Ok(()),
            (None, "store" | "negative_store") => {
                self.store = Some(usize::from(key == "negative_store"));
                let caught = value.serialize(&mut **self);
                self.store = None;
                caught
            }
            _ => {
                self.key = key;
                value.serialize(&mut **self)
            }
        }
    }

    fn end(self) -> Result<(), CatchError> {
        Ok(())
    }
}

/// [`Quantiles::write_packed`] of a sketch's caught parts.
fn pack(c: &Caught, min: f64, max: f64, out: &mut Vec<u8>) {
    let [pos, neg] = &c.stores;
    let (ps, ns) = (pos.summary(), neg.summary());
    let (has_pos, has_neg) = (!pos.is_fresh(), !neg.is_fresh());
    let (pos_usual, neg_usual) = (pos.usual(&ps), neg.usual(&ns));
    let same = c.min.to_bits() == min.to_bits() && c.max.to_bits() == max.to_bits();
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    out.push(
        flag(has_pos, PACKED_POSITIVE)
            | flag(has_neg, PACKED_NEGATIVE)
            | flag(c.zero_count > 0, PACKED_ZEROS)
            | flag(!same, PACKED_MIN_MAX)
            | flag(has_pos && !pos_usual, PACKED_POSITIVE_EXTRAS)
            | flag(has_neg && !neg_usual, PACKED_NEGATIVE_EXTRAS),
    );
    if c.zero_count > 0 {
        varint::put(out, c.zero_count);
    }
    if !same {
        out.extend_from_slice(&c.min.to_be_bytes());
        out.extend_from_slice(&c.max.to_be_bytes());
    }
    if has_pos {
        pos.put_packed(&ps, pos_usual, out);
    }
    if has_neg {
        neg.put_packed(&ns, neg_usual, out);
    }
}

/// Appends the postcard bytes of a store's parts after its bins.
fn put_store_tail(out: &mut Vec<u8>, count: u64, keys: (i32, i32), offset: i32, bin_limit: u64, collapsed: bool) {
    varint::put(out, count);
    varint::put_signed(out, i64::from(keys.0));
    varint::put_signed(out, i64::from(keys.1));
    varint::put_signed(out, i64::from(offset));
    varint::put(out, bin_limit);
    out.push(u8::from(collapsed));
}

/// Reads a packed store ([`CaughtStore::put_packed`]; its extras byte when `extras`) and appends
/// the store's postcard bytes.
fn unpack_store(r: &mut Reader<'_>, extras: bool, out: &mut Vec<u8>) -> Result<(), String> {
    let len = r.varint()?;
    if len > PACKED_MAX_BINS {
        return Err(format!("{len} bins"));
    }
    let offset = r.i32()?;
    let filled = r.varint()?;
    if filled > len {
        return Err(format!("{filled} non-empty bins of {len}"));
    }
    varint::put(out, len);
    let (mut next, mut sum, mut extent) = (0u64, 0u64, None);
    for _ in 0..filled {
        let v = r.varint()?;
        let c = if v & 1 == 1 { 1 } else { r.varint()?.checked_add(2).ok_or("a bin's count past u64")? };
        let i = next.checked_add(v >> 1).filter(|&i| i < len).ok_or("a bin past the store's end")?;
        out.resize(out.len() + (i - next) as usize, 0);
        varint::put(out, c);
        sum = sum.checked_add(c).ok_or("a store's count past u64")?;
        extent = Some((extent.map_or(i, |e: (u64, u64)| e.0), i));
        next = i + 1;
    }
    out.resize(out.len() + (len - next) as usize, 0);
    let key = |i: u64| i32::try_from(i64::from(offset) + i as i64).map_err(|_| "a key past i32".to_string());
    let e = if extras { r.byte()? } else { 0 };
    let keys = match (e & EXTRAS_KEYS, extent) {
        (0, Some((lo, hi))) => (key(lo)?, key(hi)?),
        (0, None) => return Err("a store written without a value".to_string()),
        _ => (r.i32()?, r.i32()?),
    };
    let count = if e & EXTRAS_COUNT != 0 { r.varint()? } else { sum };
    let bin_limit = if e & EXTRAS_BIN_LIMIT != 0 { r.varint()? } else { u64::from(QUANTILE_MAX_BINS) };
    if bin_limit < len || bin_limit > PACKED_MAX_BINS {
        return Err(format!("{len} bins past a limit of {bin_limit}"));
    }
    // The crate indexes its bins by `key - offset` for keys from `min_key` to `max_key`.
    let end = i64::from(offset) + len as i64;
    if count > 0 && !(offset <= keys.0 && keys.0 <= keys.1 && i64::from(keys.1) < end) {
        return Err(format!("keys {}..={} outside bins {offset}..{end}", keys.0, keys.1));
    }
    put_store_tail(out, count, keys, offset, bin_limit, e & EXTRAS_COLLAPSED != 0);
    Ok(())
}

impl Quantiles {
    /// The sketch's parts by serde through postcard (what the tests check [`Catcher`]
    /// against).
    #[cfg(test)]
    fn parts(&self) -> Option<SketchParts> {
        postcard::from_bytes(&postcard::to_allocvec(&*self.dense()).ok()?).ok()
    }

    /// Appends the packed persisted bytes (module docs) of a sketch of the values whose exact
    /// min and max are `min` and `max` (a record's field's): the sketch's own min and max are
    /// left out when they are those bits, and its sum always (nothing reads it).
    pub fn write_packed(&self, min: f64, max: f64, out: &mut Vec<u8>) {
        let sketch = match &self.0 {
            Repr::Dense(s) => s,
            // Packed at rest given these: its bytes as they are.
            Repr::Packed(p) if (p.min.to_bits(), p.max.to_bits()) == (min.to_bits(), max.to_bits()) => {
                out.extend_from_slice(&p.bytes);
                return;
            }
            Repr::Packed(p) => return Quantiles(Repr::Dense(p.unpack())).write_packed(min, max, out),
        };
        thread_local! {
            /// A pass writes many sketches: their bins are caught in the same vectors.
            static CATCHER: RefCell<Catcher> = RefCell::new(Catcher::default());
        }
        CATCHER.with_borrow_mut(|catcher| {
            catcher.caught.seen = 0;
            (catcher.store, catcher.key, catcher.bins) = (None, "", None);
            match serde::Serialize::serialize(sketch, &mut *catcher) {
                Ok(()) if catcher.caught.seen == CAUGHT_ALL => pack(&catcher.caught, min, max, out),
                _ => {
                    // Not reached while the layout tests pass; the compact form keeps the
                    // sketch whole.
                    out.push(PACKED_COMPACT);
                    self.write_compact(out);
                }
            }
        });
    }

    /// Inverse of [`Quantiles::write_packed`], given the same `min` and `max`.
    pub fn from_packed(packed: &[u8], min: f64, max: f64) -> Result<Quantiles, String> {
        let e = |e: String| format!("quantile sketch: {e}");
        let mut r = Reader(packed);
        let flags = r.byte().map_err(e)?;
        if flags == PACKED_COMPACT {
            return Quantiles::from_compact(r.0);
        }
        if flags >= PACKED_NEGATIVE_EXTRAS << 1 {
            return Err(e(format!("unknown flags {flags:#04x}")));
        }
        let zero_count = if flags & PACKED_ZEROS != 0 { r.varint().map_err(e)? } else { 0 };
        let (min, max) = match flags & PACKED_MIN_MAX {
            0 => (min, max),
            _ => (r.f64_be().map_err(e)?, r.f64_be().map_err(e)?),
        };
        // The sketch's postcard bytes, written as they are read.
        let mut out = Vec::with_capacity(config_bytes().len() + 300);
        out.extend_from_slice(config_bytes());
        for (on, extras) in [(PACKED_POSITIVE, PACKED_POSITIVE_EXTRAS), (PACKED_NEGATIVE, PACKED_NEGATIVE_EXTRAS)] {
            if flags & on == 0 {
                let s = StoreParts::fresh();
                varint::put(&mut out, 0);
                put_store_tail(&mut out, s.count, (s.min_key, s.max_key), s.offset, s.bin_limit as u64, s.is_collapsed);
            } else {
                unpack_store(&mut r, flags & extras != 0, &mut out).map_err(e)?;
            }
        }
        if !r.0.is_empty() {
            return Err(e(format!("{} bytes after the sketch", r.0.len())));
        }
        for x in [min, max, 0.0] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        varint::put(&mut out, zero_count);
        postcard::from_bytes(&out).map(|s| Quantiles(Repr::Dense(s))).map_err(|x| e(x.to_string()))
    }
}

/// The HyperLogLog behind [`Distinct`]: u64 items, WyHash, precision 14, 6-bit registers.
type Hll = CardinalityEstimator<u64, wyhash::WyHash, 14, 6>;

/// A mergeable estimate of the number of distinct u64 items (device ids) seen; see the module
/// docs for its error. Inserting an item twice changes nothing.
#[derive(Clone, Default)]
pub struct Distinct(Hll);

/// Equal when they estimate the same count, which two estimates of one set always do: below
/// 129 items the estimator keeps the items' hashes (in arrival order, so its layout differs
/// with the order), above it the registers hold each hash's maximum.
impl PartialEq for Distinct {
    fn eq(&self, other: &Distinct) -> bool {
        self.estimate() == other.estimate()
    }
}

impl std::fmt::Debug for Distinct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Distinct").field(&self.estimate()).finish()
    }
}

impl Distinct {
    /// Adds one item.
    pub fn insert(&mut self, item: u64) {
        self.0.insert(&item);
    }

    /// Folds in another estimate.
    pub fn merge(&mut self, other: &Distinct) {
        self.0.merge(&other.0);
    }

    /// The estimated number of distinct items.
    pub fn estimate(&self) -> u64 {
        self.0.estimate() as u64
    }

    /// The persisted bytes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.0).unwrap_or_default()
    }

    /// Inverse of [`Distinct::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Distinct, String> {
        postcard::from_bytes(bytes).map(Distinct).map_err(|e| format!("distinct-count sketch: {e}"))
    }

    /// Appends the compact persisted bytes (module docs) to `out`.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        let _ = postcard::serialize_with_flavor(&self.0, ZeroPacker::new(out, &[]));
    }

    /// Inverse of [`Distinct::write_compact`].
    pub fn from_compact(packed: &[u8]) -> Result<Distinct, String> {
        let mut bytes = Vec::with_capacity(packed.len() * 2);
        unpack_zeros(packed, &mut bytes).map_err(|e| format!("distinct-count sketch: {e}"))?;
        Distinct::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    /// The q-quantile the sketch estimates: the value of rank ⌊q·(n−1)⌋.
    fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() as f64 - 1.0)) as usize]
    }

    fn within(estimate: f64, exact: f64, rel: f64) -> bool {
        (estimate - exact).abs() <= rel * exact.abs() + 1e-12
    }

    #[test]
    fn quantiles_of_a_skewed_sample_are_within_one_percent() {
        // A long-tailed, two-signed sample: 20,000 values from 1e-3 to 1e4 and their negatives.
        let mut values = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let v = 10f64.powf(-3.0 + 7.0 * u);
            values.push(if i % 5 == 0 { -v } else { v });
        }
        let mut halves = [Quantiles::default(), Quantiles::default()];
        let mut whole = Quantiles::default();
        for (i, &v) in values.iter().enumerate() {
            whole.add(v);
            halves[i % 2].add(v);
        }
        let mut merged = halves[0].clone();
        merged.merge(&halves[1]);
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        for q in [0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999] {
            let exact = exact_quantile(&sorted, q);
            for sketch in [&whole, &merged] {
                let est = sketch.quantile(q).unwrap();
                assert!(within(est, exact, QUANTILE_RELATIVE_ACCURACY), "q {q}: {est} vs {exact}");
            }
        }
        assert_eq!(merged, whole);
        assert_eq!(whole.count(), 20_000);
        assert_eq!(whole.quantile(0.0), Some(sorted[0]));
        assert_eq!(whole.quantile(1.0), Some(sorted[19_999]));
        let back = Quantiles::from_bytes(&whole.to_bytes()).unwrap();
        assert_eq!(back, whole);
        assert_eq!(Quantiles::default().quantile(0.5), None);
        assert!(Quantiles::from_bytes(&[1, 2, 3]).is_err());
    }

    #[test]
    fn non_finite_values_are_not_sketched() {
        let mut q = Quantiles::default();
        q.add(f64::INFINITY);
        q.add(f64::NAN);
        q.add(2.0);
        assert_eq!(q.count(), 1);
        assert!(within(q.quantile(0.5).unwrap(), 2.0, QUANTILE_RELATIVE_ACCURACY));
    }

    #[test]
    fn distinct_counts_are_within_two_percent_and_merge() {
        for n in [1u64, 10, 100, 128, 129, 1_000, 10_000, 100_000] {
            let mut whole = Distinct::default();
            let mut parts = [Distinct::default(), Distinct::default(), Distinct::default()];
            for id in 0..n {
                // Every item twice, the second time into another part.
                whole.insert(id * 7919);
                whole.insert(id * 7919);
                parts[(id % 3) as usize].insert(id * 7919);
                parts[((id + 1) % 3) as usize].insert(id * 7919);
            }
            let mut merged = parts[0].clone();
            merged.merge(&parts[1]);
            merged.merge(&parts[2]);
            let est = whole.estimate() as f64;
            assert!((est - n as f64).abs() <= 0.02 * n as f64, "{n}: estimate {est}");
            // Up to 128 items, a list of their hashes: exact (no collision among these).
            if n <= 128 {
                assert_eq!(whole.estimate(), n);
            }
            assert_eq!(merged.estimate(), whole.estimate());
            let back = Distinct::from_bytes(&whole.to_bytes()).unwrap();
            assert_eq!(back, whole);
        }
        assert_eq!(Distinct::default().estimate(), 0);
        assert!(Distinct::from_bytes(&[0xff, 0xff]).is_err());
    }

    #[test]
    fn zero_runs_pack_to_pairs_and_back() {
        let mut bytes = vec![1, 0, 0, 2];
        bytes.extend([0; 300]);
        bytes.push(3);
        let mut packed = Vec::new();
        pack_zeros(&bytes, &mut packed);
        assert_eq!(packed, [1, 0, 2, 2, 0, 255, 0, 45, 3]);
        let mut back = vec![9];
        unpack_zeros(&packed, &mut back).unwrap();
        assert_eq!(back[1..], bytes[..]);
        for bad in [&[0][..], &[5, 0, 0], &[0, 0, 1]] {
            assert!(unpack_zeros(bad, &mut Vec::new()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn compact_sketches_are_the_same_sketches_in_fewer_bytes() {
        // An hour of a sensor at 10 s: 360 values drifting over a few dozen bins.
        let mut q = Quantiles::default();
        let mut d = Distinct::default();
        for i in 0..360u32 {
            q.add(50.0 + f64::from(i % 37) * 0.7 - f64::from(i % 11));
            d.insert(u64::from(i % 50) * 7919);
        }
        let mut compact = vec![7];
        q.write_compact(&mut compact);
        assert_eq!(compact[0], 7, "appends");
        assert_eq!(Quantiles::from_compact(&compact[1..]).unwrap(), q);
        assert!(compact.len() * 2 < q.to_bytes().len(), "{} vs {}", compact.len(), q.to_bytes().len());
        let mut compact = Vec::new();
        d.write_compact(&mut compact);
        assert_eq!(Distinct::from_compact(&compact).unwrap(), d);
        let mut empty = Vec::new();
        Quantiles::default().write_compact(&mut empty);
        assert_eq!(Quantiles::from_compact(&empty).unwrap().count(), 0);
        assert!(Quantiles::from_compact(&[0]).is_err());
        assert!(Quantiles::from_compact(&[1, 2, 3]).is_err());
    }

    /// Zigzag varint of a key, as the packed form writes offsets.
    fn signed(n: i64) -> Vec<u8> {
        let mut v = Vec::new();
        varint::put_signed(&mut v, n);
        v
    }

    /// An hour's sketch of 60 values from 20 to 36 and `glitches`.
    fn hour_with(glitches: &[f64]) -> Quantiles {
        let mut q = Quantiles::default();
        for i in 0..60 {
            q.add(20.0 + f64::from(i % 17));
        }
        glitches.iter().for_each(|&g| q.add(g));
        q
    }

    /// A wide sketch packed at rest answers, merges, is added to and is written as it was
    /// dense; a usual one stays dense.
    #[test]
    fn wide_sketches_packed_at_rest_are_the_sketches_they_were() {
        let usual = hour_with(&[]);
        let mut kept = usual.clone();
        kept.pack_if_wide(20.0, 36.0);
        assert!(!kept.is_packed(), "{} bins", usual.dense().length());
        // Both signs, across every magnitude: 1e-8 to 1e308, and -1e300.
        let (min, max) = (-1e300, 1e308);
        let dense = hour_with(&[1e-8, 1e308, -1e300, -2.5]);
        assert!(dense.dense().length() > 50_000, "{} bins", dense.dense().length());
        let mut packed = dense.clone();
        packed.pack_if_wide(min, max);
        assert!(packed.is_packed());
        assert_eq!(packed.count(), 64);
        assert_eq!(packed, dense);
        assert_eq!(packed.quantile(0.5), dense.quantile(0.5));
        assert!(within(packed.quantile(0.5).unwrap(), 27.0, QUANTILE_RELATIVE_ACCURACY));
        // Written as the dense one: its own bytes given the same min and max, which are its
        // non-empty bins only; read back given others.
        let written = |q: &Quantiles, min: f64, max: f64| {
            let mut out = Vec::new();
            q.write_packed(min, max, &mut out);
            out
        };
        assert_eq!(written(&packed, min, max), written(&dense, min, max));
        assert!(written(&packed, min, max).len() < 80, "{} bytes", written(&packed, min, max).len());
        assert_eq!(written(&packed, 0.0, 1.0), written(&dense, 0.0, 1.0));
        let mut compact = Vec::new();
        packed.write_compact(&mut compact);
        assert_eq!(Quantiles::from_compact(&compact).unwrap(), dense);
        // Merged into, and from: read back, and the same as the dense ones'.
        let merged = |mut into: Quantiles, from: &Quantiles| {
            into.merge(from);
            into
        };
        let want = merged(dense.clone(), &usual);
        let into_packed = merged(packed.clone(), &usual);
        assert!(!into_packed.is_packed());
        assert_eq!(into_packed, want);
        let from_packed = merged(usual.clone(), &packed);
        assert!(!from_packed.is_packed());
        assert_eq!(from_packed, merged(usual.clone(), &dense));
        assert_eq!(from_packed.count(), 124);
        // Into an empty sketch: a copy, still packed.
        let copy = merged(Quantiles::default(), &packed);
        assert!(copy.is_packed());
        assert_eq!(copy, dense);
        // Added to: read back for good.
        let mut added = packed.clone();
        added.add(1e9);
        assert!(!added.is_packed());
        let mut want_added = dense.clone();
        want_added.add(1e9);
        assert_eq!(added, want_added);
        assert_eq!(added.count(), 65);
    }

    #[test]
    fn packed_sketches_are_their_bins_and_no_more() {
        let mut q = Quantiles::default();
        for v in [10.0, 12.0, -3.0, 0.0, 10.0] {
            q.add(v);
        }
        let c = quantile_config();
        let (k10, k12, k3) = (c.key(10.0), c.key(12.0), c.key(3.0));
        assert!(k12 - k10 > 1 && k12 - k10 < 64, "{k10} {k12}");
        // A store's first value lands mid-chunk: 128 bins from 64 keys below it.
        let mut want = vec![PACKED_POSITIVE | PACKED_NEGATIVE | PACKED_ZEROS, 1];
        want.extend([0x80, 0x01]);
        want.extend(signed(i64::from(k10) - 64));
        want.extend([2, 0x80, 0x01, 0]); // two bins: at 64 a count of 2,
        want.push((((k12 - k10 - 1) << 1) | 1) as u8); // then after a gap a count of 1
        want.extend([0x80, 0x01]);
        want.extend(signed(i64::from(k3) - 64));
        want.extend([1, 0x81, 0x01]);
        let mut packed = vec![9];
        q.write_packed(-3.0, 12.0, &mut packed);
        assert_eq!(packed[1..], want[..]);
        assert_eq!(packed[0], 9, "appends");
        assert_eq!(Quantiles::from_packed(&want, -3.0, 12.0).unwrap(), q);
        // Min and max other than the field's are written; its sum is not kept.
        let mut other = Vec::new();
        q.write_packed(-3.0, f64::INFINITY, &mut other);
        assert_eq!(other[0], want[0] | PACKED_MIN_MAX);
        assert_eq!(other[2..18], [(-3.0f64).to_be_bytes(), 12.0f64.to_be_bytes()].concat());
        assert_eq!(Quantiles::from_packed(&other, 0.0, 0.0).unwrap(), q);
        assert_eq!(Quantiles::from_packed(&other, 0.0, 0.0).unwrap().into_dense().sum(), Some(0.0));
        let mut empty = Vec::new();
        Quantiles::default().write_packed(f64::NAN, f64::NAN, &mut empty);
        assert_eq!(empty[0], PACKED_MIN_MAX);
        assert_eq!(Quantiles::from_packed(&empty, f64::NAN, f64::NAN).unwrap(), Quantiles::default());
        // Damaged bytes are refused.
        let refused = |b: &[u8]| Quantiles::from_packed(b, -3.0, 12.0).unwrap_err();
        assert_eq!(refused(&[]), "quantile sketch: truncated");
        assert_eq!(refused(&want[..want.len() - 1]), "quantile sketch: truncated: a varint without its last byte");
        assert_eq!(refused(&[want.clone(), vec![0]].concat()), "quantile sketch: 1 bytes after the sketch");
        assert_eq!(refused(&[0x40]), "quantile sketch: unknown flags 0x40");
        assert_eq!(refused(&[PACKED_POSITIVE, 2, 0, 1, 5]), "quantile sketch: a bin past the store's end");
        assert_eq!(refused(&[PACKED_POSITIVE, 2, 0, 3]), "quantile sketch: 3 non-empty bins of 2");
        assert_eq!(refused(&[PACKED_POSITIVE, 0x81, 0x80, 0x04]), "quantile sketch: 65537 bins");
        assert_eq!(refused(&[PACKED_POSITIVE, 1, 0, 0]), "quantile sketch: a store written without a value");
        let past_limit = [PACKED_POSITIVE | PACKED_POSITIVE_EXTRAS, 2, 0, 1, 1, EXTRAS_BIN_LIMIT, 1];
        assert_eq!(refused(&past_limit), "quantile sketch: 2 bins past a limit of 1");
        let outside = [PACKED_POSITIVE | PACKED_POSITIVE_EXTRAS, 1, 0, 1, 1, EXTRAS_KEYS, 0, 2];
        assert_eq!(refused(&outside), "quantile sketch: keys 0..=1 outside bins 0..1");
    }

    /// A sketch of the configuration before, whose 2,048 bins a span of 1e-9 to 1e12 (2 %
    /// steps) collapsed, read back as its stored bytes are: its stores under our bin limit.
    fn collapsed_before() -> Quantiles {
        let mut before = DDSketch::new(quantile_config_before());
        for i in 0..=210 {
            before.add(10f64.powf(-9.0 + f64::from(i) * 0.1));
        }
        Quantiles::from_bytes(&postcard::to_allocvec(&before).unwrap()).unwrap()
    }

    #[test]
    fn a_collapsed_store_packs_whole() {
        let q = collapsed_before();
        let p = q.parts().unwrap();
        assert!(p.store.is_collapsed && p.store.bins.len() == 2048);
        assert_eq!(p.store.bin_limit, QUANTILE_MAX_BINS as usize);
        let mut packed = Vec::new();
        q.write_packed(0.0, 0.0, &mut packed);
        // 1e-9 itself counts as zero.
        assert_eq!(packed[0], PACKED_POSITIVE | PACKED_POSITIVE_EXTRAS | PACKED_ZEROS | PACKED_MIN_MAX);
        let back = Quantiles::from_packed(&packed, 0.0, 0.0).unwrap();
        assert_eq!(back, q);
        assert!(back.parts().unwrap().store == p.store);
        // Both go on the same way: a value below the collapsed bins, a merge.
        let (mut a, mut b) = (q.clone(), back);
        for s in [&mut a, &mut b] {
            s.add(1e-9);
            s.merge(&q);
        }
        assert_eq!(a, b);
        assert!(a.parts().unwrap().store == b.parts().unwrap().store);
    }

    #[test]
    fn a_glitch_far_above_the_rest_leaves_their_quantiles_within_one_percent() {
        // An hour of readings 1 to 10 and three glitches: 1e25, f32::MAX (a common "no
        // reading" of sensors) and 1e308, 333 decades above the lowest magnitude sketched.
        let mut values: Vec<f64> = (0..600).map(|i| f64::from(i % 10 + 1)).collect();
        values.extend([1e25, f64::from(f32::MAX), 1e308, 1.5e-9]);
        let mut q = Quantiles::default();
        let mut halves = [Quantiles::default(), Quantiles::default()];
        for (i, &v) in values.iter().enumerate() {
            q.add(v);
            halves[i % 2].add(v);
        }
        let mut merged = halves[0].clone();
        merged.merge(&halves[1]);
        values.sort_by(f64::total_cmp);
        let store = q.parts().unwrap().store;
        assert!(!store.is_collapsed, "{} bins", store.bins.len());
        for p in 1..=99 {
            let q_ = f64::from(p) / 100.0;
            let exact = exact_quantile(&values, q_);
            for sketch in [&q, &merged] {
                let est = sketch.quantile(q_).unwrap();
                assert!(within(est, exact, QUANTILE_RELATIVE_ACCURACY), "p{p}: {est} vs {exact}");
            }
        }
        assert_eq!(merged, q);
        let mut packed = Vec::new();
        q.write_packed(1.5e-9, 1e308, &mut packed);
        // Usual stores (no extras), the sketch's min and max the field's.
        assert_eq!(packed[0], PACKED_POSITIVE);
        let back = Quantiles::from_packed(&packed, 1.5e-9, 1e308).unwrap();
        assert_eq!(back, q);
        // A sketch from before (limit 2,048, collapsed) merges with it without an error and
        // stays collapsed: its lowest bin holds all below.
        let mut old = collapsed_before();
        old.merge(&q);
        assert!(old.parts().unwrap().store.is_collapsed);
        assert_eq!(old.count(), 211 + q.count());
    }

    #[test]
    fn sketches_before_read_under_our_bin_limit_and_others_are_refused() {
        let mut before = DDSketch::new(quantile_config_before());
        for v in [1.0, 2.0, 3.0] {
            before.add(v);
        }
        let bytes = postcard::to_allocvec(&before).unwrap();
        let q = Quantiles::from_bytes(&bytes).unwrap();
        let p = q.parts().unwrap();
        assert_eq!(p.config, quantile_config());
        assert_eq!(p.store.bin_limit, QUANTILE_MAX_BINS as usize);
        assert_eq!(p.negative_store.bin_limit, QUANTILE_MAX_BINS as usize);
        // It answers as before, and widens past the old limit without collapsing.
        assert_eq!(q.quantile(0.5).map(f64::to_bits), before.quantile(0.5).unwrap().map(f64::to_bits));
        let mut wide = q.clone();
        wide.add(1e300);
        assert!(!wide.parts().unwrap().store.is_collapsed);
        assert!(within(wide.quantile(0.5).unwrap(), 2.0, QUANTILE_RELATIVE_ACCURACY));
        // Compact sketches (records of versions 3 to 5) carry their stores' old limits too.
        let mut compact = Vec::new();
        let _ = postcard::serialize_with_flavor(
            &before,
            ZeroPacker::new(
                &mut compact,
                Box::leak(postcard::to_allocvec(&quantile_config_before()).unwrap().into_boxed_slice()),
            ),
        );
        let from_compact = Quantiles::from_compact(&compact).unwrap();
        assert_eq!(from_compact.parts().unwrap().store.bin_limit, QUANTILE_MAX_BINS as usize);
        assert_eq!(from_compact, q);
        let other = DDSketch::new(Config::new(0.02, QUANTILE_MAX_BINS, QUANTILE_MIN_VALUE));
        assert_eq!(
            Quantiles::from_bytes(&postcard::to_allocvec(&other).unwrap()).unwrap_err(),
            "quantile sketch of another configuration"
        );
    }

    #[test]
    fn the_bin_limit_covers_every_finite_magnitude_sketched() {
        let c = quantile_config();
        let lowest = c.key(QUANTILE_MIN_VALUE.next_up());
        let highest = c.key(f64::MAX);
        assert_eq!((lowest, highest), (-1037, 35_487));
        let span = u32::try_from(highest - lowest + 1).unwrap();
        assert_eq!(QUANTILE_MAX_BINS, span.div_ceil(128) * 128);
    }

    proptest! {
        /// A sketch's compact bytes are its postcard bytes, without the configuration, packed
        /// (the stored format), and read back to the same sketch.
        #[test]
        fn compact_sketches_are_their_packed_postcard_bytes(values in prop::collection::vec(-1e6f64..1e6, 0..300)) {
            let (mut q, mut d) = (Quantiles::default(), Distinct::default());
            for &v in &values {
                q.add(v);
                d.insert(v.to_bits());
            }
            let (mut compact, mut packed) = (Vec::new(), Vec::new());
            q.write_compact(&mut compact);
            pack_zeros(&q.to_bytes()[config_bytes().len()..], &mut packed);
            prop_assert_eq!(&compact, &packed);
            prop_assert_eq!(Quantiles::from_compact(&compact).unwrap(), q);
            let (mut compact, mut packed) = (Vec::new(), Vec::new());
            d.write_compact(&mut compact);
            pack_zeros(&d.to_bytes(), &mut packed);
            prop_assert_eq!(&compact, &packed);
            prop_assert_eq!(Distinct::from_compact(&compact).unwrap(), d);
        }

        /// Any sketch, of values of any sign, zeros and non-finite ones, built by adds and a
        /// merge, packs and reads back to the same sketch in its every part but the sum, which
        /// goes on the same way; its parts' postcard bytes are its own.
        #[test]
        fn packed_sketches_are_the_same_sketches(
            values in prop::collection::vec(prop_oneof![
                4 => -1e6f64..1e6,
                1 => Just(0.0),
                1 => -1e-9f64..1e-9,
                1 => prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-0.0)],
                1 => -1e300f64..1e300,
            ], 0..300),
            split in 0usize..300,
            later in -1e6f64..1e6,
        ) {
            let split = split.min(values.len());
            let (mut q, mut rest) = (Quantiles::default(), Quantiles::default());
            for &v in &values[..split] {
                q.add(v);
            }
            for &v in &values[split..] {
                rest.add(v);
            }
            q.merge(&rest);
            let bytes = postcard::to_allocvec(&*q.dense()).unwrap();
            let parts = q.parts().unwrap();
            prop_assert_eq!(postcard::to_allocvec(&parts).unwrap(), bytes);
            // The catcher gets what serde's own layout holds.
            let mut catcher = Catcher::default();
            serde::Serialize::serialize(&*q.dense(), &mut catcher).unwrap();
            let c = &catcher.caught;
            prop_assert_eq!(c.seen, CAUGHT_ALL);
            prop_assert_eq!(&c.stores[0], &CaughtStore::of(&parts.store));
            prop_assert_eq!(&c.stores[1], &CaughtStore::of(&parts.negative_store));
            prop_assert_eq!((c.min.to_bits(), c.max.to_bits(), c.zero_count), (parts.min.to_bits(), parts.max.to_bits(), parts.zero_count));
            let exact = |pick: fn(f64, f64) -> bool| values.iter().copied().reduce(|a, b| if pick(b, a) { b } else { a });
            let min = exact(|b, a| b.total_cmp(&a).is_lt()).unwrap_or(f64::NAN);
            let max = exact(|b, a| b.total_cmp(&a).is_gt()).unwrap_or(f64::NAN);
            let mut packed = Vec::new();
            q.write_packed(min, max, &mut packed);
            let back = Quantiles::from_packed(&packed, min, max).unwrap();
            prop_assert_eq!(&back, &q);
            let (mut a, mut b) = (q.parts().unwrap(), back.parts().unwrap());
            (a.sum, b.sum) = (0.0, 0.0);
            prop_assert_eq!(postcard::to_allocvec(&a).unwrap(), postcard::to_allocvec(&b).unwrap());
            let (mut a, mut b) = (q.clone(), back);
            for s in [&mut a, &mut b] {
                s.add(later);
                s.merge(&rest);
            }
            prop_assert_eq!(a, b);
        }

        /// Damaged packed bytes are refused or read to a sketch that answers and merges
        /// without a panic.
        #[test]
        fn damaged_packed_sketches_never_panic(values in prop::collection::vec(-1e3f64..1e3, 1..100), at in any::<prop::sample::Index>(), byte in any::<u8>(), tail in prop::collection::vec(any::<u8>(), 0..8)) {
            let mut q = Quantiles::default();
            for &v in &values {
                q.add(v);
            }
            let mut packed = Vec::new();
            q.write_packed(0.0, 0.0, &mut packed);
            let i = at.index(packed.len());
            packed[i] = byte;
            packed.extend(&tail);
            if let Ok(mut d) = Quantiles::from_packed(&packed, -1.0, 1.0) {
                for p in [0.0, 0.5, 0.99, 1.0] {
                    let _ = d.quantile(p);
                }
                let mut other = q.clone();
                other.merge(&d);
                d.merge(&q);
                d.add(values[0]);
                prop_assert!(d.count() >= q.count());
            }
        }

        #[test]
        fn packed_bytes_unpack_to_themselves(bytes in prop::collection::vec(prop_oneof![3 => Just(0u8), 1 => any::<u8>()], 0..2000)) {
            let mut packed = Vec::new();
            pack_zeros(&bytes, &mut packed);
            let mut back = Vec::new();
            unpack_zeros(&packed, &mut back).unwrap();
            prop_assert_eq!(back, bytes);
        }

        /// Any split of any sample merges to a sketch within 1 % of the exact quantiles.
        /// Values of any magnitude sketched, both signs, a few hundred decades apart: every
        /// percentile within 1 %, merged or not.
        #[test]
        fn quantiles_of_any_span_stay_within_one_percent(
            exps in prop::collection::vec((-8.9f64..308.0, any::<bool>()), 1..200),
            split in 0usize..200,
        ) {
            let values: Vec<f64> = exps.iter().map(|&(e, neg)| if neg { -(10f64.powf(e)) } else { 10f64.powf(e) }).collect();
            let mut whole = Quantiles::default();
            let (mut a, mut b) = (Quantiles::default(), Quantiles::default());
            for (i, &v) in values.iter().enumerate() {
                whole.add(v);
                if i < split { a.add(v) } else { b.add(v) }
            }
            a.merge(&b);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for p in 1..=99 {
                let q = f64::from(p) / 100.0;
                let exact = exact_quantile(&sorted, q);
                for sketch in [&whole, &a] {
                    let est = sketch.quantile(q).unwrap();
                    prop_assert!(within(est, exact, QUANTILE_RELATIVE_ACCURACY), "p{}: {} vs {}", p, est, exact);
                }
            }
        }

        #[test]
        fn merged_quantiles_stay_within_bound(values in prop::collection::vec(-1e6f64..1e6, 1..300), split in 0usize..300) {
            let split = split.min(values.len());
            let mut a = Quantiles::default();
            let mut b = Quantiles::default();
            for (i, &v) in values.iter().enumerate() {
                if i < split { a.add(v) } else { b.add(v) }
            }
            b.merge(&a);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in [0.5, 0.9, 0.99] {
                let exact = exact_quantile(&sorted, q);
                let est = b.quantile(q).unwrap();
                // Values within 1e-9 of zero are counted as zero.
                prop_assert!(within(est, exact, QUANTILE_RELATIVE_ACCURACY) || exact.abs() < 1e-9, "q {}: {} vs {}", q, est, exact);
            }
        }
    }
}
