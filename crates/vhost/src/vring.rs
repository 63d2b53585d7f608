//! One virtqueue, served by the reactor it was placed on: a poller takes the guest's requests
//! from the available ring, submits them to the bdev with the guest's buffers as the payload
//! (zero copy), and puts completions on the used ring; the call eventfd is signalled at most once
//! per reactor turn, and only when the driver asks (EVENT_IDX).
//!
//! Kicks: once requests come, the queue tells the driver not to kick (it is polled; in
//! interrupt mode kicks stay on); just before the reactor sleeps, a sleep hook asks for kicks
//! again and looks at the ring once more, so that a sleeping reactor is woken by the kick
//! eventfd's poll on its io_uring and nothing that arrived in between waits.
//!
//! The ring is split or packed ([`crate::ring::Ring`]); for a packed ring the slots below are
//! kept by buffer id, and each request remembers how many ring slots its chain took (the used
//! position moves on by that) and its entry in the packed inflight layout.
//!
//! A driver that breaks the ring's rules (an available index that runs ahead of the ring, a
//! head that is already in flight) gets its queue stopped, with a log line: the device is
//! broken for that guest until the front end resets it; the daemon and every other queue go on.

use crate::blk::{self, Header};
use crate::dirty::DirtyLog;
use crate::inflight::InflightQueue;
use crate::memory::Memory;
use crate::packed::{PackedRing, Pos};
use crate::request::{layout, walk_chain, walk_packed, ChainError, Desc, Layout, Walked};
use crate::ring::{Avail, Ring};
use crate::split::SplitRing;
use ferrite_bdev::{BdevDesc, BdevEvent, Completed, IoBufs, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_reactor::{FdWatch, IoBuf, Lender, PollerId};
use std::cell::RefCell;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;

/// Chains taken from the ring per poll (the rest wait for the next turn).
const BATCH: usize = 64;
/// Descriptors a chain may have beyond its data segments: header, status, and framing that
/// splits them (a longer chain is refused).
const MAX_FRAMING: usize = 8;

/// What a queue needs to know about its device.
#[derive(Debug)]
pub struct Device {
    /// Controller name, for the log.
    pub ctrlr: String,
    /// The bdev served.
    pub bdev: String,
    /// Writes, discards and write zeroes are refused.
    pub readonly: bool,
    /// VIRTIO_F_RING_PACKED is offered (`packed_ring`).
    pub packed_ring: bool,
    /// Most data segments per request (`seg_max`).
    pub seg_max: u32,
    /// The serial GET_ID returns.
    pub serial: [u8; blk::ID_LEN],
    /// Interrupt coalescing, as set now.
    pub coalescing: crate::coalesce::Coalescing,
    /// The driver's cache mode (CONFIG_WCE): false is writethrough, where each write is
    /// flushed before it completes.
    pub writeback: std::sync::atomic::AtomicBool,
}

/// What the control plane hands a reactor to start a queue.
pub struct Setup {
    /// Controller id (unique in the process).
    pub ctrlr_id: u64,
    /// Queue index.
    pub index: u16,
    /// Ring size.
    pub size: u16,
    /// Guest-physical addresses of the descriptor table, available and used rings (packed: the
    /// descriptor ring, driver area and device area).
    pub desc: u64,
    /// See `desc`.
    pub avail: u64,
    /// See `desc`.
    pub used: u64,
    /// Where to start in the available ring (VHOST_USER_SET_VRING_BASE; packed: the slot, with
    /// the wrap counter in bit 15, for both positions: the ring was left with nothing in flight).
    pub next_avail: u16,
    /// The ring is packed (VIRTIO_F_RING_PACKED).
    pub packed: bool,
    /// EVENT_IDX negotiated.
    pub event_idx: bool,
    /// The driver's kick.
    pub kick: File,
    /// The device's call (None: the front end polls).
    pub call: Option<File>,
    /// The guest's memory.
    pub mem: Arc<Memory>,
    /// The device.
    pub dev: Arc<Device>,
    /// This queue's part of the front end's inflight area (INFLIGHT_SHMFD), if it gave one.
    pub inflight: Option<InflightQueue>,
    /// The dirty log, while a migration wants one (VHOST_F_LOG_ALL).
    pub log: Option<Arc<DirtyLog>>,
}

/// A request taken, by head index (packed: by buffer id): `busy` while with the bdev.
#[derive(Clone, Copy, Default)]
struct Slot {
    busy: bool,
    /// Guest-physical address of the status byte.
    status: u64,
    /// Bytes written to the guest, status byte included, on success.
    used_len: u32,
    /// A write in writethrough mode: a flush goes to the bdev before it completes.
    flush_after: bool,
    /// Ring slots its chain took (packed; 1 for split), from when it was taken until its used
    /// entry is written.
    count: u16,
    /// Its entry in the packed inflight layout ([`NO_ENTRY`]: not kept), as long.
    entry: u16,
}

/// A packed request the inflight area does not keep.
const NO_ENTRY: u16 = u16::MAX;

/// A queue's state on its reactor.
struct Vq {
    index: u16,
    ring: Ring,
    /// Guest-physical addresses of the descriptor table, available and used rings.
    addrs: (u64, u64, u64),
    event_idx: bool,
    mem: Arc<Memory>,
    /// Lends the guest's memory to requests (one per queue and memory table).
    keep: Rc<Lender>,
    dev: Arc<Device>,
    kick: FdWatch,
    call: Option<OwnedFd>,
    io: Option<(BdevDesc, IoChannel)>,
    slots: Vec<Slot>,
    in_flight: usize,
    /// Completions put on the used ring since the driver was last considered for a signal.
    to_signal: bool,
    /// Kicks asked for (notifications on).
    kicks_on: bool,
    /// Stopped for good: by the control plane (with who to tell once drained) or broken.
    stopping: Option<Vec<ferrite_reactor::oneshot::Sender<u32>>>,
    broken: bool,
    /// Requests taken, signals sent (for vhost_get_controllers).
    requests: u64,
    signals: u64,
    /// The bdev is being removed: new requests fail.
    removed: bool,
    poller: Option<PollerId>,
    sleep_hook: Option<PollerId>,
    /// This queue as its requests' completer.
    me: std::rc::Weak<VqCell>,
    descs: Vec<Desc>,
    coalesce: crate::coalesce::QueueCoalescing,
    /// Requests in flight, in memory that outlives the daemon.
    inflight: Option<InflightQueue>,
    /// The reactor sleeps after every idle turn: ask for kicks at once.
    interrupt_mode: bool,
    /// Where guest memory written by the device is marked, while a migration runs.
    log: Option<Arc<DirtyLog>>,
    /// The bdev takes flushes (writethrough mode needs them).
    can_flush: bool,
}

/// A queue as its bdev requests' completer.
pub(crate) struct VqCell(RefCell<Vq>);

thread_local! {
    /// This reactor's queues: (controller id, queue index).
    static QUEUES: RefCell<Vec<(u64, u16, Rc<VqCell>)>> = const { RefCell::new(Vec::new()) };
}

fn lender(mem: &Arc<Memory>) -> Rc<Lender> {
    Rc::new(Lender::new(mem.clone()))
}

/// Starts a queue on this reactor (a message from the control plane). Errors say why the
/// queue cannot run (the rings are not in guest memory, the bdev cannot be opened).
pub fn start(mut s: Setup) -> Result<(), String> {
    if !s.mem.covers(s.desc, 16 * s.size as u64) {
        return Err(format!("queue {}: the descriptor table of {} entries is not in guest memory", s.index, s.size));
    }
    let mut inflight = s.inflight.take();
    if inflight.as_ref().is_some_and(|f| f.is_packed() != s.packed) {
        log::warn!(
            "vhost queue {} of controller {}: the inflight area's layout is not the ring's; its requests in flight are not kept",
            s.index,
            s.dev.ctrlr
        );
        inflight = None;
    }
    // After a restart: what the last daemon took and did not complete goes again, first
    // (split: heads; packed: inflight entries).
    let (ring, resubmit) = if s.packed {
        start_packed(&s, inflight.as_mut())?
    } else {
        // The used ring's index, as the driver last saw it: where completions go on from.
        let mut raw = [0u8; 2];
        if !s.mem.read(s.used.wrapping_add(2), &mut raw) {
            return Err(format!("queue {}: the used ring is not in guest memory", s.index));
        }
        let used_idx = u16::from_le_bytes(raw);
        let resubmit = inflight.as_mut().map(|f| f.recover(used_idx)).unwrap_or_default();
        // The front end puts the ring back at its used index; what was taken runs past it.
        let next_avail = s.next_avail.wrapping_add(resubmit.len() as u16);
        let ring = SplitRing::new(s.mem.clone(), s.size, s.avail, s.used, next_avail, used_idx, s.event_idx)
            .map_err(|e| format!("queue {}: {e}", s.index))?;
        (Ring::Split(ring), resubmit)
    };
    if !resubmit.is_empty() {
        log::info!(
            "vhost queue {} of controller {}: {} request(s) in flight before the restart go again",
            s.index,
            s.dev.ctrlr,
            resubmit.len()
        );
    }
    let (ctrlr_id, index) = (s.ctrlr_id, s.index);
    let desc = ferrite_bdev::Bdev::open_ext(&s.dev.bdev, !s.dev.readonly, move |e| on_bdev_event(ctrlr_id, index, e))
        .map_err(|e| format!("queue {}: bdev {}: {e}", s.index, s.dev.bdev))?;
    let ch = desc.channel().map_err(|e| format!("queue {}: bdev {}: {e}", s.index, s.dev.bdev))?;
    let can_flush = desc.bdev().supports(IoType::Flush);
    let kick = FdWatch::new(OwnedFd::from(s.kick)).map_err(|e| format!("queue {}: kick eventfd: {e}", s.index))?;
    let interrupt_mode = ferrite_reactor::engine().mode() == ferrite_reactor::ReactorMode::Interrupt;
    let mut vq = Vq {
        index,
        ring,
        addrs: (s.desc, s.avail, s.used),
        event_idx: s.event_idx,
        keep: lender(&s.mem),
        mem: s.mem,
        dev: s.dev,
        kick,
        call: s.call.map(OwnedFd::from),
        io: Some((desc, ch)),
        slots: vec![Slot::default(); s.size as usize],
        in_flight: 0,
        to_signal: false,
        kicks_on: true,
        stopping: None,
        broken: false,
        requests: 0,
        signals: 0,
        removed: false,
        poller: None,
        sleep_hook: None,
        me: std::rc::Weak::new(),
        descs: Vec::with_capacity(16),
        coalesce: Default::default(),
        inflight: None,
        interrupt_mode,
        log: s.log,
        can_flush,
    };
    // Kicks on from the start (the driver's view of avail_event or the flags is written now).
    vq.ring.enable_kicks();
    let cell = Rc::new(VqCell(RefCell::new(vq)));
    let weak = Rc::downgrade(&cell);
    let poller = ferrite_reactor::register_poller(move || weak.upgrade().is_some_and(|c| c.poll()));
    let weak = Rc::downgrade(&cell);
    let hook =
        ferrite_reactor::register_sleep_hook(move || weak.upgrade().is_some_and(|c| c.0.borrow_mut().before_sleep()));
    {
        let mut vq = cell.0.borrow_mut();
        vq.poller = Some(poller);
        vq.sleep_hook = Some(hook);
        vq.me = Rc::downgrade(&cell);
        vq.inflight = inflight;
    }
    QUEUES.with(|q| q.borrow_mut().push((ctrlr_id, index, cell.clone())));
    {
        let mut vq = cell.0.borrow_mut();
        for head in resubmit {
            // Split: marked in flight again as it is taken; packed: from the entry's copies.
            let more = if vq.ring.is_packed() {
                vq.take_inflight(head)
            } else {
                vq.take(Avail { id: head, slot: head, count: 1 })
            };
            if !more {
                break;
            }
        }
    }
    log::debug!("vhost queue {index} of controller {ctrlr_id} started on reactor {:?}", ferrite_reactor::current());
    Ok(())
}

/// Starts a packed ring: its positions from SET_VRING_BASE, or, when the inflight area knows
/// them (a restart: the front end's value is stale then, as it cannot read a packed ring's
/// positions), from there, past what was in flight; and the entries to resubmit.
fn start_packed(s: &Setup, inflight: Option<&mut InflightQueue>) -> Result<(Ring, Vec<u16>), String> {
    let start = Pos::decode(s.next_avail);
    if start.index >= s.size {
        return Err(format!(
            "queue {}: packed ring position {:#x} is past its {} slots",
            s.index, s.next_avail, s.size
        ));
    }
    let (mem, desc) = (&s.mem, s.desc);
    let used_flags = |slot: u16| {
        let mut b = [0u8; 2];
        mem.read(desc + 16 * slot as u64 + 14, &mut b).then(|| u16::from_le_bytes(b))
    };
    let (used, entries, in_flight) = match inflight {
        Some(f) => {
            let r = f.recover_packed(start, used_flags);
            (r.used, r.entries, r.in_flight)
        }
        None => (start, Vec::new(), 0),
    };
    if used != start {
        log::info!(
            "vhost queue {} of controller {}: the packed ring goes on at slot {} (wrap {}) as the inflight area says, not at {:#x}",
            s.index,
            s.dev.ctrlr,
            used.index,
            used.wrap as u8,
            s.next_avail
        );
    }
    // What was taken and not completed lies between the used position and the available one.
    let avail = used.advance(in_flight, s.size);
    let ring = PackedRing::new(s.mem.clone(), s.size, s.desc, s.avail, s.used, avail, used, s.event_idx)
        .map_err(|e| format!("queue {}: {e}", s.index))?;
    Ok((Ring::Packed(ring), entries))
}

/// Stops queue `index` of controller `ctrlr_id` on this reactor: no new request is taken;
/// `done` gets the ring's base for VHOST_USER_GET_VRING_BASE ([`Ring::base`]) once every
/// request in flight has completed (at once, 0, if the queue is not here).
pub fn stop(ctrlr_id: u64, index: u16, done: ferrite_reactor::oneshot::Sender<u32>) {
    let Some(cell) = find(ctrlr_id, index) else {
        return done.send(0);
    };
    let mut vq = cell.0.borrow_mut();
    vq.stopping.get_or_insert_with(Vec::new).push(done);
    vq.kick.close();
    vq.finish_if_drained();
}

/// Gives this reactor's queues of controller `ctrlr_id` a new memory table (the old one stays
/// mapped until the last request that uses it completes).
pub fn set_memory(ctrlr_id: u64, mem: Arc<Memory>) {
    QUEUES.with(|q| {
        for (_, _, c) in q.borrow().iter().filter(|(id, _, _)| *id == ctrlr_id) {
            let mut vq = c.0.borrow_mut();
            vq.keep = lender(&mem);
            vq.mem = mem.clone();
            // The rings' addresses are guest-physical: the new table maps them anew.
            match vq.ring.remap(mem.clone(), vq.addrs, vq.event_idx) {
                Ok(r) => vq.ring = r,
                Err(e) => vq.break_queue(&format!("new memory table: {e}")),
            }
        }
    });
}

/// Starts (Some) or stops (None) marking what this reactor's queues of controller `ctrlr_id`
/// write to guest memory in a dirty log.
pub fn set_log(ctrlr_id: u64, log: Option<Arc<DirtyLog>>) {
    QUEUES.with(|q| {
        for (_, _, c) in q.borrow().iter().filter(|(id, _, _)| *id == ctrlr_id) {
            let mut vq = c.0.borrow_mut();
            vq.log = log.clone();
            // Kick flags and avail_event may have changed since the last log.
            vq.log_used_ring();
        }
    });
}

/// Gives queue `index` of controller `ctrlr_id` a new call eventfd (None: the front end polls).
pub fn set_call(ctrlr_id: u64, index: u16, call: Option<OwnedFd>) {
    if let Some(cell) = find(ctrlr_id, index) {
        cell.0.borrow_mut().call = call;
    }
}

/// The state of this reactor's queues of controller `ctrlr_id`, for vhost_get_controllers:
/// (index, reactor, size, packed, next available, next used, requests in flight, kicks asked
/// for, broken, signals sent).
pub fn stats(ctrlr_id: u64) -> Vec<QueueStats> {
    let reactor = ferrite_reactor::current().unwrap_or(usize::MAX);
    QUEUES.with(|q| {
        q.borrow()
            .iter()
            .filter(|(id, _, _)| *id == ctrlr_id)
            .map(|(_, i, c)| {
                let vq = c.0.borrow();
                QueueStats {
                    index: *i,
                    reactor,
                    size: vq.ring.size(),
                    packed: vq.ring.is_packed(),
                    next_avail: vq.ring.next_avail(),
                    next_used: vq.ring.next_used(),
                    in_flight: vq.in_flight,
                    kicks_on: vq.kicks_on,
                    broken: vq.broken,
                    requests: vq.requests,
                    signals: vq.signals,
                    bdev_queue_depth: vq.io.as_ref().map_or(0, |(_, ch)| ch.queue_depth()),
                }
            })
            .collect()
    })
}

/// One queue's state (see [`stats`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueStats {
    /// Queue index.
    pub index: u16,
    /// Reactor serving it.
    pub reactor: usize,
    /// Ring size.
    pub size: u16,
    /// The ring is packed.
    pub packed: bool,
    /// Next available entry it takes (packed: the slot, with the wrap counter in bit 15).
    pub next_avail: u16,
    /// Next used entry it fills (as `next_avail`).
    pub next_used: u16,
    /// Requests with the bdev.
    pub in_flight: usize,
    /// The driver is asked to kick.
    pub kicks_on: bool,
    /// Stopped: the driver broke the ring's rules.
    pub broken: bool,
    /// Requests taken since the queue started.
    pub requests: u64,
    /// Call eventfd signals sent.
    pub signals: u64,
    /// Requests of this reactor's channel of the bdev not completed (all its openers').
    pub bdev_queue_depth: u64,
}

