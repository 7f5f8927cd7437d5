//! The table catalog: what a table is, how its definition is persisted, and which of its time
//! partitions have outlived the hot retention.
//!
//! A table has an id (the u32 that prefixes its keys, see [`crate::keys`]), a partition size and
//! an optional hot retention. It comes into being by [`Store::define_table`], or on the first
//! write to an unknown name with [`crate::StoreConfig::default_partition`] and no retention.
//! The whole catalog is held in memory (loaded at open); a name becomes visible only once its
//! entry is durable.
//!
//! # Persisted layout (`catalog` column family)
//!
//! Keys are in [`crate::keys`]: `b'n'` · name → definition, `b'i'` · id u32 → name bytes. (The
//! same column family holds one more key, `b'w'` → the largest event time stored, owned by
//! [`crate::rollups`].) The definition value:
//!
//! | version | length | bytes |
//! |---------|--------|-------|
//! | 1       | 5 B    | id u32 BE · partition code u8 |
//! | 2       | 14 B   | `2` u8 · id u32 BE · partition code u8 · hot retention ms u64 BE (0 = keep forever) |
//!
//! Version 1 was written before definitions carried a version byte and is recognised by its
//! length; every later version starts with its version byte and is never 5 bytes long, so the
//! two cannot be confused. Readers accept every version; a version-1 table keeps its data
//! forever. Partition codes are [`model::PartitionSize::code`]. These bytes are a persisted
//! format, kept apart from the runtime [`TableInfo`]: changing them means a new version.
//!
//! # Retention
//!
//! A partition of a table with hot retention `r` has expired at time `now` once its end is at or
//! before `now - r` ([`first_kept_partition`]). [`Store::drop_expired_partitions`] removes each
//! expired partition that holds data with one range delete over its `buckets` key range, all of
//! them in one WriteBatch. It finds those partitions by seeking from one partition prefix to the
//! next, one seek per partition with data, so a table whose data is sparse in time costs no more
//! than a dense one. Latest values (`latest`) stay: they are each device's newest reading, not a
//! partition's data. No archive exists yet, so a dropped partition is gone for good; RocksDB
//! reclaims its disk space as compaction passes over the range tombstone.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use model::PartitionSize;
use rocksdb::{ReadOptions, WriteBatch, WriteOptions, DB};

use crate::store::{cf, CF_BUCKETS, CF_CATALOG};
use crate::{db_err, keys, read, write, Error, Result, Store};

/// A table as the catalog knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    /// Id used in keys.
    pub id: u32,
    /// Partition size.
    pub partition: PartitionSize,
    /// How long a partition stays in RocksDB after its end, in milliseconds (1 to `i64::MAX`);
    /// `None` keeps data forever.
    pub hot_retention_ms: Option<u64>,
}

/// A named table's definition, as [`Store::define_table`] and [`Store::table_definition`]
/// answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDefinition {
    /// Table name.
    pub name: String,
    /// Id used in keys.
    pub id: u32,
    /// Partition size.
    pub partition: PartitionSize,
    /// Hot retention in milliseconds; `None` keeps data forever.
    pub hot_retention_ms: Option<u64>,
}

impl TableDefinition {
    fn new(name: &str, ti: TableInfo) -> TableDefinition {
        TableDefinition {
            name: name.to_string(),
            id: ti.id,
            partition: ti.partition,
            hot_retention_ms: ti.hot_retention_ms,
        }
    }
}

/// A table's settings in words, for error messages: `partition day, hot retention 30d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Partition size.
    pub partition: PartitionSize,
    /// Hot retention in milliseconds; `None` keeps data forever.
    pub hot_retention_ms: Option<u64>,
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hot_retention_ms {
            Some(ms) => write!(f, "partition {}, hot retention {}", self.partition, model::format_duration_ms(ms)),
            None => write!(f, "partition {}, no hot retention (kept forever)", self.partition),
        }
    }
}

/// The catalog held in memory.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) by_name: HashMap<Arc<str>, TableInfo>,
}

impl Catalog {
    /// The id the next new table gets: ids are dense from 1, in order of creation.
    pub(crate) fn next_id(&self) -> Result<u32> {
        u32::try_from(self.by_name.len()).ok().and_then(|n| n.checked_add(1)).ok_or(Error::IdsExhausted("table"))
    }
}

/// Version byte of the current definition layout.
const DEFINITION_V2: u8 = 2;
/// Length of a version-1 (unversioned) definition.
const DEFINITION_V1_LEN: usize = 5;
/// Length of a version-2 definition.
const DEFINITION_V2_LEN: usize = 14;

