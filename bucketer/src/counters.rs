//! Approximate message counters per table and hour (approximation pattern).
//!
//! Counting every message with its own write would add a RocksDB operation per message for a
//! figure dashboards read as a trend. Instead [`Store::count_messages`] adds to a counter in
//! memory, and the counts are written as `u64` add operands (merge operator, `counters`
//! column family, keys [`crate::keys::counter_key`]: table · wall-clock hour of receipt) with
//! the next write batch once [`StoreConfig::counter_flush_messages`] messages or
//! [`StoreConfig::counter_flush_interval`] have passed, and on [`Store::flush`] (every ordered
//! shutdown). [`Store::message_counts`] reports stored plus pending counts.
//!
//! The error, which exact roll-ups do not have: a crash loses the counts not yet written (at
//! most `counter_flush_messages` messages, or `counter_flush_interval` worth), and a message
//! the broker redelivers after a crash (stored once, since replays are idempotent) is counted
//! again if its count was written before the crash. A message counts once per table it has
//! stored readings in; a message whose readings were all rejected counts nowhere.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use model::{Hour, TimeRange};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::keys;
use crate::store::{cf, CF_COUNTERS};
use crate::{db_err, read, Error, Result, Store, StoreConfig};

/// Counts not yet written: (table, hour start ms) → messages.
#[derive(Debug)]
pub(crate) struct PendingCounts {
    counts: HashMap<(Arc<str>, i64), u64>,
    total: u64,
    since: Instant,
}

impl Default for PendingCounts {
    fn default() -> Self {
        PendingCounts { counts: HashMap::new(), total: 0, since: Instant::now() }
    }
}

impl PendingCounts {
    fn due(&self, cfg: &StoreConfig) -> bool {
        self.total > 0
            && (self.total >= cfg.counter_flush_messages || self.since.elapsed() >= cfg.counter_flush_interval)
    }
}

