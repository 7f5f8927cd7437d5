//! The TSBS `readings` fields the storage benches write, and their command-line flags, shared
//! by them.

use std::sync::Arc;

use model::{Reading, Value};

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
