//! `hourglass.toml`: every key, its default, environment overrides and validation. Library
//! crates take plain structs built from this.
//!
//! Layers, each overriding the one before: the defaults, the file, `HOURGLASS_*` environment
//! variables, then command-line flags (applied by `main`). A key is named `section.key`, or
//! `key` at the top level; its variable is `HOURGLASS_` and the key in upper case with the
//! `.` written as `__`: `mqtt.max_payload_bytes` is `HOURGLASS_MQTT__MAX_PAYLOAD_BYTES`,
//! `data_dir` is `HOURGLASS_DATA_DIR`. `HOURGLASS_CONFIG` names the file and is not a key.
//!
//! Each key of the file and each variable is checked on its own before the layers are merged,
//! so one run reports every problem at once (unknown keys, wrong types, bad variables, and what
//! [`Config::validate`] finds), each with its key and a hint. serde stays the one parser of
//! values: a single key is checked by deserializing a `Config` that holds only that key.
//!
//! The checked-in `config/hourglass.example.toml` lists every key with its default; a test
//! keeps it equal to [`Config::default`] and [`KEYS`] equal to the structs.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Config {
    /// Directory of the RocksDB database. Default `./hourglass-data`.
    pub(crate) data_dir: PathBuf,
    pub(crate) http: HttpConfig,
    pub(crate) mqtt: MqttSection,
    pub(crate) storage: StorageSection,
    pub(crate) rollup: RollupSection,
    pub(crate) lineproto: LineProtoSection,
    pub(crate) kafka: KafkaSection,
    pub(crate) query: QuerySection,
    pub(crate) auth: AuthSection,
}

impl Config {
    /// The archive's settings for the store: `None` when `storage.archive` is off.
    pub(crate) fn archive(&self) -> Option<bucketer::archive::ArchiveConfig> {
        if !self.storage.archive {
            return None;
        }
        let mut cfg = bucketer::archive::ArchiveConfig::new(self.archive_dir());
        if !self.storage.archive_url.is_empty() {
            cfg.object_store = Some(bucketer::archive::S3Archive {
                url: self.storage.archive_url.clone(),
                endpoint: (!self.storage.archive_s3_endpoint.is_empty())
                    .then(|| self.storage.archive_s3_endpoint.clone()),
                region: None,
                credentials: None,
            });
        }
        // Checked with the rest of the file: a bad one never gets here.
        cfg.late_rewrite_wait = std::time::Duration::from_millis(
            self.storage.archive_late_wait_ms().unwrap_or(cfg.late_rewrite_wait.as_millis() as u64),
        );
        Some(cfg)
    }

    /// The archive root: `storage.archive_dir`, or `archive` under `data_dir` when it is empty.
    pub(crate) fn archive_dir(&self) -> PathBuf {
        if self.storage.archive_dir.as_os_str().is_empty() {
            self.data_dir.join("archive")
        } else {
            self.storage.archive_dir.clone()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("hourglass-data"),
            http: HttpConfig::default(),
            mqtt: MqttSection::default(),
            storage: StorageSection::default(),
            rollup: RollupSection::default(),
            lineproto: LineProtoSection::default(),
            kafka: KafkaSection::default(),
            query: QuerySection::default(),
            auth: AuthSection::default(),
        }
    }
}

/// `[http]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct HttpConfig {
    /// Query service address. Default `127.0.0.1:8080`.
    pub(crate) listen: SocketAddr,
    /// PEM file of the query service's certificate chain (its own certificate first): with
    /// `tls_key_file`, it serves HTTPS only. `""` (default): plain HTTP.
    pub(crate) tls_cert_file: String,
    /// PEM file of `tls_cert_file`'s private key (unencrypted); `""` (default): none.
    pub(crate) tls_key_file: String,
    /// How long a client has for each request header (from its connection, or from its last
    /// answer: an idle kept-alive connection is closed then) and for each part of a request
    /// body (a 408 then), ms. Default 30000.
    pub(crate) read_timeout_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            read_timeout_ms: query::server::DEFAULT_READ_TIMEOUT.as_millis() as u64,
        }
    }
}

impl HttpConfig {
    /// The query service's TLS server, read from its files (`None`: plain HTTP). The problems,
    /// each with its key.
    pub(crate) fn tls(&self) -> Result<Option<Arc<query::tls::ServerConfig>>, Vec<(&'static str, String)>> {
        let (cert, key) = (&self.tls_cert_file, &self.tls_key_file);
        if cert.is_empty() && key.is_empty() {
            return Ok(None);
        }
        if cert.is_empty() != key.is_empty() {
            let missing = if cert.is_empty() { "http.tls_cert_file" } else { "http.tls_key_file" };
            return Err(vec![(
                missing,
                "is needed with the other of http.tls_cert_file and http.tls_key_file (the query service's \
                 certificate and its key)"
                    .to_string(),
            )]);
        }
        query::tls::server_config(Path::new(cert), Path::new(key)).map(Some).map_err(|problems| {
            let keyed = |e: query::tls::TlsFileError| match e {
                query::tls::TlsFileError::Cert(m) => ("http.tls_cert_file", m),
                query::tls::TlsFileError::Key(m) => ("http.tls_key_file", m),
            };
            problems.into_iter().map(keyed).collect()
        })
    }

    /// The query service's URL scheme.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls_cert_file.is_empty() {
            "http"
        } else {
            "https"
        }
    }
}

/// `[mqtt]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct MqttSection {
    /// false: no MQTT at all, neither the embedded broker nor a consumer (Kafka and the HTTP
    /// write API only). Default true.
    pub(crate) enabled: bool,
    /// External broker, `mqtt://host:port` or `mqtts://host:port` (TLS). Unset (default):
    /// start the embedded broker.
    pub(crate) url: Option<String>,
    /// The consumer's username at the external broker; `""` (default): none.
    pub(crate) username: String,
    /// The consumer's password at the external broker (with `username`); `""`: none.
    pub(crate) password: String,
    /// PEM file of the CA certificates the broker's certificate is checked against
    /// (`mqtts://`); `""` (default): the system's.
    pub(crate) ca_file: String,
    /// PEM file of the client certificate shown to a TLS broker that asks for one (with
    /// `key_file`); `""` (default): none.
    pub(crate) cert_file: String,
    /// PEM file of `cert_file`'s private key; `""` (default): none.
    pub(crate) key_file: String,
    /// Seconds a subscription the external broker granted may deliver nothing before a warning
    /// (`ingest::mqtt::MqttConfig::silence_warning`); 0: no warning. Default 300.
    pub(crate) silence_warning_s: u64,
    /// Embedded broker address. Default `127.0.0.1:1883`.
    pub(crate) listen: SocketAddr,
    /// Client id of Hourglass's consumer; fixed so an external broker keeps its session (the
    /// embedded broker's consumer adds a suffix made at each start). Default `hourglass-ingest`.
    pub(crate) client_id: String,
    /// Topics are `{topic_prefix}/{table}[/{device}]`. Default `hourglass`.
    pub(crate) topic_prefix: String,
    /// Topic filters under `topic_prefix`, each consumed on a connection of its own
    /// (`ingest::mqtt::MqttConfig::subscriptions`). Default empty: one connection on
    /// `{topic_prefix}/#`.
    pub(crate) subscriptions: Vec<String>,
    /// Payloads above this many bytes become dead letters. Default 1 MiB.
    pub(crate) max_payload_bytes: usize,
    /// rumqttd's `max_inflight_count`: despite its name, the most packets the embedded broker
    /// reads from one connection in one go before it hands them on. It does not bound the QoS 1
    /// messages in flight to a subscriber: rumqttd 0.20 fixes those at 100 (`MAX_INFLIGHT` in
    /// its `router/iobufs.rs`). Default 1000.
    pub(crate) broker_max_inflight: usize,
    /// MiB of published messages the embedded broker holds for Hourglass's consumer to read.
    /// Once the store falls this far behind the publishers, the broker drops the oldest
    /// (already acknowledged to their publishers): logged as an error and counted in
    /// `hourglass_ingest_broker_skips_total`. Default 1000.
    pub(crate) broker_backlog_mb: u64,
}

impl MqttSection {
    /// Whether the pipeline starts its embedded broker: MQTT on, without an external broker.
    pub(crate) fn embedded_broker(&self) -> bool {
        self.enabled && self.url.is_none()
    }

    /// The consumer of `url` with the login and TLS of this section; the embedded broker's
    /// consumer (no url) is `base` unchanged. The problem, if any, with the key it is in.
    pub(crate) fn external_consumer(
        &self,
        base: ingest::mqtt::MqttConfig,
    ) -> Result<ingest::mqtt::MqttConfig, Vec<(&'static str, String)>> {
        let Some(url) = &self.url else {
            return Ok(base);
        };
        let mut consumer = base.with_url(url).map_err(|e| vec![("mqtt.url", e)])?;
        consumer.silence_warning =
            (self.silence_warning_s > 0).then(|| std::time::Duration::from_secs(self.silence_warning_s));
        if !self.username.is_empty() {
            consumer.credentials = Some((self.username.clone(), self.password.clone()));
        }
        fn file(f: &str) -> Option<&Path> {
            (!f.is_empty()).then(|| Path::new(f))
        }
        let client = file(&self.cert_file).zip(file(&self.key_file));
        consumer.with_tls(file(&self.ca_file), client).map_err(|problems| {
            let keyed = |e: ingest::mqtt::TlsError| {
                let key = match e {
                    ingest::mqtt::TlsError::NotTls if self.ca_file.is_empty() => "mqtt.cert_file",
                    ingest::mqtt::TlsError::NotTls | ingest::mqtt::TlsError::Ca(_) => "mqtt.ca_file",
                    ingest::mqtt::TlsError::Cert(_) => "mqtt.cert_file",
                    ingest::mqtt::TlsError::Key(_) => "mqtt.key_file",
                };
                (key, e.to_string())
            };
            problems.into_iter().map(keyed).collect()
        })
    }

    /// The problems of the external broker's settings, each with its key.
    fn external_broker_problems(&self) -> Vec<(&'static str, String)> {
        let login_and_tls = [
            ("mqtt.username", &self.username),
            ("mqtt.password", &self.password),
            ("mqtt.ca_file", &self.ca_file),
            ("mqtt.cert_file", &self.cert_file),
            ("mqtt.key_file", &self.key_file),
        ];
        if self.url.is_none() {
            let message = "is for an external broker, and mqtt.url is not set: the embedded broker's consumer logs \
                           in on its own";
            return login_and_tls
                .into_iter()
                .filter(|(_, value)| !value.is_empty())
                .map(|(key, _)| (key, message.to_string()))
                .collect();
        }
        let mut problems = Vec::new();
        if self.username.is_empty() && !self.password.is_empty() {
            problems.push(("mqtt.password", "is set without mqtt.username".to_string()));
        }
        problems.extend(half_a_client_pair(("mqtt.cert_file", &self.cert_file), ("mqtt.key_file", &self.key_file)));
        if problems.is_empty() {
            if let Err(more) = self.external_consumer(ingest::mqtt::MqttConfig::default()) {
                problems.extend(more);
            }
        }
        problems
    }
}

/// Whether `dir` holds a certificate under OpenSSL's hashed name (`3f1a2b4c.0`), as `openssl
/// rehash` (or Debian's `/etc/ssl/certs`) makes them: the only names OpenSSL reads a CA
/// directory by.
fn hashed_ca_directory(dir: &Path) -> bool {
    let hashed = |name: &str| {
        name.split_once('.').is_some_and(|(hash, n)| {
            hash.len() == 8 && hash.chars().all(|c| c.is_ascii_hexdigit()) && n.chars().all(|c| c.is_ascii_digit())
        })
    };
    std::fs::read_dir(dir)
        .is_ok_and(|entries| entries.filter_map(|e| e.ok()).any(|e| hashed(&e.file_name().to_string_lossy())))
}

/// The problem of a client certificate set without its key, or a key without its certificate:
/// `(key, value)` of each.
fn half_a_client_pair(cert: (&'static str, &str), key: (&'static str, &str)) -> Option<(&'static str, String)> {
    (cert.1.is_empty() != key.1.is_empty()).then(|| {
        let missing = if cert.1.is_empty() { cert.0 } else { key.0 };
        (missing, format!("is needed with the other of {} and {} (a client certificate and its key)", cert.0, key.0))
    })
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            enabled: true,
            url: None,
            username: String::new(),
            password: String::new(),
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            silence_warning_s: 300,
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            client_id: "hourglass-ingest".into(),
            topic_prefix: "hourglass".into(),
            subscriptions: Vec::new(),
            max_payload_bytes: 1 << 20,
            broker_max_inflight: 1000,
            broker_backlog_mb: 1000,
        }
    }
}

/// `storage.compaction`: [`bucketer::Compaction`] by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Compaction {
    Leveled,
    Universal,
}

impl From<Compaction> for bucketer::Compaction {
    fn from(c: Compaction) -> Self {
        match c {
            Compaction::Universal => bucketer::Compaction::Universal,
            Compaction::Leveled => bucketer::Compaction::Leveled,
        }
    }
}

