//! Helpers of the integration tests: the `hourglass` binary, a mosquitto broker, an MQTT
//! publisher that reports which messages the broker acked, and HTTP GETs, POSTs and PUTs. Everything binds to
//! 127.0.0.1 and is stopped when its guard drops.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, MqttOptions, Outgoing, Packet, QoS};
use serde_json::Value;

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Runs `hourglass ARGS` in `dir` to its end and returns the JSON it printed on stdout; panics
/// with its stderr if it failed.
pub fn run_for_json(args: &[&str], dir: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("hourglass runs");
    assert!(out.status.success(), "hourglass {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON report on stdout")
}

/// `hourglass ARGS` running in `dir` with JSON logs, its log lines readable as they come and its
/// stdout kept for the end; killed on drop if it is still running.
pub struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
    logs: Option<std::thread::JoinHandle<Vec<String>>>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Watched {
    /// Starts `hourglass --log-json ARGS` in `dir` with `RUST_LOG=warn,hourglass=info`.
    pub fn start(args: &[&str], dir: &Path) -> Watched {
        Watched::start_with_env(args, dir, &[])
    }

    /// [`Watched::start`] with extra environment variables.
    pub fn start_with_env(args: &[&str], dir: &Path, vars: &[(&str, &str)]) -> Watched {
        use std::io::Read;
        let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .arg("--log-json")
            .args(args)
            .current_dir(dir)
            .env("RUST_LOG", "warn,hourglass=info")
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hourglass starts");
        let (tx, lines) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let logs = std::thread::spawn(move || {
            let mut all = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push(line);
            }
            all
        });
        let mut stdout = child.stdout.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            stdout.read_to_string(&mut s).unwrap();
            s
        });
        Watched { child, lines, logs: Some(logs), stdout: Some(out) }
    }

    /// The first log line not read before for which `f` returns `Some`, within `limit`.
    pub fn find_log<T>(&self, limit: Duration, mut f: impl FnMut(&Value) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + limit;
        std::iter::from_fn(|| self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok())
            .find_map(|line| f(&serde_json::from_str(&line).ok()?))
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        self.signal("-INT");
    }

    /// Sends `signal` (`-TERM`, ...) with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} {}", self.child.id());
    }

    /// Waits at most `limit` for the exit (panics after it) and returns the exit status, every
    /// log line and the stdout.
    pub fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>, String) {
        let Some(exit) = wait_for(limit, || self.child.try_wait().unwrap()) else {
            panic!("hourglass did not exit within {limit:?}");
        };
        let logs = self.logs.take().unwrap().join().unwrap();
        let out = self.stdout.take().unwrap().join().unwrap();
        (exit, logs, out)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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

/// Whether the broker `child` is serving `addr`: `addr` answers within `limit` and the child
/// still runs 100 ms later. `false` when the child exited (it could not bind: the port was
/// taken, and may answer for another process); panics when nothing answers in time.
pub fn broker_up(child: &mut Child, addr: SocketAddr, limit: Duration) -> bool {
    let exited = |child: &mut Child| child.try_wait().unwrap().is_some();
    let answered = wait_for(limit, || {
        if exited(child) {
            return Some(false);
        }
        TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok().map(|_| true)
    });
    match answered {
        Some(true) => {
            std::thread::sleep(Duration::from_millis(100));
            !exited(child)
        }
        Some(false) => false,
        None => panic!("nothing listening on {addr} after {limit:?}"),
    }
}

/// Log lines of a child process, collected by a thread until the pipe closes.
struct Logs {
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
    /// Whether the caller asked for them ([`Hourglass::start_logged`]); otherwise they are only
    /// passed on to the test's output and the last ones kept for a failure's message.
    asked: bool,
}

impl Logs {
    /// Collects `stderr`'s lines; the ones not `asked` for are also written to the test's
    /// output (shown when it fails), and only the last 100 or more are kept.
    fn collect(stderr: std::process::ChildStderr, asked: bool) -> Logs {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !asked {
                    eprintln!("{line}");
                }
                let mut kept = sink.lock().unwrap();
                if !asked && kept.len() >= 200 {
                    kept.drain(..100);
                }
                kept.push(line);
            }
        });
        Logs { lines, reader, asked }
    }

    /// The lines, once the process is gone (its pipe closed).
    fn finish(self) -> (Vec<String>, bool) {
        self.reader.join().unwrap();
        (Arc::try_unwrap(self.lines).unwrap().into_inner().unwrap(), self.asked)
    }
}

