//! A reactor's session to a LUN: its connection (made when first needed, made again after
//! it drops), the bdev requests waiting for it, and the watchdog that bounds both.
//!
//! Each reactor that submits to an iSCSI bdev has a session of its own (one connection, its
//! own ISID: the LUN's random part with the reactor's number as qualifier), as the NVMe/TCP
//! host has a queue pair per reactor: nothing on the data path is shared between cores.
//!
//! A request is sent at once when the connection is up, has a free task slot and the CmdSN
//! window is open; otherwise it waits here, in order, in a bounded queue (past it the bdev
//! layer gets NoMem and retries), and goes as soon as a command ends or the target opens the
//! window. When the connection drops (the target went away, broke the protocol, asked for a
//! logout), its outstanding requests come back to the front of the queue and the session logs
//! in again (a new session; the target reinstates it if it still knows the ISID): at once if
//! the connection was of use (a command ended with a status on it, or it lived a second),
//! else after a back-off of 0.1 s doubling up to 1 s per login in a row that gave nothing (a
//! target that logs in and breaks the connection at once is not logged in to in a loop). A
//! request that has waited `timeout_sec` since it was submitted
//! (30 s when that is 0) fails with EIO; a command the target has not answered within
//! `timeout_sec` drops the connection, its requests to be sent again. The bdev stays.

use crate::command;
use crate::conn::{Conn, ConnOwner};
use crate::lun::LunShared;
use crate::scsi::Verdict;
use ferrite_bdev::{BdevIo, IoStatus};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The watchdog's period.
pub const TICK: Duration = Duration::from_secs(1);
/// Requests that may wait for the connection (or the window) per session.
pub const MAX_WAITING: usize = 256;
/// Times a command is sent again after a unit attention.
pub const MAX_UA_RETRIES: u8 = 8;
/// How long a request waits for a connection when `timeout_sec` is 0.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// How long the `attempt`th login in a row that gave no useful connection waits: 0.1 s, then
/// doubling up to 1 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(100u64 << (attempt - 1).min(4)).min(Duration::from_secs(1))
}

/// How long a request answered BUSY or TASK SET FULL for the `n`th time in a row waits before
/// it is sent again: 1 ms doubling up to 10 ms.
pub(crate) fn busy_delay(n: u8) -> Duration {
    Duration::from_millis((1u64 << n.min(4)).min(10))
}

/// A request's context in this module.
#[derive(Debug, Clone, Copy)]
struct HostIo {
    /// When the request came (its first submission: resends keep it).
    since: Instant,
    /// Times it was sent again after a unit attention.
    retries: u8,
    /// Times in a row the target answered it BUSY or TASK SET FULL.
    busy: u8,
}

/// A reactor's session to a LUN.
pub(crate) struct Session {
    lun: Arc<LunShared>,
    /// The ISID qualifier (the reactor's number).
    qualifier: u16,
    conn: RefCell<Option<Rc<Conn>>>,
    waiting: RefCell<VecDeque<BdevIo>>,
    connecting: Cell<bool>,
    watching: Cell<bool>,
    /// Ticks of the watchdog so far.
    tick: Cell<u32>,
    /// The channel went away: nothing more is sent.
    closed: Cell<bool>,
    /// A connection was up before (the next one is a reconnection).
    was_up: Cell<bool>,
    /// Logins in a row that did not give a useful connection (failed, or the connection
    /// dropped at once): the next login waits for the back-off first.
    attempt: Cell<u32>,
    me: Weak<Session>,
}

impl Session {
    /// A session for `lun` on the calling reactor (connected when first needed).
    pub(crate) fn new(lun: Arc<LunShared>, qualifier: u16) -> Rc<Session> {
        Rc::new_cyclic(|me| Session {
            lun,
            qualifier,
            conn: RefCell::new(None),
            waiting: RefCell::new(VecDeque::with_capacity(MAX_WAITING)),
            connecting: Cell::new(false),
            watching: Cell::new(false),
            tick: Cell::new(0),
            closed: Cell::new(false),
            was_up: Cell::new(false),
            attempt: Cell::new(0),
            me: me.clone(),
        })
    }

