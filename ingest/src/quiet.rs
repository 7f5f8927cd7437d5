//! Keeping an error that repeats from flooding the log.

use std::time::{Duration, Instant};

/// How often an error that repeats unchanged is logged again by default ([`Quieter`]).
pub const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps an error that repeats from flooding the log (an unreachable broker is one error every
/// few tens of milliseconds; an unreadable archive file one a roll-up pass): a text is logged
/// when it differs from the last one logged, or once its interval ([`REPEAT_LOG_INTERVAL`] by
/// default) has passed since it was, with the count of its repeats not logged meanwhile.
#[derive(Debug)]
pub struct Quieter {
    interval: Duration,
    last: Option<(String, Instant)>,
    repeats: u64,
}

impl Default for Quieter {
    fn default() -> Self {
        Quieter::every(REPEAT_LOG_INTERVAL)
    }
}

impl Quieter {
    /// A quieter that logs a text repeated unchanged again once `interval` has passed.
    pub fn every(interval: Duration) -> Quieter {
        Quieter { interval, last: None, repeats: 0 }
    }

    /// `Some(its repeats not logged since it last was)` when `text` is to be logged at `now`;
    /// `None` otherwise.
    pub fn admit(&mut self, text: &str, now: Instant) -> Option<u64> {
        match &mut self.last {
            Some((last, at)) if last == text => {
                if now.duration_since(*at) < self.interval {
                    self.repeats += 1;
                    return None;
                }
                *at = now;
                Some(std::mem::take(&mut self.repeats))
            }
            _ => {
                self.last = Some((text.to_string(), now));
                self.repeats = 0;
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_repeated_is_logged_again_only_after_an_interval_with_its_count() {
        let mut q = Quieter::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(q.admit("all brokers down", at(0)), Some(0));
        assert_eq!(q.admit("all brokers down", at(1)), None);
        assert_eq!(q.admit("all brokers down", at(9)), None);
        assert_eq!(q.admit("all brokers down", at(10)), Some(2), "ten seconds after it was logged");
        assert_eq!(q.admit("all brokers down", at(11)), None);
        assert_eq!(q.admit("timed out", at(12)), Some(0), "another text at once");
        assert_eq!(q.admit("all brokers down", at(12)), Some(0));
    }

    #[test]
    fn the_interval_is_the_quieters() {
        let mut q = Quieter::every(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(q.admit("unreadable", t0), Some(0));
        assert_eq!(q.admit("unreadable", t0 + Duration::from_secs(59)), None);
        assert_eq!(q.admit("unreadable", t0 + Duration::from_secs(60)), Some(1));
    }
}