/// The first lines of `serve` once it answers: ready, or not ready with the query service up.
const SERVE_GREETINGS: &[&str] = &["hourglass ready", "hourglass serving, not ready"];

/// A running `hourglass serve`, killed (SIGKILL) on drop unless stopped before.
pub struct Hourglass {
    pub child: Child,
    pub http: SocketAddr,
    pub mqtt_port: u16,
    pub data_dir: PathBuf,
    /// What it printed up to its ready line (`serve`: `hourglass ready: …`, or `hourglass
    /// serving, not ready …` when a consumer is not subscribed in its time).
    pub greeting: String,
    logs: Option<Logs>,
}

impl Hourglass {
    /// Starts `hourglass serve` on free ports with its data in `data_dir`; `mqtt_url` selects
    /// an external broker instead of the embedded one. Returns once it printed its ready line.
    pub fn start(data_dir: &Path, mqtt_url: Option<&str>) -> Hourglass {
        Hourglass::launch(data_dir, mqtt_url, false, &[])
    }

    /// [`Hourglass::start`] with Hourglass's own info logs kept as JSON lines; `terminate`
    /// returns them.
    pub fn start_logged(data_dir: &Path, mqtt_url: Option<&str>) -> Hourglass {
        Hourglass::launch(data_dir, mqtt_url, true, &[])
    }

    /// [`Hourglass::start_logged`] on the embedded broker with extra environment variables
    /// (`HOURGLASS_*` settings).
    pub fn start_logged_with_env(data_dir: &Path, vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch(data_dir, None, true, vars)
    }

    /// [`Hourglass::start_logged_with_env`] consuming from the broker at `mqtt_url`.
    pub fn start_logged_with_broker_and_env(data_dir: &Path, mqtt_url: &str, vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch(data_dir, Some(mqtt_url), true, vars)
    }

    /// [`Hourglass::start`] with extra environment variables (`HOURGLASS_*` settings).
    pub fn start_with_env(data_dir: &Path, mqtt_url: Option<&str>, vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch(data_dir, mqtt_url, false, vars)
    }

    /// `hourglass demo` with `args` (the pipeline, its embedded broker and a simulated fleet)
    /// on free ports, its info logs kept as with [`Hourglass::start_logged`]. Returns once it
    /// printed its greeting.
    pub fn start_demo(data_dir: &Path, args: &[&str]) -> Hourglass {
        Hourglass::start_demo_with_env(data_dir, args, &[])
    }

    /// [`Hourglass::start_demo`] with extra environment variables (`HOURGLASS_*` settings).
    pub fn start_demo_with_env(data_dir: &Path, args: &[&str], vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch_command(("demo", args, &["Dashboard:"]), data_dir, None, true, vars, None)
    }

    /// [`Hourglass::start_logged_with_env`] with every file it writes limited to `kib` KiB
    /// (`RLIMIT_FSIZE`, set by bash's `ulimit -f`, with `SIGXFSZ` ignored): a write past it
    /// fails with EFBIG, as on a full disk, while the machine's disk stays as it is.
    pub fn start_logged_with_file_limit(data_dir: &Path, kib: u64, vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch_command(("serve", &[], SERVE_GREETINGS), data_dir, None, true, vars, Some(kib))
    }

    fn launch(data_dir: &Path, mqtt_url: Option<&str>, logged: bool, vars: &[(&str, &str)]) -> Hourglass {
        Hourglass::launch_command(("serve", &[], SERVE_GREETINGS), data_dir, mqtt_url, logged, vars, None)
    }

