//! The roll-up stage's storage: the work queue of dirty hours, the watermark, and the roll-up
//! records of hours and days — per device, per group of the registry's hierarchy, and per
//! table (computed pattern: the records are derived, the buckets stay the source). A month is
//! read as the merge of its days (at most 31 records): storing months too rewrote a third
//! more records every hour, for every device, to save that merge on the rarer month reads.
//! (Stores written before keep month records that nothing reads any more.)
//!
//! # Work queue
//!
//! Every WriteBatch of readings puts a mark `table · hour · device` into the `dirty` column
//! family for each device-hour it touches (layout in [`crate::keys::DirtyKey`]), except a
//! device-hour of an hour still open that this store has already marked since it opened: no
//! pass reads an open hour's marks, so the first one stands for all (`crate::open_marks`). The
//! mark's value is a generation (u64 BE) that grows with every write batch, so a mark rewritten
//! by a late reading carries another value than the one the roll-up stage read.
//!
//! # Watermark
//!
//! The watermark is the largest event time the store has committed minus the allowed
//! lateness. The largest event time is persisted: a batch that raises it also puts it under
//! [`crate::keys::MAX_EVENT_TS_KEY`] in `catalog`, in the same WriteBatch, and it is loaded at
//! open. An hour is due once its end is at or before the watermark.
//!
//! Event time counts only up to the wall clock: a batch raises the largest event time to its
//! newest reading or to the clock's now, whichever is earlier. A device whose clock is far
//! ahead (a real-time clock reset to 2106, say) would otherwise close every hour of the store
//! at once, for good: each write into the current hour would then be marked again and each
//! pass would flush the whole write buffer. Its readings are stored and read as any, and its
//! hours are rolled up once the clock reaches them. A store opens with its largest event time
//! at most the clock's now: one an older version let such a clock raise, or written while the
//! machine's clock was ahead, would otherwise keep every hour up to it closed.
//!
//! # One pass ([`Store::process_rollups`])
//!
//! The due marks, oldest hour first per table, are done in chunks of [`CHUNK_MARKS`] (fewer for
//! tables of many fields: [`CHUNK_FIELDS`]); one chunk
//! is one WriteBatch holding every record it changes and the deletion of its marks, so a crash
//! leaves either all of a chunk's work or none of it (its marks stay, and it is redone). The
//! chunk holds its records until then with their wide quantile sketches packed
//! (`Record::pack_wide_sketches`), and the records it merges into others apart, packed, until
//! the merge is made (`Delta`): dense, a sketch spanning 1e-8 to 1e308 takes 286 KiB, and a
//! chunk of them 1.6 GB (QA36 F2), its merges for groups of a few devices 1.4 GB (QA38 F1).
//!
//! 1. Each mark's hour is recomputed from its bucket ([`Record::of_readings`]), and its newest
//!    reading is merged into the device's `latest` entry (which writes leave at an older reading
//!    of the hour: see `Store::latest`). A mark whose bucket retention has dropped leaves the
//!    records as they are: roll-ups outlive raw data. So does a mark of an hour rolled up
//!    before in a partition whose readings were deleted for good since (a hot retention
//!    without an archive, a cold retention: `Store::is_deleted_partition`): its bucket holds
//!    only what a write brought after the delete (a replay, a device's late backlog), which
//!    cannot be told from what the record already counts; it stays in RocksDB until the next
//!    retention run deletes it again. A retention run rolls up the due marks of the partitions
//!    it deletes for good before it deletes them (`Store::roll_up_then_delete`), so the marks
//!    such a delete leaves without their buckets are the ones not due then and those of
//!    archived hours that could not be read (due marks left after its rounds, of writers faster
//!    than the roll-up, keep the partitions for a later run).
//! 2. The device's groups are the whole table (path `""`) and every ancestor of its place in
//!    the registry. A device-hour rolled up for the first time is merged as it is into the
//!    device's day and into each group's hour and day (records are monoids, so that is
//!    exact). A device-hour rolled up again (late or rewritten data) replaces what it was, so
//!    the records above it are recomputed instead: each day from its hours, and each group's
//!    hour from its shards — once per chunk, whatever the number of marks that asked for it.
//!    A group's period is also kept in shards ([`crate::keys::GroupShardKey`]): shard `s`
//!    merges the records of the group's devices whose ids are `s << SHARD_BITS` up to the
//!    next (1,024 ids, handed out in sequence); and in super-shards, each the merge of
//!    `1 << SUPER_BITS` consecutive shards (32). A first-time record is merged into its shard
//!    as into the group, and leaves its super-shard stale (`stale`: a write, where merging
//!    into it would read it too); a replaced one has its shard recomputed from the shard's
//!    devices' records, its super-shard from its shards, and the group is the merge of its
//!    super-shards, the stale ones made again from their shards. Recomputing the group from
//!    all its devices' records instead cost a pass 0.8 s at 100,000 devices and 10 s at 1M
//!    for ten late readings (0.12 s and 0.3 s from shards; from super-shards, 0.11 s at 1M
//!    and 0.15 s at 10M, where shards took 0.96 s; BENCHMARKS.md, "Late readings into hours
//!    rolled up" and "Late readings at 10M devices"). The first recomputation after an
//!    hour's first roll-up finds every super-shard stale, and merges all the shards once
//!    (1.7 s at 10M).
//!    The shard numbered `u32::MAX` says that a period's shards add up to its record: it holds
//!    that record's exact aggregates, written with the period's first record and with each
//!    one made from its shards. A period without it (rolled up before shards existed), or
//!    whose record differs from it (changed since by a release before the shards: a rollback
//!    and forward again), has its shards made again, from every device of the group, at its
//!    next recomputation (the cost before, once); merges go into its shards meanwhile. One
//!    whose mark a release before super-shards wrote (`Whole::Shards`) has its super-shards
//!    made again from its shards. A group's days past the hour roll-up retention (below) are
//!    kept the same way.
//!
//! An archived hour is read from its partition's Parquet file (its late readings, if any, from
//! RocksDB). A pass takes every due mark of a device's day in an archived partition longer than
//! an hour at once, in one run (`Store::with_days_whole`), and a worker reads the device's day
//! from the file once for the run, cutting its hours from it (`ArchivedDay`): hours archived
//! before any roll-up (a backlog spilled before the stage reached it) read the file once a
//! device-day, where a read an hour read the device's rows 24 times over (a backlog of 2,000
//! devices' days at a reading a minute: 853 device-hours a second rolled up before, 12,451 now,
//! against 15,287 from RocksDB; BENCHMARKS.md, "A backlog archived before the roll-up reached
//! it").
//!
//! An archived hour whose readings cannot be read (a damaged or missing Parquet file, an
//! unreachable bucket) keeps its mark. The stage remembers such marks (up to
//! [`MAX_REMEMBERED_UNREADABLE`]) and gives the pass's budget to the other due marks first;
//! the remembered ones take what is left, oldest first, so they are tried again whenever a pass
//! has room. Without that, a table's oldest unreadable hours would fill every pass's budget
//! and hold back every hour after them.
//!
//! A mark is deleted only if it still holds the generation read before its bucket was read,
//! checked under the writers' lock: a write that reached the hour meanwhile has rewritten it,
//! so the hour is done again in a later pass (and its groups recomputed, since the hour then
//! has a record). Done marks in a row of the queue ([`RANGE_DELETE_MIN_MARKS`] or more, no
//! other mark between them) go in one range delete, which the queue's later scans skip whole,
//! where a tombstone a mark had every later scan step over all the marks done until a
//! compaction dropped them.
//!
//! A group's records follow the registry at the time each hour is rolled up: re-parenting a
//! device changes the groups of the hours rolled up after it, not of those before. Except for
//! a group hour's shard recomputed later (a member's hour rolled up again): it is rebuilt from
//! the devices of the shard under the group at that time (`Store::group_changed`; the whole
//! hour from all of them, if the group had no record of it), so a device moved since counts
//! in it if it is of that shard, and still in its old group's hour until that one's shard is
//! recomputed. Keeping each group hour's members to rebuild it from would
//! cost an entry per device, group and hour.
//!
//! # Retention
//!
//! A table may keep its hour and day records for a while only ([`RollupRetention`], part of its
//! definition): a period's records expire once its end is that long ago, and months, read from
//! days, are answered only whole ([`first_kept_period`]). Reads start at the first period kept,
//! so an expired record is never shown; the `rollups` column family's compaction filter
//! (`ExpiredRollups`) drops it from disk when a compaction reaches it (RocksDB compacts every
//! file at least once in 30 days when a filter is set). A day whose first hour has expired
//! (or will within the hour, so that no pass recomputes a day from hours a compaction is
//! dropping) cannot be recomputed from its hours: a due mark of it (a late reading, a device's
//! backlog uploaded days late) has the device's day recomputed from the buckets of all its
//! hours instead (`Store::past_days`, `RollupSummary::days_from_buckets`), raw data outliving
//! hour roll-ups. The device's day replaces what it was, and its groups' days follow as from an
//! hour: merged into when the device had no record of the day, else recomputed from their
//! devices' days. A pass takes every due mark of such a device-day at once, in one chunk
//! (`Store::with_days_whole`), so that a backlog is made once a day and merged, not once
//! an hour with its groups' days recomputed each time. The hours of it still kept (and an hour
//! from expiring) get their records, and their groups' hours, as any; the others none. Such a
//! day is left as it is, the mark done (`RollupSummary::past_rollup_retention`), when it is
//! past the day roll-up retention too (within the hour, as above), or when a partition of it
//! was deleted for good and the device has a record of the day: its buckets no longer hold
//! what its record counts. A day first made after such a delete counts what is stored, as an
//! hour first rolled up after, and is marked so (`keys::day_after_delete_key`): made again
//! from what is stored at a later reading, until the next delete of one of its partitions
//! takes the mark off (and `forget_deleted_partitions` with its partition's); a partition past its retention that no retention run has
//! deleted yet holds all that was written into it, so a backlog written there is rolled up
//! before the delete takes it (QA35 F1: such a day was left with no record). A store written
//! before 2026-12-05 may have forgotten a delete (the older rule forgot them once past the
//! hour roll-up retention): a late reading into such a day recomputes it from what is left.
//! Its newest reading still settles `latest`. So a partition deleted for good all of whose hours are
//! before both the first hour and the first day kept is never looked at again: the pass
//! forgets its mark (`RollupSummary::deleted_partitions_forgotten`).
//!
//! What a retention has hidden stays hidden: a definition that changes a table's roll-up
//! retention records the first hour and day its old one kept (and passes still wrote: an hour
//! from leaving it) at that moment as the table's [`RollupFloor`] (a `catalog` key,
//! [`crate::keys::rollup_floor_key`]), which reads, passes and compactions keep to whatever the
//! new retention says. A longer retention so keeps more
//! as time goes on, but never shows again a period the old one had hidden (of which a
//! compaction may have dropped a part, or not yet).
//!
//! # Record format (`rollups` column family, keys in [`crate::keys::RollupKey`] and
//! [`crate::keys::GroupRollupKey`])
//!
//! Version 6, integers and floats big-endian, counts and lengths as varints (LEB128: seven
//! bits a byte, the lowest first, the top bit set on every byte but the last):
//!
//! ```text
//! u8 6 · varint field count · [zigzag varint base: the earliest first ts of the fields]
//! · per field, in name order:
//!   varint name length · name (UTF-8) · u8 form, then by form:
//!   1 (one point): varint ts − base · f64 value
//!   0 (any other): varint count · f64 min · f64 max
//!     · varint first ts − base · f64 first value · varint last ts − first ts · f64 last value
//!     · varint n · n × f64 sum parts
//!     · varint length · quantile sketch (rollup::approx::Quantiles::write_packed, given the
//!       field's min and max; length 0: none)
//! · varint length · distinct devices (rollup::approx::Distinct::write_compact; length 0: none)
//! ```
//!
//! Form 1 stands for the aggregates of that one point, its sketch included (`FieldAgg::of`):
//! a field with one reading in the period, as every field of a device that reports once an
//! hour has in its hours. Written whole it took ~140 bytes (56 of them its sketch's): a
//! one-reading hour of the TSBS `readings` table's seven fields took ~970 bytes, 191 in version
//! 5 and 145 in version 6 (its times a byte each past the base). A field of one point without
//! a sketch (a version 1 record's) takes form 0. The sum parts are the exact sum's partials
//! followed by its non-finite part when that is not zero (see
//! [`rollup::exact::ExactSum::partials`]); keeping them, not the rounded sum, lets a day merge
//! its hours exactly. A sketch packed is its non-empty bins, without the min and max the field
//! holds (see `rollup::approx`): an hour of 60 readings of the seven fields takes 585 bytes,
//! 1,005 in version 5.
//!
//! Older versions are still read; a record rewritten by a pass is written as version 6.
//! Version 5 is version 6 without the base, its times `i64`s, its sketches in the compact form
//! (`Quantiles::write_compact`).
//! Version 3 is version 5's form 0 for every field, without the form byte, with `u16` field
//! count, name lengths and `n`, a `u64` count and `u32` sketch lengths. Version 4 is version
//! 3 with `u32` where it has `u16`, written for a record of 65,536 fields or more. Version 2 is
//! version 3 with the sketches in their plain postcard bytes (`Quantiles::to_bytes`,
//! `Distinct::to_bytes`), about twice the size; version 1 is version 2 without the sketch and
//! distinct-devices parts (its fields have no quantiles). Readers reject unknown versions.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::{Bound, ControlFlow};
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use model::{Hour, PartitionSize, Reading, TimeRange, DAY_MS, HOUR_MS};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions, DB};
use rollup::approx::{Distinct, Quantiles};
use rollup::exact::{Exact, ExactSum};
use rollup::period::{GroupLevel, Level};
use rollup::varint;
use rollup::Merge;

use crate::archive::ArchivedPartition;
use crate::catalog::{first_kept_partition, RollupRetention};
use crate::keys::{
    self, BucketKey, DirtyKey, GroupRollupKey, GroupShardKey, RollupKey, GROUP_LEVEL_BASE, SHARD_LEVEL_BASE,
};
use crate::open_marks::OpenMarks;
use crate::store::{cf, CF_BUCKETS, CF_CATALOG, CF_DIRTY, CF_LATEST, CF_REGISTRY, CF_ROLLUPS};
use crate::{codec, db_err, read, Error, Result, Store, TableInfo};

pub use rollup::record::{FieldAgg, Record};

/// Bytes a WriteBatch entry takes besides its key and value, at most: a type tag, a column
/// family id and two lengths (varints).
const BATCH_ENTRY_OVERHEAD: usize = 1 + 5 + 5 + 5;

/// Dirty marks one WriteBatch of a pass covers at most.
pub const CHUNK_MARKS: usize = 2048;

/// Field aggregates (a field of a device-hour's record) a chunk's marks make at most, by the
/// fields their tables' records had in the chunks before (a table none of whose records the
/// store has made yet: the fields of its schema). While a chunk is made, each takes about
/// 3.4 KB (its quantile sketch, and those of the days and groups it merges into): a write of
/// 500 devices' hour of 5,000 fields put the store past 5 GB at each start, in one chunk
/// (QA60 F4). The TSBS fleet's 7 fields a mark make 14,336 a chunk of [`CHUNK_MARKS`]; 5,000
/// fields, 14 marks a chunk (the one reaching the bound included).
pub const CHUNK_FIELDS: usize = 65_536;

/// The fewest done marks in a row of the work queue that a chunk deletes with one range delete
/// (`Store::delete_done_marks`); fewer are deleted one by one.
pub const RANGE_DELETE_MIN_MARKS: usize = 8;

/// Rounds of roll-ups a retention run gives the marks of the partitions it deletes for good
/// ([`Store::roll_up_then_delete`]): writes landing in them meanwhile have theirs rolled up in
/// the next round. Past these, a round is given only to fewer due marks than the round before
/// rolled up (the roll-up gaining on the writers), up to [`ROLL_UP_BEFORE_DELETE_MAX_TRIES`];
/// marks due after the last round keep the partitions for a later run.
const ROLL_UP_BEFORE_DELETE_TRIES: u32 = 3;

/// Rounds a retention run gives at most (see [`ROLL_UP_BEFORE_DELETE_TRIES`]).
const ROLL_UP_BEFORE_DELETE_MAX_TRIES: u32 = 16;

/// A shard of a group's record holds the devices whose ids share `id >> SHARD_BITS`: 1,024
/// ids (handed out in sequence), 9,766 shards a period for the table of 10M devices. Ten late
/// readings in ten shards have a pass read 10,240 device records and all the table's shards:
/// shards of 256 ids did that in half the time at 100,000 devices, but would have 39,063
/// shards merged at 10M; shards of 4,096 ids, 40,960 device records (BENCHMARKS.md, "Late
/// readings into hours rolled up").
pub const SHARD_BITS: u32 = 10;

/// The shard number under which a group period's shards are whole: there from the period's
/// first record on, or once a recomputation has made them all (a period rolled up before
/// shards existed has none, or those of the devices merged in since). It holds the exact
/// aggregates of the group record the shards add up to ([`whole_mark`]).
const WHOLE: u32 = u32::MAX;

/// The shard holding `device`'s records in its groups' (below [`WHOLE`]).
fn shard_of(device: u64) -> u32 {
    u32::try_from(device >> SHARD_BITS).unwrap_or(WHOLE - 1).min(WHOLE - 1)
}

/// A super-shard of a group's record merges `1 << SUPER_BITS` consecutive shards (32 shards,
/// 32,768 device ids), and the group's record is the merge of its super-shards: 306 for the
/// table of 10M devices. Ten late readings in ten shards have a pass merge the 32 shards of
/// each of their super-shards and every super-shard (some 600 records), not every shard
/// (9,766): 963 ms a pass at 10M devices before, 147 ms after (BENCHMARKS.md, "Late readings
/// at 10M devices"). 32 is about the square root of 10M devices' shards by ten late readings.
pub const SUPER_BITS: u32 = 5;

/// The super-shard of `shard`.
fn super_of(shard: u32) -> u32 {
    shard >> SUPER_BITS
}

/// The shards of super-shard `s`: from the first to before the last (below [`WHOLE`]).
fn shards_of(s: u32) -> (u32, u32) {
    let at = |s: u64| u32::try_from(s << SUPER_BITS).unwrap_or(WHOLE);
    (at(u64::from(s)), at(u64::from(s) + 1))
}

/// The key of shard `shard` of `group`'s record of the `level` period starting at `start`.
fn shard_key(table: u32, group: &str, level: Level, start: i64, shard: u32) -> Vec<u8> {
    let level = keys::rollup_level_code(level);
    GroupShardKey { table, level, path: group, start, super_shard: false, shard }.encode()
}

/// The key of super-shard `s` of `group`'s record of the `level` period starting at `start`.
fn super_key(table: u32, group: &str, level: Level, start: i64, s: u32) -> Vec<u8> {
    let level = keys::rollup_level_code(level);
    GroupShardKey { table, level, path: group, start, super_shard: true, shard: s }.encode()
}

/// The keys of a group period's shards, from the first to before its [`WHOLE`] mark.
fn shard_range((table, group, level, start): (u32, &str, Level, i64)) -> (Vec<u8>, Vec<u8>) {
    (shard_key(table, group, level, start, 0), shard_key(table, group, level, start, WHOLE))
}

/// The keys of a group period's super-shards.
fn super_range((table, group, level, start): (u32, &str, Level, i64)) -> (Vec<u8>, Vec<u8>) {
    (super_key(table, group, level, start, 0), super_key(table, group, level, start, u32::MAX))
}

/// The number of the shard or super-shard under key `k`.
fn part_number(k: &[u8]) -> Result<u32> {
    GroupShardKey::decode(k).map(|k| k.shard).ok_or_else(|| corrupt_record("shard key".into()))
}

/// The value of a super-shard whose shards changed since it was made (a merge into one of
/// them): no field, and an empty device count. A super-shard made is the merge of its
/// devices' records, which count at least one device; one none of whose shards holds a
/// record is not stored.
fn stale() -> Record {
    Record { fields: BTreeMap::new(), devices: Some(Distinct::default()) }
}

/// Whether a super-shard's value is [`stale`]: to be made again from its shards.
fn is_stale(record: &Record) -> bool {
    record.fields.is_empty() && record.devices.as_ref().is_none_or(|d| d.estimate() == 0)
}

/// How far a group period's parts add up to its record ([`WHOLE`] mark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whole {
    /// Not known to: a period rolled up before shards existed, or changed since by a release
    /// before them. Its next recomputation makes its shards and super-shards from its devices.
    No,
    /// Its shards do, its super-shards may not: a period rolled up by a release with shards
    /// and before super-shards. Its next recomputation makes its super-shards from its shards.
    Shards,
    /// Its shards and super-shards (those not [`stale`]) do.
    Supers,
}

/// The value under a group period's [`WHOLE`] shard once its parts add up to `record` as far
/// as `whole` says (not [`Whole::No`]): the record's exact aggregates (no sketch), and a device
/// count of none (shards only, as the release before super-shards wrote it) or of one (and
/// super-shards), so that it is stored (an empty record is not). A release before the shards
/// changes the group record and not its shards, which no longer add up to it: the record then
/// differs from the mark ([`whole_of`]), and the next recomputation makes the shards again
/// (QA22 F2: a store opened by the release before and again by this one lost what the older
/// one had rolled up). A release before super-shards keeps the shards and writes its own
/// mark, with no device: the next recomputation here makes the super-shards again.
fn whole_mark(record: &Record, whole: Whole) -> Record {
    let fields = record
        .fields
        .iter()
        .map(|(name, agg)| (name.clone(), FieldAgg { exact: agg.exact.clone(), quantiles: None }))
        .collect();
    let mut devices = Distinct::default();
    if whole == Whole::Supers {
        devices.insert(0);
    }
    Record { fields, devices: Some(devices) }
}