/// The queue `index` of controller `ctrlr_id` here: the newest one (a stopped queue leaves the
/// table a moment after it finished, maybe after its successor started).
fn find(ctrlr_id: u64, index: u16) -> Option<Rc<VqCell>> {
    QUEUES.with(|q| q.borrow().iter().rev().find(|(c, i, _)| *c == ctrlr_id && *i == index).map(|(_, _, v)| v.clone()))
}

fn on_bdev_event(ctrlr_id: u64, index: u16, e: BdevEvent) {
    if e != BdevEvent::Remove {
        return;
    }
    if let Some(cell) = find(ctrlr_id, index) {
        let mut vq = cell.0.borrow_mut();
        log::warn!(
            "vhost controller {}: bdev {} is being removed: queue {index} fails new requests",
            vq.dev.ctrlr,
            vq.dev.bdev
        );
        // The channel stays until in-flight requests complete; new ones fail (see `submit`).
        vq.io_removed();
        vq.drop_bdev_if_idle();
    }
}

impl VqCell {
    fn poll(&self) -> bool {
        self.0.borrow_mut().poll()
    }
}

impl Vq {
    fn poll(&mut self) -> bool {
        let mut work = false;
        if self.stopping.is_none() && !self.broken {
            // While kicks are off the ring is polled; the watch is looked at only while they
            // are on (a stray kick waits in the eventfd until then).
            if self.kicks_on && self.kick.take_ready().unwrap_or(false) {
                let _ = self.kick.drain();
                work = true;
            }
            let n = self.take_requests();
            if n > 0 {
                work = true;
                if self.kicks_on && !self.interrupt_mode {
                    // Polled from now on: kicks would only cost the driver.
                    self.ring.disable_kicks();
                    self.log_used_ring();
                    self.kicks_on = false;
                }
            }
        }
        if self.to_signal && self.coalesce.may_signal(&self.dev.coalescing) {
            self.to_signal = false;
            self.signal();
            work = true;
        }
        work
    }

