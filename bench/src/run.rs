//! Open-loop runs: a workload ([`Source`]) sent through a driver ([`Target`]) at a set rate or
//! as fast as possible, with the measurements of a [`RunReport`].
//!
//! # Open loop
//!
//! At a set rate, batch *i* has an intended send time, `start + points before it / rate`,
//! fixed before the run whatever the system does. Every latency is measured from that
//! intended time, so a stalled system cannot hide its tail: the batches it delayed count their
//! wait (no coordinated omission). As fast as possible (no rate), a batch's intended time is
//! the moment it is dispatched, and the run measures throughput.
//!
//! # Drivers
//!
//! - [`Target::InProcess`]: `bucketer::Store::write`, one WriteBatch a batch: the storage write
//!   path's ceiling. The readings are built a few batches ahead on the harness's own thread.
//! - [`Target::Mqtt`]: `connections` MQTT clients; each batch is cut into gateway messages of
//!   `per_message` points of one table (`{topic_prefix}/{table}`, a JSON array), spread round
//!   robin over the connections, QoS 0 or 1.
//! - [`Target::Kafka`]: one producer (librdkafka, acks from all in-sync replicas); the same
//!   cut into messages of `per_message` points of one table, as JSON arrays (a topic per
//!   table) or as InfluxDB line protocol (one topic, the measurement naming the table, the
//!   truck's tags on every line: what the peers are sent), spread over the partitions by
//!   device. A message counts as sent at its delivery report, as an MQTT one at its PUBACK.
//!
//! # Measurements
//!
//! - Throughput over time: points sent and stored per second (`committed`, the caller's
//!   counter of stored points).
//! - End-to-end latency, sampled: about every `e2e_sample_ms`, one in-order `readings` point
//!   of the batch being sent is watched; a poller asks the HTTP `latest` endpoint for the
//!   watched devices and records intended send time → first answer showing the point (or a
//!   newer one); it asks every 5 ms, or every 1/40 of the oldest watched point's age when that
//!   is longer (at most 50 ms), so a latency is measured to within 2.5% or 5 ms.
//! - Query latency under load: open-loop at `query_rate` a second, a rotation of `latest` (10
//!   devices), raw readings (one device, one hour) and hour roll-ups (one device).
//! - Peak RSS: `VmHWM` of `/proc/self/status` (the pipeline runs in this process).
//! - CPU by thread name ([`crate::cpu`]): this process's threads from the call of [`run`] to the
//!   last point stored; an external broker (mosquitto, a Kafka broker) is another process and
//!   not counted. For a [`Target::Preloaded`] run the wall time counts from `since`, so what the
//!   pipeline spent between `since` and the call is in the time but not in the CPU. The
//!   harness's own threads are named `bench-*` (the MQTT publishers run on a runtime of their
//!   own), so the report gives the CPU a point of the pipeline apart from the harness's
//!   ([`crate::cpu::PerPoint`]).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::BufReader;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

use crate::record::RecordReader;
use crate::report::{latency_histogram, LatencySummary, QueryLatencies, RunReport, Second};
use crate::workload::{point_state, FieldNames, Generator, Point, PointState, TableKind, WorkloadSpec};
use crate::{Error, Result};

/// Where the points come from.
#[derive(Debug)]
pub enum Source {
    /// Generated on the fly.
    Generate(Generator),
    /// Read from a recording, frame by frame.
    Replay(RecordReader<BufReader<File>>),
    /// Already sent (a [`Target::Preloaded`] run): no batch left.
    Spent(WorkloadSpec),
}

impl Source {
    /// The workload's spec.
    pub fn spec(&self) -> &WorkloadSpec {
        match self {
            Source::Generate(g) => g.spec(),
            Source::Replay(r) => r.spec(),
            Source::Spent(spec) => spec,
        }
    }

    /// The points the source is expected to yield, a progress bar's total: a recording's own
    /// count where its end marker gives it, else the spec's expectation
    /// ([`WorkloadSpec::expected_points`]).
    pub fn expected_points(&self) -> u64 {
        match self {
            Source::Replay(r) => r.recorded_points().unwrap_or_else(|| r.spec().expected_points()),
            _ => self.spec().expected_points(),
        }
    }

    /// The next batch (a recording's next frame; at most `max` generated points).
    pub fn next(&mut self, max: usize, out: &mut Vec<Point>) -> Result<bool> {
        match self {
            Source::Generate(g) => Ok(g.next_batch(max, out)),
            Source::Replay(r) => r.next_frame(out),
            Source::Spent(_) => Ok(false),
        }
    }
}

/// An MQTT broker to publish to.
#[derive(Debug, Clone)]
pub struct MqttTarget {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Topic prefix; messages go to `{topic_prefix}/{table}`.
    pub topic_prefix: String,
    /// Publishing connections.
    pub connections: usize,
    /// Points per message.
    pub per_message: usize,
    /// QoS 0 or 1.
    pub qos: u8,
    /// The largest message the pipeline takes (`mqtt.max_payload_bytes`: a larger one is a dead
    /// letter, its points lost to the run): a larger one fails the run before it is sent.
    pub max_payload_bytes: usize,
}

/// How a message's points are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// A JSON array of readings naming their devices (a gateway message).
    Json,
    /// InfluxDB line protocol, ms timestamps: measurement = the table, tags = the truck's.
    LineProtocol,
}

/// Kafka topics to produce to (they must exist: see [`create_kafka_topics`]).
#[derive(Debug, Clone)]
pub struct KafkaTarget {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic of each table (readings, diagnostics); the same one twice for line protocol.
    pub topics: [String; 2],
    /// Partitions of each topic.
    pub partitions: i32,
    /// Points per message.
    pub per_message: usize,
    /// How messages are written.
    pub format: PayloadFormat,
    /// The largest message the pipeline takes, as [`MqttTarget::max_payload_bytes`].
    pub max_payload_bytes: usize,
    /// librdkafka settings of the brokers' TLS and login (`security.protocol`, `ssl.*`,
    /// `sasl.*`) for the producer; empty: plain TCP.
    pub client: Vec<(String, String)>,
}

/// Where the points go.
#[derive(Debug, Clone)]
pub enum Target {
    /// Straight into the store, one WriteBatch a batch.
    InProcess(Arc<bucketer::Store>),
    /// Through an MQTT broker.
    Mqtt(MqttTarget),
    /// Through a Kafka broker.
    Kafka(KafkaTarget),
    /// Already in a Kafka broker (produced by [`produce_kafka`] before the pipeline started):
    /// the run only measures the pipeline draining the backlog. The pipeline may have stored
    /// some before the run starts: the run counts every point the caller's `committed` counter
    /// holds (it must start at 0 with the pipeline) and its time from `since` (when the
    /// pipeline started consuming).
    Preloaded {
        /// Points produced.
        points: u64,
        /// Field values in them.
        values: u64,
        /// When the pipeline started consuming.
        since: Instant,
        /// An interrupt stopped the producing before the whole workload was produced.
        cut: bool,
    },
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Points a second; `None`: as fast as possible.
    pub rate: Option<f64>,
    /// Points a batch (generated workloads; a recording keeps its frames).
    pub batch_points: usize,
    /// One end-to-end sample about every this many ms of sending; 0: none.
    pub e2e_sample_ms: u64,
    /// The query service, for end-to-end samples and queries under load.
    pub http: Option<SocketAddr>,
    /// Queries a second during the run; 0: none.
    pub query_rate: f64,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Longest wait for everything sent to be stored, after the last send.
    pub drain_timeout: Duration,
    /// After the last send, give up once the stored count has not moved for this long: the
    /// system under test lost points or is stuck (an embedded rumqttd whose consumer fell
    /// more than its commit log behind skips messages it has acked). The Kafka driver gives up
    /// too once no delivery report came for this long while messages wait.
    pub stall_timeout: Duration,
    /// MQTT driver: at most this many points handed to the broker and not yet stored; the
    /// driver waits for the store before sending more. A broker acks a QoS 1 message on
    /// receipt and drops the oldest unread once its backlog is full (the embedded rumqttd past
    /// `mqtt.broker_backlog_mb`, mosquitto past `max_queued_messages`), so a replay as fast as
    /// possible would otherwise outrun the store and lose points. `None`: no limit.
    pub max_backlog: Option<u64>,
    /// Once set (by an interrupt), the driver sends nothing more; the run then waits for what
    /// it sent to be stored and reports it as [`RunReport::interrupted`].
    pub stop: Arc<AtomicBool>,
}

impl RunSpec {
    /// Whether [`RunSpec::stop`] is set.
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The source's next batch, or none once the run is stopped (then noting in `cut` whether
    /// the source had more).
    fn next_batch(&self, source: &mut Source, out: &mut Vec<Point>, cut: &AtomicBool) -> Result<bool> {
        if self.stopped() {
            if source.next(1, out)? {
                cut.store(true, Ordering::Relaxed);
            }
            out.clear();
            return Ok(false);
        }
        source.next(self.batch_points, out)
    }
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            rate: None,
            batch_points: 10_000,
            e2e_sample_ms: 100,
            http: None,
            query_rate: 20.0,
            progress: false,
            drain_timeout: Duration::from_secs(600),
            stall_timeout: Duration::from_secs(60),
            max_backlog: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Watches a count for a stop: [`Stall::stalled`] says whether it has kept one value for
/// longer than `limit`.
struct Stall {
    last: Option<u64>,
    since: Instant,
    limit: Duration,
}

impl Stall {
    fn new(limit: Duration) -> Stall {
        Stall { last: None, since: Instant::now(), limit }
    }

