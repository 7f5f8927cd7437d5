//! The write buffer of open hour buckets: an ingest batch becomes one RocksDB record, not three
//! operations a device-hour.
//!
//! Without it, each batch writes one `buckets` merge operand, one dirty mark and one `latest`
//! operand for every device-hour it touches. When a batch holds one reading of each of many
//! devices, that is three RocksDB operations a reading, and RocksDB's memtable inserts bound
//! the store (see BENCHMARKS.md, "Storage write path"). With the buffer on
//! ([`StoreConfig::write_buffer`](crate::StoreConfig::write_buffer)):
//!
//! - **A batch**'s readings of each device-hour (its *operand* here, as the direct path would
//!   write one) are copied as rows (module `rows`: no bucket encoding, fields named by ids)
//!   into **one** record of the `wbuf` column family (key: sequence number, u64 BE), in the
//!   same WriteBatch as the batch's registry, catalog, counter, dead-letter and Kafka-offset
//!   entries — so it is as durable as before when acked. The rows are then kept in memory,
//!   per (table, device), per hour, appended batch after batch.
//! - **Reads** merge the buffer over RocksDB: raw reads append an hour's buffered operands
//!   after its bucket (a buffered reading wins at equal time, as a later operand would), and
//!   `latest` and "has data" checks look at the buffer too. Nothing acked is ever invisible.
//! - **A flush** hands the buffer over (under the write lock, a moment: writers then fill a new
//!   one) and writes, per device-hour of the handed-over buffer, ONE operand (its rows encoded
//!   once as a bucket: the merge of its operands), one dirty mark (unless one is known there:
//!   "Marks" below), and per device one
//!   `latest` operand when it marks the device's newest hour (`Store::latest`), then
//!   range-deletes its `wbuf`
//!   records (the ones below the sequence number at the hand-over) — beside the writers. Reads
//!   see both buffers until the flush ends (the handed-over one holds the older operands). Large
//!   flushes are committed in chunks; the last chunk carries the range delete. A crash between
//!   chunks replays every record at the next open, oldest first, and writes the same operands
//!   again: a merge of a reading that is already there at the same time with the same values
//!   changes nothing, and nothing newer reaches the buckets in between (newer batches are in
//!   the new buffer's records, replayed after; a direct write flushes first), so replay is
//!   exact. One flush at a time; its marks are committed under the lock the roll-up stage holds
//!   from reading marks' generations to deleting them, and carry a generation no later write
//!   uses.
//! - **When**: a write that takes the buffer past its size, or past its age, flushes it; a
//!   roll-up pass flushes it first when it holds an hour the pass could roll up; spills,
//!   retention, [`Store::flush`](crate::Store::flush) and the inspection helpers flush first.
//! - **Carry**: a roll-up pass's flush (when an hour closes, as the next has just begun)
//!   leaves the hours that end after its watermark in the buffer when they hold at most half of
//!   it: at the hand-over their operands move to the new buffer, and the flush deletes only the
//!   records below the first one that holds an operand of them, instead of all the records it
//!   flushed. The records kept also hold operands of the hours it did flush; a replay writes
//!   those again, in record order, which changes nothing (as above). Each closed device-hour
//!   then reaches `buckets` as one operand instead of two (its first minutes flushed with the
//!   hour before, then the rest), and the pass's read of it merges nothing. Only a pass's flush
//!   carries: the flush before a direct write deletes every record, so no record older than a
//!   direct write is ever replayed.
//! - **Bypass**: the saving is the operands a device-hour gets between flushes, minus one. A
//!   fleet of more devices than the buffer holds gets about one each, and the buffer only adds
//!   its bookkeeping; when a write finds it due at fewer than
//!   [`WriteBufferConfig::bypass_below`] operands a device-hour, it is flushed and batches go
//!   straight to their buckets for a while. A direct write of a series lands after every
//!   buffered operand of that series: the write that decides to bypass hands the buffer over
//!   to the flusher thread, and direct writes then go beside that flush as long as nothing was
//!   buffered since, the buffer holds none of their series, and the records still stored hold
//!   operands of that buffer alone (it carried no hours over and was not carried into) — a
//!   replay after a crash writes only other series. Any other direct write flushes first and
//!   waits for it. (At 10M devices, waiting stopped the writers for 4-6 s at each bypass.)
//!   The flush of a bypassed buffer is work deferred, paid at once beside the direct writes:
//!   at 10M devices through MQTT at the real-time rate, each of the 5-second buffers added
//!   seconds of end-to-end latency. So once bypassed, the buffer is tried again for a fifth of
//!   `max_age` first ([`PROBE_SHARE`]) and bypassed again if its operands a device-hour,
//!   extrapolated to `max_age`, stay under `bypass_below`. A fleet that sped up to between one
//!   reading a `max_age / 5` and one a `max_age / bypass_below` (1 to 2.5 s by default) after a
//!   bypass looks unchanged at that point and stays bypassed: a missed saving, never a wrong
//!   result.
//! - **Marks**: a flush writes no dirty mark for a device-hour whose hour was still open at the
//!   hand-over (ending after the largest event time committed then) and whose mark the writers
//!   knew stored and unread then (`crate::open_marks`; the hand-over copies those bitmaps).
//!   No roll-up pass can read such a mark before the flush commits: a pass that began before
//!   the hand-over had a watermark at or before that event time, so not past the hour; one
//!   that begins later with a watermark past the hour finds the handed-over buffer holding it
//!   and, before it reads any mark, flushes it or waits for the flush under way (one flush at
//!   a time). After its last
//!   commit the flush adds the marks it wrote in hours still open to the writers' bitmaps,
//!   under the writers' lock, so the next flush and direct writes skip them in turn. At one
//!   reading a device a minute, a device-hour is then marked once an hour, not once a flush.
//! - **At open** the `wbuf` records are read back into the buffer, oldest first.
//!
//! Records are written in version 3 (`Record`); versions 2 (rows under fixed-width heads) and 1
//! (bucket-encoded operands, written before rows) are still replayed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use model::{Hour, Reading};
use rocksdb::{WriteBatch, WriteOptions};

use crate::keys::{self, BucketKey, DirtyKey};
use crate::open_marks::OpenMarks;
use crate::outliers::merge_by_minute;
use crate::prepared::{Group, PreparedRows};
use crate::rows::{self, FieldIds};
use crate::series_table::{Hours, SeriesTable};
use crate::store::{cf, CF_BUCKETS, CF_DIRTY, CF_LATEST, CF_WBUF};
use crate::{codec, db_err, read, write};
use crate::{DeviceReading, Error, FastMap, Result, Store, WriterState};

/// Settings of the write buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteBufferConfig {
    /// Flush once the buffered operands (and their bookkeeping) take this many bytes.
    pub max_bytes: usize,
    /// Flush once the oldest buffered write is this old (checked on each write).
    pub max_age: Duration,
    /// When a write finds the buffer due (full or aged) with fewer operands than this per
    /// buffered device-hour, it saves
    /// next to nothing (a fleet of more devices than it holds sends one reading each between
    /// flushes) and costs its own bookkeeping: batches then go straight to their buckets for
    /// `bypass_for` (doubled each time in a row, up to 16 times), after a flush.
    pub bypass_below: f64,
    /// See `bypass_below`.
    pub bypass_for: Duration,
}

/// The buffer's size by default, MiB ([`WriteBufferConfig::default`], and `storage.write_buffer_mb`
/// when unset): 128 rather than 256, as a fresh process's first touch of two buffers (the one
/// filling, the one being flushed) is part of every short load (BENCHMARKS.md).
pub const DEFAULT_WRITE_BUFFER_MIB: u64 = 128;

impl WriteBufferConfig {
    /// The default buffer of `mib` MiB (`storage.write_buffer_mb`); `None` for 0 (off).
    pub fn of_mib(mib: u64) -> Option<WriteBufferConfig> {
        (mib > 0).then(|| WriteBufferConfig {
            max_bytes: usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            ..WriteBufferConfig::default()
        })
    }
}

impl Default for WriteBufferConfig {
    fn default() -> Self {
        WriteBufferConfig {
            max_bytes: (DEFAULT_WRITE_BUFFER_MIB as usize) << 20,
            max_age: Duration::from_secs(5),
            bypass_below: 2.0,
            bypass_for: Duration::from_secs(30),
        }
    }
}

/// After a bypass, the buffer tried again is judged after `max_age / PROBE_SHARE` already: at
/// fewer operands a device-hour than `bypass_below` extrapolated linearly to `max_age` (below
/// 1.2 with the defaults), it is bypassed again.
pub const PROBE_SHARE: u32 = 5;

