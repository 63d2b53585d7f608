//! External memory (a VM's guest memory regions, mapped by a vhost target) registered with every
//! reactor's io_uring as fixed buffers, so that I/O into it can use `READ_FIXED`/`WRITE_FIXED`.
//!
//! [`FixedMem::register`] visits each reactor in turn (by message: each reactor owns its ring)
//! and registers the region in that ring's sparse fixed-buffer table, after the buffer pool's
//! two slots. The kernel takes at most 1 GiB per fixed buffer, so a region is cut into chunks of
//! 1 GiB that overlap by [`CHUNK_OVERLAP`] (2 MiB): a view of up to 2 MiB always lies inside
//! one chunk, whose index it carries; a longer view crossing a chunk boundary has none and is
//! done unregistered. A region takes one slot per chunk (`EngineConfig::fixed_mem_slots`).
//!
//! Registration pins the region's pages (they become resident and stay so) and, for a process
//! without `CAP_IPC_LOCK`, is charged to `RLIMIT_MEMLOCK` once per ring. Registration never
//! fails: a reactor whose ring cannot take the region (a limit, a full table, a kernel before
//! 5.19 without sparse tables, memory it cannot pin) keeps it unregistered, says so in the log
//! (a warning the first time, then at debug level), and its views carry no fixed index: their
//! I/O uses the plain opcodes, as correct and one page-pinning slower per request.
//!
//! Unregistration follows the last user: each reactor's part ([`LocalMem`]) is held by that
//! reactor's table and by every view ([`LocalMem::view`]) made from it; dropping the
//! [`FixedMem`] removes the table entries, and a reactor empties its slots when the last view
//! of its part drops. Views live as long as the I/O that uses them (a request owns its buffers
//! until it completes), so no slot is emptied or reused under an I/O that names it.

use crate::buf::JUMBO_BUF;
use crate::reactor::{fixed_mem_table, Engine};
use crate::{oneshot, try_with_ring, IoBuf};
use std::any::Any;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The largest fixed buffer the kernel registers.
pub const CHUNK: usize = 1 << 30;
/// Consecutive chunks overlap by this much: a view of up to this size always lies in one.
pub const CHUNK_OVERLAP: usize = JUMBO_BUF;
const STRIDE: usize = CHUNK - CHUNK_OVERLAP;

/// Chunks (fixed buffers) a region of `len` bytes takes.
pub fn chunk_count(len: usize) -> usize {
    if len <= CHUNK {
        1
    } else {
        1 + (len - CHUNK).div_ceil(STRIDE)
    }
}

