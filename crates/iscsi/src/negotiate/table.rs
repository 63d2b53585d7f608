//! The keys of RFC 7143 sections 12 and 13, with their negotiation rules.

use super::Val;

/// Result function of a numerical key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumFunc {
    /// The smaller of offer and acceptor's value.
    Min,
    /// The larger.
    Max,
}

/// Result function of a boolean key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoolFunc {
    /// Yes only if both say Yes.
    And,
    /// Yes if either says Yes.
    Or,
}

/// How a key is negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A list: the acceptor picks the first offered value it supports; `known` are the values
    /// RFC 7143 defines.
    List {
        /// The values defined.
        known: &'static [&'static str],
    },
    /// A number in `min..=max`, resolved with `func`.
    Number {
        /// Smallest valid value.
        min: u64,
        /// Largest valid value.
        max: u64,
        /// Result function.
        func: NumFunc,
    },
    /// Yes or No, resolved with the function.
    Boolean(BoolFunc),
    /// A declared number in `min..=max` (not answered).
    DeclaredNumber {
        /// Smallest valid value.
        min: u64,
        /// Largest valid value.
        max: u64,
    },
    /// A declared text value (not answered).
    Declared,
    /// SendTargets: answered with target records in the full feature phase.
    SendTargets,
    /// A security key (AuthMethod, CHAP_*): handled by the login's security stage.
    Security,
    /// A key RFC 7143 obsoletes that is answered Reject (IFMarkInt, OFMarkInt).
    Obsolete,
}

/// When a key may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// LO: in the login of a session's leading connection only.
    LeadingOnly,
    /// IO: during login only.
    LoginOnly,
    /// ALL: during login and in the full feature phase.
    Any,
    /// FFPO: in the full feature phase only.
    FullFeatureOnly,
}

/// Who may send a key (as an offer or declaration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The initiator only.
    Initiator,
    /// The target only.
    Target,
    /// Either.
    Both,
}

/// One key's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    /// The key's name (case-sensitive).
    pub name: &'static str,
    /// How it is negotiated.
    pub kind: Kind,
    /// When it may be sent.
    pub usage: Usage,
    /// Who may send it.
    pub sender: Sender,
    /// "Irrelevant when: SessionType=Discovery".
    pub discovery_irrelevant: bool,
    /// The value when it is not negotiated (negotiable keys).
    pub default: Option<Val>,
}

const DIGESTS: &[&str] = &["CRC32C", "None"];
const TASK_REPORTING: &[&str] = &["RFC3720", "ResponseFence", "FastAbort"];
const LEN_MAX: u64 = (1 << 24) - 1;

const fn negotiable(name: &'static str, kind: Kind, usage: Usage, discovery_irrelevant: bool, default: Val) -> KeyDef {
    KeyDef { name, kind, usage, sender: Sender::Both, discovery_irrelevant, default: Some(default) }
}

const fn num(min: u64, max: u64, func: NumFunc) -> Kind {
    Kind::Number { min, max, func }
}

/// Indexes of the negotiable keys in [`NEGOTIABLE`].
pub mod idx {
    /// HeaderDigest.
    pub const HEADER_DIGEST: usize = 0;
    /// DataDigest.
    pub const DATA_DIGEST: usize = 1;
    /// MaxConnections.
    pub const MAX_CONNECTIONS: usize = 2;
    /// InitialR2T.
    pub const INITIAL_R2T: usize = 3;
    /// ImmediateData.
    pub const IMMEDIATE_DATA: usize = 4;
    /// MaxBurstLength.
    pub const MAX_BURST_LENGTH: usize = 5;
    /// FirstBurstLength.
    pub const FIRST_BURST_LENGTH: usize = 6;
    /// DefaultTime2Wait.
    pub const DEFAULT_TIME2WAIT: usize = 7;
    /// DefaultTime2Retain.
    pub const DEFAULT_TIME2RETAIN: usize = 8;
    /// MaxOutstandingR2T.
    pub const MAX_OUTSTANDING_R2T: usize = 9;
    /// DataPDUInOrder.
    pub const DATA_PDU_IN_ORDER: usize = 10;
    /// DataSequenceInOrder.
    pub const DATA_SEQUENCE_IN_ORDER: usize = 11;
    /// ErrorRecoveryLevel.
    pub const ERROR_RECOVERY_LEVEL: usize = 12;
    /// TaskReporting.
    pub const TASK_REPORTING: usize = 13;
    /// iSCSIProtocolLevel.
    pub const PROTOCOL_LEVEL: usize = 14;
    /// IFMarker (obsolete; answered No).
    pub const IF_MARKER: usize = 15;
    /// OFMarker (obsolete; answered No).
    pub const OF_MARKER: usize = 16;
}

