//! The nexus bdev's per-core channel: the data path.
//!
//! - Writes, unmaps, write zeroes, flushes and resets go to every writable child (healthy or
//!   being rebuilt): the request itself, forwarded, when there is one; a fan-out
//!   (`ferrite_bdev::FanOut`, one `Rc` per request) otherwise.
//! - Reads go to one healthy child, round-robin (local children first with `local_first`); a
//!   read that fails goes to the next healthy child not yet tried.
//! - A child that fails an I/O is faulted (`Nexus::child_failed`, which retires it on every
//!   core); the request is completed by the others. A write that some child missed (it failed
//!   it, or it was skipped as out of date) also marks the segment log, and is acknowledged only
//!   once the store records that child as out of date: until then it waits here (`parked`),
//!   for at most `STORE_WAIT`, swept by the store task's rounds.
//!
//! The layout (children as this core sees them) changes only by `Bdev::for_each_channel`.
//! Nothing is allocated per request beyond the fan-out's `Rc`, except when a write has to wait
//! for the store (the waiting list grows then).

use crate::nexus::{Nexus, STORE_WAIT};
use ferrite_bdev::fanout::{FanOut, FanOutDone};
use ferrite_bdev::{BackendChannel, BdevError, BdevIo, IoChannel, IoRequest, IoStatus, IoType};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// One child as a channel sees it.
struct LChild {
    slot: u8,
    ch: IoChannel,
    readable: bool,
    local: bool,
}

/// The children as a channel sees them.
#[derive(Default)]
struct Layout {
    /// Writable children (healthy or being rebuilt).
    writers: SmallVec<[LChild; 4]>,
    /// Some child is out of date: writes mark the segment log, and wait for `skip_gen`.
    degraded: bool,
    /// The generation the store must hold before a write that skipped a child is acknowledged.
    skip_gen: u64,
    /// Readers are local children first.
    local_first: bool,
}

/// Child slots as a bit mask.
#[derive(Clone, Copy, Default)]
struct Mask(u16);

impl Mask {
    fn set(&mut self, i: u8) {
        self.0 |= 1 << i;
    }
    fn has(self, i: u8) -> bool {
        self.0 & (1 << i) != 0
    }
}

/// Context of a write-type request: the slots it went to, and for a flush the epoch it began
/// (`Nexus::flush_begin`).
#[derive(Clone, Copy)]
struct Fanned {
    slots: Mask,
    epoch: Option<u64>,
}

/// Context of a read: the child it is on and those tried.
#[derive(Clone, Copy)]
struct Read {
    slot: u8,
    tried: Mask,
}

/// A write waiting for the store.
struct Parked {
    io: BdevIo,
    gen: u64,
    deadline: Instant,
}

/// The per-core state requests reach in their completions.
pub(crate) struct ChanState {
    nexus: Arc<Nexus>,
    lay: RefCell<Layout>,
    /// Round-robin position of reads.
    rr: Cell<usize>,
    parked: RefCell<VecDeque<Parked>>,
}

/// The nexus bdev's channel on one core.
pub(crate) struct NexusChannel {
    st: Rc<ChanState>,
}

fn layout(n: &Nexus) -> Result<Layout, BdevError> {
    let st = n.lock();
    let mut l = Layout { local_first: n.local_first, ..Layout::default() };
    for (i, c) in st.slots.iter().enumerate() {
        let Some(c) = c else { continue };
        if c.writable() {
            let ch = c.desc.as_ref().expect("a writable child is open").channel()?;
            l.writers.push(LChild { slot: i as u8, ch, readable: c.readable(), local: c.parsed.is_local() });
        } else {
            l.degraded = true;
            l.skip_gen = l.skip_gen.max(c.fault_gen);
        }
        if !c.readable() {
            l.degraded = true;
        }
    }
    Ok(l)
}

impl NexusChannel {
    /// A channel with the children as they are now.
    pub(crate) fn new(nexus: Arc<Nexus>) -> Result<Self, BdevError> {
        let lay = layout(&nexus)?;
        Ok(Self {
            st: Rc::new(ChanState {
                nexus,
                lay: RefCell::new(lay),
                rr: Cell::new(0),
                parked: RefCell::new(VecDeque::with_capacity(64)),
            }),
        })
    }

