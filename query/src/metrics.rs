//! What `/metrics`, `/ready` and `/v1/stats` report, and its Prometheus (OpenMetrics text)
//! exposition.
//!
//! The stages keep plain atomics ([`ingest::mqtt::MqttStats`], [`bucketer::StoreStats`]) and
//! know nothing of Prometheus. A scrape copies them, with the RocksDB properties of
//! [`bucketer::Store::db_stats`], into a [`Snapshot`]; [`render`] turns a snapshot into text
//! through `prometheus-client`, which owns the format (names, escaping, `_total` suffixes,
//! `# EOF`). Every label value that can appear is always present, zeros included, so a
//! dashboard's query never meets a missing series.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `hourglass_ingest_messages_total` | counter | `source` |
//! | `hourglass_ingest_bytes_total` | counter | `source` |
//! | `hourglass_ingest_readings_total` | counter | `source` |
//! | `hourglass_ingest_dead_letters_total` | counter | `source` |
//! | `hourglass_ingest_connects_total` | counter (this and the next seven: broker sources, not `http`) | `source` |
//! | `hourglass_ingest_subscribed` | gauge (0/1) | `source` |
//! | `hourglass_ingest_broker_skips_total` | counter: times the embedded broker dropped messages the consumer had not read | `source` |
//! | `hourglass_ingest_broker_skipped_messages_total` | counter: messages lost in those skips, where the broker said how many | `source` |
//! | `hourglass_ingest_broker_unmatched_messages_total` | counter: messages the embedded broker took on topics no subscription of the consumer matches, stored nowhere (0 for other brokers) | `source` |
//! | `hourglass_ingest_broker_backlog_messages` | gauge: messages the embedded broker holds that the consumer has not read (0 for other brokers) | `source` |
//! | `hourglass_ingest_broker_backlog_bytes` | gauge: their bytes in the broker's log, the measure of `mqtt.broker_backlog_mb` (0 for other brokers) | `source` |
//! | `hourglass_ingest_redelivered_total` | counter: Kafka messages delivered again under one assignment and skipped (taken already; 0 for MQTT) | `source` |
//! | `hourglass_kafka_consumer_lag` | gauge: messages between the partition's end and the offset committed for the group | `topic`, `partition` |
//! | `hourglass_kafka_assigned_partitions` | gauge: partitions the group has assigned to this consumer (0 during a rebalance, and for a member given none; only with Kafka) | |
//! | `hourglass_store_readings_total` | counter | |
//! | `hourglass_store_batches_total` | counter | |
//! | `hourglass_store_bucket_operands_total` | counter | |
//! | `hourglass_store_dirty_marks_total` | counter | |
//! | `hourglass_store_latest_operands_total` | counter | |
//! | `hourglass_dead_letters_total` | counter | `reason` (every `DeadLetterReason`) |
//! | `hourglass_store_commit_duration_seconds` | histogram | |
//! | `hourglass_store_tables`, `hourglass_store_devices` | gauge | |
//! | `hourglass_rollup_hours_processed_total` | counter | |
//! | `hourglass_rollup_hours_past_retention_total` | counter: of those, hours left as they were, written to after their roll-up and the delete for good of their readings, or of days past their table's roll-up retention that could not be made again (past the day retention too, or readings deleted for good) | |
//! | `hourglass_rollup_days_from_buckets_total` | counter: days of devices past their table's hour roll-up retention (a late reading, a backlog) made again from all their hours' buckets | |
//! | `hourglass_archive_partitions_spilled_total`, `_rows_spilled_total`, `_bytes_written_total`, `_spill_failures_total`, `_run_failures_total` (retention runs that failed whole: the bucket missing, not answering or another store's), `_request_failures_total` (requests to the archive's bucket that failed after their retries, a missing object's aside), `_device_reads_total` (reads of one device's rows from an archive file: raw reads of archived partitions, roll-ups of archived hours, one a device-day) | counter | |
//! | `hourglass_store_partitions_deleted_total` | counter | |
//! | `hourglass_archive_partitions`, `_rows`, `_bytes` | gauge: what the archive holds now, by its manifest (`bucketer::Store::archive_held`) | |
//! | `hourglass_archive_partitions_waiting` | gauge: archived partitions whose late readings wait in RocksDB for a rewrite of their file (`storage.archive_late_wait`), as the retention runs since the start found them | |
//! | `hourglass_archive_files_missing` | gauge: files (a bucket's objects) the manifest names that the archive lacked when last looked at (a local archive at start and each retention run, a bucket at each retention run): their partitions' reads fail, and their hours are not rolled up (alert on it) | |
//! | `hourglass_store_commit_failures_in_a_row` | gauge: failed attempts at committing the writer's current batch; 0 once it commits | |
//! | `hourglass_rollup_lag_seconds` | gauge: largest event time stored minus the start of the oldest dirty hour (0 when none) | |
//! | `hourglass_rollup_overdue_seconds` | gauge: how long, in event time, the oldest dirty hour has been closed (past its end and `rollup.allowed_lateness_ms`) without being rolled up; 0 while it is open (alert on this one: the lag counts the open hour) | |
//! | `hourglass_rocksdb_pending_compaction_bytes`, `_memtable_bytes`, `_live_sst_bytes`, `_l0_files`, `_estimated_keys` | gauge | `cf` |
//! | `hourglass_rocksdb_running_compactions`, `_running_flushes`, `_background_errors`, `_write_stopped`, `_block_cache_usage_bytes` | gauge | |
//! | `hourglass_rocksdb_stats_available` | gauge (0/1) | |

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bucketer::stats::{CfStats, DbStats, HistogramSnapshot};
use bucketer::Store;
use ingest::mqtt::MqttStats;
use model::DeadLetterReason;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::watch;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An ingest source whose counters and connection state are reported.
#[derive(Debug, Clone)]
pub struct IngestSource {
    /// The `source` label (`mqtt`).
    pub name: &'static str,
    /// Its counters.
    pub stats: Arc<MqttStats>,
    /// `true` while it is subscribed to its broker.
    pub subscribed: watch::Receiver<bool>,
    /// Consumer lag per partition (Kafka sources).
    pub partition_lag: Option<Arc<ingest::kafka::PartitionLag>>,
}

