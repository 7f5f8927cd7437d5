//! Line protocol pushed over HTTP: the ingest side of InfluxDB's write API.
//!
//! The query service owns the route (`POST /write`, `POST /api/v2/write`: its path, auth and
//! status codes, `query::api`); this module owns what a request body becomes and when it may
//! be answered. [`HttpIntake::decode`] maps a body to an [`IngestBatch`] by the
//! [`crate::lpwire`] rules (measurement → table, tag `name`/`device` → device, other tags →
//! the device's record), and [`HttpIntake::submit`] hands the batch to the bucketer over the
//! same bounded channel as the broker consumers, with an [`Ack`] that resolves once the
//! WriteBatch holding it has committed — so the HTTP answer, like a PUBACK, means stored.
//! Dead letters (bad lines) are committed with the batch and reported in the answer; the good
//! lines of the same body are stored.
//!
//! At shutdown [`HttpIntake::stop_intake`] drops the intake's sender: later requests are
//! refused ([`IntakeError::Closed`]) and the bucketer drains what was sent before.
//!
//! ```
//! use ingest::http::HttpIntake;
//! use ingest::lineproto::Precision;
//! use ingest::lpwire::LpConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (tx, mut rx) = tokio::sync::mpsc::channel(4);
//! let intake = HttpIntake::new(tx, LpConfig::default());
//! let batch = intake.decode(b"cpu,name=host_1 usage=0.5 1704067200000\n", Precision::Milliseconds);
//! assert_eq!(batch.readings.len(), 1);
//! // A stand-in for the bucketer: "commit", then send the acks.
//! let bucketer = tokio::spawn(async move {
//!     let batch = rx.recv().await.unwrap();
//!     batch.acks.into_iter().for_each(|ack| ack.send_committed(&Default::default()));
//! });
//! assert!(intake.submit(batch).await.is_ok());
//! bucketer.await.unwrap();
//! # }
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use model::{Ack, Committed, IngestBatch, PrepareBatch};
use tokio::sync::{mpsc, oneshot, watch};

use crate::lineproto::Precision;
use crate::lpwire::{decode_lines_preparing, decode_lines_remembering, LpConfig, TagMemory};
use crate::mqtt::MqttStats;

/// The `source` of this intake's dead letters and counters.
pub const SOURCE: &str = "http";

/// Tag memories kept: decodes of concurrent requests each take a free one, so they do not
/// wait for each other (a device seen by two of them reports its tags once to each).
const MEMORIES: usize = 2;

/// Why a batch was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IntakeError {
    /// The intake is stopped (shutting down): nothing was sent to the bucketer.
    #[error("not accepting writes: shutting down")]
    Closed,
    /// The bucketer dropped the batch without committing it (it could not be built into a
    /// WriteBatch, or the store's commits failed until a stop gave it up); nothing of it is
    /// stored.
    #[error("the store did not commit the batch")]
    NotStored,
}

/// Where line protocol received over HTTP goes.
#[derive(Debug)]
pub struct HttpIntake {
    /// `None` once the intake is stopped.
    sender: RwLock<Option<mpsc::Sender<IngestBatch>>>,
    lp: LpConfig,
    stats: Arc<MqttStats>,
    /// Per device, the tags last reported (see [`TagMemory`]).
    memories: [Mutex<TagMemory>; MEMORIES],
    /// Which memory a decode tries first.
    next_memory: AtomicUsize,
    /// `true` while requests are taken (reported as the source's "subscribed").
    open: watch::Sender<bool>,
    /// The store's preparation of a decoded batch, done on the decoding thread.
    preparer: Preparer,
    /// The store's tag changes, read by a memory before each decode.
    tag_changes: crate::lpwire::TagChangesSource,
}

/// A store's [`PrepareBatch`], if any.
#[derive(Default, Clone)]
pub struct Preparer(Option<Arc<dyn PrepareBatch>>);

impl Preparer {
    /// `store`'s preparation.
    pub fn new(store: Arc<dyn PrepareBatch>) -> Preparer {
        Preparer(Some(store))
    }
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Preparer(store)" } else { "Preparer(none)" })
    }
}

impl HttpIntake {
    /// An intake sending its batches on `tx`, mapping lines by `lp` (whose precision each
    /// request replaces with its own).
    pub fn new(tx: mpsc::Sender<IngestBatch>, lp: LpConfig) -> HttpIntake {
        HttpIntake {
            sender: RwLock::new(Some(tx)),
            lp,
            stats: Arc::new(MqttStats::default()),
            memories: Default::default(),
            next_memory: AtomicUsize::new(0),
            open: watch::Sender::new(true),
            preparer: Preparer::default(),
            tag_changes: crate::lpwire::TagChangesSource::default(),
        }
    }

