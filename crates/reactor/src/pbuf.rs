//! A reactor's provided buffer ring (`IORING_REGISTER_PBUF_RING`): receive buffers the kernel
//! picks from when data arrives on a socket, so that a socket waiting for data holds none.
//!
//! The ring is an array of `count` 16-byte entries (address, length, buffer id) shared with the
//! kernel: the kernel consumes entries from its head, the reactor publishes returned buffers at
//! the tail (a release store of the 16-bit tail that overlays entry 0's reserved field). A
//! completion that used a buffer names its id; the buffer is then the reactor's, handed out as a
//! [`RecvChunk`] and published again when the chunk is dropped. When the ring is empty a
//! multishot receive ends with `-ENOBUFS`; its stream waits in this group's queue and is woken,
//! one per returned buffer, to arm again.

use crate::buf::Region;
use crate::IoBuf;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ops::Deref;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU16, Ordering};

/// The buffer group id of each reactor's ring (one group per io_uring).
pub const RECV_BGID: u16 = 0;
/// Largest buffer count the kernel accepts for a ring.
pub const MAX_RECV_BUFS: u16 = 1 << 15;
/// Largest receive buffer size accepted.
pub const MAX_RECV_BUF_SIZE: u32 = 1 << 20;
/// Smallest receive buffer size accepted.
pub const MIN_RECV_BUF_SIZE: u32 = 64;

/// Sizes of a reactor's receive buffer ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvBufConfig {
    /// Number of buffers: a power of two up to [`MAX_RECV_BUFS`]; 0 turns the ring off (sockets
    /// then receive one-shot into buffers of their own).
    pub count: u16,
    /// Bytes per buffer ([`MIN_RECV_BUF_SIZE`] to [`MAX_RECV_BUF_SIZE`]); also the size of a
    /// socket's own buffer when the ring is off or unsupported.
    pub size: u32,
}

impl Default for RecvBufConfig {
    fn default() -> Self {
        Self { count: 256, size: 16 << 10 }
    }
}

impl RecvBufConfig {
    /// Checks the sizes (a count of 0 is valid: off).
    pub fn check(&self) -> Result<(), String> {
        if self.count != 0 && (!self.count.is_power_of_two() || self.count > MAX_RECV_BUFS) {
            return Err(format!("receive buffer count {} is not a power of two up to {MAX_RECV_BUFS}", self.count));
        }
        if !(MIN_RECV_BUF_SIZE..=MAX_RECV_BUF_SIZE).contains(&self.size) {
            return Err(format!(
                "receive buffer size {} is outside {MIN_RECV_BUF_SIZE}..={MAX_RECV_BUF_SIZE}",
                self.size
            ));
        }
        Ok(())
    }
}

/// Counters of a reactor's receive buffer ring.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecvBufStats {
    /// Buffers in the ring.
    pub count: u16,
    /// Bytes per buffer.
    pub size: u32,
    /// Buffers not held by received chunks now (with the kernel, or about to be).
    pub free: u32,
    /// Chunks received into the ring's buffers.
    pub chunks: u64,
    /// Multishot receives the kernel ended because the ring was empty (`-ENOBUFS`).
    pub enobufs: u64,
    /// False once the kernel refused a multishot receive (sockets then receive one-shot).
    pub multishot: bool,
}

/// One entry of the shared ring (`struct io_uring_buf`).
#[repr(C)]
struct RawEntry {
    addr: u64,
    len: u32,
    bid: u16,
    /// Entry 0's is the ring's tail; the others are unused.
    resv: u16,
}

/// Something waiting for a buffer to come back (a receive stream that met `-ENOBUFS`).
pub(crate) trait BufWaiter {
    /// A buffer came back; returns true if the waiter still waited (and was woken), false if it
    /// no longer needs one (the wake goes to the next waiter).
    fn buffers_back(&self) -> bool;
}

/// Where a chunk received into a buffer of its own goes back to when dropped.
pub(crate) trait Reclaim {
    /// Takes the buffer back for the next receive.
    fn reclaim(&self, buf: IoBuf);
}

/// The home of a chunk whose buffer goes nowhere when it is dropped (`RecvChunk::from_buf`).
struct NoHome;

impl Reclaim for NoHome {
    fn reclaim(&self, _: IoBuf) {}
}

