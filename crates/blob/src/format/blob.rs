//! A blob's metadata: its chain of md pages, and its extent pages, as one [`BlobMd`].
//!
//! Parsing follows SPDK's `blob_parse` / `blob_parse_page` and the extent page loading of
//! `blob_load_cpl_extents_cpl`; serializing follows `blob_serialize` and
//! `blob_serialize_extent_page`, descriptor for descriptor, so that a blob parsed from SPDK's
//! pages serializes back to the same bytes:
//!
//! 1. the flags descriptor, first in page 0;
//! 2. the xattrs, then the internal xattrs, in order; an xattr that does not fit the rest of a
//!    page starts a new page (xattrs never span pages);
//! 3. either the extent table (blobs created with `use_extent_table`, the default and what
//!    lvols use) or extent RLE descriptors (only when the blob has clusters), filling pages
//!    and continuing in new ones.
//!
//! Each page of the chain carries the blob id and its sequence number; the `next` links are
//! the md pages the blobstore picked for pages 1.. ([`link_chain`]), the first page being at the
//! page of the blob id. Extent pages are written separately, one per 512 clusters that have at
//! least one allocated cluster, each holding a single extent page descriptor.

use super::descriptor::{self, Descriptor, ExtentTableEntry, RleExtent, HEADER_SIZE};
use super::error::FormatError;
use super::page::MdPage;
use super::{DESC_AREA_SIZE, EXTENTS_PER_EP, INVALID_MD_PAGE, XATTR_EXTERNAL_SNAPSHOT_ID, XATTR_SNAPSHOT};

/// Invalid flag: thin provisioned (clusters allocated on first write; unallocated ones read
/// from the parent snapshot, or zeroes).
pub const FLAG_THIN_PROV: u64 = 1 << 0;
/// Invalid flag: the blob has internal xattrs.
pub const FLAG_INTERNAL_XATTR: u64 = 1 << 1;
/// Invalid flag: the blob maps its clusters through an extent table and extent pages.
pub const FLAG_EXTENT_TABLE: u64 = 1 << 2;
/// Invalid flag: the blob is a clone of an external snapshot.
pub const FLAG_EXTERNAL_SNAPSHOT: u64 = 1 << 3;
/// The invalid flags SPDK v26.05 knows; any other makes the blob impossible to open.
pub const INVALID_FLAGS_KNOWN: u64 = FLAG_THIN_PROV | FLAG_INTERNAL_XATTR | FLAG_EXTENT_TABLE | FLAG_EXTERNAL_SNAPSHOT;
/// Data-read-only flag: the blob is read-only (snapshots are).
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// The data-read-only flags SPDK knows; any other opens the blob read-only.
pub const DATA_RO_FLAGS_KNOWN: u64 = FLAG_READ_ONLY;
/// Md-read-only flags: the clear method, 2 bits.
pub const CLEAR_METHOD_MASK: u64 = 3;
/// The md-read-only flags SPDK knows; any other makes the metadata read-only.
pub const MD_RO_FLAGS_KNOWN: u64 = CLEAR_METHOD_MASK;

/// An extended attribute: name and value bytes as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    /// Name (not NUL-terminated on disk).
    pub name: Vec<u8>,
    /// Value (lvol names and uuids include their terminating NUL).
    pub value: Vec<u8>,
}

impl Xattr {
    /// An xattr from a name and a value.
    pub fn new(name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Xattr {
        Xattr { name: name.into(), value: value.into() }
    }

    /// The value as a C string: up to the first NUL, if that is valid UTF-8.
    pub fn value_cstr(&self) -> Option<&str> {
        let end = self.value.iter().position(|&c| c == 0).unwrap_or(self.value.len());
        std::str::from_utf8(&self.value[..end]).ok()
    }
}

/// How a blob clears clusters it releases (`enum blob_clear_method`, stored in `md_ro_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearMethod {
    /// The blobstore's default (unmap).
    Default,
    /// Nothing.
    None,
    /// Unmap.
    Unmap,
    /// Write zeroes.
    WriteZeroes,
}

/// What SPDK would allow on the blob given flags it may not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Unknown invalid flags: SPDK refuses to open the blob.
    Unopenable,
    /// Data and metadata read-only (a snapshot, or unknown data-read-only flags).
    ReadOnly,
    /// Data writable, metadata read-only (unknown md-read-only flags).
    MdReadOnly,
    /// Fully writable.
    ReadWrite,
}

/// The parent a blob reads its unallocated clusters from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// A snapshot blob in the same blobstore (the `SNAP` internal xattr of a thin blob).
    Snapshot(u64),
    /// An external snapshot, by its opaque id (the `EXTSNAP` internal xattr).
    External(Vec<u8>),
}

