//! Children that come back by themselves: with `auto_online_ms` set, a nexus looks at its
//! faulted children every that many milliseconds, and brings back (rebuilds) one that failed
//! on its own (an I/O error, its bdev gone, a failed rebuild) once it answers again: its bdev
//! reopens (a remote namespace re-attaches, a local bdev is back) and a read of its first block
//! succeeds within [`PROBE_TIMEOUT`]. Children faulted by the client, stopped by the client or
//! fenced off stay as they are. Each try waits twice as long as the one before: up to
//! [`MAX_PROBE_WAIT`] while the child does not answer, up to [`MAX_BACKOFF`] once its rebuilds
//! start and fail (a child that flaps); the waits start again from the interval once it is
//! healthy.
//!
//! Mayastor leaves this to its control plane; a Ferrite nexus has none, so it does it itself.

use crate::child::{ChildState, Reason};
use crate::nexus::Nexus;
use ferrite_bdev::IoRequest;
use ferrite_rpc::Ctx;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long the probe read of a returning child may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest wait between two probes of a child that does not answer.
pub const MAX_PROBE_WAIT: Duration = Duration::from_secs(5);
/// The longest wait between two tries on a child whose rebuilds fail.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// True if a child faulted for `reason` comes back by itself.
pub fn comes_back_by_itself(reason: &Reason) -> bool {
    matches!(reason, Reason::IoError(_) | Reason::Removed | Reason::RebuildFailed(_))
}

/// When a child is next tried, and how long it waits after that.
struct Backoff {
    next: Instant,
    wait: Duration,
}

/// Starts the watcher of `n` on the first core (nothing when `interval` is zero). It ends with
/// the nexus.
pub(crate) fn spawn(ctx: &Ctx, n: &Arc<Nexus>, interval: Duration) {
    if interval.is_zero() {
        return;
    }
    let (ctx, weak) = (ctx.clone(), Arc::downgrade(n));
    crate::nexus::on_first_core(move || {
        ferrite_reactor::spawn_local(watch(ctx, weak, interval)).detach();
    });
}

async fn watch(ctx: Ctx, weak: Weak<Nexus>, interval: Duration) {
    let mut backoff: HashMap<String, Backoff> = HashMap::new();
    loop {
        ferrite_reactor::sleep(interval).await;
        let Some(n) = weak.upgrade() else { return };
        if n.lock().destroying {
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let st = n.lock();
            // A child's waits last until it is healthy (a rebuild that fails keeps them).
            backoff.retain(|uri, _| st.slots.iter().flatten().any(|c| &c.uri == uri && !c.readable()));
            for c in st.slots.iter().flatten().filter(|c| c.state() == ChildState::Faulted) {
                if c.reason.as_ref().is_some_and(comes_back_by_itself)
                    && backoff.get(&c.uri).is_none_or(|b| now >= b.next)
                {
                    due.push(c.uri.clone());
                }
            }
        }
        for uri in due {
            let tried = try_child(&ctx, &n, &uri).await;
            let b = backoff.entry(uri.clone()).or_insert(Backoff { next: now, wait: interval });
            b.next = Instant::now() + b.wait;
            let cap = if tried.is_ok() { MAX_BACKOFF } else { MAX_PROBE_WAIT };
            b.wait = (b.wait * 2).min(cap.max(b.wait)).min(MAX_BACKOFF.max(interval));
            match tried {
                Ok(()) => log::info!("nexus {}: child {uri} answers again; rebuilding it", n.name),
                Err(e) => log::debug!("nexus {}: child {uri} not back yet: {e}", n.name),
            }
        }
    }
}

/// Probes the child at `uri` and, if it answers, brings it back (its rebuild starts).
async fn try_child(ctx: &Ctx, n: &Arc<Nexus>, uri: &str) -> Result<(), String> {
    let _g = crate::ctl::lock().await;
    let ch = {
        let st = n.lock();
        if st.destroying {
            return Err("the nexus is going".into());
        }
        let Some(c) = st.slots.iter().flatten().find(|c| c.uri == uri) else {
            return Err("removed".into());
        };
        if c.state() != ChildState::Faulted || !c.reason.as_ref().is_some_and(comes_back_by_itself) {
            return Err(format!("{} now", c.state().name()));
        }
        match &c.desc {
            Some(d) => Some((d.channel().map_err(|e| e.to_string())?, d.bdev().block_size())),
            None => None,
        }
    };
    if let Some((ch, bs)) = ch {
        let req = IoRequest::read(0, 1, ferrite_reactor::alloc_buf(bs as usize));
        match ch.submit_wait_within(req, PROBE_TIMEOUT).await {
            None => return Err("the probe read timed out".into()),
            Some(c) if !c.status.is_ok() => return Err(format!("the probe read failed: {}", c.status)),
            Some(_) => {}
        }
    }
    crate::nexus::bring_back(ctx, n, uri).await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_children_that_failed_on_their_own_come_back_by_themselves() {
        assert!(comes_back_by_itself(&Reason::IoError("read: EIO".into())));
        assert!(comes_back_by_itself(&Reason::Removed));
        assert!(comes_back_by_itself(&Reason::RebuildFailed("write: EIO".into())));
        assert!(!comes_back_by_itself(&Reason::ByClient));
        assert!(!comes_back_by_itself(&Reason::RebuildStopped));
        assert!(!comes_back_by_itself(&Reason::ReservationConflict("preempted".into())));
        assert!(!comes_back_by_itself(&Reason::OutOfSync));
    }
}
