//! The embedded broker at an ordered stop: closed to its clients, then read to its end.
//!
//! rumqttd acks a QoS 1 PUBLISH as soon as its router holds the message, before Hourglass has
//! read it, and it has no call to stop taking publishes or connections. An ordered stop that
//! only stopped reading lost what the broker acked while the stop ran (a review's SIGTERM under
//! a full-rate publisher: 81 of 11,434 acked readings). So the stop first stops the broker
//! taking connections ([`stop_listening`]: a client connecting is refused from then on), then
//! closes the broker's ends of its clients' connections for reading (`shutdown(SHUT_RD)` on
//! this process's own sockets: rumqttd reads what the kernel holds, then end of stream, and
//! drops the connection), again every [`SCAN_EVERY`] for any accepted meanwhile, while the
//! consumer goes on reading; once no client connection is left, the broker's meters have
//! counted every message it took ([`SETTLE`]), and the consumer has read them all, intake stops
//! as before. A message the broker never read stays unacked: its publisher sends it again to
//! the next run. (Without the first step, devices that reconnect at once, as devices do, kept
//! the broker taking and acking until [`DRAIN_LIMIT`], and every such stop took 30 s.)
//!
//! Hourglass's own connections (its consumer, and the in-process publishers of `demo` and
//! `bench`) are told by their other end, which is a socket of this process too, and left open.
//! Linux only (`/proc/self/fd`); elsewhere, or when the sockets cannot be read, the stop still
//! reads what the broker holds, with a warning that what it acks after intake stops is lost.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ingest::mqtt::MqttStats;

/// The pause between two looks for the broker's client connections while it drains (a look
/// costs about 2 µs a descriptor of the process).
const SCAN_EVERY: Duration = Duration::from_millis(20);
/// How long no client connection must have been open before the broker's meters are trusted
/// to hold every message it took: its meters are pushed every second (`start_embedded_broker`),
/// and half a second more for the router to take what the last connections handed it.
pub(crate) const SETTLE: Duration = Duration::from_millis(1_500);
/// The longest the stop reads the broker's backlog; what is left then is lost, with a warning.
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// What closing and draining the broker did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Clients whose connections were closed (by their addresses).
    pub(crate) closed: usize,
    /// Messages the consumer read meanwhile.
    pub(crate) messages: u64,
    /// Messages the broker still held for Hourglass when the drain gave up (0: none).
    pub(crate) left: u64,
    /// Whether the connections could be closed at all.
    pub(crate) closable: bool,
    /// Whether no client connection was open for [`SETTLE`] before the drain ended (else
    /// clients kept reconnecting until `limit`, and what they published in the last second may
    /// not have been counted).
    pub(crate) settled: bool,
}

/// The ends of TCP connections that are the broker's ends of its clients' connections from
/// other processes: of `ends`, each (local, peer) address of a connected socket of this
/// process, the indexes of those whose local address is `listen` and whose peer is not one of
/// this process's own sockets.
pub(crate) fn outside_clients(listen: SocketAddr, ends: &[(SocketAddr, SocketAddr)]) -> Vec<usize> {
    let at_listen =
        |a: &SocketAddr| a.port() == listen.port() && (listen.ip().is_unspecified() || a.ip() == listen.ip());
    let own: HashSet<SocketAddr> =
        ends.iter().filter(|(local, peer)| at_listen(peer) && !at_listen(local)).map(|(local, _)| *local).collect();
    ends.iter()
        .enumerate()
        .filter(|(_, (local, peer))| at_listen(local) && !own.contains(peer))
        .map(|(i, _)| i)
        .collect()
}

/// Closes for reading the broker's ends of the connections of clients outside this process;
/// answers their clients' addresses (a connection closed by an earlier call and not yet dropped
/// by the broker is closed and answered again).
#[cfg(target_os = "linux")]
fn close_outside_clients(listen: SocketAddr) -> std::io::Result<Vec<SocketAddr>> {
    use rustix::net::{shutdown, Shutdown};
    // Every connected TCP socket's ends by descriptor number; each copy is closed at once, so
    // a process near its descriptor limit does not run out.
    let mut fds = Vec::new();
    let mut ends = Vec::new();
    for fd in descriptors()? {
        if let Some((_, end)) = connected(fd) {
            fds.push(fd);
            ends.push(end);
        }
    }
    let mut closed = Vec::new();
    for i in outside_clients(listen, &ends) {
        // Copied again, and closed only if it still names that connection (the number may
        // have been closed and reused meanwhile).
        if let Some((socket, end)) = connected(fds[i]) {
            // Fails only for a connection already gone: nothing more to do then.
            if end == ends[i] && shutdown(&socket, Shutdown::Read).is_ok() {
                closed.push(end.1);
            }
        }
    }
    Ok(closed)
}

