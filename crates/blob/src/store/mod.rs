//! The runtime blobstore: a loaded blobstore's state in memory and the operations that change it
//! on the device, in SPDK's on-disk format ([`crate::format`]).
//!
//! Threading: a blobstore lives on the reactor that initialized or loaded it (its metadata
//! reactor, SPDK's md thread). Every metadata operation runs there (the async functions here
//! must be awaited on it); its state is behind one mutex that only that reactor takes, and never
//! across an await. The data path reads a blob's [`ClusterMap`] from any core without a lock.
//!
//! Crash consistency, on a device with a volatile write cache (stronger than SPDK, which issues
//! no flushes of its own; the format is SPDK's):
//! - the super block is marked dirty (`clean` 0, flushed) before any other metadata write, and
//!   clean again only at unload after the masks are written and flushed;
//! - a blob's metadata is persisted copy-on-write: its extent pages that changed and its chain
//!   pages other than the first go to fresh metadata pages (an extent page is rewritten in place,
//!   one page, which a block size of 4 KiB writes atomically), a flush, then the first page is
//!   written in place at the blob id's page, a flush, and only then are the old chain pages
//!   zeroed and released. A crash leaves either the old or the new chain reachable, never a
//!   first page that points at pages not on the medium;
//! - after a crash (the super block not clean) the load rebuilds the masks from the chains it
//!   finds (SPDK's recovery), so pages and clusters of updates that did not finish are free.
//!
//! Units: metadata pages are counted from the start of the metadata region (as blob ids, extent
//! tables and chain links count them), clusters from the start of the device.

pub mod bits;
pub mod blob;
pub mod clusters;
pub mod dev;
pub mod layout;
mod release;
mod replay;
mod snapshot;

use crate::format::mask::{MaskKind, MdMask};
use crate::format::superblock::{Geometry, SuperBlock, VERSION};
use crate::format::{FormatError, MdPage, BLOBID_INVALID, PAGE_SIZE};
use bits::BitArray;
pub use blob::{Blob, BlobOpts};
pub use clusters::ClusterMap;
pub use dev::{Dev, DevError};
use layout::{DevGeometry, InitOpts, Layout};
pub use snapshot::PreparedSnapshot;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Why a blobstore operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BsError {
    /// The device failed a request.
    Dev(DevError),
    /// The metadata on the device is not a blobstore, or is damaged.
    Format(FormatError),
    /// The request does not fit the blobstore (reason).
    Invalid(String),
    /// No such blob.
    NotFound(u64),
    /// The blob or the blobstore is in use (reason).
    Busy(String),
    /// No free cluster or metadata page.
    NoSpace(String),
    /// The blob is read-only.
    ReadOnly(u64),
    /// It is so already (reason).
    Exists(String),
}

impl std::fmt::Display for BsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BsError::Dev(e) => write!(f, "device error: {e}"),
            BsError::Format(e) => write!(f, "bad blobstore metadata: {e}"),
            BsError::Invalid(s) => write!(f, "invalid request: {s}"),
            BsError::NotFound(id) => write!(f, "no blob {id:#x}"),
            BsError::Busy(s) => write!(f, "busy: {s}"),
            BsError::NoSpace(s) => write!(f, "no space: {s}"),
            BsError::ReadOnly(id) => write!(f, "blob {id:#x} is read-only"),
            BsError::Exists(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for BsError {}

impl BsError {
    /// The errno SPDK answers for this error.
    pub fn errno(&self) -> i32 {
        match self {
            BsError::Dev(_) => 5,     // EIO
            BsError::Format(_) => 84, // EILSEQ
            BsError::Invalid(_) => 22,
            BsError::NotFound(_) => 2,
            BsError::Busy(_) => 16,
            BsError::NoSpace(_) => 28,
            BsError::ReadOnly(_) => 1,
            BsError::Exists(_) => 17,
        }
    }
}

impl From<DevError> for BsError {
    fn from(e: DevError) -> Self {
        BsError::Dev(e)
    }
}

impl From<FormatError> for BsError {
    fn from(e: FormatError) -> Self {
        BsError::Format(e)
    }
}

/// Result of a blobstore operation.
pub type BsResult<T> = Result<T, BsError>;

/// How a new blobstore treats its data clusters (`clear_method` of `bdev_lvol_create_lvstore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitClear {
    /// Unmap them (SPDK's default).
    Unmap,
    /// Write zeroes to them.
    WriteZeroes,
    /// Leave them.
    None,
}

