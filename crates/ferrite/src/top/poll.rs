//! What `ferrite top` shows, read over the RPC socket: one [`Sample`] per refresh (the counters
//! of the reactors and bdevs, and the targets' connections), and the rates between two samples.

use super::hist::Hist;
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// One reactor's counters, as `framework_get_reactors` reports them.
#[derive(Clone, Debug, Default)]
pub struct ReactorCounters {
    /// Ticks in loop turns that did work.
    pub busy: u64,
    /// Ticks in loop turns that found nothing to do.
    pub idle: u64,
    /// Loop turns run.
    pub turns: u64,
    /// Asleep when sampled.
    pub sleeping: bool,
}

/// One bdev's cumulative counters, from `bdev_get_iostat`.
#[derive(Clone, Debug, Default)]
pub struct BdevCounters {
    /// Completed I/O of every kind.
    pub ops: u64,
    /// Bytes read and written.
    pub bytes: u64,
    /// Ticks the completed reads, writes, unmaps and copies took, summed.
    pub latency_ticks: u64,
    /// I/O outstanding when sampled, if the daemon reports it.
    pub queue_depth: Option<u64>,
    /// Its latency histogram, if one is enabled (`bdev_enable_histogram`).
    pub hist: Option<Hist>,
}

/// Everything one refresh reads.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// Counter ticks per second.
    pub tick_rate: u64,
    /// Reactors by core.
    pub reactors: BTreeMap<u64, ReactorCounters>,
    /// Bdevs by name.
    pub bdevs: BTreeMap<String, BdevCounters>,
    /// Connections by (target, reactor or thread name).
    pub connections: BTreeMap<(String, String), u64>,
}

/// A row of the reactors tab.
#[derive(Clone, Debug, PartialEq)]
pub struct ReactorRow {
    /// The reactor's core.
    pub core: u64,
    /// Share of the interval spent busy, in percent.
    pub busy_pct: f64,
    /// Share of the interval spent idle, in percent.
    pub idle_pct: f64,
    /// Loop turns per second.
    pub turns_per_sec: f64,
    /// "sleeping" or "polling".
    pub state: &'static str,
}

/// A row of the bdevs tab.
#[derive(Clone, Debug, PartialEq)]
pub struct BdevRow {
    /// The bdev's name.
    pub name: String,
    /// I/O completed per second.
    pub iops: f64,
    /// MiB moved per second.
    pub mib_per_sec: f64,
    /// Mean latency of the interval's I/O, in microseconds (0 without I/O).
    pub mean_lat_us: f64,
    /// I/O outstanding when sampled, if reported.
    pub queue_depth: Option<u64>,
    /// 99th percentile latency of the interval's I/O, in microseconds, from the bdev's
    /// histogram (None: no histogram enabled, or no I/O counted in the interval).
    pub p99_us: Option<f64>,
}

/// A row of the targets tab.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetRow {
    /// The target: "nvmf <nqn>", "iscsi" or "nbd".
    pub target: String,
    /// The reactor (thread) serving the connections.
    pub reactor: String,
    /// Connections (NVMe-oF queue pairs).
    pub connections: u64,
}

/// Reads `u64` at `key` (0 when absent).
fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// Calls `method`; None when it fails (the module is not there, or not started).
fn try_call(c: &mut RpcClient, method: &str, params: Option<Value>) -> Option<Value> {
    c.call(method, params).ok()
}

/// Counts `items` into `out` under (`target`, the thread name at `key`; a reactor index
/// becomes `reactor_N`).
fn count_into(out: &mut BTreeMap<(String, String), u64>, target: &str, items: &[Value], key: &str) {
    for it in items {
        let who = match &it[key] {
            Value::String(s) => s.clone(),
            Value::Number(n) => format!("reactor_{n}"),
            Value::Null => "?".to_string(),
            v => v.to_string(),
        };
        *out.entry((target.to_string(), who)).or_insert(0) += 1;
    }
}

/// Whose latency histograms a sample reads (a call per bdev: with many bdevs, asking every
/// bdev every second would cost more than the rest of the sample).
pub enum HistReads<'a> {
    /// Every bdev's (those without one answer with an error).
    All,
    /// Only these bdevs'.
    Only(&'a [String]),
}

