//! Fan-out: one parent request carried out as several child requests, on any channels of any
//! bdevs of the submitting core, each child with its own status. The parent hears once, when
//! the last child is done, with every child's status in submission order (not only the first
//! failure), as RAID, a replicated volume, multi-range unmaps (NVMe Dataset Management, SCSI
//! UNMAP, virtio DISCARD) and the layer's own splitting need.
//!
//! Children carry byte ranges of the parent's scatter-gather list. The fan-out slices the list
//! itself, and that is what makes slicing safe: the parent's buffers stay inside the fan-out
//! until every child has completed and dropped its views, and children that write into the
//! parent's memory (reads) must take disjoint ranges (checked; a mirror's
//! writes may share ranges, their views are read-only).
//!
//! Costs, named: one shared state per parent (an `Rc`), and the status list spills to the heap
//! beyond eight children.

use crate::channel::{ChannelInner, IoChannel};
use crate::io::{BdevIo, Completed, Done, IoBufs, IoRequest, IoStatus};
use ferrite_reactor::IoBuf;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::ptr::NonNull;
use std::rc::Rc;

/// What a fan-out's parent gets back once every child is done.
#[derive(Debug)]
pub struct FanOutDone {
    /// Each child's status, in the order the children were submitted.
    pub statuses: SmallVec<[IoStatus; 8]>,
    /// The parent's scatter-gather list, handed back (for a parent made with
    /// [`FanOut::for_caller`]; empty for one made with [`FanOut::for_io`], whose request still
    /// holds its buffers).
    pub bufs: IoBufs,
}

impl FanOutDone {
    /// The first failed child's status, or success if every child succeeded (or there were
    /// none).
    pub fn first_failure(&self) -> IoStatus {
        self.statuses.iter().copied().find(|s| !s.is_ok()).unwrap_or(IoStatus::Success)
    }

    /// How many children succeeded.
    pub fn succeeded(&self) -> usize {
        self.statuses.iter().filter(|s| s.is_ok()).count()
    }
}

/// Receives the end of a fan-out made with [`FanOut::for_caller`] (a target's command).
/// Called on the submitting core, never from inside a submission.
pub trait FanOutCompleter {
    /// Every child of the fan-out made with `tag` is done.
    fn fan_out_done(&self, tag: u64, done: FanOutDone);
}

/// Who hears when the last child is done.
enum Parent {
    /// A module's own request: `then(parent, done)`, and the module completes the parent.
    Io(BdevIo, fn(BdevIo, FanOutDone)),
    /// A caller outside the layer, which lent the payload.
    Caller { done: Rc<dyn FanOutCompleter>, tag: u64, bufs: IoBufs },
    /// The layer's own split of a request that broke its module's limits: the parent completes
    /// with the first failure, and the children are accounted as the parent.
    Split(BdevIo),
}

impl Parent {
    fn mark_written(&mut self) {
        let bufs = match self {
            Parent::Io(io, _) | Parent::Split(io) => &mut io.req.bufs,
            Parent::Caller { bufs, .. } => bufs,
        };
        for b in bufs.iter_mut().filter(|b| !b.is_read_only()) {
            let _ = b.as_mut_ptr();
        }
    }

    fn bufs(&self) -> &IoBufs {
        match self {
            Parent::Io(io, _) | Parent::Split(io) => &io.req.bufs,
            Parent::Caller { bufs, .. } => bufs,
        }
    }
}

/// The state a fan-out's children share.
pub(crate) struct FanState {
    parent: RefCell<Option<Parent>>,
    statuses: RefCell<SmallVec<[IoStatus; 8]>>,
    /// Children submitted and not yet done.
    left: Cell<usize>,
    /// No more children will come (the `FanOut` handle is gone).
    sealed: Cell<bool>,
    /// A child was handed writable views (reads fill the parent's memory).
    wrote: Cell<bool>,
    /// The writable ranges handed out so far (not kept for the layer's own splits, whose plan
    /// cuts disjoint ranges): a new one must overlap none, so that no two children write the
    /// same bytes.
    written: RefCell<SmallVec<[Range<usize>; 4]>>,
    /// True for the layer's own split (its children are not accounted on their own).
    split: bool,
    /// A split's first failed child so far (lowest index; `u32::MAX`: none) and its result
    /// (an NVMe device's dword 0), which the parent completes with.
    first_failed: Cell<(u32, u64)>,
}

