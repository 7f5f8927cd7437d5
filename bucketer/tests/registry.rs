//! The device registry on real RocksDB in temp dirs: records, the tag index, the group
//! hierarchy, index maintenance across updates and reopens, cursor paging, and `find_devices`
//! against an in-memory model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "util/logged.rs"]
mod logged;

use bucketer::{DeviceFilter, DevicePage, DeviceRecord, Error, Store, StoreConfig};
use model::{DeviceReading, Reading};
use proptest::prelude::*;

fn open(dir: &Path) -> Store {
    Store::open(dir, StoreConfig::default()).unwrap()
}

fn write(store: &Store, table: &str, devices: &[&str]) {
    let batch = devices
        .iter()
        .map(|d| DeviceReading {
            table: table.into(),
            device: (*d).into(),
            reading: Reading::new(1_000, vec![("x".into(), 1.0)]),
        })
        .collect();
    store.write(batch, &[]).unwrap();
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn tag(k: &str, v: &str) -> DeviceFilter {
    DeviceFilter { tag: Some((k.into(), v.into())), ..DeviceFilter::default() }
}

fn under(p: &str) -> DeviceFilter {
    DeviceFilter { under: Some(p.into()), ..DeviceFilter::default() }
}

/// Every device of a filter, one page of `limit` at a time, following the cursors.
fn all_pages(store: &Store, table: &str, filter: &DeviceFilter, limit: usize) -> (Vec<String>, usize) {
    let (mut out, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let page = store.find_devices(table, filter, cursor.as_deref(), limit).unwrap().unwrap();
        assert!(page.devices.len() <= limit);
        pages += 1;
        out.extend(page.devices);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return (out, pages),
        }
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A device first seen in a write puts its name and id entries and no record (it reads as the
/// empty one: see the test above); a record is stored once one is set.
#[test]
fn a_write_registers_a_device_without_a_record() {
    use bucketer::keys::{device_id_key, device_record_key, name_key};
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        write(&store, "fleet", &["truck_1", "truck_2"]);
        store.set_device("truck_2", None, BTreeMap::new(), None).unwrap();
        assert_eq!(
            store.device_record("truck_1").unwrap(),
            Some(DeviceRecord { name: "truck_1".into(), ..DeviceRecord::default() })
        );
        // As a clean shutdown does: memtables to SST files, which a plain RocksDB opens below.
        store.flush().unwrap();
    }
    // The registry's keys, read from the closed store's files.
    let opts = rocksdb::Options::default();
    let cfs = rocksdb::DB::list_cf(&opts, dir.path()).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&opts, dir.path(), &cfs, false).unwrap();
    let registry = db.cf_handle(bucketer::store::CF_REGISTRY).unwrap();
    let stored: BTreeSet<Vec<u8>> =
        db.iterator_cf(registry, rocksdb::IteratorMode::Start).map(|kv| kv.unwrap().0.to_vec()).collect();
    let expected: BTreeSet<Vec<u8>> = [
        name_key("truck_1"),
        name_key("truck_2"),
        device_id_key(0).to_vec(),
        device_id_key(1).to_vec(),
        device_record_key(1).to_vec(),
    ]
    .into_iter()
    .collect();
    assert_eq!(stored, expected);
}

#[test]
fn records_start_empty_and_hold_kind_tags_and_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    write(&store, "fleet", &["truck_1"]);
    assert_eq!(
        store.device_record("truck_1").unwrap(),
        Some(DeviceRecord { name: "truck_1".into(), ..DeviceRecord::default() })
    );
    assert_eq!(store.device_record("nobody").unwrap(), None);

    let rec = store.set_device("truck_1", Some("truck"), tags(&[("model", "x9")]), Some("site_z/line_3")).unwrap();
    let expected = DeviceRecord {
        name: "truck_1".into(),
        kind: Some("truck".into()),
        tags: tags(&[("model", "x9")]),
        parent: Some("site_z/line_3".into()),
        ancestors: names(&["site_z", "site_z/line_3"]),
    };
    assert_eq!(rec, expected);
    assert_eq!(store.device_record("truck_1").unwrap(), Some(expected));
    assert_eq!(store.device_id("truck_1"), Some(0));

    // A new name is registered by set_device and keeps its id when data arrives later.
    store.set_device("pump_7", None, BTreeMap::new(), None).unwrap();
    assert_eq!(store.device_id("pump_7"), Some(1));
    write(&store, "fleet", &["pump_7", "truck_2"]);
    assert_eq!(store.device_id("pump_7"), Some(1));
    assert_eq!(store.device_id("truck_2"), Some(2));
    assert_eq!(store.device_count(), 3);

    // Bad input is refused and changes nothing.
    for (kind, t, parent) in [
        (Some("bad kind"), tags(&[]), None),
        (None, tags(&[("k:x", "v")]), None),
        (None, tags(&[("k", "")]), None),
        (None, tags(&[]), Some("a//b")),
        (None, tags(&[]), Some("/a")),
    ] {
        let err = store.set_device("truck_1", kind, t, parent).unwrap_err();
        assert!(matches!(err, Error::InvalidRegistryInput(_)), "{err}");
    }
    assert_eq!(store.device_record("truck_1").unwrap().unwrap().kind.as_deref(), Some("truck"));
}