/// Reads one sample, with the histograms of `hists`; fails only when the daemon does not answer
/// `framework_get_reactors`.
pub fn sample(c: &mut RpcClient, hists: HistReads) -> Result<Sample, String> {
    let r = c.call("framework_get_reactors", None).map_err(|e| format!("framework_get_reactors: {e}"))?;
    let at = Instant::now();
    let tick_rate = n(&r, "tick_rate").max(1);
    let reactors = r["reactors"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    let c = ReactorCounters {
                        busy: n(x, "busy"),
                        idle: n(x, "idle"),
                        turns: n(x, "turns"),
                        sleeping: x["sleeping"].as_bool().unwrap_or(false),
                    };
                    (n(x, "lcore"), c)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut bdevs = BTreeMap::new();
    if let Some(s) = try_call(c, "bdev_get_iostat", None) {
        for b in s["bdevs"].as_array().into_iter().flatten() {
            let ops = ["num_read_ops", "num_write_ops", "num_unmap_ops", "num_copy_ops"].iter().map(|k| n(b, k)).sum();
            let bytes = n(b, "bytes_read") + n(b, "bytes_written");
            let latency_ticks =
                ["read_latency_ticks", "write_latency_ticks", "unmap_latency_ticks", "copy_latency_ticks"]
                    .iter()
                    .map(|k| n(b, k))
                    .sum();
            if let Some(name) = b["name"].as_str() {
                let queue_depth = b["queue_depth"].as_u64();
                let hist = None;
                bdevs.insert(name.to_string(), BdevCounters { ops, bytes, latency_ticks, queue_depth, hist });
            }
        }
    }
    // The histograms (an error, for a bdev without one enabled, leaves None).
    for (name, b) in bdevs.iter_mut() {
        if let HistReads::Only(names) = hists {
            if !names.contains(name) {
                continue;
            }
        }
        b.hist = try_call(c, "bdev_get_histogram", Some(json!({ "name": name }))).and_then(|v| Hist::from_rpc(&v));
    }
    Ok(Sample { at, tick_rate, reactors, bdevs, connections: connections(c) })
}

/// Enables (or with `enable` false disables) the latency histogram of each of `names`; returns
/// the names it changed, and the first error.
pub fn set_histograms(c: &mut RpcClient, names: &[String], enable: bool) -> (Vec<String>, Option<String>) {
    let mut done = Vec::new();
    let mut error = None;
    for name in names {
        match c.call("bdev_enable_histogram", Some(json!({ "name": name, "enable": enable }))) {
            Ok(_) => done.push(name.clone()),
            Err(e) => {
                error.get_or_insert_with(|| format!("bdev_enable_histogram {name}: {e}"));
            }
        }
    }
    (done, error)
}

/// The targets' connections by (target, reactor).
fn connections(c: &mut RpcClient) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    if let Some(subs) = try_call(c, "nvmf_get_subsystems", None) {
        for s in subs.as_array().into_iter().flatten().filter(|s| s["subtype"] != "Discovery") {
            let Some(nqn) = s["nqn"].as_str() else { continue };
            if let Some(q) = try_call(c, "nvmf_subsystem_get_qpairs", Some(json!({ "nqn": nqn }))) {
                count_into(&mut out, &format!("nvmf {nqn}"), q.as_array().map_or(&[][..], Vec::as_slice), "thread");
            }
        }
    }
    if let Some(v) = try_call(c, "iscsi_get_connections", None) {
        count_into(&mut out, "iscsi", v.as_array().map_or(&[][..], Vec::as_slice), "thread_name");
    }
    if let Some(v) = try_call(c, "nbd_server_get_connections", None) {
        count_into(&mut out, "nbd", v.as_array().map_or(&[][..], Vec::as_slice), "reactor");
    }
    out
}

