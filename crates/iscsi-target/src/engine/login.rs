//! The login phase of a connection: each Login Request goes to its
//! `ferrite_iscsi::login::TargetLogin`, which asks the model through [`Ctx`] (the
//! `LoginContext`): target nodes (SPDK's order of checks: not found, redirected, access
//! denied), CHAP secrets from auth groups (the node's `chap_group`, or the discovery auth's),
//! and sessions (created with a TSIH, reinstated, or joined by a connection up to the
//! negotiated MaxConnections). A connection that joins a session on another reactor moves
//! there at its first Login Request ([`Move`]), which the new reactor then answers. The final
//! response starts the session or joins it ([`super::session::start`]) and switches the
//! connection to the negotiated framing.

use super::conn::Conn;
use super::registry;
use crate::chap::{AuthMode as Mode, ChapParams};
use crate::model::TargetNode;
use crate::IscsiOptions;
use ferrite_iscsi::chap::{ChapSecrets, Credentials};
use ferrite_iscsi::login::{
    AuthMode, AuthPolicy, LoginContext, LoginStatus, Outcome, SessionRef, TargetInfo, TargetLogin, TargetLoginConfig,
    TargetLookup,
};
use ferrite_iscsi::negotiate::{DigestPolicy, Negotiated, SessionType, TargetOptions};
use ferrite_iscsi::pdu::{LoginRequest, Pdu, PduParams, Stage};
use std::rc::Rc;
use std::sync::Arc;

/// A connection on its way to the reactor of the session it joins, with its first Login
/// Request (not answered yet).
pub(crate) struct Move {
    /// The session's reactor.
    pub(crate) reactor: usize,
    /// The request.
    pub(crate) req: LoginRequest,
    /// Its data segment.
    pub(crate) data: Vec<u8>,
}

/// A connection's login under way.
pub(crate) struct LoginState {
    /// No request has been answered yet.
    first: bool,
    login: TargetLogin,
    /// The target node the login named (taken at its lookup; dropped at the login's end, so
    /// that the connection does not hold the node's LUNs open).
    node: Option<Arc<TargetNode>>,
    options: IscsiOptions,
}

impl LoginState {
    /// A login on connection `c`.
    pub(crate) fn new(c: &Conn) -> LoginState {
        let options = crate::options();
        let cfg = TargetLoginConfig {
            options: target_options(&options, false, false),
            portal_group_tag: c.pg_tag,
            initial_stat_sn: 0,
            cmd_window: options.max_queue_depth.max(1),
            ..TargetLoginConfig::default()
        };
        LoginState { first: true, login: TargetLogin::new(cfg), node: None, options }
    }
}

/// The login keys the target offers and accepts, from SPDK's options: MaxConnections
/// (`max_connections_per_session`), ErrorRecoveryLevel=0 (what the engine serves), InitialR2T=No (unsolicited data taken; an
/// initiator that wants R2Ts for all of it gets Yes, the OR of both), data in order, digests
/// as the node requires.
pub(crate) fn target_options(o: &IscsiOptions, header_digest: bool, data_digest: bool) -> TargetOptions {
    let digest = |required| if required { DigestPolicy::Required } else { DigestPolicy::Allowed };
    TargetOptions {
        first_burst_length: o.first_burst_length.min(crate::limits::MAX_BURST_LENGTH),
        max_burst_length: crate::limits::MAX_BURST_LENGTH,
        immediate_data: o.immediate_data,
        initial_r2t: false,
        error_recovery_level: 0,
        max_connections: o.max_connections_per_session.clamp(1, 65535) as u16,
        max_outstanding_r2t: 1,
        default_time2wait: o.default_time2wait.min(3600) as u16,
        default_time2retain: o.default_time2retain.min(3600) as u16,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        header_digest: digest(header_digest),
        data_digest: digest(data_digest),
        ..TargetOptions::default()
    }
}

