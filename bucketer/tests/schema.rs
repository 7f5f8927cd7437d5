//! Typed fields, table schemas and schema versions, on real RocksDB files in temp dirs: a schema
//! grows with the fields written, buckets record the version they were written with and every
//! version reads back exactly, strict tables and wrong types send fields to dead letters while
//! the rest of the reading is stored, and all of it survives a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bucketer::schema::Schema;
use bucketer::{codec, Store, StoreConfig, TableSpec};
use model::{DeviceReading, FieldName, FieldType, Hour, PartitionSize, Reading, TimeRange, Value, HOUR_MS};

const T0: i64 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS;

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreConfig::default()).unwrap()
}

fn reading(ts: i64, fields: Vec<(&str, Value)>) -> Reading {
    Reading::new(ts, fields.into_iter().map(|(n, v)| (FieldName::from(n), v)).collect())
}

fn dr(table: &str, device: &str, r: &Reading) -> DeviceReading {
    DeviceReading { table: table.into(), device: device.into(), reading: r.clone() }
}

fn schema_of(store: &Store, table: &str) -> Vec<(String, FieldType, u32)> {
    let s = store.schema(table).unwrap();
    s.fields.iter().map(|f| (f.name.to_string(), f.ty, f.since)).collect()
}

fn all(store: &Store, table: &str, device: &str) -> Vec<Reading> {
    store.read_range(table, device, TimeRange::new(T0 - 10 * HOUR_MS, T0 + 10 * HOUR_MS).unwrap()).unwrap().unwrap()
}

/// The issue's test: write under v1, evolve the schema twice, read all three back with exact
/// values and types — before and after a restart and a full compaction.
#[test]
fn three_schema_versions_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // v1: a float and an integer, in hour 0.
    let v1 = reading(T0, vec![("temp", Value::F64(21.5)), ("status", Value::I64(3))]);
    store.write(vec![dr("fleet", "truck_1", &v1)], &[]).unwrap();
    assert_eq!(store.schema("fleet").unwrap().version, 1);
    // v2: adds a boolean, in hour 1.
    let v2 = reading(
        T0 + HOUR_MS,
        vec![("temp", Value::F64(-0.25)), ("status", Value::I64(i64::MIN)), ("engine_on", Value::Bool(true))],
    );
    store.write(vec![dr("fleet", "truck_1", &v2)], &[]).unwrap();
    // v3: adds a string, in hour 2; a reading without the older fields.
    let v3 = reading(T0 + 2 * HOUR_MS, vec![("driver", Value::from("Zoë \"Z\""))]);
    store.write(vec![dr("fleet", "truck_1", &v3)], &[]).unwrap();
    // A later reading in hour 0 written under v3, merged with the v1 bucket.
    let late = reading(T0 + 1_000, vec![("status", Value::I64(i64::MAX)), ("engine_on", Value::Bool(false))]);
    store.write(vec![dr("fleet", "truck_1", &late)], &[]).unwrap();

    let expected_schema = vec![
        ("driver".to_string(), FieldType::Str, 3),
        ("engine_on".to_string(), FieldType::Bool, 2),
        ("status".to_string(), FieldType::I64, 1),
        ("temp".to_string(), FieldType::F64, 1),
    ];
    let check = |store: &Store| {
        assert_eq!(schema_of(store, "fleet"), expected_schema);
        let s: Schema = store.schema("fleet").unwrap();
        assert_eq!(s.version, 3);
        assert_eq!(s.at_version(1).map(|f| &*f.name).collect::<Vec<_>>(), ["status", "temp"]);
        assert_eq!(s.at_version(2).count(), 3);
        assert_eq!(all(store, "fleet", "truck_1"), [v1.clone(), late.clone(), v2.clone(), v3.clone()]);
        // Each bucket records the schema version it was (last) written with.
        let version = |h: i64| {
            let bytes = store.bucket_bytes("fleet", "truck_1", Hour::of(T0 + h * HOUR_MS)).unwrap().unwrap();
            codec::schema_version(&bytes).unwrap()
        };
        assert_eq!((version(0), version(1), version(2)), (3, 2, 3));
        // Latest is the v3 reading, typed.
        let latest = store.latest("fleet", &["truck_1"]).unwrap().unwrap();
        assert_eq!(latest, [Some(v3.clone())]);
    };
    check(&store);
    drop(store);
    let store = open(dir.path());
    check(&store);
    store.compact().unwrap();
    check(&store);
}

