//! Blobs: create, open, resize, xattrs, flags, metadata persistence, cluster allocation on a
//! thin blob's first write, delete. Every operation here runs on the blobstore's metadata
//! reactor; [`Blob::map`] is what other cores read.

use super::{on_md_core, BsError, BsResult, ClusterMap, Store};
use crate::format::blob::Access;
use crate::format::blob::{link_chain, ClearMethod, FLAG_READ_ONLY, FLAG_THIN_PROV};
use crate::format::blob::{Parent, FLAG_INTERNAL_XATTR};
use crate::format::units::{blobid_to_page, cluster_to_extent_page, extent_pages_for, page_to_blobid};
use crate::format::{BlobMd, ExtentPage, MdPage, ParseLimits, Xattr, EXTENTS_PER_EP, INVALID_MD_PAGE};
use ferrite_reactor::oneshot;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most pages a blob's chain may have (a loop or a hostile chain stops there).
const MAX_CHAIN: usize = 4096;
/// Clusters allocated per metadata write when a blob is inflated or decoupled.
pub(crate) const ALLOC_BATCH: usize = 32;

/// What a new blob is made with.
#[derive(Debug, Clone, Default)]
pub struct BlobOpts {
    /// Size in clusters.
    pub num_clusters: u64,
    /// Thin provisioned: clusters are allocated on first write.
    pub thin: bool,
    /// Xattrs (name, value), in order.
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// Map clusters with RLE extents in the chain instead of an extent table (SPDK's
    /// `use_extent_table = false`; the extent table is the default and what lvols use).
    pub rle_extents: bool,
    /// Clear method stored in the blob (None: the blobstore's default).
    pub clear_method: Option<ClearMethod>,
    /// A clone of an external snapshot with this id (SPDK's esnap: for lvols, the bdev's UUID
    /// as a C string): its unallocated clusters read from that device.
    pub external_parent: Option<Vec<u8>>,
}

/// A blob's metadata state (metadata reactor only).
pub(crate) struct BlobState {
    /// The metadata as it is now (maybe not yet on the device).
    pub(crate) md: BlobMd,
    /// The chain's metadata pages on the device: the first is the blob id's page.
    pub(crate) chain: Vec<u32>,
    /// Extent pages whose clusters changed since the last persist.
    pub(crate) dirty_eps: BTreeSet<u64>,
    /// Something other than extent pages changed (the chain must be rewritten).
    pub(crate) chain_dirty: bool,
    /// A persist is under way; the others wait here.
    persisting: bool,
    waiters: Vec<oneshot::Sender<()>>,
    /// Clusters being allocated (or released: see `release.rs`), with who else waits for each.
    pub(super) allocating: HashMap<u64, Vec<oneshot::Sender<BsResult<u64>>>>,
    /// Clusters and extent pages a shrink cut off: released once the metadata without them is
    /// on the device.
    cut_clusters: Vec<u32>,
    cut_pages: Vec<u32>,
    /// The parent snapshot, open (reads of clusters this blob has not allocated go there).
    pub(crate) parent: Option<Blob>,
    /// A structural change (snapshot, merge, parent change) holds the cluster map: no
    /// allocation starts meanwhile, and it starts only once none is under way.
    pub(super) exclusive: bool,
    /// Who waits for `exclusive` to end or for the allocations under way to finish.
    excl_waiters: Vec<oneshot::Sender<()>>,
}

impl BlobState {
    fn new(md: BlobMd, chain: Vec<u32>, chain_dirty: bool, parent: Option<Blob>) -> BlobState {
        BlobState {
            md,
            chain,
            dirty_eps: BTreeSet::new(),
            chain_dirty,
            persisting: false,
            waiters: Vec::new(),
            allocating: HashMap::new(),
            cut_clusters: Vec::new(),
            cut_pages: Vec::new(),
            parent,
            exclusive: false,
            excl_waiters: Vec::new(),
        }
    }

    /// Wakes whoever waits for the exclusive section or for allocations to end.
    pub(super) fn wake_exclusive(&mut self) -> Vec<oneshot::Sender<()>> {
        std::mem::take(&mut self.excl_waiters)
    }
}

/// An open blob's shared part.
pub(crate) struct BlobInner {
    pub(crate) id: u64,
    pub(crate) store: Arc<Store>,
    map: Mutex<Arc<ClusterMap>>,
    pub(crate) st: Mutex<BlobState>,
}

