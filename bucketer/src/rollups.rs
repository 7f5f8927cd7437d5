//! The roll-up stage's storage: the work queue of dirty hours, the watermark, and the exact
//! per-device roll-up records of hours, days and months (computed pattern: the records are
//! derived, the buckets stay the source).
//!
//! # Work queue
//!
//! Every WriteBatch of readings puts a mark `table · hour · device` into the `dirty` column
//! family for each device-hour it touches (layout in [`crate::keys::DirtyKey`]). The mark's
//! value is a generation (u64 BE) that grows with every write batch, so a mark rewritten by a
//! late reading carries another value than the one the roll-up stage read.
//!
//! # Watermark
//!
//! The watermark is the largest event time the store has committed minus the allowed
//! lateness. The largest event time is persisted: a batch that raises it also puts it under
//! [`crate::keys::MAX_EVENT_TS_KEY`] in `catalog`, in the same WriteBatch, and it is loaded at
//! open. An hour is due once its end is at or before the watermark.
//!
//! # One pass ([`Store::process_rollups`])
//!
//! For each due mark, oldest hour first per table: read the hour's bucket, aggregate it with
//! [`rollup::exact::of_readings`], then recompute the day from the stored hour records of that
//! day (with the new hour in place of the old) and the month from the stored day records, and
//! put all three records together with the mark's deletion in one WriteBatch. A mark whose
//! bucket retention has dropped leaves the records as they are: roll-ups outlive raw data. A crash before the commit leaves the mark, so the hour is redone;
//! after it, nothing is left to do. The mark is deleted only if it still holds the generation
//! read before the bucket was read, checked under the writers' lock: a write that reached the
//! hour meanwhile has rewritten it, so the hour is done again in a later pass.
//!
//! # Record format (`rollups` column family, keys in [`crate::keys::RollupKey`])
//!
//! Version 1, all integers and floats big-endian:
//!
//! ```text
//! u8 1 · u16 field count · per field, in name order:
//!   u16 name length · name (UTF-8) · u64 count · f64 min · f64 max
//!   · i64 first ts · f64 first value · i64 last ts · f64 last value
//!   · u16 n · n × f64 sum parts
//! ```
//!
//! The sum parts are the exact sum's partials followed by its non-finite part when that is
//! not zero (see [`rollup::exact::ExactSum::partials`]); keeping them, not the rounded sum,
//! lets a day merge its hours exactly. Readers reject unknown versions.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use model::{FieldName, Hour, TimeRange, DAY_MS, HOUR_MS};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions, DB};
use rollup::exact::{self, Exact, ExactSum};
use rollup::period::Level;

use crate::keys::{self, BucketKey, DirtyKey, RollupKey};
use crate::store::{cf, CF_BUCKETS, CF_CATALOG, CF_DIRTY, CF_ROLLUPS};
use crate::{codec, db_err, read, Error, Result, Store, TableInfo};

/// The exact aggregates of every field of one period, by field name.
pub type Record = BTreeMap<FieldName, Exact>;

/// What one [`Store::process_rollups`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupSummary {
    /// The watermark of the pass (epoch ms); `None` before the first reading.
    pub watermark: Option<i64>,
    /// Dirty hours recomputed (each with its day and month).
    pub hours: usize,
    /// Marks left in place because a write reached their hour during the pass.
    pub rewritten: usize,
    /// Start of the oldest hour still dirty after the pass (epoch ms), if any.
    pub oldest_dirty_hour_ms: Option<i64>,
}

/// Version byte of the current record layout.
const RECORD_V1: u8 = 1;