/// Version byte of a `wbuf` record of codec operands (written before rows; still replayed).
const RECORD_V1: u8 = 1;
/// Version byte of a `wbuf` record of rows with fixed-width entry heads (still replayed).
const RECORD_V2: u8 = 2;
/// Version byte of a `wbuf` record of rows with varint entry heads.
const RECORD_V3: u8 = 3;
/// Bytes of an operand's head in a version 1 record.
const OP_HEAD: usize = 4 + 8 + 4 + 4 + 4;
/// Bytes of an entry's head in a version 2 record.
const ENTRY_HEAD: usize = 4 + 8 + 4 + 4 + 4 + 4 + 4;
/// Room for an entry's head in a version 3 record, when sizing one: its seven varints take
/// about 7 bytes for consecutive devices (up to 70).
pub(crate) const ENTRY_HEAD_ROOM: usize = 16;
/// Bookkeeping counted per buffered device-hour and per series (allocation and map overhead).
const HOUR_OVERHEAD: usize = 64;
const SERIES_OVERHEAD: usize = 64;

/// The buffered readings of one device-hour, as rows ([`rows`]) in the order written.
#[derive(Debug, Default)]
pub(crate) struct HourOps {
    pub(crate) hour: i32,
    pub(crate) partition: i32,
    /// The readings of every batch, oldest batch first.
    rows: Vec<u8>,
    /// Readings in `rows`.
    n: usize,
    /// Batches (operands) appended.
    appends: usize,
    /// The greatest schema version the batches were checked against.
    schema_version: u32,
}

impl HourOps {
    /// The readings merged into one bucket (format v2): for a time written twice, the later
    /// write's reading. With the newest time.
    pub(crate) fn merged(&self, names: &[(model::FieldName, model::FieldType)]) -> Result<(Vec<u8>, i64)> {
        let mut out = Vec::with_capacity(self.rows.len() / 2 + 64);
        let newest = rows::bucket(&self.rows, self.n, self.schema_version, names, &mut out).map_err(corrupt)?;
        Ok((out, newest))
    }

    /// Appends the readings to `out`, oldest batch first (not sorted across batches:
    /// `codec::sort_dedup_last_wins` keeps the later one of a time).
    pub(crate) fn decode_into(
        &self,
        names: &[(model::FieldName, model::FieldType)],
        out: &mut Vec<Reading>,
    ) -> Result<()> {
        let start = out.len();
        rows::to_readings(&self.rows, names, out).map_err(|e| {
            out.truncate(start);
            corrupt(e)
        })
    }
}

pub(crate) fn corrupt(detail: &str) -> Error {
    Error::Corrupt { what: "write buffer rows", detail: detail.to_string() }
}

fn corrupt_operand(e: codec::Error) -> Error {
    Error::Corrupt { what: "write buffer operand", detail: e.to_string() }
}

/// What the buffer holds: per (table id, device id), the device's buffered hours in hour order.
#[derive(Debug, Default)]
pub(crate) struct Buffer {
    pub(crate) series: SeriesTable<Hours<HourOps>>,
    /// Approximate memory of the buffered operands and their bookkeeping.
    pub(crate) bytes: usize,
    /// When the oldest buffered write was committed.
    oldest: Option<Instant>,
    /// Buffered operands.
    pub(crate) operands: usize,
    /// Buffered device-hours.
    hours: usize,
    /// The oldest buffered hour.
    min_hour: Option<i32>,
    /// Per buffered hour, the sequence number of the first record holding an operand of it
    /// (hours are few: a short list).
    first_seq: Vec<(i32, u64)>,
    /// Whether it holds hours carried over by a flush: the records kept for them hold operands
    /// of hours that flush wrote too.
    carried: bool,
}

impl Buffer {
    pub(crate) fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Whether the buffer is due for a flush under `cfg`.
    pub(crate) fn due(&self, cfg: &WriteBufferConfig) -> bool {
        self.memory() >= cfg.max_bytes || self.aged(cfg.max_age)
    }

    /// Approximate memory: the buffered operands, their bookkeeping and the index of series.
    pub(crate) fn memory(&self) -> usize {
        self.bytes + self.series.index_bytes()
    }

    /// Whether the oldest buffered write is at least `age` old.
    pub(crate) fn aged(&self, age: Duration) -> bool {
        self.oldest.is_some_and(|t| t.elapsed() >= age)
    }

    /// Whether any buffered hour ends at or before `watermark` (epoch ms).
    pub(crate) fn holds_hour_ending_by(&self, watermark: i64) -> bool {
        self.oldest_hour_ms().is_some_and(|start| start + model::HOUR_MS <= watermark)
    }

    /// Buffered operands per buffered device-hour (0 when empty): how many operands a flush
    /// saves, plus one.
    pub(crate) fn operands_per_hour(&self) -> f64 {
        self.operands as f64 / self.hours.max(1) as f64
    }

    /// Start (epoch ms) of the oldest buffered hour.
    pub(crate) fn oldest_hour_ms(&self) -> Option<i64> {
        self.min_hour.map(|h| Hour(i64::from(h)).start_ms())
    }

    /// Adds the `n` readings `rows` (one batch: one operand) of device `device` in table
    /// `table`, hour `hour` (in partition `partition`), checked against schema version
    /// `schema_version`, after the ones buffered before.
    pub(crate) fn append(
        &mut self,
        (table, device): (u32, u64),
        (hour, partition): (i32, i32),
        (n, schema_version): (usize, u32),
        rows: &[u8],
    ) {
        let (hours, new) = self.series.get_or_insert_with((table, device), Hours::new);
        if new {
            self.bytes += SERIES_OVERHEAD;
        }
        // Hours are few a device (usually one): find from the end, where new ones land.
        let at = match hours.iter().rposition(|h| h.hour <= hour) {
            Some(i) if hours[i].hour == hour => i,
            found => {
                let i = found.map_or(0, |i| i + 1);
                hours.insert(i, HourOps { hour, partition, ..HourOps::default() });
                self.bytes += HOUR_OVERHEAD;
                self.hours += 1;
                i
            }
        };
        let h = &mut hours[at];
        let before = h.rows.capacity();
        h.rows.extend_from_slice(rows);
        h.n += n;
        h.appends += 1;
        h.schema_version = h.schema_version.max(schema_version);
        self.bytes += h.rows.capacity() - before;
        self.operands += 1;
        self.oldest.get_or_insert_with(Instant::now);
        self.min_hour = Some(self.min_hour.map_or(hour, |m| m.min(hour)));
    }

    /// Notes that record `seq` holds an operand of `hour` (records come in order).
    fn note_seq(&mut self, hour: i32, seq: u64) {
        if !self.first_seq.iter().any(|&(h, _)| h == hour) {
            self.first_seq.push((hour, seq));
        }
    }

    /// Buffered bytes (as [`Buffer::bytes`] counts them) of the hours that end after
    /// `watermark`.
    fn bytes_of_hours_after(&self, watermark: i64) -> usize {
        let open = |h: &&HourOps| Hour(i64::from(h.hour)).end_ms() > watermark;
        self.series.values().flatten().filter(open).map(|h| h.rows.capacity() + HOUR_OVERHEAD).sum()
    }

    /// Moves the hours that end after `watermark` to `into` (an empty buffer), and returns the
    /// sequence number of the first record holding an operand of them: the records from it on
    /// must stay. The hours are the newest of their devices, so they stay in order in `into`.
    fn move_hours_after(&mut self, watermark: i64, into: &mut Buffer) -> u64 {
        let open = |hour: i32| Hour(i64::from(hour)).end_ms() > watermark;
        let mut moved: Vec<((u32, u64), Hours<HourOps>)> = Vec::new();
        let mut emptied = 0;
        self.series.retain(|&series, kept| {
            // Hours are in order: the open ones are a tail.
            let Some(first_open) = kept.iter().position(|h| open(h.hour)) else {
                return true;
            };
            moved.push((series, kept.drain(first_open..).collect()));
            emptied += usize::from(kept.is_empty());
            !kept.is_empty()
        });
        self.bytes -= emptied * SERIES_OVERHEAD;
        for (series, hours) in moved {
            for h in &hours {
                let (size, n) = (h.rows.capacity() + HOUR_OVERHEAD, h.appends);
                self.bytes -= size;
                self.operands -= n;
                self.hours -= 1;
                into.bytes += size;
                into.operands += n;
                into.hours += 1;
                into.min_hour = Some(into.min_hour.map_or(h.hour, |m| m.min(h.hour)));
            }
            into.bytes += SERIES_OVERHEAD;
            into.series.insert(series, hours);
        }
        into.oldest.get_or_insert_with(Instant::now);
        into.carried = true;
        // Every moved hour has its first record noted (records note their hours as they are
        // applied or replayed); one without would keep every record.
        let mut keep_from = u64::MAX;
        let mut moved_hours: Vec<i32> = into.series.values().flatten().map(|h| h.hour).collect();
        // One lookup an hour, not one a device-hour.
        moved_hours.sort_unstable();
        moved_hours.dedup();
        for hour in moved_hours {
            let seq = self.first_seq.iter().find(|&&(h, _)| h == hour).map_or(0, |&(_, seq)| seq);
            keep_from = keep_from.min(seq);
            into.note_seq(hour, seq);
        }
        self.first_seq.retain(|&(hour, _)| !open(hour));
        keep_from
    }