/// Options of a new blobstore.
#[derive(Debug, Clone)]
pub struct StoreOpts {
    /// Bytes per cluster.
    pub cluster_size: u32,
    /// Metadata pages (None: one per cluster).
    pub num_md_pages: Option<u32>,
    /// Blobstore type, e.g. `LVOLSTORE` (at most 16 bytes).
    pub bstype: String,
    /// What happens to the data clusters.
    pub clear: InitClear,
}

/// The mutable state of a loaded blobstore (metadata reactor only).
pub(crate) struct MdState {
    /// The super block as on the device (its `clean` field included).
    pub(crate) sb: SuperBlock,
    /// Used metadata pages (region relative).
    pub(crate) pages: BitArray,
    /// Used clusters.
    pub(crate) clusters: BitArray,
    /// Used blob ids (by their first metadata page).
    pub(crate) blobids: BitArray,
    /// Open blobs by id.
    pub(crate) open: HashMap<u64, Weak<blob::BlobInner>>,
    /// Blobs being deleted or whose metadata is being loaded (no second open meanwhile).
    pub(crate) busy: HashMap<u64, &'static str>,
    /// Each clone's parent snapshot (child id to parent id), for every blob of the store.
    pub(crate) parents: HashMap<u64, u64>,
    /// Blobs an operation holds (snapshot, clone, delete, inflate, ...): a second one on the
    /// same blob is refused with EBUSY, as SPDK's `locked_operation_in_progress`.
    pub(crate) ops: HashMap<u64, &'static str>,
    /// Being deleted whole ([`Blobstore::close_to_ops`]): only deletes may start.
    pub(crate) closed_to_ops: bool,
    /// Metadata the load read (to find parents), kept for each blob's first open: a load
    /// followed by opening every blob reads each chain once.
    pub(crate) preread: HashMap<u64, (crate::format::BlobMd, Vec<u32>)>,
    /// Clusters thin blobs released (with their blob's clear method), still marked used until
    /// the requests in flight that may reach them drain (see `release.rs`).
    pub(crate) draining: Vec<(u32, crate::format::blob::ClearMethod)>,
    /// Unloaded: every operation fails.
    pub(crate) unloaded: bool,
}

impl MdState {
    /// The state of a blobstore with super block `sb`: every mask clear, nothing open.
    fn empty(sb: SuperBlock, geo: &Geometry) -> MdState {
        MdState {
            sb,
            pages: BitArray::new(geo.md_len as usize),
            clusters: BitArray::new(geo.total_clusters as usize),
            blobids: BitArray::new(geo.md_len as usize),
            open: HashMap::new(),
            busy: HashMap::new(),
            parents: HashMap::new(),
            preread: HashMap::new(),
            ops: HashMap::new(),
            closed_to_ops: false,
            draining: Vec::new(),
            unloaded: false,
        }
    }
}

/// An operation's hold on a blob (see [`Blobstore::reserve`]); released when dropped.
pub struct BlobOp {
    store: Arc<Store>,
    id: u64,
}

impl BlobOp {
    /// The blob held.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl std::fmt::Debug for BlobOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobOp({:#x})", self.id)
    }
}

impl Drop for BlobOp {
    fn drop(&mut self) {
        self.store.lock().ops.remove(&self.id);
    }
}

/// A delete's hold on a blob and, for a snapshot with one clone, on that clone (see
/// [`Blobstore::reserve_delete`]).
#[derive(Debug)]
pub struct DeleteHold {
    blob: BlobOp,
    clone: Option<BlobOp>,
}

/// A loaded blobstore. Cheap to clone; the handle may travel to other reactors, but every
/// operation runs on the metadata reactor.
#[derive(Clone)]
pub struct Blobstore(pub(crate) Arc<Store>);