/// The persisted bytes of a record (version 1, see the module docs). `None` when a field
/// name or a sum has more than `u16::MAX` entries — never for real data, since names are
/// short and sums hold at most some forty partials.
pub fn encode_record(record: &Record) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(3 + record.len() * 96);
    v.push(RECORD_V1);
    v.extend_from_slice(&u16::try_from(record.len()).ok()?.to_be_bytes());
    for (name, agg) in record {
        v.extend_from_slice(&u16::try_from(name.len()).ok()?.to_be_bytes());
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&agg.count().to_be_bytes());
        v.extend_from_slice(&agg.min().to_be_bytes());
        v.extend_from_slice(&agg.max().to_be_bytes());
        for (ts, x) in [agg.first(), agg.last()] {
            v.extend_from_slice(&ts.to_be_bytes());
            v.extend_from_slice(&x.to_be_bytes());
        }
        let sum = agg.exact_sum();
        let special = (sum.special() != 0.0).then_some(sum.special());
        let n = sum.partials().len() + usize::from(special.is_some());
        v.extend_from_slice(&u16::try_from(n).ok()?.to_be_bytes());
        for p in sum.partials().iter().chain(special.as_ref()) {
            v.extend_from_slice(&p.to_be_bytes());
        }
    }
    Some(v)
}

/// Reads big-endian fields off the front of a slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated: {n} more bytes wanted, {} left", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.array().map(u16::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_be_bytes)
    }

    fn i64(&mut self) -> Result<i64, String> {
        self.array().map(i64::from_be_bytes)
    }

    fn f64(&mut self) -> Result<f64, String> {
        self.array().map(f64::from_be_bytes)
    }
}

/// Decodes a record of any known version; the error says what is wrong.
pub fn decode_record(v: &[u8]) -> Result<Record, String> {
    let mut c = Cursor(v);
    match c.take(1)?[0] {
        RECORD_V1 => {}
        other => return Err(format!("unknown record version {other}")),
    }
    let fields = c.u16()?;
    let mut out = Record::new();
    for _ in 0..fields {
        let len = usize::from(c.u16()?);
        let name = std::str::from_utf8(c.take(len)?).map_err(|_| "field name is not UTF-8".to_string())?;
        let count = c.u64()?;
        if count == 0 {
            return Err(format!("field `{name}` has a count of 0"));
        }
        let (min, max) = (c.f64()?, c.f64()?);
        let first = (c.i64()?, c.f64()?);
        let last = (c.i64()?, c.f64()?);
        let n = usize::from(c.u16()?);
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            parts.push(c.f64()?);
        }
        let sum = ExactSum::from_partials(&parts);
        out.insert(name.into(), Exact::from_parts(count, sum, min, max, first, last));
    }
    if !c.0.is_empty() {
        return Err(format!("{} bytes after the last field", c.0.len()));
    }
    Ok(out)
}

/// Merges `part` into `into`, field by field.
pub fn merge_record(into: &mut Record, part: &Record) {
    for (name, agg) in part {
        match into.get_mut(name) {
            Some(a) => a.merge(agg),
            None => {
                into.insert(name.clone(), agg.clone());
            }
        }
    }
}

/// The first millisecond of the period after the one starting at `start`.
fn period_end(level: Level, start: i64) -> i64 {
    match level {
        Level::Hour => start + HOUR_MS,
        Level::Day => start + DAY_MS,
        // 31 days past a month's start always lands in the next month.
        Level::Month => Level::Month.period_start(start + 31 * DAY_MS),
    }
}

/// What [`scan_queue_at_open`] finds in the work queue.
pub(crate) struct QueueAtOpen {
    /// A generation above every stored one.
    pub(crate) next_gen: u64,
    /// Start of the oldest dirty hour.
    pub(crate) oldest_hour_ms: Option<i64>,
}

/// Reads the work queue once at open: the next mark generation and the oldest dirty hour.
pub(crate) fn scan_queue_at_open(db: &DB) -> Result<QueueAtOpen> {
    let mut next_gen = 0u64;
    let mut oldest: Option<i64> = None;
    for item in db.iterator_cf(cf(db, CF_DIRTY), IteratorMode::Start) {
        let (k, v) = item.map_err(db_err("scan dirty marks"))?;
        let key = decode_dirty(&k)?;
        let gen = decode_gen(&v)?;
        next_gen = next_gen.max(gen.saturating_add(1));
        let start = Hour(i64::from(key.hour)).start_ms();
        oldest = Some(oldest.map_or(start, |o| o.min(start)));
    }
    Ok(QueueAtOpen { next_gen, oldest_hour_ms: oldest })
}

