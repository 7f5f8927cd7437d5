//! The process's logging: `RUST_LOG` (default `info`, the MQTT crates at `warn`), text or JSON
//! lines on stderr, without the embedded broker's errors that are not errors nor its span of
//! each PUBLISH packet; and the embedded broker's read-cursor jumps noted for its alert watcher
//! ([`CursorJumps`]; rumqttd logs them as warnings, which the default `RUST_LOG` keeps).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the global subscriber.
pub(crate) fn init(json: bool) {
    let (filter, unread) = match EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        // Set but not a filter: said once the subscriber is up, not ignored in silence.
        Err(e) => (EnvFilter::new(DEFAULT_FILTER), std::env::var_os("RUST_LOG").map(|v| (v, e))),
    };
    // Colours on a terminal only, and not with `NO_COLOR`: in a file or a pipe (`nohup`, CI,
    // systemd's journal) their escapes garbled every line (QA50 L5).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let format = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let format = if json { format.json().boxed() } else { format.boxed() };
    // The filter is the whole subscriber's (a layer without one would enable every span of
    // every crate): a `RUST_LOG` that hides rumqttd's warnings hides its cursor jumps too.
    tracing_subscriber::registry()
        .with(filter)
        .with(BrokerNoise)
        .with(cursor_jump_layer(global_cursor_jumps()))
        .with(format)
        .init();
    // A level misspelt reads as a target ("warning": everything of a crate of that name), so
    // the filter lets nothing through, this warning included: said on stderr as it is.
    if let Some(value) = std::env::var_os("RUST_LOG") {
        for word in misspelt_levels(&value.to_string_lossy()) {
            eprintln!(
                "hourglass: RUST_LOG names `{word}`, which is read as a module to log, not as a level (error, warn, \
                 info, debug, trace, off): nothing else may be logged"
            );
        }
    }
    if let Some((value, e)) = unread {
        tracing::warn!(
            rust_log = %value.to_string_lossy(),
            error = %e,
            "RUST_LOG is not a filter that can be read (such as \"info\" or \"warn,ingest=debug\"): logging at \"{DEFAULT_FILTER}\""
        );
    }
}

/// The directives of a `RUST_LOG` that look like a level but are none (`warning`, `infoo`,
/// `err`): a bare word is a target to the filter.
fn misspelt_levels(rust_log: &str) -> Vec<String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    rust_log
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !d.contains(['=', '[', ':']))
        .filter(|d| {
            let lower = d.to_ascii_lowercase();
            !LEVELS.contains(&lower.as_str())
                && LEVELS.iter().any(|l| lower.starts_with(l) || (lower.len() >= 3 && l.starts_with(lower.as_str())))
        })
        .map(str::to_string)
        .collect()
}

/// The filter without a `RUST_LOG`.
const DEFAULT_FILTER: &str = "info,rumqttd=warn,rumqttc=warn";

/// The process's [`CursorJumps`], once [`init`] (or a test) has installed a subscriber that
/// notes them; `None` before, when the broker's alert watcher cannot tell a skip's loss.
pub(crate) fn cursor_jumps() -> Option<&'static Arc<CursorJumps>> {
    CURSOR_JUMPS.get()
}

/// Set with the subscriber that notes into it.
static CURSOR_JUMPS: OnceLock<Arc<CursorJumps>> = OnceLock::new();

fn global_cursor_jumps() -> Arc<CursorJumps> {
    CURSOR_JUMPS.get_or_init(Arc::default).clone()
}

/// Installs, for the unit tests of the broker's alerts, a global subscriber that notes cursor
/// jumps and prints nothing (the tests of a binary share one process: the first call installs).
#[cfg(test)]
pub(crate) fn note_cursor_jumps_in_tests() -> &'static Arc<CursorJumps> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| tracing_subscriber::registry().with(cursor_jump_layer(global_cursor_jumps())).init());
    cursor_jumps().expect("set above")
}

/// The target of rumqttd's router, which logs a read-cursor jump.
const BROKER_ROUTER: &str = "rumqttd::router::routing";

