//! Every RocksDB key of every column family, and nothing else.
//!
//! Rules (row-key design): integers are fixed-width big-endian so byte order equals numeric
//! order; signed integers have their sign bit flipped (`i ^ MIN`) so negative values — hours
//! before 1970 — sort before positive ones; fields are concatenated most-selective-first for
//! the access pattern they serve. Each layout below has a test asserting its order.
//!
//! | column family  | key layout (bytes)                                                   | serves |
//! |----------------|----------------------------------------------------------------------|--------|
//! | `buckets`      | table u32 · partition i32⊕ · device u64 · hour i32⊕ (20 B)           | one device's hours of one partition are contiguous; a partition of a table is one range |
//! | `buckets`      | the hour's 20 B · minute u8 (21 B, [`BucketKey::encode_slice`])      | an outlier's sub-buckets, right after its hour's bucket (see `crate::outliers`) |
//! | `latest`       | table u32 · device u64 (12 B)                                        | multi-get of many devices' latest reading |
//! | `dead_letters` | received_ms i64⊕ · seq u64 (16 B)                                    | newest first by reverse scan |
//! | `registry`     | `b'n'` · device name bytes → id u64; `b'i'` · id u64 → name bytes   | name → id (equals-only index), id → name |
//! | `registry`     | `b'd'` · id u64 → device record (9 B)                                | id → record: kind, tags, parent; ancestors of X in one read |
//! | `registry`     | `b't'` · key len u16 · key · value len u16 · value · device name → id u64 | tag `k=v` → devices, one prefix scan per (k, v), name order |
//! | `registry`     | `b'o'` · table u32 · device u64 (13 B) → hour i32 BE flagged ([`outlier_key`]) | the outlier flags, loaded at open |
//! | `registry`     | `b'c'` · path len u16 · parent path · device name → id u64 ([`child_index_key`]) | a group's direct children, one prefix scan read with a cursor (wide-row child pattern) |
//! | `registry`     | `b'a'` · path len u16 · group path · device name → id u64          | group path → every device under it at any depth, one prefix scan, name order |
//! | `catalog`      | `b'n'` · table name bytes → table definition; `b'i'` · id u32 → name bytes; `b'w'` ([`MAX_EVENT_TS_KEY`]) → max event time i64 BE; `b's'` ([`DEAD_LETTER_SEQ_KEY`]) → the next dead letter's sequence number u64 BE; `b'g'` ([`ARCHIVE_GENERATION_KEY`]) → the archive manifest's generation: count u64 BE · the last commit's random tag u64 BE; `b'l'` · table u32 · partition i32⊕ → the first spill run's time that found the archived partition's late readings, i64 BE ([`archive_late_key`]); `b'x'` · table u32 · partition i32⊕ → empty ([`deleted_partition_key`]); `b'y'` · table u32 · hour i32⊕ · device u64 → empty ([`after_delete_key`]); `b'z'` · table u32 · a day's first hour i32⊕ · device u64 → empty ([`day_after_delete_key`]); `b'f'` · table u32 → first hour start i64 BE · first day start i64 BE ([`rollup_floor_key`]) | table name → definition, id → name; the roll-up watermark's base; dead-letter numbers never given twice, whatever the clock did or retention deleted; an older copy of the store told from its archive's newer state; late readings' wait for a rewrite counted across restarts; the partitions deleted for good, loaded at open (until their every hour is past the hour roll-up retention); the device-hours first rolled up after such a delete, and the device-days past the hour roll-up retention first made after one, one range a partition each; the roll-ups a table keeps at most, whatever a later definition's retention says |
//! | `dirty`        | table u32 · hour i32⊕ · device u64 (16 B) → mark generation u64 BE   | the roll-up work queue: one table's oldest hours first |
//! | `rollups`      | table u32 · level u8 · device u64 · period start i64⊕ (21 B)        | one device's periods of one level are contiguous, in time order |
//! | `counters`     | table u32 · hour i32⊕ (8 B) → u64 BE, merged by addition ([`counter_key`]) | approximate messages per table and wall-clock hour, one range per table |
//! | `rollups`      | table u32 · 3 + level u8 · group path · `0x00` · period start i64⊕ ([`GroupRollupKey`]) | one group's (or, path `""`, the table's) periods of one level are contiguous, in time order |
//! | `rollups`      | table u32 · 6 + level u8 · group path · `0x00` · period start i64⊕ · shard u32 ([`GroupShardKey`]) | one group period's shards are contiguous, in shard order |
//! | `offsets`      | `b'k'` · topic len u16 · topic bytes · partition i32⊕ → next offset i64 BE | the Kafka position of each partition, written in the WriteBatch of the data it covers; one topic's partitions are contiguous, in partition order |
//! | `archive`      | table u32 · partition i32⊕ (8 B, [`archive_key`]) → manifest entry | the archived partitions of a table are contiguous, oldest first |
//! | `auth`         | token hash [u8; 32] ([`token_key`]) → token record; token hash · table name bytes ([`grant_key`]) → permission bits | the permission check is one multi-get of both keys; one token's record and grants are contiguous, grants in table-name order |
//!
//! The table-definition value (versioned) is documented and owned by [`crate::catalog`]; the
//! device-record value (versioned) by [`crate::registry`]; the token record and permission
//! values (versioned) by [`crate::auth`].
//!
//! The two registry indexes end with the device name, after a length-prefixed head: the head
//! of one (tag key, tag value) or one group path is never a prefix of another's (the lengths
//! differ or the bytes do), so [`tag_index_prefix`] and [`under_index_prefix`] each select
//! exactly their entries, sorted by device name — a cursor is the last name returned, and the
//! next page seeks just past it ([`after`]). A device has one `b'a'` entry per ancestor of its
//! place (`site_z`, `site_z/line_3`): "all devices under Z" is one scan at any depth.
//!
//! A partition of a table is the key range `[table · partition, table · partition+1)` of
//! `buckets` ([`partition_range`]): retention drops it with one range delete, and the
//! partitions that hold data are found by seeking from one prefix to the next.
//! `⊕` marks a signed field stored with its sign bit flipped. Partition and hour are indexes
//! since the epoch (see `model::PartitionSize::index_of`, `model::Hour`); an i32 covers
//! ±245,000 years of hours, so event times outside `i32` hours are rejected before they get
//! here (ingest accepts years 1900–2200).

