//! Column families, their options, and the RocksDB handle. The only place that opens RocksDB.

use std::collections::BTreeMap;
use std::path::Path;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompactionStyle, DBCompressionType,
    MergeOperands, Options, DB,
};

use crate::codec;
use crate::rollups::{ExpiredRollups, RollupRetentions};
use crate::{Error, Result};

/// Hour buckets: `keys::BucketKey` → bucket (`codec`), merged by append.
pub const CF_BUCKETS: &str = "buckets";
/// Latest reading per table and device: `keys::latest_key` → 1-reading bucket, newest ts wins.
/// A reading of the device's newest hour, whose bucket holds the newest (`Store::latest`).
pub const CF_LATEST: &str = "latest";
/// Rejected input: `keys::DeadLetterKey` → dead-letter record.
pub const CF_DEAD_LETTERS: &str = "dead_letters";
/// Device registry: name ↔ id, device records, tag and group indexes (see `crate::keys`).
pub const CF_REGISTRY: &str = "registry";
/// Table catalog: name → definition (versioned, see `crate::catalog`), id → name.
pub const CF_CATALOG: &str = "catalog";

/// The roll-up work queue: `keys::DirtyKey` → mark generation, written in the same WriteBatch as
/// the readings of the hour and deleted by the roll-up stage in the batch that stores its
/// records.
pub const CF_DIRTY: &str = "dirty";
/// Roll-up records: `keys::RollupKey` → record (versioned, see `crate::rollups`).
pub const CF_ROLLUPS: &str = "rollups";

/// Approximate message counts: `keys::counter_key` → u64 BE, merged by addition (see
/// `crate::counters`).
pub const CF_COUNTERS: &str = "counters";

/// Source positions: `keys::kafka_offset_key` → next offset i64 BE, written in the same
/// WriteBatch as the readings they cover.
pub const CF_OFFSETS: &str = "offsets";

/// API tokens by hash: `keys::token_key` → token record, `keys::grant_key` → permission bits
/// (versioned, see `crate::auth`). A denormalized table: one permission check is one multi-get.
pub const CF_AUTH: &str = "auth";

/// The archive manifest: `keys::archive_key` → which file holds an archived partition
/// (versioned, see `crate::archive`).
pub const CF_ARCHIVE: &str = "archive";

/// The write buffer's log: `u64 BE` sequence number → one ingest batch's bucket operands
/// (versioned, see `crate::wbuf`), range-deleted when the buffer is flushed.
pub const CF_WBUF: &str = "wbuf";

/// Every column family this version opens, in a fixed order.
pub const ALL_CFS: [&str; 12] = [
    CF_BUCKETS,
    CF_LATEST,
    CF_DEAD_LETTERS,
    CF_REGISTRY,
    CF_CATALOG,
    CF_DIRTY,
    CF_ROLLUPS,
    CF_COUNTERS,
    CF_OFFSETS,
    CF_AUTH,
    CF_ARCHIVE,
    CF_WBUF,
];

/// Merge-operator names are persisted by RocksDB in the OPTIONS file; renaming one is a format
/// change.
const BUCKET_MERGE_NAME: &str = "hourglass.bucket.v1";
const LATEST_MERGE_NAME: &str = "hourglass.latest.v1";
const COUNTER_MERGE_NAME: &str = "hourglass.counter.v1";

/// Tuning knobs of the RocksDB instance.
#[derive(Debug, Clone)]
pub struct DbOptions {
    /// Shared block cache, bytes.
    pub block_cache_bytes: usize,
    /// Memtable size per column family, bytes (`buckets`: at least
    /// [`BUCKETS_WRITE_BUFFER_BYTES`]).
    pub write_buffer_bytes: usize,
    /// Background flush + compaction threads ([`default_background_jobs`]).
    pub background_jobs: i32,
    /// Threads a compaction of level 0 is split across, by key range
    /// ([`DEFAULT_SUBCOMPACTIONS`]); 1: none.
    pub subcompactions: u32,
    /// How the column families every reading writes (`buckets`, `latest`) are compacted.
    pub compaction: Compaction,
    /// Write-ahead log kept at most, bytes ([`DEFAULT_MAX_WAL_BYTES`]): past it, RocksDB
    /// flushes the column families that hold the oldest log file, so it can be deleted. 0:
    /// RocksDB's own limit, four times the sum of all memtables.
    pub max_wal_bytes: u64,
}

