//! Per-core I/O channels: the hot path from a caller to a module.
//!
//! A channel is made lazily on the first core that asks for it and shared by every user of the
//! same bdev on that core. Submission checks each request (type, permission, range, payload
//! length) so that a bad request fails with a clear status and never reaches the module; fits it
//! to the module's limits (`fit`); queues it while the module or the layer is out of resources
//! (NoMem) and retries it when resources free; and holds resets until every request submitted
//! before them has completed. Nothing here allocates, locks or makes a syscall per I/O.

use crate::bdev::{BackendChannel, Bdev, BdevError, BdevShared, Limits};
use crate::io::{BdevIo, Completed, Done, IoAux, IoCompleter, IoRequest, IoStatus, IoType, IoTypes};
use crate::stats::{ChannelStats, IoStat};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a channel with nothing in flight waits before it retries requests that met NoMem.
const NOMEM_RETRY: Duration = Duration::from_micros(100);

/// In-flight requests counted by the epoch they were handed to the module in. A barrier (a reset)
/// opens a new epoch and waits only for the older ones to drain, so it cannot starve under a
/// steady stream of new requests. The current epoch's count is a plain cell, all that a request
/// touches while no barrier waits; closed epochs still draining sit in a queue.
struct Epochs {
    /// The epoch new requests join.
    current: Cell<u64>,
    /// Requests of `current` in flight.
    count: Cell<u64>,
    /// Closed epochs with requests still in flight, oldest first: (epoch, count > 0). Boxed:
    /// only barriers touch it, and inline it would push hot fields of the channel out of
    /// their cache lines.
    #[allow(clippy::box_collection)]
    closed: Box<RefCell<VecDeque<(u64, u64)>>>,
}

impl Epochs {
    fn new() -> Self {
        Self { current: Cell::new(0), count: Cell::new(0), closed: Box::new(RefCell::new(VecDeque::new())) }
    }

    #[inline]
    fn start(&self) -> u64 {
        self.count.set(self.count.get() + 1);
        self.current.get()
    }

    #[inline]
    fn finish(&self, epoch: u64) {
        if epoch == self.current.get() {
            debug_assert!(self.count.get() > 0, "epoch count underflow");
            self.count.set(self.count.get() - 1);
        } else {
            self.finish_closed(epoch);
        }
    }

    #[cold]
    fn finish_closed(&self, epoch: u64) {
        let mut closed = self.closed.borrow_mut();
        let i = closed.iter().position(|(e, _)| *e == epoch).expect("a closed epoch with requests in flight");
        closed[i].1 -= 1;
        if closed[i].1 == 0 {
            closed.remove(i);
        }
    }

    fn in_flight(&self) -> u64 {
        self.count.get() + self.closed.borrow().iter().map(|(_, n)| n).sum::<u64>()
    }

    /// Closes the current epoch; returns it. Everything in it and before it must drain first.
    fn open_barrier(&self) -> u64 {
        let e = self.current.get();
        if self.count.get() > 0 {
            self.closed.borrow_mut().push_back((e, self.count.get()));
        }
        self.current.set(e + 1);
        self.count.set(0);
        e
    }

    /// True once every request of `epoch` and earlier has completed.
    fn drained_through(&self, epoch: u64) -> bool {
        self.closed.borrow().front().is_none_or(|(e, _)| *e > epoch)
    }
}

/// A bdev's channel on one core. Laid out in declaration order, with the fields every read and
/// write touches first (two cache lines, with the `Rc`'s counts): under a data-heavy load each
/// request's copy sweeps the core's caches, so every further line the layer touches per
/// request is one more miss per layer, which a forwarding bdev (a passthru, an lvol) pays
/// twice. Spread over the struct as the compiler ordered it, they took seven lines.
#[repr(C)]
pub(crate) struct ChannelInner {
    pub(crate) block_size: u32,
    io_types: IoTypes,
    /// Reads and writes may need fitting to `limits`.
    shape_payload: bool,
    /// The boundary is the only limit that shapes payloads: a request within it needs no
    /// fitting, known without the general pass (an lvol's).
    boundary_only: bool,
    /// The module lends its memory for zero-copy reads.
    lends_reads: bool,
    /// Set whenever something is queued in `nomem` or `barriers`, cleared once a completion
    /// finds both empty: while it is clear, completions skip both queues.
    waiting: Cell<bool>,
    /// True while the bdev has QoS limits (see `qos`; tested on every read and write).
    pub(crate) qos_on: Cell<bool>,
    /// True while requests are tracked for a timeout (see `timeout`; tested on every
    /// submission).
    pub(crate) timeouts_on: Cell<bool>,
    /// True while this core knows of a held range lock or a compare-and-write in progress
    /// (see `local_locks`): while it is clear, no request looks at `locks`.
    pub(crate) ranges_on: Cell<bool>,
    epochs: Epochs,
    pub(crate) bdev: Arc<BdevShared>,
    stats: Rc<ChannelStats>,
    backend: RefCell<Box<dyn BackendChannel>>,
    /// Where the module forwards every request, unchanged (`BackendChannel::forwards_to`).
    pass_to: Option<IoChannel>,
    /// The module's linear mapping onto its base, which the layer applies itself
    /// (`BackendChannel::linear_base`).
    linear: Option<Box<Linear>>,
    /// The optimal I/O boundary requests are split at (0: none).
    split_boundary: u64,
    // The rest is touched only by requests that need fitting, queueing or a barrier.
    /// `limits.seg_masks()`, ready for the bounce check (no subtraction per request).
    pub(crate) seg_masks: (usize, usize),
    pub(crate) limits: Limits,
    /// Resets and drain waiters, each waiting for the requests handed to the module before it.
    barriers: RefCell<VecDeque<(u64, Barrier)>>,
    /// Requests waiting for a range lock or a compare-and-write, and compare-and-writes
    /// waiting for their turn or their lease (see `local_locks`, `compare`).
    pub(crate) locked: RefCell<VecDeque<BdevIo>>,
    /// This core's copy of the bdev's held ranges (see `local_locks`).
    pub(crate) locks: crate::local_locks::LocalLocks,
    /// Requests that met NoMem (from the module or the layer), in submission order.
    nomem: RefCell<VecDeque<BdevIo>>,
    nomem_timer: Cell<bool>,
    me: Weak<ChannelInner>,
    /// QoS limits and the requests waiting for them (see `qos`).
    pub(crate) qos: crate::qos::ChannelQos,
    /// Outstanding requests, tracked while a descriptor has a timeout (see `timeout`).
    pub(crate) timeouts: crate::timeout::ChannelTimeouts,
    /// The module's state its requests reach (`BackendChannel::shared`).
    pub(crate) shared: Option<Rc<dyn std::any::Any>>,
    /// Compare-and-writes go to the module as one request under the lease
    /// (`BackendChannel::compares_in_place`, and no limit would split them).
    pub(crate) caw_in_place: bool,
}