/// How far a group period's parts add up to its `record`, by its [`WHOLE`] mark.
fn whole_of(mark: Option<&Record>, record: &Record) -> Whole {
    let Some(mark) = mark else {
        return Whole::No;
    };
    let same = mark.fields.len() == record.fields.len()
        && mark.fields.iter().zip(&record.fields).all(|((m, a), (n, b))| m == n && a.exact == b.exact);
    match mark.devices.as_ref().map(Distinct::estimate) {
        _ if !same => Whole::No,
        Some(1) => Whole::Supers,
        _ => Whole::Shards,
    }
}

/// Unreadable marks the roll-up stage remembers at most (see the module docs, "One pass"):
/// 16 MB or so. Past it, the others are done in their order among the due marks, as any.
pub const MAX_REMEMBERED_UNREADABLE: usize = 1 << 20;

/// What the roll-up stage keeps from one pass to the next, under the lock that runs one pass
/// at a time.
#[derive(Debug, Default)]
pub(crate) struct PassMemory {
    /// Marks whose hour could not be read from the archive in an earlier pass, and not done
    /// since. (One whose mark went otherwise, with its partition's delete, stays until a pass
    /// does a mark of the same device-hour: at most the bound above.)
    unreadable: HashSet<DirtyKey>,
    /// Fields a record of each table's hours had in the last chunk that made one (by table
    /// id, at least 1): how many marks a chunk takes ([`CHUNK_FIELDS`]).
    fields_per_hour: HashMap<u32, usize>,
}

impl PassMemory {
    /// Remembers the marks of a chunk that could not be read, and forgets the others, which
    /// were read (or whose table the pass did not know yet).
    fn remember_unreadable(&mut self, chunk: &[(DirtyKey, u64)], unreadable: &HashSet<DirtyKey>) {
        if unreadable.is_empty() && self.unreadable.is_empty() {
            return;
        }
        for (mark, _) in chunk {
            if !unreadable.contains(mark) {
                self.unreadable.remove(mark);
            } else if self.unreadable.len() < MAX_REMEMBERED_UNREADABLE {
                self.unreadable.insert(*mark);
            }
        }
    }
}

/// Whose roll-up records: one device, or one group of the registry's hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// A device, by registry id.
    Device(u64),
    /// A group path; `""` is the whole table.
    Group(String),
}

/// What one [`Store::process_rollups`] pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollupSummary {
    /// The watermark of the pass (epoch ms); `None` before the first reading.
    pub watermark: Option<i64>,
    /// Dirty hours done: recomputed (each with its day and its groups'), or left as they are
    /// (counted again below, past a retention).
    pub hours: usize,
    /// Readings read from buckets to recompute them.
    pub readings: usize,
    /// Marks left in place because a write reached their hour during the pass.
    pub rewritten: usize,
    /// Hours rolled up before, whose readings retention has deleted since, that a write reached
    /// again: their records kept as they were (the bucket holds only the new readings).
    pub kept_past_retention: usize,
    /// Dirty hours of a day whose first hour is past the table's hour roll-up retention that
    /// the pass cannot recompute from its buckets: past the day roll-up retention too, or with
    /// a partition deleted for good. Left as they are (module docs, "Retention"); their newest
    /// readings still settle `latest`.
    pub past_rollup_retention: usize,
    /// Days of devices past their table's hour roll-up retention that dirty hours asked for,
    /// recomputed from all their hours' buckets (module docs, "Retention"): each time a pass
    /// does (a backlog uploaded over several passes makes its days several times).
    pub days_from_buckets: usize,
    /// Start of the oldest hour still dirty after the pass (epoch ms), if any.
    pub oldest_dirty_hour_ms: Option<i64>,
    /// Partitions deleted for good whose marks the pass forgot: all their hours are past their
    /// table's hour roll-up retention, so no pass looks at them again (module docs,
    /// "Retention").
    pub deleted_partitions_forgotten: usize,
    /// Dirty hours whose archived readings could not be read (a damaged or missing Parquet
    /// file, an unreachable bucket): left dirty for the next pass, while the others are done;
    /// with the first one's reason.
    pub unreadable: usize,
    /// Why the first unreadable hour could not be read.
    pub unreadable_reason: Option<String>,
    /// [`Store::stop_rollups`] ended the pass before all its hours (the rest stay dirty).
    pub stopped: bool,
    /// Chunks the pass's marks were done in, each one WriteBatch ([`CHUNK_MARKS`],
    /// [`CHUNK_FIELDS`]).
    pub chunks: usize,
}

/// The first period start of `level` that a table's roll-up retention keeps at `now_ms`
/// (`i64::MIN` when it keeps them all); records of earlier periods have expired (module docs,
/// "Retention").
///
/// A period expires once its end is at or before `now_ms - retention`, so the period holding
/// that cutoff is the first one kept (as with partitions: `crate::catalog::first_kept_partition`).
/// A month is the merge of its days: it is kept only whole, from the first month whose first
/// day is kept.
pub fn first_kept_period(level: Level, retention: RollupRetention, now_ms: i64) -> i64 {
    let first_kept = |size: PartitionSize, ms: u64| size.start_ms(first_kept_partition(size, now_ms, ms));
    match level {
        Level::Hour => retention.hour_ms.map_or(i64::MIN, |ms| first_kept(PartitionSize::Hour, ms)),
        Level::Day => retention.day_ms.map_or(i64::MIN, |ms| first_kept(PartitionSize::Day, ms)),
        Level::Month => first_whole_month(first_kept_period(Level::Day, retention, now_ms)),
    }
}

/// The first month all of whose days are kept when `first_day` is the first day kept
/// (`i64::MIN`: all).
fn first_whole_month(first_day: i64) -> i64 {
    if first_day == i64::MIN {
        return i64::MIN;
    }
    let month = Level::Month.period_start(first_day);
    if month == first_day {
        month
    } else {
        // No month is longer than 31 days: 32 days on is within the next one.
        Level::Month.period_start(month.saturating_add(32 * DAY_MS))
    }
}

/// The first hour and day start whose roll-ups a table keeps whatever its roll-up retention
/// says: what its retention had hidden when a definition last changed it (module docs,
/// "Retention"); persisted under [`keys::rollup_floor_key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollupFloor {
    /// First hour start kept (`i64::MIN`: no floor).
    pub hour_ms: i64,
    /// First day start kept (`i64::MIN`: no floor).
    pub day_ms: i64,
}

impl RollupFloor {
    /// No floor.
    pub const NONE: RollupFloor = RollupFloor { hour_ms: i64::MIN, day_ms: i64::MIN };

    /// The `catalog` value: hour start i64 BE · day start i64 BE.
    pub fn encode(&self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.hour_ms.to_be_bytes());
        v[8..].copy_from_slice(&self.day_ms.to_be_bytes());
        v
    }

    /// Decodes [`RollupFloor::encode`]'s bytes; `None` if they are not 16.
    pub fn decode(v: &[u8]) -> Option<RollupFloor> {
        let v: &[u8; 16] = v.try_into().ok()?;
        let at = |i: usize| i64::from_be_bytes(v[i..i + 8].try_into().expect("8 bytes"));
        Some(RollupFloor { hour_ms: at(0), day_ms: at(8) })
    }
}

/// What a table's roll-ups keep: its retention and its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RollupKeep {
    pub(crate) retention: RollupRetention,
    pub(crate) floor: RollupFloor,
}

impl RollupKeep {
    /// Everything kept.
    pub(crate) const ALL: RollupKeep = RollupKeep { retention: RollupRetention::FOREVER, floor: RollupFloor::NONE };

    /// The first period start of `level` kept at `now_ms`: [`first_kept_period`] of the
    /// retention, or the floor if later (a month only whole, from the first day kept an hour
    /// from now: a day leaving the retention within the hour is no longer written, and a month
    /// of it shown could lack what a late reading brought its day, QA21 F1).
    pub(crate) fn first_kept(&self, level: Level, now_ms: i64) -> i64 {
        match level {
            Level::Hour => first_kept_period(Level::Hour, self.retention, now_ms).max(self.floor.hour_ms),
            Level::Day => first_kept_period(Level::Day, self.retention, now_ms).max(self.floor.day_ms),
            Level::Month => first_whole_month(self.first_kept(Level::Day, now_ms.saturating_add(HOUR_MS))),
        }
    }

    /// The floor once a definition sets the retention to `new` at `now_ms`: at each level, the
    /// first period a pass still writes until then (kept an hour from now, [`RollupKeep::may_write`]:
    /// one leaving the retention within the hour may lack what was rolled up since, QA20 F1)
    /// if `new` would keep earlier ones (an hour from now, or now: a period this keep hides
    /// now stays hidden), else none (`new` keeps less, from then on ever less).
    pub(crate) fn floor_after(&self, new: RollupRetention, now_ms: i64) -> RollupFloor {
        // No hour is stored before the first an hour key holds (some 245,000 years ago): a
        // retention that kept everything since (a huge one) hid nothing, and needs no floor.
        let earliest = i64::from(i32::MIN) * HOUR_MS;
        let floor = |level: Level| {
            let soon = now_ms.saturating_add(HOUR_MS);
            let kept = self.first_kept(level, soon);
            // An hour from now the two may start at the same period while this keep's floor
            // hides one more now (its retention's first period, leaving within the hour): a
            // floor set when a retention was removed, the retention then set back (QA34 F8).
            let hides_more_now = self.first_kept(level, now_ms) > first_kept_period(level, new, now_ms);
            if (kept > first_kept_period(level, new, soon) || hides_more_now) && kept > earliest {
                kept
            } else {
                i64::MIN
            }
        };
        RollupFloor { hour_ms: floor(Level::Hour), day_ms: floor(Level::Day) }
    }

    /// Whether an hour starting at `hour_ms` may be rolled up at `now_ms`: not when the first
    /// hour of its day is no longer kept, since its day could then no longer be recomputed from
    /// its hours (module docs, "Retention"); nor in the hour before, so that a pass cannot
    /// recompute a day from hours a compaction starting meanwhile drops.
    pub(crate) fn may_roll_up(&self, hour_ms: i64, now_ms: i64) -> bool {
        Level::Day.period_start(hour_ms) >= self.first_kept(Level::Hour, now_ms.saturating_add(HOUR_MS))
    }

    /// Whether the record of the period of `level` starting at `start` may be written at
    /// `now_ms`: kept, and still an hour from now, so that no pass writes (or recomputes from)
    /// a record a compaction starting meanwhile drops.
    pub(crate) fn may_write(&self, level: Level, start: i64, now_ms: i64) -> bool {
        start >= self.first_kept(level, now_ms.saturating_add(HOUR_MS))
    }
}

/// A device's day: table id, device id, the day's start (epoch ms).
type DeviceDay = (u32, u64, i64);

/// What a pass makes of a device's day past its table's hour roll-up retention, of which a
/// chunk has a due mark (module docs, "Retention").
enum PastDay {
    /// The day's record, recomputed from its hours' buckets; `after_delete` when a partition
    /// of the day was deleted for good (the day is then marked: `keys::day_after_delete_key`).
    Computed { record: Record, after_delete: bool },
    /// An hour's archived readings could not be read (the reason): the day's marks stay dirty.
    Unreadable(String),
    /// Left as it is, its marks counted in [`RollupSummary::past_rollup_retention`]: past the
    /// day roll-up retention too, or a partition of the day deleted for good and a record of
    /// the day made before that delete (its buckets no longer hold what its record counts).
    Left,
}

/// What the roll-ups of every table with a retention or a floor keep, by table id: filled from
/// the catalog at open and by each definition since (`Store::define_table_with`), and read by
/// reads, passes and the `rollups` column family's compaction filter (`ExpiredRollups`).
#[derive(Debug, Clone, Default)]
pub(crate) struct RollupRetentions(std::sync::Arc<std::sync::RwLock<HashMap<u32, RollupKeep>>>);

impl RollupRetentions {
    /// Records what table `table` keeps (one that keeps everything is not recorded).
    pub(crate) fn set(&self, table: u32, keep: RollupKeep) {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if keep == RollupKeep::ALL {
            map.remove(&table);
        } else {
            map.insert(table, keep);
        }
    }

    /// What table `table` keeps.
    pub(crate) fn keep(&self, table: u32) -> RollupKeep {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(&table).copied().unwrap_or(RollupKeep::ALL)
    }

    /// What every table that does not keep everything keeps.
    pub(crate) fn snapshot(&self) -> HashMap<u32, RollupKeep> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The first hour and day kept at `now_ms` of each table that does not keep everything.
    fn cutoffs(&self, now_ms: i64) -> HashMap<u32, [i64; 2]> {
        let map = self.0.read().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(&table, keep)| (table, [keep.first_kept(Level::Hour, now_ms), keep.first_kept(Level::Day, now_ms)]))
            .collect()
    }
}

/// The `rollups` column family's compaction filter factory: each compaction drops the hour and
/// day records (of devices, groups and tables) that their table's retention (or floor) no
/// longer keeps, as of the compaction's start. Reads never show them before ([`Store::rollups`]
/// starts at the first period kept): compaction is only when the disk space comes back. Month
/// records (written by stores before months were read from days; nothing reads them) are kept.
pub(crate) struct ExpiredRollups(pub(crate) RollupRetentions);

impl rocksdb::compaction_filter_factory::CompactionFilterFactory for ExpiredRollups {
    type Filter = ExpiredRollupsFilter;

    fn create(&mut self, _: rocksdb::compaction_filter_factory::CompactionFilterContext) -> ExpiredRollupsFilter {
        ExpiredRollupsFilter { cutoffs: self.0.cutoffs(model::now_ms()) }
    }

    fn name(&self) -> &std::ffi::CStr {
        c"hourglass.expired-rollups"
    }
}

/// The level codes of hour and day records ([`keys::rollup_level_code`]).
const HOUR_CODE: u8 = 0;
const DAY_CODE: u8 = 1;

/// One compaction's filter of `ExpiredRollups`.
pub(crate) struct ExpiredRollupsFilter {
    /// Table id → the first hour and day start kept.
    cutoffs: HashMap<u32, [i64; 2]>,
}

impl ExpiredRollupsFilter {
    /// Whether the record under `key` has expired.
    fn expired(&self, key: &[u8]) -> bool {
        let Some(table) = key.get(..4).map(|t| u32::from_be_bytes([t[0], t[1], t[2], t[3]])) else {
            return false;
        };
        let Some(cutoffs) = self.cutoffs.get(&table) else {
            return false;
        };
        let (level, start) = match key.get(4) {
            Some(&code) if code < GROUP_LEVEL_BASE => match RollupKey::decode(key) {
                Some(k) => (k.level, k.start),
                None => return false,
            },
            Some(&code) if code < SHARD_LEVEL_BASE => match GroupRollupKey::decode(key) {
                Some(k) => (k.level, k.start),
                None => return false,
            },
            _ => match GroupShardKey::decode(key) {
                Some(k) => (k.level, k.start),
                None => return false,
            },
        };
        match level {
            HOUR_CODE => start < cutoffs[0],
            DAY_CODE => start < cutoffs[1],
            _ => false,
        }
    }
}

impl rocksdb::compaction_filter::CompactionFilter for ExpiredRollupsFilter {
    fn filter(&mut self, _level: u32, key: &[u8], _value: &[u8]) -> rocksdb::compaction_filter::Decision {
        if self.expired(key) {
            rocksdb::compaction_filter::Decision::Remove
        } else {
            rocksdb::compaction_filter::Decision::Keep
        }
    }

    fn name(&self) -> &std::ffi::CStr {
        c"hourglass.expired-rollups"
    }
}

const RECORD_V1: u8 = 1;
const RECORD_V2: u8 = 2;
/// Version 3 (module docs); read as "any other version" by [`decode_record`].
#[cfg(test)]
const RECORD_V3: u8 = 3;
/// Version 3 with `u32` counts and lengths where it has `u16` ones: a record of 65,536 fields
/// or more (a table whose devices bring that many field names in one hour), which version 3
/// cannot hold. Written for such a record until version 5.
const RECORD_V4: u8 = 4;
/// Version 6 without the base time, its times `i64`s, its whole fields' sketches in the compact
/// form (module docs).
const RECORD_V5: u8 = 5;
/// Version byte of the current record layout.
const RECORD_V6: u8 = 6;

/// Form (versions 5 and 6) of a field written whole.
const FORM_WHOLE: u8 = 0;
/// Form (versions 5 and 6) of a field of one point: its time and value stand for its aggregates.
const FORM_ONE_POINT: u8 = 1;

/// Appends a varint length and the bytes `write` appends (none when `part` is `None`).
fn put_varint_blob<T>(v: &mut Vec<u8>, part: Option<&T>, write: impl FnOnce(&T, &mut Vec<u8>)) {
    let at = v.len();
    v.push(0);
    if let Some(part) = part {
        write(part, v);
    }
    let len = (v.len() - at - 1) as u64;
    if len < 0x80 {
        v[at] = len as u8;
    } else {
        // A longer part moves up by the length's extra bytes: a sketch of some hundred bytes.
        let mut prefix = Vec::with_capacity(4);
        varint::put(&mut prefix, len);
        v.splice(at..=at, prefix);
    }
}

/// Appends a field's min, max, first and last point, as versions 2 to 4 have them.
#[cfg(test)]
fn put_extremes(v: &mut Vec<u8>, e: &Exact) {
    v.extend_from_slice(&e.min().to_be_bytes());
    v.extend_from_slice(&e.max().to_be_bytes());
    for (ts, x) in [e.first(), e.last()] {
        v.extend_from_slice(&ts.to_be_bytes());
        v.extend_from_slice(&x.to_be_bytes());
    }
}

/// A field's sum parts (module docs): its exact sum's partials, then its non-finite part when
/// that is not zero.
fn sum_parts(e: &Exact) -> impl Iterator<Item = f64> + '_ {
    let sum = e.exact_sum();
    let special = (sum.special() != 0.0).then_some(sum.special());
    sum.partials().iter().copied().chain(special)
}

/// The point `(ts, value)` when a field's aggregates are those of that one point alone, its
/// sketch included (what [`FieldAgg::of`] makes of it): form 1 of versions 5 and 6.
fn one_point(agg: &FieldAgg) -> Option<(i64, f64)> {
    if agg.exact.count() != 1 {
        return None;
    }
    let (ts, x) = agg.exact.first();
    // A non-finite value is counted, not sketched.
    let sketched = agg.quantiles.as_ref()?.count();
    (sketched == u64::from(x.is_finite()) && agg.exact == Exact::of(ts, x)).then_some((ts, x))
}

/// The persisted bytes of a record (version 6, see the module docs).
pub fn encode_record(record: &Record) -> Vec<u8> {
    encode_record_with_forms(record, RECORD_V6)
}

/// A record's bytes in `version` 5 or 6, which differ in their times and their whole fields'
/// sketches.
fn encode_record_with_forms(record: &Record, version: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(10 + record.fields.len() * 100);
    v.push(version);
    varint::put(&mut v, record.fields.len() as u64);
    // Version 6's times: after the record's earliest, each field's first as its distance from
    // it, its last as its distance from its first.
    let base = record.fields.values().map(|a| a.exact.first().0).min();
    let v6 = version == RECORD_V6;
    if let Some(base) = base.filter(|_| v6) {
        varint::put_signed(&mut v, base);
    }
    let put_ts = |v: &mut Vec<u8>, ts: i64, from: i64| match v6 {
        // Wrapping, the distance reads back to `ts` from any `from`; it is small, as `ts` is
        // never before `from` (a first before its last).
        true => varint::put(v, ts.wrapping_sub(from) as u64),
        false => v.extend_from_slice(&ts.to_be_bytes()),
    };
    let base = base.unwrap_or_default();
    for (name, agg) in &record.fields {
        varint::put(&mut v, name.len() as u64);
        v.extend_from_slice(name.as_bytes());
        if let Some((ts, x)) = one_point(agg) {
            v.push(FORM_ONE_POINT);
            put_ts(&mut v, ts, base);
            v.extend_from_slice(&x.to_be_bytes());
            continue;
        }
        v.push(FORM_WHOLE);
        let e = &agg.exact;
        varint::put(&mut v, e.count());
        v.extend_from_slice(&e.min().to_be_bytes());
        v.extend_from_slice(&e.max().to_be_bytes());
        let (first, last) = (e.first(), e.last());
        put_ts(&mut v, first.0, base);
        v.extend_from_slice(&first.1.to_be_bytes());
        put_ts(&mut v, last.0, first.0);
        v.extend_from_slice(&last.1.to_be_bytes());
        varint::put(&mut v, sum_parts(e).count() as u64);
        for p in sum_parts(e) {
            v.extend_from_slice(&p.to_be_bytes());
        }
        put_varint_blob(&mut v, agg.quantiles.as_ref(), |q, v| match version {
            RECORD_V6 => q.write_packed(e.min(), e.max(), v),
            _ => q.write_compact(v),
        });
    }
    put_varint_blob(&mut v, record.devices.as_ref(), Distinct::write_compact);
    v
}

