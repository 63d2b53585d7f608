//! `ferrite perf --plot FILE.svg|FILE.html`: IOPS over time and the latency histogram, as one SVG
//! (the HTML page, [`crate::perf_html`], inlines the same SVG); and [`side_by_side`], the
//! pictures of `ferrite plot` (two runs' IOPS series next to each other on one scale).

use crate::perf_series::Point;
use ferrite_perf::hist::Histogram;
use plotters::prelude::*;
use std::path::Path;

/// Width and height of [`run_svg`]'s picture, in pixels.
pub const RUN_SIZE: (u32, u32) = (1000, 800);

/// Writes the picture of a run into `path`: an SVG, or for a name ending in `.html` a page
/// with the SVG inline and a table of the numbers (`total` is `report::to_json`'s "total").
pub fn write(
    path: &Path,
    title: &str,
    points: &[Point],
    latency: &Histogram,
    total: &serde_json::Value,
) -> Result<(), String> {
    let svg = run_svg(title, points, latency)?;
    let is_html = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"));
    let text = if is_html { crate::perf_html::page(title, &svg, points, total) } else { svg };
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The SVG text of a run: `points` (IOPS over time) above the histogram of `latency`
/// (nanoseconds).
pub fn run_svg(title: &str, points: &[Point], latency: &Histogram) -> Result<String, String> {
    let mut svg = String::new();
    draw_run(&mut svg, title, points, latency).map_err(|e| format!("cannot draw the plot: {e}"))?;
    Ok(svg)
}

fn draw_run(svg: &mut String, title: &str, points: &[Point], latency: &Histogram) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let root = SVGBackend::with_string(svg, RUN_SIZE).into_drawing_area();
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
    c.configure_mesh().x_desc("seconds").y_desc("IOPS").y_label_formatter(&iops_label).draw().map_err(e)?;
    c.draw_series(LineSeries::new(points.iter().map(|p| (p.t_secs, p.iops)), BLUE.stroke_width(2))).map_err(e)?;
    // The histogram up to p99.9 (the tail past it would squeeze the rest into a bar or two), on
    // a log scale of latency: the buckets grow with it, and a run whose tail is a thousand times
    // its median (a busy machine) still shows its bulk as bars, not as a sliver at zero.
    let us = |ns: u64| ns as f64 / 1000.0;
    let max_x = us(latency.percentile(99.9).max(1)) * 1.05;
    let bars: Vec<(f64, f64, f64)> =
        latency.buckets().filter(|b| us(b.0) <= max_x).map(|(lo, hi, n)| (us(lo), us(hi + 1), n as f64)).collect();
    let min_x = bars.iter().map(|b| b.0).filter(|&lo| lo > 0.0).fold(max_x, f64::min).min(max_x / 2.0) * 0.9;
    let max_n = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 1.1;
    let mut h = ChartBuilder::on(&bottom)
        .caption("Latency histogram (to p99.9)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((min_x..max_x).log_scale(), 0.0..max_n)
        .map_err(e)?;
    h.configure_mesh()
        .x_desc("latency (us, log scale)")
        .y_desc("I/Os")
        .x_label_formatter(&|v| format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string())
        .y_label_formatter(&iops_label)
        .draw()
        .map_err(e)?;
    h.draw_series(
        bars.iter().map(|&(lo, hi, n)| Rectangle::new([(lo.max(min_x), 0.0), (hi.min(max_x), n)], RED.filled())),
    )
    .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// An IOPS axis label: 1.25M, 830k, 12.
fn iops_label(v: &f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.2}M", v / 1e6),
        a if a >= 1e3 => format!("{:.0}k", v / 1e3),
        _ => format!("{v:.0}"),
    }
}

/// One run's series for [`side_by_side`]: its label and (seconds, IOPS) points.
pub struct Series {
    /// The name shown above the panel (e.g. "ferrite", "spdk").
    pub label: String,
    /// (seconds since the start, IOPS in the interval ending then).
    pub points: Vec<(f64, f64)>,
}

/// The SVG text of `series` drawn side by side, one panel each, all on the same time and IOPS
/// scales, under `title`; each panel's caption gives the series' mean.
pub fn side_by_side(title: &str, series: &[Series]) -> Result<String, String> {
    let mut svg = String::new();
    draw_side_by_side(&mut svg, title, series).map_err(|e| format!("cannot draw the plot: {e}"))?;
    Ok(svg)
}

fn draw_side_by_side(svg: &mut String, title: &str, series: &[Series]) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let n = series.len().max(1);
    let root = SVGBackend::with_string(svg, (500 * n as u32, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let max_t = all().map(|p| p.0).fold(1.0, f64::max);
    let max_iops = all().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let colours = [BLUE, RED, GREEN, MAGENTA];
    for (i, (area, s)) in root.split_evenly((1, n)).iter().zip(series).enumerate() {
        let mean =
            if s.points.is_empty() { 0.0 } else { s.points.iter().map(|p| p.1).sum::<f64>() / s.points.len() as f64 };
        let mut c = ChartBuilder::on(area)
            .caption(format!("{}: mean {:.0} IOPS", s.label, mean), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..max_t, 0.0..max_iops)
            .map_err(e)?;
        c.configure_mesh().x_desc("seconds").y_desc("IOPS").y_label_formatter(&iops_label).draw().map_err(e)?;
        let colour = colours[i % colours.len()];
        c.draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2))).map_err(e)?;
        c.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}
