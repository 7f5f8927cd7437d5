//! `hourglass check-config` and the layers of the configuration (file, `HOURGLASS_*`
//! variables, flags) as the binary applies them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::util::{free_addr, get_json};
use crate::{hourglass, stdout_lines};

/// `--version` names the commit the binary was built from and its date, which "Upgrades and
/// rollbacks" tells builds apart by (QA52 F4: it said `hourglass 0.1.0` alone).
#[test]
fn version_names_the_commit_built_and_its_date() {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("run git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (commit, date) = (git(&["rev-parse", "--short=7", "HEAD"]), git(&["log", "-1", "--format=%cs", "HEAD"]));
    assert_eq!((commit.len(), date.len()), (7, 10), "{commit} {date}");
    let out = hourglass(&["--version"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_lines(&out), [format!("hourglass {} ({commit}, {date})", env!("CARGO_PKG_VERSION"))]);
}

#[test]
fn check_config_accepts_the_example_file() {
    let out = hourglass(&["check-config", "config/hourglass.example.toml"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_lines(&out), ["config/hourglass.example.toml: ok"]);
}

/// A cold retention without the archive keeps nothing: valid, but said (`serve` logs it too,
/// for each table the store holds).
#[test]
fn check_config_warns_of_a_cold_retention_without_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cold.toml");
    let text =
        "[storage]\narchive = false\n[storage.tables]\nt = { hot_retention = \"30d\", cold_retention = \"400d\" }\n\
                u = { hot_retention = \"1d\" }\n";
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap();
    let out = hourglass(&["check-config", p], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout_lines(&out),
        [
            format!(
                "{p}: warning: table \"t\" has a cold retention (400d) but storage.archive is false: its partitions \
                 are deleted for good at the hot retention, none is kept for the cold one (set storage.archive = true \
                 to keep them)"
            ),
            format!("{p}: ok"),
        ]
    );
    let out = hourglass(&["check-config", p], &[("HOURGLASS_STORAGE__ARCHIVE", "true")]);
    assert_eq!(stdout_lines(&out), [format!("{p}: ok")]);
}

#[test]
fn check_config_reports_every_problem_with_its_key_and_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[http]\nlisten = \"everywhere\"\n[mqtt]\nmax_payload = 5\nbroker_max_inflight = 0\n[storage]\nsync_wal = \"yes\"\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let out = hourglass(
        &["check-config", p],
        &[("HOURGLASS_STORAGE__CHANNEL_CAPACITY", "-3"), ("HOURGLASS_MQTT__CLIENT_ID", "")],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stdout_lines(&out),
        [
            format!(
                "{p}: http.listen: invalid socket address syntax \
                 (hint: expected an address like \"0.0.0.0:8080\"; the default is \"127.0.0.1:8080\")"
            ),
            format!("{p}: mqtt.max_payload: unknown key (hint: did you mean `mqtt.max_payload_bytes`?)"),
            format!(
                "{p}: storage.sync_wal: invalid type: string \"yes\", expected a boolean \
                 (hint: expected true or false; the default is false)"
            ),
            format!(
                "{p}: storage.channel_capacity (from HOURGLASS_STORAGE__CHANNEL_CAPACITY): invalid value: \
                 integer `-3`, expected usize (hint: expected a whole number, at least 1; the default is 1024)"
            ),
            format!(
                "{p}: mqtt.client_id (from HOURGLASS_MQTT__CLIENT_ID): must not be empty \
                 (hint: expected a non-empty string; the default is \"hourglass-ingest\")"
            ),
            format!(
                "{p}: mqtt.broker_max_inflight: 0 is out of range \
                 (hint: expected a whole number from 1 to 65535; the default is 1000)"
            ),
        ]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("6 problem(s) in {p}")), "{stderr}");
}