pub(crate) struct Store {
    pub(crate) dev: Dev,
    pub(crate) geo: Geometry,
    pub(crate) md_core: usize,
    pub(crate) md: Mutex<MdState>,
    /// Blocks per cluster.
    pub(crate) blocks_per_cluster: u64,
    /// Topology generation (see [`Blob::map_generation`]); shared with the bdev layer, which
    /// applies an lvol's back-to-back clusters itself while it stands still.
    pub(crate) generation: Arc<std::sync::atomic::AtomicU64>,
    /// The devices of external snapshots, by id (the application registers them).
    pub(crate) external: Mutex<HashMap<Vec<u8>, Dev>>,
}

impl std::fmt::Debug for Blobstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Blobstore({:?}, {} clusters of {} B)",
            self.0.dev, self.0.geo.total_clusters, self.0.geo.cluster_size
        )
    }
}

fn on_md_core(s: &Store) -> BsResult<()> {
    match ferrite_reactor::current() {
        Some(c) if c == s.md_core => Ok(()),
        other => Err(BsError::Invalid(format!(
            "blobstore metadata operations run on reactor {} (called on {other:?})",
            s.md_core
        ))),
    }
}

impl Store {
    pub(crate) fn lock(&self) -> MutexGuard<'_, MdState> {
        self.md.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// As [`Blobstore::reserve`].
    pub(crate) fn reserve(self: &Arc<Self>, id: u64, what: &'static str) -> BsResult<BlobOp> {
        let mut st = self.lock();
        if let Some(other) = st.ops.get(&id) {
            return Err(BsError::Busy(format!("blob {id:#x}: another operation ({other}) is under way")));
        }
        if st.closed_to_ops && !what.starts_with("delete") {
            return Err(BsError::Busy(format!("blob {id:#x}: the blobstore is being deleted")));
        }
        st.ops.insert(id, what);
        Ok(BlobOp { store: self.clone(), id })
    }

    /// The device of external snapshot `id`, registered by the application.
    pub(crate) fn external_source(&self, id: &[u8]) -> BsResult<Dev> {
        let dev = self.external.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned();
        dev.ok_or_else(|| {
            BsError::Dev(DevError(format!("external snapshot {:?} is not present", String::from_utf8_lossy(id))))
        })
    }

