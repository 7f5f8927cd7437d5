//! Table schemas: which fields a table has and their types, the schema's version, and the
//! check every reading passes on the write path.
//!
//! A [`Schema`] maps field names to [`FieldType`]s and remembers the version that added each
//! field, so the schema of every version ever in force can be told ([`Schema::at_version`]).
//! Version 0 is the empty schema of a table that has stored nothing yet (and of tables created
//! before schemas existed). Each change adds fields — never removes one or changes a type —
//! and raises the version by one: the first write that brings new fields, or a definition that
//! declares them ([`crate::Store::define_table_with`]). All new fields of one WriteBatch share
//! one new version.
//!
//! [`check_reading`] is the write path's check, pure and in memory: a field the schema has
//! must come with a value of its type (a float that is a whole number below ±2^53 is taken
//! for an `i64` field, as JSON has no integers of its own, and so is a [`Value::UntypedInt`],
//! JSON's integer from ±2^53 on, exactly; for an `f64` field that becomes the nearest float);
//! a field it lacks is added, unless the table is `strict` (an `UntypedInt` as the `f64` field
//! any JSON number makes). What fails is cut out of the reading and reported, and the rest of
//! the reading is stored. The persisted form of a schema is part of the table definition (see
//! [`crate::catalog`]); this module owns no bytes.
//!
//! ```
//! use bucketer::schema::{check_reading, Rejection, Schema};
//! use model::{FieldType, Reading, Value};
//!
//! let mut schema = Schema::default();
//! let mut r = Reading::new(0, vec![("status".into(), Value::I64(3)), ("temp".into(), Value::F64(21.5))]);
//! assert!(check_reading(&mut schema, 1, &mut r).is_empty());
//! assert_eq!((schema.version, schema.field("status").map(|f| f.ty)), (1, Some(FieldType::I64)));
//!
//! let mut wrong = Reading::new(1, vec![("status".into(), Value::from("ok")), ("temp".into(), Value::F64(22.0))]);
//! let rejected = check_reading(&mut schema, 2, &mut wrong);
//! assert!(matches!(&rejected[..], [Rejection::WrongType { expected: FieldType::I64, .. }]));
//! assert_eq!(wrong, Reading::new(1, vec![("temp".into(), 22.0)]));
//! ```

use std::sync::Arc;

use model::{FieldName, FieldType, Reading, Value};

/// The bound of the magnitudes of the floats taken as `i64` values: 2^53, itself excluded. An
/// integer text below it parses to exactly its integer; 2^53 is also what 2^53 + 1 parses to,
/// so taking it would change such a value unseen. (A text with a fraction from 2^52 on parses
/// to a whole float too, and is taken as that integer: the float cannot tell, only the text.)
/// From it on, JSON's integers arrive untyped ([`model::UNTYPED_INT_FROM`]).
pub const MAX_EXACT_INT: f64 = model::UNTYPED_INT_FROM as f64;

/// The most fields a table's schema takes: past it, a field the schema lacks is refused as in a
/// strict table ([`Rejection::Full`]). Unbounded, one device naming fields by a serial number
/// or a time grew a table to 200,000 fields in 40 messages, and every roll-up record of an
/// hour holds each of its fields (the table's record, about 160 bytes a field, all of them).
pub const MAX_FIELDS_PER_TABLE: usize = 10_000;

/// One field of a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaField {
    /// Field name.
    pub name: FieldName,
    /// Its type, fixed for good once added.
    pub ty: FieldType,
    /// The schema version that added it.
    pub since: u32,
}

/// A table's fields and their types, with its version and whether it is closed to new fields.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schema {
    /// Raised by one with each change; 0 for the empty schema.
    pub version: u32,
    /// A strict table refuses fields its schema lacks instead of adding them.
    pub strict: bool,
    /// Sorted by name, each name once.
    pub fields: Vec<SchemaField>,
}

impl Schema {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&SchemaField> {
        self.fields.binary_search_by(|f| (*f.name).cmp(name)).ok().map(|i| &self.fields[i])
    }

    /// The fields of the schema as it was at version `version`.
    pub fn at_version(&self, version: u32) -> impl Iterator<Item = &SchemaField> {
        self.fields.iter().filter(move |f| f.since <= version)
    }

    /// Adds field `name` of type `ty` as part of version `version` (which the caller has made
    /// the schema's version). The name must not be in the schema yet.
    pub fn add(&mut self, name: FieldName, ty: FieldType, version: u32) {
        match self.fields.binary_search_by(|f| f.name.cmp(&name)) {
            Ok(_) => debug_assert!(false, "field `{name}` added twice"),
            Err(at) => self.fields.insert(at, SchemaField { name, ty, since: version }),
        }
    }

