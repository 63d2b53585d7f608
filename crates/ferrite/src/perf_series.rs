//! The per-interval series of a `ferrite perf` run (IOPS, MiB/s and mean latency each interval),
//! sampled from the jobs' progress counters, for `--results-json` and `--plot`.

use ferrite_perf::Progress;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// One interval of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Seconds since the run started, at the interval's end.
    pub t_secs: f64,
    /// I/O completed per second in the interval.
    pub iops: f64,
    /// MiB moved per second in the interval.
    pub mibps: f64,
    /// Mean latency of the interval's I/O, in microseconds (0 without I/O).
    pub mean_lat_us: f64,
    /// Wall-clock time at the interval's end, in seconds since the Unix epoch (to line a run up
    /// with what else happened on the machine, e.g. bench/metrics_cost.sh's scrapes).
    pub unix_secs: f64,
}

/// Samples the summed progress counters of every job into [`Point`]s.
pub struct Sampler {
    progress: Vec<Arc<Progress>>,
    t0: Instant,
    /// Wall-clock seconds at `t0`.
    unix0: f64,
    last: (u64, u64, u64, Instant),
    /// The points so far.
    pub points: Vec<Point>,
}

impl Sampler {
    /// A sampler of `progress`, the run having started at `t0`.
    pub fn new(progress: Vec<Arc<Progress>>, t0: Instant) -> Sampler {
        let unix0 =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()) - t0.elapsed().as_secs_f64();
        Sampler { progress, t0, unix0, last: (0, 0, 0, t0), points: Vec::new() }
    }

    /// (I/Os, bytes, latency ns) summed over the jobs.
    fn totals(&self) -> (u64, u64, u64) {
        let sum = |f: fn(&Progress) -> u64| self.progress.iter().map(|p| f(p)).fold(0u64, u64::wrapping_add);
        (
            sum(|p| p.ios.load(Ordering::Relaxed)),
            sum(|p| p.bytes.load(Ordering::Relaxed)),
            sum(|p| p.latency_ns.load(Ordering::Relaxed)),
        )
    }

    /// Closes the interval since the last sample; returns its point and the interval's raw
    /// (I/Os, bytes, seconds).
    pub fn sample(&mut self) -> (Point, (u64, u64, f64)) {
        let (ios, bytes, lat) = self.totals();
        let now = Instant::now();
        let (li, lb, ll, lt) = self.last;
        let (di, db, dl) = (ios.wrapping_sub(li), bytes.wrapping_sub(lb), lat.wrapping_sub(ll));
        let secs = (now - lt).as_secs_f64();
        let rate = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let t_secs = (now - self.t0).as_secs_f64();
        let p = Point {
            t_secs,
            unix_secs: self.unix0 + t_secs,
            iops: rate(di as f64),
            mibps: rate(db as f64) / (1024.0 * 1024.0),
            mean_lat_us: if di > 0 { dl as f64 / di as f64 / 1000.0 } else { 0.0 },
        };
        self.last = (ios, bytes, lat, now);
        self.points.push(p.clone());
        (p, (di, db, secs))
    }

    /// Seconds since the last sample.
    pub fn since_last(&self) -> f64 {
        self.last.3.elapsed().as_secs_f64()
    }
}

/// `[{"time": s, "unix_time": s, "iops", "mibps", "mean_latency_us"}, ...]`.
pub fn to_json(points: &[Point]) -> Value {
    points
        .iter()
        .map(|p| {
            json!({"time": p.t_secs, "unix_time": p.unix_secs, "iops": p.iops, "mibps": p.mibps,
                "mean_latency_us": p.mean_lat_us})
        })
        .collect()
}
