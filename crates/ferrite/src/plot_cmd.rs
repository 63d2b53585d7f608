//! `ferrite plot`: two (or more) runs' IOPS-per-second series side by side in one SVG, for the
//! bench scripts' `PLOT=DIR` (Ferrite and its peer in each cell). One tool for every script: a
//! script turns its peer's output into a series file, this draws.

use crate::perf_plot::Series;
use std::path::{Path, PathBuf};

/// Options of `ferrite plot`.
#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// The SVG file to write.
    #[arg(short = 'o', long = "out", value_name = "FILE.svg")]
    out: PathBuf,
    /// The picture's title (e.g. the cell: "null randread QD 1").
    #[arg(long, default_value = "IOPS per second")]
    title: String,
    /// LABEL=FILE, one panel each, left to right. FILE is `ferrite perf --results-json`'s
    /// output (its "series"), or text with one "SECONDS IOPS" pair a line (blank lines and
    /// lines starting with # are skipped).
    #[arg(value_name = "LABEL=FILE", required = true, value_parser = parse_labelled)]
    series: Vec<(String, PathBuf)>,
}

fn parse_labelled(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((label, file)) if !label.is_empty() && !file.is_empty() => Ok((label.to_string(), file.into())),
        _ => Err(format!("expected LABEL=FILE, got {s:?}")),
    }
}

/// Runs `ferrite plot`; returns the exit code.
pub fn run(a: PlotArgs) -> i32 {
    let mut series = Vec::new();
    for (label, file) in &a.series {
        match load(file) {
            Ok(points) => series.push(Series { label: label.clone(), points }),
            Err(e) => {
                eprintln!("ferrite plot: {e}");
                return 1;
            }
        }
    }
    let written = crate::perf_plot::side_by_side(&a.title, &series)
        .and_then(|svg| std::fs::write(&a.out, svg).map_err(|e| format!("cannot write {}: {e}", a.out.display())));
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferrite plot: {e}");
            1
        }
    }
}

/// The (seconds, IOPS) points of a series file (see [`PlotArgs`]).
fn load(path: &Path) -> Result<Vec<(f64, f64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a series file's text: a JSON document with "series" or "SECONDS IOPS" lines.
fn parse(text: &str) -> Result<Vec<(f64, f64)>, String> {
    if text.trim_start().starts_with('{') {
        let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let points = doc.get("series").and_then(|s| s.as_array()).ok_or("no \"series\" array")?;
        return points
            .iter()
            .map(|p| match (p.get("time").and_then(|v| v.as_f64()), p.get("iops").and_then(|v| v.as_f64())) {
                (Some(t), Some(i)) => Ok((t, i)),
                _ => Err(format!("a point without time and iops: {p}")),
            })
            .collect();
    }
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split_whitespace().map(str::parse::<f64>);
        match (f.next(), f.next(), f.next()) {
            (Some(Ok(t)), Some(Ok(i)), None) if t.is_finite() && i.is_finite() => points.push((t, i)),
            _ => return Err(format!("line {}: expected \"SECONDS IOPS\", got {line:?}", n + 1)),
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_perf_results_json_and_text_pairs() {
        let json = r#"{"total": {}, "series": [{"time": 1.0, "iops": 10.5}, {"time": 2.0, "iops": 12}]}"#;
        assert_eq!(parse(json).unwrap(), vec![(1.0, 10.5), (2.0, 12.0)]);
        assert_eq!(parse("# t iops\n1 100\n\n2.5 200.5\n").unwrap(), vec![(1.0, 100.0), (2.5, 200.5)]);
        assert!(parse("1 2 3\n").unwrap_err().contains("line 1"));
        assert!(parse("1 x\n").is_err());
        assert!(parse(r#"{"total": {}}"#).unwrap_err().contains("series"));
    }
}