/// Counters of one ingest source at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSnapshot {
    /// The `source` label.
    pub name: &'static str,
    /// Messages received.
    pub messages: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// Valid readings decoded.
    pub readings: u64,
    /// Dead letters produced.
    pub dead_letters: u64,
    /// Connections established.
    pub connects: u64,
    /// Subscribed now.
    pub subscribed: bool,
    /// Times the embedded broker dropped messages the source had not read.
    pub broker_skips: u64,
    /// Messages lost in those skips, where the broker said how many.
    pub broker_skipped_messages: u64,
    /// Messages the embedded broker took on topics no subscription of the source matches.
    pub broker_unmatched: u64,
    /// Messages the embedded broker holds that the source has not read.
    pub broker_backlog: u64,
    /// Their bytes in the broker's log, in the measure of `mqtt.broker_backlog_mb`.
    pub broker_backlog_bytes: u64,
    /// Messages delivered again under one assignment and skipped (Kafka).
    pub redelivered: u64,
    /// Why it is not subscribed, as it last said (MQTT, Kafka).
    pub not_subscribed_because: Option<String>,
}

impl SourceSnapshot {
    /// Whether the source reads from a broker (MQTT, Kafka): the HTTP write API's intake has
    /// no connection, subscription or broker backlog, and its snapshot leaves them out.
    pub fn has_broker(&self) -> bool {
        self.name != ingest::http::SOURCE
    }
}

/// Everything one scrape reports, copied out of the stages.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// One entry per ingest source.
    pub sources: Vec<SourceSnapshot>,
    /// Kafka consumer lag: (topic, partition, messages), per assigned partition.
    pub kafka_lag: Vec<(String, i32, i64)>,
    /// Kafka partitions assigned to this consumer (`None` without Kafka).
    pub kafka_assigned: Option<u64>,
    /// Readings committed.
    pub store_readings: u64,
    /// WriteBatches committed.
    pub store_batches: u64,
    /// Bucket merge operands written.
    pub store_bucket_operands: u64,
    /// Roll-up dirty marks written.
    pub store_dirty_marks: u64,
    /// `latest` merge operands written.
    pub store_latest_operands: u64,
    /// Dead letters committed per reason, in `DeadLetterReason::ALL` order.
    pub dead_letters: Vec<(DeadLetterReason, u64)>,
    /// WriteBatch commit latency.
    pub commit_latency: HistogramSnapshot,
    /// Tables in the catalog.
    pub tables: u64,
    /// Devices in the registry.
    pub devices: u64,
    /// Dirty hours the roll-up stage has recomputed.
    pub rollup_hours_processed: u64,
    /// Of those, hours left as they were past their table's roll-up retention.
    pub rollup_hours_past_retention: u64,
    /// Days of devices past their table's hour roll-up retention made from their buckets.
    pub rollup_days_from_buckets: u64,
    /// Roll-up lag in event time, ms ([`bucketer::StoreStats::rollup_lag_ms`]).
    pub rollup_lag_ms: i64,
    /// How long the oldest dirty hour has been closed, ms
    /// ([`bucketer::StoreStats::rollup_overdue_ms`]).
    pub rollup_overdue_ms: i64,
    /// Archive counters: partitions spilled, rows, bytes, failed spills, failed runs, failed
    /// requests to the bucket, device reads.
    pub archive: [u64; 7],
    /// What the archive holds now (its manifest).
    pub archive_held: bucketer::archive::ArchiveHeld,
    /// Partitions deleted for good.
    pub partitions_deleted: u64,
    /// Failed attempts in a row at committing the writer's current batch.
    pub commit_failures_in_a_row: u64,
    /// RocksDB properties, or why they could not be read.
    pub db: Result<DbStats, String>,
}

