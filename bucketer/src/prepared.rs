//! Readings prepared on the producer's thread for the write buffer ([`model::PrepareRows`]).
//!
//! The store has one writer: every batch is committed on the bucketer's thread, under the
//! writers' lock. With the write buffer on, what that thread did for each reading — the
//! table's and the device's ids by name, the schema check, the sort into device-hours, the
//! rows of the `wbuf` record — needs none of the lock: it reads only ids and schemas, and those
//! only grow (a table's or a device's id never changes; a schema only gains fields, so a
//! reading it admitted, a later version admits). So a source that decoded a batch does that
//! part itself, on its own thread, as it decodes each reading, and sends the rows instead
//! ([`model::Prepared`]); the writer checks device-hours for outliers, writes the record and
//! appends to the buffer.
//!
//! A source's readings are prepared up to the first the store cannot prepare: of a table or a
//! device not stored yet, of fields its table's schema does not admit as they are, or of a
//! time outside the key range. That one and every later one of the batch go to the writer as
//! readings (the writer registers names, changes schemas and writes dead letters in the same
//! WriteBatch as the readings); prepared readings are stored first, so arrival order holds.
//!
//! Prepared readings are committed through the buffer. A commit that finds the buffer off
//! (bypassed since) takes them back as readings ([`rows::to_readings`]) and writes them
//! directly, as any others.

use std::ops::Range;
use std::sync::Arc;

use model::{FieldName, FieldType, Hour, PartitionSize, Reading, Value};

use crate::rows::{self, RowWriter};
use crate::{keys, read, FastMap, Store};

/// One device-hour of a prepared batch: its readings (sorted by time, no time twice) are rows
/// `at` of [`PreparedRows::rows`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Group {
    pub(crate) table: u32,
    pub(crate) device: u64,
    pub(crate) hour: i32,
    /// The table's partition size, and the partition the hour is in.
    pub(crate) partition: (PartitionSize, i32),
    pub(crate) n: usize,
    /// Time of the newest reading.
    pub(crate) newest: i64,
    pub(crate) at: Range<usize>,
}

/// A batch's readings as rows, by device-hour in (table, device, hour) order.
#[derive(Debug)]
pub(crate) struct PreparedRows {
    /// Readings received, counting each of two at one time of one device (as the writer's
    /// summary of unprepared readings does); the groups hold the later one only.
    pub(crate) readings: usize,
    pub(crate) groups: Vec<Group>,
    pub(crate) rows: Vec<u8>,
    /// The (name, type) pairs the rows use, with their ids ([`rows::FieldIds`]).
    pub(crate) fields: Vec<(FieldName, FieldType, u32)>,
}

impl PreparedRows {
    /// The readings of device-hour `g`, as a direct write takes them.
    pub(crate) fn readings(&self, g: &Group, names: &[(FieldName, FieldType)]) -> crate::Result<Vec<Reading>> {
        let mut out = Vec::with_capacity(g.n);
        rows::to_readings(&self.rows[g.at.clone()], names, &mut out).map_err(crate::wbuf::corrupt)?;
        Ok(out)
    }
}

/// A source's memo of device ids by the `Arc` its decoder names each device by (the one its
/// memory of series keys holds), looked at before the registry (which hashes and compares the
/// name). Sources name their devices in the same order batch after batch, so the devices are
/// kept in the order first seen and the one after the device found last is compared first: the
/// memo is then read in order, not at a random slot (a random slot of a table indexed by the
/// address cost a cache miss each device, half of the preparation's own time). The `Arc`s are
/// held, so an address is not reused for another name while noted.
#[derive(Debug)]
struct DeviceMemo {
    /// The store the ids are of ([`Store::instance`]).
    store: u64,
    /// Devices and their ids, in the order first seen.
    list: Vec<(Arc<str>, u64)>,
    /// Positions in `list` by the `Arc`'s address.
    by_address: FastMap<usize, u32>,
    /// The position found or noted last.
    last: usize,
    /// A builder's vectors of readings taken and of rows, emptied, kept for the source's next
    /// batch: sized by the batches before, they neither grow nor take fresh memory pages.
    spare: (Vec<Taken>, Vec<u8>),
}

/// Devices a [`DeviceMemo`] holds at most; past it, it starts over.
const MEMO_DEVICES: usize = 1 << 20;

/// The most bytes of [`DeviceMemo::spare`] a memo keeps: a builder that grew past it (a body
/// far larger than usual) gives its vectors back to the allocator.
const SPARE_BYTES: usize = 16 << 20;

