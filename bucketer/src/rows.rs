//! The write buffer's readings as rows ([`crate::wbuf`]): a batch's readings of a device-hour
//! are kept as they came instead of encoded as a bucket, so a batch costs a copy, not an
//! encoding, and a flush encodes each device-hour once from its rows ([`bucket`]) instead of
//! decoding and merging one operand a batch.
//!
//! A row names its fields by ids of the store's [`FieldIds`] (one id a (name, type) pair), not
//! by their names. The ids are the process's own: a `wbuf` record lists the names of the ids
//! it uses, and a replay maps them to the ids of the process reading it ([`translate`]).
//!
//! Row layout, one a reading, rows back to back: `ts i64 LE · m varint · m × (id varint ·
//! value)`, the reading's fields in its order (ascending names). A value is its 8 bytes (LE)
//! for a float (its bits) and an integer, 1 byte (0 or 1) for a boolean, and `length varint ·
//! UTF-8` for a string. Varints are LEB128, as in [`crate::codec`].

use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard};

use model::{FieldName, FieldType, Reading, Value};

use crate::codec::{self, put_varint, ColumnIn};
use crate::FastMap;

/// What is wrong with rows that do not decode.
pub(crate) type Bad = &'static str;

/// The ids of the (field name, type) pairs the write buffer has held, for the life of the
/// process: as many as distinct pairs were buffered, names shared with the readings'.
#[derive(Debug, Default)]
pub(crate) struct FieldIds {
    ids: Mutex<FastMap<(FieldName, FieldType), u32>>,
    names: RwLock<Vec<(FieldName, FieldType)>>,
}

impl FieldIds {
    /// The id of `(name, ty)`, given one now if it has none.
    pub(crate) fn id_of(&self, name: &FieldName, ty: FieldType) -> u32 {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (name.clone(), ty);
        if let Some(&id) = ids.get(&key) {
            return id;
        }
        let mut names = self.names.write().unwrap_or_else(PoisonError::into_inner);
        let id = u32::try_from(names.len()).unwrap_or(u32::MAX);
        names.push(key.clone());
        ids.insert(key, id);
        id
    }

