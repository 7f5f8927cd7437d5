//! docker-compose.yml, the Dockerfile and deploy/ are checked here, since this machine has no
//! Docker engine: the files parse, the services exist, and every port, path and URL agrees
//! with the Hourglass config file they mount (which `hourglass check-config` accepts).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::Value as Json;
use serde_norway::Value;

use crate::util::Mosquitto;
use crate::{hourglass, repo_file, stdout_lines};

/// Where the image and the compose service keep the config file.
const CONFIG_PATH: &str = "/etc/hourglass/hourglass.toml";

fn compose() -> Value {
    let text = std::fs::read_to_string(repo_file("docker-compose.yml")).unwrap();
    serde_norway::from_str(&text).unwrap()
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose["services"].get(name).unwrap_or_else(|| panic!("service {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence().map_or_else(Vec::new, |s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
}

/// deploy/hourglass.toml as plain TOML.
fn deploy_config() -> toml::Table {
    toml::from_str(&std::fs::read_to_string(repo_file("deploy/hourglass.toml")).unwrap()).unwrap()
}

fn deploy_str<'a>(cfg: &'a toml::Table, section: &str, key: &str) -> &'a str {
    cfg[section][key].as_str().unwrap_or_else(|| panic!("{section}.{key} in deploy/hourglass.toml"))
}

/// (host, port) of `mqtt://host:port`.
fn url_host_port(url: &str) -> (String, u16) {
    let rest = url.strip_prefix("mqtt://").unwrap();
    let (host, port) = rest.rsplit_once(':').unwrap();
    (host.to_string(), port.parse().unwrap())
}

