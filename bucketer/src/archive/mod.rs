//! The archive tier: partitions past their table's hot retention, as plain Parquet files.
//!
//! # Layout
//!
//! Under the archive root — a local directory, or a prefix in an S3-compatible bucket (see
//! `object`: files are staged and cached in the local directory) — one file per archived partition of a table,
//! Hive-style: `table=NAME/partition=LABEL/part-N.parquet`. `NAME` is the table name with every
//! byte outside `[A-Za-z0-9._-]` written `%XX` (so `/` cannot nest directories); `LABEL` is the
//! partition's start in UTC — `2024-01-31T05` for an hour, `2024-01-31` for a day, `2024-01`
//! for a month. `N` counts the rewrites of that partition from 0: when late readings arrive
//! for an archived partition they are stored in RocksDB like any other (read with the file as
//! one timeline), and a later spill merges them with the file into `part-(N+1)` (a reading at
//! the time of an archived one replaces it, as in RocksDB) and drops the older file: the first
//! run [`ArchiveConfig::late_rewrite_wait`] after the run that found them, or the first that
//! finds them holding 1/[`LATE_REWRITE_SHARE`] of the file's bytes, whichever comes first (a
//! rewrite reads and writes the whole partition; the first run's time is kept in the `catalog`
//! column family, [`crate::keys::archive_late_key`], so a restart does not start the wait
//! again). The columns are in [`mod@file`]. Any
//! Parquet reader reads these files; DuckDB's and pyarrow's Hive partitioning turn the two
//! directory levels into `table` and `partition` columns.
//!
//! # Manifest
//!
//! Which file holds each archived partition is recorded in the `archive` column family, key
//! [`crate::keys::archive_key`] (table u32 · partition i32⊕) → entry, version 1, 37 bytes:
//! `1` u8 · part N u32 BE · rows u64 BE · file bytes u64 BE · smallest time i64 BE · largest
//! time i64 BE. The manifest is loaded at open and kept in memory. A file in the archive root
//! that the manifest does not name is a leftover of an interrupted spill or a superseded part,
//! and is deleted when the store opens and before each spill run (in a bucket, only the part
//! objects right under the prefix, `table=…/partition=…/part-N.parquet`: another store's
//! prefix nested in this one is left alone).
//!
//! # Owner
//!
//! A local archive root belongs to one store: the file [`OWNER_FILE`] in it names the store's
//! RocksDB directory (canonical path), written when a store first opens with the root. A store
//! that finds another's name there does not open: it would delete the files the other's
//! manifest names as leftovers, and write its own parts over the other's (a checkpoint restored
//! with the live store's `archive_dir`, or a new store pointed at an existing archive). A root
//! no store has claimed yet is claimed unless it holds part files while this store's manifest
//! is empty (an archive of another store made before the owner file). A store moved to another
//! directory is refused until its old name is deleted from the file. Beside it, the file
//! [`OWNER_ID_FILE`] names the store's id ([`STORE_ID_FILE`], below), written with the owner
//! file or at the first open of a build that knows it: a store with the owner's path but
//! another id — a checkpoint restored in place of the store, with its `archive_dir`, or a
//! store made anew where the owner's RocksDB directory was — does not open either (its older
//! or empty manifest would have it delete the live store's newer parts, or all of them, as
//! leftovers, and read parts those replaced), until that file is deleted. At a root without
//! the id file, a store whose manifest is empty is refused if the root holds part files, as at
//! a root without an owner. A cold copy of the RocksDB directory has the id: it is told apart
//! by the generation, below.
//!
//! A bucket prefix (`archive_url`) belongs to one store likewise: the object [`OWNER_FILE`]
//! under it names the store's id ([`STORE_ID_FILE`] in its RocksDB directory, random, made at
//! the first need, and not copied by a RocksDB checkpoint). Each spill run checks it first (the
//! open does not touch the bucket, so an unreachable object store does not stop the store from
//! opening): another id there fails the run, which deletes and uploads nothing;
//! no object claims the prefix unless it holds part objects while this store's manifest is
//! empty. The owner file and object are made only where none is (a hard link; a conditional
//! put), so of two stores claiming one root or prefix at the same moment one wins. A checkpoint restored beside the live store with the same `archive_url` is so
//! refused, where it would have deleted the live store's newer objects; one restored in its
//! place is refused too, until the owner object is deleted (a restore is a decision the store
//! cannot tell from the mistake).
//!
//! # Generation
//!
//! Each commit that changes the manifest (a spill, a rewrite, a cold delete) puts the next
//! generation, a counter, into the `catalog` column family in the commit's WriteBatch
//! ([`crate::keys::ARCHIVE_GENERATION_KEY`]), and once it is written the same number into the
//! local archive root's [`GENERATION_FILE`] (replaced by a rename). A store whose generation is
//! below the root's does not open: its RocksDB directory is an older copy of the store that
//! wrote the root (a copy of a stopped store, `cp -a`, restored in place with an archive
//! directory outside it), whose manifest names files replaced since, and which would delete the
//! files written since as leftovers — the one restore the owner's path and id cannot tell. A
//! crash between the commit and the file leaves the file behind the store, every file the
//! manifest names in place (each is written before its commit): the next open brings it up, as
//! it writes it at a root without one. A root behind the store that lacks files the manifest
//! names is an archive restored from an older copy than the store: refused too (the store would
//! delete its older files, the only copies of the partitions rewritten since). Each commit also
//! draws a random tag, kept with the count (16 bytes; the file says `COUNT TAG`): a root at the
//! store's count with another tag was changed by another run from a common copy (a copy
//! restored and run, then the other put back), and is refused as well. An owner's id file deleted to have a
//! store take the root over (a checkpoint restored in place) takes the file with it: the
//! claiming store writes its own generation. A bucket prefix has the object
//! [`GENERATION_FILE`] likewise, checked with the owner object at each spill run (a store at a
//! generation below it fails the run, deleting and uploading nothing) and claimed with it.
//!
//! # Spilling a partition, and crash safety
//!
//! 1. Writers that would write into the partition wait until its spill ends (late data for a
//!    partition past its hot retention is rare; other writes go on).
//! 2. The partition's readings, merged with the partition's current file if it has one, are
//!    written to `part-N.parquet.tmp`, which is fsynced, renamed to `part-N.parquet`, and its
//!    directory fsynced (in a bucket: uploaded as `part-N.parquet`, the local file removed).
//! 3. Readers are pointed at the new file (they merge it with RocksDB, which still holds the
//!    same readings, so answers do not change).
//! 4. One WriteBatch (WAL synced) records the manifest entry and range-deletes the partition
//!    from `buckets`.
//! 5. Still before the writers go on, the SST files wholly inside the partition's range are
//!    dropped and the range delete is written again (`Store::free_deleted_ranges`): the disk is
//!    freed now rather than when a compaction reaches those files. A crash within this step
//!    leaves at worst copies of archived readings in RocksDB, merged as late data by the next
//!    spill.
//!
//! A crash before 4 leaves the readings in RocksDB and the manifest as it was: the new file is
//! unknown to the manifest, deleted at the next open, and the spill is redone. A crash after 4
//! leaves the readings in the file only, and the older part (if any) unknown to the manifest.
//! Either way nothing is lost and nothing is there twice. Roll-ups stay in RocksDB; a
//! recomputation of an archived hour (late data) reads the file and RocksDB together.
//!
//! # Cold retention
//!
//! A partition whose end is at or before `now - cold retention` is deleted: the manifest entry
//! and any readings RocksDB holds for it in one WriteBatch, then the file.

pub mod file;
pub(crate) mod object;

pub use object::{S3Archive, STOPPING};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use model::{PartitionSize, Reading, TimeRange};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::catalog::{first_kept_partition, TableInfo};
use crate::codec;
use crate::keys::{self, BucketKey};
use crate::store::{cf, CF_ARCHIVE, CF_BUCKETS, CF_CATALOG, CF_REGISTRY};
use crate::{db_err, read, write, Error, Result, Store};

pub use file::FileSettings;

/// Where and how partitions are archived.
#[derive(Debug, Clone)]
pub struct ArchiveConfig {
    /// The archive root directory (created if missing). With [`ArchiveConfig::object_store`],
    /// the local staging and cache directory of the files, whose home is the bucket.
    pub root: PathBuf,
    /// An S3-compatible bucket to keep the files in instead of `root`.
    pub object_store: Option<S3Archive>,
    /// Parquet file settings.
    pub file: FileSettings,
    /// How long after a failed request to the bucket roll-up passes read no archived hour
    /// before a probe asks it again ([`ARCHIVE_FAILURE_QUIET`] by default).
    pub failure_quiet: std::time::Duration,
    /// How long late readings for an archived partition may wait in RocksDB, from the first
    /// run that finds them, before a run merges them into a new part file
    /// ([`LATE_REWRITE_WAIT`] by default; zero: at the next run). Sooner once they reach
    /// 1/[`LATE_REWRITE_SHARE`] of the file's bytes. Reads see them either way: queries and
    /// roll-ups read the archive and RocksDB as one timeline.
    pub late_rewrite_wait: std::time::Duration,
    /// Test hook: abort the process at this step of a spill, as `kill -9` would stop it.
    #[doc(hidden)]
    pub abort_at: Option<SpillStep>,
}

/// [`ArchiveConfig::late_rewrite_wait`] by default: a day. An archived partition is rewritten
/// whole to take in late readings, which at thousands of devices a day partition makes a large
/// job: a trickle of late readings (devices back online after days) would otherwise have every
/// run rewrite it.
pub const LATE_REWRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Late readings for an archived partition that hold at least 1/`LATE_REWRITE_SHARE` of its
/// file's bytes in RocksDB (their buckets' bytes) are merged into a new part file at the next
/// run, however long they have waited.
pub const LATE_REWRITE_SHARE: u64 = 16;

impl ArchiveConfig {
    /// An archive under `root` with the default file settings: row groups of 65,536 rows, zstd
    /// level 3.
    pub fn new(root: impl Into<PathBuf>) -> ArchiveConfig {
        ArchiveConfig {
            root: root.into(),
            object_store: None,
            file: FileSettings { row_group_rows: 65_536, zstd_level: 3 },
            failure_quiet: ARCHIVE_FAILURE_QUIET,
            late_rewrite_wait: LATE_REWRITE_WAIT,
            abort_at: None,
        }
    }
}

/// Steps of a spill, for crash tests ([`ArchiveConfig::abort_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillStep {
    /// Some rows of the new file are written, not all.
    MidFile,
    /// The new file is complete and fsynced under its temporary name.
    FileSynced,
    /// The new file has its final name; the manifest does not know it yet.
    FileRenamed,
    /// The manifest names the new file and the partition is gone from RocksDB; an older part
    /// is still on disk.
    Committed,
}

