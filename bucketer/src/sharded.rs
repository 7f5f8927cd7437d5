//! The registry's map of device names to ids ([`NameMap`]): one entry a device without bound,
//! 10M and more, looked up once a reading on the write path.
//!
//! - **Names inline, stored hashes.** A slot holds the name's hash, the id and the name itself
//!   (up to 24 bytes inline, [`CompactString`]; longer names on the heap). A lookup that hits
//!   reads one slot, where a `HashMap<Arc<str>, u64>` read a control byte, an entry and the
//!   name's own allocation: three cache misses a reading at 10M devices, which made the lookup
//!   about a third of the writer thread's time (BENCHMARKS.md). Loading the registry allocates
//!   no name.
//! - **Batched lookups with prefetching** ([`NameMap::get_many`]): the hashes of a write's names
//!   first, then each name's slot fetched from memory [`PREFETCH_AHEAD`] names before it is
//!   compared, so the misses of a write overlap instead of following one another.
//! - **Shards.** The map is split into [`SHARDS`] open-addressing tables (linear probing) by the
//!   hash. A `HashMap` grows by moving every entry into a table twice the size, all at once: at
//!   7.3M devices that rehash took about a second while the writer held its lock. Here a resize
//!   moves one shard's slots (a 64th) by their stored hashes and reads no name, and shard `i`
//!   doubles at `(128 + i) / 256` of its slots (1/2 to nearly 3/4), so as the fleet grows the
//!   shards double one after another, not in the same write.
//!
//! Nothing is ever removed (a device's id is for good), so a probe ends at the first empty
//! slot.

use std::sync::{Mutex, PoisonError};

use compact_str::CompactString;

/// Tables of a [`NameMap`], picked by bits 40 to 45 of the hash.
pub(crate) const SHARDS: usize = 64;

/// How many names ahead of the one it compares [`NameMap::get_many`] fetches a slot: enough
/// misses in flight to cover the memory's latency, few enough that the fetched slots are
/// still in cache when compared (a scratch measurement at 10M names, medians of 3: 16 ahead
/// took 58 ns a lookup, against 91 ns without prefetching and 182 ns for the hashbrown map of
/// `Arc<str>` this replaced; BENCHMARKS.md).
const PREFETCH_AHEAD: usize = 16;

/// The slots a shard starts with.
const MIN_SLOTS: usize = 16;

/// The top bit of every stored hash: a slot whose hash is 0 is empty.
const OCCUPIED: u64 = 1 << 63;

/// One slot of a shard: empty while `hash` is 0.
#[derive(Debug, Clone, Default)]
struct Slot {
    hash: u64,
    id: u64,
    name: CompactString,
}

/// One open-addressing table: a power of two of slots (or none yet).
#[derive(Debug, Clone, Default)]
struct Shard {
    slots: Box<[Slot]>,
    len: usize,
}

impl Shard {
    /// The slot `hash` probes first, if the shard has slots.
    fn first_slot(&self, hash: u64) -> Option<&Slot> {
        self.slots.get(hash as usize & self.slots.len().wrapping_sub(1))
    }

    /// The index of the slot holding `name` (of `hash`), if the shard holds it.
    fn position(&self, hash: u64, name: &str) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        loop {
            let slot = &self.slots[i];
            if slot.hash == hash && slot.name == name {
                return Some(i);
            }
            if slot.hash == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    fn find(&self, hash: u64, name: &str) -> Option<u64> {
        self.position(hash, name).map(|i| self.slots[i].id)
    }

    /// Inserts a name the shard (number `i`) does not hold, doubling it first if this entry
    /// would take it past its limit.
    fn insert_new(&mut self, i: usize, hash: u64, name: CompactString, id: u64) {
        if self.len + 1 > limit(self.slots.len(), i) {
            self.resize((self.slots.len() * 2).max(MIN_SLOTS));
        }
        self.place(Slot { hash, id, name });
        self.len += 1;
    }

    /// Puts `slot` in the first empty slot from its hash's; there is one (the load stays
    /// under 3/4).
    fn place(&mut self, slot: Slot) {
        let mask = self.slots.len() - 1;
        let mut i = slot.hash as usize & mask;
        while self.slots[i].hash != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot;
    }

    /// Moves every entry into `slots` new slots by its stored hash.
    fn resize(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); slots].into_boxed_slice());
        for slot in old.into_vec() {
            if slot.hash != 0 {
                self.place(slot);
            }
        }
    }
}

