//! One virtio-blk request queue: a split ring and its request slots, all in the shared region.
//!
//! Slot `s` owns descriptors `3s` (request header), `3s + 1` (data: the slot's bounce buffer,
//! or the discard/write-zeroes segment) and `3s + 2` (status byte), chained once per request,
//! so a completion's head index names its slot and no descriptor free list is kept. Payloads
//! are copied between the request's buffers and the slot's bounce buffer (device memory must
//! be in the shared region): on submit for writes, on completion for reads. That copy is
//! counted ([`QueueStats::copied_bytes`]). Zero-copy reads (a caller that takes the module's
//! memory, such as the NBD and NVMe-oF targets) get the bounce buffer itself, lent until they
//! drop it ([`QueueStats::lent_bytes`]).
//!
//! virtio-blk has no FUA: a FUA write to a device with a volatile cache (FLUSH) is followed by
//! a flush in the same slot, and completes when the flush does.
//!
//! A queue is used by one core at a time (the channel that holds it); nothing here locks,
//! allocates or makes a syscall per request apart from the kick the device asks for.

use crate::ring::{Desc, RingLayout, SplitRing};
use crate::shm::SharedMem;
use ferrite_bdev::{BdevIo, IoFlags, IoStatus, IoType};
use ferrite_reactor::{IoBuf, Lender};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vmm_sys_util::eventfd::EventFd;

/// Bytes of each slot's metadata: header at 0, discard/write-zeroes segment at 16, status at 32.
const META_BYTES: usize = 64;
const SEGMENT_AT: usize = 16;
const STATUS_AT: usize = 32;
/// A status byte no device writes: the device has not answered (yet).
const NO_STATUS: u8 = 0xff;

/// Most bytes a read or write moves (one slot's bounce buffer) unless the device says less.
pub const MAX_TRANSFER: usize = 128 * 1024;
/// Most requests in flight per queue (bounds the bounce buffers' memory).
pub const MAX_SLOTS: usize = 256;

/// Counters of one queue, readable from any core (written by the one that holds the queue).
#[derive(Default, Debug)]
pub struct QueueStats {
    /// Bytes copied between requests' buffers and the bounce buffers.
    pub copied_bytes: AtomicU64,
    /// Kicks sent (eventfd writes).
    pub kicks: AtomicU64,
    /// Requests completed by the device.
    pub completed: AtomicU64,
    /// Flushes sent after FUA writes.
    pub fua_flushes: AtomicU64,
    /// Times the device was asked to signal completions (the reactor could then sleep).
    pub waits: AtomicU64,
    /// Bytes lent to zero-copy readers (read without a copy).
    pub lent_bytes: AtomicU64,
}

impl QueueStats {
    /// Adds `n` to a counter that only the queue's holder writes (no locked instruction).
    #[inline]
    fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// Where one queue's parts lie in the shared region, as offsets from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// The split ring.
    pub ring: usize,
    /// Slot metadata (`META_BYTES` each).
    pub meta: usize,
    /// Bounce buffers (`slot_bytes` each, page-aligned).
    pub data: usize,
    /// Requests in flight at most.
    pub slots: usize,
    /// Bytes of each bounce buffer.
    pub slot_bytes: usize,
    /// Bytes the queue takes (a multiple of the page size).
    pub bytes: usize,
}

impl QueueLayout {
    /// The layout of a queue of `size` ring entries whose transfers are at most `slot_bytes`.
    pub fn of(size: u16, slot_bytes: usize) -> QueueLayout {
        let page = 4096;
        let slots = (size as usize / 3).min(MAX_SLOTS);
        let ring_bytes = RingLayout::of(size).bytes;
        let meta = ring_bytes.next_multiple_of(64);
        let data = (meta + slots * META_BYTES).next_multiple_of(page);
        let bytes = (data + slots * slot_bytes).next_multiple_of(page);
        QueueLayout { ring: 0, meta, data, slots, slot_bytes, bytes }
    }
}

/// A request queue of a virtio-blk device (see the module doc).
pub struct BlkQueue {
    ring: SplitRing,
    meta: *mut u8,
    data: *mut u8,
    slot_bytes: usize,
    /// The request each slot carries.
    held: Box<[Option<BdevIo>]>,
    /// The slot's FUA write is done and its flush is with the device.
    flushing: Box<[bool]>,
    /// FUA writes are followed by a flush (the device has a volatile cache: FLUSH offered;
    /// virtio-blk has no FUA of its own).
    flush_after_fua: bool,
    /// Free slots (a stack; its capacity is the slot count, so pushes never allocate).
    free: Vec<u16>,
    /// Slots lent to zero-copy readers (capacity: the slot count).
    lent: Vec<u16>,
    /// Requests with the device.
    with_device: usize,
    kick: EventFd,
    call: EventFd,
    stats: Arc<QueueStats>,
}

