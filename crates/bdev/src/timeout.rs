//! Per-descriptor I/O timeouts (SPDK's `spdk_bdev_set_timeout`): a callback hears of every
//! request submitted through the descriptor that has been outstanding longer than the timeout,
//! on the core that submitted it, and may have it aborted; a request aborted that way completes
//! with `IoStatus::TimedOut`.
//!
//! Channels track their outstanding requests only while a descriptor of their bdev has a
//! timeout: a slot per request (submit time, descriptor, what the callback is told) in a
//! per-channel table whose index travels in the request, so completion frees it in O(1) and
//! the table, once grown to the queue depth, allocates nothing. A 100 ms timer per channel
//! checks the table. With no timeout set the cost is one `Cell<bool>` test per submission and
//! one test of a field of the request at completion.
//!
//! Each request is reported once (SPDK reports it on every one-second poll until it completes).
//! Abort reaches requests waiting in the layer and those the module can stop, as an abort
//! request does (`IoType::Abort`).

use crate::bdev::Bdev;
use crate::channel::ChannelInner;
use crate::io::{BdevIo, IoState, IoStatus, IoType};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a channel with tracked requests looks for ones past their timeout.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What a timeout callback is told about a request past its descriptor's timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOutIo {
    /// Its type.
    pub io_type: IoType,
    /// First block.
    pub offset_blocks: u64,
    /// Number of blocks.
    pub num_blocks: u64,
    /// The tag it was submitted with (None for a virtual bdev's child request without one).
    pub tag: Option<u64>,
    /// How long it has been outstanding.
    pub outstanding: Duration,
    /// The reactor it was submitted on (None off the reactors).
    pub core: Option<usize>,
}

/// A descriptor's timeout callback: returns true to abort the request (it then completes with
/// `IoStatus::TimedOut`), false to let it run on.
pub type TimeoutCallback = Arc<dyn Fn(&TimedOutIo) -> bool + Send + Sync>;

struct DescTimeout {
    desc: u64,
    ticks: u64,
    cb: TimeoutCallback,
}

/// The timeouts set on a bdev's descriptors.
#[derive(Default)]
pub(crate) struct TimeoutShared(Mutex<Vec<DescTimeout>>);

impl TimeoutShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DescTimeout>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn any(&self) -> bool {
        !self.lock().is_empty()
    }
}

#[derive(Clone, Copy)]
struct Slot {
    desc: u64,
    submit_tick: u64,
    io_type: IoType,
    offset_blocks: u64,
    num_blocks: u64,
    tag: Option<u64>,
    /// The caller identity an abort request names it by (None for a child request).
    caller: Option<(usize, u64)>,
    live: bool,
    reported: bool,
    /// The callback asked for an abort: an Aborted completion becomes TimedOut.
    aborting: bool,
}

/// A channel's table of outstanding requests (used only while timeouts are set).
pub(crate) struct ChannelTimeouts {
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
    live: Cell<usize>,
    timer: Cell<bool>,
}

impl ChannelTimeouts {
    pub(crate) fn new() -> Self {
        ChannelTimeouts {
            slots: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            live: Cell::new(0),
            timer: Cell::new(false),
        }
    }
}

/// Starts tracking `io`, submitted through descriptor `desc` (called while `on`).
pub(crate) fn track(ch: &ChannelInner, io: &mut BdevIo, desc: u64) {
    let slot = Slot {
        desc,
        submit_tick: io.submit_tick,
        io_type: io.req.io_type,
        offset_blocks: io.req.offset_blocks,
        num_blocks: io.req.num_blocks,
        tag: io.caller_id().map(|(_, t)| t),
        caller: io.caller_id(),
        live: true,
        reported: false,
        aborting: false,
    };
    let t = &ch.timeouts;
    let mut slots = t.slots.borrow_mut();
    let i = match t.free.borrow_mut().pop() {
        Some(i) => {
            slots[i as usize] = slot;
            i
        }
        None => {
            slots.push(slot);
            (slots.len() - 1) as u32
        }
    };
    t.live.set(t.live.get() + 1);
    io.track = i + 1;
}

