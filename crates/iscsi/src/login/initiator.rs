//! The initiator's side of the login (for an initiator bdev, and to test the target's): the
//! requests to send and what the target's responses mean.
//!
//! With CHAP credentials the login starts in the security stage with
//! `AuthMethod=CHAP,None` (T=1 towards the operational stage), sends `CHAP_A=5` when the
//! target picks CHAP, answers the challenge (with its own for mutual CHAP, whose answer it
//! checks when the target transits); without credentials it starts in the operational
//! stage. The operational stage offers the keys of [`InitiatorNegotiator`] and answers the
//! target's offers until the target transits to the full feature phase.

use std::fmt;

use super::LoginStatus;
use crate::chap::{ChapError, ChapInitiator, ChapKeys, Credentials, RandomFn, DEFAULT_CHALLENGE_LEN};
use crate::keys::{self, TextAssembler, TextError, TextWriter};
use crate::negotiate::{InitiatorNegotiator, InitiatorOptions, Negotiated, NegotiationError, SessionType};
use crate::pdu::{Isid, LoginRequest, LoginResponse, Stage, ISCSI_VERSION};

/// What the initiator logs in with.
#[derive(Debug, Clone)]
pub struct InitiatorLoginConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias, if any.
    pub initiator_alias: Option<String>,
    /// TargetName (normal sessions).
    pub target_name: Option<String>,
    /// SessionType.
    pub session_type: SessionType,
    /// ISID.
    pub isid: Isid,
    /// TSIH: 0 for a new session.
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// ITT of the login requests.
    pub itt: u32,
    /// CmdSN (login requests are immediate: it does not advance).
    pub cmd_sn: u32,
    /// Operational settings.
    pub options: InitiatorOptions,
    /// CHAP name and secret, to authenticate.
    pub chap: Option<Credentials>,
    /// The target's expected CHAP name and secret, for mutual CHAP.
    pub mutual: Option<Credentials>,
}

impl InitiatorLoginConfig {
    /// A configuration with defaults around the names.
    pub fn new(initiator_name: &str, target_name: Option<&str>) -> InitiatorLoginConfig {
        InitiatorLoginConfig {
            initiator_name: initiator_name.to_string(),
            initiator_alias: None,
            target_name: target_name.map(str::to_string),
            session_type: if target_name.is_some() { SessionType::Normal } else { SessionType::Discovery },
            isid: Isid([0x80, 0, 0, 1, 0, 0]),
            tsih: 0,
            cid: 0,
            itt: 0,
            cmd_sn: 1,
            options: InitiatorOptions::default(),
            chap: None,
            mutual: None,
        }
    }
}

/// What to do after a Login Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorStep {
    /// Send this Login Request.
    Send {
        /// The header.
        request: LoginRequest,
        /// Its text.
        data: Vec<u8>,
    },
    /// The login is done: the connection is in the full feature phase.
    Done(Box<InitiatorLoginResult>),
}

/// A finished login, seen from the initiator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorLoginResult {
    /// The negotiated parameters.
    pub negotiated: Negotiated,
    /// The session's TSIH.
    pub tsih: u16,
    /// The StatSN the initiator expects next.
    pub exp_stat_sn: u32,
    /// ExpCmdSN of the final response.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN of the final response.
    pub max_cmd_sn: u32,
}

/// Why an initiator's login failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorLoginError {
    /// The target refused the login with this status.
    Status(LoginStatus),
    /// The target redirects the initiator to a TargetAddress.
    Redirect {
        /// The status (temporarily or permanently moved).
        status: LoginStatus,
        /// The TargetAddress value.
        address: Option<String>,
    },
    /// The response breaks the protocol.
    Protocol(&'static str),
    /// The negotiation failed.
    Negotiation(NegotiationError),
    /// CHAP failed (the target's name or answer is wrong).
    Chap(ChapError),
    /// The response's text is malformed.
    Text(TextError),
}

impl fmt::Display for InitiatorLoginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitiatorLoginError::Status(s) => write!(f, "login refused: {s}"),
            InitiatorLoginError::Redirect { status, address } => {
                write!(f, "login redirected ({status}) to {address:?}")
            }
            InitiatorLoginError::Protocol(what) => write!(f, "login response: {what}"),
            InitiatorLoginError::Negotiation(e) => write!(f, "negotiation: {e}"),
            InitiatorLoginError::Chap(e) => write!(f, "CHAP: {e}"),
            InitiatorLoginError::Text(e) => write!(f, "login text: {e}"),
        }
    }
}

impl std::error::Error for InitiatorLoginError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sec {
    /// AuthMethod offered.
    Offered,
    /// CHAP_A sent.
    Algorithm,
    /// CHAP_N and CHAP_R sent.
    Responded,
}

/// One connection's login from the initiator's side.
#[derive(Debug, Clone)]
pub struct InitiatorLogin {
    cfg: InitiatorLoginConfig,
    stage: Stage,
    sec: Sec,
    negotiator: InitiatorNegotiator,
    chap: Option<ChapInitiator>,
    offered: bool,
    exp_stat_sn: u32,
    text: TextAssembler,
}

impl InitiatorLogin {
    /// A login with `cfg`.
    pub fn new(cfg: InitiatorLoginConfig) -> InitiatorLogin {
        let negotiator = InitiatorNegotiator::for_connection(cfg.options, cfg.session_type, cfg.tsih == 0);
        let chap = cfg.chap.clone().map(|c| ChapInitiator::new(c, cfg.mutual.clone()));
        InitiatorLogin {
            stage: if chap.is_some() { Stage::Security } else { Stage::Operational },
            sec: Sec::Offered,
            negotiator,
            chap,
            offered: false,
            exp_stat_sn: 0,
            text: TextAssembler::new(),
            cfg,
        }
    }

