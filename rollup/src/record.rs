//! A roll-up record: every aggregate of one period of one device, group or table.
//!
//! Per field: the [`Exact`] aggregates and a [`Quantiles`] sketch; per group or table record,
//! a [`Distinct`] estimate of the devices that reported. A record is a commutative monoid
//! under [`Record::merge`] like its parts: an hour is computed from its readings, a day from
//! its hours, a group's hour from its devices' hours.
//!
//! ```
//! use model::Reading;
//! use rollup::record::Record;
//! use rollup::Merge;
//! let a = Record::of_readings(&[Reading::new(0, vec![("temp".into(), 20.0)])]);
//! let mut b = Record::of_readings(&[Reading::new(60_000, vec![("temp".into(), 22.0)])]);
//! b.merge(&a);
//! assert_eq!(b.fields["temp"].exact.mean(), 21.0);
//! assert_eq!(b.fields["temp"].quantiles.as_ref().map(|q| q.count()), Some(2));
//! ```

use std::collections::BTreeMap;

use model::{FieldName, Reading};

use crate::approx::{Distinct, Quantiles};
use crate::exact::Exact;
use crate::Merge;

/// The aggregates of one field over a period.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldAgg {
    /// Count, sum, min, max, mean, first, last.
    pub exact: Exact,
    /// The values' quantile sketch; `None` when a part of the period was aggregated without
    /// one (records written before sketches existed).
    pub quantiles: Option<Quantiles>,
}

impl FieldAgg {
    /// The aggregates of the single point `(ts, v)`.
    pub fn of(ts: i64, v: f64) -> FieldAgg {
        let mut q = Quantiles::default();
        q.add(v);
        FieldAgg { exact: Exact::of(ts, v), quantiles: Some(q) }
    }

    /// The `q` quantile of the values (0 to 1): the sketch's estimate (1 % relative error),
    /// kept within the exact minimum and maximum, which the estimate can pass by up to that
    /// error (a p999 above the max, an i64 field's p50 past i64's range). `None` without a
    /// sketch.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let estimate = self.quantiles.as_ref()?.quantile(q)?;
        let (min, max) = (self.exact.min(), self.exact.max());
        // Every value the same: every quantile is it, the sign of a zero too (the sketch holds
        // -0.0 as 0.0, which a clamp to [-0.0, -0.0] keeps).
        if min.to_bits() == max.to_bits() {
            return Some(min);
        }
        // `clamp` panics when min > max, which NaN bounds can make: keep the estimate then.
        Some(if min <= max { estimate.clamp(min, max) } else { estimate })
    }

    /// The aggregates of `points`, in time order: what folding each into the first gives;
    /// `None` when there is none.
    pub fn of_points(points: impl IntoIterator<Item = (i64, f64)>) -> Option<FieldAgg> {
        let mut points = points.into_iter();
        let (ts, v) = points.next()?;
        let mut agg = FieldAgg::of(ts, v);
        points.for_each(|(ts, v)| agg.add(ts, v));
        Some(agg)
    }

    /// Folds in the point `(ts, v)`.
    pub fn add(&mut self, ts: i64, v: f64) {
        self.exact.add(ts, v);
        if let Some(q) = &mut self.quantiles {
            q.add(v);
        }
    }
}

impl FieldAgg {
    /// Packs its sketch while nothing changes it, if wide ([`Quantiles::pack_if_wide`]).
    pub fn pack_if_wide(&mut self) {
        if let Some(q) = &mut self.quantiles {
            q.pack_if_wide(self.exact.min(), self.exact.max());
        }
    }
}

impl Merge for FieldAgg {
    fn merge(&mut self, other: &FieldAgg) {
        self.exact.merge(&other.exact);
        match (&mut self.quantiles, &other.quantiles) {
            (Some(q), Some(o)) => q.merge(o),
            // A sketch of part of the values is no sketch of them all.
            _ => self.quantiles = None,
        }
    }
}

/// The aggregates of one period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// Per field, in name order; a field no reading of the period had is absent.
    pub fields: BTreeMap<FieldName, FieldAgg>,
    /// Devices that reported in the period (group and table records; `None` for a device's).
    pub devices: Option<Distinct>,
}

