//! InfluxDB line protocol → readings: the [`crate::wire`] rules applied to parsed [`Line`]s.
//!
//! [`crate::lineproto`] owns the grammar; this module owns what a line means to Hourglass. It
//! does no I/O and never fails: [`decode_lines`] turns one payload into an [`IngestBatch`] whose
//! readings are valid and whose dead letters say which line was wrong and why. A bad line
//! never stops the lines after it.
//!
//! # Mapping
//!
//! | line protocol | Hourglass |
//! |---|---|
//! | measurement | table ([`crate::wire::valid_table_name`]) |
//! | tag [`LpConfig::device_tag`] (default `name`), else tag `device`, else the message key (Kafka) | device |
//! | other tags | the device's tags in the registry: merged into its record (a tag's value replaced, other tags kept) after the readings commit, written only when they change; a tag the registry refuses is left out |
//! | float field | an `f64` value |
//! | integer (`i`) field | an `i64` value |
//! | unsigned (`u`) field | an `i64` value when it is at most 2^63 - 1; a larger one is not stored: the line's other fields are stored and a [`DeadLetterReason::IntegerOutOfRange`] letter names the fields left out (a line with no other field is that letter alone) |
//! | boolean field | a `bool` value |
//! | string field | a string value |
//! | timestamp | converted with [`LpConfig::precision`] to epoch ms; a line without one takes the receive time; outside 1900–2200: [`DeadLetterReason::InvalidTimestamp`] |
//!
//! Field names follow [`crate::wire::valid_field_name`]. A dead letter of a line carries that
//! line's text as its payload and starts its detail with `line N:` (1-based, comments and blank
//! lines counted). A line that is not UTF-8 is an [`DeadLetterReason::InvalidLineProtocol`]
//! letter; the payload's other lines are read as any.
//!
//! ```
//! use ingest::lpwire::{decode_lines, LpConfig};
//! use model::{DeadLetterReason, Value};
//!
//! let payload = b"cpu,name=host_1 usage=0.5,cores=8i,up=t 1704067200000000000\ncpu,name=host_2 usage=oops\n";
//! let batch = decode_lines(&LpConfig::default(), "hourglass/lp", None, payload, 0);
//! assert_eq!(batch.readings.len(), 1);
//! assert_eq!(&*batch.readings[0].table, "cpu");
//! assert_eq!(batch.readings[0].reading.get("cores"), Some(&Value::I64(8)));
//! assert_eq!(batch.readings[0].reading.get("up"), Some(&Value::Bool(true)));
//! assert_eq!(batch.dead_letters[0].reason, DeadLetterReason::InvalidLineProtocol);
//! assert!(batch.dead_letters[0].detail.starts_with("line 2: "));
//! assert_eq!(batch.dead_letters[0].payload, b"cpu,name=host_2 usage=oops");
//! ```

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::Arc;

use model::{DeadLetter, DeadLetterReason, DeviceReading, FieldName, IngestBatch, PrepareRows, Reading, Value};

use crate::lineproto::{
    parse_lines, payload_str, Expect, FieldValue, Line, LineErrorKind, PlainKeys, Precision, SeriesKey,
};
use crate::wire::{
    preview, valid_device_name, valid_field_name, valid_table_name, DEVICE_RULE, FIELD_RULE, MAX_TS, MIN_TS,
    OUTSIDE_WINDOW, TABLE_RULE,
};

/// The tag naming the device when [`LpConfig::device_tag`] is absent from a line.
pub const FALLBACK_DEVICE_TAG: &str = "device";

/// How line-protocol payloads map to readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LpConfig {
    /// Unit of the timestamps. Default nanoseconds, as InfluxDB and Telegraf write them.
    pub precision: Precision,
    /// The tag whose value names the device. Default `name`; a line without it falls back to
    /// the `device` tag, then to the message key.
    pub device_tag: String,
    /// Whether lines without a timestamp take their times from [`RECEIVE_CLOCK`], so that a
    /// device's payloads received in one millisecond are not one reading (the consumers':
    /// `serve` sets it), or the payload's receive time as is (the default: a payload decoded
    /// alone, as tests and tools do).
    pub receive_clock: bool,
}

impl Default for LpConfig {
    fn default() -> Self {
        LpConfig { precision: Precision::Nanoseconds, device_tag: "name".to_string(), receive_clock: false }
    }
}

/// Decodes one line-protocol payload. `key` is the message's key (a Kafka key): as text, it
/// names the device of the lines that have no device tag (an empty one names none, and one
/// that is not UTF-8 is shown in their dead letters); `source` names the origin in dead
/// letters; `received_ms` stamps them and is the time of lines without a timestamp (with
/// [`LpConfig::receive_clock`], a millisecond on from the previous payload's of their device
/// if that took it: [`RECEIVE_CLOCK`]).
pub fn decode_lines(cfg: &LpConfig, source: &str, key: Option<&[u8]>, payload: &[u8], received_ms: i64) -> IngestBatch {
    decode_lines_remembering(cfg, source, key, payload, received_ms, &mut TagMemory::one_payload())
}

/// The tags each device's lines last reported, kept by a consumer across payloads: lines that
/// repeat their device's tags (InfluxDB clients send them on every line) then add no report to
/// [`IngestBatch::device_tags`] after the first. Bounded: past [`TagMemory::CAPACITY`] devices
/// it starts over (a device then reports once more). Forget it ([`TagMemory::clear`]) whenever
/// decoded batches may be dropped before they are stored (a Kafka rebalance), or a report
/// dropped with them would never be made again.
///
/// It also remembers the series keys of the lines it decoded ([`SeriesKey`]: the measurement
/// and tags as they were written), with the device each names: a line whose key it knows, and
/// whose device's tags are still the ones noted for that key, has its tags neither parsed nor
/// hashed again. At most [`TagMemory::SERIES_CAPACITY`] keys of at most
/// [`TagMemory::SERIES_BYTES`] in all; past either it forgets the keys and starts over.
#[derive(Debug)]
pub struct TagMemory {
    /// Per device, its slot in `noted`.
    seen: HashMap<Arc<str>, u32, ahash::RandomState>,
    /// Per slot, an order-independent hash of the device's last noted tags.
    noted: Vec<u64>,
    /// Per slot, whether another memory has reported other tags for the device since
    /// ([`TagMemory::reported_elsewhere`]): its next line reports its tags whatever they are.
    stale: Vec<bool>,
    /// Keys of that hash and of the series keys' (random: device names and tags are external
    /// input).
    keys: ahash::RandomState,
    /// The series keys known; `None` in a memory of one payload ([`decode_lines`]).
    series: Option<KnownKeys>,
    /// The [`LpConfig::device_tag`] the keys were learned with: a key names its device by it.
    device_tag: String,
    /// Times the devices were forgotten: a slot is of the generation it was given in.
    generation: u64,
    /// The store's memo of this memory's batches ([`model::PrepareBatch`]).
    pub prepare_memo: model::PrepareMemo,
    /// The store's tag changes read up to here ([`TagMemory::catch_up`]).
    changes_read: u64,
}

impl Default for TagMemory {
    fn default() -> Self {
        TagMemory {
            seen: HashMap::default(),
            noted: Vec::new(),
            stale: Vec::new(),
            keys: ahash::RandomState::new(),
            series: Some(KnownKeys::default()),
            device_tag: String::new(),
            generation: 0,
            prepare_memo: model::PrepareMemo::default(),
            changes_read: 0,
        }
    }
}

/// The store's tag changes as an intake holds them ([`TagMemory::catch_up`]); none by default
/// (tests and tools without a store).
#[derive(Clone, Default)]
pub struct TagChangesSource(pub Option<Arc<dyn model::TagChanges>>);

impl TagChangesSource {
    /// The store's changes.
    pub fn new(changes: Arc<dyn model::TagChanges>) -> TagChangesSource {
        TagChangesSource(Some(changes))
    }

    /// Brings `memory` up to the store's changes, if there is a store.
    pub fn catch_up(&self, memory: &mut TagMemory) {
        if let Some(changes) = &self.0 {
            memory.catch_up(&**changes);
        }
    }
}

impl std::fmt::Debug for TagChangesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "TagChangesSource(store)" } else { "TagChangesSource(none)" })
    }
}

/// Series keys of lines decoded before, with what their lines said.
///
/// Clients send their series in the same order every time (a fleet's devices, each with its
/// measurements), so the key after the one last found is tried first: it lies next to it in
/// memory, and the hash and the table's cache misses are spared.
#[derive(Debug, Default)]
struct KnownKeys {
    /// The keys' bytes, one after another, in the order learned.
    bytes: Vec<u8>,
    /// The keys, in the order learned.
    list: Vec<KnownKey>,
    /// Indexes into `list`, by the key's hash.
    index: hashbrown::HashTable<u32>,
    /// The index in `list` of the key found or learned last.
    last: u32,
}

impl KnownKeys {
    fn forget(&mut self) {
        self.bytes.clear();
        self.list.clear();
        self.index.clear();
        self.last = 0;
    }

    fn key(&self, k: &KnownKey) -> &[u8] {
        &self.bytes[k.at as usize..][..k.len as usize]
    }

    /// The index of `key` in `list`: the one after the last found, or by its hash; the hash
    /// when it is not there.
    fn find(&self, key: &[u8], hash: impl FnOnce() -> u64) -> Result<u32, u64> {
        let next = self.last.wrapping_add(1);
        if let Some(k) = self.list.get(next as usize) {
            if self.key(k) == key {
                return Ok(next);
            }
        }
        let hash = hash();
        let list = &self.list;
        self.index
            .find(hash, |&i| list[i as usize].hash == hash && self.key(&list[i as usize]) == key)
            .copied()
            .ok_or(hash)
    }
}