#[test]
fn tag_index_and_hierarchy_answer_in_name_order_and_follow_updates_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        write(&store, "fleet", &["d1", "d2", "d3", "d4", "d5"]);
        write(&store, "other", &["o1"]);
        store.set_device("d3", Some("pump"), tags(&[("color", "red"), ("size", "l")]), Some("site_z/line_3")).unwrap();
        store.set_device("d1", None, tags(&[("color", "red")]), Some("site_z/line_3/cell_1")).unwrap();
        store.set_device("d2", None, tags(&[("color", "blue")]), Some("site_z")).unwrap();
        store.set_device("d4", None, tags(&[]), Some("site_y/line_3")).unwrap();
        store.set_device("o1", None, tags(&[("color", "red")]), Some("site_z")).unwrap();

        let find = |f: &DeviceFilter| store.find_devices("fleet", f, None, 100).unwrap().unwrap().devices;
        assert_eq!(find(&tag("color", "red")), names(&["d1", "d3"]));
        assert_eq!(find(&tag("color", "blue")), names(&["d2"]));
        assert_eq!(find(&tag("color", "green")), names(&[]));
        assert_eq!(find(&under("site_z")), names(&["d1", "d2", "d3"]));
        assert_eq!(find(&under("site_z/line_3")), names(&["d1", "d3"]));
        assert_eq!(find(&under("site_z/line_3/cell_1")), names(&["d1"]));
        // `line_3` of another site is another node.
        assert_eq!(find(&under("site_y/line_3")), names(&["d4"]));
        assert_eq!(find(&under("site")), names(&[]));
        assert_eq!(
            find(&DeviceFilter {
                tag: Some(("color".into(), "red".into())),
                under: Some("site_z/line_3/cell_1".into()),
                parent: None,
            }),
            names(&["d1"])
        );
        assert_eq!(find(&DeviceFilter::default()), names(&["d1", "d2", "d3", "d4", "d5"]));
        // `o1` has no data in `fleet`.
        assert_eq!(
            store.find_devices("other", &tag("color", "red"), None, 100).unwrap().unwrap().devices,
            names(&["o1"])
        );
        assert_eq!(store.find_devices("nope", &tag("color", "red"), None, 100).unwrap(), None);

        // Move d3 to another site and retag it; d1 loses its tags and place.
        store.set_device("d3", Some("pump"), tags(&[("color", "blue")]), Some("site_y")).unwrap();
        store.set_device("d1", None, tags(&[]), None).unwrap();
        assert_eq!(find(&tag("color", "red")), names(&[]));
        assert_eq!(find(&tag("size", "l")), names(&[]));
        assert_eq!(find(&tag("color", "blue")), names(&["d2", "d3"]));
        assert_eq!(find(&under("site_z")), names(&["d2"]));
        assert_eq!(find(&under("site_z/line_3")), names(&[]));
        assert_eq!(find(&under("site_z/line_3/cell_1")), names(&[]));
        assert_eq!(find(&under("site_y")), names(&["d3", "d4"]));
    }
    let store = open(dir.path());
    let find = |f: &DeviceFilter| store.find_devices("fleet", f, None, 100).unwrap().unwrap().devices;
    assert_eq!(find(&tag("color", "red")), names(&[]));
    assert_eq!(find(&tag("color", "blue")), names(&["d2", "d3"]));
    assert_eq!(find(&under("site_z")), names(&["d2"]));
    assert_eq!(find(&under("site_y")), names(&["d3", "d4"]));
    let d3 = store.device_record("d3").unwrap().unwrap();
    assert_eq!(d3.parent.as_deref(), Some("site_y"));
    assert_eq!(d3.ancestors, names(&["site_y"]));
    assert_eq!(d3.tags, tags(&[("color", "blue")]));
    assert_eq!(store.device_record("d1").unwrap().unwrap(), DeviceRecord { name: "d1".into(), ..Default::default() });
    // Ids survive the reopen; new devices get fresh ones.
    assert_eq!(store.device_id("d1"), Some(0));
    let rec = store.set_device("d9", None, tags(&[]), Some("site_y")).unwrap();
    assert_eq!(rec.ancestors, names(&["site_y"]));
    assert_eq!(store.device_id("d9"), Some(6));
}

