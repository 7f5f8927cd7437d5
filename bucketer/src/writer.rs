//! The bucketer's run loop: drain ingest batches from a bounded channel, commit them as one
//! WriteBatch, then send their acks — never before.
//!
//! Runs on a blocking thread. Backpressure comes from the bounded channel: while a commit is in
//! progress the channel fills and ingest's `send().await` waits. A failed commit is retried
//! with backoff and nothing is acked until it succeeds, so a full disk stalls intake instead of
//! losing data.
//!
//! Until the process is asked to stop ([`WriterConfig::stopping`]): a commit that has failed
//! for [`GIVE_UP_AFTER`] by then is given up, and so is every batch after it, unattempted, so
//! that the stop ends (RocksDB keeps some write errors until it is reopened: retrying would go
//! on for ever) and nothing later is stored past a batch that was not (a Kafka offset committed
//! beyond it would skip it). Given-up batches are neither stored nor acked; [`run`] counts them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::IngestBatch;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::Receiver;

use crate::Store;

/// Writer settings.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Stop gathering more batches into one WriteBatch past this many readings.
    pub max_batch_readings: usize,
    /// Longest wait between retries of a failed commit.
    pub max_retry_backoff: Duration,
    /// Set when the process is asked to stop: from then on a commit failing for
    /// [`GIVE_UP_AFTER`] is given up (module docs).
    pub stopping: Arc<AtomicBool>,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch_readings: 50_000,
            max_retry_backoff: Duration::from_secs(5),
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Once the process is asked to stop, how long a commit may go on failing before it is given
/// up: a failure that began with the stop still gets a few attempts.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// What [`run`] could not store: batches given up at a stop while commits failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotStored {
    /// Batches (as taken from the channel) neither stored nor acked.
    pub batches: u64,
    /// Their readings.
    pub readings: u64,
}

/// Runs until every sender of `rx` is dropped and the channel is drained; everything received
/// is committed and acked before it returns, unless a stop gave up a failing commit (module
/// docs): what was not stored is returned.
pub fn run(store: Arc<Store>, mut rx: Receiver<IngestBatch>, cfg: WriterConfig) -> NotStored {
    // A batch taken from the channel that the commit before could not take in order.
    let mut held: Option<IngestBatch> = None;
    let mut not_stored = NotStored::default();
    loop {
        let mut batch = match held.take() {
            Some(batch) => batch,
            None => match rx.blocking_recv() {
                Some(first) => {
                    count_messages(&store, &first);
                    first
                }
                None => break,
            },
        };
        if not_stored.batches > 0 {
            // A commit was given up: nothing after it is stored (module docs).
            not_stored.batches += 1;
            not_stored.readings += batch.reading_count() as u64;
            continue;
        }
        let mut gathered = 1;
        // Gather what is already queued, so one commit covers many messages. A commit stores
        // prepared readings first: one that follows unprepared ones waits for the next commit;
        // so does a batch to be committed alone, and one after it.
        while !batch.alone && batch.reading_count() < cfg.max_batch_readings {
            match rx.try_recv() {
                Ok(more) => {
                    count_messages(&store, &more);
                    if !batch.gathers(&more) {
                        held = Some(more);
                        break;
                    }
                    // Room for a full commit at once, instead of doubling batch after batch: in
                    // the vector the last commit left, not in new memory.
                    if batch.readings.capacity() < batch.readings.len() + more.readings.len() {
                        let mut room = store.readings_buffer();
                        room.reserve(batch.readings.len() + cfg.max_batch_readings.max(more.readings.len()));
                        room.append(&mut batch.readings);
                        batch.readings = room;
                    }
                    batch.append(more);
                    gathered += 1;
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let readings = batch.reading_count() as u64;
        if let Err(GaveUp) = commit_with_retry(&store, batch, &cfg) {
            not_stored.batches += gathered;
            not_stored.readings += readings;
        }
    }
    if not_stored.batches > 0 {
        tracing::error!(
            batches = not_stored.batches,
            readings = not_stored.readings,
            "stopped while commits failed: these readings were neither stored nor acknowledged"
        );
    }
    not_stored
}

/// A commit given up at a stop ([`WriterConfig::stopping`]).
#[derive(Debug)]
pub struct GaveUp;

/// Adds an ingest batch's messages ([`IngestBatch::messages`]) to the approximate counters.
fn count_messages(store: &Store, batch: &IngestBatch) {
    if batch.messages.is_empty() {
        return;
    }
    let now = model::now_ms();
    for (table, n) in &batch.messages {
        store.count_messages(table, *n, now);
    }
}

/// Commits `batch`, retrying with backoff until it succeeds, then sends its acks; at a stop
/// a commit failing for [`GIVE_UP_AFTER`] is given up (module docs), unacked.
pub fn commit_with_retry(store: &Store, batch: IngestBatch, cfg: &WriterConfig) -> Result<(), GaveUp> {
    let IngestBatch { readings, sources, prepared, dead_letters, offsets, acks, device_tags, .. } = batch;
    let started = Instant::now();
    let mut gave_up = false;
    let result = store.write_retrying(readings, &sources, prepared, &dead_letters, &offsets, |e, attempt| {
        // `/ready` says so while it lasts.
        store.stats().commit_failures_in_a_row.fetch_add(1, Ordering::Relaxed);
        if cfg.stopping.load(Ordering::SeqCst) && started.elapsed() >= GIVE_UP_AFTER {
            tracing::error!(error = %e, attempt, "commit failed; stopping, so given up: not stored, not acked");
            gave_up = true;
            return None;
        }
        let backoff = Duration::from_millis(50)
            .saturating_mul(1 << attempt.min(10))
            .min(cfg.max_retry_backoff);
        // RocksDB keeps some errors (a write-ahead log it could not write) until the store is
        // reopened: said once the retries have gone on a while.
        let hint = (attempt >= 8).then_some(
            "if commits go on failing once the cause is mended (disk space freed), restart Hourglass: \
             RocksDB keeps some write errors until it is reopened",
        );
        tracing::error!(error = %e, attempt, retry_in_ms = backoff.as_millis() as u64, hint, "commit failed; nothing acked, retrying");
        Some(backoff)
    });
    if gave_up {
        // The stop goes on with commits failing: `/ready` stays 503.
        return Err(GaveUp);
    }
    store.stats().commit_failures_in_a_row.store(0, Ordering::Relaxed);
    match result {
        Ok(summary) => {
            // Device tags a source reported are registry metadata, written after the readings;
            // a failure is logged and the readings stay acknowledged.
            if !device_tags.is_empty() {
                if let Err(e) = store.merge_device_tags(&device_tags) {
                    tracing::warn!(error = %e, "reported device tags not stored");
                }
            }
            let committed = model::Committed { readings: summary.readings, rejected: summary.rejected };
            for ack in acks {
                ack.send_committed(&committed);
            }
        }
        // Only a batch that cannot be built (a timestamp outside the key range, an id space
        // used up) gets here; ingest validation keeps such input out, so this is a bug.
        // Nothing is acked: the broker redelivers after a reconnect.
        Err(e) => tracing::error!(error = %e, "batch rejected by the store; not acked"),
    }
    Ok(())
}
