//! Per-reactor pools of 4 KiB-aligned payload buffers.
//!
//! Each pool owns three anonymous mappings (no hugepages): a class of small buffers (4 KiB by
//! default), a class of large ones (128 KiB by default; both sizes and counts are set by SPDK's
//! `iobuf_set_options`) and a class of jumbo ones (2 MiB). The small and large regions
//! are registered with the reactor's io_uring as fixed buffers 0 and 1, so a module can use
//! `READ_FIXED`/`WRITE_FIXED` on them. The jumbo region serves the big requests of copy tools
//! (nbdcopy, qemu-img: 256 KiB to 2 MiB); it is reserved with `MAP_NORESERVE` and not registered,
//! so only the pages that requests have used become resident, and a LIFO free list keeps reusing
//! the same ones. A request larger than the jumbo class, or one made while its class is exhausted,
//! gets a heap buffer with the same alignment; such fallbacks are counted (`BufPool::stats`).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::rc::Rc;

/// Alignment of every payload buffer.
pub const BUF_ALIGN: usize = 4096;
/// Size of a small-class buffer.
pub const SMALL_BUF: usize = 4096;
/// Size of a large-class buffer (the largest registered buffer).
pub const LARGE_BUF: usize = 128 * 1024;
/// Size of a jumbo-class buffer (the largest pooled I/O).
pub const JUMBO_BUF: usize = 2 << 20;
/// The classes registered with io_uring (the first ones).
const REGISTERED_CLASSES: usize = 2;

/// How many buffers of each class a pool holds, and how big the small and large ones are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufPoolConfig {
    /// Number of small buffers.
    pub small_count: usize,
    /// Number of large buffers.
    pub large_count: usize,
    /// Bytes per small buffer (a multiple of [`BUF_ALIGN`]; default [`SMALL_BUF`]).
    pub small_size: usize,
    /// Bytes per large buffer (a multiple of [`BUF_ALIGN`], at least `small_size`, at most
    /// [`JUMBO_BUF`]; default [`LARGE_BUF`]).
    pub large_size: usize,
    /// Number of 2 MiB buffers (address space only until used).
    pub jumbo_count: usize,
    /// Bytes of heap buffers that [`BufPool::try_get`] may have outstanding when a class runs
    /// dry; past it, `try_get` says no and the caller waits (the bdev layer's NoMem).
    pub heap_budget: usize,
}

impl Default for BufPoolConfig {
    fn default() -> Self {
        Self {
            small_count: 1024,
            large_count: 64,
            small_size: SMALL_BUF,
            large_size: LARGE_BUF,
            jumbo_count: 256,
            heap_budget: 64 << 20,
        }
    }
}

impl BufPoolConfig {
    /// Checks the class sizes: multiples of [`BUF_ALIGN`], small ≤ large ≤ [`JUMBO_BUF`].
    pub fn check(&self) -> Result<(), String> {
        for (what, size) in [("small", self.small_size), ("large", self.large_size)] {
            if size == 0 || size % BUF_ALIGN != 0 || size > JUMBO_BUF {
                return Err(format!("{what} buffer size {size} is not a multiple of {BUF_ALIGN} up to {JUMBO_BUF}"));
            }
        }
        if self.small_size > self.large_size {
            return Err(format!("small buffers ({}) larger than large ones ({})", self.small_size, self.large_size));
        }
        Ok(())
    }

    /// Bytes of the registered classes (small and large), which become resident when
    /// registered with io_uring; None if that overflows.
    pub fn registered_bytes(&self) -> Option<usize> {
        self.small_count.checked_mul(self.small_size)?.checked_add(self.large_count.checked_mul(self.large_size)?)
    }
}