use model::Hour;

/// Length of a `buckets` key.
pub const BUCKET_KEY_LEN: usize = 20;
/// Length of a `latest` key.
pub const LATEST_KEY_LEN: usize = 12;
/// Length of a `dead_letters` key.
pub const DEAD_LETTER_KEY_LEN: usize = 16;

/// Length of a `dirty` key.
pub const DIRTY_KEY_LEN: usize = 16;
/// Length of a `rollups` key.
pub const ROLLUP_KEY_LEN: usize = 21;
/// `catalog` key of the largest event time the store has committed (the base of the roll-up
/// watermark). One byte, so no name or id entry can equal it.
pub const MAX_EVENT_TS_KEY: [u8; 1] = [b'w'];
/// `catalog` key of the next dead letter's sequence number, written with every batch of dead
/// letters and by [`crate::Store::expire_dead_letters`]: the newest dead letter's number need not
/// be the largest (a clock set back), and a store whose every dead letter expired must not
/// number its next ones from 0 again. One byte.
pub const DEAD_LETTER_SEQ_KEY: [u8; 1] = [b's'];
/// `catalog` key of the archive's generation: how many commits have changed the archive
/// manifest (`crate::archive`, "Generation"), written in the same WriteBatch as each. One byte.
pub const ARCHIVE_GENERATION_KEY: [u8; 1] = [b'g'];

/// `catalog` prefix of the partitions whose readings were deleted for good (a hot retention
/// without an archive, or a cold retention): `b'x'` · table u32 · partition i32⊕, value empty
/// ([`deleted_partition_key`]). Deleted again by the roll-up pass once every hour of the
/// partition is past its table's hour roll-up retention (no pass reads it then).
pub const DELETED_PREFIX: u8 = b'x';

/// `catalog` key marking partition `partition` of table `table` deleted for good.
pub fn deleted_partition_key(table: u32, partition: i32) -> [u8; 1 + PARTITION_PREFIX_LEN] {
    let mut k = [DELETED_PREFIX; 1 + PARTITION_PREFIX_LEN];
    k[1..].copy_from_slice(&partition_prefix(table, partition));
    k
}

/// `catalog` prefix of the device-hours first rolled up after their partition was deleted for
/// good: `b'y'` · table u32 · hour i32⊕ · device u64, value empty ([`after_delete_key`]).
pub const AFTER_DELETE_PREFIX: u8 = b'y';

/// `catalog` key marking the hour `hour` of device `device` in table `table` as first rolled up
/// after its partition's readings were deleted for good: its record counts only readings
/// written since, all of which its bucket holds, so it may be recomputed from it.
pub fn after_delete_key(table: u32, hour: i32, device: u64) -> [u8; 17] {
    let mut k = [AFTER_DELETE_PREFIX; 17];
    k[1..5].copy_from_slice(&table.to_be_bytes());
    k[5..9].copy_from_slice(&flip32(hour));
    k[9..17].copy_from_slice(&device.to_be_bytes());
    k
}

/// `catalog` prefix of the device-days first made after a partition of theirs was deleted for
/// good: `b'z'` · table u32 · the day's first hour i32⊕ · device u64, value empty
/// ([`day_after_delete_key`]).
pub const DAY_AFTER_DELETE_PREFIX: u8 = b'z';

/// `catalog` key marking the day starting at hour `first_hour` of device `device` in table
/// `table` as first made after a partition of it was deleted for good (a day past the hour
/// roll-up retention, made from its buckets): its record counts only readings written since,
/// all of which its buckets hold, so it may be made again from them, as the hours of
/// [`after_delete_key`] are.
pub fn day_after_delete_key(table: u32, first_hour: i32, device: u64) -> [u8; 17] {
    let mut k = after_delete_key(table, first_hour, device);
    k[0] = DAY_AFTER_DELETE_PREFIX;
    k
}

/// `catalog` prefix of the archived partitions whose late readings wait in RocksDB for a
/// rewrite: `b'l'` · table u32 · partition i32⊕ → the time of the first spill run that found
/// them, ms i64 BE ([`archive_late_key`]; `crate::archive`, the late wait).
pub const ARCHIVE_LATE_PREFIX: u8 = b'l';

/// `catalog` key of the late wait of archived partition `partition` of table `table`.
pub fn archive_late_key(table: u32, partition: i32) -> [u8; 1 + PARTITION_PREFIX_LEN] {
    let mut k = deleted_partition_key(table, partition);
    k[0] = ARCHIVE_LATE_PREFIX;
    k
}

/// The (table, partition) of an [`archive_late_key`].
pub fn decode_archive_late_key(k: &[u8]) -> Option<(u32, i32)> {
    match k {
        [ARCHIVE_LATE_PREFIX, rest @ ..] if rest.len() == PARTITION_PREFIX_LEN => partition_of(rest),
        _ => None,
    }
}

/// The (table, partition) of a [`deleted_partition_key`].
pub fn decode_deleted_partition_key(k: &[u8]) -> Option<(u32, i32)> {
    match k {
        [DELETED_PREFIX, rest @ ..] if rest.len() == PARTITION_PREFIX_LEN => partition_of(rest),
        _ => None,
    }
}

/// `catalog` prefix of the roll-up floors: `b'f'` · table u32 → the first hour start i64 BE and
/// the first day start i64 BE that the table's roll-ups keep whatever its roll-up retention says
/// (`i64::MIN`: none; [`crate::rollups::RollupFloor`]), set when a definition changes the
/// retention ([`rollup_floor_key`]).
pub const ROLLUP_FLOOR_PREFIX: u8 = b'f';

/// `catalog` key of table `table`'s roll-up floor.
pub fn rollup_floor_key(table: u32) -> [u8; 5] {
    let mut k = [ROLLUP_FLOOR_PREFIX; 5];
    k[1..].copy_from_slice(&table.to_be_bytes());
    k
}