/// A node's or the discovery service's CHAP settings as the login applies them.
fn policy(c: ChapParams) -> AuthPolicy {
    match c.mode() {
        Some(Mode::None) => AuthPolicy { mode: AuthMode::None, mutual: false },
        Some(Mode::Chap) => AuthPolicy { mode: AuthMode::Chap, mutual: false },
        Some(Mode::Mutual) => AuthPolicy { mode: AuthMode::Chap, mutual: true },
        Some(Mode::Auto) | None => AuthPolicy { mode: AuthMode::Optional, mutual: false },
    }
}

/// What SPDK's `iscsi_get_connections` calls a stage.
fn phase_of(s: Stage) -> crate::LoginPhase {
    match s {
        Stage::Security => crate::LoginPhase::Security,
        Stage::Operational => crate::LoginPhase::Operational,
        Stage::FullFeature => crate::LoginPhase::FullFeature,
    }
}

/// The login's view of the target's tables.
struct Ctx<'a> {
    c: &'a Conn,
    node: &'a mut Option<Arc<TargetNode>>,
    options: &'a IscsiOptions,
}

impl LoginContext for Ctx<'_> {
    fn lookup_target(&mut self, target_name: &str, initiator_name: &str) -> TargetLookup {
        let Some(node) = crate::target(target_name) else {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi connection {} from {}: target {target_name} not found",
                self.c.id,
                self.c.peer
            );
            return TargetLookup::NotFound;
        };
        let tag = i32::from(self.c.pg_tag);
        if let Some(r) = crate::redirect(&node, tag) {
            return TargetLookup::Moved { address: format!("{}:{}", r.host, r.port), permanent: false };
        }
        let allowed = self.c.peer_ip.is_some_and(|ip| crate::allowed(&node, initiator_name, ip, tag));
        if !allowed {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi connection {} from {}: {initiator_name} may not log in to {} through portal group {tag}",
                self.c.id,
                self.c.peer,
                node.name
            );
            return TargetLookup::NotAuthorized;
        }
        let info = TargetInfo {
            name: node.name.clone(),
            alias: node.alias.clone().filter(|a| !a.is_empty()),
            auth: policy(node.chap),
            options: Some(target_options(self.options, node.header_digest, node.data_digest)),
        };
        *self.node = Some(node);
        TargetLookup::Found(info)
    }

    fn discovery_auth(&mut self, _initiator_name: &str) -> Option<AuthPolicy> {
        Some(policy(crate::discovery_auth()))
    }

    fn chap_secrets(&mut self, target: Option<&str>, name: &str) -> Option<ChapSecrets> {
        let group = match (target, self.node.as_ref()) {
            (Some(_), Some(n)) => n.chap.group,
            (Some(t), None) => crate::target(t)?.chap.group,
            (None, _) => crate::discovery_auth().group,
        };
        let s = crate::auth_secret(group, name)?;
        let mutual = match (s.muser, s.msecret) {
            (Some(name), Some(secret)) => Some(Credentials { name, secret: secret.into_bytes() }),
            _ => None,
        };
        Some(ChapSecrets { secret: s.secret.into_bytes(), mutual })
    }

    fn join_session(&mut self, s: &SessionRef<'_>) -> Result<(), LoginStatus> {
        let target = match s.session_type {
            SessionType::Normal => s.target_name,
            SessionType::Discovery => None,
        };
        registry::may_join(self.c, s.tsih, s.initiator_name, s.isid, target, s.cid)
    }

    fn create_session(&mut self, s: &SessionRef<'_>, negotiated: &Negotiated) -> Result<u16, LoginStatus> {
        let target = match s.session_type {
            SessionType::Normal => s.target_name,
            SessionType::Discovery => None,
        };
        let max_conns = negotiated.session.max_connections.max(1);
        registry::create_session(self.c, s.initiator_name, s.isid, target, self.options.max_sessions, max_conns)
    }

    fn random(&mut self, buf: &mut [u8]) {
        ferrite_iscsi::chap::system_random(buf)
    }
}

