//! MQTT consumer on rumqttc: QoS 1, persistent session, manual acks.
//!
//! A PUBACK leaves only when the bucketer runs the message's [`model::Ack`], i.e. after the
//! WriteBatch holding its readings (or its dead letter) is committed. The session is persistent
//! (`clean_session = false`, a fixed client id), so messages received but not yet acked when
//! Hourglass stops are redelivered by the broker when it reconnects.
//!
//! Backpressure: `send().await` on the bounded channel to the bucketer pauses polling of the
//! connection, so the broker sees a slow consumer (and stops at its in-flight window) instead
//! of Hourglass buffering without bound.
//!
//! Acks: the bucketer's [`model::Ack`]s send packet ids (with the connection their messages
//! arrived on) to the intake loop over an unbounded channel (at most the broker's in-flight
//! window is ever pending), and the loop writes all that are waiting and flushes the socket
//! once (`write_acks`), those of the current connection only. Through rumqttc's own
//! `AsyncClient::ack` each ack was a request of its own, written and flushed alone by one
//! `EventLoop::poll`: at one point a message that was a fifth of the consumer's CPU and capped
//! the rate (BENCHMARKS.md, "Acks written together").
//!
//! Connections: one a subscription ([`MqttConfig::subscriptions`]; by default one, on
//! `{topic_prefix}/#`). A broker bounds the messages in flight to each connection (rumqttd 0.20
//! at 100), so at one reading a message a second connection on half the topics carries more:
//! 141,506 → 165,397 readings/s on 2 cores (medians; BENCHMARKS.md, "A connection a table").
//! Each connection has its own session, acks and reconnects; they share the channel to the
//! bucketer, which keeps the order of each connection's messages, so a device's readings keep
//! their order as long as it publishes under one subscription.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use model::{Ack, IngestBatch};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use tokio::sync::{mpsc, watch};

use crate::wire::{decode_mqtt, WireConfig};

/// MQTT consumer settings.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Client id; fixed so the broker keeps the session across restarts.
    pub client_id: String,
    /// Optional username and password.
    pub credentials: Option<(String, String)>,
    /// TLS to the broker (`mqtts://`; [`MqttConfig::with_tls`]); `None`: plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Whether the url asked for TLS (`mqtts://`, `ssl://`): [`MqttConfig::with_tls`] sets
    /// [`MqttConfig::tls`] up.
    pub tls_scheme: bool,
    /// Payload format and limits; the subscription is `{topic_prefix}/#` unless
    /// [`MqttConfig::subscriptions`] names others.
    pub wire: WireConfig,
    /// Topic filters under `{topic_prefix}/`, each subscribed on a connection of its own, none
    /// overlapping another ([`check_subscriptions`]); empty: one connection on
    /// `{topic_prefix}/#`.
    pub subscriptions: Vec<String>,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// Pause between reconnect attempts.
    pub reconnect_delay: Duration,
    /// How long a subscription the broker granted may deliver nothing before a warning says
    /// so ([`SILENT_SUBSCRIPTION`]); `None`: no warning. A broker can grant a subscription its
    /// ACL denies and then drop every message (mosquitto 2.0 does): nothing else shows it.
    pub silence_warning: Option<Duration>,
    /// A file naming each broker and client id this store has consumed under (a line
    /// `host:port client_id`, added at a connection's first subscription): a first connect
    /// without a session under one it names is warned of as a reconnect without one is, what the
    /// broker queued meanwhile being lost. `None`: no such warning (the embedded broker).
    pub session_marker: Option<std::path::PathBuf>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            host: "127.0.0.1".into(),
            port: 1883,
            client_id: "hourglass-ingest".into(),
            credentials: None,
            tls: None,
            tls_scheme: false,
            wire: WireConfig::default(),
            subscriptions: Vec::new(),
            keep_alive: Duration::from_secs(30),
            reconnect_delay: Duration::from_secs(1),
            silence_warning: None,
            session_marker: None,
        }
    }
}

impl MqttConfig {
    /// The consumer's subscriptions, a connection each: [`MqttConfig::subscriptions`], or
    /// `{topic_prefix}/#`.
    pub fn filters(&self) -> Vec<String> {
        if self.subscriptions.is_empty() {
            vec![format!("{}/#", self.wire.topic_prefix)]
        } else {
            self.subscriptions.clone()
        }
    }

    /// The client id of the connection of each of [`MqttConfig::filters`], in order: the
    /// configured one for `{topic_prefix}/#` (no [`MqttConfig::subscriptions`]), else the
    /// configured one followed by `-` and a hash of the filter ([`filter_hash`]). A session is
    /// the broker's record of a client id's subscriptions and unacked messages, and keeps every
    /// filter it was ever subscribed to: ids by place in the list would, once the list is
    /// reordered, leave a session with two filters and deliver their messages on two
    /// connections. By filter, each session holds its own filter only.
    pub fn client_ids(&self) -> Vec<String> {
        if self.subscriptions.is_empty() {
            return vec![self.client_id.clone()];
        }
        self.subscriptions.iter().map(|f| format!("{}-{:016x}", self.client_id, filter_hash(f))).collect()
    }

    /// Reads `mqtt://host:port` (or `tcp://`, or a bare `host:port`; port 1883 when left out)
    /// or `mqtts://host:port` (or `ssl://`; port 8883), which asks for TLS
    /// ([`MqttConfig::tls_scheme`]; [`MqttConfig::with_tls`] sets it up). Other schemes
    /// (websockets), credentials in the url and port 0 are refused, each with the reason: the
    /// consumer would retry a connection that cannot be made, forever.
    pub fn with_url(mut self, url: &str) -> Result<MqttConfig, String> {
        let shown = redact_userinfo(url);
        let url = shown.as_str();
        let scheme = url.split_once("://").map(|(scheme, rest)| (scheme.to_ascii_lowercase(), rest));
        let (rest, tls) = match scheme.as_ref().map(|(scheme, rest)| (scheme.as_str(), *rest)) {
            Some(("mqtt" | "tcp", rest)) => (rest, false),
            Some(("mqtts" | "ssl", rest)) => (rest, true),
            Some((scheme, _)) => {
                return Err(format!(
                    "MQTT url {url:?}: scheme {scheme:?} is not supported; expected mqtt://host:port (plain TCP) \
                     or mqtts://host:port (TLS)"
                ))
            }
            None => (url, false),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('@') || rest.contains('/') {
            return Err(format!(
                "MQTT url {url:?} is not host:port (a url path, or credentials: the login is mqtt.username and \
                 mqtt.password)"
            ));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("MQTT url {url:?}: port {p:?} is not a number from 1 to 65535"))?,
            ),
            None => (rest, if tls { 8883 } else { 1883 }),
        };
        if host.is_empty() {
            return Err(format!("MQTT url {url:?} has no host; expected mqtt://host:port"));
        }
        if tls && host.starts_with('[') {
            // The client names the TLS server by the host as written, which is no DNS name.
            return Err(format!(
                "MQTT url {url:?}: an IPv6 address cannot be checked against the broker's certificate by the MQTT \
                 client; use a host name the certificate names"
            ));
        }
        self.host = host.to_string();
        self.port = port;
        self.tls_scheme = tls;
        Ok(self)
    }

    /// Sets TLS up for a url that asks for it ([`MqttConfig::tls_scheme`]): the broker's
    /// certificate checked against the CA certificates in the PEM file `ca_file`, or the system's
    /// (`/etc/ssl/certs`); with `client`, the PEM files of a certificate and its private key
    /// shown to a broker that asks for one. Each file is read now, so a wrong one is told at
    /// start, not at each reconnect.
    pub fn with_tls(
        mut self,
        ca_file: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<MqttConfig, Vec<TlsError>> {
        if !self.tls_scheme {
            return if ca_file.is_some() || client.is_some() { Err(vec![TlsError::NotTls]) } else { Ok(self) };
        }
        self.tls = Some(client_tls(ca_file, client)?);
        Ok(self)
    }

    fn options(&self, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, &self.host, self.port);
        o.set_clean_session(false);
        o.set_manual_acks(true);
        o.set_keep_alive(self.keep_alive);
        // Accept every packet MQTT can carry, so an oversize payload arrives and becomes a dead
        // letter. A packet over the client's limit breaks the connection, and the broker sends it
        // again on the resumed session, on every reconnect: nothing behind it was ever read.
        o.set_max_packet_size(MAX_MQTT_PACKET_BYTES, 1 << 20);
        if let Some((u, p)) = &self.credentials {
            o.set_credentials(u, p);
        }
        if let Some(tls) = &self.tls {
            o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(tls.clone())));
        }
        o
    }
}

