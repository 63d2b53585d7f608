//! What the connection engine plugs in: a [`PortalListener`] that listens on portal groups, and
//! [`Sessions`], which reports connections (`iscsi_get_connections`, `iscsi_get_stats`), logs
//! them out on request and hears of LUN changes. Registered once at startup, per engine
//! ([`set_portal_listener`], [`set_sessions`]). Without them the registry records everything
//! and says, when a portal group is created, that nothing listens; the connection methods
//! answer an empty list and zeros.
//!
//! Hooks are called on the RPC reactor with no registry lock held, so they may read the
//! registry ([`crate::portal_groups`], ...).

use crate::model::PortalGroup;
use std::sync::{Arc, RwLock};

/// Listens on portal groups: the engine's accept side.
pub trait PortalListener: Send + Sync {
    /// Binds and listens on every portal of `pg` (all or none: on failure nothing stays bound).
    /// With `paused` (`iscsi_create_portal_group` with `wait`) connections are not accepted
    /// until [`PortalListener::resume`]; SPDK binds at once and pauses only its acceptor, so a
    /// port in use fails the create either way.
    fn open(&self, pg: &PortalGroup, paused: bool) -> Result<(), String>;
    /// Starts accepting on portal group `tag` (`iscsi_start_portal_group`; nothing if it is
    /// accepting already).
    fn resume(&self, tag: i32);
    /// Stops listening on portal group `tag` (it was deleted); its connections stay.
    fn close(&self, tag: i32);
}

/// A connection's state, as SPDK names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// "invalid"
    Invalid,
    /// "running"
    Running,
    /// "exiting"
    Exiting,
    /// "exited"
    Exited,
}

impl ConnState {
    /// SPDK's name.
    pub fn name(self) -> &'static str {
        match self {
            ConnState::Invalid => "invalid",
            ConnState::Running => "running",
            ConnState::Exiting => "exiting",
            ConnState::Exited => "exited",
        }
    }
}

/// Where a connection is in its login, as SPDK names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginPhase {
    /// "not_started"
    NotStarted,
    /// "security_negotiation_phase"
    Security,
    /// "operational_negotiation_phase"
    Operational,
    /// "full_feature_phase"
    FullFeature,
}

impl LoginPhase {
    /// SPDK's name.
    pub fn name(self) -> &'static str {
        match self {
            LoginPhase::NotStarted => "not_started",
            LoginPhase::Security => "security_negotiation_phase",
            LoginPhase::Operational => "operational_negotiation_phase",
            LoginPhase::FullFeature => "full_feature_phase",
        }
    }
}

/// One connection, as `iscsi_get_connections` lists it (SPDK's `iscsi_conn_info_json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The engine's connection id.
    pub id: i32,
    /// The CID the initiator gave.
    pub cid: i32,
    /// The session's TSIH, `None` before login (SPDK writes 65535 then).
    pub tsih: Option<u16>,
    /// State.
    pub state: ConnState,
    /// Login phase.
    pub login_phase: LoginPhase,
    /// The initiator's address.
    pub initiator_addr: String,
    /// The target address it connected to.
    pub target_addr: String,
    /// The target node's short name (empty for discovery sessions and before login).
    pub target_node_name: String,
    /// The reactor thread serving it (SPDK's thread name).
    pub thread_name: String,
}

/// What happened to a LUN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LunEvent {
    /// Its bdev is being deleted: the LUN has left its target node; the engine ends its I/O
    /// and drops the snapshots that hold it (the bdev's deletion waits for its descriptor).
    Removed,
    /// Its bdev changed size (SCSI: a capacity data has changed unit attention).
    Resized,
}

/// The engine's sessions: what the connection methods report and the requests they pass on.
pub trait Sessions: Send + Sync {
    /// Every connection, on every reactor.
    fn connections(&self) -> Vec<ConnectionInfo>;
    /// Asks the connections to target node `target` (through portal group `pg_tag` only, if
    /// given) to log out (an Async Message; SPDK drops those that do not within 30 s).
    fn request_logout(&self, target: &str, pg_tag: Option<i32>);
    /// How many connections are logged in to target node `target`.
    fn active_connections(&self, target: &str) -> usize;
    /// A LUN of target node `target` changed (called after the registry changed).
    fn lun_event(&self, target: &str, lun_id: u32, event: LunEvent) {
        let _ = (target, lun_id, event);
    }
}

/// The hooks registered in an engine.
#[derive(Default)]
pub(crate) struct Hooks {
    listener: RwLock<Option<Arc<dyn PortalListener>>>,
    sessions: RwLock<Option<Arc<dyn Sessions>>>,
}

fn hooks() -> Arc<Hooks> {
    ferrite_reactor::engine_state::<Hooks>()
}

/// The portal listener, if the engine registered one.
pub(crate) fn listener() -> Option<Arc<dyn PortalListener>> {
    hooks().listener.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The sessions, if the engine registered them.
pub(crate) fn sessions() -> Option<Arc<dyn Sessions>> {
    hooks().sessions.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Registers the engine's portal listener. Portal groups that exist already are opened now
/// (paused if created with `wait` and not started); a failure is logged and leaves that group
/// recorded but not listening.
pub fn set_portal_listener(l: Arc<dyn PortalListener>) {
    *hooks().listener.write().unwrap_or_else(|p| p.into_inner()) = Some(l.clone());
    for pg in crate::portal_groups() {
        if let Err(e) = l.open(&pg, !pg.started) {
            log::error!("iscsi: portal group {} does not listen: {e}", pg.tag);
        }
    }
}

/// Registers the engine's sessions.
pub fn set_sessions(s: Arc<dyn Sessions>) {
    *hooks().sessions.write().unwrap_or_else(|p| p.into_inner()) = Some(s);
}
