//! Kafka consumer on rdkafka (librdkafka): a consumer group on configured topics, with an
//! exactly-once effect through offsets stored beside the data.
//!
//! # Messages
//!
//! The key, when present, names the device (readings and lines that name their own device
//! override it). The value is JSON as on MQTT ([`crate::wire::decode_json`]: one reading or an
//! array) or InfluxDB line protocol ([`crate::lpwire`]), per [`KafkaFormat`]. A JSON topic maps
//! to a table through [`KafkaConfig::topic_tables`], else [`KafkaConfig::default_table`], else
//! the topic's own name; a line-protocol line's measurement names its table. Dead letters name
//! their source as `kafka:{topic}/{partition}@{offset}`.
//!
//! # Exactly-once effect
//!
//! Every batch sent to the bucketer carries, per partition it covers, the offset of the next
//! message ([`model::SourceOffset`]); the bucketer writes them into the `offsets` column family
//! in the same WriteBatch as the readings and dead letters. On assignment each partition starts
//! at the larger of the offset this store holds and the offset the group committed to the
//! broker (another member may have moved it further while it owned the partition); with
//! neither, at the end of the partition that `auto.offset.reset` ([`OffsetReset`], logged)
//! names, read from the broker's watermarks (librdkafka's own lookup of that offset applies
//! only when they cannot be read). So after a kill -9 the consumer resumes exactly after the
//! last committed WriteBatch: nothing is stored twice and nothing is lost. A message librdkafka
//! delivers again under the same assignment is recognised by its offset, skipped and counted
//! ([`MqttStats::redelivered`]). The
//! same offsets are committed to the broker after each write (every
//! [`KafkaConfig::commit_interval`]), so standard lag tools work; the broker's copy is never
//! ahead of the store's.
//!
//! On a rebalance, revoked partitions drain before they are released: messages of theirs not
//! yet sent to the bucketer are dropped (never stored here, so the next owner reads them), the
//! batches already sent are awaited until committed (at most
//! [`KafkaConfig::revoke_drain_timeout`]), and their durable offsets are committed to the
//! broker synchronously. Past the deadline a batch still in flight may later be stored here
//! as well as by the next owner (logged as a warning).
//!
//! # Backpressure
//!
//! Batches go to the bucketer through the bounded channel with `try_reserve`. When it is full
//! the consumer pauses its partitions and keeps polling (which serves rebalances and keeps
//! `max.poll.interval.ms` satisfied: the group session stays alive however long the bucketer
//! takes), then resumes once the batch is handed over. Nothing is buffered beyond one batch
//! and what librdkafka had already fetched.
//!
//! The consumer runs on its own thread (librdkafka's API is blocking).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use model::{Ack, IngestBatch, SourceOffset};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch};

use crate::mqtt::MqttStats;
use crate::quiet::QuieterByText;
use crate::wire::{decode_json, decode_lp, WireConfig};

/// Errors of starting the consumer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// librdkafka refused the configuration or the subscription.
    #[error("Kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// The consumer thread could not be started.
    #[error("spawning the Kafka consumer thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the values of the consumed topics hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaFormat {
    /// JSON readings, as on MQTT.
    #[default]
    Json,
    /// InfluxDB line protocol.
    Lp,
}

/// Where a partition without any stored or committed offset starts (`auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffsetReset {
    /// At the oldest message the broker keeps.
    #[default]
    Earliest,
    /// At the next message produced.
    Latest,
}

impl OffsetReset {
    /// librdkafka's name of the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        }
    }
}

/// TLS to the brokers, through the system's OpenSSL. librdkafka checks the broker's certificate
/// against the CAs and its name against the address the client connects to
/// (`ssl.endpoint.identification.algorithm=https`, its default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaTls {
    /// PEM file of the CA certificates the brokers' certificates are checked against; `None`:
    /// OpenSSL's default store (Debian's `ca-certificates`).
    pub ca_file: Option<PathBuf>,
    /// PEM files of the client certificate and its private key, shown to brokers that ask for
    /// one; `None`: none.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// A SASL login at the brokers.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaSasl {
    /// librdkafka's `sasl.mechanisms`: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    /// The login's username.
    pub username: String,
    /// The login's password; `Debug` does not show it.
    pub password: String,
}

impl std::fmt::Debug for KafkaSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"(not shown)")
            .finish()
    }
}

/// How the consumer reaches the brokers: TLS or not, a SASL login or not (librdkafka's
/// `security.protocol`: `plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    /// TLS; `None`: plain TCP.
    pub tls: Option<KafkaTls>,
    /// SASL; `None`: no login.
    pub sasl: Option<KafkaSasl>,
}

impl KafkaSecurity {
    /// librdkafka's name of the protocol.
    pub fn protocol(&self) -> &'static str {
        match (self.tls.is_some(), self.sasl.is_some()) {
            (false, false) => "plaintext",
            (true, false) => "ssl",
            (false, true) => "sasl_plaintext",
            (true, true) => "sasl_ssl",
        }
    }

    /// The librdkafka properties of this security.
    pub fn properties(&self) -> Vec<(&'static str, String)> {
        let mut p = vec![("security.protocol", self.protocol().to_string())];
        if let Some(tls) = &self.tls {
            if let Some(ca) = &tls.ca_file {
                p.push(("ssl.ca.location", ca.display().to_string()));
            }
            if let Some((cert, key)) = &tls.client {
                p.push(("ssl.certificate.location", cert.display().to_string()));
                p.push(("ssl.key.location", key.display().to_string()));
            }
        }
        if let Some(sasl) = &self.sasl {
            p.push(("sasl.mechanisms", sasl.mechanism.clone()));
            p.push(("sasl.username", sasl.username.clone()));
            p.push(("sasl.password", sasl.password.clone()));
        }
        p
    }

    /// Whether librdkafka takes these settings: it reads the CAs, the certificate and the key
    /// and checks the SASL mechanism when a client is made (no broker is reached). `Err` is its
    /// reason, which names the property at fault (`ssl.ca.location`,
    /// `ssl.certificate.location`, `ssl.key.location`, `sasl.mechanisms`).
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "127.0.0.1:9").set_log_level(RDKafkaLogLevel::Emerg);
        for (k, v) in self.properties() {
            c.set(k, v);
        }
        c.create::<BaseConsumer>().map(drop).map_err(|e| match e {
            KafkaError::ClientCreation(reason) => reason,
            other => other.to_string(),
        })
    }
}

/// Kafka consumer settings.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Consumer group.
    pub group_id: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Value format of every topic.
    pub format: KafkaFormat,
    /// JSON: table of each topic.
    pub topic_tables: BTreeMap<String, String>,
    /// JSON: table of topics not in `topic_tables`; `None`: the topic's name.
    pub default_table: Option<String>,
    /// Payload limit and line-protocol mapping (precision, device tag).
    pub wire: WireConfig,
    /// Start of partitions with no offset stored or committed.
    pub auto_offset_reset: OffsetReset,
    /// Group session timeout, ms (`session.timeout.ms`).
    pub session_timeout_ms: u32,
    /// Longest pause between polls before the member leaves the group, ms
    /// (`max.poll.interval.ms`); the consumer polls while paused, so this is not reached when the
    /// bucketer is slow.
    pub max_poll_interval_ms: u32,
    /// Longest wait for in-flight batches of revoked partitions.
    pub revoke_drain_timeout: Duration,
    /// Interval of the offset commits to the broker.
    pub commit_interval: Duration,
    /// A batch goes to the bucketer once it holds this many readings (or nothing more is
    /// fetched).
    pub flush_readings: usize,
    /// TLS and SASL to the brokers (default: neither).
    pub security: KafkaSecurity,
    /// Extra librdkafka properties (name, value), applied last.
    pub extra: Vec<(String, String)>,
    /// Line protocol: the store's tag changes, read before each message is decoded.
    pub tag_changes: crate::lpwire::TagChangesSource,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            group_id: "hourglass".into(),
            topics: vec!["hourglass".into()],
            format: KafkaFormat::Json,
            topic_tables: BTreeMap::new(),
            default_table: None,
            wire: WireConfig::default(),
            auto_offset_reset: OffsetReset::Earliest,
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 300_000,
            revoke_drain_timeout: Duration::from_secs(10),
            commit_interval: Duration::from_secs(1),
            flush_readings: 20_000,
            security: KafkaSecurity::default(),
            extra: Vec::new(),
            tag_changes: crate::lpwire::TagChangesSource::default(),
        }
    }
}

