//! LBA range locks (SPDK's `bdev_lock_lba_range`) and quiesce (`spdk_bdev_quiesce_range`).
//!
//! A bdev's shared [`LockTable`] says which ranges are held and which requests wait, in order.
//! It is touched only when a lock is requested or released and when a core makes a channel,
//! never by I/O: each core's channel keeps its own copy of the held ranges
//! (`local_locks::LocalLocks`), sent to it by message when a lock is granted or released, and
//! that copy is what a request checks. A lock is granted in two steps: the table takes it
//! (when nothing overlapping is held or waits before it; otherwise it waits, and the release
//! that clears its way grants it: no polling), then every core installs it in its channel and
//! drains the requests its module had before (an epoch barrier, `channel::after_drain`), so a
//! write admitted on a core before that core learned of the lock has completed when the lock's
//! holder hears it is granted.
//!
//! Every change of the table goes through [`LockTable::apply`], which checks its invariants.

use crate::bdev::{BdevError, BdevShared};
use crate::channel;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What a held range holds back (see `local_locks::held_back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A plain lock: writes wait (SPDK's range lock).
    Lock,
    /// A quiesced range: reads wait too (SPDK's quiesce range).
    Quiesce,
    /// A compare-and-write lease of the core `owner`: other cores' writes wait; that core's
    /// own writes wait only for its compare-and-writes in progress (see `compare`).
    Lease { owner: usize },
}

/// A range in the table: blocks `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) id: u64,
    pub(crate) kind: Kind,
}

impl Range {
    /// True if the two ranges share a block (an empty range shares none).
    #[inline]
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

/// What runs once a lock is granted and installed on every core (on the last core to drain).
pub(crate) type Granted = Box<dyn FnOnce() + Send>;

/// A request waiting for overlapping ranges to go.
struct Waiter {
    range: Range,
    granted: Granted,
}

/// A held range and whether every core has installed it yet.
#[derive(Debug, Clone, Copy)]
struct Held {
    range: Range,
    installed: bool,
}

/// A bdev's ranges: held (taken in the table; installed on every core once `installed`), and
/// waiting, oldest first.
#[derive(Default)]
pub(crate) struct LockTable {
    held: Vec<Held>,
    waiting: VecDeque<Waiter>,
    next_id: u64,
    /// Waiters granted by a release, over the bdev's life (a waiter is woken by the release
    /// that clears its way, never by a timer): see [`crate::Bdev::lock_stats`].
    woken: u64,
    /// Requests granted, over the bdev's life.
    granted: u64,
}

/// A change of a [`LockTable`].
enum Change {
    /// A new request: granted now if nothing overlapping is held or waits, else queued.
    Request(Waiter),
    /// Every core installed `id` (and drained the requests before it).
    Installed(u64),
    /// `id` goes, held or waiting; waiters it held up are granted, in order.
    Release(u64),
}

/// What a change did.
#[derive(Default)]
struct Outcome {
    /// Requests granted by this change (each still to be installed on every core).
    granted: Vec<Waiter>,
    /// The range released, if it was held (its cores must forget it).
    released: Option<Range>,
    /// Leases that stand in a waiting request's way: their owners are asked to give them up.
    revoke: Vec<Range>,
}

impl LockTable {
    fn blocked(&self, r: &Range, before: usize) -> bool {
        self.held.iter().any(|h| h.range.overlaps(r.start, r.end))
            || self.waiting.iter().take(before).any(|w| w.range.overlaps(r.start, r.end))
    }