/// A bucket written before the schema existed (hour 0 under version 1) keeps its version, and
/// its readings read back under the newer schema unchanged.
#[test]
fn old_buckets_keep_their_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let a = reading(T0, vec![("a", Value::I64(1))]);
    store.write(vec![dr("t", "d", &a)], &[]).unwrap();
    let b = reading(T0 + HOUR_MS, vec![("a", Value::I64(2)), ("b", Value::from("x"))]);
    store.write(vec![dr("t", "d", &b)], &[]).unwrap();
    let bytes = store.bucket_bytes("t", "d", Hour::of(T0)).unwrap().unwrap();
    assert_eq!(codec::schema_version(&bytes), Ok(1));
    assert_eq!(all(&store, "t", "d"), [a, b]);
}

#[test]
fn wrong_types_and_unknown_fields_go_to_dead_letters_and_the_rest_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let spec = TableSpec {
        partition: PartitionSize::Day,
        hot_retention_ms: None,
        cold_retention_ms: None,
        rollup_retention: bucketer::RollupRetention::FOREVER,
        strict: true,
        fields: vec![
            ("status".into(), FieldType::I64),
            ("temp".into(), FieldType::F64),
            ("on".into(), FieldType::Bool),
        ],
    };
    let (def, created) = store.define_table_with("strict.t", &spec).unwrap();
    assert!(created);
    assert_eq!((def.schema.version, def.schema.strict), (1, true));

    let sent = [
        // A whole float for an i64 field (as JSON sends numbers) is stored as an integer.
        reading(T0, vec![("status", Value::F64(4.0)), ("temp", Value::F64(20.0))]),
        // Wrong types: a fraction for i64, a string for a bool; the float is stored.
        reading(T0 + 1, vec![("status", Value::F64(4.5)), ("temp", Value::F64(21.0)), ("on", Value::from("yes"))]),
        // An unknown field of a strict table; the known one is stored.
        reading(T0 + 2, vec![("speed", Value::F64(88.0)), ("on", Value::Bool(true))]),
        // Nothing valid: the reading is not stored at all.
        reading(T0 + 3, vec![("temp", Value::I64(7))]),
        // A whole float from 2^53 on for an i64 field: JSON's 9007199254740993.0 arrives as this
        // float, which cannot tell which integer was sent; refused, and the detail says why.
        reading(T0 + 4, vec![("status", Value::F64(9_007_199_254_740_992.0)), ("temp", Value::F64(22.0))]),
        // Past the i64 range: no integer to send, no such hint.
        // 2^63, just past the i64 range (a JSON integer one more than i64::MAX arrives so).
        reading(T0 + 5, vec![("status", Value::F64(9_223_372_036_854_775_808.0)), ("temp", Value::F64(23.0))]),
        // JSON's integers from 2^53 on, kept exact: stored exactly for the i64 field, as the
        // nearest float for the f64 one, refused for the bool one and as an unknown field.
        reading(
            T0 + 6,
            vec![
                ("status", Value::UntypedInt(9_007_199_254_740_993)),
                ("temp", Value::UntypedInt(9_007_199_254_740_993)),
                ("on", Value::UntypedInt(-(1 << 60))),
                ("odo", Value::UntypedInt(i64::MAX)),
            ],
        ),
        // -2^63, i64's least as a float, or a JSON integer just below it (it arrives so).
        reading(T0 + 7, vec![("status", Value::F64(-9_223_372_036_854_775_808.0)), ("temp", Value::F64(24.0))]),
    ];
    let summary = store.write(sent.iter().map(|r| dr("strict.t", "d1", r)).collect(), &[]).unwrap();
    assert_eq!((summary.readings, summary.dead_letters), (7, 9));
    assert_eq!(
        all(&store, "strict.t", "d1"),
        [
            reading(T0, vec![("status", Value::I64(4)), ("temp", Value::F64(20.0))]),
            reading(T0 + 1, vec![("temp", Value::F64(21.0))]),
            reading(T0 + 2, vec![("on", Value::Bool(true))]),
            reading(T0 + 4, vec![("temp", Value::F64(22.0))]),
            reading(T0 + 5, vec![("temp", Value::F64(23.0))]),
            reading(
                T0 + 6,
                vec![("status", Value::I64(9_007_199_254_740_993)), ("temp", Value::F64(9_007_199_254_740_992.0))]
            ),
            reading(T0 + 7, vec![("temp", Value::F64(24.0))]),
        ]
    );
    // The schema did not grow.
    assert_eq!(store.schema("strict.t").unwrap().version, 1);

    let mut letters = store.dead_letters(10).unwrap();
    letters.reverse();
    let got: Vec<(&str, &str, &str, &str)> = letters
        .iter()
        .map(|d| (d.reason.as_str(), d.detail.as_str(), d.source.as_str(), std::str::from_utf8(&d.payload).unwrap()))
        .collect();
    let ts = |k: i64| T0 + k;
    let expected = [
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `on` is bool in schema version 1, got string \"yes\"; the \
                 reading's other fields are stored",
                ts(1)
            ),
            format!(r#"{{"device":"d1","ts":{},"on":"yes"}}"#, ts(1)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `status` is i64 in schema version 1, got f64 4.5; the \
                 reading's other fields are stored",
                ts(1)
            ),
            format!(r#"{{"device":"d1","ts":{},"status":4.5}}"#, ts(1)),
        ),
        (
            "unknown_field",
            format!(
                "table `strict.t` device `d1` ts {}: the table is strict and schema version 1 has no field `speed` \
                 (got f64 88); the reading's other fields are stored",
                ts(2)
            ),
            format!(r#"{{"device":"d1","ts":{},"speed":88.0}}"#, ts(2)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `temp` is f64 in schema version 1, got i64 7; the \
                 reading has no other field",
                ts(3)
            ),
            format!(r#"{{"device":"d1","ts":{},"temp":7}}"#, ts(3)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `status` is i64 in schema version 1, got f64 \
                 9007199254740992 (a float from ±2^53 on may not be the integer sent: send it as an integer, in \
                 JSON without fraction or exponent, in line protocol as `…i`); the reading's other fields are stored",
                ts(4)
            ),
            format!(r#"{{"device":"d1","ts":{},"status":9007199254740992.0}}"#, ts(4)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `status` is i64 in schema version 1, got f64 \
                 9223372036854775808 (outside the i64 range, -9223372036854775808 to 9223372036854775807: no \
                 integer this large fits the field); the reading's other fields are stored",
                ts(5)
            ),
            // The payload is the reading as the store read it: the float, in its exact digits.
            format!(r#"{{"device":"d1","ts":{},"status":9223372036854775808.0}}"#, ts(5)),
        ),
        (
            "unknown_field",
            format!(
                "table `strict.t` device `d1` ts {}: the table is strict and schema version 1 has no field `odo` \
                 (got integer 9223372036854775807); the reading's other fields are stored",
                ts(6)
            ),
            format!(r#"{{"device":"d1","ts":{},"odo":9223372036854775807}}"#, ts(6)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `on` is bool in schema version 1, got integer \
                 -1152921504606846976; the reading's other fields are stored",
                ts(6)
            ),
            format!(r#"{{"device":"d1","ts":{},"on":-1152921504606846976}}"#, ts(6)),
        ),
        (
            "wrong_field_type",
            format!(
                "table `strict.t` device `d1` ts {}: field `status` is i64 in schema version 1, got f64 \
                 -9223372036854775808 (a float: sent as an integer, in JSON without fraction or exponent, in line \
                 protocol as `…i`, -9223372036854775808 fits the field; a JSON integer below it, outside the i64 \
                 range, arrives as this float); the reading's other fields are stored",
                ts(7)
            ),
            format!(r#"{{"device":"d1","ts":{},"status":-9223372036854775808.0}}"#, ts(7)),
        ),
    ];
    let expected: Vec<(&str, &str, &str, &str)> =
        expected.iter().map(|(r, d, p)| (*r, d.as_str(), "schema of table strict.t", p.as_str())).collect();
    assert_eq!(got, expected);
    let counted = |reason: model::DeadLetterReason| {
        let i = model::DeadLetterReason::ALL.iter().position(|r| *r == reason).unwrap();
        store.stats().dead_letters[i].load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(counted(model::DeadLetterReason::WrongFieldType), 7);
    assert_eq!(counted(model::DeadLetterReason::UnknownField), 2);
}

/// JSON's integers from 2^53 on (untyped, exact) in a table that is not strict: a new field
/// they bring is `f64`, as any JSON number's, and holds the nearest float; once a definition
/// declares a field `i64`, they are stored exactly, in the buckets and in `latest`.
#[test]
fn untyped_integers_take_the_type_of_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let big = 9_007_199_254_740_993; // 2^53 + 1: no f64 holds it
    let first = reading(T0, vec![("uptime_ns", Value::UntypedInt(big)), ("v", Value::F64(1.5))]);
    let summary = store.write(vec![dr("t", "d", &first)], &[]).unwrap();
    assert_eq!((summary.readings, summary.dead_letters), (1, 0));
    assert_eq!(
        schema_of(&store, "t"),
        [("uptime_ns".to_string(), FieldType::F64, 1), ("v".to_string(), FieldType::F64, 1)]
    );
    let as_float = reading(T0, vec![("uptime_ns", Value::F64(9_007_199_254_740_992.0)), ("v", Value::F64(1.5))]);
    assert_eq!(all(&store, "t", "d"), std::slice::from_ref(&as_float));

    let spec = TableSpec { fields: vec![("boot_ns".into(), FieldType::I64)], ..TableSpec::default() };
    let (def, created) = store.define_table_with("t", &spec).unwrap();
    assert_eq!((created, def.schema.version), (false, 2));
    let later = [
        reading(T0 + 1, vec![("boot_ns", Value::UntypedInt(big)), ("uptime_ns", Value::UntypedInt(-big))]),
        reading(T0 + 2, vec![("boot_ns", Value::UntypedInt(i64::MIN)), ("uptime_ns", Value::F64(2.0))]),
    ];
    let summary = store.write(later.iter().map(|r| dr("t", "d", r)).collect(), &[]).unwrap();
    assert_eq!((summary.readings, summary.dead_letters), (2, 0));
    let stored = [
        as_float,
        reading(T0 + 1, vec![("boot_ns", Value::I64(big)), ("uptime_ns", Value::F64(-9_007_199_254_740_992.0))]),
        reading(T0 + 2, vec![("boot_ns", Value::I64(i64::MIN)), ("uptime_ns", Value::F64(2.0))]),
    ];
    assert_eq!(all(&store, "t", "d"), stored);
    assert_eq!(store.latest("t", &["d"]).unwrap().unwrap(), [Some(stored[2].clone())]);
    assert_eq!(store.schema("t").unwrap().version, 2);
}

/// The dead letter of a field the schema refuses names the message the reading came from
/// (`write_retrying`'s sources, runs of readings), and the schema where none is known.
#[test]
fn refused_fields_name_the_source_of_their_reading() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.write(vec![dr("src.t", "d", &reading(T0, vec![("v", Value::F64(1.0))]))], &[]).unwrap();
    let readings: Vec<DeviceReading> = [true, false, true, true, true]
        .iter()
        .enumerate()
        .map(|(i, &bad)| {
            let v = if bad { Value::Bool(true) } else { Value::F64(2.0) };
            dr("src.t", "d", &reading(T0 + 1 + i as i64, vec![("v", v), ("w", Value::F64(i as f64))]))
        })
        .collect();
    let sources = [(1, "kafka:t/0@7".to_string()), (3, "kafka:t/1@2".to_string())];
    let summary = store.write_retrying(readings, &sources, Vec::new(), &[], &[], |_, _| None).unwrap();
    assert_eq!((summary.readings, summary.dead_letters), (5, 4));
    let mut letters = store.dead_letters(10).unwrap();
    letters.reverse();
    let got: Vec<(&str, &[u8])> = letters.iter().map(|d| (d.source.as_str(), &d.payload[..])).collect();
    let payload = |i: i64| format!(r#"{{"device":"d","ts":{},"v":true}}"#, T0 + 1 + i).into_bytes();
    let (p0, p2, p3, p4) = (payload(0), payload(2), payload(3), payload(4));
    let expected: [(&str, &[u8]); 4] =
        [("schema of table src.t", &p0), ("kafka:t/0@7", &p2), ("kafka:t/1@2", &p3), ("kafka:t/1@2", &p4)];
    assert_eq!(got, expected);
    // The readings' other fields are stored.
    assert_eq!(all(&store, "src.t", "d").len(), 6);
}

#[test]
fn definitions_declare_fields_and_refuse_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let spec = |strict: bool, fields: &[(&str, FieldType)]| TableSpec {
        strict,
        fields: fields.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
        ..TableSpec::default()
    };
    let (def, created) = store.define_table_with("t", &spec(false, &[("a", FieldType::I64)])).unwrap();
    assert_eq!((created, def.schema.version), (true, 1));
    // The same again: nothing changes.
    let (def, created) = store.define_table_with("t", &spec(false, &[("a", FieldType::I64)])).unwrap();
    assert_eq!((created, def.schema.version), (false, 1));
    // A new declared field: a new version.
    let (def, created) = store.define_table_with("t", &spec(false, &[("b", FieldType::Str)])).unwrap();
    assert_eq!((created, def.schema.version), (false, 2));
    // Another type for a field: a conflict naming both.
    let err = store.define_table_with("t", &spec(false, &[("a", FieldType::F64)])).unwrap_err();
    assert_eq!(err.to_string(), "table `t` has field `a` of type i64; the request declares it f64");
    // Another strictness: the table exists with other settings.
    let err = store.define_table_with("t", &spec(true, &[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
                "table `t` already exists with partition day, no hot retention (kept forever), not strict; the request asks \
             for partition day, no hot retention (kept forever), strict ({})",
            bucketer::catalog::FIXED_AT_CREATION
        )
    );
    let strict = store.define_table_with("s", &spec(true, &[])).map(|_| ());
    assert!(strict.is_ok(), "{strict:?}");
    assert_eq!(
        store.define_table_with("s", &spec(false, &[])).unwrap_err().to_string(),
        format!(
                "table `s` already exists with partition day, no hot retention (kept forever), strict; the request asks for \
             partition day, no hot retention (kept forever), not strict ({})",
            bucketer::catalog::FIXED_AT_CREATION
        )
    );
    // A write of a declared i64 field with a whole float is an integer; a new field is version 3.
    let r = reading(T0, vec![("a", Value::F64(-2.0)), ("c", Value::Bool(true))]);
    store.write(vec![dr("t", "d", &r)], &[]).unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(
        schema_of(&store, "t"),
        [
            ("a".to_string(), FieldType::I64, 1),
            ("b".to_string(), FieldType::Str, 2),
            ("c".to_string(), FieldType::Bool, 3)
        ]
    );
    assert_eq!(all(&store, "t", "d"), [reading(T0, vec![("a", Value::I64(-2)), ("c", Value::Bool(true))])]);
    let def = store.table_definition("t").unwrap();
    assert_eq!((def.schema.version, def.schema.strict), (3, false));
}

/// Polymorphic devices: two kinds of device with different field sets share a table; each
/// reading comes back with exactly the fields it was written with.
#[test]
fn devices_of_two_kinds_share_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let truck: Vec<Reading> = (0..3)
        .map(|i| reading(T0 + i * 10_000, vec![("speed", Value::F64(50.0 + i as f64)), ("gear", Value::I64(i + 1))]))
        .collect();
    let fridge: Vec<Reading> = (0..3)
        .map(|i| reading(T0 + i * 10_000, vec![("door_open", Value::Bool(i == 1)), ("temp", Value::F64(-18.5))]))
        .collect();
    let mut batch: Vec<DeviceReading> = truck.iter().map(|r| dr("site", "truck_1", r)).collect();
    batch.extend(fridge.iter().map(|r| dr("site", "fridge_1", r)));
    // Both kinds in one bucket hour and one batch, plus a truck reading without its gear.
    let odd = reading(T0 + 40_000, vec![("speed", Value::F64(0.0))]);
    batch.push(dr("site", "truck_1", &odd));
    store.write(batch, &[]).unwrap();
    let mut truck_all = truck.clone();
    truck_all.push(odd);
    assert_eq!(all(&store, "site", "truck_1"), truck_all);
    assert_eq!(all(&store, "site", "fridge_1"), fridge);
    assert_eq!(store.schema("site").unwrap().fields.len(), 4);
}
