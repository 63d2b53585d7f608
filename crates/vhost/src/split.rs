//! The device side of a split virtqueue (VIRTIO 1.2, 2.7), read and written through pointers
//! into the mapped guest memory. `virtio-queue` does the same through vm-memory's per-access
//! iterator, which cost 22% of a target reactor's time at QD 128 (profile in
//! docs/perf-log/2026-11-29-vhost.md); here a request costs two loads from the available ring
//! and two stores to the used ring.
//!
//! ```text
//! available ring (driver -> device): u16 flags, u16 idx, u16 ring[size], u16 used_event
//! used ring (device -> driver):      u16 flags, u16 idx, {u32 id, u32 len} ring[size], u16 avail_event
//! ```
//! Indexes run free (wrapping u16); an entry sits at `idx % size`. Each ring must lie inside one
//! memory region (checked when the ring is set up); the mapping stays alive while the ring does.

use crate::memory::Memory;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::sync::Arc;

/// The available ring's flag: the driver wants no signal.
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// The used ring's flag: the device wants no kick.
const USED_F_NO_NOTIFY: u16 = 1;

/// Why a ring cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// Size 0, not a power of two, or over 32768.
    Size(u16),
    /// A ring is not in one region of guest memory, or misaligned.
    Placement(&'static str),
    /// The driver's available index runs more than the ring ahead of the device.
    AvailIndex {
        /// The driver's index.
        avail: u16,
        /// Where the device is.
        next: u16,
    },
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Size(s) => write!(f, "ring size {s}"),
            RingError::Placement(what) => write!(f, "the {what} is not in guest memory (in one region, aligned)"),
            RingError::AvailIndex { avail, next } => {
                write!(f, "available index {avail} runs more than the ring ahead of {next}")
            }
        }
    }
}

/// A split ring's device side.
pub struct SplitRing {
    avail: NonNull<u8>,
    used: NonNull<u8>,
    size: u16,
    next_avail: u16,
    next_used: u16,
    event_idx: bool,
    /// The used index when the driver was last signalled (EVENT_IDX).
    signalled_used: u16,
    /// Keeps the mapping alive.
    _mem: Arc<Memory>,
}

/// The host address of guest-physical `[gpa, gpa + len)`, which must be `align`-aligned and lie
/// in one memory region (a ring's placement rule; packed rings use it too).
pub(crate) fn host(mem: &Memory, gpa: u64, len: u64, align: u64, what: &'static str) -> Result<NonNull<u8>, RingError> {
    if !gpa.is_multiple_of(align) {
        return Err(RingError::Placement(what));
    }
    let mut first = None;
    let mut pieces = 0;
    let whole = mem.host_pieces(gpa, len, |p, _| {
        pieces += 1;
        first.get_or_insert(p);
    });
    match (whole, pieces, first) {
        (true, 1, Some(p)) => Ok(p),
        _ => Err(RingError::Placement(what)),
    }
}