/// The catalog value of a definition, in the current layout (version 2).
pub fn encode_definition(ti: TableInfo) -> [u8; DEFINITION_V2_LEN] {
    let mut v = [0u8; DEFINITION_V2_LEN];
    v[0] = DEFINITION_V2;
    v[1..5].copy_from_slice(&ti.id.to_be_bytes());
    v[5] = ti.partition.code();
    v[6..14].copy_from_slice(&ti.hot_retention_ms.unwrap_or(0).to_be_bytes());
    v
}

/// Decodes a catalog value of any version; the error says what is wrong.
pub fn decode_definition(v: &[u8]) -> Result<TableInfo, String> {
    let partition = |code: u8| PartitionSize::from_code(code).ok_or_else(|| format!("unknown partition code {code}"));
    match (v.len(), v.first()) {
        (DEFINITION_V1_LEN, _) => Ok(TableInfo {
            id: u32::from_be_bytes([v[0], v[1], v[2], v[3]]),
            partition: partition(v[4])?,
            hot_retention_ms: None,
        }),
        (DEFINITION_V2_LEN, Some(&DEFINITION_V2)) => {
            let mut retention = [0u8; 8];
            retention.copy_from_slice(&v[6..14]);
            let retention = u64::from_be_bytes(retention);
            if retention > i64::MAX as u64 {
                return Err(format!("hot retention {retention} ms is out of range"));
            }
            Ok(TableInfo {
                id: u32::from_be_bytes([v[1], v[2], v[3], v[4]]),
                partition: partition(v[5])?,
                hot_retention_ms: (retention != 0).then_some(retention),
            })
        }
        (len, Some(version)) => Err(format!("unknown version {version} ({len} bytes)")),
        (_, None) => Err("empty value".to_string()),
    }
}

/// Reads every table definition of the `catalog` column family.
pub(crate) fn load(db: &DB) -> Result<Catalog> {
    let mut catalog = Catalog::default();
    for item in db.prefix_iterator_cf(cf(db, CF_CATALOG), [keys::NAME_PREFIX]) {
        let (k, v) = item.map_err(db_err("load catalog"))?;
        if k.first() != Some(&keys::NAME_PREFIX) {
            break;
        }
        let corrupt = |detail: String| Error::Corrupt { what: "catalog entry", detail };
        let name = std::str::from_utf8(&k[1..]).map_err(|_| corrupt("table name is not UTF-8".into()))?;
        let ti = decode_definition(&v).map_err(|e| corrupt(format!("table `{name}`: {e}")))?;
        catalog.by_name.insert(name.into(), ti);
    }
    Ok(catalog)
}

/// Puts a new table's two catalog entries (name → definition, id → name) into `wb`.
pub(crate) fn put_table(db: &DB, wb: &mut WriteBatch, name: &str, ti: TableInfo) {
    wb.put_cf(cf(db, CF_CATALOG), keys::name_key(name), encode_definition(ti));
    wb.put_cf(cf(db, CF_CATALOG), keys::table_id_key(ti.id), name.as_bytes());
}

/// The oldest partition index that a hot retention of `retention_ms` keeps at `now_ms`; every
/// partition before it has expired.
///
/// A partition expires once its end is at or before the cutoff `now_ms - retention_ms`. The
/// partition holding the cutoff ends after it, so it is the first one kept; the one before it
/// ends at its start, at or before the cutoff. Saturates instead of overflowing.
pub fn first_kept_partition(size: PartitionSize, now_ms: i64, retention_ms: u64) -> i64 {
    let retention = i64::try_from(retention_ms).unwrap_or(i64::MAX);
    size.index_of(now_ms.saturating_sub(retention))
}

impl Store {
    /// Creates table `name` with a partition size and a hot retention in milliseconds (`None`:
    /// keep forever), durably (WAL synced), and returns its definition and whether this call
    /// created it. A table that exists with the same settings is left as it is (the call is
    /// idempotent); one with other settings is [`Error::TableExists`]. A retention of 0 or above
    /// `i64::MAX` ms, or an empty name, is [`Error::InvalidTable`].
    pub fn define_table(
        &self,
        name: &str,
        partition: PartitionSize,
        hot_retention_ms: Option<u64>,
    ) -> Result<(TableDefinition, bool)> {
        let invalid = |detail: &str| Error::InvalidTable { name: name.to_string(), detail: detail.to_string() };
        if name.is_empty() {
            return Err(invalid("the name is empty"));
        }
        if hot_retention_ms.is_some_and(|ms| ms == 0 || ms > i64::MAX as u64) {
            return Err(invalid("the hot retention must be from 1 to 2^63-1 milliseconds"));
        }
        // The write lock orders this against writers, which also create tables.
        let _writer = self.write_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let requested = Settings { partition, hot_retention_ms };
        let id = {
            let catalog = read(&self.catalog);
            if let Some(ti) = catalog.by_name.get(name) {
                let existing = Settings { partition: ti.partition, hot_retention_ms: ti.hot_retention_ms };
                if existing == requested {
                    return Ok((TableDefinition::new(name, *ti), false));
                }
                return Err(Error::TableExists { name: name.to_string(), existing, requested });
            }
            catalog.next_id()?
        };
        let ti = TableInfo { id, partition, hot_retention_ms };
        let mut wb = WriteBatch::default();
        put_table(&self.db, &mut wb, name, ti);
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(wb, &wo).map_err(db_err("write table definition"))?;
        write(&self.catalog).by_name.insert(name.into(), ti);
        Ok((TableDefinition::new(name, ti), true))
    }