    /// The one place the table changes.
    fn apply(&mut self, change: Change) -> Outcome {
        let mut out = Outcome::default();
        match change {
            Change::Request(w) => {
                if self.blocked(&w.range, self.waiting.len()) {
                    out.revoke = self.leases_in_way(&w.range);
                    self.waiting.push_back(w);
                } else {
                    self.held.push(Held { range: w.range, installed: false });
                    self.granted += 1;
                    out.granted.push(w);
                }
            }
            Change::Installed(id) => {
                if let Some(h) = self.held.iter_mut().find(|h| h.range.id == id) {
                    debug_assert!(!h.installed, "a range is installed once");
                    h.installed = true;
                }
            }
            Change::Release(id) => {
                if let Some(i) = self.held.iter().position(|h| h.range.id == id) {
                    out.released = Some(self.held.swap_remove(i).range);
                    let mut i = 0;
                    while i < self.waiting.len() {
                        if self.blocked(&self.waiting[i].range, i) {
                            i += 1;
                            continue;
                        }
                        let w = self.waiting.remove(i).expect("index in range");
                        self.held.push(Held { range: w.range, installed: false });
                        self.woken += 1;
                        self.granted += 1;
                        out.granted.push(w);
                    }
                    // Waiters still blocked by a lease that was granted meanwhile.
                    for w in self.waiting.iter() {
                        for l in self.leases_in_way(&w.range) {
                            if !out.revoke.contains(&l) {
                                out.revoke.push(l);
                            }
                        }
                    }
                } else if let Some(i) = self.waiting.iter().position(|w| w.range.id == id) {
                    // Given up before it was granted.
                    drop(self.waiting.remove(i));
                }
            }
        }
        self.check();
        out
    }

    fn leases_in_way(&self, r: &Range) -> Vec<Range> {
        self.held
            .iter()
            .filter(|h| matches!(h.range.kind, Kind::Lease { .. }) && h.range.overlaps(r.start, r.end))
            .map(|h| h.range)
            .collect()
    }

    /// Held ranges never overlap; every waiter is blocked by a held range or an earlier waiter.
    fn check(&self) {
        if cfg!(debug_assertions) {
            for (i, a) in self.held.iter().enumerate() {
                for b in &self.held[i + 1..] {
                    debug_assert!(!a.range.overlaps(b.range.start, b.range.end), "held ranges overlap: {a:?} {b:?}");
                    debug_assert_ne!(a.range.id, b.range.id, "a range id is held twice");
                }
            }
            for (i, w) in self.waiting.iter().enumerate() {
                debug_assert!(self.blocked(&w.range, i), "waiter {:?} could be granted", w.range);
            }
        }
    }

    /// The lease of `[start, end)` for a compare-and-write, out of its chunk `[ls, le)`: the
    /// chunk without the locks and quiesced ranges, held or waiting, that take blocks of it
    /// beside the command's own, so that it does not wait for them (a rebuild holds its range
    /// for minutes). Compare-and-writes on the same side of such a range share the lease.
    pub(crate) fn lease_around(&self, (mut ls, mut le): (u64, u64), (start, end): (u64, u64)) -> (u64, u64) {
        let pins = self.held.iter().map(|h| &h.range).chain(self.waiting.iter().map(|w| &w.range));
        for r in pins.filter(|r| matches!(r.kind, Kind::Lock | Kind::Quiesce) && !r.overlaps(start, end)) {
            if r.end <= start {
                ls = ls.max(r.end);
            } else {
                le = le.min(r.start);
            }
        }
        debug_assert!(ls <= start && end <= le, "the lease covers the command's blocks");
        (ls, le)
    }

    /// True while `id` is held (installed or being installed).
    pub(crate) fn is_held(&self, id: u64) -> bool {
        self.held.iter().any(|h| h.range.id == id)
    }

    /// True once `id` is held and installed on every core.
    pub(crate) fn is_installed(&self, id: u64) -> bool {
        self.held.iter().any(|h| h.range.id == id && h.installed)
    }

    /// The held ranges, for a channel made now to start with.
    pub(crate) fn held_ranges(&self) -> impl Iterator<Item = Range> + '_ {
        self.held.iter().map(|h| h.range)
    }
}

/// Asks for `[start, end)` of `kind`: `granted` runs once it is held and installed on every
/// core. Returns its id (to release it, granted or not).
pub(crate) fn request(bdev: &Arc<BdevShared>, start: u64, end: u64, kind: Kind, granted: Granted) -> u64 {
    let (id, out) = {
        let mut t = bdev.locks.lock().unwrap();
        t.next_id += 1;
        let id = t.next_id;
        let out = t.apply(Change::Request(Waiter { range: Range { start, end, id, kind }, granted }));
        (id, out)
    };
    carry_out(bdev, out, None);
    id
}

/// Releases `id` (held or waiting): every core forgets it and retries what it held back, then
/// `done` runs (on the last core to do so). Waiters it held up are granted.
pub(crate) fn release(bdev: &Arc<BdevShared>, id: u64, done: Option<Granted>) {
    let out = bdev.locks.lock().unwrap().apply(Change::Release(id));
    carry_out(bdev, out, done);
}

