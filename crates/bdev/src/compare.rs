//! Compare and compare-and-write, done by the bdev layer for every bdev that can read (and
//! write), as SPDK emulates them.
//!
//! A compare-and-write is atomic against every other write through the layer, on every core,
//! without a round of messages per command: it runs under a *lease*, a range lock (see
//! `range_lock`) of the aligned [`LEASE_BYTES`] chunk around its blocks that the core it runs
//! on takes once and keeps. Other cores' writes to the chunk wait while it is held, as for any
//! lock; the owning core's own writes to it wait only for its compare-and-writes in progress
//! that they overlap (`local_locks`). Each compare-and-write notes its blocks on its core
//! (later writes of the core to them wait), waits, if a write of the core passed the lease
//! since the last such wait, for the core's requests already with the module (an epoch
//! barrier of one channel: that write may be to its blocks), reads, compares, writes, and lets
//! its blocks go. A lease
//! goes when something else needs its blocks (another core's write or compare-and-write, a
//! lock, a quiesce): that core asks the owner, which releases it once its compare-and-writes
//! under it are done (`revoke`); and when its core already holds [`MAX_LEASES`] and needs
//! another. A heartbeat that rewrites the same block every second from one core so costs two
//! module requests and no message once its lease is held.

use crate::bdev::BdevShared;
use crate::channel::ChannelInner;
use crate::io::{BdevIo, Completed, DiffOffset, IoAux, IoRequest, IoStatus, IoType};
use crate::local_locks::{Lease, LeaseState};
use crate::range_lock::{self, Kind};
use std::rc::Rc;
use std::sync::Arc;

/// The size of the aligned chunk a compare-and-write lease covers.
pub(crate) const LEASE_BYTES: u64 = 4 << 20;

/// Most leases one core keeps: each is one more range other cores' writes check while held.
pub(crate) const MAX_LEASES: usize = 8;

fn range_of(req: &IoRequest) -> (u64, u64) {
    (req.offset_blocks, req.offset_blocks + req.num_blocks)
}

/// Compare, for a bdev whose module does not compare: read the blocks (zero-copy where the
/// module lends its memory, into a pool buffer where not) and compare here.
pub(crate) fn emulate_compare(io: BdevIo) {
    let ch = io.channel().clone();
    let req = IoRequest::read_zcopy(io.req.offset_blocks, io.req.num_blocks);
    ch.submit_internal(io, req, compare_read_done);
}

/// Byte offset of the first byte where the blocks read differ from `segs` (both as long, in
/// any segmentation), or None if they are the same.
fn differs_from_read(read: &Completed, segs: &[ferrite_reactor::IoBuf]) -> Option<u64> {
    first_difference(read.req.bufs.iter().map(|b| &b[..]), segs.iter().map(|b| &b[..]))
}

/// Byte offset of the first byte where two payloads, each given as its segments in order (of
/// any lengths), differ, or None if they are the same; a payload that ends first differs at
/// its end. Runs that are equal compare with memcmp; only a differing one is walked byte by
/// byte. For a module that compares in place (`BackendChannel::compares_in_place`).
pub fn first_difference<'a, 'b>(
    mut a: impl Iterator<Item = &'a [u8]>,
    mut b: impl Iterator<Item = &'b [u8]>,
) -> Option<u64> {
    let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
    let mut pos = 0u64;
    loop {
        if x.is_empty() {
            x = match a.next() {
                Some(s) => s,
                None => return (!(y.is_empty() && b.all(|s| s.is_empty()))).then_some(pos),
            };
            continue;
        }
        if y.is_empty() {
            y = match b.next() {
                Some(s) => s,
                None => return Some(pos),
            };
            continue;
        }
        let n = x.len().min(y.len());
        if x[..n] != y[..n] {
            let at = x[..n].iter().zip(&y[..n]).position(|(p, q)| p != q).expect("the runs differ somewhere");
            return Some(pos + at as u64);
        }
        (x, y) = (&x[n..], &y[n..]);
        pos += n as u64;
    }
}

/// The status of a compare whose read ended with `read.status`.
fn compared(read: &Completed, segs: &[ferrite_reactor::IoBuf]) -> IoStatus {
    match read.status {
        IoStatus::Success => match differs_from_read(read, segs) {
            None => IoStatus::Success,
            Some(at) => IoStatus::Miscompare { offset: DiffOffset::at(at) },
        },
        s => s,
    }
}

fn compare_read_done(parent: BdevIo, read: Completed) {
    let status = compared(&read, &parent.req.bufs);
    drop(read);
    parent.complete(status);
}

