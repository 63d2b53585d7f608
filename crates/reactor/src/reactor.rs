//! Reactors: one pinned thread per core, each running a loop over its mailbox, local tasks,
//! pollers, timers and io_uring completions, and sleeping when idle (by mode).

use crate::blocking::BlockingPool;
use crate::buf::{BufPool, BufPoolConfig, IoBuf};
use crate::context::Extensions;
use crate::fixedmem::LocalMem;
use crate::mailbox::Mailbox;
use crate::oneshot;
use crate::pbuf::{BufGroup, RecvBufConfig, RecvBufStats, RECV_BGID};
use crate::ring::Ring;
use crate::tsc::{duration_to_ticks, ticks, ticks_per_sec};
use async_task::{Runnable, Task};
use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

/// How a reactor behaves when it has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactorMode {
    /// Busy-poll forever: lowest latency, one full core.
    Poll,
    /// Sleep in io_uring_enter whenever a loop turn finds no work.
    Interrupt,
    /// Poll while work arrives; sleep after [`EngineConfig::adaptive_idle`] without work, or at
    /// once when a turn finds nothing to do but requests that io-wq workers complete.
    Adaptive,
}

impl std::str::FromStr for ReactorMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poll" => Ok(Self::Poll),
            "interrupt" => Ok(Self::Interrupt),
            "adaptive" => Ok(Self::Adaptive),
            _ => Err(format!("unknown reactor mode {s:?} (expected poll, interrupt or adaptive)")),
        }
    }
}

impl ReactorMode {
    /// The mode's name as accepted by `--reactor-mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Interrupt => "interrupt",
            Self::Adaptive => "adaptive",
        }
    }
}

/// Settings of an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CPU numbers, one reactor each; reactor `i` runs on `cores[i]`.
    pub cores: Vec<usize>,
    /// Idle behaviour.
    pub mode: ReactorMode,
    /// How long an adaptive reactor polls without work before it sleeps.
    pub adaptive_idle: Duration,
    /// Submission queue size of each reactor's io_uring.
    pub ring_entries: u32,
    /// Initial size of each ring's handler table (operations in flight; every idle socket keeps
    /// a receive pending). It grows on demand up to `ring::MAX_HANDLERS`.
    pub ring_handlers: usize,
    /// Buffer pool sizes per reactor.
    pub bufs: BufPoolConfig,
    /// Each reactor's provided buffer ring for socket receives (`count: 0` turns multishot
    /// receive off: sockets then receive one-shot into buffers of their own).
    pub recv_bufs: RecvBufConfig,
    /// Pin each reactor thread to its core.
    pub pin: bool,
    /// Fixed-buffer slots of each ring for external memory ([`crate::FixedMem`]): one per
    /// chunk of up to 1 GiB of a registered region. Past them, regions stay unregistered.
    pub fixed_mem_slots: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            cores: vec![0],
            mode: ReactorMode::Adaptive,
            adaptive_idle: Duration::from_micros(500),
            ring_entries: 512,
            ring_handlers: 8192,
            bufs: BufPoolConfig::default(),
            recv_bufs: RecvBufConfig::default(),
            pin: true,
            fixed_mem_slots: 1022,
        }
    }
}

/// What other threads may see of a reactor.
struct ReactorShared {
    core: usize,
    mailbox: Arc<Mailbox>,
    busy_ticks: AtomicU64,
    idle_ticks: AtomicU64,
    sleeps: AtomicU64,
    /// Loop turns so far (stored by the reactor once per turn, next to the tick counters).
    turns: AtomicU64,
    /// Pollers registered (stored when the list changes).
    pollers: AtomicU64,
    /// Tick at which the reactor went to sleep, 0 while awake (so readers can count the
    /// current sleep as idle time).
    asleep_since: AtomicU64,
}

struct Shared {
    reactors: Vec<ReactorShared>,
    mode: ReactorMode,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    blocking: Arc<BlockingPool>,
    /// State of the layers above, per engine (see [`crate::context`]).
    ext: Extensions,
    /// The reactors run on one thread under [`crate::sim::Sim`].
    simulated: bool,
}

/// A handle to a running set of reactors. Cheap to clone; usable from any thread.
#[derive(Clone)]
pub struct Engine(Arc<Shared>);

/// A snapshot of one reactor's counters.
#[derive(Debug, Clone, Copy)]
pub struct ReactorStats {
    /// Reactor index.
    pub id: usize,
    /// CPU the reactor runs on.
    pub core: usize,
    /// Ticks spent in loop turns that did work.
    pub busy_ticks: u64,
    /// Ticks spent in loop turns that found nothing to do (including sleep).
    pub idle_ticks: u64,
    /// Times the reactor went to sleep.
    pub sleeps: u64,
    /// Loop turns run.
    pub turns: u64,
    /// Pollers registered on the reactor.
    pub pollers: u64,
    /// True while the reactor sleeps (waits for a message, a completion or a timer).
    pub sleeping: bool,
}

