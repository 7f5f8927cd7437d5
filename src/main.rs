//! `hourglass`: the IoT time-series pipeline binary — CLI, configuration, wiring, shutdown.
//!
//! Subcommands: `serve` (the pipeline), `demo` (the pipeline plus a simulated fleet), `bench`
//! (load tests), `check-config`.

mod background;
mod broker_drain;
mod config;
mod demo;
mod harness;
mod logging;
mod serve;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::Config;

/// mimalloc: readings are allocated on the decoding threads and freed on the bucketer's, many
/// small allocations a second that glibc's malloc serves with lock contention and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its index in `mi_option_e`, the same in mimalloc 2 and
/// 3; libmimalloc-sys names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// How long memory mimalloc holds free stays with the process before it is given back to the
/// OS: never (-1). mimalloc 3's default, 1 s, is shorter than the cycles of this pipeline's big
/// transient buffers (ingest batches, write-buffer flushes and roll-up passes come every few
/// seconds under load): each cycle gave their pages back (`madvise`) and faulted them in afresh,
/// zeroed by the kernel. In the roll-up benchmark's sustained phase that was over a third of
/// the process's kernel time: 0.25–0.27 µs of system CPU a reading at 1 s, 0.17 never (page
/// faults 625K and 313K; 10 s kept half of the saving; BENCHMARKS.md). The process keeps its
/// high-water mark of heap instead, and reuses it; `MIMALLOC_PURGE_DELAY` (milliseconds) in the
/// environment sets another delay.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = -1;

/// Sets mimalloc's purge delay; a `MIMALLOC_PURGE_DELAY` in the environment wins.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` stores a number in mimalloc's option table (initialized
        // when the process loaded); it takes any option index and value, dereferences nothing
        // given, and may be called at any time from any thread.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) };
    }
}

/// The version and the build: `0.1.0 (4f3c2a1, 2026-12-07)`, the commit it was built from and
/// that commit's date (`build.rs`).
pub(crate) const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("HG_BUILD"), ")");

#[derive(Debug, Parser)]
#[command(
    name = "hourglass",
    version = VERSION,
    about = "IoT time-series ingestion pipeline: MQTT → hourly buckets in RocksDB → HTTP queries"
)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the pipeline: embedded MQTT broker (unless --mqtt-url), ingest, storage, query service.
    Serve(ServeArgs),
    /// Run the pipeline with a simulated fleet of trucks publishing through the broker.
    Demo {
        #[command(flatten)]
        serve: ServeArgs,
        /// Trucks in the simulated fleet.
        #[arg(long, default_value_t = 2000)]
        devices: u64,
        /// Time between two readings of a truck, ms.
        #[arg(long, default_value_t = 10_000)]
        interval_ms: i64,
        /// Hours of history published at start, so charts have data at once.
        #[arg(long, default_value_t = 1)]
        backfill_hours: u64,
    },
    /// Validate a configuration file with the `HOURGLASS_*` variables applied, and report
    /// every problem at once, each with its key and a hint.
    CheckConfig {
        /// The file to check.
        path: PathBuf,
    },
    /// Compact a stopped store fully (write buffer, memtables, every level), then report its
    /// bytes before and after as JSON: the size a long-running store settles at.
    Compact(StoreArgs),
    /// Load tests; results as JSON on stdout.
    #[command(subcommand)]
    Bench(demo::BenchCommand),
}

/// Options of `serve` and `demo`; each overrides the config file and the `HOURGLASS_*`
/// variables (`HOURGLASS_DATA_DIR`, `HOURGLASS_HTTP__LISTEN`, ...: see
/// config/hourglass.example.toml).
#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Query service address (key `http.listen`). Port 0 takes a free port, named in the ready
    /// line.
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// Embedded broker address (key `mqtt.listen`). Port 0 takes a free port, named in the ready
    /// line. Not with `--mqtt-url` (no embedded broker then).
    #[arg(long, conflicts_with = "mqtt_url")]
    mqtt_listen: Option<SocketAddr>,
    /// Use this external broker (mqtt://host:port, or mqtts://host:port for TLS) instead of the
    /// embedded one (key `mqtt.url`; its login and TLS files are keys of the file).
    #[arg(long)]
    mqtt_url: Option<String>,
    /// fsync the WAL on every commit.
    #[arg(long)]
    sync_wal: bool,
}

/// Options of every command that opens the store (`serve`, `demo`, `compact`).
#[derive(Debug, Args)]
struct StoreArgs {
    /// Configuration file (TOML); defaults apply without one.
    #[arg(long, short = 'c', env = "HOURGLASS_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (key `data_dir`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl StoreArgs {
    fn config(&self) -> anyhow::Result<Config> {
        self.config_with(|_| {})
    }