/// A module's linear mapping onto a base bdev as one channel last took it
/// (`BackendChannel::linear_map`): valid while `generation` reads `seen`.
struct Linear {
    base: IoChannel,
    generation: Arc<std::sync::atomic::AtomicU64>,
    seen: Cell<u64>,
    /// Added to the offset of a read or write that ends at or before `end`.
    shift: Cell<u64>,
    /// 0 while the module maps nothing linearly.
    end: Cell<u64>,
}

impl Linear {
    /// Made with the module's first answer, for a base of the channel's block size.
    fn new(backend: &mut dyn BackendChannel, block_size: u32) -> Option<Box<Linear>> {
        let (base, generation) = backend.linear_base().filter(|(base, _)| base.block_size() == block_size)?;
        let l = Box::new(Linear { base, generation, seen: Cell::new(0), shift: Cell::new(0), end: Cell::new(0) });
        l.retake(backend, l.generation.load(Ordering::Acquire));
        Some(l)
    }

    /// Takes the module's mapping again, as of generation `g` (read before the module looks).
    #[cold]
    #[inline(never)]
    fn retake(&self, backend: &mut dyn BackendChannel, g: u64) {
        let m = backend.linear_map();
        self.shift.set(m.map_or(0, |m| m.shift));
        self.end.set(m.map_or(0, |m| m.end));
        self.seen.set(g);
    }
}

/// What waits at an epoch barrier.
enum Barrier {
    /// A reset, handed to the module once its predecessors completed.
    Reset(BdevIo),
    /// A drain for a range lock (see `range_lock`).
    Call(Box<dyn FnOnce()>),
    /// A compare-and-write, started once this core's requests before it are done.
    Caw(BdevIo),
}

struct StatsEntry {
    stats: Rc<ChannelStats>,
    bdev: std::sync::Weak<BdevShared>,
}

ferrite_reactor::reactor_local! {
    /// This core's channel of each bdev, by bdev id.
    static CHANNELS: RefCell<HashMap<u64, Weak<ChannelInner>>> = RefCell::new(HashMap::new());
}

ferrite_reactor::reactor_local! {
    /// This core's I/O statistics of each bdev, by bdev id (they outlive the channels).
    static STATS: RefCell<HashMap<u64, StatsEntry>> = RefCell::new(HashMap::new());
}

ferrite_reactor::reactor_local! {
    /// The size of `STATS` after its last pruning: it is pruned again once it has doubled.
    static STATS_PRUNED_LEN: Cell<usize> = const { Cell::new(0) };
}

/// This core's counters of `bdev`, made if needed. Making one first drops the entries of
/// deleted bdevs once the map has doubled since that was last done, so creating and deleting
/// bdevs (with their histograms) does not grow the map without bound, at an amortized
/// constant cost per entry.
fn local_stats_entry(bdev: &Bdev) -> Rc<ChannelStats> {
    STATS.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(e) = s.get(&bdev.id()) {
            return e.stats.clone();
        }
        STATS_PRUNED_LEN.with(|pruned| {
            if s.len() >= 2 * pruned.get().max(32) {
                s.retain(|_, e| stats_entry_live(e));
                pruned.set(s.len());
            }
        });
        s.entry(bdev.id()).or_insert_with(|| new_stats_entry(bdev)).stats.clone()
    })
}

/// True while the entry's bdev exists and is not being deleted.
fn stats_entry_live(e: &StatsEntry) -> bool {
    e.bdev.upgrade().is_some_and(|b| !b.removing.load(Ordering::Relaxed))
}

/// This core's handle for submitting I/O to one bdev.
#[derive(Clone)]
pub struct IoChannel {
    inner: Rc<ChannelInner>,
    write: bool,
    /// The descriptor it was got from (for its timeout).
    desc: u64,
}