/// Appends a count or length: a `u16`, or a `u32` when `wide` (version 4).
#[cfg(test)]
fn put_len(v: &mut Vec<u8>, n: usize, wide: bool) -> Option<()> {
    if wide {
        v.extend_from_slice(&u32::try_from(n).ok()?.to_be_bytes());
    } else {
        v.extend_from_slice(&u16::try_from(n).ok()?.to_be_bytes());
    }
    Some(())
}

/// Appends a `u32` length and the bytes `write` appends (none when `part` is `None`).
#[cfg(test)]
fn put_blob<T>(v: &mut Vec<u8>, part: Option<&T>, write: impl FnOnce(&T, &mut Vec<u8>)) -> Option<()> {
    let at = v.len();
    v.extend_from_slice(&[0; 4]);
    if let Some(part) = part {
        write(part, v);
    }
    let len = u32::try_from(v.len() - at - 4).ok()?;
    v[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Some(())
}

/// A record's bytes in the older `version` 2, 3, 4 or 5, as stores written before version 6
/// hold them (for tests that read such stores); `None` past the version's counts.
#[cfg(test)]
fn encode_record_as(record: &Record, version: u8) -> Option<Vec<u8>> {
    if version == RECORD_V5 {
        return Some(encode_record_with_forms(record, version));
    }
    let plain = version == RECORD_V2;
    let wide = version == RECORD_V4;
    let mut v = Vec::with_capacity(3 + record.fields.len() * 160);
    v.push(version);
    put_len(&mut v, record.fields.len(), wide)?;
    for (name, agg) in &record.fields {
        put_len(&mut v, name.len(), wide)?;
        v.extend_from_slice(name.as_bytes());
        let e = &agg.exact;
        v.extend_from_slice(&e.count().to_be_bytes());
        put_extremes(&mut v, e);
        let parts: Vec<f64> = sum_parts(e).collect();
        put_len(&mut v, parts.len(), wide)?;
        for p in parts {
            v.extend_from_slice(&p.to_be_bytes());
        }
        put_blob(&mut v, agg.quantiles.as_ref(), |q, v| match plain {
            true => v.extend_from_slice(&q.to_bytes()),
            false => q.write_compact(v),
        })?;
    }
    put_blob(&mut v, record.devices.as_ref(), |d, v| match plain {
        true => v.extend_from_slice(&d.to_bytes()),
        false => d.write_compact(v),
    })?;
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

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_be_bytes)
    }

    /// A varint (module docs): ten bytes at most, within `u64`.
    fn varint(&mut self) -> Result<u64, String> {
        let (n, len) = varint::read(self.0)?;
        self.0 = &self.0[len..];
        Ok(n)
    }

    /// A count or length: a `u16`, a `u32` in version 4, a varint in versions 5 and 6.
    fn len(&mut self, version: u8) -> Result<usize, String> {
        match version {
            RECORD_V4 => self.u32().map(|n| n as usize),
            RECORD_V5 | RECORD_V6 => usize::try_from(self.varint()?).map_err(|_| "a length past usize".to_string()),
            _ => self.u16().map(usize::from),
        }
    }

    /// A zigzag varint.
    fn signed(&mut self) -> Result<i64, String> {
        self.varint().map(varint::unzigzag)
    }

    /// A time: an `i64`, or in version 6 (when `from` is given) a varint distance after `from`.
    fn ts(&mut self, from: Option<i64>) -> Result<i64, String> {
        match from {
            Some(from) => self.varint().map(|d| from.wrapping_add(d as i64)),
            None => self.i64(),
        }
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

    /// A length-prefixed part (a `u32` length, a varint in versions 5 and 6); `None` when its
    /// length is 0.
    fn blob(&mut self, version: u8) -> Result<Option<&'a [u8]>, String> {
        let n = match version {
            RECORD_V5 | RECORD_V6 => self.len(version)?,
            _ => self.u32()? as usize,
        };
        (n > 0).then(|| self.take(n)).transpose()
    }
}

/// Decodes a record of any known version; the error says what is wrong.
pub fn decode_record(v: &[u8]) -> Result<Record, String> {
    let mut c = Cursor(v);
    let version = c.take(1)?[0];
    if !(RECORD_V1..=RECORD_V6).contains(&version) {
        return Err(format!("unknown record version {version} (a newer release's, or damaged)"));
    }
    let fields = c.len(version)?;
    let base = match version {
        RECORD_V6 if fields > 0 => Some(c.signed()?),
        _ => None,
    };
    let mut out = Record::default();
    for _ in 0..fields {
        let len = c.len(version)?;
        let name = std::str::from_utf8(c.take(len)?).map_err(|_| "field name is not UTF-8".to_string())?;
        let agg = match version {
            RECORD_V5 | RECORD_V6 => match c.take(1)?[0] {
                FORM_ONE_POINT => FieldAgg::of(c.ts(base)?, c.f64()?),
                FORM_WHOLE => decode_whole_field(&mut c, version, base, name)?,
                form => return Err(format!("field `{name}` of unknown form {form}")),
            },
            _ => decode_whole_field(&mut c, version, base, name)?,
        };
        out.fields.insert(name.into(), agg);
    }
    out.devices = match version {
        RECORD_V1 => None,
        RECORD_V2 => c.blob(version)?.map(Distinct::from_bytes).transpose()?,
        _ => c.blob(version)?.map(Distinct::from_compact).transpose()?,
    };
    if !c.0.is_empty() {
        return Err(format!("{} bytes after the last field", c.0.len()));
    }
    Ok(out)
}

/// Reads a field written whole (every field before version 5; form 0 after), past its name;
/// `base` is a version 6 record's earliest time.
fn decode_whole_field(c: &mut Cursor<'_>, version: u8, base: Option<i64>, name: &str) -> Result<FieldAgg, String> {
    let count = match version {
        RECORD_V5 | RECORD_V6 => c.varint()?,
        _ => c.u64()?,
    };
    if count == 0 {
        return Err(format!("field `{name}` has a count of 0"));
    }
    let (min, max) = (c.f64()?, c.f64()?);
    let first = (c.ts(base)?, c.f64()?);
    let last = (c.ts(base.map(|_| first.0))?, c.f64()?);
    let n = c.len(version)?;
    let mut parts = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        parts.push(c.f64()?);
    }
    let sum = ExactSum::from_partials(&parts);
    let exact = Exact::from_parts(count, sum, min, max, first, last);
    let quantiles = match version {
        RECORD_V1 => None,
        RECORD_V2 => c.blob(version)?.map(Quantiles::from_bytes).transpose()?,
        RECORD_V6 => c.blob(version)?.map(|q| Quantiles::from_packed(q, min, max)).transpose()?,
        _ => c.blob(version)?.map(Quantiles::from_compact).transpose()?,
    };
    Ok(FieldAgg { exact, quantiles })
}

/// The key of `owner`'s record of the `level` period starting at `start` in `table`.
fn record_key(table: u32, owner: &Owner, level: Level, start: i64) -> Vec<u8> {
    let code = keys::rollup_level_code(level);
    match owner {
        Owner::Device(device) => RollupKey { table, level: code, device: *device, start }.encode().to_vec(),
        Owner::Group(path) => GroupRollupKey { table, level: code, path, start }.encode(),
    }
}

/// The period start of a `rollups` key of either kind.
fn key_start(k: &[u8]) -> Result<i64> {
    let start = match k.get(4) {
        Some(&code) if code >= SHARD_LEVEL_BASE => GroupShardKey::decode(k).map(|g| g.start),
        Some(&code) if code >= GROUP_LEVEL_BASE => GroupRollupKey::decode(k).map(|g| g.start),
        _ => RollupKey::decode(k).map(|r| r.start),
    };
    start.ok_or_else(|| corrupt_record(format!("key of {} bytes", k.len())))
}

/// What a pass reads of one dirty mark's hour.
struct HourRead {
    /// The hour's record.
    record: Record,
    /// Its readings.
    readings: usize,
    /// Its newest reading as a `latest` operand (`None`: no reading).
    newest: Option<Vec<u8>>,
}

/// What a pass reads of one dirty mark's hour: `None` when its bucket is gone, `Err` with the
/// reason when its archived readings cannot be read.
type HourResult = std::result::Result<Option<HourRead>, String>;

/// Which archived device-day an [`ArchivedDay`] holds: the device's day (its start), in a
/// partition's file (the manifest entry names the file: a spill that rewrites it makes a new
/// one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArchivedDayKey {
    table: u32,
    partition: i32,
    device: u64,
    day: i64,
    entry: ArchivedPartition,
}

/// The archived readings of the device-day a roll-up worker read last, in time order: the
/// marks of a device's archived day come in a run (`Store::with_days_whole`), and its hours are
/// cut from one read of the file.
#[derive(Debug, Default)]
struct ArchivedDay {
    held: Option<(ArchivedDayKey, Vec<Reading>)>,
}

impl ArchivedDay {
    /// Takes the readings of `hour` (within `key`'s day) from the day held, if it is `key`'s
    /// (each hour of a run is read once).
    fn take_hour(&mut self, key: ArchivedDayKey, hour: TimeRange) -> Option<Vec<Reading>> {
        let (held, readings) = self.held.as_mut().filter(|(held, _)| *held == key)?;
        debug_assert_eq!(held.day, Level::Day.period_start(hour.start));
        let from = readings.partition_point(|r| r.ts < hour.start);
        let to = readings.partition_point(|r| r.ts < hour.end);
        Some(readings.drain(from..to).collect())
    }
}

/// The bucket a dirty mark stands for: its device's hour, in the partition holding it.
fn bucket_of(ti: &TableInfo, mark: DirtyKey) -> Result<BucketKey> {
    let hour_start = Hour(i64::from(mark.hour)).start_ms();
    let partition = keys::to_i32(ti.partition.index_of(hour_start)).ok_or(Error::TimeOutOfRange(hour_start))?;
    Ok(BucketKey { table: mark.table, partition, device: mark.device, hour: mark.hour })
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
/// The marks of hours open at `max_event_ts` (the persisted largest event time) go into
/// `open`: stored and unread, as if this process had written them (`crate::open_marks`), so
/// the first write of each open device-hour after a restart puts no mark and no `latest`
/// operand again.
pub(crate) fn scan_queue_at_open(db: &DB, max_event_ts: i64, open: &mut OpenMarks) -> Result<QueueAtOpen> {
    let mut next_gen = 0u64;
    let mut oldest: Option<i64> = None;
    // A raw iterator: no allocation a mark (one a device-hour written, 20M at 10M devices).
    let mut it = db.raw_iterator_cf_opt(cf(db, CF_DIRTY), crate::store::one_pass_read());
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        let key = decode_dirty(k)?;
        let gen = decode_gen(v)?;
        next_gen = next_gen.max(gen.saturating_add(1));
        note_oldest(&mut oldest, key.hour);
        open.record(key.table, key.hour, key.device, max_event_ts);
        it.next();
    }
    it.status().map_err(db_err("scan dirty marks"))?;
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

fn note_oldest(oldest: &mut Option<i64>, hour: i32) {
    let start = Hour(i64::from(hour)).start_ms();
    *oldest = Some(oldest.map_or(start, |o| o.min(start)));
}

fn decode_dirty(k: &[u8]) -> Result<DirtyKey> {
    DirtyKey::decode(k).ok_or_else(|| Error::Corrupt { what: "dirty mark key", detail: format!("{} bytes", k.len()) })
}

pub(crate) fn decode_gen(v: &[u8]) -> Result<u64> {
    let b: [u8; 8] =
        v.try_into().map_err(|_| Error::Corrupt { what: "dirty mark", detail: format!("{} bytes, not 8", v.len()) })?;
    Ok(u64::from_be_bytes(b))
}

fn corrupt_record(e: String) -> Error {
    Error::Corrupt { what: "roll-up record", detail: e }
}

fn decode_id(v: &[u8], what: &'static str) -> Result<u64> {
    let b: [u8; 8] = v.try_into().map_err(|_| Error::Corrupt { what, detail: format!("{} bytes, not 8", v.len()) })?;
    Ok(u64::from_be_bytes(b))
}

/// The stored roll-up records whose keys lie in `[lo, hi)`, handed to `visit` in key order
/// with their period starts as they are read; the read stops when `visit` breaks.
fn visit_stored(
    db: &DB,
    lo: Vec<u8>,
    hi: Vec<u8>,
    visit: &mut dyn FnMut(i64, Record) -> ControlFlow<()>,
) -> Result<()> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(lo);
    opts.set_iterate_upper_bound(hi);
    for item in db.iterator_cf_opt(cf(db, CF_ROLLUPS), opts, IteratorMode::Start) {
        let (k, v) = item.map_err(db_err("scan roll-ups"))?;
        let record = decode_record(&v).map_err(corrupt_record)?;
        if visit(key_start(&k)?, record).is_break() {
            break;
        }
    }
    Ok(())
}

/// The records one chunk of a pass has computed so far (`None`: deleted), read back by the
/// rest of the chunk in place of the stored ones until they are committed together.
struct Overlay<'s> {
    db: &'s DB,
    writes: BTreeMap<Vec<u8>, Option<Record>>,
}

impl Overlay<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Record>> {
        if let Some(w) = self.writes.get(key) {
            return Ok(w.clone());
        }
        match self.db.get_pinned_cf(cf(self.db, CF_ROLLUPS), key).map_err(db_err("get roll-up"))? {
            Some(v) => decode_record(&v).map(Some).map_err(corrupt_record),
            None => Ok(None),
        }
    }

    /// Whether the record at `key` exists, without reading it.
    fn has(&self, key: &[u8]) -> Result<bool> {
        if let Some(w) = self.writes.get(key) {
            return Ok(w.is_some());
        }
        let got = self.db.get_pinned_cf(cf(self.db, CF_ROLLUPS), key).map_err(db_err("get roll-up"))?;
        Ok(got.is_some())
    }

    fn put(&mut self, key: Vec<u8>, mut record: Record) {
        // A chunk holds its records until it commits: wide sketches packed (QA36 F2).
        record.pack_wide_sketches();
        let value = (!record.is_empty()).then_some(record);
        self.writes.insert(key, value);
    }

    /// The merge of the records whose keys lie in `[lo, hi)`.
    fn merged(&self, lo: Vec<u8>, hi: Vec<u8>) -> Result<Record> {
        let mut out = Record::default();
        for r in self.scan_keyed(lo, hi)?.values() {
            out.merge(r);
        }
        Ok(out)
    }

    /// Deletes the records whose keys lie in `[lo, hi)` (their keys read, not their values).
    fn clear(&mut self, lo: Vec<u8>, hi: Vec<u8>) -> Result<()> {
        let mut found: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lo.clone());
        opts.set_iterate_upper_bound(hi.clone());
        let mut it = self.db.raw_iterator_cf_opt(cf(self.db, CF_ROLLUPS), opts);
        it.seek_to_first();
        while let Some(k) = it.key() {
            found.insert(k.to_vec());
            it.next();
        }
        it.status().map_err(db_err("scan roll-ups"))?;
        for (k, w) in self.writes.range::<[u8], _>((Bound::Included(&lo[..]), Bound::Excluded(&hi[..]))) {
            if w.is_some() {
                found.insert(k.clone());
            }
        }
        for key in found {
            self.put(key, Record::default());
        }
        Ok(())
    }

    /// The records whose keys lie in `[lo, hi)`, by key.
    fn scan_keyed(&self, lo: Vec<u8>, hi: Vec<u8>) -> Result<BTreeMap<Vec<u8>, Record>> {
        let mut found: BTreeMap<Vec<u8>, Record> = BTreeMap::new();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lo.clone());
        opts.set_iterate_upper_bound(hi.clone());
        for item in self.db.iterator_cf_opt(cf(self.db, CF_ROLLUPS), opts, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan roll-ups"))?;
            let mut record = decode_record(&v).map_err(corrupt_record)?;
            // Held with the others: a group's super-shards, say, each as wide as its values.
            record.pack_wide_sketches();
            found.insert(k.to_vec(), record);
        }
        for (k, w) in self.writes.range::<[u8], _>((Bound::Included(&lo[..]), Bound::Excluded(&hi[..]))) {
            match w {
                Some(r) => found.insert(k.clone(), r.clone()),
                None => found.remove(k),
            };
        }
        Ok(found)
    }

    /// The merge of `owner`'s `inner` records within the `outer` period starting at `start`.
    fn merge_within(&self, table: u32, owner: &Owner, inner: Level, outer: Level, start: i64) -> Result<Record> {
        let lo = record_key(table, owner, inner, start);
        let hi = record_key(table, owner, inner, period_end(outer, start));
        self.merged(lo, hi)
    }

    /// A WriteBatch of the chunk's records, with room for `more` bytes of entries besides.
    fn into_batch(self, more: usize) -> WriteBatch {
        let h = cf(self.db, CF_ROLLUPS);
        let mut entries = Vec::with_capacity(self.writes.len());
        let mut bytes = more;
        for (k, w) in self.writes {
            let value = w.as_ref().map(encode_record);
            bytes += k.len() + value.as_ref().map_or(0, Vec::len) + BATCH_ENTRY_OVERHEAD;
            entries.push((k, value));
        }
        // Sized once: grown by doubling, a batch of many records was copied at each step, and
        // each new (mmap'd) copy was faulted in page by page.
        let mut wb = WriteBatch::with_capacity_bytes(bytes);
        for (k, value) in entries {
            match value {
                Some(v) => wb.put_cf(h, k, v),
                None => wb.delete_cf(h, k),
            }
        }
        wb
    }
}

/// How a chunk changes one record of a period.
enum Change {
    /// Merge in what is new: records of periods below it rolled up for the first time.
    Merge(Delta),
    /// Recompute it from the level below: a record below it was replaced.
    Recompute,
}

/// What a chunk merges into one record: the records below it rolled up for the first time.
/// Those holding wide sketches packed (`Record::pack_wide_sketches`) are kept apart as they
/// are, and merged in only when the change is made, one record at a time: merged into one as
/// they come, the sketch was dense for the rest of the chunk, 286 KiB for each group period and
/// device-day a chunk changes (QA38 F1: a wide backlog's pass took 1.4 GB with groups of a few
/// devices each).
#[derive(Clone, Default)]
struct Delta {
    /// The records without packed sketches, merged.
    merged: Record,
    /// The others, in the order they came.
    packed: Vec<Record>,
}

impl Delta {
    /// Adds `record` to what is merged in. Records each of a narrow span may merge into a wide
    /// one (devices far apart in one group): then that merge is packed and kept apart too.
    fn add(&mut self, record: &Record) {
        if record.has_packed_sketches() {
            self.packed.push(record.clone());
            return;
        }
        self.merged.merge(record);
        self.merged.pack_wide_sketches();
        if self.merged.has_packed_sketches() {
            self.packed.push(std::mem::take(&mut self.merged));
        }
    }

    /// Adds what `other` merges in.
    fn fold(&mut self, other: &Delta) {
        self.add(&other.merged);
        self.packed.extend(other.packed.iter().cloned());
    }

    /// Merges its packed records into one, packed again: a delta that goes into several
    /// records (a group's shard, the group's period and its day) reads each back once, here,
    /// rather than at each.
    fn settle(&mut self) {
        if self.packed.len() < 2 {
            return;
        }
        let mut one = Record::default();
        for record in self.packed.drain(..) {
            one.merge(&record);
        }
        one.pack_wide_sketches();
        self.packed.push(one);
    }

    /// Merges it into `record`.
    fn merge_into(&self, record: &mut Record) {
        record.merge(&self.merged);
        for r in &self.packed {
            record.merge(r);
        }
    }
}

/// What a change merges in: a record, or the merges of changes below.
trait Addend {
    /// A delta of it alone.
    fn delta(&self) -> Delta;
    /// Adds it to `delta`.
    fn add_to(&self, delta: &mut Delta);
}

impl Addend for Record {
    fn delta(&self) -> Delta {
        let mut d = Delta::default();
        d.add(self);
        d
    }

    fn add_to(&self, delta: &mut Delta) {
        delta.add(self);
    }
}

impl Addend for Delta {
    fn delta(&self) -> Delta {
        self.clone()
    }

    fn add_to(&self, delta: &mut Delta) {
        delta.fold(self);
    }
}

/// The start of the day holding hour `hour` (hours since the epoch).
pub(crate) fn day_of(hour: i32) -> i64 {
    Level::Day.period_start(Hour(i64::from(hour)).start_ms())
}

/// The first hour (hours since the epoch) of the day starting at `day` (epoch ms), as a day's
/// after-delete mark has it (`keys::day_after_delete_key`): a day a mark's hour is in, whose
/// first hour an hour key holds but at the ends of time.
pub(crate) fn first_hour_of(day: i64) -> i32 {
    keys::to_i32(Hour::of(day).0).unwrap_or(i32::MIN)
}

/// Whether two marks are of one device's day.
fn same_device_day(a: DirtyKey, b: DirtyKey) -> bool {
    a.table == b.table && a.device == b.device && day_of(a.hour) == day_of(b.hour)
}

/// The marks of every hour of `mark`'s device-day, in time order (those an hour key can hold:
/// all but at the ends of time).
fn marks_of_day(mark: DirtyKey) -> impl Iterator<Item = DirtyKey> {
    let first = Hour::of(day_of(mark.hour)).0;
    (first..first + 24).filter_map(move |h| Some(DirtyKey { hour: keys::to_i32(h)?, ..mark }))
}

