//! CPU time of the process's threads over a run, summed by thread name: where the cores went.
//!
//! The pipeline runs in the bench's process (in-process driver, or the embedded broker and the
//! consumers with the MQTT and Kafka drivers), so its threads' names say what spent the CPU:
//! `rocksdb:low` (compactions), `rocksdb:high` (memtable flushes), `wbuf-flusher` (the write
//! buffer's flushes), `tokio-rt-worker` (the writers, decoding and the query service), and so
//! on. Each thread's time on a CPU is read from `/proc/self/task/TID/schedstat` (nanoseconds,
//! first field) and its name from `comm`; a run's figure for a name is the growth of the sum
//! over the threads of that name between two snapshots; one that started after the first
//! counts from zero. A thread that ended between them is gone with its `/proc` entry, but not
//! its time: the process's own CPU time (`/proc/self/stat`) keeps it, and [`Start::since`]
//! lists what the live threads do not account for as [`ENDED`] (RocksDB's subcompaction
//! threads, for one, live for one compaction).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Time on a CPU of each live thread: (thread id, name, nanoseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub Vec<(u64, String, u64)>);

/// CPU time of the threads of one name over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// Thread name (`comm`, at most 15 bytes).
    pub name: String,
    /// Threads of that name seen at the end of the run; 0 for [`ENDED`].
    pub threads: usize,
    /// Seconds on a CPU over the run.
    pub seconds: f64,
}

/// The first field of a `schedstat` file: nanoseconds on a CPU. `None` if it is not a number.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// The threads of this process now; empty where `/proc` is absent.
pub fn snapshot() -> Snapshot {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Snapshot::default();
    };
    let mut threads = Vec::new();
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
        let dir = task.path();
        // A thread that ends while it is read is skipped.
        let (Ok(stat), Ok(comm)) =
            (std::fs::read_to_string(dir.join("schedstat")), std::fs::read_to_string(dir.join("comm")))
        else {
            continue;
        };
        if let Some(ns) = parse_schedstat(&stat) {
            threads.push((tid, comm.trim_end().to_string(), ns));
        }
    }
    threads.sort();
    Snapshot(threads)
}