    /// Takes the count's value now: `true` once it has not moved for longer than `limit`.
    fn stalled(&mut self, count: u64) -> bool {
        if self.last != Some(count) {
            (self.last, self.since) = (Some(count), Instant::now());
            return false;
        }
        self.since.elapsed() > self.limit
    }
}

/// How far a driver may run ahead of the store: `cap` points handed over and not stored,
/// counting stored points from `base`; a store that stores nothing for `stall` is stuck.
#[derive(Clone)]
pub struct BacklogLimit {
    cap: u64,
    stored: Arc<dyn Fn() -> u64 + Send + Sync>,
    base: u64,
    stall: Duration,
}

impl std::fmt::Debug for BacklogLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BacklogLimit")
            .field("cap", &self.cap)
            .field("base", &self.base)
            .field("stall", &self.stall)
            .finish()
    }
}

impl BacklogLimit {
    /// At most `cap` points handed over and not stored, the points stored counted by `stored`
    /// from its value now; a store that stores nothing for `stall` is stuck.
    pub fn new(cap: u64, stored: Arc<dyn Fn() -> u64 + Send + Sync>, stall: Duration) -> BacklogLimit {
        let base = stored();
        BacklogLimit { cap, stored, base, stall }
    }

    /// Waits until at most `cap` of the `handed` points are not stored yet; an error once the
    /// stored count has not moved for `stall`.
    pub async fn wait_for_room(&self, handed: u64) -> Result<()> {
        let mut stall = Stall::new(self.stall);
        loop {
            let stored = (self.stored)().saturating_sub(self.base);
            if handed.saturating_sub(stored) <= self.cap {
                return Ok(());
            }
            if stall.stalled(stored) {
                return Err(Error::Stuck(format!(
                    "{} of {handed} points sent are not stored, and none was stored for {:?}: the system under \
                     test stopped storing",
                    handed - stored,
                    self.stall
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Locks a mutex, taking over a poisoned one (a panicked sampler leaves plain numbers).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn micros_since(t: Instant) -> u64 {
    t.elapsed().as_micros().max(1) as u64
}

/// Resident and peak resident memory of this process, bytes (0 where /proc is absent).
pub fn rss_bytes() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A watched point: visible once `latest` of `device` has a timestamp ≥ `ts`.
#[derive(Debug, Clone, Copy)]
struct Watch {
    device: u64,
    ts: i64,
    /// The workload tick of the point: 0 is each device's first point.
    tick: u64,
    intended: Instant,
}

/// State shared by the dispatcher, the drivers and the samplers.
#[derive(Debug)]
struct Shared {
    sent: AtomicU64,
    /// Field values dispatched.
    values: AtomicU64,
    /// Points dispatched, whose values `values` counts. `sent` counts a point once the broker
    /// has it (a PUBACK, a delivery report), so a run cut short dispatched more than it sent.
    dispatched: AtomicU64,
    sending_done: AtomicBool,
    /// An interrupt stopped the sending with points of the workload not sent.
    cut: AtomicBool,
    /// When the run's time ended (everything sent stored, or the run failed): the per-second
    /// series ends there, not when the helpers stop.
    ended_at: Mutex<Option<Instant>>,
    stop: AtomicBool,
    send_hist: Mutex<Histogram<u64>>,
    /// The intended time of the last batch (by intended time) handed over, and how late, µs.
    last_send: Mutex<Option<(Instant, u64)>>,
    e2e_hist: Mutex<Histogram<u64>>,
    /// The same, of the points after each device's first (ticks 1 on).
    e2e_known_hist: Mutex<Histogram<u64>>,
    /// End-to-end latencies of the current second (for the series).
    e2e_second: Mutex<Histogram<u64>>,
    watches: Mutex<Vec<Watch>>,
    /// The harness's threads' CPU, added as each ends.
    ended: Arc<crate::cpu::Ended>,
}

impl Shared {
    fn new() -> Result<Arc<Shared>> {
        Ok(Arc::new(Shared {
            sent: AtomicU64::new(0),
            values: AtomicU64::new(0),
            dispatched: AtomicU64::new(0),
            sending_done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            ended_at: Mutex::new(None),
            stop: AtomicBool::new(false),
            send_hist: Mutex::new(latency_histogram()?),
            last_send: Mutex::new(None),
            e2e_hist: Mutex::new(latency_histogram()?),
            e2e_known_hist: Mutex::new(latency_histogram()?),
            e2e_second: Mutex::new(latency_histogram()?),
            watches: Mutex::new(Vec::new()),
            ended: Arc::default(),
        }))
    }

    /// Counts `points` dispatched, and their field values.
    fn count_dispatched(&self, points: &[Point]) {
        self.values.fetch_add(points.iter().map(|p| p.values().len() as u64).sum::<u64>(), Ordering::Relaxed);
        self.dispatched.fetch_add(points.len() as u64, Ordering::Relaxed);
    }

    fn record_send(&self, intended: Instant) {
        let late = micros_since(intended);
        let _ = lock(&self.send_hist).record(late);
        let mut last = lock(&self.last_send);
        if last.is_none_or(|(at, _)| intended >= at) {
            *last = Some((intended, late));
        }
    }
}

/// Where the run stood at the end of a window of the per-second series.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// Seconds since the run started.
    t: f64,
    sent: u64,
    stored: u64,
}

/// The per-second series being built: a window ends each second, the last one with the run.
struct Series {
    seconds: Vec<Second>,
    /// The end of the last window (the run's start before the first).
    last: Mark,
    /// The end of the window before it, and the last window's end-to-end latencies: a sliver of
    /// a window at the run's end is folded into the last one.
    before_last: Mark,
    last_e2e: Histogram<u64>,
}

impl Series {
    fn new(sent_at_start: u64, stored_at_start: u64) -> Result<Series> {
        let start = Mark { t: 0.0, sent: sent_at_start, stored: stored_at_start };
        Ok(Series { seconds: Vec::new(), last: start, before_last: start, last_e2e: latency_histogram()? })
    }

    /// Ends a window at `at`, with the end-to-end latencies `e2e` measured in it (taken:
    /// `e2e` is left empty). The run's `last` window, when it is a sliver (under half a
    /// second), is folded into the window before it rather than given a rate of its own: its
    /// rate would be of the one or two commits it happened to hold (a 0.1 s window of a
    /// 100,000-point commit reads 1M points/s), and leaving it out would leave its points out
    /// of the series. So the series' windows add up to every point of the run.
    fn close_window(&mut self, at: Mark, e2e: &mut Histogram<u64>, last: bool, rss_bytes: u64) {
        let mut from = self.last;
        if last && at.t - from.t < 0.5 && !self.seconds.is_empty() {
            self.seconds.pop();
            let _ = e2e.add(&self.last_e2e);
            from = self.before_last;
        }
        let summary = LatencySummary::of(e2e);
        let measured = |ms: f64| (summary.count > 0).then_some(ms);
        let dt = (at.t - from.t).max(1e-3);
        self.seconds.push(Second {
            t_s: at.t,
            sent_per_s: at.sent.saturating_sub(from.sent) as f64 / dt,
            stored_per_s: at.stored.saturating_sub(from.stored) as f64 / dt,
            e2e_p99_ms: measured(summary.p99_ms),
            e2e_max_ms: measured(summary.max_ms),
            rss_bytes,
        });
        std::mem::swap(&mut self.last_e2e, e2e);
        e2e.reset();
        (self.before_last, self.last) = (from, at);
    }
}

/// The slowest rate of points or queries a run takes, a second (one every 17 minutes): the
/// schedule of a rate near 0 outgrows what a `Duration` holds (`--rate 1e-300` panicked).
pub const MIN_RATE: f64 = 1e-3;

/// Runs `source` into `target` as `spec` says; `committed` counts the points the system under
/// test has stored (from any start value). Returns once everything sent is stored, or, once the
/// stored count stopped moving ([`Error::Stuck`]), with the report of the run until then and
/// [`RunReport::failed`] saying why.
pub async fn run(
    mut source: Source,
    target: Target,
    spec: RunSpec,
    committed: Arc<dyn Fn() -> u64 + Send + Sync>,
) -> Result<RunReport> {
    if let Some(rate) = spec.rate {
        if !(rate.is_finite() && rate >= MIN_RATE) {
            return Err(Error::Spec(format!("rate {rate}: must be at least {MIN_RATE} points a second")));
        }
    }
    if spec.query_rate != 0.0 && !(spec.query_rate.is_finite() && spec.query_rate >= MIN_RATE) {
        return Err(Error::Spec(format!(
            "query rate {}: must be 0 (none) or at least {MIN_RATE} queries a second",
            spec.query_rate
        )));
    }
    if let Target::Mqtt(m) = &target {
        if m.qos > 1 {
            return Err(Error::Spec(format!("QoS {}: use 0 or 1", m.qos)));
        }
        if m.connections == 0 || m.per_message == 0 {
            return Err(Error::Spec("connections and points per message must be at least 1".into()));
        }
    }
    if let Target::Kafka(k) = &target {
        if k.partitions < 1 || k.per_message == 0 {
            return Err(Error::Spec("partitions and points per message must be at least 1".into()));
        }
    }
    let wspec = source.spec().clone();
    let expected = source.expected_points();
    let shared = Shared::new()?;
    let cpu_start = crate::cpu::Start::now();
    let (committed_at_start, started) = match &target {
        Target::Preloaded { since, .. } => (0, *since),
        _ => (committed(), Instant::now()),
    };

    // Per-second series.
    // A preloaded run sent everything before it started: none of it in its series.
    let sent_at_start = match &target {
        Target::Preloaded { points, .. } => *points,
        _ => 0,
    };
    let seconds = Arc::new(Mutex::new(Series::new(sent_at_start, committed_at_start)?));
    let sampler = {
        let (shared, seconds, committed) = (shared.clone(), seconds.clone(), committed.clone());
        harness_thread("bench-sampler", shared.ended.clone(), move || {
            let mut tick = 1u64;
            let ended = || *lock(&shared.ended_at);
            while !shared.stop.load(Ordering::Relaxed) {
                let due = started + Duration::from_secs(tick);
                while Instant::now() < due && !shared.stop.load(Ordering::Relaxed) && ended().is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let (sent, stored) = (shared.sent.load(Ordering::Relaxed), committed());
                let end = ended();
                let t = end.unwrap_or_else(Instant::now).duration_since(started).as_secs_f64();
                let mut e2e = lock(&shared.e2e_second);
                lock(&seconds).close_window(Mark { t, sent, stored }, &mut e2e, end.is_some(), rss_bytes().0);
                drop(e2e);
                tick += 1;
                if end.is_some() {
                    break;
                }
            }
        })?
    };
    let e2e_poller = spec
        .http
        .filter(|_| spec.e2e_sample_ms > 0)
        .map(|http| {
            let shared = shared.clone();
            let table = wspec.table_name(TableKind::Readings);
            harness_thread("bench-e2e", shared.ended.clone(), move || poll_latest(http, &table, &shared))
        })
        .transpose();
    let query_load = spec
        .http
        .filter(|_| spec.query_rate > 0.0)
        .map(|http| {
            let (shared, wspec, rate) = (shared.clone(), wspec.clone(), spec.query_rate);
            harness_thread("bench-queries", shared.ended.clone(), move || query_load(http, &wspec, rate, &shared))
        })
        .transpose();
    let (e2e_poller, query_load) = match (e2e_poller, query_load) {
        (Ok(e), Ok(q)) => (e, q),
        (e, q) => {
            // What did start ends on the stop flag.
            shared.stop.store(true, Ordering::Relaxed);
            let _ = sampler.join();
            let e = e.err().or(q.err());
            return Err(e.unwrap_or_else(|| Error::Driver("a thread of the harness did not start".into())));
        }
    };
    let bar = progress_bar(spec.progress, expected, spec.rate);

    let dispatched = match target {
        Target::InProcess(store) => {
            // The readings are built on the harness's thread, a few batches ahead, and stored
            // on a thread of the pipeline's runtime.
            let (tx, rx) = std::sync::mpsc::sync_channel(IN_PROCESS_AHEAD);
            let (spec2, wspec2, shared2) = (spec.clone(), wspec.clone(), shared.clone());
            match harness_thread("bench-load", shared.ended.clone(), move || {
                build_in_process(&mut source, &spec2, &wspec2, &shared2.cut, &tx)
            }) {
                Ok(builder) => {
                    let (shared, spec2, wspec2, bar2) = (shared.clone(), spec.clone(), wspec.clone(), bar.clone());
                    let stored = tokio::task::spawn_blocking(move || {
                        store_in_process(&rx, &store, &spec2, &wspec2, &shared, &bar2)
                    })
                    .await
                    .map_err(|e| Error::Driver(e.to_string()))
                    .and_then(|r| r);
                    // The store's side has dropped its receiver: the builder stops at its next send.
                    let built = join_harness_thread(Ok(builder)).await;
                    stored.and(built)
                }
                Err(e) => Err(e),
            }
        }
        Target::Mqtt(m) => {
            let limit = spec.max_backlog.map(|cap| BacklogLimit {
                cap,
                stored: committed.clone(),
                base: committed_at_start,
                stall: spec.stall_timeout,
            });
            // The publishers get a runtime of their own, so their CPU is told from the
            // pipeline's (the consumers and the query service run on the caller's).
            match load_runtime(&shared.ended) {
                Ok(load) => {
                    let (shared, spec2, wspec2, bar2) = (shared.clone(), spec.clone(), wspec.clone(), bar.clone());
                    let sent = load
                        .spawn(async move { dispatch_mqtt(source, m, &spec2, limit, &wspec2, &shared, &bar2).await })
                        .await
                        .map_err(|e| Error::Driver(e.to_string()))
                        .and_then(|r| r);
                    // Its threads have stopped, and counted their CPU, once this returns.
                    let _ = tokio::task::spawn_blocking(move || load.shutdown_timeout(Duration::from_secs(10))).await;
                    sent
                }
                Err(e) => Err(e),
            }
        }
        Target::Kafka(k) => {
            let (shared, spec2, wspec2, bar2) = (shared.clone(), spec.clone(), wspec.clone(), bar.clone());
            join_harness_thread(harness_thread("bench-load", shared.ended.clone(), move || {
                dispatch_kafka(&mut source, &k, &spec2, &wspec2, &shared, &bar2)
            }))
            .await
        }
        Target::Preloaded { points, values, cut, .. } => {
            shared.cut.store(cut, Ordering::Relaxed);
            shared.sent.store(points, Ordering::Relaxed);
            shared.values.store(values, Ordering::Relaxed);
            shared.dispatched.store(points, Ordering::Relaxed);
            Ok(())
        }
    };
    shared.sending_done.store(true, Ordering::Relaxed);
    let interrupted = shared.cut.load(Ordering::Relaxed);
    let sent_before = || shared.sent.load(Ordering::Relaxed);
    // A driver held up by a store that stopped storing (its backlog limit) did not fail.
    let driver_failed = matches!(&dispatched, Err(e) if !matches!(e, Error::Stuck(_)));
    let drained = match dispatched {
        Ok(()) => drain(sent_before(), &*committed, committed_at_start, &spec).await,
        // A driver that failed once points were sent (a broker gone, a damaged frame further
        // on): what was sent is still waited for, and the run is reported until then, failed.
        Err(e) if sent_before() > 0 => match drain(sent_before(), &*committed, committed_at_start, &spec).await {
            Ok(()) => Err(e),
            Err(Error::Stuck(stuck)) => Err(Error::Driver(format!("{}; then {stuck}", driver_cause(&e)))),
            Err(other) => Err(other),
        },
        Err(e) => Err(e),
    };
    let ended_at = Instant::now();
    *lock(&shared.ended_at) = Some(ended_at);
    let wall = ended_at.duration_since(started).as_secs_f64();
    let cpu = cpu_start.since(shared.ended.seconds());
    bar.finish_and_clear();
    // Let the e2e poller see the last watches (bounded), then stop every helper thread.
    let until = Instant::now() + Duration::from_secs(5);
    while !lock(&shared.watches).is_empty() && Instant::now() < until && drained.is_ok() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    if let Some(p) = e2e_poller {
        let _ = p.join();
    }
    let queries = match query_load {
        Some(q) => q.join().unwrap_or_default(),
        None => QueryLatencies::default(),
    };
    // Every harness thread has ended and counted itself.
    let cpu = shared.ended.replace_harness(cpu);
    // A system that stopped storing gets the report of the run until then, failed.
    let failed = match drained {
        Ok(()) => None,
        Err(e @ Error::Stuck(_)) => Some(e.to_string()),
        Err(e) if sent_before() > 0 => Some(e.to_string()),
        Err(e) => return Err(e),
    };
    let failed_by_driver = failed.is_some() && driver_failed;
    let sent = shared.sent.load(Ordering::Relaxed);
    let stored = committed().saturating_sub(committed_at_start);
    let (values, values_per_point) =
        values_sent(shared.values.load(Ordering::Relaxed), shared.dispatched.load(Ordering::Relaxed), sent);
    let seconds = std::mem::take(&mut lock(&seconds).seconds);
    // A failed run's rates are over the time it stored: the stall limit it waited out after
    // its last stored point (60 s) is no storing, and made a store that ran at 350,000 points
    // a second look like one at 156,000.
    let storing = if failed.is_some() {
        seconds.iter().rev().find(|s| s.stored_per_s > 0.0).map_or(wall, |s| s.t_s.min(wall))
    } else {
        wall
    };
    let send_behind = lock(&shared.last_send).map(|(_, us)| us as f64 / 1e6);
    let send_latency = LatencySummary::of(&lock(&shared.send_hist));
    let report = RunReport {
        setup: serde_json::json!({}),
        points: sent,
        values,
        sent,
        stored,
        wall_seconds: wall,
        points_per_second: stored as f64 / storing.max(1e-9),
        values_per_second: values_per_point * stored as f64 / storing.max(1e-9),
        e2e_latency: LatencySummary::of(&lock(&shared.e2e_hist)),
        e2e_latency_known: LatencySummary::of(&lock(&shared.e2e_known_hist)),
        queries,
        peak_rss_bytes: rss_bytes().1,
        bytes_per_value: None,
        stored_values: None,
        expected_values: None,
        compaction: None,
        seconds,
        cpu_per_point: crate::cpu::PerPoint::of(&cpu, stored),
        cpu,
        interrupted,
        interrupted_after_sending: false,
        rate_held: spec
            .rate
            .filter(|_| !interrupted && failed.is_none() && sent > 0)
            .map(|rate| crate::report::rate_held(rate, sent, send_behind.unwrap_or(0.0), send_latency.p99_ms / 1e3)),
        send_latency,
        failed,
        failed_by_driver,
        send_behind_seconds: send_behind,
    };
    Ok(report)
}

/// A driver's error without the `driver: ` of its kind.
fn driver_cause(e: &Error) -> String {
    match e {
        Error::Driver(cause) => cause.clone(),
        other => other.to_string(),
    }
}

/// Waits until `sent` points are stored (`committed` past `at_start`), at most the spec's
/// drain timeout, or until the stored count stops moving for its stall timeout: then
/// [`Error::Stuck`].
async fn drain(sent: u64, committed: &(dyn Fn() -> u64 + Send + Sync), at_start: u64, spec: &RunSpec) -> Result<()> {
    let deadline = Instant::now() + spec.drain_timeout;
    let mut stall = Stall::new(spec.stall_timeout);
    loop {
        let now_committed = committed();
        if now_committed.saturating_sub(at_start) >= sent {
            return Ok(());
        }
        if stall.stalled(now_committed) {
            return Err(Error::Stuck(format!(
                "stored count stuck at {} of {sent} points for {:?}: the system under test lost or stalled on the rest",
                now_committed.saturating_sub(at_start),
                spec.stall_timeout
            )));
        }
        if Instant::now() > deadline {
            return Err(Error::Stuck(format!(
                "{} of {sent} points stored after waiting {:?}",
                committed().saturating_sub(at_start),
                spec.drain_timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn progress_bar(show: bool, total: u64, rate: Option<f64>) -> indicatif::ProgressBar {
    if show {
        crate::progress::bar(total, rate)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// Points sent at one intended time: at a set rate, about 10 ms worth (so the schedule is
/// smooth whatever the source's batch size); as fast as possible, the whole batch.
fn sub_batch(rate: Option<f64>, len: usize) -> usize {
    match rate {
        Some(r) => ((r / 100.0).ceil() as usize).clamp(1, len.max(1)),
        None => len.max(1),
    }
}

/// The intended send time of a batch that starts after `points_before` points.
fn intended_time(start: Instant, rate: Option<f64>, points_before: u64) -> Option<Instant> {
    rate.map(|r| start + Duration::from_secs_f64(points_before as f64 / r))
}

/// A message above `max` bytes, which the pipeline would take as a dead letter (its points lost
/// to the run, which would then wait for them in vain), fails the run before it is sent.
fn within_payload_limit(bytes: usize, points: u64, max: usize) -> Result<()> {
    if bytes <= max {
        return Ok(());
    }
    Err(Error::Spec(format!(
        "a message of {points} points is {bytes} bytes, above the {max} the pipeline takes (mqtt.max_payload_bytes): \
         lower --per-message"
    )))
}

/// The longest sleep between two looks at [`RunSpec::stop`] while a batch waits for its
/// intended time: at a low rate the next batch can be minutes away, and an interrupt ends the
/// wait instead of sending it.
const STOP_LOOK: Duration = Duration::from_millis(50);

/// One look at a wait for the intended time `at` (`None`: as fast as possible): `Ok` the time
/// to measure from once it is due, `Err(None)` when the run was stopped (nothing more is to be
/// sent), else `Err` how long to sleep before the next look.
fn wait_step(at: Option<Instant>, spec: &RunSpec) -> std::result::Result<Instant, Option<Duration>> {
    let Some(at) = at else {
        return Ok(Instant::now());
    };
    if spec.stopped() {
        return Err(None);
    }
    match at.saturating_duration_since(Instant::now()) {
        left if left.is_zero() => Ok(at),
        left => Err(Some(left.min(STOP_LOOK))),
    }
}

/// Waits (sleeping) until `at`; returns the intended time to measure from, or `None` when the
/// run was stopped meanwhile.
fn wait_blocking(at: Option<Instant>, spec: &RunSpec) -> Option<Instant> {
    loop {
        match wait_step(at, spec) {
            Ok(intended) => return Some(intended),
            Err(None) => return None,
            Err(Some(sleep)) => std::thread::sleep(sleep),
        }
    }
}

/// [`wait_blocking`] on the runtime.
async fn wait_async(at: Option<Instant>, spec: &RunSpec) -> Option<Instant> {
    loop {
        match wait_step(at, spec) {
            Ok(intended) => return Some(intended),
            Err(None) => return None,
            Err(Some(sleep)) => tokio::time::sleep(sleep).await,
        }
    }
}

/// Watches the batch's last in-order `readings` point if a sample is due.
fn maybe_watch(
    points: &[Point],
    wspec: &WorkloadSpec,
    shared: &Shared,
    intended: Instant,
    last: &mut Option<Instant>,
    every_ms: u64,
) {
    if every_ms == 0 || last.is_some_and(|l| intended < l + Duration::from_millis(every_ms)) {
        return;
    }
    let found = points
        .iter()
        .rev()
        .find(|p| p.kind == TableKind::Readings && point_state(wspec, p.kind, p.device, p.tick) == PointState::InOrder);
    if let Some(p) = found {
        lock(&shared.watches).push(Watch { device: p.device, ts: wspec.tick_ts(p.tick), tick: p.tick, intended });
        *last = Some(intended);
    }
}

/// Batches the in-process driver's builder may be ahead of the store.
const IN_PROCESS_AHEAD: usize = 2;

/// One batch of the source, with the store's readings of each of its sub-batches.
struct BuiltBatch {
    points: Vec<Point>,
    /// Per sub-batch ([`sub_batch`]), in order: its end in `points` and its readings.
    chunks: Vec<(usize, Vec<model::DeviceReading>)>,
}

/// The in-process driver's harness side: the source's batches, with the readings the store is
/// given, built ahead into `out`. Returns once the source ends, the run is stopped or the store's
/// side has gone.
fn build_in_process(
    source: &mut Source,
    spec: &RunSpec,
    wspec: &WorkloadSpec,
    cut: &AtomicBool,
    out: &std::sync::mpsc::SyncSender<BuiltBatch>,
) -> Result<()> {
    let names = FieldNames::default();
    let tables =
        [wspec.table_name(TableKind::Readings), wspec.table_name(TableKind::Diagnostics)].map(Arc::<str>::from);
    let mut devices: HashMap<u64, Arc<str>> = HashMap::new();
    loop {
        let mut points = Vec::new();
        if !spec.next_batch(source, &mut points, cut)? {
            return Ok(());
        }
        let size = sub_batch(spec.rate, points.len());
        let mut chunks = Vec::with_capacity(points.len().div_ceil(size));
        let mut end = 0;
        for chunk in points.chunks(size) {
            if devices.len() > 1_000_000 {
                devices.clear();
            }
            let batch: Vec<model::DeviceReading> = chunk
                .iter()
                .map(|p| model::DeviceReading {
                    table: tables[p.kind.code() as usize].clone(),
                    device: devices
                        .entry(p.device)
                        .or_insert_with(|| Arc::from(crate::workload::device_name(p.device)))
                        .clone(),
                    reading: p.reading(wspec, &names),
                })
                .collect();
            end += chunk.len();
            chunks.push((end, batch));
        }
        if out.send(BuiltBatch { points, chunks }).is_err() {
            return Ok(());
        }
    }
}

/// The in-process driver's pipeline side: each sub-batch built by [`build_in_process`] written
/// with `bucketer::Store::write` at its intended time.
fn store_in_process(
    built: &std::sync::mpsc::Receiver<BuiltBatch>,
    store: &bucketer::Store,
    spec: &RunSpec,
    wspec: &WorkloadSpec,
    shared: &Shared,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    let start = Instant::now();
    let mut before = 0u64;
    let mut last_watch = None;
    while let Ok(BuiltBatch { points, chunks }) = built.recv() {
        let mut from = 0;
        for (end, batch) in chunks {
            if spec.stopped() {
                shared.cut.store(true, Ordering::Relaxed);
                return Ok(());
            }
            let chunk = &points[from..end];
            from = end;
            let Some(intended) = wait_blocking(intended_time(start, spec.rate, before), spec) else {
                shared.cut.store(true, Ordering::Relaxed);
                return Ok(());
            };
            maybe_watch(chunk, wspec, shared, intended, &mut last_watch, spec.e2e_sample_ms);
            store.write(batch, &[]).map_err(|e| Error::Driver(format!("store write: {e}")))?;
            shared.record_send(intended);
            before += chunk.len() as u64;
            shared.count_dispatched(chunk);
            shared.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            bar.set_position(before);
        }
    }
    Ok(())
}

/// Starts a thread of the harness, named so its CPU is told from the pipeline's
/// ([`crate::cpu::is_harness`]).
fn harness_thread<T: Send + 'static>(
    name: &str,
    ended: Arc<crate::cpu::Ended>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>> {
    debug_assert!(crate::cpu::is_harness(name));
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let out = f();
            ended.add_this_thread();
            out
        })
        .map_err(|e| Error::Driver(format!("starting the harness's thread {name}: {e}")))
}

/// Waits, without blocking the runtime, for a harness thread's result.
async fn join_harness_thread(thread: Result<std::thread::JoinHandle<Result<()>>>) -> Result<()> {
    let thread = thread?;
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| Error::Driver(e.to_string()))?
        .map_err(|_| Error::Driver("a thread of the harness panicked".into()))?
}

/// The MQTT driver's runtime: one worker (the publishers take a fraction of a core) and its
/// blocking threads, all `bench-load`, each adding its CPU to `ended` as it stops.
fn load_runtime(ended: &Arc<crate::cpu::Ended>) -> Result<tokio::runtime::Runtime> {
    let ended = ended.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-load")
        .on_thread_stop(move || ended.add_this_thread())
        .enable_all()
        .build()
        .map_err(|e| Error::Driver(format!("runtime for the MQTT publishers: {e}")))
}

/// Cuts batches into messages of one table each.
#[derive(Debug)]
struct MessageBuilder {
    wspec: WorkloadSpec,
    format: PayloadFormat,
    per_message: usize,
    /// Line protocol: each device's `table,tags ` prefix by (table kind, device).
    prefixes: HashMap<(u8, u64), Vec<u8>>,
    tables: [String; 2],
}

impl MessageBuilder {
    fn new(wspec: &WorkloadSpec, format: PayloadFormat, per_message: usize) -> MessageBuilder {
        MessageBuilder {
            wspec: wspec.clone(),
            format,
            per_message: per_message.max(1),
            prefixes: HashMap::new(),
            tables: TableKind::ALL.map(|k| wspec.table_name(k)),
        }
    }

    /// The points of `kind` in `points`, in order, as messages of at most `per_message`
    /// points: (payload, points).
    fn messages<'a>(&mut self, points: impl IntoIterator<Item = &'a Point>, kind: TableKind) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut of_kind = points.into_iter().filter(|p| p.kind == kind).peekable();
        let mut chunk = Vec::new();
        let mut n = 0u64;
        while let Some(p) = of_kind.next() {
            if n == 0 {
                chunk = Vec::with_capacity(self.per_message * 200);
            }
            match self.format {
                PayloadFormat::Json => {
                    chunk.push(if n == 0 { b'[' } else { b',' });
                    p.write_json(&self.wspec, &mut chunk);
                }
                PayloadFormat::LineProtocol => {
                    if self.prefixes.len() > 1_000_000 {
                        self.prefixes.clear();
                    }
                    let (wspec, table) = (&self.wspec, &self.tables[kind.code() as usize]);
                    let prefix = self
                        .prefixes
                        .entry((kind.code(), p.device))
                        .or_insert_with(|| crate::workload::lp_prefix_as(table, wspec, p.device));
                    p.write_line(wspec, prefix, &mut chunk);
                }
            }
            n += 1;
            if n as usize == self.per_message || of_kind.peek().is_none() {
                if self.format == PayloadFormat::Json {
                    chunk.push(b']');
                }
                out.push((std::mem::take(&mut chunk), n));
                n = 0;
            }
        }
        out
    }
}

/// One MQTT message and the time it was meant to be sent.
#[derive(Debug)]
struct Message {
    topic: Arc<str>,
    payload: Vec<u8>,
    points: u64,
    intended: Instant,
}

async fn dispatch_mqtt(
    mut source: Source,
    target: MqttTarget,
    spec: &RunSpec,
    limit: Option<BacklogLimit>,
    wspec: &WorkloadSpec,
    shared: &Arc<Shared>,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    let topics = [TableKind::Readings, TableKind::Diagnostics]
        .map(|k| Arc::<str>::from(format!("{}/{}", target.topic_prefix, wspec.table_name(k))));
    let mut senders = Vec::new();
    let mut conns = Vec::new();
    for id in 0..target.connections {
        let (tx, rx) = tokio::sync::mpsc::channel::<Message>(16);
        senders.push(tx);
        conns.push(tokio::spawn(connection(target.clone(), id, rx, shared.clone())));
    }
    // The source is read on a blocking thread, a few batches ahead.
    let (btx, mut brx) = tokio::sync::mpsc::channel::<Result<Vec<Point>>>(4);
    let (reader_spec, reader_shared) = (spec.clone(), shared.clone());
    let reader = tokio::task::spawn_blocking(move || loop {
        let mut points = Vec::new();
        match reader_spec.next_batch(&mut source, &mut points, &reader_shared.cut) {
            Ok(true) => {
                if btx.blocking_send(Ok(points)).is_err() {
                    return;
                }
            }
            Ok(false) => return,
            Err(e) => {
                let _ = btx.blocking_send(Err(e));
                return;
            }
        }
    });
    let mut builder = MessageBuilder::new(wspec, PayloadFormat::Json, target.per_message);
    let start = Instant::now();
    let (mut before, mut next_conn) = (0u64, 0usize);
    let mut last_watch = None;
    let mut result = Ok(());
    'batches: while let Some(points) = brx.recv().await {
        let points = match points {
            Ok(p) => p,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        for sub in points.chunks(sub_batch(spec.rate, points.len())) {
            if spec.stopped() {
                shared.cut.store(true, Ordering::Relaxed);
                break 'batches;
            }
            if let Some(limit) = &limit {
                if let Err(e) = limit.wait_for_room(before).await {
                    result = Err(e);
                    break 'batches;
                }
            }
            let Some(intended) = wait_async(intended_time(start, spec.rate, before), spec).await else {
                shared.cut.store(true, Ordering::Relaxed);
                break 'batches;
            };
            maybe_watch(sub, wspec, shared, intended, &mut last_watch, spec.e2e_sample_ms);
            for kind in TableKind::ALL {
                for (payload, points) in builder.messages(sub, kind) {
                    if let Err(e) = within_payload_limit(payload.len(), points, target.max_payload_bytes) {
                        result = Err(e);
                        break 'batches;
                    }
                    let msg = Message { topic: topics[kind.code() as usize].clone(), payload, points, intended };
                    if senders[next_conn].send(msg).await.is_err() {
                        break 'batches;
                    }
                    next_conn = (next_conn + 1) % senders.len();
                }
            }
            before += sub.len() as u64;
            shared.count_dispatched(sub);
            bar.set_position(before);
        }
    }
    drop(brx);
    drop(senders);
    let _ = reader.await;
    for c in conns {
        match c.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = result.and(Err(e)),
            Err(e) => result = result.and(Err(Error::Driver(e.to_string()))),
        }
    }
    result
}

/// Sends of one connection waiting for the event loop: in publish order, then by packet id.
#[derive(Debug, Default)]
struct Pending {
    queued: VecDeque<(Instant, u64)>,
    inflight: HashMap<u16, (Instant, u64)>,
    done: u64,
}

async fn connection(
    target: MqttTarget,
    id: usize,
    mut rx: tokio::sync::mpsc::Receiver<Message>,
    shared: Arc<Shared>,
) -> Result<()> {
    let mut o = MqttOptions::new(format!("hourglass-bench-{id}-{}", std::process::id()), &target.host, target.port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(16 << 20, 16 << 20);
    o.set_inflight(100);
    let (client, mut eventloop) = AsyncClient::new(o, 64);
    let qos = if target.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
    let pending = Arc::new(Mutex::new(Pending::default()));
    let stopping = Arc::new(AtomicBool::new(false));
    let (host, port) = (target.host.clone(), target.port);
    let events = {
        let (pending, shared, stopping) = (pending.clone(), shared.clone(), stopping.clone());
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                        let mut p = lock(&pending);
                        if let Some((intended, points)) = p.queued.pop_front() {
                            if qos == QoS::AtMostOnce {
                                shared.record_send(intended);
                                shared.sent.fetch_add(points, Ordering::Relaxed);
                                p.done += 1;
                            } else {
                                p.inflight.insert(pkid, (intended, points));
                            }
                        }
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        let mut p = lock(&pending);
                        if let Some((intended, points)) = p.inflight.remove(&ack.pkid) {
                            shared.record_send(intended);
                            shared.sent.fetch_add(points, Ordering::Relaxed);
                            p.done += 1;
                        }
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => return Ok(()),
                    Ok(_) => {}
                    // Errors of a connection being closed are expected.
                    Err(_) if stopping.load(Ordering::Relaxed) => return Ok(()),
                    Err(e) => return Err(Error::Driver(format!("MQTT connection {id} to {host}:{port}: {e}"))),
                }
            }
        })
    };
    let mut published = 0u64;
    while let Some(m) = rx.recv().await {
        lock(&pending).queued.push_back((m.intended, m.points));
        if let Err(e) = client.publish(&*m.topic, qos, false, m.payload).await {
            // The connection's event loop ended first: its error says why.
            return match tokio::time::timeout(Duration::from_secs(5), events).await {
                Ok(Ok(Err(cause))) => Err(cause),
                _ => Err(Error::Driver(format!("MQTT connection {id}: {e}"))),
            };
        }
        published += 1;
        if events.is_finished() {
            break;
        }
    }
    // Every message handed over (QoS 0) or acked by the broker (QoS 1), then disconnect.
    let deadline = Instant::now() + Duration::from_secs(120);
    while lock(&pending).done < published && !events.is_finished() {
        if Instant::now() > deadline {
            return Err(Error::Driver(format!("MQTT connection {id}: messages unacked after 120 s")));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stopping.store(true, Ordering::Relaxed);
    let _ = client.disconnect().await;
    match tokio::time::timeout(Duration::from_secs(5), events).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(Error::Driver(e.to_string())),
        Err(_) => Ok(()),
    }
}

/// Produces the whole of `source` to `target` as fast as possible and waits for every delivery
/// report, before any consumer runs; returns (points, field values) produced and whether `stop`
/// cut the workload short. A run with [`Target::Preloaded`] then measures the pipeline draining
/// the topics. Once `stop` is set it produces no more and returns what was delivered so far. A
/// broker that acknowledges nothing for `stall_timeout` while messages wait fails it.
pub async fn produce_kafka(
    mut source: Source,
    target: KafkaTarget,
    batch_points: usize,
    stall_timeout: Duration,
    stop: Arc<AtomicBool>,
) -> Result<(u64, u64, bool)> {
    let wspec = source.spec().clone();
    let shared = Shared::new()?;
    let spec = RunSpec { batch_points, e2e_sample_ms: 0, stall_timeout, stop, ..RunSpec::default() };
    let bar = progress_bar(true, source.expected_points(), None);
    let (shared2, bar2) = (shared.clone(), bar.clone());
    join_harness_thread(harness_thread("bench-load", shared.ended.clone(), move || {
        dispatch_kafka(&mut source, &target, &spec, &wspec, &shared2, &bar2)
    }))
    .await?;
    bar.finish_and_clear();
    // The values of the points delivered: an interrupt drops the queue's points, counted as
    // dispatched, unsent.
    let sent = shared.sent.load(Ordering::Relaxed);
    let (values, _) =
        values_sent(shared.values.load(Ordering::Relaxed), shared.dispatched.load(Ordering::Relaxed), sent);
    Ok((sent, values, shared.cut.load(Ordering::Relaxed)))
}

/// A Kafka message's delivery report goes to the run's send latency and sent count, and moves
/// the progress bar: a message in the producer's queue (up to 100,000 of them, a gigabyte) is
/// not yet sent, and a bar of what was queued stood at 100% for minutes while the broker took
/// the queue, or while a dead broker's queue timed out.
struct DeliveryCounter {
    shared: Arc<Shared>,
    bar: indicatif::ProgressBar,
    delivered: AtomicU64,
    failed: AtomicU64,
    /// Dropped from the queue unsent, at an interrupt.
    purged: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl rdkafka::ClientContext for DeliveryCounter {}

impl rdkafka::producer::ProducerContext for DeliveryCounter {
    /// The message's intended send time and its points.
    type DeliveryOpaque = Box<(Instant, u64)>;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (intended, points) = *opaque;
        match result {
            Ok(_) => {
                self.shared.record_send(intended);
                self.shared.sent.fetch_add(points, Ordering::Relaxed);
                self.delivered.fetch_add(1, Ordering::Relaxed);
                self.bar.inc(points);
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue), _)) => {
                self.purged.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                lock(&self.first_error).get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Creates the topics with `partitions` partitions each (replication 1); a topic that already
/// exists is an error, so a run never mixes its messages with an earlier run's.
pub fn create_kafka_topics(brokers: &str, client: &[(String, String)], topics: &[&str], partitions: i32) -> Result<()> {
    use rdkafka::admin::{NewTopic, TopicReplication};
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1))).collect();
    let admin = KafkaAdmin::new(brokers, client)?;
    let results = admin.runtime.block_on(admin.client.create_topics(&new, &admin.options));
    admin.check("creating", topics, results)
}

/// Deletes a run's `topics` from `brokers`, once the run is over.
pub fn delete_kafka_topics(brokers: &str, client: &[(String, String)], topics: &[&str]) -> Result<()> {
    let admin = KafkaAdmin::new(brokers, client)?;
    let results = admin.runtime.block_on(admin.client.delete_topics(topics, &admin.options));
    admin.check("deleting", topics, results)
}

/// How long an admin request of the harness waits for its brokers (librdkafka's default is a
/// minute: an unreachable broker held a run that long before it failed).
const KAFKA_ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

/// A Kafka admin client of the harness, with the runtime its requests are awaited on.
struct KafkaAdmin {
    client: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    options: rdkafka::admin::AdminOptions,
    runtime: tokio::runtime::Runtime,
    brokers: String,
    /// A client made beside it, for [`kafka_reason`] to ask if a request times out.
    probe: Option<rdkafka::producer::BaseProducer<FirstWord>>,
}

impl KafkaAdmin {
    /// An admin client of `brokers`, with the `client` settings of their TLS and login.
    fn new(brokers: &str, client: &[(String, String)]) -> Result<KafkaAdmin> {
        let mut settings = rdkafka::config::ClientConfig::new();
        settings.set("bootstrap.servers", brokers);
        for (k, v) in client {
            settings.set(k, v);
        }
        let client = settings.create().map_err(|e| Error::Driver(format!("Kafka admin client for {brokers}: {e}")))?;
        let options = rdkafka::admin::AdminOptions::new()
            .operation_timeout(Some(KAFKA_ADMIN_TIMEOUT / 2))
            .request_timeout(Some(KAFKA_ADMIN_TIMEOUT));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Driver(format!("runtime for the Kafka admin client: {e}")))?;
        // Made now, the probe hears librdkafka's events while the requests wait.
        settings.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
        let probe = settings.create_with_context(FirstWord::default()).ok();
        Ok(KafkaAdmin { client, options, runtime, brokers: brokers.to_string(), probe })
    }

    /// The outcome of `doing` (creating, deleting) `topics`: the first error, with its topic.
    fn check(
        &self,
        doing: &str,
        topics: &[&str],
        results: rdkafka::error::KafkaResult<Vec<rdkafka::admin::TopicResult>>,
    ) -> Result<()> {
        let brokers = &self.brokers;
        let results = results.map_err(|e| {
            let said = self.probe.as_ref().and_then(kafka_reason);
            Error::Driver(format!(
                "{doing} Kafka topics {topics:?} on {brokers}: {e}, no answer within {} s (is a Kafka broker listening there?){}",
                KAFKA_ADMIN_TIMEOUT.as_secs(),
                said.map(|s| format!("; librdkafka said: {s}")).unwrap_or_default()
            ))
        })?;
        match results.into_iter().find_map(|r| r.err()) {
            Some((topic, code)) => Err(Error::Driver(format!("{doing} Kafka topic {topic} on {brokers}: {code}"))),
            None => Ok(()),
        }
    }
}

/// What librdkafka said first to `probe`, a client made beside an admin client whose request
/// timed out: the wrong CA, plain TCP to a TLS port or a refused login only time a request out,
/// their reason in events only a polled client hears. Those events wait in the probe's queue
/// since it was made; a second more is given to those still on their way.
fn kafka_reason(probe: &rdkafka::producer::BaseProducer<FirstWord>) -> Option<String> {
    use rdkafka::producer::Producer;
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        probe.poll(Duration::from_millis(100));
        if let Some(said) = probe.context().0.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Some(said);
        }
        if Instant::now() >= until {
            return None;
        }
    }
}

/// [`kafka_reason`]'s context: librdkafka's first error, or warning.
#[derive(Default)]
struct FirstWord(Mutex<Option<String>>);

impl FirstWord {
    fn keep(&self, said: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(|| said.to_string());
    }
}

impl rdkafka::client::ClientContext for FirstWord {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, _fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(level, L::Emerg | L::Alert | L::Critical | L::Error | L::Warning) {
            self.keep(message);
        }
    }

    fn error(&self, _error: rdkafka::error::KafkaError, reason: &str) {
        self.keep(reason);
    }
}

impl rdkafka::producer::ProducerContext for FirstWord {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

fn dispatch_kafka(
    source: &mut Source,
    target: &KafkaTarget,
    spec: &RunSpec,
    wspec: &WorkloadSpec,
    shared: &Arc<Shared>,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    use rdkafka::producer::{BaseRecord, Producer, PurgeConfig, ThreadedProducer};
    let context = DeliveryCounter {
        shared: shared.clone(),
        bar: bar.clone(),
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        purged: AtomicU64::new(0),
        first_error: Mutex::new(None),
    };
    let mut config = rdkafka::config::ClientConfig::new();
    config
        .set("bootstrap.servers", &target.brokers)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "100000")
        .set("queue.buffering.max.kbytes", "1048576")
        .set("message.max.bytes", "16000000");
    for (k, v) in &target.client {
        config.set(k, v);
    }
    let producer: ThreadedProducer<DeliveryCounter> = config
        .create_with_context(context)
        .map_err(|e| Error::Driver(format!("Kafka producer for {}: {e}", target.brokers)))?;
    let ctx = producer.context().clone();
    // A run whose broker stops taking messages ends here, its queue dropped: librdkafka would
    // hold each message for its `message.timeout.ms` (5 minutes), and the loop would fill the
    // queue again after each timeout (a 20,000-truck hour went on for a quarter of an hour
    // after its broker died). Each message in flight is dropped with its ack, if any.
    let give_up = |e: Error| {
        producer.purge(PurgeConfig::default().queue().inflight());
        let _ = producer.flush(Duration::from_secs(5));
        e
    };
    let mut deliveries = KafkaDeliveries::new(spec.stall_timeout);
    let mut builder = MessageBuilder::new(wspec, target.format, target.per_message);
    let start = Instant::now();
    let mut before = 0u64;
    let mut produced = 0u64;
    let mut last_watch = None;
    let mut points = Vec::new();
    'batches: while spec.next_batch(source, &mut points, &shared.cut)? {
        for sub in points.chunks(sub_batch(spec.rate, points.len())) {
            if spec.stopped() {
                shared.cut.store(true, Ordering::Relaxed);
                break 'batches;
            }
            let Some(intended) = wait_blocking(intended_time(start, spec.rate, before), spec) else {
                shared.cut.store(true, Ordering::Relaxed);
                break 'batches;
            };
            maybe_watch(sub, wspec, shared, intended, &mut last_watch, spec.e2e_sample_ms);
            for kind in TableKind::ALL {
                let topic = &target.topics[kind.code() as usize];
                for (partition, payload, n) in kafka_messages(&mut builder, sub, kind, target.partitions) {
                    within_payload_limit(payload.len(), n, target.max_payload_bytes)?;
                    let mut record =
                        BaseRecord::<(), Vec<u8>, Box<(Instant, u64)>>::with_opaque_to(topic, Box::new((intended, n)))
                            .partition(partition)
                            .payload(&payload);
                    loop {
                        match producer.send(record) {
                            Ok(()) => break,
                            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                                // The queue is full while the broker takes it, or not at all.
                                deliveries.check(&ctx, produced).map_err(give_up)?;
                                if spec.stopped() {
                                    shared.cut.store(true, Ordering::Relaxed);
                                    break 'batches;
                                }
                                record = r;
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Err((e, _)) => {
                                return Err(give_up(Error::Driver(format!("Kafka produce to {topic}: {e}"))))
                            }
                        }
                    }
                    produced += 1;
                }
            }
            deliveries.check(&ctx, produced).map_err(give_up)?;
            before += sub.len() as u64;
            shared.count_dispatched(sub);
        }
    }
    if spec.stopped() {
        // Interrupted: nothing more is sent, what waits in the queue included (the messages
        // on their way to the broker are waited for).
        producer.purge(PurgeConfig::default().queue());
    }
    // What is queued is waited for as long as the broker takes it.
    loop {
        match producer.flush(Duration::from_millis(200)) {
            Ok(()) => break,
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                deliveries.check(&ctx, produced).map_err(give_up)?
            }
            Err(e) => return Err(give_up(Error::Driver(format!("Kafka producer flush: {e}")))),
        }
    }
    deliveries.check(&ctx, produced)?;
    let (delivered, purged) = (ctx.delivered.load(Ordering::Relaxed), ctx.purged.load(Ordering::Relaxed));
    if delivered + purged != produced {
        return Err(Error::Driver(format!(
            "Kafka: {delivered} of {produced} messages delivered once flushed ({purged} dropped unsent at the interrupt)"
        )));
    }
    Ok(())
}

