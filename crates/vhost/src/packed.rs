//! The device side of a packed virtqueue (VIRTIO 1.2, 2.8), read and written through pointers
//! into the mapped guest memory, as [`crate::split`] does for split rings.
//!
//! ```text
//! descriptor ring (both ways): {u64 addr, u32 len, u16 id, u16 flags} desc[size]
//! driver area (driver -> device): u16 off_wrap, u16 flags   when to signal the driver
//! device area (device -> driver): u16 off_wrap, u16 flags   when the driver should kick
//! ```
//! One ring carries both directions. The driver makes a descriptor available by setting its
//! AVAIL flag to its wrap counter and USED to the inverse; a chain is consecutive slots linked
//! by NEXT, its buffer id in the last one. The device takes chains in ring order from its
//! available position and writes one used descriptor per chain (id, length written, AVAIL =
//! USED = its wrap counter) at its used position, in the order they complete, then moves that
//! position on by the chain's descriptor count, so that, whatever the order of completions, the
//! used position catches up with the available one when nothing is in flight. Each wrap counter
//! starts at 1 and flips when its position passes the end of the ring.
//!
//! The ring must lie inside one memory region (checked when it is set up); the mapping stays
//! alive while the ring does. Everything read from the ring is the driver's word: a chain that
//! runs over the whole ring or takes more than the ring holds is an error, never a panic.

use crate::memory::Memory;
use crate::split::RingError;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::sync::Arc;

/// Descriptor flag: the chain goes on in the next slot.
pub const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: device-writable (in a used descriptor: the device wrote data).
pub const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = 4;
/// Descriptor flag: available (equal to the driver's wrap counter).
pub const DESC_F_AVAIL: u16 = 1 << 7;
/// Descriptor flag: used (equal to the device's wrap counter).
pub const DESC_F_USED: u16 = 1 << 15;
/// Event suppression: notify on every event.
pub const EVENT_ENABLE: u16 = 0;
/// Event suppression: do not notify.
pub const EVENT_DISABLE: u16 = 1;
/// Event suppression: notify when the descriptor at `off_wrap` is made available / used
/// (EVENT_IDX only).
pub const EVENT_DESC: u16 = 2;

/// Largest packed ring (indexes have 15 bits).
pub const MAX_SIZE: u16 = 1 << 15;

/// A position in a packed ring: a slot and the wrap counter of the lap it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// Slot, below the ring's size.
    pub index: u16,
    /// Wrap counter of the lap.
    pub wrap: bool,
}

impl Pos {
    /// A fresh ring's start: slot 0, wrap counter 1.
    pub const START: Pos = Pos { index: 0, wrap: true };

    /// The vhost-user encoding: bits 0-14 the slot, bit 15 the wrap counter.
    pub fn decode(v: u16) -> Pos {
        Pos { index: v & 0x7fff, wrap: v & 0x8000 != 0 }
    }

    /// See [`Pos::decode`].
    pub fn encode(self) -> u16 {
        self.index | (self.wrap as u16) << 15
    }

    /// `n` slots on (n at most `size`) in a ring of `size`.
    pub fn advance(self, n: u16, size: u16) -> Pos {
        debug_assert!(n <= size && self.index < size, "{self:?} + {n} in a ring of {size}");
        let i = self.index as u32 + n as u32;
        if i >= size as u32 {
            Pos { index: (i - size as u32) as u16, wrap: !self.wrap }
        } else {
            Pos { index: i as u16, wrap: self.wrap }
        }
    }

    /// The position among the 2 * `size` that two laps hold (wrap 0 first, then wrap 1).
    fn linear(self, size: u16) -> u32 {
        self.index as u32 + if self.wrap { size as u32 } else { 0 }
    }

    /// Slots from `from` on to `self`, modulo two laps.
    fn since(self, from: Pos, size: u16) -> u32 {
        let two = 2 * size as u32;
        (self.linear(size) + two - from.linear(size) % two) % two
    }
}

