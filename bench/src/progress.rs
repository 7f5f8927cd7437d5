//! Progress of long runs: a bar on a terminal, a log line every so often anywhere else.
//!
//! indicatif draws nothing when stderr is not a terminal: a replay started under `nohup`, in CI
//! or with stderr sent to a file would be silent for the half hour of a 10M-device hour. There a
//! thread `bench-progress` logs the bar's figures every [`LOG_EVERY`] instead.

use std::time::Duration;

use indicatif::{HumanCount, HumanDuration, ProgressBar, ProgressState, ProgressStyle, WeakProgressBar};

/// How often a bar that is not drawn is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// A bar of `total` points on stderr, sent at `rate` points a second (`None`: as fast as
/// possible), which its ETA keeps to ([`Snapshot::eta_s`]). Where stderr is not a terminal,
/// the bar's progress is logged every [`LOG_EVERY`] until it is finished or dropped.
pub fn bar(total: u64, rate: Option<f64>) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {human_pos}/{human_len} points  {rate}  ETA {eta}")
    {
        // Whole points a second, grouped as the counts are (indicatif's `per_sec` shows four
        // decimals).
        let per_second = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{}/s", HumanCount(state.per_sec() as u64));
        };
        let eta = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let pos = state.pos();
            let now = Snapshot {
                done: pos,
                total: state.len().unwrap_or(0).max(pos),
                elapsed_s: state.elapsed().as_secs_f64(),
                rate,
            };
            let _ = match now.eta_s() {
                Some(s) => write!(w, "{}", HumanDuration(Duration::from_secs_f64(s))),
                None => write!(w, "-"),
            };
        };
        bar.set_style(style.progress_chars("=> ").with_key("rate", per_second).with_key("eta", eta));
    }
    if bar.is_hidden() {
        let weak = bar.downgrade();
        let spawned = std::thread::Builder::new()
            .name("bench-progress".into())
            .spawn(move || watch(&weak, LOG_EVERY, |s| Snapshot { rate, ..s }.log()));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the thread that logs progress; the run goes on without it");
        }
    }
    bar
}

/// What a bar showed at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Points done.
    pub done: u64,
    /// Points in all.
    pub total: u64,
    /// Seconds since the bar started.
    pub elapsed_s: f64,
    /// Points a second the run is set to send (`None`: as fast as possible).
    pub rate: Option<f64>,
}

impl Snapshot {
    fn of(bar: &ProgressBar) -> Snapshot {
        // The total is an expectation (`WorkloadSpec::expected_points`): a run that sends more
        // is at 100%, not past it.
        let done = bar.position();
        Snapshot {
            done,
            total: bar.length().unwrap_or(0).max(done),
            elapsed_s: bar.elapsed().as_secs_f64(),
            rate: None,
        }
    }

    /// Share done, in percent (100 for an empty run).
    pub fn percent(&self) -> f64 {
        if self.total == 0 {
            100.0
        } else {
            100.0 * self.done as f64 / self.total as f64
        }
    }