    fn gone(&self) -> bool {
        self.closed.get() || self.lun.removed.load(Ordering::Acquire)
    }

    /// A request from the bdev layer (completes only deferred).
    pub(crate) fn submit(&self, mut io: BdevIo) {
        if self.gone() {
            return io.complete_deferred(IoStatus::Removed);
        }
        io.set_ctx(HostIo { since: Instant::now(), retries: 0, busy: 0 });
        self.send(io);
    }

    /// The connection, if it is up.
    fn up(&self) -> Option<Rc<Conn>> {
        self.conn.borrow().clone().filter(|c| !c.is_closed())
    }

    /// Sends `io` now if nothing waits before it and the connection takes it; else it waits.
    fn send(&self, io: BdevIo) {
        let io = match self.up() {
            Some(c) if self.waiting.borrow().is_empty() => match command::of(&io, self.lun.unmap) {
                Err(st) => return io.complete_deferred(st),
                Ok(cmd) => match c.submit_io(io, cmd) {
                    Ok(()) => return,
                    Err(io) => io,
                },
            },
            _ => io,
        };
        if self.waiting.borrow().len() >= MAX_WAITING {
            return io.complete_deferred(IoStatus::NoMem);
        }
        self.waiting.borrow_mut().push_back(io);
        self.drain();
        self.connect();
        self.watch();
    }

    /// Sends what waits, in order, while the connection takes it.
    fn drain(&self) {
        let Some(c) = self.up() else { return };
        while c.can_send() {
            let Some(io) = self.waiting.borrow_mut().pop_front() else { return };
            match command::of(&io, self.lun.unmap) {
                Err(st) => io.complete_deferred(st),
                Ok(cmd) => {
                    if let Err(io) = c.submit_io(io, cmd) {
                        self.waiting.borrow_mut().push_front(io);
                        return;
                    }
                }
            }
        }
    }

    /// Fails everything waiting with `st`.
    fn fail_waiting(&self, st: IoStatus) {
        let all: Vec<BdevIo> = self.waiting.borrow_mut().drain(..).collect();
        for io in all {
            io.complete_deferred(st);
        }
    }

