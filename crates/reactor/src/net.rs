//! Sockets driven by the reactor's io_uring: accept, receive and send as futures.
//!
//! Each operation owns what the kernel touches (buffer, iovec array, msghdr) in a shared slot
//! that the ring's handler table also holds, so dropping a future early never frees memory the
//! kernel still writes: the slot lives until the completion arrives. One small allocation per
//! socket operation (not per block I/O: a target batches many requests per operation).

use crate::ring::{uring_opcode as op, uring_types as types, CqeHandler, SqEntry};
use crate::{with_ring, IoBuf};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct OpSlot {
    result: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
    keep: RefCell<Option<Box<dyn Any>>>,
}

impl CqeHandler for OpSlot {
    fn complete(&self, _tag: u64, result: i32) {
        self.result.set(Some(result));
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

struct OpFuture {
    slot: Rc<OpSlot>,
}

impl Future for OpFuture {
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

/// Queues `entry`, whose memory lives in `keep`, waits for its result (a negative errno on
/// failure) and hands `keep` back. Retries while the ring is full.
async fn submit<K: Any>(entry: SqEntry, keep: K) -> (i32, K) {
    let slot = Rc::new(OpSlot::default());
    *slot.keep.borrow_mut() = Some(Box::new(keep));
    loop {
        let handler: Rc<dyn CqeHandler> = slot.clone();
        // SAFETY: every pointer in `entry` points into `keep` (owned by the slot, which the ring
        // holds until the completion; boxed, so it does not move) or at a descriptor the caller
        // keeps open until the future completes.
        match with_ring(|r| unsafe { r.push(entry.clone(), handler, 0) }) {
            Ok(()) => break,
            Err(_) => crate::sleep(std::time::Duration::from_micros(50)).await,
        }
    }
    let res = OpFuture { slot: slot.clone() }.await;
    let keep = slot.keep.borrow_mut().take().expect("operation memory present").downcast::<K>().expect("same type");
    (res, *keep)
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
}

/// The bytes of one sendmsg: iovecs into memory owned by `owners`.
struct SendMemory<O> {
    hdr: libc::msghdr,
    iovs: Vec<libc::iovec>,
    owners: O,
}

impl Socket {
    /// Wraps a connected socket descriptor.
    pub fn new(fd: OwnedFd) -> Self {
        Self { fd }
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
        let entry = op::Recv::new(types::Fd(self.raw_fd()), ptr, (buf.len() - at) as u32).build();
        let (res, buf) = submit(entry, buf).await;
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
    /// `owners`), looping over short sends. Returns `owners` when done.
    ///
    /// # Safety
    /// Each part must point to `len` readable bytes owned by `owners` (heap memory that does not
    /// move when `owners` is moved).
    pub async unsafe fn send_parts<O: Any>(
        &self,
        parts: Vec<(*const u8, usize)>,
        owners: O,
    ) -> (std::io::Result<()>, O) {
        let iovs: Vec<libc::iovec> =
            parts.iter().filter(|p| p.1 > 0).map(|&(p, l)| libc::iovec { iov_base: p as *mut _, iov_len: l }).collect();
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut mem = Box::new(SendMemory { hdr, iovs, owners });
        let mut first = 0;
        loop {
            if first >= mem.iovs.len() {
                return (Ok(()), mem.owners);
            }
            mem.hdr.msg_iov = mem.iovs[first..].as_mut_ptr();
            // The kernel takes at most UIO_MAXIOV (1024) pieces per call.
            mem.hdr.msg_iovlen = (mem.iovs.len() - first).min(1024);
            let entry = op::SendMsg::new(types::Fd(self.raw_fd()), &mem.hdr as *const _)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build();
            let (res, m) = submit(entry, mem).await;
            mem = m;
            let mut sent = match to_io(res) {
                Ok(0) => return (Err(std::io::ErrorKind::WriteZero.into()), mem.owners),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => return (Err(e), mem.owners),
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
        }
    }

    /// Sends all of `data`.
    pub async fn send_all(&self, data: Vec<u8>) -> std::io::Result<()> {
        let part = (data.as_ptr(), data.len());
        // SAFETY: the part points into `data`'s heap buffer, owned by the call.
        unsafe { self.send_parts(vec![part], data).await.0 }
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
        let (res, ()) = submit(entry, ()).await;
        // SAFETY: a non-negative result is a new descriptor that we now own.
        to_io(res).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Makes pending and future accepts fail (used to stop a server).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
    }
}
