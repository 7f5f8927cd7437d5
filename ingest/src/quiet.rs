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

/// Most texts a [`QuieterByText`] remembers; past them it forgets the ones logged longest ago.
pub const MAX_TEXTS: usize = 1024;

/// A [`Quieter`] for each text: each is logged at its first time, then once its interval has
/// passed since it was, with the count of its repeats not logged meanwhile, whatever other texts
/// come between (a [`Quieter`] logs a text again whenever another came between: refusals of two
/// tables alternating logged every one, QA49 R3). Remembers at most [`MAX_TEXTS`] texts.
#[derive(Debug)]
pub struct QuieterByText {
    interval: Duration,
    /// Each text: when it was last logged, and its repeats not logged since.
    texts: std::collections::HashMap<String, (Instant, u64)>,
}

impl QuieterByText {
    /// A quieter that logs each text again once `interval` has passed since it was.
    pub fn every(interval: Duration) -> QuieterByText {
        QuieterByText { interval, texts: std::collections::HashMap::new() }
    }

    /// `Some(its repeats not logged since it last was)` when `text` is to be logged at `now`;
    /// `None` otherwise.
    pub fn admit(&mut self, text: &str, now: Instant) -> Option<u64> {
        if let Some((at, repeats)) = self.texts.get_mut(text) {
            if now.duration_since(*at) < self.interval {
                *repeats += 1;
                return None;
            }
            *at = now;
            return Some(std::mem::take(repeats));
        }
        if self.texts.len() >= MAX_TEXTS {
            // Forget the half logged longest ago (their repeats since are not said).
            let mut ats: Vec<Instant> = self.texts.values().map(|(at, _)| *at).collect();
            ats.sort_unstable();
            let cut = ats[ats.len() / 2];
            self.texts.retain(|_, (at, _)| *at > cut);
        }
        self.texts.insert(text.to_string(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_text_is_logged_once_an_interval_whatever_comes_between() {
        let mut q = QuieterByText::every(Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(q.admit("refused q.a", at(0)), Some(0));
        assert_eq!(q.admit("refused q.b", at(1)), Some(0));
        assert_eq!(q.admit("refused q.a", at(2)), None);
        assert_eq!(q.admit("refused q.b", at(3)), None);
        assert_eq!(q.admit("refused q.a", at(4)), None);
        assert_eq!(q.admit("refused q.a", at(60)), Some(2), "a minute after it was logged");
        assert_eq!(q.admit("refused q.b", at(61)), Some(1));
        assert_eq!(q.admit("refused q.b", at(62)), None);
    }

    #[test]
    fn past_its_texts_it_forgets_the_ones_logged_longest_ago() {
        let mut q = QuieterByText::every(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..MAX_TEXTS {
            assert_eq!(q.admit(&format!("t{i}"), t0 + Duration::from_millis(i as u64)), Some(0));
        }
        let later = t0 + Duration::from_secs(5);
        assert_eq!(q.admit("one more", later), Some(0));
        assert_eq!(q.texts.len(), MAX_TEXTS / 2);
        assert_eq!(q.admit("t0", later), Some(0), "forgotten");
        assert_eq!(q.admit(&format!("t{}", MAX_TEXTS - 1), later), None, "kept");
    }

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
