//! The lvol bdev: a blob served as a bdev. Its I/O never touches the metadata: each core's
//! channel maps a request's cluster to the base bdev through the blob's cluster map (read
//! without a lock) and forwards the request itself to the base bdev's channel, with its offset
//! moved. The bdev declares the cluster as its optimal I/O boundary with splitting, so the bdev
//! layer hands it requests within one cluster. While the lvol's clusters lie back to back (a
//! thick lvol, a thin one allocated in order), the channel names that linear mapping to the bdev
//! layer, which then forwards reads and writes itself, without a call into the module.
//!
//! A thin lvol's unallocated cluster reads from the first ancestor (snapshot) that has it, or as
//! zeroes; an unmap of it has nothing to do, nor has a write-zeroes if no ancestor has it; the
//! first write to it asks the metadata reactor to allocate it (copying the ancestor's data in:
//! copy-on-write), then goes to the cluster the map now names. Flush and reset go to the base
//! bdev. A read-only lvol (a snapshot) fails writes with EROFS.
//!
//! An unmap or a write-zeroes of a whole allocated cluster of a thin lvol that no ancestor holds
//! gives the cluster back to the lvstore, as SPDK's blobstore does on unmap (a guest's fstrim
//! frees space): the request goes to the base bdev as usual, then the metadata reactor releases
//! the cluster (`Blob::release_cluster`; reads of it give zeroes again), and the request
//! completes. The cluster is free once every core finished what it had in flight on the lvol
//! (a quiesce of its channels: nothing can still write into it when another lvol takes it).
//! Partial clusters, thick lvols and clusters a snapshot holds are unmapped or zeroed in place.
//!
//! Each channel keeps the maps of the blob and its ancestors, taken again whenever the
//! blobstore's topology generation moves (a resize, a snapshot, a parent change, read-only).

use crate::lvs::{Lvol, Lvstore};
use crate::MODULE;
use ferrite_bdev::{
    BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoChannel, IoStatus, IoType, IoTypes, Limits,
    LinearMap,
};
use ferrite_blob::store::{Blob, ClusterMap};
use serde_json::{json, Value};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// The I/O types lvols serve.
pub const IO_TYPES: IoTypes =
    IoTypes::of(&[IoType::Read, IoType::Write, IoType::Unmap, IoType::WriteZeroes, IoType::Flush, IoType::Reset]);
/// The I/O types read-only lvols (snapshots) serve.
pub const READ_ONLY_IO_TYPES: IoTypes = IoTypes::of(&[IoType::Read, IoType::Flush, IoType::Reset]);
/// The I/O types an lvol stops serving when it becomes read-only.
pub const WRITE_IO_TYPES: IoTypes = IoTypes(IO_TYPES.0 & !READ_ONLY_IO_TYPES.0);

struct LvolBackend {
    lvol: Arc<Lvol>,
    /// The blobstore, whose registry of external snapshot devices a new channel reads: the
    /// backend holds no descriptor of its own, so an external snapshot's bdev can go (its
    /// lvols become degraded) even when this lvol no longer reads it (inflated, decoupled).
    bs: ferrite_blob::store::Blobstore,
    lvs_uuid: uuid::Uuid,
    base: String,
    dev: ferrite_blob::store::Dev,
    blocks_per_cluster: u64,
    md_core: usize,
}

struct LvolChannel {
    base: IoChannel,
    blob: Blob,
    map: OwnMap,
    /// The ancestors' maps, nearest first.
    parents: Vec<Arc<ClusterMap>>,
    read_only: bool,
    /// Thin provisioned (whole clusters it unmaps go back to the lvstore).
    thin: bool,
    /// The lvol's bdev name (its UUID), for the quiesce before a released cluster is free.
    bdev_name: Arc<str>,
    /// The external snapshot's channel, if the lvol was made over one.
    ext: Option<ExtChannel>,
    /// The ancestry still starts at the external snapshot (inflate ends that).
    ext_root: bool,
    gen: u64,
    blocks_per_cluster: u64,
    base_blocks: u64,
    md_core: usize,
    lends: bool,
}

