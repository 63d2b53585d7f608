//! The target's side of key negotiation.
//!
//! A [`TargetNegotiator`] lives for one connection's login (and, in the full feature phase,
//! answers Text Requests). Per request: [`TargetNegotiator::respond`] answers the initiator's
//! keys into the response text and hands back what the caller handles itself (security keys,
//! SendTargets); before transiting to the full feature phase the caller asks
//! [`TargetNegotiator::offer`] for the target's own offers (keys whose RFC default the target
//! cannot work with and that the initiator did not offer: the response then goes out with
//! T=0 and the initiator answers in its next request); at the transit,
//! [`TargetNegotiator::finish`] checks the outcome and yields the parameters.

use std::collections::HashSet;

use super::table::{self, idx, Found, Kind, Sender, Usage, NEGOTIABLE};
use super::{
    accept, acceptable, check_answer, is_refusal, offer_value, ConnectionParams, DigestPolicy, KeyState, Negotiated,
    NegotiationError, Ours, SessionType, Val, Values,
};
use crate::keys::{self, KeyValue, TextWriter};
use crate::pdu::{Stage, MAX_DATA_SEGMENT_LENGTH};

/// The target's settings (SPDK's `iscsi_set_options` names; SPDK's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOptions {
    /// The MaxRecvDataSegmentLength the target declares (512..2^24): the most data per PDU
    /// it accepts.
    pub max_recv_data_segment_length: u32,
    /// FirstBurstLength (512..=MaxBurstLength).
    pub first_burst_length: u32,
    /// MaxBurstLength (512..2^24).
    pub max_burst_length: u32,
    /// ImmediateData: whether the target takes data in SCSI Command PDUs.
    pub immediate_data: bool,
    /// InitialR2T: whether the target insists on soliciting all non-immediate data.
    pub initial_r2t: bool,
    /// ErrorRecoveryLevel (0..=2) the target supports.
    pub error_recovery_level: u8,
    /// MaxConnections per session.
    pub max_connections: u16,
    /// MaxOutstandingR2T per command.
    pub max_outstanding_r2t: u16,
    /// DefaultTime2Wait (seconds).
    pub default_time2wait: u16,
    /// DefaultTime2Retain (seconds).
    pub default_time2retain: u16,
    /// DataPDUInOrder: whether the target needs Data-Out PDUs in order.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder: whether the target needs sequences in order.
    pub data_sequence_in_order: bool,
    /// HeaderDigest policy.
    pub header_digest: DigestPolicy,
    /// DataDigest policy.
    pub data_digest: DigestPolicy,
}

impl Default for TargetOptions {
    fn default() -> TargetOptions {
        TargetOptions {
            max_recv_data_segment_length: 65_536,
            first_burst_length: 8192,
            max_burst_length: 1 << 20,
            immediate_data: true,
            initial_r2t: true,
            error_recovery_level: 0,
            max_connections: 2,
            max_outstanding_r2t: 1,
            default_time2wait: 2,
            default_time2retain: 20,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Allowed,
        }
    }
}

impl TargetOptions {
    /// Checks every setting against its key's range (and FirstBurstLength ≤ MaxBurstLength).
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(&str, u64, u64, u64); 8] = [
            ("MaxRecvDataSegmentLength", self.max_recv_data_segment_length.into(), 512, MAX_DATA_SEGMENT_LENGTH.into()),
            ("MaxBurstLength", self.max_burst_length.into(), 512, MAX_DATA_SEGMENT_LENGTH.into()),
            ("FirstBurstLength", self.first_burst_length.into(), 512, self.max_burst_length.into()),
            ("ErrorRecoveryLevel", self.error_recovery_level.into(), 0, 2),
            ("MaxConnections", self.max_connections.into(), 1, 65535),
            ("MaxOutstandingR2T", self.max_outstanding_r2t.into(), 1, 65535),
            ("DefaultTime2Wait", self.default_time2wait.into(), 0, 3600),
            ("DefaultTime2Retain", self.default_time2retain.into(), 0, 3600),
        ];
        for (name, v, min, max) in checks {
            if !(min..=max).contains(&v) {
                return Err(format!("{name} {v} outside {min}..={max}"));
            }
        }
        Ok(())
    }

    /// The target's own setting for negotiable key `i`.
    pub(crate) fn ours(&self, i: usize) -> Ours {
        match i {
            idx::HEADER_DIGEST => Ours::List(acceptor_order(self.header_digest)),
            idx::DATA_DIGEST => Ours::List(acceptor_order(self.data_digest)),
            idx::MAX_CONNECTIONS => Ours::Num(self.max_connections.into()),
            idx::INITIAL_R2T => Ours::Bool(self.initial_r2t),
            idx::IMMEDIATE_DATA => Ours::Bool(self.immediate_data),
            idx::MAX_BURST_LENGTH => Ours::Num(self.max_burst_length.into()),
            idx::FIRST_BURST_LENGTH => Ours::Num(self.first_burst_length.into()),
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

/// As an acceptor the target takes the initiator's order; the list only says what it takes
/// (and, when it must offer, what it offers first).
fn acceptor_order(p: DigestPolicy) -> &'static [&'static str] {
    match p {
        DigestPolicy::Off => &["None"],
        DigestPolicy::Allowed => &["None", "CRC32C"],
        DigestPolicy::Preferred => &["CRC32C", "None"],
        DigestPolicy::Required => &["CRC32C"],
    }
}

/// What [`TargetNegotiator::respond`] leaves to its caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Special {
    /// AuthMethod and CHAP_* keys (security stage only), in order.
    pub security: Vec<KeyValue>,
    /// The SendTargets value (full feature phase only).
    pub send_targets: Option<String>,
}

