//! The RAID bdev's per-core channel: how each request becomes requests on the members.
//!
//! - A request that lands on one member (a raid0 read or write inside one strip, a concat
//!   request inside one member, a raid1 read, any request of a raid1 with one member left) is
//!   the request itself, forwarded with its offset moved (`IoChannel::forward_then`): nothing is
//!   built or allocated.
//! - A request over several strips or members, and a raid1 write, unmap, write zeroes or flush
//!   (every member), goes out as a fan-out (`ferrite_bdev::FanOut`) with one child per piece.
//! - A raid5f read (the layer splits reads at strips) goes to the member holding the strip, as
//!   a forwarded request; if that member is missing (or being rebuilt) the same blocks of every
//!   other member of the stripe are read and XORed into the request's buffers (parity
//!   reconstruction). A raid5f write (the layer hands over exactly one whole stripe) computes
//!   the parity strip into a pool buffer and goes out as a fan-out of one write per member; a
//!   missing member's strip is skipped (the stripe stays recoverable from the others), as
//!   SPDK's raid5f does. Both fan-outs carry the request's own buffers plus the pool buffers in
//!   one list (`FanOut::for_caller`, with the request as the tag), so nothing is allocated but
//!   the fan-out's state.
//! - A raid1 read that fails on a member is sent to the next readable member, until one
//!   succeeds or none is left. As SPDK's raid1 (`raid1_correct_read_error`), the data a later
//!   member returned is then written back to the member that failed the read first (the same
//!   request, turned into a write on that member and back into the read); if that write fails,
//!   the member is failed (removed). The read succeeds either way. If no member can serve it,
//!   the member it went to first is failed and the read fails. A raid1 write succeeds if one member took it, as SPDK's; a member
//!   that failed one is removed (the RAID goes on degraded).
//!
//! The channel's view of the members (`Layout`) changes only by `Bdev::for_each_channel` from
//! the control plane (members removed under quiesce, a rebuild target added, a rebuild
//! finished).

use crate::level::{
    concat_pieces, raid0_member_range, raid0_strips, raid5f_data_slot, raid5f_parity_slot, Level, Piece,
};
use crate::raid::Raid;
use ferrite_bdev::fanout::{FanOut, FanOutCompleter, FanOutDone};
use ferrite_bdev::{BackendChannel, BdevError, BdevIo, IoChannel, IoRequest, IoStatus, IoType};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One member as a channel sees it.
pub(crate) struct LMember {
    /// This core's channel to it (None: the slot is empty).
    pub(crate) ch: Option<IoChannel>,
    /// Where its data region starts, in blocks.
    pub(crate) offset: u64,
    /// Its data region's size, in blocks.
    pub(crate) size: u64,
    /// Reads may go to it (configured and not being rebuilt).
    pub(crate) readable: bool,
    /// Set (on any core) the moment it fails a request, before that request completes and
    /// before this layout is replaced: a read after a write it missed must not come here.
    failing: Arc<AtomicBool>,
    /// Blocks of reads outstanding on it from this core (raid1 picks the least loaded).
    reads: Cell<u64>,
}

impl LMember {
    /// Reads may go to it now.
    #[inline]
    fn serves_reads(&self) -> bool {
        self.readable && self.ch.is_some() && !self.failing.load(Ordering::Acquire)
    }
}

/// The members as a channel sees them.
pub(crate) struct Layout {
    pub(crate) level: Level,
    /// Strip size in blocks (0 for raid1).
    pub(crate) strip: u64,
    pub(crate) members: SmallVec<[LMember; 4]>,
    /// Data region sizes, in slot order (concat's map).
    sizes: SmallVec<[u64; 4]>,
}

/// Slots as a bit mask (up to 256 members), carried in a request's context.
#[derive(Clone, Copy, Default)]
struct Mask([u64; 4]);

impl Mask {
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    /// The slots set, in order.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                (b != 0).then(|| {
                    let i = b.trailing_zeros() as usize;
                    b &= b - 1;
                    w * 64 + i
                })
            })
        })
    }
}

/// Context of a request forwarded to one member: where it was.
#[derive(Clone, Copy)]
struct Remap {
    offset: u64,
    blocks: u64,
}

