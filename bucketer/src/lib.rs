//! The storage stage of Hourglass: hour buckets, latest values, dead letters, the table catalog
//! and the device registry, in one RocksDB database.
//!
//! `bucketer` is the only crate that touches RocksDB. Other crates see [`Store`] with readings,
//! table and device names and [`model::TimeRange`]s — never key bytes. It owns:
//! - [`keys`]: every key layout of every column family;
//! - [`auth`]: API tokens by hash and their per-table permissions ([`Store::token_access`]);
//! - [`schema`]: table schemas (field name → type, version, strictness) and the write path's
//!   check of each reading against them;
//! - [`catalog`]: table definitions (partition size, hot retention, schema), their persisted format, and
//!   retention, which drops expired time partitions with one range delete each
//!   ([`Store::define_table`], [`Store::drop_expired_partitions`]);
//! - [`codec`]: the bucket value format (versioned) and the merge logic;
//! - [`store`]: column-family names and options;
//! - [`writer`]: the loop that turns ingest batches into one WriteBatch each and acks them.
//! - [`stats`]: the commit-latency histogram and the RocksDB properties worth watching;
//! - device search by name prefix ([`Store::devices_with_data`]);
//! - [`registry`]: device records (kind, tags, place in the group hierarchy), their persisted
//!   format, and the tag and group indexes ([`Store::set_device`], [`Store::find_devices`]).
//! - [`outliers`]: devices past a readings-per-hour threshold overflow into per-minute
//!   sub-buckets ([`Store::is_outlier`]);
//! - [`counters`]: approximate message counts per table and hour, written in batches
//!   ([`Store::count_messages`], [`Store::message_counts`]);
//! - [`wbuf`]: the optional write buffer of open hour buckets (one record an ingest batch,
//!   flushed as one operand a device-hour), holding readings as rows (`rows`: fields named by
//!   ids, encoded as a bucket once, at the flush);
//! - [`rollups`]: the roll-up work queue, the watermark, the exact per-device roll-up records
//!   (hour, day, month) and their persisted format ([`Store::process_rollups`],
//!   [`Store::rollups`]).
//!
//! Writes never read: each ingest batch becomes one merge operand per device-hour, all in one
//! WriteBatch with the WAL on; the merge operator resolves operands on read and in compaction
//! (sort by ts, last write wins). The same WriteBatch marks every touched device-hour dirty
//! (the roll-up work queue), puts a device's newest reading into `latest` when it marks the
//! device's newest hour of the batch (not on every write: see [`Store::latest`]), and raises
//! the stored max event time when the batch holds a newer reading.
//!
//! ```no_run
//! use bucketer::{Store, StoreConfig};
//! use model::{DeviceReading, Reading, TimeRange};
//! let store = Store::open(std::path::Path::new("/tmp/hg"), StoreConfig::default())?;
//! let r = DeviceReading {
//!     table: "fleet.readings".into(),
//!     device: "truck_1".into(),
//!     reading: Reading::new(1_000, vec![("speed".into(), 42.0)]),
//! };
//! store.write(vec![r], &[])?;
//! let back = store.read_range("fleet.readings", "truck_1", TimeRange::new(0, 2_000).unwrap())?;
//! assert_eq!(back.unwrap().len(), 1);
//! # Ok::<(), bucketer::Error>(())
//! ```

pub mod archive;
pub mod auth;
pub mod catalog;
mod checkpoint;
pub mod codec;
pub mod counters;
mod devices;
pub mod keys;
mod open_marks;
pub mod outliers;
mod prepared;
pub mod registry;
pub mod rollups;
mod rows;
pub mod schema;
mod series_table;
mod sharded;
pub mod stats;
pub mod store;
pub mod wbuf;
pub mod writer;

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};

use model::{DeadLetter, DeadLetterReason, DeviceReading, Hour, PartitionSize, Reading, SourceOffset, TimeRange};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions, DB};

use catalog::Catalog;
pub use catalog::{RollupRetention, TableDefinition, TableInfo, TableSpec};
pub use checkpoint::{delete_checkpoint, list_checkpoints, CheckpointEntry, CheckpointSummary, MISSING_ARCHIVE_FILES};
pub use devices::{DeviceListing, MAX_EXAMINED_NAMES};
use keys::{BucketKey, DeadLetterKey, DirtyKey};
pub use registry::{DeviceFilter, DevicePage, DeviceRecord};
pub use rollups::RollupFloor;
pub use rollups::RollupSummary;
use sharded::NameMap;
use store::{cf, CF_BUCKETS, CF_CATALOG, CF_DEAD_LETTERS, CF_DIRTY, CF_LATEST, CF_OFFSETS, CF_REGISTRY, CF_WBUF};
pub use store::{
    default_background_jobs, Compaction, DbOptions, DEFAULT_MAX_WAL_BYTES, DEFAULT_SUBCOMPACTIONS,
    MAX_DEFAULT_BACKGROUND_JOBS,
};
pub use wbuf::{Flusher, WriteBufferConfig, DEFAULT_WRITE_BUFFER_MIB};

/// Errors of the storage stage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be opened.
    #[error("opening RocksDB at {path}: {source}")]
    Open {
        /// Database directory.
        path: String,
        /// RocksDB's error.
        source: rocksdb::Error,
    },
    /// A RocksDB operation failed.
    #[error("RocksDB {op}: {source}")]
    Db {
        /// What was being done.
        op: &'static str,
        /// RocksDB's error.
        source: rocksdb::Error,
    },
    /// Writing or reading the archive failed.
    #[error("archive: {0}")]
    Archive(String),
    /// A checkpoint could not be written ([`Store::checkpoint`]).
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A checkpoint to delete is open as a store by a process ([`delete_checkpoint`]).
    #[error(
        "checkpoint {name} is open as a store by process {pid} (serve --data-dir on it, in place): stop that \
         process first, or open a copy of a checkpoint rather than the checkpoint itself"
    )]
    CheckpointInUse {
        /// The checkpoint's name.
        name: String,
        /// The process holding its RocksDB lock.
        pid: i32,
    },
    /// A stored value could not be decoded.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which record.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A reading's time lies outside what the keys can hold.
    #[error("timestamp {0} is outside the storable range")]
    TimeOutOfRange(i64),
    /// An id space is used up.
    #[error("{0} id space exhausted")]
    IdsExhausted(&'static str),
    /// A table definition asks for something the store cannot hold.
    #[error("invalid definition of table `{name}`: {detail}")]
    InvalidTable {
        /// Table name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// A source position cannot be stored (e.g. an over-long topic name).
    #[error("invalid source position: {0}")]
    InvalidSource(String),
    /// The store's directory was deleted or replaced while the store was open: RocksDB goes on
    /// writing into the deleted files, which a restart does not find.
    #[error(
        "the store's directory {path} was deleted or replaced while the store was open: what is written now is lost \
         at the next start, so nothing is acknowledged; restart Hourglass once its data_dir is what it should be"
    )]
    DirectoryGone {
        /// The RocksDB directory.
        path: String,
    },
    /// A device record, tag, group path, filter or cursor is malformed.
    #[error("{0}")]
    InvalidRegistryInput(String),
    /// A table definition declares a field with another type than the table's schema gives it.
    #[error("table `{table}` has field `{field}` of type {existing}; the request declares it {requested}")]
    SchemaConflict {
        /// Table name.
        table: String,
        /// Field name.
        field: String,
        /// The type in the schema.
        existing: model::FieldType,
        /// The type asked for.
        requested: model::FieldType,
    },
    /// A thread of the store could not be started.
    #[error("starting the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The table exists with other settings than the ones asked for.
    #[error("{}", catalog::exists_message(name, existing, requested))]
    TableExists {
        /// Table name.
        name: String,
        /// Its settings.
        existing: catalog::Settings,
        /// The settings asked for.
        requested: catalog::Settings,
    },
}

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn db_err(op: &'static str) -> impl FnOnce(rocksdb::Error) -> Error {
    move |source| Error::Db { op, source }
}

/// Store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// fsync the WAL on every WriteBatch. Off, a commit survives a process crash (kill -9) but
    /// not a power loss; on, it survives both.
    pub sync_wal: bool,
    /// Partition size given to tables created on first write.
    pub default_partition: PartitionSize,
    /// RocksDB tuning.
    pub db: DbOptions,
    /// Write the pending message counts once this many are pending ([`counters`]).
    pub counter_flush_messages: u64,
    /// … or once the oldest pending count is this old.
    pub counter_flush_interval: std::time::Duration,
    /// Readings a device may write in one hour of a table before it is flagged as an outlier
    /// and its hours overflow into per-minute sub-buckets ([`outliers`]).
    pub bucket_max_readings: u64,
    /// Threads a roll-up pass reads and folds buckets on (at least 1; they start at the
    /// priority of the thread that runs the pass). Default: the machine's cores, at most 4.
    pub rollup_workers: usize,
    /// Where partitions past their hot retention go ([`archive`]); `None`: they are dropped.
    pub archive: Option<archive::ArchiveConfig>,
    /// Buffer open hour buckets in memory, one log record a batch ([`wbuf`]); `None`: every
    /// batch writes its operands, dirty marks and latest values directly.
    pub write_buffer: Option<WriteBufferConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            sync_wal: false,
            default_partition: PartitionSize::Day,
            db: DbOptions::default(),
            counter_flush_messages: 10_000,
            counter_flush_interval: std::time::Duration::from_secs(1),
            bucket_max_readings: 20_000,
            rollup_workers: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            archive: None,
            write_buffer: None,
        }
    }
}

/// Most dead letters one [`Store::dead_letters_page`] call examines.
pub const MAX_EXAMINED_DEAD_LETTERS: usize = 100_000;
/// Stored bytes of dead letters after which one [`Store::dead_letters_page`] call examines no
/// more (it always examines one): a letter keeps up to `mqtt.max_payload_bytes` (1 MiB by
/// default), so a count alone would let one page read and answer gigabytes.
pub const MAX_EXAMINED_DEAD_LETTER_BYTES: usize = 16 << 20;

/// Which dead letters [`Store::dead_letters_page`] lists; every member given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this reason ([`model::DeadLetterReason::as_str`]).
    pub reason: Option<String>,
    /// Only sources starting with this (a topic or its start, `kafka:{topic}/{partition}@`).
    pub source_prefix: Option<String>,
    /// Only letters listed after this one (older in the newest-first order): the previous
    /// page's [`DeadLetterPage::next`].
    pub before: Option<DeadLetterKey>,
}

impl DeadLetterFilter {
    /// Whether `letter` passes the reason and source filters.
    fn admits(&self, letter: &StoredDeadLetter) -> bool {
        self.reason.as_ref().is_none_or(|r| *r == letter.reason)
            && self.source_prefix.as_ref().is_none_or(|p| letter.source.starts_with(p.as_str()))
    }
}

/// One page of [`Store::dead_letters_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    /// The letters, newest first.
    pub letters: Vec<StoredDeadLetter>,
    /// The last letter examined, where the next page starts; `None` when no letter is left.
    pub next: Option<DeadLetterKey>,
}

/// What [`Store::expire_dead_letters`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpiredDeadLetters {
    /// How many dead letters.
    pub count: u64,
    /// When the oldest of them was received, epoch ms; `None` when there were none.
    pub oldest_ms: Option<i64>,
}

/// A `dead_letters` key read back; one of another length is [`Error::Corrupt`].
fn dead_letter_key(k: &[u8]) -> Result<DeadLetterKey> {
    DeadLetterKey::decode(k)
        .ok_or_else(|| Error::Corrupt { what: "dead letter key", detail: format!("{} bytes", k.len()) })
}

/// The number of the next dead letter as the store recorded it ([`keys::DEAD_LETTER_SEQ_KEY`]);
/// 0 when it never did.
fn load_next_dead_letter_seq(db: &DB) -> Result<u64> {
    match db.get_cf(cf(db, CF_CATALOG), keys::DEAD_LETTER_SEQ_KEY).map_err(db_err("get dead letter number"))? {
        None => Ok(0),
        Some(v) => <[u8; 8]>::try_from(v.as_slice()).map(u64::from_be_bytes).map_err(|_| Error::Corrupt {
            what: "dead letter number",
            detail: format!("{} bytes, expected 8", v.len()),
        }),
    }
}

/// A stored dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// Receive time, epoch ms.
    pub received_ms: i64,
    /// Sequence number (unique, increasing).
    pub seq: u64,
    /// The reason label (`model::DeadLetterReason::as_str`).
    pub reason: String,
    /// Human-readable detail.
    pub detail: String,
    /// Source ([`model::DeadLetter::source`]).
    pub source: String,
    /// The rejected payload.
    pub payload: Vec<u8>,
}