/// Compare-and-write: under this core's lease of its blocks, once no other compare-and-write
/// of this core overlaps it and no write of this core that may overlap it is with the module,
/// read, compare, write. Waits in the channel's `locked` queue for what it lacks.
pub(crate) fn compare_and_write(mut io: BdevIo) {
    let ch = io.channel().clone();
    let (start, end) = range_of(&io.req);
    match ch.locks.lease_for(start, end) {
        Some(l) if l.state == LeaseState::Held && l.start <= start && end <= l.end => {
            if ch.locks.caw_overlaps(start, end) {
                return ch.locked.borrow_mut().push_back(io);
            }
            ch.locks.caw_begins(&ch, start, end);
            ch.locks.with_lease(l.id, |l| l.in_progress += 1);
            io.range_lock = l.id;
            if ch.caw_may_start() {
                caw_start(io);
            } else if let Some(io) = ch.after_drain_io(io) {
                caw_start(io);
            }
        }
        Some(l) if l.state == LeaseState::Held && l.in_progress == 0 => {
            // It holds part of the blocks only: the lease of the whole chunk waits behind it,
            // and asks for it to go.
            ch.locked.borrow_mut().push_back(io);
            acquire_lease(&ch, start, end);
        }
        Some(_) => ch.locked.borrow_mut().push_back(io),
        None => {
            // Queued first: off the reactors the lease is granted inside `acquire_lease`.
            ch.locked.borrow_mut().push_back(io);
            acquire_lease(&ch, start, end);
        }
    }
}

/// Asks for a lease of the chunks around `[start, end)` for this core; the compare-and-writes
/// waiting for it are retried once it is held.
fn acquire_lease(ch: &Rc<ChannelInner>, start: u64, end: u64) {
    let bdev = &ch.bdev;
    let chunk = (LEASE_BYTES / bdev.block_size as u64).max(1);
    let blocks = bdev.num_blocks.load(std::sync::atomic::Ordering::Relaxed);
    let whole = (start / chunk * chunk, end.div_ceil(chunk).saturating_mul(chunk).min(blocks).max(end));
    let (ls, le) = bdev.locks.lock().unwrap().lease_around(whole, (start, end));
    // Too many leases: the oldest idle one goes.
    let idle = {
        let leases = ch.locks.leases.borrow();
        if leases.len() >= MAX_LEASES {
            leases.iter().find(|l| l.state == LeaseState::Held && l.in_progress == 0).map(|l| l.id)
        } else {
            None
        }
    };
    if let Some(id) = idle {
        give_up(ch, id);
    }
    let owner = here();
    let bid = bdev.id;
    let engine = bdev.engine.clone();
    let granted = Box::new(move || on_core(engine.as_ref(), owner, move || lease_granted(bid)));
    // The id is known only once requested: the lease is noted under a placeholder first (the
    // grant may run at once, off the reactors), then given its id.
    ch.locks.leases.borrow_mut().push(Lease {
        id: 0,
        start: ls,
        end: le,
        state: LeaseState::Acquiring,
        in_progress: 0,
        revoke_asked: false,
    });
    let id = range_lock::request(bdev, ls, le, Kind::Lease { owner }, granted);
    ch.locks.with_lease(0, |l| l.id = id);
    if let Some(ch) = crate::channel::local_channel(bid) {
        // Off the reactors the grant ran inside `request`, before the id was set.
        lease_granted_here(&ch);
    }
}

/// This core's id (`usize::MAX` off the reactors).
fn here() -> usize {
    ferrite_reactor::current().unwrap_or(usize::MAX)
}

/// Runs `f` on core `core` of `engine` (here, for a bdev off the reactors).
fn on_core(engine: Option<&ferrite_reactor::Engine>, core: usize, f: impl FnOnce() + Send + 'static) {
    match engine {
        Some(e) if core < e.count() => e.send(core, f),
        _ => f(),
    }
}

/// A lease of this core is held on every core: the compare-and-writes waiting go on.
fn lease_granted(bid: u64) {
    if let Some(ch) = crate::channel::local_channel(bid) {
        lease_granted_here(&ch);
    }
}

fn lease_granted_here(ch: &Rc<ChannelInner>) {
    let ready: Vec<u64> = {
        let t = ch.bdev.locks.lock().unwrap();
        ch.locks
            .leases
            .borrow()
            .iter()
            .filter(|l| l.state == LeaseState::Acquiring && l.id != 0 && t.is_installed(l.id))
            .map(|l| l.id)
            .collect()
    };
    for id in &ready {
        ch.locks.with_lease(*id, |l| l.state = LeaseState::Held);
    }
    if ready.is_empty() {
        return;
    }
    ch.retry_locked_here();
    for id in ready {
        if ch.locks.with_lease(id, |l| l.revoke_asked) == Some(true) {
            give_up(ch, id);
        }
    }
}