/// Answers a Login Request (`data`: its whole data segment). Ok(false) once the login has
/// failed (its response is queued; the connection ends after sending it); Err for a request
/// that cannot be answered at all.
pub(crate) fn on_request(c: &Rc<Conn>, req: &LoginRequest, data: &[u8]) -> Result<bool, String> {
    let mut guard = c.login.borrow_mut();
    let Some(st) = guard.as_mut() else { return Err("a Login Request in the full feature phase".into()) };
    let st = &mut **st;
    if std::mem::take(&mut st.first) && req.tsih != 0 {
        // A connection joins a session: it is served on the session's reactor.
        if let Some(reactor) = registry::session_reactor(req.tsih).filter(|&r| r != c.reactor) {
            *c.moving.borrow_mut() = Some(Move { reactor, req: *req, data: data.to_vec() });
            c.stop_taking();
            return Ok(false);
        }
    }
    let options = st.options.clone();
    let mut ctx = Ctx { c, node: &mut st.node, options: &options };
    let mut reply = st.login.on_request(&mut ctx, req, data);
    registry::login_phase(c.id, phase_of(st.login.stage()), req.cid);
    match &reply.outcome {
        Outcome::Continue => {
            send(c, &reply.response, &reply.data);
            Ok(true)
        }
        Outcome::Failed(status) => {
            // Unauthenticated peers can fail logins as fast as they connect: at most one
            // line a second, with a count of those dropped.
            ferrite_reactor::log_limited!(
                log::Level::Info,
                "iscsi connection {} from {}: login failed: {status} (status {:#06x})",
                c.id,
                c.peer,
                status.to_u16()
            );
            send(c, &reply.response, &reply.data);
            c.stop_taking();
            Ok(false)
        }
        Outcome::FullFeature(res) => {
            let res = res.clone();
            let node = st.node.take();
            let node_options = node.as_ref().map(|n| target_options(&options, n.header_digest, n.data_digest));
            drop(guard);
            let ffp_options = node_options.unwrap_or_else(|| target_options(&options, false, false));
            match super::session::start(c, &res, node, ffp_options) {
                Ok(_) => {
                    reply.response.exp_cmd_sn = c.seq.exp_cmd_sn();
                    reply.response.max_cmd_sn = c.seq.max_cmd_sn();
                    send(c, &reply.response, &reply.data);
                    // From the next PDU on, both ways: the negotiated digests and data limits.
                    c.tx.set(res.negotiated.connection.tx());
                    c.rx_params.set(Some(res.negotiated.connection.rx()));
                    *c.login.borrow_mut() = None;
                    Ok(true)
                }
                Err(status) => {
                    if res.leading {
                        registry::drop_session(res.tsih);
                    }
                    log::warn!("iscsi connection {} from {}: session not started: {status}", c.id, c.peer);
                    let r = &mut reply.response;
                    r.transit = false;
                    r.csg = 0;
                    r.nsg = 0;
                    r.tsih = req.tsih;
                    r.status_class = status.class;
                    r.status_detail = status.detail;
                    send(c, r, &[]);
                    c.stop_taking();
                    Ok(false)
                }
            }
        }
    }
}

/// Answers the first Login Request of a connection that moved here to join its session
/// (see [`on_request`]); it does not move again.
pub(crate) fn on_moved_request(c: &Rc<Conn>, req: &LoginRequest, data: &[u8]) -> Result<bool, String> {
    if let Some(st) = c.login.borrow_mut().as_mut() {
        st.first = false;
    }
    on_request(c, req, data)
}

/// Queues a Login Response (framed as during login: no digests).
fn send(c: &Conn, r: &ferrite_iscsi::pdu::LoginResponse, data: &[u8]) {
    let pdu = Pdu::LoginResponse(*r);
    c.queue(|q, _| q.single(&PduParams::LOGIN, &pdu, data));
}