    /// The buffered hours of a device in a table, in hour order.
    pub(crate) fn hours(&self, table: u32, device: u64) -> &[HourOps] {
        self.series.get(&(table, device)).map_or(&[], Hours::as_slice)
    }

    /// The newest buffered reading of a device in a table (for a time written twice, the later
    /// write).
    pub(crate) fn latest(
        &self,
        table: u32,
        device: u64,
        names: &[(model::FieldName, model::FieldType)],
    ) -> Result<Option<Reading>> {
        // The newest hour holds the newest reading.
        let Some(last) = self.hours(table, device).last() else {
            return Ok(None);
        };
        rows::newest(&last.rows, names).map_err(corrupt)
    }
}

/// A buffer being flushed, with what its flush writes under.
#[derive(Debug)]
pub(crate) struct Frozen {
    pub(crate) buffer: Buffer,
    /// Its flush deletes the records below this sequence number: the ones it holds the
    /// operands of, unless it carried hours over (then the first record holding an operand of
    /// them).
    keep_from: u64,
    /// The generation of the dirty marks its flush writes.
    mark_gen: u64,
    /// The largest event time committed at the hand-over.
    open_at: i64,
    /// The writers' open-hour marks at the hand-over, for the hours open at `open_at`: the
    /// flush writes no mark of a device-hour found here (module docs, "Marks").
    marks: OpenMarks,
    /// Whether the records below `keep_from` hold operands of this buffer only (it carried
    /// nothing over, and was not carried into): a direct write of other series may then go
    /// beside its flush (module docs, "Bypass").
    exclusive: bool,
}

/// The write buffer: the one writes go to, and the one being flushed, if any (older).
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    pub(crate) active: Buffer,
    pub(crate) frozen: Option<Arc<Frozen>>,
}

impl Buffers {
    /// The buffers holding operands, oldest first.
    fn parts(&self) -> impl Iterator<Item = &Buffer> {
        self.frozen.iter().map(|f| &f.buffer).chain(std::iter::once(&self.active))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parts().all(Buffer::is_empty)
    }

    /// Whether any buffered hour ends at or before `watermark` (epoch ms).
    pub(crate) fn holds_hour_ending_by(&self, watermark: i64) -> bool {
        self.parts().any(|b| b.holds_hour_ending_by(watermark))
    }

    /// Start (epoch ms) of the oldest buffered hour.
    pub(crate) fn oldest_hour_ms(&self) -> Option<i64> {
        self.parts().filter_map(Buffer::oldest_hour_ms).min()
    }

    /// Buffered operands, not flushed yet.
    pub(crate) fn operands(&self) -> usize {
        self.parts().map(|b| b.operands).sum()
    }

    /// Whether a device in a table has buffered readings.
    pub(crate) fn holds_series(&self, table: u32, device: u64) -> bool {
        self.parts().any(|b| b.series.contains_key(&(table, device)))
    }
}

/// What writers tell the flusher thread ([`Store::start_flusher`]).
#[derive(Debug, Default)]
pub(crate) struct FlushSignal {
    /// (a flush is wanted, the thread is to stop)
    state: Mutex<(bool, bool)>,
    wake: Condvar,
}

impl FlushSignal {
    /// Asks the flusher thread for a flush.
    pub(crate) fn want(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = true;
        self.wake.notify_one();
    }
}

/// The thread flushing the write buffer when a write finds it due, so that writers go on
/// (into a new buffer) instead of waiting for the flush. Stops, after a flush in progress, when
/// [`Flusher::stop`]ped or dropped; from then on writes flush a due buffer themselves.
#[derive(Debug)]
pub struct Flusher {
    store: std::sync::Weak<Store>,
    signal: Arc<FlushSignal>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    /// Stops the thread after the flush in progress, if any.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(store) = self.store.upgrade() {
            store.flusher_on.store(false, Ordering::SeqCst);
        }
        self.signal.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.signal.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A panic of the thread was a panic of a flush: the buffer and its records stay.
            let _ = thread.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Builds one `wbuf` record: [`Record::push`] each device-hour's readings, [`Record::finish`],
/// then [`Record::bytes`].
///
/// Record format, version 3: `u8 3`, then per device-hour an entry `Δtable · Δdevice · Δhour ·
/// Δpartition · schema version · readings · length · rows` ([`rows`]), all but the rows
/// varints; a Δ is the zigzag varint of the difference from the entry before (from 0 for the
/// first; the device's wrapping, as `u64`). Entries come in key order, so a head is about 7
/// bytes, where version 2's fixed-width one took 32 (a third of a one-reading entry). Then
/// the list of the field ids the rows use, `count u32 BE · count × (id u32 BE · type code u8 ·
/// name length u32 BE · name)`, and last the list's offset in the record, `u32 BE`.
///
/// Version 2 had the same layout with each head `table u32 BE · device u64 BE · hour i32 BE ·
/// partition i32 BE · schema version u32 BE · readings u32 BE · length u32 BE`.
#[derive(Debug)]
pub(crate) struct Record {
    bytes: Vec<u8>,
    entries: Vec<RecordEntry>,
    writer: rows::RowWriter,
    finished: bool,
    /// The last entry's (table, device, hour, partition): the next head holds differences.
    prev: EntryKey,
    /// One entry's rows, written before its head (which holds their length).
    scratch: Vec<u8>,
}

/// An entry's key fields, as a head holds them.
type EntryKey = (u32, u64, i32, i32);

/// A device-hour of a [`Record`]: where its rows lie in the record.
#[derive(Debug)]
struct RecordEntry {
    series: (u32, u64),
    hour: i32,
    partition: i32,
    n: usize,
    schema_version: u32,
    at: std::ops::Range<usize>,
}

impl Record {
    #[cfg(test)]
    pub(crate) fn new() -> Record {
        Record::with_capacity(0, 0)
    }

    /// A record with room for `bytes` bytes of rows and `entries` device-hours (a batch's
    /// record grows to megabytes and thousands of device-hours: growing it by doubling copies
    /// it each time, into fresh memory pages).
    pub(crate) fn with_capacity(bytes: usize, entries: usize) -> Record {
        let mut record = Vec::with_capacity(1 + bytes);
        record.push(RECORD_V3);
        Record {
            bytes: record,
            entries: Vec::with_capacity(entries),
            writer: rows::RowWriter::default(),
            finished: false,
            prev: (0, 0, 0, 0),
            scratch: Vec::new(),
        }
    }

    /// Appends the readings `readings` (sorted by time, no time twice) of device-hour
    /// (`series`, `hour`), checked against schema version `schema_version`, as rows naming
    /// their fields by ids of `ids`.
    pub(crate) fn push(
        &mut self,
        ids: &FieldIds,
        series: (u32, u64),
        (hour, partition): (i32, i32),
        schema_version: u32,
        readings: &[Reading],
    ) {
        let mut rows = std::mem::take(&mut self.scratch);
        rows.clear();
        self.writer.put(ids, readings, &mut rows);
        self.push_entry(series, (hour, partition), (readings.len(), schema_version), &rows);
        self.scratch = rows;
    }

    /// Appends the rows of device-hour `g` of `prepared` (a batch prepared on its producer's
    /// thread, [`crate::prepared`]), checked against schema version `schema_version`; as
    /// [`Record::push`] does with readings.
    pub(crate) fn push_prepared(&mut self, prepared: &PreparedRows, g: &Group, schema_version: u32) {
        let rows = &prepared.rows[g.at.clone()];
        self.push_entry((g.table, g.device), (g.hour, g.partition.1), (g.n, schema_version), rows);
    }

