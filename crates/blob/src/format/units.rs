//! Unit conversions: blob ids, md pages, clusters, LBAs.
//!
//! - A blob id is `1 << 32 | page`, where `page` is the md page (index in the md region) holding
//!   the blob's first metadata page. The high bit is only there to catch code confusing the two.
//! - Extent descriptors (RLE and extent pages) store *device cluster indices*, 0 meaning
//!   unallocated (cluster 0 always holds the super block, so no blob can own it). SPDK converts
//!   them to LBAs in units of the device block (`io_unit_size`) when it loads a blob and back when
//!   it stores one; [`super::BlobMd`] keeps the indices, [`cluster_to_lba`] gives the LBAs.
//! - The extent table stores md page indices of extent pages; extent page `n` of a blob maps blob
//!   clusters `n * 512 .. (n + 1) * 512`.

use super::superblock::Geometry;
use super::{BLOBID_INVALID, EXTENTS_PER_EP};

/// The high bit SPDK sets in every blob id (`SPDK_BLOB_BLOBID_HIGH_BIT`).
pub const BLOBID_HIGH_BIT: u64 = 1 << 32;

/// The md page holding the first page of blob `id` (its low 32 bits), as `bs_blobid_to_page`.
pub fn blobid_to_page(id: u64) -> u32 {
    id as u32
}

/// The blob id whose first md page is `page`, as `bs_page_to_blobid`
/// ([`BLOBID_INVALID`] if `page` does not fit 32 bits).
pub fn page_to_blobid(page: u64) -> u64 {
    if page > u64::from(u32::MAX) {
        BLOBID_INVALID
    } else {
        BLOBID_HIGH_BIT | page
    }
}

/// Byte offset on the device of md page `page` of the md region.
pub fn md_page_offset(geo: &Geometry, page: u32) -> u64 {
    (u64::from(geo.md_start) + u64::from(page)) * u64::from(geo.md_page_size)
}

/// Byte offset on the device of the region starting at md page `start` (super block relative).
pub fn region_offset(geo: &Geometry, start: u32) -> u64 {
    u64::from(start) * u64::from(geo.md_page_size)
}

/// LBAs (device blocks of `io_unit_size`) per cluster.
pub fn lbas_per_cluster(geo: &Geometry) -> u64 {
    u64::from(geo.cluster_size / geo.io_unit_size)
}

/// The LBA SPDK keeps in memory for a device cluster index (`bs_cluster_to_lba`); 0 stays 0.
pub fn cluster_to_lba(geo: &Geometry, cluster: u32) -> u64 {
    u64::from(cluster) * lbas_per_cluster(geo)
}

/// The device cluster index of an LBA at a cluster boundary (`bs_lba_to_cluster`), or `None`
/// if it is not at a boundary or too large for a cluster index.
pub fn lba_to_cluster(geo: &Geometry, lba: u64) -> Option<u32> {
    let per = lbas_per_cluster(geo);
    if !lba.is_multiple_of(per) {
        return None;
    }
    u32::try_from(lba / per).ok()
}

/// Byte offset on the device of a cluster.
pub fn cluster_offset(geo: &Geometry, cluster: u32) -> u64 {
    u64::from(cluster) * u64::from(geo.cluster_size)
}

/// Index in the extent table of the extent page mapping blob cluster `cluster_num`.
pub fn cluster_to_extent_page(cluster_num: u64) -> u64 {
    cluster_num / EXTENTS_PER_EP
}

/// Number of extent pages a blob of `num_clusters` clusters has in its extent table.
pub fn extent_pages_for(num_clusters: u64) -> u64 {
    num_clusters.div_ceil(EXTENTS_PER_EP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(page_to_blobid(5), 0x1_0000_0005);
        assert_eq!(blobid_to_page(0x1_0000_0005), 5);
        assert_eq!(page_to_blobid(1 << 33), BLOBID_INVALID);
        let geo = Geometry {
            size: 64 << 20,
            cluster_size: 1 << 20,
            md_page_size: 4096,
            io_unit_size: 512,
            total_clusters: 64,
            md_clusters: 1,
            md_start: 4,
            md_len: 64,
        };
        assert_eq!(lbas_per_cluster(&geo), 2048);
        assert_eq!(cluster_to_lba(&geo, 3), 6144);
        assert_eq!(lba_to_cluster(&geo, 6144), Some(3));
        assert_eq!(lba_to_cluster(&geo, 6145), None);
        assert_eq!(md_page_offset(&geo, 2), 6 * 4096);
        assert_eq!(cluster_to_extent_page(511), 0);
        assert_eq!(cluster_to_extent_page(512), 1);
        assert_eq!(extent_pages_for(0), 0);
        assert_eq!(extent_pages_for(513), 2);
    }
}
