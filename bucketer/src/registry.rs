//! Device records and the registry's secondary indexes: kind (polymorphic discriminator), tags
//! (equals-only tag index) and the place of a device in a hierarchy of groups (tree pattern).
//!
//! A device's place is a group path such as `site_z/line_3`. Its record keeps the parent path
//! and the ancestors array (`site_z`, `site_z/line_3`), so "ancestors of X" is one record read;
//! the group index holds one entry per ancestor, so "all devices under Z" is one prefix scan at
//! any depth. The tag index holds one entry per tag. Both indexes are sorted by device name
//! and read in pages with a cursor (wide-row child pattern): a large group is never loaded
//! whole. [`Store::set_device`] rewrites a device's index entries in the same WriteBatch as its
//! record (old entries deleted, new ones put), so indexes and records never disagree. Key
//! layouts are in [`crate::keys`]; this module owns the record's value format.
//!
//! # Persisted device record (`registry`, key `keys::device_record_key(id)`)
//!
//! Version 1, strings as `u16 BE length · UTF-8 bytes`:
//!
//! ```text
//! u8 1 · name · u8 has_kind (0|1) · [kind] · u16 BE tag count · (key · value)* · parent ("" = root)
//! ```
//!
//! Tags are written in key order. The ancestors array is not stored: it is the parent path's
//! prefixes, computed on decode. A device first seen in a write has no record (nor had one
//! registered before records existed) and reads as an empty one, its name only, until a record
//! is set: at 10M new devices that is 10M puts a fleet's first tick does not make. Readers
//! must accept every version ever written.
//!
//! ```no_run
//! use bucketer::{DeviceFilter, Store, StoreConfig};
//! let store = Store::open(std::path::Path::new("/tmp/hg"), StoreConfig::default())?;
//! let tags = [("model".to_string(), "x9".to_string())].into_iter().collect();
//! let rec = store.set_device("truck_1", Some("truck"), tags, Some("site_z/line_3"))?;
//! assert_eq!(rec.ancestors, ["site_z", "site_z/line_3"]);
//! let filter = DeviceFilter { under: Some("site_z".into()), ..DeviceFilter::default() };
//! let page = store.find_devices("fleet.readings", &filter, None, 100)?;
//! # Ok::<(), bucketer::Error>(())
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use rocksdb::{Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::keys;
use crate::store::{cf, CF_LATEST, CF_REGISTRY};
use crate::{db_err, read, write, Error, Result, Store, MAX_EXAMINED_NAMES};

/// Version byte of the device-record format this build writes.
const RECORD_V1: u8 = 1;
/// Longest group path, in bytes.
pub const MAX_PATH_LEN: usize = 1024;
/// Longest tag key or kind, in bytes.
pub const MAX_TAG_KEY_LEN: usize = 64;
/// Longest tag value, in bytes.
pub const MAX_TAG_VALUE_LEN: usize = 256;
/// Most tags on one device.
pub const MAX_TAGS: usize = 64;
/// Longest device name [`Store::set_device`] accepts, in bytes.
pub const MAX_DEVICE_NAME_LEN: usize = 255;

/// Index entries checked against `latest` per multi-get.
const CHUNK: usize = 256;

/// A device's registry record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceRecord {
    /// Device name.
    pub name: String,
    /// Kind (discriminator); `None` when not set.
    pub kind: Option<String>,
    /// Tags, key → value.
    pub tags: BTreeMap<String, String>,
    /// Group path of the device's place; `None` at the root.
    pub parent: Option<String>,
    /// Every group path from the top down to `parent` (empty at the root).
    pub ancestors: Vec<String>,
}

/// What [`Store::find_devices`] looks for; every part that is set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// Devices carrying this tag `(key, value)`.
    pub tag: Option<(String, String)>,
    /// Devices under this group path, at any depth.
    pub under: Option<String>,
    /// Devices whose parent is this group path (its direct children).
    pub parent: Option<String>,
}

/// One page of [`Store::find_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePage {
    /// Device names, ascending byte order.
    pub devices: Vec<String>,
    /// Cursor of the next page; `None` when there are no more devices.
    pub next_cursor: Option<String>,
}

