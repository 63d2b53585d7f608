//! Turning connections away politely: a JSON-RPC error is sent, then what the client still sends
//! is read and dropped until it closes (at most [`DRAIN_FOR`]), so that closing our end never
//! resets the connection before the client has read the error (a unix socket closed with unread
//! data resets its peer).

use crate::jsonrpc::{encode_error, RpcError};
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a turned-away connection is drained before it is closed anyway.
pub const DRAIN_FOR: Duration = Duration::from_secs(2);
/// Most connections drained at once; beyond that they are closed at once.
pub const MAX_DRAINING: usize = 1024;

/// Connections that were sent an error and are being drained.
#[derive(Default)]
pub(crate) struct Rejecter {
    draining: Mutex<Vec<(UnixStream, Instant)>>,
}

impl Rejecter {
    /// Sends `err` (id null) on `conn`, stops writing, and drains it in the background.
    pub(crate) fn reject(&self, conn: UnixStream, err: RpcError) {
        let _ = conn.set_nonblocking(true);
        let _ = (&conn).write_all(&encode_error(None, &err));
        let _ = conn.shutdown(Shutdown::Write);
        let mut d = self.draining.lock().unwrap_or_else(|e| e.into_inner());
        if d.len() < MAX_DRAINING {
            d.push((conn, Instant::now() + DRAIN_FOR));
        }
    }

    /// Reads what is pending on each drained connection; closes those the client closed or
    /// whose time is up.
    pub(crate) fn drain(&self) {
        let mut d = self.draining.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let mut chunk = [0u8; 4096];
        d.retain(|(c, deadline)| {
            if now >= *deadline {
                return false;
            }
            loop {
                match (&*c).read(&mut chunk) {
                    Ok(0) => return false,
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return false,
                }
            }
        });
    }
}