/// How long a noted jump waits for its alert: the router sends its alerts every second; a jump
/// older than this had its alert dropped (rumqttd keeps 99 a second) or was another broker's.
const JUMP_ALERT_WAIT: Duration = Duration::from_secs(10);

/// The embedded broker's read-cursor jumps, in the order its router made them: for each, the
/// topic filter and how many messages it skipped. rumqttd 0.20 alerts a jump ("cursor_jump")
/// without saying whether anything was lost; the `warn!` it logs just before holds the read
/// cursor asked for and the one it started at, (segment, offset) with offsets counted across
/// segments, so their offsets' difference is what the reader never gets. A cursor left at the
/// very end of a segment that is then dropped jumps to the next segment's first message, its
/// next one: nothing lost. The alert watcher takes one jump per alert, by filter.
#[derive(Debug, Default)]
pub(crate) struct CursorJumps(Mutex<VecDeque<(String, u64, Instant)>>);

impl CursorJumps {
    fn note(&self, filter: String, lost: u64) {
        let mut jumps = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        jumps.retain(|(_, _, at)| at.elapsed() < JUMP_ALERT_WAIT);
        jumps.push_back((filter, lost, Instant::now()));
    }

    /// The messages skipped by the oldest jump noted on `filter` (taken off), if one waits.
    pub(crate) fn take(&self, filter: &str) -> Option<u64> {
        let mut jumps = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        jumps.retain(|(_, _, at)| at.elapsed() < JUMP_ALERT_WAIT);
        let at = jumps.iter().position(|(f, _, _)| f == filter)?;
        jumps.remove(at).map(|(_, lost, _)| lost)
    }
}

/// The layer noting rumqttd's cursor jumps into `jumps`, with its own filter: only the router's
/// WARN events that carry both cursors reach it.
fn cursor_jump_layer<S>(jumps: Arc<CursorJumps>) -> impl Layer<S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    CursorJumpLayer(jumps).with_filter(tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            && *meta.level() == Level::WARN
            && meta.target() == BROKER_ROUTER
            && meta.fields().field("request_cursor").is_some()
            && meta.fields().field("start_cursor").is_some()
    }))
}

struct CursorJumpLayer(Arc<CursorJumps>);

impl<S: Subscriber> Layer<S> for CursorJumpLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = JumpFields::default();
        event.record(&mut fields);
        let (Some(from), Some(to)) = (cursor(&fields.request), cursor(&fields.start)) else { return };
        // "Read cursor start jumped from (3, 1200) to (4, 1250) on hourglass/#".
        let Some((_, filter)) = fields.error.rsplit_once(" on ") else { return };
        self.0.note(filter.to_string(), to.1.saturating_sub(from.1));
    }
}

/// A cursor's `Debug` form, `(segment, offset)`.
fn cursor(text: &str) -> Option<(u64, u64)> {
    let (segment, offset) = text.strip_prefix('(')?.strip_suffix(')')?.split_once(", ")?;
    Some((segment.parse().ok()?, offset.parse().ok()?))
}

/// A cursor jump's fields, as text.
#[derive(Default)]
struct JumpFields {
    request: String,
    start: String,
    error: String,
}

impl Visit for JumpFields {
    /// `error`, a `String`, comes as text (its `Debug` form would be quoted).
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "error" {
            self.error = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let into = match field.name() {
            "request_cursor" => &mut self.request,
            "start_cursor" => &mut self.start,
            _ => return,
        };
        let _ = write!(into, "{value:?}");
    }
}

/// Whether a span is rumqttd's span of one PUBLISH packet (`publish`, at ERROR, with the
/// topic in its `Debug` form): one a message, its fields formatted by the text or JSON layer
/// at every message whether or not anything is logged inside it.
fn is_broker_publish_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "publish" && meta.target() == "rumqttd::router::routing"
}

