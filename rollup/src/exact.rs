//! Exact aggregates of one field: count, sum, min, max, mean, first and last.
//!
//! An [`Exact`] is a commutative monoid under [`Exact::merge`] (the empty set is `None` in an
//! `Option<Exact>`): merging the aggregates of the parts of a set, in any grouping and any
//! order, gives exactly the aggregate of the whole set. That is what lets a day be computed
//! from its hours, a group from its devices, and a late reading be folded in by recomputing
//! only its hour — and still equal a recomputation from all the data, bit for bit.
//!
//! Two choices make that hold for floating point:
//! - the sum is kept exactly ([`ExactSum`], Shewchuk's non-overlapping partials, as Python's
//!   `math.fsum`), and reported as the exact sum correctly rounded to `f64`; a plain `f64`
//!   running sum depends on the order of additions;
//! - min, max, first and last use total orders: values by [`f64::total_cmp`] (so `-0.0` is
//!   below `0.0`), and first / last by `(ts, value)`, so two readings of different devices at
//!   the same timestamp (in a group) resolve the same way whatever the merge order.
//!
//! ```
//! use rollup::exact::Exact;
//! let mut a = Exact::of(1_000, 0.1);
//! a.add(2_000, 0.2);
//! let b = Exact::of(3_000, 0.3);
//! a.merge(&b);
//! assert_eq!(a.count(), 3);
//! assert_eq!(a.sum(), 0.6); // a plain f64 sum gives 0.6000000000000001
//! assert_eq!(a.first(), (1_000, 0.1));
//! assert_eq!(a.last(), (3_000, 0.3));
//! ```

use std::cmp::Ordering;

/// An exact sum of `f64` values: a list of non-overlapping partials whose exact sum is the
/// exact sum of every value added (Shewchuk, "Adaptive Precision Floating-Point Arithmetic",
/// 1997). [`ExactSum::value`] rounds it correctly (to nearest, ties to even), so the value does
/// not depend on the order values were added or sums merged.
///
/// Non-finite inputs are summed apart, as IEEE addition would (`inf + -inf` is NaN). A sum
/// whose intermediate partials overflow `f64` (magnitudes near `1e308`) also goes there and is
/// reported as infinite; sensor readings never come near that.
#[derive(Debug, Clone, Default)]
pub struct ExactSum {
    /// Non-overlapping, increasing magnitude; their exact sum is the sum of the finite inputs.
    partials: Vec<f64>,
    /// Sum of non-finite inputs and of overflowed partials; `0.0` when there are none.
    special: f64,
}

impl ExactSum {
    /// Adds `x` exactly.
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            self.special += x;
            return;
        }
        let mut x = x;
        let mut kept = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            // Two-sum: hi + lo == x + y exactly, for |x| >= |y|.
            let hi = x + y;
            if !hi.is_finite() {
                // Overflow: the sum is infinite whatever the other partials hold.
                self.special += hi;
                self.partials.truncate(kept);
                return;
            }
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.partials[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        self.partials.truncate(kept);
        self.partials.push(x);
    }

    /// A sum of `parts` added exactly, as [`ExactSum::partials`] and [`ExactSum::special`]
    /// give them back: `from_partials(s.partials().iter().chain([&s.special()]))` has the exact
    /// value of `s`. Any finite values are accepted (they need not be non-overlapping).
    pub fn from_partials<'a>(parts: impl IntoIterator<Item = &'a f64>) -> ExactSum {
        let mut sum = ExactSum::default();
        for &p in parts {
            sum.add(p);
        }
        sum
    }

    /// The non-overlapping partials whose exact sum is the sum of the finite inputs, smallest
    /// magnitude first: what a persisted sum must keep to merge exactly later.
    pub fn partials(&self) -> &[f64] {
        &self.partials
    }

    /// The sum of the non-finite inputs and overflowed partials; `0.0` when there are none.
    pub fn special(&self) -> f64 {
        self.special
    }

    /// Adds every partial of `other`: the exact sum of both.
    pub fn merge(&mut self, other: &ExactSum) {
        for &p in &other.partials {
            self.add(p);
        }
        self.special += other.special;
    }

    /// The exact sum, correctly rounded to `f64`.
    pub fn value(&self) -> f64 {
        if self.special != 0.0 {
            // Infinite or NaN (NaN != 0.0 too).
            return self.special;
        }
        let p = &self.partials;
        let Some(&top) = p.last() else {
            return 0.0;
        };
        // Sum from the largest partial down until the rounding error is non-zero.
        let mut n = p.len() - 1;
        let mut hi = top;
        let mut lo = 0.0;
        while n > 0 {
            let x = hi;
            let y = p[n - 1];
            n -= 1;
            hi = x + y;
            lo = y - (hi - x);
            if lo != 0.0 {
                break;
            }
        }
        // `hi + lo` is exact; the partials below `n` can only decide a tie of `lo` at half an
        // ulp of `hi`: round it away from `hi` when they push past the half.
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            if x - hi == y {
                hi = x;
            }
        }
        hi
    }
}