    /// The definition of table `name`, if it exists.
    pub fn table_definition(&self, name: &str) -> Option<TableDefinition> {
        self.table(name).map(|ti| TableDefinition::new(name, ti))
    }

    /// Removes every partition that has expired at `now_ms` (epoch ms) from each table with a hot
    /// retention, one range delete per partition, all in one WriteBatch; returns the (table,
    /// partition index) pairs dropped, by table name and then oldest first. Only partitions
    /// holding data are found and dropped, so a second call at the same `now_ms` drops nothing.
    ///
    /// Without an archive (a later issue) this deletes the readings for good. Latest values
    /// stay. Partition index `i32::MAX` (some 245,000 years after 1970) is never dropped.
    pub fn drop_expired_partitions(&self, now_ms: i64) -> Result<Vec<(String, i64)>> {
        let mut tables: Vec<(Arc<str>, TableInfo)> = read(&self.catalog)
            .by_name
            .iter()
            .filter(|(_, ti)| ti.hot_retention_ms.is_some())
            .map(|(name, ti)| (name.clone(), *ti))
            .collect();
        tables.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut wb = WriteBatch::default();
        let mut dropped = Vec::new();
        for (name, ti) in tables {
            let Some(retention) = ti.hot_retention_ms else { continue };
            let first_kept = first_kept_partition(ti.partition, now_ms, retention);
            for partition in self.partitions_with_data(ti.id, first_kept)? {
                let Some((from, to)) = keys::partition_range(ti.id, partition) else { continue };
                wb.delete_range_cf(cf(&self.db, CF_BUCKETS), from, to);
                dropped.push((name.to_string(), i64::from(partition)));
            }
        }
        if !dropped.is_empty() {
            self.db.write(wb).map_err(db_err("drop expired partitions"))?;
        }
        Ok(dropped)
    }

    /// The partitions of table `table` below index `end` that hold at least one bucket, oldest
    /// first: one seek per partition found (plus the one that finds no more).
    fn partitions_with_data(&self, table: u32, end: i64) -> Result<Vec<i32>> {
        // Partition i32::MAX has no range of its own (see `keys::partition_range`): never dropped.
        let end = i32::try_from(end.clamp(i64::from(i32::MIN), i64::from(i32::MAX))).unwrap_or(i32::MAX);
        if end == i32::MIN {
            return Ok(Vec::new());
        }
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(keys::partition_prefix(table, end).to_vec());
        let mut it = self.db.raw_iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts);
        let mut found = Vec::new();
        it.seek(keys::partition_prefix(table, i32::MIN));
        while let Some(k) = it.key() {
            let (t, partition) = keys::partition_of(k)
                .ok_or_else(|| Error::Corrupt { what: "bucket key", detail: format!("{} bytes", k.len()) })?;
            if t != table {
                break;
            }
            found.push(partition);
            // `partition < end <= i32::MAX`, so the next prefix exists.
            let Some(next) = partition.checked_add(1) else { break };
            it.seek(keys::partition_prefix(table, next));
        }
        it.status().map_err(db_err("seek partitions"))?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use model::{DeviceReading, Reading, TimeRange, DAY_MS, HOUR_MS};
    use proptest::prelude::*;

    #[test]
    fn version_1_definitions_still_decode() {
        let v1 = [0, 0, 1, 2, PartitionSize::Month.code()];
        assert_eq!(
            decode_definition(&v1),
            Ok(TableInfo { id: 258, partition: PartitionSize::Month, hot_retention_ms: None })
        );
        assert_eq!(decode_definition(&[0, 0, 0, 1, 9]), Err("unknown partition code 9".to_string()));
    }

    #[test]
    fn version_2_layout_is_as_documented() {
        let ti = TableInfo { id: 0x0102_0304, partition: PartitionSize::Hour, hot_retention_ms: Some(7_200_000) };
        let v = encode_definition(ti);
        assert_eq!(v, [2, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0x6d, 0xdd, 0]);
        assert_eq!(decode_definition(&v), Ok(ti));
        let forever = TableInfo { hot_retention_ms: None, ..ti };
        assert_eq!(&encode_definition(forever)[6..], &[0; 8]);
        assert_eq!(decode_definition(&encode_definition(forever)), Ok(forever));
        assert_eq!(decode_definition(&[3; 14]), Err("unknown version 3 (14 bytes)".to_string()));
        assert_eq!(decode_definition(&[2; 9]), Err("unknown version 2 (9 bytes)".to_string()));
        assert_eq!(decode_definition(&[]), Err("empty value".to_string()));
    }

