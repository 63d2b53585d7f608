//! The core of one connection, shared by its reader task, its writer task and whoever closes
//! it: the socket, the two flags of its end, the wakers of the two tasks (and of a graceful
//! close waiting for the connection to drain), and the progress of the send and the receive
//! under way, which the reactor's watchdog bounds. A target and the NVMe/TCP host use it alike.

use ferrite_reactor::net::Socket;
use ferrite_reactor::tsc::{duration_to_ticks, ticks};
use std::cell::{Cell, RefCell};
use std::task::{Context, Waker};
use std::time::Duration;

/// A transfer under way on a connection: the tick it began at and its bytes (none while idle).
#[derive(Default)]
pub struct Progress(Cell<Option<(u64, usize)>>);

impl Progress {
    /// A transfer of `bytes` begins now.
    #[inline]
    pub fn begin(&self, bytes: usize) {
        self.0.set(Some((ticks(), bytes)));
    }

    /// The transfer ended.
    #[inline]
    pub fn end(&self) {
        self.0.set(None);
    }

    /// The transfer under way, if any: when it began (ticks) and its bytes.
    pub fn get(&self) -> Option<(u64, usize)> {
        self.0.get()
    }

    /// True if a transfer has taken longer than `base` plus `per_mib` for each MiB of it, at
    /// tick `now` (a peer that stopped reading or sending).
    pub fn stalled(&self, now: u64, base: Duration, per_mib: Duration) -> bool {
        let Some((since, bytes)) = self.0.get() else { return false };
        let limit = base + per_mib * (bytes >> 20) as u32;
        now.saturating_sub(since) > duration_to_ticks(limit)
    }
}

/// The shared core of a connection.
pub struct ConnCore {
    /// Connection id, unique in the process for its target.
    pub id: u64,
    /// The socket.
    pub sock: Socket,
    /// The peer's address, for the log.
    pub peer: String,
    /// The protocol's name in the log ("nbd", "nvmf", "nvme host").
    proto: &'static str,
    /// No new work is taken (a target reads no more requests, a host sends no more commands);
    /// what is in flight still ends.
    closing: Cell<bool>,
    /// Closed for good: nothing more is sent, replies are dropped as their I/O completes.
    dead: Cell<bool>,
    writer: RefCell<Option<Waker>>,
    reader: RefCell<Option<Waker>>,
    /// A graceful close waiting for the connection to drain (`close::close_gracefully`).
    closer: RefCell<Option<Waker>>,
    /// The tick the connection was accepted at.
    pub accepted: u64,
    /// The tick its handshake must end by (0: no bound, or done).
    handshake_by: Cell<u64>,
    /// The batch of replies being sent.
    pub sending: Progress,
    /// The payload being received.
    pub receiving: Progress,
}

impl ConnCore {
    /// The core of a connection accepted now.
    pub fn new(proto: &'static str, id: u64, sock: Socket, peer: String) -> Self {
        ConnCore {
            id,
            sock,
            peer,
            proto,
            closing: Cell::new(false),
            dead: Cell::new(false),
            writer: RefCell::new(None),
            reader: RefCell::new(None),
            closer: RefCell::new(None),
            accepted: ticks(),
            handshake_by: Cell::new(0),
            sending: Progress::default(),
            receiving: Progress::default(),
        }
    }

    /// Bounds the handshake: the reactor's watchdog closes the connection if it has not called
    /// [`ConnCore::handshake_done`] within `limit` of its accept.
    pub fn handshake_within(&self, limit: Duration) {
        self.handshake_by.set(self.accepted.saturating_add(duration_to_ticks(limit)).max(1));
    }

    /// The handshake is done (NBD's export chosen, NVMe/TCP's Connect answered).
    pub fn handshake_done(&self) {
        self.handshake_by.set(0);
    }

    /// True if the handshake is past its bound at tick `now`.
    pub fn handshake_overdue(&self, now: u64) -> bool {
        let by = self.handshake_by.get();
        by != 0 && now > by
    }

    /// Closes the connection for good: nothing more is read or sent, the socket is shut down
    /// (a send or receive blocked on the peer ends), and both tasks are woken.
    pub fn close(&self) {
        if !self.dead.replace(true) {
            log::info!("{} connection {}: closing", self.proto, self.id);
        }
        self.closing.set(true);
        self.sock.shutdown();
        self.wake();
    }

    /// Takes no new work: a target reads no more requests, a host sends no more commands;
    /// what is in flight still ends (replies are sent, completions are read).
    pub fn stop_taking(&self) {
        self.closing.set(true);
        self.wake();
    }

    /// True once no new work is taken (draining, or closed).
    #[inline]
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// True once the connection is closed for good.
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.dead.get()
    }

    /// Wakes the reader and the writer tasks, and a graceful close (each looks again at what it
    /// waits for). A connection calls it when its last command ends while it is closing.
    pub fn wake(&self) {
        self.wake_writer();
        self.wake_reader();
        if let Some(w) = self.closer.borrow_mut().take() {
            w.wake();
        }
    }

    /// Wakes the writer task (replies were queued).
    #[inline]
    pub fn wake_writer(&self) {
        if let Some(w) = self.writer.borrow_mut().take() {
            w.wake();
        }
    }

    /// Wakes the reader task (room was made: it may read again).
    #[inline]
    pub fn wake_reader(&self) {
        if let Some(w) = self.reader.borrow_mut().take() {
            w.wake();
        }
    }

    /// Parks the writer task (in its poll) until [`ConnCore::wake_writer`] or a close.
    #[inline]
    pub fn park_writer(&self, cx: &mut Context<'_>) {
        *self.writer.borrow_mut() = Some(cx.waker().clone());
    }

    /// Parks the reader task (in its poll) until [`ConnCore::wake_reader`] or a close.
    #[inline]
    pub fn park_reader(&self, cx: &mut Context<'_>) {
        *self.reader.borrow_mut() = Some(cx.waker().clone());
    }

    /// Parks a graceful close (in its poll) until [`ConnCore::wake`].
    pub(crate) fn park_closer(&self, cx: &mut Context<'_>) {
        *self.closer.borrow_mut() = Some(cx.waker().clone());
    }

    /// Marks the connection dead without shutting the socket (a protocol that sends a last
    /// message of its own, such as a termination request, does so next).
    pub fn set_dead(&self) {
        self.dead.set(true);
    }
}