/// A reactor's provided buffer ring and its buffers.
pub struct BufGroup {
    entries: Region,
    mem: Region,
    count: u16,
    size: u32,
    /// The tail as the reactor knows it (published with a release store).
    tail: Cell<u16>,
    /// Buffers handed out as chunks and not yet given back.
    held: Cell<u32>,
    /// Receives armed again after an empty ring, each counting on a free buffer (so that one
    /// returned buffer does not send every starved receive back to the kernel at once).
    claims: Cell<u32>,
    waiters: RefCell<VecDeque<Weak<dyn BufWaiter>>>,
    chunks: Cell<u64>,
    enobufs: Cell<u64>,
    multishot: Cell<bool>,
}

impl BufGroup {
    /// Maps the ring and its buffers and puts every buffer in the ring (not yet registered:
    /// see [`BufGroup::ring_addr`]).
    pub fn new(cfg: RecvBufConfig) -> std::io::Result<Rc<Self>> {
        cfg.check().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if cfg.count == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "receive buffer ring of 0 buffers"));
        }
        let ring_len = (cfg.count as usize * std::mem::size_of::<RawEntry>()).next_multiple_of(4096);
        let g = Self {
            entries: Region::map(ring_len, 0)?,
            mem: Region::map(cfg.count as usize * cfg.size as usize, 0)?,
            count: cfg.count,
            size: cfg.size,
            tail: Cell::new(0),
            held: Cell::new(0),
            claims: Cell::new(0),
            waiters: RefCell::new(VecDeque::new()),
            chunks: Cell::new(0),
            enobufs: Cell::new(0),
            multishot: Cell::new(true),
        };
        for bid in 0..cfg.count {
            g.put(bid);
        }
        Ok(Rc::new(g))
    }

    /// Address of the shared ring (page-aligned), for `IORING_REGISTER_PBUF_RING`.
    pub fn ring_addr(&self) -> u64 {
        self.entries.base.as_ptr() as u64
    }

    /// Number of buffers.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Bytes per buffer.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Buffers not held by chunks (an upper bound of what the kernel has: buffers it used for
    /// completions not yet reaped count as free until they are).
    pub fn free(&self) -> u32 {
        self.count as u32 - self.held.get()
    }

    /// True if a buffer is free that no receive armed after an empty ring counts on.
    pub(crate) fn unclaimed(&self) -> bool {
        self.free() > self.claims.get()
    }

    /// A receive that met an empty ring arms again, counting on a free buffer.
    pub(crate) fn claim(&self) {
        self.claims.set(self.claims.get() + 1);
    }

    /// That receive got its buffer, or ended.
    pub(crate) fn unclaim(&self) {
        self.claims.set(self.claims.get().saturating_sub(1));
    }

    /// Current counters.
    pub fn stats(&self) -> RecvBufStats {
        RecvBufStats {
            count: self.count,
            size: self.size,
            free: self.free(),
            chunks: self.chunks.get(),
            enobufs: self.enobufs.get(),
            multishot: self.multishot.get(),
        }
    }

    /// False once the kernel refused a multishot receive on this reactor.
    pub(crate) fn multishot(&self) -> bool {
        self.multishot.get()
    }

    /// Turns multishot receive off for this reactor (the kernel refused it).
    pub(crate) fn disable_multishot(&self) {
        self.multishot.set(false);
    }

    /// Counts a multishot receive ended by an empty ring.
    pub(crate) fn count_enobufs(&self) {
        self.enobufs.set(self.enobufs.get() + 1);
    }

    /// Queues `w` to be woken when a buffer comes back.
    pub(crate) fn wait_for_buffer(&self, w: Weak<dyn BufWaiter>) {
        self.waiters.borrow_mut().push_back(w);
    }

    /// Takes buffer `bid`, into which the kernel received `len` bytes, as a chunk. None (and
    /// the buffer goes back) if the completion does not fit the ring.
    pub(crate) fn take(self: &Rc<Self>, bid: u16, len: u32) -> Option<RecvChunk> {
        if bid >= self.count || len > self.size {
            log::error!("receive completion names buffer {bid} with {len} bytes, outside the ring");
            if bid < self.count {
                self.recycle(bid);
            }
            return None;
        }
        self.held.set(self.held.get() + 1);
        self.chunks.set(self.chunks.get() + 1);
        Some(RecvChunk { mem: ChunkMem::Ring { group: self.clone(), bid }, start: 0, end: len })
    }

    /// Puts buffer `bid` back into the ring without a chunk having held it (a completion that
    /// selected it but received nothing), and wakes a waiter.
    pub(crate) fn recycle(&self, bid: u16) {
        if bid < self.count {
            self.put(bid);
            self.wake_one();
        }
    }

    /// A chunk gives its buffer back.
    fn give_back(&self, bid: u16) {
        self.held.set(self.held.get() - 1);
        self.put(bid);
        self.wake_one();
    }

    /// Writes buffer `bid` at the tail and publishes it.
    fn put(&self, bid: u16) {
        let tail = self.tail.get();
        let index = (tail & (self.count - 1)) as usize;
        // SAFETY: `index` < count, so the entry lies in the mapping; the kernel reads only the
        // entries between its head and the published tail, and this one is at the tail, not
        // yet published. Only addr, len and bid are written: entry 0's `resv` is the tail.
        unsafe {
            let e = (self.entries.base.as_ptr() as *mut RawEntry).add(index);
            std::ptr::addr_of_mut!((*e).addr).write(self.buf_ptr(bid) as u64);
            std::ptr::addr_of_mut!((*e).len).write(self.size);
            std::ptr::addr_of_mut!((*e).bid).write(bid);
        }
        let tail = tail.wrapping_add(1);
        self.tail.set(tail);
        // SAFETY: the tail is entry 0's `resv`, a 2-byte-aligned u16 in the mapping; the kernel
        // reads it with an acquire load, so the entry written above is visible first.
        unsafe {
            let t = std::ptr::addr_of_mut!((*(self.entries.base.as_ptr() as *mut RawEntry)).resv);
            AtomicU16::from_ptr(t).store(tail, Ordering::Release);
        }
    }

    /// Start of buffer `bid` (< count).
    fn buf_ptr(&self, bid: u16) -> *mut u8 {
        // SAFETY: bid < count, so the offset stays inside the buffers' mapping.
        unsafe { self.mem.base.as_ptr().add(bid as usize * self.size as usize) }
    }

    /// Wakes the first waiter that still waits.
    fn wake_one(&self) {
        loop {
            let w = self.waiters.borrow_mut().pop_front();
            let Some(w) = w else { return };
            if w.upgrade().is_some_and(|w| w.buffers_back()) {
                return;
            }
        }
    }
}

