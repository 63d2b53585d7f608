//! A [`Snapshot`] as Prometheus metrics (`ferrite_*`, units in the names, counters `_total`).

use super::expo::{Exposition, Kind};
use super::gather::Snapshot;
use ferrite_bdev::histogram::Histogram;
use ferrite_bdev::snapshot::BdevSnapshot;
use ferrite_bdev::stats::ERROR_KINDS;
use ferrite_bdev::IoStat;
use serde_json::Value;
use std::collections::BTreeMap;

/// Upper bounds (seconds) of the latency histogram's buckets: 1 µs to 10 s, 1-2-5 steps.
pub const LATENCY_BOUNDS: [f64; 22] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0,
    5.0, 10.0,
];

/// Writes the snapshot in Prometheus's text format.
pub fn render(s: &Snapshot) -> String {
    let mut e = Exposition::default();
    reactors(&mut e, s);
    if let Some(b) = &s.bdevs {
        bdevs(&mut e, b, s.tick_rate as f64);
    }
    targets(&mut e, s);
    volumes(&mut e, s);
    scrapes(&mut e);
    e.finish()
}

/// What scrapes themselves cost the reactors (`gather::gather_cost`).
fn scrapes(e: &mut Exposition) {
    let (secs, n) = super::gather::gather_cost();
    let name = "ferrite_metrics_gather_seconds_total";
    e.family(name, Kind::Counter, "Time reactor 0 spent gathering for scrapes (an upper bound of their cost).");
    e.sample(name, &[], secs);
    let name = "ferrite_metrics_scrapes_total";
    e.family(name, Kind::Counter, "Scrapes gathered from the reactors.");
    e.sample(name, &[], n as f64);
}

/// A reactor metric's value from its counters and the tick rate.
type ReactorFn = fn(&ferrite_reactor::ReactorStats, f64) -> f64;

fn reactors(e: &mut Exposition, s: &Snapshot) {
    let rate = s.tick_rate as f64;
    let rows: Vec<(String, String, &ferrite_reactor::ReactorStats)> =
        s.reactors.iter().map(|r| (r.id.to_string(), r.core.to_string(), r)).collect();
    let fams: [(&str, Kind, &str, ReactorFn); 6] = [
        (
            "ferrite_reactor_busy_seconds_total",
            Kind::Counter,
            "Time the reactor spent in loop turns that did work.",
            |r, t| r.busy_ticks as f64 / t,
        ),
        (
            "ferrite_reactor_idle_seconds_total",
            Kind::Counter,
            "Time the reactor spent idle (polling without work or asleep).",
            |r, t| r.idle_ticks as f64 / t,
        ),
        ("ferrite_reactor_loop_turns_total", Kind::Counter, "Loop turns the reactor ran.", |r, _| r.turns as f64),
        ("ferrite_reactor_sleeps_total", Kind::Counter, "Times the reactor went to sleep.", |r, _| r.sleeps as f64),
        ("ferrite_reactor_pollers", Kind::Gauge, "Pollers registered on the reactor.", |r, _| r.pollers as f64),
        ("ferrite_reactor_sleeping", Kind::Gauge, "1 while the reactor sleeps, 0 while it polls.", |r, _| {
            if r.sleeping {
                1.0
            } else {
                0.0
            }
        }),
    ];
    for (name, kind, help, f) in fams {
        e.family(name, kind, help);
        for (id, core, r) in &rows {
            e.sample(name, &[("reactor", id), ("core", core)], f(r, rate));
        }
    }
}

type StatFn = fn(&IoStat) -> u64;