/// Context of a raid1 read: where it was, the member it is on, the members tried, the member
/// it went to first (the one a read error is corrected on).
#[derive(Clone, Copy)]
struct MirrorRead {
    offset: u64,
    slot: u8,
    first: u8,
    tried: Mask,
}

/// Context of a fan-out to every member: which slots got a child, in order.
#[derive(Clone, Copy)]
struct Fanned {
    slots: Mask,
}

/// The per-core state requests reach in their completions (`IoState::module_channel`).
pub(crate) struct ChanState {
    pub(crate) raid: Arc<Raid>,
    pub(crate) lay: RefCell<Layout>,
}

/// The RAID bdev's channel on one core.
pub(crate) struct RaidChannel {
    pub(crate) st: Rc<ChanState>,
}

impl RaidChannel {
    /// A channel with the members as they are now.
    pub(crate) fn new(raid: Arc<Raid>) -> Result<Self, BdevError> {
        let lay = raid.layout()?;
        Ok(Self { st: Rc::new(ChanState { raid, lay: RefCell::new(lay) }) })
    }

    /// Takes the members as they are now (a `for_each_channel` round of the control plane).
    pub(crate) fn refresh(&mut self) {
        match self.st.raid.layout() {
            Ok(l) => *self.st.lay.borrow_mut() = l,
            Err(e) => log::warn!("raid {}: channel keeps its members: {e}", self.st.raid.name),
        }
    }
}

impl Layout {
    /// A layout of `level` with strips of `strip` blocks.
    pub(crate) fn new(level: Level, strip: u64) -> Self {
        Self { level, strip, members: SmallVec::new(), sizes: SmallVec::new() }
    }

    /// Adds the next slot.
    pub(crate) fn push(
        &mut self,
        ch: Option<IoChannel>,
        offset: u64,
        size: u64,
        readable: bool,
        failing: Arc<AtomicBool>,
    ) {
        self.members.push(LMember { ch, offset, size, readable, failing, reads: Cell::new(0) });
        self.sizes.push(size);
    }
}

impl BackendChannel for RaidChannel {
    fn submit(&mut self, io: BdevIo) {
        submit(&self.st, io)
    }

    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.st.clone())
    }

    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

fn submit(st: &Rc<ChanState>, io: BdevIo) {
    let lay = st.lay.borrow();
    let t = io.req.io_type;
    match (lay.level, t) {
        (_, IoType::Reset)
        | (_, IoType::Flush)
        | (Level::Raid1, IoType::Write | IoType::Unmap | IoType::WriteZeroes) => to_every_member(&lay, io),
        (Level::Raid1, IoType::Read) => mirror_read(&lay, io),
        (Level::Raid0, IoType::Read | IoType::Write) => {
            let (off, num, n, strip) = (io.req.offset_blocks, io.req.num_blocks, lay.members.len(), lay.strip);
            pieces(&lay, io, |f| raid0_strips(off, num, n, strip, f))
        }
        (Level::Raid0, IoType::Unmap | IoType::WriteZeroes) => {
            let (off, num, n, strip) = (io.req.offset_blocks, io.req.num_blocks, lay.members.len(), lay.strip);
            pieces(&lay, io, |f| {
                for d in 0..n {
                    if let Some((o, b)) = raid0_member_range(off, num, n, strip, d) {
                        f(Piece { slot: d, off: o, blocks: b, pos: 0 })
                    }
                }
            })
        }
        (Level::Concat, IoType::Read | IoType::Write | IoType::Unmap | IoType::WriteZeroes) => {
            let (off, num) = (io.req.offset_blocks, io.req.num_blocks);
            pieces(&lay, io, |f| concat_pieces(off, num, &lay.sizes, f))
        }
        (Level::Raid5f, IoType::Read) => r5f_read(st, &lay, io),
        (Level::Raid5f, IoType::Write) => r5f_write(st, &lay, io),
        _ => io.complete_deferred(IoStatus::Unsupported),
    }
}

