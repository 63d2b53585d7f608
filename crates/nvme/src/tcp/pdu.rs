//! NVMe/TCP PDU layouts: the common header, each PDU type's specific header, the flags, and the
//! fatal errors a receiver reports in a termination request.
//!
//! Every PDU starts with the 8-byte common header (CH):
//!
//! | bytes | field    | meaning                                                             |
//! |-------|----------|---------------------------------------------------------------------|
//! | 0     | PDU-Type | [`PduType`]; bit 0 is the direction (0 host to controller)         |
//! | 1     | FLAGS    | [`flags`]: HDGSTF, DDGSTF, and per type LAST_PDU, SUCCESS           |
//! | 2     | HLEN     | length of CH + PDU-specific header (PSH), without the header digest |
//! | 3     | PDO      | offset of the PDU data from the start of the PDU (0 if none)        |
//! | 4..8  | PLEN     | length of the whole PDU: header, digests, padding and data          |
//!
//! then the PSH (up to HLEN), the header digest (4 bytes, if HDGSTF), padding up to PDO, the
//! data, and the data digest (4 bytes, if DDGSTF). All integers are little-endian.
//!
//! Only the layouts live here; [`super::decoder`] checks received PDUs against the negotiated
//! parameters and [`super::encoder`] frames PDUs to send.

use std::fmt;

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// HLEN of ICReq and ICResp.
pub const IC_HLEN: u8 = 128;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_REQ_HLEN: u8 = 24;
/// HLEN of CapsuleCmd: the common header and a 64-byte submission queue entry.
pub const CAPSULE_CMD_HLEN: u8 = 72;
/// HLEN of CapsuleResp: the common header and a 16-byte completion queue entry.
pub const CAPSULE_RESP_HLEN: u8 = 24;
/// HLEN of H2CData and C2HData.
pub const DATA_HLEN: u8 = 24;
/// HLEN of R2T.
pub const R2T_HLEN: u8 = 24;
/// The largest HLEN of any PDU type (ICReq and ICResp).
pub const MAX_HLEN: usize = 128;
/// Most bytes of the offending PDU's header a termination request carries as its data.
pub const TERM_REQ_MAX_DATA: usize = 128;
/// Largest PLEN of a termination request (its header and 128 bytes of data).
pub const TERM_REQ_MAX_PLEN: u32 = TERM_REQ_HLEN as u32 + TERM_REQ_MAX_DATA as u32;
/// Smallest MAXH2CDATA a controller may announce (it must also be a multiple of 4).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Largest HPDA or CPDA (0's based dwords: 31 means 128-byte alignment).
pub const MAX_PDA: u8 = 31;
/// The only PDU format version defined: PFV 0.
pub const PFV_1_0: u16 = 0;
/// Opcode of Fabrics commands (Connect, Property Get/Set, ...) in a submission queue entry.
pub const FABRICS_OPCODE: u8 = 0x7f;
/// In-capsule data that admin and Fabrics commands may always carry (8 KiB).
pub const ADMIN_MAX_ICD: u32 = 8192;

/// Bits of the common header's FLAGS byte.
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): the last data PDU of the transfer (of the R2T for H2CData).
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData only, with LAST_PDU): the command succeeded and no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Byte offsets of header fields from the start of the PDU: the Fatal Error Information of a
/// termination request that reports an invalid field.
pub mod offset {
    /// CH: PDU-Type.
    pub const PDU_TYPE: u8 = 0;
    /// CH: FLAGS.
    pub const FLAGS: u8 = 1;
    /// CH: HLEN.
    pub const HLEN: u8 = 2;
    /// CH: PDO.
    pub const PDO: u8 = 3;
    /// CH: PLEN.
    pub const PLEN: u8 = 4;
    /// ICReq, ICResp: PFV (u16).
    pub const PFV: u8 = 8;
    /// ICReq: HPDA (u8).
    pub const HPDA: u8 = 10;
    /// ICResp: CPDA (u8).
    pub const CPDA: u8 = 10;
    /// ICReq, ICResp: DGST (bit 0 HDGST_ENABLE, bit 1 DDGST_ENABLE).
    pub const DGST: u8 = 11;
    /// ICReq: MAXR2T (u32, 0's based).
    pub const MAXR2T: u8 = 12;
    /// ICResp: MAXH2CDATA (u32).
    pub const MAXH2CDATA: u8 = 12;
    /// H2CTermReq, C2HTermReq: FES (u16).
    pub const FES: u8 = 8;
    /// H2CTermReq, C2HTermReq: FEI (u32).
    pub const FEI: u8 = 10;
    /// CapsuleCmd: the 64-byte submission queue entry.
    pub const SQE: u8 = 8;
    /// CapsuleResp: the 16-byte completion queue entry.
    pub const CQE: u8 = 8;
    /// H2CData, C2HData, R2T: CCCID (u16).
    pub const CCCID: u8 = 8;
    /// H2CData, R2T: TTAG (u16).
    pub const TTAG: u8 = 10;
    /// H2CData, C2HData: DATAO (u32).
    pub const DATAO: u8 = 12;
    /// H2CData, C2HData: DATAL (u32).
    pub const DATAL: u8 = 16;
    /// R2T: R2TO (u32).
    pub const R2TO: u8 = 12;
    /// R2T: R2TL (u32).
    pub const R2TL: u8 = 16;
}