    /// Points a second since the start.
    pub fn per_second(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.done as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    /// Seconds left: at the rate so far, and at a set rate no sooner than the schedule's end
    /// (a slow schedule waiting for its next point is not slower than it is, nor its first
    /// points, sent at once, faster); `None` before anything is done at no set rate.
    pub fn eta_s(&self) -> Option<f64> {
        let left = self.total.saturating_sub(self.done);
        if left == 0 {
            return Some(0.0);
        }
        let per_second = self.per_second();
        let so_far = (per_second > 0.0).then(|| left as f64 / per_second);
        let schedule = self.rate.filter(|r| *r > 0.0).map(|r| (self.total as f64 / r - self.elapsed_s).max(0.0));
        match (so_far, schedule) {
            // Behind the schedule, the rate so far says when; on it, the schedule does (no
            // run is ahead of it).
            (Some(so_far), Some(schedule)) => Some(so_far.max(schedule)),
            (so_far, schedule) => so_far.or(schedule),
        }
    }

    fn log(&self) {
        tracing::info!(
            done = self.done,
            total = self.total,
            percent = (self.percent() * 10.0).round() / 10.0,
            per_second = self.per_second().round() as u64,
            eta_s = self.eta_s().map(|s| s.round() as u64),
            "progress"
        );
    }
}

/// Hands `emit` the bar's progress every `every` (first after `every`) until the bar is
/// finished or every handle to it is dropped; returns within a fifth of a second of that.
pub fn watch(bar: &WeakProgressBar, every: Duration, mut emit: impl FnMut(Snapshot)) {
    let step = every.min(Duration::from_millis(200));
    let mut next = every;
    loop {
        std::thread::sleep(step);
        let Some(bar) = bar.upgrade() else { return };
        if bar.is_finished() {
            return;
        }
        if bar.elapsed() >= next {
            emit(Snapshot::of(&bar));
            next += every;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    #[test]
    fn snapshot_figures() {
        let s = Snapshot { done: 250, total: 1000, elapsed_s: 5.0, rate: None };
        assert_eq!((s.percent(), s.per_second(), s.eta_s()), (25.0, 50.0, Some(15.0)));
        let start = Snapshot { done: 0, total: 1000, elapsed_s: 0.0, rate: None };
        assert_eq!((start.percent(), start.per_second(), start.eta_s()), (0.0, 0.0, None));
        let empty = Snapshot { done: 0, total: 0, elapsed_s: 1.0, rate: None };
        assert_eq!((empty.percent(), empty.eta_s()), (100.0, Some(0.0)));
    }

    /// At a set rate the ETA keeps to the schedule: 10 points at 0.05 a second end at 200 s,
    /// whether the first went out at once or the run waits for its next; a run behind its
    /// schedule ends when its rate so far says.
    #[test]
    fn at_a_set_rate_the_eta_keeps_to_the_schedule() {
        let at = |done: u64, elapsed_s: f64, rate: f64| {
            Snapshot { done, total: 10, elapsed_s, rate: Some(rate) }.eta_s().map(|s| (s * 1000.0).round() / 1000.0)
        };
        // Sent at once, the first point's rate so far would say 0.009 s.
        assert_eq!(at(1, 0.001, 0.05), Some(199.999));
        assert_eq!(at(0, 0.5, 0.05), Some(199.5));
        // Waiting for the next: 171 s, then 179 s at the rate so far.
        assert_eq!(at(1, 19.0, 0.05), Some(181.0));
        assert_eq!(at(1, 19.9, 0.05), Some(180.1));
        // 1,000 a second asked, 4 done in 2 s: 4 s more at the rate so far.
        assert_eq!(at(4, 2.0, 1000.0), Some(3.0));
        assert_eq!(at(10, 300.0, 0.05), Some(0.0));
    }

    /// A hidden bar (as on a non-terminal stderr) is reported while it runs, and the watcher
    /// ends once the bar is finished.
    #[test]
    fn watch_reports_a_hidden_bar_until_it_finishes() {
        let bar = ProgressBar::hidden();
        bar.set_length(1000);
        bar.set_position(250);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (weak, seen2) = (bar.downgrade(), seen.clone());
        let watcher = std::thread::spawn(move || {
            watch(&weak, Duration::from_millis(20), |s| seen2.lock().expect("not poisoned").push(s))
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().expect("not poisoned").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        bar.finish();
        watcher.join().expect("the watcher ends");
        let seen = seen.lock().expect("not poisoned");
        let first = seen.first().expect("a report within 10 s");
        assert_eq!((first.done, first.total, first.percent()), (250, 1000, 25.0));
        assert!(first.elapsed_s >= 0.02, "reported after the first interval, not before: {first:?}");
    }

    /// A run that sends more points than its expected total reads 100%, not more.
    #[test]
    fn a_bar_past_its_total_is_done() {
        let bar = ProgressBar::hidden();
        bar.set_length(1000);
        bar.set_position(1003);
        let s = Snapshot::of(&bar);
        assert_eq!((s.done, s.total, s.percent(), s.eta_s()), (1003, 1003, 100.0, Some(0.0)));
    }

    #[test]
    fn watch_ends_when_the_bar_is_dropped() {
        let bar = ProgressBar::hidden();
        let weak = bar.downgrade();
        let watcher = std::thread::spawn(move || {
            let mut reports = 0;
            watch(&weak, Duration::from_secs(3600), |_| reports += 1);
            reports
        });
        drop(bar);
        assert_eq!(watcher.join().expect("the watcher ends"), 0);
    }
}