impl IoChannel {
    pub(crate) fn get(bdev: &Bdev, write: bool, desc: u64) -> Result<IoChannel, BdevError> {
        let id = bdev.id();
        if let Some(inner) = CHANNELS.with(|c| c.borrow().get(&id).and_then(Weak::upgrade)) {
            return Ok(IoChannel { inner, write, desc });
        }
        let mut backend = bdev.0.backend.create_channel()?;
        let stats = local_stats_entry(bdev);
        let limits = bdev.0.limits;
        let shared = backend.shared();
        let inner = Rc::new_cyclic(|me| ChannelInner {
            block_size: bdev.block_size(),
            io_types: bdev.module_io_types(),
            limits,
            seg_masks: limits.seg_masks(),
            shape_payload: limits.shape_payload(),
            split_boundary: limits.split_boundary(),
            boundary_only: limits.boundary_only(),
            bdev: bdev.0.clone(),
            lends_reads: backend.lends_reads(),
            caw_in_place: backend.compares_in_place() && !limits.shape_payload(),
            pass_to: backend.forwards_to().filter(|base| base.block_size() == bdev.block_size()),
            linear: Linear::new(&mut *backend, bdev.block_size()),
            backend: RefCell::new(backend),
            stats,
            epochs: Epochs::new(),
            barriers: RefCell::new(VecDeque::new()),
            locked: RefCell::new(VecDeque::new()),
            locks: crate::local_locks::LocalLocks::new(&bdev.0),
            nomem: RefCell::new(VecDeque::new()),
            waiting: Cell::new(false),
            qos_on: Cell::new(false),
            timeouts_on: Cell::new(false),
            ranges_on: Cell::new(false),
            nomem_timer: Cell::new(false),
            me: me.clone(),
            qos: crate::qos::ChannelQos::new(),
            timeouts: crate::timeout::ChannelTimeouts::new(),
            shared,
        });
        inner.ranges_on.set(inner.locks.any());
        crate::qos::apply(&inner);
        crate::timeout::channel_created(&inner);
        CHANNELS.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|_, w| w.strong_count() > 0);
            c.insert(id, Rc::downgrade(&inner));
        });
        Ok(IoChannel { inner, write, desc })
    }

    /// Block size of the channel's bdev.
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// Block count of the channel's bdev.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.inner.bdev.num_blocks.load(Ordering::Relaxed)
    }

    /// Submits a request. `done.io_done(tag, ..)` runs later on this core, exactly once, with the
    /// request handed back; an invalid request completes with an error status without reaching
    /// the module.
    #[inline]
    pub fn submit(&self, req: IoRequest, done: Rc<dyn IoCompleter>, tag: u64) {
        let mut io = BdevIo::new(req, self.inner.clone(), crate::io::submit_tick());
        io.done = Done::Caller(done, tag);
        if self.inner.timeouts_on.get() {
            crate::timeout::track(&self.inner, &mut io, self.desc);
        }
        self.inner.submit_stamped(io, self.write);
    }

    /// Requests of this core's channel of the bdev not completed yet: those with the module
    /// (each child of a split counts) and those waiting in the layer (for memory, a range
    /// lock, QoS or a reset). SPDK's `spdk_bdev_get_qd` samples the same per channel.
    pub fn queue_depth(&self) -> u64 {
        self.inner.queue_depth()
    }

    /// Calls `f` with each outstanding request of this core's channel of the bdev that is
    /// tracked (submitted while a descriptor of the bdev tracks them: [`BdevDesc::track_io`] or
    /// a timeout), as SPDK's `spdk_bdev_for_each_bdev_io` visits a channel's requests; returns
    /// how many. Act on one with an abort naming its tag.
    ///
    /// [`BdevDesc::track_io`]: crate::BdevDesc::track_io
    pub fn for_each_io(&self, f: &mut dyn FnMut(&crate::timeout::TimedOutIo)) -> usize {
        crate::timeout::for_each(&self.inner, f)
    }

    /// The channel's shared half.
    #[inline]
    pub(crate) fn inner(&self) -> &Rc<ChannelInner> {
        &self.inner
    }

    /// Submits a request built by the layer (a fan-out's child) whose `done` is set.
    #[inline]
    pub(crate) fn submit_io(&self, mut io: BdevIo) {
        if self.inner.timeouts_on.get() {
            crate::timeout::track(&self.inner, &mut io, self.desc);
        }
        self.inner.submit_stamped(io, self.write);
    }

    /// Submits a completed request again, as it now is (the caller changed its fields in place):
    /// no request is built or moved, the state goes straight back to the layer. For callers that
    /// resubmit from their completion (a benchmark job, a target's queue slot).
    #[inline]
    pub fn resubmit(&self, c: Completed, done: Rc<dyn IoCompleter>, tag: u64) {
        let mut io = BdevIo::reuse(c, self.inner.clone(), crate::io::submit_tick());
        io.done = Done::Caller(done, tag);
        self.inner.submit_stamped(io, self.write);
    }

    /// Forwards `parent` itself to this channel's bdev, as a passthru does (SPDK's passthru
    /// submits the same range and buffers on its base descriptor), and completes it with the
    /// status the base gives. The same state travels on, with the parent's per-trip fields set
    /// aside on its frame stack, so nothing is built, copied or taken from the cache. This
    /// channel checks, counts, fits and accounts it as a request of its own; when it completes,
    /// the parent's layer completes it in the same call (the module does not see it again).
    /// Both bdevs must have the same block size: the range is the parent's.
    #[inline]
    pub fn forward(&self, parent: BdevIo) {
        let io = BdevIo::forwarding(parent, None, self.inner.clone());
        self.inner.submit_checked(io, self.write, true);
    }

    /// As [`IoChannel::forward`], for a module that moved only the request's offset (a
    /// mapping such as an lvol's): the payload its own layer checked is not checked again.
    #[inline(always)]
    pub fn forward_moved(&self, parent: BdevIo) {
        debug_assert_eq!(parent.block_size(), self.inner.block_size, "forwarded between block sizes");
        let io = BdevIo::forwarding(parent, None, self.inner.clone());
        self.inner.submit_forwarded(io, self.write);
    }

    /// As [`IoChannel::forward`], but when this channel completes the request,
    /// `then(parent, status)` runs with the parent's fields and context back, and completes
    /// the parent (with that status or another, now or later). A virtual bdev that maps ranges
    /// changes `parent.req.offset_blocks` before forwarding and back in `then`.
    #[inline]
    pub fn forward_then(&self, parent: BdevIo, then: fn(BdevIo, IoStatus)) {
        let io = BdevIo::forwarding(parent, Some(then), self.inner.clone());
        self.inner.submit_checked(io, self.write, true);
    }

    /// Submits `req` on behalf of `parent` (a request of a virtual bdev's own): when it
    /// completes, `then(parent, completed)` runs on this core, and the virtual bdev completes
    /// the parent from there. No table keyed by tag is needed: the child carries its parent.
    #[inline]
    pub fn submit_child(&self, parent: BdevIo, req: IoRequest, then: fn(BdevIo, Completed)) {
        let mut io = BdevIo::new(req, self.inner.clone(), crate::io::submit_tick());
        io.done = Done::Parent(parent, then);
        if self.inner.timeouts_on.get() {
            crate::timeout::track(&self.inner, &mut io, self.desc);
        }
        self.inner.submit_checked(io, self.write, true);
    }
}