/// Stops tracking a completing request; returns its status (TimedOut for one aborted because
/// of its timeout).
pub(crate) fn untrack(ch: &ChannelInner, st: &mut IoState, status: IoStatus) -> IoStatus {
    let i = st.track - 1;
    st.track = 0;
    let t = &ch.timeouts;
    let mut slots = t.slots.borrow_mut();
    let Some(s) = slots.get_mut(i as usize) else { return status };
    s.live = false;
    t.free.borrow_mut().push(i);
    t.live.set(t.live.get() - 1);
    if s.aborting && status == IoStatus::Aborted {
        IoStatus::TimedOut
    } else {
        status
    }
}

/// Starts tracking on this core's channel of the bdev, if it has one.
fn enable_local(bdev_id: u64) {
    if let Some(ch) = crate::channel::local_channel(bdev_id) {
        enable(&ch);
    }
}

fn enable(ch: &Rc<ChannelInner>) {
    if ch.timeouts_on.replace(true) {
        return;
    }
    arm(ch);
}

/// A new channel tracks from the start if its bdev has timeouts.
pub(crate) fn channel_created(ch: &Rc<ChannelInner>) {
    if ch.bdev.timeouts.any() {
        enable(ch);
    }
}

fn arm(ch: &Rc<ChannelInner>) {
    if ferrite_reactor::current().is_none() || ch.timeouts.timer.replace(true) {
        return;
    }
    let me = Rc::downgrade(ch);
    ferrite_reactor::after(POLL_INTERVAL, move || {
        if let Some(ch) = me.upgrade() {
            ch.timeouts.timer.set(false);
            poll(&ch);
        }
    });
}

/// Reports (and aborts, if asked) this channel's requests past their timeout.
fn poll(ch: &Rc<ChannelInner>) {
    let cfg: Vec<(u64, u64, TimeoutCallback)> =
        ch.bdev.timeouts.lock().iter().map(|d| (d.desc, d.ticks, d.cb.clone())).collect();
    if cfg.is_empty() && ch.timeouts.live.get() == 0 {
        ch.timeouts_on.set(false);
        return;
    }
    let now = ferrite_reactor::tsc::ticks();
    let core = ferrite_reactor::current();
    let mut due = Vec::new();
    for (i, s) in ch.timeouts.slots.borrow_mut().iter_mut().enumerate() {
        if !s.live || s.reported {
            continue;
        }
        let age = now.wrapping_sub(s.submit_tick);
        if let Some((_, _, cb)) = cfg.iter().find(|(d, ticks, _)| *d == s.desc && age > *ticks) {
            s.reported = true;
            let info = TimedOutIo {
                io_type: s.io_type,
                offset_blocks: s.offset_blocks,
                num_blocks: s.num_blocks,
                tag: s.tag,
                outstanding: Duration::from_nanos(ferrite_reactor::tsc::ticks_to_nanos(age)),
                core,
            };
            due.push((i as u32, info, cb.clone()));
        }
    }
    // No borrow is held while callbacks run: they may submit I/O.
    for (i, info, cb) in due {
        if cb(&info) {
            abort(ch, i);
        }
    }
    arm(ch);
}

/// Aborts tracked request `i` of `ch` because its timeout's callback asked: by an abort request
/// naming it, which goes where any abort goes (the layer's queues, then the module, which may
/// pass it down the stack to where the request waits), or, for a request with no caller
/// identity, by the layer's queues and the module's own `abort`.
fn abort(ch: &Rc<ChannelInner>, i: u32) {
    let caller = match ch.timeouts.slots.borrow_mut().get_mut(i as usize) {
        Some(s) if s.live => {
            s.aborting = true;
            s.caller
        }
        _ => return,
    };
    match caller {
        Some((completer, tag)) => {
            let mut req = crate::io::IoRequest::new(IoType::Abort, 0, 0);
            req.aux = crate::io::IoAux::Abort { completer, tag };
            let done = Rc::new(AbortDone { ch: Rc::downgrade(ch), slot: i });
            let mut io = BdevIo::new(req, ch.clone(), ferrite_reactor::tsc::ticks());
            io.done = crate::io::Done::Caller(done, 0);
            ch.route(io);
        }
        None => {
            if ch.abort_matching(&|io: &BdevIo| io.track == i + 1) == 0 {
                not_aborted(ch, i);
            }
        }
    }
}

