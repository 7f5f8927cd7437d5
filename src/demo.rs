//! `hourglass demo` (the pipeline plus a simulated fleet) and `hourglass bench` (load tests
//! through the real paths). The generators and drivers live in the `bench` crate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fleet::{Fleet, FleetSpec};
use bench::mqtt::MqttSpec;
use bucketer::{Store, StoreConfig};
use clap::Subcommand;
use tokio::sync::watch;

use crate::config::Config;
use crate::{say, serve};

/// The store settings of the bench commands that start a store (`bench replay` too):
/// `--write-buffer-mb`, `--compaction`, `--subcompactions` and `--background-jobs`, with `serve`'s
/// defaults.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct StoreArgs {
    /// MiB of open hour buckets kept in memory (`storage.write_buffer_mb`; 128 by default, as
    /// `serve`'s); 0: every batch written straight to its buckets.
    #[arg(long = "write-buffer-mb", default_value_t = crate::config::DEFAULT_WRITE_BUFFER_MB)]
    pub(crate) mib: u64,
    /// RocksDB compaction of buckets and latest values (`storage.compaction`).
    #[arg(long, value_enum, default_value_t = crate::config::Compaction::Leveled)]
    pub(crate) compaction: crate::config::Compaction,
    /// Threads a RocksDB compaction of level 0 is split across (`storage.subcompactions`); 1:
    /// none.
    #[arg(long, default_value_t = bucketer::DEFAULT_SUBCOMPACTIONS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_SUBCOMPACTIONS)))]
    pub(crate) subcompactions: u32,
    /// RocksDB's background jobs, flushes and compactions (`storage.background_jobs`): 0 (one
    /// a core, at least 2) or from 2 to 64.
    #[arg(long = "background-jobs", default_value_t = 0, value_parser = parse_background_jobs)]
    pub(crate) background_jobs: u32,
}

/// Reads `--background-jobs`: 0, or from 2 to [`crate::config::MAX_BACKGROUND_JOBS`].
fn parse_background_jobs(text: &str) -> Result<u32, String> {
    let jobs: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if crate::config::valid_background_jobs(jobs) {
        Ok(jobs)
    } else {
        Err(crate::config::background_jobs_rule())
    }
}

impl StoreArgs {
    /// A store configured with these settings, the rest as [`StoreConfig::default`].
    fn store_config(self) -> StoreConfig {
        StoreConfig {
            write_buffer: bucketer::WriteBufferConfig::of_mib(self.mib),
            db: bucketer::DbOptions {
                compaction: self.compaction.into(),
                subcompactions: self.subcompactions,
                background_jobs: crate::config::background_jobs(self.background_jobs),
                ..bucketer::DbOptions::default()
            },
            ..StoreConfig::default()
        }
    }
}