/// Sends the pieces `each` names: the request itself if there is one, a fan-out otherwise.
fn pieces(lay: &Layout, mut io: BdevIo, each: impl Fn(&mut dyn FnMut(Piece))) {
    let (mut count, mut first) = (0usize, None);
    each(&mut |p| {
        count += 1;
        first.get_or_insert(p);
    });
    let Some(first) = first else { return io.complete_deferred(IoStatus::Success) };
    let missing = |p: &Piece| lay.members[p.slot].ch.is_none();
    if count == 1 {
        let m = &lay.members[first.slot];
        let Some(ch) = &m.ch else { return io.complete_deferred(IoStatus::Failed(libc::ENODEV)) };
        let r = Remap { offset: io.req.offset_blocks, blocks: io.req.num_blocks };
        io.set_ctx(r);
        io.req.offset_blocks = m.offset + first.off;
        io.req.num_blocks = first.blocks;
        return ch.forward_then(io, remapped);
    }
    let mut any_missing = false;
    each(&mut |p| any_missing |= missing(&p));
    if any_missing {
        return io.complete_deferred(IoStatus::Failed(libc::ENODEV));
    }
    let (t, flags, bs) = (io.req.io_type, io.req.flags, io.block_size() as u64);
    let fan = FanOut::for_io(io, pieces_done);
    each(&mut |p| {
        let m = &lay.members[p.slot];
        let req = IoRequest::new(t, m.offset + p.off, p.blocks).with_flags(flags);
        let payload = if t.has_payload() { (p.pos * bs) as usize..((p.pos + p.blocks) * bs) as usize } else { 0..0 };
        fan.submit(m.ch.as_ref().expect("checked above"), req, payload);
    });
}

/// A request forwarded to one member came back: it is the RAID's again.
fn remapped(mut io: BdevIo, status: IoStatus) {
    let r = *io.ctx::<Remap>().expect("a remapped request keeps its context");
    io.req.offset_blocks = r.offset;
    io.req.num_blocks = r.blocks;
    io.complete(status)
}

fn pieces_done(io: BdevIo, done: FanOutDone) {
    io.complete(done.first_failure())
}

/// A raid1 read: to the readable member with the fewest blocks of reads outstanding here.
fn mirror_read(lay: &Layout, mut io: BdevIo) {
    let Some(slot) = next_reader(lay, &Mask::default()) else {
        return io.complete_deferred(IoStatus::Failed(libc::ENODEV));
    };
    let mut tried = Mask::default();
    tried.set(slot);
    let r = MirrorRead { offset: io.req.offset_blocks, slot: slot as u8, first: slot as u8, tried };
    io.set_ctx(r);
    send_read(lay, io, slot);
}

fn next_reader(lay: &Layout, tried: &Mask) -> Option<usize> {
    lay.members
        .iter()
        .enumerate()
        .filter(|(i, m)| m.serves_reads() && !tried.has(*i))
        .min_by_key(|(_, m)| m.reads.get())
        .map(|(i, _)| i)
}

fn send_read(lay: &Layout, mut io: BdevIo, slot: usize) {
    let m = &lay.members[slot];
    let r = *io.ctx::<MirrorRead>().expect("a mirrored read keeps its context");
    m.reads.set(m.reads.get() + io.req.num_blocks);
    io.req.offset_blocks = r.offset + m.offset;
    m.ch.as_ref().expect("a reader has a channel").forward_then(io, mirror_read_done);
}

/// A raid1 read came back from a member: done, or on to the next member if it failed.
fn mirror_read_done(mut io: BdevIo, status: IoStatus) {
    let mut r = *io.ctx::<MirrorRead>().expect("a mirrored read keeps its context");
    let st = io.module_channel::<ChanState>().expect("a RAID request comes back to its channel");
    let lay = st.lay.borrow();
    if let Some(m) = lay.members.get(r.slot as usize) {
        m.reads.set(m.reads.get().saturating_sub(io.req.num_blocks));
    }
    io.req.offset_blocks = r.offset;
    if !status.is_ok() && status != IoStatus::Aborted {
        if let Some(next) = next_reader(&lay, &r.tried) {
            log::debug!("raid {}: read failed on slot {} ({status}); trying slot {next}", st.raid.name, r.slot);
            r.tried.set(next);
            r.slot = next as u8;
            io.set_ctx(r);
            return send_read(&lay, io, next);
        }
        // No member could serve it: the one it went to first is failed (SPDK's
        // raid1_read_other_base_bdev).
        drop(lay);
        st.raid.member_failed(r.first as usize, status);
        return io.complete(status);
    }
    if status.is_ok() && r.slot != r.first {
        // Served by another member: the good data goes back to the first, which failed it.
        if let Some(ch) = lay.members.get(r.first as usize).and_then(|m| m.ch.as_ref().map(|c| (c, m.offset))) {
            debug_assert!(r.tried.has(r.first as usize));
            io.set_ctx(r);
            io.req.io_type = IoType::Write;
            io.req.offset_blocks = r.offset + ch.1;
            return ch.0.forward_then(io, mirror_corrected);
        }
    }
    drop(lay);
    io.complete(status)
}

