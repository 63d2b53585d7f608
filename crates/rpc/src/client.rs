//! A blocking JSON-RPC client for the unix socket (used by `ferrite rpc` and the tests).

use crate::jsonrpc::{split_value, FrameScanner, RpcError, Split};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The largest answer read: the server's 4 MiB bound is for requests, and answers grow with
/// what is asked (`bdev_get_bdevs` of 8,000 bdevs is ~5.6 MB).
const MAX_ANSWER: usize = 1 << 30;

/// A connection to a Ferrite (or SPDK) JSON-RPC socket.
pub struct RpcClient {
    conn: UnixStream,
    next_id: u64,
    buf: Vec<u8>,
    /// Where the next value in `buf` ends, found looking at each byte once.
    scanner: FrameScanner,
}

/// Why a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The socket failed or closed.
    Io(std::io::Error),
    /// The server answered with an error.
    Rpc(RpcError),
    /// The server's answer was not a JSON-RPC response.
    Protocol(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Io(e) => write!(f, "{e}"),
            CallError::Rpc(e) => write!(f, "error {}: {}", e.code, e.message),
            CallError::Protocol(m) => write!(f, "bad response: {m}"),
        }
    }
}

impl std::error::Error for CallError {}

impl RpcClient {
    /// Connects, with a timeout for every later reply.
    pub fn connect(path: &Path, timeout: Duration) -> std::io::Result<Self> {
        let conn = UnixStream::connect(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot connect to {}: {e}", path.display())))?;
        conn.set_read_timeout(Some(timeout))?;
        Ok(Self { conn, next_id: 1, buf: Vec::new(), scanner: FrameScanner::default() })
    }

    /// Calls `method` with `params` (None: no params member) and returns the result.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
        if let Some(p) = params {
            req["params"] = p;
        }
        self.conn.write_all(req.to_string().as_bytes()).map_err(CallError::Io)?;
        let resp = self.read_value()?;
        if let Some(err) = resp.get("error") {
            let code = err.get("code").and_then(Value::as_i64).unwrap_or(0) as i32;
            let msg = err.get("message").and_then(Value::as_str).unwrap_or("").to_string();
            return Err(CallError::Rpc(RpcError::new(code, msg)));
        }
        resp.get("result").cloned().ok_or_else(|| CallError::Protocol(resp.to_string()))
    }

    /// Writes raw bytes (for tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.conn.write_all(bytes)
    }

    /// Reads the next JSON value the server sends.
    pub fn read_value(&mut self) -> Result<Value, CallError> {
        let mut chunk = [0u8; 16384];
        loop {
            // Parsed once the scanner has found its end: parsing after every read took
            // seconds for an answer of a few megabytes.
            let end = match self.scanner.scan(&self.buf) {
                Some(end) => Some(end),
                None if self.buf.len() > MAX_ANSWER => Some(self.buf.len()),
                None => None,
            };
            if let Some(end) = end {
                match split_value(&self.buf[..end], MAX_ANSWER) {
                    Split::Complete { consumed, value } => {
                        self.buf.drain(..consumed);
                        self.scanner = FrameScanner::default();
                        return Ok(value);
                    }
                    Split::Invalid { message } => {
                        return Err(CallError::Protocol(message.replace("request", "answer")))
                    }
                    Split::Incomplete => {}
                }
            }
            let n = match self.conn.read(&mut chunk) {
                // A signal to this process: with a read timeout set the kernel does not restart
                // the read, so retry it here (a test saw EINTR as a failed call).
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    let after = self.conn.read_timeout().ok().flatten().unwrap_or_default();
                    return Err(CallError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {after:?} (the timeout)"),
                    )));
                }
                r => r.map_err(CallError::Io)?,
            };
            if n == 0 {
                return Err(CallError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                )));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