/// Counters of what the store has written since it opened, and the roll-up stage's progress.
#[derive(Debug)]
pub struct StoreStats {
    /// Readings committed.
    pub readings: AtomicU64,
    /// WriteBatches committed.
    pub batches: AtomicU64,
    /// Merge operands written to `buckets`.
    pub bucket_operands: AtomicU64,
    /// Dirty marks written by writes and write-buffer flushes: one per device-hour and batch
    /// (or flush), except for device-hours of open hours already marked.
    pub dirty_marks: AtomicU64,
    /// Merge operands written to `latest`: by writes and flushes, one per device whose newest
    /// device-hour they mark (see [`Store::latest`]), and by roll-up passes, spills and
    /// retention, one per device-hour they settle.
    pub latest_operands: AtomicU64,
    /// Dead letters committed, by reason (index of `DeadLetterReason::ALL`).
    pub dead_letters: [AtomicU64; DeadLetterReason::ALL.len()],
    /// The schema's dead letters (the store's own refusals), by the kind of source whose
    /// reading was refused (index of [`SCHEMA_SOURCE_KINDS`]): the intakes count theirs as they
    /// decode, before a table's schema is checked, and add these to their own.
    pub schema_dead_letters: [AtomicU64; SCHEMA_SOURCE_KINDS.len()],
    /// Time from the first commit attempt of a WriteBatch until it is durable (retries
    /// included), one observation per committed batch.
    pub commit_latency: stats::LatencyHistogram,
    /// Dirty hours the roll-up stage has recomputed (hour and day records stored).
    pub rollup_hours_processed: AtomicU64,
    /// Of those, hours left as they were because their day is past their table's roll-up
    /// retention ([`RollupSummary::past_rollup_retention`]), or because they were rolled up
    /// before their readings were deleted for good ([`RollupSummary::kept_past_retention`]).
    pub rollup_hours_past_retention: AtomicU64,
    /// Days of devices past their table's hour roll-up retention made again from their
    /// buckets ([`RollupSummary::days_from_buckets`]).
    pub rollup_days_from_buckets: AtomicU64,
    /// Start (epoch ms) of the oldest hour still marked dirty, as of the last roll-up pass and
    /// the writes since; `i64::MAX` when none is.
    pub rollup_oldest_dirty_hour_ms: AtomicI64,
    /// The largest event time committed (epoch ms), the base of the roll-up watermark;
    /// `i64::MIN` before the first reading.
    pub max_event_ts: AtomicI64,
    /// The allowed lateness of the last roll-up pass, ms (0 before the first).
    pub rollup_allowed_lateness_ms: AtomicI64,
    /// Partitions written to the archive (first spills and rewrites with late readings).
    pub archive_partitions_spilled: AtomicU64,
    /// Rows in the archive files written.
    pub archive_rows_spilled: AtomicU64,
    /// Bytes of the archive files written.
    pub archive_bytes_written: AtomicU64,
    /// Partition spills that failed (the partition stayed in RocksDB).
    pub archive_spill_failures: AtomicU64,
    /// Reads of one device's rows from an archive file (raw reads of archived partitions, and
    /// roll-ups of archived hours: one a device-day), files pruned by their time range aside.
    pub archive_device_reads: AtomicU64,
    /// Spill runs ([`Store::spill_expired_partitions`]) that failed whole: the archive's bucket
    /// missing, not answering or another store's; nothing archived or deleted.
    pub archive_run_failures: AtomicU64,
    /// Partitions deleted for good: past the cold retention, or past the hot one without an
    /// archive.
    pub partitions_deleted: AtomicU64,
    /// Flushes of the write buffer ([`wbuf`]).
    pub write_buffer_flushes: AtomicU64,
    /// Failed attempts in a row at committing the writer's current batch (a full disk, an I/O
    /// error); 0 once it commits. Set by the writer ([`writer::commit_with_retry`]).
    pub commit_failures_in_a_row: AtomicU64,
}

impl Default for StoreStats {
    fn default() -> Self {
        StoreStats {
            readings: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bucket_operands: AtomicU64::new(0),
            dirty_marks: AtomicU64::new(0),
            latest_operands: AtomicU64::new(0),
            dead_letters: Default::default(),
            schema_dead_letters: Default::default(),
            commit_latency: stats::LatencyHistogram::default(),
            rollup_hours_processed: AtomicU64::new(0),
            rollup_hours_past_retention: AtomicU64::new(0),
            rollup_days_from_buckets: AtomicU64::new(0),
            rollup_oldest_dirty_hour_ms: AtomicI64::new(i64::MAX),
            rollup_allowed_lateness_ms: AtomicI64::new(0),
            max_event_ts: AtomicI64::new(i64::MIN),
            archive_partitions_spilled: AtomicU64::new(0),
            archive_rows_spilled: AtomicU64::new(0),
            archive_bytes_written: AtomicU64::new(0),
            archive_spill_failures: AtomicU64::new(0),
            archive_device_reads: AtomicU64::new(0),
            archive_run_failures: AtomicU64::new(0),
            partitions_deleted: AtomicU64::new(0),
            write_buffer_flushes: AtomicU64::new(0),
            commit_failures_in_a_row: AtomicU64::new(0),
        }
    }
}

impl StoreStats {
    /// How far the roll-ups lag, in event time: the largest event time committed minus the
    /// start of the oldest hour still dirty, in ms; 0 when no hour is dirty.
    pub fn rollup_lag_ms(&self) -> i64 {
        let oldest = self.rollup_oldest_dirty_hour_ms.load(Ordering::Relaxed);
        let newest = self.max_event_ts.load(Ordering::Relaxed);
        if oldest == i64::MAX || newest == i64::MIN {
            0
        } else {
            newest.saturating_sub(oldest).max(0)
        }
    }

    /// How long the oldest dirty hour has been closed and not rolled up, in event time: the
    /// largest event time committed minus that hour's end and the allowed lateness (of the last
    /// roll-up pass), in ms; 0 while it is still open, or none is dirty. Where the roll-ups keep
    /// up, 0 but between an hour's closing and the pass that takes it, and after a late reading
    /// into a closed hour until the next pass; [`StoreStats::rollup_lag_ms`] counts the open
    /// hour too, so it reaches an hour and the lateness every hour.
    pub fn rollup_overdue_ms(&self) -> i64 {
        let lateness = self.rollup_allowed_lateness_ms.load(Ordering::Relaxed);
        self.rollup_lag_ms().saturating_sub(model::HOUR_MS).saturating_sub(lateness).max(0)
    }
}

/// What one [`Store::write`] committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Readings written.
    pub readings: usize,
    /// Distinct device-hours (bucket merge operands) written.
    pub buckets: usize,
    /// Dead letters written.
    pub dead_letters: usize,
    /// The dead letters of those that the store added: readings or fields a table's schema
    /// refused.
    pub rejected: Vec<DeadLetter>,
}

/// What one writer at a time may change: sequence numbers handed out under the write lock.
#[derive(Debug, Default)]
struct WriterState {
    /// Next dead-letter sequence number.
    dead_letter_seq: u64,
    /// Next dirty-mark generation: above every generation stored when the store opened, and
    /// increasing, so a mark rewritten by a write never keeps the generation it had.
    mark_gen: u64,
    /// Readings per device in its current hour, for flagging outliers.
    hour_counts: outliers::HourCounts,
    /// Device-hours of open hours whose dirty mark is stored and unread: writes into them put
    /// no other mark ([`open_marks`]).
    open_marks: open_marks::OpenMarks,
    /// The (table id, partition) being spilled to the archive: writes into it wait.
    spilling: Option<(u32, i32)>,
    /// Sequence number of the next write-buffer record ([`wbuf`]).
    wbuf_seq: u64,
    /// Batches go straight to their buckets until then: the buffer was not worth its cost
    /// ([`WriteBufferConfig::bypass_below`]).
    wbuf_bypass_until: Option<std::time::Instant>,
    /// Bypasses in a row: each lasts twice the one before (at most 16 times `bypass_for`).
    wbuf_bypasses: u32,
    /// The readings of a write by device-hour ([`Store::write_retrying`]), empty between writes:
    /// kept with its capacity, so each write does not take fresh memory (and its page faults).
    grouped: Vec<Grouped>,
    /// A write's device ids, looked up together before the readings are grouped
    /// ([`NameMap::get_many`]), and the names' hashes that lookup uses: kept alike.
    device_ids: Vec<Option<u64>>,
    device_hashes: Vec<u64>,
}

/// A reading with its (table id, device id, hour), its place in the write (readings of one
/// device-hour keep their arrival order) and its table's partition size.
type Grouped = ((u32, u64, i32), u32, PartitionSize, Reading);

/// The largest buffers of readings a write keeps for the next ([`Store::readings_buffer`],
/// `WriterState::grouped`, and the device ids and hashes alike), in readings: a few MB,
/// several commits of the default size; a larger one (a huge HTTP body) is freed.
const KEEP_BUFFER_READINGS: usize = 1 << 18;

/// A `HashMap` hashed by ahash with random keys: much cheaper than SipHash for the short keys
/// the write path looks up once a reading, and as resistant to chosen keys.
pub(crate) type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

#[derive(Debug, Default)]
struct Registry {
    /// One entry a device, 10M and more ([`sharded`]).
    by_name: NameMap,
    next_id: u64,
}

/// The Hourglass database. Cheap to share behind an `Arc`; reads run concurrently with the
/// single writer.
#[derive(Debug)]
pub struct Store {
    db: DB,
    cfg: StoreConfig,
    catalog: RwLock<Catalog>,
    registry: RwLock<Registry>,
    /// Serialises writers: id assignment, the dead-letter sequence, dirty-mark generations and
    /// the roll-up stage's compare-and-delete of marks need one at a time.
    write_lock: Mutex<WriterState>,
    /// One roll-up pass at a time, and what passes remember between them.
    rollup_lock: Mutex<rollups::PassMemory>,
    /// Set by [`Store::stop_rollups`]: a pass in progress stops at its next chunk.
    rollups_stopped: std::sync::atomic::AtomicBool,
    /// Each table's roll-up retention, shared with the `rollups` compaction filter.
    rollup_retentions: rollups::RollupRetentions,
    /// Message counts not yet written ([`counters`]).
    pending_counts: Mutex<counters::PendingCounts>,
    /// The devices flagged as outliers ([`outliers`]).
    outliers: RwLock<outliers::Outliers>,
    /// Per device, a hash of the tags a source last reported for it
    /// ([`Store::merge_device_tags`]), so unchanged tags cost no read.
    reported_tags: Mutex<FastMap<Arc<str>, u64>>,
    /// Hashes a report's tags (as given) for `reported_tags`; random keys.
    tags_hasher: ahash::RandomState,
    /// When reported tags the registry cannot hold were last logged (ms since the epoch; at
    /// most once a minute, [`Store::merge_device_tags`]).
    refused_tags_said_ms: AtomicI64,
    /// The devices whose tags a report changed lately ([`registry::TagChangeLog`]).
    tag_changes: Mutex<registry::TagChangeLog>,
    /// The sequence number of the next change, read without the lock.
    tag_changes_next: std::sync::atomic::AtomicU64,
    /// Which file holds each archived partition ([`archive`]).
    manifest: RwLock<archive::Manifest>,
    /// Footers of archive files read lately.
    archive_meta: Mutex<archive::MetadataCache>,
    /// Archived partitions with late readings waiting in RocksDB, with the time of the first
    /// spill run that found them ([`archive::ArchiveConfig::late_rewrite_wait`]).
    archive_late: Mutex<HashMap<(u32, i32), i64>>,
    /// Files (a bucket's objects) the manifest names that the archive lacked when last looked
    /// at ([`archive::ArchiveHeld::files_missing`]).
    archive_missing: AtomicU64,
    /// Test hook: what a reader of an archived partition does between its file and RocksDB
    /// ([`Store::set_between_archive_reads`]).
    between_archive_reads: Mutex<Option<archive::ReadHook>>,
    /// Whether `between_archive_reads` holds a hook: readers look here, not at the lock.
    has_read_hook: std::sync::atomic::AtomicBool,
    /// The bucket of an archive kept in an object store.
    bucket: Option<archive::object::Bucket>,
    /// The RocksDB directory's device and inode at open, which each commit checks
    /// ([`Store::directory_intact`]).
    dir_identity: Option<(u64, u64)>,
    /// One spill run at a time.
    spill_lock: Mutex<()>,
    /// Signalled (with `write_lock`) when a partition's spill ends.
    spill_done: Condvar,
    /// Operands committed to `wbuf` records and not flushed yet ([`wbuf`]); the active buffer
    /// changes under `write_lock`.
    wbuf: RwLock<wbuf::Buffers>,
    /// The ids naming fields in the write buffer's rows ([`rows`]).
    field_ids: rows::FieldIds,
    /// One write-buffer flush at a time.
    flush_lock: Mutex<()>,
    /// Wakes the flusher thread ([`Store::start_flusher`]).
    flush_signal: Arc<wbuf::FlushSignal>,
    /// Whether the flusher thread runs: a write finding the buffer due asks it for the flush.
    flusher_on: std::sync::atomic::AtomicBool,
    /// Held by a roll-up pass from reading the generations of the marks it did to deleting the
    /// unchanged ones, and by a write-buffer flush committing marks (writers hold `write_lock`,
    /// which the pass holds too).
    marks_lock: Mutex<()>,
    stats: StoreStats,
    /// This store among the ones the process opened: a source's memo of device ids
    /// ([`model::PrepareMemo`]) is of one store.
    instance: u64,
    /// The emptied vector of the last write's readings ([`Store::readings_buffer`]).
    spare_readings: Mutex<Vec<DeviceReading>>,
}