    /// The intake, its memories of reported tags reading the store's tag changes (so a device
    /// whose tags another source changed reports its own again).
    pub fn with_tag_changes(mut self, changes: crate::lpwire::TagChangesSource) -> HttpIntake {
        self.tag_changes = changes;
        self
    }

    /// The intake, its decoded batches prepared by `preparer` on the decoding thread.
    pub fn with_preparer(mut self, preparer: Preparer) -> HttpIntake {
        self.preparer = preparer;
        self
    }

    /// Its counters: `messages` are requests decoded, `bytes` their bodies (after gzip).
    pub fn stats(&self) -> Arc<MqttStats> {
        self.stats.clone()
    }

    /// `true` until [`HttpIntake::stop_intake`].
    pub fn open(&self) -> watch::Receiver<bool> {
        self.open.subscribe()
    }

    /// Maps a request body of line protocol with timestamps in `precision` to a batch: valid
    /// readings (prepared for the store as they are decoded, [`IngestBatch::prepared`], when it
    /// has a preparer that prepares them now), a dead letter per bad line, each device's reported tags, and in
    /// [`IngestBatch::messages`] the body as one message of each table it has readings in (so
    /// every table it writes to, once). Never fails. CPU
    /// work (about a microsecond a line): call it from a blocking thread for large bodies.
    pub fn decode(&self, body: &[u8], precision: Precision) -> IngestBatch {
        let cfg = LpConfig { precision, ..self.lp.clone() };
        let first = self.next_memory.fetch_add(1, Ordering::Relaxed);
        let taken = (0..MEMORIES).find_map(|i| {
            let at = (first + i) % MEMORIES;
            self.memories[at].try_lock().ok().map(|m| (at, m))
        });
        let (mine, mut memory) = match taken {
            Some(m) => m,
            None => (first % MEMORIES, self.memories[first % MEMORIES].lock().unwrap_or_else(PoisonError::into_inner)),
        };
        self.tag_changes.catch_up(&mut memory);
        // The store prepares the readings as they are decoded, when it prepares them now; with
        // the memory held all along: its devices' `Arc`s are the ones the store's memo knows.
        let mut memo = std::mem::take(&mut memory.prepare_memo);
        let mut batch = match self.preparer.0.as_deref().and_then(|p| p.rows(&mut memo)) {
            Some(rows) => decode_lines_preparing(&cfg, SOURCE, None, body, crate::now_ms(), &mut memory, rows),
            None => decode_lines_remembering(&cfg, SOURCE, None, body, crate::now_ms(), &mut memory),
        };
        memory.prepare_memo = memo;
        batch.set_source(SOURCE.to_string());
        batch.count_as_message();
        drop(memory);
        // The other memories' notes of the devices reported here may no longer be the store's:
        // after x here and y there, x here again would otherwise not be reported. Taken after
        // this one is let go, so two decodes never wait for each other's memory.
        if !batch.device_tags.is_empty() {
            for (_, other) in self.memories.iter().enumerate().filter(|(i, _)| *i != mine) {
                let mut other = other.lock().unwrap_or_else(PoisonError::into_inner);
                for (device, tags) in &batch.device_tags {
                    other.reported_elsewhere(device, tags);
                }
            }
        }
        batch
    }

    /// Sends `batch` to the bucketer and returns once it is committed (readings and dead
    /// letters durable), with what the store made of it: committed alone, so the readings it
    /// stored and the dead letters it added (a table's schema refusing a field) are this
    /// batch's. Waits while the bucketer's channel is full (backpressure).
    pub async fn submit(&self, mut batch: IngestBatch) -> Result<Committed, IntakeError> {
        if batch.is_empty() && batch.device_tags.is_empty() {
            return Ok(Committed::default());
        }
        let sender = self.sender.read().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(sender) = sender else {
            self.forget_tags();
            return Err(IntakeError::Closed);
        };
        let (done, committed) = oneshot::channel();
        batch.alone = true;
        batch.acks.push(Ack::told(move |c: &Committed| {
            let _ = done.send(c.clone());
        }));
        if sender.send(batch).await.is_err() {
            self.forget_tags();
            return Err(IntakeError::Closed);
        }
        drop(sender);
        committed.await.map_err(|_| {
            self.forget_tags();
            IntakeError::NotStored
        })
    }

