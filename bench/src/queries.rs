//! Query-service latency under ingest: one device-day of raw readings, and the latest values of
//! many devices in one request, asked over HTTP while a writer keeps committing readings.
//!
//! Split like the other harnesses: [`QuerySpec`] says what to load and ask; [`load`] writes the
//! history; [`Ingest`] is the concurrent writer; [`run`] drives the queries open-loop — query
//! `k` is due at `start + k / rate` and its latency runs from that due time to the last byte of
//! the answer, so a slow answer also delays (and is charged to) the queries queued behind it;
//! [`QueryReport`] holds HdrHistogram percentiles. Timing stays out of tests: numbers go to
//! BENCHMARKS.md with the command that produced them.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucketer::Store;
use model::{DeviceReading, Reading};

/// What to load and ask.
#[derive(Debug, Clone)]
pub struct QuerySpec {
    /// Base URL of the query service, `http://host:port`.
    pub base_url: String,
    /// Table of every reading.
    pub table: String,
    /// Devices with history (`dev_0` …); the latest query asks for all of them.
    pub devices: u64,
    /// Of those, the first this many carry a whole day at `interval_ms`; the others one
    /// reading. Raw reads pick among them.
    pub day_devices: u64,
    /// Start of the day of history, epoch ms (a UTC midnight).
    pub day_start: i64,
    /// Time between two readings of a day device, ms (10 s: 8,640 a day).
    pub interval_ms: i64,
    /// Queries of each kind.
    pub queries: u64,
    /// Queries per second of each kind (open loop).
    pub rate: f64,
    /// A bearer token, when the service checks them.
    pub token: Option<String>,
}

/// Fields of every reading: what a truck reports.
fn fields(i: i64) -> Vec<(model::FieldName, f64)> {
    vec![("fuel".into(), (i % 1000) as f64 * 0.1), ("velocity".into(), (i % 97) as f64 + 0.5)]
}

/// Writes the history of `spec`: a day at `interval_ms` for each day device, one reading for
/// each other device. Returns the readings written.
pub fn load(store: &Store, spec: &QuerySpec) -> bucketer::Result<u64> {
    let per_day = model::DAY_MS / spec.interval_ms;
    let mut written = 0;
    for d in 0..spec.devices {
        let n = if d < spec.day_devices { per_day } else { 1 };
        let (table, device): (Arc<str>, Arc<str>) = (spec.table.as_str().into(), format!("dev_{d}").into());
        let batch: Vec<DeviceReading> = (0..n)
            .map(|i| DeviceReading {
                table: table.clone(),
                device: device.clone(),
                reading: Reading::new(spec.day_start + i * spec.interval_ms, fields(i)),
            })
            .collect();
        written += batch.len() as u64;
        store.write(batch, &[])?;
    }
    store.flush()?;
    Ok(written)
}

/// A writer committing readings of `ingest_{i}` devices at a steady rate until stopped.
#[derive(Debug)]
pub struct Ingest {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<bucketer::Result<()>>,
}

impl Ingest {
    /// Starts writing `rate` readings per second to `table`, in batches of `batch` readings
    /// spread over `devices` devices, stamped with the wall clock.
    pub fn start(store: Arc<Store>, table: String, rate: f64, batch: usize, devices: u64) -> Ingest {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (stop_w, written_w) = (stop.clone(), written.clone());
        let table: Arc<str> = table.into();
        let names: Vec<Arc<str>> = (0..devices.max(1)).map(|d| format!("ingest_{d}").into()).collect();
        let thread = std::thread::spawn(move || {
            let every = Duration::from_secs_f64(batch as f64 / rate.max(1.0));
            let start = Instant::now();
            let mut k: u64 = 0;
            while !stop_w.load(Ordering::Relaxed) {
                let due = start + every.mul_f64(k as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let now = model::now_ms();
                let readings: Vec<DeviceReading> = (0..batch as u64)
                    .map(|i| {
                        let n = k * batch as u64 + i;
                        DeviceReading {
                            table: table.clone(),
                            device: names[(n % names.len() as u64) as usize].clone(),
                            reading: Reading::new(now, fields(n as i64)),
                        }
                    })
                    .collect();
                store.write(readings, &[])?;
                written_w.fetch_add(batch as u64, Ordering::Relaxed);
                k += 1;
            }
            Ok(())
        });
        Ingest { stop, written, thread }
    }

    /// Stops the writer; the readings it committed.
    pub fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("ingest thread panicked"))??;
        Ok(self.written.load(Ordering::Relaxed))
    }
}

