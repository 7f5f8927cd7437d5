//! Keeping an error that repeats from flooding the log.

use std::time::{Duration, Instant};

/// How often an error that repeats unchanged is logged again by default ([`Quieter`]).
pub const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What two texts must share to be the same error: the text with each number standing on its
/// own (after a space or an opening parenthesis, and not followed by `.` or `:`, so not part of an
/// address) as `#`. librdkafka says how long each failed handshake took ("after 3ms in state
/// SSL_HANDSHAKE") and rustls the time it checked an expired certificate at: the same error
/// differed each time and was logged each time (QA58 F1, F2). librdkafka's own count of the
/// repeats it held back (", 3 identical error(s) suppressed") is left out too (QA59).
pub fn same_error_key(text: &str) -> std::borrow::Cow<'_, str> {
    let bytes = text.as_bytes();
    let standalone = |start: usize, end: usize| {
        (start == 0 || matches!(bytes[start - 1], b' ' | b'(' | b'\t' | b'\n' | b'='))
            && !matches!(bytes.get(end), Some(b'.' | b':'))
    };
    let mut out = String::new();
    let (mut copied, mut i) = (0, 0);
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if standalone(start, i) {
            out.push_str(&text[copied..start]);
            out.push('#');
            copied = i;
        }
    }
    if copied == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out.replace(LIBRDKAFKA_SUPPRESSED, ""))
}

/// librdkafka's count of the same errors it did not log, numbers masked.
const LIBRDKAFKA_SUPPRESSED: &str = ", # identical error(s) suppressed";

/// Keeps an error that repeats from flooding the log (an unreachable broker is one error every
/// few tens of milliseconds; an unreadable archive file one a roll-up pass): a text is logged
/// when it differs from the last one logged ([`same_error_key`]), or once its interval
/// ([`REPEAT_LOG_INTERVAL`] by default) has passed since it was, with the count of its repeats
/// not logged meanwhile.
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
        let text = same_error_key(text);
        match &mut self.last {
            Some((last, at)) if *last == text => {
                if now.duration_since(*at) < self.interval {
                    self.repeats += 1;
                    return None;
                }
                *at = now;
                Some(std::mem::take(&mut self.repeats))
            }
            _ => {
                self.last = Some((text.into_owned(), now));
                self.repeats = 0;
                Some(0)
            }
        }
    }
}

/// Most texts a [`QuieterByText`] remembers; past them it forgets the ones logged longest ago.
pub const MAX_TEXTS: usize = 1024;

/// A [`Quieter`] for each text ([`same_error_key`]): each is logged at its first time, then once
/// its interval has passed since it was, with the count of its repeats not logged meanwhile,
/// whatever other texts come between (a [`Quieter`] logs a text again whenever another came
/// between: refusals of two tables alternating logged every one, QA49 R3). Remembers at most
/// [`MAX_TEXTS`] texts.
#[derive(Debug)]
pub struct QuieterByText {
    interval: Duration,
    /// Each text: when it was last logged, and its repeats not logged since.
    texts: std::collections::HashMap<String, (Instant, u64)>,
}

impl Default for QuieterByText {
    fn default() -> Self {
        QuieterByText::every(REPEAT_LOG_INTERVAL)
    }
}

impl QuieterByText {
    /// A quieter that logs each text again once `interval` has passed since it was.
    pub fn every(interval: Duration) -> QuieterByText {
        QuieterByText { interval, texts: std::collections::HashMap::new() }
    }

    /// `Some(its repeats not logged since it last was)` when `text` is to be logged at `now`;
    /// `None` otherwise.
    pub fn admit(&mut self, text: &str, now: Instant) -> Option<u64> {
        let text = same_error_key(text);
        if let Some((at, repeats)) = self.texts.get_mut(&*text) {
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
        self.texts.insert(text.into_owned(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers standing alone are one; those of addresses, names and versions are not.
    #[test]
    fn errors_differing_in_a_duration_or_a_time_are_the_same() {
        let ssl = |ms: u32| {
            format!(
                "ssl://127.0.0.1:33302/bootstrap: error:0A000086:SSL routines::certificate verify failed (after \
                 {ms}ms in state SSL_HANDSHAKE)"
            )
        };
        assert_eq!(
            same_error_key(&ssl(3)),
            "ssl://127.0.0.1:33302/bootstrap: error:0A000086:SSL routines::certificate verify failed (after #ms in \
             state SSL_HANDSHAKE)"
        );
        assert_eq!(same_error_key(&ssl(3)), same_error_key(&ssl(18)));
        let held_back =
            "ssl://127.0.0.1:33302/bootstrap: error:0A000086:SSL routines::certificate verify failed (after \
                         2ms in state SSL_HANDSHAKE, 3 identical error(s) suppressed)";
        assert_eq!(same_error_key(held_back), same_error_key(&ssl(1)));
        let expired = |now: u64, ago: u64| {
            format!("certificate expired: verification time {now} (UNIX), but certificate is not valid after 1609459200 ({ago} seconds ago)")
        };
        assert_eq!(
            same_error_key(&expired(1796671157, 187211957)),
            "certificate expired: verification time # (UNIX), but certificate is not valid after # (# seconds ago)"
        );
        // Another broker, port or address is another error.
        assert_ne!(
            same_error_key("connect to 10.0.0.1:9092 failed"),
            same_error_key("connect to 10.0.0.2:9092 failed")
        );
        assert_ne!(same_error_key("broker 127.0.0.1:9092 down"), same_error_key("broker 127.0.0.1:9093 down"));
        assert_eq!(same_error_key("truck_12 on v2"), "truck_12 on v2");
        let mut q = Quieter::every(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(q.admit(&ssl(3), t0), Some(0));
        assert_eq!(q.admit(&ssl(18), t0 + Duration::from_secs(1)), None);
        assert_eq!(q.admit(&ssl(1), t0 + Duration::from_secs(61)), Some(1));
    }

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