/// The exact aggregate of a non-empty set of `(ts, value)` points of one field.
#[derive(Debug, Clone)]
pub struct Exact {
    count: u64,
    sum: ExactSum,
    min: f64,
    max: f64,
    first: (i64, f64),
    last: (i64, f64),
}

/// `(ts, value)` in the total order first / last use.
fn point_cmp(a: (i64, f64), b: (i64, f64)) -> Ordering {
    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
}

impl Exact {
    /// The aggregate of the single point `(ts, v)`.
    pub fn of(ts: i64, v: f64) -> Exact {
        let mut sum = ExactSum::default();
        sum.add(v);
        Exact { count: 1, sum, min: v, max: v, first: (ts, v), last: (ts, v) }
    }

    /// The aggregate of `points`, or `None` when there are none.
    pub fn of_points(points: impl IntoIterator<Item = (i64, f64)>) -> Option<Exact> {
        let mut points = points.into_iter();
        let (ts, v) = points.next()?;
        let mut agg = Exact::of(ts, v);
        for (ts, v) in points {
            agg.add(ts, v);
        }
        Some(agg)
    }

    /// An aggregate from its stored parts (for decoding a persisted record): `count` points
    /// with exact sum `sum`, extremes `min` / `max` and points `first` / `last`. The caller
    /// vouches that they describe one set.
    pub fn from_parts(count: u64, sum: ExactSum, min: f64, max: f64, first: (i64, f64), last: (i64, f64)) -> Exact {
        Exact { count, sum, min, max, first, last }
    }

    /// The exact sum itself, for persisting it.
    pub fn exact_sum(&self) -> &ExactSum {
        &self.sum
    }

    /// Folds in the point `(ts, v)`.
    pub fn add(&mut self, ts: i64, v: f64) {
        self.count += 1;
        self.sum.add(v);
        self.fold_extremes(v, v, (ts, v), (ts, v));
    }

    /// Folds in the aggregate of another set (disjoint from this one: a point in both is
    /// counted twice).
    pub fn merge(&mut self, other: &Exact) {
        self.count += other.count;
        self.sum.merge(&other.sum);
        self.fold_extremes(other.min, other.max, other.first, other.last);
    }

    fn fold_extremes(&mut self, min: f64, max: f64, first: (i64, f64), last: (i64, f64)) {
        if min.total_cmp(&self.min) == Ordering::Less {
            self.min = min;
        }
        if max.total_cmp(&self.max) == Ordering::Greater {
            self.max = max;
        }
        if point_cmp(first, self.first) == Ordering::Less {
            self.first = first;
        }
        if point_cmp(last, self.last) == Ordering::Greater {
            self.last = last;
        }
    }

    /// Number of points.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Exact sum, correctly rounded.
    pub fn sum(&self) -> f64 {
        self.sum.value()
    }

    /// `sum / count`.
    pub fn mean(&self) -> f64 {
        self.sum() / self.count as f64
    }

    /// Smallest value (by `f64::total_cmp`).
    pub fn min(&self) -> f64 {
        self.min
    }

    /// Largest value (by `f64::total_cmp`).
    pub fn max(&self) -> f64 {
        self.max
    }

    /// The earliest point, `(ts, value)`; of points at the same `ts`, the smallest value.
    pub fn first(&self) -> (i64, f64) {
        self.first
    }

    /// The latest point, `(ts, value)`; of points at the same `ts`, the largest value.
    pub fn last(&self) -> (i64, f64) {
        self.last
    }
}

