//! The login phase (RFC 7143 sections 6.3 and 11.12-11.13) as pure logic.
//!
//! [`TargetLogin`] is one connection's login at a target: each Login Request (header and
//! data) goes to [`TargetLogin::on_request`], which returns the Login Response to send and
//! what became of the login ([`Outcome`]): more requests to come, the full feature phase
//! (with the negotiated parameters), or a failure (send the response, then close). What
//! needs the target's tables (targets, sessions, CHAP secrets, randomness) it asks of a
//! [`LoginContext`] the caller implements.
//!
//! Checks and answers:
//!
//! - versions: Version-min above 0 fails with "unsupported version"; ISID, TSIH, CID and
//!   the versions must stay the same in every request of the login ("initiator error");
//! - flags: T with C, a reserved or full-feature CSG, a reserved NSG or one not after CSG, a
//!   CSG other than the stage the login is in: "initiator error";
//! - the first request must declare InitiatorName ("missing parameter"); SessionType
//!   defaults to Normal, an unknown one is "session type not supported" (so is discovery when
//!   the context refuses it); a normal session needs TargetName ("missing parameter"), which
//!   the context looks up: "not found", "target removed", "authorization failure", or a
//!   redirection (status class 1 with TargetAddress);
//! - a connection with a TSIH joins that session through the context ("session does not
//!   exist", "too many connections", ...); a leading connection gets its TSIH from the
//!   context at the transit to the full feature phase;
//! - the first response of a normal session declares TargetAlias (if any) and
//!   TargetPortalGroupTag;
//! - security stage: AuthMethod is answered from the target's policy (CHAP required,
//!   optional, or off); CHAP runs through [`crate::chap::ChapTarget`]; the target transits
//!   out of the security stage only once the initiator is authenticated; any failure is
//!   "authentication failure"; skipping the security stage is allowed only when CHAP is not
//!   required;
//! - operational keys are negotiated in either stage ([`crate::negotiate`]); before the
//!   transit to the full feature phase the target makes its own offers (answering T=0 until
//!   they are answered) and declares its MaxRecvDataSegmentLength;
//! - a request with C set (text continued) gets an empty response; every response fits the
//!   8192 bytes an initiator accepts during login (a longer one fails with "target error").
//!
//! A failed login's response has T, CSG and NSG clear (as SPDK sends it) and no data except
//! a redirection's TargetAddress.

mod initiator;
mod status;

pub use initiator::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginError, InitiatorLoginResult, InitiatorStep};
pub use status::LoginStatus;

use crate::chap::{ChapKeys, ChapProgress, ChapSecrets, ChapTarget, DEFAULT_CHALLENGE_LEN};
use crate::keys::{self, KeyValue, TextAssembler, TextWriter};
use crate::negotiate::target::Phase;
use crate::negotiate::{Negotiated, SessionType, TargetNegotiator, TargetOptions};
use crate::pdu::{
    encode_to_vec, Isid, LoginRequest, LoginResponse, Pdu, PduParams, Stage, DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
    ISCSI_VERSION,
};

/// Whether and how initiators authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// No authentication (AuthMethod=None only; SPDK's disable_chap).
    #[default]
    None,
    /// CHAP if the initiator offers it first, else none.
    Optional,
    /// CHAP required (SPDK's require_chap).
    Chap,
}

/// A target's (or the discovery service's) authentication policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuthPolicy {
    /// Whether CHAP is used.
    pub mode: AuthMode,
    /// Whether the initiator must also authenticate the target (SPDK's mutual_chap).
    pub mutual: bool,
}

/// A target as the login sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// The target's name.
    pub name: String,
    /// Its alias, declared to initiators.
    pub alias: Option<String>,
    /// Its authentication policy.
    pub auth: AuthPolicy,
    /// Settings for its sessions, if they differ from the login's (required digests, say).
    pub options: Option<TargetOptions>,
}

/// What a TargetName names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetLookup {
    /// A target this initiator may log in to.
    Found(TargetInfo),
    /// No such target.
    NotFound,
    /// The target is being removed.
    Removed,
    /// The target is elsewhere: `address` is a TargetAddress value ("host:port,tpgt").
    Moved {
        /// Where.
        address: String,
        /// Moved for good (else temporarily).
        permanent: bool,
    },
    /// This initiator may not use the target.
    NotAuthorized,
}

/// A connection's place in a session, as the context sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef<'a> {
    /// ISID.
    pub isid: Isid,
    /// TSIH (0 for a new session).
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// InitiatorName.
    pub initiator_name: &'a str,
    /// TargetName (normal sessions).
    pub target_name: Option<&'a str>,
    /// SessionType.
    pub session_type: SessionType,
}

