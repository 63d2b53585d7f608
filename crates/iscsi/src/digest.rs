//! iSCSI header and data digests: CRC32C (RFC 7143 sections 11.1 and 13.1, RFC 3720 appendix
//! B.4), sent least significant byte first.
//!
//! The header digest covers the BHS and the AHS. The data digest covers the data segment
//! and its padding to 4 bytes (unlike NVMe/TCP's): the sender pads with zeroes, the receiver
//! digests the padding bytes it received. A PDU without data has no data digest.
//!
//! The arithmetic is the `crc32c` crate's (SSE 4.2 / ARM CRC instructions, tables elsewhere).

use crate::pdu::{padding, DIGEST_LEN};

/// The CRC32C of `bytes` (initial value and final XOR all ones).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header digest of a BHS and its AHS (pass them as one slice or use [`header_digest2`]).
pub fn header_digest(header: &[u8]) -> u32 {
    debug_assert!(header.len().is_multiple_of(4), "BHS and AHS are whole words");
    crc32c(header)
}

/// The header digest of a BHS followed by an AHS area held apart.
pub fn header_digest2(bhs: &[u8], ahs: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c(bhs), ahs)
}

/// Whether `received` (as read off the wire) is the header digest of `header`.
pub fn verify_header(header: &[u8], received: [u8; DIGEST_LEN]) -> bool {
    header_digest(header) == from_wire(received)
}

/// A data digest computed piece by piece as data lands in (or leaves from) the caller's
/// buffers: `update` the data in order, then `update` the padding (or `finish_padded`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataDigest {
    crc: u32,
    len: u64,
}

impl DataDigest {
    /// A digest over no bytes yet.
    pub const fn new() -> Self {
        DataDigest { crc: 0, len: 0 }
    }

    /// Adds the next `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.len += bytes.len() as u64;
    }

    /// The digest of everything added so far.
    pub fn finish(&self) -> u32 {
        self.crc
    }

    /// The digest of everything added so far followed by zero padding to a multiple of 4
    /// (what a sender puts on the wire).
    pub fn finish_padded(&self) -> u32 {
        let pad = padding((self.len & 3) as u32) as usize;
        crc32c::crc32c_append(self.crc, &[0u8; 3][..pad])
    }

    /// Bytes added so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The data digest of a data segment given as a scatter list: its CRC32C with zero padding.
pub fn data_digest(pieces: &[&[u8]]) -> u32 {
    let mut d = DataDigest::new();
    for p in pieces {
        d.update(p);
    }
    d.finish_padded()
}

/// A digest as its 4 wire bytes.
pub fn to_wire(digest: u32) -> [u8; DIGEST_LEN] {
    digest.to_le_bytes()
}

/// A digest from its 4 wire bytes.
pub fn from_wire(bytes: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_b4_vectors() {
        // RFC 3720 appendix B.4 (CRC32C examples), bytes as sent.
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(to_wire(crc32c(&inc)), [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(to_wire(crc32c(&dec)), [0x5c, 0xdb, 0x3f, 0x11]);
        // The iSCSI Read (10) command PDU of B.4: 48 bytes.
        let mut pdu = [0u8; 48];
        pdu[0] = 0x01;
        pdu[1] = 0xc0;
        pdu[16..20].copy_from_slice(&[0x14, 0, 0, 0]);
        pdu[20..24].copy_from_slice(&[0, 0, 0x04, 0]);
        pdu[27] = 0x14;
        pdu[31] = 0x18;
        pdu[32] = 0x28;
        pdu[40] = 0x02;
        assert_eq!(to_wire(crc32c(&pdu)), [0x56, 0x3a, 0x96, 0xd9]);
        assert!(verify_header(&pdu, [0x56, 0x3a, 0x96, 0xd9]));
    }

    #[test]
    fn data_digest_pads_with_zeroes() {
        let data = b"abcde";
        assert_eq!(data_digest(&[data]), crc32c(b"abcde\0\0\0"));
        assert_eq!(data_digest(&[b"ab", b"", b"cde"]), crc32c(b"abcde\0\0\0"));
        assert_eq!(data_digest(&[b"abcd"]), crc32c(b"abcd"));
        let mut d = DataDigest::new();
        d.update(b"abc");
        assert_eq!(d.len(), 3);
        assert_eq!(d.finish_padded(), crc32c(b"abc\0"));
        d.update(b"\0");
        assert_eq!(d.finish(), crc32c(b"abc\0"));
    }

    #[test]
    fn header_in_two_parts() {
        let bhs = [7u8; 48];
        let ahs = [9u8; 8];
        let mut whole = bhs.to_vec();
        whole.extend_from_slice(&ahs);
        assert_eq!(header_digest2(&bhs, &ahs), header_digest(&whole));
        assert_eq!(from_wire(to_wire(0x1234_5678)), 0x1234_5678);
    }
}
