//! Framing PDUs to send, into a buffer the caller provides (nothing is allocated).
//!
//! [`encode`] writes the common header, the PDU-specific header, the header digest and the
//! padding up to PDO, and computes PLEN and the data digest over the caller's data, which it
//! does not copy: the caller sends `out[..head_len]`, then its data buffers (a scatter list),
//! then the data digest if there is one. [`encode_contiguous`] also copies the data and digest
//! into `out`, for small PDUs.
//!
//! Which digests a PDU carries and where its data starts follow from its type and the
//! [`Negotiated`] parameters: header digests on all but ICReq/ICResp/TermReq; a data digest
//! only when there is data; data at the first multiple of the receiver's PDA (HPDA for C2H
//! PDUs, CPDA for H2C PDUs) after the header and its digest.

use std::fmt;

use super::digest::{self, DIGEST_LEN};
use super::negotiate::{pda_bytes, Negotiated};
use super::pdu::{
    flags, CommonHeader, Direction, Fes, Pdu, PduType, Role, TermReq, CH_LEN, TERM_REQ_HLEN, TERM_REQ_MAX_DATA,
};

/// Largest head (`Framing::head_len`) of any PDU: a CapsuleCmd header with its digest (76
/// bytes) padded to a PDA of 72 bytes (PDA values are any multiple of 4 up to 128, not only
/// powers of two), so data at 144.
pub const MAX_HEAD_LEN: usize = 144;

/// How an encoded PDU goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// The first bytes of the output buffer to send: header, header digest, padding.
    pub head_len: usize,
    /// PDO: where the data starts (0 without data).
    pub pdo: u8,
    /// Data bytes to send after the head, from the caller's buffers.
    pub data_len: u32,
    /// The data digest to send after the data, if the PDU has one.
    pub data_digest: Option<[u8; DIGEST_LEN]>,
    /// PLEN: the PDU's whole length.
    pub plen: u32,
}