/// An open blob. Cheap to clone; may travel to other reactors for [`Blob::map`], but metadata
/// operations run on the metadata reactor. The blob stays open while a handle exists.
#[derive(Clone)]
pub struct Blob(pub(crate) Arc<BlobInner>);

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({:#x})", self.0.id)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cluster map of `md` (device cluster indices to start blocks).
pub(crate) fn map_of(md: &BlobMd, blocks_per_cluster: u64) -> ClusterMap {
    let starts: Vec<u64> = md.clusters.iter().map(|&c| c as u64 * blocks_per_cluster).collect();
    ClusterMap::from_starts(&starts)
}

impl Store {
    /// Claims `n` free metadata pages (never page 0 of the region for anything but a blob's
    /// first page: SPDK keeps extent pages off it too).
    fn claim_pages(&self, n: usize) -> BsResult<Vec<u32>> {
        let mut st = self.lock();
        let mut got = Vec::with_capacity(n);
        let mut from = 1;
        for _ in 0..n {
            match st.pages.find_first_clear(from) {
                Some(p) => {
                    st.pages.set(p);
                    got.push(p as u32);
                    from = p + 1;
                }
                None => {
                    for p in &got {
                        st.pages.clear(*p as usize);
                    }
                    return Err(BsError::NoSpace("no free metadata page".into()));
                }
            }
        }
        Ok(got)
    }

    fn release_pages(&self, pages: &[u32]) {
        let mut st = self.lock();
        for &p in pages {
            if (p as usize) < st.pages.len() {
                st.pages.clear(p as usize);
            }
        }
    }

    /// Claims `n` free clusters, lowest first.
    fn claim_clusters(&self, n: u64) -> BsResult<Vec<u32>> {
        let mut st = self.lock();
        if (st.clusters.count_zeros() as u64) < n {
            return Err(BsError::NoSpace(format!("{n} clusters wanted, {} free", st.clusters.count_zeros())));
        }
        Ok((0..n).map(|_| st.clusters.allocate().expect("counted free") as u32).collect())
    }

    /// Claims `n` free clusters ahead for an operation that allocates many (inflate, decouple):
    /// all or none, so that it fails before it changes anything, and writes to thin blobs
    /// meanwhile cannot take its clusters midway.
    pub(crate) fn reserve_clusters(self: &Arc<Self>, n: u64) -> BsResult<Reserved> {
        Ok(Reserved { clusters: self.claim_clusters(n)?, store: self.clone() })
    }

    pub(crate) fn release_clusters(&self, clusters: &[u32]) {
        let mut st = self.lock();
        for &c in clusters {
            if c != 0 && (c as usize) < st.clusters.len() {
                st.clusters.clear(c as usize);
            }
        }
    }

    /// Reads blob `id`'s metadata from the device: its chain and extent pages.
    pub(crate) async fn read_blob(&self, id: u64) -> BsResult<(BlobMd, Vec<u32>)> {
        let root = blobid_to_page(id);
        if page_to_blobid(root as u64) != id || root >= self.geo.md_len {
            return Err(BsError::NotFound(id));
        }
        let mut chain_pages = vec![root];
        let mut pages: Vec<MdPage> = vec![self.read_page(root).await?];
        while pages.last().expect("one page at least").next != INVALID_MD_PAGE {
            if pages.len() >= MAX_CHAIN {
                return Err(BsError::Invalid(format!("blob {id:#x}: metadata chain longer than {MAX_CHAIN} pages")));
            }
            let next = pages.last().expect("one page at least").next;
            if chain_pages.contains(&next) {
                return Err(BsError::Invalid(format!("blob {id:#x}: metadata chain loops at page {next}")));
            }
            chain_pages.push(next);
            pages.push(self.read_page(next).await?);
        }
        let limits = ParseLimits::default();
        let mut md = BlobMd::parse_chain(&pages, &limits)?;
        if md.id != id {
            return Err(BsError::NotFound(id));
        }
        if let Some(table) = md.extent_table.clone() {
            let mut eps = Vec::with_capacity(table.len());
            for p in table {
                eps.push(if p == 0 { None } else { Some(ExtentPage::from_page(&self.read_page(p).await?)?) });
            }
            md.load_extent_pages(&eps)?;
        }
        // Clusters past the device (or in the metadata) are damage: refused before anything
        // acts on them (a delete would unmap them).
        let (total, md_clusters) = (self.lock().clusters.len() as u64, self.geo.md_clusters);
        if let Some(&c) = md.clusters.iter().find(|&&c| c != 0 && (c as u64 >= total || (c as u64) < md_clusters)) {
            return Err(BsError::Format(crate::format::FormatError::BadChain(format!(
                "blob {id:#x}: cluster {c} is outside the data clusters {md_clusters}..{total}"
            ))));
        }
        Ok((md, chain_pages))
    }
}

impl super::Blobstore {
    pub(crate) fn check(&self) -> BsResult<&Arc<Store>> {
        on_md_core(&self.0)?;
        if self.0.lock().unloaded {
            return Err(BsError::Busy("the blobstore is unloaded".into()));
        }
        Ok(&self.0)
    }

    /// Creates a blob and writes its metadata; returns its id.
    pub async fn create_blob(&self, opts: &BlobOpts) -> BsResult<u64> {
        self.create_blob_with(opts, &[]).await
    }

    /// Creates a blob with internal xattrs too (a snapshot's `SNAPTMP`, a clone's `SNAP`).
    pub(crate) async fn create_blob_with(&self, opts: &BlobOpts, internal: &[(&str, Vec<u8>)]) -> BsResult<u64> {
        let s = self.check()?;
        s.mark_dirty().await?;
        let id = {
            let mut st = s.lock();
            let mut from = 0;
            let page = loop {
                let p =
                    st.pages.find_first_clear(from).ok_or_else(|| BsError::NoSpace("no free metadata page".into()))?;
                // Not an id in use, nor one a delete is still releasing.
                if !st.blobids.get(p) && !st.busy.contains_key(&page_to_blobid(p as u64)) {
                    break p;
                }
                from = p + 1;
            };
            st.pages.set(page);
            st.blobids.set(page);
            page_to_blobid(page as u64)
        };
        let mut md = BlobMd::new(id);
        if opts.rle_extents {
            md.invalid_flags &= !crate::format::blob::FLAG_EXTENT_TABLE;
            md.extent_table = None;
        }
        if opts.thin {
            md.invalid_flags |= FLAG_THIN_PROV;
        }
        if let Some(c) = opts.clear_method {
            md.md_ro_flags = (md.md_ro_flags & !crate::format::blob::CLEAR_METHOD_MASK) | clear_bits(c);
        }
        for (n, v) in &opts.xattrs {
            md.xattrs.push(Xattr::new(n.as_bytes().to_vec(), v.clone()));
        }
        for (n, v) in internal {
            set_internal(&mut md, n, v.clone());
        }
        if let Some(x) = &opts.external_parent {
            set_internal(&mut md, crate::format::XATTR_EXTERNAL_SNAPSHOT_ID, x.clone());
            md.invalid_flags |= FLAG_THIN_PROV | crate::format::blob::FLAG_EXTERNAL_SNAPSHOT;
        }
        let inner = Arc::new(BlobInner {
            id,
            store: s.clone(),
            map: Mutex::new(Arc::new(ClusterMap::new(0))),
            st: Mutex::new(BlobState::new(md, vec![blobid_to_page(id)], true, None)),
        });
        let blob = Blob(inner);
        let res = async {
            blob.set_size(opts.num_clusters)?;
            blob.persist().await
        }
        .await;
        if let Err(e) = res {
            // Nothing refers to the blob: give back its page, id and clusters.
            let clusters: Vec<u32> = lock(&blob.0.st).md.clusters.clone();
            s.release_clusters(&clusters);
            let mut st = s.lock();
            st.pages.clear(blobid_to_page(id) as usize);
            st.blobids.clear(blobid_to_page(id) as usize);
            return Err(e);
        }
        Ok(id)
    }

    /// Opens blob `id` (the same handle if it is open already), and its parents: the chain up
    /// to the first open ancestor (or the root) is read first, then opened from the root down
    /// (no recursion: a chain may be as long as the store has blobs; a loop is refused).
    pub async fn open_blob(&self, id: u64) -> BsResult<Blob> {
        let s = self.check()?;
        let mut read: Vec<(u64, BlobMd, Vec<u32>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut cur = id;
        let mut parent = loop {
            if let Some(b) = s.lock().open.get(&cur).and_then(|w| w.upgrade()) {
                break Some(Blob(b));
            }
            if !seen.insert(cur) {
                return Err(BsError::Invalid(format!("blob {id:#x}: its parents loop at {cur:#x}")));
            }
            let (md, chain) = self.read_for_open(cur).await?;
            let next = match md.parent()? {
                Some(Parent::Snapshot(p)) => Some(p),
                // Read through the source the application registers for its id.
                Some(Parent::External(_)) | None => None,
            };
            read.push((cur, md, chain));
            match next {
                Some(p) => cur = p,
                None => break None,
            }
        };
        for (bid, md, chain) in read.into_iter().rev() {
            let map = map_of(&md, s.blocks_per_cluster);
            let inner = Arc::new(BlobInner {
                id: bid,
                store: s.clone(),
                map: Mutex::new(Arc::new(map)),
                st: Mutex::new(BlobState::new(md, chain, false, parent.take())),
            });
            let mut st = s.lock();
            let b = match st.open.get(&bid).and_then(|w| w.upgrade()) {
                Some(b) => b,
                None => {
                    st.open.retain(|_, w| w.strong_count() > 0);
                    st.open.insert(bid, Arc::downgrade(&inner));
                    inner
                }
            };
            parent = Some(Blob(b));
        }
        Ok(parent.expect("the blob itself was opened"))
    }

    /// Reads blob `id`'s metadata for an open (the load's copy if it has one), checking that
    /// the id is in use, not being deleted, and has no flag this version does not know.
    async fn read_for_open(&self, id: u64) -> BsResult<(BlobMd, Vec<u32>)> {
        let s = self.check()?;
        {
            let st = s.lock();
            if let Some(why) = st.busy.get(&id) {
                return Err(BsError::Busy(format!("blob {id:#x} is being {why}")));
            }
            let page = blobid_to_page(id) as usize;
            if page_to_blobid(page as u64) != id || !st.blobids.get(page) {
                return Err(BsError::NotFound(id));
            }
        }
        let cached = s.lock().preread.remove(&id);
        let (md, chain) = match cached {
            Some(r) => r,
            None => {
                s.lock().busy.insert(id, "opened");
                let read = s.read_blob(id).await;
                s.lock().busy.remove(&id);
                read?
            }
        };
        if md.access() == Access::Unopenable {
            return Err(BsError::Invalid(format!("blob {id:#x} has flags this version does not know")));
        }
        Ok((md, chain))
    }

    /// Deletes blob `id`, which must not be open: its first page is zeroed (and flushed), then
    /// its pages, clusters and id are released and its clusters unmapped (unless its clear
    /// method is none). A snapshot with one clone first hands the clone the clusters it lacks
    /// (SPDK's snapshot removal); one with more clones is refused.
    pub async fn delete_blob(&self, id: u64) -> BsResult<()> {
        self.check()?;
        let hold = self.reserve_delete(id)?;
        self.delete_held(hold).await
    }

    /// Deletes the blob `hold` holds (see [`Blobstore::reserve_delete`]).
    pub async fn delete_held(&self, hold: super::DeleteHold) -> BsResult<()> {
        self.check()?;
        let id = hold.blob.id();
        match &hold.clone {
            None => self.delete_keeping(id, &Keep::default()).await,
            Some(c) => self.delete_into_clone(id, c.id()).await,
        }
    }

    /// Deletes blob `id` (see [`Blobstore::delete_blob`]) except for the clusters and extent
    /// pages in `keep`: another blob took them over.
    pub(crate) async fn delete_keeping(&self, id: u64, keep: &Keep) -> BsResult<()> {
        let s = self.check()?;
        {
            let mut st = s.lock();
            if st.open.get(&id).is_some_and(|w| w.strong_count() > 0) {
                return Err(BsError::Busy(format!("blob {id:#x} is open")));
            }
            if st.busy.contains_key(&id) {
                return Err(BsError::Busy(format!("blob {id:#x} is busy")));
            }
            let page = blobid_to_page(id) as usize;
            if page_to_blobid(page as u64) != id || !st.blobids.get(page) {
                return Err(BsError::NotFound(id));
            }
            st.busy.insert(id, "deleted");
            st.preread.remove(&id);
        }
        let res = async {
            let (md, chain) = s.read_blob(id).await?;
            s.mark_dirty().await?;
            s.dev.write_zeroes(s.page_offset(chain[0]), s.geo.md_page_size as u64).await?;
            s.dev.flush().await?;
            let mut pages = chain.clone();
            pages.extend(md.extent_table.iter().flatten().copied().filter(|&p| p != 0 && !keep.pages.contains(&p)));
            for &p in &pages[1..] {
                s.dev.write_zeroes(s.page_offset(p), s.geo.md_page_size as u64).await?;
            }
            let clusters: Vec<u32> =
                md.clusters.iter().copied().filter(|c| *c != 0 && !keep.clusters.contains(c)).collect();
            // The clusters are unmapped while still the blob's, and only then handed back: once
            // free, another blob may take one and write it at once.
            if md.clear_method() != ClearMethod::None {
                for &c in &clusters {
                    s.dev.unmap(s.cluster_block(c) * s.dev.block_size() as u64, s.geo.cluster_size as u64).await?;
                }
            }
            s.release_clusters(&clusters);
            s.release_pages(&pages);
            {
                let mut st = s.lock();
                st.blobids.clear(blobid_to_page(id) as usize);
                st.parents.remove(&id);
            }
            Ok(())
        }
        .await;
        s.lock().busy.remove(&id);
        res
    }

    /// The blobs whose parent is `id` (its clones), lowest first.
    pub fn clones_of(&self, id: u64) -> Vec<u64> {
        let st = self.0.lock();
        let mut v: Vec<u64> = st.parents.iter().filter(|(_, &p)| p == id).map(|(&c, _)| c).collect();
        v.sort_unstable();
        v
    }

    /// The parent snapshot of blob `id`, as the blobstore knows it (every blob's is read at
    /// load and kept up to date).
    pub fn parent_of(&self, id: u64) -> Option<u64> {
        self.0.lock().parents.get(&id).copied()
    }
}

/// What a delete leaves alone because another blob holds it.
#[derive(Debug, Default)]
pub(crate) struct Keep {
    pub(crate) clusters: std::collections::HashSet<u32>,
    pub(crate) pages: std::collections::HashSet<u32>,
}

/// Sets internal xattr `name` of `md` (and the flag that says it has some).
pub(crate) fn set_internal(md: &mut BlobMd, name: &str, value: Vec<u8>) {
    match md.internal_xattrs.iter_mut().find(|x| x.name == name.as_bytes()) {
        Some(x) => x.value = value,
        None => md.internal_xattrs.push(Xattr::new(name.as_bytes().to_vec(), value)),
    }
    md.invalid_flags |= FLAG_INTERNAL_XATTR;
}

/// Removes internal xattr `name` of `md` (and the flag once none is left).
pub(crate) fn remove_internal(md: &mut BlobMd, name: &str) {
    md.internal_xattrs.retain(|x| x.name != name.as_bytes());
    if md.internal_xattrs.is_empty() {
        md.invalid_flags &= !FLAG_INTERNAL_XATTR;
    }
}

fn clear_bits(c: ClearMethod) -> u64 {
    match c {
        ClearMethod::Default => 0,
        ClearMethod::None => 1,
        ClearMethod::Unmap => 2,
        ClearMethod::WriteZeroes => 3,
    }
}

impl Blob {
    /// The blob id.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The blobstore the blob is in.
    pub fn store(&self) -> super::Blobstore {
        super::Blobstore(self.0.store.clone())
    }

    /// The cluster map as it is now. Readers on other cores keep it until
    /// [`Blob::map_generation`] moves (a resize replaced it).
    pub fn map(&self) -> Arc<ClusterMap> {
        lock(&self.0.map).clone()
    }

    /// Replaces the cluster map (its readers see the generation move).
    pub(crate) fn set_map(&self, map: ClusterMap) {
        *lock(&self.0.map) = Arc::new(map);
        self.0.store.bump_generation();
    }

    /// The blobstore's topology generation: it moves whenever any blob's map is replaced, a
    /// parent changes or a blob becomes read-only. A reader that keeps [`Blob::maps`] takes
    /// them again when it moves (one atomic load per I/O).
    #[inline]
    pub fn map_generation(&self) -> u64 {
        self.0.store.generation.load(Ordering::Acquire)
    }

    /// The counter [`Blob::map_generation`] reads, for a reader that loads it itself.
    pub fn generation_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.0.store.generation.clone()
    }

    /// This blob's map and its ancestors' in order: a cluster's data is in the first map that
    /// has it allocated, and zeroes if none has.
    pub fn maps(&self) -> Vec<Arc<ClusterMap>> {
        let mut out = vec![self.map()];
        let mut p = lock(&self.0.st).parent.clone();
        while let Some(b) = p {
            out.push(b.map());
            p = lock(&b.0.st).parent.clone();
        }
        out
    }

    /// The parent snapshot's id, if the blob has one.
    pub fn parent_id(&self) -> Option<u64> {
        lock(&self.0.st).parent.as_ref().map(|p| p.0.id)
    }

    /// The parent snapshot, open.
    pub fn parent(&self) -> Option<Blob> {
        lock(&self.0.st).parent.clone()
    }

    /// The external snapshot id of this blob (an esnap clone's), if it has one.
    pub fn external_id(&self) -> Option<Vec<u8>> {
        match lock(&self.0.st).md.parent() {
            Ok(Some(Parent::External(id))) => Some(id),
            _ => None,
        }
    }

    /// The external snapshot at the root of this blob's ancestry (its own, or the oldest
    /// ancestor's): unallocated clusters no ancestor holds read from it.
    pub fn root_external(&self) -> Option<Vec<u8>> {
        let mut b = self.clone();
        loop {
            let p = lock(&b.0.st).parent.clone();
            match p {
                Some(p) => b = p,
                None => return b.external_id(),
            }
        }
    }

    /// The device block where an ancestor holds cluster `index`'s data (the data a first write
    /// to it starts from), if one does.
    pub(super) fn ancestor_start(&self, index: u64) -> Option<u64> {
        let mut p = lock(&self.0.st).parent.clone();
        while let Some(b) = p {
            if let Some(s) = b.map().start(index) {
                return Some(s);
            }
            p = lock(&b.0.st).parent.clone();
        }
        None
    }

    /// A copy of the metadata as it is now.
    pub fn md(&self) -> BlobMd {
        lock(&self.0.st).md.clone()
    }

    /// Size in clusters.
    pub fn num_clusters(&self) -> u64 {
        lock(&self.0.st).md.num_clusters
    }

    /// Allocated clusters.
    pub fn allocated_clusters(&self) -> u64 {
        lock(&self.0.st).md.allocated_clusters()
    }

    /// Thin provisioned.
    pub fn is_thin(&self) -> bool {
        lock(&self.0.st).md.is_thin_provisioned()
    }

    /// Read-only (a snapshot, or marked so).
    pub fn is_read_only(&self) -> bool {
        lock(&self.0.st).md.access() != Access::ReadWrite
    }

    /// The value of xattr `name`.
    pub fn xattr(&self, name: &str) -> Option<Vec<u8>> {
        lock(&self.0.st).md.xattr(name).map(|x| x.value.clone())
    }

    /// The names of its xattrs.
    pub fn xattr_names(&self) -> Vec<String> {
        lock(&self.0.st).md.xattrs.iter().map(|x| String::from_utf8_lossy(&x.name).into_owned()).collect()
    }

    fn writable_md(&self) -> BsResult<MutexGuard<'_, BlobState>> {
        on_md_core(&self.0.store)?;
        let st = lock(&self.0.st);
        if matches!(st.md.access(), Access::MdReadOnly | Access::Unopenable) {
            return Err(BsError::ReadOnly(self.0.id));
        }
        Ok(st)
    }

    /// Sets xattr `name` (in memory: [`Blob::sync_md`] writes it).
    pub fn set_xattr(&self, name: &str, value: &[u8]) -> BsResult<()> {
        let mut st = self.writable_md()?;
        match st.md.xattrs.iter_mut().find(|x| x.name == name.as_bytes()) {
            Some(x) => x.value = value.to_vec(),
            None => st.md.xattrs.push(Xattr::new(name.as_bytes().to_vec(), value.to_vec())),
        }
        st.chain_dirty = true;
        Ok(())
    }

    /// Removes xattr `name` (in memory); false if it had none.
    pub fn remove_xattr(&self, name: &str) -> BsResult<bool> {
        let mut st = self.writable_md()?;
        let before = st.md.xattrs.len();
        st.md.xattrs.retain(|x| x.name != name.as_bytes());
        let removed = st.md.xattrs.len() != before;
        st.chain_dirty |= removed;
        Ok(removed)
    }

    /// Marks the blob read-only (in memory).
    pub fn set_read_only(&self) -> BsResult<()> {
        let mut st = self.writable_md()?;
        st.md.data_ro_flags |= FLAG_READ_ONLY;
        st.chain_dirty = true;
        drop(st);
        self.0.store.bump_generation();
        Ok(())
    }

    /// Changes the size to `n` clusters in memory (a thick blob gets its new clusters now;
    /// clusters cut off are released when the metadata is written). Readers on other cores must
    /// not be using the map (the caller freezes the blob's I/O).
    fn set_size(&self, n: u64) -> BsResult<()> {
        let s = &self.0.store;
        let mut st = self.writable_md()?;
        if st.md.access() != Access::ReadWrite {
            return Err(BsError::ReadOnly(self.0.id));
        }
        let old = st.md.num_clusters;
        if n > u32::MAX as u64 || n > ParseLimits::default().max_clusters {
            return Err(BsError::Invalid(format!("{n} clusters are more than a blob holds")));
        }
        if n > old {
            if st.md.is_thin_provisioned() {
                st.md.clusters.resize(n as usize, 0);
            } else {
                let got = s.claim_clusters(n - old)?;
                st.md.clusters.extend(got);
            }
            for ep in cluster_to_extent_page(old)..extent_pages_for(n) {
                st.dirty_eps.insert(ep);
            }
        } else if n < old {
            let cut = st.md.clusters.split_off(n as usize);
            st.cut_clusters.extend(cut.into_iter().filter(|&c| c != 0));
            if let Some(t) = st.md.extent_table.as_mut() {
                let gone = t.split_off(extent_pages_for(n) as usize);
                st.cut_pages.extend(gone.into_iter().filter(|&p| p != 0));
            }
            if n > 0 {
                // The last extent page kept holds fewer clusters now.
                st.dirty_eps.insert(cluster_to_extent_page(n - 1));
            }
            st.dirty_eps.retain(|&ep| ep < extent_pages_for(n));
        }
        st.md.num_clusters = n;
        if let Some(t) = st.md.extent_table.as_mut() {
            t.resize(extent_pages_for(n) as usize, 0);
        }
        st.chain_dirty = true;
        let map = map_of(&st.md, s.blocks_per_cluster);
        drop(st);
        self.set_map(map);
        Ok(())
    }

    /// Resizes to `n` clusters and writes the metadata. Shrinking releases (and unmaps) the
    /// clusters cut off once the new metadata is on the device. The caller keeps the blob's I/O
    /// away from the clusters that go. EBUSY while another operation (a snapshot, inflate,
    /// delete, another resize) holds the blob; first writes that allocate clusters finish
    /// before the size changes, and those that come meanwhile wait for it.
    pub async fn resize(&self, n: u64) -> BsResult<()> {
        on_md_core(&self.0.store)?;
        let _op = Store::reserve(&self.0.store, self.0.id, "resize")?;
        self.exclusive().await;
        let r = async {
            self.set_size(n)?;
            self.persist().await
        }
        .await;
        self.end_exclusive();
        r
    }

    /// Writes the metadata changed in memory (xattrs, flags).
    pub async fn sync_md(&self) -> BsResult<()> {
        on_md_core(&self.0.store)?;
        self.persist().await
    }

    /// Waits for this blob's turn to write metadata.
    async fn turn(&self) {
        loop {
            let rx = {
                let mut st = lock(&self.0.st);
                if !st.persisting {
                    st.persisting = true;
                    return;
                }
                let (tx, rx) = oneshot::channel();
                st.waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
    }

    fn end_turn(&self) {
        let waiters = {
            let mut st = lock(&self.0.st);
            st.persisting = false;
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            w.send(());
        }
    }

    /// Writes what changed: extent pages (new ones to fresh pages, changed ones in place), and,
    /// if more than extent pages changed, the chain copy-on-write (see the module doc of
    /// [`super`]). Then releases what the old metadata held and the new does not.
    pub(crate) async fn persist(&self) -> BsResult<()> {
        self.turn().await;
        let r = self.persist_turn().await;
        self.end_turn();
        r
    }

    async fn persist_turn(&self) -> BsResult<()> {
        let s = self.0.store.clone();
        s.mark_dirty().await?;
        // What to write, decided under the lock; new pages claimed.
        let mut new_pages: Vec<u32> = Vec::new();
        let mut old_eps: Vec<(usize, u32)> = Vec::new();
        let plan = (|| -> BsResult<Plan> {
            let mut st = lock(&self.0.st);
            let mut eps = Vec::new();
            let dirty: Vec<u64> = std::mem::take(&mut st.dirty_eps).into_iter().collect();
            if st.md.extent_table.is_some() {
                let dirty: Vec<u64> = dirty
                    .into_iter()
                    .filter(|&n| {
                        let at = st.md.extent_table.as_ref().and_then(|t| t.get(n as usize)).copied();
                        at.is_some_and(|at| at != 0 || st.md.extent_page(n).clusters.iter().any(|&c| c != 0))
                    })
                    .collect();
                // The chain is rewritten if anything but extent page contents changed, or an
                // extent page is new. Then every changed extent page goes to a fresh page too
                // (its length may have changed with the size: rewritten in place it could reach
                // the medium without the first page that gives that size); otherwise (a
                // cluster allocated) the changed pages are rewritten in place, one atomic
                // page each, and the chain stays.
                let table = st.md.extent_table.as_ref().expect("checked");
                let rewrite = st.chain_dirty || dirty.iter().any(|&n| table[n as usize] == 0);
                for n in dirty {
                    let ep = st.md.extent_page(n).to_page()?;
                    let table = st.md.extent_table.as_mut().expect("checked");
                    if rewrite {
                        let p = s.claim_pages(1)?[0];
                        new_pages.push(p);
                        let old = std::mem::replace(&mut table[n as usize], p);
                        old_eps.push((n as usize, old));
                    }
                    eps.push((table[n as usize], ep));
                }
                st.chain_dirty |= rewrite;
            } else if !dirty.is_empty() {
                st.chain_dirty = true;
            }
            let chain = if st.chain_dirty {
                let mut pages = st.md.serialize()?;
                let rest = s.claim_pages(pages.len() - 1)?;
                new_pages.extend(&rest);
                link_chain(&mut pages, &rest)?;
                st.chain_dirty = false;
                Some((pages, rest))
            } else {
                None
            };
            // What a shrink cut off goes once the chain without it is written.
            let (cut, cut_pages) = if chain.is_some() {
                (std::mem::take(&mut st.cut_clusters), std::mem::take(&mut st.cut_pages))
            } else {
                (Vec::new(), Vec::new())
            };
            Ok(Plan { eps, chain, cut, cut_pages, replaced: old_eps.clone() })
        })();
        let plan = match plan {
            Ok(p) => p,
            Err(e) => {
                self.revert(&s, &new_pages, &old_eps, &[], &[]);
                return Err(e);
            }
        };
        if let Err(e) = self.write_plan(&s, &plan).await {
            // The old metadata is what the device has (or, after a crash, what recovery finds):
            // give back what this attempt claimed and write everything again next time.
            self.revert(&s, &new_pages, &plan.replaced, &plan.cut, &plan.cut_pages);
            return Err(e);
        }
        if let Some((_, rest)) = &plan.chain {
            let old: Vec<u32> = {
                let mut st = lock(&self.0.st);
                let old = st.chain[1..].to_vec();
                st.chain.truncate(1);
                st.chain.extend(rest);
                old
            };
            for &p in &old {
                s.dev.write_zeroes(s.page_offset(p), s.geo.md_page_size as u64).await?;
            }
            s.release_pages(&old);
        }
        // Extent pages a shrink cut off, and those replaced by fresh copies.
        let gone: Vec<u32> =
            plan.cut_pages.iter().copied().chain(plan.replaced.iter().map(|&(_, p)| p)).filter(|&p| p != 0).collect();
        for &p in &gone {
            s.dev.write_zeroes(s.page_offset(p), s.geo.md_page_size as u64).await?;
        }
        s.release_pages(&gone);
        if !plan.cut.is_empty() {
            let clear = lock(&self.0.st).md.clear_method();
            // Unmapped before they are free (as in a delete): a cluster handed back may be
            // written by its next owner at once.
            if clear != ClearMethod::None {
                for &c in plan.cut.iter().filter(|&&c| c != 0) {
                    s.dev.unmap(s.cluster_block(c) * s.dev.block_size() as u64, s.geo.cluster_size as u64).await?;
                }
            }
            s.release_clusters(&plan.cut);
        }
        Ok(())
    }

    /// Undoes a persist that failed: the pages it claimed go back, extent table entries it
    /// pointed at fresh pages point where they did, what a shrink cut stays to be released,
    /// and everything is written again next time.
    fn revert(&self, s: &Store, new_pages: &[u32], replaced: &[(usize, u32)], cut: &[u32], cut_pages: &[u32]) {
        s.release_pages(new_pages);
        let mut st = lock(&self.0.st);
        st.cut_clusters.extend(cut);
        st.cut_pages.extend(cut_pages);
        if let Some(t) = st.md.extent_table.as_mut() {
            for &(n, old) in replaced {
                if let Some(slot) = t.get_mut(n) {
                    *slot = old;
                }
            }
            for slot in t.iter_mut().filter(|x| new_pages.contains(x)) {
                *slot = 0;
            }
        }
        st.chain_dirty = true;
        for n in 0..st.md.extent_table.as_ref().map_or(0, |t| t.len()) {
            st.dirty_eps.insert(n as u64);
        }
    }

    async fn write_plan(&self, s: &Store, plan: &Plan) -> BsResult<()> {
        for (p, page) in &plan.eps {
            s.write_page(*p, page).await?;
        }
        if let Some((pages, rest)) = &plan.chain {
            for (page, &at) in pages[1..].iter().zip(rest) {
                s.write_page(at, page).await?;
            }
            // Everything the first page refers to is on the medium before it is.
            s.dev.flush().await?;
            s.write_page(blobid_to_page(self.0.id), &pages[0]).await?;
            s.dev.flush().await?;
        }
        Ok(())
    }

    /// Allocates cluster `index` of a thin blob (its first write), once: the cluster is claimed,
    /// filled with its parent's data if an ancestor has some (a clone's copy-on-write),
    /// recorded in the metadata on the device, and only then published in the map. Concurrent
    /// calls for the same cluster wait for the first. Returns the cluster's start block.
    pub async fn allocate_cluster(&self, index: u64) -> BsResult<u64> {
        on_md_core(&self.0.store)?;
        if let Some(start) = self.map().start(index) {
            return Ok(start);
        }
        self.allocate_many(&[index], None).await?;
        self.map().start(index).ok_or_else(|| BsError::Busy(format!("cluster {index} was not allocated")))
    }

    /// Allocates the clusters `indices` not yet allocated (see [`Blob::allocate_cluster`]),
    /// with one metadata write for all, taking clusters from `reserved` if given.
    pub(crate) async fn allocate_many(&self, indices: &[u64], reserved: Option<&mut Reserved>) -> BsResult<()> {
        let s = self.0.store.clone();
        on_md_core(&s)?;
        // No allocation starts while a structural change holds the map.
        loop {
            let rx = {
                let mut st = lock(&self.0.st);
                if !st.exclusive {
                    break;
                }
                let (tx, rx) = oneshot::channel();
                st.excl_waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
        let map = self.map();
        let mut mine = Vec::new();
        let mut waits = Vec::new();
        {
            let mut st = lock(&self.0.st);
            if st.md.access() != Access::ReadWrite {
                return Err(BsError::ReadOnly(self.0.id));
            }
            for &index in indices {
                if index >= st.md.num_clusters {
                    return Err(BsError::Invalid(format!("cluster {index} beyond the blob's {}", st.md.num_clusters)));
                }
            }
            for &index in indices {
                if map.start(index).is_some() {
                    continue;
                }
                match st.allocating.get_mut(&index) {
                    Some(w) => {
                        let (tx, rx) = oneshot::channel();
                        w.push(tx);
                        waits.push(rx);
                    }
                    None => {
                        st.allocating.insert(index, Vec::new());
                        mine.push(index);
                    }
                }
            }
        }
        let res = if mine.is_empty() { Ok(0) } else { self.allocate_claimed(&s, &mine, reserved).await };
        let waiters: Vec<_> = {
            let mut st = lock(&self.0.st);
            let w: Vec<_> = mine.iter().flat_map(|i| st.allocating.remove(i).unwrap_or_default()).collect();
            let ex = if st.allocating.is_empty() { st.wake_exclusive() } else { Vec::new() };
            drop(st);
            for e in ex {
                e.send(());
            }
            w
        };
        for w in waiters {
            w.send(res.clone());
        }
        res?;
        for rx in waits {
            rx.await.map_err(|_| BsError::Busy("the allocation was dropped".into()))??;
        }
        Ok(())
    }

    /// Claims a cluster for each of `indices` (registered as allocating by the caller), copies
    /// the ancestors' data in, writes the metadata and publishes them.
    async fn allocate_claimed(
        &self,
        s: &Arc<Store>,
        indices: &[u64],
        reserved: Option<&mut Reserved>,
    ) -> BsResult<u64> {
        let got = match reserved {
            Some(r) => r.take(indices.len())?,
            None => s.claim_clusters(indices.len() as u64)?,
        };
        let res = async {
            let len = s.geo.cluster_size as usize;
            let bs = s.dev.block_size() as u64;
            let mut copied = false;
            let external = self.root_external();
            for (&index, &c) in indices.iter().zip(&got) {
                let to = s.cluster_block(c) * bs;
                match self.ancestor_start(index) {
                    Some(from) => s.dev.copy_from(&s.dev, from * bs, to, len as u64).await?,
                    None => match &external {
                        Some(id) => {
                            let src = s.external_source(id)?;
                            s.dev.copy_from(&src, index * len as u64, to, len as u64).await?
                        }
                        None => continue,
                    },
                }
                copied = true;
            }
            if copied {
                // The copies are on the medium before the metadata that finds them.
                s.dev.flush().await?;
            }
            {
                let mut st = lock(&self.0.st);
                for (&index, &c) in indices.iter().zip(&got) {
                    st.md.clusters[index as usize] = c;
                    st.dirty_eps.insert(index / EXTENTS_PER_EP);
                }
            }
            if let Err(e) = self.persist().await {
                let mut st = lock(&self.0.st);
                for &index in indices {
                    if let Some(slot) = st.md.clusters.get_mut(index as usize) {
                        *slot = 0;
                    }
                }
                return Err(e);
            }
            Ok(())
        }
        .await;
        if let Err(e) = res {
            s.release_clusters(&got);
            return Err(e);
        }
        // Recorded on the device: the clusters are the blob's whatever happens to the map.
        let map = self.map();
        for (&index, &c) in indices.iter().zip(&got) {
            if let Err(e) = map.insert(index, s.cluster_block(c)) {
                log::error!("blob {:#x}: cluster {index} allocated but not published: {e:?}", self.0.id);
                return Err(BsError::Invalid(format!("cluster {index} of blob {:#x}: {e:?}", self.0.id)));
            }
        }
        Ok(indices.len() as u64)
    }

    /// Takes the map for a structural change: waits for allocations under way to finish and
    /// keeps new ones from starting until [`Blob::end_exclusive`].
    pub(crate) async fn exclusive(&self) {
        loop {
            let rx = {
                let mut st = lock(&self.0.st);
                if !st.exclusive && st.allocating.is_empty() {
                    st.exclusive = true;
                    return;
                }
                let (tx, rx) = oneshot::channel();
                st.excl_waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
    }

    /// Ends a structural change: allocations go on.
    pub(crate) fn end_exclusive(&self) {
        let w = {
            let mut st = lock(&self.0.st);
            st.exclusive = false;
            st.wake_exclusive()
        };
        for w in w {
            w.send(());
        }
    }
}

/// Clusters claimed ahead by [`Store::reserve_clusters`]; those not used go back to the store
/// when it is dropped (never written: free as they were).
pub(crate) struct Reserved {
    store: Arc<Store>,
    clusters: Vec<u32>,
}

impl Reserved {
    /// `n` clusters: the reserved ones first, then (an operation that found more to do than it
    /// reserved for) claimed from the store.
    fn take(&mut self, n: usize) -> BsResult<Vec<u32>> {
        let mine = n.min(self.clusters.len());
        let mut got = self.clusters.split_off(self.clusters.len() - mine);
        if got.len() < n {
            got.extend(self.store.claim_clusters((n - got.len()) as u64)?);
        }
        Ok(got)
    }

    /// Clusters reserved and not used yet.
    pub(crate) fn len(&self) -> usize {
        self.clusters.len()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.store.release_clusters(&self.clusters);
    }
}

/// What one persist writes.
struct Plan {
    /// Extent pages: (metadata page, content).
    eps: Vec<(u32, MdPage)>,
    /// The chain and the fresh pages of its pages 1.., if the chain is rewritten.
    chain: Option<(Vec<MdPage>, Vec<u32>)>,
    /// Clusters cut off by a shrink, released after the write.
    cut: Vec<u32>,
    /// Extent pages cut off by a shrink, zeroed and released after the write.
    cut_pages: Vec<u32>,
    /// Extent pages written to fresh pages: (index in the extent table, the old page, or 0),
    /// the old ones zeroed and released after the write.
    replaced: Vec<(usize, u32)>,
}