/// Stops the broker listening on `listen` taking connections: rumqttd has no call for it, and
/// its accept loop retries a failed `accept` at once (a listener shut down would spin it), so
/// the descriptor of its listening socket is made to name a stand-in instead, a listener of our
/// own on a port of loopback's that the kernel picks, non-blocking, that no one is told of.
/// The broker's socket is closed with its last descriptor, which takes it out of the broker's
/// event loop: a client connecting to `listen` is refused from then on, and the accept loop
/// waits for ever on a socket it is never woken for (at worst one `accept` of the stand-in's,
/// which answers that nothing is waiting). Answers whether the socket was found.
#[cfg(target_os = "linux")]
pub(crate) fn stop_listening(listen: SocketAddr) -> std::io::Result<bool> {
    use rustix::net::{getsockname, sockopt::socket_acceptconn};
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::os::fd::AsRawFd;
    let loopback: std::net::IpAddr =
        if listen.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() };
    let stand_in = std::net::TcpListener::bind((loopback, 0))?;
    stand_in.set_nonblocking(true)?;
    let mut found = false;
    for fd in descriptors()? {
        let Some(socket) = dup(fd) else { continue };
        let at_listen = getsockname(&socket).ok().and_then(|a| SocketAddr::try_from(a).ok()) == Some(listen);
        if !at_listen || !socket_acceptconn(&socket).unwrap_or(false) {
            continue;
        }
        #[allow(unsafe_code)]
        // SAFETY: `dup3` touches no memory. It makes `fd` name the stand-in, atomically; the
        // number stays open, so the broker's listener, which owns it, goes on using a valid
        // descriptor. `fd` still named the listener here: rumqttd never closes it while it runs.
        let replaced = unsafe { libc::dup3(stand_in.as_raw_fd(), fd, libc::O_CLOEXEC) };
        if replaced < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Our copy was the listening socket's last descriptor: it closes here.
        drop(socket);
        found = true;
    }
    Ok(found)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn stop_listening(_listen: SocketAddr) -> std::io::Result<bool> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "closing the broker's listener needs Linux"))
}

/// The numbers of this process's open descriptors, from `/proc/self/fd` (one may be closed,
/// or its number reused, by the time it is looked at: callers work on a `dup` of it).
#[cfg(target_os = "linux")]
fn descriptors() -> std::io::Result<Vec<i32>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
            fds.push(fd);
        }
    }
    Ok(fds)
}

/// A copy of descriptor `fd` with its (local, peer) addresses, if it is a connected TCP
/// socket. The copy is ours: what it names cannot change while it is held.
#[cfg(target_os = "linux")]
fn connected(fd: i32) -> Option<(std::os::fd::OwnedFd, (SocketAddr, SocketAddr))> {
    use rustix::net::{getpeername, getsockname};
    let socket = dup(fd)?;
    let local = SocketAddr::try_from(getsockname(&socket).ok()?).ok()?;
    let peer = SocketAddr::try_from(getpeername(&socket).ok()??).ok()?;
    Some((socket, (local, peer)))
}

#[cfg(not(target_os = "linux"))]
fn close_outside_clients(_listen: SocketAddr) -> std::io::Result<Vec<SocketAddr>> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "closing the broker's connections needs Linux"))
}

/// A descriptor of our own for the file `fd` names, if it is open.
#[cfg(target_os = "linux")]
fn dup(fd: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    #[allow(unsafe_code)]
    // SAFETY: `dup` takes any number and touches no memory: for a number that is not an open
    // descriptor it fails with EBADF. A descriptor it returns is new and ours alone, so the
    // `OwnedFd` owns it (and closes it when dropped).
    unsafe {
        let copy = libc::dup(fd);
        (copy >= 0).then(|| std::os::fd::OwnedFd::from_raw_fd(copy))
    }
}