#[test]
fn cursor_pages_cover_every_device_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // 700 devices: more than two index chunks; every other one under `site_a/line_1`, every
    // third one tagged; some of them without data in the table.
    let all: Vec<String> = (0..700).map(|i| format!("dev_{i:04}")).collect();
    let with_data: Vec<&str> = all.iter().filter(|n| !n.ends_with('7')).map(String::as_str).collect();
    write(&store, "t", &with_data);
    for (i, n) in all.iter().enumerate() {
        let t = if i % 3 == 0 { tags(&[("zone", "north")]) } else { tags(&[]) };
        let parent = if i % 2 == 0 { "site_a/line_1" } else { "site_a/line_2" };
        store.set_device(n, None, t, Some(parent)).unwrap();
    }
    let expect = |f: &dyn Fn(usize) -> bool| -> Vec<String> {
        (0..700).filter(|i| f(*i) && i % 10 != 7).map(|i| format!("dev_{i:04}")).collect()
    };
    for limit in [1, 7, 100, 256, 1000] {
        let (got, pages) = all_pages(&store, "t", &under("site_a"), limit);
        assert_eq!(got, expect(&|_| true), "limit {limit}");
        assert_eq!(pages, 630usize.div_ceil(limit), "limit {limit}");
        let (got, _) = all_pages(&store, "t", &under("site_a/line_1"), limit);
        assert_eq!(got, expect(&|i| i % 2 == 0));
        let (got, _) = all_pages(&store, "t", &tag("zone", "north"), limit);
        assert_eq!(got, expect(&|i| i % 3 == 0));
        let both = DeviceFilter {
            tag: Some(("zone".into(), "north".into())),
            under: Some("site_a/line_2".into()),
            parent: None,
        };
        let (got, _) = all_pages(&store, "t", &both, limit);
        assert_eq!(got, expect(&|i| i % 3 == 0 && i % 2 == 1));
        let (got, _) = all_pages(&store, "t", &DeviceFilter::default(), limit);
        assert_eq!(got, expect(&|_| true));
    }
    // The first page of 100 ends at the 100th device, and its cursor leads to the 101st.
    let first = store.find_devices("t", &under("site_a"), None, 100).unwrap().unwrap();
    let second = store.find_devices("t", &under("site_a"), first.next_cursor.as_deref(), 1).unwrap().unwrap();
    assert_eq!(first.devices.last(), Some(&expect(&|_| true)[99]));
    assert_eq!(second.devices, vec![expect(&|_| true)[100].clone()]);
    // A cursor not made by a listing is refused.
    for bad in ["zz", "abc", "ff"] {
        let err = store.find_devices("t", &under("site_a"), Some(bad), 10).unwrap_err();
        assert!(matches!(err, Error::InvalidRegistryInput(_)), "{bad}: {err}");
    }
    // Bad filters are refused too.
    assert!(matches!(store.find_devices("t", &under("a/"), None, 10), Err(Error::InvalidRegistryInput(_))));
    assert!(matches!(store.find_devices("t", &tag("", "x"), None, 10), Err(Error::InvalidRegistryInput(_))));
    assert_eq!(
        store.find_devices("t", &tag("zone", "south"), None, 10).unwrap(),
        Some(DevicePage { devices: vec![], next_cursor: None })
    );
}

/// A listing examines at most `MAX_EXAMINED_NAMES` index entries per call: past that it returns
/// what it found with a cursor to go on from, and the next call finds the rest.
#[test]
fn a_sparse_listing_stops_at_the_examination_budget_with_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let crowd: Vec<String> = (0..bucketer::MAX_EXAMINED_NAMES + 10).map(|i| format!("b{i:07}")).collect();
    write(&store, "busy", &crowd.iter().map(String::as_str).collect::<Vec<_>>());
    write(&store, "quiet", &["a_first", "z_last"]);
    let first = store.find_devices("quiet", &DeviceFilter::default(), None, 10).unwrap().unwrap();
    assert_eq!(first.devices, names(&["a_first"]));
    let cursor = first.next_cursor.expect("budget ran out before the end of the index");
    let second = store.find_devices("quiet", &DeviceFilter::default(), Some(&cursor), 10).unwrap().unwrap();
    assert_eq!(second, DevicePage { devices: names(&["z_last"]), next_cursor: None });
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    /// Write a reading of device `n` into table `t` (0 or 1).
    Write(usize, usize),
    /// Set device `n`'s tags (from a small set) and place.
    Set(usize, Vec<(usize, usize)>, Option<usize>),
    /// Close and reopen the store.
    Reopen,
}