/// The write-ahead log kept at most by default, bytes ([`DbOptions::max_wal_bytes`]).
///
/// A log file is deleted once every column family with data in it has flushed that data.
/// The column families a known fleet hardly writes (`catalog`, `counters`, `wbuf` once the
/// buffer bypasses itself, then `latest`, `dirty` and `registry` between device-hours) hold
/// their memtables for minutes, and with them every log file written since. RocksDB's own
/// limit is four times the sum of all memtables, 8.4 GiB here: 10M devices through MQTT kept
/// 7.5-8.5 GB of log on disk from the sixth minute on, and a restart after a crash, with 7.5 GB
/// to replay, took 49.8 s. With 2 GiB, 10M devices in process kept at most 2.16 GB and restarted
/// in 27.8 s instead of 47.6 (BENCHMARKS.md, "At most 2 GiB of write-ahead log"). 2 GiB
/// leaves the write buffer's records room to die in memory, as `wbuf`'s memtables intend
/// (4 × 128 MiB, about as many bytes again of the operands their flushes write).
pub const DEFAULT_MAX_WAL_BYTES: u64 = 2 << 30;

/// Threads a level-0 compaction is split across by default ([`DbOptions::subcompactions`]):
/// one, no split.
///
/// `background_jobs` 2 leaves RocksDB one compaction thread, and a level-0 compaction of
/// `buckets` overlaps the whole level below, so no other compaction of it can run beside it;
/// late in the hour of 10M devices each took minutes while RocksDB slowed the writes. Split in
/// two (RocksDB runs the second range on a thread of its own, started for that compaction) it
/// ends sooner, but the core it takes is the one decoding and the writer need, and the
/// compactions come more often. 10M devices in process as fast as possible for 20 minutes:
/// 905 and 908 s instead of 969 and 1,066 (+7-17% points/s) for 5-15% more compaction CPU.
/// Through MQTT at the real-time rate the end-to-end p99 rose from 306 and 866 ms to 1,588 and
/// 1,552 (two ticks, two runs each), and through MQTT as fast as possible it stored 3% fewer
/// points/s: the cores were full either way (BENCHMARKS.md, "Subcompactions"). 2 helps only
/// where the cores stand idle while RocksDB slows the writes; `hourglass compact`, a full
/// compaction while nothing else runs, splits across every core.
pub const DEFAULT_SUBCOMPACTIONS: u32 = 1;

/// Most background jobs [`default_background_jobs`] gives.
pub const MAX_DEFAULT_BACKGROUND_JOBS: usize = 16;

/// RocksDB's background jobs (flushes and compactions) by default
/// ([`DbOptions::background_jobs`]): one a core, at least 2, at most
/// [`MAX_DEFAULT_BACKGROUND_JOBS`].
///
/// RocksDB gives a quarter of its jobs (at least one) to flushes and the rest to compactions, so
/// 2 jobs is one compaction at a time; RocksDB runs more only once level 0 falls behind. Every
/// figure in BENCHMARKS.md was measured with 2, on 2 cores, where 4 did not help (3 compactions
/// at once on cores already full). Past 2 cores nothing is measured; more jobs let flushes and
/// the compactions of the other column families and levels run beside the one of `buckets`' level
/// 0, which stays one job (about 10 minutes of one thread's CPU in the 594M-point hour) unless
/// [`DbOptions::subcompactions`] splits it (BENCHMARKS.md, "One core against two").
pub fn default_background_jobs() -> i32 {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    i32::try_from(cores.clamp(2, MAX_DEFAULT_BACKGROUND_JOBS)).unwrap_or(2)
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            block_cache_bytes: 256 << 20,
            write_buffer_bytes: 64 << 20,
            background_jobs: default_background_jobs(),
            subcompactions: DEFAULT_SUBCOMPACTIONS,
            compaction: Compaction::default(),
            max_wal_bytes: DEFAULT_MAX_WAL_BYTES,
        }
    }
}

