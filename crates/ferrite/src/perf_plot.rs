//! `ferrite perf --plot FILE.svg`: IOPS over time and the latency histogram, as one SVG.

use crate::perf_series::Point;
use ferrite_perf::hist::Histogram;
use plotters::prelude::*;
use std::path::Path;

/// Draws `points` (IOPS over time) above the histogram of `latency` (nanoseconds) into `path`.
pub fn write_svg(path: &Path, title: &str, points: &[Point], latency: &Histogram) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| format!("cannot draw {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (top, bottom) = root.split_vertically(400);
    let max_t = points.iter().map(|p| p.t_secs).fold(1.0, f64::max);
    let max_iops = points.iter().map(|p| p.iops).fold(1.0, f64::max) * 1.1;
    let mut c = ChartBuilder::on(&top)
        .caption(format!("{title}: IOPS over time"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..max_t, 0.0..max_iops)
        .map_err(e)?;
    c.configure_mesh().x_desc("seconds").y_desc("IOPS").draw().map_err(e)?;
    c.draw_series(LineSeries::new(points.iter().map(|p| (p.t_secs, p.iops)), BLUE.stroke_width(2))).map_err(e)?;
    // The histogram up to p99.9 (the tail past it would squeeze the rest into a bar or two).
    let us = |ns: u64| ns as f64 / 1000.0;
    let max_x = us(latency.percentile(99.9).max(1)) * 1.05;
    let bars: Vec<(f64, f64, f64)> =
        latency.buckets().filter(|b| us(b.0) <= max_x).map(|(lo, hi, n)| (us(lo), us(hi + 1), n as f64)).collect();
    let max_n = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 1.1;
    let mut h = ChartBuilder::on(&bottom)
        .caption("Latency histogram (to p99.9)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..max_x, 0.0..max_n)
        .map_err(e)?;
    h.configure_mesh().x_desc("latency (us)").y_desc("I/Os").draw().map_err(e)?;
    h.draw_series(bars.iter().map(|&(lo, hi, n)| Rectangle::new([(lo, 0.0), (hi.min(max_x), n)], RED.filled())))
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
