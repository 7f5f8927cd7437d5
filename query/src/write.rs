//! `POST /write` and `POST /api/v2/write`: InfluxDB's write API, so that Telegraf, InfluxDB
//! client libraries and line-protocol loaders can write to Hourglass as they would to
//! InfluxDB.
//!
//! The body is line protocol (`Content-Encoding: gzip` or none), at most
//! [`MAX_WRITE_BODY_BYTES`] before and after decompression. Each line's measurement is the
//! table, its tag `name` (else `device`) the device, its other tags the device's tags, as on
//! the MQTT and Kafka line-protocol paths ([`ingest::lpwire`]). `precision` (`ns` — the default
//! —, `us`, `ms`, `s`; InfluxDB 1's `n`, `u`, `m` and `h` too) is the unit of the timestamps; a line
//! without one takes the receive time. `db`, `rp`, `bucket`, `org` and the other parameters of
//! InfluxDB's API are accepted and ignored: the measurement names the table.
//!
//! Needs write permission on every table the body writes to (a token, `Authorization: Bearer`
//! or `Token`), checked before anything is stored; a token that may write no table is refused
//! before the body is read, so it cannot fill the dead letters with lines naming none. The answer comes once the batch is
//! committed ([`ingest::http::HttpIntake::submit`]):
//!
//! | status | when |
//! |---|---|
//! | 204 | every line stored |
//! | 400 | `{"error": "partial write: …"}`: some lines rejected, or values refused by their table's schema (kept as dead letters, `/v1/dead-letters`), the rest stored (`nothing stored: …` when no reading was); or a bad `precision`; or a body that cannot be read whole (cut short, a malformed chunked encoding: nothing stored) |
//! | 401 / 403 | no usable token / a table the token may not write (nothing stored) |
//! | 413 | the body (or its decompressed form) is larger than [`MAX_WRITE_BODY_BYTES`] |
//! | 415 | a `Content-Encoding` other than `gzip` or `identity` |
//! | 503 | the service takes no writes (shutting down, or no intake in this process) |
//!
//! `POST /query` answers InfluxDB 1's `CREATE DATABASE`, which Telegraf's InfluxDB output and
//! InfluxDB 1 clients send before writing (Telegraf again before each write until it succeeds,
//! with a warning each time), as done: a database is nothing to create here. Any other
//! statement is refused (400): InfluxQL is not read; reads are under `/v1`.

use std::io::Read;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use ingest::http::IntakeError;
use ingest::lineproto::Precision;
use serde::Deserialize;

use crate::api::{blocking, ApiError, ApiResult, AppState, Params};
use crate::auth::{Caller, Need};

/// Largest write body, compressed or not: InfluxDB's default `max-body-size` (25 MB).
pub const MAX_WRITE_BODY_BYTES: usize = 25_000_000;

/// The query parameters of a write that Hourglass reads; InfluxDB's others are ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct WriteParams {
    precision: Option<String>,
    /// InfluxDB 1's password parameter: the token, for a request without an `Authorization`
    /// header.
    p: Option<String>,
}

/// The parameters of `POST /query` that Hourglass reads, from the query string or the form body.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct QueryParams {
    /// The InfluxQL statement.
    q: Option<String>,
    /// As a write's `p`: the token.
    p: Option<String>,
}

/// Largest form body of `POST /query`.
const MAX_QUERY_BODY_BYTES: usize = 64 << 10;