/// Stores opened by the process so far.
static STORES_OPENED: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Opens or creates the database in directory `path` and loads the catalog and registry.
    pub fn open(path: &Path, cfg: StoreConfig) -> Result<Store> {
        let started = std::time::Instant::now();
        let rollup_retentions = rollups::RollupRetentions::default();
        let db = store::open(path, &cfg.db, &rollup_retentions)?;
        let db_opened = started.elapsed();
        let catalog = catalog::load(&db)?;
        for ti in catalog.by_name.values() {
            rollup_retentions.set(ti.id, catalog.rollup_keep(ti));
        }
        // The registry (an entry a device) and the roll-up marks (one a device-hour written)
        // are the long parts of an open at 10M devices: they are read side by side.
        let (registry, (max_event_ts, open_marks, queue, marks_took)) = std::thread::scope(|s| {
            // Named, so profiles and the harness's CPU table tell it from the caller's thread.
            let registry = std::thread::Builder::new()
                .name("store-open-registry".into())
                .spawn_scoped(s, || {
                    let at = std::time::Instant::now();
                    load_registry(&db).map(|r| (r, at.elapsed()))
                })
                .map_err(|source| Error::Thread { what: "registry loader", source })?;
            let marks = (|| -> Result<_> {
                let at = std::time::Instant::now();
                // Up to the clock, as a write counts it: a store that an older version let a
                // clock far ahead raise (or written while this machine's clock was ahead, since
                // set back) would otherwise keep every hour up to that time closed, each write
                // into the current hour marked again and rolled up at the next pass.
                let max_event_ts = rollups::load_max_event_ts(&db)?.unwrap_or(i64::MIN).min(model::now_ms());
                let mut open_marks = open_marks::OpenMarks::default();
                let queue = rollups::scan_queue_at_open(&db, max_event_ts, &mut open_marks)?;
                Ok((max_event_ts, open_marks, queue, at.elapsed()))
            })();
            let registry = registry.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok::<_, Error>((registry?, marks?))
        })?;
        let (registry, registry_took) = registry;
        let next_seq = match db.iterator_cf(cf(&db, CF_DEAD_LETTERS), IteratorMode::End).next() {
            Some(item) => {
                let (k, _) = item.map_err(db_err("scan dead letters"))?;
                DeadLetterKey::decode(&k).map_or(0, |k| k.seq + 1)
            }
            None => 0,
        }
        .max(load_next_dead_letter_seq(&db)?);
        let db_outliers = scan_outliers(&db)?;
        let manifest = archive::load_manifest(&db)?;
        let archive_late = archive::load_late(&db)?;
        let bucket = match cfg.archive.as_ref().and_then(|a| a.object_store.as_ref()) {
            Some(s3) => Some(archive::object::Bucket::open(s3)?),
            None => None,
        };
        // Records of the write buffer not flushed before the store closed, oldest first.
        let mut buffer = wbuf::Buffer::default();
        let field_ids = rows::FieldIds::default();
        let mut wbuf_seq = 0;
        let buffer_at = std::time::Instant::now();
        for item in db.iterator_cf(cf(&db, CF_WBUF), IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("read write buffer"))?;
            let seq = <[u8; 8]>::try_from(&*k)
                .map_err(|_| Error::Corrupt { what: "write buffer key", detail: format!("{} bytes", k.len()) })?;
            let seq = u64::from_be_bytes(seq);
            wbuf_seq = seq + 1;
            wbuf::replay(&v, seq, &mut buffer, &field_ids)?;
        }
        let buffer_took = buffer_at.elapsed();
        // Everything is read: the compactions left owing may have the cores now.
        store::resume_compactions(&db)?;
        let stats = StoreStats::default();
        stats.rollup_oldest_dirty_hour_ms.store(queue.oldest_hour_ms.unwrap_or(i64::MAX), Ordering::Relaxed);
        stats.max_event_ts.store(max_event_ts, Ordering::Relaxed);
        let store = Store {
            db,
            cfg,
            catalog: RwLock::new(catalog),
            registry: RwLock::new(registry),
            write_lock: Mutex::new(WriterState {
                dead_letter_seq: next_seq,
                mark_gen: queue.next_gen,
                hour_counts: outliers::HourCounts::default(),
                open_marks,
                spilling: None,
                wbuf_seq,
                wbuf_bypass_until: None,
                wbuf_bypasses: 0,
                grouped: Vec::new(),
                device_ids: Vec::new(),
                device_hashes: Vec::new(),
            }),
            outliers: RwLock::new(db_outliers),
            reported_tags: Mutex::default(),
            tags_hasher: ahash::RandomState::new(),
            refused_tags_said_ms: AtomicI64::new(i64::MIN),
            tag_changes: Mutex::default(),
            tag_changes_next: std::sync::atomic::AtomicU64::new(0),
            rollup_lock: Mutex::default(),
            rollups_stopped: std::sync::atomic::AtomicBool::new(false),
            rollup_retentions,
            pending_counts: Mutex::default(),
            manifest: RwLock::new(manifest),
            archive_meta: Mutex::default(),
            archive_late: Mutex::new(archive_late),
            archive_missing: AtomicU64::new(0),
            between_archive_reads: Mutex::new(None),
            has_read_hook: std::sync::atomic::AtomicBool::new(false),
            bucket,
            dir_identity: dir_identity(path),
            spill_lock: Mutex::new(()),
            spill_done: Condvar::new(),
            wbuf: RwLock::new(wbuf::Buffers { active: buffer, frozen: None }),
            field_ids,
            flush_lock: Mutex::new(()),
            flush_signal: Arc::default(),
            flusher_on: std::sync::atomic::AtomicBool::new(false),
            marks_lock: Mutex::new(()),
            stats,
            instance: STORES_OPENED.fetch_add(1, Ordering::Relaxed),
            spare_readings: Mutex::default(),
        };
        store.sweep_archive()?;
        if store.cfg.write_buffer.is_none() {
            // Records left by a run with the buffer on.
            store.flush_write_buffer()?;
        }
        let secs = |d: std::time::Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
        tracing::info!(
            seconds = secs(started.elapsed()),
            rocksdb_s = secs(db_opened),
            registry_s = secs(registry_took),
            devices = read(&store.registry).by_name.len(),
            rollup_marks_s = secs(marks_took),
            write_buffer_s = secs(buffer_took),
            "store opened (rocksdb_s includes replaying its write-ahead log; the registry and the roll-up marks \
             are read side by side)"
        );
        Ok(store)
    }

    /// Whether `device` is flagged as an outlier of `table` ([`outliers`]).
    pub fn is_outlier(&self, table: &str, device: &str) -> bool {
        match (self.table(table), self.device_id(device)) {
            (Some(ti), Some(dev)) => read(&self.outliers).flagged.contains(&(ti.id, dev)),
            _ => false,
        }
    }

    /// Whether the device with id `device` is an outlier of the table with id `table`.
    pub(crate) fn is_outlier_id(&self, table: u32, device: u64) -> bool {
        read(&self.outliers).flagged.contains(&(table, device))
    }

    /// Counters since open.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// The catalog entry of `table`, if it exists.
    pub fn table(&self, table: &str) -> Option<TableInfo> {
        read(&self.catalog).by_name.get(table).copied()
    }

    /// All table names, sorted.
    pub fn tables(&self) -> Vec<String> {
        let mut names: Vec<String> = read(&self.catalog).by_name.keys().map(|n| n.to_string()).collect();
        names.sort();
        names
    }

    /// Counts `n` readings written to device-hour (`table`, `device`, `hour`), and whether the
    /// device is an outlier in the table: flagged before (`known`), in this batch (`new`), or by
    /// this count, which flags it (in `new`, and in `wb`).
    fn count_hour(
        &self,
        state: &mut WriterState,
        wb: &mut WriteBatch,
        (known, new): (&outliers::Outliers, &mut Vec<(u32, u64)>),
        (table, device, hour): (u32, u64, i32),
        n: usize,
    ) -> bool {
        known.flagged.contains(&(table, device)) || new.contains(&(table, device)) || {
            let count = state.hour_counts.add(table, device, hour, u32::try_from(n).unwrap_or(u32::MAX));
            let over = outliers::over(&self.cfg, count);
            if over {
                new.push((table, device));
                wb.put_cf(cf(&self.db, CF_REGISTRY), keys::outlier_key(table, device), hour.to_be_bytes());
            }
            over
        }
    }

    /// The registry id of `device`, if known.
    pub fn device_id(&self, device: &str) -> Option<u64> {
        read(&self.registry).by_name.get(device)
    }

    /// An empty vector for the readings of a write, with the capacity the last write's left
    /// (up to a bound): a writer gathering many messages into one commit takes it instead of
    /// new memory, whose pages the kernel would fault in and clear for every commit.
    pub fn readings_buffer(&self) -> Vec<DeviceReading> {
        std::mem::take(&mut *self.spare_readings.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Number of registered devices.
    pub fn device_count(&self) -> usize {
        read(&self.registry).by_name.len()
    }

    /// Commits `readings` and `dead_letters` in one WriteBatch (WAL on). New tables and
    /// devices are registered in the same batch. Returns once the batch is durable, or with
    /// the error of the one attempt.
    pub fn write(&self, readings: Vec<DeviceReading>, dead_letters: &[DeadLetter]) -> Result<WriteSummary> {
        self.write_retrying(readings, &[], Vec::new(), dead_letters, &[], |_, _| None)
    }

    /// Like [`Store::write`], but also writes `prepared` readings (before `readings`), names
    /// the sources of `readings` ([`model::IngestBatch::sources`]) in the dead letters of the
    /// fields their schemas refuse, records the source `offsets` (the Kafka position each
    /// partition reaches with these readings) in the same WriteBatch, and when the commit fails
    /// asks `retry(error, attempt)` for a pause and tries the same WriteBatch again after it;
    /// gives up when it returns `None`. A partition given twice keeps its later entry.
    pub fn write_retrying(
        &self,
        mut readings: Vec<DeviceReading>,
        sources: &[(usize, String)],
        prepared: Vec<model::Prepared>,
        dead_letters: &[DeadLetter],
        offsets: &[SourceOffset],
        mut retry: impl FnMut(&Error, u32) -> Option<std::time::Duration>,
    ) -> Result<WriteSummary> {
        // Batches prepared on their producers' threads ([`prepared`]): stored before `readings`.
        let prepared = prepared
            .into_iter()
            .map(|p| p.inner.downcast::<prepared::PreparedRows>().map(|p| *p))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::InvalidSource("a batch prepared by something other than the store".into()))?;
        let (mut state, buffering) = loop {
            let mut state = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
            // A partition being spilled to the archive takes no writes until its spill ends.
            while let Some(spilling) = state.spilling {
                let prepared_touch =
                    prepared.iter().flat_map(|p| &p.groups).any(|g| (g.table, g.partition.1) == spilling);
                if !prepared_touch && !self.touches_partition(&readings, spilling) {
                    break;
                }
                state = self.spill_done.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            let buffering = self.cfg.write_buffer.is_some()
                && state.wbuf_bypass_until.is_none_or(|until| std::time::Instant::now() >= until);
            if buffering || read(&self.wbuf).is_empty() || self.may_write_beside_flush(&readings, &prepared) {
                break (state, buffering);
            }
            // A direct write must land after what the buffer holds of its series: flush it
            // (the flush takes the write lock to hand the buffer over), then look again.
            drop(state);
            self.flush_write_buffer()?;
        };
        let mut wb = WriteBatch::default();
        let mut new_tables: Vec<(Arc<str>, TableInfo)> = Vec::new();
        // Devices first seen in this batch: a map, since one batch can register many thousands.
        let mut new_devices: FastMap<Arc<str>, u64> = FastMap::default();
        let prepared_readings: usize = prepared.iter().map(|p| p.readings).sum();
        let mut summary_readings = readings.len() + prepared_readings;
        // Prepared rows are as long as the record holds them, plus a head each device-hour.
        let record_capacity = readings.len() * 80
            + prepared.iter().map(|p| p.rows.len() + p.groups.len() * wbuf::ENTRY_HEAD_ROOM).sum::<usize>()
            + 1024;
        // Its device-hours: at most one a reading, and a prepared batch's groups.
        let record_entries = readings.len() + prepared.iter().map(|p| p.groups.len()).sum::<usize>();
        // Schemas this batch checks readings against once it has to change them (new fields, or
        // fields cut out), by table id, with the table's name and the version the schema had;
        // the ones that gained fields are written with the batch and take effect after it.
        let mut staged: HashMap<u32, (Arc<str>, TableInfo, u32, schema::Schema)> = HashMap::new();
        let mut schema_letters: Vec<DeadLetter> = Vec::new();

        // Readings by (table, device, hour), then sorted by it and their place in the write (a
        // device-hour's readings stay in arrival order) and taken a run at a time. A map of
        // vectors cost a table slot and an allocation a device-hour, and a sort of the groups
        // after it anyway.
        let mut grouped = std::mem::take(&mut state.grouped);
        grouped.reserve(readings.len());
        if !buffering {
            // Prepared for the buffer, written directly: taken back as readings, before the
            // others (the sort below keeps each device-hour's arrival order).
            let names = self.field_ids.names();
            for p in &prepared {
                for g in &p.groups {
                    for r in p.readings(g, &names)? {
                        grouped.push(((g.table, g.device, g.hour), grouped.len() as u32, g.partition.0, r));
                    }
                }
            }
        }
        // The last table looked up, its Arc held (so a pointer match is that very name): a batch
        // in time order names one table, but another device on every reading.
        let mut last_table: Option<(Arc<str>, TableInfo)> = None;
        // The devices' ids, looked up all at once, so that their cache misses (one a reading at
        // 10M devices) overlap; `None` for a device not registered before this write.
        let mut known_ids = std::mem::take(&mut state.device_ids);
        let mut hashes = std::mem::take(&mut state.device_hashes);
        {
            let catalog = read(&self.catalog);
            let registry = read(&self.registry);
            registry.by_name.get_many(readings.iter().map(|r| &*r.device), &mut hashes, &mut known_ids);
            let mut next_table = catalog.next_id()?;
            let mut next_device = registry.next_id;
            let mut last_schema: Option<(u32, &schema::Schema)> = None;
            // Schemas unchanged in this batch.
            let mut admitted_fields = schema::AdmittedFields::default();
            for (i, (mut r, known)) in readings.drain(..).zip(&known_ids).enumerate() {
                let table = match &last_table {
                    Some((t, ti)) if Arc::ptr_eq(t, &r.table) => *ti,
                    _ => {
                        let ti = match catalog.by_name.get(&r.table) {
                            Some(ti) => *ti,
                            None => match new_tables.iter().find(|(n, _)| *n == r.table) {
                                Some((_, ti)) => *ti,
                                None => {
                                    let ti = TableInfo {
                                        id: next_table,
                                        partition: self.cfg.default_partition,
                                        hot_retention_ms: None,
                                        cold_retention_ms: None,
                                        rollup_retention: catalog::RollupRetention::FOREVER,
                                    };
                                    next_table = next_table.checked_add(1).ok_or(Error::IdsExhausted("table"))?;
                                    catalog::put_table(&self.db, &mut wb, &r.table, ti, &catalog::EMPTY_SCHEMA);
                                    new_tables.push((r.table.clone(), ti));
                                    ti
                                }
                            },
                        };
                        last_table = Some((r.table.clone(), ti));
                        ti
                    }
                };
                let device = match known {
                    Some(id) => *id,
                    None => match new_devices.get(&r.device) {
                        Some(id) => *id,
                        None => {
                            let id = next_device;
                            next_device = next_device.checked_add(1).ok_or(Error::IdsExhausted("device"))?;
                            registry::put_registration(&self.db, &mut wb, &r.device, id);
                            new_devices.insert(r.device.clone(), id);
                            id
                        }
                    },
                };
                // The schema check, in memory: nearly every reading passes `admits` unchanged.
                // The schema of the last table is kept at hand; a batch that changes no schema
                // (the usual one) never looks into `staged`.
                let staged_schema = if staged.is_empty() { None } else { staged.get(&table.id) };
                let admitted = match staged_schema {
                    Some((_, _, _, schema)) => schema.admits(&r.reading.fields),
                    None => admitted_fields.admits(
                        table.id,
                        || match last_schema {
                            Some((id, schema)) if id == table.id => schema,
                            _ => {
                                let schema = catalog.schema(table.id);
                                last_schema = Some((table.id, schema));
                                schema
                            }
                        },
                        &r.reading,
                    ),
                };
                if !admitted {
                    let (_, _, base, schema) = staged.entry(table.id).or_insert_with(|| {
                        let schema = catalog.schema(table.id).clone();
                        (r.table.clone(), table, schema.version, schema)
                    });
                    let next_version = base.checked_add(1).ok_or(Error::IdsExhausted("schema version"))?;
                    for rejection in schema::check_reading(schema, next_version, &mut r.reading) {
                        let source = model::IngestBatch::source_of(sources, i);
                        schema_letters.push(schema_dead_letter(&r, source, schema, rejection));
                    }
                    if r.reading.fields.is_empty() {
                        summary_readings -= 1;
                        continue;
                    }
                }
                let hour = keys::to_i32(Hour::of(r.reading.ts).0).ok_or(Error::TimeOutOfRange(r.reading.ts))?;
                grouped.push(((table.id, device, hour), grouped.len() as u32, table.partition, r.reading));
            }
        }
        if readings.capacity() <= KEEP_BUFFER_READINGS {
            *self.spare_readings.lock().unwrap_or_else(PoisonError::into_inner) = readings;
        }
        if known_ids.capacity() <= KEEP_BUFFER_READINGS {
            state.device_ids = known_ids;
            state.device_hashes = hashes;
        }

        // Schemas that gained fields: their new definitions go into the same batch.
        staged.retain(|_, (_, _, base, schema)| schema.version != *base);
        for (name, ti, _, schema) in staged.values() {
            catalog::put_definition(&self.db, &mut wb, name, *ti, schema);
        }

        // One merge operand per device-hour, keys in order (cheaper memtable inserts).
        // In arrival order within a device-hour, by the place; unstable, so the sort takes no
        // memory of its own (the stable sort's buffer, fresh pages each write, cost more).
        grouped.sort_unstable_by_key(|(k, place, _, _)| (*k, *place));
        let mut n_buckets = 0usize;
        let mut buf = Vec::with_capacity(4096);
        // A device's newest reading of the batch, with whether its device-hour is marked here:
        // `latest` is written only then (see [`Store::latest`]).
        let mut newest: Option<((u32, u64), Reading, u32, bool)> = None;
        let mut latest_operands = 0u64;
        // Every device-hour written is marked dirty with this batch's generation, unless it
        // is in an hour still open and already marked ([`open_marks`]). Open: ending after the
        // largest event time committed, read under the writers' lock.
        let mark_gen = state.mark_gen;
        let committed_max_ts = self.stats.max_event_ts.load(Ordering::Relaxed);
        let mut marked: Vec<(u32, i32, u64)> = Vec::new();
        let mut max_ts = i64::MIN;
        let mut oldest_hour_ms = i64::MAX;
        let mut new_outliers: Vec<(u32, u64)> = Vec::new();
        // With the write buffer on, the readings go into one record as rows instead ([`wbuf`]):
        // 9 bytes a reading and 9 a float field, and about 7 a device-hour.
        let mut record = buffering.then(|| wbuf::Record::with_capacity(record_capacity, record_entries));
        let known_outliers = read(&self.outliers);
        let catalog = read(&self.catalog);
        // The schema version the buckets of a table record: the one in force after this batch.
        let mut version_of_last: Option<(u32, u32)> = None;
        let mut version_of = |table: u32| match version_of_last {
            Some((t, v)) if t == table => v,
            _ => {
                let v = staged.get(&table).map_or_else(|| catalog.schema(table).version, |s| s.3.version);
                version_of_last = Some((table, v));
                v
            }
        };
        if let Some(record) = record.as_mut().filter(|_| !prepared.is_empty()) {
            // Prepared batches first: they came before `readings`.
            for p in &prepared {
                record.uses(p);
                for g in &p.groups {
                    n_buckets += 1;
                    let version = version_of(g.table);
                    self.count_hour(
                        &mut state,
                        &mut wb,
                        (&*known_outliers, &mut new_outliers),
                        (g.table, g.device, g.hour),
                        g.n,
                    );
                    oldest_hour_ms = oldest_hour_ms.min(Hour(i64::from(g.hour)).start_ms());
                    max_ts = max_ts.max(g.newest);
                    record.push_prepared(p, g, version);
                }
            }
        }
        let mut groups = grouped.drain(..).peekable();
        let mut rs: Vec<Reading> = Vec::new();
        while let Some(((table, device, hour), _, partition, first)) = groups.next() {
            rs.clear();
            rs.push(first);
            rs.extend(std::iter::from_fn(|| groups.next_if(|(k, _, _, _)| *k == (table, device, hour)).map(|g| g.3)));
            n_buckets += 1;
            let version = version_of(table);
            codec::sort_dedup_last_wins(&mut rs);
            let hour_start = Hour(hour as i64).start_ms();
            let key = BucketKey {
                table,
                partition: keys::to_i32(partition.index_of(hour_start)).ok_or(Error::TimeOutOfRange(hour_start))?,
                device,
                hour,
            };
            let outlier = self.count_hour(
                &mut state,
                &mut wb,
                (&*known_outliers, &mut new_outliers),
                (table, device, hour),
                rs.len(),
            );
            oldest_hour_ms = oldest_hour_ms.min(hour_start);
            if let Some(r) = rs.last() {
                max_ts = max_ts.max(r.ts);
            }
            if let Some(record) = &mut record {
                // Sub-buckets, dirty marks and latest values are written at the flush.
                record.push(&self.field_ids, (table, device), (hour, key.partition), version, &rs);
                continue;
            }
            if outlier {
                // One operand per minute of the hour the readings fall in.
                outliers::merge_by_minute(&mut wb, cf(&self.db, CF_BUCKETS), key, hour_start, (&rs, version), &mut buf);
            } else {
                buf.clear();
                codec::encode_versioned(&rs, version, &mut buf);
                wb.merge_cf(cf(&self.db, CF_BUCKETS), key.encode(), &buf);
            }
            let marks = !state.open_marks.holds(table, hour, device, committed_max_ts);
            if marks {
                wb.put_cf(cf(&self.db, CF_DIRTY), DirtyKey { table, hour, device }.encode(), mark_gen.to_be_bytes());
                marked.push((table, hour, device));
            }
            // Groups are sorted by (table, device, hour): the last group of a (table, device)
            // holds its newest reading of this batch. An outlier's sub-buckets are not all read
            // for `latest`, so its newest reading always goes there, whole; another device's
            // entry is a pointer, the time alone: its hour bucket, written here, holds the rest.
            let newest_here = rs.pop().map(|n| (if outlier { n } else { latest_pointer(n.ts) }, marks || outlier));
            match (&mut newest, newest_here) {
                (Some((td, r, _, put)), Some((n, p))) if *td == (table, device) => (*r, *put) = (n, p),
                (slot, Some((n, p))) => {
                    if let Some((td, r, v, true)) = slot.take() {
                        self.put_latest(&mut wb, td, r, v, &mut buf);
                        latest_operands += 1;
                    }
                    *slot = Some(((table, device), n, version, p));
                }
                (_, None) => {}
            }
        }
        drop(groups);
        if grouped.capacity() <= KEEP_BUFFER_READINGS {
            state.grouped = grouped;
        }
        drop(catalog);
        drop(known_outliers);
        if let Some((td, r, v, true)) = newest.take() {
            self.put_latest(&mut wb, td, r, v, &mut buf);
            latest_operands += 1;
        }

        {
            let catalog = read(&self.catalog);
            self.put_pending_counts(&mut wb, false, |t| {
                catalog
                    .by_name
                    .get(t)
                    .or_else(|| new_tables.iter().find(|(n, _)| &**n == t).map(|(_, ti)| ti))
                    .map(|ti| ti.id)
            });
        }

        // Up to the wall clock: a clock far ahead closes no hour ([`rollups`], "Watermark").
        let max_ts = max_ts.min(model::now_ms());
        let raises_max = max_ts > self.stats.max_event_ts.load(Ordering::Relaxed);
        if raises_max {
            wb.put_cf(cf(&self.db, CF_CATALOG), keys::MAX_EVENT_TS_KEY, max_ts.to_be_bytes());
        }

        let mut dl_seq = state.dead_letter_seq;
        for dl in dead_letters.iter().chain(&schema_letters) {
            let key = DeadLetterKey { received_ms: dl.received_ms, seq: dl_seq };
            dl_seq += 1;
            wb.put_cf(cf(&self.db, CF_DEAD_LETTERS), key.encode(), encode_dead_letter(dl));
        }
        if dl_seq != state.dead_letter_seq {
            wb.put_cf(cf(&self.db, CF_CATALOG), keys::DEAD_LETTER_SEQ_KEY, dl_seq.to_be_bytes());
        }

        // Puts of one key in one WriteBatch apply in order: the later position wins.
        for o in offsets {
            let key = keys::kafka_offset_key(&o.topic, o.partition)
                .ok_or_else(|| Error::InvalidSource(format!("Kafka topic of {} bytes", o.topic.len())))?;
            wb.put_cf(cf(&self.db, CF_OFFSETS), key, o.next_offset.to_be_bytes());
        }

        let wbuf_seq = state.wbuf_seq;
        let record_bytes = record.as_mut().filter(|r| !r.is_empty()).map(|record| {
            record.finish();
            record.bytes()
        });

        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        let mut attempt = 0;
        let commit_start = std::time::Instant::now();
        loop {
            // The batch is consumed by the write: each attempt copies it, and then puts the
            // record (megabytes) once, last (copying a batch that holds it copied it twice).
            let mut try_wb = WriteBatch::from_data(wb.data());
            if let Some(bytes) = record_bytes {
                try_wb.put_cf(cf(&self.db, CF_WBUF), wbuf_seq.to_be_bytes(), bytes);
            }
            // Checked after the write: a directory deleted meanwhile took it into files a
            // restart does not find.
            match self.db.write_opt(try_wb, &wo).map_err(db_err("write batch")).and_then(|()| self.directory_intact()) {
                Ok(()) => break,
                Err(e) => match retry(&e, attempt) {
                    Some(pause) => {
                        std::thread::sleep(pause);
                        attempt += 1;
                    }
                    None => return Err(e),
                },
            }
        }
        drop(wb);
        self.stats.commit_latency.observe(commit_start.elapsed());
        state.dead_letter_seq = dl_seq;
        if n_buckets > 0 {
            self.stats.rollup_oldest_dirty_hour_ms.fetch_min(oldest_hour_ms, Ordering::Relaxed);
        }
        match &record {
            Some(record) if !record.is_empty() => {
                record.apply(&mut write(&self.wbuf).active, state.wbuf_seq);
                state.wbuf_seq += 1;
            }
            Some(_) => {}
            None if n_buckets > 0 => {
                state.mark_gen += 1;
                self.stats.bucket_operands.fetch_add(n_buckets as u64, Ordering::Relaxed);
                self.stats.dirty_marks.fetch_add(marked.len() as u64, Ordering::Relaxed);
                self.stats.latest_operands.fetch_add(latest_operands, Ordering::Relaxed);
            }
            None => {}
        }
        if raises_max {
            // Release, paired with the roll-up pass's Acquire: a pass whose watermark comes
            // from this value reads the marks and buckets committed before it ([`open_marks`]).
            self.stats.max_event_ts.store(max_ts, Ordering::Release);
        }
        // The marks committed in hours still open (past the raise just made) stay unread
        // until those hours close.
        state.open_marks.committed(marked, committed_max_ts.max(max_ts));

        // Only now, with the batch durable, do new names and flags become visible.
        let flagged = new_outliers.clone();
        if !new_outliers.is_empty() {
            write(&self.outliers).flagged.extend(new_outliers);
        }
        if !new_tables.is_empty() || !staged.is_empty() {
            let mut catalog = write(&self.catalog);
            catalog.by_name.extend(new_tables);
            for (id, (name, _, _, schema)) in staged {
                tracing::info!(table = &*name, version = schema.version, "table schema gained fields");
                catalog.schemas.insert(id, schema);
            }
        }
        if !new_devices.is_empty() {
            let mut registry = write(&self.registry);
            registry.next_id += new_devices.len() as u64;
            registry.by_name.extend(new_devices);
        }
        // Named as the API names them (QA46 F9: the log said `table=2 device=4`), once the
        // batch's new tables and devices are known.
        for (table, device) in flagged {
            let table_name = read(&self.catalog).by_name.iter().find(|(_, ti)| ti.id == table).map(|(n, _)| n.clone());
            let registry = cf(&self.db, CF_REGISTRY);
            let device_name = self.db.get_cf(registry, keys::device_id_key(device)).ok().flatten();
            tracing::info!(
                table = %table_name.map_or_else(|| table.to_string(), |n| n.to_string()),
                device = %device_name.map_or_else(|| device.to_string(), |v| String::from_utf8_lossy(&v).into_owned()),
                limit = self.cfg.bucket_max_readings,
                "device flagged as an outlier: its hours overflow into per-minute sub-buckets"
            );
        }
        self.stats.readings.fetch_add(summary_readings as u64, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        for dl in dead_letters.iter().chain(&schema_letters) {
            let i = DeadLetterReason::ALL.iter().position(|r| *r == dl.reason).unwrap_or(0);
            self.stats.dead_letters[i].fetch_add(1, Ordering::Relaxed);
        }
        for dl in &schema_letters {
            if let Some(i) = schema_source_kind(&dl.source) {
                self.stats.schema_dead_letters[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut flush = false;
        if let Some(cfg) = &self.cfg.write_buffer {
            let (due, hopeless, operands_per_hour, overfull) = {
                let b = read(&self.wbuf);
                let operands_per_hour = b.active.operands_per_hour();
                // After a bypass the buffer is tried again for a fifth of `max_age` first
                // ([`wbuf`], "Bypass"), so a fleet that still sends one operand a device-hour
                // costs a fifth of the flush.
                let hopeless = state.wbuf_bypasses > 0
                    && b.active.aged(cfg.max_age / wbuf::PROBE_SHARE)
                    && 1.0 + (operands_per_hour - 1.0) * f64::from(wbuf::PROBE_SHARE) < cfg.bypass_below;
                (b.active.due(cfg), hopeless, operands_per_hour, b.active.memory() >= 2 * cfg.max_bytes)
            };
            if (due || hopeless) && operands_per_hour < cfg.bypass_below {
                // Each device-hour got about one operand before the buffer filled or aged (many
                // more devices than it holds, or a slow trickle): buffering only adds work. Write
                // straight through for a while, then try again; longer each time it is still so.
                let bypass = cfg.bypass_for * (1 << state.wbuf_bypasses.min(4));
                state.wbuf_bypasses += 1;
                tracing::info!(
                    operands_per_hour,
                    bypass_s = bypass.as_secs_f64(),
                    "write buffer flushed at about one operand a device-hour; writing batches straight to their \
                     buckets for a while"
                );
                state.wbuf_bypass_until = Some(std::time::Instant::now() + bypass);
                // Handed over to the flusher thread, direct writes of other series go on beside
                // its flush ([`wbuf`], "Bypass").
                let handed = self.flusher_on.load(Ordering::SeqCst)
                    && self.hand_over(&mut state, &mut write(&self.wbuf), None).is_some();
                if handed {
                    self.flush_signal.want();
                } else {
                    flush = true;
                }
            } else if due {
                state.wbuf_bypasses = 0;
                // The flusher thread takes it, unless it is behind by a whole buffer: then
                // this write waits for a flush (backpressure).
                if self.flusher_on.load(Ordering::SeqCst) && !overfull {
                    self.flush_signal.want();
                } else {
                    flush = true;
                }
            }
        }
        drop(state);
        if flush {
            if let Err(e) = self.flush_write_buffer() {
                // The batch is durable in its record: the buffer stays and the next write or
                // flush tries again.
                tracing::warn!(error = %e, "flushing the write buffer failed; it is kept and tried again");
            }
        }
        Ok(WriteSummary {
            readings: summary_readings,
            buckets: n_buckets,
            dead_letters: dead_letters.len() + schema_letters.len(),
            rejected: schema_letters,
        })
    }

    /// The stored position of Kafka partition `partition` of `topic`: the offset of the next
    /// message to consume, written with the data of the messages before it. `None` when this
    /// store has never stored anything of that partition.
    pub fn kafka_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>> {
        let Some(key) = keys::kafka_offset_key(topic, partition) else {
            return Ok(None);
        };
        match self.db.get_pinned_cf(cf(&self.db, CF_OFFSETS), key).map_err(db_err("get offset"))? {
            None => Ok(None),
            Some(v) => <[u8; 8]>::try_from(&v[..])
                .map(|b| Some(i64::from_be_bytes(b)))
                .map_err(|_| Error::Corrupt { what: "Kafka offset", detail: format!("{} bytes, expected 8", v.len()) }),
        }
    }

    /// Every stored Kafka position: `(topic, partition, next offset)`, by topic then partition.
    pub fn kafka_offsets(&self) -> Result<Vec<(String, i32, i64)>> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(cf(&self.db, CF_OFFSETS), IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan offsets"))?;
            let (Some((topic, partition)), Ok(b)) = (keys::decode_kafka_offset_key(&k), <[u8; 8]>::try_from(&v[..]))
            else {
                return Err(Error::Corrupt { what: "Kafka offset", detail: format!("key {k:?}") });
            };
            out.push((topic, partition, i64::from_be_bytes(b)));
        }
        Ok(out)
    }

    /// The table and the device id, when both are known and the device has data in that
    /// table (a `latest` entry); `None` otherwise.
    pub(crate) fn device_in_table(&self, table: &str, device: &str) -> Result<Option<(TableInfo, u64)>> {
        let (Some(ti), Some(dev)) = (self.table(table), self.device_id(device)) else {
            return Ok(None);
        };
        if self.buffered_series(ti.id, dev) {
            return Ok(Some((ti, dev)));
        }
        let latest = self
            .db
            .get_pinned_cf(cf(&self.db, CF_LATEST), keys::latest_key(ti.id, dev))
            .map_err(db_err("get latest"))?;
        Ok(latest.map(|_| (ti, dev)))
    }

    fn put_latest(
        &self,
        wb: &mut WriteBatch,
        (table, device): (u32, u64),
        r: Reading,
        version: u32,
        buf: &mut Vec<u8>,
    ) {
        buf.clear();
        codec::encode_versioned(std::slice::from_ref(&r), version, buf);
        wb.merge_cf(cf(&self.db, CF_LATEST), keys::latest_key(table, device), &buf);
    }

    /// The readings of `device` in `table` within `range`, in timestamp order, one per
    /// timestamp. `None` when the table or the device (in that table) is unknown.
    pub fn read_range(&self, table: &str, device: &str, range: TimeRange) -> Result<Option<Vec<Reading>>> {
        let mut out = Vec::new();
        let found = self.for_each_reading(table, device, range, |r| {
            out.push(r);
            ControlFlow::Continue(())
        })?;
        Ok(found.map(|()| out))
    }

    /// Hands the readings of `device` in `table` within `range` to `visit`, in timestamp order,
    /// one per timestamp, until `visit` breaks. Buckets are read and decoded one hour at a
    /// time, so memory holds one hour of the device, never the range: a caller that stops after
    /// a page reads little more than the page. `None` when the table or the device (in that
    /// table) is unknown.
    pub fn for_each_reading(
        &self,
        table: &str,
        device: &str,
        range: TimeRange,
        mut visit: impl FnMut(Reading) -> ControlFlow<()>,
    ) -> Result<Option<()>> {
        let Some((ti, dev)) = self.device_in_table(table, device)? else {
            return Ok(None);
        };
        let first_hour = Hour::of(range.start).0;
        let last_hour = Hour::of(range.end - 1).0;
        let (Some(first_hour), Some(last_hour)) = (keys::to_i32(first_hour), keys::to_i32(last_hour)) else {
            return Err(Error::TimeOutOfRange(range.start));
        };
        let first_part = ti.partition.index_of(range.start);
        let last_part = ti.partition.index_of(range.end - 1);
        let mut decoded = Vec::new();
        for part in first_part..=last_part {
            let part = keys::to_i32(part).ok_or(Error::TimeOutOfRange(range.start))?;
            let mut attempts = 0;
            loop {
                if attempts == archive::ARCHIVE_READ_ATTEMPTS {
                    return Err(Store::rewritten_while_read(table, part));
                }
                attempts += 1;
                let hours = (first_hour, last_hour);
                let Some(entry) = self.archive_entry(ti.id, part) else {
                    match self.hot_partition_readings((ti, dev), part, hours, range, true, &mut decoded, &mut visit)? {
                        // Spilled since the look above: read it as archived.
                        None => continue,
                        Some(ControlFlow::Break(())) => return Ok(Some(())),
                        Some(ControlFlow::Continue(())) => break,
                    }
                };
                // An archived partition: its file and whatever RocksDB holds for it since (late
                // readings), merged, RocksDB's winning at equal times; read again if a spill
                // merged the late ones into a new file meanwhile (`Store::archive_entry`).
                let mut merged = self.archived_readings(table, &ti, (part, entry), device, range)?;
                self.between_archive_reads();
                // The collecting visitor never breaks.
                let _ = self.hot_partition_readings((ti, dev), part, hours, range, false, &mut decoded, &mut |r| {
                    merged.push(r);
                    ControlFlow::Continue(())
                })?;
                if self.archive_entry(ti.id, part) != Some(entry) {
                    decoded.clear();
                    continue;
                }
                codec::sort_dedup_last_wins(&mut merged);
                for r in merged {
                    if visit(r).is_break() {
                        return Ok(Some(()));
                    }
                }
                break;
            }
        }
        Ok(Some(()))
    }

    /// Hands the readings RocksDB holds for device `dev` of table `ti` in partition `part`,
    /// hours `first_hour..=last_hour`, within `range`, to `visit`, an hour at a time.
    ///
    /// `not_archived`: the caller found the partition not archived. A spill may have archived
    /// it since, and deleted it from RocksDB (then a late reading written after it would be all
    /// RocksDB has); so once RocksDB's iterator is made, which fixes what it reads, the
    /// partition is looked up again, and `None` is answered, with nothing visited, if it is
    /// archived now. Not archived then, it was not when the iterator was made: a spill records
    /// the partition as archived before it deletes it from RocksDB.
    #[allow(clippy::too_many_arguments)]
    fn hot_partition_readings(
        &self,
        (ti, dev): (TableInfo, u64),
        part: i32,
        (first_hour, last_hour): (i32, i32),
        range: TimeRange,
        not_archived: bool,
        decoded: &mut Vec<Reading>,
        visit: &mut impl FnMut(Reading) -> ControlFlow<()>,
    ) -> Result<Option<ControlFlow<()>>> {
        let lo = BucketKey { table: ti.id, partition: part, device: dev, hour: first_hour };
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(lo.encode().to_vec());
        let hi = BucketKey { hour: last_hour, ..lo };
        // Upper bound is exclusive: the key just past the last hour of this device.
        let mut upper = hi.encode().to_vec();
        upper.push(0xff);
        upper.push(0xff);
        upper.push(0xff);
        opts.set_iterate_upper_bound(upper);
        // What the write buffer holds of these hours goes after each hour's stored readings. It
        // is read first: a flush between the two reads then shows its readings twice (the same
        // readings, deduplicated) rather than nowhere.
        let mut buffered = self.buffered_hours((ti.id, dev), part, (first_hour, last_hour))?.into_iter().peekable();
        if not_archived {
            self.between_archive_reads();
        }
        let iter = self.db.iterator_cf_opt(cf(&self.db, CF_BUCKETS), opts, IteratorMode::Start);
        if not_archived && self.is_archived(ti.id, part) {
            return Ok(None);
        }
        // Hands over an hour: its stored readings (already in `decoded`), then its buffered
        // ones, sorted and deduplicated when the buffer added any.
        fn finish(
            buffered: &mut std::iter::Peekable<std::vec::IntoIter<(i32, Vec<Reading>)>>,
            (hour, sliced): (i32, bool),
            decoded: &mut Vec<Reading>,
            range: TimeRange,
            visit: &mut impl FnMut(Reading) -> ControlFlow<()>,
        ) -> ControlFlow<()> {
            match buffered.next_if(|(h, _)| *h == hour) {
                Some((_, rs)) => {
                    decoded.extend(rs);
                    flush_hour(decoded, true, range, visit)
                }
                None => flush_hour(decoded, sliced, range, visit),
            }
        }
        // An hour's bucket, then its sub-buckets if the device is an outlier: merged per
        // hour, last write wins per timestamp (see `outliers`).
        let mut hour: Option<(Vec<u8>, i32, bool)> = None;
        for item in iter {
            let (k, v) = item.map_err(db_err("scan buckets"))?;
            let head = &k[..k.len().min(keys::BUCKET_KEY_LEN)];
            if hour.as_ref().is_some_and(|(h, _, _)| h.as_slice() != head) {
                let (_, h, sliced) = hour.take().unwrap_or_default();
                if finish(&mut buffered, (h, sliced), decoded, range, visit).is_break() {
                    return Ok(Some(ControlFlow::Break(())));
                }
            }
            if hour.is_none() {
                let h = BucketKey::decode(head)
                    .ok_or_else(|| Error::Corrupt { what: "bucket key", detail: format!("{} bytes", k.len()) })?
                    .hour;
                // Hours only the buffer holds, before this one.
                while let Some((bh, _)) = buffered.peek() {
                    if *bh >= h {
                        break;
                    }
                    let bh = *bh;
                    if finish(&mut buffered, (bh, false), decoded, range, visit).is_break() {
                        return Ok(Some(ControlFlow::Break(())));
                    }
                }
                hour = Some((head.to_vec(), h, false));
            }
            if let Some((_, _, s)) = &mut hour {
                *s |= k.len() > keys::BUCKET_KEY_LEN;
            }
            codec::decode(&v, decoded).map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
        }
        if let Some((_, h, sliced)) = hour {
            if finish(&mut buffered, (h, sliced), decoded, range, visit).is_break() {
                return Ok(Some(ControlFlow::Break(())));
            }
        }
        while let Some((bh, _)) = buffered.peek() {
            let bh = *bh;
            if finish(&mut buffered, (bh, false), decoded, range, visit).is_break() {
                return Ok(Some(ControlFlow::Break(())));
            }
        }
        Ok(Some(ControlFlow::Continue(())))
    }

    /// The latest reading of each of `devices` in `table`: two multi-gets, of `latest` and of
    /// `buckets`. `None` when the table is unknown; a `None` entry for a device with no
    /// reading in that table.
    ///
    /// A device's `latest` entry is written when a write marks the device's newest hour of its
    /// batch dirty (the first write of each device-hour: the open-hour marks skip the others), so
    /// at one reading a minute it takes one operand an hour instead of sixty. It always holds
    /// the time of a reading of the device's newest hour with data, not always that hour's
    /// newest: the rest is in that hour's bucket, read here. Written by a write, the entry is
    /// a pointer (the time alone, a reading without fields: a fraction of the bytes to flush
    /// and compact), since the bucket written with it holds the reading. (Each write into a
    /// device-hour either marks it, and so writes `latest` when the hour is the device's
    /// newest of the batch, or finds its mark stored, written with a `latest` operand of that
    /// hour or a later one; merged, the newest wins.) The entry becomes the hour's newest,
    /// whole, when the hour leaves the buckets' reach: a roll-up pass puts the newest reading
    /// of each hour it reads, and a retention drop or spill of a partition does so for the
    /// hours not rolled up yet (`Store::settle_latest`). A pointer's hour is marked in the
    /// batch that writes it, so it is settled before its bucket is deleted (were the bucket
    /// missing all the same, the entry would read as its time alone). An outlier's writes
    /// always put their newest reading whole, as its sub-buckets are not all read here: only
    /// the one of the entry's minute (a third multi-get), since a rewrite after the flag of a
    /// time in the hour bucket lands there.
    pub fn latest<S: AsRef<str>>(&self, table: &str, devices: &[S]) -> Result<Option<Vec<Option<Reading>>>> {
        let Some(ti) = self.table(table) else {
            return Ok(None);
        };
        let mut out: Vec<Option<Reading>> = vec![None; devices.len()];
        // (position in request, key, device id), sorted by key for the batched multi-get.
        let mut wanted: Vec<(usize, [u8; keys::LATEST_KEY_LEN], u64)> = {
            let registry = read(&self.registry);
            devices
                .iter()
                .enumerate()
                .filter_map(|(i, d)| registry.by_name.get(d.as_ref()).map(|id| (i, keys::latest_key(ti.id, id), id)))
                .collect()
        };
        wanted.sort_unstable_by_key(|w| w.1);
        // The write buffer first: a flush between the two reads then shows its readings in both
        // rather than in neither.
        let buffered: Vec<Option<Reading>> =
            wanted.iter().map(|(_, _, dev)| self.buffered_latest(ti.id, *dev)).collect::<Result<_>>()?;
        let results = self.db.batched_multi_get_cf(cf(&self.db, CF_LATEST), wanted.iter().map(|(_, k, _)| k), true);
        let mut decoded = Vec::with_capacity(1);
        // The hour bucket each entry points to: (position in request, bucket key).
        let mut hours: Vec<(usize, [u8; keys::BUCKET_KEY_LEN])> = Vec::with_capacity(wanted.len());
        // An outlier's sub-bucket of the entry's minute: (position in request, key).
        let mut slices: Vec<(usize, [u8; keys::BUCKET_KEY_LEN + 1])> = Vec::new();
        let outliers = read(&self.outliers);
        for ((pos, _, dev), res) in wanted.iter().zip(results) {
            if let Some(v) = res.map_err(db_err("multi-get latest"))? {
                decoded.clear();
                codec::decode(&v, &mut decoded)
                    .map_err(|e| Error::Corrupt { what: "latest", detail: e.to_string() })?;
                if let Some(r) = decoded.pop() {
                    let hour = Hour::of(r.ts);
                    let (Some(h), Some(partition)) =
                        (keys::to_i32(hour.0), keys::to_i32(ti.partition.index_of(hour.start_ms())))
                    else {
                        return Err(Error::TimeOutOfRange(r.ts));
                    };
                    let key = BucketKey { table: ti.id, partition, device: *dev, hour: h };
                    hours.push((*pos, key.encode()));
                    if outliers.flagged.contains(&(ti.id, *dev)) {
                        slices.push((*pos, key.encode_slice(outliers::slice_of(r.ts, hour.start_ms()))));
                    }
                    out[*pos] = Some(r);
                }
            }
        }
        drop(outliers);
        // The entry holds the device's newest hour, not always its newest reading of that hour
        // (it is written when the hour is first marked): the bucket has the rest. A bucket
        // reading at the entry's time wins, as the bucket holds every write of the hour.
        self.take_newest_of_buckets(&mut out, hours, "multi-get latest hours")?;
        // An outlier writes every reading after its flag to the sub-bucket of its minute (and
        // to `latest`), so at the entry's time that sub-bucket's reading is newer than the hour
        // bucket's, which was written before the flag. Without this, a rewrite after the flag
        // of a time the hour bucket holds would read as the older value.
        if !slices.is_empty() {
            self.take_newest_of_buckets(&mut out, slices, "multi-get latest minutes")?;
        }
        // A newer reading in the write buffer wins (at an equal time too: it was written later).
        for ((pos, _, _), r) in wanted.iter().zip(buffered) {
            if let Some(r) = r {
                if out[*pos].as_ref().is_none_or(|o| r.ts >= o.ts) {
                    out[*pos] = Some(r);
                }
            }
        }
        Ok(Some(out))
    }

    /// For each (position in `out`, bucket key) of `keys`, the bucket's newest reading replaces
    /// `out[position]` unless that is newer (at an equal time the bucket's wins: it was written
    /// later). One multi-get, whose merges answer each bucket's newest reading alone
    /// ([`store::NewestOnly`]): the cost of a read no longer grows with the readings of the open
    /// hour. `what` names it in errors.
    fn take_newest_of_buckets<K: AsRef<[u8]> + Ord>(
        &self,
        out: &mut [Option<Reading>],
        mut keys: Vec<(usize, K)>,
        what: &'static str,
    ) -> Result<()> {
        keys.sort_unstable_by(|a, b| a.1.cmp(&b.1));
        let found = {
            // Each bucket's newest reading is all that is read of it.
            let _newest = store::NewestOnly::enter();
            self.db.batched_multi_get_cf(cf(&self.db, CF_BUCKETS), keys.iter().map(|(_, k)| k), true)
        };
        for ((pos, _), res) in keys.iter().zip(found) {
            if let Some(v) = res.map_err(db_err(what))? {
                let (r, _) =
                    codec::newest_reading(&v).map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
                if out[*pos].as_ref().is_none_or(|o| r.ts >= o.ts) {
                    out[*pos] = Some(r);
                }
            }
        }
        Ok(())
    }

    /// The newest `limit` dead letters, newest first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<StoredDeadLetter>> {
        Ok(self.dead_letters_page(&DeadLetterFilter::default(), limit)?.letters)
    }

    /// One page of the dead letters `filter` selects, newest first: at most `limit`, from at
    /// most [`MAX_EXAMINED_DEAD_LETTERS`] examined and as few more as reach
    /// [`MAX_EXAMINED_DEAD_LETTER_BYTES`], so a filter that few letters pass cannot turn one call
    /// into a scan of every letter, nor large payloads one answer into gigabytes.
    /// [`DeadLetterPage::next`] is where the next page starts (pass it as
    /// [`DeadLetterFilter::before`]), `None` when no letter is left to examine.
    pub fn dead_letters_page(&self, filter: &DeadLetterFilter, limit: usize) -> Result<DeadLetterPage> {
        let start = filter.before.map(|k| k.encode());
        let mode = match &start {
            Some(k) => IteratorMode::From(k, rocksdb::Direction::Reverse),
            None => IteratorMode::End,
        };
        let mut page = DeadLetterPage { letters: Vec::with_capacity(limit.min(1024)), next: None };
        let (mut examined, mut examined_bytes) = (0, 0);
        let mut last = None;
        for item in self.db.iterator_cf(cf(&self.db, CF_DEAD_LETTERS), mode) {
            let (k, v) = item.map_err(db_err("scan dead letters"))?;
            let key = dead_letter_key(&k)?;
            if Some(key) == filter.before {
                continue; // the previous page's last
            }
            if page.letters.len() == limit
                || examined == MAX_EXAMINED_DEAD_LETTERS
                || examined_bytes >= MAX_EXAMINED_DEAD_LETTER_BYTES
            {
                // One more letter is left: the next page starts after the last one examined.
                page.next = last;
                break;
            }
            examined += 1;
            examined_bytes += v.len();
            last = Some(key);
            let letter = decode_dead_letter(key, &v)?;
            if filter.admits(&letter) {
                page.letters.push(letter);
            }
        }
        Ok(page)
    }

    /// Deletes the dead letters received before `before_ms` (the retention task does, for
    /// `storage.dead_letter_retention`) and says how many there were and when the oldest was
    /// received. The numbers of the deleted letters are never given again, across a reopen too
    /// ([`keys::DEAD_LETTER_SEQ_KEY`]). Whole SST files of the range are dropped at once, the
    /// rest with one range delete.
    pub fn expire_dead_letters(&self, before_ms: i64) -> Result<ExpiredDeadLetters> {
        let h = cf(&self.db, CF_DEAD_LETTERS);
        let from = DeadLetterKey { received_ms: i64::MIN, seq: 0 }.encode();
        let to = DeadLetterKey { received_ms: before_ms, seq: 0 }.encode();
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(to);
        opts.fill_cache(false);
        let mut expired = ExpiredDeadLetters::default();
        for item in self.db.iterator_cf_opt(h, opts, IteratorMode::Start) {
            let (k, _) = item.map_err(db_err("scan expired dead letters"))?;
            let key = dead_letter_key(&k)?;
            expired.count += 1;
            expired.oldest_ms.get_or_insert(key.received_ms);
        }
        if expired.count == 0 {
            return Ok(expired);
        }
        // Inclusive of its end: the last key before `to`.
        let last = DeadLetterKey { received_ms: before_ms.saturating_sub(1), seq: u64::MAX }.encode();
        if let Err(e) = self.db.delete_file_in_range_cf(h, from, last) {
            tracing::warn!(error = %e, "cannot delete the files of expired dead letters; compactions will");
        }
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(h, from, to);
        // The next number, beyond every number given (a store written before the key was kept
        // may have none yet), written while no dead letter can be.
        let state = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
        wb.put_cf(cf(&self.db, CF_CATALOG), keys::DEAD_LETTER_SEQ_KEY, state.dead_letter_seq.to_be_bytes());
        self.db.write(wb).map_err(db_err("delete expired dead letters"))?;
        drop(state);
        Ok(expired)
    }

    /// The stored bytes of one hour bucket (operands merged), for inspection and tests.
    pub fn bucket_bytes(&self, table: &str, device: &str, hour: Hour) -> Result<Option<Vec<u8>>> {
        self.flush_write_buffer()?;
        let (Some(ti), Some(dev)) = (self.table(table), self.device_id(device)) else {
            return Ok(None);
        };
        let hour_i32 = keys::to_i32(hour.0).ok_or(Error::TimeOutOfRange(hour.start_ms()))?;
        let partition =
            keys::to_i32(ti.partition.index_of(hour.start_ms())).ok_or(Error::TimeOutOfRange(hour.start_ms()))?;
        let key = BucketKey { table: ti.id, partition, device: dev, hour: hour_i32 };
        self.db.get_cf(cf(&self.db, CF_BUCKETS), key.encode()).map_err(db_err("get bucket"))
    }

    /// Flushes memtables and compacts every column family fully (for measurements and tests).
    pub fn compact(&self) -> Result<()> {
        self.flush_write_buffer()?;
        // The bottommost level too: RocksDB's default skips files already there, so merge
        // operands that reached it unmerged would stay (and measurements would count them).
        let mut opts = rocksdb::CompactOptions::default();
        opts.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        for name in store::ALL_CFS {
            let h = cf(&self.db, name);
            self.db.flush_cf(h).map_err(db_err("flush"))?;
            self.db.compact_range_cf_opt(h, None::<&[u8]>, None::<&[u8]>, &opts);
        }
        Ok(())
    }

    /// Writes the pending message counts and flushes memtables to SST files (a clean shutdown
    /// does this so restart skips WAL replay and loses no count).
    pub fn flush(&self) -> Result<()> {
        self.flush_write_buffer()?;
        self.flush_message_counts()?;
        for name in store::ALL_CFS {
            self.db.flush_cf(cf(&self.db, name)).map_err(db_err("flush"))?;
        }
        Ok(())
    }

    /// Stops RocksDB's flushes and compactions for good, as the process stops: a compaction in
    /// progress is abandoned (its input files stay as they were) and none starts after. Call it
    /// after [`Store::flush`]; the store must not be written afterwards. Without it, a
    /// compaction running when the process exits runs to its end first (RocksDB joins its
    /// threads at exit): at 10M devices, `serve` lingered 9 to 56 s after logging `stopped`.
    pub fn stop_background_work(&self) {
        self.db.cancel_all_background_work(true);
    }

    /// On-disk bytes of SST files of the `buckets` column family.
    pub fn bucket_sst_bytes(&self) -> Result<u64> {
        self.db
            .property_int_value_cf(cf(&self.db, CF_BUCKETS), "rocksdb.total-sst-files-size")
            .map_err(db_err("property"))
            .map(|v| v.unwrap_or(0))
    }

    /// Number of `buckets` entries and their total value bytes, by a full scan (for
    /// measurements).
    pub fn bucket_scan_stats(&self) -> Result<(u64, u64, u64)> {
        self.flush_write_buffer()?;
        let (mut n, mut bytes, mut values) = (0u64, 0u64, 0u64);
        let mut decoded = Vec::new();
        for item in self.db.iterator_cf(cf(&self.db, CF_BUCKETS), IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("scan buckets"))?;
            n += 1;
            bytes += (k.len() + v.len()) as u64;
            decoded.clear();
            codec::decode(&v, &mut decoded).map_err(|e| Error::Corrupt { what: "bucket", detail: e.to_string() })?;
            values += decoded.iter().map(|r| r.fields.len() as u64).sum::<u64>();
        }
        Ok((n, bytes, values))
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Loads the registry ([`load_registry_in`]): on as many threads as the machine has cores, at
/// most [`REGISTRY_LOADERS`], from [`REGISTRY_SPLIT_AT`] devices on.
fn load_registry(db: &DB) -> Result<Registry> {
    let parts = std::thread::available_parallelism().map_or(1, |n| n.get().min(REGISTRY_LOADERS));
    load_registry_in(db, parts, REGISTRY_SPLIT_AT)
}

/// Threads that load a large registry at most.
const REGISTRY_LOADERS: usize = 4;
/// Devices from which the registry loads on several threads.
const REGISTRY_SPLIT_AT: u64 = 100_000;

/// Loads the registry from its id → name entries (ids are dense from 0: the last entry gives
/// the count), into a map allocated at its final size. From `split_at` devices on, `parts`
/// threads each read a range of ids into it, a lock a shard (at 10M devices the load is the
/// longest part of an open, mostly hashing names, allocating them and inserting them).
fn load_registry_in(db: &DB, parts: usize, split_at: u64) -> Result<Registry> {
    let mut last = db.raw_iterator_cf(cf(db, CF_REGISTRY));
    last.seek_for_prev(keys::device_id_key(u64::MAX));
    let next_id = match (last.key(), last.value()) {
        (Some(k), Some(v)) if k.first() == Some(&keys::ID_PREFIX) => registry_id_entry(k, v)?.0 + 1,
        _ => 0,
    };
    last.status().map_err(db_err("load registry"))?;
    drop(last);
    let parts = if next_id >= split_at { parts.max(1) as u64 } else { 1 };
    let bound = |p: u64| next_id / parts * p + (next_id % parts) * p / parts;
    let shared = NameMap::with_capacity(usize::try_from(next_id).unwrap_or(usize::MAX)).into_shared();
    std::thread::scope(|s| {
        let helpers = (1..parts)
            .map(|p| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("store-open-registry-{p}"))
                    .spawn_scoped(s, move || load_names(db, bound(p)..bound(p + 1), shared))
                    .map_err(|source| Error::Thread { what: "registry loader", source })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut loaded = vec![load_names(db, 0..bound(1), &shared)];
        loaded.extend(helpers.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))));
        loaded.into_iter().collect::<Result<()>>()
    })?;
    Ok(Registry { by_name: shared.into_map(), next_id })
}

/// Reads the registry's names of the devices with ids in `ids` into `map`.
fn load_names(db: &DB, ids: std::ops::Range<u64>, map: &sharded::SharedShards) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut opts = store::one_pass_read();
    opts.set_iterate_upper_bound(keys::device_id_key(ids.end).to_vec());
    // A raw iterator: the boxed one copies each key and value into allocations of their own.
    let mut it = db.raw_iterator_cf_opt(cf(db, CF_REGISTRY), opts);
    it.seek(keys::device_id_key(ids.start));
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        let (id, name) = registry_id_entry(k, v)?;
        // The index's keys are the ids and each device has one: each name comes once.
        map.insert_new(name, id);
        it.next();
    }
    it.status().map_err(db_err("load registry"))?;
    Ok(())
}

