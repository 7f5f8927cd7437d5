//! `hourglass.toml`: every key, its default, and validation. Library crates take plain structs
//! built from this.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Config {
    /// Directory of the RocksDB database. Default `./hourglass-data`.
    pub(crate) data_dir: PathBuf,
    pub(crate) http: HttpConfig,
    pub(crate) mqtt: MqttSection,
    pub(crate) storage: StorageSection,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("hourglass-data"),
            http: HttpConfig::default(),
            mqtt: MqttSection::default(),
            storage: StorageSection::default(),
        }
    }
}

/// `[http]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct HttpConfig {
    /// Query service address. Default `127.0.0.1:8080`.
    pub(crate) listen: SocketAddr,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig { listen: SocketAddr::from(([127, 0, 0, 1], 8080)) }
    }
}

/// `[mqtt]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct MqttSection {
    /// External broker, `mqtt://host:port`. Unset (default): start the embedded broker.
    pub(crate) url: Option<String>,
    /// Embedded broker address. Default `127.0.0.1:1883`.
    pub(crate) listen: SocketAddr,
    /// Client id of Hourglass's consumer; fixed so the broker keeps its session. Default
    /// `hourglass-ingest`.
    pub(crate) client_id: String,
    /// Topics are `{topic_prefix}/{table}[/{device}]`. Default `hourglass`.
    pub(crate) topic_prefix: String,
    /// Payloads above this many bytes become dead letters. Default 1 MiB.
    pub(crate) max_payload_bytes: usize,
    /// Messages the embedded broker keeps in flight per connection. Default 1000.
    pub(crate) broker_max_inflight: usize,
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            url: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            client_id: "hourglass-ingest".into(),
            topic_prefix: "hourglass".into(),
            max_payload_bytes: 1 << 20,
            broker_max_inflight: 1000,
        }
    }
}

/// `[storage]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct StorageSection {
    /// fsync the WAL on every commit (survives power loss, not only a crash). Default false.
    pub(crate) sync_wal: bool,
    /// Messages queued between ingest and the bucketer (the backpressure bound). Default 1024.
    pub(crate) channel_capacity: usize,
    /// Readings gathered into one WriteBatch at most. Default 50,000.
    pub(crate) max_batch_readings: usize,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection { sync_wal: false, channel_capacity: 1024, max_batch_readings: 50_000 }
    }
}

impl Config {
    /// Reads a config file; a missing `path` gives the defaults.
    pub(crate) fn load(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading config file {}: {e}", path.display()))?;
        let cfg: Config = toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        Ok(cfg)
    }

    /// Every problem at once, each with its key.
    pub(crate) fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.mqtt.max_payload_bytes == 0 {
            problems.push("mqtt.max_payload_bytes: must be at least 1".to_string());
        }
        if !ingest::wire::valid_table_name(&self.mqtt.topic_prefix) {
            problems.push(format!(
                "mqtt.topic_prefix: {:?} is not a valid topic level (letters, digits, `_`, `-`, `.`)",
                self.mqtt.topic_prefix
            ));
        }
        if self.mqtt.client_id.is_empty() {
            problems.push("mqtt.client_id: must not be empty".to_string());
        }
        if self.mqtt.broker_max_inflight == 0 || self.mqtt.broker_max_inflight > u16::MAX as usize {
            problems.push("mqtt.broker_max_inflight: must be from 1 to 65535".to_string());
        }
        if self.storage.channel_capacity == 0 {
            problems.push("storage.channel_capacity: must be at least 1".to_string());
        }
        if self.storage.max_batch_readings == 0 {
            problems.push("storage.max_batch_readings: must be at least 1".to_string());
        }
        if let Some(url) = &self.mqtt.url {
            if let Err(e) = ingest::mqtt::MqttConfig::default().with_url(url) {
                problems.push(format!("mqtt.url: {e}"));
            }
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
    use super::*;

    #[test]
    fn unknown_keys_are_errors() {
        let e = toml::from_str::<Config>("[mqtt]\nlisten_port = 3\n").expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `listen_port`"), "{e}");
    }

    #[test]
    fn validate_reports_every_problem() {
        let mut c = Config::default();
        c.mqtt.max_payload_bytes = 0;
        c.storage.channel_capacity = 0;
        c.mqtt.url = Some("mqtt://h:x".into());
        let problems = c.validate().expect_err("invalid");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("mqtt.max_payload_bytes"));
        assert!(problems[1].starts_with("storage.channel_capacity"));
        assert!(problems[2].starts_with("mqtt.url"));
        assert_eq!(Config::default().validate(), Ok(()));
    }
}