/// RocksDB's compaction style for the `buckets` and `latest` column families. A store opens
/// with either, whichever it was written with: each level of a leveled store is one sorted run
/// to universal compaction, and universal's sorted runs sit in levels that leveled compaction
/// reads as its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compaction {
    /// Leveled: each level ten times the one above, a file merged into the files it overlaps
    /// one level down. An open device-hour gets an operand every batch it is written in, so
    /// every flush overlaps the whole key range of the open hours' devices and the level below
    /// is rewritten each time: at 10M devices reporting once a minute, the hour written so far
    /// was compacted again every minute. The default: the steadier of the two on two cores.
    #[default]
    Leveled,
    /// Universal (tiered): sorted runs of similar size are merged into one, so a byte is
    /// rewritten about once per doubling of the data rather than once per flush; reads merge
    /// the operands of a few more runs. Its merges are few and large: on two cores one holds
    /// the compaction thread for tens of seconds while sorted runs pile up and writes are
    /// slowed (10M devices through MQTT at the real-time rate: p99 4.9 and 27 s against 1.0
    /// and 5.5 s leveled; in process, as fast as possible, 14% more points/s; BENCHMARKS.md).
    /// As fast as possible through MQTT at 10M series its every pick is a full merge, as each
    /// leveled compaction is there: the flushed operands outweigh the merged buckets below them
    /// (the same compaction CPU over 10 and 20 minutes of the hour; BENCHMARKS.md).
    Universal,
}

fn bucket_full_merge(_key: &[u8], existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    if NEWEST_ONLY.get() {
        return merge_or_log(codec::newest_of_buckets(existing.into_iter().chain(ops)), "bucket newest merge");
    }
    merge_or_log(codec::merge(existing.into_iter().chain(ops)), "bucket full merge")
}

thread_local! {
    /// Whether this thread's reads of `buckets` want each bucket's newest reading alone
    /// ([`NewestOnly`]).
    static NEWEST_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive, a read of `buckets` on this thread answers, for a bucket with merge operands,
/// its newest reading alone as a one-reading bucket ([`codec::newest_of_buckets`]) instead of
/// the merge of its operands: RocksDB runs a read's full merge on the reading thread, and
/// keeps no merge result, so the merge operator may answer what the reader wants. A bucket
/// without operands is answered whole, as before. Compactions and flushes run on RocksDB's own
/// threads, which never see the flag, and no row cache is configured that could keep an
/// answer for another read. Only for reads that take the newest reading of what they get
/// (`Store::latest`).
pub(crate) struct NewestOnly(());

impl NewestOnly {
    pub(crate) fn enter() -> Self {
        NEWEST_ONLY.set(true);
        NewestOnly(())
    }
}

impl Drop for NewestOnly {
    fn drop(&mut self) {
        NEWEST_ONLY.set(false);
    }
}

/// Fewer operands of one bucket than this are left as they are when RocksDB offers to combine
/// them (a memtable flush, a compaction above the bucket's base): the next read or the
/// compaction that reaches the base merges them anyway, so combining a few here decodes and
/// re-encodes the bucket once more for nothing. With the write buffer on, a device-hour gets one
/// operand per buffer flush (a few an hour); those merges took 11% of the CPU of the roll-up
/// benchmark's sustained phase. Written straight, a bucket gets an operand per batch (dozens
/// an hour), which are still combined.
const PARTIAL_MERGE_MIN_OPERANDS: usize = 4;

fn bucket_partial_merge(_key: &[u8], _existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    if ops.len() < PARTIAL_MERGE_MIN_OPERANDS {
        return None;
    }
    merge_or_log(codec::merge(ops), "bucket partial merge")
}

fn latest_full_merge(_key: &[u8], existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    merge_or_log(codec::merge_latest(existing.into_iter().chain(ops)), "latest full merge")
}

fn latest_partial_merge(_key: &[u8], _existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    merge_or_log(codec::merge_latest(ops), "latest partial merge")
}

fn counter_full_merge(_key: &[u8], existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    crate::counters::add_merge(existing.into_iter().chain(ops))
}

fn counter_partial_merge(_key: &[u8], _existing: Option<&[u8]>, ops: &MergeOperands) -> Option<Vec<u8>> {
    crate::counters::add_merge(ops.into_iter())
}

/// A merge that meets a corrupt operand fails loudly: RocksDB then reports corruption on the
/// read or compaction, rather than silently dropping readings.
fn merge_or_log(r: codec::Result<Vec<u8>>, what: &str) -> Option<Vec<u8>> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(error = %e, "{what} failed: corrupt bucket value");
            None
        }
    }
}