fn invalid(detail: String) -> Error {
    Error::InvalidRegistryInput(detail)
}

fn is_segment_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Devices whose last reported tags [`Store::merge_device_tags`] remembers at most.
const REPORTED_TAGS_CACHE: usize = 1 << 20;

/// Tag changes the store keeps for the sources' memories ([`model::TagChanges`]): a memory
/// that reads them less often than this many changes forgets every note instead.
pub const TAG_CHANGES_KEPT: usize = 1 << 16;

/// The devices whose stored tags a source's report changed ([`Store::merge_device_tags`]), by
/// sequence number, the last [`TAG_CHANGES_KEPT`] of them: the sources' memories of reported
/// tags read them ([`model::TagChanges`]), so that a device whose tags another source changed
/// reports its own again. A device's first tags are no change (no memory can have noted other
/// tags for it), so a fleet's arrival writes nothing here; tags emptied through the API and
/// then reported are one, when a source had reported the device before.
#[derive(Debug, Default)]
pub(crate) struct TagChangeLog {
    /// The sequence number of `devices[0]`.
    first: u64,
    devices: std::collections::VecDeque<Arc<str>>,
}

impl TagChangeLog {
    fn push(&mut self, device: Arc<str>) {
        if self.devices.len() == TAG_CHANGES_KEPT {
            self.devices.pop_front();
            self.first += 1;
        }
        self.devices.push_back(device);
    }

    fn next(&self) -> u64 {
        self.first + self.devices.len() as u64
    }
}

impl model::TagChanges for Store {
    fn next_change(&self) -> u64 {
        self.tag_changes_next.load(std::sync::atomic::Ordering::Acquire)
    }

    fn changes_since(&self, since: u64, out: &mut Vec<Arc<str>>) -> std::result::Result<u64, u64> {
        let log = self.tag_changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if since < log.first || since > log.next() {
            return Err(log.next());
        }
        out.extend(log.devices.iter().skip((since - log.first) as usize).cloned());
        Ok(log.next())
    }
}

/// Checks a group path: 1 to [`MAX_PATH_LEN`] bytes of `/`-separated non-empty segments of
/// ASCII letters, digits, `_`, `-` and `.`.
pub fn validate_path(path: &str) -> Result<()> {
    let ok = !path.is_empty()
        && path.len() <= MAX_PATH_LEN
        && path.split('/').all(|seg| !seg.is_empty() && seg.bytes().all(is_segment_byte));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "group path {path:?} is not 1 to {MAX_PATH_LEN} bytes of `/`-separated non-empty segments of ASCII \
             letters, digits, `_`, `-` or `.` (such as \"site_z/line_3\")"
        )))
    }
}

