//! A logged-in session: who, to what, what was negotiated, its command window and SCSI nexus
//! (normal sessions), and its connections. A session lives on one reactor: its leading
//! connection's, where every connection that joins it is moved at its first Login Request
//! ([`super::login`]), so that its state is shared without locks. It ends with its last
//! connection; at ErrorRecoveryLevel 0 a connection that fails (rather than logs out or is
//! replaced) takes the session's other connections with it (RFC 7143 section 7.1.5: only
//! session recovery).
//!
//! A command's tag at the SCSI layer names its connection (index and generation in the
//! session) and slot, so that its response goes back to the connection it came on (task
//! allegiance).

use super::conn::{Conn, Stage};
use super::registry;
use super::seq::Window;
use crate::model::TargetNode;
use ferrite_bdev::Initiator;
use ferrite_iscsi::login::{LoginResult, LoginStatus};
use ferrite_iscsi::negotiate::{SessionParams, SessionType, TargetNegotiator, TargetOptions};
use ferrite_iscsi::pdu::Isid;
use ferrite_scsi::{Response, TaskDone};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
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

/// One connection of a session: the generation of its index, and the connection.
struct Member {
    gen: u16,
    conn: Weak<Conn>,
}

/// A logged-in session.
pub(crate) struct Session {
    /// TSIH.
    pub(crate) tsih: u16,
    /// InitiatorName.
    pub(crate) initiator: String,
    /// ISID.
    pub(crate) isid: Isid,
    /// Normal or discovery.
    pub(crate) kind: SessionType,
    /// The target node (normal sessions).
    pub(crate) target: Option<SessionTarget>,
    /// What was negotiated for the session (by its leading connection).
    pub(crate) params: SessionParams,
    /// The command window, shared by the connections.
    pub(crate) window: Rc<Window>,
    /// Commands the session may have outstanding.
    pub(crate) queue_depth: u32,
    /// The SCSI nexus (normal sessions), dropped with the last connection.
    nexus: RefCell<Option<Rc<ferrite_scsi::Session>>>,
    /// The connections by index (a free index keeps its generation).
    members: RefCell<Vec<Member>>,
}

/// Bits of a command's SCSI tag: slot (16), member index (16), member generation (16), and
/// whether it is immediate (bit 63: a response with no connection left still opens the window).
const IMMEDIATE_BIT: u64 = 1 << 63;

impl Session {
    /// The tag under which connection `member` (index, generation) submits `slot`.
    pub(crate) fn tag(member: (u16, u16), slot: u32, immediate: bool) -> u64 {
        debug_assert!(slot <= 0xffff);
        u64::from(slot)
            | (u64::from(member.0) << 16)
            | (u64::from(member.1) << 32)
            | if immediate { IMMEDIATE_BIT } else { 0 }
    }

    /// The SCSI nexus, if the session has one.
    pub(crate) fn nexus(&self) -> Option<Rc<ferrite_scsi::Session>> {
        self.nexus.borrow().clone()
    }

    /// The session's live connections.
    pub(crate) fn conns(&self) -> Vec<Rc<Conn>> {
        self.members.borrow().iter().filter_map(|m| m.conn.upgrade()).collect()
    }

    /// The connection with `cid`, if it is in the session.
    pub(crate) fn conn_by_cid(&self, cid: u16) -> Option<Rc<Conn>> {
        self.conns().into_iter().find(|c| c.cid.get() == cid)
    }

    /// Adds `c`: its index and generation.
    fn join(&self, c: &Rc<Conn>) -> (u16, u16) {
        let mut m = self.members.borrow_mut();
        let free = m.iter().position(|x| x.conn.strong_count() == 0);
        let i = match free {
            Some(i) => {
                m[i].gen = m[i].gen.wrapping_add(1);
                m[i].conn = Rc::downgrade(c);
                i
            }
            None => {
                m.push(Member { gen: 0, conn: Rc::downgrade(c) });
                m.len() - 1
            }
        };
        debug_assert!(i <= 0xffff, "more connections than MaxConnections allows");
        if m.iter().filter(|x| x.conn.strong_count() > 0).count() > 1 {
            self.window.set_ordered();
        }
        (i as u16, m[i].gen)
    }

    /// Connection `c` ends (`failed`: it did not log out and was not replaced). The last one
    /// takes the nexus with it; a failed one, the other connections too.
    pub(crate) fn leave(&self, c: &Conn, failed: bool) {
        let (idx, gen) = c.member.get();
        let others: Vec<Rc<Conn>> = {
            let mut m = self.members.borrow_mut();
            if let Some(x) = m.get_mut(usize::from(idx)).filter(|x| x.gen == gen) {
                x.conn = Weak::new();
            }
            m.iter().filter_map(|x| x.conn.upgrade()).filter(|o| o.id != c.id).collect()
        };
        self.window.wake_all();
        if others.is_empty() {
            let nexus = self.nexus.borrow_mut().take();
            drop(nexus);
            return;
        }
        if failed {
            log::warn!(
                "iscsi session {:#x} of {}: connection {} failed; its other connections close (ErrorRecoveryLevel 0)",
                self.tsih,
                self.initiator,
                c.id
            );
            for o in others {
                o.quiet_end.set(true);
                o.close();
            }
        }
    }
}

/// Where the SCSI layer's responses go: the connection the command came on, if it is still
/// there; if not, the window still opens for it.
struct Done(Weak<Session>);

