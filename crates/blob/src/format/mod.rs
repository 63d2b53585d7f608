//! SPDK's blobstore on-disk format (v26.05, super block version 3), sans I/O: bytes in, typed
//! structs out, and back.
//!
//! Layout of a blobstore device, in units of the metadata page size (`md_page_size`, 4 KiB
//! unless the device's physical block is larger):
//!
//! ```text
//! page 0                      super block
//! used_page_mask_start..      mask of used metadata pages      (one bit per md page)
//! used_cluster_mask_start..   mask of used clusters            (one bit per cluster)
//! used_blobid_mask_start..    mask of used blob ids            (one bit per md page)
//! md_start..md_start+md_len   metadata region: blob md pages and extent pages
//! ...                         data clusters (the clusters holding all of the above are
//!                             marked used in the cluster mask too)
//! ```
//!
//! Every multi-byte field is little-endian and every structure is packed (no padding).
//! Modules: [`superblock`], [`mask`] (the three bit masks), [`page`] (one metadata page),
//! [`descriptor`] (the descriptors inside a page), [`blob`] (a blob's chain of pages and its
//! extent pages as a [`blob::BlobMd`]) and [`units`] (id, page, cluster and LBA arithmetic).

pub mod blob;
pub mod crc;
pub mod descriptor;
pub mod error;
pub mod mask;
pub mod page;
pub mod superblock;
pub mod units;

pub use blob::{BlobMd, ExtentPage, ParseLimits, Xattr};
pub use descriptor::Descriptor;
pub use error::FormatError;
pub use mask::{MaskKind, MdMask};
pub use page::MdPage;
pub use superblock::SuperBlock;

/// Size of the on-disk metadata page structure (`SPDK_BS_PAGE_SIZE`): super block, md pages and
/// extent pages are all this big, even when `md_page_size` is larger (the rest is unused).
pub const PAGE_SIZE: usize = 4096;

/// Size of the descriptor area of a metadata page (`SPDK_BS_MAX_DESC_SIZE`).
pub const DESC_AREA_SIZE: usize = 4072;

/// Page index meaning "no next page" in a page's `next` field (`SPDK_INVALID_MD_PAGE`).
pub const INVALID_MD_PAGE: u32 = u32::MAX;

/// Blob id meaning "no blob" (`SPDK_BLOBID_INVALID`), e.g. no super blob.
pub const BLOBID_INVALID: u64 = u64::MAX;

/// The parent id SPDK reports for a clone of an external snapshot
/// (`SPDK_BLOBID_EXTERNAL_SNAPSHOT`); never stored on disk.
pub const BLOBID_EXTERNAL_SNAPSHOT: u64 = u64::MAX - 1;

/// Number of clusters one extent page maps (`SPDK_EXTENTS_PER_EP`): the largest power of two
/// whose cluster indices fit in a page's descriptor area.
pub const EXTENTS_PER_EP: u64 = 512;

/// Internal xattr naming the snapshot a clone reads unallocated clusters from (`BLOB_SNAPSHOT`):
/// the snapshot's blob id, 8 bytes little-endian. Only honoured on thin-provisioned blobs.
pub const XATTR_SNAPSHOT: &str = "SNAP";

/// Internal xattr on a snapshot being created: the id of the blob it is a snapshot of
/// (`SNAPSHOT_IN_PROGRESS`). A blob still carrying it after a crash is repaired or deleted on load.
pub const XATTR_SNAPSHOT_IN_PROGRESS: &str = "SNAPTMP";

/// Internal xattr on a snapshot being deleted: the id of its clone (`SNAPSHOT_PENDING_REMOVAL`).
pub const XATTR_SNAPSHOT_PENDING_REMOVAL: &str = "SNAPRM";

/// Internal xattr of a clone of an external snapshot: the external snapshot's id, opaque bytes
/// (`BLOB_EXTERNAL_SNAPSHOT_ID`).
pub const XATTR_EXTERNAL_SNAPSHOT_ID: &str = "EXTSNAP";