    /// Before the reactor sleeps: asks the driver for kicks again (with EVENT_IDX that is
    /// moving avail_event up to where the queue is, even if kicks were never turned off); true
    /// if requests arrived meanwhile (the reactor then stays up to take them).
    fn before_sleep(&mut self) -> bool {
        if self.to_signal {
            // Held back by coalescing: an idle queue holds nothing back.
            self.to_signal = false;
            self.signal();
        }
        if self.stopping.is_some() || self.broken {
            return false;
        }
        self.kicks_on = true;
        // The watch armed (it wakes the sleep) and emptied; anything already kicked or made
        // available keeps the reactor up.
        let kicked = self.kick.take_ready().unwrap_or(false);
        if kicked {
            let _ = self.kick.drain();
        }
        let more = self.ring.enable_kicks();
        self.log_used_ring();
        more | kicked
    }

    /// Takes up to a batch of requests from the available ring; returns how many.
    fn take_requests(&mut self) -> usize {
        let mut n = 0;
        while n < BATCH {
            let a = match self.ring.pop() {
                Ok(Some(a)) => a,
                Ok(None) => break,
                Err(e) => {
                    self.break_queue(&e.to_string());
                    return n;
                }
            };
            n += 1;
            if !self.take(a) {
                return n;
            }
        }
        n
    }

