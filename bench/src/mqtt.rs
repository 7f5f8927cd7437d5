//! MQTT driver: publishers on real broker connections sending the fleet as gateway messages
//! (`{prefix}/{table}`, many readings per message), QoS 0 or 1.
//!
//! Closed-loop for now: each connection keeps up to `inflight` messages unacknowledged and
//! publishes as fast as the broker acks. It measures what the broker path sustains.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::watch;

use crate::fleet::Fleet;
use crate::run::BacklogLimit;

/// What to publish.
#[derive(Debug, Clone)]
pub struct MqttSpec {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Topic prefix (the table comes from the fleet).
    pub topic_prefix: String,
    /// Publishing connections; devices are split evenly between them.
    pub connections: usize,
    /// Readings per message.
    pub readings_per_message: usize,
    /// First tick to publish.
    pub first_tick: u64,
    /// Ticks of the whole fleet to publish, from `first_tick`.
    pub ticks: u64,
    /// QoS 0 or 1.
    pub qos: u8,
}

/// What the publishers saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MqttReport {
    /// Messages published (and acked by the broker, for QoS 1).
    pub messages: u64,
    /// Readings in them.
    pub readings: u64,
    /// Seconds from the first publish to the last broker ack.
    pub publish_seconds: f64,
}

/// Publishes the fleet; returns once every message is sent (QoS 0) or acked by the broker.
/// With a `limit`, the publishers wait while as many readings as it allows are handed to the
/// broker and not stored: a broker acks on receipt and drops what its backlog cannot hold (the
/// embedded one past `mqtt.broker_backlog_mb`), so publishing as fast as it acks would lose
/// readings once the store falls behind. Once `stop` turns true, each publisher publishes
/// nothing more of its own and disconnects (what its client had queued goes out first, for at
/// most two seconds), and this answers [`STOPPED`].
pub async fn publish(
    fleet: Arc<Fleet>,
    spec: MqttSpec,
    sent: Arc<AtomicU64>,
    limit: Option<BacklogLimit>,
    stop: Option<watch::Receiver<bool>>,
) -> Result<MqttReport, String> {
    let devices = fleet.spec().devices;
    let conns = spec.connections.max(1) as u64;
    let started = Instant::now();
    let handed = Arc::new(AtomicU64::new(0));
    // A set, not handles: a caller that drops this future (the demo stopped during its
    // backfill) aborts the publishers with it, which went on publishing (QA56 F8).
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let lo = devices * c / conns;
        let hi = devices * (c + 1) / conns;
        let fleet = fleet.clone();
        let spec = spec.clone();
        let sent = sent.clone();
        let limit = limit.clone().map(|l| (l, handed.clone()));
        let stop = stop.clone();
        tasks.spawn(async move { publish_one(fleet, spec, c, lo..hi, sent, limit, stop).await });
    }
    let (mut messages, mut readings) = (0, 0);
    let mut stopped = false;
    while let Some(t) = tasks.join_next().await {
        match t.map_err(|e| e.to_string())? {
            Ok((m, r)) => {
                messages += m;
                readings += r;
            }
            // The others are disconnecting too: waited for, not aborted.
            Err(e) if e == STOPPED => stopped = true,
            // The others are aborted as the set is dropped.
            Err(e) => return Err(e),
        }
    }
    if stopped {
        return Err(STOPPED.to_string());
    }
    Ok(MqttReport { messages, readings, publish_seconds: started.elapsed().as_secs_f64() })
}

/// What [`publish`] answers when asked to stop.
pub const STOPPED: &str = "stopped before the end";

/// Whether `stop` (if any) has turned true; pending until then (for good without one, or once
/// its sender is gone).
async fn stop_asked(stop: &mut Option<watch::Receiver<bool>>) {
    let told = match stop {
        Some(rx) => rx.wait_for(|s| *s).await.is_ok(),
        None => false,
    };
    if !told {
        std::future::pending::<()>().await;
    }
}

