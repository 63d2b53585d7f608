//! Snapshots and clones, as SPDK's blobstore makes them, in its format and with its recovery.
//!
//! - A snapshot of blob A is a new blob S that takes A's clusters (and its extent pages and
//!   parent): A becomes a thin clone of S with no cluster of its own, so S holds A's data as it
//!   was and A's next writes copy a cluster from S first. The steps (each a metadata write):
//!   S is created thin and empty with the internal xattr `SNAPTMP` = A; S takes A's clusters;
//!   A takes S as parent and gives up its clusters; S loses `SNAPTMP` and becomes read-only.
//! - A clone of a read-only blob is a thin blob whose `SNAP` internal xattr names it.
//! - Deleting a snapshot with one clone first hands the clone the clusters it lacks (`SNAPRM`
//!   on the snapshot while that happens), then the clone's parent becomes the snapshot's.
//! - Inflate allocates every cluster a blob lacks (copying its ancestors' data) and drops the
//!   parent; decouple copies only what the parent itself holds and takes the grandparent.
//!
//! Recovery ([`recover_interrupted`]): a blob with `SNAPTMP` or `SNAPRM` after a crash is kept
//! (as a finished snapshot) if the other blob already names it as parent, and otherwise
//! deleted without the clusters and extent pages the other blob holds.

use super::blob::{lock, map_of, remove_internal, set_internal, Keep};
use super::ClusterMap;
use super::{Blob, BlobOp, BlobOpts, Blobstore, BsError, BsResult};
use crate::format::blob::{Parent, FLAG_EXTERNAL_SNAPSHOT, FLAG_READ_ONLY, FLAG_THIN_PROV};
use crate::format::{
    BlobMd, XATTR_EXTERNAL_SNAPSHOT_ID, XATTR_SNAPSHOT, XATTR_SNAPSHOT_IN_PROGRESS, XATTR_SNAPSHOT_PENDING_REMOVAL,
};

fn id_bytes(id: u64) -> Vec<u8> {
    id.to_le_bytes().to_vec()
}

fn id_of(v: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(v.try_into().ok()?))
}

/// The external snapshot id of `md`, if it is an esnap clone.
fn external_of(md: &BlobMd) -> Option<Vec<u8>> {
    match md.parent() {
        Ok(Some(Parent::External(id))) => Some(id),
        _ => None,
    }
}

/// Makes `md` a clone of external snapshot `id` (the flag and the `EXTSNAP` xattr), or, with
/// None, not one.
fn set_external(md: &mut BlobMd, id: Option<Vec<u8>>) {
    match id {
        Some(id) => {
            set_internal(md, XATTR_EXTERNAL_SNAPSHOT_ID, id);
            md.invalid_flags |= FLAG_EXTERNAL_SNAPSHOT;
        }
        None => {
            remove_internal(md, XATTR_EXTERNAL_SNAPSHOT_ID);
            md.invalid_flags &= !FLAG_EXTERNAL_SNAPSHOT;
        }
    }
}

/// Sets (or, with None, removes) `md`'s parent snapshot xattr.
fn set_parent_xattr(md: &mut BlobMd, parent: Option<u64>) {
    match parent {
        Some(p) => set_internal(md, XATTR_SNAPSHOT, id_bytes(p)),
        None => remove_internal(md, XATTR_SNAPSHOT),
    }
}

/// A snapshot made by [`Blobstore::prepare_snapshot`] and not yet committed or aborted: its
/// blob id, and the hold on the original that keeps other operations (another snapshot, a
/// resize, a delete) away from it until the snapshot is committed or given up. Dropped
/// without either, the snapshot blob stays, marked `SNAPTMP`, until the next load drops it.
#[derive(Debug)]
pub struct PreparedSnapshot {
    id: u64,
    _op: BlobOp,
}