/// The memory of a chunk: a buffer of the reactor's ring, or a buffer of the socket's own.
enum ChunkMem {
    Ring { group: Rc<BufGroup>, bid: u16 },
    Owned { buf: Option<IoBuf>, home: Weak<dyn Reclaim> },
}

/// Bytes received in one completion, in a buffer the chunk holds until dropped (a ring buffer
/// then goes back to the ring). Dereferences to the bytes not yet consumed.
pub struct RecvChunk {
    mem: ChunkMem,
    start: u32,
    end: u32,
}

impl RecvChunk {
    /// A chunk of the first `len` bytes of `buf`, a socket's own buffer, which goes back to
    /// `home` when the chunk is dropped.
    pub(crate) fn owned(buf: IoBuf, len: u32, home: Weak<dyn Reclaim>) -> Self {
        let end = len.min(buf.len() as u32);
        Self { mem: ChunkMem::Owned { buf: Some(buf), home }, start: 0, end }
    }

    /// A chunk of the first `len` bytes of `buf`, received by other means than a stream (e.g.
    /// [`crate::net::Socket::try_recv`]); the buffer is dropped with the chunk.
    pub fn from_buf(buf: IoBuf, len: usize) -> Self {
        let home: Weak<dyn Reclaim> = Weak::<NoHome>::new();
        Self::owned(buf, len.min(u32::MAX as usize) as u32, home)
    }

    /// Bytes not yet consumed.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// True when every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Drops the first `n` bytes (all of them if fewer are left).
    pub fn consume(&mut self, n: usize) {
        self.start = self.end.min(self.start.saturating_add(n.min(u32::MAX as usize) as u32));
    }

    /// True if the bytes are in a buffer of the reactor's ring (false: the socket's own).
    pub fn from_ring(&self) -> bool {
        matches!(self.mem, ChunkMem::Ring { .. })
    }
}

impl Deref for RecvChunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let base = match &self.mem {
            ChunkMem::Ring { group, bid } => group.buf_ptr(*bid) as *const u8,
            ChunkMem::Owned { buf: Some(b), .. } => b.as_ptr(),
            ChunkMem::Owned { buf: None, .. } => return &[],
        };
        // SAFETY: the kernel wrote `end` bytes (≤ the buffer's size, checked at take) at `base`;
        // the buffer is this chunk's until it is dropped (the kernel does not pick a ring buffer
        // again before it is published back), and start ≤ end.
        unsafe { std::slice::from_raw_parts(base.add(self.start as usize), (self.end - self.start) as usize) }
    }
}

