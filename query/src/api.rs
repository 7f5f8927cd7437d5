//! HTTP contract of the query service.
//!
//! Every route and what it needs ([`routes`] is the list the router is built from, and
//! `/openapi.json` documents each): *open* routes take no token; the others take
//! `Authorization: Bearer <token>` (see [`crate::auth`]) and need *any* valid token, *read* or
//! *write* permission on the table of the path, or an *admin* token.
//!
//! | method + path | needs | answer |
//! |---|---|---|
//! | `GET /` | open | the dashboard page (HTML; its script and style at `/dashboard.js`, `/dashboard.css`) |
//! | `GET /health` | open | `{"status":"ok"}`: liveness, the process answers |
//! | `GET /ready` | open | 200 `{"status":"ready"}` once every ingest source is subscribed and RocksDB accepts writes; else 503 `{"status":"not_ready","reasons":[...]}` |
//! | `GET /metrics` | open | Prometheus / OpenMetrics text (see [`crate::metrics`]) |
//! | `GET /v1/stats` | any | `{"now_ms","sources":[{"source","messages","bytes","readings","dead_letters","connects","subscribed","broker_skips","broker_skipped_messages","broker_unmatched_messages","broker_backlog","broker_backlog_bytes","redelivered"}],"store":{"readings","batches","tables","devices","commit_count","commit_seconds_sum"},"archive":{"partitions","rows","bytes","partitions_waiting","files_missing"} (what the archive holds now, by its manifest; `partitions_waiting`: those whose late readings wait in RocksDB for a rewrite; `files_missing`: the files, or objects, it names that the archive lacked when last looked at (at start and each retention run), whose partitions cannot be read),"dead_letters":{"<reason>":n,...}}` |
//! | `GET /v1/tables` | any | `{"tables":[name, ...]}` |
//! | `POST /v1/tables` | admin | body `{"name","partition":"hour"\|"day"\|"month","hot_retention":"30d"\|ms\|null,"cold_retention":"400d"\|ms\|null,"hour_rollup_retention":"90d"\|ms\|null,"day_rollup_retention":"730d"\|ms\|null,"strict":bool,"fields":{"<field>":"f64"\|"i64"\|"bool"\|"string"}}` (see [`parse_table_request`]): 201 with the definition when created (and a `"warning"` when it has a cold retention but the store no archive), 200 when it exists with these settings (declared fields it lacks are added: a new schema version; its roll-up retentions become those asked for, a `"warning"` naming any it removes), 409 when it exists with another partition, hot or cold retention or strictness or gives a declared field another type |
//! | `GET /v1/tables/{table}` | read | the definition `{"name","id","partition","hot_retention_ms","cold_retention_ms","hour_rollup_retention_ms","day_rollup_retention_ms","hour_rollup_floor_ms","day_rollup_floor_ms","strict","schema_version","fields":[{"name","type","since_version"}],"store_archive"}` (`hot_retention_ms` null: kept forever; `cold_retention_ms` null: an archived partition is kept forever; `store_archive`: whether the store has an archive (`storage.archive`), without which a partition past the hot retention is deleted, the cold one unused; a roll-up retention null: those roll-ups are kept forever; a roll-up floor: the first hour or day start whose roll-ups are shown whatever the retention, set when a definition lengthened a retention (what the shorter one had hidden stays hidden), null: none; `fields` by name, each with the schema version that added it) |
//! | `GET /v1/tables/{table}/devices?prefix=&limit=` | read | `{"table","prefix","devices":[name, ...],"complete":bool}`: devices with data in the table, name order, `limit` 1 to 10,000 (default 100) |
//! | `GET /v1/tables/{table}/devices?tag=k:v&under=path&parent=path&cursor=&limit=` | read | `{"table","devices":[name, ...],"next_cursor":string\|null}`: devices with data in the table carrying tag `k=v`, under group `path` (any depth) and/or whose parent is `path` (direct children), every given filter holding, name order, one page; pass `next_cursor` back as `cursor` for the next. Used when any of `tag`, `under`, `parent`, `cursor` is given (not with `prefix`) |
//! | `GET /v1/tables/{table}/devices/{device}` | read | `{"name","kind","tags":{..},"parent","ancestors":[..],"outlier":bool}` (`kind`, `parent` null when unset; `outlier`: its hours overflow into sub-buckets, see `bucketer::outliers`); 404 when the device has no data in the table |
//! | `PUT /v1/tables/{table}/devices/{device}` | write | body `{"kind","tags","parent"}` (see [`parse_device_request`]) replaces the device's kind, tags and place: 200 with the record as for `GET`. The record is the device's in every table: a token needs write on each table the device has data in, and answers 404 for a device with no data in the table, which only an admin token registers |
//! | `GET /v1/tables/{table}/devices/{device}/readings?from=&to=&cursor=&limit=&format=` | read | one page: `{"table","device","readings":[{"ts":ms,"<field>":value,...}],"next_cursor":string\|null}`, half-open `[from, to)`, timestamp order, at most `limit` readings (default and most: [`Limits::max_page_rows`]) and about [`Limits::max_response_bytes`]; pass `next_cursor` back as `cursor` with the same `from`/`to` for the next page (also in the `x-next-cursor` header). The store is read one hour bucket at a time and the read stops at the page's end |
//! | `GET /v1/tables/{table}/latest?devices=a,b,c&format=` | read | `{"table","latest":[{"device":"a","reading":{...}\|null}]}` in request order, two multi-gets (`Store::latest`); at most [`Limits::max_devices`] devices |
//! | `GET /v1/tables/{table}/rollups?device=\|devices=\|group=&level=&from=&to=&fields=&aggs=&group_level=` | read | `{"table","device","group","level","group_level","rows":[{"period":ms,"devices":n,"<field>":{"count","sum","min","max","mean","first":{"ts","value"},"last":{"ts","value"},"p50","p90","p95","p99","p999"}}]}`: the roll-ups of a device, of a registry group (every device under it), or with neither, of the whole table (see [`RollupQuery`]); `devices` (group and table rows) estimates the devices that reported; with a `group_level`, `periods` counts the rows merged into each. With `devices=a,b,c` (at most [`Limits::max_devices`]): `{"table","devices","level","group_level","series":[{"device","rows"}]}`, each device's rows in request order (CSV / Arrow: a leading `device` column) |
//! | `GET /v1/tables/{table}/messages?from=&to=` | read | `{"table","approximate":true,"hours":[{"hour":ms,"messages":n}]}`: messages received per wall-clock hour, from an approximate counter written in batches (see `bucketer::counters` for its error) |
//! | `POST /v1/checkpoints` | admin | 201 `{"name","path","archive_files","archive_in_bucket","missing_archive_files","took_ms"}` (`missing_archive_files`: the archive files the manifest names that were gone, left out and listed in the checkpoint's `MISSING-ARCHIVE-FILES`): a consistent copy of the running store in a new directory under [`AppState::with_checkpoints`]'s, named by its UTC time (`bucketer::Store::checkpoint`); 503 without one |
//! | `GET /v1/checkpoints` | admin | `{"checkpoints":[{"name","path","taken_ms","files","bytes","unshared_bytes"}]}` by name (oldest first; `bucketer::list_checkpoints`): `taken_ms` from the name (null for one named otherwise), `unshared_bytes` the bytes of the files only it holds (what deleting it frees; the others are hard links shared with the store or other checkpoints) |
//! | `DELETE /v1/checkpoints/{name}` | admin | deletes a listed checkpoint, answering it as listed; 404 when none is named so, 409 while a process has it open as its store (`serve --data-dir` on it in place) |
//! | `POST /v1/tokens` | admin | body `{"label","admin":bool,"tables":{"<table>":"read"\|"write"\|"read,write"}}` (see [`parse_token_request`]): 201 `{"token","id","label","admin","tables","issued_ms"}` — the only time the token is shown; the store keeps its SHA-256 |
//! | `GET /v1/tokens` | admin | `{"tokens":[{"id","label","admin","tables","issued_ms"}]}`, oldest first: the stored tokens, by id (the SHA-256 of the token, in hex), never the tokens |
//! | `DELETE /v1/tokens/{id}` | admin | revokes the token (requests presenting it get 401 from then on), answering it as listed; 404 for an unknown id |
//! | `GET /openapi.json` | open | the OpenAPI 3.1 document of these routes ([`crate::openapi`]) |
//! | `GET /v1/dead-letters?limit=&reason=&source=&cursor=` | admin | `{"dead_letters":[{"received_ms","seq","reason","detail","source","payload"}],"next_cursor":string\|null}` (and `"payload_base64"`, the bytes exactly, when the payload is not UTF-8, which `payload` then shows with replacement characters), newest first, one page: at most `limit` (default 100, most 10,000) of those with reason `reason` and a source starting with `source`, from at most [`bucketer::MAX_EXAMINED_DEAD_LETTERS`] examined (fewer once they reach [`bucketer::MAX_EXAMINED_DEAD_LETTER_BYTES`]); pass `next_cursor` back as `cursor` with the same filters for the next |
//! | `POST /write?precision=`, `POST /api/v2/write?precision=` | write, on every table of the body | InfluxDB's write API: a body of line protocol (gzip or not), each measurement a table; 204 once every line is committed, 400 `partial write` when some were rejected (dead letters; the others stored); see [`crate::write`] |
//! | `POST /query?q=` (or a form body) | write, on some table | InfluxDB 1's `CREATE DATABASE` (Telegraf sends it before writing), answered `{"results":[{"statement_id":0}]}`; other InfluxQL 400; see [`crate::write`] |
//!
//! Field values are typed (a table's schema gives each field one type): raw readings and latest
//! values return a float as a JSON number (`null` for NaN and infinities), an integer as a JSON
//! integer (exact), a boolean as `true`/`false` and a string as a string. Roll-ups cover float
//! and integer fields (an integer aggregated as the nearest `f64`); **boolean and string fields
//! are not rolled up** and appear in no roll-up row.
//!
//! `from`/`to` are epoch milliseconds, RFC 3339, or relative to the request's arrival (`now`,
//! `now-15m`, `now+1h`; both ends read one "now"). Raw readings, latest values and roll-ups
//! answer JSON by default, CSV or an Arrow IPC stream with `format=csv|arrow` or
//! `Accept: text/csv` / `application/vnd.apache.arrow.stream` (see [`crate::format`]); the
//! roll-up frame is [`rollup_frame`]. Errors are `{"error": "..."}` with 400 for bad parameters,
//! a bad body or a limit exceeded (the message names the limit's configuration key), 401 for a
//! missing or unknown token (with `WWW-Authenticate: Bearer`), 403 for a token without the
//! permission, 404 for an unknown table or device, 409 for a table definition that contradicts
//! the existing one, 413 for a write body over its limit, 415 for a body encoding not served,
//! 500 for a storage failure, 503 for a write the service cannot take (shutting down).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::{Json, Router};
use bucketer::auth::{Grants, Permissions};
use bucketer::rollups::Record;
use bucketer::{DeviceFilter, DeviceRecord, RollupRetention, Store, TableDefinition, TableSpec};
use ingest::http::HttpIntake;
use ingest::wire::{parse_timestamp_param, valid_device_name, valid_field_name, valid_table_name, FIELD_RULE};
use model::{FieldType, PartitionSize, Reading, TimeRange};
use rollup::period::{GroupLevel, Level};
use rollup::record::FieldAgg;
use rollup::Merge;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::auth::{Auth, Caller, Need, Refusal};
use crate::format::{Cells, FieldColumn, Format, Frame};
use crate::metrics::{IngestSource, Snapshot};

/// The limits of one request, each named by its configuration key in the 400 that enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest `[from, to)` of a raw read or a message-count query, ms (`query.max_range_ms`).
    pub max_range_ms: i64,
    /// Most devices in one latest-values request (`query.max_devices_per_request`).
    pub max_devices: usize,
    /// Most readings in one page of a raw read (`query.max_page_rows`); also the default page.
    pub max_page_rows: usize,
    /// Most bytes of one answer (`query.max_response_bytes`): a raw-read page ends before it
    /// (by an estimate of the JSON size), a latest or roll-up answer above it is refused (a
    /// roll-up answer as its rows are read: see `RowReader`).
    pub max_response_bytes: usize,
    /// The roll-up task's allowed lateness (`rollup.allowed_lateness_ms`): a table's hour
    /// roll-up retention must outlast a day by more than it
    /// ([`RollupRetention::check_rolls_up_every_hour`]).
    pub rollup_allowed_lateness_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_range_ms: 400 * model::DAY_MS,
            max_devices: 10_000,
            max_page_rows: 10_000,
            max_response_bytes: 16 << 20,
            rollup_allowed_lateness_ms: 300_000,
        }
    }
}

/// Most dead letters in one listing.
pub const MAX_DEAD_LETTERS: usize = 10_000;
/// Most devices in one device listing.
pub const MAX_DEVICE_LIST: usize = 10_000;
/// Longest range of period starts one roll-up query may span (about 100 years).
pub const MAX_ROLLUP_RANGE_MS: i64 = 36_600 * model::DAY_MS;

/// A device whose tag report a `/write` left out, with a table of it the token may not write.
pub(crate) type LeftOut = (Arc<str>, String);

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    store: Arc<Store>,
    sources: Arc<Vec<IngestSource>>,
    auth: Arc<Auth>,
    limits: Limits,
    /// Where `/write` sends its batches (`None`: a query-only service, writes get 503).
    intake: Option<Arc<HttpIntake>>,
    /// Where `POST /v1/checkpoints` writes (`None`: checkpoints get 503).
    checkpoints: Option<Arc<Checkpoints>>,
}

impl AppState {
    /// State over `store`, with no ingest source, auth off and the default [`Limits`].
    pub fn new(store: Arc<Store>) -> AppState {
        AppState {
            store,
            sources: Arc::new(Vec::new()),
            auth: Arc::new(Auth::off()),
            limits: Limits::default(),
            intake: None,
            checkpoints: None,
        }
    }

    /// Writes checkpoints of the store (`POST /v1/checkpoints`) into directories under `dir`.
    pub fn with_checkpoints(mut self, dir: std::path::PathBuf) -> AppState {
        self.checkpoints = Some(Arc::new(Checkpoints { root: dir, last_ms: AtomicI64::new(i64::MIN) }));
        self
    }

    /// Takes writes (`/write`, `/api/v2/write`) into `intake`, and reports it as the ingest
    /// source `http`.
    pub fn with_intake(self, intake: Arc<HttpIntake>) -> AppState {
        let source = IngestSource {
            name: ingest::http::SOURCE,
            stats: intake.stats(),
            subscribed: intake.open(),
            partition_lag: None,
        };
        AppState { intake: Some(intake), ..self.with_source(source) }
    }

    /// The store's counters.
    pub(crate) fn store_stats(&self) -> &bucketer::StoreStats {
        self.store.stats()
    }

    /// Of the tag reports of a `/write` body (`tags`, by device), those its caller may make:
    /// a device's record is one for every table it has data in, so a report that would change
    /// it (one the store has not seen since it opened) is taken from a token only when it may
    /// write each of those tables, as `PUT …/devices/{device}` asks (QA46 F12: a token with
    /// write on one table rewrote the tags another table's devices showed). With the devices
    /// whose reports were left out, and a table of each that the token may not write.
    pub(crate) fn reportable_tags(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        tags: Vec<model::DeviceTags>,
    ) -> ApiResult<(Vec<model::DeviceTags>, Vec<LeftOut>)> {
        let store = &self.store;
        if !matches!(caller, Caller::Token(_)) || tags.iter().all(|(d, t)| store.tags_reported_before(d, t)) {
            return Ok((tags, Vec::new()));
        }
        let mut barred = Vec::new();
        for table in store.tables() {
            match self.auth.check(store, headers, Need::Write(table.clone())) {
                Ok(_) => {}
                Err(Refusal::Storage(m)) => return Err(ApiError::Internal(format!("checking the token: {m}"))),
                Err(_) => barred.push(table),
            }
        }
        if barred.is_empty() {
            return Ok((tags, Vec::new()));
        }
        // A device's verdict once a body: `Some(table)` when it has data in a barred table.
        let mut verdicts: std::collections::HashMap<Arc<str>, Option<String>> = std::collections::HashMap::new();
        let (mut kept, mut left_out) = (Vec::with_capacity(tags.len()), Vec::new());
        for (device, reported) in tags {
            if store.tags_reported_before(&device, &reported) {
                kept.push((device, reported));
                continue;
            }
            let verdict = match verdicts.get(&device) {
                Some(v) => v.clone(),
                None => {
                    let mut found = None;
                    for table in &barred {
                        if store.has_data(table, &device)? {
                            found = Some(table.clone());
                            break;
                        }
                    }
                    verdicts.insert(device.clone(), found.clone());
                    if let Some(table) = &found {
                        left_out.push((device.clone(), table.clone()));
                    }
                    found
                }
            };
            if verdict.is_none() {
                kept.push((device, reported));
            }
        }
        Ok((kept, left_out))
    }

    /// The write intake, if this service takes writes.
    pub(crate) fn intake(&self) -> Option<Arc<HttpIntake>> {
        self.intake.clone()
    }

    /// Checks tokens with `auth`.
    pub fn with_auth(mut self, auth: Auth) -> AppState {
        self.auth = Arc::new(auth);
        self
    }

    /// Enforces `limits`.
    pub fn with_limits(mut self, limits: Limits) -> AppState {
        self.limits = limits;
        self
    }

    /// Whether the caller of a request with `headers` has `need` (see [`crate::auth`]).
    pub(crate) async fn allow(&self, headers: &HeaderMap, need: Need) -> ApiResult<Caller> {
        if !self.auth.enabled() {
            return Ok(Caller::Anyone);
        }
        let (auth, store, headers) = (self.auth.clone(), self.store.clone(), headers.clone());
        blocking(move || {
            auth.check(&store, &headers, need).map_err(|r| match r {
                Refusal::Unauthenticated(m) => ApiError::Unauthorized(m),
                Refusal::Forbidden(m) => ApiError::Forbidden(m),
                Refusal::Storage(m) => ApiError::Internal(format!("checking the token: {m}")),
            })
        })
        .await
    }