    /// Stops taking requests: the intake's sender is dropped, so the bucketer ends once the
    /// batches already sent are committed (requests in flight still get their answer).
    pub fn stop_intake(&self) {
        self.sender.write().unwrap_or_else(PoisonError::into_inner).take();
        self.open.send_replace(false);
    }

    /// Counts `batch`, decoded from a body of `bytes`, as taken in (the `http` source's
    /// messages, bytes, readings and dead letters): once its writer may write every table of it,
    /// so a body refused for its permissions counts nowhere.
    pub fn count_taken(&self, batch: &IngestBatch, bytes: usize) {
        self.stats.messages.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats.readings.fetch_add(batch.reading_count() as u64, Ordering::Relaxed);
        self.stats.dead_letters.fetch_add(batch.dead_letters.len() as u64, Ordering::Relaxed);
    }

    /// Drops a decoded batch that will not be submitted (its writer may not write one of its
    /// tables): like a batch that is not stored, it takes its tag reports with it.
    pub fn discard(&self, batch: IngestBatch) {
        drop(batch);
        self.forget_tags();
    }

    /// The tag reports of `devices` were not taken (their writer may not change them): every
    /// memory reports their tags again at their next line, whoever sends it.
    pub fn report_again(&self, devices: &[Arc<str>]) {
        for m in &self.memories {
            let mut m = m.lock().unwrap_or_else(PoisonError::into_inner);
            for device in devices {
                m.report_again(device);
            }
        }
    }