// SAFETY: a queue moves between cores only when no channel holds it (inside the device's
// Mutex); its pointers are into the shared region, owned by the device that owns the queue; its
// requests are held only while a channel holds it (none are in flight when it moves).
unsafe impl Send for BlkQueue {}

impl BlkQueue {
    /// A queue of `size` entries at offset `at` of `shm`, laid out as `layout` (from
    /// [`QueueLayout::of`]) says, in zeroed memory nothing else uses.
    /// `flush_after_fua`: the device has a volatile write cache (FLUSH), so a FUA write is
    /// followed by a flush before it completes.
    pub fn new(
        shm: &SharedMem,
        at: usize,
        size: u16,
        layout: QueueLayout,
        event_idx: bool,
        flush_after_fua: bool,
    ) -> std::io::Result<Self> {
        assert!(at + layout.bytes <= shm.len(), "the queue lies inside the shared region");
        assert!(layout.slots > 0 && layout.slots * 3 <= size as usize, "each slot has three descriptors");
        // SAFETY: offsets inside the region (checked above), page-aligned base.
        let base = unsafe { shm.base().add(at) };
        // SAFETY: the ring's bytes are the first of the queue's, zeroed and used by no one else.
        let ring = unsafe { SplitRing::new(base.add(layout.ring), size, event_idx) };
        let mut q = BlkQueue {
            ring,
            // SAFETY: inside the queue's bytes.
            meta: unsafe { base.add(layout.meta) },
            // SAFETY: inside the queue's bytes.
            data: unsafe { base.add(layout.data) },
            slot_bytes: layout.slot_bytes,
            held: (0..layout.slots).map(|_| None).collect(),
            flushing: vec![false; layout.slots].into_boxed_slice(),
            flush_after_fua,
            free: (0..layout.slots as u16).rev().collect(),
            lent: Vec::with_capacity(layout.slots),
            with_device: 0,
            kick: EventFd::new(libc::EFD_NONBLOCK)?,
            call: EventFd::new(libc::EFD_NONBLOCK)?,
            stats: Arc::default(),
        };
        // The header and status descriptors of each slot never change.
        for s in 0..layout.slots as u16 {
            let hdr = q.meta_of(s);
            q.ring.set_desc(3 * s, Desc { addr: hdr as u64, len: 16, flags: 0, next: 0 });
            q.ring.set_desc(
                3 * s + 2,
                Desc { addr: hdr as u64 + STATUS_AT as u64, len: 1, flags: VRING_DESC_F_WRITE as u16, next: 0 },
            );
        }
        Ok(q)
    }

    fn meta_of(&self, slot: u16) -> *mut u8 {
        // SAFETY: slot < slots, so the block lies inside the queue's metadata.
        unsafe { self.meta.add(slot as usize * META_BYTES) }
    }

    fn data_of(&self, slot: u16) -> *mut u8 {
        // SAFETY: slot < slots, so the buffer lies inside the queue's bounce buffers.
        unsafe { self.data.add(slot as usize * self.slot_bytes) }
    }

    /// The ring, its eventfds and counters, for the handshake and the channel.
    pub fn ring(&self) -> &SplitRing {
        &self.ring
    }

    /// The ring, to change its notification wish.
    pub fn ring_mut(&mut self) -> &mut SplitRing {
        &mut self.ring
    }

    /// Asks the device to signal the next completion (the channel is about to let its reactor
    /// sleep); asked again before each sleep, as the completions taken move.
    pub fn wait_for_signal(&mut self) {
        if !self.ring.notify_on() {
            QueueStats::add(&self.stats.waits, 1);
        }
        self.ring.set_notify(true);
    }

    /// The eventfd this driver kicks the device with.
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The eventfd the device signals completions on.
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// The queue's counters.
    pub fn stats(&self) -> &Arc<QueueStats> {
        &self.stats
    }

    /// Requests with the device.
    pub fn in_flight(&self) -> usize {
        self.with_device
    }