/// Reads the stored position of a partition: `(topic, partition)` → the next offset, `None`
/// when nothing of it is stored. Given by the caller, so ingest knows nothing of storage.
pub type StoredOffsets = Arc<dyn Fn(&str, i32) -> Result<Option<i64>, String> + Send + Sync>;

/// Consumer lag per assigned partition, from librdkafka's statistics (high watermark minus the
/// committed offset), refreshed every second; and how many partitions the group assigned.
#[derive(Debug, Default)]
pub struct PartitionLag {
    lag: Mutex<BTreeMap<(String, i32), i64>>,
    assigned: std::sync::atomic::AtomicU64,
}

impl PartitionLag {
    /// Partitions the group has assigned to this consumer now (0 during a rebalance, and for a
    /// member the group gives none).
    pub fn assigned(&self) -> u64 {
        self.assigned.load(Ordering::Relaxed)
    }

    /// `(topic, partition, lag in messages)` of each assigned partition whose lag is known.
    pub fn snapshot(&self) -> Vec<(String, i32, i64)> {
        lock(&self.lag).iter().map(|((t, p), l)| (t.clone(), *p, *l)).collect()
    }
}

/// Control of a running consumer for ordered shutdown.
#[derive(Debug)]
pub struct KafkaControl {
    /// Set to `true` to stop taking new messages; the consumer pauses, drops what it has not
    /// sent and drops its channel sender.
    pub stop_intake: watch::Sender<bool>,
    /// Set to `true` once the bucketer has committed everything; the consumer then commits the
    /// durable offsets to the broker and leaves the group.
    pub writer_done: watch::Sender<bool>,
    /// `true` once the consumer has joined its group and received its assignment (possibly
    /// empty); `false` while no broker is reachable (by librdkafka's statistics, each second)
    /// and again when intake stops.
    pub subscribed: watch::Receiver<bool>,
}

impl KafkaControl {
    /// Waits until the consumer has its first assignment, at most `limit`; returns whether it
    /// has.
    pub async fn wait_subscribed(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.subscribed.wait_for(|v| *v)).await.is_ok_and(|r| r.is_ok())
    }
}

/// Starts the consumer on its own thread. `stats` counts messages, bytes, readings, dead
/// letters and group joins; `stored` reads this store's offsets.
pub fn spawn(
    cfg: KafkaConfig,
    tx: mpsc::Sender<IngestBatch>,
    stats: Arc<MqttStats>,
    lag: Arc<PartitionLag>,
    stored: StoredOffsets,
) -> Result<(KafkaControl, std::thread::JoinHandle<bool>)> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(false);
    let (sub_tx, sub_rx) = watch::channel(false);
    let shared = Arc::new(Shared::default());
    let context = GroupContext {
        errors: Mutex::default(),
        logs: Mutex::default(),
        shared: shared.clone(),
        stored,
        lag,
        stats: stats.clone(),
        subscribed: sub_tx,
        assigned: AtomicBool::new(false),
        session_lost: AtomicBool::new(false),
        brokers_up: AtomicBool::new(true),
        last_error: Mutex::default(),
        stopping: AtomicBool::new(false),
        drain_timeout: cfg.revoke_drain_timeout,
        reset: cfg.auto_offset_reset,
        tls_ca: cfg.security.tls.as_ref().map(|t| t.ca_file.clone()),
        looked_at: Mutex::default(),
    };
    // `/ready`'s reason from the start: joining the group.
    context.publish_subscribed();
    let consumer: BaseConsumer<GroupContext> = client_config(&cfg).create_with_context(context)?;
    let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    tracing::info!(
        brokers = %cfg.brokers, group = %cfg.group_id, topics = ?cfg.topics, format = ?cfg.format,
        auto_offset_reset = cfg.auto_offset_reset.as_str(), security = cfg.security.protocol(),
        "Kafka consumer starting (partitions without a stored or committed offset start at the auto_offset_reset end)"
    );
    let handle = std::thread::Builder::new().name("kafka-consumer".into()).spawn(move || {
        Loop {
            cfg,
            consumer,
            tx: Some(tx),
            stats,
            shared,
            stop: stop_rx,
            writer_done: done_rx,
            tags: crate::lpwire::TagMemory::default(),
        }
        .run()
    })?;
    Ok((KafkaControl { stop_intake: stop_tx, writer_done: done_tx, subscribed: sub_rx }, handle))
}

/// How long a stop waits for the consumer's close (leaving its group) once its offsets are
/// committed or found uncommittable. A close with a group coordinator answering takes
/// milliseconds.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// librdkafka fetch settings of the consumer (the `extra` properties can override them).
///
/// librdkafka stops fetching once its local queue holds `queued.max.messages.kbytes` and then
/// waits `fetch.queue.backoff.ms` (1 s by default) before it looks again. Gateway messages are
/// large (a thousand readings is about 170 KB), so the default 64 MB queue filled in a burst,
/// was decoded in about half a second and the consumer then sat idle for the rest of the
/// second: `hourglass bench kafka` stored 433K readings/s with idle gaps of 100–500 ms, and
/// 536–652K with these settings. A smaller queue rechecked every 10 ms keeps the decoder fed
/// with less memory held.
pub const FETCH_TUNING: &[(&str, &str)] = &[("fetch.queue.backoff.ms", "10"), ("queued.max.messages.kbytes", "16384")];

/// How often the topics are listed again when one of `topics` is a pattern (`^…`), so that a
/// topic made since that matches it is consumed.
pub const PATTERN_REFRESH_MS: u32 = 30_000;

fn client_config(cfg: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.brokers)
        .set("group.id", &cfg.group_id)
        .set("client.id", format!("hourglass-{}", std::process::id()))
        // Offsets are committed by hand, only once the data they cover is durable.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", cfg.auto_offset_reset.as_str())
        .set("session.timeout.ms", cfg.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", cfg.max_poll_interval_ms.max(cfg.session_timeout_ms).to_string())
        .set("statistics.interval.ms", "1000")
        .set("enable.partition.eof", "false")
        .set_log_level(RDKafkaLogLevel::Warning);
    for (k, v) in FETCH_TUNING {
        c.set(*k, *v);
    }
    if cfg.topics.iter().any(|t| t.starts_with('^')) {
        // A topic made after the start is found at a metadata refresh: librdkafka's default of
        // 5 minutes left a new topic matching a pattern unread that long (QA53 F6).
        c.set("topic.metadata.refresh.interval.ms", PATTERN_REFRESH_MS.to_string());
    }
    for (k, v) in cfg.security.properties() {
        c.set(k, v);
    }
    for (k, v) in &cfg.extra {
        c.set(k, v);
    }
    c
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the consumer thread, the rebalance callback and the acks share.
#[derive(Debug, Default)]
struct Shared {
    parts: Mutex<HashMap<Arc<str>, BTreeMap<i32, Part>>>,
    /// Signalled when an ack lands.
    acked: Condvar,
    /// Bumped by every rebalance, so the loop drops what it holds of revoked partitions.
    generation: AtomicU64,
    /// Numbers assignments: what was read under one assignment of a partition is never sent
    /// under a later one (which starts again from the stored offset).
    next_epoch: AtomicU64,
    /// The stop's commit failed (and was warned of): the release of the partitions as the
    /// consumer closes commits nothing more, where it would wait for a group coordinator again.
    stop_commit_failed: AtomicBool,
}

/// The state of one partition this member has owned.
#[derive(Debug, Default, Clone, Copy)]
struct Part {
    assigned: bool,
    /// Which assignment this is (see `Shared::next_epoch`).
    epoch: u64,
    /// Batches sent to the bucketer and not yet committed.
    in_flight: u32,
    /// Next offset of the last committed batch.
    durable: Option<i64>,
    /// Next offset last committed to the broker, as a synchronous commit confirmed (or the
    /// group's commit at assignment).
    committed: Option<i64>,
    /// Next offset of the last asynchronous commit sent. librdkafka reports no result of a
    /// manual asynchronous commit (it logs a failure as a warning of its own), so one is not
    /// taken as done: a release or a stop commits synchronously what was not confirmed.
    sent: Option<i64>,
    /// The offset below which a message of this assignment has been taken already: its start,
    /// then one past the last message taken. Messages librdkafka delivers again are skipped:
    /// it did when it moved a partition back to the offset its own `auto.offset.reset` lookup
    /// had found (see `GroupContext::reset_offset`), and its issues describe resumes after a
    /// pause falling back on `auto.offset.reset` or on a stale fetch position.
    taken: Option<i64>,
    /// librdkafka started the partition over at its `auto.offset.reset` end because the broker
    /// answered a fetch at this offset (the position, as its log line says) "offset out of
    /// range" (see [`Shared::note_out_of_range`]); cleared by the next message below `taken`
    /// (the start-over) or at or past that position.
    out_of_range: Option<i64>,
    /// Start-overs after "offset out of range": an ack of a batch sent before the last one (of
    /// the old log), or under another assignment, does not move `durable`.
    restarts: u32,
}

/// What [`Shared::take`] made of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// New to the partition's assignment of this epoch: taken.
    New(u64),
    /// Taken already under this assignment: delivered again (see [`Part::taken`]).
    Again,
    /// Of a partition not assigned to this member (revoked, or never ours).
    NotAssigned,
}