/// The entries shard `i` of `slots` slots holds at most: `(128 + i) / 256` of them.
fn limit(slots: usize, i: usize) -> usize {
    slots * (2 * SHARDS + i) / (4 * SHARDS)
}

/// The slots shard `i` needs to hold `len` entries without doubling: what inserting them one at
/// a time would have grown it to.
fn slots_for(len: usize, i: usize) -> usize {
    let mut slots = if len == 0 { 0 } else { MIN_SLOTS };
    while len > limit(slots, i) {
        slots *= 2;
    }
    slots
}

/// The hash a map keyed by `hasher` stores for `name` (never 0: [`OCCUPIED`]).
fn hash_of(hasher: &ahash::RandomState, name: &str) -> u64 {
    std::hash::BuildHasher::hash_one(hasher, name) | OCCUPIED
}

/// The shard of `hash`: bits 40 to 45, apart from the low bits that pick the slot.
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

/// Asks the processor to fetch `slot` into its cache (both lines, if it straddles two); a
/// no-op on processors without the instruction here.
#[inline]
#[allow(unsafe_code)]
fn prefetch(slot: &Slot) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let first = std::ptr::from_ref(slot).cast::<i8>();
        let last = first.wrapping_add(size_of::<Slot>() - 1);
        // SAFETY: the instruction is SSE's, which every x86-64 processor has; a prefetch is a
        // hint that reads nothing the program sees and never faults, and both addresses are
        // within `slot` anyway.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(first);
            _mm_prefetch::<_MM_HINT_T0>(last);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// Device names → registry ids (module docs).
#[derive(Debug, Clone)]
pub(crate) struct NameMap {
    hasher: ahash::RandomState,
    shards: Box<[Shard]>,
}

impl Default for NameMap {
    fn default() -> Self {
        NameMap { hasher: ahash::RandomState::new(), shards: (0..SHARDS).map(|_| Shard::default()).collect() }
    }
}