    /// A batch that is not stored takes its tag reports with it: forget what was noted, so the
    /// devices report their tags again.
    fn forget_tags(&self) {
        for m in &self.memories {
            m.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lines() -> &'static [u8] {
        b"readings,name=truck_1,fleet=East velocity=3.5,heading=120i 1704067200\n\
          readings,name=truck_2,fleet=West velocity=1.25 1704067260\n\
          readings,name=truck_3 velocity=oops 1704067260\n"
    }

    #[test]
    fn a_body_maps_to_readings_dead_letters_tags_and_one_message_a_table() {
        let (tx, _rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let batch = intake.decode(lines(), Precision::Seconds);
        let got: Vec<(&str, i64, Option<f64>)> =
            batch.readings.iter().map(|r| (&*r.device, r.reading.ts, r.reading.get_f64("velocity"))).collect();
        assert_eq!(got, [("truck_1", 1_704_067_200_000, Some(3.5)), ("truck_2", 1_704_067_260_000, Some(1.25))]);
        assert_eq!(batch.dead_letters.len(), 1);
        assert_eq!(batch.dead_letters[0].source, SOURCE);
        assert!(batch.dead_letters[0].detail.starts_with("line 3: "), "{}", batch.dead_letters[0].detail);
        assert_eq!(batch.messages, [(Arc::from("readings"), 1)]);
        let tags: Vec<(&str, &[(String, String)])> =
            batch.device_tags.iter().map(|(d, t)| (&**d, t.as_slice())).collect();
        assert_eq!(
            tags,
            [
                ("truck_1", &[("fleet".to_string(), "East".to_string())][..]),
                ("truck_2", &[("fleet".to_string(), "West".to_string())][..])
            ]
        );
        let s = intake.stats();
        let counts = || {
            [
                s.messages.load(Ordering::Relaxed),
                s.readings.load(Ordering::Relaxed),
                s.dead_letters.load(Ordering::Relaxed),
                s.bytes.load(Ordering::Relaxed),
            ]
        };
        // Counted once taken in, not when decoded (a body may yet be refused).
        assert_eq!(counts(), [0; 4]);
        intake.count_taken(&batch, lines().len());
        assert_eq!(counts(), [1, 2, 1, lines().len() as u64]);
    }

    #[test]
    fn unchanged_tags_are_reported_once_until_a_batch_is_lost() {
        let (tx, rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let body = b"readings,name=truck_1,fleet=East v=1 1\n";
        // Whichever memory each decode takes, after two decodes both have noted truck_1.
        let reported: Vec<usize> = (0..4).map(|_| intake.decode(body, Precision::Seconds).device_tags.len()).collect();
        assert_eq!(reported.iter().sum::<usize>(), 2, "{reported:?}");
        assert_eq!(&reported[2..], [0, 0]);
        // A batch the bucketer drops unacked: the intake forgets, the next decode reports again.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let batch = intake.decode(b"readings,name=truck_2 v=1 1\n", Precision::Seconds);
        drop(rx);
        assert_eq!(rt.block_on(intake.submit(batch)), Err(IntakeError::Closed));
        assert_eq!(intake.decode(body, Precision::Seconds).device_tags.len(), 1);
        assert_eq!(intake.decode(body, Precision::Seconds).device_tags.len(), 1);
        assert_eq!(intake.decode(body, Precision::Seconds).device_tags.len(), 0);
        // So does a batch discarded unsent.
        intake.discard(intake.decode(b"readings,name=truck_3 v=1 1\n", Precision::Seconds));
        assert_eq!(intake.decode(body, Precision::Seconds).device_tags.len(), 1);
    }

    /// Decodes alternate between the two memories; a device's tags changed back to what one
    /// memory noted before are still reported, as the other memory's report of the tags between
    /// made that note stale. (Before: x, y, x left the store with y.)
    #[test]
    fn tags_changed_back_are_reported_whichever_memory_decodes() {
        let (tx, _rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let line = |site: &str| format!("readings,name=truck_1,site={site} v=1 1\n");
        let reported: Vec<Vec<(String, String)>> = ["x", "y", "x", "y", "x", "x", "x", "x"]
            .iter()
            .map(|site| {
                let batch = intake.decode(line(site).as_bytes(), Precision::Seconds);
                batch.device_tags.into_iter().flat_map(|(_, tags)| tags).collect()
            })
            .collect();
        let site = |v: &str| vec![("site".to_string(), v.to_string())];
        assert_eq!(reported, [site("x"), site("y"), site("x"), site("y"), site("x"), site("x"), vec![], vec![]]);
        // Two changes in one body, then the tags the other memory noted before them: reported
        // (a note made stale twice stays stale).
        let (tx, _rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let bodies = [line("z"), line("z"), format!("{}{}", line("x"), line("y")), line("z")];
        let reported: Vec<Vec<(String, String)>> = bodies
            .iter()
            .map(|body| {
                let batch = intake.decode(body.as_bytes(), Precision::Seconds);
                batch.device_tags.into_iter().flat_map(|(_, tags)| tags).collect()
            })
            .collect();
        assert_eq!(reported, [site("z"), site("z"), [site("x"), site("y")].concat(), site("z")]);
    }

    /// A submitted batch is committed alone, and its submitter learns what the store made of it.
    #[test]
    fn a_submitted_batch_is_committed_alone_and_told_the_outcome() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let batch = intake.decode(lines(), Precision::Seconds);
        let letter = batch.dead_letters[0].clone();
        let told = Committed { readings: 1, rejected: vec![letter] };
        let (answer, alone) = rt.block_on(async {
            let outcome = told.clone();
            let bucketer = tokio::spawn(async move {
                let got = rx.recv().await.unwrap();
                got.acks.into_iter().for_each(|ack| ack.send_committed(&outcome));
                got.alone
            });
            let answer = intake.submit(batch).await;
            (answer, bucketer.await.unwrap())
        });
        assert!(alone);
        assert_eq!(answer, Ok(told));
    }

    #[test]
    fn an_unacked_batch_is_not_stored_and_a_stopped_intake_is_closed() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let intake = HttpIntake::new(tx, LpConfig::default());
        let open = intake.open();
        let batch = intake.decode(lines(), Precision::Seconds);
        let dropped = rt.block_on(async {
            let bucketer = tokio::spawn(async move {
                // Received and dropped with its acks, as a batch the store cannot build.
                let got = rx.recv().await.unwrap();
                assert_eq!(got.readings.len(), 2);
                rx
            });
            let answer = intake.submit(batch).await;
            (answer, bucketer.await.unwrap())
        });
        assert_eq!(dropped.0, Err(IntakeError::NotStored));
        let mut rx = dropped.1;
        assert!(*open.borrow());
        intake.stop_intake();
        assert!(!*open.borrow());
        let batch = intake.decode(lines(), Precision::Seconds);
        assert_eq!(rt.block_on(intake.submit(batch)), Err(IntakeError::Closed));
        // The intake held the last sender: the bucketer's channel has ended.
        assert!(rt.block_on(rx.recv()).is_none());
        // An empty body needs no commit.
        assert_eq!(rt.block_on(intake.submit(intake.decode(b"", Precision::Seconds))), Ok(Committed::default()));
    }
}