/// Sends the messages a change calls for: installs of granted ranges, removal of a released
/// one, revocations of leases in a waiter's way.
fn carry_out(bdev: &Arc<BdevShared>, out: Outcome, done: Option<Granted>) {
    match out.released {
        Some(r) => on_every_core(bdev, Op::Remove(r.id), done),
        None => {
            if let Some(done) = done {
                done()
            }
        }
    }
    for w in out.granted {
        let b = bdev.clone();
        let id = w.range.id;
        let granted = w.granted;
        on_every_core(
            bdev,
            Op::Install(w.range),
            Some(Box::new(move || {
                b.locks.lock().unwrap().apply(Change::Installed(id));
                granted();
            })),
        );
    }
    for l in out.revoke {
        if let Kind::Lease { owner } = l.kind {
            crate::compare::revoke(bdev, owner, l.id);
        }
    }
}

/// A change every core's channel makes to its copy of the table.
#[derive(Clone, Copy)]
enum Op {
    /// Install the range, then drain the requests the module had before.
    Install(Range),
    /// Forget the range and retry what it held back.
    Remove(u64),
}

/// Runs `op` on every core's channel of `bdev`, then `done` on the last core to finish. For a
/// bdev made off the reactors (unit tests on a plain thread), here and now: one thread,
/// nothing to drain.
fn on_every_core(bdev: &Arc<BdevShared>, op: Op, done: Option<Granted>) {
    let bid = bdev.id;
    let Some(engine) = bdev.engine.clone() else {
        apply_here(bid, op, Box::new(|| {}));
        if let Some(done) = done {
            done()
        }
        return;
    };
    struct Round {
        left: AtomicUsize,
        done: std::sync::Mutex<Option<Granted>>,
    }
    let round = Arc::new(Round { left: AtomicUsize::new(engine.count()), done: std::sync::Mutex::new(done) });
    for core in 0..engine.count() {
        let round = round.clone();
        let weak = Arc::downgrade(bdev);
        engine.send(core, move || {
            let ack = Box::new(move || {
                if round.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(done) = round.done.lock().unwrap().take() {
                        done();
                    }
                }
            });
            // An install that arrives after its range was released (its holder gave up) is
            // not made: the release's removal may have passed this core already.
            let live = match op {
                Op::Install(r) => weak.upgrade().is_some_and(|b| b.locks.lock().unwrap().is_held(r.id)),
                Op::Remove(_) => true,
            };
            if live {
                apply_here(bid, op, ack);
            } else {
                ack();
            }
        });
    }
}

/// Applies `op` to this core's channel of the bdev (if any); `ack` runs once it is done.
fn apply_here(bid: u64, op: Op, ack: Granted) {
    let Some(ch) = channel::local_channel(bid) else { return ack() };
    match op {
        Op::Install(r) => {
            ch.locks.install(&ch, r);
            channel::after_drain(&ch, ack);
        }
        Op::Remove(id) => {
            ch.locks.remove(&ch, id);
            ch.retry_locked_here();
            ack();
        }
    }
}

/// A held lock on a range of a bdev's blocks (SPDK's `bdev_lock_lba_range`): writes to the
/// range (write, write zeroes, unmap, copy, compare-and-write) wait in their channels, on every
/// core, until it is dropped. Reads go on. A virtual bdev's module takes one to change where a
/// range lives (an lvol snapshot moves its clusters) with no write in flight.
pub struct LbaRangeLock {
    bdev: Arc<BdevShared>,
    id: u64,
}

impl std::fmt::Debug for LbaRangeLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LbaRangeLock({}, {})", self.bdev.name, self.id)
    }
}

impl Drop for LbaRangeLock {
    fn drop(&mut self) {
        release(&self.bdev, self.id, None);
    }
}

/// How a bdev's range locks have gone (see [`crate::Bdev::lock_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockStats {
    /// Ranges held now (locks, quiesced ranges and compare-and-write leases).
    pub held: usize,
    /// Requests waiting for an overlapping range to go.
    pub waiting: usize,
    /// Waiters granted by the release that cleared their way, over the bdev's life.
    pub woken: u64,
    /// Requests granted (at once or woken), over the bdev's life: each cost a round of
    /// messages to every core.
    pub granted: u64,
}