/// The target's negotiation state for one connection; see the module documentation.
#[derive(Debug, Clone)]
pub struct TargetNegotiator {
    opts: TargetOptions,
    leading: bool,
    session_type: SessionType,
    values: Values,
    state: [KeyState; NEGOTIABLE.len()],
    mrdsl_declared: bool,
    peer_mrdsl: Option<u32>,
    declarations: Vec<KeyValue>,
}

/// The phase a request arrives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A Login Request in stage CSG.
    Login(Stage),
    /// A Text Request in the full feature phase.
    FullFeature,
}

impl TargetNegotiator {
    /// A negotiator for a connection's login: `leading` when the login starts a session
    /// (TSIH 0), so that leading-only keys apply.
    pub fn new(opts: TargetOptions, leading: bool) -> TargetNegotiator {
        debug_assert!(opts.validate().is_ok(), "{:?}", opts.validate());
        TargetNegotiator {
            opts,
            leading,
            session_type: SessionType::Normal,
            values: Values::defaults(),
            state: [KeyState::Fresh; NEGOTIABLE.len()],
            mrdsl_declared: false,
            peer_mrdsl: None,
            declarations: Vec::new(),
        }
    }

    /// The session type declared so far (Normal by default).
    pub fn session_type(&self) -> SessionType {
        self.session_type
    }