/// The per-bdev counters: (name, help, value, ticks to seconds).
const BDEV_COUNTERS: [(&str, &str, StatFn, bool); 16] = [
    ("ferrite_bdev_read_ops_total", "Successful reads.", |s| s.num_read_ops, false),
    ("ferrite_bdev_write_ops_total", "Successful writes.", |s| s.num_write_ops, false),
    ("ferrite_bdev_unmap_ops_total", "Successful unmaps.", |s| s.num_unmap_ops, false),
    ("ferrite_bdev_write_zeroes_ops_total", "Successful write-zeroes.", |s| s.num_write_zeroes_ops, false),
    ("ferrite_bdev_flush_ops_total", "Successful flushes.", |s| s.num_flush_ops, false),
    ("ferrite_bdev_reset_ops_total", "Resets.", |s| s.num_reset_ops, false),
    ("ferrite_bdev_copy_ops_total", "Successful copies.", |s| s.num_copy_ops, false),
    ("ferrite_bdev_read_bytes_total", "Bytes read.", |s| s.bytes_read, false),
    ("ferrite_bdev_write_bytes_total", "Bytes written.", |s| s.bytes_written, false),
    ("ferrite_bdev_unmap_bytes_total", "Bytes unmapped.", |s| s.bytes_unmapped, false),
    ("ferrite_bdev_write_zeroes_bytes_total", "Bytes zeroed by write-zeroes.", |s| s.bytes_write_zeroes, false),
    ("ferrite_bdev_copy_bytes_total", "Bytes copied.", |s| s.bytes_copied, false),
    ("ferrite_bdev_read_latency_seconds_total", "Time successful reads took, summed.", |s| s.read_latency_ticks, true),
    (
        "ferrite_bdev_write_latency_seconds_total",
        "Time successful writes took, summed.",
        |s| s.write_latency_ticks,
        true,
    ),
    (
        "ferrite_bdev_unmap_latency_seconds_total",
        "Time successful unmaps took, summed.",
        |s| s.unmap_latency_ticks,
        true,
    ),
    ("ferrite_bdev_copy_latency_seconds_total", "Time successful copies took, summed.", |s| s.copy_latency_ticks, true),
];

fn bdevs(e: &mut Exposition, list: &[BdevSnapshot], rate: f64) {
    for (name, help, f, ticks) in BDEV_COUNTERS {
        e.family(name, Kind::Counter, help);
        for b in list {
            let v = f(&b.stat) as f64;
            e.sample(name, &[("bdev", &b.name)], if ticks { v / rate } else { v });
        }
    }
    e.family("ferrite_bdev_io_errors_total", Kind::Counter, "Failed I/Os, by SPDK's status name.");
    for b in list {
        for (kind, n) in ERROR_KINDS.iter().zip(b.stat.errors.iter()) {
            e.sample("ferrite_bdev_io_errors_total", &[("bdev", &b.name), ("kind", kind)], *n as f64);
        }
    }
    e.family("ferrite_bdev_queue_depth", Kind::Gauge, "Requests submitted and not yet completed.");
    for b in list {
        e.sample("ferrite_bdev_queue_depth", &[("bdev", &b.name)], b.queue_depth as f64);
    }
    let name = "ferrite_bdev_latency_seconds";
    e.family(name, Kind::Histogram, "I/O latency (bdevs whose histogram bdev_enable_histogram turned on).");
    for b in list {
        if let Some(h) = &b.histogram {
            let (buckets, count, sum) = latency_buckets(h, rate);
            e.histogram(name, &[("bdev", &b.name)], &buckets, count, sum);
        }
    }
}

/// An SPDK histogram (ticks) in [`LATENCY_BOUNDS`]: each SPDK bucket counts under the first
/// bound at or past its end; the sum takes each bucket's midpoint. Returns (buckets, count, sum).
pub fn latency_buckets(h: &Histogram, rate: f64) -> (Vec<(f64, u64)>, u64, f64) {
    let mut out: Vec<(f64, u64)> = LATENCY_BOUNDS.iter().map(|&b| (b, 0)).collect();
    let (mut count, mut sum, mut start) = (0u64, 0.0, 0u64);
    for (end, n) in h.bucket_ends() {
        if n > 0 {
            let end_s = end as f64 / rate;
            if let Some(slot) = out.iter_mut().find(|(le, _)| *le >= end_s) {
                slot.1 += n;
            }
            count += n;
            sum += n as f64 * (start + end) as f64 / 2.0 / rate;
        }
        start = end;
    }
    (out, count, sum)
}

