//! Requests in flight, kept in memory the front end holds for us (vhost-user's
//! VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD), so that a daemon killed with -9 and started again
//! finds which of the guest's requests it had taken and not completed, and submits them again:
//! the guest sees no error.
//!
//! The front end asks for the area once (GET_INFLIGHT_FD: we make a memfd), keeps the
//! descriptor, and hands it to the next daemon (SET_INFLIGHT_FD). Its layout is ours (the front
//! end never reads it); it is the one DPDK and libvhost-user use for split rings, per queue:
//!
//! ```text
//! 0   u64 features      8  u16 version (1)   10 u16 desc_num
//! 12  u16 last_batch_head                     14 u16 used_idx
//! 16  desc[desc_num]: u8 inflight, u8 pad[5], u16 next, u64 counter (16 bytes each)
//! ```
//! with queues [`queue_stride`] bytes apart. A request taken sets its head's `inflight` and a
//! counter (the order it was taken in). A completion notes its head in `last_batch_head`, puts
//! it on the used ring, clears `inflight`, then copies the used ring's index: a crash between
//! the used ring and the clear leaves `used_idx` behind the ring's, which is how recovery
//! knows that `last_batch_head` completed after all.
//!
//! Packed rings (VIRTIO_F_RING_PACKED acked before the area is asked for, as QEMU does) use
//! DPDK's packed layout (`rte_vhost_inflight_info_packed`), per queue:
//!
//! ```text
//! 0   u64 features   8  u16 version (1)   10 u16 desc_num   12 u16 free_head
//! 14  u16 old_free_head   16 u16 used_idx   18 u16 old_used_idx
//! 20  u8 used_wrap_counter   21 u8 old_used_wrap_counter   (22..32 padding)
//! 32  desc[desc_num]: u8 inflight, u8 pad, u16 next, u16 last, u16 num, u64 counter,
//!                     u16 id, u16 flags, u32 len, u64 addr (32 bytes each)
//! ```
//! with queues [`queue_stride_packed`] bytes apart. A packed ring's slots are overwritten by
//! used descriptors while other requests are still in flight, so a request taken copies its
//! ring descriptors into entries taken from a free list (`next` links from `free_head`); its
//! first entry holds `num`, `last`, the counter, and `inflight`, set once the copies are
//! written. A completion puts the entries back on the free list and moves `used_idx` and its
//! wrap counter on by `num`, writes the used descriptor, clears `inflight`, then copies the
//! three into their `old_` fields: a restart finds the used position in the `old_` fields, or,
//! if it was killed between the two copies, in the new ones when the used descriptor got to
//! the ring (the entry at `free_head` is the one that was completing). The available position is
//! the used one plus the descriptors of what is in flight, each of which is resubmitted from
//! its copies. A fresh area (version 0) is made ours at the ring's position.

use crate::packed::{Pos, DESC_F_USED};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

const HEADER: usize = 16;
const DESC: usize = 16;
const ALIGN: usize = 64;

/// Bytes one queue of `queue_size` entries takes in the area.
pub fn queue_stride(queue_size: u16) -> usize {
    (HEADER + DESC * queue_size as usize).div_ceil(ALIGN) * ALIGN
}

/// Packed layout: the header's fields (DPDK sizes the queue by them, before the entries'
/// alignment), then the entries from offset 32.
const P_HEADER: usize = 32;
const P_DESC: usize = 32;
const P_VERSION: usize = 8;
const P_DESC_NUM: usize = 10;
const P_FREE: usize = 12;
const P_OLD_FREE: usize = 14;
const P_USED: usize = 16;
const P_OLD_USED: usize = 18;
const P_WRAP: usize = 20;
const P_OLD_WRAP: usize = 21;
/// Entry fields.
const E_INFLIGHT: usize = 0;
const E_NEXT: usize = 2;
const E_LAST: usize = 4;
const E_NUM: usize = 6;
const E_COUNTER: usize = 8;
const E_ID: usize = 16;
const E_FLAGS: usize = 18;
const E_LEN: usize = 20;
const E_ADDR: usize = 24;