    /// Starts `hourglass {command} {args}` with both listeners on port 0 of 127.0.0.1 and waits
    /// for a stdout line starting with one of `ready`; the ports are read from the lines up to it. (A
    /// port found free here could be taken by another test's connection before Hourglass binds
    /// it.)
    fn launch_command(
        (command, args, ready): (&str, &[&str], &'static [&'static str]),
        data_dir: &Path,
        mqtt_url: Option<&str>,
        logged: bool,
        vars: &[(&str, &str)],
        file_limit_kib: Option<u64>,
    ) -> Hourglass {
        let mut cmd = match file_limit_kib {
            None => Command::new(env!("CARGO_BIN_EXE_hourglass")),
            Some(kib) => {
                // `exec` keeps the process (its pid is the child's), the limit and the ignored
                // signal.
                let mut bash = Command::new("bash");
                bash.args(["-c", r#"trap '' XFSZ; ulimit -f "$1" && shift && exec "$@""#, "limited"])
                    .arg(kib.to_string())
                    .arg(env!("CARGO_BIN_EXE_hourglass"));
                bash
            }
        };
        cmd.arg(command)
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--http-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match mqtt_url {
            Some(url) => cmd.arg("--mqtt-url").arg(url),
            None => cmd.args(["--mqtt-listen", "127.0.0.1:0"]),
        };
        // The existing tests publish without MQTT credentials and query without tokens: they run
        // with auth off (loopback only), explicitly; the auth tests turn it on through `vars`.
        if !vars.iter().any(|(k, _)| *k == "HOURGLASS_AUTH__ENABLED") {
            cmd.env("HOURGLASS_AUTH__ENABLED", "false");
        }
        cmd.envs(vars.iter().copied());
        if logged {
            cmd.arg("--log-json").env("RUST_LOG", "warn,hourglass=info,ingest=info");
        }
        let mut child = cmd.spawn().expect("spawn hourglass");
        let mut logs = Some(Logs::collect(child.stderr.take().unwrap(), logged));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // The lines up to the ready one; then stdout is only drained.
            let mut greeting = Some(String::new());
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Some(text) = greeting.as_mut() else { continue };
                text.push_str(&line);
                text.push('\n');
                if ready.iter().any(|r| line.starts_with(r)) {
                    let _ = tx.send(greeting.take().unwrap());
                }
            }
        });
        let greeting = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(greeting) => greeting,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let exit = child.wait();
                let (lines, _) = logs.take().unwrap().finish();
                let last = &lines[lines.len().saturating_sub(20)..];
                panic!(
                    "hourglass {command} exited before it was ready: {exit:?}; its last log lines:\n{}",
                    last.join("\n")
                )
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("hourglass {command} did not become ready within 60 s"),
        };
        // `serve` says `http=http://ADDR mqtt=HOST:PORT`; `demo` says `publish to HOST:PORT` and
        // `Dashboard: http://ADDR/`.
        let http = address_after(&greeting, &["http=http://", "http=https://", "Dashboard: http://"]);
        let http = http.trim_end_matches('/').parse().unwrap_or_else(|e| panic!("{http:?} in {greeting:?}: {e}"));
        let mqtt_port = match mqtt_url {
            Some(url) => url.rsplit(':').next().unwrap().parse().unwrap(),
            None => match address_after(&greeting, &[" mqtt=", "publish to "]) {
                // `mqtt.enabled = false`.
                "off" => 0,
                mqtt => {
                    mqtt.rsplit(':').next().unwrap().parse().unwrap_or_else(|e| panic!("{mqtt:?} in {greeting:?}: {e}"))
                }
            },
        };
        Hourglass { child, http, mqtt_port, data_dir: data_dir.to_path_buf(), greeting, logs }
    }

    /// `GET path` on the query service: (status, JSON body).
    pub fn get(&self, path_and_query: &str) -> (u16, Value) {
        get_json(&format!("http://{}{}", self.http, path_and_query))
    }

    /// `POST path` with a JSON body on the query service: (status, JSON body).
    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        post_json(&format!("http://{}{}", self.http, path), body)
    }

    /// `PUT path` with a JSON body on the query service: (status, JSON body).
    pub fn put(&self, path: &str, body: &str) -> (u16, Value) {
        put_json(&format!("http://{}{}", self.http, path), body)
    }

    /// `DELETE path` on the query service: (status, JSON body).
    pub fn delete(&self, path: &str) -> (u16, Value) {
        let url = format!("http://{}{}", self.http, path);
        answer("DELETE", &url, ureq::delete(&url).timeout(Duration::from_secs(30)).call())
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// The first log line kept so far (JSON, as [`Hourglass::start_logged`] keeps them) for
    /// which `f` holds, looked for until `limit`.
    pub fn wait_for_log(&self, limit: Duration, mut f: impl FnMut(&Value) -> bool) -> Option<Value> {
        let lines = self.logs.as_ref().expect("started with its logs kept").lines.clone();
        wait_for(limit, || {
            let kept = lines.lock().unwrap();
            kept.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|l| f(l))
        })
    }

    /// SIGTERM and wait for a clean exit (status 0); returns the log lines when started with
    /// [`Hourglass::start_logged`], else nothing.
    pub fn terminate(mut self) -> Vec<String> {
        let (exit, logs, asked) = self.term_and_wait(Duration::from_secs(30));
        assert!(exit.success(), "hourglass exited with {exit} after SIGTERM; logs:\n{}", logs.join("\n"));
        if asked {
            logs
        } else {
            Vec::new()
        }
    }

    /// SIGTERM and wait up to `limit` for the exit, whatever its status: the status and the
    /// log lines (Hourglass's info ones when started with [`Hourglass::start_logged`], else the
    /// last ones).
    pub fn stop(mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let (exit, logs, _) = self.term_and_wait(limit);
        (exit, logs)
    }

    fn term_and_wait(&mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>, bool) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let Some(exit) = wait_for(limit, || self.child.try_wait().unwrap()) else {
            // Killed, its pipe closes and its last words can be shown: where the stop hung.
            let _ = self.child.kill();
            let _ = self.child.wait();
            let (logs, _) = self.logs.take().map(Logs::finish).unwrap_or_default();
            let last = &logs[logs.len().saturating_sub(40)..];
            panic!(
                "hourglass did not exit within {limit:?} of SIGTERM (killed); its last log lines:\n{}",
                last.join("\n")
            );
        };
        // The process is gone, so the pipe is closed and the reader ends.
        let (logs, asked) = self.logs.take().map(Logs::finish).unwrap_or_default();
        (exit, logs, asked)
    }
}

