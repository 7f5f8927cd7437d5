//! HTTPS for the query service: a rustls server (on ring, as the MQTT client's TLS) whose
//! certificate chain and key are PEM files, and a listener that hands axum the connections
//! whose handshake has succeeded.
//!
//! Each handshake runs in a task of its own, bounded by [`HANDSHAKE_TIMEOUT`]: a client that
//! connects and sends nothing (or a slow one) holds up no other. A failed handshake (a plain
//! HTTP request to the TLS port, a client that does not trust the certificate) closes that
//! connection and is logged at WARN, a reason at most once a minute; a connection closed before
//! its first byte (a port check) is not logged.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

pub use rustls::ServerConfig;

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A problem with the server's certificate or key file, by file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsFileError {
    /// The certificate chain's file.
    #[error("{0}")]
    Cert(String),
    /// The private key's file.
    #[error("{0}")]
    Key(String),
}

/// The rustls server of certificate chain `cert` (PEM, the server's certificate first) and
/// private key `key` (PEM, unencrypted), speaking HTTP/1.1. Every file's problem at once.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, Vec<TlsFileError>> {
    // Expired, not valid yet, or X.509 version 1: rustls serves it, and clients refuse it (QA49
    // R4: an expired one was served, every handshake refused).
    let chain = ingest::mqtt::usable_chain(cert, true, true).map_err(TlsFileError::Cert);
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsFileError::Key(ingest::mqtt::key_unread(key, &e)));
    let (chain, key_der) = match (chain, key_der) {
        (Ok(chain), Ok(key_der)) => (chain, key_der),
        (chain, key_der) => return Err(chain.err().into_iter().chain(key_der.err()).collect()),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![TlsFileError::Cert(e.to_string())])?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            vec![match e {
                rustls::Error::InconsistentKeys(_) => TlsFileError::Key(format!(
                    "{}: not the key of {}'s first certificate, which is to be the service's own, its chain after \
                     it ({e})",
                    key.display(),
                    cert.display()
                )),
                e => TlsFileError::Cert(format!("{}: {e}", cert.display())),
            }]
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener of TLS connections for `axum::serve`: accepts on a TCP listener and hands on each
/// connection once its handshake has succeeded. Dropped (the service stopped), it stops
/// accepting and closes its port.
#[derive(Debug)]
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS with `config` on `tcp`. Call within a tokio runtime.
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, handshaken) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx));
        Ok(TlsListener { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept loop ends only once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// What a plain HTTP request to the TLS port is answered, in plain HTTP (a 400).
pub const PLAIN_ANSWER: &str = "This is Hourglass's query service over HTTPS: ask https:// instead.\n";

/// The TLS handshake of `stream`, or why there is none (`None`: closed before its first byte,
/// a port check, not worth a word). A plain HTTP request (its first byte a method's letter,
/// where a handshake's is 22) is answered so in plain HTTP.
async fn handshake(stream: TcpStream, acceptor: &TlsAcceptor) -> Result<TlsStream<TcpStream>, Option<String>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => return Err(None),
        Ok(_) if first[0].is_ascii_uppercase() => {
            let mut stream = stream;
            // The request read (as much as has come), so that closing does not reset the
            // connection before the client reads the answer.
            let mut request = vec![0u8; 16 * 1024];
            let _ = stream.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\
                 Content-Length: {}\r\n\r\n{PLAIN_ANSWER}",
                PLAIN_ANSWER.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
            return Err(Some("a plain HTTP request, answered 400".into()));
        }
        Ok(_) => {}
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Ok(tls),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(None),
        Err(e) => Err(Some(e.to_string())),
    }
}

/// Accepts connections on `tcp` until the listener is dropped, each handshake in a task of its own.
async fn accept_loop(tcp: TcpListener, acceptor: TlsAcceptor, tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>) {
    let said = Arc::new(Mutex::new(ingest::quiet::QuieterByText::every(Duration::from_secs(60))));
    loop {
        let accepted = tokio::select! {
            () = tx.closed() => return,
            accepted = tcp.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: as axum's own listener, wait a moment and go on.
                tracing::warn!(error = %e, "query service: could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, tx, said) = (acceptor.clone(), tx.clone(), said.clone());
        tokio::spawn(async move {
            let reason = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &acceptor)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                    return;
                }
                Ok(Err(None)) => return,
                Ok(Err(Some(reason))) => reason,
                Err(_) => format!("no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
            };
            let admitted = said.lock().unwrap_or_else(PoisonError::into_inner).admit(&reason, Instant::now());
            if let Some(repeats) = admitted {
                tracing::warn!(
                    %peer, reason, repeats,
                    "query service: a TLS handshake failed (a plain http:// request to the https:// service, or a \
                     client that does not trust its certificate?); the connection is closed"
                );
            }
        });
    }
}