impl ChannelInner {
    /// A caller's request: checked against the bdev's reservation if it carries an initiator
    /// (the only cost to one that does not: the test of `initiator`), then as every request.
    #[inline(always)]
    fn submit_stamped(self: &Rc<Self>, io: BdevIo, write: bool) {
        if let Some(who) = io.req.initiator {
            if self.bdev.reservations.is_held() {
                return self.check_reservation(io, who, write);
            }
        }
        self.submit_checked(io, write, true);
    }

    /// A stamped request while the bdev's reservation is held: refused with Reservation
    /// Conflict if the access matrix forbids its initiator its access, else submitted.
    #[cold]
    #[inline(never)]
    fn check_reservation(self: &Rc<Self>, io: BdevIo, who: crate::InitiatorId, write: bool) {
        let refused = crate::Access::of(io.req.io_type)
            .is_some_and(|access| self.bdev.reservations.check_id(who, access).is_err());
        if refused {
            return self.reject(io, IoStatus::RESERVATION_CONFLICT);
        }
        self.submit_checked(io, write, true);
    }

    /// Checks a request (its payload too if `payload`) and routes it, or completes it with
    /// the check's status.
    #[inline]
    fn submit_checked(self: &Rc<Self>, io: BdevIo, write: bool, payload: bool) {
        let status = self.check(&io.req, write, payload);
        if !matches!(status, IoStatus::Success) {
            return self.reject(io, status);
        }
        self.route(io);
    }

    /// Submits a request forwarded by the layer of a bdev above, which checked, routed and
    /// fitted it, and whose module changed at most its offset. A read or write that this
    /// channel has nothing to refuse, hold back, queue or fit goes straight to the module:
    /// what could differ between the two bdevs (admission, the descriptor's write permission,
    /// the range) is checked, and the rest of the way is taken only when this channel has
    /// QoS limits, queued requests, a range lock, limits to fit to, or a zero-copy read its
    /// module cannot lend. (The whole way cost a passthru's or an lvol's read over malloc ~80
    /// instructions of the 200-300 it adds to the raw bdev's: `bench/io_cost.sh`.)
    #[inline(always)]
    fn submit_forwarded(self: &Rc<Self>, io: BdevIo, write: bool) {
        if self.passes_straight(&io.req, write) {
            debug_assert_eq!(self.check(&io.req, write, false), IoStatus::Success, "passed straight, but refused");
            return self.dispatch_here(io);
        }
        self.submit_checked(io, write, false);
    }

    /// True if `route` and `fit_and_dispatch` would hand `req` (checked by the layer above,
    /// payload unchanged) to the module as it is, and `check` would pass it.
    #[inline(always)]
    fn passes_straight(&self, req: &IoRequest, write: bool) -> bool {
        let t = req.io_type;
        let plain = match t {
            IoType::Read => self.lends_reads || !req.bufs.is_empty(),
            IoType::Write => write,
            _ => false,
        };
        plain
            && !self.ranges_on.get()
            && !self.shape_payload
            && !self.qos_on.get()
            && !self.waiting.get()
            && IoTypes(self.bdev.admits.load(Ordering::Relaxed)).contains(t)
            && self.holds(req)
    }

    /// True if `req` names at least one block and no block past the bdev's end.
    #[inline(always)]
    fn holds(&self, req: &IoRequest) -> bool {
        req.num_blocks > 0
            && req
                .offset_blocks
                .checked_add(req.num_blocks)
                .is_some_and(|end| end <= self.bdev.num_blocks.load(Ordering::Relaxed))
    }

    /// Completes a request that failed its checks (out of line: the logging would weigh on
    /// the checked path).
    #[cold]
    #[inline(never)]
    fn reject(&self, io: BdevIo, status: IoStatus) {
        log::debug!("bdev {}: rejected {:?}: {status}", self.bdev.name.escape_debug(), io.req.io_type);
        io.complete_deferred(status);
    }

    /// Sends a checked request where its type goes: the layer's own handling (reset, abort,
    /// emulated compare, compare-and-write), behind earlier requests that met NoMem, behind a
    /// range lock, or to the module.
    #[inline]
    pub(crate) fn route(self: &Rc<Self>, io: BdevIo) {
        self.route_from(io, true)
    }

    /// As [`ChannelInner::route`]; `behind_nomem` false for a request that comes out of the
    /// NoMem queue itself (it must not go back behind the others still in it).
    #[inline]
    fn route_from(self: &Rc<Self>, io: BdevIo, behind_nomem: bool) {
        let t = io.req.io_type;
        match t {
            IoType::Reset => self.reset(io),
            IoType::Abort => self.abort(io),
            IoType::Compare if !self.io_types.contains(IoType::Compare) => crate::compare::emulate_compare(io),
            IoType::CompareAndWrite if !self.io_types.contains(IoType::CompareAndWrite) && !io.lock_bypass => {
                crate::compare::compare_and_write(io)
            }
            _ if self.qos_on.get() && !io.qos_passed && crate::qos::limited(t) => crate::qos::submit(self, io),
            _ if self.held_back(&io) => self.locked.borrow_mut().push_back(io),
            _ if behind_nomem && self.waiting.get() && !self.nomem.borrow().is_empty() => {
                self.nomem.borrow_mut().push_back(io)
            }
            _ => self.fit_and_dispatch(io),
        }
    }