/// CPU time (user + system) this process has used, seconds, its ended threads' included, from
/// `/proc/self/stat` (Linux; its clock ticks are USER_HZ = 100 a second); `None` elsewhere.
pub fn process_cpu_seconds() -> Option<f64> {
    cpu_seconds_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// User + system CPU seconds from the text of a `/proc/PID/stat`.
pub fn cpu_seconds_of_stat(stat: &str) -> Option<f64> {
    // Fields after the command name (which may hold spaces) start at its closing parenthesis:
    // state is field 3, utime 14 and stime 15.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// The row of [`Start::since`] for the CPU time of threads that ended during the run and did
/// not count themselves in [`Ended`]: the pipeline's, as [`PerPoint`] counts every name but
/// the harness's.
pub const ENDED: &str = "(ended threads)";

/// Smallest time [`Start::since`] lists as [`ENDED`], seconds: the process's CPU time is read
/// in ticks of 10 ms, so less than two of them is rounding, not a thread.
pub const ENDED_MIN_SECONDS: f64 = 0.02;

/// The CPU of this process at the start of a run: its live threads and its own total.
#[derive(Debug, Clone, Default)]
pub struct Start {
    threads: Snapshot,
    process_seconds: Option<f64>,
}

impl Start {
    /// Now. The threads are read first, so the process's total can only include more than
    /// they do, and [`ENDED`] is never overstated by the order of the reads.
    pub fn now() -> Start {
        let threads = snapshot();
        Start { threads, process_seconds: process_cpu_seconds() }
    }

    /// CPU time since the start by thread name ([`by_name`]), with a row [`ENDED`] for the
    /// threads that ended in between, less `counted_ended` seconds of them already counted
    /// elsewhere ([`Ended::seconds`] read just before).
    pub fn since(&self, counted_ended: f64) -> Vec<ThreadCpu> {
        let process = process_cpu_seconds();
        let cpu = by_name(&self.threads, &snapshot());
        match (self.process_seconds, process) {
            (Some(before), Some(after)) => with_ended(cpu, after - before, counted_ended),
            _ => cpu,
        }
    }
}

/// `cpu` (of the live threads, [`by_name`]) with a row [`ENDED`] for what the process spent
/// beyond it over the same time (`process_seconds`), less `counted_ended`; no row under
/// [`ENDED_MIN_SECONDS`]. Most first, as [`by_name`] orders.
pub fn with_ended(mut cpu: Vec<ThreadCpu>, process_seconds: f64, counted_ended: f64) -> Vec<ThreadCpu> {
    let live: f64 = cpu.iter().map(|t| t.seconds).sum();
    let ended = process_seconds - live - counted_ended;
    if ended >= ENDED_MIN_SECONDS {
        cpu.push(ThreadCpu { name: ENDED.to_string(), threads: 0, seconds: ended });
        most_first(&mut cpu);
    }
    cpu
}

/// Orders `cpu` most time first, names of equal time in name order.
fn most_first(cpu: &mut [ThreadCpu]) {
    cpu.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
}

/// CPU time between `before` and `after` by thread name, most first (names of equal time in
/// name order). A thread is matched by its id and name: a thread id reused by a new thread of
/// another name counts from zero.
pub fn by_name(before: &Snapshot, after: &Snapshot) -> Vec<ThreadCpu> {
    let start: BTreeMap<(u64, &str), u64> = before.0.iter().map(|(t, n, ns)| ((*t, n.as_str()), *ns)).collect();
    let mut sums: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for (tid, name, ns) in &after.0 {
        let from = start.get(&(*tid, name.as_str())).copied().unwrap_or(0);
        let e = sums.entry(name.as_str()).or_default();
        e.0 += 1;
        e.1 += ns.saturating_sub(from);
    }
    let mut out: Vec<ThreadCpu> = sums
        .into_iter()
        .map(|(name, (threads, ns))| ThreadCpu { name: name.to_string(), threads, seconds: ns as f64 / 1e9 })
        .collect();
    most_first(&mut out);
    out
}

/// CPU time of threads that have ended, each added by the thread itself as its last act: the
/// harness's threads, which end before a run's report is made and so are gone from `/proc` by
/// the final [`snapshot`]. Names and counts as in [`ThreadCpu`].
#[derive(Debug, Default)]
pub struct Ended(Mutex<BTreeMap<String, (usize, u64)>>);

impl Ended {
    /// Adds the calling thread's whole time on a CPU under its name; nothing where `/proc` is
    /// absent. Call it last thing on a thread that started after the run's first snapshot.
    pub fn add_this_thread(&self) {
        let read = |f: &str| std::fs::read_to_string(format!("/proc/thread-self/{f}")).ok();
        let (Some(ns), Some(name)) = (read("schedstat").as_deref().and_then(parse_schedstat), read("comm")) else {
            return;
        };
        let mut sums = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = sums.entry(name.trim_end().to_string()).or_default();
        e.0 += 1;
        e.1 += ns;
    }

    /// Seconds of every thread counted so far.
    pub fn seconds(&self) -> f64 {
        let sums = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sums.values().map(|(_, ns)| *ns as f64 / 1e9).sum()
    }

    /// `cpu` ([`by_name`] of a run) with the harness's threads ([`is_harness`]) as they ended,
    /// not as a snapshot caught them, most first.
    pub fn replace_harness(&self, cpu: Vec<ThreadCpu>) -> Vec<ThreadCpu> {
        let sums = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<ThreadCpu> = cpu.into_iter().filter(|t| !is_harness(&t.name)).collect();
        out.extend(sums.iter().filter(|(name, _)| is_harness(name)).map(|(name, (threads, ns))| ThreadCpu {
            name: name.clone(),
            threads: *threads,
            seconds: *ns as f64 / 1e9,
        }));
        most_first(&mut out);
        out
    }
}

/// Names of the harness's own threads start with this: `bench-load` (the workload generator and
/// the driver's senders: MQTT publishers, the Kafka producing loop), `bench-queries` (the query
/// clients), `bench-e2e` (the end-to-end poller), `bench-sampler` (the per-second series),
/// `bench-progress` (progress logged where no bar is drawn, [`crate::progress`]). In a
/// deployment that work runs on the sensors and the dashboards, not beside the pipeline.
pub const HARNESS_PREFIX: &str = "bench-";

/// Whether a thread of that name is the harness's rather than the pipeline's.
pub fn is_harness(name: &str) -> bool {
    name.starts_with(HARNESS_PREFIX)
}

/// CPU time a stored point, split between the pipeline under test and the harness driving it.
///
/// The pipeline's figure is what an operator sizes cores by: points a second on `n` cores is at
/// most `n / pipeline_us` million. Two threads cannot be told apart by name and are counted as
/// the pipeline's: librdkafka's (`rdk:`), shared by the Kafka driver's producer and the
/// pipeline's consumer, and the process's main thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PerPoint {
    /// Microseconds of CPU a point, every thread but the harness's.
    pub pipeline_us: f64,
    /// Microseconds of CPU a point, the harness's threads ([`HARNESS_PREFIX`]).
    pub harness_us: f64,
}

impl PerPoint {
    /// The split of `cpu` over `points`; zeros when no point was stored.
    pub fn of(cpu: &[ThreadCpu], points: u64) -> PerPoint {
        if points == 0 {
            return PerPoint::default();
        }
        let (harness, pipeline): (Vec<&ThreadCpu>, Vec<&ThreadCpu>) = cpu.iter().partition(|t| is_harness(&t.name));
        let us = |ts: Vec<&ThreadCpu>| ts.iter().map(|t| t.seconds).sum::<f64>() * 1e6 / points as f64;
        PerPoint { pipeline_us: us(pipeline), harness_us: us(harness) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Spins the calling thread until it has run `ms` milliseconds on a CPU, or 10 s have
    /// passed; its time on a CPU then, nanoseconds (0 where `/proc` is absent).
    fn spin_for(ms: u64) -> u64 {
        let own = || std::fs::read_to_string("/proc/thread-self/schedstat").ok().and_then(|s| parse_schedstat(&s));
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while own().is_some_and(|ns| ns < ms * 1_000_000) && start.elapsed() < std::time::Duration::from_secs(10) {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
        own().unwrap_or(0)
    }

    #[test]
    fn schedstat_gives_its_first_field() {
        assert_eq!(parse_schedstat("606484378 288198037 1150\n"), Some(606_484_378));
        assert_eq!(parse_schedstat("0 0 0"), Some(0));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn cpu_seconds_are_read_past_a_command_name_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime …
        let stat = "4242 (tokio rt) worker) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 56 0 0 20 0 9 0";
        assert_eq!(cpu_seconds_of_stat(stat), Some(12.9));
        assert_eq!(cpu_seconds_of_stat("4242 (x) S 1"), None);
        assert_eq!(cpu_seconds_of_stat("4242 (x)"), None);
        assert!(process_cpu_seconds().is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn what_the_live_threads_miss_is_listed_as_ended() {
        let t = |name: &str, seconds: f64| ThreadCpu { name: name.into(), threads: 1, seconds };
        let live = vec![t("rocksdb:low", 3.0), t("bucketer", 0.5)];
        // 5.5 s for the process, 3.5 s live, 0.5 s of harness threads that counted themselves.
        assert_eq!(
            with_ended(live.clone(), 5.5, 0.5),
            [t("rocksdb:low", 3.0), ThreadCpu { name: ENDED.into(), threads: 0, seconds: 1.5 }, t("bucketer", 0.5)]
        );
        // A tick of rounding either way is no thread.
        assert_eq!(with_ended(live.clone(), 3.51, 0.0), live);
        assert_eq!(with_ended(live.clone(), 3.4, 0.0), live);
        // The ended threads are the pipeline's.
        let cpu = with_ended(live, 5.5, 0.5);
        assert_eq!(PerPoint::of(&cpu, 1_000_000), PerPoint { pipeline_us: 5.0, harness_us: 0.0 });
    }

    /// A thread that spins and ends during a run is gone from `/proc/self/task`, and its time
    /// is listed under [`ENDED`].
    #[test]
    fn an_ended_thread_is_counted_as_ended() {
        let start = Start::now();
        let spun =
            std::thread::Builder::new().name("cpu-test-ends".into()).spawn(|| spin_for(100)).unwrap().join().unwrap();
        assert!(spun >= 100_000_000, "the thread ran {spun} ns");
        let cpu = start.since(0.0);
        assert!(cpu.iter().all(|t| t.name != "cpu-test-ends"), "{cpu:?}");
        let ended = cpu.iter().find(|t| t.name == ENDED).unwrap();
        // Less the process figure's rounding (a tick at each end) and the reads' order.
        assert!(ended.seconds >= spun as f64 / 1e9 - 0.03, "{ended:?} against {spun} ns");
        assert_eq!(ended.threads, 0);
    }

    #[test]
    fn time_is_summed_by_name_from_the_first_snapshot() {
        let snap = |v: &[(u64, &str, u64)]| Snapshot(v.iter().map(|(t, n, ns)| (*t, n.to_string(), *ns)).collect());
        let before =
            snap(&[(1, "main", 1_000_000_000), (2, "rocksdb:low", 500), (3, "rocksdb:low", 0), (9, "gone", 7)]);
        let after = snap(&[
            (1, "main", 1_250_000_000),
            (2, "rocksdb:low", 2_000_000_500),
            (3, "rocksdb:low", 1_000_000_000),
            // Started during the run: counted from zero.
            (4, "wbuf-flusher", 3_000_000_000),
            // Thread id 9 reused under another name: counted from zero too.
            (9, "rollup", 500_000_000),
        ]);
        assert_eq!(
            by_name(&before, &after),
            [
                ThreadCpu { name: "rocksdb:low".into(), threads: 2, seconds: 3.0 },
                ThreadCpu { name: "wbuf-flusher".into(), threads: 1, seconds: 3.0 },
                ThreadCpu { name: "rollup".into(), threads: 1, seconds: 0.5 },
                ThreadCpu { name: "main".into(), threads: 1, seconds: 0.25 },
            ]
        );
    }

    #[test]
    fn the_harness_threads_are_told_from_the_pipelines_by_name() {
        let t = |name: &str, seconds: f64| ThreadCpu { name: name.into(), threads: 1, seconds };
        let cpu = [
            t("rocksdb:low", 3.0),
            t("bench-load", 1.5),
            t("tokio-rt-worker", 2.0),
            t("bench-queries", 0.25),
            t("bucketer", 1.0),
            t("benchmark", 0.5),
        ];
        // 1,000,000 points: a second of CPU is a microsecond a point.
        assert_eq!(PerPoint::of(&cpu, 1_000_000), PerPoint { pipeline_us: 6.5, harness_us: 1.75 });
        assert_eq!(PerPoint::of(&cpu, 0), PerPoint::default());
        assert_eq!(PerPoint::of(&[], 10), PerPoint { pipeline_us: 0.0, harness_us: 0.0 });
    }

    /// A harness thread is counted as it ended, after its `/proc` entry has gone; one still
    /// alive in a snapshot is not counted from it, and the pipeline's threads are kept.
    #[test]
    fn harness_threads_count_as_they_ended() {
        let ended = std::sync::Arc::new(Ended::default());
        let before = snapshot();
        let spin = |name: &str, ms: u64| {
            let ended = ended.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    spin_for(ms);
                    ended.add_this_thread();
                })
                .unwrap()
        };
        for h in [spin("bench-test-a", 20), spin("bench-test-a", 20), spin("bench-test-b", 10)] {
            h.join().unwrap();
        }
        let live = ThreadCpu { name: "bench-test-live".into(), threads: 1, seconds: 9.0 };
        let pipeline = ThreadCpu { name: "rocksdb:low".into(), threads: 1, seconds: 0.001 };
        let mut cpu = by_name(&before, &snapshot());
        assert!(cpu.iter().all(|t| !t.name.starts_with("bench-test-a")), "an ended thread in a snapshot: {cpu:?}");
        cpu.extend([live, pipeline.clone()]);
        let out = ended.replace_harness(cpu);
        let a = out.iter().find(|t| t.name == "bench-test-a").unwrap();
        let b = out.iter().find(|t| t.name == "bench-test-b").unwrap();
        assert_eq!((a.threads, b.threads), (2, 1));
        assert!(a.seconds >= 0.04 && b.seconds >= 0.01, "{a:?} {b:?}");
        assert!(out.iter().all(|t| t.name != "bench-test-live"), "{out:?}");
        assert!(out.contains(&pipeline), "{out:?}");
        assert!(out.windows(2).all(|w| w[0].seconds >= w[1].seconds), "{out:?}");
    }

    /// A thread of this process that spins is found under its name, with at least the time
    /// its own `schedstat` showed once it had spun; once it has ended, it is not listed.
    #[test]
    fn a_spinning_thread_is_found_by_name() {
        let before = snapshot();
        assert!(!before.0.is_empty(), "no threads read from /proc/self/task");
        let (spun_tx, spun_rx) = std::sync::mpsc::channel::<u64>();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(move || {
                spun_tx.send(spin_for(20)).unwrap();
                // Alive, and idle, until the test has looked.
                let _ = end_rx.recv();
            })
            .unwrap();
        let spun = spun_rx.recv().unwrap();
        assert!(spun >= 20_000_000, "the spinning thread ran {spun} ns");
        let during = by_name(&before, &snapshot());
        let found = during.iter().find(|t| t.name == "cpu-test-spin").unwrap();
        assert_eq!(found.threads, 1);
        assert!(found.seconds >= spun as f64 / 1e9, "{found:?} against {spun} ns");
        end_tx.send(()).unwrap();
        spinner.join().unwrap();
        let after = snapshot();
        assert!(after.0.iter().all(|(_, n, _)| n != "cpu-test-spin"), "an ended thread is listed: {after:?}");
    }
}
