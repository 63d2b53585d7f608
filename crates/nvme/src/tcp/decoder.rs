//! A streaming PDU decoder for a polled connection: bytes go in as they arrive, one at a time
//! or many PDUs at once; typed, checked headers come out; data never passes through it.
//!
//! The decoder stages only headers: the 8-byte common header, then the rest of the header and
//! its digest (at most 132 bytes in all, a fixed array; nothing is ever allocated, whatever
//! PLEN says). Padding before the data and the 4-byte data digest it consumes and drops or
//! checks. The data itself the caller places where it likes (straight into bdev buffers,
//! scattered or not) and then shows the decoder, which digests it in passing and checks the
//! data digest when its 4 bytes arrive.
//!
//! Driving it:
//!
//! - [`Decoder::want`] says what comes next: [`Want::Bytes`]`(n)`, header, padding or digest
//!   bytes (at most `n` of them belong to the current step, so a caller reading straight from
//!   a socket never reads past them), or [`Want::Data`]`(n)`, data bytes.
//! - [`Decoder::feed`] takes header, padding and digest bytes from a buffer and says how many
//!   it used; it stops at the first event, and before any data.
//! - [`Decoder::data`] (or [`Decoder::data_sg`]) is told about data bytes the caller placed.
//!
//! Events: [`Event::Header`] once a header (and the padding after it) has arrived and passed
//! every check; then, if it has data, [`Event::DataEnd`] once the data (and its digest) has, or
//! [`Event::DataDigestError`] if the digest did not match, which is not fatal: the decoder
//! goes on with the next PDU and the caller fails the command (Transient Transport Error).
//!
//! Errors ([`PduError`]) are fatal: they carry the FES and FEI of the termination request to
//! send (with [`Decoder::received_header`] as its data), and the decoder stops there; every
//! later call returns the same error.
//!
//! Left to the caller: everything that needs the state of commands (whether a CCCID or TTAG
//! is outstanding, whether DATAO follows the previous PDU and DATAO + DATAL fits the command,
//! LAST_PDU at the end of an R2T's range, MAXR2T), the submission queue entry itself
//! (including whether the in-capsule data length matches its SGL), ending the connection after
//! a termination request either way, and parameters the negotiation settles
//! ([`Decoder::set_params`], with [`super::negotiate`]).

use super::digest::{self, DataDigest, DIGEST_LEN};
use super::negotiate::{pda_bytes, Negotiated};
use super::pdu::{
    flags, offset, CommonHeader, Pdu, PduError, PduType, Role, ADMIN_MAX_ICD, CAPSULE_CMD_HLEN, CH_LEN, FABRICS_OPCODE,
    IC_HLEN, MAX_HLEN, MAX_PDA, MIN_MAXH2CDATA, PFV_1_0, TERM_REQ_HLEN, TERM_REQ_MAX_PLEN,
};

/// Size of the header staging area: the largest HLEN and a header digest.
pub const STAGING_LEN: usize = MAX_HLEN + DIGEST_LEN;

/// What the decoder needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Header, padding or data digest bytes: [`Decoder::feed`] takes up to this many for the
    /// current step (more are fine; it stops where the step ends). Header steps fit the
    /// staging area; padding, which is skipped, can be up to PDO (255) less the header.
    Bytes(usize),
    /// This many bytes of the current PDU's data remain: place them, then pass them to
    /// [`Decoder::data`].
    Data(u32),
    /// A fatal error stopped the decoder; nothing more is taken.
    Closed,
}

/// A received PDU's header, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The typed header.
    pub pdu: Pdu,
    /// How many data bytes follow (to be placed by the caller): in-capsule data, H2CData or
    /// C2HData data, or a termination request's copy of the offending header.
    pub data_len: u32,
}

/// What [`Decoder::feed`] or [`Decoder::data`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A header arrived and passed every check; [`Header::data_len`] data bytes follow.
    Header(Header),
    /// The data of the PDU whose header came last has all arrived, and its digest, if it has
    /// one, matched.
    DataEnd,
    /// The data has all arrived but its digest did not match. Not fatal: the decoder is at the
    /// next PDU; the caller completes the command with a Transient Transport Error status.
    DataDigestError {
        /// The PDU's type.
        pdu_type: PduType,
        /// The digest received.
        received: u32,
        /// The digest of the data received.
        computed: u32,
    },
}

