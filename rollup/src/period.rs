//! Roll-up periods (hour, day, month: time-period demarcation) and the re-aggregation of
//! period rows by a coarser group level (year, month, day), the way a MapReduce view with
//! `group_level` groups its keys `[year, month, day, hour]` by a prefix.
//!
//! All periods are UTC and floor, also before 1970.
//!
//! ```
//! use rollup::exact::Exact;
//! use rollup::period::{group, GroupLevel, Level};
//! let ts = 1_704_153_000_000; // 2024-01-01T23:50:00Z
//! assert_eq!(Level::Hour.period_start(ts), 1_704_150_000_000);
//! assert_eq!(Level::Day.period_start(ts), 1_704_067_200_000);
//! let hours = vec![
//!     (Level::Hour.period_start(ts), Exact::of(ts, 2.0)),
//!     (Level::Hour.period_start(ts + 600_000), Exact::of(ts + 600_000, 3.0)), // next day
//! ];
//! let days = group(hours, GroupLevel::Day);
//! assert_eq!(days.len(), 2);
//! let months = group(days, GroupLevel::Month);
//! assert_eq!(months.len(), 1);
//! assert_eq!(months[0].1.sum(), 5.0);
//! ```

use std::collections::BTreeMap;

use model::{civil_from_days, days_from_civil, PartitionSize, DAY_MS};

use crate::Merge;

/// The period a roll-up record covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// One UTC hour.
    Hour,
    /// One UTC day.
    Day,
    /// One UTC calendar month.
    Month,
}

impl Level {
    /// The periods in order, finest first.
    pub const ALL: [Level; 3] = [Level::Hour, Level::Day, Level::Month];

    /// First millisecond of the period holding `ts`.
    pub fn period_start(self, ts: i64) -> i64 {
        let size = match self {
            Level::Hour => PartitionSize::Hour,
            Level::Day => PartitionSize::Day,
            Level::Month => PartitionSize::Month,
        };
        size.start_ms(size.index_of(ts))
    }

    /// Stable label (`hour`, `day`, `month`), as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Hour => "hour",
            Level::Day => "day",
            Level::Month => "month",
        }
    }

    /// Inverse of [`Level::as_str`].
    pub fn parse(label: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == label)
    }
}

/// A coarser grouping of period rows: by the prefix `[year]`, `[year, month]` or
/// `[year, month, day]` of their start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupLevel {
    /// By UTC calendar year.
    Year,
    /// By UTC calendar month.
    Month,
    /// By UTC day.
    Day,
}

impl GroupLevel {
    /// First millisecond of the group holding `ts`.
    pub fn group_start(self, ts: i64) -> i64 {
        match self {
            GroupLevel::Year => {
                let (y, _, _) = civil_from_days(ts.div_euclid(DAY_MS));
                days_from_civil(y, 1, 1) * DAY_MS
            }
            GroupLevel::Month => Level::Month.period_start(ts),
            GroupLevel::Day => Level::Day.period_start(ts),
        }
    }

    /// Stable label (`year`, `month`, `day`), as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupLevel::Year => "year",
            GroupLevel::Month => "month",
            GroupLevel::Day => "day",
        }
    }

    /// Inverse of [`GroupLevel::as_str`].
    pub fn parse(label: &str) -> Option<GroupLevel> {
        [GroupLevel::Year, GroupLevel::Month, GroupLevel::Day].into_iter().find(|g| g.as_str() == label)
    }
}

/// Re-aggregates `(period start, aggregate)` rows by `level`: one row per group that has
/// rows, keyed by the group's start, in time order. Rows of periods coarser than the group
/// (a month row grouped by day) are kept whole in the group of their start.
pub fn group<T: Merge>(rows: impl IntoIterator<Item = (i64, T)>, level: GroupLevel) -> Vec<(i64, T)> {
    let mut groups: BTreeMap<i64, T> = BTreeMap::new();
    for (start, agg) in rows {
        groups.entry(level.group_start(start)).and_modify(|g| g.merge(&agg)).or_insert(agg);
    }
    groups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::exact::Exact;
    use model::HOUR_MS;
    use proptest::prelude::*;

    fn date_ms(y: i64, m: u32, d: u32) -> i64 {
        days_from_civil(y, m, d) * DAY_MS
    }

    #[test]
    fn periods_floor_in_utc_also_before_1970() {
        let ts = date_ms(2024, 2, 29) + 13 * HOUR_MS + 5;
        assert_eq!(Level::Hour.period_start(ts), date_ms(2024, 2, 29) + 13 * HOUR_MS);
        assert_eq!(Level::Day.period_start(ts), date_ms(2024, 2, 29));
        assert_eq!(Level::Month.period_start(ts), date_ms(2024, 2, 1));
        assert_eq!(GroupLevel::Year.group_start(ts), date_ms(2024, 1, 1));
        assert_eq!(Level::Hour.period_start(-1), -HOUR_MS);
        assert_eq!(Level::Day.period_start(-1), -DAY_MS);
        assert_eq!(Level::Month.period_start(-1), date_ms(1969, 12, 1));
        assert_eq!(GroupLevel::Year.group_start(-1), date_ms(1969, 1, 1));
        assert_eq!(Level::parse("day"), Some(Level::Day));
        assert_eq!(GroupLevel::parse("year"), Some(GroupLevel::Year));
        assert_eq!(Level::parse("week"), None);
    }

    proptest! {
        /// Grouping hour rows by day, then by month, then by year gives what grouping the
        /// points themselves by year gives; and every level equals the points aggregated
        /// directly by that level.
        #[test]
        fn group_levels_compose(points in prop::collection::vec((-400i64 * 24..400 * 24, -1000i64..1000), 1..60)) {
            // Points spread over about two years either side of 1970, an hour apart at most.
            let points: Vec<(i64, f64)> =
                points.into_iter().map(|(h, v)| (h * HOUR_MS + 17, v as f64 / 8.0)).collect();
            let by = |f: &dyn Fn(i64) -> i64| {
                let mut m: BTreeMap<i64, Exact> = BTreeMap::new();
                for &(ts, v) in &points {
                    m.entry(f(ts)).and_modify(|a| a.add(ts, v)).or_insert(Exact::of(ts, v));
                }
                m.into_iter().collect::<Vec<_>>()
            };
            let hours = by(&|ts| Level::Hour.period_start(ts));
            let days = group(hours.clone(), GroupLevel::Day);
            prop_assert_eq!(&days, &by(&|ts| Level::Day.period_start(ts)));
            let months = group(days, GroupLevel::Month);
            prop_assert_eq!(&months, &by(&|ts| Level::Month.period_start(ts)));
            let years = group(months, GroupLevel::Year);
            prop_assert_eq!(&years, &by(&|ts| GroupLevel::Year.group_start(ts)));
            prop_assert_eq!(group(hours, GroupLevel::Year), years);
        }
    }
}
