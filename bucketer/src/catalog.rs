//! The table catalog: what a table is, how its definition is persisted, and which of its time
//! partitions have outlived the hot retention.
//!
//! A table has an id (the u32 that prefixes its keys, see [`crate::keys`]), a partition size, an
//! optional hot retention and an optional cold retention, and may keep its roll-ups for a while
//! only ([`RollupRetention`]: besides declared fields, the one setting a later definition
//! changes). It comes into being by [`Store::define_table`], or on the first write to an
//! unknown name with [`crate::StoreConfig::default_partition`] and no retention.
//! The whole catalog is held in memory (loaded at open); a name becomes visible only once its
//! entry is durable.
//!
//! # Persisted layout (`catalog` column family)
//!
//! Keys are in [`crate::keys`]: `b'n'` · name → definition, `b'i'` · id u32 → name bytes, and
//! `b'f'` · id u32 → the table's roll-up floor, if it has one ([`crate::rollups::RollupFloor`],
//! written with the definition that sets it). (The same column family holds the partitions
//! deleted for good, and `b'w'` → the largest event time stored, owned by [`crate::rollups`].)
//! The definition value:
//!
//! | version | length | bytes |
//! |---------|--------|-------|
//! | 1       | 5 B    | id u32 BE · partition code u8 |
//! | 2       | 14 B   | `2` u8 · id u32 BE · partition code u8 · hot retention ms u64 BE (0 = keep forever) |
//! | 3       | 23 B and more | `3` u8 · id u32 BE · partition code u8 · hot retention ms u64 BE · flags u8 (bit 0: strict; others 0) · schema version u32 BE · field count u32 BE · per field, ascending by name: type code u8 ([`model::FieldType::code`]) · version that added it u32 BE · name length u16 BE · name (UTF-8) |
//! | 4       | 31 B and more | as version 3 with cold retention ms u64 BE (0 = none) after the hot retention |
//! | 5       | 47 B and more | as version 4 with, after the cold retention, the roll-ups' hour retention ms u64 BE and day retention ms u64 BE (0 = kept forever; [`RollupRetention`]) |
//!
//! Version 1 was written before definitions carried a version byte and is recognised by its
//! length; every later version starts with its version byte and is never 5 bytes long, so the
//! two cannot be confused. Readers accept every version; a version-1 table keeps its data
//! forever, and a version-1 or -2 table has the empty, non-strict schema of version 0 (its
//! fields are added by the first writes that name them; buckets written before then describe
//! their own fields, see [`crate::codec`]); a table of version 1 to 3 has no cold retention,
//! and one of version 1 to 4 keeps its roll-ups forever. Version 5 is written for a table with a
//! roll-up retention, version 4 for every other (so a store that uses none still opens in a
//! build from before version 5). Partition codes are [`model::PartitionSize::code`]. These bytes are a persisted
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
//! partition's data (the same WriteBatch settles those still taken from a bucket of the
//! partition: `Store::settle_latest`). Without an archive a dropped partition is gone for good;
//! RocksDB reclaims its disk space as compaction passes over the range tombstone. With one
//! ([`crate::archive`]), [`Store::spill_expired_partitions`] moves expired partitions to Parquet
//! files instead, with the same range delete once the file is recorded.
//!
//! The cold retention is how long a partition is kept in all, counted like the hot one from
//! the partition's end: it is longer than the hot retention, and a table has one only if it
//! has a hot retention. The archive tier holds a partition from the end of its hot retention
//! to the end of its cold one, when [`Store::spill_expired_partitions`] deletes its file.
//! Without an archive, a cold retention changes nothing (a partition is dropped when its hot
//! retention ends).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use model::{FieldName, FieldType, Hour, PartitionSize};
use rocksdb::{ReadOptions, WriteBatch, WriteOptions, DB};
use rollup::period::Level;

use crate::keys::{BucketKey, DirtyKey};
use crate::rollups::{self, RollupFloor, RollupKeep};
use crate::schema::{Schema, SchemaField};
use crate::store::{cf, CF_BUCKETS, CF_CATALOG, CF_DIRTY, CF_LATEST};
use crate::{codec, db_err, keys, read, write, Error, Result, Store};

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
    /// How long a partition is kept in all (RocksDB, then the archive tier) after its end, in
    /// milliseconds, longer than the hot retention; `None`: no limit once archived. See the
    /// module docs: without an archive tier it changes nothing.
    pub cold_retention_ms: Option<u64>,
    /// How long its roll-up records are kept (see [`RollupRetention`]).
    pub rollup_retention: RollupRetention,
}

/// How long a table's roll-up records are kept, per level, counted from each period's end
/// like a partition's retention; `None` keeps them forever. Months are read as the merge of
/// their days, so they live as long as the days do (see `crate::rollups`, "Retention").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupRetention {
    /// Hour records (of devices, groups and the table), milliseconds.
    pub hour_ms: Option<u64>,
    /// Day records, milliseconds; set only with an hour retention no longer than it.
    pub day_ms: Option<u64>,
}

impl RollupRetention {
    /// Kept forever.
    pub const FOREVER: RollupRetention = RollupRetention { hour_ms: None, day_ms: None };

    /// Checks the retentions: each from 1 to 2^63-1 ms; a day retention only with an hour
    /// one, and no shorter than it (a day is recomputed from its hours).
    pub fn check(&self) -> std::result::Result<(), &'static str> {
        if !retention_in_range(self.hour_ms) || !retention_in_range(self.day_ms) {
            return Err("a roll-up retention must be from 1 to 2^63-1 milliseconds");
        }
        match (self.hour_ms, self.day_ms) {
            (None, Some(_)) => Err("a day roll-up retention needs an hour roll-up retention no longer than it"),
            (Some(hour), Some(day)) if day < hour => {
                Err("the day roll-up retention must be at least the hour roll-up retention")
            }
            _ => Ok(()),
        }
    }
}

impl RollupRetention {
    /// The shortest hour roll-up retention with which every hour is rolled up while the first
    /// hour of its day is kept, when hours are rolled up `allowed_lateness_ms` after their end:
    /// the last hour of a day is rolled up a day after the first began, plus the lateness, plus
    /// up to an hour for the pass to come round. A day's roll-up is made from its hours while
    /// its first hour is kept; after, each mark of it has the device's day read again from all
    /// its buckets and its groups' days recomputed from their devices' (`crate::rollups`,
    /// "Retention"): right for a late backlog, too dear for every day of every device.
    pub fn min_hour_ms(allowed_lateness_ms: u64) -> u64 {
        (model::DAY_MS + model::HOUR_MS) as u64 + allowed_lateness_ms
    }

