//! Range copy between two channels, window by window under a bdev's range locks: the loop of a
//! rebuild (a RAID member's, a replicated volume's child). Each window of `bdev` (the volume
//! whose writes must not race the copy) is locked with [`crate::Bdev::lock_lba_range`], read
//! from the source channel and written to the target channel, and unlocked: writes to the window
//! wait for its copy, writes elsewhere and every read go on. The caller lists the ranges to copy
//! (the whole volume for a full rebuild, the segments written meanwhile for a partial one), and
//! steers the copy through [`CopyControl`]: cancel, pause, progress, and a rate bound in MiB/s
//! that may change while the copy runs.

use crate::bdev::{Bdev, BdevError};
use crate::channel::IoChannel;
use crate::io::IoRequest;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a copy asks, before each window, of whoever steers it (from any thread).
pub trait Steer {
    /// True to stop before the next window.
    fn cancelled(&self) -> bool;
    /// True to wait before the next window.
    fn paused(&self) -> bool {
        false
    }
    /// Most MiB/s to copy (0: no bound).
    fn max_mb_sec(&self) -> u32;
    /// `blocks` more blocks were copied (`total` so far).
    fn progress(&self, blocks: u64, total: u64);
}

/// Steers a copy from any thread, and shows how far it is.
#[derive(Debug, Default)]
pub struct CopyControl {
    /// Set to stop the copy before its next window.
    pub cancel: AtomicBool,
    /// While set, the copy waits before its next window.
    pub paused: AtomicBool,
    /// Blocks copied so far.
    pub done: AtomicU64,
    /// Most MiB/s to copy (0: no bound); read before every window.
    pub max_mb_sec: AtomicU32,
}

impl Steer for CopyControl {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
    fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }
    fn max_mb_sec(&self) -> u32 {
        self.max_mb_sec.load(Ordering::Relaxed)
    }
    fn progress(&self, blocks: u64, _total: u64) {
        self.done.fetch_add(blocks, Ordering::Relaxed);
    }
}

impl CopyControl {
    /// A control with a rate bound of `max_mb_sec` MiB/s (0: none).
    pub fn with_rate(max_mb_sec: u32) -> Self {
        Self { max_mb_sec: AtomicU32::new(max_mb_sec), ..Self::default() }
    }
}

/// Where the copy reads and writes: channels of this core, and where block 0 of `bdev` lies
/// on each (a RAID member's data offset; 0 for a nexus child).
pub struct CopyEnds<'a> {
    /// Whose range locks the windows take (the volume being rebuilt).
    pub bdev: &'a Bdev,
    /// Read from.
    pub src: &'a IoChannel,
    /// Block of `src` that holds block 0 of `bdev`.
    pub src_offset: u64,
    /// Written to.
    pub dst: &'a IoChannel,
    /// Block of `dst` that holds block 0 of `bdev`.
    pub dst_offset: u64,
}

/// How a copy ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyEnd {
    /// Every range was copied.
    Done,
    /// Stopped by [`CopyControl::cancel`] before the end.
    Cancelled,
}

/// How long a paused copy sleeps between looks at its control.
const PAUSE_POLL: Duration = Duration::from_millis(20);

/// Copies `ranges` (blocks of `ends.bdev`, in order) from `ends.src` to `ends.dst`, in windows of
/// at most `window_blocks`, each under a range lock of `ends.bdev`. Progress goes to
/// `ctl`. A failed read or write ends the copy with an error naming the block.
pub async fn copy_ranges(
    ends: &CopyEnds<'_>,
    ranges: &[Range<u64>],
    window_blocks: u64,
    ctl: &dyn Steer,
) -> Result<CopyEnd, BdevError> {
    let bs = ends.bdev.block_size() as u64;
    let window = window_blocks.max(1);
    let mut buf = Some(ferrite_reactor::alloc_buf((window * bs) as usize));
    // The rate is measured from an anchor, moved after each pause and change of the bound.
    let mut anchor = (Instant::now(), 0u64, ctl.max_mb_sec());
    let mut copied = 0u64;
    for r in ranges {
        debug_assert!(r.start <= r.end && r.end <= ends.bdev.num_blocks(), "a copy range lies in the bdev");
        let mut off = r.start;
        while off < r.end {
            let Some(waited) = wait_while_paused(ctl).await else { return Ok(CopyEnd::Cancelled) };
            let rate = ctl.max_mb_sec();
            if rate != anchor.2 || waited {
                anchor = (Instant::now(), copied, rate);
            }
            let n = window.min(r.end - off);
            let lock = ends.bdev.lock_lba_range(off, n).await;
            let mut b = buf.take().unwrap_or_else(|| ferrite_reactor::alloc_buf((window * bs) as usize));
            b.set_len((n * bs) as usize);
            let mut c = ends.src.submit_wait(IoRequest::read(ends.src_offset + off, n, b)).await;
            if !c.status.is_ok() {
                return Err(BdevError::Errno(libc::EIO, format!("copy: read at block {off}: {}", c.status)));
            }
            let b = c.take_req().bufs.pop().expect("the read's buffer comes back");
            let mut c = ends.dst.submit_wait(IoRequest::write(ends.dst_offset + off, n, b)).await;
            if !c.status.is_ok() {
                return Err(BdevError::Errno(libc::EIO, format!("copy: write at block {off}: {}", c.status)));
            }
            buf = c.take_req().bufs.pop();
            drop(lock);
            off += n;
            copied += n;
            ctl.progress(n, copied);
            if rate > 0 {
                let bytes = ((copied - anchor.1) * bs) as f64;
                let due = Duration::from_secs_f64(bytes / (rate as f64 * 1048576.0));
                let spent = anchor.0.elapsed();
                if due > spent {
                    ferrite_reactor::sleep(due - spent).await;
                }
            }
        }
    }
    Ok(CopyEnd::Done)
}

/// Waits while the copy is paused: None if it was cancelled, else whether it waited.
async fn wait_while_paused(ctl: &dyn Steer) -> Option<bool> {
    let mut waited = false;
    loop {
        if ctl.cancelled() {
            return None;
        }
        if !ctl.paused() {
            return Some(waited);
        }
        waited = true;
        ferrite_reactor::sleep(PAUSE_POLL).await;
    }
}

/// Blocks in `ranges`.
pub fn blocks_in(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}