/// The result of one [`Decoder::feed`] or [`Decoder::data`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the input used; the rest is the caller's to offer again.
    pub consumed: usize,
    /// What those bytes completed, if anything.
    pub event: Option<Event>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Collecting `need` header bytes into the staging area.
    Header,
    /// Skipping padding between the header and PDO.
    Pad { left: u8 },
    /// The caller places data bytes.
    Data,
    /// Collecting the data digest.
    DataDigest,
    /// A fatal error happened.
    Failed,
}

/// What the common header says about the rest of the PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    pdu_type: PduType,
    hdgst: bool,
    ddgst: bool,
    pad: u8,
    data_len: u32,
}

/// The receiving half of an NVMe/TCP connection's framing; see the module documentation.
#[derive(Debug, Clone)]
pub struct Decoder {
    role: Role,
    params: Negotiated,
    max_icd: u32,
    initialized: bool,
    stage: Stage,
    staging: [u8; STAGING_LEN],
    have: usize,
    need: usize,
    report_len: usize,
    layout: Layout,
    pending: Option<Header>,
    data_left: u32,
    digest: DataDigest,
    ddgst: [u8; DIGEST_LEN],
    ddgst_have: usize,
    failure: Option<PduError>,
}

impl Decoder {
    /// A decoder for the PDUs `role` receives on a new connection: the first PDU must be the
    /// ICReq (at a controller) or ICResp (at a host), or a termination request. After it, call
    /// [`Decoder::set_params`] before offering the bytes that follow.
    ///
    /// A controller's in-capsule data limit starts at 0 (Fabrics commands such as Connect may
    /// always carry 8 KiB); raise it with [`Decoder::set_max_icd`] once the queue is known.
    pub fn new(role: Role) -> Decoder {
        Decoder {
            role,
            params: Negotiated::INITIAL,
            max_icd: 0,
            initialized: false,
            stage: Stage::Header,
            staging: [0; STAGING_LEN],
            have: 0,
            need: CH_LEN,
            report_len: CH_LEN,
            layout: Layout { pdu_type: PduType::IcReq, hdgst: false, ddgst: false, pad: 0, data_len: 0 },
            pending: None,
            data_left: 0,
            digest: DataDigest::new(),
            ddgst: [0; DIGEST_LEN],
            ddgst_have: 0,
            failure: None,
        }
    }

    /// A decoder for a connection already initialized with `params` (ICReq/ICResp are then
    /// refused as a PDU sequence error).
    pub fn initialized(role: Role, params: Negotiated, max_icd: u32) -> Decoder {
        let mut d = Decoder::new(role);
        d.params = params;
        d.max_icd = max_icd;
        d.initialized = true;
        d
    }

    /// Sets the parameters the connection's initialization settled; they apply from the next
    /// header on.
    pub fn set_params(&mut self, params: Negotiated) {
        self.params = params;
    }

    /// Sets the largest in-capsule data a CapsuleCmd may carry (at a controller): 8192 on an
    /// admin queue, `(IOCCSZ - 4) * 16` on an I/O queue. Fabrics commands may carry 8192
    /// whatever this says.
    pub fn set_max_icd(&mut self, max_icd: u32) {
        self.max_icd = max_icd;
    }

    /// The end this decoder receives for.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The parameters in force.
    pub fn params(&self) -> &Negotiated {
        &self.params
    }

    /// Whether the ICReq or ICResp has been received (or the decoder started initialized).
    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// The fatal error that stopped the decoder, if one did.
    pub fn failure(&self) -> Option<PduError> {
        self.failure
    }

    /// What comes next.
    pub fn want(&self) -> Want {
        match self.stage {
            Stage::Header => Want::Bytes(self.need - self.have),
            Stage::Pad { left } => Want::Bytes(usize::from(left)),
            Stage::Data => Want::Data(self.data_left),
            Stage::DataDigest => Want::Bytes(DIGEST_LEN - self.ddgst_have),
            Stage::Failed => Want::Closed,
        }
    }

    /// The bytes received of the current PDU's header, at most its HLEN (just the common
    /// header if that was wrong): after a fatal error, the data of the termination request
    /// (which carries at most 128 bytes of it).
    pub fn received_header(&self) -> &[u8] {
        &self.staging[..self.have.min(self.report_len)]
    }