/// Level-0 files of `buckets` at which RocksDB slows the writes down (its default: 20).
///
/// Replayed as fast as possible, compaction cannot keep up: each compaction of level 0 rewrites
/// the hour so far, and while it runs the next one's files are flushed. Slowed at 40 files, the
/// writes waited for compactions that took 19–26 files each (10M devices × 1 h through MQTT: 35
/// compactions of `buckets`, 62 GB written). Not slowed before 100, level 0 grows until a
/// compaction takes 21–54 files, and the hour so far is rewritten half as often: the same hour
/// in 33.7–34.3 min instead of 42.2–42.8, `buckets`' compactions writing 23–24 GB in 16–17,
/// 30% less of their CPU (BENCHMARKS.md, "Level 0 of `buckets` not slowed before 100 files").
/// Reads cross more level-0 files: latest-value queries' p99 under that load was 32.9 and 36.6
/// ms against 28.4–31.1, raw and roll-up queries' 1–3 ms more. At the real-time rate neither
/// limit is reached: over the hour of 10M devices through MQTT level 0 held at most 18 files
/// before and 17 with these limits, with no slowdown and an end-to-end p99 of 13.6 ms
/// (BENCHMARKS.md, "The real-time hour at 5c2d2d7").
pub const BUCKETS_L0_SLOWDOWN: i32 = 100;
/// … and stops them (its default: 36): far enough above [`BUCKETS_L0_SLOWDOWN`] that slowed
/// writes let a compaction of level 0 end first.
pub const BUCKETS_L0_STOP: i32 = 140;
/// Level-0 files of `buckets` that start a compaction into the level below (RocksDB's
/// default: 4).
pub const BUCKETS_L0_COMPACTION_TRIGGER: i32 = 12;

/// Bytes of level 0 at which RocksDB compacts `buckets`' level 0 whatever its file count (and the
/// target size of the level it compacts into; RocksDB's default: 256 MiB).
///
/// With levels sized dynamically, RocksDB compacts level 0 once it holds
/// `max_bytes_for_level_base` bytes, however few files that is. A flushed 256 MiB memtable of
/// one-reading operands is about 59 MB, so at the default the size fired at five files and
/// [`BUCKETS_L0_COMPACTION_TRIGGER`] never did: at 10M devices through MQTT at the real-time
/// rate, every compaction of level 0 took five files into level 5 and level 5 was merged into
/// the bottom in ~70 more (100 compactions of `buckets` in 24 minutes, 17.8 GB written). At
/// 1 GiB level 0 is compacted at twelve files, and straight into the bottom level as long as
/// that holds under 1 GiB; past it a level above becomes the base, as before (10 compactions,
/// 7.1 GB written, `rocksdb:low` −16% CPU, the same e2e and query latencies; as fast as
/// possible, the same throughput; BENCHMARKS.md, "Level 0 of `buckets` compacted at twelve
/// files"). Over the first 20 ticks of the real-time hour, on one machine the same day,
/// compaction took 27% less CPU and wrote 51% fewer bytes than at 256 MiB (BENCHMARKS.md, "The
/// real-time hour again, with level 0 compacted at twelve files"). As fast as possible it does
/// not help: level 0 is past both limits whenever a compaction takes it (19–26 files with the
/// writes slowed at 40; 21–54 since [`BUCKETS_L0_SLOWDOWN`] is 100), and the hour of 10M
/// devices through MQTT took 4–5% longer than at 256 MiB (one run against two, writes slowed
/// at 40; BENCHMARKS.md, "The hour of 10M devices through the embedded broker on a faster
/// machine").
pub const BUCKETS_LEVEL_BASE_BYTES: u64 = 1 << 30;