#[test]
fn serve_applies_variables_after_the_file_and_flags_after_variables() {
    let dir = tempfile::tempdir().unwrap();
    let flag_data = dir.path().join("from-flag");
    // Ports are picked free, then bound by the child: another test may take one in between. A
    // child that exits before it is ready (its stderr says why) is started again on new ports,
    // at most three times.
    let mut attempt = 0;
    let (env_http, env_mqtt, ready) = loop {
        attempt += 1;
        let (file_http, env_http, env_mqtt) = (free_addr(), free_addr(), free_addr());
        let file = dir.path().join("hourglass.toml");
        std::fs::write(
            &file,
            format!(
                "data_dir = \"{}\"\n[http]\nlisten = \"{file_http}\"\n[mqtt]\nclient_id = \"from-file\"\n",
                dir.path().join("from-file").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&flag_data)
            .env_clear()
            .env("HOURGLASS_CONFIG", &file)
            .env("HOURGLASS_HTTP__LISTEN", env_http.to_string())
            .env("HOURGLASS_MQTT__LISTEN", env_mqtt.to_string())
            .env("HOURGLASS_DATA_DIR", dir.path().join("from-env"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let ready = rx.recv_timeout(Duration::from_secs(60));
        if ready.is_err() && attempt < 3 {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("serve exited before it was ready ({status}); starting it again on other ports");
                continue;
            }
        }
        let (status, health) = get_json(&format!("http://{env_http}/health"));
        let _ = child.kill();
        let _ = child.wait();
        break (env_http, env_mqtt, ready.map(|line| (line, status, health)));
    };
    let (ready, status, health) = ready.unwrap();
    // The file's http.listen lost to the variable; the variable's data_dir lost to the flag.
    assert_eq!(
        ready,
        format!(
            "hourglass ready: http=http://{env_http} mqtt=127.0.0.1:{} data={}",
            env_mqtt.port(),
            flag_data.display()
        )
    );
    assert_eq!((status, health), (200, serde_json::json!({"status": "ok"})));
    assert!(flag_data.join("rocksdb").is_dir());
    assert!(!dir.path().join("from-env").exists());
    assert!(!dir.path().join("from-file").exists());
}

const EXAMPLE: &str = "config/hourglass.example.toml";

/// A test PKI and the paths of its CA, client certificate and key, server key, and a file that
/// is no PEM.
fn tls_files() -> (crate::util::TestPki, [String; 5]) {
    let pki = crate::util::TestPki::new();
    let not_pem = pki.path("notes.txt");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let files = [&pki.ca, &pki.client_cert, &pki.client_key, &pki.server_key, &not_pem]
        .map(|p| p.to_str().unwrap().to_string());
    (pki, files)
}

/// `check-config` of the example file with `vars`: its lines (a problem each, or `… ok`).
fn check_example(vars: &[(&str, &str)]) -> Vec<String> {
    let out = hourglass(&["check-config", EXAMPLE], vars);
    let lines = stdout_lines(&out);
    assert_eq!(out.status.success(), lines == [format!("{EXAMPLE}: ok")], "{out:?}");
    lines
}

/// The query service's TLS files are checked with the rest, read as `serve` reads them at
/// start: each file's problem with its key.
#[test]
fn check_config_checks_the_query_services_tls_files() {
    let (pki, [_, client_cert, _, server_key, not_pem]) = tls_files();
    let p = EXAMPLE;
    let cert_hint = "a PEM file of the query service's certificate chain (HTTPS), or \"\" for plain HTTP";
    let key_hint = "a PEM file of tls_cert_file's private key, or \"\" for none";
    let problem = |key: &str, message: &str, hint: &str| {
        let var = format!("HOURGLASS_{}", key.to_uppercase().replace('.', "__"));
        format!("{p}: {key} (from {var}): {message} (hint: expected {hint}; the default is \"\")")
    };
    let server_cert = pki.server_cert.to_str().unwrap();
    assert_eq!(
        check_example(&[("HOURGLASS_HTTP__TLS_CERT_FILE", server_cert)]),
        [format!(
            "{p}: http.tls_key_file: is needed with the other of http.tls_cert_file and http.tls_key_file (the query \
             service's certificate and its key) (hint: expected {key_hint}; the default is \"\")"
        )]
    );
    assert_eq!(
        check_example(&[
            ("HOURGLASS_HTTP__TLS_CERT_FILE", &not_pem),
            ("HOURGLASS_HTTP__TLS_KEY_FILE", "/nonexistent/k")
        ]),
        [
            problem(
                "http.tls_cert_file",
                &format!("{not_pem}: no certificate in it; expected a PEM file (-----BEGIN CERTIFICATE-----)"),
                cert_hint
            ),
            problem(
                "http.tls_key_file",
                "/nonexistent/k: no private key read (I/O error: No such file or directory (os error 2)); expected a \
                 PEM file of an unencrypted PKCS#8, PKCS#1 or SEC1 key",
                key_hint
            ),
        ]
    );
    let wrong_key = check_example(&[
        ("HOURGLASS_HTTP__TLS_CERT_FILE", &client_cert),
        ("HOURGLASS_HTTP__TLS_KEY_FILE", &server_key),
    ]);
    assert_eq!(wrong_key.len(), 1, "{wrong_key:?}");
    let start = format!("{p}: http.tls_key_file (from HOURGLASS_HTTP__TLS_KEY_FILE): {server_key}: not the key of ");
    assert!(wrong_key[0].starts_with(&start), "{wrong_key:?}");
    let server_key = pki.server_key.to_str().unwrap();
    assert_eq!(
        check_example(&[("HOURGLASS_HTTP__TLS_CERT_FILE", server_cert), ("HOURGLASS_HTTP__TLS_KEY_FILE", server_key)]),
        [format!("{p}: ok")]
    );
    // An expired certificate, which clients refuse (it was served), and one of X.509 version 1.
    let (expired, expired_key) = expired_certificate(&pki);
    let refused =
        check_example(&[("HOURGLASS_HTTP__TLS_CERT_FILE", &expired), ("HOURGLASS_HTTP__TLS_KEY_FILE", &expired_key)]);
    let start = format!(
        "{p}: http.tls_cert_file (from HOURGLASS_HTTP__TLS_CERT_FILE): {expired}: the certificate expired at \
         2021-01-01T00:00:00Z (renew it; this machine's clock says 20"
    );
    assert!(refused.len() == 1 && refused[0].starts_with(&start), "{refused:?}");
    let (v1_cert, v1_key) = ("tests/fixtures/client-v1.pem", "tests/fixtures/client-v1.key");
    let refused =
        check_example(&[("HOURGLASS_HTTP__TLS_CERT_FILE", v1_cert), ("HOURGLASS_HTTP__TLS_KEY_FILE", v1_key)]);
    let start = format!(
        "{p}: http.tls_cert_file (from HOURGLASS_HTTP__TLS_CERT_FILE): {v1_cert}: an X.509 version 1 certificate, \
         which rustls does not take: sign it again as version 3"
    );
    assert!(refused.len() == 1 && refused[0].starts_with(&start), "{refused:?}");
    // A client certificate that has expired, for an external broker's TLS, and for Kafka's
    // (which librdkafka took: the broker refused it at each connect, QA58 F3).
    type Broker<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);
    let brokers: [Broker<'_>; 2] = [
        ("mqtt", "MQTT", &[("HOURGLASS_MQTT__URL", "mqtts://127.0.0.1")]),
        ("kafka", "KAFKA", &[("HOURGLASS_KAFKA__ENABLED", "true"), ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "ssl")]),
    ];
    for (section, var, settings) in brokers {
        let (cert_var, key_var) = (format!("HOURGLASS_{var}__CERT_FILE"), format!("HOURGLASS_{var}__KEY_FILE"));
        let mut vars = settings.to_vec();
        vars.extend([(cert_var.as_str(), expired.as_str()), (key_var.as_str(), expired_key.as_str())]);
        let refused = check_example(&vars);
        let start = format!(
            "{p}: {section}.cert_file (from {cert_var}): {expired}: the certificate expired at 2021-01-01T00:00:00Z"
        );
        assert!(refused.len() == 1 && refused[0].starts_with(&start), "{refused:?}");
    }
}