    /// Whether every field of `fields` is in the schema with the type of its value: the case of
    /// nearly every reading, answered without changing anything. A [`Value::UntypedInt`] has
    /// no type yet, so a reading with one is left to [`check_reading`].
    #[inline]
    pub fn admits(&self, fields: &[(FieldName, Value)]) -> bool {
        // Both are sorted by name: one pass over the schema. A schema field added from a
        // reading shares that reading's name, and sources share names between readings, so
        // most names match by pointer without comparing their bytes.
        let mut schema = self.fields.iter();
        fields.iter().all(|(name, value)| {
            schema
                .by_ref()
                .find(|f| Arc::ptr_eq(&f.name, name) || f.name >= *name)
                .is_some_and(|f| (Arc::ptr_eq(&f.name, name) || f.name == *name) && Some(f.ty) == value.typed())
        })
    }
}

/// The field names (by pointer) and types of a reading a schema admitted: a reading with the
/// very same names, of the same types, is admitted by that schema too.
#[derive(Debug)]
pub(crate) struct SameFields(Vec<(FieldName, FieldType)>);

impl SameFields {
    pub(crate) fn of(reading: &Reading) -> SameFields {
        SameFields(reading.fields.iter().map(|(n, v)| (Arc::clone(n), v.field_type())).collect())
    }

    /// Whether `reading` has exactly these fields: the same name `Arc`s, the same types.
    #[inline]
    pub(crate) fn admit(&self, reading: &Reading) -> bool {
        self.0.len() == reading.fields.len()
            && self.0.iter().zip(&reading.fields).all(|((n, t), (m, v))| Arc::ptr_eq(n, m) && Some(*t) == v.typed())
    }
}

/// By table, the fields of the last reading its schema admitted ([`SameFields`]): a source's
/// readings of a table share their field names, so the next ones are admitted by pointer,
/// without comparing names. For schemas that do not change while it is used.
#[derive(Debug, Default)]
pub(crate) struct AdmittedFields(Vec<(u32, SameFields)>);

impl AdmittedFields {
    /// Whether table `table`'s schema (`schema`, asked for only when the reading's fields are
    /// not the ones admitted last) admits `reading`.
    pub(crate) fn admits<'s>(&mut self, table: u32, schema: impl FnOnce() -> &'s Schema, reading: &Reading) -> bool {
        if self.0.iter().any(|(id, fields)| *id == table && fields.admit(reading)) {
            return true;
        }
        if !schema().admits(&reading.fields) {
            return false;
        }
        let fields = SameFields::of(reading);
        match self.0.iter_mut().find(|(id, _)| *id == table) {
            Some((_, last)) => *last = fields,
            None => self.0.push((table, fields)),
        }
        true
    }
}

/// A field cut out of a reading by [`check_reading`].
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// The value's type is not the field's.
    WrongType {
        /// Field name.
        name: FieldName,
        /// The value sent.
        value: Value,
        /// The type the schema gives the field.
        expected: FieldType,
    },
    /// The table is strict and its schema has no such field.
    Unknown {
        /// Field name.
        name: FieldName,
        /// The value sent.
        value: Value,
    },
    /// The schema has no such field and [`MAX_FIELDS_PER_TABLE`] already: the first such field
    /// of a reading, with the count of the others (one dead letter for a reading, not one for
    /// each of its thousands of fields).
    Full {
        /// Field name.
        name: FieldName,
        /// The value sent.
        value: Value,
        /// The reading's other fields refused so.
        more: usize,
    },
}

impl Rejection {
    /// The field's name.
    pub fn name(&self) -> &FieldName {
        match self {
            Rejection::WrongType { name, .. } | Rejection::Unknown { name, .. } | Rejection::Full { name, .. } => name,
        }
    }

    /// The value sent.
    pub fn value(&self) -> &Value {
        match self {
            Rejection::WrongType { value, .. } | Rejection::Unknown { value, .. } | Rejection::Full { value, .. } => {
                value
            }
        }
    }
}

