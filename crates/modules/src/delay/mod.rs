//! The delay bdev: a passthru that holds each completed read and write until its deadline, as
//! SPDK's `vbdev_delay`, to give a fast bdev a slow device's latency. A completion from the base
//! waits `avg_*_latency` µs (1 in 100 at random waits `p99_*_latency`) in one of four FIFO
//! queues of its core's channel (average/p99 × read/write); one timer per channel, armed for the
//! earliest head, completes what is due. Other I/O types pass through undelayed. Latencies live
//! in atomics shared by every core, so `bdev_delay_update_latency` affects new I/O on every core
//! (I/O already held keeps its deadline). An abort completes a held I/O as Aborted (or passes
//! on to the base); a reset aborts every held I/O of its channel, as SPDK's does.
//!
//! Without a reactor (unit tests on a plain thread) there is no timer: completions go up at once.

pub mod rpc;

use super::passthru::base::BaseBdev;
use ferrite_bdev::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError};
use ferrite_bdev::channel::IoChannel;
use ferrite_bdev::io::{BdevIo, IoAux, IoStatus, IoType};
use ferrite_reactor::tsc;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "delay";

/// Which latency (SPDK's `latency_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyType {
    /// Average read latency.
    AvgRead = 0,
    /// Average write latency.
    AvgWrite = 1,
    /// 99th-percentile read latency.
    P99Read = 2,
    /// 99th-percentile write latency.
    P99Write = 3,
}

/// The four latencies of a delay bdev, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latencies {
    /// Average read latency.
    pub avg_read: u64,
    /// Average write latency.
    pub avg_write: u64,
    /// 99th-percentile read latency.
    pub p99_read: u64,
    /// 99th-percentile write latency.
    pub p99_write: u64,
}

/// Largest latency accepted, in µs (an hour: larger values are mistakes, and overflow ticks).
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

struct DelayNode {
    base: Arc<BaseBdev>,
    /// Latencies in µs, indexed by `LatencyType`.
    us: [AtomicU64; 4],
    /// The same in ticks.
    ticks: [AtomicU64; 4],
}

impl DelayNode {
    fn set(&self, t: LatencyType, us: u64) {
        self.us[t as usize].store(us, Ordering::Relaxed);
        // Rounded up: an I/O is held at least as long as asked.
        let ticks = (us as u128 * tsc::ticks_per_sec() as u128).div_ceil(1_000_000) as u64;
        self.ticks[t as usize].store(ticks, Ordering::Relaxed);
    }

    fn latencies(&self) -> Latencies {
        let g = |t: LatencyType| self.us[t as usize].load(Ordering::Relaxed);
        Latencies {
            avg_read: g(LatencyType::AvgRead),
            avg_write: g(LatencyType::AvgWrite),
            p99_read: g(LatencyType::P99Read),
            p99_write: g(LatencyType::P99Write),
        }
    }
}

/// A forwarded request's context: its latency class (None: not delayed), and once the base
/// completed it, the deadline it is held until.
#[derive(Debug, Clone, Copy)]
struct Held {
    class: Option<usize>,
    deadline: u64,
}

/// Per-core state, reached from a request's context while it is in flight.
struct DelayCh {
    node: Arc<DelayNode>,
    base: IoChannel,
    lends: bool,
    /// Held completions by class, each in deadline order (their `Held` context), status in
    /// `status`.
    held: RefCell<[VecDeque<BdevIo>; 4]>,
    /// Deadline the armed timer fires at (0: none armed).
    armed: Cell<u64>,
    rng: Cell<u64>,
    me: Weak<DelayCh>,
}

struct DelayChannel(Rc<DelayCh>);

impl DelayCh {
    #[inline]
    fn one_in_100(&self) -> bool {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x.is_multiple_of(100)
    }

    fn submit(&self, mut io: BdevIo) {
        let class = match io.req.io_type {
            IoType::Abort => return self.abort(io),
            IoType::Read if self.one_in_100() => Some(LatencyType::P99Read as usize),
            IoType::Read => Some(LatencyType::AvgRead as usize),
            IoType::Write if self.one_in_100() => Some(LatencyType::P99Write as usize),
            IoType::Write => Some(LatencyType::AvgWrite as usize),
            _ => None,
        };
        io.set_ctx(Held { class, deadline: 0 });
        self.base.forward_then(io, base_done);
    }