impl Shared {
    fn is_assigned(&self, topic: &str, partition: i32) -> bool {
        self.assigned_epoch(topic, partition).is_some()
    }

    /// `f` of the state of the partition, when it is assigned to this member; `None` when not.
    fn assigned<R>(&self, topic: &str, partition: i32, f: impl FnOnce(&mut Part) -> R) -> Option<R> {
        lock(&self.parts).get_mut(topic).and_then(|ps| ps.get_mut(&partition)).filter(|p| p.assigned).map(f)
    }

    /// The next offset the store holds everything before, of an assigned partition.
    fn assigned_durable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.assigned(topic, partition, |p| p.durable).flatten()
    }

    /// The epoch of the partition's current assignment; `None` when it is not assigned.
    fn assigned_epoch(&self, topic: &str, partition: i32) -> Option<u64> {
        self.assigned(topic, partition, |p| p.epoch)
    }

    /// Whether the message at `offset` is new to the partition's current assignment, noting
    /// it taken if so.
    fn take(&self, topic: &str, partition: i32, offset: i64) -> Take {
        self.assigned(topic, partition, |part| Self::take_in(part, topic, partition, offset))
            .unwrap_or(Take::NotAssigned)
    }

    /// [`Shared::take`] of an assigned partition's state.
    fn take_in(part: &mut Part, topic: &str, partition: i32, offset: i64) -> Take {
        if part.taken.is_some_and(|taken| offset < taken) {
            if part.out_of_range.take().is_none() {
                return Take::Again;
            }
            // The log the mark was of is gone (the topic deleted and made again, another
            // cluster under the same name): the partition's log starts over here, and what is
            // stored and committed of it from now on is of the new log (acks of batches sent
            // before, of the old log, no longer move `durable`).
            tracing::warn!(
                %topic, partition, offset, was = ?part.taken,
                "Kafka partition started over after \"offset out of range\": its stored offset was past the log's end"
            );
            part.durable = Some(offset);
            part.committed = None;
            part.restarts += 1;
        } else if part.out_of_range.is_some_and(|at| offset >= at) {
            // The reset landed at or past the refused position (a stored offset below the
            // log's start): nothing to start over. Below it, a message of the old log that
            // librdkafka had queued before the reset is taken as any, and the note kept.
            part.out_of_range = None;
        }
        part.taken = Some(offset + 1);
        Take::New(part.epoch)
    }

    /// librdkafka logged that it started the partition over at its `auto.offset.reset` end,
    /// the broker having answered a fetch at the partition's position "offset out of range":
    /// the next message may be below the assignment's mark and is taken all the same (else a
    /// stored offset past the end of a topic made again would drop every message below it).
    fn note_out_of_range(&self, topic: &str, partition: i32, at: Option<i64>) {
        // Without the position, the mark: a message at or past it ends the note.
        self.assigned(topic, partition, |part| part.out_of_range = at.or(part.taken).or(Some(0)));
    }

    /// Offsets durable but not yet committed to the broker, of `only` partitions (all if
    /// `None`), as a list to commit: for an asynchronous commit (`mode`), those not sent in one
    /// either; for a synchronous one, every offset not confirmed.
    fn to_commit(
        &self,
        only: Option<&[(Arc<str>, i32)]>,
        mode: CommitMode,
    ) -> (TopicPartitionList, Vec<(Arc<str>, i32, i64)>) {
        let mut tpl = TopicPartitionList::new();
        let mut list = Vec::new();
        let parts = lock(&self.parts);
        for (topic, ps) in parts.iter() {
            for (partition, p) in ps {
                if only.is_some_and(|o| !o.iter().any(|(t, q)| t == topic && q == partition)) {
                    continue;
                }
                let done = match mode {
                    CommitMode::Async => p.committed.max(p.sent),
                    CommitMode::Sync => p.committed,
                };
                if let Some(d) = p.durable.filter(|d| Some(*d) > done) {
                    if tpl.add_partition_offset(topic, *partition, Offset::Offset(d)).is_ok() {
                        list.push((topic.clone(), *partition, d));
                    }
                }
            }
        }
        (tpl, list)
    }

    /// Notes the offsets of `list` committed (`Sync`, confirmed) or sent (`Async`).
    fn mark_committed(&self, list: &[(Arc<str>, i32, i64)], mode: CommitMode) {
        let mut parts = lock(&self.parts);
        for (topic, partition, offset) in list {
            if let Some(p) = parts.get_mut(topic).and_then(|ps| ps.get_mut(partition)) {
                let mark = match mode {
                    CommitMode::Sync => &mut p.committed,
                    CommitMode::Async => &mut p.sent,
                };
                *mark = Some(mark.map_or(*offset, |c| c.max(*offset)));
            }
        }
    }
}

/// How long a synchronous commit (a revoke's, the stop's) waits for the broker's answer. One
/// with a group coordinator answering takes milliseconds.
pub const COMMIT_LIMIT: Duration = Duration::from_secs(15);

/// Commits the durable offsets (of `only`, or all) to the broker. A synchronous commit waits
/// for the broker's answer, at most [`COMMIT_LIMIT`] ([`commit_within`]); an asynchronous one
/// is sent, and its offsets go again in the next synchronous commit ([`Part::sent`]). Answers
/// how many partitions' offsets were committed (0 when none was to commit; an asynchronous
/// commit's once sent), or how many failed and the error, which the caller of a synchronous
/// commit logs.
fn commit_durable(
    consumer: &BaseConsumer<GroupContext>,
    shared: &Shared,
    mode: CommitMode,
    only: Option<&[(Arc<str>, i32)]>,
) -> Result<usize, (usize, KafkaError)> {
    let (tpl, list) = shared.to_commit(only, mode);
    if list.is_empty() {
        return Ok(0);
    }
    let committed = match mode {
        CommitMode::Sync => commit_within(consumer, &tpl, COMMIT_LIMIT),
        CommitMode::Async => consumer.commit(&tpl, mode),
    };
    match committed {
        Ok(()) => {
            shared.mark_committed(&list, mode);
            Ok(list.len())
        }
        Err(e) => {
            // A synchronous commit's failure is said by its caller (a release, the stop), with
            // what it means there.
            if matches!(mode, CommitMode::Async) {
                tracing::warn!(error = %e, "committing offsets to the Kafka broker failed; they stay stored in Hourglass");
            }
            Err((list.len(), e))
        }
    }
}

