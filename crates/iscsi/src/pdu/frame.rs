//! A PDU's length from its first bytes, the checks every received header goes through, and a
//! one-shot decode of a PDU held whole in one buffer (login and text PDUs, tests, fuzzing).

use super::{
    data_segment_len, padding, total_ahs_len, AhsInfo, Opcode, Pdu, PduError, PduParams, Role, BHS_LEN, DIGEST_LEN,
    OPCODE_MASK,
};
use crate::digest;

/// A received header that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The typed BHS.
    pub pdu: Pdu,
    /// What the AHS say (a SCSI Command's extended CDB and bidirectional read length).
    pub ahs: AhsInfo,
    /// TotalAHSLength in bytes.
    pub ahs_len: u16,
    /// DataSegmentLength: data bytes that follow (then padding and, if negotiated, a digest).
    pub data_len: u32,
}

/// How much of a PDU a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameStatus {
    /// At least this many more bytes are needed (the exact number once the BHS is in).
    Need(usize),
    /// The buffer's first `len` bytes are one whole PDU.
    Complete {
        /// The PDU's length on the wire: header, digests, data and padding.
        len: usize,
    },
}

/// The wire length of a PDU whose BHS is `bhs`, under `params`.
pub fn pdu_len(bhs: &[u8; BHS_LEN], params: &PduParams) -> usize {
    let data = data_segment_len(bhs);
    let mut n = BHS_LEN + total_ahs_len(bhs) + params.header_digest_len();
    if data > 0 {
        n += (data + padding(data)) as usize;
        if params.data_digest {
            n += DIGEST_LEN;
        }
    }
    n
}

/// How many more bytes the PDU starting at `received[0]` needs, or its length if `received`
/// holds all of it. Fails (fatally) when DataSegmentLength is over `params.max_data_segment`:
/// the connection should not wait for, nor buffer, such a PDU. Nothing else is checked.
pub fn frame_status(received: &[u8], params: &PduParams) -> Result<FrameStatus, PduError> {
    let Some(bhs) = received.first_chunk::<BHS_LEN>() else {
        return Ok(FrameStatus::Need(BHS_LEN - received.len()));
    };
    check_data_len(bhs, params)?;
    let len = pdu_len(bhs, params);
    Ok(if received.len() >= len { FrameStatus::Complete { len } } else { FrameStatus::Need(len - received.len()) })
}

fn check_data_len(bhs: &[u8; BHS_LEN], params: &PduParams) -> Result<(), PduError> {
    let len = data_segment_len(bhs);
    if len > params.max_data_segment {
        return Err(PduError::DataSegmentTooLong { opcode: bhs[0] & OPCODE_MASK, len, limit: params.max_data_segment });
    }
    Ok(())
}

/// Checks a whole received header (BHS, AHS area, header digest as received if negotiated) at
/// the receiving end `role`: the header digest and the data length first (fatal errors),
/// then the opcode, its direction, its fields, and its AHS.
pub fn check_header(
    role: Role,
    params: &PduParams,
    bhs: &[u8; BHS_LEN],
    ahs: &[u8],
    received_digest: Option<[u8; DIGEST_LEN]>,
) -> Result<Header, PduError> {
    debug_assert_eq!(ahs.len(), total_ahs_len(bhs));
    debug_assert_eq!(received_digest.is_some(), params.header_digest);
    if let Some(rx) = received_digest {
        let computed = digest::header_digest2(bhs, ahs);
        let received = digest::from_wire(rx);
        if computed != received {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }
    check_data_len(bhs, params)?;
    let data_len = data_segment_len(bhs);
    let opcode = Opcode::from_u8(bhs[0]).ok_or(PduError::UnknownOpcode { opcode: bhs[0] & OPCODE_MASK })?;
    if opcode.sender() == role {
        return Err(PduError::WrongDirection { opcode });
    }
    let pdu = Pdu::parse(bhs)?;
    if !opcode.may_carry_ahs() && !ahs.is_empty() {
        return Err(PduError::InvalidField { opcode, offset: 4, value: u32::from(bhs[4]) });
    }
    if !opcode.may_carry_data() && data_len != 0 {
        return Err(PduError::InvalidField { opcode, offset: 5, value: data_len });
    }
    let info = AhsInfo::parse(opcode, ahs)?;
    if let Pdu::ScsiCommand(c) = &pdu {
        // A bidirectional command MUST carry its read length (RFC 7143 section 11.3.4).
        if c.read && c.write && info.bidi_read_length.is_none() {
            return Err(PduError::InvalidAhs { opcode, at: 0 });
        }
    }
    Ok(Header { pdu, ahs: info, ahs_len: ahs.len() as u16, data_len })
}

/// The outcome of a data digest check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestCheck {
    /// No data digest (not negotiated, or no data).
    Absent,
    /// The digest matched.
    Ok,
    /// The digest did not match: not fatal; the PDU's data is to be discarded (a target
    /// answers with a Reject, reason data digest error).
    Mismatch {
        /// The digest received.
        received: u32,
        /// The digest of the data and padding received.
        computed: u32,
    },
}

/// A whole PDU decoded from one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The checked header.
    pub header: Header,
    /// The AHS area.
    pub ahs: &'a [u8],
    /// The data segment (without padding).
    pub data: &'a [u8],
    /// The data digest's check.
    pub data_digest: DigestCheck,
    /// The PDU's length on the wire.
    pub len: usize,
}

/// Decodes the PDU at the start of `bytes` (received at `role`), which must hold all of it
/// ([`frame_status`] says how much that is; fewer bytes give `None`).
pub fn decode_whole<'a>(role: Role, params: &PduParams, bytes: &'a [u8]) -> Option<Result<Decoded<'a>, PduError>> {
    let len = match frame_status(bytes, params) {
        Ok(FrameStatus::Complete { len }) => len,
        Ok(FrameStatus::Need(_)) => return None,
        Err(e) => return Some(Err(e)),
    };
    let bhs = bytes.first_chunk::<BHS_LEN>()?;
    let ahs_end = BHS_LEN + total_ahs_len(bhs);
    let ahs = &bytes[BHS_LEN..ahs_end];
    let mut at = ahs_end;
    let hd = if params.header_digest {
        let d = [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        at += DIGEST_LEN;
        Some(d)
    } else {
        None
    };
    let header = match check_header(role, params, bhs, ahs, hd) {
        Ok(h) => h,
        Err(e) => return Some(Err(e)),
    };
    let dlen = header.data_len as usize;
    let data = &bytes[at..at + dlen];
    let padded = dlen + padding(header.data_len) as usize;
    let data_digest = if dlen > 0 && params.data_digest {
        let computed = digest::crc32c(&bytes[at..at + padded]);
        let d = &bytes[at + padded..at + padded + DIGEST_LEN];
        let received = digest::from_wire([d[0], d[1], d[2], d[3]]);
        if computed == received {
            DigestCheck::Ok
        } else {
            DigestCheck::Mismatch { received, computed }
        }
    } else {
        DigestCheck::Absent
    };
    Some(Ok(Decoded { header, ahs, data, data_digest, len }))
}