impl DeviceMemo {
    fn new(store: u64) -> DeviceMemo {
        DeviceMemo { store, list: Vec::new(), by_address: FastMap::default(), last: 0, spare: (Vec::new(), Vec::new()) }
    }

    fn address(device: &Arc<str>) -> usize {
        Arc::as_ptr(device).cast::<u8>() as usize
    }

    /// The id of `device` as noted, if it is this very `Arc`.
    fn get(&mut self, device: &Arc<str>) -> Option<u64> {
        // A device's lines often come in a run (one a measurement).
        if let Some((d, id)) = self.list.get(self.last) {
            if Arc::ptr_eq(d, device) {
                return Some(*id);
            }
        }
        let next = self.last + 1;
        if let Some((d, id)) = self.list.get(next) {
            if Arc::ptr_eq(d, device) {
                self.last = next;
                return Some(*id);
            }
        }
        let at = *self.by_address.get(&Self::address(device))? as usize;
        self.last = at;
        Some(self.list[at].1)
    }

    fn note(&mut self, device: &Arc<str>, id: u64) {
        if self.list.len() >= MEMO_DEVICES {
            self.list.clear();
            self.by_address.clear();
        }
        self.last = self.list.len();
        self.by_address.insert(Self::address(device), self.last as u32);
        self.list.push((Arc::clone(device), id));
    }

    /// Keeps a builder's emptied vectors for the next batch, unless they are over [`SPARE_BYTES`].
    fn keep_spare(&mut self, taken: Vec<Taken>, rows: Vec<u8>) {
        debug_assert!(taken.is_empty() && rows.is_empty());
        if taken.capacity() * std::mem::size_of::<Taken>() + rows.capacity() <= SPARE_BYTES {
            self.spare = (taken, rows);
        }
    }

    /// The memo of `store` in a source's `memo`, made (replacing one of another store) if it
    /// holds none.
    fn of<'m>(store: &Store, memo: &'m mut model::PrepareMemo) -> &'m mut DeviceMemo {
        let mine =
            memo.0.as_mut().and_then(|m| m.downcast_mut::<DeviceMemo>()).is_some_and(|m| m.store == store.instance);
        if !mine {
            memo.0 = Some(Box::new(DeviceMemo::new(store.instance)));
        }
        memo.0.as_mut().and_then(|m| m.downcast_mut::<DeviceMemo>()).expect("a device memo")
    }
}

impl model::PrepareBatch for Store {
    fn rows<'a>(&'a self, memo: &'a mut model::PrepareMemo) -> Option<Box<dyn model::PrepareRows + 'a>> {
        self.cfg.write_buffer.as_ref()?;
        let devices = DeviceMemo::of(self, memo);
        let (taken, rows) = std::mem::take(&mut devices.spare);
        Some(Box::new(RowsBuilder {
            store: self,
            devices,
            tables: Vec::new(),
            layouts: Vec::new(),
            next_layout: 0,
            writer: RowWriter::default(),
            taken,
            rows,
        }))
    }
}

/// A batch prepared reading by reading ([`model::PrepareRows`]) into [`PreparedRows`]: each
/// reading's row is written as it comes, with its device-hour; [`model::PrepareRows::finish`]
/// puts the rows in device-hour order, keeping the later of two readings at one time. A reading of a source's usual shape costs no lookup by name: tables, devices and
/// field layouts are known by their `Arc`s' addresses (held, so not reused meanwhile).
struct RowsBuilder<'a> {
    store: &'a Store,
    devices: &'a mut DeviceMemo,
    /// The tables taken: name, id and partition size.
    tables: Vec<(Arc<str>, u32, PartitionSize)>,
    /// Field layouts the tables' schemas admitted, at most [`RowsBuilder::LAYOUTS`].
    layouts: Vec<LayoutIds>,
    /// The layout the next one learned replaces, once `layouts` is full.
    next_layout: usize,
    writer: RowWriter,
    /// The readings taken, in arrival order.
    taken: Vec<Taken>,
    /// Their rows, in arrival order.
    rows: Vec<u8>,
}

/// Fields of a table admitted by its schema (names by pointer, with their types), and their
/// ids in the [`RowWriter`].
struct LayoutIds {
    table: u32,
    fields: Vec<(FieldName, FieldType)>,
    ids: Vec<u32>,
}