/// The record at `key` once `change` is made: `delta` merged into it, or `recompute`d.
fn changed(ov: &Overlay<'_>, key: &[u8], change: Change, recompute: impl FnOnce() -> Result<Record>) -> Result<Record> {
    match change {
        Change::Merge(delta) => {
            let mut record = ov.get(key)?.unwrap_or_default();
            delta.merge_into(&mut record);
            Ok(record)
        }
        Change::Recompute => recompute(),
    }
}

/// Adds a change to what the chunk does to the record at `at`: `Some(delta)` merges `delta`
/// in, `None` recomputes it. Merges add up, and one recomputation covers everything. `delta`
/// is copied only for a record the chunk has not changed yet (a group's records take the
/// merges of many devices).
fn note<K: Ord, A: Addend>(changes: &mut BTreeMap<K, Change>, at: K, delta: Option<&A>) {
    match changes.entry(at) {
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(delta.map_or(Change::Recompute, |d| Change::Merge(d.delta())));
        }
        std::collections::btree_map::Entry::Occupied(mut e) => fold(e.get_mut(), delta),
    }
}

/// Adds `delta` (`None`: a recomputation) to a change already noted.
fn fold<A: Addend>(change: &mut Change, delta: Option<&A>) {
    match (change, delta) {
        (Change::Merge(acc), Some(delta)) => delta.add_to(acc),
        (Change::Recompute, _) => {}
        (slot, None) => *slot = Change::Recompute,
    }
}

/// How a chunk changes the shards of group periods: (table, group, period start, shard).
type ShardChanges = BTreeMap<(u32, String, i64, u32), Change>;

/// How a chunk changes one group period: the merge of its shards' deltas, or a recomputation
/// if one of them is; with its shards' changes.
struct GroupChange {
    table: u32,
    group: String,
    start: i64,
    change: Change,
    shards: Vec<(u32, Change)>,
}

/// The changes of the group periods `shards` holds changes of, in their order, their deltas
/// settled (`Delta::settle`).
fn by_period(shards: ShardChanges) -> Vec<GroupChange> {
    let mut out: Vec<GroupChange> = Vec::new();
    for ((table, group, start, shard), mut change) in shards {
        if let Change::Merge(delta) = &mut change {
            delta.settle();
        }
        let delta = match &change {
            Change::Merge(delta) => Some(delta),
            Change::Recompute => None,
        };
        match out.last_mut() {
            Some(g) if (g.table, g.start) == (table, start) && g.group == group => {
                fold(&mut g.change, delta);
                g.shards.push((shard, change));
            }
            _ => {
                let whole = delta.map_or(Change::Recompute, |d| Change::Merge(d.clone()));
                out.push(GroupChange { table, group, start, change: whole, shards: vec![(shard, change)] });
            }
        }
    }
    for g in &mut out {
        if let Change::Merge(delta) = &mut g.change {
            delta.settle();
        }
    }
    out
}

impl Store {
    /// Stops roll-ups for the rest of this store's life: a pass in progress ends at its next
    /// chunk (what it committed stays; the other hours stay marked), and a later pass does no
    /// chunk ([`RollupSummary::stopped`]). For an ordered stop, which waited for a whole pass
    /// (29 s for a table of 200,000 fields, QA pass 6).
    pub fn stop_rollups(&self) {
        self.rollups_stopped.store(true, Ordering::Relaxed);
    }

    /// One pass of the roll-up stage: recomputes at most `max_hours` dirty hours (up to 23 more
    /// when the last is of a device's day past its table's hour roll-up retention, taken whole)
    /// whose end is at or before the watermark (largest committed event time minus
    /// `allowed_lateness_ms`),
    /// oldest first within each table (those an earlier pass could not read from the archive
    /// only in the room the others leave), with their days and months and their groups', as the
    /// module docs describe. Safe to call from several threads (passes run one at a time) and
    /// while writes go on.
    pub fn process_rollups(&self, allowed_lateness_ms: u64, max_hours: usize) -> Result<RollupSummary> {
        self.process_rollups_at(allowed_lateness_ms, max_hours, model::now_ms())
    }

    /// [`Store::process_rollups`] as if the wall clock read `now_ms`, which only the roll-up
    /// retentions look at (module docs, "Retention"): for tests, and a replay of old data
    /// whose roll-ups must be written as they would have been then.
    pub fn process_rollups_at(&self, allowed_lateness_ms: u64, max_hours: usize, now_ms: i64) -> Result<RollupSummary> {
        let mut pass = self.rollup_lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.stats
            .rollup_allowed_lateness_ms
            .store(i64::try_from(allowed_lateness_ms).unwrap_or(i64::MAX), Ordering::Relaxed);
        // Acquire, paired with the writers' Release: the marks and buckets committed before
        // the value read are visible to the scan below (`crate::open_marks`).
        let watermark = self.watermark(allowed_lateness_ms);
        let mut summary = RollupSummary { watermark, ..RollupSummary::default() };
        // Hours the pass can roll up must have all their readings in `buckets`.
        self.flush_write_buffer_before(watermark)?;

        // Collect the due marks: per table, from its oldest hour until the first hour not due
        // yet, then seek to the next table. Marks an earlier pass could not read wait in
        // `retry` for the room the others leave.
        let mut due: Vec<(DirtyKey, u64)> = Vec::new();
        let mut retry: Vec<(DirtyKey, u64)> = Vec::new();
        let mut oldest: Option<i64> = None;
        {
            let mut it = self.db.raw_iterator_cf(cf(&self.db, CF_DIRTY));
            it.seek_to_first();
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                let key = decode_dirty(k)?;
                let end = Hour(i64::from(key.hour)).end_ms();
                if watermark.is_some_and(|w| end <= w) && due.len() < max_hours {
                    if !pass.unreadable.contains(&key) {
                        due.push((key, decode_gen(v)?));
                    } else if retry.len() < max_hours {
                        retry.push((key, decode_gen(v)?));
                    } else {
                        note_oldest(&mut oldest, key.hour);
                    }
                    it.next();
                } else {
                    note_oldest(&mut oldest, key.hour);
                    match key.table.checked_add(1) {
                        Some(next) => it.seek(keys::table_prefix(next)),
                        None => break,
                    }
                }
            }
            it.status().map_err(db_err("scan dirty marks"))?;
        }
        let room = max_hours.saturating_sub(due.len()).min(retry.len());
        for &(key, _) in &retry[room..] {
            note_oldest(&mut oldest, key.hour);
        }
        if room > 0 {
            due.extend_from_slice(&retry[..room]);
            // Back in the scan's order: oldest hour first per table.
            due.sort_unstable_by_key(|&(key, _)| key);
        }