impl PreparedSnapshot {
    /// The snapshot blob's id.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Blobstore {
    /// First step of a snapshot of `orig` (writable): holds `orig` (EBUSY if another operation
    /// does) and creates the snapshot blob, thin and empty, with `xattrs` and the `SNAPTMP`
    /// mark, for [`Blobstore::commit_snapshot`] (or [`Blobstore::abort_snapshot`]).
    pub async fn prepare_snapshot(&self, orig: &Blob, xattrs: Vec<(String, Vec<u8>)>) -> BsResult<PreparedSnapshot> {
        self.check()?;
        let op = self.reserve(orig.id(), "snapshot")?;
        if orig.is_read_only() {
            return Err(BsError::Invalid(format!("blob {:#x} is read-only: no snapshot of it", orig.id())));
        }
        let md = orig.md();
        let opts = BlobOpts {
            num_clusters: md.num_clusters,
            thin: true,
            xattrs,
            rle_extents: !md.uses_extent_table(),
            clear_method: Some(md.clear_method()),
            external_parent: None,
        };
        let id = self.create_blob_with(&opts, &[(XATTR_SNAPSHOT_IN_PROGRESS, id_bytes(orig.id()))]).await?;
        Ok(PreparedSnapshot { id, _op: op })
    }

    /// Gives up a prepared snapshot (nothing refers to it yet).
    pub async fn abort_snapshot(&self, snap: PreparedSnapshot) -> BsResult<()> {
        self.delete_keeping(snap.id, &Keep::default()).await
    }

    /// Makes prepared snapshot `snap` of `orig`: the snapshot takes `orig`'s clusters and
    /// `orig` becomes its thin clone. The caller keeps writes to `orig` away meanwhile (reads
    /// may go on: the data stays where it is). Returns the snapshot, open and read-only. If it
    /// fails, the prepared snapshot is deleted (or, if even that fails, left for the next load
    /// to drop: it is still marked `SNAPTMP`).
    pub async fn commit_snapshot(&self, orig: &Blob, snap: PreparedSnapshot) -> BsResult<Blob> {
        let s = self.check()?.clone();
        let opened = if snap._op.id() == orig.id() {
            self.open_blob(snap.id).await
        } else {
            Err(BsError::Invalid(format!("snapshot {:#x} was not prepared for blob {:#x}", snap.id, orig.id())))
        };
        let sb = match opened {
            Ok(sb) => sb,
            Err(e) => {
                self.discard_snapshot(snap.id, &Keep::default()).await;
                return Err(e);
            }
        };
        orig.exclusive().await;
        let r = self.commit_held(orig, &sb).await;
        orig.end_exclusive();
        s.bump_generation();
        if let Err(e) = r {
            drop(sb);
            // Nothing durable names the snapshot as parent: it goes, without the clusters
            // and extent pages that are still `orig`'s.
            let md = orig.md();
            let keep = Keep {
                clusters: md.clusters.iter().copied().filter(|&c| c != 0).collect(),
                pages: md.extent_table.iter().flatten().copied().filter(|&p| p != 0).collect(),
            };
            self.discard_snapshot(snap.id, &keep).await;
            return Err(e);
        }
        Ok(sb)
    }

    /// Deletes snapshot blob `id` whose commit failed, without what `keep` lists (still the
    /// original's); if even that fails, the next load drops it (it is marked `SNAPTMP`).
    async fn discard_snapshot(&self, id: u64, keep: &Keep) {
        if let Err(e) = self.delete_keeping(id, keep).await {
            log::warn!("blobstore: snapshot {id:#x} that failed stays until the next load: {e}");
        }
    }