/// The delivery reports of a Kafka run's producer, watched while it produces: the run fails at
/// the first message not delivered, or once none of the messages waiting got a report for the
/// stall timeout (the broker is gone or stopped taking them).
struct KafkaDeliveries {
    stall: Stall,
}

impl KafkaDeliveries {
    fn new(limit: Duration) -> KafkaDeliveries {
        KafkaDeliveries { stall: Stall::new(limit) }
    }

    fn check(&mut self, ctx: &DeliveryCounter, produced: u64) -> Result<()> {
        let (delivered, failed) = (ctx.delivered.load(Ordering::Relaxed), ctx.failed.load(Ordering::Relaxed));
        let waiting = produced.saturating_sub(delivered + failed + ctx.purged.load(Ordering::Relaxed));
        if failed == 0 && waiting == 0 {
            // Nothing waits: a wait starts with the next message.
            self.stall = Stall::new(self.stall.limit);
            return Ok(());
        }
        if failed > 0 {
            return Err(Error::Driver(format!(
                "Kafka: {delivered} of {produced} messages delivered, {failed} failed (first error: {})",
                lock(&ctx.first_error).as_deref().unwrap_or("none")
            )));
        }
        if self.stall.stalled(delivered) {
            return Err(Error::Driver(format!(
                "Kafka: no delivery report for {:?} while {waiting} messages waited ({delivered} of {produced} \
                 delivered): the broker is gone or stopped taking messages",
                self.stall.limit
            )));
        }
        Ok(())
    }
}

