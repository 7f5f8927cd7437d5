//! Wiring of the pipeline — embedded broker, MQTT consumer, Kafka consumer (when enabled), HTTP
//! write intake, bucketer, retention task, roll-up task, query service — and its ordered
//! shutdown: close the embedded broker to its clients and read it to its end, stop intake and
//! retention, drain and commit, stop the roll-up task, ack (MQTT PUBACKs, Kafka offset
//! commits), flush, then stop serving.

use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bucketer::writer::{self, WriterConfig};
use bucketer::{Store, StoreConfig};
use ingest::kafka::{KafkaConfig, KafkaControl, PartitionLag, StoredOffsets};
use ingest::lpwire::LpConfig;
use ingest::mqtt::{MqttConfig, MqttStats};
use ingest::wire::WireConfig;
use tokio::sync::{mpsc, oneshot, watch};

use crate::background::BackgroundThread;
use crate::config::Config;

/// A running pipeline.
pub(crate) struct Running {
    pub(crate) store: Arc<Store>,
    /// Flushes a due write buffer beside the bucketer (`None`: the buffer is off).
    flusher: Option<bucketer::Flusher>,
    pub(crate) http_addr: SocketAddr,
    /// `http://` and the query service's address, or `https://` (`http.tls_cert_file`).
    pub(crate) http_url: String,
    pub(crate) mqtt_stats: Arc<MqttStats>,
    /// Where the embedded broker listens (`None`: an external broker, or no MQTT), closed to
    /// its clients and read to its end before intake stops (`crate::broker_drain`).
    embedded_broker: Option<SocketAddr>,
    /// The MQTT consumer and the broker it reads, embedded or external (`None`: `mqtt.enabled`
    /// is false).
    mqtt: Option<MqttIntake>,
    kafka: Option<(KafkaControl, std::thread::JoinHandle<bool>)>,
    /// Line protocol written over HTTP (`/write`), stopped with the other intakes.
    http_intake: Arc<ingest::http::HttpIntake>,
    writer_thread: std::thread::JoinHandle<writer::NotStored>,
    /// Tells the bucketer the process is stopping (`WriterConfig::stopping`).
    writer_stopping: Arc<std::sync::atomic::AtomicBool>,
    retention_stop: watch::Sender<bool>,
    retention_task: tokio::task::JoinHandle<()>,
    rollup_stop: watch::Sender<bool>,
    rollup_task: tokio::task::JoinHandle<()>,
    http_stop: oneshot::Sender<()>,
    http_task: tokio::task::JoinHandle<()>,
}

/// The MQTT intake of a running pipeline.
struct MqttIntake {
    /// The broker it reads: host and port.
    broker: (String, u16),
    control: ingest::mqtt::MqttControl,
    task: tokio::task::JoinHandle<()>,
}

/// The file in the data directory naming each external broker and client id the store has
/// consumed under (`ingest::mqtt::MqttConfig::session_marker`).
pub(crate) const MQTT_SESSIONS_FILE: &str = "mqtt-sessions";

/// How the embedded broker checks a connecting client: `None` lets everyone in (auth off).
#[derive(Clone)]
struct BrokerAuth {
    auth: Arc<query::auth::Auth>,
    store: Arc<Store>,
    /// Username and password of Hourglass's own consumer: a secret made at each start.
    internal: (String, String),
    /// The client ids of Hourglass's consumer's connections: no one else may take them (a
    /// CONNECT under a client id in use closes the other connection, so a device under one
    /// would keep throwing the consumer off).
    consumers: Vec<String>,
    /// The refusals logged (`BrokerAuth::refused`).
    said: Arc<std::sync::Mutex<ingest::quiet::QuieterByText>>,
}

/// Why the embedded broker refuses a client, as logged.
const OWN_CLIENT_ID: &str = "its client id is Hourglass's own consumer's (mqtt.client_id); a device needs another";
const NOT_A_TABLE: &str = "its username is not a table's name (1 to 64 ASCII letters, digits, `_`, `-` or `.`): the \
                           username names the table, the password is a token with write permission on it";
const NO_TOKEN: &str = "no token with write permission on the table";

impl BrokerAuth {
    /// Whether a client may connect: Hourglass's consumer by its secret, anyone else by a
    /// token (the password) with write permission on the table named by the username, under a
    /// client id that is not the consumer's. The check is one multi-get of two keys, made once
    /// per connection.
    fn allows(&self, client_id: &str, username: &str, password: &str) -> bool {
        let (user, secret) = &self.internal;
        if username == user.as_str() {
            return query::auth::same_secret(password, secret);
        }
        let table = self.shown_username(username, password);
        let table = table.as_ref();
        if self.consumers.iter().any(|c| c == client_id) {
            self.refused(client_id, table, OWN_CLIENT_ID);
            return false;
        }
        if !ingest::wire::valid_table_name(username) {
            // Said as such (QA48 N4: it was said to have no token with write permission).
            self.refused(client_id, table, NOT_A_TABLE);
            return false;
        }
        let ok = self.auth.mqtt_may_publish(&self.store, username, password);
        if !ok {
            self.refused(client_id, table, NO_TOKEN);
        }
        ok
    }

    /// The username of a refused login as logged: not a token given in its place (the two
    /// swapped, or the token in both; QA48 N3: the admin token was logged in full). Nor a
    /// name no table has that is as long as an admin token and without spaces, which may be one
    /// Hourglass does not know: a rotated-out admin token, say (QA49 R9).
    fn shown_username<'a>(&self, username: &'a str, password: &str) -> std::borrow::Cow<'a, str> {
        if username == password || self.auth.may_be_token(username) {
            return "(not shown: it may be a token; the username is the table's name)".into();
        }
        let chars = username.chars().count();
        let may_be_secret = chars >= crate::config::MIN_ADMIN_TOKEN_LEN && !username.contains(char::is_whitespace);
        if may_be_secret && self.store.table(username).is_none() {
            return format!(
                "(not shown: no table has this name of {chars} characters, which may be a token; the username is \
                 the table's name)"
            )
            .into();
        }
        username.into()
    }

    /// Logs a refused login: once a minute for the same reason and table (QA48 N8: a fleet
    /// whose token was revoked reconnecting forever logged a line a device a reconnect).
    fn refused(&self, client_id: &str, table: &str, why: &str) {
        let text = format!("{why}\u{0}{table}");
        let admitted = self.said.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(&text, Instant::now());
        if let Some(repeats) = admitted {
            tracing::warn!(client_id, table, repeats, "MQTT client refused: {why}");
        }
    }
}

/// The embedded broker's settings.
struct BrokerSpec {
    listen: SocketAddr,
    max_payload: usize,
    max_inflight: usize,
    /// Bytes of published messages it holds for its subscribers to read.
    backlog_bytes: u64,
    auth: Option<BrokerAuth>,
    /// Client ids of Hourglass's consumer's connections and their subscriptions: their skipped
    /// messages and what the broker took on the subscriptions count in `stats`.
    consumers: Vec<String>,
    filters: Vec<String>,
    stats: Arc<MqttStats>,
}

/// rumqttd's commit log for a backlog of `bytes`: (segment size, segments). It drops the oldest
/// segment once all are full, so it holds up to `bytes` (of whole segments of at most 100 MiB,
/// at least two).
fn broker_segments(bytes: u64) -> (usize, usize) {
    const SEGMENT: u64 = 100 << 20;
    let (size, count) = if bytes >= 2 * SEGMENT { (SEGMENT, bytes / SEGMENT) } else { ((bytes / 2).max(1), 2) };
    (usize::try_from(size).unwrap_or(usize::MAX), usize::try_from(count).unwrap_or(usize::MAX))
}