    /// Notes request `id` as taken (a chain of `count` ring slots); false, with the queue
    /// broken, if the id is not one the ring can have or is already in flight.
    fn claim(&mut self, id: u16, count: u16) -> bool {
        if (id as usize) >= self.slots.len() || self.slots[id as usize].busy {
            let what = if self.ring.is_packed() { "buffer id" } else { "head" };
            self.break_queue(&format!("{what} {id} is already in flight"));
            return false;
        }
        let slot = &mut self.slots[id as usize];
        (slot.count, slot.entry) = (count, NO_ENTRY);
        self.requests += 1;
        self.coalesce.taken();
        true
    }

    /// Takes request `a` (from the ring, or, split, again after a restart): marks it in the
    /// inflight area, walks its chain, lays it out and submits or answers it. False if the
    /// driver broke the ring (the queue stops).
    fn take(&mut self, a: Avail) -> bool {
        if !self.claim(a.id, a.count) {
            return false;
        }
        let entry = match (self.inflight.as_mut(), &self.ring) {
            (Some(f), Ring::Packed(r)) => {
                let size = r.size() as u32;
                f.begin_packed(a.count, |i| r.desc_at(((a.slot as u32 + i as u32) % size) as u16)).unwrap_or(NO_ENTRY)
            }
            (Some(f), Ring::Split(_)) => {
                f.begin(a.id);
                a.id
            }
            (None, _) => NO_ENTRY,
        };
        self.slots[a.id as usize].entry = entry;
        let mut descs = std::mem::take(&mut self.descs);
        let max = self.dev.seg_max as usize + MAX_FRAMING;
        // Borrowed, not cloned: an `Arc` clone per request was a locked instruction that
        // waited for the stores the client's core reads (27% of the queue's time at QD 128).
        let walked = self.ring.walk(&a, &self.mem, self.addrs.0, max, &mut descs);
        self.start_request(a.id, walked, &descs);
        self.descs = descs;
        true
    }

