//! One core's copy of a bdev's held ranges (see `range_lock`), kept in its channel and
//! changed only by messages, and the check every request makes against it: while no range is
//! held the check is one test of a plain flag in the channel (`ChannelInner::ranges_on`); with
//! ranges held, a scan of this short list, with no lock and no shared cache line.
//!
//! It also keeps this core's compare-and-write leases (see `compare`): the leases it owns, and
//! the compare-and-writes in progress under them, which this core's own writes wait for.

use crate::bdev::BdevShared;
use crate::channel::ChannelInner;
use crate::io::{BdevIo, IoType};
use crate::range_lock::{Kind, Range};
use std::cell::{Cell, RefCell};

/// A held range as a core knows it.
struct LocalRange {
    range: Range,
    /// This core asked the lease's owner to give it up (once).
    revoke_sent: Cell<bool>,
}

/// Where a compare-and-write lease of this core stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Requested from the table; compare-and-writes wait for it.
    Acquiring,
    /// Held on every core: compare-and-writes run under it without asking anyone.
    Held,
    /// Another core needs it: no new compare-and-write starts under it, and it is released
    /// once those in progress finish.
    Revoking,
}

/// A compare-and-write lease this core owns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) state: LeaseState,
    /// Compare-and-writes in progress under it.
    pub(crate) in_progress: u32,
    /// A revocation arrived while it was being acquired.
    pub(crate) revoke_asked: bool,
}

/// A channel's view of its bdev's range locks.
pub(crate) struct LocalLocks {
    ranges: RefCell<Vec<LocalRange>>,
    /// Compare-and-writes in progress on this core: `[start, end)`.
    caws: RefCell<Vec<(u64, u64)>>,
    pub(crate) leases: RefCell<Vec<Lease>>,
    /// The channel epoch of the latest write of this core that passed one of its leases (it
    /// may overlap a compare-and-write that starts later): a compare-and-write waits for it
    /// to drain, and starts at once while there is none (`ChannelInner::caw_may_start`).
    pub(crate) own_write_epoch: Cell<Option<u64>>,
    /// `[lo, hi)` covers every range and compare-and-write here (empty: `lo > hi`): a
    /// request outside it passes with two compares (`held_back`).
    lo: Cell<u64>,
    hi: Cell<u64>,
    bdev: std::sync::Weak<BdevShared>,
}

impl LocalLocks {
    /// A new channel's copy: what the table holds now (its later changes come by message).
    pub(crate) fn new(bdev: &std::sync::Arc<BdevShared>) -> Self {
        let ranges = bdev
            .locks
            .lock()
            .unwrap()
            .held_ranges()
            .map(|range| LocalRange { range, revoke_sent: Cell::new(false) })
            .collect();
        let l = Self {
            ranges: RefCell::new(ranges),
            caws: RefCell::new(Vec::new()),
            leases: RefCell::new(Vec::new()),
            own_write_epoch: Cell::new(None),
            lo: Cell::new(u64::MAX),
            hi: Cell::new(0),
            bdev: std::sync::Arc::downgrade(bdev),
        };
        l.reshape();
        l
    }

    /// Sets `[lo, hi)` to the smallest span over every range and compare-and-write here.
    fn reshape(&self) {
        let (mut lo, mut hi) = (u64::MAX, 0);
        for (s, e) in
            self.ranges.borrow().iter().map(|l| (l.range.start, l.range.end)).chain(self.caws.borrow().iter().copied())
        {
            (lo, hi) = (lo.min(s), hi.max(e));
        }
        self.lo.set(lo);
        self.hi.set(hi);
    }

    /// True if anything may hold a request back (the channel's `ranges_on`).
    pub(crate) fn any(&self) -> bool {
        !self.ranges.borrow().is_empty() || !self.caws.borrow().is_empty()
    }

    /// Installs `r` (once).
    pub(crate) fn install(&self, ch: &ChannelInner, r: Range) {
        let mut ranges = self.ranges.borrow_mut();
        if !ranges.iter().any(|l| l.range.id == r.id) {
            ranges.push(LocalRange { range: r, revoke_sent: Cell::new(false) });
        }
        drop(ranges);
        self.reshape();
        ch.ranges_on.set(true);
    }

    /// Forgets range `id`.
    pub(crate) fn remove(&self, ch: &ChannelInner, id: u64) {
        self.ranges.borrow_mut().retain(|l| l.range.id != id);
        self.leases.borrow_mut().retain(|l| l.id != id);
        self.reshape();
        ch.ranges_on.set(self.any());
    }

    /// Notes a compare-and-write of `[start, end)` in progress here.
    pub(crate) fn caw_begins(&self, ch: &ChannelInner, start: u64, end: u64) {
        debug_assert!(!self.caw_overlaps(start, end), "overlapping compare-and-writes on one core");
        self.caws.borrow_mut().push((start, end));
        self.lo.set(self.lo.get().min(start));
        self.hi.set(self.hi.get().max(end));
        ch.ranges_on.set(true);
    }