/// Why the driver's ring cannot be served (the queue stops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedError {
    /// The chain starting at `at` sets NEXT on every slot of the ring.
    Chain {
        /// Its first slot.
        at: u16,
    },
    /// Taking the chain at `at` would have more descriptors in flight than the ring has
    /// (the driver reused slots it had not got back).
    Overrun {
        /// Its first slot.
        at: u16,
        /// Its descriptors.
        count: u16,
        /// Descriptors in flight already.
        in_flight: u16,
    },
}

impl std::fmt::Display for PackedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackedError::Chain { at } => write!(f, "the chain at slot {at} runs over the whole ring"),
            PackedError::Overrun { at, count, in_flight } => write!(
                f,
                "the chain of {count} at slot {at} with {in_flight} descriptors in flight is more than the ring holds"
            ),
        }
    }
}

/// A chain the driver made available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedAvail {
    /// Its first slot.
    pub slot: u16,
    /// Its descriptors in the ring (1 for an indirect one).
    pub count: u16,
    /// Its buffer id (from its last descriptor).
    pub id: u16,
}

/// A packed ring's device side.
pub struct PackedRing {
    desc: NonNull<u8>,
    driver: NonNull<u8>,
    device: NonNull<u8>,
    desc_gpa: u64,
    size: u16,
    /// Where the next chain is taken.
    avail: Pos,
    /// Where the next used descriptor goes.
    used: Pos,
    /// Descriptors taken and not yet used: `avail` is this far ahead of `used`.
    in_flight: u16,
    event_idx: bool,
    /// Slots the used position moved on since the driver was last considered for a signal.
    since_signal: u32,
    /// Keeps the mapping alive.
    _mem: Arc<Memory>,
}