fn arr<'a>(s: &'a Snapshot, method: &str) -> &'a [Value] {
    s.lists.get(method).and_then(Value::as_array).map_or(&[], |a| a.as_slice())
}

/// Counts of `items` by the string (or number) at `key`.
fn count_by(items: &[Value], key: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for it in items {
        let k = match &it[key] {
            Value::String(s) => s.clone(),
            Value::Null => "none".to_string(),
            v => v.to_string(),
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

fn targets(e: &mut Exposition, s: &Snapshot) {
    if let Some(subs) = s.lists.get("nvmf_get_subsystems").and_then(Value::as_array) {
        let n = subs.iter().filter(|x| x["subtype"] != "Discovery").count();
        e.family("ferrite_nvmf_subsystems", Kind::Gauge, "NVMe-oF subsystems (the discovery subsystem left out).");
        e.sample("ferrite_nvmf_subsystems", &[], n as f64);
        let per = |m: &str| s.lists.get(m).and_then(Value::as_object).cloned().unwrap_or_default();
        e.family("ferrite_nvmf_controllers", Kind::Gauge, "NVMe-oF controllers (host associations), per subsystem.");
        for (nqn, v) in per("nvmf_subsystem_get_controllers") {
            e.sample("ferrite_nvmf_controllers", &[("nqn", &nqn)], v.as_array().map_or(0, Vec::len) as f64);
        }
        e.family("ferrite_nvmf_qpairs", Kind::Gauge, "NVMe-oF queue pairs, per subsystem and poll group (reactor).");
        for (nqn, v) in per("nvmf_subsystem_get_qpairs") {
            let qps = v.as_array().map_or(&[][..], |a| a.as_slice());
            for (thread, n) in count_by(qps, "thread") {
                e.sample("ferrite_nvmf_qpairs", &[("nqn", &nqn), ("thread", &thread)], n as f64);
            }
        }
    }
    if s.lists.contains_key("iscsi_get_connections") {
        let conns = arr(s, "iscsi_get_connections");
        e.family("ferrite_iscsi_connections", Kind::Gauge, "iSCSI connections, per reactor thread.");
        for (thread, n) in count_by(conns, "thread_name") {
            e.sample("ferrite_iscsi_connections", &[("thread", &thread)], n as f64);
        }
        let sessions: std::collections::BTreeSet<String> = conns
            .iter()
            .filter(|c| c["tsih"].as_u64().is_some_and(|t| t != 0 && t != u16::MAX as u64))
            .map(|c| format!("{}/{}", c["target_node_name"], c["tsih"]))
            .collect();
        e.family("ferrite_iscsi_sessions", Kind::Gauge, "iSCSI sessions (logged in).");
        e.sample("ferrite_iscsi_sessions", &[], sessions.len() as f64);
    }
    if s.lists.contains_key("nbd_server_get_exports") {
        e.family("ferrite_nbd_exports", Kind::Gauge, "NBD exports.");
        e.sample("ferrite_nbd_exports", &[], arr(s, "nbd_server_get_exports").len() as f64);
        e.family("ferrite_nbd_connections", Kind::Gauge, "NBD connections, per reactor.");
        for (reactor, n) in count_by(arr(s, "nbd_server_get_connections"), "reactor") {
            e.sample("ferrite_nbd_connections", &[("reactor", &reactor)], n as f64);
        }
    }
    if s.lists.contains_key("vhost_get_controllers") {
        e.family("ferrite_vhost_controllers", Kind::Gauge, "vhost-user-blk controllers.");
        e.sample("ferrite_vhost_controllers", &[], arr(s, "vhost_get_controllers").len() as f64);
    }
}

fn volumes(e: &mut Exposition, s: &Snapshot) {
    let lvs = arr(s, "bdev_lvol_get_lvstores");
    let num = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let name_of = |v: &Value| v["name"].as_str().unwrap_or("").to_string();
    e.family("ferrite_lvstore_clusters", Kind::Gauge, "Data clusters of the lvstore.");
    for l in lvs {
        e.sample("ferrite_lvstore_clusters", &[("lvstore", &name_of(l))], num(l, "total_data_clusters"));
    }
    e.family("ferrite_lvstore_free_clusters", Kind::Gauge, "Free data clusters of the lvstore.");
    for l in lvs {
        e.sample("ferrite_lvstore_free_clusters", &[("lvstore", &name_of(l))], num(l, "free_clusters"));
    }
    e.family("ferrite_lvstore_cluster_size_bytes", Kind::Gauge, "Cluster size of the lvstore.");
    for l in lvs {
        e.sample("ferrite_lvstore_cluster_size_bytes", &[("lvstore", &name_of(l))], num(l, "cluster_size"));
    }
    let raids = arr(s, "bdev_raid_get_bdevs");
    e.family("ferrite_raid_members", Kind::Gauge, "Member slots of the RAID bdev.");
    for r in raids {
        e.sample("ferrite_raid_members", &[("raid", &name_of(r))], num(r, "num_base_bdevs"));
    }
    e.family("ferrite_raid_members_operational", Kind::Gauge, "Members of the RAID bdev that serve I/O.");
    for r in raids {
        e.sample("ferrite_raid_members_operational", &[("raid", &name_of(r))], num(r, "num_base_bdevs_operational"));
    }
    e.family("ferrite_raid_online", Kind::Gauge, "1 while the RAID bdev is online.");
    for r in raids {
        e.sample("ferrite_raid_online", &[("raid", &name_of(r))], if r["state"] == "online" { 1.0 } else { 0.0 });
    }
    e.family("ferrite_raid_rebuild_progress_ratio", Kind::Gauge, "Progress of a running rebuild (0 to 1).");
    for r in raids {
        if let Some(p) = r.get("process") {
            let target = p["target"].as_str().unwrap_or("");
            let v = p["progress"]["percent"].as_f64().unwrap_or(0.0) / 100.0;
            e.sample("ferrite_raid_rebuild_progress_ratio", &[("raid", &name_of(r)), ("target", target)], v);
        }
    }
    let nexuses = arr(s, "nexus_get_nexuses");
    e.family("ferrite_nexus_children", Kind::Gauge, "Children of the nexus, by state.");
    for n in nexuses {
        let children = n["children"].as_array().map_or(&[][..], |a| a.as_slice());
        for (state, c) in count_by(children, "state") {
            e.sample("ferrite_nexus_children", &[("nexus", &name_of(n)), ("state", &state)], c as f64);
        }
    }
    e.family("ferrite_nexus_child_rebuild_progress_ratio", Kind::Gauge, "Progress of a child's rebuild (0 to 1).");
    for n in nexuses {
        for c in n["children"].as_array().map_or(&[][..], |a| a.as_slice()) {
            if let Some(p) = c["rebuild_progress"].as_f64() {
                let uri = c["uri"].as_str().unwrap_or("");
                e.sample(
                    "ferrite_nexus_child_rebuild_progress_ratio",
                    &[("nexus", &name_of(n)), ("child", uri)],
                    p / 100.0,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdk_buckets_land_under_the_first_bound_past_their_end() {
        // 1 GHz: a tick is a nanosecond.
        let mut h = Histogram::new(7, 0, 1 << 40).unwrap();
        for ns in [500u64, 1500, 1500, 700_000, 3_000_000_000] {
            h.tally(ns);
        }
        let (b, count, sum) = latency_buckets(&h, 1e9);
        let at = |le: f64| b.iter().find(|x| x.0 == le).unwrap().1;
        assert_eq!((at(1e-6), at(2e-6), at(1e-3), at(5.0)), (1, 2, 1, 1));
        assert_eq!(count, 5);
        let exact = (500.0 + 3000.0 + 700_000.0 + 3e9) / 1e9;
        assert!((sum - exact).abs() / exact < 0.01, "sum {sum} vs {exact}");
    }
}
