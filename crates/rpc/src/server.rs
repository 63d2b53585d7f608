//! The JSON-RPC server: a unix socket (mode 0600) whose connections are read by small control
//! threads; every request runs on the first reactor, one at a time per connection, in order.

use crate::jsonrpc::{
    encode_error, encode_result, parse_request, split_value, FrameScanner, RpcError, Split, INTERNAL_ERROR,
    MAX_REQUEST, PARSE_ERROR,
};
use crate::registry::{Ctx, Params, Registry};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Default socket path (SPDK's is /var/tmp/spdk.sock; pass `-s /var/tmp/ferrite.sock` to rpc.py).
pub const DEFAULT_SOCKET: &str = "/var/tmp/ferrite.sock";
/// Most connections served at once; more are closed at once with a log line.
pub const MAX_CONNECTIONS: usize = 64;

/// A running server. Dropping it (or `stop`) closes the listener and removes the socket file.
pub struct RpcServer {
    path: PathBuf,
    listen_fd: i32,
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RpcServer {
    /// Binds `path` (replacing a stale socket) and starts serving.
    pub fn start(path: &Path, ctx: Ctx) -> std::io::Result<RpcServer> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{} is in use by another process", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", path.display())))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop2 = stopping.clone();
        let listen_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let thread = std::thread::Builder::new().name("rpc".into()).spawn(move || accept_loop(listener, ctx, stop2))?;
        log::info!("JSON-RPC listening on {}", path.display());
        Ok(RpcServer { path: path.to_path_buf(), listen_fd, stopping, thread: Some(thread) })
    }

    /// Stops accepting and removes the socket.
    pub fn stop(&mut self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocked accept: shutting the listener down works even if the socket file
        // was deleted meanwhile (connecting to it would not).
        // SAFETY: the listener is owned by the accept thread, which is still running (not yet
        // joined), so the descriptor is valid.
        unsafe { libc::shutdown(self.listen_fd, libc::SHUT_RDWR) };
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: UnixListener, ctx: Ctx, stopping: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                log::warn!("rpc accept: {e}");
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            log::warn!("rpc: refusing connection beyond {MAX_CONNECTIONS}");
            continue;
        }
        let (ctx, active, stopping) = (ctx.clone(), active.clone(), stopping.clone());
        let spawned = std::thread::Builder::new().name("rpc-conn".into()).spawn(move || {
            if let Err(e) = serve_connection(conn, &ctx, &stopping) {
                log::debug!("rpc connection ended: {e}");
            }
            active.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            log::warn!("rpc: cannot start connection thread: {e}");
        }
    }
}

/// Runs one method on the first reactor and waits for its result.
pub fn dispatch(ctx: &Ctx, method: String, params: Params) -> Result<serde_json::Value, RpcError> {
    let c = ctx.clone();
    ctx.engine
        .run_async(0, move || async move { Registry::call(&c, &method, params).await })
        .wait()
        .unwrap_or_else(|e| Err(RpcError::new(INTERNAL_ERROR, e.to_string())))
}

fn serve_connection(mut conn: UnixStream, ctx: &Ctx, stopping: &AtomicBool) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16384];
    let mut scanner = FrameScanner::default();
    loop {
        loop {
            let frame = match scanner.scan(&buf) {
                Some(end) => &buf[..end],
                None if buf.len() > MAX_REQUEST => &buf[..],
                None => break,
            };
            match split_value(frame, MAX_REQUEST) {
                Split::Incomplete => break,
                Split::Invalid { message } => {
                    log::warn!("rpc: unparsable request: {message}");
                    let err = RpcError::new(PARSE_ERROR, format!("Parse error: {message}"));
                    conn.write_all(&encode_error(None, &err))?;
                    return Ok(()); // the stream cannot be resynchronised
                }
                Split::Complete { consumed, value } => {
                    buf.drain(..consumed);
                    scanner.reset();
                    let reply = match parse_request(value) {
                        Err((id, err)) => {
                            log::warn!("rpc: invalid request: {}", err.message);
                            Some(encode_error(id.as_ref(), &err))
                        }
                        Ok(req) => {
                            let method = req.method.clone();
                            let res = dispatch(ctx, req.method, Params(req.params));
                            if let Err(e) = &res {
                                log::info!("rpc {method}: error {}: {}", e.code, e.message);
                            }
                            req.id.map(|id| match res {
                                Ok(v) => encode_result(&id, &v),
                                Err(e) => encode_error(Some(&id), &e),
                            })
                        }
                    };
                    if let Some(r) = reply {
                        conn.write_all(&r)?;
                    }
                }
            }
        }
        if stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