    /// Refuses an hour retention shorter than [`RollupRetention::min_hour_ms`]: the hours of
    /// each day after the retention had passed since its start would each recompute the day
    /// from all its readings.
    pub fn check_rolls_up_every_hour(&self, allowed_lateness_ms: u64) -> std::result::Result<(), String> {
        let min = RollupRetention::min_hour_ms(allowed_lateness_ms);
        match self.hour_ms {
            Some(hour) if hour < min => Err(format!(
                "an hour roll-up retention of {} would expire each day's first hour before its last is rolled up (a \
                 day's roll-up is made from its hours while its first hour is kept, else read again from all its \
                 readings): it must be at least a day and an hour plus \
                 rollup.allowed_lateness_ms ({allowed_lateness_ms}), {} ms; \"{}d\" would do",
                model::format_duration_ms(hour),
                min,
                min.div_ceil(model::DAY_MS as u64)
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for RollupRetention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = |ms: Option<u64>| ms.map_or_else(|| "forever".to_string(), model::format_duration_ms);
        write!(f, "hour roll-ups kept {}, day roll-ups kept {}", kept(self.hour_ms), kept(self.day_ms))
    }
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
    /// Cold retention in milliseconds (see [`TableInfo::cold_retention_ms`]).
    pub cold_retention_ms: Option<u64>,
    /// How long its roll-up records are kept.
    pub rollup_retention: RollupRetention,
    /// The first hour and day whose roll-ups it keeps whatever its roll-up retention says:
    /// what a shorter one had hidden when a definition lengthened it ([`RollupFloor`]).
    pub rollup_floor: RollupFloor,
    /// Fields and types, the schema version, and whether the table is strict.
    pub schema: Schema,
}

impl TableDefinition {
    fn new(name: &str, ti: TableInfo, rollup_floor: RollupFloor, schema: Schema) -> TableDefinition {
        TableDefinition {
            name: name.to_string(),
            id: ti.id,
            partition: ti.partition,
            hot_retention_ms: ti.hot_retention_ms,
            cold_retention_ms: ti.cold_retention_ms,
            rollup_retention: ti.rollup_retention,
            rollup_floor,
            schema,
        }
    }
}

/// What [`Store::define_table_with`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableSpec {
    /// Partition size.
    pub partition: PartitionSize,
    /// Hot retention in milliseconds; `None` keeps data forever.
    pub hot_retention_ms: Option<u64>,
    /// Cold retention in milliseconds (see [`TableInfo::cold_retention_ms`]).
    pub cold_retention_ms: Option<u64>,
    /// How long its roll-up records are kept.
    pub rollup_retention: RollupRetention,
    /// Refuse fields the schema lacks instead of adding them.
    pub strict: bool,
    /// Fields to declare, by name; a name given twice keeps its last type.
    pub fields: Vec<(String, FieldType)>,
}

/// A table's settings in words, for error messages: `partition day, hot retention 30d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Partition size.
    pub partition: PartitionSize,
    /// Hot retention in milliseconds; `None` keeps data forever.
    pub hot_retention_ms: Option<u64>,
    /// Cold retention in milliseconds.
    pub cold_retention_ms: Option<u64>,
    /// Whether the table is strict.
    pub strict: bool,
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hot_retention_ms {
            Some(ms) => write!(f, "partition {}, hot retention {}", self.partition, model::format_duration_ms(ms))?,
            None => write!(f, "partition {}, no hot retention (kept forever)", self.partition)?,
        }
        if let Some(ms) = self.cold_retention_ms {
            write!(f, ", cold retention {}", model::format_duration_ms(ms))?;
        }
        // Strictness is named only when set: messages about other tables read as before.
        f.write_str(if self.strict { ", strict" } else { "" })
    }
}

/// The message of [`crate::Error::TableExists`]: both settings, and when only one side is
/// strict, the other named "not strict" (strictness is named only when set); then what can
/// change.
pub(crate) fn exists_message(name: &str, existing: &Settings, requested: &Settings) -> String {
    let not_strict = |s: &Settings| if existing.strict != requested.strict && !s.strict { ", not strict" } else { "" };
    format!(
        "table `{name}` already exists with {existing}{}; the request asks for {requested}{} \
         ({FIXED_AT_CREATION})",
        not_strict(existing),
        not_strict(requested)
    )
}

/// What a later definition of a table cannot change, and what it can.
pub const FIXED_AT_CREATION: &str = "partition, hot and cold retention and strictness are fixed when a table is \
     created; a later definition changes only roll-up retentions and adds fields";

/// The catalog held in memory.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) by_name: HashMap<Arc<str>, TableInfo>,
    /// Schemas by table id; a table without an entry has the empty schema of version 0.
    pub(crate) schemas: HashMap<u32, Schema>,
    /// The (table id, partition) pairs whose readings were deleted for good
    /// ([`keys::deleted_partition_key`]): their roll-ups are all that is left of them. Those
    /// past the hour roll-up retention are forgotten ([`Store::forget_deleted_partitions`]).
    pub(crate) deleted: std::collections::HashSet<(u32, i32)>,
    /// The roll-up floors by table id ([`keys::rollup_floor_key`]); a table without one has none.
    pub(crate) rollup_floors: HashMap<u32, RollupFloor>,
}

/// The empty schema of version 0.
pub(crate) static EMPTY_SCHEMA: Schema = Schema { version: 0, strict: false, fields: Vec::new() };

impl Catalog {
    /// The schema of the table with id `id`.
    pub(crate) fn schema(&self, id: u32) -> &Schema {
        self.schemas.get(&id).unwrap_or(&EMPTY_SCHEMA)
    }

    /// What the roll-ups of table `ti` keep: its retention and floor.
    pub(crate) fn rollup_keep(&self, ti: &TableInfo) -> RollupKeep {
        RollupKeep {
            retention: ti.rollup_retention,
            floor: self.rollup_floors.get(&ti.id).copied().unwrap_or(RollupFloor::NONE),
        }
    }
}

impl Catalog {
    /// The id the next new table gets: ids are dense from 1, in order of creation.
    pub(crate) fn next_id(&self) -> Result<u32> {
        u32::try_from(self.by_name.len()).ok().and_then(|n| n.checked_add(1)).ok_or(Error::IdsExhausted("table"))
    }
}

/// Version byte of the version-2 definition layout.
const DEFINITION_V2: u8 = 2;
/// Version byte of the version-3 definition layout.
const DEFINITION_V3: u8 = 3;
/// Version byte of the version-4 definition layout.
const DEFINITION_V4: u8 = 4;
/// Version byte of the current definition layout.
const DEFINITION_V5: u8 = 5;
/// Length of a version-1 (unversioned) definition.
const DEFINITION_V1_LEN: usize = 5;
/// Length of a version-2 definition.
const DEFINITION_V2_LEN: usize = 14;
/// Length of a version-3 definition without fields.
const DEFINITION_V3_MIN_LEN: usize = 23;
/// Length of a version-4 definition without fields.
const DEFINITION_V4_MIN_LEN: usize = 31;
/// Length of a version-5 definition without fields.
const DEFINITION_V5_MIN_LEN: usize = 47;
/// Flag bit of a strict table.
const FLAG_STRICT: u8 = 1;

