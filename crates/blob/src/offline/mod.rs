//! Offline reading of a blobstore image: the super block, the masks and every blob's metadata,
//! found by scanning the whole md region (not by trusting the masks), as SPDK's dirty-load
//! recovery does. [`check()`] then compares what was found with the masks and between blobs, and
//! [`dump()`] prints it.
//!
//! Nothing here writes. Every count that sizes an allocation is bounded by the device size
//! (validated super block geometry) or by [`OpenOptions::max_total_clusters`].

mod check;
mod dump;

pub use check::{check, CheckReport, Problem};
pub use dump::dump;

use crate::format::blob::{BlobMd, ExtentPage, ParseLimits};
use crate::format::descriptor::TYPE_EXTENT_PAGE;
use crate::format::superblock::Geometry;
use crate::format::units::{blobid_to_page, page_to_blobid, region_offset};
use crate::format::{FormatError, MaskKind, MdMask, MdPage, SuperBlock, INVALID_MD_PAGE, PAGE_SIZE};
use std::fmt;
use std::io;

/// Positioned reads from an image: a file, a block device, or bytes in memory.
pub trait ReadAt {
    /// Size of the image in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; reading past the end is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn size(&self) -> io::Result<u64> {
        // Seeking to the end works for block devices too, whose metadata length is 0.
        use std::io::Seek;
        let mut f: &std::fs::File = self;
        f.seek(io::SeekFrom::End(0))
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).ok().filter(|&s| s <= self.len());
        match start.and_then(|s| self.get(s..s.checked_add(buf.len())?)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the image")),
        }
    }
}

impl ReadAt for Vec<u8> {
    fn size(&self) -> io::Result<u64> {
        self.as_slice().size()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
}

/// Options of [`open`].
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Most clusters all blobs together may map (thin blobs can be far larger than the device);
    /// a blob beyond the budget is reported unreadable. Default 2^26.
    pub max_total_clusters: u64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { max_total_clusters: 1 << 26 }
    }
}

