//! Device search: the devices of one table whose names start with a prefix, in name order.
//!
//! The registry's name index (`b'n' · name`, see [`crate::keys`]) is sorted by name, so a
//! prefix is one seek; each name found is kept if the table has a `latest` entry for it,
//! checked in batched multi-gets. The work is bounded twice: by the `limit` of the answer and
//! by [`MAX_EXAMINED_NAMES`] registry entries per call, so a prefix shared by many devices of
//! other tables cannot turn one request into a scan of the whole registry.

use rocksdb::{Direction, IteratorMode};

use crate::keys::{self, NAME_PREFIX};
use crate::store::{cf, CF_LATEST, CF_REGISTRY};
use crate::{db_err, registry_name_entry, Result, Store};

/// Most registry entries one [`Store::devices_with_data`] call examines.
pub const MAX_EXAMINED_NAMES: usize = 100_000;

/// Registry names checked against `latest` per multi-get.
const CHUNK: usize = 256;

/// The answer of [`Store::devices_with_data`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceListing {
    /// Device names, ascending byte order.
    pub devices: Vec<String>,
    /// `false` when more devices may match: the limit was reached, or the examination budget
    /// ran out first (a longer prefix narrows the search).
    pub complete: bool,
}

impl Store {
    /// The devices with at least one reading in `table` whose names start with `prefix`, at
    /// most `limit` of them, in name order. `None` when the table is unknown.
    pub fn devices_with_data(&self, table: &str, prefix: &str, limit: usize) -> Result<Option<DeviceListing>> {
        let Some(ti) = self.table(table) else {
            return Ok(None);
        };
        let start = keys::name_key(prefix);
        let iter = self.db.iterator_cf(cf(&self.db, CF_REGISTRY), IteratorMode::From(&start, Direction::Forward));
        let mut found: Vec<String> = Vec::new();
        let mut chunk: Vec<(String, u64)> = Vec::with_capacity(CHUNK);
        let mut budget_left = true;
        // One more than `limit` tells whether the listing is complete.
        for (examined, item) in iter.enumerate() {
            let (k, v) = item.map_err(db_err("scan registry"))?;
            if !k.starts_with(&start) {
                break;
            }
            if examined == MAX_EXAMINED_NAMES {
                budget_left = false;
                break;
            }
            debug_assert_eq!(k.first(), Some(&NAME_PREFIX));
            let (name, id) = registry_name_entry(&k, &v)?;
            chunk.push((name.to_string(), id));
            if chunk.len() == CHUNK {
                self.keep_with_data(ti.id, &mut chunk, &mut found)?;
                if found.len() > limit {
                    break;
                }
            }
        }
        self.keep_with_data(ti.id, &mut chunk, &mut found)?;
        let complete = budget_left && found.len() <= limit;
        found.truncate(limit);
        Ok(Some(DeviceListing { devices: found, complete }))
    }

    /// Moves the names of `chunk` whose device has a `latest` entry in `table` to `found`,
    /// keeping their order.
    fn keep_with_data(&self, table: u32, chunk: &mut Vec<(String, u64)>, found: &mut Vec<String>) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        // Device ids are not in name order; the multi-get wants its keys sorted.
        let mut wanted: Vec<(usize, [u8; keys::LATEST_KEY_LEN])> =
            chunk.iter().enumerate().map(|(i, (_, id))| (i, keys::latest_key(table, *id))).collect();
        wanted.sort_unstable_by_key(|w| w.1);
        // The write buffer first: a flush between the two reads then shows a device's readings
        // in both rather than in neither.
        let buffered: Vec<bool> = chunk.iter().map(|(_, id)| self.buffered_series(table, *id)).collect();
        let results = self.db.batched_multi_get_cf(cf(&self.db, CF_LATEST), wanted.iter().map(|(_, k)| k), true);
        let mut has_data = vec![false; chunk.len()];
        for ((pos, _), res) in wanted.iter().zip(results) {
            has_data[*pos] = res.map_err(db_err("multi-get latest"))?.is_some() || buffered[*pos];
        }
        found.extend(chunk.drain(..).zip(has_data).filter(|(_, keep)| *keep).map(|((name, _), _)| name));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::StoreConfig;
    use model::{DeviceReading, Reading};

    fn reading(table: &str, device: &str) -> DeviceReading {
        DeviceReading {
            table: table.into(),
            device: device.into(),
            reading: Reading::new(1_000, vec![("x".into(), 1.0)]),
        }
    }

    #[test]
    fn lists_devices_of_one_table_by_prefix_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        // Registered out of name order, across two tables; `pump_1` is only in `other`.
        let mut batch = Vec::new();
        for d in ["truck_9", "truck_10", "pump_1", "truck_1", "truck_100", "tractor"] {
            batch.push(reading(if d == "pump_1" { "other" } else { "fleet" }, d));
        }
        batch.push(reading("other", "truck_1"));
        store.write(batch, &[]).unwrap();

        let list = |table: &str, prefix: &str, limit: usize| store.devices_with_data(table, prefix, limit).unwrap();
        let all = DeviceListing {
            devices: vec!["tractor".into(), "truck_1".into(), "truck_10".into(), "truck_100".into(), "truck_9".into()],
            complete: true,
        };
        assert_eq!(list("fleet", "", 100), Some(all.clone()));
        assert_eq!(list("fleet", "", 5), Some(all));
        assert_eq!(
            list("fleet", "truck_1", 100),
            Some(DeviceListing {
                devices: vec!["truck_1".into(), "truck_10".into(), "truck_100".into()],
                complete: true
            })
        );
        assert_eq!(
            list("fleet", "truck_1", 2),
            Some(DeviceListing { devices: vec!["truck_1".into(), "truck_10".into()], complete: false })
        );
        assert_eq!(
            list("other", "", 100),
            Some(DeviceListing { devices: vec!["pump_1".into(), "truck_1".into()], complete: true })
        );
        assert_eq!(list("fleet", "pump", 100), Some(DeviceListing { devices: vec![], complete: true }));
        assert_eq!(list("fleet", "zzz", 100), Some(DeviceListing { devices: vec![], complete: true }));
        assert_eq!(list("nope", "", 100), None);
    }

    #[test]
    fn listing_spans_many_multi_get_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        // 1,000 devices, every third one in table `a`, the others in `b`.
        let batch: Vec<DeviceReading> =
            (0..1000).map(|i| reading(if i % 3 == 0 { "a" } else { "b" }, &format!("d{i:04}"))).collect();
        store.write(batch, &[]).unwrap();
        let expected: Vec<String> = (0..1000).filter(|i| i % 3 == 0).map(|i| format!("d{i:04}")).collect();
        let got = store.devices_with_data("a", "d", 10_000).unwrap().unwrap();
        assert_eq!(got, DeviceListing { devices: expected.clone(), complete: true });
        let got = store.devices_with_data("a", "d", 300).unwrap().unwrap();
        assert_eq!(got, DeviceListing { devices: expected[..300].to_vec(), complete: false });
        let got = store.devices_with_data("a", "d05", 10_000).unwrap().unwrap();
        let d05: Vec<String> = expected.iter().filter(|d| d.starts_with("d05")).cloned().collect();
        assert_eq!(d05.len(), 33);
        assert_eq!(got, DeviceListing { devices: d05, complete: true });
    }
}