/// The instructions of the Dockerfile: (KEYWORD, arguments), continuation lines joined.
fn dockerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_file("Dockerfile")).unwrap();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (kw, rest) = current.split_once(' ').unwrap();
                out.push((kw.to_uppercase(), rest.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

#[test]
fn compose_has_the_pipeline_and_the_load_test_as_a_profile() {
    let c = compose();
    let names: Vec<&str> = c["services"].as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(names, ["hourglass", "mosquitto", "kafka", "loadtest"]);
    for name in ["hourglass", "mosquitto", "kafka"] {
        assert!(service(&c, name).get("profiles").is_none(), "{name} starts with `docker compose up`");
    }
    assert_eq!(strings(&service(&c, "loadtest")["profiles"]), ["loadtest"]);
    let volumes: Vec<&str> = c["volumes"].as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(volumes, ["hourglass-data", "mosquitto-data"]);
}

#[test]
fn hourglass_service_serves_the_mounted_config_on_its_ports() {
    let c = compose();
    let hg = service(&c, "hourglass");
    let cfg = deploy_config();
    // The file the service mounts is a valid Hourglass config (the real parser: same keys).
    let out = hourglass(&["check-config", "deploy/hourglass.toml"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_lines(&out), ["deploy/hourglass.toml: ok"]);

    assert_eq!(hg["build"].as_str(), Some("."));
    assert_eq!(strings(&hg["command"]), ["serve", "--config", CONFIG_PATH]);
    let data_dir = cfg["data_dir"].as_str().unwrap();
    assert_eq!(
        strings(&hg["volumes"]),
        [format!("./deploy/hourglass.toml:{CONFIG_PATH}:ro"), format!("hourglass-data:{data_dir}")]
    );
    // Listening on every interface of the container, published on the host's loopback.
    let listen: SocketAddr = deploy_str(&cfg, "http", "listen").parse().unwrap();
    assert!(listen.ip().is_unspecified(), "{listen}");
    let port = listen.port();
    assert_eq!(strings(&hg["ports"]), [format!("127.0.0.1:{port}:{port}")]);
    assert_eq!(
        strings(&hg["healthcheck"]["test"]),
        ["CMD", "curl", "-fsS", format!("http://127.0.0.1:{port}/health").as_str()]
    );
    assert_eq!(hg["depends_on"]["mosquitto"]["condition"].as_str(), Some("service_started"));
    // Auth is on in the deploy config; the admin token comes from the host's environment, and
    // compose stops when it is not set (`:?`) rather than starting a server nobody can use.
    assert_eq!(cfg.get("auth").and_then(|a| a.get("enabled")), None, "auth stays at its default, on");
    let env = hg["environment"].as_mapping().unwrap();
    assert_eq!(env.len(), 1);
    assert_eq!(
        env.get("HOURGLASS_AUTH__ADMIN_TOKEN").and_then(Value::as_str),
        Some("${HOURGLASS_ADMIN_TOKEN:?set HOURGLASS_ADMIN_TOKEN to a long random secret}")
    );
    // The variable is a key the real parser takes, with a token as compose would pass it.
    let token = ("HOURGLASS_AUTH__ADMIN_TOKEN", "0123456789abcdef0123456789abcdef");
    let out = hourglass(&["check-config", "deploy/hourglass.toml"], &[token]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn mosquitto_service_is_the_broker_of_the_config() {
    let c = compose();
    let m = service(&c, "mosquitto");
    let cfg = deploy_config();
    let (host, port) = url_host_port(deploy_str(&cfg, "mqtt", "url"));
    assert_eq!(host, "mosquitto", "Hourglass reaches the broker by its service name");
    assert!(m["image"].as_str().unwrap().starts_with("eclipse-mosquitto:2"));
    assert_eq!(strings(&m["ports"]), [format!("127.0.0.1:{port}:{port}")]);
    assert_eq!(
        strings(&m["volumes"]),
        ["./deploy/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro", "mosquitto-data:/mosquitto/data"]
    );
    let conf = std::fs::read_to_string(repo_file("deploy/mosquitto.conf")).unwrap();
    let settings: Vec<(&str, &str)> = conf
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    let get = |k: &str| -> Vec<&str> { settings.iter().filter(|(key, _)| *key == k).map(|(_, v)| *v).collect() };
    assert_eq!(get("listener"), [format!("{port} 0.0.0.0").as_str()]);
    assert_eq!(get("persistence"), ["true"]);
    assert_eq!(get("persistence_location"), ["/mosquitto/data/"]);
}

/// Debian's mosquitto accepts deploy/mosquitto.conf, with the listener moved to loopback and
/// the persistence directory to a temp dir.
#[test]
fn mosquitto_accepts_the_deploy_config() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::util::free_addr().port();
    let conf = std::fs::read_to_string(repo_file("deploy/mosquitto.conf")).unwrap();
    let local: String = conf
        .lines()
        .map(|l| match l.split_once(' ') {
            Some(("listener", _)) => format!("listener {port} 127.0.0.1"),
            Some(("persistence_location", _)) => format!("persistence_location {}/", dir.path().display()),
            Some(("log_dest", _)) => "log_dest stderr".to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    // mosquitto started as root drops to its own user, which must be able to write there.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let path = dir.path().join("mosquitto.conf");
    std::fs::write(&path, local).unwrap();
    let broker = Mosquitto::start_with_config(&path, port);
    assert_acks_a_publish(&broker, "deploy-conf-check");
}

/// `broker` acks a QoS 1 publish from `client_id`.
fn assert_acks_a_publish(broker: &Mosquitto, client_id: &str) {
    let message = [("hourglass/t/d".to_string(), b"{}".to_vec())];
    let acked = crate::util::publish_qos1(broker.port, client_id, &message, std::time::Duration::from_secs(10), |_| {});
    assert_eq!(acked, 1);
}

#[test]
fn kafka_runs_in_kraft_mode_from_the_official_image() {
    let c = compose();
    let k = service(&c, "kafka");
    assert!(k["image"].as_str().unwrap().starts_with("apache/kafka:"));
    let env = k["environment"].as_mapping().unwrap();
    let var = |name: &str| env.get(name).and_then(Value::as_str).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(var("KAFKA_PROCESS_ROLES"), "broker,controller");
    assert_eq!(var("KAFKA_NODE_ID"), "1");
    assert_eq!(var("KAFKA_CONTROLLER_QUORUM_VOTERS"), "1@kafka:9093");
    assert!(env.keys().all(|k| !k.as_str().unwrap().contains("ZOOKEEPER")), "no ZooKeeper");
    let listeners: Vec<&str> = var("KAFKA_LISTENERS").split(',').collect();
    assert_eq!(listeners, ["PLAINTEXT://:9092", "CONTROLLER://:9093", "HOST://:29092"]);
    assert_eq!(var("KAFKA_CONTROLLER_LISTENER_NAMES"), "CONTROLLER");
    // Every listener name has a protocol; the published port is the HOST listener's.
    let protocols: BTreeSet<&str> =
        var("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP").split(',').map(|p| p.split_once(':').unwrap().0).collect();
    let names: BTreeSet<&str> = listeners.iter().map(|l| l.split_once(':').unwrap().0).collect();
    assert_eq!(protocols, names);
    assert_eq!(strings(&k["ports"]), ["127.0.0.1:29092:29092"]);
    assert_eq!(var("KAFKA_ADVERTISED_LISTENERS"), "PLAINTEXT://kafka:9092,HOST://127.0.0.1:29092");
}

#[test]
fn dockerfile_builds_in_rust_and_runs_the_config_of_compose() {
    let ins = dockerfile();
    let from: Vec<&str> = ins.iter().filter(|(k, _)| k == "FROM").map(|(_, v)| v.as_str()).collect();
    assert_eq!(from, ["rust:1-bookworm AS builder", "debian:bookworm-slim"]);
    let runtime_start = ins.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let (build, runtime) = ins.split_at(runtime_start);
    assert!(build.iter().any(|(k, v)| k == "RUN" && v.contains("install") && v.contains("libclang-dev")));
    assert!(build.iter().any(|(k, v)| k == "RUN" && v.contains("cargo build --release --locked --bin hourglass")));
    let get = |kw: &str| -> Vec<&str> { runtime.iter().filter(|(k, _)| k == kw).map(|(_, v)| v.as_str()).collect() };

    let cfg = deploy_config();
    let listen: SocketAddr = deploy_str(&cfg, "http", "listen").parse().unwrap();
    assert_eq!(get("EXPOSE"), [listen.port().to_string().as_str()]);
    assert_eq!(get("VOLUME"), [cfg["data_dir"].as_str().unwrap()]);
    assert_eq!(
        get("COPY"),
        [
            "--from=builder /usr/local/bin/hourglass /usr/local/bin/hourglass".to_string(),
            format!("deploy/hourglass.toml {CONFIG_PATH}")
        ]
    );
    let entrypoint: Json = serde_json::from_str(get("ENTRYPOINT")[0]).unwrap();
    assert_eq!(entrypoint, serde_json::json!(["hourglass"]));
    // The image's default command is the compose service's.
    let cmd: Json = serde_json::from_str(get("CMD")[0]).unwrap();
    let c = compose();
    assert_eq!(cmd, serde_json::json!(strings(&service(&c, "hourglass")["command"])));
    assert_eq!(get("USER"), ["hourglass"]);
}

/// The load-test service's command, run for real against a local mosquitto with the URL
/// pointed at it and a smaller fleet: every reading published is stored, each message is
/// consumed once.
#[test]
fn loadtest_service_runs_the_bench_through_the_broker() {
    let c = compose();
    let lt = service(&c, "loadtest");
    let cfg = deploy_config();
    assert_eq!(lt["image"], service(&c, "hourglass")["image"]);
    assert_eq!(lt["build"].as_str(), Some("."));
    assert_eq!(lt["depends_on"]["mosquitto"]["condition"].as_str(), Some("service_started"));
    let command = strings(&lt["command"]);
    assert_eq!(command[..2], ["bench", "mqtt"]);
    let url_at = command.iter().position(|a| a == "--mqtt-url").unwrap() + 1;
    assert_eq!(command[url_at], deploy_str(&cfg, "mqtt", "url"));

    let broker = Mosquitto::start();
    let mut args = command.clone();
    args[url_at] = broker.url();
    let set = |args: &mut Vec<String>, flag: &str, value: &str| {
        let at = args.iter().position(|a| a == flag).unwrap() + 1;
        args[at] = value.to_string();
    };
    set(&mut args, "--devices", "20");
    set(&mut args, "--ticks", "5");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = hourglass(&args, &[("RUST_LOG", "warn")]);
    assert!(out.status.success(), "{out:?}");
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["broker"], broker.url());
    assert_eq!(report["readings"], 100);
    assert_eq!(report["qos"], 1);
    assert_eq!(report["messages_consumed"], report["messages"], "{report}");
}

/// The test brokers' start tells a mosquitto that could not bind its port (another process
/// holds it, and answers on it) from one that serves it.
#[test]
fn a_broker_on_a_taken_port_is_told_apart_from_a_running_one() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(&conf, format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")).unwrap();
    let mut child = crate::util::spawn_mosquitto(&conf);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(!crate::util::broker_up(&mut child, addr, std::time::Duration::from_secs(10)));
    assert!(child.try_wait().unwrap().is_some_and(|status| !status.success()));
    drop(taken);

    assert_acks_a_publish(&Mosquitto::start(), "taken-port-check");
}