/// The catalog value of a definition: version 5 for a table with a roll-up retention, else
/// version 4 (which an older build still reads).
///
/// Field names longer than `u16::MAX` bytes cannot be stored; ingest allows 64.
pub fn encode_definition(ti: TableInfo, schema: &Schema) -> Vec<u8> {
    let v5 = ti.rollup_retention != RollupRetention::FOREVER;
    let mut v = Vec::with_capacity(DEFINITION_V5_MIN_LEN + schema.fields.len() * 16);
    v.push(if v5 { DEFINITION_V5 } else { DEFINITION_V4 });
    v.extend_from_slice(&ti.id.to_be_bytes());
    v.push(ti.partition.code());
    v.extend_from_slice(&ti.hot_retention_ms.unwrap_or(0).to_be_bytes());
    v.extend_from_slice(&ti.cold_retention_ms.unwrap_or(0).to_be_bytes());
    if v5 {
        v.extend_from_slice(&ti.rollup_retention.hour_ms.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(&ti.rollup_retention.day_ms.unwrap_or(0).to_be_bytes());
    }
    v.push(if schema.strict { FLAG_STRICT } else { 0 });
    v.extend_from_slice(&schema.version.to_be_bytes());
    v.extend_from_slice(&(schema.fields.len() as u32).to_be_bytes());
    for f in &schema.fields {
        v.push(f.ty.code());
        v.extend_from_slice(&f.since.to_be_bytes());
        let name = &f.name.as_bytes()[..f.name.len().min(usize::from(u16::MAX))];
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name);
    }
    v
}

/// Decodes a catalog value of any version; the error says what is wrong.
pub fn decode_definition(v: &[u8]) -> Result<(TableInfo, Schema), String> {
    let partition = |code: u8| PartitionSize::from_code(code).ok_or_else(|| format!("unknown partition code {code}"));
    let retention = |bytes: &[u8]| -> Result<Option<u64>, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        match u64::from_be_bytes(b) {
            0 => Ok(None),
            ms if ms > i64::MAX as u64 => Err(format!("retention {ms} ms is out of range")),
            ms => Ok(Some(ms)),
        }
    };
    // Versions 3 to 5 differ only by the retentions after the hot one (4: the cold one; 5: the
    // cold one and the roll-ups' hour and day): where the schema part (flags, schema version,
    // field count, fields) starts.
    let layout = match v.first() {
        Some(&DEFINITION_V3) if v.len() >= DEFINITION_V3_MIN_LEN => Some((None, RollupRetention::FOREVER, 14)),
        Some(&DEFINITION_V4) if v.len() >= DEFINITION_V4_MIN_LEN => {
            Some((retention(&v[14..22])?, RollupRetention::FOREVER, 22))
        }
        Some(&DEFINITION_V5) if v.len() >= DEFINITION_V5_MIN_LEN => {
            let rollups = RollupRetention { hour_ms: retention(&v[22..30])?, day_ms: retention(&v[30..38])? };
            rollups.check()?;
            Some((retention(&v[14..22])?, rollups, 38))
        }
        _ => None,
    };
    if let Some((cold_retention_ms, rollup_retention, schema_at)) = layout {
        let ti = TableInfo {
            id: u32::from_be_bytes([v[1], v[2], v[3], v[4]]),
            partition: partition(v[5])?,
            hot_retention_ms: retention(&v[6..14])?,
            cold_retention_ms,
            rollup_retention,
        };
        let s = &v[schema_at..];
        let flags = s[0];
        if flags & !FLAG_STRICT != 0 {
            return Err(format!("unknown flags {flags:#04x}"));
        }
        let version = u32::from_be_bytes([s[1], s[2], s[3], s[4]]);
        let count = u32::from_be_bytes([s[5], s[6], s[7], s[8]]) as usize;
        let mut rest = &s[9..];
        // Each field takes at least 7 bytes: no allocation larger than the value.
        let mut fields: Vec<SchemaField> = Vec::with_capacity(count.min(rest.len() / 7));
        for i in 0..count {
            let truncated = || format!("field {i} of {count} is truncated");
            let head = rest.get(..7).ok_or_else(truncated)?;
            let ty =
                FieldType::from_code(head[0]).ok_or_else(|| format!("field {i}: unknown type code {}", head[0]))?;
            let since = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
            let len = usize::from(u16::from_be_bytes([head[5], head[6]]));
            let name = rest.get(7..7 + len).ok_or_else(truncated)?;
            let name = std::str::from_utf8(name).map_err(|_| format!("field {i}: name is not UTF-8"))?;
            if fields.last().is_some_and(|f| *f.name >= *name) {
                return Err(format!("field names not strictly ascending at `{name}`"));
            }
            if since == 0 || since > version {
                return Err(format!("field `{name}` added in version {since}, outside 1..={version}"));
            }
            fields.push(SchemaField { name: FieldName::from(name), ty, since });
            rest = &rest[7 + len..];
        }
        if !rest.is_empty() {
            return Err(format!("{} bytes after the last field", rest.len()));
        }
        return Ok((ti, Schema { version, strict: flags & FLAG_STRICT != 0, fields }));
    }
    let ti = decode_definition_v1_v2(v, partition, retention)?;
    Ok((ti, Schema::default()))
}

/// Decodes the layouts that carry no schema.
fn decode_definition_v1_v2(
    v: &[u8],
    partition: impl Fn(u8) -> Result<PartitionSize, String>,
    retention: impl Fn(&[u8]) -> Result<Option<u64>, String>,
) -> Result<TableInfo, String> {
    match (v.len(), v.first()) {
        (DEFINITION_V1_LEN, _) => Ok(TableInfo {
            id: u32::from_be_bytes([v[0], v[1], v[2], v[3]]),
            partition: partition(v[4])?,
            hot_retention_ms: None,
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
        }),
        (DEFINITION_V2_LEN, Some(&DEFINITION_V2)) => Ok(TableInfo {
            id: u32::from_be_bytes([v[1], v[2], v[3], v[4]]),
            partition: partition(v[5])?,
            hot_retention_ms: retention(&v[6..14])?,
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
        }),
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
        let (ti, schema) = decode_definition(&v).map_err(|e| corrupt(format!("table `{name}`: {e}")))?;
        if schema != Schema::default() {
            catalog.schemas.insert(ti.id, schema);
        }
        catalog.by_name.insert(name.into(), ti);
    }
    for item in db.prefix_iterator_cf(cf(db, CF_CATALOG), [keys::DELETED_PREFIX]) {
        let (k, _) = item.map_err(db_err("load catalog"))?;
        if k.first() != Some(&keys::DELETED_PREFIX) {
            break;
        }
        let pair = keys::decode_deleted_partition_key(&k)
            .ok_or_else(|| Error::Corrupt { what: "catalog entry", detail: format!("deleted partition key {k:?}") })?;
        catalog.deleted.insert(pair);
    }
    for item in db.prefix_iterator_cf(cf(db, CF_CATALOG), [keys::ROLLUP_FLOOR_PREFIX]) {
        let (k, v) = item.map_err(db_err("load catalog"))?;
        if k.first() != Some(&keys::ROLLUP_FLOOR_PREFIX) {
            break;
        }
        let corrupt = || Error::Corrupt { what: "catalog entry", detail: format!("roll-up floor {k:?} → {v:?}") };
        let table = keys::decode_rollup_floor_key(&k).ok_or_else(corrupt)?;
        catalog.rollup_floors.insert(table, RollupFloor::decode(&v).ok_or_else(corrupt)?);
    }
    Ok(catalog)
}

