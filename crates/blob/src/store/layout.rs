//! Where a new blobstore puts its metadata (SPDK's `spdk_bs_init` layout): the super block in
//! page 0, then the used metadata page mask, the used cluster mask (with room to grow to as many
//! clusters as there are metadata pages), the used blob id mask, and the metadata pages. The
//! clusters those pages cover are used from the start; data clusters follow.
//! Units: "pages" are metadata pages (`md_page_size` bytes, at least 4 KiB and at least the
//! device's physical block); offsets are from the start of the device.

/// Bytes of the header of an on-disk mask (`spdk_bs_md_mask`: a type byte and a 32-bit length in
/// bits, packed).
pub const MASK_HEADER_BYTES: u64 = 5;

/// The smallest metadata page (SPDK's `SPDK_BS_PAGE_SIZE`).
pub const MIN_MD_PAGE_SIZE: u32 = 4096;

/// What a blobstore is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOpts {
    /// Bytes per cluster (a multiple of the device's block and of the metadata page).
    pub cluster_size: u32,
    /// Metadata pages to reserve (None: one per cluster, SPDK's default).
    pub num_md_pages: Option<u32>,
    /// Bytes per metadata page wanted (raised to 4 KiB and to the physical block).
    pub md_page_size: u32,
}

/// The device a blobstore is created on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevGeometry {
    /// Bytes per logical block (the blobstore's I/O unit).
    pub block_size: u32,
    /// Bytes per physical block.
    pub phys_block_size: u32,
    /// Number of logical blocks.
    pub num_blocks: u64,
}

/// Where everything of a new blobstore lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per cluster.
    pub cluster_size: u32,
    /// Bytes per metadata page.
    pub md_page_size: u32,
    /// Bytes per I/O unit (the device's block).
    pub io_unit_size: u32,
    /// Clusters on the device.
    pub total_clusters: u64,
    /// First page and page count of the used metadata page mask.
    pub used_page_mask: (u32, u32),
    /// First page and page count of the used cluster mask (as written now).
    pub used_cluster_mask: (u32, u32),
    /// Pages set aside for the used cluster mask (room to grow).
    pub used_cluster_mask_room: u32,
    /// First page and page count of the used blob id mask.
    pub used_blobid_mask: (u32, u32),
    /// First page of the metadata pages.
    pub md_start: u32,
    /// Number of metadata pages.
    pub md_len: u32,
    /// Clusters at the start of the device the metadata occupies (used from the start).
    pub md_clusters: u64,
    /// Device size in bytes.
    pub size: u64,
}