/// Reads the broker's alerts until it stops. A skip of one of Hourglass's own connections
/// (rumqttd's "cursor jump": its cursor fell behind the oldest message the commit log still
/// holds, so it resumes there) loses messages the publishers were acknowledged for: counted, with
/// the messages lost, and logged as an error. How many is in the router's warning just before
/// the alert, which the process's logging notes (`logging::CursorJumps`): a jump that lost none
/// (a cursor left at the very end of a dropped segment) is a warning and not counted; one whose
/// warning was not noted (a `RUST_LOG` hiding rumqttd's warnings) is counted, its loss unknown.
/// Another subscriber's skip is a warning.
fn watch_broker_alerts(link: rumqttd::alerts::AlertsLink, consumers: &[String], stats: &MqttStats) {
    use std::sync::atomic::Ordering::Relaxed;
    while let Ok(alerts) = link.router_rx.recv() {
        for alert in alerts {
            if alert.kind.name() != "cursor_jump" {
                continue;
            }
            // `AlertKind` is not nameable outside rumqttd; its serialized form is.
            let filter = serde_json::to_value(&alert.kind)
                .ok()
                .and_then(|v| v.pointer("/CursorJump/filter").and_then(|f| f.as_str()).map(str::to_string))
                .unwrap_or_default();
            // Taken for every jump, whoever's: the router made them in the alerts' order.
            let lost = crate::logging::cursor_jumps().and_then(|jumps| jumps.take(&filter));
            if !consumers.contains(&alert.client_id) {
                tracing::warn!(
                    client_id = alert.client_id,
                    filter,
                    lost,
                    "the embedded MQTT broker dropped messages a subscriber had not read yet"
                );
                continue;
            }
            if lost == Some(0) {
                tracing::warn!(
                    filter,
                    "the embedded MQTT broker dropped a segment of its log that Hourglass had read to its end: \
                     nothing was lost, but the store is mqtt.broker_backlog_mb behind the publishers"
                );
                continue;
            }
            stats.broker_skips.fetch_add(1, Relaxed);
            stats.broker_skipped_messages.fetch_add(lost.unwrap_or(0), Relaxed);
            tracing::error!(
                filter,
                lost,
                "the embedded MQTT broker dropped messages Hourglass had not read yet: the store fell \
                 mqtt.broker_backlog_mb behind the publishers, who were already acknowledged. Those readings \
                 are lost. Raise mqtt.broker_backlog_mb, publish slower, or use Kafka for bursts above the \
                 store's rate"
            );
        }
    }
}

/// How often at most [`watch_broker_meters`] warns of messages on topics no subscription of
/// Hourglass matches.
const UNMATCHED_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Adds up, from the broker's meters, the messages it took on `filters` (Hourglass's
/// subscriptions, which no topic matches twice) and their bytes in its log in
/// `stats.broker_published` and `stats.broker_published_bytes`: less those the consumer
/// received, the backlog it holds for Hourglass. The messages it took on other topics, every
/// publish less those, go in `stats.broker_unmatched`, and a warning says so, once a minute
/// at most: rumqttd acknowledges a QoS 1 publish to a topic no one subscribes to and drops it
/// without a word (QA37 F1).
fn watch_broker_meters(link: rumqttd::meters::MetersLink, filters: &[String], stats: &MqttStats) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "no runtime for the embedded broker's meters"),
    };
    // Unmatched messages not warned of yet, and when the last warning was.
    let (mut unwarned, mut warned_at): (u64, Option<Instant>) = (0, None);
    runtime.block_on(async {
        while let Ok(meters) = link.next().await {
            // One push of the meters: what the router took since the last (every publish), and
            // what each subscription's log took of it.
            let (mut publishes, mut ours) = (0u64, 0u64);
            for meter in meters {
                match meter {
                    rumqttd::Meter::Subscription(f, m) if filters.contains(&f) => {
                        use std::sync::atomic::Ordering::{Relaxed, Release};
                        // The meter adds up what each message took in the log (4 bytes, the
                        // topic and the payload: `ingest::mqtt::broker_log_size`). The bytes
                        // first: a reader that sees the count sees its bytes.
                        stats.broker_published_bytes.fetch_add(m.total_size as u64, Relaxed);
                        stats.broker_published.fetch_add(m.count as u64, Release);
                        ours += m.count as u64;
                    }
                    rumqttd::Meter::Router(_, m) => publishes += m.total_publishes as u64,
                    _ => {}
                }
            }
            // A client's will, published by the broker for it, reaches a log without counting
            // as a publish (rumqttd 0.20): one on Hourglass's topics hides an unmatched message
            // of its push, one elsewhere is not counted (QA39 F1); never below none.
            let unmatched = publishes.saturating_sub(ours);
            if unmatched > 0 {
                stats.broker_unmatched.fetch_add(unmatched, std::sync::atomic::Ordering::Relaxed);
                unwarned += unmatched;
            }
            if unwarned > 0 && warned_at.is_none_or(|at| at.elapsed() >= UNMATCHED_WARNING_EVERY) {
                tracing::warn!(
                    messages = unwarned,
                    "the embedded MQTT broker took messages on topics no subscription of Hourglass matches \
                     (mqtt.topic_prefix, mqtt.subscriptions): acknowledged to QoS 1 publishers, stored nowhere. \
                     Check the publishers' topics (hourglass_ingest_broker_unmatched_messages_total counts them)"
                );
                (unwarned, warned_at) = (0, Some(Instant::now()));
            }
        }
    });
}

/// Starts the embedded rumqttd broker on `listen` and waits until it accepts connections.
///
/// rumqttd answers a publisher's QoS 1 PUBACK as soon as it holds the message in memory; a
/// crash of the whole process loses what it held but Hourglass had not yet committed (an
/// ordered stop reads it to its end first: `crate::broker_drain`). Use an external broker with
/// persistence where that matters (see README). It holds `backlog_bytes` of
/// messages for its subscribers; past that it drops the oldest, read or not
/// ([`watch_broker_alerts`] counts and logs it).
fn start_embedded_broker(spec: BrokerSpec) -> anyhow::Result<SocketAddr> {
    let BrokerSpec { listen, max_payload, max_inflight, backlog_bytes, auth, consumers, filters, stats } = spec;
    // rumqttd reports a failed bind only in its own thread's log; check it here for a clear error.
    // Port 0 becomes the port the kernel picks for this check, free for rumqttd a moment later,
    // so a caller without a fixed port learns the broker's from the ready line.
    let listen = TcpListener::bind(listen).and_then(|probe| probe.local_addr()).with_context(|| {
        format!("embedded MQTT broker cannot listen on {listen} (port in use? set mqtt.listen or --mqtt-listen)")
    })?;
    let mut connections = rumqttd::ConnectionSettings {
        connection_timeout_ms: 60_000,
        // Room above the ingest limit, so oversize payloads reach ingest and become
        // dead letters.
        max_payload_size: max_payload.saturating_mul(2).max(64 << 10),
        max_inflight_count: max_inflight,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    if let Some(auth) = auth {
        connections.set_auth_handler(move |client_id: String, username: String, password: String| {
            let allowed = auth.allows(&client_id, &username, &password);
            async move { allowed }
        });
    }
    let mut v4 = HashMap::new();
    v4.insert(
        "1".to_string(),
        rumqttd::ServerSettings {
            name: "hourglass-v4".into(),
            listen,
            tls: None,
            next_connection_delay_ms: 1,
            connections,
        },
    );
    let (max_segment_size, max_segment_count) = broker_segments(backlog_bytes);
    // Alerts (skipped messages among them) and meters (messages taken) are pushed every second.
    let every = |s: u64| serde_json::from_value::<rumqttd::MetricSettings>(serde_json::json!({ "push_interval": s }));
    let metrics: HashMap<rumqttd::MetricType, rumqttd::MetricSettings> =
        [(rumqttd::MetricType::Alerts, every(1)?), (rumqttd::MetricType::Meters, every(1)?)].into();
    let config = rumqttd::Config {
        id: 0,
        router: rumqttd::RouterConfig {
            max_connections: 10_010,
            max_outgoing_packet_count: 200,
            max_segment_size,
            max_segment_count,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(v4),
        metrics: Some(metrics),
        ..Default::default()
    };
    let mut broker = rumqttd::Broker::new(config);
    let alerts = broker.alerts().map_err(|e| anyhow::anyhow!("subscribing to the embedded broker's alerts: {e}"))?;
    let meters = broker.meters().map_err(|e| anyhow::anyhow!("subscribing to the embedded broker's meters: {e}"))?;
    let meter_stats = stats.clone();
    std::thread::Builder::new()
        .name("mqtt-alerts".into())
        .spawn(move || watch_broker_alerts(alerts, &consumers, &stats))
        .context("spawning the broker alerts thread")?;
    std::thread::Builder::new()
        .name("mqtt-meters".into())
        .spawn(move || watch_broker_meters(meters, &filters, &meter_stats))
        .context("spawning the broker meters thread")?;
    std::thread::Builder::new()
        .name("mqtt-broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded MQTT broker stopped");
            }
        })
        .context("spawning the broker thread")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline {
            anyhow::bail!("embedded MQTT broker did not start listening on {listen} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(listen)
}

/// The store's settings in `cfg`.
fn store_config(cfg: &Config) -> StoreConfig {
    StoreConfig {
        sync_wal: cfg.storage.sync_wal,
        bucket_max_readings: cfg.storage.bucket_max_readings,
        write_buffer: bucketer::WriteBufferConfig::of_mib(cfg.storage.write_buffer_mb),
        archive: cfg.archive(),
        db: bucketer::DbOptions {
            compaction: cfg.storage.compaction.into(),
            subcompactions: cfg.storage.subcompactions,
            background_jobs: crate::config::background_jobs(cfg.storage.background_jobs),
            ..bucketer::DbOptions::default()
        },
        ..StoreConfig::default()
    }
}

/// What [`compact_store`] did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Compacted {
    /// Bytes of the data directory before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Bytes of the `buckets` column family's SST files after.
    pub buckets_sst_bytes: u64,
    /// Field values in the buckets (a full scan), when asked for.
    pub values: Option<u64>,
    /// The threads each compaction could be split across.
    pub subcompactions: u32,
    /// Wall time of the open, the flushes and the compactions (not the scan).
    pub seconds: f64,
}