/// Memtable of `buckets`, bytes (at least; `DbOptions::write_buffer_bytes` if larger). When
/// every device reports, each flushed memtable overlaps every device-hour written so far, and
/// level 0 is compacted into the level below every [`BUCKETS_L0_COMPACTION_TRIGGER`] files,
/// rewriting it: four times the other column families' memtables makes those compactions a
/// quarter as many for the same data (10M devices × 10 ticks in process: compaction output 10
/// GB instead of 15, no write slowdowns instead of 27-29, 14% more points/s; BENCHMARKS.md).
/// RocksDB allocates a memtable's arena as it fills, so a small store does not pay for it.
pub const BUCKETS_WRITE_BUFFER_BYTES: usize = 256 << 20;

/// Memtable of `wbuf`, bytes, and how many are flushed together (why: the `wbuf` arm of
/// `cf_options`). On the 10K-truck line-protocol file through `/write` (7.1M lines, the 256 MiB
/// write buffer flushed every 5 s), one 256 MiB memtable at a time wrote 420-660 MB of records
/// out a run, 4 × 128 MiB flushed together 45-240 MB, 4 × 64 MiB 605-747 MB (the four hold
/// about one flush of the buffer's records). The cost is memory: peak RSS 1.23-1.28 GiB
/// (medians) instead of about 1.0. Server CPU: −5.7% in one interleaved A/B, within what the
/// order of the runs alone moves (BENCHMARKS.md).
pub const WBUF_MEMTABLE_BYTES: usize = 128 << 20;
/// See [`WBUF_MEMTABLE_BYTES`].
pub const WBUF_MEMTABLES_MERGED: i32 = 4;

