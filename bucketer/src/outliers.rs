//! Outlier devices: a device that writes far more readings in an hour than the rest (a 100 Hz
//! sensor beside devices at one reading a minute) would make its hour bucket huge — every merge
//! operand and every read rewrites it whole. Past [`StoreConfig::bucket_max_readings`] readings
//! in one hour the device is flagged as an outlier of its table, and from then on its hours
//! overflow into numbered sub-buckets, one per minute of the hour
//! ([`crate::keys::BucketKey::encode_slice`]); reads are unchanged.
//!
//! - Counting costs no read and bounded memory: `HourCounts` is a fixed table of
//!   (hour, count) slots indexed by (table, device) — a table's devices in consecutive slots
//!   from an offset hashed from the table — reset when a slot sees a newer
//!   hour. Collisions can only over-count, flagging a device early, never late.
//! - The flag is persisted (`registry` key [`crate::keys::outlier_key`]) in the WriteBatch of the
//!   readings that crossed the threshold, and loaded at open.
//! - Readings an outlier writes go to the sub-bucket of their minute, so each timestamp has one
//!   place from then on. Readings written before the flag stay in the hour's bucket; a reader
//!   merges the bucket and then the sub-buckets with last-write-wins per timestamp, and since
//!   every sub-bucket write came after the flag, a rewrite of an earlier timestamp wins, as it
//!   would in one bucket.

use std::collections::HashSet;

use crate::StoreConfig;

/// Sub-buckets an outlier's hour has at most: one per minute.
pub const SLICES_PER_HOUR: u8 = 60;

/// The sub-bucket of a reading at `ts` in the hour starting at `hour_start`.
pub fn slice_of(ts: i64, hour_start: i64) -> u8 {
    ((ts - hour_start) / 60_000).clamp(0, i64::from(SLICES_PER_HOUR) - 1) as u8
}

/// Slots of [`HourCounts`]: 8 MiB.
const SLOTS: usize = 1 << 20;

/// Readings per (table, device) in its current hour, approximately (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct HourCounts {
    /// (hour index, readings); allocated at the first count.
    slots: Vec<(i32, u32)>,
}

/// The slot of a (table, device): device ids are handed out in sequence, so a table's devices
/// take consecutive slots from an offset of the table's own (a hash of its id). A batch's
/// devices, visited in id order, then read the table front to back (a few cache lines a
/// thousand devices) instead of one random line each; a fleet larger than the table shares
/// slots as evenly as a hash would.
fn slot_of(table: u32, device: u64) -> usize {
    (device.wrapping_add(u64::from(table).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % SLOTS as u64) as usize
}

impl HourCounts {
    /// Adds `n` readings of `device` in `table` in hour `hour`; returns the count so far.
    pub(crate) fn add(&mut self, table: u32, device: u64, hour: i32, n: u32) -> u32 {
        if self.slots.is_empty() {
            self.slots = vec![(i32::MIN, 0); SLOTS];
        }
        let slot = &mut self.slots[slot_of(table, device)];
        if slot.0 != hour {
            if hour < slot.0 {
                // An older hour of a colliding device: counted apart would need memory; it is
                // not an outlier for this.
                return n;
            }
            *slot = (hour, 0);
        }
        slot.1 = slot.1.saturating_add(n);
        slot.1
    }
}

/// The outlier flags, by (table id, device id).
#[derive(Debug, Default)]
pub(crate) struct Outliers {
    pub(crate) flagged: HashSet<(u32, u64)>,
}

/// Whether `count` readings in an hour make a device an outlier.
pub(crate) fn over(cfg: &StoreConfig, count: u32) -> bool {
    u64::from(count) > cfg.bucket_max_readings
}

impl crate::Store {
    /// Number of sub-buckets `device` has in `table` for `hour` (0 when it is not an outlier
    /// there), for inspection and tests.
    pub fn sub_buckets(&self, table: &str, device: &str, hour: model::Hour) -> crate::Result<usize> {
        let (Some(ti), Some(dev)) = (self.table(table), self.device_id(device)) else {
            return Ok(0);
        };
        let hour_i32 = crate::keys::to_i32(hour.0).ok_or(crate::Error::TimeOutOfRange(hour.start_ms()))?;
        let partition = crate::keys::to_i32(ti.partition.index_of(hour.start_ms()))
            .ok_or(crate::Error::TimeOutOfRange(hour.start_ms()))?;
        let key = crate::keys::BucketKey { table: ti.id, partition, device: dev, hour: hour_i32 };
        self.flush_write_buffer()?;
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(key.encode().to_vec()));
        let mut n = 0;
        for item in self.db.iterator_cf_opt(
            crate::store::cf(&self.db, crate::store::CF_BUCKETS),
            opts,
            rocksdb::IteratorMode::Start,
        ) {
            let (k, _) = item.map_err(crate::db_err("scan sub-buckets"))?;
            n += usize::from(k.len() > crate::keys::BUCKET_KEY_LEN);
        }
        Ok(n)
    }
}

/// Adds to `wb` one `buckets` merge operand per minute of the hour starting at `hour_start`
/// that `readings` (sorted by time) fall in, each at the sub-bucket key of `key`; `buf` is
/// scratch. Returns the operands added.
pub(crate) fn merge_by_minute(
    wb: &mut rocksdb::WriteBatch,
    buckets: &rocksdb::ColumnFamily,
    key: crate::keys::BucketKey,
    hour_start: i64,
    (readings, version): (&[model::Reading], u32),
    buf: &mut Vec<u8>,
) -> u64 {
    let mut n = 0;
    for minute in readings.chunk_by(|a, b| slice_of(a.ts, hour_start) == slice_of(b.ts, hour_start)) {
        buf.clear();
        crate::codec::encode_versioned(minute, version, buf);
        wb.merge_cf(buckets, key.encode_slice(slice_of(minute[0].ts, hour_start)), &*buf);
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tables' fleets of consecutive device ids each count apart: no two series share a
    /// slot.
    #[test]
    fn consecutive_devices_of_two_tables_count_apart() {
        let mut c = HourCounts::default();
        for device in 0..100_000u64 {
            for table in [1u32, 2] {
                assert_eq!(c.add(table, device, 7, table), table, "table {table} device {device}");
            }
        }
        let mut slots: Vec<usize> = (0..100_000u64).flat_map(|d| [slot_of(1, d), slot_of(2, d)]).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 200_000);
    }

    #[test]
    fn counts_restart_each_hour_and_slices_are_minutes() {
        let mut c = HourCounts::default();
        assert_eq!(c.add(1, 7, 10, 5), 5);
        assert_eq!(c.add(1, 7, 10, 3), 8);
        assert_eq!(c.add(1, 7, 11, 2), 2, "a new hour starts over");
        assert_eq!(c.add(1, 7, 10, 4), 4, "an older hour is not counted into the newer one");
        assert_eq!(c.add(2, 7, 11, 1), 1, "another table is another device");
        assert_eq!(slice_of(3_600_000, 3_600_000), 0);
        assert_eq!(slice_of(3_600_000 + 59_999, 3_600_000), 0);
        assert_eq!(slice_of(3_600_000 + 60_000, 3_600_000), 1);
        assert_eq!(slice_of(7_199_999, 3_600_000), 59);
        assert_eq!(slice_of(-1, -3_600_000), 59);
    }
}