/// `hourglass compact`: [`compact_store`], answered as JSON.
pub(crate) fn compact(cfg: &Config) -> anyhow::Result<serde_json::Value> {
    let done = compact_store(cfg, false)?;
    Ok(serde_json::json!({
        "data_dir": cfg.data_dir,
        "bytes_before": done.bytes_before,
        "bytes_after": done.bytes_after,
        "buckets_sst_bytes": done.buckets_sst_bytes,
        "subcompactions": done.subcompactions,
        "seconds": done.seconds,
    }))
}

/// Opens the store of `cfg` while no other process holds it, writes what its write buffer
/// holds to the buckets, flushes the memtables, compacts every column family down to its last
/// level, counts the buckets' field values if `count_values`, and closes it: the store as a
/// long-running one settles, for measuring bytes per value (`hourglass compact`, and `bench
/// replay` after its run).
pub(crate) fn compact_store(cfg: &Config, count_values: bool) -> anyhow::Result<Compacted> {
    if let Err(problems) = cfg.validate() {
        return Err(crate::config::problems_error(&problems));
    }
    let dir = cfg.data_dir.join("rocksdb");
    anyhow::ensure!(
        dir.join("CURRENT").is_file(),
        "no store in {}: {} holds no RocksDB database",
        cfg.data_dir.display(),
        dir.display()
    );
    let bytes_before = dir_bytes(&cfg.data_dir, Some("checkpoints"))?;
    let started = Instant::now();
    let mut store_cfg = store_config(cfg);
    // Nothing else uses the store meanwhile: each compaction is split by key range across every
    // core (`storage.subcompactions`, if higher). 20 minutes of 10M devices compacted in 189 s
    // instead of 365 on two cores (BENCHMARKS.md, "Subcompactions").
    let cores = std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    store_cfg.db.subcompactions = store_cfg.db.subcompactions.max(cores);
    let subcompactions = store_cfg.db.subcompactions;
    let store = Store::open(&dir, store_cfg)
        .map_err(|e| open_failed(e, &dir.display().to_string(), "is a `hourglass serve` using it?"))?;
    tracing::info!(data_dir = %cfg.data_dir.display(), bytes_before, subcompactions, "compacting every column family fully; a large store takes minutes");
    store.compact().context("compacting")?;
    let seconds = started.elapsed().as_secs_f64();
    let buckets_sst_bytes = store.bucket_sst_bytes()?;
    let values = if count_values {
        tracing::info!(seconds, "compacted; counting the stored values (a full scan of the buckets)");
        Some(store.bucket_scan_stats()?.2)
    } else {
        None
    };
    drop(store);
    let bytes_after = dir_bytes(&cfg.data_dir, Some("checkpoints"))?;
    tracing::info!(bytes_after, seconds, "compacted");
    Ok(Compacted { bytes_before, bytes_after, buckets_sst_bytes, values, subcompactions, seconds })
}

/// The error of a store that did not open in `shown`, with `lock_hint` when RocksDB could not
/// take its lock (held by another process, the likely cause): not for its other refusals (a
/// read-only filesystem, a damaged file) nor the archive's checks, whose messages say what is
/// wrong.
fn open_failed(e: bucketer::Error, shown: &str, lock_hint: &str) -> anyhow::Error {
    let hint = match &e {
        // RocksDB's words: `IO error: While lock file: …/LOCK: Resource temporarily unavailable`.
        bucketer::Error::Open { source, .. } if source.to_string().contains("While lock file") => {
            format!(" ({lock_hint})")
        }
        _ => String::new(),
    };
    anyhow::Error::new(e).context(format!("opening the store in {shown}{hint}"))
}

/// Bytes of the files under `dir`, as `du --apparent-size` counts them, but those under its
/// entry named `except` and RocksDB's text logs: `compact_store` leaves out `checkpoints`
/// (`POST /v1/checkpoints`), which share most of their blocks with the store's files, and
/// `LOG`, `LOG.old.*`, which each open of the store lengthens (by some 300 KB: a small store
/// looked larger after each compaction).
fn dir_bytes(dir: &std::path::Path, except: Option<&str>) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let log = name == "LOG" || name.to_str().is_some_and(|n| n.starts_with("LOG.old."));
        if log || except.is_some_and(|except| name == except) {
            continue;
        }
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path(), None)? } else { meta.len() };
    }
    Ok(total)
}

/// Starts every stage; returns once all of them accept work.
pub(crate) async fn start(cfg: &Config) -> anyhow::Result<Running> {
    let mut running = start_unready(cfg).await?;
    running.wait_subscribed(cfg).await;
    Ok(running)
}