/// `url` with the password of its user info, if any, replaced by `***`: what an error may show.
pub fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let user = rest[..at].split_once(':').map_or(&rest[..at], |(user, _)| user);
    let sep = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{sep}{user}:***@{}", &rest[at + 1..])
}

/// What is wrong with the TLS settings of [`MqttConfig::with_tls`], by the file it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// Certificate files given for a url without TLS.
    #[error("TLS files are set for a broker url without TLS: use mqtts://host:port, or unset them")]
    NotTls,
    /// The CA certificates (the file, or the system's).
    #[error("{0}")]
    Ca(String),
    /// The client certificate file.
    #[error("{0}")]
    Cert(String),
    /// The client's private key file.
    #[error("{0}")]
    Key(String),
}

/// The warning of a subscription the broker granted at QoS 0 only.
pub const QOS0_GRANTED: &str = "MQTT broker granted the subscription at QoS 0 only: it keeps nothing for Hourglass \
                                while it is stopped or behind, and delivers without waiting for Hourglass's acks, so a \
                                restart or a crash loses what the publishers were acknowledged meanwhile";

/// How long after a refused subscription it is asked for again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(10);

/// The warning of a subscription granted that has delivered nothing for
/// [`MqttConfig::silence_warning`]; given once for each of the consumer's subscriptions (not
/// again after a reconnect), and followed by [`SILENCE_OVER`] when a message arrives after all.
pub const SILENT_SUBSCRIPTION: &str = "MQTT subscription granted, and no message has arrived on it since";

/// The first message on a subscription that [`SILENT_SUBSCRIPTION`] warned of.
pub const SILENCE_OVER: &str = "MQTT messages arrive on the subscription warned of as silent";

/// Resolves at `at` (never without one: the branch is off then).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What to check for a connection error that settings can cause (a login refused, TLS), in
/// the words of the config file; `connected`: how long the connection had been up since its
/// CONNACK (`None`: it had none); `tls`: it is a TLS one.
fn connection_hint(e: &rumqttc::ConnectionError, connected: Option<Duration>, tls: bool) -> Option<&'static str> {
    use rumqttc::{ConnectReturnCode, ConnectionError};
    match e {
        ConnectionError::ConnectionRefused(
            ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized,
        ) => Some("the broker refused Hourglass's login: check mqtt.username and mqtt.password"),
        // The broker's own certificate (QA48 N2: said only as rustls's debug text).
        ConnectionError::Tls(_) if e.to_string().contains("UnsupportedCertVersion") => Some(V1_BROKER_HINT),
        // The broker's TLS alert (a client certificate required or refused) arrives after the
        // handshake, while rumqttc reads the CONNACK.
        ConnectionError::Tls(_) => Some(TLS_HINT),
        ConnectionError::MqttState(_) if e.to_string().contains("fatal alert") => Some(TLS_HINT),
        // Connected, then closed without a CONNACK: a TLS listener reset the plain CONNECT
        // (QA48 N1: said with no hint), or a broker refused the client without one.
        ConnectionError::MqttState(_) if connected.is_none() && !tls => Some(PLAIN_CLOSED_HINT),
        // QA48 N7: two consumers under one client id threw each other off every few seconds,
        // said only as this. Not after a connection of long (QA49 R2: a broker's restart).
        ConnectionError::MqttState(_)
            if connected.is_some_and(|up| up < SHORT_CONNECTION) && e.to_string().contains("closed by peer") =>
        {
            Some(TAKEN_OVER_HINT)
        }
        _ => None,
    }
}

const PLAIN_CLOSED_HINT: &str = concat!(
    "the broker closed the connection before answering Hourglass's CONNECT: is the url's port a TLS listener ",
    "(then mqtts://host:port, with mqtt.ca_file)? Otherwise the broker refused the client without a CONNACK: its ",
    "log says why"
);

/// A connection closed sooner than this after its CONNACK may have been taken over.
const SHORT_CONNECTION: Duration = Duration::from_secs(30);

const TAKEN_OVER_HINT: &str = concat!(
    "if this repeats every few seconds, another client connects under Hourglass's client id and the broker ",
    "throws this one off: each Hourglass on a broker needs a mqtt.client_id of its own"
);

/// How to sign a server's certificate again as X.509 version 3, naming its address.
macro_rules! sign_server_v3 {
    () => {
        concat!(
            "`printf 'subjectAltName=IP:127.0.0.1\\n' > server.ext; openssl x509 -req -in server.csr -CA ca.crt ",
            "-CAkey ca.key -CAcreateserial -out server.crt -days 365 -extfile server.ext`"
        )
    };
}

const V1_BROKER_HINT: &str = concat!(
    "the broker's certificate is X.509 version 1 (openssl's `x509 -req` without `-extfile`, as in ",
    "mosquitto-tls(7)), which rustls does not take: sign it again as version 3 with a subjectAltName naming the ",
    "url's host, e.g. ",
    sign_server_v3!()
);

const TLS_HINT: &str = concat!(
    "check the url's scheme (mqtts:// for the broker's TLS listener), mqtt.ca_file (the CA of the broker's ",
    "certificate), the url's host (a name in that certificate) and mqtt.cert_file/mqtt.key_file if the broker ",
    "asks for a client certificate"
);

/// The rustls client of [`MqttConfig::with_tls`], on ring (already in the tree; rustls's
/// default, aws-lc-rs, is a C build). Every file's problem at once.
pub(crate) fn client_tls(
    ca_file: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, Vec<TlsError>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let mut problems = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => match read_pem::<CertificateDer<'static>>(path, "CA certificate") {
            Ok(certs) => {
                for cert in certs {
                    if let Err(e) = roots.add(cert) {
                        problems.push(TlsError::Ca(format!("{}: {e}", path.display())));
                        break;
                    }
                }
            }
            Err(e) => problems.push(TlsError::Ca(e)),
        },
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found.errors.first().map(|e| format!(" ({e})")).unwrap_or_default();
                problems.push(TlsError::Ca(format!(
                    "no CA certificates found on this system{why}: install Debian's ca-certificates, or name the \
                     broker's CA in mqtt.ca_file"
                )));
            }
        }
    }
    let client = match client {
        None => None,
        Some((cert, key)) => {
            // Expired, or not valid yet (a version 1 one is said below, with rustls's verdict).
            let chain = usable_chain(cert, false, false).map_err(TlsError::Cert);
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| unread_key(key, &e));
            match (chain, key_der) {
                (Ok(chain), Ok(key_der)) => Some((cert, key, chain, key_der)),
                (chain, key_der) => {
                    problems.extend(chain.err());
                    problems.extend(key_der.err());
                    None
                }
            }
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![TlsError::Ca(e.to_string())])?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key, chain, key_der)) => builder.with_client_auth_cert(chain, key_der).map_err(|e| {
            vec![match e {
                rustls::Error::InconsistentKeys(_) => {
                    TlsError::Key(format!("{}: not the key of {} ({e})", key.display(), cert.display()))
                }
                // webpki takes only v3 certificates, this client's own too; openssl's `x509 -req`
                // makes v1 ones without `-extfile` (mosquitto-tls(7)'s recipe), which mosquitto takes.
                e if format!("{e:?}").contains("UnsupportedCertVersion") => TlsError::Cert(format!(
                    "{}: an X.509 version 1 certificate, which rustls does not take as the client's: sign it \
                     again as version 3, e.g. `printf 'extendedKeyUsage=clientAuth\\n' > client.ext; openssl x509 -req \
                     -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 365 -extfile \
                     client.ext`",
                    cert.display()
                )),
                e => TlsError::Cert(format!("{}: {e} (is it an X.509 v3 certificate?)", cert.display())),
            }]
        })?,
    };
    Ok(Arc::new(config))
}

