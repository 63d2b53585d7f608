//! Per-core I/O channels: the hot path from a caller to a module.
//!
//! A channel is made lazily on the first core that asks for it and shared by every user of the
//! same bdev on that core. Submission checks each request (type, permission, range, payload
//! length) so that a bad request fails with a clear status and never reaches the module. Nothing
//! here allocates, locks or makes a syscall per I/O.

use crate::bdev::{BackendChannel, Bdev, BdevError, BdevShared};
use crate::io::{BdevIo, IoCompleter, IoRequest, IoStatus, IoType, IoTypes};
use crate::stats::{ChannelStats, IoStat};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct ChannelInner {
    pub(crate) block_size: u32,
    num_blocks: u64,
    io_types: IoTypes,
    bdev: Arc<BdevShared>,
    backend: RefCell<Box<dyn BackendChannel>>,
    /// The module lends its memory for zero-copy reads.
    lends_reads: bool,
    stats: Rc<ChannelStats>,
    /// Requests handed to the module and not yet completed.
    in_flight: Cell<u64>,
    /// Resets waiting for those requests to finish.
    resets: RefCell<Vec<BdevIo>>,
}

thread_local! {
    static CHANNELS: RefCell<HashMap<u64, Weak<ChannelInner>>> = RefCell::new(HashMap::new());
    static STATS: RefCell<HashMap<u64, Rc<ChannelStats>>> = RefCell::new(HashMap::new());
}

/// This core's handle for submitting I/O to one bdev.
#[derive(Clone)]
pub struct IoChannel {
    inner: Rc<ChannelInner>,
    write: bool,
}

impl IoChannel {
    pub(crate) fn get(bdev: &Bdev, write: bool) -> Result<IoChannel, BdevError> {
        let id = bdev.id();
        if let Some(inner) = CHANNELS.with(|c| c.borrow().get(&id).and_then(Weak::upgrade)) {
            return Ok(IoChannel { inner, write });
        }
        let backend = bdev.0.backend.create_channel()?;
        let stats = STATS.with(|s| s.borrow_mut().entry(id).or_default().clone());
        let inner = Rc::new(ChannelInner {
            block_size: bdev.block_size(),
            num_blocks: bdev.num_blocks(),
            io_types: bdev.0.io_types,
            bdev: bdev.0.clone(),
            lends_reads: backend.lends_reads(),
            backend: RefCell::new(backend),
            stats,
            in_flight: Cell::new(0),
            resets: RefCell::new(Vec::new()),
        });
        CHANNELS.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|_, w| w.strong_count() > 0);
            c.insert(id, Rc::downgrade(&inner));
        });
        Ok(IoChannel { inner, write })
    }

    /// Block size of the channel's bdev.
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// Block count of the channel's bdev.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.inner.num_blocks
    }

    /// Submits a request. `done.io_done(tag, ..)` runs later on this core, exactly once, with the
    /// request handed back; an invalid request completes with an error status without reaching
    /// the module.
    #[inline]
    pub fn submit(&self, mut req: IoRequest, done: Rc<dyn IoCompleter>, tag: u64) {
        let status = self.inner.check(&req, self.write);
        if status == IoStatus::Success && req.is_zcopy_read() && !self.inner.lends_reads {
            // The module cannot lend: a plain read into a pool buffer serves the caller the same.
            let len = req.num_blocks * self.inner.block_size as u64;
            req.bufs.push(ferrite_reactor::alloc_buf(len as usize));
        }
        let mut io =
            BdevIo { req, ch: self.inner.clone(), done, tag, submit_tick: crate::io::submit_tick(), counted: false };
        if status != IoStatus::Success {
            log::debug!("bdev {}: rejected {:?}: {status}", self.inner.bdev.name, io.req.io_type);
            io.complete_deferred(status);
            return;
        }
        if io.req.io_type == IoType::Reset {
            // A reset is handled here, not by the module: it completes once every request
            // submitted before it on this channel has completed.
            if self.inner.in_flight.get() == 0 {
                io.complete_deferred(IoStatus::Success);
            } else {
                self.inner.resets.borrow_mut().push(io);
            }
            return;
        }
        io.counted = true;
        self.inner.in_flight.set(self.inner.in_flight.get() + 1);
        self.inner.backend.borrow_mut().submit(io);
    }
}

impl ChannelInner {
    #[inline]
    fn check(&self, req: &IoRequest, write: bool) -> IoStatus {
        if self.bdev.removing.load(Ordering::Relaxed) {
            return IoStatus::Removed;
        }
        let t = req.io_type;
        if !self.io_types.contains(t) {
            return IoStatus::Unsupported;
        }
        if !write && matches!(t, IoType::Write | IoType::Unmap | IoType::WriteZeroes) {
            return IoStatus::Failed(libc::EBADF);
        }
        if t == IoType::Reset {
            return IoStatus::Success;
        }
        if req.num_blocks == 0 && t != IoType::Flush {
            return IoStatus::OutOfRange;
        }
        match req.offset_blocks.checked_add(req.num_blocks) {
            Some(end) if end <= self.num_blocks => {}
            _ => return IoStatus::OutOfRange,
        }
        if t.has_payload() && !req.is_zcopy_read() {
            let mut total = 0u64;
            for b in &req.bufs {
                if b.len() % 512 != 0 {
                    return IoStatus::Misaligned;
                }
                total += b.len() as u64;
            }
            if Some(total) != req.num_blocks.checked_mul(self.block_size as u64) {
                return IoStatus::Misaligned;
            }
        }
        IoStatus::Success
    }

    /// Notes that a counted request completed; releases resets waiting for the channel to drain.
    #[inline]
    pub(crate) fn finished(&self) {
        let n = self.in_flight.get() - 1;
        self.in_flight.set(n);
        if n == 0 && !self.resets.borrow().is_empty() {
            for reset in std::mem::take(&mut *self.resets.borrow_mut()) {
                reset.complete_deferred(IoStatus::Success);
            }
        }
    }

    #[inline]
    pub(crate) fn account(&self, req: &IoRequest, status: IoStatus, latency_ticks: u64) {
        // Saturating: a rejected request may carry any block count.
        self.stats.record(req.io_type, req.num_blocks.saturating_mul(self.block_size as u64), status, latency_ticks);
    }
}

/// This core's statistics for the bdev with internal id `id` (zero if never used here).
pub fn local_iostat(id: u64) -> IoStat {
    STATS.with(|s| s.borrow().get(&id).map(|c| c.snapshot()).unwrap_or_default())
}

/// Forgets this core's statistics of bdevs that are no longer registered.
pub fn prune_local_iostat(live: &[u64]) {
    STATS.with(|s| s.borrow_mut().retain(|id, _| live.contains(id)));
}

/// Completion slot of [`IoChannel::submit_wait`].
#[derive(Default)]
struct WaitSlot {
    done: RefCell<Option<crate::io::Completed>>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl IoCompleter for WaitSlot {
    fn io_done(&self, _tag: u64, io: crate::io::Completed) {
        *self.done.borrow_mut() = Some(io);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

impl IoChannel {
    /// Submits one request and waits for it (for control paths and adapters such as FUSE;
    /// allocates a small completion slot per call, so not for the hot path of a target).
    pub async fn submit_wait(&self, req: IoRequest) -> crate::io::Completed {
        let slot = Rc::new(WaitSlot::default());
        self.submit(req, slot.clone(), 0);
        std::future::poll_fn(|cx| match slot.done.borrow_mut().take() {
            Some(c) => std::task::Poll::Ready(c),
            None => {
                *slot.waker.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        })
        .await
    }
}