/// Bytes one packed queue of `queue_size` entries takes in the area (DPDK's
/// `get_pervq_shm_size_packed`).
pub fn queue_stride_packed(queue_size: u16) -> usize {
    (P_DESC * queue_size as usize + 8 + 2 * 6 + 9).div_ceil(ALIGN) * ALIGN
}

/// The area, mapped.
pub struct InflightArea {
    ptr: NonNull<u8>,
    len: usize,
    /// Queues it has room for.
    pub num_queues: u16,
    /// Entries per queue.
    pub queue_size: u16,
    /// In the packed layout.
    pub packed: bool,
}

// SAFETY: the mapping is plain shared memory; each queue's part is used by the one reactor
// that runs the queue (see `InflightQueue`).
unsafe impl Send for InflightArea {}
// SAFETY: as above; the area itself is never written through `&InflightArea`.
unsafe impl Sync for InflightArea {}

impl Drop for InflightArea {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn check_shape(num_queues: u16, queue_size: u16, packed: bool) -> Result<usize, String> {
    if num_queues == 0 || num_queues as usize > crate::backend::MAX_QUEUES {
        return Err(format!("inflight area for {num_queues} queues"));
    }
    // Packed rings need not be powers of two.
    let fits = if packed { queue_size <= crate::packed::MAX_SIZE } else { queue_size.is_power_of_two() };
    if queue_size == 0 || !fits {
        return Err(format!("inflight area for queues of {queue_size} entries"));
    }
    Ok(num_queues as usize * stride(queue_size, packed))
}

fn stride(queue_size: u16, packed: bool) -> usize {
    if packed {
        queue_stride_packed(queue_size)
    } else {
        queue_stride(queue_size)
    }
}

impl InflightArea {
    /// A fresh, zeroed area (GET_INFLIGHT_FD) and the file to give the front end.
    pub fn create(num_queues: u16, queue_size: u16) -> Result<(Arc<InflightArea>, File), String> {
        Self::create_as(num_queues, queue_size, false)
    }

    /// A fresh area in the packed layout, set up as DPDK sets it up (wrap counters 1, each
    /// queue's entries on its free list); a queue's part is made ours when its ring starts.
    pub fn create_packed(num_queues: u16, queue_size: u16) -> Result<(Arc<InflightArea>, File), String> {
        let (area, file) = Self::create_as(num_queues, queue_size, true)?;
        for q in 0..num_queues {
            let part = area.queue(q, queue_size).expect("a queue of the area's shape");
            part.set::<u8>(P_WRAP, 1);
            part.set::<u8>(P_OLD_WRAP, 1);
            for e in 0..queue_size {
                part.set::<u16>(Self::pdesc_at(e) + E_NEXT, e + 1);
            }
        }
        Ok((area, file))
    }

    fn pdesc_at(e: u16) -> usize {
        P_HEADER + P_DESC * e as usize
    }

    /// Bytes the area takes (what GET_INFLIGHT_FD answers as its size).
    pub fn size(&self) -> u64 {
        self.len as u64
    }

    fn create_as(num_queues: u16, queue_size: u16, packed: bool) -> Result<(Arc<InflightArea>, File), String> {
        let len = check_shape(num_queues, queue_size, packed)?;
        // SAFETY: a new memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"ferrite-vhost-inflight".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: we own the new descriptor.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).map_err(|e| format!("inflight area of {len} bytes: {e}"))?;
        let area = Self::map(&file, 0, len, num_queues, queue_size, packed)?;
        Ok((Arc::new(area), file))
    }