    /// Appends an entry: its head, then `rows` (`n` readings of device-hour (`series`,
    /// `hour`), checked against schema version `schema_version`).
    fn push_entry(
        &mut self,
        series: (u32, u64),
        (hour, partition): (i32, i32),
        (n, schema_version): (usize, u32),
        rows: &[u8],
    ) {
        debug_assert!(!self.finished, "a record pushed to after it was finished");
        let key = (series.0, series.1, hour, partition);
        let b = &mut self.bytes;
        put_head(b, self.prev, key, [u64::from(schema_version), n as u64, rows.len() as u64]);
        self.prev = key;
        let start = b.len();
        b.extend_from_slice(rows);
        self.entries.push(RecordEntry { series, hour, partition, n, schema_version, at: start..b.len() });
    }

    /// Notes the field ids a prepared batch's rows use, for the record's list.
    pub(crate) fn uses(&mut self, prepared: &PreparedRows) {
        for (name, ty, id) in &prepared.fields {
            self.writer.note_used(name, *ty, *id);
        }
    }

    /// Appends the list of the field ids used: the record is complete.
    pub(crate) fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let b = &mut self.bytes;
        let list_at = b.len() as u32;
        let used: Vec<(u32, &str, model::FieldType)> = self.writer.used().collect();
        b.extend_from_slice(&(used.len() as u32).to_be_bytes());
        for (id, name, ty) in used {
            b.extend_from_slice(&id.to_be_bytes());
            b.push(ty.code());
            b.extend_from_slice(&(name.len() as u32).to_be_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        b.extend_from_slice(&list_at.to_be_bytes());
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The record's bytes, once finished.
    pub(crate) fn bytes(&self) -> &[u8] {
        debug_assert!(self.finished, "the bytes of a record not finished");
        &self.bytes
    }

    /// Adds the record's readings to `buffer`; the record is number `seq`.
    pub(crate) fn apply(&self, buffer: &mut Buffer, seq: u64) {
        let mut noted = None;
        for e in &self.entries {
            buffer.append(e.series, (e.hour, e.partition), (e.n, e.schema_version), &self.bytes[e.at.clone()]);
            if noted != Some(e.hour) {
                buffer.note_seq(e.hour, seq);
                noted = Some(e.hour);
            }
        }
    }
}

/// Writes a version 3 entry head: `key` as differences from `prev`, then `rest` (schema
/// version, readings, rows' length).
fn put_head(b: &mut Vec<u8>, prev: EntryKey, key: EntryKey, rest: [u64; 3]) {
    codec::put_varint(b, codec::zigzag(i64::from(key.0) - i64::from(prev.0)));
    codec::put_varint(b, codec::zigzag(key.1.wrapping_sub(prev.1) as i64));
    codec::put_varint(b, codec::zigzag(i64::from(key.2) - i64::from(prev.2)));
    codec::put_varint(b, codec::zigzag(i64::from(key.3) - i64::from(prev.3)));
    for v in rest {
        codec::put_varint(b, v);
    }
}

/// Reads a version 3 entry head written after an entry of key `prev`: the entry's key, schema
/// version, readings and rows' length.
fn head_v3(c: &mut rows::Cursor<'_>, prev: EntryKey) -> std::result::Result<(EntryKey, u32, usize, usize), rows::Bad> {
    let mut delta = || c.varint().map(codec::unzigzag);
    let table = offset(prev.0, delta()?, "table id out of range")?;
    let device = prev.1.wrapping_add(delta()? as u64);
    let hour = offset(prev.2, delta()?, "hour out of range")?;
    let partition = offset(prev.3, delta()?, "partition out of range")?;
    let version = u32::try_from(c.varint()?).map_err(|_| "schema version out of range")?;
    let n = usize::try_from(c.varint()?).map_err(|_| "reading count out of range")?;
    let len = usize::try_from(c.varint()?).map_err(|_| "rows' length out of range")?;
    Ok(((table, device, hour, partition), version, n, len))
}

/// `prev + delta` in `T`'s range, or `what` (a damaged head): never wrapped.
fn offset<T: Into<i64> + TryFrom<i64>>(prev: T, delta: i64, what: rows::Bad) -> std::result::Result<T, rows::Bad> {
    prev.into().checked_add(delta).and_then(|v| T::try_from(v).ok()).ok_or(what)
}

/// The `u32` (big-endian) at `b[i..i + 4]`.
fn be32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn bad_record(detail: &str) -> Error {
    Error::Corrupt { what: "write buffer record", detail: detail.to_string() }
}

/// Adds the readings of a stored record (of any version) to `buffer`, naming their fields by
/// ids of `ids`.
pub(crate) fn replay(record: &[u8], seq: u64, buffer: &mut Buffer, ids: &FieldIds) -> Result<()> {
    match record.first() {
        Some(&RECORD_V1) => replay_v1(&record[1..], seq, buffer, ids),
        Some(&format @ (RECORD_V2 | RECORD_V3)) => replay_rows(record, format, seq, buffer, ids),
        _ => Err(bad_record("unknown version")),
    }
}

/// A version 1 record: `u8 1`, then per operand `table u32 BE · device u64 BE · hour i32 BE ·
/// partition i32 BE · length u32 BE · operand bytes` ([`codec`]) to the end of the value.
fn replay_v1(mut rest: &[u8], seq: u64, buffer: &mut Buffer, ids: &FieldIds) -> Result<()> {
    let mut writer = rows::RowWriter::default();
    let (mut readings, mut rows) = (Vec::new(), Vec::new());
    while !rest.is_empty() {
        let Some((head, tail)) = rest.split_first_chunk::<OP_HEAD>() else {
            return Err(bad_record("truncated operand head"));
        };
        let table = be32(head, 0);
        let device = (u64::from(be32(head, 4)) << 32) | u64::from(be32(head, 8));
        let (hour, partition, len) = (be32(head, 12) as i32, be32(head, 16) as i32, be32(head, 20) as usize);
        if tail.len() < len {
            return Err(bad_record("truncated operand"));
        }
        let (op, tail) = tail.split_at(len);
        readings.clear();
        codec::decode(op, &mut readings).map_err(corrupt_operand)?;
        let version = codec::schema_version(op).map_err(corrupt_operand)?;
        rows.clear();
        writer.put(ids, &readings, &mut rows);
        buffer.append((table, device), (hour, partition), (readings.len(), version), &rows);
        buffer.note_seq(hour, seq);
        rest = tail;
    }
    Ok(())
}

/// A record of rows, version 2 or 3 (they differ in their entry heads).
fn replay_rows(record: &[u8], format: u8, seq: u64, buffer: &mut Buffer, ids: &FieldIds) -> Result<()> {
    let Some((body, list_at)) = record.split_last_chunk::<4>() else {
        return Err(bad_record("truncated"));
    };
    let list_at = u32::from_be_bytes(*list_at) as usize;
    if !(1..=body.len()).contains(&list_at) {
        return Err(bad_record("field list out of the record"));
    }
    let (entries, mut list) = body.split_at(list_at);
    // The record's ids, mapped to this process's.
    let mut map: FastMap<u32, (u32, model::FieldType)> = FastMap::default();
    let count = list
        .split_first_chunk::<4>()
        .map(|(c, _)| u32::from_be_bytes(*c))
        .ok_or_else(|| bad_record("truncated field list"))?;
    list = &list[4..];
    for _ in 0..count {
        let Some((head, tail)) = list.split_first_chunk::<9>() else {
            return Err(bad_record("truncated field list"));
        };
        let (id, len) = (be32(head, 0), be32(head, 5) as usize);
        let ty = model::FieldType::from_code(head[4]).ok_or_else(|| bad_record("unknown field type"))?;
        if tail.len() < len {
            return Err(bad_record("truncated field name"));
        }
        let (name, tail) = tail.split_at(len);
        let name = std::str::from_utf8(name).map_err(|_| bad_record("field name not UTF-8"))?;
        map.insert(id, (ids.id_of(&name.into(), ty), ty));
        list = tail;
    }
    if !list.is_empty() {
        return Err(bad_record("bytes after the field list"));
    }
    let mut rest = &entries[1..];
    let mut rows = Vec::new();
    let mut prev: EntryKey = (0, 0, 0, 0);
    while !rest.is_empty() {
        let ((table, device, hour, partition), version, n, len, tail) = if format == RECORD_V2 {
            let Some((head, tail)) = rest.split_first_chunk::<ENTRY_HEAD>() else {
                return Err(bad_record("truncated entry head"));
            };
            let device = (u64::from(be32(head, 4)) << 32) | u64::from(be32(head, 8));
            let key = (be32(head, 0), device, be32(head, 12) as i32, be32(head, 16) as i32);
            (key, be32(head, 20), be32(head, 24) as usize, be32(head, 28) as usize, tail)
        } else {
            let mut c = rows::Cursor { rest };
            let (key, version, n, len) = head_v3(&mut c, prev).map_err(bad_record)?;
            prev = key;
            (key, version, n, len, c.rest)
        };
        if tail.len() < len {
            return Err(bad_record("truncated rows"));
        }
        let (entry_rows, tail) = tail.split_at(len);
        rows.clear();
        let got = rows::translate(entry_rows, |id| map.get(&id).copied(), &mut rows).map_err(corrupt)?;
        if got != n || n == 0 {
            return Err(bad_record("rows not as many as counted"));
        }
        buffer.append((table, device), (hour, partition), (n, version), &rows);
        buffer.note_seq(hour, seq);
        rest = tail;
    }
    Ok(())
}

/// Operand bytes a flush puts in one WriteBatch before committing it and starting the next.
const FLUSH_CHUNK_BYTES: usize = 64 << 20;

impl Store {
    /// Writes everything the write buffer holds to `buckets`, `dirty` and `latest` and deletes
    /// its records (see the module docs). Writers wait only while the buffer is handed over:
    /// the flush itself runs beside them, which buffer into a new one. One flush at a time.
    /// Nothing to do when the buffer is off or empty.
    pub fn flush_write_buffer(&self) -> Result<()> {
        self.flush_write_buffer_carrying(None)
    }

    /// [`Store::flush_write_buffer`]; with `Some(watermark)`, the hours that end after the
    /// watermark stay in the buffer when they are at most half of it (module docs, "Carry").
    fn flush_write_buffer_carrying(&self, carry_after: Option<i64>) -> Result<()> {
        if read(&self.wbuf).is_empty() {
            return Ok(());
        }
        let _flushing = self.flush_lock.lock().unwrap_or_else(PoisonError::into_inner);
        let frozen = loop {
            // A buffer handed over and not flushed yet (its flush failed, or a write handed it
            // over for the flusher thread) goes first: its records are older.
            let left = read(&self.wbuf).frozen.clone();
            if let Some(frozen) = left {
                self.flush_frozen(&frozen)?;
                write(&self.wbuf).frozen = None;
            }
            let mut state = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let mut buffers = write(&self.wbuf);
            if let Some(frozen) = self.hand_over(&mut state, &mut buffers, carry_after) {
                break frozen;
            }
            // Empty, unless a write bypassing the buffer handed it over just now: then that one
            // is flushed too, so a flush leaves nothing handed over behind it.
            if buffers.frozen.is_none() {
                return Ok(());
            }
        };
        self.flush_frozen(&frozen)?;
        write(&self.wbuf).frozen = None;
        Ok(())
    }

    /// Hands the active buffer over for a flush (under the writers' lock), unless it is empty
    /// or a handed-over one is not flushed yet; with `Some(watermark)`, the hours that end after
    /// the watermark stay when they are at most half of it (module docs, "Carry").
    pub(crate) fn hand_over(
        &self,
        state: &mut WriterState,
        buffers: &mut Buffers,
        carry_after: Option<i64>,
    ) -> Option<Arc<Frozen>> {
        if buffers.active.is_empty() || buffers.frozen.is_some() {
            return None;
        }
        let mut buffer = std::mem::take(&mut buffers.active);
        let mut keep_from = state.wbuf_seq;
        if let (Some(watermark), Some(cfg)) = (carry_after, self.cfg.write_buffer) {
            let open = buffer.bytes_of_hours_after(watermark);
            // Open hours holding much of the buffer are flushed with the rest: carried
            // over, they would leave the new buffer nearly full.
            if open > 0 && open <= cfg.max_bytes / 2 && buffer.holds_hour_ending_by(watermark) {
                keep_from = keep_from.min(buffer.move_hours_after(watermark, &mut buffers.active));
            }
        }
        // Writers store it under this lock.
        let open_at = self.stats.max_event_ts.load(Ordering::Relaxed);
        let marks = state.open_marks.snapshot(open_at);
        let exclusive = !buffer.carried && keep_from == state.wbuf_seq;
        let frozen = Arc::new(Frozen { buffer, keep_from, mark_gen: state.mark_gen, open_at, marks, exclusive });
        // Marks written after the hand-over must not take the flush's generation.
        state.mark_gen += 1;
        buffers.frozen = Some(Arc::clone(&frozen));
        Some(frozen)
    }

    /// Whether a direct write of `readings` may go beside the flush of the handed-over buffer
    /// instead of waiting for it: nothing is buffered since the hand-over, the records still
    /// stored hold operands of that buffer only, and it holds no series (table, device) of
    /// `readings` — so no operand of theirs is older than this write, nor replayed after it
    /// should the process die before the flush ends (module docs, "Bypass").
    pub(crate) fn may_write_beside_flush(&self, readings: &[DeviceReading], prepared: &[PreparedRows]) -> bool {
        let frozen = {
            let buffers = read(&self.wbuf);
            match &buffers.frozen {
                Some(frozen) if buffers.active.is_empty() && frozen.exclusive => Arc::clone(frozen),
                _ => return false,
            }
        };
        if prepared.iter().flat_map(|p| &p.groups).any(|g| frozen.buffer.series.contains_key(&(g.table, g.device))) {
            return false;
        }
        let (catalog, registry) = (read(&self.catalog), read(&self.registry));
        !readings.iter().any(|r| match (catalog.by_name.get(&r.table), registry.by_name.get(&r.device)) {
            (Some(table), Some(device)) => frozen.buffer.series.contains_key(&(table.id, device)),
            // A table or device not stored yet has nothing buffered.
            _ => false,
        })
    }

    /// Starts the thread that flushes the write buffer when a write finds it due ([`Flusher`]);
    /// `None` when the buffer is off. One at a time: stop one before starting another. Without
    /// it (or once it stops), the write that finds the buffer due flushes it, and waits for that.
    pub fn start_flusher(self: &Arc<Self>) -> Result<Option<Flusher>> {
        if self.cfg.write_buffer.is_none() {
            return Ok(None);
        }
        let (store, signal) = (Arc::downgrade(self), Arc::clone(&self.flush_signal));
        // A flusher stopped before leaves its stop request behind.
        *signal.state.lock().unwrap_or_else(PoisonError::into_inner) = (false, false);
        let thread = std::thread::Builder::new()
            .name("wbuf-flusher".into())
            .spawn(move || loop {
                {
                    let mut state = signal.state.lock().unwrap_or_else(PoisonError::into_inner);
                    while !state.0 && !state.1 {
                        state = signal.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                    }
                    if state.1 {
                        return;
                    }
                    state.0 = false;
                }
                let Some(store) = store.upgrade() else {
                    return;
                };
                if let Err(e) = store.flush_write_buffer() {
                    // The batches are durable in their records: the buffer stays and the next
                    // flush tries again.
                    tracing::warn!(error = %e, "flushing the write buffer failed; it is kept and tried again");
                }
            })
            .map_err(|source| Error::Thread { what: "write-buffer flusher", source })?;
        self.flusher_on.store(true, Ordering::SeqCst);
        Ok(Some(Flusher { store: Arc::downgrade(self), signal: Arc::clone(&self.flush_signal), thread: Some(thread) }))
    }

    /// Start (epoch ms) of the oldest hour the write buffer holds (not marked dirty until the
    /// flush, but waiting for roll-up all the same).
    pub(crate) fn oldest_buffered_hour_ms(&self) -> Option<i64> {
        read(&self.wbuf).oldest_hour_ms()
    }

    /// Operands in the write buffer, not flushed yet.
    pub fn write_buffer_operands(&self) -> usize {
        read(&self.wbuf).operands()
    }

    /// Flushes the write buffer when it holds an hour that ends at or before `watermark`, so a
    /// roll-up pass up to the watermark sees every reading of its hours. The hours that end
    /// after the watermark stay in the buffer when they are at most half of it (module docs,
    /// "Carry").
    pub(crate) fn flush_write_buffer_before(&self, watermark: Option<i64>) -> Result<()> {
        match watermark {
            Some(w) if read(&self.wbuf).holds_hour_ending_by(w) => self.flush_write_buffer_carrying(Some(w)),
            _ => Ok(()),
        }
    }

    /// Writes a handed-over buffer to RocksDB and deletes its records. Each chunk commits under
    /// the marks lock, so no roll-up pass deletes a mark between reading its generation and
    /// its commit while a chunk rewrites it.
    fn flush_frozen(&self, frozen: &Frozen) -> Result<()> {
        let buffer = &frozen.buffer;
        // Keys in order: cheaper memtable inserts.
        let mut series: Vec<(&(u32, u64), &Hours<HourOps>)> = buffer.series.iter().collect();
        series.sort_unstable_by_key(|(k, _)| **k);
        // A device flagged while the flush runs gets whole-hour operands this once; reads of
        // an outlier's hour take its bucket and sub-buckets alike.
        let outliers = read(&self.outliers).flagged.clone();
        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        let mark_gen = frozen.mark_gen.to_be_bytes();
        let (buckets, dirty, latest) = (cf(&self.db, CF_BUCKETS), cf(&self.db, CF_DIRTY), cf(&self.db, CF_LATEST));
        let commit = |wb: WriteBatch| {
            let _marks = self.marks_lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.db.write_opt(wb, &wo).map_err(db_err("flush write buffer"))
        };
        let mut wb = WriteBatch::default();
        let (mut decoded, mut encoded) = (Vec::new(), Vec::new());
        let mut operands = 0u64;
        let mut oldest_hour_ms = i64::MAX;
        // The marks this flush writes into hours open at the hand-over, for the writers'
        // bitmaps once it has committed.
        let mut marked = OpenMarks::default();
        let mut marks = 0u64;
        let mut latest_operands = 0u64;
        // Every id the buffer's rows use was given before the hand-over. A copy: writers that
        // meet a new field name need the list meanwhile.
        let names = self.field_ids.names().clone();
        for (&(table, device), hours) in series {
            for (i, h) in hours.iter().enumerate() {
                let (merged, newest_ts) = h.merged(&names)?;
                let key = BucketKey { table, partition: h.partition, device, hour: h.hour };
                let hour_start = Hour(i64::from(h.hour)).start_ms();
                let outlier = outliers.contains(&(table, device));
                if outlier {
                    // One operand per minute of the hour, as the direct path writes them.
                    decoded.clear();
                    codec::decode(&merged, &mut decoded).map_err(corrupt_operand)?;
                    operands +=
                        merge_by_minute(&mut wb, buckets, key, hour_start, (&decoded, h.schema_version), &mut encoded);
                } else {
                    wb.merge_cf(buckets, key.encode(), &merged);
                    operands += 1;
                }
                let mark = !frozen.marks.holds(table, h.hour, device, frozen.open_at);
                if mark {
                    wb.put_cf(dirty, DirtyKey { table, hour: h.hour, device }.encode(), mark_gen);
                    marked.record(table, h.hour, device, frozen.open_at);
                    marks += 1;
                }
                oldest_hour_ms = oldest_hour_ms.min(hour_start);
                if i + 1 == hours.len() && (mark || outlier) {
                    // The newest hour holds the device's newest buffered reading; `latest`
                    // takes it when the hour is marked here (`Store::latest`): a pointer (its
                    // time), as the bucket written here has the rest, or the whole reading for
                    // an outlier (whose sub-buckets `latest` reads do not all look at).
                    let newest = if outlier {
                        codec::newest(&merged).map_err(corrupt_operand)?
                    } else {
                        // The time alone: the newest reading's fields are not built.
                        let mut pointer = Vec::with_capacity(16);
                        codec::encode_versioned(&[crate::latest_pointer(newest_ts)], h.schema_version, &mut pointer);
                        pointer
                    };
                    wb.merge_cf(latest, keys::latest_key(table, device), newest);
                    latest_operands += 1;
                }
            }
            if wb.size_in_bytes() >= FLUSH_CHUNK_BYTES {
                commit(std::mem::take(&mut wb))?;
            }
        }
        wb.delete_range_cf(cf(&self.db, CF_WBUF), 0u64.to_be_bytes(), frozen.keep_from.to_be_bytes());
        commit(wb)?;
        {
            let mut state = self.write_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let now = self.stats.max_event_ts.load(Ordering::Relaxed);
            state.open_marks.absorb(marked, now);
        }
        self.stats.dirty_marks.fetch_add(marks, Ordering::Relaxed);
        self.stats.latest_operands.fetch_add(latest_operands, Ordering::Relaxed);
        self.stats.bucket_operands.fetch_add(operands, Ordering::Relaxed);
        self.stats.rollup_oldest_dirty_hour_ms.fetch_min(oldest_hour_ms, Ordering::Relaxed);
        self.stats.write_buffer_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The buffered readings of device `device` in table `table`, partition `partition`, hours
    /// `first..=last`: per hour in hour order, each operand's readings after the older ones'.
    pub(crate) fn buffered_hours(
        &self,
        (table, device): (u32, u64),
        partition: i32,
        (first, last): (i32, i32),
    ) -> Result<Vec<(i32, Vec<Reading>)>> {
        let buffers = read(&self.wbuf);
        let names = self.field_ids.names();
        // Per hour, the frozen buffer's operands (older) before the active one's.
        let mut out: std::collections::BTreeMap<i32, Vec<Reading>> = std::collections::BTreeMap::new();
        for buffer in buffers.parts() {
            for h in buffer.hours(table, device) {
                if h.partition == partition && (first..=last).contains(&h.hour) {
                    h.decode_into(&names, out.entry(h.hour).or_default())?;
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Whether the write buffer holds readings of device `device` in table `table`.
    pub(crate) fn buffered_series(&self, table: u32, device: u64) -> bool {
        read(&self.wbuf).holds_series(table, device)
    }

    /// The newest buffered reading of device `device` in table `table`.
    pub(crate) fn buffered_latest(&self, table: u32, device: u64) -> Result<Option<Reading>> {
        let buffers = read(&self.wbuf);
        let names = self.field_ids.names();
        // The active buffer's reading wins at an equal time: it was written later.
        let mut newest: Option<Reading> = None;
        for buffer in buffers.parts() {
            if let Some(r) = buffer.latest(table, device, &names)? {
                if newest.as_ref().is_none_or(|n| r.ts >= n.ts) {
                    newest = Some(r);
                }
            }
        }
        Ok(newest)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rs(readings: &[(i64, f64)]) -> Vec<Reading> {
        readings.iter().map(|&(ts, v)| Reading::new(ts, vec![("v".into(), v)])).collect()
    }

    /// Appends one batch of `readings` to `b`, as a write does.
    fn append(b: &mut Buffer, ids: &FieldIds, series: (u32, u64), hour: i32, readings: &[(i64, f64)]) {
        let mut rows = Vec::new();
        let readings = rs(readings);
        rows::RowWriter::default().put(ids, &readings, &mut rows);
        b.append(series, (hour, 0), (readings.len(), 0), &rows);
    }

    fn sample_record(ids: &FieldIds) -> Record {
        let mut rec = Record::new();
        rec.push(ids, (1, 7), (5, 0), 0, &rs(&[(18_000_000, 1.0)]));
        rec.push(ids, (1, 8), (4, 0), 2, &rs(&[(14_400_000, 2.0), (14_400_001, 3.0)]));
        rec.push(ids, (1, 7), (4, 0), 0, &rs(&[(14_400_000, 4.0)]));
        rec.push(ids, (1, 7), (5, 0), 1, &rs(&[(18_000_000, 5.0)]));
        rec.finish();
        rec
    }

    #[test]
    fn a_record_replays_into_the_same_buffer() {
        let ids = FieldIds::default();
        // The process replaying knows other ids: one taken already.
        let other_ids = FieldIds::default();
        assert_eq!(other_ids.id_of(&"w".into(), model::FieldType::I64), 0);
        let rec = sample_record(&ids);
        let mut direct = Buffer::default();
        rec.apply(&mut direct, 0);
        let mut replayed = Buffer::default();
        replay(rec.bytes(), 0, &mut replayed, &other_ids).unwrap();
        for (b, ids) in [(&direct, &ids), (&replayed, &other_ids)] {
            let names = ids.names();
            assert_eq!(b.operands, 4);
            let hours: Vec<(i32, usize)> = b.hours(1, 7).iter().map(|h| (h.hour, h.appends)).collect();
            assert_eq!(hours, vec![(4, 1), (5, 2)]);
            // Hour 5 was written twice at one time: the later write is the newest reading.
            assert_eq!(b.latest(1, 7, &names).unwrap().unwrap(), Reading::new(18_000_000, vec![("v".into(), 5.0)]));
            assert_eq!(b.latest(1, 8, &names).unwrap().unwrap().ts, 14_400_001);
            assert!(b.latest(2, 7, &names).unwrap().is_none());
            let (merged, newest) = b.hours(1, 7)[1].merged(&names).unwrap();
            assert_eq!((codec::schema_version(&merged).unwrap(), newest), (1, 18_000_000));
            let mut readings = Vec::new();
            codec::decode(&merged, &mut readings).unwrap();
            assert_eq!(readings, rs(&[(18_000_000, 5.0)]));
            let (merged, _) = b.hours(1, 8)[0].merged(&names).unwrap();
            let mut want = Vec::new();
            codec::encode_versioned(&rs(&[(14_400_000, 2.0), (14_400_001, 3.0)]), 2, &mut want);
            assert_eq!(merged, want);
        }
        assert_eq!(direct.bytes, replayed.bytes);
    }

    /// A record of version 1 (codec operands, before rows) replays into the buffer the same
    /// readings make.
    #[test]
    fn a_record_of_codec_operands_replays_as_rows() {
        let mut v1 = vec![RECORD_V1];
        for (series, hour, readings) in
            [((1u32, 7u64), 5i32, rs(&[(18_000_000, 1.0)])), ((1, 7), 5, rs(&[(18_000_000, 5.0)]))]
        {
            let mut op = Vec::new();
            codec::encode_versioned(&readings, 3, &mut op);
            v1.extend_from_slice(&series.0.to_be_bytes());
            v1.extend_from_slice(&series.1.to_be_bytes());
            v1.extend_from_slice(&hour.to_be_bytes());
            v1.extend_from_slice(&0i32.to_be_bytes());
            v1.extend_from_slice(&(op.len() as u32).to_be_bytes());
            v1.extend_from_slice(&op);
        }
        let ids = FieldIds::default();
        let mut b = Buffer::default();
        replay(&v1, 9, &mut b, &ids).unwrap();
        assert_eq!((b.operands, b.first_seq.clone()), (2, vec![(5, 9)]));
        let (merged, _) = b.hours(1, 7)[0].merged(&ids.names()).unwrap();
        let mut want = Vec::new();
        codec::encode_versioned(&rs(&[(18_000_000, 5.0)]), 3, &mut want);
        assert_eq!(merged, want);
        v1.pop();
        assert!(replay(&v1, 9, &mut Buffer::default(), &ids).is_err());
    }

    /// Version 3 heads are differences from the entry before: keys at the ends of their
    /// ranges, in no order, come back as written.
    #[test]
    fn record_heads_hold_any_key_in_any_order() {
        let ids = FieldIds::default();
        let keys: [EntryKey; 4] =
            [(u32::MAX, u64::MAX, i32::MIN, i32::MAX), (0, 0, i32::MAX, i32::MIN), (5, 1 << 63, 0, -3), (5, 2, 0, -3)];
        let mut rec = Record::new();
        for (i, &(table, device, hour, partition)) in keys.iter().enumerate() {
            rec.push(&ids, (table, device), (hour, partition), i as u32, &rs(&[(i as i64, i as f64)]));
        }
        rec.finish();
        let mut b = Buffer::default();
        replay(rec.bytes(), 3, &mut b, &ids).unwrap();
        assert_eq!(b.operands, 4);
        for (i, &(table, device, hour, partition)) in keys.iter().enumerate() {
            let h = &b.hours(table, device)[0];
            assert_eq!((h.hour, h.partition, h.n, h.schema_version), (hour, partition, 1, i as u32));
            let mut readings = Vec::new();
            h.decode_into(&ids.names(), &mut readings).unwrap();
            assert_eq!(readings, rs(&[(i as i64, i as f64)]));
        }
    }

    /// A head whose differences leave their field's range is refused, not wrapped.
    #[test]
    fn a_head_out_of_range_is_refused() {
        let ids = FieldIds::default();
        let mut rec = Record::new();
        rec.push(&ids, (3, 7), (5, 0), 0, &rs(&[(18_000_000, 1.0)]));
        rec.push(&ids, (4, 7), (5, 0), 0, &rs(&[(18_000_000, 1.0)]));
        rec.finish();
        let good = rec.bytes();
        // The second head starts after the first entry: 1 + 7 bytes of head + 18 of rows.
        assert_eq!((good[1], good[26]), (6, 2), "Δtable 3, then 1 (zigzag)");
        let refused = |bytes: &[u8]| replay(bytes, 0, &mut Buffer::default(), &ids).is_err();
        assert!(!refused(good));
        // The first Δtable -4 (zigzag 7): below 0. The second i64::MAX (zigzag u64::MAX - 1, ten
        // bytes): 3 + i64::MAX overflows. (Either shifts the rest of the record, but the head
        // fails first.)
        let max = [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        for (at, delta) in [(1, &[7u8][..]), (26, &max[..])] {
            let bad = [&good[..at], delta, &good[at + 1..]].concat();
            assert!(refused(&bad), "Δtable {delta:?} at {at}");
        }
    }

    /// A record of version 2 (fixed-width entry heads), built here byte by byte, replays into
    /// the buffer its readings make.
    #[test]
    fn a_record_of_fixed_width_heads_replays() {
        let ids = FieldIds::default();
        let mut v2 = vec![RECORD_V2];
        for (table, device, hour, version, readings) in [
            (1u32, 7u64, 5i32, 0u32, rs(&[(18_000_000, 1.0)])),
            (2, 1 << 40, 4, 3, rs(&[(14_400_000, 2.0), (14_400_001, 3.0)])),
        ] {
            let mut rows = Vec::new();
            rows::RowWriter::default().put(&ids, &readings, &mut rows);
            for word in [table, (device >> 32) as u32, device as u32, hour as u32, 0, version, readings.len() as u32] {
                v2.extend_from_slice(&word.to_be_bytes());
            }
            v2.extend_from_slice(&(rows.len() as u32).to_be_bytes());
            v2.extend_from_slice(&rows);
        }
        let list_at = v2.len() as u32;
        v2.extend_from_slice(&1u32.to_be_bytes());
        v2.extend_from_slice(&ids.id_of(&"v".into(), model::FieldType::F64).to_be_bytes());
        v2.push(model::FieldType::F64.code());
        v2.extend_from_slice(&1u32.to_be_bytes());
        v2.push(b'v');
        v2.extend_from_slice(&list_at.to_be_bytes());
        let other_ids = FieldIds::default();
        assert_eq!(other_ids.id_of(&"w".into(), model::FieldType::I64), 0);
        let mut b = Buffer::default();
        replay(&v2, 4, &mut b, &other_ids).unwrap();
        assert_eq!((b.operands, b.first_seq.clone()), (2, vec![(5, 4), (4, 4)]));
        let (merged, newest) = b.hours(2, 1 << 40)[0].merged(&other_ids.names()).unwrap();
        let mut want = Vec::new();
        codec::encode_versioned(&rs(&[(14_400_000, 2.0), (14_400_001, 3.0)]), 3, &mut want);
        assert_eq!((merged, newest), (want, 14_400_001));
        assert_eq!(b.hours(1, 7)[0].n, 1);
    }

    #[test]
    fn a_damaged_record_is_refused() {
        let ids = FieldIds::default();
        let mut rec = Record::new();
        rec.push(&ids, (1, 7), (5, 0), 0, &rs(&[(18_000_000, 1.0)]));
        rec.finish();
        let bytes = rec.bytes();
        let refused = |bytes: &[u8]| replay(bytes, 0, &mut Buffer::default(), &FieldIds::default()).is_err();
        assert!(!refused(bytes));
        assert!(refused(&bytes[..bytes.len() - 1]));
        assert!(refused(&[9]));
        assert!(refused(&[RECORD_V2]));
        assert!(refused(&[RECORD_V3]));
        // The head: Δtable 1, Δdevice 7, Δhour 5, Δpartition 0 (zigzag), schema version 0, one
        // reading, 18 bytes of rows (time, field count, field id, value).
        assert_eq!(bytes[..8], [RECORD_V3, 2, 14, 10, 0, 0, 1, 18]);
        // The rows' length one short, the reading count one more, the field id unlisted, the
        // list's offset past the record.
        for (at, delta) in [(7, -1i16), (6, 1), (8 + 8 + 1, 1), (bytes.len() - 1, 100)] {
            let mut bad = bytes.to_vec();
            bad[at] = (i16::from(bad[at]) + delta) as u8;
            assert!(refused(&bad), "changed byte {at}");
        }
    }

    #[test]
    fn the_buffer_is_due_by_size_or_age() {
        let ids = FieldIds::default();
        // The index of series by device id counts: one page of 512 ids (2 KiB) and its slot.
        let index = 2_048 + 8;
        let cfg =
            WriteBufferConfig { max_bytes: index + 1_000, max_age: Duration::from_secs(3600), ..Default::default() };
        let mut b = Buffer::default();
        assert!(!b.due(&cfg));
        append(&mut b, &ids, (1, 1), 0, &[(0, 1.0)]);
        assert_eq!(b.memory() - b.bytes, index);
        assert!(!b.due(&cfg));
        for i in 0..100 {
            append(&mut b, &ids, (1, 2 + i), 0, &[(0, 1.0)]);
        }
        assert_eq!(b.memory() - b.bytes, index, "ids 1 to 101 are on one page");
        assert!(b.due(&cfg));
        // A handed-over buffer leaves an empty one in its place.
        let mut buffers = Buffers { active: b, frozen: None };
        let taken = std::mem::take(&mut buffers.active);
        assert!(taken.due(&cfg) && buffers.is_empty());
        let mut b = buffers.active;
        assert!(!b.due(&cfg) && b.is_empty());
        append(&mut b, &ids, (1, 1), 0, &[(0, 1.0)]);
        assert!(b.due(&WriteBufferConfig { max_age: Duration::ZERO, ..cfg }));
        assert!(b.holds_hour_ending_by(3_600_000) && !b.holds_hour_ending_by(3_599_999));
        append(&mut b, &ids, (1, 1), 0, &[(1, 1.0)]);
        append(&mut b, &ids, (1, 2), 0, &[(1, 1.0)]);
        assert_eq!(b.operands_per_hour(), 1.5);
    }

    const T: &str = "plant.beside";
    const BASE: i64 = 1_706_738_400_000;

    fn row(device: &str, ts: i64, v: f64) -> DeviceReading {
        DeviceReading { table: T.into(), device: device.into(), reading: Reading::new(ts, vec![("v".into(), v)]) }
    }

    fn points(store: &Store, device: &str) -> Vec<(i64, f64)> {
        let all = model::TimeRange::new(BASE - model::HOUR_MS, BASE + model::HOUR_MS).unwrap();
        let rs = store.read_range(T, device, all).unwrap().unwrap_or_default();
        rs.iter().map(|r| (r.ts, r.get_f64("v").unwrap())).collect()
    }

    /// A buffer that neither fills nor ages within a test, and is never bypassed on its own.
    fn config() -> crate::StoreConfig {
        crate::StoreConfig {
            write_buffer: Some(WriteBufferConfig {
                max_bytes: 1 << 30,
                max_age: Duration::from_secs(3600),
                bypass_below: 0.0,
                bypass_for: Duration::from_secs(3600),
            }),
            ..crate::StoreConfig::default()
        }
    }

    /// Hands the buffer over as a write deciding to bypass it does (the flusher thread, not
    /// started here, would flush it), and sends the writes after it straight through.
    fn bypass(store: &Store) {
        let mut state = store.write_lock.lock().unwrap();
        assert!(store.hand_over(&mut state, &mut write(&store.wbuf), None).is_some());
        state.wbuf_bypass_until = Some(Instant::now() + Duration::from_secs(3600));
    }

    /// Direct writes of series the handed-over buffer does not hold go beside its flush; one
    /// of a series it holds flushes it first, so the later write wins. Should the process die
    /// before the flush, the records read back at the next open hold none of the series
    /// written straight through: what was written last is still what is read.
    #[test]
    fn direct_writes_of_other_series_go_beside_the_flush_of_a_handed_over_buffer() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), config()).unwrap();
            store.write(vec![row("d0", BASE, 1.0), row("d1", BASE, 2.0)], &[]).unwrap();
            store.write(vec![row("d2", BASE, 3.0)], &[]).unwrap();
            // d2 is stored (registered) but no longer buffered once flushed.
            store.flush_write_buffer().unwrap();
            store.write(vec![row("d0", BASE + 60_000, 4.0), row("d1", BASE, 5.0)], &[]).unwrap();
            bypass(&store);
            assert!(store.may_write_beside_flush(&[row("d2", BASE, 0.0), row("new", BASE, 0.0)], &[]));
            assert!(!store.may_write_beside_flush(&[row("d2", BASE, 0.0), row("d1", BASE, 0.0)], &[]));
            // A rewrite of d2 at the same time, and a new device: both beside the flush.
            store.write(vec![row("d2", BASE, 30.0), row("new", BASE, 6.0)], &[]).unwrap();
            assert!(read(&store.wbuf).frozen.is_some());
            assert_eq!(store.write_buffer_operands(), 2);
            assert_eq!(points(&store, "d0"), [(BASE, 1.0), (BASE + 60_000, 4.0)]);
            assert_eq!(points(&store, "d1"), [(BASE, 5.0)]);
            assert_eq!(points(&store, "d2"), [(BASE, 30.0)]);
            assert_eq!(points(&store, "new"), [(BASE, 6.0)]);
            // The process dies before the handed-over buffer is flushed.
        }
        let store = Store::open(dir.path(), config()).unwrap();
        assert_eq!(store.write_buffer_operands(), 2);
        assert_eq!(points(&store, "d0"), [(BASE, 1.0), (BASE + 60_000, 4.0)]);
        assert_eq!(points(&store, "d1"), [(BASE, 5.0)]);
        assert_eq!(points(&store, "d2"), [(BASE, 30.0)]);
        assert_eq!(points(&store, "new"), [(BASE, 6.0)]);
        // A direct write of a series the handed-over buffer holds flushes it first.
        bypass(&store);
        store.write(vec![row("d1", BASE, 50.0)], &[]).unwrap();
        assert!(read(&store.wbuf).frozen.is_none());
        assert_eq!(store.write_buffer_operands(), 0);
        assert_eq!(points(&store, "d1"), [(BASE, 50.0)]);
        assert_eq!(points(&store, "d0"), [(BASE, 1.0), (BASE + 60_000, 4.0)]);
    }

    /// Tried again after a bypass, a buffer still at one operand a device-hour is bypassed
    /// again after a fifth of `max_age`; one whose devices repeat is kept to `max_age`. Before
    /// any bypass, the buffer is judged at `max_age` only.
    #[test]
    fn after_a_bypass_the_buffer_is_judged_at_a_fifth_of_its_age() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config();
        cfg.write_buffer =
            cfg.write_buffer.map(|w| WriteBufferConfig { max_age: Duration::from_secs(5), bypass_below: 2.0, ..w });
        let store = Store::open(dir.path(), cfg).unwrap();
        // Past the probe (1 s), well before max_age (5 s): a slow machine has 4 s to spare.
        let probe = Duration::from_millis(1050);
        let bypassed = |store: &Store| store.write_lock.lock().unwrap().wbuf_bypass_until.is_some();
        // No bypass yet: new device-hours past the probe's age stay buffered.
        store.write(vec![row("a0", BASE, 1.0)], &[]).unwrap();
        std::thread::sleep(probe);
        store.write(vec![row("a1", BASE, 1.0)], &[]).unwrap();
        assert!(!bypassed(&store));
        assert_eq!(store.write_buffer_operands(), 2);
        store.flush_write_buffer().unwrap();
        // After a bypass that has ended: devices that repeat (3 operands a device-hour) stay.
        store.write_lock.lock().unwrap().wbuf_bypasses = 1;
        store.write(vec![row("b0", BASE, 1.0)], &[]).unwrap();
        store.write(vec![row("b0", BASE + 1000, 2.0)], &[]).unwrap();
        std::thread::sleep(probe);
        store.write(vec![row("b0", BASE + 2000, 3.0)], &[]).unwrap();
        assert!(!bypassed(&store));
        assert_eq!(store.write_buffer_operands(), 3);
        store.flush_write_buffer().unwrap();
        // … and one operand a device-hour is bypassed again, the buffer flushed.
        store.write(vec![row("c0", BASE, 1.0)], &[]).unwrap();
        std::thread::sleep(probe);
        store.write(vec![row("c1", BASE, 1.0)], &[]).unwrap();
        assert!(bypassed(&store));
        let state = store.write_lock.lock().unwrap();
        assert_eq!(state.wbuf_bypasses, 2);
        drop(state);
        assert_eq!(store.write_buffer_operands(), 0);
        assert_eq!(points(&store, "c1"), [(BASE, 1.0)]);
    }

    /// A buffer holding hours carried over by a pass's flush shares its records with hours
    /// already flushed: no direct write goes beside its flush.
    #[test]
    fn a_buffer_with_carried_hours_lets_no_direct_write_beside_its_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), config()).unwrap();
        // d0's hour 0 and d1's hour 1 in one record: the pass flushes hour 0, carries hour 1.
        store.write(vec![row("d0", BASE, 1.0), row("d1", BASE + model::HOUR_MS, 2.0)], &[]).unwrap();
        store.process_rollups(0, 10).unwrap();
        assert_eq!(store.write_buffer_operands(), 1);
        bypass(&store);
        // d0 is not in the buffer, but the record kept for d1 holds d0's operand too.
        assert!(!store.may_write_beside_flush(&[row("d0", BASE, 0.0)], &[]));
        store.write(vec![row("d0", BASE, 10.0)], &[]).unwrap();
        assert!(read(&store.wbuf).frozen.is_none());
        assert_eq!(points(&store, "d0"), [(BASE, 10.0)]);
    }
}