/// The table of a [`rollup_floor_key`].
pub fn decode_rollup_floor_key(k: &[u8]) -> Option<u32> {
    match k {
        [ROLLUP_FLOOR_PREFIX, a, b, c, d] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Prefix of Kafka entries in `offsets` (other sources may get their own byte).
pub const KAFKA_OFFSET_PREFIX: u8 = b'k';

/// `offsets` key of one Kafka partition: `b'k'` · topic length u16 · topic · partition i32⊕.
/// `None` for a topic longer than `u16::MAX` bytes (Kafka allows 249).
pub fn kafka_offset_key(topic: &str, partition: i32) -> Option<Vec<u8>> {
    let len = u16::try_from(topic.len()).ok()?;
    let mut k = Vec::with_capacity(1 + 2 + topic.len() + 4);
    k.push(KAFKA_OFFSET_PREFIX);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(&flip32(partition));
    Some(k)
}

/// Parses a [`kafka_offset_key`]: `(topic, partition)`; `None` if it is not one.
pub fn decode_kafka_offset_key(k: &[u8]) -> Option<(String, i32)> {
    let (&prefix, rest) = k.split_first()?;
    if prefix != KAFKA_OFFSET_PREFIX || rest.len() < 2 {
        return None;
    }
    let len = u16::from_be_bytes(arr(rest, 0)) as usize;
    if rest.len() != 2 + len + 4 {
        return None;
    }
    let topic = std::str::from_utf8(&rest[2..2 + len]).ok()?.to_string();
    Some((topic, unflip32(arr(rest, 2 + len))))
}

/// Length of a token hash (SHA-256), the head of every `auth` key.
pub const TOKEN_HASH_LEN: usize = 32;

/// `auth` key of a token's own record: its hash alone (32 B). It sorts first among the token's
/// keys, before its [`grant_key`]s.
pub fn token_key(hash: &[u8; TOKEN_HASH_LEN]) -> [u8; TOKEN_HASH_LEN] {
    *hash
}

/// `auth` key of a token's permission on one table: hash · table name bytes. A table name is
/// never empty, so no grant key equals a [`token_key`]; the hash has a fixed width, so one
/// token's grants are the keys that start with its hash.
pub fn grant_key(hash: &[u8; TOKEN_HASH_LEN], table: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(TOKEN_HASH_LEN + table.len());
    k.extend_from_slice(hash);
    k.extend_from_slice(table.as_bytes());
    k
}

/// The table of a [`grant_key`]; `None` for a token record or a malformed key.
pub fn decode_grant_key(k: &[u8]) -> Option<&str> {
    match k.get(TOKEN_HASH_LEN..) {
        Some(rest) if !rest.is_empty() => std::str::from_utf8(rest).ok(),
        _ => None,
    }
}

/// Prefix of name → id entries in `registry` and `catalog`.
pub const NAME_PREFIX: u8 = b'n';
/// Prefix of id → name entries in `registry` and `catalog`.
pub const ID_PREFIX: u8 = b'i';

fn flip32(v: i32) -> [u8; 4] {
    ((v as u32) ^ 0x8000_0000).to_be_bytes()
}

fn unflip32(b: [u8; 4]) -> i32 {
    (u32::from_be_bytes(b) ^ 0x8000_0000) as i32
}

fn flip64(v: i64) -> [u8; 8] {
    ((v as u64) ^ 0x8000_0000_0000_0000).to_be_bytes()
}

fn unflip64(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ 0x8000_0000_0000_0000) as i64
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// Key of one hour bucket: `table · partition · device · hour`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketKey {
    /// Table id.
    pub table: u32,
    /// Partition index of the table's partition size.
    pub partition: i32,
    /// Device id from the registry.
    pub device: u64,
    /// Hour since the epoch.
    pub hour: i32,
}

impl BucketKey {
    /// The key's bytes.
    pub fn encode(&self) -> [u8; BUCKET_KEY_LEN] {
        let mut k = [0u8; BUCKET_KEY_LEN];
        k[0..4].copy_from_slice(&self.table.to_be_bytes());
        k[4..8].copy_from_slice(&flip32(self.partition));
        k[8..16].copy_from_slice(&self.device.to_be_bytes());
        k[16..20].copy_from_slice(&flip32(self.hour));
        k
    }

    /// The key of sub-bucket `slice` of this hour (an outlier's, see `crate::outliers`): the
    /// hour's key and one byte, so the sub-buckets sort right after the hour's bucket, in order.
    pub fn encode_slice(&self, slice: u8) -> [u8; BUCKET_KEY_LEN + 1] {
        let mut k = [0u8; BUCKET_KEY_LEN + 1];
        k[..BUCKET_KEY_LEN].copy_from_slice(&self.encode());
        k[BUCKET_KEY_LEN] = slice;
        k
    }

    /// Parses a key; `None` if it is not a bucket key.
    pub fn decode(k: &[u8]) -> Option<BucketKey> {
        (k.len() == BUCKET_KEY_LEN).then(|| BucketKey {
            table: u32::from_be_bytes(arr(k, 0)),
            partition: unflip32(arr(k, 4)),
            device: u64::from_be_bytes(arr(k, 8)),
            hour: unflip32(arr(k, 16)),
        })
    }

    /// The hour as a model type.
    pub fn hour(&self) -> Hour {
        Hour(self.hour as i64)
    }
}

/// `registry` key of the outlier flag of `device` in `table`: `b'o'` · table u32 · device u64.
pub fn outlier_key(table: u32, device: u64) -> [u8; 13] {
    let mut k = [OUTLIER_PREFIX; 13];
    k[1..5].copy_from_slice(&table.to_be_bytes());
    k[5..13].copy_from_slice(&device.to_be_bytes());
    k
}

/// Parses an [`outlier_key`] into (table, device).
pub fn decode_outlier_key(k: &[u8]) -> Option<(u32, u64)> {
    (k.len() == 13 && k[0] == OUTLIER_PREFIX).then(|| (u32::from_be_bytes(arr(k, 1)), u64::from_be_bytes(arr(k, 5))))
}

/// Prefix of outlier flags in `registry`.
pub const OUTLIER_PREFIX: u8 = b'o';

/// Prefix shared by every bucket of one table's partition: `table · partition` (8 B).
pub fn partition_prefix(table: u32, partition: i32) -> [u8; PARTITION_PREFIX_LEN] {
    let mut k = [0u8; PARTITION_PREFIX_LEN];
    k[0..4].copy_from_slice(&table.to_be_bytes());
    k[4..8].copy_from_slice(&flip32(partition));
    k
}

/// `archive` key of one partition of a table: the same 8 bytes as its [`partition_prefix`] in
/// `buckets`, so [`partition_of`] decodes both.
pub fn archive_key(table: u32, partition: i32) -> [u8; PARTITION_PREFIX_LEN] {
    partition_prefix(table, partition)
}

/// Length of a [`partition_prefix`].
pub const PARTITION_PREFIX_LEN: usize = 8;

/// A `buckets` key range `(from, to)`, `to` excluded, between two [`partition_prefix`]es.
pub type PartitionRange = ([u8; PARTITION_PREFIX_LEN], [u8; PARTITION_PREFIX_LEN]);

/// The `buckets` key range `[from, to)` holding every bucket of one partition of a table: from
/// its prefix to the prefix of the next partition. `None` for partition `i32::MAX`, which has
/// no next partition in the table (it lies some 245,000 years after 1970).
pub fn partition_range(table: u32, partition: i32) -> Option<PartitionRange> {
    let next = partition.checked_add(1)?;
    Some((partition_prefix(table, partition), partition_prefix(table, next)))
}

/// The table and partition of a `buckets` key (its first 8 bytes); `None` when shorter.
pub fn partition_of(k: &[u8]) -> Option<(u32, i32)> {
    (k.len() >= PARTITION_PREFIX_LEN).then(|| (u32::from_be_bytes(arr(k, 0)), unflip32(arr(k, 4))))
}

/// Key of a device's latest reading in a table: `table · device`.
pub fn latest_key(table: u32, device: u64) -> [u8; LATEST_KEY_LEN] {
    let mut k = [0u8; LATEST_KEY_LEN];
    k[0..4].copy_from_slice(&table.to_be_bytes());
    k[4..12].copy_from_slice(&device.to_be_bytes());
    k
}

/// Key of a dead letter: `received_ms · seq`; `seq` orders letters received in one millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeadLetterKey {
    /// Receive time, epoch ms.
    pub received_ms: i64,
    /// Sequence number, unique per store.
    pub seq: u64,
}