/// Which way a PDU travels (bit 0 of its type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to controller (H2C): even types.
    HostToController,
    /// Controller to host (C2H): odd types.
    ControllerToHost,
}

/// The end of a connection: what it receives and what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The host (initiator): sends H2C PDUs, receives C2H PDUs.
    Host,
    /// The controller (target): sends C2H PDUs, receives H2C PDUs.
    Controller,
}

impl Role {
    /// The direction of the PDUs this end receives.
    pub fn receives(self) -> Direction {
        match self {
            Role::Host => Direction::ControllerToHost,
            Role::Controller => Direction::HostToController,
        }
    }

    /// The direction of the PDUs this end sends.
    pub fn sends(self) -> Direction {
        match self {
            Role::Host => Direction::HostToController,
            Role::Controller => Direction::ControllerToHost,
        }
    }
}

/// The PDU types of NVMe/TCP 1.0. Any other value (08h, 0Ah and up, which later revisions use
/// for TLS key delivery and authentication) is refused as an invalid PDU-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// 00h: Initialize Connection Request, host to controller.
    IcReq = 0x00,
    /// 01h: Initialize Connection Response, controller to host.
    IcResp = 0x01,
    /// 02h: Host to Controller Terminate Connection Request.
    H2cTermReq = 0x02,
    /// 03h: Controller to Host Terminate Connection Request.
    C2hTermReq = 0x03,
    /// 04h: Command Capsule, with optional in-capsule data.
    CapsuleCmd = 0x04,
    /// 05h: Response Capsule.
    CapsuleResp = 0x05,
    /// 06h: Host to Controller Data.
    H2cData = 0x06,
    /// 07h: Controller to Host Data.
    C2hData = 0x07,
    /// 09h: Ready to Transfer.
    R2t = 0x09,
}

impl PduType {
    /// The type for a PDU-Type byte, if NVMe/TCP 1.0 defines it.
    pub fn from_u8(v: u8) -> Option<PduType> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// The PDU-Type byte.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// Which way this type travels.
    pub fn direction(self) -> Direction {
        if self.to_u8() & 1 == 0 {
            Direction::HostToController
        } else {
            Direction::ControllerToHost
        }
    }

    /// The HLEN every PDU of this type has.
    pub fn hlen(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp => IC_HLEN,
            PduType::H2cTermReq | PduType::C2hTermReq => TERM_REQ_HLEN,
            PduType::CapsuleCmd => CAPSULE_CMD_HLEN,
            PduType::CapsuleResp => CAPSULE_RESP_HLEN,
            PduType::H2cData | PduType::C2hData => DATA_HLEN,
            PduType::R2t => R2T_HLEN,
        }
    }

    /// Whether the type is one of the two connection-initialization PDUs.
    pub fn is_ic(self) -> bool {
        matches!(self, PduType::IcReq | PduType::IcResp)
    }

    /// Whether the type is one of the two termination requests.
    pub fn is_term_req(self) -> bool {
        matches!(self, PduType::H2cTermReq | PduType::C2hTermReq)
    }

    /// Whether PDUs of this type carry a header digest when header digests are enabled
    /// (all but the initialization and termination PDUs).
    pub fn has_header_digest(self) -> bool {
        !self.is_ic() && !self.is_term_req()
    }

    /// Whether PDUs of this type may carry data placed at PDO with a data digest when data
    /// digests are enabled: CapsuleCmd (in-capsule data), H2CData and C2HData. Termination
    /// requests also carry data (the offending header), right after their header, undigested.
    pub fn has_data_digest(self) -> bool {
        matches!(self, PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData)
    }

    /// The FLAGS bits this type defines; any other bit set is an invalid header field.
    pub fn allowed_flags(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq => 0,
            PduType::CapsuleCmd => flags::HDGSTF | flags::DDGSTF,
            PduType::CapsuleResp | PduType::R2t => flags::HDGSTF,
            PduType::H2cData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU,
            PduType::C2hData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU | flags::SUCCESS,
        }
    }
}