    /// What an extractor of the path gave, answered once the caller is known: without a valid
    /// token a request gets 401 whatever its path (a bad one cannot name the table whose
    /// permission the handler checks next, so this checks for any valid token), as it does
    /// whatever its query string ([`Params`]).
    pub(crate) async fn after_auth<T>(&self, headers: &HeaderMap, extracted: ApiResult<T>) -> ApiResult<T> {
        if extracted.is_err() {
            self.allow(headers, Need::Token).await?;
        }
        extracted
    }

    /// Adds an ingest source, reported by `/metrics`, `/v1/stats` and `/ready`.
    pub fn with_source(mut self, source: IngestSource) -> AppState {
        Arc::make_mut(&mut self.sources).push(source);
        self
    }
}

/// Everything a handler can fail with; [`ApiError::status`] is the one place that maps an
/// error to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A parameter is missing or malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The table or device does not exist.
    #[error("{0}")]
    NotFound(String),
    /// No token, a malformed `Authorization` header, or an unknown token.
    #[error("{0}")]
    Unauthorized(String),
    /// A valid token without the permission the request needs.
    #[error("{0}")]
    Forbidden(String),
    /// The store failed, or refused a request (a table definition that contradicts the
    /// existing one, or that it cannot hold).
    #[error("storage error: {0}")]
    Storage(#[from] bucketer::Error),
    /// A request body above its limit.
    #[error("{0}")]
    TooLarge(String),
    /// A request body in an encoding not served.
    #[error("{0}")]
    Unsupported(String),
    /// The service cannot take the request now (writes while shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// A request body stalled past the read timeout ([`crate::server`]).
    #[error("{0}")]
    Timeout(String),
    /// A blocking task panicked or was cancelled.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_)
            | ApiError::Storage(bucketer::Error::InvalidTable { .. })
            | ApiError::Storage(bucketer::Error::InvalidRegistryInput(_)) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unsupported(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Storage(bucketer::Error::TableExists { .. })
            | ApiError::Storage(bucketer::Error::SchemaConflict { .. })
            | ApiError::Storage(bucketer::Error::CheckpointInUse { .. }) => StatusCode::CONFLICT,
            ApiError::Storage(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The failures and 503 refusals of requests logged lately ([`ApiError::into_response`]).
static FAILURES: std::sync::LazyLock<std::sync::Mutex<ingest::quiet::QuieterByText>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(ingest::quiet::QuieterByText::every(Duration::from_secs(60))));

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A 503 is a state the service is in (stopping, or taking no writes), which the log
        // says elsewhere: not an error of the request's. Once a minute by text too (a stop
        // under many writers logged 5,559 lines in 0.5 s: QA60).
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let text = self.to_string();
            let admitted =
                FAILURES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(&text, Instant::now());
            if let Some(repeats) = admitted {
                tracing::info!(error = %text, repeats, "request refused: unavailable");
            }
        } else if status.is_server_error() {
            // The same failure again within a minute (a dashboard polling an hour whose archive
            // file is damaged: 1,533 lines in seconds, QA57 F2) is counted, not logged.
            let text = self.to_string();
            let admitted =
                FAILURES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(&text, Instant::now());
            if let Some(repeats) = admitted {
                tracing::error!(error = %text, repeats, "request failed");
            }
        }
        // A refusal by the store is the client's to fix: it is told in the store's words,
        // without the `storage error` prefix of a failure.
        let message = match &self {
            ApiError::Storage(e) if status.is_client_error() => e.to_string(),
            other => other.to_string(),
        };
        let mut response = (status, Json(json!({ "error": message }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// One route: its path, its methods and their handlers. [`router`] is built from [`routes`],
/// and the OpenAPI test checks every entry against `/openapi.json`.
#[derive(Debug)]
pub struct Route {
    /// Path, axum syntax (`{param}`, as in OpenAPI).
    pub path: &'static str,
    /// Methods served, upper case.
    pub methods: &'static [&'static str],
    handler: MethodRouter<AppState>,
}

fn route(path: &'static str, methods: &'static [&'static str], handler: MethodRouter<AppState>) -> Route {
    Route { path, methods, handler }
}

/// Every route of the contract.
pub fn routes() -> Vec<Route> {
    vec![
        route("/", &["GET"], get(crate::dashboard::page)),
        route("/dashboard.js", &["GET"], get(crate::dashboard::script)),
        route("/dashboard.css", &["GET"], get(crate::dashboard::style)),
        route("/health", &["GET"], get(health)),
        route("/ping", &["GET"], get(ping)),
        route("/ready", &["GET"], get(ready)),
        route("/metrics", &["GET"], get(metrics)),
        route("/openapi.json", &["GET"], get(openapi)),
        route("/v1/stats", &["GET"], get(stats)),
        route("/v1/tokens", &["GET", "POST"], get(tokens).post(create_token)),
        route("/v1/tokens/{id}", &["DELETE"], delete(delete_token)),
        route("/v1/checkpoints", &["GET", "POST"], get(checkpoints).post(create_checkpoint)),
        route("/v1/checkpoints/{name}", &["DELETE"], delete(delete_checkpoint)),
        route("/v1/tables", &["GET", "POST"], get(tables).post(create_table)),
        route("/v1/tables/{table}", &["GET"], get(table_definition)),
        route("/v1/tables/{table}/devices", &["GET"], get(devices)),
        route("/v1/tables/{table}/devices/{device}", &["GET", "PUT"], get(device).put(put_device)),
        route("/v1/tables/{table}/devices/{device}/readings", &["GET"], get(readings)),
        route("/v1/tables/{table}/latest", &["GET", "POST"], get(latest).post(latest_post)),
        route("/v1/tables/{table}/rollups", &["GET"], get(rollups)),
        route("/v1/tables/{table}/messages", &["GET"], get(messages)),
        route("/v1/dead-letters", &["GET"], get(dead_letters)),
        route("/write", &["POST"], post(crate::write::write_v1)),
        route("/api/v2/write", &["POST"], post(crate::write::write_v2)),
        route("/query", &["POST"], post(crate::write::query_v1)),
    ]
}

/// The most bytes a JSON request body may have (axum's default, set here to be named): a
/// larger one is a 413. The write routes read their bodies themselves, to their own limit.
pub const MAX_JSON_BODY_BYTES: usize = 2 << 20;

/// The router with every route of the contract.
pub fn router(state: AppState) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |r, route| r.route(route.path, route.handler))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}

/// A request's query parameters, read without refusing the request: a handler checks the caller
/// first, then [`Params::get`] answers a bad query string as 400 `{"error"}` (axum's `Query`
/// would refuse it before the handler runs, in plain text, to callers without a token too).
pub(crate) struct Params<T>(Result<T, String>);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Params<T> {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Params(
            Query::<T>::from_request_parts(parts, state)
                .await
                .map(|Query(p)| p)
                .map_err(|e| query_error(&e.body_text())),
        ))
    }
}

/// The message of a query string axum's `Query` could not read, in the API's words: a parameter
/// given twice, and one the route does not take (the `/v1` routes' parameters are
/// `deny_unknown_fields`: a misspelt `field=` or `agg=` would otherwise answer every field or
/// aggregate without a word), are named as such.
fn query_error(axum_text: &str) -> String {
    let reason = axum_text.strip_prefix("Failed to deserialize query string: ").unwrap_or(axum_text);
    if let Some(name) = reason.strip_prefix("duplicate field `").and_then(|r| r.strip_suffix('`')) {
        return format!("parameter `{name}` is given more than once: give it once (a list is comma-separated)");
    }
    // serde, through axum: "x: unknown field `x`, expected one of `a`, `b`" (or "expected
    // `a`", or "there are no fields").
    let unknown = reason.split_once("unknown field `").map(|(_, r)| r);
    if let Some((name, rest)) = unknown.and_then(|r| r.split_once('`')) {
        let takes = rest
            .strip_prefix(", expected one of ")
            .or_else(|| rest.strip_prefix(", expected "))
            .map_or_else(|| "no parameters".to_string(), str::to_string);
        return format!("unknown parameter `{name}`: this route takes {takes}");
    }
    format!("query string: {reason}")
}

/// The 400 of a path axum cannot read (not UTF-8 once decoded, a parameter missing).
fn path_error(rejection: PathRejection) -> ApiError {
    ApiError::BadRequest(rejection.body_text())
}

/// The 413 of a body over the request limit, or the 400 of one that cannot be read; taken only
/// after the caller is checked.
fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        // axum's text ("length limit exceeded") names no limit (QA46 F11).
        ApiError::TooLarge(format!(
            "the request body is larger than {MAX_JSON_BODY_BYTES} bytes, the most a JSON body may be"
        ))
    } else if crate::server::is_read_timeout(&rejection) {
        body_timeout()
    } else {
        ApiError::BadRequest(rejection.body_text())
    }
}

/// The 408 of a request body that stalled past the read timeout.
pub(crate) fn body_timeout() -> ApiError {
    ApiError::Timeout(
        "the request body stalled: no part of it came within the read timeout (http.read_timeout_ms); send it \
         whole, without pauses"
            .into(),
    )
}

impl<T> Params<T> {
    /// The parameters, or the 400 of a query string that does not read as them.
    pub(crate) fn get(self) -> ApiResult<T> {
        self.0.map_err(ApiError::BadRequest)
    }
}

/// Turns the plain-text 4xx answers that axum's extractors give (a path that is not UTF-8, a
/// body that is not the JSON a route takes) into `{"error": "..."}`, as every other error is.
async fn json_errors(response: Response) -> Response {
    // A method a route does not take: axum answers 405 with an empty body.
    if response.status() == StatusCode::METHOD_NOT_ALLOWED && !response.headers().contains_key(header::CONTENT_TYPE) {
        let body = json!({ "error": "method not allowed on this route (GET /openapi.json lists each route's)" });
        let body = body.to_string();
        let (mut parts, _) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Response::from_parts(parts, axum::body::Body::from(body));
    }
    let plain = response.status().is_client_error()
        && response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/plain"));
    if !plain {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = json!({ "error": String::from_utf8_lossy(&text) }).to_string();
    Response::from_parts(parts, axum::body::Body::from(body))
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ApiResult<T> + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(e.to_string()))?
}

#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    description = "Liveness: the process answers. Open (no token).",
    responses((status = 200, description = "`{\"status\":\"ok\"}`"))
)]
async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

#[utoipa::path(
    get,
    path = "/ping",
    tag = "write",
    description = "InfluxDB's ping (1 and 2, GET or HEAD), which its client libraries call before writing: 204 and \
        `X-Influxdb-Version`. Open (no token).",
    responses((status = 204, description = "Empty"))
)]
async fn ping() -> Response {
    let version = concat!("hourglass-", env!("CARGO_PKG_VERSION"));
    (StatusCode::NO_CONTENT, [("x-influxdb-version", version)]).into_response()
}

async fn snapshot(st: &AppState) -> ApiResult<Snapshot> {
    let (store, sources) = (st.store.clone(), st.sources.clone());
    blocking(move || Ok(Snapshot::take(&store, &sources))).await
}

/// Readiness. The store is open whenever this service runs (it starts after `Store::open`);
/// what can still be missing is a broker subscription or a RocksDB that refuses writes. A 503
/// here is an answer, not a failed request, so it carries `reasons` rather than `error`.
#[utoipa::path(
    get,
    path = "/ready",
    tag = "operations",
    description = "Readiness: every ingest source subscribed and RocksDB accepting writes. Open (no token).",
    responses((status = 200, description = "Ready"), (status = 503, description = "Not ready, with `reasons`"))
)]
async fn ready(State(st): State<AppState>) -> ApiResult<Response> {
    let reasons = snapshot(&st).await?.not_ready_reasons();
    Ok(if reasons.is_empty() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "not_ready", "reasons": reasons }))).into_response()
    })
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    description = "Prometheus / OpenMetrics text. Open (no token).",
    responses((status = 200, description = "Metrics text"))
)]
async fn metrics(State(st): State<AppState>) -> ApiResult<Response> {
    let text = crate::metrics::render(&snapshot(&st).await?)
        .map_err(|e| ApiError::Internal(format!("formatting metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/stats",
    tag = "operations",
    description = "Ingest and store counters. Any valid token.",
    responses((status = 200, description = "Counters"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission")),
    security(("bearer" = []))
)]
async fn stats(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    st.allow(&headers, Need::Token).await?;
    let s = snapshot(&st).await?;
    let sources: Vec<Value> = s
        .sources
        .iter()
        .map(|x| {
            let mut source = json!({
                "source": x.name,
                "messages": x.messages,
                "bytes": x.bytes,
                "readings": x.readings,
                "dead_letters": x.dead_letters,
            });
            if x.has_broker() {
                source.as_object_mut().expect("an object").extend([
                    ("connects".to_string(), json!(x.connects)),
                    ("subscribed".to_string(), json!(x.subscribed)),
                    ("broker_skips".to_string(), json!(x.broker_skips)),
                    ("broker_skipped_messages".to_string(), json!(x.broker_skipped_messages)),
                    ("broker_unmatched_messages".to_string(), json!(x.broker_unmatched)),
                    ("broker_backlog".to_string(), json!(x.broker_backlog)),
                    ("broker_backlog_bytes".to_string(), json!(x.broker_backlog_bytes)),
                    ("redelivered".to_string(), json!(x.redelivered)),
                ]);
            }
            source
        })
        .collect();
    let dead_letters: Map<String, Value> =
        s.dead_letters.iter().map(|(r, n)| (r.as_str().to_string(), json!(n))).collect();
    Ok(Json(json!({
        "now_ms": ingest::now_ms(),
        "sources": sources,
        "store": {
            "readings": s.store_readings,
            "batches": s.store_batches,
            "tables": s.tables,
            "devices": s.devices,
            "commit_count": s.commit_latency.count,
            "commit_seconds_sum": s.commit_latency.sum_seconds,
        },
        "archive": {
            "partitions": s.archive_held.partitions,
            "rows": s.archive_held.rows,
            "bytes": s.archive_held.bytes,
            "partitions_waiting": s.archive_held.waiting,
            "files_missing": s.archive_held.files_missing,
        },
        "dead_letters": dead_letters,
    })))
}

/// Parses an optional `limit` parameter: a whole number from 1 to `max`, `default` when absent.
fn parse_limit(v: Option<&str>, default: usize, max: usize) -> ApiResult<usize> {
    match v {
        None => Ok(default),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::BadRequest(format!("parameter `limit`: {s:?} is not a whole number from 1 to {max}"))),
        },
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceListParams {
    prefix: Option<String>,
    limit: Option<String>,
    tag: Option<String>,
    under: Option<String>,
    parent: Option<String>,
    cursor: Option<String>,
}

/// Parses a `tag` parameter, `key:value` (split at the first `:`).
fn parse_tag_param(s: &str) -> ApiResult<(String, String)> {
    match s.split_once(':') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(ApiError::BadRequest(format!("parameter `tag`: {s:?} is not `key:value`"))),
    }
}

#[utoipa::path(
    get,
    path = "/v1/tables/{table}/devices",
    tag = "devices",
    description = "Devices with data in the table, by name prefix or by tag / group filters, one page (read).",
    params(("table" = String, Path, description = "Table name"), ("prefix" = Option<String>, Query, description = "Name prefix"), ("tag" = Option<String>, Query, description = "`key:value`"), ("under" = Option<String>, Query, description = "Group path, any depth"), ("parent" = Option<String>, Query, description = "Group path, direct children"), ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"), ("limit" = Option<String>, Query, description = "1 to 10,000; default 100")),
    responses((status = 200, description = "A page of names"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn devices(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    p: Params<DeviceListParams>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let p = p.get()?;
    let limit = parse_limit(p.limit.as_deref(), 100, MAX_DEVICE_LIST)?;
    if p.tag.is_some() || p.under.is_some() || p.parent.is_some() || p.cursor.is_some() {
        if p.prefix.is_some() {
            return Err(ApiError::BadRequest(
                "parameter `prefix` cannot be combined with `tag`, `under`, `parent` or `cursor`".into(),
            ));
        }
        let filter =
            DeviceFilter { tag: p.tag.as_deref().map(parse_tag_param).transpose()?, under: p.under, parent: p.parent };
        return blocking(move || {
            let page = st
                .store
                .find_devices(&table, &filter, p.cursor.as_deref(), limit)?
                .ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
            Ok(Json(json!({ "table": table, "devices": page.devices, "next_cursor": page.next_cursor })))
        })
        .await;
    }
    let prefix = p.prefix.unwrap_or_default();
    blocking(move || {
        let list = st
            .store
            .devices_with_data(&table, &prefix, limit)?
            .ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
        Ok(Json(json!({ "table": table, "prefix": prefix, "devices": list.devices, "complete": list.complete })))
    })
    .await
}

/// A device's answer in `table` (GET and PUT): its record ([`record_json`]) and whether it is
/// an outlier there.
fn device_json(store: &Store, table: &str, record: &DeviceRecord) -> Value {
    let mut answer = record_json(record);
    answer["outlier"] = json!(store.is_outlier(table, &record.name));
    answer
}

/// A device record as JSON: `{"name","kind","tags":{..},"parent","ancestors":[..]}`.
pub fn record_json(r: &DeviceRecord) -> Value {
    json!({
        "name": r.name,
        "kind": r.kind,
        "tags": r.tags,
        "parent": r.parent,
        "ancestors": r.ancestors,
    })
}

/// A device's kind, tags and place asked for by `PUT /v1/tables/{table}/devices/{device}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceRequest {
    /// Kind; `None` when absent or null.
    pub kind: Option<String>,
    /// Tags, key → value; empty when absent.
    pub tags: std::collections::BTreeMap<String, String>,
    /// Group path; `None` (at the root) when absent or null.
    pub parent: Option<String>,
}

/// The JSON object of a request body whose keys are `known` (for the error message).
fn json_object(body: &[u8], known: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))? {
        Value::Object(obj) => Ok(obj),
        _ => Err(format!("body must be a JSON object with {known}")),
    }
}

/// Refuses a request body with a key left after its known ones were taken out, so a misspelt
/// key is not silently ignored; `what` names the request (`a table definition`).
fn no_other_key(obj: &serde_json::Map<String, Value>, what: &str, known: &str) -> Result<(), String> {
    match obj.keys().next() {
        Some(key) => Err(format!("unknown key `{key}`; {what} has {known}")),
        None => Ok(()),
    }
}

/// Parses the body of a device `PUT`: a JSON object with `kind` (string or null), `tags` (an
/// object of string values) and `parent` (a group path such as `"site_z/line_3"`, or null). A
/// key left out clears that part, since the body replaces the record. Any other key is refused.
/// The store checks the syntax of kinds, tags and paths.
pub fn parse_device_request(body: &[u8]) -> Result<DeviceRequest, String> {
    const KNOWN: &str = "`kind`, `tags`, `parent`";
    let mut obj = json_object(body, KNOWN)?;
    let mut string_or_null = |key: &str| match obj.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("`{key}` must be a string or null, not {other}")),
    };
    let kind = string_or_null("kind")?;
    let parent = string_or_null("parent")?;
    let tags = match obj.remove("tags") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(tags)) => tags
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(v) => Ok((k, v)),
                other => Err(format!("tag `{k}` must have a string value, not {other}")),
            })
            .collect::<Result<_, String>>()?,
        Some(other) => Err(format!("`tags` must be an object of strings, not {other}"))?,
    };
    no_other_key(&obj, "a device update", KNOWN)?;
    Ok(DeviceRequest { kind, tags, parent })
}