/// Limits on what a parse may allocate, so that hostile metadata cannot ask for gigabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Most clusters a blob may have (allocated or not). A thin blob's size is not bounded by
    /// the device, so this is a policy: the default, 2^24, is 16 TiB of 1 MiB clusters.
    pub max_clusters: u64,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits { max_clusters: 1 << 24 }
    }
}

/// A blob's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobMd {
    /// Blob id.
    pub id: u64,
    /// Flags that must be understood to open the blob ([`FLAG_THIN_PROV`], ...).
    pub invalid_flags: u64,
    /// Flags that must be understood to write data ([`FLAG_READ_ONLY`]).
    pub data_ro_flags: u64,
    /// Flags that must be understood to change metadata (the clear method).
    pub md_ro_flags: u64,
    /// Xattrs, in stored order.
    pub xattrs: Vec<Xattr>,
    /// Internal xattrs (the blobstore's own: `SNAP`, `EXTSNAP`, ...), in stored order.
    pub internal_xattrs: Vec<Xattr>,
    /// Number of clusters (the blob's size): the sum of the RLE runs, or the extent table's
    /// count.
    pub num_clusters: u64,
    /// Device cluster index of each blob cluster, 0 for unallocated. For an extent-table blob,
    /// empty until [`BlobMd::load_extent_pages`] filled it (then `num_clusters` long).
    pub clusters: Vec<u32>,
    /// For an extent-table blob, the md page of each of its extent pages (0: none, all its
    /// clusters unallocated); `None` for a blob stored with RLE extents (or none at all).
    pub extent_table: Option<Vec<u32>>,
}

impl BlobMd {
    /// An empty blob as SPDK creates it by default: extent table, no clusters.
    pub fn new(id: u64) -> BlobMd {
        BlobMd {
            id,
            invalid_flags: FLAG_EXTENT_TABLE,
            data_ro_flags: 0,
            md_ro_flags: 0,
            xattrs: Vec::new(),
            internal_xattrs: Vec::new(),
            num_clusters: 0,
            clusters: Vec::new(),
            extent_table: Some(Vec::new()),
        }
    }

    /// Whether the blob is thin provisioned.
    pub fn is_thin_provisioned(&self) -> bool {
        self.invalid_flags & FLAG_THIN_PROV != 0
    }

    /// Whether the blob's clusters are in extent pages (rather than RLE descriptors).
    pub fn uses_extent_table(&self) -> bool {
        self.extent_table.is_some()
    }

    /// Whether the blob is marked read-only (snapshots are).
    pub fn is_read_only(&self) -> bool {
        self.data_ro_flags & FLAG_READ_ONLY != 0
    }

    /// Whether the blob is a clone of an external snapshot.
    pub fn is_esnap_clone(&self) -> bool {
        self.invalid_flags & FLAG_EXTERNAL_SNAPSHOT != 0
    }

    /// The stored clear method.
    pub fn clear_method(&self) -> ClearMethod {
        match self.md_ro_flags & CLEAR_METHOD_MASK {
            0 => ClearMethod::Default,
            1 => ClearMethod::None,
            2 => ClearMethod::Unmap,
            _ => ClearMethod::WriteZeroes,
        }
    }

    /// What SPDK v26.05 allows on the blob, from its flags (as `blob_parse_page` decides).
    pub fn access(&self) -> Access {
        if self.invalid_flags & !INVALID_FLAGS_KNOWN != 0 {
            Access::Unopenable
        } else if self.data_ro_flags & !DATA_RO_FLAGS_KNOWN != 0 || self.is_read_only() {
            Access::ReadOnly
        } else if self.md_ro_flags & !MD_RO_FLAGS_KNOWN != 0 {
            Access::MdReadOnly
        } else {
            Access::ReadWrite
        }
    }

    /// The value of xattr `name`.
    pub fn xattr(&self, name: &str) -> Option<&Xattr> {
        self.xattrs.iter().find(|x| x.name == name.as_bytes())
    }

    /// The value of internal xattr `name`.
    pub fn internal_xattr(&self, name: &str) -> Option<&Xattr> {
        self.internal_xattrs.iter().find(|x| x.name == name.as_bytes())
    }

