//! The PNG chart of a run: throughput (points sent and stored per second) above, end-to-end
//! latency (p99 and max of each second) below.
//!
//! Drawn with plotters' bitmap backend. Text needs a TrueType font, read at run time from the
//! first of [`FONT_PATHS`] that exists (Debian's `fonts-dejavu-core`); without one the chart is
//! drawn without captions, labels and legends rather than not at all.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::report::{RunReport, Second};
use crate::{Error, Result};

/// Where the chart's font is looked for, in order.
pub const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the font once per process; true if text can be drawn.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps registered fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

fn chart_err(e: impl std::fmt::Display) -> Error {
    Error::Chart(e.to_string())
}

/// Headroom above each plot's highest value, where the legend goes (it covered the last
/// seconds of the series).
const HEADROOM: f64 = 1.35;

/// What the captions add about how the run ended: the series are of part of the workload, or
/// of another rate than asked.
fn ending(report: &RunReport) -> &'static str {
    if report.failed.is_some() {
        " (the run failed: report.md says why)"
    } else if report.interrupted {
        " (stopped early by an interrupt)"
    } else if report.rate_held == Some(false) {
        " (the set rate was not held)"
    } else {
        ""
    }
}

/// The legend of `chart`, in its headroom ([`HEADROOM`]).
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(chart: &mut ChartContext<'a, DB, CT>) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .map_err(chart_err)
}

/// The chart's size in pixels.
const SIZE: (u32, u32) = (1200, 800);

/// Draws `report`'s per-second series into a 1200 × 800 PNG at `path`; each second is also a
/// dot, so a run of one second still shows.
pub fn render(report: &RunReport, path: &Path) -> Result<()> {
    draw(report, BitMapBackend::new(path, SIZE).into_drawing_area())
}

