//! Helpers shared by the bdev integration tests: engines, bounded waits, awaiting one I/O, and
//! payload patterns.

#![allow(dead_code)]

use ferrite_bdev::{Completed, IoChannel, IoCompleter, IoRequest, IoStatus};
use ferrite_reactor::oneshot::Receiver;
use ferrite_reactor::{alloc_buf, Engine, EngineConfig, IoBuf, ReactorMode};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How long any single wait of a test may take before it counts as a hang.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Starts an engine of `n` reactors (1 or 2) on cores 0 (and 1).
pub fn engine(n: usize, mode: ReactorMode) -> Engine {
    let cores = (0..n).collect();
    Engine::start(EngineConfig { cores, mode, ..Default::default() }).expect("engine starts")
}

/// Stops an engine and joins its threads.
pub fn shutdown(e: Engine) {
    e.stop();
    e.join();
}

/// Waits for `rx` on a helper thread for at most `timeout`. `Err(None)` on timeout,
/// `Err(Some(()))` if the sender went away without answering (e.g. a reactor task panicked).
pub fn wait_timeout<T: Send + 'static>(rx: Receiver<T>, timeout: Duration) -> Result<T, Option<()>> {
    let (tx, mrx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rx.wait());
    });
    match mrx.recv_timeout(timeout) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(Some(())),
        Err(_) => Err(None),
    }
}

/// Runs the future made by `f` on reactor `id` and returns its output; panics if the task
/// panicked (its message is printed by the reactor thread) or took longer than [`TIMEOUT`].
pub fn run<F, Fut>(e: &Engine, id: usize, f: F) -> Fut::Output
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    match wait_timeout(e.run_async(id, f), TIMEOUT) {
        Ok(v) => v,
        Err(Some(())) => panic!("the task on reactor {id} failed (see its panic above)"),
        Err(None) => panic!("the task on reactor {id} did not finish within {TIMEOUT:?}"),
    }
}

#[derive(Default)]
struct Slot {
    result: Option<Completed>,
    waker: Option<Waker>,
    calls: u32,
}

/// A completer for one request: keeps the result and wakes the awaiting task.
#[derive(Default)]
pub struct OneShotIo(RefCell<Slot>);

impl IoCompleter for OneShotIo {
    fn io_done(&self, _tag: u64, io: Completed) {
        let waker = {
            let mut s = self.0.borrow_mut();
            s.calls += 1;
            assert_eq!(s.calls, 1, "an I/O completed more than once");
            s.result = Some(io);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The future of [`io`].
pub struct IoFuture(Rc<OneShotIo>);

impl Future for IoFuture {
    type Output = Completed;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completed> {
        let mut s = self.0 .0.borrow_mut();
        match s.result.take() {
            Some(c) => Poll::Ready(c),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Submits `req` on `ch` and waits for its completion (on a reactor). Also checks that the
/// completion is not delivered from inside `submit`.
pub async fn io(ch: &IoChannel, req: IoRequest) -> Completed {
    let done = Rc::new(OneShotIo::default());
    ch.submit(req, done.clone(), 7);
    assert_eq!(done.0.borrow().calls, 0, "completion delivered inside submit");
    IoFuture(done).await
}

/// Like [`io`], but asserts the status and returns the request's buffers' bytes, concatenated.
pub async fn io_ok(ch: &IoChannel, req: IoRequest) -> Vec<u8> {
    let what = format!("{:?} at {} x {}", req.io_type, req.offset_blocks, req.num_blocks);
    let c = io(ch, req).await;
    assert_eq!(c.status, IoStatus::Success, "{what}");
    payload(&c)
}

/// The bytes of a completed request's buffers, concatenated.
pub fn payload(c: &Completed) -> Vec<u8> {
    c.req.bufs.iter().flat_map(|b| b.iter().copied()).collect()
}

/// A reproducible byte pattern, different for each seed and position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A payload buffer (from the calling reactor's pool) holding `data`.
pub fn buf_from(data: &[u8]) -> IoBuf {
    let mut b = alloc_buf(data.len());
    b.copy_from_slice(data);
    b
}

/// A payload buffer of `len` bytes, each set to `byte`.
pub fn buf_filled(len: usize, byte: u8) -> IoBuf {
    let mut b = alloc_buf(len);
    b.fill(byte);
    b
}

/// Buffers holding consecutive slices of `data`, of the given lengths.
pub fn bufs_from(data: &[u8], lens: &[usize]) -> ferrite_bdev::io::IoBufs {
    assert_eq!(lens.iter().sum::<usize>(), data.len());
    let mut pos = 0;
    lens.iter()
        .map(|&n| {
            let b = buf_from(&data[pos..pos + n]);
            pos += n;
            b
        })
        .collect()
}

/// A vectored request of `io_type` over `bufs`.
pub fn vectored(
    io_type: ferrite_bdev::IoType,
    offset_blocks: u64,
    num_blocks: u64,
    bufs: ferrite_bdev::io::IoBufs,
) -> IoRequest {
    let mut r = IoRequest::new(io_type, offset_blocks, num_blocks);
    r.bufs = bufs;
    r
}

/// Asserts two byte strings are equal, reporting the first difference instead of both dumps.
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i} (block {}): got {:#04x}, want {:#04x}", i / 512, got[i], want[i]);
    }
}

/// A temporary file removed on drop.
pub struct TempFile {
    pub path: std::path::PathBuf,
}

impl TempFile {
    /// Creates a file of `len` bytes (sparse, reads as zeroes) with a unique name.
    pub fn new(tag: &str, len: u64) -> Self {
        let path = std::env::temp_dir().join(format!("ferrite-bdev-test-{tag}-{}", std::process::id()));
        let f = std::fs::File::create(&path).expect("create temp file");
        f.set_len(len).expect("size temp file");
        Self { path }
    }

    /// The path as a string.
    pub fn path_str(&self) -> String {
        self.path.to_str().expect("utf-8 temp path").to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A completer that keeps every completion, for tests that drive the layer off the reactors
/// (completions come from `run_deferred`).
#[derive(Default)]
pub struct Collect(RefCell<Vec<(u64, Completed)>>);

impl IoCompleter for Collect {
    fn io_done(&self, tag: u64, io: Completed) {
        self.0.borrow_mut().push((tag, io));
    }
}

impl Collect {
    /// Takes the completion of `tag`, if it came.
    pub fn take(&self, tag: u64) -> Option<Completed> {
        let mut v = self.0.borrow_mut();
        let i = v.iter().position(|(t, _)| *t == tag)?;
        Some(v.remove(i).1)
    }

    /// Completions kept and not taken yet.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

/// Runs deferred completions until `c` holds the completion of `tag`.
pub fn wait_for(c: &Collect, tag: u64) -> Completed {
    for _ in 0..1_000_000 {
        if let Some(done) = c.take(tag) {
            return done;
        }
        ferrite_bdev::io::run_deferred();
    }
    panic!("request {tag} never completed");
}

/// Submits `req` off the reactors and waits for it.
pub fn run_one(ch: &IoChannel, req: IoRequest) -> Completed {
    let c = Rc::new(Collect::default());
    ch.submit(req, c.clone(), 1);
    wait_for(&c, 1)
}

/// Runs deferred completions for a while (off the reactors).
pub fn settle() {
    for _ in 0..100 {
        ferrite_bdev::io::run_deferred();
    }
}