    async fn commit_held(&self, orig: &Blob, sb: &Blob) -> BsResult<()> {
        let s = self.check()?.clone();
        if orig.is_read_only() {
            return Err(BsError::Invalid(format!("blob {:#x} is read-only: no snapshot of it", orig.id())));
        }
        // 1. The snapshot takes the clusters, extent pages, parent and size (still marked).
        let (omd, oparent) = {
            let st = lock(&orig.0.st);
            (st.md.clone(), st.parent.clone())
        };
        {
            let mut st = lock(&sb.0.st);
            st.md.num_clusters = omd.num_clusters;
            st.md.clusters = omd.clusters.clone();
            st.md.extent_table = omd.extent_table.clone();
            st.md.invalid_flags |= FLAG_THIN_PROV;
            set_parent_xattr(&mut st.md, oparent.as_ref().map(|p| p.id()));
            set_external(&mut st.md, external_of(&omd));
            st.parent = oparent.clone();
            st.dirty_eps.clear();
            st.chain_dirty = true;
        }
        sb.set_map(map_of(&omd, s.blocks_per_cluster));
        if let Err(e) = sb.persist().await {
            let mut st = lock(&sb.0.st);
            st.md.clusters.iter_mut().for_each(|c| *c = 0);
            if let Some(t) = st.md.extent_table.as_mut() {
                t.iter_mut().for_each(|p| *p = 0);
            }
            return Err(e);
        }
        // 2. The original gives them up and names the snapshot as its parent.
        {
            let mut st = lock(&orig.0.st);
            st.md.clusters.iter_mut().for_each(|c| *c = 0);
            if let Some(t) = st.md.extent_table.as_mut() {
                t.iter_mut().for_each(|p| *p = 0);
            }
            st.md.invalid_flags |= FLAG_THIN_PROV;
            set_parent_xattr(&mut st.md, Some(sb.id()));
            set_external(&mut st.md, None);
            st.parent = Some(sb.clone());
            st.dirty_eps.clear();
            st.chain_dirty = true;
        }
        if let Err(e) = orig.persist().await {
            // Back as it was in memory; the device has the old chain (or, after a crash, the
            // recovery finds SNAPTMP and `orig` without the parent, and drops the snapshot).
            let mut st = lock(&orig.0.st);
            st.md.clusters = omd.clusters.clone();
            st.md.extent_table = omd.extent_table.clone();
            st.md.invalid_flags = omd.invalid_flags;
            st.md.internal_xattrs = omd.internal_xattrs.clone();
            st.parent = oparent;
            st.chain_dirty = true;
            drop(st);
            let mut st = lock(&sb.0.st);
            st.md.clusters.iter_mut().for_each(|c| *c = 0);
            if let Some(t) = st.md.extent_table.as_mut() {
                t.iter_mut().for_each(|p| *p = 0);
            }
            return Err(e);
        }
        orig.set_map(ClusterMap::new(omd.num_clusters as usize));
        {
            let mut st = s.lock();
            st.parents.insert(orig.id(), sb.id());
            match oparent {
                Some(p) => st.parents.insert(sb.id(), p.id()),
                None => st.parents.remove(&sb.id()),
            };
        }
        // 3. The snapshot is read-only from now on (in memory at once: nothing writes it);
        // its metadata says so after `finish_snapshot`.
        {
            let mut st = lock(&sb.0.st);
            remove_internal(&mut st.md, XATTR_SNAPSHOT_IN_PROGRESS);
            st.md.data_ro_flags |= FLAG_READ_ONLY;
            st.chain_dirty = true;
        }
        Ok(())
    }

    /// Last step of a snapshot, after [`Blobstore::commit_snapshot`] (writes to the original
    /// may go on meanwhile): the snapshot's metadata loses `SNAPTMP` and says read-only. The
    /// snapshot is made once the original names it: if this write fails, the next load
    /// finishes it.
    pub async fn finish_snapshot(&self, snap: &Blob) -> BsResult<()> {
        self.check()?;
        if let Err(e) = snap.persist().await {
            log::warn!(
                "blobstore: snapshot {:#x}: its last metadata write failed ({e}); the next load finishes it",
                snap.id()
            );
            return Err(e);
        }
        Ok(())
    }

    /// Creates a thin clone of read-only blob `parent` with `xattrs`; returns its id.
    pub async fn create_clone(&self, parent: &Blob, xattrs: Vec<(String, Vec<u8>)>) -> BsResult<u64> {
        let s = self.check()?.clone();
        if !parent.is_read_only() {
            return Err(BsError::Invalid(format!("blob {:#x} is not read-only: it cannot be cloned", parent.id())));
        }
        let _op = self.reserve(parent.id(), "clone")?;
        let md = parent.md();
        let opts = BlobOpts { num_clusters: md.num_clusters, thin: true, xattrs, ..Default::default() };
        let id = self.create_blob_with(&opts, &[(XATTR_SNAPSHOT, id_bytes(parent.id()))]).await?;
        s.lock().parents.insert(id, parent.id());
        Ok(id)
    }