/// The lvol's own cluster map, as a channel reads it.
struct OwnMap {
    map: Arc<ClusterMap>,
    /// Where cluster 0 starts if the clusters are all allocated, in order and back to back
    /// (`ClusterMap::contiguous_start`): a cluster's start is then computed, not loaded from a
    /// map entry that the data copies of the requests in flight keep evicting.
    contiguous: Option<u64>,
    /// The map's cluster count.
    clusters: u64,
    blocks_per_cluster: u64,
}

impl OwnMap {
    fn new(map: Arc<ClusterMap>, blocks_per_cluster: u64) -> Self {
        let contiguous = map.contiguous_start(blocks_per_cluster);
        Self { contiguous, clusters: map.len() as u64, blocks_per_cluster, map }
    }

    /// Where `cluster` starts, if it is allocated.
    #[inline]
    fn start(&self, cluster: u64) -> Option<u64> {
        match self.contiguous {
            Some(first) if cluster < self.clusters => Some(first + cluster * self.blocks_per_cluster),
            _ => self.map.start(cluster),
        }
    }
}

impl LvolChannel {
    /// The maps as they are now (taken again if the generation moved).
    #[inline]
    fn refresh(&mut self) {
        let g = self.blob.map_generation();
        if g != self.gen {
            self.retake(g);
        }
    }

    #[cold]
    fn retake(&mut self, g: u64) {
        let mut maps = self.blob.maps();
        self.map = OwnMap::new(maps.remove(0), self.blocks_per_cluster);
        self.parents = maps;
        self.read_only = self.blob.is_read_only();
        self.thin = self.blob.is_thin();
        self.ext_root = self.ext.is_some() && self.blob.root_external().is_some();
        self.gen = g;
    }

    /// Reads a range no blob of the ancestry holds from the external snapshot: forwarded if
    /// it lies within it and the block sizes match; else the part within it is read into a
    /// buffer of ours, copied over, and the rest zeroed.
    fn ext_read(&self, mut io: BdevIo, cluster: u64, within: u64) {
        let ext = self.ext.as_ref().expect("checked by the caller");
        let bs = io.block_size() as u64;
        let at = (cluster * self.blocks_per_cluster + within) * bs;
        let len = io.req.num_blocks * bs;
        let ext_bs = ext.ch.block_size() as u64;
        let ext_size = ext.ch.num_blocks() * ext_bs;
        if ext_bs == bs && at + len <= ext_size {
            io.req.offset_blocks = at / bs;
            return ext.ch.forward(io);
        }
        let n = ext_size.saturating_sub(at).min(len);
        if n == 0 {
            fill_zeroes(&mut io, 0);
            return io.complete_deferred(IoStatus::Success);
        }
        let req = ferrite_bdev::IoRequest::read(at / ext_bs, n / ext_bs, ferrite_reactor::alloc_buf(n as usize));
        ext.ch.submit_child(io, req, ext_read_done);
    }

    /// The cluster of the lvol's block `offset`, and the block's place within it (no division
    /// for the power-of-two cluster sizes lvstores nearly always have).
    #[inline(always)]
    fn locate(&self, offset: u64) -> (u64, u64) {
        let b = self.blocks_per_cluster;
        if b.is_power_of_two() {
            (offset >> b.trailing_zeros(), offset & (b - 1))
        } else {
            (offset / b, offset % b)
        }
    }

    /// Where an ancestor holds `cluster`, if one does.
    #[inline]
    fn in_parents(&self, cluster: u64) -> Option<u64> {
        self.parents.iter().find_map(|m| m.start(cluster))
    }