/// `[storage]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct StorageSection {
    /// fsync the WAL on every commit (survives power loss, not only a crash). Default false.
    pub(crate) sync_wal: bool,
    /// Messages queued between ingest and the bucketer (the backpressure bound). Default 1024.
    pub(crate) channel_capacity: usize,
    /// Readings gathered into one WriteBatch at most. Default 50,000.
    pub(crate) max_batch_readings: usize,
    /// Seconds between two runs of the retention task, which drops the time partitions that
    /// have outlived their table's hot retention. Default 300; at most 365 days.
    pub(crate) retention_interval_s: u64,
    /// How long dead letters are kept, counted from their receipt, as a duration such as
    /// `"7d"` (the default) or `"12h"`; the retention task deletes older ones. `""` keeps them
    /// forever.
    pub(crate) dead_letter_retention: String,
    /// Readings a device may write in one hour of a table before it is flagged as an outlier
    /// and its hours overflow into per-minute sub-buckets. Default 20,000.
    pub(crate) bucket_max_readings: u64,
    /// MiB of open hour buckets kept in memory (one log record a batch, flushed as one operand
    /// a device-hour); default 128, 0 turns the write buffer off.
    pub(crate) write_buffer_mb: u64,
    /// RocksDB compaction of the column families every reading writes (buckets, latest
    /// values): `leveled` (the default) or `universal`, for fleets of millions of devices.
    /// Either opens a store written with the other.
    pub(crate) compaction: Compaction,
    /// Threads a RocksDB compaction of level 0 is split across, by key range. Default 1: none
    /// (`hourglass compact` splits across every core whatever this says).
    pub(crate) subcompactions: u32,
    /// RocksDB's background jobs, flushes and compactions (a quarter of them, at least one,
    /// flush). Default 0: one a core, at least 2, at most 16
    /// ([`bucketer::default_background_jobs`]).
    pub(crate) background_jobs: u32,
    /// Spill partitions past their hot retention to Parquet files (true, the default) instead
    /// of deleting them; cold retention then deletes the files.
    pub(crate) archive: bool,
    /// Root directory of the Parquet archive. Default empty: `{data_dir}/archive`. With
    /// `archive_url`, the local staging and cache directory.
    pub(crate) archive_dir: PathBuf,
    /// `s3://bucket[/prefix]`: keep the archive in an S3-compatible bucket (credentials and
    /// region from the `AWS_*` variables). Default empty: the local `archive_dir`.
    pub(crate) archive_url: String,
    /// Endpoint of an S3-compatible service for `archive_url`, such as
    /// `http://127.0.0.1:9000`. Default empty: AWS (or `AWS_ENDPOINT`).
    pub(crate) archive_s3_endpoint: String,
    /// How long late readings for an archived partition may wait in RocksDB before a run of
    /// the retention task rewrites the partition's file with them, as a duration (`"1d"`, the
    /// default), or `"0"` for the next run. Sooner once they reach a sixteenth of the file's
    /// bytes ([`bucketer::archive::ArchiveConfig::late_rewrite_wait`]).
    pub(crate) archive_late_wait: String,
    /// Tables defined at start, by name, as `POST /v1/tables` would define them. Default none.
    pub(crate) tables: std::collections::BTreeMap<String, TableSection>,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            sync_wal: false,
            channel_capacity: 1024,
            max_batch_readings: 50_000,
            retention_interval_s: 300,
            dead_letter_retention: DEFAULT_DEAD_LETTER_RETENTION.into(),
            bucket_max_readings: 20_000,
            write_buffer_mb: DEFAULT_WRITE_BUFFER_MB,
            compaction: Compaction::Leveled,
            subcompactions: bucketer::DEFAULT_SUBCOMPACTIONS,
            background_jobs: 0,
            archive: true,
            archive_dir: PathBuf::new(),
            archive_url: String::new(),
            archive_s3_endpoint: String::new(),
            archive_late_wait: DEFAULT_ARCHIVE_LATE_WAIT.into(),
            tables: std::collections::BTreeMap::new(),
        }
    }
}

