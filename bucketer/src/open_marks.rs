//! The dirty marks of open hours that the store knows are stored and not yet read by the
//! roll-up stage: a write into such a device-hour needs no mark of its own.
//!
//! A device reporting once a minute writes its device-hour 60 times; each write used to put a
//! mark, one of the three RocksDB operations a reading costs when a batch holds one reading a
//! device (bucket operand, `latest` operand, mark). With this, the first write of a device-hour
//! marks it and the others find the mark there; the `latest` operand follows the mark
//! (`Store::latest` says why that is exact).
//!
//! # Why skipping is safe
//!
//! A roll-up pass reads the marks of the hours that end at or before its watermark, and its
//! watermark is at most the largest event time committed when the pass began (the allowed
//! lateness is never negative). That largest event time changes only under the writers' lock,
//! after a commit (stored with Release; a pass loads it with Acquire, so it sees what was
//! committed before the value it reads). A writer holds that lock from the check below until
//! its commit. So when an hour ends after the largest event time the writer sees there, no
//! pass has read the hour's marks, and none can before this write is committed: a mark
//! recorded here is still stored (only passes delete marks, and only the ones they read), and
//! the pass that reads it later reads the bucket with this write in it. Hours that have closed
//! are forgotten; a write into one (a late reading) marks it again with a new generation, as
//! before.
//!
//! A write-buffer flush skips marks the same way, beside the writers, against a copy of these
//! bitmaps taken at its hand-over, and adds the marks it wrote once it has committed them
//! (`crate::wbuf`, "Marks", says why that is sound too).
//!
//! Nothing here is persisted, but the marks themselves are: a store reads the work queue once
//! at open (`crate::rollups::scan_queue_at_open`) and records the marks of the hours open at
//! the persisted largest event time, which no pass has read (none has run yet). Without that,
//! the first write of each open device-hour after a restart marked it again and wrote its
//! `latest` operand again: at 10M devices, a tick's worth of operands more in the first minute.

use crate::FastMap;

/// Bitmap words (64 devices each) all open hours may take together: 64 MiB, 8 Mi devices an
/// hour for 64 tables, or 2 tables × 2 open hours of 134M devices. A device-hour past the
/// budget is marked on every write, as without this.
const MAX_WORDS: usize = 8 << 20;

/// Per open (table id, hour), a bitmap by registry device id (ids are dense, counted from 1) of
/// the device-hours whose mark is stored and unread.
#[derive(Debug, Default)]
pub(crate) struct OpenMarks {
    hours: FastMap<(u32, i32), Vec<u64>>,
    words: usize,
}

/// Whether `hour` ends after `max_event_ts`: no roll-up pass has read its marks yet.
fn is_open(hour: i32, max_event_ts: i64) -> bool {
    model::Hour(i64::from(hour)).end_ms() > max_event_ts
}

impl OpenMarks {
    /// Whether a write into `table · hour · device` needs no mark: the hour is open at
    /// `max_event_ts` (the largest event time committed, read under the writers' lock) and its
    /// mark is stored and unread.
    pub(crate) fn holds(&self, table: u32, hour: i32, device: u64, max_event_ts: i64) -> bool {
        is_open(hour, max_event_ts) && self.contains(table, hour, device)
    }

    /// After a commit, still under the writers' lock: forgets the hours that closed at
    /// `max_event_ts` (the largest event time committed now) and records the committed
    /// `marks` of the hours still open.
    pub(crate) fn committed(&mut self, marks: impl IntoIterator<Item = (u32, i32, u64)>, max_event_ts: i64) {
        self.forget_closed(max_event_ts);
        for (table, hour, device) in marks {
            self.record(table, hour, device, max_event_ts);
        }
    }

    /// A copy of the bitmaps of the hours open at `max_event_ts`, for a write-buffer flush to
    /// check its device-hours against beside the writers (`crate::wbuf`, "Marks"). A few MiB
    /// at 10M devices: one bit a device and open hour.
    pub(crate) fn snapshot(&self, max_event_ts: i64) -> OpenMarks {
        let hours: FastMap<(u32, i32), Vec<u64>> = self
            .hours
            .iter()
            .filter(|((_, hour), _)| is_open(*hour, max_event_ts))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let words = hours.values().map(Vec::len).sum();
        OpenMarks { hours, words }
    }

    /// Records the mark of `table · hour · device`, committed while `hour` was open at
    /// `max_event_ts`; nothing for a closed hour.
    pub(crate) fn record(&mut self, table: u32, hour: i32, device: u64, max_event_ts: i64) {
        if is_open(hour, max_event_ts) {
            self.insert(table, hour, device);
        }
    }

    /// Under the writers' lock, after a flush committed the marks recorded in `other`: forgets
    /// the hours closed at `max_event_ts` (the largest event time committed now) and adds
    /// `other`'s marks of the hours still open, a word at a time. No pass has read those: it
    /// would have needed a watermark past the hour's end.
    pub(crate) fn absorb(&mut self, other: OpenMarks, max_event_ts: i64) {
        self.forget_closed(max_event_ts);
        for (key, theirs) in other.hours {
            if !is_open(key.1, max_event_ts) {
                continue;
            }
            let ours = self.hours.entry(key).or_default();
            // Within the budget: the words past it are left out (marked again on write).
            let room = ours.len() + MAX_WORDS - self.words;
            if theirs.len() > ours.len() {
                let target = theirs.len().min(room);
                self.words += target - ours.len();
                ours.resize(target, 0);
            }
            for (o, t) in ours.iter_mut().zip(&theirs) {
                *o |= t;
            }
        }
    }