    /// Logs in unless logging in already; sends what waits once logged in.
    fn connect(&self) {
        if self.up().is_some() || self.connecting.replace(true) {
            return;
        }
        let me = self.me.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                let Some(s) = me.upgrade() else { return };
                let attempt = s.attempt.get();
                drop(s);
                if attempt > 0 {
                    ferrite_reactor::sleep(backoff(attempt)).await;
                }
                let Some(s) = me.upgrade() else { return };
                if s.gone() {
                    s.fail_waiting(IoStatus::Removed);
                    break;
                }
                if s.waiting.borrow().is_empty() {
                    // Nothing waits: the next request logs in.
                    break;
                }
                let params = s.lun.connect_params(s.qualifier);
                let owner: Weak<dyn ConnOwner> = me.clone();
                drop(s);
                let res = Conn::connect_owned(&params, Some(owner)).await;
                let Some(s) = me.upgrade() else { return };
                // Counted until the connection proves useful ([`ConnOwner::lost`] resets it).
                s.attempt.set(attempt.saturating_add(1));
                match res {
                    Ok(c) if s.gone() => {
                        ferrite_reactor::spawn_local(async move { c.logout(Duration::from_secs(2)).await }).detach();
                    }
                    Ok(c) => {
                        c.set_tick(s.tick.get());
                        if s.was_up.replace(true) || attempt > 0 {
                            s.lun.reconnects.fetch_add(1, Ordering::Relaxed);
                            ferrite_reactor::log_limited!(
                                log::Level::Info,
                                "iscsi bdev {}: reactor {} logged in again to {} (connection {})",
                                s.lun.name,
                                s.qualifier,
                                s.lun.addr,
                                c.id()
                            );
                        }
                        s.lun.sessions.fetch_add(1, Ordering::Relaxed);
                        *s.conn.borrow_mut() = Some(c);
                        s.connecting.set(false);
                        s.drain();
                        return;
                    }
                    Err(e) => {
                        let n = attempt + 1;
                        if n == 1 || n.is_multiple_of(10) {
                            log::warn!(
                                "iscsi bdev {}: reactor {}: login to {} failed (attempt {n}): {e}",
                                s.lun.name,
                                s.qualifier,
                                s.lun.addr
                            );
                        }
                    }
                }
            }
            if let Some(s) = me.upgrade() {
                s.connecting.set(false);
            }
        })
        .detach();
    }

    /// How long a request may take from its submission, wherever it is.
    fn limit(&self) -> Duration {
        match self.lun.timeout_sec {
            0 => DEFAULT_WAIT,
            s => Duration::from_secs(s),
        }
    }

    /// How long a request may wait, in ticks.
    fn wait_limit(&self) -> u32 {
        (self.limit().as_millis() / TICK.as_millis()).clamp(1, u128::from(u32::MAX / 2)) as u32
    }

    /// True if `io` was submitted `limit()` ago or longer.
    fn expired(&self, io: &BdevIo) -> bool {
        io.ctx::<HostIo>().is_some_and(|h| h.since.elapsed() >= self.limit())
    }

    /// Sends `io` again (after a BUSY), unless its time is up or the session went away.
    fn resend(&self, io: BdevIo) {
        if self.gone() {
            return io.complete(IoStatus::Removed);
        }
        if self.expired(&io) {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi bdev {}: reactor {}: a request failed after the target answered BUSY for {:?}",
                self.lun.name,
                self.qualifier,
                self.limit()
            );
            return io.complete(IoStatus::Failed(libc::EIO));
        }
        self.send(io);
    }

    /// Starts the watchdog unless it runs: every tick while requests wait or commands are
    /// outstanding, it fails requests that waited too long and drops a connection whose
    /// command the target has not answered in time.
    fn watch(&self) {
        if self.watching.replace(true) {
            return;
        }
        let me = self.me.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                ferrite_reactor::sleep(TICK).await;
                let Some(s) = me.upgrade() else { return };
                if !s.watch_turn() {
                    s.watching.set(false);
                    return;
                }
            }
        })
        .detach();
    }

    /// One watchdog turn; false when there is nothing left to watch.
    fn watch_turn(&self) -> bool {
        let now = self.tick.get().wrapping_add(1);
        self.tick.set(now);
        let conn = self.up();
        if let Some(c) = &conn {
            c.set_tick(now);
        }
        if self.gone() {
            self.fail_waiting(IoStatus::Removed);
        }
        let limit = self.wait_limit();
        let mut late: Vec<BdevIo> = Vec::new();
        {
            let mut w = self.waiting.borrow_mut();
            for _ in 0..w.len() {
                let io = w.pop_front().expect("counted");
                if self.expired(&io) {
                    late.push(io);
                } else {
                    w.push_back(io);
                }
            }
        }
        if !late.is_empty() {
            log::warn!(
                "iscsi bdev {}: reactor {}: {} request(s) failed after waiting {:?} for the target",
                self.lun.name,
                self.qualifier,
                late.len(),
                self.limit()
            );
            for io in late {
                io.complete(IoStatus::Failed(libc::EIO));
            }
        }
        if let Some(c) = &conn {
            // A request on the wire whose time is up: the connection is dropped (its buffers
            // are the connection's until both its tasks stop), and the request fails then.
            if self.lun.timeout_sec > 0 && c.any_request(|io| self.expired(io)) {
                log::warn!(
                    "iscsi bdev {}: reactor {}: a request unanswered {} s after its submission; dropping connection {} to fail it",
                    self.lun.name,
                    self.qualifier,
                    self.lun.timeout_sec,
                    c.id()
                );
                c.close();
            } else if self.lun.timeout_sec > 0 && c.stuck(now, limit) {
                log::warn!(
                    "iscsi bdev {}: reactor {}: a command unanswered for {} s; dropping connection {} to send it again",
                    self.lun.name,
                    self.qualifier,
                    self.lun.timeout_sec,
                    c.id()
                );
                c.close();
            }
        }
        !self.waiting.borrow().is_empty() || conn.is_some_and(|c| c.outstanding() > 0)
    }

    /// The channel goes away: what waits fails, the connection logs out.
    pub(crate) fn close(&self) {
        self.closed.set(true);
        self.fail_waiting(IoStatus::Removed);
        if let Some(c) = self.conn.borrow_mut().take() {
            self.lun.sessions.fetch_sub(1, Ordering::Relaxed);
            ferrite_reactor::spawn_local(async move { c.logout(Duration::from_secs(2)).await }).detach();
        }
    }
}