/// A self-signed certificate for 127.0.0.1 that expired at 2021-01-01T00:00:00Z, and its key,
/// beside the test PKI's files: their paths.
fn expired_certificate(pki: &crate::util::TestPki) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    (params.not_before, params.not_after) = (rcgen::date_time_ymd(2020, 1, 1), rcgen::date_time_ymd(2021, 1, 1));
    let cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path) = (pki.path("expired.pem"), pki.path("expired.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path.to_str().unwrap().to_string(), key_path.to_str().unwrap().to_string())
}

/// The login and TLS settings of an external broker are checked with the rest: each where a
/// value is wrong, the files read (a certificate, its key) as `serve` reads them at start.
#[test]
fn check_config_checks_the_external_brokers_login_and_tls_files() {
    let (pki, [ca, cert, key, server_key, not_pem]) = tls_files();
    let p = EXAMPLE;
    let check = check_example;
    let problem = |key: &str, var: &str, message: &str, hint: &str| {
        format!("{p}: {key} (from {var}): {message} (hint: expected {hint}; the default is \"\")")
    };
    let no_url = "is for an external broker, and mqtt.url is not set: the embedded broker's consumer logs in on \
                  its own";
    assert_eq!(
        check(&[("HOURGLASS_MQTT__USERNAME", "hourglass"), ("HOURGLASS_MQTT__CA_FILE", &ca)]),
        [
            problem(
                "mqtt.username",
                "HOURGLASS_MQTT__USERNAME",
                no_url,
                "the consumer's username at mqtt.url's broker, or \"\" for none"
            ),
            problem(
                "mqtt.ca_file",
                "HOURGLASS_MQTT__CA_FILE",
                no_url,
                "a PEM file of CA certificates, or \"\" for the system's"
            ),
        ]
    );
    let plain = ("HOURGLASS_MQTT__URL", "mqtt://127.0.0.1:1883");
    let tls = ("HOURGLASS_MQTT__URL", "mqtts://127.0.0.1");
    assert_eq!(
        check(&[plain, ("HOURGLASS_MQTT__PASSWORD", "pw"), ("HOURGLASS_MQTT__CERT_FILE", &cert)]),
        [
            problem(
                "mqtt.password",
                "HOURGLASS_MQTT__PASSWORD",
                "is set without mqtt.username",
                "the password of mqtt.username, or \"\" for none"
            ),
            format!(
                "{p}: mqtt.key_file: is needed with the other of mqtt.cert_file and mqtt.key_file (a client \
                 certificate and its key) (hint: expected a PEM file of cert_file's private key, or \"\" for none; the \
                 default is \"\")"
            ),
        ]
    );
    let ca_hint = "a PEM file of CA certificates, or \"\" for the system's";
    assert_eq!(
        check(&[plain, ("HOURGLASS_MQTT__CA_FILE", &ca)]),
        [problem(
            "mqtt.ca_file",
            "HOURGLASS_MQTT__CA_FILE",
            "TLS files are set for a broker url without TLS: use mqtts://host:port, or unset them",
            ca_hint
        )]
    );
    assert_eq!(
        check(&[tls, ("HOURGLASS_MQTT__CA_FILE", "/nonexistent/ca.pem")]),
        [problem(
            "mqtt.ca_file",
            "HOURGLASS_MQTT__CA_FILE",
            "/nonexistent/ca.pem: No such file or directory (os error 2)",
            ca_hint
        )]
    );
    assert_eq!(
        check(&[tls, ("HOURGLASS_MQTT__CA_FILE", &not_pem)]),
        [problem(
            "mqtt.ca_file",
            "HOURGLASS_MQTT__CA_FILE",
            &format!("{not_pem}: no CA certificate in it; expected a PEM file (-----BEGIN CERTIFICATE-----)"),
            ca_hint
        )]
    );
    let wrong_key = check(&[
        tls,
        ("HOURGLASS_MQTT__CA_FILE", &ca),
        ("HOURGLASS_MQTT__CERT_FILE", &cert),
        ("HOURGLASS_MQTT__KEY_FILE", &server_key),
    ]);
    assert_eq!(wrong_key.len(), 1, "{wrong_key:?}");
    assert!(
        wrong_key[0].starts_with(&format!(
            "{p}: mqtt.key_file (from HOURGLASS_MQTT__KEY_FILE): {server_key}: not the key of {cert} ("
        )),
        "{wrong_key:?}"
    );
    // A client certificate of X.509 version 1 (openssl's `x509 -req` without `-extfile`, as
    // mosquitto-tls(7) makes one), which rustls does not take: said so, with how to sign a v3.
    let (v1_cert, v1_key) = ("tests/fixtures/client-v1.pem", "tests/fixtures/client-v1.key");
    assert_eq!(
        check(&[
            tls,
            ("HOURGLASS_MQTT__CA_FILE", &ca),
            ("HOURGLASS_MQTT__CERT_FILE", v1_cert),
            ("HOURGLASS_MQTT__KEY_FILE", v1_key)
        ]),
        [problem(
            "mqtt.cert_file",
            "HOURGLASS_MQTT__CERT_FILE",
            &format!(
                "{v1_cert}: an X.509 version 1 certificate, which rustls does not take as the client's: sign it again \
                 as version 3, e.g. `printf 'extendedKeyUsage=clientAuth\\n' > client.ext; openssl x509 -req -in \
                 client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 365 -extfile client.ext`"
            ),
            "a PEM file of a client certificate, or \"\" for none"
        )]
    );
    // Every file's problem at once; an encrypted key is named as such.
    let encrypted = pki.path("encrypted.key");
    std::fs::write(&encrypted, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n")
        .unwrap();
    let encrypted = encrypted.to_str().unwrap().to_string();
    let all_wrong = check(&[
        tls,
        ("HOURGLASS_MQTT__CA_FILE", "/nonexistent/ca.pem"),
        ("HOURGLASS_MQTT__CERT_FILE", "/nonexistent/client.pem"),
        ("HOURGLASS_MQTT__KEY_FILE", &encrypted),
    ]);
    let keys: Vec<&str> = all_wrong.iter().map(|l| l.split(" (from ").next().unwrap()).collect();
    assert_eq!(keys, [format!("{p}: mqtt.ca_file"), format!("{p}: mqtt.cert_file"), format!("{p}: mqtt.key_file")]);
    assert!(
        all_wrong[2]
            .contains(&format!("{encrypted}: an encrypted private key, which is not read: give the key unencrypted")),
        "{all_wrong:?}"
    );
    let all = [
        tls,
        ("HOURGLASS_MQTT__USERNAME", "hourglass"),
        ("HOURGLASS_MQTT__PASSWORD", "pw"),
        ("HOURGLASS_MQTT__CA_FILE", &ca),
        ("HOURGLASS_MQTT__CERT_FILE", &cert),
        ("HOURGLASS_MQTT__KEY_FILE", &key),
    ];
    assert_eq!(check(&all), [format!("{p}: ok")]);
}

/// Kafka's TLS settings: the files only with `security_protocol = "ssl"`, a certificate with its
/// key, and (Kafka enabled) each file opened and then read by librdkafka, as the consumer reads
/// them at start, the problem under the key of the file at fault.
#[test]
fn check_config_checks_the_kafka_tls_files() {
    let (pki, [ca, cert, key, server_key, not_pem]) = tls_files();
    let p = EXAMPLE;
    let check = check_example;
    let ca_hint =
        "(hint: expected a PEM file of CA certificates, or \"\" for OpenSSL's default store; the default is \"\")";
    let key_hint = "(hint: expected a PEM file of cert_file's private key, or \"\" for none; the default is \"\")";
    let on = ("HOURGLASS_KAFKA__ENABLED", "true");
    let ssl = ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "ssl");
    assert_eq!(
        check(&[("HOURGLASS_KAFKA__CA_FILE", &ca)]),
        [format!(
            "{p}: kafka.ca_file (from HOURGLASS_KAFKA__CA_FILE): is for TLS, and kafka.security_protocol is \
             \"plaintext\": set it to \"ssl\" or \"sasl_ssl\" {ca_hint}"
        )]
    );
    assert_eq!(
        check(&[ssl, ("HOURGLASS_KAFKA__CERT_FILE", &cert)]),
        [format!(
            "{p}: kafka.key_file: is needed with the other of kafka.cert_file and kafka.key_file (a client \
             certificate and its key) {key_hint}"
        )]
    );
    // Kafka off: the files are not read.
    assert_eq!(check(&[ssl, ("HOURGLASS_KAFKA__CA_FILE", "/nonexistent/ca.pem")]), [format!("{p}: ok")]);
    assert_eq!(
        check(&[on, ssl, ("HOURGLASS_KAFKA__CA_FILE", "/nonexistent/ca.pem")]),
        [format!(
            "{p}: kafka.ca_file (from HOURGLASS_KAFKA__CA_FILE): /nonexistent/ca.pem: No such file or directory \
             (os error 2) {ca_hint}"
        )]
    );
    let not_a_ca = check(&[on, ssl, ("HOURGLASS_KAFKA__CA_FILE", &not_pem)]);
    assert_eq!(not_a_ca.len(), 1, "{not_a_ca:?}");
    let start = format!("{p}: kafka.ca_file (from HOURGLASS_KAFKA__CA_FILE): {not_pem}: librdkafka refused it: ssl.ca.location failed: ");
    assert!(not_a_ca[0].starts_with(&start) && not_a_ca[0].ends_with(ca_hint), "{not_a_ca:?}");
    let wrong_key = check(&[
        on,
        ssl,
        ("HOURGLASS_KAFKA__CA_FILE", &ca),
        ("HOURGLASS_KAFKA__CERT_FILE", &cert),
        ("HOURGLASS_KAFKA__KEY_FILE", &server_key),
    ]);
    assert_eq!(wrong_key.len(), 1, "{wrong_key:?}");
    let start = format!(
        "{p}: kafka.key_file (from HOURGLASS_KAFKA__KEY_FILE): {server_key}: librdkafka refused it: ssl.key.location \
         failed: "
    );
    assert!(wrong_key[0].starts_with(&start) && wrong_key[0].contains("key values mismatch"), "{wrong_key:?}");
    // A directory is read by OpenSSL's hashed names alone; an encrypted key is said to be one.
    let ca_dir = pki.path("cas");
    std::fs::create_dir(&ca_dir).unwrap();
    std::fs::copy(&ca, ca_dir.join("ca.pem")).unwrap();
    let ca_dir = ca_dir.to_str().unwrap().to_string();
    assert_eq!(
        check(&[on, ssl, ("HOURGLASS_KAFKA__CA_FILE", &ca_dir)]),
        [format!(
            "{p}: kafka.ca_file (from HOURGLASS_KAFKA__CA_FILE): {ca_dir}: a directory, which OpenSSL reads only by \
             its hashed names (`openssl rehash {ca_dir}` makes them), and this one has none: give a PEM file of CA \
             certificates {ca_hint}"
        )]
    );
    std::fs::copy(&ca, format!("{ca_dir}/3f1a2b4c.0")).unwrap();
    assert_eq!(check(&[on, ssl, ("HOURGLASS_KAFKA__CA_FILE", &ca_dir)]), [format!("{p}: ok")]);
    let encrypted = pki.path("encrypted.key");
    std::fs::write(&encrypted, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n")
        .unwrap();
    let encrypted = encrypted.to_str().unwrap().to_string();
    assert_eq!(
        check(&[
            on,
            ssl,
            ("HOURGLASS_KAFKA__CA_FILE", &ca),
            ("HOURGLASS_KAFKA__CERT_FILE", &cert),
            ("HOURGLASS_KAFKA__KEY_FILE", &encrypted)
        ]),
        [format!(
            "{p}: kafka.key_file (from HOURGLASS_KAFKA__KEY_FILE): {encrypted}: an encrypted private key, which is \
             not read: give the key unencrypted (openssl pkey -in KEY -out KEY.plain), readable by Hourglass only \
             {key_hint}"
        )]
    );
    // A protocol not read is its one problem: the files are not judged by the default's
    // (they were "for TLS, and kafka.security_protocol is \"plaintext\"" too).
    let unknown = check(&[on, ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "tls"), ("HOURGLASS_KAFKA__CA_FILE", &ca)]);
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert!(
        unknown[0].starts_with(&format!("{p}: kafka.security_protocol (from HOURGLASS_KAFKA__SECURITY_PROTOCOL): ")),
        "{unknown:?}"
    );
    // Kafka's own capitals are taken.
    let capitals = ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "SSL");
    assert_eq!(check(&[on, capitals, ("HOURGLASS_KAFKA__CA_FILE", &ca)]), [format!("{p}: ok")]);
    let all = [
        on,
        ssl,
        ("HOURGLASS_KAFKA__CA_FILE", ca.as_str()),
        ("HOURGLASS_KAFKA__CERT_FILE", cert.as_str()),
        ("HOURGLASS_KAFKA__KEY_FILE", key.as_str()),
    ];
    assert_eq!(check(&all), [format!("{p}: ok")]);
}

