//! The sequence numbers of a connection and of its session: StatSN (per connection), and the
//! session's command window ExpCmdSN..=MaxCmdSN (RFC 7143 sections 4.2.2.1 and 4.2.2.2), as
//! SPDK keeps it: MaxCmdSN starts `queue depth - 1` above ExpCmdSN and moves by one each time a
//! non-immediate command is finished (answered, or ended without an answer), so at most `queue
//! depth` of them are ever outstanding in the session, over all its connections.
//!
//! Once a session has more than one connection, its non-immediate requests are served in CmdSN
//! order: a connection whose next request is ahead of ExpCmdSN waits (its reader stops) until
//! the requests before it have come on the other connections ([`Window::reach`]), at most
//! [`GAP_WAIT`], after which the gap is skipped as on a single connection.
use std::cell::{Cell, OnceCell, RefCell};
use std::future::poll_fn;
use std::future::Future;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long a connection waits for the requests before its next one to come on the session's
/// other connections.
pub(crate) const GAP_WAIT: Duration = Duration::from_secs(10);

/// What to do with a request given its CmdSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmdSnVerdict {
    /// In the window (or the expected immediate one): serve it.
    Accept,
    /// Outside the window: ignore it silently (RFC 7143 section 4.2.2.1).
    Drop,
    /// An immediate request whose CmdSN is not ExpCmdSN: a protocol error that ends the
    /// connection at ErrorRecoveryLevel 0 (as SPDK).
    Fatal,
}

/// True if `a` < `b` in serial number arithmetic (RFC 1982, 32 bits).
pub(crate) fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (a.wrapping_sub(b) as i32) < 0
}

/// A session's command window, shared by its connections (all on one reactor).
#[derive(Debug, Default)]
pub(crate) struct Window {
    exp_cmd_sn: Cell<u32>,
    max_cmd_sn: Cell<u32>,
    /// The session has more than one connection: requests are served in CmdSN order.
    ordered: Cell<bool>,
    /// Readers waiting for ExpCmdSN to reach their request's CmdSN.
    waiting: RefCell<Vec<Waker>>,
}

impl Window {
    /// A window of `size` commands from `exp_cmd_sn` on.
    pub(crate) fn new(exp_cmd_sn: u32, size: u32) -> Window {
        debug_assert!(size >= 1);
        let w = Window::default();
        w.exp_cmd_sn.set(exp_cmd_sn);
        w.max_cmd_sn.set(exp_cmd_sn.wrapping_add(size - 1));
        w
    }

    /// From now on requests are served in CmdSN order (a second connection joined).
    pub(crate) fn set_ordered(&self) {
        self.ordered.set(true);
    }

    /// Checks a request's CmdSN; a non-immediate one in the window moves ExpCmdSN past it.
    /// An immediate one must carry ExpCmdSN on a single connection (NOP-Outs excepted: Linux's
    /// initiator sends stale ones under load, and SPDK lets them through too); once the session
    /// has more than one connection, its immediate requests may carry any CmdSN, as RFC 7143
    /// section 4.2.2.1 allows: the initiator's current CmdSN runs ahead of ExpCmdSN while
    /// requests on other connections are on their way.
    pub(crate) fn check(&self, cmd_sn: u32, immediate: bool, nop: bool) -> CmdSnVerdict {
        let exp = self.exp_cmd_sn.get();
        if immediate {
            return if cmd_sn == exp || nop || self.ordered.get() { CmdSnVerdict::Accept } else { CmdSnVerdict::Fatal };
        }
        if sn_lt(cmd_sn, exp) || sn_lt(self.max_cmd_sn.get(), cmd_sn) {
            return CmdSnVerdict::Drop;
        }
        self.exp_cmd_sn.set(cmd_sn.wrapping_add(1));
        if self.ordered.get() {
            for w in self.waiting.borrow_mut().drain(..) {
                w.wake();
            }
        }
        CmdSnVerdict::Accept
    }

    /// True if a request with `cmd_sn` must wait for others before it: the session serves
    /// requests in CmdSN order and `cmd_sn` lies in the window past ExpCmdSN.
    pub(crate) fn ahead(&self, cmd_sn: u32, immediate: bool) -> bool {
        self.ordered.get() && !immediate && sn_lt(self.exp_cmd_sn.get(), cmd_sn) && self.in_window(cmd_sn)
    }