    /// Tells the data path that a map, a parent or a read-only flag changed.
    pub(crate) fn bump_generation(&self) {
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Byte offset of metadata page `page` (region relative).
    pub(crate) fn page_offset(&self, page: u32) -> u64 {
        (self.geo.md_start as u64 + page as u64) * self.geo.md_page_size as u64
    }

    /// The device block where cluster `c` starts.
    pub(crate) fn cluster_block(&self, c: u32) -> u64 {
        c as u64 * self.blocks_per_cluster
    }

    pub(crate) async fn read_page(&self, page: u32) -> BsResult<MdPage> {
        if page >= self.geo.md_len {
            return Err(BsError::Format(FormatError::BadChain(format!(
                "metadata page {page} beyond the region of {}",
                self.geo.md_len
            ))));
        }
        let b = self.dev.read(self.page_offset(page), PAGE_SIZE).await?;
        Ok(MdPage::decode(&b)?)
    }

    pub(crate) async fn write_page(&self, page: u32, p: &MdPage) -> BsResult<()> {
        self.dev.write(self.page_offset(page), &p.encode()).await?;
        Ok(())
    }

    /// Writes the super block as it is in memory.
    async fn write_super(&self) -> BsResult<()> {
        let sb = self.lock().sb.clone();
        self.dev.write(0, &sb.encode()).await?;
        Ok(())
    }

    /// Makes sure the super block on the device says "not clean" (durably) before metadata
    /// changes: a crash from here on makes the next load recover.
    pub(crate) async fn mark_dirty(&self) -> BsResult<()> {
        {
            let mut st = self.lock();
            if st.unloaded {
                return Err(BsError::Busy("the blobstore is unloaded".into()));
            }
            if st.sb.clean == 0 {
                return Ok(());
            }
            st.sb.clean = 0;
        }
        if let Err(e) = async {
            self.write_super().await?;
            self.dev.flush().await?;
            Ok::<(), BsError>(())
        }
        .await
        {
            self.lock().sb.clean = 1;
            return Err(e);
        }
        Ok(())
    }

    /// Writes the three masks from memory.
    async fn write_masks(&self) -> BsResult<()> {
        let regions = {
            let st = self.lock();
            [
                (sb_region(&st.sb, MaskKind::UsedPages), mask_from_bits(MaskKind::UsedPages, &st.pages)),
                (sb_region(&st.sb, MaskKind::UsedClusters), mask_from_bits(MaskKind::UsedClusters, &st.clusters)),
                (sb_region(&st.sb, MaskKind::UsedBlobIds), mask_from_bits(MaskKind::UsedBlobIds, &st.blobids)),
            ]
        };
        let page = self.geo.md_page_size as u64;
        for ((start, len), mask) in regions {
            if len == 0 {
                continue;
            }
            let bytes = mask.encode((len as u64 * page) as usize)?;
            self.dev.write(start as u64 * page, &bytes).await?;
        }
        Ok(())
    }
}

fn mask_from_bits(kind: MaskKind, bits: &BitArray) -> MdMask {
    let mut m = MdMask::new(kind, bits.len() as u32);
    for i in bits.iter_ones() {
        m.set(i as u64, true);
    }
    m
}

fn bits_from_mask(m: &MdMask, len: usize) -> BitArray {
    let mut b = BitArray::new(len);
    for i in m.ones() {
        if (i as usize) < len {
            b.set(i as usize);
        }
    }
    b
}

/// The (first page, page count) of a mask's region.
fn sb_region(sb: &SuperBlock, kind: MaskKind) -> (u32, u32) {
    match kind {
        MaskKind::UsedPages => (sb.used_page_mask_start, sb.used_page_mask_len),
        MaskKind::UsedClusters => (sb.used_cluster_mask_start, sb.used_cluster_mask_len),
        MaskKind::UsedBlobIds => (sb.used_blobid_mask_start, sb.used_blobid_mask_len),
    }
}

fn bstype_bytes(s: &str) -> BsResult<[u8; 16]> {
    if s.len() > 16 {
        return Err(BsError::Invalid(format!("blobstore type {s:?} is longer than 16 bytes")));
    }
    let mut b = [0u8; 16];
    b[..s.len()].copy_from_slice(s.as_bytes());
    Ok(b)
}

impl Blobstore {
    fn new_store(dev: Dev, geo: Geometry, st: MdState) -> BsResult<Blobstore> {
        if geo.md_page_size as usize != PAGE_SIZE {
            return Err(BsError::Invalid(format!(
                "metadata pages of {} bytes are not supported (only {PAGE_SIZE})",
                geo.md_page_size
            )));
        }
        if geo.io_unit_size != dev.block_size() {
            return Err(BsError::Invalid(format!(
                "the blobstore's I/O unit ({} B) is not the device's block ({} B)",
                geo.io_unit_size,
                dev.block_size()
            )));
        }
        let md_core = ferrite_reactor::current().ok_or_else(|| BsError::Invalid("not on a reactor".into()))?;
        Ok(Blobstore(Arc::new(Store {
            blocks_per_cluster: (geo.cluster_size / geo.io_unit_size) as u64,
            dev,
            geo,
            md_core,
            md: Mutex::new(st),
            generation: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            external: Mutex::new(HashMap::new()),
        })))
    }