impl fmt::Display for PduType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            PduType::IcReq => "ICReq",
            PduType::IcResp => "ICResp",
            PduType::H2cTermReq => "H2CTermReq",
            PduType::C2hTermReq => "C2HTermReq",
            PduType::CapsuleCmd => "CapsuleCmd",
            PduType::CapsuleResp => "CapsuleResp",
            PduType::H2cData => "H2CData",
            PduType::C2hData => "C2HData",
            PduType::R2t => "R2T",
        };
        f.write_str(name)
    }
}

/// The common header's fields, as received (nothing checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU-Type.
    pub pdu_type: u8,
    /// FLAGS.
    pub flags: u8,
    /// HLEN.
    pub hlen: u8,
    /// PDO.
    pub pdo: u8,
    /// PLEN.
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the 8 bytes of a common header.
    pub fn parse(b: &[u8; CH_LEN]) -> CommonHeader {
        CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Writes the 8 bytes of a common header.
    pub fn write(&self, out: &mut [u8; CH_LEN]) {
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        out[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }
}

/// ICReq's specific header: the host's connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PFV: PDU format version (0).
    pub pfv: u16,
    /// HPDA: alignment of data in C2H PDUs, 0's based dwords (0..=31: 4 to 128 bytes).
    pub hpda: u8,
    /// DGST bit 0: the host asks for header digests.
    pub hdgst: bool,
    /// DGST bit 1: the host asks for data digests.
    pub ddgst: bool,
    /// MAXR2T: outstanding R2Ts per command the host accepts, 0's based.
    pub maxr2t: u32,
}

/// ICResp's specific header: the controller's answer to ICReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PFV: PDU format version (0).
    pub pfv: u16,
    /// CPDA: alignment of data in H2C PDUs, 0's based dwords (0..=31: 4 to 128 bytes).
    pub cpda: u8,
    /// DGST bit 0: header digests are enabled.
    pub hdgst: bool,
    /// DGST bit 1: data digests are enabled.
    pub ddgst: bool,
    /// MAXH2CDATA: most data bytes in one H2CData PDU (at least 4096, a multiple of 4).
    pub maxh2cdata: u32,
}

/// H2CTermReq's and C2HTermReq's specific header. The data that follows (at most 128 bytes)
/// is the header of the PDU in error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// FES: Fatal Error Status, as received ([`Fes::from_u16`] names it).
    pub fes: u16,
    /// FEI: Fatal Error Information (the byte offset of the bad field for FES 01h and 06h,
    /// reserved otherwise).
    pub fei: u32,
}

/// CapsuleCmd's specific header: a submission queue entry (parsed by `crate::spec`). In-capsule
/// data, if any, follows as the PDU's data.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CapsuleCmd {
    /// The 64-byte SQE as sent.
    pub sqe: [u8; 64],
}

impl fmt::Debug for CapsuleCmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cid = u16::from_le_bytes([self.sqe[2], self.sqe[3]]);
        f.debug_struct("CapsuleCmd").field("opcode", &self.sqe[0]).field("cid", &cid).finish_non_exhaustive()
    }
}

/// CapsuleResp's specific header: a completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleResp {
    /// The 16-byte CQE as sent.
    pub cqe: [u8; 16],
}

/// H2CData's specific header: write data the controller asked for with an R2T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2cData {
    /// CCCID: the command's identifier.
    pub cccid: u16,
    /// TTAG: the transfer tag of the R2T this answers.
    pub ttag: u16,
    /// DATAO: offset of this data in the command's data.
    pub datao: u32,
    /// DATAL: length of this PDU's data.
    pub datal: u32,
    /// FLAGS LAST_PDU: the last H2CData PDU of the R2T's transfer.
    pub last: bool,
}

