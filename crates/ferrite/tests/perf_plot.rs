//! `ferrite perf`'s outputs for people and programs: no progress lines when stdout is not a
//! terminal, the per-second series in `--results-json`, and `--plot`'s SVG (IOPS over time and
//! the latency histogram).

mod common;

use common::{run_ferrite, TempDir};
use serde_json::{json, Value};

#[test]
fn results_json_holds_the_series_and_plot_draws_it() {
    let dir = TempDir::new("perfplot");
    let cfg = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 65536, "block_size": 4096}}]}]}),
    );
    let results = dir.join("results.json");
    let svg = dir.join("run.svg");
    let out = run_ferrite(&[
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-q",
        "4",
        "-o",
        "4k",
        "-w",
        "randread",
        "-t",
        "3",
        "--no-pin",
        "--results-json",
        results.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    // Not a terminal: the results, and no per-second progress lines.
    assert!(stdout.contains("Null0") && !stdout.contains("[  1s]"), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let series = doc["series"].as_array().unwrap_or_else(|| panic!("no series in {doc}"));
    assert_eq!(series.len(), 3, "one point per second of a 3 s run: {doc}");
    for (i, p) in series.iter().enumerate() {
        let t = p["time"].as_f64().unwrap();
        // Late wake-ups on a busy machine shift a point, never by a whole second.
        assert!((t - (i + 1) as f64).abs() < 0.9, "point {i} at {t} s: {doc}");
        assert!(p["iops"].as_f64().unwrap() > 0.0 && p["mibps"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["mean_latency_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let xml = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(xml.root_element().tag_name().name(), "svg");
    let lines: Vec<_> = xml.descendants().filter(|n| matches!(n.tag_name().name(), "polyline" | "path")).collect();
    assert!(!lines.is_empty(), "no line for the series: {text}");
    // The series line has a vertex per point.
    let points = lines.iter().filter_map(|n| n.attribute("points")).map(|p| p.split_whitespace().count()).max();
    assert_eq!(points, Some(series.len()), "{text}");
    assert!(xml.descendants().filter(|n| n.tag_name().name() == "rect").count() > 2, "no histogram bars: {text}");
    assert!(text.contains("IOPS over time") && text.contains("Latency histogram"), "{text}");
}
