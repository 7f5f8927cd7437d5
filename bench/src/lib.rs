//! The load-test harness: seeded workload generators, recordings, drivers that push them
//! through the pipeline open-loop, and reports (JSON, Markdown, PNG) with HdrHistogram
//! percentiles.
//!
//! - [`workload`]: the TSBS IoT workload (trucks with tags, `readings` and `diagnostics`,
//!   missing and out-of-order points), streamed for any device count; line protocol export.
//! - [`record`]: the compact, versioned recording file (`hourglass bench record` / `replay`).
//! - [`fleet`]: the older readings-only truck fleet of `hourglass bench storage|mqtt` and the
//!   demo.
//! - [`storage`]: the in-process driver (no broker): the storage write path's ceiling.
//! - [`typed`]: bytes per value of `i64`, `bool` and string fields.
//! - [`rollups`]: the roll-up stage in process: catch-up speed, lag under sustained ingest,
//!   roll-up query latency.
//! - [`kafka`]: a producer of the fleet to a Kafka topic, and a bare consumer that measures
//!   what the broker alone delivers.
//! - [`mqtt`]: publishers over real MQTT connections, QoS 0 or 1 (closed loop, for
//!   `hourglass bench mqtt` and the demo).
//! - [`queries`]: query-service latency over HTTP under ingest (raw device-day, latest of
//!   many devices).
//! - [`run`]: open-loop runs of a workload through a driver (MQTT, in-process), with the
//!   measurements: throughput per second, sampled end-to-end latency, query latency under
//!   load, peak RSS.
//! - [`report`] and [`chart`]: the run's JSON, Markdown and PNG.
//!
//! ```
//! let fleet = bench::fleet::Fleet::new(bench::fleet::FleetSpec { devices: 3, ..Default::default() });
//! let tick = fleet.tick(0);
//! assert_eq!(tick.len(), 3);
//! assert_eq!(tick[0].reading.fields.len(), 7);
//! ```

pub mod archive;
pub mod chart;
pub mod cpu;
pub mod fleet;
pub mod kafka;
pub mod mqtt;
pub mod progress;
pub mod queries;
pub mod record;
pub mod report;
pub mod rollups;
pub mod run;
pub mod storage;
pub mod typed;
pub mod workload;

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or stream could not be read or written.
    #[error("{what}: {cause}")]
    Io {
        /// What was being read or written.
        what: String,
        /// The cause, in the message already (not a `source`, which a report of the error's
        /// chain would print a second time).
        cause: std::io::Error,
    },
    /// A recording is damaged, truncated or of another version.
    #[error("recording: {0}")]
    Format(String),
    /// A workload or run setting is out of range.
    #[error("invalid setting: {0}")]
    Spec(String),
    /// A driver could not deliver.
    #[error("driver: {0}")]
    Driver(String),
    /// The system under test stopped storing what was sent (lost it, or is stuck).
    #[error("stalled: {0}")]
    Stuck(String),
    /// A full scan after the run found other field values than were sent.
    #[error("values: {0}")]
    Values(String),
    /// An interrupt stopped the work.
    #[error("stopped by an interrupt")]
    Stopped,
    /// The chart could not be drawn or written.
    #[error("chart: {0}")]
    Chart(String),
    /// A run's report could not be written as JSON, or a JSON read back is not one.
    #[error("report: {0}")]
    Report(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { what: what.into(), cause: source }
    }
}

/// Result of the harness.
pub type Result<T, E = Error> = std::result::Result<T, E>;
