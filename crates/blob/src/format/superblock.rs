//! The super block (`struct spdk_bs_super_block`): page 0 of the device.
//!
//! ```text
//! off  size  field
//!   0     8  signature "SPDKBLOB"
//!   8     4  version (1..=3; SPDK v26.05 writes 3)
//!  12     4  length (4096)
//!  16     4  clean (1 after a clean unload, 0 while loaded or after a crash)
//!  20     8  super_blob (blob id, or u64::MAX for none)
//!  28     4  cluster_size in bytes
//!  32     4  used_page_mask_start    (md pages from the start of the device)
//!  36     4  used_page_mask_len      (md pages)
//!  40     4  used_cluster_mask_start
//!  44     4  used_cluster_mask_len
//!  48     4  md_start
//!  52     4  md_len
//!  56    16  bstype (e.g. "LVOLSTORE", zero padded)
//!  72     4  used_blobid_mask_start
//!  76     4  used_blobid_mask_len    (0 in version 1 and 2 images: no blob id mask)
//!  80     8  size of the blobstore in bytes (0 in old images: the whole device)
//!  88     4  io_unit_size (0 in old images: 4096)
//!  92     4  md_page_size (0 in old images: 4096)
//!  96  3996  reserved (zero)
//! 4092    4  crc: CRC32C of bytes 0..4092
//! ```

use super::error::{le_u32, le_u64, need, FormatError};
use super::{crc::page_crc, PAGE_SIZE};

/// The super block signature.
pub const SIGNATURE: &[u8; 8] = b"SPDKBLOB";
/// The oldest super block version SPDK loads (`SPDK_BS_INITIAL_VERSION`).
pub const MIN_VERSION: u32 = 1;
/// The version SPDK v26.05 writes and the newest it loads (`SPDK_BS_VERSION`).
pub const VERSION: u32 = 3;
/// The blobstore type lvolstores use.
pub const BSTYPE_LVOLSTORE: &[u8] = b"LVOLSTORE";

/// The fields of a super block, as stored (zero meaning "old default" is kept as zero; see the
/// `effective_*` methods and [`Geometry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperBlock {
    /// Format version.
    pub version: u32,
    /// The `length` field (SPDK writes 4096 and never reads it).
    pub length: u32,
    /// 1 after a clean unload; SPDK rebuilds the masks from the md pages when it is 0.
    pub clean: u32,
    /// The application's root blob (the lvstore's blob), or [`super::BLOBID_INVALID`].
    pub super_blob: u64,
    /// Cluster size in bytes.
    pub cluster_size: u32,
    /// First md page of the used md pages mask.
    pub used_page_mask_start: u32,
    /// Length in md pages of the used md pages mask.
    pub used_page_mask_len: u32,
    /// First md page of the used clusters mask.
    pub used_cluster_mask_start: u32,
    /// Length in md pages of the used clusters mask.
    pub used_cluster_mask_len: u32,
    /// First md page of the metadata region.
    pub md_start: u32,
    /// Number of md pages in the metadata region (also the number of possible blob ids).
    pub md_len: u32,
    /// Blobstore type, zero padded.
    pub bstype: [u8; 16],
    /// First md page of the used blob ids mask.
    pub used_blobid_mask_start: u32,
    /// Length in md pages of the used blob ids mask (0: none, pre-version-3 image).
    pub used_blobid_mask_len: u32,
    /// Blobstore size in bytes (0: the device size).
    pub size: u64,
    /// I/O unit size in bytes, the device block size (0: 4096).
    pub io_unit_size: u32,
    /// Metadata page size in bytes (0: 4096).
    pub md_page_size: u32,
}