/// The write-back of a read error's correction is done: the request is the read again and
/// succeeds; a member that failed the write too is failed (SPDK's
/// `raid1_correct_read_error_completion`).
fn mirror_corrected(mut io: BdevIo, status: IoStatus) {
    let r = *io.ctx::<MirrorRead>().expect("a mirrored read keeps its context");
    io.req.io_type = IoType::Read;
    io.req.offset_blocks = r.offset;
    let st = io.module_channel::<ChanState>().expect("a RAID request comes back to its channel");
    if status.is_ok() {
        log::debug!("raid {}: read error on slot {} corrected at block {}", st.raid.name, r.first, r.offset);
    } else if status != IoStatus::Aborted {
        st.raid.member_failed(r.first as usize, status);
    }
    io.complete(IoStatus::Success)
}

/// A request for every member there is (raid1 writes, unmaps, write zeroes; flush and reset
/// of every level).
fn to_every_member(lay: &Layout, mut io: BdevIo) {
    let mut slots = Mask::default();
    let mut count = 0;
    for (i, m) in lay.members.iter().enumerate() {
        if m.ch.is_some() {
            slots.set(i);
            count += 1;
        }
    }
    let t = io.req.io_type;
    if count == 0 {
        return io.complete_deferred(IoStatus::Failed(libc::ENODEV));
    }
    let ranged = t.has_range();
    if count == 1 && ranged {
        let m = lay.members.iter().find(|m| m.ch.is_some()).expect("counted");
        let r = Remap { offset: io.req.offset_blocks, blocks: io.req.num_blocks };
        io.set_ctx(r);
        io.req.offset_blocks += m.offset;
        return m.ch.as_ref().expect("counted").forward_then(io, remapped);
    }
    io.set_ctx(Fanned { slots });
    let (off, num, flags) = (io.req.offset_blocks, io.req.num_blocks, io.req.flags);
    let len = if t.has_payload() { io.len_bytes() as usize } else { 0 };
    let fan = FanOut::for_io(io, every_member_done);
    for m in lay.members.iter() {
        let Some(ch) = &m.ch else { continue };
        let req = if ranged {
            IoRequest::new(t, off + m.offset, num)
        } else if t == IoType::Flush {
            IoRequest::new(t, m.offset, m.size)
        } else {
            IoRequest::new(t, 0, 0)
        };
        fan.submit(ch, req.with_flags(flags), 0..len);
    }
}

/// Every member answered: a mirror's change succeeds if one member took it (SPDK's raid1), and
/// the members that failed it are removed; a flush or reset of a striped level needs them all.
fn every_member_done(io: BdevIo, done: FanOutDone) {
    let slots = io.ctx::<Fanned>().expect("a fanned request keeps its context").slots;
    let st = io.module_channel::<ChanState>().expect("a RAID request comes back to its channel");
    let mirror = st.raid.level == Level::Raid1;
    let t = io.req.io_type;
    let status = if mirror && done.succeeded() > 0 { IoStatus::Success } else { done.first_failure() };
    // The common case, every member took it, looks at no slot.
    if mirror && t != IoType::Reset && done.succeeded() != done.statuses.len() {
        for (slot, &s) in slots.iter().zip(done.statuses.iter()) {
            if !s.is_ok() && !matches!(s, IoStatus::Aborted | IoStatus::NoMem) {
                st.raid.member_failed(slot, s);
            }
        }
    }
    io.complete(status)
}