impl DeadLetterKey {
    /// The key's bytes.
    pub fn encode(&self) -> [u8; DEAD_LETTER_KEY_LEN] {
        let mut k = [0u8; DEAD_LETTER_KEY_LEN];
        k[0..8].copy_from_slice(&flip64(self.received_ms));
        k[8..16].copy_from_slice(&self.seq.to_be_bytes());
        k
    }

    /// Parses a key; `None` if it is not a dead-letter key.
    pub fn decode(k: &[u8]) -> Option<DeadLetterKey> {
        (k.len() == DEAD_LETTER_KEY_LEN)
            .then(|| DeadLetterKey { received_ms: unflip64(arr(k, 0)), seq: u64::from_be_bytes(arr(k, 8)) })
    }
}

/// Key of a roll-up work-queue mark: `table · hour · device`. A table's marks sort oldest
/// hour first, so the roll-up stage reads them in watermark order and stops at the first hour
/// the watermark has not passed. The value is the mark's generation (u64 BE), rewritten by
/// every write to the device-hour, so the roll-up stage deletes a mark only when no write
/// touched its hour since it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DirtyKey {
    /// Table id.
    pub table: u32,
    /// Hour since the epoch.
    pub hour: i32,
    /// Device id from the registry.
    pub device: u64,
}

impl DirtyKey {
    /// The key's bytes.
    pub fn encode(&self) -> [u8; DIRTY_KEY_LEN] {
        let mut k = [0u8; DIRTY_KEY_LEN];
        k[0..4].copy_from_slice(&self.table.to_be_bytes());
        k[4..8].copy_from_slice(&flip32(self.hour));
        k[8..16].copy_from_slice(&self.device.to_be_bytes());
        k
    }

    /// Parses a key; `None` if it is not a dirty key.
    pub fn decode(k: &[u8]) -> Option<DirtyKey> {
        (k.len() == DIRTY_KEY_LEN).then(|| DirtyKey {
            table: u32::from_be_bytes(arr(k, 0)),
            hour: unflip32(arr(k, 4)),
            device: u64::from_be_bytes(arr(k, 8)),
        })
    }
}

/// The first `dirty` (or `rollups`) key of table `table`: its id, 4 B. Every key of the table
/// sorts at or after it and before the prefix of `table + 1`.
pub fn table_prefix(table: u32) -> [u8; 4] {
    table.to_be_bytes()
}

/// Key of one roll-up record: `table · level · device · period start`. The level is
/// [`rollup_level_code`]; one device's records of one level are one contiguous range in time
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RollupKey {
    /// Table id.
    pub table: u32,
    /// Level code ([`rollup_level_code`]).
    pub level: u8,
    /// Device id from the registry.
    pub device: u64,
    /// First millisecond of the period.
    pub start: i64,
}

impl RollupKey {
    /// The key's bytes.
    pub fn encode(&self) -> [u8; ROLLUP_KEY_LEN] {
        let mut k = [0u8; ROLLUP_KEY_LEN];
        k[0..4].copy_from_slice(&self.table.to_be_bytes());
        k[4] = self.level;
        k[5..13].copy_from_slice(&self.device.to_be_bytes());
        k[13..21].copy_from_slice(&flip64(self.start));
        k
    }

    /// Parses a key; `None` if it is not a roll-up key.
    pub fn decode(k: &[u8]) -> Option<RollupKey> {
        (k.len() == ROLLUP_KEY_LEN).then(|| RollupKey {
            table: u32::from_be_bytes(arr(k, 0)),
            level: k[4],
            device: u64::from_be_bytes(arr(k, 5)),
            start: unflip64(arr(k, 13)),
        })
    }
}

/// The persisted code of a roll-up level: hour 0, day 1, month 2. Part of the key format.
pub fn rollup_level_code(level: rollup::period::Level) -> u8 {
    match level {
        rollup::period::Level::Hour => 0,
        rollup::period::Level::Day => 1,
        rollup::period::Level::Month => 2,
    }
}

/// `counters` key of table `table`'s count for hour index `hour` (wall clock).
pub fn counter_key(table: u32, hour: i32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[0..4].copy_from_slice(&table.to_be_bytes());
    k[4..8].copy_from_slice(&flip32(hour));
    k
}