/// Why a blobstore cannot be made on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// The geometry or options do not fit together (the reason).
    Invalid(String),
    /// The metadata would not fit on the device.
    TooSmall(String),
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::Invalid(s) | LayoutError::TooSmall(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Pages a mask of `bits` bits takes, header included.
pub(crate) fn mask_pages(bits: u64, page: u32) -> u64 {
    (MASK_HEADER_BYTES + bits.div_ceil(8)).div_ceil(page as u64)
}

impl Layout {
    /// The layout SPDK's `spdk_bs_init` gives a device of `dev` with `opts`.
    pub fn new(dev: DevGeometry, opts: InitOpts) -> Result<Layout, LayoutError> {
        let bs = dev.block_size;
        if bs == 0 || dev.phys_block_size == 0 || !dev.phys_block_size.is_multiple_of(bs) {
            return Err(LayoutError::Invalid(format!(
                "unsupported block size {bs} (physical {})",
                dev.phys_block_size
            )));
        }
        let md_page_size = dev.phys_block_size.max(MIN_MD_PAGE_SIZE).max(opts.md_page_size);
        if !md_page_size.is_power_of_two() {
            return Err(LayoutError::Invalid(format!("metadata page size {md_page_size} is not a power of two")));
        }
        let cs = opts.cluster_size;
        if cs < md_page_size || !cs.is_multiple_of(md_page_size) || !cs.is_multiple_of(bs) {
            return Err(LayoutError::Invalid(format!(
                "cluster size {cs} is not a multiple of the metadata page ({md_page_size}) and the block ({bs})"
            )));
        }
        let size =
            dev.num_blocks.checked_mul(bs as u64).ok_or_else(|| LayoutError::Invalid("device too large".into()))?;
        if size < cs as u64 {
            return Err(LayoutError::TooSmall(format!(
                "the device ({size} bytes) is smaller than one cluster ({cs} bytes)"
            )));
        }
        let total_clusters = dev.num_blocks / (cs / bs) as u64;
        let md_len = match opts.num_md_pages {
            Some(n) => n as u64,
            None => total_clusters,
        };
        let md_len = u32::try_from(md_len)
            .map_err(|_| LayoutError::Invalid(format!("{md_len} metadata pages are more than a blobstore holds")))?;
        let page = md_page_size;
        let too_big = |what: &str| LayoutError::Invalid(format!("the {what} does not fit 32-bit page offsets"));
        let mut at = 1u64;
        let used_page_mask = (at, mask_pages(md_len as u64, page));
        at += used_page_mask.1;
        let cluster_mask_len = mask_pages(total_clusters, page);
        let cluster_mask_room = mask_pages(md_len as u64, page).max(cluster_mask_len);
        let used_cluster_mask = (at, cluster_mask_len);
        at += cluster_mask_room;
        let used_blobid_mask = (at, mask_pages(md_len as u64, page));
        at += used_blobid_mask.1;
        let md_start = at;
        at += md_len as u64;
        let pages_per_cluster = (cs / page) as u64;
        let md_clusters = at.div_ceil(pages_per_cluster);
        if md_clusters > total_clusters {
            return Err(LayoutError::TooSmall(format!(
                "the metadata ({at} pages of {page} bytes) needs {md_clusters} clusters and the device has {total_clusters}: \
                 use fewer metadata pages or larger clusters"
            )));
        }
        let p32 = |v: u64, what: &str| u32::try_from(v).map_err(|_| too_big(what));
        Ok(Layout {
            cluster_size: cs,
            md_page_size: page,
            io_unit_size: bs,
            total_clusters,
            used_page_mask: (p32(used_page_mask.0, "page mask")?, p32(used_page_mask.1, "page mask")?),
            used_cluster_mask: (p32(used_cluster_mask.0, "cluster mask")?, p32(used_cluster_mask.1, "cluster mask")?),
            used_cluster_mask_room: p32(cluster_mask_room, "cluster mask")?,
            used_blobid_mask: (p32(used_blobid_mask.0, "blob id mask")?, p32(used_blobid_mask.1, "blob id mask")?),
            md_start: p32(md_start, "metadata")?,
            md_len,
            md_clusters,
            size,
        })
    }

    /// Clusters left for data.
    pub fn data_clusters(&self) -> u64 {
        self.total_clusters - self.md_clusters
    }

    /// Metadata pages per cluster.
    pub fn pages_per_cluster(&self) -> u64 {
        (self.cluster_size / self.md_page_size) as u64
    }

    /// Device blocks per cluster.
    pub fn blocks_per_cluster(&self) -> u64 {
        (self.cluster_size / self.io_unit_size) as u64
    }

    /// The device block where metadata page `page` (counted from the start of the device)
    /// begins.
    pub fn page_to_block(&self, page: u64) -> u64 {
        page * (self.md_page_size / self.io_unit_size) as u64
    }
}

/// SPDK lvol's number of metadata pages for a device of `total_clusters` clusters and a
/// `num_md_pages_per_cluster_ratio` (percent).
pub fn lvs_md_pages(total_clusters: u64, ratio_percent: u32) -> u64 {
    ratio_percent as u64 * total_clusters / 100
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(block_size: u32, num_blocks: u64) -> DevGeometry {
        DevGeometry { block_size, phys_block_size: block_size, num_blocks }
    }

    #[test]
    fn a_64_mib_device_with_1_mib_clusters() {
        // 64 clusters, 64 metadata pages: each mask fits one page.
        let l =
            Layout::new(dev(512, 131072), InitOpts { cluster_size: 1 << 20, num_md_pages: None, md_page_size: 4096 })
                .unwrap();
        assert_eq!(l.total_clusters, 64);
        assert_eq!(l.used_page_mask, (1, 1));
        assert_eq!(l.used_cluster_mask, (2, 1));
        assert_eq!(l.used_blobid_mask, (3, 1));
        assert_eq!((l.md_start, l.md_len), (4, 64));
        // 68 pages of 4 KiB, 256 per cluster: one cluster.
        assert_eq!(l.md_clusters, 1);
        assert_eq!(l.data_clusters(), 63);
        assert_eq!(l.page_to_block(4), 32);
    }

    #[test]
    fn masks_span_pages_when_the_device_is_large() {
        // 40,000 clusters of 1 MiB: 5,000 bytes of mask plus the header take 2 pages.
        let l = Layout::new(
            dev(4096, 40_000 * 256),
            InitOpts { cluster_size: 1 << 20, num_md_pages: None, md_page_size: 0 },
        )
        .unwrap();
        assert_eq!(l.used_page_mask, (1, 2));
        assert_eq!(l.used_cluster_mask, (3, 2));
        assert_eq!(l.used_blobid_mask, (5, 2));
        assert_eq!(l.md_start, 7);
        assert_eq!(l.md_clusters, (7u64 + 40_000).div_ceil(256));
    }

    #[test]
    fn refuses_what_spdk_refuses() {
        let o = InitOpts { cluster_size: 1 << 20, num_md_pages: None, md_page_size: 4096 };
        assert!(matches!(Layout::new(dev(512, 1000), o), Err(LayoutError::TooSmall(_))));
        let odd = InitOpts { cluster_size: 6144, ..o };
        assert!(matches!(Layout::new(dev(512, 1 << 20), odd), Err(LayoutError::Invalid(_))));
        // Metadata larger than the device.
        let many = InitOpts { cluster_size: 16384, num_md_pages: Some(100_000), md_page_size: 4096 };
        assert!(matches!(Layout::new(dev(4096, 64), many), Err(LayoutError::TooSmall(_))));
    }
}
