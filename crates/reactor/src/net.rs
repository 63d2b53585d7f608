//! Sockets driven by the reactor's io_uring: accept, connect, receive (also with passed
//! descriptors) and send as futures, each optionally bounded by a deadline (a linked timeout).
//!
//! Each operation keeps what the kernel touches (buffer, iovec array, msghdr, address) in a slot
//! that the ring's handler table also holds, so dropping a future early never frees memory the
//! kernel still uses: the slot lives until the completion arrives. A socket reuses one slot for
//! its receives, and a sender one [`SendCache`] for its sends, so steady-state receives and sends
//! allocate nothing; a slot whose future was dropped mid-flight is left to the ring and replaced.
//!
//! A socket owns its descriptor until every operation on it has completed: each operation in
//! flight holds the descriptor, and dropping a socket with operations in flight cancels them
//! (`IORING_OP_ASYNC_CANCEL` by descriptor); the descriptor is closed when the last completion
//! arrives, so its number is never reused while the kernel may still act on it.
//!
//! [`Socket::recv_stream`] receives with a multishot receive into the reactor's provided buffer
//! ring ([`recv_multi`]): a socket waiting for data then holds no buffer.

mod accept;
mod recv_multi;

pub use accept::{raise_fd_limit, AcceptErrors};
pub use recv_multi::{RecvStream, MAX_QUEUED};

use crate::ring::{uring_opcode as op, uring_types as types, CqeHandler, SqEntry};
use crate::{try_with_ring, with_ring, IoBuf};
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A descriptor shared by its socket and the operations in flight on it; closed when the last
/// of them lets go.
struct FdOwner {
    fd: RawFd,
    /// A task waiting in [`Socket::close`] for the operations to finish.
    closer: RefCell<Option<Waker>>,
}

impl FdOwner {
    fn new(fd: OwnedFd) -> Rc<Self> {
        Rc::new(Self { fd: fd.into_raw_fd(), closer: RefCell::new(None) })
    }
}

impl Drop for FdOwner {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours (taken from an OwnedFd) and nothing uses it any more.
        unsafe { libc::close(self.fd) };
    }
}