    /// The blob's parent, as SPDK resolves it on load: an external snapshot if the blob has the
    /// external snapshot flag, else the `SNAP` internal xattr of a thin-provisioned blob (SPDK
    /// ignores it on a thick blob). `Err` if `SNAP` is not 8 bytes (SPDK fails the open).
    pub fn parent(&self) -> Result<Option<Parent>, FormatError> {
        if self.is_esnap_clone() {
            return match self.internal_xattr(XATTR_EXTERNAL_SNAPSHOT_ID) {
                Some(x) => Ok(Some(Parent::External(x.value.clone()))),
                None => Err(FormatError::InconsistentBlob("external snapshot clone without an EXTSNAP xattr".into())),
            };
        }
        if !self.is_thin_provisioned() {
            return Ok(None);
        }
        match self.internal_xattr(XATTR_SNAPSHOT) {
            None => Ok(None),
            Some(x) => match <[u8; 8]>::try_from(x.value.as_slice()) {
                Ok(b) => Ok(Some(Parent::Snapshot(u64::from_le_bytes(b)))),
                Err(_) => Err(FormatError::InconsistentBlob(format!("SNAP xattr of {} bytes, not 8", x.value.len()))),
            },
        }
    }

    /// Number of allocated clusters.
    pub fn allocated_clusters(&self) -> u64 {
        self.clusters.iter().filter(|&&c| c != 0).count() as u64
    }

    /// Whether the clusters are known (RLE blob, or extent pages loaded).
    pub fn clusters_loaded(&self) -> bool {
        self.clusters.len() as u64 == self.num_clusters
    }

    /// The LBAs SPDK keeps in memory for the clusters (0 for unallocated), in device blocks of
    /// `lbas_per_cluster` per cluster (see [`super::units::lbas_per_cluster`]).
    pub fn cluster_lbas(&self, lbas_per_cluster: u64) -> Vec<u64> {
        self.clusters.iter().map(|&c| u64::from(c) * lbas_per_cluster).collect()
    }

    /// Parses a blob's chain of md pages, in chain order. Checks each page's CRC, that every
    /// page carries the first page's id and its position as sequence number, and the
    /// descriptors as SPDK does. For an extent-table blob, `clusters` stays empty: read the
    /// pages in `extent_table` and call [`BlobMd::load_extent_pages`] (or use
    /// [`BlobMd::parse`]).
    pub fn parse_chain(pages: &[MdPage], limits: &ParseLimits) -> Result<BlobMd, FormatError> {
        let first = pages.first().ok_or_else(|| FormatError::BadChain("no pages".into()))?;
        let mut p = ChainParser {
            md: BlobMd {
                id: first.id,
                invalid_flags: 0,
                data_ro_flags: 0,
                md_ro_flags: 0,
                xattrs: Vec::new(),
                internal_xattrs: Vec::new(),
                num_clusters: 0,
                clusters: Vec::new(),
                extent_table: None,
            },
            rle_found: false,
            remaining_in_et: 0,
            limits: *limits,
        };
        for (i, page) in pages.iter().enumerate() {
            if !page.crc_ok() {
                return Err(FormatError::BadCrc { what: "md page", stored: page.crc, computed: page.computed_crc() });
            }
            if page.id != first.id {
                return Err(FormatError::BadChain(format!(
                    "page {i} belongs to blob {:#x}, not {:#x}",
                    page.id, first.id
                )));
            }
            if page.sequence_num as usize != i {
                return Err(FormatError::BadChain(format!("page {i} has sequence number {}", page.sequence_num)));
            }
            for d in descriptor::parse_area(&page.descriptors[..])? {
                p.descriptor(d)?;
            }
        }
        let mut md = p.md;
        match &md.extent_table {
            Some(_) => md.num_clusters = p.remaining_in_et,
            None => md.num_clusters = md.clusters.len() as u64,
        }
        Ok(md)
    }

    /// Fills `clusters` of an extent-table blob from its extent pages: `pages[i]` is the
    /// decoded extent page at `extent_table[i]`, `None` where that entry is 0 (absent: its up to
    /// 512 clusters are unallocated). The pages must continue each other from cluster 0 and add
    /// up to `num_clusters`.
    pub fn load_extent_pages(&mut self, pages: &[Option<ExtentPage>]) -> Result<(), FormatError> {
        let table = match &self.extent_table {
            Some(t) => t,
            None => return Err(FormatError::InconsistentBlob("blob has no extent table".into())),
        };
        if pages.len() != table.len() {
            return Err(FormatError::InconsistentBlob(format!(
                "{} extent pages given for an extent table of {}",
                pages.len(),
                table.len()
            )));
        }
        let mut clusters: Vec<u32> = Vec::new();
        let mut remaining = self.num_clusters;
        for (i, (ep, &md_page)) in pages.iter().zip(table.iter()).enumerate() {
            match (ep, md_page) {
                (None, 0) => {
                    if !self.is_thin_provisioned() {
                        return Err(FormatError::InconsistentBlob(format!("thick blob without extent page {i}")));
                    }
                    let n = remaining.min(EXTENTS_PER_EP);
                    clusters.resize(clusters.len() + n as usize, 0);
                    remaining -= n;
                }
                (Some(ep), p) if p != 0 => {
                    if u64::from(ep.start_cluster_idx) != clusters.len() as u64 {
                        return Err(FormatError::InconsistentBlob(format!(
                            "extent page {i} starts at cluster {}, expected {}",
                            ep.start_cluster_idx,
                            clusters.len()
                        )));
                    }
                    let n = ep.clusters.len() as u64;
                    if n > remaining {
                        return Err(FormatError::InconsistentBlob(format!(
                            "extent page {i} maps {n} clusters, only {remaining} left of {}",
                            self.num_clusters
                        )));
                    }
                    if !self.is_thin_provisioned() && ep.clusters.contains(&0) {
                        return Err(FormatError::InconsistentBlob(format!(
                            "thick blob with an unallocated cluster in extent page {i}"
                        )));
                    }
                    clusters.extend_from_slice(&ep.clusters);
                    remaining -= n;
                }
                _ => {
                    return Err(FormatError::InconsistentBlob(format!(
                        "extent page {i}: page given does not match table entry {md_page}"
                    )))
                }
            }
        }
        if remaining != 0 {
            return Err(FormatError::InconsistentBlob(format!(
                "extent pages map {} clusters of {}",
                clusters.len(),
                self.num_clusters
            )));
        }
        self.clusters = clusters;
        Ok(())
    }

