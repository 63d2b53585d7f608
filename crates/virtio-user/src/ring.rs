//! The driver side of one split virtqueue (virtio 1.x, 2.6): descriptor table, available ring
//! and used ring in memory the device also maps. This process writes descriptors and the
//! available ring and reads the used ring; the device does the opposite. Indexes shared with
//! the device are read and written as atomics (the device is another process on another core),
//! with the orderings the virtio spec asks of a driver.

use std::sync::atomic::{fence, AtomicU16, Ordering};
use virtio_bindings::virtio_ring::{VRING_AVAIL_F_NO_INTERRUPT, VRING_USED_F_NO_NOTIFY};

/// One descriptor of the table (virtio's `struct virtq_desc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Device address of the buffer.
    pub addr: u64,
    /// Length of the buffer in bytes.
    pub len: u32,
    /// `VRING_DESC_F_NEXT`, `VRING_DESC_F_WRITE`.
    pub flags: u16,
    /// The next descriptor of the chain, if `flags` has `NEXT`.
    pub next: u16,
}

/// Where the three parts of a ring of `size` entries lie, as offsets from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Descriptor table (16 bytes per entry, 16-aligned).
    pub desc: usize,
    /// Available ring: flags, idx, ring[size], used_event (2-aligned).
    pub avail: usize,
    /// Used ring: flags, idx, ring[size] of (id, len), avail_event (4-aligned).
    pub used: usize,
    /// Bytes the whole ring takes.
    pub bytes: usize,
}

impl RingLayout {
    /// The layout of a ring of `size` entries.
    pub fn of(size: u16) -> RingLayout {
        let n = size as usize;
        let avail = 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        RingLayout { desc: 0, avail, used, bytes: used + 6 + 8 * n }
    }
}

/// True if a device that last saw `old` and now published `new` must notify the other side,
/// which asked to be told once `event` is passed (virtio's `vring_need_event`).
#[inline]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The driver's view of one split ring.
pub struct SplitRing {
    size: u16,
    desc: *mut Desc,
    avail: *mut u16,
    used: *mut u8,
    /// The next available index this driver publishes.
    next_avail: u16,
    /// The used index up to which this driver has taken completions.
    last_used: u16,
    /// VIRTIO_RING_F_EVENT_IDX was negotiated.
    event_idx: bool,
    /// The device was asked to signal the call eventfd on completions.
    notify_on: bool,
}

// SAFETY: the ring's memory belongs to the shared region its device owns; a ring is used by one
// core at a time (it moves between cores only inside a Mutex, see `crate::bdev`).
unsafe impl Send for SplitRing {}

impl SplitRing {
    /// A driver for the ring of `size` entries (a power of two) at `base`, laid out as
    /// [`RingLayout::of`] says, in zeroed memory; completions are not signalled at first.
    ///
    /// # Safety
    /// `base` must point to `RingLayout::of(size).bytes` bytes of zeroed memory, 16-aligned,
    /// that outlive the ring and that nothing but this ring and its device touches.
    pub unsafe fn new(base: *mut u8, size: u16, event_idx: bool) -> SplitRing {
        debug_assert!(size.is_power_of_two(), "split rings have a power-of-two size");
        debug_assert_eq!(base as usize % 16, 0, "the descriptor table is 16-aligned");
        let l = RingLayout::of(size);
        let mut ring = SplitRing {
            size,
            // SAFETY (all three): offsets within the ring's memory, as the caller promised.
            desc: unsafe { base.add(l.desc) }.cast(),
            avail: unsafe { base.add(l.avail) }.cast(),
            used: unsafe { base.add(l.used) },
            next_avail: 0,
            last_used: 0,
            event_idx,
            notify_on: true,
        };
        ring.set_notify(false);
        ring
    }

    /// Entries in the ring.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Start of the descriptor table, available ring and used ring.
    pub fn addrs(&self) -> (*const u8, *const u8, *const u8) {
        (self.desc as *const u8, self.avail as *const u8, self.used as *const u8)
    }

    fn avail_word(&self, i: usize) -> &AtomicU16 {
        // SAFETY: words 0 (flags), 1 (idx), 2..2+size (ring) and 2+size (used_event) of the
        // available ring, 2-aligned; shared with the device, hence atomic.
        unsafe { AtomicU16::from_ptr(self.avail.add(i)) }
    }

    fn used_word(&self, byte: usize) -> &AtomicU16 {
        // SAFETY: a 2-aligned u16 of the used ring (flags at 0, idx at 2, avail_event after
        // the entries); shared with the device, hence atomic.
        unsafe { AtomicU16::from_ptr(self.used.add(byte).cast()) }
    }

    /// Writes descriptor `i`. The device reads it only once a chain holding it is published.
    #[inline]
    pub fn set_desc(&mut self, i: u16, d: Desc) {
        debug_assert!(i < self.size, "descriptor {i} is outside a ring of {}", self.size);
        // SAFETY: entry i of the table; the device does not read it while no published and
        // unused chain holds it, which the caller (owner of its chain) guarantees.
        unsafe { self.desc.add(i as usize).write_volatile(d) };
    }

