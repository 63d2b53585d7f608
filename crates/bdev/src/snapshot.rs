//! What monitoring shows of each bdev (metrics, `ferrite top`): its I/O counters, queue depth
//! and latency histogram, gathered in one pass over the cores (one message per reactor per
//! call). The I/O path is not touched: each core reads the counters it keeps anyway.

use crate::histogram::Histogram;
use crate::stats::IoStat;
use ferrite_reactor::Engine;
use std::sync::Arc;

/// One bdev as monitoring sees it, summed over every core.
#[derive(Debug, Clone)]
pub struct BdevSnapshot {
    /// The bdev's name.
    pub name: String,
    /// Its I/O counters (as `bdev_get_iostat`).
    pub stat: IoStat,
    /// Requests submitted and not yet completed, over every core.
    pub queue_depth: u64,
    /// Its latency histogram (ticks), if `bdev_enable_histogram` turned it on.
    pub histogram: Option<Histogram>,
}

/// Gathers every registered bdev's snapshot (call on a reactor of `engine`, e.g. reactor 0).
pub async fn snapshot(engine: &Engine) -> Vec<BdevSnapshot> {
    let bdevs = crate::list();
    let ids: Arc<Vec<u64>> = Arc::new(bdevs.iter().map(|b| b.id()).collect());
    let per_core = engine
        .on_all(move |_| {
            ids.iter()
                .map(|&id| {
                    let hist = crate::channel::local_stats(id).and_then(|s| s.histogram());
                    (crate::channel::local_iostat(id), crate::channel::local_queue_depth(id), hist)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
    let mut out: Vec<BdevSnapshot> = bdevs
        .iter()
        .map(|b| BdevSnapshot { name: b.name().to_string(), stat: IoStat::default(), queue_depth: 0, histogram: None })
        .collect();
    for core in per_core {
        for (snap, (stat, qd, hist)) in out.iter_mut().zip(core) {
            snap.stat.add(&stat);
            snap.queue_depth += qd;
            match (&mut snap.histogram, hist) {
                (Some(total), Some(h)) => {
                    total.merge(&h);
                }
                (slot @ None, Some(h)) => *slot = Some(h),
                _ => {}
            }
        }
    }
    out
}