/// Starts every stage and returns without waiting for the consumers to subscribe (see
/// [`Running::wait_subscribed`]): the query service answers already.
pub(crate) async fn start_unready(cfg: &Config) -> anyhow::Result<Running> {
    if let Err(problems) = cfg.validate() {
        return Err(crate::config::problems_error(&problems));
    }
    // Which build this is: "Upgrades and rollbacks" tells builds apart by commit and date.
    tracing::info!(version = crate::VERSION, "hourglass starting");
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data directory {}", cfg.data_dir.display()))?;
    let store_cfg = store_config(cfg);
    if cfg.storage.write_buffer_mb > 0 {
        tracing::info!(
            mib = cfg.storage.write_buffer_mb,
            "write buffer on: batches are logged as one record each and flushed as one operand a device-hour"
        );
    }
    let dir = cfg.data_dir.join("rocksdb");
    let shown = cfg.data_dir.display().to_string();
    let store = Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&dir, store_cfg))
            .await
            .context("opening the store")?
            .map_err(|e| open_failed(e, &shown, "is another `hourglass serve` using this data_dir?"))?,
    );
    let flusher = store.start_flusher()?;
    for (name, table) in &cfg.storage.tables {
        // `validate` has checked every spec.
        let spec = table.spec().map_err(|e| anyhow::anyhow!("storage.tables: table {name:?}: {e}"))?;
        let (store, name) = (store.clone(), name.clone());
        let shown = format!("storage.tables: table {name:?} cannot be defined as configured");
        tokio::task::spawn_blocking(move || store.define_table_with(&name, &spec))
            .await
            .context("defining the tables of storage.tables")?
            .context(shown)?;
    }
    for unused in cfg.unused_archive_settings() {
        tracing::warn!("{unused}");
    }
    if cfg.archive().is_none() {
        // Of storage.tables or of the API: the setting is the table's, kept in the store.
        for name in store.tables() {
            if let Some(cold) = store.table(&name).and_then(|t| t.cold_retention_ms) {
                tracing::warn!("{}", crate::config::cold_without_archive(&name, cold));
            }
        }
    }

    let auth = Arc::new(query::auth::Auth::new(&query::auth::AuthConfig {
        enabled: cfg.auth.enabled,
        admin_token: cfg.auth.admin_token.clone(),
    }));
    // Its files read before anything starts (`check-config` reads them too).
    let tls = cfg.http.tls().map_err(|problems| {
        let said: Vec<String> = problems.iter().map(|(key, message)| format!("{key}: {message}")).collect();
        anyhow::anyhow!("the query service's TLS: {}", said.join("; "))
    })?;
    // Bound before any broker is touched: a second instance on a port in use fails here, not
    // after its consumer has connected under the client id (and taken the session) of the first.
    let listener = tokio::net::TcpListener::bind(cfg.http.listen).await.with_context(|| {
        format!("query service cannot listen on {} (port in use? set http.listen or --http-listen)", cfg.http.listen)
    })?;
    // Named once bound: port 0 is the port taken.
    if !cfg.auth.enabled {
        // An external broker checks its own clients: only the embedded one is opened by this.
        let broker = if cfg.mqtt.embedded_broker() { " or the embedded MQTT broker" } else { "" };
        tracing::warn!(
            "AUTH IS OFF: anyone who reaches {} (HTTP){broker} can read and write every table. \
             This is for the local demo only; set auth.enabled = true and an admin token anywhere else",
            listener.local_addr().unwrap_or(cfg.http.listen)
        );
    } else if cfg.auth.admin_token.is_none() {
        tracing::warn!(
            "auth is on without an admin token (auth.admin_token / HOURGLASS_AUTH__ADMIN_TOKEN): only tokens already \
             stored are accepted, and only a stored admin token can issue more"
        );
    }
    let lp = LpConfig {
        precision: cfg.lineproto.precision,
        device_tag: cfg.lineproto.device_tag.clone(),
        receive_clock: true,
    };
    let mqtt_stats = Arc::new(MqttStats::default());
    let mut mqtt = MqttConfig {
        client_id: cfg.mqtt.client_id.clone(),
        wire: WireConfig {
            topic_prefix: cfg.mqtt.topic_prefix.clone(),
            max_payload_bytes: cfg.mqtt.max_payload_bytes,
            lp: lp.clone(),
        },
        subscriptions: cfg.mqtt.subscriptions.clone(),
        ..MqttConfig::default()
    };
    let mut embedded_broker = None;
    match &cfg.mqtt.url {
        _ if !cfg.mqtt.enabled => tracing::info!("MQTT is off (mqtt.enabled = false): no broker, no consumer"),
        Some(_) => {
            mqtt = cfg.mqtt.external_consumer(mqtt).map_err(|problems| {
                let lines: Vec<String> = problems.iter().map(|(key, e)| format!("{key}: {e}")).collect();
                anyhow::anyhow!("{}", lines.join("\n  "))
            })?;
            mqtt.session_marker = Some(cfg.data_dir.join(MQTT_SESSIONS_FILE));
        }
        None => {
            // A client id made at each start (the embedded broker keeps no session across one):
            // no device, nor another consumer, takes the consumer's session under
            // `mqtt.client_id`, auth on or off (QA48 N9: with auth off, a client under it took the
            // session, and the readings acked into it went to that client).
            mqtt.client_id = format!("{}-{}", cfg.mqtt.client_id, &query::auth::new_token()[3..19]);
            let broker_auth = cfg.auth.enabled.then(|| {
                // `@` starts no table name, so no device login can claim this username.
                let internal = ("@hourglass-ingest".to_string(), query::auth::new_token());
                mqtt.credentials = Some(internal.clone());
                BrokerAuth {
                    auth: auth.clone(),
                    store: store.clone(),
                    internal,
                    consumers: mqtt.client_ids(),
                    said: Arc::new(std::sync::Mutex::new(ingest::quiet::QuieterByText::every(Duration::from_secs(60)))),
                }
            });
            let spec = BrokerSpec {
                listen: cfg.mqtt.listen,
                max_payload: cfg.mqtt.max_payload_bytes,
                max_inflight: cfg.mqtt.broker_max_inflight,
                backlog_bytes: cfg.mqtt.broker_backlog_mb.saturating_mul(1 << 20),
                auth: broker_auth,
                consumers: mqtt.client_ids(),
                filters: mqtt.filters(),
                stats: mqtt_stats.clone(),
            };
            let listen = tokio::task::spawn_blocking(move || start_embedded_broker(spec)).await??;
            mqtt.host = listen.ip().to_string();
            mqtt.port = listen.port();
            embedded_broker = Some(listen);
            tracing::info!(
                %listen,
                "embedded MQTT broker listening (it acks a QoS 1 publish on receipt: a crash loses what it holds and \
                 Hourglass has not stored; an ordered stop loses nothing, unless the store's commits are failing; \
                 an external broker with persistence keeps it: README, \"Delivery:\")"
            );
        }
    }

    let (tx, rx) = mpsc::channel(cfg.storage.channel_capacity);
    let writer_cfg = WriterConfig { max_batch_readings: cfg.storage.max_batch_readings, ..WriterConfig::default() };
    let writer_stopping = writer_cfg.stopping.clone();
    let writer_store = store.clone();
    let writer_thread = std::thread::Builder::new()
        .name("bucketer".into())
        .spawn(move || writer::run(writer_store, rx, writer_cfg))
        .context("spawning the bucketer thread")?;

    let (retention_stop, stop_rx) = watch::channel(false);
    let retention_every = Duration::from_secs(cfg.storage.retention_interval_s);
    let dead_letter_retention_ms = cfg.storage.dead_letter_retention_ms().map_err(anyhow::Error::msg)?;
    let retention_task = tokio::spawn(run_retention(store.clone(), retention_every, dead_letter_retention_ms, stop_rx));

    let (rollup_stop, stop_rx) = watch::channel(false);
    let rollup_every = Duration::from_millis(cfg.rollup.interval_ms);
    let rollup_thread = BackgroundThread::spawn("rollup").context("spawning the roll-up thread")?;
    let rollup_task =
        tokio::spawn(run_rollups(store.clone(), rollup_every, cfg.rollup.allowed_lateness_ms, stop_rx, rollup_thread));

    let mut sources = Vec::new();
    // Every memory of reported tags reads the store's tag changes, whichever source made them.
    let tag_changes = ingest::lpwire::TagChangesSource::new(store.clone());
    let kafka = if cfg.kafka.enabled {
        let k = &cfg.kafka;
        let kafka_cfg = KafkaConfig {
            brokers: k.brokers.clone(),
            group_id: k.group_id.clone(),
            topics: k.topics.clone(),
            format: k.format,
            topic_tables: k.topic_tables.clone(),
            default_table: (!k.default_table.is_empty()).then(|| k.default_table.clone()),
            wire: WireConfig { max_payload_bytes: cfg.mqtt.max_payload_bytes, lp: lp.clone(), ..WireConfig::default() },
            auto_offset_reset: k.auto_offset_reset,
            session_timeout_ms: k.session_timeout_ms,
            revoke_drain_timeout: Duration::from_millis(k.revoke_drain_timeout_ms),
            commit_interval: Duration::from_millis(k.commit_interval_ms),
            security: k.security(),
            tag_changes: tag_changes.clone(),
            ..KafkaConfig::default()
        };
        let offsets_store = store.clone();
        let stored: StoredOffsets =
            Arc::new(move |topic, partition| offsets_store.kafka_offset(topic, partition).map_err(|e| e.to_string()));
        let stats = Arc::new(MqttStats::default());
        let lag = Arc::new(PartitionLag::default());
        let (control, thread) = ingest::kafka::spawn(kafka_cfg, tx.clone(), stats.clone(), lag.clone(), stored)
            .context("starting the Kafka consumer")?;
        sources.push(query::metrics::IngestSource {
            name: "kafka",
            stats,
            subscribed: control.subscribed.clone(),
            partition_lag: Some(lag),
        });
        Some((control, thread))
    } else {
        None
    };

    // Decoded bodies are prepared for the store on the decoding thread ([`Store`]'s
    // `PrepareBatch`): its single writer then only commits them.
    let preparer = ingest::http::Preparer::new(store.clone());
    let http_intake = Arc::new(
        ingest::http::HttpIntake::new(tx.clone(), lp.clone()).with_preparer(preparer).with_tag_changes(tag_changes),
    );
    // The sources as the metrics list them: MQTT, HTTP, then Kafka.
    let mut state = query::api::AppState::new(store.clone());
    let mqtt = match cfg.mqtt.enabled {
        true => {
            let broker = (mqtt.host.clone(), mqtt.port);
            let (control, task) = ingest::mqtt::spawn(mqtt, tx, mqtt_stats.clone());
            state = state.with_source(query::metrics::IngestSource {
                name: "mqtt",
                stats: mqtt_stats.clone(),
                subscribed: control.subscribed.clone(),
                partition_lag: None,
            });
            Some(MqttIntake { broker, control, task })
        }
        // The writer stops once every intake has dropped its sender.
        false => {
            drop(tx);
            None
        }
    };
    let http_addr = listener.local_addr()?;
    state = state
        .with_intake(http_intake.clone())
        .with_auth((*auth).clone())
        .with_limits(cfg.query_limits())
        .with_checkpoints(cfg.data_dir.join("checkpoints"));
    for source in sources {
        state = state.with_source(source);
    }
    let app = query::api::router(state);
    let (http_stop, stop_rx) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let read_timeout = Duration::from_millis(cfg.http.read_timeout_ms);
    let http_task = match tls {
        None => tokio::spawn(query::server::serve(listener, app, read_timeout, stopped)),
        Some(tls) => {
            let listener = query::tls::TlsListener::new(listener, tls)?;
            tokio::spawn(query::server::serve(listener, app, read_timeout, stopped))
        }
    };
    tracing::info!(%http_addr, scheme = cfg.http.scheme(), "query service listening");
    // The query service answers from here on (`/health`, and `/ready` 503 with its reasons
    // until the sources are subscribed).
    Ok(Running {
        store,
        flusher,
        http_addr,
        http_url: format!("{}://{http_addr}", cfg.http.scheme()),
        mqtt_stats,
        embedded_broker,
        mqtt,
        kafka,
        http_intake,
        writer_thread,
        writer_stopping,
        retention_stop,
        retention_task,
        rollup_stop,
        rollup_task,
        http_stop,
        http_task,
    })
}