    /// Parses a whole blob: its chain, then (for an extent-table blob) the extent pages, read
    /// through `read_page` by md page index.
    pub fn parse(
        chain: &[MdPage],
        mut read_page: impl FnMut(u32) -> Result<MdPage, FormatError>,
        limits: &ParseLimits,
    ) -> Result<BlobMd, FormatError> {
        let mut md = BlobMd::parse_chain(chain, limits)?;
        if let Some(table) = &md.extent_table {
            let mut eps = Vec::with_capacity(table.len());
            for &p in table {
                eps.push(if p == 0 { None } else { Some(ExtentPage::from_page(&read_page(p)?)?) });
            }
            md.load_extent_pages(&eps)?;
        }
        Ok(md)
    }

    /// Serializes the blob's chain of md pages as SPDK's `blob_serialize` does. The pages are
    /// not linked (`next` is [`INVALID_MD_PAGE`], `crc` 0): see [`link_chain`].
    pub fn serialize(&self) -> Result<Vec<MdPage>, FormatError> {
        let mut s = Serializer { id: self.id, pages: vec![MdPage::new(self.id, 0)], at: 0 };
        s.put(&Descriptor::Flags {
            invalid: self.invalid_flags,
            data_ro: self.data_ro_flags,
            md_ro: self.md_ro_flags,
        })?;
        for (list, internal) in [(&self.xattrs, false), (&self.internal_xattrs, true)] {
            for x in list {
                let d = Descriptor::Xattr { internal, name: x.name.clone(), value: x.value.clone() };
                if d.encoded_len() > s.remaining() {
                    s.new_page()?;
                    if d.encoded_len() > s.remaining() {
                        return Err(FormatError::Unencodable(format!(
                            "xattr {:?} of {} bytes does not fit a page",
                            String::from_utf8_lossy(&x.name),
                            d.encoded_len()
                        )));
                    }
                }
                s.put(&d)?;
            }
        }
        match &self.extent_table {
            Some(table) => s.extent_table(self.num_clusters, table)?,
            None => {
                if self.clusters.len() as u64 != self.num_clusters {
                    return Err(FormatError::Unencodable(format!(
                        "RLE blob of {} clusters has {} in its map",
                        self.num_clusters,
                        self.clusters.len()
                    )));
                }
                s.extents_rle(&self.clusters)?
            }
        }
        Ok(s.pages)
    }

    /// The extent page at index `n` of the extent table, as SPDK's
    /// `blob_serialize_extent_page` builds it: up to 512 clusters from cluster `n * 512`.
    pub fn extent_page(&self, n: u64) -> ExtentPage {
        let start = n.saturating_mul(EXTENTS_PER_EP);
        let from = (start as usize).min(self.clusters.len());
        let to = (from + EXTENTS_PER_EP as usize).min(self.clusters.len());
        ExtentPage { id: self.id, start_cluster_idx: start as u32, clusters: self.clusters[from..to].to_vec() }
    }
}

/// Sets the `next` links of a serialized chain to the md pages chosen for pages 1.. (`rest[i]`
/// is the md page of `pages[i + 1]`), the last page's to [`INVALID_MD_PAGE`], and computes
/// every page's CRC, as SPDK's `blob_persist_generate_new_md` does.
pub fn link_chain(pages: &mut [MdPage], rest: &[u32]) -> Result<(), FormatError> {
    if rest.len() + 1 != pages.len() {
        return Err(FormatError::BadChain(format!("{} md pages given for a chain of {}", rest.len(), pages.len())));
    }
    let n = pages.len();
    for (i, page) in pages.iter_mut().enumerate() {
        page.next = if i + 1 < n { rest[i] } else { INVALID_MD_PAGE };
        page.seal();
    }
    Ok(())
}

