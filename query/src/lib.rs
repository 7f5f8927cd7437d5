//! The query service: an HTTP API over the store.
//!
//! [`api`] owns the HTTP contract — paths, parameters, JSON shapes and the one mapping from
//! errors to status codes. Handlers run RocksDB reads on blocking threads so a slow scan never
//! stalls the async workers. [`metrics`] turns the stages' counters and RocksDB's figures into
//! `/metrics`, `/ready` and `/v1/stats`; [`auth`] checks bearer tokens; [`format`](mod@format) encodes
//! answers as JSON, CSV or Arrow; [`openapi`] generates `/openapi.json`; `dashboard` serves the page at `/` (HTML, script and
//! style compiled into the binary, no outside resources); [`write`](mod@write) takes InfluxDB's write
//! API and hands the batches to ingest's HTTP intake. This crate never writes to the store
//! itself.
//!
//! [`server`] serves the router on a listener's connections (plain TCP, or [`tls`]'s), with the
//! read timeout `axum::serve` has not.
//!
//! ```no_run
//! # async fn f(store: std::sync::Arc<bucketer::Store>) -> std::io::Result<()> {
//! let app = query::api::router(query::api::AppState::new(store));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! query::server::serve(listener, app, query::server::DEFAULT_READ_TIMEOUT, std::future::pending()).await;
//! # Ok(())
//! # }
//! ```

pub mod api;
pub mod auth;
mod dashboard;
pub mod format;
pub mod metrics;
pub mod openapi;
pub mod server;
pub mod tls;
pub mod write;