    /// Submits `req` for the layer itself on behalf of `parent` (already checked).
    pub(crate) fn submit_internal(self: &Rc<Self>, parent: BdevIo, req: IoRequest, then: fn(BdevIo, Completed)) {
        let tick = parent.submit_tick;
        let mut io = BdevIo::new(req, self.clone(), tick);
        io.done = Done::Parent(parent, then);
        self.route(io);
    }

    /// As `submit_internal`, for the read and write of a compare-and-write in progress (which
    /// the blocks it holds do not hold back).
    pub(crate) fn submit_internal_locked(self: &Rc<Self>, parent: BdevIo, req: IoRequest, then: fn(BdevIo, Completed)) {
        let tick = parent.submit_tick;
        let mut io = BdevIo::new(req, self.clone(), tick);
        io.done = Done::Parent(parent, then);
        io.lock_bypass = true;
        self.route(io);
    }

    /// Retries the requests that waited for a range lock (one was released).
    pub(crate) fn retry_locked_here(self: &Rc<Self>) {
        let waiting = std::mem::take(&mut *self.locked.borrow_mut());
        for io in waiting {
            if io.fitted {
                self.dispatch_unless_held(io);
            } else {
                self.route(io);
            }
        }
    }

    /// True if a range lock or compare-and-write known to this core holds `io` back (one
    /// flag test while none is).
    #[inline]
    fn held_back(&self, io: &BdevIo) -> bool {
        self.ranges_on.get() && self.locks.held_back(io, self.epochs.current.get())
    }

    /// Hands a fitted request (a retry after NoMem, or one a lock held back after that) to the
    /// module, unless a range lock installed since it first passed holds it back: the lock's
    /// drain no longer waited for it once the module had answered NoMem.
    fn dispatch_unless_held(&self, io: BdevIo) {
        if self.held_back(&io) {
            self.locked.borrow_mut().push_back(io);
        } else {
            self.dispatch(io);
        }
    }

    /// Fits a checked request to the module's limits and hands it (or its pieces) over.
    #[inline]
    pub(crate) fn fit_and_dispatch(self: &Rc<Self>, mut io: BdevIo) {
        if io.req.is_zcopy_read() && (!self.lends_reads || self.splits_zcopy(&io.req)) {
            // The module cannot lend, or the read must be split (lent views cannot be stitched
            // across a split): a plain read into a pool buffer serves the caller the same.
            let len = io.req.num_blocks * self.block_size as u64;
            match ferrite_reactor::try_alloc_buf(len as usize) {
                Some(b) => io.req.bufs.push(b),
                None => return self.wait_for_memory(io),
            }
        }
        let fit = self.shape_payload
            && io.req.io_type.has_payload()
            && !io.req.bufs.is_empty()
            && (!self.boundary_only || self.crosses_boundary(&io.req));
        let fit_unmap = match io.req.io_type {
            IoType::Unmap => {
                let max = self.limits.max_unmap_request();
                max != 0 && io.req.num_blocks > max || self.crosses_boundary(&io.req)
            }
            IoType::Copy => self.limits.max_copy_blocks != 0 && io.req.num_blocks > self.limits.max_copy_blocks,
            IoType::WriteZeroes => {
                self.limits.max_write_zeroes_blocks != 0 && io.req.num_blocks > self.limits.max_write_zeroes_blocks
                    || self.crosses_boundary(&io.req)
            }
            _ => false,
        };
        if fit || fit_unmap {
            crate::fit::fit(self, io);
        } else {
            self.dispatch(io);
        }
    }

    /// True if a zero-copy read breaks the module's limits (an lvol's cluster boundary): it
    /// would have to be split, and split children of a read need the parent's buffer.
    #[inline]
    fn splits_zcopy(&self, req: &IoRequest) -> bool {
        if !self.shape_payload {
            return false;
        }
        if self.boundary_only {
            return self.crosses_boundary(req);
        }
        !crate::fit::fits(self, req)
    }

    /// True if `req` crosses the boundary the bdev splits requests at (false without one).
    #[inline]
    pub(crate) fn crosses_boundary(&self, req: &IoRequest) -> bool {
        self.split_boundary > 0
            && req.num_blocks > 0
            && crate::fit::crosses(req.offset_blocks, req.num_blocks, self.split_boundary)
    }

    /// Hands a request to the module.
    #[inline]
    pub(crate) fn dispatch(&self, io: BdevIo) {
        self.dispatch_here(io)
    }

    /// `dispatch`, inlined into its caller (the forwarded fast path). A request that a module
    /// forwards to its base, unchanged or linearly moved, goes down the stack of layers in this
    /// loop, one turn per layer, and not as a nested call per layer: a call's register saves and
    /// restores were ~15 of the ~165 instructions a passthru added (`bench/io_cost.sh`).
    #[inline(always)]
    fn dispatch_here(&self, mut io: BdevIo) {
        let mut ch = self;
        loop {
            io.fitted = true;
            io.counted = true;
            io.epoch = ch.epochs.start();
            let base = match &ch.pass_to {
                Some(base) => base,
                None => match &ch.linear {
                    Some(l) if matches!(io.req.io_type, IoType::Read | IoType::Write) => {
                        match ch.linear_target(l, &mut io) {
                            Some(base) => base,
                            None => return ch.backend.borrow_mut().submit(io),
                        }
                    }
                    _ => return ch.backend.borrow_mut().submit(io),
                },
            };
            // As `IoChannel::forward_moved`: the request's payload was checked by the layer
            // above and is not checked again (same request, same block size).
            io = BdevIo::forwarding(io, None, base.inner.clone());
            if !base.inner.passes_straight(&io.req, base.write) {
                return base.inner.submit_checked(io, base.write, false);
            }
            debug_assert_eq!(
                base.inner.check(&io.req, base.write, false),
                IoStatus::Success,
                "passed straight, but refused"
            );
            ch = &base.inner;
        }
    }