/// The persisted largest event time, if any reading was ever committed.
pub(crate) fn load_max_event_ts(db: &DB) -> Result<Option<i64>> {
    match db.get_cf(cf(db, CF_CATALOG), keys::MAX_EVENT_TS_KEY).map_err(db_err("get max event time"))? {
        None => Ok(None),
        Some(v) => {
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| Error::Corrupt { what: "max event time", detail: format!("{} bytes, not 8", v.len()) })?;
            Ok(Some(i64::from_be_bytes(b)))
        }
    }
}

fn decode_dirty(k: &[u8]) -> Result<DirtyKey> {
    DirtyKey::decode(k).ok_or_else(|| Error::Corrupt { what: "dirty mark key", detail: format!("{} bytes", k.len()) })
}

fn decode_gen(v: &[u8]) -> Result<u64> {
    let b: [u8; 8] =
        v.try_into().map_err(|_| Error::Corrupt { what: "dirty mark", detail: format!("{} bytes, not 8", v.len()) })?;
    Ok(u64::from_be_bytes(b))
}

fn corrupt_record(e: String) -> Error {
    Error::Corrupt { what: "roll-up record", detail: e }
}

impl Store {
    /// One pass of the roll-up stage: recomputes at most `max_hours` dirty hours whose end is
    /// at or before the watermark (largest committed event time minus `allowed_lateness_ms`),
    /// oldest first within each table, each with its day and month, as the module docs
    /// describe. Safe to call from several threads (passes run one at a time) and while
    /// writes go on.
    pub fn process_rollups(&self, allowed_lateness_ms: u64, max_hours: usize) -> Result<RollupSummary> {
        let _pass = self.rollup_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let max_ts = self.stats.max_event_ts.load(Ordering::Relaxed);
        let mut summary = RollupSummary::default();
        let watermark =
            (max_ts != i64::MIN).then(|| max_ts.saturating_sub(i64::try_from(allowed_lateness_ms).unwrap_or(i64::MAX)));
        summary.watermark = watermark;

        // Collect the due marks: per table, from its oldest hour until the first hour not due
        // yet, then seek to the next table.
        let mut due: Vec<(DirtyKey, u64)> = Vec::new();
        let mut oldest: Option<i64> = None;
        let mut note_oldest = |hour: i32| {
            let start = Hour(i64::from(hour)).start_ms();
            oldest = Some(oldest.map_or(start, |o: i64| o.min(start)));
        };
        {
            let mut it = self.db.raw_iterator_cf(cf(&self.db, CF_DIRTY));
            it.seek_to_first();
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                let key = decode_dirty(k)?;
                let end = Hour(i64::from(key.hour)).start_ms() + HOUR_MS;
                if watermark.is_some_and(|w| end <= w) && due.len() < max_hours {
                    due.push((key, decode_gen(v)?));
                    it.next();
                } else {
                    note_oldest(key.hour);
                    match key.table.checked_add(1) {
                        Some(next) => it.seek(keys::table_prefix(next)),
                        None => break,
                    }
                }
            }
            it.status().map_err(db_err("scan dirty marks"))?;
        }