/// An extent page: a metadata page holding one extent page descriptor, which maps up to 512
/// consecutive clusters of a blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentPage {
    /// The blob id in the page header: the blob that wrote it. After a snapshot SPDK moves the
    /// extent pages to the snapshot without rewriting them, so this can be another blob's id.
    pub id: u64,
    /// Blob cluster index of the first entry (a multiple of 512).
    pub start_cluster_idx: u32,
    /// Device cluster index of each cluster (0: unallocated).
    pub clusters: Vec<u32>,
}

impl ExtentPage {
    /// Decodes an extent page from its md page, with SPDK's checks
    /// (`bs_load_cur_extent_page_valid` and the extent page loader): valid CRC, sequence number
    /// 0, no next page, and a single extent page descriptor.
    pub fn from_page(page: &MdPage) -> Result<ExtentPage, FormatError> {
        if !page.crc_ok() {
            return Err(FormatError::BadCrc { what: "extent page", stored: page.crc, computed: page.computed_crc() });
        }
        if page.sequence_num != 0 || page.next != INVALID_MD_PAGE {
            return Err(FormatError::BadChain(format!(
                "extent page with sequence number {} and next {}",
                page.sequence_num, page.next
            )));
        }
        let descs = descriptor::parse_area(&page.descriptors[..])?;
        match descs.as_slice() {
            [Descriptor::ExtentPage { start_cluster_idx, cluster_idx }] => {
                Ok(ExtentPage { id: page.id, start_cluster_idx: *start_cluster_idx, clusters: cluster_idx.clone() })
            }
            _ => Err(FormatError::InconsistentBlob(
                "extent page does not hold exactly one extent page descriptor".into(),
            )),
        }
    }

    /// Encodes the extent page into a sealed md page (sequence number 0, no next page).
    pub fn to_page(&self) -> Result<MdPage, FormatError> {
        if self.clusters.len() > EXTENTS_PER_EP as usize {
            return Err(FormatError::Unencodable(format!("extent page of {} clusters", self.clusters.len())));
        }
        let mut page = MdPage::new(self.id, 0);
        page.descriptors = descriptor::encode_area(&[Descriptor::ExtentPage {
            start_cluster_idx: self.start_cluster_idx,
            cluster_idx: self.clusters.clone(),
        }])?;
        page.seal();
        Ok(page)
    }
}

/// State of a chain parse: what `struct spdk_blob` accumulates in `blob_parse_page`.
struct ChainParser {
    md: BlobMd,
    rle_found: bool,
    remaining_in_et: u64,
    limits: ParseLimits,
}

impl ChainParser {
    fn descriptor(&mut self, d: Descriptor) -> Result<(), FormatError> {
        let inconsistent = |m: &str| Err(FormatError::InconsistentBlob(m.to_string()));
        match d {
            Descriptor::Padding { .. } | Descriptor::Unknown { .. } => {}
            Descriptor::Flags { invalid, data_ro, md_ro } => {
                self.md.invalid_flags = invalid;
                self.md.data_ro_flags = data_ro;
                self.md.md_ro_flags = md_ro;
            }
            Descriptor::Xattr { internal, name, value } => {
                let list = if internal { &mut self.md.internal_xattrs } else { &mut self.md.xattrs };
                list.push(Xattr { name, value });
            }
            Descriptor::ExtentRle(extents) => {
                if self.md.extent_table.is_some() {
                    return inconsistent("extent RLE and extent table in one blob");
                }
                self.rle_found = true;
                let added: u64 = extents.iter().map(|e| u64::from(e.length)).sum();
                let total = self.md.clusters.len() as u64 + added;
                if total == 0 {
                    return inconsistent("extent RLE descriptor of zero clusters");
                }
                self.check_clusters(total)?;
                let thin = self.md.is_thin_provisioned();
                for e in extents {
                    if e.cluster_idx == 0 {
                        if !thin && e.length > 0 {
                            return inconsistent("unallocated cluster in a thick blob");
                        }
                        let new_len = self.md.clusters.len() + e.length as usize;
                        self.md.clusters.resize(new_len, 0);
                    } else {
                        if u64::from(e.cluster_idx) + u64::from(e.length) > u64::from(u32::MAX) + 1 {
                            return inconsistent("extent runs past cluster index 2^32");
                        }
                        self.md.clusters.extend((0..e.length).map(|j| e.cluster_idx + j));
                    }
                }
            }
            Descriptor::ExtentTable { num_clusters, entries } => {
                if self.rle_found {
                    return inconsistent("extent table and extent RLE in one blob");
                }
                if self.md.extent_table.is_some() && num_clusters != self.remaining_in_et {
                    return inconsistent("extent table descriptors disagree on the cluster count");
                }
                self.check_clusters(num_clusters)?;
                let table = self.md.extent_table.get_or_insert_with(Vec::new);
                let max_pages = super::units::extent_pages_for(self.limits.max_clusters) + 1;
                let thin = self.md.invalid_flags & FLAG_THIN_PROV != 0;
                for e in entries {
                    if e.page_idx != 0 {
                        if e.num_pages != 1 {
                            return inconsistent("extent table entry of several allocated pages");
                        }
                        table.push(e.page_idx);
                    } else {
                        if !thin {
                            return inconsistent("absent extent page in a thick blob");
                        }
                        if table.len() as u64 + u64::from(e.num_pages) > max_pages {
                            return Err(FormatError::TooLarge {
                                what: "extent pages",
                                count: table.len() as u64 + u64::from(e.num_pages),
                                limit: max_pages,
                            });
                        }
                        table.resize(table.len() + e.num_pages as usize, 0);
                    }
                    if table.len() as u64 > max_pages {
                        return Err(FormatError::TooLarge {
                            what: "extent pages",
                            count: table.len() as u64,
                            limit: max_pages,
                        });
                    }
                }
                self.remaining_in_et = num_clusters;
            }
            Descriptor::ExtentPage { .. } => {
                // Only valid in an extent page; SPDK's chain parser would accept one, but no
                // version of SPDK writes one into a chain.
                return inconsistent("extent page descriptor in a blob's md chain");
            }
        }
        Ok(())
    }