/// Commits `tpl` and waits for the broker's answer, at most `limit`: librdkafka's synchronous
/// commit (`rd_kafka_commit`) waits without end, and a broker that stopped answering with its
/// connection open (a frozen host, a network partition) held a revoke and the stop for good
/// (QA50 H1: `serve` and the bench harness hung until the broker was resumed). The commit's
/// answer comes on a queue of its own, polled for `limit`; past it, the error is `TimedOut`.
#[allow(unsafe_code)]
fn commit_within(consumer: &BaseConsumer<GroupContext>, tpl: &TopicPartitionList, limit: Duration) -> KafkaResult<()> {
    use rdkafka::bindings as rd;
    let rk = consumer.client().native_ptr();
    let wait_ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `rk` is the consumer's handle, alive for this borrow of it; `tpl` is a live list,
    // which librdkafka copies. The queue is made here on `rk`, and destroyed here once, after
    // its last use; the event is destroyed once, after its last read. librdkafka keeps a
    // reference of its own to the queue for the commit's answer, so destroying it before the
    // answer came (past `limit`) is safe: the answer is then dropped.
    let err = unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let mut err = rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue, None, std::ptr::null_mut());
        if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            let event = rd::rd_kafka_queue_poll(queue, wait_ms);
            if event.is_null() {
                err = RDKafkaRespErr::RD_KAFKA_RESP_ERR__TIMED_OUT;
            } else {
                err = rd::rd_kafka_event_error(event);
                rd::rd_kafka_event_destroy(event);
            }
        }
        rd::rd_kafka_queue_destroy(queue);
        err
    };
    match err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
        err => Err(KafkaError::ConsumerCommit(err.into())),
    }
}

/// librdkafka callbacks: rebalances, statistics, logs, errors.
struct GroupContext {
    /// librdkafka's error callback, quieted (each text of a broker's failed handshakes, and the
    /// "brokers are down" after each, alternate: one quieter for the last text logged them all).
    errors: Mutex<QuieterByText>,
    /// librdkafka's own error and warning lines, quieted alike.
    logs: Mutex<QuieterByText>,
    shared: Arc<Shared>,
    stored: StoredOffsets,
    lag: Arc<PartitionLag>,
    stats: Arc<MqttStats>,
    /// Whether the consumer has its assignment and a broker is up: `assigned` and
    /// `brokers_up` together.
    subscribed: watch::Sender<bool>,
    /// Whether the group gave the consumer its assignment (and the consumer is not stopping).
    assigned: AtomicBool,
    /// Whether the last assignment was lost (the member's session timed out), and none came since.
    session_lost: AtomicBool,
    /// Whether librdkafka's last statistics had a broker connection up (true until the first):
    /// with none, nothing is read, and `/ready` says so.
    brokers_up: AtomicBool,
    /// librdkafka's last error, said by `/ready` while no broker connection is up.
    last_error: Mutex<Option<String>>,
    /// Whether the consumer is stopping (it then takes no assignment).
    stopping: AtomicBool,
    drain_timeout: Duration,
    reset: OffsetReset,
    /// With TLS, the CA file (`None`: the system's), for [`second_look`]; and when each broker
    /// address was last looked at.
    tls_ca: Option<Option<PathBuf>>,
    looked_at: Mutex<HashMap<String, Instant>>,
}

/// How often a broker's certificate is looked at again ([`second_look`]) while librdkafka keeps
/// finding it wrong.
const SECOND_LOOK_EVERY: Duration = Duration::from_secs(300);

impl GroupContext {
    /// On librdkafka's `certificate verify failed` (said alike for another CA, a name the
    /// certificate does not hold and an expired one), looks at the broker's certificate again
    /// with rustls, on a thread of its own, and logs what rustls finds wrong with it.
    fn look_again(&self, text: &str) {
        let Some(ca) = self.tls_ca.clone() else { return };
        if !text.contains("certificate verify failed") {
            return;
        }
        // librdkafka names the broker `ssl://host:port/id` (or `sasl_ssl://…`).
        let Some(address) = text.split("ssl://").nth(1).and_then(|rest| rest.split('/').next()) else { return };
        let now = Instant::now();
        {
            let mut looked = lock(&self.looked_at);
            if looked.get(address).is_some_and(|at| now.duration_since(*at) < SECOND_LOOK_EVERY) {
                return;
            }
            looked.insert(address.to_string(), now);
        }
        let address = address.to_string();
        let _ = std::thread::Builder::new().name("kafka-tls-look".into()).spawn(move || {
            if let Some(fault) = second_look(&address, ca.as_deref()) {
                tracing::warn!(
                    broker = %address, %fault,
                    "the Kafka broker's certificate, looked at again with rustls: librdkafka's \"certificate verify \
                     failed\" is this"
                );
            }
        });
    }
}

/// What rustls finds wrong with the certificate of the broker at `address` (`host:port`),
/// checked against `ca_file` (`None`: the system's CAs) for the host's name: `Expired`,
/// `NotValidForName`, `UnknownIssuer`, …; `None` when it finds no fault or cannot look.
fn second_look(address: &str, ca_file: Option<&std::path::Path>) -> Option<String> {
    use std::net::ToSocketAddrs;
    let (host, port) = address.rsplit_once(':')?;
    let config = crate::mqtt::client_tls(ca_file, None).ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let mut tls = rustls::ClientConnection::new(config, name).ok()?;
    let mut tcp = (host, port.parse::<u16>().ok()?)
        .to_socket_addrs()
        .ok()?
        .find_map(|to| std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).ok())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    tcp.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut tcp) {
            let text = e.to_string();
            return text.contains("invalid peer certificate").then_some(text);
        }
    }
    None
}