/// `POST /query` (InfluxDB 1): see the module docs.
#[utoipa::path(
    post,
    path = "/query",
    tag = "write",
    description = "InfluxDB 1's query endpoint, for the `CREATE DATABASE` that Telegraf and InfluxDB 1 clients send \
        before writing: answered `{\"results\":[{\"statement_id\":0}]}` (a database is nothing to create: a line's \
        measurement names its table). `q` in the query string or a form body. Other statements: 400 (InfluxQL is \
        not read; reads are under /v1). Write permission on some table, as for `POST /write`.",
    params(("q" = Option<String>, Query, description = "The statement: CREATE DATABASE …")),
    responses(
        (status = 200, description = "`{\"results\":[{\"statement_id\":0}]}`"),
        (status = 400, description = "Not a CREATE DATABASE statement"),
        (status = 401, description = "Missing or unknown token"),
        (status = 403, description = "The token may write no table"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn query_v1(
    State(st): State<AppState>,
    params: Params<QueryParams>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let params = params.get();
    let headers = with_password(headers, params.as_ref().ok().and_then(|p| p.p.as_deref()));
    st.allow(&headers, Need::AnyWrite).await?;
    let mut params = params?;
    if params.q.is_none() {
        let body = body_bytes(&headers, body, MAX_QUERY_BODY_BYTES).await?;
        let form: QueryParams = serde_urlencoded::from_bytes(&body)
            .map_err(|e| ApiError::BadRequest(format!("the body is no form (`q=…`): {e}")))?;
        params.q = form.q;
    }
    let q = params.q.ok_or_else(|| ApiError::BadRequest("no statement: `q` is missing".into()))?;
    if is_create_database(&q) {
        Ok(axum::Json(serde_json::json!({"results": [{"statement_id": 0}]})).into_response())
    } else {
        Err(ApiError::BadRequest(format!(
            "only CREATE DATABASE is answered here (as done: a line's measurement names its table); InfluxQL is not \
             read, reads are under /v1 (GET /openapi.json): got `{}`",
            q.chars().take(200).collect::<String>()
        )))
    }
}

/// Whether `q` is one `CREATE DATABASE …` statement (any case, a trailing `;` allowed).
fn is_create_database(q: &str) -> bool {
    let q = q.trim().trim_end_matches(';');
    let mut words = q.split_whitespace();
    let create = words.next().is_some_and(|w| w.eq_ignore_ascii_case("create"));
    let database = words.next().is_some_and(|w| w.eq_ignore_ascii_case("database"));
    create && database && words.next().is_some() && !q.contains(';')
}

/// `headers` with InfluxDB 1's password parameter (`p`, the token) as their `Authorization`,
/// unless they have one.
fn with_password(mut headers: HeaderMap, password: Option<&str>) -> HeaderMap {
    if let Some(token) = password.filter(|_| !headers.contains_key(header::AUTHORIZATION)) {
        // A value no header can hold is no token: the request stays without one.
        if let Ok(value) = HeaderValue::try_from(format!("Token {token}")) {
            headers.insert(header::AUTHORIZATION, value);
        }
    }
    headers
}

/// The precision a write names: InfluxDB 2's `ns`, `us`, `ms`, `s`, and InfluxDB 1's `n`, `u`,
/// `m`, `h`.
fn precision(p: Option<&str>) -> ApiResult<Precision> {
    // Every label of `Precision` (InfluxDB 1's `m` and `h` among them), and InfluxDB 1's own
    // names of the finer two.
    match p.unwrap_or("ns") {
        "n" => Ok(Precision::Nanoseconds),
        "u" => Ok(Precision::Microseconds),
        label => Precision::parse(label).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "precision `{label}` is not supported: one of ns (the default), us, ms, s, or InfluxDB 1's n, u, m, h"
            ))
        }),
    }
}

/// Reads the body, at most `limit` bytes; a larger one is a 413.
async fn body_bytes(headers: &HeaderMap, mut body: Body, limit: usize) -> ApiResult<Vec<u8>> {
    let too_large = || ApiError::TooLarge(format!("the write body is larger than {limit} bytes; send smaller batches"));
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // Read into one buffer of the declared size: collecting the body's chunks and then joining
    // them grew a vector by doubling (copies, and fresh pages for each size) on every request.
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) if crate::server::is_read_timeout(&e) => return Err(crate::api::body_timeout()),
            // Cut short (the client closed its side) or a malformed chunked encoding: said as
            // such (it was a 413, "larger than", for an 80-byte body: QA60 F1).
            Err(e) => {
                let cause = std::error::Error::source(&e).map_or(e.to_string(), |c| format!("{e}: {c}"));
                return Err(ApiError::BadRequest(format!(
                    "the write body could not be read whole ({cause}): cut short, or a malformed chunked encoding"
                )));
            }
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// The body decompressed as its `Content-Encoding` says, at most `limit` bytes.
fn decompressed(encoding: Option<&str>, body: Vec<u8>, limit: usize) -> ApiResult<Vec<u8>> {
    match encoding.map(str::trim) {
        None | Some("") => Ok(body),
        Some(e) if e.eq_ignore_ascii_case("identity") => Ok(body),
        // `x-gzip` is HTTP/1.1's older name for gzip (RFC 9110, 8.4.1.3).
        Some(e) if e.eq_ignore_ascii_case("gzip") || e.eq_ignore_ascii_case("x-gzip") => {
            let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
            // Every member (a body may be gzip files one after another, as `cat a.gz b.gz` makes and
            // gzip readers read: a single-member decoder stopped at the first, the rest answered
            // 204 and never stored); bytes after the last member that are not one are refused.
            let mut reader = flate2::read::MultiGzDecoder::new(body.as_slice()).take(limit as u64 + 1);
            reader
                .read_to_end(&mut out)
                .map_err(|e| ApiError::BadRequest(format!("the gzip body cannot be decompressed: {e}")))?;
            if out.len() > limit {
                return Err(ApiError::TooLarge(format!(
                    "the decompressed write body is larger than {limit} bytes; send smaller batches"
                )));
            }
            Ok(out)
        }
        Some(other) => {
            Err(ApiError::Unsupported(format!("Content-Encoding `{other}` is not supported: gzip or identity")))
        }
    }
}