/// Equal when every reported aggregate is bit for bit the same (the sums' partials may differ
/// in form while their exact value is the same).
impl PartialEq for Exact {
    fn eq(&self, other: &Exact) -> bool {
        let bits = |p: (i64, f64)| (p.0, p.1.to_bits());
        self.count == other.count
            && self.sum().to_bits() == other.sum().to_bits()
            && self.min.to_bits() == other.min.to_bits()
            && self.max.to_bits() == other.max.to_bits()
            && bits(self.first) == bits(other.first)
            && bits(self.last) == bits(other.last)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn sum_of(values: &[f64]) -> f64 {
        let mut s = ExactSum::default();
        for &v in values {
            s.add(v);
        }
        s.value()
    }

    #[test]
    fn sums_are_correctly_rounded() {
        assert_eq!(sum_of(&[]), 0.0);
        assert_eq!(sum_of(&[0.1, 0.2, 0.3]), 0.6);
        assert_eq!(0.1 + 0.2 + 0.3, 0.6000000000000001); // what a plain sum gives
        assert_eq!(sum_of(&[1e100, 1.0, -1e100, 1.0]), 2.0);
        assert_eq!(sum_of(&[0.1; 10]), 1.0);
        // A tie at half an ulp of 2^53 decided by a tiny third partial: rounds up, not to even.
        assert_eq!(sum_of(&[9007199254740992.0, 1.0, 1e-10]), 9007199254740994.0);
        assert_eq!(sum_of(&[9007199254740992.0, 1.0]), 9007199254740992.0); // the tie itself: even
        assert_eq!(sum_of(&[f64::INFINITY, 1.0]), f64::INFINITY);
        assert!(sum_of(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        assert_eq!(sum_of(&[f64::MAX, f64::MAX]), f64::INFINITY);
    }

    #[test]
    fn extremes_use_total_orders() {
        let mut a = Exact::of(5, 0.0);
        a.add(5, -0.0);
        a.add(9, 2.5);
        a.add(9, -1.0);
        assert_eq!(a.min().to_bits(), (-1.0f64).to_bits());
        assert_eq!(a.max(), 2.5);
        assert_eq!(a.first().1.to_bits(), (-0.0f64).to_bits()); // ts 5: -0.0 < 0.0
        assert_eq!(a.last(), (9, 2.5));
        assert_eq!(a.count(), 4);
        assert_eq!(a.mean(), 1.5 / 4.0);
        assert_eq!(Exact::of_points(std::iter::empty()), None);
    }

    /// Values `i / 2^20` with `|i| < 2^52`: exact in `f64`, and their exact sum is an integer
    /// sum in `i128`, converted with one correct rounding — the oracle.
    fn scaled() -> impl Strategy<Value = i64> {
        prop_oneof![-(1i64 << 52)..(1i64 << 52), -1000i64..1000, -(1i64 << 30)..(1i64 << 30)]
    }

    const SCALE: f64 = (1u64 << 20) as f64;

    #[test]
    fn a_sum_rebuilt_from_its_partials_merges_exactly() {
        let mut a = ExactSum::default();
        for v in [1e100, 0.1, -1e100, 0.2, 1e-300] {
            a.add(v);
        }
        let parts: Vec<f64> = a.partials().iter().copied().chain([a.special()]).collect();
        let rebuilt = ExactSum::from_partials(&parts);
        assert_eq!(rebuilt.value().to_bits(), a.value().to_bits());
        let mut merged = rebuilt.clone();
        merged.merge(&ExactSum::from_partials(&[0.3]));
        assert_eq!(merged.value(), 0.6);
        let inf = ExactSum::from_partials(&[f64::INFINITY, 1.0]);
        assert_eq!((inf.value(), inf.special()), (f64::INFINITY, f64::INFINITY));
        let e = Exact::of_points([(1, 0.1), (2, 0.2)]).unwrap();
        let back = Exact::from_parts(e.count(), e.exact_sum().clone(), e.min(), e.max(), e.first(), e.last());
        assert_eq!(back, e);
    }

    proptest! {
        #[test]
        fn exact_sum_matches_integer_oracle(ints in prop::collection::vec(scaled(), 0..60)) {
            let values: Vec<f64> = ints.iter().map(|&i| i as f64 / SCALE).collect();
            let exact: i128 = ints.iter().map(|&i| i as i128).sum();
            prop_assert_eq!(sum_of(&values), exact as f64 / SCALE);
        }

        /// Any split into parts, aggregated separately and merged in any order and grouping,
        /// equals the aggregate of all points at once.
        #[test]
        fn merge_in_any_grouping_equals_the_whole(
            points in prop::collection::vec((0i64..50, scaled()), 1..80),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            order in any::<u64>(),
        ) {
            let points: Vec<(i64, f64)> = points.into_iter().map(|(t, i)| (t, i as f64 / SCALE)).collect();
            let whole = Exact::of_points(points.iter().copied()).unwrap();
            // Cut the point list into parts.
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(points.len() + 1)).collect();
            bounds.extend([0, points.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let mut parts: Vec<Exact> = bounds
                .windows(2)
                .filter_map(|w| Exact::of_points(points[w[0]..w[1]].iter().rev().copied()))
                .collect();
            // Merge them pairwise in a seeded order until one is left (a random tree).
            let mut seed = order;
            while parts.len() > 1 {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let i = (seed >> 33) as usize % parts.len();
                let b = parts.swap_remove(i);
                let j = (seed >> 13) as usize % parts.len();
                parts[j].merge(&b);
            }
            prop_assert_eq!(&parts[0], &whole);
            let exact: i128 = points.iter().map(|p| (p.1 * SCALE) as i128).sum();
            prop_assert_eq!(whole.sum(), exact as f64 / SCALE);
            prop_assert_eq!(whole.count(), points.len() as u64);
        }
    }
}
