//! A nexus's children and their state machine. Every change of a child's state goes through
//! [`Child::transition`], which checks it against the machine:
//!
//! ```text
//!   (new, store says current) ─► Healthy ──fault (I/O error, client, removed)──► Faulted
//!   (new, or store says stale) ─────────────────────────────────────────────────► Faulted
//!   Faulted ──online / add (rebuild starts)──► Rebuilding ──copy done──► Healthy
//!   Rebuilding ──I/O error, copy failed, stopped, client──► Faulted
//! ```
//!
//! Healthy children serve reads and take writes; Rebuilding ones take writes; Faulted ones
//! neither. A child that stops being healthy is recorded as out of date in the store (the
//! nexus's generation `fault_gen`) before a write it missed is acknowledged.

use crate::rebuild::RebuildJob;
use crate::uri::ChildUri;
use ferrite_bdev::BdevDesc;
use std::sync::Arc;

/// A child's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildState {
    /// Current: serves reads, takes writes.
    Healthy,
    /// Being rebuilt: takes writes, serves no reads.
    Rebuilding,
    /// Out of date: neither.
    Faulted,
}

impl ChildState {
    /// The name `nexus_get_nexuses` shows.
    pub fn name(self) -> &'static str {
        match self {
            ChildState::Healthy => "online",
            ChildState::Rebuilding => "rebuilding",
            ChildState::Faulted => "faulted",
        }
    }
}

/// Why a child is (or was last) not healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// It failed an I/O.
    IoError(String),
    /// It refused a write with NVMe's Reservation Conflict: another nexus preempted this one's
    /// reservation (fencing); it is not brought back by `nexus_online_child`.
    ReservationConflict(String),
    /// `nexus_fault_child`.
    ByClient,
    /// Its bdev went away.
    Removed,
    /// Added, or the store says it is stale: it needs a rebuild.
    OutOfSync,
    /// Its rebuild failed.
    RebuildFailed(String),
    /// Its rebuild was stopped.
    RebuildStopped,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::IoError(s) => write!(f, "io_error: {s}"),
            Reason::ReservationConflict(s) => write!(f, "reservation_conflict: {s}"),
            Reason::ByClient => f.write_str("by_client"),
            Reason::Removed => f.write_str("removed"),
            Reason::OutOfSync => f.write_str("out_of_sync"),
            Reason::RebuildFailed(s) => write!(f, "rebuild_failed: {s}"),
            Reason::RebuildStopped => f.write_str("rebuild_stopped"),
        }
    }
}

/// True if the machine allows `from` → `to`.
pub fn allowed(from: ChildState, to: ChildState) -> bool {
    use ChildState::*;
    matches!(
        (from, to),
        (Healthy, Faulted) | (Faulted, Faulted) | (Faulted, Rebuilding) | (Rebuilding, Healthy) | (Rebuilding, Faulted)
    )
}

/// One child of a nexus.
pub struct Child {
    /// Its URI, as given.
    pub uri: String,
    /// What the URI names.
    pub parsed: ChildUri,
    /// The bdev's name.
    pub bdev_name: String,
    /// The nexus made the bdev (and removes it with the child).
    pub made: bool,
    /// The open, claimed bdev (None once it went away).
    pub desc: Option<BdevDesc>,
    /// Its state.
    state: ChildState,
    /// Why it is not healthy (or was not, last).
    pub reason: Option<Reason>,
    /// The nexus generation at which it stopped being healthy (recorded in the store by then).
    pub fault_gen: u64,
    /// The nexus's segment log holds every write it missed (a partial rebuild will do).
    pub log_valid: bool,
    /// Its rebuild, running or the last one.
    pub rebuild: Option<Arc<RebuildJob>>,
}

impl Child {
    /// A child in `state` (Healthy, or Faulted out of sync).
    pub fn new(uri: String, parsed: ChildUri, bdev_name: String, made: bool, desc: BdevDesc, healthy: bool) -> Self {
        Child {
            uri,
            parsed,
            bdev_name,
            made,
            desc: Some(desc),
            state: if healthy { ChildState::Healthy } else { ChildState::Faulted },
            reason: if healthy { None } else { Some(Reason::OutOfSync) },
            fault_gen: 0,
            log_valid: false,
            rebuild: None,
        }
    }

    /// Its state.
    pub fn state(&self) -> ChildState {
        self.state
    }

    /// Moves it to `to` (the one place a child's state changes); `reason` says why when it is
    /// not healthy, `gen` is the nexus generation that records a healthy child's fault.
    pub fn transition(&mut self, to: ChildState, reason: Option<Reason>, gen: u64) {
        debug_assert!(allowed(self.state, to), "child {}: {:?} -> {to:?} is not a transition", self.uri, self.state);
        debug_assert_eq!(to == ChildState::Healthy, reason.is_none(), "a reason exactly when not healthy");
        log::info!(
            "nexus child {}: {} -> {}{}",
            self.uri,
            self.state.name(),
            to.name(),
            reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
        );
        if self.state == ChildState::Healthy && to == ChildState::Faulted {
            debug_assert!(gen > self.fault_gen, "a fault takes a new generation");
            self.fault_gen = gen;
        }
        if to == ChildState::Healthy {
            self.log_valid = false;
        }
        self.state = to;
        self.reason = reason;
    }

    /// Takes writes.
    pub fn writable(&self) -> bool {
        self.desc.is_some() && matches!(self.state, ChildState::Healthy | ChildState::Rebuilding)
    }

    /// Serves reads (and may be a rebuild's source).
    pub fn readable(&self) -> bool {
        self.desc.is_some() && self.state == ChildState::Healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChildState::*;

    #[test]
    fn the_machine_allows_only_its_edges() {
        let all = [Healthy, Rebuilding, Faulted];
        let ok: Vec<_> =
            all.iter().flat_map(|&a| all.iter().map(move |&b| (a, b))).filter(|&(a, b)| allowed(a, b)).collect();
        assert_eq!(
            ok,
            vec![
                (Healthy, Faulted),
                (Rebuilding, Healthy),
                (Rebuilding, Faulted),
                (Faulted, Rebuilding),
                (Faulted, Faulted)
            ]
        );
        assert_eq!(Reason::IoError("write: EIO".into()).to_string(), "io_error: write: EIO");
        assert_eq!(Faulted.name(), "faulted");
    }
}