/// What a committed batch with dead letters tells the writer: a partial write when some
/// readings were stored (counted by line: lines of one device and time replace each other in
/// the store), else that none was; the lines the decoder rejected, then the store's
/// refusals by a table's schema (a letter each: a value of a wrong type, a field a strict
/// table lacks, or a reading's fields past a full table's limit; a line's other fields are
/// stored).
fn partial_write(batch_readings: usize, lines: &[model::DeadLetter], refused: &[model::DeadLetter]) -> String {
    // The store's refusals name no line: the first rejected line is named as such, not as the
    // first problem of the body (QA46 F3).
    let first = match (lines.first(), refused.first()) {
        (Some(line), _) => format!("first rejected line: {}", line.detail),
        (None, Some(refusal)) => format!("first refusal: {}", refusal.detail),
        (None, None) => String::new(),
    };
    let what = if batch_readings == 0 { "nothing stored" } else { "partial write" };
    let mut counts = Vec::new();
    if !lines.is_empty() {
        counts.push(format!("{} line(s) rejected or stored in part", lines.len()));
    }
    if !refused.is_empty() {
        counts.push(format!("{} refusal(s) of values by their table's schema", refused.len()));
    }
    format!(
        "{what}: {} and kept as dead letters (GET /v1/dead-letters), {batch_readings} line(s) stored; {first}",
        counts.join(", ")
    )
}

/// The answers of both write routes, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Only its derived description is used.
enum WriteResponses {
    #[response(status = 204, description = "Every line stored")]
    Stored,
    #[response(
        status = 400,
        description = "`{\"error\": \"partial write: ...\"}`: some lines rejected (dead letters), the others stored; or a bad `precision`"
    )]
    Partial,
    #[response(status = 401, description = "Missing or unknown token")]
    Unauthorized,
    #[response(status = 403, description = "The token may not write a table of the body; nothing stored")]
    Forbidden,
    #[response(status = 413, description = "Body over 25 MB (compressed or not)")]
    TooLarge,
    #[response(status = 415, description = "Content-Encoding other than gzip or identity")]
    Unsupported,
    #[response(status = 503, description = "Not taking writes (shutting down, or the store's commits failing)")]
    Unavailable,
}

/// `POST /write` (InfluxDB 1): see the module docs.
#[utoipa::path(
    post,
    path = "/write",
    tag = "write",
    description = "InfluxDB 1 write API. Body: line protocol (`Content-Encoding: gzip` or none, at most 25 MB); each \
        measurement is a table, tag `name` (else `device`) the device, other tags the device's tags. Query \
        `precision` = ns (default), us, ms, s (or n, u, m, h); `db`, `rp`, `u`, `consistency` are ignored. Write \
        permission on every table of the body (`Authorization: Bearer`, `Token`, or `Basic` with the token as the \
        password; or the token as `p`). Answered once committed.",
    params(("precision" = Option<String>, Query, description = "Unit of the timestamps: ns (default), us, ms, s, or n, u, m, h")),
    responses(WriteResponses),
    security(("bearer" = []))
)]
pub(crate) async fn write_v1(
    st: State<AppState>,
    params: Params<WriteParams>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    write(st, params, headers, body).await
}

/// `POST /api/v2/write` (InfluxDB 2): the same as `/write`.
#[utoipa::path(
    post,
    path = "/api/v2/write",
    tag = "write",
    description = "InfluxDB 2 write API: as `POST /write`; `org` and `bucket` are ignored (the measurement names the table).",
    params(("precision" = Option<String>, Query, description = "Unit of the timestamps: ns (default), us, ms, s")),
    responses(WriteResponses),
    security(("bearer" = []))
)]
pub(crate) async fn write_v2(
    st: State<AppState>,
    params: Params<WriteParams>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    write(st, params, headers, body).await
}

