//! Sockets driven by the reactor's io_uring: accept, receive and send as futures.
//!
//! Each operation keeps what the kernel touches (buffer, iovec array, msghdr) in a slot that the
//! ring's handler table also holds, so dropping a future early never frees memory the kernel
//! still uses: the slot lives until the completion arrives. A socket reuses one slot for its
//! receives, and a sender one [`SendCache`] for its sends, so steady-state receives and sends
//! allocate nothing; a slot whose future was dropped mid-flight is left to the ring and replaced.

use crate::ring::{uring_opcode as op, uring_types as types, CqeHandler, SqEntry};
use crate::{with_ring, IoBuf};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One operation's result, waiting task and kernel-visible memory `K`.
struct OpSlot<K> {
    result: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
    keep: RefCell<Option<K>>,
}

impl<K> OpSlot<K> {
    fn new() -> Self {
        Self { result: Cell::new(None), waker: RefCell::new(None), keep: RefCell::new(None) }
    }
}

impl<K> CqeHandler for OpSlot<K> {
    fn complete(&self, _tag: u64, result: i32) {
        self.result.set(Some(result));
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A slot kept for the next operation of one kind (one in flight at a time).
struct SlotCache<K>(RefCell<Option<Rc<OpSlot<K>>>>);

impl<K> SlotCache<K> {
    const fn new() -> Self {
        Self(RefCell::new(None))
    }

    /// The cached slot, or a new one if it is in use (or was left to the ring).
    fn take(&self) -> Rc<OpSlot<K>> {
        self.0.borrow_mut().take().unwrap_or_else(|| Rc::new(OpSlot::new()))
    }

    /// Keeps `slot` for the next operation, once nothing else (the ring) holds it.
    fn give(&self, slot: Rc<OpSlot<K>>) {
        if Rc::strong_count(&slot) == 1 {
            *self.0.borrow_mut() = Some(slot);
        }
    }
}

struct OpFuture<'a, K> {
    slot: &'a OpSlot<K>,
}

impl<K> Future for OpFuture<'_, K> {
    type Output = i32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        match self.slot.result.get() {
            Some(r) => Poll::Ready(r),
            None => {
                *self.slot.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Queues `entry` with `slot` as its handler and waits for its result (a negative errno on
/// failure). Retries while the ring is full.
///
/// # Safety
/// Every pointer in `entry` must point into memory that `slot.keep` owns and that does not move
/// while it is there (heap memory, or the kept value itself, which stays in the `Rc`), or at a
/// descriptor the caller keeps open until the future completes.
async unsafe fn run_op<K: 'static>(slot: &Rc<OpSlot<K>>, entry: SqEntry) -> i32 {
    slot.result.set(None);
    loop {
        let handler: Rc<dyn CqeHandler> = slot.clone();
        // SAFETY: forwarded from the caller; the ring holds `handler` until the completion.
        match with_ring(|r| unsafe { r.push(entry.clone(), handler, 0) }) {
            Ok(()) => break,
            Err(_) => crate::sleep(std::time::Duration::from_micros(50)).await,
        }
    }
    OpFuture { slot }.await
}

/// Queues one entry built by `build` from a reference to `keep` once it is in a slot taken from
/// `cache`; returns the result and `keep`, and gives the slot back.
///
/// # Safety
/// As for [`run_op`], for the pointers `build` puts in the entry.
async unsafe fn submit<K: 'static>(cache: &SlotCache<K>, keep: K, build: impl FnOnce(&K) -> SqEntry) -> (i32, K) {
    let slot = cache.take();
    *slot.keep.borrow_mut() = Some(keep);
    let entry = build(slot.keep.borrow().as_ref().expect("kept value present"));
    // SAFETY: forwarded from the caller; `keep` stays in the slot until the completion.
    let res = unsafe { run_op(&slot, entry) }.await;
    let keep = slot.keep.borrow_mut().take().expect("kept value present");
    cache.give(slot);
    (res, keep)
}

fn to_io(res: i32) -> std::io::Result<usize> {
    if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// A connected stream socket (TCP or unix) used from one reactor.
pub struct Socket {
    fd: OwnedFd,
    recv_slot: SlotCache<IoBuf>,
}

/// What one sendmsg reads: its header, the iovec array and the memory the iovecs point into.
struct SendMemory<O> {
    hdr: libc::msghdr,
    iovs: Vec<libc::iovec>,
    owners: Option<O>,
}

/// The reusable memory of one sender's sends (one in flight at a time): the slot, the msghdr
/// and the iovec array, kept between sends so that later ones allocate nothing.
pub struct SendCache<O> {
    slot: SlotCache<SendMemory<O>>,
    /// The iovec array of the last send, emptied and refilled by the next one.
    iovs: RefCell<Vec<libc::iovec>>,
}

impl<O> Default for SendCache<O> {
    fn default() -> Self {
        Self { slot: SlotCache::new(), iovs: RefCell::new(Vec::new()) }
    }
}

impl Socket {
    /// Wraps a connected socket descriptor.
    pub fn new(fd: OwnedFd) -> Self {
        Self { fd, recv_slot: SlotCache::new() }
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Receives into `buf[at..]`; returns the byte count (0 at end of stream) and the buffer.
    pub async fn recv(&self, mut buf: IoBuf, at: usize) -> (std::io::Result<usize>, IoBuf) {
        assert!(at <= buf.len(), "recv offset beyond the buffer");
        // SAFETY: `at` is within the buffer.
        let ptr = unsafe { buf.as_mut_ptr().add(at) };
        let len = (buf.len() - at) as u32;
        let fd = self.raw_fd();
        // SAFETY: `ptr` points into the buffer's heap or pool memory, which the slot owns and
        // which does not move with the `IoBuf`; the socket outlives the future.
        let (res, buf) =
            unsafe { submit(&self.recv_slot, buf, |_| op::Recv::new(types::Fd(fd), ptr, len).build()) }.await;
        (to_io(res), buf)
    }

    /// Receives exactly `buf[at..]`, looping over short receives; fails with UnexpectedEof if the
    /// peer closes first.
    pub async fn recv_exact(&self, mut buf: IoBuf, mut at: usize) -> (std::io::Result<()>, IoBuf) {
        while at < buf.len() {
            let (res, b) = self.recv(buf, at).await;
            buf = b;
            match res {
                Ok(0) => return (Err(std::io::ErrorKind::UnexpectedEof.into()), buf),
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Sends every byte of the slices `parts` (each `(ptr, len)` pointing into memory owned by
    /// `owners`), looping over short sends, with the memory of `cache`. Returns `owners` when
    /// done.
    ///
    /// # Safety
    /// Each part must point to `len` readable bytes owned by `owners` (heap memory that does not
    /// move when `owners` is moved).
    pub async unsafe fn send_parts<O: 'static>(
        &self,
        cache: &SendCache<O>,
        parts: &[(*const u8, usize)],
        owners: O,
    ) -> (std::io::Result<()>, O) {
        let mut iovs = std::mem::take(&mut *cache.iovs.borrow_mut());
        iovs.clear();
        iovs.extend(parts.iter().filter(|p| p.1 > 0).map(|&(p, l)| libc::iovec { iov_base: p as *mut _, iov_len: l }));
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut mem = SendMemory { hdr, iovs, owners: Some(owners) };
        let mut first = 0;
        let fd = self.raw_fd();
        let res = loop {
            if first >= mem.iovs.len() {
                break Ok(());
            }
            // The iovec array is heap memory: moving `mem` into the slot does not move it.
            mem.hdr.msg_iov = mem.iovs[first..].as_mut_ptr();
            // The kernel takes at most UIO_MAXIOV (1024) pieces per call.
            mem.hdr.msg_iovlen = (mem.iovs.len() - first).min(1024);
            // SAFETY: the header is read from its place in the slot; it points at the iovec
            // array, and the iovecs at memory `owners` owns (the caller's promise).
            let (res, m) = unsafe {
                submit(&cache.slot, mem, |m| {
                    op::SendMsg::new(types::Fd(fd), &m.hdr as *const _).flags(libc::MSG_NOSIGNAL as u32).build()
                })
            }
            .await;
            mem = m;
            let mut sent = match to_io(res) {
                Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => break Err(e),
            };
            while sent > 0 && first < mem.iovs.len() {
                let iov = &mut mem.iovs[first];
                if sent >= iov.iov_len {
                    sent -= iov.iov_len;
                    first += 1;
                } else {
                    // SAFETY: advancing within the same part.
                    iov.iov_base = unsafe { (iov.iov_base as *mut u8).add(sent) } as *mut _;
                    iov.iov_len -= sent;
                    sent = 0;
                }
            }
        };
        let owners = mem.owners.take().expect("owners present");
        *cache.iovs.borrow_mut() = mem.iovs;
        (res, owners)
    }

    /// Sends all of `data`.
    pub async fn send_all(&self, data: Vec<u8>) -> std::io::Result<()> {
        let part = (data.as_ptr(), data.len());
        // SAFETY: the part points into `data`'s heap buffer, owned by the call.
        unsafe { self.send_parts(&SendCache::default(), &[part], data).await.0 }
    }

    /// Stops both directions (a pending receive then completes with 0).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
    }
}

/// A listening socket whose accepts run on the reactor's ring.
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Wraps a bound, listening socket (std's TcpListener/UnixListener converted into OwnedFd).
    pub fn new(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> std::io::Result<OwnedFd> {
        let entry = op::Accept::new(types::Fd(self.raw_fd()), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build();
        // SAFETY: the entry points at nothing but the listening descriptor, which outlives the
        // future.
        let (res, ()) = unsafe { submit(&SlotCache::new(), (), |_| entry) }.await;
        // SAFETY: a non-negative result is a new descriptor that we now own.
        to_io(res).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Makes pending and future accepts fail (used to stop a server).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
    }
}