        let tables: HashMap<u32, TableInfo> = read(&self.catalog).by_name.values().map(|ti| (ti.id, *ti)).collect();
        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        for (mark, gen) in due {
            // A table created by a batch that has just committed becomes visible in the catalog
            // a moment after its marks: its hours wait for the next pass.
            let Some(ti) = tables.get(&mark.table) else {
                note_oldest(mark.hour);
                continue;
            };
            let mut wb = self.rollup_batch(ti, mark)?;
            // Compare-and-delete under the writers' lock: no write can rewrite the mark
            // between this read and the commit.
            let writers = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let now = self.db.get_cf(cf(&self.db, CF_DIRTY), mark.encode()).map_err(db_err("get dirty mark"))?;
            let unchanged = match now {
                Some(v) => decode_gen(&v)? == gen,
                None => false,
            };
            if unchanged {
                wb.delete_cf(cf(&self.db, CF_DIRTY), mark.encode());
            } else {
                summary.rewritten += 1;
                note_oldest(mark.hour);
            }
            self.db.write_opt(wb, &wo).map_err(db_err("write roll-ups"))?;
            drop(writers);
            summary.hours += 1;
            self.stats.rollup_hours_processed.fetch_add(1, Ordering::Relaxed);
        }
        summary.oldest_dirty_hour_ms = oldest;
        self.stats.rollup_oldest_dirty_hour_ms.store(oldest.unwrap_or(i64::MAX), Ordering::Relaxed);
        Ok(summary)
    }

    /// The WriteBatch that stores the hour, day and month records of one dirty mark. Empty
    /// when the hour's bucket is gone (retention dropped its partition after the write that
    /// marked it): roll-ups outlive the raw data, so the records stay as they are.
    fn rollup_batch(&self, ti: &TableInfo, mark: DirtyKey) -> Result<WriteBatch> {
        let hour_start = Hour(i64::from(mark.hour)).start_ms();
        let partition = keys::to_i32(ti.partition.index_of(hour_start)).ok_or(Error::TimeOutOfRange(hour_start))?;
        let bucket = BucketKey { table: mark.table, partition, device: mark.device, hour: mark.hour };
        let hour_record =
            match self.db.get_cf(cf(&self.db, CF_BUCKETS), bucket.encode()).map_err(db_err("get bucket"))? {
                Some(v) => {
                    let mut readings = Vec::new();
                    codec::decode(&v, &mut readings)
                        .map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
                    exact::of_readings(&readings)
                }
                None => return Ok(WriteBatch::default()),
            };
        let day_start = Level::Day.period_start(hour_start);
        let day_record =
            self.recompute(mark.table, mark.device, Level::Hour, day_start, Level::Day, hour_start, &hour_record)?;
        let month_start = Level::Month.period_start(hour_start);
        let month_record =
            self.recompute(mark.table, mark.device, Level::Day, month_start, Level::Month, day_start, &day_record)?;
        let mut wb = WriteBatch::default();
        for (level, start, record) in [
            (Level::Hour, hour_start, &hour_record),
            (Level::Day, day_start, &day_record),
            (Level::Month, month_start, &month_record),
        ] {
            let key =
                RollupKey { table: mark.table, level: keys::rollup_level_code(level), device: mark.device, start };
            if record.is_empty() {
                wb.delete_cf(cf(&self.db, CF_ROLLUPS), key.encode());
            } else {
                let value = encode_record(record).ok_or_else(|| Error::Corrupt {
                    what: "roll-up record",
                    detail: "a field name or sum is too long to store".into(),
                })?;
                wb.put_cf(cf(&self.db, CF_ROLLUPS), key.encode(), value);
            }
        }
        Ok(wb)
    }

    /// The record of the `outer` period starting at `outer_start`: the merge of its stored
    /// `inner` records, with `replaced` standing in for the stored record of the inner period
    /// starting at `replaced_start`.
    #[allow(clippy::too_many_arguments)]
    fn recompute(
        &self,
        table: u32,
        device: u64,
        inner: Level,
        outer_start: i64,
        outer: Level,
        replaced_start: i64,
        replaced: &Record,
    ) -> Result<Record> {
        let mut out = replaced.clone();
        let range = TimeRange { start: outer_start, end: period_end(outer, outer_start) };
        for (start, record) in self.scan_records(table, device, inner, range)? {
            if start != replaced_start {
                merge_record(&mut out, &record);
            }
        }
        Ok(out)
    }

    /// The stored records of one device and level whose period starts in `range`, in time
    /// order.
    fn scan_records(&self, table: u32, device: u64, level: Level, range: TimeRange) -> Result<Vec<(i64, Record)>> {
        let code = keys::rollup_level_code(level);
        let lo = RollupKey { table, level: code, device, start: range.start };
        let hi = RollupKey { start: range.end, ..lo };
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lo.encode().to_vec());
        opts.set_iterate_upper_bound(hi.encode().to_vec());
        let mut out = Vec::new();
        for item in self.db.iterator_cf_opt(cf(&self.db, CF_ROLLUPS), opts, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan roll-ups"))?;
            let key = RollupKey::decode(&k).ok_or_else(|| corrupt_record(format!("key of {} bytes", k.len())))?;
            out.push((key.start, decode_record(&v).map_err(corrupt_record)?));
        }
        Ok(out)
    }

    /// The roll-up records of `device` in `table` at `level` whose period starts in `range`,
    /// in time order, each with its period start. `None` when the table or the device (in that
    /// table) is unknown. Hours not yet past the watermark, or whose recomputation is pending,
    /// are missing or show their previous value.
    pub fn rollups(
        &self,
        table: &str,
        device: &str,
        level: Level,
        range: TimeRange,
    ) -> Result<Option<Vec<(i64, Record)>>> {
        let Some((ti, dev)) = self.device_in_table(table, device)? else {
            return Ok(None);
        };
        self.scan_records(ti.id, dev, level, range).map(Some)
    }

    /// Number of marks in the work queue, by a full scan (for tests and inspection).
    pub fn dirty_marks(&self) -> Result<usize> {
        let mut n = 0;
        for item in self.db.iterator_cf(cf(&self.db, CF_DIRTY), IteratorMode::Start) {
            item.map_err(db_err("scan dirty marks"))?;
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_round_trip_bit_for_bit() {
        let mut r = Record::new();
        r.insert("temp".into(), Exact::of_points([(5, 0.1), (3, 0.2), (9, -0.0)]).unwrap());
        r.insert("rpm".into(), Exact::of_points([(5, 1e100), (6, 1.0), (7, -1e100)]).unwrap());
        r.insert("odd".into(), Exact::of_points([(1, f64::INFINITY), (2, 3.0)]).unwrap());
        let bytes = encode_record(&r).unwrap();
        assert_eq!(bytes[0], 1);
        let back = decode_record(&bytes).unwrap();
        assert_eq!(back, r);
        assert_eq!(back["rpm"].sum(), 1.0);
        assert_eq!(back["odd"].sum(), f64::INFINITY);
        // The sum stays exact when merged after the round trip: 0.1 + 0.2 + 0.3 is 0.6.
        let mut t = back["temp"].clone();
        t.merge(&Exact::of(10, 0.3));
        assert_eq!(t.sum(), 0.6);
        assert_eq!(decode_record(&[]), Err("truncated: 1 more bytes wanted, 0 left".into()));
        assert_eq!(decode_record(&[2]), Err("unknown record version 2".into()));
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode_record(&longer), Err("1 bytes after the last field".into()));
    }

    #[test]
    fn month_ends_are_the_next_month_start() {
        let jan = Level::Month.period_start(1_704_153_000_000);
        let feb = period_end(Level::Month, jan);
        assert_eq!(feb - jan, 31 * DAY_MS);
        assert_eq!(period_end(Level::Month, feb) - feb, 29 * DAY_MS); // 2024 is a leap year
        assert_eq!(period_end(Level::Day, jan), jan + DAY_MS);
    }

    proptest! {
        /// Any record survives encode → decode, and merging decoded parts equals the whole.
        #[test]
        fn decoded_parts_merge_to_the_whole(points in prop::collection::vec((0i64..100, -1e6f64..1e6, 0usize..3), 1..60)) {
            let names = ["a", "b", "c"];
            let mut whole = Record::new();
            let mut halves = [Record::new(), Record::new()];
            for (i, &(ts, v, f)) in points.iter().enumerate() {
                let name: FieldName = names[f].into();
                for r in [&mut whole, &mut halves[i % 2]] {
                    r.entry(name.clone()).and_modify(|a| a.add(ts, v)).or_insert(Exact::of(ts, v));
                }
            }
            let mut merged = Record::new();
            for h in &halves {
                merge_record(&mut merged, &decode_record(&encode_record(h).unwrap()).unwrap());
            }
            prop_assert_eq!(&merged, &whole);
            prop_assert_eq!(decode_record(&encode_record(&whole).unwrap()).unwrap(), whole);
        }
    }
}