/// Puts a new table's two catalog entries (name → definition, id → name) into `wb`.
pub(crate) fn put_table(db: &DB, wb: &mut WriteBatch, name: &str, ti: TableInfo, schema: &Schema) {
    put_definition(db, wb, name, ti, schema);
    wb.put_cf(cf(db, CF_CATALOG), keys::table_id_key(ti.id), name.as_bytes());
}

/// Puts a table's definition (a changed schema) into `wb`.
pub(crate) fn put_definition(db: &DB, wb: &mut WriteBatch, name: &str, ti: TableInfo, schema: &Schema) {
    wb.put_cf(cf(db, CF_CATALOG), keys::name_key(name), encode_definition(ti, schema));
}

/// The first and last hours (hour numbers as the keys hold them) of partition `partition` of
/// table `ti`; `None` when they do not fit the keys' i32.
fn partition_hours(ti: &TableInfo, partition: i32) -> Option<(i32, i32)> {
    let start = ti.partition.start_ms(i64::from(partition));
    let end = ti.partition.start_ms(i64::from(partition) + 1);
    Some((keys::to_i32(Hour::of(start).0)?, keys::to_i32(Hour::of(end - 1).0)?))
}

/// The oldest partition index that a hot retention of `retention_ms` keeps at `now_ms`; every
/// partition before it has expired.
///
/// A partition expires once its end is at or before the cutoff `now_ms - retention_ms`. The
/// partition holding the cutoff ends after it, so it is the first one kept; the one before it
/// ends at its start, at or before the cutoff. Saturates instead of overflowing.
pub fn first_kept_partition(size: PartitionSize, now_ms: i64, retention_ms: u64) -> i64 {
    size.index_of(retention_cutoff_ms(now_ms, retention_ms))
}

/// `now_ms - retention_ms`, saturating: what a retention keeps is what ends after it.
pub fn retention_cutoff_ms(now_ms: i64, retention_ms: u64) -> i64 {
    now_ms.saturating_sub(i64::try_from(retention_ms).unwrap_or(i64::MAX))
}