impl Engine {
    /// Makes an engine's shared part, with no reactor running yet.
    fn new_shared(cfg: &EngineConfig, simulated: bool) -> std::io::Result<Engine> {
        if cfg.cores.is_empty() {
            return Err(std::io::Error::other("no cores selected"));
        }
        let mut reactors = Vec::new();
        for &core in &cfg.cores {
            reactors.push(ReactorShared {
                core,
                mailbox: Arc::new(Mailbox::new()?),
                busy_ticks: AtomicU64::new(0),
                idle_ticks: AtomicU64::new(0),
                sleeps: AtomicU64::new(0),
                turns: AtomicU64::new(0),
                pollers: AtomicU64::new(0),
                asleep_since: AtomicU64::new(0),
            });
        }
        Ok(Engine(Arc::new(Shared {
            reactors,
            mode: cfg.mode,
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            blocking: Arc::new(BlockingPool::new()),
            ext: Extensions::default(),
            simulated,
        })))
    }

    /// Starts one reactor per configured core and waits until all are running. The calling
    /// thread is entered into the new engine (see [`crate::context`]) until [`Engine::join`].
    pub fn start(cfg: EngineConfig) -> std::io::Result<Engine> {
        let engine = Self::new_shared(&cfg, false)?;
        crate::panic::install_hook();
        ticks_per_sec();
        let mut readies = Vec::new();
        for id in 0..cfg.cores.len() {
            let (tx, rx) = oneshot::channel::<std::io::Result<()>>();
            let eng = engine.clone();
            let cfg = cfg.clone();
            let handle = std::thread::Builder::new()
                .name(format!("reactor_{id}"))
                .spawn(move || reactor_main(eng, id, cfg, tx))?;
            engine.0.threads.lock().unwrap().push(handle);
            readies.push(rx);
        }
        for (id, rx) in readies.into_iter().enumerate() {
            let res = rx.wait().unwrap_or_else(|_| Err(std::io::Error::other("reactor thread died")));
            if let Err(e) = res {
                engine.stop();
                engine.join();
                return Err(std::io::Error::new(e.kind(), format!("reactor {id} on core {}: {e}", cfg.cores[id])));
            }
        }
        crate::context::enter_unguarded(&engine);
        Ok(engine)
    }

    /// Makes an engine whose reactors the simulator runs on the calling thread.
    pub(crate) fn simulated(cfg: &EngineConfig) -> std::io::Result<Engine> {
        Self::new_shared(cfg, true)
    }

    /// Enters the calling thread into this engine until the guard drops: state that layers
    /// keep per engine ([`crate::engine_state`]) is then this engine's for calls made here.
    pub fn enter(&self) -> crate::context::EnterGuard {
        crate::context::enter(self)
    }

    /// True if both handles are the same engine.
    pub fn same(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// True if the simulator runs this engine's reactors.
    pub fn is_simulated(&self) -> bool {
        self.0.simulated
    }

    pub(crate) fn extensions(&self) -> &Extensions {
        &self.0.ext
    }

    pub(crate) fn mailbox(&self, id: usize) -> &Arc<Mailbox> {
        &self.0.reactors[id].mailbox
    }

    /// Number of reactors.
    pub fn count(&self) -> usize {
        self.0.reactors.len()
    }

    /// CPU of reactor `id`.
    pub fn core_of(&self, id: usize) -> usize {
        self.0.reactors[id].core
    }

    /// The configured idle mode.
    pub fn mode(&self) -> ReactorMode {
        self.0.mode
    }

    /// Runs `f` on reactor `id` (from any thread, including that reactor). A closure of up to
    /// [`crate::mailbox::INLINE_BYTES`] bytes is sent without a heap allocation (while the
    /// target's ring of [`crate::mailbox::RING_SLOTS`] messages has room); bigger ones are boxed.
    /// After the engine stopped, `f` is dropped unrun.
    #[inline]
    pub fn send(&self, id: usize, f: impl FnOnce() + Send + 'static) {
        self.0.reactors[id].mailbox.post_fn(f);
    }

    /// Runs `f` on reactor `id` and delivers its result.
    pub fn call<T: Send + 'static>(&self, id: usize, f: impl FnOnce() -> T + Send + 'static) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        self.send(id, move || tx.send(f()));
        rx
    }

    /// Starts the future made by `f` as a task on reactor `id` and delivers its output.
    /// The future itself need not be `Send`.
    pub fn run_async<F, Fut>(&self, id: usize, f: F) -> oneshot::Receiver<Fut::Output>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.send(id, move || {
            let fut = f();
            spawn_local(async move { tx.send(fut.await) }).detach();
        });
        rx
    }

    /// Runs `f(reactor_id)` on every reactor and delivers the results in reactor order.
    pub fn on_all<T, F>(&self, f: F) -> oneshot::Receiver<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(usize) -> T + Send + Sync + 'static,
    {
        struct Gather<T> {
            results: Mutex<Vec<Option<T>>>,
            left: std::sync::atomic::AtomicUsize,
            tx: Mutex<Option<oneshot::Sender<Vec<T>>>>,
        }
        let (tx, rx) = oneshot::channel();
        let n = self.count();
        let g = Arc::new(Gather {
            results: Mutex::new((0..n).map(|_| None).collect()),
            left: std::sync::atomic::AtomicUsize::new(n),
            tx: Mutex::new(Some(tx)),
        });
        let f = Arc::new(f);
        for id in 0..n {
            let (g, f) = (g.clone(), f.clone());
            self.send(id, move || {
                let v = f(id);
                g.results.lock().unwrap()[id] = Some(v);
                if g.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let all = g
                        .results
                        .lock()
                        .unwrap()
                        .iter_mut()
                        .map(|v| v.take().expect("every reactor answered"))
                        .collect();
                    if let Some(tx) = g.tx.lock().unwrap().take() {
                        tx.send(all);
                    }
                }
            });
        }
        rx
    }

    /// Asks every reactor to leave its loop, at the end of its current turn even if it is busy.
    /// Pending messages, tasks, pollers and timers are dropped (on their reactor); messages
    /// sent later are dropped by their sender. Idle blocking workers exit.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        for r in &self.0.reactors {
            r.mailbox.ring();
        }
        self.0.blocking.shutdown();
    }

    /// Blocking worker threads of this engine's pool alive now (at most
    /// [`crate::blocking::MAX_BLOCKING_THREADS`]; none before the first `spawn_blocking`).
    pub fn blocking_threads(&self) -> usize {
        self.0.blocking.threads()
    }

    /// Blocking worker threads this engine ever started.
    pub fn blocking_threads_started(&self) -> usize {
        self.0.blocking.started()
    }

    /// True once `stop` was called.
    pub fn stopping(&self) -> bool {
        self.0.stop.load(Ordering::Relaxed)
    }

    /// Waits for every reactor thread to exit (call after `stop`), then drops the state
    /// layers kept in the engine and takes the calling thread out of it.
    pub fn join(&self) {
        let threads = std::mem::take(&mut *self.0.threads.lock().unwrap());
        let mut on_reactor = false;
        for t in threads {
            if t.thread().id() == std::thread::current().id() {
                on_reactor = true;
                continue;
            }
            let _ = t.join();
        }
        crate::context::leave(self);
        if !on_reactor {
            self.0.ext.clear();
        }
    }

    /// Counters of every reactor.
    pub fn stats(&self) -> Vec<ReactorStats> {
        self.0
            .reactors
            .iter()
            .enumerate()
            .map(|(id, r)| {
                let since = r.asleep_since.load(Ordering::Relaxed);
                let sleeping = if since == 0 { 0 } else { ticks().saturating_sub(since) };
                ReactorStats {
                    id,
                    core: r.core,
                    busy_ticks: r.busy_ticks.load(Ordering::Relaxed),
                    idle_ticks: r.idle_ticks.load(Ordering::Relaxed) + sleeping,
                    sleeps: r.sleeps.load(Ordering::Relaxed),
                    turns: r.turns.load(Ordering::Relaxed),
                    pollers: r.pollers.load(Ordering::Relaxed),
                    sleeping: since != 0,
                }
            })
            .collect()
    }
}

