//! The TSBS `readings` fields the storage benches write, and their command-line flags, shared
//! by them.

use std::sync::Arc;

use model::{Reading, Value};

/// The allocator `hourglass` runs the store with (src/main.rs), so that the benches measure
/// the store's allocations as the pipeline makes them rather than glibc's malloc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's purge delay set as `hourglass` sets it (src/main.rs, `tune_allocator`: free memory
/// is never given back to the OS, the process keeps its high-water mark of heap); a
/// `MIMALLOC_PURGE_DELAY` in the environment wins. Called first in each bench's `main`.
#[allow(unsafe_code)]
pub(crate) fn tune_allocator() {
    // `mi_option_purge_delay`'s index in `mi_option_e` (src/main.rs).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: as in src/main.rs: `mi_option_set` stores a number in mimalloc's option
        // table, dereferences nothing given, and may be called at any time from any thread.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// Field names (sorted) and decimal places of `readings`.
pub(crate) const FIELDS: [(&str, i32); 7] = [
    ("elevation", 0),
    ("fuel_consumption", 1),
    ("grade", 0),
    ("heading", 0),
    ("latitude", 5),
    ("longitude", 5),
    ("velocity", 0),
];

/// [`FIELDS`]' names, to share among readings.
pub(crate) fn names() -> Vec<Arc<str>> {
    FIELDS.iter().map(|(n, _)| Arc::from(*n)).collect()
}

/// The reading of device `d` at `ts` (ms): each field a deterministic walk of its own, a step
/// a second.
pub(crate) fn reading(names: &[Arc<str>], d: usize, ts: i64) -> Reading {
    let s = ts.div_euclid(1_000);
    let fields = names
        .iter()
        .zip(FIELDS)
        .enumerate()
        .map(|(j, (name, (_, decimals)))| {
            let step = (d as i64 * 7 + j as i64 * 13 + s * 31) % 97 - 48;
            let scaled = 10_000 + (d as i64 % 1_000) * 10 + step;
            (Arc::clone(name), Value::F64(scaled as f64 / 10f64.powi(decimals)))
        })
        .collect();
    Reading { ts, fields }
}

/// The value after `--flag` on the command line, if given.
pub(crate) fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// The whole number after `--flag`, `default` when not given.
pub(crate) fn number(args: &[String], name: &str, default: usize) -> usize {
    flag(args, name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name} takes a whole number, not {v:?}")))
}