    /// The configuration with this command's flags over it, `more` (another command's) last.
    fn config_with(&self, more: impl FnOnce(&mut Config)) -> anyhow::Result<Config> {
        let adjust = |cfg: &mut Config| {
            if let Some(d) = &self.data_dir {
                cfg.data_dir = d.clone();
            }
            more(cfg);
        };
        Config::load_with(self.config.as_deref(), env_vars(), adjust).map_err(|p| config::problems_error(&p))
    }
}

impl ServeArgs {
    fn config(&self) -> anyhow::Result<Config> {
        let cfg = self.store.config_with(|cfg| {
            if let Some(a) = self.http_listen {
                cfg.http.listen = a;
            }
            if let Some(a) = self.mqtt_listen {
                cfg.mqtt.listen = a;
            }
            if let Some(u) = &self.mqtt_url {
                cfg.mqtt.url = Some(u.clone());
            }
            if self.sync_wal {
                cfg.storage.sync_wal = true;
            }
        })?;
        // Beside `--mqtt-url` clap refuses it; beside a file's or a variable's `mqtt.url` too.
        if let (Some(listen), Some(url)) = (self.mqtt_listen, &cfg.mqtt.url) {
            let url = ingest::mqtt::redact_userinfo(url);
            anyhow::bail!(
                "--mqtt-listen {listen} sets the embedded broker's address, but mqtt.url ({url}) selects an external \
                 broker: no embedded broker runs (unset mqtt.url, or drop --mqtt-listen)"
            );
        }
        Ok(cfg)
    }
}

/// Starts the pipeline (see [`serve::start_unready`]). A first signal while it starts (the
/// store's open can take minutes at 10M devices) is answered with the ordered stop once it has
/// started (`None`, after that stop); a second one quits at once, as a load test's does: what
/// the store committed is in its write-ahead log.
async fn start_or_quit(cfg: &Config, signals: &mut serve::StopSignals) -> anyhow::Result<Option<serve::Running>> {
    let mut starting = std::pin::pin!(serve::start_unready(cfg));
    let mut asked = false;
    let running = loop {
        tokio::select! {
            started = &mut starting => break started?,
            () = signals.recv() => {
                if asked {
                    tracing::error!("asked twice to stop while starting: quitting now");
                    quit_now(130);
                }
                asked = true;
                tracing::warn!("asked to stop while starting: stopping in order once started (again to quit now)");
            }
        }
    };
    if !asked {
        return Ok(Some(running));
    }
    stop_in_order(running, signals).await?;
    Ok(None)
}

/// The ordered stop ([`serve::Running::shutdown`]); a signal while it goes on (a stop that
/// waits on a failing disk, or for a broker's last messages) quits at once, as at the start.
async fn stop_in_order(running: serve::Running, signals: &mut serve::StopSignals) -> anyhow::Result<()> {
    tracing::info!("stopping in order (a second SIGINT, SIGTERM or SIGHUP quits at once)");
    tokio::select! {
        stopped = running.shutdown() => stopped,
        () = signals.recv() => {
            tracing::error!("asked again to stop: quitting now (what was committed is in the write-ahead log)");
            quit_now(130)
        }
    }
}

/// Ends the process at once with `code`, as a second Ctrl-C asks: `_exit`, not `exit`, which
/// would run the C++ static destructors while RocksDB's threads still use the store (opening
/// it, or compacting): a known way to crash on the way out. What was committed is in the
/// write-ahead log either way.
pub(crate) fn quit_now(code: i32) -> ! {
    #[allow(unsafe_code)]
    // SAFETY: `_exit` ends the process without running any handler; nothing is left to use.
    unsafe {
        libc::_exit(code)
    }
}

/// The process environment, for the `HOURGLASS_*` overrides.
fn env_vars() -> Vec<(String, String)> {
    std::env::vars_os().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())).collect()
}

/// Prints a line on stdout (what the user asked for, as opposed to logs on stderr).
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    if let Command::Bench(demo::BenchCommand::Replay(args)) = &mut cli.command {
        if let Some(m) = matches.subcommand_matches("bench").and_then(|m| m.subcommand_matches("replay")) {
            args.given_on_command_line(m);
        }
    }
    let json = cli.log_json;
    logging::init(json);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            report_fatal(&e, json);
            match e.downcast_ref::<harness::Interrupted>() {
                // As a shell reports a command that SIGINT ended.
                Some(_) => std::process::ExitCode::from(130),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}