type PollerFn = Box<dyn FnMut() -> bool>;

struct PollerEntry {
    id: u64,
    f: PollerFn,
}

/// Identifies a registered poller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId(u64);

/// The state a reactor keeps for itself (never shared across threads).
pub(crate) struct Local {
    id: usize,
    engine: Engine,
    ready: RefCell<VecDeque<Runnable>>,
    pollers: RefCell<Vec<PollerEntry>>,
    added_pollers: RefCell<Vec<PollerEntry>>,
    removed_pollers: RefCell<Vec<u64>>,
    /// Called before the reactor sleeps ([`register_sleep_hook`]).
    sleep_hooks: RefCell<Vec<PollerEntry>>,
    next_id: Cell<u64>,
    timers: RefCell<BinaryHeap<Reverse<(u64, u64)>>>,
    timer_fns: RefCell<HashMap<u64, Box<dyn FnOnce()>>>,
    ring: RefCell<Ring>,
    /// Replaced (once, before the framework starts) when `iobuf_set_options` sized it.
    bufs: RefCell<Rc<BufPool>>,
    /// The provided buffer ring for multishot receives (None: off or unsupported).
    recv_group: Option<Rc<BufGroup>>,
    /// Size of a socket's own receive buffer when there is no ring.
    recv_size: u32,
    /// Tasks waiting in [`next_turn`] for the end of this turn.
    after_turn: RefCell<Vec<Waker>>,
    /// This reactor's parts of the registered external memory regions (`crate::FixedMem`).
    fixed_mem: RefCell<Vec<Rc<LocalMem>>>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
    /// The index of the reactor running this thread, while `LOCAL` is set (a cheap `current()`).
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn with_local<R>(f: impl FnOnce(&Rc<Local>) -> R) -> R {
    LOCAL.with(|l| {
        let l = l.borrow();
        f(l.as_ref().expect("not called on a reactor thread"))
    })
}

fn try_local() -> Option<Rc<Local>> {
    LOCAL.try_with(|l| l.borrow().clone()).ok().flatten()
}

fn pin_to(core: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(e.kind(), format!("cannot pin to core {core}: {e}")));
        }
    }
    Ok(())
}

fn reactor_main(engine: Engine, id: usize, cfg: EngineConfig, ready: oneshot::Sender<std::io::Result<()>>) {
    crate::panic::mark_reactor(id);
    let setup = || -> std::io::Result<Rc<Local>> {
        if cfg.pin {
            pin_to(cfg.cores[id])?;
        }
        Local::new(&engine, id, &cfg)
    };
    let local = match setup() {
        Ok(l) => l,
        Err(e) => {
            ready.send(Err(e));
            return;
        }
    };
    set_current(Some(&local));
    ready.send(Ok(()));
    run_loop(&local, &cfg);
    local.wind_down();
    set_current(None);
}