/// Moves one hour's decoded readings within `range` to `out`; an hour read from sub-buckets is
/// merged first (sorted by time, the last read of a timestamp wins).
/// Hands the decoded readings of one hour that lie in `range` to `visit` (sorted and
/// deduplicated first when the hour was split into sub-buckets); stops at the first break and
/// drops the rest of the hour.
fn flush_hour(
    decoded: &mut Vec<Reading>,
    sliced: bool,
    range: TimeRange,
    visit: &mut impl FnMut(Reading) -> ControlFlow<()>,
) -> ControlFlow<()> {
    if sliced {
        codec::sort_dedup_last_wins(decoded);
    }
    for r in decoded.drain(..).filter(|r| range.contains(r.ts)) {
        visit(r)?;
    }
    ControlFlow::Continue(())
}

impl Error {
    /// Whether this is an archive request that an ordered stop ended
    /// ([`Store::stop_archive_requests`]): no failure of the archive, an error only to its caller.
    pub fn is_stopping(&self) -> bool {
        matches!(self, Error::Archive(text) if text.contains(archive::object::STOPPING))
    }
}

/// The device and inode of the directory `path` (`None` where they cannot be read).
fn dir_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Store {
    /// Whether the store's directory is still the one it opened ([`Error::DirectoryGone`]
    /// if it was deleted or replaced: RocksDB writes on into the deleted files, and a restart
    /// opens a new, empty store there). One `stat`, at each commit.
    pub fn directory_intact(&self) -> Result<()> {
        match self.dir_identity {
            Some(opened) if dir_identity(self.db.path()) != Some(opened) => {
                Err(Error::DirectoryGone { path: self.db.path().display().to_string() })
            }
            _ => Ok(()),
        }
    }
}