    /// Maps an area a front end handed back (SET_INFLIGHT_FD), checking that the file holds it.
    pub fn open(
        file: &File,
        offset: u64,
        size: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, String> {
        Self::open_as(file, offset, size, num_queues, queue_size, false)
    }

    /// [`InflightArea::open`] for an area in the packed layout.
    pub fn open_packed(
        file: &File,
        offset: u64,
        size: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, String> {
        Self::open_as(file, offset, size, num_queues, queue_size, true)
    }

    fn open_as(
        file: &File,
        offset: u64,
        size: u64,
        num_queues: u16,
        queue_size: u16,
        packed: bool,
    ) -> Result<Arc<InflightArea>, String> {
        let len = check_shape(num_queues, queue_size, packed)?;
        if size < len as u64 {
            return Err(format!("inflight area of {size} bytes; {num_queues} queues of {queue_size} need {len}"));
        }
        let have = file.metadata().map_err(|e| format!("inflight fd: {e}"))?.len();
        if offset.checked_add(len as u64).is_none_or(|end| end > have) {
            return Err(format!("inflight fd of {have} bytes is shorter than offset {offset} + {len}"));
        }
        Ok(Arc::new(Self::map(file, offset, len, num_queues, queue_size, packed)?))
    }

    fn map(
        file: &File,
        offset: u64,
        len: usize,
        num_queues: u16,
        queue_size: u16,
        packed: bool,
    ) -> Result<InflightArea, String> {
        if !offset.is_multiple_of(4096) {
            return Err(format!("inflight area offset {offset} is not page aligned"));
        }
        // SAFETY: a shared mapping of a file we checked is long enough.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mapping the inflight area: {}", std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast()).ok_or("mmap returned null")?;
        Ok(InflightArea { ptr, len, num_queues, queue_size, packed })
    }

    /// Queue `index`'s part, if the area has one for a ring of `size` entries.
    pub fn queue(self: &Arc<Self>, index: u16, size: u16) -> Option<InflightQueue> {
        if index >= self.num_queues || size != self.queue_size {
            return None;
        }
        // SAFETY: index < num_queues, so the part lies inside the mapping.
        let base = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(index as usize * stride(size, self.packed))) };
        Some(InflightQueue {
            _area: self.clone(),
            base,
            size,
            counter: 0,
            packed: self.packed,
            used: Pos::START,
            free: 0,
        })
    }
}

/// What a packed queue's part of the area says after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRecovery {
    /// Where the next used descriptor goes.
    pub used: Pos,
    /// The entries of the requests in flight, in the order they were taken.
    pub entries: Vec<u16>,
    /// Their ring descriptors, in all (the available position is this far past `used`).
    pub in_flight: u16,
}

/// One queue's part of the area, used by the reactor that runs the queue.
pub struct InflightQueue {
    _area: Arc<InflightArea>,
    base: NonNull<u8>,
    size: u16,
    counter: u64,
    /// In the packed layout (the split methods are not used then, nor the packed ones on a
    /// split part).
    packed: bool,
    /// Packed: the used position as completions move it (what `used_idx` says).
    used: Pos,
    /// Packed: the first free entry (what `free_head` says; `size` when none).
    free: u16,
}

// SAFETY: moved to the queue's reactor once, then used only there.
unsafe impl Send for InflightQueue {}

impl InflightQueue {
    /// In the packed layout.
    pub fn is_packed(&self) -> bool {
        self.packed
    }

