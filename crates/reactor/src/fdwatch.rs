//! Waiting for a descriptor to become readable, on the reactor's io_uring: a vhost target's
//! kick eventfds (one per virtqueue) are the typical use.
//!
//! An [`FdWatch`] owns its descriptor and arms one `IORING_OP_POLL_ADD` for `POLLIN` when first
//! waited on. Where the kernel has multishot poll (`IORING_POLL_ADD_MULTI`, Linux 5.13) that
//! poll stays armed and posts a completion each time the descriptor is woken; otherwise (a
//! multishot poll refused with `-EINVAL`, said once in the log) each wait arms a one-shot poll.
//! The reactor sleeps meanwhile like for any other operation in flight: a completion wakes it.
//!
//! A wait reports readiness seen since the previous wait returned, or now: after a wait returns,
//! the owner drains the descriptor (an eventfd: [`crate::eventfd::drain`]) and waits again; a
//! signal that arrives after the drain posts a new completion, so none is lost. A wait may
//! return with nothing to read (a signal the drain already took): drains must not block, which
//! is why `FdWatch::new` makes the descriptor non-blocking.
//!
//! Closing (dropping the watch, or [`FdWatch::close`]) cancels the armed poll by its
//! `user_data`; nothing is reported afterwards, and the descriptor is closed once the poll's
//! last completion has arrived, so its number is never reused while the kernel may still poll
//! it. A waiter woken by `close` gets an error. (Closing the descriptor behind the watch's back
//! would not end the poll, which holds the file: that is why the watch owns it.)

use crate::ring::{uring_opcode as op, uring_types as types, CqeHandler, RingFull};
use crate::try_with_ring;
use io_uring::cqueue;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// False once a multishot poll was refused: the kernel predates Linux 5.13.
static MULTISHOT_POLL: AtomicBool = AtomicBool::new(true);

/// True unless the kernel refused a multishot poll (then every watch arms one-shot polls).
pub fn multishot_poll_supported() -> bool {
    MULTISHOT_POLL.load(Ordering::Relaxed)
}

/// A descriptor watched for readability from one reactor (see the module doc).
pub struct FdWatch {
    inner: Rc<Watch>,
}

/// The watch's state, shared with the ring while a poll is armed.
struct Watch {
    fd: RawFd,
    /// Multishot polls allowed for this watch (false: one poll per wait).
    multishot: bool,
    /// `user_data` of the poll in flight, and whether it is multishot.
    armed: Cell<Option<(u64, bool)>>,
    /// A readiness completion arrived that no wait has reported yet.
    ready: Cell<bool>,
    /// A poll failed with this errno, not reported yet.
    error: Cell<Option<i32>>,
    /// Closed: nothing is reported any more.
    closed: Cell<bool>,
    /// Closed while armed, and the cancel could not be queued: retried on the next completion.
    cancel_wanted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours (taken from an OwnedFd), and no poll holds it any more
        // (the ring drops its reference to this state only after the last completion).
        unsafe { libc::close(self.fd) };
    }
}

impl FdWatch {
    /// Watches `fd` (made non-blocking: see the module doc), with a multishot poll where the
    /// kernel has it. Nothing is armed before the first wait.
    pub fn new(fd: OwnedFd) -> io::Result<FdWatch> {
        Self::with_mode(fd, true)
    }

    /// Like [`FdWatch::new`], but arming a one-shot poll for each wait (what `new` falls back to
    /// on kernels without multishot poll).
    pub fn oneshot(fd: OwnedFd) -> io::Result<FdWatch> {
        Self::with_mode(fd, false)
    }

    fn with_mode(fd: OwnedFd, multishot: bool) -> io::Result<FdWatch> {
        crate::eventfd::set_nonblocking(fd.as_fd())?;
        Ok(FdWatch {
            inner: Rc::new(Watch {
                fd: fd.into_raw_fd(),
                multishot,
                armed: Cell::new(None),
                ready: Cell::new(false),
                error: Cell::new(None),
                closed: Cell::new(false),
                cancel_wanted: Cell::new(false),
                waker: RefCell::new(None),
            }),
        })
    }

    /// Completes when the descriptor is readable (or at hang-up or error, which the next read
    /// reports), or with an error: the poll failed, the watch was closed, or the call is not
    /// on a reactor. One waiter at a time (the watch keeps one waker). Dropping the future
    /// leaves the poll armed for the next wait.
    pub fn readable(&self) -> Readable<'_> {
        Readable { watch: self }
    }

    /// The form for pollers: true if the descriptor became readable since the last call (or
    /// wait); arms the poll if needed. Never blocks.
    pub fn take_ready(&self) -> io::Result<bool> {
        match self.inner.check(None) {
            Poll::Ready(r) => r.map(|()| true),
            Poll::Pending => Ok(false),
        }
    }

    /// Reads and resets the eventfd's counter (see [`crate::eventfd::drain`]).
    pub fn drain(&self) -> io::Result<u64> {
        crate::eventfd::drain(self.as_fd())
    }

    /// True while a poll is in flight.
    pub fn is_armed(&self) -> bool {
        self.inner.armed.get().is_some()
    }

    /// Stops watching: cancels the armed poll and wakes a waiter, which gets an error. The
    /// descriptor is closed when the watch is dropped and the poll's last completion has
    /// arrived.
    pub fn close(&self) {
        self.inner.close();
    }
}