/// C2HData's specific header: read data for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct C2hData {
    /// CCCID: the command's identifier.
    pub cccid: u16,
    /// DATAO: offset of this data in the command's data.
    pub datao: u32,
    /// DATAL: length of this PDU's data.
    pub datal: u32,
    /// FLAGS LAST_PDU: the last C2HData PDU of the command.
    pub last: bool,
    /// FLAGS SUCCESS: the command completed successfully and no CapsuleResp follows (only
    /// with `last`).
    pub success: bool,
}

/// R2T's specific header: the controller asks for a range of a command's write data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// CCCID: the command's identifier.
    pub cccid: u16,
    /// TTAG: a tag the H2CData PDUs answering this R2T carry.
    pub ttag: u16,
    /// R2TO: offset of the requested range in the command's data.
    pub r2to: u32,
    /// R2TL: length of the requested range (the host may split it into several H2CData PDUs
    /// of at most MAXH2CDATA bytes).
    pub r2tl: u32,
}

/// A PDU's header, typed: everything but the padding, data and digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq.
    H2cTermReq(TermReq),
    /// C2HTermReq.
    C2hTermReq(TermReq),
    /// CapsuleCmd.
    CapsuleCmd(CapsuleCmd),
    /// CapsuleResp.
    CapsuleResp(CapsuleResp),
    /// H2CData.
    H2cData(H2cData),
    /// C2HData.
    C2hData(C2hData),
    /// R2T.
    R2t(R2t),
}

fn le16(h: &[u8], at: u8) -> u16 {
    let at = at as usize;
    u16::from_le_bytes([h[at], h[at + 1]])
}

