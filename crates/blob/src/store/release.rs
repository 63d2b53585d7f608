//! Giving a thin blob's clusters back (SPDK's cluster release on unmap): a whole cluster that a
//! thin blob unmaps, or fills with zeroes, is no longer the blob's, and the store may hand it to
//! any blob that needs one.
//!
//! In two steps, because other cores may still use the cluster:
//! 1. [`Blob::release_cluster`]: the metadata without the cluster goes to the device (copy-on-
//!    write, as every cluster change), then the blob's map entry is cleared and the topology
//!    generation moves. From here on no new request of the blob reaches the cluster: reads of
//!    it give zeroes, a write allocates a new one. The cluster is still marked used, in a list
//!    of clusters waiting to drain.
//! 2. [`Blobstore::reclaim_cluster`], once the application knows that every core finished the
//!    requests that could have read the old map entry (the lvol bdev quiesces its channels):
//!    the cluster is unmapped, as a delete unmaps, and only then is it free. A request in
//!    flight can therefore never write into a cluster another blob has taken.
//!
//! A crash between the steps leaves the cluster unreferenced; the load after it rebuilds the
//! masks from the metadata, so it is free again. An unload reclaims whatever still waits: no
//! blob is open then, so nothing can be in flight.
//!
//! Only where the blob reads the same afterwards: it is thin, and no ancestor or external
//! snapshot has the cluster (a clone's cluster stays: releasing it would show the snapshot's
//! data). A blob under a structural change or an operation (snapshot, inflate, resize) keeps
//! its clusters too, as SPDK skips the release while an operation holds the blob.

use super::blob::lock;
use super::{on_md_core, Blob, Blobstore, BsResult, Store};
use crate::format::blob::{Access, ClearMethod};
use crate::format::EXTENTS_PER_EP;

impl Blob {
    /// Releases cluster `index`, which starts at device block `start`, if the blob may give it
    /// back (see the module doc). Returns the device cluster, which waits for
    /// [`Blobstore::reclaim_cluster`] before it is free, or None if nothing changed (the
    /// cluster is not at `start` any more, or the blob keeps it). On the metadata reactor.
    pub async fn release_cluster(&self, index: u64, start: u64) -> BsResult<Option<u32>> {
        let s = self.0.store.clone();
        on_md_core(&s)?;
        if s.lock().ops.contains_key(&self.0.id) {
            return Ok(None);
        }
        if self.map().start(index) != Some(start)
            || self.ancestor_start(index).is_some()
            || self.root_external().is_some()
        {
            return Ok(None);
        }
        let cluster = (start / s.blocks_per_cluster) as u32;
        let clear;
        {
            let mut st = lock(&self.0.st);
            let md = &st.md;
            if st.exclusive
                || !md.is_thin_provisioned()
                || md.access() != Access::ReadWrite
                || md.clusters.get(index as usize) != Some(&cluster)
                || st.allocating.contains_key(&index)
            {
                return Ok(None);
            }
            clear = md.clear_method();
            // Registered as an allocation: a structural change (snapshot, resize) waits for it.
            st.allocating.insert(index, Vec::new());
            st.md.clusters[index as usize] = 0;
            st.dirty_eps.insert(index / EXTENTS_PER_EP);
        }
        let r = self.persist().await;
        let map = self.map();
        let wake = {
            let mut st = lock(&self.0.st);
            let waiters = st.allocating.remove(&index).unwrap_or_default();
            // The map entry stayed: an allocation of it was not possible meanwhile.
            debug_assert!(waiters.is_empty(), "an allocation waited for a cluster that was allocated");
            match &r {
                Ok(()) => {
                    let removed = map.remove(index, start);
                    debug_assert!(removed, "the map entry changed while its release was written");
                }
                // The device has the old metadata (or, after a crash, recovery decides): the
                // cluster stays the blob's, and the next persist writes it again.
                Err(_) => st.md.clusters[index as usize] = cluster,
            }
            if st.allocating.is_empty() {
                st.wake_exclusive()
            } else {
                Vec::new()
            }
        };
        for w in wake {
            w.send(());
        }
        r?;
        s.lock().draining.push((cluster, clear));
        s.bump_generation();
        Ok(Some(cluster))
    }
}

impl Store {
    /// Unmaps (unless its blob's clear method is none) and frees each cluster of `clusters`
    /// that still waits to drain; a cluster whose unmap fails stays used (leaked until the next
    /// recovery, never handed out with old data). A cluster leaves the draining list only when
    /// it is free: an unload that starts while another reclaim of it is unmapping reclaims it
    /// too (one more unmap) rather than writing masks that still mark it used. Whoever finishes
    /// first frees it; the other finds it gone.
    pub(crate) async fn reclaim(&self, clusters: &[u32]) {
        for &c in clusters {
            let clear = {
                let st = self.lock();
                let Some(&(_, clear)) = st.draining.iter().find(|&&(d, _)| d == c) else { continue };
                clear
            };
            let unmapped = if clear == ClearMethod::None {
                Ok(())
            } else {
                let at = self.cluster_block(c) * self.dev.block_size() as u64;
                self.dev.unmap(at, self.geo.cluster_size as u64).await
            };
            let mut st = self.lock();
            let Some(at) = st.draining.iter().position(|&(d, _)| d == c) else { continue };
            st.draining.swap_remove(at);
            match unmapped {
                Ok(()) => {
                    drop(st);
                    self.release_clusters(&[c]);
                }
                Err(e) => {
                    log::warn!("blobstore on {}: cluster {c} stays used: {e}", self.dev.desc().bdev().name())
                }
            }
        }
    }
}

impl Blobstore {
    /// Frees cluster `cluster` that [`Blob::release_cluster`] released, once no request in
    /// flight can still reach it: it is unmapped as its blob's clear method says, then free.
    /// Nothing if it does not wait (an unload reclaimed it). On the metadata reactor.
    pub async fn reclaim_cluster(&self, cluster: u32) {
        if on_md_core(&self.0).is_err() {
            debug_assert!(false, "reclaim off the metadata reactor");
            return;
        }
        self.0.reclaim(&[cluster]).await;
    }

    /// Clusters released by blobs that wait to drain before they are free.
    pub fn draining_clusters(&self) -> usize {
        self.0.lock().draining.len()
    }
}