/// What a login needs from the target's tables. Implemented by the connection engine; all
/// calls are synchronous and made from [`TargetLogin::on_request`].
pub trait LoginContext {
    /// Looks up `target_name` for a normal session from `initiator_name`.
    fn lookup_target(&mut self, target_name: &str, initiator_name: &str) -> TargetLookup;

    /// The authentication policy of discovery sessions, or `None` if they are refused.
    fn discovery_auth(&mut self, initiator_name: &str) -> Option<AuthPolicy>;

    /// What the target knows of CHAP name `name` (for `target`, or the discovery service).
    fn chap_secrets(&mut self, target: Option<&str>, name: &str) -> Option<ChapSecrets>;

    /// A connection with a TSIH asks to join that session: `Ok`, or the status to fail with
    /// ("session does not exist", "too many connections", "can't include in session").
    fn join_session(&mut self, session: &SessionRef<'_>) -> Result<(), LoginStatus>;

    /// A leading connection reaches the full feature phase: the new session's TSIH (not 0),
    /// or the status to fail with ("out of resources"). An existing session with the same
    /// initiator, ISID and target is the context's to end (session reinstatement).
    fn create_session(&mut self, session: &SessionRef<'_>, negotiated: &Negotiated) -> Result<u16, LoginStatus>;

    /// Fills `buf` with random bytes (CHAP identifiers and challenges).
    fn random(&mut self, buf: &mut [u8]);
}

/// The login's fixed settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLoginConfig {
    /// Default settings of sessions (a target's own [`TargetInfo::options`] win).
    pub options: TargetOptions,
    /// The portal group the connection arrived on (TargetPortalGroupTag).
    pub portal_group_tag: u16,
    /// CHAP challenge length in bytes (1..=1024).
    pub challenge_len: usize,
    /// StatSN of the first Login Response.
    pub initial_stat_sn: u32,
    /// Commands the session may have outstanding: MaxCmdSN = ExpCmdSN + window - 1.
    pub cmd_window: u32,
}

impl Default for TargetLoginConfig {
    fn default() -> TargetLoginConfig {
        TargetLoginConfig {
            options: TargetOptions::default(),
            portal_group_tag: 1,
            challenge_len: DEFAULT_CHALLENGE_LEN,
            initial_stat_sn: 0,
            cmd_window: 64,
        }
    }
}

/// A successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResult {
    /// The negotiated parameters.
    pub negotiated: Negotiated,
    /// The session's TSIH.
    pub tsih: u16,
    /// The ISID.
    pub isid: Isid,
    /// The connection's CID.
    pub cid: u16,
    /// Whether this connection started the session.
    pub leading: bool,
    /// The target (normal sessions).
    pub target: Option<TargetInfo>,
    /// The CHAP name the initiator authenticated with, if it did.
    pub chap_name: Option<String>,
    /// The StatSN the connection sends next.
    pub next_stat_sn: u32,
    /// The CmdSN the session expects next (the login's, as login requests are immediate).
    pub exp_cmd_sn: u32,
}

/// What a Login Request led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The login goes on: more requests are expected.
    Continue,
    /// This response ends the login: the connection is in the full feature phase once it
    /// is sent (switch the decoder to [`crate::negotiate::ConnectionParams::rx`]).
    FullFeature(Box<LoginResult>),
    /// The login failed: send the response, then close the connection.
    Failed(LoginStatus),
}

/// The response to one Login Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginReply {
    /// The Login Response header.
    pub response: LoginResponse,
    /// Its text.
    pub data: Vec<u8>,
    /// What became of the login.
    pub outcome: Outcome,
}

impl LoginReply {
    /// The whole response PDU (no digests during login).
    pub fn encode(&self) -> Vec<u8> {
        encode_to_vec(&PduParams::LOGIN, &Pdu::LoginResponse(self.response), &[], &self.data)
            .expect("login responses fit the login's data limit")
    }
}