fn le32(h: &[u8], at: u8) -> u32 {
    let at = at as usize;
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

fn put16(h: &mut [u8], at: u8, v: u16) {
    let at = at as usize;
    h[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(h: &mut [u8], at: u8, v: u32) {
    let at = at as usize;
    h[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

const DGST_HDGST: u8 = 1 << 0;
const DGST_DDGST: u8 = 1 << 1;

impl Pdu {
    /// The PDU's type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2cTermReq(_) => PduType::H2cTermReq,
            Pdu::C2hTermReq(_) => PduType::C2hTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2cData(_) => PduType::H2cData,
            Pdu::C2hData(_) => PduType::C2hData,
            Pdu::R2t(_) => PduType::R2t,
        }
    }

    /// The type-specific FLAGS bits the header carries (LAST_PDU, SUCCESS); the digest flags
    /// are framing and not part of the value.
    pub fn type_flags(&self) -> u8 {
        match self {
            Pdu::H2cData(d) => bit(d.last, flags::LAST_PDU),
            Pdu::C2hData(d) => bit(d.last, flags::LAST_PDU) | bit(d.success, flags::SUCCESS),
            _ => 0,
        }
    }

    /// Reads the typed header of a PDU of type `t` from its first HLEN bytes `header` (at
    /// least `t.hlen()` long) and its FLAGS. Reserved bytes and bits are ignored; nothing is
    /// checked (the decoder does that).
    pub fn parse(t: PduType, flag_bits: u8, header: &[u8]) -> Pdu {
        use offset::*;
        let h = header;
        match t {
            PduType::IcReq => Pdu::IcReq(IcReq {
                pfv: le16(h, PFV),
                hpda: h[HPDA as usize],
                hdgst: h[DGST as usize] & DGST_HDGST != 0,
                ddgst: h[DGST as usize] & DGST_DDGST != 0,
                maxr2t: le32(h, MAXR2T),
            }),
            PduType::IcResp => Pdu::IcResp(IcResp {
                pfv: le16(h, PFV),
                cpda: h[CPDA as usize],
                hdgst: h[DGST as usize] & DGST_HDGST != 0,
                ddgst: h[DGST as usize] & DGST_DDGST != 0,
                maxh2cdata: le32(h, MAXH2CDATA),
            }),
            PduType::H2cTermReq => Pdu::H2cTermReq(TermReq { fes: le16(h, FES), fei: le32(h, FEI) }),
            PduType::C2hTermReq => Pdu::C2hTermReq(TermReq { fes: le16(h, FES), fei: le32(h, FEI) }),
            PduType::CapsuleCmd => {
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&h[SQE as usize..SQE as usize + 64]);
                Pdu::CapsuleCmd(CapsuleCmd { sqe })
            }
            PduType::CapsuleResp => {
                let mut cqe = [0u8; 16];
                cqe.copy_from_slice(&h[CQE as usize..CQE as usize + 16]);
                Pdu::CapsuleResp(CapsuleResp { cqe })
            }
            PduType::H2cData => Pdu::H2cData(H2cData {
                cccid: le16(h, CCCID),
                ttag: le16(h, TTAG),
                datao: le32(h, DATAO),
                datal: le32(h, DATAL),
                last: flag_bits & flags::LAST_PDU != 0,
            }),
            PduType::C2hData => Pdu::C2hData(C2hData {
                cccid: le16(h, CCCID),
                datao: le32(h, DATAO),
                datal: le32(h, DATAL),
                last: flag_bits & flags::LAST_PDU != 0,
                success: flag_bits & flags::SUCCESS != 0,
            }),
            PduType::R2t => {
                Pdu::R2t(R2t { cccid: le16(h, CCCID), ttag: le16(h, TTAG), r2to: le32(h, R2TO), r2tl: le32(h, R2TL) })
            }
        }
    }

    /// Writes the PDU-specific header into `header[8..hlen]`, reserved bytes zeroed. `header`
    /// must be at least `self.pdu_type().hlen()` long; the common header is left alone.
    pub fn write_psh(&self, header: &mut [u8]) {
        use offset::*;
        let hlen = self.pdu_type().hlen() as usize;
        let h = &mut header[..hlen];
        h[CH_LEN..].fill(0);
        match self {
            Pdu::IcReq(r) => {
                put16(h, PFV, r.pfv);
                h[HPDA as usize] = r.hpda;
                h[DGST as usize] = dgst_byte(r.hdgst, r.ddgst);
                put32(h, MAXR2T, r.maxr2t);
            }
            Pdu::IcResp(r) => {
                put16(h, PFV, r.pfv);
                h[CPDA as usize] = r.cpda;
                h[DGST as usize] = dgst_byte(r.hdgst, r.ddgst);
                put32(h, MAXH2CDATA, r.maxh2cdata);
            }
            Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t) => {
                put16(h, FES, t.fes);
                put32(h, FEI, t.fei);
            }
            Pdu::CapsuleCmd(c) => h[SQE as usize..SQE as usize + 64].copy_from_slice(&c.sqe),
            Pdu::CapsuleResp(c) => h[CQE as usize..CQE as usize + 16].copy_from_slice(&c.cqe),
            Pdu::H2cData(d) => {
                put16(h, CCCID, d.cccid);
                put16(h, TTAG, d.ttag);
                put32(h, DATAO, d.datao);
                put32(h, DATAL, d.datal);
            }
            Pdu::C2hData(d) => {
                put16(h, CCCID, d.cccid);
                put32(h, DATAO, d.datao);
                put32(h, DATAL, d.datal);
            }
            Pdu::R2t(r) => {
                put16(h, CCCID, r.cccid);
                put16(h, TTAG, r.ttag);
                put32(h, R2TO, r.r2to);
                put32(h, R2TL, r.r2tl);
            }
        }
    }
}

fn bit(set: bool, mask: u8) -> u8 {
    if set {
        mask
    } else {
        0
    }
}

fn dgst_byte(hdgst: bool, ddgst: bool) -> u8 {
    bit(hdgst, DGST_HDGST) | bit(ddgst, DGST_DDGST)
}

/// Fatal Error Status: why a termination request ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// 01h Invalid PDU Header Field; FEI is the byte offset of the field.
    InvalidHeaderField = 0x01,
    /// 02h PDU Sequence Error: a PDU that may not come now.
    PduSequenceError = 0x02,
    /// 03h Header Digest Error.
    HeaderDigestError = 0x03,
    /// 04h Data Transfer Out of Range.
    DataTransferOutOfRange = 0x04,
    /// 05h Data Transfer Limit Exceeded (named R2T Limit Exceeded in NVMe-oF 1.0 and 1.1).
    DataTransferLimitExceeded = 0x05,
    /// 06h Unsupported Parameter; FEI is the byte offset of the field.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The status for a received FES value, if defined.
    pub fn from_u16(v: u16) -> Option<Fes> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataTransferOutOfRange,
            0x05 => Fes::DataTransferLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }

    /// The FES value on the wire.
    pub fn to_u16(self) -> u16 {
        self as u16
    }

    /// Whether FEI means something for this status (a field offset); otherwise it is
    /// reserved and sent as 0.
    pub fn has_fei(self) -> bool {
        matches!(self, Fes::InvalidHeaderField | Fes::UnsupportedParameter)
    }
}