    /// Slots whose bounce buffer is lent to a zero-copy reader.
    pub fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Takes back the slots whose lent buffers are all gone (their lender is held by the
    /// channel alone again). Returns how many.
    pub fn reclaim(&mut self, lenders: &[Rc<Lender>]) -> usize {
        let mut back = 0;
        let mut i = 0;
        while i < self.lent.len() {
            let slot = self.lent[i];
            if Rc::strong_count(&lenders[slot as usize]) == 1 {
                self.lent.swap_remove(i);
                self.free.push(slot);
                back += 1;
            } else {
                i += 1;
            }
        }
        back
    }

    /// Bytes one read or write may move.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Hands `io` to the device. Gives it back with the status to complete it with (deferred:
    /// this runs inside `submit`) when it cannot go: no free slot (`NoMem`, retried by the bdev
    /// layer), a type the queue does not carry, or a payload larger than a slot.
    pub fn submit(&mut self, io: BdevIo) -> Result<(), (BdevIo, IoStatus)> {
        let (kind, segment) = match io.req.io_type {
            IoType::Read => (VIRTIO_BLK_T_IN, false),
            IoType::Write => (VIRTIO_BLK_T_OUT, false),
            IoType::Flush => (VIRTIO_BLK_T_FLUSH, false),
            IoType::Unmap => (VIRTIO_BLK_T_DISCARD, true),
            IoType::WriteZeroes => (VIRTIO_BLK_T_WRITE_ZEROES, true),
            _ => return Err((io, IoStatus::Unsupported)),
        };
        let len = io.len_bytes();
        let payload = io.req.io_type.has_payload();
        if payload && len > self.slot_bytes as u64 {
            debug_assert!(false, "the bdev layer splits requests at max_io_blocks");
            return Err((io, IoStatus::Failed(libc::EINVAL)));
        }
        let sectors = len / 512;
        if segment && sectors > u64::from(u32::MAX) {
            return Err((io, IoStatus::Failed(libc::EINVAL)));
        }
        let Some(slot) = self.free.pop() else {
            return Err((io, IoStatus::NoMem));
        };
        let meta = self.meta_of(slot);
        let sector = io.offset_bytes() / 512;
        // SAFETY: the slot's metadata block, which the device does not touch while the slot
        // is free (its last chain completed).
        unsafe {
            meta.cast::<u32>().write(kind.to_le());
            meta.add(4).cast::<u32>().write(0);
            meta.add(8).cast::<u64>().write(sector.to_le());
            meta.add(STATUS_AT).write(NO_STATUS);
        }
        let head = 3 * slot;
        let data_desc = if payload {
            let buf = self.data_of(slot);
            if io.req.io_type == IoType::Write {
                let mut at = 0;
                for b in io.req.bufs.iter() {
                    // SAFETY: the segments add up to `len` <= slot_bytes (the layer checked the
                    // payload against the block count); the bounce buffer is the slot's own.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), buf.add(at), b.len()) };
                    at += b.len();
                }
                debug_assert_eq!(at as u64, len, "a write's segments carry its blocks");
                QueueStats::add(&self.stats.copied_bytes, len);
            }
            let flags =
                VRING_DESC_F_NEXT as u16 | if io.req.io_type == IoType::Read { VRING_DESC_F_WRITE as u16 } else { 0 };
            Some(Desc { addr: buf as u64, len: len as u32, flags, next: head + 2 })
        } else if segment {
            // SAFETY: the segment's 16 bytes inside the slot's metadata block.
            let seg = unsafe { meta.add(SEGMENT_AT) };
            // SAFETY: as above; sector, num_sectors, flags (no unmap hint).
            unsafe {
                seg.cast::<u64>().write(sector.to_le());
                seg.add(8).cast::<u32>().write((sectors as u32).to_le());
                seg.add(12).cast::<u32>().write(0);
            }
            Some(Desc { addr: seg as u64, len: 16, flags: VRING_DESC_F_NEXT as u16, next: head + 2 })
        } else {
            None
        };
        let hdr = meta as u64;
        match data_desc {
            Some(d) => {
                self.ring.set_desc(head + 1, d);
                self.ring.set_desc(head, Desc { addr: hdr, len: 16, flags: VRING_DESC_F_NEXT as u16, next: head + 1 });
            }
            None => {
                self.ring.set_desc(head, Desc { addr: hdr, len: 16, flags: VRING_DESC_F_NEXT as u16, next: head + 2 })
            }
        }
        debug_assert!(self.held[slot as usize].is_none(), "a free slot holds no request");
        self.held[slot as usize] = Some(io);
        self.with_device += 1;
        self.publish(head);
        Ok(())
    }

    /// Publishes the chain at `head`, kicking the device if it asked.
    fn publish(&mut self, head: u16) {
        if self.ring.publish(head) {
            // The one syscall of a request, when the device waits for it (one that polls its
            // rings never asks).
            if let Err(e) = self.kick.write(1) {
                log::warn!("virtio-user: kick failed: {e}");
            }
            QueueStats::add(&self.stats.kicks, 1);
        }
    }

    /// Sends a flush in `slot` (whose FUA write just completed): header and status only.
    fn flush_in(&mut self, slot: u16) {
        let meta = self.meta_of(slot);
        // SAFETY: the slot's metadata; the device finished with it (its chain completed).
        unsafe {
            meta.cast::<u32>().write(VIRTIO_BLK_T_FLUSH.to_le());
            meta.add(8).cast::<u64>().write(0);
            meta.add(STATUS_AT).write(NO_STATUS);
        }
        let head = 3 * slot;
        self.ring.set_desc(head, Desc { addr: meta as u64, len: 16, flags: VRING_DESC_F_NEXT as u16, next: head + 2 });
        QueueStats::add(&self.stats.fua_flushes, 1);
        self.publish(head);
    }

    /// Takes the requests the device completed into `done`, with their statuses: reads'
    /// payloads copied out, or for zero-copy reads (no buffers) the slot's bounce buffer lent
    /// through the slot's lender in `lenders` (the slot stays out of use until
    /// [`BlkQueue::reclaim`] sees the lent view gone). Returns how many completions it took
    /// from the ring (a FUA write whose flush was just sent counts, though it is not done).
    pub fn reap(&mut self, done: &mut Vec<(BdevIo, IoStatus)>, lenders: &[Rc<Lender>]) -> usize {
        let before = done.len();
        let mut taken = 0;
        while let Some((head, _written)) = self.ring.pop_used() {
            taken += 1;
            let slot = head / 3;
            let Some(mut io) = self.held.get_mut(slot as usize).and_then(Option::take) else {
                log::error!("virtio-user: the device completed descriptor {head}, which carries no request");
                continue;
            };
            // SAFETY: the slot's status byte, written by the device before it published the
            // completion (the used index was read with Acquire).
            let status = unsafe { self.meta_of(slot).add(STATUS_AT).read_volatile() };
            let status = match u32::from(status) {
                VIRTIO_BLK_S_OK => IoStatus::Success,
                VIRTIO_BLK_S_UNSUPP => IoStatus::Unsupported,
                VIRTIO_BLK_S_IOERR => IoStatus::Failed(libc::EIO),
                other => {
                    log::warn!("virtio-user: the device answered status {other:#x}; failing the request");
                    IoStatus::Failed(libc::EIO)
                }
            };
            let flushed = std::mem::take(&mut self.flushing[slot as usize]);
            if status.is_ok()
                && !flushed
                && self.flush_after_fua
                && io.req.io_type == IoType::Write
                && io.req.flags.contains(IoFlags::FUA)
            {
                // Durable when it completes: the slot carries a flush first.
                self.flushing[slot as usize] = true;
                self.held[slot as usize] = Some(io);
                self.flush_in(slot);
                continue;
            }
            self.with_device -= 1;
            if status.is_ok() && io.req.is_zcopy_read() {
                debug_assert_eq!(lenders.len(), self.held.len(), "a lender per slot");
                let len = io.len_bytes() as usize;
                let ptr = std::ptr::NonNull::new(self.data_of(slot)).expect("inside the mapping");
                // SAFETY: the slot's bounce buffer, which the device filled and no longer
                // touches; the slot is not reused while the view's lender is held by it, and
                // the lender keeps the device (and so the mapping) alive.
                let view = unsafe { IoBuf::lent(ptr, len, lenders[slot as usize].clone()) };
                io.req.bufs.push(view);
                self.lent.push(slot);
                QueueStats::add(&self.stats.lent_bytes, len as u64);
                done.push((io, status));
                continue;
            }
            if status.is_ok() && io.req.io_type == IoType::Read {
                let buf = self.data_of(slot);
                let mut at = 0;
                for b in io.req.bufs.iter_mut() {
                    let n = b.len();
                    // SAFETY: the device wrote the slot's bounce buffer (at least the read's
                    // length, as its status says); the segments add up to that length.
                    unsafe { std::ptr::copy_nonoverlapping(buf.add(at), b.as_mut_ptr(), n) };
                    at += n;
                }
                QueueStats::add(&self.stats.copied_bytes, at as u64);
            }
            self.free.push(slot);
            done.push((io, status));
        }
        QueueStats::add(&self.stats.completed, (done.len() - before) as u64);
        taken
    }

    /// Fails every request in flight (the device is gone): they go to `done` with an I/O
    /// error. Their slots stay taken, so no buffer a late device could still write is reused.
    pub fn fail_all(&mut self, done: &mut Vec<(BdevIo, IoStatus)>) -> usize {
        let before = done.len();
        for held in self.held.iter_mut() {
            if let Some(io) = held.take() {
                done.push((io, IoStatus::Failed(libc::EIO)));
            }
        }
        self.free.clear();
        self.with_device = 0;
        done.len() - before
    }

    /// Slots: requests in flight at most.
    pub fn slots(&self) -> usize {
        self.held.len()
    }
}
