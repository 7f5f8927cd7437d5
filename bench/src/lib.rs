//! The load-test harness: seeded workload generators and drivers that push them through the
//! pipeline, with HdrHistogram reports.
//!
//! - [`fleet`]: a TSBS-style truck fleet (the `readings` table: latitude, longitude, elevation,
//!   velocity, heading, grade, fuel_consumption), generated tick by tick so any device count
//!   streams without holding the fleet's readings in memory.
//! - [`storage`]: the in-process driver (no broker): the storage write path's ceiling.
//! - [`rollups`]: the roll-up stage in process: catch-up speed, lag under sustained ingest,
//!   roll-up query latency.
//! - [`mqtt`]: publishers over real MQTT connections, QoS 0 or 1, open-loop at a set rate or
//!   as fast as the broker acks.
//! - [`kafka`]: a producer of the fleet to a Kafka topic, and a bare consumer that measures
//!   what the broker alone delivers.
//!
//! ```
//! let fleet = bench::fleet::Fleet::new(bench::fleet::FleetSpec { devices: 3, ..Default::default() });
//! let tick = fleet.tick(0);
//! assert_eq!(tick.len(), 3);
//! assert_eq!(tick[0].reading.fields.len(), 7);
//! ```

pub mod fleet;
pub mod kafka;
pub mod mqtt;
pub mod rollups;
pub mod storage;