impl Snapshot {
    /// Copies the counters of `store` and `sources` and reads the RocksDB properties (cheap
    /// in-memory lookups, but a call into RocksDB: run it on a blocking thread).
    pub fn take(store: &Store, sources: &[IngestSource]) -> Snapshot {
        let s = store.stats();
        let sources_in = sources;
        let sources = sources
            .iter()
            .map(|src| SourceSnapshot {
                name: src.name,
                messages: src.stats.messages.load(Ordering::Relaxed),
                bytes: src.stats.bytes.load(Ordering::Relaxed),
                readings: src.stats.readings.load(Ordering::Relaxed),
                // Decoding's and the schema's.
                dead_letters: src.stats.dead_letters.load(Ordering::Relaxed)
                    + bucketer::SCHEMA_SOURCE_KINDS
                        .iter()
                        .position(|k| *k == src.name)
                        .map_or(0, |i| s.schema_dead_letters[i].load(Ordering::Relaxed)),
                connects: src.stats.connects.load(Ordering::Relaxed),
                subscribed: *src.subscribed.borrow(),
                broker_skips: src.stats.broker_skips.load(Ordering::Relaxed),
                broker_skipped_messages: src.stats.broker_skipped_messages.load(Ordering::Relaxed),
                broker_unmatched: src.stats.broker_unmatched.load(Ordering::Relaxed),
                broker_backlog: src.stats.broker_backlog(),
                broker_backlog_bytes: src.stats.broker_backlog_bytes(),
                redelivered: src.stats.redelivered.load(Ordering::Relaxed),
                not_subscribed_because: src.stats.not_subscribed_because(),
            })
            .collect();
        let lags = || sources_in.iter().filter_map(|src| src.partition_lag.as_ref());
        let kafka_lag = lags().flat_map(|l| l.snapshot()).collect();
        let kafka_assigned = lags().map(|l| l.assigned()).reduce(|a, b| a + b);
        Snapshot {
            sources,
            kafka_lag,
            kafka_assigned,
            store_readings: s.readings.load(Ordering::Relaxed),
            store_batches: s.batches.load(Ordering::Relaxed),
            store_bucket_operands: s.bucket_operands.load(Ordering::Relaxed),
            store_dirty_marks: s.dirty_marks.load(Ordering::Relaxed),
            store_latest_operands: s.latest_operands.load(Ordering::Relaxed),
            dead_letters: DeadLetterReason::ALL
                .iter()
                .zip(&s.dead_letters)
                .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
                .collect(),
            commit_latency: s.commit_latency.snapshot(),
            tables: store.tables().len() as u64,
            devices: store.device_count() as u64,
            rollup_hours_processed: s.rollup_hours_processed.load(Ordering::Relaxed),
            rollup_hours_past_retention: s.rollup_hours_past_retention.load(Ordering::Relaxed),
            rollup_days_from_buckets: s.rollup_days_from_buckets.load(Ordering::Relaxed),
            rollup_lag_ms: s.rollup_lag_ms(),
            rollup_overdue_ms: s.rollup_overdue_ms(),
            archive: [
                s.archive_partitions_spilled.load(Ordering::Relaxed),
                s.archive_rows_spilled.load(Ordering::Relaxed),
                s.archive_bytes_written.load(Ordering::Relaxed),
                s.archive_spill_failures.load(Ordering::Relaxed),
                s.archive_run_failures.load(Ordering::Relaxed),
                store.archive_request_failures(),
                s.archive_device_reads.load(Ordering::Relaxed),
            ],
            archive_held: store.archive_held(),
            partitions_deleted: s.partitions_deleted.load(Ordering::Relaxed),
            commit_failures_in_a_row: s.commit_failures_in_a_row.load(Ordering::Relaxed),
            db: store.db_stats().map_err(|e| e.to_string()),
        }
    }