/// What [`TagMemory::known`] found of a series key.
#[derive(Debug, Clone)]
enum Lookup {
    /// Known, and its device's tags are still the key's: the device.
    Known(Arc<str>),
    /// Known, but its device's tags changed since. The line is decoded in full, which notes
    /// its tags again (the same key bytes, the same tags): the key is good again after it.
    Stale,
    /// Not known; the key's hash, for [`TagMemory::remember`].
    New(u64),
}

/// One key of [`KnownKeys`].
#[derive(Debug, Clone)]
struct KnownKey {
    hash: u64,
    /// Where the key's bytes are in [`KnownKeys::bytes`].
    at: u32,
    len: u32,
    /// The device it names (a tag's value), shared by every line of the key: one allocation
    /// for all payloads, and the same pointer each time (the store's preparation of a batch
    /// knows a device's id by it, [`model::PrepareMemo`]).
    device: Arc<str>,
    /// The device's slot in [`TagMemory::noted`] and the hash of the line's other tags: known
    /// while the device's noted tags are these. `None` when the line has no other tag.
    tags: Option<(u32, u64)>,
}

impl TagMemory {
    /// Devices remembered at most.
    pub const CAPACITY: usize = 1_000_000;
    /// Series keys remembered at most.
    pub const SERIES_CAPACITY: usize = 200_000;
    /// Bytes of series keys remembered at most.
    pub const SERIES_BYTES: usize = 16 << 20;

    /// A memory for one payload only: it keeps no series keys.
    pub(crate) fn one_payload() -> TagMemory {
        TagMemory { series: None, ..TagMemory::default() }
    }

    /// Forgets every device (and every series key).
    pub fn clear(&mut self) {
        self.seen.clear();
        self.noted.clear();
        self.stale.clear();
        self.generation += 1;
        self.forget_keys();
    }

    /// Another memory of the same intake reported `tags` for `device`, so the store holds those
    /// now: unless they are the ones noted here, this memory's note is stale, and its next line
    /// of the device reports the device's tags again, whichever they are (they may be the ones
    /// noted here, no longer the store's).
    pub fn reported_elsewhere(&mut self, device: &str, tags: &[(String, String)]) {
        let Some(&slot) = self.seen.get(device) else { return };
        let hash = tags_hash(&self.keys, tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        // The store holds the tags reported last: the note is current only if it is those.
        self.stale[slot as usize] = self.noted[slot as usize] != hash;
    }

    /// The next line of `device` reports its tags again, whichever they are (a report of them
    /// was not taken: its writer may not change them).
    pub fn report_again(&mut self, device: &str) {
        if let Some(&slot) = self.seen.get(device) {
            self.stale[slot as usize] = true;
        }
    }

    /// Reads the store's tag changes since the last call: a device whose stored tags any
    /// source changed meanwhile (another intake, MQTT's line protocol, this one) is noted stale,
    /// so its next line reports its tags whatever they are (this memory's note may be the tags
    /// before the change). Behind the store's log, it forgets every device. One atomic read
    /// when nothing changed.
    pub fn catch_up(&mut self, changes: &dyn model::TagChanges) {
        if changes.next_change() == self.changes_read {
            return;
        }
        let mut devices = Vec::new();
        match changes.changes_since(self.changes_read, &mut devices) {
            Ok(next) => {
                for device in &devices {
                    if let Some(&slot) = self.seen.get(&**device) {
                        self.stale[slot as usize] = true;
                    }
                }
                self.changes_read = next;
            }
            Err(next) => {
                self.clear();
                self.changes_read = next;
            }
        }
    }

    /// Forgets every series key.
    fn forget_keys(&mut self) {
        if let Some(series) = &mut self.series {
            series.forget();
        }
    }

    /// Notes `hash` as `device`'s tags: whether they differ from the ones noted before, and
    /// the device's slot.
    fn note(&mut self, device: &Arc<str>, hash: u64) -> (bool, u32) {
        if let Some(&slot) = self.seen.get(device) {
            let noted = &mut self.noted[slot as usize];
            // Both read, and the stale mark cleared, whichever decides.
            let stale = std::mem::take(&mut self.stale[slot as usize]);
            let changed = *noted != hash || stale;
            *noted = hash;
            return (changed, slot);
        }
        if self.seen.len() >= Self::CAPACITY {
            self.clear();
        }
        let slot = u32::try_from(self.noted.len()).expect("at most CAPACITY devices");
        self.noted.push(hash);
        self.stale.push(false);
        self.seen.insert(device.clone(), slot);
        (true, slot)
    }

    /// What the memory knows of series key `key`; `None` in a memory that keeps no keys.
    fn known(&mut self, key: &str) -> Option<Lookup> {
        let series = self.series.as_mut()?;
        let keys = &self.keys;
        let found = match series.find(key.as_bytes(), || keys.hash_one(key.as_bytes())) {
            Ok(found) => found,
            Err(hash) => return Some(Lookup::New(hash)),
        };
        series.last = found;
        let k = &series.list[found as usize];
        Some(match k.tags {
            Some((slot, tags))
                if self.noted.get(slot as usize) != Some(&tags) || self.stale.get(slot as usize) == Some(&true) =>
            {
                Lookup::Stale
            }
            _ => Lookup::Known(Arc::clone(&k.device)),
        })
    }

    /// Remembers a line's series key, not known ([`Lookup::New`]) and of hash `hash`: its
    /// device is `device` (named by a tag of the key) and its other tags are `tags` (the
    /// device's slot and their hash, as noted just now).
    fn remember(&mut self, key: &str, hash: u64, device: &Arc<str>, tags: Option<(u32, u64)>) {
        let Some(series) = &mut self.series else { return };
        if series.list.len() >= Self::SERIES_CAPACITY || series.bytes.len() + key.len() > Self::SERIES_BYTES {
            series.forget();
        }
        // Keys are at most MAX_SERIES_KEY_BYTES long and the bytes at most SERIES_BYTES.
        let fit = |n: usize| u32::try_from(n).expect("within SERIES_BYTES");
        let entry =
            KnownKey { hash, at: fit(series.bytes.len()), len: fit(key.len()), device: Arc::clone(device), tags };
        let at = fit(series.list.len());
        series.bytes.extend_from_slice(key.as_bytes());
        series.list.push(entry);
        let list = &series.list;
        series.index.insert_unique(hash, at, |&i| list[i as usize].hash);
        series.last = at;
    }
}

/// The hash a [`TagMemory`] notes a device's tags by, under its `keys`: order-independent, so
/// the same tags in another order are the same tags.
fn tags_hash<'t>(keys: &ahash::RandomState, tags: impl Iterator<Item = (&'t str, &'t str)>) -> u64 {
    tags.fold(0u64, |acc, tag| acc.wrapping_add(keys.hash_one(tag)))
}

/// [`decode_lines`] with a consumer's [`TagMemory`], so that a device's unchanged tags are
/// reported once, not once a payload.
pub fn decode_lines_remembering(
    cfg: &LpConfig,
    source: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    received_ms: i64,
    memory: &mut TagMemory,
) -> IngestBatch {
    decode_lines_into(cfg, source, key, payload, received_ms, memory, None)
}

/// [`decode_lines_remembering`], handing each valid reading to a store's preparation `rows`
/// ([`model::PrepareBatch::rows`]) as it is decoded instead of building it as a [`Reading`]:
/// the batch's [`IngestBatch::prepared`] holds the readings `rows` took (those before the first
/// it refused), [`IngestBatch::readings`] the rest, and [`IngestBatch::messages`] the tables of
/// those it took, once each (as [`IngestBatch::count_as_message`] counts readings' tables).
pub fn decode_lines_preparing(
    cfg: &LpConfig,
    source: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    received_ms: i64,
    memory: &mut TagMemory,
    rows: Box<dyn PrepareRows + '_>,
) -> IngestBatch {
    decode_lines_into(cfg, source, key, payload, received_ms, memory, Some(rows))
}

