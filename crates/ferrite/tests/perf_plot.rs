//! `ferrite perf`'s outputs for people and programs: no progress lines when stdout is not a
//! terminal, the per-second series in `--results-json`, `--plot`'s SVG (IOPS over time and
//! the latency histogram) and HTML page (rendered by headless Chromium), and `ferrite plot`'s
//! side-by-side pictures of two series.

mod common;

use common::{run_ferrite, TempDir};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// `-S 0.5`: a point every half second, each with the wall-clock time of its end (what
/// bench/metrics_cost.sh lines its scrapes up with).
#[test]
fn fractional_intervals_and_wall_clock_times_in_the_series() {
    let dir = TempDir::new("perfseries");
    let cfg = null_config(&dir);
    let results = dir.join("results.json");
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let args = ["perf", "--json", cfg.to_str().unwrap(), "-q", "4", "-o", "4k", "-w", "randread", "-t", "2"];
    let out =
        run_ferrite(&[&args[..], &["-S", "0.5", "--no-pin", "--results-json", results.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let series = doc["series"].as_array().unwrap_or_else(|| panic!("no series in {doc}"));
    assert_eq!(series.len(), 4, "a point every half second of a 2 s run: {doc}");
    for (i, p) in series.iter().enumerate() {
        let (t, unix) = (p["time"].as_f64().unwrap(), p["unix_time"].as_f64().unwrap());
        assert!((t - (i + 1) as f64 * 0.5).abs() < 0.45, "point {i} at {t} s: {doc}");
        assert!(unix > before && unix < after, "point {i} at {unix}, run from {before} to {after}");
        if i > 0 {
            let gap = unix - series[i - 1]["unix_time"].as_f64().unwrap();
            assert!((gap - (t - series[i - 1]["time"].as_f64().unwrap())).abs() < 1e-3, "{doc}");
        }
    }
    for bad in ["0.05", "x", "-1"] {
        let out = run_ferrite(&[&args[..], &["-S", bad]].concat());
        assert!(!out.status.success(), "-S {bad} was accepted");
    }
}

/// A null bdev's config in `dir`.
fn null_config(dir: &TempDir) -> std::path::PathBuf {
    dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 65536, "block_size": 4096}}]}]}),
    )
}

/// Headless Chromium's program name, if it is installed.
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"].into_iter().find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

/// Screenshots `page` with headless Chromium into `png` (`width` x `height`), within 60 s.
fn screenshot(browser: &str, dir: &TempDir, page: &Path, png: &Path, width: u32, height: u32) {
    let mut child = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile").display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium exited with {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not write its screenshot within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A decoded RGB(A) image: width, height, bytes per pixel, pixels.
struct Image {
    width: u32,
    height: u32,
    channels: usize,
    data: Vec<u8>,
}

impl Image {
    fn decode(path: &Path) -> Image {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut decoder = png::Decoder::new(file);
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().expect("a PNG header");
        let mut data = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut data).expect("a PNG frame");
        data.truncate(info.buffer_size());
        let channels = info.color_type.samples();
        assert!(channels >= 3, "expected colour pixels, got {:?}", info.color_type);
        Image { width: info.width, height: info.height, channels, data }
    }

    /// The (r, g, b) of each pixel in the rectangle [x0, x1) x [y0, y1).
    fn pixels(&self, (x0, y0, x1, y1): (u32, u32, u32, u32)) -> impl Iterator<Item = (u8, u8, u8)> + '_ {
        (y0..y1.min(self.height)).flat_map(move |y| {
            (x0..x1.min(self.width)).map(move |x| {
                let i = (y as usize * self.width as usize + x as usize) * self.channels;
                (self.data[i], self.data[i + 1], self.data[i + 2])
            })
        })
    }
}

