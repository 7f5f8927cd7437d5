//! `hourglass bench record` and `hourglass bench replay`: the load-test harness's command
//! line. Workloads, recordings, drivers and reports live in the `bench` crate; this module
//! parses the flags, starts the pipeline under test (in this process, in a temp dir) and
//! measures what only the binary can see (the store's bytes per value after the run).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bench::record::{RecordReader, RecordWriter};
use bench::run::{KafkaTarget, MqttTarget, PayloadFormat, RunSpec, Source, Target};
use bench::workload::{Generator, TableKind, WorkloadSpec};
use clap::{Args, ValueEnum};
use ingest::mqtt::MqttConfig;

use crate::config::Config;
use crate::{say, serve};

/// The workload to generate.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkloadArgs {
    /// Trucks in the fleet.
    #[arg(long, default_value_t = 1000)]
    devices: u64,
    /// Simulated time span (`10m`, `1h`, …); ticks = duration / interval.
    #[arg(long, default_value = "1h")]
    duration: String,
    /// Time between two points of a truck (`10s`, `1m`, …).
    #[arg(long, default_value = "10s")]
    interval: String,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Share of the scheduled points dropped, 0 to 1.
    #[arg(long, default_value_t = 0.01)]
    missing_share: f64,
    /// Share of the scheduled points sent late (out of order), 0 to 1: each point is dropped,
    /// late or on time, so the two shares add up to at most 1, and the late share of the points
    /// sent is this over (1 − the missing share).
    #[arg(long, default_value_t = 0.01)]
    out_of_order_share: f64,
    /// A late point comes after 1 to this many later ticks.
    #[arg(long, default_value_t = 30)]
    max_delay_ticks: u64,
    /// Timestamp of the first tick, epoch ms (default 2024-01-01T00:00:00Z).
    #[arg(long, default_value_t = 1_704_067_200_000)]
    start_ms: i64,
    /// Tables are `{prefix}.readings` and `{prefix}.diagnostics`.
    #[arg(long, default_value = "iot")]
    table_prefix: String,
}

impl WorkloadArgs {
    fn spec(&self) -> anyhow::Result<WorkloadSpec> {
        let duration = model::parse_duration_ms(&self.duration)
            .ok_or_else(|| anyhow::anyhow!("--duration `{}`: use e.g. 10m, 1h", self.duration))?;
        let interval = model::parse_duration_ms(&self.interval)
            .ok_or_else(|| anyhow::anyhow!("--interval `{}`: use e.g. 10s, 1m", self.interval))?;
        anyhow::ensure!(duration >= interval, "--duration must be at least one --interval");
        // A tick a whole interval: a remainder would be dropped from the span without a word.
        anyhow::ensure!(
            duration % interval == 0,
            "--duration {} is not a whole number of --interval {} ({} ticks and {} ms more)",
            self.duration,
            self.interval,
            duration / interval,
            duration % interval
        );
        let spec = WorkloadSpec {
            devices: self.devices,
            ticks: duration / interval,
            interval_ms: interval as i64,
            start_ms: self.start_ms,
            seed: self.seed,
            missing_share: self.missing_share,
            out_of_order_share: self.out_of_order_share,
            max_delay_ticks: self.max_delay_ticks,
            table_prefix: self.table_prefix.clone(),
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// `hourglass bench record`.
#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// The recording to write.
    #[arg(long)]
    out: PathBuf,
    /// Also write the workload as InfluxDB line protocol (ms timestamps) here, with
    /// `{path}.meta.json` (counts and time range, as the peers' scripts read them). Its
    /// measurements are `readings` and `diagnostics`, as the peers' queries name them, whatever
    /// `--table-prefix`.
    #[arg(long)]
    line_protocol: Option<PathBuf>,
    /// Points a frame (a replay sends one frame a batch).
    #[arg(long, default_value_t = 10_000)]
    frame_points: usize,
}

/// `hourglass bench report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// A run's `report.json` (or a copy under another name).
    json: PathBuf,
    /// Where to write the summary and the chart (default: beside the JSON): `{name}.md` and
    /// `{name}.png`, after the JSON's name.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// The driver of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DriverKind {
    /// MQTT through the embedded broker (or `--mqtt-url`).
    Mqtt,
    /// Straight into the store: the storage ceiling.
    InProcess,
    /// Through a Kafka broker (`--kafka-brokers`), consumed by the pipeline's Kafka consumer.
    Kafka,
}

/// What the Kafka driver's messages hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum KafkaPayload {
    /// InfluxDB line protocol on one topic (measurement = table, the truck's tags on each line).
    Lp,
    /// JSON gateway arrays as on MQTT, a topic per table.
    Json,
}