/// A publisher's connection settings: 30 s keep-alive, messages up to 16 MiB.
fn options(client_id: String, spec: &MqttSpec) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, &spec.host, spec.port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(16 << 20, 16 << 20);
    o
}

async fn publish_one(
    fleet: Arc<Fleet>,
    spec: MqttSpec,
    conn: u64,
    devices: std::ops::Range<u64>,
    sent: Arc<AtomicU64>,
    limit: Option<(BacklogLimit, Arc<AtomicU64>)>,
    mut stop: Option<watch::Receiver<bool>>,
) -> Result<(u64, u64), String> {
    let mut o = options(format!("hourglass-bench-{conn}-{}", std::process::id()), &spec);
    o.set_inflight(100);
    let (client, mut eventloop) = AsyncClient::new(o, 200);
    let qos = if spec.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
    let topic = format!("{}/{}", spec.topic_prefix, fleet.spec().table);
    let n_dev = devices.end - devices.start;
    let per_msg = spec.readings_per_message.max(1) as u64;
    // Split the device range into chunks of a message each (ticks per message when the
    // connection has fewer devices than a message holds).
    let ticks_per_msg = (per_msg / n_dev.max(1)).max(1);
    let devs_per_msg = per_msg.min(n_dev.max(1));
    let mut readings = 0u64;
    let producer = {
        let client = client.clone();
        let topic = topic.clone();
        let fleet = fleet.clone();
        async move {
            let mut msgs = 0u64;
            let mut t = spec.first_tick;
            let last = spec.first_tick + spec.ticks;
            while t < last {
                let t_end = (t + ticks_per_msg).min(last);
                let mut d = devices.start;
                while d < devices.end {
                    let d_end = (d + devs_per_msg).min(devices.end);
                    let n = (d_end - d) * (t_end - t);
                    if let Some((limit, handed)) = &limit {
                        // The readings of every connection, this message's included.
                        let handed = handed.fetch_add(n, Ordering::Relaxed) + n;
                        limit.wait_for_room(handed).await.map_err(|e| e.to_string())?;
                    }
                    let payload = fleet.json_payload(d..d_end, t..t_end);
                    client.publish(&topic, qos, false, payload).await.map_err(|e| e.to_string())?;
                    msgs += 1;
                    readings += n;
                    d = d_end;
                }
                t = t_end;
            }
            Ok::<(u64, u64), String>((msgs, readings))
        }
    };
    tokio::pin!(producer);
    let mut produced: Option<(u64, u64)> = None;
    let mut acked = 0u64;
    let mut published = 0u64;
    let mut stopped = false;
    loop {
        if let Some((msgs, _)) = produced {
            let done = if qos == QoS::AtMostOnce { published >= msgs } else { acked >= msgs };
            if done {
                break;
            }
        }
        tokio::select! {
            () = stop_asked(&mut stop) => {
                stopped = true;
                break;
            }
            r = &mut producer, if produced.is_none() => produced = Some(r?),
            ev = eventloop.poll() => match ev {
                Ok(Event::Incoming(Packet::PubAck(_))) => { acked += 1; }
                Ok(Event::Outgoing(Outgoing::Publish(_))) => {
                    published += 1;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) => return Err(format!("publisher {conn}: {e}")),
            },
        }
    }
    // Read on until the broker closes the connection: closed here first with acks unread, the
    // socket is reset, which the broker logs as an error. The event loop is polled while the
    // request is queued: stopped, the client's queue may be full of publishes.
    let disconnect = client.disconnect();
    tokio::pin!(disconnect);
    let mut asked = false;
    let deadline = tokio::time::sleep(Duration::from_secs(2));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = &mut disconnect, if !asked => asked = true,
            ev = eventloop.poll() => if ev.is_err() { break },
        }
    }
    if stopped {
        return Err(STOPPED.to_string());
    }
    Ok(produced.unwrap_or((0, 0)))
}