    /// A thin lvol's first write to a cluster: the metadata reactor allocates it, then the
    /// write goes there.
    fn allocate_then_write(&self, mut io: BdevIo, cluster: u64, within: u64) {
        let blob = self.blob.clone();
        let base = self.base.clone();
        let md_core = self.md_core;
        ferrite_reactor::spawn_local(async move {
            let rx = ferrite_reactor::engine()
                .run_async(md_core, move || async move { blob.allocate_cluster(cluster).await });
            match rx.await {
                Ok(Ok(start)) => {
                    io.req.offset_blocks = start + within;
                    base.forward_moved(io);
                }
                Ok(Err(e)) => {
                    // Every write to a full lvstore fails here: one line now and then, not each.
                    ferrite_reactor::log_limited!(log::Level::Warn, "lvol: cluster {cluster}: {e}");
                    io.complete(IoStatus::Failed(e.errno()));
                }
                Err(_) => io.complete(IoStatus::Failed(libc::EIO)),
            }
        })
        .detach();
    }
}

impl LvolChannel {
    /// True if `io` (on allocated `cluster`) unmaps or zeroes the whole cluster of a thin lvol
    /// and no ancestor holds the cluster: it can go back to the lvstore.
    #[inline]
    fn releases(&self, io: &BdevIo, cluster: u64, within: u64) -> bool {
        matches!(io.req.io_type, IoType::Unmap | IoType::WriteZeroes)
            && self.thin
            && within == 0
            && io.req.num_blocks == self.blocks_per_cluster
            && !self.ext_root
            && self.in_parents(cluster).is_none()
    }

    /// Sends the unmap or write-zeroes of whole `cluster` (at base block `start`) to the base,
    /// then has the metadata reactor release the cluster, then completes `io`. The release is
    /// an optimisation of space: if it does not happen (the lvol is under an operation, or the
    /// metadata write failed, which is logged) the request has still done what it asked.
    fn release_after(&self, io: BdevIo, cluster: u64, start: u64) {
        let base = self.base.clone();
        let blob = self.blob.clone();
        let md_core = self.md_core;
        let bdev_name = self.bdev_name.clone();
        let blocks = self.blocks_per_cluster;
        ferrite_reactor::spawn_local(async move {
            let c = base.submit_wait(ferrite_bdev::IoRequest::new(io.req.io_type, start, blocks)).await;
            if !c.status.is_ok() {
                let status = c.status;
                drop(c);
                return io.complete(status);
            }
            drop(c);
            let rx = ferrite_reactor::engine()
                .run_async(md_core, move || release_on_md(blob, bdev_name, cluster, start, blocks));
            let _ = rx.await;
            io.complete(IoStatus::Success);
        })
        .detach();
    }
}

/// On the metadata reactor: releases `cluster` of `blob` (at base block `start`, `blocks` long)
/// and, in the background, frees it once the lvol's channels have drained what they had in
/// flight.
async fn release_on_md(blob: Blob, bdev_name: Arc<str>, cluster: u64, start: u64, blocks: u64) {
    let bs = blob.store();
    let released = match blob.release_cluster(cluster, start).await {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            ferrite_reactor::log_limited!(log::Level::Warn, "lvol {bdev_name}: cluster {cluster} not released: {e}");
            return;
        }
    };
    ferrite_reactor::spawn_local(async move {
        // Every request of the lvol that may have read the old map entry completes first; the
        // lock itself is let go at once.
        if let Some(b) = ferrite_bdev::lookup(&bdev_name) {
            drop(b.lock_lba_range(cluster * blocks, blocks).await);
        }
        bs.reclaim_cluster(released).await;
    })
    .detach();
}

/// The channel of an lvol's external snapshot bdev on this core.
struct ExtChannel {
    ch: IoChannel,
}

/// Zeroes a read's payload from byte `from` on (a zero-copy read of nothing gets a zeroed
/// buffer of ours).
fn fill_zeroes(io: &mut BdevIo, from: usize) {
    if io.req.bufs.is_empty() {
        let len = (io.req.num_blocks * io.block_size() as u64) as usize;
        let mut b = ferrite_reactor::alloc_buf(len);
        b.zero();
        io.req.bufs.push(b);
        return;
    }
    let mut at = 0;
    for b in io.req.bufs.iter_mut() {
        let l = b.len();
        if at + l > from {
            let start = from.saturating_sub(at);
            b[start..].fill(0);
        }
        at += l;
    }
}

