//! The nexus: Mayastor's replicated volume, as a bdev module. A nexus is a bdev over N children
//! of the same size, named by URI (`uri`): writes go to every healthy child, reads to one; a
//! child that fails is faulted and retired while the volume goes on; a new or returning child is
//! rebuilt (partially, from the log of segments written while it was away, when there is one);
//! which children are current is kept in a persistent store (a file or etcd), so that after a
//! crash the nexus is reassembled only from children known to be current.
//!
//! - [`uri`]: child URIs. `open`: what they name, opened and claimed.
//! - [`child`]: a child and its state machine. [`nexus`]: the control plane.
//! - `channel`: the data path. [`rebuild`]: rebuilds. [`seglog`]: the segment log.
//! - [`heal`]: faulted children brought back when they answer again (`auto_online_ms`).
//! - [`fence`]: NVMe reservations on remote children (`resv_key`, `preempt_key`).
//! - [`publish`]: the nexus over NVMe/TCP (through the target's RPC methods).
//! - [`store`], [`etcd`]: the health store. [`rpc`]: the JSON-RPC methods.

mod channel;
pub mod child;
mod ctl;
pub mod etcd;
pub mod fence;
pub mod heal;
pub mod nexus;
mod open;
pub mod publish;
pub mod rebuild;
pub mod rpc;
pub mod seglog;
pub mod store;
pub mod uri;

/// Registers the nexus's RPC methods.
pub fn register(reg: &mut ferrite_rpc::Registry) {
    rpc::register(reg);
}
