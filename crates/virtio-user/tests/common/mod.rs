//! Helpers of the virtio-user integration tests: a qemu-storage-daemon exporting a raw file as
//! a vhost-user-blk socket, an engine with the module's RPC methods, and one awaited I/O.

#![allow(dead_code)]

use ferrite_bdev::{Completed, IoChannel, IoCompleter, IoRequest, IoStatus};
use ferrite_reactor::{Engine, EngineConfig, IoBuf, ReactorMode};
use ferrite_rpc::{Ctx, Params, Registry};
use serde_json::Value;
use std::cell::RefCell;
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Where qemu-storage-daemon is expected.
pub const QSD: &str = "/usr/bin/qemu-storage-daemon";

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Makes one named after the test.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ferrite-vu-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A qemu-storage-daemon exporting `image` at `socket`.
pub struct Qsd {
    child: Option<Child>,
    /// The raw image file.
    pub image: PathBuf,
    /// The vhost-user socket.
    pub socket: PathBuf,
}

impl Qsd {
    /// Starts one over `image` (which must exist) with `num_queues` queues; None (and says
    /// why) if qemu-storage-daemon is not installed.
    pub fn start(dir: &Path, image: &Path, num_queues: u32) -> Option<Qsd> {
        if !Path::new(QSD).exists() {
            eprintln!("SKIPPED: {QSD} is not installed (apt install qemu-system-common or qemu-utils)");
            return None;
        }
        let socket = dir.join("vhost.sock");
        // discard=unmap: without it the file node ignores discards (qemu's default), and the
        // test checks that they reach the file.
        let mut cmd = Command::new(QSD);
        cmd.arg("--blockdev")
            .arg(format!("driver=file,node-name=file0,filename={},discard=unmap", image.display()))
            .arg("--blockdev")
            .arg("driver=raw,node-name=disk0,file=file0,discard=unmap")
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp0,addr.type=unix,addr.path={},node-name=disk0,writable=on,num-queues={num_queues}",
                socket.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("qsd.log")).unwrap());
        // SAFETY: prctl in the child before exec (async-signal-safe): the daemon dies with the
        // test, even one that aborts.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let child = cmd.spawn().expect("qemu-storage-daemon starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "qemu-storage-daemon made no socket within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Qsd { child: Some(child), image: image.to_path_buf(), socket })
    }

    /// The socket path as a string.
    pub fn socket_str(&self) -> String {
        self.socket.display().to_string()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Freezes the daemon (SIGSTOP): requests handed to it stay in flight.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it gracefully (SIGTERM: the export and the file are closed) and reaps it.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if c.try_wait().unwrap().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Qsd {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
        // What the daemon said (errors of the vhost-user session), for a failing test.
        if let Some(dir) = self.socket.parent() {
            if let Ok(log) = std::fs::read_to_string(dir.join("qsd.log")) {
                if !log.is_empty() {
                    eprintln!("qemu-storage-daemon said:\n{log}");
                }
            }
        }
    }
}

/// Makes a file of `len` bytes filled with `pattern(seed, len)`.
pub fn image_with_pattern(dir: &Path, len: usize, seed: u64) -> (PathBuf, Vec<u8>) {
    let p = dir.join("disk.raw");
    let data = pattern(seed, len);
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

/// An engine of `n` reactors with the bdev layer's and this module's RPC methods.
pub struct Side {
    /// The reactors.
    pub engine: Engine,
    ctx: Ctx,
}

impl Side {
    /// Starts `n` reactors in `mode`, in the runtime RPC state.
    pub fn start(n: usize, mode: ReactorMode) -> Side {
        let engine =
            Engine::start(EngineConfig { cores: (0..n).collect(), mode, pin: false, ..Default::default() }).unwrap();
        let registry = ferrite_rpc::app::registry(|reg| {
            ferrite_bdev::rpc::register(reg);
            ferrite_virtio_user::rpc::register(reg);
        });
        let ctx = Ctx { engine: engine.clone(), registry: Arc::new(registry) };
        let c = ctx.clone();
        engine
            .run_async(0, move || async move { ferrite_rpc::config::start_framework(&c).await })
            .wait()
            .expect("reactor answers")
            .expect("framework starts");
        Side { engine, ctx }
    }

    /// Calls a method on reactor 0, as the RPC server does: the result, or (code, message).
    pub fn rpc(&self, method: &'static str, params: Value) -> Result<Value, (i32, String)> {
        let c = self.ctx.clone();
        let rx =
            self.engine.run_async(0, move || async move { Registry::call(&c, method, Params(Some(params))).await });
        wait(rx).map_err(|e| (e.code, e.message))
    }

    /// Runs the future `f` makes on reactor `core` and returns its output.
    pub fn run<F, Fut>(&self, core: usize, f: F) -> Fut::Output
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        wait(self.engine.run_async(core, f))
    }

    /// Stops the reactors.
    pub fn shutdown(self) {
        self.engine.stop();
        self.engine.join();
    }
}

/// How long one step of a test may take before it counts as a hang.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Waits for a reactor's answer for at most [`TIMEOUT`].
pub fn wait<T: Send + 'static>(rx: ferrite_reactor::oneshot::Receiver<T>) -> T {
    let (tx, mrx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rx.wait());
    });
    match mrx.recv_timeout(TIMEOUT) {
        Ok(Ok(v)) => v,
        Ok(Err(_)) => panic!("the reactor task failed (see its panic above)"),
        Err(_) => panic!("no answer within {TIMEOUT:?}: a hang"),
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

/// The future of one submitted request.
pub struct IoFuture(pub Rc<OneShotIo>);

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

impl IoFuture {
    /// True once the request completed.
    pub fn is_done(&self) -> bool {
        self.0 .0.borrow().calls > 0
    }
}

/// Submits `req` on `ch` and returns the future of its completion (checking that it is not
/// completed inside `submit`).
pub fn start_io(ch: &IoChannel, req: IoRequest) -> IoFuture {
    let done = Rc::new(OneShotIo::default());
    ch.submit(req, done.clone(), 1);
    assert_eq!(done.0.borrow().calls, 0, "completion delivered inside submit");
    IoFuture(done)
}

/// Submits `req` and waits for it.
pub async fn io(ch: &IoChannel, req: IoRequest) -> Completed {
    start_io(ch, req).await
}

/// Like [`io`], but asserts success and returns the payload's bytes.
pub async fn io_ok(ch: &IoChannel, req: IoRequest) -> Vec<u8> {
    let what = format!("{:?} at {} x {}", req.io_type, req.offset_blocks, req.num_blocks);
    let c = io(ch, req).await;
    assert_eq!(c.status, IoStatus::Success, "{what}");
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
            x as u8
        })
        .collect()
}

/// A buffer holding `data`.
pub fn buf_from(data: &[u8]) -> IoBuf {
    let mut b = ferrite_reactor::alloc_buf(data.len());
    b.copy_from_slice(data);
    b
}

/// Buffers of `lens` bytes holding consecutive parts of `data`.
pub fn bufs_from(data: &[u8], lens: &[usize]) -> ferrite_bdev::IoBufs {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            let b = buf_from(&data[at..at + n]);
            at += n;
            b
        })
        .collect()
}

/// Compares, naming the first differing byte.
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}: got {:#04x}, want {:#04x}", got[i], want[i]);
    }
}