/// The certificate chain of the PEM file at `path` (its own certificate first), unless the file
/// holds none or its first is unusable now ([`certificate_problem`] of `server` and `v1`): the
/// problem in words, naming the file.
pub fn usable_chain(
    path: &Path,
    server: bool,
    v1: bool,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let chain = read_pem::<rustls::pki_types::CertificateDer<'static>>(path, "certificate")?;
    match certificate_problem(path, &chain[0], server, v1) {
        Some(problem) => Err(problem),
        None => Ok(chain),
    }
}

/// What makes the certificate `cert` (of the file at `path`) unusable now, whoever checks it:
/// expired, or not valid yet; `v1`: also an X.509 version 1 one, which rustls does not take.
/// `None` otherwise (its other checks are its peer's). `server`: it is a server's (else a
/// client's). An expired one was read at start and refused at every connect (QA48 N10, QA49 R4).
pub fn certificate_problem(
    path: &Path,
    cert: &rustls::pki_types::CertificateDer<'_>,
    server: bool,
    v1: bool,
) -> Option<String> {
    let ee = match webpki::EndEntityCert::try_from(cert) {
        Ok(ee) => ee,
        Err(webpki::Error::UnsupportedCertVersion) if v1 => {
            return Some(format!(
                "{}: an X.509 version 1 certificate, which rustls does not take: sign it again as version 3, e.g. {}",
                path.display(),
                sign_server_v3!()
            ))
        }
        Err(_) => return None,
    };
    let usage = if server { webpki::KeyUsage::server_auth() } else { webpki::KeyUsage::client_auth() };
    let now = rustls::pki_types::UnixTime::now();
    let utc =
        |t: rustls::pki_types::UnixTime| model::utc_text(i64::try_from(t.as_secs()).unwrap_or(i64::MAX / 1000) * 1000);
    // No anchors: its validity is checked before any issuer is looked for.
    match ee.verify_for_usage(&[], &[], &[], now, usage, None, None) {
        Err(webpki::Error::CertExpired { not_after, .. }) => Some(format!(
            "{}: the certificate expired at {} (renew it; this machine's clock says {})",
            path.display(),
            utc(not_after),
            utc(now)
        )),
        Err(webpki::Error::CertNotValidYet { not_before, .. }) => Some(format!(
            "{}: the certificate is not valid before {} (this machine's clock says {}: is it right?)",
            path.display(),
            utc(not_before),
            utc(now)
        )),
        _ => None,
    }
}

/// The line of [`MqttConfig::session_marker`] for a connection under `client_id`.
fn marker_line(cfg: &MqttConfig, client_id: &str) -> String {
    format!("{}:{} {client_id}", cfg.host, cfg.port)
}

/// Whether the store has consumed from the broker under `client_id` before
/// ([`MqttConfig::session_marker`]).
fn consumed_before(cfg: &MqttConfig, client_id: &str) -> bool {
    let Some(path) = &cfg.session_marker else { return false };
    let line = marker_line(cfg, client_id);
    std::fs::read_to_string(path).is_ok_and(|text| text.lines().any(|l| l == line))
}

/// Notes in [`MqttConfig::session_marker`] that the store consumes from the broker under
/// `client_id`, if it is not noted yet. A failure is a warning: only the warning of a lost
/// session at a later start depends on it.
fn note_consumed(cfg: &MqttConfig, client_id: &str) {
    use std::io::Write;
    let Some(path) = &cfg.session_marker else { return };
    if consumed_before(cfg, client_id) {
        return;
    }
    let line = marker_line(cfg, client_id);
    let noted =
        std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = noted {
        tracing::warn!(error = %e, path = %path.display(), "could not note the broker and client id consumed under");
    }
}

/// Why the private key at `path` was not read: an encrypted one is said to be.
fn unread_key(path: &Path, e: &rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Key(key_unread(path, e))
}

/// Why the private key at `path` was not read (`e`), in words: an encrypted one is said to be.
pub fn key_unread(path: &Path, e: &rustls::pki_types::pem::Error) -> String {
    encrypted_key(path).unwrap_or_else(|| {
        format!(
            "{}: no private key read ({e}); expected a PEM file of an unencrypted PKCS#8, PKCS#1 or SEC1 key",
            path.display()
        )
    })
}

/// What to say of the key file at `path` when it holds an encrypted private key, which neither
/// rustls nor librdkafka (without a passphrase) reads; `None` otherwise.
pub fn encrypted_key(path: &Path) -> Option<String> {
    let encrypted = std::fs::read(path).is_ok_and(|b| String::from_utf8_lossy(&b).contains("ENCRYPTED"));
    encrypted.then(|| {
        format!(
            "{}: an encrypted private key, which is not read: give the key unencrypted (openssl pkey -in KEY -out \
             KEY.plain), readable by Hourglass only",
            path.display()
        )
    })
}

/// Every `T` of the PEM file at `path`; at least one, else what was found instead.
pub fn read_pem<T: rustls::pki_types::pem::PemObject>(path: &Path, what: &str) -> Result<Vec<T>, String> {
    let read = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let items: Result<Vec<T>, _> = T::pem_slice_iter(&read).collect();
    match items {
        Ok(items) if !items.is_empty() => Ok(items),
        Ok(_) => Err(format!("{}: no {what} in it; expected a PEM file (-----BEGIN CERTIFICATE-----)", path.display())),
        Err(e) => Err(format!("{}: not a PEM file of {what}s ({e})", path.display())),
    }
}

/// The largest packet MQTT 3.1.1 can carry: a remaining length of at most 268,435,455 bytes
/// (four bytes of varint) after a fixed header of at most five.
pub const MAX_MQTT_PACKET_BYTES: usize = 268_435_455 + 5;