    /// Publishes the chain starting at `head`; returns true if the device asked to be kicked
    /// for it (EVENT_IDX's avail_event, or the used ring's NO_NOTIFY flag cleared).
    #[inline]
    pub fn publish(&mut self, head: u16) -> bool {
        let old = self.next_avail;
        let slot = 2 + (old & (self.size - 1)) as usize;
        self.avail_word(slot).store(head, Ordering::Relaxed);
        self.next_avail = old.wrapping_add(1);
        // The descriptors and the entry are visible before the index that publishes them.
        self.avail_word(1).store(self.next_avail, Ordering::Release);
        // The index is visible before the device's wish is read (it may have just gone idle).
        fence(Ordering::SeqCst);
        if self.event_idx {
            let avail_event = self.used_word(4 + 8 * self.size as usize).load(Ordering::Acquire);
            need_event(avail_event, self.next_avail, old)
        } else {
            self.used_word(0).load(Ordering::Acquire) & VRING_USED_F_NO_NOTIFY as u16 == 0
        }
    }

    /// The next completion (descriptor chain head and bytes written by the device), if any.
    #[inline]
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        let used_idx = self.used_word(2).load(Ordering::Acquire);
        if used_idx == self.last_used {
            return None;
        }
        let at = 4 + 8 * (self.last_used & (self.size - 1)) as usize;
        // SAFETY: entry `at` of the used ring (8-aligned id and len), which the device wrote
        // before publishing `used_idx` (the Acquire load above orders this read after it).
        let (id, len) = unsafe {
            let e = self.used.add(at).cast::<u32>();
            (e.read_volatile(), e.add(1).read_volatile())
        };
        self.last_used = self.last_used.wrapping_add(1);
        debug_assert!(id < self.size as u32, "the device completed descriptor {id} of a ring of {}", self.size);
        Some((id as u16, len))
    }

    /// True if a completion is waiting.
    #[inline]
    pub fn has_used(&self) -> bool {
        self.used_word(2).load(Ordering::Acquire) != self.last_used
    }

    /// True if the device is asked to signal completions.
    pub fn notify_on(&self) -> bool {
        self.notify_on
    }

    /// Asks the device to signal (or not) the call eventfd when it completes requests. Off,
    /// with EVENT_IDX, the event index is moved half the index space ahead of the completions
    /// taken, so call [`SplitRing::keep_quiet`] as they are taken.
    pub fn set_notify(&mut self, on: bool) {
        self.notify_on = on;
        if self.event_idx {
            let event = if on { self.last_used } else { self.last_used.wrapping_add(0x7fff) };
            self.avail_word(2 + self.size as usize).store(event, Ordering::Relaxed);
        } else {
            let flags = if on { 0 } else { VRING_AVAIL_F_NO_INTERRUPT as u16 };
            self.avail_word(0).store(flags, Ordering::Relaxed);
        }
        // The wish is visible before the used ring is checked again by the caller.
        fence(Ordering::SeqCst);
    }

    /// Keeps the device quiet while notifications are off (EVENT_IDX: the event index moves
    /// with the completions taken; without it the flag already says so).
    #[inline]
    pub fn keep_quiet(&mut self) {
        debug_assert!(!self.notify_on, "keep_quiet is for rings whose notifications are off");
        if self.event_idx {
            self.avail_word(2 + self.size as usize).store(self.last_used.wrapping_add(0x7fff), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_the_spec_alignment() {
        let l = RingLayout::of(256);
        assert_eq!((l.desc, l.avail), (0, 4096));
        assert_eq!(l.used, (4096 + 6 + 512usize).next_multiple_of(4));
        assert_eq!(l.bytes, l.used + 6 + 8 * 256);
    }

    #[test]
    fn need_event_matches_the_virtio_definition() {
        // The device asked to be told at index 5: publishing 5 -> 6 crosses it, 6 -> 7 not.
        assert!(need_event(5, 6, 5));
        assert!(!need_event(5, 7, 6));
        // A batch 3 -> 9 crosses 5.
        assert!(need_event(5, 9, 3));
        // Across the wrap of the 16-bit index.
        assert!(need_event(0xffff, 2, 0xfffe));
        assert!(!need_event(0x7fff, 10, 9));
    }

    /// A device played by the test: it takes published chains and completes them.
    #[test]
    fn publish_and_complete_round_trip() {
        let size = 8u16;
        let l = RingLayout::of(size);
        let mut mem = vec![0u128; l.bytes.div_ceil(16)];
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: zeroed, 16-aligned, large enough, owned by the test.
        let mut ring = unsafe { SplitRing::new(base, size, false) };
        ring.set_desc(3, Desc { addr: 0x1000, len: 16, flags: 0, next: 0 });
        // The device has not set NO_NOTIFY: it wants a kick.
        assert!(ring.publish(3));
        // SAFETY: the test reads and writes the rings as the device would.
        unsafe {
            let avail = base.add(l.avail).cast::<u16>();
            assert_eq!((avail.add(1).read(), avail.add(2).read()), (1, 3), "avail idx and entry");
            assert_eq!(avail.read(), VRING_AVAIL_F_NO_INTERRUPT as u16, "completions are not signalled");
            let used = base.add(l.used);
            used.cast::<u16>().write(VRING_USED_F_NO_NOTIFY as u16);
            used.add(4).cast::<u32>().write(3);
            used.add(8).cast::<u32>().write(1);
            assert!(!ring.has_used(), "nothing is used before the device moves its index");
            used.add(2).cast::<u16>().write(1);
        }
        assert_eq!(ring.pop_used(), Some((3, 1)));
        assert_eq!(ring.pop_used(), None);
        assert!(!ring.publish(3), "a device that set NO_NOTIFY is not kicked");
    }
}