    /// Takes the children as they are now.
    pub(crate) fn refresh(&mut self) {
        match layout(&self.st.nexus) {
            Ok(l) => *self.st.lay.borrow_mut() = l,
            Err(e) => log::warn!("nexus {}: channel keeps its children: {e}", self.st.nexus.name),
        }
    }

    /// Completes the waiting writes the store now covers; fails those past their deadline.
    pub(crate) fn sweep(&mut self) {
        let recorded = self.st.nexus.covered();
        let now = Instant::now();
        let mut q = self.st.parked.borrow_mut();
        let mut keep = VecDeque::new();
        while let Some(p) = q.pop_front() {
            if p.gen <= recorded {
                p.io.complete_deferred(IoStatus::Success);
            } else if now >= p.deadline {
                log::error!("nexus {}: store unreachable; a write a child missed fails", self.st.nexus.name);
                p.io.complete_deferred(IoStatus::Failed(libc::EIO));
            } else {
                keep.push_back(p);
            }
        }
        *q = keep;
    }
}

impl BackendChannel for NexusChannel {
    fn submit(&mut self, io: BdevIo) {
        submit(&self.st, io)
    }

    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.st.clone())
    }

    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

fn submit(st: &Rc<ChanState>, io: BdevIo) {
    match io.req.io_type {
        IoType::Read => read(st, io),
        IoType::Write | IoType::Unmap | IoType::WriteZeroes | IoType::Flush | IoType::Reset => to_writers(st, io),
        _ => io.complete_deferred(IoStatus::Unsupported),
    }
}

/// The next healthy child to read from, not in `tried`.
fn next_reader(st: &ChanState, lay: &Layout, tried: Mask) -> Option<usize> {
    let n = lay.writers.len();
    let start = st.rr.get();
    st.rr.set(start.wrapping_add(1));
    let pick = |local_only: bool| {
        (0..n).map(|k| (start + k) % n).find(|&i| {
            let c = &lay.writers[i];
            c.readable && !tried.has(c.slot) && (!local_only || c.local)
        })
    };
    if lay.local_first {
        if let Some(i) = pick(true) {
            return Some(i);
        }
    }
    pick(false)
}

fn read(st: &Rc<ChanState>, mut io: BdevIo) {
    let lay = st.lay.borrow();
    let Some(i) = next_reader(st, &lay, Mask::default()) else {
        return io.complete_deferred(IoStatus::Failed(libc::ENODEV));
    };
    let c = &lay.writers[i];
    let mut tried = Mask::default();
    tried.set(c.slot);
    io.set_ctx(Read { slot: c.slot, tried });
    c.ch.forward_then(io, read_done);
}

/// A read came back from a child: done, or on to the next healthy child if it failed.
fn read_done(mut io: BdevIo, status: IoStatus) {
    if status.is_ok() || matches!(status, IoStatus::Aborted | IoStatus::NoMem) {
        return io.complete(status);
    }
    let mut r = *io.ctx::<Read>().expect("a nexus read keeps its context");
    let st = io.module_channel::<ChanState>().expect("a nexus request comes back to its channel");
    st.nexus.child_failed(r.slot as usize, &format!("read at block {}: {status}", io.req.offset_blocks), status);
    let lay = st.lay.borrow();
    let Some(i) = next_reader(&st, &lay, r.tried) else {
        drop(lay);
        return io.complete(status);
    };
    let c = &lay.writers[i];
    r.tried.set(c.slot);
    r.slot = c.slot;
    io.set_ctx(r);
    log::debug!("nexus {}: read retried on slot {}", st.nexus.name, c.slot);
    c.ch.forward_then(io, read_done);
}

