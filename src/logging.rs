//! The process's logging: `RUST_LOG` (default `info`, the MQTT crates at `warn`), text or JSON
//! lines on stderr, without the embedded broker's errors that are not errors nor its span of
//! each PUBLISH packet.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the global subscriber.
pub(crate) fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rumqttd=warn,rumqttc=warn"));
    let format = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let format = if json { format.json().boxed() } else { format.boxed() };
    tracing_subscriber::registry().with(filter).with(BrokerNoise).with(format).init();
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

    /// Under the process's layers, rumqttd's per-PUBLISH span is not created; its spans around
    /// it, a span of that name elsewhere, and the events inside all are.
    #[test]
    fn the_broker_publish_span_alone_is_disabled() {
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("info,rumqttd=warn"))
            .with(BrokerNoise)
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
            // Below `rumqttd=warn`: disabled by the filter as before.
            assert!(info_publish.is_disabled());
            let _in_publish = publish.enter();
            assert!(tracing::enabled!(target: "rumqttd::router::routing", tracing::Level::ERROR));
        });
    }
}
