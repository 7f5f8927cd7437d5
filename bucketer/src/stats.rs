//! What the store can tell an operator: a commit-latency histogram kept in atomics, and the
//! RocksDB properties worth watching, read on demand.
//!
//! Exposition (Prometheus text, HTTP) is not done here: the query service reads
//! [`crate::StoreStats`] and [`crate::Store::db_stats`] and formats them. This module only
//! collects numbers, so the write path pays a few relaxed atomic adds per commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rocksdb::properties::{self, PropName};

use crate::store::{cf, ALL_CFS};
use crate::{db_err, Result, Store};

/// Upper bounds (inclusive) of the commit-latency buckets, in microseconds: 100 µs to 10 s.
/// An observation above the last bound lands in the overflow (`+Inf`) bucket.
pub const COMMIT_LATENCY_BOUNDS_MICROS: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// A histogram of durations with the fixed buckets of [`COMMIT_LATENCY_BOUNDS_MICROS`], safe
/// to update from one thread while others read it.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket, not cumulative; the last one is the overflow bucket.
    counts: [AtomicU64; COMMIT_LATENCY_BOUNDS_MICROS.len() + 1],
    /// Sum of all observations, nanoseconds.
    sum_nanos: AtomicU64,
}

/// A copy of a [`LatencyHistogram`] at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations in this bucket)`, not cumulative, ascending; the
    /// last bound is `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
    /// Number of observations (the sum of the bucket counts).
    pub count: u64,
    /// Sum of the observations, seconds.
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = COMMIT_LATENCY_BOUNDS_MICROS.partition_point(|&bound| bound < micros);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The current counts. Each bucket is read on its own, so a snapshot taken during a commit
    /// may miss that one observation; `count` always equals the sum of the buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = COMMIT_LATENCY_BOUNDS_MICROS
            .iter()
            .map(|&b| b as f64 / 1e6)
            .chain([f64::INFINITY])
            .zip(&self.counts)
            .map(|(bound, c)| (bound, c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        HistogramSnapshot { buckets, count, sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9 }
    }
}

/// RocksDB figures of one column family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CfStats {
    /// Column family name (`buckets`, `latest`, ...).
    pub name: &'static str,
    /// Bytes compaction still has to rewrite to bring levels within their targets
    /// (`rocksdb.estimate-pending-compaction-bytes`); RocksDB slows then stops writes as it
    /// grows.
    pub pending_compaction_bytes: u64,
    /// Bytes in active and immutable memtables (`rocksdb.cur-size-all-mem-tables`).
    pub memtable_bytes: u64,
    /// Bytes of the SST files of the current version (`rocksdb.live-sst-files-size`).
    pub live_sst_bytes: u64,
    /// SST files in level 0 (`rocksdb.num-files-at-level0`); many of them slow reads and
    /// trigger write stalls.
    pub l0_files: u64,
    /// Estimated number of keys (`rocksdb.estimate-num-keys`).
    pub estimated_keys: u64,
}

/// RocksDB figures of the whole database and of each column family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbStats {
    /// One entry per column family, in [`crate::store::ALL_CFS`] order.
    pub column_families: Vec<CfStats>,
    /// Compactions running now.
    pub running_compactions: u64,
    /// Memtable flushes running now.
    pub running_flushes: u64,
    /// Background errors since open; a non-zero count usually means writes are refused.
    pub background_errors: u64,
    /// 1 while RocksDB stops writes (a write stall), else 0.
    pub write_stopped: u64,
    /// Bytes of the shared block cache in use.
    pub block_cache_bytes: u64,
}