/// `hourglass bench ...`
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// In-process storage write path (no broker): readings/s, then bytes per value after a
    /// full compaction.
    Storage {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Ticks of the whole fleet (readings = devices × ticks).
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
        ticks: u64,
        /// Readings per WriteBatch.
        #[arg(long, default_value_t = 100_000)]
        batch_readings: usize,
        /// Seconds between two readings of a truck.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
        interval_s: i64,
        /// fsync the WAL on every commit.
        #[arg(long)]
        sync_wal: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Bytes per value of typed fields, in process: the TSBS diagnostics `status` as an i64, an
    /// engine-on bool and a driver string, each alone in a store of its own (and status and
    /// engine-on as f64 for comparison), after a full compaction.
    TypedFields {
        /// Trucks.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Readings per truck.
        #[arg(long, default_value_t = 2160, value_parser = clap::value_parser!(u64).range(1..))]
        ticks: u64,
        /// Seconds between two readings of a truck.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
        interval_s: i64,
        /// Seed of the workload.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// The Parquet archive on the TSBS-style workload, in process: write it into tables whose
    /// hot retention has long passed, spill every partition, and read devices back from the
    /// archive; file bytes per field value, spill rate, archived read latency.
    Archive {
        /// Trucks.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Ticks (readings per truck and table); 360 at 10 s is one hour.
        #[arg(long, default_value_t = 360, value_parser = clap::value_parser!(u64).range(1..))]
        ticks: u64,
        /// Archived reads of one truck's whole `readings`.
        #[arg(long, default_value_t = 200)]
        reads: u64,
        /// Rows per Parquet row group.
        #[arg(long, default_value_t = 65_536)]
        row_group_rows: usize,
        /// zstd level of the Parquet pages.
        #[arg(long, default_value_t = 3)]
        zstd_level: i32,
        /// Late readings written afterwards into the first archived day of `readings` (one
        /// each for this many trucks), then one more spill run timed: 0 for none.
        #[arg(long, default_value_t = 0)]
        late: u64,
        /// `storage.archive_late_wait` of the store, seconds (0: the next run rewrites the
        /// partition with its late readings).
        #[arg(long, default_value_t = 86_400)]
        late_wait_s: u64,
    },
    /// The device registry at scale, in process: write one reading for each of `--devices`
    /// new devices (registering them), then one more for each known device; readings/s of each
    /// pass and the process's peak RSS.
    Devices {
        /// Devices.
        #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Readings (devices) per WriteBatch.
        #[arg(long, default_value_t = 50_000)]
        batch_readings: u64,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// The roll-up stage in process: catch-up speed (device-hours/s), then roll-up lag while
    /// ingest runs at `--rate` for `--seconds`.
    Rollups {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Groups the trucks are spread over (under ten sites).
        #[arg(long, default_value_t = 100)]
        groups: u64,
        /// Seconds between two readings of a truck.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
        interval_s: i64,
        /// Simulated hours written before the catch-up passes.
        #[arg(long, default_value_t = 2)]
        hours: u64,
        /// Ingest rate of the sustained phase, readings/s (0: as fast as possible).
        #[arg(long, default_value_t = 1_000_000.0)]
        rate: f64,
        /// Wall seconds of the sustained phase.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Query-service latency over HTTP while a writer commits readings: one device-day of raw
    /// readings (8,640 at 10 s) and the latest reading of every device in one request.
    Queries {
        /// Devices with data; the latest query asks for all of them.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Devices carrying a whole day at 10 s (raw reads rotate over them).
        #[arg(long, default_value_t = 10)]
        day_devices: u64,
        /// Queries of each kind.
        #[arg(long, default_value_t = 1000)]
        queries: u64,
        /// Queries per second of each kind (open loop).
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        /// Readings per second the concurrent writer commits.
        #[arg(long, default_value_t = 20_000.0)]
        ingest_rate: f64,
        /// Move the day of history to the Parquet archive before querying (the table gets a
        /// hot retention of one day), so raw reads are archived reads.
        #[arg(long)]
        archived: bool,
    },
    /// Roll-up query latency: a device's 31 daily records, a group's and the table's 24 hourly
    /// records of a day, read and rendered as JSON.
    RollupQueries {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Groups the trucks are spread over (under ten sites).
        #[arg(long, default_value_t = 10)]
        groups: u64,
        /// Seconds between two readings of a truck.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(i64).range(1..))]
        interval_s: i64,
        /// Days of data (at least 32).
        #[arg(long, default_value_t = 33)]
        days: u64,
        /// Queries of each kind.
        #[arg(long, default_value_t = 2000)]
        queries: u64,
    },
    /// The whole MQTT path, through the embedded broker or `--mqtt-url`: publish, wait until
    /// stored.
    Mqtt {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Ticks of the whole fleet.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        ticks: u64,
        /// Readings per MQTT message.
        #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        per_message: usize,
        /// Publishing connections.
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        connections: usize,
        /// QoS of the publishers (0 or 1).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
        qos: u8,
        /// Publish through this external broker (mqtt://host:port, plain TCP without a login)
        /// instead of an embedded one;
        /// the pipeline under test consumes from it with a client id of its own.
        #[arg(long)]
        mqtt_url: Option<String>,
    },
    /// The whole Kafka path through an external broker: produce the fleet to an existing topic,
    /// read it all with a bare rdkafka consumer (the broker's ceiling), then let the pipeline
    /// consume it (a fresh consumer group) and wait until every reading is stored.
    Kafka {
        /// Bootstrap brokers.
        #[arg(long)]
        brokers: String,
        /// An existing, empty topic.
        #[arg(long)]
        topic: String,
        /// Its partition count.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        devices: u64,
        /// Ticks of the whole fleet.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        ticks: u64,
        /// Readings per Kafka message.
        #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        per_message: usize,
    },
    /// Writes a TSBS IoT workload (readings + diagnostics) to a recording file, and optionally
    /// the same workload as InfluxDB line protocol (with a `.meta.json`) for the peers.
    Record(crate::harness::RecordArgs),
    /// Sends a workload (a recording, or generated on the fly) through the pipeline open-loop
    /// and measures throughput, end-to-end and query latency, peak RSS and bytes per value.
    Replay(Box<crate::harness::ReplayArgs>),
    /// Draws a run's Markdown summary and chart again from its `report.json` (a replay's
    /// report), with this binary's code.
    Report(crate::harness::ReportArgs),
}

/// Points the query service and the embedded broker at port 0 of 127.0.0.1: each takes a port
/// the kernel picks as it binds, and `serve::start` reports which. A port found free beforehand
/// can be taken by any other process before it is bound.
pub(crate) fn on_free_loopback_ports(cfg: &mut Config) {
    cfg.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.mqtt.listen = SocketAddr::from(([127, 0, 0, 1], 0));
}

fn now_ms() -> i64 {
    ingest::now_ms()
}

/// Most trucks the demo simulates: their names are held in memory (about 50 bytes each), and
/// `--devices 4294967296` grew the process to 23 GB before the kernel killed it (QA56 F1).
/// `hourglass bench` replays larger fleets from a workload file.
const MAX_DEVICES: u64 = 10_000_000;
/// Longest time between two readings of a truck: a day.
const MAX_INTERVAL_MS: i64 = model::DAY_MS;
/// Most hours of history the demo publishes at its start: ten years.
const MAX_BACKFILL_HOURS: u64 = 87_600;

/// `hourglass demo`.
pub(crate) async fn demo(mut cfg: Config, devices: u64, interval_ms: i64, backfill_hours: u64) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_DEVICES).contains(&devices),
        "--devices must be from 1 to {MAX_DEVICES} (the demo holds its trucks' names in memory; `hourglass bench` \
         replays larger fleets)"
    );
    anyhow::ensure!(
        (100..=MAX_INTERVAL_MS).contains(&interval_ms),
        "--interval-ms must be from 100 to {MAX_INTERVAL_MS} (a day)"
    );
    anyhow::ensure!(
        backfill_hours <= MAX_BACKFILL_HOURS,
        "--backfill-hours must be at most {MAX_BACKFILL_HOURS} (ten years)"
    );
    // The local demo runs without tokens (the start logs a warning), so on loopback only: said
    // here in the demo's words (the check blamed `auth.enabled`, which its user never set:
    // QA56 F11).
    anyhow::ensure!(
        cfg.listens_on_loopback_only(),
        "the demo runs without tokens, so it listens on loopback only: give --http-listen and --mqtt-listen a \
         loopback address such as 127.0.0.1:8080 (they are {} and {}); for other hosts run `hourglass serve` with auth",
        cfg.http.listen,
        cfg.mqtt.listen
    );
    cfg.auth.enabled = false;
    anyhow::ensure!(cfg.mqtt.enabled, "the demo's fleet publishes over MQTT: it needs mqtt.enabled = true");
    // Listened for before the start: a Ctrl-C while it starts is an ordered stop once it has
    // started, and a second one quits at once, as `serve`'s.
    let mut signals = serve::StopSignals::listen();
    let Some(mut running) = crate::start_or_quit(&cfg, &mut signals).await? else {
        return Ok(());
    };
    tokio::select! {
        _ = running.wait_subscribed(&cfg) => {}
        () = signals.recv() => return crate::stop_in_order(running, &mut signals).await,
    }
    let (mqtt_host, mqtt_port) = running.mqtt_broker()?;
    let backfill_ticks = (backfill_hours as i64 * model::HOUR_MS / interval_ms) as u64;
    let now = now_ms();
    let start_ms = (now - backfill_ticks as i64 * interval_ms).div_euclid(interval_ms) * interval_ms;
    let fleet = Arc::new(Fleet::new(FleetSpec { devices, interval_ms, start_ms, ..FleetSpec::default() }));
    let table = fleet.spec().table.clone();
    let http = running.http_url.clone();
    say(&format!(
        "Hourglass demo: {devices} truck{} publish{} to {mqtt_host}:{mqtt_port} every {} s.",
        if devices == 1 { "" } else { "s" },
        if devices == 1 { "es" } else { "" },
        interval_ms as f64 / 1000.0
    ));
    say(&format!("Dashboard: {http}/   Metrics: {http}/metrics"));
    say("Try:");
    say(&format!("  curl '{http}/v1/tables'"));
    let trucks: Vec<String> = (0..devices.min(3)).map(|d| format!("truck_{d}")).collect();
    say(&format!("  curl '{http}/v1/tables/{table}/latest?devices={}'", trucks.join(",")));
    let (from, to) = try_range(start_ms, backfill_ticks, interval_ms, cfg.query.max_range_ms);
    say(&format!("  curl '{http}/v1/tables/{table}/devices/truck_0/readings?from={from}&to={to}'"));
    say(&format!("  curl '{http}/v1/dead-letters?limit=10'"));
    say(&format!(
        "  mosquitto_pub -p {mqtt_port} -t hourglass/{table}/my_truck -q 1 -m '{{\"ts\": {now}, \"velocity\": 42.5}}'"
    ));
    say("Ctrl-C stops it (ordered shutdown: every reading the broker acked is stored).");

    let spec = MqttSpec {
        host: mqtt_host.clone(),
        port: mqtt_port,
        topic_prefix: cfg.mqtt.topic_prefix.clone(),
        connections: 4,
        readings_per_message: 100,
        first_tick: 0,
        ticks: backfill_ticks,
        qos: 1,
    };
    let limit = store_pace(&cfg, &running, spec.readings_per_message);
    let (stop_fleet, stop) = tokio::sync::watch::channel(false);
    let mut simulator = tokio::spawn(simulate(fleet, spec, limit, stop));
    signals.recv().await;
    // The fleet first: the ordered stop closes the broker to outside clients only, so trucks
    // still publishing (a backfill goes on for minutes) kept it taking messages for its 30 s,
    // and what it held then was lost (QA56 F8). What the broker acked them is read by the
    // stop; what it did not is not acknowledged.
    let _ = stop_fleet.send(true);
    if tokio::time::timeout(FLEET_STOP, &mut simulator).await.is_err() {
        tracing::warn!("the simulated fleet did not disconnect within {} s; stopping it", FLEET_STOP.as_secs());
        simulator.abort();
    }
    crate::stop_in_order(running, &mut signals).await
}