    /// Why the pipeline is not ready to take traffic; empty when it is. Not ready: an ingest
    /// source is not subscribed to its broker, the writer's commits fail, or RocksDB has
    /// stopped writes or cannot be asked. Not its count of background errors, which never goes
    /// down: RocksDB recovers from some by itself (a flush that found the disk full, retried
    /// once there is room), and a store that has not recovered fails the writer's commits.
    pub fn not_ready_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        for s in &self.sources {
            if !s.subscribed {
                // The HTTP intake has no broker: it is closed only while the service stops.
                let why = match (s.name, &s.not_subscribed_because) {
                    ("http", _) => "not taking writes (stopping)".to_string(),
                    (_, Some(because)) => format!("not subscribed to the broker: {because} (see the log)"),
                    (_, None) => {
                        "not subscribed to the broker (connecting, reconnecting, stopping, or the subscription \
                                  refused: see the log)"
                            .to_string()
                    }
                };
                reasons.push(format!("{}: {why}", s.name));
            }
        }
        if self.commit_failures_in_a_row > 0 {
            reasons.push(format!(
                "storage: the writer's commits are failing ({} attempts in a row; the log has RocksDB's error): \
                 nothing is acknowledged until one succeeds",
                self.commit_failures_in_a_row
            ));
        }
        match &self.db {
            Ok(db) => {
                if db.write_stopped > 0 {
                    reasons.push("storage: RocksDB has stopped writes (write stall)".to_string());
                }
            }
            Err(e) => reasons.push(format!("storage: cannot read RocksDB properties: {e}")),
        }
        reasons
    }
}

/// Renders `snap` as an OpenMetrics text exposition (which Prometheus scrapes), ending in
/// `# EOF`.
pub fn render(snap: &Snapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snap.clone())));
    let mut out = String::with_capacity(8 << 10);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