/// Closes the embedded broker listening on `listen` to its clients and lets the consumer read
/// what it acked, as the module documentation says; returns once the broker holds nothing more
/// for Hourglass, or after `limit`.
pub(crate) async fn close_and_drain(listen: SocketAddr, stats: &MqttStats, limit: Duration) -> Drained {
    let start = Instant::now();
    let read_before = stats.messages.load(Ordering::Relaxed);
    let mut drained = Drained { closed: 0, messages: 0, left: 0, closable: true, settled: false };
    let mut closed = HashSet::new();
    // Since when the scans have found no client connection open.
    let mut clear_since: Option<Instant> = None;
    // The messages read when the consumer last read one, and when (see `idle` below).
    let mut last_progress = (u64::MAX, Instant::now());
    match tokio::task::spawn_blocking(move || stop_listening(listen)).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => tracing::warn!(%listen, "the embedded MQTT broker's listening socket was not found: \
            clients that reconnect at once may keep the stop reading until its limit"),
        Ok(Err(e)) => tracing::warn!(%listen, error = %e, "cannot stop the embedded MQTT broker taking connections: \
            clients that reconnect at once may keep the stop reading until its limit"),
        Err(e) => tracing::warn!(error = %e, "cannot stop the embedded MQTT broker taking connections"),
    }
    loop {
        let now = Instant::now();
        if drained.closable {
            // Reads `/proc` and a few calls a descriptor: off the runtime's workers.
            let scan = tokio::task::spawn_blocking(move || close_outside_clients(listen)).await;
            match scan.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
                Ok(clients) if clients.is_empty() => {}
                Ok(clients) => {
                    closed.extend(clients);
                    drained.closed = closed.len();
                    clear_since = None;
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "cannot close the embedded MQTT broker to its clients: what it acks after Hourglass \
                         stops reading is lost"
                    );
                    drained.closable = false;
                }
            }
        }
        let clear = *clear_since.get_or_insert(now);
        let read = stats.messages.load(Ordering::Relaxed);
        if read != last_progress.0 {
            last_progress = (read, now);
        }
        // Every message the clients handed the broker before their connections closed is in
        // its meters by now.
        let settled = now.duration_since(clear) >= SETTLE;
        // A skip (the backlog outran `mqtt.broker_backlog_mb`) counts messages that never
        // arrive: then the broker is read to its end when nothing came for a while.
        let idle = stats.broker_skips.load(Ordering::Relaxed) > 0 && now.duration_since(last_progress.1) >= SETTLE;
        let left = stats.broker_backlog();
        drained.settled = settled;
        if settled && (left == 0 || idle) {
            break;
        }
        if now.duration_since(start) >= limit {
            drained.left = left;
            break;
        }
        tokio::time::sleep(SCAN_EVERY).await;
    }
    drained.messages = stats.messages.load(Ordering::Relaxed) - read_before;
    drained
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn outside_clients_are_the_broker_ends_whose_peer_is_not_ours() {
        let listen = at("127.0.0.1:1883");
        let ends = [
            // The consumer's connection, both ends in this process.
            (at("127.0.0.1:40001"), at("127.0.0.1:1883")),
            (at("127.0.0.1:1883"), at("127.0.0.1:40001")),
            // A sensor elsewhere: only the broker's end is here.
            (at("127.0.0.1:1883"), at("127.0.0.1:40002")),
            (at("127.0.0.1:1883"), at("10.0.0.7:51000")),
            // An HTTP client of the query service, and a connection of ours to elsewhere.
            (at("127.0.0.1:8080"), at("127.0.0.1:40003")),
            (at("127.0.0.1:40004"), at("10.0.0.9:9092")),
        ];
        assert_eq!(outside_clients(listen, &ends), [2, 3]);
        // Listening on every address: any local address at the port is the broker's.
        let any = at("0.0.0.0:1883");
        let ends = [
            (at("10.0.0.2:1883"), at("10.0.0.7:51000")),
            (at("127.0.0.1:40001"), at("127.0.0.1:1883")),
            (at("127.0.0.1:1883"), at("127.0.0.1:40001")),
            (at("10.0.0.2:1884"), at("10.0.0.7:51001")),
        ];
        assert_eq!(outside_clients(any, &ends), [0]);
        // Bound to one address, another address's port is not the broker's.
        assert_eq!(outside_clients(listen, &[(at("10.0.0.2:1883"), at("10.0.0.7:51000"))]), Vec::<usize>::new());
    }

    /// With no client connected, the drain ends once the meters are trusted ([`SETTLE`]) and
    /// the consumer has read what they count; what is left at the limit is answered.
    #[tokio::test]
    async fn the_drain_waits_for_what_the_broker_counted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let listen = listener.local_addr().expect("address");
        let stats = MqttStats::default();
        let start = Instant::now();
        let drained = close_and_drain(listen, &stats, DRAIN_LIMIT).await;
        assert!(start.elapsed() >= SETTLE);
        assert_eq!(drained, Drained { closed: 0, messages: 0, left: 0, closable: true, settled: true });
        // The broker took 7 messages, the consumer read 4 and reads no more: 3 left at the limit.
        stats.broker_published.store(7, Ordering::Relaxed);
        stats.messages.store(4, Ordering::Relaxed);
        let drained = close_and_drain(listen, &stats, SETTLE * 2).await;
        assert_eq!(drained, Drained { closed: 0, messages: 0, left: 3, closable: true, settled: true });
        // A skip counts messages that never arrive: then the drain ends when none came for a while.
        stats.broker_skips.store(1, Ordering::Relaxed);
        let drained = close_and_drain(listen, &stats, DRAIN_LIMIT).await;
        assert_eq!(drained, Drained { closed: 0, messages: 0, left: 0, closable: true, settled: true });
    }

    /// A listener stopped refuses connections, and an accept loop that retries its errors at
    /// once, as rumqttd's does, gets none: it waits. Another listener is left alone.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_listener_stopped_refuses_connections_and_its_accept_loop_waits() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let listen = listener.local_addr().expect("address");
        let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (accepted, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let accept_loop = {
            let (accepted, failed) = (accepted.clone(), failed.clone());
            tokio::spawn(async move {
                // At most a million turns: a loop spinning on errors ends, and is counted.
                for _ in 0..1_000_000 {
                    match listener.accept().await {
                        Ok(_) => accepted.fetch_add(1, Ordering::SeqCst),
                        Err(_) => failed.fetch_add(1, Ordering::SeqCst),
                    };
                }
            })
        };
        let before = tokio::net::TcpStream::connect(listen).await.expect("connect before");
        for _ in 0..100 {
            if accepted.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert!(tokio::task::spawn_blocking(move || stop_listening(listen)).await.expect("join").expect("scan"));
        let err = tokio::net::TcpStream::connect(listen).await.expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        // A connection accepted before stays open.
        assert!(before.peer_addr().is_ok());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!((accepted.load(Ordering::SeqCst), failed.load(Ordering::SeqCst)), (1, 0));
        assert!(!accept_loop.is_finished());
        accept_loop.abort();
        // The other listener still takes connections; a second call finds no listener at `listen`.
        std::net::TcpStream::connect(other.local_addr().expect("address")).expect("connect to the other");
        assert!(!stop_listening(listen).expect("scan"));
    }

    /// A connection from another process (`bash`'s `/dev/tcp`) is closed for reading: a read of
    /// the listener's end of it ends the stream. A connection with both ends here is not.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_connection_from_another_process_is_closed_and_ours_are_not() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let listen = listener.local_addr().expect("address");
        // Ours: both ends in this process.
        let _ours = std::net::TcpStream::connect(listen).expect("connect");
        let (mut ours_accepted, _) = listener.accept().expect("accept ours");
        // Another process's, held open for a while.
        let mut child = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("exec 3<>/dev/tcp/127.0.0.1/{}; sleep 30", listen.port()))
            .spawn()
            .expect("bash");
        let (mut theirs, _) = listener.accept().expect("accept theirs");
        let (theirs_peer, ours_peer) = (theirs.peer_addr().expect("peer"), ours_accepted.peer_addr().expect("peer"));
        assert_ne!(theirs_peer, ours_peer);
        assert_eq!(close_outside_clients(listen).expect("scan"), [theirs_peer]);
        theirs.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut buf = [0u8; 8];
        assert_eq!(theirs.read(&mut buf).expect("end of stream, not a timeout"), 0);
        // Ours was left alone: a read waits (and times out) instead of ending.
        ours_accepted.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
        let err = ours_accepted.read(&mut buf).expect_err("still open");
        assert!(matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{err}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