impl Record {
    /// The record of `readings` (one device's): a reading without a field does not count for
    /// it (absent, not zero). Float and integer fields are aggregated as numbers (an integer
    /// as the nearest `f64`, exact up to 2^53 in magnitude); boolean and string fields are not
    /// rolled up.
    pub fn of_readings<'a>(readings: impl IntoIterator<Item = &'a Reading>) -> Record {
        let mut fields: BTreeMap<FieldName, FieldAgg> = BTreeMap::new();
        for r in readings {
            for (name, v) in &r.fields {
                let Some(v) = v.as_number() else { continue };
                match fields.get_mut(name) {
                    Some(agg) => agg.add(r.ts, v),
                    None => {
                        fields.insert(name.clone(), FieldAgg::of(r.ts, v));
                    }
                }
            }
        }
        Record { fields, devices: None }
    }

    /// Whether the record holds no field and no device.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.devices.is_none()
    }

    /// Packs its fields' wide sketches while nothing changes them ([`FieldAgg::pack_if_wide`]):
    /// for what is held a while, as a roll-up pass holds its chunk's records.
    pub fn pack_wide_sketches(&mut self) {
        self.fields.values_mut().for_each(FieldAgg::pack_if_wide);
    }

    /// Whether a field's sketch is packed ([`Record::pack_wide_sketches`]).
    pub fn has_packed_sketches(&self) -> bool {
        self.fields.values().any(|f| f.quantiles.as_ref().is_some_and(Quantiles::is_packed))
    }

    /// Folds `other` into `self` as the record of a group that has `device` as a member: its
    /// fields merge, and `device` joins the devices that reported.
    pub fn merge_member(&mut self, device: u64, other: &Record) {
        self.merge(other);
        self.devices.get_or_insert_with(Distinct::default).insert(device);
    }
}