/// The part of a read the external snapshot holds arrived: copied into the parent's payload,
/// the rest zeroed.
fn ext_read_done(mut parent: BdevIo, c: ferrite_bdev::Completed) {
    if !c.status.is_ok() {
        return parent.complete(c.status);
    }
    let data = &c.req.bufs[0];
    if parent.req.bufs.is_empty() {
        let len = (parent.req.num_blocks * parent.block_size() as u64) as usize;
        parent.req.bufs.push(ferrite_reactor::alloc_buf(len));
    }
    let mut at = 0;
    for b in parent.req.bufs.iter_mut() {
        if at >= data.len() {
            break;
        }
        let n = b.len().min(data.len() - at);
        b[..n].copy_from_slice(&data[at..at + n]);
        at += n;
    }
    let n = data.len();
    drop(c);
    fill_zeroes(&mut parent, n);
    parent.complete(IoStatus::Success);
}

impl BackendChannel for LvolChannel {
    fn lends_reads(&self) -> bool {
        self.lends
    }

    fn linear_base(&self) -> Option<(IoChannel, Arc<AtomicU64>)> {
        Some((self.base.clone(), self.blob.generation_counter()))
    }

    /// The whole lvol while its clusters lie back to back (a thick lvol, a thin one allocated
    /// in order) and it takes writes.
    fn linear_map(&mut self) -> Option<LinearMap> {
        self.refresh();
        let first = self.map.contiguous.filter(|_| !self.read_only)?;
        Some(LinearMap { shift: first, end: self.map.clusters * self.blocks_per_cluster })
    }

    fn submit(&mut self, mut io: BdevIo) {
        match io.req.io_type {
            IoType::Flush | IoType::Reset => {
                io.req.offset_blocks = 0;
                io.req.num_blocks = self.base_blocks;
                return self.base.forward(io);
            }
            IoType::Read | IoType::Write | IoType::Unmap | IoType::WriteZeroes => {}
            _ => return io.complete_deferred(IoStatus::Unsupported),
        }
        self.refresh();
        if self.read_only && io.req.io_type != IoType::Read {
            return io.complete_deferred(IoStatus::Failed(libc::EROFS));
        }
        let (cluster, within) = self.locate(io.req.offset_blocks);
        // The bdev layer splits at the cluster (the optimal I/O boundary), zero-copy reads too.
        debug_assert!(within + io.req.num_blocks <= self.blocks_per_cluster, "request crosses a cluster");
        if let Some(start) = self.map.start(cluster) {
            if self.releases(&io, cluster, within) {
                return self.release_after(io, cluster, start);
            }
            io.req.offset_blocks = start + within;
            return self.base.forward_moved(io);
        }
        let parent = if self.parents.is_empty() { None } else { self.in_parents(cluster) };
        match io.req.io_type {
            IoType::Read if parent.is_some() => {
                io.req.offset_blocks = parent.unwrap_or_default() + within;
                self.base.forward_moved(io)
            }
            IoType::Read if self.ext_root => self.ext_read(io, cluster, within),
            // The external snapshot has data everywhere: zeroes need a cluster of their own.
            IoType::WriteZeroes if self.ext_root => self.allocate_then_write(io, cluster, within),
            IoType::Read => {
                fill_zeroes(&mut io, 0);
                io.complete_deferred(IoStatus::Success)
            }
            // Unmap leaves what the cluster reads as; nothing allocated reads as zeroes already.
            IoType::Unmap => io.complete_deferred(IoStatus::Success),
            IoType::WriteZeroes if parent.is_none() => io.complete_deferred(IoStatus::Success),
            _ => self.allocate_then_write(io, cluster, within),
        }
    }
}