    /// Deletes snapshot `snap`, handing its one clone `clone` the clusters the clone lacks.
    pub(crate) async fn delete_into_clone(&self, snap: u64, clone: u64) -> BsResult<()> {
        let s = self.check()?.clone();
        {
            // Open only as the parent of its clone (if that is open): nobody else reads it.
            let st = s.lock();
            let by_clone = st.open.get(&clone).is_some_and(|w| w.strong_count() > 0) as usize;
            if st.open.get(&snap).is_some_and(|w| w.strong_count() > by_clone) {
                return Err(BsError::Busy(format!("blob {snap:#x} is open")));
            }
        }
        let c = self.open_blob(clone).await?;
        let sb = c
            .parent()
            .filter(|p| p.id() == snap)
            .ok_or_else(|| BsError::Invalid(format!("blob {clone:#x} does not name {snap:#x} as parent")))?;
        // 1. Marked: a crash from here on is finished by the next load.
        {
            let mut st = lock(&sb.0.st);
            set_internal(&mut st.md, XATTR_SNAPSHOT_PENDING_REMOVAL, id_bytes(clone));
            st.chain_dirty = true;
        }
        sb.persist().await?;
        // 2. The clone takes the clusters it lacks, and the snapshot's parent.
        c.exclusive().await;
        let taken = async {
            let smd = sb.md();
            let grand = sb.parent();
            let mut taken = Vec::new();
            let before = c.md();
            {
                let mut st = lock(&c.0.st);
                let n = st.md.clusters.len().min(smd.clusters.len());
                for i in 0..n {
                    if st.md.clusters[i] == 0 && smd.clusters[i] != 0 {
                        st.md.clusters[i] = smd.clusters[i];
                        st.dirty_eps.insert(i as u64 / crate::format::EXTENTS_PER_EP);
                        taken.push((i as u64, smd.clusters[i]));
                    }
                }
                set_parent_xattr(&mut st.md, grand.as_ref().map(|g| g.id()));
                set_external(&mut st.md, external_of(&smd));
                st.parent = grand.clone();
                st.chain_dirty = true;
            }
            if let Err(e) = c.persist().await {
                let mut st = lock(&c.0.st);
                for &(i, _) in &taken {
                    st.md.clusters[i as usize] = 0;
                }
                st.md.internal_xattrs = before.internal_xattrs;
                st.md.invalid_flags = before.invalid_flags;
                st.parent = Some(sb.clone());
                st.chain_dirty = true;
                return Err(e);
            }
            let map = c.map();
            for &(i, cl) in &taken {
                let _ = map.insert(i, s.cluster_block(cl));
            }
            {
                let mut st = s.lock();
                match &grand {
                    Some(g) => st.parents.insert(clone, g.id()),
                    None => st.parents.remove(&clone),
                };
            }
            s.bump_generation();
            Ok(taken)
        }
        .await;
        c.end_exclusive();
        let taken = match taken {
            Ok(t) => t,
            Err(e) => {
                // Not handed over: the snapshot stays, unmarked again (if that write fails
                // too, the next load unmarks it: the clone still names it).
                {
                    let mut st = lock(&sb.0.st);
                    remove_internal(&mut st.md, XATTR_SNAPSHOT_PENDING_REMOVAL);
                    st.chain_dirty = true;
                }
                let _ = sb.persist().await;
                return Err(e);
            }
        };
        drop(sb);
        // 3. The snapshot goes, without what the clone took.
        let keep = Keep { clusters: taken.iter().map(|&(_, c)| c).collect(), pages: Default::default() };
        self.delete_keeping(snap, &keep).await
    }