    fn at<T>(&self, off: usize) -> *mut T {
        debug_assert!(off + std::mem::size_of::<T>() <= stride(self.size, self.packed));
        // SAFETY: offsets inside this queue's part (checked above in debug builds; callers pass
        // heads below `size`).
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    fn get<T: Copy>(&self, off: usize) -> T {
        // SAFETY: an aligned field inside this queue's part.
        unsafe { std::ptr::read_volatile(self.at::<T>(off)) }
    }

    fn set<T: Copy>(&self, off: usize, v: T) {
        // SAFETY: as `get`.
        unsafe { std::ptr::write_volatile(self.at::<T>(off), v) }
    }

    fn desc(head: u16) -> usize {
        HEADER + DESC * head as usize
    }

    /// After a restart: the heads that were taken and not completed, in the order they were
    /// taken, given the used ring's index now. Clears them as it goes only when they complete
    /// again. A fresh area (version 0) is made ours and has none.
    pub fn recover(&mut self, used_idx: u16) -> Vec<u16> {
        debug_assert!(!self.packed, "the split layout's recovery on a packed queue");
        if self.get::<u16>(8) != 1 || self.get::<u16>(10) != self.size {
            for h in 0..self.size {
                self.set::<u8>(Self::desc(h), 0);
            }
            self.set::<u64>(0, 0);
            self.set::<u16>(10, self.size);
            self.set::<u16>(12, 0);
            self.set::<u16>(14, used_idx);
            fence(Ordering::Release);
            self.set::<u16>(8, 1);
            return Vec::new();
        }
        if self.get::<u16>(14) != used_idx {
            // Killed between the used ring and the clear: that request did complete.
            let last = self.get::<u16>(12);
            if last < self.size {
                self.set::<u8>(Self::desc(last), 0);
            }
            self.set::<u16>(14, used_idx);
        }
        let mut taken: Vec<(u64, u16)> = (0..self.size)
            .filter(|&h| self.get::<u8>(Self::desc(h)) == 1)
            .map(|h| (self.get::<u64>(Self::desc(h) + 8), h))
            .collect();
        taken.sort_unstable();
        self.counter = taken.last().map_or(0, |&(c, _)| c);
        taken.into_iter().map(|(_, h)| h).collect()
    }

    /// Request `head` was taken from the ring.
    #[inline]
    pub fn begin(&mut self, head: u16) {
        debug_assert!(!self.packed);
        self.counter += 1;
        self.set::<u64>(Self::desc(head) + 8, self.counter);
        self.set::<u8>(Self::desc(head), 1);
    }

    /// Request `head` is about to go on the used ring.
    #[inline]
    pub fn completing(&self, head: u16) {
        self.set::<u16>(12, head);
        fence(Ordering::Release);
    }

    /// Request `head` is on the used ring, whose index is now `used_idx`.
    #[inline]
    pub fn completed(&self, head: u16, used_idx: u16) {
        fence(Ordering::Release);
        self.set::<u8>(Self::desc(head), 0);
        fence(Ordering::Release);
        self.set::<u16>(14, used_idx);
    }
}

/// The packed layout (see the module's description). Every index read from the area is checked
/// against the ring's size before it is used: the front end can write the area.
impl InflightQueue {
    fn pdesc(e: u16) -> usize {
        P_HEADER + P_DESC * e as usize
    }

    fn flag(&self, e: u16) -> u8 {
        self.get::<u8>(Self::pdesc(e) + E_INFLIGHT)
    }

    /// Makes the part ours, nothing in flight, the ring at `start`.
    fn reset_packed(&mut self, start: Pos) {
        for e in 0..self.size {
            let at = Self::pdesc(e);
            self.set::<u8>(at + E_INFLIGHT, 0);
            self.set::<u16>(at + E_NEXT, e + 1);
        }
        self.set::<u16>(P_DESC_NUM, self.size);
        self.set::<u16>(P_FREE, 0);
        self.set::<u16>(P_OLD_FREE, 0);
        self.set::<u16>(P_USED, start.index);
        self.set::<u16>(P_OLD_USED, start.index);
        self.set::<u8>(P_WRAP, start.wrap as u8);
        self.set::<u8>(P_OLD_WRAP, start.wrap as u8);
        fence(Ordering::Release);
        self.set::<u16>(P_VERSION, 1);
        (self.used, self.free, self.counter) = (start, 0, 0);
    }

    /// The used position the part says, given `used_flags(slot)` (the flags of the ring's
    /// descriptor in `slot` now). None if the part is inconsistent.
    fn recovered_used(&self, mut used_flags: impl FnMut(u16) -> Option<u16>) -> Option<Pos> {
        let cur = Pos { index: self.get::<u16>(P_USED), wrap: self.get::<u8>(P_WRAP) != 0 };
        let old = Pos { index: self.get::<u16>(P_OLD_USED), wrap: self.get::<u8>(P_OLD_WRAP) != 0 };
        if cur.index >= self.size || old.index >= self.size {
            return None;
        }
        if cur == old {
            return Some(old);
        }
        // Killed while completing the entry at `free_head`: done if its mark was cleared or its
        // used descriptor reached the ring (the slot's USED flag equal to the wrap counter: an
        // available descriptor there has the inverse, and a driver that went on to reuse the
        // slot wrote the next lap's inverse, which is the same).
        let h = self.get::<u16>(P_FREE);
        let done = h < self.size
            && (self.flag(h) == 0 || used_flags(old.index).is_some_and(|f| (f & DESC_F_USED != 0) == old.wrap));
        if done {
            self.set::<u8>(Self::pdesc(h) + E_INFLIGHT, 0);
            Some(cur)
        } else {
            Some(old)
        }
    }

