//! Helpers shared by the reactor's socket tests: running a future on reactor 0 with a time
//! limit, socket pairs, descriptor identity, and polling for a condition on the reactor.

#![allow(dead_code)]

use ferrite_reactor::net::Socket;
use ferrite_reactor::{sleep, spawn_local, Engine};
use std::future::Future;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Runs the future made by `f` on reactor 0 and returns its output, failing the test if it takes
/// longer than `limit` (a stalled reactor must fail the test, not hang it).
pub fn run<T: Send + 'static, Fut: Future<Output = T> + 'static>(
    e: &Engine,
    limit: Duration,
    f: impl FnOnce() -> Fut + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    e.send(0, move || {
        let fut = f();
        spawn_local(async move {
            let _ = tx.send(fut.await);
        })
        .detach();
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("reactor task did not finish within {limit:?}"))
}

/// Stops an engine and joins its threads.
pub fn stop(e: Engine) {
    e.stop();
    e.join();
}

/// A reactor socket connected to a plain one.
pub fn pair() -> (Socket, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    (Socket::new(a.into()), b)
}

/// The identity (device, inode) of what descriptor `fd` refers to, if it is open.
pub fn ident(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the stat buffer we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// True if `fd` still refers to the object identified by `id` (tests run in parallel threads,
/// so once closed the number may be taken by another test's descriptor).
pub fn still(fd: RawFd, id: Option<(u64, u64)>) -> bool {
    id.is_some() && ident(fd) == id
}

/// Polls until `cond` holds on the reactor (at most `limit`).
pub async fn until(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(1)).await;
    }
}
