//! The ingest stage: consumers that turn broker messages into [`model::IngestBatch`]es.
//!
//! It owns the device payload formats and topic → table mapping ([`wire`]: JSON; [`lineproto`]
//! and [`lpwire`]: InfluxDB line protocol), the broker consumers ([`mqtt`], [`kafka`]) and the
//! intake of line protocol pushed over HTTP ([`http`]). It must not store anything: batches go
//! to the bucketer over a bounded channel, and each carries the [`model::Ack`]s that release its messages upstream once the
//! bucketer has committed them.
//!
//! ```
//! use ingest::wire::{decode_mqtt, WireConfig};
//! let batch = decode_mqtt(&WireConfig::default(), "hourglass/fleet/truck_1", br#"{"ts": 1000, "speed": 3.5}"#, 0);
//! assert_eq!(batch.readings.len(), 1);
//! assert_eq!(batch.readings[0].reading.get_f64("speed"), Some(3.5));
//! ```

pub mod http;
pub mod kafka;
pub mod lineproto;
pub mod lpwire;
pub mod mqtt;
pub mod quiet;
pub mod wire;

pub use model::now_ms;