/// How long the simulated fleet has to disconnect once told to stop.
const FLEET_STOP: Duration = Duration::from_secs(5);

/// The demo's trucks: the backfill as fast as the store takes it (`limit`), then a tick every
/// interval in real time, until `stop` turns true; then they disconnect.
async fn simulate(fleet: Arc<Fleet>, spec: MqttSpec, limit: bench::run::BacklogLimit, mut stop: watch::Receiver<bool>) {
    let sent = Arc::new(AtomicU64::new(0));
    let backfill_ticks = spec.ticks;
    if backfill_ticks > 0 {
        match bench::mqtt::publish(fleet.clone(), spec.clone(), sent.clone(), Some(limit), Some(stop.clone())).await {
            Ok(r) => tracing::info!(readings = r.readings, seconds = r.publish_seconds, "backfill published"),
            Err(e) if e == bench::mqtt::STOPPED => {
                tracing::info!("backfill stopped: its publishers disconnected");
                return;
            }
            Err(e) => tracing::error!(error = %e, "backfill failed"),
        }
    }
    // The live trucks keep their connections (a connection a tick left the broker logging
    // every disconnect as an error).
    let live = bench::mqtt::LivePublishers::connect(fleet.clone(), &spec, sent);
    let mut tick = backfill_ticks;
    // Told to stop, or its sender gone.
    let stopped = async {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    loop {
        let due = fleet.tick_ts(tick);
        let publish = async {
            let wait = due - now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            if let Err(e) = live.publish_tick(tick).await {
                tracing::warn!(error = %e, tick, "simulated fleet could not publish");
            }
        };
        tokio::select! {
            () = &mut stopped => break,
            () = publish => tick += 1,
        }
    }
    live.close().await;
}

/// The range of the raw read the demo suggests: truck_0's backfill and first live reading,
/// cut to its last `max_range_ms` (a longer range is refused).
fn try_range(start_ms: i64, backfill_ticks: u64, interval_ms: i64, max_range_ms: u64) -> (i64, i64) {
    let to = start_ms + (backfill_ticks as i64 + 1) * interval_ms;
    (start_ms.max(to - i64::try_from(max_range_ms).unwrap_or(i64::MAX)), to)
}

/// How far publishers as fast as the broker acks may run ahead of `running`'s store: the
/// broker acks on receipt and drops what its backlog cannot hold, so the demo's backfill (an
/// hour of 3,000 trucks at 1 s is 10.8M readings) lost 29% of itself to the embedded broker,
/// and a closed-loop `bench mqtt` would too. Through the embedded broker, a quarter of
/// `mqtt.broker_backlog_mb` at [`BROKER_BYTES_A_READING`], at most the harness's default
/// (500,000 readings); through an external one, 250 messages (a quarter of mosquitto's default
/// queue for a subscriber); at least 4 messages. A store that stores nothing for a minute fails
/// the publishing.
fn store_pace(cfg: &Config, running: &serve::Running, per_message: usize) -> bench::run::BacklogLimit {
    let cap = if cfg.mqtt.url.is_some() {
        crate::harness::EXTERNAL_BROKER_MESSAGES * per_message.max(1) as u64
    } else {
        (cfg.mqtt.broker_backlog_mb << 20) / 4 / BROKER_BYTES_A_READING
    };
    let store = running.store.clone();
    let stored = Arc::new(move || store.stats().readings.load(Ordering::Relaxed));
    // Room for a few messages whatever the backlog: a message larger than the room would wait for good.
    let cap = cap.min(crate::harness::DEFAULT_MAX_BACKLOG).max(4 * per_message.max(1) as u64);
    bench::run::BacklogLimit::new(cap, stored, Duration::from_secs(60))
}

/// What a reading of the simulated fleet takes in the embedded broker's backlog, at most: its
/// share of a message of gateway JSON, and the broker's own keeping.
const BROKER_BYTES_A_READING: u64 = 200;

/// `hourglass bench ...`: prints a JSON report on stdout.
pub(crate) async fn bench(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Record(args) => crate::harness::record(args).await,
        BenchCommand::Report(args) => crate::harness::report(&args),
        BenchCommand::Replay(args) => crate::harness::replay(*args).await,
        BenchCommand::Storage { devices, ticks, batch_readings, interval_s, sync_wal, store: args } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let store = Arc::new(Store::open(&path, StoreConfig { sync_wal, ..args.store_config() })?);
                // As `serve`: a due write buffer is flushed beside the writes.
                let flusher = store.start_flusher()?;
                let fleet = Fleet::new(FleetSpec { devices, interval_ms: interval_s * 1000, ..FleetSpec::default() });
                let spec = bench::storage::StorageSpec { ticks, batch_readings };
                let mut last = Instant::now();
                let report = bench::storage::run(&store, &fleet, &spec, |done, total| {
                    if last.elapsed() > Duration::from_secs(5) {
                        last = Instant::now();
                        tracing::info!(done, total, "ticks written");
                    }
                })?;
                drop(flusher);
                let started = Instant::now();
                store.compact()?;
                let compact_s = started.elapsed().as_secs_f64();
                let sst = store.bucket_sst_bytes()?;
                let (buckets, raw_bytes, values) = store.bucket_scan_stats()?;
                anyhow::ensure!(values == report.values, "stored {values} values, wrote {}", report.values);
                Ok(serde_json::json!({
                    "bench": "storage",
                    "report": report,
                    "sync_wal": sync_wal,
                    "write_buffer_mb": args.mib,
                    "compaction": args.compaction,
                    "subcompactions": args.subcompactions,
                    "background_jobs": crate::config::background_jobs(args.background_jobs),
                    "compaction_seconds": compact_s,
                    "buckets": buckets,
                    "bucket_sst_bytes": sst,
                    "sst_bytes_per_value": sst as f64 / values as f64,
                    "key_plus_value_bytes_per_value": raw_bytes as f64 / values as f64,
                }))
            })
            .await??;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::TypedFields { devices, ticks, interval_s, seed } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let spec = bench::typed::TypedSpec { devices, ticks, interval_ms: interval_s * 1000, seed };
            let results = tokio::task::spawn_blocking(move || bench::typed::run(&path, &spec)).await??;
            let report = serde_json::json!({
                "bench": "typed-fields",
                "devices": devices,
                "ticks": ticks,
                "interval_s": interval_s,
                "seed": seed,
                "results": results,
            });
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Archive { devices, ticks, reads, row_group_rows, zstd_level, late, late_wait_s } => {
            anyhow::ensure!(row_group_rows >= 1, "--row-group-rows must be at least 1");
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let mut archive = bucketer::archive::ArchiveConfig::new(path.join("archive"));
                archive.file = bucketer::archive::FileSettings { row_group_rows, zstd_level };
                archive.late_rewrite_wait = Duration::from_secs(late_wait_s);
                let store =
                    Store::open(&path.join("db"), StoreConfig { archive: Some(archive), ..StoreConfig::default() })?;
                let workload = bench::workload::WorkloadSpec { devices, ticks, ..Default::default() };
                let spec =
                    bench::archive::ArchiveSpec { workload: workload.clone(), batch_points: 10_000, reads, late };
                let report = bench::archive::run(&store, &spec, |what| tracing::info!("{what}"))?;
                Ok(serde_json::json!({
                    "bench": "archive",
                    "workload": workload,
                    "row_group_rows": row_group_rows,
                    "zstd_level": zstd_level,
                    "late_wait_s": late_wait_s,
                    "report": report,
                }))
            })
            .await??;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Devices { devices, batch_readings, store: args } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let store = Arc::new(Store::open(&path, args.store_config())?);
                let flusher = store.start_flusher()?;
                let fleet = Fleet::new(FleetSpec { devices, ..FleetSpec::default() });
                let mut last = Instant::now();
                let report = bench::storage::registry_scale(&store, &fleet, batch_readings, |done, total| {
                    if last.elapsed() > Duration::from_secs(5) {
                        last = Instant::now();
                        tracing::info!(done, total, "readings written");
                    }
                })?;
                drop(flusher);
                anyhow::ensure!(store.device_count() as u64 == devices, "{} devices registered", store.device_count());
                Ok(serde_json::json!({
                    "bench": "devices",
                    "write_buffer_mb": args.mib,
                    "compaction": args.compaction,
                    "subcompactions": args.subcompactions,
                    "background_jobs": crate::config::background_jobs(args.background_jobs),
                    "report": report,
                }))
            })
            .await??;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Rollups { devices, groups, interval_s, hours, rate, seconds, store: args } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let store = Arc::new(Store::open(&path, args.store_config())?);
                let _flusher = store.start_flusher()?;
                let fleet = Fleet::new(FleetSpec { devices, interval_ms: interval_s * 1000, ..FleetSpec::default() });
                bench::rollups::place_devices(&store, &fleet, groups)?;
                tracing::info!(devices, groups, hours, "catch-up phase: writing, then rolling up");
                let catch_up = bench::rollups::catch_up(&store, &fleet, hours)?;
                tracing::info!(rate, seconds, "sustained phase: ingest with roll-ups running");
                let first_tick = catch_up.hours * (3600 / interval_s.max(1)) as u64;
                let sustained = bench::rollups::sustained(
                    &store,
                    &fleet,
                    first_tick,
                    rate,
                    seconds,
                    Duration::from_millis(Config::default().rollup.interval_ms),
                )?;
                Ok(serde_json::json!({
                    "bench": "rollups",
                    "write_buffer_mb": args.mib,
                    "compaction": args.compaction,
                    "subcompactions": args.subcompactions,
                    "background_jobs": crate::config::background_jobs(args.background_jobs),
                    "devices": devices,
                    "groups": groups,
                    "interval_s": interval_s,
                    "catch_up": catch_up,
                    "sustained": sustained,
                }))
            })
            .await??;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Queries { devices, day_devices, queries, rate, ingest_rate, archived } => {
            anyhow::ensure!(day_devices >= 1 && day_devices <= devices, "--day-devices must be from 1 to --devices");
            let dir = tempfile::tempdir()?;
            let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
            on_free_loopback_ports(&mut cfg);
            // A load test on loopback, without tokens (logged as a warning).
            cfg.auth.enabled = false;
            cfg.query.max_devices_per_request = cfg.query.max_devices_per_request.max(devices as usize);
            let running = serve::start(&cfg).await?;
            let spec = bench::queries::QuerySpec {
                base_url: format!("http://{}", running.http_addr),
                table: "fleet.readings".into(),
                devices,
                day_devices,
                // 2024-01-01T00:00:00Z.
                day_start: 1_704_067_200_000,
                interval_ms: 10_000,
                queries,
                rate,
                token: None,
            };
            let store = running.store.clone();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                if archived {
                    let table = bucketer::TableSpec {
                        partition: model::PartitionSize::Day,
                        hot_retention_ms: Some(model::DAY_MS as u64),
                        ..bucketer::TableSpec::default()
                    };
                    store.define_table_with(&spec.table, &table)?;
                }
                let loaded = bench::queries::load(&store, &spec)?;
                let mut archive = None;
                if archived {
                    let report = store.spill_expired_partitions(now_ms(), |_| ())?;
                    let spilled = report.spilled.first().ok_or_else(|| anyhow::anyhow!("nothing was archived"))?;
                    archive =
                        Some(serde_json::json!({"rows": spilled.rows, "bytes": spilled.bytes, "file": spilled.path}));
                    tracing::info!(rows = spilled.rows, bytes = spilled.bytes, "history archived");
                }
                tracing::info!(loaded, ingest_rate, "history written; querying under ingest");
                let ingest =
                    bench::queries::Ingest::start(store.clone(), spec.table.clone(), ingest_rate, 1000, 10_000);
                let started = Instant::now();
                let report = bench::queries::run(&spec);
                let secs = started.elapsed().as_secs_f64();
                let ingested = ingest.stop()?;
                Ok(serde_json::json!({
                    "bench": "queries",
                    "devices": devices,
                    "day_devices": day_devices,
                    "readings_loaded": loaded,
                    "archived": archive,
                    "query_rate_per_kind": rate,
                    "ingest_readings_per_second": ingested as f64 / secs,
                    "report": report?,
                }))
            })
            .await??;
            running.shutdown().await?;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::RollupQueries { devices, groups, interval_s, days, queries } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let store = Store::open(&path, StoreConfig::default())?;
                let fleet = Fleet::new(FleetSpec { devices, interval_ms: interval_s * 1000, ..FleetSpec::default() });
                bench::rollups::place_devices(&store, &fleet, groups)?;
                tracing::info!(devices, days, "writing and rolling up, then querying");
                let aggs = query::api::Agg::ALL;
                let render = |rows: &[(i64, bucketer::rollups::Record)]| {
                    let rows: Vec<serde_json::Value> =
                        rows.iter().map(|(start, r)| query::api::rollup_row_json(*start, r, None, &aggs)).collect();
                    serde_json::to_vec(&serde_json::json!({ "rows": rows })).map_or(0, |v| v.len())
                };
                let report = bench::rollups::query_latency(&store, &fleet, days, groups, queries, &render)?;
                Ok(serde_json::json!({
                    "bench": "rollup-queries",
                    "devices": devices,
                    "groups": groups,
                    "interval_s": interval_s,
                    "days": days,
                    "report": report,
                }))
            })
            .await??;
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Mqtt { devices, ticks, per_message, connections, qos, mqtt_url } => {
            let dir = tempfile::tempdir()?;
            let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
            on_free_loopback_ports(&mut cfg);
            // A load test on loopback, without tokens (logged as a warning).
            cfg.auth.enabled = false;
            if let Some(url) = mqtt_url {
                crate::harness::plain_broker_url(&url)?;
                cfg.mqtt.url = Some(url);
                // A new session per run: a broker keeps a fixed id's session, and its queue
                // would leak an earlier run's messages into this one's count.
                cfg.mqtt.client_id = format!("hourglass-bench-{}", now_ms());
            }
            let running = serve::start(&cfg).await?;
            let (host, port) = running.mqtt_broker()?;
            let fleet = Arc::new(Fleet::new(FleetSpec { devices, ..FleetSpec::default() }));
            let spec = MqttSpec {
                host,
                port,
                topic_prefix: cfg.mqtt.topic_prefix.clone(),
                connections,
                readings_per_message: per_message,
                first_tick: 0,
                ticks,
                qos,
            };
            let total = devices * ticks;
            let started = Instant::now();
            let sent = Arc::new(AtomicU64::new(0));
            let limit = store_pace(&cfg, &running, per_message);
            let publish =
                bench::mqtt::publish(fleet, spec, sent, Some(limit), None).await.map_err(anyhow::Error::msg)?;
            // Stored = committed by the bucketer; wait for all of it (bounded).
            let deadline = Instant::now() + Duration::from_secs(600);
            while running.store.stats().readings.load(Ordering::Relaxed) < total {
                anyhow::ensure!(Instant::now() < deadline, "readings not all stored after 600 s");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let secs = started.elapsed().as_secs_f64();
            let batches = running.store.stats().batches.load(Ordering::Relaxed);
            let consumed = running.mqtt_stats.messages.load(Ordering::Relaxed);
            running.shutdown().await?;
            let report = serde_json::json!({
                "bench": "mqtt",
                "broker": cfg.mqtt.url.as_deref().unwrap_or("embedded"),
                "devices": devices,
                "readings": total,
                "messages": publish.messages,
                "readings_per_message": per_message,
                "connections": connections,
                "qos": qos,
                "publish_seconds": publish.publish_seconds,
                "stored_seconds": secs,
                "readings_per_second_stored": total as f64 / secs,
                "write_batches": batches,
                "messages_consumed": consumed,
            });
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        BenchCommand::Kafka { brokers, topic, partitions, devices, ticks, per_message } => {
            let fleet = Arc::new(Fleet::new(FleetSpec { devices, ..FleetSpec::default() }));
            let spec = bench::kafka::KafkaSpec { brokers, topic, partitions, readings_per_message: per_message, ticks };
            let (produce_fleet, produce_spec) = (fleet.clone(), spec.clone());
            let produced = tokio::task::spawn_blocking(move || bench::kafka::produce(&produce_fleet, &produce_spec))
                .await?
                .map_err(anyhow::Error::msg)?;
            let total = produced.readings;
            let (bare_spec, n) = (spec.clone(), produced.messages);
            let bare = tokio::task::spawn_blocking(move || {
                bench::kafka::consume_bare(&bare_spec, n, Duration::from_secs(600))
            })
            .await?
            .map_err(anyhow::Error::msg)?;

            let dir = tempfile::tempdir()?;
            let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
            on_free_loopback_ports(&mut cfg);
            // A load test on loopback, without tokens (logged as a warning).
            cfg.auth.enabled = false;
            cfg.kafka.enabled = true;
            cfg.kafka.brokers = spec.brokers.clone();
            cfg.kafka.topics = vec![spec.topic.clone()];
            cfg.kafka.group_id = format!("hourglass-bench-{}", now_ms());
            cfg.kafka.default_table = fleet.spec().table.to_string();
            cfg.kafka.session_timeout_ms = 6000;
            let running = serve::start(&cfg).await?;
            // Timed from the assignment (serve::start waits for it) to the last commit.
            let started = Instant::now();
            let cpu_before = bench::cpu::process_cpu_seconds().unwrap_or(0.0);
            let deadline = started + Duration::from_secs(600);
            while running.store.stats().readings.load(Ordering::Relaxed) < total {
                anyhow::ensure!(Instant::now() < deadline, "readings not all stored after 600 s");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let secs = started.elapsed().as_secs_f64();
            let cpu_secs = bench::cpu::process_cpu_seconds().map(|c| c - cpu_before);
            let stored = running.store.stats().readings.load(Ordering::Relaxed);
            let batches = running.store.stats().batches.load(Ordering::Relaxed);
            // The roll-up stage runs behind ingest at a lower priority: the time it then
            // takes to roll up every hour already due.
            let drain_started = Instant::now();
            let due_before = {
                let stats = running.store.stats();
                let newest = stats.max_event_ts.load(Ordering::Relaxed);
                model::Hour::of(newest.saturating_sub(cfg.rollup.allowed_lateness_ms as i64)).start_ms()
            };
            while running.store.stats().rollup_oldest_dirty_hour_ms.load(Ordering::Relaxed) < due_before {
                anyhow::ensure!(Instant::now() < deadline, "roll-ups not caught up after 600 s");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let rollup_drain_secs = drain_started.elapsed().as_secs_f64();
            running.shutdown().await?;
            anyhow::ensure!(stored == total, "stored {stored} readings, produced {total}");
            let bare_rps = total as f64 / bare.seconds;
            let pipeline_rps = total as f64 / secs;
            let report = serde_json::json!({
                "bench": "kafka",
                "devices": devices,
                "readings": total,
                "messages": produced.messages,
                "readings_per_message": per_message,
                "partitions": partitions,
                "produce": produced,
                "produce_readings_per_second": total as f64 / produced.seconds,
                "bare_consumer": bare,
                "bare_consumer_readings_per_second": bare_rps,
                "bare_consumer_messages_per_second": bare.messages as f64 / bare.seconds,
                "pipeline_stored_seconds": secs,
                "pipeline_readings_per_second_stored": pipeline_rps,
                "pipeline_vs_bare": pipeline_rps / bare_rps,
                "pipeline_cpu_seconds": cpu_secs,
                "pipeline_cpu_microseconds_per_reading": cpu_secs.map(|c| c * 1e6 / total as f64),
                "rollup_drain_seconds_after_stored": rollup_drain_secs,
                "write_batches": batches,
            });
            say(&serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suggested read spans the backfill and the first live reading, cut to its last
    /// `max_range_ms` (`--backfill-hours 10000` suggested a range the API refused: QA56 F2).
    #[test]
    fn the_suggested_read_fits_the_range_limit() {
        assert_eq!(try_range(1_000_000, 360, 10_000, 34_560_000_000), (1_000_000, 4_610_000));
        let (from, to) = try_range(0, 3_600_000, 10_000, 34_560_000_000);
        assert_eq!((from, to), (36_000_010_000 - 34_560_000_000, 36_000_010_000));
        assert_eq!(try_range(5, 0, 100, u64::MAX), (5, 105));
    }
}