impl Drop for RecvChunk {
    fn drop(&mut self) {
        match &mut self.mem {
            ChunkMem::Ring { group, bid } => group.give_back(*bid),
            ChunkMem::Owned { buf, home } => {
                if let (Some(b), Some(h)) = (buf.take(), home.upgrade()) {
                    h.reclaim(b);
                }
            }
        }
    }
}

impl std::fmt::Debug for RecvChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvChunk").field("len", &self.len()).field("from_ring", &self.from_ring()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail_of(g: &BufGroup) -> u16 {
        // SAFETY: reads entry 0's resv (the tail) inside the mapping.
        unsafe { (*(g.entries.base.as_ptr() as *const RawEntry)).resv }
    }

    fn entry(g: &BufGroup, i: usize) -> (u64, u32, u16) {
        // SAFETY: i < count.
        let e = unsafe { &*(g.entries.base.as_ptr() as *const RawEntry).add(i) };
        (e.addr, e.len, e.bid)
    }

    #[test]
    fn a_new_group_publishes_every_buffer() {
        let g = BufGroup::new(RecvBufConfig { count: 8, size: 4096 }).unwrap();
        assert_eq!(tail_of(&g), 8);
        assert_eq!(g.ring_addr() % 4096, 0);
        for i in 0..8 {
            let (addr, len, bid) = entry(&g, i);
            assert_eq!((bid as usize, len), (i, 4096));
            assert_eq!(addr, g.buf_ptr(i as u16) as u64);
        }
        assert_eq!(g.free(), 8);
    }

    #[test]
    fn chunks_give_their_buffer_back_at_the_tail() {
        let g = BufGroup::new(RecvBufConfig { count: 4, size: 256 }).unwrap();
        // The kernel "received" 5 bytes into buffer 2.
        // SAFETY: buffer 2 is inside the mapping and not shared with anyone in this test.
        unsafe { std::ptr::copy_nonoverlapping(b"hello".as_ptr(), g.buf_ptr(2), 5) };
        let mut c = g.take(2, 5).unwrap();
        assert_eq!(&c[..], b"hello");
        assert!(c.from_ring());
        assert_eq!(g.free(), 3);
        c.consume(2);
        assert_eq!(&c[..], b"llo");
        c.consume(100);
        assert!(c.is_empty());
        drop(c);
        assert_eq!(g.free(), 4);
        assert_eq!(tail_of(&g), 5);
        assert_eq!(entry(&g, 0).2, 2, "the returned buffer is published at the old tail (index 4 & 3)");
        assert_eq!(tail_of(&g), 5, "writing entry 0 left the tail alone");
        assert_eq!(g.stats().chunks, 1);
    }

    #[test]
    fn bad_completions_are_refused() {
        let g = BufGroup::new(RecvBufConfig { count: 4, size: 256 }).unwrap();
        assert!(g.take(4, 1).is_none());
        assert!(g.take(1, 257).is_none());
        assert_eq!(g.free(), 4);
    }

    #[test]
    fn configs_are_checked() {
        assert!(RecvBufConfig { count: 3, size: 4096 }.check().is_err());
        assert!(RecvBufConfig { count: 0, size: 4096 }.check().is_ok());
        assert!(RecvBufConfig { count: 8, size: 1 }.check().is_err());
        assert!(RecvBufConfig { count: 8, size: MAX_RECV_BUF_SIZE + 1 }.check().is_err());
        assert!(BufGroup::new(RecvBufConfig { count: 0, size: 4096 }).is_err());
    }

    struct Waiter(Cell<bool>, Cell<u32>);
    impl BufWaiter for Waiter {
        fn buffers_back(&self) -> bool {
            self.1.set(self.1.get() + 1);
            self.0.get()
        }
    }

    #[test]
    fn a_returned_buffer_wakes_the_first_waiter_still_waiting() {
        let g = BufGroup::new(RecvBufConfig { count: 2, size: 64 }).unwrap();
        let gone: Rc<dyn BufWaiter> = Rc::new(Waiter(Cell::new(true), Cell::new(0)));
        let done = Rc::new(Waiter(Cell::new(false), Cell::new(0)));
        let waiting = Rc::new(Waiter(Cell::new(true), Cell::new(0)));
        g.wait_for_buffer(Rc::downgrade(&gone));
        drop(gone);
        g.wait_for_buffer(Rc::downgrade(&done) as Weak<dyn BufWaiter>);
        g.wait_for_buffer(Rc::downgrade(&waiting) as Weak<dyn BufWaiter>);
        drop(g.take(0, 1).unwrap());
        assert_eq!((done.1.get(), waiting.1.get()), (1, 1));
        assert!(g.waiters.borrow().is_empty());
    }
}