#[utoipa::path(
    get,
    path = "/v1/tables/{table}/devices/{device}",
    tag = "devices",
    description = "A device record (read).",
    params(("table" = String, Path, description = "Table name"), ("device" = String, Path, description = "Device name")),
    responses((status = 200, description = "The record"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn device(
    State(st): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path((table, device)) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    blocking(move || {
        if st.store.table(&table).is_none() {
            return Err(ApiError::NotFound(format!("unknown table `{table}`")));
        }
        let record = match st.store.has_data(&table, &device)? {
            true => st.store.device_record(&device)?,
            false => None,
        };
        let record =
            record.ok_or_else(|| ApiError::NotFound(format!("unknown device `{device}` in table `{table}`")))?;
        Ok(Json(device_json(&st.store, &table, &record)))
    })
    .await
}

#[utoipa::path(
    put,
    path = "/v1/tables/{table}/devices/{device}",
    tag = "devices",
    description = "Replaces a device's kind, tags and place (write on every table the device has data in; a device \
        with no data in the table only with an admin token).",
    params(("table" = String, Path, description = "Table name"), ("device" = String, Path, description = "Device name")),
    responses((status = 200, description = "The record"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn put_device(
    State(st): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let Path((table, device)) = st.after_auth(&headers, path.map_err(path_error)).await?;
    let caller = st.allow(&headers, Need::Write(table.clone())).await?;
    let body = body.map_err(body_error)?;
    if !valid_device_name(&device) {
        return Err(ApiError::BadRequest(format!(
            "{device:?} is not a valid device name (1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, starting \
             with a letter or digit)"
        )));
    }
    let req = parse_device_request(&body).map_err(ApiError::BadRequest)?;
    blocking(move || {
        if st.store.table(&table).is_none() {
            return Err(ApiError::NotFound(format!("unknown table `{table}`")));
        }
        // The record is the device's in every table: a token that is not an admin's sets it only
        // for a device with data in the table (as `GET` finds it; an admin's registers one
        // before its data), and only if it may write each table the device has data in.
        if let Caller::Token(_) = caller {
            if !st.store.has_data(&table, &device)? {
                return Err(ApiError::NotFound(format!(
                    "unknown device `{device}` in table `{table}` (only an admin token sets the record of a device \
                     before it has data)"
                )));
            }
            for other in st.store.tables().into_iter().filter(|t| *t != table) {
                if st.store.has_data(&other, &device)? {
                    st.auth.check(&st.store, &headers, Need::Write(other.clone())).map_err(|r| match r {
                        Refusal::Storage(m) => ApiError::Internal(format!("checking the token: {m}")),
                        _ => ApiError::Forbidden(format!(
                            "device `{device}` also has data in table `{other}`, which this token may not write: its \
                             record is shared by every table it is in"
                        )),
                    })?;
                }
            }
        }
        let record = st.store.replace_device(&device, req.kind.as_deref(), req.tags, req.parent.as_deref())?;
        Ok(Json(device_json(&st.store, &table, &record)))
    })
    .await
}

/// Every table for an admin (or with auth off); for another token, the tables it has a grant
/// on.
#[utoipa::path(
    get,
    path = "/v1/tables",
    tag = "tables",
    description = "Table names: every table for an admin, else the tables the token has a grant on.",
    responses((status = 200, description = "`{\"tables\": [..]}`"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission")),
    security(("bearer" = []))
)]
async fn tables(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    let caller = st.allow(&headers, Need::Token).await?;
    blocking(move || {
        let mut names = st.store.tables();
        if let Caller::Token(hash) = caller {
            let granted: Vec<String> = st
                .store
                .token(&hash)?
                .map(|(_, grants)| grants.into_iter().map(|(t, _)| t).collect())
                .unwrap_or_default();
            names.retain(|n| granted.contains(n));
        }
        Ok(Json(json!({ "tables": names })))
    })
    .await
}

/// A table definition asked for by `POST /v1/tables`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRequest {
    /// Table name, valid by [`valid_table_name`].
    pub name: String,
    /// Partition size; `day` when the body leaves it out.
    pub partition: PartitionSize,
    /// Hot retention in milliseconds; `None` (absent or null): kept forever.
    pub hot_retention_ms: Option<u64>,
    /// Cold retention in milliseconds; `None` (absent or null): none.
    pub cold_retention_ms: Option<u64>,
    /// How long its hour and day roll-ups are kept; each `None` (absent or null): forever.
    pub rollup_retention: RollupRetention,
    /// Whether the table refuses fields its schema lacks; `false` when the body leaves it out.
    pub strict: bool,
    /// Fields to declare, by name.
    pub fields: Vec<(String, FieldType)>,
}

/// Parses the body of `POST /v1/tables`: a JSON object with `name` (a table name), `partition`
/// (`"hour"`, `"day"` or `"month"`; default `"day"`) and `hot_retention` (a duration such as
/// `"12h"` or `"30d"` — units `ms`, `s`, `m`, `h`, `d`, `w` — or whole milliseconds as a
/// number; absent or null keeps data forever), `cold_retention` (the same forms; how long a
/// partition is kept in all, for the archive tier — longer than the hot retention, and only
/// with one; see `bucketer::catalog`), `hour_rollup_retention` and `day_rollup_retention` (the
/// same forms; how long the hour and day roll-up records are kept, counted from each period's
/// end, absent or null: forever; a day one needs an hour one no longer than it, checked by
/// the store), `strict` (`true` or `false`, default `false`) and
/// `fields` (an object of field name → `"f64"`, `"i64"`, `"bool"` or `"string"`; names as
/// `ingest::wire::valid_field_name` allows). Any other key is refused, so a misspelt one is
/// not silently ignored. The error says what is wrong.
pub fn parse_table_request(body: &[u8]) -> Result<TableRequest, String> {
    const KNOWN: &str = "`name`, `partition`, `hot_retention`, `cold_retention`, `hour_rollup_retention`, \
                         `day_rollup_retention`, `strict`, `fields`";
    let mut obj = json_object(body, KNOWN)?;
    let name = match obj.remove("name") {
        Some(Value::String(name)) if valid_table_name(&name) => name,
        Some(Value::String(name)) => {
            return Err(format!(
                "`name`: {name:?} is not a valid table name (1 to 64 ASCII letters, digits, `_`, `-` or `.`, \
                 starting with a letter or digit)"
            ))
        }
        Some(other) => return Err(format!("`name` must be a string, not {other}")),
        None => return Err("missing `name`".to_string()),
    };
    let partition = match obj.remove("partition") {
        None => PartitionSize::Day,
        Some(Value::String(p)) => match p.as_str() {
            "hour" => PartitionSize::Hour,
            "day" => PartitionSize::Day,
            "month" => PartitionSize::Month,
            _ => return Err(format!("`partition`: {p:?} is not one of \"hour\", \"day\", \"month\"")),
        },
        Some(other) => return Err(format!("`partition` must be \"hour\", \"day\" or \"month\", not {other}")),
    };
    let duration = |key: &str, v: Option<Value>| -> Result<Option<u64>, String> {
        let bad = |v: &Value| {
            format!(
                "`{key}`: {v} is not a duration (a whole number followed by ms, s, m, h, d or w, such as \
                 \"12h\" or \"30d\") nor a number of milliseconds (JSON, unquoted) from 1 to {}",
                i64::MAX
            )
        };
        Ok(match v {
            None | Some(Value::Null) => None,
            Some(v @ Value::String(_)) => Some(v.as_str().and_then(model::parse_duration_ms).ok_or_else(|| bad(&v))?),
            Some(v @ Value::Number(_)) => {
                Some(v.as_u64().filter(|ms| (1..=i64::MAX as u64).contains(ms)).ok_or_else(|| bad(&v))?)
            }
            Some(v) => return Err(bad(&v)),
        })
    };
    let hot_retention_ms = duration("hot_retention", obj.remove("hot_retention"))?;
    let cold_retention_ms = duration("cold_retention", obj.remove("cold_retention"))?;
    let rollup_retention = RollupRetention {
        hour_ms: duration("hour_rollup_retention", obj.remove("hour_rollup_retention"))?,
        day_ms: duration("day_rollup_retention", obj.remove("day_rollup_retention"))?,
    };
    let strict = match obj.remove("strict") {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(other) => return Err(format!("`strict` must be true or false, not {other}")),
    };
    let fields = match obj.remove("fields") {
        None => Vec::new(),
        Some(Value::Object(fields)) => {
            let mut out = Vec::with_capacity(fields.len());
            for (name, ty) in fields {
                if !valid_field_name(&name) {
                    return Err(format!("`fields`: {name:?} is not a valid field name ({FIELD_RULE})"));
                }
                match ty.as_str().and_then(FieldType::parse) {
                    Some(ty) => out.push((name, ty)),
                    None => {
                        return Err(format!(
                            "`fields`: the type of {name:?} must be \"f64\", \"i64\", \"bool\" or \"string\", not {ty}"
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(format!(
                "`fields` must be an object of field name to type, like {{\"status\":\"i64\"}}, not {other}"
            ))
        }
    };
    no_other_key(&obj, "a table definition", KNOWN)?;
    Ok(TableRequest { name, partition, hot_retention_ms, cold_retention_ms, rollup_retention, strict, fields })
}

/// A definition as JSON: `{"name","id","partition","hot_retention_ms","cold_retention_ms",
/// "hour_rollup_retention_ms","day_rollup_retention_ms","hour_rollup_floor_ms","day_rollup_floor_ms","strict","schema_version",
/// "fields":[{"name","type","since_version"}],"store_archive"}`; `archives`: whether the store has an
/// archive, so that a reader of the definition knows whether the cold retention keeps anything.
pub fn definition_json(d: &TableDefinition, archives: bool) -> Value {
    let fields: Vec<Value> = d
        .schema
        .fields
        .iter()
        .map(|f| json!({ "name": &*f.name, "type": f.ty.as_str(), "since_version": f.since }))
        .collect();
    json!({
        "name": d.name,
        "id": d.id,
        "partition": d.partition.to_string(),
        "hot_retention_ms": d.hot_retention_ms,
        "cold_retention_ms": d.cold_retention_ms,
        "hour_rollup_retention_ms": d.rollup_retention.hour_ms,
        "day_rollup_retention_ms": d.rollup_retention.day_ms,
        "hour_rollup_floor_ms": (d.rollup_floor.hour_ms != i64::MIN).then_some(d.rollup_floor.hour_ms),
        "day_rollup_floor_ms": (d.rollup_floor.day_ms != i64::MIN).then_some(d.rollup_floor.day_ms),
        "strict": d.schema.strict,
        "schema_version": d.schema.version,
        "fields": fields,
        "store_archive": archives,
    })
}

#[utoipa::path(
    post,
    path = "/v1/checkpoints",
    tag = "operations",
    description = "Writes a consistent copy of the running store for a backup (admin): a new directory under \
        `{data_dir}/checkpoints`, named by its UTC time, that `hourglass serve --data-dir` opens. RocksDB's files and \
        a local archive's are hard-linked (copied across file systems); an S3 archive is not copied.",
    responses((status = 201, description = "`{\"name\",\"path\",\"archive_files\",\"archive_in_bucket\",\"missing_archive_files\",\"took_ms\"}`: `missing_archive_files` names the archive files the manifest names that were gone (the store cannot read them either), left out of the checkpoint and listed in its `MISSING-ARCHIVE-FILES`"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 500, description = "The checkpoint failed (a full disk, an unreadable archive file): removed again, the error answered"), (status = 503, description = "No checkpoint directory (a query-only service)")),
    security(("bearer" = []))
)]
async fn create_checkpoint(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    st.allow(&headers, Need::Admin).await?;
    let root = checkpoint_root(&st)?;
    blocking(move || {
        let started = std::time::Instant::now();
        let name = root.new_name(model::now_ms());
        let done = st.store.checkpoint(&root.root.join(&name))?;
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(path = %done.dir.display(), archive_files = done.archive_files, took_ms, "checkpoint written");
        if !done.missing_archive_files.is_empty() {
            tracing::warn!(
                path = %done.dir.display(),
                missing = ?done.missing_archive_files,
                "checkpoint written without archive files the manifest names, which are gone from the archive (the store \
                 cannot read those partitions either); listed in its {}",
                bucketer::MISSING_ARCHIVE_FILES
            );
        }
        let body = json!({
            "name": name,
            "path": absolute(&done.dir),
            "archive_files": done.archive_files,
            "archive_in_bucket": done.archive_in_bucket,
            "missing_archive_files": done.missing_archive_files,
            "took_ms": took_ms,
        });
        Ok((StatusCode::CREATED, Json(body)).into_response())
    })
    .await
}

/// Where the service writes checkpoints, and the time the last one was named by.
#[derive(Debug)]
struct Checkpoints {
    root: std::path::PathBuf,
    last_ms: AtomicI64,
}

impl Checkpoints {
    /// A name for a new checkpoint taken now: its time, or a millisecond after the last one
    /// named (two requests in one millisecond) or after any checkpoint there by that name (a
    /// clock set back), so that no two are given one name.
    fn new_name(&self, now_ms: i64) -> String {
        loop {
            let next = |last: i64| now_ms.max(last.saturating_add(1));
            let last = self.last_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some(next(l)));
            let name = checkpoint_name(next(last.unwrap_or_else(|l| l)));
            if !self.root.join(&name).exists() {
                return name;
            }
        }
    }
}

/// Where the service writes checkpoints; 503 when it writes none.
fn checkpoint_root(st: &AppState) -> ApiResult<Arc<Checkpoints>> {
    st.checkpoints.clone().ok_or_else(|| ApiError::Unavailable("this service writes no checkpoints".into()))
}

/// The name of a checkpoint taken at `ms`: RFC 3339 to the millisecond with dashes for the
/// colons (some tools take them for a host), `2026-12-03T14-40-00.123Z`.
fn checkpoint_name(ms: i64) -> String {
    model::utc_text_ms(ms).replace(':', "-")
}

/// The time a checkpoint named by [`checkpoint_name`] was taken at; `None` for another name.
fn checkpoint_taken_ms(name: &str) -> Option<i64> {
    let b = name.as_bytes();
    if b.len() != 24 || b[10] != b'T' || b[13] != b'-' || b[16] != b'-' || b[23] != b'Z' {
        return None;
    }
    let text = format!("{}:{}:{}", &name[..13], &name[14..16], &name[17..]);
    let ms = ingest::wire::parse_timestamp_param(&text, 0).ok()?;
    (checkpoint_name(ms) == name).then_some(ms)
}

/// A listed checkpoint as JSON.
/// A path as an operator elsewhere can use it: absolute, not relative to the server's working
/// directory (a `--data-dir` given relative), and without `..` (resolved when it exists).
fn absolute(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

fn checkpoint_json(c: &bucketer::CheckpointEntry) -> Value {
    json!({
        "name": c.name,
        "path": absolute(&c.dir),
        "taken_ms": checkpoint_taken_ms(&c.name),
        "files": c.files,
        "bytes": c.bytes,
        "unshared_bytes": c.unshared_bytes,
    })
}

#[utoipa::path(
    get,
    path = "/v1/checkpoints",
    tag = "operations",
    description = "The checkpoints in `{data_dir}/checkpoints` (admin), oldest first: each one's name, path, time \
        (`taken_ms`, from its name; null for a directory named otherwise), files and bytes, and `unshared_bytes`, \
        the bytes of the files it alone holds (what deleting it frees; the others are hard links shared with the store \
        or other checkpoints).",
    responses((status = 200, description = "`{\"checkpoints\":[{\"name\",\"path\",\"taken_ms\",\"files\",\"bytes\",\"unshared_bytes\"}]}`"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 503, description = "No checkpoint directory (a query-only service)")),
    security(("bearer" = []))
)]
async fn checkpoints(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    st.allow(&headers, Need::Admin).await?;
    let root = checkpoint_root(&st)?;
    blocking(move || {
        let listed = bucketer::list_checkpoints(&root.root)?;
        Ok(Json(json!({ "checkpoints": listed.iter().map(checkpoint_json).collect::<Vec<_>>() })))
    })
    .await
}

#[utoipa::path(
    delete,
    path = "/v1/checkpoints/{name}",
    tag = "operations",
    description = "Deletes a checkpoint (admin), one `GET /v1/checkpoints` lists, and answers it as it was \
        (`unshared_bytes`: the bytes freed).",
    params(("name" = String, Path, description = "The checkpoint's name")),
    responses((status = 200, description = "`{\"name\",\"path\",\"taken_ms\",\"files\",\"bytes\",\"unshared_bytes\"}`"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "No checkpoint by that name"), (status = 409, description = "A process has the checkpoint, or a checkpoint inside it, open as its store"), (status = 503, description = "No checkpoint directory (a query-only service)")),
    security(("bearer" = []))
)]
async fn delete_checkpoint(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path(name) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Admin).await?;
    let root = checkpoint_root(&st)?;
    blocking(move || match bucketer::delete_checkpoint(&root.root, &name)? {
        Some(gone) => {
            tracing::info!(path = %gone.dir.display(), freed_bytes = gone.unshared_bytes, "checkpoint deleted");
            Ok(Json(checkpoint_json(&gone)))
        }
        None => Err(ApiError::NotFound(format!("no checkpoint named {name:?}"))),
    })
    .await
}

#[utoipa::path(
    post,
    path = "/v1/tables",
    tag = "tables",
    description = "Defines a table (admin).",
    responses((status = 201, description = "Created"), (status = 200, description = "Exists with these settings"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 409, description = "Exists with other settings")),
    security(("bearer" = []))
)]
async fn create_table(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    st.allow(&headers, Need::Admin).await?;
    let body = body.map_err(body_error)?;
    let req = parse_table_request(&body).map_err(ApiError::BadRequest)?;
    req.rollup_retention
        .check_rolls_up_every_hour(st.limits.rollup_allowed_lateness_ms)
        .map_err(ApiError::BadRequest)?;
    blocking(move || {
        let spec = TableSpec {
            partition: req.partition,
            hot_retention_ms: req.hot_retention_ms,
            cold_retention_ms: req.cold_retention_ms,
            rollup_retention: req.rollup_retention,
            strict: req.strict,
            fields: req.fields,
        };
        let before = st.store.table_definition(&req.name).map(|d| d.rollup_retention);
        let (def, created) = st.store.define_table_with(&req.name, &spec)?;
        let status = if created { StatusCode::CREATED } else { StatusCode::OK };
        let mut body = definition_json(&def, st.store.archives());
        let mut warnings = Vec::new();
        // A definition states the roll-up retentions it wants, so one that leaves them out
        // removes them: said in the answer, since adding a field by a body without them is an
        // easy way to do so unawares (QA34 F6).
        if let Some(removed) = before.and_then(|b| removed_rollup_retentions(&b, &def.rollup_retention)) {
            tracing::warn!(table = %req.name, "{removed}");
            warnings.push(removed);
        }
        // Valid, but not what its author may expect: said in the answer, not only in the log
        // of the next start.
        if def.cold_retention_ms.is_some() && !st.store.archives() {
            let warning = "this store has no archive (storage.archive = false): the table's partitions are deleted \
                           for good at the hot retention, none is kept for the cold one";
            tracing::warn!(table = %req.name, "{warning}");
            warnings.push(warning.to_string());
        }
        if !warnings.is_empty() {
            body["warning"] = json!(warnings.join("; "));
        }
        Ok((status, Json(body)).into_response())
    })
    .await
}

