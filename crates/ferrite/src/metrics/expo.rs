//! Prometheus's text exposition format (version 0.0.4): metric families, each with its HELP and
//! TYPE lines followed by its samples, label values escaped.

use std::fmt::Write;

/// The content type of what [`Exposition`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (names end in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets (`_bucket{le=..}`), `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A document being written.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a metric family: its HELP and TYPE lines. Its samples must follow before the
    /// next family starts.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {}", kind.name());
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_into(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// A histogram's samples for one label set: `buckets` are (upper bound, count in that
    /// bucket alone) in increasing order of bound, written cumulatively; `count` (every
    /// observation, those above the last bound included) is the `+Inf` bucket.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], buckets: &[(f64, u64)], count: u64, sum: f64) {
        let mut cum = 0u64;
        let bucket = format!("{name}_bucket");
        for (le, n) in buckets {
            cum += n;
            let le = fmt_value(*le);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&bucket, &l, cum as f64);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&bucket, &l, count as f64);
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, count as f64);
    }

    /// The document.
    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn fmt_value(v: f64) -> String {
    let mut s = String::new();
    push_value(&mut s, v);
    s
}

fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_follow_the_format() {
        let mut e = Exposition::default();
        e.family("x_ops_total", Kind::Counter, "Ops.\nDone");
        e.sample("x_ops_total", &[("bdev", "a\"b\\c\nd")], 12.0);
        e.family("x_seconds", Kind::Histogram, "Latency.");
        e.histogram("x_seconds", &[("bdev", "M0")], &[(1e-6, 2), (0.5, 3)], 6, 0.25);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP x_ops_total Ops.\\nDone\n# TYPE x_ops_total counter\n\
             x_ops_total{bdev=\"a\\\"b\\\\c\\nd\"} 12\n\
             # HELP x_seconds Latency.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{bdev=\"M0\",le=\"0.000001\"} 2\n\
             x_seconds_bucket{bdev=\"M0\",le=\"0.5\"} 5\n\
             x_seconds_bucket{bdev=\"M0\",le=\"+Inf\"} 6\n\
             x_seconds_sum{bdev=\"M0\"} 0.25\nx_seconds_count{bdev=\"M0\"} 6\n"
        );
    }
}