impl Running {
    /// The MQTT broker's host and port, for a caller that publishes to it.
    pub(crate) fn mqtt_broker(&self) -> anyhow::Result<(String, u16)> {
        self.mqtt
            .as_ref()
            .map(|m| m.broker.clone())
            .ok_or_else(|| anyhow::anyhow!("MQTT is off (mqtt.enabled = false)"))
    }

    /// Waits until the consumers are subscribed (Kafka: the group joined and its partitions
    /// assigned), each for a bounded time. Ready means subscribed: a publisher that starts once
    /// the ready line is printed loses nothing. An unreachable broker does not stop the query
    /// service; the consumers keep retrying.
    ///
    /// Whether every consumer was subscribed in its time.
    pub(crate) async fn wait_subscribed(&mut self, cfg: &Config) -> bool {
        let mut all = true;
        if let Some((control, _)) = &mut self.kafka {
            let limit = Duration::from_millis(u64::from(cfg.kafka.session_timeout_ms) + 10_000);
            if !control.wait_subscribed(limit).await {
                tracing::warn!(brokers = %cfg.kafka.brokers, "no Kafka assignment yet; still trying");
                all = false;
            }
        }
        if let Some(MqttIntake { broker: (host, port), control, .. }) = &mut self.mqtt {
            if !control.wait_subscribed(Duration::from_secs(10)).await {
                tracing::warn!(%host, port, "not subscribed to the MQTT broker after 10 s; still trying");
                all = false;
            }
        }
        all
    }

