//! Helpers of the integration tests: the `hourglass` binary, a mosquitto broker, an MQTT
//! publisher that reports which messages the broker acked, and HTTP GETs. Everything binds to
//! 127.0.0.1 and is stopped when its guard drops.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Outgoing, Packet, QoS};
use serde_json::Value;

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_port(addr: SocketAddr, limit: Duration) {
    let ok = wait_for(limit, || TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok());
    assert!(ok.is_some(), "nothing listening on {addr} after {limit:?}");
}

/// A running `hourglass serve`, killed (SIGKILL) on drop unless stopped before.
pub struct Hourglass {
    pub child: Child,
    pub http: SocketAddr,
    pub mqtt_port: u16,
    pub data_dir: PathBuf,
}

impl Hourglass {
    /// Starts `hourglass serve` on free ports with its data in `data_dir`; `mqtt_url` selects
    /// an external broker instead of the embedded one. Returns once it printed its ready line.
    pub fn start(data_dir: &Path, mqtt_url: Option<&str>) -> Hourglass {
        let http = free_addr();
        let mqtt = free_addr();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--http-listen")
            .arg(http.to_string())
            .arg("--mqtt-listen")
            .arg(mqtt.to_string())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(url) = mqtt_url {
            cmd.arg("--mqtt-url").arg(url);
        }
        let mut child = cmd.spawn().expect("spawn hourglass");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("hourglass ready") {
                    let _ = tx.send(line);
                }
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(60));
        assert!(ready.is_ok(), "hourglass serve did not become ready within 60 s");
        let mqtt_port = match mqtt_url {
            Some(url) => url.rsplit(':').next().unwrap().parse().unwrap(),
            None => mqtt.port(),
        };
        Hourglass { child, http, mqtt_port, data_dir: data_dir.to_path_buf() }
    }

    /// `GET path` on the query service: (status, JSON body).
    pub fn get(&self, path_and_query: &str) -> (u16, Value) {
        get_json(&format!("http://{}{}", self.http, path_and_query))
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let exit = wait_for(Duration::from_secs(30), || self.child.try_wait().unwrap());
        assert!(exit.expect("hourglass exits within 30 s of SIGTERM").success());
    }
}

impl Drop for Hourglass {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET a URL: (status, JSON body).
pub fn get_json(url: &str) -> (u16, Value) {
    match ureq::get(url).timeout(Duration::from_secs(30)).call() {
        Ok(r) => (r.status(), r.into_json().expect("JSON body")),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().expect("JSON error body")),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// Debian's mosquitto on a free loopback port with its own config file; stopped on drop.
pub struct Mosquitto {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    pub fn start() -> Mosquitto {
        let dir = tempfile::tempdir().unwrap();
        let port = free_addr().port();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 max_inflight_messages 1000\nmax_queued_messages 1000000\nmessage_size_limit 0\n"
            ),
        )
        .unwrap();
        let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("mosquitto is installed (the test command installs it)");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mosquitto");
        wait_port(SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(10));
        Mosquitto { child, port, _dir: dir }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `messages` in order at QoS 1, one at a time, each after the broker acked the one
/// before. Calls `acked(i)` for message `i` once its PUBACK arrived. Stops early (returning
/// the count acked) after `limit` or on a connection error.
pub fn publish_qos1(
    port: u16,
    client_id: &str,
    messages: &[(String, Vec<u8>)],
    limit: Duration,
    mut acked: impl FnMut(usize),
) -> usize {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(8 << 20, 8 << 20);
    let (client, mut conn) = Client::new(o, 16);
    let deadline = Instant::now() + limit;
    let mut done = 0;
    for (i, (topic, payload)) in messages.iter().enumerate() {
        client.publish(topic, QoS::AtLeastOnce, false, payload.clone()).unwrap();
        loop {
            if Instant::now() > deadline {
                return done;
            }
            match conn.recv_timeout(Duration::from_millis(500)) {
                Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => break,
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(rumqttc::RecvTimeoutError::Disconnected) => return done,
                Err(rumqttc::RecvTimeoutError::Timeout) => {}
            }
        }
        acked(i);
        done += 1;
    }
    let _ = client.disconnect();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        match conn.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(Event::Outgoing(Outgoing::Disconnect))) | Ok(Err(_)) | Err(_) => break,
            _ => {}
        }
    }
    done
}
