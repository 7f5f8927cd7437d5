//! The Kafka consumer against librdkafka's in-process mock cluster, with faults injected: the
//! broker going down mid-stream and failing offset commits. The "store" here is a map of
//! offsets and a list of readings, updated together before the acks run, as the bucketer does
//! in one WriteBatch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingest::kafka::{KafkaConfig, KafkaControl, PartitionLag, StoredOffsets};
use ingest::mqtt::MqttStats;
use model::IngestBatch;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio::sync::mpsc;

type Offsets = Arc<Mutex<HashMap<(String, i32), i64>>>;
type Readings = Arc<Mutex<Vec<(String, i64)>>>;

/// Messages `from..to`, 10 readings each, keyed by one of 5 devices, over 2 partitions; the
/// reading timestamps are unique.
fn produce(brokers: &str, from: i64, to: i64) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    for m in from..to {
        let body: Vec<String> =
            (0..10).map(|k| format!(r#"{{"ts":{},"v":{k}}}"#, 1_704_067_200_000 + m * 10 + k)).collect();
        let payload = format!("[{}]", body.join(","));
        let key = format!("d{}", m % 5);
        producer.send(BaseRecord::to("t").partition((m % 2) as i32).key(&key).payload(&payload)).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Starts a consumer in `group` whose batches are "stored" into `offsets` and `readings`.
fn consumer(
    brokers: &str,
    group: &str,
    offsets: &Offsets,
    readings: &Readings,
) -> (KafkaControl, std::thread::JoinHandle<bool>, std::thread::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<IngestBatch>(4);
    let read = offsets.clone();
    let stored: StoredOffsets =
        Arc::new(move |topic, partition| Ok(read.lock().unwrap().get(&(topic.to_string(), partition)).copied()));
    let cfg = KafkaConfig {
        brokers: brokers.into(),
        group_id: group.into(),
        topics: vec!["t".into()],
        default_table: Some("mock".into()),
        session_timeout_ms: 6000,
        commit_interval: Duration::from_millis(100),
        flush_readings: 100,
        ..KafkaConfig::default()
    };
    let lag = Arc::new(PartitionLag::default());
    let (control, thread) =
        ingest::kafka::spawn(cfg, tx, Arc::new(MqttStats::default()), lag, stored).expect("consumer starts");
    let (offsets, readings) = (offsets.clone(), readings.clone());
    let writer = std::thread::spawn(move || {
        while let Some(batch) = rx.blocking_recv() {
            assert!(batch.dead_letters.is_empty(), "{:?}", batch.dead_letters);
            {
                let mut r = readings.lock().unwrap();
                r.extend(batch.readings.iter().map(|d| (d.device.to_string(), d.reading.ts)));
                let mut o = offsets.lock().unwrap();
                for s in &batch.offsets {
                    o.insert((s.topic.to_string(), s.partition), s.next_offset);
                }
            }
            for ack in batch.acks {
                ack.send();
            }
        }
    });
    (control, thread, writer)
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "condition not met within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(control: KafkaControl, thread: std::thread::JoinHandle<bool>, writer: std::thread::JoinHandle<()>) {
    control.stop_intake.send(true).unwrap();
    // The consumer drops its sender; the writer drains and ends.
    writer.join().unwrap();
    control.writer_done.send(true).unwrap();
    // With the cluster up, the close leaves the group within its limit.
    assert!(thread.join().unwrap(), "the consumer left its group");
}

/// Each (device, ts) of messages `from..to` exactly once.
fn expected(from: i64, to: i64) -> BTreeMap<(String, i64), u32> {
    (from..to)
        .flat_map(|m| (0..10).map(move |k| ((format!("d{}", m % 5), 1_704_067_200_000 + m * 10 + k), 1)))
        .collect()
}

fn counted(readings: &Readings) -> BTreeMap<(String, i64), u32> {
    let mut out = BTreeMap::new();
    for r in readings.lock().unwrap().iter() {
        *out.entry(r.clone()).or_insert(0) += 1;
    }
    out
}

/// The readings stored, counted per (device, ts), once `n` are (within `limit`) and half a
/// second more has passed (for any stored twice to show).
fn counted_once_stored(readings: &Readings, n: usize, limit: Duration) -> BTreeMap<(String, i64), u32> {
    wait_until(limit, || readings.lock().unwrap().len() >= n);
    std::thread::sleep(Duration::from_millis(500));
    counted(readings)
}

/// The stored next offsets, by (topic, partition).
fn next_offsets(offsets: &Offsets) -> BTreeMap<(String, i32), i64> {
    offsets.lock().unwrap().clone().into_iter().collect()
}

#[test]
fn broker_outage_and_failed_commits_lose_and_repeat_nothing_and_a_restart_resumes_at_the_stored_offsets() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("t", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    produce(&brokers, 0, 100);

    let offsets: Offsets = Arc::default();
    let readings: Readings = Arc::default();
    let (control, thread, writer) = consumer(&brokers, "g1", &offsets, &readings);
    wait_until(Duration::from_secs(30), || !readings.lock().unwrap().is_empty());
    // Faults mid-stream: offset commits fail, the broker goes away and comes back, more data.
    cluster.request_errors(RDKafkaApiKey::OffsetCommit, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 20]);
    cluster.broker_down(1).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cluster.broker_up(1).unwrap();
    produce(&brokers, 100, 200);
    assert_eq!(counted_once_stored(&readings, 2000, Duration::from_secs(60)), expected(0, 200));
    stop(control, thread, writer);
    assert_eq!(next_offsets(&offsets), BTreeMap::from([(("t".to_string(), 0), 100), (("t".to_string(), 1), 100)]));

    // A consumer of another group (no committed offsets at all, reset policy `earliest`)
    // starts at the stored offsets: it gets only what was produced since.
    produce(&brokers, 200, 220);
    let (control, thread, writer) = consumer(&brokers, "g2", &offsets, &readings);
    assert_eq!(counted_once_stored(&readings, 2200, Duration::from_secs(30)), expected(0, 220));
    stop(control, thread, writer);
}

/// A stored offset past a partition's end (the topic deleted and made again, or another
/// cluster under the same name): the broker answers the fetch "offset out of range" and
/// librdkafka starts the partition over at its `auto.offset.reset` end (`earliest` here).
/// Every message of the partition as it is now is stored, none taken for a redelivery of the
/// old log, and the offsets stored and committed from then on are the new log's; a partition
/// whose stored offset is in range resumes there.
#[test]
fn a_stored_offset_past_the_partitions_end_starts_it_over_and_loses_nothing() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("t", 2, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    // 20 messages a partition: message m is offset m / 2 of partition m % 2.
    produce(&brokers, 0, 40);
    let offsets: Offsets =
        Arc::new(Mutex::new(HashMap::from([(("t".to_string(), 0), 1000), (("t".to_string(), 1), 5)])));
    let readings: Readings = Arc::default();
    let (control, thread, writer) = consumer(&brokers, "g", &offsets, &readings);
    // Partition 0 whole; partition 1 from offset 5 (message 11) on.
    let mut want: BTreeMap<(String, i64), u32> = expected(0, 40);
    want.retain(|(_, ts), _| {
        let m = (ts - 1_704_067_200_000) / 10;
        m % 2 == 0 || m >= 11
    });
    assert_eq!(counted_once_stored(&readings, want.len(), Duration::from_secs(30)), want);
    stop(control, thread, writer);
    assert_eq!(next_offsets(&offsets), BTreeMap::from([(("t".to_string(), 0), 20), (("t".to_string(), 1), 20)]));

    // A restart resumes both partitions where the store is.
    produce(&brokers, 40, 60);
    let (control, thread, writer) = consumer(&brokers, "g", &offsets, &readings);
    want.extend(expected(40, 60));
    assert_eq!(counted_once_stored(&readings, want.len(), Duration::from_secs(30)), want);
    stop(control, thread, writer);
}