    /// Waits, however long, until every consumer is subscribed at once (never, when one has
    /// stopped).
    pub(crate) async fn wait_all_subscribed(&self) {
        let mut each: Vec<watch::Receiver<bool>> = self.kafka.iter().map(|(c, _)| c.subscribed.clone()).collect();
        each.extend(self.mqtt.iter().map(|m| m.control.subscribed.clone()));
        loop {
            for rx in &mut each {
                if rx.wait_for(|v| *v).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            // Each was subscribed when its turn came: all are, unless one has lost it since.
            if each.iter().all(|rx| *rx.borrow()) {
                return;
            }
        }
    }

    /// Ordered shutdown: close the embedded broker to its clients and read what it acked
    /// (`crate::broker_drain`), stop intake, the retention task (a run in progress finishes
    /// its WriteBatch) and the roll-up task's passes, let the bucketer commit and ack what it
    /// has, wait for the roll-up pass in progress (dirty marks left over are done after the next
    /// start), flush acks to the broker, flush RocksDB, then stop the query service.
    ///
    /// With the store's commits failing, the bucketer gives them up (`bucketer::writer`'s docs)
    /// so that the stop ends; the stop then ends in an error saying how many readings were not
    /// stored (none of them acknowledged).
    pub(crate) async fn shutdown(self) -> anyhow::Result<()> {
        self.writer_stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(listen) = self.embedded_broker {
            use crate::broker_drain::{close_and_drain, DRAIN_LIMIT};
            tracing::info!("shutting down: closing the embedded MQTT broker to its clients and reading what it acked");
            let drained = close_and_drain(listen, &self.mqtt_stats, DRAIN_LIMIT).await;
            if drained.left > 0 {
                tracing::warn!(
                    left = drained.left,
                    clients_closed = drained.closed,
                    messages = drained.messages,
                    "the embedded MQTT broker still held messages Hourglass had not read after {} s: they are lost",
                    DRAIN_LIMIT.as_secs()
                );
            } else if drained.closable && !drained.settled {
                tracing::warn!(
                    clients_closed = drained.closed,
                    messages = drained.messages,
                    "clients kept connecting to the embedded MQTT broker for {} s: what they published in its \
                     last second may be lost",
                    DRAIN_LIMIT.as_secs()
                );
            } else if drained.closable {
                tracing::info!(
                    clients_closed = drained.closed,
                    messages = drained.messages,
                    "embedded MQTT broker closed to its clients and read to its end"
                );
            }
        }
        tracing::info!("shutting down: stopping intake");
        if let Some(m) = &self.mqtt {
            let _ = m.control.stop_intake.send(true);
        }
        if let Some((control, _)) = &self.kafka {
            let _ = control.stop_intake.send(true);
        }
        // Writes in flight still get their answer: the query service stops last.
        self.http_intake.stop_intake();
        let _ = self.retention_stop.send(true);
        // No roll-up pass starts from here on either; the one in progress, awaited below, runs
        // beside the drain (its marks, and those of what the drain commits, wait in the store
        // for the next start). Sent later, one more pass could start meanwhile, and with the
        // archive's bucket not answering, a pass takes as long as a retention run.
        let _ = self.rollup_stop.send(true);
        // The pass in progress ends at its next chunk, and the bucket's requests in flight end
        // now (a bucket not answering held a pass for each dirty archived hour's retries, 30 s
        // and more each: a stop took minutes); what they leave is done at the next start.
        self.store.stop_rollups();
        self.store.stop_archive_requests();
        self.retention_task.await.context("retention task")?;
        tracing::info!("retention task stopped");
        let writer = self.writer_thread;
        let not_stored = tokio::task::spawn_blocking(move || writer.join())
            .await?
            .map_err(|_| anyhow::anyhow!("bucketer thread panicked"))?;
        if let Some(flusher) = self.flusher {
            // After a flush in progress; the final flush below takes what is left.
            tokio::task::spawn_blocking(move || flusher.stop()).await?;
        }
        let committed = self.store.stats().readings.load(std::sync::atomic::Ordering::Relaxed);
        tracing::info!(committed, "bucketer drained; stopping the roll-up task");
        self.rollup_task.await.context("roll-up task")?;
        tracing::info!("roll-up task stopped; flushing acks");
        if let Some(m) = self.mqtt {
            let _ = m.control.writer_done.send(true);
            let _ = m.task.await;
        }
        if let Some((control, thread)) = self.kafka {
            let _ = control.writer_done.send(true);
            let left = tokio::task::spawn_blocking(move || thread.join())
                .await?
                .map_err(|_| anyhow::anyhow!("Kafka consumer thread panicked"))?;
            if left {
                tracing::info!("Kafka consumer stopped and out of the group");
            } else {
                tracing::info!("Kafka consumer stopped, still in the group (see the warning above)");
            }
        }
        tracing::info!("acks flushed; flushing RocksDB");
        let store = self.store.clone();
        let flushed = tokio::task::spawn_blocking(move || {
            let flushed = store.flush();
            store.stop_background_work();
            flushed
        })
        .await?;
        match &flushed {
            Ok(()) => tracing::info!("RocksDB flushed and its compactions stopped; stopping the query service"),
            Err(e) => {
                tracing::error!(error = %e, "RocksDB not flushed (its write-ahead log keeps what was committed, unless the filesystem lost the \
                     writes it had not synced: storage.sync_wal); stopping the query service")
            }
        }
        let _ = self.http_stop.send(());
        self.http_task.await?;
        if not_stored.batches > 0 {
            anyhow::bail!(
                "the store's commits failed until the stop: {} readings ({} batch{}) were neither stored nor \
                 acknowledged by Hourglass (an external MQTT broker's QoS 1 session and Kafka deliver them again; HTTP \
                 writers got 500; the embedded broker had acked what it held on receipt, and that is lost)",
                not_stored.readings,
                not_stored.batches,
                if not_stored.batches == 1 { "" } else { "es" }
            );
        }
        flushed?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Runs `work` every `every` (the first time at once) until `stop` turns true or its sender
/// is gone; a run in progress finishes first, and none starts after the stop (a run longer
/// than `every`, as one waiting on a stalled object store is, finds its next tick due at once:
/// the stop is looked at first). `what` names the task in the log when a run fails to complete
/// (a panic).
async fn every_until_stopped<T, F: Future<Output = Result<T, String>>>(
    what: &'static str,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    mut work: impl FnMut() -> F,
    mut done: impl FnMut(T),
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return,
            _ = ticks.tick() => {}
        }
        match work().await {
            Ok(out) => done(out),
            Err(e) => tracing::error!(error = %e, "{what} did not complete; retrying at the next interval"),
        }
    }
}

/// The retention task: moves the partitions that have outlived their table's hot retention to
/// the archive (or drops them, without one), deletes archived partitions past their cold
/// retention, and logs each partition it moves or deletes; then deletes the dead letters older
/// than `dead_letter_retention_ms` (none with `None`), and logs how many.
async fn run_retention(
    store: Arc<Store>,
    every: Duration,
    dead_letter_retention_ms: Option<u64>,
    stop: watch::Receiver<bool>,
) {
    let spilling = store.clone();
    let work = move || {
        let spilling = spilling.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let now = ingest::now_ms();
                let spilled = spilling.spill_expired_partitions(now, |s| {
                    tracing::info!(
                        table = %s.table,
                        partition = %partition_text(&spilling, &s.table, s.partition),
                        rows = s.rows,
                        rows_from_archive = s.rows_from_archive,
                        bytes = s.bytes,
                        location = %s.location(),
                        "retention archived an expired partition"
                    );
                });
                // Said once, at the run that finds them: later runs leave them as quietly.
                for (table, partition, _) in spilled.iter().flat_map(|r| &r.deferred).filter(|d| d.2 == now) {
                    tracing::info!(
                        %table,
                        partition = %partition_text(&spilling, table, *partition),
                        "late readings for an archived partition stay in RocksDB (read as any) until storage.archive_late_wait has passed or they reach a sixteenth of its file, then the partition's file is rewritten with them"
                    );
                }
                let expired = dead_letter_retention_ms.map(|ms| {
                    let before = bucketer::catalog::retention_cutoff_ms(now, ms);
                    (before, spilling.expire_dead_letters(before))
                });
                (spilled, expired)
            })
            .await
            .map_err(|e| e.to_string())
        }
    };
    every_until_stopped("retention run", every, stop, work, |(spilled, expired)| {
        match expired {
            Some((before, Ok(expired))) if expired.count > 0 => {
                let received_before = model::utc_text_ms(before);
                let oldest = expired.oldest_ms.map(model::utc_text_ms).unwrap_or_default();
                tracing::info!(count = expired.count, %oldest, %received_before, "retention deleted expired dead letters");
            }
            Some((_, Err(e))) => {
                tracing::error!(error = %e, "retention could not delete expired dead letters; retrying at the next interval");
            }
            _ => {}
        }
        log_spill_report(&store, spilled);
    })
    .await
}

/// Logs what one retention run did to the partitions of the tables.
/// Partition `index` of `table` as the archive names it (`2024-01-01`, `2024-01-01T05`); the
/// index itself for a table no longer known.
fn partition_text(store: &Store, table: &str, index: i64) -> String {
    store.table(table).map_or_else(|| index.to_string(), |ti| bucketer::archive::partition_label(ti.partition, index))
}

fn log_spill_report(store: &Store, result: bucketer::Result<bucketer::archive::SpillReport>) {
    match result {
        Ok(report) => {
            for (table, partition, error) in report.failed {
                let partition = partition_text(store, &table, partition);
                if error.contains(bucketer::archive::STOPPING) {
                    tracing::info!(%table, %partition, "a partition's spill ended by the stop; it stays in RocksDB");
                    continue;
                }
                tracing::error!(%table, %partition, %error, "retention could not archive a partition; it stays in RocksDB and is retried at the next interval");
            }
            for (table, partition) in report.deleted {
                // The span of a partition follows from its table's partition size.
                let size = store.table(&table).map(|ti| ti.partition);
                let (from, to) = size.map_or_else(Default::default, |size| {
                    (model::utc_text(size.start_ms(partition)), model::utc_text(size.start_ms(partition + 1)))
                });
                let partition = partition_text(store, &table, partition);
                tracing::info!(%table, %partition, %from, %to, "retention deleted an expired partition");
            }
        }
        Err(e) if e.is_stopping() => {
            tracing::info!("retention run ended by the stop; what it left is done at the next start")
        }
        Err(e) => tracing::error!(error = %e, "retention run failed; retrying at the next interval"),
    }
}