impl SplitRing {
    /// The rings at guest-physical `avail` and `used` of `size` entries in `mem`, the device
    /// taking from `next_avail` and completing from `next_used`.
    pub fn new(
        mem: Arc<Memory>,
        size: u16,
        avail: u64,
        used: u64,
        next_avail: u16,
        next_used: u16,
        event_idx: bool,
    ) -> Result<SplitRing, RingError> {
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(RingError::Size(size));
        }
        let n = size as u64;
        let avail_p = host(&mem, avail, 6 + 2 * n, 2, "available ring")?;
        let used_p = host(&mem, used, 6 + 8 * n, 4, "used ring")?;
        Ok(SplitRing {
            avail: avail_p,
            used: used_p,
            size,
            next_avail,
            next_used,
            event_idx,
            signalled_used: next_used,
            _mem: mem,
        })
    }

    fn u16_at(base: NonNull<u8>, off: usize) -> &'static AtomicU16 {
        // SAFETY: `off` lies inside a ring checked to be in the mapping (kept alive by `_mem`
        // for as long as the ring, which never hands the reference out), 2-byte aligned.
        unsafe { &*(base.as_ptr().add(off) as *const AtomicU16) }
    }

    /// Ring size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The next available entry the device takes.
    pub fn next_avail(&self) -> u16 {
        self.next_avail
    }

    /// The next used entry the device fills (= the used index the driver sees).
    pub fn next_used(&self) -> u16 {
        self.next_used
    }

    /// Takes the head of the next available chain, if the driver made one available.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<u16>, RingError> {
        let avail = Self::u16_at(self.avail, 2).load(Ordering::Acquire);
        let pending = avail.wrapping_sub(self.next_avail);
        if pending == 0 {
            return Ok(None);
        }
        if pending > self.size {
            return Err(RingError::AvailIndex { avail, next: self.next_avail });
        }
        let slot = (self.next_avail % self.size) as usize;
        let head = u16::from_le(Self::u16_at(self.avail, 4 + 2 * slot).load(Ordering::Relaxed));
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(Some(head))
    }

    /// Puts chain `head` on the used ring, `len` bytes written to the driver's buffers.
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = (self.next_used % self.size) as usize;
        // SAFETY: the entry lies inside the used ring (checked at setup), 4-byte aligned.
        unsafe {
            let e = self.used.as_ptr().add(4 + 8 * slot) as *mut u32;
            std::ptr::write_volatile(e, (head as u32).to_le());
            std::ptr::write_volatile(e.add(1), len.to_le());
        }
        self.next_used = self.next_used.wrapping_add(1);
        // The entry before the index (the driver reads the index, then the entry).
        Self::u16_at(self.used, 2).store(self.next_used.to_le(), Ordering::Release);
    }

    /// Whether the driver wants a signal for the entries used since the last signal:
    /// EVENT_IDX's used_event, else the available ring's NO_INTERRUPT flag. Call it once the
    /// batch is on the ring; a true answer counts as signalled.
    pub fn needs_signal(&mut self) -> bool {
        fence(Ordering::SeqCst);
        let new = self.next_used;
        let want = if self.event_idx {
            let used_event = u16::from_le(Self::u16_at(self.avail, 4 + 2 * self.size as usize).load(Ordering::Relaxed));
            // vring_need_event: used_event lies in [old, new).
            new.wrapping_sub(used_event).wrapping_sub(1) < new.wrapping_sub(self.signalled_used)
        } else {
            u16::from_le(Self::u16_at(self.avail, 0).load(Ordering::Relaxed)) & AVAIL_F_NO_INTERRUPT == 0
        };
        self.signalled_used = new;
        want
    }

    /// Tells the driver not to kick (the device polls).
    pub fn disable_kicks(&mut self) {
        if !self.event_idx {
            Self::u16_at(self.used, 0).store(USED_F_NO_NOTIFY.to_le(), Ordering::Relaxed);
        }
        // With EVENT_IDX, an avail_event left behind the driver asks for no more kicks.
    }

    /// Asks the driver to kick for what it makes available next; true if something became
    /// available meanwhile (look again before sleeping on the kick).
    pub fn enable_kicks(&mut self) -> bool {
        if self.event_idx {
            let off = 4 + 8 * self.size as usize;
            Self::u16_at(self.used, off).store(self.next_avail.to_le(), Ordering::Relaxed);
        } else {
            Self::u16_at(self.used, 0).store(0, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        Self::u16_at(self.avail, 2).load(Ordering::Acquire) != self.next_avail
    }

    /// The used index as the driver sees it now.
    pub fn used_idx(&self) -> u16 {
        u16::from_le(Self::u16_at(self.used, 2).load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vhost::vhost_user::message::VhostUserMemoryRegion;

    fn mem() -> Arc<Memory> {
        // SAFETY: a fresh memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"split-test".as_ptr(), 0) };
        let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.write_all(&vec![0u8; 0x10000]).unwrap();
        Arc::new(Memory::map(&[VhostUserMemoryRegion::new(0, 0x10000, 0, 0)], vec![f]).unwrap())
    }

    fn put16(m: &Memory, at: u64, v: u16) {
        let mut done = false;
        m.host_pieces(at, 2, |p, _| {
            unsafe { std::ptr::write_unaligned(p.as_ptr() as *mut u16, v.to_le()) };
            done = true;
        });
        assert!(done);
    }

    fn get(m: &Memory, at: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        assert!(m.read(at, &mut b));
        b
    }

    #[test]
    fn pops_heads_in_order_wraps_and_refuses_a_runaway_index() {
        let m = mem();
        let mut r = SplitRing::new(m.clone(), 4, 0x1000, 0x2000, 0xfffe, 0, false).unwrap();
        // The driver makes heads 7 and 9 available at entries 0xfffe, 0xffff (slots 2, 3).
        put16(&m, 0x1000 + 4 + 2 * 2, 7);
        put16(&m, 0x1000 + 4 + 2 * 3, 9);
        put16(&m, 0x1002, 0);
        assert_eq!(r.pop(), Ok(Some(7)));
        assert_eq!(r.pop(), Ok(Some(9)));
        assert_eq!(r.pop(), Ok(None));
        assert_eq!(r.next_avail(), 0, "wrapped");
        put16(&m, 0x1002, 5);
        assert_eq!(r.pop(), Err(RingError::AvailIndex { avail: 5, next: 0 }), "5 ahead of a ring of 4");
    }

    #[test]
    fn used_entries_then_index_and_signals_by_event_idx() {
        let m = mem();
        let mut r = SplitRing::new(m.clone(), 4, 0x1000, 0x2000, 0, 0, true).unwrap();
        r.push_used(3, 513);
        assert_eq!(get(&m, 0x2004, 8), [3, 0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(r.used_idx(), 1);
        // used_event 0: the driver wants a signal once entry 0 is used.
        put16(&m, 0x1000 + 4 + 2 * 4, 0);
        assert!(r.needs_signal());
        r.push_used(1, 1);
        assert!(!r.needs_signal(), "used_event 0 already passed");
        put16(&m, 0x1000 + 4 + 2 * 4, 2);
        r.push_used(2, 1);
        assert!(r.needs_signal(), "used_event 2 reached");
        // Kicks: avail_event follows the device.
        r.pop().unwrap();
        assert!(!r.enable_kicks());
        assert_eq!(get(&m, 0x2000 + 4 + 8 * 4, 2), [0, 0]);
    }

    #[test]
    fn without_event_idx_flags_say_it() {
        let m = mem();
        let mut r = SplitRing::new(m.clone(), 4, 0x1000, 0x2000, 0, 0, false).unwrap();
        r.push_used(0, 1);
        assert!(r.needs_signal());
        put16(&m, 0x1000, AVAIL_F_NO_INTERRUPT);
        assert!(!r.needs_signal(), "a polling driver wants no signal");
        r.disable_kicks();
        assert_eq!(get(&m, 0x2000, 2), [1, 0]);
        put16(&m, 0x1002, 1);
        assert!(r.enable_kicks(), "something arrived while kicks were off");
        assert_eq!(get(&m, 0x2000, 2), [0, 0]);
    }

    #[test]
    fn refuses_bad_sizes_and_rings_outside_or_across_regions() {
        let m = mem();
        assert_eq!(SplitRing::new(m.clone(), 0, 0x1000, 0x2000, 0, 0, false).err(), Some(RingError::Size(0)));
        assert_eq!(SplitRing::new(m.clone(), 6, 0x1000, 0x2000, 0, 0, false).err(), Some(RingError::Size(6)));
        assert!(SplitRing::new(m.clone(), 4, 0xfff8, 0x2000, 0, 0, false).is_err(), "runs past the memory");
        assert!(SplitRing::new(m.clone(), 4, 0x1001, 0x2000, 0, 0, false).is_err(), "misaligned");
        assert!(SplitRing::new(m, 4, 0x1000, 0x2002, 0, 0, false).is_err(), "used ring misaligned");
    }
}