    #[test]
    fn first_kept_partition_examples() {
        // 2024-01-04T00:00Z is day 19726. With a 2-day retention the cutoff is 2024-01-02T00:00Z:
        // day 19723 (Jan 1) ended exactly at the cutoff and has expired; Jan 2 is kept.
        let jan4 = 19_726 * DAY_MS;
        assert_eq!(first_kept_partition(PartitionSize::Day, jan4, 2 * DAY_MS as u64), 19_724);
        // One millisecond earlier, Jan 1 still ends after the cutoff.
        assert_eq!(first_kept_partition(PartitionSize::Day, jan4 - 1, 2 * DAY_MS as u64), 19_723);
        assert_eq!(first_kept_partition(PartitionSize::Hour, 10 * HOUR_MS + 1, 3 * HOUR_MS as u64), 7);
        // Extremes saturate.
        assert_eq!(first_kept_partition(PartitionSize::Hour, i64::MIN, i64::MAX as u64), i64::MIN.div_euclid(HOUR_MS));
    }

    proptest! {
        /// `first_kept_partition` agrees with the definition: a partition has expired exactly
        /// when its end is at or before `now - retention`.
        #[test]
        fn first_kept_partition_matches_the_definition(
            now in -4_000_000_000_000i64..4_000_000_000_000,
            retention in 1u64..200 * DAY_MS as u64,
            offset in -3i64..3,
        ) {
            for size in [PartitionSize::Hour, PartitionSize::Day, PartitionSize::Month] {
                let first_kept = first_kept_partition(size, now, retention);
                let p = first_kept + offset;
                let expired = size.start_ms(p + 1) <= now - retention as i64;
                prop_assert_eq!(expired, p < first_kept, "{} partition {}", size, p);
            }
        }
    }

    /// A database written by the first release (5-byte catalog values) opens with its tables
    /// intact, kept forever, and new tables continue the id sequence.
    #[test]
    fn a_version_1_catalog_loads() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = crate::store::open(dir.path(), &crate::DbOptions::default()).unwrap();
            let h = cf(&db, CF_CATALOG);
            db.put_cf(h, keys::name_key("old.hourly"), [0, 0, 0, 1, PartitionSize::Hour.code()]).unwrap();
            db.put_cf(h, keys::table_id_key(1), b"old.hourly").unwrap();
            db.put_cf(h, keys::name_key("old.daily"), [0, 0, 0, 2, PartitionSize::Day.code()]).unwrap();
            db.put_cf(h, keys::table_id_key(2), b"old.daily").unwrap();
        }
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        assert_eq!(
            store.table_definition("old.hourly"),
            Some(TableDefinition {
                name: "old.hourly".into(),
                id: 1,
                partition: PartitionSize::Hour,
                hot_retention_ms: None
            })
        );
        assert_eq!(
            store.table("old.daily"),
            Some(TableInfo { id: 2, partition: PartitionSize::Day, hot_retention_ms: None })
        );
        // Same settings: accepted, unchanged; other settings: refused.
        let (def, created) = store.define_table("old.hourly", PartitionSize::Hour, None).unwrap();
        assert_eq!((def.id, created), (1, false));
        assert!(matches!(
            store.define_table("old.hourly", PartitionSize::Hour, Some(1000)),
            Err(Error::TableExists { .. })
        ));
        // Old tables read and write as before; a new table takes id 3.
        let r = DeviceReading {
            table: "old.hourly".into(),
            device: "d".into(),
            reading: Reading::new(5 * HOUR_MS, vec![("x".into(), 1.5)]),
        };
        store.write(vec![r.clone()], &[]).unwrap();
        let back = store.read_range("old.hourly", "d", TimeRange::new(0, 10 * HOUR_MS).unwrap()).unwrap();
        assert_eq!(back, Some(vec![r.reading]));
        let (def, created) = store.define_table("new.one", PartitionSize::Month, Some(60_000)).unwrap();
        assert_eq!((def.id, created), (3, true));
        // Nothing old expires: version-1 tables have no retention.
        assert_eq!(store.drop_expired_partitions(i64::MAX).unwrap(), Vec::<(String, i64)>::new());
        drop(store);
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        assert_eq!(store.tables(), ["new.one", "old.daily", "old.hourly"]);
        assert_eq!(store.table("new.one").map(|t| (t.id, t.hot_retention_ms)), Some((3, Some(60_000))));
    }
}
