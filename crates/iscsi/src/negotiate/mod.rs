//! Login and text key negotiation (RFC 7143 sections 6 and 13).
//!
//! - [`table`]: every key of RFC 7143 section 13 (and the security keys of section 12) with
//!   its kind (list, numerical with a Min or Max result function, boolean with AND or OR,
//!   declarative), when it may be used (leading connection only, login only, any time, full
//!   feature phase only), who sends it, its default, and when it is irrelevant;
//! - [`target`]: the target's side ([`TargetNegotiator`]): answers an initiator's keys, offers
//!   what the target needs that the defaults do not give, and yields the session's and the
//!   connection's parameters ([`Negotiated`]);
//! - [`initiator`]: the initiator's side ([`InitiatorNegotiator`]): offers keys, checks the
//!   target's answers, answers the target's offers.
//!
//! Rules applied (the RFC's, and where it leaves a choice, SPDK's):
//!
//! - an unknown key (including private `X-` and `X#` keys) is answered `NotUnderstood`; a key
//!   that does not apply is answered `Irrelevant`: the keys of section 13 marked "irrelevant
//!   when SessionType=Discovery" in a discovery session, a leading-only key on a connection
//!   that joins a session, FirstBurstLength when InitialR2T=Yes and ImmediateData=No;
//! - a value out of range, malformed, over 255 bytes, or not in the acceptor's list is
//!   answered `Reject` and the key keeps its value; so is a key the initiator may not send
//!   (TargetAlias, TargetAddress, TargetPortalGroupTag), a login-only key in the full feature
//!   phase, and the obsolete IFMarkInt and OFMarkInt (IFMarker and OFMarker are answered No);
//! - numerical keys take the minimum or maximum of offer and acceptor's value, booleans the
//!   AND or OR, lists the first offered value the acceptor supports; declarative keys are
//!   not answered (the target declares its own MaxRecvDataSegmentLength once);
//! - FirstBurstLength is answered last and never above MaxBurstLength;
//! - offering a negotiated key twice in a login (or an exchange) is an error: the login fails
//!   with an initiator error. Declarations may repeat with the same value (libiscsi repeats
//!   InitiatorName, TargetName and SessionType when the target skips authentication).

pub mod initiator;
pub mod table;
pub mod target;

use std::fmt;

pub use initiator::{InitiatorNegotiator, InitiatorOptions};
pub use table::{lookup, BoolFunc, KeyDef, Kind, NumFunc, Sender, Usage};
pub use target::{Special, TargetNegotiator, TargetOptions};

use crate::keys::{self, MAX_SIMPLE_VALUE_LEN};
use crate::pdu::{PduParams, DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH};

/// A negotiated value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Val {
    /// A number.
    Num(u64),
    /// Yes (true) or No.
    Bool(bool),
    /// One of the key's known list values.
    Str(&'static str),
}

impl Val {
    /// The value as text.
    pub fn to_text(self) -> String {
        match self {
            Val::Num(n) => n.to_string(),
            Val::Bool(b) => keys::bool_str(b).to_string(),
            Val::Str(s) => s.to_string(),
        }
    }
}

/// Which digests an end accepts, and which it prefers when it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DigestPolicy {
    /// Only None.
    Off,
    /// CRC32C or None; offers None first.
    #[default]
    Allowed,
    /// CRC32C or None; offers CRC32C first.
    Preferred,
    /// Only CRC32C.
    Required,
}

impl DigestPolicy {
    /// The values accepted, in the order offered.
    pub fn values(self) -> &'static [&'static str] {
        match self {
            DigestPolicy::Off => &["None"],
            DigestPolicy::Allowed => &["None", "CRC32C"],
            DigestPolicy::Preferred => &["CRC32C", "None"],
            DigestPolicy::Required => &["CRC32C"],
        }
    }
}

/// SessionType.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionType {
    /// A normal session: SCSI commands to one target.
    #[default]
    Normal,
    /// A discovery session: SendTargets only.
    Discovery,
}

impl SessionType {
    /// The type for a SessionType value.
    pub fn parse(v: &str) -> Option<SessionType> {
        match v {
            "Normal" => Some(SessionType::Normal),
            "Discovery" => Some(SessionType::Discovery),
            _ => None,
        }
    }