    /// For a read or write of a module with a linear mapping (`Linear`): moves its offset and
    /// returns the base to forward it to if the mapping, as of now, covers it; else None (the
    /// module's).
    #[inline(always)]
    fn linear_target<'a>(&self, l: &'a Linear, io: &mut BdevIo) -> Option<&'a IoChannel> {
        let g = l.generation.load(Ordering::Acquire);
        if g != l.seen.get() {
            l.retake(&mut **self.backend.borrow_mut(), g);
        }
        // In range, so the sum does not overflow.
        if io.req.offset_blocks + io.req.num_blocks <= l.end.get() {
            io.req.offset_blocks += l.shift.get();
            debug_assert_eq!(io.block_size(), l.base.inner.block_size, "forwarded between block sizes");
            return Some(&l.base);
        }
        None
    }

    /// Checks a request against the bdev: not being removed, serves the type, holds the range;
    /// against the descriptor: may write; and if `payload`, its payload (which depends on the
    /// request alone).
    #[inline]
    fn check(&self, req: &IoRequest, write: bool, payload: bool) -> IoStatus {
        let t = req.io_type;
        if !IoTypes(self.bdev.admits.load(Ordering::Relaxed)).contains(t) {
            return self.refused(t);
        }
        if !write && t.writes() {
            return IoStatus::Failed(libc::EBADF);
        }
        if !t.has_range() {
            return IoStatus::Success;
        }
        if !self.holds(req) {
            return IoStatus::OutOfRange;
        }
        let blocks = self.bdev.num_blocks.load(Ordering::Relaxed);
        if let IoAux::CopyFrom(src) = req.aux {
            match src.checked_add(req.num_blocks) {
                Some(end) if end <= blocks => {}
                _ => return IoStatus::OutOfRange,
            }
        }
        if payload && t.has_payload() && !req.is_zcopy_read() {
            return self.check_payload(req);
        }
        IoStatus::Success
    }

    /// The status of a request of a type the layer does not admit: the bdev is being removed;
    /// or it serves no writes (an lvol snapshot, a volume made read-only) and the request
    /// changes blocks, which fails as a write to a read-only device (EROFS: NVMe's Namespace
    /// Is Write Protected, NBD's EPERM); or the bdev does not serve that type.
    #[cold]
    fn refused(&self, t: IoType) -> IoStatus {
        let b = crate::Bdev(self.bdev.clone());
        if b.is_removing() {
            IoStatus::Removed
        } else if t.writes() && !b.supports(IoType::Write) {
            IoStatus::Failed(libc::EROFS)
        } else {
            IoStatus::Unsupported
        }
    }

    /// The payload of a read, write or compare (in range): as long as its blocks, writable for
    /// a read; and a compare-and-write's compare data as long too. One pass over the segments.
    #[inline(always)]
    fn check_payload(&self, req: &IoRequest) -> IoStatus {
        // In range, so the product fits (a bdev's size in bytes does).
        let want = req.num_blocks * self.block_size as u64;
        let (mut len, mut read_only) = (0u64, false);
        for b in req.bufs.iter() {
            len += b.len() as u64;
            read_only |= b.is_read_only();
        }
        if len != want {
            return IoStatus::Misaligned;
        }
        match &req.aux {
            IoAux::Compare(cmp) if cmp.iter().map(|b| b.len() as u64).sum::<u64>() != want => IoStatus::Misaligned,
            IoAux::Compare(_) => IoStatus::Success,
            _ if req.io_type == IoType::CompareAndWrite => IoStatus::Misaligned,
            _ if req.io_type == IoType::Read && read_only => IoStatus::Failed(libc::EFAULT),
            _ => IoStatus::Success,
        }
    }

    /// A reset: once every request handed to the module before it has completed, it goes to
    /// the module too (which may reset its device). Later requests are not held back.
    fn reset(&self, io: BdevIo) {
        // Requests the module holds that would not finish on their own (an error bdev's pending
        // ones, a delay bdev's held ones) would make the reset wait forever: the module lets go.
        self.backend.borrow_mut().reset_begins();
        if let Some(io) = self.behind_barrier(Barrier::Reset(io)) {
            let Barrier::Reset(io) = io else { unreachable!("given back as given") };
            self.dispatch(io);
        }
    }

    /// True if a compare-and-write under one of this core's leases may start now: no write of
    /// this core that passed a lease may still be with the module (`LocalLocks::own_write_epoch`).
    pub(crate) fn caw_may_start(&self) -> bool {
        let Some(e) = self.locks.own_write_epoch.get() else { return true };
        let current = self.epochs.current.get();
        let drained = if e == current { self.epochs.count.get() == 0 } else { self.epochs.drained_through(e) };
        if drained {
            self.locks.own_write_epoch.set(None);
        }
        drained
    }

    /// Gives `io` back at once if no request is with the module; otherwise keeps it until
    /// every request handed to the module before now has completed, then starts it as a
    /// compare-and-write (`compare::caw_start`).
    pub(crate) fn after_drain_io(&self, io: BdevIo) -> Option<BdevIo> {
        match self.behind_barrier(Barrier::Caw(io)) {
            Some(Barrier::Caw(io)) => Some(io),
            Some(_) => unreachable!("given back as given"),
            None => None,
        }
    }

    /// Queues `b` behind every request handed to the module so far; gives it back when there
    /// is nothing to wait for (nothing in flight, no earlier barrier).
    fn behind_barrier(&self, b: Barrier) -> Option<Barrier> {
        if self.epochs.in_flight() == 0 && self.barriers.borrow().is_empty() {
            return Some(b);
        }
        let e = self.epochs.open_barrier();
        self.barriers.borrow_mut().push_back((e, b));
        self.waiting.set(true);
        None
    }

    /// An abort: completes, as Aborted, every request the caller named that waits in the layer
    /// or that the module can stop; succeeds if it found one. A module that lists `Abort` among
    /// its I/O types gets the abort request itself when the layer holds nothing it names.
    fn abort(&self, io: BdevIo) {
        let IoAux::Abort { completer, tag } = io.req.aux else {
            io.complete_deferred(IoStatus::Failed(libc::EINVAL));
            return;
        };
        let mut found = abort_queued(&self.nomem, completer, tag)
            + abort_queued(&self.locked, completer, tag)
            + abort_queued(&self.qos.queue, completer, tag);
        {
            let mut q = self.barriers.borrow_mut();
            let mut i = 0;
            while i < q.len() {
                if matches!(&q[i].1, Barrier::Reset(r) if r.is_named_by(completer, tag)) {
                    if let Some((_, Barrier::Reset(r))) = q.remove(i) {
                        r.complete_deferred(IoStatus::Aborted);
                    }
                    found += 1;
                } else {
                    i += 1;
                }
            }
        }
        let all = tag == crate::io::ALL_TAGS;
        if (found == 0 || all) && self.io_types.contains(IoType::Abort) {
            // The module takes aborts itself (a virtual bdev looks at what it holds, then asks
            // its base bdev) and completes this one.
            self.dispatch(io);
            return;
        }
        found += self.backend.borrow_mut().abort(&|r: &BdevIo| r.is_named_by(completer, tag));
        io.complete_deferred(if found > 0 || all { IoStatus::Success } else { IoStatus::Failed(libc::ENOENT) });
    }

    /// Completes, as Aborted, every request `pred` picks that waits in the layer or that the
    /// module can stop (a timeout's abort); returns how many.
    pub(crate) fn abort_matching(&self, pred: &dyn Fn(&BdevIo) -> bool) -> usize {
        let mut found = 0;
        for queue in [&self.nomem, &self.locked, &self.qos.queue] {
            let picked: VecDeque<BdevIo> = {
                let mut q = queue.borrow_mut();
                let (p, keep) = std::mem::take(&mut *q).into_iter().partition(|io| pred(io));
                *q = keep;
                p
            };
            found += picked.len();
            picked.into_iter().for_each(|io| io.complete_deferred(IoStatus::Aborted));
        }
        let resets: Vec<BdevIo> = {
            let mut q = self.barriers.borrow_mut();
            let (p, keep) =
                std::mem::take(&mut *q).into_iter().partition(|(_, b)| matches!(b, Barrier::Reset(r) if pred(r)));
            *q = keep;
            p.into_iter().filter_map(|(_, b)| if let Barrier::Reset(r) = b { Some(r) } else { None }).collect()
        };
        found += resets.len();
        resets.into_iter().for_each(|io| io.complete_deferred(IoStatus::Aborted));
        found + self.backend.borrow_mut().abort(pred)
    }

    /// Notes that a request the module had completed; releases resets whose predecessors have
    /// all completed, and retries requests that met NoMem.
    #[inline]
    pub(crate) fn finished(&self, epoch: u64) {
        self.epochs.finish(epoch);
        if self.waiting.get() {
            self.serve_waiting();
        }
    }

    fn serve_waiting(&self) {
        if !self.barriers.borrow().is_empty() {
            self.release_barriers();
        }
        if !self.nomem.borrow().is_empty() {
            self.retry_nomem();
        }
        if self.barriers.borrow().is_empty() && self.nomem.borrow().is_empty() {
            self.waiting.set(false);
        }
    }

    fn release_barriers(&self) {
        loop {
            let ready = {
                let b = self.barriers.borrow();
                match b.front() {
                    Some((e, _)) => self.epochs.drained_through(*e),
                    None => false,
                }
            };
            if !ready {
                return;
            }
            match self.barriers.borrow_mut().pop_front().expect("front exists").1 {
                Barrier::Reset(r) => self.dispatch(r),
                Barrier::Call(f) => f(),
                Barrier::Caw(io) => crate::compare::caw_start(io),
            }
        }
    }

    /// Queues a request that met NoMem (answered by the module) for a retry.
    pub(crate) fn retry_later(&self, mut io: BdevIo) {
        if io.counted {
            io.counted = false;
            self.epochs.finish(io.epoch);
        }
        self.nomem.borrow_mut().push_front(io);
        self.waiting.set(true);
        self.arm_nomem_timer();
    }

    /// Queues a request the layer could not get a buffer for.
    pub(crate) fn wait_for_memory(&self, io: BdevIo) {
        self.nomem.borrow_mut().push_back(io);
        self.waiting.set(true);
        self.arm_nomem_timer();
    }

    /// With nothing in flight, no completion will come to retry the NoMem queue: a timer does.
    fn arm_nomem_timer(&self) {
        if self.epochs.in_flight() > 0 || self.nomem_timer.replace(true) {
            return;
        }
        let me = self.me.clone();
        let retry = move || {
            if let Some(ch) = me.upgrade() {
                ch.nomem_timer.set(false);
                ch.retry_nomem();
            }
        };
        if ferrite_reactor::current().is_some() {
            ferrite_reactor::after(NOMEM_RETRY, retry);
        } else {
            // No reactor (unit tests): retry on the deferred queue's next run.
            crate::io::defer_fn(Box::new(retry));
        }
    }

    fn retry_nomem(&self) {
        let Some(me) = self.me.upgrade() else { return };
        // Only the requests queued now: one that meets NoMem again goes back for a later retry.
        let n = self.nomem.borrow().len();
        for _ in 0..n {
            let Some(io) = self.nomem.borrow_mut().pop_front() else { return };
            if io.fitted {
                self.dispatch_unless_held(io);
            } else {
                // Queued behind a NoMem before it was fitted: it goes on from here, not back
                // behind the requests still queued (which once stalled them all for good).
                me.route_from(io, false);
            }
        }
        if !self.nomem.borrow().is_empty() {
            self.arm_nomem_timer();
        }
    }

    #[inline]
    pub(crate) fn account(&self, req: &IoRequest, status: IoStatus, latency_ticks: u64) {
        // Saturating: a rejected request may carry any block count.
        self.stats.record(req.io_type, req.num_blocks.saturating_mul(self.block_size as u64), status, latency_ticks);
    }
}