impl SpillStep {
    /// Parses the names `mid-file`, `file-synced`, `file-renamed`, `committed`.
    pub fn parse(s: &str) -> Option<SpillStep> {
        Some(match s {
            "mid-file" => SpillStep::MidFile,
            "file-synced" => SpillStep::FileSynced,
            "file-renamed" => SpillStep::FileRenamed,
            "committed" => SpillStep::Committed,
            _ => return None,
        })
    }
}

/// How many times a reader reads an archived partition whose file a spill keeps replacing
/// before it gives up ([`Store::archive_entry`]); a spill run rewrites a partition once.
pub(crate) const ARCHIVE_READ_ATTEMPTS: usize = 8;

/// A test hook run by readers of partitions ([`Store::set_between_archive_reads`]).
#[derive(Clone)]
pub struct ReadHook(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadHook")
    }
}

/// The manifest entry of one archived partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchivedPartition {
    /// Which rewrite of the partition the file is (`part-N`).
    pub part: u32,
    /// Rows (readings) in the file.
    pub rows: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// Smallest time in the file.
    pub min_ts: i64,
    /// Largest time in the file.
    pub max_ts: i64,
}

/// What the archive holds ([`Store::archive_held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveHeld {
    /// Archived partitions (one file each).
    pub partitions: u64,
    /// Rows (readings) in their files.
    pub rows: u64,
    /// Their files' bytes.
    pub bytes: u64,
    /// Of those partitions, the ones whose late readings wait in RocksDB for a rewrite
    /// ([`ArchiveConfig::late_rewrite_wait`]), as spill runs found them (kept across restarts).
    pub waiting: u64,
    /// Files the manifest names that the archive lacked when last looked at (a local archive's
    /// at open and at each spill run, a bucket's objects at each spill run): their partitions'
    /// reads fail, and their hours are not rolled up, until they are put back.
    pub files_missing: u64,
}

const ENTRY_VERSION: u8 = 1;
const ENTRY_LEN: usize = 37;

/// The persisted bytes of a manifest entry (version 1).
pub fn encode_entry(e: &ArchivedPartition) -> [u8; ENTRY_LEN] {
    let mut v = [0u8; ENTRY_LEN];
    v[0] = ENTRY_VERSION;
    v[1..5].copy_from_slice(&e.part.to_be_bytes());
    v[5..13].copy_from_slice(&e.rows.to_be_bytes());
    v[13..21].copy_from_slice(&e.bytes.to_be_bytes());
    v[21..29].copy_from_slice(&e.min_ts.to_be_bytes());
    v[29..37].copy_from_slice(&e.max_ts.to_be_bytes());
    v
}

/// Parses [`encode_entry`]'s bytes.
pub fn decode_entry(v: &[u8]) -> Result<ArchivedPartition, String> {
    let v: &[u8; ENTRY_LEN] = v.try_into().map_err(|_| format!("{} bytes, expected {ENTRY_LEN}", v.len()))?;
    if v[0] != ENTRY_VERSION {
        return Err(format!("version {}", v[0]));
    }
    let u64_at = |i: usize| u64::from_be_bytes(v[i..i + 8].try_into().unwrap_or_default());
    Ok(ArchivedPartition {
        part: u32::from_be_bytes([v[1], v[2], v[3], v[4]]),
        rows: u64_at(5),
        bytes: u64_at(13),
        min_ts: u64_at(21) as i64,
        max_ts: u64_at(29) as i64,
    })
}

/// The in-memory manifest and the metadata of the files read lately.
#[derive(Debug, Default)]
pub(crate) struct Manifest {
    entries: BTreeMap<(u32, i32), ArchivedPartition>,
    /// How many commits have changed it, and the last one's tag (module docs, "Generation");
    /// changed under the spill lock only.
    generation: Generation,
}

/// An archive's generation (module docs, "Generation"): how many commits have changed the
/// manifest, and a random tag of the last (0: none, or a file of a build before tags). Two runs
/// from one copy of a store reach the same count with other tags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Generation {
    count: u64,
    tag: u64,
}

impl Generation {
    /// The generation of the next commit.
    fn next(self) -> Generation {
        Generation { count: self.count + 1, tag: rand::random::<u64>().max(1) }
    }

    /// The persisted bytes: count u64 BE · tag u64 BE.
    fn encode(self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.count.to_be_bytes());
        v[8..].copy_from_slice(&self.tag.to_be_bytes());
        v
    }

    fn decode(v: &[u8]) -> Option<Generation> {
        let v: &[u8; 16] = v.try_into().ok()?;
        let half = |i: usize| u64::from_be_bytes(v[i..i + 8].try_into().unwrap_or_default());
        Some(Generation { count: half(0), tag: half(8) })
    }

    /// The text of [`GENERATION_FILE`]: the count, a space, the tag in 16 hex digits.
    fn text(self) -> String {
        format!("{} {:016x}\n", self.count, self.tag)
    }

    /// [`Generation::text`] read back (a count alone: tag 0).
    fn parse(text: &str) -> Option<Generation> {
        let mut words = text.split_whitespace();
        let count = words.next()?.parse().ok()?;
        let tag = match words.next() {
            Some(tag) => u64::from_str_radix(tag, 16).ok()?,
            None => 0,
        };
        words.next().is_none().then_some(Generation { count, tag })
    }

    /// Whether `self` (an archive's) and `ours` (a store's) are the same count reached by other
    /// commits.
    fn diverged(self, ours: Generation) -> bool {
        self.count == ours.count && self.tag != ours.tag && self.tag != 0 && ours.tag != 0
    }
}

/// Footers and page indexes of the files read lately, by path, each with the size and
/// modification time its file had when it was read: a file replaced since (a bucket's object
/// downloaded again, a file put back by hand) is read again, not through the footer of the one
/// it replaced (QA61 F2: another partition's object, downloaded in place of a copy whose
/// footer was kept, read as empty; QA59: "Src size is incorrect").
#[derive(Default)]
pub(crate) struct MetadataCache {
    files: HashMap<PathBuf, (FileStamp, ArrowReaderMetadata)>,
}

/// A file's size and modification time.
type FileStamp = (u64, Option<std::time::SystemTime>);

fn file_stamp(path: &Path) -> Option<FileStamp> {
    std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok()))
}

impl std::fmt::Debug for MetadataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataCache").field("files", &self.files.len()).finish()
    }
}

/// Files whose metadata the cache keeps at most (then it starts over).
const METADATA_CACHE_FILES: usize = 1024;

pub(crate) fn load_manifest(db: &rocksdb::DB) -> Result<Manifest> {
    let mut entries = BTreeMap::new();
    for item in db.iterator_cf(cf(db, CF_ARCHIVE), IteratorMode::Start) {
        let (k, v) = item.map_err(db_err("load archive manifest"))?;
        let key = keys::partition_of(&k)
            .ok_or_else(|| Error::Corrupt { what: "archive key", detail: format!("{} bytes", k.len()) })?;
        let entry = decode_entry(&v).map_err(|detail| Error::Corrupt { what: "archive entry", detail })?;
        entries.insert(key, entry);
    }
    let generation = match db.get_cf(cf(db, CF_CATALOG), keys::ARCHIVE_GENERATION_KEY) {
        Ok(None) => Generation::default(),
        Ok(Some(v)) => Generation::decode(&v).ok_or_else(|| Error::Corrupt {
            what: "archive generation",
            detail: format!("{} bytes, expected 16", v.len()),
        })?,
        Err(e) => return Err(db_err("get archive generation")(e)),
    };
    Ok(Manifest { entries, generation })
}

/// The archived partitions whose late readings wait for a rewrite, with the time of the first
/// spill run that found them ([`keys::archive_late_key`]): the wait goes on across restarts.
pub(crate) fn load_late(db: &rocksdb::DB) -> Result<HashMap<(u32, i32), i64>> {
    let mut late = HashMap::new();
    for item in db.prefix_iterator_cf(cf(db, CF_CATALOG), [keys::ARCHIVE_LATE_PREFIX]) {
        let (k, v) = item.map_err(db_err("load late waits"))?;
        if k.first() != Some(&keys::ARCHIVE_LATE_PREFIX) {
            break;
        }
        let corrupt = || Error::Corrupt { what: "late wait", detail: format!("key {k:?}, {} value bytes", v.len()) };
        let pair = keys::decode_archive_late_key(&k).ok_or_else(corrupt)?;
        let since = <[u8; 8]>::try_from(&*v).map(i64::from_be_bytes).map_err(|_| corrupt())?;
        late.insert(pair, since);
    }
    Ok(late)
}

/// The directory name of a table: `table=` and the name, escaped (see the module docs).
pub fn table_dir(table: &str) -> String {
    let mut s = String::from("table=");
    for b in table.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The label of partition `index` of a table with partitions of `size` (see the module docs).
pub fn partition_label(size: PartitionSize, index: i64) -> String {
    let start = size.start_ms(index);
    let days = start.div_euclid(model::DAY_MS);
    let (y, m, d) = model::civil_from_days(days);
    match size {
        PartitionSize::Hour => format!("{y:04}-{m:02}-{d:02}T{:02}", start.rem_euclid(model::DAY_MS) / model::HOUR_MS),
        PartitionSize::Day => format!("{y:04}-{m:02}-{d:02}"),
        PartitionSize::Month => format!("{y:04}-{m:02}"),
    }
}

/// The directory of one partition of a table under `root`.
pub fn partition_dir(root: &Path, table: &str, size: PartitionSize, index: i64) -> PathBuf {
    root.join(table_dir(table)).join(format!("partition={}", partition_label(size, index)))
}

fn part_name(part: u32) -> String {
    format!("part-{part}.parquet")
}

/// The path of a file relative to the archive root (and in the bucket, under its prefix).
fn rel_path(table: &str, size: PartitionSize, index: i64, part: u32) -> String {
    format!("{}/partition={}/{}", table_dir(table), partition_label(size, index), part_name(part))
}

/// One partition written to the archive by a spill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpilledPartition {
    /// Table name.
    pub table: String,
    /// Partition index.
    pub partition: i64,
    /// Rows in the new file.
    pub rows: u64,
    /// Of those, rows that came from the partition's previous file.
    pub rows_from_archive: u64,
    /// Bytes of the new file.
    pub bytes: u64,
    /// The new file (for an archive in a bucket, where it was written before its upload: gone
    /// now).
    pub path: PathBuf,
    /// For an archive in a bucket, the new file's object (`s3://bucket/prefix/table=…`).
    pub object: Option<String>,
}

