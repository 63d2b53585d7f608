//! The initiator's side of key negotiation (for an initiator bdev): offers the operational
//! keys, checks the target's answers, answers the target's own offers, and collects the
//! target's declarations.

use super::table::{self, idx, BoolFunc, Found, Kind, Usage, NEGOTIABLE};
use super::{
    accept, acceptable, check_answer, is_refusal, offer_value, ConnectionParams, DigestPolicy, KeyState, Negotiated,
    NegotiationError, Ours, SessionType, Val, Values,
};
use crate::keys::{self, KeyValue, TextWriter};

/// The initiator's settings (defaults: what libiscsi offers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitiatorOptions {
    /// HeaderDigest policy.
    pub header_digest: DigestPolicy,
    /// DataDigest policy.
    pub data_digest: DigestPolicy,
    /// The MaxRecvDataSegmentLength the initiator declares.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength offered.
    pub max_burst_length: u32,
    /// FirstBurstLength offered.
    pub first_burst_length: u32,
    /// InitialR2T offered.
    pub initial_r2t: bool,
    /// ImmediateData offered.
    pub immediate_data: bool,
    /// MaxConnections offered.
    pub max_connections: u16,
    /// MaxOutstandingR2T offered.
    pub max_outstanding_r2t: u16,
    /// DefaultTime2Wait offered.
    pub default_time2wait: u16,
    /// DefaultTime2Retain offered.
    pub default_time2retain: u16,
    /// ErrorRecoveryLevel offered.
    pub error_recovery_level: u8,
    /// DataPDUInOrder offered.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder offered.
    pub data_sequence_in_order: bool,
}

impl Default for InitiatorOptions {
    fn default() -> InitiatorOptions {
        InitiatorOptions {
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Off,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 262_144,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            max_connections: 1,
            max_outstanding_r2t: 1,
            default_time2wait: 2,
            default_time2retain: 0,
            error_recovery_level: 0,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
        }
    }
}

impl InitiatorOptions {
    fn ours(&self, i: usize) -> Ours {
        match i {
            idx::HEADER_DIGEST => Ours::List(self.header_digest.values()),
            idx::DATA_DIGEST => Ours::List(self.data_digest.values()),
            idx::MAX_CONNECTIONS => Ours::Num(self.max_connections.into()),
            idx::INITIAL_R2T => Ours::Bool(self.initial_r2t),
            idx::IMMEDIATE_DATA => Ours::Bool(self.immediate_data),
            idx::MAX_BURST_LENGTH => Ours::Num(self.max_burst_length.into()),
            idx::FIRST_BURST_LENGTH => Ours::Num(self.first_burst_length.min(self.max_burst_length).into()),
            idx::DEFAULT_TIME2WAIT => Ours::Num(self.default_time2wait.into()),
            idx::DEFAULT_TIME2RETAIN => Ours::Num(self.default_time2retain.into()),
            idx::MAX_OUTSTANDING_R2T => Ours::Num(self.max_outstanding_r2t.into()),
            idx::DATA_PDU_IN_ORDER => Ours::Bool(self.data_pdu_in_order),
            idx::DATA_SEQUENCE_IN_ORDER => Ours::Bool(self.data_sequence_in_order),
            idx::ERROR_RECOVERY_LEVEL => Ours::Num(self.error_recovery_level.into()),
            idx::TASK_REPORTING => Ours::List(&["RFC3720"]),
            idx::PROTOCOL_LEVEL => Ours::Num(1),
            idx::IF_MARKER | idx::OF_MARKER => Ours::Bool(false),
            _ => unreachable!("negotiable key index {i}"),
        }
    }
}

/// The keys an initiator offers in a normal session, in libiscsi's order.
const NORMAL_OFFERS: &[usize] = &[
    idx::HEADER_DIGEST,
    idx::DATA_DIGEST,
    idx::INITIAL_R2T,
    idx::IMMEDIATE_DATA,
    idx::MAX_BURST_LENGTH,
    idx::FIRST_BURST_LENGTH,
    idx::DEFAULT_TIME2WAIT,
    idx::DEFAULT_TIME2RETAIN,
    idx::MAX_OUTSTANDING_R2T,
    idx::ERROR_RECOVERY_LEVEL,
    idx::MAX_CONNECTIONS,
    idx::DATA_PDU_IN_ORDER,
    idx::DATA_SEQUENCE_IN_ORDER,
];