    /// The SessionType value.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Normal => "Normal",
            SessionType::Discovery => "Discovery",
        }
    }
}

/// TaskReporting (RFC 7143 section 13.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TaskReporting {
    /// RFC3720 semantics (the default).
    #[default]
    Rfc3720,
    /// ResponseFence.
    ResponseFence,
    /// FastAbort.
    FastAbort,
}

impl TaskReporting {
    fn from_str(v: &str) -> TaskReporting {
        match v {
            "ResponseFence" => TaskReporting::ResponseFence,
            "FastAbort" => TaskReporting::FastAbort,
            _ => TaskReporting::Rfc3720,
        }
    }
}

/// The session-wide parameters a login settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// SessionType.
    pub session_type: SessionType,
    /// MaxConnections.
    pub max_connections: u16,
    /// InitialR2T: unsolicited Data-Out is not allowed (only immediate data, if any).
    pub initial_r2t: bool,
    /// ImmediateData: data may follow a SCSI Command in its PDU.
    pub immediate_data: bool,
    /// MaxBurstLength: most data in one solicited sequence (one R2T).
    pub max_burst_length: u32,
    /// FirstBurstLength: most unsolicited data (immediate and unsolicited Data-Out) per
    /// command.
    pub first_burst_length: u32,
    /// DefaultTime2Wait (seconds).
    pub default_time2wait: u16,
    /// DefaultTime2Retain (seconds).
    pub default_time2retain: u16,
    /// MaxOutstandingR2T per command.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel.
    pub error_recovery_level: u8,
    /// TaskReporting.
    pub task_reporting: TaskReporting,
    /// iSCSIProtocolLevel.
    pub protocol_level: u8,
    /// InitiatorName (declared by the initiator).
    pub initiator_name: Option<String>,
    /// InitiatorAlias.
    pub initiator_alias: Option<String>,
    /// TargetName (the initiator's, for a normal session).
    pub target_name: Option<String>,
    /// TargetAlias (declared by the target).
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag (declared by the target).
    pub target_portal_group_tag: Option<u16>,
}

impl Default for SessionParams {
    fn default() -> SessionParams {
        SessionParams {
            session_type: SessionType::Normal,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: TaskReporting::Rfc3720,
            protocol_level: 1,
            initiator_name: None,
            initiator_alias: None,
            target_name: None,
            target_alias: None,
            target_portal_group_tag: None,
        }
    }
}

/// The per-connection parameters a login settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionParams {
    /// HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// DataDigest=CRC32C.
    pub data_digest: bool,
    /// The MaxRecvDataSegmentLength this end declared: the most data it accepts per PDU.
    pub max_recv_data_segment_length: u32,
    /// The MaxRecvDataSegmentLength the peer declared (8192 if it did not): the most data
    /// this end may send per PDU.
    pub max_send_data_segment_length: u32,
}

impl Default for ConnectionParams {
    fn default() -> ConnectionParams {
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            max_send_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
        }
    }
}

impl ConnectionParams {
    /// The decoder's parameters for the full feature phase.
    pub fn rx(&self) -> PduParams {
        PduParams {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            max_data_segment: self.max_recv_data_segment_length,
        }
    }

    /// The encoder's parameters for the full feature phase.
    pub fn tx(&self) -> PduParams {
        PduParams {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            max_data_segment: self.max_send_data_segment_length,
        }
    }
}

/// Everything a login settles.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Negotiated {
    /// Session-wide parameters (on a connection that joins a session, only the declarations
    /// are this connection's; the rest is the leading connection's).
    pub session: SessionParams,
    /// This connection's parameters.
    pub connection: ConnectionParams,
}