    /// Makes read-only blob `parent` the parent of thin blob `blob` (SPDK's `set_parent`): its
    /// unallocated clusters read from `parent` from now on. Both have the same size; `parent`
    /// must not descend from `blob`.
    pub async fn set_parent(&self, blob: &Blob, parent: &Blob) -> BsResult<()> {
        self.check()?;
        if blob.id() == parent.id() {
            return Err(BsError::Invalid("a blob cannot be its own parent".into()));
        }
        if blob.parent_id() == Some(parent.id()) {
            return Err(BsError::Exists(format!("blob {:#x} is the parent of {:#x} already", parent.id(), blob.id())));
        }
        let _op = self.reserve(blob.id(), "set parent")?;
        let _op2 = self.reserve(parent.id(), "set parent of a clone")?;
        if !blob.is_thin() {
            return Err(BsError::Invalid(format!("blob {:#x} is not thin provisioned", blob.id())));
        }
        if !parent.is_read_only() {
            return Err(BsError::Invalid(format!("blob {:#x} is not read-only: it cannot be a parent", parent.id())));
        }
        if blob.num_clusters() != parent.num_clusters() {
            return Err(BsError::Invalid(format!(
                "blob {:#x} has {} clusters and {:#x} {}: a parent has the size of its clone",
                blob.id(),
                blob.num_clusters(),
                parent.id(),
                parent.num_clusters()
            )));
        }
        let mut p = Some(parent.clone());
        while let Some(x) = p {
            if x.id() == blob.id() {
                return Err(BsError::Invalid(format!("blob {:#x} descends from {:#x}", parent.id(), blob.id())));
            }
            p = x.parent();
        }
        blob.exclusive().await;
        let r = self.repoint(blob, Some(parent.clone()), None, false).await;
        blob.end_exclusive();
        r
    }

    /// Gives `blob` (its map held exclusively by the caller) a new parent snapshot and external
    /// snapshot (and, with `thick`, clears its thin flag), writes its metadata and tells the
    /// data path; on a failed write the blob is as it was.
    async fn repoint(&self, blob: &Blob, parent: Option<Blob>, external: Option<Vec<u8>>, thick: bool) -> BsResult<()> {
        let s = self.check()?.clone();
        let (before, old_parent) = (blob.md(), blob.parent());
        {
            let mut st = lock(&blob.0.st);
            if thick {
                st.md.invalid_flags &= !FLAG_THIN_PROV;
            }
            set_parent_xattr(&mut st.md, parent.as_ref().map(|p| p.id()));
            set_external(&mut st.md, external);
            st.parent = parent.clone();
            st.chain_dirty = true;
        }
        let r = blob.persist().await;
        if r.is_err() {
            let mut st = lock(&blob.0.st);
            st.md.invalid_flags = before.invalid_flags;
            st.md.internal_xattrs = before.internal_xattrs;
            st.parent = old_parent;
            st.chain_dirty = true;
        } else {
            let mut st = s.lock();
            match &parent {
                Some(p) => st.parents.insert(blob.id(), p.id()),
                None => st.parents.remove(&blob.id()),
            };
        }
        s.bump_generation();
        r
    }

    /// Allocates every cluster `blob` lacks (with its ancestors' data) and drops its parent;
    /// the blob is thick afterwards (SPDK's inflate).
    pub async fn inflate(&self, blob: &Blob) -> BsResult<()> {
        self.separate(blob, true).await
    }

    /// Allocates the clusters `blob`'s parent holds and it lacks, then takes the parent's
    /// parent as its own (SPDK's decouple parent).
    pub async fn decouple_parent(&self, blob: &Blob) -> BsResult<()> {
        if blob.parent().is_none() && blob.external_id().is_none() {
            return Err(BsError::Invalid(format!("blob {:#x} has no parent", blob.id())));
        }
        self.separate(blob, false).await
    }

