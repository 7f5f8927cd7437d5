//! A hash map for maps that hold one entry a device without bound (the registry's names):
//! entries keep their key's hash, and the map is split into [`SHARDS`] tables by it.
//!
//! A `HashMap<Arc<str>, _>` grows by moving every entry into a table twice the size, all at
//! once, hashing every key again, and each key is a separate allocation: at 7.3M devices that
//! rehash took about a second of cache misses while the writer held its lock (a 10M-device
//! replay at the real-time rate saw end-to-end latency jump by that second). Here a resize
//! moves stored hashes and never reads a key, and it moves one shard's entries (a 64th, a few
//! MB that stay in cache) at a time: shard `i` doubles at `(64 + i) / 128` of its capacity, so
//! as the fleet grows the shards double one after another, not all in the same batch. One hash
//! of the key picks the shard and the slot. Inserting 10M names in batches of 10,000 (a scratch
//! measurement on this machine): the slowest batch took 1.69 s with a `HashMap`, 0.23 s sharded
//! with stored hashes, 0.04 s with the shards doubling apart.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, PoisonError};

use hashbrown::HashTable;

/// Tables of a [`ShardedMap`], picked by the top bits of the hash.
pub(crate) const SHARDS: usize = 64;

/// A map of `K` to `V`: entries `(hash, key, value)` in [`SHARDS`] tables.
#[derive(Debug, Clone)]
pub(crate) struct ShardedMap<K, V> {
    hasher: ahash::RandomState,
    shards: Box<[HashTable<(u64, K, V)>]>,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        ShardedMap { hasher: ahash::RandomState::new(), shards: (0..SHARDS).map(|_| HashTable::new()).collect() }
    }
}

/// The shard of `hash`: bits 40 to 45. Not the top bits: a `HashTable` finds a slot by the low
/// bits and filters the slots it probes by the top 7 (an entry is read only where those match),
/// so a shard whose entries shared their top bits would read about half of the entries it
/// probes (the onboarding of 10M devices ran 10% slower that way).
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // The trait's `hash_one`: ahash's inherent one took 50% longer a lookup here.
        let hash = BuildHasher::hash_one(&self.hasher, key);
        self.shards[shard_of(hash)].find(hash, |e| e.0 == hash && e.1.borrow() == key).map(|e| &e.2)
    }

    /// Inserts `value` under `key`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = BuildHasher::hash_one(&self.hasher, &key);
        let i = shard_of(hash);
        let shard = &mut self.shards[i];
        match shard.find_mut(hash, |e| e.0 == hash && e.1 == key) {
            Some(e) => Some(std::mem::replace(&mut e.2, value)),
            None => {
                grow_and_insert(shard, i, hash, key, value);
                None
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(HashTable::len).sum()
    }

    /// An empty map for about `len` entries: each shard is allocated at the size that inserting
    /// its share one at a time would have grown it to (the doubling points below included), so
    /// a load of `len` keys moves no entry and allocates no table it then drops.
    pub(crate) fn with_capacity(len: usize) -> Self {
        let share = len / SHARDS;
        // A shard's share varies by about its square root; room for four times that.
        let share = share + 4 * share.isqrt() + 16;
        let shards = (0..SHARDS).map(|i| HashTable::with_capacity(share * 2 * SHARDS / (SHARDS + i) + 1)).collect();
        ShardedMap { hasher: ahash::RandomState::new(), shards }
    }

    /// The map with each shard behind a lock, for several threads to fill at once.
    pub(crate) fn into_shared(self) -> SharedShards<K, V> {
        SharedShards { hasher: self.hasher, shards: self.shards.into_vec().into_iter().map(Mutex::new).collect() }
    }
}

/// A [`ShardedMap`] being filled by several threads: each shard behind its own lock (two
/// threads inserting contend on one of [`SHARDS`] locks rarely).
pub(crate) struct SharedShards<K, V> {
    hasher: ahash::RandomState,
    shards: Box<[Mutex<Shard<K, V>>]>,
}

/// One table of a [`ShardedMap`]: entries `(hash, key, value)`.
type Shard<K, V> = HashTable<(u64, K, V)>;

impl<K: Hash + Eq, V> SharedShards<K, V> {
    /// Inserts `value` under `key`, which the map must not hold yet (a load of keys known to
    /// be distinct): one probe instead of a lookup and then an insert.
    pub(crate) fn insert_new(&self, key: K, value: V) {
        let hash = BuildHasher::hash_one(&self.hasher, &key);
        let i = shard_of(hash);
        let mut shard = self.shards[i].lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(shard.find(hash, |e| e.0 == hash && e.1 == key).is_none(), "insert_new of a key held");
        grow_and_insert(&mut shard, i, hash, key, value);
    }

