//! The JSON-RPC server: a unix socket (mode 0600 from the first instant, see [`crate::sockfile`])
//! whose connections are read by small control threads; every request runs on the first
//! reactor, one at a time per connection, in order.
//!
//! Bounded and timed out everywhere: at most [`Limits::max_connections`] connections are served
//! at once; more wait in a queue (an idle served connection is closed to make room for them), and
//! a connection that cannot be served in time, or beyond the queue, is told so with a JSON-RPC
//! error before it is closed. Idle connections and half-sent requests time out.

use crate::conn::{serve_connection, Slot};
use crate::registry::{Ctx, Params, Registry};
use crate::reject::Rejecter;
use crate::RpcError;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default socket path (SPDK's is /var/tmp/spdk.sock; pass `-s /var/tmp/ferrite.sock` to rpc.py).
pub const DEFAULT_SOCKET: &str = "/var/tmp/ferrite.sock";
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Error code of the "busy" reply (SPDK's convention: -errno, here EBUSY).
pub const BUSY: i32 = -libc::EBUSY;

/// The server's bounds and timeouts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once (one control thread each).
    pub max_connections: usize,
    /// Connections waiting for a slot; more are answered "busy" at once.
    pub max_pending: usize,
    /// How long a connection may wait for a slot before it is answered "busy".
    pub queue_wait: Duration,
    /// A served connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// A served connection idle this long is closed early when another one waits for a slot.
    pub evict_after: Duration,
    /// A request must arrive whole within this long of its first byte.
    pub request_timeout: Duration,
    /// A reply must be taken by the client within this long.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            max_pending: 1024,
            queue_wait: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            evict_after: Duration::from_secs(1),
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Connections being served and waiting.
#[derive(Default)]
struct Pool {
    active: usize,
    pending: VecDeque<(UnixStream, Instant)>,
    slots: Vec<Arc<Slot>>,
}

/// What the accept loop, the connection threads and the janitor share.
pub(crate) struct Shared {
    pub(crate) ctx: Ctx,
    pub(crate) limits: Limits,
    pub(crate) stopping: AtomicBool,
    pool: Mutex<Pool>,
    pub(crate) rejecter: Rejecter,
}

/// A running server. Dropping it (or `stop`) closes the listener and removes the socket file.
pub struct RpcServer {
    path: PathBuf,
    bound: crate::sockfile::BoundSocket,
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stopped: bool,
}

impl RpcServer {
    /// Binds `path` (replacing only a stale socket) and starts serving with default limits.
    pub fn start(path: &Path, ctx: Ctx) -> std::io::Result<RpcServer> {
        Self::start_with(path, ctx, Limits::default())
    }

    /// Binds `path` and starts serving with `limits`.
    pub fn start_with(path: &Path, ctx: Ctx, limits: Limits) -> std::io::Result<RpcServer> {
        let bound = crate::sockfile::bind(path, 0o600)?;
        let listener = bound.listener.try_clone()?;
        let shared = Arc::new(Shared {
            ctx,
            limits,
            stopping: AtomicBool::new(false),
            pool: Mutex::new(Pool::default()),
            rejecter: Rejecter::default(),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new().name("rpc".into()).spawn(move || accept_loop(listener, s))?;
        let s = shared.clone();
        let janitor = std::thread::Builder::new().name("rpc-janitor".into()).spawn(move || janitor(s))?;
        log::info!("JSON-RPC listening on {}", path.display());
        Ok(RpcServer { path: path.to_path_buf(), bound, shared, threads: vec![accept, janitor], stopped: false })
    }

    /// Stops accepting, ends idle connections and removes the socket.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocked accept (works even if the socket file was deleted meanwhile).
        // SAFETY: the listener descriptor stays open until `self.bound` is dropped.
        unsafe { libc::shutdown(self.bound.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut pool = lock(&self.shared.pool);
        for slot in &pool.slots {
            slot.end_if_idle();
        }
        pool.pending.clear();
        drop(pool);
        self.bound.remove(&self.path);
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(m: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let mut errors = ferrite_reactor::net::AcceptErrors::new();
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(c) => {
                errors.ok("rpc");
                admit(&shared, c)
            }
            Err(e) => {
                // E.g. out of descriptors: back off rather than spin or flood the log.
                std::thread::sleep(errors.failed("rpc", &e));
            }
        }
    }
}

/// Serves `conn` now, queues it, or tells it the server is busy.
fn admit(shared: &Arc<Shared>, conn: UnixStream) {
    let mut pool = lock(&shared.pool);
    if pool.active < shared.limits.max_connections {
        pool.active += 1;
        let slot = Arc::new(Slot::new(conn.as_raw_fd()));
        pool.slots.push(slot.clone());
        drop(pool);
        let (s, mine) = (shared.clone(), slot.clone());
        let spawned = std::thread::Builder::new().name("rpc-conn".into()).spawn(move || worker(s, conn, slot));
        if let Err(e) = spawned {
            // The stream went with the closure and is closed; forget its slot.
            log::warn!("rpc: cannot start a connection thread: {e}");
            let mut pool = lock(&shared.pool);
            pool.active -= 1;
            pool.slots.retain(|s| !Arc::ptr_eq(s, &mine));
        }
    } else if pool.pending.len() < shared.limits.max_pending {
        pool.pending.push_back((conn, Instant::now()));
        evict_idle(&mut pool, shared.limits.evict_after);
    } else {
        drop(pool);
        log::warn!("rpc: {} connections waiting; refusing another", shared.limits.max_pending);
        shared.rejecter.reject(conn, busy_error(shared));
    }
}

fn busy_error(shared: &Shared) -> RpcError {
    RpcError::new(BUSY, format!("server busy: {} connections in use; try again", shared.limits.max_connections))
}

/// Closes the longest-idle served connection, if one has been idle for `after`, to make room
/// for a waiting one.
fn evict_idle(pool: &mut Pool, after: Duration) {
    let victim = pool.slots.iter().filter(|s| s.idle_for().is_some_and(|d| d >= after)).min_by_key(|s| s.idle_since());
    if let Some(v) = victim {
        if v.end_if_idle() {
            log::debug!("rpc: closed an idle connection for a waiting one");
        }
    }
}

/// A connection thread: serves its connection, then waiting ones, until none wait.
fn worker(shared: Arc<Shared>, first: UnixStream, first_slot: Arc<Slot>) {
    let mut cur = Some((first, first_slot));
    while let Some((conn, slot)) = cur.take() {
        if let Err(e) = serve_connection(&conn, &shared, &slot) {
            log::debug!("rpc connection ended: {e}");
        }
        let mut pool = lock(&shared.pool);
        pool.slots.retain(|s| !Arc::ptr_eq(s, &slot));
        match pool.pending.pop_front() {
            Some((next, _)) if !shared.stopping.load(Ordering::SeqCst) => {
                let slot = Arc::new(Slot::new(next.as_raw_fd()));
                pool.slots.push(slot.clone());
                cur = Some((next, slot));
            }
            _ => pool.active -= 1,
        }
        // Close only after the slot is gone, so that no one can shut down a reused descriptor.
        drop(pool);
        drop(conn);
    }
}

/// Every 50 ms: answers "busy" to connections that waited too long, makes room for waiting
/// ones, and drains rejected connections.
fn janitor(shared: Arc<Shared>) {
    while !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        let mut expired = Vec::new();
        {
            let mut pool = lock(&shared.pool);
            let wait = shared.limits.queue_wait;
            while pool.pending.front().is_some_and(|(_, t)| t.elapsed() >= wait) {
                expired.extend(pool.pending.pop_front().map(|(c, _)| c));
            }
            if !pool.pending.is_empty() {
                evict_idle(&mut pool, shared.limits.evict_after);
            }
        }
        for c in expired {
            log::warn!("rpc: a connection waited {:?} for a slot; answering busy", shared.limits.queue_wait);
            shared.rejecter.reject(c, busy_error(&shared));
        }
        shared.rejecter.drain();
    }
}

/// How often a connection thread waiting for a method's result checks that its client is there.
const CLIENT_CHECK: Duration = Duration::from_millis(200);

/// Runs one method on the first reactor and waits for its result, but gives up waiting (None)
/// as soon as `client_there` says false, checked every 200 ms: a method that waits
/// (`bdev_get_bdevs` with a `timeout`, `framework_wait_init`) must not hold a connection slot
/// for a client that has gone. The method itself runs on.
pub fn dispatch_while(
    ctx: &Ctx,
    method: String,
    params: Params,
    client_there: impl Fn() -> bool,
) -> Option<Result<serde_json::Value, RpcError>> {
    let c = ctx.clone();
    let mut rx = ctx.engine.run_async(0, move || async move { Registry::call(&c, &method, params).await });
    loop {
        if let Some(r) = rx.wait_for(CLIENT_CHECK) {
            return Some(r.unwrap_or_else(|e| Err(RpcError::internal(e.to_string()))));
        }
        if !client_there() {
            return None;
        }
    }
}