/// Checks `reading` against `schema`, changing both as the module documentation says: fields
/// the schema lacks are added as part of version `next_version` (which becomes the schema's
/// version; pass the same one for every reading of a batch) unless the schema is strict, whole
/// floats sent for `i64` fields become integers, [`Value::UntypedInt`]s become `I64` or `F64`
/// values, and fields that fail are removed from the reading and returned. The reading may be
/// left with no field.
pub fn check_reading(schema: &mut Schema, next_version: u32, reading: &mut Reading) -> Vec<Rejection> {
    if schema.admits(&reading.fields) {
        return Vec::new();
    }
    let mut rejected = Vec::new();
    let fields = std::mem::take(&mut reading.fields);
    let mut kept = Vec::with_capacity(fields.len());
    let mut full = None;
    for (name, value) in fields {
        match schema.field(&name).map(|f| f.ty) {
            Some(ty) if Some(ty) == value.typed() => kept.push((name, value)),
            Some(FieldType::I64) => match value {
                Value::UntypedInt(v) => kept.push((name, Value::I64(v))),
                Value::F64(v) if v.fract() == 0.0 && v.abs() < MAX_EXACT_INT => {
                    kept.push((name, Value::I64(v as i64)));
                }
                value => rejected.push(Rejection::WrongType { name, value, expected: FieldType::I64 }),
            },
            Some(FieldType::F64) if matches!(value, Value::UntypedInt(_)) => kept.push((name, typed_float(value))),
            Some(expected) => rejected.push(Rejection::WrongType { name, value, expected }),
            None if schema.strict => rejected.push(Rejection::Unknown { name, value }),
            None if schema.fields.len() >= MAX_FIELDS_PER_TABLE => match full.as_mut() {
                Some(Rejection::Full { more, .. }) => *more += 1,
                _ => full = Some(Rejection::Full { name, value, more: 0 }),
            },
            None => {
                schema.version = next_version;
                schema.add(name.clone(), value.field_type(), next_version);
                kept.push((name, typed_float(value)));
            }
        }
    }
    reading.fields = kept;
    rejected.extend(full);
    rejected
}