    /// After a restart: where the used position is and which requests were taken and not
    /// completed (in the order taken), given the ring's position from SET_VRING_BASE (`start`:
    /// used only by a fresh or inconsistent part, which is made ours there) and the ring's
    /// flags (`used_flags`, see above). The free list is rebuilt from what is not in flight.
    pub fn recover_packed(&mut self, start: Pos, used_flags: impl FnMut(u16) -> Option<u16>) -> PackedRecovery {
        debug_assert!(self.packed, "the packed layout's recovery on a split queue");
        let size = self.size;
        let fresh = self.get::<u16>(P_VERSION) != 1 || self.get::<u16>(P_DESC_NUM) != size;
        let used = if fresh { None } else { self.recovered_used(used_flags) };
        let Some(used) = used else {
            if !fresh {
                log::warn!("vhost inflight area: a packed queue's part is inconsistent; started afresh");
            }
            self.reset_packed(start);
            return PackedRecovery { used: start, entries: Vec::new(), in_flight: 0 };
        };
        let mut claimed = vec![false; size as usize];
        let mut found: Vec<(u64, u16)> = Vec::new();
        let mut in_flight = 0u32;
        let mut chain = Vec::new();
        for h in 0..size {
            if self.flag(h) != 1 || claimed[h as usize] {
                continue;
            }
            let at = Self::pdesc(h);
            let (num, last) = (self.get::<u16>(at + E_NUM), self.get::<u16>(at + E_LAST));
            chain.clear();
            let mut e = h;
            let whole = num >= 1 && num <= size && {
                let mut ok = true;
                for i in 0..num {
                    if e >= size || claimed[e as usize] || chain.contains(&e) {
                        ok = false;
                        break;
                    }
                    chain.push(e);
                    if i + 1 < num {
                        e = self.get::<u16>(Self::pdesc(e) + E_NEXT);
                    }
                }
                ok && e == last
            };
            if !whole {
                log::warn!("vhost inflight area: entry {h} of a packed queue is not a whole chain; dropped");
                self.set::<u8>(at + E_INFLIGHT, 0);
                continue;
            }
            for &c in &chain {
                claimed[c as usize] = true;
            }
            in_flight += num as u32;
            found.push((self.get::<u64>(at + E_COUNTER), h));
        }
        debug_assert!(in_flight <= size as u32, "distinct entries of a ring's size");
        found.sort_unstable();
        self.counter = found.last().map_or(0, |&(c, _)| c);
        // The free list: every entry not in flight, in order.
        let mut free = size;
        for e in (0..size).rev() {
            if !claimed[e as usize] {
                let at = Self::pdesc(e);
                self.set::<u8>(at + E_INFLIGHT, 0);
                self.set::<u16>(at + E_NEXT, free);
                free = e;
            }
        }
        self.set::<u16>(P_FREE, free);
        self.set::<u16>(P_OLD_FREE, free);
        self.set::<u16>(P_USED, used.index);
        self.set::<u16>(P_OLD_USED, used.index);
        self.set::<u8>(P_WRAP, used.wrap as u8);
        self.set::<u8>(P_OLD_WRAP, used.wrap as u8);
        fence(Ordering::Release);
        (self.used, self.free) = (used, free);
        PackedRecovery { used, entries: found.into_iter().map(|(_, h)| h).collect(), in_flight: in_flight as u16 }
    }

