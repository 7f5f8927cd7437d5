//! Reports of a run: latency summaries from HdrHistograms, the per-second series, JSON (the
//! [`RunReport`] itself, serde), a Markdown summary and a PNG chart.
//!
//! Latencies are recorded in microseconds and reported in milliseconds.

use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A latency histogram in microseconds, 1 µs to 1 hour, 3 significant digits.
pub fn latency_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| Error::Spec(format!("histogram: {e}")))
}

/// Percentiles of one latency histogram, ms. In JSON a summary of no observations has `null`
/// percentiles (none was measured; a 0 would read as instant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "LatencyJson", from = "LatencyJson")]
pub struct LatencySummary {
    /// Observations.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl LatencySummary {
    /// The summary of a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.5)),
            p90_ms: ms(h.value_at_quantile(0.9)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// [`LatencySummary`] as JSON: its percentiles are `null` without observations.
#[derive(Serialize, Deserialize)]
struct LatencyJson {
    count: u64,
    p50_ms: Option<f64>,
    p90_ms: Option<f64>,
    p99_ms: Option<f64>,
    p999_ms: Option<f64>,
    max_ms: Option<f64>,
}

impl From<LatencySummary> for LatencyJson {
    fn from(l: LatencySummary) -> LatencyJson {
        let measured = |ms: f64| (l.count > 0).then_some(ms);
        LatencyJson {
            count: l.count,
            p50_ms: measured(l.p50_ms),
            p90_ms: measured(l.p90_ms),
            p99_ms: measured(l.p99_ms),
            p999_ms: measured(l.p999_ms),
            max_ms: measured(l.max_ms),
        }
    }
}

impl From<LatencyJson> for LatencySummary {
    fn from(j: LatencyJson) -> LatencySummary {
        LatencySummary {
            count: j.count,
            p50_ms: j.p50_ms.unwrap_or_default(),
            p90_ms: j.p90_ms.unwrap_or_default(),
            p99_ms: j.p99_ms.unwrap_or_default(),
            p999_ms: j.p999_ms.unwrap_or_default(),
            max_ms: j.max_ms.unwrap_or_default(),
        }
    }
}

/// One second of a run (one sample of the per-second series).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the run started (end of this second).
    pub t_s: f64,
    /// Points sent a second over this interval (the last one ends with the run: it is from half
    /// a second to a second and a half long, shorter only when it is the only one; the
    /// intervals add up to the whole run).
    pub sent_per_s: f64,
    /// Points stored (committed) a second over this interval.
    pub stored_per_s: f64,
    /// End-to-end latency of the samples that became queryable in this second: p99, ms (`null`
    /// when none did: no latency was measured, which a 0 would not say).
    pub e2e_p99_ms: Option<f64>,
    /// Their maximum, ms (`null` when none did).
    pub e2e_max_ms: Option<f64>,
    /// Resident memory of the process at the end of the second, bytes.
    pub rss_bytes: u64,
}

/// Query latency under load, per kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryLatencies {
    /// `GET …/latest?devices=` of 10 random devices.
    pub latest: LatencySummary,
    /// `GET …/devices/{d}/readings` of one device over the last hour of data.
    pub raw: LatencySummary,
    /// `GET …/rollups?level=hour` of one device over the workload's hours (from the start of
    /// the hour of its first tick).
    pub rollup: LatencySummary,
    /// Queries that failed (non-2xx or no answer).
    pub errors: u64,
    /// Of `rollup`, the answers without a row (or a 404: the device not stored yet): roll-ups
    /// are written for closed hours (the data's time past the hour's end and the allowed
    /// lateness) once the roll-up stage reaches them; an hour-long workload starting on the hour
    /// closes none while it runs.
    #[serde(default)]
    pub rollup_empty: u64,
    /// Queries a second asked (`--query-rate`). The loop makes one at a time, at its intended
    /// time or once the one before has answered: a rate it cannot hold puts its backlog into
    /// every query's latency, alike for the three kinds (QA62 F11). `None` in reports before.
    #[serde(default)]
    pub asked_per_second: Option<f64>,
    /// Queries a second made.
    #[serde(default)]
    pub made_per_second: Option<f64>,
    /// How long after its intended time the last query went out, seconds.
    #[serde(default)]
    pub behind_seconds: Option<f64>,
}

impl QueryLatencies {
    /// What queries that fell behind their rate say, in Markdown: the last went out more than
    /// a second (or 5% of the schedule, if more) after its intended time, as for points
    /// ([`rate_held`]).
    pub fn rate_missed(&self) -> Option<String> {
        let (Some(asked), Some(made), Some(behind)) =
            (self.asked_per_second, self.made_per_second, self.behind_seconds)
        else {
            return None;
        };
        let queries = self.latest.count + self.raw.count + self.rollup.count + self.errors;
        if rate_held(asked, queries, behind, 0.0) {
            return None;
        }
        Some(format!(
            "**Query rate not held**: {asked} queries/s were asked and {made:.0}/s were made, the last {behind:.1} s \
             after its intended time: the query latencies hold that backlog, not only the queries' own time."
        ))
    }
}

