//! The query service's connections: HTTP/1.1 served by hyper, as `axum::serve` does, with the
//! read timeout `axum::serve` has not (QA49 R7).
//!
//! A connection whose client sends no request header within the read timeout (a silent one, or
//! a kept-alive one idle since its last answer) is closed, and so is a request whose body
//! stalls as long: its answer is a 408 ([`crate::api::ApiError::Timeout`]). Without it, a client
//! that connected (or finished its TLS handshake) and sent nothing held a task and a file
//! descriptor, shared with RocksDB, for good. An answer being written is not timed: a slow
//! reader of a large answer is served as it reads.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// The read timeout when the configuration gives none: hyper's own default for a request's
/// header.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stop lets the requests being read or answered finish before it closes their
/// connections: a client sending its body a byte at a time, each within the read timeout,
/// held the stop for as long as it went on (QA60 F3: 116 s, any client, no token needed).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on the connections of `listener` until `stop` completes; then accepts no more,
/// lets each connection finish the request it is answering for up to [`STOP_GRACE`] (then
/// closes it), and returns once all are closed.
/// A connection's client has `read_timeout` for each request header (from its connection, or
/// from its previous answer) and for each part of a request body.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    read_timeout: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) where
    L: Listener,
{
    // Dropped when `stop` completes: each connection's task then shuts down gracefully.
    let (stopping_tx, stopping_rx) = watch::channel(());
    tokio::spawn(async move {
        stop.await;
        drop(stopping_rx);
    });
    // Held by each connection's task: all are closed once no receiver is left.
    let (closed_tx, closed_rx) = watch::channel(());
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopping_tx.closed() => break,
        };
        let service = app
            .clone()
            .map_request(move |req: Request<Incoming>| req.map(|body| Body::new(TimeoutBody::new(read_timeout, body))));
        let service = TowerToHyperService::new(service);
        let (stopping, closed, cut) = (stopping_tx.clone(), closed_rx.clone(), cut.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(read_timeout);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            let mut stopped = pin!(stopping.closed());
            let mut grace = pin!(async {
                stopping.closed().await;
                tokio::time::sleep(STOP_GRACE).await;
            });
            let mut shutting_down = false;
            loop {
                tokio::select! {
                    // A client gone, a header timed out, a malformed request: hyper has answered
                    // what it could; nothing to add.
                    _ = conn.as_mut() => break,
                    () = &mut stopped, if !shutting_down => {
                        shutting_down = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    () = &mut grace => {
                        cut.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                }
            }
            drop(closed);
        });
    }
    drop(closed_rx);
    drop(listener);
    closed_tx.closed().await;
    let cut = cut.load(std::sync::atomic::Ordering::Relaxed);
    if cut > 0 {
        tracing::warn!(
            connections = cut,
            "closed the connections whose requests were still being read or answered {} s into the stop",
            STOP_GRACE.as_secs()
        );
    }
}

/// Whether `error` (or an error it came from) is a request body's read timeout.
pub fn is_read_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        next = e.source();
    }
    false
}
