//! Approximate aggregates, mergeable like the exact ones (day = merge of hours, group = merge
//! of devices), with a documented error:
//!
//! - [`Quantiles`]: a DDSketch (`sketches-ddsketch`) with relative accuracy
//!   [`QUANTILE_RELATIVE_ACCURACY`]: the estimate `y` of the q-quantile `x` (the value of rank
//!   `⌊q·(n−1)⌋` among the sorted values) satisfies `|y − x| ≤ 0.01·|x|`, for any data and any
//!   merge order. Values of magnitude below `1e-9` count as zero; non-finite values are not
//!   sketched (the exact aggregates still count them).
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

use std::sync::OnceLock;

use cardinality_estimator::CardinalityEstimator;
use sketches_ddsketch::{Config, DDSketch};

/// Relative accuracy of [`Quantiles`].
pub const QUANTILE_RELATIVE_ACCURACY: f64 = 0.01;

/// Most bins a sketch keeps per sign (2048 × 2% steps span 1e-9 … 1e9 and beyond); past it
/// the lowest bins collapse, so only quantiles in the lowest bins lose their accuracy.
const QUANTILE_MAX_BINS: u32 = 2048;

/// Magnitudes below this count as zero.
const QUANTILE_MIN_VALUE: f64 = 1e-9;

fn quantile_config() -> Config {
    Config::new(QUANTILE_RELATIVE_ACCURACY, QUANTILE_MAX_BINS, QUANTILE_MIN_VALUE)
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
#[derive(Clone)]
pub struct Quantiles(DDSketch);

impl Default for Quantiles {
    fn default() -> Self {
        Quantiles(DDSketch::new(quantile_config()))
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
            self.0.add(v);
        }
    }

    /// Folds in another sketch.
    pub fn merge(&mut self, other: &Quantiles) {
        // Every sketch here is built with `quantile_config`, and `from_bytes` rejects any other
        // configuration, so the configurations always match.
        if let Err(e) = self.0.merge(&other.0) {
            debug_assert!(false, "sketch configurations differ: {e}");
        }
    }

    /// Number of values sketched.
    pub fn count(&self) -> u64 {
        self.0.count() as u64
    }

    /// The estimate of the `q`-quantile (`0 ≤ q ≤ 1`); `None` when the sketch is empty or `q`
    /// is out of range.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.0.quantile(q).ok().flatten()
    }

    /// The persisted bytes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain numbers and vectors into a Vec cannot fail.
        postcard::to_allocvec(&self.0).unwrap_or_default()
    }

    /// Inverse of [`Quantiles::to_bytes`]; rejects sketches of another configuration.
    pub fn from_bytes(bytes: &[u8]) -> Result<Quantiles, String> {
        let sketch: DDSketch = postcard::from_bytes(bytes).map_err(|e| format!("quantile sketch: {e}"))?;
        // The configuration is private to the crate; compare by merging into an empty sketch
        // of ours, which fails on any other configuration.
        let mut ours = DDSketch::new(quantile_config());
        ours.merge(&sketch).map_err(|_| "quantile sketch of another configuration".to_string())?;
        Ok(Quantiles(sketch))
    }

    /// Appends the compact persisted bytes (module docs) to `out`.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        // The sketch's first field is its configuration, always `quantile_config`. Writing
        // plain numbers and vectors into a Vec cannot fail.
        let _ = postcard::serialize_with_flavor(&self.0, ZeroPacker::new(out, config_bytes()));
    }

    /// Inverse of [`Quantiles::write_compact`].
    pub fn from_compact(packed: &[u8]) -> Result<Quantiles, String> {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(config_bytes());
        unpack_zeros(packed, &mut bytes).map_err(|e| format!("quantile sketch: {e}"))?;
        // The configuration is ours, put first above: not compared again (`from_bytes` does
        // it by a merge, which copied every sketch a pass read once more).
        postcard::from_bytes(&bytes).map(Quantiles).map_err(|e| format!("quantile sketch: {e}"))
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

        #[test]
        fn packed_bytes_unpack_to_themselves(bytes in prop::collection::vec(prop_oneof![3 => Just(0u8), 1 => any::<u8>()], 0..2000)) {
            let mut packed = Vec::new();
            pack_zeros(&bytes, &mut packed);
            let mut back = Vec::new();
            unpack_zeros(&packed, &mut back).unwrap();
            prop_assert_eq!(back, bytes);
        }

        /// Any split of any sample merges to a sketch within 1 % of the exact quantiles.
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