/// Most subscriptions, and so connections, [`check_subscriptions`] accepts.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// Checks subscriptions for [`MqttConfig::subscriptions`]: each a topic filter (levels split
/// by `/`; `+` a whole level, `#` a whole last level; no empty level) whose first level is
/// `prefix`, none matching a topic another matches (the broker would deliver such a message
/// on both connections), at most [`MAX_SUBSCRIPTIONS`]. The problem, if any, in words.
pub fn check_subscriptions(prefix: &str, subscriptions: &[String]) -> Result<(), String> {
    if subscriptions.len() > MAX_SUBSCRIPTIONS {
        return Err(format!("{} subscriptions; at most {MAX_SUBSCRIPTIONS}", subscriptions.len()));
    }
    for (i, f) in subscriptions.iter().enumerate() {
        let levels: Vec<&str> = f.split('/').collect();
        let bad_level = levels.iter().enumerate().find(|&(j, l)| {
            l.is_empty() || (l.contains(['+', '#']) && l.len() > 1) || (*l == "#" && j + 1 != levels.len())
        });
        if let Some((_, level)) = bad_level {
            return Err(format!(
                "{f:?} is not a topic filter: level {level:?} (levels are not empty; `+` and `#` stand alone, `#` last)"
            ));
        }
        if levels[0] != prefix || levels.len() < 2 {
            return Err(format!("{f:?} is not under the topic prefix: it must start with \"{prefix}/\""));
        }
        if let Some(g) = subscriptions[..i].iter().find(|g| filters_overlap(g, f)) {
            return Err(format!("{g:?} and {f:?} overlap: a message on a topic both match would be taken twice"));
        }
    }
    Ok(())
}

/// Whether some topic matches both filters (each valid, as [`check_subscriptions`] asks).
fn filters_overlap(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('/'), b.split('/'));
    loop {
        match (a.next(), b.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            // `x/#` matches `x`: the longer filter's next level is `#`, caught above.
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(x), Some(y)) if x == "+" || y == "+" || x == y => {}
            _ => return false,
        }
    }
}