impl fmt::Display for Fes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Fes::InvalidHeaderField => "Invalid PDU Header Field",
            Fes::PduSequenceError => "PDU Sequence Error",
            Fes::HeaderDigestError => "Header Digest Error",
            Fes::DataTransferOutOfRange => "Data Transfer Out of Range",
            Fes::DataTransferLimitExceeded => "Data Transfer Limit Exceeded",
            Fes::UnsupportedParameter => "Unsupported Parameter",
        };
        f.write_str(name)
    }
}

/// A received PDU that breaks the protocol. Every one is fatal: the receiver sends a
/// termination request with [`PduError::fes`] and [`PduError::fei`] (unless `fes` is `None`)
/// and closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PduError {
    /// PDU-Type is not an NVMe/TCP 1.0 type. FES 01h at PDU-Type.
    UnknownType {
        /// The PDU-Type byte.
        pdu_type: u8,
    },
    /// A PDU that only the other end receives (a CapsuleResp sent to a controller, say).
    /// FES 01h at PDU-Type.
    WrongDirection {
        /// The PDU's type.
        pdu_type: PduType,
    },
    /// A PDU other than ICReq/ICResp or a termination request before the connection was
    /// initialized. FES 02h.
    NotInitialized {
        /// The PDU's type.
        pdu_type: PduType,
    },
    /// A second ICReq or ICResp. FES 02h.
    RepeatedIc {
        /// The PDU's type.
        pdu_type: PduType,
    },
    /// FLAGS has a bit the type does not define, a digest flag that disagrees with the
    /// negotiated digests (DDGSTF goes with data only), or SUCCESS without LAST_PDU.
    /// FES 01h at FLAGS.
    Flags {
        /// The PDU's type.
        pdu_type: PduType,
        /// The FLAGS byte.
        flags: u8,
    },
    /// HLEN is not the type's. FES 01h at HLEN.
    HeaderLength {
        /// The PDU's type.
        pdu_type: PduType,
        /// The HLEN byte.
        hlen: u8,
    },
    /// PDO is not 0 for a type without aligned data, or data would start inside the header,
    /// past PLEN, or off the negotiated alignment. FES 01h at PDO.
    DataOffset {
        /// The PDU's type.
        pdu_type: PduType,
        /// The PDO byte.
        pdo: u8,
    },
    /// PLEN disagrees with HLEN, PDO and the digests (or leaves no data after PDO).
    /// FES 01h at PLEN.
    PduLength {
        /// The PDU's type.
        pdu_type: PduType,
        /// The PLEN field.
        plen: u32,
    },
    /// A termination request whose PLEN is outside 24..=152: the connection is closed without
    /// a termination request in reply (`fes` is `None`).
    TermReqLength {
        /// The PDU's type.
        pdu_type: PduType,
        /// The PLEN field.
        plen: u32,
    },
    /// The header digest does not match the header. FES 03h.
    HeaderDigest {
        /// The PDU's type.
        pdu_type: PduType,
        /// The digest received.
        received: u32,
        /// The digest of the header received.
        computed: u32,
    },
    /// A PDU-specific header field holds an invalid value (HPDA or CPDA above 31, MAXH2CDATA
    /// below 4096 or not a multiple of 4, DATAL other than the data PLEN leaves, a zero DATAL
    /// or R2TL). FES 01h at the field.
    InvalidField {
        /// The PDU's type.
        pdu_type: PduType,
        /// The field's byte offset in the PDU.
        offset: u8,
        /// The field's value.
        value: u32,
    },
    /// A field holds a value this end does not support (a PFV other than 0, a digest the
    /// host did not ask for). FES 06h at the field.
    UnsupportedParameter {
        /// The PDU's type.
        pdu_type: PduType,
        /// The field's byte offset in the PDU.
        offset: u8,
        /// The field's value.
        value: u32,
    },
    /// More data than allowed in one PDU: an H2CData over MAXH2CDATA, or in-capsule data over
    /// the queue's limit. FES 05h.
    DataLimit {
        /// The PDU's type.
        pdu_type: PduType,
        /// The PDU's data length.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// A command capsule while the queue already holds as many commands as it has entries
    /// (SQSIZE + 1): the host ignored submission queue flow control. FES 02h.
    QueueFull {
        /// The queue's entries.
        entries: u16,
    },
    /// DATAO + DATAL (R2TO + R2TL) reaches past 2^32 bytes: out of any command's range.
    /// FES 04h.
    OutOfRange {
        /// The PDU's type.
        pdu_type: PduType,
        /// DATAO or R2TO.
        offset: u32,
        /// DATAL or R2TL.
        len: u32,
    },
}