    async fn separate(&self, blob: &Blob, all: bool) -> BsResult<()> {
        self.check()?;
        let _op = self.reserve(blob.id(), if all { "inflate" } else { "decouple" })?;
        if blob.is_read_only() {
            return Err(BsError::ReadOnly(blob.id()));
        }
        // Every cluster it will allocate is claimed first: without room it fails before it
        // changes anything (SPDK checks the free count up front), and thin blobs written
        // meanwhile cannot run it out of space halfway.
        let whole = all || blob.external_id().is_some();
        let need = lacking(blob, whole).len() as u64;
        let mut reserved = self.0.reserve_clusters(need).map_err(|_| {
            BsError::NoSpace(format!(
                "{} of blob {:#x} needs {need} clusters, {} free",
                if all { "inflate" } else { "decouple" },
                blob.id(),
                self.free_clusters()
            ))
        })?;
        loop {
            // An external snapshot as parent holds every cluster.
            let whole = all || blob.external_id().is_some();
            let wanted = lacking(blob, whole);
            if !wanted.is_empty() {
                for chunk in wanted.chunks(super::blob::ALLOC_BATCH) {
                    blob.allocate_many(chunk, Some(&mut reserved)).await?;
                }
                continue;
            }
            debug_assert!(reserved.len() <= need as usize);
            blob.exclusive().await;
            // A resize or a new parent cluster since the look above: go round again.
            let parent = blob.parent();
            let missing = !lacking(blob, whole).is_empty();
            if missing {
                blob.end_exclusive();
                continue;
            }
            let new_parent = if all { None } else { parent.as_ref().and_then(|p| p.parent()) };
            // Decoupled from a snapshot of an external snapshot: that one is the parent now.
            let new_external = if all { None } else { parent.as_ref().and_then(|p| p.external_id()) };
            let r = self.repoint(blob, new_parent, new_external, all).await;
            blob.end_exclusive();
            return r;
        }
    }
}

/// The clusters `blob` has not allocated that its parent holds (all of them, with `whole`).
fn lacking(blob: &Blob, whole: bool) -> Vec<u64> {
    let map = blob.map();
    let parent = blob.parent().map(|p| p.map());
    (0..map.len() as u64)
        .filter(|&i| map.start(i).is_none())
        .filter(|&i| whole || parent.as_ref().is_some_and(|p| p.start(i).is_some()))
        .collect()
}

/// At load: reads every blob's parent into the store's table and finishes snapshot
/// operations a crash interrupted (see the module doc).
pub(crate) async fn recover_interrupted(bs: &Blobstore) -> BsResult<()> {
    let s = bs.0.clone();
    let mut marked = Vec::new();
    for id in bs.blob_ids() {
        let md = match s.read_blob(id).await {
            Ok((md, chain)) => {
                s.lock().preread.insert(id, (md.clone(), chain));
                md
            }
            Err(e) => {
                log::warn!("blobstore: blob {id:#x} does not read: {e}");
                continue;
            }
        };
        if let Ok(Some(Parent::Snapshot(p))) = md.parent() {
            s.lock().parents.insert(id, p);
        }
        for x in [XATTR_SNAPSHOT_IN_PROGRESS, XATTR_SNAPSHOT_PENDING_REMOVAL] {
            if let Some(other) = md.internal_xattr(x).and_then(|v| id_of(&v.value)) {
                marked.push((id, x, other));
                break;
            }
        }
    }
    for (id, x, other) in marked {
        s.lock().preread.remove(&id);
        let omd = match s.read_blob(other).await {
            Ok((m, _)) => m,
            Err(e) => {
                log::warn!("blobstore: blob {id:#x} is marked {x} for blob {other:#x}, which does not read ({e}); left as it is");
                continue;
            }
        };
        // A step that fails leaves the blob as it is (logged): the load goes on, and the
        // checker or the next load sees it.
        let r = if matches!(omd.parent(), Ok(Some(Parent::Snapshot(p))) if p == id) {
            // The other blob names it: a finished snapshot.
            log::warn!("blobstore: finishing snapshot {id:#x} ({x} for {other:#x})");
            async {
                let b = bs.open_blob(id).await?;
                {
                    let mut st = lock(&b.0.st);
                    remove_internal(&mut st.md, XATTR_SNAPSHOT_IN_PROGRESS);
                    remove_internal(&mut st.md, XATTR_SNAPSHOT_PENDING_REMOVAL);
                    st.md.data_ro_flags |= FLAG_READ_ONLY;
                    st.chain_dirty = true;
                }
                b.persist().await
            }
            .await
        } else {
            log::warn!("blobstore: removing blob {id:#x} ({x} for {other:#x}, which does not name it)");
            let keep = Keep {
                clusters: omd.clusters.iter().copied().filter(|&c| c != 0).collect(),
                pages: omd.extent_table.iter().flatten().copied().filter(|&p| p != 0).collect(),
            };
            bs.delete_keeping(id, &keep).await
        };
        if let Err(e) = r {
            log::warn!("blobstore: blob {id:#x} ({x}) could not be finished: {e}");
        }
    }
    Ok(())
}