    /// Completes held I/Os the abort names; if none, passes the abort to the base.
    fn abort(&self, mut io: BdevIo) {
        let IoAux::Abort { completer, tag } = io.req.aux else {
            return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
        };
        // Every request of a completer may also be with the base: an abort of all goes on.
        if self.abort_held(&|r| r.is_named_by(completer, tag)) == 0 || tag == ferrite_bdev::io::ALL_TAGS {
            io.set_ctx(Held { class: None, deadline: 0 });
            return self.base.forward_then(io, base_done);
        }
        io.complete_deferred(IoStatus::Success);
    }

    /// Completes, as Aborted, the held I/Os `pred` picks; how many.
    fn abort_held(&self, pred: &dyn Fn(&BdevIo) -> bool) -> usize {
        let victims: Vec<BdevIo> = {
            let mut held = self.held.borrow_mut();
            let mut v = Vec::new();
            for q in held.iter_mut() {
                let (hit, keep): (VecDeque<_>, VecDeque<_>) = std::mem::take(q).into_iter().partition(|r| pred(r));
                *q = keep;
                v.extend(hit);
            }
            v
        };
        let n = victims.len();
        for v in victims {
            v.complete_deferred(IoStatus::Aborted);
        }
        n
    }

    /// Holds `io` (completed by the base with `io.status`) until `deadline`.
    fn hold(&self, mut io: BdevIo, class: usize, deadline: u64) {
        io.set_ctx(Held { class: Some(class), deadline });
        self.held.borrow_mut()[class].push_back(io);
        let armed = self.armed.get();
        if armed == 0 || deadline < armed {
            self.arm(deadline);
        }
    }

    fn arm(&self, deadline: u64) {
        self.armed.set(deadline);
        let wait = tsc::ticks_to_nanos(deadline.saturating_sub(tsc::ticks()));
        let me = self.me.clone();
        ferrite_reactor::after(Duration::from_nanos(wait), move || {
            if let Some(ch) = me.upgrade() {
                ch.fire(deadline);
            }
        });
    }

    /// A timer fired: complete what is due, re-arm for the earliest left.
    fn fire(&self, deadline: u64) {
        if self.armed.get() == deadline {
            self.armed.set(0);
        }
        let now = tsc::ticks();
        for class in 0..4 {
            loop {
                let io = {
                    let mut held = self.held.borrow_mut();
                    match held[class].front() {
                        Some(f) if deadline_of(f) <= now => held[class].pop_front(),
                        _ => None,
                    }
                };
                let Some(io) = io else { break };
                let status = io.status;
                io.complete(status);
            }
        }
        let next = self.held.borrow().iter().filter_map(|q| q.front().map(deadline_of)).min();
        if let Some(next) = next {
            let armed = self.armed.get();
            if armed == 0 || next < armed {
                self.arm(next);
            }
        }
    }
}

/// The deadline a held request waits for.
fn deadline_of(io: &BdevIo) -> u64 {
    io.ctx::<Held>().map_or(0, |h| h.deadline)
}

fn base_done(mut parent: BdevIo, status: IoStatus) {
    let class = parent.ctx::<Held>().and_then(|h| h.class);
    let ch = parent.module_channel::<DelayCh>();
    let (Some(class), Some(ch), Some(_)) = (class, ch, ferrite_reactor::current()) else {
        return parent.complete(status);
    };
    let deadline = tsc::ticks() + ch.node.ticks[class].load(Ordering::Relaxed);
    parent.status = status;
    ch.hold(parent, class, deadline);
}

impl BackendChannel for DelayChannel {
    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.0.clone())
    }

    fn lends_reads(&self) -> bool {
        self.0.lends
    }

    #[inline]
    fn submit(&mut self, io: BdevIo) {
        self.0.submit(io);
    }

    fn reset_begins(&mut self) {
        let held = std::mem::take(&mut *self.0.held.borrow_mut());
        for io in held.into_iter().flatten() {
            io.complete_deferred(IoStatus::Aborted);
        }
    }

    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        self.0.abort_held(named)
    }
}

struct DelayBackend {
    node: Arc<DelayNode>,
}