    /// Creates a blobstore on `dev` (SPDK's `spdk_bs_init`): zeroes the metadata area, clears
    /// the data clusters as `opts.clear` says, writes the masks and the super block (not clean:
    /// it is in use), and flushes. On the calling reactor, which becomes its metadata reactor.
    pub async fn init(dev: Dev, opts: &StoreOpts) -> BsResult<Blobstore> {
        let bstype = bstype_bytes(&opts.bstype)?;
        let phys = dev.desc().bdev().limits().physical_block_size.max(dev.block_size());
        let layout = Layout::new(
            DevGeometry { block_size: dev.block_size(), phys_block_size: phys, num_blocks: dev.num_blocks() },
            InitOpts {
                cluster_size: opts.cluster_size,
                num_md_pages: opts.num_md_pages,
                md_page_size: PAGE_SIZE as u32,
            },
        )
        .map_err(|e| BsError::Invalid(e.to_string()))?;
        let sb = SuperBlock {
            version: VERSION,
            length: PAGE_SIZE as u32,
            clean: 0,
            super_blob: BLOBID_INVALID,
            cluster_size: layout.cluster_size,
            used_page_mask_start: layout.used_page_mask.0,
            used_page_mask_len: layout.used_page_mask.1,
            used_cluster_mask_start: layout.used_cluster_mask.0,
            used_cluster_mask_len: layout.used_cluster_mask.1,
            md_start: layout.md_start,
            md_len: layout.md_len,
            bstype,
            used_blobid_mask_start: layout.used_blobid_mask.0,
            used_blobid_mask_len: layout.used_blobid_mask.1,
            size: layout.size,
            io_unit_size: layout.io_unit_size,
            md_page_size: layout.md_page_size,
        };
        let geo = sb.geometry(dev.size())?;
        let mut clusters = BitArray::new(geo.total_clusters as usize);
        for c in 0..geo.md_clusters as usize {
            clusters.set(c);
        }
        let mut st = MdState::empty(sb, &geo);
        st.clusters = clusters;
        let bs = Self::new_store(dev, geo, st)?;
        let s = &bs.0;
        let md_bytes = (s.geo.md_start as u64 + s.geo.md_len as u64) * s.geo.md_page_size as u64;
        let md_bytes = md_bytes.div_ceil(s.dev.block_size() as u64) * s.dev.block_size() as u64;
        s.dev.write_zeroes(0, md_bytes).await?;
        let data_start = s.geo.md_clusters * s.geo.cluster_size as u64;
        let data_len = s.dev.size().saturating_sub(data_start);
        match opts.clear {
            InitClear::Unmap => s.dev.unmap(data_start, data_len).await?,
            InitClear::WriteZeroes => s.dev.write_zeroes(data_start, data_len).await?,
            InitClear::None => {}
        }
        s.write_masks().await?;
        s.write_super().await?;
        s.dev.flush().await?;
        log::info!(
            "blobstore created on {}: {} clusters of {} KiB ({} for data), {} metadata pages",
            s.dev.desc().bdev().name(),
            s.geo.total_clusters,
            s.geo.cluster_size >> 10,
            s.geo.total_clusters - s.geo.md_clusters,
            s.geo.md_len
        );
        Ok(bs)
    }

    /// Loads the blobstore on `dev` (SPDK's `spdk_bs_load`): checks the super block (and the
    /// type, if `bstype` is given); a clean one gives its masks, otherwise the masks are rebuilt
    /// from the metadata (recovery) and written back. On the calling reactor, which becomes its
    /// metadata reactor.
    pub async fn load(dev: Dev, bstype: Option<&str>) -> BsResult<Blobstore> {
        let raw = dev.read(0, PAGE_SIZE.max(dev.block_size() as usize)).await?;
        let sb = SuperBlock::decode(&raw)?;
        if let Some(t) = bstype {
            if sb.bstype != bstype_bytes(t)? && sb.bstype != [0u8; 16] {
                return Err(BsError::Invalid(format!("the blobstore is of type {:?}, not {t:?}", sb.bstype_str())));
            }
        }
        let geo = sb.geometry(dev.size())?;
        let clean = sb.is_clean();
        let st = MdState::empty(sb.clone(), &geo);
        let bs = Self::new_store(dev, geo, st)?;
        let s = &bs.0;
        if clean && sb.used_blobid_mask_len > 0 {
            let page = s.geo.md_page_size as usize;
            let mut masks = Vec::new();
            for kind in [MaskKind::UsedPages, MaskKind::UsedClusters, MaskKind::UsedBlobIds] {
                let (start, len) = sb_region(&sb, kind);
                let bytes = s.dev.read(start as u64 * page as u64, len as usize * page).await?;
                masks.push(MdMask::decode(&bytes, kind)?);
            }
            {
                let mut st = s.lock();
                st.pages = bits_from_mask(&masks[0], s.geo.md_len as usize);
                st.clusters = bits_from_mask(&masks[1], s.geo.total_clusters as usize);
                st.blobids = bits_from_mask(&masks[2], s.geo.md_len as usize);
            }
            snapshot::recover_interrupted(&bs).await?;
        } else {
            log::warn!("blobstore on {}: not unloaded cleanly; recovering its metadata", s.dev.desc().bdev().name());
            replay::recover(s).await?;
            snapshot::recover_interrupted(&bs).await?;
            s.write_masks().await?;
            s.dev.flush().await?;
        }
        let (blobs, used) = {
            let st = s.lock();
            (st.blobids.count_ones(), st.clusters.count_ones())
        };
        log::info!(
            "blobstore loaded from {}: {blobs} blobs, {used} of {} clusters used",
            s.dev.desc().bdev().name(),
            s.geo.total_clusters
        );
        Ok(bs)
    }