/// [`render`] on any drawing area of [`SIZE`].
///
/// The series' lines are one pixel wide; their dots make them wide. A wider line is drawn by
/// plotters as a polygon with mitred joins, and at a sharp turn of a long run's series (more
/// seconds than pixels across, each next to one far off) a join's point reached hundreds of
/// pixels past both values: spikes of latency and throughput that no second had, some below
/// zero (the 10M-device run of 2026-12-06 drew a max near 750 ms; no second's was above 540).
fn draw<DB: DrawingBackend>(report: &RunReport, root: DrawingArea<DB, plotters::coord::Shift>) -> Result<()> {
    let text = font_ready();
    let ending = ending(report);
    root.fill(&WHITE).map_err(chart_err)?;
    let (top, bottom) = root.split_vertically(400);
    let secs = &report.seconds;
    let t_max = secs.iter().map(|s| s.t_s).fold(1.0, f64::max);

    let rate_max = secs.iter().map(|s| s.sent_per_s.max(s.stored_per_s)).fold(1.0, f64::max) * HEADROOM;
    let mut builder = ChartBuilder::on(&top);
    builder.margin(15);
    if text {
        builder
            .caption(format!("Throughput: points per second{ending}"), ("sans-serif", 22))
            .x_label_area_size(35)
            .y_label_area_size(90);
    }
    let mut chart = builder.build_cartesian_2d(0f64..t_max, 0f64..rate_max).map_err(chart_err)?;
    if text {
        chart.configure_mesh().x_desc("seconds since start").y_desc("points/s").draw().map_err(chart_err)?;
    }
    let sent = chart
        .draw_series(LineSeries::new(secs.iter().map(|s| (s.t_s, s.sent_per_s)), BLUE.stroke_width(1)).point_size(4))
        .map_err(chart_err)?;
    if text {
        sent.label("sent").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(5)));
    }
    let stored = chart
        .draw_series(LineSeries::new(secs.iter().map(|s| (s.t_s, s.stored_per_s)), GREEN.stroke_width(1)).point_size(2))
        .map_err(chart_err)?;
    if text {
        stored.label("stored").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], GREEN.stroke_width(2)));
        legend(&mut chart)?;
    }

    let lat_max = secs.iter().filter_map(|s| s.e2e_max_ms).fold(1.0, f64::max) * HEADROOM;
    let mut builder = ChartBuilder::on(&bottom);
    builder.margin(15);
    if text {
        builder
            .caption(format!("End-to-end latency (intended send → queryable), per second{ending}"), ("sans-serif", 22))
            .x_label_area_size(35)
            .y_label_area_size(90);
    }
    let mut chart = builder.build_cartesian_2d(0f64..t_max, 0f64..lat_max).map_err(chart_err)?;
    if text {
        chart.configure_mesh().x_desc("seconds since start").y_desc("ms").draw().map_err(chart_err)?;
    }
    let with_samples = |ms: fn(&Second) -> Option<f64>| secs.iter().filter_map(move |s| Some((s.t_s, ms(s)?)));
    // The max first and wider, the p99 over it (as sent and stored above): with a few samples
    // a second the two are one value, and the one drawn last hid the other.
    let max = chart
        .draw_series(LineSeries::new(with_samples(|s| s.e2e_max_ms), MAGENTA.stroke_width(1)).point_size(4))
        .map_err(chart_err)?;
    if text {
        max.label("max").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], MAGENTA.stroke_width(5)));
    }
    let p99 = chart
        .draw_series(LineSeries::new(with_samples(|s| s.e2e_p99_ms), RED.stroke_width(1)).point_size(2))
        .map_err(chart_err)?;
    if text {
        p99.label("p99").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
        legend(&mut chart)?;
    }
    root.present().map_err(chart_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn captions_say_how_the_run_ended() {
        let whole = RunReport::default();
        assert_eq!(ending(&whole), "");
        assert_eq!(ending(&RunReport { rate_held: Some(true), ..whole.clone() }), "");
        assert_eq!(ending(&RunReport { rate_held: Some(false), ..whole.clone() }), " (the set rate was not held)");
        assert_eq!(ending(&RunReport { interrupted: true, ..whole.clone() }), " (stopped early by an interrupt)");
        let failed = RunReport { failed: Some("stalled".into()), interrupted: true, ..whole };
        assert_eq!(ending(&failed), " (the run failed: report.md says why)");
    }

    /// The first and last rows of the chart's lower half (the latency plot) with a magenta
    /// pixel (the max series' dots and line) left of the middle (the legend is right).
    fn max_series_rows(report: &RunReport) -> (usize, usize) {
        let (w, h) = (SIZE.0 as usize, SIZE.1 as usize);
        let mut buf = vec![0u8; w * h * 3];
        draw(report, BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area()).unwrap();
        let magenta = |x: usize, y: usize| buf[(y * w + x) * 3..][..3] == [255, 0, 255];
        let rows: Vec<usize> = (h / 2..h).filter(|&y| (0..w / 2).any(|x| magenta(x, y))).collect();
        (rows[0], rows[rows.len() - 1])
    }

    /// A long run's series, each second far off the one before, reaches as high and as low as
    /// its values drawn once: mitred joins of wide lines drew spikes past both.
    #[test]
    fn a_long_runs_series_reach_no_further_than_its_values() {
        let second = |t: usize, ms: Option<f64>| Second {
            t_s: t as f64,
            sent_per_s: 1_000.0,
            stored_per_s: 1_000.0,
            e2e_p99_ms: ms,
            e2e_max_ms: ms,
            rss_bytes: 0,
        };
        let run = |ms: fn(usize) -> Option<f64>| RunReport {
            seconds: (1..=3_000).map(|t| second(t, ms(t))).collect(),
            ..RunReport::default()
        };
        // More seconds than the plot has pixels across.
        let zigzag = run(|t| Some(if t % 2 == 0 { 500.0 } else { 10.0 }));
        // The same axes (the last second, the highest value), each value drawn once.
        let once = run(|t| match t {
            1 => Some(500.0),
            2 => Some(10.0),
            _ => None,
        });
        let (top, bottom) = max_series_rows(&once);
        assert!(bottom > top + 100, "{top}..{bottom}");
        assert_eq!(max_series_rows(&zigzag), (top, bottom));
    }
}
