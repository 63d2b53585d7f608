//! Work that may block (file system calls, DNS, big computations) runs off the reactors, on a
//! small pool of blocking worker threads per engine: [`spawn_blocking`].
//!
//! The pool starts no thread until a job arrives and never runs more than
//! [`MAX_BLOCKING_THREADS`]; a new thread is started only when a job finds no idle one. Jobs wait
//! in a bounded lock-free queue of [`BLOCKING_QUEUE`] entries; when it is full, the future waits
//! (without blocking the reactor) until a worker takes a job. Nothing on the reactor's side
//! takes a lock: workers sleep on a futex that a reactor wakes only if one is idle.
//!
//! The result comes back as a message to the reactor that called `spawn_blocking`, which stores
//! it and wakes the task there. A panic in the closure is caught on the worker (the process-wide
//! panic hook prints it with its location as usual) and the future yields
//! `Err(BlockingPanic)`; it never takes the reactor or the process down by itself.

use crate::mailbox::Mailbox;
use crossbeam_queue::{ArrayQueue, SegQueue};
use std::cell::UnsafeCell;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// Most worker threads a pool runs.
pub const MAX_BLOCKING_THREADS: usize = 4;
/// Jobs a pool queues before `spawn_blocking` futures wait for room.
pub const BLOCKING_QUEUE: usize = 256;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The closure given to [`spawn_blocking`] panicked; holds the panic's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockingPanic(pub String);

impl std::fmt::Display for BlockingPanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "blocking job panicked: {}", self.0)
    }
}

impl std::error::Error for BlockingPanic {}

/// An engine's blocking worker threads and their job queue.
pub(crate) struct BlockingPool {
    jobs: ArrayQueue<Job>,
    /// Futures waiting for room in `jobs`.
    space_waiters: SegQueue<Waker>,
    /// Futex word: bumped on every new job, so a worker about to sleep notices one.
    seq: AtomicU32,
    idle: AtomicUsize,
    threads: AtomicUsize,
    started: AtomicUsize,
    shutdown: AtomicBool,
    /// The CPU affinity of the thread that created the engine (unpinned). Workers are started
    /// by pinned reactors and would inherit their single core; they take this one instead.
    affinity: Option<libc::cpu_set_t>,
}

fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: FUTEX_WAIT/FUTEX_WAKE on a valid, aligned u32 that outlives the call; no timeout
    // and no second address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn current_affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

/// CPUs the calling thread may run on.
pub fn allowed_cpus() -> usize {
    // SAFETY: reads a plain cpu_set_t filled by sched_getaffinity.
    current_affinity().map_or(0, |set| unsafe { libc::CPU_COUNT(&set) as usize })
}

impl BlockingPool {
    pub(crate) fn new() -> Self {
        Self {
            jobs: ArrayQueue::new(BLOCKING_QUEUE),
            space_waiters: SegQueue::new(),
            seq: AtomicU32::new(0),
            idle: AtomicUsize::new(0),
            threads: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            affinity: current_affinity(),
        }
    }

    /// Worker threads alive now.
    pub(crate) fn threads(&self) -> usize {
        self.threads.load(Ordering::SeqCst)
    }

    /// Worker threads ever started.
    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Queues a job and makes sure a worker will run it; gives the job back if the queue is full.
    fn submit(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        self.jobs.push(job)?;
        self.seq.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `worker`: either the worker sees the job before sleeping, or
        // we see it idle and wake it (its futex wait fails if `seq` moved meanwhile).
        fence(Ordering::SeqCst);
        if self.idle.load(Ordering::SeqCst) > 0 {
            futex(&self.seq, libc::FUTEX_WAKE, 1);
            return Ok(());
        }
        let n = self.threads.load(Ordering::SeqCst);
        if n < MAX_BLOCKING_THREADS
            && self.threads.compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        {
            let pool = self.clone();
            let name = format!("blocking_{}", self.started.fetch_add(1, Ordering::SeqCst));
            if let Err(e) = std::thread::Builder::new().name(name).spawn(move || pool.worker()) {
                self.threads.fetch_sub(1, Ordering::SeqCst);
                // Busy workers (if any) will still take the job; with none, it waits for the
                // next successful start.
                log::error!("cannot start a blocking worker thread: {e}");
            }
        }
        Ok(())
    }

