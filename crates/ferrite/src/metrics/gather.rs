//! What a scrape shows, gathered off the data path: the reactors' counters straight from what
//! each reactor publishes (atomics it stores once per loop turn), the rest by one task on
//! reactor 0 (bdev counters: one message per reactor; targets, lvstores, RAID and nexus from
//! their RPC methods), waited for with a timeout so a stuck reactor never hangs the scraper.

use ferrite_bdev::snapshot::BdevSnapshot;
use ferrite_reactor::ReactorStats;
use ferrite_rpc::{Ctx, Params, Registry};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Everything one scrape shows.
pub struct Snapshot {
    /// Counter ticks per second (latencies and reactor times are in ticks).
    pub tick_rate: u64,
    /// Each reactor's counters.
    pub reactors: Vec<ReactorStats>,
    /// Each bdev's counters; None if reactor 0 did not answer in time.
    pub bdevs: Option<Vec<BdevSnapshot>>,
    /// The answers of the target, lvstore, RAID and nexus listing methods, by method name
    /// (absent when the method failed or does not exist). `nvmf_subsystem_get_qpairs` and
    /// `nvmf_subsystem_get_controllers` hold an object keyed by subsystem NQN.
    pub lists: serde_json::Map<String, Value>,
}

/// The listing methods a scrape calls (with their params).
const LISTS: [(&str, Option<&str>); 8] = [
    ("nvmf_get_subsystems", None),
    ("iscsi_get_connections", None),
    ("nbd_server_get_exports", None),
    ("nbd_server_get_connections", None),
    ("vhost_get_controllers", None),
    ("bdev_lvol_get_lvstores", None),
    ("bdev_raid_get_bdevs", Some(r#"{"category":"all"}"#)),
    ("nexus_get_nexuses", None),
];

/// Calls `method` on this reactor; None if it fails.
async fn call(ctx: &Ctx, method: &str, params: Option<Value>) -> Option<Value> {
    Registry::call(ctx, method, Params(params)).await.ok()
}

/// Nanoseconds reactors spent gathering for scrapes, summed (wall time of the gathering task
/// on reactor 0 from its start to its end: an upper bound of what scrapes took from the data
/// path, since reactor 0 serves I/O while the task waits for the other reactors).
static GATHER_NANOS: AtomicU64 = AtomicU64::new(0);
/// Scrapes gathered.
static GATHERS: AtomicU64 = AtomicU64::new(0);

/// (Seconds reactors spent gathering, scrapes gathered) so far: what scraping has cost the
/// data path at most ([`GATHER_NANOS`]).
pub fn gather_cost() -> (f64, u64) {
    (GATHER_NANOS.load(Ordering::Relaxed) as f64 / 1e9, GATHERS.load(Ordering::Relaxed))
}

/// Gathers the part that lives on the reactors (run on reactor 0), timed into [`GATHER_NANOS`].
async fn on_reactor0(ctx: Ctx) -> (Vec<BdevSnapshot>, serde_json::Map<String, Value>) {
    let t0 = Instant::now();
    let out = gather_on_reactor0(ctx).await;
    GATHER_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    GATHERS.fetch_add(1, Ordering::Relaxed);
    out
}

async fn gather_on_reactor0(ctx: Ctx) -> (Vec<BdevSnapshot>, serde_json::Map<String, Value>) {
    let bdevs = ferrite_bdev::snapshot::snapshot(&ctx.engine).await;
    let mut lists = serde_json::Map::new();
    for (method, params) in LISTS {
        let params = params.and_then(|p| serde_json::from_str(p).ok());
        if let Some(v) = call(&ctx, method, params).await {
            lists.insert(method.to_string(), v);
        }
    }
    let nqns: Vec<String> = lists
        .get("nvmf_get_subsystems")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|s| s["subtype"] != "Discovery")
                .filter_map(|s| s["nqn"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for method in ["nvmf_subsystem_get_qpairs", "nvmf_subsystem_get_controllers"] {
        let mut per = serde_json::Map::new();
        for nqn in &nqns {
            if let Some(v) = call(&ctx, method, Some(json!({ "nqn": nqn }))).await {
                per.insert(nqn.clone(), v);
            }
        }
        lists.insert(method.to_string(), Value::Object(per));
    }
    (bdevs, lists)
}

/// Takes a snapshot (on any thread but a reactor's), waiting at most `limit` for reactor 0.
pub fn snapshot(ctx: &Ctx, limit: Duration) -> Snapshot {
    let reactors = ctx.engine.stats();
    let c = ctx.clone();
    let mut rx = ctx.engine.run_async(0, move || on_reactor0(c));
    let (bdevs, lists) = match rx.wait_for(limit) {
        Some(Ok((b, l))) => (Some(b), l),
        _ => {
            log::warn!("metrics: reactor 0 did not answer within {limit:?}; bdev and target metrics left out");
            (None, Default::default())
        }
    };
    Snapshot { tick_rate: ferrite_reactor::tsc::ticks_per_sec().max(1), reactors, bdevs, lists }
}