/// A hash of a topic filter for its connection's client id ([`MqttConfig::client_ids`]):
/// 64-bit FNV-1a, fixed here so the id, and with it the broker's session, survives upgrades.
pub fn filter_hash(filter: &str) -> u64 {
    filter.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// rumqttc's request channel: the subscription, pings and the disconnect go through it.
const REQUEST_CHANNEL_CAPACITY: usize = 16;

/// The messages whose readings are committed, from the bucketer to the intake loop, which
/// writes their PUBACKs ([`write_acks`]): each as (connection, packet id), the connection
/// counted by its intake loop's connects when the message arrived.
type AckSender = mpsc::UnboundedSender<(u64, u16)>;
type AckReceiver = mpsc::UnboundedReceiver<(u64, u16)>;

/// Counters of the consumer.
#[derive(Debug, Default)]
pub struct MqttStats {
    /// Publish packets received and forwarded.
    pub messages: AtomicU64,
    /// Payload bytes received.
    pub bytes: AtomicU64,
    /// Valid readings decoded.
    pub readings: AtomicU64,
    /// Dead letters produced.
    pub dead_letters: AtomicU64,
    /// Connections (re)established.
    pub connects: AtomicU64,
    /// Times the embedded broker skipped messages this consumer had not read yet (its log of
    /// unread messages was full, so it dropped the oldest): those messages are lost. Counted
    /// by the pipeline from the broker's alerts (not a skip that lost none); stays 0 for other
    /// brokers and sources.
    pub broker_skips: AtomicU64,
    /// Messages lost in those skips, where the broker said how many (see the pipeline's alert
    /// watcher); a skip whose loss is unknown adds none.
    pub broker_skipped_messages: AtomicU64,
    /// Messages the embedded broker took on this consumer's subscription, from its meters (a
    /// second behind); less [`MqttStats::messages`], what it holds that this consumer has not
    /// read. Stays 0 for other brokers and sources.
    pub broker_published: AtomicU64,
    /// What the embedded broker's log took for the messages on this consumer's subscription,
    /// counted as rumqttd counts it against `mqtt.broker_backlog_mb`: 4 bytes, the topic and
    /// the payload a message. From its meters, as [`MqttStats::broker_published`].
    pub broker_published_bytes: AtomicU64,
    /// The same measure of the messages received: 4 bytes, the topic and the payload each.
    pub log_bytes: AtomicU64,
    /// Messages the embedded broker took on topics that no subscription of this consumer
    /// matches (outside `{prefix}/#`, or outside every `mqtt.subscriptions` filter): it
    /// acknowledges them to QoS 1 publishers and Hourglass stores them nowhere (another client
    /// may subscribe to them). From its meters, a second behind (a client's last will is not
    /// counted as a publish there: one on such a topic is not counted, and one on Hourglass's
    /// hides one of them); stays 0 for other brokers and sources.
    pub broker_unmatched: AtomicU64,
    /// Messages the broker delivered again under one assignment of their partition, which the
    /// consumer skipped (they were taken already; not counted in [`MqttStats::messages`]).
    /// Kafka only: librdkafka may fetch a partition again from an earlier offset (it did when
    /// its own `auto.offset.reset` lookup met a pause, which the consumer now avoids; see
    /// `ingest::kafka`). Stays 0 for MQTT.
    pub redelivered: AtomicU64,
    /// Why the consumer is not subscribed, as last seen: over MQTT a connection error or a
    /// subscription refused, with its filter; over Kafka librdkafka's last error, joining the
    /// group, or stopping. `None` once subscribed, or never said (QA48 N11: `/ready` said one
    /// text for every cause).
    pub not_subscribed_because: std::sync::Mutex<Option<String>>,
}

impl MqttStats {
    /// Notes why the consumer is not subscribed (`None`: it is).
    pub fn set_not_subscribed_because(&self, why: Option<String>) {
        *self.not_subscribed_because.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }

    /// Why the consumer is not subscribed, as last noted.
    pub fn not_subscribed_because(&self) -> Option<String> {
        self.not_subscribed_because.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Messages the embedded broker holds that this consumer has not read yet, as of its last
    /// meter reading (0 for other brokers and sources): those it took, less those read and those
    /// its skips are known to have dropped.
    pub fn broker_backlog(&self) -> u64 {
        let published = self.broker_published.load(Ordering::Relaxed);
        let gone =
            self.messages.load(Ordering::Relaxed).saturating_add(self.broker_skipped_messages.load(Ordering::Relaxed));
        published.saturating_sub(gone)
    }

    /// The bytes of the embedded broker's log that this consumer has not read yet, as of its
    /// last meter reading, in the measure of `mqtt.broker_backlog_mb` (0 for other brokers and
    /// sources). Exact until a skip; after one, the messages it is known to have dropped are
    /// taken off at the mean size of those not read (the broker says how many it dropped, not
    /// their bytes), so the gauge falls back to 0 once what it still holds is read.
    pub fn broker_backlog_bytes(&self) -> u64 {
        let unread_bytes =
            self.broker_published_bytes.load(Ordering::Relaxed).saturating_sub(self.log_bytes.load(Ordering::Relaxed));
        let unread =
            self.broker_published.load(Ordering::Relaxed).saturating_sub(self.messages.load(Ordering::Relaxed));
        let skipped = self.broker_skipped_messages.load(Ordering::Relaxed);
        if skipped == 0 {
            return unread_bytes;
        }
        let held = unread.saturating_sub(skipped);
        if held == 0 {
            return 0;
        }
        // At most `unread_bytes`: `0 < held <= unread`.
        u64::try_from(u128::from(unread_bytes) * u128::from(held) / u128::from(unread)).unwrap_or(unread_bytes)
    }
}

/// What a message takes in rumqttd's log (its `Storage::size` of a publish): 4 bytes, the
/// topic and the payload.
pub fn broker_log_size(topic_len: usize, payload_len: usize) -> u64 {
    (4 + topic_len + payload_len) as u64
}

/// Control of a running consumer for ordered shutdown.
#[derive(Debug)]
pub struct MqttControl {
    /// Set to `true` to stop taking new messages; the consumer drops its channel sender.
    pub stop_intake: watch::Sender<bool>,
    /// Set to `true` once the bucketer has committed and acked everything it received; the
    /// consumer then flushes the acks to the broker and disconnects.
    pub writer_done: watch::Sender<bool>,
    /// Becomes `true` once the broker confirmed every subscription (each connection subscribes
    /// on every connect, to a resumed session too): from then on nothing published to the
    /// topics is missed. Falls back to `false` when a connection drops (until the broker
    /// confirms again) and when intake stops.
    pub subscribed: watch::Receiver<bool>,
}

impl MqttControl {
    /// Waits until the consumer is subscribed, at most `limit`; returns whether it is.
    pub async fn wait_subscribed(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, is_set(&mut self.subscribed)).await.is_ok() && *self.subscribed.borrow()
    }
}

/// Starts the consumer on the current tokio runtime: a connection a subscription
/// ([`MqttConfig::filters`]). The task ends when every connection has stopped.
pub fn spawn(
    cfg: MqttConfig,
    tx: mpsc::Sender<IngestBatch>,
    stats: Arc<MqttStats>,
) -> (MqttControl, tokio::task::JoinHandle<()>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(false);
    let (filters, client_ids) = (cfg.filters(), cfg.client_ids());
    let (ready, sub_rx) = Readiness::new(filters.len());
    let cfg = Arc::new(cfg);
    let connections: Vec<_> = filters
        .into_iter()
        .zip(client_ids)
        .enumerate()
        .map(|(index, (filter, client_id))| {
            let sub = Subscription { client_id, filter, index, ready: ready.clone() };
            tokio::spawn(run(cfg.clone(), sub, tx.clone(), stats.clone(), stop_rx.clone(), done_rx.clone()))
        })
        .collect();
    let handle = tokio::spawn(async move {
        for connection in connections {
            if let Err(e) = connection.await {
                tracing::error!(error = %e, "MQTT connection task failed");
            }
        }
    });
    (MqttControl { stop_intake: stop_tx, writer_done: done_tx, subscribed: sub_rx }, handle)
}

/// One connection of the consumer: its client id, its topic filter, and its place among the
/// connections for [`Readiness`].
struct Subscription {
    client_id: String,
    filter: String,
    index: usize,
    ready: Arc<Readiness>,
}

/// Whether every connection is subscribed, as [`MqttControl::subscribed`] says.
struct Readiness {
    subscribed: std::sync::Mutex<Vec<bool>>,
    all: watch::Sender<bool>,
}

impl Readiness {
    fn new(connections: usize) -> (Arc<Readiness>, watch::Receiver<bool>) {
        let (all, rx) = watch::channel(false);
        (Arc::new(Readiness { subscribed: std::sync::Mutex::new(vec![false; connections]), all }), rx)
    }

    /// Records whether connection `index` is subscribed. The lock is held while sending, so
    /// the last value sent is that of the last change.
    fn set(&self, index: usize, subscribed: bool) {
        let mut each = self.subscribed.lock().unwrap_or_else(|p| p.into_inner());
        each[index] = subscribed;
        self.all.send_replace(each.iter().all(|&s| s));
    }
}

async fn run(
    cfg: Arc<MqttConfig>,
    sub: Subscription,
    tx: mpsc::Sender<IngestBatch>,
    stats: Arc<MqttStats>,
    mut stop: watch::Receiver<bool>,
    mut writer_done: watch::Receiver<bool>,
) {
    let (client, mut eventloop) = AsyncClient::new(cfg.options(&sub.client_id), REQUEST_CHANNEL_CAPACITY);
    let (ack_tx, mut ack_rx): (AckSender, AckReceiver) = mpsc::unbounded_channel();
    let Subscription { client_id, filter, index, ready } = sub;
    let subscribed = |yes: bool| ready.set(index, yes);
    // This connection's connects: each ack carries the count at its message's arrival.
    let mut connection = 0u64;
    // When to ask again for a subscription the broker refused.
    let mut resubscribe_at: Option<tokio::time::Instant> = None;
    // When to warn that the subscription granted has delivered nothing (`silence_warning`);
    // whether a message has arrived; whether the warning was given.
    let mut silence_warn_at: Option<tokio::time::Instant> = None;
    let (mut heard, mut warned_silent) = (false, false);
    // When the connection had its CONNACK, if it has.
    let mut up: Option<tokio::time::Instant> = None;
    // The connection errors logged.
    let mut said = crate::quiet::Quieter::every(Duration::from_secs(60));
    // Whether the session marker has been looked at since the start (once is enough).
    let mut noted = false;
    tracing::info!(host = %cfg.host, port = cfg.port, %client_id, %filter, "MQTT consumer starting");

    // Phase 1: intake until told to stop.
    loop {
        // An ack arriving while `poll` waits drops the `poll` future; see `write_acks` for why
        // that loses nothing here.
        let event = tokio::select! {
            _ = is_set(&mut stop) => break,
            Some(ack) = ack_rx.recv() => {
                write_acks(&mut eventloop, ack, &mut ack_rx, connection).await;
                continue;
            }
            _ = sleep_until(resubscribe_at), if resubscribe_at.is_some() => {
                resubscribe_at = None;
                if let Err(e) = client.try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                    tracing::error!(error = %e, "MQTT subscribe request failed");
                }
                continue;
            }
            _ = sleep_until(silence_warn_at), if silence_warn_at.is_some() => {
                silence_warn_at = None;
                warned_silent = true;
                let secs = cfg.silence_warning.unwrap_or_default().as_secs();
                tracing::warn!(
                    %filter,
                    seconds = secs,
                    hint = "if devices publish under the filter, the broker is not passing their messages on: \
                            mosquitto grants a subscription its ACL denies and drops the messages (the ACL must let \
                            mqtt.username read the filter), or the devices publish under other topics. A \
                            fleet quiet this long: raise mqtt.silence_warning_s, or 0 for no warning",
                    "{SILENT_SUBSCRIPTION}"
                );
                continue;
            }
            ev = eventloop.poll() => ev,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                up = Some(tokio::time::Instant::now());
                connection += 1;
                resubscribe_at = None;
                stats.connects.fetch_add(1, Ordering::Relaxed);
                if connection > 1 && !ack.session_present {
                    // The broker's only sign that it dropped the queue it kept for this session.
                    tracing::warn!(
                        %filter,
                        "MQTT reconnected without the session: the broker did not keep it (restarted without \
                         persistence, or expired it), so what it queued for Hourglass while disconnected is lost"
                    );
                } else if connection == 1 && !ack.session_present && consumed_before(&cfg, &client_id) {
                    // The same at a start (QA48 N6: said only as an INFO line; QA49 R8: of a
                    // store that had never consumed from the broker too).
                    tracing::warn!(
                        %filter,
                        %client_id,
                        "MQTT connected without a session for this client id, under which this store consumed from \
                         this broker before: the broker did not keep it (restarted without persistence, or expired \
                         it), so what it queued for Hourglass while it was stopped is lost"
                    );
                } else {
                    tracing::info!(session_present = ack.session_present, %filter, "MQTT connected");
                }
                // Subscribed again even when the broker resumed the session: the session holds
                // the subscriptions of the process that made it, which a change of
                // `topic_prefix` under the same client id leaves behind (the same filter again
                // is only replaced). Ready once the broker confirms.
                if let Err(e) = client.try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                    tracing::error!(error = %e, "MQTT subscribe request failed");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let ok = ack.return_codes.iter().all(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_)));
                if ok {
                    subscribed(true);
                    stats.set_not_subscribed_because(None);
                    if !std::mem::replace(&mut noted, true) {
                        note_consumed(&cfg, &client_id);
                    }
                    let at_most_once = rumqttc::SubscribeReasonCode::Success(QoS::AtMostOnce);
                    if ack.return_codes.contains(&at_most_once) {
                        // QA48 N13: accepted in silence, and a restart lost what was published
                        // meanwhile (8,300 of 40,000 readings acked to their publishers).
                        tracing::warn!(
                            %filter,
                            hint = "let the broker grant QoS 1 to Hourglass's login (mosquitto: max_qos on its \
                                    listener)",
                            "{QOS0_GRANTED}"
                        );
                    }
                    if !heard && !warned_silent {
                        silence_warn_at = cfg.silence_warning.map(|after| tokio::time::Instant::now() + after);
                    }
                } else {
                    // Asked again now and then: an ACL mended on the broker takes effect without a
                    // restart of Hourglass.
                    tracing::error!(
                        codes = ?ack.return_codes,
                        %filter,
                        hint = "the broker's ACL must let Hourglass's login (mqtt.username) read the filter",
                        "MQTT broker refused the subscription; asking again in {} s",
                        RESUBSCRIBE_AFTER.as_secs()
                    );
                    resubscribe_at = Some(tokio::time::Instant::now() + RESUBSCRIBE_AFTER);
                    stats.set_not_subscribed_because(Some(format!(
                        "the broker refused the subscription to {filter} (its ACL?), asked again every {} s",
                        RESUBSCRIBE_AFTER.as_secs()
                    )));
                }
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                if !heard {
                    heard = true;
                    silence_warn_at = None;
                    if warned_silent {
                        tracing::info!(%filter, "{SILENCE_OVER}");
                    }
                }
                let acks = (&ack_tx, connection);
                let mut batch = decode_publish(&cfg.wire, acks, publish, &stats);
                let mut stopped = false;
                loop {
                    let next = take_queued(&mut eventloop, &mut batch, &cfg.wire, acks, &stats);
                    tokio::select! {
                        _ = is_set(&mut stop) => stopped = true,
                        sent = tx.send(batch) => if sent.is_err() {
                            tracing::error!("bucketer channel closed; stopping MQTT intake");
                            stopped = true;
                        },
                    }
                    match next {
                        Some(more) if !stopped => batch = more,
                        _ => break,
                    }
                }
                if stopped {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                // Not subscribed until the broker confirms again (readiness reports this); the
                // silence is timed again from then.
                subscribed(false);
                silence_warn_at = None;
                let connected = up.take().map(|at| at.elapsed());
                stats.set_not_subscribed_because(Some(format!("{filter}: {e}")));
                // The same error again within a minute is counted, not logged (QA48 N12: a line a
                // second a connection while a broker was down).
                let hint = connection_hint(&e, connected, cfg.tls.is_some());
                if let Some(repeats) = said.admit(&format!("{e}{hint:?}"), std::time::Instant::now()) {
                    match hint {
                        Some(hint) => {
                            tracing::warn!(error = %e, %filter, hint, repeats, "MQTT connection error; reconnecting")
                        }
                        None => tracing::warn!(error = %e, %filter, repeats, "MQTT connection error; reconnecting"),
                    }
                }
                tokio::select! {
                    _ = is_set(&mut stop) => break,
                    _ = tokio::time::sleep(cfg.reconnect_delay) => {}
                }
            }
        }
    }

    // Phase 2: no new intake. Dropping the sender lets the bucketer drain and finish; keep the
    // connection polled so the acks it sends reach the broker. Messages arriving now are not
    // acked and come back on the next session.
    subscribed(false);
    drop(tx);
    drop(ack_tx);
    loop {
        tokio::select! {
            _ = is_set(&mut writer_done) => break,
            Some(ack) = ack_rx.recv() => write_acks(&mut eventloop, ack, &mut ack_rx, connection).await,
            ev = eventloop.poll() => if ev.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            },
        }
    }
    // The bucketer is done: its last acks are queued. They are written before the disconnect
    // is requested. Then read until the broker closes the connection: closing a socket that
    // still has unread input (publishes the broker keeps sending) resets the connection, and the
    // reset discards the acks the broker has not read yet, so it would deliver those messages
    // again.
    if let Ok(ack) = ack_rx.try_recv() {
        write_acks(&mut eventloop, ack, &mut ack_rx, connection).await;
    }
    if client.try_disconnect().is_ok() {
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                ev = eventloop.poll() => if ev.is_err() {
                    break;
                },
            }
        }
    }
    tracing::info!(%filter, "MQTT consumer stopped");
}