        let tables = self.tables_by_id();
        let due = self.with_days_whole(&tables, due, max_hours, watermark, now_ms, &mut oldest)?;
        self.roll_up_chunks(&mut pass, &tables, &due, now_ms, &mut summary, &mut oldest)?;
        summary.deleted_partitions_forgotten = self.forget_deleted_partitions(&tables, now_ms)?;
        // Hours still in the write buffer wait for roll-up as much as marked ones.
        if let Some(b) = self.oldest_buffered_hour_ms() {
            oldest = Some(oldest.map_or(b, |o| o.min(b)));
        }
        summary.oldest_dirty_hour_ms = oldest;
        self.stats.rollup_oldest_dirty_hour_ms.store(oldest.unwrap_or(i64::MAX), Ordering::Relaxed);
        Ok(summary)
    }

    /// The watermark at `allowed_lateness_ms`: the largest committed event time minus it, or
    /// `None` while the store holds no reading. Read with Acquire, paired with the writers'
    /// Release: the marks and buckets committed before the value read are visible to a scan
    /// after it (`crate::open_marks`).
    fn watermark(&self, allowed_lateness_ms: u64) -> Option<i64> {
        let max_ts = self.stats.max_event_ts.load(Ordering::Acquire);
        (max_ts != i64::MIN).then(|| max_ts.saturating_sub(i64::try_from(allowed_lateness_ms).unwrap_or(i64::MAX)))
    }

    /// The tables by id, as the catalog has them now.
    fn tables_by_id(&self) -> HashMap<u32, TableInfo> {
        read(&self.catalog).by_name.values().map(|ti| (ti.id, *ti)).collect()
    }

    /// Rolls up the marks `due` (in the queue's order, each device's past days whole) in
    /// chunks of [`CHUNK_MARKS`], each committed alone, until done or roll-ups are stopped;
    /// remembers the ones that could not be read, and returns them.
    fn roll_up_chunks(
        &self,
        pass: &mut PassMemory,
        tables: &HashMap<u32, TableInfo>,
        due: &[(DirtyKey, u64)],
        now_ms: i64,
        summary: &mut RollupSummary,
        oldest: &mut Option<i64>,
    ) -> Result<HashSet<DirtyKey>> {
        // Once a request to the archive's bucket fails, the pass reads no more archived hours
        // (each would wait out its request's retries, 30 s and more, before the hot hours), nor
        // do the passes after it until a probe in the background, a minute later, has had an
        // answer (`ARCHIVE_FAILURE_QUIET`).
        let bucket_failures = self.archive_request_failures();
        let mut not_read = HashSet::new();
        let mut start = 0;
        while start < due.len() {
            if self.rollups_stopped.load(Ordering::Relaxed) {
                // Each chunk commits alone: the marks of the rest stay for the next start.
                for &(key, _) in &due[start..] {
                    note_oldest(oldest, key.hour);
                }
                summary.stopped = true;
                break;
            }
            // Up to CHUNK_MARKS marks, or CHUNK_FIELDS of the fields their records are
            // expected to have. A device's day is not split between two chunks: one past the
            // hour roll-up retention is made once (`Store::with_days_whole`).
            let mut end = start;
            let mut fields = 0;
            while end < due.len() && end - start < CHUNK_MARKS && (end == start || fields < CHUNK_FIELDS) {
                let table = due[end].0.table;
                fields += match pass.fields_per_hour.get(&table) {
                    Some(&n) => n,
                    None => read(&self.catalog).schema(table).fields.len().max(1),
                };
                end += 1;
            }
            while end < due.len() && same_device_day(due[end - 1].0, due[end].0) {
                end += 1;
            }
            let chunk = &due[start..end];
            summary.chunks += 1;
            let unreadable = self.rollup_chunk(tables, chunk, summary, oldest, now_ms, bucket_failures, pass)?;
            pass.remember_unreadable(chunk, &unreadable);
            not_read.extend(unreadable);
            start = end;
        }
        Ok(not_read)
    }

    /// Rolls up the due marks of partitions `parts` (a table and a partition of it each, about
    /// to be deleted for good), then runs `delete`, which commits their deletion, under the
    /// writers' and the marks' locks with none of their due marks left: a reading stored into
    /// such a partition before the delete (a late one, a replay's, or the first of a device
    /// into an hour whose partition was deleted before: QA23 F1) is rolled up before it goes,
    /// where a pass a second later found its bucket gone. A write landing while its marks are
    /// rolled up has them rolled up too (in [`ROLL_UP_BEFORE_DELETE_TRIES`] rounds, and more
    /// while each has fewer marks than the one before); with due marks left after the rounds
    /// (writers faster than the roll-up), the partitions are not deleted (`None`, logged at
    /// WARN), and a later run rolls up what they were given first. Every hour of the
    /// partitions is due, whatever the watermark: one still open by it (a fleet quiet for
    /// longer than the hot retention) would never be rolled up once its readings are gone.
    /// Marks whose archived hour cannot be read (a damaged or missing file) are left: their
    /// readings go with the delete, as before (module docs, step 1). Once roll-ups are stopped
    /// (an ordered stop), nothing is rolled up, and partitions with due marks left are not
    /// deleted: `None`, `delete` not run; nor are they when the archive's bucket kept an hour
    /// from being read (a request failed during the rounds, or a minute before: passes read no
    /// archived hour then), which a later run reads. `now_ms` is the clock the roll-up
    /// retentions are judged at, as a pass's.
    pub(crate) fn roll_up_then_delete<T>(
        &self,
        parts: &[(TableInfo, i32)],
        now_ms: i64,
        delete: impl FnOnce() -> Result<T>,
    ) -> Result<Option<T>> {
        let mut pass = self.rollup_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let lateness = u64::try_from(self.stats.rollup_allowed_lateness_ms.load(Ordering::Relaxed)).unwrap_or(0);
        let tables = self.tables_by_id();
        let (mut summary, mut oldest) = (RollupSummary::default(), None);
        let mut not_read: HashSet<DirtyKey> = HashSet::new();
        // The bucket's state before any hour is read: a quiet window ending during the rounds
        // (a probe answering) leaves the hours read before it unread all the same.
        let (failures_before, failing_before) = (self.archive_request_failures(), self.archive_failed_lately());
        let mut tries = 0;
        // The marks the last round rolled up: a round past the third is given only to fewer
        // (a writer that stopped during the third leaves the fourth less than the third had;
        // one that never pauses, at least as many).
        let mut last_round = usize::MAX;
        let another = |tries: u32, due: usize, last_round: usize| {
            tries < ROLL_UP_BEFORE_DELETE_TRIES || (due < last_round && tries < ROLL_UP_BEFORE_DELETE_MAX_TRIES)
        };
        // Every hour of the partitions is due, the open ones too (QA46 F8: the last hour of a
        // fleet quiet past the hot retention, open by the watermark, went with the delete,
        // counted nowhere): their readings go, and a reading written into such an hour later
        // leaves its roll-up as it is (`Store::is_deleted_partition`).
        let ends = parts.iter().map(|(ti, p)| ti.partition.start_ms(i64::from(*p) + 1)).max();
        loop {
            let watermark = self.watermark(lateness).max(ends);
            let stopped = self.rollups_stopped.load(Ordering::Relaxed);
            if !stopped {
                // The buffered readings of the partitions become marks, to be seen.
                self.flush_write_buffer()?;
                let due = self.due_marks_of(parts, watermark, &not_read)?;
                if !due.is_empty() && another(tries, due.len(), last_round) {
                    tries += 1;
                    last_round = due.len();
                    let due = self.with_days_whole(&tables, due, usize::MAX, watermark, now_ms, &mut oldest)?;
                    not_read.extend(self.roll_up_chunks(
                        &mut pass,
                        &tables,
                        &due,
                        now_ms,
                        &mut summary,
                        &mut oldest,
                    )?);
                    continue;
                }
            }
            let writers = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let marking = self.marks_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let left = self.due_marks_of(parts, watermark, &not_read)?.len();
            if left > 0 && stopped {
                // An ordered stop ended roll-ups (QA25 F1): the partitions stay, for a run after
                // the next start to roll up what is left of them and delete them then.
                tracing::info!(
                    partitions = parts.len(),
                    "roll-ups stopped: partitions with readings not rolled up yet are deleted at the next start"
                );
                return Ok(None);
            }
            if !not_read.is_empty()
                && (failing_before || self.archive_request_failures() > failures_before || self.archive_failed_lately())
            {
                // Archived hours the bucket kept from being read (a request failed, during the
                // rounds or within the quiet window before: QA27 F1): the partitions stay for a
                // later run, where deleting them lost what they held and no pass had rolled up.
                tracing::warn!(
                    partitions = parts.len(),
                    hours = not_read.len(),
                    "the archive's bucket failed: partitions with readings not rolled up yet are deleted at a later \
                     retention run"
                );
                return Ok(None);
            }
            if left > 0 && another(tries, left, last_round) {
                // Written since the look above: rolled up in another round (which counts it).
                continue;
            }
            if left > 0 {
                // Writers outran the rounds (QA29 F1: a writer faster than the roll-up that
                // stopped during the last round lost all it wrote in it, 534,500 device-hours):
                // the partitions stay for a later run, which rolls those up first.
                tracing::warn!(
                    partitions = parts.len(),
                    hours = left,
                    "writers kept adding readings to partitions being deleted for good: they are deleted at a later \
                     retention run, once what was stored is rolled up"
                );
                return Ok(None);
            }
            let deleted = delete().map(Some);
            drop(marking);
            drop(writers);
            if deleted.as_ref().is_ok_and(Option::is_some) && !not_read.is_empty() {
                // Said (QA47 N6: a cold delete of a partition whose file was missing dropped its
                // open hour from the roll-ups, and the only trace, files_missing, with it).
                let first = not_read.iter().map(|m| m.hour).min().map(|h| Hour(i64::from(h)).start_ms());
                tracing::error!(
                    device_hours = not_read.len(),
                    first_hour = %first.map(model::utc_text).unwrap_or_default(),
                    partitions = parts.len(),
                    "archived hours whose file could not be read (damaged or missing) were deleted for good without \
                     being rolled up: their readings not rolled up before are in no roll-up"
                );
            }
            // Only the hours a round rolled up (QA47 N3: each run said it rolled up hours a write
            // had reached after their roll-up and an earlier delete, left as they were).
            let kept = summary.kept_past_retention + summary.past_rollup_retention;
            let rolled_up = summary.hours.saturating_sub(kept);
            if rolled_up > 0 {
                tracing::info!(
                    hours = rolled_up,
                    partitions = parts.len(),
                    "rolled up the readings of partitions before deleting them for good"
                );
            }
            if kept > 0 && deleted.as_ref().is_ok_and(Option::is_some) {
                tracing::info!(
                    hours = kept,
                    partitions = parts.len(),
                    "deleted for good readings written into hours after their roll-up and an earlier delete, or into \
                     days past their table's roll-up retention: their roll-ups were left as they were, without them"
                );
            }
            return deleted;
        }
    }

    /// The marks of partitions `parts` whose hour ends by `watermark`, but those in `skip`, in
    /// the queue's order.
    fn due_marks_of(
        &self,
        parts: &[(TableInfo, i32)],
        watermark: Option<i64>,
        skip: &HashSet<DirtyKey>,
    ) -> Result<Vec<(DirtyKey, u64)>> {
        let Some(w) = watermark else { return Ok(Vec::new()) };
        let mut due = Vec::new();
        for (ti, partition) in parts {
            let marks = self.partition_marks(ti, *partition)?;
            due.extend(
                marks.into_iter().filter(|(mark, _)| Hour(i64::from(mark.hour)).end_ms() <= w && !skip.contains(mark)),
            );
        }
        due.sort_unstable_by_key(|&(mark, _)| mark);
        Ok(due)
    }

    /// The due marks with every due mark of each device's day taken whole of which they hold
    /// one, that day's marks in one run where its first one was. A day is taken whole when it
    /// is past its table's hour roll-up retention: such a day is made from all its buckets
    /// (`Store::past_days`), once for all its marks, and a first time merged into its groups'
    /// days, where marks taken one pass each (a backlog's hours come in the queue's order,
    /// every device's first hour first) would make it up to 24 times, and its groups' days
    /// recomputed from all their devices' each time. It is also taken whole when its partition
    /// is archived and longer than an hour: its hours are read from the Parquet file with one
    /// read of the device's day (`ArchivedDay`), where reading each hour alone read the
    /// device's rows of the file 24 times over. Past `max_hours` marks no other mark is taken (the last
    /// day taken may end up to 23 past it): the rest wait for the next pass.
    fn with_days_whole(
        &self,
        tables: &HashMap<u32, TableInfo>,
        due: Vec<(DirtyKey, u64)>,
        max_hours: usize,
        watermark: Option<i64>,
        now_ms: i64,
        oldest: &mut Option<i64>,
    ) -> Result<Vec<(DirtyKey, u64)>> {
        let keeps = self.rollup_retentions.snapshot();
        let past = |mark: &DirtyKey| {
            keeps.get(&mark.table).is_some_and(|keep| !keep.may_roll_up(Hour(i64::from(mark.hour)).start_ms(), now_ms))
        };
        let archived_day = |mark: &DirtyKey| {
            tables.get(&mark.table).is_some_and(|ti| {
                ti.partition != PartitionSize::Hour
                    && bucket_of(ti, *mark).is_ok_and(|b| self.is_archived(ti.id, b.partition))
            })
        };
        let past = |mark: &DirtyKey| past(mark) || archived_day(mark);
        if !due.iter().any(|(mark, _)| past(mark)) {
            return Ok(due);
        }
        let dirty = cf(&self.db, CF_DIRTY);
        let mut out: Vec<(DirtyKey, u64)> = Vec::with_capacity(due.len());
        let mut taken: HashSet<DirtyKey> = HashSet::new();
        for (mark, gen) in due {
            if taken.contains(&mark) {
                continue;
            }
            // Past the budget (the days taken whole make more marks than were scanned), the
            // rest wait for the next pass.
            if out.len() >= max_hours {
                note_oldest(oldest, mark.hour);
                continue;
            }
            if !past(&mark) {
                taken.insert(mark);
                out.push((mark, gen));
                continue;
            }
            let hours: Vec<DirtyKey> = marks_of_day(mark)
                .filter(|key| watermark.is_some_and(|w| Hour(i64::from(key.hour)).end_ms() <= w))
                .collect();
            let encoded: Vec<[u8; keys::DIRTY_KEY_LEN]> = hours.iter().map(DirtyKey::encode).collect();
            let gens = self.db.batched_multi_get_cf(dirty, &encoded, false);
            for (key, value) in hours.into_iter().zip(gens) {
                let value = value.map_err(db_err("get dirty mark"))?;
                let gen = match value {
                    Some(v) => decode_gen(&v)?,
                    // The mark itself, done by a pass since the scan (none runs meanwhile) or
                    // not: as scanned.
                    None if key == mark => gen,
                    None => continue,
                };
                if taken.insert(key) {
                    out.push((key, gen));
                }
            }
        }
        Ok(out)
    }

    /// Does the marks of one chunk and commits them in one WriteBatch (module docs, steps 1–3).
    /// Returns the marks whose hour could not be read from the archive (left dirty); none is
    /// read there once the bucket's failed requests are more than `bucket_failures`.
    #[allow(clippy::too_many_arguments)]
    fn rollup_chunk(
        &self,
        tables: &HashMap<u32, TableInfo>,
        chunk: &[(DirtyKey, u64)],
        summary: &mut RollupSummary,
        oldest: &mut Option<i64>,
        now_ms: i64,
        bucket_failures: u64,
        pass: &mut PassMemory,
    ) -> Result<HashSet<DirtyKey>> {
        let mut ov = Overlay { db: &self.db, writes: BTreeMap::new() };
        // The devices' groups, read again each chunk: a device moved during a pass (a long one
        // takes minutes) has its hours rolled up after the move go to its new groups, and its
        // old groups' shards recomputed without it are not the only ones to change (QA22 F1:
        // its hours counted in neither group).
        let groups_of = &mut HashMap::new();
        // How the chunk changes the shards of each group hour (and so the group hour), and
        // each day of devices and groups.
        let mut hour_shards = ShardChanges::new();
        let mut days: BTreeMap<(u32, Owner, i64), Change> = BTreeMap::new();
        let mut done: Vec<(DirtyKey, u64)> = Vec::with_capacity(chunk.len());
        // Device-hours first rolled up after their partition's delete (`keys::after_delete_key`), and
        // device-days past the hour roll-up retention first made after one (`keys::day_after_delete_key`).
        let mut after_delete = Vec::new();
        // Marks of hours past their table's roll-up retention, done without a record.
        let mut past_retention = 0;
        // Marks of hours rolled up before their readings were deleted for good, kept as they were.
        let mut kept = 0;
        let keeps = self.rollup_retentions.snapshot();
        let mut due: Vec<(&TableInfo, DirtyKey)> = Vec::with_capacity(chunk.len());
        for &(mark, gen) in chunk {
            // A table created by a batch that has just committed becomes visible in the catalog
            // a moment after its marks: its hours wait for the next pass.
            let Some(ti) = tables.get(&mark.table) else {
                note_oldest(oldest, mark.hour);
                continue;
            };
            done.push((mark, gen));
            due.push((ti, mark));
        }
        let hour_records = self.hour_records(&due, bucket_failures)?;
        // The fields of each table's records, for the next chunks' size.
        let mut made: HashMap<u32, (usize, usize)> = HashMap::new();
        for ((_, mark), read) in due.iter().zip(&hour_records) {
            if let Ok(Some(read)) = read {
                let (records, fields) = made.entry(mark.table).or_default();
                *records += 1;
                *fields += read.record.fields.len();
            }
        }
        for (table, (records, fields)) in made {
            pass.fields_per_hour.insert(table, fields.div_ceil(records).max(1));
        }
        let past_days = self.past_days(&ov, &due, &hour_records, &keeps, now_ms, bucket_failures)?;
        // Each hour's newest reading settles its device's `latest` entry (see `Store::latest`).
        let mut newest: Vec<(DirtyKey, Vec<u8>)> = Vec::with_capacity(done.len());
        // Hours whose archive cannot be read: their marks stay for a later pass.
        let mut unreadable: HashSet<DirtyKey> = HashSet::new();
        for (&(ti, mark), computed) in due.iter().zip(hour_records) {
            let computed = match computed {
                Ok(computed) => computed,
                Err(reason) => {
                    unreadable.insert(mark);
                    note_oldest(oldest, mark.hour);
                    summary.unreadable_reason.get_or_insert(reason);
                    continue;
                }
            };
            let Some(HourRead { record, readings, newest: newest_here }) = computed else {
                continue;
            };
            newest.extend(newest_here.map(|n| (mark, n)));
            summary.readings += readings;
            let hour = Hour(i64::from(mark.hour)).start_ms();
            let day = Level::Day.period_start(hour);
            let device = Owner::Device(mark.device);
            let key = record_key(mark.table, &device, Level::Hour, hour);
            // An hour rolled up for the first time adds to everything above it; an hour rolled
            // up again replaces what it was, which only a recomputation can take out.
            // Unless its day has begun to leave the hour roll-up retention: its record, and its
            // day's other hours, have expired or soon will, so the day could not be recomputed
            // from its hours. It is recomputed from their buckets instead (below), and the
            // hour's own record written as any while it is kept.
            let keep = keeps.get(&mark.table).unwrap_or(&RollupKeep::ALL);
            let past_day = !keep.may_roll_up(hour, now_ms);
            if past_day {
                match past_days.get(&(mark.table, mark.device, day)) {
                    Some(PastDay::Computed { .. }) => {}
                    Some(PastDay::Unreadable(reason)) => {
                        unreadable.insert(mark);
                        note_oldest(oldest, mark.hour);
                        summary.unreadable_reason.get_or_insert_with(|| reason.clone());
                        continue;
                    }
                    Some(PastDay::Left) | None => {
                        past_retention += 1;
                        continue;
                    }
                }
                if !keep.may_write(Level::Hour, hour, now_ms) {
                    continue;
                }
            }
            let first_time = !ov.has(&key)?;
            // Unless its readings were deleted for good since it was rolled up: its bucket holds
            // only what was written after (a replay, say), and its record is all that is left
            // of the rest. It stays as it is, as every record above it. An hour first rolled up
            // after the delete counts only readings its bucket holds: marked, it is recomputed
            // as any other (until the next delete of its partition takes the mark off).
            if self.is_deleted_partition(mark.table, bucket_of(ti, mark)?.partition) {
                if first_time {
                    after_delete.push(keys::after_delete_key(mark.table, mark.hour, mark.device));
                } else if !self.rolled_up_after_delete(mark.table, mark.hour, mark.device)? {
                    kept += 1;
                    continue;
                }
            }
            if !past_day {
                note(&mut days, (mark.table, device, day), first_time.then_some(&record));
            }
            if !(first_time && record.fields.is_empty()) {
                let mut member = Record::default();
                member.merge_member(mark.device, &record);
                let delta = first_time.then_some(&member);
                // A group's day changes as its hours do: noted below, once a group-hour.
                for group in self.groups_of(mark.device, groups_of)? {
                    note(&mut hour_shards, (mark.table, group.clone(), hour, shard_of(mark.device)), delta);
                }
            }
            ov.put(key, record);
        }
        for GroupChange { table, group, start: hour, change, shards } in by_period(hour_shards) {
            let owner = Owner::Group(group.clone());
            let key = record_key(table, &owner, Level::Hour, hour);
            let delta = match &change {
                Change::Merge(delta) => Some(delta),
                Change::Recompute => None,
            };
            // A day past the hour roll-up retention follows its devices' days instead (below).
            if keeps.get(&table).unwrap_or(&RollupKeep::ALL).may_roll_up(hour, now_ms) {
                note(&mut days, (table, owner, Level::Day.period_start(hour)), delta);
            }
            let record = self.group_changed(&mut ov, (table, &group, Level::Hour, hour), change, shards)?;
            ov.put(key, record);
        }
        // The days past the hour roll-up retention recomputed from their buckets: each device's
        // replaces what it was, and its groups' days follow as its hours' would (a first one
        // merged in, one recomputed again recomputes them from their devices' days).
        let mut day_shards = ShardChanges::new();
        let mut from_buckets = 0;
        for ((table, device, day), past) in past_days {
            let PastDay::Computed { record, after_delete: deleted } = past else {
                continue;
            };
            let key = record_key(table, &Owner::Device(device), Level::Day, day);
            let first_time = !ov.has(&key)?;
            // Made, or made again, from what the buckets hold since the delete: marked so, it is
            // made again at a later reading (until the next delete of one of its partitions).
            if deleted {
                after_delete.push(keys::day_after_delete_key(table, first_hour_of(day), device));
            }
            if !(first_time && record.fields.is_empty()) {
                let mut member = Record::default();
                member.merge_member(device, &record);
                let delta = first_time.then_some(&member);
                for group in self.groups_of(device, groups_of)? {
                    note(&mut day_shards, (table, group.clone(), day, shard_of(device)), delta);
                }
            }
            from_buckets += 1;
            ov.put(key, record);
        }
        for GroupChange { table, group, start: day, change, shards } in by_period(day_shards) {
            let key = record_key(table, &Owner::Group(group.clone()), Level::Day, day);
            let record = self.group_changed(&mut ov, (table, &group, Level::Day, day), change, shards)?;
            ov.put(key, record);
        }
        for ((table, owner, start), change) in days {
            let key = record_key(table, &owner, Level::Day, start);
            let record = changed(&ov, &key, change, || ov.merge_within(table, &owner, Level::Hour, Level::Day, start))?;
            ov.put(key, record);
        }

        if !unreadable.is_empty() {
            done.retain(|(mark, _)| !unreadable.contains(mark));
            summary.unreadable += unreadable.len();
        }
        // The marks' deletions come after the records.
        let mut wb = ov.into_batch(done.len() * (keys::DIRTY_KEY_LEN + BATCH_ENTRY_OVERHEAD));
        for key in &after_delete {
            wb.put_cf(cf(&self.db, CF_CATALOG), key, []);
        }
        newest.sort_unstable_by_key(|(mark, _)| (mark.table, mark.device));
        for (mark, operand) in &newest {
            wb.merge_cf(cf(&self.db, CF_LATEST), keys::latest_key(mark.table, mark.device), operand);
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        // Compare-and-delete under the writers' lock: no write can rewrite a mark between this
        // read and the commit.
        let writers = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Nor a write-buffer flush, which writes marks without the writers' lock.
        let marking = self.marks_lock.lock().unwrap_or_else(PoisonError::into_inner);
        for mark in self.delete_done_marks(&mut wb, &mut done)? {
            summary.rewritten += 1;
            note_oldest(oldest, mark.hour);
        }
        self.db.write_opt(wb, &wo).map_err(db_err("write roll-ups"))?;
        self.stats.latest_operands.fetch_add(newest.len() as u64, Ordering::Relaxed);
        drop(marking);
        drop(writers);
        summary.hours += done.len();
        summary.past_rollup_retention += past_retention;
        summary.kept_past_retention += kept;
        summary.days_from_buckets += from_buckets;
        self.stats.rollup_hours_processed.fetch_add(done.len() as u64, Ordering::Relaxed);
        // Both left as they were, their new readings in no roll-up (QA47 N3: the kept ones were
        // counted nowhere, though the README said so).
        self.stats.rollup_hours_past_retention.fetch_add((past_retention + kept) as u64, Ordering::Relaxed);
        self.stats.rollup_days_from_buckets.fetch_add(from_buckets as u64, Ordering::Relaxed);
        Ok(unreadable)
    }

    /// Puts into `wb` the deletion of the marks of `done` that still hold the generation read
    /// (sorting `done` by key), and returns the others: rewritten by a write since, or gone.
    /// Called under the writers' and marks' locks, so no mark is written meanwhile.
    ///
    /// Marks deleted one by one leave a tombstone each, which every later scan of the queue
    /// steps over until a compaction drops it: a pass's scan grew with the marks the passes
    /// before it had done (a tenth of a large roll-up's time; BENCHMARKS.md, "the work queue's
    /// tombstones"). So [`RANGE_DELETE_MIN_MARKS`] or more marks in a row of the queue (no other
    /// mark between them: read here) go in one range delete, which scans skip whole.
    fn delete_done_marks(&self, wb: &mut WriteBatch, done: &mut [(DirtyKey, u64)]) -> Result<Vec<DirtyKey>> {
        let dirty = cf(&self.db, CF_DIRTY);
        done.sort_unstable_by_key(|&(mark, _)| mark);
        let mut left = Vec::new();
        // Unchanged marks in a row of the queue.
        let mut run: Vec<DirtyKey> = Vec::new();
        let end_run = |run: &mut Vec<DirtyKey>, wb: &mut WriteBatch| {
            match (run.first(), run.last()) {
                (Some(first), Some(last)) if run.len() >= RANGE_DELETE_MIN_MARKS => {
                    // The key right after `last`: every mark's key has the same length.
                    let mut end = last.encode().to_vec();
                    end.push(0);
                    wb.delete_range_cf(dirty, first.encode().as_slice(), end.as_slice());
                }
                _ => {
                    for mark in run.iter() {
                        wb.delete_cf(dirty, mark.encode());
                    }
                }
            }
            run.clear();
        };
        let mut it = self.db.raw_iterator_cf(dirty);
        let mut i = 0;
        let mut positioned = false;
        while let Some(&(mark, gen)) = done.get(i) {
            let want = mark.encode();
            if !positioned {
                it.seek(want);
                positioned = true;
            }
            match it.key() {
                Some(k) if k == want => {
                    let v = it.value().unwrap_or_default();
                    if decode_gen(v)? == gen {
                        run.push(mark);
                    } else {
                        end_run(&mut run, wb);
                        left.push(mark);
                    }
                    it.next();
                    i += 1;
                }
                // A mark not done lies before this one: the run ends there.
                Some(k) if k < want.as_slice() => {
                    end_run(&mut run, wb);
                    positioned = false;
                }
                // Gone: nothing to delete, and nothing between its neighbours.
                _ => {
                    left.push(mark);
                    i += 1;
                }
            }
        }
        it.status().map_err(db_err("read dirty marks"))?;
        end_run(&mut run, wb);
        Ok(left)
    }

    /// Each due mark's hour record from its bucket, with the bucket's reading count and newest
    /// reading (`None` when the bucket is gone), in the order of `due`. Reading and decoding
    /// the buckets and folding them into records is most of a pass's work and needs nothing
    /// from the other marks, so it is split over up to `rollup_workers` threads, each taking a
    /// contiguous share (ending at a device-day's end); everything after it (merges into days,
    /// months and groups) stays on the caller's. An archived hour is not read once the bucket's
    /// failed requests are more than `bucket_failures` (its hour is unreadable).
    fn hour_records(&self, due: &[(&TableInfo, DirtyKey)], bucket_failures: u64) -> Result<Vec<HourResult>> {
        let read_one = |&(ti, mark): &(&TableInfo, DirtyKey),
                        day: &mut ArchivedDay,
                        day_follows: bool|
         -> Result<Option<HourRead>> {
            match self.hour_record_from_columns(ti, mark)? {
                Some(Some(computed)) => return Ok(Some(computed)),
                // Gone, and not to the archive: retention dropped it. (A spill puts the
                // partition in the manifest before it deletes its buckets, so a bucket that a
                // spill took between the check and the read is archived by now: read below.)
                Some(None) if !self.is_archived(ti.id, bucket_of(ti, mark)?.partition) => return Ok(None),
                _ => {}
            }
            // Archived first: the look at the bucket's health may start a probe of it.
            if self.is_archived(ti.id, bucket_of(ti, mark)?.partition)
                && (self.archive_request_failures() > bucket_failures || self.archive_failed_lately())
            {
                return Err(Error::Archive(
                    "not read: a request to the archive's bucket failed, and it has not answered since".into(),
                ));
            }
            let Some(readings) = self.bucket_readings(ti, mark, day, day_follows)? else {
                return Ok(None);
            };
            let newest = readings.last().map(|last| {
                let mut newest = Vec::new();
                let version = read(&self.catalog).schema(ti.id).version;
                codec::encode_versioned(std::slice::from_ref(last), version, &mut newest);
                newest
            });
            let mut record = Record::of_readings(&readings);
            record.pack_wide_sketches();
            Ok(Some(HourRead { record, readings: readings.len(), newest }))
        };
        // A worker's marks in order, a device's archived day read once for its run of hours. An
        // archive that cannot be read stops its hour, not the pass: one damaged file would
        // otherwise keep every hour of the store from being rolled up.
        let some = |part: &[(&TableInfo, DirtyKey)]| -> Result<Vec<HourResult>> {
            let mut day = ArchivedDay::default();
            let mut out = Vec::with_capacity(part.len());
            for (i, due) in part.iter().enumerate() {
                let day_follows = part.get(i + 1).is_some_and(|(_, next)| same_device_day(due.1, *next));
                out.push(match read_one(due, &mut day, day_follows) {
                    Err(Error::Archive(reason)) => Err(reason),
                    other => Ok(other?),
                });
            }
            Ok(out)
        };
        let workers = self.cfg.rollup_workers.clamp(1, due.len().max(1));
        if workers == 1 {
            return some(due);
        }
        // Contiguous shares of about equal size, each ending at a device-day's end: a run of a
        // device's archived day is read by one worker, once.
        let share = due.len().div_ceil(workers);
        let mut parts = Vec::with_capacity(workers);
        let mut rest = due;
        while !rest.is_empty() {
            let mut end = share.min(rest.len());
            while end < rest.len() && same_device_day(rest[end - 1].1, rest[end].1) {
                end += 1;
            }
            let (part, after) = rest.split_at(end);
            parts.push(part);
            rest = after;
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = parts.into_iter().map(|part| scope.spawn(move || some(part))).collect();
            let mut out = Vec::with_capacity(due.len());
            for handle in handles {
                // A worker's panic is the pass's, as if it had run on the caller's thread.
                out.extend(handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?);
            }
            Ok(out)
        })
    }

    /// The days of devices past their table's hour roll-up retention of which `due` has a
    /// mark, each with what the pass makes of it ([`PastDay`]; module docs, "Retention"): one
    /// within the day roll-up retention is recomputed from its hours' buckets, all of them,
    /// whether marked or not (the marked ones as `read` has them, `due`'s, in its order, the
    /// others read here), unless a partition of it was deleted for good and the device has a
    /// record of the day (`ov`), which counts what the delete took.
    fn past_days(
        &self,
        ov: &Overlay<'_>,
        due: &[(&TableInfo, DirtyKey)],
        read: &[HourResult],
        keeps: &HashMap<u32, RollupKeep>,
        now_ms: i64,
        bucket_failures: u64,
    ) -> Result<HashMap<DeviceDay, PastDay>> {
        let mut out = HashMap::new();
        let marked: HashMap<DirtyKey, &HourResult> = due.iter().map(|(_, mark)| *mark).zip(read).collect();
        // The hours to read, and the day each run of hours makes: each hour read (`None`, in
        // `unread`'s order) or marked.
        let mut unread: Vec<(&TableInfo, DirtyKey)> = Vec::new();
        let mut runs: Vec<(DeviceDay, bool, Vec<Option<&HourResult>>)> = Vec::new();
        for &(ti, mark) in due {
            let keep = keeps.get(&mark.table).unwrap_or(&RollupKeep::ALL);
            if keep.may_roll_up(Hour(i64::from(mark.hour)).start_ms(), now_ms) {
                continue;
            }
            let day = day_of(mark.hour);
            let Entry::Vacant(slot) = out.entry((mark.table, mark.device, day)) else {
                continue;
            };
            // The day's hours that a bucket key can hold.
            let of_day: Vec<(DirtyKey, BucketKey)> =
                marks_of_day(mark).filter_map(|key| Some((key, bucket_of(ti, key).ok()?))).collect();
            // A partition past its retention that no retention run has deleted yet holds all
            // that was written into it: the day is made from it, before the delete takes it (a
            // backlog uploaded days late, QA35 F1). One deleted for good holds only what was
            // written since: a record made before counts more, and is left as it is; a day
            // first made after counts what is stored, as an hour first rolled up after, and is
            // made again from it at a later reading (a backlog arriving over several passes)
            // while its mark stays (taken off by the next delete of one of its partitions).
            let deleted = of_day.iter().any(|(_, b)| self.is_deleted_partition(mark.table, b.partition));
            let left = !keep.may_write(Level::Day, day, now_ms)
                || (deleted
                    && ov.has(&record_key(mark.table, &Owner::Device(mark.device), Level::Day, day))?
                    && !self.made_after_delete(mark.table, first_hour_of(day), mark.device)?);
            if left {
                slot.insert(PastDay::Left);
                continue;
            }
            slot.insert(PastDay::Computed { record: Record::default(), after_delete: deleted });
            let mut run = Vec::with_capacity(of_day.len());
            for (key, _) in of_day {
                let known = marked.get(&key).copied();
                if known.is_none() {
                    unread.push((ti, key));
                }
                run.push(known);
            }
            runs.push(((mark.table, mark.device, day), deleted, run));
        }
        let fresh = self.hour_records(&unread, bucket_failures)?;
        let mut fresh = fresh.iter();
        for (day, after_delete, run) in runs {
            let mut record = Record::default();
            let mut failed = None;
            for known in run {
                let Some(hour) = known.or_else(|| fresh.next()) else {
                    continue;
                };
                match hour {
                    Ok(Some(hour)) => record.merge(&hour.record),
                    Ok(None) => {}
                    Err(reason) => {
                        failed.get_or_insert_with(|| reason.clone());
                    }
                }
            }
            record.pack_wide_sketches();
            out.insert(day, failed.map_or(PastDay::Computed { record, after_delete }, PastDay::Unreadable));
        }
        Ok(out)
    }

    /// The hour record of a dirty mark's bucket, its reading count and newest reading, read
    /// field by field from the bucket's columns — the usual case, without a [`Reading`] per
    /// reading: a hot partition, a device that is no outlier, no field name under two numeric
    /// types. `Some(None)` when the bucket is gone; `None` when the hour is not such a case
    /// (the caller folds its readings instead).
    #[allow(clippy::option_option)]
    fn hour_record_from_columns(&self, ti: &TableInfo, mark: DirtyKey) -> Result<Option<Option<HourRead>>> {
        let bucket = bucket_of(ti, mark)?;
        if self.is_archived(ti.id, bucket.partition) || self.is_outlier_id(mark.table, mark.device) {
            return Ok(None);
        }
        let Some(v) = self.db.get_pinned_cf(cf(&self.db, CF_BUCKETS), bucket.encode()).map_err(db_err("get bucket"))?
        else {
            return Ok(Some(None));
        };
        // Archived since the look above: the bucket may be a late reading written after the
        // spill, not the hour (`bucket_readings` reads it with the archive's).
        if self.is_archived(ti.id, bucket.partition) {
            return Ok(None);
        }
        let columns =
            codec::decode_columns(&v).map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
        let mut record = Record::default();
        for column in &columns.fields {
            let Some(agg) = column.numbers(&columns.ts).and_then(FieldAgg::of_points) else {
                continue;
            };
            if record.fields.insert(column.name.into(), agg).is_some() {
                // A name under two numeric types: its readings fold into one aggregate.
                return Ok(None);
            }
        }
        let newest = if columns.ts.is_empty() {
            None
        } else {
            let reading = codec::newest_of_columns(&columns)
                .map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
            let mut newest = Vec::new();
            codec::encode_versioned(std::slice::from_ref(&reading), columns.schema_version, &mut newest);
            Some(newest)
        };
        record.pack_wide_sketches();
        Ok(Some(Some(HourRead { record, readings: columns.ts.len(), newest })))
    }

    /// The readings of a dirty mark's bucket; `None` when the bucket is gone (retention
    /// dropped its partition after the write that marked it).
    ///
    /// A spill may archive the partition, or merge its late readings into a new file, while it
    /// is read: RocksDB is read after the manifest entry, and the entry is looked up again
    /// after it, reading again if it changed (see `Store::archive_entry`). Without that, the
    /// hour's record could leave out late readings (or keep a replaced value) for good: the
    /// mark is done.
    ///
    /// `day` keeps the archived readings of the device-day read last; with `day_follows` (the
    /// next mark read is of the same device-day) the device's whole day is read into it, where
    /// the hour alone would be read otherwise.
    fn bucket_readings(
        &self,
        ti: &TableInfo,
        mark: DirtyKey,
        day: &mut ArchivedDay,
        day_follows: bool,
    ) -> Result<Option<Vec<Reading>>> {
        let bucket = bucket_of(ti, mark)?;
        for _ in 0..crate::archive::ARCHIVE_READ_ATTEMPTS {
            let Some(entry) = self.archive_entry(ti.id, bucket.partition) else {
                self.between_archive_reads();
                let hot = self.hot_bucket_readings(bucket, mark)?;
                // Archived since the look above: RocksDB may have lost the readings to the
                // archive (`hour_records`), read them there.
                if self.is_archived(ti.id, bucket.partition) {
                    continue;
                }
                return Ok(hot);
            };
            // The hour's archived readings, then RocksDB's (late ones), which win at equal times.
            let (table, device) = self.names_of(ti.id, mark.device)?;
            let hour_start = Hour(i64::from(mark.hour)).start_ms();
            let hour = TimeRange { start: hour_start, end: hour_start + model::HOUR_MS };
            let key = ArchivedDayKey {
                table: ti.id,
                partition: bucket.partition,
                device: mark.device,
                day: day_of(mark.hour),
                entry,
            };
            let mut readings = match day.take_hour(key, hour) {
                Some(readings) => readings,
                None if day_follows => {
                    let whole = TimeRange { start: key.day, end: key.day + DAY_MS };
                    let readings = self.archived_readings(&table, ti, (bucket.partition, entry), &device, whole)?;
                    day.held = Some((key, readings));
                    day.take_hour(key, hour).unwrap_or_default()
                }
                None => self.archived_readings(&table, ti, (bucket.partition, entry), &device, hour)?,
            };
            self.between_archive_reads();
            let hot = self.hot_bucket_readings(bucket, mark)?;
            if self.archive_entry(ti.id, bucket.partition) != Some(entry) {
                continue;
            }
            let any = !readings.is_empty() || hot.is_some();
            readings.extend(hot.unwrap_or_default());
            codec::sort_dedup_last_wins(&mut readings);
            return Ok(any.then_some(readings));
        }
        let (table, _) = self.names_of(ti.id, mark.device)?;
        Err(Store::rewritten_while_read(&table, bucket.partition))
    }

    /// The readings RocksDB holds in a dirty mark's bucket (and sub-buckets); `None` when it
    /// holds none.
    fn hot_bucket_readings(&self, bucket: BucketKey, mark: DirtyKey) -> Result<Option<Vec<Reading>>> {
        let corrupt = |e: codec::Error| Error::Corrupt { what: "bucket", detail: e.to_string() };
        let mut readings = Vec::new();
        if !self.is_outlier_id(mark.table, mark.device) {
            let Some(v) =
                self.db.get_pinned_cf(cf(&self.db, CF_BUCKETS), bucket.encode()).map_err(db_err("get bucket"))?
            else {
                return Ok(None);
            };
            codec::decode(&v, &mut readings).map_err(corrupt)?;
            return Ok(Some(readings));
        }
        // An outlier's hour: its bucket and sub-buckets, merged (see `crate::outliers`).
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(bucket.encode().to_vec()));
        let mut any = false;
        for item in self.db.iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts, IteratorMode::Start) {
            let (_, v) = item.map_err(db_err("scan sub-buckets"))?;
            codec::decode(&v, &mut readings).map_err(corrupt)?;
            any = true;
        }
        codec::sort_dedup_last_wins(&mut readings);
        Ok(any.then_some(readings))
    }

    /// The groups whose records a device's hours roll up into: the table (`""`) and every
    /// ancestor of its place in the registry. Cached for the chunk.
    fn groups_of<'c>(&self, device: u64, cache: &'c mut HashMap<u64, Vec<String>>) -> Result<&'c [String]> {
        let groups = match cache.entry(device) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let mut groups = vec![String::new()];
                if let Some(record) = self.record_by_id(device)? {
                    groups.extend(record.ancestors);
                }
                e.insert(groups)
            }
        };
        Ok(groups)
    }

    /// A group's record of a period once the chunk's `change` to it is made, its shards
    /// (`shards`: the chunk's changes to them, by shard) and super-shards put in `ov` (module
    /// docs, step 2). A merge merges the deltas into the record and into its shards, and
    /// leaves their super-shards [`stale`]; a recomputation recomputes each shard a replaced
    /// record is of from the records of its devices, each super-shard changed or stale from
    /// its shards, and the group from its super-shards. A period whose shards are not whole
    /// (one rolled up before shards existed) has its first recomputation make them all, from
    /// every device of the group; one whose super-shards are not (rolled up before they
    /// existed), make those from its shards.
    fn group_changed(
        &self,
        ov: &mut Overlay<'_>,
        (table, group, level, start): (u32, &str, Level, i64),
        change: Change,
        shards: Vec<(u32, Change)>,
    ) -> Result<Record> {
        let period = (table, group, level, start);
        let key = record_key(table, &Owner::Group(group.to_string()), level, start);
        let whole_key = shard_key(table, group, level, start, WHOLE);
        let existing = ov.get(&key)?;
        let whole = match &existing {
            Some(existing) => whole_of(ov.get(&whole_key)?.as_ref(), existing),
            None => Whole::Supers,
        };
        // A recomputation of a period whose shards are not whole makes them all. So does one of
        // a period the group has no record of (a device moved into it since): its other
        // devices may have records. Shards not whole are merged into all the same, to be made
        // again then.
        if matches!(change, Change::Recompute) && (existing.is_none() || whole == Whole::No) {
            return self.group_made_whole(ov, period);
        }
        let merged = |delta: &Delta, existing: Option<Record>| {
            let mut record = existing.unwrap_or_default();
            delta.merge_into(&mut record);
            record
        };
        let redo: BTreeSet<u32> =
            shards.iter().filter(|(_, c)| matches!(c, Change::Recompute)).map(|&(shard, _)| shard).collect();
        let mut members = if redo.is_empty() { BTreeMap::new() } else { self.members(table, group, Some(&redo))? };
        let mut changed = BTreeSet::new();
        for (shard, c) in shards {
            let key = shard_key(table, group, level, start, shard);
            let record = match c {
                Change::Merge(delta) => merged(&delta, ov.get(&key)?),
                Change::Recompute => {
                    self.merge_members(ov, (table, level, start), &members.remove(&shard).unwrap_or_default())?
                }
            };
            ov.put(key, record);
            changed.insert(super_of(shard));
        }
        let (record, whole) = match (change, whole) {
            (Change::Merge(delta), whole) => {
                for &s in &changed {
                    ov.put(super_key(table, group, level, start, s), stale());
                }
                (merged(&delta, existing), whole)
            }
            (Change::Recompute, Whole::Supers) => (Self::merge_supers(ov, period, &changed)?, Whole::Supers),
            (Change::Recompute, _) => (Self::supers_made(ov, period)?, Whole::Supers),
        };
        if whole != Whole::No {
            ov.put(whole_key, whole_mark(&record, whole));
        }
        Ok(record)
    }

    /// A group's record of a period as the merge of its super-shards, those in `changed` or
    /// [`stale`] made again from their shards.
    fn merge_supers(
        ov: &mut Overlay<'_>,
        (table, group, level, start): (u32, &str, Level, i64),
        changed: &BTreeSet<u32>,
    ) -> Result<Record> {
        let period = (table, group, level, start);
        let mut supers: BTreeMap<u32, Option<Record>> = BTreeMap::new();
        let (lo, hi) = super_range(period);
        for (k, record) in ov.scan_keyed(lo, hi)? {
            let s = part_number(&k)?;
            supers.insert(s, (!changed.contains(&s) && !is_stale(&record)).then_some(record));
        }
        for &s in changed {
            supers.insert(s, None);
        }
        let mut out = Record::default();
        for (s, record) in supers {
            let record = match record {
                Some(record) => record,
                None => {
                    let (first, end) = shards_of(s);
                    let made = ov.merged(
                        shard_key(table, group, level, start, first),
                        shard_key(table, group, level, start, end),
                    )?;
                    ov.put(super_key(table, group, level, start, s), made.clone());
                    made
                }
            };
            out.merge(&record);
        }
        Ok(out)
    }

    /// A group's record of a period made from its shards, with all its super-shards, replacing
    /// any made before (`group_changed`).
    fn supers_made(ov: &mut Overlay<'_>, period: (u32, &str, Level, i64)) -> Result<Record> {
        let (lo, hi) = super_range(period);
        ov.clear(lo, hi)?;
        let (lo, hi) = shard_range(period);
        let mut supers: BTreeMap<u32, Record> = BTreeMap::new();
        for (k, record) in ov.scan_keyed(lo, hi)? {
            supers.entry(super_of(part_number(&k)?)).or_default().merge(&record);
        }
        Ok(Self::put_supers(ov, period, supers))
    }

    /// Puts `supers`, a group period's super-shards by number, and returns their merge.
    fn put_supers(
        ov: &mut Overlay<'_>,
        (table, group, level, start): (u32, &str, Level, i64),
        supers: BTreeMap<u32, Record>,
    ) -> Record {
        let mut out = Record::default();
        for (s, record) in supers {
            out.merge(&record);
            ov.put(super_key(table, group, level, start, s), record);
        }
        out
    }

    /// The devices under group path `group` of each shard in `only`, by shard: those of the
    /// shard's ids whose device record places them there (a range of `registry` keys a shard).
    fn members_by_records(&self, group: &str, only: &BTreeSet<u32>) -> Result<BTreeMap<u32, Vec<u64>>> {
        let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for &shard in only {
            let first = u64::from(shard) << SHARD_BITS;
            let mut opts = ReadOptions::default();
            opts.set_iterate_range(keys::device_record_key(first)..keys::device_record_key(first + (1 << SHARD_BITS)));
            for item in self.db.iterator_cf_opt(cf(&self.db, CF_REGISTRY), opts, IteratorMode::Start) {
                let (k, v) = item.map_err(db_err("scan device records"))?;
                if crate::registry::decode_record(&v)?.ancestors.iter().any(|a| a == group) {
                    out.entry(shard).or_default().push(decode_id(&k[1..], "device record key")?);
                }
            }
        }
        Ok(out)
    }

    /// A group's record of a period made from the records of every device in it, with all its
    /// shards and super-shards, replacing any made before (`group_changed`).
    fn group_made_whole(
        &self,
        ov: &mut Overlay<'_>,
        (table, group, level, start): (u32, &str, Level, i64),
    ) -> Result<Record> {
        let period = (table, group, level, start);
        // Shards merged into while they were not whole, and their super-shards.
        for (lo, hi) in [shard_range(period), super_range(period)] {
            ov.clear(lo, hi)?;
        }
        let mut supers: BTreeMap<u32, Record> = BTreeMap::new();
        for (shard, devices) in self.members(table, group, None)? {
            let record = self.merge_members(ov, (table, level, start), &devices)?;
            supers.entry(super_of(shard)).or_default().merge(&record);
            ov.put(shard_key(table, group, level, start, shard), record);
        }
        let out = Self::put_supers(ov, period, supers);
        ov.put(shard_key(table, group, level, start, WHOLE), whole_mark(&out, Whole::Supers));
        Ok(out)
    }

    /// The records of `devices` of the `level` period starting at `start` in `table`, merged as
    /// a group's members.
    fn merge_members(
        &self,
        ov: &Overlay<'_>,
        (table, level, start): (u32, Level, i64),
        devices: &[u64],
    ) -> Result<Record> {
        let mut out = Record::default();
        for &device in devices {
            if let Some(r) = ov.get(&record_key(table, &Owner::Device(device), level, start))? {
                out.merge_member(device, &r);
            }
        }
        Ok(out)
    }

    /// The devices of a group by shard, of the shards in `only` (`None`: all): for the table
    /// (`""`) every device with data in it, else every device under the group path. A group's
    /// index is in name order, so a few shards of a large group are found from their ids'
    /// device records instead, a range of keys a shard ([`Store::members_by_records`]): the
    /// index is read for at most as many entries as those records (a group of 10M devices
    /// took a second for it).
    fn members(&self, table: u32, group: &str, only: Option<&BTreeSet<u32>>) -> Result<BTreeMap<u32, Vec<u64>>> {
        let mut out: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        if !group.is_empty() {
            let mut opts = ReadOptions::default();
            opts.set_iterate_range(rocksdb::PrefixRange(keys::under_index_prefix(group)));
            // Past as many entries as the shards asked for have ids, their records are read.
            let ids = only.map(|only| (only, only.len().saturating_mul(1 << SHARD_BITS)));
            for (seen, item) in
                self.db.iterator_cf_opt(cf(&self.db, CF_REGISTRY), opts, IteratorMode::Start).enumerate()
            {
                if let Some((only, _)) = ids.filter(|&(_, ids)| seen >= ids) {
                    return self.members_by_records(group, only);
                }
                let (_, v) = item.map_err(db_err("scan group members"))?;
                let device = decode_id(&v, "group index entry")?;
                let shard = shard_of(device);
                if only.is_none_or(|only| only.contains(&shard)) {
                    out.entry(shard).or_default().push(device);
                }
            }
            return Ok(out);
        }
        // The table's devices are its `latest` keys, in id order: a shard is one range of them.
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(keys::table_prefix(table).to_vec()));
        let mut it = self.db.raw_iterator_cf_opt(cf(&self.db, CF_LATEST), opts);
        let starts: Vec<Option<u32>> = match only {
            Some(only) => only.iter().copied().map(Some).collect(),
            None => vec![None],
        };
        for first in starts {
            match first {
                Some(shard) => it.seek(keys::latest_key(table, u64::from(shard) << SHARD_BITS)),
                None => it.seek_to_first(),
            }
            while let Some(k) = it.key() {
                let device = decode_id(&k[4..], "latest key")?;
                let shard = shard_of(device);
                if first.is_some_and(|first| shard != first) {
                    break;
                }
                out.entry(shard).or_default().push(device);
                it.next();
            }
            it.status().map_err(db_err("scan group members"))?;
        }
        Ok(out)
    }

    /// The stored records of `owner` at `level` whose period starts in `range`, in time order,
    /// from the first period the table's roll-up retention and floor keep, handed to `visit`
    /// one at a time as they are read (a long range is never held whole); the read stops when
    /// `visit` breaks.
    fn visit_records(
        &self,
        ti: &TableInfo,
        owner: &Owner,
        level: Level,
        range: TimeRange,
        visit: &mut dyn FnMut(i64, Record) -> ControlFlow<()>,
    ) -> Result<()> {
        let first_kept = self.rollup_retentions.keep(ti.id).first_kept(level, model::now_ms());
        let Some(range) = TimeRange::new(range.start.max(first_kept), range.end) else {
            return Ok(());
        };
        let table = ti.id;
        if level != Level::Month {
            let (lo, hi) = (record_key(table, owner, level, range.start), record_key(table, owner, level, range.end));
            return visit_stored(&self.db, lo, hi, visit);
        }
        // A month is the merge of its days (module docs). The months starting in the range
        // hold days from its start on, up to 31 days past its end; the days come in time
        // order, so a month is whole when a day of the next one (or the end) comes.
        let (lo, hi) = (range.start, range.end.saturating_add(31 * DAY_MS));
        let mut month: Option<(i64, Record)> = None;
        let mut flow = ControlFlow::Continue(());
        let mut by_day = |day: i64, record: Record| {
            let start = GroupLevel::Month.group_start(day);
            match &mut month {
                Some((m, merged)) if *m == start => {
                    merged.merge(&record);
                    return ControlFlow::Continue(());
                }
                _ => {}
            }
            if let Some((m, merged)) = month.replace((start, record)) {
                if range.contains(m) {
                    flow = visit(m, merged);
                }
            }
            flow
        };
        visit_stored(
            &self.db,
            record_key(table, owner, Level::Day, lo),
            record_key(table, owner, Level::Day, hi),
            &mut by_day,
        )?;
        if let (ControlFlow::Continue(()), Some((m, merged))) = (flow, month) {
            if range.contains(m) {
                let _ = visit(m, merged);
            }
        }
        Ok(())
    }

    /// [`Store::visit_records`], collected.
    fn scan_records(
        &self,
        ti: &TableInfo,
        owner: &Owner,
        level: Level,
        range: TimeRange,
    ) -> Result<Vec<(i64, Record)>> {
        let mut out = Vec::new();
        self.visit_records(ti, owner, level, range, &mut |start, record| {
            out.push((start, record));
            ControlFlow::Continue(())
        })?;
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
        self.scan_records(&ti, &Owner::Device(dev), level, range).map(Some)
    }

    /// The records of [`Store::rollups`], handed to `visit` one at a time as they are read, in
    /// time order, so that an answer can be bounded as it is read; the read stops when `visit`
    /// breaks. `false` when the table or the device (in that table) is unknown.
    pub fn visit_rollups(
        &self,
        table: &str,
        device: &str,
        level: Level,
        range: TimeRange,
        visit: &mut dyn FnMut(i64, Record) -> ControlFlow<()>,
    ) -> Result<bool> {
        let Some((ti, dev)) = self.device_in_table(table, device)? else {
            return Ok(false);
        };
        self.visit_records(&ti, &Owner::Device(dev), level, range, visit)?;
        Ok(true)
    }

    /// The roll-up records of group `group` (a registry group path; `""` for the whole table)
    /// in `table`, like [`Store::rollups`]: each the merge of the records of the devices in
    /// the group, with the devices that reported. `None` when the table is unknown; a group
    /// without devices has no rows.
    pub fn group_rollups(
        &self,
        table: &str,
        group: &str,
        level: Level,
        range: TimeRange,
    ) -> Result<Option<Vec<(i64, Record)>>> {
        let mut out = Vec::new();
        let known = self.visit_group_rollups(table, group, level, range, &mut |start, record| {
            out.push((start, record));
            ControlFlow::Continue(())
        })?;
        Ok(known.then_some(out))
    }

    /// The records of [`Store::group_rollups`], handed to `visit` one at a time as
    /// [`Store::visit_rollups`] does. `false` when the table is unknown.
    pub fn visit_group_rollups(
        &self,
        table: &str,
        group: &str,
        level: Level,
        range: TimeRange,
        visit: &mut dyn FnMut(i64, Record) -> ControlFlow<()>,
    ) -> Result<bool> {
        if !group.is_empty() {
            crate::registry::validate_path(group)?;
        }
        let Some(ti) = self.table(table) else {
            return Ok(false);
        };
        self.visit_records(&ti, &Owner::Group(group.to_string()), level, range, visit)?;
        Ok(true)
    }

    /// Number of roll-up records stored for table `table` (of every level, device and group,
    /// whether or not its retention still keeps them: see `ExpiredRollups`), by a scan (for
    /// tests and inspection); `None` when the table is unknown.
    pub fn rollup_records_stored(&self, table: &str) -> Result<Option<usize>> {
        let Some(ti) = self.table(table) else {
            return Ok(None);
        };
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(keys::table_prefix(ti.id).to_vec()));
        let mut n = 0;
        for item in self.db.iterator_cf_opt(cf(&self.db, CF_ROLLUPS), opts, IteratorMode::Start) {
            item.map_err(db_err("scan roll-ups"))?;
            n += 1;
        }
        Ok(Some(n))
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
    fn first_kept_periods_count_from_each_periods_end() {
        // 2024-03-10T05:30Z. A 2-day hour retention: the cutoff is 2024-03-08T05:30Z, inside
        // the hour from 05:00, which ends after it and is the first kept.
        let now = 1_710_048_600_000;
        let r = RollupRetention { hour_ms: Some(2 * DAY_MS as u64), day_ms: Some(20 * DAY_MS as u64) };
        // 2024-03-08T05:00Z.
        assert_eq!(first_kept_period(Level::Hour, r, now), 1_709_874_000_000);
        // Days: the cutoff 2024-02-19T05:30Z is in Feb 19, the first day kept.
        assert_eq!(first_kept_period(Level::Day, r, now), 1_708_300_800_000);
        // February has lost its first days: the first month kept is March (2024-03-01).
        assert_eq!(first_kept_period(Level::Month, r, now), 1_709_251_200_000);
        // With the cutoff on a month's first day, that month is whole and kept.
        let on_first = RollupRetention { day_ms: Some(9 * DAY_MS as u64 + 5 * HOUR_MS as u64), ..r };
        assert_eq!(first_kept_period(Level::Day, on_first, now), 1_709_251_200_000);
        assert_eq!(first_kept_period(Level::Month, on_first, now), 1_709_251_200_000);
        // One hour exactly: the hour that ended at the cutoff has expired.
        let one_hour = RollupRetention { hour_ms: Some(HOUR_MS as u64), day_ms: None };
        assert_eq!(first_kept_period(Level::Hour, one_hour, 10 * HOUR_MS), 9 * HOUR_MS);
        assert_eq!(first_kept_period(Level::Hour, one_hour, 10 * HOUR_MS - 1), 8 * HOUR_MS);
        // Kept forever; the extremes saturate.
        for level in Level::ALL {
            assert_eq!(first_kept_period(level, RollupRetention::FOREVER, now), i64::MIN);
        }
        let longest = RollupRetention { hour_ms: Some(i64::MAX as u64), day_ms: Some(i64::MAX as u64) };
        assert_eq!(first_kept_period(Level::Hour, longest, i64::MIN), Level::Hour.period_start(i64::MIN));
        // Whether an hour may still be rolled up: not once its day's first hour has expired.
        // March 8 has lost its first five hours, March 9 none.
        let keep = RollupKeep { retention: r, floor: RollupFloor::NONE };
        // 2024-03-09T00:00Z, 2024-03-08T23:00Z and March 8, 05:00.
        assert!(keep.may_roll_up(1_709_942_400_000, now));
        assert!(!keep.may_roll_up(1_709_938_800_000, now));
        assert!(!keep.may_roll_up(first_kept_period(Level::Hour, r, now), now));
        // Nor is a day rolled up in the hour before its first hour expires: March 9's first
        // hour expires at March 11, 01:00.
        let march_11 = 1_710_115_200_000;
        assert!(keep.may_roll_up(1_709_942_400_000, march_11 - 1));
        assert!(!keep.may_roll_up(1_709_942_400_000, march_11));
        assert!(RollupKeep::ALL.may_roll_up(i64::MIN / 2, now));
        for level in [Level::Hour, Level::Day] {
            assert_eq!(keep.first_kept(level, now), first_kept_period(level, r, now));
        }
        for level in Level::ALL {
            assert_eq!(RollupKeep::ALL.first_kept(level, now), i64::MIN);
        }
        // A month is shown from the first whole one whose days are kept an hour from now: with
        // March 1 leaving the retention at 00:00 on the 2nd, half an hour away, March is not
        // shown (its first day is no longer written), April is.
        let short = RollupKeep {
            retention: RollupRetention { day_ms: Some(8 * DAY_MS as u64 + 6 * HOUR_MS as u64), ..r },
            ..keep
        };
        assert_eq!(short.first_kept(Level::Day, now), 1_709_251_200_000);
        assert_eq!(short.first_kept(Level::Month, now), 1_711_929_600_000);
        assert_eq!(keep.first_kept(Level::Month, now), first_kept_period(Level::Month, r, now));
    }

    /// A chunk holds the records it computes with their wide sketches packed (QA36 F2: dense,
    /// a chunk of sketches spanning 1e-8 to 1e308 took 1.6 GB), and writes them as dense ones.
    #[test]
    fn a_chunk_holds_wide_sketches_packed_and_writes_them_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let readings: Vec<Reading> = (0..60)
            .map(|i| {
                let v = match i {
                    0 => 1e308,
                    1 => 1e-8,
                    _ => 20.0 + f64::from(i % 17),
                };
                Reading::new(i64::from(i) * 60_000, vec![("v".into(), v), ("w".into(), f64::from(i))])
            })
            .collect();
        let dense = Record::of_readings(&readings);
        let sketch = |r: &Record, field: &str| r.fields[field].quantiles.clone().unwrap();
        assert!(!sketch(&dense, "v").is_packed());
        let mut ov = Overlay { db: &store.db, writes: BTreeMap::new() };
        let key = record_key(1, &Owner::Device(3), Level::Hour, 0);
        ov.put(key.clone(), dense.clone());
        let held = ov.get(&key).unwrap().unwrap();
        assert!(sketch(&held, "v").is_packed());
        assert!(!sketch(&held, "w").is_packed(), "a usual sketch stays as it is");
        assert_eq!(held, dense);
        store.db.write(ov.into_batch(0)).unwrap();
        let stored = store.db.get_cf(cf(&store.db, CF_ROLLUPS), &key).unwrap().unwrap();
        assert_eq!(stored, encode_record(&dense));
        assert_eq!(decode_record(&stored).unwrap(), dense);
    }

    /// A chunk's delta keeps the records with packed sketches apart, as they are, and merges
    /// into a record as merging every record it was given would (QA38 F1).
    #[test]
    fn a_delta_keeps_packed_records_apart_and_merges_as_their_merge() {
        let hour = |device: u64, glitches: &[f64]| {
            let readings: Vec<Reading> = (0..30)
                .map(|i| Reading::new(i64::from(i) * 60_000, vec![("v".into(), 20.0 + f64::from(i % 7))]))
                .chain(glitches.iter().map(|&g| Reading::new(1_800_000, vec![("v".into(), g)])))
                .collect();
            let mut record = Record::default();
            record.merge_member(device, &Record::of_readings(&readings));
            record.pack_wide_sketches();
            record
        };
        let records = [hour(1, &[]), hour(2, &[1e-8, 1e308]), hour(3, &[]), hour(4, &[3.4e38])];
        assert_eq!(records.iter().map(Record::has_packed_sketches).collect::<Vec<_>>(), [false, true, false, true]);
        let mut delta = records[0].delta();
        records[1].add_to(&mut delta);
        let mut other = records[2].delta();
        records[3].add_to(&mut other);
        other.add_to(&mut delta);
        assert_eq!(delta.packed.len(), 2);
        assert!(delta.packed.iter().all(Record::has_packed_sketches));
        assert!(!delta.merged.has_packed_sketches());
        assert_eq!(delta.merged.fields["v"].exact.count(), 60);
        // Into a record: as the merge of them all, and of the record's own.
        let mut into = hour(5, &[]);
        let mut want = into.clone();
        records.iter().for_each(|r| want.merge(r));
        delta.merge_into(&mut into);
        assert_eq!(into, want);
        assert_eq!(into.fields["v"].exact.count(), 153);
        assert_eq!(into.devices.as_ref().map(Distinct::estimate), Some(5));
        // Records each narrow, far apart: their merge is wide, packed and kept apart too.
        let at = |device: u64, v: f64| {
            let mut record = Record::default();
            record.merge_member(device, &Record::of_readings(&[Reading::new(0, vec![("v".into(), v)])]));
            record
        };
        let mut apart = at(6, 1e-5).delta();
        at(7, 2e-5).add_to(&mut apart);
        assert!(apart.packed.is_empty());
        at(8, 1e30).add_to(&mut apart);
        assert_eq!((apart.packed.len(), apart.merged.fields.len()), (1, 0));
        assert!(apart.packed[0].has_packed_sketches());
        at(9, 3.0).add_to(&mut apart);
        let mut all = Record::default();
        [at(6, 1e-5), at(7, 2e-5), at(8, 1e30), at(9, 3.0)].iter().for_each(|r| all.merge(r));
        let mut got = Record::default();
        apart.merge_into(&mut got);
        assert_eq!(got, all);
        // Settled: its packed records merged into one, packed, which merges the same.
        delta.settle();
        assert_eq!(delta.packed.len(), 1);
        assert!(delta.packed[0].has_packed_sketches());
        let mut settled = hour(5, &[]);
        delta.merge_into(&mut settled);
        assert_eq!(settled, want);
    }

    /// A chunk's done marks go in range deletes where [`RANGE_DELETE_MIN_MARKS`] or more lie in a
    /// row of the queue, in point deletes elsewhere; a mark not done, or rewritten since it was
    /// read, stays, and ends the row.
    #[test]
    fn done_marks_in_a_row_of_the_queue_go_in_one_range_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        let dirty = cf(&store.db, CF_DIRTY);
        let mark = |hour: i32, device: u64| DirtyKey { table: 7, hour, device };
        // Hour 1: devices 0-29, generation 5 (device 12 at 6 now); hour 2: devices 0-3.
        let queue: Vec<DirtyKey> = (0..30).map(|d| mark(1, d)).chain((0..4).map(|d| mark(2, d))).collect();
        for &m in &queue {
            let gen: u64 = if m == mark(1, 12) { 6 } else { 5 };
            store.db.put_cf(dirty, m.encode(), gen.to_be_bytes()).unwrap();
        }
        // Done: hour 1 but device 20 (not done) and device 12 (rewritten), a mark that is gone
        // (hour 1, device 40), and hour 2; out of order.
        let mut done: Vec<(DirtyKey, u64)> =
            queue.iter().filter(|m| **m != mark(1, 20)).map(|&m| (m, 5)).chain([(mark(1, 40), 5)]).rev().collect();
        let deletes_before = point_deletes(&store);
        let mut wb = WriteBatch::default();
        let left = store.delete_done_marks(&mut wb, &mut done).unwrap();
        store.db.write(wb).unwrap();
        assert_eq!(left, [mark(1, 12), mark(1, 40)]);
        let stored: Vec<DirtyKey> = store
            .db
            .iterator_cf(dirty, IteratorMode::Start)
            .map(|kv| DirtyKey::decode(&kv.unwrap().0).unwrap())
            .collect();
        assert_eq!(stored, [mark(1, 12), mark(1, 20)]);
        // Rows: devices 0-11 (12 marks: a range), 13-19 (7: point deletes), 21-29 and hour 2
        // (13, the gone mark between them: a range).
        assert_eq!(point_deletes(&store) - deletes_before, 7);
    }

    /// The point deletes in the active memtable of the work queue.
    fn point_deletes(store: &Store) -> u64 {
        let prop = "rocksdb.num-deletes-active-mem-table";
        store.db.property_int_value_cf(cf(&store.db, CF_DIRTY), prop).unwrap().unwrap()
    }

    /// A group's record is the merge of its super-shards, each the merge of its shards:
    /// devices' hours replaced in a few shards recompute those and their super-shards, not the
    /// group from all its devices, and the table's and a group's hour are what all their
    /// devices' hours merge to; a period rolled up before shards existed (none stored) is made
    /// whole at its first recomputation, one before super-shards existed has them made from
    /// its shards.
    #[test]
    fn a_group_recomputed_from_its_shards_is_the_merge_of_its_devices() {
        use model::DeviceReading;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::StoreConfig::default()).unwrap();
        const T: &str = "t";
        // Two super-shards: 34 shards, the table's last two in the second.
        let devices = ((1usize << SUPER_BITS) + 2) << SHARD_BITS;
        let every = |n: u32| (0..n).chain([WHOLE]).collect::<Vec<u32>>();
        let hour = 10 * HOUR_MS;
        // Ids in name order: devices 0 to 1023 in shard 0, and so on; the even ones in site/a.
        for d in 0..devices {
            let place = (d % 2 == 0).then_some("site/a");
            store.set_device(&format!("d{d}"), None, BTreeMap::new(), place).unwrap();
        }
        let mut written: BTreeMap<usize, BTreeMap<i64, f64>> = BTreeMap::new();
        let mut write = |rows: &[(usize, i64, f64)]| {
            let batch = rows
                .iter()
                .map(|&(d, ts, v)| {
                    written.entry(d).or_default().insert(ts, v);
                    DeviceReading {
                        table: T.into(),
                        device: format!("d{d}").into(),
                        reading: Reading::new(ts, vec![("x".into(), v)]),
                    }
                })
                .collect();
            store.write(batch, &[]).unwrap();
            written.clone()
        };
        let rows: Vec<(usize, i64, f64)> = (0..devices)
            .flat_map(|d| [(d, hour + d as i64, d as f64), (d, hour + 1_800_000, 0.5 - d as f64)])
            .collect();
        write(&rows);
        // The clock's reading closes the hour.
        let mut written = write(&[(devices, hour + 2 * HOUR_MS, 0.0)]);
        // Every device but the clock's (`devices`).
        let expected = |written: &BTreeMap<usize, BTreeMap<i64, f64>>, site: bool| {
            let mut out = Record::default();
            for (&d, readings) in written.iter().filter(|(&d, _)| d != devices && (!site || d % 2 == 0)) {
                let readings: Vec<Reading> =
                    readings.iter().map(|(&ts, &v)| Reading::new(ts, vec![("x".into(), v)])).collect();
                out.merge_member(store.device_id(&format!("d{d}")).unwrap(), &Record::of_readings(&readings));
            }
            out
        };
        let group_hour = |group: &str| {
            let range = TimeRange::new(hour, hour + 1).unwrap();
            let rows = store.group_rollups(T, group, Level::Hour, range).unwrap().unwrap();
            assert_eq!(rows.len(), 1);
            rows.into_iter().next().unwrap().1
        };
        let ti = store.table(T).unwrap();
        let parts = |lo: Vec<u8>, hi: Vec<u8>| -> Vec<u32> {
            let mut opts = ReadOptions::default();
            opts.set_iterate_range(lo..hi);
            store
                .db
                .iterator_cf_opt(cf(&store.db, CF_ROLLUPS), opts, IteratorMode::Start)
                .map(|item| GroupShardKey::decode(&item.unwrap().0).unwrap().shard)
                .collect()
        };
        let shards = |group: &str| {
            parts(shard_key(ti.id, group, Level::Hour, hour, 0), shard_key(ti.id, group, Level::Hour, hour + 1, 0))
        };
        let supers = |group: &str| {
            parts(super_key(ti.id, group, Level::Hour, hour, 0), super_key(ti.id, group, Level::Hour, hour + 1, 0))
        };
        let mark = || {
            let whole =
                store.db.get_cf(cf(&store.db, CF_ROLLUPS), shard_key(ti.id, "", Level::Hour, hour, WHOLE)).unwrap();
            whole_of(Some(&decode_record(&whole.unwrap()).unwrap()), &group_hour(""))
        };
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, devices);
        assert_eq!((group_hour(""), group_hour("site/a")), (expected(&written, false), expected(&written, true)));
        assert_eq!((shards(""), shards("site/a")), (every(34), every(34)));
        // The first hour's merges leave every super-shard stale.
        assert_eq!((supers(""), supers("site/a")), (vec![0, 1], vec![0, 1]));
        assert_eq!(mark(), Whole::Supers);

        // A rewrite in shard 0 (site/a's), a new reading in shard 2 (not site/a's).
        written = write(&[(4, hour + 4, 1_000.0), (2_501, hour + 2_000_000, -7.25)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 2);
        assert_eq!(group_hour(""), expected(&written, false));
        assert_eq!(group_hour("site/a"), expected(&written, true));
        assert_eq!(group_hour("").fields["x"].exact.count(), 2 * devices as u64 + 1);

        // A device's first hour, in the second super-shard, merged in; then a late reading in
        // the first: the second, stale, is made again from its shards.
        let newcomer = devices + 1;
        store.set_device(&format!("d{newcomer}"), None, BTreeMap::new(), None).unwrap();
        written = write(&[(newcomer, hour + 7, 77.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!(group_hour(""), expected(&written, false));
        written = write(&[(6, hour + 6, -6.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!(group_hour(""), expected(&written, false));
        assert_eq!(group_hour("").fields["x"].exact.count(), 2 * devices as u64 + 2);

        // A release before the super-shards (a rollback, and forward again): it recomputes the
        // shard of a late reading of d33,000 (the second super-shard) and the table's hour from
        // the shards, not the super-shard, and writes its mark. As if that was done here and
        // the super-shards set back after: the next recomputation (of the first super-shard)
        // makes them all from the shards.
        let (lo, hi) = (super_key(ti.id, "", Level::Hour, hour, 0), super_key(ti.id, "", Level::Hour, hour + 1, 0));
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(lo..hi);
        let before: Vec<_> = store
            .db
            .iterator_cf_opt(cf(&store.db, CF_ROLLUPS), opts, IteratorMode::Start)
            .map(|i| i.unwrap())
            .collect();
        write(&[(33_000, hour + 33, 330.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        for (k, v) in &before {
            store.db.put_cf(cf(&store.db, CF_ROLLUPS), k, v).unwrap();
        }
        let old_mark = encode_record(&whole_mark(&group_hour(""), Whole::Shards));
        store.db.put_cf(cf(&store.db, CF_ROLLUPS), shard_key(ti.id, "", Level::Hour, hour, WHOLE), old_mark).unwrap();
        assert_eq!(mark(), Whole::Shards);
        written = write(&[(8, hour + 8, 8.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!(group_hour(""), expected(&written, false));
        assert_eq!(mark(), Whole::Supers);

        // The table's hour as a store before shards left it: none. Its next recomputation makes
        // them all.
        let (lo, hi) = (shard_key(ti.id, "", Level::Hour, hour, 0), shard_key(ti.id, "", Level::Hour, hour + 1, 0));
        store.db.delete_range_cf(cf(&store.db, CF_ROLLUPS), lo, hi).unwrap();
        assert_eq!(shards(""), Vec::<u32>::new());
        written = write(&[(1_500, hour + 1_500, 3.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!(group_hour(""), expected(&written, false));
        assert_eq!((shards(""), supers("")), (every(35), vec![0, 1]));
        written = write(&[(10, hour + 10, 4.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!((group_hour(""), group_hour("site/a")), (expected(&written, false), expected(&written, true)));

        // A release before the shards (a rollback, and forward again) changes the table's hour
        // and not its shards: as if d20's late reading (shard 0) had been rolled up by it, its
        // shards and mark set back after. A late reading of shard 2 has them all made again.
        let range = || {
            let mut opts = ReadOptions::default();
            opts.set_iterate_range(
                shard_key(ti.id, "", Level::Hour, hour, 0)..shard_key(ti.id, "", Level::Hour, hour + 1, 0),
            );
            opts
        };
        let before = store
            .db
            .iterator_cf_opt(cf(&store.db, CF_ROLLUPS), range(), IteratorMode::Start)
            .map(|i| i.unwrap())
            .collect::<Vec<_>>();
        written = write(&[(20, hour + 20, 100.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        for (k, v) in &before {
            store.db.put_cf(cf(&store.db, CF_ROLLUPS), k, v).unwrap();
        }
        assert_eq!(group_hour(""), expected(&written, false));
        written = write(&[(2_100, hour + 2_100, 6.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        assert_eq!(group_hour(""), expected(&written, false));

        // Two devices of shards 0 and 1 moved into site/b, which has no record of the hour: a
        // late reading of one makes site/b's hour from all its devices, the other's too.
        for d in [1, 1_025] {
            store.set_device(&format!("d{d}"), None, BTreeMap::new(), Some("site/b")).unwrap();
        }
        written = write(&[(1, hour + 1_000, 5.0)]);
        assert_eq!(store.process_rollups(0, usize::MAX).unwrap().hours, 1);
        let mut moved = Record::default();
        for d in [1, 1_025] {
            let readings: Vec<Reading> =
                written[&d].iter().map(|(&ts, &v)| Reading::new(ts, vec![("x".into(), v)])).collect();
            moved.merge_member(store.device_id(&format!("d{d}")).unwrap(), &Record::of_readings(&readings));
        }
        assert_eq!(group_hour("site/b"), moved);
        assert_eq!((shards("site/b"), supers("site/b")), (vec![0, 1, WHOLE], vec![0]));
        // Their parent `site` (17,410 devices) has its shard 0 made again from the devices
        // under it now, found from the shard's device records (a few shards of a large group,
        // `members_by_records`): d1 counts in it, d1,025 (shard 1, not recomputed) not yet.
        let mut site = expected(&written, true);
        let d1: Vec<Reading> = written[&1].iter().map(|(&ts, &v)| Reading::new(ts, vec![("x".into(), v)])).collect();
        site.merge_member(store.device_id("d1").unwrap(), &Record::of_readings(&d1));
        assert_eq!(group_hour("site"), site);
    }

    #[test]
    fn a_floor_keeps_hidden_what_a_retention_hid_before_it_was_lengthened() {
        let now = 1_710_048_600_000; // 2024-03-10T05:30Z
        let short = RollupRetention { hour_ms: Some(2 * DAY_MS as u64), day_ms: Some(20 * DAY_MS as u64) };
        // Lengthened now: the floor is what the 2 and 20 days kept and passes still wrote (from
        // 06:00: 05:00 leaves within the hour).
        let long = RollupRetention { hour_ms: Some(30 * DAY_MS as u64), day_ms: Some(60 * DAY_MS as u64) };
        let floor = RollupKeep { retention: short, floor: RollupFloor::NONE }.floor_after(long, now);
        assert_eq!(floor, RollupFloor { hour_ms: 1_709_877_600_000, day_ms: 1_708_300_800_000 });
        // Set to the same or a shorter one, no floor is needed.
        assert_eq!(
            RollupKeep { retention: short, floor: RollupFloor::NONE }.floor_after(short, now),
            RollupFloor::NONE
        );
        let kept = RollupKeep { retention: long, floor };
        // A week later, the longer retention still keeps only what the floor does (March 8,
        // 06:00; February 19; March, the first whole month) ...
        let week = now + 7 * DAY_MS;
        assert_eq!(kept.first_kept(Level::Hour, week), 1_709_877_600_000);
        assert_eq!(kept.first_kept(Level::Day, week), 1_708_300_800_000);
        assert_eq!(kept.first_kept(Level::Month, week), 1_709_251_200_000);
        // ... and once its own cutoff passes the floor, what it says: 30 days after April 10,
        // 05:30 is March 11, 05:30.
        let april_10 = now + 31 * DAY_MS;
        // 2024-03-11T05:00Z; the days still from the floor.
        assert_eq!(kept.first_kept(Level::Hour, april_10), 1_710_133_200_000);
        assert_eq!(kept.first_kept(Level::Day, april_10), 1_708_300_800_000);
        // Set to forever then, the hours are kept from the 30 days' cutoff, the days from the
        // floor; set to the 2 and 20 days, no floor is left (they keep less than both).
        let forever = RollupKeep { retention: RollupRetention::FOREVER, floor };
        assert_eq!(forever.first_kept(Level::Hour, april_10), floor.hour_ms);
        let after = kept.floor_after(RollupRetention::FOREVER, april_10);
        assert_eq!(after, RollupFloor { hour_ms: 1_710_136_800_000, day_ms: floor.day_ms });
        assert_eq!(
            RollupKeep { retention: RollupRetention::FOREVER, floor: after }
                .floor_after(RollupRetention::FOREVER, april_10),
            after
        );
        assert_eq!(kept.floor_after(short, april_10), RollupFloor::NONE);
        // QA34 F8: the 2 days removed now (05:30), so the hours are kept forever from the floor
        // of 06:00 (05:00 leaves the 2 days within the hour: hidden at once); the 2 days set again
        // within the hour: 05:00, which the 2 days alone still show until 06:00, stays hidden
        // (the floor stays; before, the two started at 06:00 an hour from now, and it was dropped).
        let plain = RollupKeep { retention: short, floor: RollupFloor::NONE };
        let removed =
            RollupKeep { retention: RollupRetention::FOREVER, floor: plain.floor_after(RollupRetention::FOREVER, now) };
        assert_eq!(removed.floor.hour_ms, 1_709_877_600_000);
        assert_eq!(removed.first_kept(Level::Hour, now), 1_709_877_600_000);
        assert_eq!(plain.first_kept(Level::Hour, now), 1_709_877_600_000 - HOUR_MS);
        let again = RollupKeep { retention: short, floor: removed.floor_after(short, now + 60_000) };
        assert_eq!(again.floor.hour_ms, 1_709_877_600_000);
        assert_eq!(again.first_kept(Level::Hour, now + 60_000), 1_709_877_600_000);
        // And once the retention's own cutoff passes the floor, the floor is dropped as before.
        assert_eq!(again.floor_after(short, now + 2 * HOUR_MS).hour_ms, i64::MIN);
        // A retention kept everything an hour key can hold: hid nothing, no floor (it was set at
        // some 292 million years ago).
        let huge = RollupRetention { hour_ms: Some(i64::MAX as u64), day_ms: Some(i64::MAX as u64) };
        let hour_only = RollupRetention { hour_ms: Some(HOUR_MS as u64), day_ms: None };
        assert_eq!(
            RollupKeep { retention: huge, floor: RollupFloor::NONE }.floor_after(hour_only, now),
            RollupFloor::NONE
        );
        // Hours of a day before the floor's are not rolled up; of the floor's day, not either
        // (its first hours are gone); of the day after, yes.
        // March 8, 10:00 and March 9, 00:00.
        assert!(!kept.may_roll_up(1_709_856_000_000 + 10 * HOUR_MS, week));
        assert!(kept.may_roll_up(1_709_942_400_000, week));
        // The catalog value.
        assert_eq!(RollupFloor::decode(&floor.encode()), Some(floor));
        assert_eq!(RollupFloor::decode(&RollupFloor::NONE.encode()), Some(RollupFloor::NONE));
        assert_eq!(&floor.encode()[..8], &1_709_877_600_000_i64.to_be_bytes());
        assert_eq!(RollupFloor::decode(&[0; 15]), None);
    }

    #[test]
    fn the_compaction_filter_drops_expired_hours_and_days_of_tables_with_a_retention() {
        let now = 1_710_048_600_000; // 2024-03-10T05:30Z
        let retentions = RollupRetentions::default();
        let retention = RollupRetention { hour_ms: Some(2 * DAY_MS as u64), day_ms: Some(20 * DAY_MS as u64) };
        retentions.set(7, RollupKeep { retention, floor: RollupFloor::NONE });
        retentions.set(8, RollupKeep::ALL);
        // A table kept forever with a floor drops what is before its floor.
        retentions
            .set(9, RollupKeep { retention: RollupRetention::FOREVER, floor: RollupFloor { hour_ms: 0, day_ms: 0 } });
        let filter = ExpiredRollupsFilter { cutoffs: retentions.cutoffs(now) };
        assert_eq!((HOUR_CODE, DAY_CODE), (keys::rollup_level_code(Level::Hour), keys::rollup_level_code(Level::Day)));
        let first_hour = 1_709_874_000_000;
        let first_day = 1_708_300_800_000;
        let device = |table: u32, level: u8, start: i64| RollupKey { table, level, device: 3, start }.encode().to_vec();
        let group =
            |level: u8, path: &'static str, start: i64| GroupRollupKey { table: 7, level, path, start }.encode();
        let old = i64::MIN / 2;
        let cases: [(Vec<u8>, bool); 15] = [
            (device(7, 0, first_hour - HOUR_MS), true),
            (device(7, 0, first_hour), false),
            (device(7, 1, first_day - DAY_MS), true),
            (device(7, 1, first_day), false),
            // Months are never dropped (nothing reads them); nor is anything of table 8; of table 9,
            // what is before its floor.
            (device(7, 2, old), false),
            (device(8, 0, old), false),
            (device(9, 1, -DAY_MS), true),
            (device(9, 1, 0), false),
            (group(0, "", first_hour - 1), true),
            (group(0, "site/a", first_hour), false),
            (group(1, "site/a", first_day - 1), true),
            (group(1, "", first_day), false),
            (group(2, "site", old), false),
            // What is not a roll-up key is kept.
            (vec![0, 0, 0, 7, 0], false),
            (vec![0, 0], false),
        ];
        for (key, expired) in cases {
            assert_eq!(filter.expired(&key), expired, "{key:?}");
        }
        // A table's retention set back to forever is forgotten.
        retentions.set(7, RollupKeep::ALL);
        retentions.set(9, RollupKeep::ALL);
        assert!(retentions.cutoffs(now).is_empty());
    }

    fn record(points: &[(&str, i64, f64)]) -> Record {
        let readings: Vec<Reading> =
            points.iter().map(|&(name, ts, v)| Reading::new(ts, vec![(name.into(), v)])).collect();
        Record::of_readings(&readings)
    }

    #[test]
    fn records_round_trip_bit_for_bit() {
        let mut r = record(&[
            ("temp", 5, 0.1),
            ("temp", 3, 0.2),
            ("temp", 9, -0.0),
            ("rpm", 5, 1e100),
            ("rpm", 6, 1.0),
            ("rpm", 7, -1e100),
            ("odd", 1, f64::INFINITY),
            ("odd", 2, 3.0),
        ]);
        let bytes = encode_record(&r);
        assert_eq!(bytes[0], 6);
        let back = decode_record(&bytes).unwrap();
        assert_eq!(back, r);
        // Versions 2 (plain sketch bytes), 3 and 5 are still read, to the same record.
        let v2 = encode_record_as(&r, RECORD_V2).unwrap();
        let v3 = encode_record_as(&r, RECORD_V3).unwrap();
        let v5 = encode_record_as(&r, RECORD_V5).unwrap();
        assert_eq!((v2[0], v3[0], v5[0]), (2, 3, 5));
        assert_eq!(decode_record(&v2).unwrap(), r);
        assert_eq!(decode_record(&v3).unwrap(), r);
        assert_eq!(decode_record(&v5).unwrap(), r);
        let sizes = [bytes.len(), v5.len(), v3.len(), v2.len()];
        assert!(sizes.is_sorted() && sizes[0] < sizes[1], "{sizes:?}");
        assert_eq!(back.fields["rpm"].exact.sum(), 1.0);
        assert_eq!(back.fields["odd"].exact.sum(), f64::INFINITY);
        assert_eq!(back.fields["odd"].quantiles.as_ref().unwrap().count(), 1, "infinity is not sketched");
        // The sum stays exact when merged after the round trip: 0.1 + 0.2 + 0.3 is 0.6.
        let mut t = back.fields["temp"].clone();
        t.merge(&FieldAgg::of(10, 0.3));
        assert_eq!(t.exact.sum(), 0.6);
        // With the devices that reported (a group's record).
        r.merge_member(4, &record(&[("temp", 11, 1.5)]));
        r.merge_member(5, &record(&[("temp", 12, 2.5)]));
        let back = decode_record(&encode_record(&r)).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.devices.as_ref().unwrap().estimate(), 2);
        assert_eq!(decode_record(&encode_record_as(&r, RECORD_V2).unwrap()).unwrap(), r);
        assert_eq!(decode_record(&encode_record_as(&r, RECORD_V5).unwrap()).unwrap(), r);
        assert_eq!(decode_record(&[]), Err("truncated: 1 more bytes wanted, 0 left".into()));
        assert_eq!(decode_record(&[7]), Err("unknown record version 7 (a newer release's, or damaged)".into()));
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode_record(&longer), Err("1 bytes after the last field".into()));
    }

    /// A record of 65,536 fields (a table whose devices brought that many names in an hour) is
    /// written with a three-byte varint count and read back whole; version 4, which held it
    /// before version 5 (version 3's `u16` counts cannot), is still read.
    #[test]
    fn a_record_of_more_fields_than_u16_counts_round_trips() {
        let mut wide = Record::default();
        for i in 0..65_536 {
            wide.fields.insert(format!("f{i}").into(), FieldAgg::of(10, f64::from(i)));
        }
        let bytes = encode_record(&wide);
        assert_eq!(bytes[..4], [6, 0x80, 0x80, 0x04]);
        let back = decode_record(&bytes).unwrap();
        assert_eq!(back.fields.len(), 65_536);
        assert_eq!(back, wide);
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());
        assert!(encode_record_as(&wide, RECORD_V3).is_none());
        let v4 = encode_record_as(&wide, RECORD_V4).unwrap();
        assert_eq!((v4[0], &v4[1..5]), (4, &65_536u32.to_be_bytes()[..]));
        assert_eq!(decode_record(&v4).unwrap(), wide);
    }

    /// A field with one point in the period is written as its time and value, and read back
    /// as the aggregates of that point, sketch included; any other field is written whole.
    #[test]
    fn a_field_of_one_point_is_its_time_and_value() {
        let one = record(&[("t", 10, 1.5)]);
        // Version 6, one field, the base time 10 (zigzag 20), "t" of form 1 at the base.
        let mut want = vec![6, 1, 20, 1, b't', 1, 0];
        want.extend_from_slice(&1.5f64.to_be_bytes());
        want.push(0); // no devices
        assert_eq!(encode_record(&one), want);
        // Awkward values: signed zero, non-finite (counted, not sketched), below the sketch's
        // least magnitude (sketched as zero); beside a field of two points and one of 300
        // (its sketch past 127 bytes: a two-byte length).
        let mut points = vec![("a", 7, -0.0), ("b", 8, f64::NAN), ("c", 9, f64::NEG_INFINITY), ("d", 1, 1e-12)];
        points.extend([("e", 2, 4.0), ("e", 3, 4.0)]);
        points.extend((0..300).map(|i| ("f", i, 1.07f64.powi(i as i32))));
        let r = record(&points);
        let bytes = encode_record(&r);
        let back = decode_record(&bytes).unwrap();
        assert_eq!(back, r);
        for name in ["a", "b", "c", "d"] {
            let bits = |p: (i64, f64)| (p.0, p.1.to_bits());
            assert_eq!(one_point(&r.fields[name]).map(bits), Some(bits(r.fields[name].exact.first())), "{name}");
            assert_eq!(back.fields[name].exact.first().1.to_bits(), r.fields[name].exact.first().1.to_bits());
        }
        assert_eq!(one_point(&r.fields["e"]), None);
        let mut sketch = Vec::new();
        r.fields["f"].quantiles.as_ref().unwrap().write_compact(&mut sketch);
        assert!(sketch.len() >= 128, "{}", sketch.len());
        assert_eq!(back.fields["f"].quantiles, r.fields["f"].quantiles);
        // A point without a sketch (a version 1 record's field) stays without one.
        let mut bare = one.clone();
        bare.fields.get_mut("t").unwrap().quantiles = None;
        let bytes = encode_record(&bare);
        assert_eq!(bytes[5], FORM_WHOLE);
        assert_eq!(decode_record(&bytes).unwrap().fields["t"].quantiles, None);
        // An hour of one reading of the TSBS `readings` table's seven fields: 145 bytes (version
        // 5 took 191, its times `i64`s; version 3 982, written here 996: its compact sketches'
        // stores say today's bin limit, 36,608, a varint a byte longer than the 2,048 then).
        let names = ["latitude", "longitude", "elevation", "velocity", "heading", "grade", "fuel_consumption"];
        let hour: Vec<(&str, i64, f64)> =
            names.iter().zip(1..).map(|(n, i)| (*n, 60_000, f64::from(i) * 13.7)).collect();
        let hour = record(&hour);
        assert_eq!(encode_record(&hour).len(), 145);
        assert_eq!(encode_record_as(&hour, RECORD_V5).unwrap().len(), 191);
        assert_eq!(encode_record_as(&hour, RECORD_V3).unwrap().len(), 996);
        let mut bad = want.clone();
        bad[5] = 2;
        assert_eq!(decode_record(&bad), Err("field `t` of unknown form 2".into()));
    }

    /// Times are written after the record's earliest, any two `i64`s apart.
    #[test]
    fn times_are_distances_from_the_records_earliest() {
        let r = record(&[
            ("a", i64::MAX, 1.0),
            ("b", i64::MIN, 2.0),
            ("c", -315_619_200_000, 3.0), // 1960
            ("c", i64::MAX, 4.0),
            ("d", 1_704_067_200_000, 5.0),
            ("d", 1_704_067_260_000, -0.0),
        ]);
        let bytes = encode_record(&r);
        assert_eq!(decode_record(&bytes).unwrap(), r);
        // The base, i64::MIN, zigzags to u64::MAX: ten bytes.
        assert_eq!(bytes[2..12], [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let t = &decode_record(&bytes).unwrap().fields["c"];
        assert_eq!((t.exact.first(), t.exact.last()), ((-315_619_200_000, 3.0), (i64::MAX, 4.0)));
        assert_eq!(decode_record(&encode_record_as(&r, RECORD_V5).unwrap()).unwrap(), r);
        // An hour of a device reporting every minute: its first one byte (0) past the base, its
        // last a varint of 3,540,000 (four bytes) after its first.
        let hour: Vec<(&str, i64, f64)> = (0..60).map(|i| ("t", 1_704_067_200_000 + i * 60_000, 1.0)).collect();
        let bytes = encode_record(&record(&hour));
        let mut tail = vec![0];
        tail.extend_from_slice(&1.0f64.to_be_bytes());
        varint::put(&mut tail, 3_540_000);
        assert_eq!(tail.len(), 13);
        assert!(bytes.windows(tail.len()).any(|w| w == tail));
    }

    /// A field written whole carries its sketch packed, without the min and max the record
    /// holds: an hour of 60 readings of the TSBS `readings` table's seven fields, each a walk.
    #[test]
    fn whole_fields_carry_their_sketches_packed() {
        let names = ["latitude", "longitude", "elevation", "velocity", "heading", "grade", "fuel_consumption"];
        let mut points = Vec::new();
        for (f, name) in names.iter().enumerate() {
            let mut x = 10.0 * f as f64 + 1.0;
            for i in 0..60i64 {
                x += ((i * 7 + f as i64 * 3) % 11 - 5) as f64 * 0.37;
                points.push((*name, i * 60_000, x));
            }
        }
        let hour = record(&points);
        let v6 = encode_record(&hour);
        let v5 = encode_record_as(&hour, RECORD_V5).unwrap();
        assert_eq!(decode_record(&v6).unwrap(), hour);
        assert_eq!(decode_record(&v5).unwrap(), hour);
        // Version 5 took 1,005 bytes; written here 1,019, its compact sketches' stores saying
        // today's bin limit (a byte longer each).
        assert_eq!((v6.len(), v5.len()), (585, 1019));
        // The sketch's bytes are its packed form, given the field's min and max.
        let lat = &hour.fields["latitude"];
        let mut packed = Vec::new();
        lat.quantiles.as_ref().unwrap().write_packed(lat.exact.min(), lat.exact.max(), &mut packed);
        assert!(v6.windows(packed.len()).any(|w| w == packed));
        assert_eq!(packed[0] & 8, 0, "min and max left out");
    }

    #[test]
    fn cursors_read_varints_and_stop_at_64_bits() {
        let mut v = Vec::new();
        varint::put(&mut v, 300);
        v.push(7);
        let mut c = Cursor(&v);
        assert_eq!((c.varint(), c.0), (Ok(300), &[7][..]));
        let past = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(Cursor(&past).varint(), Err("a varint past 64 bits".into()));
        assert_eq!(Cursor(&[0x80]).varint(), Err("truncated: a varint without its last byte".into()));
    }

    #[test]
    fn version_1_records_are_read_without_sketches() {
        // u8 1 · 1 field "t" · count 2 · min 1 · max 3 · first (10, 1) · last (20, 3) · sum 4.
        let mut v = vec![1, 0, 1, 0, 1, b't'];
        v.extend_from_slice(&2u64.to_be_bytes());
        for x in [1.0f64, 3.0] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        for (ts, x) in [(10i64, 1.0f64), (20, 3.0)] {
            v.extend_from_slice(&ts.to_be_bytes());
            v.extend_from_slice(&x.to_be_bytes());
        }
        v.extend_from_slice(&1u16.to_be_bytes());
        v.extend_from_slice(&4.0f64.to_be_bytes());
        let r = decode_record(&v).unwrap();
        let t = &r.fields["t"];
        assert_eq!((t.exact.count(), t.exact.sum(), t.exact.min(), t.exact.max()), (2, 4.0, 1.0, 3.0));
        assert_eq!((t.exact.first(), t.exact.last()), ((10, 1.0), (20, 3.0)));
        assert!(t.quantiles.is_none());
        assert!(r.devices.is_none());
    }

    #[test]
    fn month_ends_are_the_next_month_start() {
        let jan = Level::Month.period_start(1_704_153_000_000);
        let feb = period_end(Level::Month, jan);
        assert_eq!(feb - jan, 31 * DAY_MS);
        assert_eq!(period_end(Level::Month, feb) - feb, 29 * DAY_MS); // 2024 is a leap year
        assert_eq!(period_end(Level::Day, jan), jan + DAY_MS);
    }

    #[test]
    fn keys_of_both_kinds_give_their_period_start() {
        let d = record_key(3, &Owner::Device(9), Level::Day, -DAY_MS);
        let g = record_key(3, &Owner::Group("site/a".into()), Level::Month, 86_400_000);
        let t = record_key(3, &Owner::Group(String::new()), Level::Hour, 7);
        assert_eq!(d.len(), keys::ROLLUP_KEY_LEN);
        assert_eq!((key_start(&d).unwrap(), key_start(&g).unwrap(), key_start(&t).unwrap()), (-DAY_MS, 86_400_000, 7));
    }

    proptest! {
        /// Any record survives encode → decode, and merging decoded parts equals the whole.
        #[test]
        fn decoded_parts_merge_to_the_whole(points in prop::collection::vec((0i64..100, -1e6f64..1e6, 0usize..3), 1..60)) {
            let names = ["a", "b", "c"];
            let all: Vec<(&str, i64, f64)> = points.iter().map(|&(ts, v, f)| (names[f], ts, v)).collect();
            let whole = record(&all);
            let halves: Vec<Vec<(&str, i64, f64)>> = (0..2).map(|h| all.iter().enumerate().filter(|(i, _)| i % 2 == h).map(|(_, p)| *p).collect()).collect();
            let mut merged = Record::default();
            for h in &halves {
                merged.merge(&decode_record(&encode_record(&record(h))).unwrap());
            }
            prop_assert_eq!(&merged, &whole);
            prop_assert_eq!(decode_record(&encode_record(&whole)).unwrap(), whole);
        }
    }
}
