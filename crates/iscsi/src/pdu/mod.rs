//! iSCSI PDUs (RFC 7143 section 11): the 48-byte Basic Header Segment of every opcode, the
//! Additional Header Segments, the framing of a whole PDU, and the errors a receiver reports.
//!
//! A PDU on the wire:
//!
//! | part | length | present |
//! |---|---|---|
//! | Basic Header Segment (BHS) | 48 | always |
//! | Additional Header Segments (AHS) | TotalAHSLength × 4 (≤ 1020) | if TotalAHSLength > 0 |
//! | header digest (CRC32C of BHS and AHS) | 4 | if HeaderDigest=CRC32C |
//! | data segment | DataSegmentLength (< 2^24) | if DataSegmentLength > 0 |
//! | padding to 4 bytes (zeroes) | 0..=3 | if the data length is not a multiple of 4 |
//! | data digest (CRC32C of data and padding) | 4 | if DataDigest=CRC32C and there is data |
//!
//! BHS bytes 0..20 are common: byte 0 holds the immediate bit (0x40) and the 6-bit opcode,
//! byte 1 the final bit (0x80) and opcode-specific flags, byte 4 TotalAHSLength (in 4-byte
//! words), bytes 5..8 DataSegmentLength (bytes, without padding), bytes 8..16 the LUN or
//! opcode-specific fields, bytes 16..20 the Initiator Task Tag. Integers are big-endian.
//!
//! - [`types`]: the typed header of each opcode ([`Pdu`]) and the codes in its fields;
//! - [`ahs`]: the AHS (extended CDB, bidirectional read length);
//! - [`decoder`]: a streaming receive side that stages headers only ([`Decoder`]);
//! - [`encoder`]: the send side, into caller buffers, data left in place ([`encode`]);
//! - [`frame`]: how long a PDU is from its first bytes, and a one-shot decode of a whole PDU.

use std::fmt;

pub mod ahs;
pub mod decoder;
pub mod encoder;
pub mod frame;
pub mod types;

pub use ahs::{Ahs, AhsInfo, AhsType, Cdb};
pub use decoder::{Decoder, Event, Fed, Invalid, Want};
pub use encoder::{encode, encode_contiguous, encode_to_vec, EncodeError, Framing, MAX_HEAD_LEN};
pub use frame::{check_header, decode_whole, frame_status, pdu_len, Decoded, DigestCheck, FrameStatus, Header};
pub use types::*;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// Most AHS bytes a PDU can carry: TotalAHSLength is one byte of 4-byte words.
pub const MAX_AHS_LEN: usize = 255 * 4;
/// Largest header a receiver stages: BHS, the largest AHS and a header digest.
pub const MAX_HEADER_LEN: usize = BHS_LEN + MAX_AHS_LEN + DIGEST_LEN;
/// Largest DataSegmentLength the 24-bit field can hold.
pub const MAX_DATA_SEGMENT_LENGTH: u32 = (1 << 24) - 1;
/// MaxRecvDataSegmentLength before (and during) login: RFC 7143 section 13.12's default.
pub const DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// The reserved tag value: "no task" in ITT, "no transfer" in TTT, "none" in SNACK Tag.
pub const RESERVED_TAG: u32 = 0xffff_ffff;
/// The only iSCSI version (Version-max, Version-min, Version-active): 0x00.
pub const ISCSI_VERSION: u8 = 0x00;

/// Bytes of zero padding after `len` data bytes (0..=3).
pub const fn padding(len: u32) -> u32 {
    (4 - (len & 3)) & 3
}

/// What a PDU's receiver needs to know to frame and check it: the digests (as negotiated for
/// the connection; none during login) and the largest data segment it accepts (its own
/// MaxRecvDataSegmentLength; 8192 during login). A sender uses the same struct with the
/// peer's MaxRecvDataSegmentLength.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PduParams {
    /// A CRC32C header digest follows the BHS and AHS.
    pub header_digest: bool,
    /// A CRC32C data digest follows the data and its padding (PDUs without data have none).
    pub data_digest: bool,
    /// Largest DataSegmentLength accepted.
    pub max_data_segment: u32,
}

impl PduParams {
    /// The login phase's parameters: no digests, 8192-byte data segments.
    pub const LOGIN: PduParams =
        PduParams { header_digest: false, data_digest: false, max_data_segment: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH };

    /// Length of the header digest (0 or 4).
    pub fn header_digest_len(&self) -> usize {
        if self.header_digest {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// The end of a connection: which opcodes it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends initiator opcodes, receives target opcodes.
    Initiator,
    /// Sends target opcodes, receives initiator opcodes.
    Target,
}

impl Role {
    /// The other end.
    pub fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Target,
            Role::Target => Role::Initiator,
        }
    }
}

/// Byte offsets of BHS fields (the common ones and those several opcodes share).
pub mod offset {
    /// Immediate bit and opcode.
    pub const OPCODE: u8 = 0;
    /// Flags (F and opcode-specific bits).
    pub const FLAGS: u8 = 1;
    /// Opcode-specific byte 2 (Response, Reason, Version-max).
    pub const BYTE2: u8 = 2;
    /// Opcode-specific byte 3 (Status, Version-min/active).
    pub const BYTE3: u8 = 3;
    /// TotalAHSLength.
    pub const TOTAL_AHS_LENGTH: u8 = 4;
    /// DataSegmentLength (24 bits).
    pub const DATA_SEGMENT_LENGTH: u8 = 5;
    /// LUN (8 bytes) or ISID (6) and TSIH (2).
    pub const LUN: u8 = 8;
    /// Initiator Task Tag.
    pub const ITT: u8 = 16;
    /// Target Transfer Tag, Referenced Task Tag, Expected Data Transfer Length, CID, SNACK Tag.
    pub const WORD20: u8 = 20;
    /// CmdSN or StatSN.
    pub const WORD24: u8 = 24;
    /// ExpStatSN or ExpCmdSN.
    pub const WORD28: u8 = 28;
    /// MaxCmdSN, RefCmdSN, or the CDB's start.
    pub const WORD32: u8 = 32;
    /// DataSN, R2TSN, ExpDataSN, AsyncEvent, Status-Class.
    pub const WORD36: u8 = 36;
    /// BufferOffset, BegRun, Time2Wait, residual counts.
    pub const WORD40: u8 = 40;
    /// DesiredDataTransferLength, RunLength, ResidualCount.
    pub const WORD44: u8 = 44;
}

