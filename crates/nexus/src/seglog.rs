//! The log of segments written while a child was out of date (Mayastor's partial rebuild log):
//! a bitmap of fixed segments (1 MiB by default) of the nexus, one per nexus, shared by every
//! core. A write that a child misses marks its segments; when that child comes back, only the
//! marked segments are copied. Marking is a load, and a `fetch_or` only when a bit is still
//! clear, so a degraded nexus that keeps writing the same segments touches no shared line for
//! writing.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Default segment size, in bytes.
pub const SEGMENT_BYTES: u64 = 1 << 20;

/// A bitmap of the segments of a nexus.
pub struct SegmentLog {
    /// Blocks per segment.
    seg_blocks: u64,
    /// Blocks of the nexus.
    num_blocks: u64,
    bits: Box<[AtomicU64]>,
}

impl SegmentLog {
    /// A clear log of `num_blocks` blocks of `block_size` bytes, in segments of `seg_bytes`
    /// (rounded to whole blocks).
    pub fn new(num_blocks: u64, block_size: u32, seg_bytes: u64) -> Self {
        let seg_blocks = (seg_bytes / block_size as u64).max(1);
        let segs = num_blocks.div_ceil(seg_blocks);
        let bits = (0..segs.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Self { seg_blocks, num_blocks, bits }
    }

    /// Blocks per segment.
    pub fn segment_blocks(&self) -> u64 {
        self.seg_blocks
    }

    /// Marks the segments that blocks `[offset, offset + num)` touch.
    #[inline]
    pub fn mark(&self, offset: u64, num: u64) {
        if num == 0 {
            return;
        }
        let first = offset / self.seg_blocks;
        let last = (offset + num - 1).min(self.num_blocks.saturating_sub(1)) / self.seg_blocks;
        for s in first..=last {
            let (w, b) = ((s / 64) as usize, 1u64 << (s % 64));
            let Some(word) = self.bits.get(w) else { return };
            if word.load(Ordering::Relaxed) & b == 0 {
                word.fetch_or(b, Ordering::Relaxed);
            }
        }
    }

    /// Marks every segment `other` marks (same geometry).
    pub fn merge(&self, other: &SegmentLog) {
        for (w, o) in self.bits.iter().zip(other.bits.iter()) {
            let v = o.load(Ordering::SeqCst);
            if v != 0 {
                w.fetch_or(v, Ordering::SeqCst);
            }
        }
    }

    /// Clears every segment.
    pub fn clear(&self) {
        for w in self.bits.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Marked segments.
    pub fn count(&self) -> u64 {
        self.bits.iter().map(|w| w.load(Ordering::Relaxed).count_ones() as u64).sum()
    }

    /// The marked segments as block ranges, adjacent ones merged, clipped to the nexus.
    pub fn ranges(&self) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for (wi, w) in self.bits.iter().enumerate() {
            let mut v = w.load(Ordering::Acquire);
            while v != 0 {
                let bit = v.trailing_zeros() as u64;
                v &= v - 1;
                let s = wi as u64 * 64 + bit;
                let start = s * self.seg_blocks;
                let end = (start + self.seg_blocks).min(self.num_blocks);
                match out.last_mut() {
                    Some(r) if r.end == start => r.end = end,
                    _ => out.push(start..end),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_merge_into_ranges_and_clip_to_the_end() {
        // 10 MiB + 3 blocks of 512 bytes, 1 MiB segments (2048 blocks).
        let n = 10 * 2048 + 3;
        let log = SegmentLog::new(n, 512, SEGMENT_BYTES);
        assert_eq!(log.segment_blocks(), 2048);
        assert!(log.ranges().is_empty());
        log.mark(0, 1);
        log.mark(2047, 2); // segments 0 and 1
        log.mark(5 * 2048 + 7, 100);
        log.mark(n - 1, 1); // the short last segment
        log.mark(n - 1, 0);
        assert_eq!(log.count(), 4);
        assert_eq!(log.ranges(), vec![0..2 * 2048, 5 * 2048..6 * 2048, 10 * 2048..n]);
        log.clear();
        assert_eq!(log.count(), 0);
    }

    #[test]
    fn a_log_spans_many_words() {
        let log = SegmentLog::new(1000 * 8, 4096, 32 * 1024); // 1000 segments of 8 blocks
        for s in (0..1000).step_by(3) {
            log.mark(s * 8, 1);
        }
        assert_eq!(log.count(), 334);
        let r = log.ranges();
        assert_eq!(r.len(), 334);
        assert_eq!(r[333], 999 * 8..1000 * 8);
        log.mark(0, 8000);
        assert_eq!(log.ranges(), vec![0..8000]);
    }
}
