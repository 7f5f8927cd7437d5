//! `hourglass demo` (the pipeline plus a simulated fleet) and `hourglass bench` (load tests
//! through the real paths). The generators and drivers live in the `bench` crate.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fleet::{Fleet, FleetSpec};
use bench::mqtt::MqttSpec;
use bucketer::{Store, StoreConfig};
use clap::Subcommand;

use crate::config::Config;
use crate::{say, serve};

/// `hourglass bench ...`
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// In-process storage write path (no broker): readings/s, then bytes per value after a
    /// full compaction.
    Storage {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 1000)]
        devices: u64,
        /// Ticks of the whole fleet (readings = devices × ticks).
        #[arg(long, default_value_t = 2000)]
        ticks: u64,
        /// Readings per WriteBatch.
        #[arg(long, default_value_t = 100_000)]
        batch_readings: usize,
        /// Seconds between two readings of a truck.
        #[arg(long, default_value_t = 10)]
        interval_s: i64,
        /// fsync the WAL on every commit.
        #[arg(long)]
        sync_wal: bool,
    },
    /// The whole MQTT path, through the embedded broker or `--mqtt-url`: publish, wait until
    /// stored.
    Mqtt {
        /// Trucks in the fleet.
        #[arg(long, default_value_t = 1000)]
        devices: u64,
        /// Ticks of the whole fleet.
        #[arg(long, default_value_t = 300)]
        ticks: u64,
        /// Readings per MQTT message.
        #[arg(long, default_value_t = 100)]
        per_message: usize,
        /// Publishing connections.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// QoS of the publishers (0 or 1).
        #[arg(long, default_value_t = 1)]
        qos: u8,
        /// Publish through this external broker (mqtt://host:port) instead of an embedded one;
        /// the pipeline under test consumes from it with a client id of its own.
        #[arg(long)]
        mqtt_url: Option<String>,
    },
    /// Writes a TSBS IoT workload (readings + diagnostics) to a recording file, and optionally
    /// the same workload as InfluxDB line protocol (with a `.meta.json`) for the peers.
    Record(crate::harness::RecordArgs),
    /// Sends a workload (a recording, or generated on the fly) through the pipeline open-loop
    /// and measures throughput, end-to-end and query latency, peak RSS and bytes per value.
    Replay(crate::harness::ReplayArgs),
}

pub(crate) fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn now_ms() -> i64 {
    ingest::now_ms()
}

/// `hourglass demo`.
pub(crate) async fn demo(cfg: Config, devices: u64, interval_ms: i64, backfill_hours: u64) -> anyhow::Result<()> {
    anyhow::ensure!(devices >= 1, "--devices must be at least 1");
    anyhow::ensure!(interval_ms >= 100, "--interval-ms must be at least 100");
    let running = serve::start(&cfg).await?;
    let backfill_ticks = (backfill_hours as i64 * model::HOUR_MS / interval_ms) as u64;
    let now = now_ms();
    let start_ms = (now - backfill_ticks as i64 * interval_ms).div_euclid(interval_ms) * interval_ms;
    let fleet = Arc::new(Fleet::new(FleetSpec { devices, interval_ms, start_ms, ..FleetSpec::default() }));
    let table = fleet.spec().table.clone();
    let http = running.http_addr;
    say(&format!(
        "Hourglass demo: {devices} trucks publish to {}:{} every {} s.",
        running.mqtt_addr.0,
        running.mqtt_addr.1,
        interval_ms / 1000
    ));
    say(&format!("Dashboard: http://{http}/   Metrics: http://{http}/metrics"));
    say("Try:");
    say(&format!("  curl 'http://{http}/v1/tables'"));
    say(&format!("  curl 'http://{http}/v1/tables/{table}/latest?devices=truck_0,truck_1,truck_2'"));
    say(&format!(
        "  curl 'http://{http}/v1/tables/{table}/devices/truck_0/readings?from={}&to={}'",
        start_ms,
        start_ms + (backfill_ticks as i64 + 1) * interval_ms
    ));
    say(&format!("  curl 'http://{http}/v1/dead-letters?limit=10'"));
    say(&format!(
        "  mosquitto_pub -p {} -t hourglass/{table}/my_truck -q 1 -m '{{\"ts\": {now}, \"velocity\": 42.5}}'",
        running.mqtt_addr.1
    ));
    say("Ctrl-C stops it (ordered shutdown: nothing acked is lost).");

    let spec = MqttSpec {
        host: running.mqtt_addr.0.clone(),
        port: running.mqtt_addr.1,
        topic_prefix: cfg.mqtt.topic_prefix.clone(),
        connections: 4,
        readings_per_message: 100,
        first_tick: 0,
        ticks: backfill_ticks,
        qos: 1,
    };
    let sim_fleet = fleet.clone();
    let simulator = tokio::spawn(async move {
        let sent = Arc::new(AtomicU64::new(0));
        if backfill_ticks > 0 {
            match bench::mqtt::publish(sim_fleet.clone(), spec.clone(), sent.clone()).await {
                Ok(r) => tracing::info!(readings = r.readings, seconds = r.publish_seconds, "backfill published"),
                Err(e) => tracing::error!(error = %e, "backfill failed"),
            }
        }
        let mut tick = backfill_ticks;
        loop {
            let due = sim_fleet.tick_ts(tick);
            let wait = due - now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            let one = MqttSpec { first_tick: tick, ticks: 1, ..spec.clone() };
            if let Err(e) = bench::mqtt::publish(sim_fleet.clone(), one, sent.clone()).await {
                tracing::warn!(error = %e, tick, "simulated fleet could not publish");
            }
            tick += 1;
        }
    });
    serve::shutdown_signal().await;
    simulator.abort();
    let _ = simulator.await;
    running.shutdown().await
}

/// `hourglass bench ...`: prints a JSON report on stdout.
pub(crate) async fn bench(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Record(args) => crate::harness::record(args).await,
        BenchCommand::Replay(args) => crate::harness::replay(args).await,
        BenchCommand::Storage { devices, ticks, batch_readings, interval_s, sync_wal } => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            let report = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
                let store = Store::open(&path, StoreConfig { sync_wal, ..StoreConfig::default() })?;
                let fleet = Fleet::new(FleetSpec { devices, interval_ms: interval_s * 1000, ..FleetSpec::default() });
                let spec = bench::storage::StorageSpec { ticks, batch_readings };
                let mut last = Instant::now();
                let report = bench::storage::run(&store, &fleet, &spec, |done, total| {
                    if last.elapsed() > Duration::from_secs(5) {
                        last = Instant::now();
                        tracing::info!(done, total, "ticks written");
                    }
                })?;
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
        BenchCommand::Mqtt { devices, ticks, per_message, connections, qos, mqtt_url } => {
            let dir = tempfile::tempdir()?;
            let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
            cfg.http.listen = free_port()?;
            cfg.mqtt.listen = free_port()?;
            if let Some(url) = mqtt_url {
                cfg.mqtt.url = Some(url);
                // A new session per run: a broker keeps a fixed id's session, and its queue
                // would leak an earlier run's messages into this one's count.
                cfg.mqtt.client_id = format!("hourglass-bench-{}", now_ms());
            }
            let running = serve::start(&cfg).await?;
            let fleet = Arc::new(Fleet::new(FleetSpec { devices, ..FleetSpec::default() }));
            let spec = MqttSpec {
                host: running.mqtt_addr.0.clone(),
                port: running.mqtt_addr.1,
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
            let publish = bench::mqtt::publish(fleet, spec, sent).await.map_err(anyhow::Error::msg)?;
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
    }
}