    fn check_clusters(&self, count: u64) -> Result<(), FormatError> {
        if count > self.limits.max_clusters {
            return Err(FormatError::TooLarge { what: "blob clusters", count, limit: self.limits.max_clusters });
        }
        Ok(())
    }
}

/// Builds a chain of pages the way `blob_serialize` fills them.
struct Serializer {
    id: u64,
    pages: Vec<MdPage>,
    /// Bytes used in the last page's descriptor area.
    at: usize,
}

impl Serializer {
    fn remaining(&self) -> usize {
        DESC_AREA_SIZE - self.at
    }

    fn new_page(&mut self) -> Result<(), FormatError> {
        let seq =
            u32::try_from(self.pages.len()).map_err(|_| FormatError::Unencodable("chain of over 2^32 pages".into()))?;
        self.pages.push(MdPage::new(self.id, seq));
        self.at = 0;
        Ok(())
    }

    fn put(&mut self, d: &Descriptor) -> Result<(), FormatError> {
        let at = self.at;
        let page = self.pages.last_mut().ok_or_else(|| FormatError::Unencodable("no page".into()))?;
        self.at += d.encode_into(&mut page.descriptors[at..])?;
        Ok(())
    }

    /// `blob_serialize_extent_table`: extent table descriptors, as many entries per page as fit,
    /// always at least one descriptor when there is room for its header.
    fn extent_table(&mut self, num_clusters: u64, table: &[u32]) -> Result<(), FormatError> {
        let n = table.len();
        let mut start = 0usize;
        loop {
            let next = self.extent_table_entry(num_clusters, table, start)?;
            if next == n {
                return Ok(());
            }
            self.new_page()?;
            start = next;
        }
    }

    /// `blob_serialize_extent_table_entry`: one descriptor from entry `start`, returning the
    /// first entry not written. Mirrors SPDK exactly, including that a run of absent pages cut
    /// by the end of a page loses the part before the cut (only reachable with over 2^18
    /// clusters in a thin blob).
    fn extent_table_entry(&mut self, num_clusters: u64, table: &[u32], start: usize) -> Result<usize, FormatError> {
        let mut cur = HEADER_SIZE + 8;
        if self.remaining() < cur {
            return Ok(start);
        }
        let mut entries = Vec::new();
        let mut run = 1u32;
        let mut i = start;
        while i < table.len() {
            if self.remaining() < cur + 8 {
                break;
            }
            let p = table[i];
            if p == 0 && i + 1 < table.len() && table[i + 1] == 0 {
                run += 1;
                i += 1;
                continue;
            }
            entries.push(ExtentTableEntry { page_idx: p, num_pages: run });
            run = 1;
            cur += 8;
            i += 1;
        }
        self.put(&Descriptor::ExtentTable { num_clusters, entries })?;
        Ok(i)
    }

    /// `blob_serialize_extents_rle`: RLE descriptors over all clusters, none for an empty blob.
    fn extents_rle(&mut self, clusters: &[u32]) -> Result<(), FormatError> {
        let mut start = 0usize;
        while start < clusters.len() {
            let next = self.extent_rle(clusters, start)?;
            if next == clusters.len() {
                break;
            }
            self.new_page()?;
            start = next;
        }
        Ok(())
    }