fn cf_options(name: &str, base: &DbOptions, cache: &Cache, rollup_retentions: &RollupRetentions) -> Options {
    let mut o = Options::default();
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    match name {
        CF_BUCKETS => {
            o.set_merge_operator(BUCKET_MERGE_NAME, bucket_full_merge, bucket_partial_merge);
            o.set_write_buffer_size(BUCKETS_WRITE_BUFFER_BYTES.max(base.write_buffer_bytes));
            // A one-reading operand carries its field names, which LZ4 folds across a block:
            // flushes without it were 3.5 times larger, and the compactions spent on moving
            // those bytes what they saved on LZ4 (10M devices, BENCHMARKS.md). The bottommost
            // level (most of the data, merged buckets) gets zstd.
            o.set_compression_type(DBCompressionType::Lz4);
            o.set_bottommost_compression_type(DBCompressionType::Zstd);
            table.set_block_size(32 << 10);
            // Each memtable flushed here overlaps the whole lower level when every device
            // reports (one operand a device-hour each), so level 0 fills in bursts while the
            // compactions that empty it rewrite the hour so far. At RocksDB's default limits
            // (20 files: slow down, 36: stop) 10M devices through MQTT at 166,667 points/s
            // were slowed every 30-60 s for 10-20 s at a time (e2e p99 14.2 s over five ticks);
            // at 40 and 64, never (p99 1.1 s), though compaction kept up on average in both
            // (BENCHMARKS.md, "latest once per device-hour"). As fast as possible, see the
            // constants.
            o.set_level_zero_slowdown_writes_trigger(BUCKETS_L0_SLOWDOWN);
            o.set_level_zero_stop_writes_trigger(BUCKETS_L0_STOP);
            // … and compacts level 0 only once it holds this many files: each such compaction
            // rewrites the hour so far, so fewer, larger ones write less (10M devices × 5 ticks
            // in process: 6.4 GB of compaction output instead of 9.1 at RocksDB's default of 4).
            o.set_level_zero_file_num_compaction_trigger(BUCKETS_L0_COMPACTION_TRIGGER);
            // … which RocksDB also does once level 0 holds this many bytes: see the constant.
            o.set_max_bytes_for_level_base(BUCKETS_LEVEL_BASE_BYTES);
        }
        CF_LATEST => {
            o.set_merge_operator(LATEST_MERGE_NAME, latest_full_merge, latest_partial_merge);
            // One operand a device-hour (`Store::latest`), but one a device on a fleet's
            // first tick or after a restart. When it was one a device a batch, half of this
            // let 10M devices reporting twice pile up 20 level-0 files here and RocksDB slowed
            // the store's writes (16-32 slowdowns and 1-2 stops a run; 192K points/s, 222K with
            // this; BENCHMARKS.md).
            o.set_write_buffer_size(base.write_buffer_bytes);
            o.set_compression_type(DBCompressionType::Lz4);
            // Point lookups (multi-get of many devices) skip files by bloom filter. The filters
            // stay with their open files (about 1.2 bytes a key: 25 MiB at 10M devices × 2
            // tables), not in the block cache: a file's filter is one block, and once `latest`
            // values became pointers a file held millions of keys and queries under ingest read
            // and checksummed whole filter blocks from the files again and again (`perf`; 7-8 ms
            // added to each query's p50 at 10M devices; BENCHMARKS.md).
            table.set_bloom_filter(10.0, false);
        }
        CF_WBUF => {
            // Records live until the next flush of the write buffer deletes them: they should
            // die in memory, never written out. A memtable fills with records newer than the
            // last delete as well as older ones, and RocksDB writes those out when it flushes
            // it. Flushed [`WBUF_MEMTABLES_MERGED`] at a time, the memtables are merged, and a
            // delete in a later one drops the records of the earlier ones: only the records
            // after the last delete of the set are written out, a smaller share of the data.
            o.set_write_buffer_size(WBUF_MEMTABLE_BYTES);
            o.set_min_write_buffer_number_to_merge(WBUF_MEMTABLES_MERGED);
            o.set_max_write_buffer_number(WBUF_MEMTABLES_MERGED + 2);
            o.set_compression_type(DBCompressionType::None);
        }
        CF_DIRTY => {
            // One mark per device-hour written: at one reading a device per batch (10M devices)
            // as many marks as readings, and a write-buffer flush puts millions at once. An 8 MiB
            // memtable filled so often that L0 files piled up and writes were slowed (10M known
            // devices: 223K readings/s with 8 MiB, 268K with 64 MiB; BENCHMARKS.md).
            o.set_write_buffer_size(base.write_buffer_bytes);
            o.set_compression_type(DBCompressionType::Lz4);
            table.set_bloom_filter(10.0, false);
        }
        CF_ROLLUPS => {
            // Each pass rewrites the day records of every device and group it touches
            // (and the group hours): in a memtable that holds several passes, the rewrites of one
            // record replace each other there instead of each reaching an SST file and a
            // compaction. With 8 MiB, the roll-up benchmark's sustained phase flushed it about
            // once a second and compacted it every other second.
            o.set_write_buffer_size(base.write_buffer_bytes);
            o.set_compression_type(DBCompressionType::Lz4);
            table.set_bloom_filter(10.0, false);
            // Records past their table's roll-up retention go at compaction; with a filter
            // RocksDB also compacts every file at least once in 30 days, so they do go.
            o.set_compaction_filter_factory(ExpiredRollups(rollup_retentions.clone()));
        }
        CF_REGISTRY => {
            // Each device seen for the first time writes its name and id keys (and its record
            // when placed): registering 10M devices put 20M+ keys through an 8 MiB memtable,
            // 179 flushes in 2 minutes, and the level-0 files they left stalled every write of
            // the store (RocksDB's LOG: 38 slowdowns, 6 stops; BENCHMARKS.md, 10M devices).
            o.set_write_buffer_size(base.write_buffer_bytes);
            o.set_compression_type(DBCompressionType::Lz4);
            table.set_bloom_filter(10.0, false);
        }
        CF_COUNTERS => {
            o.set_merge_operator(COUNTER_MERGE_NAME, counter_full_merge, counter_partial_merge);
            o.set_write_buffer_size(8 << 20);
            o.set_compression_type(DBCompressionType::Lz4);
        }
        _ => {
            o.set_write_buffer_size(8 << 20);
            o.set_compression_type(DBCompressionType::Lz4);
            table.set_bloom_filter(10.0, false);
        }
    }
    o.set_block_based_table_factory(&table);
    if base.compaction == Compaction::Universal && (name == CF_BUCKETS || name == CF_LATEST) {
        o.set_compaction_style(DBCompactionStyle::Universal);
    }
    // Off while the store opens: see [`resume_compactions`].
    o.set_disable_auto_compactions(true);
    o
}

