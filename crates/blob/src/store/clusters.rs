//! A blob's cluster map: for each of its clusters, the device block where the cluster starts,
//! or nothing (a thin blob's unallocated cluster, read from its parent or as zeroes).
//!
//! Read from every core without a lock (each entry is an atomic), changed only on the
//! blobstore's metadata reactor. An entry goes from unallocated to allocated once, and only
//! after the metadata that records it is on the device: a core that sees the block may write
//! there and acknowledge, and a later flush makes that write durable together with the
//! metadata that finds it. The map changes length (resize, snapshot) only while the blob's I/O is
//! frozen on every core. An entry changes back (a thin blob's cluster released by an unmap) at
//! any time, but the cluster it named stays out of the free pool until every core has finished
//! the requests that could have read the old entry (see `release.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

/// The per-cluster start blocks of one blob (0: unallocated; block 0 holds the super block, so
/// no data cluster starts there).
pub struct ClusterMap {
    starts: Box<[AtomicU64]>,
}

impl std::fmt::Debug for ClusterMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterMap {{ len: {}, allocated: {} }}", self.len(), self.allocated())
    }
}

/// Why a cluster could not be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The index is beyond the map.
    OutOfRange,
    /// The cluster is allocated already (at this block).
    Allocated(u64),
}

impl ClusterMap {
    /// A map of `len` clusters, all unallocated.
    pub fn new(len: usize) -> Self {
        Self { starts: (0..len).map(|_| AtomicU64::new(0)).collect() }
    }

    /// A map from start blocks (0: unallocated).
    pub fn from_starts(starts: &[u64]) -> Self {
        Self { starts: starts.iter().map(|&s| AtomicU64::new(s)).collect() }
    }

    /// Number of clusters.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True if the blob has no clusters.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Where cluster `index` starts, if it is allocated (None also beyond the end).
    #[inline]
    pub fn start(&self, index: u64) -> Option<u64> {
        let s = self.starts.get(usize::try_from(index).ok()?)?.load(Ordering::Acquire);
        (s != 0).then_some(s)
    }

    /// Records that cluster `index` starts at `start` (> 0). Metadata reactor only, after the
    /// metadata recording it is on the device.
    pub fn insert(&self, index: u64, start: u64) -> Result<(), InsertError> {
        assert!(start != 0, "no data cluster starts at block 0");
        let slot = usize::try_from(index).ok().and_then(|i| self.starts.get(i)).ok_or(InsertError::OutOfRange)?;
        slot.compare_exchange(0, start, Ordering::Release, Ordering::Acquire)
            .map(|_| ())
            .map_err(InsertError::Allocated)
    }

    /// Records that cluster `index`, allocated at `start`, is unallocated again (a thin blob's
    /// cluster released by an unmap). Metadata reactor only, after the metadata without it is
    /// on the device; false (and nothing changed) if the entry is not `start`.
    pub fn remove(&self, index: u64, start: u64) -> bool {
        debug_assert!(start != 0, "no data cluster starts at block 0");
        let Some(slot) = usize::try_from(index).ok().and_then(|i| self.starts.get(i)) else { return false };
        slot.compare_exchange(start, 0, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Number of allocated clusters.
    pub fn allocated(&self) -> usize {
        self.starts.iter().filter(|s| s.load(Ordering::Relaxed) != 0).count()
    }

    /// Every entry (0: unallocated), e.g. to serialize the metadata.
    pub fn starts(&self) -> Vec<u64> {
        self.starts.iter().map(|s| s.load(Ordering::Acquire)).collect()
    }

    /// Where cluster 0 starts, if every cluster is allocated and each starts `blocks_per_cluster`
    /// blocks after the one before (a thick blob on a fresh store): then cluster `i` starts at
    /// that block plus `i * blocks_per_cluster` for as long as this map is the blob's, since an
    /// entry, once allocated, only changes with a new map. One pass over the map.
    pub fn contiguous_start(&self, blocks_per_cluster: u64) -> Option<u64> {
        let first = self.start(0)?;
        let mut want = first;
        for s in self.starts.iter() {
            if s.load(Ordering::Acquire) != want {
                return None;
            }
            want = want.checked_add(blocks_per_cluster)?;
        }
        Some(first)
    }

    /// A map of `len` clusters with this one's entries (cut or padded with unallocated ones).
    /// For a resize, while the blob's I/O is frozen.
    pub fn resized(&self, len: usize) -> ClusterMap {
        let mut s = self.starts();
        s.resize(len, 0);
        ClusterMap::from_starts(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contiguous_start_needs_every_cluster_in_order() {
        assert_eq!(ClusterMap::from_starts(&[100, 108, 116]).contiguous_start(8), Some(100));
        assert_eq!(ClusterMap::from_starts(&[100, 116, 108]).contiguous_start(8), None, "out of order");
        assert_eq!(ClusterMap::from_starts(&[100, 0, 116]).contiguous_start(8), None, "a hole");
        assert_eq!(ClusterMap::from_starts(&[0, 108, 116]).contiguous_start(8), None, "cluster 0 unallocated");
        assert_eq!(ClusterMap::from_starts(&[]).contiguous_start(8), None, "no clusters");
        let m = ClusterMap::new(2);
        m.insert(0, 64).unwrap();
        assert_eq!(m.contiguous_start(8), None, "not yet all allocated");
        m.insert(1, 72).unwrap();
        assert_eq!(m.contiguous_start(8), Some(64));
    }

    #[test]
    fn an_entry_is_set_once() {
        let m = ClusterMap::new(4);
        assert_eq!(m.start(2), None);
        m.insert(2, 2048).unwrap();
        assert_eq!(m.start(2), Some(2048));
        assert_eq!(m.insert(2, 4096), Err(InsertError::Allocated(2048)));
        assert_eq!(m.insert(4, 4096), Err(InsertError::OutOfRange));
        assert_eq!(m.start(u64::MAX), None);
        assert_eq!(m.allocated(), 1);
        let r = m.resized(2);
        assert_eq!(r.starts(), vec![0, 0]);
        let r = m.resized(6);
        assert_eq!(r.starts(), vec![0, 0, 2048, 0, 0, 0]);
    }

    #[test]
    fn an_entry_is_removed_only_where_it_is() {
        let m = ClusterMap::new(4);
        m.insert(1, 512).unwrap();
        assert!(!m.remove(1, 1024), "another start");
        assert!(!m.remove(2, 512), "another cluster");
        assert!(!m.remove(9, 512), "beyond the map");
        assert!(m.remove(1, 512));
        assert_eq!(m.start(1), None);
        assert!(!m.remove(1, 512), "once");
        m.insert(1, 1024).unwrap();
        assert_eq!(m.start(1), Some(1024), "allocated again elsewhere");
    }
}