/// Asks core `owner` to give up its lease `id` (something else needs its blocks).
pub(crate) fn revoke(bdev: &Arc<BdevShared>, owner: usize, id: u64) {
    let bid = bdev.id;
    let weak = Arc::downgrade(bdev);
    on_core(bdev.engine.as_ref(), owner, move || match crate::channel::local_channel(bid) {
        Some(ch) => match ch.locks.with_lease(id, |l| l.state) {
            Some(LeaseState::Acquiring) => {
                ch.locks.with_lease(id, |l| l.revoke_asked = true);
            }
            Some(_) => give_up(&ch, id),
            None => {}
        },
        // Its channel is gone (and released its leases), or never was here.
        None => {
            if let Some(b) = weak.upgrade() {
                range_lock::release(&b, id, None);
            }
        }
    });
}

/// Starts giving up this core's lease `id`: no new compare-and-write runs under it, and it is
/// released once those in progress are done.
fn give_up(ch: &Rc<ChannelInner>, id: u64) {
    let idle = ch.locks.with_lease(id, |l| {
        l.state = LeaseState::Revoking;
        l.in_progress == 0
    });
    if idle == Some(true) {
        release_lease(ch, id);
    }
}

fn release_lease(ch: &Rc<ChannelInner>, id: u64) {
    ch.locks.leases.borrow_mut().retain(|l| l.id != id);
    range_lock::release(&ch.bdev, id, None);
}

/// The compare-and-write's turn: no write of this core that may overlap it is with the
/// module. Its read is zero-copy where the module lends its memory (no write can land in the
/// blocks while they are compared: the lease and the core's note of them hold writes back).
pub(crate) fn caw_start(mut io: BdevIo) {
    let ch = io.channel().clone();
    if ch.caw_in_place {
        // One request: the module compares and writes in one pass (the lease and the core's
        // note of the blocks keep every other write out of them meanwhile).
        let mut req = IoRequest::new(IoType::CompareAndWrite, io.req.offset_blocks, io.req.num_blocks);
        req.flags = io.req.flags;
        req.bufs = std::mem::take(&mut io.req.bufs);
        req.aux = std::mem::replace(&mut io.req.aux, IoAux::None);
        return ch.submit_internal_locked(io, req, caw_in_place_done);
    }
    let req = IoRequest::read_zcopy(io.req.offset_blocks, io.req.num_blocks);
    ch.submit_internal_locked(io, req, caw_read_done);
}

fn caw_read_done(mut parent: BdevIo, read: Completed) {
    let cmp = match &parent.req.aux {
        IoAux::Compare(c) => c,
        _ => unreachable!("compare-and-write carries its compare data"),
    };
    let status = compared(&read, cmp);
    if !status.is_ok() {
        return finish_caw(parent, status);
    }
    drop(read);
    let ch = parent.channel().clone();
    let mut req = IoRequest::new(IoType::Write, parent.req.offset_blocks, parent.req.num_blocks);
    req.flags = parent.req.flags;
    req.bufs = std::mem::take(&mut parent.req.bufs);
    ch.submit_internal_locked(parent, req, caw_write_done);
}

fn caw_in_place_done(mut parent: BdevIo, mut caw: Completed) {
    parent.req.bufs = std::mem::take(&mut caw.req.bufs);
    parent.req.aux = std::mem::replace(&mut caw.req.aux, IoAux::None);
    let status = caw.status;
    drop(caw);
    finish_caw(parent, status);
}

fn caw_write_done(mut parent: BdevIo, mut write: Completed) {
    parent.req.bufs = std::mem::take(&mut write.req.bufs);
    let status = write.status;
    drop(write);
    finish_caw(parent, status);
}

/// Lets the compare-and-write's blocks go, retries what waited for them, releases its lease
/// if it is being given up and this was the last under it, and completes it.
fn finish_caw(mut io: BdevIo, status: IoStatus) {
    let ch = io.channel().clone();
    let (start, end) = range_of(&io.req);
    let id = std::mem::take(&mut io.range_lock);
    debug_assert_ne!(id, 0, "a compare-and-write in progress runs under a lease");
    ch.locks.caw_ends(&ch, start, end);
    let last = ch.locks.with_lease(id, |l| {
        debug_assert!(l.in_progress > 0, "compare-and-writes under a lease underflow");
        l.in_progress -= 1;
        l.in_progress == 0 && l.state == LeaseState::Revoking
    });
    if last == Some(true) {
        release_lease(&ch, id);
    }
    // Done with the lease before the caller hears (it may submit the next one from here).
    io.complete(status);
    if !ch.locked.borrow().is_empty() {
        ch.retry_locked_here();
    }
}