/// Context of a raid5f fan-out (the request is the fan-out's tag while it runs).
#[derive(Clone, Copy)]
struct R5 {
    /// The request's own segments, at the head of the fan-out's list; pool buffers follow.
    segs: u16,
    /// Bytes of each stream (a strip for a write, the request for a reconstructing read).
    len: u32,
    /// Streams XORed into the request's buffers when the reads are back (0 for a write).
    streams: u16,
    /// Where the request was (a reconstructing read's offset is not moved; kept for checks).
    offset: u64,
    /// A write's members, in the order of the fan-out's statuses (ascending slots).
    written: Mask,
    /// Members of the RAID when the write began (a write to all of them survives one failing).
    members: u16,
}

/// Slot indexes 0, 1, 2, ...: the sources of an XOR over streams.
const STREAMS: [usize; crate::xor::MAX_SOURCES] = {
    let mut a = [0usize; crate::xor::MAX_SOURCES];
    let mut i = 0;
    while i < a.len() {
        a[i] = i;
        i += 1;
    }
    a
};

/// A raid5f read inside one strip (the layer splits at strips): forwarded to the member that
/// holds it, or reconstructed from the others if it is missing.
fn r5f_read(st: &Rc<ChanState>, lay: &Layout, mut io: BdevIo) {
    let n = lay.members.len();
    let strip = lay.strip;
    let stripe_blocks = strip * (n as u64 - 1);
    let (off, num) = (io.req.offset_blocks, io.req.num_blocks);
    let (stripe, in_stripe) = (off / stripe_blocks, off % stripe_blocks);
    let chunk_off = in_stripe % strip;
    debug_assert!(chunk_off + num <= strip, "the layer splits raid5f reads at strips");
    if chunk_off + num > strip {
        return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
    }
    let slot = raid5f_data_slot(stripe, (in_stripe / strip) as usize, n);
    let member_off = stripe * strip + chunk_off;
    let m = &lay.members[slot];
    if let (Some(ch), true) = (&m.ch, m.serves_reads()) {
        io.set_ctx(Remap { offset: off, blocks: num });
        io.req.offset_blocks = m.offset + member_off;
        return ch.forward_then(io, remapped);
    }
    // Degraded: every other member's blocks at the same place, XORed.
    if lay.members.iter().enumerate().any(|(i, m)| i != slot && !m.serves_reads()) {
        return io.complete_deferred(IoStatus::Failed(libc::EIO));
    }
    let len = io.len_bytes() as usize;
    let Some(mut tmp) = ferrite_reactor::try_alloc_buf(len * (n - 2)) else {
        return io.complete_deferred(IoStatus::NoMem);
    };
    tmp.set_len(len * (n - 2));
    let mut bufs = std::mem::take(&mut io.req.bufs);
    let segs = bufs.len() as u16;
    bufs.push(tmp);
    io.set_ctx(R5 {
        segs,
        len: len as u32,
        streams: (n - 1) as u16,
        offset: off,
        written: Mask::default(),
        members: 0,
    });
    let flags = io.req.flags;
    let fan = FanOut::for_caller(bufs, st.clone(), io.into_raw());
    let mut k = 0;
    for (i, m) in lay.members.iter().enumerate() {
        if i == slot {
            continue;
        }
        let req = IoRequest::new(IoType::Read, m.offset + member_off, num).with_flags(flags);
        fan.submit(m.ch.as_ref().expect("checked above"), req, k * len..(k + 1) * len);
        k += 1;
    }
    debug_assert_eq!(k, n - 1);
}