/// Whether a retention is unset or from 1 to 2^63-1 ms, the range every retention takes.
fn retention_in_range(ms: Option<u64>) -> bool {
    ms.is_none_or(|ms| ms != 0 && ms <= i64::MAX as u64)
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
        self.define_table_with(name, &TableSpec { partition, hot_retention_ms, ..TableSpec::default() })
    }

    /// Checks a table's retentions: each from 1 to 2^63-1 ms; a cold retention only with a hot
    /// one, and longer than it. (Public for a configuration's check before the store opens.)
    pub fn check_retentions(hot: Option<u64>, cold: Option<u64>) -> std::result::Result<(), &'static str> {
        if !retention_in_range(hot) {
            return Err("the hot retention must be from 1 to 2^63-1 milliseconds");
        }
        if !retention_in_range(cold) {
            return Err("the cold retention must be from 1 to 2^63-1 milliseconds");
        }
        match (hot, cold) {
            (None, Some(_)) => {
                Err("a cold retention needs a hot retention (data leaves RocksDB only after the hot one)")
            }
            (Some(hot), Some(cold)) if cold <= hot => {
                Err("the cold retention must be longer than the hot retention (both count from a partition's end)")
            }
            _ => Ok(()),
        }
    }

    /// Like [`Store::define_table`], with a schema: whether the table is strict, and fields to
    /// declare; and a roll-up retention. On a table that exists with the same partition size,
    /// hot and cold retentions and strictness, declared fields it lacks are added (one new
    /// schema version) and fields it has must have the declared type, else
    /// [`Error::SchemaConflict`], and its roll-up retention becomes the one asked for; other
    /// settings are [`Error::TableExists`]. Field names are not checked here beyond being non-empty (ingest
    /// owns the naming rules).
    pub fn define_table_with(&self, name: &str, spec: &TableSpec) -> Result<(TableDefinition, bool)> {
        let invalid = |detail: &str| Error::InvalidTable { name: name.to_string(), detail: detail.to_string() };
        if name.is_empty() {
            return Err(invalid("the name is empty"));
        }
        Self::check_retentions(spec.hot_retention_ms, spec.cold_retention_ms).map_err(invalid)?;
        spec.rollup_retention.check().map_err(invalid)?;
        if spec.fields.iter().any(|(f, _)| f.is_empty() || f.len() > usize::from(u16::MAX)) {
            return Err(invalid("a field name is empty or longer than 65,535 bytes"));
        }
        // The write lock orders this against writers, which also create tables and schemas.
        let _writer = self.write_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let requested = Settings {
            partition: spec.partition,
            hot_retention_ms: spec.hot_retention_ms,
            cold_retention_ms: spec.cold_retention_ms,
            strict: spec.strict,
        };
        let (ti, mut schema, created) = {
            let catalog = read(&self.catalog);
            match catalog.by_name.get(name) {
                Some(ti) => {
                    let schema = catalog.schema(ti.id).clone();
                    let existing = Settings {
                        partition: ti.partition,
                        hot_retention_ms: ti.hot_retention_ms,
                        cold_retention_ms: ti.cold_retention_ms,
                        strict: schema.strict,
                    };
                    if existing != requested {
                        return Err(Error::TableExists { name: name.to_string(), existing, requested });
                    }
                    (*ti, schema, false)
                }
                None => {
                    let ti = TableInfo {
                        id: catalog.next_id()?,
                        partition: spec.partition,
                        hot_retention_ms: spec.hot_retention_ms,
                        cold_retention_ms: spec.cold_retention_ms,
                        rollup_retention: spec.rollup_retention,
                    };
                    (ti, Schema { strict: spec.strict, ..Schema::default() }, true)
                }
            }
        };
        let next_version = schema.version.checked_add(1).ok_or(Error::IdsExhausted("schema version"))?;
        let mut changed = false;
        // Of a name given twice, the last type is kept.
        let declared: std::collections::BTreeMap<&str, FieldType> =
            spec.fields.iter().map(|(f, ty)| (f.as_str(), *ty)).collect();
        for (field, ty) in declared {
            match schema.field(field) {
                Some(f) if f.ty == ty => {}
                Some(f) => {
                    return Err(Error::SchemaConflict {
                        table: name.to_string(),
                        field: field.to_string(),
                        existing: f.ty,
                        requested: ty,
                    })
                }
                None => {
                    schema.add(field.into(), ty, next_version);
                    changed = true;
                }
            }
        }
        // Only fields this adds count: a table that grew past it before the limit keeps working.
        if changed && schema.fields.len() > crate::schema::MAX_FIELDS_PER_TABLE {
            return Err(invalid(&format!(
                "{} fields; a table takes at most {}",
                schema.fields.len(),
                crate::schema::MAX_FIELDS_PER_TABLE
            )));
        }
        if changed {
            schema.version = next_version;
        }
        // The roll-up retention is set to what is asked: it changes only derived records (a
        // shorter one hides and drops more of them; a longer one keeps more from now on). What
        // the old one hid stays hidden: the table's floor becomes the first hour and day it kept
        // and passes still wrote (`crate::rollups`, "Retention").
        let mut ti = ti;
        let retention_changed = ti.rollup_retention != spec.rollup_retention;
        let old_keep = read(&self.catalog).rollup_keep(&ti);
        let floor = if retention_changed {
            old_keep.floor_after(spec.rollup_retention, model::now_ms())
        } else {
            old_keep.floor
        };
        ti.rollup_retention = spec.rollup_retention;
        if !created && !changed && !retention_changed {
            return Ok((TableDefinition::new(name, ti, floor, schema), false));
        }
        let mut wb = WriteBatch::default();
        if created {
            put_table(&self.db, &mut wb, name, ti, &schema);
        } else {
            put_definition(&self.db, &mut wb, name, ti, &schema);
        }
        if floor == RollupFloor::NONE {
            if old_keep.floor != RollupFloor::NONE {
                wb.delete_cf(cf(&self.db, CF_CATALOG), keys::rollup_floor_key(ti.id));
            }
        } else if floor != old_keep.floor {
            wb.put_cf(cf(&self.db, CF_CATALOG), keys::rollup_floor_key(ti.id), floor.encode());
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(wb, &wo).map_err(db_err("write table definition"))?;
        let keep = {
            let mut catalog = write(&self.catalog);
            catalog.by_name.insert(name.into(), ti);
            catalog.schemas.insert(ti.id, schema.clone());
            if floor == RollupFloor::NONE {
                catalog.rollup_floors.remove(&ti.id);
            } else {
                catalog.rollup_floors.insert(ti.id, floor);
            }
            catalog.rollup_keep(&ti)
        };
        self.rollup_retentions.set(ti.id, keep);
        if floor != old_keep.floor && floor != RollupFloor::NONE {
            let shown = |ms: i64| if ms == i64::MIN { "all".to_string() } else { model::utc_text(ms) };
            tracing::info!(
                table = name,
                hours_from = shown(floor.hour_ms),
                days_from = shown(floor.day_ms),
                "a longer roll-up retention keeps more from now on; the roll-ups the shorter one had hidden stay hidden"
            );
        }
        Ok((TableDefinition::new(name, ti, floor, schema), created))
    }

    /// The definition of table `name`, if it exists.
    pub fn table_definition(&self, name: &str) -> Option<TableDefinition> {
        let catalog = read(&self.catalog);
        let ti = catalog.by_name.get(name)?;
        Some(TableDefinition::new(name, *ti, catalog.rollup_keep(ti).floor, catalog.schema(ti.id).clone()))
    }

    /// The schema of table `name`, if the table exists.
    pub fn schema(&self, name: &str) -> Option<Schema> {
        let catalog = read(&self.catalog);
        catalog.by_name.get(name).map(|ti| catalog.schema(ti.id).clone())
    }

    /// Removes every partition that has expired at `now_ms` (epoch ms) from each table with a hot
    /// retention, one range delete per partition, all in one WriteBatch; returns the (table,
    /// partition index) pairs dropped, by table name and then oldest first. Only partitions
    /// holding data are found and dropped, so a second call at the same `now_ms` drops nothing.
    ///
    /// This deletes the readings for good ([`Store::spill_expired_partitions`] archives them
    /// when an archive is configured) and frees the SST files that hold nothing else at once.
    /// Latest values stay (settled first: `Store::settle_latest`), and what was stored into the
    /// partitions and not rolled up yet is rolled up before they go, at `now_ms`
    /// (`Store::roll_up_then_delete`). Partition index `i32::MAX`
    /// (some 245,000 years after 1970) is never dropped.
    pub fn drop_expired_partitions(&self, now_ms: i64) -> Result<Vec<(String, i64)>> {
        // Buffered readings of an expiring partition must not come back after the delete.
        self.flush_write_buffer()?;
        let mut expired: Vec<(&str, TableInfo, i32)> = Vec::new();
        let tables = self.tables_with_hot_retention();
        for (name, ti) in &tables {
            let Some(retention) = ti.hot_retention_ms else { continue };
            let first_kept = first_kept_partition(ti.partition, now_ms, retention);
            expired.extend(self.partitions_with_data(ti.id, first_kept)?.into_iter().map(|p| (&**name, *ti, p)));
        }
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        let parts: Vec<(TableInfo, i32)> = expired.iter().map(|&(_, ti, p)| (ti, p)).collect();
        // What was stored into them and not rolled up yet is, before it goes.
        let deleted = self.roll_up_then_delete(&parts, now_ms, || {
            let mut wb = WriteBatch::default();
            let (mut dropped, mut ranges, mut settled) = (Vec::new(), Vec::new(), 0);
            for &(name, ti, partition) in &expired {
                let Some((range, n)) = self.delete_partition(&mut wb, &ti, partition)? else { continue };
                self.put_deleted(&mut wb, &ti, partition);
                settled += n;
                ranges.push(range);
                dropped.push((name, ti.id, partition));
            }
            if !dropped.is_empty() {
                self.db.write(wb).map_err(db_err("drop expired partitions"))?;
            }
            Ok((dropped, ranges, settled))
        })?;
        // None: roll-ups stopped with readings of them not rolled up; the next start's run.
        let Some((dropped, ranges, settled)) = deleted else { return Ok(Vec::new()) };
        if !dropped.is_empty() {
            self.note_deleted(&dropped.iter().map(|&(_, table, p)| (table, p)).collect::<Vec<_>>());
            self.stats.partitions_deleted.fetch_add(dropped.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.stats.latest_operands.fetch_add(settled, std::sync::atomic::Ordering::Relaxed);
            self.free_deleted_ranges(&ranges);
        }
        Ok(dropped.into_iter().map(|(name, _, p)| (name.to_string(), i64::from(p))).collect())
    }

    /// Puts into `wb` the mark of partition `partition` of table `ti` as deleted for good
    /// ([`keys::deleted_partition_key`]), and takes off its device-hours' marks of a roll-up
    /// made after an earlier delete ([`keys::after_delete_key`]): what those counted is gone
    /// too now. [`Store::note_deleted`] once `wb` is committed.
    pub(crate) fn put_deleted(&self, wb: &mut WriteBatch, ti: &TableInfo, partition: i32) {
        wb.put_cf(cf(&self.db, CF_CATALOG), keys::deleted_partition_key(ti.id, partition), []);
        self.delete_after_delete_marks(wb, ti, partition);
    }

    /// Puts into `wb` the deletion of the after-delete marks of partition `partition` of table
    /// `ti`: its device-hours' ([`keys::after_delete_key`]) and those of the device-days it
    /// overlaps ([`keys::day_after_delete_key`]), one range each.
    fn delete_after_delete_marks(&self, wb: &mut WriteBatch, ti: &TableInfo, partition: i32) {
        if let Some((first, last)) = partition_hours(ti, partition) {
            let catalog = cf(&self.db, CF_CATALOG);
            let (from, to) = (keys::after_delete_key(ti.id, first, 0), keys::after_delete_key(ti.id, last, u64::MAX));
            wb.delete_range_cf(catalog, from, to);
            wb.delete_cf(catalog, to);
            // The days from the one holding the partition's first hour to the one holding its
            // last.
            let first_day = crate::rollups::first_hour_of(crate::rollups::day_of(first));
            let (from, to) =
                (keys::day_after_delete_key(ti.id, first_day, 0), keys::day_after_delete_key(ti.id, last, u64::MAX));
            wb.delete_range_cf(catalog, from, to);
            wb.delete_cf(catalog, to);
        }
    }

    /// Forgets the partitions deleted for good that no roll-up pass looks at any more: those
    /// whose every hour is before both the first hour and the first day their table's roll-ups
    /// keep at `now_ms` (a table not in `RollupRetentions` keeps them all). A pass rolls up no
    /// hour of a day whose first hour is not kept (`RollupKeep::may_roll_up`, checked before
    /// [`Store::is_deleted_partition`]); it recomputes such a day from its buckets while the day
    /// is kept, unless a partition of it was deleted for good (`Store::past_days` asks); and the
    /// first hour and day kept only ever move forward (a longer retention sets a floor). So
    /// such a partition's mark, and its after-delete marks, are never read again.
    /// Called by the roll-up pass, under its lock, with its `now_ms` and its `tables` by id.
    /// Returns how many were forgotten.
    pub(crate) fn forget_deleted_partitions(&self, tables: &HashMap<u32, TableInfo>, now_ms: i64) -> Result<usize> {
        let deleted: Vec<(u32, i32)> = read(&self.catalog).deleted.iter().copied().collect();
        if deleted.is_empty() {
            return Ok(0);
        }
        let keeps = self.rollup_retentions.snapshot();
        let gone: Vec<(&TableInfo, i32)> = deleted
            .into_iter()
            .filter_map(|(table, partition)| {
                let (ti, keep) = (tables.get(&table)?, keeps.get(&table)?);
                let end = ti.partition.start_ms(i64::from(partition) + 1);
                let past = end <= keep.first_kept(Level::Hour, now_ms) && end <= keep.first_kept(Level::Day, now_ms);
                past.then_some((ti, partition))
            })
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let mut wb = WriteBatch::default();
        for &(ti, partition) in &gone {
            wb.delete_cf(cf(&self.db, CF_CATALOG), keys::deleted_partition_key(ti.id, partition));
            self.delete_after_delete_marks(&mut wb, ti, partition);
        }
        self.db.write(wb).map_err(db_err("forget deleted partitions"))?;
        let mut catalog = write(&self.catalog);
        for &(ti, partition) in &gone {
            catalog.deleted.remove(&(ti.id, partition));
        }
        Ok(gone.len())
    }

    /// Whether the day starting at hour `first_hour` of device `device` in table `table` was
    /// first made after a partition of it was deleted for good ([`keys::day_after_delete_key`]).
    pub(crate) fn made_after_delete(&self, table: u32, first_hour: i32, device: u64) -> Result<bool> {
        let key = keys::day_after_delete_key(table, first_hour, device);
        Ok(self.db.get_pinned_cf(cf(&self.db, CF_CATALOG), key).map_err(db_err("get roll-up mark"))?.is_some())
    }

    /// Whether hour `hour` of device `device` in table `table` was first rolled up after its
    /// partition's readings were deleted for good ([`keys::after_delete_key`]).
    pub(crate) fn rolled_up_after_delete(&self, table: u32, hour: i32, device: u64) -> Result<bool> {
        let key = keys::after_delete_key(table, hour, device);
        Ok(self.db.get_pinned_cf(cf(&self.db, CF_CATALOG), key).map_err(db_err("get roll-up mark"))?.is_some())
    }

    /// Notes committed [`Store::put_deleted`] marks in memory.
    pub(crate) fn note_deleted(&self, pairs: &[(u32, i32)]) {
        write(&self.catalog).deleted.extend(pairs.iter().copied());
    }

    /// Whether the readings of partition `partition` of table `table` were deleted for good
    /// (a hot retention without an archive, or a cold retention), so that what a roll-up
    /// record says of its hours is more than what RocksDB holds of them.
    pub(crate) fn is_deleted_partition(&self, table: u32, partition: i32) -> bool {
        read(&self.catalog).deleted.contains(&(table, partition))
    }

    /// Puts into `wb` the deletion of partition `partition` of table `ti` from `buckets` (one
    /// range delete) and, before it, the `latest` operands that settle the partition's
    /// device-hours ([`Store::settle_latest`]). Every delete of a partition's buckets goes
    /// through here (retention, a spill, a cold delete). Returns the range deleted and the
    /// operands put, for the caller to count once committed; `None` for partition `i32::MAX`,
    /// which has no range ([`keys::partition_range`]).
    pub(crate) fn delete_partition(
        &self,
        wb: &mut WriteBatch,
        ti: &TableInfo,
        partition: i32,
    ) -> Result<Option<(keys::PartitionRange, u64)>> {
        let Some((from, to)) = keys::partition_range(ti.id, partition) else {
            return Ok(None);
        };
        let settled = self.settle_latest(wb, ti, partition)?;
        wb.delete_range_cf(cf(&self.db, CF_BUCKETS), from, to);
        Ok(Some(((from, to), settled)))
    }

    /// Puts into `wb` a `latest` operand for each device-hour of partition `partition` of
    /// table `ti` that is still marked dirty: its newest reading. For the batch that deletes
    /// the partition from `buckets` (retention, a spill), read while no write can reach the
    /// partition's marked hours unseen (see [`Store::drop_expired_partitions`], the spill's
    /// write gate). A device's `latest` entry holds a reading of its newest hour, not always
    /// that hour's newest ([`Store::latest`] reads the rest from the bucket); a roll-up pass
    /// settles the entries of the hours it reads, so only hours not rolled up yet need it
    /// here. An outlier's sub-buckets need nothing: its writes put each newest reading into
    /// `latest`. Returns the operands put.
    fn settle_latest(&self, wb: &mut WriteBatch, ti: &TableInfo, partition: i32) -> Result<u64> {
        let corrupt = |e: codec::Error| Error::Corrupt { what: "bucket", detail: e.to_string() };
        let marks = self.partition_marks(ti, partition)?;
        let mut settled = 0;
        for (mark, _) in marks {
            let bucket = BucketKey { table: ti.id, partition, device: mark.device, hour: mark.hour };
            let Some(v) =
                self.db.get_pinned_cf(cf(&self.db, CF_BUCKETS), bucket.encode()).map_err(db_err("get bucket"))?
            else {
                continue;
            };
            wb.merge_cf(
                cf(&self.db, CF_LATEST),
                keys::latest_key(ti.id, mark.device),
                codec::newest(&v).map_err(corrupt)?,
            );
            settled += 1;
        }
        Ok(settled)
    }

    /// The dirty marks of partition `partition` of table `ti`'s device-hours, with their
    /// generations, in the queue's order.
    pub(crate) fn partition_marks(&self, ti: &TableInfo, partition: i32) -> Result<Vec<(DirtyKey, u64)>> {
        let Some((first, last)) = partition_hours(ti, partition) else {
            return Ok(Vec::new());
        };
        let mut marks = Vec::new();
        let mut it = self.db.raw_iterator_cf(cf(&self.db, CF_DIRTY));
        it.seek(DirtyKey { table: ti.id, hour: first, device: 0 }.encode());
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            match DirtyKey::decode(k) {
                Some(mark) if mark.table == ti.id && mark.hour <= last => marks.push((mark, rollups::decode_gen(v)?)),
                _ => break,
            }
            it.next();
        }
        it.status().map_err(db_err("scan dirty marks"))?;
        Ok(marks)
    }

    /// Frees the disk of bucket key ranges whose range deletes are committed, into which no
    /// write can come meanwhile (expired partitions: any reading there is expired; a spilled
    /// one: its writes wait for the spill). A range delete hides its readings at once but
    /// frees their files only when a compaction reaches them, which under universal
    /// compaction may not be before the store has doubled in size; RocksDB drops the files
    /// (below level 0) that lie wholly inside a range at once. Such a file may have held a
    /// range delete itself (had the memtable been flushed and compacted since the commit)
    /// while files across the range's ends keep some of its readings: the range deletes are
    /// committed again, so that none shows for longer than these calls. A failure is logged:
    /// the data is deleted either way, and compactions free the files later.
    pub(crate) fn free_deleted_ranges(&self, ranges: &[keys::PartitionRange]) {
        let buckets = cf(&self.db, CF_BUCKETS);
        let mut wb = WriteBatch::default();
        for (from, to) in ranges {
            // Inclusive of `to`, which no bucket key equals (keys are longer than the prefix).
            if let Err(e) = self.db.delete_file_in_range_cf(buckets, from, to) {
                tracing::warn!(error = %e, "cannot delete the files of a dropped partition; compactions will");
            }
            wb.delete_range_cf(buckets, from, to);
        }
        if let Err(e) = self.db.write(wb) {
            tracing::warn!(error = %e, "cannot delete a dropped partition's range again");
        }
    }

    /// The tables that have a hot retention, sorted by name.
    pub(crate) fn tables_with_hot_retention(&self) -> Vec<(Arc<str>, TableInfo)> {
        let mut tables: Vec<(Arc<str>, TableInfo)> = read(&self.catalog)
            .by_name
            .iter()
            .filter(|(_, ti)| ti.hot_retention_ms.is_some())
            .map(|(name, ti)| (name.clone(), *ti))
            .collect();
        tables.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        tables
    }

    /// The partitions of table `table` below index `end` that hold at least one bucket, oldest
    /// first: one seek per partition found (plus the one that finds no more).
    pub(crate) fn partitions_with_data(&self, table: u32, end: i64) -> Result<Vec<i32>> {
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
            Ok((
                TableInfo {
                    id: 258,
                    partition: PartitionSize::Month,
                    hot_retention_ms: None,
                    cold_retention_ms: None,
                    rollup_retention: RollupRetention::FOREVER,
                },
                Schema::default()
            ))
        );
        assert_eq!(decode_definition(&[0, 0, 0, 1, 9]), Err("unknown partition code 9".to_string()));
    }

    #[test]
    fn version_2_definitions_still_decode() {
        let ti = TableInfo {
            id: 0x0102_0304,
            partition: PartitionSize::Hour,
            hot_retention_ms: Some(7_200_000),
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
        };
        let v2 = [2, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0x6d, 0xdd, 0];
        assert_eq!(decode_definition(&v2), Ok((ti, Schema::default())));
        let forever = [2, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode_definition(&forever), Ok((TableInfo { hot_retention_ms: None, ..ti }, Schema::default())));
        assert_eq!(decode_definition(&[3; 14]), Err("unknown version 3 (14 bytes)".to_string()));
        assert_eq!(decode_definition(&[2; 9]), Err("unknown version 2 (9 bytes)".to_string()));
        assert_eq!(decode_definition(&[]), Err("empty value".to_string()));
    }

    #[test]
    fn version_3_definitions_still_decode() {
        let ti = TableInfo {
            id: 0x0102_0304,
            partition: PartitionSize::Hour,
            hot_retention_ms: Some(7_200_000),
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
        };
        let mut schema = Schema { strict: true, ..Schema::default() };
        schema.add("on".into(), FieldType::Bool, 2);
        schema.add("a".into(), FieldType::I64, 1);
        schema.version = 2;
        #[rustfmt::skip]
        let v3 = [
            3, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0x6d, 0xdd, 0, // as version 2, version byte 3
            1,                      // strict
            0, 0, 0, 2,             // schema version 2
            0, 0, 0, 2,             // 2 fields:
            1, 0, 0, 0, 1, 0, 1, b'a',       // i64 "a" since version 1
            2, 0, 0, 0, 2, 0, 2, b'o', b'n', // bool "on" since version 2
        ];
        assert_eq!(decode_definition(&v3), Ok((ti, schema)));
        assert_eq!(
            decode_definition(&v3[..DEFINITION_V3_MIN_LEN - 1]),
            Err("unknown version 3 (22 bytes)".to_string())
        );
    }

    #[test]
    fn version_4_definitions_still_decode() {
        let ti = TableInfo {
            id: 0x0102_0304,
            partition: PartitionSize::Hour,
            hot_retention_ms: Some(7_200_000),
            cold_retention_ms: Some(86_400_000),
            rollup_retention: RollupRetention::FOREVER,
        };
        let mut schema = Schema { strict: true, ..Schema::default() };
        schema.add("a".into(), FieldType::I64, 1);
        schema.version = 1;
        #[rustfmt::skip]
        let v4 = [
            4, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0x6d, 0xdd, 0, // as version 2, version byte 4
            0, 0, 0, 0, 0x05, 0x26, 0x5c, 0, // cold retention 86,400,000 ms
            1,                      // strict
            0, 0, 0, 1,             // schema version 1
            0, 0, 0, 1,             // 1 field:
            1, 0, 0, 0, 1, 0, 1, b'a',       // i64 "a" since version 1
        ];
        assert_eq!(decode_definition(&v4), Ok((ti, schema)));
        assert_eq!(
            decode_definition(&v4[..DEFINITION_V4_MIN_LEN - 1]),
            Err("unknown version 4 (30 bytes)".to_string())
        );
    }

    #[test]
    fn version_5_layout_is_as_documented() {
        let ti = TableInfo {
            id: 0x0102_0304,
            partition: PartitionSize::Hour,
            hot_retention_ms: Some(7_200_000),
            cold_retention_ms: Some(86_400_000),
            rollup_retention: RollupRetention { hour_ms: Some(3_600_000), day_ms: Some(172_800_000) },
        };
        let mut schema = Schema { strict: true, ..Schema::default() };
        schema.add("on".into(), FieldType::Bool, 2);
        schema.add("a".into(), FieldType::I64, 1);
        schema.version = 2;
        let v = encode_definition(ti, &schema);
        #[rustfmt::skip]
        let expected = [
            5, 1, 2, 3, 4, 1, 0, 0, 0, 0, 0, 0x6d, 0xdd, 0, // as version 2, version byte 5
            0, 0, 0, 0, 0x05, 0x26, 0x5c, 0, // cold retention 86,400,000 ms
            0, 0, 0, 0, 0, 0x36, 0xee, 0x80, // hour roll-ups 3,600,000 ms
            0, 0, 0, 0, 0x0a, 0x4c, 0xb8, 0, // day roll-ups 172,800,000 ms
            1,                      // strict
            0, 0, 0, 2,             // schema version 2
            0, 0, 0, 2,             // 2 fields:
            1, 0, 0, 0, 1, 0, 1, b'a',       // i64 "a" since version 1
            2, 0, 0, 0, 2, 0, 2, b'o', b'n', // bool "on" since version 2
        ];
        assert_eq!(v, expected);
        assert_eq!(decode_definition(&v), Ok((ti, schema.clone())));
        let plain = TableInfo {
            hot_retention_ms: None,
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
            ..ti
        };
        let empty = encode_definition(plain, &Schema::default());
        // Without a roll-up retention, version 4 (which builds before version 5 read).
        assert_eq!(empty[0], DEFINITION_V4);
        assert_eq!(empty.len(), DEFINITION_V4_MIN_LEN);
        assert_eq!(decode_definition(&empty), Ok((plain, Schema::default())));
        let hours_only = TableInfo { rollup_retention: RollupRetention { hour_ms: Some(1), day_ms: None }, ..plain };
        let v5 = encode_definition(hours_only, &Schema::default());
        assert_eq!((v5[0], v5.len()), (DEFINITION_V5, DEFINITION_V5_MIN_LEN));
        assert_eq!(decode_definition(&v5), Ok((hours_only, Schema::default())));
        // What the encoder never writes.
        let bad = |at: usize, byte: u8| {
            let mut b = v.clone();
            b[at] = byte;
            decode_definition(&b).expect_err("invalid")
        };
        assert_eq!(bad(14, 0x80), "retention 9223372036941175808 ms is out of range");
        assert_eq!(bad(30, 0x80), "retention 9223372037027575808 ms is out of range");
        // An hour retention (4,298,504,832 ms) longer than the day one.
        assert_eq!(bad(25, 1), "the day roll-up retention must be at least the hour roll-up retention");
        assert_eq!(bad(38, 2), "unknown flags 0x02");
        assert_eq!(bad(47, 9), "field 0: unknown type code 9");
        assert_eq!(bad(51, 3), "field `a` added in version 3, outside 1..=2");
        assert_eq!(bad(54, b'z'), "field names not strictly ascending at `on`");
        assert_eq!(decode_definition(&v[..v.len() - 1]), Err("field 1 of 2 is truncated".to_string()));
        assert_eq!(decode_definition(&[&v[..], &[0]].concat()), Err("1 bytes after the last field".to_string()));
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
            let db = crate::store::open(dir.path(), &crate::DbOptions::default(), &Default::default()).unwrap();
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
                hot_retention_ms: None,
                cold_retention_ms: None,
                rollup_retention: RollupRetention::FOREVER,
                rollup_floor: RollupFloor::NONE,
                schema: Schema::default(),
            })
        );
        assert_eq!(
            store.table("old.daily"),
            Some(TableInfo {
                id: 2,
                partition: PartitionSize::Day,
                hot_retention_ms: None,
                cold_retention_ms: None,
                rollup_retention: RollupRetention::FOREVER
            })
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

    #[test]
    fn a_roll_up_retention_is_checked_kept_across_a_restart_and_set_again_by_a_definition() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let day = DAY_MS as u64;
        let spec = |hour_ms: Option<u64>, day_ms: Option<u64>| TableSpec {
            rollup_retention: RollupRetention { hour_ms, day_ms },
            fields: vec![("a".into(), FieldType::F64)],
            ..TableSpec::default()
        };
        match store.define_table_with("t", &spec(Some(0), None)) {
            Err(Error::InvalidTable { detail, .. }) => {
                assert_eq!(detail, "a roll-up retention must be from 1 to 2^63-1 milliseconds")
            }
            other => panic!("expected InvalidTable, got {other:?}"),
        }
        let (def, created) = store.define_table_with("t", &spec(Some(90 * day), Some(730 * day))).unwrap();
        assert_eq!(
            (def.rollup_retention.hour_ms, def.rollup_retention.day_ms, created),
            (Some(90 * day), Some(730 * day), true)
        );
        // Set again, shorter: the same table, the same schema version.
        let (def, created) = store.define_table_with("t", &spec(Some(30 * day), None)).unwrap();
        assert_eq!(
            (def.rollup_retention, def.schema.version, created),
            (RollupRetention { hour_ms: Some(30 * day), day_ms: None }, 1, false)
        );
        drop(store);
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let kept = store.table_definition("t").unwrap();
        assert_eq!(
            (kept.rollup_retention, kept.schema.version),
            (RollupRetention { hour_ms: Some(30 * day), day_ms: None }, 1)
        );
        // Back to forever: stored as version 4 again.
        store.define_table_with("t", &spec(None, None)).unwrap();
        let v = store.db.get_cf(cf(&store.db, CF_CATALOG), keys::name_key("t")).unwrap().unwrap();
        assert_eq!(v[0], DEFINITION_V4);
        assert_eq!(store.table("t").unwrap().rollup_retention, RollupRetention::FOREVER);
    }

    #[test]
    fn a_cold_retention_is_checked_kept_across_a_restart_and_part_of_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let spec = |hot: Option<u64>, cold: Option<u64>| TableSpec {
            partition: PartitionSize::Day,
            hot_retention_ms: hot,
            cold_retention_ms: cold,
            ..TableSpec::default()
        };
        let invalid = |r: Result<(TableDefinition, bool)>| match r {
            Err(Error::InvalidTable { detail, .. }) => detail,
            other => panic!("expected InvalidTable, got {other:?}"),
        };
        let day = DAY_MS as u64;
        assert_eq!(
            invalid(store.define_table_with("t", &spec(None, Some(400 * day)))),
            "a cold retention needs a hot retention (data leaves RocksDB only after the hot one)"
        );
        assert_eq!(
            invalid(store.define_table_with("t", &spec(Some(30 * day), Some(30 * day)))),
            "the cold retention must be longer than the hot retention (both count from a partition's end)"
        );
        assert_eq!(
            invalid(store.define_table_with("t", &spec(Some(30 * day), Some(0)))),
            "the cold retention must be from 1 to 2^63-1 milliseconds"
        );
        assert_eq!(store.tables(), Vec::<String>::new());

        let (def, created) = store.define_table_with("t", &spec(Some(30 * day), Some(400 * day))).unwrap();
        assert_eq!((def.hot_retention_ms, def.cold_retention_ms, created), (Some(30 * day), Some(400 * day), true));
        // Another cold retention is another table definition.
        match store.define_table_with("t", &spec(Some(30 * day), Some(500 * day))) {
            Err(Error::TableExists { existing, requested, .. }) => assert_eq!(
                (existing.to_string(), requested.to_string()),
                (
                    "partition day, hot retention 30d, cold retention 400d".to_string(),
                    "partition day, hot retention 30d, cold retention 500d".to_string()
                )
            ),
            other => panic!("expected TableExists, got {other:?}"),
        }
        drop(store);
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        assert_eq!(store.table_definition("t").map(|d| d.cold_retention_ms), Some(Some(400 * day)));
        let (_, created) = store.define_table_with("t", &spec(Some(30 * day), Some(400 * day))).unwrap();
        assert!(!created);
    }
}