/// Parses a [`counter_key`] into (table, hour); `None` if it is not one.
pub fn decode_counter_key(k: &[u8]) -> Option<(u32, i32)> {
    (k.len() == 8).then(|| (u32::from_be_bytes(arr(k, 0)), unflip32(arr(k, 4))))
}

/// Level codes of group and table records: [`rollup_level_code`] plus this, so they never
/// collide with a device record's 21-byte keys of codes 0–2.
pub const GROUP_LEVEL_BASE: u8 = 3;

/// Key of one roll-up record of a group of the registry, or of the whole table (the empty
/// path): `table · (3 + level) · path · 0x00 · period start`. Paths hold no `0x00` (the
/// registry accepts printable ASCII), so the terminator keeps one path's records apart from a
/// longer path's, and one group's records of one level are one contiguous range in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupRollupKey<'a> {
    /// Table id.
    pub table: u32,
    /// Level code ([`rollup_level_code`]); the key stores it plus [`GROUP_LEVEL_BASE`].
    pub level: u8,
    /// Group path; `""` for the table.
    pub path: &'a str,
    /// First millisecond of the period.
    pub start: i64,
}

impl GroupRollupKey<'_> {
    /// The key's bytes.
    pub fn encode(&self) -> Vec<u8> {
        group_key(self.table, GROUP_LEVEL_BASE + self.level, self.path, self.start, 0)
    }

    /// Parses a key; `None` if it is not a group roll-up key.
    pub fn decode(k: &[u8]) -> Option<GroupRollupKey<'_>> {
        let (table, code, path, start) = group_key_parts(k, 0)?;
        (GROUP_LEVEL_BASE..SHARD_LEVEL_BASE).contains(&code).then(|| GroupRollupKey {
            table,
            level: code - GROUP_LEVEL_BASE,
            path,
            start,
        })
    }
}

/// `table · code · path · 0x00 · start`, the head of group and shard keys, with room for
/// `tail` bytes more.
fn group_key(table: u32, code: u8, path: &str, start: i64, tail: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(14 + path.len() + tail);
    k.extend_from_slice(&table.to_be_bytes());
    k.push(code);
    k.extend_from_slice(path.as_bytes());
    k.push(0);
    k.extend_from_slice(&flip64(start));
    k
}

/// The table, level code, path and start of a key of [`group_key`]'s head followed by `tail`
/// bytes; `None` if it is not one.
fn group_key_parts(k: &[u8], tail: usize) -> Option<(u32, u8, &str, i64)> {
    let n = k.len().checked_sub(tail)?;
    if n < 14 || k[n - 9] != 0 {
        return None;
    }
    Some((u32::from_be_bytes(arr(k, 0)), k[4], std::str::from_utf8(&k[5..n - 9]).ok()?, unflip64(arr(k, n - 8))))
}

/// Level codes of the shards of group and table records: [`rollup_level_code`] plus this.
pub const SHARD_LEVEL_BASE: u8 = 6;

/// Level codes of the super-shards of group and table records: [`rollup_level_code`] plus
/// this. A release before super-shards reads these keys as shards of no level it knows, and
/// leaves them.
pub const SUPER_LEVEL_BASE: u8 = 9;

/// Key of one shard of a group's (or the table's) record: the merge of the records of the
/// group's devices whose ids share `id >> crate::rollups::SHARD_BITS`,
/// `table · (6 + level) · path · 0x00 · period start · shard u32`; or of one super-shard, the
/// merge of the shards that share `shard >> crate::rollups::SUPER_BITS`, under code `9 + level`
/// with that number. One group period's shards are one contiguous range, in shard order, and
/// so are its super-shards. A group period is the merge of its super-shards, so that one
/// device's record replaced recomputes its shard and super-shard, not the group from all its
/// devices (`crate::rollups`, step 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupShardKey<'a> {
    /// Table id.
    pub table: u32,
    /// Level code ([`rollup_level_code`]); the key stores it plus [`SHARD_LEVEL_BASE`], or
    /// [`SUPER_LEVEL_BASE`] for a super-shard.
    pub level: u8,
    /// Group path; `""` for the table.
    pub path: &'a str,
    /// First millisecond of the period.
    pub start: i64,
    /// Whether the key is a super-shard's (`shard` is then the super-shard's number).
    pub super_shard: bool,
    /// The shard.
    pub shard: u32,
}

impl GroupShardKey<'_> {
    /// The key's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let base = if self.super_shard { SUPER_LEVEL_BASE } else { SHARD_LEVEL_BASE };
        let mut k = group_key(self.table, base + self.level, self.path, self.start, 4);
        k.extend_from_slice(&self.shard.to_be_bytes());
        k
    }

    /// Parses a key; `None` if it is not a shard or super-shard key.
    pub fn decode(k: &[u8]) -> Option<GroupShardKey<'_>> {
        let (table, code, path, start) = group_key_parts(k, 4)?;
        let shard = u32::from_be_bytes(arr(k, k.len() - 4));
        let (super_shard, level) = match code {
            _ if code >= SUPER_LEVEL_BASE => (true, code - SUPER_LEVEL_BASE),
            _ if code >= SHARD_LEVEL_BASE => (false, code - SHARD_LEVEL_BASE),
            _ => return None,
        };
        Some(GroupShardKey { table, level, path, start, super_shard, shard })
    }
}

/// `registry` / `catalog` key of a name → id entry.
pub fn name_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(NAME_PREFIX);
    k.extend_from_slice(name.as_bytes());
    k
}