    /// Unloads: refuses while blobs are open; writes the masks, flushes, marks the super block
    /// clean and flushes again. The blobstore is unusable afterwards.
    pub async fn unload(&self) -> BsResult<()> {
        let s = &self.0;
        on_md_core(s)?;
        {
            let st = s.lock();
            if st.unloaded {
                return Err(BsError::Busy("the blobstore is unloaded already".into()));
            }
            let mut open: Vec<u64> = st.open.iter().filter(|(_, w)| w.strong_count() > 0).map(|(&id, _)| id).collect();
            open.extend(st.busy.keys());
            if !open.is_empty() {
                open.sort_unstable();
                let ids: Vec<String> = open.iter().map(|id| format!("{id:#x}")).collect();
                return Err(BsError::Busy(format!("blob(s) {} are open", ids.join(", "))));
            }
        }
        // No blob is open: nothing in flight can reach a released cluster any more.
        let draining: Vec<u32> = s.lock().draining.iter().map(|&(c, _)| c).collect();
        s.reclaim(&draining).await;
        s.write_masks().await?;
        s.dev.flush().await?;
        {
            let mut st = s.lock();
            st.sb.clean = 1;
            st.unloaded = true;
        }
        s.write_super().await?;
        s.dev.flush().await?;
        log::info!("blobstore on {} unloaded", s.dev.desc().bdev().name());
        Ok(())
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.0.geo
    }

    /// The device.
    pub fn dev(&self) -> &Dev {
        &self.0.dev
    }

    /// The metadata reactor.
    pub fn md_core(&self) -> usize {
        self.0.md_core
    }

    /// Clusters free for data.
    pub fn free_clusters(&self) -> u64 {
        self.0.lock().clusters.count_zeros() as u64
    }

    /// Clusters for data in all (total minus those the metadata takes).
    pub fn data_clusters(&self) -> u64 {
        self.total_clusters() - self.0.geo.md_clusters
    }

    /// Clusters in all (more after [`Blobstore::grow`]).
    pub fn total_clusters(&self) -> u64 {
        self.0.lock().clusters.len() as u64
    }

    /// The largest size in bytes [`Blobstore::grow`] can reach: as many clusters as the room
    /// left for the used-cluster mask at creation tracks (SPDK's `max_growable_size`).
    pub fn max_growable_size(&self) -> u64 {
        let sb = self.0.lock().sb.clone();
        let room = sb.used_blobid_mask_start.saturating_sub(sb.used_cluster_mask_start) as u64;
        let bits = (room * self.0.geo.md_page_size as u64).saturating_sub(layout::MASK_HEADER_BYTES) * 8;
        bits * self.0.geo.cluster_size as u64
    }

    /// Grows the blobstore to its device's size now (SPDK's `spdk_bs_grow_live`): the super
    /// block takes the new size (and a longer cluster mask, which must fit the room left for
    /// it at creation); the new clusters are free. Returns the clusters in all, unchanged if
    /// the device did not grow by a cluster.
    pub async fn grow(&self) -> BsResult<u64> {
        let s = &self.0;
        on_md_core(s)?;
        let dev_size = s.dev.size();
        let (sb, old) = {
            let st = s.lock();
            (st.sb.clone(), st.clusters.len() as u64)
        };
        if dev_size <= sb.size {
            return Ok(old);
        }
        let total = dev_size / s.geo.cluster_size as u64;
        if total > u32::MAX as u64 {
            return Err(BsError::NoSpace(format!("{total} clusters do not fit 32-bit cluster indices")));
        }
        let mask_len = layout::mask_pages(total, s.geo.md_page_size);
        let room = sb.used_blobid_mask_start.saturating_sub(sb.used_cluster_mask_start) as u64;
        if mask_len > room {
            return Err(BsError::NoSpace(format!(
                "the cluster mask of {total} clusters needs {mask_len} pages; the blobstore has room for {room}"
            )));
        }
        s.mark_dirty().await?;
        {
            let mut st = s.lock();
            st.sb.size = dev_size;
            st.sb.used_cluster_mask_len = mask_len as u32;
            if total > old {
                st.clusters.resize(total as usize);
            }
        }
        // If this fails the super block on the device may say either size: the store is dirty,
        // so the next load rebuilds the masks from it; memory keeps the larger size.
        s.write_super().await?;
        s.dev.flush().await?;
        log::info!("blobstore on {}: grown from {old} to {total} clusters", s.dev.desc().bdev().name());
        Ok(total)
    }