/// The points of `kind` in `points` as Kafka messages: (partition, payload, points). A
/// device's points all go to one partition (device index modulo `partitions`), in the order
/// given, as a device's own messages would on a keyed topic: the consumer reads each partition
/// in order and the partitions side by side, so a device spread over partitions would be stored
/// out of order far more often than the workload's share of late points.
fn kafka_messages(
    builder: &mut MessageBuilder,
    points: &[Point],
    kind: TableKind,
    partitions: i32,
) -> Vec<(i32, Vec<u8>, u64)> {
    let partitions = partitions.max(1);
    // One pass over the points, not one a partition.
    let mut by_partition: Vec<Vec<&Point>> = vec![Vec::new(); partitions as usize];
    for p in points.iter().filter(|p| p.kind == kind) {
        by_partition[(p.device % partitions as u64) as usize].push(p);
    }
    let mut out = Vec::new();
    for (partition, of_partition) in (0..partitions).zip(by_partition) {
        out.extend(builder.messages(of_partition, kind).into_iter().map(|(payload, n)| (partition, payload, n)));
    }
    out
}

fn http_agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build()
}

/// Polls `latest` for the watched points until told to stop: every 5 ms, or every 1/40 of the
/// oldest watched point's age when that is longer, at most every 50 ms. Each poll is a lookup
/// on the pipeline's runtime and store, a cost of measuring charged to the pipeline, so it is
/// paid in proportion to the precision the latencies need: in the 5M-truck replay, where
/// latencies are seconds, the `latest` lookups (the poller's and the query load's) took 14%
/// fewer samples than at a fixed 5 ms (3.2% of the process's CPU before).
fn poll_latest(http: SocketAddr, table: &str, shared: &Shared) {
    let agent = http_agent();
    loop {
        let batch: Vec<Watch> = {
            let w = lock(&shared.watches);
            w.iter().take(50).copied().collect()
        };
        if batch.is_empty() {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let devices: Vec<String> = batch.iter().map(|w| crate::workload::device_name(w.device)).collect();
        let url = format!("http://{http}/v1/tables/{table}/latest?devices={}", devices.join(","));
        let seen: Vec<Option<i64>> =
            match agent.get(&url).call().ok().and_then(|r| r.into_json::<serde_json::Value>().ok()) {
                Some(v) => v["latest"]
                    .as_array()
                    .map(|a| a.iter().map(|e| e["reading"]["ts"].as_i64()).collect())
                    .unwrap_or_default(),
                None => Vec::new(),
            };
        let now = Instant::now();
        let mut visible = Vec::new();
        for (w, ts) in batch.iter().zip(seen.iter().chain(std::iter::repeat(&None))) {
            if ts.is_some_and(|ts| ts >= w.ts) {
                let us = now.duration_since(w.intended).as_micros().max(1) as u64;
                let _ = lock(&shared.e2e_hist).record(us);
                if w.tick > 0 {
                    let _ = lock(&shared.e2e_known_hist).record(us);
                }
                let _ = lock(&shared.e2e_second).record(us);
                visible.push((w.device, w.ts));
            }
        }
        if !visible.is_empty() {
            lock(&shared.watches).retain(|w| !visible.contains(&(w.device, w.ts)));
        }
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let oldest = lock(&shared.watches).first().map(|w| now.saturating_duration_since(w.intended));
        std::thread::sleep(poll_interval(oldest.unwrap_or_default()));
    }
}

/// The e2e poller's pause after a poll, for the age of the oldest watched point.
fn poll_interval(oldest: Duration) -> Duration {
    (oldest / 40).clamp(Duration::from_millis(5), Duration::from_millis(50))
}

/// The range the query mix's hour roll-ups are asked over: the workload's hours, from the start
/// of the hour of its first tick to its end. An hour's row is found by its start, so a workload
/// starting within an hour (`--start-ms` at 00:59) would not find that hour's row from its
/// first tick on.
fn rollup_query_range(wspec: &WorkloadSpec) -> (i64, i64) {
    (model::Hour::of(wspec.start_ms).start_ms(), wspec.end_ms())
}

/// Runs the query mix open-loop at `rate` a second until told to stop.
fn query_load(http: SocketAddr, wspec: &WorkloadSpec, rate: f64, shared: &Shared) -> QueryLatencies {
    let agent = http_agent();
    let table = wspec.table_name(TableKind::Readings);
    let mut hists = [latency_histogram(), latency_histogram(), latency_histogram()];
    let (mut errors, mut rollup_empty) = (0u64, 0u64);
    let start = Instant::now();
    let mut rng = wspec.seed ^ 0x51_7CC1_B727_220A;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let (s, e) = (wspec.start_ms, wspec.end_ms());
    let (hours_from, hours_to) = rollup_query_range(wspec);
    // Until everything sent is stored: the drain after the last send (a preloaded run's whole
    // run) is under load too.
    let over = || shared.stop.load(Ordering::Relaxed) || lock(&shared.ended_at).is_some();
    let (mut made, mut behind) = (0u64, Duration::ZERO);
    for i in 0u64.. {
        let intended = start + Duration::from_secs_f64(i as f64 / rate);
        // Waited for in steps, so a slow rate does not hold the run past its end.
        while !over() && Instant::now() < intended {
            std::thread::sleep(intended.saturating_duration_since(Instant::now()).min(Duration::from_millis(20)));
        }
        if over() {
            break;
        }
        (made, behind) = (i + 1, Instant::now().saturating_duration_since(intended));
        let kind = (i % 3) as usize;
        let url = match kind {
            0 => {
                let devices: Vec<String> = (0..10).map(|_| crate::workload::device_name(next(wspec.devices))).collect();
                format!("http://{http}/v1/tables/{table}/latest?devices={}", devices.join(","))
            }
            1 => {
                let d = crate::workload::device_name(next(wspec.devices));
                let from = (e - model::HOUR_MS).max(s);
                format!("http://{http}/v1/tables/{table}/devices/{d}/readings?from={from}&to={e}")
            }
            _ => {
                let d = crate::workload::device_name(next(wspec.devices));
                format!("http://{http}/v1/tables/{table}/rollups?device={d}&level=hour&from={hours_from}&to={hours_to}")
            }
        };
        // 404 (a device or table not written yet) is an answer, not a failure: one without a row.
        let answer = match agent.get(&url).call() {
            Ok(r) => r.into_string().ok().map(|body| body.contains("\"rows\":[]")),
            Err(ureq::Error::Status(404, r)) => r.into_string().ok().map(|_| true),
            Err(_) => None,
        };
        match answer {
            None => errors += 1,
            Some(true) if kind == 2 => rollup_empty += 1,
            Some(_) => {}
        }
        if let Ok(h) = &mut hists[kind] {
            let _ = h.record(micros_since(intended));
        }
    }
    let of = |h: &Result<Histogram<u64>>| h.as_ref().map(LatencySummary::of).unwrap_or_default();
    QueryLatencies {
        latest: of(&hists[0]),
        raw: of(&hists[1]),
        rollup: of(&hists[2]),
        errors,
        rollup_empty,
        asked_per_second: Some(rate),
        made_per_second: Some(made as f64 / start.elapsed().as_secs_f64().max(1e-9)),
        behind_seconds: Some(behind.as_secs_f64()),
    }
}

/// The field values of the `sent` points, and the values a point, from `values` counted over
/// `dispatched` points: a run cut short (a broker lost) dispatched more than the broker took,
/// and its values rate counted values never delivered (3 times the rate stored, in a Kafka run
/// whose broker died with two thirds of the workload in the producer's queue).
fn values_sent(values: u64, dispatched: u64, sent: u64) -> (u64, f64) {
    if dispatched == sent {
        return (values, values as f64 / sent.max(1) as f64);
    }
    let per_point = values as f64 / dispatched.max(1) as f64;
    ((per_point * sent as f64).round() as u64, per_point)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The values of the points sent: all of them when everything dispatched was sent; else
    /// the points sent at the dispatched points' mean (QA12's Kafka run: 1,312,626 of
    /// 3,960,025 points delivered, 21,780,331 values dispatched).
    #[test]
    fn a_run_cut_short_counts_the_values_of_the_points_sent() {
        assert_eq!(values_sent(5_500, 1_000, 1_000), (5_500, 5.5));
        let (values, per_point) = values_sent(21_780_331, 3_960_025, 1_312_626);
        assert_eq!(values, 7_219_507);
        assert_eq!((per_point * 1e6).round(), 5_500_049.0);
        assert_eq!(values_sent(0, 0, 0), (0, 0.0));
    }

    /// A workload starting within an hour asks for that hour's roll-up row too (found by its
    /// start): the 10M-device run of 2026-12-06 started at 00:59 and its 20,553 roll-up queries
    /// found no row, hour 00's rolled up meanwhile.
    #[test]
    fn roll_up_queries_ask_from_the_hour_of_the_first_tick() {
        let at = |start_ms| WorkloadSpec { start_ms, ticks: 60, interval_ms: 60_000, ..WorkloadSpec::default() };
        let hour = model::HOUR_MS;
        let midnight = 1_704_067_200_000;
        assert_eq!(rollup_query_range(&at(midnight + 59 * 60_000)), (midnight, midnight + 59 * 60_000 + hour));
        assert_eq!(rollup_query_range(&at(midnight)), (midnight, midnight + hour));
        assert_eq!(rollup_query_range(&at(midnight + hour - 1)), (midnight, midnight + 2 * hour - 1));
    }

    fn limit(cap: u64, stored: Arc<AtomicU64>, base: u64, stall_ms: u64) -> BacklogLimit {
        BacklogLimit {
            cap,
            stored: Arc::new(move || stored.load(Ordering::Relaxed)),
            base,
            stall: Duration::from_millis(stall_ms),
        }
    }

    /// The Kafka driver keeps each device on one partition, its points in the order given, in
    /// messages of at most `per_message` points; every point of the kind goes out once.
    #[test]
    fn the_kafka_driver_keeps_a_device_on_one_partition() {
        use std::collections::BTreeMap;
        let wspec = WorkloadSpec { devices: 23, ticks: 4, out_of_order_share: 0.2, ..WorkloadSpec::default() };
        let mut generator = crate::workload::Generator::new(wspec.clone()).unwrap();
        let (mut points, mut batch) = (Vec::new(), Vec::new());
        while generator.next_batch(1000, &mut batch) {
            points.append(&mut batch);
        }
        let mut builder = MessageBuilder::new(&wspec, PayloadFormat::Json, 4);
        for kind in TableKind::ALL {
            let messages = kafka_messages(&mut builder, &points, kind, 3);
            let mut by_partition: BTreeMap<i32, Vec<(String, i64)>> = BTreeMap::new();
            for (partition, payload, n) in &messages {
                let readings: Vec<serde_json::Value> = serde_json::from_slice(payload).unwrap();
                assert!(readings.len() as u64 == *n && (1..=4).contains(n), "{n} {}", readings.len());
                by_partition.entry(*partition).or_default().extend(
                    readings.iter().map(|r| (r["device"].as_str().unwrap().to_string(), r["ts"].as_i64().unwrap())),
                );
            }
            for partition in 0..3 {
                let want: Vec<(String, i64)> = points
                    .iter()
                    .filter(|p| p.kind == kind && p.device % 3 == partition as u64)
                    .map(|p| (crate::workload::device_name(p.device), wspec.tick_ts(p.tick)))
                    .collect();
                assert!(!want.is_empty());
                assert_eq!(by_partition.get(&partition), Some(&want), "partition {partition} of {kind:?}");
            }
            assert_eq!(by_partition.len(), 3);
        }
    }

    /// 5 ms while the oldest watched point is young, a 40th of its age after, 50 ms at most.
    #[test]
    fn the_series_adds_up_to_every_point_and_folds_a_last_sliver_into_the_window_before() {
        let mut series = Series::new(0, 1_000).expect("a series");
        let mut e2e = latency_histogram().expect("a histogram");
        let windows = [
            (1.0, 100, 1_080, false, Some(1_500)),
            (2.0, 300, 1_250, false, None),
            (2.25, 400, 1_400, true, Some(2_000)),
        ];
        for (t, sent, stored, last, sample_us) in windows {
            if let Some(us) = sample_us {
                e2e.record(us).expect("in range");
            }
            series.close_window(Mark { t, sent, stored }, &mut e2e, last, 7);
            assert!(e2e.is_empty());
        }
        // The 0.25 s sliver is folded into the second window: 1.0 to 2.25 s.
        let s = &series.seconds;
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].t_s, s[0].sent_per_s, s[0].stored_per_s), (1.0, 100.0, 80.0));
        assert_eq!((s[1].t_s, s[1].sent_per_s, s[1].stored_per_s), (2.25, 240.0, 256.0));
        assert_eq!((s[0].e2e_max_ms, s[1].e2e_max_ms), (Some(1.5), Some(2.0)));
        let (mut from, mut stored) = (0.0, 0.0);
        for w in s {
            stored += w.stored_per_s * (w.t_s - from);
            from = w.t_s;
        }
        assert_eq!(stored, 400.0);
        // A last window of half a second or more stands alone; one without samples has no latency.
        let mut series = Series::new(0, 0).expect("a series");
        series.close_window(Mark { t: 1.0, sent: 10, stored: 10 }, &mut e2e, false, 7);
        series.close_window(Mark { t: 1.5, sent: 20, stored: 20 }, &mut e2e, true, 7);
        let s = &series.seconds;
        assert_eq!((s.len(), s[1].stored_per_s, s[1].e2e_p99_ms, s[1].e2e_max_ms), (2, 20.0, None, None));
        // A run shorter than half a second has its one window.
        let mut series = Series::new(0, 0).expect("a series");
        series.close_window(Mark { t: 0.2, sent: 10, stored: 10 }, &mut e2e, true, 7);
        assert_eq!((series.seconds.len(), series.seconds[0].stored_per_s), (1, 50.0));
    }

    #[test]
    fn the_e2e_poller_waits_in_proportion_to_the_latency_it_measures() {
        let ms = Duration::from_millis;
        assert_eq!(poll_interval(Duration::ZERO), ms(5));
        assert_eq!(poll_interval(ms(13)), ms(5));
        assert_eq!(poll_interval(ms(200)), ms(5));
        assert_eq!(poll_interval(ms(400)), ms(10));
        assert_eq!(poll_interval(ms(1_200)), ms(30));
        assert_eq!(poll_interval(ms(2_000)), ms(50));
        assert_eq!(poll_interval(ms(6_000)), ms(50));
    }

    #[tokio::test]
    async fn the_driver_waits_until_the_store_is_within_the_backlog() {
        // 1,000 points stored before the run (the base): 5,000 handed over, 250 may wait.
        let stored = Arc::new(AtomicU64::new(1_000));
        let l = limit(250, stored.clone(), 1_000, 10_000);
        // Within the limit: no wait.
        stored.store(1_000 + 4_750, Ordering::Relaxed);
        l.wait_for_room(5_000).await.unwrap();
        // 4,000 stored of 5,000: it waits while the store goes on, 100 points at a time.
        stored.store(1_000 + 4_000, Ordering::Relaxed);
        let store = {
            let stored = stored.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    stored.fetch_add(100, Ordering::Relaxed);
                }
            })
        };
        l.wait_for_room(5_000).await.unwrap();
        let at_return = stored.load(Ordering::Relaxed) - 1_000;
        assert!(at_return >= 4_750, "returned with {at_return} of 5,000 stored");
        store.await.unwrap();
    }

    #[tokio::test]
    async fn a_store_that_stores_nothing_stops_the_driver() {
        let stored = Arc::new(AtomicU64::new(0));
        let err = limit(100, stored, 0, 50).wait_for_room(1_000).await.expect_err("stuck");
        assert_eq!(
            err.to_string(),
            "stalled: 1000 of 1000 points sent are not stored, and none was stored for 50ms: the system under test \
             stopped storing"
        );
    }
}
