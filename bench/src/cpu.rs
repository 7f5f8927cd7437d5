//! CPU time of the process's threads over a run, summed by thread name: where the cores went.
//!
//! The pipeline runs in the bench's process (in-process driver, or the embedded broker and the
//! consumers with the MQTT and Kafka drivers), so its threads' names say what spent the CPU:
//! `rocksdb:low` (compactions), `rocksdb:high` (memtable flushes), `wbuf-flusher` (the write
//! buffer's flushes), `tokio-rt-worker` (the writers, decoding and the query service), and so
//! on. Each thread's time on a CPU is read from `/proc/self/task/TID/schedstat` (nanoseconds,
//! first field) and its name from `comm`; a run's figure for a name is the growth of the sum
//! over the threads of that name between two snapshots. A thread that ended between them is
//! not counted (its time is gone with its `/proc` entry); one that started after the first
//! counts from zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Time on a CPU of each live thread: (thread id, name, nanoseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub Vec<(u64, String, u64)>);

/// CPU time of the threads of one name over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// Thread name (`comm`, at most 15 bytes).
    pub name: String,
    /// Threads of that name seen at the end of the run.
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
    out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn schedstat_gives_its_first_field() {
        assert_eq!(parse_schedstat("606484378 288198037 1150\n"), Some(606_484_378));
        assert_eq!(parse_schedstat("0 0 0"), Some(0));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
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
                let own =
                    || std::fs::read_to_string("/proc/thread-self/schedstat").ok().and_then(|s| parse_schedstat(&s));
                // Bounded: until it has run 20 ms, or 10 s have passed.
                let start = std::time::Instant::now();
                let mut x = 0u64;
                while own().is_some_and(|ns| ns < 20_000_000) && start.elapsed() < std::time::Duration::from_secs(10) {
                    x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
                }
                spun_tx.send(own().unwrap_or(0)).unwrap();
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