    /// After a restart: the ring descriptors recorded for in-flight `entry` (16 bytes each in
    /// the packed ring's format) and its buffer id; None if the entry is not a whole chain.
    pub fn packed_chain(&self, entry: u16) -> Option<(Vec<[u8; 16]>, u16)> {
        if entry >= self.size || self.flag(entry) != 1 {
            return None;
        }
        let num = self.get::<u16>(Self::pdesc(entry) + E_NUM);
        if num == 0 || num > self.size {
            return None;
        }
        let mut out = Vec::with_capacity(num as usize);
        let (mut e, mut id) = (entry, 0);
        for i in 0..num {
            if e >= self.size {
                return None;
            }
            let at = Self::pdesc(e);
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&self.get::<u64>(at + E_ADDR).to_le_bytes());
            d[8..12].copy_from_slice(&self.get::<u32>(at + E_LEN).to_le_bytes());
            id = self.get::<u16>(at + E_ID);
            d[12..14].copy_from_slice(&id.to_le_bytes());
            d[14..16].copy_from_slice(&self.get::<u16>(at + E_FLAGS).to_le_bytes());
            out.push(d);
            if i + 1 < num {
                e = self.get::<u16>(at + E_NEXT);
            }
        }
        Some((out, id))
    }

    /// A chain of `count` ring descriptors was taken (`desc(i)`: the i-th, 16 bytes in the
    /// packed ring's format): copies them into entries off the free list and marks the first
    /// in flight. Returns that entry (for [`InflightQueue::completing_packed`]), or None if the
    /// free list ran out (the area was written by someone else; the request is not kept).
    #[inline]
    pub fn begin_packed(&mut self, count: u16, mut desc: impl FnMut(u16) -> [u8; 16]) -> Option<u16> {
        debug_assert!(self.packed);
        let head = self.free;
        let (mut e, mut last) = (head, head);
        for i in 0..count {
            if e >= self.size {
                return None;
            }
            let raw = desc(i);
            let at = Self::pdesc(e);
            self.set::<u64>(at + E_ADDR, u64::from_le_bytes(raw[0..8].try_into().unwrap()));
            self.set::<u32>(at + E_LEN, u32::from_le_bytes(raw[8..12].try_into().unwrap()));
            self.set::<u16>(at + E_ID, u16::from_le_bytes([raw[12], raw[13]]));
            self.set::<u16>(at + E_FLAGS, u16::from_le_bytes([raw[14], raw[15]]));
            last = e;
            e = self.get::<u16>(at + E_NEXT);
        }
        if count == 0 || head >= self.size {
            return None;
        }
        self.counter += 1;
        let at = Self::pdesc(head);
        self.set::<u16>(at + E_LAST, last);
        self.set::<u16>(at + E_NUM, count);
        self.set::<u64>(at + E_COUNTER, self.counter);
        // The copies before the mark, the mark before the free list moves past them.
        fence(Ordering::Release);
        self.set::<u8>(at + E_INFLIGHT, 1);
        fence(Ordering::Release);
        self.free = e;
        self.set::<u16>(P_FREE, e);
        self.set::<u16>(P_OLD_FREE, e);
        Some(head)
    }

    /// The request of `entry` (a chain of `count` descriptors) is about to go on the used ring:
    /// its entries back on the free list, the used position `count` on.
    #[inline]
    pub fn completing_packed(&mut self, entry: u16, count: u16) {
        debug_assert!(self.packed);
        if entry >= self.size {
            return;
        }
        let last = self.get::<u16>(Self::pdesc(entry) + E_LAST);
        if last < self.size {
            self.set::<u16>(Self::pdesc(last) + E_NEXT, self.free);
            self.free = entry;
        }
        self.used = self.used.advance(count.min(self.size), self.size);
        self.set::<u16>(P_FREE, self.free);
        self.set::<u16>(P_USED, self.used.index);
        self.set::<u8>(P_WRAP, self.used.wrap as u8);
        fence(Ordering::Release);
    }