/// Dirty hours one roll-up pass recomputes at most, so a stop never waits long for a pass.
const ROLLUP_MAX_HOURS_PER_PASS: usize = 10_000;

/// The roll-up task: one pass of [`Store::process_rollups`] every `every`, on a thread of its
/// own at a lower CPU priority than ingest ([`crate::background`]).
async fn run_rollups(
    store: Arc<Store>,
    every: Duration,
    allowed_lateness_ms: u64,
    stop: watch::Receiver<bool>,
    thread: BackgroundThread,
) {
    let thread = Arc::new(thread);
    let work = move || {
        let (store, thread) = (store.clone(), thread.clone());
        async move { thread.run(move || store.process_rollups(allowed_lateness_ms, ROLLUP_MAX_HOURS_PER_PASS)).await }
    };
    // An hour whose archive cannot be read stays dirty and is met again by each pass: said when
    // its reason changes, else once a minute.
    let mut unreadable_said = ingest::quiet::Quieter::every(Duration::from_secs(60));
    every_until_stopped("roll-up pass", every, stop, work, move |result| match result {
        Ok(s) => {
            if s.unreadable > 0
                && !s.unreadable_reason.as_deref().is_some_and(|r| r.contains(bucketer::archive::STOPPING))
            {
                let reason = s.unreadable_reason.unwrap_or_default();
                if let Some(repeats) = unreadable_said.admit(&reason, std::time::Instant::now()) {
                    tracing::error!(
                        hours = s.unreadable,
                        first = %reason,
                        repeats,
                        "roll-up pass could not read the archive of some hours: they stay dirty and are tried again \
                         at each pass; the other hours are rolled up"
                    );
                }
            }
            if s.hours > 0 {
                tracing::debug!(
                    hours = s.hours,
                    rewritten = s.rewritten,
                    days_from_buckets = s.days_from_buckets,
                    watermark = s.watermark,
                    "roll-up pass"
                );
            }
            if s.past_rollup_retention > 0 {
                tracing::info!(
                    hours = s.past_rollup_retention,
                    "roll-up pass left hours of days past their table's roll-up retention as they were (past the \
                     day roll-up retention too, or with readings deleted for good: their roll-ups are not redone)"
                );
            }
            if s.kept_past_retention > 0 {
                tracing::info!(
                    hours = s.kept_past_retention,
                    "roll-up pass left hours written to after their roll-up and the delete for good of their \
                     readings as they were: their roll-ups keep what was deleted, the new readings are stored but \
                     not rolled up"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "roll-up pass failed; retrying at the next interval"),
    })
    .await
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    StopSignals::listen().recv().await;
}

/// SIGINT, SIGTERM and SIGHUP, listened for from when this is made (inside the runtime): one
/// that arrives while the pipeline starts is kept for [`StopSignals::recv`] instead of ending the
/// process without the ordered stop. SIGHUP, a terminal closed under a `serve` started from it,
/// ended the process at once by default, as a crash, losing what the embedded broker held.
pub(crate) struct StopSignals {
    #[cfg(unix)]
    signals: Option<[tokio::signal::unix::Signal; 3]>,
}

impl StopSignals {
    pub(crate) fn listen() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
                (Ok(int), Ok(term), Ok(hup)) => StopSignals { signals: Some([int, term, hup]) },
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                    tracing::warn!(error = %e, "cannot listen for SIGINT, SIGTERM and SIGHUP; only Ctrl-C stops Hourglass");
                    StopSignals { signals: None }
                }
            }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// Resolves on the next SIGINT, SIGTERM or SIGHUP (at once for one received since the last
    /// call).
    pub(crate) async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some([int, term, hup]) = &mut self.signals {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
                _ = hup.recv() => {},
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop asked during a run longer than the interval: no run starts after it (before,
    /// the due tick and the stop were picked at random, so a stop waited for one more run
    /// half the time). Twenty tasks, so a coin's pick would show.
    #[tokio::test]
    async fn no_run_starts_after_the_stop() {
        for _ in 0..20 {
            let (tx, rx) = watch::channel(false);
            let runs = std::sync::atomic::AtomicUsize::new(0);
            let work = || {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = tx.send(true);
                async {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    Ok::<(), String>(())
                }
            };
            every_until_stopped("test run", Duration::from_millis(5), rx, work, |()| {}).await;
            assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }

    /// `storage.background_jobs` is what RocksDB runs with: one a core (at least 2) for 0.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn storage_background_jobs_reach_rocksdb() {
        let cores = std::thread::available_parallelism().unwrap().get();
        for (jobs, want) in [(0, cores.clamp(2, 16)), (5, 5)] {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
            cfg.storage.background_jobs = jobs;
            drop(Store::open(&dir.path().join("rocksdb"), store_config(&cfg)).unwrap());
            // What RocksDB was opened with: its newest OPTIONS file.
            let options = bucketer::store::persisted_options(&dir.path().join("rocksdb")).unwrap().unwrap();
            assert_eq!(options["DBOptions"]["max_background_jobs"], want.to_string(), "storage.background_jobs {jobs}");
        }
    }

    /// `hourglass compact` splits its compactions across every core, whatever the store is
    /// configured with, and leaves every reading readable.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn compact_splits_across_every_core_and_keeps_the_readings() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
        let reading = |i: i64| model::DeviceReading {
            table: "t.one".into(),
            device: format!("d{}", i % 4).into(),
            reading: model::Reading::new(1_704_067_200_000 + i * 60_000, vec![(Arc::from("v"), i as f64)]),
        };
        {
            let store = Store::open(&dir.path().join("rocksdb"), store_config(&cfg)).unwrap();
            for chunk in (0..60).collect::<Vec<i64>>().chunks(15) {
                store.write(chunk.iter().map(|&i| reading(i)).collect(), &[]).unwrap();
                store.flush().unwrap();
            }
        }
        let cores = std::thread::available_parallelism().unwrap().get() as u64;
        let report = compact(&cfg).unwrap();
        assert_eq!(report["subcompactions"], cores.max(1));
        assert!(report["bytes_after"].as_u64().unwrap() > 0, "{report}");
        // What RocksDB was opened with: its newest OPTIONS file.
        let options = bucketer::store::persisted_options(&dir.path().join("rocksdb")).unwrap().unwrap();
        assert_eq!(options["DBOptions"]["max_subcompactions"], cores.max(1).to_string());
        let store = Store::open(&dir.path().join("rocksdb"), store_config(&cfg)).unwrap();
        let want: Vec<model::Reading> = (0..60).filter(|i| i % 4 == 1).map(|i| reading(i).reading).collect();
        let all = model::TimeRange::new(1_704_067_200_000, 1_704_067_200_000 + model::HOUR_MS).unwrap();
        assert_eq!(store.read_range("t.one", "d1", all).unwrap(), Some(want));
    }

    #[test]
    fn broker_segments_hold_the_backlog() {
        assert_eq!(broker_segments(1000 << 20), (100 << 20, 10));
        assert_eq!(broker_segments(250 << 20), (100 << 20, 2));
        assert_eq!(broker_segments(150 << 20), (75 << 20, 2));
        assert_eq!(broker_segments(1 << 20), (512 << 10, 2));
        assert_eq!(broker_segments(1), (1, 2));
    }

    /// Polls `eventloop` until `done` says so, at most `limit`; panics on a connection error.
    async fn poll_until(
        eventloop: &mut rumqttc::EventLoop,
        limit: Duration,
        mut done: impl FnMut(&rumqttc::Event) -> bool,
    ) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            match tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await {
                Ok(Ok(event)) if done(&event) => return true,
                Ok(Ok(_)) | Err(_) => {}
                Ok(Err(e)) => panic!("MQTT connection: {e}"),
            }
        }
        false
    }

    const MESSAGES: u32 = 1000;
    /// What the broker's meters say it took: the messages, and their bytes in its log (4, the
    /// topic `skip/t` and 8 KiB of payload each).
    const PUBLISHED: (u64, u64) = (MESSAGES as u64, MESSAGES as u64 * (4 + 6 + (8 << 10)));

    /// An embedded broker holding 256 KiB for its subscribers, whose skips of `counted` are
    /// counted. Subscriber `slow` stops reading while 8 MiB are published to `{prefix}/t` (1000
    /// messages, each starting with its index), then reads until the last. Returns the skips
    /// counted and the messages they lost, the indices `slow` received and the messages and log
    /// bytes the broker's meters say it took on `{prefix}/#`.
    ///
    /// The process notes the broker's cursor jumps as `serve` does (a global subscriber, for
    /// every test of this binary); `prefix`, four characters, tells this test's jumps from
    /// another's running alongside.
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    fn publish_past_a_stalled_subscriber(counted: &str, prefix: &str) -> ((u64, u64), Vec<u32>, (u64, u64)) {
        use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
        assert_eq!(prefix.len(), 4, "PUBLISHED counts a 6-byte topic");
        crate::logging::note_cursor_jumps_in_tests();
        let (filter, topic) = (format!("{prefix}/#"), format!("{prefix}/t"));
        let stats = Arc::new(MqttStats::default());
        let addr = start_embedded_broker(BrokerSpec {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_payload: 1 << 20,
            max_inflight: 10,
            backlog_bytes: 256 << 10,
            auth: None,
            consumers: vec![counted.into()],
            filters: vec![filter.clone()],
            stats: stats.clone(),
        })
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let options = |id: &str| {
                let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
                o.set_max_packet_size(1 << 20, 1 << 20);
                o
            };
            let index = |e: &Event| match e {
                Event::Incoming(Packet::Publish(p)) => Some(u32::from_be_bytes(p.payload[..4].try_into().unwrap())),
                _ => None,
            };
            let (_slow, mut slow_loop) = AsyncClient::new(options("slow"), 10);
            _slow.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
            let subscribed = poll_until(&mut slow_loop, Duration::from_secs(10), |e| {
                matches!(e, Event::Incoming(Packet::SubAck(_)))
            })
            .await;
            assert!(subscribed, "no SUBACK");

            // `slow` is not polled while these are published and acknowledged.
            let (publisher, mut publisher_loop) = AsyncClient::new(options("fast-publisher"), 10);
            let publishing = tokio::spawn(async move {
                for i in 0..MESSAGES {
                    let mut payload = vec![b'x'; 8 << 10];
                    payload[..4].copy_from_slice(&i.to_be_bytes());
                    publisher.publish(topic.as_str(), QoS::AtLeastOnce, false, payload).await.unwrap();
                }
            });
            let mut acked = 0;
            let all_acked = poll_until(&mut publisher_loop, Duration::from_secs(30), |e| {
                acked += u32::from(matches!(e, Event::Incoming(Packet::PubAck(_))));
                acked == MESSAGES
            })
            .await;
            publishing.await.unwrap();
            assert!(all_acked, "{acked} of {MESSAGES} acknowledged");

            let mut slow = Vec::new();
            poll_until(&mut slow_loop, Duration::from_secs(30), |e| {
                slow.extend(index(e));
                slow.last() == Some(&(MESSAGES - 1))
            })
            .await;
            // Alerts are pushed every second: wait for one, then a little more for any other.
            let until = Instant::now() + Duration::from_secs(5);
            while stats.broker_skips.load(std::sync::atomic::Ordering::Relaxed) == 0 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let published = &stats.broker_published;
            let until = Instant::now() + Duration::from_secs(5);
            while published.load(std::sync::atomic::Ordering::Relaxed) < u64::from(MESSAGES) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let skips = stats.broker_skips.load(std::sync::atomic::Ordering::Relaxed);
            let lost = stats.broker_skipped_messages.load(std::sync::atomic::Ordering::Relaxed);
            // The count before the bytes: the watcher adds them the other way round.
            let count = published.load(std::sync::atomic::Ordering::Acquire);
            let bytes = stats.broker_published_bytes.load(std::sync::atomic::Ordering::Relaxed);
            ((skips, lost), slow, (count, bytes))
        })
    }

    /// The backlog's gauges (messages, bytes) had Hourglass's consumer received `received` of
    /// the messages the meters say were `published` and its skips lost `lost` of them: it
    /// counts each message received as `decode_publish` does, [`PUBLISHED`]'s size.
    fn backlog_had_it_received(published: (u64, u64), lost: u64, received: usize) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = MqttStats::default();
        stats.broker_published.store(published.0, Relaxed);
        stats.broker_published_bytes.store(published.1, Relaxed);
        stats.broker_skipped_messages.store(lost, Relaxed);
        stats.messages.store(received as u64, Relaxed);
        stats.log_bytes.store(received as u64 * (PUBLISHED.1 / PUBLISHED.0), Relaxed);
        (stats.broker_backlog(), stats.broker_backlog_bytes())
    }

    /// The consumer stalled past the backlog loses the oldest messages it had not read: the
    /// broker skips it ahead to the oldest message it holds (while it is stalled and again as it
    /// resumes, as often as the log turned over in between), and each skip is counted: every gap
    /// in what it received is at least one. It gets every other message up to the last, in
    /// order.
    ///
    /// A jump can also lose nothing: a cursor left at the very end of a segment that is then
    /// dropped jumps to the next segment's first message, its next one (seen once in CI before
    /// the jumps' losses were read, 4 skips for 3 gaps): that one is not counted. The messages
    /// the skips lost, from the router's warnings, are exactly those that never arrived. A skip
    /// needs a dropped segment, so there are at most as many as segments dropped: the published
    /// bytes over the segment size (128 KiB, half the 256 KiB backlog).
    #[test]
    fn a_consumer_left_behind_by_the_backlog_is_counted_as_skipped() {
        let ((skips, lost), slow, published) = publish_past_a_stalled_subscriber("slow", "skip");
        assert_eq!(published, PUBLISHED);
        assert_eq!(slow.last(), Some(&(MESSAGES - 1)), "{slow:?}");
        assert!(slow.windows(2).all(|w| w[0] < w[1]), "{slow:?}");
        let gaps = slow.windows(2).filter(|w| w[1] != w[0] + 1).count() + usize::from(slow[0] != 0);
        assert!(gaps >= 1 && slow.len() < MESSAGES as usize / 2, "{} received: {slow:?}", slow.len());
        let (segment, _) = broker_segments(256 << 10);
        let segments_dropped = PUBLISHED.1 / segment as u64;
        assert!(
            (gaps as u64..=segments_dropped).contains(&skips),
            "{skips} skips counted for {gaps} gaps in what arrived (at most {segments_dropped})"
        );
        // What the skips lost is exactly what never arrived.
        assert_eq!(lost, u64::from(MESSAGES) - slow.len() as u64);
        // So, had the stalled subscriber been Hourglass's, nothing would be held for it once it
        // read the last message: neither messages nor their bytes.
        assert_eq!(backlog_had_it_received(published, lost, slow.len()), (0, 0));
        // Half-way through what it received, the other half would be held, with its bytes.
        let half = slow.len() / 2;
        let rest = (slow.len() - half) as u64;
        assert_eq!(backlog_had_it_received(published, lost, half), (rest, rest * (PUBLISHED.1 / PUBLISHED.0)));
    }

    /// Only skips of Hourglass's own consumer count: another subscriber's are not its loss.
    #[test]
    fn another_subscriber_skipped_is_not_counted() {
        let ((skips, lost), slow, published) = publish_past_a_stalled_subscriber("hourglass-ingest", "slip");
        assert_eq!(published, PUBLISHED, "the meters count the subscription, whoever reads it");
        assert_eq!(slow.last(), Some(&(MESSAGES - 1)), "{slow:?}");
        assert!(slow.len() < MESSAGES as usize / 2, "{} received by the stalled one", slow.len());
        assert_eq!((skips, lost), (0, 0));
    }
}