/// Counters of a pool, for metrics and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BufPoolStats {
    /// Buffers handed out from the pool.
    pub pooled: u64,
    /// Buffers that had to come from the heap.
    pub heap_fallbacks: u64,
    /// Small buffers free now.
    pub small_free: usize,
    /// Large buffers free now.
    pub large_free: usize,
    /// Jumbo buffers free now.
    pub jumbo_free: usize,
    /// Bytes of heap fallbacks taken by `try_get` outstanding now.
    pub heap_bytes: usize,
    /// The most `try_get` may have outstanding on the heap (`BufPoolConfig::heap_budget`).
    pub heap_budget: usize,
    /// Times `try_get` refused because its class was empty and the heap budget spent.
    pub refused: u64,
    /// Small buffers in the pool.
    pub small_count: usize,
    /// Large buffers in the pool.
    pub large_count: usize,
    /// Bytes per small buffer.
    pub small_size: usize,
    /// Bytes per large buffer.
    pub large_size: usize,
    /// The small and large classes are registered with the reactor's io_uring.
    pub registered: bool,
}

/// An anonymous private mapping, unmapped on drop.
pub(crate) struct Region {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
}

impl Region {
    /// Maps `len` bytes (none for 0) with the extra `mmap` flags given.
    pub(crate) fn map(len: usize, extra_flags: i32) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self { base: NonNull::dangling(), len: 0 });
        }
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { base: NonNull::new(p as *mut u8).expect("mmap returned null"), len })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `map`; no buffer outlives the pool
            // because every IoBuf holds an Rc to it.
            unsafe { libc::munmap(self.base.as_ptr() as *mut _, self.len) };
        }
    }
}

struct Class {
    region: Region,
    size: usize,
    free: RefCell<Vec<u32>>,
}

impl Class {
    fn new(size: usize, count: usize, map_flags: i32) -> std::io::Result<Self> {
        Ok(Self {
            region: Region::map(size * count, map_flags)?,
            size,
            free: RefCell::new((0..count as u32).rev().collect()),
        })
    }
}

/// A pool of aligned buffers owned by one reactor (not `Send`).
pub struct BufPool {
    /// Small, large (both registered with io_uring) and jumbo (not registered).
    classes: [Class; 3],
    cfg: BufPoolConfig,
    /// The small and large regions are the reactor's registered buffers now (a pool replaced
    /// by `iobuf_set_options`, or whose registration failed, hands out no fixed indexes).
    registered: Cell<bool>,
    pooled: Cell<u64>,
    heap_fallbacks: Cell<u64>,
    heap_budget: usize,
    heap_bytes: Cell<usize>,
    refused: Cell<u64>,
}