/// Makes `local` the reactor of the calling thread (None: no reactor).
pub(crate) fn set_current(local: Option<&Rc<Local>>) {
    LOCAL.with(|l| *l.borrow_mut() = local.cloned());
    CURRENT.with(|c| c.set(local.map(|l| l.id)));
}

/// Registers a pool's small and large regions as the ring's fixed buffers 0 and 1.
fn register_pool(ring: &mut Ring, pool: &BufPool, id: usize) {
    match ring.set_pool_buffers(&pool.regions()) {
        Ok(()) => pool.set_registered(true),
        // Without registration (e.g. RLIMIT_MEMLOCK) fixed-buffer I/O is off; still correct.
        Err(e) => log::warn!("reactor {id}: io_uring buffer registration failed ({e}); using unregistered buffers"),
    }
}

/// Says once per process why sockets receive one-shot.
fn no_multishot(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| log::warn!("multishot receive unavailable ({why}); sockets receive one-shot into own buffers"));
}

/// Makes and registers the reactor's receive buffer ring, if multishot receive is on and the
/// kernel has it (else None, said once). An impossible config is an error.
fn recv_ring(ring: &mut Ring, cfg: RecvBufConfig) -> std::io::Result<Option<Rc<BufGroup>>> {
    if cfg.count == 0 {
        return Ok(None);
    }
    if !ring.probe_multishot_recv() {
        no_multishot("the kernel predates Linux 6.0");
        return Ok(None);
    }
    let group = BufGroup::new(cfg)?;
    // SAFETY: the ring memory is page-aligned and holds `count` entries; it and the buffers
    // live in the group, which the reactor keeps until it unregisters the group at its end.
    if let Err(e) = unsafe { ring.register_buf_ring(group.ring_addr(), group.count(), RECV_BGID) } {
        no_multishot(&format!("IORING_REGISTER_PBUF_RING: {e}"));
        return Ok(None);
    }
    Ok(Some(group))
}

/// A busy reactor runs the kernel's deferred completion work on one turn in this many.
const TASK_WORK_EVERY: u32 = 4;

/// How long an adaptive reactor waiting on the kernel polls before it starts yielding its core
/// to other runnable threads on each turn.
const ADAPTIVE_YIELD_AFTER: Duration = Duration::from_micros(20);

/// A yield that kept an adaptive reactor off its core longer than this gave the core to a
/// thread that does not block soon (a CPU-bound one), not to one with a few microseconds of
/// work (a client sharing the core). Well under the scheduler's base slice (0.75 ms times
/// 1 + log2 of the CPUs, up to 8).
const ADAPTIVE_YIELD_CONTENDED: Duration = Duration::from_micros(300);

/// After such a yield, an adaptive reactor polls without yielding for this long (then tries a
/// yield again). Under EEVDF (Linux 6.6 on) a yield forfeits the rest of the yielder's slice:
/// its virtual runtime jumps to its deadline. A reactor that yielded on every idle turn next
/// to a CPU-bound thread was charged ~16 times the CPU it used and got 3% of its core (iSCSI
/// QD 1: 788 IOPS against 3,000 polling; docs/perf-log/2026-11-29-iscsi-qd1.md). One yield
/// per back-off bounds that loss to a slice in this period.
const ADAPTIVE_YIELD_BACKOFF: Duration = Duration::from_millis(100);