impl SpilledPartition {
    /// Where the new file is: its object for an archive in a bucket, else its path.
    pub fn location(&self) -> String {
        self.object.clone().unwrap_or_else(|| self.path.display().to_string())
    }
}

/// What one [`Store::spill_expired_partitions`] run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpillReport {
    /// Partitions written to the archive, by table name and then oldest first.
    pub spilled: Vec<SpilledPartition>,
    /// Partitions deleted for good (past the cold retention): (table, partition).
    pub deleted: Vec<(String, i64)>,
    /// Files removed because the manifest does not name them.
    pub leftovers_removed: usize,
    /// Partitions that could not be archived and stay in RocksDB, with the error: (table,
    /// partition, error). The next run tries them again.
    pub failed: Vec<(String, i64, String)>,
    /// Archived partitions whose late readings stay in RocksDB for a later run
    /// ([`ArchiveConfig::late_rewrite_wait`]): (table, partition, the first run's time that
    /// found them, ms).
    pub deferred: Vec<(String, i64, i64)>,
}

/// A spill's temporary file, removed when dropped unless taken (`.0 = None`).
struct TmpFile<'a>(Option<&'a Path>);

impl Drop for TmpFile<'_> {
    fn drop(&mut self) {
        if let Some(path) = self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The file in a local archive root naming the store that owns it, and the object under a
/// bucket's prefix naming the id of the store that owns it (module docs, "Owner").
pub const OWNER_FILE: &str = ".hourglass-store";

/// The file in a local archive root naming the id of the store that owns it ([`STORE_ID_FILE`];
/// module docs, "Owner"). A file of its own, beside [`OWNER_FILE`], which builds before it
/// read whole as the owner's path.
pub const OWNER_ID_FILE: &str = ".hourglass-store-id";

/// The file in a local archive root naming the archive's generation, as the last commit that
/// changed the manifest of the store that owns it left it (module docs, "Generation").
pub const GENERATION_FILE: &str = ".hourglass-archive-generation";

/// How long after a failed request to the archive's bucket roll-up passes leave archived hours
/// dirty without asking it (each request waits out its retries, 30 s and more, with a bucket
/// that does not answer, and the hot hours of the pass with it). Then a probe asks it in the
/// background, and the passes after its answer read archived hours again; a failed probe is
/// another failure.
pub const ARCHIVE_FAILURE_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// How long the sweep of leftovers leaves a download's temporary file alone
/// ([`Store::remove_leftovers`]): a reader may still be writing it. An older one is a stopped
/// process's.
const DOWNLOAD_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Whether `path` was modified within `age` (or cannot be looked at: gone, or being renamed).
fn modified_within(path: &Path, age: std::time::Duration) -> bool {
    std::fs::metadata(path).and_then(|m| m.modified()).map_or(true, |t| t.elapsed().map_or(true, |a| a < age))
}

/// The file in a store's RocksDB directory holding the store's id ([`Store::store_id`]): 32
/// hex digits and a newline. A RocksDB checkpoint does not copy it, so a store restored from
/// one has an id of its own.
pub const STORE_ID_FILE: &str = "HOURGLASS-STORE-ID";

/// Whether `s` is a store id: 32 lowercase hex digits.
fn is_store_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A partition directory and its files.
type PartitionDir = (PathBuf, Vec<PathBuf>);

/// The table directories under `root` (`table=*`), each with its partition directories and
/// their files.
fn archive_tree(root: &Path) -> Result<Vec<(PathBuf, Vec<PartitionDir>)>> {
    let list = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io_err("list", dir))? {
            out.push(e.map_err(io_err("list", dir))?.path());
        }
        Ok(out)
    };
    let mut tables = Vec::new();
    for table in list(root)? {
        if !table.is_dir() || !table.file_name().is_some_and(|n| n.to_string_lossy().starts_with("table=")) {
            continue;
        }
        let mut partitions = Vec::new();
        for part_dir in list(&table)?.into_iter().filter(|d| d.is_dir()) {
            let files = list(&part_dir)?;
            partitions.push((part_dir, files));
        }
        tables.push((table, partitions));
    }
    Ok(tables)
}

/// A part file under `root` (`table=*/*/part-*`), if there is one.
fn first_part_file(root: &Path) -> Result<Option<PathBuf>> {
    let tree = archive_tree(root)?;
    let mut files = tree.into_iter().flat_map(|(_, partitions)| partitions).flat_map(|(_, files)| files);
    Ok(files.find(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("part-"))))
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::Archive(format!("{what} {}: {e}", path.display()))
}

fn file_err(e: file::FileError) -> Error {
    Error::Archive(e.to_string())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("fsync directory", dir))
}

/// Writes `text` as the new file `name` in `dir`, whole, unless `name` exists (`false`, the file
/// left as it is): to a temporary file of this call's own, fsynced, hard-linked to `name` (a
/// link never replaces a file, so of two stores claiming a root at once one wins), the
/// directory fsynced.
fn create_small_file(dir: &Path, name: &str, text: &str) -> Result<bool> {
    let (tmp, path) = (dir.join(format!("{name}.{:016x}.tmp", rand::random::<u64>())), dir.join(name));
    std::fs::write(&tmp, text).map_err(io_err("write", &tmp))?;
    let linked = std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io_err("fsync", &tmp)).and_then(|()| {
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_err("link", &path)(e)),
        }
    });
    let removed = std::fs::remove_file(&tmp).map_err(io_err("remove", &tmp));
    let created = linked?;
    removed?;
    sync_dir(dir)?;
    Ok(created)
}

/// The refusal of an archive (`root`, a directory or a bucket prefix) whose generation `theirs`
/// (as `file` says) is behind this store's `ours` while `gone` of the `named` files the store's
/// manifest names are not in it: restored from an older copy than the store's RocksDB
/// directory, its older files would be deleted as leftovers, the only copies of the partitions
/// rewritten since.
fn older_archive(root: &str, theirs: u64, file: &str, ours: u64, gone: usize, named: usize) -> Error {
    if theirs == ours {
        let found = match gone {
            0 => format!("It holds the {named} files this store's manifest names, but this store"),
            _ => format!("{gone} of the {named} files this store's manifest names are not in it, and it"),
        };
        return Error::Archive(format!(
            "{root} and this store's manifest are both at generation {ours} ({file} says so) by other changes: the \
             archive and this store's RocksDB directory were each run on its own since a common copy (one restored \
             and run, then the other put back?). {found} would delete the files the other run wrote as leftovers. \
             Restore the archive that goes with this RocksDB directory; to start anyway (the partitions whose files \
             are not there unreadable, the other run's files deleted), delete {file}"
        ));
    }
    Error::Archive(format!(
        "{root} is at generation {theirs} ({file} says so), behind this store's manifest at {ours}, and {gone} of \
         the {named} files that manifest names are not in it: an archive restored from an older copy than this \
         store's RocksDB directory? The store would delete its older files as leftovers (the only copies of the \
         partitions rewritten since). Restore the archive copied with this RocksDB directory; to start anyway (the \
         partitions whose files are not there unreadable, the older files deleted), delete {file}"
    ))
}