/// Kafka's SASL login: its keys only with `sasl_plaintext` or `sasl_ssl`, which need a
/// mechanism librdkafka does here and a username.
#[test]
fn check_config_checks_the_kafka_sasl_login() {
    let p = EXAMPLE;
    let hint = |expects: &str| format!("(hint: expected {expects}; the default is \"\")");
    let mechanism_hint = hint("\"PLAIN\", \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\" with a SASL login, else \"\"");
    let user_hint = hint("the SASL login's username, or \"\" without one");
    let on = ("HOURGLASS_KAFKA__ENABLED", "true");
    assert_eq!(
        check_example(&[on, ("HOURGLASS_KAFKA__USERNAME", "ingest"), ("HOURGLASS_KAFKA__PASSWORD", "S3cret-kafka")]),
        [
            format!(
                "{p}: kafka.username (from HOURGLASS_KAFKA__USERNAME): is for a SASL login, and \
                 kafka.security_protocol is \"plaintext\": set it to \"sasl_plaintext\" or \"sasl_ssl\" {user_hint}"
            ),
            format!(
                "{p}: kafka.password (from HOURGLASS_KAFKA__PASSWORD): is for a SASL login, and \
                 kafka.security_protocol is \"plaintext\": set it to \"sasl_plaintext\" or \"sasl_ssl\" \
                 (hint: expected the SASL login's password; the default is \"\")"
            ),
        ]
    );
    let sasl = ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "sasl_plaintext");
    assert_eq!(
        check_example(&[on, sasl]),
        [
            format!(
                "{p}: kafka.sasl_mechanism: is needed with security_protocol \"sasl_plaintext\": \"PLAIN\", \
                 \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\" {mechanism_hint}"
            ),
            format!("{p}: kafka.username: is needed with security_protocol \"sasl_plaintext\" {user_hint}"),
            format!(
                "{p}: kafka.password: is needed with security_protocol \"sasl_plaintext\" (hint: expected the SASL \
                 login's password; the default is \"\")"
            ),
        ]
    );
    assert_eq!(
        check_example(&[
            on,
            sasl,
            ("HOURGLASS_KAFKA__SASL_MECHANISM", "GSSAPI"),
            ("HOURGLASS_KAFKA__USERNAME", "u"),
            ("HOURGLASS_KAFKA__PASSWORD", "p")
        ]),
        [format!(
            "{p}: kafka.sasl_mechanism (from HOURGLASS_KAFKA__SASL_MECHANISM): \"GSSAPI\" is not one Hourglass \
             takes: \"PLAIN\", \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\" {mechanism_hint}"
        )]
    );
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "scram-sha-512"] {
        let login = [
            on,
            ("HOURGLASS_KAFKA__SECURITY_PROTOCOL", "sasl_ssl"),
            ("HOURGLASS_KAFKA__SASL_MECHANISM", mechanism),
            ("HOURGLASS_KAFKA__USERNAME", "ingest"),
            ("HOURGLASS_KAFKA__PASSWORD", "S3cret-kafka"),
        ];
        assert_eq!(check_example(&login), [format!("{p}: ok")], "{mechanism}");
    }
}