fn run_loop(local: &Rc<Local>, cfg: &EngineConfig) {
    let shared = &local.engine.0.reactors[local.id];
    let mailbox = &shared.mailbox;
    let stop = &local.engine.0.stop;
    let adaptive_idle = duration_to_ticks(cfg.adaptive_idle);
    let yield_after = duration_to_ticks(ADAPTIVE_YIELD_AFTER);
    let yield_contended = duration_to_ticks(ADAPTIVE_YIELD_CONTENDED);
    let yield_backoff = duration_to_ticks(ADAPTIVE_YIELD_BACKOFF);
    // No yields before this tick (a yield found a CPU-bound thread on this core).
    let mut no_yield_until = 0u64;
    let mut last = ticks();
    let mut idle_since = last;
    let mut turns: u64 = 0;
    let mut held_turns = 0u32;
    let mut tw_skipped = 0u32;
    loop {
        let mut work = mailbox.drain(128, |m| m.run());
        for _ in 0..128 {
            let r = local.ready.borrow_mut().pop_front();
            match r {
                Some(r) => {
                    r.run();
                    work += 1;
                }
                None => break,
            }
        }
        work += local.run_pollers();
        // Timers go by the tick taken at the end of the last turn (or at the wake from a
        // sleep): a turn is microseconds at most, and a second read of the counter per turn
        // cost ~2% of a busy target's core (rdtsc is slow in a VM).
        work += local.run_timers(last);
        work += local.end_turn();
        // Sockets are read (the kernel's deferred task work run) on idle turns and on every
        // fourth busy one: more commands arrive per read, and each read and each reply batch
        // costs the kernel a fixed amount (a QD 32 target read its socket 2.2x as often per
        // I/O as SPDK's before this, and served 7-10% fewer I/Os).
        if work == 0 || tw_skipped >= TASK_WORK_EVERY - 1 {
            local.ring.borrow_mut().run_task_work();
            tw_skipped = 0;
        } else {
            tw_skipped += 1;
        }
        work += Ring::reap(&local.ring);
        // Submission is batched: SQEs queued in a busy turn wait one more turn (collecting more),
        // an idle turn submits at once, and a reactor about to sleep submits in the same
        // io_uring_enter that waits (`Ring::wait`), so QD 1 costs one syscall per I/O.
        let pending = local.ring.borrow().pending() > 0;
        let sleeping_soon = work == 0 && cfg.mode != ReactorMode::Poll;
        if pending && !sleeping_soon && (work == 0 || held_turns > 0) {
            local.ring.borrow_mut().submit();
            held_turns = 0;
        } else if pending && !sleeping_soon {
            held_turns += 1;
        }

        let now = ticks();
        let elapsed = now.wrapping_sub(last);
        last = now;
        turns += 1;
        shared.turns.store(turns, Ordering::Relaxed);
        // Checked on every turn, busy or not: a reactor that always finds work still stops.
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if work > 0 {
            shared.busy_ticks.store(shared.busy_ticks.load(Ordering::Relaxed) + elapsed, Ordering::Relaxed);
            idle_since = now;
            continue;
        }
        shared.idle_ticks.store(shared.idle_ticks.load(Ordering::Relaxed) + elapsed, Ordering::Relaxed);
        let sleep = match cfg.mode {
            ReactorMode::Poll => false,
            ReactorMode::Interrupt => true,
            // Waiting on io-wq workers: sleep at once, so the worker gets this core and its
            // completion wakes us.
            ReactorMode::Adaptive => {
                now.wrapping_sub(idle_since) > adaptive_idle || local.ring.borrow().waits_on_workers()
            }
        };
        if !sleep
            && cfg.mode == ReactorMode::Adaptive
            && now.wrapping_sub(idle_since) > yield_after
            && now >= no_yield_until
            && local.ring.borrow().busy()
        {
            // Waiting on the kernel (sockets, device interrupts): keep polling, since waking a
            // sleeping (in a VM: halted) core costs tens of microseconds, but let anything else
            // runnable on this core go first. Not in the first microseconds of a wait: the
            // gaps between a busy connection's requests are that short, and a yield per turn
            // there cost a target 10-15% of its throughput (sched_yield is a syscall and a pass
            // through the scheduler). A yield that kept us off the core long found a thread
            // that does not block soon: each further yield would hand it a whole slice, so we
            // poll without yielding for a while (as a polling reactor shares a core).
            std::thread::yield_now();
            let back = ticks();
            if back.wrapping_sub(now) > yield_contended {
                no_yield_until = back.wrapping_add(yield_backoff);
            }
        }
        if !sleep {
            local.ring.borrow_mut().submit();
            continue;
        }
        // Last looks before sleeping: a source that stopped its wake-ups while it was polled
        // (a virtqueue that told its driver not to kick) turns them back on, and stays awake
        // if something arrived meanwhile.
        if local.run_sleep_hooks() > 0 {
            idle_since = ticks();
            continue;
        }
        if mailbox.prepare_sleep() {
            if local.ready.borrow().is_empty() && !stop.load(Ordering::SeqCst) {
                let timeout = local.next_timer().map(|deadline| {
                    let t = deadline.saturating_sub(ticks());
                    Duration::from_nanos(crate::tsc::ticks_to_nanos(t)).min(MAX_SLEEP)
                });
                shared.sleeps.store(shared.sleeps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                // Idle time so far is published before sleeping; the sleep itself is added by
                // readers from `asleep_since` until the reactor wakes and adds it here.
                let now = ticks();
                shared
                    .idle_ticks
                    .store(shared.idle_ticks.load(Ordering::Relaxed) + now.wrapping_sub(last), Ordering::Relaxed);
                last = now;
                shared.asleep_since.store(now.max(1), Ordering::Relaxed);
                local.ring.borrow_mut().wait(timeout);
                shared.asleep_since.store(0, Ordering::Relaxed);
            }
            mailbox.woke();
            let now = ticks();
            shared
                .idle_ticks
                .store(shared.idle_ticks.load(Ordering::Relaxed) + now.wrapping_sub(last), Ordering::Relaxed);
            last = now;
        }
    }
}

impl Local {
    /// Makes reactor `id`'s own state: its io_uring, buffer pool and queues.
    pub(crate) fn new(engine: &Engine, id: usize, cfg: &EngineConfig) -> std::io::Result<Rc<Local>> {
        let mailbox = &engine.0.reactors[id].mailbox;
        let mut ring = Ring::new(cfg.ring_entries, cfg.ring_handlers, mailbox.doorbell_fd())?;
        let bufs = BufPool::new(cfg.bufs)?;
        ring.init_buffer_table(cfg.fixed_mem_slots);
        register_pool(&mut ring, &bufs, id);
        cfg.recv_bufs.check().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let recv_group = recv_ring(&mut ring, cfg.recv_bufs)?;
        Ok(Rc::new(Local {
            id,
            engine: engine.clone(),
            ready: RefCell::new(VecDeque::with_capacity(256)),
            pollers: RefCell::new(Vec::new()),
            added_pollers: RefCell::new(Vec::new()),
            sleep_hooks: RefCell::new(Vec::new()),
            removed_pollers: RefCell::new(Vec::new()),
            next_id: Cell::new(1),
            timers: RefCell::new(BinaryHeap::new()),
            timer_fns: RefCell::new(HashMap::new()),
            ring: RefCell::new(ring),
            bufs: RefCell::new(bufs),
            recv_group,
            recv_size: cfg.recv_bufs.size,
            after_turn: RefCell::new(Vec::new()),
            fixed_mem: RefCell::new(Vec::new()),
        }))
    }

    /// Drops messages, tasks, pollers and timers (call with this reactor current). Closing the
    /// mailbox first makes later senders drop their messages (so callers waiting for an answer
    /// see `Canceled` rather than wait forever).
    pub(crate) fn wind_down(&self) {
        let mailbox = &self.engine.0.reactors[self.id].mailbox;
        mailbox.close();
        // (Each is taken out first and dropped with no borrow held: dropping a task or a poller
        // may wake tasks or touch timers.)
        let ready = std::mem::take(&mut *self.ready.borrow_mut());
        drop(ready);
        let pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        drop(pollers);
        let added = std::mem::take(&mut *self.added_pollers.borrow_mut());
        drop(added);
        let timers = std::mem::take(&mut *self.timer_fns.borrow_mut());
        drop(timers);
        let waiting = std::mem::take(&mut *self.after_turn.borrow_mut());
        drop(waiting);
        let ready = std::mem::take(&mut *self.ready.borrow_mut());
        drop(ready);
        let regions = std::mem::take(&mut *self.fixed_mem.borrow_mut());
        drop(regions);
        if self.recv_group.is_some() {
            // From here the kernel takes no more buffers from the ring, whatever is still armed.
            let _ = self.ring.borrow_mut().unregister_buf_ring(RECV_BGID);
        }
        mailbox.close();
    }

    /// One ready task, if any; true if it ran one.
    pub(crate) fn run_one_task(&self) -> bool {
        let r = self.ready.borrow_mut().pop_front();
        match r {
            Some(r) => {
                r.run();
                true
            }
            None => false,
        }
    }

    /// The reactor's index.
    pub(crate) fn index(&self) -> usize {
        self.id
    }

    /// Runs the pollers once; the number that found work.
    pub(crate) fn run_pollers(&self) -> usize {
        {
            let mut changed = false;
            let mut added = self.added_pollers.borrow_mut();
            if !added.is_empty() {
                self.pollers.borrow_mut().append(&mut added);
                changed = true;
            }
            let mut removed = self.removed_pollers.borrow_mut();
            if !removed.is_empty() {
                self.pollers.borrow_mut().retain(|p| !removed.contains(&p.id));
                removed.clear();
                changed = true;
            }
            if changed {
                let n = self.pollers.borrow().len() as u64;
                self.engine.0.reactors[self.id].pollers.store(n, Ordering::Relaxed);
            }
        }
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        let mut work = 0;
        for p in pollers.iter_mut() {
            if (p.f)() {
                work += 1;
            }
        }
        // Pollers registered meanwhile went to `added_pollers`: the slot is empty, and taking
        // the list back is a swap (no drop of the empty list left there on every turn).
        let mut slot = self.pollers.borrow_mut();
        if !slot.is_empty() {
            pollers.append(&mut slot);
        }
        std::mem::swap(&mut *slot, &mut pollers);
        work
    }

    /// Runs the sleep hooks; how many found work.
    fn run_sleep_hooks(&self) -> usize {
        let mut hooks = std::mem::take(&mut *self.sleep_hooks.borrow_mut());
        let mut work = 0;
        for h in hooks.iter_mut() {
            if (h.f)() {
                work += 1;
            }
        }
        // Hooks registered meanwhile went to the emptied list: keep them after the others.
        let mut slot = self.sleep_hooks.borrow_mut();
        hooks.append(&mut slot);
        *slot = hooks;
        work
    }

    /// Wakes the tasks waiting in [`next_turn`]; how many.
    pub(crate) fn end_turn(&self) -> usize {
        let mut waiting = self.after_turn.borrow_mut();
        let n = waiting.len();
        if n == 0 {
            return 0;
        }
        // (Waking only queues the task: nothing here borrows `after_turn` again.)
        for w in waiting.drain(..) {
            w.wake();
        }
        n
    }

    /// Fires the timers due at `now`; the number fired.
    pub(crate) fn run_timers(&self, now: u64) -> usize {
        let mut fired = 0;
        // Only timers present at the start: a callback that adds due timers cannot keep the
        // loop here.
        let mut budget = self.timers.borrow().len();
        loop {
            if budget == 0 {
                return fired;
            }
            budget -= 1;
            let due = {
                let mut timers = self.timers.borrow_mut();
                match timers.peek() {
                    Some(Reverse((deadline, id))) if *deadline <= now => {
                        let id = *id;
                        timers.pop();
                        Some(id)
                    }
                    _ => None,
                }
            };
            let Some(id) = due else { return fired };
            let f = self.timer_fns.borrow_mut().remove(&id);
            if let Some(f) = f {
                f();
                fired += 1;
            }
        }
    }

    /// The deadline of the earliest timer.
    pub(crate) fn next_timer(&self) -> Option<u64> {
        self.timers.borrow().peek().map(|Reverse((d, _))| *d)
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }
}

/// The index of the reactor running the calling thread, if it is one.
#[inline]
pub fn current() -> Option<usize> {
    CURRENT.try_with(|c| c.get()).ok().flatten()
}

/// The longest a reactor sleeps without waking to look at its timers again.
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The tick at which a timer of `delay` from now is due (saturating: a huge delay never wraps
/// around into the past).
fn deadline_after(delay: Duration) -> u64 {
    let t = delay.as_nanos().saturating_mul(ticks_per_sec() as u128) / 1_000_000_000;
    ticks().saturating_add(t.min(u64::MAX as u128) as u64)
}

/// A local task's runnable on its way to its reactor through the mailbox. If it cannot get
/// there (the reactor stopped), it is leaked rather than dropped: dropping it on another thread
/// would drop the task's future there, which `async-task` forbids (it panics).
struct Wake {
    r: std::mem::ManuallyDrop<Runnable>,
    reactor: usize,
}

impl Wake {
    fn run(self) {
        let mut me = std::mem::ManuallyDrop::new(self);
        // SAFETY: taken once; `me` is never dropped, so Drop cannot touch it again.
        let r = unsafe { std::mem::ManuallyDrop::take(&mut me.r) };
        with_local(|l| l.ready.borrow_mut().push_back(r));
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        if current() == Some(self.reactor) {
            // SAFETY: dropped once, here, on the task's own reactor.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.r) }
        }
    }
}

/// The calling reactor's blocking pool and mailbox (for `spawn_blocking`). Panics off-reactor.
pub(crate) fn blocking_parts() -> (Arc<BlockingPool>, Arc<Mailbox>) {
    with_local(|l| (l.engine.0.blocking.clone(), l.engine.0.reactors[l.id].mailbox.clone()))
}

/// The engine of the calling reactor. Panics off-reactor.
pub fn engine() -> Engine {
    with_local(|l| l.engine.clone())
}

/// The engine of the calling reactor, or None off-reactor.
pub(crate) fn try_engine() -> Option<Engine> {
    LOCAL.try_with(|l| l.borrow().as_ref().map(|l| l.engine.clone())).ok().flatten()
}

/// Spawns a future as a task on the calling reactor. Panics off-reactor.
pub fn spawn_local<F>(fut: F) -> Task<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let (id, mailbox) = with_local(|l| (l.id, l.engine.0.reactors[l.id].mailbox.clone()));
    let schedule = move |r: Runnable| {
        if current() == Some(id) {
            with_local(|l| l.ready.borrow_mut().push_back(r));
        } else {
            // Woken from another thread: the runnable travels in the mailbox, without an
            // allocation (it is one pointer).
            let w = Wake { r: std::mem::ManuallyDrop::new(r), reactor: id };
            mailbox.post_fn(move || w.run());
        }
    };
    let (runnable, task) = async_task::spawn_local(fut, schedule);
    runnable.schedule();
    task
}

/// Registers a function run on every loop turn of the calling reactor; it returns true when it
/// found work (which keeps an adaptive reactor awake).
pub fn register_poller(f: impl FnMut() -> bool + 'static) -> PollerId {
    with_local(|l| {
        let id = l.next_id();
        l.added_pollers.borrow_mut().push(PollerEntry { id, f: Box::new(f) });
        PollerId(id)
    })
}

/// Registers `f` to run on the calling reactor each time it is about to sleep (interrupt and
/// adaptive modes), after a turn without work: a source that suppresses its own wake-ups while
/// it is polled turns them back on here, and returns true if it found work meanwhile (the
/// reactor then stays awake for another turn). SPDK's pollers get the same chance through
/// their interrupt-mode callbacks.
pub fn register_sleep_hook(f: impl FnMut() -> bool + 'static) -> PollerId {
    with_local(|l| {
        let id = l.next_id();
        l.sleep_hooks.borrow_mut().push(PollerEntry { id, f: Box::new(f) });
        PollerId(id)
    })
}

/// Removes a sleep hook of the calling reactor.
pub fn unregister_sleep_hook(p: PollerId) {
    with_local(|l| l.sleep_hooks.borrow_mut().retain(|e| e.id != p.0))
}

/// Removes a poller of the calling reactor (from the next loop turn on).
pub fn unregister_poller(p: PollerId) {
    with_local(|l| {
        l.added_pollers.borrow_mut().retain(|e| e.id != p.0);
        l.removed_pollers.borrow_mut().push(p.0);
    })
}

/// Runs `f` once on the calling reactor after `delay` (a huge delay means never).
pub fn after(delay: Duration, f: impl FnOnce() + 'static) {
    add_timer(delay, Box::new(f));
}

fn add_timer(delay: Duration, f: Box<dyn FnOnce()>) -> u64 {
    with_local(|l| {
        let id = l.next_id();
        l.timers.borrow_mut().push(Reverse((deadline_after(delay), id)));
        l.timer_fns.borrow_mut().insert(id, f);
        id
    })
}

/// A future that completes after a delay (on a reactor). Dropping it cancels its timer.
pub struct Sleep {
    delay: Duration,
    state: Option<(u64, Rc<SleepState>)>,
}

#[derive(Default)]
struct SleepState {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// Lets the rest of the reactor's turn run before the task goes on: the task resumes on the
/// next turn, after this turn's pollers (completions modules deferred) and timers, and after
/// the tasks they woke. A task with a long run of work uses it to let those results out
/// (replies sent, say) before it continues. Off a reactor it yields once.
pub fn next_turn() -> NextTurn {
    NextTurn { waited: false }
}

/// The future of [`next_turn`].
pub struct NextTurn {
    waited: bool,
}

impl Future for NextTurn {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.waited {
            return Poll::Ready(());
        }
        self.waited = true;
        match try_local() {
            Some(l) => l.after_turn.borrow_mut().push(cx.waker().clone()),
            None => cx.waker().wake_by_ref(),
        }
        Poll::Pending
    }
}

/// Waits for `delay` on the calling reactor.
pub fn sleep(delay: Duration) -> Sleep {
    Sleep { delay, state: None }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &self.state {
            Some((_, st)) if st.fired.get() => Poll::Ready(()),
            Some((_, st)) => {
                // Polled again, maybe by another task or combinator: wake the latest waker.
                let mut w = st.waker.borrow_mut();
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            None => {
                let st = Rc::new(SleepState::default());
                *st.waker.borrow_mut() = Some(cx.waker().clone());
                let st2 = st.clone();
                let id = add_timer(
                    self.delay,
                    Box::new(move || {
                        st2.fired.set(true);
                        let w = st2.waker.borrow_mut().take();
                        if let Some(w) = w {
                            w.wake();
                        }
                    }),
                );
                self.state = Some((id, st));
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((id, st)) = &self.state {
            if !st.fired.get() {
                // The heap entry stays until due and is then skipped; the callback (and the
                // waker it holds) goes now.
                if let Some(l) = try_local() {
                    let f = l.timer_fns.try_borrow_mut().ok().and_then(|mut t| t.remove(id));
                    drop(f);
                }
            }
        }
    }
}

/// Number of timers (from `after` and `sleep`) pending on the calling reactor. Panics
/// off-reactor.
pub fn pending_timers() -> usize {
    with_local(|l| l.timer_fns.borrow().len())
}

/// Gives the calling reactor's io_uring to `f`. Panics off-reactor.
pub fn with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> R {
    with_local(|l| f(&mut l.ring.borrow_mut()))
}

/// Gives the calling reactor's io_uring to `f`, or returns None off-reactor (or while the
/// reactor shuts down).
pub fn try_with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> Option<R> {
    let l = try_local()?;
    let mut ring = l.ring.try_borrow_mut().ok()?;
    Some(f(&mut ring))
}

/// Gives the calling reactor's table of registered external memory to `f` (None off-reactor).
pub(crate) fn fixed_mem_table<R>(f: impl FnOnce(&mut Vec<Rc<LocalMem>>) -> R) -> Option<R> {
    let l = try_local()?;
    let mut t = l.fixed_mem.try_borrow_mut().ok()?;
    Some(f(&mut t))
}

/// The calling reactor's buffer pool, or None off-reactor.
pub fn buf_pool() -> Option<Rc<BufPool>> {
    try_local().map(|l| l.bufs.borrow().clone())
}

/// Replaces the calling reactor's buffer pool by one made with `cfg` (SPDK's
/// `iobuf_set_options`, applied when the framework starts) and registers it with the ring in
/// place of the old one. Buffers of the old pool still out stay valid (each keeps its pool) but
/// no longer count as fixed buffers. If the new pool cannot be made, the old one stays.
pub fn resize_buf_pool(cfg: BufPoolConfig) -> std::io::Result<()> {
    let l = try_local().ok_or_else(|| std::io::Error::other("not on a reactor"))?;
    let new = BufPool::new(cfg)?;
    let old = l.bufs.replace(new.clone());
    old.set_registered(false);
    let mut ring = l.ring.borrow_mut();
    register_pool(&mut ring, &new, l.id);
    log::info!(
        "reactor {}: buffer pool of {} x {} B small and {} x {} B large buffers",
        l.id,
        cfg.small_count,
        cfg.small_size,
        cfg.large_count,
        cfg.large_size
    );
    Ok(())
}

/// The calling reactor's receive buffer ring (None off-reactor, or when multishot receive is
/// off or unsupported) and the size of a socket's own receive buffer otherwise.
pub(crate) fn recv_setup() -> (Option<Rc<BufGroup>>, u32) {
    match try_local() {
        Some(l) => (l.recv_group.clone().filter(|g| g.multishot()), l.recv_size),
        None => (None, RecvBufConfig::default().size),
    }
}

/// Counters of the calling reactor's receive buffer ring, or None (off-reactor, or no ring).
pub fn recv_buf_stats() -> Option<RecvBufStats> {
    try_local().and_then(|l| l.recv_group.as_ref().map(|g| g.stats()))
}

/// A payload buffer from the calling reactor's pool (a heap buffer off-reactor).
pub fn alloc_buf(len: usize) -> IoBuf {
    match buf_pool() {
        Some(p) => p.get(len),
        None => IoBuf::heap(len),
    }
}

/// A payload buffer from the calling reactor's pool, or from the heap while the pool's heap
/// budget lasts; None when both are spent (the bdev layer then answers NoMem and retries).
/// Off-reactor it always gives a heap buffer.
pub fn try_alloc_buf(len: usize) -> Option<IoBuf> {
    match buf_pool() {
        Some(p) => p.try_get(len),
        None => Some(IoBuf::heap(len)),
    }
}
