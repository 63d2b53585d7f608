//! `ferrite perf --plot FILE.html`: one self-contained page (nothing fetched from the network,
//! no script): the run's SVG inline, the totals and the per-interval series as tables.

use crate::perf_series::Point;
use serde_json::Value;
use std::fmt::Write;

/// The page of a run titled `title`: `svg` (the picture, inline), then `total`
/// (`report::to_json`'s "total": IOPS, MiB/s, latencies) and `points` as tables.
pub fn page(title: &str, svg: &str, points: &[Point], total: &Value) -> String {
    let title = escape(title);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
         <style>\nbody {{ font-family: sans-serif; margin: 1em; background: #fff; color: #111; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         td, th {{ border: 1px solid #999; padding: 0.2em 0.6em; text-align: right; }}\n\
         th {{ background: #e8e8f4; }}\n</style>\n</head>\n<body>\n<h1>{title}</h1>\n<div class=\"plot\">\n"
    );
    // The SVG as the backend wrote it; an XML declaration would be out of place inside HTML.
    let svg = svg.trim_start();
    let svg = if svg.starts_with("<?xml") { svg.split_once("?>").map_or(svg, |(_, rest)| rest) } else { svg };
    h.push_str(svg.trim());
    h.push_str("\n</div>\n<h2>Totals</h2>\n<table id=\"totals\">\n<tr>");
    let cols = [
        ("iops", "IOPS", 0),
        ("mibps", "MiB/s", 2),
        ("avg_latency_us", "mean (us)", 2),
        ("p50_latency_us", "p50 (us)", 2),
        ("p99_latency_us", "p99 (us)", 2),
        ("p999_latency_us", "p99.9 (us)", 2),
        ("max_latency_us", "max (us)", 2),
        ("io_failed", "failed I/O", 0),
    ];
    for (_, name, _) in cols {
        let _ = write!(h, "<th>{name}</th>");
    }
    h.push_str("</tr>\n<tr>");
    for (key, _, prec) in cols {
        match total.get(key).and_then(Value::as_f64) {
            Some(v) => {
                let _ = write!(h, "<td>{v:.prec$}</td>");
            }
            None => h.push_str("<td>-</td>"),
        }
    }
    h.push_str("</tr>\n</table>\n<h2>Each interval</h2>\n<table id=\"series\">\n");
    h.push_str("<tr><th>seconds</th><th>IOPS</th><th>MiB/s</th><th>mean latency (us)</th></tr>\n");
    for p in points {
        let _ = writeln!(
            h,
            "<tr><td>{:.2}</td><td>{:.0}</td><td>{:.2}</td><td>{:.2}</td></tr>",
            p.t_secs, p.iops, p.mibps, p.mean_lat_us
        );
    }
    h.push_str("</table>\n</body>\n</html>\n");
    h
}

/// `s` with HTML's special characters escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn page_inlines_the_svg_and_tabulates_the_numbers() {
        let pts = vec![Point { t_secs: 1.0, iops: 1234.0, mibps: 4.82, mean_lat_us: 3.25, unix_secs: 0.0 }];
        let svg = "<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>";
        let total = json!({"iops": 1234.6, "p99_latency_us": 7.5});
        let p = page("a<b", svg, &pts, &total);
        assert!(p.starts_with("<!DOCTYPE html>") && p.contains("<title>a&lt;b</title>"), "{p}");
        assert!(p.contains("<svg xmlns") && !p.contains("<?xml"), "{p}");
        assert!(p.contains("<td>1235</td>") && p.contains("<td>7.50</td>") && p.contains("<td>-</td>"), "{p}");
        assert!(p.contains("<tr><td>1.00</td><td>1234</td><td>4.82</td><td>3.25</td></tr>"), "{p}");
        // Self-contained: nothing to fetch.
        for link in ["src=", "href=", "url(", "<script", "@import"] {
            assert!(!p.contains(link), "{link} in {p}");
        }
    }
}