/// Cancels whatever is in flight on `owner`'s descriptor if anything else holds it; if the ring
/// cannot take the cancel (off-reactor, or full), shuts the socket down instead, which ends
/// pending receives and sends just as surely.
fn cancel_in_flight(owner: &Rc<FdOwner>) {
    if Rc::strong_count(owner) == 1 {
        return;
    }
    let fd = owner.fd;
    let queued = try_with_ring(|r| r.cancel_fd(fd, Rc::new(Ignore), 0).is_ok()).unwrap_or(false);
    if !queued {
        // SAFETY: shutdown on a descriptor we still own.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

/// A handler that ignores its completion (cancels).
struct Ignore;

impl CqeHandler for Ignore {
    fn complete(&self, _tag: u64, _result: i32) {}
}

/// The timespec of a linked timeout, kept until the timeout's own completion (and then for the
/// slot's next bounded operation).
struct LinkTimer {
    ts: Cell<types::Timespec>,
}

impl CqeHandler for LinkTimer {
    fn complete(&self, _tag: u64, _result: i32) {}
}

/// One operation's result, waiting task and kernel-visible memory `K`.
struct OpSlot<K> {
    result: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
    keep: RefCell<Option<K>>,
    /// The descriptor the operation works on, held from submission to completion.
    fd: RefCell<Option<Rc<FdOwner>>>,
    /// The linked timeout's timespec of the last bounded operation, reused by the next one once
    /// the ring let go of it (a bounded receive allocates no timer of its own).
    timer: RefCell<Option<Rc<LinkTimer>>>,
}

impl<K> OpSlot<K> {
    fn new() -> Self {
        Self {
            result: Cell::new(None),
            waker: RefCell::new(None),
            keep: RefCell::new(None),
            fd: RefCell::new(None),
            timer: RefCell::new(None),
        }
    }

    /// A linked timeout's timespec set to `t`: the slot's own unless the ring still holds it.
    fn link_timer(&self, t: Duration) -> Rc<LinkTimer> {
        let mut kept = self.timer.borrow_mut();
        match kept.as_ref() {
            Some(timer) if Rc::strong_count(timer) == 1 => timer.ts.set(types::Timespec::from(t)),
            _ => *kept = Some(Rc::new(LinkTimer { ts: Cell::new(types::Timespec::from(t)) })),
        }
        kept.as_ref().expect("timer kept").clone()
    }
}

/// Lets go of the descriptor an operation held until its (last) completion: closes it if the
/// socket is gone and this was its last operation, and wakes a task waiting in
/// [`Socket::close`].
fn release_fd(held: &RefCell<Option<Rc<FdOwner>>>) {
    let owner = held.borrow_mut().take();
    if let Some(owner) = owner {
        let closer = owner.closer.borrow_mut().take();
        drop(owner);
        if let Some(w) = closer {
            w.wake();
        }
    }
}

impl<K> CqeHandler for OpSlot<K> {
    fn complete(&self, _tag: u64, result: i32) {
        self.result.set(Some(result));
        release_fd(&self.fd);
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

/// What bounds an operation's duration: nothing, or a deadline.
#[derive(Clone, Copy)]
struct Bound(Option<Instant>);

impl Bound {
    /// The time left, or Err(-ETIMEDOUT) if the deadline passed.
    fn left(self) -> Result<Option<Duration>, i32> {
        match self.0 {
            None => Ok(None),
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(t) if !t.is_zero() => Ok(Some(t)),
                _ => Err(-libc::ETIMEDOUT),
            },
        }
    }
}

/// Queues `entry` with `slot` as its handler, holding `fd` until the completion, and waits for
/// its result (a negative errno on failure). With a deadline the entry is linked to a
/// `LinkTimeout`; an operation it cancels returns `-ETIMEDOUT`. Retries while the ring is full.
///
/// # Safety
/// Every pointer in `entry` must point into memory that `slot.keep` owns and that does not move
/// while it is there (heap memory, or the kept value itself, which stays in the `Rc`), or at the
/// descriptor `fd` (or one the caller keeps open until the future completes).
async unsafe fn run_op<K: 'static>(
    slot: &Rc<OpSlot<K>>,
    entry: SqEntry,
    fd: Option<&Rc<FdOwner>>,
    bound: Bound,
) -> i32 {
    slot.result.set(None);
    *slot.fd.borrow_mut() = fd.cloned();
    loop {
        let handler: Rc<dyn CqeHandler> = slot.clone();
        let left = match bound.left() {
            Ok(l) => l,
            Err(e) => {
                slot.fd.borrow_mut().take();
                return e;
            }
        };
        // SAFETY: forwarded from the caller; the ring holds `handler` (and the timer) until
        // their completions.
        let pushed = match left {
            None => with_ring(|r| unsafe { r.push(entry.clone(), handler, 0) }),
            Some(t) => {
                let timer = slot.link_timer(t);
                let te = op::LinkTimeout::new(timer.ts.as_ptr() as *const _).build();
                with_ring(|r| unsafe { r.push_linked((entry.clone(), handler, 0), (te, timer, 0)) })
            }
        };
        match pushed {
            Ok(()) => break,
            Err(_) => crate::sleep(Duration::from_micros(50)).await,
        }
    }
    let res = OpFuture { slot }.await;
    if res == -libc::ECANCELED && bound.0.is_some() {
        // Cancelled by its linked timeout (a socket being dropped has no one waiting).
        return -libc::ETIMEDOUT;
    }
    res
}

/// Queues one entry built by `build` from a reference to `keep` once it is in a slot taken from
/// `cache`; returns the result and `keep`, and gives the slot back.
///
/// # Safety
/// As for [`run_op`], for the pointers `build` puts in the entry.
async unsafe fn submit<K: 'static>(
    cache: &SlotCache<K>,
    keep: K,
    fd: Option<&Rc<FdOwner>>,
    bound: Bound,
    build: impl FnOnce(&K) -> SqEntry,
) -> (i32, K) {
    let slot = cache.take();
    *slot.keep.borrow_mut() = Some(keep);
    let entry = build(slot.keep.borrow().as_ref().expect("kept value present"));
    // SAFETY: forwarded from the caller; `keep` stays in the slot until the completion.
    let res = unsafe { run_op(&slot, entry, fd, bound) }.await;
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
    owner: Rc<FdOwner>,
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

/// What `recvmsg` with passed descriptors fills: header, one iovec, control buffer and the
/// data buffer (boxed, so the header's pointers stay valid when it moves into the slot).
struct MsgMemory {
    hdr: libc::msghdr,
    iov: libc::iovec,
    control: Vec<u64>,
    buf: IoBuf,
}

/// Where an asynchronous connect goes (kept in the operation's slot until it completes).
struct ConnectAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

fn new_socket(domain: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; a non-negative result is a new descriptor.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr_of(addr: &std::net::SocketAddr) -> ConnectAddr {
    // SAFETY: sockaddr_storage is plain data; zeroed is valid, and each arm writes a smaller
    // sockaddr type inside it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    ConnectAddr { storage, len: len as libc::socklen_t }
}

fn unix_sockaddr_of(path: &std::path::Path) -> std::io::Result<ConnectAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: as in sockaddr_of.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: sockaddr_un fits in sockaddr_storage; zeroed above.
    let sun = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_un) };
    if bytes.is_empty() || bytes.len() >= sun.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "unix socket path empty or too long"));
    }
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &b) in sun.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok(ConnectAddr { storage, len: len as libc::socklen_t })
}