/// The answer to a timeout's abort request.
struct AbortDone {
    ch: std::rc::Weak<ChannelInner>,
    slot: u32,
}

impl crate::io::IoCompleter for AbortDone {
    fn io_done(&self, _tag: u64, io: crate::io::Completed) {
        if io.status != crate::io::IoStatus::Success {
            if let Some(ch) = self.ch.upgrade() {
                not_aborted(&ch, self.slot);
            }
        }
    }
}

/// Nothing could stop the timed-out request: it completes as it will, with its own status.
fn not_aborted(ch: &ChannelInner, i: u32) {
    log::warn!("bdev {}: a timed-out request could not be aborted", ch.bdev.name.escape_debug());
    if let Some(s) = ch.timeouts.slots.borrow_mut().get_mut(i as usize) {
        s.aborting = false;
    }
}

/// Visits this channel's outstanding requests (tracked ones: see [`crate::BdevDesc::track_io`]),
/// oldest slot first; returns how many.
pub(crate) fn for_each(ch: &ChannelInner, f: &mut dyn FnMut(&TimedOutIo)) -> usize {
    let now = ferrite_reactor::tsc::ticks();
    let core = ferrite_reactor::current();
    let live: Vec<TimedOutIo> = ch
        .timeouts
        .slots
        .borrow()
        .iter()
        .filter(|s| s.live)
        .map(|s| TimedOutIo {
            io_type: s.io_type,
            offset_blocks: s.offset_blocks,
            num_blocks: s.num_blocks,
            tag: s.tag,
            outstanding: Duration::from_nanos(ferrite_reactor::tsc::ticks_to_nanos(now.wrapping_sub(s.submit_tick))),
            core,
        })
        .collect();
    live.iter().for_each(f);
    live.len()
}

/// Makes every channel of `bdev` track its outstanding requests while descriptor `desc` is open
/// (a timeout that never expires), so that `IoChannel::for_each_io` sees them.
pub(crate) fn track_only(bdev: &Bdev, desc: u64) {
    set_ticks(bdev, desc, Some((u64::MAX, Arc::new(|_: &TimedOutIo| false))));
}

/// Sets (secs > 0) or clears (0) the timeout of descriptor `desc` of `bdev`; tracking starts at
/// once on this core and, by message, on every other core of the calling reactor's engine.
pub(crate) fn set(bdev: &Bdev, desc: u64, secs: u64, cb: Option<TimeoutCallback>) {
    let timeout = match (secs > 0, cb) {
        (true, Some(cb)) => Some((ferrite_reactor::tsc::duration_to_ticks(Duration::from_secs(secs)), cb)),
        _ => None,
    };
    set_ticks(bdev, desc, timeout)
}

/// Sets or clears (None) the timeout, in ticks, of descriptor `desc` of `bdev`.
fn set_ticks(bdev: &Bdev, desc: u64, timeout: Option<(u64, TimeoutCallback)>) {
    {
        let mut l = bdev.0.timeouts.lock();
        l.retain(|d| d.desc != desc);
        match timeout {
            Some((ticks, cb)) => l.push(DescTimeout { desc, ticks, cb }),
            None => return,
        }
    }
    let id = bdev.id();
    enable_local(id);
    let engine = match ferrite_reactor::current() {
        Some(_) => Some(ferrite_reactor::engine()),
        None => bdev.0.state.lock().unwrap().descs.iter().find_map(|d| d.core.as_ref().map(|c| c.1.clone())),
    };
    if let Some(e) = engine {
        drop(e.on_all(move |_| enable_local(id)));
    }
}