/// Writes the small file `name` in `dir` (whatever it held before is replaced at once: a crash
/// leaves the old text or the new), and makes it durable.
fn replace_small_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let (tmp, path) = (dir.join(format!("{name}.{:016x}.tmp", rand::random::<u64>())), dir.join(name));
    let written = std::fs::write(&tmp, text)
        .map_err(io_err("write", &tmp))
        .and_then(|()| std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io_err("fsync", &tmp)))
        .and_then(|()| std::fs::rename(&tmp, &path).map_err(io_err("rename", &tmp)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// What the small file `name` in `dir` says (its text less the final newlines), or `ours` once
/// written there: when it is missing, `claim` decides whether to write it (`Ok(false)`: leave
/// it missing, `None`); of two writers at once, the first linked wins and the other reads it
/// ([`create_small_file`]).
fn read_or_claim(dir: &Path, name: &str, ours: &str, claim: impl FnOnce() -> Result<bool>) -> Result<Option<String>> {
    let path = dir.join(name);
    let read = || std::fs::read_to_string(&path).map(|t| t.trim_end_matches('\n').to_string());
    match read() {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !claim()? {
                return Ok(None);
            }
            if create_small_file(dir, name, &format!("{ours}\n"))? {
                return Ok(Some(ours.to_string()));
            }
            // Another writer made it since it was read.
            read().map(Some).map_err(io_err("read", &path))
        }
        Err(e) => Err(io_err("read", &path)(e)),
    }
}

impl Store {
    pub(crate) fn archive_config(&self) -> Option<&ArchiveConfig> {
        self.cfg.archive.as_ref()
    }

    /// Whether this store archives partitions past their hot retention (`storage.archive`), or
    /// deletes them.
    pub fn archives(&self) -> bool {
        self.archive_config().is_some()
    }

    /// The manifest entry of partition `partition` of `table`, if it is archived.
    pub fn archived_partition(&self, table: &str, partition: i64) -> Option<ArchivedPartition> {
        let ti = self.table(table)?;
        let p = keys::to_i32(partition)?;
        read(&self.manifest).entries.get(&(ti.id, p)).copied()
    }

    /// What the archive holds now, by its manifest: every table's archived partitions (a file
    /// each), their rows and bytes. Files being spilled are not in it until their commit, and
    /// files a rewrite or cold retention replaced are not in it once it commits (they may stay
    /// on disk, or in the bucket, until the next leftover sweep).
    pub fn archive_held(&self) -> ArchiveHeld {
        let waiting = self.archive_late.lock().unwrap_or_else(PoisonError::into_inner).len() as u64;
        let files_missing = self.archive_missing.load(Ordering::Relaxed);
        let start = ArchiveHeld { waiting, files_missing, ..ArchiveHeld::default() };
        read(&self.manifest).entries.values().fold(start, |held, e| ArchiveHeld {
            partitions: held.partitions + 1,
            rows: held.rows + e.rows,
            bytes: held.bytes + e.bytes,
            ..held
        })
    }

    /// The archived partitions of `table`, oldest first, with the path of each one's file.
    pub fn archived_partitions(&self, table: &str) -> Vec<(i64, ArchivedPartition, PathBuf)> {
        let (Some(ti), Some(cfg)) = (self.table(table), self.archive_config()) else {
            return Vec::new();
        };
        read(&self.manifest)
            .entries
            .range((ti.id, i32::MIN)..=(ti.id, i32::MAX))
            .map(|(&(_, p), e)| (i64::from(p), *e, cfg.root.join(rel_path(table, ti.partition, i64::from(p), e.part))))
            .collect()
    }

    /// The manifest entry of partition `partition` of the table with id `table`, if it is
    /// archived (and an archive is configured).
    ///
    /// A reader of an archived partition reads its file, then what RocksDB holds of it since
    /// (late readings), and then this entry again: if it changed, a spill merged the late
    /// readings into a new file and deleted them from RocksDB in between, so the reader may have
    /// missed them (the old file has none of them and RocksDB no longer does) and reads again
    /// ([`ARCHIVE_READ_ATTEMPTS`]). A spill switches the entry before it deletes the partition
    /// from RocksDB, so a read of RocksDB that missed them is always followed by a changed
    /// entry; the parts only grow, so a changed entry is never the same again.
    pub(crate) fn archive_entry(&self, table: u32, partition: i32) -> Option<ArchivedPartition> {
        self.archive_config()?;
        read(&self.manifest).entries.get(&(table, partition)).copied()
    }

    /// The error of a read of partition `partition` of `table` whose archive entry changed at
    /// each of its [`ARCHIVE_READ_ATTEMPTS`].
    pub(crate) fn rewritten_while_read(table: &str, partition: i32) -> Error {
        Error::Archive(format!(
            "partition {partition} of {table} was rewritten by the archive {ARCHIVE_READ_ATTEMPTS} times while it was \
             read; read it again"
        ))
    }

    /// Test hook: `hook` runs in each read of a partition's readings (raw, or an hour's to roll
    /// it up from the archive) between the look at its manifest entry (and the read of its
    /// file, if archived) and the read of RocksDB: a test spills there. `None` removes it.
    #[doc(hidden)]
    pub fn set_between_archive_reads(&self, hook: Option<ReadHook>) {
        let mut held = self.between_archive_reads.lock().unwrap_or_else(PoisonError::into_inner);
        self.has_read_hook.store(hook.is_some(), Ordering::SeqCst);
        *held = hook;
    }

    /// Runs the hook of [`Store::set_between_archive_reads`], if one is set (without one, a
    /// load of a flag: readers take no lock).
    pub(crate) fn between_archive_reads(&self) {
        if !self.has_read_hook.load(Ordering::Relaxed) {
            return;
        }
        let hook = self.between_archive_reads.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(ReadHook(hook)) = hook {
            hook();
        }
    }

    /// The archived readings of `device` (named `name`) in partition `partition` of the table
    /// `ti` (named `table`) within `range`, in time order, from the file of manifest entry
    /// `entry` (see [`Store::archive_entry`]).
    pub(crate) fn archived_readings(
        &self,
        table: &str,
        ti: &TableInfo,
        (partition, entry): (i32, ArchivedPartition),
        name: &str,
        range: TimeRange,
    ) -> Result<Vec<Reading>> {
        let Some(cfg) = self.archive_config() else { return Ok(Vec::new()) };
        if entry.max_ts < range.start || entry.min_ts >= range.end {
            return Ok(Vec::new());
        }
        self.stats.archive_device_reads.fetch_add(1, Ordering::Relaxed);
        let rel = rel_path(table, ti.partition, i64::from(partition), entry.part);
        let path = self.local_file(cfg, &rel)?;
        self.again_if_downloaded(&rel, &path, || {
            let meta = self.archive_file_meta(&path, entry)?;
            file::read_device(&path, &meta, name, range).map_err(file_err)
        })
    }

    /// The metadata of the archive file at `path`, checked against its partition's manifest
    /// entry when first read: a whole Parquet file of another partition (or part) put in this
    /// one's place was read as this partition's, its readings outside it served, twice over a
    /// range covering both (QA57 F6); a late readings' rewrite took its rows into the
    /// partition's next part and deleted the right file (QA61 F2).
    fn archive_file_meta(&self, path: &Path, entry: ArchivedPartition) -> Result<ArrowReaderMetadata> {
        let stamp = file_stamp(path);
        {
            let cache = self.archive_meta.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((at, meta)) = cache.files.get(path) {
                if stamp == Some(*at) {
                    return Ok(meta.clone());
                }
            }
        }
        let meta = file::open_metadata(path).map_err(file_err)?;
        let (rows, times) = file::rows_and_times(&meta);
        if rows != entry.rows || times.is_some_and(|t| t != (entry.min_ts, entry.max_ts)) {
            return Err(Error::Archive(format!(
                "{}: not the file archived for this partition: it holds {rows} rows from {} to {}, and the archive's \
                 manifest says {} rows from {} to {} (a file of another partition or part copied in its place? put \
                 back this partition's file)",
                path.display(),
                times.map_or("?".to_string(), |t| model::utc_text(t.0)),
                times.map_or("?".to_string(), |t| model::utc_text(t.1)),
                entry.rows,
                model::utc_text(entry.min_ts),
                model::utc_text(entry.max_ts),
            )));
        }
        if let Some(stamp) = stamp {
            let mut cache = self.archive_meta.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.files.len() >= METADATA_CACHE_FILES {
                cache.files.clear();
            }
            cache.files.insert(path.to_path_buf(), (stamp, meta.clone()));
        }
        Ok(meta)
    }

    /// `read` of the local copy `path` of archive file `rel`; when it fails and the copy is of a
    /// bucket's object written since (a damaged object mended in the bucket), `read` again of
    /// the object downloaded anew ([`Store::downloaded_again`]), else its first error.
    fn again_if_downloaded<T>(&self, rel: &str, path: &Path, read: impl Fn() -> Result<T>) -> Result<T> {
        match read() {
            Err(e) => match self.downloaded_again(rel, path) {
                Ok(true) => read(),
                _ => Err(e),
            },
            done => done,
        }
    }

    /// After the local copy `path` of a bucket's object `rel` failed to read: whether the
    /// object was written after the copy was (a damaged object mended in the bucket), and so
    /// downloaded again in the copy's place. A copy kept once downloaded was read for good,
    /// failing, after its object was mended (QA61 F3). Never for a local archive.
    fn downloaded_again(&self, rel: &str, path: &Path) -> Result<bool> {
        let Some(bucket) = &self.bucket else { return Ok(false) };
        let Some(copied) = std::fs::metadata(path).ok().and_then(|m| m.modified().ok()) else { return Ok(false) };
        if !bucket.written_after(rel, copied)? {
            return Ok(false);
        }
        tracing::info!(object = %bucket.object_of(rel), copy = %path.display(), "the archive object was written after its local copy failed to read: downloading it again");
        bucket.download(rel, path)?;
        Ok(true)
    }

    /// The local copy of archive file `rel`: the file itself for a local archive; for one in a
    /// bucket, downloaded on first use.
    fn local_file(&self, cfg: &ArchiveConfig, rel: &str) -> Result<PathBuf> {
        let path = cfg.root.join(rel);
        if let Some(bucket) = &self.bucket {
            if !path.exists() {
                bucket.download(rel, &path)?;
            }
        }
        Ok(path)
    }

    /// Claims the archive root for this store ([`OWNER_FILE`]) and deletes the local files the
    /// manifest does not name, if an archive is configured (at open; a bucket is swept by the
    /// next spill run, so an unreachable object store does not stop the store from opening).
    pub(crate) fn sweep_archive(&self) -> Result<()> {
        if let Some(cfg) = self.archive_config() {
            if !self.claim_archive(&cfg.root)? {
                // Not this store's: its part files are not leftovers of this store's; and none
                // of them is there.
                self.archive_missing.store(self.manifest_rels().len() as u64, Ordering::Relaxed);
                return Ok(());
            }
            let (gone, named) = if self.bucket.is_none() { self.named_missing(&cfg.root) } else { (Vec::new(), 0) };
            // A root the store had not claimed yet that holds none of them is not taken (said by
            // the claim); one it had claimed is said here, whatever it lost.
            if !gone.is_empty() {
                tracing::error!(
                    missing = gone.len(), named, archive_dir = %cfg.root.display(),
                    files = ?gone.iter().take(5).collect::<Vec<_>>(),
                    "archive files this store's manifest names are not in its archive directory: reads of their \
                     partitions fail, and their hours are not rolled up, until the files are put back"
                );
            }
            self.remove_leftovers(cfg, false)?;
        }
        Ok(())
    }

    /// Checks that the archive root `root` is this store's, and claims it if it is no store's
    /// (see the module docs, "Owner"): whether it is this store's (false: a root without an
    /// owner that holds none of the files this store archived, left alone).
    fn claim_archive(&self, root: &Path) -> Result<bool> {
        if root.exists() && !root.is_dir() {
            return Err(Error::Archive(format!(
                "{} is not a directory (storage.archive_dir names the archive's directory)",
                root.display()
            )));
        }
        std::fs::create_dir_all(root).map_err(io_err("create", root))?;
        let store = self.db.path();
        let ours = std::fs::canonicalize(store).map_err(io_err("resolve", store))?;
        let ours = ours.to_string_lossy();
        let owner_file = root.join(OWNER_FILE);
        // A root without an owner that holds none of the files this store archived: not the
        // directory the store spilled to (a `storage.archive_dir` left out). Not claimed, so
        // the right one stays this store's; its archived partitions cannot be read until the
        // store opens with it.
        let claim = || {
            let (gone, named) = if self.bucket.is_none() { self.named_missing(root) } else { (Vec::new(), 0) };
            if named > 0 && gone.len() == named {
                tracing::error!(
                    archive_dir = %root.display(),
                    partitions = named,
                    "this store has archived partitions, and none of their files is in its archive directory: \
                     is storage.archive_dir the directory it spilled to? Reads of archived partitions fail until \
                     it is (the directory is not claimed for this store)"
                );
                return Ok(false);
            }
            self.refuse_parts_of_another(root)?;
            Ok(true)
        };
        let Some(owner) = read_or_claim(root, OWNER_FILE, &ours, claim)? else { return Ok(false) };
        if owner != ours {
            // The archive/ beside this store's RocksDB directory (the default, inside its data
            // directory): a copy of another's data directory, or the store moved, whose archive
            // came along; "give this store its own archive_dir" did not apply (QA52 F6).
            let beside = Path::new(ours.as_ref()).parent().map(|d| d.join("archive"));
            let inside = beside.is_some_and(|b| std::fs::canonicalize(root).is_ok_and(|r| r == b));
            if inside {
                return Err(Error::Archive(format!(
                    "{} is the archive of the store in {owner} ({} says so), and it is the archive/ beside this \
                     store ({ours}): a copy of that store's data directory, or that store moved here? Delete {} to \
                     make it this store's",
                    root.display(),
                    owner_file.display(),
                    owner_file.display()
                )));
            }
            return Err(Error::Archive(format!(
                "{} is the archive of the store in {owner} ({} says so), not of this one ({ours}): two stores \
                 cannot share an archive (each would delete the other's files). Give this store its own \
                 storage.archive_dir (a restored checkpoint: \"\" for the archive/ inside its data_dir); if this \
                 store moved here from {owner}, delete {}",
                root.display(),
                owner_file.display(),
                owner_file.display()
            )));
        }
        self.claim_archive_id(root).map(|()| true)
    }

    /// Refuses an archive root that holds part files while this store has archived nothing:
    /// another store's archive (or a store's whose RocksDB directory this one replaced), whose
    /// files the store would delete as leftovers.
    fn refuse_parts_of_another(&self, root: &Path) -> Result<()> {
        if !read(&self.manifest).entries.is_empty() {
            return Ok(());
        }
        match first_part_file(root)? {
            Some(file) => Err(Error::Archive(format!(
                "{} holds archive files ({} among them) but this store has archived nothing: another store's \
                 archive, or the archive of a store whose RocksDB directory was lost and made anew? Give this store \
                 its own storage.archive_dir (or, if they are what this store's first spill left when it was cut \
                 short, delete them)",
                root.display(),
                file.display()
            ))),
            None => Ok(()),
        }
    }

    /// Checks that the local archive root `root`, whose owner file names this store's
    /// directory, names this store's id too ([`OWNER_ID_FILE`]), and writes it there if no id
    /// is: a checkpoint restored in place of the store that owns the root has the path and
    /// another id.
    fn claim_archive_id(&self, root: &Path) -> Result<()> {
        let ours = self.store_id()?;
        let id_file = root.join(OWNER_ID_FILE);
        // No id yet (a root claimed by a build before the id file): a store made anew where the
        // owner's RocksDB directory was (lost, wiped) has its path and an empty manifest, and
        // would delete every file as a leftover. (With the id file, its new id is refused below;
        // a first spill cut short leaves files to sweep then.)
        let claimed = std::cell::Cell::new(false);
        let claim = || {
            self.refuse_parts_of_another(root)?;
            claimed.set(true);
            Ok(true)
        };
        // `claim` never leaves the file unwritten: `None` does not come.
        let Some(owner) = read_or_claim(root, OWNER_ID_FILE, &ours, claim)? else { return Ok(()) };
        if owner == ours {
            // An id file deleted to have this store take the archive over (a checkpoint restored
            // in place) says the generation of the store that wrote it goes with it.
            return self.check_generation(root, claimed.get());
        }
        // What taking the archive over would cost (a bucket's cache says nothing of it).
        // Files the manifest names and the archive lacks would be unreadable after a takeover
        // until copied in (QA52 F2: the advice said only to delete the id file).
        let (named, copy_first) = match self.bucket {
            Some(_) => (String::new(), ""),
            None => {
                let (gone, named) = self.named_missing(root);
                let copy_first = if gone.is_empty() {
                    ""
                } else {
                    "copy into it the files it lacks from the archive/ its checkpoint holds (they are unreadable \
                     otherwise), then "
                };
                (format!(" ({named} named, {} not in this archive)", gone.len()), copy_first)
            }
        };
        Err(Error::Archive(format!(
            "{} is the archive of the store with id {owner} ({} says so), and this store's id is {ours} ({} in \
             its RocksDB directory): a checkpoint or a copy restored in place of the store that archived there, or \
             a store made anew where its RocksDB directory was? Its manifest may name files that store has replaced \
             since{named}, and it would delete that store's newer files as leftovers. Start it with \
             storage.archive_dir = \"\" (the archive/ its checkpoint holds); if it is meant to take this archive \
             over, {copy_first}delete {}",
            root.display(),
            id_file.display(),
            STORE_ID_FILE,
            id_file.display()
        )))
    }

    /// The files the manifest names that the local archive root `root` lacks (relative to it),
    /// and how many it names.
    fn named_missing(&self, root: &Path) -> (Vec<String>, usize) {
        let rels = self.manifest_rels();
        let named = rels.len();
        (rels.into_iter().filter(|r| !root.join(r).exists()).collect(), named)
    }

    /// Checks that this store's manifest is not older than the local archive root `root`
    /// ([`GENERATION_FILE`]; module docs, "Generation"), and brings the file up to it; `taken`:
    /// this store has just claimed the root, and the file is written whatever it says.
    fn check_generation(&self, root: &Path, taken: bool) -> Result<()> {
        if self.bucket.is_some() {
            // The root is the bucket's local cache, not the archive.
            return Ok(());
        }
        let ours = read(&self.manifest).generation;
        let file = root.join(GENERATION_FILE);
        let found = if taken { Err(std::io::ErrorKind::NotFound.into()) } else { std::fs::read_to_string(&file) };
        let theirs = match found {
            Ok(text) => match Generation::parse(&text) {
                Some(g) => Some(g),
                None => {
                    return Err(Error::Archive(format!(
                        "{} holds {:?}, not an archive generation (a number and a tag): delete it, and the next \
                         start writes this store's",
                        file.display(),
                        text.chars().take(64).collect::<String>()
                    )))
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &file)(e)),
        };
        match theirs {
            Some(g) if g.count > ours.count => {
                let (gone, named) = self.named_missing(root);
                Err(Error::Archive(format!(
                    "{} is at generation {} ({} says so: the manifest of the store that archived there changed {} \
                     times), and this store's manifest at {}: this store's RocksDB directory is an older copy of \
                     that store (restored from a copy of a stopped store, without the archive directory copied \
                     with it)? {} of the {} files its manifest names are gone (replaced since), and it would \
                     delete the files written since as leftovers. Restore it with the archive directory copied with \
                     it; to run it on this archive anyway (the partitions whose files are gone unreadable, the newer \
                     files deleted), delete {}",
                    root.display(),
                    g.count,
                    file.display(),
                    g.count,
                    ours.count,
                    gone.len(),
                    named,
                    file.display()
                )))
            }
            Some(g) if g == ours => Ok(()),
            Some(g) => {
                // Behind the store, or at its count by other commits. A crash between a commit
                // and the file leaves it behind with every file the manifest names there (each
                // is written before its commit); an archive restored from an older copy than
                // the store's, or one another run from a common copy changed, lacks some, and
                // has files the store would delete as leftovers.
                let (gone, named) = self.named_missing(root);
                if !gone.is_empty() || g.diverged(ours) {
                    let (root, file) = (root.display().to_string(), file.display().to_string());
                    return Err(older_archive(&root, g.count, &file, ours.count, gone.len(), named));
                }
                replace_small_file(root, GENERATION_FILE, &ours.text())
            }
            // None yet (a root claimed by a build before the file, or one taken over).
            None => replace_small_file(root, GENERATION_FILE, &ours.text()),
        }
    }

    /// Puts the manifest's next generation into `wb`, a commit that changes the manifest, and
    /// returns it for [`Store::mark_generation`] once `wb` is written. Under the spill lock.
    fn next_generation(&self, wb: &mut WriteBatch) -> Generation {
        let g = read(&self.manifest).generation.next();
        wb.put_cf(cf(&self.db, CF_CATALOG), keys::ARCHIVE_GENERATION_KEY, g.encode());
        g
    }

    /// After the commit of generation `g`: the manifest and the archive's [`GENERATION_FILE`]
    /// (the root's file, the bucket's object) say so. The file is written after the commit, so
    /// a crash between leaves it behind the store, not ahead (the next check brings it up).
    fn mark_generation(&self, cfg: &ArchiveConfig, g: Generation) {
        write(&self.manifest).generation = g;
        let text = g.text();
        let marked = match &self.bucket {
            Some(bucket) => bucket.put_small(GENERATION_FILE, text.into_bytes()),
            None => replace_small_file(&cfg.root, GENERATION_FILE, &text),
        };
        if let Err(e) = marked {
            // Behind the store, the file tells an older copy of it less well; no data is at stake.
            tracing::warn!(error = %e, generation = g.count, "could not write the archive's generation file");
        }
    }

    /// The names of table `table` and device `device` (ids).
    pub(crate) fn names_of(&self, table: u32, device: u64) -> Result<(Arc<str>, String)> {
        let table_name = read(&self.catalog)
            .by_name
            .iter()
            .find(|(_, ti)| ti.id == table)
            .map(|(n, _)| n.clone())
            .ok_or_else(|| Error::Corrupt { what: "catalog", detail: format!("no table has id {table}") })?;
        let name = self
            .db
            .get_pinned_cf(cf(&self.db, CF_REGISTRY), keys::device_id_key(device))
            .map_err(db_err("get device name"))?
            .ok_or_else(|| Error::Corrupt { what: "registry", detail: format!("device id {device} has no name") })?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| Error::Corrupt {
            what: "registry",
            detail: format!("name of device {device} is not UTF-8"),
        })?;
        Ok((table_name, name))
    }

    /// Whether any of `readings` falls into partition `p` of the table with id `t`.
    pub(crate) fn touches_partition(&self, readings: &[model::DeviceReading], (t, p): (u32, i32)) -> bool {
        let catalog = read(&self.catalog);
        let mut last: Option<(&Arc<str>, Option<TableInfo>)> = None;
        readings.iter().any(|r| {
            let ti = match &last {
                Some((name, ti)) if Arc::ptr_eq(name, &r.table) => *ti,
                _ => {
                    let ti = catalog.by_name.get(&r.table).copied();
                    last = Some((&r.table, ti));
                    ti
                }
            };
            ti.is_some_and(|ti| ti.id == t && ti.partition.index_of(r.reading.ts) == i64::from(p))
        })
    }

    /// Whether partition `partition` of the table with id `table` is archived.
    pub(crate) fn is_archived(&self, table: u32, partition: i32) -> bool {
        self.archive_entry(table, partition).is_some()
    }

    /// Moves every partition past its table's hot retention at `now_ms` to the archive, and
    /// deletes every archived partition past its table's cold retention (see the module
    /// docs). Without an archive configured, this is [`Store::drop_expired_partitions`] and
    /// reports the dropped partitions as deleted. `progress` hears of each partition spilled.
    /// A run that fails whole is counted (`StoreStats::archive_run_failures`).
    pub fn spill_expired_partitions(
        &self,
        now_ms: i64,
        progress: impl FnMut(&SpilledPartition),
    ) -> Result<SpillReport> {
        let run = self.spill_run(now_ms, progress);
        if run.is_err() {
            self.stats.archive_run_failures.fetch_add(1, Ordering::Relaxed);
        }
        run
    }

    /// Ends the archive bucket's requests in flight and refuses later ones, for an ordered
    /// stop: a bucket that does not answer would hold a roll-up pass (or a spill) for each of
    /// its requests' retries, 30 s and more each. Reads of archived partitions not in the local
    /// cache fail from then on.
    pub fn stop_archive_requests(&self) {
        if let Some(bucket) = &self.bucket {
            bucket.stop();
        }
    }

    /// Requests to the archive's bucket that failed (after their retries; a missing object's
    /// are not counted): 0 without a bucket.
    pub fn archive_request_failures(&self) -> u64 {
        self.bucket.as_ref().map_or(0, object::Bucket::failures)
    }

    /// Whether a request to the archive's bucket failed and no probe has had an answer since
    /// ([`ArchiveConfig::failure_quiet`]): roll-up passes read no archived hour meanwhile.
    pub(crate) fn archive_failed_lately(&self) -> bool {
        let window = self.archive_config().map_or(ARCHIVE_FAILURE_QUIET, |c| c.failure_quiet);
        self.bucket.as_ref().is_some_and(|b| b.quiet(window))
    }

    /// [`Store::spill_expired_partitions`], uncounted.
    fn spill_run(&self, now_ms: i64, mut progress: impl FnMut(&SpilledPartition)) -> Result<SpillReport> {
        let Some(cfg) = self.archive_config().cloned() else {
            return Ok(SpillReport { deleted: self.drop_expired_partitions(now_ms)?, ..SpillReport::default() });
        };
        let _one = self.spill_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // A partition is spilled from what RocksDB holds: the buffer goes there first. (A write
        // buffered during the spill lands as late data, merged at a later run.)
        self.flush_write_buffer()?;
        match &self.bucket {
            Some(bucket) => self.claim_bucket(bucket)?,
            // Checked again at each run: one without this store's files (said at open) is left
            // alone, neither swept nor spilled into.
            None if !self.claim_archive(&cfg.root)? => {
                self.archive_missing.store(self.manifest_rels().len() as u64, Ordering::Relaxed);
                return Err(Error::Archive(format!(
                    "{} holds none of the files this store archived and has no owner: not its archive directory, \
                     nothing is archived there (is storage.archive_dir the directory it spilled to?)",
                    cfg.root.display()
                )));
            }
            None => {}
        }
        let mut report =
            SpillReport { leftovers_removed: self.remove_leftovers(&cfg, true)?, ..SpillReport::default() };
        for (name, ti) in self.tables_with_hot_retention() {
            let Some(hot) = ti.hot_retention_ms else { continue };
            let first_hot = first_kept_partition(ti.partition, now_ms, hot);
            let first_cold = ti.cold_retention_ms.map_or(i64::MIN, |c| first_kept_partition(ti.partition, now_ms, c));
            // Past the cold retention: archived ones and any readings RocksDB has.
            let mut gone: Vec<i32> = read(&self.manifest)
                .entries
                .range((ti.id, i32::MIN)..=(ti.id, i32::MAX))
                .map(|(&(_, p), _)| p)
                .filter(|&p| i64::from(p) < first_cold)
                .collect();
            let hot_parts = self.partitions_with_data(ti.id, first_hot)?;
            gone.extend(hot_parts.iter().copied().filter(|&p| i64::from(p) < first_cold));
            gone.sort_unstable();
            gone.dedup();
            if !self.delete_archived(&cfg, &name, &ti, &gone, now_ms)? {
                // Left for a later run (roll-ups stopped, or the bucket kept an hour unread):
                // none deleted.
                gone.clear();
            }
            self.stats.partitions_deleted.fetch_add(gone.len() as u64, Ordering::Relaxed);
            report.deleted.extend(gone.iter().map(|&p| (name.to_string(), i64::from(p))));
            {
                let mut late = self.archive_late.lock().unwrap_or_else(PoisonError::into_inner);
                late.retain(|&(t, p), _| t != ti.id || !gone.contains(&p));
            }
            for p in hot_parts.into_iter().filter(|&p| i64::from(p) >= first_cold) {
                if let Some(entry) = self.archive_entry(ti.id, p) {
                    if let Some(since) = self.late_rewrite_waits(&cfg, ti.id, p, &entry, now_ms)? {
                        report.deferred.push((name.to_string(), i64::from(p), since));
                        continue;
                    }
                }
                // One partition that cannot be archived (say, a value the schema does not
                // admit in a legacy bucket) stays in RocksDB and does not hold up the others.
                let stats = &self.stats;
                match self.spill_partition(&cfg, &name, &ti, p) {
                    Ok(spilled) => {
                        self.archive_late.lock().unwrap_or_else(PoisonError::into_inner).remove(&(ti.id, p));
                        stats.archive_partitions_spilled.fetch_add(1, Ordering::Relaxed);
                        stats.archive_rows_spilled.fetch_add(spilled.rows, Ordering::Relaxed);
                        stats.archive_bytes_written.fetch_add(spilled.bytes, Ordering::Relaxed);
                        progress(&spilled);
                        report.spilled.push(spilled);
                    }
                    Err(e) => {
                        stats.archive_spill_failures.fetch_add(1, Ordering::Relaxed);
                        report.failed.push((name.to_string(), i64::from(p), e.to_string()));
                    }
                }
            }
        }
        Ok(report)
    }

    /// Whether the late readings RocksDB holds for archived partition `p` (of the table with
    /// id `table`, its file `entry`) wait for a later run: `Some` of the time of the first run
    /// that found them when they are under 1/[`LATE_REWRITE_SHARE`] of the file's bytes and
    /// found less than [`ArchiveConfig::late_rewrite_wait`] before `now_ms`; `None` when the
    /// partition is to be rewritten now. The bytes are counted only until they reach that share.
    fn late_rewrite_waits(
        &self,
        cfg: &ArchiveConfig,
        table: u32,
        p: i32,
        entry: &ArchivedPartition,
        now_ms: i64,
    ) -> Result<Option<i64>> {
        let wait = i64::try_from(cfg.late_rewrite_wait.as_millis()).unwrap_or(i64::MAX);
        let found = self.archive_late.lock().unwrap_or_else(PoisonError::into_inner).get(&(table, p)).copied();
        let since = match found {
            Some(since) => since,
            None => {
                // Kept, so a restart does not start the wait again (a store restarted more
                // often than the wait never rewrote such a partition); the commit that rewrites
                // or deletes the partition deletes it. Not synced: a crash may start it again.
                let key = keys::archive_late_key(table, p);
                self.db
                    .put_cf(cf(&self.db, CF_CATALOG), key, now_ms.to_be_bytes())
                    .map_err(db_err("keep late wait"))?;
                self.archive_late.lock().unwrap_or_else(PoisonError::into_inner).insert((table, p), now_ms);
                now_ms
            }
        };
        if now_ms.saturating_sub(since) >= wait {
            return Ok(None);
        }
        let Some((from, to)) = keys::partition_range(table, p) else { return Ok(None) };
        let enough = entry.bytes.div_ceil(LATE_REWRITE_SHARE).max(1);
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(to.to_vec());
        let mut it = self.db.raw_iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts);
        it.seek(from);
        let mut bytes = 0u64;
        while let Some(v) = it.value() {
            bytes = bytes.saturating_add(v.len() as u64);
            if bytes >= enough {
                return Ok(None);
            }
            it.next();
        }
        it.status().map_err(db_err("count late readings"))?;
        Ok(Some(since))
    }

    /// Deletes partitions `parts` of a table for good: manifest entries and RocksDB readings
    /// in one WriteBatch, then the files. What was stored into them and not rolled up yet is
    /// rolled up first, at `now_ms` ([`Store::roll_up_then_delete`]); false when none was
    /// deleted, roll-ups having stopped before that was done or the bucket having kept an hour
    /// of them from being read.
    fn delete_archived(
        &self,
        cfg: &ArchiveConfig,
        name: &str,
        ti: &TableInfo,
        parts: &[i32],
        now_ms: i64,
    ) -> Result<bool> {
        if parts.is_empty() {
            return Ok(true);
        }
        let deleting: Vec<(TableInfo, i32)> = parts.iter().map(|&p| (*ti, p)).collect();
        let deleted = self.roll_up_then_delete(&deleting, now_ms, || {
            let mut wb = WriteBatch::default();
            let mut settled = 0;
            for &p in parts {
                wb.delete_cf(cf(&self.db, CF_ARCHIVE), keys::archive_key(ti.id, p));
                wb.delete_cf(cf(&self.db, CF_CATALOG), keys::archive_late_key(ti.id, p));
                if let Some((_, n)) = self.delete_partition(&mut wb, ti, p)? {
                    settled += n;
                }
                self.put_deleted(&mut wb, ti, p);
            }
            let generation = self.next_generation(&mut wb);
            let mut opts = WriteOptions::default();
            opts.set_sync(true);
            self.db.write_opt(wb, &opts).map_err(db_err("delete archived partitions"))?;
            self.mark_generation(cfg, generation);
            Ok(settled)
        })?;
        let Some(settled) = deleted else { return Ok(false) };
        self.note_deleted(&parts.iter().map(|&p| (ti.id, p)).collect::<Vec<_>>());
        self.stats.latest_operands.fetch_add(settled, Ordering::Relaxed);
        let removed: Vec<(i32, ArchivedPartition)> = {
            let mut m = write(&self.manifest);
            parts.iter().filter_map(|p| m.entries.remove(&(ti.id, *p)).map(|e| (*p, e))).collect()
        };
        for (p, e) in removed {
            let rel = rel_path(name, ti.partition, i64::from(p), e.part);
            if let Some(bucket) = &self.bucket {
                bucket.delete(&rel)?;
            }
            let path = cfg.root.join(&rel);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path)(e)),
            }
            // The partition's directory goes with its last file (a leftover keeps it).
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        Ok(true)
    }

    /// This store's id, which a bucket's owner object names ([`STORE_ID_FILE`] in its RocksDB
    /// directory, made with a random id at the first need).
    pub fn store_id(&self) -> Result<String> {
        let dir = self.db.path();
        let path = dir.join(STORE_ID_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) if is_store_id(text.trim_end_matches('\n')) => Ok(text.trim_end_matches('\n').to_string()),
            Ok(text) => Err(Error::Archive(format!(
                "{} holds {:?}, not a store id (32 hex digits): delete it and a new id is made",
                path.display(),
                text.chars().take(64).collect::<String>()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = format!("{:032x}", rand::random::<u128>());
                if create_small_file(dir, STORE_ID_FILE, &format!("{id}\n"))? {
                    Ok(id)
                } else {
                    // Made by another caller since it was read.
                    self.store_id()
                }
            }
            Err(e) => Err(io_err("read", &path)(e)),
        }
    }

    /// Checks that the bucket's prefix is this store's, and claims it if it is no store's (see
    /// the module docs, "Owner"); at each spill run (one small read). The owner object is made
    /// by a conditional put, so of two stores claiming an empty prefix at once one wins; with a
    /// service that ignores the condition, the one whose object was overwritten stops at its
    /// next run.
    fn claim_bucket(&self, bucket: &object::Bucket) -> Result<()> {
        let id = self.store_id()?;
        let owner_object = format!("{}/{OWNER_FILE}", bucket.url);
        match bucket.get_small(OWNER_FILE)? {
            Some(bytes) => {
                let owner = String::from_utf8_lossy(&bytes);
                let owner = owner.trim_end_matches('\n');
                if owner != id {
                    return Err(Error::Archive(format!(
                        "{} is the archive of another store (id {owner}, says {owner_object}), not of this one (id \
                         {id}, in {}): two stores cannot share a bucket prefix (each would delete the other's \
                         objects). Give this store its own storage.archive_url; if this store replaces the one that \
                         wrote it (a checkpoint restored in its place), delete {owner_object}: it then deletes the \
                         objects that store wrote since this one's state as leftovers (its manifest does not name \
                         them), and reads none of the partitions whose objects that store replaced since, unless \
                         the bucket keeps versions to bring them back",
                        bucket.url,
                        self.db.path().join(STORE_ID_FILE).display()
                    )));
                }
                self.check_bucket_generation(bucket, false)
            }
            None => {
                let named = self.manifest_rels();
                let objects = bucket.list_parts()?;
                if named.is_empty() {
                    if let Some(part) = objects.first() {
                        return Err(Error::Archive(format!(
                            "{} holds archive objects ({part} among them) but this store has archived nothing: \
                             another store's archive? Give this store its own storage.archive_url (or, if they are \
                             what this store's first spill left when it was cut short, delete them)",
                            bucket.url
                        )));
                    }
                } else if !named.iter().any(|rel| objects.contains(&bucket.object_of(rel))) {
                    // Not a prefix an older build wrote (no owner object, this store's objects):
                    // another bucket, or one that lost its objects. Claimed, it would take new
                    // spills while the archived partitions answer errors, the loss unsaid. Every
                    // file the manifest names is missing from it (QA61 F1: the count stayed 0).
                    self.archive_missing.store(named.len() as u64, Ordering::Relaxed);
                    return Err(Error::Archive(format!(
                        "{url} holds none of the {n} archive objects this store's manifest names ({url}/{first} \
                         among them), and no owner object: is storage.archive_url (with storage.archive_s3_endpoint) \
                         the bucket this store spilled to? Nothing is archived until it is (the partitions stay in \
                         RocksDB). If the bucket lost them (emptied, or an S3 service without persistence restarted), \
                         their readings are lost, but for the local copies reads left in archive_dir; to archive into \
                         {url} anyway, write this store's id as its owner object: printf '{id}\\n' | aws s3 cp - \
                         {owner_object}{endpoint}",
                        url = bucket.url,
                        endpoint = bucket.endpoint.as_ref().map(|e| format!(" --endpoint-url {e}")).unwrap_or_default(),
                        n = named.len(),
                        first = named[0],
                    )));
                }
                if !bucket.create_small(OWNER_FILE, format!("{id}\n").into_bytes())? {
                    // Another store claimed the prefix since it was read.
                    return self.claim_bucket(bucket);
                }
                tracing::info!(owner_object = %owner_object, id = %id, "claimed the archive's bucket prefix for this store");
                // An owner object deleted to have this store take the prefix over (a checkpoint
                // restored in place) says the generation of the store that wrote it goes with it.
                self.check_bucket_generation(bucket, true)
            }
        }
    }

    /// [`Store::check_generation`] for a bucket prefix: its object [`GENERATION_FILE`], at each
    /// spill run.
    fn check_bucket_generation(&self, bucket: &object::Bucket, taken: bool) -> Result<()> {
        let ours = read(&self.manifest).generation;
        let object = format!("{}/{GENERATION_FILE}", bucket.url);
        let found = if taken { None } else { bucket.get_small(GENERATION_FILE)? };
        let theirs = match found {
            Some(bytes) => match Generation::parse(&String::from_utf8_lossy(&bytes)) {
                Some(g) => Some(g),
                None => {
                    return Err(Error::Archive(format!(
                        "{object} holds {:?}, not an archive generation (a number and a tag): delete it, and the next \
                         spill run writes this store's",
                        String::from_utf8_lossy(&bytes).chars().take(64).collect::<String>()
                    )))
                }
            },
            None => None,
        };
        match theirs {
            Some(g) if g.count > ours.count => Err(Error::Archive(format!(
                "{} is at generation {} ({object} says so: the manifest of the store that archived there changed {} \
                 times), and this store's manifest at {}: this store's RocksDB directory is an older copy of that \
                 store (restored from a copy of a stopped store)? Its manifest may name objects replaced since, and it \
                 would delete the objects written since as leftovers: nothing is archived meanwhile (the partitions \
                 stay in RocksDB). To run it on this prefix (the partitions whose objects were replaced since \
                 unreadable unless the bucket keeps versions to bring them back, the newer objects deleted), delete \
                 {object}",
                bucket.url, g.count, g.count, ours.count
            ))),
            Some(g) if g == ours => Ok(()),
            Some(g) => {
                // Behind the store or beside it: brought up after a crash between a commit and
                // the object; refused when the prefix lacks objects the manifest names, or
                // another run changed it ([`older_archive`]).
                let objects = bucket.list_parts()?;
                let rels = self.manifest_rels();
                let gone = rels.iter().filter(|rel| !objects.contains(&bucket.object_of(rel))).count();
                if gone > 0 || g.diverged(ours) {
                    return Err(older_archive(&bucket.url, g.count, &object, ours.count, gone, rels.len()));
                }
                bucket.put_small(GENERATION_FILE, ours.text().into_bytes())
            }
            None => bucket.put_small(GENERATION_FILE, ours.text().into_bytes()),
        }
    }

    /// The files the manifest names, relative to the archive root.
    fn manifest_rels(&self) -> Vec<String> {
        let catalog = read(&self.catalog);
        let names: HashMap<u32, (&Arc<str>, PartitionSize)> =
            catalog.by_name.iter().map(|(n, ti)| (ti.id, (n, ti.partition))).collect();
        let manifest = read(&self.manifest);
        let named = manifest.entries.iter().filter_map(|(&(t, p), e)| {
            let (name, size) = names.get(&t)?;
            Some(rel_path(name, *size, i64::from(p), e.part))
        });
        named.collect()
    }

    /// Deletes every file under the archive root (and, with `bucket`, in the bucket) that the
    /// manifest does not name (leftovers of interrupted spills, superseded parts); returns how
    /// many.
    fn remove_leftovers(&self, cfg: &ArchiveConfig, bucket: bool) -> Result<usize> {
        let root = &cfg.root;
        std::fs::create_dir_all(root).map_err(io_err("create", root))?;
        let rels = self.manifest_rels();
        let wanted: std::collections::HashSet<PathBuf> = rels.iter().map(|r| root.join(r)).collect();
        let mut removed = 0;
        if let Some(bucket) = self.bucket.as_ref().filter(|_| bucket) {
            let wanted: std::collections::HashSet<_> = rels.iter().map(|r| bucket.object_of(r)).collect();
            let objects = bucket.list_parts()?;
            let held: std::collections::HashSet<_> = objects.iter().collect();
            let missing: Vec<String> = wanted.iter().filter(|o| !held.contains(o)).map(ToString::to_string).collect();
            self.archive_missing.store(missing.len() as u64, Ordering::Relaxed);
            let mut deleted = Vec::new();
            if !missing.is_empty() {
                // As a local archive's start says it of its files.
                tracing::error!(
                    missing = missing.len(), named = wanted.len(), url = %bucket.url,
                    objects = ?missing.iter().take(5).collect::<Vec<_>>(),
                    "archive objects this store's manifest names are not in its bucket: reads of their partitions \
                     fail, and their hours are not rolled up, until they are put back"
                );
            }
            for object in objects {
                if !wanted.contains(&object) {
                    bucket.delete_object(&object)?;
                    deleted.push(object.to_string());
                }
            }
            if !deleted.is_empty() {
                tracing::info!(
                    removed = deleted.len(), url = %bucket.url, objects = ?deleted,
                    "removed archive objects the manifest does not name"
                );
            }
            removed += deleted.len();
        }
        if self.bucket.is_none() {
            let missing = wanted.iter().filter(|f| !f.exists()).count();
            self.archive_missing.store(missing as u64, Ordering::Relaxed);
        }
        let local_before = removed;
        // The directories of named files stay, a missing file's too, for it to be put back into
        // (QA47 N2: `mv part-0.parquet` into the directory the start's ERROR named failed, the
        // sweep having removed it empty).
        let keep: std::collections::HashSet<&Path> =
            wanted.iter().filter_map(|f| f.parent()).flat_map(|d| [Some(d), d.parent()]).flatten().collect();
        for (table, partitions) in archive_tree(root)? {
            for (part_dir, files) in partitions {
                for f in files {
                    let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    let ours = name.starts_with("part-")
                        && [".parquet", ".parquet.tmp", ".parquet.download"].iter().any(|e| name.ends_with(e));
                    // A reader's download from the bucket is named by no manifest entry until
                    // its rename: a recent one is in flight (its reader's read would fail).
                    let in_flight = name.ends_with(".parquet.download") && modified_within(&f, DOWNLOAD_IN_FLIGHT);
                    if ours && !in_flight && !wanted.contains(&f) {
                        match std::fs::remove_file(&f) {
                            Ok(()) => removed += 1,
                            // A download renamed into place since the listing.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_err("remove", &f)(e)),
                        }
                    }
                }
                if !keep.contains(part_dir.as_path()) {
                    let _ = std::fs::remove_dir(&part_dir);
                }
            }
            if !keep.contains(table.as_path()) {
                let _ = std::fs::remove_dir(&table);
            }
        }
        if removed > local_before {
            tracing::info!(
                removed = removed - local_before, root = %root.display(),
                "removed archive files the manifest does not name"
            );
        }
        Ok(removed)
    }

    /// Spills one partition: see the module docs for the steps.
    fn spill_partition(&self, cfg: &ArchiveConfig, name: &str, ti: &TableInfo, p: i32) -> Result<SpilledPartition> {
        self.write_lock.lock().unwrap_or_else(PoisonError::into_inner).spilling = Some((ti.id, p));
        // From here on, writes into the partition wait for the gate; the ones buffered before go
        // to RocksDB before the spill reads it (a flush during the spill would otherwise put
        // them under its range delete).
        let result = self.flush_write_buffer().and_then(|()| self.spill_gated(cfg, name, ti, p));
        self.write_lock.lock().unwrap_or_else(PoisonError::into_inner).spilling = None;
        self.spill_done.notify_all();
        result
    }

    fn spill_gated(&self, cfg: &ArchiveConfig, name: &str, ti: &TableInfo, p: i32) -> Result<SpilledPartition> {
        let previous = read(&self.manifest).entries.get(&(ti.id, p)).copied();
        let part = previous.map_or(Ok(0), |e| e.part.checked_add(1).ok_or(Error::IdsExhausted("archive part")))?;
        let dir = partition_dir(&cfg.root, name, ti.partition, i64::from(p));
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let path = dir.join(part_name(part));
        let tmp = dir.join(format!("{}.tmp", part_name(part)));
        let schema = read(&self.catalog).schema(ti.id).clone();
        let mut old = match previous {
            Some(e) => {
                let rel = rel_path(name, ti.partition, i64::from(p), e.part);
                let local = self.local_file(cfg, &rel)?;
                // The file is the partition's (its rows and times the manifest's), or the rewrite
                // would take another's rows into the partition and delete its own (QA61 F2).
                self.again_if_downloaded(&rel, &local, || self.archive_file_meta(&local, e))?;
                Some(file::DeviceRows::open(&local).map_err(file_err)?)
            }
            None => None,
        };
        // Removed if the spill fails before it is renamed or uploaded (a full disk would
        // otherwise keep it, and starve RocksDB of the space, until the next sweep).
        let mut tmp_left = TmpFile(Some(&tmp));
        let mut writer = file::PartWriter::create(&tmp, &schema, cfg.file).map_err(file_err)?;
        let hot = self.partition_devices(ti.id, p)?;
        let mut rows_from_archive = 0u64;
        let mut hot = hot.into_iter().peekable();
        let mut written_devices = 0usize;
        loop {
            let next_old = match &mut old {
                Some(o) => o.peek_device().map_err(file_err)?,
                None => None,
            };
            // The smaller name goes first; a device in both takes its archived rows, then
            // RocksDB's.
            let from_old = match (&next_old, hot.peek()) {
                (None, None) => break,
                (Some(o), Some((h, _))) => o.as_ref() <= h.as_str(),
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            let mut device = String::new();
            let mut readings = Vec::new();
            if let (true, Some(o)) = (from_old, old.as_mut()) {
                if let Some((d, rows)) = o.next_device().map_err(file_err)? {
                    rows_from_archive += rows.len() as u64;
                    device = d.to_string();
                    readings = rows;
                }
            }
            if hot.peek().is_some_and(|(h, _)| !from_old || *h == device) {
                if let Some((d, id)) = hot.next() {
                    readings.extend(self.device_partition_readings(ti.id, p, id)?);
                    device = d;
                }
            }
            // The archived readings first, RocksDB's after: at equal times the latter win.
            codec::sort_dedup_last_wins(&mut readings);
            writer.device(&device, &readings).map_err(file_err)?;
            written_devices += 1;
            if written_devices == 1 && cfg.abort_at == Some(SpillStep::MidFile) {
                std::process::abort();
            }
        }
        let (rows, min_ts, max_ts) = (writer.rows, writer.min_ts, writer.max_ts);
        let bytes = writer.finish().map_err(file_err)?;
        if cfg.abort_at == Some(SpillStep::FileSynced) {
            std::process::abort();
        }
        match &self.bucket {
            // In the bucket once the upload returns; the local copy is not kept.
            Some(bucket) => {
                bucket.upload(&tmp, &rel_path(name, ti.partition, i64::from(p), part))?;
                tmp_left.0 = None;
                std::fs::remove_file(&tmp).map_err(io_err("remove", &tmp))?;
            }
            None => {
                std::fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))?;
                tmp_left.0 = None;
                sync_dir(&dir)?;
            }
        }
        if cfg.abort_at == Some(SpillStep::FileRenamed) {
            std::process::abort();
        }
        let entry = ArchivedPartition { part, rows, bytes, min_ts, max_ts };
        // Readers merge the new file with RocksDB from here on: the same readings either way.
        write(&self.manifest).entries.insert((ti.id, p), entry);
        let mut wb = WriteBatch::default();
        wb.put_cf(cf(&self.db, CF_ARCHIVE), keys::archive_key(ti.id, p), encode_entry(&entry));
        // The late readings, if it waited for them, are in the file.
        wb.delete_cf(cf(&self.db, CF_CATALOG), keys::archive_late_key(ti.id, p));
        let deleted = self.delete_partition(&mut wb, ti, p)?;
        let generation = self.next_generation(&mut wb);
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        if let Err(e) = self.db.write_opt(wb, &opts) {
            // Not recorded: readers go back to the previous file (or RocksDB alone).
            let mut m = write(&self.manifest);
            match previous {
                Some(prev) => m.entries.insert((ti.id, p), prev),
                None => m.entries.remove(&(ti.id, p)),
            };
            return Err(db_err("record archived partition")(e));
        }
        self.stats.latest_operands.fetch_add(deleted.map_or(0, |(_, n)| n), Ordering::Relaxed);
        if cfg.abort_at == Some(SpillStep::Committed) {
            // Before the generation file too: the next start finds it behind the store.
            std::process::abort();
        }
        self.mark_generation(cfg, generation);
        // Still gated: no write into the partition comes before the range is deleted again.
        if let Some((range, _)) = deleted {
            self.free_deleted_ranges(&[range]);
        }
        // The superseded part stays until the next run's leftover sweep: a reader may have
        // looked it up just before the switch.
        let object =
            self.bucket.as_ref().map(|b| format!("{}/{}", b.url, rel_path(name, ti.partition, i64::from(p), part)));
        Ok(SpilledPartition {
            table: name.to_string(),
            partition: i64::from(p),
            rows,
            rows_from_archive,
            bytes,
            path,
            object,
        })
    }

    /// The devices with readings in partition `p` of table `table` in RocksDB, as (name, id),
    /// sorted by name: one seek per device, names by one multi-get.
    fn partition_devices(&self, table: u32, p: i32) -> Result<Vec<(String, u64)>> {
        let Some((from, to)) = keys::partition_range(table, p) else { return Ok(Vec::new()) };
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(to.to_vec());
        let mut it = self.db.raw_iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts);
        it.seek(from);
        let mut ids = Vec::new();
        while let Some(k) = it.key() {
            let key = BucketKey::decode(&k[..k.len().min(keys::BUCKET_KEY_LEN)])
                .ok_or_else(|| Error::Corrupt { what: "bucket key", detail: format!("{} bytes", k.len()) })?;
            ids.push(key.device);
            let Some(next) = key.device.checked_add(1) else { break };
            it.seek(BucketKey { device: next, hour: i32::MIN, ..key }.encode());
        }
        it.status().map_err(db_err("scan partition devices"))?;
        let names = self.db.batched_multi_get_cf(
            cf(&self.db, CF_REGISTRY),
            ids.iter().map(|id| keys::device_id_key(*id)).collect::<Vec<_>>().iter(),
            true,
        );
        let mut out = Vec::with_capacity(ids.len());
        for (id, name) in ids.into_iter().zip(names) {
            let name = name.map_err(db_err("get device names"))?.ok_or_else(|| Error::Corrupt {
                what: "registry",
                detail: format!("device id {id} has buckets but no name"),
            })?;
            let name = String::from_utf8(name.to_vec()).map_err(|_| Error::Corrupt {
                what: "registry",
                detail: format!("name of device {id} is not UTF-8"),
            })?;
            out.push((name, id));
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Every reading RocksDB holds for `device` in partition `p` of `table`, in time order
    /// (its hours' buckets and any sub-buckets, merged).
    fn device_partition_readings(&self, table: u32, p: i32, device: u64) -> Result<Vec<Reading>> {
        let lo = BucketKey { table, partition: p, device, hour: i32::MIN };
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(lo.encode()[..keys::BUCKET_KEY_LEN - 4].to_vec()));
        let mut readings = Vec::new();
        for item in self.db.iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts, IteratorMode::Start) {
            let (_, v) = item.map_err(db_err("scan device partition"))?;
            codec::decode(&v, &mut readings).map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
        }
        codec::sort_dedup_last_wins(&mut readings);
        Ok(readings)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn entries_round_trip_and_are_37_bytes() {
        let e = ArchivedPartition { part: 3, rows: 8640, bytes: 123_456, min_ts: -5, max_ts: 1_700_000_000_000 };
        let v = encode_entry(&e);
        assert_eq!(v.len(), 37);
        assert_eq!(v[0], 1);
        assert_eq!(&v[1..5], &[0, 0, 0, 3]);
        assert_eq!(decode_entry(&v).unwrap(), e);
        assert!(decode_entry(&v[..36]).is_err());
        let mut v2 = v;
        v2[0] = 2;
        assert_eq!(decode_entry(&v2), Err("version 2".to_string()));
    }

    #[test]
    fn names_and_labels_are_hive_style() {
        assert_eq!(table_dir("fleet.readings"), "table=fleet.readings");
        assert_eq!(table_dir("acme/t x"), "table=acme%2Ft%20x");
        // 2024-01-31T05:00Z is hour 474,077, day 19,753, month 648.
        assert_eq!(partition_label(PartitionSize::Hour, 474_077), "2024-01-31T05");
        assert_eq!(partition_label(PartitionSize::Day, 19_753), "2024-01-31");
        assert_eq!(partition_label(PartitionSize::Month, 648), "2024-01");
        assert_eq!(partition_label(PartitionSize::Day, -1), "1969-12-31");
        assert_eq!(
            partition_dir(Path::new("/a"), "t", PartitionSize::Day, 0),
            PathBuf::from("/a/table=t/partition=1970-01-01")
        );
    }

    /// The file's text reads back; a count alone (a file of no tag) has tag 0; two runs to one
    /// count by other commits have diverged, a file of no tag never does.
    #[test]
    fn generations_read_back_and_tell_two_runs_apart() {
        let g = Generation::default().next().next();
        assert_eq!(g.count, 2);
        assert_ne!(g.tag, 0);
        assert_eq!(Generation::parse(&g.text()), Some(g));
        assert_eq!(Generation::decode(&g.encode()), Some(g));
        assert_eq!(Generation::parse("7\n"), Some(Generation { count: 7, tag: 0 }));
        for bad in ["", "x", "7 zz", "7 1 2", "-1"] {
            assert_eq!(Generation::parse(bad), None, "{bad:?}");
        }
        let other = Generation { count: 2, tag: if g.tag == 7 { 8 } else { 7 } };
        assert!(other.diverged(g));
        assert!(!g.diverged(g));
        assert!(!Generation { count: 2, tag: 0 }.diverged(g));
        assert!(!Generation { count: 1, tag: 5 }.diverged(g));
    }
}