/// `hourglass bench replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// A recording to send; without one the workload flags generate it on the fly (they are
    /// refused beside it: the recording holds its workload).
    #[arg(long, conflicts_with = "WorkloadArgs")]
    file: Option<PathBuf>,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// How the points are sent.
    #[arg(long, value_enum, default_value_t = DriverKind::Mqtt)]
    driver: DriverKind,
    /// Points a second (open loop); 0: as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Points a batch when generating (a recording keeps its frames).
    #[arg(long, default_value_t = 10_000, conflicts_with = "file")]
    batch_points: usize,
    /// MQTT connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Points a message.
    #[arg(long, default_value_t = 100)]
    per_message: usize,
    /// MQTT driver: the pipeline reads each of the workload's two tables on a connection of
    /// its own (`mqtt.subscriptions`), instead of both on one.
    #[arg(long)]
    subscription_per_table: bool,
    /// QoS of the publishers (0 or 1).
    #[arg(long, default_value_t = 1)]
    qos: u8,
    /// Publish through this external broker (mqtt://host:port, plain TCP without a login) instead
    /// of the embedded one.
    #[arg(long)]
    mqtt_url: Option<String>,
    /// Address of the run's query service (the run reads no hourglass.toml or `HOURGLASS_*`
    /// variables: its pipeline is set by these flags). Port 0: a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    http_listen: std::net::SocketAddr,
    /// MQTT driver: address of the run's embedded broker (unused with --mqtt-url). Port 0: a
    /// free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    mqtt_listen: std::net::SocketAddr,
    /// MQTT driver: at most this many points sent and not yet stored; the publishers wait for
    /// the store beyond it. A broker acks on receipt and drops messages once its backlog is
    /// full (the embedded one past mqtt.broker_backlog_mb, about 7M points of this workload at
    /// the default; mosquitto past max_queued_messages, 1,000 messages by default), so a replay
    /// that outruns the store would lose points. Default as fast as possible: 500000 through the
    /// embedded broker, 250 messages (250 × --per-message points) through --mqtt-url; none at a
    /// set --rate (open loop); 0: none.
    #[arg(long)]
    max_backlog: Option<u64>,
    /// Kafka driver: bootstrap brokers, `host:port` (several: comma-separated). The run creates its own topics
    /// (`{--kafka-topic-prefix}-{run}-lp`, or `-readings` and `-diagnostics` for JSON).
    #[arg(long)]
    kafka_brokers: Option<String>,
    /// Kafka driver: what the messages hold.
    #[arg(long, value_enum, default_value_t = KafkaPayload::Lp)]
    kafka_format: KafkaPayload,
    /// Kafka driver: partitions of each topic created.
    #[arg(long, default_value_t = 4)]
    kafka_partitions: i32,
    /// Kafka driver: start of the names of the topics created.
    #[arg(long, default_value = "hourglass-bench")]
    kafka_topic_prefix: String,
    /// Kafka driver: produce the whole workload before the pipeline starts, then measure the
    /// pipeline draining that backlog (as after downtime) with no producer competing for the
    /// machine; no end-to-end latency then. An interrupt while producing stops it; the pipeline
    /// then drains what was produced and the report says it stopped early.
    #[arg(long)]
    kafka_preload: bool,
    /// Kafka driver: keep the run's topics after it (deleted by default: each run makes its own).
    #[arg(long)]
    kafka_keep_topics: bool,
    /// Kafka driver: a configuration file (as `serve` takes) whose `[kafka]` TLS and login
    /// settings (`security_protocol`, `ca_file`, `cert_file`, `key_file`, `sasl_mechanism`,
    /// `username`, `password`) the run's producer, topic admin and pipeline consumer use, for
    /// brokers that ask for them; its other settings are not used.
    #[arg(long, value_name = "FILE")]
    kafka_config: Option<PathBuf>,
    /// Seconds without progress after which the run fails, reporting the run until then: the
    /// stored count not moving once points were sent (the system under test lost points or is
    /// stuck), or through Kafka no delivery report from the broker while messages wait (it is
    /// gone or stopped taking them; the producer's queue is dropped).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    stall_timeout: u64,
    /// Queries a second during the run (a mix of latest, raw and roll-up); 0: none.
    #[arg(long, default_value_t = 20.0)]
    query_rate: f64,
    /// One end-to-end sample about every this many ms; 0: none.
    #[arg(long, default_value_t = 100)]
    e2e_sample_ms: u64,
    /// Write report.json, report.md and report.png here.
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Skip the full compaction and scan after the run (no bytes per value).
    #[arg(long)]
    no_compaction: bool,
    /// Keep the store here instead of a temp dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    store: crate::demo::StoreArgs,
    /// After the run, close the workload's hours for roll-ups: write one reading of device
    /// `watermark` to `{prefix}.clock` past the last hour plus the allowed lateness (as the next
    /// hour's data would in a live feed), and wait until every hour is rolled up. That reading
    /// must be before the clock (roll-ups close only hours the clock has reached).
    #[arg(long)]
    close_hours: bool,
    /// Before the run, register every truck with its tags (fleet, driver, model, …) under the
    /// group `fleet/{its fleet}`, as an operator would place a fleet: each fleet then has its
    /// own group roll-ups.
    #[arg(long)]
    place_by_fleet: bool,
    /// The flags given on the command line (their ids), not taking their defaults: one that
    /// the run would ignore is refused.
    #[arg(skip)]
    given: Vec<String>,
}