#[derive(Debug, Clone)]
enum Auth {
    /// No AuthMethod yet.
    Unstarted,
    /// CHAP under way.
    Chap(ChapTarget),
    /// Authenticated (with a CHAP name, or none).
    Done(Option<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ids {
    isid: Isid,
    tsih: u16,
    cid: u16,
    version_max: u8,
    version_min: u8,
}

#[derive(Debug, Clone)]
struct Identity {
    initiator_name: String,
    session_type: SessionType,
    target: Option<TargetInfo>,
    policy: AuthPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InProgress,
    Done,
    Failed,
}

/// One connection's login at a target; see the module documentation.
#[derive(Debug, Clone)]
pub struct TargetLogin {
    cfg: TargetLoginConfig,
    state: State,
    stage: Stage,
    ids: Option<Ids>,
    text: TextAssembler,
    identity: Option<Identity>,
    negotiator: Option<TargetNegotiator>,
    auth: Auth,
    stat_sn: u32,
}

/// What one request's processing decided (before the response is built).
struct Step {
    transit: Option<Stage>,
    done: Option<Box<LoginResult>>,
}

impl TargetLogin {
    /// A login on a new connection.
    pub fn new(cfg: TargetLoginConfig) -> TargetLogin {
        debug_assert!((1..=crate::chap::MAX_CHALLENGE_LEN).contains(&cfg.challenge_len));
        debug_assert!(cfg.cmd_window >= 1);
        TargetLogin {
            cfg,
            state: State::InProgress,
            stage: Stage::Security,
            ids: None,
            text: TextAssembler::new(),
            identity: None,
            negotiator: None,
            auth: Auth::Unstarted,
            stat_sn: cfg.initial_stat_sn,
        }
    }

    /// Whether the login ended (either way).
    pub fn is_finished(&self) -> bool {
        self.state != State::InProgress
    }

    /// The stage the login is in.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Answers one Login Request (`data` is its whole data segment).
    pub fn on_request(&mut self, ctx: &mut dyn LoginContext, req: &LoginRequest, data: &[u8]) -> LoginReply {
        let mut out = TextWriter::new();
        let result = self.step(ctx, req, data, &mut out);
        let mut response = LoginResponse {
            transit: false,
            continue_: false,
            csg: req.csg & 3,
            nsg: 0,
            version_max: ISCSI_VERSION,
            version_active: ISCSI_VERSION,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(self.cfg.cmd_window.saturating_sub(1)),
            status_class: 0,
            status_detail: 0,
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let result = result.and_then(|step| {
            if out.len() > DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH as usize {
                Err(LoginStatus::TARGET_ERROR)
            } else {
                Ok(step)
            }
        });
        match result {
            Ok(step) => {
                if let Some(nsg) = step.transit {
                    response.transit = true;
                    response.nsg = nsg.bits();
                }
                let outcome = match step.done {
                    Some(mut done) => {
                        response.tsih = done.tsih;
                        done.next_stat_sn = self.stat_sn;
                        self.state = State::Done;
                        Outcome::FullFeature(done)
                    }
                    None => Outcome::Continue,
                };
                LoginReply { response, data: out.into_bytes(), outcome }
            }
            Err(status) => {
                self.state = State::Failed;
                response.csg = 0;
                response.status_class = status.class;
                response.status_detail = status.detail;
                response.max_cmd_sn = req.cmd_sn;
                let data = if status.is_redirect() { out.into_bytes() } else { Vec::new() };
                LoginReply { response, data, outcome: Outcome::Failed(status) }
            }
        }
    }

    fn step(
        &mut self,
        ctx: &mut dyn LoginContext,
        req: &LoginRequest,
        data: &[u8],
        out: &mut TextWriter,
    ) -> Result<Step, LoginStatus> {
        if self.state != State::InProgress {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let ids = Ids {
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
            version_max: req.version_max,
            version_min: req.version_min,
        };
        let first = self.ids.is_none();
        match self.ids {
            None => {
                if req.version_min > ISCSI_VERSION {
                    return Err(LoginStatus::UNSUPPORTED_VERSION);
                }
                self.ids = Some(ids);
            }
            Some(prev) if prev != ids => return Err(LoginStatus::INITIATOR_ERROR),
            Some(_) => {}
        }
        if req.transit && req.continue_ {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let csg = match Stage::from_bits(req.csg) {
            Some(s @ (Stage::Security | Stage::Operational)) => s,
            _ => return Err(LoginStatus::INITIATOR_ERROR),
        };
        if first {
            self.stage = csg;
        } else if csg != self.stage {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let nsg = if req.transit {
            match Stage::from_bits(req.nsg) {
                Some(n) if n > csg => Some(n),
                _ => return Err(LoginStatus::INITIATOR_ERROR),
            }
        } else {
            None
        };
        let pairs = match self.text.push(data, req.continue_) {
            Ok(None) => return Ok(Step { transit: None, done: None }),
            Ok(Some(p)) => p,
            Err(_) => return Err(LoginStatus::INITIATOR_ERROR),
        };
        if self.identity.is_none() {
            self.identify(ctx, req, &pairs, out)?;
        }
        let negotiator = self.negotiator.as_mut().expect("identify creates the negotiator");
        let special = negotiator.respond(Phase::Login(csg), &pairs, out).map_err(|_| LoginStatus::INITIATOR_ERROR)?;
        if negotiator.session_type() != self.identity.as_ref().expect("identified above").session_type {
            // SessionType belongs in the first request; a later one may not change it.
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let policy = self.identity.as_ref().expect("identified above").policy;
        match csg {
            Stage::Security => self.security(ctx, &special.security, out)?,
            _ => {
                if !matches!(self.auth, Auth::Done(_)) {
                    if matches!(self.auth, Auth::Unstarted) && policy.mode != AuthMode::Chap {
                        self.auth = Auth::Done(None);
                    } else {
                        return Err(LoginStatus::AUTHENTICATION_FAILURE);
                    }
                }
            }
        }
        let Some(nsg) = nsg else {
            return Ok(Step { transit: None, done: None });
        };
        if csg == Stage::Security {
            match self.auth {
                Auth::Done(_) => {}
                Auth::Unstarted if policy.mode != AuthMode::Chap => self.auth = Auth::Done(None),
                Auth::Unstarted => return Err(LoginStatus::AUTHENTICATION_FAILURE),
                // CHAP under way: stay in the security stage.
                Auth::Chap(_) => return Ok(Step { transit: None, done: None }),
            }
        }
        if nsg == Stage::Operational {
            self.stage = Stage::Operational;
            return Ok(Step { transit: Some(nsg), done: None });
        }
        let negotiator = self.negotiator.as_mut().expect("created");
        if negotiator.offer(out) {
            // The target's offers need answers before the full feature phase.
            return Ok(Step { transit: None, done: None });
        }
        negotiator.declare_max_recv(out);
        let mut negotiated = negotiator.finish().map_err(|_| LoginStatus::INITIATOR_ERROR)?;
        let identity = self.identity.as_ref().expect("identified above");
        if let Some(t) = &identity.target {
            negotiated.session.target_alias = t.alias.clone();
        }
        negotiated.session.target_portal_group_tag = Some(self.cfg.portal_group_tag);
        let sref = SessionRef {
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
            initiator_name: &identity.initiator_name,
            target_name: identity.target.as_ref().map(|t| t.name.as_str()),
            session_type: identity.session_type,
        };
        let leading = req.tsih == 0;
        let tsih = if leading { ctx.create_session(&sref, &negotiated)? } else { req.tsih };
        debug_assert!(tsih != 0, "a session's TSIH is never 0");
        let chap_name = match &self.auth {
            Auth::Done(name) => name.clone(),
            _ => None,
        };
        self.stage = Stage::FullFeature;
        Ok(Step {
            transit: Some(nsg),
            done: Some(Box::new(LoginResult {
                negotiated,
                tsih,
                isid: req.isid,
                cid: req.cid,
                leading,
                target: identity.target.clone(),
                chap_name,
                next_stat_sn: 0,
                exp_cmd_sn: req.cmd_sn,
            })),
        })
    }

    /// The first request: who logs in, to what, in which session.
    fn identify(
        &mut self,
        ctx: &mut dyn LoginContext,
        req: &LoginRequest,
        pairs: &[KeyValue],
        out: &mut TextWriter,
    ) -> Result<(), LoginStatus> {
        let get = |k: &str| pairs.iter().find(|kv| kv.key == k).map(|kv| kv.value.as_str());
        let initiator_name = get("InitiatorName").filter(|n| !n.is_empty()).ok_or(LoginStatus::MISSING_PARAMETER)?;
        if !plausible_name(initiator_name) {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let session_type = match get("SessionType") {
            None => SessionType::Normal,
            Some(v) => SessionType::parse(v).ok_or(LoginStatus::SESSION_TYPE_NOT_SUPPORTED)?,
        };
        let (target, policy) = match session_type {
            SessionType::Normal => {
                let name = get("TargetName").filter(|n| !n.is_empty()).ok_or(LoginStatus::MISSING_PARAMETER)?;
                if !plausible_name(name) {
                    // No target has such a name (and it is not for the logs).
                    return Err(LoginStatus::NOT_FOUND);
                }
                match ctx.lookup_target(name, initiator_name) {
                    TargetLookup::Found(t) => {
                        let policy = t.auth;
                        (Some(t), policy)
                    }
                    TargetLookup::NotFound => return Err(LoginStatus::NOT_FOUND),
                    TargetLookup::Removed => return Err(LoginStatus::TARGET_REMOVED),
                    TargetLookup::NotAuthorized => return Err(LoginStatus::AUTHORIZATION_FAILURE),
                    TargetLookup::Moved { address, permanent } => {
                        out.push("TargetAddress", &address);
                        return Err(if permanent {
                            LoginStatus::TARGET_MOVED_PERMANENTLY
                        } else {
                            LoginStatus::TARGET_MOVED_TEMPORARILY
                        });
                    }
                }
            }
            SessionType::Discovery => {
                (None, ctx.discovery_auth(initiator_name).ok_or(LoginStatus::SESSION_TYPE_NOT_SUPPORTED)?)
            }
        };
        if req.tsih != 0 {
            let sref = SessionRef {
                isid: req.isid,
                tsih: req.tsih,
                cid: req.cid,
                initiator_name,
                target_name: target.as_ref().map(|t| t.name.as_str()),
                session_type,
            };
            ctx.join_session(&sref)?;
        }
        if let Some(t) = &target {
            if let Some(alias) = t.alias.as_deref().filter(|a| !a.is_empty()) {
                out.push("TargetAlias", alias);
            }
            out.push_num("TargetPortalGroupTag", self.cfg.portal_group_tag.into());
        }
        let options = target.as_ref().and_then(|t| t.options).unwrap_or(self.cfg.options);
        self.negotiator = Some(TargetNegotiator::new(options, req.tsih == 0));
        self.identity = Some(Identity { initiator_name: initiator_name.to_string(), session_type, target, policy });
        Ok(())
    }

    /// The security stage's keys: AuthMethod, then CHAP.
    fn security(
        &mut self,
        ctx: &mut dyn LoginContext,
        keys_in: &[KeyValue],
        out: &mut TextWriter,
    ) -> Result<(), LoginStatus> {
        let identity = self.identity.as_ref().expect("identified before");
        let policy = identity.policy;
        let target_name = identity.target.as_ref().map(|t| t.name.clone());
        if let Some(am) = keys_in.iter().find(|kv| kv.key == "AuthMethod") {
            if !matches!(self.auth, Auth::Unstarted) {
                return Err(LoginStatus::INITIATOR_ERROR);
            }
            let accepted: &[&str] = match policy.mode {
                AuthMode::None => &["None"],
                AuthMode::Optional => &["CHAP", "None"],
                AuthMode::Chap => &["CHAP"],
            };
            let Some(chosen) = keys::list_values(&am.value).find(|v| accepted.contains(v)) else {
                out.push("AuthMethod", keys::REJECT);
                return Err(LoginStatus::AUTHENTICATION_FAILURE);
            };
            out.push("AuthMethod", chosen);
            self.auth = if chosen == "CHAP" {
                Auth::Chap(ChapTarget::new(self.cfg.challenge_len, policy.mutual))
            } else {
                Auth::Done(None)
            };
        }
        let chap = ChapKeys::collect(keys_in);
        if chap.is_empty() {
            return Ok(());
        }
        let Auth::Chap(exchange) = &mut self.auth else {
            return Err(LoginStatus::AUTHENTICATION_FAILURE);
        };
        // The exchange asks for the name's secrets and for random bytes; both come from the
        // context, fetched beforehand so that the exchange borrows nothing else.
        let known = chap.n.as_deref().and_then(|n| ctx.chap_secrets(target_name.as_deref(), n));
        let mut pool = vec![0u8; if chap.a.is_some() { 1 + self.cfg.challenge_len } else { 0 }];
        ctx.random(&mut pool);
        let mut at = 0;
        let mut random = |buf: &mut [u8]| {
            let take = buf.len().min(pool.len() - at);
            buf[..take].copy_from_slice(&pool[at..at + take]);
            at += take;
        };
        let mut lookup = |_: &str| known.clone();
        match exchange.step(&chap, &mut lookup, &mut random, out) {
            Ok(ChapProgress::Continue) => Ok(()),
            Ok(ChapProgress::Authenticated { name }) => {
                self.auth = Auth::Done(Some(name));
                Ok(())
            }
            Err(_) => Err(LoginStatus::AUTHENTICATION_FAILURE),
        }
    }
}

/// Most bytes of an iSCSI name (RFC 7143 section 4.2.7.1).
pub const MAX_NAME_LEN: usize = 223;

/// Whether `name` can be an iSCSI name at all: at most [`MAX_NAME_LEN`] bytes, no whitespace
/// and no control characters (RFC 7143 section 4.2.7.2 allows neither). A login naming an
/// initiator otherwise fails before the name reaches a table or a log line (where a newline
/// or an escape sequence would forge or garble lines).
pub fn plausible_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN && !name.chars().any(|c| c.is_control() || c.is_whitespace())
}

#[cfg(test)]
mod tests;