/// Latency of one kind of query, from its due time to the answer's last byte.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Latency {
    /// Queries run.
    pub queries: u64,
    /// Bytes of the last answer.
    pub answer_bytes: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

/// What [`run`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryReport {
    /// One day of one device's raw readings in one page, JSON.
    pub device_day_raw: Latency,
    /// The latest reading of every device of the spec in one request, JSON.
    pub latest_of_devices: Latency,
}

/// GET on a kept-alive connection of `agent` (as a dashboard's browser would).
fn get(agent: &ureq::Agent, url: &str, token: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let mut req = agent.get(url).timeout(Duration::from_secs(30));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let res = req.call().map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    let mut body = Vec::new();
    res.into_reader().read_to_end(&mut body)?;
    Ok(body)
}

/// Runs `spec.queries` of `url(k)` open-loop at `spec.rate`, after `warm` unmeasured ones;
/// `check` validates the first answer.
fn drive(
    spec: &QuerySpec,
    warm: u64,
    url: impl Fn(u64) -> String,
    check: impl Fn(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<Latency> {
    let agent = ureq::AgentBuilder::new().max_idle_connections_per_host(1).build();
    for k in 0..warm {
        get(&agent, &url(k), spec.token.as_deref())?;
    }
    check(&get(&agent, &url(0), spec.token.as_deref())?)?;
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let every = Duration::from_secs_f64(1.0 / spec.rate.max(0.001));
    let start = Instant::now();
    let mut bytes = 0;
    for k in 0..spec.queries {
        let due = start + every.mul_f64(k as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        bytes = get(&agent, &url(k), spec.token.as_deref())?.len() as u64;
        hist.record(due.elapsed().as_micros().max(1) as u64)?;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Latency {
        queries: spec.queries,
        answer_bytes: bytes,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        max_ms: hist.max() as f64 / 1000.0,
    })
}

/// Asks the raw device-day read and the latest-of-all-devices read, each open-loop; the first
/// answer of each is checked (8,640 readings at 10 s; one entry per device).
pub fn run(spec: &QuerySpec) -> anyhow::Result<QueryReport> {
    let per_day = (model::DAY_MS / spec.interval_ms) as usize;
    let raw_url = |k: u64| {
        format!(
            "{}/v1/tables/{}/devices/dev_{}/readings?from={}&to={}",
            spec.base_url,
            spec.table,
            k % spec.day_devices.max(1),
            spec.day_start,
            spec.day_start + model::DAY_MS
        )
    };
    let device_day_raw = drive(spec, 20, raw_url, |body| {
        let v: serde_json::Value = serde_json::from_slice(body)?;
        let n = v["readings"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(n == per_day && v["next_cursor"].is_null(), "raw read: {n} readings, want {per_day}");
        Ok(())
    })?;
    let names: Vec<String> = (0..spec.devices).map(|d| format!("dev_{d}")).collect();
    let latest_url = format!("{}/v1/tables/{}/latest?devices={}", spec.base_url, spec.table, names.join(","));
    let want = spec.devices as usize;
    let latest_of_devices = drive(
        spec,
        20,
        |_| latest_url.clone(),
        |body| {
            let v: serde_json::Value = serde_json::from_slice(body)?;
            let found = v["latest"].as_array().map_or(0, |l| l.iter().filter(|e| !e["reading"].is_null()).count());
            anyhow::ensure!(found == want, "latest: {found} devices with a reading, want {want}");
            Ok(())
        },
    )?;
    Ok(QueryReport { device_day_raw, latest_of_devices })
}