impl SuperBlock {
    /// Decodes a super block from the first 4096 bytes of `bytes` and checks what SPDK's
    /// `bs_super_validate` checks without a device: signature, version range and CRC.
    /// [`SuperBlock::geometry`] checks the rest against the device size.
    pub fn decode(bytes: &[u8]) -> Result<SuperBlock, FormatError> {
        need("super block", bytes, PAGE_SIZE)?;
        let b = &bytes[..PAGE_SIZE];
        let mut sig = [0u8; 8];
        sig.copy_from_slice(&b[0..8]);
        if &sig != SIGNATURE {
            return Err(FormatError::BadSignature(sig));
        }
        let version = le_u32(b, 8);
        if !(MIN_VERSION..=VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let stored = le_u32(b, PAGE_SIZE - 4);
        let computed = page_crc(b);
        if stored != computed {
            return Err(FormatError::BadCrc { what: "super block", stored, computed });
        }
        let mut bstype = [0u8; 16];
        bstype.copy_from_slice(&b[56..72]);
        Ok(SuperBlock {
            version,
            length: le_u32(b, 12),
            clean: le_u32(b, 16),
            super_blob: le_u64(b, 20),
            cluster_size: le_u32(b, 28),
            used_page_mask_start: le_u32(b, 32),
            used_page_mask_len: le_u32(b, 36),
            used_cluster_mask_start: le_u32(b, 40),
            used_cluster_mask_len: le_u32(b, 44),
            md_start: le_u32(b, 48),
            md_len: le_u32(b, 52),
            bstype,
            used_blobid_mask_start: le_u32(b, 72),
            used_blobid_mask_len: le_u32(b, 76),
            size: le_u64(b, 80),
            io_unit_size: le_u32(b, 88),
            md_page_size: le_u32(b, 92),
        })
    }

    /// Encodes the super block into a 4096-byte page with the reserved area zeroed and the CRC
    /// computed, as SPDK's `bs_write_super` does.
    pub fn encode(&self) -> [u8; PAGE_SIZE] {
        let mut b = [0u8; PAGE_SIZE];
        b[0..8].copy_from_slice(SIGNATURE);
        let mut put32 = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put32(8, self.version);
        put32(12, self.length);
        put32(16, self.clean);
        put32(28, self.cluster_size);
        put32(32, self.used_page_mask_start);
        put32(36, self.used_page_mask_len);
        put32(40, self.used_cluster_mask_start);
        put32(44, self.used_cluster_mask_len);
        put32(48, self.md_start);
        put32(52, self.md_len);
        put32(72, self.used_blobid_mask_start);
        put32(76, self.used_blobid_mask_len);
        put32(88, self.io_unit_size);
        put32(92, self.md_page_size);
        b[20..28].copy_from_slice(&self.super_blob.to_le_bytes());
        b[56..72].copy_from_slice(&self.bstype);
        b[80..88].copy_from_slice(&self.size.to_le_bytes());
        let crc = page_crc(&b);
        b[PAGE_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Whether the blobstore was unloaded cleanly (SPDK writes 1; anything else makes it recover).
    pub fn is_clean(&self) -> bool {
        self.clean == 1
    }

    /// The blobstore type with its zero padding removed.
    pub fn bstype_str(&self) -> String {
        let end = self.bstype.iter().position(|&c| c == 0).unwrap_or(self.bstype.len());
        String::from_utf8_lossy(&self.bstype[..end]).into_owned()
    }

    /// The md page size SPDK uses: the stored one, or 4096 when the field is 0.
    pub fn effective_md_page_size(&self) -> u32 {
        if self.md_page_size == 0 {
            PAGE_SIZE as u32
        } else {
            self.md_page_size
        }
    }

    /// The I/O unit size SPDK uses: the stored one, or 4096 when the field is 0.
    pub fn effective_io_unit_size(&self) -> u32 {
        if self.io_unit_size == 0 {
            PAGE_SIZE as u32
        } else {
            self.io_unit_size
        }
    }

    /// The blobstore size SPDK uses: the stored one, or the device size when the field is 0.
    pub fn effective_size(&self, device_size: u64) -> u64 {
        if self.size == 0 {
            device_size
        } else {
            self.size
        }
    }

    /// Checks the super block against a device of `device_size` bytes and derives the geometry:
    /// sizes consistent with each other, the blobstore no larger than the device (SPDK's own
    /// check), and the masks and the md region inside it, not overlapping, and the masks large
    /// enough for what they describe.
    pub fn geometry(&self, device_size: u64) -> Result<Geometry, FormatError> {
        let bad = |m: String| Err(FormatError::BadGeometry(m));
        let md_page_size = self.effective_md_page_size();
        let io_unit_size = self.effective_io_unit_size();
        let size = self.effective_size(device_size);
        if size > device_size {
            return bad(format!("blobstore size {size} exceeds the device size {device_size}"));
        }
        if md_page_size < PAGE_SIZE as u32 || !md_page_size.is_multiple_of(PAGE_SIZE as u32) {
            return bad(format!("md page size {md_page_size} is not a multiple of 4096"));
        }
        if self.cluster_size < md_page_size || !self.cluster_size.is_multiple_of(md_page_size) {
            return bad(format!(
                "cluster size {} is not a multiple of the md page size {md_page_size}",
                self.cluster_size
            ));
        }
        if !io_unit_size.is_power_of_two() || !md_page_size.is_multiple_of(io_unit_size) {
            return bad(format!("io unit size {io_unit_size} does not divide the md page size"));
        }
        let total_clusters = size / u64::from(self.cluster_size);
        if total_clusters == 0 {
            return bad(format!("blobstore size {size} holds no cluster of {}", self.cluster_size));
        }
        if total_clusters > u64::from(u32::MAX) {
            return bad(format!("{total_clusters} clusters do not fit 32-bit cluster indices"));
        }
        let pages = size / u64::from(md_page_size);
        let regions = [
            ("super block", 0u64, 1u64),
            ("used page mask", self.used_page_mask_start.into(), self.used_page_mask_len.into()),
            ("used cluster mask", self.used_cluster_mask_start.into(), self.used_cluster_mask_len.into()),
            ("used blobid mask", self.used_blobid_mask_start.into(), self.used_blobid_mask_len.into()),
            ("md region", self.md_start.into(), self.md_len.into()),
        ];
        for &(region, start, len) in &regions {
            if start + len > pages {
                return Err(FormatError::RegionOutOfBounds { region, start, len, limit: pages });
            }
        }
        for (i, &(a, sa, la)) in regions.iter().enumerate() {
            for &(b, sb, lb) in &regions[i + 1..] {
                if la > 0 && lb > 0 && sa < sb + lb && sb < sa + la {
                    return bad(format!("{a} and {b} overlap"));
                }
            }
        }
        let mask_bytes = |bits: u64| super::mask::HEADER_SIZE as u64 + bits.div_ceil(8);
        let region_bytes = |len: u32| u64::from(len) * u64::from(md_page_size);
        if region_bytes(self.used_page_mask_len) < mask_bytes(self.md_len.into()) {
            return bad(format!("used page mask too small for {} md pages", self.md_len));
        }
        if region_bytes(self.used_cluster_mask_len) < mask_bytes(total_clusters) {
            return bad(format!("used cluster mask too small for {total_clusters} clusters"));
        }
        if self.used_blobid_mask_len != 0 && region_bytes(self.used_blobid_mask_len) < mask_bytes(self.md_len.into()) {
            return bad(format!("used blobid mask too small for {} md pages", self.md_len));
        }
        let pages_per_cluster = u64::from(self.cluster_size / md_page_size);
        let md_clusters = (u64::from(self.md_start) + u64::from(self.md_len)).div_ceil(pages_per_cluster);
        if md_clusters > total_clusters {
            return bad(format!("metadata needs {md_clusters} clusters of {total_clusters}"));
        }
        Ok(Geometry {
            size,
            cluster_size: self.cluster_size,
            md_page_size,
            io_unit_size,
            total_clusters,
            md_clusters,
            md_start: self.md_start,
            md_len: self.md_len,
        })
    }
}

/// The blobstore's geometry with SPDK's defaults applied and validated by
/// [`SuperBlock::geometry`]; the unit conversions in [`super::units`] take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Blobstore size in bytes.
    pub size: u64,
    /// Cluster size in bytes.
    pub cluster_size: u32,
    /// Metadata page size in bytes (the unit of every region offset).
    pub md_page_size: u32,
    /// I/O unit size in bytes: the device block size, the unit of the LBAs SPDK keeps in memory.
    pub io_unit_size: u32,
    /// Clusters in the blobstore (`size / cluster_size`, rounded down).
    pub total_clusters: u64,
    /// Clusters at the front taken by the super block, masks and md region; they are marked
    /// used in the cluster mask but belong to no blob.
    pub md_clusters: u64,
    /// First md page of the metadata region.
    pub md_start: u32,
    /// Md pages in the metadata region.
    pub md_len: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The super block of a fresh 64 MiB lvstore with 1 MiB clusters and 512-byte blocks.
    pub(crate) fn sample() -> SuperBlock {
        let mut bstype = [0u8; 16];
        bstype[..9].copy_from_slice(BSTYPE_LVOLSTORE);
        SuperBlock {
            version: 3,
            length: 4096,
            clean: 1,
            super_blob: 0x1_0000_0000,
            cluster_size: 1 << 20,
            used_page_mask_start: 1,
            used_page_mask_len: 1,
            used_cluster_mask_start: 2,
            used_cluster_mask_len: 1,
            md_start: 4,
            md_len: 64,
            bstype,
            used_blobid_mask_start: 3,
            used_blobid_mask_len: 1,
            size: 64 << 20,
            io_unit_size: 512,
            md_page_size: 4096,
        }
    }

    #[test]
    fn round_trip_and_geometry() {
        let sb = sample();
        let bytes = sb.encode();
        assert_eq!(&bytes[0..8], b"SPDKBLOB");
        assert_eq!(SuperBlock::decode(&bytes).unwrap(), sb);
        let g = sb.geometry(64 << 20).unwrap();
        assert_eq!(g.total_clusters, 64);
        assert_eq!(g.md_clusters, 1); // 68 pages of 256 per cluster
        assert_eq!(sb.bstype_str(), "LVOLSTORE");
    }

    #[test]
    fn rejects_bad_crc_signature_version() {
        let mut bytes = sample().encode();
        bytes[100] ^= 1;
        assert!(matches!(SuperBlock::decode(&bytes), Err(FormatError::BadCrc { .. })));
        let mut bytes = sample().encode();
        bytes[0] = b'X';
        assert!(matches!(SuperBlock::decode(&bytes), Err(FormatError::BadSignature(_))));
        let mut sb = sample();
        sb.version = 4;
        assert_eq!(SuperBlock::decode(&sb.encode()), Err(FormatError::UnsupportedVersion(4)));
        sb.version = 0;
        assert_eq!(SuperBlock::decode(&sb.encode()), Err(FormatError::UnsupportedVersion(0)));
        assert!(matches!(SuperBlock::decode(&[0u8; 100]), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn geometry_checks() {
        let sb = sample();
        // Device smaller than the blobstore: SPDK refuses to load.
        assert!(matches!(sb.geometry(32 << 20), Err(FormatError::BadGeometry(_))));
        let mut s = sample();
        s.md_len = 20000;
        assert!(matches!(s.geometry(64 << 20), Err(FormatError::RegionOutOfBounds { .. })));
        let mut s = sample();
        s.used_cluster_mask_start = 1;
        assert!(matches!(s.geometry(64 << 20), Err(FormatError::BadGeometry(_))));
        let mut s = sample();
        s.cluster_size = 1000;
        assert!(s.geometry(64 << 20).is_err());
        let mut s = sample();
        s.md_len = 40000; // fits 64 MiB of pages only partly, and the mask would be too small
        assert!(s.geometry(64 << 20).is_err());
        // Old images: size 0 means the device, io unit and md page size 0 mean 4096.
        let mut s = sample();
        s.size = 0;
        s.io_unit_size = 0;
        s.md_page_size = 0;
        let g = s.geometry(64 << 20).unwrap();
        assert_eq!((g.size, g.io_unit_size, g.md_page_size), (64 << 20, 4096, 4096));
    }
}