/// Both write routes.
async fn write(
    State(st): State<AppState>,
    params: Params<WriteParams>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let intake =
        st.intake().ok_or_else(|| ApiError::Unavailable("this service takes no writes (query only)".into()))?;
    // InfluxDB 1's clients may send the password (the token) as `p` instead of a header.
    let params = params.get();
    let headers = with_password(headers, params.as_ref().ok().and_then(|p| p.p.as_deref()));
    // A caller that may write no table is turned away before its body is read and decoded (or
    // its bad lines would be kept as dead letters).
    let caller = st.allow(&headers, Need::AnyWrite).await?;
    // While the store's commits fail (a full disk), a write would wait unanswered until one
    // succeeds or a stop gives it up (a client's timeout came first): refused at once.
    let failing = st.store_stats().commit_failures_in_a_row.load(std::sync::atomic::Ordering::Relaxed);
    if failing > 0 {
        return Err(ApiError::Unavailable(format!(
            "the store's commits are failing ({failing} attempts in a row; /ready and the log say why): nothing is \
             stored until one succeeds; retry later"
        )));
    }
    let precision = precision(params?.precision.as_deref())?;
    let body = body_bytes(&headers, body, MAX_WRITE_BODY_BYTES).await?;
    let encoding = headers.get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("?").to_string());
    let decoder = intake.clone();
    let (mut batch, bytes) = blocking(move || {
        let body = decompressed(encoding.as_deref(), body, MAX_WRITE_BODY_BYTES)?;
        Ok((decoder.decode(&body, precision), body.len()))
    })
    .await?;
    // `decode` counted the body as one message of each table it writes to: those are the tables.
    let tables: Vec<String> = batch.messages.iter().map(|(table, _)| table.to_string()).collect();
    for table in tables {
        if let Err(refused) = st.allow(&headers, Need::Write(table)).await {
            intake.discard(batch);
            return Err(refused);
        }
    }
    // A token's tag reports are checked against the tables of their devices (admins' and, with
    // auth off, anyone's are taken as they are).
    if matches!(caller, Caller::Token(_)) && !batch.device_tags.is_empty() {
        let tags = std::mem::take(&mut batch.device_tags);
        let (state, hdrs) = (st.clone(), headers.clone());
        let (kept, left_out) = match blocking(move || state.reportable_tags(&caller, &hdrs, tags)).await {
            Ok(checked) => checked,
            Err(e) => {
                // Not stored: its tag reports are forgotten with it.
                intake.discard(batch);
                return Err(e);
            }
        };
        batch.device_tags = kept;
        if !left_out.is_empty() {
            let devices: Vec<std::sync::Arc<str>> = left_out.iter().map(|(d, _)| d.clone()).collect();
            intake.report_again(&devices);
        }
        // Said once a minute for the same table: a client sends the same tags with every body.
        static SAID: std::sync::LazyLock<std::sync::Mutex<ingest::quiet::Quieter>> =
            std::sync::LazyLock::new(|| std::sync::Mutex::new(ingest::quiet::Quieter::every(Duration::from_secs(60))));
        let first = left_out.first();
        let admitted = first.and_then(|(_, table)| {
            SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(table, Instant::now())
        });
        if let (Some((device, table)), Some(repeats)) = (first, admitted) {
            tracing::warn!(
                devices = left_out.len(), %device, %table, bodies_not_said = repeats,
                "tags a /write reported were not taken: the device also has data in a table this token may not \
                 write (its record is shared by every table it is in, as PUT …/devices/{{device}} says); the \
                 readings are stored"
            );
        }
    }
    intake.count_taken(&batch, bytes);
    let letters = batch.dead_letters.clone();
    let committed = intake.submit(batch).await.map_err(|e| match e {
        IntakeError::Closed => ApiError::Unavailable(e.to_string()),
        IntakeError::NotStored => ApiError::Internal(e.to_string()),
    })?;
    // And the values the store refused (a table's schema: a field of another type, or unknown
    // to a strict table), committed as dead letters with the batch.
    if letters.is_empty() && committed.rejected.is_empty() {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::BadRequest(partial_write(committed.readings, &letters, &committed.rejected)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;

    use super::*;

    #[test]
    fn precisions_of_both_api_versions_are_read_and_others_refused() {
        let ok = |p: Option<&str>| precision(p).unwrap();
        assert_eq!(ok(None), Precision::Nanoseconds);
        assert_eq!([ok(Some("n")), ok(Some("ns"))], [Precision::Nanoseconds; 2]);
        assert_eq!([ok(Some("u")), ok(Some("us"))], [Precision::Microseconds; 2]);
        assert_eq!(ok(Some("ms")), Precision::Milliseconds);
        assert_eq!(ok(Some("s")), Precision::Seconds);
        assert_eq!([ok(Some("m")), ok(Some("h"))], [Precision::Minutes, Precision::Hours]);
        let err = precision(Some("d")).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("precision `d`"), "{err}");
    }

    #[test]
    fn an_answer_with_dead_letters_says_whether_anything_was_stored() {
        let letter = |detail: &str| model::DeadLetter {
            received_ms: 0,
            reason: model::DeadLetterReason::InvalidLineProtocol,
            detail: detail.to_string(),
            source: "http".to_string(),
            payload: Vec::new(),
        };
        let letters = [letter("line 2: bad"), letter("line 5: worse")];
        assert_eq!(
            partial_write(3, &letters, &[]),
            "partial write: 2 line(s) rejected or stored in part and kept as dead letters (GET /v1/dead-letters), 3 line(s) stored; \
             first rejected line: line 2: bad"
        );
        assert_eq!(
            partial_write(0, &letters[1..], &[]),
            "nothing stored: 1 line(s) rejected or stored in part and kept as dead letters (GET /v1/dead-letters), 0 line(s) stored; \
             first rejected line: line 5: worse"
        );
        let refused = [letter("field `a`"), letter("field `b`")];
        assert_eq!(
            partial_write(1, &letters[1..], &refused),
            "partial write: 1 line(s) rejected or stored in part, 2 refusal(s) of values by their table's schema and kept as dead letters \
             (GET /v1/dead-letters), 1 line(s) stored; first rejected line: line 5: worse"
        );
        assert_eq!(
            partial_write(1, &[], &refused),
            "partial write: 2 refusal(s) of values by their table's schema and kept as dead letters (GET \
             /v1/dead-letters), 1 line(s) stored; first refusal: field `a`"
        );
    }

    #[test]
    fn create_database_is_told_from_other_statements() {
        for q in ["CREATE DATABASE \"telegraf\"", "create database iot;", "  Create  Database x WITH DURATION 1d "] {
            assert!(is_create_database(q), "{q}");
        }
        for q in ["", "CREATE DATABASE", "SHOW DATABASES", "CREATE DATABASE a; DROP DATABASE b", "DROP DATABASE a"] {
            assert!(!is_create_database(q), "{q}");
        }
    }

    #[test]
    fn gzip_bodies_are_decompressed_within_the_limit() {
        let text = b"cpu,name=a v=1 1\n".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(decompressed(Some("gzip"), gz.clone(), text.len()).unwrap(), text);
        assert_eq!(decompressed(Some("GZIP"), gz.clone(), text.len()).unwrap(), text);
        assert_eq!(decompressed(Some("x-gzip"), gz.clone(), text.len()).unwrap(), text);
        assert_eq!(
            decompressed(Some("gzip"), gz.clone(), text.len() - 1).unwrap_err().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(decompressed(None, text.clone(), 0).unwrap(), text);
        assert_eq!(decompressed(Some("identity"), text.clone(), 0).unwrap(), text);
        assert_eq!(decompressed(Some("gzip"), text.clone(), 1 << 20).unwrap_err().status(), StatusCode::BAD_REQUEST);
        // Two members, one after the other: both, within the limit counted over both.
        let two = [gz.clone(), gz.clone()].concat();
        assert_eq!(decompressed(Some("gzip"), two.clone(), 2 * text.len()).unwrap(), text.repeat(2));
        assert_eq!(
            decompressed(Some("gzip"), two, 2 * text.len() - 1).unwrap_err().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        // Bytes after a member that are not another are refused, not dropped.
        let trailing = [gz, b"garbage after the member".to_vec()].concat();
        assert_eq!(decompressed(Some("gzip"), trailing, 1 << 20).unwrap_err().status(), StatusCode::BAD_REQUEST);
        assert_eq!(decompressed(Some("br"), text, 1 << 20).unwrap_err().status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
