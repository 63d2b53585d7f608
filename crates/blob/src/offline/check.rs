//! Consistency check of an [`Image`]: what SPDK's load relies on (masks matching the md pages,
//! clusters owned once) and what its recovery would repair.
//!
//! Facts the rules come from (SPDK v26.05 `lib/blob/blobstore.c`):
//! - every md page in a blob's chain and every extent page it references is set in the used
//!   page mask; the first page of each blob is also set in the blob id mask;
//! - every cluster a blob maps is set in the used cluster mask, and so are the clusters holding
//!   the super block, the masks and the md region (`md_clusters`);
//! - no cluster belongs to two blobs: a snapshot takes the clusters of the blob it snapshots
//!   (their maps are swapped, the blob becomes a thin clone), and a clone allocates its own on
//!   write, so snapshots and clones never share a cluster;
//! - a thin blob's `SNAP` internal xattr names its parent snapshot, which must exist;
//! - the masks on disk are only up to date when the super block says clean: after a crash SPDK
//!   rebuilds all three from the md pages (`bs_recover` reads none of them), so mismatches,
//!   wrong lengths and unreadable masks in a dirty image are stale masks;
//! - a live grow (`spdk_bs_grow_live`, `bdev_lvol_grow_lvstore`) writes only the super block
//!   (the new size, and not clean); the cluster mask keeps its old length until the next
//!   unload. Cut short by a crash, that is a dirty store whose cluster mask covers fewer
//!   clusters than its size: the next load rebuilds it. A clean store with such a mask (no
//!   writer leaves one) loads too: `bs_load_used_clusters_cpl` takes the mask's length (SPDK
//!   hands out the clusters past it only after its next unload writes the whole mask), and
//!   Ferrite takes them as free;
//! - SPDK's lvol layer opens the super blob to find the lvstore (`lvs_open_super`): with none
//!   set or one that is not a blob of the store, no lvstore loads;
//! - `io_unit_size` is the block size of the device the store was made on (at least 512 bytes
//!   for any SPDK or Ferrite bdev). Ferrite loads a store only on a device of that block size;
//!   SPDK loads one with a smaller `io_unit_size` but gives its lvols blocks of that size, and
//!   their I/O fails.

use super::{BlobEntry, Image};
use crate::format::blob::{Access, Parent};
use crate::format::units::blobid_to_page;
use crate::format::{FormatError, MaskKind, XATTR_SNAPSHOT_IN_PROGRESS, XATTR_SNAPSHOT_PENDING_REMOVAL};
use std::collections::HashMap;
use std::fmt;

/// The smallest device block size SPDK and Ferrite bdevs have (and so the smallest
/// `io_unit_size` a store is made with).
const MIN_BLOCK_SIZE: u32 = 512;

