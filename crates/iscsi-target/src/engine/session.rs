//! A session as its connection keeps it once logged in: who, to what, what was negotiated, and
//! its SCSI nexus (normal sessions). One connection per session: the session lives on the
//! connection's reactor and ends with it.

use super::conn::{Conn, Stage};
use super::registry;
use crate::model::TargetNode;
use ferrite_bdev::Initiator;
use ferrite_iscsi::login::{LoginResult, LoginStatus};
use ferrite_iscsi::negotiate::{SessionParams, SessionType, TargetNegotiator, TargetOptions};
use std::rc::Rc;
use std::sync::Arc;

/// Commands a discovery session may have outstanding (Text and Logout only).
const DISCOVERY_WINDOW: u32 = 8;

/// The target node of a normal session.
pub(crate) struct SessionTarget {
    /// The node's full name.
    pub(crate) name: String,
    /// Its SCSI device.
    pub(crate) scsi: Arc<ferrite_scsi::Target>,
}

/// A logged-in session.
pub(crate) struct Session {
    /// TSIH.
    pub(crate) tsih: u16,
    /// The connection's CID.
    pub(crate) cid: u16,
    /// InitiatorName.
    pub(crate) initiator: String,
    /// Normal or discovery.
    pub(crate) kind: SessionType,
    /// The target node (normal sessions).
    pub(crate) target: Option<SessionTarget>,
    /// What was negotiated for the session.
    pub(crate) params: SessionParams,
}

/// Starts the full feature phase of `c` after the login `r` (to `node`, for a normal session):
/// the SCSI nexus, the command window, the text exchanges. The caller sends the final Login
/// Response, then switches the connection's framing to the negotiated parameters.
pub(crate) fn start(
    c: &Rc<Conn>,
    r: &LoginResult,
    node: Option<Arc<TargetNode>>,
    options: TargetOptions,
) -> Result<u32, LoginStatus> {
    let kind = r.negotiated.session.session_type;
    let initiator = r.negotiated.session.initiator_name.clone().unwrap_or_default();
    let (target, window) = match (kind, node) {
        (SessionType::Normal, Some(node)) => {
            let (dev, port) = super::scsi::target_for(&node, c.pg_tag).map_err(|e| {
                log::warn!("iscsi connection {}: target {}: {e}", c.id, node.name);
                LoginStatus::TARGET_ERROR
            })?;
            let who = Initiator::Scsi { name: initiator.clone(), isid: r.isid.0 };
            let done = Rc::new(super::task::Done(Rc::downgrade(c)));
            let nexus = ferrite_scsi::Session::new(&dev, who, port, done).map_err(|e| {
                log::warn!("iscsi connection {}: target {}: {e}", c.id, node.name);
                LoginStatus::TARGET_ERROR
            })?;
            *c.scsi.borrow_mut() = Some(Rc::new(nexus));
            let qd = node.queue_depth.max(1);
            (Some(SessionTarget { name: node.name.clone(), scsi: dev }), qd)
        }
        (SessionType::Normal, None) => return Err(LoginStatus::TARGET_ERROR),
        (SessionType::Discovery, _) => (None, DISCOVERY_WINDOW),
    };
    let s = Session { tsih: r.tsih, cid: r.cid, initiator, kind, target, params: r.negotiated.session.clone() };
    registry::logged_in(c.id, s.tsih, s.target.as_ref().map(|t| t.name.as_str()));
    log::info!(
        "iscsi connection {} from {}: {} logged in to {} (TSIH {:#x}, portal group {})",
        c.id,
        c.peer,
        s.initiator,
        s.target.as_ref().map_or("discovery", |t| t.name.as_str()),
        s.tsih,
        c.pg_tag
    );
    if c.sess.set(s).is_err() {
        debug_assert!(false, "a connection logs in once");
        return Err(LoginStatus::TARGET_ERROR);
    }
    c.queue_depth.set(window);
    c.seq.start(r.next_stat_sn, r.exp_cmd_sn, window);
    *c.text.borrow_mut() = Some(super::text::TextState::new(TargetNegotiator::new(options, true)));
    let mut nop = c.nop.get();
    nop.last = super::conn::now();
    c.nop.set(nop);
    c.stage.set(Stage::FullFeature);
    c.handshake_done();
    Ok(window)
}