impl BdevBackend for DelayBackend {
    fn destruct(&self, done: ferrite_bdev::Destructed) {
        // Every opener has closed the bdev: the base's descriptor (and its claim) can go.
        self.node.base.close();
        done.finish();
    }

    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let base = self.node.base.channel()?;
        let seed = tsc::ticks() | 1;
        Ok(Box::new(DelayChannel(Rc::new_cyclic(|me| DelayCh {
            node: self.node.clone(),
            base,
            lends: self.node.base.lends_reads(),
            held: RefCell::new(Default::default()),
            armed: Cell::new(0),
            rng: Cell::new(seed),
            me: me.clone(),
        }))))
    }

    fn zcopy(&self) -> bool {
        self.node.base.lends_reads()
    }

    fn base_bdevs(&self) -> Vec<Bdev> {
        vec![self.node.base.bdev().clone()]
    }

    fn driver_specific(&self) -> Value {
        let l = self.node.latencies();
        json!({"delay": {"base_bdev_name": self.node.base.bdev().name(),
            "avg_read_latency": l.avg_read, "p99_read_latency": l.p99_read,
            "avg_write_latency": l.avg_write, "p99_write_latency": l.p99_write}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        // An update may leave a p99 below its average (SPDK's update accepts that, one value at
        // a time); create refuses it, so the saved entry raises the p99 to the average and the
        // config restarts.
        let mut l = self.node.latencies();
        l.p99_read = l.p99_read.max(l.avg_read);
        l.p99_write = l.p99_write.max(l.avg_write);
        Some(json!({"method": "bdev_delay_create", "params": {
            "base_bdev_name": self.node.base.bdev().name(), "name": bdev.name(), "uuid": bdev.uuid().to_string(),
            "avg_read_latency": l.avg_read, "p99_read_latency": l.p99_read,
            "avg_write_latency": l.avg_write, "p99_write_latency": l.p99_write}}))
    }
}

/// Delay nodes by bdev id, for `bdev_delay_update_latency` (per engine).
#[derive(Default)]
struct Nodes(Vec<(u64, std::sync::Weak<DelayNode>)>);

fn nodes() -> ferrite_reactor::StateGuard<Nodes> {
    ferrite_reactor::lock_state::<Nodes>()
}

fn check_latency(us: u64) -> Result<(), BdevError> {
    if us > MAX_LATENCY_US {
        return Err(BdevError::Invalid(format!("latency {us} us exceeds the maximum of {MAX_LATENCY_US} us")));
    }
    Ok(())
}

/// A p99 latency below its average is refused at create, as SPDK does.
fn check_order(l: &Latencies) -> Result<(), BdevError> {
    if l.p99_read < l.avg_read || l.p99_write < l.avg_write {
        return Err(BdevError::Invalid("p99 latencies must not be below the averages".into()));
    }
    Ok(())
}

/// Creates delay bdev `name` over `base_name` (which it opens for writing and claims).
pub fn create(base_name: &str, name: &str, uuid: Option<&str>, l: Latencies) -> Result<Bdev, BdevError> {
    ferrite_bdev::bdev::check_name(name)?;
    let uuid = super::parse_uuid(uuid)?;
    for us in [l.avg_read, l.avg_write, l.p99_read, l.p99_write] {
        check_latency(us)?;
    }
    check_order(&l)?;
    if ferrite_bdev::bdev::lookup(name).is_some() {
        return Err(BdevError::Exists(name.to_string()));
    }
    let base = BaseBdev::open(base_name, MODULE)?;
    let node = Arc::new(DelayNode { base: base.clone(), us: Default::default(), ticks: Default::default() });
    node.set(LatencyType::AvgRead, l.avg_read);
    node.set(LatencyType::AvgWrite, l.avg_write);
    node.set(LatencyType::P99Read, l.p99_read);
    node.set(LatencyType::P99Write, l.p99_write);
    let props = base.props(name.to_string(), uuid, "delay", MODULE);
    let bdev = register(props, Arc::new(DelayBackend { node: node.clone() }))?;
    {
        let mut n = nodes();
        n.0.retain(|(_, w)| w.strong_count() > 0);
        n.0.push((bdev.id(), Arc::downgrade(&node)));
    }
    base.attach(&bdev);
    Ok(bdev)
}

/// Sets one latency of delay bdev `name`; new I/O on every core uses it.
pub fn update_latency(name: &str, t: LatencyType, us: u64) -> Result<(), BdevError> {
    check_latency(us)?;
    let b = ferrite_bdev::bdev::lookup(name)
        .filter(|b| b.module() == MODULE)
        .ok_or_else(|| BdevError::NotFound(format!("{name} (no delay bdev has this name)")))?;
    let node = nodes()
        .0
        .iter()
        .find(|(id, _)| *id == b.id())
        .and_then(|(_, w)| w.upgrade())
        .ok_or_else(|| BdevError::NotFound(name.to_string()))?;
    // As SPDK's: one value at a time, in any order (raising both the average and the p99 passes
    // through a moment where one is below the other).
    node.set(t, us);
    Ok(())
}