    /// Takes header, padding and data digest bytes from `input`, up to the first event or the
    /// start of data (then [`Decoder::want`] is [`Want::Data`] and `input`'s next bytes are data).
    pub fn feed(&mut self, input: &[u8]) -> Result<Fed, PduError> {
        if let Some(e) = self.failure {
            return Err(e);
        }
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.stage {
                Stage::Header => {
                    let take = (self.need - self.have).min(rest.len());
                    self.staging[self.have..self.have + take].copy_from_slice(&rest[..take]);
                    self.have += take;
                    used += take;
                    if self.have < self.need {
                        return Ok(Fed { consumed: used, event: None });
                    }
                    if self.need == CH_LEN {
                        let mut ch = [0u8; CH_LEN];
                        ch.copy_from_slice(&self.staging[..CH_LEN]);
                        let layout = self.check_common(&CommonHeader::parse(&ch)).map_err(|e| self.fail(e))?;
                        let hlen = usize::from(layout.pdu_type.hlen());
                        self.layout = layout;
                        self.report_len = hlen;
                        self.need = hlen + if layout.hdgst { DIGEST_LEN } else { 0 };
                        continue;
                    }
                    let header = self.check_header().map_err(|e| self.fail(e))?;
                    self.pending = Some(header);
                    if self.layout.pad > 0 {
                        self.stage = Stage::Pad { left: self.layout.pad };
                        continue;
                    }
                    return Ok(Fed { consumed: used, event: Some(self.emit_header()) });
                }
                Stage::Pad { left } => {
                    let take = usize::from(left).min(rest.len());
                    used += take;
                    let left = left - take as u8;
                    if left > 0 {
                        self.stage = Stage::Pad { left };
                        return Ok(Fed { consumed: used, event: None });
                    }
                    return Ok(Fed { consumed: used, event: Some(self.emit_header()) });
                }
                Stage::Data | Stage::Failed => return Ok(Fed { consumed: used, event: None }),
                Stage::DataDigest => {
                    let take = (DIGEST_LEN - self.ddgst_have).min(rest.len());
                    self.ddgst[self.ddgst_have..self.ddgst_have + take].copy_from_slice(&rest[..take]);
                    self.ddgst_have += take;
                    used += take;
                    if self.ddgst_have < DIGEST_LEN {
                        return Ok(Fed { consumed: used, event: None });
                    }
                    let received = digest::from_wire(self.ddgst);
                    let computed = self.digest.finish();
                    self.next_pdu();
                    let event = if received == computed {
                        Event::DataEnd
                    } else {
                        Event::DataDigestError { pdu_type: self.layout.pdu_type, received, computed }
                    };
                    return Ok(Fed { consumed: used, event: Some(event) });
                }
            }
        }
    }

    /// The fast path for the PDU a target receives most: a command capsule whose whole header
    /// (and header digest) starts `input` while the decoder waits for a header. Takes the
    /// header and returns how many bytes that was and the in-capsule data length after it
    /// (then [`Decoder::want`] is [`Want::Data`] if that is not 0, as after
    /// [`Event::Header`]); the SQE is `input[CH_LEN..CH_LEN + 64]`, read in place, not copied
    /// through a [`Header`]. Returns None and takes nothing for anything else (another type,
    /// a header not all here, padding before the data, a Fabrics command, any check that
    /// fails): [`Decoder::feed`] then does the same checks and says what is wrong.
    pub fn capsule_in_place(&mut self, input: &[u8]) -> Option<(usize, u32)> {
        let hlen = usize::from(CAPSULE_CMD_HLEN);
        if self.stage != Stage::Header
            || self.have != 0
            || input.len() < hlen
            || input[0] != PduType::CapsuleCmd.to_u8()
            || input[CH_LEN] == FABRICS_OPCODE
        {
            return None;
        }
        let mut ch = [0u8; CH_LEN];
        ch.copy_from_slice(&input[..CH_LEN]);
        let layout = self.check_common(&CommonHeader::parse(&ch)).ok()?;
        let full = hlen + if layout.hdgst { DIGEST_LEN } else { 0 };
        if input.len() < full || layout.pad != 0 || layout.data_len > self.max_icd {
            return None;
        }
        if layout.hdgst && check_header_digest(layout.pdu_type, &input[..full]).is_err() {
            return None;
        }
        self.layout = layout;
        if layout.data_len > 0 {
            self.stage = Stage::Data;
            self.data_left = layout.data_len;
            self.digest = DataDigest::new();
        }
        Some((full, layout.data_len))
    }

    /// Tells the decoder that the next `chunk.len()` data bytes of the current PDU are
    /// `chunk` (already placed by the caller; they are read for the data digest only). Takes
    /// at most what [`Want::Data`] says; `consumed` tells how many.
    pub fn data(&mut self, chunk: &[u8]) -> Fed {
        if self.stage != Stage::Data {
            return Fed { consumed: 0, event: None };
        }
        let take = chunk.len().min(self.data_left as usize);
        if self.layout.ddgst {
            self.digest.update(&chunk[..take]);
        }
        self.data_left -= take as u32;
        if self.data_left > 0 {
            return Fed { consumed: take, event: None };
        }
        if self.layout.ddgst {
            self.stage = Stage::DataDigest;
            self.ddgst_have = 0;
            return Fed { consumed: take, event: None };
        }
        self.next_pdu();
        Fed { consumed: take, event: Some(Event::DataEnd) }
    }

    /// [`Decoder::data`] for a scatter list, in order; stops at the end of the data.
    pub fn data_sg(&mut self, pieces: &[&[u8]]) -> Fed {
        let mut consumed = 0;
        for piece in pieces {
            let fed = self.data(piece);
            consumed += fed.consumed;
            if fed.event.is_some() || fed.consumed < piece.len() {
                return Fed { consumed, event: fed.event };
            }
        }
        Fed { consumed, event: None }
    }

    fn fail(&mut self, e: PduError) -> PduError {
        self.failure = Some(e);
        self.stage = Stage::Failed;
        e
    }

    fn next_pdu(&mut self) {
        self.stage = Stage::Header;
        self.have = 0;
        self.need = CH_LEN;
        self.report_len = CH_LEN;
    }

    fn emit_header(&mut self) -> Event {
        let header = self.pending.take().expect("a checked header is pending");
        if header.data_len > 0 {
            self.stage = Stage::Data;
            self.data_left = header.data_len;
            self.digest = DataDigest::new();
        } else {
            self.next_pdu();
        }
        Event::Header(header)
    }

    /// Checks the common header against the type's layout and the negotiated parameters, in
    /// field order (PDU-Type, FLAGS, HLEN, PDO, PLEN) so the lowest bad field is reported.
    fn check_common(&self, ch: &CommonHeader) -> Result<Layout, PduError> {
        let t = PduType::from_u8(ch.pdu_type).ok_or(PduError::UnknownType { pdu_type: ch.pdu_type })?;
        if t.direction() != self.role.receives() {
            return Err(PduError::WrongDirection { pdu_type: t });
        }
        if t.is_ic() {
            if self.initialized {
                return Err(PduError::RepeatedIc { pdu_type: t });
            }
        } else if !self.initialized && !t.is_term_req() {
            return Err(PduError::NotInitialized { pdu_type: t });
        }

        let hdgst = t.has_header_digest() && self.params.header_digest;
        let full_hlen = u32::from(t.hlen()) + if hdgst { DIGEST_LEN as u32 } else { 0 };
        let has_data = t.has_data_digest() && ch.plen > full_hlen;
        let ddgst = has_data && self.params.data_digest;

        let f = ch.flags;
        let flags_ok = f & !t.allowed_flags() == 0
            && (f & flags::HDGSTF != 0) == hdgst
            && (f & flags::DDGSTF != 0) == ddgst
            && !(f & flags::SUCCESS != 0 && f & flags::LAST_PDU == 0);
        if !flags_ok {
            return Err(PduError::Flags { pdu_type: t, flags: f });
        }

        if ch.hlen != t.hlen() {
            return Err(PduError::HeaderLength { pdu_type: t, hlen: ch.hlen });
        }

        let pdo = u32::from(ch.pdo);
        let align = pda_bytes(self.params.rx_pda(self.role));
        let aligned_in_pdu = pdo >= full_hlen && pdo % align == 0 && pdo <= ch.plen;
        let pdo_ok = if !t.has_data_digest() {
            pdo == 0
        } else if has_data {
            aligned_in_pdu
        } else {
            pdo == 0 || aligned_in_pdu
        };
        if !pdo_ok {
            return Err(PduError::DataOffset { pdu_type: t, pdo: ch.pdo });
        }

        let plen = ch.plen;
        let bad_plen = PduError::PduLength { pdu_type: t, plen };
        let (pad, data_len) = match t {
            PduType::IcReq | PduType::IcResp => {
                if plen != u32::from(IC_HLEN) {
                    return Err(bad_plen);
                }
                (0, 0)
            }
            PduType::H2cTermReq | PduType::C2hTermReq => {
                if !(u32::from(TERM_REQ_HLEN)..=TERM_REQ_MAX_PLEN).contains(&plen) {
                    return Err(PduError::TermReqLength { pdu_type: t, plen });
                }
                (0, plen - u32::from(TERM_REQ_HLEN))
            }
            PduType::CapsuleResp | PduType::R2t => {
                if plen != full_hlen {
                    return Err(bad_plen);
                }
                (0, 0)
            }
            PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData => {
                if plen < full_hlen {
                    return Err(bad_plen);
                }
                if !has_data {
                    (0, 0)
                } else {
                    let ddgst_len = if ddgst { DIGEST_LEN as u32 } else { 0 };
                    // pdo <= plen was checked with PDO.
                    if plen - pdo <= ddgst_len {
                        return Err(bad_plen);
                    }
                    ((pdo - full_hlen) as u8, plen - pdo - ddgst_len)
                }
            }
        };
        Ok(Layout { pdu_type: t, hdgst, ddgst, pad, data_len })
    }

    /// Checks the header digest and the PDU-specific header of a complete staged header.
    fn check_header(&mut self) -> Result<Header, PduError> {
        let l = self.layout;
        let t = l.pdu_type;
        let hlen = usize::from(t.hlen());
        if l.hdgst {
            check_header_digest(t, &self.staging[..hlen + DIGEST_LEN])?;
        }
        let pdu = Pdu::parse(t, self.staging[1], &self.staging[..hlen]);
        let invalid = |offset: u8, value: u32| PduError::InvalidField { pdu_type: t, offset, value };
        let out_of_range = |offset: u32, len: u32| {
            if u64::from(offset) + u64::from(len) > u64::from(u32::MAX) {
                Err(PduError::OutOfRange { pdu_type: t, offset, len })
            } else {
                Ok(())
            }
        };
        match &pdu {
            Pdu::IcReq(r) => {
                if r.pfv != PFV_1_0 {
                    return Err(PduError::UnsupportedParameter {
                        pdu_type: t,
                        offset: offset::PFV,
                        value: r.pfv.into(),
                    });
                }
                if r.hpda > MAX_PDA {
                    return Err(invalid(offset::HPDA, r.hpda.into()));
                }
            }
            Pdu::IcResp(r) => {
                if r.pfv != PFV_1_0 {
                    return Err(PduError::UnsupportedParameter {
                        pdu_type: t,
                        offset: offset::PFV,
                        value: r.pfv.into(),
                    });
                }
                if r.cpda > MAX_PDA {
                    return Err(invalid(offset::CPDA, r.cpda.into()));
                }
                if r.maxh2cdata < MIN_MAXH2CDATA || r.maxh2cdata % 4 != 0 {
                    return Err(invalid(offset::MAXH2CDATA, r.maxh2cdata));
                }
            }
            Pdu::H2cTermReq(_) | Pdu::C2hTermReq(_) | Pdu::CapsuleResp(_) => {}
            Pdu::CapsuleCmd(c) => {
                let limit = if c.sqe[0] == FABRICS_OPCODE { self.max_icd.max(ADMIN_MAX_ICD) } else { self.max_icd };
                if l.data_len > limit {
                    return Err(PduError::DataLimit { pdu_type: t, len: l.data_len, limit });
                }
            }
            Pdu::H2cData(d) => {
                if d.datal == 0 || d.datal != l.data_len {
                    return Err(invalid(offset::DATAL, d.datal));
                }
                if d.datal > self.params.maxh2cdata {
                    return Err(PduError::DataLimit { pdu_type: t, len: d.datal, limit: self.params.maxh2cdata });
                }
                out_of_range(d.datao, d.datal)?;
            }
            Pdu::C2hData(d) => {
                if d.datal == 0 || d.datal != l.data_len {
                    return Err(invalid(offset::DATAL, d.datal));
                }
                out_of_range(d.datao, d.datal)?;
            }
            Pdu::R2t(r) => {
                if r.r2tl == 0 {
                    return Err(invalid(offset::R2TL, 0));
                }
                out_of_range(r.r2to, r.r2tl)?;
            }
        }
        if t.is_ic() {
            self.initialized = true;
        }
        Ok(Header { pdu, data_len: l.data_len })
    }
}

/// Checks the header digest that ends `header` (a PDU of type `t`: its HLEN bytes, then the
/// digest).
fn check_header_digest(t: PduType, header: &[u8]) -> Result<(), PduError> {
    let hlen = usize::from(t.hlen());
    let mut d = [0u8; DIGEST_LEN];
    d.copy_from_slice(&header[hlen..hlen + DIGEST_LEN]);
    let received = digest::from_wire(d);
    let computed = digest::header_digest(&header[..hlen]);
    if received != computed {
        return Err(PduError::HeaderDigest { pdu_type: t, received, computed });
    }
    Ok(())
}