/// The value of one counter operand or sum.
fn decode_count(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

/// Merge operator of `counters`: the sum of the stored value and the operands (saturating).
pub(crate) fn add_merge<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<Vec<u8>> {
    let mut sum = 0u64;
    for v in values {
        match decode_count(v) {
            Some(n) => sum = sum.saturating_add(n),
            None => {
                tracing::error!(bytes = v.len(), "corrupt message counter operand");
                return None;
            }
        }
    }
    Some(sum.to_be_bytes().to_vec())
}

impl Store {
    /// Counts `n` messages received for `table` at wall-clock time `now_ms`, in memory until a
    /// later write batch writes them (see the module docs).
    pub fn count_messages(&self, table: &Arc<str>, n: u64, now_ms: i64) {
        let mut p = self.pending_counts.lock().unwrap_or_else(PoisonError::into_inner);
        if p.total == 0 {
            p.since = Instant::now();
        }
        *p.counts.entry((table.clone(), Hour::of(now_ms).start_ms())).or_default() += n;
        p.total += n;
    }

    /// Puts the pending counts into `wb` when they are due (or `force`), resolving table names
    /// with `table_id`; counts of a table it does not know are dropped.
    pub(crate) fn put_pending_counts(&self, wb: &mut WriteBatch, force: bool, table_id: impl Fn(&str) -> Option<u32>) {
        let mut p = self.pending_counts.lock().unwrap_or_else(PoisonError::into_inner);
        if p.total == 0 || !(force || p.due(&self.cfg)) {
            return;
        }
        let taken = std::mem::take(&mut *p);
        drop(p);
        for ((table, hour_ms), n) in taken.counts {
            let (Some(id), Some(hour)) = (table_id(&table), keys::to_i32(Hour::of(hour_ms).0)) else {
                continue;
            };
            wb.merge_cf(cf(&self.db, CF_COUNTERS), keys::counter_key(id, hour), n.to_be_bytes());
        }
    }

    /// Writes the pending counts now (part of [`Store::flush`]).
    pub(crate) fn flush_message_counts(&self) -> Result<()> {
        let mut wb = WriteBatch::default();
        {
            let catalog = read(&self.catalog);
            self.put_pending_counts(&mut wb, true, |t| catalog.by_name.get(t).map(|ti| ti.id));
        }
        if wb.is_empty() {
            return Ok(());
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        self.db.write_opt(wb, &wo).map_err(db_err("write message counts"))
    }

    /// Approximate messages received for `table` per wall-clock hour that meets `range` (so
    /// also the hour `range` starts in, from its start), stored plus pending, in time order;
    /// `None` when the table is unknown.
    pub fn message_counts(&self, table: &str, range: TimeRange) -> Result<Option<Vec<(i64, u64)>>> {
        let Some(ti) = self.table(table) else {
            return Ok(None);
        };
        let hour_key = |ms: i64| keys::to_i32(Hour::of(ms).0).map(|h| keys::counter_key(ti.id, h));
        let mut out: std::collections::BTreeMap<i64, u64> = Default::default();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(hour_key(range.start).unwrap_or(keys::counter_key(ti.id, i32::MIN)).to_vec());
        let end = Hour::of(range.end - 1).end_ms();
        opts.set_iterate_upper_bound(
            hour_key(end).unwrap_or(keys::counter_key(ti.id.saturating_add(1), i32::MIN)).to_vec(),
        );
        for item in self.db.iterator_cf_opt(cf(&self.db, CF_COUNTERS), opts, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan message counters"))?;
            let (_, hour) = keys::decode_counter_key(&k)
                .ok_or_else(|| Error::Corrupt { what: "message counter key", detail: format!("{} bytes", k.len()) })?;
            let n = decode_count(&v)
                .ok_or_else(|| Error::Corrupt { what: "message counter", detail: format!("{} bytes", v.len()) })?;
            out.insert(Hour(i64::from(hour)).start_ms(), n);
        }
        let p = self.pending_counts.lock().unwrap_or_else(PoisonError::into_inner);
        for ((t, hour_ms), n) in &p.counts {
            if &**t == table && *hour_ms >= Hour::of(range.start).start_ms() && *hour_ms < range.end {
                *out.entry(*hour_ms).or_default() += n;
            }
        }
        Ok(Some(out.into_iter().filter(|(h, _)| *h < range.end && *h + model::HOUR_MS > range.start).collect()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use model::{DeviceReading, Reading, HOUR_MS};

    const T: &str = "count.test";
    const H0: i64 = 1_704_153_600_000;

    fn store(dir: &std::path::Path) -> Store {
        let cfg = StoreConfig {
            counter_flush_messages: 1000,
            counter_flush_interval: std::time::Duration::from_secs(3600),
            ..StoreConfig::default()
        };
        Store::open(dir, cfg).unwrap()
    }

    fn write_one(store: &Store, ts: i64) {
        let r =
            DeviceReading { table: T.into(), device: "d".into(), reading: Reading::new(ts, vec![("x".into(), 1.0)]) };
        store.write(vec![r], &[]).unwrap();
    }

    #[test]
    fn counts_are_written_in_batches_and_a_crash_loses_only_the_pending_ones() {
        let dir = tempfile::tempdir().unwrap();
        let range = TimeRange::new(H0 - HOUR_MS, H0 + 3 * HOUR_MS).unwrap();
        {
            let store = store(dir.path());
            write_one(&store, 0);
            let table: Arc<str> = T.into();
            // 2,500 messages over two wall-clock hours, a write batch every 100.
            for i in 0..2500 {
                store.count_messages(&table, 1, H0 + if i < 1500 { 5 } else { HOUR_MS + 5 });
                if i % 100 == 99 {
                    write_one(&store, i);
                }
            }
            assert_eq!(store.message_counts(T, range).unwrap(), Some(vec![(H0, 1500), (H0 + HOUR_MS, 1000)]));
            assert_eq!(store.message_counts("no.such", range).unwrap(), None);
            // Dropped without a flush, as by a crash.
        }
        {
            let store = store(dir.path());
            // Written with the batches after the 1,000th and the 2,000th message; the last 500 lost.
            assert_eq!(store.message_counts(T, range).unwrap(), Some(vec![(H0, 1500), (H0 + HOUR_MS, 500)]));
            let table: Arc<str> = T.into();
            store.count_messages(&table, 7, H0 + 2 * HOUR_MS);
            store.flush().unwrap();
        }
        let store = store(dir.path());
        let got = store.message_counts(T, range).unwrap().unwrap();
        assert_eq!(got, [(H0, 1500), (H0 + HOUR_MS, 500), (H0 + 2 * HOUR_MS, 7)]);
        // Only the hours whose span meets the range.
        let one = TimeRange::new(H0 + HOUR_MS + 10, H0 + HOUR_MS + 20).unwrap();
        assert_eq!(store.message_counts(T, one).unwrap(), Some(vec![(H0 + HOUR_MS, 500)]));
    }

    #[test]
    fn the_merge_adds_and_refuses_corrupt_operands() {
        let ops = [5u64.to_be_bytes(), 7u64.to_be_bytes()];
        assert_eq!(add_merge(ops.iter().map(|o| &o[..])), Some(12u64.to_be_bytes().to_vec()));
        assert_eq!(add_merge([&[1u8, 2][..]].into_iter()), None);
        assert_eq!(
            add_merge([&u64::MAX.to_be_bytes()[..], &1u64.to_be_bytes()[..]].into_iter()),
            Some(u64::MAX.to_be_bytes().to_vec())
        );
    }
}