impl ConnOwner for Session {
    fn room(&self) {
        if !self.waiting.borrow().is_empty() {
            self.drain();
        }
    }

    fn done(&self, mut io: BdevIo, v: Verdict) {
        match v {
            Verdict::Success => io.complete(IoStatus::Success),
            Verdict::Busy => {
                // Sent again after a short delay (not at once: a target answering BUSY forever
                // is not a busy loop), until the request's time is up.
                let h = io.ctx_mut::<HostIo>().expect("set at submission");
                let delay = busy_delay(h.busy);
                h.busy = h.busy.saturating_add(1);
                let me = self.me.clone();
                ferrite_reactor::spawn_local(async move {
                    ferrite_reactor::sleep(delay).await;
                    match me.upgrade() {
                        Some(s) => s.resend(io),
                        None => io.complete(IoStatus::Removed),
                    }
                })
                .detach();
            }
            Verdict::Fail(st) => io.complete(st),
            Verdict::Retry => {
                let h = io.ctx_mut::<HostIo>().expect("set at submission");
                if h.retries >= MAX_UA_RETRIES || self.gone() {
                    return io.complete(IoStatus::Failed(libc::EIO));
                }
                h.retries += 1;
                self.send(io);
            }
        }
    }

    fn lost(&self, conn: u64, ios: Vec<BdevIo>) {
        if let Some(c) = self.conn.borrow().as_ref().filter(|c| c.id() == conn) {
            if c.was_useful() {
                self.attempt.set(0);
            }
        }
        let had = {
            let mut cur = self.conn.borrow_mut();
            // Only the session's current connection (a newer one may be up already).
            if cur.as_ref().is_some_and(|c| c.id() == conn) {
                cur.take()
            } else {
                None
            }
        };
        if had.is_some() {
            self.lun.sessions.fetch_sub(1, Ordering::Relaxed);
        }
        if self.gone() {
            ios.into_iter().for_each(|io| io.complete(IoStatus::Removed));
            return;
        }
        // Those whose time is up fail; the others are sent again.
        let (late, ios): (Vec<BdevIo>, Vec<BdevIo>) = ios.into_iter().partition(|io| self.expired(io));
        if !late.is_empty() {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi bdev {}: reactor {}: {} request(s) failed, unanswered {:?} after their submission",
                self.lun.name,
                self.qualifier,
                late.len(),
                self.limit()
            );
            late.into_iter().for_each(|io| io.complete(IoStatus::Failed(libc::EIO)));
        }
        {
            let mut w = self.waiting.borrow_mut();
            for io in ios.into_iter().rev() {
                w.push_front(io);
            }
        }
        if !self.waiting.borrow().is_empty() {
            self.connect();
            self.watch();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_back_off_up_to_a_second() {
        let d: Vec<u64> = (0..7).map(|a| backoff(a).as_millis() as u64).collect();
        assert_eq!(d, [0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn busy_is_retried_after_1_to_10_ms() {
        let d: Vec<u64> = (0..6).map(|n| busy_delay(n).as_millis() as u64).collect();
        assert_eq!(d, [1, 2, 4, 8, 10, 10]);
        assert_eq!(busy_delay(u8::MAX), Duration::from_millis(10));
    }
}