/// A negotiation that cannot go on: the login fails with an initiator error (0x0200), and a
/// text exchange in the full feature phase is answered with a Reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegotiationError {
    /// A key offered twice in one PDU, or a negotiated key offered again.
    Duplicate(String),
    /// A declaration repeated with another value.
    Redeclared(String),
    /// A security key outside the security stage.
    SecurityKeyOutOfStage(String),
    /// An answer that is not a possible outcome of the offer (above a Min offer, a value
    /// not offered...).
    BadAnswer(String),
    /// A key's outcome this end cannot work with (a digest it requires not agreed to, say).
    Unacceptable(String),
    /// Offers still unanswered when the login ends.
    Unanswered(String),
    /// FirstBurstLength ended above MaxBurstLength.
    FirstBurstOverMaxBurst {
        /// FirstBurstLength.
        first: u32,
        /// MaxBurstLength.
        max: u32,
    },
    /// The text itself is malformed.
    Text(keys::TextError),
}

impl fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NegotiationError::Duplicate(k) => write!(f, "key {k} negotiated twice"),
            NegotiationError::Redeclared(k) => write!(f, "key {k} declared twice with different values"),
            NegotiationError::SecurityKeyOutOfStage(k) => write!(f, "security key {k} outside the security stage"),
            NegotiationError::BadAnswer(k) => write!(f, "answer for {k} is not a possible outcome"),
            NegotiationError::Unacceptable(k) => write!(f, "outcome of {k} is not acceptable"),
            NegotiationError::Unanswered(k) => write!(f, "offer of {k} unanswered"),
            NegotiationError::FirstBurstOverMaxBurst { first, max } => {
                write!(f, "FirstBurstLength {first} above MaxBurstLength {max}")
            }
            NegotiationError::Text(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for NegotiationError {}

impl From<keys::TextError> for NegotiationError {
    fn from(e: keys::TextError) -> NegotiationError {
        NegotiationError::Text(e)
    }
}

/// Where the negotiation stands for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum KeyState {
    /// Not negotiated yet.
    #[default]
    Fresh,
    /// This end offered it and waits for the answer.
    Offered,
    /// Settled (answered either way).
    Done,
}

/// The negotiable keys' values, indexed like [`table::NEGOTIABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Values(pub [Val; table::NEGOTIABLE.len()]);

impl Values {
    pub(crate) fn defaults() -> Values {
        Values(std::array::from_fn(|i| table::NEGOTIABLE[i].default.expect("negotiable keys have defaults")))
    }

    pub(crate) fn num(&self, i: usize) -> u64 {
        match self.0[i] {
            Val::Num(n) => n,
            v => unreachable!("{} is not a number: {v:?}", table::NEGOTIABLE[i].name),
        }
    }

    pub(crate) fn flag(&self, i: usize) -> bool {
        match self.0[i] {
            Val::Bool(b) => b,
            v => unreachable!("{} is not a boolean: {v:?}", table::NEGOTIABLE[i].name),
        }
    }

    pub(crate) fn text(&self, i: usize) -> &'static str {
        match self.0[i] {
            Val::Str(s) => s,
            v => unreachable!("{} is not a list value: {v:?}", table::NEGOTIABLE[i].name),
        }
    }

    /// The session and connection parameters these values make (declarations left empty).
    pub(crate) fn params(&self) -> (SessionParams, ConnectionParams) {
        use table::idx::*;
        let s = SessionParams {
            max_connections: self.num(MAX_CONNECTIONS) as u16,
            initial_r2t: self.flag(INITIAL_R2T),
            immediate_data: self.flag(IMMEDIATE_DATA),
            max_burst_length: self.num(MAX_BURST_LENGTH) as u32,
            first_burst_length: self.num(FIRST_BURST_LENGTH) as u32,
            default_time2wait: self.num(DEFAULT_TIME2WAIT) as u16,
            default_time2retain: self.num(DEFAULT_TIME2RETAIN) as u16,
            max_outstanding_r2t: self.num(MAX_OUTSTANDING_R2T) as u16,
            data_pdu_in_order: self.flag(DATA_PDU_IN_ORDER),
            data_sequence_in_order: self.flag(DATA_SEQUENCE_IN_ORDER),
            error_recovery_level: self.num(ERROR_RECOVERY_LEVEL) as u8,
            task_reporting: TaskReporting::from_str(self.text(TASK_REPORTING)),
            protocol_level: self.num(PROTOCOL_LEVEL) as u8,
            ..SessionParams::default()
        };
        let c = ConnectionParams {
            header_digest: self.text(HEADER_DIGEST) == "CRC32C",
            data_digest: self.text(DATA_DIGEST) == "CRC32C",
            ..ConnectionParams::default()
        };
        (s, c)
    }
}