    /// Packed, after a restart: takes the request of inflight `entry` again, from the ring
    /// descriptors the area kept for it (the ring's slots may hold used descriptors by now).
    fn take_inflight(&mut self, entry: u16) -> bool {
        let Some((chain, id)) = self.inflight.as_ref().and_then(|f| f.packed_chain(entry)) else {
            self.break_queue(&format!("inflight entry {entry} changed under the queue"));
            return false;
        };
        let count = chain.len() as u16;
        if !self.claim(id, count) {
            return false;
        }
        self.slots[id as usize].entry = entry;
        let mem = &self.mem;
        let read = |at: u64| {
            let mut b = [0u8; 16];
            mem.read(at, &mut b).then_some(b)
        };
        let mut descs = std::mem::take(&mut self.descs);
        let max = self.dev.seg_max as usize + MAX_FRAMING;
        let walked = walk_packed(|i| chain[i as usize], count, read, max, &mut descs);
        self.start_request(id, walked, &descs);
        self.descs = descs;
        true
    }

    /// Lays out the walked chain of request `head` and submits or answers it.
    fn start_request(&mut self, head: u16, walked: Result<Walked, crate::request::WalkError>, descs: &[Desc]) {
        match walked {
            Ok(w) => {
                // An overlong chain lays out as too many segments: IOERR into its status byte.
                let seg_max = if w == Walked::Overlong { 0 } else { self.dev.seg_max as usize };
                let mem = &self.mem;
                // A request whose completion cannot be reported is not executed.
                let parsed = layout(descs, seg_max, |a, b| mem.read(a, b)).and_then(|l| {
                    if mem.covers(l.status, 1) {
                        Ok(l)
                    } else {
                        Err(ChainError::NoStatus)
                    }
                });
                match parsed {
                    Ok(l) => self.submit(head, l),
                    Err(e) => self.refuse_chain(head, e),
                }
            }
            Err(e) => {
                ferrite_reactor::log_limited!(
                    log::Level::Warn,
                    "vhost controller {} queue {}: descriptor chain of head {head} refused: {e:?}",
                    self.dev.ctrlr,
                    self.index
                );
                self.put_used(head, 0);
            }
        }
    }

