//! Kafka driver: produces the fleet to a topic as gateway messages (JSON arrays of readings
//! naming their devices, many per message), and measures what the broker alone delivers to a
//! bare rdkafka consumer, the ceiling the Kafka ingest path is compared with.
//!
//! The topic must exist with its partitions (create it with the broker's tools); messages are
//! spread over the partitions by device chunk, each device's on one partition, every partition
//! with devices when there are as many devices.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::fleet::Fleet;

/// What to produce.
#[derive(Debug, Clone)]
pub struct KafkaSpec {
    /// Bootstrap brokers.
    pub brokers: String,
    /// Existing topic.
    pub topic: String,
    /// Its partition count.
    pub partitions: i32,
    /// Readings per message.
    pub readings_per_message: usize,
    /// Ticks of the whole fleet to produce.
    pub ticks: u64,
}

/// What the producer did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProduceReport {
    /// Messages produced (all acknowledged by the broker).
    pub messages: u64,
    /// Readings in them.
    pub readings: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Seconds from the first send to the last delivery.
    pub seconds: f64,
}

/// What a bare consumer read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConsumeReport {
    /// Messages read.
    pub messages: u64,
    /// Seconds from the first poll to the last message.
    pub seconds: f64,
}

/// Produces the fleet's ticks to the topic and waits until the broker has every message.
pub fn produce(fleet: &Fleet, spec: &KafkaSpec) -> Result<ProduceReport, String> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &spec.brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .set("message.max.bytes", "16000000")
        .create()
        .map_err(|e| format!("producer: {e}"))?;
    let devices = fleet.spec().devices;
    let per_msg = spec.readings_per_message.max(1) as u64;
    let (devs_per_msg, ticks_per_msg) = message_shape(devices, per_msg, spec.partitions);
    let started = Instant::now();
    let (mut messages, mut readings, mut bytes) = (0u64, 0u64, 0u64);
    let mut t = 0;
    while t < spec.ticks {
        let t_end = (t + ticks_per_msg).min(spec.ticks);
        let mut d = 0;
        while d < devices {
            let d_end = (d + devs_per_msg).min(devices);
            let payload = fleet.json_payload(d..d_end, t..t_end);
            // By device chunk: a device stays on one partition at every tick.
            let partition = ((d / devs_per_msg) % spec.partitions.max(1) as u64) as i32;
            let mut record = BaseRecord::<(), Vec<u8>>::to(&spec.topic).partition(partition).payload(&payload);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        r,
                    )) => {
                        record = r;
                        producer.poll(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(format!("produce: {e}")),
                }
            }
            producer.poll(Duration::ZERO);
            messages += 1;
            readings += (d_end - d) * (t_end - t);
            bytes += payload.len() as u64;
            d = d_end;
        }
        t = t_end;
    }
    producer.flush(Duration::from_secs(600)).map_err(|e| format!("flush: {e}"))?;
    Ok(ProduceReport { messages, readings, bytes, seconds: started.elapsed().as_secs_f64() })
}

/// The devices and the ticks of one message: at most `per_msg` readings, a tick cut into at
/// least as many device chunks as there are partitions (when there are as many devices), so
/// that every partition has devices and each device stays on one (its chunk's); a message
/// takes several ticks of its chunk when the chunk is smaller than `per_msg`.
fn message_shape(devices: u64, per_msg: u64, partitions: i32) -> (u64, u64) {
    let devices = devices.max(1);
    let devs_per_msg = per_msg.min(devices.div_ceil(partitions.max(1) as u64)).max(1);
    (devs_per_msg, (per_msg / devs_per_msg).max(1))
}

/// Reads every partition of the topic from the start with a bare consumer (no group, no
/// decoding) until `messages` messages arrived; at most `limit`.
pub fn consume_bare(spec: &KafkaSpec, messages: u64, limit: Duration) -> Result<ConsumeReport, String> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &spec.brokers)
        .set("group.id", format!("hourglass-bench-bare-{}", std::process::id()))
        .set("enable.auto.commit", "false");
    // The pipeline's fetch settings, so that both read the broker the same way.
    for (k, v) in ingest::kafka::FETCH_TUNING {
        config.set(*k, *v);
    }
    let consumer: BaseConsumer = config.create().map_err(|e| format!("consumer: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..spec.partitions {
        tpl.add_partition_offset(&spec.topic, p, Offset::Beginning).map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| format!("assign: {e}"))?;
    let started = Instant::now();
    let mut got = 0u64;
    let mut bytes = 0usize;
    while got < messages {
        if started.elapsed() > limit {
            return Err(format!("bare consumer read {got} of {messages} messages in {limit:?}"));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                got += 1;
                // Touch the payload, as any consumer would.
                bytes += rdkafka::Message::payload(&m).map_or(0, <[u8]>::len);
            }
            Some(Err(e)) => return Err(format!("consume: {e}")),
            None => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    std::hint::black_box(bytes);
    Ok(ConsumeReport { messages: got, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_cut_into_a_chunk_a_partition_at_least() {
        // The defaults (1,000 devices, 1,000 readings a message, 4 partitions): 4 chunks of 250
        // devices, each message 4 ticks of its chunk.
        assert_eq!(message_shape(1000, 1000, 4), (250, 4));
        // Chunks of `per_msg` devices when those are more than a partition's share.
        assert_eq!(message_shape(10_000, 1000, 4), (1000, 1));
        assert_eq!(message_shape(2000, 1000, 4), (500, 2));
        // Fewer devices than partitions: a device a message, every device on its own partition.
        assert_eq!(message_shape(3, 1000, 4), (1, 1000));
        assert_eq!(message_shape(0, 0, 0), (1, 1));
    }
}