/// The full compaction of the store after a run, for [`RunReport::bytes_per_value`]: the store
/// is closed, reopened alone and compacted with each compaction split across every core.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// Wall time of the reopen, the flushes and the compactions (not the scan that counts the
    /// values).
    pub seconds: f64,
    /// The threads each compaction could be split across.
    pub subcompactions: u32,
    /// Bytes of the data directory before and after.
    pub data_dir_bytes_before: u64,
    pub data_dir_bytes_after: u64,
}

/// Everything a run measured; written as JSON as is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// What ran: driver and settings, workload, machine.
    pub setup: serde_json::Value,
    /// Points sent (both tables): the workload's, but in a run [`RunReport::interrupted`] or
    /// failed by its driver ([`RunReport::failed_by_driver`]), which sent part of it.
    pub points: u64,
    /// Field values in the points sent ([`RunReport::points`]); in a run cut short, those
    /// points at the mean of the points dispatched.
    pub values: u64,
    /// Points sent by the driver.
    pub sent: u64,
    /// Points stored (committed) by the end of the run.
    pub stored: u64,
    /// Seconds from the first send until every point was stored.
    pub wall_seconds: f64,
    /// Sustained rate: stored / wall_seconds; in a failed run, stored / the end of the last
    /// second that stored any (`seconds`), the wait for a stalled store left out.
    pub points_per_second: f64,
    /// Field values per second: the points stored at their mean number of field values, over
    /// the time of [`RunReport::points_per_second`].
    pub values_per_second: f64,
    /// Latency from a batch's intended send time until the driver handed it over (MQTT:
    /// published, or acked by the broker at QoS 1; in-process: committed).
    pub send_latency: LatencySummary,
    /// Sampled latency from a point's intended send time until the HTTP `latest` endpoint
    /// returns it.
    pub e2e_latency: LatencySummary,
    /// The part of `e2e_latency` sampled from points after each device's first (workload ticks
    /// 1 on): on a fresh store the first tick also registers every device, a fleet's one-time
    /// arrival; this is the steady state that follows.
    #[serde(default)]
    pub e2e_latency_known: LatencySummary,
    /// Query latency under load, measured from each query's intended start.
    pub queries: QueryLatencies,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_rss_bytes: u64,
    /// SST bytes of the buckets after a full compaction / field values stored.
    pub bytes_per_value: Option<f64>,
    /// Field values found in the store after the run (a full scan).
    pub stored_values: Option<u64>,
    /// The field values the scan must find: the workload's, and any the run wrote itself; none
    /// when not checked (no scan, or a store that held the workload's tables before the run).
    #[serde(default)]
    pub expected_values: Option<u64>,
    /// The full compaction after the run that `bytes_per_value` is measured on.
    #[serde(default)]
    pub compaction: Option<Compaction>,
    /// The per-second series.
    pub seconds: Vec<Second>,
    /// CPU time of this process's threads over the run, by thread name, most first
    /// ([`crate::cpu`]): the pipeline's stages and RocksDB's background work, which share the
    /// machine's cores with the driver.
    #[serde(default)]
    pub cpu: Vec<crate::cpu::ThreadCpu>,
    /// `cpu` a stored point, the pipeline's threads apart from the harness's
    /// ([`crate::cpu::PerPoint`]).
    #[serde(default)]
    pub cpu_per_point: crate::cpu::PerPoint,
    /// The run was stopped early (SIGINT or SIGTERM): the driver sent only `sent` points of the
    /// workload, and every figure is of those.
    #[serde(default)]
    pub interrupted: bool,
    /// An interrupt came once the whole workload was sent: the figures are of all of it, but
    /// what follows the run (the hours' closing, the compaction and bytes per value) was skipped.
    #[serde(default)]
    pub interrupted_after_sending: bool,
    /// Why the run failed, when the system under test stopped storing what was sent, or a
    /// driver failed once points were sent (the figures are of the run until then).
    #[serde(default)]
    pub failed: Option<String>,
    /// Whether [`RunReport::failed`] began with a driver's error (a broker gone, a damaged
    /// recording), not with the system under test.
    #[serde(default)]
    pub failed_by_driver: bool,
    /// How long after its intended time the last batch (by intended time) was handed over,
    /// seconds: at a set rate, how far behind its schedule the sending ended. `None` when
    /// nothing was sent.
    #[serde(default)]
    pub send_behind_seconds: Option<f64>,
    /// At a set rate, whether the driver sent the points on schedule: the last batch was handed
    /// over at most a second (or 5% of the schedule, if more) after its intended time, and 99%
    /// of the batches too (a run that fell seconds behind for a long stretch and caught up by
    /// its end held its rate only in the end: QA62 F12). `None` as fast as possible, and in a
    /// run cut short or failed.
    #[serde(default)]
    pub rate_held: Option<bool>,
}