    /// The map, once the filling threads are done.
    pub(crate) fn into_map(self) -> ShardedMap<K, V> {
        let shards = self
            .shards
            .into_vec()
            .into_iter()
            .map(|s| s.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect();
        ShardedMap { hasher: self.hasher, shards }
    }
}

/// Inserts an entry the map does not hold into shard `i`. Shard i doubles at (64 + i) / 128 of
/// its capacity, not when full: the shards fill alike, and would otherwise all double within
/// the same few batches.
fn grow_and_insert<K, V>(shard: &mut HashTable<(u64, K, V)>, i: usize, hash: u64, key: K, value: V) {
    if shard.len() >= shard.capacity() * (SHARDS + i) / (2 * SHARDS) {
        shard.reserve(shard.capacity() + 1 - shard.len(), |e| e.0);
    }
    shard.insert_unique(hash, (hash, key, value), |e| e.0);
}

impl<K: Hash + Eq, V> Extend<(K, V)> for ShardedMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, entries: I) {
        for (k, v) in entries {
            self.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[test]
    fn behaves_as_one_map_and_spreads_its_entries() {
        assert_eq!((shard_of(0), shard_of(u64::MAX), shard_of(5 << 40 | 0xFFFF_FFFF)), (0, SHARDS - 1, 5));
        assert_eq!(shard_of(0xFE00_0000_0000_0000), 0, "the top 7 bits pick no shard");
        let mut map: ShardedMap<Arc<str>, u64> = ShardedMap::default();
        let mut oracle = HashMap::new();
        for i in 0..20_000u64 {
            let name: Arc<str> = format!("truck_{}", i % 15_000).into();
            assert_eq!(map.insert(name.clone(), i), oracle.insert(name, i), "insert {i}");
        }
        map.extend([("new".into(), 7), ("truck_3".into(), 8)]);
        map.insert("newer".into(), 9);
        assert_eq!(map.insert("newer".into(), 10), Some(9));
        oracle.insert("newer".into(), 10);
        oracle.extend([("new".into(), 7), ("truck_3".into(), 8)]);
        assert_eq!(map.len(), 15_002);
        for (k, v) in &oracle {
            assert_eq!(map.get(&**k), Some(v), "{k}");
        }
        assert_eq!(map.get("truck_15000"), None);
        // Every shard holds a share: 15,002 keys over 64 shards is 234 each on average.
        let sizes: Vec<usize> = map.shards.iter().map(HashTable::len).collect();
        assert!(sizes.iter().all(|&n| (100..400).contains(&n)), "{sizes:?}");
    }

    #[test]
    fn a_map_filled_by_several_threads_holds_every_entry_in_tables_sized_ahead() {
        let map: ShardedMap<Arc<str>, u64> = ShardedMap::with_capacity(30_000);
        let capacities: Vec<usize> = map.shards.iter().map(HashTable::capacity).collect();
        let shared = map.into_shared();
        std::thread::scope(|s| {
            for part in 0..3u64 {
                let shared = &shared;
                s.spawn(move || {
                    for i in (part * 10_000)..((part + 1) * 10_000) {
                        shared.insert_new(format!("truck_{i}").into(), i);
                    }
                });
            }
        });
        let mut map = shared.into_map();
        assert_eq!(map.len(), 30_000);
        for i in 0..30_000u64 {
            assert_eq!(map.get(format!("truck_{i}").as_str()), Some(&i), "truck_{i}");
        }
        assert_eq!(map.get("truck_30000"), None);
        // No shard grew while it was filled: each was allocated at its final size.
        let after: Vec<usize> = map.shards.iter().map(HashTable::capacity).collect();
        assert_eq!(after, capacities);
        // ... which is the size growing it one entry at a time gives (a map of the same keys),
        // or one doubling more where the room for a share's variance crossed a doubling point.
        let mut grown: ShardedMap<Arc<str>, u64> = ShardedMap { hasher: map.hasher.clone(), ..Default::default() };
        grown.extend((0..30_000u64).map(|i| (format!("truck_{i}").into(), i)));
        let grown: Vec<usize> = grown.shards.iter().map(HashTable::capacity).collect();
        for (i, (sized, grown)) in after.iter().zip(&grown).enumerate() {
            assert!(
                *sized == *grown || *sized == 2 * *grown + 1 || *sized == 2 * *grown,
                "shard {i}: {sized} against {grown}"
            );
        }
        // The map takes new keys and replaces values like any other.
        assert_eq!(map.insert("truck_5".into(), 50), Some(5));
        assert_eq!(map.insert("truck_30000".into(), 30_000), None);
        assert_eq!((map.len(), map.get("truck_5"), map.get("truck_30000")), (30_001, Some(&50), Some(&30_000)));
    }

    #[test]
    fn shards_double_at_staggered_fills() {
        let mut map: ShardedMap<u64, ()> = ShardedMap::default();
        // About 672 keys a shard: 3/4 of a 896-entry table. Shard 0 doubles at half of its
        // capacity (so it already has 1,792), shard 63 only when nearly full (still 896).
        map.extend((0..43_000u64).map(|i| (i, ())));
        assert_eq!(map.len(), 43_000);
        let (first, last) = (map.shards[0].capacity(), map.shards[SHARDS - 1].capacity());
        assert_eq!(first, 2 * last, "shard 0 holds {}, shard 63 {}", map.shards[0].len(), map.shards[63].len());
        for (i, shard) in map.shards.iter().enumerate() {
            assert!(shard.len() <= shard.capacity() * (SHARDS + i) / (2 * SHARDS) + 1, "shard {i}");
        }
    }
}