impl BufPool {
    /// Maps the pool's regions (not registered yet: see [`BufPool::set_registered`]).
    pub fn new(cfg: BufPoolConfig) -> std::io::Result<Rc<Self>> {
        cfg.check().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let too_big = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "buffer pool size overflows");
        cfg.registered_bytes().ok_or_else(too_big)?;
        cfg.jumbo_count.checked_mul(JUMBO_BUF).ok_or_else(too_big)?;
        Ok(Rc::new(Self {
            classes: [
                Class::new(cfg.small_size, cfg.small_count, 0)?,
                Class::new(cfg.large_size, cfg.large_count, 0)?,
                Class::new(JUMBO_BUF, cfg.jumbo_count, libc::MAP_NORESERVE)?,
            ],
            cfg,
            registered: Cell::new(false),
            pooled: Cell::new(0),
            heap_fallbacks: Cell::new(0),
            heap_budget: cfg.heap_budget,
            heap_bytes: Cell::new(0),
            refused: Cell::new(0),
        }))
    }

    /// The sizes the pool was made with.
    pub fn config(&self) -> BufPoolConfig {
        self.cfg
    }

    /// Says whether the regions are registered with the reactor's io_uring as fixed buffers 0
    /// and 1 (only then do buffers report a [`IoBuf::fixed_index`]).
    pub fn set_registered(&self, registered: bool) {
        self.registered.set(registered);
    }

    /// The registered regions (small, large) as iovecs, in fixed-buffer index order, for
    /// `io_uring_register_buffers`. A class of no buffers keeps its index with a null region, so
    /// the large class is always index 1.
    pub fn regions(&self) -> Vec<libc::iovec> {
        self.classes[..REGISTERED_CLASSES]
            .iter()
            .map(|c| match c.region.len {
                0 => libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
                len => libc::iovec { iov_base: c.region.base.as_ptr() as *mut _, iov_len: len },
            })
            .collect()
    }

    /// Takes a buffer of `len` bytes (its capacity may be larger). Never fails: falls back to
    /// the heap when the smallest class that fits is empty or `len` exceeds the jumbo class.
    pub fn get(self: &Rc<Self>, len: usize) -> IoBuf {
        match self.take_pooled(len) {
            Some(b) => b,
            None => {
                // Counted, but not against the heap budget: that bounds what the bdev layer's
                // fallible requests may take, and long-lived buffers taken here (a connection's
                // staging buffer) must not starve them.
                self.heap_fallbacks.set(self.heap_fallbacks.get() + 1);
                IoBuf::heap(len)
            }
        }
    }

    /// The largest buffer `try_get` can ever give: a larger one is never there, however long
    /// one waits.
    pub fn largest_grant(&self) -> usize {
        self.classes.iter().map(|c| c.size).max().unwrap_or(0).max(self.heap_budget)
    }

    /// Takes a buffer of `len` bytes from its class, or from the heap while the heap budget
    /// lasts; None when both are spent (the caller should wait for buffers to come back).
    pub fn try_get(self: &Rc<Self>, len: usize) -> Option<IoBuf> {
        if let Some(b) = self.take_pooled(len) {
            return Some(b);
        }
        if self.heap_bytes.get() + len > self.heap_budget {
            self.refused.set(self.refused.get() + 1);
            return None;
        }
        Some(self.heap_fallback(len))
    }

    fn take_pooled(self: &Rc<Self>, len: usize) -> Option<IoBuf> {
        let class = self.classes.iter().position(|c| len <= c.size)?;
        let c = &self.classes[class];
        let idx = c.free.borrow_mut().pop()?;
        self.pooled.set(self.pooled.get() + 1);
        // SAFETY: idx < count, so the offset stays inside the mapped region.
        let ptr = unsafe { c.region.base.as_ptr().add(idx as usize * c.size) };
        Some(IoBuf {
            ptr: NonNull::new(ptr).expect("region pointer is non-null"),
            len: len as u32,
            cap: c.size as u32,
            owner: Owner::Pool(self.clone()),
            idx,
            class: class as u8,
            zeroed: false,
            read_only: false,
        })
    }

    fn heap_fallback(self: &Rc<Self>, len: usize) -> IoBuf {
        self.heap_fallbacks.set(self.heap_fallbacks.get() + 1);
        let mut b = IoBuf::heap(len);
        self.heap_bytes.set(self.heap_bytes.get() + b.capacity());
        b.owner = Owner::PoolHeap(self.clone());
        b
    }

    /// Current counters.
    pub fn stats(&self) -> BufPoolStats {
        BufPoolStats {
            pooled: self.pooled.get(),
            heap_fallbacks: self.heap_fallbacks.get(),
            small_free: self.classes[0].free.borrow().len(),
            large_free: self.classes[1].free.borrow().len(),
            jumbo_free: self.classes[2].free.borrow().len(),
            heap_bytes: self.heap_bytes.get(),
            heap_budget: self.heap_budget,
            refused: self.refused.get(),
            small_count: self.cfg.small_count,
            large_count: self.cfg.large_count,
            small_size: self.cfg.small_size,
            large_size: self.cfg.large_size,
            registered: self.registered.get(),
        }
    }
}

/// Lent payloads from this size up are warmed before a send (`warm_lent`).
pub const WARM_MIN: usize = 16 << 10;

/// Loads one byte of every cache line of `buf` if it is lent memory of at least [`WARM_MIN`]
/// bytes, before the kernel copies it into a socket's buffers. Lent memory (a malloc bdev's) is
/// likely in no cache, and the kernel's copy (`rep movsb`) takes a cold source page by page,
/// while independent loads run ahead across pages: with them, NVMe/TCP reads of 16 KiB-1 MiB
/// from a malloc bdev made 5-27% more IOPS on an AMD EPYC (docs/perf-log/2026-11-28-nvmf-target-vs-spdk.md). Smaller
/// payloads gained nothing and lost 3-5% (within one page there is nothing to run ahead of);
/// prefetch instructions instead of loads gained about half as much. The NBD target does not
/// use it: nbdcopy's whole-export reads (64 requests of 256 KiB in flight) lost 2-18% with it,
/// though 8 requests of 128 KiB gained 6-8%; why the two targets differ is not known yet.
#[inline]
pub fn warm_lent(buf: &IoBuf) {
    if buf.is_lent() && buf.len() >= WARM_MIN {
        warm(buf);
    }
}

