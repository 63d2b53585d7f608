//! Receive streams: a socket's incoming bytes as a stream of [`RecvChunk`]s.
//!
//! With the reactor's provided buffer ring the stream arms one multishot receive
//! (`IORING_OP_RECV` with `IORING_RECV_MULTISHOT` and `IOSQE_BUFFER_SELECT`): the kernel takes a
//! ring buffer only when data arrives and posts one completion per chunk, flagged
//! `IORING_CQE_F_MORE` while the receive stays armed, so a socket waiting for data holds no
//! buffer and costs one handler slot. The receive ends (a completion without `MORE`) when:
//! - the ring was empty (`-ENOBUFS`): counted, and the stream waits for a buffer to come back
//!   (the group wakes one waiter per returned buffer), then arms again; nothing is lost, the
//!   data stays in the socket;
//! - the stream stopped it, or it held [`MAX_QUEUED`] unread chunks (back-pressure: a reader
//!   that falls behind stops taking ring buffers), or its socket was dropped (`-ECANCELED`);
//! - the kernel ended it for its own reasons (e.g. a full completion queue): armed again;
//! - end of stream (0) or an error: reported after the chunks before it.
//!
//! The kernel delivers what the socket holds in one go (a burst of chunks per wakeup), so the
//! [`MAX_QUEUED`] stop is soft: what bounds a stream's read-ahead for sure is the ring. A caller
//! that wants at most one buffer of read-ahead (before receiving a payload into memory of its
//! own) asks [`RecvStream::next_single`], a one-shot receive with buffer select: it also holds
//! no buffer while it waits. A buffer that comes back after an empty ring goes to one starved
//! receive (it "claims" it), not to all of them at once.
//!
//! Without the ring (turned off, or a kernel without multishot receive: probed at reactor start,
//! and a first multishot receive refused with `-EINVAL` turns it off for the reactor, said once)
//! the stream makes one-shot receives into a buffer of its own from the reactor's pool, reused
//! from chunk to chunk.
//!
//! The armed receive holds the socket's descriptor until its last completion, and the stream's
//! state stays with the ring's handler slot until then, as for every socket operation (see the
//! parent module): dropping a stream cancels its receive (by `user_data`; a late cancel cannot
//! hit another operation) and dropping the socket cancels everything on it.

use super::{release_fd, FdOwner, Socket};
use crate::pbuf::{BufGroup, BufWaiter, Reclaim, RecvChunk, RECV_BGID};
use crate::ring::{uring_opcode as op, uring_types as types, CqeHandler};
use crate::{try_with_ring, IoBuf};
use io_uring::cqueue;
use io_uring::squeue;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

/// Unread chunks a stream may hold before it stops its multishot receive (it arms again once
/// they are read): with the default 16 KiB buffers, 128 KiB read ahead per socket at most.
pub const MAX_QUEUED: usize = 8;
/// How long to wait before retrying when the ring's submission queue and table are full.
const RING_FULL_RETRY: Duration = Duration::from_micros(50);

/// Completion tags: a multishot or a single receive into the ring, a one-shot receive into the
/// stream's own buffer, a cancel.
const MULTI: u64 = 0;
const SINGLE: u64 = 1;
const ONESHOT: u64 = 2;
const CANCEL: u64 = 3;

/// A socket's received bytes as chunks (see the module documentation). Borrowing the socket,
/// it cannot outlive it.
pub struct RecvStream<'a> {
    sock: &'a Socket,
    st: Rc<StreamState>,
}

/// What the stream shares with its receive's completion handler.
struct StreamState {
    /// The reactor's ring; None: one-shot receives into `spare`.
    group: Option<Rc<BufGroup>>,
    /// Multishot receive in use (turned off if the kernel refuses it).
    multishot: Cell<bool>,
    /// Size of the stream's own buffer (one-shot receives).
    size: u32,
    /// Received chunks not yet taken (at most about MAX_QUEUED).
    queue: RefCell<VecDeque<RecvChunk>>,
    /// `user_data` of the receive in flight.
    armed: Cell<Option<u64>>,
    /// A cancel of the armed receive is queued.
    cancelling: Cell<bool>,
    /// The stream is over: 0 end of stream, or a negated errno.
    end: Cell<Option<i32>>,
    /// The last receive ended for want of buffers.
    starved: Cell<bool>,
    /// The armed receive counts on a free buffer of the ring (see `BufGroup::claim`).
    claim: Cell<bool>,
    /// In the group's waiter queue.
    waiting: Cell<bool>,
    /// The stream was dropped: later chunks are not kept.
    closed: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    /// The descriptor, held while a receive is armed.
    fd: RefCell<Option<Rc<FdOwner>>>,
    /// One-shot receives: the buffer of the receive in flight, and the one to use next.
    pending: RefCell<Option<IoBuf>>,
    spare: RefCell<Option<IoBuf>>,
    me: Weak<StreamState>,
}