pub(crate) fn be16(b: &[u8], at: u8) -> u16 {
    let at = at as usize;
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be24(b: &[u8], at: u8) -> u32 {
    let at = at as usize;
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

pub(crate) fn be32(b: &[u8], at: u8) -> u32 {
    let at = at as usize;
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: u8) -> u64 {
    let at = at as usize;
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

pub(crate) fn put16(b: &mut [u8], at: u8, v: u16) {
    let at = at as usize;
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put24(b: &mut [u8], at: u8, v: u32) {
    debug_assert!(v <= MAX_DATA_SEGMENT_LENGTH);
    let at = at as usize;
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn put32(b: &mut [u8], at: u8, v: u32) {
    let at = at as usize;
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: u8, v: u64) {
    let at = at as usize;
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// TotalAHSLength of a BHS, in bytes.
pub fn total_ahs_len(bhs: &[u8; BHS_LEN]) -> usize {
    usize::from(bhs[offset::TOTAL_AHS_LENGTH as usize]) * 4
}

/// DataSegmentLength of a BHS.
pub fn data_segment_len(bhs: &[u8; BHS_LEN]) -> u32 {
    be24(bhs, offset::DATA_SEGMENT_LENGTH)
}

/// Reject PDU reasons (RFC 7143 section 11.17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// 0x02 Data (payload) digest error; the PDU may be resent (ERL > 0).
    DataDigestError = 0x02,
    /// 0x03 SNACK reject.
    SnackReject = 0x03,
    /// 0x04 Protocol error (e.g., a SNACK for a status already acknowledged).
    ProtocolError = 0x04,
    /// 0x05 Command not supported.
    CommandNotSupported = 0x05,
    /// 0x06 Immediate command reject: too many immediate commands.
    ImmediateCommandReject = 0x06,
    /// 0x07 Task in progress.
    TaskInProgress = 0x07,
    /// 0x08 Invalid data ack.
    InvalidDataAck = 0x08,
    /// 0x09 Invalid PDU field.
    InvalidPduField = 0x09,
    /// 0x0a Long operation reject: out of resources for a task.
    LongOperationReject = 0x0a,
    /// 0x0b Deprecated (negotiation reset in RFC 3720).
    NegotiationReset = 0x0b,
    /// 0x0c Waiting for Logout.
    WaitingForLogout = 0x0c,
}

impl RejectReason {
    /// The reason for a Reason byte, if defined.
    pub fn from_u8(v: u8) -> Option<RejectReason> {
        Some(match v {
            0x02 => RejectReason::DataDigestError,
            0x03 => RejectReason::SnackReject,
            0x04 => RejectReason::ProtocolError,
            0x05 => RejectReason::CommandNotSupported,
            0x06 => RejectReason::ImmediateCommandReject,
            0x07 => RejectReason::TaskInProgress,
            0x08 => RejectReason::InvalidDataAck,
            0x09 => RejectReason::InvalidPduField,
            0x0a => RejectReason::LongOperationReject,
            0x0b => RejectReason::NegotiationReset,
            0x0c => RejectReason::WaitingForLogout,
            _ => return None,
        })
    }
}

/// A received PDU that breaks RFC 7143.
///
/// Two kinds: **fatal** errors ([`PduError::is_fatal`]), after which nothing more on the
/// connection can be trusted (a header digest mismatch, a data segment over the receiver's
/// MaxRecvDataSegmentLength), end the connection; the others concern a header that arrived
/// whole and intact but says something invalid: the receiver skips the PDU (its data
/// included) and, at a target, answers with a Reject PDU of [`PduError::reject_reason`]
/// carrying the offending BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PduError {
    /// The header digest does not match the BHS and AHS. Fatal: the lengths in the header
    /// cannot be trusted, so the connection cannot find the next PDU.
    HeaderDigest {
        /// The digest received.
        received: u32,
        /// The digest of the header received.
        computed: u32,
    },
    /// DataSegmentLength is over the receiver's MaxRecvDataSegmentLength. Fatal.
    DataSegmentTooLong {
        /// The opcode byte's opcode (6 bits).
        opcode: u8,
        /// DataSegmentLength.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// An opcode RFC 7143 does not define (or a vendor-specific one). Reject: command not
    /// supported.
    UnknownOpcode {
        /// The opcode (6 bits).
        opcode: u8,
    },
    /// An opcode only the other end receives (a target opcode sent to a target). Reject:
    /// protocol error.
    WrongDirection {
        /// The PDU's opcode.
        opcode: Opcode,
    },
    /// A field holds a reserved or contradictory value (a reserved task attribute, W and F
    /// both 0, F and C both set, a reserved logout reason or SNACK type, AHS or data on an
    /// opcode that has none). Reject: invalid PDU field.
    InvalidField {
        /// The PDU's opcode.
        opcode: Opcode,
        /// Byte offset of the field in the BHS (or 48 and more: in the AHS).
        offset: u16,
        /// The field's value.
        value: u32,
    },
    /// The AHS do not fill TotalAHSLength exactly, an AHS has a reserved type or a wrong
    /// length, or appears twice. Reject: invalid PDU field.
    InvalidAhs {
        /// The PDU's opcode.
        opcode: Opcode,
        /// Byte offset of the bad AHS from the start of the AHS area.
        at: u16,
    },
}

impl PduError {
    /// Whether the connection must end (nothing after this PDU can be framed or trusted).
    pub fn is_fatal(&self) -> bool {
        matches!(self, PduError::HeaderDigest { .. } | PduError::DataSegmentTooLong { .. })
    }

    /// The Reason of the Reject PDU a target answers with, or `None` for fatal errors.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            PduError::HeaderDigest { .. } | PduError::DataSegmentTooLong { .. } => None,
            PduError::UnknownOpcode { .. } => Some(RejectReason::CommandNotSupported),
            PduError::WrongDirection { .. } => Some(RejectReason::ProtocolError),
            PduError::InvalidField { .. } | PduError::InvalidAhs { .. } => Some(RejectReason::InvalidPduField),
        }
    }
}

impl fmt::Display for PduError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PduError::HeaderDigest { received, computed } => {
                write!(f, "header digest {received:#010x}, computed {computed:#010x}")
            }
            PduError::DataSegmentTooLong { opcode, len, limit } => {
                write!(f, "opcode {opcode:#04x} with a {len}-byte data segment, over MaxRecvDataSegmentLength {limit}")
            }
            PduError::UnknownOpcode { opcode } => write!(f, "unknown opcode {opcode:#04x}"),
            PduError::WrongDirection { opcode } => write!(f, "{opcode} sent the wrong way"),
            PduError::InvalidField { opcode, offset, value } => {
                write!(f, "{opcode} with invalid value {value:#x} at byte {offset}")
            }
            PduError::InvalidAhs { opcode, at } => write!(f, "{opcode} with an invalid AHS at AHS byte {at}"),
        }
    }
}

impl std::error::Error for PduError {}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