/// Completes, as Aborted, the requests of `queue` that an abort of (`completer`, `tag`) names.
fn abort_queued(queue: &RefCell<VecDeque<BdevIo>>, completer: usize, tag: u64) -> usize {
    let mut q = queue.borrow_mut();
    let mut found = 0;
    let mut i = 0;
    while i < q.len() {
        if q[i].is_named_by(completer, tag) {
            q.remove(i).expect("index in range").complete_deferred(IoStatus::Aborted);
            found += 1;
        } else {
            i += 1;
        }
    }
    found
}

/// A bdev's fresh per-core counters, with its histogram if enabled.
fn new_stats_entry(bdev: &Bdev) -> StatsEntry {
    let stats: Rc<ChannelStats> = Rc::default();
    stats.set_histogram(bdev.0.histogram.get());
    StatsEntry { stats, bdev: Arc::downgrade(&bdev.0) }
}

/// This core's counters of the bdev with internal id `id`, if it has any.
pub(crate) fn local_stats(id: u64) -> Option<Rc<ChannelStats>> {
    STATS.with(|s| s.borrow().get(&id).map(|e| e.stats.clone()))
}

/// Runs `f` on this core's counters of `bdev`, making them if needed.
pub(crate) fn with_local_stats(bdev: &Bdev, f: impl FnOnce(&ChannelStats)) {
    let stats = local_stats_entry(bdev);
    f(&stats);
}

