//! A thread of its own, at a lower CPU priority, for work that can wait: the roll-up passes.
//!
//! On a small machine the roll-up stage competes for the same cores as ingest (broker client,
//! decoding, the bucketer, RocksDB's flushes). Ingest comes first: a reading not yet stored is
//! one a sensor or broker is still holding, while a roll-up that runs late only shows as
//! roll-up lag (`hourglass_rollup_lag_seconds`) and is caught up when ingest leaves the CPU
//! idle. The thread runs at nice [`BACKGROUND_NICE`] — not the lowest, so under a saturating
//! ingest it still gets about a tenth of a core (Linux CFS weights 110 against 1024) instead
//! of starving.
//!
//! A dedicated thread rather than the blocking pool: an unprivileged process can lower a
//! thread's priority but not raise it again, so a pool thread once lowered would stay low for
//! whatever ran on it next (query handlers among them).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;

use tokio::sync::oneshot;

/// The nice value of background threads (0 is normal, 19 the lowest).
pub(crate) const BACKGROUND_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// A worker thread at a lower CPU priority that runs one job at a time, in order.
///
/// Dropping it lets the thread finish the job in progress and end.
#[derive(Debug)]
pub(crate) struct BackgroundThread {
    jobs: mpsc::Sender<Job>,
}

impl BackgroundThread {
    /// Starts the thread, named `name`. Failing to lower its priority is logged, not fatal.
    pub(crate) fn spawn(name: &str) -> std::io::Result<BackgroundThread> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread_name = name.to_string();
        std::thread::Builder::new().name(thread_name.clone()).spawn(move || {
            lower_priority(&thread_name);
            while let Ok(job) = rx.recv() {
                // A panicking job drops its reply sender (its caller sees the panic as an
                // error); the thread lives on for the next job.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
            }
        })?;
        Ok(BackgroundThread { jobs })
    }

    /// Runs `work` on the thread and waits for its result; an error if `work` panicked.
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(work());
            }))
            .map_err(|_| "the background thread has ended".to_string())?;
        rx.await.map_err(|_| "the job panicked".to_string())
    }
}

#[cfg(target_os = "linux")]
fn lower_priority(name: &str) {
    // On Linux, PRIO_PROCESS with a thread id sets the priority of that thread alone. A
    // process already running at a lower priority keeps it (raising it needs privileges).
    let tid = rustix::thread::gettid();
    let nice = background_nice(rustix::process::getpriority_process(Some(tid)).unwrap_or(0));
    match rustix::process::setpriority_process(Some(tid), nice) {
        Ok(()) => tracing::debug!(thread = name, nice, "background thread priority lowered"),
        Err(e) => {
            tracing::warn!(thread = name, error = %e, "cannot lower the background thread's priority; it runs at normal priority")
        }
    }
}

/// The nice value for a background thread started from a thread at nice `current`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn background_nice(current: i32) -> i32 {
    current.max(BACKGROUND_NICE)
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(name: &str) {
    tracing::debug!(thread = name, "background thread runs at normal priority on this platform");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_in_order_and_survives_a_panic() {
        let thread = BackgroundThread::spawn("test-background").expect("spawn");
        assert_eq!(thread.run(|| 2 + 3).await, Ok(5));
        let panicked = thread.run(|| -> u32 { panic!("boom") }).await;
        assert_eq!(panicked, Err("the job panicked".to_string()));
        // The same thread serves the next job.
        assert_eq!(thread.run(|| "after").await, Ok("after"));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_thread_runs_at_the_background_nice_value() {
        let own = || rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("getpriority");
        let before = own();
        let thread = BackgroundThread::spawn("test-nice").expect("spawn");
        let nice = thread.run(own).await.expect("job ran");
        assert_eq!(nice, background_nice(before));
        // The caller's own thread is untouched.
        assert_eq!(own(), before);
    }

    #[test]
    fn a_thread_already_lower_stays_lower() {
        assert_eq!(background_nice(0), 10);
        assert_eq!(background_nice(-5), 10);
        assert_eq!(background_nice(15), 15);
    }
}