impl<'a> RecvStream<'a> {
    pub(super) fn new(sock: &'a Socket) -> Self {
        let (group, size) = crate::reactor::recv_setup();
        let st = Rc::new_cyclic(|me| StreamState {
            multishot: Cell::new(group.is_some()),
            group,
            size,
            queue: RefCell::new(VecDeque::new()),
            armed: Cell::new(None),
            cancelling: Cell::new(false),
            end: Cell::new(None),
            starved: Cell::new(false),
            claim: Cell::new(false),
            waiting: Cell::new(false),
            closed: Cell::new(false),
            waker: RefCell::new(None),
            fd: RefCell::new(None),
            pending: RefCell::new(None),
            spare: RefCell::new(None),
            me: me.clone(),
        });
        Self { sock, st }
    }

    /// True if the stream receives with a multishot receive into the reactor's ring (false:
    /// one-shot receives into its own buffer).
    pub fn is_multishot(&self) -> bool {
        self.st.multishot.get()
    }

    /// True while a receive is armed.
    pub fn is_armed(&self) -> bool {
        self.st.armed.get().is_some()
    }

    /// True once the end of stream or an error arrived (chunks before it may still be queued).
    pub fn has_ended(&self) -> bool {
        self.st.end.get().is_some()
    }

    /// Chunks received and not yet taken.
    pub fn queued(&self) -> usize {
        self.st.queue.borrow().len()
    }

    /// A chunk already received, if any (never waits, never arms).
    pub fn try_next(&mut self) -> Option<RecvChunk> {
        self.st.queue.borrow_mut().pop_front()
    }

    /// Copies bytes already received into `dst` without waiting, starting with what is left of
    /// `cur` (the chunk being parsed) and taking further queued chunks into it; returns how
    /// many. A chunk whose bytes are all taken is dropped at once (its buffer goes back).
    pub fn take_into(&mut self, cur: &mut Option<RecvChunk>, dst: &mut [u8]) -> usize {
        let mut n = 0;
        while n < dst.len() {
            if cur.as_ref().is_none_or(|c| c.is_empty()) {
                *cur = self.try_next();
            }
            let Some(c) = cur.as_mut() else { break };
            let k = c.len().min(dst.len() - n);
            dst[n..n + k].copy_from_slice(&c[..k]);
            c.consume(k);
            n += k;
        }
        if cur.as_ref().is_some_and(|c| c.is_empty()) {
            *cur = None;
        }
        n
    }

    /// The next chunk; Ok(None) at the end of stream (after every chunk before it). Arms the
    /// multishot receive when nothing is queued.
    pub async fn next(&mut self) -> std::io::Result<Option<RecvChunk>> {
        self.next_with(false).await
    }

    /// Like [`RecvStream::next`], but if a receive must be armed it is a one-shot receive into
    /// one ring buffer: at most one buffer of bytes is taken from the socket (a multishot
    /// receive already armed stays armed).
    pub async fn next_single(&mut self) -> std::io::Result<Option<RecvChunk>> {
        self.next_with(true).await
    }