/// Drops three ERROR events of rumqttd 0.20 (the embedded broker) that report normal traffic:
/// - `router-drop` with `Recv(Disconnected)`: logged for every client that disconnects cleanly
///   (sends DISCONNECT), a sensor going to sleep as much as the pipeline's own consumer at stop;
/// - `no-connection id N is already gone`: the router's second notice of such a disconnect
///   (the DISCONNECT packet, then the closed socket), which its own comment calls expected;
/// - `Error while handling MQTT connect packet` with `ConnectionAborted`: a TCP connection
///   closed before its CONNECT, as a health check or `serve`'s own readiness probe does.
///
/// Its other errors (a refused token, a malformed packet, a connection lost mid-session, a
/// client id taken over by a new connection) stay. Also disables rumqttd's span of each
/// PUBLISH packet (see [`is_broker_publish_span`]): at one point a message that cut the broker
/// router's CPU by a third (BENCHMARKS.md, "One point a message: the broker's span of each
/// PUBLISH").
struct BrokerNoise;

impl<S: Subscriber> Layer<S> for BrokerNoise {
    /// rumqttd's span of each PUBLISH packet is never created (the default interest follows
    /// this): an error inside one still names the connection and the client (the spans around it).
    fn enabled(&self, meta: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        !is_broker_publish_span(meta)
    }

    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("rumqttd::") {
            return true;
        }
        let mut fields = MessageAndError::default();
        event.record(&mut fields);
        !is_broker_noise(meta.target(), &fields.message, &fields.error)
    }
}

/// Whether a rumqttd ERROR of `target` with `message` and field `error` reports normal traffic.
fn is_broker_noise(target: &str, message: &str, error: &str) -> bool {
    match (target, message) {
        ("rumqttd::server::broker", "router-drop") => error == "Recv(Disconnected)",
        ("rumqttd::server::broker", "Error while handling MQTT connect packet") => {
            error.starts_with("Network(Io(") && error.contains("ConnectionAborted")
        }
        ("rumqttd::router::routing", m) => m
            .strip_prefix("no-connection id ")
            .and_then(|rest| rest.strip_suffix(" is already gone"))
            .is_some_and(|id| id.parse::<usize>().is_ok()),
        _ => false,
    }
}

/// An event's `message` and `error` fields, as their `Debug` forms.
#[derive(Default)]
struct MessageAndError {
    message: String,
    error: String,
}

impl Visit for MessageAndError {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let into = match field.name() {
            "message" => &mut self.message,
            "error" => &mut self.error,
            _ => return,
        };
        let _ = write!(into, "{value:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelt_levels_are_found_and_targets_left() {
        assert_eq!(misspelt_levels("warning"), ["warning"]);
        assert_eq!(misspelt_levels("infoo,ingest=debug, err"), ["infoo", "err"]);
        assert!(misspelt_levels("warn,hourglass=info,ingest").is_empty());
        assert!(misspelt_levels("INFO,rumqttd::router=off,[span]=debug").is_empty());
    }

    #[test]
    fn only_clean_disconnects_and_bare_probes_are_noise() {
        const BROKER: &str = "rumqttd::server::broker";
        const ROUTER: &str = "rumqttd::router::routing";
        let aborted = r#"Network(Io(Custom { kind: ConnectionAborted, error: "connection closed by peer" }))"#;
        assert!(is_broker_noise(BROKER, "router-drop", "Recv(Disconnected)"));
        assert!(is_broker_noise(BROKER, "Error while handling MQTT connect packet", aborted));
        assert!(is_broker_noise(ROUTER, "no-connection id 17 is already gone", ""));
        assert!(!is_broker_noise(BROKER, "Error while handling MQTT connect packet", "InvalidAuth"));
        assert!(!is_broker_noise(BROKER, "router-drop", "Send(Full)"));
        assert!(!is_broker_noise(BROKER, "disconnected", aborted));
        assert!(!is_broker_noise(BROKER, "Remote link error", "Recv(Disconnected)"));
        assert!(!is_broker_noise(ROUTER, "router-drop", "Recv(Disconnected)"));
        assert!(!is_broker_noise(ROUTER, "no space for new connection", ""));
        assert!(!is_broker_noise(ROUTER, "no-connection id x is already gone", ""));
        assert!(!is_broker_noise(
            ROUTER,
            "Duplicate client_id, dropping previous connection with connection_id: 3",
            ""
        ));
    }