/// Slack of [`RunReport::rate_held`]: the sending may end this late, or
/// [`RATE_SLACK_SHARE`] of the schedule if more.
pub const RATE_SLACK: std::time::Duration = std::time::Duration::from_secs(1);
/// See [`RATE_SLACK`].
pub const RATE_SLACK_SHARE: f64 = 0.05;

/// [`RunReport::rate_held`] of `sent` points asked at `rate` a second, the last handed over
/// `behind` seconds after its intended time, 99% of the batches at most `send_p99` seconds
/// after theirs.
pub fn rate_held(rate: f64, sent: u64, behind: f64, send_p99: f64) -> bool {
    let slack = rate_slack(rate, sent);
    behind <= slack && send_p99 <= slack
}

/// How late, seconds, `sent` points (or queries) asked at `rate` a second may go out and still
/// be on schedule: [`RATE_SLACK`], or [`RATE_SLACK_SHARE`] of the schedule if more.
fn rate_slack(rate: f64, sent: u64) -> f64 {
    RATE_SLACK.as_secs_f64().max(RATE_SLACK_SHARE * sent as f64 / rate)
}

fn values_difference(found: u64, want: u64) -> String {
    if found < want {
        format!("{} lost", want - found)
    } else {
        format!("{} more than sent", found - want)
    }
}

/// `bytes` in GB, MB or kB (decimal), whichever keeps the figure at 1 or more.
fn fmt_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        1_000_000_000.. => format!("{:.2} GB", b / 1e9),
        1_000_000.. => format!("{:.2} MB", b / 1e6),
        _ => format!("{:.1} kB", b / 1e3),
    }
}

fn fmt_ms(l: &LatencySummary) -> String {
    if l.count == 0 {
        return "– | – | – | – | – | 0".into();
    }
    format!("{:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {}", l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.count)
}

impl RunReport {
    /// What a run that missed its set rate ([`RunReport::rate_held`]) says, in Markdown.
    pub fn rate_missed(&self) -> Option<String> {
        if self.rate_held != Some(false) {
            return None;
        }
        let behind = self.send_behind_seconds.unwrap_or_default();
        let p99 = self.send_latency.p99_ms / 1e3;
        let sent = match self.setup["rate_points_per_s"].as_f64() {
            Some(rate) => {
                let schedule = self.sent as f64 / rate;
                let stretch = if p99 > rate_slack(rate, self.sent) {
                    format!("1% of the batches went out {p99:.1} s or more after their intended times, and ")
                } else {
                    String::new()
                };
                format!(
                    "{rate} points/s were asked, and {stretch}the last of the {} points was sent {behind:.1} s after \
                     its intended time, the end of a {schedule:.1} s schedule (about {:.0} points/s)",
                    self.sent,
                    self.sent as f64 / (schedule + behind)
                )
            }
            None => format!(
                "1% of the batches went out {p99:.1} s or more after their intended times, and the last point \
                 {behind:.1} s after its own"
            ),
        };
        Some(format!(
            "**Rate not held**: {sent}: the system (or the harness beside it on this machine) could not keep up. \
             Latencies count from the intended times, so they hold the shortfall."
        ))
    }