/// One inconsistency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The super block's clean flag is not set: SPDK will rebuild the masks on load (and
    /// finish or undo interrupted snapshot operations), so mask mismatches are expected.
    NotClean,
    /// A mask cannot be decoded.
    MaskUnreadable {
        /// Which mask.
        mask: MaskKind,
        /// Why.
        error: FormatError,
    },
    /// A mask's length in bits is not what the super block implies.
    MaskLength {
        /// Which mask.
        mask: MaskKind,
        /// Bits in the mask.
        bits: u32,
        /// Bits expected (at least, for the cluster mask).
        expected: u64,
    },
    /// A blob's metadata cannot be read (bad CRC, broken or looping chain, bad descriptors, an
    /// invalid extent page).
    BlobUnreadable {
        /// Blob id.
        blob: u64,
        /// Why.
        error: FormatError,
    },
    /// A page marked used fails its CRC.
    BadPageCrc {
        /// Md page index.
        page: u32,
    },
    /// An md page a blob uses is not marked in the used page mask (SPDK could hand it out again).
    PageNotMarked {
        /// Md page index.
        page: u32,
        /// The blob using it.
        blob: u64,
    },
    /// An md page is marked used but no blob uses it (leaked).
    PageLeaked {
        /// Md page index.
        page: u32,
    },
    /// An md page is used by two blobs (or twice by one).
    PageUsedTwice {
        /// Md page index.
        page: u32,
        /// First user.
        first: u64,
        /// Second user.
        second: u64,
    },
    /// A blob's first page is not marked in the blob id mask.
    BlobIdNotMarked {
        /// Blob id.
        blob: u64,
    },
    /// The blob id mask marks a page that starts no blob.
    BlobIdLeaked {
        /// Md page index.
        page: u32,
    },
    /// A blob maps a cluster past the end of the blobstore.
    ClusterOutOfRange {
        /// Blob id.
        blob: u64,
        /// Device cluster index.
        cluster: u32,
    },
    /// A blob maps a cluster holding metadata.
    ClusterInMetadata {
        /// Blob id.
        blob: u64,
        /// Device cluster index.
        cluster: u32,
    },
    /// A cluster is mapped by two blobs, or twice by one.
    ClusterUsedTwice {
        /// Device cluster index.
        cluster: u32,
        /// First user.
        first: u64,
        /// Second user.
        second: u64,
    },
    /// A cluster a blob maps is not marked in the used cluster mask.
    ClusterNotMarked {
        /// Device cluster index.
        cluster: u32,
        /// The blob mapping it.
        blob: u64,
    },
    /// A metadata cluster is not marked in the used cluster mask.
    MetadataClusterNotMarked {
        /// Device cluster index.
        cluster: u32,
    },
    /// A cluster is marked used but no blob maps it (leaked).
    ClusterLeaked {
        /// Device cluster index.
        cluster: u32,
    },
    /// A blob's parent snapshot does not exist (or cannot be read).
    DanglingParent {
        /// Blob id.
        blob: u64,
        /// The parent id it names.
        parent: u64,
    },
    /// A blob's parent reference is malformed.
    BadParent {
        /// Blob id.
        blob: u64,
        /// Why.
        error: FormatError,
    },
    /// Following parents from a blob comes back to it.
    ParentLoop {
        /// Blob id.
        blob: u64,
    },
    /// The super block names a super blob that is not a blob of the store (or, in an lvstore,
    /// names none): the lvol layer finds no lvstore.
    SuperBlobInvalid {
        /// The id it names ([`crate::format::BLOBID_INVALID`] for none).
        blob: u64,
        /// Whether the blobstore type is an lvstore's.
        lvstore: bool,
    },
    /// The used cluster mask covers fewer clusters than the blobstore has: a grow was cut
    /// short (the super block has the new size, the mask not yet). Loads take the clusters
    /// past it as free; the next load of a dirty store, or the next unload, writes it whole.
    ClusterMaskShort {
        /// Bits in the mask.
        bits: u32,
        /// Clusters in the blobstore.
        clusters: u64,
    },
    /// The I/O unit size is smaller than any device block (512 bytes).
    BadIoUnitSize {
        /// The stored `io_unit_size`.
        io_unit_size: u32,
    },
    /// A blob has invalid flags SPDK does not know: it cannot be opened.
    UnknownInvalidFlags {
        /// Blob id.
        blob: u64,
        /// The flags.
        flags: u64,
    },
    /// A blob carries the mark of an interrupted snapshot creation or deletion; SPDK finishes or
    /// undoes it on load.
    InterruptedSnapshotOp {
        /// Blob id.
        blob: u64,
        /// The internal xattr found.
        xattr: &'static str,
    },
}

impl Problem {
    /// True for what a load of a blobstore that was not unloaded cleanly repairs by itself: the
    /// masks, which it rebuilds from the metadata without reading them (marks missing or left
    /// over, a wrong length, an unreadable mask, one cut short by a grow), and interrupted
    /// snapshot operations, which it finishes or undoes. On a clean image the masks are what
    /// SPDK trusts, so there the mask problems are real (see [`Problem::harmless_when_clean`]).
    pub fn repaired_by_load(&self) -> bool {
        matches!(
            self,
            Problem::NotClean
                | Problem::MaskUnreadable { .. }
                | Problem::MaskLength { .. }
                | Problem::ClusterMaskShort { .. }
                | Problem::PageNotMarked { .. }
                | Problem::PageLeaked { .. }
                | Problem::BlobIdNotMarked { .. }
                | Problem::BlobIdLeaked { .. }
                | Problem::ClusterNotMarked { .. }
                | Problem::MetadataClusterNotMarked { .. }
                | Problem::ClusterLeaked { .. }
                | Problem::InterruptedSnapshotOp { .. }
        )
    }

