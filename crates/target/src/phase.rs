//! Phase changes of a command, through one function: the transition is checked against the
//! protocol's table of legal ones (a debug assertion) and can be traced (log target
//! `ferrite::phase` at trace level), as SPDK's `nvmf_tcp_req_set_state` does.

use std::fmt::Debug;

/// A command's phase in one protocol.
pub trait Phase: Copy + PartialEq + Debug {
    /// True if a command may go from `self` to `to`.
    fn may_become(self, to: Self) -> bool;
}

/// Moves `phase` (of command `slot` of connection `conn`) to `to`.
#[inline(always)]
pub fn transition<P: Phase>(phase: &mut P, to: P, conn: u64, slot: u32) {
    debug_assert!(phase.may_become(to), "connection {conn} slot {slot}: illegal phase change {:?} -> {to:?}", *phase);
    if log::log_enabled!(target: "ferrite::phase", log::Level::Trace) {
        log::trace!(target: "ferrite::phase", "connection {conn} slot {slot}: {:?} -> {to:?}", *phase);
    }
    *phase = to;
}