    /// The value of a declaration the initiator made (InitiatorName, TargetName,
    /// SessionType, InitiatorAlias, X#NodeArchitecture).
    pub fn declared(&self, key: &str) -> Option<&str> {
        self.declarations.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str())
    }

    /// The MaxRecvDataSegmentLength the initiator declared, if it did.
    pub fn peer_max_recv_data_segment_length(&self) -> Option<u32> {
        self.peer_mrdsl
    }

    /// Whether the target made offers that are still unanswered.
    pub fn has_pending(&self) -> bool {
        self.state.contains(&KeyState::Offered)
    }

    fn gate(&self, phase: Phase, def: &table::KeyDef) -> Option<&'static str> {
        if def.sender == Sender::Target {
            return Some(keys::REJECT);
        }
        match (phase, def.usage) {
            (Phase::FullFeature, Usage::LeadingOnly | Usage::LoginOnly) => return Some(keys::REJECT),
            (Phase::Login(_), Usage::FullFeatureOnly) => return Some(keys::REJECT),
            (Phase::Login(_), Usage::LeadingOnly) if !self.leading && def.kind != Kind::Declared => {
                return Some(keys::IRRELEVANT)
            }
            _ => {}
        }
        if def.discovery_irrelevant && self.session_type == SessionType::Discovery {
            return Some(keys::IRRELEVANT);
        }
        None
    }

    /// Answers the keys of one request (`pairs`, its whole text) into `out`, in order.
    /// FirstBurstLength is answered last, once MaxBurstLength, InitialR2T and ImmediateData
    /// are settled. Returns the keys the caller answers itself.
    pub fn respond(
        &mut self,
        phase: Phase,
        pairs: &[KeyValue],
        out: &mut TextWriter,
    ) -> Result<Special, NegotiationError> {
        let mut seen = HashSet::with_capacity(pairs.len());
        for kv in pairs {
            if !seen.insert(kv.key.as_str()) {
                return Err(NegotiationError::Duplicate(kv.key.clone()));
            }
        }
        if let Phase::Login(_) = phase {
            if let Some(t) =
                pairs.iter().find(|kv| kv.key == "SessionType").and_then(|kv| SessionType::parse(&kv.value))
            {
                self.session_type = t;
            }
        }
        let mut special = Special::default();
        let mut first_burst = None;
        for kv in pairs {
            let Some(found) = table::find(&kv.key) else {
                out.push(&kv.key, keys::NOT_UNDERSTOOD);
                continue;
            };
            let def = match found {
                Found::Negotiable(i) => &NEGOTIABLE[i],
                Found::Other(d) => d,
            };
            if def.kind == Kind::Security {
                match phase {
                    Phase::Login(Stage::Security) => special.security.push(kv.clone()),
                    Phase::Login(_) => return Err(NegotiationError::SecurityKeyOutOfStage(kv.key.clone())),
                    Phase::FullFeature => out.push(&kv.key, keys::REJECT),
                }
                continue;
            }
            if let Some(answer) = self.gate(phase, def) {
                out.push(&kv.key, answer);
                continue;
            }
            match (found, def.kind) {
                (_, Kind::SendTargets) => special.send_targets = Some(kv.value.clone()),
                (_, Kind::Obsolete) => out.push(&kv.key, keys::REJECT),
                (_, Kind::DeclaredNumber { min, max }) => {
                    // Only MaxRecvDataSegmentLength gets here (TargetPortalGroupTag is the
                    // target's and was rejected above).
                    match keys::parse_number(&kv.value).filter(|n| (min..=max).contains(n)) {
                        Some(n) => self.peer_mrdsl = Some(n as u32),
                        None => out.push(&kv.key, keys::REJECT),
                    }
                    if !self.mrdsl_declared {
                        self.mrdsl_declared = true;
                        out.push_num("MaxRecvDataSegmentLength", self.opts.max_recv_data_segment_length.into());
                    }
                }
                (_, Kind::Declared) => self.declare(phase, kv)?,
                (Found::Negotiable(idx::FIRST_BURST_LENGTH), _) => first_burst = Some(kv),
                (Found::Negotiable(i), _) => self.negotiate(i, kv, out)?,
                (Found::Other(_), _) => out.push(&kv.key, keys::NOT_UNDERSTOOD),
            }
        }
        if let Some(kv) = first_burst {
            self.negotiate(idx::FIRST_BURST_LENGTH, kv, out)?;
        }
        Ok(special)
    }

    /// Records a declaration. During login it may repeat only with the same value; in the
    /// full feature phase a new one replaces the old (an InitiatorAlias may change).
    fn declare(&mut self, phase: Phase, kv: &KeyValue) -> Result<(), NegotiationError> {
        match self.declarations.iter_mut().find(|d| d.key == kv.key) {
            Some(d) if phase == Phase::FullFeature => {
                d.value = kv.value.clone();
                Ok(())
            }
            Some(d) if d.value != kv.value => Err(NegotiationError::Redeclared(kv.key.clone())),
            Some(_) => Ok(()),
            None => {
                self.declarations.push(kv.clone());
                Ok(())
            }
        }
    }

    fn first_burst_irrelevant(&self) -> bool {
        self.values.flag(idx::INITIAL_R2T) && !self.values.flag(idx::IMMEDIATE_DATA)
    }

    fn negotiate(&mut self, i: usize, kv: &KeyValue, out: &mut TextWriter) -> Result<(), NegotiationError> {
        let def = &NEGOTIABLE[i];
        match self.state[i] {
            KeyState::Done => return Err(NegotiationError::Duplicate(kv.key.clone())),
            KeyState::Offered => {
                // The initiator's answer to the target's offer.
                self.state[i] = KeyState::Done;
                if is_refusal(&kv.value) {
                    return Ok(());
                }
                let v = check_answer(def, &kv.value, self.offered(i))
                    .ok_or_else(|| NegotiationError::BadAnswer(kv.key.clone()))?;
                self.values.0[i] = v;
                return Ok(());
            }
            KeyState::Fresh => {}
        }
        self.state[i] = KeyState::Done;
        if i == idx::FIRST_BURST_LENGTH && self.first_burst_irrelevant() {
            out.push(&kv.key, keys::IRRELEVANT);
            return Ok(());
        }
        if is_refusal(&kv.value) {
            out.push(&kv.key, keys::REJECT);
            return Ok(());
        }
        // FirstBurstLength never above MaxBurstLength (RFC 7143 section 13.14).
        match accept(def, &kv.value, self.ours_capped(i)) {
            Some(v) => {
                self.values.0[i] = v;
                out.push(&kv.key, &v.to_text());
            }
            None => out.push(&kv.key, keys::REJECT),
        }
        Ok(())
    }

    /// The target's setting for key `i`, FirstBurstLength capped at MaxBurstLength.
    fn ours_capped(&self, i: usize) -> Ours {
        match (i, self.opts.ours(i)) {
            (idx::FIRST_BURST_LENGTH, Ours::Num(o)) => Ours::Num(o.min(self.values.num(idx::MAX_BURST_LENGTH))),
            (_, o) => o,
        }
    }

    /// What the target offers for key `i` (for a list, its first value).
    fn offered(&self, i: usize) -> Ours {
        match self.ours_capped(i) {
            Ours::List(l) => Ours::List(&l[..1]),
            o => o,
        }
    }

    /// Writes the target's offers into `out`: the negotiable keys not negotiated yet whose
    /// default outcome the target cannot work with (a FirstBurstLength below 65536,
    /// ImmediateData=No, a required digest...). Returns whether offers are pending (then the
    /// response must not transit: the initiator answers in its next request).
    pub fn offer(&mut self, out: &mut TextWriter) -> bool {
        for (i, def) in NEGOTIABLE.iter().enumerate() {
            if self.state[i] != KeyState::Fresh || self.gate(Phase::Login(Stage::Operational), def).is_some() {
                continue;
            }
            if i == idx::FIRST_BURST_LENGTH && self.first_burst_irrelevant() {
                continue;
            }
            let default = def.default.expect("negotiable");
            if acceptable(def, default, self.ours_capped(i)) {
                continue;
            }
            out.push(def.name, &offer_value(self.offered(i)));
            self.state[i] = KeyState::Offered;
        }
        self.has_pending()
    }

    /// The outcome at the end of the login: fails if offers are unanswered, if an outcome is
    /// one the target cannot work with, or if FirstBurstLength ended above MaxBurstLength.
    pub fn finish(&self) -> Result<Negotiated, NegotiationError> {
        if let Some(i) = self.state.iter().position(|s| *s == KeyState::Offered) {
            return Err(NegotiationError::Unanswered(NEGOTIABLE[i].name.to_string()));
        }
        let (mut session, connection) = self.values.params();
        if self.session_type == SessionType::Normal
            && !self.first_burst_irrelevant()
            && session.first_burst_length > session.max_burst_length
        {
            return Err(NegotiationError::FirstBurstOverMaxBurst {
                first: session.first_burst_length,
                max: session.max_burst_length,
            });
        }
        for (i, def) in NEGOTIABLE.iter().enumerate() {
            if self.gate(Phase::Login(Stage::Operational), def).is_some() {
                continue;
            }
            if i == idx::FIRST_BURST_LENGTH && self.first_burst_irrelevant() {
                continue;
            }
            if !acceptable(def, self.values.0[i], self.ours_capped(i)) {
                return Err(NegotiationError::Unacceptable(def.name.to_string()));
            }
        }
        session.session_type = self.session_type;
        session.initiator_name = self.declared("InitiatorName").map(str::to_string);
        session.initiator_alias = self.declared("InitiatorAlias").map(str::to_string);
        session.target_name = self.declared("TargetName").map(str::to_string);
        let connection = ConnectionParams {
            max_recv_data_segment_length: if self.mrdsl_declared {
                self.opts.max_recv_data_segment_length
            } else {
                crate::pdu::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH
            },
            max_send_data_segment_length: self.peer_mrdsl.unwrap_or(crate::pdu::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH),
            ..connection
        };
        Ok(Negotiated { session, connection })
    }

    /// Declares the target's MaxRecvDataSegmentLength into `out` if it has not been yet
    /// (the login does it before the transit to the full feature phase).
    pub fn declare_max_recv(&mut self, out: &mut TextWriter) {
        if !self.mrdsl_declared {
            self.mrdsl_declared = true;
            out.push_num("MaxRecvDataSegmentLength", self.opts.max_recv_data_segment_length.into());
        }
    }

    /// The current value of negotiable key `name` (for tests and logs).
    pub fn value(&self, name: &str) -> Option<Val> {
        NEGOTIABLE.iter().position(|d| d.name == name).map(|i| self.values.0[i])
    }
}