impl TaskDone for Done {
    fn task_done(&self, tag: u64, resp: Response) {
        let Some(s) = self.0.upgrade() else { return };
        let (slot, idx, gen) = (tag as u16, (tag >> 16) as u16, (tag >> 32) as u16);
        let conn = s.members.borrow().get(usize::from(idx)).filter(|m| m.gen == gen).and_then(|m| m.conn.upgrade());
        match conn {
            Some(c) => super::datain::respond(&c, u32::from(slot), resp),
            None if tag & IMMEDIATE_BIT == 0 => s.window.open(),
            None => {}
        }
    }
}

/// Starts the full feature phase of `c` after the login `r` (to `node`, for a normal session):
/// a new session (leading connection) with its SCSI nexus and command window, or the session
/// on this reactor that `c` joins. The text exchanges too. Returns the session. The caller
/// sends the final Login Response, then switches the connection's framing to the negotiated
/// parameters.
pub(crate) fn start(
    c: &Rc<Conn>,
    r: &LoginResult,
    node: Option<Arc<TargetNode>>,
    options: TargetOptions,
) -> Result<Rc<Session>, LoginStatus> {
    let s = if r.leading { create(c, r, node)? } else { join(c, r)? };
    c.cid.set(r.cid);
    c.member.set(s.join(c));
    registry::logged_in(c.id, s.tsih, s.target.as_ref().map(|t| t.name.as_str()));
    log::info!(
        "iscsi connection {} from {}: {} logged in to {} (TSIH {:#x}, CID {}, {} connection, portal group {})",
        c.id,
        c.peer,
        s.initiator,
        s.target.as_ref().map_or("discovery", |t| t.name.as_str()),
        s.tsih,
        r.cid,
        if r.leading { "leading" } else { "joining" },
        c.pg_tag
    );
    if c.sess.set(s.clone()).is_err() {
        debug_assert!(false, "a connection logs in once");
        return Err(LoginStatus::TARGET_ERROR);
    }
    c.queue_depth.set(s.queue_depth);
    c.seq.start(r.next_stat_sn, s.window.clone());
    *c.text.borrow_mut() = Some(super::text::TextState::new(TargetNegotiator::new(options, true)));
    let mut nop = c.nop.get();
    nop.last = super::conn::now();
    c.nop.set(nop);
    c.stage.set(Stage::FullFeature);
    c.handshake_done();
    if s.conns().iter().any(|o| o.id != c.id && o.logout_by.get() != 0) {
        // The session was asked to log out (its target is going): so is this connection.
        super::logout::request(c);
    }
    Ok(s)
}

/// The session on this reactor that the authenticated connection `c` joins (its TSIH checked
/// at the login's start; the session may have ended or its target gone since).
fn join(c: &Rc<Conn>, r: &LoginResult) -> Result<Rc<Session>, LoginStatus> {
    let s = find_local(r.tsih).filter(|s| s.isid == r.isid).ok_or(LoginStatus::SESSION_DOES_NOT_EXIST)?;
    if let Some(t) = &s.target {
        if crate::target(&t.name).is_none() {
            return Err(LoginStatus::TARGET_REMOVED);
        }
    }
    registry::join_session(c, r.tsih, r.cid)?;
    Ok(s)
}

/// A new session for the leading connection `c`.
fn create(c: &Rc<Conn>, r: &LoginResult, node: Option<Arc<TargetNode>>) -> Result<Rc<Session>, LoginStatus> {
    let kind = r.negotiated.session.session_type;
    let initiator = r.negotiated.session.initiator_name.clone().unwrap_or_default();
    let (target, dev_port, window) = match (kind, node) {
        (SessionType::Normal, Some(node)) => {
            let (dev, port) = super::scsi::target_for(&node, c.pg_tag).map_err(|e| {
                log::warn!("iscsi connection {}: target {}: {e}", c.id, node.name);
                LoginStatus::TARGET_ERROR
            })?;
            let qd = node.queue_depth.max(1);
            (Some(SessionTarget { name: node.name.clone(), scsi: dev.clone() }), Some((dev, port)), qd)
        }
        (SessionType::Normal, None) => return Err(LoginStatus::TARGET_ERROR),
        (SessionType::Discovery, _) => (None, None, DISCOVERY_WINDOW),
    };
    let mut failed = None;
    let s = Rc::new_cyclic(|me: &Weak<Session>| {
        let nexus = dev_port.and_then(|(dev, port)| {
            let who = Initiator::Scsi { name: initiator.clone(), isid: r.isid.0 };
            ferrite_scsi::Session::new(&dev, who, port, Rc::new(Done(me.clone())))
                .map_err(|e| failed = Some(e.to_string()))
                .ok()
                .map(Rc::new)
        });
        Session {
            tsih: r.tsih,
            initiator: initiator.clone(),
            isid: r.isid,
            kind,
            target,
            params: r.negotiated.session.clone(),
            window: Rc::new(Window::new(r.exp_cmd_sn, window)),
            queue_depth: window,
            nexus: RefCell::new(nexus),
            members: RefCell::new(Vec::new()),
        }
    });
    if let Some(e) = failed {
        log::warn!("iscsi connection {}: target {}: {e}", c.id, s.target.as_ref().map_or("", |t| t.name.as_str()));
        return Err(LoginStatus::TARGET_ERROR);
    }
    Ok(s)
}

/// This reactor's session `tsih`, found through its connections.
pub(crate) fn find_local(tsih: u16) -> Option<Rc<Session>> {
    super::conn::all_local().into_iter().find_map(|c| c.session().filter(|s| s.tsih == tsih).cloned())
}