/// This core's statistics for the bdev with internal id `id`, None if it was never used here
/// (one entry of `bdev_get_iostat`'s `per_channel` result).
pub fn local_iostat_if_used(id: u64) -> Option<IoStat> {
    local_stats(id).map(|s| s.snapshot())
}

/// Resets this core's statistics of the bdev with internal id `id` as `mode` says.
pub fn reset_local_iostat(id: u64, mode: crate::stats::ResetMode) {
    if let Some(s) = local_stats(id) {
        s.reset(mode);
    }
}

/// Channels alive on the calling core (of every bdev): zero once every opener here let go.
pub fn live_channels() -> usize {
    CHANNELS.with(|c| c.borrow().values().filter(|w| w.strong_count() > 0).count())
}

pub(crate) fn local_channel(bdev_id: u64) -> Option<Rc<ChannelInner>> {
    CHANNELS.with(|c| c.borrow().get(&bdev_id).and_then(Weak::upgrade))
}

impl ChannelInner {
    /// See [`IoChannel::queue_depth`].
    pub(crate) fn queue_depth(&self) -> u64 {
        let queued = self.nomem.borrow().len() + self.locked.borrow().len() + self.qos.queue.borrow().len();
        self.epochs.in_flight() + queued as u64 + self.barriers.borrow().len() as u64
    }
}

/// This core's queue depth of the bdev (0 without a channel here).
pub(crate) fn local_queue_depth(bdev_id: u64) -> u64 {
    local_channel(bdev_id).map_or(0, |ch| ch.queue_depth())
}

/// Runs `f` once `ch` has completed every request handed to its module before now (at once
/// if none is in flight).
pub(crate) fn after_drain(ch: &ChannelInner, f: Box<dyn FnOnce()>) {
    if let Some(Barrier::Call(f)) = ch.behind_barrier(Barrier::Call(f)) {
        f();
    }
}

/// Runs `f` on this core's backend channel of the bdev; false if it has none here.
pub(crate) fn with_backend(bdev_id: u64, f: &dyn Fn(&mut dyn BackendChannel)) -> bool {
    match local_channel(bdev_id) {
        Some(ch) => {
            f(&mut **ch.backend.borrow_mut());
            true
        }
        None => false,
    }
}

/// This core's statistics for the bdev with internal id `id` (zero if never used here).
pub fn local_iostat(id: u64) -> IoStat {
    STATS.with(|s| s.borrow().get(&id).map(|c| c.stats.snapshot()).unwrap_or_default())
}

/// How many bdevs this core keeps counters for, deleted ones not yet pruned included.
pub fn local_iostat_entries() -> usize {
    STATS.with(|s| s.borrow().len())
}

/// Forgets this core's statistics of bdevs that are gone or being deleted. (Bdevs registered
/// while a caller gathers statistics are kept: the test is on each bdev, not on a list read
/// earlier.)
pub fn prune_local_iostat() {
    STATS.with(|s| {
        let mut s = s.borrow_mut();
        s.retain(|_, e| stats_entry_live(e));
        STATS_PRUNED_LEN.with(|pruned| pruned.set(s.len()));
    });
}

/// Completion slot of [`IoChannel::submit_wait`].
#[derive(Default)]
struct WaitSlot {
    done: RefCell<Option<Completed>>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl IoCompleter for WaitSlot {
    fn io_done(&self, _tag: u64, io: Completed) {
        *self.done.borrow_mut() = Some(io);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

impl IoChannel {
    /// Submits one request and waits for it (for control paths and adapters such as FUSE;
    /// allocates a small completion slot per call, so not for the hot path of a target).
    pub async fn submit_wait(&self, req: IoRequest) -> Completed {
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

    /// [`IoChannel::submit_wait`], giving up after `limit` (None): a device that does not
    /// answer, or a path that is down, does not hold a control path up. A request given up on
    /// still completes later, into a slot nobody reads.
    pub async fn submit_wait_within(&self, req: IoRequest, limit: std::time::Duration) -> Option<Completed> {
        let done = async { Some(self.submit_wait(req).await) };
        let timeout = async {
            ferrite_reactor::sleep(limit).await;
            None
        };
        ferrite_reactor::net::race(done, timeout).await
    }
}