fn decode_lines_into<'r>(
    cfg: &LpConfig,
    source: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    received_ms: i64,
    memory: &mut TagMemory,
    rows: Option<Box<dyn PrepareRows + 'r>>,
) -> IngestBatch {
    let key = key.filter(|k| !k.is_empty());
    if memory.device_tag != cfg.device_tag {
        memory.forget_keys();
        memory.device_tag.clone_from(&cfg.device_tag);
    }
    let mut dec = LineDecoder {
        cfg,
        source,
        received_ms,
        key,
        key_device: key.and_then(|k| std::str::from_utf8(k).ok()),
        payload,
        line_starts: None,
        names: Names::default(),
        reported: memory,
        layouts: Vec::new(),
        next_layout: 0,
        last_device: None,
        last_noted: None,
        // Room for the readings at once (a line is rarely under 64 bytes): growing the vector
        // by doubling took fresh memory pages at every step, as the batches before were freed
        // by the store's thread. None when the store prepares them: most go there.
        batch: IngestBatch {
            readings: Vec::with_capacity(if rows.is_some() { 0 } else { payload.len() / 64 + 1 }),
            ..IngestBatch::default()
        },
        rows,
        rows_open: true,
        values: Vec::new(),
        quick_values: Vec::new(),
        untimed: HashMap::default(),
    };
    // A payload that is not UTF-8 is read without its lines that are not (each a dead letter,
    // given in line order among the others').
    let repaired;
    let (text, mut not_utf8) = match payload_str(payload) {
        Ok(text) => (text, Vec::new().into_iter().peekable()),
        Err(_) => {
            let (text, bad) = crate::lineproto::utf8_lines(payload);
            repaired = text;
            (repaired.as_str(), bad.into_iter().peekable())
        }
    };
    let mut reject_not_utf8_before = |dec: &mut LineDecoder<'_, '_>, number: usize| {
        while let Some(bad) = not_utf8.next_if(|bad| bad.line < number) {
            let detail = format!("not UTF-8 (invalid byte at offset {} of the payload)", bad.offset);
            dec.reject_line(bad.line, DeadLetterReason::InvalidLineProtocol, detail);
        }
    };
    // A JSON payload sent where line protocol is read (a table named `lp` written through the
    // MQTT gateway topic `{prefix}/lp`, a JSON body to `/write`) has its first line's refusal
    // say so.
    let mut json_hint = text.trim_start().starts_with(['{', '[']);
    let mut lines = parse_lines(text, cfg.precision, received_ms);
    loop {
        // What the memory knows of the line's series key, when it knows it; and the layout
        // the line was read as, for a quick one.
        let mut hit = None;
        let mut offered = None;
        let next = if dec.reported.series.is_some() {
            let memory = &mut *dec.reported;
            let mut expecting = Expecting { layouts: &dec.layouts, values: &mut dec.quick_values, offered: None };
            let next = lines.next_expecting(
                |key| {
                    hit = memory.known(key);
                    matches!(hit, Some(Lookup::Known(_)))
                },
                &mut expecting,
            );
            offered = expecting.offered;
            next
        } else {
            lines.next().map(|line| (line, SeriesKey::None))
        };
        let Some((line, key)) = next else { break };
        reject_not_utf8_before(&mut dec, line.as_ref().map_or_else(|e| e.line, |l| l.number));
        match line {
            Ok(line) if matches!(key, SeriesKey::Quick(_)) => {
                let number = line.number;
                let (Some(Lookup::Known(device)), Some(layout)) = (hit, offered) else {
                    unreachable!("a quick line is of a known key, read as the layout offered")
                };
                if let Err((reason, detail)) = dec.quick(line, device, layout) {
                    dec.reject_line(number, reason, detail);
                }
            }
            Ok(line) => {
                let number = line.number;
                if let Err((reason, detail)) = dec.line(line, key, hit) {
                    dec.reject_line(number, reason, detail);
                }
            }
            Err(e) => {
                let reason = match e.kind {
                    LineErrorKind::Syntax | LineErrorKind::FieldValue => DeadLetterReason::InvalidLineProtocol,
                    LineErrorKind::NoFields => DeadLetterReason::NoFields,
                    LineErrorKind::Timestamp => DeadLetterReason::InvalidTimestamp,
                };
                // Said once, on the first line refused as not line protocol.
                let hint = json_hint && reason == DeadLetterReason::InvalidLineProtocol;
                json_hint &= !hint;
                let detail = match hint {
                    true => format!("{} (JSON? this source reads InfluxDB line protocol)", e.reason),
                    false => e.reason,
                };
                dec.reject_line(e.line, reason, detail);
            }
        }
    }
    reject_not_utf8_before(&mut dec, usize::MAX);
    dec.finish()
}

/// The Fx hash (rustc's): a multiply-rotate per word, far cheaper than the default SipHash for
/// the short names hashed here once or twice a line. Not DoS-resistant; the keys are names from
/// one payload, bounded by its size.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxBuild = std::hash::BuildHasherDefault<FxHasher>;

/// Shared names, so readings of one table, device or field share one `Arc` (the bucketer
/// skips name lookups for consecutive readings of the same table and device).
#[derive(Default)]
struct Names {
    set: HashSet<Arc<str>, FxBuild>,
    /// The name last returned for each slot (the table, then each field position): lines of
    /// one measurement repeat them, and comparing is cheaper than hashing.
    recent: Vec<Option<Arc<str>>>,
}

impl Names {
    /// [`Names::get`], first trying the name last returned for `slot`.
    fn get_at(&mut self, slot: usize, name: &str) -> Arc<str> {
        if let Some(Some(recent)) = self.recent.get(slot) {
            if &**recent == name {
                return Arc::clone(recent);
            }
        }
        let shared = self.get(name);
        if self.recent.len() <= slot {
            self.recent.resize(slot + 1, None);
        }
        self.recent[slot] = Some(Arc::clone(&shared));
        shared
    }

    fn get(&mut self, name: &str) -> Arc<str> {
        match self.set.get(name) {
            Some(shared) => Arc::clone(shared),
            None => {
                let shared: Arc<str> = Arc::from(name);
                self.set.insert(Arc::clone(&shared));
                shared
            }
        }
    }
}

/// A measurement's field layout as last seen: lines of one measurement nearly always carry the
/// same fields in the same order, so their names, checks and sort order are worked out once.
struct Layout {
    table: Arc<str>,
    /// Field names in line order, each valid and distinct.
    names: Vec<FieldName>,
    /// Positions in `names`, in name order (the order of [`Reading::fields`]).
    order: Vec<usize>,
    /// The names in name order.
    sorted: Vec<FieldName>,
    /// The names as keys a line carries unescaped, if they are ([`Lines::next_expecting`]).
    ///
    /// [`Lines::next_expecting`]: crate::lineproto::Lines::next_expecting
    plain: Option<PlainKeys>,
}

impl Layout {
    /// Layouts kept per payload: more measurements than this take turns.
    const KEPT: usize = 8;

    /// Whether `line` is of this measurement and carries these fields in this order.
    fn fits(&self, line: &Line<'_>) -> bool {
        *self.table == *line.measurement
            && self.names.len() == line.fields.len()
            && self.names.iter().zip(&line.fields).all(|(n, (k, _))| **n == **k)
    }

    /// The values of a line that [`Layout::fits`], in name order (of [`Layout::sorted`]), put
    /// in `out`; `false` when a value does not fit a stored type (an unsigned integer above
    /// `i64::MAX`).
    fn values_into(&self, line: &Line<'_>, out: &mut Vec<Value>) -> bool {
        fill(self.order.iter().map(|&i| &line.fields[i].1), out)
    }

    /// [`Layout::values_into`] for the values of a line in line order, as
    /// [`Lines::next_expecting`] gives them.
    ///
    /// [`Lines::next_expecting`]: crate::lineproto::Lines::next_expecting
    fn quick_values_into(&self, values: &[FieldValue<'_>], out: &mut Vec<Value>) -> bool {
        fill(self.order.iter().map(|&i| &values[i]), out)
    }
}

/// `values` as stored values in `out`; `false` when one does not fit a stored type.
fn fill<'v>(values: impl Iterator<Item = &'v FieldValue<'v>>, out: &mut Vec<Value>) -> bool {
    out.clear();
    for value in values {
        match value_of(value) {
            Some(v) => out.push(v),
            None => return false,
        }
    }
    true
}

/// What the decoder expects of a line of a series key its memory knows ([`Expect`]): the
/// fields of the first [`Layout`] of the key's measurement whose names are plain keys.
struct Expecting<'d> {
    layouts: &'d [Layout],
    values: &'d mut Vec<FieldValue<'static>>,
    /// The layout offered for the line last asked about.
    offered: Option<usize>,
}

impl<'a> Expect<'a> for Expecting<'_> {
    fn fields(&mut self, measurement: &'a str) -> Option<(&PlainKeys, &mut Vec<FieldValue<'static>>)> {
        let at = self.layouts.iter().position(|l| l.plain.is_some() && *l.table == *measurement);
        self.offered = at;
        Some((self.layouts[at?].plain.as_ref()?, &mut *self.values))
    }
}

/// A reading time in the accepted window, or why not.
fn in_window(ts: i64) -> Result<(), Problem> {
    if (MIN_TS..MAX_TS).contains(&ts) {
        Ok(())
    } else {
        Err((DeadLetterReason::InvalidTimestamp, format!("timestamp {ts} ms is {OUTSIDE_WINDOW}")))
    }
}

/// What a valid line holds besides its device and time.
enum Body {
    /// Fields of [`LineDecoder::layouts`]`[i]`, values in [`LineDecoder::values`].
    Layout(usize),
    /// A table's fields in name order.
    Fields(Arc<str>, Vec<(FieldName, Value)>),
}

/// The stored value of a line's field value; `None` for an unsigned integer above `i64::MAX`.
fn value_of(value: &FieldValue<'_>) -> Option<Value> {
    Some(match value {
        FieldValue::Float(v) => Value::F64(*v),
        FieldValue::Int(v) => Value::I64(*v),
        FieldValue::UInt(v) => Value::I64(i64::try_from(*v).ok()?),
        FieldValue::Bool(b) => Value::Bool(*b),
        FieldValue::Str(s) => Value::Str(Arc::from(s.as_ref())),
    })
}

struct LineDecoder<'a, 'r> {
    cfg: &'a LpConfig,
    source: &'a str,
    received_ms: i64,
    /// The message key, if not empty.
    key: Option<&'a [u8]>,
    /// The device it names: the key as text.
    key_device: Option<&'a str>,
    payload: &'a [u8],
    /// Byte offset of the start of each line, built on the first dead letter.
    line_starts: Option<Vec<usize>>,
    names: Names,
    /// Per device, the tags last noted for it (in this payload, or before: the consumer's).
    reported: &'a mut TagMemory,
    batch: IngestBatch,
    /// The field layouts of the measurements seen, at most [`Layout::KEPT`].
    layouts: Vec<Layout>,
    /// The layout the next one learned replaces, once `layouts` is full.
    next_layout: usize,
    /// The device of the line before, its name valid.
    last_device: Option<Arc<str>>,
    /// The device and tags' hash of the last line with tags besides the device's: noted in
    /// `reported` already, so the next line of that device with the same tags (the device's
    /// next measurement, usually) skips the lookup; with the device's slot there and the
    /// memory's generation.
    last_noted: Option<(Arc<str>, u64, u32, u64)>,
    /// The store's preparation the readings go to ([`decode_lines_preparing`]), if any.
    rows: Option<Box<dyn PrepareRows + 'r>>,
    /// Whether `rows` takes readings still: not after it refused one.
    rows_open: bool,
    /// The values of the line at hand, of a [`Body::Layout`].
    values: Vec<Value>,
    /// The values of a line read as its layout's ([`SeriesKey::Quick`]), in line order.
    quick_values: Vec<FieldValue<'static>>,
    /// Per device with lines without a timestamp, the time they take ([`RECEIVE_CLOCK`]).
    untimed: HashMap<Arc<str>, i64, std::hash::BuildHasherDefault<FxHasher>>,
}

