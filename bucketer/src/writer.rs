//! The bucketer's run loop: drain ingest batches from a bounded channel, commit them as one
//! WriteBatch, then send their acks — never before.
//!
//! Runs on a blocking thread. Backpressure comes from the bounded channel: while a commit is in
//! progress the channel fills and ingest's `send().await` waits. A failed commit is retried
//! with backoff and nothing is acked until it succeeds, so a full disk stalls intake instead of
//! losing data.

use std::sync::Arc;
use std::time::Duration;

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
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig { max_batch_readings: 50_000, max_retry_backoff: Duration::from_secs(5) }
    }
}

/// Runs until every sender of `rx` is dropped and the channel is drained; everything received
/// is committed and acked before it returns.
pub fn run(store: Arc<Store>, mut rx: Receiver<IngestBatch>, cfg: WriterConfig) {
    // A batch taken from the channel that the commit before could not take in order.
    let mut held: Option<IngestBatch> = None;
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
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        commit_with_retry(&store, batch, &cfg);
    }
}

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

/// Commits `batch`, retrying with backoff until it succeeds, then sends its acks.
pub fn commit_with_retry(store: &Store, batch: IngestBatch, cfg: &WriterConfig) {
    let IngestBatch { readings, sources, prepared, dead_letters, offsets, acks, device_tags, .. } = batch;
    let result = store.write_retrying(readings, &sources, prepared, &dead_letters, &offsets, |e, attempt| {
        let backoff = Duration::from_millis(50)
            .saturating_mul(1 << attempt.min(10))
            .min(cfg.max_retry_backoff);
        tracing::error!(error = %e, attempt, retry_in_ms = backoff.as_millis() as u64, "commit failed; nothing acked, retrying");
        // `/ready` says so while it lasts.
        store.stats().commit_failures_in_a_row.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(backoff)
    });
    store.stats().commit_failures_in_a_row.store(0, std::sync::atomic::Ordering::Relaxed);
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
}