impl ClientContext for GroupContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let text = format!("{error}: {reason}");
        self.look_again(&text);
        // "1/1 brokers are down" follows each broker's own error, which says more.
        if !matches!(error, KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AllBrokersDown)) {
            *lock(&self.last_error) = Some(text.clone());
        }
        if let Some(repeats) = lock(&self.errors).admit(&text, Instant::now()) {
            tracing::error!(repeats, "librdkafka: {text}");
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if let Some((topic, partition, at)) = reset_out_of_range(fac, log_message) {
            self.shared.note_out_of_range(topic, partition, at);
        }
        let admit = || lock(&self.logs).admit(log_message, Instant::now());
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                if let Some(repeats) = admit() {
                    tracing::error!(facility = fac, repeats, "librdkafka: {log_message}")
                }
            }
            RDKafkaLogLevel::Warning => {
                if let Some(repeats) = admit() {
                    tracing::warn!(facility = fac, repeats, "librdkafka: {log_message}")
                }
            }
            _ => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }

    fn stats(&self, statistics: Statistics) {
        let up = statistics.brokers.values().any(|b| b.state == "UP");
        if self.brokers_up.swap(up, Ordering::SeqCst) != up {
            if up {
                tracing::info!("a Kafka broker is reachable again");
            } else {
                // librdkafka's handles include internal and logical ones (the group
                // coordinator) and a bootstrap one beside the learned one: the addresses count.
                let brokers: std::collections::BTreeSet<&str> = statistics
                    .brokers
                    .values()
                    .filter(|b| b.source != "internal" && b.source != "logical")
                    .map(|b| b.nodename.as_str())
                    .collect();
                tracing::warn!(
                    brokers = brokers.len(),
                    "no Kafka broker is reachable: nothing is read, and /ready answers 503, until one is"
                );
            }
        }
        self.publish_subscribed();
        let mut lag = lock(&self.lag.lag);
        lag.clear();
        for (name, topic) in &statistics.topics {
            for (id, p) in &topic.partitions {
                if *id < 0 || !self.shared.is_assigned(name, *id) {
                    continue;
                }
                // librdkafka knows no lag (-1) while it knows no committed offset, as after a
                // restart that started the partition at an explicit offset, until the next
                // commit: then the high watermark less what the store holds.
                let durable = || self.shared.assigned_durable(name, *id);
                let known = if p.consumer_lag >= 0 {
                    Some(p.consumer_lag)
                } else {
                    durable().filter(|_| p.hi_offset >= 0).map(|d| (p.hi_offset - d).max(0))
                };
                if let Some(n) = known {
                    lag.insert((name.clone(), *id), n);
                }
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.start_at_stored_offsets(consumer, tpl);
                if let Err(e) = consumer.assign(tpl) {
                    tracing::error!(error = %e, "Kafka assign failed");
                }
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                self.lag.assigned.store(tpl.count() as u64, Ordering::Relaxed);
                self.session_lost.store(false, Ordering::SeqCst);
                self.assigned.store(true, Ordering::SeqCst);
                self.publish_subscribed();
            }
            // An eager rebalance: every partition is revoked, the next assignment names all.
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.release(consumer, tpl),
            other => {
                tracing::error!(error = ?other, "Kafka rebalance error; releasing the assignment");
                self.release(consumer, tpl);
            }
        }
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl GroupContext {
    /// Releases the partitions of `tpl`, revoked: drained, committed (unless the assignment was
    /// lost), unassigned. A member whose assignment was lost is out of its group until it joins
    /// again, reading nothing: not subscribed meanwhile (`/ready` said 200 for as long as a frozen
    /// broker kept it out: QA53 F4), unlike a member between two assignments of a rebalance.
    fn release(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        self.lag.assigned.store(0, Ordering::Relaxed);
        let lost = consumer.assignment_lost();
        if lost {
            self.session_lost.store(true, Ordering::SeqCst);
            self.assigned.store(false, Ordering::SeqCst);
            self.publish_subscribed();
        }
        self.drain_revoked(consumer, tpl, lost);
        if let Err(e) = consumer.unassign() {
            tracing::error!(error = %e, "Kafka unassign failed");
        }
    }

    /// Publishes whether the consumer is subscribed: assigned, with a broker up; and if not, why
    /// (`/ready` says it: it said only "connecting, reconnecting, stopping, or the subscription
    /// refused").
    fn publish_subscribed(&self) {
        let (assigned, up) = (self.assigned.load(Ordering::SeqCst), self.brokers_up.load(Ordering::SeqCst));
        let why = if self.stopping.load(Ordering::SeqCst) {
            Some("stopping".to_string())
        } else if !up {
            Some(match lock(&self.last_error).as_deref() {
                Some(error) => format!("no Kafka broker connection is up (librdkafka's last error: {error})"),
                None => "no Kafka broker connection is up".to_string(),
            })
        } else if !assigned && self.session_lost.load(Ordering::SeqCst) {
            Some(
                "the group took this consumer's partitions: its session timed out (no answer from the group \
                 coordinator for session_timeout_ms); joining the group again"
                    .into(),
            )
        } else if !assigned {
            Some("the group has not given this consumer its partitions yet (joining the group, or a rebalance)".into())
        } else {
            None
        };
        self.stats.set_not_subscribed_because(why);
        let now = assigned && up;
        self.subscribed.send_if_modified(|v| std::mem::replace(v, now) != now);
    }

    /// Sets each assigned partition's start to max(stored here, committed to the broker); one
    /// with neither starts at the `auto_offset_reset` end, which is committed at once.
    fn start_at_stored_offsets(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let committed: HashMap<(String, i32), i64> = match consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
        {
            Ok(c) => c
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading the group's committed offsets failed; starting from the stored ones");
                HashMap::new()
            }
        };
        let assigned: Vec<(String, i32)> =
            tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        // After one failed watermark read the rest are not tried (each could wait its timeout).
        let mut watermarks_failed = false;
        // Partitions starting at the auto_offset_reset end, committed before they are assigned.
        let mut reset = Vec::new();
        for (topic, partition) in assigned {
            let stored = match (self.stored)(&topic, partition) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(%topic, partition, error = %e, "reading the stored offset failed; using the committed one");
                    None
                }
            };
            let broker = committed.get(&(topic.clone(), partition)).copied();
            let resumed = stored.max(broker);
            let start = resumed.or_else(|| self.reset_offset(consumer, &topic, partition, &mut watermarks_failed));
            if let Some(start) = start {
                if let Err(e) = tpl.set_partition_offset(&topic, partition, Offset::Offset(start)) {
                    tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
                }
            }
            match (resumed, start) {
                (Some(_), _) => {
                    tracing::info!(%topic, partition, stored = ?stored, committed = ?broker, start = ?start, "Kafka partition assigned")
                }
                (None, Some(start)) => tracing::info!(
                    %topic, partition, start, auto_offset_reset = self.reset.as_str(),
                    "Kafka partition assigned (no stored or committed offset: starts at the auto_offset_reset end)"
                ),
                (None, None) => {
                    tracing::info!(%topic, partition, "Kafka partition assigned (no start: librdkafka's auto_offset_reset applies)")
                }
            }
            // Locked only here: the watermarks above are a round trip to the broker, and the
            // writer's acks take the lock too.
            let mut parts = lock(&self.shared.parts);
            let ps = match parts.get_mut(topic.as_str()) {
                Some(ps) => ps,
                None => parts.entry(Arc::from(topic.as_str())).or_default(),
            };
            let epoch = self.shared.next_epoch.fetch_add(1, Ordering::SeqCst);
            // A start at the auto_offset_reset end is as good as durable: committed to the broker
            // below, before the partition is read, so a restart resumes there. Else a restart
            // before a message of the partition is stored looks `latest` up again, past what
            // arrived meanwhile (QA53 F5: a kill -9 within the first commit interval did).
            let durable = resumed.or(start);
            if resumed.is_none() && start.is_some() {
                reset.push((Arc::from(topic.as_str()), partition));
            }
            ps.insert(
                partition,
                Part {
                    assigned: true,
                    epoch,
                    in_flight: 0,
                    durable,
                    committed: broker,
                    sent: None,
                    taken: start,
                    out_of_range: None,
                    restarts: 0,
                },
            );
        }
        if reset.is_empty() {
            return;
        }
        if let Err((partitions, error)) = commit_durable(consumer, &self.shared, CommitMode::Sync, Some(&reset)) {
            tracing::warn!(
                partitions, %error, limit_s = COMMIT_LIMIT.as_secs(),
                auto_offset_reset = self.reset.as_str(),
                "the start offsets of partitions new to the group were not committed: until the first periodic \
                 commit, a restart (a crash) looks the auto_offset_reset end up again, and with `latest` skips what \
                 arrived meanwhile"
            );
        }
    }

    /// The offset `auto.offset.reset` names for a partition, from the broker's watermarks: the
    /// oldest message kept (`earliest`) or the next to be produced (`latest`); `None` when they
    /// cannot be read (or one read already failed, `failed`), and librdkafka then looks the
    /// offset up itself. Looking it up here is what avoids a librdkafka (2.12.1) race: a
    /// partition paused (backpressure) while librdkafka's own lookup is under way gets a late
    /// answer that restarts the lookup's timer, which fires once the partition is fetching and
    /// moves it back to the offset looked up, so the whole partition is read again (its debug
    /// log in the kill -9 restart test: "timed offset query for offset BEGINNING ... in state
    /// active", then "start fetching at offset 0"; 400 of the test's 800 messages delivered
    /// twice in one run of six).
    fn reset_offset(
        &self,
        consumer: &BaseConsumer<Self>,
        topic: &str,
        partition: i32,
        failed: &mut bool,
    ) -> Option<i64> {
        if *failed {
            return None;
        }
        match consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)) {
            Ok((low, high)) => Some(match self.reset {
                OffsetReset::Earliest => low,
                OffsetReset::Latest => high,
            }),
            Err(e) => {
                *failed = true;
                tracing::warn!(%topic, partition, error = %e, "reading the partition's watermarks failed; librdkafka looks the start up");
                None
            }
        }
    }

    /// Waits (at most the drain timeout) for the batches in flight of the revoked partitions,
    /// then commits their durable offsets synchronously, unless the assignment was `lost`: the
    /// group took the partitions from this member (its session timed out, as librdkafka finds
    /// after `session_timeout_ms` without an answer from the group coordinator), so a commit
    /// of them would be refused, or, with the coordinator gone, waited for [`COMMIT_LIMIT`] in
    /// vain while the member could be joining again (librdkafka commits no lost partition
    /// either).
    fn drain_revoked(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList, lost: bool) {
        let revoked: Vec<(Arc<str>, i32)> =
            tpl.elements().iter().map(|e| (Arc::from(e.topic()), e.partition())).collect();
        let deadline = Instant::now() + self.drain_timeout;
        let mut parts = lock(&self.shared.parts);
        for (t, p) in &revoked {
            if let Some(part) = parts.get_mut(t).and_then(|ps| ps.get_mut(p)) {
                part.assigned = false;
            }
        }
        // Not yet sent batches are dropped by the loop (it sees the generation change); only
        // the ones already with the bucketer are waited for.
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        loop {
            let in_flight: u32 =
                revoked.iter().filter_map(|(t, p)| parts.get(t).and_then(|ps| ps.get(p))).map(|p| p.in_flight).sum();
            if in_flight == 0 {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    in_flight, timeout_ms = self.drain_timeout.as_millis() as u64,
                    "revoked Kafka partitions still have batches in flight; releasing them anyway (those may be stored twice across the group)"
                );
                break;
            }
            parts = self.shared.acked.wait_timeout(parts, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(parts);
        let committed = if self.shared.stop_commit_failed.load(Ordering::SeqCst) {
            Ok(0)
        } else if lost {
            let (_, behind) = self.shared.to_commit(Some(&revoked), CommitMode::Sync);
            if !behind.is_empty() {
                tracing::warn!(
                    partitions = behind.len(),
                    "the offsets of revoked Kafka partitions were not committed: the group took them from this member \
                     (librdkafka: assignment lost; its session timed out, as in a broker outage or a stall longer than \
                     the session timeout), so no commit of them is tried: the member given them starts from the \
                     group's last commit, and may store again what this member stored since (about commit_interval_ms \
                     of each)"
                );
            }
            Ok(0)
        } else {
            commit_durable(consumer, &self.shared, CommitMode::Sync, Some(&revoked))
        };
        if let Err((partitions, error)) = committed {
            tracing::warn!(
                partitions, %error, limit_s = COMMIT_LIMIT.as_secs(),
                "the offsets of revoked Kafka partitions were not committed (no group coordinator answered, as in a \
                 broker outage longer than the session timeout, or the group had dropped this member): the member \
                 given them starts from the group's last commit, and may store again what this member stored since \
                 (about commit_interval_ms of each)"
            );
        }
        let mut lag = lock(&self.lag.lag);
        lag.retain(|(t, p), _| !revoked.iter().any(|(rt, rp)| **rt == **t && rp == p));
        if !revoked.is_empty() {
            tracing::info!(partitions = revoked.len(), "Kafka partitions revoked and drained");
        }
    }
}