/// What a definition's roll-up retentions removed from the table's (`before`), in words; `None`
/// when it removed none.
fn removed_rollup_retentions(before: &RollupRetention, after: &RollupRetention) -> Option<String> {
    let removed: Vec<&str> = [("hour", before.hour_ms, after.hour_ms), ("day", before.day_ms, after.day_ms)]
        .into_iter()
        .filter(|&(_, b, a)| b.is_some() && a.is_none())
        .map(|(level, _, _)| level)
        .collect();
    (!removed.is_empty()).then(|| {
        let names: Vec<String> = removed.iter().map(|l| format!("`{l}_rollup_retention`")).collect();
        format!(
            "this definition has no {}: the table's {} roll-ups are kept forever from now on (a definition sets the \
             roll-up retentions it states and removes those it leaves out; state them to keep them)",
            names.join(" nor "),
            removed.join(" and ")
        )
    })
}

#[utoipa::path(
    get,
    path = "/v1/tables/{table}",
    tag = "tables",
    description = "A table definition (read).",
    params(("table" = String, Path, description = "Table name")),
    responses((status = 200, description = "The definition"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn table_definition(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let def =
        st.store.table_definition(&table).ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
    Ok(Json(definition_json(&def, st.store.archives())))
}

/// Query string of a raw read.
#[derive(Debug, Deserialize)]
struct RangeParams {
    from: Option<String>,
    to: Option<String>,
}

fn parse_range_within(p: &RangeParams, max_ms: i64, key: &str) -> ApiResult<TimeRange> {
    // One "now" for both ends: `from=now-1h&to=now` is an hour long.
    let now_ms = model::now_ms();
    let get = |name: &str, v: &Option<String>| -> ApiResult<i64> {
        let v = v.as_deref().ok_or_else(|| {
            ApiError::BadRequest(format!("missing parameter `{name}` (epoch ms, RFC 3339 or relative such as now-1h)"))
        })?;
        parse_timestamp_param(v, now_ms).map_err(|e| ApiError::BadRequest(format!("parameter `{name}`: {e}")))
    };
    let (from, to) = (get("from", &p.from)?, get("to", &p.to)?);
    let range = TimeRange::new(from, to)
        .ok_or_else(|| ApiError::BadRequest(format!("empty range: `from` ({from}) must be before `to` ({to})")))?;
    if range.len_ms() > max_ms {
        return Err(ApiError::BadRequest(format!(
            "range of {} ms is longer than the limit of {max_ms} ms ({}, {key})",
            range.len_ms(),
            model::format_duration_ms(max_ms.unsigned_abs())
        )));
    }
    Ok(range)
}

/// A reading as JSON: `{"ts": ms, "<field>": value, ...}`, each value typed: a float as a
/// JSON number (`null` for NaN and infinities, which JSON cannot write), an integer as a JSON
/// integer (exact, also past 2^53), a boolean as `true`/`false`, a string as a string.
pub fn reading_json(r: &Reading) -> Value {
    let mut m = Map::with_capacity(r.fields.len() + 1);
    m.insert("ts".into(), json!(r.ts));
    for (name, v) in &r.fields {
        m.insert(name.to_string(), value_json(v));
    }
    Value::Object(m)
}

/// One field value as JSON (see [`reading_json`]).
pub fn value_json(v: &model::Value) -> Value {
    match v {
        model::Value::F64(v) => json!(v),
        model::Value::I64(v) | model::Value::UntypedInt(v) => json!(v),
        model::Value::Bool(v) => json!(v),
        model::Value::Str(v) => json!(&**v),
    }
}

/// Appends [`reading_json`]'s text without building a `Value` (the raw-read hot path).
fn write_reading_json(r: &Reading, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"ts\":");
    out.extend_from_slice(itoa::Buffer::new().format(r.ts).as_bytes());
    for (name, v) in &r.fields {
        out.push(b',');
        crate::format::write_json_str(name, out);
        out.push(b':');
        crate::format::write_json_value(v, out);
    }
    out.push(b'}');
}

/// At least the bytes of a reading in a JSON answer, for ending a page before
/// [`Limits::max_response_bytes`]: a string counts its length and its escapes (`\u00XX` at
/// most, six bytes for one).
fn reading_size_estimate(r: &Reading) -> usize {
    8 + 20 + r.fields.iter().map(|(name, v)| name.len() + 4 + value_size_estimate(v)).sum::<usize>()
}

/// At least the bytes of a value in JSON (a string with its quotes and escapes).
fn value_size_estimate(v: &model::Value) -> usize {
    match v {
        model::Value::F64(_) => 24,
        model::Value::I64(_) | model::Value::UntypedInt(_) => 20,
        model::Value::Bool(_) => 5,
        model::Value::Str(s) => 2 + s.len() + 5 * s.bytes().filter(|&b| b < 0x20 || b == b'"' || b == b'\\').count(),
    }
}

/// The bytes a raw-read page takes in its format, row by row, for ending it about
/// [`Limits::max_response_bytes`]. JSON holds each reading's own fields
/// ([`reading_size_estimate`]); CSV and Arrow have a column for every field of the table's
/// schema and of the page's rows ([`readings_frame`]), so a row also costs a cell of each (an
/// empty CSV cell its comma, an Arrow null its value's width), and a column a row adds costs a
/// cell in each row before it. (Counted by the JSON estimate alone, a page of a table of
/// thousands of fields, each reading holding one, was hundreds of megabytes as CSV and more
/// as Arrow.)
struct PageCost {
    format: Format,
    /// Each column's empty cell, in bytes, by field name.
    columns: std::collections::HashMap<model::FieldName, usize>,
    /// Their sum: the empty row.
    row: usize,
    /// Rows counted.
    rows: usize,
    /// The names of columns added since the last row, in the header (CSV's first line,
    /// Arrow's schema and each column's buffers).
    head: usize,
}

impl PageCost {
    fn new(format: Format, schema: &bucketer::schema::Schema) -> PageCost {
        let mut cost = PageCost { format, columns: std::collections::HashMap::new(), row: 0, rows: 0, head: 0 };
        // JSON holds each reading's own fields only.
        if format != Format::Json {
            for f in &schema.fields {
                cost.column(&f.name, f.ty);
            }
        }
        cost
    }

    /// Adds the column `name` (of type `ty`) unless it is there; its cell's bytes.
    fn column(&mut self, name: &model::FieldName, ty: model::FieldType) -> usize {
        if self.columns.contains_key(name) {
            return 0;
        }
        let cell = match (self.format, ty) {
            (Format::Json, _) => 0,
            (Format::Csv, _) => 1,
            (Format::Arrow, model::FieldType::Bool) => 1,
            // An offset; the text is the value's.
            (Format::Arrow, model::FieldType::Str) => 4,
            (Format::Arrow, _) => 8,
        };
        self.columns.insert(name.clone(), cell);
        self.row += cell;
        self.head += match self.format {
            Format::Json => 0,
            Format::Csv => name.len() + 1,
            Format::Arrow => name.len() + 100,
        };
        cell
    }

    /// The bytes `r` adds to the page (its columns counted from now on).
    fn add(&mut self, r: &Reading) -> usize {
        if self.format == Format::Json {
            return reading_size_estimate(r);
        }
        let mut added = 0;
        for (name, v) in &r.fields {
            // A new column: a cell in each row before this one.
            added += self.rows * self.column(name, v.field_type());
            added += match (self.format, v) {
                (Format::Arrow, model::Value::Str(s)) => s.len(),
                (Format::Arrow, _) => 0,
                _ => value_size_estimate(v),
            };
        }
        self.rows += 1;
        // The row's time (epoch ms in CSV, 8 bytes in Arrow) and line end, then its cells.
        added + 16 + self.row + std::mem::take(&mut self.head)
    }
}

/// At least the bytes of a raw-read page's JSON around its readings (`{"table":…,"device":…,
/// "readings":[…],"next_cursor":…}`), names escaped at most as [`reading_size_estimate`] says.
fn page_head_estimate(table: &str, device: &str) -> usize {
    64 + 6 * (table.len() + device.len()) + encode_cursor(i64::MIN).len()
}

/// Prefix of raw-read cursors (a version: the text after it is the timestamp to resume at).
const CURSOR_PREFIX: &str = "r1.";

/// The cursor that resumes a raw read at `ts`.
pub fn encode_cursor(ts: i64) -> String {
    format!("{CURSOR_PREFIX}{ts}")
}

/// The timestamp a cursor resumes at; it must lie in `range` (the cursor belongs to the same
/// `from` and `to`).
fn parse_cursor(c: &str, range: TimeRange) -> ApiResult<i64> {
    let bad = || {
        ApiError::BadRequest(format!(
            "parameter `cursor`: {c:?} is not a cursor of this range; pass back `next_cursor` with the same `from` and \
             `to`"
        ))
    };
    let ts: i64 = c.strip_prefix(CURSOR_PREFIX).and_then(|t| t.parse().ok()).ok_or_else(bad)?;
    if range.contains(ts) {
        Ok(ts)
    } else {
        Err(bad())
    }
}

/// Parses the `limit` of a raw read: 1 to `max` readings per page, `max` when absent.
fn parse_page_rows(v: Option<&str>, max: usize) -> ApiResult<usize> {
    match v {
        None => Ok(max),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            Ok(n) if n > max => Err(ApiError::BadRequest(format!(
                "parameter `limit`: {n} readings per page is above the limit of {max} (query.max_page_rows); follow \
                 `next_cursor` for more"
            ))),
            _ => Err(ApiError::BadRequest(format!("parameter `limit`: {s:?} is not a whole number from 1 to {max}"))),
        },
    }
}

/// Query string of a raw read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadingParams {
    from: Option<String>,
    to: Option<String>,
    cursor: Option<String>,
    limit: Option<String>,
    format: Option<String>,
}

/// The readings of a page as a frame: `ts`, then one column per field in name order.
fn readings_frame(rows: &[Reading], device: Option<&[&str]>, schema: &bucketer::schema::Schema) -> Frame {
    // Every field of the table, of its schema's type, so that each page and each device has the
    // same columns; and any other the rows hold (added since the schema was read).
    let mut names: Vec<&str> = schema.fields.iter().map(|f| &*f.name).collect();
    names.extend(rows.iter().flat_map(|r| r.fields.iter().map(|(n, _)| &**n)));
    names.sort_unstable();
    names.dedup();
    let mut columns: Vec<FieldColumn> =
        names.iter().map(|n| FieldColumn::typed(rows.len(), schema.field(n).map(|f| f.ty))).collect();
    for (row, r) in rows.iter().enumerate() {
        for (name, v) in &r.fields {
            if let Ok(i) = names.binary_search(&&**name) {
                columns[i].set(row, v.clone());
            }
        }
    }
    let mut f = Frame::default();
    if let Some(devices) = device {
        f.push("device", Cells::Text(devices.iter().map(|d| d.to_string()).collect()));
    }
    f.push("ts", Cells::Timestamp(rows.iter().map(|r| Some(r.ts)).collect()));
    for (name, col) in names.into_iter().zip(columns) {
        f.push(name, col.into_cells());
    }
    f
}

