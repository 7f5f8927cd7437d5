//! End-to-end tests of the device registry over HTTP: readings published over MQTT (embedded
//! broker), kinds, tags and places set with `PUT`, the listings and records read back with
//! `GET`, across a restart; and the 400 / 404 answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::time::Duration;

use serde_json::{json, Value};
use util::{publish_qos1, wait_for, Hourglass};

const TABLE: &str = "plant.sensors";
const T0: i64 = 1_704_153_000_000;

fn devices(hg: &Hourglass, query: &str) -> (u16, Value) {
    hg.get(&format!("/v1/tables/{TABLE}/devices?{query}"))
}

fn put(hg: &Hourglass, device: &str, body: Value) -> (u16, Value) {
    hg.put(&format!("/v1/tables/{TABLE}/devices/{device}"), &body.to_string())
}

/// Every device of a listing, following `next_cursor`, `limit` per page.
fn all_pages(hg: &Hourglass, query: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, body) = devices(hg, &format!("{query}&limit={limit}{cursor}"));
        assert_eq!(status, 200, "{body}");
        let page: Vec<String> =
            body["devices"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
        assert!(page.len() <= limit);
        out.extend(page);
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

#[test]
fn devices_get_kinds_tags_and_places_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let hg = Hourglass::start(dir.path(), None);
    let names: Vec<String> = (0..12).map(|i| format!("sensor_{i:02}")).collect();
    let msgs: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|d| (format!("hourglass/{TABLE}/{d}"), json!({"ts": T0, "temp": 20.5}).to_string().into_bytes()))
        .collect();
    assert_eq!(publish_qos1(hg.mqtt_port, "registry-publisher", &msgs, Duration::from_secs(30), |_| {}), 12);
    wait_for(Duration::from_secs(30), || {
        let (status, body) = devices(&hg, "limit=100");
        (status == 200 && body["devices"].as_array().map(Vec::len) == Some(12)).then_some(())
    })
    .expect("all 12 devices stored");

    // A device registered on first write has an empty record.
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/sensor_00"));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"name": "sensor_00", "kind": null, "tags": {}, "parent": null, "ancestors": [], "outlier": false})
    );

    // Even sensors are thermometers on line 1 of site_z, odd ones pumps on line 2; every third
    // one is tagged `zone:north`.
    for (i, d) in names.iter().enumerate() {
        let kind = if i % 2 == 0 { "thermometer" } else { "pump" };
        let parent = if i % 2 == 0 { "site_z/line_1" } else { "site_z/line_2" };
        let mut tags = json!({"vendor": "acme"});
        if i % 3 == 0 {
            tags["zone"] = json!("north");
        }
        let (status, body) = put(&hg, d, json!({"kind": kind, "tags": tags, "parent": parent}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body,
            json!({"name": d, "kind": kind, "tags": tags, "parent": parent, "ancestors": ["site_z", parent], "outlier": false})
        );
    }
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/sensor_03"));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "name": "sensor_03", "kind": "pump", "tags": {"vendor": "acme", "zone": "north"},
            "parent": "site_z/line_2", "ancestors": ["site_z", "site_z/line_2"], "outlier": false,
        })
    );

    let pick = |f: &dyn Fn(usize) -> bool| -> Vec<String> {
        names.iter().enumerate().filter(|(i, _)| f(*i)).map(|(_, n)| n.clone()).collect()
    };
    assert_eq!(
        devices(&hg, "tag=zone:north"),
        (200, json!({"table": TABLE, "devices": pick(&|i| i % 3 == 0), "next_cursor": null}))
    );
    assert_eq!(all_pages(&hg, "under=site_z", 5), names);
    assert_eq!(all_pages(&hg, "under=site_z/line_1", 2), pick(&|i| i % 2 == 0));
    // Direct children: every sensor's parent is a line, so site_z itself has none.
    assert_eq!(all_pages(&hg, "parent=site_z/line_2", 2), pick(&|i| i % 2 == 1));
    assert_eq!(all_pages(&hg, "parent=site_z", 2), Vec::<String>::new());
    assert_eq!(all_pages(&hg, "parent=site_z/line_1&tag=zone:north", 1), pick(&|i| i % 6 == 0));
    assert_eq!(all_pages(&hg, "under=site_z/line_2&tag=zone:north", 1), pick(&|i| i % 6 == 3));
    assert_eq!(all_pages(&hg, "tag=vendor:acme", 4), names);
    let (status, first) = devices(&hg, "under=site_z&limit=5");
    assert_eq!(status, 200);
    assert_eq!(first["devices"], json!(names[..5]));
    assert!(first["next_cursor"].is_string());

    // Move sensor_03 to another site and drop its tags: the old index entries are gone.
    let (status, body) = put(&hg, "sensor_03", json!({"kind": "pump", "parent": "site_y"}));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"name": "sensor_03", "kind": "pump", "tags": {}, "parent": "site_y", "ancestors": ["site_y"], "outlier": false})
    );
    assert_eq!(all_pages(&hg, "tag=zone:north", 3), pick(&|i| i % 3 == 0 && i != 3));
    assert_eq!(all_pages(&hg, "under=site_z/line_2", 3), pick(&|i| i % 2 == 1 && i != 3));
    assert_eq!(all_pages(&hg, "under=site_y", 3), vec!["sensor_03".to_string()]);

    // The `prefix` listing is unchanged.
    assert_eq!(
        devices(&hg, "prefix=sensor_1&limit=5"),
        (200, json!({"table": TABLE, "prefix": "sensor_1", "devices": ["sensor_10", "sensor_11"], "complete": true}))
    );

    // Bad requests say what is wrong; unknown tables and devices are 404.
    let error = |(status, body): (u16, Value)| (status, body["error"].as_str().unwrap().to_string());
    assert_eq!(error(devices(&hg, "tag=zone")), (400, "parameter `tag`: \"zone\" is not `key:value`".into()));
    assert_eq!(error(devices(&hg, "under=site_z//x")).0, 400);
    assert!(error(devices(&hg, "under=site_z//x")).1.starts_with("group path \"site_z//x\" is not"));
    assert_eq!(
        error(devices(&hg, "cursor=xyz")),
        (400, "cursor \"xyz\" is not one returned by a device listing".into())
    );
    assert_eq!(
        error(devices(&hg, "prefix=s&tag=a:b")),
        (400, "parameter `prefix` cannot be combined with `tag`, `under`, `parent` or `cursor`".into())
    );
    assert_eq!(error(devices(&hg, "tag=a:b&limit=0")).0, 400);
    assert_eq!(
        error(put(&hg, "sensor_01", json!({"kind": "pump", "colour": "red"}))),
        (400, "unknown key `colour`; a device update has `kind`, `tags`, `parent`".into())
    );
    assert_eq!(error(put(&hg, "sensor_01", json!({"parent": "/root"}))).0, 400);
    assert_eq!(error(put(&hg, "sensor_01", json!({"tags": {"a b": "x"}}))).0, 400);
    assert_eq!(
        error(put(&hg, "sensor_01", json!({"tags": {"a": 1}}))),
        (400, "tag `a` must have a string value, not 1".into())
    );
    let (status, _) = hg.put(&format!("/v1/tables/{TABLE}/devices/sensor_01"), "not json");
    assert_eq!(status, 400);
    // The refused updates changed nothing.
    let (_, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/sensor_01"));
    assert_eq!(body["parent"], "site_z/line_2");
    assert_eq!(
        error(hg.get(&format!("/v1/tables/{TABLE}/devices/nobody"))),
        (404, format!("unknown device `nobody` in table `{TABLE}`"))
    );
    assert_eq!(error(hg.get("/v1/tables/no.such/devices/sensor_01")), (404, "unknown table `no.such`".into()));
    assert_eq!(error(hg.get("/v1/tables/no.such/devices?tag=a:b")), (404, "unknown table `no.such`".into()));
    // An empty body clears the record.
    assert_eq!(
        put(&hg, "sensor_01", json!({})),
        (
            200,
            json!({"name": "sensor_01", "kind": null, "tags": {}, "parent": null, "ancestors": [], "outlier": false})
        )
    );
    assert_eq!(error(hg.put("/v1/tables/no.such/devices/sensor_01", "{}")).0, 404);
    // A device set before it has data is registered but not listed nor readable in the table.
    assert_eq!(put(&hg, "later_1", json!({"parent": "site_z"})).0, 200);
    assert_eq!(error(hg.get(&format!("/v1/tables/{TABLE}/devices/later_1"))).0, 404);
    assert_eq!(all_pages(&hg, "under=site_z", 100), pick(&|i| i != 3 && i != 1));

    // Everything survives a restart.
    hg.terminate();
    let hg = Hourglass::start(dir.path(), None);
    assert_eq!(all_pages(&hg, "under=site_y", 3), vec!["sensor_03".to_string()]);
    assert_eq!(all_pages(&hg, "tag=zone:north", 3), pick(&|i| i % 3 == 0 && i != 3));
    let (status, body) = hg.get(&format!("/v1/tables/{TABLE}/devices/sensor_04"));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "name": "sensor_04", "kind": "thermometer", "tags": {"vendor": "acme"},
            "parent": "site_z/line_1", "ancestors": ["site_z", "site_z/line_1"], "outlier": false,
        })
    );
}