/// A reading taken by a [`RowsBuilder`].
#[derive(Debug)]
struct Taken {
    key: (u32, u64, i32),
    ts: i64,
    /// Its row in [`RowsBuilder::rows`].
    row: Range<usize>,
    partition: (PartitionSize, i32),
}

impl RowsBuilder<'_> {
    const LAYOUTS: usize = 8;

    fn table(&mut self, table: &Arc<str>) -> Option<(u32, PartitionSize)> {
        if let Some((_, id, size)) = self.tables.iter().find(|(t, _, _)| Arc::ptr_eq(t, table)) {
            return Some((*id, *size));
        }
        let ti = read(&self.store.catalog).by_name.get(table).map(|ti| (ti.id, ti.partition))?;
        self.tables.push((Arc::clone(table), ti.0, ti.1));
        Some(ti)
    }

    fn device(&mut self, device: &Arc<str>) -> Option<u64> {
        if let Some(id) = self.devices.get(device) {
            return Some(id);
        }
        let id = read(&self.store.registry).by_name.get(device)?;
        self.devices.note(device, id);
        Some(id)
    }

    /// The position in `layouts` of `names` with `values` in `table`, learned (checked against
    /// the table's schema) if not known; `None` when the schema does not admit them as they are
    /// (an untyped integer never: the writer's schema check types it).
    fn layout(&mut self, table: u32, names: &[FieldName], values: &[Value]) -> Option<usize> {
        let same = |l: &LayoutIds| {
            l.table == table
                && l.fields.len() == names.len()
                && l.fields
                    .iter()
                    .zip(names.iter().zip(values))
                    .all(|((n, t), (m, v))| Arc::ptr_eq(n, m) && Some(*t) == v.typed())
        };
        if let Some(i) = self.layouts.iter().position(same) {
            return Some(i);
        }
        let fields: Vec<(FieldName, Value)> = names.iter().cloned().zip(values.iter().cloned()).collect();
        if !read(&self.store.catalog).schema(table).admits(&fields) {
            return None;
        }
        let ids = fields.iter().map(|(n, v)| self.writer.id(&self.store.field_ids, n, v.field_type())).collect();
        let layout = LayoutIds { table, fields: fields.into_iter().map(|(n, v)| (n, v.field_type())).collect(), ids };
        if self.layouts.len() < Self::LAYOUTS {
            self.layouts.push(layout);
            Some(self.layouts.len() - 1)
        } else {
            let turn = self.next_layout;
            self.layouts[turn] = layout;
            self.next_layout = (turn + 1) % Self::LAYOUTS;
            Some(turn)
        }
    }
}

impl model::PrepareRows for RowsBuilder<'_> {
    fn push(&mut self, table: &Arc<str>, device: &Arc<str>, ts: i64, names: &[FieldName], values: &[Value]) -> bool {
        debug_assert_eq!(names.len(), values.len());
        let Some((table, size)) = self.table(table) else { return false };
        let Some(device) = self.device(device) else { return false };
        let Some(hour) = keys::to_i32(Hour::of(ts).0) else { return false };
        let Some(partition) = keys::to_i32(size.index_of(Hour(i64::from(hour)).start_ms())) else { return false };
        let Some(layout) = self.layout(table, names, values) else { return false };
        let start = self.rows.len();
        rows::put_row(&mut self.rows, ts, &self.layouts[layout].ids, values);
        self.taken.push(Taken {
            key: (table, device, hour),
            ts,
            row: start..self.rows.len(),
            partition: (size, partition),
        });
        true
    }

    fn finish(self: Box<Self>) -> Option<model::Prepared> {
        let RowsBuilder { mut taken, mut rows, writer, devices, .. } = *self;
        if taken.is_empty() {
            devices.keep_spare(taken, rows);
            return None;
        }
        let readings = taken.len();
        // By device-hour and time; of two readings at one time, the later (its row further on)
        // last, and kept.
        let order = sorted_order(&taken);
        let sorted: Vec<&Taken> = order.iter().map(|&i| &taken[i as usize]).collect();
        // Sized once: growing a vector of this size took fresh memory pages at each step.
        let mut out = PreparedRows {
            readings,
            groups: Vec::with_capacity(taken.len()),
            rows: Vec::with_capacity(rows.len()),
            fields: writer.into_used(),
        };
        let mut at = 0;
        while at < sorted.len() {
            let key = sorted[at].key;
            let end = at + sorted[at..].iter().take_while(|t| t.key == key).count();
            let start = out.rows.len();
            let mut n = 0;
            for (i, t) in sorted[at..end].iter().enumerate() {
                if sorted.get(at + i + 1).is_some_and(|next| next.key == key && next.ts == t.ts) {
                    continue;
                }
                out.rows.extend_from_slice(&rows[t.row.clone()]);
                n += 1;
            }
            let (table, device, hour) = key;
            out.groups.push(Group {
                table,
                device,
                hour,
                partition: sorted[at].partition,
                n,
                newest: sorted[end - 1].ts,
                at: start..out.rows.len(),
            });
            at = end;
        }
        drop(sorted);
        taken.clear();
        rows.clear();
        devices.keep_spare(taken, rows);
        Some(model::Prepared { readings, inner: Box::new(out) })
    }
}