impl Merge for Record {
    fn merge(&mut self, other: &Record) {
        for (name, agg) in &other.fields {
            match self.fields.get_mut(name) {
                Some(a) => a.merge(agg),
                None => {
                    self.fields.insert(name.clone(), agg.clone());
                }
            }
        }
        match (&mut self.devices, &other.devices) {
            (Some(d), Some(o)) => d.merge(o),
            (None, Some(o)) => self.devices = Some(o.clone()),
            (_, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use model::Value;
    use proptest::prelude::*;

    proptest! {
        /// Splitting readings into parts and merging the parts' records gives the record of
        /// the whole: exact aggregates bit for bit, sketches equal.
        #[test]
        fn parts_merge_to_the_whole(points in prop::collection::vec((0i64..1000, -1e4f64..1e4, 0usize..3, 0usize..4), 1..80)) {
            let names = ["a", "b", "c"];
            let readings: Vec<Reading> = points
                .iter()
                .map(|&(ts, v, f, _)| Reading::new(ts, vec![(names[f].into(), v)]))
                .collect();
            let whole = Record::of_readings(&readings);
            let mut merged = Record::default();
            for part in 0..4 {
                let rs: Vec<&Reading> = readings.iter().zip(&points).filter(|(_, p)| p.3 == part).map(|(r, _)| r).collect();
                merged.merge(&Record::of_readings(rs));
            }
            prop_assert_eq!(merged, whole);
        }
    }

    #[test]
    fn integer_fields_roll_up_as_numbers_and_booleans_and_strings_not_at_all() {
        let readings = [
            Reading::new(
                1,
                vec![
                    ("status".into(), Value::I64(3)),
                    ("on".into(), Value::Bool(true)),
                    ("driver".into(), Value::from("Andy")),
                ],
            ),
            Reading::new(2, vec![("status".into(), Value::I64(-5)), ("on".into(), Value::Bool(false))]),
            Reading::new(3, vec![("status".into(), Value::I64(8))]),
        ];
        let r = Record::of_readings(&readings);
        assert_eq!(r.fields.keys().map(|k| &**k).collect::<Vec<_>>(), ["status"]);
        let status = &r.fields["status"].exact;
        assert_eq!(*status, Exact::of_points([(1, 3.0), (2, -5.0), (3, 8.0)]).unwrap());
        assert_eq!(
            (status.count(), status.sum(), status.min(), status.max(), status.first(), status.last()),
            (3, 6.0, -5.0, 8.0, (1, 3.0), (3, 8.0))
        );
        assert_eq!(r.fields["status"].quantiles.as_ref().unwrap().count(), 3);
        // Only booleans and strings: nothing to roll up.
        assert!(Record::of_readings(&[Reading::new(1, vec![("on".into(), Value::Bool(true))])]).is_empty());
    }

    #[test]
    fn quantiles_stay_within_the_exact_min_and_max() {
        for v in [999.964, -3.25, 9.2e18] {
            let agg = FieldAgg::of_points((0..1000).map(|i| (i, v))).unwrap();
            let sketch = agg.quantiles.as_ref().unwrap().quantile(0.999).unwrap();
            // The sketch alone answers its bucket's value, within 1 % but not the value.
            assert_ne!(sketch, v);
            assert!((sketch - v).abs() <= v.abs() * 0.01, "{sketch} for {v}");
            for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(agg.quantile(q), Some(v), "q {q} of {v}");
            }
        }
        // A negative zero, alone or many times, is every quantile (the sketch says 0.0).
        let zeros = FieldAgg::of_points((0..3).map(|i| (i, -0.0))).unwrap();
        assert_eq!(zeros.quantiles.as_ref().unwrap().quantile(0.5).map(f64::to_bits), Some(0.0f64.to_bits()));
        for q in [0.0, 0.5, 1.0] {
            assert_eq!(zeros.quantile(q).map(f64::to_bits), Some((-0.0f64).to_bits()), "q {q}");
        }
        // Between min and max the estimate is the sketch's.
        let agg = FieldAgg::of_points((0..1000).map(|i| (i, f64::from(i as i32)))).unwrap();
        assert_eq!(agg.quantile(0.5), agg.quantiles.as_ref().unwrap().quantile(0.5));
        let without = FieldAgg { quantiles: None, ..agg };
        assert_eq!(without.quantile(0.5), None);
    }

    #[test]
    fn fields_absent_from_a_reading_do_not_count() {
        let readings = [
            Reading::new(3, vec![("temp".into(), 20.0), ("rpm".into(), 900.0)]),
            Reading::new(1, vec![("temp".into(), 22.0)]),
            Reading::new(2, vec![("rpm".into(), 1100.0)]),
        ];
        let r = Record::of_readings(&readings);
        let names: Vec<&str> = r.fields.keys().map(|k| &**k).collect();
        assert_eq!(names, ["rpm", "temp"]);
        let (temp, rpm) = (&r.fields["temp"].exact, &r.fields["rpm"].exact);
        assert_eq!(*temp, Exact::of_points([(3, 20.0), (1, 22.0)]).unwrap());
        assert_eq!((temp.count(), temp.mean(), temp.first()), (2, 21.0, (1, 22.0)));
        assert_eq!((rpm.count(), rpm.min(), rpm.last()), (2, 900.0, (3, 900.0)));
        assert_eq!(r.fields["temp"].quantiles.as_ref().unwrap().count(), 2);
        assert!(r.devices.is_none());
    }

    #[test]
    fn a_part_without_a_sketch_leaves_the_merge_without_one() {
        let mut a = Record::of_readings(&[Reading::new(0, vec![("t".into(), 1.0)])]);
        let mut b = a.clone();
        b.fields.get_mut("t").unwrap().quantiles = None;
        a.merge(&b);
        assert_eq!(a.fields["t"].exact.count(), 2);
        assert!(a.fields["t"].quantiles.is_none());
    }

    #[test]
    fn members_are_counted_once() {
        let r = Record::of_readings(&[Reading::new(0, vec![("t".into(), 1.0)])]);
        let mut group = Record::default();
        group.merge_member(1, &r);
        group.merge_member(2, &r);
        group.merge_member(1, &r);
        assert_eq!(group.devices.as_ref().unwrap().estimate(), 2);
        assert_eq!(group.fields["t"].exact.count(), 3);
    }
}