/// Publishers that stay connected, for a fleet publishing in real time (the demo's live
/// trucks): each tick goes out on the same connections, as devices keep theirs, instead of a
/// connection opened and closed per tick. The connections' event loops run on tasks of their
/// own (a lost connection is retried every second); dropping the publishers stops them.
#[derive(Debug)]
pub struct LivePublishers {
    fleet: Arc<Fleet>,
    clients: Vec<(AsyncClient, std::ops::Range<u64>)>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
    topic: String,
    qos: QoS,
    per_message: u64,
}

impl LivePublishers {
    /// Connects `spec.connections` clients (the fleet's devices split evenly between them);
    /// `sent` counts the messages they put on the wire. `spec`'s ticks are not used.
    pub fn connect(fleet: Arc<Fleet>, spec: &MqttSpec, sent: Arc<AtomicU64>) -> LivePublishers {
        let devices = fleet.spec().devices;
        let conns = spec.connections.max(1) as u64;
        let (mut clients, mut pollers) = (Vec::new(), Vec::new());
        for c in 0..conns {
            let o = options(format!("hourglass-live-{c}-{}", std::process::id()), spec);
            let (client, mut eventloop) = AsyncClient::new(o, 200);
            let sent = sent.clone();
            pollers.push(tokio::spawn(async move {
                let mut closing = false;
                loop {
                    match eventloop.poll().await {
                        Ok(Event::Outgoing(Outgoing::Publish(_))) => {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                        // Closed by `close`: read on until the broker closes the connection (closed
                        // here first with acks unread, the socket is reset, which the broker logs
                        // as an error).
                        Ok(Event::Outgoing(Outgoing::Disconnect)) => closing = true,
                        Ok(_) => {}
                        Err(_) if closing => break,
                        // The next poll reconnects, on a new session: rumqttc drops what the
                        // connection had queued and not had acked.
                        Err(e) => {
                            tracing::warn!(
                                connection = c, error = %e,
                                "a simulated fleet's connection to the broker failed; reconnecting (the messages it \
                                 had queued and the broker had not acked are dropped)"
                            );
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }));
            clients.push((client, devices * c / conns..devices * (c + 1) / conns));
        }
        LivePublishers {
            topic: format!("{}/{}", spec.topic_prefix, fleet.spec().table),
            fleet,
            clients,
            pollers,
            qos: if spec.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce },
            per_message: spec.readings_per_message.max(1) as u64,
        }
    }

    /// Queues every device's reading of tick `t` (`per_message` readings a message); returns
    /// the readings queued. A connection that is down holds its messages until it is back (up
    /// to its queue; past that this waits).
    pub async fn publish_tick(&self, t: u64) -> Result<u64, String> {
        let mut readings = 0;
        for (client, devices) in &self.clients {
            let mut d = devices.start;
            while d < devices.end {
                let d_end = (d + self.per_message).min(devices.end);
                let payload = self.fleet.json_payload(d..d_end, t..t + 1);
                client.publish(&self.topic, self.qos, false, payload).await.map_err(|e| e.to_string())?;
                readings += d_end - d;
                d = d_end;
            }
        }
        Ok(readings)
    }
}

impl LivePublishers {
    /// Disconnects each connection (what its client had queued goes out first) and waits for
    /// them, at most a second, then stops what is left: the broker sees its clients leave
    /// rather than their connections reset, which it logs as errors.
    pub async fn close(mut self) {
        for (client, _) in &self.clients {
            let _ = client.disconnect().await;
        }
        let mut pollers = std::mem::take(&mut self.pollers);
        let all = async {
            for p in &mut pollers {
                let _ = p.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), all).await;
        pollers.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

impl Drop for LivePublishers {
    fn drop(&mut self) {
        self.pollers.iter().for_each(tokio::task::JoinHandle::abort);
    }
}