/// A PDU that cannot be framed as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is shorter than the `need` bytes to write.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
    },
    /// Data given for a type without data, or more than 128 bytes for a termination request.
    UnexpectedData {
        /// The PDU's type.
        pdu_type: PduType,
        /// The data's length.
        len: usize,
    },
    /// An H2CData or C2HData whose DATAL is not the length of the data given (or is 0).
    DataLength {
        /// The PDU's type.
        pdu_type: PduType,
        /// DATAL.
        datal: u32,
        /// The data's length.
        len: usize,
    },
    /// An H2CData with more data than MAXH2CDATA.
    DataLimit {
        /// The data's length.
        len: u32,
        /// MAXH2CDATA.
        limit: u32,
    },
    /// A C2HData with SUCCESS but not LAST_PDU.
    SuccessWithoutLast,
    /// The PDU would be longer than PLEN can say (4 GiB).
    TooLong {
        /// The data's length.
        len: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall { need } => write!(f, "output buffer needs {need} bytes"),
            EncodeError::UnexpectedData { pdu_type, len } => write!(f, "{pdu_type} cannot carry {len} data bytes"),
            EncodeError::DataLength { pdu_type, datal, len } => {
                write!(f, "{pdu_type} DATAL {datal} but {len} data bytes given")
            }
            EncodeError::DataLimit { len, limit } => write!(f, "H2CData of {len} bytes over MAXH2CDATA {limit}"),
            EncodeError::SuccessWithoutLast => f.write_str("C2HData with SUCCESS but not LAST_PDU"),
            EncodeError::TooLong { len } => write!(f, "PDU with {len} data bytes too long for PLEN"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Frames `pdu` with `data` (a scatter list, possibly empty) into `out` under `params`: writes
/// the head (header, header digest, padding) into `out[..head_len]` and digests the data.
/// `out` needs at most [`MAX_HEAD_LEN`] bytes. The data itself is not touched beyond reading
/// it for the digest.
pub fn encode(out: &mut [u8], params: &Negotiated, pdu: &Pdu, data: &[&[u8]]) -> Result<Framing, EncodeError> {
    let t = pdu.pdu_type();
    let len: usize = data.iter().map(|d| d.len()).sum();
    let data_len = u32::try_from(len).map_err(|_| EncodeError::TooLong { len })?;
    match pdu {
        Pdu::H2cData(d) if d.datal != data_len || len == 0 => {
            return Err(EncodeError::DataLength { pdu_type: t, datal: d.datal, len })
        }
        Pdu::C2hData(d) if d.datal != data_len || len == 0 => {
            return Err(EncodeError::DataLength { pdu_type: t, datal: d.datal, len })
        }
        Pdu::C2hData(d) if d.success && !d.last => return Err(EncodeError::SuccessWithoutLast),
        _ => {}
    }
    if let Pdu::H2cData(_) = pdu {
        if data_len > params.maxh2cdata {
            return Err(EncodeError::DataLimit { len: data_len, limit: params.maxh2cdata });
        }
    }
    let data_allowed = if t.is_term_req() { len <= TERM_REQ_MAX_DATA } else { t.has_data_digest() || len == 0 };
    if !data_allowed {
        return Err(EncodeError::UnexpectedData { pdu_type: t, len });
    }

    let hlen = usize::from(t.hlen());
    let hdgst = t.has_header_digest() && params.header_digest;
    let full_hlen = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let sender = match t.direction() {
        Direction::HostToController => Role::Host,
        Direction::ControllerToHost => Role::Controller,
    };
    let (pdo, ddgst) = if len == 0 {
        (0usize, false)
    } else if t.is_term_req() {
        // A termination request's data follows its header directly, with PDO 0.
        (0, false)
    } else {
        let align = pda_bytes(params.tx_pda(sender)) as usize;
        (full_hlen.div_ceil(align) * align, params.data_digest)
    };
    let head_len = if pdo == 0 { full_hlen } else { pdo };
    let plen = head_len as u64 + len as u64 + if ddgst { DIGEST_LEN as u64 } else { 0 };
    let plen = u32::try_from(plen).map_err(|_| EncodeError::TooLong { len })?;
    if out.len() < head_len {
        return Err(EncodeError::BufferTooSmall { need: head_len });
    }

    let mut flag_bits = pdu.type_flags();
    if hdgst {
        flag_bits |= flags::HDGSTF;
    }
    if ddgst {
        flag_bits |= flags::DDGSTF;
    }
    let ch = CommonHeader { pdu_type: t.to_u8(), flags: flag_bits, hlen: t.hlen(), pdo: pdo as u8, plen };
    let mut ch_bytes = [0u8; CH_LEN];
    ch.write(&mut ch_bytes);
    out[..CH_LEN].copy_from_slice(&ch_bytes);
    pdu.write_psh(&mut out[..hlen]);
    if hdgst {
        let d = digest::header_digest(&out[..hlen]);
        out[hlen..full_hlen].copy_from_slice(&digest::to_wire(d));
    }
    out[full_hlen..head_len].fill(0);
    let data_digest = ddgst.then(|| digest::to_wire(digest::data_digest(data)));
    Ok(Framing { head_len, pdo: pdo as u8, data_len, data_digest, plen })
}

/// Frames `pdu` and copies its data and data digest after the head, so that `out[..plen]` is
/// the whole PDU. Returns PLEN.
pub fn encode_contiguous(out: &mut [u8], params: &Negotiated, pdu: &Pdu, data: &[&[u8]]) -> Result<usize, EncodeError> {
    let f = encode(out, params, pdu, data)?;
    let plen = f.plen as usize;
    if out.len() < plen {
        return Err(EncodeError::BufferTooSmall { need: plen });
    }
    let mut at = f.head_len;
    for piece in data {
        out[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    if let Some(d) = f.data_digest {
        out[at..at + DIGEST_LEN].copy_from_slice(&d);
    }
    Ok(plen)
}

/// Writes a whole termination request from `sender` (a C2HTermReq from a controller, an
/// H2CTermReq from a host) with `fes` and `fei` (sent as 0 unless the status defines it), its
/// data the first 128 bytes at most of `offending`, the header of the PDU in error (the
/// decoder's `received_header`). Returns PLEN (at most 152).
pub fn encode_term_req(
    out: &mut [u8],
    sender: Role,
    fes: Fes,
    fei: u32,
    offending: &[u8],
) -> Result<usize, EncodeError> {
    let t = TermReq { fes: fes.to_u16(), fei: if fes.has_fei() { fei } else { 0 } };
    let pdu = match sender {
        Role::Controller => Pdu::C2hTermReq(t),
        Role::Host => Pdu::H2cTermReq(t),
    };
    let data = &offending[..offending.len().min(TERM_REQ_MAX_DATA)];
    let n = encode_contiguous(out, &Negotiated::INITIAL, &pdu, &[data])?;
    debug_assert_eq!(n, usize::from(TERM_REQ_HLEN) + data.len());
    Ok(n)
}