    fn worker(self: Arc<Self>) {
        if let Some(set) = &self.affinity {
            // SAFETY: passes a valid cpu_set_t of the given size for the calling thread.
            if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
                log::warn!("blocking worker: cannot unpin: {}", std::io::Error::last_os_error());
            }
        }
        loop {
            if let Some(job) = self.jobs.pop() {
                if let Some(w) = self.space_waiters.pop() {
                    w.wake();
                }
                job();
                continue;
            }
            if self.shutdown.load(Ordering::SeqCst) {
                break;
            }
            let seen = self.seq.load(Ordering::SeqCst);
            self.idle.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.jobs.is_empty() && !self.shutdown.load(Ordering::SeqCst) {
                futex(&self.seq, libc::FUTEX_WAIT, seen);
            }
            self.idle.fetch_sub(1, Ordering::SeqCst);
        }
        self.threads.fetch_sub(1, Ordering::SeqCst);
    }

    /// Lets idle workers exit (busy ones exit after their job). Jobs still queued are run first.
    pub(crate) fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.seq.fetch_add(1, Ordering::SeqCst);
        futex(&self.seq, libc::FUTEX_WAKE, i32::MAX as u32);
    }
}

/// Where a job's result meets its future. `value` is written by the worker before it posts the
/// completion message; `done` and `waker` are touched only on the reactor that owns the future
/// (the future is `!Send`, and the completion message runs on that reactor).
struct Slot<T> {
    value: UnsafeCell<Option<Result<T, BlockingPanic>>>,
    done: UnsafeCell<bool>,
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: see the field rules above: `value` is handed over from the worker to the reactor
// through the mailbox (whose push/pop order the accesses), the rest is reactor-only; T is Send.
unsafe impl<T: Send> Sync for Slot<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Slot<T> {}

/// The future returned by [`spawn_blocking`]: resolves on the calling reactor to the closure's
/// result, or to `Err(BlockingPanic)` if it panicked.
#[must_use = "the result is lost unless awaited (and the closure may not run if the queue was full)"]
pub struct Blocking<T> {
    slot: Arc<Slot<T>>,
    /// The job, while the queue was full.
    job: Option<Job>,
    pool: Arc<BlockingPool>,
    _not_send: PhantomData<*const ()>,
}

/// Runs `f` on the engine's blocking worker pool and returns a future of its result, to be
/// awaited on the calling reactor (where the result is delivered). Panics off-reactor.
pub fn spawn_blocking<T, F>(f: F) -> Blocking<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (pool, mailbox) = crate::reactor::blocking_parts();
    let engine = crate::reactor::engine();
    if engine.is_simulated() {
        // The simulator runs everything on its one thread, in an order its seed decides: the
        // job runs here and now, and its result is ready at once.
        let res = std::panic::catch_unwind(AssertUnwindSafe(f))
            .map_err(|p| BlockingPanic(crate::panic::payload_text(&*p).to_string()));
        let slot = Arc::new(Slot {
            value: UnsafeCell::new(Some(res)),
            done: UnsafeCell::new(true),
            waker: UnsafeCell::new(None),
        });
        return Blocking { slot, job: None, pool, _not_send: PhantomData };
    }
    // The job belongs to the caller's engine: state it touches (a bdev it registers) is that
    // engine's.
    spawn_on(pool, mailbox, move || {
        let _entered = engine.enter();
        f()
    })
}

pub(crate) fn spawn_on<T, F>(pool: Arc<BlockingPool>, mailbox: Arc<Mailbox>, f: F) -> Blocking<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let slot =
        Arc::new(Slot { value: UnsafeCell::new(None), done: UnsafeCell::new(false), waker: UnsafeCell::new(None) });
    let s = slot.clone();
    let job: Job = Box::new(move || {
        let res = std::panic::catch_unwind(AssertUnwindSafe(f))
            .map_err(|p| BlockingPanic(crate::panic::payload_text(&*p).to_string()));
        // SAFETY: only this job writes `value`, once, before the completion message is posted;
        // the reactor reads it only after that message ran.
        unsafe { *s.value.get() = Some(res) };
        mailbox.post_fn(move || {
            // SAFETY: runs on the reactor owning the future (reactor-only fields).
            unsafe {
                *s.done.get() = true;
                if let Some(w) = (*s.waker.get()).take() {
                    w.wake();
                }
            }
        });
    });
    let job = pool.submit(job).err();
    Blocking { slot, job, pool, _not_send: PhantomData }
}

impl<T> Future for Blocking<T> {
    type Output = Result<T, BlockingPanic>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(job) = self.job.take() {
            if let Err(job) = self.pool.submit(job) {
                // Full: wait for a worker to take a job, then retry (once more now, in case one
                // did before our waker was visible).
                self.pool.space_waiters.push(cx.waker().clone());
                if let Err(job) = self.pool.submit(job) {
                    self.job = Some(job);
                    return Poll::Pending;
                }
            }
        }
        // SAFETY: the future is !Send, so this is the owning reactor; see `Slot`.
        unsafe {
            if *self.slot.done.get() {
                let v = (*self.slot.value.get()).take().expect("blocking result taken twice");
                return Poll::Ready(v);
            }
            let w = &mut *self.slot.waker.get();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}