    fn refuse_chain(&mut self, head: u16, e: ChainError) {
        ferrite_reactor::log_limited!(
            log::Level::Warn,
            "vhost controller {} queue {}: malformed request (head {head}): {e:?}",
            self.dev.ctrlr,
            self.index
        );
        match e.status() {
            Some(status) => self.answer(head, status, blk::S_IOERR, 1),
            None => self.put_used(head, 0),
        }
    }

    /// Completes a request that never reached the bdev.
    fn answer(&mut self, head: u16, status: u64, code: u8, used_len: u32) {
        if !self.mem.write(status, &[code]) {
            return self.put_used(head, 0);
        }
        self.put_used(head, used_len);
    }

    fn put_used(&mut self, head: u16, len: u32) {
        if self.log.is_some() {
            self.log_chain(head);
        }
        // Packed: the ring slots the chain took and its inflight entry (noted when taken).
        let Slot { count, entry, .. } = self.slots[head as usize];
        match self.inflight.as_mut() {
            Some(f) if f.is_packed() => f.completing_packed(entry, count),
            Some(f) => f.completing(head),
            None => {}
        }
        // Packed: the used descriptor's guest-physical range (for a dirty log).
        let _written = self.ring.push_used(head, len, count);
        match self.inflight.as_ref() {
            Some(f) if f.is_packed() => f.completed_packed(entry),
            Some(f) => f.completed(head, self.ring.next_used()),
            None => {}
        }
        self.log_used_ring();
        self.to_signal = true;
    }