/// The keys an initiator offers in a discovery session (the others are irrelevant there).
const DISCOVERY_OFFERS: &[usize] = &[
    idx::HEADER_DIGEST,
    idx::DATA_DIGEST,
    idx::DEFAULT_TIME2WAIT,
    idx::DEFAULT_TIME2RETAIN,
    idx::ERROR_RECOVERY_LEVEL,
];

/// The initiator's negotiation state for one connection's login.
#[derive(Debug, Clone)]
pub struct InitiatorNegotiator {
    opts: InitiatorOptions,
    session_type: SessionType,
    /// The login starts a session (TSIH 0): leading-only keys are negotiated.
    leading: bool,
    values: Values,
    state: [KeyState; NEGOTIABLE.len()],
    peer_mrdsl: Option<u32>,
    target_alias: Option<String>,
    target_portal_group_tag: Option<u16>,
    target_addresses: Vec<String>,
}

impl InitiatorNegotiator {
    /// A negotiator for the leading connection of a session of type `session_type`.
    pub fn new(opts: InitiatorOptions, session_type: SessionType) -> InitiatorNegotiator {
        InitiatorNegotiator::for_connection(opts, session_type, true)
    }

    /// A negotiator for a connection's login: `leading` when it starts the session; a
    /// connection that joins one neither offers nor checks leading-only keys (the session's
    /// values hold).
    pub fn for_connection(opts: InitiatorOptions, session_type: SessionType, leading: bool) -> InitiatorNegotiator {
        InitiatorNegotiator {
            opts,
            session_type,
            leading,
            values: Values::defaults(),
            state: [KeyState::Fresh; NEGOTIABLE.len()],
            peer_mrdsl: None,
            target_alias: None,
            target_portal_group_tag: None,
            target_addresses: Vec::new(),
        }
    }

    /// Writes the operational offers (and the MaxRecvDataSegmentLength declaration) into
    /// `out`: every key of the session type that has not been offered yet.
    pub fn offer(&mut self, out: &mut TextWriter) {
        let list = match self.session_type {
            SessionType::Normal => NORMAL_OFFERS,
            SessionType::Discovery => DISCOVERY_OFFERS,
        };
        for &i in list {
            if self.state[i] != KeyState::Fresh || (!self.leading && NEGOTIABLE[i].usage == Usage::LeadingOnly) {
                continue;
            }
            if i == idx::FIRST_BURST_LENGTH && self.opts.initial_r2t && !self.opts.immediate_data {
                continue;
            }
            out.push(NEGOTIABLE[i].name, &offer_value(self.opts.ours(i)));
            self.state[i] = KeyState::Offered;
        }
        out.push_num("MaxRecvDataSegmentLength", self.opts.max_recv_data_segment_length.into());
    }

    /// Takes the target's keys of one Login Response (`pairs`): checks the answers to the
    /// initiator's offers, answers the target's offers into `out`, records declarations.
    /// Returns the security keys (AuthMethod, CHAP_*) for the caller.
    pub fn apply(&mut self, pairs: &[KeyValue], out: &mut TextWriter) -> Result<Vec<KeyValue>, NegotiationError> {
        let mut security = Vec::new();
        for kv in pairs {
            let Some(found) = table::find(&kv.key) else {
                if !is_refusal(&kv.value) {
                    out.push(&kv.key, keys::NOT_UNDERSTOOD);
                }
                continue;
            };
            match found {
                Found::Other(def) => match (def.name, def.kind) {
                    (_, Kind::Security) => security.push(kv.clone()),
                    ("MaxRecvDataSegmentLength", _) => {
                        let n = keys::parse_number(&kv.value)
                            .filter(|n| (512..=u64::from(crate::pdu::MAX_DATA_SEGMENT_LENGTH)).contains(n))
                            .ok_or_else(|| NegotiationError::BadAnswer(kv.key.clone()))?;
                        self.peer_mrdsl = Some(n as u32);
                    }
                    ("TargetAlias", _) => self.target_alias = Some(kv.value.clone()),
                    ("TargetAddress", _) => self.target_addresses.push(kv.value.clone()),
                    ("TargetPortalGroupTag", _) => {
                        let n = keys::parse_number(&kv.value)
                            .and_then(|n| u16::try_from(n).ok())
                            .ok_or_else(|| NegotiationError::BadAnswer(kv.key.clone()))?;
                        self.target_portal_group_tag = Some(n);
                    }
                    _ => {
                        if !is_refusal(&kv.value) {
                            out.push(&kv.key, keys::REJECT);
                        }
                    }
                },
                Found::Negotiable(i) => self.negotiable(i, kv, out)?,
            }
        }
        Ok(security)
    }

