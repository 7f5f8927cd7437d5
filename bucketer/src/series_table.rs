//! The write buffer's table of series: per (table id, device id), a value, found by the
//! device id as an index rather than by a hash.
//!
//! The registry gives device ids in sequence from 0 ([`crate::Store::device_id`]), and a batch's
//! prepared groups come in (table, device) order. A hash map's bucket for each device is then a
//! cache miss at a random place, about 6% of the HTTP intake's samples (BENCHMARKS.md, "The
//! write buffer's series by device id"). Here the entries are a vector in the order first seen,
//! and per table an index of pages (512 device ids a page, allocated when one of their ids
//! comes) holds each device's place in it: a fleet sent in the same order each time reads both
//! in sequence. Ids from 2^26 on, which a registry counting from 0 reaches only past 67M
//! devices, are kept in a map; so the list of pages stays under 1 MiB a table. The write
//! buffer counts the index's memory as its own ([`SeriesTable::index_bytes`]).

use smallvec::SmallVec;

use crate::FastMap;

/// Device ids a page of the index covers.
const PAGE_IDS: usize = 1 << 9;
/// Device ids from here on are kept in the map.
const DENSE_IDS: u64 = 1 << 26;

/// A series: (table id, device id).
pub(crate) type Series = (u32, u64);

/// A page of the index: the places (plus one) of `PAGE_IDS` consecutive device ids.
type Page = Box<[u32; PAGE_IDS]>;

/// Values by series, kept in the order first inserted.
#[derive(Debug)]
pub(crate) struct SeriesTable<V> {
    entries: Vec<(Series, V)>,
    /// Per table id (few), the pages of the index: a device's place in `entries`, plus one
    /// (0: none).
    dense: Vec<(u32, Vec<Option<Page>>)>,
    /// Places of series whose device id is `DENSE_IDS` or more.
    sparse: FastMap<Series, u32>,
    /// The table found last, an index into `dense`: batches come table by table.
    last_table: usize,
    /// Bytes of the index's pages and page lists.
    index_bytes: usize,
}

impl<V> Default for SeriesTable<V> {
    fn default() -> Self {
        SeriesTable {
            entries: Vec::new(),
            dense: Vec::new(),
            sparse: FastMap::default(),
            last_table: 0,
            index_bytes: 0,
        }
    }
}

impl<V> SeriesTable<V> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Memory of the index by device id: a page of 2 KiB for each 512 ids with a series, and
    /// a pointer for each 512 ids up to the largest (at 10M devices, at most 40 MB a
    /// table). The write buffer counts it as its own.
    pub(crate) fn index_bytes(&self) -> usize {
        self.index_bytes
    }

    /// The place slot of a series in the index, its table and page made on the way; `None`
    /// for a device id kept in the map.
    fn slot(&mut self, (table, device): Series) -> Option<&mut u32> {
        if device >= DENSE_IDS {
            return None;
        }
        let t = match self.dense.get(self.last_table) {
            Some((id, _)) if *id == table => self.last_table,
            _ => match self.dense.iter().position(|(id, _)| *id == table) {
                Some(t) => t,
                None => {
                    self.dense.push((table, Vec::new()));
                    self.dense.len() - 1
                }
            },
        };
        self.last_table = t;
        let pages = &mut self.dense[t].1;
        let (page, at) = ((device as usize) / PAGE_IDS, (device as usize) % PAGE_IDS);
        if page >= pages.len() {
            self.index_bytes += (page + 1 - pages.len()) * std::mem::size_of::<Option<Page>>();
            pages.resize_with(page + 1, || None);
        }
        let page = match &mut pages[page] {
            Some(p) => p,
            slot @ None => {
                self.index_bytes += std::mem::size_of::<[u32; PAGE_IDS]>();
                slot.insert(Box::new([0; PAGE_IDS]))
            }
        };
        Some(&mut page[at])
    }

    /// The place of a series in `entries`.
    fn place(&self, (table, device): Series) -> Option<usize> {
        if device >= DENSE_IDS {
            return self.sparse.get(&(table, device)).map(|&i| i as usize);
        }
        let (_, pages) = self.dense.iter().find(|(id, _)| *id == table)?;
        let page = pages.get((device as usize) / PAGE_IDS)?.as_ref()?;
        page[(device as usize) % PAGE_IDS].checked_sub(1).map(|i| i as usize)
    }

    /// The value of a series, made by `make` if it has none (then also `true`).
    pub(crate) fn get_or_insert_with(&mut self, series: Series, make: impl FnOnce() -> V) -> (&mut V, bool) {
        let next = self.entries.len();
        let place = match self.slot(series) {
            Some(slot) if *slot > 0 => Some(*slot as usize - 1),
            Some(slot) => {
                *slot = u32::try_from(next + 1).expect("fewer than 2^32 buffered series");
                None
            }
            None => match self.sparse.entry(series) {
                std::collections::hash_map::Entry::Occupied(e) => Some(*e.get() as usize),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(u32::try_from(next).expect("fewer than 2^32 buffered series"));
                    None
                }
            },
        };
        match place {
            Some(i) => (&mut self.entries[i].1, false),
            None => {
                self.entries.push((series, make()));
                (&mut self.entries[next].1, true)
            }
        }
    }

    pub(crate) fn get(&self, series: &Series) -> Option<&V> {
        self.place(*series).map(|i| &self.entries[i].1)
    }

    pub(crate) fn contains_key(&self, series: &Series) -> bool {
        self.place(*series).is_some()
    }

    /// Sets the value of a series (the buffer only adds series it does not hold this way).
    pub(crate) fn insert(&mut self, series: Series, value: V) {
        let mut value = Some(value);
        let (held, _) = self.get_or_insert_with(series, || value.take().expect("made once"));
        if let Some(value) = value {
            *held = value;
        }
    }

    /// The series and their values, in the order first inserted.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Series, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Keeps the series for which `keep` returns true (given each value to change), in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Series, &mut V) -> bool) {
        let before = self.entries.len();
        self.entries.retain_mut(|(k, v)| keep(k, v));
        if self.entries.len() == before {
            return;
        }
        // Places moved: index them again.
        for (_, pages) in &mut self.dense {
            for page in pages.iter_mut().flatten() {
                page.fill(0);
            }
        }
        self.sparse.clear();
        for i in 0..self.entries.len() {
            let series = self.entries[i].0;
            let place = u32::try_from(i).expect("fewer than 2^32 buffered series");
            match self.slot(series) {
                Some(slot) => *slot = place + 1,
                None => {
                    self.sparse.insert(series, place);
                }
            }
        }
    }
}