    /// Notes the end of the compare-and-write of `[start, end)`.
    pub(crate) fn caw_ends(&self, ch: &ChannelInner, start: u64, end: u64) {
        let mut caws = self.caws.borrow_mut();
        let i = caws.iter().position(|&c| c == (start, end)).expect("a compare-and-write in progress");
        caws.swap_remove(i);
        let none = caws.is_empty();
        drop(caws);
        if none {
            // Otherwise the span stays as wide as it was: wider than needed, never narrower.
            self.reshape();
        }
        ch.ranges_on.set(self.any());
    }

    /// True if a compare-and-write in progress here shares a block with `[start, end)`.
    pub(crate) fn caw_overlaps(&self, start: u64, end: u64) -> bool {
        // Without an early exit: no branch per range (the pass is over up to a queue depth
        // of ranges), where the branches of `any` cost a compare-and-write 60 ns at QD 32.
        self.caws.borrow().iter().fold(false, |hit, &(s, e)| hit | ((s < end) & (start < e)))
    }

    /// True if `io` must wait: it reads a quiesced range, or changes a held one (an NVMe
    /// passthrough, whose blocks the layer does not decode, waits for any), as SPDK's
    /// `bdev_io_range_is_locked` decides. A write on the core that owns a lease waits only for
    /// that core's compare-and-writes in progress; one on another core asks the owner to give
    /// the lease up. `epoch` is the channel's current one (a write that passes goes to the
    /// module in it).
    #[inline]
    pub(crate) fn held_back(&self, io: &BdevIo, epoch: u64) -> bool {
        let r = &io.req;
        if r.io_type != IoType::NvmeIo
            && (r.offset_blocks >= self.hi.get() || r.offset_blocks.saturating_add(r.num_blocks) <= self.lo.get())
        {
            return false;
        }
        self.held_back_in_span(io, epoch)
    }

    /// `held_back` for a request within `[lo, hi)`.
    #[inline(never)]
    fn held_back_in_span(&self, io: &BdevIo, epoch: u64) -> bool {
        if io.lock_bypass {
            return false;
        }
        let t = io.req.io_type;
        let (start, end) = match t {
            // Its blocks are not decoded: it stands for every block.
            IoType::NvmeIo => (0, u64::MAX),
            _ => (io.req.offset_blocks, io.req.offset_blocks.saturating_add(io.req.num_blocks)),
        };
        let writes = t.writes() || t == IoType::NvmeIo;
        if writes && self.caw_overlaps(start, end) {
            return true;
        }
        let ranges = self.ranges.borrow();
        match t {
            IoType::Read | IoType::Compare => {
                ranges.iter().any(|l| l.range.kind == Kind::Quiesce && l.range.overlaps(start, end))
            }
            _ if writes => ranges.iter().filter(|l| l.range.overlaps(start, end)).any(|l| match l.range.kind {
                Kind::Lease { owner } if owner == ferrite_reactor::current().unwrap_or(usize::MAX) => {
                    self.own_write_epoch.set(Some(epoch));
                    false
                }
                Kind::Lease { owner } => {
                    if !l.revoke_sent.replace(true) {
                        if let Some(b) = self.bdev.upgrade() {
                            crate::compare::revoke(&b, owner, l.range.id);
                        }
                    }
                    true
                }
                _ => true,
            }),
            _ => false,
        }
    }

    /// This core's lease that covers `[start, end)`, if any; or else one that overlaps it.
    pub(crate) fn lease_for(&self, start: u64, end: u64) -> Option<Lease> {
        let leases = self.leases.borrow();
        leases
            .iter()
            .find(|l| l.start <= start && end <= l.end)
            .or_else(|| leases.iter().find(|l| l.start < end && start < l.end))
            .copied()
    }

    /// Changes this core's lease `id` with `f` (the one place a lease changes); None if it has
    /// none such.
    pub(crate) fn with_lease<T>(&self, id: u64, f: impl FnOnce(&mut Lease) -> T) -> Option<T> {
        let mut leases = self.leases.borrow_mut();
        let l = leases.iter_mut().find(|l| l.id == id)?;
        let out = f(l);
        debug_assert!(
            l.state != LeaseState::Acquiring || l.in_progress == 0,
            "no compare-and-write runs under a lease not yet held: {l:?}"
        );
        debug_assert!(
            l.in_progress as usize <= self.caws.borrow().len(),
            "more compare-and-writes under a lease than in progress on its core: {l:?}"
        );
        Some(out)
    }
}

impl Drop for LocalLocks {
    /// A channel that goes releases the leases it owns (no compare-and-write runs under them).
    fn drop(&mut self) {
        let Some(b) = self.bdev.upgrade() else { return };
        for l in self.leases.get_mut().drain(..) {
            crate::range_lock::release(&b, l.id, None);
        }
    }
}