    /// A Markdown summary: the headline figures and a latency table.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        s.push_str("# Hourglass bench run\n\n");
        // What went wrong first, before the setup's line of JSON (QA50 L2: it came after it).
        if self.interrupted {
            s.push_str(&format!(
                "**Stopped early** by an interrupt, after {} points were sent: the figures are of those, \
                 not of the whole workload.\n\n",
                self.sent
            ));
        }
        if let Some(reason) = &self.failed {
            // A run whose values a full scan found other than sent ran whole.
            let whole = self.check_values().is_err_and(|e| e.to_string() == *reason);
            let until = if whole { "" } else { " The figures are of the run until then." };
            s.push_str(&format!("**Failed**: {reason}.{until}\n\n"));
        }
        if let Some(missed) = self.rate_missed() {
            s.push_str(&format!("{missed}\n\n"));
        }
        if let Some(missed) = self.queries.rate_missed() {
            s.push_str(&format!("{missed}\n\n"));
        }
        if self.interrupted_after_sending {
            s.push_str(
                "**Interrupted** once the whole workload was sent: the figures are of all of it, without what \
                 follows the run (hour closing, compaction, bytes per value).\n\n",
            );
        }
        let setup = serde_json::to_string(&self.setup).unwrap_or_default();
        s.push_str(&format!("Setup: `{setup}`\n\n"));
        s.push_str("| measure | value |\n|---|---|\n");
        if self.interrupted {
            s.push_str(&format!("| points (stored / sent, stopped early) | {} / {} |\n", self.stored, self.sent));
        } else if self.failed_by_driver {
            // `points` is what was sent then, not the workload.
            s.push_str(&format!("| points (stored / sent, the driver failed) | {} / {} |\n", self.stored, self.sent));
        } else {
            s.push_str(&format!(
                "| points (stored / sent / workload) | {} / {} / {} |\n",
                self.stored, self.sent, self.points
            ));
        }
        if self.stored > self.sent {
            s.push_str(&format!(
                "| … stored, not counted as sent | {} (the broker took them; their acknowledgements were lost with \
                 it) |\n",
                self.stored - self.sent
            ));
        }
        s.push_str(&format!("| wall time | {:.1} s |\n", self.wall_seconds));
        if self.failed.is_some() && self.points_per_second > 0.0 {
            // Over the time it stored, not the wall time (which holds the wait for a stalled store).
            let storing = self.stored as f64 / self.points_per_second;
            s.push_str(&format!(
                "| points/s stored (sustained, over the {storing:.1} s it stored) | {:.0} |\n",
                self.points_per_second
            ));
        } else {
            s.push_str(&format!("| points/s stored (sustained) | {:.0} |\n", self.points_per_second));
        }
        s.push_str(&format!("| field values/s | {:.0} |\n", self.values_per_second));
        s.push_str(&format!("| peak RSS | {:.0} MiB |\n", self.peak_rss_bytes as f64 / (1 << 20) as f64));
        // The buckets' SST files only: not the `latest` entries, the registry, the roll-ups
        // or the write-ahead log (the data dir's size after compaction is in the next row).
        // A store that held other tables: its files hold theirs too (QA50 L7: not said).
        let whole = self.setup["store_held_other_tables"].as_array().is_some_and(|t| !t.is_empty());
        match self.bytes_per_value {
            Some(b) if whole => s.push_str(&format!(
                "| bytes per stored value (the buckets' SST files, of the whole store: it held other tables) | \
                 {b:.3} |\n"
            )),
            Some(b) => s.push_str(&format!("| bytes per stored value (the buckets' SST files) | {b:.3} |\n")),
            None => s.push_str("| bytes per stored value (the buckets' SST files) | not measured |\n"),
        }
        match (self.stored_values, self.expected_values) {
            (Some(found), Some(want)) if found == want => {
                s.push_str(&format!("| field values found by a full scan | {found}, as sent |\n"))
            }
            (Some(found), Some(want)) => s.push_str(&format!(
                "| field values found by a full scan | **{found}, where {want} were sent: {}** |\n",
                values_difference(found, want)
            )),
            (Some(found), None) => s.push_str(&format!(
                "| field values found by a full scan | {found} (not checked: the store held data) |\n"
            )),
            (None, _) => {}
        }
        if let Some(c) = &self.compaction {
            s.push_str(&format!(
                "| full compaction after the run | {:.1} s, split across {} threads; data dir {} → {} |\n",
                c.seconds,
                c.subcompactions,
                fmt_bytes(c.data_dir_bytes_before),
                fmt_bytes(c.data_dir_bytes_after)
            ));
        }
        s.push_str("\n| latency (ms) | p50 | p90 | p99 | p99.9 | max | n |\n|---|---|---|---|---|---|---|\n");
        // As fast as possible there is no schedule: a point's intended time is when the driver
        // takes it, after any wait for the backlog to shrink, so the figure is closed-loop.
        let e2e = if self.setup["rate_points_per_s"] == "max" {
            "end to end (taken by the driver → queryable; as fast as possible: closed loop)"
        } else {
            "end to end (intended → queryable)"
        };
        for (name, l) in [
            ("send (intended → handed over)", &self.send_latency),
            (e2e, &self.e2e_latency),
            ("… of it, ticks after each device's first", &self.e2e_latency_known),
            ("query: latest, 10 devices", &self.queries.latest),
            ("query: raw, 1 device × 1 h", &self.queries.raw),
            ("query: hour roll-ups, 1 device", &self.queries.rollup),
        ] {
            s.push_str(&format!("| {name} | {} |\n", fmt_ms(l)));
        }
        if self.queries.errors > 0 {
            s.push_str(&format!("\nQuery errors: {}\n", self.queries.errors));
        }
        if self.queries.rollup_empty > 0 {
            s.push_str(&format!(
                "\n{} of the {} hour roll-up queries found no row: roll-ups are written for closed hours (the \
                 data's time past the hour's end and the allowed lateness) once the roll-up stage reaches them: the run had not \
                 closed the device's hours, or not rolled them up yet.\n",
                self.queries.rollup_empty, self.queries.rollup.count
            ));
        }
        if !self.cpu.is_empty() {
            let total: f64 = self.cpu.iter().map(|t| t.seconds).sum();
            s.push_str(&format!(
                "\nCPU over the run, by thread name: {total:.1} s, {:.2} cores on average\n\n",
                total / self.wall_seconds.max(1e-9)
            ));
            let p = &self.cpu_per_point;
            s.push_str(&format!(
                "CPU a stored point: **{:.2} µs the pipeline's**, {:.2} µs the harness's (threads `{}*`: the \
                 workload's generation and sending, the query clients; in a deployment they run elsewhere)\n\n",
                p.pipeline_us,
                p.harness_us,
                crate::cpu::HARNESS_PREFIX
            ));
            s.push_str("| threads | count | CPU s | cores |\n|---|---|---|---|\n");
            for t in &self.cpu {
                s.push_str(&format!(
                    "| {} | {} | {:.1} | {:.2} |\n",
                    t.name,
                    t.threads,
                    t.seconds,
                    t.seconds / self.wall_seconds.max(1e-9)
                ));
            }
        }
        s
    }

    /// Whether the values a full scan found after the run are the ones sent (when both are
    /// known): an error that says how many differ.
    pub fn check_values(&self) -> Result<()> {
        match (self.stored_values, self.expected_values) {
            (Some(found), Some(want)) if found != want => Err(Error::Values(format!(
                "a full scan after the run found {found} field values where {want} were sent: {}",
                values_difference(found, want)
            ))),
            _ => Ok(()),
        }
    }

    /// Writes `report.json`, `report.md` and `report.png` into `dir` (created if needed).
    pub fn write_all(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Report(e.to_string()))?;
        write_whole(&dir.join("report.json"), &json)?;
        self.write_views(&dir.join("report.md"), &dir.join("report.png"))
    }

    /// Writes the Markdown summary to `md` and the chart to `png`: what
    /// [`RunReport::write_all`] writes besides the JSON, which `hourglass bench report` draws
    /// again from a run's JSON once the summary's or the chart's code has changed.
    pub fn write_views(&self, md: &Path, png: &Path) -> Result<()> {
        write_whole(md, self.to_markdown().as_bytes())?;
        crate::chart::render(self, png)
    }

    /// A report read back from the JSON [`RunReport::write_all`] wrote (fields added since
    /// take their defaults); the error says what does not fit.
    pub fn from_json(bytes: &[u8]) -> Result<RunReport> {
        serde_json::from_slice(bytes).map_err(|e| Error::Report(format!("not a run's report.json: {e}")))
    }
}