/// An answer in `format`: `json` already encoded, or the frame encoded as CSV or Arrow.
fn answer(format: Format, json: impl FnOnce() -> Vec<u8>, frame: impl FnOnce() -> Frame) -> ApiResult<Response> {
    let body = match format {
        Format::Json => json(),
        Format::Csv => frame().to_csv().into_bytes(),
        Format::Arrow => frame().to_arrow().map_err(ApiError::Internal)?,
    };
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

/// Refuses an answer above [`Limits::max_response_bytes`].
fn within_size(r: Response, max: usize, narrow: &str) -> ApiResult<Response> {
    let size = axum::body::HttpBody::size_hint(r.body()).exact().unwrap_or(0);
    if size > max as u64 {
        return Err(ApiError::BadRequest(format!(
            "the answer would be {size} bytes, above the limit of {max} (query.max_response_bytes); {narrow}"
        )));
    }
    Ok(r)
}

/// `GET /v1/tables/{table}/devices/{device}/readings`: one page of a raw read.
#[utoipa::path(
    get,
    path = "/v1/tables/{table}/devices/{device}/readings",
    tag = "data",
    description = "One page of raw readings in `[from, to)`, timestamp order (read). Pass `next_cursor` (also in the `x-next-cursor` header) back as `cursor` with the same `from` and `to` for the next page; null on the last.",
    params(("table" = String, Path, description = "Table name"), ("device" = String, Path, description = "Device name"), ("from" = String, Query, description = "Start, included: epoch ms, RFC 3339 or relative such as now-1h"), ("to" = String, Query, description = "End, excluded: epoch ms, RFC 3339 or relative such as now-1h"), ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"), ("limit" = Option<String>, Query, description = "Readings per page, 1 to `query.max_page_rows` (the default)"), ("format" = Option<String>, Query, description = "`json` (default), `csv` or `arrow`; else the `Accept` header decides (`text/csv`, `application/vnd.apache.arrow.stream`)")),
    responses((status = 200, description = "`{\"table\",\"device\",\"readings\":[{\"ts\",...}],\"next_cursor\"}`, or CSV / Arrow (`ts`, one column per field)"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn readings(
    State(st): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    p: Params<ReadingParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let Path((table, device)) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let p = p.get()?;
    let format = Format::negotiate(p.format.as_deref(), &headers).map_err(ApiError::BadRequest)?;
    let range =
        parse_range_within(&RangeParams { from: p.from, to: p.to }, st.limits.max_range_ms, "query.max_range_ms")?;
    let rows = parse_page_rows(p.limit.as_deref(), st.limits.max_page_rows)?;
    let resume = match &p.cursor {
        Some(c) => parse_cursor(c, range)?,
        None => range.start,
    };
    let max_bytes = st.limits.max_response_bytes;
    blocking(move || {
        if st.store.table(&table).is_none() {
            return Err(ApiError::NotFound(format!("unknown table `{table}`")));
        }
        let read = TimeRange { start: resume, end: range.end };
        let (mut page, mut bytes, mut next) = (Vec::new(), page_head_estimate(&table, &device), None);
        let schema = st.store.schema(&table).unwrap_or_default();
        let mut cost = PageCost::new(format, &schema);
        st.store
            .for_each_reading(&table, &device, read, |r| {
                let size = cost.add(&r);
                if page.len() == rows || (!page.is_empty() && bytes + size > max_bytes) {
                    next = Some(encode_cursor(r.ts));
                    return std::ops::ControlFlow::Break(());
                }
                bytes += size;
                page.push(r);
                std::ops::ControlFlow::Continue(())
            })?
            .ok_or_else(|| ApiError::NotFound(format!("unknown device `{device}` in table `{table}`")))?;
        let json = || {
            let mut out = Vec::with_capacity(bytes + 128);
            out.extend_from_slice(b"{\"table\":");
            crate::format::write_json_str(&table, &mut out);
            out.extend_from_slice(b",\"device\":");
            crate::format::write_json_str(&device, &mut out);
            out.extend_from_slice(b",\"readings\":[");
            for (i, r) in page.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_reading_json(r, &mut out);
            }
            out.extend_from_slice(b"],\"next_cursor\":");
            match &next {
                Some(c) => crate::format::write_json_str(c, &mut out),
                None => out.extend_from_slice(b"null"),
            }
            out.push(b'}');
            out
        };
        let mut response = answer(format, json, || readings_frame(&page, None, &schema))?;
        if let Some(c) = next.as_deref().and_then(|c| HeaderValue::from_str(c).ok()) {
            response.headers_mut().insert(NEXT_CURSOR_HEADER, c);
        }
        Ok(response)
    })
    .await
}

/// Header carrying `next_cursor` on raw-read pages (in every format; CSV and Arrow have no other
/// place for it).
pub const NEXT_CURSOR_HEADER: &str = "x-next-cursor";

/// `GET /v1/tables/{table}/messages`: the approximate message counter per hour of receipt.
#[utoipa::path(
    get,
    path = "/v1/tables/{table}/messages",
    tag = "data",
    description = "Approximate messages received per wall-clock hour, each hour that meets [from, to) (read).",
    params(("table" = String, Path, description = "Table name"), ("from" = String, Query, description = "Start, included: epoch ms, RFC 3339 or relative such as now-1h"), ("to" = String, Query, description = "End, excluded: epoch ms, RFC 3339 or relative such as now-1h")),
    responses((status = 200, description = "`{\"table\",\"approximate\",\"hours\"}`"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn messages(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    p: Params<MessagesParams>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let p = p.get()?;
    // JSON only: a format asked for is not answered in another without a word.
    if let Some(format) = p.format.as_deref().filter(|f| *f != "json") {
        return Err(ApiError::BadRequest(format!(
            "parameter `format`: {format:?}: message counts are answered in JSON only"
        )));
    }
    let range =
        parse_range_within(&RangeParams { from: p.from, to: p.to }, st.limits.max_range_ms, "query.max_range_ms")?;
    blocking(move || {
        let hours = st
            .store
            .message_counts(&table, range)?
            .ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
        let hours: Vec<Value> = hours.iter().map(|(h, n)| json!({ "hour": h, "messages": n })).collect();
        Ok(Json(json!({ "table": table, "approximate": true, "hours": hours })))
    })
    .await
}

/// Query string of the message counts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesParams {
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LatestParams {
    devices: Option<String>,
    format: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/tables/{table}/latest",
    tag = "data",
    description = "The latest reading of many devices, one multi-get (read).",
    params(("table" = String, Path, description = "Table name"), ("devices" = String, Query, description = "Comma-separated device names, at most `query.max_devices_per_request`"), ("format" = Option<String>, Query, description = "`json` (default), `csv` or `arrow`; else the `Accept` header decides (`text/csv`, `application/vnd.apache.arrow.stream`)")),
    responses((status = 200, description = "`{\"table\",\"latest\":[{\"device\",\"reading\"}]}`, or CSV / Arrow (`device`, `ts`, fields)"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn latest(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    p: Params<LatestParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let p = p.get()?;
    let format = Format::negotiate(p.format.as_deref(), &headers).map_err(ApiError::BadRequest)?;
    let list = p
        .devices
        .ok_or_else(|| ApiError::BadRequest("missing parameter `devices` (comma-separated device names)".into()))?;
    latest_of(st, table, device_list(&list)?, format).await
}

/// `POST /v1/tables/{table}/latest` with `{"devices": [...]}`: the latest values of more devices
/// than a URL holds (hyper refuses one over 64 KiB: about 6,000 names like `truck_1234`).
#[utoipa::path(
    post,
    path = "/v1/tables/{table}/latest",
    tag = "data",
    description = "The latest reading of many devices named in a JSON body `{\"devices\": [...]}`, for lists longer than a URL holds (read).",
    params(("table" = String, Path, description = "Table name"), ("format" = Option<String>, Query, description = "`json` (default), `csv` or `arrow`; else the `Accept` header decides (`text/csv`, `application/vnd.apache.arrow.stream`)")),
    responses((status = 200, description = "As `GET`: `{\"table\",\"latest\":[{\"device\",\"reading\"}]}`, or CSV / Arrow (`device`, `ts`, fields)"), (status = 400, description = "Bad body or parameter, or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table"), (status = 413, description = "Body over the request limit")),
    security(("bearer" = []))
)]
async fn latest_post(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    p: Params<FormatParams>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let format = Format::negotiate(p.get()?.format.as_deref(), &headers).map_err(ApiError::BadRequest)?;
    let body = body.map_err(body_error)?;
    let devices = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(mut o)) if o.len() == 1 => match o.remove("devices") {
            Some(Value::Array(names)) => names
                .into_iter()
                .map(|n| match n {
                    Value::String(name) => device_name(name, "`devices`"),
                    other => Err(ApiError::BadRequest(format!("`devices`: {other} is not a device name"))),
                })
                .collect::<ApiResult<Vec<String>>>()?,
            _ => return Err(ApiError::BadRequest("the body must be {\"devices\": [\"name\", ...]}".into())),
        },
        Ok(_) => return Err(ApiError::BadRequest("the body must be {\"devices\": [\"name\", ...]}".into())),
        Err(e) => return Err(ApiError::BadRequest(format!("the body is not JSON: {e}"))),
    };
    if devices.is_empty() {
        return Err(ApiError::BadRequest("`devices` names no device".into()));
    }
    latest_of(st, table, devices, format).await
}

/// Query string of a request whose only parameter is the answer's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FormatParams {
    format: Option<String>,
}

/// The latest values of `devices` in `table`, answered in `format`.
async fn latest_of(st: AppState, table: String, devices: Vec<String>, format: Format) -> ApiResult<Response> {
    within_device_limit(devices.len(), st.limits.max_devices)?;
    let max_bytes = st.limits.max_response_bytes;
    blocking(move || {
        let found =
            st.store.latest(&table, &devices)?.ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
        let json = || {
            let mut out = Vec::with_capacity(64 + devices.len() * 96);
            out.extend_from_slice(b"{\"table\":");
            crate::format::write_json_str(&table, &mut out);
            out.extend_from_slice(b",\"latest\":[");
            for (i, (d, r)) in devices.iter().zip(&found).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"device\":");
                crate::format::write_json_str(d, &mut out);
                out.extend_from_slice(b",\"reading\":");
                match r {
                    Some(r) => write_reading_json(r, &mut out),
                    None => out.extend_from_slice(b"null"),
                }
                out.push(b'}');
            }
            out.extend_from_slice(b"]}");
            out
        };
        // The table's fields: a column each in CSV and Arrow (not read for JSON).
        let schema =
            if format == Format::Json { Default::default() } else { st.store.schema(&table).unwrap_or_default() };
        if format != Format::Json {
            // A CSV or Arrow answer has a cell of every field of the table in each row: counted
            // before it is built, so that a wide table times many devices is refused without
            // building it. Only the rows' empty cells are counted (a CSV cell's comma, an Arrow
            // slot's width), not their values, whose estimate overcounts (24 bytes a float):
            // what passes twice the limit so would pass the exact check below too, which still
            // has the last word.
            let mut cost = PageCost::new(format, &schema);
            let empty = Reading { ts: 0, fields: Vec::new() };
            let mut size = 0;
            for d in &devices {
                size += d.len() + 1 + cost.add(&empty);
                if size > max_bytes.saturating_mul(2) {
                    return Err(ApiError::BadRequest(format!(
                        "the answer would be over {} bytes, above the limit of {max_bytes} \
                         (query.max_response_bytes; counted before it was built: a {} row has a cell of each of the \
                         table's {} fields); ask for fewer devices, or for JSON",
                        max_bytes.saturating_mul(2),
                        if format == Format::Csv { "CSV" } else { "Arrow" },
                        schema.fields.len(),
                    )));
                }
            }
        }
        let frame = || {
            // A device without a reading is a row with only its name.
            let names: Vec<&str> = devices.iter().map(String::as_str).collect();
            let rows: Vec<Reading> = found
                .iter()
                .map(|r| r.clone().unwrap_or_else(|| Reading { ts: i64::MIN, fields: Vec::new() }))
                .collect();
            let mut f = readings_frame(&rows, Some(&names), &schema);
            f.nullable.push("ts");
            if let Some((_, Cells::Timestamp(ts))) = f.columns.iter_mut().find(|(n, _)| n == "ts") {
                for t in ts.iter_mut().filter(|t| **t == Some(i64::MIN)) {
                    *t = None;
                }
            }
            f
        };
        within_size(answer(format, json, frame)?, max_bytes, "ask for fewer devices")
    })
    .await
}

/// One aggregate a roll-up query can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    /// Number of points.
    Count,
    /// Exact sum, correctly rounded.
    Sum,
    /// Smallest value.
    Min,
    /// Largest value.
    Max,
    /// `sum / count`.
    Mean,
    /// Earliest point, `{"ts","value"}`.
    First,
    /// Latest point, `{"ts","value"}`.
    Last,
    /// Median, from the quantile sketch (1 % relative error); null without a sketch.
    P50,
    /// 90th percentile, like [`Agg::P50`].
    P90,
    /// 95th percentile, like [`Agg::P50`].
    P95,
    /// 99th percentile, like [`Agg::P50`].
    P99,
    /// 99.9th percentile, like [`Agg::P50`].
    P999,
}

impl Agg {
    /// Every aggregate, in answer order.
    pub const ALL: [Agg; 12] = [
        Agg::Count,
        Agg::Sum,
        Agg::Min,
        Agg::Max,
        Agg::Mean,
        Agg::First,
        Agg::Last,
        Agg::P50,
        Agg::P90,
        Agg::P95,
        Agg::P99,
        Agg::P999,
    ];

    /// The name in `aggs=` and in the answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Agg::Count => "count",
            Agg::Sum => "sum",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Mean => "mean",
            Agg::First => "first",
            Agg::Last => "last",
            Agg::P50 => "p50",
            Agg::P90 => "p90",
            Agg::P95 => "p95",
            Agg::P99 => "p99",
            Agg::P999 => "p999",
        }
    }

    /// What this aggregate answers of `agg`.
    fn value(self, agg: &FieldAgg) -> AggValue {
        let e = &agg.exact;
        match self {
            Agg::Count => AggValue::Count(e.count()),
            Agg::Sum => AggValue::Number(Some(e.sum())),
            Agg::Min => AggValue::Number(Some(e.min())),
            Agg::Max => AggValue::Number(Some(e.max())),
            Agg::Mean => AggValue::Number(Some(e.mean())),
            Agg::First => AggValue::Point(e.first().0, e.first().1),
            Agg::Last => AggValue::Point(e.last().0, e.last().1),
            Agg::P50 => AggValue::Number(agg.quantile(0.5)),
            Agg::P90 => AggValue::Number(agg.quantile(0.9)),
            Agg::P95 => AggValue::Number(agg.quantile(0.95)),
            Agg::P99 => AggValue::Number(agg.quantile(0.99)),
            Agg::P999 => AggValue::Number(agg.quantile(0.999)),
        }
    }
}

/// The value of one aggregate of one field in a roll-up row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AggValue {
    /// A count.
    Count(u64),
    /// A number; `None` for a quantile without a sketch (null, as a non-finite number is in
    /// JSON).
    Number(Option<f64>),
    /// A point `(ts, value)`: first and last.
    Point(i64, f64),
}

impl AggValue {
    fn json(self) -> Value {
        match self {
            AggValue::Count(n) => json!(n),
            AggValue::Number(x) => json!(x),
            AggValue::Point(ts, v) => json!({ "ts": ts, "value": v }),
        }
    }

    /// At least the bytes of the value in `format` (its cell and separator in CSV, its slot
    /// in Arrow; JSON: `"<agg>":` and the value's text).
    fn min_bytes(self, format: Format, agg: Agg) -> usize {
        let finite = |x: f64| usize::from(x.is_finite());
        match (format, self) {
            (Format::Json, AggValue::Point(ts, _)) => agg.as_str().len() + 17 + digits(ts),
            (Format::Json, AggValue::Count(n)) => agg.as_str().len() + 3 + digits(n),
            (Format::Json, AggValue::Number(_)) => agg.as_str().len() + 4,
            (Format::Csv, AggValue::Count(n)) => 1 + digits(n),
            (Format::Csv, AggValue::Number(x)) => 1 + x.map_or(0, finite),
            (Format::Csv, AggValue::Point(ts, v)) => 2 + digits(ts) + finite(v),
            (Format::Arrow, AggValue::Point(..)) => 16,
            (Format::Arrow, _) => 8,
        }
    }
}

/// Decimal digits of `n` (with its sign).
fn digits(n: impl Into<i128>) -> usize {
    let n: i128 = n.into();
    usize::from(n < 0) + n.unsigned_abs().checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// The device names of a comma-separated `devices` parameter (empty names skipped, as a
/// trailing comma leaves); 400 when it names none, or a name no device can have (` d1` after
/// `d0, d1`: no device has it, so no answer could be found).
fn device_list(list: &str) -> ApiResult<Vec<String>> {
    let devices: Vec<String> = list
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| device_name(d.to_string(), "parameter `devices`"))
        .collect::<ApiResult<_>>()?;
    if devices.is_empty() {
        return Err(ApiError::BadRequest("parameter `devices` names no device".into()));
    }
    Ok(devices)
}

/// `name`, or a 400 naming `what` when no device may have it.
fn device_name(name: String, what: &str) -> ApiResult<String> {
    if ingest::wire::valid_device_name(&name) {
        return Ok(name);
    }
    Err(ApiError::BadRequest(format!(
        "{what}: {} is not a device name (1 to 128 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a \
         letter or digit)",
        Value::String(name)
    )))
}

/// 400 when `n` devices are more than one request may ask for.
fn within_device_limit(n: usize, max: usize) -> ApiResult<()> {
    if n > max {
        return Err(ApiError::BadRequest(format!(
            "{n} devices requested; at most {max} per request (query.max_devices_per_request)"
        )));
    }
    Ok(())
}

/// Whose roll-ups a query reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollupScope {
    /// One device (`device=`).
    Device(String),
    /// Several devices, each its own rows (`devices=a,b,c`), in request order.
    Devices(Vec<String>),
    /// Every device under a registry group path (`group=`).
    Group(String),
    /// Every device of the table (neither parameter).
    Table,
}

/// A parsed roll-up query: `device`, `devices` (comma-separated: each device's rows, at most
/// [`Limits::max_devices`]) or `group` (at most one; none: the whole table), `level` (`hour`, `day` or `month`; default
/// `hour`), `from` / `to` (epoch ms, RFC 3339 or relative such as now-1h, required: periods whose start lies in
/// `[from, to)`, at most [`MAX_ROLLUP_RANGE_MS`]), `fields` (comma-separated; default every
/// field), `aggs` (comma-separated names of [`Agg`]; default all) and `group_level` (`year`,
/// `month` or `day`: rows re-aggregated by that prefix of their period start; only the rows in
/// `[from, to)`, so a group that `from` or `to` cuts is partial, its period still the group's
/// start).
#[derive(Debug, Clone, PartialEq)]
pub struct RollupQuery {
    /// Device, group or table.
    pub scope: RollupScope,
    /// Period level of the stored rows.
    pub level: Level,
    /// Period starts wanted.
    pub range: TimeRange,
    /// Fields wanted; `None`: all.
    pub fields: Option<Vec<String>>,
    /// Aggregates wanted, in [`Agg::ALL`] order.
    pub aggs: Vec<Agg>,
    /// Re-aggregation of the rows, if any.
    pub group_level: Option<GroupLevel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollupParams {
    format: Option<String>,
    device: Option<String>,
    devices: Option<String>,
    group: Option<String>,
    level: Option<String>,
    from: Option<String>,
    to: Option<String>,
    fields: Option<String>,
    aggs: Option<String>,
    group_level: Option<String>,
}

fn parse_rollup_query(p: RollupParams) -> ApiResult<RollupQuery> {
    let bad = |m: String| ApiError::BadRequest(m);
    let scope = match (p.device, p.devices, p.group) {
        (Some(d), None, None) if d.is_empty() => return Err(bad("parameter `device` is empty".into())),
        (None, None, Some(g)) if g.is_empty() => return Err(bad("parameter `group` is empty".into())),
        (Some(d), None, None) => RollupScope::Device(d),
        (None, Some(list), None) => RollupScope::Devices(device_list(&list)?),
        (None, None, Some(g)) => RollupScope::Group(g),
        (None, None, None) => RollupScope::Table,
        _ => return Err(bad("give one of `device`, `devices` and `group`".into())),
    };
    let level = match p.level.as_deref() {
        None => Level::Hour,
        Some(l) => Level::parse(l)
            .ok_or_else(|| bad(format!("parameter `level`: {l:?} is not one of \"hour\", \"day\", \"month\"")))?,
    };
    let range =
        parse_range_within(&RangeParams { from: p.from, to: p.to }, MAX_ROLLUP_RANGE_MS, "the roll-up range limit")?;
    let fields = match p.fields {
        None => None,
        Some(list) => {
            let names: Vec<String> = list.split(',').filter(|f| !f.is_empty()).map(str::to_string).collect();
            if names.is_empty() {
                return Err(bad("parameter `fields` names no field".into()));
            }
            Some(names)
        }
    };
    let aggs = match p.aggs {
        None => Agg::ALL.to_vec(),
        Some(list) => {
            let mut wanted = Vec::new();
            for name in list.split(',').filter(|a| !a.is_empty()) {
                match Agg::ALL.into_iter().find(|a| a.as_str() == name) {
                    Some(a) => wanted.push(a),
                    None => {
                        return Err(bad(format!(
                        "parameter `aggs`: {name:?} is not one of count, sum, min, max, mean, first, last, p50, p90, \
                             p95, p99, p999"
                    )))
                    }
                }
            }
            if wanted.is_empty() {
                return Err(bad("parameter `aggs` names no aggregate".into()));
            }
            Agg::ALL.into_iter().filter(|a| wanted.contains(a)).collect()
        }
    };
    let group_level = match p.group_level.as_deref() {
        None => None,
        Some(g) => Some(GroupLevel::parse(g).ok_or_else(|| {
            bad(format!("parameter `group_level`: {g:?} is not one of \"year\", \"month\", \"day\""))
        })?),
    };
    if (level, group_level) == (Level::Month, Some(GroupLevel::Day)) {
        return Err(bad(
            "parameter `group_level`: \"day\" is shorter than `level` \"month\" (it groups rows into longer periods)"
                .into(),
        ));
    }
    Ok(RollupQuery { scope, level, range, fields, aggs, group_level })
}

/// Refuses a `fields` list naming a field the table's schema lacks, or one not rolled up (a
/// boolean or string field), with the message of the first. A table without a schema (version
/// 0: nothing stored, or stored before schemas) refuses none.
fn rolled_up_fields(schema: &bucketer::schema::Schema, fields: Option<&[String]>) -> Result<(), String> {
    if schema.version == 0 {
        return Ok(());
    }
    for name in fields.unwrap_or_default() {
        match schema.field(name).map(|f| f.ty) {
            None => return Err(format!("parameter `fields`: the table has no field `{name}`")),
            Some(ty @ (FieldType::Bool | FieldType::Str)) => {
                return Err(format!(
                    "parameter `fields`: `{name}` is a {} field; only f64 and i64 fields are rolled up",
                    ty.as_str()
                ))
            }
            Some(FieldType::F64 | FieldType::I64) => {}
        }
    }
    Ok(())
}

/// One roll-up row as JSON: `{"period": ms, "devices": n, "<field>": {"<agg>": ...}}`, fields
/// in name order; `devices` only on group and table rows (`periods` only on rows a
/// `group_level` made: not here).
pub fn rollup_row_json(start: i64, record: &Record, fields: Option<&[String]>, aggs: &[Agg]) -> Value {
    RollupRow::of(start, record, fields, aggs).json(aggs)
}

/// A roll-up row as it is answered: its period start, the devices that reported (group and
/// table rows) and, per field asked for that the record holds (name order), the value of
/// each asked aggregate (in the query's `aggs` order). Made as the record is read, so that an
/// answer holds neither the records' sketches nor the fields not asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupRow {
    /// Period start, epoch ms.
    pub period: i64,
    /// Estimated devices that reported (group and table rows).
    pub devices: Option<u64>,
    /// With a `group_level`: how many rows (hours, days or months) were merged into this one,
    /// so that a group cut by `from`/`to`, a roll-up retention or floor, or lacking periods
    /// nothing was stored in, tells itself from a whole one (QA34 F1).
    pub periods: Option<u32>,
    /// Per field, the aggregates' values.
    pub fields: Vec<(model::FieldName, Vec<AggValue>)>,
}