/// The reactors' rows between `prev` and `cur` (None for the first sample: counters since start).
pub fn reactor_rows(prev: Option<&Sample>, cur: &Sample) -> Vec<ReactorRow> {
    let secs = prev.map_or(0.0, |p| cur.at.duration_since(p.at).as_secs_f64());
    cur.reactors
        .iter()
        .map(|(core, c)| {
            let zero = ReactorCounters::default();
            let p = prev.and_then(|p| p.reactors.get(core)).unwrap_or(&zero);
            let busy = c.busy.saturating_sub(p.busy) as f64;
            let idle = c.idle.saturating_sub(p.idle) as f64;
            let total = (busy + idle).max(1.0);
            let turns = c.turns.saturating_sub(p.turns) as f64;
            ReactorRow {
                core: *core,
                busy_pct: 100.0 * busy / total,
                idle_pct: 100.0 * idle / total,
                turns_per_sec: if secs > 0.0 { turns / secs } else { 0.0 },
                state: if c.sleeping { "sleeping" } else { "polling" },
            }
        })
        .collect()
}

/// The bdevs' rows between `prev` and `cur` (rates are 0 for the first sample; its p99 is over
/// everything the histogram counted).
pub fn bdev_rows(prev: Option<&Sample>, cur: &Sample) -> Vec<BdevRow> {
    let secs = prev.map_or(0.0, |p| cur.at.duration_since(p.at).as_secs_f64());
    cur.bdevs
        .iter()
        .map(|(name, c)| {
            let zero = BdevCounters::default();
            let p = prev.and_then(|p| p.bdevs.get(name)).unwrap_or(&zero);
            let ops = c.ops.saturating_sub(p.ops) as f64;
            let bytes = c.bytes.saturating_sub(p.bytes) as f64;
            let ticks = c.latency_ticks.saturating_sub(p.latency_ticks) as f64;
            let rate = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
            BdevRow {
                name: name.clone(),
                iops: rate(ops),
                mib_per_sec: rate(bytes) / (1024.0 * 1024.0),
                mean_lat_us: if ops > 0.0 { ticks / ops / cur.tick_rate as f64 * 1e6 } else { 0.0 },
                queue_depth: c.queue_depth,
                p99_us: c.hist.as_ref().and_then(|h| h.percentile_since(p.hist.as_ref(), 99.0)),
            }
        })
        .collect()
}

/// The targets' rows of `cur`.
pub fn target_rows(cur: &Sample) -> Vec<TargetRow> {
    cur.connections
        .iter()
        .map(|((target, reactor), n)| TargetRow { target: target.clone(), reactor: reactor.clone(), connections: *n })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample_at(at: Instant, ops: u64, bytes: u64, lat: u64, busy: u64, idle: u64, turns: u64) -> Sample {
        let mut s = Sample {
            at,
            tick_rate: 1_000_000,
            reactors: BTreeMap::new(),
            bdevs: BTreeMap::new(),
            connections: BTreeMap::new(),
        };
        s.reactors.insert(0, ReactorCounters { busy, idle, turns, sleeping: false });
        s.bdevs.insert("M0".into(), BdevCounters { ops, bytes, latency_ticks: lat, queue_depth: Some(3), hist: None });
        s
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let t0 = Instant::now();
        let a = sample_at(t0, 100, 1 << 20, 1000, 10, 10, 5);
        let b = sample_at(t0 + Duration::from_secs(2), 300, 5 << 20, 3000, 40, 20, 2005);
        let r = &bdev_rows(Some(&a), &b)[0];
        assert_eq!((r.iops, r.mib_per_sec), (100.0, 2.0));
        // 2000 ticks over 200 I/O at 1 MHz: 10 µs each.
        assert!((r.mean_lat_us - 10.0).abs() < 1e-9, "{r:?}");
        assert_eq!((r.queue_depth, r.p99_us), (Some(3), None));
        let x = &reactor_rows(Some(&a), &b)[0];
        assert!((x.busy_pct - 75.0).abs() < 1e-9 && (x.idle_pct - 25.0).abs() < 1e-9, "{x:?}");
        assert_eq!((x.turns_per_sec, x.state), (1000.0, "polling"));
        assert_eq!(bdev_rows(None, &b)[0].iops, 0.0);
    }
}
