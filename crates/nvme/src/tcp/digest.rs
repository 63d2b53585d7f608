//! NVMe/TCP header and data digests: CRC32C (Castagnoli), sent as 4 little-endian bytes.
//!
//! The header digest (HDGST) covers the PDU header as HLEN says: the common header and the
//! PDU-specific header, not the padding. The data digest (DDGST) covers the PDU data only: not
//! the padding before it, and without padding the data to a multiple of 4 bytes (SPDK pads its
//! CRC to 4 bytes; Linux and FreeBSD do not; the two agree whenever the data length is a
//! multiple of 4, as every NVMe transfer of whole dwords is).
//!
//! The arithmetic is the `crc32c` crate's, which uses the CPU's CRC32 instructions (SSE 4.2 on
//! x86-64, the CRC extension on aarch64) and falls back to tables elsewhere.

/// Length of a header or data digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// The CRC32C of `bytes`, as NVMe/TCP digests it (initial value and final XOR all ones).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header digest of a PDU header: CRC32C over its first HLEN bytes, `header`.
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c(header)
}

/// A data digest computed piece by piece, as data lands in (or leaves from) the caller's
/// buffers: `update` each piece in order, then `finish`.
///
/// Pieces may be split anywhere; the result is that of the concatenation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataDigest {
    crc: u32,
}

impl DataDigest {
    /// A digest over no bytes yet.
    pub const fn new() -> Self {
        DataDigest { crc: 0 }
    }

    /// Adds the next `bytes` of the data.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }

    /// Adds every piece of a scatter list, in order.
    pub fn update_sg(&mut self, pieces: &[&[u8]]) {
        for piece in pieces {
            self.update(piece);
        }
    }

    /// The digest of everything added so far (adding more afterwards stays possible).
    pub fn finish(&self) -> u32 {
        self.crc
    }
}

/// The data digest of a scatter list: the CRC32C of its pieces concatenated.
pub fn data_digest(pieces: &[&[u8]]) -> u32 {
    let mut d = DataDigest::new();
    d.update_sg(pieces);
    d.finish()
}

/// A digest as its 4 wire bytes (little-endian).
pub fn to_wire(digest: u32) -> [u8; DIGEST_LEN] {
    digest.to_le_bytes()
}

/// A digest from its 4 wire bytes (little-endian).
pub fn from_wire(bytes: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The CRC-32C check value (RFC 3720 appendix B.4 and every CRC catalogue).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn rfc3720_vectors() {
        // RFC 3720 (iSCSI, the same CRC32C) B.4: 32 bytes of zeroes, of ones, ascending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        // Sent least significant byte first: RFC 3720 lists the zeroes' CRC as aa 36 91 8a.
        assert_eq!(to_wire(0x8A91_36AA), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(from_wire([0xaa, 0x36, 0x91, 0x8a]), 0x8A91_36AA);
    }

    #[test]
    fn pieces_anywhere() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 3, 4, 500, 999, 1000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(data_digest(&[a, b]), whole, "cut at {cut}");
            let mut d = DataDigest::new();
            d.update(a);
            d.update(&[]);
            d.update(b);
            assert_eq!(d.finish(), whole);
        }
        assert_eq!(data_digest(&[]), 0);
    }
}