    /// The application's root blob (SPDK's super blob), if set.
    pub fn super_blob(&self) -> Option<u64> {
        let id = self.0.lock().sb.super_blob;
        (id != BLOBID_INVALID).then_some(id)
    }

    /// Sets the super blob and writes the super block.
    pub async fn set_super_blob(&self, id: u64) -> BsResult<()> {
        let s = &self.0;
        on_md_core(s)?;
        s.mark_dirty().await?;
        s.lock().sb.super_blob = id;
        s.write_super().await?;
        s.dev.flush().await?;
        Ok(())
    }

    /// Registers the device of external snapshot `id` (esnap clones read it and copy from it).
    pub fn set_external_source(&self, id: Vec<u8>, dev: Dev) {
        self.0.external.lock().unwrap_or_else(|e| e.into_inner()).insert(id, dev);
    }

    /// The device registered for external snapshot `id`.
    pub fn external_source(&self, id: &[u8]) -> Option<Dev> {
        self.0.external.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    /// Forgets the device of external snapshot `id`; returns it.
    pub fn remove_external_source(&self, id: &[u8]) -> Option<Dev> {
        self.0.external.lock().unwrap_or_else(|e| e.into_inner()).remove(id)
    }

    /// Holds blob `id` for an operation (`what`, for the error others get): EBUSY if another
    /// holds it.
    pub fn reserve(&self, id: u64, what: &'static str) -> BsResult<BlobOp> {
        Store::reserve(&self.0, id, what)
    }

    /// Before the whole store is deleted blob by blob: EBUSY if an operation holds any blob
    /// (nothing is changed then); otherwise from now on only deletes may start, so that none
    /// of the deletes that follow is refused halfway. [`Blobstore::reopen_to_ops`] undoes it.
    pub fn close_to_ops(&self) -> BsResult<()> {
        let mut st = self.0.lock();
        if let Some((id, what)) = st.ops.iter().next() {
            return Err(BsError::Busy(format!("blob {id:#x}: an operation ({what}) is under way")));
        }
        st.closed_to_ops = true;
        Ok(())
    }

    /// Lets operations start again (a store delete that failed).
    pub fn reopen_to_ops(&self) {
        self.0.lock().closed_to_ops = false;
    }

    /// Holds blob `id` for its deletion, and its clone if it is a snapshot with one: EBUSY if
    /// it has more clones or either is held. The application takes this before it lets go of
    /// what uses the blob, then deletes with [`Blobstore::delete_held`].
    pub fn reserve_delete(&self, id: u64) -> BsResult<DeleteHold> {
        let blob = self.reserve(id, "delete")?;
        let clones = self.clones_of(id);
        let clone = match clones.len() {
            0 => None,
            1 => Some(self.reserve(clones[0], "delete of its parent")?),
            n => {
                return Err(BsError::Busy(format!("blob {id:#x} has {n} clones; only one with a single clone can go")))
            }
        };
        Ok(DeleteHold { blob, clone })
    }

    /// Every blob id in use, lowest first.
    pub fn blob_ids(&self) -> Vec<u64> {
        self.0.lock().blobids.iter_ones().map(|p| crate::format::units::page_to_blobid(p as u64)).collect()
    }

    /// The super block as it is in memory (the `clean` flag as on the device).
    pub fn super_block(&self) -> SuperBlock {
        self.0.lock().sb.clone()
    }

    /// Copies of the masks: used metadata pages, used clusters, used blob ids.
    pub fn masks(&self) -> (BitArray, BitArray, BitArray) {
        let st = self.0.lock();
        (st.pages.clone(), st.clusters.clone(), st.blobids.clone())
    }
}