/// The times of lines without a timestamp. A payload's such lines of one device take one time,
/// its receive time, unless that device's previous payload took it or a later one: then the
/// millisecond after that one. So a device's payloads received in one millisecond (two HTTP
/// requests, two MQTT messages) are two readings, not one replacing the other, acknowledged
/// and lost. Devices share 65,536 slots by a hash of their names: of two devices in one slot
/// in one millisecond, the second's time is a millisecond later. The times run ahead of the
/// clock by at most [`ReceiveClock::MAX_AHEAD_MS`]: past it (a device sending more than a
/// payload a millisecond without timestamps, or the clock set back) the receive time is taken
/// as is.
pub static RECEIVE_CLOCK: std::sync::LazyLock<ReceiveClock> = std::sync::LazyLock::new(ReceiveClock::new);

/// See [`RECEIVE_CLOCK`].
pub struct ReceiveClock {
    /// Per slot, the last time taken.
    slots: Box<[std::sync::atomic::AtomicI64]>,
    /// Keys of the slots' hash (random: device names are external input).
    keys: ahash::RandomState,
}

impl std::fmt::Debug for ReceiveClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiveClock").field("slots", &self.slots.len()).finish_non_exhaustive()
    }
}

impl ReceiveClock {
    const SLOTS: usize = 1 << 16;
    /// How far ahead of the receive time a time may be taken.
    pub const MAX_AHEAD_MS: i64 = 1000;

    fn new() -> ReceiveClock {
        let slots = (0..Self::SLOTS).map(|_| std::sync::atomic::AtomicI64::new(i64::MIN)).collect();
        ReceiveClock { slots, keys: ahash::RandomState::new() }
    }

    /// The time of a payload's lines without a timestamp of `device`, received at `now_ms`.
    pub fn time(&self, device: &str, now_ms: i64) -> i64 {
        use std::sync::atomic::Ordering::Relaxed;
        let slot = &self.slots[self.keys.hash_one(device) as usize & (Self::SLOTS - 1)];
        let mut last = slot.load(Relaxed);
        loop {
            let next = last.saturating_add(1);
            let t = if next > now_ms.saturating_add(Self::MAX_AHEAD_MS) { now_ms } else { now_ms.max(next) };
            match slot.compare_exchange_weak(last, t, Relaxed, Relaxed) {
                Ok(_) => return t,
                Err(now_last) => last = now_last,
            }
        }
    }
}

type Problem = (DeadLetterReason, String);

/// A reading's fields, with the problem of any left out.
type Fields = (Vec<(FieldName, Value)>, Option<Problem>);