impl PduError {
    /// The Fatal Error Status to report in a termination request, or `None` when the spec has
    /// the connection closed without one.
    pub fn fes(&self) -> Option<Fes> {
        Some(match self {
            PduError::UnknownType { .. }
            | PduError::WrongDirection { .. }
            | PduError::Flags { .. }
            | PduError::HeaderLength { .. }
            | PduError::DataOffset { .. }
            | PduError::PduLength { .. }
            | PduError::InvalidField { .. } => Fes::InvalidHeaderField,
            PduError::NotInitialized { .. } | PduError::RepeatedIc { .. } | PduError::QueueFull { .. } => {
                Fes::PduSequenceError
            }
            PduError::HeaderDigest { .. } => Fes::HeaderDigestError,
            PduError::OutOfRange { .. } => Fes::DataTransferOutOfRange,
            PduError::DataLimit { .. } => Fes::DataTransferLimitExceeded,
            PduError::UnsupportedParameter { .. } => Fes::UnsupportedParameter,
            PduError::TermReqLength { .. } => return None,
        })
    }

    /// The Fatal Error Information: the byte offset of the offending field from the start of
    /// the PDU for FES 01h and 06h, 0 (reserved) otherwise.
    pub fn fei(&self) -> u32 {
        u32::from(match self {
            PduError::UnknownType { .. } | PduError::WrongDirection { .. } => offset::PDU_TYPE,
            PduError::Flags { .. } => offset::FLAGS,
            PduError::HeaderLength { .. } => offset::HLEN,
            PduError::DataOffset { .. } => offset::PDO,
            PduError::PduLength { .. } => offset::PLEN,
            PduError::InvalidField { offset, .. } | PduError::UnsupportedParameter { offset, .. } => *offset,
            _ => 0,
        })
    }

    /// The type of the PDU in error, if it had a known one.
    pub fn pdu_type(&self) -> Option<PduType> {
        match *self {
            PduError::UnknownType { .. } => None,
            PduError::QueueFull { .. } => Some(PduType::CapsuleCmd),
            PduError::WrongDirection { pdu_type }
            | PduError::NotInitialized { pdu_type }
            | PduError::RepeatedIc { pdu_type }
            | PduError::Flags { pdu_type, .. }
            | PduError::HeaderLength { pdu_type, .. }
            | PduError::DataOffset { pdu_type, .. }
            | PduError::PduLength { pdu_type, .. }
            | PduError::TermReqLength { pdu_type, .. }
            | PduError::HeaderDigest { pdu_type, .. }
            | PduError::InvalidField { pdu_type, .. }
            | PduError::UnsupportedParameter { pdu_type, .. }
            | PduError::DataLimit { pdu_type, .. }
            | PduError::OutOfRange { pdu_type, .. } => Some(pdu_type),
        }
    }
}