impl Store {
    /// Reads the RocksDB properties of [`DbStats`]. Each is a cheap in-memory lookup; a
    /// property RocksDB does not report reads as 0.
    pub fn db_stats(&self) -> Result<DbStats> {
        let db_int = |name: &PropName| -> Result<u64> {
            self.db.property_int_value(name).map_err(db_err("read property")).map(|v| v.unwrap_or(0))
        };
        let mut column_families = Vec::with_capacity(ALL_CFS.len());
        for name in ALL_CFS {
            let h = cf(&self.db, name);
            let int = |prop: &str| -> Result<u64> {
                self.db.property_int_value_cf(h, prop).map_err(db_err("read property")).map(|v| v.unwrap_or(0))
            };
            column_families.push(CfStats {
                name,
                pending_compaction_bytes: int("rocksdb.estimate-pending-compaction-bytes")?,
                memtable_bytes: int("rocksdb.cur-size-all-mem-tables")?,
                live_sst_bytes: int("rocksdb.live-sst-files-size")?,
                l0_files: int("rocksdb.num-files-at-level0")?,
                estimated_keys: int("rocksdb.estimate-num-keys")?,
            });
        }
        // One block cache is shared by every column family; any of them reports it.
        let block_cache_bytes = self
            .db
            .property_int_value_cf(cf(&self.db, crate::store::CF_BUCKETS), properties::BLOCK_CACHE_USAGE)
            .map_err(db_err("read property"))?
            .unwrap_or(0);
        Ok(DbStats {
            column_families,
            running_compactions: db_int(properties::NUM_RUNNING_COMPACTIONS)?,
            running_flushes: db_int(properties::NUM_RUNNING_FLUSHES)?,
            background_errors: db_int(properties::BACKGROUND_ERRORS)?,
            write_stopped: db_int(properties::IS_WRITE_STOPPED)?,
            block_cache_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::StoreConfig;
    use model::{DeadLetter, DeadLetterReason, DeviceReading, Reading};

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let h = LatencyHistogram::default();
        for micros in [0, 100, 101, 250, 9_999_999, 10_000_000, 10_000_001, u64::MAX / 1000] {
            h.observe(Duration::from_micros(micros));
        }
        let s = h.snapshot();
        assert_eq!(s.count, 8);
        assert_eq!(s.buckets.len(), COMMIT_LATENCY_BOUNDS_MICROS.len() + 1);
        let counts: Vec<u64> = s.buckets.iter().map(|b| b.1).collect();
        // 0 and 100 µs → ≤100 µs; 101 and 250 → ≤250 µs; 9.999999 and 10 s → ≤10 s; the rest +Inf.
        assert_eq!(counts, [2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2]);
        assert_eq!(s.buckets[0].0, 0.0001);
        assert_eq!(s.buckets[15].0, 10.0);
        assert_eq!(s.buckets[16].0, f64::INFINITY);
    }

    #[test]
    fn every_commit_is_timed_once_and_db_stats_name_every_column_family() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(store.stats().commit_latency.snapshot().count, 0);
        for i in 0..7 {
            let r = DeviceReading {
                table: "t".into(),
                device: "d".into(),
                reading: Reading::new(i * 1000, vec![("x".into(), i as f64)]),
            };
            store.write(vec![r], &[]).unwrap();
        }
        let dl = DeadLetter {
            received_ms: 5,
            reason: DeadLetterReason::NoFields,
            detail: "no fields".into(),
            source: "hourglass/t/d".into(),
            payload: b"{}".to_vec(),
        };
        store.write(Vec::new(), &[dl]).unwrap();
        let s = store.stats().commit_latency.snapshot();
        assert_eq!(s.count, 8);
        assert!(s.sum_seconds > 0.0);

        let db = store.db_stats().unwrap();
        let names: Vec<&str> = db.column_families.iter().map(|c| c.name).collect();
        assert_eq!(names, ALL_CFS);
        let buckets = &db.column_families[0];
        assert!(buckets.memtable_bytes > 0, "{buckets:?}");
        assert_eq!(buckets.live_sst_bytes, 0, "nothing flushed yet");
        assert_eq!(db.background_errors, 0);
        assert_eq!(db.write_stopped, 0);
        store.flush().unwrap();
        let db = store.db_stats().unwrap();
        assert!(db.column_families[0].live_sst_bytes > 0, "{db:?}");
    }
}