/// `serve` names every problem in one round, those of the values beside those of the syntax
/// and the keys (before, the values' came only once the rest was mended), with its flags
/// applied: a flag that mends a value leaves no problem.
#[test]
fn serve_reports_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "data_dir = \"\"\n[mqtt]\nmax_payload = 5\nbroker_max_inflight = 0\n").unwrap();
    let p = path.to_str().unwrap();
    let same = [("HOURGLASS_HTTP__LISTEN", "127.0.0.1:18"), ("HOURGLASS_MQTT__LISTEN", "127.0.0.1:18")];
    let out = hourglass(&["serve", "-c", p], &same);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(
            "Error: invalid configuration, 4 problem(s):\n  \
             mqtt.max_payload: unknown key (hint: did you mean `mqtt.max_payload_bytes`?)\n  \
             data_dir: must not be empty (hint: expected a directory path; the default is \"hourglass-data\")\n  \
             mqtt.listen (from HOURGLASS_MQTT__LISTEN): 127.0.0.1:18 takes http.listen's port (127.0.0.1:18): the embedded \
             broker and the query service need a port each"
        ) && err.contains("mqtt.broker_max_inflight: 0 is out of range"),
        "{err}"
    );
    let out = hourglass(&["serve", "-c", p, "--data-dir", "d", "--mqtt-listen", "127.0.0.1:0"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("Error: invalid configuration, 2 problem(s):\n  mqtt.max_payload: unknown key"), "{err}");
}