impl NameMap {
    fn hash(&self, name: &str) -> u64 {
        hash_of(&self.hasher, name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<u64> {
        let hash = self.hash(name);
        self.shards[shard_of(hash)].find(hash, name)
    }

    /// Looks up `names` into `ids` (cleared first), in order, `hashes` being scratch room: their
    /// hashes first, then each name's first slot fetched [`PREFETCH_AHEAD`] names before it is
    /// compared. The same as [`NameMap::get`] on each, with the misses overlapping.
    pub(crate) fn get_many<'a, I>(&self, names: I, hashes: &mut Vec<u64>, ids: &mut Vec<Option<u64>>)
    where
        I: Iterator<Item = &'a str> + Clone,
    {
        hashes.clear();
        hashes.extend(names.clone().map(|name| self.hash(name)));
        let fetch = |hash: u64| {
            if let Some(slot) = self.shards[shard_of(hash)].first_slot(hash) {
                prefetch(slot);
            }
        };
        hashes.iter().take(PREFETCH_AHEAD).for_each(|&hash| fetch(hash));
        ids.clear();
        for (i, name) in names.enumerate() {
            if let Some(&ahead) = hashes.get(i + PREFETCH_AHEAD) {
                fetch(ahead);
            }
            let hash = hashes[i];
            ids.push(self.shards[shard_of(hash)].find(hash, name));
        }
    }

    /// Inserts `id` under `name`; returns the id it replaced.
    pub(crate) fn insert(&mut self, name: &str, id: u64) -> Option<u64> {
        let hash = self.hash(name);
        let i = shard_of(hash);
        let shard = &mut self.shards[i];
        match shard.position(hash, name) {
            Some(at) => Some(std::mem::replace(&mut shard.slots[at].id, id)),
            None => {
                shard.insert_new(i, hash, CompactString::from(name), id);
                None
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len).sum()
    }

    /// An empty map for about `len` entries: each shard is allocated at the size that inserting
    /// its share one at a time would have grown it to (its doubling point included), so a load
    /// of `len` names moves no entry and allocates no table it then drops.
    pub(crate) fn with_capacity(len: usize) -> Self {
        let share = len / SHARDS;
        // A shard's share varies by about its square root; room for four times that.
        let share = share + 4 * share.isqrt() + 16;
        let shards = (0..SHARDS)
            .map(|i| Shard { slots: vec![Slot::default(); slots_for(share, i)].into_boxed_slice(), len: 0 })
            .collect();
        NameMap { hasher: ahash::RandomState::new(), shards }
    }

    /// The map with each shard behind a lock, for several threads to fill at once.
    pub(crate) fn into_shared(self) -> SharedShards {
        SharedShards { hasher: self.hasher, shards: self.shards.into_vec().into_iter().map(Mutex::new).collect() }
    }
}

/// A [`NameMap`] being filled by several threads: each shard behind its own lock (two threads
/// inserting contend on one of [`SHARDS`] locks rarely).
pub(crate) struct SharedShards {
    hasher: ahash::RandomState,
    shards: Box<[Mutex<Shard>]>,
}

impl SharedShards {
    /// Inserts `id` under `name`, which the map must not hold yet (a load of names known to be
    /// distinct): one probe instead of a lookup and then an insert.
    pub(crate) fn insert_new(&self, name: &str, id: u64) {
        let hash = hash_of(&self.hasher, name);
        let i = shard_of(hash);
        let mut shard = self.shards[i].lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(shard.find(hash, name).is_none(), "insert_new of a name held");
        shard.insert_new(i, hash, CompactString::from(name), id);
    }

    /// The map, once the filling threads are done.
    pub(crate) fn into_map(self) -> NameMap {
        let shards = self
            .shards
            .into_vec()
            .into_iter()
            .map(|s| s.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect();
        NameMap { hasher: self.hasher, shards }
    }
}

impl<K: AsRef<str>> Extend<(K, u64)> for NameMap {
    fn extend<I: IntoIterator<Item = (K, u64)>>(&mut self, entries: I) {
        for (name, id) in entries {
            self.insert(name.as_ref(), id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_as_one_map_and_spreads_its_entries() {
        assert_eq!((shard_of(0), shard_of(u64::MAX), shard_of(5 << 40 | 0xFFFF_FFFF)), (0, SHARDS - 1, 5));
        let mut map = NameMap::default();
        assert_eq!((map.get("truck_0"), map.len()), (None, 0));
        let mut oracle = HashMap::new();
        for i in 0..20_000u64 {
            let name = format!("truck_{}", i % 15_000);
            assert_eq!(map.insert(&name, i), oracle.insert(name, i), "insert {i}");
        }
        // Names past the 24 bytes kept inline, and the empty name.
        let long = "a-device-name-longer-than-twenty-four-bytes";
        map.extend([("new", 7), ("truck_3", 8), (long, 11), ("", 12)]);
        map.insert("newer", 9);
        assert_eq!(map.insert("newer", 10), Some(9));
        assert_eq!(map.insert(long, 13), Some(11));
        oracle.insert("newer".into(), 10);
        oracle.extend([("new".into(), 7), ("truck_3".into(), 8), (long.into(), 13), (String::new(), 12)]);
        assert_eq!(map.len(), 15_004);
        for (k, v) in &oracle {
            assert_eq!(map.get(k), Some(*v), "{k}");
        }
        assert_eq!(map.get("truck_15000"), None);
        assert_eq!(map.get("a-device-name-longer-than-twenty-four-bytez"), None);
        // Every shard holds a share: 15,004 keys over 64 shards is 234 each on average.
        let sizes: Vec<usize> = map.shards.iter().map(|s| s.len).collect();
        assert!(sizes.iter().all(|&n| (100..400).contains(&n)), "{sizes:?}");
        assert!(map.shards.iter().all(|s| s.slots.iter().filter(|slot| slot.hash != 0).count() == s.len));
    }

    #[test]
    fn many_names_looked_up_at_once_find_what_one_at_a_time_does() {
        let mut map = NameMap::default();
        map.extend((0..5_000u64).map(|i| (format!("truck_{i}"), i * 3)));
        let long = "x".repeat(40);
        map.insert(&long, 1);
        // Known and unknown names, repeated, in a mixed order, more than `PREFETCH_AHEAD` and
        // fewer.
        let names: Vec<String> = (0..7_000u64)
            .map(|i| format!("truck_{}", i * 7_919 % 6_000))
            .chain([long.clone(), "x".repeat(39), String::new()])
            .collect();
        let (mut hashes, mut ids) = (vec![1, 2, 3], vec![Some(9)]);
        for n in [0, 1, PREFETCH_AHEAD, PREFETCH_AHEAD + 1, names.len()] {
            let names = &names[names.len() - n..];
            map.get_many(names.iter().map(String::as_str), &mut hashes, &mut ids);
            let expected: Vec<Option<u64>> = names
                .iter()
                .map(|name| match name.strip_prefix("truck_").map(|i| i.parse::<u64>().unwrap()) {
                    Some(i) if i < 5_000 => Some(i * 3),
                    _ if *name == long => Some(1),
                    _ => None,
                })
                .collect();
            assert_eq!(ids, expected, "{n} names");
            assert_eq!(hashes.len(), n);
        }
        // On a map with no slots at all.
        NameMap::default().get_many(["a", "b"].into_iter(), &mut hashes, &mut ids);
        assert_eq!(ids, [None, None]);
    }

    #[test]
    fn a_map_filled_by_several_threads_holds_every_entry_in_tables_sized_ahead() {
        let map = NameMap::with_capacity(30_000);
        let sized: Vec<usize> = map.shards.iter().map(|s| s.slots.len()).collect();
        let shared = map.into_shared();
        std::thread::scope(|s| {
            for part in 0..3u64 {
                let shared = &shared;
                s.spawn(move || {
                    for i in (part * 10_000)..((part + 1) * 10_000) {
                        shared.insert_new(&format!("truck_{i}"), i);
                    }
                });
            }
        });
        let mut map = shared.into_map();
        assert_eq!(map.len(), 30_000);
        for i in 0..30_000u64 {
            assert_eq!(map.get(&format!("truck_{i}")), Some(i), "truck_{i}");
        }
        assert_eq!(map.get("truck_30000"), None);
        // No shard grew while it was filled: each was allocated at its final size.
        let after: Vec<usize> = map.shards.iter().map(|s| s.slots.len()).collect();
        assert_eq!(after, sized);
        // ... which is the size growing it one entry at a time gives (a map of the same keys),
        // or one doubling more where the room for a share's variance crossed a doubling point.
        let mut grown = NameMap { hasher: map.hasher.clone(), ..Default::default() };
        grown.extend((0..30_000u64).map(|i| (format!("truck_{i}"), i)));
        let grown: Vec<usize> = grown.shards.iter().map(|s| s.slots.len()).collect();
        for (i, (sized, grown)) in after.iter().zip(&grown).enumerate() {
            assert!(*sized == *grown || *sized == 2 * *grown, "shard {i}: {sized} against {grown}");
        }
        // The map takes new keys and replaces values like any other.
        assert_eq!(map.insert("truck_5", 50), Some(5));
        assert_eq!(map.insert("truck_30000", 30_000), None);
        assert_eq!((map.len(), map.get("truck_5"), map.get("truck_30000")), (30_001, Some(50), Some(30_000)));
    }

    #[test]
    fn shards_double_at_staggered_fills() {
        assert_eq!((limit(1_024, 0), limit(1_024, SHARDS - 1)), (512, 764));
        assert_eq!(
            (slots_for(0, 0), slots_for(8, 0), slots_for(9, 0), slots_for(11, SHARDS - 1), slots_for(12, SHARDS - 1)),
            (0, 16, 32, 16, 32)
        );
        let mut map = NameMap::default();
        // About 625 names a shard: shard 0 (doubling at half its slots) has 2,048 slots by then,
        // shard 63 (doubling at 3/4 less a little) still 1,024.
        map.extend((0..40_000u64).map(|i| (format!("truck_{i}"), i)));
        assert_eq!(map.len(), 40_000);
        let (first, last) = (&map.shards[0], &map.shards[SHARDS - 1]);
        assert_eq!((first.slots.len(), last.slots.len()), (2_048, 1_024), "{} and {} names", first.len, last.len);
        for (i, shard) in map.shards.iter().enumerate() {
            assert!(shard.len <= limit(shard.slots.len(), i), "shard {i}");
            assert!(shard.len > limit(shard.slots.len() / 2, i), "shard {i} doubled before its limit");
        }
    }
}