    /// Waits until ExpCmdSN reaches `cmd_sn` (the requests before it came on other
    /// connections), or `GAP_WAIT` has passed, or `stop` says so (it may keep the context's
    /// waker for its own wake-ups). True if it was reached.
    pub(crate) async fn reach(&self, cmd_sn: u32, stop: impl Fn(&mut Context<'_>) -> bool) -> bool {
        let deadline = Instant::now() + GAP_WAIT;
        let mut timer = std::pin::pin!(ferrite_reactor::sleep(GAP_WAIT));
        poll_fn(|cx| {
            if !sn_lt(self.exp_cmd_sn.get(), cmd_sn) {
                return Poll::Ready(true);
            }
            if stop(cx) || Instant::now() >= deadline || timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(false);
            }
            let mut w = self.waiting.borrow_mut();
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Wakes every waiting reader (one of them is closing).
    pub(crate) fn wake_all(&self) {
        for w in self.waiting.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// True if `cmd_sn` lies in the window (for ABORT TASK's RefCmdSN).
    pub(crate) fn in_window(&self, cmd_sn: u32) -> bool {
        !sn_lt(cmd_sn, self.exp_cmd_sn.get()) && !sn_lt(self.max_cmd_sn.get(), cmd_sn)
    }

    /// A non-immediate request was finished: the window opens by one.
    pub(crate) fn open(&self) {
        self.max_cmd_sn.set(self.max_cmd_sn.get().wrapping_add(1));
        debug_assert!(!sn_lt(self.max_cmd_sn.get(), self.exp_cmd_sn.get().wrapping_sub(1)));
    }

    /// ExpCmdSN.
    pub(crate) fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.get()
    }

    /// MaxCmdSN.
    pub(crate) fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn.get()
    }
}

/// A connection's StatSN and its session's command window.
#[derive(Debug, Default)]
pub(crate) struct Seq {
    stat_sn: Cell<u32>,
    window: OnceCell<Rc<Window>>,
}

impl Seq {
    /// Starts the full feature phase: the next StatSN and the session's window.
    pub(crate) fn start(&self, stat_sn: u32, window: Rc<Window>) {
        self.stat_sn.set(stat_sn);
        let set = self.window.set(window).is_ok();
        debug_assert!(set, "a connection starts its full feature phase once");
    }

    /// The session's window (from the full feature phase on).
    pub(crate) fn window(&self) -> Option<&Rc<Window>> {
        self.window.get()
    }

    /// See [`Window::check`].
    pub(crate) fn check(&self, cmd_sn: u32, immediate: bool, nop: bool) -> CmdSnVerdict {
        match self.window.get() {
            Some(w) => w.check(cmd_sn, immediate, nop),
            None => CmdSnVerdict::Drop,
        }
    }

    /// See [`Window::in_window`].
    pub(crate) fn in_window(&self, cmd_sn: u32) -> bool {
        self.window.get().is_some_and(|w| w.in_window(cmd_sn))
    }

    /// See [`Window::open`].
    pub(crate) fn open(&self) {
        if let Some(w) = self.window.get() {
            w.open();
        }
    }

    /// The StatSN to put in a status PDU; the next one is one more.
    pub(crate) fn take_stat_sn(&self) -> u32 {
        let s = self.stat_sn.get();
        self.stat_sn.set(s.wrapping_add(1));
        s
    }

    /// The next StatSN, without advancing it (R2T, Data-In without status, unsolicited
    /// NOP-In).
    pub(crate) fn stat_sn(&self) -> u32 {
        self.stat_sn.get()
    }

    /// ExpCmdSN.
    pub(crate) fn exp_cmd_sn(&self) -> u32 {
        self.window.get().map_or(0, |w| w.exp_cmd_sn())
    }

    /// MaxCmdSN.
    pub(crate) fn max_cmd_sn(&self) -> u32 {
        self.window.get().map_or(0, |w| w.max_cmd_sn())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_spdks_rules() {
        let s = Seq::default();
        s.start(7, Rc::new(Window::new(10, 2)));
        assert_eq!((s.exp_cmd_sn(), s.max_cmd_sn()), (10, 11));
        assert_eq!(s.check(9, false, false), CmdSnVerdict::Drop, "below the window");
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Drop, "above the window");
        assert_eq!(s.check(11, true, false), CmdSnVerdict::Fatal, "an immediate one must carry ExpCmdSN");
        assert_eq!(s.check(11, true, true), CmdSnVerdict::Accept, "but a NOP-Out may not");
        assert_eq!(s.check(10, true, false), CmdSnVerdict::Accept);
        assert_eq!(s.exp_cmd_sn(), 10, "immediate requests do not move ExpCmdSN");
        assert_eq!(s.check(10, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(11, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Drop, "the window is full");
        s.open();
        assert!(s.in_window(12) && !s.in_window(11));
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Accept);
        assert_eq!((s.take_stat_sn(), s.stat_sn()), (7, 8));
    }

    #[test]
    fn serial_numbers_wrap() {
        let s = Seq::default();
        s.start(0, Rc::new(Window::new(u32::MAX, 4)));
        assert_eq!(s.max_cmd_sn(), 2);
        assert_eq!(s.check(u32::MAX, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(0, false, false), CmdSnVerdict::Accept);
        assert!(sn_lt(u32::MAX, 0) && !sn_lt(0, u32::MAX));
        assert_eq!(s.check(u32::MAX - 1, false, false), CmdSnVerdict::Drop);
    }
}