/// Why an image cannot be read at all.
#[derive(Debug)]
pub enum OpenError {
    /// Reading failed.
    Io(io::Error),
    /// The super block is missing, corrupt, or describes an impossible layout.
    SuperBlock(FormatError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "read error: {e}"),
            OpenError::SuperBlock(e) => write!(f, "super block: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

/// What an md page of the md region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// All zeroes (SPDK zeroes the pages it frees).
    Zero,
    /// Not zero but its CRC does not match.
    BadCrc,
    /// A valid first page of a blob (sequence 0, id matching the page).
    Root,
    /// A valid extent page (sequence 0, a single extent page descriptor).
    ExtentPage,
    /// Another valid page (a continuation page of a chain, or a stale one).
    Other,
}

/// A blob found in the md region.
#[derive(Debug, Clone)]
pub struct BlobEntry {
    /// Blob id (from the page it starts at).
    pub id: u64,
    /// Md pages of its chain, in order, as far as they could be followed.
    pub chain: Vec<u32>,
    /// Md pages of its extent pages that were read.
    pub extent_pages: Vec<u32>,
    /// The metadata, or why it cannot be read.
    pub md: Result<BlobMd, FormatError>,
}

/// A blobstore image, read.
#[derive(Debug, Clone)]
pub struct Image {
    /// Size of the device in bytes.
    pub device_size: u64,
    /// The super block.
    pub super_block: SuperBlock,
    /// Its geometry.
    pub geometry: Geometry,
    /// The used md pages mask, or why it cannot be read.
    pub used_pages: Result<MdMask, FormatError>,
    /// The used clusters mask, or why it cannot be read.
    pub used_clusters: Result<MdMask, FormatError>,
    /// The used blob ids mask (`None` in images older than version 3, which have none).
    pub used_blobids: Option<Result<MdMask, FormatError>>,
    /// What each md page holds (`md_len` entries).
    pub pages: Vec<PageKind>,
    /// The blobs, by id.
    pub blobs: Vec<BlobEntry>,
}

impl Image {
    /// The blob with this id, if found.
    pub fn blob(&self, id: u64) -> Option<&BlobEntry> {
        self.blobs.binary_search_by_key(&id, |b| b.id).ok().map(|i| &self.blobs[i])
    }
}

/// Reads an image: super block, masks, and every blob whose first page is in the md region.
/// Fails only if the super block is unusable or a read fails; damage past the super block is
/// recorded in the [`Image`] for [`check()`].
pub fn open<R: ReadAt + ?Sized>(dev: &R, opts: &OpenOptions) -> Result<Image, OpenError> {
    let device_size = dev.size()?;
    let mut sb = [0u8; PAGE_SIZE];
    if device_size < PAGE_SIZE as u64 {
        return Err(OpenError::SuperBlock(FormatError::Truncated {
            what: "device",
            need: PAGE_SIZE,
            got: device_size as usize,
        }));
    }
    dev.read_exact_at(&mut sb, 0)?;
    let super_block = SuperBlock::decode(&sb).map_err(OpenError::SuperBlock)?;
    let geometry = super_block.geometry(device_size).map_err(OpenError::SuperBlock)?;

    let read_mask = |start: u32, len: u32, kind: MaskKind| -> Result<Result<MdMask, FormatError>, OpenError> {
        // The region is inside the device (geometry checked), so its size is bounded by it.
        let bytes = u64::from(len) * u64::from(geometry.md_page_size);
        let mut buf = vec![0u8; bytes as usize];
        dev.read_exact_at(&mut buf, region_offset(&geometry, start))?;
        Ok(MdMask::decode(&buf, kind))
    };
    let used_pages = read_mask(super_block.used_page_mask_start, super_block.used_page_mask_len, MaskKind::UsedPages)?;
    let used_clusters =
        read_mask(super_block.used_cluster_mask_start, super_block.used_cluster_mask_len, MaskKind::UsedClusters)?;
    let used_blobids = if super_block.used_blobid_mask_len == 0 {
        None
    } else {
        Some(read_mask(super_block.used_blobid_mask_start, super_block.used_blobid_mask_len, MaskKind::UsedBlobIds)?)
    };

    let reader = PageReader { dev, geo: geometry };
    let md_len = geometry.md_len;
    let mut pages = Vec::with_capacity(md_len as usize);
    for i in 0..md_len {
        pages.push(reader.classify(i)?);
    }

    let mut budget = opts.max_total_clusters;
    let mut blobs = Vec::new();
    for (i, _) in pages.iter().enumerate().filter(|(_, k)| **k == PageKind::Root) {
        let entry = reader.read_blob(i as u32, budget)?;
        if let Ok(md) = &entry.md {
            budget = budget.saturating_sub(md.clusters.len() as u64);
        }
        blobs.push(entry);
    }
    blobs.sort_by_key(|b| b.id);

    Ok(Image { device_size, super_block, geometry, used_pages, used_clusters, used_blobids, pages, blobs })
}

/// Reads md pages of the md region.
struct PageReader<'a, R: ReadAt + ?Sized> {
    dev: &'a R,
    geo: Geometry,
}