/// Writes `bytes` to `path` whole or not at all: under a temporary name beside it, renamed
/// once written (a full disk left a 0-byte report.json, which `bench report` then could not
/// read: QA62 F7; `record` writes its files so too).
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| Error::io(path.display().to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report file that cannot be written is not left half written: here its temporary name
    /// is a directory, so the write fails and no report.json is there (QA62 F7: a full disk
    /// left one of 0 bytes).
    #[test]
    fn a_report_that_cannot_be_written_leaves_no_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("report.json.tmp")).expect("a directory in the way");
        let err = sample_report().write_all(dir.path()).expect_err("the write fails");
        assert!(err.to_string().contains("report.json"), "{err}");
        assert!(!dir.path().join("report.json").exists());
        std::fs::remove_dir(dir.path().join("report.json.tmp")).expect("removed");
        sample_report().write_all(dir.path()).expect("written");
        let back = RunReport::from_json(&std::fs::read(dir.path().join("report.json")).expect("read")).expect("json");
        assert_eq!(serde_json::to_value(back).expect("json"), serde_json::to_value(sample_report()).expect("json"));
        assert!(!dir.path().join("report.json.tmp").exists() && !dir.path().join("report.md.tmp").exists());
    }

    #[test]
    fn percentiles_of_known_inputs() {
        let mut h = latency_histogram().expect("a histogram");
        for ms in 1..=1000u64 {
            h.record(ms * 1000).expect("in range");
        }
        let s = LatencySummary::of(&h);
        assert_eq!(s.count, 1000);
        // 3 significant digits: each figure within 0.1% of the exact order statistic.
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(close(s.p50_ms, 500.0), "{s:?}");
        assert!(close(s.p90_ms, 900.0), "{s:?}");
        assert!(close(s.p99_ms, 990.0), "{s:?}");
        assert!(close(s.p999_ms, 999.0), "{s:?}");
        assert!(close(s.max_ms, 1000.0), "{s:?}");
        assert_eq!(LatencySummary::of(&latency_histogram().expect("a histogram")), LatencySummary::default());
    }

    fn sample_report() -> RunReport {
        let mut h = latency_histogram().expect("a histogram");
        for us in [1000, 2000, 3000, 4000] {
            h.record(us).expect("in range");
        }
        let mut later = latency_histogram().expect("a histogram");
        later.record(3000).expect("in range");
        RunReport {
            setup: serde_json::json!({"driver": "in-process"}),
            points: 100,
            values: 900,
            sent: 100,
            stored: 100,
            wall_seconds: 2.0,
            points_per_second: 50.0,
            values_per_second: 450.0,
            e2e_latency: LatencySummary::of(&h),
            e2e_latency_known: LatencySummary::of(&later),
            peak_rss_bytes: 64 << 20,
            bytes_per_value: Some(0.5),
            compaction: Some(Compaction {
                seconds: 12.34,
                subcompactions: 2,
                data_dir_bytes_before: 3_000_000_000,
                data_dir_bytes_after: 1_250_000_000,
            }),
            seconds: (1..=5)
                .map(|i| Second {
                    t_s: i as f64,
                    sent_per_s: 20.0,
                    stored_per_s: 20.0 * (i % 2) as f64,
                    e2e_p99_ms: (i > 1).then_some(i as f64),
                    e2e_max_ms: (i > 1).then_some(2.0 * i as f64),
                    rss_bytes: 1 << 20,
                })
                .collect(),
            cpu: vec![
                crate::cpu::ThreadCpu { name: "rocksdb:low".into(), threads: 1, seconds: 1.5 },
                crate::cpu::ThreadCpu { name: "tokio-rt-worker".into(), threads: 2, seconds: 1.0 },
                crate::cpu::ThreadCpu { name: "bench-load".into(), threads: 1, seconds: 0.5 },
            ],
            cpu_per_point: crate::cpu::PerPoint { pipeline_us: 25_000.0, harness_us: 5_000.0 },
            ..RunReport::default()
        }
    }

    #[test]
    fn markdown_and_json_carry_the_figures() {
        let r = sample_report();
        let md = r.to_markdown();
        assert!(md.contains("| points (stored / sent / workload) | 100 / 100 / 100 |"), "{md}");
        assert!(md.contains("| points/s stored (sustained) | 50 |"), "{md}");
        assert!(md.contains("| peak RSS | 64 MiB |"), "{md}");
        assert!(md.contains("| bytes per stored value (the buckets' SST files) | 0.500 |"), "{md}");
        let shared = RunReport { setup: serde_json::json!({"store_held_other_tables": ["x.t"]}), ..sample_report() };
        let shared_md = shared.to_markdown();
        assert!(
            shared_md.contains(
                "| bytes per stored value (the buckets' SST files, of the whole store: it held other tables) | 0.500 |"
            ),
            "{shared_md}"
        );
        assert!(
            md.contains(
                "| full compaction after the run | 12.3 s, split across 2 threads; data dir 3.00 GB → 1.25 GB |"
            ),
            "{md}"
        );
        assert_eq!([fmt_bytes(2_101_327), fmt_bytes(999_999), fmt_bytes(0)], ["2.10 MB", "1000.0 kB", "0.0 kB"]);
        assert!(!md.contains("Rate not held"), "{md}");
        // At a set rate, the last batch sent 1 s after its intended time is on schedule (the
        // slack); 1.5 s is not, and the summary says so with the rate it came to.
        assert!(rate_held(50.0, 100, 1.0, 0.2) && !rate_held(50.0, 100, 1.5, 0.2));
        // The slack grows with the schedule: 5% of 100 s.
        assert!(rate_held(10.0, 1_000, 5.0, 0.2) && !rate_held(10.0, 1_000, 5.5, 0.2));
        // A run whose batches were seconds late for a stretch (1% later than the slack) and
        // caught up by its end did not hold its rate.
        assert!(rate_held(10.0, 1_000, 0.1, 5.0) && !rate_held(10.0, 1_000, 0.1, 5.5));
        // Queries: 300 asked at 20/s (a 15 s schedule, a 1 s slack); the last 1.5 s late.
        let queries = |behind: f64| QueryLatencies {
            latest: LatencySummary { count: 100, ..LatencySummary::default() },
            raw: LatencySummary { count: 100, ..LatencySummary::default() },
            rollup: LatencySummary { count: 100, ..LatencySummary::default() },
            asked_per_second: Some(20.0),
            made_per_second: Some(18.2),
            behind_seconds: Some(behind),
            ..QueryLatencies::default()
        };
        assert_eq!(queries(1.0).rate_missed(), None);
        let missed = RunReport { queries: queries(1.5), ..sample_report() }.to_markdown();
        assert!(
            missed.contains(
                "\n\n**Query rate not held**: 20 queries/s were asked and 18/s were made, the last 1.5 s after its \
                 intended time: the query latencies hold that backlog, not only the queries' own time.\n\n"
            ),
            "{missed}"
        );
        assert_eq!(QueryLatencies::default().rate_missed(), None, "a report from before");
        // Behind for a stretch (1% of the batches 3.9 s late, past the 1 s slack), on time at
        // the end: said so.
        let stretch = RunReport {
            setup: serde_json::json!({"rate_points_per_s": 50.0}),
            send_behind_seconds: Some(0.2),
            send_latency: LatencySummary { p99_ms: 3_900.0, ..LatencySummary::default() },
            rate_held: Some(false),
            ..sample_report()
        };
        assert_eq!(
            stretch.rate_missed().as_deref(),
            Some(
                "**Rate not held**: 50 points/s were asked, and 1% of the batches went out 3.9 s or more after \
                 their intended times, and the last of the 100 points was sent 0.2 s after its intended time, the \
                 end of a 2.0 s schedule (about 45 points/s): the system (or the harness beside it on this machine) \
                 could not keep up. Latencies count from the intended times, so they hold the shortfall."
            )
        );
        let behind = RunReport {
            setup: serde_json::json!({"rate_points_per_s": 50.0}),
            send_behind_seconds: Some(2.0),
            rate_held: Some(false),
            ..sample_report()
        };
        let behind_md = behind.to_markdown();
        assert!(
            behind_md.starts_with(
                "# Hourglass bench run\n\n**Rate not held**: 50 points/s were asked, and the last of the 100 points was sent 2.0 s after its \
                 intended time, the end of a 2.0 s schedule (about 25 points/s): the system (or the harness beside \
                 it on this machine) could not keep up."
            ),
            "{behind_md}"
        );
        assert!(md.contains("| end to end (intended → queryable) | 2.0 | 4.0 | 4.0 | 4.0 | 4.0 | 4 |"), "{md}");
        let max = RunReport { setup: serde_json::json!({"rate_points_per_s": "max"}), ..sample_report() }.to_markdown();
        assert!(
            max.contains("| end to end (taken by the driver → queryable; as fast as possible: closed loop) | 2.0 |"),
            "{max}"
        );
        assert!(md.contains("| … of it, ticks after each device's first | 3.0 | 3.0 | 3.0 | 3.0 | 3.0 | 1 |"), "{md}");
        assert!(md.contains("CPU over the run, by thread name: 3.0 s, 1.50 cores on average"), "{md}");
        assert!(md.contains("CPU a stored point: **25000.00 µs the pipeline's**, 5000.00 µs the harness's"), "{md}");
        assert!(
            md.contains("| rocksdb:low | 1 | 1.5 | 0.75 |\n| tokio-rt-worker | 2 | 1.0 | 0.50 |\n| bench-load | 1 | 0.5 | 0.25 |\n"),
            "{md}"
        );
        assert!(!md.contains("Stopped early"), "{md}");
        let cut = RunReport { interrupted: true, sent: 60, stored: 60, points: 60, ..sample_report() };
        let cut_md = cut.to_markdown();
        // First, before the setup's line (QA50 L2).
        assert!(
            cut_md.starts_with("# Hourglass bench run\n\n**Stopped early** by an interrupt, after 60 points were sent"),
            "{cut_md}"
        );
        assert!(cut_md.contains("| points (stored / sent, stopped early) | 60 / 60 |"), "{cut_md}");
        assert!(!cut_md.contains("**Interrupted** once"), "{cut_md}");
        let failed = RunReport { failed: Some("stalled: stored count stuck".into()), ..sample_report() };
        let failed_md = failed.to_markdown();
        assert!(failed_md.contains("**Failed**: stalled: stored count stuck. The figures are of the run until then."));
        assert!(!failed_md.contains("not counted as sent"), "{failed_md}");
        // The broker lost: what was sent is not the workload, and two messages (of 100 points)
        // were stored without their acknowledgement reaching the harness.
        let lost = RunReport {
            failed: Some("MQTT: connection lost".into()),
            failed_by_driver: true,
            sent: 1_496_000,
            points: 1_496_000,
            stored: 1_496_200,
            ..sample_report()
        };
        let lost_md = lost.to_markdown();
        assert!(lost_md.contains("| points (stored / sent, the driver failed) | 1496200 / 1496000 |\n"), "{lost_md}");
        assert!(
            lost_md.contains(
                "| … stored, not counted as sent | 200 (the broker took them; their acknowledgements were lost with it) |"
            ),
            "{lost_md}"
        );
        let late_md = RunReport { interrupted_after_sending: true, ..sample_report() }.to_markdown();
        assert!(late_md.contains("**Interrupted** once the whole workload was sent"), "{late_md}");
        assert!(late_md.contains("| points (stored / sent / workload) | 100 / 100 / 100 |"), "{late_md}");
        assert!(!late_md.contains("Stopped early"), "{late_md}");
        let json = serde_json::to_string(&r).expect("serialises");
        // A latency of no samples is null, not 0.
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let none = serde_json::json!({"count": 0, "p50_ms": null, "p90_ms": null, "p99_ms": null, "p999_ms": null,
                                      "max_ms": null});
        assert_eq!(value["send_latency"], none);
        assert_eq!(value["queries"]["raw"], none);
        assert_eq!(value["seconds"][0]["e2e_p99_ms"], serde_json::Value::Null);
        assert_eq!(value["seconds"][0]["e2e_max_ms"], serde_json::Value::Null);
        assert_eq!(value["seconds"][1]["e2e_p99_ms"], 2.0);
        assert_eq!(value["e2e_latency_known"]["count"], 1);
        assert!(value["e2e_latency_known"]["p99_ms"].as_f64().is_some_and(|ms| (ms - 3.0).abs() < 0.01));
        let back: RunReport = serde_json::from_str(&json).expect("parses");
        assert_eq!(back.e2e_latency, r.e2e_latency);
        assert_eq!(back.e2e_latency_known, r.e2e_latency_known);
        assert_eq!(back.seconds, r.seconds);
        assert_eq!(back.cpu, r.cpu);
        assert_eq!(back.cpu_per_point, r.cpu_per_point);
        assert!(!back.interrupted);
        let cut_back: RunReport =
            serde_json::from_str(&serde_json::to_string(&cut).expect("serialises")).expect("parses");
        assert!(cut_back.interrupted);
    }

    /// The full scan's count is checked against what was sent when both are known.
    #[test]
    fn values_found_after_the_run_are_checked_against_those_sent() {
        let found =
            |stored, expected| RunReport { stored_values: stored, expected_values: expected, ..sample_report() };
        let same = found(Some(900), Some(900));
        assert!(same.check_values().is_ok());
        assert!(same.to_markdown().contains("| field values found by a full scan | 900, as sent |"));
        let lost = found(Some(893), Some(900));
        let e = lost.check_values().expect_err("7 lost").to_string();
        assert_eq!(e, "values: a full scan after the run found 893 field values where 900 were sent: 7 lost");
        let md = lost.to_markdown();
        assert!(md.contains("| field values found by a full scan | **893, where 900 were sent: 7 lost** |"), "{md}");
        // Failed for it (the harness sets `failed` so): of the whole run, not "until then".
        let md = RunReport { failed: Some(e.clone()), ..lost }.to_markdown();
        assert!(md.contains(&format!("**Failed**: {e}.\n\n")), "{md}");
        let stalled = RunReport { failed: Some("stalled: stuck".into()), ..found(Some(893), Some(900)) }.to_markdown();
        assert!(stalled.contains("**Failed**: stalled: stuck. The figures are of the run until then.\n"), "{stalled}");
        let more = found(Some(902), Some(900));
        assert!(more.check_values().expect_err("2 more").to_string().ends_with("2 more than sent"));
        let unchecked = found(Some(1800), None);
        assert!(unchecked.check_values().is_ok());
        let md = unchecked.to_markdown();
        assert!(md.contains("| field values found by a full scan | 1800 (not checked: the store held data) |"), "{md}");
        assert!(found(None, None).check_values().is_ok());
        assert!(!found(None, Some(900)).to_markdown().contains("full scan"));
    }

    #[test]
    fn all_three_files_are_written_and_the_chart_is_a_png() {
        let dir = tempfile::tempdir().expect("temp dir");
        sample_report().write_all(dir.path()).expect("written");
        let png = std::fs::read(dir.path().join("report.png")).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 2000, "{} bytes", png.len());
        assert!(dir.path().join("report.json").exists() && dir.path().join("report.md").exists());
    }

    /// A report read back from its JSON draws the same summary and chart, byte for byte; a
    /// JSON from before a field with a default existed reads; one that is not a report does not.
    #[test]
    fn a_report_read_back_from_its_json_draws_the_same_views() {
        let (a, b) = (tempfile::tempdir().expect("temp dir"), tempfile::tempdir().expect("temp dir"));
        sample_report().write_all(a.path()).expect("write");
        let json = std::fs::read(a.path().join("report.json")).expect("the JSON");
        let back = RunReport::from_json(&json).expect("a report");
        back.write_views(&b.path().join("r.md"), &b.path().join("r.png")).expect("views");
        let read = |p: std::path::PathBuf| std::fs::read(p).expect("a view");
        assert_eq!(read(b.path().join("r.md")), read(a.path().join("report.md")));
        assert_eq!(read(b.path().join("r.png")), read(a.path().join("report.png")));
        let mut older: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        let fields = older.as_object_mut().expect("an object");
        for added in ["cpu", "cpu_per_point", "rate_held", "e2e_latency_known", "compaction"] {
            assert!(fields.remove(added).is_some(), "{added}");
        }
        let older = RunReport::from_json(older.to_string().as_bytes()).expect("an older report");
        assert_eq!((older.cpu.len(), older.compaction, older.points), (0, None, 100));
        match RunReport::from_json(br#"{"points": 1}"#) {
            Err(Error::Report(e)) => assert!(e.starts_with("not a run's report.json: missing field"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