    /// Whether the mark of `table · hour · device` is recorded, open or not.
    fn contains(&self, table: u32, hour: i32, device: u64) -> bool {
        let Some(bits) = self.hours.get(&(table, hour)) else { return false };
        let (word, bit) = split(device);
        bits.get(word).is_some_and(|w| w >> bit & 1 == 1)
    }

    /// Records a mark that a write committed while its hour was open.
    fn insert(&mut self, table: u32, hour: i32, device: u64) {
        let (word, bit) = split(device);
        let bits = self.hours.entry((table, hour)).or_default();
        if word >= bits.len() {
            let grow = word + 1 - bits.len();
            if self.words + grow > MAX_WORDS {
                return;
            }
            // Grow by at least half again, so a fleet registering in id order does not
            // reallocate on every new word.
            let target = (word + 1).max(bits.len() + bits.len() / 2).min(bits.len() + MAX_WORDS - self.words);
            self.words += target - bits.len();
            bits.resize(target, 0);
        }
        bits[word] |= 1 << bit;
    }

    /// Forgets the hours that end at or before `max_event_ts`: the roll-up stage may read
    /// their marks from now on.
    fn forget_closed(&mut self, max_event_ts: i64) {
        let words = &mut self.words;
        self.hours.retain(|&(_, hour), bits| {
            let open = is_open(hour, max_event_ts);
            if !open {
                *words -= bits.len();
            }
            open
        });
    }
}

fn split(device: u64) -> (usize, u32) {
    (usize::try_from(device / 64).unwrap_or(usize::MAX), (device % 64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_marks_by_table_hour_and_device() {
        let mut m = OpenMarks::default();
        m.insert(1, 10, 0);
        m.insert(1, 10, 130);
        m.insert(2, 11, 63);
        assert!(m.contains(1, 10, 0));
        assert!(m.contains(1, 10, 130));
        assert!(m.contains(2, 11, 63));
        assert!(!m.contains(1, 10, 1));
        assert!(!m.contains(1, 10, 129));
        assert!(!m.contains(1, 10, 10_000));
        assert!(!m.contains(1, 11, 0));
        assert!(!m.contains(2, 10, 63));
        assert_eq!(m.words, 3 + 1);
    }

    #[test]
    fn forgets_hours_once_they_close() {
        let mut m = OpenMarks::default();
        m.insert(1, 10, 5);
        m.insert(1, 11, 5);
        let end_of_10 = model::Hour(10).end_ms();
        m.forget_closed(end_of_10 - 1);
        assert!(m.contains(1, 10, 5));
        m.forget_closed(end_of_10);
        assert!(!m.contains(1, 10, 5));
        assert!(m.contains(1, 11, 5));
        assert_eq!(m.words, 1);
    }

    #[test]
    fn a_snapshot_holds_the_open_hours_and_absorbing_adds_only_the_open_ones() {
        let mut m = OpenMarks::default();
        m.insert(1, 10, 5);
        m.insert(1, 11, 6);
        let end_of_10 = model::Hour(10).end_ms();
        let mut snap = m.snapshot(end_of_10);
        assert!(!snap.contains(1, 10, 5));
        assert!(snap.contains(1, 11, 6));
        assert_eq!(snap.words, 1);
        // A flush records what it marked: closed hours not at all.
        snap.record(1, 10, 7, end_of_10);
        snap.record(1, 11, 200, end_of_10);
        snap.record(2, 12, 1, end_of_10);
        assert!(!snap.contains(1, 10, 7));
        assert_eq!(snap.words, 4 + 1);
        // Meanwhile hour 11 closed too: only hour 12 is taken in, and hour 10 is forgotten.
        let end_of_11 = model::Hour(11).end_ms();
        m.absorb(snap, end_of_11);
        assert!(!m.contains(1, 10, 5));
        assert!(!m.contains(1, 11, 6));
        assert!(!m.contains(1, 11, 200));
        assert!(m.contains(2, 12, 1));
        assert!(!m.contains(2, 12, 0));
        assert_eq!(m.words, 1);
    }

    #[test]
    fn absorbing_keeps_to_the_budget() {
        let mut m = OpenMarks::default();
        m.insert(1, 10, 64 * (MAX_WORDS as u64 - 2));
        let mut other = OpenMarks::default();
        other.insert(1, 11, 0);
        other.insert(1, 11, 64 * 5);
        m.absorb(other, model::Hour(10).start_ms());
        assert_eq!(m.words, MAX_WORDS);
        assert!(m.contains(1, 11, 0));
        assert!(!m.contains(1, 11, 64 * 5));
    }

    #[test]
    fn past_its_budget_it_remembers_nothing_more() {
        let mut m = OpenMarks::default();
        m.insert(1, 10, 64 * (MAX_WORDS as u64 - 1));
        assert_eq!(m.words, MAX_WORDS);
        assert!(m.contains(1, 10, 64 * (MAX_WORDS as u64 - 1)));
        m.insert(1, 11, 0);
        assert!(!m.contains(1, 11, 0));
        assert_eq!(m.words, MAX_WORDS);
        // Closing the first hour frees its words for others.
        m.forget_closed(model::Hour(11).start_ms());
        m.insert(1, 11, 0);
        assert!(m.contains(1, 11, 0));
        assert_eq!(m.words, 1);
    }
}