impl RollupRow {
    /// The row of `record`, whose period starts at `start`.
    pub fn of(start: i64, record: &Record, fields: Option<&[String]>, aggs: &[Agg]) -> RollupRow {
        let fields = record
            .fields
            .iter()
            .filter(|(name, _)| fields.is_none_or(|f| f.iter().any(|x| x.as_str() == &***name)))
            .map(|(name, agg)| (name.clone(), aggs.iter().map(|a| a.value(agg)).collect()))
            .collect();
        RollupRow { period: start, devices: record.devices.as_ref().map(|d| d.estimate()), periods: None, fields }
    }

    /// The row as JSON (see [`rollup_row_json`]).
    pub fn json(&self, aggs: &[Agg]) -> Value {
        let mut m = Map::with_capacity(self.fields.len() + 2);
        for (name, values) in &self.fields {
            let values: Map<String, Value> =
                aggs.iter().zip(values).map(|(a, v)| (a.as_str().to_string(), v.json())).collect();
            m.insert(name.to_string(), Value::Object(values));
        }
        // After the fields: no field may be named so (`ingest::wire::RESERVED_FIELD_NAMES`), but
        // a store written before `period`, `devices` and `periods` were reserved may hold one; the row's
        // own wins.
        m.insert("period".into(), json!(self.period));
        if let Some(devices) = self.devices {
            m.insert("devices".into(), json!(devices));
        }
        if let Some(periods) = self.periods {
            m.insert("periods".into(), json!(periods));
        }
        Value::Object(m)
    }

    /// The values of field `name`, if the row has it.
    fn field(&self, name: &str) -> Option<&[AggValue]> {
        let i = self.fields.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
        Some(&self.fields[i].1)
    }

    /// At least the bytes of the row in `format`: what its cells and separators take (a CSV
    /// row's own cells; the empty cells of fields other rows have are not counted).
    fn min_bytes(&self, format: Format, aggs: &[Agg]) -> usize {
        let mut n = match format {
            Format::Json => r#"{"period":}"#.len() + digits(self.period),
            Format::Csv => 1 + digits(self.period),
            Format::Arrow => 8,
        };
        if let Some(d) = self.devices {
            n += match format {
                Format::Json => r#","devices":"#.len() + digits(d),
                Format::Csv => 1 + digits(d),
                Format::Arrow => 8,
            };
        }
        if let Some(p) = self.periods {
            n += match format {
                Format::Json => r#","periods":"#.len() + digits(u64::from(p)),
                Format::Csv => 1 + digits(u64::from(p)),
                Format::Arrow => 8,
            };
        }
        for (name, values) in &self.fields {
            if format == Format::Json {
                n += name.len() + r#","":{}"#.len();
            }
            n += aggs.iter().zip(values).map(|(a, v)| v.min_bytes(format, *a)).sum::<usize>();
        }
        n
    }
}

/// The rows of one roll-up answer, made as the store hands the records over: re-aggregated
/// by the query's `group_level` (the records come in time order, so a group is whole when a
/// record of the next one comes), each made a [`RollupRow`] and counted (at least its bytes
/// in the answer). The read stops once the count is over `query.max_response_bytes`: an
/// answer that cannot be within the limit is never held (a year of hours of 300 devices,
/// read whole with their sketches, once took the server's 24 GB).
struct RowReader<'q> {
    q: &'q RollupQuery,
    format: Format,
    max_bytes: usize,
    /// The group being merged, not yet a row: its start, the merge, how many records.
    group: Option<(i64, Record, u32)>,
    rows: Vec<RollupRow>,
    /// At least the bytes of `rows` in the answer.
    bytes: usize,
}

impl<'q> RowReader<'q> {
    fn new(q: &'q RollupQuery, format: Format, max_bytes: usize) -> RowReader<'q> {
        RowReader { q, format, max_bytes, group: None, rows: Vec::new(), bytes: 0 }
    }

    /// Counts `n` more bytes of the answer; breaks once they are over the limit.
    fn count(&mut self, n: usize) -> ControlFlow<()> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.max_bytes {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    /// Takes the record of the period starting at `start`.
    fn take(&mut self, start: i64, record: Record) -> ControlFlow<()> {
        let Some(level) = self.q.group_level else {
            return self.push(start, &record, None);
        };
        let start = level.group_start(start);
        if let Some((g, merged, n)) = &mut self.group {
            if *g == start {
                merged.merge(&record);
                *n += 1;
                return ControlFlow::Continue(());
            }
        }
        match self.group.replace((start, record, 1)) {
            Some((g, merged, n)) => self.push(g, &merged, Some(n)),
            None => ControlFlow::Continue(()),
        }
    }

    /// Adds the row of `record`; `periods`: the records a group merged.
    fn push(&mut self, start: i64, record: &Record, periods: Option<u32>) -> ControlFlow<()> {
        let mut row = RollupRow::of(start, record, self.q.fields.as_deref(), &self.q.aggs);
        row.periods = periods;
        let n = row.min_bytes(self.format, &self.q.aggs);
        self.rows.push(row);
        self.count(n)
    }

    /// Ends a series: the group being merged becomes its last row.
    fn end_series(&mut self) -> ControlFlow<()> {
        match self.group.take() {
            Some((g, merged, n)) => self.push(g, &merged, Some(n)),
            None => ControlFlow::Continue(()),
        }
    }

    /// Reads the rows of one device (`Some`) or of a group (`None`: the table's with `""`)
    /// into the answer; 404 for an unknown device or table, 400 once the answer is over
    /// the limit.
    fn read(&mut self, st: &AppState, table: &str, device: Option<&str>, group: &str) -> ApiResult<()> {
        let (q, mut flow) = (self.q, ControlFlow::Continue(()));
        let mut visit = |start: i64, record: Record| {
            flow = self.take(start, record);
            flow
        };
        let known = match device {
            Some(d) => st.store.visit_rollups(table, d, q.level, q.range, &mut visit)?,
            None => st.store.visit_group_rollups(table, group, q.level, q.range, &mut visit)?,
        };
        if !known {
            return Err(ApiError::NotFound(match device {
                Some(d) => format!("unknown device `{d}` in table `{table}`"),
                None => format!("unknown table `{table}`"),
            }));
        }
        if flow.is_continue() {
            flow = self.end_series();
        }
        // A group path no device is under, and no row: a misspelt path (or a device's name) is
        // a 404 as an unknown device is, not an empty answer that reads as "no data" (QA34 F3).
        // A group its devices have left still answers the rows it had.
        if device.is_none() && !group.is_empty() && self.rows.is_empty() && !st.store.group_has_devices(group)? {
            return Err(ApiError::NotFound(format!(
                "no device is under group `{group}` (and it has no roll-ups in the range): group paths are those of \
                 the devices' `parent`, see /v1/tables/{table}/devices?under="
            )));
        }
        if flow.is_break() {
            return Err(self.over_limit());
        }
        Ok(())
    }

    fn over_limit(&self) -> ApiError {
        let narrow = if matches!(self.q.scope, RollupScope::Devices(_)) { "fewer devices, " } else { "" };
        ApiError::BadRequest(format!(
            "the answer would be above the limit of {} bytes (query.max_response_bytes; counted as its rows were \
             read, it passed the limit at row {}); ask for {narrow}a shorter range, fewer fields or fewer aggregates",
            self.max_bytes,
            self.rows.len(),
        ))
    }
}

/// Serializes roll-up rows one at a time, each a JSON value only while it is written.
struct JsonRows<'a> {
    rows: &'a [RollupRow],
    aggs: &'a [Agg],
}

impl serde::Serialize for JsonRows<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.rows.iter().map(|r| r.json(self.aggs)))
    }
}

/// A roll-up answer in JSON (fields in name order, as `json!` gives them).
#[derive(serde::Serialize)]
struct RollupAnswer<'a> {
    device: Option<&'a str>,
    group: Option<&'a str>,
    group_level: Option<&'static str>,
    level: &'static str,
    rows: JsonRows<'a>,
    table: &'a str,
}

/// The series of a `devices=` roll-up answer in JSON.
struct JsonSeries<'a> {
    devices: &'a [String],
    rows: &'a [RollupRow],
    /// Where each device's rows end in `rows`.
    ends: &'a [usize],
    aggs: &'a [Agg],
}

impl serde::Serialize for JsonSeries<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Series<'a> {
            device: &'a str,
            rows: JsonRows<'a>,
        }
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        s.collect_seq(self.devices.iter().zip(starts.zip(self.ends)).map(|(device, (from, &to))| Series {
            device,
            rows: JsonRows { rows: &self.rows[from..to], aggs: self.aggs },
        }))
    }
}

/// A `devices=` roll-up answer in JSON (fields in name order).
#[derive(serde::Serialize)]
struct SeriesAnswer<'a> {
    devices: &'a [String],
    group_level: Option<&'static str>,
    level: &'static str,
    series: JsonSeries<'a>,
    table: &'a str,
}

#[utoipa::path(
    get,
    path = "/v1/tables/{table}/rollups",
    tag = "data",
    description = "Roll-up rows of a device, a group or the table (read).",
    params(("table" = String, Path, description = "Table name"), ("device" = Option<String>, Query, description = "Device"), ("devices" = Option<String>, Query, description = "Comma-separated devices, each its own rows (`series`), at most `query.max_devices_per_request`"), ("group" = Option<String>, Query, description = "Group path"), ("level" = Option<String>, Query, description = "`hour` (default), `day`, `month`"), ("from" = String, Query, description = "Start, included: epoch ms, RFC 3339 or relative such as now-1h"), ("to" = String, Query, description = "End, excluded: epoch ms, RFC 3339 or relative such as now-1h"), ("fields" = Option<String>, Query, description = "Comma-separated fields"), ("aggs" = Option<String>, Query, description = "Comma-separated aggregates"), ("group_level" = Option<String>, Query, description = "`year`, `month`, `day`: rows merged by that period, each with `periods`, how many it merged"), ("format" = Option<String>, Query, description = "`json` (default), `csv` or `arrow`; else the `Accept` header decides (`text/csv`, `application/vnd.apache.arrow.stream`)")),
    responses((status = 200, description = "Rows (`series` of rows with `devices=`), or CSV / Arrow (`device` with `devices=`, `period`, `devices`, `<field>.<agg>`)"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "Unknown table or device")),
    security(("bearer" = []))
)]
async fn rollups(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    p: Params<RollupParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let Path(table) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Read(table.clone())).await?;
    let mut p = p.get()?;
    let format = Format::negotiate(p.format.take().as_deref(), &headers).map_err(ApiError::BadRequest)?;
    let q = parse_rollup_query(p)?;
    if let RollupScope::Devices(devices) = &q.scope {
        within_device_limit(devices.len(), st.limits.max_devices)?;
    }
    let max_bytes = st.limits.max_response_bytes;
    blocking(move || {
        let schema = st.store.schema(&table).ok_or_else(|| ApiError::NotFound(format!("unknown table `{table}`")))?;
        rolled_up_fields(&schema, q.fields.as_deref()).map_err(ApiError::BadRequest)?;
        let (device, group) = match &q.scope {
            RollupScope::Devices(devices) => return device_list_rollups(&st, &table, devices, &q, format, max_bytes),
            RollupScope::Device(d) => (Some(d.as_str()), None),
            RollupScope::Group(g) => (None, Some(g.as_str())),
            RollupScope::Table => (None, None),
        };
        let mut reader = RowReader::new(&q, format, max_bytes);
        reader.read(&st, &table, device, group.unwrap_or_default())?;
        let rows = reader.rows;
        let json = || {
            serde_json::to_vec(&RollupAnswer {
                device,
                group,
                group_level: q.group_level.map(GroupLevel::as_str),
                level: q.level.as_str(),
                rows: JsonRows { rows: &rows, aggs: &q.aggs },
                table: &table,
            })
            .unwrap_or_default()
        };
        let frame = || rollup_frame(&rows, device.is_none(), q.group_level.is_some(), &q.aggs);
        within_size(
            answer(format, json, frame)?,
            max_bytes,
            "ask for a shorter range, fewer fields or fewer aggregates",
        )
    })
    .await
}

/// The roll-ups of several devices (`devices=`): JSON `{"table","devices","level","group_level",
/// "series":[{"device","rows"}]}` in request order, or a frame of every device's rows with a
/// leading `device` column. An unknown device (or one with no data in the table) is a 404.
fn device_list_rollups(
    st: &AppState,
    table: &str,
    devices: &[String],
    q: &RollupQuery,
    format: Format,
    max_bytes: usize,
) -> ApiResult<Response> {
    let mut reader = RowReader::new(q, format, max_bytes);
    let mut ends = Vec::with_capacity(devices.len());
    for device in devices {
        // The series' or rows' device name.
        let name = device.len()
            + match format {
                Format::Json => r#"{"device":"","rows":[]}"#.len(),
                Format::Csv | Format::Arrow => 0,
            };
        let before = reader.rows.len();
        reader.read(st, table, Some(device), "")?;
        let rows = reader.rows.len() - before;
        let names = match format {
            Format::Json => name,
            // A CSV cell and its comma, an Arrow string and its offset, in each row.
            Format::Csv => rows * (name + 1),
            Format::Arrow => rows * (name + 4),
        };
        if reader.count(names).is_break() {
            return Err(reader.over_limit());
        }
        ends.push(reader.rows.len());
    }
    let rows = reader.rows;
    let json = || {
        serde_json::to_vec(&SeriesAnswer {
            devices,
            group_level: q.group_level.map(GroupLevel::as_str),
            level: q.level.as_str(),
            series: JsonSeries { devices, rows: &rows, ends: &ends, aggs: &q.aggs },
            table,
        })
        .unwrap_or_default()
    };
    let frame = || {
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let names: Vec<String> = devices
            .iter()
            .zip(starts.zip(&ends))
            .flat_map(|(d, (from, &to))| std::iter::repeat_n(d.clone(), to - from))
            .collect();
        let mut f = rollup_frame(&rows, false, q.group_level.is_some(), &q.aggs);
        f.columns.insert(0, ("device".into(), Cells::Text(names)));
        f
    };
    within_size(
        answer(format, json, frame)?,
        max_bytes,
        "ask for fewer devices, a shorter range, fewer fields or fewer aggregates",
    )
}

