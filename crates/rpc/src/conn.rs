//! One served JSON-RPC connection: framing, timeouts, and answering each request (or batch) in
//! order.

use crate::jsonrpc::{
    encode_batch, encode_error, encode_result, parse_frame, split_value, FrameScanner, Id, Incoming, Request, RpcError,
    Split, MAX_REQUEST, PARSE_ERROR,
};
use crate::registry::Params;
use crate::server::{dispatch_while, Shared};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

const BUSY: u8 = 0;
const IDLE: u8 = 1;
const ENDED: u8 = 2;

/// A served connection as the server's pool sees it: whether it is waiting for a request (and
/// since when), so that an idle one can be closed to make room.
pub(crate) struct Slot {
    fd: RawFd,
    state: AtomicU8,
    idle_since_us: AtomicU64,
    epoch: Instant,
}

impl Slot {
    pub(crate) fn new(fd: RawFd) -> Slot {
        Slot { fd, state: AtomicU8::new(BUSY), idle_since_us: AtomicU64::new(0), epoch: Instant::now() }
    }

    /// How long it has been waiting for a request, if it is.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.state.load(Ordering::SeqCst) != IDLE {
            return None;
        }
        let since = Duration::from_micros(self.idle_since_us.load(Ordering::Relaxed));
        Some(self.epoch.elapsed().saturating_sub(since))
    }

    pub(crate) fn idle_since(&self) -> u64 {
        self.idle_since_us.load(Ordering::Relaxed)
    }

    fn mark_idle(&self) {
        self.idle_since_us.store(self.epoch.elapsed().as_micros() as u64, Ordering::Relaxed);
        let _ = self.state.compare_exchange(BUSY, IDLE, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn mark_busy(&self) {
        let _ = self.state.compare_exchange(IDLE, BUSY, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Ends the connection if it is waiting for a request with nothing half-read: its reader
    /// sees end of file. Call with the pool locked (the descriptor is closed only after its slot
    /// leaves the pool).
    pub(crate) fn end_if_idle(&self) -> bool {
        if self.state.compare_exchange(IDLE, ENDED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            // SAFETY: the descriptor is open while the slot is in the pool (see above).
            unsafe { libc::shutdown(self.fd, libc::SHUT_RD) };
            return true;
        }
        false
    }
}

/// Serves requests on `conn` until the client closes it, it times out or is ended.
pub(crate) fn serve_connection(conn: &UnixStream, shared: &Shared, slot: &Slot) -> std::io::Result<()> {
    let limits = &shared.limits;
    conn.set_write_timeout(Some(limits.write_timeout))?;
    let mut conn_w = conn;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16384];
    let mut scanner = FrameScanner::default();
    let mut request_started = Instant::now();
    let mut at_eof = false;
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
                    shared.rejecter.reject(conn.try_clone()?, err);
                    return Ok(()); // the stream cannot be resynchronised
                }
                Split::Complete { consumed, value } => {
                    let incoming = parse_frame(&buf[..consumed], value);
                    buf.drain(..consumed);
                    scanner.reset();
                    request_started = Instant::now();
                    let Some(reply) = answer_incoming(shared, conn, incoming) else {
                        log::info!("rpc: the client closed its connection before its answer; slot freed");
                        return Ok(());
                    };
                    if let Some(reply) = reply {
                        conn_w.write_all(&reply)?;
                    }
                }
            }
        }
        let partial = buf.iter().any(|b| !b.is_ascii_whitespace());
        if at_eof {
            if partial {
                log::warn!("rpc: request incomplete at end of stream ({} bytes); closing", buf.len() - 1);
                let err = RpcError::new(PARSE_ERROR, "Parse error: request incomplete at end of stream".to_string());
                shared.rejecter.reject(conn.try_clone()?, err);
            }
            return Ok(());
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = if partial {
            request_started + limits.request_timeout
        } else {
            slot.mark_idle();
            Instant::now() + limits.idle_timeout
        };
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        conn.set_read_timeout(Some(left))?;
        let n = match (&*conn).read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if partial {
                    log::warn!("rpc: request incomplete after {:?}; closing", limits.request_timeout);
                    let msg = format!("request timed out: incomplete after {:?}", limits.request_timeout);
                    shared.rejecter.reject(conn.try_clone()?, RpcError::new(PARSE_ERROR, msg));
                } else {
                    log::debug!("rpc: connection idle for {:?}; closing", limits.idle_timeout);
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            // A whitespace byte ends a top-level number as the next request's first byte would
            // have (it is then answered like any value); what stays partial was cut short.
            buf.push(b'\n');
            at_eof = true;
            continue;
        }
        slot.mark_busy();
        if !partial && buf.is_empty() {
            request_started = Instant::now();
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Runs what a frame asks for; returns the bytes to send back, if any, or None if the client
/// closed its connection while a request ran (the rest of a batch is not run).
fn answer_incoming(shared: &Shared, conn: &UnixStream, incoming: Incoming) -> Option<Option<Vec<u8>>> {
    match incoming {
        Incoming::Single(r) => answer(shared, conn, r),
        Incoming::Batch(items) => {
            let mut parts: Vec<Vec<u8>> = Vec::new();
            for r in items {
                parts.extend(answer(shared, conn, r)?);
            }
            Some((!parts.is_empty()).then(|| encode_batch(&parts)))
        }
    }
}

/// True unless the peer of `conn` has closed it (POLLHUP: both directions shut, which for a
/// unix stream socket means the peer closed its end; a client that only shut its writing side
/// still waits for its answer).
fn client_there(conn: &UnixStream) -> bool {
    let mut p = libc::pollfd { fd: conn.as_raw_fd(), events: 0, revents: 0 };
    // SAFETY: one valid pollfd; a zero timeout does not block.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    !(n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
}

/// Runs one request; notifications get no reply, invalid requests always get one. None if the
/// client closed its connection before the method finished.
fn answer(shared: &Shared, conn: &UnixStream, r: Result<Request, (Option<Id>, RpcError)>) -> Option<Option<Vec<u8>>> {
    match r {
        Err((id, err)) => {
            log::warn!("rpc: invalid request: {}", err.message.escape_debug());
            Some(Some(encode_error(id.as_ref(), &err)))
        }
        Ok(req) => {
            let method = req.method.clone();
            let res = dispatch_while(&shared.ctx, req.method, Params(req.params), || client_there(conn))?;
            if let Err(e) = &res {
                // Escaped: names in messages come from the client and must not forge log lines.
                log::info!("rpc {}: error {}: {}", method.escape_debug(), e.code, e.message.escape_debug());
            }
            Some(req.id.map(|id| match res {
                Ok(v) => encode_result(&id, &v),
                Err(e) => encode_error(Some(&id), &e),
            }))
        }
    }
}
