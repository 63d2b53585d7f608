//! Additional Header Segments (RFC 7143 section 11.2.2).
//!
//! Each AHS is AHSLength (2 bytes), AHSType (1 byte: 2 reserved bits, a 6-bit code), one
//! AHS-specific byte, then AHSLength - 1 more bytes, padded to a multiple of 4: it takes
//! 3 + AHSLength bytes before padding. Two types are defined, both for a SCSI Command:
//!
//! - 1, Extended CDB: AHSLength = CDB length - 15; the reserved byte, then the CDB's bytes
//!   from the 17th on (the first 16 are in the BHS);
//! - 2, Bidirectional Read Expected Data Transfer Length: AHSLength = 5; the reserved byte
//!   and the read length (4 bytes).
//!
//! The AHS must fill TotalAHSLength exactly; a reserved type, a wrong length or a type given
//! twice is an invalid PDU field.

use super::{Opcode, PduError, MAX_AHS_LEN};

/// AHS type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AhsType {
    /// 1: the CDB's bytes beyond 16.
    ExtendedCdb = 1,
    /// 2: a bidirectional command's expected read length.
    BidiReadLength = 2,
}

/// An AHS to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahs<'a> {
    /// The CDB's bytes after the first 16 (at least 1).
    ExtendedCdb(&'a [u8]),
    /// The Bidirectional Read Expected Data Transfer Length.
    BidiReadLength(u32),
}

impl Ahs<'_> {
    /// AHSLength of this AHS.
    pub fn ahs_length(&self) -> usize {
        match self {
            Ahs::ExtendedCdb(rest) => rest.len() + 1,
            Ahs::BidiReadLength(_) => 5,
        }
    }

    /// Bytes this AHS takes on the wire, padding included.
    pub fn wire_len(&self) -> usize {
        (3 + self.ahs_length()).div_ceil(4) * 4
    }

    /// Writes the AHS, padding included, at the start of `out` (at least `wire_len` bytes).
    pub fn write(&self, out: &mut [u8]) -> usize {
        let n = self.wire_len();
        let out = &mut out[..n];
        out.fill(0);
        let len = self.ahs_length() as u16;
        out[0..2].copy_from_slice(&len.to_be_bytes());
        match self {
            Ahs::ExtendedCdb(rest) => {
                out[2] = AhsType::ExtendedCdb as u8;
                out[4..4 + rest.len()].copy_from_slice(rest);
            }
            Ahs::BidiReadLength(v) => {
                out[2] = AhsType::BidiReadLength as u8;
                out[4..8].copy_from_slice(&v.to_be_bytes());
            }
        }
        n
    }
}

/// Bytes a list of AHS takes on the wire.
pub fn wire_len(list: &[Ahs<'_>]) -> usize {
    list.iter().map(Ahs::wire_len).sum()
}

/// What a received PDU's AHS say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhsInfo {
    /// The Bidirectional Read Expected Data Transfer Length, if that AHS came.
    pub bidi_read_length: Option<u32>,
    /// Where the extended CDB bytes (beyond the first 16) lie in the AHS area: offset and
    /// length.
    pub extended_cdb: Option<(u16, u16)>,
}

impl AhsInfo {
    /// Parses the AHS area of a PDU of opcode `opcode` (TotalAHSLength × 4 bytes).
    pub fn parse(opcode: Opcode, area: &[u8]) -> Result<AhsInfo, PduError> {
        debug_assert!(area.len() <= MAX_AHS_LEN && area.len().is_multiple_of(4));
        let mut info = AhsInfo::default();
        let mut at = 0usize;
        while at < area.len() {
            let bad = PduError::InvalidAhs { opcode, at: at as u16 };
            // Each AHS starts on a 4-byte boundary, so its 4-byte head is always there.
            let len = usize::from(u16::from_be_bytes([area[at], area[at + 1]]));
            let code = area[at + 2] & 0x3f;
            let total = (3 + len).div_ceil(4) * 4;
            if total > area.len() - at {
                return Err(bad);
            }
            match code {
                1 => {
                    if len < 2 || info.extended_cdb.is_some() {
                        return Err(bad);
                    }
                    info.extended_cdb = Some(((at + 4) as u16, (len - 1) as u16));
                }
                2 => {
                    if len != 5 || info.bidi_read_length.is_some() {
                        return Err(bad);
                    }
                    let v = &area[at + 4..at + 8];
                    info.bidi_read_length = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
                }
                _ => return Err(bad),
            }
            at += total;
        }
        Ok(info)
    }

    /// The full CDB of a SCSI Command: the BHS's 16 bytes and the extended CDB AHS's bytes
    /// from `area` (the same AHS area that was parsed).
    pub fn cdb<'a>(&self, head: &[u8; 16], area: &'a [u8]) -> Cdb<'a> {
        let ext = match self.extended_cdb {
            Some((off, len)) => {
                let (off, len) = (usize::from(off), usize::from(len));
                area.get(off..off + len).unwrap_or(&[])
            }
            None => &[],
        };
        Cdb { head: *head, ext }
    }
}

/// A CDB in two parts: the 16 bytes of the BHS and the rest from an extended CDB AHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cdb<'a> {
    /// The first 16 bytes.
    pub head: [u8; 16],
    /// The bytes beyond 16 (empty for CDBs of up to 16 bytes).
    pub ext: &'a [u8],
}

impl Cdb<'_> {
    /// The CDB's length: 16 plus the extension (a CDB shorter than 16 bytes is padded in the
    /// BHS; its real length follows from its operation code).
    pub fn len(&self) -> usize {
        16 + self.ext.len()
    }

    /// Never empty: the BHS always holds 16 bytes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Byte `i` of the CDB, if there is one.
    pub fn get(&self, i: usize) -> Option<u8> {
        if i < 16 {
            Some(self.head[i])
        } else {
            self.ext.get(i - 16).copied()
        }
    }

    /// Copies the CDB into the start of `out`, as much as fits; returns the bytes copied.
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        let a = out.len().min(16);
        out[..a].copy_from_slice(&self.head[..a]);
        let b = (out.len() - a).min(self.ext.len());
        out[a..a + b].copy_from_slice(&self.ext[..b]);
        a + b
    }
}