impl AsFd for FdWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the watch owns the descriptor, open until its state drops.
        unsafe { BorrowedFd::borrow_raw(self.inner.fd) }
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.inner.close();
    }
}

impl Watch {
    /// One look at the state: readiness or an error to report, else arms the poll if needed
    /// and keeps `waker` for the completion.
    fn check(self: &Rc<Self>, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        if self.closed.get() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::NotConnected, "the fd watch is closed")));
        }
        if self.ready.replace(false) {
            return Poll::Ready(Ok(()));
        }
        if let Some(errno) = self.error.take() {
            return Poll::Ready(Err(io::Error::from_raw_os_error(errno)));
        }
        if self.armed.get().is_none() {
            match self.arm() {
                Ok(()) => {}
                Err(ArmError::NotOnReactor) => {
                    return Poll::Ready(Err(io::Error::other("FdWatch used off a reactor")));
                }
                Err(ArmError::Full) => {
                    // Rare: the submission queue and handler table are full. Try again soon.
                    if let Some(w) = waker.cloned() {
                        crate::after(Duration::from_micros(50), move || w.wake());
                    }
                    return Poll::Pending;
                }
            }
        }
        if let Some(w) = waker {
            let mut kept = self.waker.borrow_mut();
            if !kept.as_ref().is_some_and(|k| k.will_wake(w)) {
                *kept = Some(w.clone());
            }
        }
        Poll::Pending
    }

    fn arm(self: &Rc<Self>) -> Result<(), ArmError> {
        let multi = self.multishot && multishot_poll_supported();
        let e = op::PollAdd::new(types::Fd(self.fd), libc::POLLIN as u32).multi(multi).build();
        let handler: Rc<dyn CqeHandler> = self.clone();
        // SAFETY: a poll names no memory, only the descriptor, which this state (held by the
        // ring until the last completion) keeps open.
        let pushed = try_with_ring(|r| unsafe { r.push_with_id(e, handler, 0) }).ok_or(ArmError::NotOnReactor)?;
        let id = pushed.map_err(|RingFull| ArmError::Full)?;
        self.armed.set(Some((id, multi)));
        Ok(())
    }

    fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        self.ready.set(false);
        self.cancel();
        let w = self.waker.borrow_mut().take();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Queues the cancel of the armed poll (if any); if the ring cannot take it now, the next
    /// completion tries again.
    fn cancel(&self) {
        let Some((id, _)) = self.armed.get() else { return };
        let queued = try_with_ring(|r| r.cancel_op(id, Rc::new(IgnoreCancel), 0).is_ok()).unwrap_or(false);
        self.cancel_wanted.set(!queued);
    }

    fn wake(&self) {
        let w = self.waker.borrow_mut().take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

enum ArmError {
    NotOnReactor,
    Full,
}

/// The cancel's own completion, which says nothing the poll's does not.
struct IgnoreCancel;

impl CqeHandler for IgnoreCancel {
    fn complete(&self, _tag: u64, _result: i32) {}
}

impl CqeHandler for Watch {
    fn complete(&self, tag: u64, result: i32) {
        self.complete_flags(tag, result, 0)
    }

    fn complete_flags(&self, _tag: u64, result: i32, flags: u32) {
        let more = cqueue::more(flags);
        let was_multi = self.armed.get().is_some_and(|(_, m)| m);
        if !more {
            self.armed.set(None);
        }
        if self.closed.get() {
            if more && self.cancel_wanted.get() {
                self.cancel();
            }
            return;
        }
        match result {
            r if r >= 0 => self.ready.set(true),
            // Ended by the kernel (not by us: we cancel only when closed): the next wait arms
            // again.
            r if r == -libc::ECANCELED => {}
            r if r == -libc::EINVAL && was_multi && !more => {
                if MULTISHOT_POLL.swap(false, Ordering::Relaxed) {
                    log::warn!("io_uring multishot poll unavailable (Linux < 5.13?); fd watches poll one-shot");
                }
            }
            r => self.error.set(Some(-r)),
        }
        // The waiter looks again: it reports what arrived, or arms again.
        self.wake();
    }
}

/// The future of [`FdWatch::readable`].
pub struct Readable<'a> {
    watch: &'a FdWatch,
}

impl Future for Readable<'_> {
    type Output = io::Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.watch.inner.check(Some(cx.waker()))
    }
}

impl Drop for Readable<'_> {
    fn drop(&mut self) {
        // The poll stays armed for the watch; the dropped waiter's waker goes.
        if let Ok(mut w) = self.watch.inner.waker.try_borrow_mut() {
            w.take();
        }
    }
}

impl AsRawFd for FdWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd
    }
}