impl Socket {
    /// Wraps a connected socket descriptor.
    pub fn new(fd: OwnedFd) -> Self {
        Self { owner: FdOwner::new(fd), recv_slot: SlotCache::new() }
    }

    /// Connects to a TCP address without blocking the reactor (`IORING_OP_CONNECT`).
    pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<Socket> {
        let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        Self::connect_to(new_socket(domain)?, sockaddr_of(&addr), None).await
    }

    /// Like [`Socket::connect`], failing with `TimedOut` if not connected by `deadline`.
    pub async fn connect_by(addr: std::net::SocketAddr, deadline: Instant) -> std::io::Result<Socket> {
        let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        Self::connect_to(new_socket(domain)?, sockaddr_of(&addr), Some(deadline)).await
    }

    /// Connects to a unix stream socket at `path` without blocking the reactor.
    pub async fn connect_unix(path: &std::path::Path) -> std::io::Result<Socket> {
        Self::connect_to(new_socket(libc::AF_UNIX)?, unix_sockaddr_of(path)?, None).await
    }

    async fn connect_to(fd: OwnedFd, addr: ConnectAddr, deadline: Option<Instant>) -> std::io::Result<Socket> {
        let sock = Socket::new(fd);
        let raw = sock.raw_fd();
        // SAFETY: the entry points at the address kept in the slot and at the socket's
        // descriptor, held by the operation until it completes.
        let (res, _) = unsafe {
            submit(&SlotCache::new(), addr, Some(&sock.owner), Bound(deadline), |a| {
                op::Connect::new(types::Fd(raw), &a.storage as *const _ as *const libc::sockaddr, a.len).build()
            })
        }
        .await;
        to_io(res).map(|_| sock)
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.owner.fd
    }

    /// Receives into `buf[at..]`; returns the byte count (0 at end of stream) and the buffer.
    pub async fn recv(&self, buf: IoBuf, at: usize) -> (std::io::Result<usize>, IoBuf) {
        self.recv_bounded(buf, at, Bound(None)).await
    }

    /// Like [`Socket::recv`], failing with `TimedOut` if nothing arrives by `deadline` (a
    /// linked timeout; nothing is consumed from the socket then).
    pub async fn recv_by(&self, buf: IoBuf, at: usize, deadline: Instant) -> (std::io::Result<usize>, IoBuf) {
        self.recv_bounded(buf, at, Bound(Some(deadline))).await
    }

    async fn recv_bounded(&self, mut buf: IoBuf, at: usize, bound: Bound) -> (std::io::Result<usize>, IoBuf) {
        if at > buf.len() {
            return (Err(std::io::ErrorKind::InvalidInput.into()), buf);
        }
        // SAFETY: `at` is within the buffer.
        let ptr = unsafe { buf.as_mut_ptr().add(at) };
        let len = (buf.len() - at) as u32;
        let fd = self.raw_fd();
        // SAFETY: `ptr` points into the buffer's heap or pool memory, which the slot owns and
        // which does not move with the `IoBuf`; the operation holds the descriptor.
        let (res, buf) = unsafe {
            submit(&self.recv_slot, buf, Some(&self.owner), bound, |_| op::Recv::new(types::Fd(fd), ptr, len).build())
        }
        .await;
        (to_io(res), buf)
    }