/// A `latest` entry that points to its hour bucket: the reading's time without its fields
/// (see [`Store::latest`]).
pub(crate) fn latest_pointer(ts: i64) -> Reading {
    Reading { ts, fields: Vec::new() }
}

/// The outlier flags stored in `registry`.
fn scan_outliers(db: &DB) -> Result<outliers::Outliers> {
    let mut flagged = std::collections::HashSet::new();
    for item in db.prefix_iterator_cf(cf(db, CF_REGISTRY), [keys::OUTLIER_PREFIX]) {
        let (k, _) = item.map_err(db_err("load outlier flags"))?;
        match keys::decode_outlier_key(&k) {
            Some(flag) => flagged.insert(flag),
            None => break,
        };
    }
    Ok(outliers::Outliers { flagged })
}

/// Decodes a registry id → name entry (`keys::device_id_key(id)` → name) into the id and the name.
fn registry_id_entry<'v>(k: &[u8], v: &'v [u8]) -> Result<(u64, &'v str)> {
    let corrupt = |detail: &str| Error::Corrupt { what: "registry id entry", detail: detail.to_string() };
    let id = k.get(1..).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(|| corrupt("key length"))?;
    let name = std::str::from_utf8(v).map_err(|_| corrupt("device name is not UTF-8"))?;
    Ok((u64::from_be_bytes(id), name))
}