/// A write-type request to every writable child.
fn to_writers(st: &Rc<ChanState>, mut io: BdevIo) {
    let lay = st.lay.borrow();
    let t = io.req.io_type;
    if lay.writers.is_empty() {
        return io.complete_deferred(IoStatus::Failed(libc::ENODEV));
    }
    if lay.degraded && t.writes() {
        st.nexus.log.mark(io.req.offset_blocks, io.req.num_blocks);
    }
    let mut slots = Mask::default();
    for c in &lay.writers {
        slots.set(c.slot);
    }
    let epoch = if t == IoType::Flush { st.nexus.flush_begin() } else { None };
    io.set_ctx(Fanned { slots, epoch });
    if lay.writers.len() == 1 {
        return lay.writers[0].ch.forward_then(io, one_done);
    }
    let (off, num, flags) = (io.req.offset_blocks, io.req.num_blocks, io.req.flags);
    let len = if t.has_payload() { io.len_bytes() as usize } else { 0 };
    let fan = FanOut::for_io(io, all_done);
    for c in &lay.writers {
        fan.submit(&c.ch, IoRequest::new(t, off, num).with_flags(flags), 0..len);
    }
}

/// True for a status that says the child failed (not the request's own end).
fn child_fault(s: IoStatus) -> bool {
    !s.is_ok() && !matches!(s, IoStatus::Aborted | IoStatus::NoMem)
}

/// The one writable child answered.
fn one_done(io: BdevIo, status: IoStatus) {
    let st = io.module_channel::<ChanState>().expect("a nexus request comes back to its channel");
    written(&st.nexus, &io, status.is_ok());
    if child_fault(status) {
        let slot = io.ctx::<Fanned>().expect("context").slots.0.trailing_zeros() as usize;
        let why = format!("{} at block {}: {status}", io.req.io_type.name(), io.req.offset_blocks);
        st.nexus.child_failed(slot, &why, status);
        return io.complete(status);
    }
    let gen = st.lay.borrow().skip_gen;
    finish(&st, io, status, gen)
}

/// Every writable child answered: success if one took it; those that failed are faulted, and
/// the request waits until the store says so.
fn all_done(io: BdevIo, done: FanOutDone) {
    let slots = io.ctx::<Fanned>().expect("a nexus write keeps its context").slots;
    let st = io.module_channel::<ChanState>().expect("a nexus request comes back to its channel");
    let mut gen = st.lay.borrow().skip_gen;
    let mut idx = 0;
    let mut faulted = false;
    let mut last_failure = IoStatus::Success;
    for slot in 0..16u8 {
        if !slots.has(slot) {
            continue;
        }
        let s = done.statuses.get(idx).copied().unwrap_or(IoStatus::Success);
        idx += 1;
        if child_fault(s) {
            let t = io.req.io_type;
            if t.writes() {
                st.nexus.log.mark(io.req.offset_blocks, io.req.num_blocks);
            }
            let g = st.nexus.child_failed(
                slot as usize,
                &format!("{} at block {}: {s}", t.name(), io.req.offset_blocks),
                s,
            );
            if g == 0 {
                // The last healthy child: it stays, and the request fails.
                last_failure = s;
            }
            gen = gen.max(g);
            faulted = true;
        } else if !s.is_ok() {
            last_failure = s;
        }
    }
    let status = if !last_failure.is_ok() || done.succeeded() == 0 {
        if last_failure.is_ok() {
            done.first_failure()
        } else {
            last_failure
        }
    } else {
        IoStatus::Success
    };
    if faulted {
        log::debug!("nexus {}: a write completed by the other children", st.nexus.name);
    }
    written(&st.nexus, &io, !faulted && last_failure.is_ok());
    finish(&st, io, status, gen)
}

/// A write-type request came back from its children: the nexus notes what may sit in their
/// volatile caches (`Nexus::note_written`), and a flush every child took ends its epoch.
fn written(n: &Nexus, io: &BdevIo, all_ok: bool) {
    let t = io.req.io_type;
    if t.writes() {
        n.note_written(io.req.offset_blocks, io.req.num_blocks);
    } else if t == IoType::Flush && all_ok {
        if let Some(e) = io.ctx::<Fanned>().and_then(|f| f.epoch) {
            n.flush_done(e);
        }
    }
}

/// Completes a write-type request once the store holds generation `gen` and every core's
/// layout reflects it (`Nexus::covered`).
fn finish(st: &Rc<ChanState>, io: BdevIo, status: IoStatus, gen: u64) {
    if !status.is_ok() || gen <= st.nexus.covered() {
        return io.complete(status);
    }
    st.parked.borrow_mut().push_back(Parked { io, gen, deadline: Instant::now() + STORE_WAIT });
}