/// The partition of librdkafka's (2.12) warning that it reset a partition's position after
/// the broker answered "offset out of range", e.g. `[thrd:main]: t [0]: offset reset (at offset
/// 1000 (leader epoch -1), broker 1) to cached BEGINNING offset offset 0 (leader epoch -1):
/// fetch failed due to requested offset not available on the broker: Broker: Offset out of
/// range`. With `auto.offset.reset` at `earliest` or `latest` this line is librdkafka's only
/// report of the reset (no consumer error); topic names cannot hold spaces or brackets.
fn reset_out_of_range<'a>(fac: &str, line: &'a str) -> Option<(&'a str, i32, Option<i64>)> {
    if fac != "OFFSET" || !line.contains("]: offset reset (at ") || !line.ends_with("Offset out of range") {
        return None;
    }
    let line = match line.strip_prefix("[thrd:") {
        Some(rest) => rest.split_once("]: ")?.1,
        None => line,
    };
    let (topic, rest) = line.split_once(" [")?;
    let (partition, _) = rest.split_once("]: ")?;
    let at = rest
        .split_once("(at offset ")
        .and_then(|(_, n)| n.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    Some((topic, partition.parse().ok()?, at))
}

/// What has been read of one partition and not yet sent.
struct Pending {
    batch: IngestBatch,
    next_offset: i64,
    /// The assignment it was read under.
    epoch: u64,
}

/// The consumer thread.
struct Loop {
    cfg: KafkaConfig,
    consumer: BaseConsumer<GroupContext>,
    tx: Option<mpsc::Sender<IngestBatch>>,
    stats: Arc<MqttStats>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    writer_done: watch::Receiver<bool>,
    /// Line protocol: the tags each device last reported. Forgotten at every rebalance, which
    /// drops decoded batches of revoked partitions (and the reports in them).
    tags: crate::lpwire::TagMemory,
}

/// Whether a flush handed the batch over.
enum Flush {
    Sent,
    Full,
    Closed,
}

impl Loop {
    /// Runs until told to stop, then drains, commits and closes; whether the consumer left its
    /// group (its close ended within [`CLOSE_LIMIT`]).
    fn run(mut self) -> bool {
        let mut pending: BTreeMap<(Arc<str>, i32), Pending> = BTreeMap::new();
        let mut pending_readings = 0usize;
        let mut topics: HashMap<String, Arc<str>> = HashMap::new();
        let mut generation = self.shared.generation.load(Ordering::SeqCst);
        let mut paused = false;
        let mut last_commit = Instant::now();
        let mut consumer_errors = QuieterByText::default();

        // Phase 1: intake until told to stop.
        while !*self.stop.borrow() {
            if last_commit.elapsed() >= self.cfg.commit_interval {
                // A failure is logged there; the offsets go again with the next commit.
                let _ = commit_durable(&self.consumer, &self.shared, CommitMode::Async, None);
                last_commit = Instant::now();
            }
            let timeout = if paused {
                Duration::from_millis(10)
            } else if pending.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            let polled = self.consumer.poll(timeout);
            let now_gen = self.shared.generation.load(Ordering::SeqCst);
            if now_gen != generation {
                // A rebalance ran: drop what is held of partitions no longer ours. The new
                // assignment starts unpaused.
                generation = now_gen;
                pending.retain(|(t, p), held| self.shared.assigned_epoch(t, *p) == Some(held.epoch));
                self.tags.clear();
                pending_readings = pending.values().map(|p| p.batch.readings.len()).sum();
                paused = false;
            }
            let flush_now = match polled {
                Some(Ok(msg)) => {
                    let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
                    let epoch = match self.shared.take(topic, partition, offset) {
                        Take::New(epoch) => epoch,
                        Take::Again => {
                            self.stats.redelivered.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Take::NotAssigned => continue,
                    };
                    self.cfg.tag_changes.catch_up(&mut self.tags);
                    let mut batch = match msg.payload() {
                        Some(payload) if !payload.is_empty() => {
                            Self::decode(&self.cfg, &mut self.tags, (topic, partition, offset), msg.key(), payload)
                        }
                        // A tombstone (no value: a deletion in a compacted topic) carries no
                        // reading, and nothing is wrong with it; its offset is taken all the same.
                        // Nor does a zero-byte value, as a zero-byte MQTT message (it was an
                        // `invalid_json` dead letter on a JSON topic: QA53 F2).
                        _ => IngestBatch::default(),
                    };
                    batch.count_as_message();
                    self.stats.messages.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(msg.payload().map_or(0, <[u8]>::len) as u64, Ordering::Relaxed);
                    self.stats.readings.fetch_add(batch.readings.len() as u64, Ordering::Relaxed);
                    self.stats.dead_letters.fetch_add(batch.dead_letters.len() as u64, Ordering::Relaxed);
                    pending_readings += batch.readings.len();
                    let topic: Arc<str> = match topics.get(topic) {
                        Some(t) => t.clone(),
                        None => topics.entry(topic.to_string()).or_insert_with(|| Arc::from(topic)).clone(),
                    };
                    match pending.entry((topic, partition)) {
                        std::collections::btree_map::Entry::Occupied(mut e) if e.get().epoch == epoch => {
                            let p = e.get_mut();
                            p.batch.append(batch);
                            p.next_offset = offset + 1;
                        }
                        std::collections::btree_map::Entry::Occupied(mut e) => {
                            // Held from an earlier assignment of the partition: read again now.
                            pending_readings -= e.get().batch.readings.len();
                            e.insert(Pending { batch, next_offset: offset + 1, epoch });
                        }
                        std::collections::btree_map::Entry::Vacant(e) => {
                            e.insert(Pending { batch, next_offset: offset + 1, epoch });
                        }
                    }
                    pending_readings >= self.cfg.flush_readings
                }
                Some(Err(e)) => {
                    if let Some(repeats) = consumer_errors.admit(&e.to_string(), Instant::now()) {
                        tracing::warn!(error = %e, repeats, "Kafka consumer error");
                    }
                    !pending.is_empty()
                }
                None => !pending.is_empty(),
            };
            if flush_now {
                match self.flush(&mut pending) {
                    Flush::Sent => {
                        pending_readings = 0;
                        if paused {
                            self.set_paused(false);
                            paused = false;
                        }
                    }
                    Flush::Full => {
                        if !paused {
                            self.set_paused(true);
                            paused = true;
                        }
                    }
                    Flush::Closed => {
                        tracing::error!("bucketer channel closed; stopping Kafka intake");
                        break;
                    }
                }
            }
        }

        // Phase 2: no new intake. What was not sent is dropped (not stored, not committed: read
        // again next time); the bucketer drains what it has; then the durable offsets go to the
        // broker and the consumer leaves the group.
        self.set_paused(true);
        drop(pending);
        self.subscribed_off();
        self.tx = None;
        while !*self.writer_done.borrow() {
            // Serves callbacks (the session stays alive); partitions are paused.
            let _ = self.consumer.poll(Duration::from_millis(50));
        }
        // A consumer never given an assignment (its login refused, no broker reached) has no
        // group to leave.
        let joined = self.consumer.context().stats.connects.load(Ordering::Relaxed) > 0;
        match commit_durable(&self.consumer, &self.shared, CommitMode::Sync, None) {
            Ok(0) if joined => {
                tracing::info!("no Kafka offsets to commit (none stored since the last commit); leaving the group")
            }
            Ok(0) => tracing::info!("no Kafka offsets to commit: the consumer never joined its group"),
            Ok(partitions) => tracing::info!(partitions, "Kafka offsets committed; leaving the group"),
            Err((partitions, error)) => {
                self.shared.stop_commit_failed.store(true, Ordering::SeqCst);
                tracing::warn!(
                    partitions, %error, limit_s = COMMIT_LIMIT.as_secs(),
                    "Kafka offsets not committed (no group coordinator answered, or the group had dropped this \
                     member); leaving the group: they are stored here, and this store resumes from them, but a member \
                     of the group given these partitions starts from the group's last commit and may store again what \
                     this member stored since (about commit_interval_ms of each)"
                );
            }
        }
        let redelivered = self.stats.redelivered.load(Ordering::Relaxed);
        // Closing leaves the group. With no group coordinator answering, librdkafka's close
        // waits for one, for a minute and more (seen after the session had timed out during the
        // stop's commit): the stop does not wait past CLOSE_LIMIT, and the process ends with
        // the close left running.
        let consumer = self.consumer;
        let (closed_tx, closed_rx) = std::sync::mpsc::channel();
        let _closer = std::thread::Builder::new().name("kafka-close".into()).spawn(move || {
            drop(consumer);
            let _ = closed_tx.send(());
        });
        // A closer that could not start dropped the consumer here (its close done) and the
        // sender with it.
        let left = !matches!(closed_rx.recv_timeout(CLOSE_LIMIT), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
        if left {
            tracing::info!(redelivered, "Kafka consumer stopped");
        } else {
            tracing::warn!(
                redelivered,
                limit_s = CLOSE_LIMIT.as_secs(),
                "Kafka consumer stopped without leaving its group: its close waits for a group coordinator that does \
                 not answer; the group gives this member's partitions to another after the session timeout"
            );
        }
        left
    }

    fn subscribed_off(&self) {
        let context = self.consumer.context();
        context.stopping.store(true, Ordering::SeqCst);
        context.assigned.store(false, Ordering::SeqCst);
        context.publish_subscribed();
    }

    fn set_paused(&self, pause: bool) {
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        let r = if pause { self.consumer.pause(&assignment) } else { self.consumer.resume(&assignment) };
        if let Err(e) = r {
            tracing::warn!(error = %e, pause, "Kafka pause/resume failed");
        }
    }

    /// Decodes one message (a function of the config and the tag memory only, so that it can
    /// run while the message borrows the consumer).
    fn decode(
        cfg: &KafkaConfig,
        tags: &mut crate::lpwire::TagMemory,
        (topic, partition, offset): (&str, i32, i64),
        key: Option<&[u8]>,
        payload: &[u8],
    ) -> IngestBatch {
        let source = format!("kafka:{topic}/{partition}@{offset}");
        let now = crate::now_ms();
        // A key that is no device name (binary, or another kind of partitioning key) names no
        // device: the readings and lines must name their own.
        let mut batch = match cfg.format {
            KafkaFormat::Json => {
                let table =
                    cfg.topic_tables.get(topic).map(String::as_str).or(cfg.default_table.as_deref()).unwrap_or(topic);
                decode_json(&cfg.wire, &source, table, key, payload, now)
            }
            KafkaFormat::Lp => decode_lp(&cfg.wire, &source, key, payload, now, tags),
        };
        batch.set_source(source);
        batch
    }

    /// Hands everything pending to the bucketer as one batch, if the channel has room.
    fn flush(&self, pending: &mut BTreeMap<(Arc<str>, i32), Pending>) -> Flush {
        let Some(tx) = &self.tx else {
            return Flush::Closed;
        };
        let permit = match tx.try_reserve() {
            Ok(permit) => permit,
            Err(TrySendError::Full(())) => return Flush::Full,
            Err(TrySendError::Closed(())) => return Flush::Closed,
        };
        let mut batch = IngestBatch::default();
        batch.readings.reserve_exact(pending.values().map(|p| p.batch.readings.len()).sum());
        let mut covered = Vec::with_capacity(pending.len());
        for ((topic, partition), p) in std::mem::take(pending) {
            batch.append(p.batch);
            batch.offsets.push(SourceOffset { topic: topic.clone(), partition, next_offset: p.next_offset });
            covered.push((topic, partition, p.next_offset, p.epoch, 0u32));
        }
        {
            let mut parts = lock(&self.shared.parts);
            for (t, p, _, _, restarts) in &mut covered {
                if let Some(part) = parts.get_mut(t).and_then(|ps| ps.get_mut(p)) {
                    part.in_flight += 1;
                    *restarts = part.restarts;
                }
            }
        }
        let shared = self.shared.clone();
        batch.acks.push(Ack::new(move || {
            let mut parts = lock(&shared.parts);
            for (t, p, next, epoch, restarts) in covered {
                if let Some(part) = parts.get_mut(&t).and_then(|ps| ps.get_mut(&p)) {
                    part.in_flight = part.in_flight.saturating_sub(1);
                    // A batch of the log before a start-over says nothing of the new one; nor
                    // one of an earlier assignment (whose start-overs this one does not count):
                    // the assignment's start is the store's, read when it was made.
                    if (part.epoch, part.restarts) == (epoch, restarts) {
                        part.durable = Some(part.durable.map_or(next, |d| d.max(next)));
                    }
                }
            }
            drop(parts);
            shared.acked.notify_all();
        }));
        permit.send(batch);
        Flush::Sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(epoch: u64, start: Option<i64>) -> Part {
        Part {
            assigned: true,
            epoch,
            in_flight: 0,
            durable: start,
            committed: None,
            sent: None,
            taken: start,
            out_of_range: None,
            restarts: 0,
        }
    }

    /// A line naming no device in a message whose key is not UTF-8: its dead letter shows the
    /// key; a text key names the device.
    #[test]
    fn a_line_protocol_dead_letter_shows_a_key_that_names_no_device() {
        let cfg = KafkaConfig {
            format: KafkaFormat::Lp,
            wire: crate::wire::WireConfig {
                lp: crate::lpwire::LpConfig {
                    precision: crate::lineproto::Precision::Milliseconds,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..KafkaConfig::default()
        };
        let payload = b"m,name=a v=1 1000\nm v=2 2000";
        let decode = |key: Option<&[u8]>| {
            let mut tags = crate::lpwire::TagMemory::one_payload();
            let b = Loop::decode(&cfg, &mut tags, ("t", 0, 5), key, payload);
            let devices: Vec<String> = b.readings.iter().map(|r| r.device.to_string()).collect();
            (devices, b.dead_letters.iter().map(|d| d.detail.clone()).collect::<Vec<_>>())
        };
        let none = "line 2: no `name` (lineproto.device_tag) or `device` tag names the device";
        assert_eq!(decode(None), (vec!["a".to_string()], vec![format!("{none}, and no message key does")]));
        assert_eq!(
            decode(Some(b"\x00\x9a")),
            (
                vec!["a".to_string()],
                vec![format!("{none}, and the message key cannot name one (it is not UTF-8: 2 bytes, 0x009a)")]
            )
        );
        assert_eq!(decode(Some(b"k1")), (vec!["a".to_string(), "k1".to_string()], vec![]));
    }

    #[test]
    fn messages_delivered_again_under_one_assignment_are_skipped() {
        let shared = Shared::default();
        lock(&shared.parts)
            .insert(Arc::from("t"), BTreeMap::from([(0, assigned(7, Some(40))), (1, assigned(8, None))]));
        // Below the assignment's start (a resume that fell back on `auto.offset.reset`).
        assert_eq!(shared.take("t", 0, 0), Take::Again);
        assert_eq!(shared.take("t", 0, 39), Take::Again);
        assert_eq!(shared.take("t", 0, 40), Take::New(7));
        assert_eq!(shared.take("t", 0, 40), Take::Again, "the same message again");
        assert_eq!(shared.take("t", 0, 45), Take::New(7), "a gap (compacted or aborted offsets) is fine");
        assert_eq!(shared.take("t", 0, 41), Take::Again);
        assert_eq!(shared.take("t", 0, 46), Take::New(7));
        // Without a start, the first message sets the mark.
        assert_eq!(shared.take("t", 1, 3), Take::New(8));
        assert_eq!(shared.take("t", 1, 2), Take::Again);
        // Not assigned (revoked, or never ours).
        lock(&shared.parts).get_mut("t").and_then(|ps| ps.get_mut(&0)).expect("partition 0 of t").assigned = false;
        assert_eq!(shared.take("t", 0, 47), Take::NotAssigned);
        assert_eq!(shared.take("u", 0, 0), Take::NotAssigned);
    }

    /// An asynchronous commit is sent, not confirmed (librdkafka reports no result of one): the
    /// next asynchronous commit leaves its offsets out, a synchronous one (a release, a stop)
    /// takes them again. Before, the asynchronous commit was taken as done, and a release after
    /// a lost one committed nothing.
    #[test]
    fn offsets_sent_asynchronously_are_committed_again_synchronously() {
        let shared = Shared::default();
        let mut part = assigned(1, Some(0));
        part.committed = Some(0);
        lock(&shared.parts).insert(Arc::from("t"), BTreeMap::from([(0, part), (1, assigned(2, Some(5)))]));
        let listed = |mode| shared.to_commit(None, mode).1.iter().map(|(_, p, o)| (*p, *o)).collect::<Vec<_>>();
        let stored = |offset| {
            lock(&shared.parts).get_mut("t").and_then(|ps| ps.get_mut(&0)).expect("partition 0 of t").durable =
                Some(offset);
        };
        stored(40);
        assert_eq!(listed(CommitMode::Async), vec![(0, 40), (1, 5)]);
        let (_, sent) = shared.to_commit(None, CommitMode::Async);
        shared.mark_committed(&sent, CommitMode::Async);
        assert_eq!(listed(CommitMode::Async), vec![], "sent already");
        assert_eq!(listed(CommitMode::Sync), vec![(0, 40), (1, 5)], "not confirmed");
        // Partition 0 advances: an asynchronous commit sends it alone.
        stored(60);
        assert_eq!(listed(CommitMode::Async), vec![(0, 60)]);
        let (_, confirmed) = shared.to_commit(Some(&[(Arc::from("t"), 0)]), CommitMode::Sync);
        shared.mark_committed(&confirmed, CommitMode::Sync);
        assert_eq!(listed(CommitMode::Sync), vec![(1, 5)]);
        assert_eq!(listed(CommitMode::Async), vec![]);
    }

    /// After librdkafka's "offset out of range" reset, the next message starts the partition
    /// over wherever it is; then redeliveries are skipped again.
    #[test]
    fn a_reset_after_offset_out_of_range_starts_the_partition_over() {
        let shared = Shared::default();
        let mut part = assigned(3, Some(990));
        part.committed = Some(990);
        lock(&shared.parts).insert(Arc::from("t"), BTreeMap::from([(0, part), (1, assigned(4, Some(9)))]));
        // As librdkafka 2.12.1 logs it (the mock cluster's test).
        let line = "[thrd:main]: t [0]: offset reset (at offset 1000 (leader epoch -1), broker 1) to cached \
                    BEGINNING offset offset 0 (leader epoch -1): fetch failed due to requested offset not available \
                    on the broker: Broker: Offset out of range";
        assert_eq!(reset_out_of_range("OFFSET", line), Some(("t", 0, Some(1000))));
        assert_eq!(reset_out_of_range("FETCH", line), None);
        assert_eq!(
            reset_out_of_range("OFFSET", "[thrd:main]: t [0]: offset reset (at offset 7) to END: Broker: Not leader"),
            None
        );
        let dotted = "site.a-1 [12]: offset reset (at offset 5, broker 2) to cached BEGINNING offset 0: fetch failed \
                      due to requested offset not available on the broker: Broker: Offset out of range";
        assert_eq!(reset_out_of_range("OFFSET", dotted), Some(("site.a-1", 12, Some(5))));

        shared.note_out_of_range("t", 0, Some(1000));
        // A message of the old log librdkafka had queued before the reset (between the mark and
        // the refused position): taken, the note kept.
        assert_eq!(shared.take("t", 0, 995), Take::New(3));
        assert_eq!(lock(&shared.parts)["t"][&0].out_of_range, Some(1000));
        // The new log's first message starts the partition over.
        assert_eq!(shared.take("t", 0, 0), Take::New(3));
        let p0 = lock(&shared.parts)["t"][&0];
        assert_eq!(
            (p0.durable, p0.committed, p0.taken, p0.out_of_range, p0.restarts),
            (Some(0), None, Some(1), None, 1)
        );
        assert_eq!(shared.take("t", 0, 0), Take::Again, "then the same message again is skipped");
        assert_eq!(shared.take("t", 0, 1), Take::New(3));
        // A reset past the refused position (the stored offset below the log's start) needs no
        // start-over, and ends the note: a redelivery below the mark is skipped again.
        shared.note_out_of_range("t", 1, Some(9));
        assert_eq!(shared.take("t", 1, 50), Take::New(4));
        assert_eq!(shared.take("t", 1, 9), Take::Again);
        assert_eq!(lock(&shared.parts)["t"][&1].restarts, 0);
        // Of a partition not assigned here, the note is nothing.
        shared.note_out_of_range("u", 0, None);
        assert_eq!(shared.take("u", 0, 0), Take::NotAssigned);
    }
}