    /// A stream of the bytes this socket receives, in chunks (see [`RecvStream`]): a multishot
    /// receive into the reactor's provided buffer ring, or one-shot receives into a buffer of
    /// the stream's own where the ring is off or unsupported. While the stream's receive is
    /// armed no other receive may be made on the socket (which would get which bytes is
    /// undefined); [`RecvStream::stop`] ends it first. Must be called on a reactor.
    pub fn recv_stream(&self) -> RecvStream<'_> {
        RecvStream::new(self)
    }

    /// Receives into `dst` what the socket holds now, with a plain non-blocking `recv` (no ring
    /// round trip: for bytes that have most likely arrived already). Returns the byte count, 0
    /// at end of stream, `WouldBlock` if nothing is there. Only while no other receive is in
    /// flight on the socket (which would get which bytes is undefined).
    pub fn try_recv(&self, dst: &mut [u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: recv writes at most `dst.len()` bytes into `dst`.
            let n = unsafe {
                libc::recv(self.raw_fd(), dst.as_mut_ptr() as *mut libc::c_void, dst.len(), libc::MSG_DONTWAIT)
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives exactly `buf[at..]`, looping over short receives; fails with UnexpectedEof if the
    /// peer closes first.
    pub async fn recv_exact(&self, buf: IoBuf, at: usize) -> (std::io::Result<()>, IoBuf) {
        self.recv_exact_bounded(buf, at, Bound(None)).await
    }

    /// Like [`Socket::recv_exact`], failing with `TimedOut` if the bytes have not all arrived
    /// by `deadline`.
    pub async fn recv_exact_by(&self, buf: IoBuf, at: usize, deadline: Instant) -> (std::io::Result<()>, IoBuf) {
        self.recv_exact_bounded(buf, at, Bound(Some(deadline))).await
    }

    async fn recv_exact_bounded(&self, mut buf: IoBuf, mut at: usize, bound: Bound) -> (std::io::Result<()>, IoBuf) {
        while at < buf.len() {
            let (res, b) = self.recv_bounded(buf, at, bound).await;
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

    /// Receives into `buf[at..]` with `recvmsg`, accepting up to `max_fds` descriptors passed
    /// with `SCM_RIGHTS` (received close-on-exec). Returns the byte count, the descriptors and
    /// the buffer. If the peer passed more descriptors than fit, the ones received are closed
    /// and the call fails with `InvalidData` (the kernel dropped the rest).
    pub async fn recv_with_fds(
        &self,
        buf: IoBuf,
        at: usize,
        max_fds: usize,
    ) -> (std::io::Result<(usize, Vec<OwnedFd>)>, IoBuf) {
        if at > buf.len() || max_fds > 253 {
            return (Err(std::io::ErrorKind::InvalidInput.into()), buf);
        }
        // SAFETY: CMSG_SPACE is a size computation.
        let space = unsafe { libc::CMSG_SPACE((max_fds.max(1) * std::mem::size_of::<RawFd>()) as u32) } as usize;
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut m = Box::new(MsgMemory {
            hdr,
            iov: libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
            control: vec![0u64; space.div_ceil(8)],
            buf,
        });
        // SAFETY: `at` is within the buffer.
        m.iov.iov_base = unsafe { m.buf.as_mut_ptr().add(at) } as *mut _;
        m.iov.iov_len = m.buf.len() - at;
        m.hdr.msg_iov = &mut m.iov;
        m.hdr.msg_iovlen = 1;
        m.hdr.msg_control = m.control.as_mut_ptr() as *mut _;
        m.hdr.msg_controllen = space as _;
        let fd = self.raw_fd();
        // SAFETY: the header, iovec and control buffer are in the box and the data in the
        // buffer's own memory, all owned by the slot until the completion; the operation holds
        // the descriptor.
        let (res, m) = unsafe {
            submit(&SlotCache::new(), m, Some(&self.owner), Bound(None), |m| {
                op::RecvMsg::new(types::Fd(fd), &m.hdr as *const _ as *mut _)
                    .flags(libc::MSG_CMSG_CLOEXEC as u32)
                    .build()
            })
        }
        .await;
        let mut fds = Vec::new();
        if res >= 0 {
            // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control messages
            // into the control buffer; the CMSG macros walk them within that length.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&m.hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let data = libc::CMSG_DATA(c) as *const RawFd;
                        let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                        for i in 0..n {
                            fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&m.hdr, c);
                }
            }
        }
        let truncated = m.hdr.msg_flags & libc::MSG_CTRUNC != 0;
        let buf = m.buf;
        if res >= 0 && truncated {
            drop(fds);
            return (
                Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "more descriptors passed than accepted")),
                buf,
            );
        }
        (to_io(res).map(|n| (n, fds)), buf)
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
        // SAFETY: forwarded from the caller.
        unsafe { self.send_parts_bounded(cache, parts, owners, Bound(None)).await }
    }

    /// Like [`Socket::send_parts`], failing with `TimedOut` if not everything was sent by
    /// `deadline`.
    ///
    /// # Safety
    /// As for [`Socket::send_parts`].
    pub async unsafe fn send_parts_by<O: 'static>(
        &self,
        cache: &SendCache<O>,
        parts: &[(*const u8, usize)],
        owners: O,
        deadline: Instant,
    ) -> (std::io::Result<()>, O) {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_parts_bounded(cache, parts, owners, Bound(Some(deadline))).await }
    }

    /// A send of at most [`PLAIN_SEND_MAX_PARTS`] pieces is tried first with a plain
    /// non-blocking `sendmsg`, and only what the socket did not take goes to the ring.
    async unsafe fn send_parts_bounded<O: 'static>(
        &self,
        cache: &SendCache<O>,
        parts: &[(*const u8, usize)],
        owners: O,
        bound: Bound,
    ) -> (std::io::Result<()>, O) {
        let mut iovs = std::mem::take(&mut *cache.iovs.borrow_mut());
        iovs.clear();
        iovs.extend(parts.iter().filter(|p| p.1 > 0).map(|&(p, l)| libc::iovec { iov_base: p as *mut _, iov_len: l }));
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut mem = SendMemory { hdr, iovs, owners: Some(owners) };
        let mut first = 0;
        let fd = self.raw_fd();
        // The first pass of a small send is a plain one; the ring takes whatever it left.
        let mut plain = mem.iovs.len() <= PLAIN_SEND_MAX_PARTS;
        let res = loop {
            if first >= mem.iovs.len() {
                break Ok(());
            }
            // The iovec array is heap memory: moving `mem` into the slot does not move it.
            mem.hdr.msg_iov = mem.iovs[first..].as_mut_ptr();
            // The kernel takes at most UIO_MAXIOV (1024) pieces per call.
            mem.hdr.msg_iovlen = (mem.iovs.len() - first).min(1024);
            let sent = if std::mem::take(&mut plain) {
                // SAFETY: the header points at the iovec array, the iovecs at memory `owners`
                // owns (the caller's promise); the call returns before either moves.
                match unsafe { libc::sendmsg(fd, &mem.hdr, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) } {
                    n if n >= 0 => n as usize,
                    _ => match std::io::Error::last_os_error() {
                        // No room now: the ring sends it all.
                        e if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => 0,
                        e => break Err(e),
                    },
                }
            } else {
                // SAFETY: the header is read from its place in the slot; it points at the iovec
                // array, and the iovecs at memory `owners` owns (the caller's promise); the
                // operation holds the descriptor.
                let (res, m) = unsafe {
                    submit(&cache.slot, mem, Some(&self.owner), bound, |m| {
                        op::SendMsg::new(types::Fd(fd), &m.hdr as *const _).flags(libc::MSG_NOSIGNAL as u32).build()
                    })
                }
                .await;
                mem = m;
                match to_io(res) {
                    Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                    Err(e) => break Err(e),
                }
            };
            first = advance_iovs(&mut mem.iovs, first, sent);
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

    /// Like [`Socket::send_all`], failing with `TimedOut` if not everything was sent by
    /// `deadline`.
    pub async fn send_all_by(&self, data: Vec<u8>, deadline: Instant) -> std::io::Result<()> {
        let part = (data.as_ptr(), data.len());
        // SAFETY: the part points into `data`'s heap buffer, owned by the call.
        unsafe { self.send_parts_by(&SendCache::default(), &[part], data, deadline).await.0 }
    }

    /// Stops both directions (a pending receive then completes with 0).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
    }

    /// Closes the socket: cancels every operation still in flight on it (those whose futures
    /// were dropped) and returns once they have completed and the descriptor is closed.
    pub async fn close(self) {
        let owner = self.owner.clone();
        drop(self);
        let mut owner = Some(owner);
        poll_fn(|cx| {
            let o = owner.as_ref().expect("polled after completion");
            if Rc::strong_count(o) == 1 {
                owner = None; // the last holder: closes the descriptor
                return Poll::Ready(());
            }
            *o.closer.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Sends of at most this many pieces (one command's reply: header, data, response) are tried
/// with a plain non-blocking `sendmsg` before the ring. Such a send is latency-bound (a queue
/// depth of 1 sends one reply a turn), and the system call costs less than an `io_uring_enter`
/// that submits the same send; the reactor enters the ring anyway for the next request's
/// receive, so the count of system calls per I/O stays two. Larger batches keep going through
/// the ring, which submits a turn's sends together: trying every send plainly first cost up to
/// 11% at 4 KiB randread QD 128 on NVMe/TCP, where this limit gained 3% at QD 1 and lost
/// nothing elsewhere (docs/PERFORMANCE.md).
pub const PLAIN_SEND_MAX_PARTS: usize = 3;

/// Moves past `sent` bytes of `iovs`, starting at piece `first`: returns the first piece not
/// wholly sent, whose start and length now leave out what was sent of it.
fn advance_iovs(iovs: &mut [libc::iovec], mut first: usize, mut sent: usize) -> usize {
    while sent > 0 && first < iovs.len() {
        let iov = &mut iovs[first];
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
    first
}

impl Drop for Socket {
    fn drop(&mut self) {
        cancel_in_flight(&self.owner);
    }
}

/// A listening socket whose accepts run on the reactor's ring.
pub struct Listener {
    owner: Rc<FdOwner>,
}

impl Listener {
    /// Wraps a bound, listening socket (std's TcpListener/UnixListener converted into OwnedFd).
    pub fn new(fd: OwnedFd) -> Self {
        Self { owner: FdOwner::new(fd) }
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.owner.fd
    }

    /// Waits for the next connection.
    pub async fn accept(&self) -> std::io::Result<OwnedFd> {
        let entry = op::Accept::new(types::Fd(self.raw_fd()), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build();
        // SAFETY: the entry points at nothing but the listening descriptor, which the operation
        // holds.
        let (res, ()) = unsafe { submit(&SlotCache::new(), (), Some(&self.owner), Bound(None), |_| entry) }.await;
        // SAFETY: a non-negative result is a new descriptor that we now own.
        to_io(res).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Makes pending and future accepts fail (used to stop a server).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        cancel_in_flight(&self.owner);
    }
}

/// Sets TCP_NODELAY on a connected socket (a failure, e.g. on a unix socket, is harmless).
pub fn set_nodelay(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// `ip:port` (`[ip]:port` for IPv6) of a socket address, or None for other families.
fn sockaddr_text(ss: &libc::sockaddr_storage) -> Option<String> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(format!("{ip}:{}", u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(format!("[{ip}]:{}", u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// The peer of a connected socket as `ip:port`, "unix" for a unix socket, "?" if unknown.
pub fn peer_name(fd: RawFd) -> String {
    // SAFETY: sockaddr_storage is plain data; getpeername writes at most `len` bytes into it.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    if unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return "?".into();
    }
    match sockaddr_text(&ss) {
        Some(s) => s,
        None if ss.ss_family as i32 == libc::AF_UNIX => "unix".into(),
        None => "?".into(),
    }
}

/// The address a socket is bound to, as `ip:port`, or None (unix sockets, errors).
pub fn local_name(fd: RawFd) -> Option<String> {
    // SAFETY: sockaddr_storage is plain data; getsockname writes at most `len` bytes into it.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    if unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return None;
    }
    sockaddr_text(&ss)
}

/// Polls two futures and returns the result of the first to finish (the other is dropped).
pub async fn race<T>(a: impl Future<Output = T>, b: impl Future<Output = T>) -> T {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    poll_fn(move |cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        b.as_mut().poll(cx)
    })
    .await
}
