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

/// Draws `report`'s per-second series into a 1200 × 800 PNG at `path`; each second is also a
/// dot, so a run of one second still shows.
pub fn render(report: &RunReport, path: &Path) -> Result<()> {
    let text = font_ready();
    let ending = ending(report);
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
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
        .draw_series(LineSeries::new(secs.iter().map(|s| (s.t_s, s.sent_per_s)), BLUE.stroke_width(5)).point_size(4))
        .map_err(chart_err)?;
    if text {
        sent.label("sent").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(5)));
    }
    let stored = chart
        .draw_series(LineSeries::new(secs.iter().map(|s| (s.t_s, s.stored_per_s)), GREEN.stroke_width(2)).point_size(2))
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
        .draw_series(LineSeries::new(with_samples(|s| s.e2e_max_ms), MAGENTA.stroke_width(5)).point_size(4))
        .map_err(chart_err)?;
    if text {
        max.label("max").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], MAGENTA.stroke_width(5)));
    }
    let p99 = chart
        .draw_series(LineSeries::new(with_samples(|s| s.e2e_p99_ms), RED.stroke_width(2)).point_size(2))
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
}