    /// `blob_serialize_extent_rle`: one descriptor of runs from cluster `start` (consecutive
    /// device clusters, or unallocated ones), as many as fit; returns the first cluster not
    /// written.
    fn extent_rle(&mut self, clusters: &[u32], start: usize) -> Result<usize, FormatError> {
        let mut cur = HEADER_SIZE + 8;
        if self.remaining() < cur {
            return Ok(start);
        }
        let mut extents = Vec::new();
        let mut idx = clusters[start];
        let mut count = 1u64;
        let mut next = clusters.len();
        let mut fits = true;
        for (i, &c) in clusters.iter().enumerate().skip(start + 1) {
            let contiguous = idx != 0 && u64::from(idx) + count == u64::from(c);
            if contiguous || (idx == 0 && c == 0) {
                count += 1;
                continue;
            }
            extents.push(rle(idx, count)?);
            cur += 8;
            if self.remaining() < cur {
                next = i;
                fits = false;
                break;
            }
            idx = c;
            count = 1;
        }
        if fits {
            extents.push(rle(idx, count)?);
        }
        self.put(&Descriptor::ExtentRle(extents))?;
        Ok(next)
    }
}

fn rle(cluster_idx: u32, count: u64) -> Result<RleExtent, FormatError> {
    let length = u32::try_from(count).map_err(|_| FormatError::Unencodable("run of over 2^32 clusters".into()))?;
    Ok(RleExtent { cluster_idx, length })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lvol(id: u64) -> BlobMd {
        let mut md = BlobMd::new(id);
        md.xattrs.push(Xattr::new("name", {
            let mut v = b"vol".to_vec();
            v.resize(64, 0);
            v
        }));
        md.xattrs.push(Xattr::new("uuid", b"0e2b1e5c-8b4d-4b8a-9e32-6f0e6a3c1d2a\0".to_vec()));
        md
    }

    fn reparse(md: &BlobMd, chain_pages: &[u32]) -> BlobMd {
        let mut pages = md.serialize().unwrap();
        link_chain(&mut pages, chain_pages).unwrap();
        let eps: Vec<Option<ExtentPage>> = match &md.extent_table {
            Some(t) => t.iter().enumerate().map(|(i, &p)| (p != 0).then(|| md.extent_page(i as u64))).collect(),
            None => Vec::new(),
        };
        let mut back = BlobMd::parse_chain(&pages, &ParseLimits::default()).unwrap();
        if back.uses_extent_table() {
            back.load_extent_pages(&eps).unwrap();
        }
        back
    }

    #[test]
    fn thick_extent_table_blob() {
        let mut md = lvol(0x1_0000_0001);
        md.num_clusters = 3;
        md.clusters = vec![5, 6, 9];
        md.extent_table = Some(vec![2]);
        let pages = md.serialize().unwrap();
        assert_eq!(pages.len(), 1);
        // flags, two xattrs, extent table: 29 + (9+4+64) + (9+4+37) + (5+8+8)
        let descs = descriptor::parse_area(&pages[0].descriptors[..]).unwrap();
        assert_eq!(descs.len(), 4);
        assert_eq!(
            descs[3],
            Descriptor::ExtentTable { num_clusters: 3, entries: vec![ExtentTableEntry { page_idx: 2, num_pages: 1 }] }
        );
        assert_eq!(reparse(&md, &[]), md);
        let ep = md.extent_page(0).to_page().unwrap();
        assert_eq!(ExtentPage::from_page(&ep).unwrap().clusters, vec![5, 6, 9]);
    }

    #[test]
    fn thin_extent_table_runs_of_absent_pages() {
        let mut md = lvol(0x1_0000_0002);
        md.invalid_flags |= FLAG_THIN_PROV;
        md.num_clusters = 5 * 512 + 10;
        md.clusters = vec![0; md.num_clusters as usize];
        md.clusters[3 * 512 + 1] = 40;
        md.extent_table = Some(vec![0, 0, 0, 7, 0, 0]);
        let pages = md.serialize().unwrap();
        let descs = descriptor::parse_area(&pages[0].descriptors[..]).unwrap();
        assert_eq!(
            descs.last().unwrap(),
            &Descriptor::ExtentTable {
                num_clusters: 5 * 512 + 10,
                entries: vec![
                    ExtentTableEntry { page_idx: 0, num_pages: 3 },
                    ExtentTableEntry { page_idx: 7, num_pages: 1 },
                    ExtentTableEntry { page_idx: 0, num_pages: 2 },
                ]
            }
        );
        assert_eq!(reparse(&md, &[]), md);
    }

    #[test]
    fn rle_blob_runs() {
        let mut md = lvol(0x1_0000_0003);
        md.extent_table = None;
        md.invalid_flags = FLAG_THIN_PROV;
        md.clusters = vec![4, 5, 6, 0, 0, 9, 3, 4];
        md.num_clusters = 8;
        let pages = md.serialize().unwrap();
        let descs = descriptor::parse_area(&pages[0].descriptors[..]).unwrap();
        let r = |c, l| RleExtent { cluster_idx: c, length: l };
        assert_eq!(descs.last().unwrap(), &Descriptor::ExtentRle(vec![r(4, 3), r(0, 2), r(9, 1), r(3, 2)]));
        assert_eq!(reparse(&md, &[]), md);
    }

    #[test]
    fn long_chains_split_like_spdk() {
        // Many xattrs and a fragmented RLE map spill over several pages.
        let mut md = BlobMd::new(0x1_0000_0004);
        md.extent_table = None;
        md.invalid_flags = 0;
        for i in 0..60 {
            md.xattrs.push(Xattr::new(format!("attr{i}"), vec![i as u8; 100]));
        }
        md.clusters = (0..2000).map(|i| 10 + 2 * i).collect();
        md.num_clusters = 2000;
        let pages = md.serialize().unwrap();
        assert!(pages.len() > 3);
        let chain: Vec<u32> = (1..pages.len() as u32).map(|i| 100 + i).collect();
        assert_eq!(reparse(&md, &chain), md);
    }

    #[test]
    fn parse_rejects_inconsistencies() {
        let limits = ParseLimits::default();
        // Thick blob with an unallocated run.
        let mut page = MdPage::new(0x1_0000_0000, 0);
        page.descriptors = descriptor::encode_area(&[
            Descriptor::Flags { invalid: 0, data_ro: 0, md_ro: 0 },
            Descriptor::ExtentRle(vec![RleExtent { cluster_idx: 0, length: 2 }]),
        ])
        .unwrap();
        page.seal();
        assert!(matches!(BlobMd::parse_chain(&[page.clone()], &limits), Err(FormatError::InconsistentBlob(_))));
        // Bad CRC.
        page.descriptors[100] = 1;
        assert!(matches!(BlobMd::parse_chain(&[page], &limits), Err(FormatError::BadCrc { .. })));
        // Absurd cluster counts are refused before allocating.
        let mut page = MdPage::new(0x1_0000_0000, 0);
        page.descriptors = descriptor::encode_area(&[
            Descriptor::Flags { invalid: FLAG_THIN_PROV, data_ro: 0, md_ro: 0 },
            Descriptor::ExtentRle(vec![RleExtent { cluster_idx: 0, length: u32::MAX }]),
        ])
        .unwrap();
        page.seal();
        assert!(matches!(BlobMd::parse_chain(&[page], &limits), Err(FormatError::TooLarge { .. })));
        let mut page = MdPage::new(0x1_0000_0000, 0);
        page.descriptors = descriptor::encode_area(&[
            Descriptor::Flags { invalid: FLAG_THIN_PROV, data_ro: 0, md_ro: 0 },
            Descriptor::ExtentTable {
                num_clusters: 10,
                entries: vec![ExtentTableEntry { page_idx: 0, num_pages: u32::MAX }],
            },
        ])
        .unwrap();
        page.seal();
        assert!(matches!(BlobMd::parse_chain(&[page], &limits), Err(FormatError::TooLarge { .. })));
        // Wrong sequence number.
        let mut a = MdPage::new(0x1_0000_0000, 0);
        a.seal();
        let mut b = MdPage::new(0x1_0000_0000, 5);
        b.seal();
        assert!(matches!(BlobMd::parse_chain(&[a, b], &limits), Err(FormatError::BadChain(_))));
    }

    #[test]
    fn flags_and_parent() {
        let mut md = BlobMd::new(1);
        assert_eq!(md.access(), Access::ReadWrite);
        md.data_ro_flags = FLAG_READ_ONLY;
        assert_eq!(md.access(), Access::ReadOnly);
        md.invalid_flags |= 1 << 40;
        assert_eq!(md.access(), Access::Unopenable);
        md.md_ro_flags = 1;
        assert_eq!(md.clear_method(), ClearMethod::None);
        let mut c = BlobMd::new(2);
        c.internal_xattrs.push(Xattr::new("SNAP", 7u64.to_le_bytes().to_vec()));
        assert_eq!(c.parent().unwrap(), None); // thick: SNAP ignored
        c.invalid_flags |= FLAG_THIN_PROV;
        assert_eq!(c.parent().unwrap(), Some(Parent::Snapshot(7)));
        c.internal_xattrs[0].value.pop();
        assert!(c.parent().is_err());
    }
}