#[inline(never)]
fn warm(data: &[u8]) {
    const LINE: usize = 64;
    let p = data.as_ptr();
    let mut at = 0;
    while at < data.len() {
        // SAFETY: `at` is within `data`.
        unsafe { std::ptr::read_volatile(p.add(at)) };
        at += LINE;
    }
    // The last line, which the steps miss when `data` does not start on a line.
    if let Some(last) = data.last() {
        // SAFETY: a reference to a byte of `data`.
        unsafe { std::ptr::read_volatile(last) };
    }
}

/// What keeps lent memory alive (see `IoBuf::lent`): any value, behind a thin pointer so that an
/// `IoBuf` stays small. An owner lending from several cores keeps one `Rc<Lender>` per core, so
/// lending touches no reference count that other cores write.
pub struct Lender(#[allow(dead_code)] Box<dyn std::any::Any>);

impl Lender {
    /// Wraps `keep`, dropped when the last lent buffer and the lender's own handle are gone.
    pub fn new(keep: impl std::any::Any) -> Self {
        Self(Box::new(keep))
    }
}

/// Where an `IoBuf`'s memory comes from, and so where it goes when the buffer is dropped.
enum Owner {
    /// The global allocator, with layout `cap` at BUF_ALIGN.
    Heap,
    /// As `Heap`, a fallback of this pool: counted against its heap budget until dropped.
    PoolHeap(Rc<BufPool>),
    /// Slot `idx` of class `class` of this pool.
    Pool(Rc<BufPool>),
    /// Memory lent read-only for a zero-copy read (see `IoBuf::lent`), kept alive by the lender.
    Lent(#[allow(dead_code)] Rc<Lender>), // held, never read: dropping it releases the memory
    /// Writable memory that a target registered (a VM's guest memory), kept alive by the lender.
    External(#[allow(dead_code)] Rc<Lender>),
    /// A writable view of external memory registered with the reactor's ring
    /// (`crate::FixedMem`), which it keeps alive and registered; `idx` is its fixed-buffer
    /// index, or `NO_FIXED`.
    Registered(#[allow(dead_code)] Rc<crate::fixedmem::LocalMem>),
    /// A read-only part of a shared buffer (a received capsule's data), which it keeps alive.
    Slice(#[allow(dead_code)] Rc<IoBuf>),
    /// Memory owned elsewhere whose owner outlives this view by construction (the bdev layer's
    /// split children point into their parent's buffers).
    View,
}

/// `IoBuf::idx` of a registered view that has no fixed-buffer index.
const NO_FIXED: u32 = u32::MAX;

/// An owned, 4 KiB-aligned payload buffer. Dereferences to its first `len` bytes; dropping it
/// returns it to its pool.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: u32,
    cap: u32,
    owner: Owner,
    idx: u32,
    class: u8,
    /// True while every byte is known to be zero (set by `mark_zeroed`, cleared by any mutable
    /// access), so that a module that must return zeroes can skip refilling.
    zeroed: bool,
    /// Lent, slices and read-only views: writing through the buffer panics.
    read_only: bool,
}

impl IoBuf {
    /// A zero-filled heap buffer, aligned like pooled ones (for callers without a reactor).
    pub fn heap(len: usize) -> Self {
        assert!(len <= u32::MAX as usize - BUF_ALIGN, "IoBuf of {len} bytes is too large");
        let cap = len.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Self::heap_layout(cap);
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len: len as u32,
            cap: cap as u32,
            owner: Owner::Heap,
            idx: 0,
            class: 0,
            zeroed: true,
            read_only: false,
        }
    }

    /// A buffer of no bytes that owns no memory: a placeholder left where a buffer was taken
    /// out for a moment (allocates nothing, frees nothing).
    pub fn empty() -> Self {
        Self::borrowed(NonNull::dangling(), 0, Owner::View, false)
    }

    /// A read-only view of `len` bytes at `ptr` that another owner lends for a zero-copy read
    /// (the malloc bdev lends its memory); `lender` keeps that memory alive while the view
    /// exists. Writing through the view (`DerefMut`, `as_mut_ptr`) panics: it would bypass the
    /// owner.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes for as long as `lender` lives.
    pub unsafe fn lent(ptr: NonNull<u8>, len: usize, lender: Rc<Lender>) -> Self {
        assert!(len <= u32::MAX as usize, "IoBuf of {len} bytes is too large");
        Self::borrowed(ptr, len, Owner::Lent(lender), true)
    }

    /// A writable view of `len` bytes at `ptr` of memory that a target registered (a VM's guest
    /// memory for vhost); `keep` keeps the mapping alive while the view exists. Its address and
    /// length need no alignment: the bdev layer bounces what a module cannot take.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `keep` lives, and
    /// nothing else may access those bytes while the view is used for I/O.
    pub unsafe fn external(ptr: NonNull<u8>, len: usize, keep: Rc<Lender>) -> Self {
        assert!(len <= u32::MAX as usize, "IoBuf of {len} bytes is too large");
        Self::borrowed(ptr, len, Owner::External(keep), false)
    }

    /// A writable view of `len` bytes at `ptr` inside external memory registered with the
    /// reactor's ring, carrying the fixed-buffer index that covers it (if any).
    ///
    /// # Safety
    /// As for [`IoBuf::external`], with `mem` keeping the memory alive.
    pub(crate) unsafe fn registered(
        ptr: NonNull<u8>,
        len: usize,
        mem: Rc<crate::fixedmem::LocalMem>,
        fixed: Option<u16>,
    ) -> Self {
        assert!(len <= u32::MAX as usize, "IoBuf of {len} bytes is too large");
        let mut b = Self::borrowed(ptr, len, Owner::Registered(mem), false);
        b.idx = fixed.map_or(NO_FIXED, u32::from);
        b
    }

    /// A read-only view of `len` bytes at `offset` of `whole`, which it keeps alive (a write
    /// payload taken from a received capsule without a copy). Panics if out of range.
    pub fn slice(whole: &Rc<IoBuf>, offset: usize, len: usize) -> Self {
        assert!(offset.checked_add(len).is_some_and(|e| e <= whole.len()), "IoBuf slice out of range");
        // SAFETY: the range lies within `whole`, which the new view keeps alive.
        let ptr = unsafe { NonNull::new_unchecked(whole.ptr.as_ptr().add(offset)) };
        Self::borrowed(ptr, len, Owner::Slice(whole.clone()), true)
    }

    /// A view of `len` bytes at `ptr` that owns nothing.
    ///
    /// # Safety
    /// The memory must stay valid (and, if `writable`, unaliased by other writers) for as long
    /// as the view exists.
    pub unsafe fn view(ptr: NonNull<u8>, len: usize, writable: bool) -> Self {
        assert!(len <= u32::MAX as usize, "IoBuf of {len} bytes is too large");
        Self::borrowed(ptr, len, Owner::View, !writable)
    }

    fn borrowed(ptr: NonNull<u8>, len: usize, owner: Owner, read_only: bool) -> Self {
        Self { ptr, len: len as u32, cap: len as u32, owner, idx: 0, class: 0, zeroed: false, read_only }
    }

    /// True for a read-only view lent by another owner (`IoBuf::lent`).
    #[inline]
    pub fn is_lent(&self) -> bool {
        matches!(self.owner, Owner::Lent(_))
    }

    /// True if writing through the buffer is not allowed (lent memory, slices, read-only views).
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn heap_layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, BUF_ALIGN).expect("valid buffer layout")
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True if the buffer holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in bytes (the most `set_len` accepts).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Changes the length, up to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.zeroed &= len <= self.len as usize;
        assert!(len <= self.cap as usize, "IoBuf::set_len({len}) beyond capacity {}", self.cap);
        self.len = len as u32;
    }

    /// Raw pointer to the first byte (for I/O submission); the contents count as changed.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        assert!(!self.read_only, "a lent IoBuf is read-only");
        self.zeroed = false;
        self.ptr.as_ptr()
    }

    /// Fills the first `len` bytes with zeroes, unless they are known to be zero already.
    #[inline]
    pub fn zero(&mut self) {
        if !self.zeroed {
            self.fill(0);
            self.zeroed = true;
        }
    }

    /// Raw pointer to the first byte.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The io_uring fixed-buffer index of this buffer's region, if it came from a registered
    /// class of a pool or is a view of registered external memory (`crate::FixedMem`).
    #[inline]
    pub fn fixed_index(&self) -> Option<u16> {
        match &self.owner {
            Owner::Pool(p) if (self.class as usize) < REGISTERED_CLASSES && p.registered.get() => {
                Some(self.class as u16)
            }
            Owner::Registered(_) if self.idx != NO_FIXED => Some(self.idx as u16),
            _ => None,
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, all initialised (zeroed mappings or
        // alloc_zeroed), and uniquely owned by this IoBuf.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl DerefMut for IoBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        assert!(!self.read_only, "a lent IoBuf is read-only");
        self.zeroed = false;
        // SAFETY: as in deref; &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Pool(pool) => pool.classes[self.class as usize].free.borrow_mut().push(self.idx),
            // Dropping the field releases what keeps the memory alive.
            Owner::Lent(_) | Owner::External(_) | Owner::Registered(_) | Owner::Slice(_) | Owner::View => {}
            // SAFETY: allocated in `heap` with exactly this layout.
            Owner::Heap => unsafe { dealloc(self.ptr.as_ptr(), Self::heap_layout(self.cap as usize)) },
            Owner::PoolHeap(pool) => {
                pool.heap_bytes.set(pool.heap_bytes.get() - self.cap as usize);
                // SAFETY: allocated in `heap` with exactly this layout.
                unsafe { dealloc(self.ptr.as_ptr(), Self::heap_layout(self.cap as usize)) }
            }
        }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).field("cap", &self.cap).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warming_lent_memory_stays_inside_it() {
        // Lent views that end right before a page that cannot be read (any byte touched past
        // their end faults), starting on, after and before a cache line.
        const PAGE: usize = 4096;
        let len = WARM_MIN + 2 * PAGE;
        // SAFETY: a private anonymous mapping of `len + PAGE` bytes, its last page made
        // unreadable; unmapped at the end of the test.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len + PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::mprotect(p.cast::<u8>().add(len).cast(), PAGE, libc::PROT_NONE), 0);
            p.cast::<u8>()
        };
        let lender = Rc::new(Lender::new(()));
        for (from, warmed) in [(0, true), (1, true), (2 * PAGE - 1, true), (2 * PAGE + 1, false)] {
            // SAFETY: [from, len) lies within the readable part of the mapping.
            let b = unsafe { IoBuf::lent(NonNull::new(base.add(from)).unwrap(), len - from, lender.clone()) };
            assert_eq!(b.len() >= WARM_MIN, warmed, "view from {from}");
            warm_lent(&b);
        }
        // Memory that is not lent is left alone, however large.
        warm_lent(&IoBuf::heap(WARM_MIN * 4));
        // SAFETY: the mapping made above; no view of it is left.
        unsafe { libc::munmap(base.cast(), len + PAGE) };
    }

    #[test]
    fn buffers_are_aligned_and_returned() {
        let pool = BufPool::new(BufPoolConfig {
            small_count: 2,
            large_count: 1,
            jumbo_count: 1,
            heap_budget: 0,
            ..Default::default()
        })
        .unwrap();
        pool.set_registered(true);
        let a = pool.get(512);
        let b = pool.get(4096);
        let c = pool.get(100_000);
        for buf in [&a, &b, &c] {
            assert_eq!(buf.as_ptr() as usize % BUF_ALIGN, 0);
        }
        assert_eq!(a.fixed_index(), Some(0));
        assert_eq!(c.fixed_index(), Some(1));
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(pool.stats().small_free, 0);
        // Exhausted class: heap fallback, still aligned, counted.
        let d = pool.get(4096);
        assert_eq!(pool.stats().heap_bytes, 0, "get's fallbacks do not spend try_get's budget");
        assert_eq!(d.fixed_index(), None);
        assert_eq!(d.as_ptr() as usize % BUF_ALIGN, 0);
        assert_eq!(pool.stats().heap_fallbacks, 1);
        drop((a, b, c, d));
        let s = pool.stats();
        assert_eq!((s.small_free, s.large_free, s.pooled), (2, 1, 3));
    }

    #[test]
    fn big_requests_use_the_jumbo_class_then_the_heap() {
        let pool = BufPool::new(BufPoolConfig {
            small_count: 1,
            large_count: 1,
            jumbo_count: 1,
            heap_budget: 0,
            ..Default::default()
        })
        .unwrap();
        let mut j = pool.get(LARGE_BUF + 4096);
        assert_eq!(j.len(), LARGE_BUF + 4096);
        assert_eq!(j.capacity(), JUMBO_BUF);
        assert_eq!(j.as_ptr() as usize % BUF_ALIGN, 0);
        assert_eq!(j.fixed_index(), None, "the jumbo class is not registered");
        j[LARGE_BUF] = 7;
        assert_eq!(j[LARGE_BUF], 7);
        assert_eq!((pool.stats().jumbo_free, pool.stats().heap_fallbacks), (0, 0));
        // Class exhausted, and beyond the class: heap buffers, zero-filled, counted.
        let mut h = pool.get(4096 * 3 + LARGE_BUF);
        let big = pool.get(JUMBO_BUF + 1);
        assert!(h.iter().all(|&b| b == 0) && big.iter().all(|&b| b == 0));
        assert_eq!(big.len(), JUMBO_BUF + 1);
        h[0] = 1;
        assert_eq!(pool.stats().heap_fallbacks, 2);
        let p = j.as_ptr();
        drop((j, h, big));
        assert_eq!(pool.stats().jumbo_free, 1);
        assert_eq!(pool.get(JUMBO_BUF).as_ptr(), p, "a returned jumbo buffer is reused");
    }

    #[test]
    fn lent_buffers_are_read_only_views_that_keep_their_lender() {
        let owner: Rc<Vec<u8>> = Rc::new((0..=255).collect());
        let lender = Rc::new(Lender::new(owner.clone()));
        // SAFETY: the view covers bytes 16..48 of the vector, which `lender` keeps alive.
        let view = unsafe { IoBuf::lent(NonNull::new(owner.as_ptr().add(16) as *mut u8).unwrap(), 32, lender) };
        assert!(view.is_lent());
        assert_eq!(&view[..], &owner[16..48]);
        assert_eq!(view.fixed_index(), None);
        assert_eq!(Rc::strong_count(&owner), 2);
        let mut view2 = view;
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| view2[0] = 1)).is_err());
        drop(view2);
        assert_eq!(Rc::strong_count(&owner), 1, "dropping the view releases the lender");
        assert_eq!(owner[16], 16);
    }

    #[test]
    fn zero_tracks_mutation() {
        let pool = BufPool::new(BufPoolConfig::default()).unwrap();
        let mut buf = pool.get(4096);
        buf.fill(9);
        buf.zero();
        assert!(buf.iter().all(|&b| b == 0));
        buf[100] = 1; // mutable access clears the flag
        buf.zero();
        assert_eq!(buf[100], 0);
        // SAFETY: writes one byte within the buffer through the raw pointer.
        unsafe { *buf.as_mut_ptr().add(7) = 3 };
        buf.zero();
        assert_eq!(buf[7], 0);
        buf.set_len(100);
        buf.zero();
        buf.set_len(4096);
        buf[4000] = 5;
        buf.set_len(100);
        buf.set_len(4096);
        buf.zero();
        assert_eq!(buf[4000], 0, "growing the length must not keep a stale zero flag");
    }

    #[test]
    fn writes_persist_in_a_buffer() {
        let pool = BufPool::new(BufPoolConfig::default()).unwrap();
        let mut buf = pool.get(8192);
        buf.fill(0xa5);
        buf.set_len(100);
        assert_eq!(buf.len(), 100);
        assert!(buf.iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn try_get_refuses_past_the_heap_budget_and_counts() {
        let pool = BufPool::new(BufPoolConfig {
            small_count: 1,
            large_count: 0,
            jumbo_count: 0,
            heap_budget: 8192,
            ..Default::default()
        })
        .unwrap();
        let a = pool.try_get(4096).expect("from the class");
        let b = pool.try_get(4096).expect("heap, within budget");
        let c = pool.try_get(4096).expect("heap, budget exactly spent");
        assert_eq!(pool.stats().heap_bytes, 8192);
        assert!(pool.try_get(512).is_none(), "budget spent: refused");
        assert_eq!(pool.stats().refused, 1);
        drop(b);
        assert_eq!(pool.stats().heap_bytes, 4096, "a dropped fallback gives its bytes back");
        let d = pool.try_get(4096).expect("room again");
        drop((a, c, d));
        let s = pool.stats();
        assert_eq!((s.small_free, s.heap_bytes), (1, 0));
    }

    #[test]
    fn external_memory_is_writable_and_kept_alive() {
        let owner = Rc::new(RefCell::new(vec![0u8; 64]));
        let ptr = NonNull::new(owner.borrow_mut().as_mut_ptr()).unwrap();
        // SAFETY: the view covers the vector's 64 bytes, which `keep` keeps alive; nothing else
        // touches them while the view is used.
        let mut v = unsafe { IoBuf::external(ptr, 64, Rc::new(Lender::new(owner.clone()))) };
        assert!(!v.is_read_only() && !v.is_lent());
        v[3] = 9;
        assert_eq!(Rc::strong_count(&owner), 2);
        drop(v);
        assert_eq!(Rc::strong_count(&owner), 1);
        assert_eq!(owner.borrow()[3], 9);
    }

    #[test]
    fn slices_are_read_only_and_keep_their_buffer() {
        let mut whole = IoBuf::heap(8192);
        whole[4096..].fill(7);
        let whole = Rc::new(whole);
        let s = IoBuf::slice(&whole, 4096, 100);
        assert!(s.is_read_only());
        assert!(s.iter().all(|&b| b == 7) && s.len() == 100);
        drop(whole);
        assert_eq!(s[99], 7, "the slice keeps the buffer alive");
        let mut s = s;
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s[0] = 1)).is_err());
        let w = Rc::new(IoBuf::heap(10));
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| IoBuf::slice(&w, 5, 6))).is_err(),
            "out of range"
        );
    }

    #[test]
    fn class_sizes_and_counts_follow_the_config() {
        let cfg = BufPoolConfig {
            small_count: 3,
            large_count: 2,
            small_size: 8192,
            large_size: 135168,
            jumbo_count: 0,
            heap_budget: 0,
        };
        let pool = BufPool::new(cfg).unwrap();
        assert_eq!(pool.config(), cfg);
        let s = pool.stats();
        assert_eq!((s.small_count, s.large_count, s.small_size, s.large_size), (3, 2, 8192, 135168));
        assert_eq!((s.small_free, s.large_free, s.registered), (3, 2, false));
        let a = pool.get(8192);
        assert_eq!(a.capacity(), 8192);
        let b = pool.get(8193);
        assert_eq!(b.capacity(), 135168);
        assert_eq!(a.fixed_index(), None, "an unregistered pool hands out no fixed index");
        pool.set_registered(true);
        assert_eq!((a.fixed_index(), b.fixed_index()), (Some(0), Some(1)));
        let regions = pool.regions();
        assert_eq!((regions[0].iov_len, regions[1].iov_len), (3 * 8192, 2 * 135168));
        for bad in [
            BufPoolConfig { small_size: 1000, ..Default::default() },
            BufPoolConfig { large_size: JUMBO_BUF + BUF_ALIGN, ..Default::default() },
            BufPoolConfig { small_size: 2 * LARGE_BUF, ..Default::default() },
            BufPoolConfig { small_count: usize::MAX, ..Default::default() },
        ] {
            assert!(BufPool::new(bad).is_err(), "{bad:?}");
        }
        let empty = BufPool::new(BufPoolConfig { small_count: 0, ..Default::default() }).unwrap();
        let r = empty.regions();
        assert!(r[0].iov_base.is_null() && r[1].iov_len == 64 * LARGE_BUF, "the large class stays index 1");
    }
}