impl LineDecoder<'_, '_> {
    /// Files the reading of one parsed line, or says why it cannot be stored. `key` is the
    /// line's series key and `hit` what the memory knows of it (for a [`SeriesKey::Known`] key,
    /// [`Lookup::Known`]: the line's tags were not parsed).
    fn line(&mut self, line: Line<'_>, key: SeriesKey<'_>, hit: Option<Lookup>) -> Result<(), Problem> {
        let (key, known) = match (key, hit) {
            (SeriesKey::Known(_), Some(Lookup::Known(device))) => (None, Some(device)),
            (key, hit) => (Some((key, hit)), None),
        };
        let layout = self.layouts.iter().position(|l| l.fits(&line));
        if layout.is_none() && known.is_none() && !valid_table_name(&line.measurement) {
            return Err((
                DeadLetterReason::InvalidTable,
                format!("measurement {} is not allowed as a table name ({TABLE_RULE})", preview(&line.measurement)),
            ));
        }
        let cfg = self.cfg;
        // The device: the one of the key the memory knows, or named by a tag, or by the
        // message key.
        let (device_key, shared, from_tag) = match known {
            Some(device) => ("", device, true),
            None => {
                let (device_key, device, from_tag) = match line.tag(&cfg.device_tag) {
                    Some(d) => (cfg.device_tag.as_str(), d, true),
                    None => match line.tag(FALLBACK_DEVICE_TAG) {
                        Some(d) => (FALLBACK_DEVICE_TAG, d, true),
                        None => {
                            let d = self.key_device.ok_or_else(|| {
                                // Only a Kafka message has a key to name the device; one that
                                // is there names none only when it is not text.
                                let key = match (self.source.starts_with("kafka:"), self.key) {
                                    (false, _) => String::new(),
                                    (true, Some(k)) => format!(", and {}", crate::wire::unusable_key(k)),
                                    (true, None) => ", and no message key does".into(),
                                };
                                (
                                    DeadLetterReason::InvalidDevice,
                                    format!(
                                        "no `{}` (lineproto.device_tag) or `{FALLBACK_DEVICE_TAG}` tag names the \
                                         device{key}",
                                        self.cfg.device_tag
                                    ),
                                )
                            })?;
                            (FALLBACK_DEVICE_TAG, d, false)
                        }
                    },
                };
                // A device's lines often come in a run (one line per measurement): its name
                // was checked and shared for the line before.
                let shared = match &self.last_device {
                    Some(last) if **last == *device => Arc::clone(last),
                    _ => {
                        if !valid_device_name(device) {
                            return Err((
                                DeadLetterReason::InvalidDevice,
                                format!("device {} is not allowed ({DEVICE_RULE})", preview(device)),
                            ));
                        }
                        let shared = self.names.get(device);
                        self.last_device = Some(Arc::clone(&shared));
                        shared
                    }
                };
                (device_key, shared, from_tag)
            }
        };
        let ts = self.time_of(&line, &shared);
        in_window(ts)?;
        let fitted = layout.filter(|&i| self.layouts[i].values_into(&line, &mut self.values));
        let (body, range_problem) = match fitted {
            Some(i) => (Body::Layout(i), None),
            None => {
                let (fields, range_problem) = self.fields(&line)?;
                if fields.is_empty() {
                    return range_problem.map_or(Ok(()), Err);
                }
                let table = self.names.get_at(0, &line.measurement);
                if range_problem.is_none() {
                    self.learn(&table, &fields);
                }
                (Body::Fields(table, Reading::new(ts, fields).fields), range_problem)
            }
        };
        // A device's lines usually repeat its tags: note them when they differ from the
        // ones last noted for it. A known key's tags are the ones noted (`TagMemory::known`).
        if let Some((key, hit)) = key {
            let others = || line.tags.iter().filter(|(k, _)| k != device_key);
            let mut noted_tags = None;
            if others().next().is_some() {
                let seen = tags_hash(&self.reported.keys, others().map(|(k, v)| (&**k, &**v)));
                let generation = self.reported.generation;
                let slot = match &self.last_noted {
                    Some((d, h, slot, g)) if Arc::ptr_eq(d, &shared) && *h == seen && *g == generation => *slot,
                    _ => {
                        let (changed, slot) = self.reported.note(&shared, seen);
                        if changed {
                            let tags = others().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                            self.batch.device_tags.push((shared.clone(), tags));
                        }
                        self.last_noted = Some((shared.clone(), seen, slot, self.reported.generation));
                        slot
                    }
                };
                noted_tags = Some((slot, seen));
            }
            if let (SeriesKey::New(key), Some(Lookup::New(hash)), true) = (key, hit, from_tag) {
                self.reported.remember(key, hash, &shared, noted_tags);
            }
        }
        self.file(shared, ts, body);
        match range_problem {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// The time of `line` of `device`: its timestamp, or its payload's time for the device
    /// ([`RECEIVE_CLOCK`]).
    fn time_of(&mut self, line: &Line<'_>, device: &Arc<str>) -> i64 {
        if line.timestamped {
            return line.timestamp_ms;
        }
        if let Some(&t) = self.untimed.get(device) {
            return t;
        }
        let t = match self.cfg.receive_clock {
            true => RECEIVE_CLOCK.time(device, self.received_ms),
            false => self.received_ms,
        };
        self.untimed.insert(Arc::clone(device), t);
        t
    }

    /// [`LineDecoder::line`] for a line read as layout `layout` ([`SeriesKey::Quick`]: its values
    /// are in `quick_values`) of known device `device`.
    fn quick(&mut self, line: Line<'_>, device: Arc<str>, layout: usize) -> Result<(), Problem> {
        let l = &self.layouts[layout];
        if !l.quick_values_into(&self.quick_values, &mut self.values) {
            // An unsigned value past `i64::MAX`: the line with its fields, as the parser would
            // have given it, goes the general way (which stores the others and says why not it).
            let names = l.names.iter().map(|n| Cow::Owned(n.to_string()));
            let fields = names.zip(self.quick_values.drain(..)).collect();
            return self.line(Line { fields, ..line }, SeriesKey::Known(""), Some(Lookup::Known(device)));
        }
        let ts = self.time_of(&line, &device);
        in_window(ts)?;
        self.file(device, ts, Body::Layout(layout));
        Ok(())
    }

    /// Files a valid line's reading: to the store's preparation while it takes them, else as a
    /// [`Reading`].
    fn file(&mut self, device: Arc<str>, ts: i64, body: Body) {
        if self.rows_open {
            if let Some(rows) = &mut self.rows {
                let (table, taken) = match &body {
                    Body::Layout(i) => {
                        let l = &self.layouts[*i];
                        (&l.table, rows.push(&l.table, &device, ts, &l.sorted, &self.values))
                    }
                    Body::Fields(table, fields) => {
                        let names: Vec<FieldName> = fields.iter().map(|(n, _)| Arc::clone(n)).collect();
                        let values: Vec<Value> = fields.iter().map(|(_, v)| v.clone()).collect();
                        (table, rows.push(table, &device, ts, &names, &values))
                    }
                };
                if taken {
                    self.batch.count_message_of(table);
                    return;
                }
                self.rows_open = false;
            }
        }
        let (table, fields) = match body {
            Body::Layout(i) => {
                let l = &self.layouts[i];
                (Arc::clone(&l.table), l.sorted.iter().cloned().zip(self.values.drain(..)).collect())
            }
            Body::Fields(table, fields) => (table, fields),
        };
        self.batch.readings.push(DeviceReading { table, device, reading: Reading { ts, fields } });
    }

    /// The batch decoded, with the readings the store's preparation took.
    fn finish(mut self) -> IngestBatch {
        if let Some(prepared) = self.rows.take().and_then(|rows| rows.finish()) {
            self.batch.prepared.push(prepared);
        }
        self.batch
    }

    /// The fields of a line no [`Layout`] fits, in line order, checked one by one, with the
    /// problem of those left out (unsigned integers above `i64::MAX`).
    fn fields(&mut self, line: &Line<'_>) -> Result<Fields, Problem> {
        let mut fields: Vec<(FieldName, Value)> = Vec::with_capacity(line.fields.len());
        let mut too_large: Vec<&str> = Vec::new();
        for (name, value) in &line.fields {
            if !valid_field_name(name) {
                return Err((
                    DeadLetterReason::InvalidFieldName,
                    format!("field name {} is not allowed ({FIELD_RULE})", preview(name)),
                ));
            }
            match value_of(value) {
                Some(v) => fields.push((self.names.get_at(1 + fields.len(), name), v)),
                None => too_large.push(name),
            }
        }
        let range_problem = (!too_large.is_empty()).then(|| {
            let list = too_large.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
            let rest = if fields.is_empty() { "the line has no other field" } else { "its other fields are stored" };
            (
                DeadLetterReason::IntegerOutOfRange,
                format!("unsigned field(s) {list} not stored: above 2^63 - 1, the largest integer stored; {rest}"),
            )
        });
        Ok((fields, range_problem))
    }

    /// Keeps the layout of a line whose fields (all of them, in line order) were just checked.
    fn learn(&mut self, table: &Arc<str>, fields: &[(FieldName, Value)]) {
        let names: Vec<FieldName> = fields.iter().map(|(n, _)| Arc::clone(n)).collect();
        let mut order: Vec<usize> = (0..names.len()).collect();
        // The parser refuses a line that repeats a field key: the names are distinct.
        order.sort_unstable_by(|&a, &b| names[a].cmp(&names[b]));
        let sorted = order.iter().map(|&i| Arc::clone(&names[i])).collect();
        let plain = PlainKeys::new(names.iter().map(|n| &**n));
        let layout = Layout { table: Arc::clone(table), names, order, sorted, plain };
        if self.layouts.len() < Layout::KEPT {
            self.layouts.push(layout);
        } else {
            let turn = self.next_layout;
            self.layouts[turn] = layout;
            self.next_layout = (turn + 1) % Layout::KEPT;
        }
    }

    fn reject_line(&mut self, number: usize, reason: DeadLetterReason, detail: String) {
        let payload = self.payload;
        let starts = self.line_starts.get_or_insert_with(|| {
            std::iter::once(0)
                .chain(payload.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1))
                .collect()
        });
        let text = match starts.get(number.saturating_sub(1)) {
            Some(&start) => {
                let end = starts.get(number).map_or(payload.len(), |next| next - 1);
                let line = &payload[start..end.max(start)];
                line.strip_suffix(b"\r").unwrap_or(line)
            }
            None => &[][..],
        };
        // The parser's reasons already start with `line N:`; ours get it here.
        let mut detail = if detail.starts_with("line ") { detail } else { format!("line {number}: {detail}") };
        // A line of an HTTP body can be megabytes long (a string over its limit): its start is
        // kept, as of a payload over its limit.
        let kept = text.len().min(crate::wire::KEPT_OVERSIZED_BYTES);
        if kept < text.len() {
            detail.push_str(&format!("; the first {kept} of the line's {} bytes are kept", text.len()));
        }
        self.batch.dead_letters.push(DeadLetter {
            received_ms: self.received_ms,
            source: self.source.to_string(),
            reason,
            detail,
            payload: text[..kept].to_vec(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's preparation that keeps what it is given as readings, and refuses the readings
    /// of one device.
    struct Taking {
        refuse: &'static str,
        taken: Vec<DeviceReading>,
    }

    impl PrepareRows for Taking {
        fn push(
            &mut self,
            table: &Arc<str>,
            device: &Arc<str>,
            ts: i64,
            names: &[FieldName],
            values: &[Value],
        ) -> bool {
            if &**device == self.refuse {
                return false;
            }
            assert!(names.windows(2).all(|w| w[0] < w[1]), "names ascending: {names:?}");
            let fields = names.iter().cloned().zip(values.iter().cloned()).collect();
            self.taken.push(DeviceReading {
                table: table.clone(),
                device: device.clone(),
                reading: Reading { ts, fields },
            });
            true
        }

        fn finish(self: Box<Self>) -> Option<model::Prepared> {
            (!self.taken.is_empty())
                .then(|| model::Prepared { readings: self.taken.len(), inner: Box::new(self.taken) })
        }
    }

    /// A store's preparation takes each valid line's reading as it is decoded, the readings
    /// it would be built as, up to the first it refuses; that one and every valid line after it
    /// stay readings, in order. Dead letters and tag reports are those of a decode without it.
    #[test]
    fn readings_go_to_the_stores_preparation_until_it_refuses_one() {
        let cfg = LpConfig { precision: Precision::Milliseconds, ..LpConfig::default() };
        let payload = "m,name=a,site=x z=1,w=2i 1704067200000\n\
                       n,name=b v=t 1704067200001\n\
                       m,name=a,site=x z=3,w=4i 1704067200002\n\
                       m,name=a,site=x z=5,w=18446744073709551615u 1704067200003\n\
                       n,name=b v=oops 1704067200004\n\
                       m,name=c z=7,w=8i 1704067200005\n\
                       n,name=b v=f 1704067200006\n\
                       m,name=a,site=y z=9,w=10i 1704067200007\n";
        let plain = decode_lines(&cfg, "t", None, payload.as_bytes(), 0);
        assert_eq!(plain.readings.len(), 7);
        let taking = Box::new(Taking { refuse: "c", taken: Vec::new() });
        let batch = decode_lines_preparing(&cfg, "t", None, payload.as_bytes(), 0, &mut TagMemory::default(), taking);
        assert_eq!(batch.prepared.len(), 1);
        let taken = batch.prepared[0].inner.downcast_ref::<Vec<DeviceReading>>().expect("what Taking took");
        assert_eq!((batch.prepared[0].readings, batch.reading_count()), (4, 7));
        assert_eq!(taken[..], plain.readings[..4]);
        assert_eq!(batch.readings[..], plain.readings[4..]);
        assert_eq!(batch.dead_letters, plain.dead_letters);
        assert_eq!(batch.dead_letters.len(), 2);
        assert_eq!(batch.device_tags, plain.device_tags);
        // The tables of the readings taken, once each.
        let messages: Vec<(&str, u64)> = batch.messages.iter().map(|(t, n)| (&**t, *n)).collect();
        assert_eq!(messages, [("m", 1), ("n", 1)]);
    }

    /// Lines of known series keys in a layout of the payload are read without their fields
    /// being built ([`SeriesKey::Quick`]); the readings, dead letters and tag reports are those
    /// of lines parsed in full, taken by a store's preparation or not.
    #[test]
    fn lines_read_quick_decode_as_in_full() {
        let cfg = LpConfig { precision: Precision::Milliseconds, ..LpConfig::default() };
        let payload = "r,name=t1,fleet=x lat=1.5,lon=2,vel=3i 1704067200000\n\
                       d,name=t1,fleet=x load=0.5,fuel=7i 1704067200000\n\
                       r,name=t2 lat=-1,lon=4,vel=5i 1704067200001\n\
                       d,name=t2 load=1,fuel=8i 1704067200001\n\
                       r,name=t1,fleet=x lat=2.5,lon=3,vel=4u 1704067200002\n\
                       d,name=t2 load=2,fuel=9223372036854775808u 1704067200003\n\
                       r,name=t2 lat=1,lon=2,vel=3i 9000000000000000\n\
                       r,name=t1,fleet=x lat=1,lon=2,vel=3i,extra=1 1704067200004\n\
                       r,name=t1,fleet=x lon=1,lat=2,vel=3i 1704067200005\n\
                       d,name=t1,fleet=x load=1e3,fuel=1i 1704067200006\n\
                       r,name=t2 lat=1,lon=2,vel=3i 1704067200007\r\n\
                       d,name=t2 load=4,fuel=5i\n";
        let now = 1_704_067_200_009;
        let plain = decode_lines(&cfg, "t", None, payload.as_bytes(), now);
        let readings = |b: &IngestBatch| {
            let mut s = summary(b);
            s.retain(|line| !line.starts_with("tags "));
            s
        };
        assert_eq!(
            readings(&plain),
            [
                "r/t1@1704067200000:[(\"lat\", F64(1.5)), (\"lon\", F64(2.0)), (\"vel\", I64(3))]",
                "d/t1@1704067200000:[(\"fuel\", I64(7)), (\"load\", F64(0.5))]",
                "r/t2@1704067200001:[(\"lat\", F64(-1.0)), (\"lon\", F64(4.0)), (\"vel\", I64(5))]",
                "d/t2@1704067200001:[(\"fuel\", I64(8)), (\"load\", F64(1.0))]",
                "r/t1@1704067200002:[(\"lat\", F64(2.5)), (\"lon\", F64(3.0)), (\"vel\", I64(4))]",
                "d/t2@1704067200003:[(\"load\", F64(2.0))]",
                "r/t1@1704067200004:[(\"extra\", F64(1.0)), (\"lat\", F64(1.0)), (\"lon\", F64(2.0)), (\"vel\", I64(3))]",
                "r/t1@1704067200005:[(\"lat\", F64(2.0)), (\"lon\", F64(1.0)), (\"vel\", I64(3))]",
                "d/t1@1704067200006:[(\"fuel\", I64(1)), (\"load\", F64(1000.0))]",
                "r/t2@1704067200007:[(\"lat\", F64(1.0)), (\"lon\", F64(2.0)), (\"vel\", I64(3))]",
                "d/t2@1704067200009:[(\"fuel\", I64(5)), (\"load\", F64(4.0))]",
                "dead IntegerOutOfRange line 6: unsigned field(s) `fuel` not stored: above 2^63 - 1, the largest \
                 integer stored; its other fields are stored",
                "dead InvalidTimestamp line 7: timestamp 9000000000000000 ms is outside the accepted years 1900 to 2199",
            ]
        );
        assert_eq!(summary(&plain)[13..], ["tags t1:[(\"fleet\", \"x\")]"]);
        // Keys learned by the lines before in the payload, then all known from its start; with
        // the store's preparation taking the readings too.
        let mut memory = TagMemory::default();
        let first = decode_lines_remembering(&cfg, "t", None, payload.as_bytes(), now, &mut memory);
        assert_eq!(summary(&first), summary(&plain));
        let again = decode_lines_remembering(&cfg, "t", None, payload.as_bytes(), now, &mut memory);
        assert_eq!((readings(&again), again.device_tags.len()), (readings(&plain), 0));
        let taking = Box::new(Taking { refuse: "none", taken: Vec::new() });
        let prepared = decode_lines_preparing(&cfg, "t", None, payload.as_bytes(), now, &mut memory, taking);
        let taken = prepared.prepared[0].inner.downcast_ref::<Vec<DeviceReading>>().expect("what Taking took");
        assert_eq!((&taken[..], prepared.readings.len()), (&plain.readings[..], 0));
        assert_eq!(prepared.dead_letters, plain.dead_letters);
    }

    fn decode(payload: &str) -> IngestBatch {
        decode_lines(&LpConfig::default(), "test", None, payload.as_bytes(), 1_704_067_200_000)
    }

    /// A store's tag changes as a test sets them: `(first, devices)`, the log's first
    /// sequence number and the devices from it on.
    struct Changes(std::sync::Mutex<(u64, Vec<&'static str>)>);

    impl model::TagChanges for Changes {
        fn next_change(&self) -> u64 {
            let log = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.0 + log.1.len() as u64
        }

        fn changes_since(&self, since: u64, out: &mut Vec<Arc<str>>) -> Result<u64, u64> {
            let log = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let next = log.0 + log.1.len() as u64;
            if since < log.0 || since > next {
                return Err(next);
            }
            out.extend(log.1[(since - log.0) as usize..].iter().map(|d| Arc::from(*d)));
            Ok(next)
        }
    }

    /// A device the store's tag changes name reports its tags again, whatever this memory
    /// noted; one they do not name stays quiet; behind the log, the memory forgets every device.
    #[test]
    fn the_stores_tag_changes_make_a_memorys_notes_stale() {
        let changes = Changes(std::sync::Mutex::new((0, vec![])));
        let cfg = LpConfig::default();
        let mut memory = TagMemory::default();
        let payload = b"m,name=a,site=x v=1 1\nm,name=b,site=x v=2 2\n";
        let decode = |memory: &mut TagMemory| {
            memory.catch_up(&changes);
            let batch = decode_lines_remembering(&cfg, "t", None, payload, 0, memory);
            batch.device_tags.iter().map(|(d, _)| d.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(decode(&mut memory), ["a", "b"]);
        assert_eq!(decode(&mut memory), Vec::<String>::new());
        changes.0.lock().expect("the test log").1.push("a");
        assert_eq!(decode(&mut memory), ["a"]);
        assert_eq!(decode(&mut memory), Vec::<String>::new(), "read once");
        // The log moved past what this memory read: it forgets every device.
        *changes.0.lock().expect("the test log") = (5, vec!["c"]);
        assert_eq!(decode(&mut memory), ["a", "b"]);
        assert_eq!(decode(&mut memory), Vec::<String>::new());
    }

    #[test]
    fn other_tags_are_reported_once_per_run_of_lines() {
        let payload = b"m,name=a,site=x,zone=1 v=1 1\nm,name=a,zone=1,site=x v=2 2\nm,name=a,site=y v=3 3\nm,device=b,name2=q v=4 4\nm,name=c v=5 5\nm,name=a,site=x,zone=1 v=6 6\n";
        let batch = decode_lines(&LpConfig::default(), "t", None, payload, 0);
        assert_eq!(batch.readings.len(), 6);
        let tags: Vec<(&str, Vec<(&str, &str)>)> = batch
            .device_tags
            .iter()
            .map(|(d, t)| (&**d, t.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()))
            .collect();
        assert_eq!(
            tags,
            [
                ("a", vec![("site", "x"), ("zone", "1")]),
                ("a", vec![("site", "y")]),
                ("b", vec![("name2", "q")]),
                // Back to tags it had before the last report: a change again.
                ("a", vec![("site", "x"), ("zone", "1")]),
            ]
        );
    }

    #[test]
    fn a_consumer_remembers_reported_tags_across_payloads_until_cleared() {
        let mut memory = TagMemory::default();
        let reports = |payload: &[u8], memory: &mut TagMemory| -> Vec<String> {
            let batch = decode_lines_remembering(&LpConfig::default(), "t", None, payload, 0, memory);
            assert_eq!(batch.readings.len(), payload.iter().filter(|b| **b == b'\n').count());
            batch.device_tags.iter().map(|(d, t)| format!("{d}:{t:?}")).collect()
        };
        let first = reports(b"m,name=a,site=x v=1 1\nm,name=b,site=y v=1 1\n", &mut memory);
        assert_eq!(first, [r#"a:[("site", "x")]"#, r#"b:[("site", "y")]"#]);
        // The same tags in the next payloads (another measurement, another order): no report.
        assert!(reports(b"n,site=x,name=a v=2 2\nm,name=b,site=y v=2 2\n", &mut memory).is_empty());
        // A change is reported, then remembered.
        assert_eq!(reports(b"m,name=a,site=z v=3 3\n", &mut memory), [r#"a:[("site", "z")]"#]);
        assert!(reports(b"m,name=a,site=z v=4 4\n", &mut memory).is_empty());
        // Forgotten (a rebalance): reported again.
        memory.clear();
        assert_eq!(reports(b"m,name=a,site=z v=5 5\n", &mut memory), [r#"a:[("site", "z")]"#]);
        // Without a memory every payload reports.
        let again = decode_lines(&LpConfig::default(), "t", None, b"m,name=a,site=z v=6 6\n", 0);
        assert_eq!(again.device_tags.len(), 1);
    }

    /// A memory that keeps no series keys, across payloads: what a memory with keys must
    /// match.
    fn without_keys() -> TagMemory {
        TagMemory { series: None, ..TagMemory::default() }
    }

    fn summary(batch: &IngestBatch) -> Vec<String> {
        let mut out: Vec<String> = batch
            .readings
            .iter()
            .map(|r| format!("{}/{}@{}:{:?}", r.table, r.device, r.reading.ts, r.reading.fields))
            .collect();
        out.extend(batch.dead_letters.iter().map(|d| format!("dead {:?} {}", d.reason, d.detail)));
        out.extend(batch.device_tags.iter().map(|(d, t)| format!("tags {d}:{t:?}")));
        out
    }

    #[test]
    fn a_known_series_key_is_decoded_as_in_full_and_a_tag_change_is_still_reported() {
        let mut memory = TagMemory::default();
        let decode = |payload: &str, memory: &mut TagMemory| {
            summary(&decode_lines_remembering(&LpConfig::default(), "t", None, payload.as_bytes(), 0, memory))
        };
        let first = decode("m,name=a,site=x v=1 1\nm,site=y,device=b v=2i 2\n", &mut memory);
        assert_eq!(
            first,
            [
                "m/a@0:[(\"v\", F64(1.0))]",
                "m/b@0:[(\"v\", I64(2))]",
                "tags a:[(\"site\", \"x\")]",
                "tags b:[(\"site\", \"y\")]",
            ]
        );
        assert_eq!(memory.series.as_ref().map(|s| s.list.len()), Some(2));
        // Both keys known: the same readings, the devices named as before, no report.
        let again = decode("m,name=a,site=x v=3 3000000\nm,site=y,device=b v=4i 4000000\n", &mut memory);
        assert_eq!(again, ["m/a@3:[(\"v\", F64(3.0))]", "m/b@4:[(\"v\", I64(4))]"]);
        // a moves to site z, then back to x under its old key: reported both times.
        let moved = decode("m,name=a,site=z v=5 5000000\nm,name=a,site=x v=6 6000000\n", &mut memory);
        assert_eq!(
            moved,
            [
                "m/a@5:[(\"v\", F64(5.0))]",
                "m/a@6:[(\"v\", F64(6.0))]",
                "tags a:[(\"site\", \"z\")]",
                "tags a:[(\"site\", \"x\")]",
            ]
        );
        // A bad line of a known key is still refused by what follows its tags.
        let bad = decode("m,name=a,site=x v=oops 7\n", &mut memory);
        assert_eq!(
            bad,
            ["dead InvalidLineProtocol line 1: field `v`: invalid value `oops` (expected a number, an integer such as \
              `1i`, an unsigned integer such as `1u`, a boolean or a double-quoted string)"]
        );
        // Another device tag in the config: the keys learned with `name` are not used.
        let cfg = LpConfig { device_tag: "site".to_string(), ..LpConfig::default() };
        let other = decode_lines_remembering(&cfg, "t", None, b"m,name=a,site=x v=8 8000000\n", 0, &mut memory);
        assert_eq!(summary(&other), ["m/x@8:[(\"v\", F64(8.0))]", "tags x:[(\"name\", \"a\")]"]);
        memory.clear();
        assert_eq!(memory.series.as_ref().map(|s| (s.list.len(), s.bytes.len())), Some((0, 0)));
    }

    #[test]
    fn series_keys_past_the_capacity_start_over() {
        let mut memory = TagMemory::default();
        let mut payload = String::new();
        for d in 0..TagMemory::SERIES_CAPACITY + 3 {
            payload.push_str(&format!("m,name=d{d} v=1 1\n"));
        }
        let batch = decode_lines_remembering(&LpConfig::default(), "t", None, payload.as_bytes(), 0, &mut memory);
        assert_eq!(batch.readings.len(), TagMemory::SERIES_CAPACITY + 3);
        let series = memory.series.as_ref().expect("a consumer's memory keeps keys");
        assert_eq!(series.list.len(), 3);
        assert_eq!(series.bytes, b"m,name=d200000m,name=d200001m,name=d200002");
        assert_eq!(TagMemory::SERIES_CAPACITY, 200_000);
    }

    #[test]
    fn every_field_type_maps_to_its_typed_value() {
        let b = decode(
            "m,name=d1 f=1.5,i=-3i,u=7u,t=true,ff=F,s=\"on\",big=9223372036854775807u,min=-9223372036854775808i \
             1704067200000000000\n",
        );
        assert!(b.dead_letters.is_empty());
        assert_eq!(b.readings.len(), 1);
        let r = &b.readings[0];
        assert_eq!((&*r.table, &*r.device, r.reading.ts), ("m", "d1", 1_704_067_200_000));
        let fields: Vec<(&str, Value)> = r.reading.fields.iter().map(|(n, v)| (&**n, v.clone())).collect();
        assert_eq!(
            fields,
            vec![
                ("big", Value::I64(i64::MAX)),
                ("f", Value::F64(1.5)),
                ("ff", Value::Bool(false)),
                ("i", Value::I64(-3)),
                ("min", Value::I64(i64::MIN)),
                ("s", Value::from("on")),
                ("t", Value::Bool(true)),
                ("u", Value::I64(7)),
            ]
        );
    }

    /// `(table, device, ts, fields)` of a reading, fields as stored (in name order).
    type Row = (String, String, i64, Vec<(String, Value)>);

    fn plain(b: &IngestBatch) -> Vec<Row> {
        b.readings
            .iter()
            .map(|r| {
                let fields = r.reading.fields.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
                (r.table.to_string(), r.device.to_string(), r.reading.ts, fields)
            })
            .collect()
    }

    #[test]
    fn lines_of_a_known_layout_are_stored_like_the_first_of_it() {
        // Two measurements taking turns, fields out of name order (TSBS's shape), then a line
        // of `r` with another field order, one with a field fewer, a bad field name and an
        // unsigned value past i64 in a known layout.
        let b = decode(
            "r,name=t1,fleet=x lat=1.5,lon=2,vel=3i 1000000000\n\
             d,name=t1,fleet=x load=0.5,fuel=7i 1000000000\n\
             r,name=t2 lat=-1,lon=4,vel=5i 2000000000\n\
             d,name=t2 load=1,fuel=8i 2000000000\n\
             r,name=t3 vel=6i,lat=7,lon=8 3000000000\n\
             r,name=t3 lat=9,lon=10 4000000000\n\
             r,name=t4 lat=11,lon=12,1vel=1i 5000000000\n\
             d,name=t4 load=2,fuel=18446744073709551615u 5000000000\n\
             d,name=t5 load=3,fuel=9i 6000000000\n",
        );
        let f = |v: f64| Value::F64(v);
        let i = |v: i64| Value::I64(v);
        let row = |t: &str, d: &str, ts: i64, fields: &[(&str, Value)]| {
            (t.to_string(), d.to_string(), ts, fields.iter().map(|(n, v)| (n.to_string(), v.clone())).collect())
        };
        assert_eq!(
            plain(&b),
            vec![
                row("r", "t1", 1000, &[("lat", f(1.5)), ("lon", f(2.0)), ("vel", i(3))]),
                row("d", "t1", 1000, &[("fuel", i(7)), ("load", f(0.5))]),
                row("r", "t2", 2000, &[("lat", f(-1.0)), ("lon", f(4.0)), ("vel", i(5))]),
                row("d", "t2", 2000, &[("fuel", i(8)), ("load", f(1.0))]),
                row("r", "t3", 3000, &[("lat", f(7.0)), ("lon", f(8.0)), ("vel", i(6))]),
                row("r", "t3", 4000, &[("lat", f(9.0)), ("lon", f(10.0))]),
                row("d", "t4", 5000, &[("load", f(2.0))]),
                row("d", "t5", 6000, &[("fuel", i(9)), ("load", f(3.0))]),
            ]
        );
        let letters: Vec<(DeadLetterReason, &str)> =
            b.dead_letters.iter().map(|d| (d.reason, &d.detail[..7])).collect();
        assert_eq!(
            letters,
            [(DeadLetterReason::InvalidFieldName, "line 7:"), (DeadLetterReason::IntegerOutOfRange, "line 8:")]
        );
        // Names are shared: one `Arc` per table and field name, one per device in a run.
        let r = &b.readings;
        assert!(Arc::ptr_eq(&r[0].table, &r[2].table) && Arc::ptr_eq(&r[1].table, &r[3].table));
        assert!(Arc::ptr_eq(&r[0].reading.fields[0].0, &r[2].reading.fields[0].0));
        assert!(Arc::ptr_eq(&r[1].reading.fields[1].0, &r[7].reading.fields[1].0));
        assert!(Arc::ptr_eq(&r[0].device, &r[1].device));
    }

    #[test]
    fn more_measurements_than_layouts_kept_take_turns() {
        let measurements = Layout::KEPT + 3;
        let mut payload = String::new();
        for round in 0..3i64 {
            for m in 0..measurements {
                payload.push_str(&format!("m{m},name=d b={round},a={m}i {}\n", 1_000_000_000 * (round + 1)));
            }
        }
        let b = decode(&payload);
        assert!(b.dead_letters.is_empty());
        let expected: Vec<_> = (0..3i64)
            .flat_map(|round| {
                (0..measurements as i64).map(move |m| {
                    let fields = vec![("a".to_string(), Value::I64(m)), ("b".to_string(), Value::F64(round as f64))];
                    (format!("m{m}"), "d".to_string(), 1000 * (round + 1), fields)
                })
            })
            .collect();
        assert_eq!(plain(&b), expected);
    }

    #[test]
    fn a_bad_device_after_a_good_one_is_still_refused() {
        let b = decode("m,name=ok v=1 1000000000\nm,name=ok v=2 1000000000\nm,name=-bad v=3 1000000000\n");
        assert_eq!(b.readings.len(), 2);
        let letters: Vec<(DeadLetterReason, &str)> =
            b.dead_letters.iter().map(|d| (d.reason, &d.detail[..7])).collect();
        assert_eq!(letters, [(DeadLetterReason::InvalidDevice, "line 3:")]);
    }

    #[test]
    fn unsigned_values_past_i64_are_dead_letters_and_the_rest_is_stored() {
        let b =
            decode("m,name=d1 a=9223372036854775808u,b=2i 1000000000\nm,name=d2 c=18446744073709551615u 1000000000\n");
        assert_eq!(b.readings.len(), 1);
        assert_eq!(b.readings[0].reading.fields, vec![("b".into(), Value::I64(2))]);
        let letters: Vec<(&str, DeadLetterReason, &[u8])> =
            b.dead_letters.iter().map(|d| (d.detail.as_str(), d.reason, &d.payload[..])).collect();
        assert_eq!(
            letters,
            vec![
                (
                    "line 1: unsigned field(s) `a` not stored: above 2^63 - 1, the largest integer stored; its other \
                     fields are stored",
                    DeadLetterReason::IntegerOutOfRange,
                    &b"m,name=d1 a=9223372036854775808u,b=2i 1000000000"[..]
                ),
                (
                    "line 2: unsigned field(s) `c` not stored: above 2^63 - 1, the largest integer stored; the line \
                     has no other field",
                    DeadLetterReason::IntegerOutOfRange,
                    &b"m,name=d2 c=18446744073709551615u 1000000000"[..]
                ),
            ]
        );
    }

    #[test]
    fn bad_lines_become_dead_letters_with_their_number_and_text_and_the_rest_is_stored() {
        let payload = "# header\n\
                       m,name=a v=1 1000000000\n\
                       m,name=b v=1..2 1000000000\r\n\
                       m,name=c v=3 1000000000\n\
                       m v=4 1000000000\n\
                       bad$table,name=d v=5 1000000000\n\
                       m,name=e only=\"text\" 1000000000\n\
                       m,name=f 1x=6 1000000000\n\
                       m,name=g v=7 9000000000000000000\n\
                       m,name=h\n";
        let b = decode(payload);
        let stored: Vec<(&str, Option<&Value>)> = b.readings.iter().map(|r| (&*r.device, r.reading.get("v"))).collect();
        assert_eq!(stored, vec![("a", Some(&Value::F64(1.0))), ("c", Some(&Value::F64(3.0))), ("e", None)]);
        let letters: Vec<(&str, DeadLetterReason, &[u8])> =
            b.dead_letters.iter().map(|d| (&d.detail[..7], d.reason, &d.payload[..])).collect();
        assert_eq!(
            letters,
            vec![
                ("line 3:", DeadLetterReason::InvalidLineProtocol, &b"m,name=b v=1..2 1000000000"[..]),
                ("line 5:", DeadLetterReason::InvalidDevice, &b"m v=4 1000000000"[..]),
                ("line 6:", DeadLetterReason::InvalidTable, &b"bad$table,name=d v=5 1000000000"[..]),
                ("line 8:", DeadLetterReason::InvalidFieldName, &b"m,name=f 1x=6 1000000000"[..]),
                ("line 9:", DeadLetterReason::InvalidTimestamp, &b"m,name=g v=7 9000000000000000000"[..]),
                ("line 10", DeadLetterReason::NoFields, &b"m,name=h"[..]),
            ]
        );
    }

    #[test]
    fn with_the_receive_clock_each_payload_of_a_device_without_timestamps_has_a_time_of_its_own() {
        let cfg = LpConfig { precision: Precision::Milliseconds, receive_clock: true, ..LpConfig::default() };
        // 2100-01-01, a time no other test decodes at; one device, so no other shares its slot.
        let at = 4_102_444_800_000;
        let times = |payload: String, received: i64| -> Vec<i64> {
            let b = decode_lines(&cfg, "t", None, payload.as_bytes(), received);
            assert!(b.dead_letters.is_empty(), "{:?}", b.dead_letters);
            b.readings.iter().map(|r| r.reading.ts).collect()
        };
        // A payload's lines without a timestamp take one time (one reading, the last line
        // winning when stored); a line with a timestamp keeps it, the receive time's too.
        assert_eq!(times(format!("m,name=rc_a v=1\nm,name=rc_a v=2\nm,name=rc_a v=3 {at}"), at), [at, at, at]);
        // The next payloads received in that millisecond: the milliseconds after.
        assert_eq!(times("m,name=rc_a v=4".into(), at), [at + 1]);
        assert_eq!(times(format!("m,name=rc_a v=5 {at}\nm,name=rc_a v=6"), at), [at, at + 2]);
        // Received later: the receive time.
        assert_eq!(times("m,name=rc_a v=7".into(), at + 10), [at + 10]);
        // The clock set back 5 s: the receive time, not 5 s ahead of it; then on from there.
        assert_eq!(times("m,name=rc_a v=8".into(), at - 5000), [at - 5000]);
        assert_eq!(times("m,name=rc_a v=9".into(), at - 5000), [at - 4999]);
        // Without the clock (the default), every payload takes its receive time as is.
        let plain = decode_lines(&LpConfig::default(), "t", None, b"m,name=rc_a v=1", at - 5000);
        assert_eq!(plain.readings[0].reading.ts, at - 5000);
    }

    #[test]
    fn device_falls_back_to_the_device_tag_then_the_key_and_precision_applies() {
        let cfg = LpConfig { precision: Precision::Seconds, device_tag: "host".into(), receive_clock: false };
        let b = decode_lines(&cfg, "k", Some(&b"keyed"[..]), b"m,host=h1 v=1 10\nm,device=d2 v=2 20\nm v=3 30\n", 0);
        let got: Vec<(&str, i64)> = b.readings.iter().map(|r| (&*r.device, r.reading.ts)).collect();
        assert_eq!(got, vec![("h1", 10_000), ("d2", 20_000), ("keyed", 30_000)]);
        assert!(b.dead_letters.is_empty());
        // Readings of one table and device share their names.
        let b = decode("m,name=x v=1 1\nm,name=x v=2 2\n");
        assert!(Arc::ptr_eq(&b.readings[0].device, &b.readings[1].device));
        assert!(Arc::ptr_eq(&b.readings[0].table, &b.readings[1].table));
    }

    #[test]
    fn escapes_from_the_reference_reach_the_reading() {
        // Escaped spaces and commas in the measurement and tag values, an escaped quote in a
        // string field (unescaped), a line without a timestamp (receive time).
        let b = decode("my\\ table,name=dev\\,1 temp=21.5,note=\"say \\\"hi\\\"\"\n");
        assert_eq!(b.readings.len(), 0, "table and device names with spaces or commas are not allowed");
        assert_eq!(b.dead_letters[0].reason, DeadLetterReason::InvalidTable);
        let b = decode("my.table,name=dev_1,site=a\\ b temp=21.5,note=\"say \\\"hi\\\"\"\n");
        assert_eq!(b.readings.len(), 1);
        assert_eq!(b.readings[0].reading.ts, 1_704_067_200_000);
        assert_eq!(b.readings[0].reading.get("temp"), Some(&Value::F64(21.5)));
        assert_eq!(b.readings[0].reading.get("note"), Some(&Value::from("say \"hi\"")));
        assert!(b.dead_letters.is_empty());
    }

    #[test]
    fn a_line_naming_no_device_says_what_could_have() {
        let detail = |source: &str| {
            let b = decode_lines(&LpConfig::default(), source, None, b"m v=1 1000", 0);
            b.dead_letters.iter().map(|d| (d.reason, d.detail.clone())).collect::<Vec<_>>()
        };
        let none = "line 1: no `name` (lineproto.device_tag) or `device` tag names the device";
        assert_eq!(detail("http"), [(DeadLetterReason::InvalidDevice, none.to_string())]);
        assert_eq!(detail("hourglass/lp"), [(DeadLetterReason::InvalidDevice, none.to_string())]);
        let kafka = format!("{none}, and no message key does");
        assert_eq!(detail("kafka:telemetry/0@5"), [(DeadLetterReason::InvalidDevice, kafka)]);
    }

    #[test]
    fn json_sent_for_line_protocol_is_named_once() {
        let details = |payload: &str| {
            let b = decode_lines(&LpConfig::default(), "hourglass/lp", None, payload.as_bytes(), 0);
            b.dead_letters.iter().map(|d| d.detail.clone()).collect::<Vec<_>>()
        };
        let hint = "(JSON? this source reads InfluxDB line protocol)";
        let json = details("\n [{\"device\":\"d1\",\"ts\":1000,\"v\":1},\n{\"device\":\"d2\"}]");
        assert_eq!(json.len(), 2, "{json:?}");
        assert!(json[0].starts_with("line 2: ") && json[0].ends_with(hint), "{json:?}");
        assert!(json[1].starts_with("line 3: ") && !json[1].contains(hint), "{json:?}");
        // Line protocol with a bad line is not taken for JSON.
        let lp = details("m,name=a v=x 1000");
        assert_eq!(lp.len(), 1);
        assert!(!lp[0].contains(hint), "{lp:?}");
    }

    #[test]
    fn a_dead_letter_keeps_the_start_of_a_long_line() {
        let long = format!("m,name=a s=\"{}\" 1000\n", "x".repeat(70_000));
        let payload = format!("m,name=a v=1 1000\n{long}m,name=a v=x 3000");
        let b = decode_lines(
            &LpConfig { precision: Precision::Milliseconds, ..LpConfig::default() },
            "t",
            None,
            payload.as_bytes(),
            0,
        );
        assert_eq!(b.readings.len(), 1);
        let letters: Vec<(&str, &[u8])> =
            b.dead_letters.iter().map(|d| (d.detail.as_str(), d.payload.as_slice())).collect();
        assert_eq!(letters.len(), 2);
        assert_eq!(
            letters[0].0,
            "line 2: the string of field `s` is 70000 bytes long, more than the limit of 65536; the first 65536 of the \
             line's 70018 bytes are kept"
        );
        assert!(letters[0].1 == &long.as_bytes()[..65_536], "{} bytes kept", letters[0].1.len());
        assert_eq!(letters[1].1, b"m,name=a v=x 3000");
    }

    #[test]
    fn a_line_that_is_not_utf8_is_a_dead_letter_and_the_others_are_read() {
        let payload = b"m,name=a v=1 1000\n\xff\nm,name=a v=x 3000\nm,name=a s=\"\xc3\" 4000\nm,name=a v=5 5000\n\xe2";
        let b = decode_lines(
            &LpConfig { precision: Precision::Milliseconds, ..LpConfig::default() },
            "t",
            None,
            payload,
            0,
        );
        let stored: Vec<(i64, Option<&Value>)> =
            b.readings.iter().map(|r| (r.reading.ts, r.reading.get("v"))).collect();
        assert_eq!(stored, [(1000, Some(&Value::F64(1.0))), (5000, Some(&Value::F64(5.0)))]);
        let letters: Vec<(DeadLetterReason, &str, &[u8])> =
            b.dead_letters.iter().map(|d| (d.reason, d.detail.as_str(), d.payload.as_slice())).collect();
        let not_utf8 = DeadLetterReason::InvalidLineProtocol;
        const EXPECTED: &str =
            "expected a number, an integer such as `1i`, an unsigned integer such as `1u`, a boolean \
                                or a double-quoted string";
        assert_eq!(
            letters,
            [
                (not_utf8, "line 2: not UTF-8 (invalid byte at offset 18 of the payload)", &b"\xff"[..]),
                (not_utf8, &*format!("line 3: field `v`: invalid value `x` ({EXPECTED})"), &b"m,name=a v=x 3000"[..]),
                (
                    not_utf8,
                    "line 4: not UTF-8 (invalid byte at offset 50 of the payload)",
                    &b"m,name=a s=\"\xc3\" 4000"[..]
                ),
                (not_utf8, "line 6: not UTF-8 (invalid byte at offset 76 of the payload)", &b"\xe2"[..]),
            ]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Payloads decoded one after another with a memory of series keys give what they
        /// give without one: the same readings, dead letters and tag reports.
        #[test]
        fn series_keys_change_nothing_decoded(
            payloads in proptest::collection::vec(
                proptest::collection::vec(
                    (
                        proptest::sample::select(&["m", "n", "b\\ad"][..]),
                        proptest::sample::select(&[",name=a", ",name=b", ",device=c", "", ",name=a\\ b", ",name="][..]),
                        proptest::sample::select(&["", ",site=x", ",site=y", ",zone=1,site=x", ",site=x,zone=1"][..]),
                        proptest::sample::select(&["v=1", "v=2i", "w=t,v=3", "v=x", "v=18446744073709551615u"][..]),
                        proptest::sample::select(&["", " 1704067200000000000", " 9"][..]),
                    ),
                    0..12,
                ),
                1..5,
            ),
        ) {
            let mut keyed = TagMemory::default();
            let mut plain = without_keys();
            for lines in &payloads {
                let payload: String = lines.iter().map(|(m, d, t, f, ts)| format!("{m}{d}{t} {f}{ts}\n")).collect();
                let cfg = LpConfig::default();
                let with = decode_lines_remembering(&cfg, "t", Some(&b"k"[..]), payload.as_bytes(), 7, &mut keyed);
                let without = decode_lines_remembering(&cfg, "t", Some(&b"k"[..]), payload.as_bytes(), 7, &mut plain);
                proptest::prop_assert_eq!(summary(&with), summary(&without), "payload {:?}", payload);
            }
        }
    }
}
