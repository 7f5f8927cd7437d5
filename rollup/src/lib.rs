//! The roll-up stage's aggregate math: what a roll-up record holds and how records merge.
//!
//! This crate owns the arithmetic of roll-ups and nothing else: no I/O, no RocksDB, no
//! scheduling (the work queue, the watermark and the stored records live in `bucketer`). Every
//! aggregate here is a commutative monoid ([`Merge`]), so a day is the merge of its hours and a
//! group the merge of its devices: exactly for the exact aggregates, within the documented
//! error for the sketches.
//!
//! - [`exact`]: count, sum (exact, correctly rounded), min, max, mean, first, last of a field;
//! - [`approx`]: quantile sketches (DDSketch, 1 % relative error) and distinct counts
//!   (HyperLogLog, 0.81 % standard error);
//! - [`record`]: a period's record, every field's exact aggregates and sketch, and the devices
//!   that reported;
//! - [`period`]: roll-up levels (hour, day, month) and re-aggregation by a group level (year,
//!   month, day);
//! - [`varint`]: the varints of the sketches' and records' persisted bytes.
//!
//! ```
//! use rollup::exact::Exact;
//! let hour_1 = Exact::of_points([(0, 20.5), (60_000, 21.0)]).expect("points");
//! let hour_2 = Exact::of_points([(3_600_000, 19.5)]).expect("points");
//! let mut day = hour_1.clone();
//! day.merge(&hour_2);
//! assert_eq!((day.count(), day.min(), day.max(), day.sum()), (3, 19.5, 21.0, 61.0));
//! ```

pub mod approx;
pub mod exact;
pub mod period;
pub mod record;
pub mod varint;

/// An aggregate that folds in another of its kind: associative and commutative, so parts
/// merge to the whole in any grouping and order.
pub trait Merge {
    /// Folds `other` into `self`.
    fn merge(&mut self, other: &Self);
}

impl Merge for exact::Exact {
    fn merge(&mut self, other: &Self) {
        exact::Exact::merge(self, other);
    }
}