    /// True for what a clean image may have and still load with nothing lost, the next unload
    /// writing it right: a cluster mask shorter than the store (the clusters past it are free).
    pub fn harmless_when_clean(&self) -> bool {
        matches!(self, Problem::ClusterMaskShort { .. })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NotClean => write!(
                f,
                "not clean: the blobstore was not unloaded cleanly; SPDK rebuilds the masks from the md pages on load"
            ),
            Problem::MaskUnreadable { mask, error } => write!(f, "{}: {error}", mask.name()),
            Problem::MaskLength { mask, bits, expected } => {
                write!(f, "{} has {bits} bits, expected {expected}", mask.name())
            }
            Problem::BlobUnreadable { blob, error } => write!(f, "blob {blob:#x}: {error}"),
            Problem::BadPageCrc { page } => write!(f, "md page {page} is marked used but fails its crc"),
            Problem::PageNotMarked { page, blob } => {
                write!(f, "md page {page} used by blob {blob:#x} is not marked in the used page mask")
            }
            Problem::PageLeaked { page } => write!(f, "md page {page} is marked used but no blob uses it"),
            Problem::PageUsedTwice { page, first, second } => {
                write!(f, "md page {page} is used by blob {first:#x} and by blob {second:#x}")
            }
            Problem::BlobIdNotMarked { blob } => write!(f, "blob {blob:#x} is not marked in the blob id mask"),
            Problem::BlobIdLeaked { page } => {
                write!(f, "blob id mask marks md page {page}, which starts no blob")
            }
            Problem::ClusterOutOfRange { blob, cluster } => {
                write!(f, "blob {blob:#x} maps cluster {cluster}, past the end of the blobstore")
            }
            Problem::ClusterInMetadata { blob, cluster } => {
                write!(f, "blob {blob:#x} maps cluster {cluster}, which holds metadata")
            }
            Problem::ClusterUsedTwice { cluster, first, second } => {
                write!(f, "cluster {cluster} is mapped by blob {first:#x} and by blob {second:#x}")
            }
            Problem::ClusterNotMarked { cluster, blob } => {
                write!(f, "cluster {cluster} of blob {blob:#x} is not marked in the used cluster mask")
            }
            Problem::MetadataClusterNotMarked { cluster } => {
                write!(f, "metadata cluster {cluster} is not marked in the used cluster mask")
            }
            Problem::ClusterLeaked { cluster } => {
                write!(f, "cluster {cluster} is marked used but no blob maps it")
            }
            Problem::DanglingParent { blob, parent } => {
                write!(f, "blob {blob:#x} names parent snapshot {parent:#x}, which does not exist")
            }
            Problem::BadParent { blob, error } => write!(f, "blob {blob:#x}: parent: {error}"),
            Problem::ParentLoop { blob } => write!(f, "blob {blob:#x}: its parents loop back to it"),
            Problem::SuperBlobInvalid { blob, lvstore: true } if *blob == crate::format::BLOBID_INVALID => {
                write!(f, "super block names no super blob ({blob:#x}): no lvstore loads from it")
            }
            Problem::SuperBlobInvalid { blob, lvstore: true } => {
                write!(f, "super blob {blob:#x} is not a blob of this store: no lvstore loads from it")
            }
            Problem::SuperBlobInvalid { blob, lvstore: false } => {
                write!(f, "super block names super blob {blob:#x}, which is not a blob of this store")
            }
            Problem::ClusterMaskShort { bits, clusters } => write!(
                f,
                "used cluster mask covers {bits} of {clusters} clusters (a grow cut short): the store loads, and its \
                 next load after a crash, or its next unload, writes the whole mask"
            ),
            Problem::BadIoUnitSize { io_unit_size } => write!(
                f,
                "io_unit_size {io_unit_size} is not a device block size (512 bytes or more): Ferrite loads no \
                 lvstore from it, and SPDK's lvols on it get {io_unit_size}-byte blocks that fail I/O"
            ),
            Problem::UnknownInvalidFlags { blob, flags } => {
                write!(f, "blob {blob:#x} has unknown invalid flags {flags:#x}: SPDK cannot open it")
            }
            Problem::InterruptedSnapshotOp { blob, xattr } => {
                write!(f, "blob {blob:#x} carries {xattr}: an interrupted snapshot operation SPDK resolves on load")
            }
        }
    }
}