/// A family of counters: its descriptor, then one sample per value of `label`.
fn counters<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, v) in samples {
        ConstCounter::new(v).encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// A family of gauges: its descriptor, then one sample per value of `label`.
fn gauges<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (value, v) in samples {
        ConstGauge::new(v).encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: i64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let per_source = |f: fn(&SourceSnapshot) -> u64| s.sources.iter().map(move |x| (x.name, f(x)));
        // The families of a broker's connection: not the HTTP intake's.
        let brokers = || s.sources.iter().filter(|x| x.has_broker());
        let per_broker = |f: fn(&SourceSnapshot) -> u64| brokers().map(move |x| (x.name, f(x)));
        let e = &mut enc;
        counters(
            e,
            "hourglass_ingest_messages",
            "Messages received from the source.",
            "source",
            per_source(|x| x.messages),
        )?;
        counters(
            e,
            "hourglass_ingest_bytes",
            "Payload bytes received from the source.",
            "source",
            per_source(|x| x.bytes),
        )?;
        counters(
            e,
            "hourglass_ingest_readings",
            "Valid readings decoded from the source.",
            "source",
            per_source(|x| x.readings),
        )?;
        counters(
            e,
            "hourglass_ingest_dead_letters",
            "Rejected inputs from the source.",
            "source",
            per_source(|x| x.dead_letters),
        )?;
        counters(
            e,
            "hourglass_ingest_connects",
            "Connections to the broker established.",
            "source",
            per_broker(|x| x.connects),
        )?;
        let subscribed = brokers().map(|x| (x.name, i64::from(x.subscribed)));
        gauges(
            e,
            "hourglass_ingest_subscribed",
            "1 while the source is subscribed to its broker.",
            None,
            "source",
            subscribed,
        )?;
        counters(
            e,
            "hourglass_ingest_broker_skips",
            "Times the embedded MQTT broker dropped messages the source had not read yet (it fell \
             mqtt.broker_backlog_mb behind the publishers): those messages are lost.",
            "source",
            per_broker(|x| x.broker_skips),
        )?;
        counters(
            e,
            "hourglass_ingest_broker_skipped_messages",
            "Messages lost in those skips, where the embedded broker said how many.",
            "source",
            per_broker(|x| x.broker_skipped_messages),
        )?;
        counters(
            e,
            "hourglass_ingest_broker_unmatched_messages",
            "Messages the embedded MQTT broker took on topics no subscription of the source matches \
             (mqtt.topic_prefix, mqtt.subscriptions): acknowledged to QoS 1 publishers, stored nowhere.",
            "source",
            per_broker(|x| x.broker_unmatched),
        )?;
        let backlog = brokers().map(|x| (x.name, i64::try_from(x.broker_backlog).unwrap_or(i64::MAX)));
        gauges(
            e,
            "hourglass_ingest_broker_backlog_messages",
            "Messages the embedded MQTT broker holds that the source has not read yet, a second behind (0 for \
             other brokers). Messages past mqtt.broker_backlog_mb of them are dropped; after such a skip this \
             counts the dropped ones too (the broker does not say how many).",
            None,
            "source",
            backlog,
        )?;
        let backlog_bytes = brokers().map(|x| (x.name, i64::try_from(x.broker_backlog_bytes).unwrap_or(i64::MAX)));
        gauges(
            e,
            "hourglass_ingest_broker_backlog_bytes",
            "Bytes of the embedded MQTT broker's log that the source has not read yet (4 bytes, the topic \
             and the payload a message, as the broker counts them), a second behind (0 for other brokers). \
             Past mqtt.broker_backlog_mb the broker drops the oldest; after such a skip this counts the dropped \
             ones too.",
            None,
            "source",
            backlog_bytes,
        )?;
        counters(
            e,
            "hourglass_ingest_redelivered",
            "Kafka messages the broker delivered again under one assignment of their partition, skipped \
             because they were taken already (librdkafka may fetch a partition again from an earlier offset); \
             not counted as messages. 0 for MQTT.",
            "source",
            per_broker(|x| x.redelivered),
        )?;

        {
            let mut m = e.encode_descriptor(
                "hourglass_kafka_consumer_lag",
                "Messages between a partition's end and the offset committed for the group.",
                None,
                MetricType::Gauge,
            )?;
            for (topic, partition, lag) in &s.kafka_lag {
                let partition = partition.to_string();
                ConstGauge::new(*lag)
                    .encode(m.encode_family(&[("topic", topic.as_str()), ("partition", partition.as_str())])?)?;
            }
        }

        if let Some(n) = s.kafka_assigned {
            gauge(
                e,
                "hourglass_kafka_assigned_partitions",
                "Kafka partitions the group has assigned to this consumer (0 during a rebalance).",
                None,
                to_i64(n),
            )?;
        }
        counter(e, "hourglass_store_readings", "Readings committed to RocksDB.", s.store_readings)?;
        counter(e, "hourglass_store_batches", "WriteBatches committed.", s.store_batches)?;
        counter(e, "hourglass_store_bucket_operands", "Hour-bucket merge operands written.", s.store_bucket_operands)?;
        counter(
            e,
            "hourglass_store_dirty_marks",
            "Roll-up dirty marks written (none for a device-hour of an open hour already marked).",
            s.store_dirty_marks,
        )?;
        counter(
            e,
            "hourglass_store_latest_operands",
            "Latest-value merge operands written (by writes, one a device whose newest device-hour they mark; by roll-ups, spills and retention, one a device-hour they settle).",
            s.store_latest_operands,
        )?;
        let by_reason = s.dead_letters.iter().map(|(r, n)| (r.as_str(), *n));
        counters(e, "hourglass_dead_letters", "Dead letters committed, by reason.", "reason", by_reason)?;
        let h = &s.commit_latency;
        e.encode_descriptor(
            "hourglass_store_commit_duration",
            "Time from the first commit attempt of a WriteBatch until it is durable.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)?;
        gauge(e, "hourglass_store_tables", "Tables in the catalog.", None, to_i64(s.tables))?;
        gauge(e, "hourglass_store_devices", "Devices in the registry.", None, to_i64(s.devices))?;
        counter(
            e,
            "hourglass_rollup_hours_processed",
            "Dirty hours the roll-up stage recomputed.",
            s.rollup_hours_processed,
        )?;
        counter(
            e,
            "hourglass_rollup_hours_past_retention",
            "Dirty hours left as they were: their day is past their table's roll-up retention (past the day \
             retention too, or readings deleted for good).",
            s.rollup_hours_past_retention,
        )?;
        counter(
            e,
            "hourglass_rollup_days_from_buckets",
            "Days of devices past their table's hour roll-up retention made again from their hours' buckets.",
            s.rollup_days_from_buckets,
        )?;
        for (name, help, v) in [
            ("hourglass_archive_partitions_spilled", "Partitions written to the Parquet archive.", s.archive[0]),
            ("hourglass_archive_rows_spilled", "Rows in the archive files written.", s.archive[1]),
            ("hourglass_archive_bytes_written", "Bytes of the archive files written.", s.archive[2]),
            (
                "hourglass_archive_spill_failures",
                "Partition spills that failed; the partition stayed in RocksDB.",
                s.archive[3],
            ),
            (
                "hourglass_archive_run_failures",
                "Retention runs that failed whole (the archive's bucket missing, not answering or another \
                 store's): nothing was archived or deleted.",
                s.archive[4],
            ),
            (
                "hourglass_archive_request_failures",
                "Requests to the archive's bucket that failed after their retries (a missing object's aside).",
                s.archive[5],
            ),
            (
                "hourglass_archive_device_reads",
                "Reads of one device's rows from an archive file: raw reads of archived partitions, and roll-ups \
                 of archived hours (one a device-day).",
                s.archive[6],
            ),
            ("hourglass_store_partitions_deleted", "Partitions deleted for good by retention.", s.partitions_deleted),
        ] {
            counter(e, name, help, v)?;
        }
        for (name, help, v) in [
            (
                "hourglass_archive_partitions",
                "Partitions the archive holds now (a file each).",
                s.archive_held.partitions,
            ),
            ("hourglass_archive_rows", "Rows in the archive's files now.", s.archive_held.rows),
            (
                "hourglass_archive_bytes",
                "Bytes of the archive's files now (local or in the bucket).",
                s.archive_held.bytes,
            ),
            (
                "hourglass_archive_partitions_waiting",
                "Archived partitions whose late readings wait in RocksDB for a rewrite (storage.archive_late_wait).",
                s.archive_held.waiting,
            ),
            (
                "hourglass_archive_files_missing",
                "Archive files (or objects) the manifest names that the archive lacked when last looked at.",
                s.archive_held.files_missing,
            ),
        ] {
            gauge(e, name, help, None, to_i64(v))?;
        }
        gauge(
            e,
            "hourglass_rollup_lag",
            "Largest event time stored minus the start of the oldest dirty hour (0 when none is dirty).",
            Some(&Unit::Seconds),
            s.rollup_lag_ms / 1000,
        )?;
        gauge(
            e,
            "hourglass_rollup_overdue",
            "How long, in event time, the oldest dirty hour has been closed (past its end and rollup.allowed_lateness_ms) \
             without being rolled up; 0 while it is open. The one to alert on: hourglass_rollup_lag_seconds counts the \
             open hour too.",
            Some(&Unit::Seconds),
            s.rollup_overdue_ms / 1000,
        )?;
        gauge(
            e,
            "hourglass_store_commit_failures_in_a_row",
            "Failed attempts in a row at committing the writer's current batch (a full disk, an I/O error); 0 once \
             it commits. Above 0, /ready answers 503 and nothing is acknowledged.",
            None,
            to_i64(s.commit_failures_in_a_row),
        )?;

        let available = i64::from(s.db.is_ok());
        gauge(e, "hourglass_rocksdb_stats_available", "1 when the RocksDB figures could be read.", None, available)?;
        if let Ok(db) = &s.db {
            let per_cf = |f: fn(&CfStats) -> u64| db.column_families.iter().map(move |x| (x.name, to_i64(f(x))));
            let bytes = Some(&Unit::Bytes);
            let help = "Bytes compaction still has to rewrite (estimate).";
            gauges(
                e,
                "hourglass_rocksdb_pending_compaction",
                help,
                bytes,
                "cf",
                per_cf(|x| x.pending_compaction_bytes),
            )?;
            let help = "Bytes in active and immutable memtables.";
            gauges(e, "hourglass_rocksdb_memtable", help, bytes, "cf", per_cf(|x| x.memtable_bytes))?;
            gauges(
                e,
                "hourglass_rocksdb_live_sst",
                "Bytes of live SST files.",
                bytes,
                "cf",
                per_cf(|x| x.live_sst_bytes),
            )?;
            gauges(e, "hourglass_rocksdb_l0_files", "SST files in level 0.", None, "cf", per_cf(|x| x.l0_files))?;
            let help = "Estimated number of keys.";
            gauges(e, "hourglass_rocksdb_estimated_keys", help, None, "cf", per_cf(|x| x.estimated_keys))?;
            let help = "Compactions running now.";
            gauge(e, "hourglass_rocksdb_running_compactions", help, None, to_i64(db.running_compactions))?;
            let help = "Memtable flushes running now.";
            gauge(e, "hourglass_rocksdb_running_flushes", help, None, to_i64(db.running_flushes))?;
            let help = "Background errors since open.";
            gauge(e, "hourglass_rocksdb_background_errors", help, None, to_i64(db.background_errors))?;
            gauge(
                e,
                "hourglass_rocksdb_write_stopped",
                "1 while RocksDB stops writes.",
                None,
                to_i64(db.write_stopped),
            )?;
            let help = "Bytes of the shared block cache in use.";
            gauge(e, "hourglass_rocksdb_block_cache_usage", help, bytes, to_i64(db.block_cache_bytes))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            sources: vec![SourceSnapshot {
                name: "mqtt",
                messages: 12,
                bytes: 3456,
                readings: 10,
                dead_letters: 2,
                connects: 1,
                subscribed: true,
                broker_skips: 4,
                broker_skipped_messages: 1700,
                broker_unmatched: 23,
                broker_backlog: 9,
                broker_backlog_bytes: 74_000,
                redelivered: 6,
                not_subscribed_because: None,
            }],
            kafka_lag: vec![("fleet".into(), 3, 42)],
            kafka_assigned: Some(4),
            store_readings: 10,
            store_batches: 3,
            store_bucket_operands: 4,
            store_dirty_marks: 2,
            store_latest_operands: 5,
            dead_letters: DeadLetterReason::ALL
                .iter()
                .map(|r| (*r, u64::from(*r == DeadLetterReason::InvalidJson) * 2))
                .collect(),
            commit_latency: HistogramSnapshot {
                buckets: vec![(0.0001, 1), (0.001, 2), (f64::INFINITY, 0)],
                count: 3,
                sum_seconds: 0.0015,
            },
            tables: 1,
            devices: 2,
            rollup_hours_processed: 5,
            rollup_hours_past_retention: 4,
            rollup_days_from_buckets: 3,
            rollup_lag_ms: 7_200_500,
            rollup_overdue_ms: 3_300_900,
            archive: [2, 54, 9000, 1, 6, 8, 11],
            archive_held: bucketer::archive::ArchiveHeld {
                partitions: 1,
                rows: 27,
                bytes: 4600,
                waiting: 1,
                files_missing: 2,
            },
            partitions_deleted: 3,
            commit_failures_in_a_row: 0,
            db: Ok(DbStats {
                column_families: vec![CfStats {
                    name: "buckets",
                    pending_compaction_bytes: 7,
                    memtable_bytes: 2048,
                    live_sst_bytes: 0,
                    l0_files: 0,
                    estimated_keys: 5,
                }],
                running_compactions: 0,
                running_flushes: 0,
                background_errors: 0,
                write_stopped: 0,
                block_cache_bytes: 64,
            }),
        }
    }

    #[test]
    fn renders_openmetrics_text() {
        let text = render(&snapshot()).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let mut expected = vec![
            r#"hourglass_ingest_messages_total{source="mqtt"} 12"#.to_string(),
            r#"hourglass_ingest_bytes_total{source="mqtt"} 3456"#.into(),
            r#"hourglass_ingest_readings_total{source="mqtt"} 10"#.into(),
            r#"hourglass_ingest_dead_letters_total{source="mqtt"} 2"#.into(),
            r#"hourglass_ingest_connects_total{source="mqtt"} 1"#.into(),
            r#"hourglass_ingest_subscribed{source="mqtt"} 1"#.into(),
            r#"hourglass_ingest_broker_skips_total{source="mqtt"} 4"#.into(),
            r#"hourglass_ingest_broker_skipped_messages_total{source="mqtt"} 1700"#.into(),
            r#"hourglass_ingest_broker_unmatched_messages_total{source="mqtt"} 23"#.into(),
            r#"hourglass_ingest_broker_backlog_messages{source="mqtt"} 9"#.into(),
            r#"hourglass_ingest_broker_backlog_bytes{source="mqtt"} 74000"#.into(),
            r#"hourglass_ingest_redelivered_total{source="mqtt"} 6"#.into(),
            r#"hourglass_kafka_consumer_lag{topic="fleet",partition="3"} 42"#.into(),
            "hourglass_kafka_assigned_partitions 4".into(),
            "hourglass_store_readings_total 10".into(),
            "hourglass_store_batches_total 3".into(),
            "hourglass_store_bucket_operands_total 4".into(),
            "hourglass_store_dirty_marks_total 2".into(),
            "hourglass_store_latest_operands_total 5".into(),
        ];
        for r in DeadLetterReason::ALL {
            let n = if r == DeadLetterReason::InvalidJson { 2 } else { 0 };
            expected.push(format!(r#"hourglass_dead_letters_total{{reason="{}"}} {n}"#, r.as_str()));
        }
        expected.extend([
            "hourglass_store_commit_duration_seconds_sum 0.0015".to_string(),
            "hourglass_store_commit_duration_seconds_count 3".into(),
            r#"hourglass_store_commit_duration_seconds_bucket{le="0.0001"} 1"#.into(),
            r#"hourglass_store_commit_duration_seconds_bucket{le="0.001"} 3"#.into(),
            r#"hourglass_store_commit_duration_seconds_bucket{le="+Inf"} 3"#.into(),
            "hourglass_store_tables 1".into(),
            "hourglass_store_devices 2".into(),
            "hourglass_rollup_hours_processed_total 5".into(),
            "hourglass_rollup_hours_past_retention_total 4".into(),
            "hourglass_rollup_days_from_buckets_total 3".into(),
            "hourglass_archive_partitions_spilled_total 2".into(),
            "hourglass_archive_rows_spilled_total 54".into(),
            "hourglass_archive_bytes_written_total 9000".into(),
            "hourglass_archive_spill_failures_total 1".into(),
            "hourglass_archive_run_failures_total 6".into(),
            "hourglass_archive_request_failures_total 8".into(),
            "hourglass_archive_device_reads_total 11".into(),
            "hourglass_store_partitions_deleted_total 3".into(),
            "hourglass_archive_partitions 1".into(),
            "hourglass_archive_rows 27".into(),
            "hourglass_archive_bytes 4600".into(),
            "hourglass_archive_partitions_waiting 1".into(),
            "hourglass_archive_files_missing 2".into(),
            "hourglass_rollup_lag_seconds 7200".into(),
            "hourglass_rollup_overdue_seconds 3300".into(),
            "hourglass_store_commit_failures_in_a_row 0".into(),
            "hourglass_rocksdb_stats_available 1".into(),
            r#"hourglass_rocksdb_pending_compaction_bytes{cf="buckets"} 7"#.into(),
            r#"hourglass_rocksdb_memtable_bytes{cf="buckets"} 2048"#.into(),
            r#"hourglass_rocksdb_live_sst_bytes{cf="buckets"} 0"#.into(),
            r#"hourglass_rocksdb_l0_files{cf="buckets"} 0"#.into(),
            r#"hourglass_rocksdb_estimated_keys{cf="buckets"} 5"#.into(),
            "hourglass_rocksdb_running_compactions 0".into(),
            "hourglass_rocksdb_running_flushes 0".into(),
            "hourglass_rocksdb_background_errors 0".into(),
            "hourglass_rocksdb_write_stopped 0".into(),
            "hourglass_rocksdb_block_cache_usage_bytes 64".into(),
        ]);
        assert_eq!(lines, expected, "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert!(text.contains("# TYPE hourglass_store_commit_duration_seconds histogram\n"), "{text}");
        assert!(text.contains("# TYPE hourglass_dead_letters counter\n"), "{text}");
    }

    #[test]
    fn readiness_names_every_reason() {
        let mut snap = snapshot();
        assert!(snap.not_ready_reasons().is_empty());
        // RocksDB's count of background errors never goes down, while it recovers from some by
        // itself: ready again once its writes go on (it was 503 for good).
        if let Ok(db) = &mut snap.db {
            db.background_errors = 1;
        }
        assert!(snap.not_ready_reasons().is_empty());
        if let Ok(db) = &mut snap.db {
            db.write_stopped = 1;
        }
        assert_eq!(snap.not_ready_reasons(), ["storage: RocksDB has stopped writes (write stall)"]);
        snap.sources[0].subscribed = false;
        snap.sources.push(SourceSnapshot { name: "http", ..snap.sources[0].clone() });
        let because = "hourglass/#: I/O: Connection refused (os error 111)".to_string();
        snap.sources.push(SourceSnapshot {
            name: "mqtt",
            not_subscribed_because: Some(because),
            ..snap.sources[0].clone()
        });
        snap.db = Err("boom".into());
        snap.commit_failures_in_a_row = 3;
        assert_eq!(
            snap.not_ready_reasons(),
            [
                "mqtt: not subscribed to the broker (connecting, reconnecting, stopping, or the subscription refused: see the log)",
                "http: not taking writes (stopping)",
                "mqtt: not subscribed to the broker: hourglass/#: I/O: Connection refused (os error 111) (see the log)",
                "storage: the writer's commits are failing (3 attempts in a row; the log has RocksDB's error): nothing \
                 is acknowledged until one succeeds",
                "storage: cannot read RocksDB properties: boom"
            ]
        );
        let text = render(&snap).unwrap();
        assert!(text.contains("hourglass_rocksdb_stats_available 0\n"), "{text}");
        assert!(!text.contains("hourglass_rocksdb_memtable"), "{text}");
    }
}