impl<R: ReadAt + ?Sized> PageReader<'_, R> {
    /// Md page `i` (the first 4096 bytes of it when md pages are larger).
    fn raw(&self, i: u32) -> io::Result<[u8; PAGE_SIZE]> {
        let mut b = [0u8; PAGE_SIZE];
        let off = (u64::from(self.geo.md_start) + u64::from(i)) * u64::from(self.geo.md_page_size);
        self.dev.read_exact_at(&mut b, off)?;
        Ok(b)
    }

    fn classify(&self, i: u32) -> io::Result<PageKind> {
        let raw = self.raw(i)?;
        if raw.iter().all(|&b| b == 0) {
            return Ok(PageKind::Zero);
        }
        let page = match MdPage::decode_checked(&raw) {
            Ok(p) => p,
            Err(_) => return Ok(PageKind::BadCrc),
        };
        if page.sequence_num == 0 && page.id == page_to_blobid(i.into()) {
            Ok(PageKind::Root)
        } else if page.sequence_num == 0 && page.descriptors[0] == TYPE_EXTENT_PAGE {
            Ok(PageKind::ExtentPage)
        } else {
            Ok(PageKind::Other)
        }
    }

    /// Page `i` decoded, with bounds and CRC checked.
    fn page(&self, i: u32) -> Result<Result<MdPage, FormatError>, io::Error> {
        if i >= self.geo.md_len {
            return Ok(Err(FormatError::BadChain(format!(
                "md page {i} is outside the md region of {} pages",
                self.geo.md_len
            ))));
        }
        Ok(MdPage::decode_checked(&self.raw(i)?))
    }

    /// Follows the chain from root page `root` and parses the blob.
    fn read_blob(&self, root: u32, budget: u64) -> io::Result<BlobEntry> {
        let id = page_to_blobid(root.into());
        let mut entry = BlobEntry {
            id,
            chain: Vec::new(),
            extent_pages: Vec::new(),
            md: Err(FormatError::BadChain(String::new())),
        };
        let mut chain_pages = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut cur = root;
        loop {
            if !seen.insert(cur) {
                entry.md = Err(FormatError::BadChain(format!("chain loops back to md page {cur}")));
                return Ok(entry);
            }
            let page = match self.page(cur)? {
                Ok(p) => p,
                Err(e) => {
                    entry.md = Err(e);
                    return Ok(entry);
                }
            };
            entry.chain.push(cur);
            let next = page.next;
            chain_pages.push(page);
            if next == INVALID_MD_PAGE {
                break;
            }
            cur = next;
        }
        let limits = ParseLimits { max_clusters: budget };
        let mut md = match BlobMd::parse_chain(&chain_pages, &limits) {
            Ok(md) => md,
            Err(e) => {
                entry.md = Err(e);
                return Ok(entry);
            }
        };
        if let Some(table) = md.extent_table.clone() {
            let mut eps = Vec::with_capacity(table.len());
            for (n, &p) in table.iter().enumerate() {
                if p == 0 {
                    eps.push(None);
                    continue;
                }
                let ep = match self.page(p)? {
                    Ok(page) => ExtentPage::from_page(&page),
                    Err(e) => Err(e),
                };
                match ep {
                    Ok(ep) => {
                        entry.extent_pages.push(p);
                        eps.push(Some(ep));
                    }
                    Err(e) => {
                        entry.md = Err(FormatError::InconsistentBlob(format!("extent page {n} at md page {p}: {e}")));
                        return Ok(entry);
                    }
                }
            }
            if let Err(e) = md.load_extent_pages(&eps) {
                entry.md = Err(e);
                return Ok(entry);
            }
        }
        debug_assert_eq!(blobid_to_page(md.id), root);
        entry.md = Ok(md);
        Ok(entry)
    }
}

/// The masks SPDK's recovery (`bs_recover`, on loading a blobstore that is not clean) writes
/// for this image: every page of every blob's chain and extent pages, the first page of every
/// blob, and the metadata clusters plus every cluster a blob maps. Blobs whose metadata cannot
/// be read contribute the pages that could be followed (SPDK itself would fail the load).
pub fn rebuilt_masks(img: &Image) -> RebuiltMasks {
    let g = &img.geometry;
    let mut pages = MdMask::new(MaskKind::UsedPages, g.md_len);
    let mut blobids = MdMask::new(MaskKind::UsedBlobIds, g.md_len);
    // total_clusters fits u32: checked by SuperBlock::geometry.
    let mut clusters = MdMask::new(MaskKind::UsedClusters, g.total_clusters as u32);
    for c in 0..g.md_clusters {
        clusters.set(c, true);
    }
    for b in &img.blobs {
        blobids.set(blobid_to_page(b.id).into(), true);
        for &p in b.chain.iter().chain(b.extent_pages.iter()) {
            pages.set(p.into(), true);
        }
        if let Ok(md) = &b.md {
            for &c in md.clusters.iter().filter(|&&c| c != 0) {
                clusters.set(c.into(), true);
            }
        }
    }
    RebuiltMasks { used_pages: pages, used_clusters: clusters, used_blobids: blobids }
}

/// The result of [`rebuilt_masks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuiltMasks {
    /// Used md pages.
    pub used_pages: MdMask,
    /// Used clusters.
    pub used_clusters: MdMask,
    /// Used blob ids.
    pub used_blobids: MdMask,
}