    /// Marks, in the dirty log, the device-writable buffers of chain `head` (read data, IDs,
    /// status), which the device has written by the time it completes the chain. The chain is
    /// walked again: the driver may not change it while it is in flight, and a driver that does
    /// only loses its own data to the migration.
    fn log_chain(&mut self, head: u16) {
        let Some(log) = self.log.clone() else { return };
        // Packed rings offer no LOG_ALL (`backend::Session::offered`): their chains may be
        // overwritten by used descriptors before they complete.
        debug_assert!(!self.ring.is_packed(), "a dirty log on a packed ring");
        let mem = self.mem.clone();
        let read = |a: u64| {
            let mut b = [0u8; 16];
            mem.read(a, &mut b).then_some(b)
        };
        let mut descs = std::mem::take(&mut self.descs);
        let limit = self.dev.seg_max as usize + MAX_FRAMING;
        if walk_chain(read, self.addrs.0, self.ring.size(), head, limit, &mut descs).is_ok() {
            for d in descs.iter().filter(|d| d.write) {
                log.mark(d.addr, d.len as u64);
            }
        }
        self.descs = descs;
    }

    /// Marks the used ring (entries, index, flags, avail_event) in the dirty log.
    fn log_used_ring(&self) {
        if let Some(log) = self.log.as_ref() {
            log.mark(self.addrs.2, 6 + 8 * self.ring.size() as u64);
        }
    }

    fn submit(&mut self, head: u16, l: Layout) {
        let Header { kind, sector } = l.header;
        let readonly = self.dev.readonly;
        let Some((_, ch)) = self.io.as_ref() else {
            return self.answer(head, l.status, blk::S_IOERR, 1);
        };
        let bs = ch.block_size() as u64;
        let blocks = |sector: u64, bytes: u64| -> Option<(u64, u64)> {
            let off = sector.checked_mul(blk::SECTOR)?;
            (off.is_multiple_of(bs) && bytes.is_multiple_of(bs)).then_some((off / bs, bytes / bs))
        };
        let req = match kind {
            blk::T_IN | blk::T_OUT => {
                if kind == blk::T_OUT && readonly {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                }
                let Some((off, n)) = blocks(sector, l.data_len) else {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                };
                let mut bufs = IoBufs::new();
                let keep = &self.keep;
                let mem = &self.mem;
                let whole = l.data.iter().all(|&(a, len)| {
                    mem.host_pieces(a, len as u64, |p, n| {
                        // SAFETY: guest memory the driver handed to the device for this request,
                        // mapped while `keep` (held by the view) lives.
                        bufs.push(unsafe { IoBuf::external(p, n, keep.clone()) })
                    })
                });
                if !whole {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                }
                let io_type = if kind == blk::T_IN { IoType::Read } else { IoType::Write };
                let mut r = IoRequest::new(io_type, off, n);
                r.bufs = bufs;
                r
            }
            blk::T_FLUSH => IoRequest::no_payload(IoType::Flush, 0, 0),
            blk::T_GET_ID => {
                let mut written = 0u32;
                for &(a, len) in &l.data {
                    let take = (len as usize).min(blk::ID_LEN - written as usize);
                    let src = &self.dev.serial[written as usize..written as usize + take];
                    if take > 0 && !self.mem.write(a, src) {
                        return self.answer(head, l.status, blk::S_IOERR, 1);
                    }
                    written += take as u32;
                }
                return self.answer(head, l.status, blk::S_OK, written + 1);
            }
            blk::T_DISCARD | blk::T_WRITE_ZEROES => {
                if readonly {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                }
                // One segment (max_discard_seg and max_write_zeroes_seg are 1), however framed.
                let mut raw = [0u8; blk::SEGMENT_LEN];
                if l.data_len != blk::SEGMENT_LEN as u64 {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                }
                let mut at = 0usize;
                for &(a, len) in &l.data {
                    if !self.mem.read(a, &mut raw[at..at + len as usize]) {
                        return self.answer(head, l.status, blk::S_IOERR, 1);
                    }
                    at += len as usize;
                }
                let seg = blk::Segment::decode(&raw);
                let Some((off, n)) = blocks(seg.sector, seg.num_sectors as u64 * blk::SECTOR) else {
                    return self.answer(head, l.status, blk::S_IOERR, 1);
                };
                let t = if kind == blk::T_DISCARD { IoType::Unmap } else { IoType::WriteZeroes };
                IoRequest::no_payload(t, off, n)
            }
            _ => {
                return self.answer(head, l.status, blk::S_UNSUPP, 1);
            }
        };
        let used_len = if kind == blk::T_IN { l.data_len as u32 + 1 } else { 1 };
        let flush_after =
            kind == blk::T_OUT && !self.dev.writeback.load(std::sync::atomic::Ordering::Relaxed) && self.can_flush;
        let slot = &mut self.slots[head as usize];
        (slot.busy, slot.status, slot.used_len, slot.flush_after) = (true, l.status, used_len, flush_after);
        self.in_flight += 1;
        // This queue itself (not a successor with the same index).
        let me: Rc<dyn IoCompleter> = self.me.upgrade().expect("a running queue is alive");
        ch.submit(req, me, head as u64);
    }