impl BdevBackend for LvolBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let base = self.dev.desc().channel()?;
        let blob = self.lvol.blob.clone();
        let gen = blob.map_generation();
        let mut maps = blob.maps();
        let map = OwnMap::new(maps.remove(0), self.blocks_per_cluster);
        let ext = match blob.root_external().and_then(|id| self.bs.external_source(&id)) {
            Some(d) => Some(ExtChannel { ch: d.desc().channel()? }),
            None => None,
        };
        Ok(Box::new(LvolChannel {
            ext_root: ext.is_some() && blob.root_external().is_some(),
            ext,
            lends: self.dev.desc().bdev().backend().zcopy(),
            base,
            map,
            parents: maps,
            read_only: blob.is_read_only(),
            thin: blob.is_thin(),
            bdev_name: self.lvol.bdev_name().into(),
            gen,
            blob,
            blocks_per_cluster: self.blocks_per_cluster,
            base_blocks: self.dev.num_blocks(),
            md_core: self.md_core,
        }))
    }

    fn zcopy(&self) -> bool {
        self.dev.desc().bdev().backend().zcopy()
    }

    fn driver_specific(&self) -> Value {
        let blob = &self.lvol.blob;
        let family = crate::lvs::family(&self.lvol);
        let mut v = json!({
            "lvol_store_uuid": self.lvs_uuid.to_string(),
            "base_bdev": self.base,
            "thin_provision": blob.is_thin(),
            "num_allocated_clusters": blob.allocated_clusters(),
            "snapshot": !family.clones.is_empty(),
            "clone": family.parent.is_some(),
            "esnap_clone": blob.external_id().is_some(),
        });
        if let Some(x) = crate::lvs::external_snapshot_name(&self.lvol) {
            v["external_snapshot_name"] = json!(x);
        }
        if let Some(p) = family.parent {
            v["base_snapshot"] = json!(p);
        }
        if !family.clones.is_empty() {
            v["clones"] = json!(family.clones);
        }
        json!({ "lvol": v })
    }

    fn config_entry(&self, _bdev: &Bdev) -> Option<Value> {
        // As in SPDK: lvols come back by examine of their base bdev, not from the config.
        None
    }
}

/// Registers the bdev of `lvol` (named by its UUID, aliased `lvs/lvol`).
pub fn register(lvs: &Arc<Lvstore>, lvol: &Arc<Lvol>) -> Result<Bdev, BdevError> {
    let g = lvs.bs.geometry();
    let dev = lvs.bs.dev().clone();
    let blocks_per_cluster = (g.cluster_size / g.io_unit_size) as u64;
    let lvs_name = lvs.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let name = lvol.name.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let base_limits = *dev.desc().bdev().limits();
    let mut io_types = if lvol.blob.is_read_only() { READ_ONLY_IO_TYPES } else { IO_TYPES };
    // Unmap and write zeroes go to the base: not offered where it cannot do them (an aio file
    // without fallocate), rather than failed as unsupported one request at a time.
    for t in [IoType::Unmap, IoType::WriteZeroes] {
        if !dev.desc().bdev().supports(t) {
            io_types = io_types.without(t);
        }
    }
    let props = BdevProps {
        name: lvol.bdev_name(),
        aliases: vec![format!("{lvs_name}/{name}")],
        uuid: Some(lvol.uuid),
        block_size: g.io_unit_size,
        num_blocks: lvol.blob.num_clusters() * blocks_per_cluster,
        product_name: "Logical Volume",
        module: MODULE,
        io_types,
        limits: Limits {
            physical_block_size: base_limits.physical_block_size,
            buf_align: base_limits.buf_align,
            seg_len_align: base_limits.seg_len_align,
            optimal_io_boundary: blocks_per_cluster as u32,
            split_on_optimal_io_boundary: true,
            // Unmaps free whole clusters only (a part of one reads as zeroes but stays
            // allocated).
            unmap_granularity: blocks_per_cluster as u32,
            write_cache: base_limits.write_cache,
            ..Limits::default()
        },
    };
    let backend = LvolBackend {
        bs: lvs.bs.clone(),
        lvol: lvol.clone(),
        lvs_uuid: lvs.uuid,
        base: lvs.base.clone(),
        blocks_per_cluster,
        md_core: lvs.bs.md_core(),
        dev,
    };
    ferrite_bdev::register(props, Arc::new(backend))
}