/// Decodes a registry name-index entry (`keys::name_key(name)` → device id u64 BE) into the
/// name and the id.
pub(crate) fn registry_name_entry<'k>(k: &'k [u8], v: &[u8]) -> Result<(&'k str, u64)> {
    let corrupt = |detail: &str| Error::Corrupt { what: "registry entry", detail: detail.to_string() };
    let name = std::str::from_utf8(k.get(1..).unwrap_or_default()).map_err(|_| corrupt("device name is not UTF-8"))?;
    let id = u64::from_be_bytes(v.try_into().map_err(|_| corrupt("value length"))?);
    Ok((name, id))
}

/// Dead-letter record, version 1: `u8 1 · (u32 BE length · bytes) for reason, detail, source ·
/// payload (the rest)`.
fn encode_dead_letter(dl: &DeadLetter) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + dl.detail.len() + dl.source.len() + dl.payload.len());
    v.push(1);
    for part in [dl.reason.as_str().as_bytes(), dl.detail.as_bytes(), dl.source.as_bytes()] {
        v.extend_from_slice(&(part.len() as u32).to_be_bytes());
        v.extend_from_slice(part);
    }
    v.extend_from_slice(&dl.payload);
    v
}

fn decode_dead_letter(key: DeadLetterKey, v: &[u8]) -> Result<StoredDeadLetter> {
    let corrupt = |detail: &str| Error::Corrupt { what: "dead letter", detail: detail.to_string() };
    if v.first() != Some(&1) {
        return Err(corrupt("unknown version"));
    }
    let mut rest = &v[1..];
    let mut parts = Vec::with_capacity(3);
    for _ in 0..3 {
        if rest.len() < 4 {
            return Err(corrupt("truncated"));
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if rest.len() < len {
            return Err(corrupt("truncated"));
        }
        parts.push(String::from_utf8_lossy(&rest[..len]).into_owned());
        rest = &rest[len..];
    }
    let source = parts.pop().unwrap_or_default();
    let detail = parts.pop().unwrap_or_default();
    let reason = parts.pop().unwrap_or_default();
    Ok(StoredDeadLetter { received_ms: key.received_ms, seq: key.seq, reason, detail, source, payload: rest.to_vec() })
}

/// The dead letter of a field the schema check cut out of a reading: the reason, a detail
/// naming the table, device, time, field, schema version and value, and as payload the field
/// as a one-field JSON reading (`{"device":…,"ts":…,"<field>":value}`) that could be sent
/// again to the table's gateway topic once fixed. Its source is the reading's (the message
/// that brought it), when known; otherwise `schema of table …`.
fn schema_dead_letter(
    r: &DeviceReading,
    source: Option<&str>,
    schema: &schema::Schema,
    rejection: schema::Rejection,
) -> DeadLetter {
    let (table, device, ts) = (&r.table, &r.device, r.reading.ts);
    let (name, value) = (rejection.name(), rejection.value());
    // The check has cut the refused fields out of the reading: what is left is stored.
    let rest = if r.reading.fields.is_empty() {
        "the reading has no other field"
    } else {
        "the reading's other fields are stored"
    };
    /// 2^63: the first float past the i64 range (and the negation of its last).
    const I64_END: f64 = 9_223_372_036_854_775_808.0;
    let got = match value {
        model::Value::UntypedInt(v) => format!("integer {v}"),
        // A whole float from 2^53 on, in its exact digits (`9223372036854775808`, not the
        // shortest text that reads back as it, `9223372036854776000`).
        model::Value::F64(v) if v.fract() == 0.0 && v.abs() >= schema::MAX_EXACT_INT => format!("f64 {v:.0}"),
        value => format!("{} {value}", value.field_type()),
    };
    let (reason, detail) = match &rejection {
        schema::Rejection::WrongType { expected, .. } => {
            // A JSON number with a fraction or an exponent is read as an f64: from 2^53 on a
            // whole one may not be the integer sent (9007199254740993.0 arrives as
            // 9007199254740992), so say so and how to send it (within the i64 range, which `as`
            // saturates at: a larger one is no integer to send; every float from 2^53 on is
            // whole, and NaN and the infinities fail the round trip).
            let why = match (expected, value) {
                // From 2^63 on (a JSON integer past i64::MAX arrives as the float): no integer to
                // send instead (`as` would saturate, so the round trip below would pass at 2^63).
                (model::FieldType::I64, model::Value::F64(v)) if *v >= I64_END || *v < -I64_END => {
                    " (outside the i64 range, -9223372036854775808 to 9223372036854775807: no integer this large \
                     fits the field)"
                }
                // -2^63 is i64's least, and also what a JSON integer just below it arrives as
                // (QA47 N1: -9223372036854775809 was told to be sent as an integer, as it was).
                (model::FieldType::I64, model::Value::F64(v)) if *v == -I64_END => {
                    " (a float: sent as an integer, in JSON without fraction or exponent, in line protocol as \
                     `…i`, -9223372036854775808 fits the field; a JSON integer below it, outside the i64 range, \
                     arrives as this float)"
                }
                (model::FieldType::I64, model::Value::F64(v))
                    if v.abs() >= schema::MAX_EXACT_INT && (*v as i64) as f64 == *v =>
                {
                    " (a float from ±2^53 on may not be the integer sent: send it as an integer, in JSON without \
                     fraction or exponent, in line protocol as `…i`)"
                }
                _ => "",
            };
            (
                DeadLetterReason::WrongFieldType,
                format!(
                    "table `{table}` device `{device}` ts {ts}: field `{name}` is {expected} in schema version {}, got \
                     {got}{why}; {rest}",
                    schema.version
                ),
            )
        }
        schema::Rejection::Unknown { .. } => (
            DeadLetterReason::UnknownField,
            format!(
                "table `{table}` device `{device}` ts {ts}: the table is strict and schema version {} has no field \
                 `{name}` (got {got}); {rest}",
                schema.version
            ),
        ),
        schema::Rejection::Full { more, .. } => (
            DeadLetterReason::UnknownField,
            format!(
                "table `{table}` device `{device}` ts {ts}: schema version {} has no field `{name}` (got {got}){} and \
                 {} fields, the most a table takes (a device naming fields by a serial number or a time?); {rest}",
                schema.version,
                match more {
                    0 => String::new(),
                    n => format!(" nor {n} other field(s) of the reading"),
                },
                schema::MAX_FIELDS_PER_TABLE
            ),
        ),
    };
    let mut payload = format!("{{\"device\":{},\"ts\":{ts},{}:", json_string(device), json_string(name));
    match value {
        // A whole float with its fraction: read back, it is the float again (refused again),
        // not an integer (`9007199254740992` would store in an i64 field, changed).
        model::Value::F64(v) if v.is_finite() && v.fract() == 0.0 => payload.push_str(&format!("{v:.1}")),
        model::Value::F64(v) if v.is_finite() => payload.push_str(&v.to_string()),
        model::Value::F64(_) => payload.push_str("null"),
        model::Value::I64(v) | model::Value::UntypedInt(v) => payload.push_str(&v.to_string()),
        model::Value::Bool(v) => payload.push_str(if *v { "true" } else { "false" }),
        model::Value::Str(v) => payload.push_str(&json_string(v)),
    }
    payload.push('}');
    DeadLetter {
        received_ms: model::now_ms(),
        source: source.map_or_else(|| format!("schema of table {table}"), str::to_string),
        reason,
        detail,
        payload: payload.into_bytes(),
    }
}

/// The kinds of source [`StoreStats::schema_dead_letters`] counts by: the names of the
/// intakes' sources in the metrics.
pub const SCHEMA_SOURCE_KINDS: [&str; 3] = ["mqtt", "http", "kafka"];

/// The index in [`SCHEMA_SOURCE_KINDS`] of a dead letter's source: `http`, `kafka:{topic}/…`,
/// an MQTT topic otherwise; none for a reading written in process (`schema of table …`).
fn schema_source_kind(source: &str) -> Option<usize> {
    match source {
        "http" => Some(1),
        s if s.starts_with("kafka:") => Some(2),
        s if s.starts_with("schema of table ") => None,
        _ => Some(0),
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The registry loads alike whole and split into id ranges on several threads (ranges of
    /// unequal sizes included), and below the split threshold on one: the ids and names the
    /// writes registered, each once.
    #[test]
    fn the_registry_loads_alike_whole_and_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        let empty = load_registry_in(&store.db, 3, 0).unwrap();
        assert_eq!((empty.next_id, empty.by_name.len()), (0, 0));
        // Registered out of name order, in batches.
        let names: Vec<String> = (0..1_001u64).map(|i| format!("dev-{}", i * 7_919 % 1_001)).collect();
        for chunk in names.chunks(100) {
            let batch = chunk
                .iter()
                .map(|d| DeviceReading {
                    table: "t".into(),
                    device: d.as_str().into(),
                    reading: Reading::new(1_000, vec![("x".into(), 1.0)]),
                })
                .collect();
            store.write(batch, &[]).unwrap();
        }
        let ids: Vec<u64> = names.iter().map(|n| store.device_id(n).unwrap()).collect();
        assert_eq!(ids.iter().copied().collect::<std::collections::BTreeSet<u64>>().len(), 1_001);
        for (parts, split_at) in [(1, 0), (2, 0), (3, 0), (7, 0), (4, 1_002)] {
            let loaded = load_registry_in(&store.db, parts, split_at).unwrap();
            assert_eq!((loaded.next_id, loaded.by_name.len()), (1_001, 1_001), "{parts} parts");
            for (name, id) in names.iter().zip(&ids) {
                assert_eq!(loaded.by_name.get(name), Some(*id), "{parts} parts: {name}");
            }
        }
    }

    /// A store whose persisted largest event time is far ahead of the clock (an older version
    /// let a device's clock raise it; or this machine's clock was ahead, since set back) opens
    /// with it at the clock: the current hour is open again, not due, and the next write
    /// raising it persists the truth.
    #[test]
    fn a_largest_event_time_ahead_of_the_clock_opens_at_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let row = |ts: i64| DeviceReading {
            table: "t".into(),
            device: "d0".into(),
            reading: Reading::new(ts, vec![("x".into(), 1.0)]),
        };
        let far: i64 = 7_258_118_399_999; // 2199-12-31T23:59:59.999Z
        {
            let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
            store.write(vec![row(1_000)], &[]).unwrap();
            store.db.put_cf(cf(&store.db, CF_CATALOG), keys::MAX_EVENT_TS_KEY, far.to_be_bytes()).unwrap();
        }
        // Clear of an hour's end, so that the wall clock stays in one hour for the test.
        let mut now = model::now_ms();
        let left = model::HOUR_MS - now.rem_euclid(model::HOUR_MS);
        if left < 60_000 {
            std::thread::sleep(std::time::Duration::from_millis(left as u64 + 100));
            now = model::now_ms();
        }
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        let largest = store.stats().max_event_ts.load(Ordering::Relaxed);
        assert!((now..=model::now_ms()).contains(&largest), "{largest} is not the clock's now ({now})");
        // The hour of 1970 is due, the current one not.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let before = model::now_ms();
        store.write(vec![row(before + 30_000)], &[]).unwrap();
        let after = model::now_ms();
        assert_eq!(store.dirty_marks().unwrap(), 2);
        let s = store.process_rollups(0, usize::MAX).unwrap();
        assert_eq!(s.hours, 1);
        assert!(s.watermark.is_some_and(|w| (before..=after).contains(&w)), "{:?}", s.watermark);
        assert_eq!(store.dirty_marks().unwrap(), 1);
        // The write raised it to the clock, above its value at open: persisted.
        drop(store);
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        let persisted = store.db.get_cf(cf(&store.db, CF_CATALOG), keys::MAX_EVENT_TS_KEY).unwrap().unwrap();
        let persisted = i64::from_be_bytes(persisted.as_slice().try_into().unwrap());
        assert!((before..=after).contains(&persisted), "{persisted} not in {before}..={after}");
    }

    /// Within one write, a time written twice for a device keeps the later value, however many
    /// readings of other device-hours lie between the two: the sort of a write's readings keeps
    /// each device-hour's arrival order.
    #[test]
    fn the_later_of_two_readings_at_one_time_wins_within_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        // 200 devices, each written 50 times at 5 times: every time ten times, with the value
        // rising with each write. Devices interleaved, as a batch in time order has them.
        let mut batch = Vec::new();
        for round in 0..50i64 {
            for d in 0..200 {
                batch.push(DeviceReading {
                    table: "t".into(),
                    device: format!("d{d}").into(),
                    reading: Reading::new(3_600_000 + round % 5, vec![("x".into(), (round * 1_000 + d) as f64)]),
                });
            }
        }
        store.write(batch, &[]).unwrap();
        for d in 0..200i64 {
            let got =
                store.read_range("t", &format!("d{d}"), model::TimeRange::new(0, 7_200_000).unwrap()).unwrap().unwrap();
            // Time k was last written in round 45 + k.
            let want: Vec<Reading> = (0..5)
                .map(|k| Reading::new(3_600_000 + k, vec![("x".into(), ((45 + k) * 1_000 + d) as f64)]))
                .collect();
            assert_eq!(got, want, "d{d}");
        }
    }

    /// A write leaves its emptied vectors of readings for the next, up to the bound, and what
    /// the next write stores is unchanged by the memory it reuses.
    #[test]
    fn a_write_leaves_its_buffers_for_the_next_up_to_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        let batch = |n: usize, ts: i64| -> Vec<DeviceReading> {
            (0..n)
                .map(|i| DeviceReading {
                    table: "t".into(),
                    device: format!("d{}", i % 1_000).into(),
                    reading: Reading::new(ts + (i / 1_000) as i64, vec![("x".into(), i as f64)]),
                })
                .collect()
        };
        assert_eq!(store.readings_buffer().capacity(), 0, "nothing written yet");
        let mut first = batch(5_000, 3_600_000);
        first.reserve_exact(1_000);
        store.write(first, &[]).unwrap();
        let grouped = |s: &Store| s.write_lock.lock().unwrap().grouped.capacity();
        assert!(grouped(&store) >= 5_000, "{}", grouped(&store));
        let spare = store.readings_buffer();
        assert_eq!((spare.len(), spare.capacity()), (0, 6_000));
        assert_eq!(store.readings_buffer().capacity(), 0, "taken once");
        // The spare filled and written: stored alike.
        let mut second = spare;
        second.extend(batch(5_000, 7_200_000));
        store.write(second, &[]).unwrap();
        let got = store.read_range("t", "d7", model::TimeRange::new(0, 10_800_000).unwrap()).unwrap().unwrap();
        let want: Vec<Reading> = (0..5)
            .map(|k| Reading::new(3_600_000 + k, vec![("x".into(), (k * 1_000 + 7) as f64)]))
            .chain((0..5).map(|k| Reading::new(7_200_000 + k, vec![("x".into(), (k * 1_000 + 7) as f64)])))
            .collect();
        assert_eq!(got, want);
        assert_eq!(store.readings_buffer().capacity(), 6_000, "the same vector back");
        // Past the bound, neither is kept.
        store.write(batch(KEEP_BUFFER_READINGS + 1, 10_800_000), &[]).unwrap();
        assert_eq!(store.readings_buffer().capacity(), 0);
        assert_eq!(grouped(&store), 0);
    }
}