impl fmt::Display for PduError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PduError::UnknownType { pdu_type } => write!(f, "unknown NVMe/TCP PDU type {pdu_type:#04x}"),
            PduError::WrongDirection { pdu_type } => write!(f, "{pdu_type} PDU sent the wrong way"),
            PduError::NotInitialized { pdu_type } => write!(f, "{pdu_type} before connection initialization"),
            PduError::RepeatedIc { pdu_type } => write!(f, "second {pdu_type} on the connection"),
            PduError::Flags { pdu_type, flags } => write!(f, "{pdu_type} with invalid FLAGS {flags:#04x}"),
            PduError::HeaderLength { pdu_type, hlen } => {
                write!(f, "{pdu_type} with HLEN {hlen}, expected {}", pdu_type.hlen())
            }
            PduError::DataOffset { pdu_type, pdo } => write!(f, "{pdu_type} with invalid PDO {pdo}"),
            PduError::PduLength { pdu_type, plen } => write!(f, "{pdu_type} with invalid PLEN {plen}"),
            PduError::TermReqLength { pdu_type, plen } => write!(f, "{pdu_type} with PLEN {plen} outside 24..=152"),
            PduError::HeaderDigest { pdu_type, received, computed } => {
                write!(f, "{pdu_type} header digest {received:#010x}, computed {computed:#010x}")
            }
            PduError::InvalidField { pdu_type, offset, value } => {
                write!(f, "{pdu_type} with invalid value {value:#x} at byte {offset}")
            }
            PduError::UnsupportedParameter { pdu_type, offset, value } => {
                write!(f, "{pdu_type} with unsupported value {value:#x} at byte {offset}")
            }
            PduError::DataLimit { pdu_type, len, limit } => {
                write!(f, "{pdu_type} carries {len} data bytes, more than the limit of {limit}")
            }
            PduError::OutOfRange { pdu_type, offset, len } => {
                write!(f, "{pdu_type} data range {offset}+{len} past 2^32")
            }
            PduError::QueueFull { entries } => {
                write!(f, "CapsuleCmd with {entries} commands outstanding, all the queue's entries")
            }
        }?;
        if let Some(fes) = self.fes() {
            write!(f, " ({fes}")?;
            if fes.has_fei() {
                write!(f, ", FEI {}", self.fei())?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl std::error::Error for PduError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_directions() {
        for v in 0u8..=255 {
            let Some(t) = PduType::from_u8(v) else {
                assert!(v == 8 || v > 9, "{v}");
                continue;
            };
            assert_eq!(t.to_u8(), v);
            let h2c = [PduType::IcReq, PduType::H2cTermReq, PduType::CapsuleCmd, PduType::H2cData];
            assert_eq!(t.direction() == Direction::HostToController, h2c.contains(&t), "{t}");
        }
        assert_eq!(PduType::R2t.direction(), Direction::ControllerToHost);
        assert_eq!(Role::Controller.receives(), Direction::HostToController);
        assert_eq!(Role::Host.sends(), Direction::HostToController);
    }

    #[test]
    fn fes_values() {
        for v in 0u16..10 {
            match Fes::from_u16(v) {
                Some(f) => assert_eq!(f.to_u16(), v),
                None => assert!(v == 0 || v > 6),
            }
        }
        assert!(Fes::InvalidHeaderField.has_fei() && Fes::UnsupportedParameter.has_fei());
        assert!(!Fes::HeaderDigestError.has_fei());
    }

    #[test]
    fn common_header_layout() {
        let b = [0x04, 0x03, 72, 76, 0x10, 0x02, 0x00, 0x00];
        let ch = CommonHeader::parse(&b);
        assert_eq!(ch, CommonHeader { pdu_type: 4, flags: 3, hlen: 72, pdo: 76, plen: 0x210 });
        let mut out = [0u8; 8];
        ch.write(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn errors_carry_fes_and_fei() {
        let e = PduError::InvalidField { pdu_type: PduType::IcReq, offset: offset::HPDA, value: 40 };
        assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidHeaderField), 10));
        let e = PduError::UnsupportedParameter { pdu_type: PduType::IcReq, offset: offset::PFV, value: 1 };
        assert_eq!((e.fes(), e.fei()), (Some(Fes::UnsupportedParameter), 8));
        let e = PduError::HeaderDigest { pdu_type: PduType::R2t, received: 1, computed: 2 };
        assert_eq!((e.fes(), e.fei()), (Some(Fes::HeaderDigestError), 0));
        let e = PduError::TermReqLength { pdu_type: PduType::C2hTermReq, plen: 200 };
        assert_eq!(e.fes(), None);
        assert_eq!(PduError::PduLength { pdu_type: PduType::R2t, plen: 1 }.fei(), 4);
        assert_eq!(
            PduError::Flags { pdu_type: PduType::R2t, flags: 2 }.to_string(),
            "R2T with invalid FLAGS 0x02 (Invalid PDU Header Field, FEI 1)"
        );
    }
}