#[test]
fn html_plot_is_a_self_contained_page_chromium_renders() {
    let dir = TempDir::new("perfhtml");
    let cfg = null_config(&dir);
    let page = dir.join("run.html");
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
        "--plot",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    // The picture inline, as SVG that parses on its own, with the series and the histogram.
    let (start, end) = (html.find("<svg").expect("inline svg"), html.rfind("</svg>").expect("svg end") + 6);
    let svg = roxmltree::Document::parse(&html[start..end]).unwrap_or_else(|e| panic!("{e}: {html}"));
    let vertices = svg.descendants().filter_map(|n| n.attribute("points")).map(|p| p.split_whitespace().count()).max();
    assert_eq!(vertices, Some(3), "a vertex per second: {html}");
    assert!(svg.descendants().filter(|n| n.tag_name().name() == "rect").count() > 2, "no bars: {html}");
    // The numbers as tables: totals and one row per interval (plus the header).
    let series = &html[html.find("id=\"series\"").expect("series table")..];
    assert_eq!(series.matches("<tr>").count(), 4, "{html}");
    assert!(html.contains("p99 (us)"), "{html}");
    // Nothing to fetch: the page renders offline.
    for link in ["src=", "href=", "url(", "<script", "@import"] {
        assert!(!html.contains(link), "{link} in {html}");
    }

    let Some(browser) = chromium() else {
        println!("SKIP: chromium is not installed (apt-get install chromium): the page was not rendered");
        return;
    };
    let png = dir.join("shot.png");
    screenshot(browser, &dir, &page, &png, 1100, 1000);
    let img = Image::decode(&png);
    assert_eq!((img.width, img.height), (1100, 1000), "the screenshot has the window's size");
    // The plot's area (the SVG is 1000 x 800 under the page's heading): far from blank.
    let area = (20, 80, 1020, 880);
    let total = img.pixels(area).count();
    let non_white = img.pixels(area).filter(|&(r, g, b)| r < 235 || g < 235 || b < 235).count();
    assert!(non_white * 100 > total, "only {non_white} of {total} pixels are not white: a blank page?");
    let mut colours: Vec<(u8, u8, u8)> = img.pixels(area).collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(colours.len() > 20, "only {} distinct colours in the plot area", colours.len());
    // The series line is blue and the histogram's bars red, as drawn.
    let blue = img.pixels(area).filter(|&(r, g, b)| b > 180 && r < 80 && g < 80).count();
    let red = img.pixels(area).filter(|&(r, g, b)| r > 180 && g < 80 && b < 80).count();
    assert!(blue > 200 && red > 50, "{blue} blue and {red} red pixels: the line and bars were not drawn");
}

#[test]
fn plot_draws_two_series_side_by_side() {
    let dir = TempDir::new("plotcmp");
    let ferrite = dir.write_json(
        "ferrite.json",
        &json!({"total": {"iops": 150.0}, "series": [{"time": 1.0, "iops": 100.0}, {"time": 2.0, "iops": 200.0}]}),
    );
    let peer = dir.join("peer.txt");
    std::fs::write(&peer, "# seconds iops\n1 300\n2 250\n3 275\n").unwrap();
    let svg_path = dir.join("cell.svg");
    let out = run_ferrite(&[
        "plot",
        "-o",
        svg_path.to_str().unwrap(),
        "--title",
        "null randread QD 1",
        &format!("ferrite={}", ferrite.display()),
        &format!("spdk={}", peer.display()),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let xml = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    // The series' lines are 2 wide (the axes' and mesh's 1): (colour, vertices) of each.
    let mut lines: Vec<(&str, usize)> = xml
        .descendants()
        .filter(|n| n.attribute("stroke-width") == Some("2"))
        .filter_map(|n| Some((n.attribute("stroke")?, n.attribute("points")?.split_whitespace().count())))
        .collect();
    lines.sort_unstable();
    assert_eq!(lines, vec![("#0000FF", 2), ("#FF0000", 3)], "one line per series, a vertex per point: {text}");
    for caption in ["null randread QD 1", "ferrite: mean 150 IOPS", "spdk: mean 275 IOPS"] {
        assert!(text.contains(caption), "no {caption:?} in {text}");
    }
    // A bad series file is an error that names it.
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "1 2 3\n").unwrap();
    let out = run_ferrite(&["plot", "-o", svg_path.to_str().unwrap(), &format!("x={}", bad.display())]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("bad.txt"), "{out:?}");
}