/// What `check-config` says of settings that do nothing (an archive's beside `archive = false`),
/// and of a `RUST_LOG` that is not a filter (it was ignored in silence).
#[test]
fn check_config_warns_of_unused_archive_settings_and_an_unread_rust_log() {
    let p = "config/hourglass.example.toml";
    let vars = [
        ("HOURGLASS_STORAGE__ARCHIVE", "false"),
        ("HOURGLASS_STORAGE__ARCHIVE_URL", "s3://bucket/p"),
        ("HOURGLASS_STORAGE__ARCHIVE_DIR", "/srv/archive"),
        ("RUST_LOG", "[[["),
    ];
    let out = hourglass(&["check-config", p], &vars);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout_lines(&out),
        [
            format!("{p}: warning: storage.archive_url (s3://bucket/p) is not used: storage.archive is false, so no partition is archived"),
            format!("{p}: warning: storage.archive_dir (/srv/archive) is not used: storage.archive is false, so no partition is archived"),
            format!("{p}: ok"),
        ]
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "RUST_LOG is not a filter that can be read (such as \"info\" or \"warn,ingest=debug\"): logging at"
        ),
        "{err}"
    );
}

/// A `serve` that stops before it is ready fails the test with its own last log lines (so a
/// CI excerpt shows why), here the config check's message.
#[test]
#[should_panic(expected = "its last log lines:\nError: invalid configuration, 1 problem(s):\n  \
                           storage.max_batch_readings (from HOURGLASS_STORAGE__MAX_BATCH_READINGS): must be at least 1 (hint:")]
fn a_serve_that_stops_before_ready_fails_the_test_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    crate::util::Hourglass::start_with_env(dir.path(), None, &[("HOURGLASS_STORAGE__MAX_BATCH_READINGS", "0")]);
}