/// What an end's own setting is for a negotiable key: a number, a boolean, or the list of
/// values it accepts in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ours {
    Num(u64),
    Bool(bool),
    List(&'static [&'static str]),
}

/// The acceptor's answer to an offer of `value` for `def` given its own setting: the value
/// to answer (and adopt), or `None` for Reject.
pub(crate) fn accept(def: &KeyDef, value: &str, ours: Ours) -> Option<Val> {
    if value.len() > MAX_SIMPLE_VALUE_LEN {
        return None;
    }
    match (def.kind, ours) {
        (Kind::List { known }, Ours::List(accepted)) => keys::list_values(value)
            .find(|v| accepted.contains(v))
            .and_then(|v| known.iter().find(|k| **k == v).map(|k| Val::Str(k))),
        (Kind::Number { min, max, func }, Ours::Num(o)) => {
            let n = keys::parse_number(value)?;
            if !(min..=max).contains(&n) {
                return None;
            }
            Some(Val::Num(match func {
                NumFunc::Min => n.min(o),
                NumFunc::Max => n.max(o),
            }))
        }
        (Kind::Boolean(func), Ours::Bool(o)) => {
            let b = keys::parse_bool(value)?;
            Some(Val::Bool(match func {
                BoolFunc::And => b && o,
                BoolFunc::Or => b || o,
            }))
        }
        _ => None,
    }
}

/// Whether `answer` is a possible outcome of this end's offer `offered` for `def` (the
/// acceptor answered with the function's result).
pub(crate) fn check_answer(def: &KeyDef, answer: &str, offered: Ours) -> Option<Val> {
    match (def.kind, offered) {
        (Kind::List { known }, Ours::List(list)) => {
            list.iter().find(|v| **v == answer).and_then(|v| known.iter().find(|k| *k == v)).map(|k| Val::Str(k))
        }
        (Kind::Number { min, max, func }, Ours::Num(o)) => {
            let n = keys::parse_number(answer)?;
            let ok = (min..=max).contains(&n)
                && match func {
                    NumFunc::Min => n <= o,
                    NumFunc::Max => n >= o,
                };
            ok.then_some(Val::Num(n))
        }
        (Kind::Boolean(func), Ours::Bool(o)) => {
            let b = keys::parse_bool(answer)?;
            let ok = match func {
                BoolFunc::And => o || !b,
                BoolFunc::Or => !o || b,
            };
            ok.then_some(Val::Bool(b))
        }
        _ => None,
    }
}

/// Whether an outcome `v` is one this end can work with given its own setting.
pub(crate) fn acceptable(def: &KeyDef, v: Val, ours: Ours) -> bool {
    match (def.kind, v, ours) {
        (Kind::List { .. }, Val::Str(s), Ours::List(list)) => list.contains(&s),
        (Kind::Number { func: NumFunc::Min, .. }, Val::Num(n), Ours::Num(o)) => n <= o,
        (Kind::Number { func: NumFunc::Max, .. }, Val::Num(n), Ours::Num(o)) => n >= o,
        (Kind::Boolean(BoolFunc::And), Val::Bool(b), Ours::Bool(o)) => o || !b,
        (Kind::Boolean(BoolFunc::Or), Val::Bool(b), Ours::Bool(o)) => !o || b,
        _ => true,
    }
}

/// The value this end offers for a key given its own setting.
pub(crate) fn offer_value(ours: Ours) -> String {
    match ours {
        Ours::Num(n) => n.to_string(),
        Ours::Bool(b) => keys::bool_str(b).to_string(),
        Ours::List(l) => l.join(","),
    }
}

/// Whether a value is one of the answers that carry no value (NotUnderstood, Irrelevant,
/// Reject).
pub(crate) fn is_refusal(v: &str) -> bool {
    matches!(v, keys::NOT_UNDERSTOOD | keys::IRRELEVANT | keys::REJECT)
}

#[cfg(test)]
mod tests;