/// A retention of `storage.tables`: a duration such as `"30d"`, or whole milliseconds (as
/// `POST /v1/tables` takes them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(crate) enum Retention {
    Ms(u64),
    Text(String),
    /// Another number (negative, or with a fraction), as written: refused with the table's
    /// other problems ([`TableSection::checked`]), not by serde's words.
    #[serde(skip)]
    OtherNumber(String),
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Retention, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Retention;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30d\" or a whole number of milliseconds")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Retention, E> {
                Ok(Retention::Ms(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Retention, E> {
                Ok(u64::try_from(v).map_or_else(|_| Retention::OtherNumber(v.to_string()), Retention::Ms))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Retention, E> {
                Ok(Retention::OtherNumber(v.to_string()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Retention, E> {
                Ok(Retention::Text(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// One table of `storage.tables`: `{ partition = "day", hot_retention = "30d", strict = true,
/// fields = { status = "i64" } }`, every member optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct TableSection {
    /// `"hour"`, `"day"` (the default) or `"month"`.
    pub(crate) partition: Option<String>,
    /// A duration such as `"30d"`; unset (default): kept forever.
    pub(crate) hot_retention: Option<Retention>,
    /// A duration longer than the hot retention, for the archive tier (see
    /// `bucketer::catalog`); unset (default): none.
    pub(crate) cold_retention: Option<Retention>,
    /// How long hour roll-ups are kept, counted from each hour's end, such as `"90d"`; unset
    /// (default): forever.
    pub(crate) hour_rollup_retention: Option<Retention>,
    /// How long day (and so month) roll-ups are kept, at least the hour roll-up retention
    /// (which it needs); unset (default): forever.
    pub(crate) day_rollup_retention: Option<Retention>,
    /// Refuse fields the schema lacks. Default false.
    pub(crate) strict: bool,
    /// Field name → `"f64"`, `"i64"`, `"bool"` or `"string"`. Default none.
    pub(crate) fields: std::collections::BTreeMap<String, String>,
}

impl TableSection {
    /// The definition asked for, or what is wrong with it (every problem, `; ` between).
    pub(crate) fn spec(&self) -> Result<bucketer::TableSpec, String> {
        self.checked().map_err(|problems| problems.join("; "))
    }

    /// The definition asked for, or every problem with it.
    pub(crate) fn checked(&self) -> Result<bucketer::TableSpec, Vec<String>> {
        let mut problems = Vec::new();
        let partition = match self.partition.as_deref() {
            None | Some("day") => model::PartitionSize::Day,
            Some("hour") => model::PartitionSize::Hour,
            Some("month") => model::PartitionSize::Month,
            Some(other) => {
                problems.push(format!("partition {other:?} is not one of \"hour\", \"day\", \"month\""));
                model::PartitionSize::Day
            }
        };
        // Each duration, or `Err` once its problem is noted.
        let mut duration = |key: &str, value: &Option<Retention>| -> Result<Option<u64>, ()> {
            let problem = match value {
                None => return Ok(None),
                Some(Retention::Ms(ms)) if (1..=i64::MAX as u64).contains(ms) => return Ok(Some(*ms)),
                Some(Retention::Text(text)) => match model::parse_duration_ms(text) {
                    Some(ms) => return Ok(Some(ms)),
                    None => format!("{key} {text:?} is not a duration such as \"12h\" or \"30d\""),
                },
                Some(Retention::Ms(ms)) => {
                    format!("{key} {ms} is not a whole number of milliseconds from 1 to {}", i64::MAX)
                }
                Some(Retention::OtherNumber(n)) => {
                    format!("{key} {n} is not a whole number of milliseconds from 1 to {}", i64::MAX)
                }
            };
            problems.push(problem);
            Err(())
        };
        let hot = duration("hot_retention", &self.hot_retention);
        let cold = duration("cold_retention", &self.cold_retention);
        let hour = duration("hour_rollup_retention", &self.hour_rollup_retention);
        let day = duration("day_rollup_retention", &self.day_rollup_retention);
        let (mut hot_retention_ms, mut cold_retention_ms) = (None, None);
        if let (Ok(hot), Ok(cold)) = (hot, cold) {
            (hot_retention_ms, cold_retention_ms) = (hot, cold);
            if let Err(e) = bucketer::Store::check_retentions(hot, cold) {
                problems.push(e.to_string());
            }
        }
        let mut rollup_retention = bucketer::RollupRetention::FOREVER;
        if let (Ok(hour_ms), Ok(day_ms)) = (hour, day) {
            rollup_retention = bucketer::RollupRetention { hour_ms, day_ms };
            if let Err(e) = rollup_retention.check() {
                problems.push(e.to_string());
            }
        }
        let mut fields = Vec::with_capacity(self.fields.len());
        for (name, ty) in &self.fields {
            if !ingest::wire::valid_field_name(name) {
                problems.push(format!("field {name:?} is not a valid field name ({})", ingest::wire::FIELD_RULE));
            }
            match model::FieldType::parse(ty) {
                Some(ty) => fields.push((name.clone(), ty)),
                None => problems
                    .push(format!("field {name:?} has type {ty:?}, not one of \"f64\", \"i64\", \"bool\", \"string\"")),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(bucketer::TableSpec {
            partition,
            hot_retention_ms,
            cold_retention_ms,
            rollup_retention,
            strict: self.strict,
            fields,
        })
    }
}

/// `[rollup]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RollupSection {
    /// Milliseconds between two passes of the roll-up task. Default 1000; at most one hour.
    pub(crate) interval_ms: u64,
    /// How late a reading may arrive, in event time, before its hour is rolled up: an hour is
    /// recomputed once its end is at or before the largest event time stored minus this.
    /// A later reading re-dirties the hour, which is then recomputed again. Default 300,000
    /// (5 minutes); at most 365 days.
    pub(crate) allowed_lateness_ms: u64,
}

impl Default for RollupSection {
    fn default() -> Self {
        RollupSection { interval_ms: 1000, allowed_lateness_ms: 300_000 }
    }
}

/// `[lineproto]`: how InfluxDB line protocol maps to readings, on MQTT (`{topic_prefix}/lp`) and
/// on Kafka (`kafka.format = "lp"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LineProtoSection {
    /// Unit of line timestamps: `ns`, `us`, `ms` or `s`. Default `ns`.
    pub(crate) precision: ingest::lineproto::Precision,
    /// Tag naming the device (else the `device` tag, else the Kafka key). Default `name`.
    pub(crate) device_tag: String,
}

impl Default for LineProtoSection {
    fn default() -> Self {
        let d = ingest::lpwire::LpConfig::default();
        LineProtoSection { precision: d.precision, device_tag: d.device_tag }
    }
}

/// `[kafka]`: the Kafka consumer, off by default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct KafkaSection {
    /// Consume from Kafka. Default false.
    pub(crate) enabled: bool,
    /// Bootstrap brokers, `host:port[,host:port]`. Default `127.0.0.1:9092`.
    pub(crate) brokers: String,
    /// Consumer group. Default `hourglass`.
    pub(crate) group_id: String,
    /// Topics to consume. Default `["hourglass"]`.
    pub(crate) topics: Vec<String>,
    /// Value format: `json` or `lp`. Default `json`.
    pub(crate) format: ingest::kafka::KafkaFormat,
    /// JSON: table of each topic. Default empty.
    pub(crate) topic_tables: std::collections::BTreeMap<String, String>,
    /// JSON: table of topics not in `topic_tables`; empty (default): the topic's name.
    pub(crate) default_table: String,
    /// Start of partitions with no stored or committed offset: `earliest` or `latest`.
    /// Default `earliest`.
    pub(crate) auto_offset_reset: ingest::kafka::OffsetReset,
    /// Group session timeout, ms. Default 10,000.
    pub(crate) session_timeout_ms: u32,
    /// Longest wait for in-flight batches of revoked partitions, ms. Default 10,000.
    pub(crate) revoke_drain_timeout_ms: u64,
    /// Interval of offset commits to the broker, ms. Default 1000.
    pub(crate) commit_interval_ms: u64,
    /// `plaintext` (default), `ssl` (TLS), `sasl_plaintext` (a SASL login) or `sasl_ssl` (both).
    pub(crate) security_protocol: KafkaSecurityProtocol,
    /// With TLS: PEM file of the CA certificates the brokers' certificates are checked
    /// against; `""` (default): OpenSSL's default store.
    pub(crate) ca_file: String,
    /// With TLS: PEM file of the client certificate shown to brokers that ask for one (with
    /// `key_file`); `""` (default): none.
    pub(crate) cert_file: String,
    /// PEM file of `cert_file`'s private key; `""` (default): none.
    pub(crate) key_file: String,
    /// With SASL: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (either case); `""` (default)
    /// only without.
    pub(crate) sasl_mechanism: String,
    /// With SASL: the login's username. Default `""`.
    pub(crate) username: String,
    /// With SASL: the login's password. Default `""`.
    pub(crate) password: String,
}

/// `kafka.security_protocol`: librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KafkaSecurityProtocol {
    /// Plain TCP. (Kafka's own clients write the names in capitals: taken too.)
    #[default]
    #[serde(alias = "PLAINTEXT")]
    Plaintext,
    /// TLS.
    #[serde(alias = "SSL")]
    Ssl,
    /// A SASL login over plain TCP.
    #[serde(alias = "SASL_PLAINTEXT")]
    SaslPlaintext,
    /// A SASL login over TLS.
    #[serde(alias = "SASL_SSL")]
    SaslSsl,
}

impl KafkaSecurityProtocol {
    /// The name in the configuration.
    fn security_name(self) -> &'static str {
        match self {
            KafkaSecurityProtocol::Plaintext => "plaintext",
            KafkaSecurityProtocol::Ssl => "ssl",
            KafkaSecurityProtocol::SaslPlaintext => "sasl_plaintext",
            KafkaSecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    fn tls(self) -> bool {
        matches!(self, KafkaSecurityProtocol::Ssl | KafkaSecurityProtocol::SaslSsl)
    }

    fn sasl(self) -> bool {
        matches!(self, KafkaSecurityProtocol::SaslPlaintext | KafkaSecurityProtocol::SaslSsl)
    }
}

/// The SASL mechanisms librdkafka does here (its GSSAPI and OAUTHBEARER are not built in).
const SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

impl KafkaSection {
    /// The consumer's TLS and SASL login, as `security_protocol` says.
    pub(crate) fn security(&self) -> ingest::kafka::KafkaSecurity {
        let file = |f: &str| (!f.is_empty()).then(|| PathBuf::from(f));
        ingest::kafka::KafkaSecurity {
            tls: self.security_protocol.tls().then(|| ingest::kafka::KafkaTls {
                ca_file: file(&self.ca_file),
                client: file(&self.cert_file).zip(file(&self.key_file)),
            }),
            sasl: self.security_protocol.sasl().then(|| ingest::kafka::KafkaSasl {
                mechanism: self.sasl_mechanism.to_ascii_uppercase(),
                username: self.username.clone(),
                password: self.password.clone(),
            }),
        }
    }

    /// The problems of the TLS and SASL settings, each with its key. librdkafka reads the
    /// files (when Kafka is enabled): its reason names the property of the file it refused.
    pub(crate) fn security_problems(&self) -> Vec<(&'static str, String)> {
        let protocol = self.security_protocol;
        let name = protocol.security_name();
        let files = [
            ("kafka.ca_file", &self.ca_file),
            ("kafka.cert_file", &self.cert_file),
            ("kafka.key_file", &self.key_file),
        ];
        let login = [
            ("kafka.sasl_mechanism", &self.sasl_mechanism),
            ("kafka.username", &self.username),
            ("kafka.password", &self.password),
        ];
        let mut problems = Vec::new();
        fn set<'a>(pairs: [(&'static str, &'a String); 3]) -> impl Iterator<Item = (&'static str, &'a String)> {
            pairs.into_iter().filter(|(_, v)| !v.is_empty())
        }
        if !protocol.tls() {
            let message =
                format!("is for TLS, and kafka.security_protocol is {name:?}: set it to \"ssl\" or \"sasl_ssl\"");
            problems.extend(set(files).map(|(key, _)| (key, message.clone())));
        } else if let Some(problem) =
            half_a_client_pair(("kafka.cert_file", &self.cert_file), ("kafka.key_file", &self.key_file))
        {
            problems.push(problem);
        }
        if !protocol.sasl() {
            let message = format!(
                "is for a SASL login, and kafka.security_protocol is {name:?}: set it to \"sasl_plaintext\" or \"sasl_ssl\""
            );
            problems.extend(set(login).map(|(key, _)| (key, message.clone())));
        } else {
            if !SASL_MECHANISMS.contains(&self.sasl_mechanism.to_ascii_uppercase().as_str()) {
                let said = match self.sasl_mechanism.as_str() {
                    "" => format!("is needed with security_protocol {name:?}"),
                    other => format!("{other:?} is not one Hourglass takes"),
                };
                problems.push((
                    "kafka.sasl_mechanism",
                    format!("{said}: \"PLAIN\", \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\""),
                ));
            }
            for (key, value) in [("kafka.username", &self.username), ("kafka.password", &self.password)] {
                if value.is_empty() {
                    problems.push((key, format!("is needed with security_protocol {name:?}")));
                }
            }
        }
        // Plain TCP without a login sets nothing librdkafka could refuse.
        if !problems.is_empty() || !self.enabled || protocol == KafkaSecurityProtocol::Plaintext {
            return problems;
        }
        // A file that cannot be opened is said in the system's words (OpenSSL's are "system
        // lib"); librdkafka then reads the contents, and stops at the first file it refuses.
        let unreadable: Vec<(&'static str, String)> = set(files)
            .filter_map(|(key, v)| std::fs::File::open(v.as_str()).err().map(|e| (key, format!("{v}: {e}"))))
            .collect();
        if !unreadable.is_empty() {
            return unreadable;
        }
        // What librdkafka would say as "PEM lib", or take in silence and fail every connect with.
        let ca = Path::new(&self.ca_file);
        if ca.is_dir() && !hashed_ca_directory(ca) {
            let message = format!(
                "{}: a directory, which OpenSSL reads only by its hashed names (`openssl rehash {}` makes them), \
                 and this one has none: give a PEM file of CA certificates",
                ca.display(),
                ca.display()
            );
            return vec![("kafka.ca_file", message)];
        }
        if let Some(message) = ingest::mqtt::encrypted_key(Path::new(&self.key_file)) {
            return vec![("kafka.key_file", message)];
        }
        match self.security().check() {
            // librdkafka takes an expired client certificate, which the broker then refuses at
            // every connect (QA58 F3): said as for MQTT's.
            Ok(()) if self.cert_file.is_empty() => Vec::new(),
            Ok(()) => match ingest::mqtt::usable_chain(Path::new(&self.cert_file), false, false) {
                Ok(_) => Vec::new(),
                Err(problem) => vec![("kafka.cert_file", problem)],
            },
            Err(reason) => {
                let at = [
                    ("ssl.ca.location", files[0]),
                    ("ssl.certificate.location", files[1]),
                    ("ssl.key.location", files[2]),
                ]
                .into_iter()
                .find(|(property, _)| reason.contains(property));
                vec![match at {
                    Some((_, (key, file))) => (key, format!("{file}: librdkafka refused it: {reason}")),
                    None => ("kafka.security_protocol", format!("librdkafka refused it: {reason}")),
                }]
            }
        }
    }
}

impl Default for KafkaSection {
    fn default() -> Self {
        KafkaSection {
            enabled: false,
            brokers: "127.0.0.1:9092".into(),
            group_id: "hourglass".into(),
            topics: vec!["hourglass".into()],
            format: ingest::kafka::KafkaFormat::Json,
            topic_tables: std::collections::BTreeMap::new(),
            default_table: String::new(),
            auto_offset_reset: ingest::kafka::OffsetReset::Earliest,
            session_timeout_ms: 10_000,
            revoke_drain_timeout_ms: 10_000,
            commit_interval_ms: 1000,
            security_protocol: KafkaSecurityProtocol::Plaintext,
            ca_file: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            sasl_mechanism: String::new(),
            username: String::new(),
            password: String::new(),
        }
    }
}

/// `[query]`: the limits of one request to the query service; each 400 that enforces one
/// names its key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct QuerySection {
    /// Longest `[from, to)` of a raw read, ms. Default 34,560,000,000 (400 days).
    pub(crate) max_range_ms: u64,
    /// Most devices in one latest-values request. Default 10,000.
    pub(crate) max_devices_per_request: usize,
    /// Most readings in one page of a raw read (and the page size when `limit` is not given).
    /// Default 10,000.
    pub(crate) max_page_rows: usize,
    /// Most bytes of one answer: a raw-read page ends before it, a latest or roll-up answer
    /// above it is refused. Default 16 MiB.
    pub(crate) max_response_bytes: usize,
}

impl Default for QuerySection {
    fn default() -> Self {
        let d = query::api::Limits::default();
        QuerySection {
            max_range_ms: d.max_range_ms.unsigned_abs(),
            max_devices_per_request: d.max_devices,
            max_page_rows: d.max_page_rows,
            max_response_bytes: d.max_response_bytes,
        }
    }
}

impl Config {
    /// The limits as the query service takes them: `[query]`'s, and the roll-up lateness a
    /// table definition's hour roll-up retention must outlast.
    pub(crate) fn query_limits(&self) -> query::api::Limits {
        let q = &self.query;
        query::api::Limits {
            max_range_ms: i64::try_from(q.max_range_ms).unwrap_or(i64::MAX),
            max_devices: q.max_devices_per_request,
            max_page_rows: q.max_page_rows,
            max_response_bytes: q.max_response_bytes,
            rollup_allowed_lateness_ms: self.rollup.allowed_lateness_ms,
        }
    }
}

/// `[auth]`: bearer tokens on the HTTP API, username / password on the embedded MQTT broker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct AuthSection {
    /// Check tokens. Default true. False is accepted only when the query service and the
    /// embedded broker listen on loopback (the local demo), and is logged as a warning.
    pub(crate) enabled: bool,
    /// The admin token; unset (default): none, so only tokens already stored are accepted. Best
    /// given as the variable `HOURGLASS_AUTH__ADMIN_TOKEN` rather than written in a file.
    pub(crate) admin_token: Option<String>,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection { enabled: true, admin_token: None }
    }
}

/// Shortest admin token accepted.
pub(crate) const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// `storage.write_buffer_mb` by default, and the bench commands' `--write-buffer-mb`.
pub(crate) const DEFAULT_WRITE_BUFFER_MB: u64 = bucketer::DEFAULT_WRITE_BUFFER_MIB;
/// Longest raw-read range accepted as `query.max_range_ms`, ms (about 1,000 years).
const MAX_QUERY_RANGE_MS: u64 = 365_250 * 86_400_000;

/// Longest interval of the roll-up task, ms (one hour).
const MAX_ROLLUP_INTERVAL_MS: u64 = 3_600_000;
/// Longest allowed lateness, ms (365 days).
const MAX_ALLOWED_LATENESS_MS: u64 = 365 * 86_400_000;

/// How long dead letters are kept by default.
const DEFAULT_DEAD_LETTER_RETENTION: &str = "7d";
/// `storage.archive_late_wait` by default: a day, as [`bucketer::archive::LATE_REWRITE_WAIT`].
const DEFAULT_ARCHIVE_LATE_WAIT: &str = "1d";

impl StorageSection {
    /// `archive_late_wait` in milliseconds (0: the next run), or what is wrong with it.
    pub(crate) fn archive_late_wait_ms(&self) -> Result<u64, String> {
        let text = &self.archive_late_wait;
        if text == "0" {
            return Ok(0);
        }
        model::parse_duration_ms(text)
            .ok_or_else(|| format!("{text:?} is not a duration such as \"1d\" or \"6h\", or \"0\" for the next run"))
    }

    /// `dead_letter_retention` in milliseconds: `Ok(None)` for `""` (forever), or what is
    /// wrong with it.
    pub(crate) fn dead_letter_retention_ms(&self) -> Result<Option<u64>, String> {
        let text = &self.dead_letter_retention;
        if text.is_empty() {
            return Ok(None);
        }
        model::parse_duration_ms(text)
            .map(Some)
            .ok_or_else(|| format!("{text:?} is not a duration such as \"12h\" or \"7d\", or \"\" for forever"))
    }
}

/// Longest interval of the retention task, seconds (365 days).
const MAX_RETENTION_INTERVAL_S: u64 = 365 * 86_400;
/// Longest `mqtt.silence_warning_s`, seconds (365 days).
const MAX_SILENCE_WARNING_S: u64 = 365 * 86_400;
/// Largest `mqtt.broker_backlog_mb`: 1 TiB.
const MAX_BROKER_BACKLOG_MB: u64 = 1 << 20;
/// Most threads `storage.subcompactions` (and the bench commands' `--subcompactions`) accepts.
pub(crate) const MAX_SUBCOMPACTIONS: u32 = 64;
/// Most jobs `storage.background_jobs` (and the bench commands' `--background-jobs`) accepts.
pub(crate) const MAX_BACKGROUND_JOBS: u32 = 64;

/// What glibc's POSIX regular expressions (extended), which librdkafka compiles a `^…` topic
/// pattern with (`regcomp`, as its `HAVE_REGEX` build here does), find wrong in `pattern`;
/// `None` when it compiles.
#[allow(unsafe_code)]
fn topic_pattern_problem(pattern: &str) -> Option<String> {
    let Ok(c) = std::ffi::CString::new(pattern) else {
        return Some("it holds a NUL byte".into());
    };
    // SAFETY: `re` is zeroed storage of the type `regcomp` fills, used only in this block;
    // it is freed with `regfree` once, after a successful `regcomp` (a failed one leaves nothing
    // to free). `regerror` reads the code and `re`, and writes at most `buf.len()` bytes,
    // NUL-terminated, into `buf`.
    let (code, buf) = unsafe {
        let mut re: libc::regex_t = std::mem::zeroed();
        let code = libc::regcomp(&mut re, c.as_ptr(), libc::REG_EXTENDED | libc::REG_NOSUB);
        if code == 0 {
            libc::regfree(&mut re);
            return None;
        }
        let mut buf = [0u8; 256];
        libc::regerror(code, &re, buf.as_mut_ptr().cast(), buf.len());
        (code, buf)
    };
    let text = std::ffi::CStr::from_bytes_until_nul(&buf).map(|t| t.to_string_lossy().into_owned());
    Some(text.unwrap_or_else(|_| format!("regcomp error {code}")))
}

/// Whether `jobs` is a valid `storage.background_jobs` (or `--background-jobs`): 0, or from 2 to
/// [`MAX_BACKGROUND_JOBS`]. One job would still run a flush and a compaction at once, as 2 does.
pub(crate) fn valid_background_jobs(jobs: u32) -> bool {
    jobs == 0 || (2..=MAX_BACKGROUND_JOBS).contains(&jobs)
}

/// What a valid `storage.background_jobs` (or `--background-jobs`) is, as its refusals say.
pub(crate) fn background_jobs_rule() -> String {
    format!("must be 0 (one a core) or from 2 to {MAX_BACKGROUND_JOBS}")
}

/// RocksDB's `max_background_jobs` for a valid `storage.background_jobs`: 0 is
/// [`bucketer::default_background_jobs`].
pub(crate) fn background_jobs(jobs: u32) -> i32 {
    match i32::try_from(jobs) {
        Ok(0) | Err(_) => bucketer::default_background_jobs(),
        Ok(jobs) => jobs,
    }
}

/// One key of the file: its name and what a value looks like (for hints).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key {
    /// `section.key`, or `key` at the top level.
    pub(crate) name: &'static str,
    /// What a valid value looks like, for hints.
    pub(crate) expects: &'static str,
}

/// Every key, in file order. Tests check it against the structs above and the example file.
pub(crate) const KEYS: &[Key] = &[
    Key { name: "data_dir", expects: "a directory path" },
    Key { name: "http.listen", expects: "an address like \"0.0.0.0:8080\"" },
    Key {
        name: "http.tls_cert_file",
        expects: "a PEM file of the query service's certificate chain (HTTPS), or \"\" for plain HTTP",
    },
    Key { name: "http.tls_key_file", expects: "a PEM file of tls_cert_file's private key, or \"\" for none" },
    Key { name: "http.read_timeout_ms", expects: "a whole number of milliseconds from 100 to 3600000" },
    Key { name: "mqtt.enabled", expects: "true or false" },
    Key { name: "mqtt.url", expects: "a broker URL like \"mqtt://host:1883\" or \"mqtts://host:8883\" (TLS)" },
    Key { name: "mqtt.username", expects: "the consumer's username at mqtt.url's broker, or \"\" for none" },
    Key { name: "mqtt.password", expects: "the password of mqtt.username, or \"\" for none" },
    Key { name: "mqtt.ca_file", expects: "a PEM file of CA certificates, or \"\" for the system's" },
    Key { name: "mqtt.cert_file", expects: "a PEM file of a client certificate, or \"\" for none" },
    Key { name: "mqtt.key_file", expects: "a PEM file of cert_file's private key, or \"\" for none" },
    Key {
        name: "mqtt.silence_warning_s",
        expects: "a whole number of seconds from 0 (no warning) to 31536000 (365 days)",
    },
    Key { name: "mqtt.listen", expects: "an address like \"0.0.0.0:1883\"" },
    Key { name: "mqtt.client_id", expects: "a non-empty string" },
    Key { name: "mqtt.topic_prefix", expects: "one topic level: letters, digits, `_`, `-`, `.`" },
    Key {
        name: "mqtt.subscriptions",
        expects: "a list of topic filters under the topic prefix that share no topic, like [\"hourglass/fleet/#\"]",
    },
    Key { name: "mqtt.max_payload_bytes", expects: "a whole number of bytes, at least 1" },
    Key { name: "mqtt.broker_max_inflight", expects: "a whole number from 1 to 65535" },
    Key { name: "mqtt.broker_backlog_mb", expects: "a whole number of MiB from 1 to 1048576" },
    Key { name: "storage.sync_wal", expects: "true or false" },
    Key { name: "storage.channel_capacity", expects: "a whole number, at least 1" },
    Key { name: "storage.max_batch_readings", expects: "a whole number, at least 1" },
    Key { name: "storage.retention_interval_s", expects: "a whole number of seconds from 1 to 31536000 (365 days)" },
    Key { name: "storage.dead_letter_retention", expects: "a duration such as \"7d\" or \"12h\", or \"\" for forever" },
    Key { name: "storage.bucket_max_readings", expects: "a whole number, at least 1" },
    Key { name: "storage.write_buffer_mb", expects: "a whole number of MiB from 0 (off) to 65536" },
    Key { name: "storage.compaction", expects: "\"leveled\" or \"universal\"" },
    Key { name: "storage.subcompactions", expects: "a whole number of threads from 1 to 64" },
    Key { name: "storage.background_jobs", expects: "0 (one a core, at least 2) or a whole number from 2 to 64" },
    Key { name: "storage.archive", expects: "true or false" },
    Key { name: "storage.archive_dir", expects: "a directory path, or \"\" for {data_dir}/archive" },
    Key { name: "storage.archive_url", expects: "\"s3://bucket\" or \"s3://bucket/prefix\", or \"\" for archive_dir" },
    Key { name: "storage.archive_s3_endpoint", expects: "a URL like \"http://127.0.0.1:9000\", or \"\" for AWS" },
    Key {
        name: "storage.archive_late_wait",
        expects: "a duration such as \"1d\" or \"6h\", or \"0\" for the next run",
    },
    Key {
        name: "storage.tables",
        expects: "a table of table name = { partition = \"day\", hot_retention = \"30d\", cold_retention = \"400d\", \
                  hour_rollup_retention = \"90d\", day_rollup_retention = \"730d\", strict = true, \
                  fields = { status = \"i64\" } }",
    },
    Key { name: "rollup.interval_ms", expects: "a whole number of milliseconds from 1 to 3600000 (one hour)" },
    Key {
        name: "rollup.allowed_lateness_ms",
        expects: "a whole number of milliseconds from 0 to 31536000000 (365 days)",
    },
    Key { name: "lineproto.precision", expects: "\"ns\", \"us\", \"ms\", \"s\", \"m\" or \"h\"" },
    Key { name: "lineproto.device_tag", expects: "a non-empty tag key" },
    Key { name: "kafka.enabled", expects: "true or false" },
    Key { name: "kafka.brokers", expects: "\"host:port\" or \"host:port,host:port\"" },
    Key { name: "kafka.group_id", expects: "a non-empty string" },
    Key { name: "kafka.topics", expects: "a non-empty list of topic names like [\"fleet\"]" },
    Key { name: "kafka.format", expects: "\"json\" or \"lp\"" },
    Key {
        name: "kafka.topic_tables",
        expects: "a table of topic = \"table name\", like { fleet = \"fleet.readings\" }",
    },
    Key { name: "kafka.default_table", expects: "a table name, or \"\" for the topic's name" },
    Key { name: "kafka.auto_offset_reset", expects: "\"earliest\" or \"latest\"" },
    Key { name: "kafka.session_timeout_ms", expects: "a whole number of milliseconds from 1000 to 3600000" },
    Key { name: "kafka.revoke_drain_timeout_ms", expects: "a whole number of milliseconds from 1 to 3600000" },
    Key { name: "kafka.commit_interval_ms", expects: "a whole number of milliseconds from 1 to 3600000" },
    Key {
        name: "kafka.security_protocol",
        expects: "\"plaintext\", \"ssl\" (TLS), \"sasl_plaintext\" (a SASL login) or \"sasl_ssl\" (both)",
    },
    Key { name: "kafka.ca_file", expects: "a PEM file of CA certificates, or \"\" for OpenSSL's default store" },
    Key { name: "kafka.cert_file", expects: "a PEM file of a client certificate, or \"\" for none" },
    Key { name: "kafka.key_file", expects: "a PEM file of cert_file's private key, or \"\" for none" },
    Key {
        name: "kafka.sasl_mechanism",
        expects: "\"PLAIN\", \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\" with a SASL login, else \"\"",
    },
    Key { name: "kafka.username", expects: "the SASL login's username, or \"\" without one" },
    Key { name: "kafka.password", expects: "the SASL login's password" },
    Key { name: "query.max_range_ms", expects: "a whole number of milliseconds from 1 to 31557600000000" },
    Key { name: "query.max_devices_per_request", expects: "a whole number, at least 1" },
    Key { name: "query.max_page_rows", expects: "a whole number, at least 1" },
    Key { name: "query.max_response_bytes", expects: "a whole number of bytes, at least 1024" },
    Key { name: "auth.enabled", expects: "true or false (false only with loopback listen addresses)" },
    Key { name: "auth.admin_token", expects: "a secret string of at least 16 characters" },
];

/// Prefix of the variables that override keys.
pub(crate) const ENV_PREFIX: &str = "HOURGLASS_";
/// Variables with the prefix that are not keys.
const ENV_NOT_KEYS: &[&str] = &["HOURGLASS_CONFIG"];

/// The variable that overrides `key`: `mqtt.max_payload_bytes` → `HOURGLASS_MQTT__MAX_PAYLOAD_BYTES`.
pub(crate) fn env_var(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_uppercase().replace('.', "__"))
}

/// One problem of a configuration: the key it concerns, what is wrong, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// `section.key`, followed by `(from VARIABLE)` when the value came from the environment.
    pub(crate) key: String,
    pub(crate) message: String,
    pub(crate) hint: String,
}

impl Problem {
    fn new(key: impl Into<String>, message: impl Into<String>, hint: impl Into<String>) -> Problem {
        Problem { key: key.into(), message: message.into(), hint: hint.into() }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (hint: {})", self.key, self.message, self.hint)
    }
}

/// The problems of the values (`more`) less those that judge a key whose value could not be
/// read (a problem of `read`): they saw the key's default, not what was written (a
/// `kafka.security_protocol` of `"tls"` had `kafka.ca_file` say it is for TLS while the
/// protocol is `plaintext`, besides its own problem). A table of entries (`storage.tables`)
/// keeps its good entries, and the problems of them.
fn judged_by_default(more: Vec<Problem>, read: &[Problem]) -> Vec<Problem> {
    let unread: Vec<&str> = read
        .iter()
        .filter_map(|p| find_key(p.key.split(' ').next()?))
        .map(|k| k.name)
        .filter(|name| !ENTRY_KEYS.iter().any(|(k, _)| k == name))
        .collect();
    more.into_iter()
        .filter(|p| !unread.iter().any(|k| p.key.split(' ').next() == Some(*k) || p.message.contains(k)))
        .collect()
}

/// Problems as one error, a line each.
pub(crate) fn problems_error(problems: &[Problem]) -> anyhow::Error {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let problems = name_variables(problems.to_vec(), &env);
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    anyhow::anyhow!("invalid configuration, {} problem(s):\n  {}", problems.len(), lines.join("\n  "))
}

/// Adds `(from VARIABLE)` to the key of each problem whose value a `HOURGLASS_*` variable of
/// `env` set: found once the settings were merged ([`Config::validate`]), it would otherwise
/// send the operator to look for it in a file that does not hold it.
pub(crate) fn name_variables(problems: Vec<Problem>, env: &[(String, String)]) -> Vec<Problem> {
    problems
        .into_iter()
        .map(|mut p| {
            let var = env_var(&p.key);
            if p.key.contains(" (from ") || find_key(&p.key).is_none() {
                return p;
            }
            if let Some((_, raw)) = env.iter().find(|(n, _)| *n == var) {
                p.key = format!("{} (from {var})", p.key);
                if raw == "\"\"" || raw == "''" {
                    p.message.push_str(QUOTED_EMPTY);
                }
            }
            p
        })
        .collect()
}

fn find_key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

fn is_section(name: &str) -> bool {
    KEYS.iter().any(|k| k.name.split_once('.').is_some_and(|(s, _)| s == name))
}

/// The default of `key` as written in the file, or `unset`.
fn default_text(key: &str) -> String {
    let defaults = toml::Value::try_from(Config::default()).ok();
    let mut v = defaults.as_ref();
    for part in key.split('.') {
        v = v.and_then(|v| v.get(part));
    }
    v.map_or_else(|| "unset".to_string(), ToString::to_string)
}

/// The hint for a key whose value is wrong.
fn value_hint(key: &Key) -> String {
    format!("expected {}; the default is {}", key.expects, default_text(key.name))
}

/// The hint for a name that is no key: the nearest key (rendered by `show`), else the keys of
/// its section, else all keys.
fn unknown_hint(name: &str, show: impl Fn(&str) -> String) -> String {
    let squash = |s: &str| s.replace(['.', '_'], "");
    let section = |s: &str| s.split_once('.').map(|(s, _)| s.to_string());
    let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_string();
    let same_section = |k: &str| section(k) == section(name);
    let prefixed = |k: &str| last(name).starts_with(&last(k)) || last(k).starts_with(&last(name));
    let distance = |k: &&Key| strsim::levenshtein(&last(k.name), &last(name));
    // Of the keys of its section that pass `fits`, the nearest in spelling (the first of equals).
    let nearest = |fits: &dyn Fn(&Key) -> bool| {
        KEYS.iter().filter(|k| same_section(k.name) && fits(k)).min_by_key(|k| distance(k))
    };
    let near = [
        KEYS.iter().find(|k| squash(k.name) == squash(name)),
        // A typo: `archive_dirr` is `archive_dir`, not the shorter `archive` it starts with.
        nearest(&|k| distance(&k) <= 2),
        nearest(&|k| prefixed(k.name)),
        KEYS.iter().find(|k| last(k.name) == last(name)),
    ];
    if let Some(k) = near.into_iter().flatten().next() {
        return format!("did you mean {}?", show(k.name));
    }
    let known: Vec<String> = KEYS.iter().filter(|k| same_section(k.name)).map(|k| show(k.name)).collect();
    if section(name).is_none() || known.is_empty() {
        let all: Vec<String> = KEYS.iter().map(|k| show(k.name)).collect();
        format!("known keys: {}", all.join(", "))
    } else {
        format!("known keys here: {}", known.join(", "))
    }
}

/// A table holding only `key = value`.
fn single(key: &str, value: toml::Value) -> toml::Table {
    let mut t = toml::Table::new();
    match key.split_once('.') {
        Some((section, name)) => {
            let mut s = toml::Table::new();
            s.insert(name.to_string(), value);
            t.insert(section.to_string(), toml::Value::Table(s));
        }
        None => {
            t.insert(key.to_string(), value);
        }
    }
    t
}

/// Whether `key = value` alone makes a valid `Config` (serde's message if not, without the
/// `in `key`` line toml adds: the problem names the key already).
fn check_value(key: &str, value: &toml::Value) -> Result<(), String> {
    toml::Value::Table(single(key, value.clone()))
        .try_into::<Config>()
        .map(drop)
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())
}

/// The keys whose value is a table of named entries, with what an entry is called in a problem.
const ENTRY_KEYS: [(&str, &str); 2] = [("storage.tables", "table"), ("kafka.topic_tables", "topic")];

/// Whether `key = { entry = value }` alone makes a valid `Config`; if not, serde's message
/// prefixed with the entry and, when serde names one, the entry's own key that is wrong
/// (`table "plant.a", key strict: invalid type: …`).
fn check_entry(key: &str, entry: &str, value: &toml::Value) -> Result<(), String> {
    let one = toml::Value::Table(toml::Table::from_iter([(entry.to_string(), value.clone())]));
    let Err(e) = toml::Value::Table(single(key, one)).try_into::<Config>() else { return Ok(()) };
    let text = e.to_string();
    let mut lines = text.lines();
    let reason = lines.next().unwrap_or_default();
    let kind = ENTRY_KEYS.iter().find(|(k, _)| *k == key).map_or("entry", |(_, kind)| kind);
    // toml's path of the value, `in `storage.tables.plant.a.strict``: past the entry, its key.
    let inner = lines
        .next()
        .and_then(|l| l.strip_prefix("in `"))
        .and_then(|l| l.strip_suffix('`'))
        .and_then(|path| path.strip_prefix(&format!("{key}.{entry}.")))
        .map(|inner| format!(", key {inner}"))
        .unwrap_or_default();
    // `fleet.readings = { … }` unquoted is the table `fleet` with a key `readings`.
    let unquoted = reason
        .strip_prefix("unknown field `")
        .and_then(|r| r.split_once('`'))
        .map(|(field, _)| field)
        .filter(|field| key == "storage.tables" && value.get(field).is_some_and(toml::Value::is_table))
        .map(|field| format!(" (a table name with a dot is quoted: \"{entry}.{field}\" = {{ … }})"))
        .unwrap_or_default();
    Err(format!("{kind} {entry:?}{inner}: {reason}{unquoted}"))
}

/// The warning for a table whose cold retention keeps nothing: without the archive a
/// partition past the hot retention is deleted for good (`check-config` and `serve` say it).
pub(crate) fn cold_without_archive(table: &str, cold_ms: u64) -> String {
    format!(
        "table {table:?} has a cold retention ({}) but storage.archive is false: its partitions are deleted for good \
         at the hot retention, none is kept for the cold one (set storage.archive = true to keep them)",
        model::format_duration_ms(cold_ms)
    )
}

/// Keys whose values are secrets: a problem of theirs does not show the value.
const SECRET_KEYS: &[&str] = &["mqtt.password", "kafka.password", "auth.admin_token"];

/// TOML's reason for a file it cannot read, with the line it shows; a line naming a secret key
/// (or a password in a url) is left out, as its line and column say where.
fn syntax_problem(e: &toml::de::Error, text: &str) -> String {
    let full = e.to_string().trim().to_string();
    let Some(span) = e.span() else {
        return full;
    };
    let line_start = text[..span.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    let secret = ["password", "admin_token", "@"].iter().any(|s| line.contains(s));
    if !secret {
        return full;
    }
    let line_no = text[..line_start].matches('\n').count() + 1;
    format!("TOML parse error at line {line_no} (not shown: it holds a secret): {}", e.message().trim())
}

/// Added to a problem of a variable set to `""`, which is taken as two quote characters.
const QUOTED_EMPTY: &str =
    " (a variable's value is its text, quotes and all: for an empty value, set the variable to nothing)";

/// The keys without a default value, which an empty variable unsets.
const UNSET_BY_EMPTY: &[&str] = &["mqtt.url", "auth.admin_token"];

/// Removes `key` from `table`.
fn unset(table: &mut toml::Table, key: &str) {
    match key.split_once('.') {
        Some((section, name)) => {
            if let Some(toml::Value::Table(s)) = table.get_mut(section) {
                s.remove(name);
            }
        }
        None => drop(table.remove(key)),
    }
}

/// Sets `key = value` in `table`, creating its section.
fn set(table: &mut toml::Table, key: &str, value: toml::Value) {
    match key.split_once('.') {
        Some((section, name)) => {
            let entry = table.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(s) = entry {
                s.insert(name.to_string(), value);
            }
        }
        None => {
            table.insert(key.to_string(), value);
        }
    }
}

/// The value of a variable for `key`: the text as a string when the key takes one, else the
/// text read as a TOML value (`true`, `4096`). Text that opens a list or a table but is not
/// TOML is refused with TOML's reason (a string's type error would hide it).
fn env_value(key: &str, raw: &str) -> Result<toml::Value, String> {
    let as_string = toml::Value::String(raw.to_string());
    let string_err = match check_value(key, &as_string) {
        Ok(()) => return Ok(as_string),
        Err(e) => e,
    };
    const LEFT: &str = "v = ";
    match toml::from_str::<toml::Table>(&format!("{LEFT}{raw}")).map(|mut t| t.remove("v")) {
        Ok(Some(v)) => check_value(key, &v).map(|()| v),
        Err(e) if raw.trim_start().starts_with(['[', '{']) => {
            let reason = e.message().trim().replace('\n', ", ");
            let at = e.span().map_or_else(String::new, |span| {
                format!(" at character {}", span.start.saturating_sub(LEFT.len()).min(raw.len()) + 1)
            });
            Err(format!("{raw:?} is not a TOML value: {reason}{at}"))
        }
        _ => Err(string_err),
    }
}

impl Config {
    /// Defaults, then the file at `path` (if any), then the `HOURGLASS_*` variables of `env`,
    /// then `adjust` (a command's flags). Any problem fails the load; all of them are returned,
    /// and those of the values too when there are any (as [`Config::check`] does), so that a
    /// command shows every problem in one round, not the values' only once the rest is mended.
    pub(crate) fn load_with(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        adjust: impl FnOnce(&mut Config),
    ) -> Result<Config, Vec<Problem>> {
        let (mut cfg, mut problems) = Config::layered(path, env);
        adjust(&mut cfg);
        if problems.is_empty() {
            return Ok(cfg);
        }
        if let Err(more) = cfg.validate() {
            problems.extend(judged_by_default(more, &problems));
        }
        Err(problems)
    }

    /// [`Config::load_with`] and [`Config::validate`] at once: what `hourglass check-config` reports.
    pub(crate) fn check(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, Vec<Problem>> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let (cfg, mut problems) = Config::layered(path, env.iter().cloned());
        if let Err(more) = cfg.validate() {
            let more = judged_by_default(more, &problems);
            problems.extend(name_variables(more, &env));
        }
        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(problems)
        }
    }

    /// What a valid configuration does that its author may not expect: `check-config` prints
    /// these and `serve` logs them (for every stored table) as warnings.
    pub(crate) fn warnings(&self) -> Vec<String> {
        if self.storage.archive {
            return Vec::new();
        }
        let colds = self.storage.tables.iter().filter_map(|(name, table)| {
            let cold = table.spec().ok()?.cold_retention_ms?;
            Some(cold_without_archive(name, cold))
        });
        colds.chain(self.unused_archive_settings()).collect()
    }

    /// Whether the query service, and the embedded broker when there is one, listen on loopback
    /// only: the condition for running without tokens (`auth.enabled = false`, the demo).
    pub(crate) fn listens_on_loopback_only(&self) -> bool {
        let embedded_public = self.mqtt.embedded_broker() && !self.mqtt.listen.ip().is_loopback();
        self.http.listen.ip().is_loopback() && !embedded_public
    }

    /// The archive's settings given while `storage.archive` is false, each said.
    pub(crate) fn unused_archive_settings(&self) -> Vec<String> {
        if self.storage.archive {
            return Vec::new();
        }
        let archive_dir = self.storage.archive_dir.display().to_string();
        [("storage.archive_url", &self.storage.archive_url), ("storage.archive_dir", &archive_dir)]
            .into_iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(key, value)| {
                format!("{key} ({value}) is not used: storage.archive is false, so no partition is archived")
            })
            .collect()
    }

    /// The layers merged from every key that is valid on its own, and the problems of the rest.
    fn layered(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> (Config, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut merged = toml::Table::new();
        if let Some(path) = path {
            match std::fs::read_to_string(path) {
                Ok(text) => Config::read_file(&text, &mut merged, &mut problems),
                Err(e) => problems.push(Problem::new(
                    "(file)",
                    format!("cannot read {}: {e}", path.display()),
                    "check the path; without --config the defaults apply",
                )),
            }
        }
        Config::read_env(env, &mut merged, &mut problems);
        match toml::Value::Table(merged).try_into::<Config>() {
            Ok(cfg) => (cfg, problems),
            Err(e) => {
                // Unreachable while each key is checked alone; kept so a surprise is reported.
                problems.push(Problem::new("(config)", e.to_string(), "report this as a bug"));
                (Config::default(), problems)
            }
        }
    }

    /// Checks each key of a TOML text; the valid ones go into `merged`.
    fn read_file(text: &str, merged: &mut toml::Table, problems: &mut Vec<Problem>) {
        let table = match toml::from_str::<toml::Table>(text) {
            Ok(t) => t,
            Err(e) => {
                problems.push(Problem::new(
                    "(syntax)",
                    syntax_problem(&e, text),
                    "fix the TOML syntax at the place shown",
                ));
                return;
            }
        };
        let mut leaves = Vec::new();
        for (name, value) in table {
            match value {
                toml::Value::Table(section) if is_section(&name) => {
                    leaves.extend(section.into_iter().map(|(k, v)| (format!("{name}.{k}"), v)));
                }
                other if is_section(&name) => problems.push(Problem::new(
                    name.clone(),
                    format!("must be a table `[{name}]`, found {}", other.type_str()),
                    format!("write the keys of `{name}` under a `[{name}]` header"),
                )),
                other => leaves.push((name, other)),
            }
        }
        for (name, value) in leaves {
            let Some(key) = find_key(&name) else {
                problems.push(Problem::new(name.clone(), "unknown key", unknown_hint(&name, |k| format!("`{k}`"))));
                continue;
            };
            match (check_value(key.name, &value), value) {
                (Ok(()), value) => set(merged, key.name, value),
                // A table of named entries: each entry alone, so a problem names its entry and
                // the others are kept.
                (Err(_), toml::Value::Table(entries)) if ENTRY_KEYS.iter().any(|(k, _)| *k == key.name) => {
                    let mut good = toml::Table::new();
                    for (entry, v) in entries {
                        match check_entry(key.name, &entry, &v) {
                            Ok(()) => drop(good.insert(entry, v)),
                            Err(e) => problems.push(Problem::new(name.clone(), e, value_hint(key))),
                        }
                    }
                    set(merged, key.name, toml::Value::Table(good));
                }
                (Err(_), _) if SECRET_KEYS.contains(&key.name) => {
                    problems.push(Problem::new(name, "is not a string (the value is not shown)", value_hint(key)));
                }
                (Err(e), _) => problems.push(Problem::new(name, e, value_hint(key))),
            }
        }
    }

    /// Checks each `HOURGLASS_*` variable; the valid ones override `merged`.
    fn read_env(
        env: impl IntoIterator<Item = (String, String)>,
        merged: &mut toml::Table,
        problems: &mut Vec<Problem>,
    ) {
        let mut vars: Vec<(String, String)> =
            env.into_iter().filter(|(n, _)| n.starts_with(ENV_PREFIX) && !ENV_NOT_KEYS.contains(&n.as_str())).collect();
        vars.sort();
        for (var, raw) in vars {
            let name = var[ENV_PREFIX.len()..].to_lowercase().replace("__", ".");
            let Some(key) = find_key(&name) else {
                problems.push(Problem::new(
                    var.clone(),
                    format!("variable names no key (read as `{name}`)"),
                    unknown_hint(&name, |k| format!("`{}`", env_var(k))),
                ));
                continue;
            };
            // Keys without a default value: an empty variable (how compose and systemd files
            // leave one out) unsets it, as leaving it out does.
            if raw.is_empty() && UNSET_BY_EMPTY.contains(&key.name) {
                unset(merged, key.name);
                continue;
            }
            match env_value(key.name, &raw) {
                Ok(v) => set(merged, key.name, v),
                Err(mut e) => {
                    if raw == "\"\"" || raw == "''" {
                        e.push_str(QUOTED_EMPTY);
                    }
                    problems.push(Problem::new(format!("{} (from {var})", key.name), e, value_hint(key)));
                }
            }
        }
    }

    /// Every problem of the values at once, each with its key and a hint.
    pub(crate) fn validate(&self) -> Result<(), Vec<Problem>> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &str, message: String| {
            if !ok {
                let hint = find_key(key).map_or_else(String::new, value_hint);
                problems.push(Problem::new(key, message, hint));
            }
        };
        check(!self.data_dir.as_os_str().is_empty(), "data_dir", "must not be empty".into());
        check(
            self.mqtt.enabled || self.mqtt.url.is_none(),
            "mqtt.url",
            "is set while mqtt.enabled is false: enable MQTT to consume from that broker, or unset it".into(),
        );
        check(self.mqtt.max_payload_bytes > 0, "mqtt.max_payload_bytes", "must be at least 1".into());
        check(
            ingest::wire::valid_table_name(&self.mqtt.topic_prefix),
            "mqtt.topic_prefix",
            format!("{:?} is not a valid topic level", self.mqtt.topic_prefix),
        );
        check(!self.mqtt.client_id.is_empty(), "mqtt.client_id", "must not be empty".into());
        let (m, h) = (self.mqtt.listen, self.http.listen);
        // One port on two addresses of which one is every address (0.0.0.0) clashes too.
        let same_socket =
            m.port() == h.port() && (m.ip() == h.ip() || m.ip().is_unspecified() || h.ip().is_unspecified());
        check(
            !(self.mqtt.embedded_broker() && same_socket && m.port() != 0),
            "mqtt.listen",
            format!("{m} takes http.listen's port ({h}): the embedded broker and the query service need a port each"),
        );
        let subscriptions = ingest::mqtt::check_subscriptions(&self.mqtt.topic_prefix, &self.mqtt.subscriptions);
        check(subscriptions.is_ok(), "mqtt.subscriptions", subscriptions.err().unwrap_or_default());
        check(
            (1..=usize::from(u16::MAX)).contains(&self.mqtt.broker_max_inflight),
            "mqtt.broker_max_inflight",
            format!("{} is out of range", self.mqtt.broker_max_inflight),
        );
        check(
            self.mqtt.silence_warning_s <= MAX_SILENCE_WARNING_S,
            "mqtt.silence_warning_s",
            format!("{} is out of range", self.mqtt.silence_warning_s),
        );
        check(
            (1..=MAX_BROKER_BACKLOG_MB).contains(&self.mqtt.broker_backlog_mb),
            "mqtt.broker_backlog_mb",
            format!("{} is out of range", self.mqtt.broker_backlog_mb),
        );
        check(self.storage.channel_capacity > 0, "storage.channel_capacity", "must be at least 1".into());
        for (name, table) in &self.storage.tables {
            check(
                ingest::wire::valid_table_name(name),
                "storage.tables",
                format!("{name:?} is not a valid table name"),
            );
            check(
                table.fields.len() <= bucketer::schema::MAX_FIELDS_PER_TABLE,
                "storage.tables",
                format!(
                    "table {name:?}: {} fields; a table takes at most {}",
                    table.fields.len(),
                    bucketer::schema::MAX_FIELDS_PER_TABLE
                ),
            );
            match table.checked() {
                Ok(spec) => {
                    let every_hour = spec.rollup_retention.check_rolls_up_every_hour(self.rollup.allowed_lateness_ms);
                    if let Err(problem) = every_hour {
                        check(false, "storage.tables", format!("table {name:?}: {problem}"));
                    }
                }
                Err(problems) => {
                    for problem in problems {
                        check(false, "storage.tables", format!("table {name:?}: {problem}"));
                    }
                }
            }
        }
        check(self.storage.max_batch_readings > 0, "storage.max_batch_readings", "must be at least 1".into());
        check(self.storage.bucket_max_readings > 0, "storage.bucket_max_readings", "must be at least 1".into());
        check(
            self.storage.write_buffer_mb <= 65_536,
            "storage.write_buffer_mb",
            format!("must be at most 65536 (64 GiB), got {}", self.storage.write_buffer_mb),
        );
        check(
            (1..=MAX_SUBCOMPACTIONS).contains(&self.storage.subcompactions),
            "storage.subcompactions",
            format!("must be from 1 to {MAX_SUBCOMPACTIONS}, got {}", self.storage.subcompactions),
        );
        check(
            valid_background_jobs(self.storage.background_jobs),
            "storage.background_jobs",
            format!("{}, got {}", background_jobs_rule(), self.storage.background_jobs),
        );
        let url = &self.storage.archive_url;
        check(
            url.is_empty() || url.strip_prefix("s3://").is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/')),
            "storage.archive_url",
            format!("{url:?} is not \"s3://bucket\" or \"s3://bucket/prefix\""),
        );
        let endpoint = &self.storage.archive_s3_endpoint;
        check(
            endpoint.is_empty() || endpoint.starts_with("http://") || endpoint.starts_with("https://"),
            "storage.archive_s3_endpoint",
            format!("{endpoint:?} is not an http:// or https:// URL"),
        );
        // The upper bound keeps the timer's deadline arithmetic far from overflow.
        check(
            (1..=MAX_RETENTION_INTERVAL_S).contains(&self.storage.retention_interval_s),
            "storage.retention_interval_s",
            format!("{} is out of range", self.storage.retention_interval_s),
        );
        if let Err(e) = self.storage.dead_letter_retention_ms() {
            check(false, "storage.dead_letter_retention", e);
        }
        if let Err(e) = self.storage.archive_late_wait_ms() {
            check(false, "storage.archive_late_wait", e);
        }
        check(
            (1..=MAX_ROLLUP_INTERVAL_MS).contains(&self.rollup.interval_ms),
            "rollup.interval_ms",
            format!("{} is out of range", self.rollup.interval_ms),
        );
        check(
            self.rollup.allowed_lateness_ms <= MAX_ALLOWED_LATENESS_MS,
            "rollup.allowed_lateness_ms",
            format!("{} is out of range", self.rollup.allowed_lateness_ms),
        );
        check(!self.lineproto.device_tag.is_empty(), "lineproto.device_tag", "must not be empty".into());
        check(!self.kafka.brokers.trim().is_empty(), "kafka.brokers", "must not be empty".into());
        check(!self.kafka.group_id.is_empty(), "kafka.group_id", "must not be empty".into());
        check(
            !self.kafka.topics.is_empty() && self.kafka.topics.iter().all(|t| !t.is_empty()),
            "kafka.topics",
            "must name at least one topic, none empty".into(),
        );
        // librdkafka refuses the whole subscription for one bad pattern or a topic named twice,
        // saying only "Invalid argument or configuration" (QA53 F1: check-config said ok).
        for pattern in self.kafka.topics.iter().filter(|t| t.starts_with('^')) {
            if let Some(problem) = topic_pattern_problem(pattern) {
                check(
                    false,
                    "kafka.topics",
                    format!("{pattern:?} is not a regular expression librdkafka takes: {problem}"),
                );
            }
        }
        let mut twice: Vec<&String> = self
            .kafka
            .topics
            .iter()
            .enumerate()
            .filter(|(i, t)| self.kafka.topics[..*i].contains(t))
            .map(|(_, t)| t)
            .collect();
        twice.sort_unstable();
        twice.dedup();
        check(twice.is_empty(), "kafka.topics", format!("names {twice:?} more than once"));
        let bad_tables: Vec<&String> =
            self.kafka.topic_tables.values().filter(|t| !ingest::wire::valid_table_name(t)).collect();
        check(bad_tables.is_empty(), "kafka.topic_tables", format!("{bad_tables:?} are not valid table names"));
        // A topic mapped but not consumed is a typo of one that is (its readings would go to
        // the topic's own name or `default_table`). A regular expression (`^…`, librdkafka's
        // form) can consume any topic: then no key is checked.
        let patterns = self.kafka.topics.iter().any(|t| t.starts_with('^'));
        let unconsumed: Vec<&String> =
            self.kafka.topic_tables.keys().filter(|t| !patterns && !self.kafka.topics.contains(t)).collect();
        check(
            unconsumed.is_empty(),
            "kafka.topic_tables",
            format!(
                "maps {unconsumed:?}, not in kafka.topics {:?}: name the topics consumed, or consume these",
                self.kafka.topics
            ),
        );
        let lp = self.kafka.format == ingest::kafka::KafkaFormat::Lp;
        for (key, unused) in [
            ("kafka.topic_tables", !self.kafka.topic_tables.is_empty()),
            ("kafka.default_table", !self.kafka.default_table.is_empty()),
        ] {
            check(
                !(lp && unused),
                key,
                "is set while kafka.format is \"lp\": a line's measurement names its table (JSON only)".into(),
            );
        }
        let default_table = &self.kafka.default_table;
        check(
            default_table.is_empty() || ingest::wire::valid_table_name(default_table),
            "kafka.default_table",
            format!("{default_table:?} is not a valid table name"),
        );
        check(
            (100..=3_600_000).contains(&self.http.read_timeout_ms),
            "http.read_timeout_ms",
            format!("{} is out of range", self.http.read_timeout_ms),
        );
        for (key, v) in [
            ("kafka.session_timeout_ms", u64::from(self.kafka.session_timeout_ms)),
            ("kafka.revoke_drain_timeout_ms", self.kafka.revoke_drain_timeout_ms),
            ("kafka.commit_interval_ms", self.kafka.commit_interval_ms),
        ] {
            let min = if key == "kafka.session_timeout_ms" { 1000 } else { 1 };
            check((min..=3_600_000).contains(&v), key, format!("{v} is out of range"));
        }
        for (key, message) in self.kafka.security_problems() {
            check(false, key, message);
        }
        for (key, message) in self.mqtt.external_broker_problems() {
            check(false, key, message);
        }
        for (key, message) in self.http.tls().err().unwrap_or_default() {
            check(false, key, message);
        }
        check(
            (1..=MAX_QUERY_RANGE_MS).contains(&self.query.max_range_ms),
            "query.max_range_ms",
            format!("{} is out of range", self.query.max_range_ms),
        );
        check(self.query.max_devices_per_request > 0, "query.max_devices_per_request", "must be at least 1".into());
        check(self.query.max_page_rows > 0, "query.max_page_rows", "must be at least 1".into());
        check(self.query.max_response_bytes >= 1024, "query.max_response_bytes", "must be at least 1024".into());
        if let Some(token) = &self.auth.admin_token {
            check(
                token.chars().count() >= MIN_ADMIN_TOKEN_LEN && !token.chars().any(char::is_whitespace),
                "auth.admin_token",
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} characters without spaces"),
            );
        }
        if !self.auth.enabled {
            check(
                self.listens_on_loopback_only(),
                "auth.enabled",
                format!(
                    "auth can be off only for a local demo, with http.listen and mqtt.listen on loopback (they are {} \
                     and {})",
                    self.http.listen, self.mqtt.listen
                ),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const EXAMPLE: &str = include_str!("../config/hourglass.example.toml");

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    }

    fn from_text(text: &str, vars: &[(&str, &str)]) -> Result<Config, Vec<Problem>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hourglass.toml");
        std::fs::write(&path, text).unwrap();
        Config::check(Some(&path), env(vars))
    }

    /// Values that read but cannot work are refused with what is wrong, in the API's words.
    #[test]
    fn unworkable_values_are_refused_in_plain_words() {
        let messages = |text: &str| -> Vec<(String, String)> {
            from_text(text, &[]).expect_err("refused").into_iter().map(|p| (p.key, p.message)).collect()
        };
        let max = i64::MAX;
        assert_eq!(
            messages("[storage]\ntables = { t = { hot_retention = -5 }, u = { cold_retention = 1.5 } }\n"),
            [
                (
                    "storage.tables".into(),
                    format!("table \"t\": hot_retention -5 is not a whole number of milliseconds from 1 to {max}")
                ),
                (
                    "storage.tables".into(),
                    format!("table \"u\": cold_retention 1.5 is not a whole number of milliseconds from 1 to {max}")
                ),
            ]
        );
        let dotted = messages("[storage]\ntables = { fleet.diagnostics = { strict = true } }\n");
        assert_eq!(dotted.len(), 1);
        assert!(
            dotted[0].1.starts_with("table \"fleet\": unknown field `diagnostics`")
                && dotted[0].1.ends_with(" (a table name with a dot is quoted: \"fleet.diagnostics\" = { … })"),
            "{dotted:?}"
        );
        assert_eq!(
            messages("data_dir = \"\"\n[mqtt]\nenabled = false\nurl = \"mqtt://h:1883\"\n"),
            [
                ("data_dir".into(), "must not be empty".into()),
                (
                    "mqtt.url".into(),
                    "is set while mqtt.enabled is false: enable MQTT to consume from that broker, or unset it".into()
                ),
            ]
        );
        assert!(from_text("[mqtt]\nenabled = false\n", &[]).is_ok());
    }

    /// `section.key` of every leaf of a TOML table.
    fn leaf_keys(table: &toml::Table) -> Vec<String> {
        let mut keys = Vec::new();
        for (name, value) in table {
            match value {
                toml::Value::Table(t) => keys.extend(t.keys().map(|k| format!("{name}.{k}"))),
                _ => keys.push(name.clone()),
            }
        }
        keys.sort();
        keys
    }

    fn key_names() -> Vec<String> {
        let mut names: Vec<String> = KEYS.iter().map(|k| k.name.to_string()).collect();
        names.sort();
        names
    }

    /// A misspelt key is hinted the key one or two letters away (QA46 F6: `archive_dirr` was
    /// hinted `storage.archive`, the shorter key it starts with); a longer or shorter name the
    /// key it extends or cuts; none near, the section's keys.
    #[test]
    fn an_unknown_key_is_hinted_the_nearest_in_spelling() {
        let hint = |name: &str| unknown_hint(name, |k| format!("`{k}`"));
        assert_eq!(hint("storage.archive_dirr"), "did you mean `storage.archive_dir`?");
        assert_eq!(hint("storage.archive_late_waitt"), "did you mean `storage.archive_late_wait`?");
        assert_eq!(hint("storage.archiv"), "did you mean `storage.archive`?");
        assert_eq!(hint("mqtt.broker_backlog_m"), "did you mean `mqtt.broker_backlog_mb`?");
        assert_eq!(hint("mqtt.listen_port"), "did you mean `mqtt.listen`?");
        assert_eq!(hint("mqtt.clientid"), "did you mean `mqtt.client_id`?");
        assert!(hint("http.zzzzzzzz").starts_with("known keys here: `http."), "{}", hint("http.zzzzzzzz"));
    }

    #[test]
    fn keys_list_every_field_of_the_structs() {
        let mut full = Config::default();
        full.mqtt.url = Some("mqtt://broker:1883".into());
        full.auth.admin_token = Some("0123456789abcdef".into());
        let toml::Value::Table(t) = toml::Value::try_from(&full).unwrap() else { panic!("a table") };
        assert_eq!(leaf_keys(&t), key_names());
    }

    #[test]
    fn the_example_file_is_the_defaults_and_names_every_key() {
        assert_eq!(from_text(EXAMPLE, &[]), Ok(Config::default()));
        let table: toml::Table = toml::from_str(EXAMPLE).unwrap();
        let mut documented = leaf_keys(&table);
        // `mqtt.url` has no default value, so the example shows it commented out.
        assert!(EXAMPLE.lines().any(|l| l.starts_with("# url = \"mqtt://")), "mqtt.url is documented");
        documented.push("mqtt.url".into());
        // Nor has `auth.admin_token`.
        assert!(EXAMPLE.lines().any(|l| l.starts_with("# admin_token = ")), "auth.admin_token is documented");
        documented.push("auth.admin_token".into());
        documented.sort();
        assert_eq!(documented, key_names());
        // Every key's variable is in the header.
        for k in KEYS {
            assert!(EXAMPLE.contains(&env_var(k.name)), "{} is documented", env_var(k.name));
        }
    }

    #[test]
    fn every_key_has_a_variable() {
        let mut full = Config::default();
        full.mqtt.url = Some("mqtt://broker:1883".into());
        full.auth.admin_token = Some("0123456789abcdef".into());
        let toml::Value::Table(t) = toml::Value::try_from(&full).unwrap() else { panic!("a table") };
        for k in KEYS {
            let (section, name) = k.name.split_once('.').map_or((None, k.name), |(s, n)| (Some(s), n));
            let v = match section {
                Some(s) => &t[s][name],
                None => &t[name],
            };
            let raw = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let got = Config::load_with(None, env(&[(&env_var(k.name), &raw)]), |_| {});
            let expected = match k.name {
                "mqtt.url" => Config { mqtt: full.mqtt.clone(), ..Config::default() },
                "auth.admin_token" => Config { auth: full.auth.clone(), ..Config::default() },
                _ => Config::default(),
            };
            assert_eq!(got, Ok(expected), "{}", k.name);
        }
        assert_eq!(env_var("mqtt.max_payload_bytes"), "HOURGLASS_MQTT__MAX_PAYLOAD_BYTES");
        assert_eq!(env_var("data_dir"), "HOURGLASS_DATA_DIR");
    }

    #[test]
    fn storage_compaction_is_read_and_a_wrong_name_is_refused() {
        assert_eq!(Config::default().storage.compaction, Compaction::Leveled);
        let cfg = Config::check(None, env(&[("HOURGLASS_STORAGE__COMPACTION", "universal")])).expect("valid");
        assert_eq!(cfg.storage.compaction, Compaction::Universal);
        assert_eq!(bucketer::Compaction::from(cfg.storage.compaction), bucketer::Compaction::Universal);
        let cfg = from_text("[storage]\ncompaction = \"leveled\"\n", &[]).expect("valid");
        assert_eq!(bucketer::Compaction::from(cfg.storage.compaction), bucketer::Compaction::Leveled);
        let problems = from_text("[storage]\ncompaction = \"tiered\"\n", &[]).expect_err("refused");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "storage.compaction");
        assert_eq!(problems[0].message, "unknown variant `tiered`, expected `leveled` or `universal`");
        assert_eq!(problems[0].hint, "expected \"leveled\" or \"universal\"; the default is \"leveled\"");
    }

    #[test]
    fn storage_subcompactions_are_read_and_bounded() {
        assert_eq!(Config::default().storage.subcompactions, 1);
        let cfg = Config::check(None, env(&[("HOURGLASS_STORAGE__SUBCOMPACTIONS", "2")])).expect("valid");
        assert_eq!(cfg.storage.subcompactions, 2);
        let cfg = from_text("[storage]\nsubcompactions = 64\n", &[]).expect("valid");
        assert_eq!(cfg.storage.subcompactions, 64);
        for (text, message) in [("0", "must be from 1 to 64, got 0"), ("65", "must be from 1 to 64, got 65")] {
            let problems = from_text(&format!("[storage]\nsubcompactions = {text}\n"), &[]).expect_err("refused");
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].key, "storage.subcompactions");
            assert_eq!(problems[0].message, message);
        }
    }

    #[test]
    fn storage_background_jobs_are_read_and_bounded() {
        assert_eq!(Config::default().storage.background_jobs, 0);
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let by_default = i32::try_from(cores.clamp(2, 16)).unwrap_or(i32::MAX);
        assert_eq!(background_jobs(0), by_default);
        let cfg = Config::check(None, env(&[("HOURGLASS_STORAGE__BACKGROUND_JOBS", "6")])).expect("valid");
        assert_eq!(cfg.storage.background_jobs, 6);
        assert_eq!(background_jobs(cfg.storage.background_jobs), 6);
        for jobs in [2, 64] {
            let cfg = from_text(&format!("[storage]\nbackground_jobs = {jobs}\n"), &[]).expect("valid");
            assert_eq!(background_jobs(cfg.storage.background_jobs), jobs);
        }
        for (text, message) in [
            ("1", "must be 0 (one a core) or from 2 to 64, got 1"),
            ("65", "must be 0 (one a core) or from 2 to 64, got 65"),
        ] {
            let problems = from_text(&format!("[storage]\nbackground_jobs = {text}\n"), &[]).expect_err("refused");
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].key, "storage.background_jobs");
            assert_eq!(problems[0].message, message);
        }
    }

    #[test]
    fn auth_can_be_off_only_on_loopback_and_admin_tokens_are_long() {
        let off = [("HOURGLASS_AUTH__ENABLED", "false")];
        assert!(Config::check(None, env(&off)).is_ok());
        let public = [("HOURGLASS_AUTH__ENABLED", "false"), ("HOURGLASS_HTTP__LISTEN", "0.0.0.0:8080")];
        let problems = Config::check(None, env(&public)).expect_err("refused");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "auth.enabled (from HOURGLASS_AUTH__ENABLED)");
        assert_eq!(
            problems[0].message,
            "auth can be off only for a local demo, with http.listen and mqtt.listen on loopback (they are 0.0.0.0:8080 \
             and 127.0.0.1:1883)"
        );
        let short = [("HOURGLASS_AUTH__ADMIN_TOKEN", "short")];
        let problems = Config::check(None, env(&short)).expect_err("refused");
        // Found once the settings were merged, and named with the variable that set it.
        assert_eq!(problems[0].key, "auth.admin_token (from HOURGLASS_AUTH__ADMIN_TOKEN)");
        assert_eq!(problems[0].message, "must be at least 16 characters without spaces");
        let limits = [("HOURGLASS_QUERY__MAX_PAGE_ROWS", "0"), ("HOURGLASS_QUERY__MAX_RESPONSE_BYTES", "10")];
        let keys: Vec<String> =
            Config::check(None, env(&limits)).expect_err("refused").into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "query.max_page_rows (from HOURGLASS_QUERY__MAX_PAGE_ROWS)",
                "query.max_response_bytes (from HOURGLASS_QUERY__MAX_RESPONSE_BYTES)"
            ]
        );
    }

    #[test]
    fn variables_override_the_file() {
        let text = "data_dir = \"/from/file\"\n[mqtt]\nmax_payload_bytes = 2048\nclient_id = \"file-id\"\n";
        let cfg = from_text(
            text,
            &[
                ("HOURGLASS_MQTT__MAX_PAYLOAD_BYTES", "4096"),
                ("HOURGLASS_STORAGE__SYNC_WAL", "true"),
                ("HOURGLASS_MQTT__CLIENT_ID", "123"),
                ("HOURGLASS_HTTP__LISTEN", "0.0.0.0:9000"),
                ("HOURGLASS_CONFIG", "ignored: names the file"),
                ("PATH", "/usr/bin"),
            ],
        )
        .unwrap();
        let mut expected = Config { data_dir: "/from/file".into(), ..Config::default() };
        expected.mqtt.max_payload_bytes = 4096;
        expected.mqtt.client_id = "123".into();
        expected.storage.sync_wal = true;
        expected.http.listen = "0.0.0.0:9000".parse().unwrap();
        assert_eq!(cfg, expected);
    }

    /// The embedded broker and the query service on one port clash also when one listens on
    /// every address (0.0.0.0) and the other on one of them; port 0 (any free port) never does.
    #[test]
    fn listeners_on_one_port_are_refused() {
        let clash = |mqtt: &str, http: &str| {
            let mut c = Config::default();
            c.mqtt.listen = mqtt.parse().unwrap();
            c.http.listen = http.parse().unwrap();
            c.validate().err().is_some_and(|p| p.iter().any(|p| p.key == "mqtt.listen"))
        };
        assert!(clash("127.0.0.1:1883", "127.0.0.1:1883"));
        assert!(clash("127.0.0.1:1883", "0.0.0.0:1883"));
        assert!(clash("0.0.0.0:1883", "127.0.0.1:1883"));
        assert!(!clash("127.0.0.1:1883", "127.0.0.2:1883"));
        assert!(!clash("127.0.0.1:1883", "127.0.0.1:8080"));
        assert!(!clash("127.0.0.1:0", "127.0.0.1:0"));
    }

    /// A secret is not shown by a problem: a password or token of another type, a line of bad
    /// TOML holding one, a url's password.
    #[test]
    fn problems_do_not_show_secrets() {
        let all = |text: &str| -> String {
            from_text(text, &[]).expect_err("refused").iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
        };
        let typed = all("[mqtt]\npassword = 987654321\n");
        assert!(
            typed.starts_with("mqtt.password: is not a string (the value is not shown)")
                && !typed.contains("987654321"),
            "{typed}"
        );
        let syntax = all("[mqtt]\nusername = \"u\"\npassword = \"S3cret-inline\n");
        assert!(
            syntax.starts_with("(syntax): TOML parse error at line 3 (not shown: it holds a secret): "),
            "{syntax}"
        );
        assert!(!syntax.contains("S3cret"), "{syntax}");
        let url = all("[mqtt]\nurl = \"mqtts://hg:S3cret@h:8883\"\n");
        assert!(url.contains("\"mqtts://hg:***@h:8883\"") && !url.contains("S3cret"), "{url}");
        // Other syntax problems show their line.
        assert!(all("[http]\nlisten = 8080x\n").contains("listen = 8080x"));
    }

    /// An empty variable unsets a key without a default (a file's `mqtt.url` too), where it was
    /// an error ("MQTT url \"\" has no host"); a quoted empty value is refused with why.
    #[test]
    fn an_empty_variable_unsets_a_key_without_a_default() {
        let text = "[mqtt]\nurl = \"mqtt://broker:1883\"\n";
        let vars = [("HOURGLASS_MQTT__URL", ""), ("HOURGLASS_AUTH__ADMIN_TOKEN", "")];
        assert_eq!(from_text(text, &vars), Ok(Config::default()));
        let problems = from_text("", &[("HOURGLASS_STORAGE__DEAD_LETTER_RETENTION", "\"\"")]).expect_err("quoted");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].message.ends_with(
                " (a variable's value is its text, quotes and all: for an empty value, set the variable to nothing)"
            ),
            "{}",
            problems[0].message
        );
        let cfg = from_text("", &[("HOURGLASS_STORAGE__DEAD_LETTER_RETENTION", "")]).expect("forever");
        assert_eq!(cfg.storage.dead_letter_retention, "");
    }

    /// A structured variable that is not TOML is refused with TOML's reason and where, not as
    /// a string of the wrong type.
    #[test]
    fn a_variable_that_is_not_toml_gets_tomls_reason() {
        let refused = |key: &str, raw: &str| -> (String, String) {
            let p = from_text("", &[(key, raw)]).expect_err("refused").remove(0);
            (p.key, p.message)
        };
        assert_eq!(
            refused("HOURGLASS_STORAGE__TABLES", "{t={strict=yes}}"),
            (
                "storage.tables (from HOURGLASS_STORAGE__TABLES)".to_string(),
                "\"{t={strict=yes}}\" is not a TOML value: invalid string, expected `\"`, `'` at character 12"
                    .to_string()
            )
        );
        assert_eq!(
            refused("HOURGLASS_KAFKA__TOPICS", "[a, b]").1,
            "\"[a, b]\" is not a TOML value: invalid array, expected `]` at character 2"
        );
        // Text that is no list or table keeps the type's words.
        assert_eq!(refused("HOURGLASS_STORAGE__SYNC_WAL", "yes").1, "invalid type: string \"yes\", expected a boolean");
        // TOML of the wrong shape is checked as that value.
        assert_eq!(refused("HOURGLASS_KAFKA__TOPICS", "{a = 1}").1, "invalid type: map, expected a sequence");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "\
data_dir = 7
[http]
listen = \"localhost\"
[mqtt]
max_payload_bytes = 0
listen_port = 1883
url = \"mqtt://broker:port\"
[storage]
channel_capacity = -1
[metrics]
enabled = true
";
        let problems = from_text(
            text,
            &[
                ("HOURGLASS_STORAGE__MAX_BATCH_READINGS", "many"),
                ("HOURGLASS_MQTT_CLIENT_ID", "x"),
                ("HOURGLASS_MQTT__TOPIC_PREFIX", "a/b"),
            ],
        )
        .expect_err("invalid");
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "data_dir",
                "http.listen",
                "metrics",
                "mqtt.listen_port",
                "storage.channel_capacity",
                "HOURGLASS_MQTT_CLIENT_ID",
                "storage.max_batch_readings (from HOURGLASS_STORAGE__MAX_BATCH_READINGS)",
                "mqtt.max_payload_bytes",
                "mqtt.topic_prefix (from HOURGLASS_MQTT__TOPIC_PREFIX)",
                "mqtt.url",
            ],
            "{problems:#?}"
        );
        let by_key = |k: &str| problems.iter().find(|p| p.key == k).unwrap();
        assert_eq!(by_key("data_dir").message, "invalid type: integer `7`, expected path string");
        assert_eq!(by_key("http.listen").message, "invalid socket address syntax");
        assert_eq!(by_key("storage.channel_capacity").message, "invalid value: integer `-1`, expected usize");
        assert_eq!(
            by_key("storage.max_batch_readings (from HOURGLASS_STORAGE__MAX_BATCH_READINGS)").message,
            "invalid type: string \"many\", expected usize"
        );
        assert_eq!(
            by_key("http.listen").hint,
            "expected an address like \"0.0.0.0:8080\"; the default is \"127.0.0.1:8080\""
        );
        assert_eq!(by_key("mqtt.listen_port").hint, "did you mean `mqtt.listen`?");
        assert_eq!(by_key("HOURGLASS_MQTT_CLIENT_ID").hint, "did you mean `HOURGLASS_MQTT__CLIENT_ID`?");
        assert_eq!(
            by_key("metrics").hint,
            "known keys: `data_dir`, `http.listen`, `http.tls_cert_file`, `http.tls_key_file`, `http.read_timeout_ms`, `mqtt.enabled`, `mqtt.url`, `mqtt.username`, `mqtt.password`, \
             `mqtt.ca_file`, `mqtt.cert_file`, `mqtt.key_file`, `mqtt.silence_warning_s`, `mqtt.listen`, \
             `mqtt.client_id`, \
             `mqtt.topic_prefix`, `mqtt.subscriptions`, `mqtt.max_payload_bytes`, `mqtt.broker_max_inflight`, \
             `mqtt.broker_backlog_mb`, `storage.sync_wal`, \
             `storage.channel_capacity`, `storage.max_batch_readings`, `storage.retention_interval_s`, \
             `storage.dead_letter_retention`, `storage.bucket_max_readings`, `storage.write_buffer_mb`, `storage.compaction`, `storage.subcompactions`, `storage.background_jobs`, `storage.archive`, `storage.archive_dir`, `storage.archive_url`, \
             `storage.archive_s3_endpoint`, `storage.archive_late_wait`, `storage.tables`, `rollup.interval_ms`, `rollup.allowed_lateness_ms`, `lineproto.precision`, \
             `lineproto.device_tag`, `kafka.enabled`, `kafka.brokers`, `kafka.group_id`, `kafka.topics`, `kafka.format`, \
             `kafka.topic_tables`, `kafka.default_table`, `kafka.auto_offset_reset`, `kafka.session_timeout_ms`, \
             `kafka.revoke_drain_timeout_ms`, `kafka.commit_interval_ms`, `kafka.security_protocol`, \
             `kafka.ca_file`, `kafka.cert_file`, `kafka.key_file`, `kafka.sasl_mechanism`, `kafka.username`, \
             `kafka.password`, `query.max_range_ms`, \
             `query.max_devices_per_request`, `query.max_page_rows`, `query.max_response_bytes`, `auth.enabled`, \
             `auth.admin_token`"
        );
        assert_eq!(
            by_key("mqtt.max_payload_bytes").hint,
            "expected a whole number of bytes, at least 1; the default is 1048576"
        );
        assert_eq!(
            by_key("storage.max_batch_readings (from HOURGLASS_STORAGE__MAX_BATCH_READINGS)").hint,
            "expected a whole number, at least 1; the default is 50000"
        );
        assert_eq!(
            by_key("mqtt.url").message,
            "MQTT url \"mqtt://broker:port\": port \"port\" is not a number from 1 to 65535"
        );
        assert_eq!(
            by_key("mqtt.topic_prefix (from HOURGLASS_MQTT__TOPIC_PREFIX)").message,
            "\"a/b\" is not a valid topic level"
        );
    }

    #[test]
    fn unknown_keys_and_bad_syntax_are_errors() {
        let problems = from_text("[mqtt]\nlisten_port = 3\n", &[]).expect_err("unknown key");
        assert_eq!(problems, [Problem::new("mqtt.listen_port", "unknown key", "did you mean `mqtt.listen`?")]);
        let problems = from_text("[mqtt\n", &[]).expect_err("syntax");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "(syntax)");
        let problems = from_text("mqtt = 5\n", &[]).expect_err("not a table");
        assert_eq!(
            problems,
            [Problem::new(
                "mqtt",
                "must be a table `[mqtt]`, found integer",
                "write the keys of `mqtt` under a `[mqtt]` header"
            )]
        );
        let missing =
            Config::load_with(Some(Path::new("/nonexistent/hourglass.toml")), env(&[]), |_| {}).expect_err("missing");
        assert_eq!(missing[0].key, "(file)");
    }

    #[test]
    fn validate_reports_every_problem() {
        let mut c = Config::default();
        c.mqtt.max_payload_bytes = 0;
        c.storage.channel_capacity = 0;
        c.storage.retention_interval_s = 0;
        c.mqtt.url = Some("mqtt://h:x".into());
        let problems = c.validate().expect_err("invalid");
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["mqtt.max_payload_bytes", "storage.channel_capacity", "storage.retention_interval_s", "mqtt.url"]
        );
        let interval = &problems[2];
        assert_eq!(interval.message, "0 is out of range");
        assert_eq!(
            interval.hint,
            "expected a whole number of seconds from 1 to 31536000 (365 days); the default is 300"
        );
        c.storage.retention_interval_s = 31_536_001;
        assert_eq!(c.validate().expect_err("too long")[2].message, "31536001 is out of range");
        c = Config::default();
        c.storage.retention_interval_s = 31_536_000;
        assert_eq!(c.validate(), Ok(()));
        c.rollup.interval_ms = 0;
        c.rollup.allowed_lateness_ms = 31_536_000_001;
        let problems = c.validate().expect_err("invalid");
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["rollup.interval_ms", "rollup.allowed_lateness_ms"]);
        assert_eq!(
            problems[1].hint,
            "expected a whole number of milliseconds from 0 to 31536000000 (365 days); the default is 300000"
        );
        c.rollup.interval_ms = 3_600_000;
        c.rollup.allowed_lateness_ms = 31_536_000_000;
        assert_eq!(c.validate(), Ok(()));
        c.http.read_timeout_ms = 99;
        let problems = c.validate().expect_err("too short");
        assert_eq!(
            (problems[0].key.as_str(), problems[0].message.as_str()),
            ("http.read_timeout_ms", "99 is out of range")
        );
        assert_eq!(
            problems[0].hint,
            "expected a whole number of milliseconds from 100 to 3600000; the default is 30000"
        );
        c.http.read_timeout_ms = 3_600_001;
        assert_eq!(c.validate().expect_err("too long")[0].message, "3600001 is out of range");
        c.http.read_timeout_ms = 100;
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(Config::default().validate(), Ok(()));
    }

    /// `storage.dead_letter_retention`: 7 days unless set, `""` for forever, from the file or its
    /// variable; anything but a duration is a problem of that key naming the value.
    #[test]
    fn dead_letter_retention_is_read_and_checked() {
        assert_eq!(Config::default().storage.dead_letter_retention_ms(), Ok(Some(7 * 86_400_000)));
        let cfg = from_text("[storage]\ndead_letter_retention = \"90m\"\n", &[]).expect("valid");
        assert_eq!(cfg.storage.dead_letter_retention_ms(), Ok(Some(5_400_000)));
        let cfg = from_text("", &[("HOURGLASS_STORAGE__DEAD_LETTER_RETENTION", "")]).expect("valid");
        assert_eq!(cfg.storage.dead_letter_retention_ms(), Ok(None));
        for bad in ["7", "0d", "-1d", "a week"] {
            let problems = from_text(&format!("[storage]\ndead_letter_retention = {bad:?}\n"), &[]).expect_err(bad);
            assert_eq!(
                problems,
                [Problem::new(
                    "storage.dead_letter_retention",
                    format!("{bad:?} is not a duration such as \"12h\" or \"7d\", or \"\" for forever"),
                    "expected a duration such as \"7d\" or \"12h\", or \"\" for forever; the default is \"7d\""
                )],
                "{bad}"
            );
        }
    }

    /// `storage.archive_late_wait`: a day unless set, `"0"` for the next run, from the file or
    /// its variable, into the archive's settings; anything else is a problem of that key.
    #[test]
    fn archive_late_wait_is_read_and_checked() {
        let wait = |cfg: &Config| cfg.archive().map(|a| a.late_rewrite_wait.as_millis());
        assert_eq!(wait(&Config::default()), Some(86_400_000));
        let cfg = from_text("[storage]\narchive_late_wait = \"90m\"\n", &[]).expect("valid");
        assert_eq!(wait(&cfg), Some(5_400_000));
        let cfg = from_text("", &[("HOURGLASS_STORAGE__ARCHIVE_LATE_WAIT", "0")]).expect("valid");
        assert_eq!(wait(&cfg), Some(0));
        for bad in ["", "7", "0d", "-1d", "a day"] {
            let problems = from_text(&format!("[storage]\narchive_late_wait = {bad:?}\n"), &[]).expect_err(bad);
            assert_eq!(
                problems,
                [Problem::new(
                    "storage.archive_late_wait",
                    format!("{bad:?} is not a duration such as \"1d\" or \"6h\", or \"0\" for the next run"),
                    "expected a duration such as \"1d\" or \"6h\", or \"0\" for the next run; the default is \"1d\""
                )],
                "{bad}"
            );
        }
    }

    /// `mqtt.subscriptions` is read from the file and from its variable (a TOML list), and a
    /// list the consumer would read a message twice from is a problem of that key.
    #[test]
    fn mqtt_subscriptions_are_read_and_checked() {
        let text = "[mqtt]\nsubscriptions = [\"hourglass/a/#\", \"hourglass/b\"]\n";
        let cfg = from_text(text, &[]).expect("valid");
        assert_eq!(cfg.mqtt.subscriptions, ["hourglass/a/#", "hourglass/b"]);
        let cfg =
            Config::check(None, env(&[("HOURGLASS_MQTT__SUBSCRIPTIONS", r#"["hourglass/x/#"]"#)])).expect("valid");
        assert_eq!(cfg.mqtt.subscriptions, ["hourglass/x/#"]);

        let text = "[mqtt]\ntopic_prefix = \"hg\"\nsubscriptions = [\"hg/a/#\", \"hg/+/b\"]\n";
        let problems = from_text(text, &[]).expect_err("overlapping");
        assert_eq!(
            problems,
            [Problem::new(
                "mqtt.subscriptions",
                r#""hg/a/#" and "hg/+/b" overlap: a message on a topic both match would be taken twice"#,
                "expected a list of topic filters under the topic prefix that share no topic, like \
                 [\"hourglass/fleet/#\"]; the default is []"
            )]
        );
        let problems = from_text("[mqtt]\nsubscriptions = [\"hourglass/a/#\"]\ntopic_prefix = \"hg\"\n", &[])
            .expect_err("outside the prefix");
        assert_eq!(problems[0].message, r#""hourglass/a/#" is not under the topic prefix: it must start with "hg/""#);
    }

    #[test]
    fn kafka_and_line_protocol_settings_are_read_and_checked() {
        let text = "\
[lineproto]
precision = \"ms\"
device_tag = \"host\"
[kafka]
enabled = true
topics = [\"a\", \"b\"]
format = \"lp\"
auto_offset_reset = \"latest\"
";
        let cfg = from_text(text, &[("HOURGLASS_KAFKA__GROUP_ID", "g7")]).expect("valid");
        assert_eq!(cfg.lineproto.precision, ingest::lineproto::Precision::Milliseconds);
        assert_eq!(cfg.lineproto.device_tag, "host");
        assert!(cfg.kafka.enabled);
        assert_eq!(cfg.kafka.topics, ["a", "b"]);
        assert_eq!(cfg.kafka.format, ingest::kafka::KafkaFormat::Lp);
        assert_eq!(cfg.kafka.auto_offset_reset, ingest::kafka::OffsetReset::Latest);
        assert_eq!(cfg.kafka.group_id, "g7");

        // JSON's tables: of the topics consumed, and not with lp.
        let json =
            "[kafka]\ntopics = [\"a\", \"b\"]\ntopic_tables = { a = \"fleet.a\" }\ndefault_table = \"fleet.x\"\n";
        let cfg = from_text(json, &[]).expect("valid");
        assert_eq!(cfg.kafka.topic_tables.get("a").map(String::as_str), Some("fleet.a"));
        assert_eq!(cfg.kafka.default_table, "fleet.x");
        let refused = |text: &str, vars: &[(&str, &str)]| -> Vec<(String, String)> {
            from_text(text, vars).expect_err("refused").into_iter().map(|p| (p.key, p.message)).collect()
        };
        assert_eq!(
            refused(json, &[("HOURGLASS_KAFKA__FORMAT", "lp")]),
            [
                (
                    "kafka.topic_tables".to_string(),
                    "is set while kafka.format is \"lp\": a line's measurement names its table (JSON only)".to_string()
                ),
                (
                    "kafka.default_table".to_string(),
                    "is set while kafka.format is \"lp\": a line's measurement names its table (JSON only)".to_string()
                ),
            ]
        );
        assert_eq!(
            refused(json, &[("HOURGLASS_KAFKA__TOPICS", "[\"b\", \"fleet-a\"]")]),
            [(
                "kafka.topic_tables".to_string(),
                "maps [\"a\"], not in kafka.topics [\"b\", \"fleet-a\"]: name the topics consumed, or consume these"
                    .to_string()
            )]
        );
        // A pattern can consume any topic.
        from_text(json, &[("HOURGLASS_KAFKA__TOPICS", "[\"^fleet-.*\"]")]).expect("a pattern");
        // A pattern librdkafka cannot compile, and a topic twice: each refused by librdkafka's
        // subscribe with "Invalid argument or configuration" alone (QA53 F1).
        assert_eq!(
            refused("[kafka]\ntopics = [\"^[a\", \"b\", \"^(x|y)+$\", \"b\", \"b\"]\n", &[]),
            [
                (
                    "kafka.topics".to_string(),
                    "\"^[a\" is not a regular expression librdkafka takes: Unmatched [, [^, [:, [., or [=".to_string()
                ),
                ("kafka.topics".to_string(), "names [\"b\"] more than once".to_string()),
            ]
        );

        let mut c = Config::default();
        c.kafka.topics.clear();
        c.kafka.topic_tables.insert("a".into(), "bad table".into());
        c.kafka.default_table = "also bad!".into();
        c.kafka.session_timeout_ms = 10;
        c.lineproto.device_tag.clear();
        let problems = c.validate().expect_err("invalid");
        let keys: Vec<(&str, &str)> = problems.iter().map(|p| (p.key.as_str(), p.message.as_str())).collect();
        assert_eq!(
            keys[..5],
            [
                ("lineproto.device_tag", keys[0].1),
                ("kafka.topics", "must name at least one topic, none empty"),
                ("kafka.topic_tables", "[\"bad table\"] are not valid table names"),
                (
                    "kafka.topic_tables",
                    "maps [\"a\"], not in kafka.topics []: name the topics consumed, or consume these"
                ),
                ("kafka.default_table", "\"also bad!\" is not a valid table name"),
            ]
        );
        assert_eq!((keys.len(), keys[5].0), (6, "kafka.session_timeout_ms"));

        let text = "[storage]\ntables = { \"fleet.diag\" = { partition = \"hour\", hot_retention = \"30d\", \
                    cold_retention = \"400d\", hour_rollup_retention = \"90d\", day_rollup_retention = \"2000d\", \
                    strict = true, fields = { status = \"i64\", driver = \"string\" } }, plain = {} }\n";
        let cfg = from_text(text, &[]).expect("valid");
        let spec = cfg.storage.tables["fleet.diag"].spec().expect("valid");
        assert_eq!(
            spec,
            bucketer::TableSpec {
                partition: model::PartitionSize::Hour,
                hot_retention_ms: Some(30 * model::DAY_MS as u64),
                cold_retention_ms: Some(400 * model::DAY_MS as u64),
                rollup_retention: bucketer::RollupRetention {
                    hour_ms: Some(90 * model::DAY_MS as u64),
                    day_ms: Some(2000 * model::DAY_MS as u64),
                },
                strict: true,
                fields: vec![("driver".into(), model::FieldType::Str), ("status".into(), model::FieldType::I64)],
            }
        );
        assert_eq!(cfg.storage.tables["plain"].spec(), Ok(bucketer::TableSpec::default()));
        let bad =
            "[storage]\ntables = { \"bad name\" = {}, t = { partition = \"week\" }, u = { fields = { x = \"int\" } }, \
                   v = { hot_retention = \"30d\", cold_retention = \"10d\" }, w = { day_rollup_retention = \"30d\" }, \
                   x = { hour_rollup_retention = \"30d\", day_rollup_retention = \"7d\" }, \
                   y = { hour_rollup_retention = \"3 months\" }, \
                   z = { hot_retention = \"1d\", cold_retention = \"1h\", fields = { period = \"f64\", x = \"int\" } }, \
                   zz = { hot_retention = 0 } }\n";
        let problems = from_text(bad, &[]).expect_err("invalid");
        const FIELD_RULE: &str = ingest::wire::FIELD_RULE;
        let got: Vec<(&str, &str)> = problems.iter().map(|p| (p.key.as_str(), p.message.as_str())).collect();
        assert_eq!(
            got,
            [
                ("storage.tables", "\"bad name\" is not a valid table name"),
                ("storage.tables", "table \"t\": partition \"week\" is not one of \"hour\", \"day\", \"month\""),
                (
                    "storage.tables",
                    "table \"u\": field \"x\" has type \"int\", not one of \"f64\", \"i64\", \"bool\", \"string\""
                ),
                (
                    "storage.tables",
                    "table \"v\": the cold retention must be longer than the hot retention (both count from a \
                     partition's end)"
                ),
                (
                    "storage.tables",
                    "table \"w\": a day roll-up retention needs an hour roll-up retention no longer than it"
                ),
                (
                    "storage.tables",
                    "table \"x\": the day roll-up retention must be at least the hour roll-up retention"
                ),
                (
                    "storage.tables",
                    "table \"y\": hour_rollup_retention \"3 months\" is not a duration such as \"12h\" or \"30d\""
                ),
                // Every problem of a table.
                (
                    "storage.tables",
                    "table \"z\": the cold retention must be longer than the hot retention (both count from a \
                     partition's end)"
                ),
                ("storage.tables", &*format!("table \"z\": field \"period\" is not a valid field name ({FIELD_RULE})")),
                (
                    "storage.tables",
                    "table \"z\": field \"x\" has type \"int\", not one of \"f64\", \"i64\", \"bool\", \"string\""
                ),
                (
                    "storage.tables",
                    "table \"zz\": hot_retention 0 is not a whole number of milliseconds from 1 to 9223372036854775807"
                ),
            ]
        );
        // A value of the wrong type names its table and key; the other tables are still read
        // (and checked: `c`'s partition).
        let text = "[storage.tables.\"plant.a\"]\nstrict = \"yes\"\n[storage.tables.b]\nretentoin = \"1d\"\n\
                    [storage.tables.c]\npartition = \"week\"\n[kafka.topic_tables]\nfleet = 3\nok = \"x.y\"\n";
        let problems = from_text(text, &[("HOURGLASS_KAFKA__TOPICS", r#"["fleet", "ok"]"#)]).expect_err("invalid");
        let got: Vec<(&str, &str)> = problems.iter().map(|p| (p.key.as_str(), p.message.as_str())).collect();
        assert_eq!(
            got,
            [
                ("kafka.topic_tables", "topic \"fleet\": invalid type: integer `3`, expected a string"),
                (
                    "storage.tables",
                    "table \"b\": unknown field `retentoin`, expected one of `partition`, `hot_retention`, \
                     `cold_retention`, `hour_rollup_retention`, `day_rollup_retention`, `strict`, `fields`"
                ),
                ("storage.tables", "table \"plant.a\", key strict: invalid type: string \"yes\", expected a boolean"),
                ("storage.tables", "table \"c\": partition \"week\" is not one of \"hour\", \"day\", \"month\""),
            ]
        );
        // An hour roll-up retention too short for a day's hours to be rolled up, with the
        // configured lateness.
        let short = "[rollup]\nallowed_lateness_ms = 3600000\n[storage.tables.s]\nhour_rollup_retention = \"25h\"\n";
        let problems = from_text(short, &[]).expect_err("too short");
        assert_eq!(
            problems.iter().map(|p| (p.key.as_str(), p.message.as_str())).collect::<Vec<_>>(),
            [(
                "storage.tables",
                "table \"s\": an hour roll-up retention of 25h would expire each day's first hour before its last is \
                 rolled up (a day's roll-up is made from its hours while its first hour is kept, else read again from \
                 all its readings): it must be at least a day and an hour plus \
                 rollup.allowed_lateness_ms (3600000), 93600000 ms; \"2d\" would do"
            )]
        );
        assert!(from_text("[storage.tables.s]\nhour_rollup_retention = \"26h\"\n", &[]).is_ok(), "5 min lateness");
        // Milliseconds as integers, as `POST /v1/tables` takes them.
        let ms = from_text("[storage]\ntables = { t = { hot_retention = 3600000, cold_retention = \"2h\" } }\n", &[])
            .expect("valid");
        let spec = ms.storage.tables["t"].spec().expect("valid");
        assert_eq!((spec.hot_retention_ms, spec.cold_retention_ms), (Some(3_600_000), Some(7_200_000)));
        let bad = from_text("[kafka]\nformat = \"csv\"\n", &[]).expect_err("unknown format");
        assert_eq!(bad[0].key, "kafka.format");
    }

    #[test]
    fn the_archive_settings_map_to_the_store() {
        let local = from_text("data_dir = \"/d\"\n", &[]).expect("defaults");
        let a = local.archive().expect("on by default");
        assert_eq!((a.root, a.object_store), (PathBuf::from("/d/archive"), None));
        let off = from_text("[storage]\narchive = false\n", &[]).expect("off");
        assert!(off.archive().is_none());
        let s3 = from_text(
            "[storage]\narchive_dir = \"/cache\"\narchive_url = \"s3://b/p\"\narchive_s3_endpoint = \"http://127.0.0.1:9000\"\n",
            &[],
        )
        .expect("s3");
        let a = s3.archive().expect("on");
        assert_eq!(a.root, PathBuf::from("/cache"));
        assert_eq!(
            a.object_store,
            Some(bucketer::archive::S3Archive {
                url: "s3://b/p".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: None,
                credentials: None
            })
        );
        let bad = from_text("[storage]\narchive_url = \"b/p\"\narchive_s3_endpoint = \"ftp://x\"\n", &[])
            .expect_err("bad urls");
        let keys: Vec<&str> = bad.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["storage.archive_url", "storage.archive_s3_endpoint"]);
    }
}