/// The positions of `taken` (in arrival order) sorted by device-hour, time and arrival: the
/// order `sort_by_key(|t| (t.key, t.ts, t.row.start))` gives. Each reading's key is packed into
/// one `u128` (each part less the batch's least, in as many bits as the batch's span of it
/// needs, arrival last): sorting those took 191 samples in a profile where sorting the 48-byte
/// readings by the tuples took 318. A batch whose spans need more than 128 bits is sorted by
/// the tuples.
fn sorted_order(taken: &[Taken]) -> Vec<u32> {
    // Arrival is the position: rows are appended in arrival order.
    let n = u32::try_from(taken.len()).expect("fewer than 2^32 readings a batch");
    let Some(first) = taken.first() else { return Vec::new() };
    let (mut table, mut device, mut hour, mut ts) =
        ((first.key.0, first.key.0), (first.key.1, first.key.1), (first.key.2, first.key.2), (first.ts, first.ts));
    for t in taken {
        let (tb, d, h) = t.key;
        table = (table.0.min(tb), table.1.max(tb));
        device = (device.0.min(d), device.1.max(d));
        hour = (hour.0.min(h), hour.1.max(h));
        ts = (ts.0.min(t.ts), ts.1.max(t.ts));
    }
    let bits = |span: u64| 64 - span.leading_zeros();
    let widths = [
        bits(u64::from(table.1 - table.0)),
        bits(device.1 - device.0),
        bits(u64::from(hour.1.abs_diff(hour.0))),
        bits(ts.1.abs_diff(ts.0)),
        bits(u64::from(n - 1)),
    ];
    if widths.iter().sum::<u32>() > 128 {
        let mut order: Vec<u32> = (0..n).collect();
        order.sort_unstable_by_key(|&i| {
            let t = &taken[i as usize];
            (t.key, t.ts, i)
        });
        return order;
    }
    let push = |packed: u128, width: u32, part: u64| packed.checked_shl(width).unwrap_or(0) | u128::from(part);
    let mut packed: Vec<u128> = taken
        .iter()
        .zip(0u32..)
        .map(|(t, i)| {
            let (tb, d, h) = t.key;
            let k = push(0, widths[0], u64::from(tb - table.0));
            let k = push(k, widths[1], d - device.0);
            let k = push(k, widths[2], u64::from(h.abs_diff(hour.0)));
            let k = push(k, widths[3], t.ts.abs_diff(ts.0));
            push(k, widths[4], u64::from(i))
        })
        .collect();
    packed.sort_unstable();
    let mask = (1u128 << widths[4]) - 1;
    packed.into_iter().map(|k| (k & mask) as u32).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, Instant};

    use model::{DeviceReading, IngestBatch, PrepareBatch, PrepareMemo, TimeRange, Value, HOUR_MS};

    use super::*;
    use crate::{write, StoreConfig, WriteBufferConfig};

    const T: &str = "plant.prep";
    const U: &str = "plant.other";
    const BASE: i64 = 1_706_738_400_000;

    /// A store whose buffer neither fills nor ages within a test (or no buffer).
    fn open(dir: &std::path::Path, buffered: bool) -> Store {
        let write_buffer = buffered.then_some(WriteBufferConfig {
            max_bytes: 1 << 30,
            max_age: Duration::from_secs(3600),
            bypass_below: 0.0,
            bypass_for: Duration::from_secs(3600),
        });
        Store::open(dir, StoreConfig { write_buffer, ..StoreConfig::default() }).unwrap()
    }

    fn dr(table: &str, device: &str, ts: i64, fields: Vec<(&str, Value)>) -> DeviceReading {
        let fields = fields.into_iter().map(|(n, v)| (FieldName::from(n), v)).collect();
        DeviceReading { table: table.into(), device: device.into(), reading: Reading::new(ts, fields) }
    }

    fn batch(readings: Vec<DeviceReading>) -> IngestBatch {
        IngestBatch { readings, ..IngestBatch::default() }
    }

    /// Commits `batch` as the writer thread does.
    fn commit(store: &Store, batch: IngestBatch) {
        store.write_retrying(batch.readings, &batch.sources, batch.prepared, &[], &[], |_, _| None).unwrap();
    }

    fn stored(store: &Store, table: &str, device: &str) -> Vec<Reading> {
        let all = TimeRange::new(BASE - 2 * HOUR_MS, BASE + 2 * HOUR_MS).unwrap();
        store.read_range(table, device, all).unwrap().unwrap_or_default()
    }

    /// Registers tables `T` (float `v`) and `U` (integer `w`) and devices `a` and `b`.
    fn registered(store: &Store) {
        let first = vec![
            dr(T, "a", BASE - HOUR_MS, vec![("v", Value::F64(0.5))]),
            dr(T, "b", BASE - HOUR_MS, vec![("v", Value::F64(0.25))]),
            dr(U, "a", BASE - HOUR_MS, vec![("w", Value::I64(-1))]),
        ];
        store.write(first, &[]).unwrap();
    }

    /// Readings of two tables, two devices and three hours, out of order, one time twice.
    fn mixed() -> Vec<DeviceReading> {
        vec![
            dr(T, "a", BASE + 5, vec![("v", Value::F64(1.0))]),
            dr(T, "b", BASE, vec![("v", Value::F64(2.0))]),
            dr(T, "a", BASE + 1, vec![("v", Value::F64(3.0))]),
            dr(T, "a", BASE + 5, vec![("v", Value::F64(4.0))]),
            dr(U, "a", BASE + HOUR_MS + 7, vec![("w", Value::I64(5))]),
            dr(T, "a", BASE - HOUR_MS + 2, vec![("v", Value::F64(6.0))]),
        ]
    }

    /// Asserts that `store` holds what [`registered`] and [`mixed`] wrote: by device-hour,
    /// sorted, the later of two readings at one time kept.
    fn assert_stores_mixed(store: &Store) {
        assert_eq!(
            values(&stored(store, T, "a")),
            [
                (BASE - HOUR_MS, Value::F64(0.5)),
                (BASE - HOUR_MS + 2, Value::F64(6.0)),
                (BASE + 1, Value::F64(3.0)),
                (BASE + 5, Value::F64(4.0)),
            ]
        );
        assert_eq!(values(&stored(store, T, "b")), [(BASE - HOUR_MS, Value::F64(0.25)), (BASE, Value::F64(2.0))]);
        assert_eq!(
            values(&stored(store, U, "a")),
            [(BASE - HOUR_MS, Value::I64(-1)), (BASE + HOUR_MS + 7, Value::I64(5))]
        );
    }

    fn values(rs: &[Reading]) -> Vec<(i64, Value)> {
        rs.iter().map(|r| (r.ts, r.fields[0].1.clone())).collect()
    }

    /// A prepared batch stores what the writer stores from the same readings: by device-hour,
    /// sorted, the later of two readings at one time kept; and so it reads after a flush, and
    /// after a restart replays the buffer's records.
    #[test]
    fn a_prepared_batch_stores_what_the_writer_stores_from_readings() {
        let (dir, plain_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let want_ta = vec![
            (BASE - HOUR_MS, Value::F64(0.5)),
            (BASE - HOUR_MS + 2, Value::F64(6.0)),
            (BASE + 1, Value::F64(3.0)),
            (BASE + 5, Value::F64(4.0)),
        ];
        let want_tb = vec![(BASE - HOUR_MS, Value::F64(0.25)), (BASE, Value::F64(2.0))];
        let want_ua = vec![(BASE - HOUR_MS, Value::I64(-1)), (BASE + HOUR_MS + 7, Value::I64(5))];
        {
            let store = open(dir.path(), true);
            registered(&store);
            let b = prepared(&store, &mut PrepareMemo::default(), mixed());
            assert!(b.readings.is_empty());
            // Six received (two at one time), as an unprepared batch counts them.
            assert_eq!((b.prepared.len(), b.reading_count()), (1, 6));
            let p = b.prepared[0].inner.downcast_ref::<PreparedRows>().unwrap();
            let hour = |ts: i64| Hour::of(ts).0 as i32;
            let (t, u) = (store.table(T).unwrap().id, store.table(U).unwrap().id);
            let (a, dev_b) = (store.device_id("a").unwrap(), store.device_id("b").unwrap());
            let groups: Vec<(u32, u64, i32, usize, i64)> =
                p.groups.iter().map(|g| (g.table, g.device, g.hour, g.n, g.newest)).collect();
            let mut want = vec![
                (t, a, hour(BASE - HOUR_MS), 1, BASE - HOUR_MS + 2),
                (t, a, hour(BASE), 2, BASE + 5),
                (t, dev_b, hour(BASE), 1, BASE),
                (u, a, hour(BASE + HOUR_MS), 1, BASE + HOUR_MS + 7),
            ];
            want.sort_unstable();
            assert_eq!(groups, want);
            let summary = store.write_retrying(b.readings, &b.sources, b.prepared, &[], &[], |_, _| None).unwrap();
            // What the writer answers for the same readings unprepared (a partial write says
            // so many readings stored).
            assert_eq!((summary.readings, summary.buckets), (6, 4));
            assert_eq!(values(&stored(&store, T, "a")), want_ta);
            assert_eq!(values(&stored(&store, T, "b")), want_tb);
            assert_eq!(values(&stored(&store, U, "a")), want_ua);
            // The process dies with the batch in the buffer only.
        }
        let store = open(dir.path(), true);
        assert_eq!(values(&stored(&store, T, "a")), want_ta);
        assert_eq!(values(&stored(&store, U, "a")), want_ua);
        store.flush_write_buffer().unwrap();
        assert_eq!(store.write_buffer_operands(), 0);
        assert_eq!(values(&stored(&store, T, "a")), want_ta);
        assert_eq!(values(&stored(&store, T, "b")), want_tb);
        assert_eq!(values(&stored(&store, U, "a")), want_ua);
        // The same readings through the writer alone, on another store.
        let plain = open(plain_dir.path(), true);
        registered(&plain);
        let summary = plain.write(mixed(), &[]).unwrap();
        assert_eq!((summary.readings, summary.buckets), (6, 4));
        for (table, device) in [(T, "a"), (T, "b"), (U, "a")] {
            assert_eq!(stored(&plain, table, device), stored(&store, table, device), "{table} {device}");
        }
    }

    /// Readings the writer has work for (a name to register, a schema to check), after
    /// [`registered`].
    fn odd_readings() -> [(&'static str, DeviceReading); 5] {
        [
            ("a new device", dr(T, "new", BASE, vec![("v", Value::F64(1.0))])),
            ("a new table", dr("plant.new", "a", BASE, vec![("v", Value::F64(1.0))])),
            ("a new field", dr(T, "a", BASE, vec![("v", Value::F64(1.0)), ("x", Value::F64(1.0))])),
            ("a value of another type", dr(T, "a", BASE, vec![("v", Value::Bool(true))])),
            ("a whole float for an integer field", dr(U, "a", BASE, vec![("w", Value::F64(3.0))])),
        ]
    }

    /// `readings` given one by one to the store's preparation ([`model::PrepareBatch::rows`]),
    /// up to the first it refuses: how many it took, and what it made of them.
    fn pushed(store: &Store, memo: &mut PrepareMemo, readings: &[DeviceReading]) -> (usize, Option<model::Prepared>) {
        let mut rows = store.rows(memo).unwrap();
        let mut taken = 0;
        for r in readings {
            let names: Vec<FieldName> = r.reading.fields.iter().map(|(n, _)| Arc::clone(n)).collect();
            let values: Vec<Value> = r.reading.fields.iter().map(|(_, v)| v.clone()).collect();
            if !rows.push(&r.table, &r.device, r.reading.ts, &names, &values) {
                break;
            }
            taken += 1;
        }
        (taken, rows.finish())
    }

    /// `readings` as a source that prepares them sends them: prepared up to the first the store
    /// refuses, readings from there on.
    fn prepared(store: &Store, memo: &mut PrepareMemo, readings: Vec<DeviceReading>) -> IngestBatch {
        let (taken, prepared) = pushed(store, memo, &readings);
        IngestBatch {
            readings: readings[taken..].to_vec(),
            prepared: prepared.into_iter().collect(),
            ..batch(Vec::new())
        }
    }

    /// Of readings given one by one, one the writer has work for is refused and nothing of it
    /// taken; a store without a write buffer prepares none.
    #[test]
    fn readings_the_writer_has_work_for_are_refused_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), true);
        registered(&store);
        let known = |v: f64| dr(T, "a", BASE, vec![("v", Value::F64(v))]);
        let mut memo = PrepareMemo::default();
        for (what, odd) in odd_readings() {
            let (taken, prepared) = pushed(&store, &mut memo, &[known(1.0), odd, known(2.0)]);
            let p = prepared.unwrap();
            let rows = p.inner.downcast_ref::<PreparedRows>().unwrap();
            assert_eq!((taken, p.readings, rows.groups.len()), (1, 1, 1), "{what}");
            let names = store.field_ids.names().clone();
            assert_eq!(values(&rows.readings(&rows.groups[0], &names).unwrap()), [(BASE, Value::F64(1.0))], "{what}");
        }
        let (taken, prepared) = pushed(&store, &mut memo, &[]);
        assert!(taken == 0 && prepared.is_none());

        let unbuffered_dir = tempfile::tempdir().unwrap();
        let unbuffered = open(unbuffered_dir.path(), false);
        registered(&unbuffered);
        assert!(unbuffered.rows(&mut PrepareMemo::default()).is_none());
    }

    /// A prepared batch whose commit finds the buffer bypassed is written straight through,
    /// after the buffer it would have joined is flushed.
    #[test]
    fn a_prepared_batch_committed_past_the_buffer_is_written_directly() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), true);
        registered(&store);
        assert_eq!(store.write_buffer_operands(), 3);
        let b = prepared(&store, &mut PrepareMemo::default(), mixed());
        assert_eq!((b.prepared.len(), b.readings.len()), (1, 0));
        {
            let mut state = store.write_lock.lock().unwrap();
            assert!(store.hand_over(&mut state, &mut write(&store.wbuf), None).is_some());
            state.wbuf_bypass_until = Some(Instant::now() + Duration::from_secs(3600));
        }
        commit(&store, b);
        assert_eq!(store.write_buffer_operands(), 0);
        assert_stores_mixed(&store);
    }

    /// The writer thread stores a device's readings in arrival order, prepared or not: a
    /// prepared batch queued after an unprepared one waits for the next commit.
    #[test]
    fn the_writer_keeps_arrival_order_across_prepared_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path(), true));
        registered(&store);
        let at = |v: f64| dr(T, "a", BASE, vec![("v", Value::F64(v))]);
        let prepared = |v: f64| {
            let b = prepared(&store, &mut PrepareMemo::default(), vec![at(v)]);
            assert_eq!((b.prepared.len(), b.readings.len()), (1, 0));
            b
        };
        // (batches in arrival order, the value the last of them wrote)
        let runs = [
            vec![batch(vec![at(1.0)]), prepared(2.0)],
            vec![prepared(3.0), batch(vec![at(4.0)])],
            vec![batch(vec![at(5.0)]), prepared(6.0), batch(vec![at(7.0)]), prepared(8.0)],
        ];
        for run in runs {
            let last = match run.last().unwrap() {
                b if b.prepared.is_empty() => b.readings[0].reading.fields[0].1.clone(),
                b => b.prepared[0]
                    .inner
                    .downcast_ref::<PreparedRows>()
                    .map(|p| p.readings(&p.groups[0], &store.field_ids.names()).unwrap()[0].fields[0].1.clone())
                    .unwrap(),
            };
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            for b in run {
                tx.try_send(b).unwrap();
            }
            drop(tx);
            crate::writer::run(Arc::clone(&store), rx, crate::writer::WriterConfig::default());
            let got = stored(&store, T, "a");
            assert_eq!(got.iter().find(|r| r.ts == BASE).map(|r| r.fields[0].1.clone()), Some(last));
        }
    }

    /// A source's memo gives a device's id by its `Arc`, and only of the store it was noted
    /// for: another store, which numbered the same names otherwise, starts it over.
    #[test]
    fn a_memo_of_device_ids_is_of_one_store() {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (open(dir_a.path(), true), open(dir_b.path(), true));
        let reading = |device: &str| dr(T, device, BASE, vec![("v", Value::F64(1.0))]);
        a.write(vec![reading("x"), reading("y")], &[]).unwrap();
        b.write(vec![reading("y"), reading("x")], &[]).unwrap();
        assert_ne!(a.device_id("x"), b.device_id("x"));
        // The decoder's shared names: one `Arc` a device, in every batch.
        let (x, y): (Arc<str>, Arc<str>) = ("x".into(), "y".into());
        let shared = |device: &Arc<str>| DeviceReading { device: Arc::clone(device), ..reading("") };
        // The id the prepared batch of one reading of `device` names.
        let prepared_id = |store: &Store, memo: &mut PrepareMemo, device: &Arc<str>| {
            let batch = prepared(store, memo, vec![shared(device)]);
            let p = batch.prepared[0].inner.downcast_ref::<PreparedRows>().unwrap();
            p.groups.iter().map(|g| g.device).collect::<Vec<u64>>()
        };
        let mut memo = PrepareMemo::default();
        assert_eq!(prepared_id(&a, &mut memo, &x), [a.device_id("x").unwrap()]);
        assert_eq!(prepared_id(&a, &mut memo, &y), [a.device_id("y").unwrap()]);
        let noted = memo.0.as_mut().and_then(|m| m.downcast_mut::<DeviceMemo>()).unwrap();
        assert_eq!((noted.store, noted.get(&x), noted.get(&y)), (a.instance, a.device_id("x"), a.device_id("y")));
        // The same name in another allocation is not found by it.
        assert_eq!(noted.get(&"x".into()), None);
        assert_eq!(prepared_id(&a, &mut memo, &x), [a.device_id("x").unwrap()]);
        assert_eq!(prepared_id(&b, &mut memo, &x), [b.device_id("x").unwrap()]);
        let noted = memo.0.as_mut().and_then(|m| m.downcast_mut::<DeviceMemo>()).unwrap();
        assert_eq!((noted.store, noted.get(&x), noted.get(&y)), (b.instance, b.device_id("x"), None));
    }
}