/// Reports the error that ends the process: as the standard library would for an error
/// returned from `main` (`Error: …` and its causes), or with `--log-json` as one JSON line
/// shaped like the other log lines on stderr (whatever `RUST_LOG` lets through), so a log
/// collector that reads only JSON sees why the process ended. Never with a backtrace: these
/// errors are an operator's (a bad setting, a port in use), and `RUST_BACKTRACE`, set for
/// panics, would bury the reason under the stack of the line that reported it.
fn report_fatal(e: &anyhow::Error, json: bool) {
    let mut err = std::io::stderr().lock();
    let _ = if json {
        let line = serde_json::json!({
            "timestamp": model::utc_text_ms(ingest::now_ms()),
            "level": "ERROR",
            "fields": {"message": format!("{e:#}")},
            "target": "hourglass",
        });
        writeln!(err, "{line}")
    } else {
        writeln!(err, "Error: {}", fatal_text(e))
    };
}

/// `e` and its causes as anyhow shows them (`{:?}`), without the backtrace it may hold.
fn fatal_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    match causes.as_slice() {
        [] => {}
        [one] => text.push_str(&format!("\n\nCaused by:\n    {one}")),
        many => {
            text.push_str("\n\nCaused by:");
            for (i, cause) in many.iter().enumerate() {
                text.push_str(&format!("\n    {i}: {cause}"));
            }
        }
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve(args) => {
                let cfg = args.config()?;
                // Listened for before the start: a stop asked for while the store opens or the
                // consumers subscribe is an ordered stop too.
                let mut signals = serve::StopSignals::listen();
                let Some(mut running) = start_or_quit(&cfg, &mut signals).await? else {
                    return Ok(());
                };
                let mqtt = running.mqtt_broker().map_or("off".to_string(), |(h, p)| format!("{h}:{p}"));
                let http = running.http_url.clone();
                let line =
                    |state: &str| format!("hourglass {state}: http={http} mqtt={mqtt} data={}", cfg.data_dir.display());
                let before = "asked to stop before the consumers were subscribed";
                tokio::select! {
                    all = running.wait_subscribed(&cfg) => {
                        if !all {
                            // The query service answers; a publisher waiting for the ready line
                            // waits on.
                            say(&line("serving, not ready (a consumer is not subscribed yet: GET /ready says which)"));
                            tokio::select! {
                                () = running.wait_all_subscribed() => say(&line("ready")),
                                () = signals.recv() => {
                                    tracing::warn!("{before}");
                                    return stop_in_order(running, &mut signals).await;
                                }
                            }
                        } else {
                            say(&line("ready"));
                        }
                        signals.recv().await;
                    }
                    () = signals.recv() => tracing::warn!("{before}"),
                }
                stop_in_order(running, &mut signals).await
            }
            Command::Demo { serve, devices, interval_ms, backfill_hours } => {
                demo::demo(serve.config()?, devices, interval_ms, backfill_hours).await
            }
            Command::CheckConfig { path } => match Config::check(Some(&path), env_vars()) {
                Ok(cfg) => {
                    for warning in cfg.warnings() {
                        say(&format!("{}: warning: {warning}", path.display()));
                    }
                    say(&format!("{}: ok", path.display()));
                    Ok(())
                }
                Err(problems) => {
                    for p in &problems {
                        say(&format!("{}: {p}", path.display()));
                    }
                    anyhow::bail!("{} problem(s) in {}", problems.len(), path.display())
                }
            },
            Command::Compact(args) => {
                let cfg = args.config()?;
                let report = tokio::task::spawn_blocking(move || serve::compact(&cfg)).await??;
                say(&serde_json::to_string_pretty(&report)?);
                Ok(())
            }
            Command::Bench(cmd) => demo::bench(cmd).await,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(unsafe_code)]
    fn purge_delay() -> std::ffi::c_long {
        // SAFETY: reads a number from mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
    }

    /// The fatal error reads as anyhow's `{:?}` without a backtrace, whatever `RUST_BACKTRACE`.
    #[test]
    fn a_fatal_error_shows_its_causes_and_no_backtrace() {
        let root = || std::io::Error::other("port in use");
        let one = anyhow::Error::new(root()).context("cannot listen");
        assert_eq!(fatal_text(&one), "cannot listen\n\nCaused by:\n    port in use");
        let two = anyhow::Error::new(root()).context("cannot listen").context("starting");
        assert_eq!(fatal_text(&two), "starting\n\nCaused by:\n    0: cannot listen\n    1: port in use");
        assert_eq!(fatal_text(&anyhow::anyhow!("3 problem(s)")), "3 problem(s)");
        // anyhow's own form, backtrace aside, for the same error.
        let debug = format!("{two:?}");
        assert!(debug.starts_with(&fatal_text(&two)), "{debug}");
    }

    #[test]
    fn the_allocator_keeps_the_memory_it_frees() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return; // set by whoever runs the tests: `tune_allocator` leaves it alone
        }
        // The index is mimalloc's purge delay: its default in the bundled mimalloc 3 is 1 s.
        assert_eq!(purge_delay(), 1_000);
        tune_allocator();
        assert_eq!(purge_delay(), -1);
    }
}