    fn completed(&mut self, head: u16, status: IoStatus) {
        if status == IoStatus::Success && self.slots[head as usize].flush_after {
            // Writethrough: the write is done once the bdev's cache is flushed.
            if let Some((_, ch)) = self.io.as_ref() {
                self.slots[head as usize].flush_after = false;
                let me: Rc<dyn IoCompleter> = self.me.upgrade().expect("a running queue is alive");
                ch.submit(IoRequest::no_payload(IoType::Flush, 0, 0), me, head as u64);
                return;
            }
        }
        // Not busy from now on; the chain's slot count and entry stay for `put_used`.
        let slot = self.slots[head as usize];
        self.slots[head as usize].busy = false;
        debug_assert!(slot.busy, "a completion for head {head}, which is not in flight");
        debug_assert!(self.in_flight > 0, "completions outnumber submissions");
        self.in_flight -= 1;
        let (code, len) = match status {
            IoStatus::Success => (blk::S_OK, slot.used_len),
            IoStatus::Unsupported => (blk::S_UNSUPP, 1),
            _ => (blk::S_IOERR, 1),
        };
        self.answer(head, slot.status, code, len);
        self.drop_bdev_if_idle();
        self.finish_if_drained();
    }

    fn signal(&mut self) {
        if self.call.is_none() {
            return;
        }
        if self.ring.needs_signal() {
            let Some(call) = self.call.as_ref() else { return };
            self.signals += 1;
            if let Err(e) = ferrite_reactor::eventfd::signal(call.as_fd()) {
                ferrite_reactor::log_limited!(
                    log::Level::Warn,
                    "vhost controller {} queue {}: call eventfd: {e}",
                    self.dev.ctrlr,
                    self.index
                );
            }
        }
    }

    fn break_queue(&mut self, why: &str) {
        if !self.broken {
            log::error!(
                "vhost controller {} queue {}: the driver broke the ring ({why}); the queue stops until the front end resets it",
                self.dev.ctrlr,
                self.index
            );
        }
        self.broken = true;
    }

    /// The bdev is going away: new requests fail from now on.
    fn io_removed(&mut self) {
        self.removed = true;
    }

    fn drop_bdev_if_idle(&mut self) {
        if self.removed && self.in_flight == 0 {
            self.io = None;
        }
    }

    fn finish_if_drained(&mut self) {
        if self.in_flight > 0 || self.stopping.is_none() {
            return;
        }
        if self.to_signal {
            self.to_signal = false;
            self.signal();
        }
        let next = self.ring.base();
        log::info!(
            "vhost controller {}: queue {} stopped after {} requests ({} signals)",
            self.dev.ctrlr,
            self.index,
            self.requests,
            self.signals
        );
        for tx in self.stopping.take().unwrap_or_default() {
            tx.send(next);
        }
        if let Some(p) = self.poller.take() {
            ferrite_reactor::unregister_poller(p);
        }
        if let Some(h) = self.sleep_hook.take() {
            ferrite_reactor::unregister_sleep_hook(h);
        }
        // Leaves the table after this borrow ends (the table's entry may be the last owner);
        // this entry only: a successor with the same index may be there by then.
        let me = self.me.clone();
        ferrite_reactor::spawn_local(async move {
            QUEUES.with(|q| q.borrow_mut().retain(|(_, _, c)| !std::ptr::eq(Rc::as_ptr(c), me.as_ptr())));
        })
        .detach();
    }
}

impl IoCompleter for VqCell {
    fn io_done(&self, tag: u64, io: Completed) {
        let status = io.status;
        drop(io);
        self.0.borrow_mut().completed(tag as u16, status);
    }
}