/// Readings past which a batch takes no more queued publishes ([`take_queued`]). rumqttc
/// reads at most 10 packets in one go, so small messages come 10 to a batch at most; a message
/// of this many readings goes alone, so the writer can commit it while the next are decoded.
const COALESCE_READINGS: usize = 1_000;

/// Appends to `batch` the publishes that rumqttc read with the one it holds, which wait in its
/// event queue ([`queued_publish`]), until it holds [`COALESCE_READINGS`] readings: the writer
/// then wakes and commits once for them, not once a message. Answers the batch of a publish
/// that cannot follow in the same batch ([`IngestBatch::appends_in_order`]), if one came.
fn take_queued(
    eventloop: &mut rumqttc::EventLoop,
    batch: &mut IngestBatch,
    wire: &WireConfig,
    acks: AckTo<'_>,
    stats: &MqttStats,
) -> Option<IngestBatch> {
    while batch.reading_count() < COALESCE_READINGS {
        let more = decode_publish(wire, acks, queued_publish(eventloop)?, stats);
        if !batch.appends_in_order(&more) {
            return Some(more);
        }
        batch.append(more);
    }
    None
}

/// The next PUBLISH of the event queue, if one is there before any event the intake loop acts
/// on: what the next `EventLoop::poll` calls would answer without reading or writing anything.
/// Events of packets written (the acks) are passed over, as the intake loop passes over them.
fn queued_publish(eventloop: &mut rumqttc::EventLoop) -> Option<rumqttc::Publish> {
    let events = &mut eventloop.state.events;
    while let Some(Event::Outgoing(_)) = events.front() {
        events.pop_front();
    }
    match events.pop_front()? {
        Event::Incoming(Packet::Publish(publish)) => Some(publish),
        other => {
            events.push_front(other);
            None
        }
    }
}

/// Writes the PUBACKs of `first` and of every ack waiting in `pending`, in the order the
/// bucketer acked them (the order the broker delivered the messages in, as MQTT asks), and
/// flushes the socket once. Without a connection (between a connection error and the
/// reconnect) they are dropped: the broker delivers those messages again. So are the acks of
/// messages that arrived on an earlier connection ([`acks_of_connection`]).
///
/// The intake loop calls this when an ack arrives while `EventLoop::poll` waits, which drops
/// that `poll` future. Where rumqttc 0.25's `poll` waits, dropping it loses nothing for this
/// consumer: reading packets (the framed reader keeps partial input; packets already read are
/// in the event queue), flushing (the framed writer keeps what it has not written), the
/// keep-alive timer (it stays armed), a request from its channel (the subscription, pings and
/// the disconnect only: acks no longer go through it), and connecting (the next `poll` starts
/// again).
async fn write_acks(eventloop: &mut rumqttc::EventLoop, first: (u64, u16), pending: &mut AckReceiver, connection: u64) {
    let mut acks = vec![first];
    while let Ok(ack) = pending.try_recv() {
        acks.push(ack);
    }
    let (pkids, stale) = acks_of_connection(acks, connection);
    if stale > 0 {
        tracing::info!(
            acks = stale,
            "MQTT acks of messages delivered on an earlier connection not written; the broker delivers them again"
        );
    }
    if pkids.is_empty() {
        return;
    }
    let Some(network) = eventloop.network.as_mut() else {
        tracing::warn!(acks = pkids.len(), "MQTT acks dropped while disconnected; the broker will redeliver");
        return;
    };
    let written: Result<(), String> = async {
        for pkid in pkids {
            network.write(Packet::PubAck(rumqttc::PubAck::new(pkid))).await.map_err(|e| e.to_string())?;
        }
        let flushed = tokio::time::timeout(ACK_FLUSH_LIMIT, network.flush()).await;
        flushed.map_err(|_| "timed out".to_string())?.map_err(|e| e.to_string())
    }
    .await;
    // A broken connection shows in the next `poll` too, which reconnects.
    if let Err(e) = written {
        tracing::warn!(error = %e, "MQTT acks not written; the broker will redeliver");
    }
}