impl FanState {
    /// True for the layer's own split.
    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.split
    }

    /// Child `index` completed.
    pub(crate) fn child_done(&self, index: u32, mut child: Completed) {
        {
            let mut st = self.statuses.borrow_mut();
            debug_assert!(st[index as usize].is_ok(), "a child completes once");
            st[index as usize] = child.status;
        }
        if self.split && !child.status.is_ok() && index < self.first_failed.get().0 {
            self.first_failed.set((index, child.result));
        }
        // The child's segments are views into the parent's buffers: drop them first.
        child.req.bufs.clear();
        drop(child);
        let left = self.left.get();
        debug_assert!(left > 0, "a child completed that was not outstanding");
        self.left.set(left - 1);
        self.finish_if_done();
    }

    fn finish_if_done(&self) {
        if !self.sealed.get() || self.left.get() > 0 {
            return;
        }
        let Some(mut parent) = self.parent.borrow_mut().take() else { return };
        let statuses = std::mem::take(&mut *self.statuses.borrow_mut());
        if self.wrote.get() {
            // Read children wrote the parent's memory through views: its buffers no longer
            // count as known zeroes (`IoBuf::zero` would skip them).
            parent.mark_written();
        }
        match parent {
            Parent::Io(io, then) => then(io, FanOutDone { statuses, bufs: IoBufs::new() }),
            Parent::Caller { done, tag, bufs } => done.fan_out_done(tag, FanOutDone { statuses, bufs }),
            Parent::Split(mut io) => {
                let status = statuses.iter().copied().find(|s| !s.is_ok()).unwrap_or(IoStatus::Success);
                if !status.is_ok() {
                    io.result = self.first_failed.get().1;
                }
                io.complete(status)
            }
        }
    }
}

/// A parent request being fanned out. Submit its children with [`FanOut::submit`], then drop
/// the handle (or call [`FanOut::finish`]): the parent hears once every child is done. A
/// fan-out without children ends on the core's next loop turn.
pub struct FanOut(Rc<FanState>);

impl FanOut {
    fn new(parent: Parent, split: bool) -> Self {
        FanOut(Rc::new(FanState {
            parent: RefCell::new(Some(parent)),
            statuses: RefCell::new(SmallVec::new()),
            left: Cell::new(0),
            sealed: Cell::new(false),
            wrote: Cell::new(false),
            written: RefCell::new(SmallVec::new()),
            split,
            first_failed: Cell::new((u32::MAX, 0)),
        }))
    }

    /// Fans out a module's own request (a RAID or replicated bdev's): children slice
    /// `parent.req.bufs`, and `then(parent, done)` runs once they are all done; the module
    /// completes the parent from there.
    pub fn for_io(parent: BdevIo, then: fn(BdevIo, FanOutDone)) -> Self {
        Self::new(Parent::Io(parent, then), false)
    }

    /// Fans out a caller's command (a target's): children slice `bufs`, which come back in
    /// [`FanOutDone::bufs`] when `done.fan_out_done(tag, ..)` runs.
    pub fn for_caller(bufs: IoBufs, done: Rc<dyn FanOutCompleter>, tag: u64) -> Self {
        Self::new(Parent::Caller { done, tag, bufs }, false)
    }

    /// The layer's own split of `parent`.
    pub(crate) fn for_split(parent: BdevIo) -> Self {
        Self::new(Parent::Split(parent), true)
    }

    /// Length in bytes of the parent's scatter-gather list.
    pub fn payload_len(&self) -> usize {
        self.0.parent.borrow().as_ref().map_or(0, |p| p.bufs().iter().map(|b| b.len()).sum())
    }

    /// How many children were submitted.
    pub fn children(&self) -> usize {
        self.0.statuses.borrow().len()
    }

    /// Submits child `req` on `ch` (any bdev's channel on this core), carrying bytes `payload`
    /// of the parent's scatter-gather list as its own (an empty range for a request without
    /// payload; `req.bufs` must be empty). Returns the child's index in
    /// [`FanOutDone::statuses`].
    ///
    /// # Panics
    /// If `payload` lies beyond the parent's list, `req` brings buffers of its own, or a read's
    /// range overlaps an earlier read child's (two children would write the same bytes).
    pub fn submit(&self, ch: &IoChannel, req: IoRequest, payload: Range<usize>) -> usize {
        let (io, index) = self.child(ch.inner(), req, payload, 0);
        ch.submit_io(io);
        index
    }