impl ReplayArgs {
    /// Notes which of the flags `matches` (this command's) were given on the command line.
    pub(crate) fn given_on_command_line(&mut self, matches: &clap::ArgMatches) {
        self.given = matches
            .ids()
            .filter(|id| matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
            .map(|id| id.to_string())
            .collect();
    }

    /// Flags given that this run would ignore: those of another driver, and with
    /// `--kafka-preload` those of a run's pace (it produces before the pipeline starts).
    fn ignored_flags(&self) -> anyhow::Result<()> {
        let for_driver = |id: &str| match id {
            "connections" | "qos" | "mqtt_url" | "mqtt_listen" | "subscription_per_table" | "max_backlog" => {
                Some(self.driver == DriverKind::Mqtt)
            }
            "per_message" => Some(self.driver != DriverKind::InProcess),
            "kafka_brokers" | "kafka_format" | "kafka_partitions" | "kafka_topic_prefix" | "kafka_preload"
            | "kafka_keep_topics" | "kafka_config" => Some(self.driver == DriverKind::Kafka),
            _ => None,
        };
        let flags = |ids: Vec<&String>| ids.iter().map(|id| format!("--{}", id.replace('_', "-"))).collect::<Vec<_>>();
        let other_driver = flags(self.given.iter().filter(|id| for_driver(id) == Some(false)).collect());
        if !other_driver.is_empty() {
            let driver = self.driver.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
            anyhow::bail!("{} would be ignored by this run's driver, {driver}", other_driver.join(", "));
        }
        // QA50 L1: it was ignored without a word.
        anyhow::ensure!(
            self.mqtt_url.is_none() || !self.given.iter().any(|id| id == "mqtt_listen"),
            "--mqtt-listen would be ignored with --mqtt-url: the run publishes through that broker and starts none \
             of its own"
        );
        let pace = flags(self.given.iter().filter(|id| ["rate", "e2e_sample_ms"].contains(&id.as_str())).collect());
        anyhow::ensure!(
            !self.kafka_preload || pace.is_empty(),
            "{} would be ignored with --kafka-preload: the workload is produced as fast as possible before the \
             pipeline starts, and no end-to-end latency is measured",
            pace.join(", ")
        );
        Ok(())
    }
}

/// `--max-backlog` with its default: as fast as possible (`rate` 0), 500,000 points through
/// the embedded broker, and through an external one (`external`) [`EXTERNAL_BROKER_MESSAGES`]
/// messages of `per_message` points; none at a set rate; 0 is none.
fn max_backlog(given: Option<u64>, rate: f64, external: bool, per_message: usize) -> Option<u64> {
    match given {
        Some(0) => None,
        Some(n) => Some(n),
        None if rate > 0.0 => None,
        None if external => Some(EXTERNAL_BROKER_MESSAGES * per_message.max(1) as u64),
        None => Some(DEFAULT_MAX_BACKLOG),
    }
}

/// Points sent and not stored a replay as fast as possible allows by default: at about 150
/// bytes of JSON a point, 75 MB, a fourteenth of what the embedded broker holds by default,
/// and a few seconds of the store's work.
pub(crate) const DEFAULT_MAX_BACKLOG: u64 = 500_000;

/// Messages sent and not stored a replay through an external broker allows by default: a quarter
/// of mosquitto's default `max_queued_messages` (1,000 a client), past which it drops messages it
/// acked to the publishers. A commit's acks reach the broker after the stored count shows it, so
/// the broker can hold up to twice the backlog at once (half its queue took 5,000 of 118,824
/// points dropped on a loaded machine).
pub(crate) const EXTERNAL_BROKER_MESSAGES: u64 = 250;

/// `hourglass bench record`: prints what it wrote as JSON.
/// `hourglass bench report`: draws a run's Markdown summary and chart again from its JSON,
/// with this binary's code (after the summary's or the chart's code changed).
pub(crate) fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let json = &args.json;
    let bytes = std::fs::read(json).with_context(|| format!("read {}", json.display()))?;
    let report = bench::report::RunReport::from_json(&bytes).with_context(|| json.display().to_string())?;
    let stem = json.file_stem().with_context(|| format!("{}: no file name", json.display()))?;
    let dir = match &args.out_dir {
        Some(dir) => dir.clone(),
        None => json.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    // Not `with_extension`: a name with dots of its own (`run.v2.json`) would lose a part.
    let name = |ext: &str| {
        let mut name = stem.to_os_string();
        name.push(ext);
        dir.join(name)
    };
    let (md, png) = (name(".md"), name(".png"));
    anyhow::ensure!(md != *json && png != *json, "{}: the summary would replace the JSON", json.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    report.write_views(&md, &png)?;
    say(&format!("wrote {} and {}", md.display(), png.display()));
    Ok(())
}

pub(crate) async fn record(args: RecordArgs) -> anyhow::Result<()> {
    let spec = args.workload.spec()?;
    anyhow::ensure!(args.frame_points >= 1, "--frame-points must be at least 1");
    let out = args.out.clone();
    let lp = args.line_protocol.clone();
    // One file for both would leave the line protocol where the recording was.
    if let Some(lp) = &lp {
        let (a, b) = (std::path::absolute(&out)?, std::path::absolute(lp)?);
        anyhow::ensure!(a != b, "--out and --line-protocol name one file, {}: give each its own", out.display());
    }
    let frame_points = args.frame_points;
    // An interrupt stops the writing. Each file is written under a temporary name and takes its
    // path once whole (`Output`): a run cut short or failed removes its own files only, and
    // leaves what was at the paths as it was (a line protocol cut short would load into a peer
    // as if it were the workload; a recording cut short would be refused).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let interrupts = {
        let stop = stop.clone();
        tokio::spawn(async move {
            serve::shutdown_signal().await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let with_lp = lp.is_some();
    let stopped = move || stop.load(Ordering::Relaxed);
    let summary = tokio::task::spawn_blocking(move || -> anyhow::Result<serde_json::Value> {
        // Both files are made before anything is written: one that cannot be leaves neither.
        let lp = match lp {
            Some(path) => {
                let output =
                    Output::new(&path).map_err(|e| anyhow::anyhow!("--line-protocol {}: {e}", path.display()))?;
                let file = output.create().map_err(|e| anyhow::anyhow!("--line-protocol {}: {e}", path.display()))?;
                Some((path, output, file))
            }
            None => None,
        };
        let started = Instant::now();
        let mut generator = Generator::new(spec.clone())?;
        let recording = Output::new(&out).map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?;
        let file = recording.create().map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
        let mut writer = RecordWriter::new(std::io::BufWriter::with_capacity(1 << 20, Counted(file, 0)), &spec)?;
        let progress = bench::progress::bar(spec.expected_points(), None);
        let mut points = Vec::new();
        while generator.next_batch(frame_points, &mut points) {
            writer.write_frame(&points)?;
            progress.inc(points.len() as u64);
            if stopped() {
                return Err(bench::Error::Stopped.into());
            }
        }
        let Counted(_, bytes) = writer.finish()?.into_inner().map_err(|e| e.into_error())?;
        progress.finish_and_clear();
        let counts = generator.counts();
        let mut summary = serde_json::json!({
            "recording": out,
            "spec": spec,
            "counts": counts,
            "field_values": counts.values(),
            "bytes": bytes,
            "bytes_per_point": (counts.points() > 0).then(|| bytes as f64 / counts.points() as f64),
            "seconds": started.elapsed().as_secs_f64(),
        });
        if let Some((lp, output, file)) = lp {
            let started = Instant::now();
            let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
            let progress = bench::progress::bar(counts.points(), None);
            let meta = bench::workload::write_line_protocol(&spec, &mut w, &mut |lines| {
                progress.inc(lines);
                !stopped()
            })?;
            progress.finish_and_clear();
            w.flush()?;
            // Beside a regular file only (not `/dev/null.meta.json`).
            let meta_path = output.regular().then(|| PathBuf::from(format!("{}.meta.json", lp.display())));
            if let Some(meta_path) = &meta_path {
                let meta_out = Output::new(meta_path)?;
                meta_out.create()?.write_all(&serde_json::to_vec_pretty(&meta)?)?;
                meta_out.commit()?;
            }
            output.commit()?;
            summary["line_protocol"] = serde_json::json!({
                "path": lp, "meta": meta_path, "lines": meta.lines, "bytes": meta.bytes,
                "seconds": started.elapsed().as_secs_f64(),
            });
        }
        recording.commit()?;
        Ok(summary)
    })
    .await?;
    interrupts.abort();
    let summary = match summary {
        Ok(summary) => summary,
        Err(e) if matches!(e.downcast_ref::<bench::Error>(), Some(bench::Error::Stopped)) => {
            return Err(Interrupted::Recording { line_protocol: with_lp }.into());
        }
        Err(e) => return Err(e),
    };
    say(&serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// An output file of `record`, written under a temporary name beside its path (`.NAME.partial-PID`)
/// and renamed onto it by [`Output::commit`], once whole: until then, and for good if the run
/// is cut short or fails (the temporary file is removed when the `Output` is dropped
/// uncommitted), whatever was at the path is as it was. A path that names something other than
/// a regular file (`/dev/null`, a FIFO) is written in place and never removed; a symbolic link
/// is followed, and its target is what the file replaces.
struct Output {
    /// Where the file ends: the path, its links followed.
    path: PathBuf,
    /// The temporary file; `None` when written in place.
    temp: Option<PathBuf>,
    committed: bool,
}

impl Output {
    fn new(path: &Path) -> anyhow::Result<Output> {
        let path = follow_links(path);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => anyhow::bail!("is a directory"),
            Ok(m) if !m.is_file() => {
                return Ok(Output { path, temp: None, committed: false });
            }
            _ => {}
        }
        let name = path.file_name().ok_or_else(|| anyhow::anyhow!("names no file"))?;
        let temp = path.with_file_name(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
        Ok(Output { path, temp: Some(temp), committed: false })
    }

    /// Whether the file ends as a regular file (not one written in place).
    fn regular(&self) -> bool {
        self.temp.is_some()
    }

    /// The file to write (created, or truncated when in place).
    fn create(&self) -> std::io::Result<std::fs::File> {
        std::fs::File::create(self.temp.as_ref().unwrap_or(&self.path))
    }

    /// The file, whole, takes its path.
    fn commit(mut self) -> std::io::Result<()> {
        if let Some(temp) = &self.temp {
            std::fs::rename(temp, &self.path)?;
        }
        self.committed = true;
        Ok(())
    }
}

/// A writer that counts the bytes written through it.
struct Counted<W>(W, u64);

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(buf)?;
        self.1 += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.as_ref().filter(|_| !self.committed) {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// `path` with its symbolic links followed (at most 40, as the kernel does), to a path that is
/// not a link (or does not exist yet).
fn follow_links(path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        path = match path.parent() {
            Some(dir) => dir.join(target),
            None => target,
        };
    }
    path
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Registers every truck of `spec` with its tags under the group `fleet/{fleet}`.
fn place_by_fleet(store: &bucketer::Store, spec: &WorkloadSpec) -> anyhow::Result<()> {
    let started = Instant::now();
    for d in 0..spec.devices {
        let tags = bench::workload::tags(spec, d);
        let pairs = tags.pairs().into_iter().filter(|(k, _)| *k != "name").map(|(k, v)| (k.to_string(), v)).collect();
        store.set_device(&tags.name, Some("truck"), pairs, Some(&format!("fleet/{}", tags.fleet)))?;
    }
    tracing::info!(
        trucks = spec.devices,
        seconds = started.elapsed().as_secs_f64(),
        "trucks placed under fleet/{{fleet}}"
    );
    Ok(())
}

/// The Kafka driver's target for `topics`.
fn kafka_target(args: &ReplayArgs, cfg: &Config, topics: [String; 2]) -> KafkaTarget {
    KafkaTarget {
        brokers: args.kafka_brokers.clone().unwrap_or_default(),
        topics,
        partitions: args.kafka_partitions,
        per_message: args.per_message,
        format: match args.kafka_format {
            KafkaPayload::Lp => PayloadFormat::LineProtocol,
            KafkaPayload::Json => PayloadFormat::Json,
        },
        max_payload_bytes: cfg.mqtt.max_payload_bytes,
        client: kafka_client(cfg),
    }
}

/// The librdkafka settings of `cfg`'s Kafka TLS and login, for the harness's own clients.
fn kafka_client(cfg: &Config) -> Vec<(String, String)> {
    cfg.kafka.security().properties().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Takes the `[kafka]` TLS and login settings of the file at `path` (`--kafka-config`) into
/// `cfg`, once checked as `serve` checks them (librdkafka reading the files).
fn take_kafka_security(cfg: &mut Config, path: &Path) -> anyhow::Result<()> {
    // Said here: the loader's own words for a file it cannot read are --config's.
    std::fs::File::open(path).with_context(|| format!("--kafka-config {}: cannot read it", path.display()))?;
    let file = Config::load_with(Some(path), std::iter::empty(), |_| ())
        .map_err(|problems| crate::config::problems_error(&problems))
        .with_context(|| format!("--kafka-config {}", path.display()))?;
    let (k, from) = (&mut cfg.kafka, file.kafka);
    k.security_protocol = from.security_protocol;
    k.ca_file = from.ca_file;
    k.cert_file = from.cert_file;
    k.key_file = from.key_file;
    k.sasl_mechanism = from.sasl_mechanism;
    k.username = from.username;
    k.password = from.password;
    k.enabled = true;
    let problems = k.security_problems();
    anyhow::ensure!(
        problems.is_empty(),
        "--kafka-config {}: {}",
        path.display(),
        problems.iter().map(|(key, message)| format!("{key} {message}")).collect::<Vec<_>>().join("; ")
    );
    Ok(())
}

/// What the run leaves on brokers once its pipeline has stopped: the Kafka driver's topics are
/// deleted, the MQTT sessions on an external broker ended.
async fn leave_the_brokers(args: &ReplayArgs, cfg: &Config) {
    drop_kafka_topics(args, cfg).await;
    forget_mqtt_sessions(args, cfg).await;
}

/// Ends the persistent sessions the run's consumer had on an external broker (`--mqtt-url`):
/// each run has a client id of its own, so they would never be taken up again, and the broker
/// would keep queueing its later traffic on the run's topics for them (a stock mosquitto never
/// expires them). Connecting with a clean session discards a session, and leaving ends the new
/// one. A failure is a warning (the report stands).
async fn forget_mqtt_sessions(args: &ReplayArgs, cfg: &Config) {
    let Some((url, consumer)) = external_consumer(args, cfg) else {
        return;
    };
    let consumer = match consumer {
        Ok(c) => c,
        Err(e) => return tracing::warn!(error = %e, "the run's MQTT sessions could not be ended"),
    };
    for id in consumer.client_ids() {
        let mut options = rumqttc::MqttOptions::new(id.clone(), consumer.host.clone(), consumer.port);
        options.set_clean_session(true);
        let (client, mut events) = rumqttc::AsyncClient::new(options, 4);
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        let _ = client.disconnect().await;
                    }
                    Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .await;
        match ended {
            Ok(Ok(())) => tracing::info!(client_id = %id, broker = url, "the run's MQTT session ended"),
            Ok(Err(e)) => {
                tracing::warn!(client_id = %id, broker = url, error = %e, "the run's MQTT session could not be ended")
            }
            Err(_) => {
                tracing::warn!(client_id = %id, broker = url, "the run's MQTT session could not be ended in 10 s")
            }
        }
    }
}

/// Refuses a `--mqtt-url` of a TLS listener: a load test's publishers and consumer reach their
/// broker over plain TCP, without a login (a broker's TLS and logins are `serve`'s settings,
/// `mqtt.ca_file`, `mqtt.username`...).
pub(crate) fn plain_broker_url(url: &str) -> anyhow::Result<()> {
    let broker = MqttConfig::default().with_url(url).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !broker.tls_scheme,
        "--mqtt-url {url}: a load test reaches its broker over plain TCP without a login; give it a plain listener \
         (mqtt://host:port) of the broker"
    );
    // A host that does not resolve (a typo: a bare word is a host, on port 1883) is said now,
    // not after the pipeline's start and the connections' timeout.
    std::net::ToSocketAddrs::to_socket_addrs(&(broker.host.as_str(), broker.port))
        .map_err(|e| anyhow::anyhow!("--mqtt-url {url}: the host {:?} does not resolve: {e}", broker.host))?;
    Ok(())
}

/// The pipeline's MQTT consumer of a run through an external broker (`--mqtt-url`), and the url.
fn external_consumer<'a>(args: &'a ReplayArgs, cfg: &Config) -> Option<(&'a str, Result<MqttConfig, String>)> {
    let url = args.mqtt_url.as_deref().filter(|_| args.driver == DriverKind::Mqtt)?;
    let consumer = MqttConfig {
        client_id: cfg.mqtt.client_id.clone(),
        subscriptions: cfg.mqtt.subscriptions.clone(),
        ..MqttConfig::default()
    };
    Some((url, consumer.with_url(url)))
}

/// Deletes the Kafka driver's topics of this run (`cfg.kafka.topics`) once the pipeline has
/// stopped reading them, unless `--kafka-keep-topics`; a failure is a warning (the report
/// stands).
async fn drop_kafka_topics(args: &ReplayArgs, cfg: &Config) {
    if args.driver != DriverKind::Kafka || args.kafka_keep_topics || cfg.kafka.topics.is_empty() {
        return;
    }
    let (brokers, client, topics) = (cfg.kafka.brokers.clone(), kafka_client(cfg), cfg.kafka.topics.clone());
    let deleted = tokio::task::spawn_blocking(move || {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        bench::run::delete_kafka_topics(&brokers, &client, &names)
    })
    .await;
    match deleted {
        Ok(Ok(())) => tracing::info!(topics = %cfg.kafka.topics.join(","), "the run's Kafka topics deleted"),
        Ok(Err(e)) => {
            tracing::warn!(topics = %cfg.kafka.topics.join(","), error = %e, "the run's Kafka topics were not deleted")
        }
        Err(e) => {
            tracing::warn!(topics = %cfg.kafka.topics.join(","), error = %e, "the run's Kafka topics were not deleted")
        }
    }
}

/// The event time of the reading that closes a workload's hours for roll-ups
/// (`--close-hours`): past its last hour, its latest points and the allowed lateness, as the
/// next hour's data would be in a live feed.
fn closing_ts(wspec: &bench::workload::WorkloadSpec, allowed_lateness_ms: u64) -> i64 {
    wspec.end_ms() + wspec.max_delay_ticks as i64 * wspec.interval_ms + allowed_lateness_ms as i64 + model::HOUR_MS
}

/// `hourglass bench replay`: prints the report as JSON (and writes the report files).
pub(crate) async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rate_ok = |rate: f64| rate == 0.0 || (rate.is_finite() && rate >= bench::run::MIN_RATE);
    anyhow::ensure!(
        rate_ok(args.rate),
        "--rate must be 0 (as fast as possible) or at least {} points a second",
        bench::run::MIN_RATE
    );
    anyhow::ensure!(
        rate_ok(args.query_rate),
        "--query-rate must be 0 (no queries) or at least {} queries a second",
        bench::run::MIN_RATE
    );
    anyhow::ensure!(args.qos <= 1, "--qos must be 0 or 1");
    anyhow::ensure!(
        args.connections >= 1 && args.per_message >= 1,
        "--connections and --per-message must be at least 1"
    );
    anyhow::ensure!(args.batch_points >= 1, "--batch-points must be at least 1");
    args.ignored_flags()?;
    if let Some(url) = &args.mqtt_url {
        plain_broker_url(url)?;
    }
    let mut variables: Vec<String> =
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).filter(|k| k.starts_with("HOURGLASS_")).collect();
    if !variables.is_empty() {
        variables.sort();
        tracing::warn!(
            variables = %variables.join(" "),
            "a replay's pipeline is set by its flags alone: these HOURGLASS_* variables are not read (see --help)"
        );
    }
    // The report's directory is made (or found unusable) now, not after the run.
    if let Some(dir) = &args.report_dir {
        // A file, or a link to nothing (QA47 N4), where the directory would be.
        if std::fs::symlink_metadata(dir).is_ok() && !dir.is_dir() {
            anyhow::bail!("--report-dir {}: not a directory (the report's files are written into one)", dir.display());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("--report-dir {}", dir.display()))?;
    }
    let source = match &args.file {
        Some(path) => Source::Replay(RecordReader::open(path)?),
        None => Source::Generate(Generator::new(args.workload.spec()?)?),
    };
    let wspec = source.spec().clone();
    // A temporary store only without --data-dir (a quit at once would leave even an empty one).
    let temp = args.data_dir.is_none().then(tempfile::tempdir).transpose()?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A second interrupt quits at once: the run's own store goes with it (not one of `--data-dir`).
    let scratch = temp.as_ref().map(|t| t.path().to_path_buf());
    let kafka_left = Arc::new(std::sync::Mutex::new(Vec::new()));
    let interrupts = tokio::spawn(stop_on_interrupt(stop.clone(), scratch.clone(), kafka_left.clone()));
    let mut cfg =
        Config { data_dir: args.data_dir.clone().or_else(|| scratch.clone()).unwrap_or_default(), ..Config::default() };
    cfg.http.listen = args.http_listen;
    cfg.mqtt.listen = args.mqtt_listen;
    cfg.storage.write_buffer_mb = args.store.mib;
    cfg.storage.compaction = args.store.compaction;
    cfg.storage.subcompactions = args.store.subcompactions;
    cfg.storage.background_jobs = args.store.background_jobs;
    // The workload's integer fields (`status`) are i64 whichever driver sends them: line
    // protocol says so by its `i` suffix and the in-process driver by its values, but JSON
    // cannot (a JSON number is an f64 unless the table's schema declares the field i64), so
    // the tables declare them, as an operator would.
    for kind in TableKind::ALL {
        for field in kind.fields().iter().filter(|f| f.integer) {
            let table = cfg.storage.tables.entry(wspec.table_name(kind)).or_default();
            table.fields.insert(field.name.to_string(), "i64".to_string());
        }
    }
    // Roll-ups close only hours the clock has reached (the watermark counts event time up to
    // it): a workload whose closing reading is later could never have its hours closed.
    if args.close_hours {
        let closing = closing_ts(&wspec, cfg.rollup.allowed_lateness_ms);
        anyhow::ensure!(
            closing <= ingest::now_ms(),
            "--close-hours needs the workload's hours in the past: closing them takes a reading at {}, after the \
             clock (roll-ups close only hours the clock has reached); use an earlier --start-ms",
            model::utc_text_ms(closing)
        );
    }
    // A load test on loopback, without tokens (logged as a warning).
    cfg.auth.enabled = false;
    // MQTT only for its driver: the others run no broker nor consumer beside them.
    cfg.mqtt.enabled = args.driver == DriverKind::Mqtt;
    if let Some(url) = &args.mqtt_url {
        cfg.mqtt.url = Some(url.clone());
        cfg.mqtt.client_id = format!("hourglass-bench-{}", ingest::now_ms());
    }
    if args.subscription_per_table {
        // Checked with the rest of the configuration when the pipeline starts.
        let prefix = &cfg.mqtt.topic_prefix;
        cfg.mqtt.subscriptions =
            TableKind::ALL.iter().map(|&k| format!("{prefix}/{}/#", wspec.table_name(k))).collect();
    }
    // The Kafka driver's topics, new for each run, and the consumer reading them.
    let kafka_topics = match (args.driver, &args.kafka_brokers) {
        (DriverKind::Kafka, None) => anyhow::bail!("--driver kafka needs --kafka-brokers host:port"),
        (DriverKind::Kafka, Some(brokers)) => {
            anyhow::ensure!(args.kafka_partitions >= 1, "--kafka-partitions must be at least 1");
            let run = format!("{}-{}", args.kafka_topic_prefix, ingest::now_ms());
            let topics = match args.kafka_format {
                KafkaPayload::Lp => [format!("{run}-lp"), format!("{run}-lp")],
                KafkaPayload::Json => [format!("{run}-readings"), format!("{run}-diagnostics")],
            };
            let mut distinct: Vec<&str> = topics.iter().map(String::as_str).collect();
            distinct.dedup();
            if let Some(path) = &args.kafka_config {
                take_kafka_security(&mut cfg, path)?;
            }
            let (b, client, names, partitions) = (
                brokers.clone(),
                kafka_client(&cfg),
                distinct.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                args.kafka_partitions,
            );
            tokio::task::spawn_blocking(move || {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                bench::run::create_kafka_topics(&b, &client, &names, partitions)
            })
            .await??;
            // Named, for a run that fails before it can delete them, or is quit at once.
            tracing::info!(topics = %distinct.join(","), partitions = args.kafka_partitions, "the run's Kafka topics created");
            kafka_left.lock().unwrap_or_else(|p| p.into_inner()).extend(distinct.iter().map(|t| t.to_string()));
            cfg.kafka.enabled = true;
            cfg.kafka.brokers = brokers.clone();
            cfg.kafka.group_id = run.clone();
            cfg.kafka.topics = distinct.iter().map(|t| t.to_string()).collect();
            cfg.kafka.session_timeout_ms = 6000;
            match args.kafka_format {
                KafkaPayload::Lp => {
                    cfg.kafka.format = ingest::kafka::KafkaFormat::Lp;
                    cfg.lineproto.precision = ingest::lineproto::Precision::Milliseconds;
                }
                KafkaPayload::Json => {
                    cfg.kafka.format = ingest::kafka::KafkaFormat::Json;
                    for (topic, kind) in topics.iter().zip(TableKind::ALL) {
                        cfg.kafka.topic_tables.insert(topic.clone(), wspec.table_name(kind));
                    }
                }
            }
            Some(topics)
        }
        _ => None,
    };
    // A preloaded run produces everything now; `source` is then spent.
    let mut source = Some(source);
    let mut preloaded = None;
    if let (true, Some(topics)) = (args.kafka_preload, &kafka_topics) {
        let target = kafka_target(&args, &cfg, topics.clone());
        let started = Instant::now();
        let spent = source.take().ok_or_else(|| anyhow::anyhow!("no workload"))?;
        let topics = cfg.kafka.topics.join(",");
        tracing::info!(topics = %topics, "producing the workload to Kafka before the pipeline starts");
        let produced = bench::run::produce_kafka(
            spent,
            target,
            args.batch_points,
            Duration::from_secs(args.stall_timeout),
            stop.clone(),
        )
        .await;
        let (points, values, cut) = match produced {
            Ok(produced) => produced,
            // The topics go (or their names are said) before the error (QA50 L6: left unsaid).
            Err(e) => {
                drop_kafka_topics(&args, &cfg).await;
                return Err(e.into());
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        if cut {
            tracing::warn!(points, seconds, "interrupted while producing; the pipeline consumes what was produced");
        } else {
            tracing::info!(points, seconds, "workload produced to Kafka; starting the pipeline");
        }
        preloaded = Some((points, values, seconds, cut));
    }
    let load_before = load_average();
    let running = serve::start(&cfg).await?;
    // A preloaded backlog is consumed from here on (`start` returns once the partitions are
    // assigned): the run's time counts from now, its points from the store's first (this
    // process's store counts only what it stored itself, all of it from the backlog).
    let consuming_since = Instant::now();
    // A store that holds the workload's tables already (a `--data-dir` used before) answers
    // `latest` with its own readings, as late as the workload's or later: the end-to-end
    // poller would take a watched point as visible at once, and a full scan counts the old
    // values too. Neither is measured then.
    // A table declared above exists from the start: it is held when a device has data in it.
    // Not told for a preloaded Kafka run, which is storing its own backlog by now (its values
    // check then fails with the count of values more than sent).
    let workload_tables = TableKind::ALL.map(|k| wspec.table_name(k));
    let with_data =
        |t: &String| matches!(running.store.devices_with_data(t, "", 1), Ok(Some(l)) if !l.devices.is_empty());
    let held_before: Vec<String> =
        workload_tables.iter().filter(|_| preloaded.is_none()).filter(|t| with_data(t)).cloned().collect();
    // Other tables' values would be counted by the scan after the run as the run's.
    let others_before: Vec<String> =
        running.store.tables().into_iter().filter(|t| !workload_tables.contains(t) && with_data(t)).collect();
    for (tables, what) in [
        (
            &held_before,
            "the store holds the workload's tables already: end-to-end latency is not measured and the values \
             found after the run are not checked (use an empty --data-dir to measure them)",
        ),
        (
            &others_before,
            "the store holds other tables: the values found after the run are not checked, and bytes per value \
             is of the whole store (use an empty --data-dir to measure the workload alone)",
        ),
    ] {
        if !tables.is_empty() {
            tracing::warn!(tables = ?tables, data_dir = %cfg.data_dir.display(), "{what}");
        }
    }
    if args.place_by_fleet {
        let (store, spec) = (running.store.clone(), wspec.clone());
        let placed = tokio::task::spawn_blocking(move || place_by_fleet(&store, &spec)).await?;
        if let Err(e) = placed {
            let _ = running.shutdown().await;
            leave_the_brokers(&args, &cfg).await;
            return Err(e);
        }
    }
    let target = match args.driver {
        DriverKind::InProcess => Target::InProcess(running.store.clone()),
        DriverKind::Mqtt => {
            let (host, port) = running.mqtt_broker()?;
            Target::Mqtt(MqttTarget {
                host,
                port,
                topic_prefix: cfg.mqtt.topic_prefix.clone(),
                connections: args.connections,
                per_message: args.per_message,
                qos: args.qos,
                max_payload_bytes: cfg.mqtt.max_payload_bytes,
            })
        }
        DriverKind::Kafka => match preloaded {
            Some((points, values, _, cut)) => Target::Preloaded { points, values, since: consuming_since, cut },
            None => Target::Kafka(kafka_target(&args, &cfg, kafka_topics.clone().unwrap_or_default())),
        },
    };
    let source = source.unwrap_or_else(|| Source::Spent(wspec.clone()));
    let backlog_limit = max_backlog(args.max_backlog, args.rate, args.mqtt_url.is_some(), args.per_message);
    let spec = RunSpec {
        rate: (args.rate > 0.0).then_some(args.rate),
        batch_points: args.batch_points,
        e2e_sample_ms: if held_before.is_empty() { args.e2e_sample_ms } else { 0 },
        http: Some(running.http_addr),
        query_rate: args.query_rate,
        progress: true,
        drain_timeout: Duration::from_secs(600),
        stall_timeout: Duration::from_secs(args.stall_timeout),
        max_backlog: backlog_limit,
        stop: stop.clone(),
    };
    let store = running.store.clone();
    let committed: Arc<dyn Fn() -> u64 + Send + Sync> =
        Arc::new(move || store.stats().readings.load(Ordering::Relaxed));
    let result = bench::run::run(source, target, spec, committed).await;
    let load_after_run = load_average();
    // Why points sent were not stored when the store stalled, if the run knows: read before
    // the pipeline stops.
    let why_not_stored = {
        let skips = running.mqtt_stats.broker_skips.load(Ordering::Relaxed);
        let lost = running.mqtt_stats.broker_skipped_messages.load(Ordering::Relaxed);
        if skips > 0 {
            Some(format!(
                "the embedded broker dropped messages it had not delivered {skips} time(s), {lost} messages known \
                 lost: the publishers ran mqtt.broker_backlog_mb ahead of the store (lower --max-backlog)"
            ))
        } else {
            args.mqtt_url.as_ref().map(|url| {
                let allowed = backlog_limit.map_or("no limit".to_string(), |points| format!("{points} points"));
                format!(
                    "points sent through {url} were not all stored: a broker drops what its queue for a subscriber \
                     cannot hold (mosquitto: max_queued_messages, 1000 messages by default), and this run let the \
                     publishers run {allowed} ahead of the store (--max-backlog; lower it, or raise the broker's \
                     queue)"
                )
            })
        }
    };
    let mut report = match result {
        Ok(mut r) => {
            // In the report too, not only in the error. Not when the driver failed first (a
            // broker gone, not full).
            if let (Some(failed), false, Some(why)) = (&mut r.failed, r.failed_by_driver, why_not_stored) {
                *failed = format!("{failed}; {why}");
            }
            r
        }
        // Before any point was sent (a stall, or a driver failing later, is a report with
        // `failed`).
        Err(e) => {
            let _ = running.shutdown().await;
            leave_the_brokers(&args, &cfg).await;
            return Err(e.into());
        }
    };
    // An interrupt cut the workload short (`report.interrupted`), or came once all of it was
    // sent: the run is whole then, but the long steps that follow are skipped too.
    let interrupted = stop.load(Ordering::Relaxed);
    if interrupted && !report.interrupted {
        report.interrupted_after_sending = true;
    }
    match (&report.failed, report.interrupted) {
        _ if !interrupted => {}
        // Not all that was sent is stored (a broker gone with it): the error says why.
        (Some(_), _) => tracing::warn!(
            sent = report.sent,
            stored = report.stored,
            "interrupted, and the run failed: it is reported until then; no hour closing or compaction"
        ),
        (None, true) => tracing::warn!(
            sent = report.sent,
            stored = report.stored,
            "interrupted: everything sent is stored; no hour closing or compaction after an interrupt"
        ),
        (None, false) => tracing::warn!(
            sent = report.sent,
            stored = report.stored,
            "interrupted once the whole workload was sent: it is stored and reported; no hour closing or compaction"
        ),
    }
    // A failed run is reported as far as it went, without the steps that follow.
    let skip_after = interrupted || report.failed.is_some();
    let mut rollup_close_seconds = None;
    if args.close_hours && !skip_after {
        let started = Instant::now();
        let clock_ts = closing_ts(&wspec, cfg.rollup.allowed_lateness_ms);
        let store = running.store.clone();
        let reading = model::DeviceReading {
            table: Arc::from(format!("{}.clock", wspec.table_prefix)),
            device: Arc::from("watermark"),
            reading: model::Reading::new(clock_ts, vec![(Arc::from("tick"), 1.0)]),
        };
        tokio::task::spawn_blocking(move || store.write(vec![reading], &[])).await??;
        let deadline = Instant::now() + Duration::from_secs(600);
        let closed = model::Hour::of(clock_ts).start_ms() - model::HOUR_MS;
        let mut closed_all = true;
        while running.store.stats().rollup_oldest_dirty_hour_ms.load(Ordering::Relaxed) <= closed {
            anyhow::ensure!(Instant::now() < deadline, "roll-ups not done after 600 s");
            if stop.load(Ordering::Relaxed) {
                tracing::warn!("interrupted while the hours were being rolled up: reporting without it");
                report.interrupted_after_sending = true;
                closed_all = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rollup_close_seconds = closed_all.then(|| started.elapsed().as_secs_f64());
    }
    running.shutdown().await?;
    leave_the_brokers(&args, &cfg).await;
    kafka_left.lock().unwrap_or_else(|p| p.into_inner()).clear();
    // Read before the compaction below reopens the store with other database options.
    let store_options = persisted_store_options(&cfg.data_dir.join("rocksdb"));
    let mut compaction_abandoned = false;
    if !args.no_compaction && !stop.load(Ordering::Relaxed) && report.failed.is_none() {
        // On the store closed and reopened alone, as `hourglass compact` does: each compaction
        // is split across every core, a database option that rust-rocksdb cannot change on a
        // store already open (its `set_options` sets column-family options only).
        let cfg = cfg.clone();
        let compaction = tokio::task::spawn_blocking(move || serve::compact_store(&cfg, true));
        tokio::pin!(compaction);
        // RocksDB's compaction cannot be cut short: an interrupt leaves it running and reports
        // without it (the process then ends without waiting for it).
        let done = loop {
            tokio::select! {
                done = &mut compaction => break Some(done??),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if stop.load(Ordering::Relaxed) {
                        break None;
                    }
                }
            }
        };
        if let Some(done) = done {
            report.stored_values = done.values;
            if held_before.is_empty() {
                // The clock reading of `--close-hours` is one value more.
                report.expected_values = others_before.is_empty().then(|| report.values + u64::from(args.close_hours));
            }
            // None of no values (a workload whose every point was dropped), as a latency of no samples.
            report.bytes_per_value =
                done.values.filter(|&v| v > 0).map(|values| done.buckets_sst_bytes as f64 / values as f64);
            report.compaction = Some(bench::report::Compaction {
                seconds: done.seconds,
                subcompactions: done.subcompactions,
                data_dir_bytes_before: done.bytes_before,
                data_dir_bytes_after: done.bytes_after,
            });
        } else {
            tracing::warn!(
                "interrupted during the compaction after the run: reporting without it (no bytes per value); the \
                 compaction is left unfinished"
            );
            report.interrupted_after_sending = true;
            compaction_abandoned = true;
        }
    }
    let mqtt = args.driver == DriverKind::Mqtt;
    report.setup = serde_json::json!({
        "driver": match args.driver {
            DriverKind::Mqtt => "mqtt",
            DriverKind::InProcess => "in-process",
            DriverKind::Kafka => "kafka",
        },
        "broker": match (args.driver, &args.mqtt_url) {
            (DriverKind::InProcess, _) => "none",
            (DriverKind::Kafka, _) => args.kafka_brokers.as_deref().unwrap_or(""),
            (_, Some(url)) => url.as_str(),
            (_, None) => "embedded",
        },
        "kafka": kafka_topics.as_ref().map(|_| serde_json::json!({
            "format": match args.kafka_format { KafkaPayload::Lp => "lp", KafkaPayload::Json => "json" },
            // Each once (the line-protocol run's two tables share one).
            "topics": cfg.kafka.topics,
            "partitions": args.kafka_partitions,
            // `plaintext` unless --kafka-config says otherwise.
            "security": cfg.kafka.security_protocol,
            "preloaded_seconds": preloaded.map(|(_, _, s, _)| s),
        })),
        "rate_points_per_s": if args.rate > 0.0 { serde_json::json!(args.rate) } else { serde_json::json!("max") },
        // Each driver's own settings; null for another's.
        "connections": mqtt.then_some(args.connections),
        "per_message": (args.driver != DriverKind::InProcess).then_some(args.per_message),
        "subscriptions": mqtt.then_some(&cfg.mqtt.subscriptions),
        // The client ids of the pipeline's sessions on an external broker (ended after the run).
        "mqtt_client_ids": external_consumer(&args, &cfg).and_then(|(_, c)| c.ok()).map(|c| c.client_ids()),
        "qos": mqtt.then_some(args.qos),
        "max_backlog_points": match args.driver {
            DriverKind::Mqtt => serde_json::json!(backlog_limit),
            _ => serde_json::Value::Null,
        },
        // A recording is sent a frame at a time, of the size it was recorded with.
        "batch_points": args.file.is_none().then_some(args.batch_points),
        "query_rate": args.query_rate,
        "stall_timeout_s": args.stall_timeout,
        "recording": args.file,
        "workload": wspec,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "load_average_before": load_before,
        "load_average_after_run": load_after_run,
        "write_buffer_mb": args.store.mib,
        "compaction": args.store.compaction,
        "subcompactions": args.store.subcompactions,
        "background_jobs": crate::config::background_jobs(args.store.background_jobs),
        "store_options": store_options,
        "rss_note": match (args.driver, &args.mqtt_url) {
            (DriverKind::Mqtt, None) => format!(
                "peak RSS of this process: the pipeline, the embedded broker (whose log keeps messages after they \
                 are read, up to mqtt.broker_backlog_mb: {} MiB), the generator and the publishers",
                cfg.mqtt.broker_backlog_mb
            ),
            (DriverKind::InProcess, _) => "peak RSS of this process: the pipeline and the generator".to_string(),
            _ => "peak RSS of this process: the pipeline, the generator and the producers (not the external broker)"
                .to_string(),
        },
        "rollup_close_seconds": rollup_close_seconds,
        "store_held_workload_tables": held_before,
        "store_held_other_tables": others_before,
    });
    interrupts.abort();
    // The full scan is the run's last word (the commit counter that ended the run counts a
    // redelivered point twice, so it can reach the points sent with some lost): a difference
    // fails the run, said in the report too (QA50 L8: `failed` was null there).
    let values_differ = match (report.failed.is_none(), report.check_values()) {
        (true, Err(e)) => {
            report.failed = Some(e.to_string());
            true
        }
        _ => false,
    };
    for missed in [report.rate_missed(), report.queries.rate_missed()].into_iter().flatten() {
        tracing::warn!("{}", missed.replace("**", ""));
    }
    // The JSON first: a report file that cannot be written loses nothing of it.
    say(&serde_json::to_string_pretty(&report)?);
    if let Some(dir) = &args.report_dir {
        report.write_all(dir)?;
    }
    if let Some(reason) = &report.failed {
        let context = match values_differ {
            true => "the run failed (its report is of the whole run)",
            false => "the run failed (its report is of the run until then)",
        };
        return Err(anyhow::anyhow!("{reason}").context(context));
    }
    let stopped = Interrupted::Replay { sent: report.sent, whole: !report.interrupted };
    if compaction_abandoned {
        // Not through the runtime, whose end would wait for the compaction's thread. An
        // interrupt asked for, so a warning.
        tracing::warn!("{stopped}");
        let _ = std::io::stdout().flush();
        quit_removing(scratch.as_deref());
    }
    match interrupted {
        true => Err(stopped.into()),
        false => Ok(()),
    }
}

/// How a replay (after its report) or a recording that an interrupt stopped ends: the process
/// exits 130, as for a command that SIGINT ended, so a script does not take the report of part
/// of the workload for a whole run.
#[derive(Debug)]
pub(crate) enum Interrupted {
    /// A replay, after its report.
    Replay {
        /// Points sent before the interrupt.
        sent: u64,
        /// The whole workload was sent before it (the steps after the run were skipped).
        whole: bool,
    },
    /// A recording, its files cut short removed.
    Recording {
        /// A line protocol was asked for too.
        line_protocol: bool,
    },
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Interrupted::Replay { sent, whole: true } => write!(
                f,
                "interrupted once the whole workload ({sent} points) was sent and stored: the report covers it all, \
                 without what follows the run (hour closing, compaction, bytes per value)"
            ),
            Interrupted::Replay { sent, whole: false } => write!(
                f,
                "interrupted: the report covers the {sent} points sent before the interrupt, not the whole workload"
            ),
            Interrupted::Recording { line_protocol: false } => write!(
                f,
                "interrupted: the recording, cut short, was removed; what was at --out before the run is as it was"
            ),
            Interrupted::Recording { line_protocol: true } => write!(
                f,
                "interrupted: the recording and its line protocol, cut short, were removed; what was at --out and \
                 --line-protocol before the run is as it was"
            ),
        }
    }
}

impl std::error::Error for Interrupted {}

/// Options of the `buckets` column family that decide how a run's flushes and compactions go,
/// and of the database ([`STORE_DB_OPTIONS`]), as RocksDB wrote them down for the run's store
/// (`bucketer::store::persisted_options`): a report says what it was measured with, also when
/// the binary was a build with other settings. Values as RocksDB writes them (strings); `null`
/// when the file cannot be read.
fn persisted_store_options(rocksdb_dir: &std::path::Path) -> serde_json::Value {
    let sections = match bucketer::store::persisted_options(rocksdb_dir) {
        Ok(Some(sections)) => sections,
        Ok(None) => return serde_json::Value::Null,
        Err(e) => {
            tracing::warn!(error = %e, dir = %rocksdb_dir.display(), "could not read the store's OPTIONS file");
            return serde_json::Value::Null;
        }
    };
    let pick = |section: &str, keys: &[&str]| -> serde_json::Value {
        let options = sections.get(section);
        keys.iter()
            .filter_map(|k| Some((k.to_string(), serde_json::Value::from(options?.get(*k)?.clone()))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    serde_json::json!({
        "buckets": pick("CFOptions \"buckets\"", &STORE_BUCKETS_OPTIONS),
        "db": pick("DBOptions", &STORE_DB_OPTIONS),
    })
}

/// The `buckets` options of [`persisted_store_options`].
const STORE_BUCKETS_OPTIONS: [&str; 9] = [
    "compaction_style",
    "level0_file_num_compaction_trigger",
    "level0_slowdown_writes_trigger",
    "level0_stop_writes_trigger",
    "max_bytes_for_level_base",
    "level_compaction_dynamic_level_bytes",
    "write_buffer_size",
    "compression",
    "bottommost_compression",
];

/// The database options of [`persisted_store_options`].
const STORE_DB_OPTIONS: [&str; 3] = ["max_background_jobs", "max_subcompactions", "max_total_wal_size"];

/// The first SIGINT or SIGTERM of a replay sets `stop`: the driver sends nothing more, and the
/// run reports what it sent once that is stored. A second one quits at once, without a report,
/// removing the run's store if it is in `scratch` (a temporary directory, which the quit would
/// leave behind: hundreds of megabytes of write-ahead log), and naming the Kafka topics it
/// leaves (`kafka_topics`, the run's until they are deleted).
async fn stop_on_interrupt(
    stop: Arc<std::sync::atomic::AtomicBool>,
    scratch: Option<std::path::PathBuf>,
    kafka_topics: Arc<std::sync::Mutex<Vec<String>>>,
) {
    serve::shutdown_signal().await;
    stop.store(true, Ordering::Relaxed);
    tracing::warn!(
        "interrupted: nothing more is sent (if the workload was not all sent yet); the report follows once what \
         was sent is stored (or once the stored count has not moved for --stall-timeout: points lost), without \
         the hour closing or the compaction after the run (interrupt again to quit without a report)"
    );
    serve::shutdown_signal().await;
    tracing::error!("interrupted twice: quitting without a report");
    let topics = kafka_topics.lock().unwrap_or_else(|p| p.into_inner()).join(",");
    if !topics.is_empty() {
        tracing::warn!(topics = %topics, "the run's Kafka topics are left on the broker, with what was produced to them");
    }
    // Asked to quit now, not after the drain and the store's shutdown flush. A load test's
    // points are the harness's own, and what the store committed is in its write-ahead log.
    quit_removing(scratch.as_deref());
}

/// Quits at once (exit 130), removing the run's temporary store `scratch` first: the quit
/// would leave it behind (hundreds of megabytes of write-ahead log).
fn quit_removing(scratch: Option<&std::path::Path>) -> ! {
    if let Some(dir) = scratch {
        if let Err(e) = std::fs::remove_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "the run's store could not be removed");
        }
    }
    crate::quit_now(130)
}