/// The chunk of a region of `region` bytes that holds `[offset, offset + len)`, if one does.
fn chunk_of(region: usize, offset: usize, len: usize) -> Option<usize> {
    // The latest chunk starting at or before `offset` reaches farthest.
    let k = (offset / STRIDE).min(chunk_count(region) - 1);
    let end = (k * STRIDE + CHUNK).min(region);
    (offset.checked_add(len)? <= end).then_some(k)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A region registered (where possible) on every reactor of an engine. Dropping it unregisters
/// the region, on each reactor once its last view is gone.
pub struct FixedMem {
    engine: Engine,
    id: u64,
    len: usize,
    registered: Vec<bool>,
}

/// What travels from reactor to reactor while a region is registered.
struct Parts {
    id: u64,
    base: usize,
    len: usize,
    keep: Arc<dyn Any + Send + Sync>,
    registered: Vec<bool>,
}

impl FixedMem {
    /// Registers `len` bytes at `ptr` on every reactor of `engine`, one after the other; the
    /// receiver gets the handle once all have tried (`Canceled` if the engine stopped first).
    /// `keep` keeps the memory mapped (its last clone drops once no reactor uses the region).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay mapped, readable and writable, for as long as `keep` lives.
    pub unsafe fn register(
        engine: &Engine,
        ptr: NonNull<u8>,
        len: usize,
        keep: Arc<dyn Any + Send + Sync>,
    ) -> oneshot::Receiver<FixedMem> {
        assert!(len > 0, "an empty region");
        let (tx, rx) = oneshot::channel();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let parts = Parts { id, base: ptr.as_ptr() as usize, len, keep, registered: Vec::new() };
        let e = engine.clone();
        engine.send(0, move || register_from(e, 0, parts, tx));
        rx
    }

    /// This reactor's part, from which views are made; None off-reactor (or on a reactor of
    /// another engine).
    pub fn local(&self) -> Option<Rc<LocalMem>> {
        fixed_mem_table(|t| t.iter().find(|m| m.id == self.id).cloned()).flatten()
    }

    /// Whether each reactor (by index) registered the region with its ring.
    pub fn registered(&self) -> &[bool] {
        &self.registered
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// False: a region is never empty (kept for the `len`/`is_empty` pair).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for FixedMem {
    fn drop(&mut self) {
        let id = self.id;
        for r in 0..self.engine.count() {
            self.engine.send(r, move || {
                // Taken out first: the part may drop here and then borrow the ring.
                let part = fixed_mem_table(|t| t.iter().position(|m| m.id == id).map(|i| t.swap_remove(i))).flatten();
                drop(part);
            });
        }
    }
}

/// Registers the region on reactor `r` (the caller), then passes on to the next reactor or,
/// from the last one, hands out the handle.
fn register_from(engine: Engine, r: usize, mut parts: Parts, tx: oneshot::Sender<FixedMem>) {
    let part = LocalMem::register(&parts, r);
    parts.registered.push(part.slots.is_some());
    fixed_mem_table(|t| t.push(Rc::new(part)));
    if r + 1 < engine.count() {
        let e = engine.clone();
        engine.send(r + 1, move || register_from(e, r + 1, parts, tx));
    } else {
        tx.send(FixedMem { engine, id: parts.id, len: parts.len, registered: parts.registered });
    }
}

/// One reactor's part of a [`FixedMem`]: its fixed-buffer slots (if registered) and a hold on
/// the memory.
pub struct LocalMem {
    id: u64,
    base: NonNull<u8>,
    len: usize,
    /// First fixed-buffer index and chunk count, if registered on this reactor's ring.
    slots: Option<(u16, u16)>,
    _keep: Arc<dyn Any + Send + Sync>,
}

/// Says why a region stays unregistered: a warning the first time in the process, then debug.
fn not_registered(reactor: usize, len: usize, why: &dyn std::fmt::Display) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let level = if WARNED.swap(true, Ordering::Relaxed) { log::Level::Debug } else { log::Level::Warn };
    log::log!(
        level,
        "reactor {reactor}: {len} B of external memory not registered as io_uring fixed buffers ({why}); \
         its I/O uses unregistered buffers"
    );
}

/// Err if `bytes` more of pinned memory would exceed `RLIMIT_MEMLOCK` for a process without
/// `CAP_IPC_LOCK` (the kernel would pin every page before it found out).
fn memlock_allows(bytes: usize) -> Result<(), String> {
    if has_cap_ipc_lock() {
        return Ok(());
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return Ok(());
    }
    if bytes as u64 > lim.rlim_cur {
        return Err(format!("{bytes} B above RLIMIT_MEMLOCK of {} B", lim.rlim_cur));
    }
    Ok(())
}

/// True if the calling thread has `CAP_IPC_LOCK` in its effective set (then the kernel does
/// not charge pinned buffers to `RLIMIT_MEMLOCK`).
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header { version: VERSION_3, pid: 0 };
    let mut d = [Data::default(); 2];
    // SAFETY: capget with a version-3 header and the two data words it fills.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) };
    r == 0 && d[0].effective & (1 << CAP_IPC_LOCK) != 0
}