/// `registry` key of a device id → name entry.
pub fn device_id_key(id: u64) -> [u8; 9] {
    let mut k = [ID_PREFIX; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `catalog` key of a table id → name entry.
pub fn table_id_key(id: u32) -> [u8; 5] {
    let mut k = [ID_PREFIX; 5];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Prefix of id → device record entries in `registry`.
pub const RECORD_PREFIX: u8 = b'd';
/// Prefix of tag index entries in `registry`.
pub const TAG_PREFIX: u8 = b't';
/// Prefix of group (ancestor) index entries in `registry`.
pub const UNDER_PREFIX: u8 = b'a';
/// Prefix of child (direct parent) index entries in `registry`.
pub const CHILD_PREFIX: u8 = b'c';
/// Longest tag key, tag value or group path a registry index key holds (the u16 length field
/// holds more; the registry validates shorter ones).
pub const MAX_INDEXED_LEN: usize = u16::MAX as usize;

/// `registry` key of a device id → record entry.
pub fn device_record_key(id: u64) -> [u8; 9] {
    let mut k = [RECORD_PREFIX; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

fn push_len_prefixed(k: &mut Vec<u8>, part: &str) {
    // Callers validate lengths; a longer part is cut so the length field stays truthful.
    let bytes = &part.as_bytes()[..part.len().min(MAX_INDEXED_LEN)];
    k.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    k.extend_from_slice(bytes);
}

/// Prefix of every tag index entry of (`key`, `value`): `b't' · len · key · len · value`.
pub fn tag_index_prefix(key: &str, value: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + key.len() + value.len());
    k.push(TAG_PREFIX);
    push_len_prefixed(&mut k, key);
    push_len_prefixed(&mut k, value);
    k
}

/// Tag index entry of `device` carrying tag `key=value`.
pub fn tag_index_key(key: &str, value: &str, device: &str) -> Vec<u8> {
    let mut k = tag_index_prefix(key, value);
    k.extend_from_slice(device.as_bytes());
    k
}

/// Prefix of every group index entry of `path`: `b'a' · len · path`.
pub fn under_index_prefix(path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + path.len());
    k.push(UNDER_PREFIX);
    push_len_prefixed(&mut k, path);
    k
}

/// Prefix of every child index entry of `path`: `b'c' · len · path`.
pub fn child_index_prefix(path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + path.len());
    k.push(CHILD_PREFIX);
    push_len_prefixed(&mut k, path);
    k
}

/// Child index entry of `device`, whose parent is `path` (directly).
pub fn child_index_key(path: &str, device: &str) -> Vec<u8> {
    let mut k = child_index_prefix(path);
    k.extend_from_slice(device.as_bytes());
    k
}

/// Group index entry of `device`, which lies under `path` (at any depth).
pub fn under_index_key(path: &str, device: &str) -> Vec<u8> {
    let mut k = under_index_prefix(path);
    k.extend_from_slice(device.as_bytes());
    k
}

/// Where the page after cursor `name` starts in an index under `prefix`: `prefix · name · 0x00`,
/// the first key in byte order greater than `prefix · name`.
pub fn after(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + name.len() + 1);
    k.extend_from_slice(prefix);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k
}

/// Converts an hour or partition index to the key's i32, `None` when out of the key's range.
pub fn to_i32(index: i64) -> Option<i32> {
    i32::try_from(index).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bucket_key() -> impl Strategy<Value = BucketKey> {
        (any::<u32>(), any::<i32>(), any::<u64>(), any::<i32>())
            .prop_map(|(table, partition, device, hour)| BucketKey { table, partition, device, hour })
    }

    #[test]
    fn auth_keys_group_one_token_record_first_then_grants_by_table() {
        let (a, b) = ([1u8; TOKEN_HASH_LEN], [2u8; TOKEN_HASH_LEN]);
        let mut keys = vec![
            grant_key(&b, "a"),
            grant_key(&a, "zz"),
            token_key(&b).to_vec(),
            grant_key(&a, "b.x"),
            token_key(&a).to_vec(),
        ];
        keys.sort();
        let expected = vec![
            token_key(&a).to_vec(),
            grant_key(&a, "b.x"),
            grant_key(&a, "zz"),
            token_key(&b).to_vec(),
            grant_key(&b, "a"),
        ];
        assert_eq!(keys, expected);
        assert_eq!(decode_grant_key(&grant_key(&a, "fleet.readings")), Some("fleet.readings"));
        assert_eq!(decode_grant_key(&token_key(&a)), None);
    }

    proptest! {
        #[test]
        fn bucket_key_byte_order_is_field_order(a in bucket_key(), b in bucket_key()) {
            let (ka, kb) = (a.encode(), b.encode());
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(BucketKey::decode(&ka), Some(a));
        }

        #[test]
        fn bucket_keys_from_timestamps_sort_by_time(
            table in 0u32..4, device in 0u64..4,
            ts_a in -4_000_000_000_000i64..4_000_000_000_000,
            ts_b in -4_000_000_000_000i64..4_000_000_000_000,
        ) {
            // Same table and device: byte order is time order, across 1970 and partitions.
            let key = |ts: i64| BucketKey {
                table,
                partition: to_i32(model::PartitionSize::Day.index_of(ts)).expect("in range"),
                device,
                hour: to_i32(Hour::of(ts).0).expect("in range"),
            }.encode();
            let (ha, hb) = (Hour::of(ts_a), Hour::of(ts_b));
            prop_assert_eq!(key(ts_a).cmp(&key(ts_b)), ha.cmp(&hb));
        }

        #[test]
        fn dead_letter_key_order(a in any::<(i64, u64)>(), b in any::<(i64, u64)>()) {
            let ka = DeadLetterKey { received_ms: a.0, seq: a.1 };
            let kb = DeadLetterKey { received_ms: b.0, seq: b.1 };
            prop_assert_eq!(ka.encode().cmp(&kb.encode()), a.cmp(&b));
            prop_assert_eq!(DeadLetterKey::decode(&ka.encode()), Some(ka));
        }

        #[test]
        fn dirty_key_byte_order_is_field_order(a in any::<(u32, i32, u64)>(), b in any::<(u32, i32, u64)>()) {
            let ka = DirtyKey { table: a.0, hour: a.1, device: a.2 };
            let kb = DirtyKey { table: b.0, hour: b.1, device: b.2 };
            prop_assert_eq!(ka.encode().cmp(&kb.encode()), a.cmp(&b));
            prop_assert_eq!(DirtyKey::decode(&ka.encode()), Some(ka));
            prop_assert!(ka.encode().starts_with(&table_prefix(a.0)));
        }

        #[test]
        fn rollup_key_byte_order_is_field_order(a in any::<(u32, u8, u64, i64)>(), b in any::<(u32, u8, u64, i64)>()) {
            let ka = RollupKey { table: a.0, level: a.1, device: a.2, start: a.3 };
            let kb = RollupKey { table: b.0, level: b.1, device: b.2, start: b.3 };
            prop_assert_eq!(ka.encode().cmp(&kb.encode()), a.cmp(&b));
            prop_assert_eq!(RollupKey::decode(&ka.encode()), Some(ka));
        }

        #[test]
        fn kafka_offset_keys_round_trip_and_sort_by_partition(
            topic in "[a-z._-]{1,40}", a in any::<i32>(), b in any::<i32>(), other in "[a-z._-]{1,40}",
        ) {
            let (ka, kb) = (kafka_offset_key(&topic, a).expect("short"), kafka_offset_key(&topic, b).expect("short"));
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(decode_kafka_offset_key(&ka), Some((topic.clone(), a)));
            // Another topic's keys never interleave with this topic's: the length prefix and
            // the bytes keep each topic's partitions in one contiguous range.
            if other != topic {
                let ko = kafka_offset_key(&other, a).expect("short");
                let (lo, hi) = (kafka_offset_key(&topic, i32::MIN).expect("short"), kafka_offset_key(&topic, i32::MAX).expect("short"));
                prop_assert!(ko < lo || ko > hi);
            }
        }

        #[test]
        fn latest_key_order(a in any::<(u32, u64)>(), b in any::<(u32, u64)>()) {
            prop_assert_eq!(latest_key(a.0, a.1).cmp(&latest_key(b.0, b.1)), a.cmp(&b));
        }

        #[test]
        fn partition_prefix_is_a_prefix(k in bucket_key()) {
            let prefix = partition_prefix(k.table, k.partition);
            prop_assert!(k.encode().starts_with(&prefix));
            prop_assert_eq!(partition_of(&k.encode()), Some((k.table, k.partition)));
        }

        /// A key lies in a partition's range exactly when it has that table and partition: the
        /// range delete of one partition touches no other partition and no other table.
        #[test]
        fn partition_range_holds_exactly_its_partition(k in bucket_key(), table in any::<u32>(), partition in any::<i32>()) {
            let key = k.encode();
            match partition_range(table, partition) {
                Some((from, to)) => {
                    let inside = from.as_slice() <= key.as_slice() && key.as_slice() < to.as_slice();
                    prop_assert_eq!(inside, (k.table, k.partition) == (table, partition));
                }
                None => prop_assert_eq!(partition, i32::MAX),
            }
        }

        #[test]
        fn partition_prefix_order(a in any::<(u32, i32)>(), b in any::<(u32, i32)>()) {
            prop_assert_eq!(partition_prefix(a.0, a.1).cmp(&partition_prefix(b.0, b.1)), a.cmp(&b));
        }
    }

    fn short() -> impl Strategy<Value = String> {
        "[a-c_/]{0,4}"
    }

    proptest! {
        /// A tag index prefix selects exactly the entries of its (key, value), and within it the
        /// entries sort by device name.
        #[test]
        fn tag_index_prefix_selects_exactly_its_pair(
            a in (short(), short(), short()), b in (short(), short(), short()),
        ) {
            let ka = tag_index_key(&a.0, &a.1, &a.2);
            let same = (&a.0, &a.1) == (&b.0, &b.1);
            prop_assert_eq!(ka.starts_with(&tag_index_prefix(&b.0, &b.1)), same);
            if same {
                prop_assert_eq!(ka.cmp(&tag_index_key(&b.0, &b.1, &b.2)), a.2.cmp(&b.2));
            }
            prop_assert!(!ka.starts_with(&under_index_prefix(&a.0)));
        }

        /// The group index: `under_index_prefix(p)` selects exactly the entries of path `p` (not
        /// of `p` followed by more characters), in device-name order.
        #[test]
        fn under_index_prefix_selects_exactly_its_path(a in (short(), short()), b in (short(), short())) {
            let ka = under_index_key(&a.0, &a.1);
            prop_assert_eq!(ka.starts_with(&under_index_prefix(&b.0)), a.0 == b.0);
            if a.0 == b.0 {
                prop_assert_eq!(ka.cmp(&under_index_key(&b.0, &b.1)), a.1.cmp(&b.1));
            }
        }

        /// The page after cursor `c` holds exactly the names greater than `c`.
        #[test]
        fn after_cursor_starts_past_exactly_the_cursor(path in short(), c in short(), name in short()) {
            let start = after(&under_index_prefix(&path), &c);
            prop_assert_eq!(under_index_key(&path, &name) >= start, name > c);
        }

        #[test]
        fn device_record_key_order(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(device_record_key(a).cmp(&device_record_key(b)), a.cmp(&b));
        }
    }

    #[test]
    fn registry_index_layouts() {
        assert_eq!(tag_index_key("k", "vv", "d1"), b"t\x00\x01k\x00\x02vvd1".to_vec());
        assert_eq!(under_index_key("s/l", "d"), b"a\x00\x03s/ld".to_vec());
        assert_eq!(device_record_key(258), [b'd', 0, 0, 0, 0, 0, 0, 1, 2]);
        // `site` does not select the entries of `site_2`, whose length differs.
        assert!(!under_index_key("site_2", "d").starts_with(&under_index_prefix("site")));
    }

    #[test]
    fn partition_range_edges() {
        // The last partitions of a table end where the next table begins.
        let (from, to) = partition_range(7, i32::MAX - 1).expect("has a successor");
        assert_eq!(from, [0, 0, 0, 7, 0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(to, [0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(partition_range(7, i32::MAX), None);
        assert_eq!(partition_range(7, -1), Some(([0, 0, 0, 7, 0x7f, 0xff, 0xff, 0xff], [0, 0, 0, 7, 0x80, 0, 0, 0])));
        assert_eq!(partition_of(&[0, 0, 0, 7, 0x80, 0, 0]), None);
    }

    #[test]
    fn rollup_levels_sort_hour_day_month_and_periods_before_1970_first() {
        use rollup::period::Level;
        let b = BucketKey { table: 1, partition: 2, device: 3, hour: 4 };
        let next = BucketKey { hour: 5, ..b };
        assert!(b.encode()[..] < b.encode_slice(0)[..] && b.encode_slice(0) < b.encode_slice(59));
        assert!(b.encode_slice(59)[..] < next.encode()[..], "sub-buckets sort before the next hour");
        assert_eq!(decode_outlier_key(&outlier_key(9, 77)), Some((9, 77)));
        assert!(counter_key(1, -1) < counter_key(1, 0));
        assert!(counter_key(1, i32::MAX) < counter_key(2, i32::MIN));
        assert_eq!(decode_counter_key(&counter_key(7, -3)), Some((7, -3)));
        let g = |path, start| GroupRollupKey { table: 1, level: 0, path, start }.encode();
        assert!(g("", 5) < g("a", -5), "the table's records come before any group's");
        assert!(g("a", i64::MAX) < g("a/b", i64::MIN), "one group's records are contiguous");
        assert!(g("a", -1) < g("a", 0));
        assert_eq!(g("ab", 0), [0, 0, 0, 1, 3, b'a', b'b', 0, 0x80, 0, 0, 0, 0, 0, 0, 0]);
        let back = g("site/line", -7);
        assert_eq!(
            GroupRollupKey::decode(&back),
            Some(GroupRollupKey { table: 1, level: 0, path: "site/line", start: -7 })
        );
        assert_eq!(
            GroupRollupKey::decode(&RollupKey { table: 1, level: 1, device: 9, start: 0 }.encode()),
            None,
            "a device record's key is not a group's"
        );
        let sh =
            |path, start, shard| GroupShardKey { table: 1, level: 0, path, start, super_shard: false, shard }.encode();
        assert!(sh("", 5, u32::MAX) < sh("", 6, 0), "one group period's shards are contiguous");
        assert!(sh("a", 0, 1) < sh("a", 0, 2) && sh("a", i64::MAX, u32::MAX) < sh("a/b", i64::MIN, 0));
        assert_eq!(sh("ab", 0, 258), [0, 0, 0, 1, 6, b'a', b'b', 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(
            GroupShardKey::decode(&sh("site/line", -7, 9)),
            Some(GroupShardKey { table: 1, level: 0, path: "site/line", start: -7, super_shard: false, shard: 9 })
        );
        // A super-shard's key: after every shard of every period of the level, and read back so.
        let sup = GroupShardKey { table: 1, level: 1, path: "ab", start: 0, super_shard: true, shard: 3 };
        assert_eq!(sup.encode(), [0, 0, 0, 1, 10, b'a', b'b', 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
        assert_eq!(GroupShardKey::decode(&sup.encode()), Some(sup));
        assert!(sh("ab", i64::MAX, u32::MAX) < sup.encode());
        for shard in [0, 1, 256, u32::MAX] {
            assert_eq!(GroupRollupKey::decode(&sh("s", 0, shard)), None, "a shard's key is not a group's");
        }
        assert_eq!(GroupShardKey::decode(&back), None, "a group's key is not a shard's");
        let codes: Vec<u8> = Level::ALL.into_iter().map(rollup_level_code).collect();
        assert_eq!(codes, [0, 1, 2]);
        let k = |start| RollupKey { table: 1, level: 1, device: 9, start }.encode();
        assert!(k(-86_400_000) < k(0));
        assert!(k(0) < k(86_400_000));
        assert_eq!(k(0), [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0x80, 0, 0, 0, 0, 0, 0, 0]);
        let d = DirtyKey { table: 2, hour: -1, device: 3 }.encode();
        assert_eq!(d, [0, 0, 0, 2, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 3]);
        assert!(MAX_EVENT_TS_KEY[0] != NAME_PREFIX && MAX_EVENT_TS_KEY[0] != ID_PREFIX);
        for prefix in [NAME_PREFIX, ID_PREFIX, MAX_EVENT_TS_KEY[0], DELETED_PREFIX, AFTER_DELETE_PREFIX] {
            assert_ne!(DEAD_LETTER_SEQ_KEY[0], prefix);
        }
        for prefix in
            [NAME_PREFIX, ID_PREFIX, MAX_EVENT_TS_KEY[0], DEAD_LETTER_SEQ_KEY[0], DELETED_PREFIX, AFTER_DELETE_PREFIX]
        {
            assert_ne!(ROLLUP_FLOOR_PREFIX, prefix);
        }
        let k = rollup_floor_key(0x0102_0304);
        assert_eq!(k, [b'f', 1, 2, 3, 4]);
        assert_eq!(decode_rollup_floor_key(&k), Some(0x0102_0304));
        assert_eq!(decode_rollup_floor_key(&k[..4]), None);
        assert_eq!(decode_rollup_floor_key(&deleted_partition_key(1, 2)[..5]), None);
        for prefix in [NAME_PREFIX, ID_PREFIX, MAX_EVENT_TS_KEY[0], DELETED_PREFIX] {
            assert_ne!(AFTER_DELETE_PREFIX, prefix);
        }
        for prefix in [NAME_PREFIX, ID_PREFIX, MAX_EVENT_TS_KEY[0]] {
            assert_ne!(DELETED_PREFIX, prefix);
        }
        // One table's hours in time order, a partition's hours one range.
        assert!(after_delete_key(1, -1, u64::MAX) < after_delete_key(1, 0, 0));
        assert!(after_delete_key(1, i32::MAX, u64::MAX) < after_delete_key(2, i32::MIN, 0));
        // Days' marks: the same order, under their own prefix, after the hours'.
        assert_eq!(day_after_delete_key(7, -3, 9)[1..], after_delete_key(7, -3, 9)[1..]);
        assert_eq!(day_after_delete_key(7, -3, 9)[0], b'z');
        assert!(after_delete_key(u32::MAX, i32::MAX, u64::MAX) < day_after_delete_key(0, i32::MIN, 0));
        let k = deleted_partition_key(7, -3);
        assert_eq!(k, [b'x', 0, 0, 0, 7, 0x7f, 0xff, 0xff, 0xfd]);
        assert_eq!(decode_deleted_partition_key(&k), Some((7, -3)));
        assert_eq!(decode_deleted_partition_key(&k[..8]), None);
        let mut other = k;
        other[0] = b'w';
        assert_eq!(decode_deleted_partition_key(&other), None);
    }

    #[test]
    fn hour_before_epoch_sorts_first() {
        let k = |hour| BucketKey { table: 1, partition: 0, device: 1, hour }.encode();
        assert!(k(-1) < k(0));
        assert!(k(i32::MIN) < k(-1));
        assert!(k(0) < k(i32::MAX));
        assert_eq!(k(-1), [0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff]);
    }
}