/// Turns on the automatic compactions [`open`] leaves off. An open of a large store reads its
/// registry and roll-up marks on every core (10M devices: about 17 s of CPU); a compaction
/// left owing by the last run (or abandoned by its stop) started at once took about a quarter
/// of the CPU of that open in a profile. Nothing is written before this is called, so level 0
/// cannot fill in the meantime.
pub(crate) fn resume_compactions(db: &DB) -> Result<()> {
    for name in ALL_CFS {
        db.set_options_cf(cf(db, name), &[("disable_auto_compactions", "false")])
            .map_err(crate::db_err("turn on compactions"))?;
    }
    Ok(())
}

/// Opens (creating if needed) the database at `path` with every column family configured —
/// opening by name alone would drop the merge operators and the roll-ups' compaction filter,
/// which reads `rollup_retentions`.
pub(crate) fn open(path: &Path, base: &DbOptions, rollup_retentions: &RollupRetentions) -> Result<DB> {
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.set_max_background_jobs(base.background_jobs);
    db_opts.set_max_subcompactions(base.subcompactions.max(1));
    db_opts.set_bytes_per_sync(1 << 20);
    db_opts.set_max_total_wal_size(base.max_wal_bytes);
    let cache = Cache::new_lru_cache(base.block_cache_bytes);
    let cfs = ALL_CFS
        .iter()
        .map(|name| ColumnFamilyDescriptor::new(*name, cf_options(name, base, &cache, rollup_retentions)));
    DB::open_cf_descriptors(&db_opts, path, cfs)
        .map_err(|source| Error::Open { path: path.display().to_string(), source })
}

/// The options RocksDB wrote down for the database at `path` (a store's `rocksdb` directory)
/// when it was last opened, from its newest `OPTIONS-NNNNNN` file: section (`DBOptions`,
/// `CFOptions "buckets"`, `TableOptions/BlockBasedTable "buckets"`, …, as the file names it
/// between brackets) → option name → value, as written there. What a store really runs with,
/// whatever the code or the configuration asked for; `None` when `path` holds no such file.
pub fn persisted_options(path: &Path) -> std::io::Result<Option<BTreeMap<String, BTreeMap<String, String>>>> {
    let mut newest: Option<(u64, std::path::PathBuf)> = None;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let number = entry.file_name().to_str().and_then(|n| n.strip_prefix("OPTIONS-")?.parse::<u64>().ok());
        if let Some(number) = number {
            if newest.as_ref().is_none_or(|(n, _)| number > *n) {
                newest = Some((number, entry.path()));
            }
        }
    }
    let Some((_, file)) = newest else { return Ok(None) };
    Ok(Some(parse_options_file(&std::fs::read_to_string(file)?)))
}