/// The packet ids of `acks` that arrived on `connection`, in order, and how many others there
/// were. The broker delivers again, on the new connection, what was in flight on an old one,
/// and may give a new message the packet id of an old one that was not acked: an old ack
/// written now could acknowledge that message before it is stored.
fn acks_of_connection(acks: Vec<(u64, u16)>, connection: u64) -> (Vec<u16>, usize) {
    let total = acks.len();
    let current: Vec<u16> = acks.into_iter().filter(|&(c, _)| c == connection).map(|(_, pkid)| pkid).collect();
    let stale = total - current.len();
    (current, stale)
}

/// Longest wait for the socket to take a batch of acks.
const ACK_FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// Resolves once the flag is `true` (or its sender is gone).
async fn is_set(flag: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`; drop it before returning.
    let _ = flag.wait_for(|v| *v).await.map(|_| ());
}

/// Where the acks of a connection's messages go: its intake loop's channel, and the
/// connection's connects at their arrival.
type AckTo<'a> = (&'a AckSender, u64);

fn decode_publish(wire: &WireConfig, acks: AckTo<'_>, publish: rumqttc::Publish, stats: &MqttStats) -> IngestBatch {
    let mut batch = decode_mqtt(wire, &publish.topic, &publish.payload, crate::now_ms());
    batch.count_as_message();
    stats.messages.fetch_add(1, Ordering::Relaxed);
    stats.bytes.fetch_add(publish.payload.len() as u64, Ordering::Relaxed);
    stats.log_bytes.fetch_add(broker_log_size(publish.topic.len(), publish.payload.len()), Ordering::Relaxed);
    stats.readings.fetch_add(batch.readings.len() as u64, Ordering::Relaxed);
    stats.dead_letters.fetch_add(batch.dead_letters.len() as u64, Ordering::Relaxed);
    batch.set_source(publish.topic);
    if publish.qos != QoS::AtMostOnce {
        let ((acks, connection), pkid) = ((acks.0.clone(), acks.1), publish.pkid);
        batch.acks.push(Ack::new(move || {
            if acks.send((connection, pkid)).is_err() {
                tracing::warn!(pkid, "MQTT consumer gone before the ack; the broker will redeliver");
            }
        }));
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = MqttConfig::default().with_url("mqtt://10.0.0.5:1884").expect("valid");
        assert_eq!((c.host.as_str(), c.port), ("10.0.0.5", 1884));
        let c = MqttConfig::default().with_url("broker.local").expect("valid");
        assert_eq!((c.host.as_str(), c.port, c.tls_scheme), ("broker.local", 1883, false));
        let c = MqttConfig::default().with_url("mqtts://broker.local").expect("valid");
        assert_eq!((c.host.as_str(), c.port, c.tls_scheme), ("broker.local", 8883, true));
        let c = MqttConfig::default().with_url("ssl://10.0.0.5:8884/").expect("valid");
        assert_eq!((c.host.as_str(), c.port, c.tls_scheme), ("10.0.0.5", 8884, true));
        let c = MqttConfig::default().with_url("MQTTS://h").expect("valid");
        assert_eq!((c.port, c.tls_scheme), (8883, true));
        // A password in a url is never shown.
        let e = MqttConfig::default().with_url("mqtt://hg:S3cret@h:1883").expect_err("credentials");
        assert!(e.starts_with("MQTT url \"mqtt://hg:***@h:1883\" is not host:port") && !e.contains("S3cret"), "{e}");
        assert_eq!(redact_userinfo("ssl://u:p:q@h/x@y"), "ssl://u:***@h/x@y");
        assert_eq!(redact_userinfo("h:1883"), "h:1883");
        let c = MqttConfig::default().with_url("tcp://h:1").expect("valid");
        assert_eq!((c.host.as_str(), c.port, c.tls_scheme), ("h", 1, false));
        // A plain url takes no TLS files; one without them is plain.
        let ca = Path::new("ca.pem");
        assert_eq!(MqttConfig::default().with_tls(Some(ca), None).expect_err("not TLS"), [TlsError::NotTls]);
        assert!(MqttConfig::default().with_tls(None, None).expect("plain").tls.is_none());
        let e = MqttConfig::default().with_url("mqtt://h:99999").expect_err("bad port");
        assert!(e.contains("port \"99999\""), "{e}");
        assert!(MqttConfig::default().with_url("mqtt://:1883").is_err());
        for (url, why) in [
            ("ws://h:80", "scheme \"ws\" is not supported"),
            ("mqtt://user:pw@h:1883", "credentials: the login is mqtt.username and mqtt.password"),
            ("mqtts://[::1]:8883", "an IPv6 address cannot be checked against the broker's certificate"),
            ("mqtt://h:1883/x", "is not host:port"),
            ("mqtt://h:0", "is not a number from 1 to 65535"),
        ] {
            let e = MqttConfig::default().with_url(url).expect_err(url);
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    /// The publishes waiting in rumqttc's event queue join the batch of the one before, in
    /// order, with their acks; acks written are passed over; the first other event stops it and
    /// stays queued, and a batch that reached [`COALESCE_READINGS`] readings takes no more.
    #[test]
    fn queued_publishes_join_one_batch_up_to_the_first_other_event() {
        let (_client, mut eventloop) = AsyncClient::new(MqttOptions::new("t", "127.0.0.1", 1), 4);
        let (acks, _written) = mpsc::unbounded_channel();
        let (stats, wire) = (MqttStats::default(), WireConfig::default());
        let publish = |device: &str, payload: String| {
            let mut p = rumqttc::Publish::new(format!("hourglass/t/{device}"), QoS::AtLeastOnce, payload);
            p.pkid = 1;
            Event::Incoming(Packet::Publish(p))
        };
        let reading = |ts: i64| format!(r#"{{"ts":{ts},"v":1.5}}"#);
        eventloop.state.events.extend([
            Event::Outgoing(rumqttc::Outgoing::PubAck(7)),
            publish("d2", reading(2000)),
            Event::Outgoing(rumqttc::Outgoing::PubAck(8)),
            publish("d3", reading(3000)),
            Event::Incoming(Packet::PingResp),
            publish("d4", reading(4000)),
        ]);
        let first = rumqttc::Publish::new("hourglass/t/d1", QoS::AtLeastOnce, reading(1000));
        let mut batch = decode_publish(&wire, (&acks, 1), first, &stats);
        assert!(take_queued(&mut eventloop, &mut batch, &wire, (&acks, 1), &stats).is_none());
        let devices: Vec<(&str, i64)> = batch.readings.iter().map(|r| (&*r.device, r.reading.ts)).collect();
        assert_eq!(devices, [("d1", 1000), ("d2", 2000), ("d3", 3000)]);
        assert_eq!(batch.acks.len(), 3);
        assert_eq!(stats.messages.load(Ordering::Relaxed), 3);
        assert_eq!(eventloop.state.events.len(), 2);
        assert_eq!(eventloop.state.events.front(), Some(&Event::Incoming(Packet::PingResp)));

        // A batch of COALESCE_READINGS readings goes as it is.
        eventloop.state.events.pop_front();
        let many: Vec<String> = (0..COALESCE_READINGS as i64).map(reading).collect();
        let large = rumqttc::Publish::new("hourglass/t/d5", QoS::AtLeastOnce, format!("[{}]", many.join(",")));
        let mut batch = decode_publish(&wire, (&acks, 1), large, &stats);
        assert_eq!(batch.readings.len(), COALESCE_READINGS);
        assert!(take_queued(&mut eventloop, &mut batch, &wire, (&acks, 1), &stats).is_none());
        assert_eq!((batch.readings.len(), eventloop.state.events.len()), (COALESCE_READINGS, 1));
    }

    /// Filters under the prefix that share no topic pass; each other kind of list is refused,
    /// naming what is wrong.
    #[test]
    fn subscriptions_are_filters_under_the_prefix_sharing_no_topic() {
        let check = |subs: &[&str]| {
            let subs: Vec<String> = subs.iter().map(|s| s.to_string()).collect();
            check_subscriptions("hg", &subs)
        };
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&["hg/#"]), Ok(()));
        assert_eq!(check(&["hg/a/#", "hg/b/#", "hg/lp", "hg/c/+/d", "hg/c/+/e"]), Ok(()));
        assert_eq!(check(&["hg/a", "hg/a/+"]), Ok(()), "`hg/a/+` does not match `hg/a`");

        let err = |subs: &[&str]| check(subs).expect_err("refused");
        assert_eq!(
            err(&["hg/a/#", "hg/#"]),
            r#""hg/a/#" and "hg/#" overlap: a message on a topic both match would be taken twice"#
        );
        assert!(err(&["hg/a", "hg/a/#"]).contains("overlap"), "`hg/a/#` matches `hg/a`");
        assert!(err(&["hg/+/x", "hg/a/+"]).contains("overlap"), "both match `hg/a/x`");
        assert!(err(&["hg/a/#", "hg/a/#"]).contains("overlap"));
        assert_eq!(err(&["other/a/#"]), r#""other/a/#" is not under the topic prefix: it must start with "hg/""#);
        assert!(err(&["hg"]).contains("not under the topic prefix"), "the prefix alone holds no table");
        assert!(err(&["#"]).contains("not under the topic prefix"));
        assert_eq!(
            err(&["hg/a#"]),
            r#""hg/a#" is not a topic filter: level "a#" (levels are not empty; `+` and `#` stand alone, `#` last)"#
        );
        assert!(err(&["hg/#/a"]).contains("not a topic filter"));
        assert!(err(&["hg//a"]).contains("not a topic filter"));
        assert!(err(&["hg/a+"]).contains("not a topic filter"));
        let many: Vec<String> = (0..=MAX_SUBSCRIPTIONS).map(|i| format!("hg/t{i}")).collect();
        assert_eq!(check_subscriptions("hg", &many), Err(format!("65 subscriptions; at most {MAX_SUBSCRIPTIONS}")));
    }

    /// Without subscriptions the one connection keeps the configured client id (and so the
    /// session it always had); each subscription takes it with a hash of its filter, whatever
    /// its place in the list.
    #[test]
    fn each_subscription_has_a_client_id_of_its_own() {
        let mut cfg = MqttConfig { client_id: "hg-ingest".into(), ..MqttConfig::default() };
        assert_eq!((cfg.filters(), cfg.client_ids()), (vec!["hourglass/#".to_string()], vec!["hg-ingest".to_string()]));
        cfg.subscriptions = vec!["hourglass/a/#".into()];
        let one = format!("hg-ingest-{:016x}", filter_hash("hourglass/a/#"));
        assert_eq!((cfg.filters(), cfg.client_ids()), (vec!["hourglass/a/#".to_string()], vec![one]));
        cfg.subscriptions = vec!["hourglass/a/#".into(), "hourglass/b/#".into()];
        let ids = cfg.client_ids();
        assert_eq!(
            ids,
            [
                format!("hg-ingest-{:016x}", filter_hash("hourglass/a/#")),
                format!("hg-ingest-{:016x}", filter_hash("hourglass/b/#"))
            ]
        );
        cfg.subscriptions.reverse();
        assert_eq!(cfg.client_ids(), [ids[1].clone(), ids[0].clone()]);
        // FNV-1a 64: the empty string is the offset basis; "a" is the published test vector.
        assert_eq!((filter_hash(""), filter_hash("a")), (0xcbf2_9ce4_8422_2325, 0xaf63_dc4c_8601_ec8c));
    }

    /// The consumer is subscribed once every connection is, and not while any is not.
    #[test]
    fn subscribed_means_every_connection_is() {
        let (ready, rx) = Readiness::new(2);
        ready.set(0, true);
        assert!(!*rx.borrow());
        ready.set(1, true);
        assert!(*rx.borrow());
        ready.set(0, false);
        assert!(!*rx.borrow());
        ready.set(0, true);
        assert!(*rx.borrow());
    }

    /// Only the acks of messages that arrived on the current connection are written, in order.
    #[test]
    fn acks_of_an_earlier_connection_are_not_written() {
        let acks = vec![(1, 7), (2, 1), (1, 8), (2, 2), (2, 7)];
        assert_eq!(acks_of_connection(acks.clone(), 2), (vec![1, 2, 7], 2));
        assert_eq!(acks_of_connection(acks, 1), (vec![7, 8], 3));
    }

    /// A message received counts once, its payload's bytes, and what it took in the embedded
    /// broker's log: 4 bytes more than its topic and payload.
    #[test]
    fn a_message_received_counts_its_bytes_and_its_log_size() {
        let (acks, _written) = mpsc::unbounded_channel();
        let stats = MqttStats::default();
        let wire = WireConfig::default();
        for (topic, payload) in [("hourglass/t/d1", r#"{"ts":1000,"v":1.5}"#), ("hourglass/t/d2", "not json")] {
            let publish = rumqttc::Publish::new(topic, QoS::AtMostOnce, payload);
            decode_publish(&wire, (&acks, 1), publish, &stats);
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!((load(&stats.messages), load(&stats.readings), load(&stats.dead_letters)), (2, 1, 1));
        assert_eq!(load(&stats.bytes), 19 + 8);
        assert_eq!(load(&stats.log_bytes), (4 + 14 + 19) + (4 + 14 + 8));
        // Nothing from the broker's meters yet: no backlog, not a negative one.
        assert_eq!(stats.broker_backlog_bytes(), 0);
        stats.broker_published.store(3, Ordering::Relaxed);
        stats.broker_published_bytes.store(63 + 4 + 14 + 100, Ordering::Relaxed);
        assert_eq!((stats.broker_backlog(), stats.broker_backlog_bytes()), (1, 4 + 14 + 100));
        // Messages a skip is known to have dropped never arrive: not held either, nor their
        // bytes, taken off at the mean size of the unread ones (8 unread of 800 bytes).
        stats.broker_published.store(10, Ordering::Relaxed);
        stats.broker_published_bytes.store(63 + 800, Ordering::Relaxed);
        stats.broker_skipped_messages.store(5, Ordering::Relaxed);
        assert_eq!((stats.broker_backlog(), stats.broker_backlog_bytes()), (3, 300));
        stats.broker_skipped_messages.store(9, Ordering::Relaxed);
        assert_eq!((stats.broker_backlog(), stats.broker_backlog_bytes()), (0, 0));
        // Meters behind the messages read (2 of them): nothing unread, none held.
        stats.broker_published.store(1, Ordering::Relaxed);
        assert_eq!((stats.broker_backlog(), stats.broker_backlog_bytes()), (0, 0));
    }
}