    async fn next_with(&mut self, single: bool) -> std::io::Result<Option<RecvChunk>> {
        loop {
            if let Some(c) = self.try_next() {
                return Ok(Some(c));
            }
            match self.st.end.get() {
                Some(0) => return Ok(None),
                Some(e) => return Err(std::io::Error::from_raw_os_error(-e)),
                None => {}
            }
            if self.st.armed.get().is_none() && !self.st.needs_buffer() && !self.arm(single) {
                crate::sleep(RING_FULL_RETRY).await;
                continue;
            }
            let st = &self.st;
            poll_fn(|cx| {
                if st.ready() {
                    return Poll::Ready(());
                }
                if st.armed.get().is_none() {
                    // Not armed and not ready: the ring is empty; wait for a buffer.
                    st.wait_for_buffer();
                }
                *st.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
        }
    }

    /// Ends the armed receive, if any, and returns once its last completion arrived. Chunks it
    /// received before ending stay queued ([`RecvStream::try_next`]); after this, other receives
    /// on the socket get the bytes that follow them. The next [`RecvStream::next`] arms again.
    pub async fn stop(&mut self) {
        while self.st.armed.get().is_some() {
            if !self.st.cancelling.get() && !self.st.cancel() {
                crate::sleep(RING_FULL_RETRY).await;
                continue;
            }
            let st = &self.st;
            poll_fn(|cx| {
                if st.armed.get().is_none() {
                    return Poll::Ready(());
                }
                *st.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
        }
    }

    /// Asks the armed receive to end without waiting (a reader that stops reading for a while
    /// leaves further bytes in the socket instead of taking ring buffers); chunks it receives
    /// before it ends are still queued. The next [`RecvStream::next`] arms again.
    pub fn disarm(&mut self) {
        if self.st.armed.get().is_some() && !self.st.cancelling.get() {
            self.st.cancel();
        }
    }

    /// Queues the receive (`single`: one buffer at most); false if the ring is full (retry
    /// later).
    fn arm(&mut self, single: bool) -> bool {
        let st = &self.st;
        let fd = self.sock.raw_fd();
        let handler: Rc<dyn CqeHandler> = st.clone();
        let pushed = match (&st.group, st.multishot.get()) {
            (Some(g), true) => {
                let (e, tag) = if single {
                    let e = op::Recv::new(types::Fd(fd), std::ptr::null_mut(), g.size())
                        .buf_group(RECV_BGID)
                        .build()
                        .flags(squeue::Flags::BUFFER_SELECT);
                    (e, SINGLE)
                } else {
                    (op::RecvMulti::new(types::Fd(fd), RECV_BGID).build(), MULTI)
                };
                // SAFETY: the kernel writes only into buffers of the group, which the reactor
                // keeps registered and mapped; the receive holds the descriptor (below).
                try_with_ring(|r| unsafe { r.push_with_id(e, handler, tag) }).map(|r| r.ok())
            }
            _ => {
                let mut buf = st.spare.borrow_mut().take().unwrap_or_else(|| crate::alloc_buf(st.size as usize));
                buf.set_len(buf.capacity().min(st.size as usize));
                let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
                *st.pending.borrow_mut() = Some(buf);
                let e = op::Recv::new(types::Fd(fd), ptr, len).build();
                // SAFETY: `ptr` points into the buffer's own memory, which `pending` keeps until
                // the completion (the state stays with the ring's handler slot till then).
                let r = try_with_ring(|r| unsafe { r.push_with_id(e, handler, ONESHOT) }).map(|r| r.ok());
                if !matches!(r, Some(Some(_))) {
                    let buf = st.pending.borrow_mut().take();
                    *st.spare.borrow_mut() = buf;
                }
                r
            }
        };
        match pushed {
            Some(Some(user_data)) => {
                st.armed.set(Some(user_data));
                if let (true, Some(g)) = (st.starved.replace(false), &st.group) {
                    g.claim();
                    st.claim.set(true);
                }
                *st.fd.borrow_mut() = Some(self.sock.owner.clone());
                true
            }
            Some(None) => false,
            None => {
                // Off-reactor: nothing can be received.
                st.end.set(Some(-libc::EPERM));
                true
            }
        }
    }
}

impl Drop for RecvStream<'_> {
    fn drop(&mut self) {
        self.st.closed.set(true);
        if self.st.armed.get().is_some() && !self.st.cancelling.get() {
            // If the ring cannot take it, dropping the socket cancels by descriptor.
            self.st.cancel();
        }
        let queued = std::mem::take(&mut *self.st.queue.borrow_mut());
        drop(queued);
        let spare = self.st.spare.borrow_mut().take();
        drop(spare);
    }
}

impl StreamState {
    /// True when `next` has something to return or to do.
    fn ready(&self) -> bool {
        !self.queue.borrow().is_empty()
            || self.end.get().is_some()
            || (self.armed.get().is_none() && !self.needs_buffer())
    }

    /// The last receive ended for want of buffers and none has come back since (that another
    /// starved receive does not count on already).
    fn needs_buffer(&self) -> bool {
        self.starved.get() && self.group.as_ref().is_some_and(|g| !g.unclaimed())
    }

    fn wait_for_buffer(&self) {
        if let (false, Some(g)) = (self.waiting.get(), &self.group) {
            self.waiting.set(true);
            g.wait_for_buffer(self.me.clone());
        }
    }

    /// Queues a cancel of the armed receive; false if the ring could not take it.
    fn cancel(&self) -> bool {
        let (Some(user_data), Some(me)) = (self.armed.get(), self.me.upgrade()) else { return true };
        let queued = try_with_ring(|r| r.cancel_op(user_data, me, CANCEL).is_ok()).unwrap_or(false);
        self.cancelling.set(queued);
        queued
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Keeps a received chunk (or lets it go if the stream was dropped).
    fn keep(&self, c: RecvChunk) {
        if !self.closed.get() {
            self.queue.borrow_mut().push_back(c);
        }
    }

    /// A completion of a receive into the ring: a chunk in a ring buffer, and maybe the
    /// receive's end (always, for a single receive).
    fn ring_done(&self, res: i32, flags: u32) {
        let Some(g) = &self.group else { return };
        if let Some(bid) = cqueue::buffer_select(flags) {
            if self.claim.replace(false) {
                g.unclaim();
            }
            match res {
                n if n > 0 => {
                    if let Some(c) = g.take(bid, n as u32) {
                        self.keep(c);
                    }
                }
                _ => g.recycle(bid),
            }
        }
        if cqueue::more(flags) {
            if self.queue.borrow().len() >= MAX_QUEUED && !self.cancelling.get() {
                // Back-pressure: the reader is behind; leave the rest in the socket.
                self.cancel();
            }
            return;
        }
        self.ended();
        match res {
            n if n > 0 => {} // ended by the kernel with data: arm again when it is read
            0 => self.end.set(Some(0)),
            e if e == -libc::ENOBUFS => {
                g.count_enobufs();
                self.starved.set(true);
            }
            e if e == -libc::EINVAL && g.stats().chunks == 0 => {
                // Refused before this reactor ever received a chunk: the kernel lacks it.
                g.disable_multishot();
                self.multishot.set(false);
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    log::warn!("multishot receive refused (EINVAL); sockets receive one-shot into own buffers")
                });
            }
            e => self.failed(e),
        }
    }

    /// A one-shot completion into the stream's own buffer.
    fn oneshot_done(&self, res: i32) {
        let buf = self.pending.borrow_mut().take();
        if let Some(buf) = buf {
            if res > 0 {
                let home: Weak<dyn Reclaim> = self.me.clone();
                self.keep(RecvChunk::owned(buf, res as u32, home));
            } else {
                self.reclaim(buf);
            }
        }
        self.ended();
        match res {
            n if n > 0 => {}
            0 => self.end.set(Some(0)),
            e => self.failed(e),
        }
    }

    /// The armed receive is over (its last completion arrived).
    fn ended(&self) {
        if let (true, Some(g)) = (self.claim.replace(false), &self.group) {
            g.unclaim();
        }
        self.armed.set(None);
        self.cancelling.set(false);
        release_fd(&self.fd);
    }

    /// Errors that end the stream; cancels and interruptions only end the receive.
    fn failed(&self, e: i32) {
        if e != -libc::ECANCELED && e != -libc::EINTR && e != -libc::EAGAIN {
            self.end.set(Some(e));
        }
    }
}

impl CqeHandler for StreamState {
    fn complete(&self, tag: u64, result: i32) {
        self.complete_flags(tag, result, 0)
    }

    fn complete_flags(&self, tag: u64, result: i32, flags: u32) {
        match tag {
            MULTI | SINGLE => self.ring_done(result, flags),
            ONESHOT => self.oneshot_done(result),
            _ => return, // CANCEL: its own result says nothing the receive's will not
        }
        self.wake();
    }
}

impl BufWaiter for StreamState {
    fn buffers_back(&self) -> bool {
        self.waiting.set(false);
        if self.closed.get() || !self.starved.get() || self.armed.get().is_some() {
            return false;
        }
        // Only a task waiting in `next` takes the wake; one that is not looks at the ring's
        // free count itself when it next asks, and the buffer goes to the next waiter.
        let w = self.waker.borrow_mut().take();
        match w {
            Some(w) => {
                w.wake();
                true
            }
            None => false,
        }
    }
}

impl Reclaim for StreamState {
    fn reclaim(&self, buf: IoBuf) {
        if !self.closed.get() {
            let mut spare = self.spare.borrow_mut();
            if spare.is_none() {
                *spare = Some(buf);
            }
        }
    }
}