const PATHS: [&str; 5] = ["s1", "s1/l1", "s1/l1/c1", "s1/l2", "s2"];
const TAG_KEYS: [&str; 2] = ["k1", "k2"];
const TAG_VALUES: [&str; 2] = ["a", "b"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..12, 0usize..2).prop_map(|(n, t)| Op::Write(n, t)),
        4 => (0usize..12, proptest::collection::vec((0usize..2, 0usize..2), 0..3), proptest::option::of(0usize..5))
            .prop_map(|(n, t, p)| Op::Set(n, t, p)),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Default)]
struct Model {
    /// Devices with data, per table.
    data: [BTreeSet<String>; 2],
    tags: BTreeMap<String, BTreeMap<String, String>>,
    parent: BTreeMap<String, String>,
}

impl Model {
    fn find(&self, table: usize, f: &DeviceFilter) -> Vec<String> {
        self.data[table]
            .iter()
            .filter(|d| match &f.tag {
                Some((k, v)) => self.tags.get(*d).and_then(|t| t.get(k)) == Some(v),
                None => true,
            })
            .filter(|d| match &f.under {
                Some(p) => self.parent.get(*d).is_some_and(|q| q == p || q.starts_with(&format!("{p}/"))),
                None => true,
            })
            .filter(|d| match &f.parent {
                Some(p) => self.parent.get(*d) == Some(p),
                None => true,
            })
            .cloned()
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// `find_devices`, paged, equals a filter over a plain model of records and data, for every
    /// filter, after random writes, updates and reopens.
    #[test]
    fn find_devices_matches_a_model(ops in proptest::collection::vec(op(), 1..40), limit in 1usize..5) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let mut model = Model::default();
        let tables = ["t0", "t1"];
        for op in ops {
            match op {
                Op::Write(n, t) => {
                    let name = format!("dev{n}");
                    write(&store, tables[t], &[name.as_str()]);
                    model.data[t].insert(name);
                }
                Op::Set(n, t, p) => {
                    let name = format!("dev{n}");
                    let t: BTreeMap<String, String> =
                        t.iter().map(|(k, v)| (TAG_KEYS[*k].to_string(), TAG_VALUES[*v].to_string())).collect();
                    let parent = p.map(|p| PATHS[p]);
                    store.set_device(&name, None, t.clone(), parent).unwrap();
                    model.tags.insert(name.clone(), t);
                    match parent {
                        Some(p) => model.parent.insert(name, p.to_string()),
                        None => model.parent.remove(&name),
                    };
                }
                Op::Reopen => {
                    drop(store);
                    store = open(dir.path());
                }
            }
        }
        let mut filters = vec![DeviceFilter::default()];
        for k in TAG_KEYS {
            for v in TAG_VALUES {
                filters.push(tag(k, v));
                for p in PATHS {
                    filters.push(DeviceFilter { tag: Some((k.into(), v.into())), under: Some(p.into()), parent: None });
                    filters.push(DeviceFilter { tag: Some((k.into(), v.into())), parent: Some(p.into()), under: None });
                }
            }
        }
        filters.extend(PATHS.iter().map(|p| under(p)));
        filters.extend(PATHS.iter().map(|p| DeviceFilter { parent: Some(p.to_string()), ..DeviceFilter::default() }));
        filters.extend(PATHS.iter().map(|p| DeviceFilter { under: Some("s1".into()), parent: Some(p.to_string()), ..DeviceFilter::default() }));
        for (t, table) in tables.iter().enumerate() {
            for f in &filters {
                let expected = model.find(t, f);
                if store.table(table).is_none() {
                    prop_assert_eq!(store.find_devices(table, f, None, limit).unwrap(), None);
                    continue;
                }
                let (got, _) = all_pages(&store, table, f, limit);
                prop_assert_eq!(got, expected, "table {} filter {:?}", table, f);
            }
        }
    }
}