/// A device's buffered hours: usually one, kept inline.
pub(crate) type Hours<T> = SmallVec<[T; 1]>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation against a `BTreeMap` doing the same, over dense and sparse ids, several
    /// tables, pages far apart, and retains that drop and keep.
    #[test]
    fn behaves_as_a_map() {
        use std::collections::BTreeMap;
        let mut table: SeriesTable<u64> = SeriesTable::default();
        let mut model: BTreeMap<Series, u64> = BTreeMap::new();
        let ids = [0, 1, 4095, 4096, 70_000, DENSE_IDS - 1, DENSE_IDS, DENSE_IDS + 5, u64::MAX];
        let mut order = Vec::new();
        for round in 0..3u64 {
            for &t in &[7u32, 3, 7] {
                for &d in &ids {
                    let (v, new) = table.get_or_insert_with((t, d), || 0);
                    *v += round + u64::from(t) + d % 1000;
                    let m = model.entry((t, d)).or_insert(0);
                    assert_eq!(new, *m == 0 && !order.contains(&(t, d)), "new flag of {:?}", (t, d));
                    if new {
                        order.push((t, d));
                    }
                    *m += round + u64::from(t) + d % 1000;
                }
            }
            // Drop every other series (by value parity), change the rest.
            table.retain(|_, v| {
                *v += 1;
                *v % 2 == 0
            });
            model.retain(|_, v| {
                *v += 1;
                *v % 2 == 0
            });
            order.retain(|k| model.contains_key(k));
            assert_eq!(table.len(), model.len());
            let seen: Vec<(Series, u64)> = table.iter().map(|(k, v)| (*k, *v)).collect();
            let expected: Vec<(Series, u64)> = order.iter().map(|k| (*k, model[k])).collect();
            assert_eq!(seen, expected, "round {round}: values in the order first inserted");
            for &t in &[7u32, 3, 9] {
                for &d in &ids {
                    assert_eq!(table.get(&(t, d)), model.get(&(t, d)), "get {:?}", (t, d));
                    assert_eq!(table.contains_key(&(t, d)), model.contains_key(&(t, d)));
                }
            }
        }
        // Index pages: tables 7 and 3 each have ids 0 and 1 (page 0), 4095 (page 7), 4096
        // (page 8), 70,000 (page 136) and 2^26 - 1 (page 2^17 - 1) in the index: five pages of
        // 2 KiB and 2^17 page slots a table. (Pages a retain empties stay.)
        assert_eq!(PAGE_IDS * 4, 2048);
        let slots = (1usize << 17) * std::mem::size_of::<Option<Page>>();
        assert_eq!(table.index_bytes(), 2 * (5 * 2048 + slots));
        // Inserting after retains finds the new places.
        table.insert((9, 12), 5);
        table.insert((9, 12), 6);
        assert_eq!(table.get(&(9, 12)), Some(&6), "a second insert replaces the value");
        assert_eq!(table.index_bytes(), 2 * (5 * 2048 + slots) + 2048 + 8);
        assert_eq!(table.iter().last().map(|(k, v)| (*k, *v)), Some(((9, 12), 6)));
        assert!(!table.is_empty());
        assert_eq!(SeriesTable::<u8>::default().get(&(1, 1)), None);
    }
}