    /// The request of `entry` is on the used ring.
    #[inline]
    pub fn completed_packed(&self, entry: u16) {
        debug_assert!(self.packed);
        if entry >= self.size {
            return;
        }
        fence(Ordering::SeqCst);
        self.set::<u8>(Self::pdesc(entry) + E_INFLIGHT, 0);
        fence(Ordering::SeqCst);
        self.set::<u16>(P_OLD_FREE, self.free);
        self.set::<u16>(P_OLD_USED, self.used.index);
        self.set::<u8>(P_OLD_WRAP, self.used.wrap as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::DESC_F_AVAIL as DESC_F_AVAIL_BIT;

    const NO_SUCH_ENTRY: u16 = u16::MAX;

    #[test]
    fn a_restart_finds_what_was_taken_and_not_completed_in_order() {
        let (area, file) = InflightArea::create(2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        assert!(q.recover(0).is_empty(), "a fresh area has nothing in flight");
        for h in [5, 2, 7, 0] {
            q.begin(h);
        }
        // 2 completes whole; 7 is on the used ring (index 2) when the daemon dies.
        q.completing(2);
        q.completed(2, 1);
        q.completing(7);
        drop(q);
        drop(area);
        // The next daemon maps the same file.
        let area = InflightArea::open(&file, 0, file.metadata().unwrap().len(), 2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        assert_eq!(q.recover(2), vec![5, 0], "7 completed (used ring ahead), 2 completed; 5 then 0 remain, in order");
        assert!(area.queue(0, 8).unwrap().recover(0).is_empty(), "the other queue had none");
        assert!(area.queue(2, 8).is_none() && area.queue(0, 16).is_none(), "no part for another shape");
        q.begin(3);
        assert_eq!(q.recover(2), vec![5, 0, 3], "counting goes on after the recovered ones");
    }

    /// A packed descriptor as the ring holds it.
    fn pd(addr: u64, len: u32, id: u16, flags: u16) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&id.to_le_bytes());
        d[14..16].copy_from_slice(&flags.to_le_bytes());
        d
    }

    /// Three chains taken at slot 3 of lap 1 in a ring of 8 (2, 1 and 3 descriptors, ids 5, 2
    /// and 0); the second completes; the third is completing when the daemon dies.
    fn packed_run(area: &Arc<InflightArea>) -> [u16; 3] {
        let mut q = area.queue(1, 8).unwrap();
        let start = Pos { index: 3, wrap: true };
        assert_eq!(q.recover_packed(start, |_| None), PackedRecovery { used: start, entries: vec![], in_flight: 0 });
        let a = q.begin_packed(2, |i| pd(0x1000 + i as u64, 16, 5, 0)).unwrap();
        let b = q.begin_packed(1, |_| pd(0x2000, 16, 2, 0)).unwrap();
        let c = q.begin_packed(3, |i| pd(0x3000 + i as u64, 16, 0, 0)).unwrap();
        q.completing_packed(b, 1);
        q.completed_packed(b);
        q.completing_packed(c, 3);
        [a, b, c]
    }

    #[test]
    fn a_packed_restart_finds_the_used_position_and_what_was_in_flight() {
        // Killed before the used descriptor reached the ring (its slot, 4, still available).
        let (area, file) = InflightArea::create_packed(2, 8).unwrap();
        let [a, _, c] = packed_run(&area);
        drop(area);
        let area = InflightArea::open_packed(&file, 0, file.metadata().unwrap().len(), 2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        let avail_in_lap_1 = DESC_F_AVAIL_BIT;
        let r = q.recover_packed(Pos::START, |slot| (slot == 4).then_some(avail_in_lap_1));
        assert_eq!(r.used, Pos { index: 4, wrap: true }, "the one completion moved it on by 1");
        assert_eq!(r.entries, vec![a, c], "the unfinished completion goes again, in the order taken");
        assert_eq!(r.in_flight, 5);
        let (chain, id) = q.packed_chain(a).unwrap();
        assert_eq!((chain, id), (vec![pd(0x1000, 16, 5, 0), pd(0x1001, 16, 5, 0)], 5));
        assert_eq!(q.packed_chain(c).unwrap().0.len(), 3);
        // New requests take free entries and count on; what was recovered completes as usual.
        let d = q.begin_packed(1, |_| pd(0x4000, 16, 7, 0)).unwrap();
        assert!(![a, c].contains(&d), "entries in flight are not on the free list");
        q.completing_packed(a, 2);
        q.completed_packed(a);
        let r = q.recover_packed(Pos::START, |_| None);
        assert_eq!(r.entries, vec![c, d]);
        assert_eq!((r.used, r.in_flight), (Pos { index: 6, wrap: true }, 4));

        // Killed after the used descriptor reached the ring: the completion stands.
        let (area, file) = InflightArea::create_packed(2, 8).unwrap();
        let [a, _, _] = packed_run(&area);
        drop(area);
        let area = InflightArea::open_packed(&file, 0, file.metadata().unwrap().len(), 2, 8).unwrap();
        let mut q = area.queue(1, 8).unwrap();
        let used_in_lap_1 = DESC_F_AVAIL_BIT | DESC_F_USED;
        let r = q.recover_packed(Pos::START, |slot| (slot == 4).then_some(used_in_lap_1));
        assert_eq!((r.used, r.entries, r.in_flight), (Pos { index: 7, wrap: true }, vec![a], 2));
        assert!(area.queue(0, 8).unwrap().recover_packed(Pos::START, |_| None).entries.is_empty(), "the other queue");
    }

    #[test]
    fn a_packed_part_written_by_someone_else_is_checked_not_trusted() {
        let (area, _file) = InflightArea::create_packed(1, 8).unwrap();
        let mut q = area.queue(0, 8).unwrap();
        q.recover_packed(Pos::START, |_| None);
        let e = q.begin_packed(2, |_| pd(0x1000, 16, 1, 0)).unwrap();
        // A chain link out of the ring, a count of zero, a used index past the ring.
        q.set::<u16>(InflightQueue::pdesc(e) + E_NEXT, 900);
        assert!(q.recover_packed(Pos::START, |_| None).entries.is_empty(), "a broken chain is dropped");
        let e = q.begin_packed(1, |_| pd(0x1000, 16, 1, 0)).unwrap();
        q.set::<u16>(InflightQueue::pdesc(e) + E_NUM, 0);
        assert!(q.recover_packed(Pos::START, |_| None).entries.is_empty(), "a chain of nothing is dropped");
        q.begin_packed(1, |_| pd(0x1000, 16, 1, 0)).unwrap();
        q.set::<u16>(P_USED, 8);
        q.set::<u16>(P_OLD_USED, 8);
        let start = Pos { index: 2, wrap: false };
        assert_eq!(q.recover_packed(start, |_| None), PackedRecovery { used: start, entries: vec![], in_flight: 0 });
        // The free list itself scribbled over: a request is not kept, and nothing breaks.
        q.set::<u16>(InflightQueue::pdesc(0) + E_NEXT, 4000);
        q.begin_packed(1, |_| pd(0x1000, 16, 1, 0)).unwrap();
        assert_eq!(q.begin_packed(1, |_| pd(0x1000, 16, 1, 0)), None, "no free entry past a link out of the ring");
        q.completing_packed(NO_SUCH_ENTRY, 1);
        q.completed_packed(NO_SUCH_ENTRY);
        assert!(InflightArea::create_packed(1, 6).is_ok(), "packed rings need not be powers of two");
        assert!(InflightArea::create_packed(1, 0).is_err());
        assert_eq!(queue_stride_packed(8), 320, "DPDK's size: 32 * 8 + 29, 64-byte aligned");
        assert_eq!(queue_stride_packed(1), 64);
    }

    #[test]
    fn refuses_bad_shapes_and_short_files() {
        assert!(InflightArea::create(0, 8).is_err());
        assert!(InflightArea::create(1, 6).is_err());
        let (_, file) = InflightArea::create(1, 8).unwrap();
        assert!(InflightArea::open(&file, 0, 1 << 20, 4, 8).is_err(), "file shorter than 4 queues");
        assert!(InflightArea::open(&file, 0, 8, 1, 8).is_err(), "size smaller than the shape");
        assert!(InflightArea::open(&file, 1, 4096, 1, 8).is_err(), "unaligned offset");
    }
}