impl PackedRing {
    /// The ring of `size` descriptors at guest-physical `desc`, with its driver and device
    /// event suppression areas at `driver` and `device`, the device taking chains from `avail`
    /// and writing used descriptors from `used` (the descriptors between are in flight).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mem: Arc<Memory>,
        size: u16,
        desc: u64,
        driver: u64,
        device: u64,
        avail: Pos,
        used: Pos,
        event_idx: bool,
    ) -> Result<PackedRing, RingError> {
        if size == 0 || size > MAX_SIZE {
            return Err(RingError::Size(size));
        }
        let in_flight = avail.since(used, size);
        if avail.index >= size || used.index >= size || in_flight > size as u32 {
            return Err(RingError::AvailIndex { avail: avail.encode(), next: used.encode() });
        }
        Ok(PackedRing {
            desc: crate::split::host(&mem, desc, 16 * size as u64, 16, "descriptor ring")?,
            driver: crate::split::host(&mem, driver, 4, 4, "driver area")?,
            device: crate::split::host(&mem, device, 4, 4, "device area")?,
            desc_gpa: desc,
            size,
            avail,
            used,
            in_flight: in_flight as u16,
            event_idx,
            since_signal: 0,
            _mem: mem,
        })
    }

    /// The same ring in another mapping of guest memory (a new memory table), where it left off.
    pub fn remap(&self, mem: Arc<Memory>, desc: u64, driver: u64, device: u64) -> Result<PackedRing, RingError> {
        let mut r = PackedRing::new(mem, self.size, desc, driver, device, self.avail, self.used, self.event_idx)?;
        r.since_signal = self.since_signal;
        Ok(r)
    }

    fn u16_at(base: NonNull<u8>, off: usize) -> &'static AtomicU16 {
        // SAFETY: `off` lies inside an area checked to be in the mapping (kept alive by `_mem`
        // for as long as the ring, which never hands the reference out), 2-byte aligned.
        unsafe { &*(base.as_ptr().add(off) as *const AtomicU16) }
    }

    fn flags(&self, slot: u16) -> &'static AtomicU16 {
        debug_assert!(slot < self.size);
        Self::u16_at(self.desc, 16 * slot as usize + 14)
    }

    /// Ring size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Where the next chain is taken.
    pub fn next_avail(&self) -> Pos {
        self.avail
    }

    /// Where the next used descriptor goes.
    pub fn next_used(&self) -> Pos {
        self.used
    }

    /// Descriptors taken and not yet used.
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// The 16 bytes of the descriptor in `slot` (below the size), as the ring holds them now.
    pub fn desc_at(&self, slot: u16) -> [u8; 16] {
        debug_assert!(slot < self.size);
        let mut b = [0u8; 16];
        // SAFETY: the slot lies inside the ring (checked at setup); the driver may write it
        // meanwhile, as it may under any device (the copy is what the device saw).
        unsafe { std::ptr::copy_nonoverlapping(self.desc.as_ptr().add(16 * slot as usize), b.as_mut_ptr(), 16) };
        b
    }

    fn is_avail(flags: u16, wrap: bool) -> bool {
        (flags & DESC_F_AVAIL != 0) == wrap && (flags & DESC_F_USED != 0) != wrap
    }

    /// Whether the driver made the descriptor at the available position available.
    fn ready(&self) -> bool {
        Self::is_avail(u16::from_le(self.flags(self.avail.index).load(Ordering::Acquire)), self.avail.wrap)
    }

    /// Takes the next chain, if the driver made one available: its slot, descriptor count and
    /// buffer id; the available position moves past it.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<PackedAvail>, PackedError> {
        let at = self.avail.index;
        // The first descriptor's flags are written last: the acquire orders the rest after.
        let mut flags = u16::from_le(self.flags(at).load(Ordering::Acquire));
        if !Self::is_avail(flags, self.avail.wrap) {
            return Ok(None);
        }
        let (mut count, mut last) = (1u16, at);
        while flags & DESC_F_NEXT != 0 {
            if count == self.size {
                return Err(PackedError::Chain { at });
            }
            last = if last + 1 == self.size { 0 } else { last + 1 };
            flags = u16::from_le(self.flags(last).load(Ordering::Relaxed));
            count += 1;
        }
        if self.in_flight as u32 + count as u32 > self.size as u32 {
            return Err(PackedError::Overrun { at, count, in_flight: self.in_flight });
        }
        let id = u16::from_le(Self::u16_at(self.desc, 16 * last as usize + 12).load(Ordering::Relaxed));
        self.avail = self.avail.advance(count, self.size);
        self.in_flight += count;
        debug_assert_eq!(self.avail.since(self.used, self.size), self.in_flight as u32);
        Ok(Some(PackedAvail { slot: at, count, id }))
    }

    /// Writes the used descriptor of buffer `id`, a chain of `count` descriptors of which the
    /// device wrote `len` bytes, at the used position, and moves that position on by `count`.
    /// The flags go last, with release ordering: the driver sees the id and length with them.
    /// Returns the guest-physical range written (for a dirty-page log).
    #[inline]
    pub fn push_used(&mut self, id: u16, len: u32, count: u16) -> (u64, u32) {
        debug_assert!(count >= 1 && count <= self.in_flight, "{count} used of {} in flight", self.in_flight);
        let slot = self.used.index as usize;
        // SAFETY: the descriptor lies inside the ring (checked at setup), 16-byte aligned.
        unsafe {
            let d = self.desc.as_ptr().add(16 * slot);
            std::ptr::write_volatile(d.add(8) as *mut u32, len.to_le());
            std::ptr::write_volatile(d.add(12) as *mut u16, id.to_le());
        }
        let mut flags = if self.used.wrap { DESC_F_AVAIL | DESC_F_USED } else { 0 };
        if len > 0 {
            flags |= DESC_F_WRITE;
        }
        Self::u16_at(self.desc, 16 * slot + 14).store(flags.to_le(), Ordering::Release);
        let count = count.clamp(1, self.in_flight.max(1));
        self.used = self.used.advance(count, self.size);
        self.in_flight -= count.min(self.in_flight);
        self.since_signal = self.since_signal.saturating_add(count as u32);
        debug_assert_eq!(self.avail.since(self.used, self.size), self.in_flight as u32);
        (self.desc_gpa + 16 * slot as u64, 16)
    }

    /// Whether the driver wants a signal for what was used since the last call (its event
    /// suppression flags: ENABLE, DISABLE, or with EVENT_IDX DESC: when the used descriptor at
    /// its offset and wrap counter was written). Call it once the batch is on the ring; a true
    /// answer counts as signalled.
    pub fn needs_signal(&mut self) -> bool {
        fence(Ordering::SeqCst);
        let span = std::mem::take(&mut self.since_signal);
        let flags = u16::from_le(Self::u16_at(self.driver, 2).load(Ordering::Relaxed)) & 3;
        match flags {
            EVENT_DISABLE => false,
            EVENT_DESC if self.event_idx => {
                let two = 2 * self.size as u32;
                if span >= two {
                    return true;
                }
                let off = Pos::decode(u16::from_le(Self::u16_at(self.driver, 0).load(Ordering::Relaxed)));
                // Written since the last call: the slots [used - span, used), over two laps.
                let event = off.index as u32 % self.size as u32 + if off.wrap { self.size as u32 } else { 0 };
                let old = (self.used.linear(self.size) + two - span) % two;
                (event + two - old) % two < span
            }
            // ENABLE, DESC without EVENT_IDX, and the reserved value: signal.
            _ => true,
        }
    }

    /// Tells the driver not to kick (the device polls).
    pub fn disable_kicks(&mut self) {
        Self::u16_at(self.device, 2).store(EVENT_DISABLE.to_le(), Ordering::Relaxed);
    }

    /// Asks the driver to kick for what it makes available next (with EVENT_IDX: once it makes
    /// the descriptor at the available position available); true if something became available
    /// meanwhile (look again before sleeping on the kick).
    pub fn enable_kicks(&mut self) -> bool {
        if self.event_idx {
            Self::u16_at(self.device, 0).store(self.avail.encode().to_le(), Ordering::Relaxed);
            Self::u16_at(self.device, 2).store(EVENT_DESC.to_le(), Ordering::Relaxed);
        } else {
            Self::u16_at(self.device, 2).store(EVENT_ENABLE.to_le(), Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        self.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vhost::vhost_user::message::VhostUserMemoryRegion;

    const DESC: u64 = 0x1000;
    const DRIVER: u64 = 0x3000;
    const DEVICE: u64 = 0x3004;

    fn mem() -> Arc<Memory> {
        // SAFETY: a fresh memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"packed-test".as_ptr(), 0) };
        let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.write_all(&vec![0u8; 0x10000]).unwrap();
        Arc::new(Memory::map(&[VhostUserMemoryRegion::new(0, 0x10000, 0, 0)], vec![f]).unwrap())
    }

    fn put(m: &Memory, at: u64, b: &[u8]) {
        assert!(m.write(at, b));
    }

    fn get(m: &Memory, at: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        assert!(m.read(at, &mut b));
        b
    }

    /// The driver's side: descriptors written in ring order with its wrap counter.
    struct Drv {
        m: Arc<Memory>,
        size: u16,
        at: Pos,
    }

    impl Drv {
        /// Makes a chain of `n` descriptors available with buffer id `id`.
        fn chain(&mut self, n: u16, id: u16) -> u16 {
            let first = self.at;
            let mut head_flags = 0;
            for i in 0..n {
                let mut f = if self.at.wrap { DESC_F_AVAIL } else { DESC_F_USED };
                if i + 1 < n {
                    f |= DESC_F_NEXT;
                }
                let d = DESC + 16 * self.at.index as u64;
                put(&self.m, d, &(0x8000u64 + i as u64).to_le_bytes());
                put(&self.m, d + 8, &16u32.to_le_bytes());
                put(&self.m, d + 12, &id.to_le_bytes());
                if i == 0 {
                    head_flags = f;
                } else {
                    put(&self.m, d + 14, &f.to_le_bytes());
                }
                self.at = self.at.advance(1, self.size);
            }
            put(&self.m, DESC + 16 * first.index as u64 + 14, &head_flags.to_le_bytes());
            first.index
        }
    }

    fn ring(size: u16, event_idx: bool) -> (Arc<Memory>, PackedRing, Drv) {
        let m = mem();
        let r = PackedRing::new(m.clone(), size, DESC, DRIVER, DEVICE, Pos::START, Pos::START, event_idx).unwrap();
        let d = Drv { m: m.clone(), size, at: Pos::START };
        (m, r, d)
    }

    #[test]
    fn positions_encode_advance_and_wrap() {
        assert_eq!(Pos::decode(0x8003), Pos { index: 3, wrap: true });
        assert_eq!(Pos { index: 5, wrap: false }.encode(), 5);
        assert_eq!(Pos { index: 3, wrap: true }.advance(2, 5), Pos { index: 0, wrap: false });
        assert_eq!(Pos { index: 3, wrap: true }.advance(1, 5), Pos { index: 4, wrap: true });
        assert_eq!(Pos { index: 1, wrap: false }.since(Pos { index: 3, wrap: true }, 5), 3);
        assert_eq!(Pos { index: 2, wrap: true }.advance(5, 5), Pos { index: 2, wrap: false }, "a whole lap");
    }

    #[test]
    fn takes_chains_in_order_and_uses_them_out_of_order_across_laps() {
        // A ring of 5 (packed sizes need not be powers of two).
        let (m, mut r, mut d) = ring(5, false);
        assert_eq!(r.pop(), Ok(None), "a zeroed ring has nothing available");
        d.chain(2, 7);
        d.chain(3, 1);
        assert_eq!(r.pop(), Ok(Some(PackedAvail { slot: 0, count: 2, id: 7 })));
        assert_eq!(r.pop(), Ok(Some(PackedAvail { slot: 2, count: 3, id: 1 })));
        assert_eq!(r.pop(), Ok(None));
        assert_eq!((r.next_avail(), r.in_flight()), (Pos { index: 0, wrap: false }, 5));
        // Buffer 1 completes first: its used descriptor goes in slot 0, the next one 3 on.
        assert_eq!(r.push_used(1, 513, 3), (DESC, 16));
        let used = get(&m, DESC + 8, 8);
        assert_eq!(used, [1, 2, 0, 0, 1, 0, (DESC_F_WRITE | DESC_F_AVAIL) as u8, (DESC_F_USED >> 8) as u8]);
        assert_eq!(r.push_used(7, 0, 2), (DESC + 48, 16));
        assert_eq!(get(&m, DESC + 62, 2), [0x80, 0x80], "no data written: no WRITE flag");
        assert_eq!(r.next_used(), Pos { index: 0, wrap: false });
        // The second lap: wrap counter 0 on both sides.
        d.chain(1, 4);
        assert_eq!(r.pop(), Ok(Some(PackedAvail { slot: 0, count: 1, id: 4 })));
        r.push_used(4, 1, 1);
        assert_eq!(get(&m, DESC + 14, 2), [DESC_F_WRITE as u8, 0], "used in lap 0: AVAIL and USED clear");
    }

    #[test]
    fn refuses_a_chain_over_the_whole_ring_and_more_than_the_ring_in_flight() {
        let (m, mut r, _) = ring(4, false);
        // Every slot says NEXT.
        for s in 0..4u64 {
            put(&m, DESC + 16 * s + 14, &(DESC_F_AVAIL | DESC_F_NEXT).to_le_bytes());
        }
        assert_eq!(r.pop(), Err(PackedError::Chain { at: 0 }));
        let (_, mut r, mut d) = ring(4, false);
        d.chain(3, 0);
        assert!(r.pop().unwrap().is_some());
        // The driver makes slot 3 and (wrapping, lap 0) slot 0 available while slot 0 is in
        // flight: 5 descriptors would be in flight in a ring of 4.
        d.chain(2, 1);
        assert_eq!(r.pop(), Err(PackedError::Overrun { at: 3, count: 2, in_flight: 3 }));
        assert_eq!(r.next_avail(), Pos { index: 3, wrap: true }, "nothing taken");
    }

    #[test]
    fn signals_follow_the_drivers_event_suppression() {
        let (m, mut r, mut d) = ring(4, true);
        d.chain(1, 0);
        d.chain(1, 1);
        r.pop().unwrap();
        r.pop().unwrap();
        r.push_used(0, 1, 1);
        assert!(r.needs_signal(), "ENABLE (zero) signals");
        put(&m, DRIVER + 2, &EVENT_DISABLE.to_le_bytes());
        r.push_used(1, 1, 1);
        assert!(!r.needs_signal(), "DISABLE");
        // DESC: signal once the used descriptor in slot 3 of lap 1 is written.
        put(&m, DRIVER, &Pos { index: 3, wrap: true }.encode().to_le_bytes());
        put(&m, DRIVER + 2, &EVENT_DESC.to_le_bytes());
        d.chain(1, 2);
        d.chain(1, 3);
        r.pop().unwrap();
        r.pop().unwrap();
        r.push_used(2, 1, 1);
        assert!(!r.needs_signal(), "slot 2 written, the driver waits for slot 3");
        r.push_used(3, 1, 1);
        assert!(r.needs_signal(), "slot 3 written");
        // Next lap (wrap 0): an event for slot 1 of lap 0 passed within a batch of two.
        put(&m, DRIVER, &Pos { index: 1, wrap: false }.encode().to_le_bytes());
        d.chain(1, 0);
        d.chain(1, 1);
        r.pop().unwrap();
        r.pop().unwrap();
        r.push_used(0, 1, 1);
        r.push_used(1, 1, 1);
        assert!(r.needs_signal());
        assert!(!r.needs_signal(), "nothing used since");
        // Without EVENT_IDX, DESC reads as a request for signals.
        let (m, mut r, mut d) = ring(4, false);
        put(&m, DRIVER + 2, &EVENT_DESC.to_le_bytes());
        d.chain(1, 0);
        r.pop().unwrap();
        r.push_used(0, 1, 1);
        assert!(r.needs_signal());
    }

    #[test]
    fn kicks_are_asked_for_by_flags_or_by_the_available_position() {
        let (m, mut r, mut d) = ring(4, true);
        r.disable_kicks();
        assert_eq!(get(&m, DEVICE + 2, 2), [EVENT_DISABLE as u8, 0]);
        assert!(!r.enable_kicks());
        assert_eq!(get(&m, DEVICE, 4), [0, 0x80, EVENT_DESC as u8, 0], "DESC at slot 0 of lap 1");
        d.chain(1, 0);
        assert!(r.enable_kicks(), "a chain arrived meanwhile");
        let (m, mut r, _) = ring(4, false);
        r.enable_kicks();
        assert_eq!(get(&m, DEVICE + 2, 2), [EVENT_ENABLE as u8, 0]);
    }

    #[test]
    fn refuses_bad_sizes_positions_and_areas_outside_or_misaligned() {
        let m = mem();
        let new =
            |size, desc, drv, dev, avail, used| PackedRing::new(m.clone(), size, desc, drv, dev, avail, used, false);
        let s = Pos::START;
        assert_eq!(new(0, DESC, DRIVER, DEVICE, s, s).err(), Some(RingError::Size(0)));
        assert!(new(MAX_SIZE + 1, DESC, DRIVER, DEVICE, s, s).is_err());
        assert!(new(4, DESC + 8, DRIVER, DEVICE, s, s).is_err(), "descriptor ring misaligned");
        assert!(new(4, 0xfff0, DRIVER, DEVICE, s, s).is_err(), "runs past the memory");
        assert!(new(4, DESC, DRIVER + 2, DEVICE, s, s).is_err(), "driver area misaligned");
        assert!(new(4, DESC, DRIVER, 0x10000, s, s).is_err(), "device area outside");
        assert!(new(4, DESC, DRIVER, DEVICE, Pos { index: 4, wrap: true }, Pos { index: 0, wrap: true }).is_err());
        let r = new(4, DESC, DRIVER, DEVICE, Pos { index: 1, wrap: false }, Pos { index: 2, wrap: true }).unwrap();
        assert_eq!(r.in_flight(), 3, "the available position 3 ahead of the used one");
        assert!(
            new(4, DESC, DRIVER, DEVICE, Pos { index: 2, wrap: false }, Pos { index: 1, wrap: true }).is_err(),
            "5 ahead in a ring of 4"
        );
    }
}