#[cfg(test)]
mod order_tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    fn taken(parts: &[(u32, u64, i32, i64)]) -> Vec<Taken> {
        // Rows of 8 bytes each, in arrival order.
        parts
            .iter()
            .enumerate()
            .map(|(i, &(table, device, hour, ts))| Taken {
                key: (table, device, hour),
                ts,
                row: i * 8..i * 8 + 8,
                partition: (PartitionSize::default(), 0),
            })
            .collect()
    }

    fn by_tuples(taken: &[Taken]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..taken.len() as u32).collect();
        order.sort_by_key(|&i| {
            let t = &taken[i as usize];
            (t.key, t.ts, t.row.start)
        });
        order
    }

    /// Exact orders: by table, device, hour, time, then arrival; packed, and with spans too
    /// wide to pack (128 bits) by the tuples.
    #[test]
    fn readings_sort_by_device_hour_time_then_arrival() {
        let small = taken(&[
            (2, 5, 10, 400),
            (1, 7, 10, 300),
            (1, 5, 11, 100),
            (1, 5, 10, 200),
            (1, 5, 10, 200),
            (1, 5, 10, 100),
        ]);
        assert_eq!(sorted_order(&small), [5, 3, 4, 2, 1, 0]);
        let wide = taken(&[
            (u32::MAX, u64::MAX, i32::MAX, i64::MAX),
            (0, 0, i32::MIN, i64::MIN),
            (0, 0, i32::MIN, i64::MIN),
            (0, u64::MAX, i32::MIN, -1),
        ]);
        assert_eq!(sorted_order(&wide), [1, 2, 3, 0]);
        assert_eq!(sorted_order(&[]), Vec::<u32>::new());
        assert_eq!(sorted_order(&taken(&[(3, 3, -3, -3)])), [0]);
    }

    fn part() -> impl Strategy<Value = (u32, u64, i32, i64)> {
        prop_oneof![
            // A batch's usual spans: a few tables, devices and hours, times near each other.
            (0u32..3, 0u64..40, -2i32..2, -5000i64..5000),
            // Any value: spans too wide to pack.
            (any::<u32>(), any::<u64>(), any::<i32>(), any::<i64>()),
        ]
    }

    proptest! {
        #[test]
        fn packed_order_is_the_tuple_order(
            narrow in prop::collection::vec((0u32..3, 0u64..40, -2i32..2, -5000i64..5000), 0..300),
            mixed in prop::collection::vec(part(), 0..50),
        ) {
            for parts in [&narrow, &mixed] {
                let t = taken(parts);
                prop_assert_eq!(sorted_order(&t), by_tuples(&t));
            }
        }
    }
}