impl Drop for Hourglass {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The word after the first of `markers` found in `text`; panics if there is none.
fn address_after<'a>(text: &'a str, markers: &[&str]) -> &'a str {
    let at = markers
        .iter()
        .find_map(|m| text.find(m).map(|i| i + m.len()))
        .unwrap_or_else(|| panic!("none of {markers:?} in Hourglass's greeting {text:?}"));
    text[at..].split_whitespace().next().unwrap_or_default()
}

/// The TCP ports process `pid` listens on: its sockets' inodes (`/proc/{pid}/fd`) found in the
/// listening rows (state `0A`) of `/proc/net/tcp` and `tcp6`.
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| Some(l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string()))
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for row in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let cols: Vec<&str> = row.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && inodes.iter().any(|i| i == cols[9]) {
                let port = cols[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports.sort_unstable();
    ports
}

/// GET a URL: (status, JSON body).
pub fn get_json(url: &str) -> (u16, Value) {
    answer("GET", url, ureq::get(url).timeout(Duration::from_secs(30)).call())
}

/// GET a URL: (status, body as text).
pub fn get_text(url: &str) -> (u16, String) {
    match ureq::get(url).timeout(Duration::from_secs(30)).call() {
        Ok(r) => (r.status(), r.into_string().expect("text body")),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// POST a JSON body to a URL: (status, JSON body).
pub fn post_json(url: &str, body: &str) -> (u16, Value) {
    let req = ureq::post(url).timeout(Duration::from_secs(30)).set("Content-Type", "application/json");
    answer("POST", url, req.send_string(body))
}

/// PUT a JSON body to a URL: (status, JSON body).
pub fn put_json(url: &str, body: &str) -> (u16, Value) {
    let req = ureq::put(url).timeout(Duration::from_secs(30)).set("Content-Type", "application/json");
    answer("PUT", url, req.send_string(body))
}

/// The status and JSON body of a response, error statuses included; panics on a transport error.
fn answer(method: &str, url: &str, result: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    match result {
        Ok(r) => (r.status(), r.into_json().expect("JSON body")),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().expect("JSON error body")),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// Debian's mosquitto binary.
pub fn mosquitto_bin() -> &'static str {
    ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mosquitto is installed (the test command installs it)")
}

/// Debian's mosquitto with the config file at `conf`, its output discarded.
pub fn spawn_mosquitto(conf: &Path) -> Child {
    Command::new(mosquitto_bin())
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mosquitto")
}

/// A broker process `spawn(port)` started on a port found free, once it serves the port
/// ([`broker_up`] within `limit`). A port found free can be taken by another process before
/// the broker binds it (the broker then exits): then again on another one, up to 5 times.
pub fn broker_on_a_free_port(what: &str, limit: Duration, mut spawn: impl FnMut(u16) -> Child) -> (Child, u16) {
    for _ in 0..5 {
        let port = free_addr().port();
        let mut child = spawn(port);
        if broker_up(&mut child, SocketAddr::from(([127, 0, 0, 1], port)), limit) {
            return (child, port);
        }
    }
    panic!("{what} did not stay up on any of 5 free ports");
}

/// Debian's mosquitto on a free loopback port with its own config file; stopped on drop.
pub struct Mosquitto {
    child: Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl Mosquitto {
    /// mosquitto on a port found free (see [`broker_on_a_free_port`]), with room for the
    /// tests' bursts (a queue of a million messages a client).
    pub fn start() -> Mosquitto {
        Mosquitto::start_with(
            "persistence false\nmax_inflight_messages 1000\nmax_queued_messages 1000000\nmessage_size_limit 0\n",
        )
    }

    /// mosquitto on a port found free, with `options` (lines of mosquitto.conf) beside its
    /// listener: `""` is Debian's stock broker.
    pub fn start_with(options: &str) -> Mosquitto {
        Mosquitto::start_with_conf(|port| format!("listener {port} 127.0.0.1\nallow_anonymous true\n{options}"))
    }

    /// mosquitto with the config file `conf(port)` on a port found free (its first listener,
    /// which must be on 127.0.0.1:port; any other is for the caller to find free).
    pub fn start_with_conf(mut conf: impl FnMut(u16) -> String) -> Mosquitto {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mosquitto.conf");
        let (child, port) = broker_on_a_free_port("mosquitto", Duration::from_secs(10), |port| {
            std::fs::write(&path, conf(port)).unwrap();
            spawn_mosquitto(&path)
        });
        Mosquitto { child, port, _dir: Some(dir) }
    }

    /// mosquitto with the config file at `conf`, which must listen on 127.0.0.1:`port`.
    pub fn start_with_config(conf: &Path, port: u16) -> Mosquitto {
        let mut broker = Mosquitto { child: spawn_mosquitto(conf), port, _dir: None };
        let up = broker_up(&mut broker.child, SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(10));
        assert!(up, "mosquitto exited at start (port {port} taken?)");
        broker
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

/// A private CA and two certificates it signed, as PEM files: the server's, for 127.0.0.1, and a
/// client's, each with its key. Removed with `dir`.
#[derive(Debug)]
pub struct TestPki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Another CA's certificate, which signed neither.
    pub other_ca: PathBuf,
    dir: tempfile::TempDir,
}

impl TestPki {
    pub fn new() -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca_of = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
            (params.self_signed(&key).unwrap(), key)
        };
        let (ca, ca_key) = ca_of("Hourglass test CA");
        let (other, _) = ca_of("Another CA");
        let signed = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = signed(vec!["127.0.0.1".into()]);
        let (client_cert, client_key) = signed(vec!["hourglass-ingest".into()]);
        TestPki {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            other_ca: write("other-ca.pem", other.pem()),
            dir,
        }
    }

    /// A file beside the certificates.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
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
    acked: impl FnMut(usize),
) -> usize {
    publish_qos1_as(port, client_id, None, messages, limit, acked)
}

/// [`publish_qos1`] logged in with `credentials` (username, password).
pub fn publish_qos1_as(
    port: u16,
    client_id: &str,
    credentials: Option<(&str, &str)>,
    messages: &[(String, Vec<u8>)],
    limit: Duration,
    acked: impl FnMut(usize),
) -> usize {
    publish_qos1_with(port, client_id, credentials, None, messages, limit, acked).0
}

/// [`publish_qos1`] by a publisher that reconnects, as devices do: after a connection error
/// (a connection closed, or refused) it tries again every 50 ms, sending the message not acked
/// again, until `stop` is set (or `limit`). Answers the messages acked and the connection
/// errors it met.
pub fn publish_qos1_reconnecting(
    port: u16,
    client_id: &str,
    stop: &std::sync::atomic::AtomicBool,
    messages: &[(String, Vec<u8>)],
    limit: Duration,
    acked: impl FnMut(usize),
) -> (usize, usize) {
    publish_qos1_with(port, client_id, None, Some(stop), messages, limit, acked)
}

fn publish_qos1_with(
    port: u16,
    client_id: &str,
    credentials: Option<(&str, &str)>,
    reconnect_until: Option<&std::sync::atomic::AtomicBool>,
    messages: &[(String, Vec<u8>)],
    limit: Duration,
    mut acked: impl FnMut(usize),
) -> (usize, usize) {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
    if let Some((user, pass)) = credentials {
        o.set_credentials(user, pass);
    }
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(8 << 20, 8 << 20);
    let (client, mut conn) = Client::new(o, 16);
    let deadline = Instant::now() + limit;
    let (mut done, mut errors) = (0, 0);
    for (i, (topic, payload)) in messages.iter().enumerate() {
        client.publish(topic, QoS::AtLeastOnce, false, payload.clone()).unwrap();
        loop {
            let stopped = reconnect_until.is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
            if Instant::now() > deadline || stopped {
                return (done, errors);
            }
            match conn.recv_timeout(Duration::from_millis(500)) {
                Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => break,
                Ok(Ok(_)) => {}
                // The next `recv` connects again, and sends what was not acked.
                Ok(Err(_)) if reconnect_until.is_some() => {
                    errors += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(Err(_)) | Err(rumqttc::RecvTimeoutError::Disconnected) => return (done, errors + 1),
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
    (done, errors)
}