/// A raid5f write of one whole stripe (the bdev's write unit): the parity strip is computed
/// into a pool buffer, then every present member writes its strip.
fn r5f_write(st: &Rc<ChanState>, lay: &Layout, mut io: BdevIo) {
    let n = lay.members.len();
    let strip = lay.strip;
    let stripe_blocks = strip * (n as u64 - 1);
    let (off, num) = (io.req.offset_blocks, io.req.num_blocks);
    debug_assert!(off % stripe_blocks == 0 && num == stripe_blocks, "the layer hands raid5f whole stripes");
    if off % stripe_blocks != 0 || num != stripe_blocks {
        // SPDK fails a write that is not a whole stripe (the layer's write unit catches it first).
        return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
    }
    let stripe = off / stripe_blocks;
    let p = raid5f_parity_slot(stripe, n);
    let cl = (strip * io.block_size() as u64) as usize;
    let mut bufs = std::mem::take(&mut io.req.bufs);
    let segs = bufs.len() as u16;
    let parity = lay.members[p].ch.is_some();
    if parity {
        let Some(mut pb) = ferrite_reactor::try_alloc_buf(cl) else {
            io.req.bufs = bufs;
            return io.complete_deferred(IoStatus::NoMem);
        };
        pb.set_len(cl);
        bufs.push(pb);
        crate::xor::xor_streams(&mut bufs, cl, n - 1, &STREAMS[..n - 1]);
    }
    let mut written = Mask::default();
    for (slot, m) in lay.members.iter().enumerate() {
        if m.ch.is_some() {
            written.set(slot);
        }
    }
    io.set_ctx(R5 { segs, len: cl as u32, streams: 0, offset: off, written, members: n as u16 });
    let flags = io.req.flags;
    let base = stripe * strip;
    let fan = FanOut::for_caller(bufs, st.clone(), io.into_raw());
    // In slot order (the statuses' order): slot s holds data strip s, or s - 1 past the parity.
    for slot in written.iter() {
        let m = &lay.members[slot];
        let stream = match slot.cmp(&p) {
            std::cmp::Ordering::Less => slot,
            std::cmp::Ordering::Equal => n - 1,
            std::cmp::Ordering::Greater => slot - 1,
        };
        debug_assert!(stream == n - 1 || raid5f_data_slot(stripe, stream, n) == slot);
        let ch = m.ch.as_ref().expect("a written member has a channel");
        fan.submit(
            ch,
            IoRequest::new(IoType::Write, m.offset + base, strip).with_flags(flags),
            stream * cl..(stream + 1) * cl,
        );
    }
}

impl ChanState {
    /// A raid5f stripe write that some member failed: when the stripe went to every member and
    /// exactly one failed it (not an abort or a lack of memory), that member is removed and the
    /// write succeeds, degraded (its strip is the XOR of the others, parity included, as a
    /// degraded read computes it); otherwise it fails with `first`.
    fn r5f_write_failed(&self, r: &R5, statuses: &[IoStatus], first: IoStatus) -> IoStatus {
        let mut failed = r.written.iter().zip(statuses).filter(|(_, s)| !s.is_ok());
        let (Some((slot, &s)), None) = (failed.next(), failed.next()) else { return first };
        if r.written.iter().count() != r.members as usize || matches!(s, IoStatus::Aborted | IoStatus::NoMem) {
            return first;
        }
        self.raid.member_failed(slot, s);
        IoStatus::Success
    }
}

impl FanOutCompleter for ChanState {
    /// A raid5f fan-out is done: a reconstructing read XORs what came back into the request's
    /// buffers; the pool buffers go back; the request completes with the first failure.
    fn fan_out_done(&self, tag: u64, done: FanOutDone) {
        // SAFETY: the tag is the request given up with `into_raw` when the fan-out began, and
        // a fan-out ends once.
        let mut io = unsafe { BdevIo::from_raw(tag) };
        let r = *io.ctx::<R5>().expect("a raid5f fan-out's request keeps its context");
        debug_assert_eq!(r.offset, io.req.offset_blocks);
        let mut bufs = done.bufs;
        let mut status = done.statuses.iter().copied().find(|s| !s.is_ok()).unwrap_or(IoStatus::Success);
        if !status.is_ok() && r.streams == 0 {
            status = self.r5f_write_failed(&r, &done.statuses, status);
        }
        if status.is_ok() && r.streams > 0 {
            crate::xor::xor_streams(&mut bufs, r.len as usize, 0, &STREAMS[..r.streams as usize]);
        }
        bufs.truncate(r.segs as usize);
        io.req.bufs = bufs;
        if !status.is_ok() {
            log::debug!("raid {}: raid5f request at {} failed: {status}", self.raid.name, r.offset);
        }
        io.complete(status)
    }
}

#[cfg(test)]
mod tests {
    use super::Mask;

    #[test]
    fn a_mask_lists_its_slots_in_order() {
        let mut m = Mask::default();
        for i in [0, 3, 63, 64, 130, 255] {
            m.set(i);
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 3, 63, 64, 130, 255]);
        assert_eq!(Mask::default().iter().count(), 0);
    }
}