/// Roll-up rows as a frame: `period`, `devices` (group and table rows), `periods` (rows a
/// `group_level` made), then per field (name order) and aggregate (`aggs`, the rows' order) a
/// column `<field>.<agg>`; `first` and `last` are two columns each, `<field>.<agg>_ts` and
/// `<field>.<agg>`.
pub fn rollup_frame(rows: &[RollupRow], with_devices: bool, with_periods: bool, aggs: &[Agg]) -> Frame {
    let mut names: Vec<&str> = rows.iter().flat_map(|r| r.fields.iter().map(|(n, _)| &**n)).collect();
    names.sort_unstable();
    names.dedup();
    let mut f = Frame::default();
    f.push("period", Cells::Timestamp(rows.iter().map(|r| Some(r.period)).collect()));
    if with_devices {
        f.push("devices", Cells::UInt(rows.iter().map(|r| r.devices).collect()));
    }
    if with_periods {
        f.push("periods", Cells::UInt(rows.iter().map(|r| r.periods.map(u64::from)).collect()));
    }
    for name in names {
        for (i, agg) in aggs.iter().enumerate() {
            let cells = || rows.iter().map(move |r| r.field(name).map(|v| v[i]));
            let column = format!("{name}.{}", agg.as_str());
            match agg {
                Agg::Count => f.push(
                    column,
                    Cells::UInt(
                        cells().map(|v| if let Some(AggValue::Count(n)) = v { Some(n) } else { None }).collect(),
                    ),
                ),
                Agg::First | Agg::Last => {
                    let points: Vec<Option<(i64, f64)>> = cells()
                        .map(|v| if let Some(AggValue::Point(t, x)) = v { Some((t, x)) } else { None })
                        .collect();
                    f.push(format!("{column}_ts"), Cells::Timestamp(points.iter().map(|p| p.map(|p| p.0)).collect()));
                    f.push(column, Cells::Float(points.iter().map(|p| p.map(|p| p.1)).collect()));
                }
                _ => f.push(
                    column,
                    Cells::Float(cells().map(|v| if let Some(AggValue::Number(x)) = v { x } else { None }).collect()),
                ),
            }
        }
    }
    f
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterParams {
    limit: Option<String>,
    reason: Option<String>,
    source: Option<String>,
    cursor: Option<String>,
}

/// Prefix of dead-letter cursors (a version: `d1.{received_ms}.{seq}` follows).
const DEAD_LETTER_CURSOR_PREFIX: &str = "d1.";

/// The cursor that resumes a dead-letter listing after the letter `key`.
fn encode_dead_letter_cursor(key: bucketer::keys::DeadLetterKey) -> String {
    format!("{DEAD_LETTER_CURSOR_PREFIX}{}.{}", key.received_ms, key.seq)
}

/// The letter a dead-letter cursor resumes after.
fn parse_dead_letter_cursor(c: &str) -> ApiResult<bucketer::keys::DeadLetterKey> {
    c.strip_prefix(DEAD_LETTER_CURSOR_PREFIX)
        .and_then(|rest| rest.rsplit_once('.'))
        .and_then(|(ms, seq)| {
            Some(bucketer::keys::DeadLetterKey { received_ms: ms.parse().ok()?, seq: seq.parse().ok()? })
        })
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "parameter `cursor`: {c:?} is not a dead-letter cursor; pass back `next_cursor`"
            ))
        })
}

#[utoipa::path(
    get,
    path = "/v1/dead-letters",
    tag = "operations",
    description = "The dead letters, newest first (admin), one page: at most `limit`, from at most 100,000 examined (fewer once they hold 16 MiB), so a page may hold fewer and still have a `next_cursor`. Pass `next_cursor` back as `cursor`, with the same filters, for the next page; null when no letter is left.",
    params(("limit" = Option<String>, Query, description = "1 to 10,000; default 100"), ("reason" = Option<String>, Query, description = "Only this reason, e.g. `invalid_json`"), ("source" = Option<String>, Query, description = "Only sources starting with this, e.g. `hourglass/fleet.readings/` or `kafka:telemetry/3@`"), ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "`{\"dead_letters\": [..], \"next_cursor\"}`"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission")),
    security(("bearer" = []))
)]
async fn dead_letters(
    State(st): State<AppState>,
    p: Params<DeadLetterParams>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    st.allow(&headers, Need::Admin).await?;
    let p = p.get()?;
    let limit = parse_limit(p.limit.as_deref(), 100, MAX_DEAD_LETTERS)?;
    if let Some(reason) = &p.reason {
        if !model::DeadLetterReason::ALL.iter().any(|r| r.as_str() == reason) {
            let known: Vec<&str> = model::DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect();
            return Err(ApiError::BadRequest(format!(
                "parameter `reason`: {reason:?} is not one of {}",
                known.join(", ")
            )));
        }
    }
    let before = p.cursor.as_deref().map(parse_dead_letter_cursor).transpose()?;
    let filter = bucketer::DeadLetterFilter { reason: p.reason, source_prefix: p.source, before };
    blocking(move || {
        let page = st.store.dead_letters_page(&filter, limit)?;
        let rows: Vec<Value> = page
            .letters
            .iter()
            .map(|d| {
                let mut row = json!({
                    "received_ms": d.received_ms,
                    "seq": d.seq,
                    "reason": d.reason,
                    "detail": d.detail,
                    "source": d.source,
                    "payload": String::from_utf8_lossy(&d.payload),
                });
                // The text above replaces what is not UTF-8; the bytes as received, exactly.
                if std::str::from_utf8(&d.payload).is_err() {
                    use base64::Engine as _;
                    row["payload_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(&d.payload));
                }
                row
            })
            .collect();
        let next_cursor = page.next.map(encode_dead_letter_cursor);
        Ok(Json(json!({ "dead_letters": rows, "next_cursor": next_cursor })))
    })
    .await
}

/// A token asked for by `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    /// A name for people; empty when absent.
    pub label: String,
    /// An admin token (every table, and may issue tokens).
    pub admin: bool,
    /// Table → permissions, table-name order.
    pub tables: Vec<(String, Permissions)>,
}

/// Parses the body of `POST /v1/tokens`: `{"label": string, "admin": bool, "tables":
/// {"<table>": "read" | "write" | "read,write"}}`; `admin` false and `tables` empty by
/// default, but a token must be an admin or name a table. Any other key is refused.
pub fn parse_token_request(body: &[u8]) -> Result<TokenRequest, String> {
    const KNOWN: &str = "`label`, `admin`, `tables`";
    let mut obj = json_object(body, KNOWN)?;
    let label = match obj.remove("label") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) if s.len() <= 256 => s,
        // Not echoed whole: a label of megabytes would make an answer of megabytes.
        Some(Value::String(s)) => {
            return Err(format!("`label` must be a string of at most 256 bytes, not one of {} bytes", s.len()))
        }
        Some(other) => return Err(format!("`label` must be a string of at most 256 bytes, not {other}")),
    };
    let admin = match obj.remove("admin") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => return Err(format!("`admin` must be true or false, not {other}")),
    };
    let mut tables = Vec::new();
    match obj.remove("tables") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (table, perm) in m {
                if !valid_table_name(&table) {
                    return Err(format!("`tables`: {table:?} is not a valid table name"));
                }
                let p = match perm.as_str() {
                    Some("read") => Permissions::READ,
                    Some("write") => Permissions::WRITE,
                    Some("read,write") | Some("write,read") => Permissions::READ_WRITE,
                    _ => {
                        return Err(format!(
                            "`tables`: the permission of `{table}` must be \"read\", \"write\" or \"read,write\", not \
                             {perm}"
                        ))
                    }
                };
                tables.push((table, p));
            }
        }
        Some(other) => return Err(format!("`tables` must be an object of table → permission, not {other}")),
    }
    no_other_key(&obj, "a token request", KNOWN)?;
    if !admin && tables.is_empty() {
        return Err("a token must be an admin (`\"admin\": true`) or name tables in `tables`".into());
    }
    // Grants beside admin would read as limits they are not.
    if admin && !tables.is_empty() {
        return Err(
            "an admin token reads and writes every table: give `tables` only to a token that is not an admin".into()
        );
    }
    Ok(TokenRequest { label, admin, tables })
}

/// `POST /v1/tokens` (admin): issues a token. The answer is the only place the token ever
/// appears; the store keeps its hash.
#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "auth",
    description = "Issues a token (admin). Body `{\"label\", \"admin\": bool, \"tables\": {\"<table>\": \"read\"|\"write\"|\"read,write\"}}`; the answer is the only place the token appears.",
    responses((status = 201, description = "`{\"token\",\"id\",\"label\",\"admin\",\"tables\",\"issued_ms\"}`"), (status = 400, description = "Bad parameter or a limit exceeded; `{\"error\"}` names it"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission")),
    security(("bearer" = []))
)]
async fn create_token(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    st.allow(&headers, Need::Admin).await?;
    let body = body.map_err(body_error)?;
    let req = parse_token_request(&body).map_err(ApiError::BadRequest)?;
    blocking(move || {
        let token = crate::auth::new_token();
        let record =
            bucketer::auth::TokenRecord { admin: req.admin, issued_ms: model::now_ms(), label: req.label.clone() };
        let hash = crate::auth::hash_token(&token);
        st.store.put_token(&hash, &record, &req.tables)?;
        let id = token_id(&hash);
        tracing::info!(%id, label = %req.label, admin = req.admin, tables = req.tables.len(), "token issued");
        let mut body = token_json(&hash, &record, &req.tables);
        body["token"] = json!(token);
        Ok((StatusCode::CREATED, Json(body)).into_response())
    })
    .await
}

/// A token's id: the SHA-256 of the token, in hex (what the store keys it by; `printf %s
/// "$TOKEN" | sha256sum` gives it too).
fn token_id(hash: &bucketer::auth::TokenHash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stored token as the API shows it (never the token itself).
fn token_json(hash: &bucketer::auth::TokenHash, record: &bucketer::auth::TokenRecord, grants: &Grants) -> Value {
    let tables: Map<String, Value> = grants.iter().map(|(t, p)| (t.clone(), json!(p.as_str()))).collect();
    json!({
        "id": token_id(hash),
        "label": record.label,
        "admin": record.admin,
        "tables": tables,
        "issued_ms": record.issued_ms,
    })
}

#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "auth",
    description = "The stored tokens (admin), oldest first: each one's id (the SHA-256 of the token, in hex), label, \
        admin flag, grants and time of issue. The tokens themselves are not stored; nor is the configuration's \
        admin token.",
    responses((status = 200, description = "`{\"tokens\":[{\"id\",\"label\",\"admin\",\"tables\",\"issued_ms\"}]}`"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission")),
    security(("bearer" = []))
)]
async fn tokens(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    st.allow(&headers, Need::Admin).await?;
    blocking(move || {
        let mut all = st.store.tokens()?;
        all.sort_by_key(|(hash, record, _)| (record.issued_ms, *hash));
        let listed: Vec<Value> = all.iter().map(|(hash, record, grants)| token_json(hash, record, grants)).collect();
        Ok(Json(json!({ "tokens": listed })))
    })
    .await
}

#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    tag = "auth",
    description = "Revokes a token (admin): every request presenting it is refused from then on (401), and the embedded \
        MQTT broker refuses it at the next connect. Answers the token as listed.",
    params(("id" = String, Path, description = "The token's id (`GET /v1/tokens`)")),
    responses((status = 200, description = "`{\"id\",\"label\",\"admin\",\"tables\",\"issued_ms\"}`"), (status = 400, description = "Not a token id"), (status = 401, description = "Missing or unknown token"), (status = 403, description = "The token lacks the permission"), (status = 404, description = "No token with that id")),
    security(("bearer" = []))
)]
async fn delete_token(
    State(st): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let Path(id) = st.after_auth(&headers, path.map_err(path_error)).await?;
    st.allow(&headers, Need::Admin).await?;
    let hash = parse_token_id(&id).ok_or_else(|| match id.starts_with(crate::auth::TOKEN_PREFIX) {
        // A token pasted for its id: not echoed (answers and their logs would keep the secret).
        true => ApiError::BadRequest(
            "that is a token, not a token id: its id is the SHA-256 of the token in hex (64 hexadecimal digits, as \
             `GET /v1/tokens` lists)"
                .into(),
        ),
        false => {
            ApiError::BadRequest(format!("{id:?} is not a token id (64 hexadecimal digits, as `GET /v1/tokens` lists)"))
        }
    })?;
    blocking(move || match st.store.delete_token(&hash)? {
        Some((record, grants)) => {
            tracing::info!(%id, label = %record.label, "token revoked");
            Ok(Json(token_json(&hash, &record, &grants)))
        }
        None => Err(ApiError::NotFound(format!("no token with id {id}"))),
    })
    .await
}