/// The sections of the text of a RocksDB OPTIONS file ([`persisted_options`]): `[name]` starts a
/// section, `key=value` lines fill it (spaces around them trimmed); comments (`#`) and lines
/// before the first section are skipped.
fn parse_options_file(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.entry(name.to_string()).or_default();
            current = Some(name.to_string());
        } else if let (Some(options), Some((key, value))) =
            (current.as_deref().and_then(|name| sections.get_mut(name)), line.split_once('='))
        {
            options.insert(key.trim().to_string(), value.trim().to_string());
        }
    }
    sections
}

/// Read options of a scan that reads a column family once from end to end at open: its blocks
/// are not kept in the block cache (they would only push out others), and read ahead.
pub(crate) fn one_pass_read() -> rocksdb::ReadOptions {
    let mut opts = rocksdb::ReadOptions::default();
    opts.fill_cache(false);
    opts.set_readahead_size(2 << 20);
    opts
}

/// The handle of a column family that [`open`] always creates.
pub(crate) fn cf<'a>(db: &'a DB, name: &'static str) -> &'a ColumnFamily {
    // `open` creates every name of ALL_CFS; a missing one is a programming error.
    #[allow(clippy::expect_used)]
    db.cf_handle(name).expect("column family created by store::open")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Sections by their bracketed names, options by key; comments and the lines before the
    /// first section skipped; a section's options do not run into the next one's.
    #[test]
    fn options_file_is_read_by_section() {
        let text = "# This is a RocksDB option file.\n\
                    stray=1\n\
                    [Version]\n  rocksdb_version=10.4.2\n\n\
                    [DBOptions]\n  max_subcompactions=2\n  # a comment=no\n\
                    [CFOptions \"buckets\"]\n  level0_stop_writes_trigger=140\n  compression=kLZ4Compression\n\
                    [TableOptions/BlockBasedTable \"buckets\"]\n  block_size=4096\n\
                    [CFOptions \"latest\"]\n";
        let sections = parse_options_file(text);
        let names: Vec<&str> = sections.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "CFOptions \"buckets\"",
                "CFOptions \"latest\"",
                "DBOptions",
                "TableOptions/BlockBasedTable \"buckets\"",
                "Version"
            ]
        );
        let pairs =
            |s: &str| -> Vec<(String, String)> { sections[s].iter().map(|(k, v)| (k.clone(), v.clone())).collect() };
        let owned = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(pairs("DBOptions"), owned(&[("max_subcompactions", "2")]));
        assert_eq!(
            pairs("CFOptions \"buckets\""),
            owned(&[("compression", "kLZ4Compression"), ("level0_stop_writes_trigger", "140")])
        );
        assert_eq!(pairs("TableOptions/BlockBasedTable \"buckets\""), owned(&[("block_size", "4096")]));
        assert_eq!(pairs("Version"), owned(&[("rocksdb_version", "10.4.2")]));
        assert!(sections["CFOptions \"latest\""].is_empty());
    }

    /// The newest file by number, not by name order (`OPTIONS-9` is older than `OPTIONS-10`),
    /// and `None` for a directory without one.
    #[test]
    fn persisted_options_come_from_the_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(persisted_options(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("OPTIONS-9"), "[DBOptions]\n  max_subcompactions=1\n").unwrap();
        std::fs::write(dir.path().join("OPTIONS-10"), "[DBOptions]\n  max_subcompactions=2\n").unwrap();
        std::fs::write(dir.path().join("OPTIONS-10.dbtmp"), "[DBOptions]\n  max_subcompactions=3\n").unwrap();
        let options = persisted_options(dir.path()).unwrap().unwrap();
        assert_eq!(options["DBOptions"]["max_subcompactions"], "2");
        assert!(persisted_options(&dir.path().join("missing")).is_err());
    }
}