    /// The pairs by id.
    pub(crate) fn names(&self) -> RwLockReadGuard<'_, Vec<(FieldName, FieldType)>> {
        self.names.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Writes readings as rows, and remembers the ids it used with their names (a record's list).
#[derive(Debug, Default)]
pub(crate) struct RowWriter {
    /// The pairs used so far, with their ids, in order of first use. A batch's readings share
    /// their names' allocations (the parsers intern them), so most lookups end at a pointer
    /// comparison; holding the names keeps their addresses from being reused meanwhile.
    used: Vec<(FieldName, FieldType, u32)>,
    /// Index of `used` by pair, built once it holds more than [`LINEAR_NAMES`].
    by_name: FastMap<(FieldName, FieldType), usize>,
}

/// Names a [`RowWriter`] looks through one by one before it hashes them.
const LINEAR_NAMES: usize = 16;

impl RowWriter {
    /// The id of `(name, ty)`, noted as used.
    pub(crate) fn id(&mut self, ids: &FieldIds, name: &FieldName, ty: FieldType) -> u32 {
        if let Some(&(_, _, id)) = self.used.iter().find(|(n, t, _)| *t == ty && std::sync::Arc::ptr_eq(n, name)) {
            return id;
        }
        // Past a few names, by hash: a batch of many distinct fields stays linear.
        let found = if self.used.len() <= LINEAR_NAMES {
            self.used.iter().position(|(n, t, _)| *t == ty && n == name)
        } else {
            if self.by_name.is_empty() {
                self.by_name = self.used.iter().enumerate().map(|(i, (n, t, _))| ((n.clone(), *t), i)).collect();
            }
            self.by_name.get(&(name.clone(), ty)).copied()
        };
        if let Some(i) = found {
            // The same name in another allocation (interned per message, not per batch): the
            // rest of its message then ends at the pointer comparison.
            self.used[i].0 = name.clone();
            return self.used[i].2;
        }
        let id = ids.id_of(name, ty);
        self.add_used(name, ty, id);
        id
    }

    /// Adds `(name, ty)` with id `id` to the pairs used (not among them yet).
    fn add_used(&mut self, name: &FieldName, ty: FieldType, id: u32) {
        self.used.push((name.clone(), ty, id));
        if !self.by_name.is_empty() {
            self.by_name.insert((name.clone(), ty), self.used.len() - 1);
        }
    }

    /// Notes that rows written elsewhere use id `id` for `(name, ty)`.
    pub(crate) fn note_used(&mut self, name: &FieldName, ty: FieldType, id: u32) {
        if !self.used.iter().any(|&(_, _, used)| used == id) {
            self.add_used(name, ty, id);
        }
    }

    /// The pairs used, with their ids, in order of first use (no id twice), given up.
    pub(crate) fn into_used(self) -> Vec<(FieldName, FieldType, u32)> {
        self.used
    }

    /// The pairs used, with their ids, in order of first use (no id twice).
    pub(crate) fn used(&self) -> impl Iterator<Item = (u32, &str, FieldType)> {
        self.used.iter().map(|(n, t, id)| (*id, &**n, *t))
    }

    /// Appends `readings` to `out` as rows.
    pub(crate) fn put(&mut self, ids: &FieldIds, readings: &[Reading], out: &mut Vec<u8>) {
        for r in readings {
            out.extend_from_slice(&r.ts.to_le_bytes());
            put_varint(out, r.fields.len() as u64);
            for (name, value) in &r.fields {
                let id = self.id(ids, name, value.field_type());
                put_varint(out, u64::from(id));
                put_value(out, RowValue::from(value));
            }
        }
    }
}

/// Appends the row of a reading at `ts` whose fields have ids `ids` (of a [`RowWriter`]) and
/// values `values`, in the reading's order: the bytes [`RowWriter::put`] writes for it.
pub(crate) fn put_row(out: &mut Vec<u8>, ts: i64, ids: &[u32], values: &[Value]) {
    out.extend_from_slice(&ts.to_le_bytes());
    put_varint(out, ids.len() as u64);
    for (&id, value) in ids.iter().zip(values) {
        put_varint(out, u64::from(id));
        put_value(out, RowValue::from(value));
    }
}

/// A value of a row, borrowed from it.
#[derive(Debug, Clone, Copy)]
enum RowValue<'a> {
    F64(f64),
    I64(i64),
    Bool(bool),
    Str(&'a str),
}

impl<'a> From<&'a Value> for RowValue<'a> {
    fn from(value: &'a Value) -> RowValue<'a> {
        match value {
            Value::F64(v) => RowValue::F64(*v),
            Value::UntypedInt(v) => RowValue::F64(*v as f64),
            Value::I64(v) => RowValue::I64(*v),
            Value::Bool(v) => RowValue::Bool(*v),
            Value::Str(s) => RowValue::Str(s),
        }
    }
}

/// Writes a value as a row holds it.
fn put_value(out: &mut Vec<u8>, value: RowValue<'_>) {
    match value {
        RowValue::F64(v) => out.extend_from_slice(&v.to_bits().to_le_bytes()),
        RowValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        RowValue::Bool(v) => out.push(u8::from(v)),
        RowValue::Str(s) => {
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Reads rows (and the write buffer's record heads) front to back.
pub(crate) struct Cursor<'a> {
    pub(crate) rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.rest.len() < n {
            return Err("rows truncated");
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn eight(&mut self) -> Result<[u8; 8], Bad> {
        let (head, tail) = self.rest.split_first_chunk::<8>().ok_or("rows truncated")?;
        self.rest = tail;
        Ok(*head)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, Bad> {
        let (v, len) = rollup::varint::read(self.rest)?;
        self.rest = &self.rest[len..];
        Ok(v)
    }

    /// The next row's time and field count; `None` at the end.
    fn row(&mut self) -> Result<Option<(i64, usize)>, Bad> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let ts = i64::from_le_bytes(self.eight()?);
        let m = usize::try_from(self.varint()?).map_err(|_| "field count too large")?;
        Ok(Some((ts, m)))
    }

    /// The next field's id and value, its type looked up in `types`.
    fn field(&mut self, types: impl Fn(u32) -> Option<FieldType>) -> Result<(u32, RowValue<'a>), Bad> {
        let id = u32::try_from(self.varint()?).map_err(|_| "field id too large")?;
        let value = match types(id).ok_or("unknown field id")? {
            FieldType::F64 => RowValue::F64(f64::from_bits(u64::from_le_bytes(self.eight()?))),
            FieldType::I64 => RowValue::I64(i64::from_le_bytes(self.eight()?)),
            FieldType::Bool => match self.take(1)?[0] {
                0 => RowValue::Bool(false),
                1 => RowValue::Bool(true),
                _ => return Err("boolean neither 0 nor 1"),
            },
            FieldType::Str => {
                let len = usize::try_from(self.varint()?).map_err(|_| "string too long")?;
                RowValue::Str(std::str::from_utf8(self.take(len)?).map_err(|_| "string not UTF-8")?)
            }
        };
        Ok((id, value))
    }
}

fn type_in(names: &[(FieldName, FieldType)]) -> impl Fn(u32) -> Option<FieldType> + '_ {
    |id| names.get(id as usize).map(|&(_, ty)| ty)
}

/// Appends the readings of `rows` to `out`, in row order; field names from `names` (by id).
pub(crate) fn to_readings(rows: &[u8], names: &[(FieldName, FieldType)], out: &mut Vec<Reading>) -> Result<(), Bad> {
    let mut c = Cursor { rest: rows };
    while let Some((ts, m)) = c.row()? {
        out.push(reading(&mut c, ts, m, names)?);
    }
    Ok(())
}

/// The reading at time `ts` whose `m` fields follow at `c`.
fn reading(c: &mut Cursor<'_>, ts: i64, m: usize, names: &[(FieldName, FieldType)]) -> Result<Reading, Bad> {
    let mut fields = Vec::with_capacity(m.min(c.rest.len()));
    for _ in 0..m {
        let (id, value) = c.field(type_in(names))?;
        let value = match value {
            RowValue::F64(v) => Value::F64(v),
            RowValue::I64(v) => Value::I64(v),
            RowValue::Bool(v) => Value::Bool(v),
            RowValue::Str(s) => Value::Str(s.into()),
        };
        fields.push((names[id as usize].0.clone(), value));
    }
    Ok(Reading { ts, fields })
}

/// The reading of `rows` with the greatest time (of equal times, the later row's); `None` for
/// no rows.
pub(crate) fn newest(rows: &[u8], names: &[(FieldName, FieldType)]) -> Result<Option<Reading>, Bad> {
    let mut c = Cursor { rest: rows };
    let mut best: Option<(i64, usize)> = None;
    loop {
        let at = rows.len() - c.rest.len();
        let Some((ts, m)) = c.row()? else { break };
        for _ in 0..m {
            c.field(type_in(names))?;
        }
        if best.is_none_or(|(b, _)| ts >= b) {
            best = Some((ts, at));
        }
    }
    let Some((_, at)) = best else { return Ok(None) };
    let mut c = Cursor { rest: &rows[at..] };
    let (ts, m) = c.row()?.ok_or("rows truncated")?;
    reading(&mut c, ts, m, names).map(Some)
}

/// Appends to `out` the bucket ([`codec`], format v2) of the `n` readings of `rows`, recording
/// `schema_version`: their merge, as [`codec::merge`] of one bucket a row in row order writes
/// it (of readings at one time the later row's). Encoded from columns, without a [`Reading`]
/// per reading; rows out of time order (late readings) are taken a second time, in order.
/// Answers the newest time.
pub(crate) fn bucket(
    rows: &[u8],
    n: usize,
    schema_version: u32,
    names: &[(FieldName, FieldType)],
    out: &mut Vec<u8>,
) -> Result<i64, Bad> {
    let mut ts: Vec<i64> = Vec::with_capacity(n);
    let mut starts: Vec<usize> = Vec::with_capacity(n);
    let mut columns: Vec<(u32, ColumnIn<'_>)> = Vec::new();
    let mut c = Cursor { rest: rows };
    loop {
        let at = rows.len() - c.rest.len();
        let Some((t, m)) = c.row()? else { break };
        if ts.len() >= n {
            return Err("more rows than counted");
        }
        starts.push(at);
        ts.push(t);
        gather(&mut c, m, ts.len() - 1, n, names, &mut columns)?;
    }
    if ts.len() != n {
        return Err("fewer rows than counted");
    }
    if n == 0 {
        return Err("no rows");
    }
    if !ts.windows(2).all(|w| w[0] < w[1]) {
        // By time, stably; of rows at one time the last is kept.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&r| ts[r]);
        let kept: Vec<usize> = (0..n)
            .filter(|&k| order.get(k + 1).is_none_or(|&next| ts[next] != ts[order[k]]))
            .map(|k| order[k])
            .collect();
        columns.clear();
        let mut sorted = Vec::with_capacity(kept.len());
        for (i, &r) in kept.iter().enumerate() {
            let mut c = Cursor { rest: &rows[starts[r]..] };
            let (t, m) = c.row()?.ok_or("rows truncated")?;
            sorted.push(t);
            gather(&mut c, m, i, kept.len(), names, &mut columns)?;
        }
        ts = sorted;
    }
    let mut columns: Vec<ColumnIn<'_>> = columns.into_iter().map(|(_, c)| c).collect();
    codec::encode_columns(&ts, schema_version, &mut columns, out);
    ts.last().copied().ok_or("no rows")
}

/// Adds the `m` fields of row `i` (of `n`) at `c` to `columns` (by field id).
fn gather<'a>(
    c: &mut Cursor<'a>,
    m: usize,
    i: usize,
    n: usize,
    names: &'a [(FieldName, FieldType)],
    columns: &mut Vec<(u32, ColumnIn<'a>)>,
) -> Result<(), Bad> {
    for j in 0..m {
        let (id, value) = c.field(type_in(names))?;
        // Rows mostly carry the same fields in the same order.
        let at = match columns.get(j) {
            Some((cid, _)) if *cid == id => j,
            _ => match columns.iter().position(|(cid, _)| *cid == id) {
                Some(at) => at,
                None => {
                    let (name, ty) = &names[id as usize];
                    // Sized once for every row: rows mostly carry every field.
                    let mut col = ColumnIn::new(name, *ty, n);
                    match ty {
                        FieldType::F64 => col.values.reserve_exact(n),
                        FieldType::I64 => col.ints.reserve_exact(n),
                        FieldType::Bool => col.bools.reserve_exact(n),
                        FieldType::Str => col.strs.reserve_exact(n),
                    }
                    columns.push((id, col));
                    columns.len() - 1
                }
            },
        };
        let col = &mut columns[at].1;
        let (byte, bit) = (i / 8, 1u8 << (i % 8));
        if col.bitmap[byte] & bit != 0 {
            return Err("a field twice in a row");
        }
        col.bitmap[byte] |= bit;
        col.count += 1;
        match value {
            RowValue::F64(v) => col.values.push(v),
            RowValue::I64(v) => col.ints.push(v),
            RowValue::Bool(v) => col.bools.push(v),
            RowValue::Str(s) => col.strs.push(s),
        }
    }
    Ok(())
}

/// Appends `rows` to `out` with each field id `id` replaced by `map(id)` (`None`: not an id of
/// the rows' list), whose type it must keep; answers the number of rows.
pub(crate) fn translate(
    rows: &[u8],
    map: impl Fn(u32) -> Option<(u32, FieldType)>,
    out: &mut Vec<u8>,
) -> Result<usize, Bad> {
    let mut c = Cursor { rest: rows };
    let mut n = 0;
    while let Some((ts, m)) = c.row()? {
        out.extend_from_slice(&ts.to_le_bytes());
        put_varint(out, m as u64);
        for _ in 0..m {
            let (id, value) = c.field(|id| map(id).map(|(_, ty)| ty))?;
            let (to, _) = map(id).ok_or("unknown field id")?;
            put_varint(out, u64::from(to));
            put_value(out, value);
        }
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    fn reading(ts: i64, fields: &[(&str, Value)]) -> Reading {
        Reading::new(ts, fields.iter().map(|(n, v)| (FieldName::from(*n), v.clone())).collect())
    }

    /// The rows of a hand-made reading, byte for byte.
    #[test]
    fn a_row_has_the_documented_layout() {
        let ids = FieldIds::default();
        let mut w = RowWriter::default();
        let mut out = Vec::new();
        let r =
            reading(-2, &[("a", Value::F64(1.5)), ("b", Value::I64(-3)), ("c", Value::Bool(true)), ("d", "hé".into())]);
        w.put(&ids, std::slice::from_ref(&r), &mut out);
        let mut want = Vec::new();
        want.extend_from_slice(&(-2i64).to_le_bytes());
        want.push(4);
        want.push(0);
        want.extend_from_slice(&1.5f64.to_bits().to_le_bytes());
        want.push(1);
        want.extend_from_slice(&(-3i64).to_le_bytes());
        want.extend_from_slice(&[2, 1]);
        want.extend_from_slice(&[3, 3, b'h', 0xc3, 0xa9]);
        assert_eq!(out, want);
        let used: Vec<(u32, &str, FieldType)> = w.used().collect();
        assert_eq!(
            used,
            [(0, "a", FieldType::F64), (1, "b", FieldType::I64), (2, "c", FieldType::Bool), (3, "d", FieldType::Str)]
        );
        let mut back = Vec::new();
        to_readings(&out, &ids.names(), &mut back).unwrap();
        assert_eq!(back, [r]);
    }

    /// A name under two types gets two ids; a name given as another allocation, the same id.
    #[test]
    fn ids_are_of_name_and_type() {
        let ids = FieldIds::default();
        let mut w = RowWriter::default();
        let mut out = Vec::new();
        w.put(&ids, &[reading(1, &[("x", Value::F64(1.0))]), reading(2, &[("x", Value::I64(1))])], &mut out);
        let mut w2 = RowWriter::default();
        w2.put(&ids, &[reading(3, &[("x", Value::I64(7))])], &mut out);
        assert_eq!(ids.id_of(&"x".into(), FieldType::F64), 0);
        assert_eq!(ids.id_of(&"x".into(), FieldType::I64), 1);
        assert_eq!(w2.used().collect::<Vec<_>>(), [(1, "x", FieldType::I64)]);
    }

    /// A batch of more distinct fields than are looked through one by one, each name sent in
    /// allocations of its own, keeps one id a pair and lists each once.
    #[test]
    fn many_fields_in_many_allocations_keep_their_ids() {
        let ids = FieldIds::default();
        let mut w = RowWriter::default();
        let mut out = Vec::new();
        let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
        for round in 0..3 {
            let fields: Vec<(FieldName, Value)> =
                names.iter().map(|n| (FieldName::from(n.as_str()), Value::I64(round))).collect();
            w.put(&ids, &[Reading::new(round, fields)], &mut out);
        }
        let used: Vec<u32> = w.used().map(|(id, _, _)| id).collect();
        assert_eq!(used, (0..40).collect::<Vec<u32>>());
        let mut back = Vec::new();
        to_readings(&out, &ids.names(), &mut back).unwrap();
        assert_eq!(back.len(), 3);
        assert!(back.iter().enumerate().all(|(r, reading)| reading.fields.len() == 40
            && reading.fields.iter().zip(&names).all(|((n, v), want)| &**n == want && *v == Value::I64(r as i64))));
    }

    #[test]
    fn damaged_rows_are_refused() {
        let ids = FieldIds::default();
        let mut out = Vec::new();
        RowWriter::default().put(&ids, &[reading(5, &[("b", Value::Bool(true)), ("s", "x".into())])], &mut out);
        let names = ids.names().clone();
        let mut sink = Vec::new();
        assert!(to_readings(&out[..out.len() - 1], &names, &mut sink).is_err());
        let mut bad_bool = out.clone();
        bad_bool[10] = 2;
        assert!(to_readings(&bad_bool, &names, &mut sink).is_err());
        let mut bad_id = out.clone();
        bad_id[9] = 9;
        let mut bytes = Vec::new();
        assert_eq!(bucket(&bad_id, 1, 0, &names, &mut bytes), Err("unknown field id"));
        assert_eq!(bucket(&out, 2, 0, &names, &mut bytes), Err("fewer rows than counted"));
        assert_eq!(bucket(&out, 0, 0, &names, &mut bytes), Err("more rows than counted"));
        let mut twice = Vec::new();
        twice.extend_from_slice(&5i64.to_le_bytes());
        twice.extend_from_slice(&[2, 0, 1, 0, 0]);
        assert_eq!(bucket(&twice, 1, 0, &names, &mut bytes), Err("a field twice in a row"));
        // A field count past 64 bits, and one cut short.
        let mut long = 5i64.to_le_bytes().to_vec();
        long.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]);
        assert_eq!(bucket(&long, 1, 0, &names, &mut bytes), Err("a varint past 64 bits"));
        assert_eq!(bucket(&long[..12], 1, 0, &names, &mut bytes), Err("truncated: a varint without its last byte"));
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            (-1000i64..1000).prop_map(|i| Value::F64(i as f64 / 10.0)),
            any::<f64>().prop_filter("NaN is unequal to itself", |v| !v.is_nan()).prop_map(Value::F64),
            any::<i64>().prop_map(Value::I64),
            any::<bool>().prop_map(Value::Bool),
            "[a-c]{0,3}".prop_map(|s| Value::Str(s.into())),
        ]
    }

    fn batch() -> impl Strategy<Value = Vec<Reading>> {
        let field = (prop::sample::select(vec!["a", "b", "c", "d"]), value());
        let reading = (0i64..20, prop::collection::vec(field, 0..4))
            .prop_map(|(ts, fs)| Reading::new(ts, fs.into_iter().map(|(n, v)| (FieldName::from(n), v)).collect()));
        prop::collection::vec(reading, 1..6).prop_map(|mut rs| {
            // A batch's group as the write path leaves it: sorted, one reading a time.
            codec::sort_dedup_last_wins(&mut rs);
            rs
        })
    }

    proptest! {
        /// The bucket of rows appended batch after batch is the merge of the batches' buckets
        /// in the same order, whether the times ascend or not (a second pass); newest is
        /// that merge's newest reading; a translation to other ids changes nothing of it.
        #[test]
        fn rows_make_the_bucket_the_merge_of_their_batches_makes(batches in prop::collection::vec(batch(), 1..5), version in 0u32..3) {
            let ids = FieldIds::default();
            let mut rows = Vec::new();
            let mut operands = Vec::new();
            let mut n = 0;
            for b in &batches {
                RowWriter::default().put(&ids, b, &mut rows);
                n += b.len();
                let mut op = Vec::new();
                codec::encode_versioned(b, version, &mut op);
                operands.push(op);
            }
            let want = codec::merge(operands.iter().map(Vec::as_slice)).unwrap();
            let names = ids.names().clone();
            let mut got = Vec::new();
            let newest_ts = bucket(&rows, n, version, &names, &mut got).unwrap();
            prop_assert_eq!(&got, &want);

            let mut merged = Vec::new();
            codec::decode(&want, &mut merged).unwrap();
            prop_assert_eq!(Some(newest_ts), merged.last().map(|r| r.ts));
            prop_assert_eq!(newest(&rows, &names).unwrap(), merged.last().cloned());

            // Ids of another process: reversed.
            let other: Vec<(FieldName, FieldType)> = names.iter().rev().cloned().collect();
            let last = names.len() as u32 - 1;
            let mut moved = Vec::new();
            let count = translate(&rows, |id| names.get(id as usize).map(|&(_, ty)| (last - id, ty)), &mut moved).unwrap();
            prop_assert_eq!(count, n);
            let mut again = Vec::new();
            bucket(&moved, n, version, &other, &mut again).unwrap();
            prop_assert_eq!(&again, &want);
        }
    }
}