/// An embedded broker's address beside an external broker's is refused, not ignored.
#[test]
fn serve_refuses_an_embedded_broker_address_beside_an_external_broker() {
    let out = hourglass(&["serve", "--mqtt-url", "mqtt://127.0.0.1:1883", "--mqtt-listen", "127.0.0.1:0"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the argument '--mqtt-url <MQTT_URL>' cannot be used with '--mqtt-listen <MQTT_LISTEN>'"),
        "{err}"
    );
    // The same with `mqtt.url` from a variable (or the file).
    let vars = [("HOURGLASS_MQTT__URL", "mqtt://127.0.0.1:1883")];
    let out = hourglass(&["serve", "--mqtt-listen", "127.0.0.1:0"], &vars);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(
            "Error: --mqtt-listen 127.0.0.1:0 sets the embedded broker's address, but mqtt.url \
             (mqtt://127.0.0.1:1883) selects an external broker"
        ),
        "{err}"
    );
}

/// The error that ends the process is one JSON line with `--log-json`, as the log lines
/// before it are, also when `RUST_LOG` lets no log through; the plain form is unchanged.
#[test]
fn a_fatal_error_is_a_json_line_under_log_json() {
    let var = [("HOURGLASS_STORAGE__MAX_BATCH_READINGS", "0"), ("RUST_LOG", "off")];
    let out = hourglass(&["--log-json", "check-config", "config/hourglass.example.toml"], &var);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!((&line["level"], &line["target"]), (&"ERROR".into(), &"hourglass".into()), "{line}");
    assert_eq!(line["fields"]["message"], "1 problem(s) in config/hourglass.example.toml", "{line}");
    let stamp = line["timestamp"].as_str().unwrap();
    assert!(stamp.len() == 24 && stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.', "{stamp}");

    // With no backtrace, though one is asked for (it is for panics).
    let plain = hourglass(&["check-config", "config/hourglass.example.toml"], &[var[0], ("RUST_BACKTRACE", "1")]);
    assert_eq!(plain.status.code(), Some(1));
    let err = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(err, "Error: 1 problem(s) in config/hourglass.example.toml\n");
}