/// `value`, an [`Value::UntypedInt`] as the nearest `f64` (what it is unless a field is `i64`).
fn typed_float(value: Value) -> Value {
    match value {
        Value::UntypedInt(v) => Value::F64(v as f64),
        value => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(fields: Vec<(&str, Value)>) -> Reading {
        Reading::new(5, fields.into_iter().map(|(n, v)| (FieldName::from(n), v)).collect())
    }

    /// A table with [`MAX_FIELDS_PER_TABLE`] fields adds no more: a new one is cut out, the
    /// known ones are kept.
    #[test]
    fn a_full_table_adds_no_field() {
        let mut s = Schema::default();
        for i in 0..MAX_FIELDS_PER_TABLE - 1 {
            s.add(format!("f{i:05}").as_str().into(), FieldType::F64, 1);
        }
        let mut r = reading(vec![
            ("f00001", Value::F64(1.0)),
            ("new_a", Value::F64(2.0)),
            ("new_b", Value::I64(3)),
            ("new_c", Value::F64(4.0)),
            ("new_d", Value::F64(5.0)),
        ]);
        let rejected = check_reading(&mut s, 2, &mut r);
        assert_eq!(s.fields.len(), MAX_FIELDS_PER_TABLE);
        assert_eq!(rejected, vec![Rejection::Full { name: "new_b".into(), value: Value::I64(3), more: 2 }]);
        assert_eq!(r.fields, vec![("f00001".into(), Value::F64(1.0)), ("new_a".into(), Value::F64(2.0))]);
        assert!(s.field("new_a").is_some() && s.field("new_b").is_none());
    }

    #[test]
    fn same_fields_admits_only_the_same_names_by_pointer_and_the_same_types() {
        let (a, b): (FieldName, FieldName) = ("a".into(), "b".into());
        let admitted = Reading::new(1, vec![(a.clone(), Value::F64(1.0)), (b.clone(), Value::I64(2))]);
        let same = SameFields::of(&admitted);
        let with = |fields: Vec<(FieldName, Value)>| same.admit(&Reading::new(2, fields));
        assert!(with(vec![(a.clone(), Value::F64(3.0)), (b.clone(), Value::I64(4))]));
        // Equal names in other `Arc`s: not known this way (the schema compares them instead).
        assert!(!with(vec![("a".into(), Value::F64(3.0)), (b.clone(), Value::I64(4))]));
        assert!(!with(vec![(a.clone(), Value::F64(3.0)), (b.clone(), Value::F64(4.0))]));
        assert!(!with(vec![(a.clone(), Value::F64(3.0))]));
        assert!(!with(vec![(a.clone(), Value::F64(3.0)), (b, Value::I64(4)), ("c".into(), Value::Bool(true))]));
    }

    #[test]
    fn new_fields_are_added_under_one_version_per_batch() {
        let mut s = Schema::default();
        let mut a = reading(vec![("b", Value::Bool(true)), ("a", Value::F64(1.0))]);
        let mut b = reading(vec![("c", Value::from("x")), ("a", Value::F64(2.0))]);
        assert!(check_reading(&mut s, 1, &mut a).is_empty());
        assert!(check_reading(&mut s, 1, &mut b).is_empty());
        let got: Vec<(&str, FieldType, u32)> = s.fields.iter().map(|f| (&*f.name, f.ty, f.since)).collect();
        assert_eq!(got, [("a", FieldType::F64, 1), ("b", FieldType::Bool, 1), ("c", FieldType::Str, 1)]);
        assert_eq!(s.version, 1);
        let mut c = reading(vec![("d", Value::I64(1))]);
        assert!(check_reading(&mut s, 2, &mut c).is_empty());
        assert_eq!(s.version, 2);
        assert_eq!(s.at_version(1).count(), 3);
        assert_eq!(s.at_version(2).map(|f| &*f.name).collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        assert_eq!(s.at_version(0).count(), 0);
    }

    #[test]
    fn wrong_types_and_unknown_fields_of_strict_tables_are_cut_out() {
        let mut s = Schema::default();
        for (name, ty) in [("i", FieldType::I64), ("f", FieldType::F64), ("s", FieldType::Str)] {
            s.add(name.into(), ty, 1);
        }
        s.version = 1;
        s.strict = true;
        let mut r = reading(vec![
            ("i", Value::F64(3.0)),
            ("f", Value::I64(3)),
            ("s", Value::from("ok")),
            ("new", Value::Bool(false)),
        ]);
        let rejected = check_reading(&mut s, 2, &mut r);
        assert_eq!(
            rejected,
            [
                Rejection::WrongType { name: "f".into(), value: Value::I64(3), expected: FieldType::F64 },
                Rejection::Unknown { name: "new".into(), value: Value::Bool(false) },
            ]
        );
        // The whole float became an integer; the schema did not change.
        assert_eq!(r, reading(vec![("i", Value::I64(3)), ("s", Value::from("ok"))]));
        assert_eq!(s.version, 1);
        // Fractions, and whole floats from 2^53 on, are no i64: 2^53 is what JSON's
        // 9007199254740993 parses to, which would be stored changed.
        let sent_2_53_plus_1: f64 = "9007199254740993".parse().unwrap_or_default();
        assert_eq!(sent_2_53_plus_1, MAX_EXACT_INT);
        for v in [2.5, 1e300, f64::NAN, f64::INFINITY, MAX_EXACT_INT * 2.0, MAX_EXACT_INT, -MAX_EXACT_INT] {
            let mut r = reading(vec![("i", Value::F64(v))]);
            assert_eq!(check_reading(&mut s, 2, &mut r).len(), 1, "{v}");
            assert!(r.fields.is_empty());
        }
        for (v, i) in [(MAX_EXACT_INT - 1.0, 9_007_199_254_740_991), (1.0 - MAX_EXACT_INT, -9_007_199_254_740_991)] {
            let mut edge = reading(vec![("i", Value::F64(v))]);
            assert!(check_reading(&mut s, 2, &mut edge).is_empty());
            assert_eq!(edge.get("i"), Some(&Value::I64(i)));
        }
    }

    #[test]
    fn untyped_integers_are_never_admitted_and_take_their_fields_type() {
        let mut s = Schema::default();
        for (name, ty) in [("i", FieldType::I64), ("f", FieldType::F64), ("b", FieldType::Bool)] {
            s.add(name.into(), ty, 1);
        }
        s.version = 1;
        let big = 1 << 60;
        for name in ["i", "f", "b"] {
            assert!(!s.admits(&reading(vec![(name, Value::UntypedInt(big))]).fields), "{name}");
        }
        let mut r = reading(vec![
            ("b", Value::UntypedInt(big)),
            ("f", Value::UntypedInt(big + 1)),
            ("i", Value::UntypedInt(big + 1)),
            ("new", Value::UntypedInt(-big - 1)),
        ]);
        let rejected = check_reading(&mut s, 2, &mut r);
        assert_eq!(
            rejected,
            [Rejection::WrongType { name: "b".into(), value: Value::UntypedInt(big), expected: FieldType::Bool }]
        );
        // The f64s nearest to 2^60 + 1 and -(2^60 + 1) are ±2^60.
        assert_eq!(
            r,
            reading(vec![("f", Value::F64(big as f64)), ("i", Value::I64(big + 1)), ("new", Value::F64(-big as f64)),])
        );
        assert_eq!((s.version, s.field("new").map(|f| f.ty)), (2, Some(FieldType::F64)));
        // Once typed, the reading is admitted as it is.
        assert!(s.admits(&r.fields));
    }

    #[test]
    fn admits_needs_every_field_with_its_type() {
        let mut s = Schema::default();
        s.add("b".into(), FieldType::F64, 1);
        s.add("d".into(), FieldType::Bool, 1);
        let f = |fs: Vec<(&str, Value)>| reading(fs).fields;
        assert!(s.admits(&f(vec![("b", Value::F64(1.0))])));
        assert!(s.admits(&f(vec![("b", Value::F64(1.0)), ("d", Value::Bool(true))])));
        assert!(s.admits(&[]));
        assert!(!s.admits(&f(vec![("a", Value::F64(1.0))])));
        assert!(!s.admits(&f(vec![("c", Value::F64(1.0))])));
        assert!(!s.admits(&f(vec![("e", Value::F64(1.0))])));
        assert!(!s.admits(&f(vec![("d", Value::F64(1.0))])));
    }
}