    /// Builds child `req` with `payload` sliced into pieces of at most `max_piece` bytes
    /// (0: no limit); the caller dispatches it.
    pub(crate) fn child(
        &self,
        ch: &Rc<ChannelInner>,
        mut req: IoRequest,
        payload: Range<usize>,
        max_piece: usize,
    ) -> (BdevIo, usize) {
        assert!(req.bufs.is_empty(), "a fan-out child takes its payload from the parent");
        let st = &*self.0;
        debug_assert!(!st.sealed.get(), "children come before the fan-out is sealed");
        if !payload.is_empty() {
            let writable = req.io_type == crate::io::IoType::Read;
            if writable {
                if !st.split {
                    let mut w = st.written.borrow_mut();
                    let overlaps = w.iter().any(|r| r.start < payload.end && payload.start < r.end);
                    assert!(!overlaps, "fan-out reads must take disjoint ranges: {payload:?} overlaps an earlier one");
                    w.push(payload.clone());
                }
                st.wrote.set(true);
            }
            let parent = st.parent.borrow();
            let bufs = parent.as_ref().expect("children come before the parent completes").bufs();
            slice(bufs, payload, writable, max_piece, &mut req.bufs);
        }
        let index = {
            let mut s = st.statuses.borrow_mut();
            s.push(IoStatus::Success);
            s.len() - 1
        };
        st.left.set(st.left.get() + 1);
        // A split's children are the parent's own blocks: what let the parent past the range
        // locks (a compare-and-write's own write) lets them past too, when they are checked
        // again (a retry after NoMem).
        let (tick, lock_bypass) = match &*st.parent.borrow() {
            Some(Parent::Split(p)) => (p.submit_tick, p.lock_bypass),
            Some(Parent::Io(p, _)) => (p.submit_tick, false),
            _ => (crate::io::submit_tick(), false),
        };
        let mut io = BdevIo::new(req, ch.clone(), tick);
        io.lock_bypass = lock_bypass;
        io.done = Done::Fan(self.0.clone(), index as u32);
        (io, index)
    }

    /// Ends submission: the parent hears once the children submitted so far are done (on the
    /// next loop turn if there were none). Dropping the handle does the same.
    pub fn finish(self) {}
}

impl Drop for FanOut {
    fn drop(&mut self) {
        let st = self.0.clone();
        st.sealed.set(true);
        if st.left.get() == 0 {
            // Never inside the submitter's own call: the parent hears on the next loop turn.
            crate::io::defer_fn(Box::new(move || st.finish_if_done()));
        }
    }
}

/// Appends to `out` views of bytes `range` of `bufs`, cut at segment ends and every
/// `max_piece` bytes (0: no limit).
fn slice(bufs: &IoBufs, range: Range<usize>, writable: bool, max_piece: usize, out: &mut IoBufs) {
    let mut seg_start = 0usize;
    let mut pos = range.start;
    for seg in bufs.iter() {
        let seg_end = seg_start + seg.len();
        while pos < range.end && pos < seg_end {
            let mut take = range.end.min(seg_end) - pos;
            if max_piece > 0 {
                take = take.min(max_piece);
            }
            let off = pos - seg_start;
            // SAFETY: the range lies within the segment. The segment belongs to the fan-out's
            // parent, which the fan-out holds until every child has completed and dropped its
            // views (`FanState::child_done` clears them first). A writable view is made only
            // for a read child, whose range no other child's writable range overlaps, and only
            // of a segment that allows writing.
            let view = unsafe {
                IoBuf::view(
                    NonNull::new_unchecked(seg.as_ptr().add(off) as *mut u8),
                    take,
                    writable && !seg.is_read_only(),
                )
            };
            out.push(view);
            pos += take;
        }
        seg_start = seg_end;
        if pos >= range.end {
            break;
        }
    }
    assert!(pos >= range.end, "fan-out payload {range:?} beyond the parent's {seg_start} bytes");
}
