//! Ferrite's iSCSI target: its configuration model and management plane (SPDK v26.05's
//! `iscsi_*` RPCs and the "iscsi" subsystem of `save_config`, so SPDK's saved iSCSI configs
//! load unchanged). The connection engine (sockets, login, SCSI) is not here: it consumes this
//! model through the functions below and plugs itself in through [`hooks`].
//!
//! # The model
//!
//! One registry per engine (`ferrite_reactor::engine_state`), behind a read-write lock. RPCs
//! change it on the first reactor; the engine reads it per login or discovery request, never
//! per I/O. Each object is an immutable snapshot behind an `Arc`, replaced when it changes:
//! a [`TargetNode`] taken at login stays coherent (and keeps its [`Lun`]s' bdevs open) until
//! dropped. [`generation`] moves on every change, for caches.
//!
//! - [`options`]: `iscsi_set_options`' values ([`IscsiOptions`]: node base, session and queue
//!   limits, login keys the engine offers, NOP timing, discovery CHAP).
//! - [`portal_groups`] / [`portal_group`]: tags and portals ([`PortalGroup`]; `private` ones
//!   are for redirection only). The engine listens: it registers a [`PortalListener`] at
//!   startup ([`set_portal_listener`]) and is asked to open a group on create (paused with
//!   `wait`, resumed by `iscsi_start_portal_group`) and to close it on delete. Without one a
//!   group is recorded, and the log says nothing listens.
//! - [`target`] / [`targets`] / [`targets_for_portal_group`]: target nodes (full name, alias,
//!   LUNs as (id, bdev) with the bdev held open, portal group → initiator group maps with an
//!   optional redirect, queue depth, CHAP, digests). A bdev's deletion removes its LUNs (the node
//!   stays) and the engine hears of it ([`Sessions::lun_event`]).
//! - [`allowed`]: may initiator `name` at `addr` log in to a node through portal group `tag`
//!   (SPDK's rules: the map's initiator groups in order, names then netmasks, `!` denies, `ANY`).
//!   [`visible_in_discovery`] and [`send_targets`]: what SendTargets lists (what the initiator
//!   may reach; private portal groups hidden). See [`access`] for where this differs from SPDK.
//! - [`auth_secret`]: CHAP credentials of a user in an auth group; [`discovery_auth`]: the
//!   discovery sessions' CHAP settings (a node's are [`TargetNode::chap`]).
//! - [`Sessions`]: the engine's connections, for `iscsi_get_connections` / `iscsi_get_stats`
//!   (SPDK's shapes; empty and zeros until registered), logout requests and LUN events.
//!
//! # Differences from SPDK
//!
//! - Deleting a portal or initiator group that target nodes use succeeds and unmaps it from
//!   them, as in SPDK (a node may be left with no map).
//! - Portal group tags must be 0-65535 (the iSCSI TPGT is 16 bits; SPDK takes any int32).
//!   Portal hosts must be numeric; without an engine no socket is bound, so a port in use is
//!   found only when the engine opens the group.
//! - `iscsi_set_options` values SPDK's start-up would refuse are refused by the call.
//! - `iscsi_create_target_node` takes a node without `alias_name`: SPDK requires it but its
//!   own `save_config` leaves it out of a node without alias (so SPDK cannot load that entry).
//!   Ferrite's `save_config` writes it empty, which SPDK loads.
//! - SendTargets checks addresses too ([`access`]).

#![warn(missing_docs)]

pub mod access;
mod auth;
mod chap;
pub mod engine;
pub mod hooks;
mod initiator;
mod json;
pub mod limits;
mod lun;
mod model;
pub mod name;
pub mod netmask;
pub mod options;
mod portal;
mod rpc;
mod state;

pub use access::{DiscoveryEntry, TargetAddress};
pub use chap::{AuthMode, ChapParams};
pub use hooks::{
    set_portal_listener, set_sessions, ConnState, ConnectionInfo, LoginPhase, LunEvent, PortalListener, Sessions,
};
pub use model::{AuthGroup, InitiatorGroup, Lun, PgMap, Portal, PortalGroup, Redirect, Refused, Secret, TargetNode};
pub use options::IscsiOptions;
pub use rpc::register;

use state::with_read;
use std::net::IpAddr;
use std::sync::Arc;

/// The target node named `name` (its full name, any case).
pub fn target(name: &str) -> Option<Arc<TargetNode>> {
    with_read(|s| s.target(name).cloned())
}

/// Every target node, in creation order.
pub fn targets() -> Vec<Arc<TargetNode>> {
    with_read(|s| s.targets.clone())
}

/// The target nodes reached through portal group `tag`.
pub fn targets_for_portal_group(tag: i32) -> Vec<Arc<TargetNode>> {
    with_read(|s| s.targets.iter().filter(|t| t.pg_map(tag).is_some()).cloned().collect())
}

/// Every portal group, in creation order.
pub fn portal_groups() -> Vec<Arc<PortalGroup>> {
    with_read(|s| s.portal_groups.clone())
}

/// The portal group `tag`.
pub fn portal_group(tag: i32) -> Option<Arc<PortalGroup>> {
    with_read(|s| s.portal_group(tag).cloned())
}

/// The initiator group `tag`.
pub fn initiator_group(tag: i32) -> Option<Arc<InitiatorGroup>> {
    with_read(|s| s.initiator_group(tag).cloned())
}

/// `user`'s CHAP credentials in auth group `group`.
pub fn auth_secret(group: i32, user: &str) -> Option<Secret> {
    with_read(|s| s.auth_group(group)?.secrets.iter().find(|x| x.user == user).cloned())
}

/// The discovery sessions' CHAP settings.
pub fn discovery_auth() -> ChapParams {
    with_read(|s| s.options.discovery)
}

/// The target's options.
pub fn options() -> IscsiOptions {
    with_read(|s| s.options.clone())
}

/// Moves on every change of the configuration.
pub fn generation() -> u64 {
    with_read(|s| s.generation)
}

/// True if `initiator` at `addr` may log in to `node` through portal group `pg_tag`.
pub fn allowed(node: &TargetNode, initiator: &str, addr: IpAddr, pg_tag: i32) -> bool {
    with_read(|s| access::allowed(s, node, initiator, addr, pg_tag))
}

/// True if SendTargets from `initiator` at `addr` lists `node`.
pub fn visible_in_discovery(node: &TargetNode, initiator: &str, addr: IpAddr) -> bool {
    with_read(|s| access::visible(s, node, initiator, addr))
}

/// The SendTargets answer for `initiator` at `addr`: every node it may reach (`which` `None`,
/// `SendTargets=All`) or the one named.
pub fn send_targets(initiator: &str, addr: IpAddr, which: Option<&str>) -> Vec<DiscoveryEntry> {
    with_read(|s| access::send_targets(s, initiator, addr, which))
}

/// Where logins to `node` through portal group `pg_tag` are redirected, if anywhere.
pub fn redirect(node: &TargetNode, pg_tag: i32) -> Option<Redirect> {
    node.pg_map(pg_tag)?.redirect.clone()
}

/// Daemon shutdown (on the first reactor): portal groups stop listening and target nodes go,
/// closing their LUNs' bdevs (connections are the engine's to close first).
pub fn shutdown() {
    let (pgs, targets) = state::with_write(|s| (std::mem::take(&mut s.portal_groups), std::mem::take(&mut s.targets)));
    if let Some(l) = hooks::listener() {
        for pg in &pgs {
            l.close(pg.tag);
        }
    }
    drop(targets);
}