impl LocalMem {
    /// Registers the region with the calling reactor's ring (or not: see the module doc).
    fn register(p: &Parts, reactor: usize) -> LocalMem {
        let n = chunk_count(p.len);
        let chunks: Vec<libc::iovec> = (0..n)
            .map(|k| {
                let start = k * STRIDE;
                libc::iovec { iov_base: (p.base + start) as *mut _, iov_len: CHUNK.min(p.len - start) }
            })
            .collect();
        let bytes: usize = chunks.iter().map(|c| c.iov_len).sum();
        let slots = match memlock_allows(bytes) {
            Err(why) => {
                not_registered(reactor, p.len, &why);
                None
            }
            Ok(()) => {
                // SAFETY: the memory stays mapped while `keep` lives (the caller's promise), and
                // this part holds `keep` until it empties the slots.
                match try_with_ring(|r| unsafe { r.register_external(&chunks) }) {
                    Some(Ok(first)) => Some((first, n as u16)),
                    Some(Err(e)) => {
                        not_registered(reactor, p.len, &e);
                        None
                    }
                    None => None,
                }
            }
        };
        LocalMem {
            id: p.id,
            base: NonNull::new(p.base as *mut u8).expect("registered from a NonNull"),
            len: p.len,
            slots,
            _keep: p.keep.clone(),
        }
    }

    /// True if the region is registered with this reactor's ring.
    pub fn is_registered(&self) -> bool {
        self.slots.is_some()
    }

    /// The fixed-buffer index covering `[offset, offset + len)`, if any.
    pub fn fixed_index(&self, offset: usize, len: usize) -> Option<u16> {
        let (first, _) = self.slots?;
        chunk_of(self.len, offset, len).map(|k| first + k as u16)
    }

    /// A writable view of `len` bytes at `offset` of the region, carrying the fixed-buffer
    /// index that covers it (so the uring bdev uses `READ_FIXED`/`WRITE_FIXED`); it keeps this
    /// part (the slots and the memory) alive. Panics if out of range. Costs no allocation.
    ///
    /// # Safety
    /// As for [`IoBuf::external`]: nothing else may access those bytes while the view is used
    /// for I/O (for guest memory: the guest handed the buffer to the device).
    pub unsafe fn view(self: &Rc<Self>, offset: usize, len: usize) -> IoBuf {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "view out of the region");
        // SAFETY: offset < len of the mapping, which this part keeps alive.
        let ptr = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(offset)) };
        // SAFETY: forwarded from the caller; the view holds this part.
        unsafe { IoBuf::registered(ptr, len, self.clone(), self.fixed_index(offset, len)) }
    }
}

impl Drop for LocalMem {
    fn drop(&mut self) {
        if let Some((first, n)) = self.slots {
            if try_with_ring(|r| r.unregister_external(first, n)).is_none() {
                // Off-reactor (the reactor is ending): its ring goes with it.
                log::debug!("fixed buffers {first}..+{n} left to the ring's end");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_overlap_so_that_small_views_fit_one() {
        assert_eq!(chunk_count(4096), 1);
        assert_eq!(chunk_count(CHUNK), 1);
        assert_eq!(chunk_count(CHUNK + 1), 2);
        assert_eq!(chunk_count(8 * CHUNK), 9, "8 GiB: 8 chunks of 1 GiB less 2 MiB, and a ninth");
        let region = 8 * CHUNK;
        let n = chunk_count(region);
        assert!((n - 1) * STRIDE + CHUNK >= region, "the last chunk reaches the end");
        // Every view of up to the overlap fits a chunk, wherever it starts.
        for start in [0, STRIDE - 1, STRIDE - CHUNK_OVERLAP, STRIDE, CHUNK - 1, 3 * STRIDE + 5, region - CHUNK_OVERLAP]
        {
            let k = chunk_of(region, start, CHUNK_OVERLAP).unwrap_or_else(|| panic!("view at {start}"));
            assert!(k * STRIDE <= start && start + CHUNK_OVERLAP <= k * STRIDE + CHUNK);
        }
        assert_eq!(chunk_of(region, STRIDE - 1, CHUNK), None, "a long view across a boundary has no chunk");
        assert_eq!(chunk_of(4096, 0, 4096), Some(0));
        assert_eq!(chunk_of(4096, 1, 4096), None);
    }
}
