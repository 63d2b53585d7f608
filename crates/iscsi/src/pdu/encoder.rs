//! Framing PDUs to send, into a buffer the caller provides (nothing is allocated).
//!
//! [`encode`] writes the BHS, the AHS and the header digest, and computes the data digest
//! over the caller's data (with its zero padding), which it does not copy: the caller sends
//! `out[..head_len]`, its data buffers, `pad_len` zero bytes, then the data digest if there is
//! one. [`encode_contiguous`] copies all of it into `out`, for small PDUs.

use std::fmt;

use super::ahs::{self, Ahs};
use super::{padding, Opcode, Pdu, PduParams, BHS_LEN, DIGEST_LEN, MAX_AHS_LEN, MAX_DATA_SEGMENT_LENGTH};
use crate::digest;

/// The largest head [`encode`] writes: BHS, the largest AHS, a header digest.
pub const MAX_HEAD_LEN: usize = super::MAX_HEADER_LEN;

/// How an encoded PDU goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// The first bytes of the output buffer to send: BHS, AHS, header digest.
    pub head_len: usize,
    /// Data bytes to send after the head, from the caller's buffers.
    pub data_len: u32,
    /// Zero bytes to send after the data (0..=3).
    pub pad_len: u32,
    /// The data digest to send after the padding, if the PDU has one.
    pub data_digest: Option<[u8; DIGEST_LEN]>,
}

impl Framing {
    /// The PDU's whole length on the wire.
    pub fn wire_len(&self) -> usize {
        self.head_len + (self.data_len + self.pad_len) as usize + self.data_digest.map_or(0, |d| d.len())
    }
}

/// A PDU that cannot be framed as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is shorter than the `need` bytes to write.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
    },
    /// Data or AHS for an opcode that carries none (task management, Logout, R2T).
    Unexpected {
        /// The PDU's opcode.
        opcode: Opcode,
    },
    /// More data than the receiver's MaxRecvDataSegmentLength (or than 2^24 - 1).
    DataTooLong {
        /// The data's length.
        len: usize,
        /// The limit.
        limit: u32,
    },
    /// More than 1020 bytes of AHS.
    AhsTooLong {
        /// The AHS's length.
        len: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall { need } => write!(f, "output buffer needs {need} bytes"),
            EncodeError::Unexpected { opcode } => write!(f, "{opcode} carries no data or AHS"),
            EncodeError::DataTooLong { len, limit } => write!(f, "{len} data bytes, over the limit of {limit}"),
            EncodeError::AhsTooLong { len } => write!(f, "{len} AHS bytes, over 1020"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Frames `pdu` with `ahs` and `data` (a scatter list, possibly empty) under `params` (the
/// digests, and the receiver's MaxRecvDataSegmentLength as `max_data_segment`): writes the
/// head into `out[..head_len]` (at most [`MAX_HEAD_LEN`] bytes) and digests the data.
pub fn encode(
    out: &mut [u8],
    params: &PduParams,
    pdu: &Pdu,
    ahs_list: &[Ahs<'_>],
    data: &[&[u8]],
) -> Result<Framing, EncodeError> {
    let opcode = pdu.opcode();
    let len: usize = data.iter().map(|d| d.len()).sum();
    let ahs_len = ahs::wire_len(ahs_list);
    if (len > 0 && !opcode.may_carry_data()) || (ahs_len > 0 && !opcode.may_carry_ahs()) {
        return Err(EncodeError::Unexpected { opcode });
    }
    let limit = params.max_data_segment.min(MAX_DATA_SEGMENT_LENGTH);
    if len > limit as usize {
        return Err(EncodeError::DataTooLong { len, limit });
    }
    if ahs_len > MAX_AHS_LEN {
        return Err(EncodeError::AhsTooLong { len: ahs_len });
    }
    let data_len = len as u32;
    let header_len = BHS_LEN + ahs_len;
    let head_len = header_len + params.header_digest_len();
    if out.len() < head_len {
        return Err(EncodeError::BufferTooSmall { need: head_len });
    }
    let bhs = out.first_chunk_mut::<BHS_LEN>().expect("checked above");
    pdu.write_bhs(bhs, (ahs_len / 4) as u8, data_len);
    let mut at = BHS_LEN;
    for a in ahs_list {
        at += a.write(&mut out[at..]);
    }
    debug_assert_eq!(at, header_len);
    if params.header_digest {
        let d = digest::header_digest(&out[..header_len]);
        out[header_len..head_len].copy_from_slice(&digest::to_wire(d));
    }
    let data_digest = (params.data_digest && data_len > 0).then(|| digest::to_wire(digest::data_digest(data)));
    Ok(Framing { head_len, data_len, pad_len: padding(data_len), data_digest })
}

/// Frames `pdu` and copies its data, padding and data digest after the head, so that
/// `out[..n]` is the whole PDU. Returns n.
pub fn encode_contiguous(
    out: &mut [u8],
    params: &PduParams,
    pdu: &Pdu,
    ahs_list: &[Ahs<'_>],
    data: &[&[u8]],
) -> Result<usize, EncodeError> {
    let f = encode(out, params, pdu, ahs_list, data)?;
    let n = f.wire_len();
    if out.len() < n {
        return Err(EncodeError::BufferTooSmall { need: n });
    }
    let mut at = f.head_len;
    for piece in data {
        out[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    out[at..at + f.pad_len as usize].fill(0);
    at += f.pad_len as usize;
    if let Some(d) = f.data_digest {
        out[at..at + DIGEST_LEN].copy_from_slice(&d);
        at += DIGEST_LEN;
    }
    debug_assert_eq!(at, n);
    Ok(n)
}

/// Encodes a whole PDU into a new vector (login, text and other rare PDUs; not for the data
/// path, which uses [`encode`] into its own buffers).
pub fn encode_to_vec(params: &PduParams, pdu: &Pdu, ahs_list: &[Ahs<'_>], data: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = vec![0u8; MAX_HEAD_LEN + data.len() + 3 + DIGEST_LEN];
    let n = encode_contiguous(&mut out, params, pdu, ahs_list, &[data])?;
    out.truncate(n);
    Ok(out)
}