/// The keys whose outcome is negotiated (offer and answer), with RFC 7143's defaults.
pub const NEGOTIABLE: [KeyDef; 17] = [
    negotiable("HeaderDigest", Kind::List { known: DIGESTS }, Usage::LoginOnly, false, Val::Str("None")),
    negotiable("DataDigest", Kind::List { known: DIGESTS }, Usage::LoginOnly, false, Val::Str("None")),
    negotiable("MaxConnections", num(1, 65535, NumFunc::Min), Usage::LeadingOnly, true, Val::Num(1)),
    negotiable("InitialR2T", Kind::Boolean(BoolFunc::Or), Usage::LeadingOnly, true, Val::Bool(true)),
    negotiable("ImmediateData", Kind::Boolean(BoolFunc::And), Usage::LeadingOnly, true, Val::Bool(true)),
    negotiable("MaxBurstLength", num(512, LEN_MAX, NumFunc::Min), Usage::LeadingOnly, true, Val::Num(262_144)),
    negotiable("FirstBurstLength", num(512, LEN_MAX, NumFunc::Min), Usage::LeadingOnly, true, Val::Num(65_536)),
    negotiable("DefaultTime2Wait", num(0, 3600, NumFunc::Max), Usage::LeadingOnly, false, Val::Num(2)),
    negotiable("DefaultTime2Retain", num(0, 3600, NumFunc::Min), Usage::LeadingOnly, false, Val::Num(20)),
    negotiable("MaxOutstandingR2T", num(1, 65535, NumFunc::Min), Usage::LeadingOnly, true, Val::Num(1)),
    negotiable("DataPDUInOrder", Kind::Boolean(BoolFunc::Or), Usage::LeadingOnly, true, Val::Bool(true)),
    negotiable("DataSequenceInOrder", Kind::Boolean(BoolFunc::Or), Usage::LeadingOnly, true, Val::Bool(true)),
    negotiable("ErrorRecoveryLevel", num(0, 2, NumFunc::Min), Usage::LeadingOnly, false, Val::Num(0)),
    negotiable("TaskReporting", Kind::List { known: TASK_REPORTING }, Usage::LeadingOnly, true, Val::Str("RFC3720")),
    negotiable("iSCSIProtocolLevel", num(0, 31, NumFunc::Min), Usage::LeadingOnly, false, Val::Num(1)),
    negotiable("IFMarker", Kind::Boolean(BoolFunc::And), Usage::LoginOnly, false, Val::Bool(false)),
    negotiable("OFMarker", Kind::Boolean(BoolFunc::And), Usage::LoginOnly, false, Val::Bool(false)),
];

const fn other(name: &'static str, kind: Kind, usage: Usage, sender: Sender) -> KeyDef {
    KeyDef { name, kind, usage, sender, discovery_irrelevant: false, default: None }
}

/// The declarative, special and security keys.
pub const OTHERS: [KeyDef; 18] = [
    other("MaxRecvDataSegmentLength", Kind::DeclaredNumber { min: 512, max: LEN_MAX }, Usage::Any, Sender::Both),
    other("InitiatorName", Kind::Declared, Usage::LoginOnly, Sender::Initiator),
    other("InitiatorAlias", Kind::Declared, Usage::Any, Sender::Initiator),
    other("TargetName", Kind::Declared, Usage::LoginOnly, Sender::Initiator),
    other("TargetAlias", Kind::Declared, Usage::Any, Sender::Target),
    other("TargetAddress", Kind::Declared, Usage::Any, Sender::Target),
    other("TargetPortalGroupTag", Kind::DeclaredNumber { min: 0, max: 65535 }, Usage::LoginOnly, Sender::Target),
    other("SessionType", Kind::Declared, Usage::LeadingOnly, Sender::Initiator),
    other("X#NodeArchitecture", Kind::Declared, Usage::LeadingOnly, Sender::Both),
    other("SendTargets", Kind::SendTargets, Usage::FullFeatureOnly, Sender::Initiator),
    other("IFMarkInt", Kind::Obsolete, Usage::LoginOnly, Sender::Both),
    other("OFMarkInt", Kind::Obsolete, Usage::LoginOnly, Sender::Both),
    other("AuthMethod", Kind::Security, Usage::LoginOnly, Sender::Both),
    other("CHAP_A", Kind::Security, Usage::LoginOnly, Sender::Both),
    other("CHAP_I", Kind::Security, Usage::LoginOnly, Sender::Both),
    other("CHAP_C", Kind::Security, Usage::LoginOnly, Sender::Both),
    other("CHAP_N", Kind::Security, Usage::LoginOnly, Sender::Both),
    other("CHAP_R", Kind::Security, Usage::LoginOnly, Sender::Both),
];

/// Where a key is: its index in [`NEGOTIABLE`] (`Ok`) or its definition among the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A negotiable key and its index.
    Negotiable(usize),
    /// Another known key.
    Other(&'static KeyDef),
}

/// Finds a key by its exact (case-sensitive) name.
pub fn find(name: &str) -> Option<Found> {
    if let Some(i) = NEGOTIABLE.iter().position(|d| d.name == name) {
        return Some(Found::Negotiable(i));
    }
    OTHERS.iter().find(|d| d.name == name).map(Found::Other)
}

/// The definition of a key by its exact name.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    match find(name)? {
        Found::Negotiable(i) => Some(&NEGOTIABLE[i]),
        Found::Other(d) => Some(d),
    }
}