/// The result of [`check()`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Whether the super block's clean flag is set.
    pub clean: bool,
    /// Blobs found.
    pub blobs: usize,
    /// Md pages in use (chains and extent pages).
    pub used_pages: u64,
    /// Clusters mapped by blobs.
    pub used_clusters: u64,
    /// Everything found wrong, in a stable order.
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// Whether nothing is wrong (the CLI's exit status 0).
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// True if something was found and all of it is what the next load (or, of a clean image,
    /// the next unload) repairs: for an image not unloaded cleanly every problem is one
    /// [`Problem::repaired_by_load`] (what an image looks like after a crash, a grow cut short
    /// included); for a clean one every problem is [`Problem::harmless_when_clean`].
    pub fn only_load_repairs(&self) -> bool {
        !self.problems.is_empty()
            && self.problems.iter().all(|p| if self.clean { p.harmless_when_clean() } else { p.repaired_by_load() })
    }
}

/// Checks an image; see the module documentation for the rules.
pub fn check(img: &Image) -> CheckReport {
    let mut problems = Vec::new();
    let geo = &img.geometry;
    // Pages and clusters of a blob that could not be read are unknown: with one of those, a
    // marked page or cluster that no readable blob uses is not called leaked.
    let any_unreadable = img.blobs.iter().any(|b| b.md.is_err());
    if !img.super_block.is_clean() {
        problems.push(Problem::NotClean);
    }

    // Md page ownership, from the chains and extent pages actually read.
    let mut page_owner: HashMap<u32, u64> = HashMap::new();
    let mut claim_page = |page: u32, blob: u64, problems: &mut Vec<Problem>| {
        if let Some(&first) = page_owner.get(&page) {
            problems.push(Problem::PageUsedTwice { page, first, second: blob });
        } else {
            page_owner.insert(page, blob);
        }
    };
    for b in &img.blobs {
        for &p in b.chain.iter().chain(b.extent_pages.iter()) {
            claim_page(p, b.id, &mut problems);
        }
        if let Err(e) = &b.md {
            problems.push(Problem::BlobUnreadable { blob: b.id, error: e.clone() });
        }
    }

    // Cluster ownership.
    let mut cluster_owner: HashMap<u32, u64> = HashMap::new();
    for (b, md) in readable(img) {
        for &c in md.clusters.iter().filter(|&&c| c != 0) {
            if u64::from(c) >= geo.total_clusters {
                problems.push(Problem::ClusterOutOfRange { blob: b.id, cluster: c });
                continue;
            }
            if u64::from(c) < geo.md_clusters {
                problems.push(Problem::ClusterInMetadata { blob: b.id, cluster: c });
                continue;
            }
            match cluster_owner.get(&c) {
                Some(&first) => problems.push(Problem::ClusterUsedTwice { cluster: c, first, second: b.id }),
                None => {
                    cluster_owner.insert(c, b.id);
                }
            }
        }
    }

    // The used page mask against the pages in use.
    match &img.used_pages {
        Err(e) => problems.push(Problem::MaskUnreadable { mask: MaskKind::UsedPages, error: e.clone() }),
        Ok(mask) => {
            if u64::from(mask.len()) != u64::from(geo.md_len) {
                problems.push(Problem::MaskLength {
                    mask: MaskKind::UsedPages,
                    bits: mask.len(),
                    expected: geo.md_len.into(),
                });
            }
            let mut owned: Vec<(&u32, &u64)> = page_owner.iter().collect();
            owned.sort();
            for (&page, &blob) in owned {
                if !mask.get(page.into()) {
                    problems.push(Problem::PageNotMarked { page, blob });
                }
            }
            for page in mask.ones() {
                let Ok(page) = u32::try_from(page) else { continue };
                if !page_owner.contains_key(&page) {
                    let kind = img.pages.get(page as usize).copied();
                    if kind == Some(super::PageKind::BadCrc) {
                        problems.push(Problem::BadPageCrc { page });
                    } else if !any_unreadable {
                        problems.push(Problem::PageLeaked { page });
                    }
                }
            }
        }
    }

    // The blob id mask against the blobs found.
    if let Some(ids) = &img.used_blobids {
        match ids {
            Err(e) => problems.push(Problem::MaskUnreadable { mask: MaskKind::UsedBlobIds, error: e.clone() }),
            Ok(mask) => {
                if u64::from(mask.len()) != u64::from(geo.md_len) {
                    problems.push(Problem::MaskLength {
                        mask: MaskKind::UsedBlobIds,
                        bits: mask.len(),
                        expected: geo.md_len.into(),
                    });
                }
                for b in &img.blobs {
                    if !mask.get(blobid_to_page(b.id).into()) {
                        problems.push(Problem::BlobIdNotMarked { blob: b.id });
                    }
                }
                for page in mask.ones() {
                    let Ok(page) = u32::try_from(page) else { continue };
                    if img.blob(crate::format::units::page_to_blobid(page.into())).is_none() {
                        problems.push(Problem::BlobIdLeaked { page });
                    }
                }
            }
        }
    }

    // The used cluster mask against the clusters mapped and the metadata clusters.
    match &img.used_clusters {
        Err(e) => problems.push(Problem::MaskUnreadable { mask: MaskKind::UsedClusters, error: e.clone() }),
        Ok(mask) => {
            if u64::from(mask.len()) < geo.total_clusters {
                problems.push(Problem::ClusterMaskShort { bits: mask.len(), clusters: geo.total_clusters });
            }
            for c in 0..geo.md_clusters.min(mask.len().into()) {
                if !mask.get(c) {
                    problems.push(Problem::MetadataClusterNotMarked { cluster: c as u32 });
                }
            }
            let mut owned: Vec<(&u32, &u64)> = cluster_owner.iter().collect();
            owned.sort();
            for (&cluster, &blob) in owned {
                if !mask.get(cluster.into()) {
                    problems.push(Problem::ClusterNotMarked { cluster, blob });
                }
            }
            if !any_unreadable {
                for c in mask.ones() {
                    if c >= geo.total_clusters {
                        break; // SPDK ignores bits past total_clusters (a failed grow)
                    }
                    if c >= geo.md_clusters && !cluster_owner.contains_key(&(c as u32)) {
                        problems.push(Problem::ClusterLeaked { cluster: c as u32 });
                    }
                }
            }
        }
    }

    // Flags, parents, interrupted operations.
    for (b, md) in readable(img) {
        if md.access() == Access::Unopenable {
            problems.push(Problem::UnknownInvalidFlags { blob: b.id, flags: md.invalid_flags });
        }
        for x in [XATTR_SNAPSHOT_IN_PROGRESS, XATTR_SNAPSHOT_PENDING_REMOVAL] {
            if md.internal_xattr(x).is_some() {
                problems.push(Problem::InterruptedSnapshotOp { blob: b.id, xattr: x });
            }
        }
        match md.parent() {
            Err(error) => problems.push(Problem::BadParent { blob: b.id, error }),
            Ok(Some(Parent::Snapshot(p))) => {
                if img.blob(p).is_none_or(|pb| pb.md.is_err()) {
                    problems.push(Problem::DanglingParent { blob: b.id, parent: p });
                } else if parent_loops(img, b.id) {
                    problems.push(Problem::ParentLoop { blob: b.id });
                }
            }
            Ok(_) => {}
        }
    }
    let sb = img.super_block.super_blob;
    let lvstore = img.super_block.bstype_str().as_bytes() == crate::format::superblock::BSTYPE_LVOLSTORE;
    // A blobstore needs no super blob; an lvstore is found through it.
    if (sb != crate::format::BLOBID_INVALID || lvstore) && img.blob(sb).is_none() {
        problems.push(Problem::SuperBlobInvalid { blob: sb, lvstore });
    }
    if img.super_block.effective_io_unit_size() < MIN_BLOCK_SIZE {
        problems.push(Problem::BadIoUnitSize { io_unit_size: img.super_block.io_unit_size });
    }

    CheckReport {
        clean: img.super_block.is_clean(),
        blobs: img.blobs.len(),
        used_pages: page_owner.len() as u64,
        used_clusters: cluster_owner.len() as u64,
        problems,
    }
}

/// The blobs whose metadata was read.
fn readable(img: &Image) -> impl Iterator<Item = (&BlobEntry, &crate::format::BlobMd)> {
    img.blobs.iter().filter_map(|b| b.md.as_ref().ok().map(|md| (b, md)))
}

/// Whether following parent snapshots from `start` returns to `start`.
fn parent_loops(img: &Image, start: u64) -> bool {
    let mut cur = start;
    for _ in 0..=img.blobs.len() {
        let next = match img.blob(cur).and_then(|b| b.md.as_ref().ok()).map(|md| md.parent()) {
            Some(Ok(Some(Parent::Snapshot(p)))) => p,
            _ => return false,
        };
        if next == start {
            return true;
        }
        cur = next;
    }
    true
}
