//! One metadata page (`struct spdk_blob_md_page`), used both for a blob's chain of md pages and
//! for extent pages.
//!
//! ```text
//! off  size  field
//!   0     8  id: the blob id the page belongs to
//!   8     4  sequence_num: position in the blob's chain (0 for the first page and for
//!            extent pages)
//!  12     4  reserved (zero)
//!  16  4072  descriptors (see super::descriptor), ended by a zero type and zero length
//! 4088    4  next: md page index of the next page of the chain, u32::MAX for none
//! 4092    4  crc: CRC32C of bytes 0..4092
//! ```
//!
//! The first page of blob `id` is md page `id & 0xffff_ffff` ([`super::units`]); the rest of
//! the chain sits wherever free pages were when the blob was last written.

use super::crc::page_crc;
use super::error::{le_u32, le_u64, need, FormatError};
use super::{DESC_AREA_SIZE, INVALID_MD_PAGE, PAGE_SIZE};

/// Offset of the descriptor area in a page.
pub const DESC_OFFSET: usize = 16;

/// A metadata page, decoded field by field (every byte of the page is represented, so encoding
/// it back gives the same bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct MdPage {
    /// The blob id.
    pub id: u64,
    /// Position in the chain.
    pub sequence_num: u32,
    /// Reserved; SPDK writes 0.
    pub reserved0: u32,
    /// The descriptor area.
    pub descriptors: Box<[u8; DESC_AREA_SIZE]>,
    /// Next page of the chain, or [`INVALID_MD_PAGE`].
    pub next: u32,
    /// CRC as stored (decode) or to be stored; [`MdPage::encode`] recomputes it.
    pub crc: u32,
}

impl std::fmt::Debug for MdPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = DESC_AREA_SIZE - self.descriptors.iter().rev().take_while(|&&b| b == 0).count();
        f.debug_struct("MdPage")
            .field("id", &format_args!("{:#x}", self.id))
            .field("sequence_num", &self.sequence_num)
            .field("reserved0", &self.reserved0)
            .field("descriptors", &&self.descriptors[..used])
            .field("next", &self.next)
            .field("crc", &format_args!("{:#010x}", self.crc))
            .finish()
    }
}

impl MdPage {
    /// An empty page of blob `id` at position `sequence_num`, with no next page: what SPDK's
    /// serializer starts every page from.
    pub fn new(id: u64, sequence_num: u32) -> MdPage {
        MdPage {
            id,
            sequence_num,
            reserved0: 0,
            descriptors: Box::new([0u8; DESC_AREA_SIZE]),
            next: INVALID_MD_PAGE,
            crc: 0,
        }
    }

    /// Decodes the first 4096 bytes of `bytes` (no CRC check: see [`MdPage::crc_ok`]).
    pub fn decode(bytes: &[u8]) -> Result<MdPage, FormatError> {
        need("md page", bytes, PAGE_SIZE)?;
        let mut descriptors = Box::new([0u8; DESC_AREA_SIZE]);
        descriptors.copy_from_slice(&bytes[DESC_OFFSET..DESC_OFFSET + DESC_AREA_SIZE]);
        Ok(MdPage {
            id: le_u64(bytes, 0),
            sequence_num: le_u32(bytes, 8),
            reserved0: le_u32(bytes, 12),
            descriptors,
            next: le_u32(bytes, PAGE_SIZE - 8),
            crc: le_u32(bytes, PAGE_SIZE - 4),
        })
    }

    /// Decodes a page and checks its CRC, as SPDK does before using a page.
    pub fn decode_checked(bytes: &[u8]) -> Result<MdPage, FormatError> {
        let page = MdPage::decode(bytes)?;
        let computed = page_crc(bytes);
        if computed != page.crc {
            return Err(FormatError::BadCrc { what: "md page", stored: page.crc, computed });
        }
        Ok(page)
    }

    /// The page's bytes with the stored `crc` field as is.
    pub fn to_bytes_raw(&self) -> [u8; PAGE_SIZE] {
        let mut b = [0u8; PAGE_SIZE];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&self.sequence_num.to_le_bytes());
        b[12..16].copy_from_slice(&self.reserved0.to_le_bytes());
        b[DESC_OFFSET..DESC_OFFSET + DESC_AREA_SIZE].copy_from_slice(&self.descriptors[..]);
        b[PAGE_SIZE - 8..PAGE_SIZE - 4].copy_from_slice(&self.next.to_le_bytes());
        b[PAGE_SIZE - 4..].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// The CRC of the page's contents.
    pub fn computed_crc(&self) -> u32 {
        page_crc(&self.to_bytes_raw())
    }

    /// Whether the stored CRC matches the contents.
    pub fn crc_ok(&self) -> bool {
        self.computed_crc() == self.crc
    }

    /// Encodes the page with a freshly computed CRC, as SPDK writes it.
    pub fn encode(&self) -> [u8; PAGE_SIZE] {
        let mut b = self.to_bytes_raw();
        let crc = page_crc(&b);
        b[PAGE_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Sets `crc` to the CRC of the contents.
    pub fn seal(&mut self) {
        self.crc = self.computed_crc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trip() {
        let mut p = MdPage::new(0x1_0000_0005, 2);
        p.descriptors[0] = 3;
        p.next = 9;
        let bytes = p.encode();
        assert_eq!(&bytes[0..8], &0x1_0000_0005u64.to_le_bytes());
        assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
        assert_eq!(bytes[16], 3);
        assert_eq!(&bytes[4088..4092], &9u32.to_le_bytes());
        let back = MdPage::decode_checked(&bytes).unwrap();
        assert!(back.crc_ok());
        assert_eq!(back.encode(), bytes);
        let mut bad = bytes;
        bad[20] ^= 0x40;
        assert!(matches!(MdPage::decode_checked(&bad), Err(FormatError::BadCrc { .. })));
        assert!(!MdPage::decode(&bad).unwrap().crc_ok());
    }
}