/// The hash a token id names ([`token_id`]); `None` for anything else.
fn parse_token_id(id: &str) -> Option<bucketer::auth::TokenHash> {
    let bytes = id.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        hash[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(hash)
}

/// `GET /openapi.json`: the OpenAPI document of this contract.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    description = "This document. Open (no token).",
    responses((status = 200, description = "The OpenAPI document"))
)]
async fn openapi() -> Response {
    match crate::openapi::document() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => ApiError::Internal(format!("rendering the OpenAPI document: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A checkpoint's path in an answer is absolute, also under a relative `--data-dir` (it
    /// was relative to the server's working directory).
    #[test]
    fn paths_in_answers_are_absolute() {
        let cwd = std::env::current_dir().unwrap();
        let relative = std::path::Path::new("d10/checkpoints/2026-12-04T19-40-00.000Z");
        assert_eq!(absolute(relative), cwd.join(relative).display().to_string());
        assert_eq!(absolute(std::path::Path::new("/srv/hg/checkpoints")), "/srv/hg/checkpoints");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub/cp")).unwrap();
        let real = std::fs::canonicalize(dir.path().join("sub/cp")).unwrap();
        assert_eq!(absolute(&dir.path().join("sub/../sub/cp")), real.display().to_string());
    }

    fn parse(body: &str) -> Result<TableRequest, String> {
        parse_table_request(body.as_bytes())
    }

    fn req(name: &str, partition: PartitionSize, hot_retention_ms: Option<u64>) -> TableRequest {
        TableRequest {
            name: name.into(),
            partition,
            hot_retention_ms,
            cold_retention_ms: None,
            rollup_retention: RollupRetention::FOREVER,
            strict: false,
            fields: Vec::new(),
        }
    }

    #[test]
    fn no_two_checkpoints_are_given_one_name() {
        let dir = tempfile::tempdir().unwrap();
        let cps = Checkpoints { root: dir.path().to_path_buf(), last_ms: AtomicI64::new(i64::MIN) };
        let names: Vec<String> = [1000, 1000, 999, 4999].into_iter().map(|ms| cps.new_name(ms)).collect();
        assert_eq!(names, [1000, 1001, 1002, 4999].map(checkpoint_name));
        // One there already (the clock set back since): the next free millisecond.
        std::fs::create_dir(dir.path().join(checkpoint_name(5000))).unwrap();
        assert_eq!(cps.new_name(4999), checkpoint_name(5001));
        assert_eq!(cps.new_name(7000), checkpoint_name(7000));
    }

    #[test]
    fn checkpoint_names_give_their_time() {
        // 2026-12-03T14:40:00.123Z.
        let ms = 1_796_308_800_123;
        assert_eq!(checkpoint_name(ms), "2026-12-03T14-40-00.123Z");
        assert_eq!(checkpoint_taken_ms("2026-12-03T14-40-00.123Z"), Some(ms));
        assert_eq!(checkpoint_taken_ms(&checkpoint_name(0)), Some(0));
        for other in [
            "notes",
            "2026-12-03T14:40:00.123Z",
            "2026-12-03T14-40-00.123+",
            "2026-12-03t14-40-00.123Z",
            "2026-13-03T14-40-00.123Z",
            "2026-12-03T14-40-60.123Z",
            "2026-12-03T14-40-00,123Z",
            "2026-12-03T14-é-00.123Z",
        ] {
            assert_eq!(checkpoint_taken_ms(other), None, "{other}");
        }
    }

    #[test]
    fn table_requests_parse() {
        let day = model::DAY_MS as u64;
        assert_eq!(
            parse(r#"{"name":"acme.temp","partition":"hour","hot_retention":"30d"}"#),
            Ok(req("acme.temp", PartitionSize::Hour, Some(30 * day)))
        );
        assert_eq!(
            parse(r#"{"name":"a","partition":"month","hot_retention":3600000}"#),
            Ok(req("a", PartitionSize::Month, Some(3_600_000)))
        );
        assert_eq!(parse(r#"{"name":"a"}"#), Ok(req("a", PartitionSize::Day, None)));
        assert_eq!(parse(r#"{"name":"a","hot_retention":null}"#), Ok(req("a", PartitionSize::Day, None)));
        assert_eq!(
            parse(r#"{"name":"a","hot_retention":"30d","cold_retention":"400d"}"#),
            Ok(TableRequest {
                cold_retention_ms: Some(400 * model::DAY_MS as u64),
                ..req("a", PartitionSize::Day, Some(30 * model::DAY_MS as u64))
            })
        );
        assert_eq!(
            parse(r#"{"name":"a","hour_rollup_retention":"90d","day_rollup_retention":63072000000}"#),
            Ok(TableRequest {
                rollup_retention: RollupRetention { hour_ms: Some(90 * day), day_ms: Some(730 * day) },
                ..req("a", PartitionSize::Day, None)
            })
        );
        assert_eq!(parse(r#"{"name":"a","hour_rollup_retention":null}"#), Ok(req("a", PartitionSize::Day, None)));
        assert_eq!(
            parse(r#"{"name":"a","day_rollup_retention":"2 years"}"#),
            Err("`day_rollup_retention`: \"2 years\" is not a duration (a whole number followed by ms, s, m, h, d or \
                 w, such as \"12h\" or \"30d\") nor a number of milliseconds (JSON, unquoted) from 1 to \
                 9223372036854775807"
                .to_string())
        );
        assert_eq!(
            parse(r#"{"name":"a","cold_retention":"1x"}"#),
            Err("`cold_retention`: \"1x\" is not a duration (a whole number followed by ms, s, m, h, d or w, such as \
                 \"12h\" or \"30d\") nor a number of milliseconds (JSON, unquoted) from 1 to 9223372036854775807"
                .to_string())
        );
        assert_eq!(
            parse(r#"{"name":"a","strict":true,"fields":{"status":"i64","on":"bool","driver":"string","v":"f64"}}"#),
            Ok(TableRequest {
                strict: true,
                fields: vec![
                    ("driver".into(), FieldType::Str),
                    ("on".into(), FieldType::Bool),
                    ("status".into(), FieldType::I64),
                    ("v".into(), FieldType::F64),
                ],
                ..req("a", PartitionSize::Day, None)
            })
        );
        assert_eq!(parse(r#"{"name":"a","strict":false,"fields":{}}"#), Ok(req("a", PartitionSize::Day, None)));
    }

    #[test]
    fn bad_schemas_in_table_requests_say_what_is_wrong() {
        let cases = [
            (r#"{"name":"a","strict":"yes"}"#, r#"`strict` must be true or false, not "yes""#),
            (
                r#"{"name":"a","fields":["x"]}"#,
                r#"`fields` must be an object of field name to type, like {"status":"i64"}, not ["x"]"#,
            ),
            (
                r#"{"name":"a","fields":{"x":"int"}}"#,
                r#"`fields`: the type of "x" must be "f64", "i64", "bool" or "string", not "int""#,
            ),
            (
                r#"{"name":"a","fields":{"x":1}}"#,
                r#"`fields`: the type of "x" must be "f64", "i64", "bool" or "string", not 1"#,
            ),
            (
                r#"{"name":"a","fields":{"ts":"i64"}}"#,
                r#"`fields`: "ts" is not a valid field name (1 to 64 ASCII letters, digits or `_`, not starting with a digit, and none of `ts`, `device`, `period`, `devices`, `periods` (the API answers those beside a reading's or a roll-up's fields))"#,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(parse(body), Err(expected.to_string()), "{body}");
        }
    }

    #[test]
    fn bad_table_requests_say_what_is_wrong() {
        let duration = |v: &str| {
            format!(
                "`hot_retention`: {v} is not a duration (a whole number followed by ms, s, m, h, d or w, such as \
                 \"12h\" or \"30d\") nor a number of milliseconds (JSON, unquoted) from 1 to 9223372036854775807"
            )
        };
        let cases: [(&str, String); 13] = [
            (
                r#"{"name":"bad name!"}"#,
                "`name`: \"bad name!\" is not a valid table name (1 to 64 ASCII letters, digits, `_`, `-` or `.`, \
                 starting with a letter or digit)"
                    .into(),
            ),
            (r#"{"name":7}"#, "`name` must be a string, not 7".into()),
            (r#"{"partition":"day"}"#, "missing `name`".into()),
            (
                r#"{"name":"a","partition":"week"}"#,
                "`partition`: \"week\" is not one of \"hour\", \"day\", \"month\"".into(),
            ),
            (r#"{"name":"a","partition":2}"#, "`partition` must be \"hour\", \"day\" or \"month\", not 2".into()),
            (r#"{"name":"a","hot_retention":"30x"}"#, duration("\"30x\"")),
            (r#"{"name":"a","hot_retention":"0d"}"#, duration("\"0d\"")),
            (r#"{"name":"a","hot_retention":0}"#, duration("0")),
            (r#"{"name":"a","hot_retention":-5}"#, duration("-5")),
            (r#"{"name":"a","hot_retention":1.5}"#, duration("1.5")),
            (
                r#"{"name":"a","retention":"1d"}"#,
                "unknown key `retention`; a table definition has `name`, `partition`, `hot_retention`, `cold_retention`, \
                 `hour_rollup_retention`, `day_rollup_retention`, `strict`, `fields`"
                    .into(),
            ),
            (
                r#"["a"]"#,
                "body must be a JSON object with `name`, `partition`, `hot_retention`, `cold_retention`, \
                 `hour_rollup_retention`, `day_rollup_retention`, `strict`, `fields`"
                    .into(),
            ),
            ("", "body is not JSON: EOF while parsing a value at line 1 column 0".into()),
        ];
        for (body, message) in cases {
            assert_eq!(parse(body), Err(message), "{body}");
        }
    }

    fn rollup_params(pairs: &[(&str, &str)]) -> RollupParams {
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        RollupParams {
            format: None,
            device: get("device"),
            devices: get("devices"),
            group: get("group"),
            level: get("level"),
            from: get("from"),
            to: get("to"),
            fields: get("fields"),
            aggs: get("aggs"),
            group_level: get("group_level"),
        }
    }

    #[test]
    fn rollup_queries_parse_and_bad_ones_say_what_is_wrong() {
        let q = parse_rollup_query(rollup_params(&[
            ("device", "d"),
            ("level", "day"),
            ("from", "0"),
            ("to", "1000"),
            ("fields", "a,,b"),
            ("aggs", "max,count"),
            ("group_level", "month"),
        ]))
        .unwrap();
        assert_eq!(
            q,
            RollupQuery {
                scope: RollupScope::Device("d".into()),
                level: Level::Day,
                range: TimeRange::new(0, 1000).unwrap(),
                fields: Some(vec!["a".into(), "b".into()]),
                aggs: vec![Agg::Count, Agg::Max],
                group_level: Some(GroupLevel::Month),
            }
        );
        let q = parse_rollup_query(rollup_params(&[("device", "d"), ("from", "0"), ("to", "1")])).unwrap();
        assert_eq!((q.level, q.fields, q.aggs, q.group_level), (Level::Hour, None, Agg::ALL.to_vec(), None));
        let scope = |pairs: &[(&str, &str)]| parse_rollup_query(rollup_params(pairs)).map(|q| q.scope).ok();
        assert_eq!(scope(&[("group", "s/l"), ("from", "0"), ("to", "1")]), Some(RollupScope::Group("s/l".into())));
        assert_eq!(scope(&[("from", "0"), ("to", "1")]), Some(RollupScope::Table));
        let q = parse_rollup_query(rollup_params(&[("from", "0"), ("to", "1"), ("aggs", "p99,p50,count")])).unwrap();
        assert_eq!(q.aggs, [Agg::Count, Agg::P50, Agg::P99]);
        // Each case: the parameters that replace or join `device=d&from=0&to=1`, and the
        // message.
        let cases: [(&[(&str, &str)], &str); 9] = [
            (&[("device", "")], "parameter `device` is empty"),
            (&[("group", "g")], "give one of `device`, `devices` and `group`"),
            (&[("level", "week")], "parameter `level`: \"week\" is not one of \"hour\", \"day\", \"month\""),
            (
                &[("aggs", "p98")],
                "parameter `aggs`: \"p98\" is not one of count, sum, min, max, mean, first, last, p50, p90, p95, p99, \
                 p999",
            ),
            (&[("aggs", ",")], "parameter `aggs` names no aggregate"),
            (&[("fields", ",")], "parameter `fields` names no field"),
            (
                &[("group_level", "hour")],
                "parameter `group_level`: \"hour\" is not one of \"year\", \"month\", \"day\"",
            ),
            (&[("to", "0")], "empty range: `from` (0) must be before `to` (0)"),
            (
                &[("level", "month"), ("group_level", "day")],
                "parameter `group_level`: \"day\" is shorter than `level` \"month\" (it groups rows into longer \
                 periods)",
            ),
        ];
        for (extra, message) in cases {
            let mut pairs: Vec<(&str, &str)> = vec![("device", "d"), ("from", "0"), ("to", "1")];
            pairs.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
            pairs.extend(extra.iter().copied());
            match parse_rollup_query(rollup_params(&pairs)) {
                Err(ApiError::BadRequest(m)) => assert_eq!(m, message, "{pairs:?}"),
                other => panic!("{pairs:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn digits_count_the_sign_and_every_digit() {
        let cases = [(0i64, 1), (9, 1), (10, 2), (-1, 2), (-10, 3), (1_704_067_200_000, 13), (i64::MIN, 20)];
        for (n, d) in cases {
            assert_eq!((n, digits(n)), (n, d));
        }
        assert_eq!(digits(u64::MAX), 20);
    }

    /// A field value: finite, of any size, or not finite.
    fn value() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![any::<f64>(), -1e3..1e3f64, Just(0.0), Just(f64::INFINITY), Just(f64::NAN)]
    }

    proptest::proptest! {
        /// What a roll-up answer is counted as it is read never exceeds what the row takes in
        /// JSON and CSV: a refusal for passing the limit is never of an answer within it.
        #[test]
        fn a_rows_counted_bytes_are_at_most_its_bytes_in_json_and_csv(
            points in proptest::collection::vec((proptest::prelude::any::<i64>(), value(), proptest::prelude::any::<bool>()), 1..12),
            period in proptest::prelude::any::<i64>(),
            devices in proptest::prelude::any::<bool>(),
            periods in proptest::option::of(proptest::prelude::any::<u32>()),
        ) {
            let readings: Vec<Reading> =
                points.iter().map(|&(ts, v, t)| Reading::new(ts, vec![((if t { "t" } else { "ünit" }).into(), v)])).collect();
            let mut record = Record::of_readings(&readings);
            if devices {
                let mut group = Record::default();
                group.merge_member(7, &record);
                record = group;
            }
            for aggs in [&Agg::ALL[..], &[Agg::Count], &[Agg::First, Agg::P50]] {
                let mut row = RollupRow::of(period, &record, None, aggs);
                row.periods = periods;
                let json = serde_json::to_vec(&row.json(aggs)).unwrap();
                proptest::prop_assert!(row.min_bytes(Format::Json, aggs) <= json.len(), "{}", String::from_utf8_lossy(&json));
                let csv = rollup_frame(std::slice::from_ref(&row), devices, periods.is_some(), aggs).to_csv();
                let line = csv.split_once('\n').unwrap().1;
                proptest::prop_assert!(row.min_bytes(Format::Csv, aggs) <= line.len(), "{line:?}");
            }
        }
    }

    #[test]
    fn grouped_rows_merge_each_field_and_keep_the_requested_aggregates() {
        let day = model::DAY_MS;
        let a = Record::of_readings(&[Reading::new(5, vec![("t".into(), 1.5)])]);
        let b = Record::of_readings(&[
            Reading::new(day + 5, vec![("t".into(), 2.5)]),
            Reading::new(day + 6, vec![("u".into(), -1.0)]),
        ]);
        let rows = rollup::period::group(vec![(0, a), (day, b)], GroupLevel::Month);
        assert_eq!(rows.len(), 1);
        let aggs = [Agg::Count, Agg::Sum, Agg::Last, Agg::P999];
        let j = rollup_row_json(rows[0].0, &rows[0].1, Some(&["t".to_string()]), &aggs);
        let p999 = rows[0].1.fields["t"].quantiles.as_ref().unwrap().quantile(0.999).unwrap();
        // Rank ⌊0.999 · (2 − 1)⌋ = 0 of {1.5, 2.5}: 1.5, within 1 %.
        assert!((p999 - 1.5).abs() <= 0.015, "{p999}");
        assert_eq!(
            j,
            json!({"period": 0, "t": {"count": 2, "sum": 4.0, "last": {"ts": day + 5, "value": 2.5}, "p999": p999}})
        );
        let mut group = Record::default();
        group.merge_member(1, &rows[0].1);
        group.merge_member(2, &rows[0].1);
        let mut no_sketch = rows[0].1.clone();
        no_sketch.fields.get_mut("u").unwrap().quantiles = None;
        group.merge(&no_sketch);
        let j = rollup_row_json(0, &group, Some(&["u".to_string()]), &[Agg::Count, Agg::P50]);
        assert_eq!(j, json!({"period": 0, "devices": 2, "u": {"count": 3, "p50": null}}));
    }

    #[test]
    fn readings_render_typed_values() {
        let r = Reading::new(
            5,
            vec![
                ("big".into(), model::Value::I64(9_007_199_254_740_993)),
                ("driver".into(), model::Value::from("Zoë")),
                ("nan".into(), model::Value::F64(f64::NAN)),
                ("on".into(), model::Value::Bool(true)),
                ("temp".into(), model::Value::F64(21.5)),
            ],
        );
        let text = serde_json::to_string(&reading_json(&r)).unwrap();
        assert_eq!(text, r#"{"big":9007199254740993,"driver":"Zoë","nan":null,"on":true,"temp":21.5,"ts":5}"#);
    }

    #[test]
    fn table_definitions_show_the_schema() {
        let mut schema = bucketer::schema::Schema { strict: true, ..Default::default() };
        schema.add("status".into(), FieldType::I64, 1);
        schema.add("driver".into(), FieldType::Str, 2);
        schema.version = 2;
        let def = TableDefinition {
            name: "t".into(),
            id: 7,
            partition: PartitionSize::Hour,
            hot_retention_ms: Some(3_600_000),
            cold_retention_ms: Some(7_200_000),
            rollup_retention: RollupRetention { hour_ms: Some(86_400_000), day_ms: None },
            rollup_floor: bucketer::RollupFloor { hour_ms: 1_709_874_000_000, day_ms: i64::MIN },
            schema,
        };
        assert_eq!(
            definition_json(&def, false),
            json!({
                "name": "t", "id": 7, "partition": "hour", "hot_retention_ms": 3_600_000,
                "cold_retention_ms": 7_200_000, "hour_rollup_retention_ms": 86_400_000,
                "day_rollup_retention_ms": null, "hour_rollup_floor_ms": 1_709_874_000_000_i64,
                "day_rollup_floor_ms": null, "strict": true,
                "schema_version": 2,
                "fields": [
                    {"name": "driver", "type": "string", "since_version": 2},
                    {"name": "status", "type": "i64", "since_version": 1},
                ],
                "store_archive": false,
            })
        );
    }

    #[test]
    fn device_requests_parse_and_refuse_unknown_keys() {
        let parse = |b: &str| parse_device_request(b.as_bytes());
        assert_eq!(
            parse(r#"{"kind":"pump","tags":{"a":"1"},"parent":"s/l"}"#),
            Ok(DeviceRequest {
                kind: Some("pump".into()),
                tags: [("a".to_string(), "1".to_string())].into_iter().collect(),
                parent: Some("s/l".into()),
            })
        );
        assert_eq!(parse(r#"{}"#), Ok(DeviceRequest::default()));
        assert_eq!(parse(r#"{"kind":null,"tags":null,"parent":null}"#), Ok(DeviceRequest::default()));
        assert_eq!(
            parse(r#"{"kind":"a","colour":"red"}"#),
            Err("unknown key `colour`; a device update has `kind`, `tags`, `parent`".into())
        );
        assert_eq!(parse(r#"{"kind":3}"#), Err("`kind` must be a string or null, not 3".into()));
        assert_eq!(parse(r#"{"tags":{"a":1}}"#), Err("tag `a` must have a string value, not 1".into()));
        assert_eq!(parse(r#"{"tags":["a"]}"#), Err("`tags` must be an object of strings, not [\"a\"]".into()));
        assert_eq!(parse(r#"[1]"#), Err("body must be a JSON object with `kind`, `tags`, `parent`".into()));
        assert_eq!(parse_tag_param("k:v:w").ok(), Some(("k".into(), "v:w".into())));
        assert!(parse_tag_param("k").is_err());
        assert!(parse_tag_param(":v").is_err());
        assert!(parse_tag_param("k:").is_err());
    }

    #[test]
    fn cursors_and_page_sizes_parse_and_bad_ones_say_what_is_wrong() {
        let range = TimeRange::new(100, 200).unwrap();
        assert_eq!(parse_cursor(&encode_cursor(150), range).unwrap(), 150);
        assert_eq!(parse_cursor("r1.100", range).unwrap(), 100);
        for bad in ["r1.200", "r1.99", "150", "r2.150", "r1.x"] {
            match parse_cursor(bad, range) {
                Err(ApiError::BadRequest(m)) => assert!(m.starts_with(&format!("parameter `cursor`: {bad:?}")), "{m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(parse_page_rows(None, 50).unwrap(), 50);
        assert_eq!(parse_page_rows(Some("7"), 50).unwrap(), 7);
        let message = |v: &str| match parse_page_rows(Some(v), 50) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(
            message("51"),
            "parameter `limit`: 51 readings per page is above the limit of 50 (query.max_page_rows); follow \
             `next_cursor` for more"
        );
        assert_eq!(message("0"), "parameter `limit`: \"0\" is not a whole number from 1 to 50");
        assert_eq!(message("-1"), "parameter `limit`: \"-1\" is not a whole number from 1 to 50");
    }

    #[test]
    fn token_requests_parse_and_bad_ones_say_what_is_wrong() {
        let parse = |b: &str| parse_token_request(b.as_bytes());
        assert_eq!(
            parse(r#"{"label":"l","tables":{"b.t":"read,write","a":"write"}}"#),
            Ok(TokenRequest {
                label: "l".into(),
                admin: false,
                tables: vec![("a".into(), Permissions::WRITE), ("b.t".into(), Permissions::READ_WRITE)],
            })
        );
        assert_eq!(parse(r#"{"admin":true}"#), Ok(TokenRequest { label: String::new(), admin: true, tables: vec![] }));
        assert_eq!(
            parse(r#"{"tables":{"bad name":"read"}}"#),
            Err("`tables`: \"bad name\" is not a valid table name".into())
        );
        assert_eq!(parse(r#"{"admin":1}"#), Err("`admin` must be true or false, not 1".into()));
        // A label too long is not echoed.
        let long = format!(r#"{{"admin":true,"label":"{}"}}"#, "x".repeat(300));
        assert_eq!(parse(&long), Err("`label` must be a string of at most 256 bytes, not one of 300 bytes".into()));
        assert_eq!(
            parse(r#"{"admin":true,"scope":"x"}"#),
            Err("unknown key `scope`; a token request has `label`, `admin`, `tables`".into())
        );
        assert!(parse("[]").is_err());
        assert_eq!(
            parse(r#"{"admin":true,"tables":{"t":"read"}}"#),
            Err("an admin token reads and writes every table: give `tables` only to a token that is not an admin"
                .into())
        );
    }

    #[test]
    fn store_refusals_are_client_errors() {
        let settings = bucketer::catalog::Settings {
            partition: PartitionSize::Day,
            hot_retention_ms: None,
            cold_retention_ms: None,
            strict: false,
        };
        let exists = bucketer::Error::TableExists { name: "t".into(), existing: settings, requested: settings };
        assert_eq!(ApiError::Storage(exists).status(), StatusCode::CONFLICT);
        let invalid = bucketer::Error::InvalidTable { name: "t".into(), detail: "x".into() };
        assert_eq!(ApiError::Storage(invalid).status(), StatusCode::BAD_REQUEST);
        let conflict = bucketer::Error::SchemaConflict {
            table: "t".into(),
            field: "f".into(),
            existing: FieldType::I64,
            requested: FieldType::F64,
        };
        assert_eq!(ApiError::Storage(conflict).status(), StatusCode::CONFLICT);
        let bad_path = bucketer::Error::InvalidRegistryInput("bad path".into());
        assert_eq!(ApiError::Storage(bad_path).status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            ApiError::Storage(bucketer::Error::IdsExhausted("table")).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