impl crate::Bdev {
    /// Locks blocks `[start, start + num)`: waits for overlapping locks to go (woken by their
    /// release), then for every core's channel to finish the requests its module had before
    /// (the writes already past the lock). Dropping the future before it resolves gives the
    /// request up.
    pub async fn lock_lba_range(&self, start: u64, num: u64) -> LbaRangeLock {
        let bdev = self.0.clone();
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        let id = request(&bdev, start, start.saturating_add(num), Kind::Lock, Box::new(move || tx.send(())));
        let held = LbaRangeLock { bdev, id };
        let _ = rx.await;
        held
    }

    /// Quiesces the whole bdev (SPDK's `spdk_bdev_quiesce`): see [`crate::Bdev::quiesce_range`].
    pub async fn quiesce(&self) -> Result<(), BdevError> {
        self.quiesce_range(0, self.num_blocks()).await
    }

    /// Ends a quiesce of the whole bdev (SPDK's `spdk_bdev_unquiesce`).
    pub async fn unquiesce(&self) -> Result<(), BdevError> {
        self.unquiesce_range(0, self.num_blocks()).await
    }

    /// Quiesces blocks `[start, start + num)` (SPDK's `spdk_bdev_quiesce_range`): resolves once
    /// no request that reads or changes the range is with the module, on any core; until
    /// [`crate::Bdev::unquiesce_range`] of the same range, new reads, writes, write zeroes,
    /// unmaps, copies, compares and compare-and-writes of the range (and every NVMe I/O
    /// passthrough) wait in their channels. Waits for overlapping locks and quiesced ranges
    /// first. EINVAL for a range past the end; ENODEV for a bdev being deleted with no
    /// opener. Dropping the future before it resolves gives the quiesce up (nothing stays
    /// quiesced that no one would unquiesce); once it resolved, only an unquiesce ends it.
    pub async fn quiesce_range(&self, start: u64, num: u64) -> Result<(), BdevError> {
        let end = self.check_quiesce_range(start, num)?;
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        let id = request(&self.0, start, end, Kind::Quiesce, Box::new(move || tx.send(())));
        // Released if the future is dropped while waiting; kept (forgotten) once granted.
        let pending = LbaRangeLock { bdev: self.0.clone(), id };
        let _ = rx.await;
        std::mem::forget(pending);
        Ok(())
    }

    /// Ends the quiesce of exactly `[start, start + num)` (SPDK's `spdk_bdev_unquiesce_range`):
    /// resolves once every core let go of what the range held back. EINVAL if that range is
    /// not quiesced (or its quiesce has not completed yet).
    pub async fn unquiesce_range(&self, start: u64, num: u64) -> Result<(), BdevError> {
        let end = self.check_quiesce_range(start, num)?;
        let id = {
            let t = self.0.locks.lock().unwrap();
            t.held
                .iter()
                .find(|h| h.installed && h.range.kind == Kind::Quiesce && h.range.start == start && h.range.end == end)
                .map(|h| h.range.id)
        };
        let Some(id) = id else {
            return Err(BdevError::Invalid(format!(
                "blocks {start}..{end} of bdev {} are not quiesced",
                self.name().escape_debug()
            )));
        };
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        release(&self.0, id, Some(Box::new(move || tx.send(()))));
        let _ = rx.await;
        Ok(())
    }

    fn check_quiesce_range(&self, start: u64, num: u64) -> Result<u64, BdevError> {
        let end = start.checked_add(num).filter(|&e| e <= self.num_blocks()).ok_or_else(|| {
            BdevError::Invalid(format!("blocks {start}+{num} are past the end of bdev {}", self.name().escape_debug()))
        })?;
        if self.is_removing() && self.open_count() == 0 {
            return Err(BdevError::Errno(libc::ENODEV, format!("bdev {} is being deleted", self.name())));
        }
        Ok(end)
    }

    /// How the bdev's range locks stand (for tests and debugging).
    pub fn lock_stats(&self) -> LockStats {
        let t = self.0.locks.lock().unwrap();
        LockStats { held: t.held.len(), waiting: t.waiting.len(), woken: t.woken, granted: t.granted }
    }
}