/// Checks a tag: a key of 1 to [`MAX_TAG_KEY_LEN`] ASCII letters, digits, `_`, `-` or `.`, and
/// a value of 1 to [`MAX_TAG_VALUE_LEN`] bytes without control characters.
pub fn validate_tag(key: &str, value: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_TAG_KEY_LEN || !key.bytes().all(is_segment_byte) {
        return Err(invalid(format!(
            "tag key {key:?} is not 1 to {MAX_TAG_KEY_LEN} ASCII letters, digits, `_`, `-` or `.`"
        )));
    }
    if value.is_empty() || value.len() > MAX_TAG_VALUE_LEN || value.chars().any(char::is_control) {
        // A value past the limit is shown cut (QA47 N5: a 60,000-byte value made a line as long).
        let shown = match value.char_indices().nth(64) {
            Some((at, _)) => format!("{:?}… ({} bytes)", &value[..at], value.len()),
            None => format!("{value:?}"),
        };
        return Err(invalid(format!(
            "value {shown} of tag `{key}` is not 1 to {MAX_TAG_VALUE_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// Checks a kind: 1 to [`MAX_TAG_KEY_LEN`] ASCII letters, digits, `_`, `-` or `.`.
pub fn validate_kind(kind: &str) -> Result<()> {
    if kind.is_empty() || kind.len() > MAX_TAG_KEY_LEN || !kind.bytes().all(is_segment_byte) {
        return Err(invalid(format!(
            "kind {kind:?} is not 1 to {MAX_TAG_KEY_LEN} ASCII letters, digits, `_`, `-` or `.`"
        )));
    }
    Ok(())
}

/// The ancestors array of a place: every prefix of `parent` that ends at a segment boundary.
pub fn ancestors_of(parent: &str) -> Vec<String> {
    parent.match_indices('/').map(|(i, _)| parent[..i].to_string()).chain([parent.to_string()]).collect()
}

/// Encodes a cursor pointing just past device `name`: the name's bytes in lowercase hex.
fn encode_cursor(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a cursor of [`encode_cursor`]; an error names what is wrong.
fn decode_cursor(cursor: &str) -> Result<String> {
    let bad = || invalid(format!("cursor {cursor:?} is not one returned by a device listing"));
    if cursor.is_empty() || !cursor.len().is_multiple_of(2) || cursor.len() > 2 * MAX_DEVICE_NAME_LEN {
        return Err(bad());
    }
    let bytes = (0..cursor.len())
        .step_by(2)
        .map(|i| cursor.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

fn put_str(v: &mut Vec<u8>, s: &str) {
    // Every string of a record is validated far below u16::MAX bytes.
    let bytes = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    v.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    v.extend_from_slice(bytes);
}

/// Encodes a record in the current version (see the module docs).
pub(crate) fn encode_record(r: &DeviceRecord) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + r.name.len() + 32 * r.tags.len());
    v.push(RECORD_V1);
    put_str(&mut v, &r.name);
    match &r.kind {
        Some(kind) => {
            v.push(1);
            put_str(&mut v, kind);
        }
        None => v.push(0),
    }
    v.extend_from_slice(&(r.tags.len().min(u16::MAX as usize) as u16).to_be_bytes());
    for (k, val) in r.tags.iter().take(u16::MAX as usize) {
        put_str(&mut v, k);
        put_str(&mut v, val);
    }
    put_str(&mut v, r.parent.as_deref().unwrap_or(""));
    v
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn str(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| corrupt("string is not UTF-8"))
    }
}

fn corrupt(detail: &str) -> Error {
    Error::Corrupt { what: "device record", detail: detail.to_string() }
}

/// Decodes a record of any version ever written.
pub(crate) fn decode_record(v: &[u8]) -> Result<DeviceRecord> {
    let mut r = Reader(v);
    match r.u8()? {
        RECORD_V1 => {}
        other => return Err(corrupt(&format!("unknown version {other}"))),
    }
    let name = r.str()?;
    let kind = match r.u8()? {
        0 => None,
        1 => Some(r.str()?),
        _ => return Err(corrupt("bad kind flag")),
    };
    let n = r.u16()?;
    let mut tags = BTreeMap::new();
    for _ in 0..n {
        let k = r.str()?;
        tags.insert(k, r.str()?);
    }
    let parent = Some(r.str()?).filter(|p| !p.is_empty());
    if !r.0.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    let ancestors = parent.as_deref().map(ancestors_of).unwrap_or_default();
    Ok(DeviceRecord { name, kind, tags, parent, ancestors })
}

/// The entries that register device `name` as `id`: name → id and id → name. No record: a
/// device without one reads as an empty one until one is set ([`Store::set_device`]).
pub(crate) fn put_registration(db: &rocksdb::DB, wb: &mut WriteBatch, name: &str, id: u64) {
    let h = cf(db, CF_REGISTRY);
    wb.put_cf(h, keys::name_key(name), id.to_be_bytes());
    wb.put_cf(h, keys::device_id_key(id), name.as_bytes());
}

/// Every index key of a record: one per tag, one per ancestor.
fn index_keys(r: &DeviceRecord) -> Vec<Vec<u8>> {
    let tags = r.tags.iter().map(|(k, v)| keys::tag_index_key(k, v, &r.name));
    let places = r.ancestors.iter().map(|a| keys::under_index_key(a, &r.name));
    let child = r.parent.iter().map(|p| keys::child_index_key(p, &r.name));
    tags.chain(places).chain(child).collect()
}

impl Store {
    /// [`Store::set_device`] for a caller that replaces the record (`PUT` of the HTTP API), not
    /// a source's report: the sources' memories of reported tags forget the device (it goes into
    /// the tag-change log, and out of the reports seen), so that its next report of tags is
    /// merged into the record again, whichever source sends it.
    pub fn replace_device(
        &self,
        name: &str,
        kind: Option<&str>,
        tags: BTreeMap<String, String>,
        parent: Option<&str>,
    ) -> Result<DeviceRecord> {
        let mut cache = self.reported_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let record = self.set_device(name, kind, tags, parent)?;
        cache.remove(name);
        self.note_tag_change(Arc::from(name));
        Ok(record)
    }

    /// Puts `device` into the tag-change log ([`TagChangeLog`]), for the sources' memories.
    fn note_tag_change(&self, device: Arc<str>) {
        let mut log = self.tag_changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        log.push(device);
        self.tag_changes_next.store(log.next(), std::sync::atomic::Ordering::Release);
    }

    /// Sets the kind, tags and place of device `name`, registering it if it is new; the record
    /// and its index entries change in one WriteBatch. Returns the stored record.
    pub fn set_device(
        &self,
        name: &str,
        kind: Option<&str>,
        tags: BTreeMap<String, String>,
        parent: Option<&str>,
    ) -> Result<DeviceRecord> {
        if name.is_empty() || name.len() > MAX_DEVICE_NAME_LEN || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "device name {name:?} is not 1 to {MAX_DEVICE_NAME_LEN} printable ASCII characters"
            )));
        }
        if let Some(kind) = kind {
            validate_kind(kind)?;
        }
        if tags.len() > MAX_TAGS {
            return Err(invalid(format!("{} tags; a device has at most {MAX_TAGS}", tags.len())));
        }
        for (k, v) in &tags {
            validate_tag(k, v)?;
        }
        if let Some(parent) = parent {
            validate_path(parent)?;
        }
        let record = DeviceRecord {
            name: name.to_string(),
            kind: kind.map(str::to_string),
            tags,
            parent: parent.map(str::to_string),
            ancestors: parent.map(ancestors_of).unwrap_or_default(),
        };

        // Id assignment and the read-modify-write of the record run one at a time with writes.
        let _writer = self.write_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = cf(&self.db, CF_REGISTRY);
        let mut wb = WriteBatch::default();
        let known = self.device_id(name);
        let id = match known {
            Some(id) => {
                if let Some(old) = self.record_by_id(id)? {
                    for k in index_keys(&old) {
                        wb.delete_cf(h, k);
                    }
                }
                id
            }
            None => {
                let id = read(&self.registry).next_id;
                id.checked_add(1).ok_or(Error::IdsExhausted("device"))?;
                put_registration(&self.db, &mut wb, name, id);
                id
            }
        };
        // Deletes come first in the batch: an entry both old and new ends up present.
        for k in index_keys(&record) {
            wb.put_cf(h, k, id.to_be_bytes());
        }
        wb.put_cf(h, keys::device_record_key(id), encode_record(&record));
        let mut wo = WriteOptions::default();
        wo.set_sync(self.cfg.sync_wal);
        self.db.write_opt(wb, &wo).map_err(db_err("write device record"))?;
        if known.is_none() {
            let mut registry = write(&self.registry);
            registry.next_id = id + 1;
            registry.by_name.insert(name, id);
        }
        Ok(record)
    }

    /// Whether `tags` are what a source last reported for `device` since the store opened, so
    /// that [`Store::merge_device_tags`] would neither read nor write its record for them.
    pub fn tags_reported_before(&self, device: &str, tags: &[(String, String)]) -> bool {
        let seen = self.tags_hasher.hash_one(tags);
        self.reported_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(device) == Some(&seen)
    }

    /// Logs reported tags of `device` left out of its record (`count` of them; `key` the first,
    /// for `why`), at most once a minute.
    fn say_refused_tags(&self, device: &str, count: usize, key: &str, why: &Error) {
        let now = model::now_ms();
        let last = self.refused_tags_said_ms.load(std::sync::atomic::Ordering::Relaxed);
        if now.saturating_sub(last) < 60_000
            || self
                .refused_tags_said_ms
                .compare_exchange(last, now, std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        tracing::warn!(
            %device, count, key, reason = %why,
            "reported tags left out of the device's record (the registry cannot hold them; the readings are \
             stored): said at most once a minute"
        );
    }

    /// Merges tags a source reported for devices (line protocol) into their records: each
    /// given tag's value replaces the stored one, other stored tags stay. A device whose merged
    /// tags equal its stored ones is not written; one seen with the same tags since the store
    /// opened (the same pairs in the same order, as a source sending every line with its tags
    /// reports them) is not even read: one hash and one lookup. Tags the registry refuses (see
    /// [`validate_tag`]), and updates that would take a device past [`MAX_TAGS`], are left out,
    /// logged at WARN at most once a minute (the reading is stored all the same).
    /// Returns the records written.
    pub fn merge_device_tags(&self, updates: &[model::DeviceTags]) -> Result<usize> {
        // The reports not seen before, under one lock.
        let fresh: Vec<(&model::DeviceTags, u64)> = {
            let cache = self.reported_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            updates
                .iter()
                .filter_map(|u| {
                    let seen = self.tags_hasher.hash_one(&u.1);
                    (cache.get(&u.0) != Some(&seen)).then_some((u, seen))
                })
                .collect()
        };
        let mut written = 0;
        for ((device, tags), seen) in fresh {
            // The tags the registry holds; of the others, how many and the first, with why.
            let (mut held, mut refused, mut first) = (BTreeMap::new(), 0, None);
            for (k, v) in tags {
                match validate_tag(k, v) {
                    Ok(()) => {
                        held.insert(k.clone(), v.clone());
                    }
                    Err(why) => {
                        refused += 1;
                        first.get_or_insert((k, why));
                    }
                }
            }
            if let Some((key, why)) = first {
                self.say_refused_tags(device, refused, key, &why);
            }
            let tags = held;
            if tags.is_empty() {
                continue;
            }
            let mut cache = self.reported_tags.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // The same report earlier in this call.
            if cache.get(device) == Some(&seen) {
                continue;
            }
            let reported_before = cache.contains_key(device);
            let record = self.device_record(device)?.unwrap_or_default();
            let mut merged = record.tags.clone();
            merged.extend(tags);
            if merged.len() > MAX_TAGS {
                let why = invalid(format!("{} tags; a device has at most {MAX_TAGS}", merged.len()));
                let new = merged.keys().filter(|k| !record.tags.contains_key(*k));
                self.say_refused_tags(device, new.clone().count(), new.min().map_or("", String::as_str), &why);
            } else if merged != record.tags {
                // A memory may have noted other tags for a device that had tags, or that a
                // source reported before (its tags since emptied through the API).
                let noted_elsewhere = !record.tags.is_empty() || reported_before;
                self.set_device(device, record.kind.as_deref(), merged, record.parent.as_deref())?;
                written += 1;
                if noted_elsewhere {
                    self.note_tag_change(device.clone());
                }
            }
            // Bounded: past a million devices the cache starts over (a device then costs one
            // record read again), so it never grows with the fleet.
            if cache.len() >= REPORTED_TAGS_CACHE {
                cache.clear();
            }
            cache.insert(device.clone(), seen);
        }
        Ok(written)
    }

    /// The record of device `name`; `None` when the device is unknown.
    pub fn device_record(&self, name: &str) -> Result<Option<DeviceRecord>> {
        let Some(id) = self.device_id(name) else {
            return Ok(None);
        };
        Ok(Some(
            self.record_by_id(id)?
                .unwrap_or_else(|| DeviceRecord { name: name.to_string(), ..DeviceRecord::default() }),
        ))
    }

    pub(crate) fn record_by_id(&self, id: u64) -> Result<Option<DeviceRecord>> {
        let v = self
            .db
            .get_pinned_cf(cf(&self.db, CF_REGISTRY), keys::device_record_key(id))
            .map_err(db_err("get device record"))?;
        v.map(|v| decode_record(&v)).transpose()
    }

    /// Whether `device` has at least one reading in `table`.
    pub fn has_data(&self, table: &str, device: &str) -> Result<bool> {
        Ok(self.device_in_table(table, device)?.is_some())
    }

    /// Whether any device is under group path `group` (at any depth) now: the registry's index
    /// of the path holds an entry.
    pub fn group_has_devices(&self, group: &str) -> Result<bool> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_range(rocksdb::PrefixRange(keys::under_index_prefix(group)));
        let mut it = self.db.raw_iterator_cf_opt(cf(&self.db, CF_REGISTRY), opts);
        it.seek_to_first();
        it.status().map_err(db_err("seek group members"))?;
        Ok(it.valid())
    }

    /// The devices with data in `table` that match `filter`, at most `limit` of them in name
    /// order, starting after `cursor` (a `next_cursor` of an earlier page). `None` when the
    /// table is unknown. One index is scanned (the tag index when a tag is given, else the
    /// group index, else the name index) from the cursor on, and at most
    /// [`MAX_EXAMINED_NAMES`] of its entries per call: a page can come back short, with a
    /// cursor to go on from, when few of the entries examined match.
    pub fn find_devices(
        &self,
        table: &str,
        filter: &DeviceFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Option<DevicePage>> {
        if let Some((k, v)) = &filter.tag {
            validate_tag(k, v)?;
        }
        for p in filter.under.iter().chain(&filter.parent) {
            validate_path(p)?;
        }
        let after = cursor.map(decode_cursor).transpose()?;
        let Some(ti) = self.table(table) else {
            return Ok(None);
        };
        let limit = limit.max(1);
        // The first index the filter names is scanned; the others are checked by multi-get.
        let mut indexes: Vec<Vec<u8>> = Vec::new();
        if let Some((k, v)) = &filter.tag {
            indexes.push(keys::tag_index_prefix(k, v));
        }
        if let Some(p) = &filter.under {
            indexes.push(keys::under_index_prefix(p));
        }
        if let Some(p) = &filter.parent {
            indexes.push(keys::child_index_prefix(p));
        }
        let (prefix, also) = match indexes.len() {
            0 => (vec![keys::NAME_PREFIX], Vec::new()),
            _ => (indexes.remove(0), indexes),
        };
        let start = match &after {
            Some(name) => keys::after(&prefix, name),
            None => prefix.clone(),
        };
        let iter = self.db.iterator_cf(cf(&self.db, CF_REGISTRY), IteratorMode::From(&start, Direction::Forward));
        let mut found: Vec<String> = Vec::new();
        let mut chunk: Vec<(String, u64)> = Vec::with_capacity(CHUNK);
        let mut last_examined: Option<String> = None;
        let mut exhausted = true;
        for (examined, item) in iter.enumerate() {
            let (k, v) = item.map_err(db_err("scan registry index"))?;
            let Some(name) = k.strip_prefix(prefix.as_slice()) else {
                break;
            };
            if examined == MAX_EXAMINED_NAMES {
                exhausted = false;
                break;
            }
            let name = std::str::from_utf8(name).map_err(|_| corrupt("index entry name is not UTF-8"))?;
            let id = u64::from_be_bytes(v.as_ref().try_into().map_err(|_| corrupt("index entry value length"))?);
            chunk.push((name.to_string(), id));
            if chunk.len() == CHUNK {
                last_examined = chunk.last().map(|(n, _)| n.clone());
                self.keep_matching(ti.id, &also, &mut chunk, &mut found)?;
                if found.len() > limit {
                    break;
                }
            }
        }
        if let Some((n, _)) = chunk.last() {
            last_examined = Some(n.clone());
        }
        self.keep_matching(ti.id, &also, &mut chunk, &mut found)?;
        let next = if found.len() > limit {
            found.truncate(limit);
            found.last().cloned()
        } else if !exhausted {
            last_examined
        } else {
            None
        };
        Ok(Some(DevicePage { devices: found, next_cursor: next.as_deref().map(encode_cursor) }))
    }

    /// Moves the names of `chunk` whose device has a `latest` entry in `table` (and an entry
    /// in each index of `also`, given by prefix) to `found`, keeping their order.
    fn keep_matching(
        &self,
        table: u32,
        also: &[Vec<u8>],
        chunk: &mut Vec<(String, u64)>,
        found: &mut Vec<String>,
    ) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let mut keep = vec![true; chunk.len()];
        // Device ids are not in name order; the multi-get wants its keys sorted.
        let mut wanted: Vec<(usize, [u8; keys::LATEST_KEY_LEN])> =
            chunk.iter().enumerate().map(|(i, (_, id))| (i, keys::latest_key(table, *id))).collect();
        wanted.sort_unstable_by_key(|w| w.1);
        // The write buffer first: a flush between the two reads then shows a device's readings
        // in both rather than in neither.
        let buffered: Vec<bool> = chunk.iter().map(|(_, id)| self.buffered_series(table, *id)).collect();
        let results = self.db.batched_multi_get_cf(cf(&self.db, CF_LATEST), wanted.iter().map(|(_, k)| k), true);
        for ((pos, _), res) in wanted.iter().zip(results) {
            keep[*pos] = res.map_err(db_err("multi-get latest"))?.is_some() || buffered[*pos];
        }
        for prefix in also {
            // Chunk names are in order, so these keys are too.
            let ks: Vec<Vec<u8>> = chunk.iter().map(|(n, _)| [prefix.as_slice(), n.as_bytes()].concat()).collect();
            let results = self.db.batched_multi_get_cf(cf(&self.db, CF_REGISTRY), ks.iter(), true);
            for (i, res) in results.into_iter().enumerate() {
                keep[i] &= res.map_err(db_err("multi-get registry index"))?.is_some();
            }
        }
        found.extend(chunk.drain(..).zip(keep).filter(|(_, k)| *k).map(|((name, _), _)| name));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn record_v1_layout() {
        let r = DeviceRecord {
            name: "d".into(),
            kind: Some("k".into()),
            tags: [("a".to_string(), "b".to_string())].into_iter().collect(),
            parent: Some("s/l".into()),
            ancestors: vec!["s".into(), "s/l".into()],
        };
        let bytes = encode_record(&r);
        assert_eq!(bytes, b"\x01\x00\x01d\x01\x00\x01k\x00\x01\x00\x01a\x00\x01b\x00\x03s/l".to_vec());
        assert_eq!(decode_record(&bytes).unwrap(), r);
        let empty = DeviceRecord { name: "d".into(), ..DeviceRecord::default() };
        assert_eq!(encode_record(&empty), b"\x01\x00\x01d\x00\x00\x00\x00\x00".to_vec());
        assert!(matches!(decode_record(b"\x02"), Err(Error::Corrupt { .. })));
        assert!(matches!(decode_record(b"\x01\x00\x05d"), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn paths_tags_and_cursors_are_validated() {
        assert_eq!(ancestors_of("a/b.c/d-1"), ["a", "a/b.c", "a/b.c/d-1"]);
        assert_eq!(ancestors_of("site"), ["site"]);
        for bad in ["", "/a", "a/", "a//b", "a b", "a/ü"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        assert!(validate_path("site_z/line_3").is_ok());
        assert!(validate_tag("k", "v w").is_ok());
        assert!(validate_tag("", "v").is_err());
        assert!(validate_tag("k:x", "v").is_err());
        assert!(validate_tag("k", "").is_err());
        assert!(validate_tag("k", "a\nb").is_err());
        let long = "v".repeat(300);
        assert_eq!(
            validate_tag("k", &long).unwrap_err().to_string(),
            format!(
                "value \"{}\"… (300 bytes) of tag `k` is not 1 to 256 bytes without control characters",
                &long[..64]
            )
        );
        assert_eq!(decode_cursor(&encode_cursor("truck_4711")).unwrap(), "truck_4711");
        for bad in ["", "a", "zz", "ff"] {
            assert!(decode_cursor(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn record_round_trips(
            name in "[a-z0-9_]{1,20}",
            kind in proptest::option::of("[a-z]{1,8}"),
            tags in proptest::collection::btree_map("[a-z]{1,5}", "[ -~]{1,10}", 0..5),
            parent in proptest::option::of("[a-z]{1,3}(/[a-z]{1,3}){0,3}"),
        ) {
            let ancestors = parent.as_deref().map(ancestors_of).unwrap_or_default();
            let r = DeviceRecord { name, kind, tags, parent, ancestors };
            prop_assert_eq!(decode_record(&encode_record(&r)).unwrap(), r);
        }
    }
}