    fn request(&self, transit: Option<Stage>, data: TextWriter) -> InitiatorStep {
        InitiatorStep::Send {
            request: LoginRequest {
                transit: transit.is_some(),
                continue_: false,
                csg: self.stage.bits(),
                nsg: transit.map_or(0, Stage::bits),
                version_max: ISCSI_VERSION,
                version_min: ISCSI_VERSION,
                isid: self.cfg.isid,
                tsih: self.cfg.tsih,
                itt: self.cfg.itt,
                cid: self.cfg.cid,
                cmd_sn: self.cfg.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            },
            data: data.into_bytes(),
        }
    }

    fn operational(&mut self, out: &mut TextWriter) {
        if !self.offered {
            self.offered = true;
            self.negotiator.offer(out);
        }
    }

    /// The first Login Request.
    pub fn start(&mut self) -> InitiatorStep {
        let mut out = TextWriter::new();
        out.push("InitiatorName", &self.cfg.initiator_name);
        if let Some(a) = &self.cfg.initiator_alias {
            out.push("InitiatorAlias", a);
        }
        if let Some(t) = &self.cfg.target_name {
            out.push("TargetName", t);
        }
        out.push("SessionType", self.cfg.session_type.as_str());
        if self.chap.is_some() {
            out.push("AuthMethod", "CHAP,None");
            self.request(Some(Stage::Operational), out)
        } else {
            self.operational(&mut out);
            self.request(Some(Stage::FullFeature), out)
        }
    }

    /// Takes a Login Response: the next request, or the end of the login.
    pub fn on_response(
        &mut self,
        resp: &LoginResponse,
        data: &[u8],
        random: RandomFn<'_>,
    ) -> Result<InitiatorStep, InitiatorLoginError> {
        if resp.itt != self.cfg.itt || resp.isid != self.cfg.isid {
            return Err(InitiatorLoginError::Protocol("ITT or ISID differs from the request's"));
        }
        let status = LoginStatus { class: resp.status_class, detail: resp.status_detail };
        if status.is_redirect() {
            let pairs = keys::parse_text(data).unwrap_or_default();
            let address = pairs.into_iter().find(|kv| kv.key == "TargetAddress").map(|kv| kv.value);
            return Err(InitiatorLoginError::Redirect { status, address });
        }
        if !status.is_success() {
            return Err(InitiatorLoginError::Status(status));
        }
        self.exp_stat_sn = resp.stat_sn.wrapping_add(1);
        if Stage::from_bits(resp.csg) != Some(self.stage) {
            return Err(InitiatorLoginError::Protocol("CSG differs from the request's"));
        }
        let Some(pairs) = self.text.push(data, resp.continue_).map_err(InitiatorLoginError::Text)? else {
            // The target's text continues: ask for the rest with an empty request.
            return Ok(self.request(None, TextWriter::new()));
        };
        let mut out = TextWriter::new();
        let security = self.negotiator.apply(&pairs, &mut out).map_err(InitiatorLoginError::Negotiation)?;
        let nsg = if resp.transit {
            match Stage::from_bits(resp.nsg) {
                Some(n) if n > self.stage => Some(n),
                _ => return Err(InitiatorLoginError::Protocol("NSG not after CSG")),
            }
        } else {
            None
        };
        if self.stage == Stage::Security {
            let keys = ChapKeys::collect(&security);
            let method = security.iter().find(|kv| kv.key == "AuthMethod").map(|kv| kv.value.as_str());
            match method {
                Some("CHAP") if self.sec == Sec::Offered => {
                    let chap = self.chap.as_ref().ok_or(InitiatorLoginError::Protocol("CHAP without credentials"))?;
                    chap.offer_algorithm(&mut out);
                    self.sec = Sec::Algorithm;
                    return Ok(self.request(None, out));
                }
                Some("None") if self.sec == Sec::Offered && self.cfg.mutual.is_some() => {
                    return Err(InitiatorLoginError::Chap(ChapError::Mutual));
                }
                Some("None") if self.sec == Sec::Offered => {}
                Some(_) => return Err(InitiatorLoginError::Protocol("unexpected AuthMethod")),
                None => {}
            }
            if keys.c.is_some() && self.sec == Sec::Algorithm {
                let chap = self.chap.as_mut().ok_or(InitiatorLoginError::Protocol("CHAP without credentials"))?;
                chap.respond(&keys, DEFAULT_CHALLENGE_LEN, random, &mut out).map_err(InitiatorLoginError::Chap)?;
                self.sec = Sec::Responded;
                return Ok(self.request(Some(Stage::Operational), out));
            }
            if let Some(n) = nsg {
                if self.sec == Sec::Responded {
                    let chap = self.chap.as_ref().expect("responded with CHAP");
                    chap.verify_target(&keys).map_err(InitiatorLoginError::Chap)?;
                }
                self.stage = n;
            } else {
                return Ok(self.request(Some(Stage::Operational), out));
            }
        } else if let Some(n) = nsg {
            self.stage = n;
        }
        if self.stage == Stage::FullFeature {
            let negotiated = self.negotiator.finish().map_err(InitiatorLoginError::Negotiation)?;
            if resp.tsih == 0 {
                return Err(InitiatorLoginError::Protocol("final response without a TSIH"));
            }
            return Ok(InitiatorStep::Done(Box::new(InitiatorLoginResult {
                negotiated,
                tsih: resp.tsih,
                exp_stat_sn: self.exp_stat_sn,
                exp_cmd_sn: resp.exp_cmd_sn,
                max_cmd_sn: resp.max_cmd_sn,
            })));
        }
        self.operational(&mut out);
        Ok(self.request(Some(Stage::FullFeature), out))
    }
}
