//! The three on-disk bit masks (`struct spdk_bs_md_mask`): used md pages, used clusters, used
//! blob ids.
//!
//! ```text
//! off  size  field
//!   0     1  type (0 used pages, 1 used clusters, 2 used blob ids)
//!   1     4  length in bits
//!   5     …  bits, bit i in byte i / 8 at position i % 8 (least significant first)
//! ```
//!
//! SPDK writes a mask over its whole region (`*_mask_len` md pages), zero past the last bit, and
//! only on a clean unload (or after recovering a dirty blobstore): while a blobstore is loaded
//! the masks on disk are stale, which is why a super block with `clean == 0` makes SPDK rebuild
//! them from the md pages.

use super::error::{le_u32, need, FormatError};

/// Size of the mask header (type and length).
pub const HEADER_SIZE: usize = 5;

/// Which mask a region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// Used metadata pages: one bit per page of the md region (`md_len` bits).
    UsedPages = 0,
    /// Used clusters: one bit per cluster of the blobstore (`total_clusters` bits; metadata
    /// clusters included).
    UsedClusters = 1,
    /// Used blob ids: one bit per page of the md region, set on the first page of each blob.
    UsedBlobIds = 2,
}

impl MaskKind {
    /// A human name for reports.
    pub fn name(self) -> &'static str {
        match self {
            MaskKind::UsedPages => "used md page mask",
            MaskKind::UsedClusters => "used cluster mask",
            MaskKind::UsedBlobIds => "used blob id mask",
        }
    }
}

/// A decoded mask: its kind and its bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdMask {
    /// The mask's kind.
    pub kind: MaskKind,
    /// Number of bits.
    len: u32,
    /// The bits, packed as on disk (`len.div_ceil(8)` bytes; bits past `len` are zero).
    bits: Vec<u8>,
}

impl MdMask {
    /// An all-clear mask of `len` bits.
    pub fn new(kind: MaskKind, len: u32) -> MdMask {
        MdMask { kind, len, bits: vec![0; (len as usize).div_ceil(8)] }
    }

    /// Decodes a mask of the given kind from its region's bytes. The length in bits must fit the
    /// region; bits past the length are ignored, as SPDK ignores them.
    pub fn decode(region: &[u8], kind: MaskKind) -> Result<MdMask, FormatError> {
        need("mask header", region, HEADER_SIZE)?;
        if region[0] != kind as u8 {
            return Err(FormatError::BadMaskType { expected: kind as u8, found: region[0] });
        }
        let len = le_u32(region, 1);
        let capacity = (region.len() as u64 - HEADER_SIZE as u64) * 8;
        if u64::from(len) > capacity {
            return Err(FormatError::MaskTooLong { bits: len, capacity });
        }
        let nbytes = (len as usize).div_ceil(8);
        let mut bits = region[HEADER_SIZE..HEADER_SIZE + nbytes].to_vec();
        if !len.is_multiple_of(8) {
            if let Some(last) = bits.last_mut() {
                *last &= (1u8 << (len % 8)) - 1;
            }
        }
        Ok(MdMask { kind, len, bits })
    }

    /// Encodes the mask into a region of `region_len` bytes (the header, the bits, zeros), as
    /// SPDK writes it.
    pub fn encode(&self, region_len: usize) -> Result<Vec<u8>, FormatError> {
        if region_len < HEADER_SIZE + self.bits.len() {
            return Err(FormatError::Unencodable(format!(
                "{} of {} bits needs {} bytes, region has {region_len}",
                self.kind.name(),
                self.len,
                HEADER_SIZE + self.bits.len()
            )));
        }
        let mut out = vec![0u8; region_len];
        out[0] = self.kind as u8;
        out[1..5].copy_from_slice(&self.len.to_le_bytes());
        out[HEADER_SIZE..HEADER_SIZE + self.bits.len()].copy_from_slice(&self.bits);
        Ok(out)
    }

    /// Number of bits.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the mask has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bit `i`; false past the end.
    pub fn get(&self, i: u64) -> bool {
        i < u64::from(self.len) && self.bits[(i / 8) as usize] & (1 << (i % 8)) != 0
    }

    /// Sets or clears bit `i`; ignored past the end.
    pub fn set(&mut self, i: u64, value: bool) {
        if i < u64::from(self.len) {
            let byte = &mut self.bits[(i / 8) as usize];
            if value {
                *byte |= 1 << (i % 8);
            } else {
                *byte &= !(1 << (i % 8));
            }
        }
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> u64 {
        self.bits.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// The indices of the set bits, in order.
    pub fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(byte, &b)| (0..8).filter(move |bit| b & (1 << bit) != 0).map(move |bit| byte as u64 * 8 + bit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let mut m = MdMask::new(MaskKind::UsedClusters, 12);
        m.set(0, true);
        m.set(9, true);
        m.set(12, true); // past the end: ignored
        let region = m.encode(4096).unwrap();
        assert_eq!(&region[..7], &[1, 12, 0, 0, 0, 0x01, 0x02]);
        assert!(region[7..].iter().all(|&b| b == 0));
        let back = MdMask::decode(&region, MaskKind::UsedClusters).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.ones().collect::<Vec<_>>(), vec![0, 9]);
        assert_eq!(back.count_ones(), 2);
    }

    #[test]
    fn rejects() {
        let m = MdMask::new(MaskKind::UsedPages, 64);
        let region = m.encode(64).unwrap();
        assert!(matches!(
            MdMask::decode(&region, MaskKind::UsedBlobIds),
            Err(FormatError::BadMaskType { expected: 2, found: 0 })
        ));
        let mut long = region.clone();
        long[1..5].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(MdMask::decode(&long, MaskKind::UsedPages), Err(FormatError::MaskTooLong { .. })));
        assert!(MdMask::decode(&region[..3], MaskKind::UsedPages).is_err());
        assert!(m.encode(10).is_err());
    }

    #[test]
    fn stray_bits_past_length_are_ignored() {
        let mut region = vec![0u8; 16];
        region[1] = 3; // 3 bits
        region[5] = 0xff;
        let m = MdMask::decode(&region, MaskKind::UsedPages).unwrap();
        assert_eq!(m.count_ones(), 3);
    }
}
