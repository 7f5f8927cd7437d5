//! Approximate aggregates, mergeable like the exact ones (day = merge of hours, group = merge
//! of devices), with a documented error:
//!
//! - [`Quantiles`]: a DDSketch (`sketches-ddsketch`) with relative accuracy
//!   [`QUANTILE_RELATIVE_ACCURACY`]: the estimate `y` of the q-quantile `x` (the value of rank
//!   `⌊q·(n−1)⌋` among the sorted values) satisfies `|y − x| ≤ 0.01·|x|`, for any data and any
//!   merge order. Values of magnitude below `1e-9` count as zero; non-finite values are not
//!   sketched (the exact aggregates still count them).
//! - [`Distinct`]: a HyperLogLog (`cardinality-estimator`, precision 14, 2^14 six-bit
//!   registers, exact up to a few hundred items): the estimate of the number of distinct
//!   items has a standard error of 1.04 / √16384 ≈ 0.81 %.
//!
//! Both persist through `postcard` (their serde layouts): [`Quantiles::to_bytes`],
//! [`Distinct::to_bytes`] and the matching `from_bytes`. A crate upgrade that changes those
//! layouts is a format change of the roll-up records.
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
        for n in [1u64, 10, 100, 1_000, 10_000, 100_000] {
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
            assert_eq!(merged.estimate(), whole.estimate());
            let back = Distinct::from_bytes(&whole.to_bytes()).unwrap();
            assert_eq!(back, whole);
        }
        assert_eq!(Distinct::default().estimate(), 0);
        assert!(Distinct::from_bytes(&[0xff, 0xff]).is_err());
    }

    proptest! {
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