    /// rumqttd's cursor-jump warning, as its router logs it (`request_cursor` and `start_cursor`
    /// in `Debug` form, `error` a `String`).
    fn jumped(from: (u64, u64), to: (u64, u64), filter: &str) {
        let error = format!("Read cursor start jumped from {from:?} to {to:?} on {filter}");
        tracing::warn!(target: "rumqttd::router::routing", request_cursor = ?from, start_cursor = ?to, error);
    }

    #[test]
    fn cursor_jumps_are_noted_with_what_they_skipped() {
        let jumps = Arc::new(CursorJumps::default());
        // As `init` stacks them, with the default filter.
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("info,rumqttd=warn,rumqttc=warn"))
            .with(BrokerNoise)
            .with(cursor_jump_layer(jumps.clone()))
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink));
        tracing::subscriber::with_default(subscriber, || {
            // Into the next segment, 50 messages past the cursor; to the end of a dropped segment
            // (nothing lost); within a segment; on another filter.
            jumped((3, 1200), (4, 1250), "hourglass/#");
            jumped((4, 1300), (5, 1300), "hourglass/#");
            jumped((6, 10), (6, 17), "hourglass/#");
            jumped((1, 0), (2, 9), "other/+/x");
            // Not a jump: another target, another level, no cursors.
            tracing::warn!(target: "hourglass::serve", request_cursor = ?(1u64, 0u64), start_cursor = ?(2u64, 9u64), error = "on hourglass/#");
            tracing::error!(target: "rumqttd::router::routing", request_cursor = ?(1u64, 0u64), start_cursor = ?(2u64, 9u64), error = "on hourglass/#");
            tracing::warn!(target: "rumqttd::router::routing", error = "jumped on hourglass/#");
        });
        assert_eq!(jumps.take("other/+/x"), Some(9));
        assert_eq!(jumps.take("hourglass/#"), Some(50));
        assert_eq!(jumps.take("hourglass/#"), Some(0));
        assert_eq!(jumps.take("hourglass/#"), Some(7));
        assert_eq!(jumps.take("hourglass/#"), None);
        assert_eq!(jumps.take("other/+/x"), None);
        assert_eq!(cursor("(12, 34)"), Some((12, 34)));
        assert_eq!(cursor("(12,34)"), None);
        assert_eq!(cursor("12, 34"), None);
    }

    /// Under the process's layers, rumqttd's per-PUBLISH span is not created; its spans around
    /// it, a span of that name elsewhere, and the events inside all are.
    #[test]
    fn the_broker_publish_span_alone_is_disabled() {
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("info,rumqttd=warn"))
            .with(BrokerNoise)
            .with(cursor_jump_layer(Arc::default()))
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink));
        tracing::subscriber::with_default(subscriber, || {
            let payload = tracing::error_span!(target: "rumqttd::router::routing", "incoming_payload", client_id = "c");
            let _in_payload = payload.enter();
            let publish = tracing::error_span!(target: "rumqttd::router::routing", "publish", topic = ?"a/b", pkid = 7);
            let elsewhere = tracing::error_span!(target: "hourglass::serve", "publish", topic = "a/b");
            let info_publish = tracing::info_span!(target: "rumqttd::router::routing", "publish");
            assert!(!payload.is_disabled());
            assert!(publish.is_disabled());
            assert!(!elsewhere.is_disabled());
            // Below `rumqttd=warn`: disabled by the filter as before. The router's span of each
            // outgoing batch too (the cursor jumps' filter takes events only).
            assert!(info_publish.is_disabled());
            let outgoing = tracing::info_span!(target: "rumqttd::router::routing", "[<] outgoing", connection_id = 3);
            assert!(outgoing.is_disabled());
            let _in_publish = publish.enter();
            assert!(tracing::enabled!(target: "rumqttd::router::routing", tracing::Level::ERROR));
        });
    }
}