/// Tags a source reports (line protocol) merge into the record: a value replaced, other tags,
/// the kind and the place kept; the tag index follows; unchanged tags are not written again.
#[test]
fn reported_tags_merge_into_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    write(&store, "t", &["s1"]);
    store.set_device("s1", Some("pump"), tags(&[("zone", "n"), ("vendor", "acme")]), Some("site/a")).unwrap();
    let report = |pairs: &[(&str, &str)]| {
        let t: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        store.merge_device_tags(&[("s1".into(), t)]).unwrap()
    };
    // A tag the registry cannot hold is left out, said at WARN (once a minute: not the second).
    let (written, said) = logged::logged(tracing::Level::WARN, || {
        let long = "v".repeat(257);
        [report(&[("zone", "s"), ("site", "north pole"), ("bad key!", "x")]), report(&[("ok", &long)])]
    });
    assert_eq!(written, [1, 0]);
    assert_eq!(
        said,
        ["WARN bucketer::registry: reported tags left out of the device's record (the registry cannot hold them; \
             the readings are stored): said at most once a minute device=s1 count=1 key=\"bad key!\" \
             reason=tag key \"bad key!\" is not 1 to 64 ASCII letters, digits, `_`, `-` or `.`"]
    );
    let r = store.device_record("s1").unwrap().unwrap();
    assert_eq!(r.tags, tags(&[("site", "north pole"), ("vendor", "acme"), ("zone", "s")]));
    assert_eq!((r.kind.as_deref(), r.parent.as_deref()), (Some("pump"), Some("site/a")));
    let by_tag = |k: &str, v: &str| {
        let filter = DeviceFilter { tag: Some((k.into(), v.into())), ..DeviceFilter::default() };
        store.find_devices("t", &filter, None, 10).unwrap().unwrap().devices
    };
    assert_eq!(by_tag("zone", "s"), ["s1"]);
    assert!(by_tag("zone", "n").is_empty());
    assert_eq!(report(&[("zone", "s"), ("site", "north pole")]), 0, "nothing new");
    assert_eq!(report(&[("vendor", "acme")]), 0, "already stored");
    // In one call (a batch of lines): repeats of a report cost nothing, a change is written,
    // and going back to the earlier report is a change again.
    let pairs = |z: &str| vec![("zone".to_string(), z.to_string())];
    let batch =
        [("s1".into(), pairs("s")), ("s1".into(), pairs("s")), ("s1".into(), pairs("e")), ("s1".into(), pairs("e"))];
    assert_eq!(store.merge_device_tags(&batch).unwrap(), 1);
    assert_eq!(store.device_record("s1").unwrap().unwrap().tags["zone"], "e");
    assert_eq!(store.merge_device_tags(&[("s1".into(), pairs("s"))]).unwrap(), 1);
    assert_eq!(store.device_record("s1").unwrap().unwrap().tags["zone"], "s");
}

/// The devices whose stored tags a report changed are kept in order for the sources' memories
/// (`model::TagChanges`); a device's first tags are no change; a reader too far behind is told
/// so, with the next sequence number.
#[test]
fn tag_changes_by_reports_are_kept_for_the_sources() {
    use model::TagChanges;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let report = |device: &str, zone: &str| {
        store.merge_device_tags(&[(device.into(), vec![("zone".to_string(), zone.to_string())])]).unwrap()
    };
    let since = |from: u64| {
        let mut out = Vec::new();
        store.changes_since(from, &mut out).map(|next| (next, out.iter().map(|d| d.to_string()).collect::<Vec<_>>()))
    };
    assert_eq!(report("a", "n"), 1);
    assert_eq!(report("b", "n"), 1);
    assert_eq!((store.next_change(), since(0)), (0, Ok((0, vec![]))), "first tags are no change");
    assert_eq!(report("a", "n"), 0);
    assert_eq!(report("a", "s"), 1);
    assert_eq!(report("b", "e"), 1);
    assert_eq!(report("a", "n"), 1);
    assert_eq!(store.next_change(), 3);
    assert_eq!(since(0), Ok((3, vec!["a".into(), "b".into(), "a".into()])));
    assert_eq!(since(2), Ok((3, vec!["a".into()])));
    assert_eq!(since(3), Ok((3, vec![])));
    assert_eq!(since(4), Err(3), "a sequence number not given yet");
    // Tags emptied through the API, then reported: a change (a source had reported them).
    store.set_device("b", None, BTreeMap::new(), None).unwrap();
    assert_eq!(report("b", "w"), 1);
    assert_eq!(since(3), Ok((4, vec!["b".into()])));
    // Past the log's size the oldest changes are dropped: a reader from before them is behind.
    for i in 0..bucketer::registry::TAG_CHANGES_KEPT {
        report("a", if i % 2 == 0 { "s" } else { "n" });
    }
    let next = 4 + bucketer::registry::TAG_CHANGES_KEPT as u64;
    assert_eq!(store.next_change(), next);
    assert_eq!(since(3), Err(next));
    assert_eq!(since(4).map(|(n, d)| (n, d.len())), Ok((next, bucketer::registry::TAG_CHANGES_KEPT)));
}