    fn negotiable(&mut self, i: usize, kv: &KeyValue, out: &mut TextWriter) -> Result<(), NegotiationError> {
        let def = &NEGOTIABLE[i];
        match self.state[i] {
            KeyState::Done => Err(NegotiationError::Duplicate(kv.key.clone())),
            KeyState::Offered => {
                self.state[i] = KeyState::Done;
                if is_refusal(&kv.value) {
                    return Ok(());
                }
                let v = check_answer(def, &kv.value, self.opts.ours(i))
                    .ok_or_else(|| NegotiationError::BadAnswer(kv.key.clone()))?;
                self.values.0[i] = v;
                Ok(())
            }
            KeyState::Fresh => {
                self.state[i] = KeyState::Done;
                match accept(def, &kv.value, self.opts.ours(i)) {
                    Some(v) => {
                        self.values.0[i] = v;
                        out.push(&kv.key, &v.to_text());
                    }
                    None => out.push(&kv.key, keys::REJECT),
                }
                Ok(())
            }
        }
    }

    /// The outcome once the target transits to the full feature phase. Offers the target
    /// left unanswered settle as RFC 7143 section 6.2.2 allows only for AND with No and OR
    /// with Yes; any other unanswered offer fails.
    pub fn finish(&self) -> Result<Negotiated, NegotiationError> {
        let mut values = self.values;
        for (i, def) in NEGOTIABLE.iter().enumerate() {
            if self.state[i] != KeyState::Offered {
                continue;
            }
            values.0[i] = match (def.kind, self.opts.ours(i)) {
                (Kind::Boolean(BoolFunc::And), Ours::Bool(false)) => Val::Bool(false),
                (Kind::Boolean(BoolFunc::Or), Ours::Bool(true)) => Val::Bool(true),
                _ => return Err(NegotiationError::Unanswered(def.name.to_string())),
            };
        }
        let (mut session, connection) = values.params();
        let fb_irrelevant = values.flag(idx::INITIAL_R2T) && !values.flag(idx::IMMEDIATE_DATA);
        if self.session_type == SessionType::Normal
            && !fb_irrelevant
            && session.first_burst_length > session.max_burst_length
        {
            return Err(NegotiationError::FirstBurstOverMaxBurst {
                first: session.first_burst_length,
                max: session.max_burst_length,
            });
        }
        for (i, def) in NEGOTIABLE.iter().enumerate() {
            if (def.discovery_irrelevant && self.session_type == SessionType::Discovery)
                || (i == idx::FIRST_BURST_LENGTH && fb_irrelevant)
                || (!self.leading && def.usage == Usage::LeadingOnly)
            {
                continue;
            }
            if !acceptable(def, values.0[i], self.opts.ours(i)) {
                return Err(NegotiationError::Unacceptable(def.name.to_string()));
            }
        }
        session.session_type = self.session_type;
        session.target_alias = self.target_alias.clone();
        session.target_portal_group_tag = self.target_portal_group_tag;
        let connection = ConnectionParams {
            max_recv_data_segment_length: self.opts.max_recv_data_segment_length,
            max_send_data_segment_length: self.peer_mrdsl.unwrap_or(crate::pdu::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH),
            ..connection
        };
        Ok(Negotiated { session, connection })
    }

    /// TargetAddress values the target sent (a redirection's new address).
    pub fn target_addresses(&self) -> &[String] {
        &self.target_addresses
    }
}
