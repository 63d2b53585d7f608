//! Compare and compare-and-write, done by the bdev layer for every bdev that can read (and
//! write), as SPDK emulates them; and the LBA range lock that makes compare-and-write atomic
//! against every other write through the layer, on every core.
//!
//! The lock follows SPDK's `bdev_lock_lba_range`: the range goes into the bdev's shared lock
//! table, then every core's channel of the bdev drains the requests handed to its module before
//! it heard of the lock (an epoch barrier); writes that overlap a held range wait in their
//! channel until it is released, and the release tells every core to retry them. With no lock
//! held, a write pays one relaxed atomic load.

use crate::bdev::BdevShared;
use crate::channel;
use crate::io::{BdevIo, Completed, DiffOffset, IoAux, IoRequest, IoStatus, IoType};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The context of a compare-and-write the layer runs: the id of the range lock it holds.
#[derive(Debug, Clone, Copy)]
struct CawLock(u64);

/// A held range: `[start, end)` in blocks, and the lock's id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockedRange {
    start: u64,
    end: u64,
    id: u64,
}

fn overlaps(r: &LockedRange, start: u64, end: u64) -> bool {
    r.start < end && start < r.end
}

/// True if a write of `[start, end)` must wait for a lock (never for the lock holder's own).
#[inline]
pub(crate) fn write_blocked(bdev: &BdevShared, io: &BdevIo) -> bool {
    if bdev.lock_count.load(Ordering::Relaxed) == 0 || io.lock_bypass {
        return false;
    }
    let (start, end) = range_of(&io.req);
    bdev.locks.lock().unwrap().iter().any(|r| overlaps(r, start, end))
}

fn range_of(req: &IoRequest) -> (u64, u64) {
    (req.offset_blocks, req.offset_blocks + req.num_blocks)
}

/// Compare, for a bdev whose module does not compare: read the blocks and compare here.
pub(crate) fn emulate_compare(io: BdevIo) {
    let ch = io.channel().clone();
    let len = io.len_bytes() as usize;
    let Some(buf) = ferrite_reactor::try_alloc_buf(len) else { return ch.wait_for_memory(io) };
    let req = IoRequest::read(io.req.offset_blocks, io.req.num_blocks, buf);
    ch.submit_internal(io, req, compare_read_done);
}

/// Byte offset of the first byte where the blocks read differ from the caller's segments, or
/// None if they are the same.
fn first_difference(read: &Completed, segs: &[ferrite_reactor::IoBuf]) -> Option<u64> {
    let data = &read.req.bufs[0];
    let mut pos = 0;
    for s in segs {
        let have = &data[pos..pos + s.len()];
        if *have != s[..] {
            // Equal slices compare with memcmp; only a differing segment is walked byte by byte.
            let at = have.iter().zip(s.iter()).position(|(a, b)| a != b).expect("the segments differ somewhere");
            return Some((pos + at) as u64);
        }
        pos += s.len();
    }
    None
}

/// The status of a compare whose read ended with `read.status`.
fn compared(read: &Completed, segs: &[ferrite_reactor::IoBuf]) -> IoStatus {
    match read.status {
        IoStatus::Success => match first_difference(read, segs) {
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

/// Compare-and-write: lock the range on every core, read, compare, write if equal, unlock.
pub(crate) fn compare_and_write(io: BdevIo) {
    let ch = io.channel().clone();
    let bdev = ch.bdev.clone();
    let (start, end) = range_of(&io.req);
    let id = {
        let mut locks = bdev.locks.lock().unwrap();
        if locks.iter().any(|r| overlaps(r, start, end)) {
            drop(locks);
            // Another compare-and-write holds an overlapping range: wait for its release.
            ch.locked.borrow_mut().push_back(io);
            return;
        }
        let id = bdev.next_lock.fetch_add(1, Ordering::Relaxed);
        locks.push(LockedRange { start, end, id });
        bdev.lock_count.fetch_add(1, Ordering::SeqCst);
        id
    };
    let mut io = io;
    io.set_ctx(CawLock(id));
    quiesce(&bdev, move || {
        let ch = io.channel().clone();
        let len = io.len_bytes() as usize;
        match ferrite_reactor::try_alloc_buf(len) {
            Some(buf) => {
                let req = IoRequest::read(io.req.offset_blocks, io.req.num_blocks, buf);
                ch.submit_internal(io, req, caw_read_done);
            }
            None => finish_caw(io, IoStatus::NoMem),
        }
    });
}

/// Runs `then` on this core once every core's channel of `bdev` has drained the requests
/// handed to its module before now.
fn quiesce(bdev: &Arc<BdevShared>, then: impl FnOnce() + 'static) {
    let id = bdev.id;
    if ferrite_reactor::current().is_none() {
        // No reactors (unit tests on a plain thread): one thread, nothing else to drain.
        return then();
    }
    let engine = ferrite_reactor::engine();
    let waits: Vec<_> = (0..engine.count()).map(|c| engine.run_async(c, move || channel::drained(id))).collect();
    ferrite_reactor::spawn_local(async move {
        for w in waits {
            let _ = w.await;
        }
        then();
    })
    .detach();
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
    ch.submit_internal_write_locked(parent, req, caw_write_done);
}

fn caw_write_done(mut parent: BdevIo, mut write: Completed) {
    parent.req.bufs = std::mem::take(&mut write.req.bufs);
    let status = write.status;
    drop(write);
    finish_caw(parent, status);
}

/// Releases the compare-and-write's lock, tells every core to retry writes that waited for it,
/// and completes it.
fn finish_caw(io: BdevIo, status: IoStatus) {
    let ch = io.channel().clone();
    let bdev = ch.bdev.clone();
    let id = io.ctx::<CawLock>().expect("a compare-and-write holds its lock's id").0;
    {
        let mut locks = bdev.locks.lock().unwrap();
        locks.retain(|r| r.id != id);
        bdev.lock_count.fetch_sub(1, Ordering::SeqCst);
    }
    io.complete(status);
    let bid = bdev.id;
    match ferrite_reactor::current() {
        Some(_) => {
            let engine = ferrite_reactor::engine();
            for c in 0..engine.count() {
                engine.send(c, move || channel::retry_locked(bid));
            }
        }
        None => ch.retry_locked_here(),
    }
}

/// A held lock on a range of a bdev's blocks (SPDK's `bdev_lock_lba_range`): writes to the
/// range (write, write zeroes, unmap, compare-and-write) wait in their channels, on every core,
/// until it is dropped. Reads go on. A virtual bdev's module takes one to change where a range
/// lives (an lvol snapshot moves its clusters) with no write in flight.
pub struct LbaRangeLock {
    bdev: Arc<BdevShared>,
    id: u64,
}

impl std::fmt::Debug for LbaRangeLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LbaRangeLock({}, {})", self.bdev.name, self.id)
    }
}

impl crate::Bdev {
    /// Locks blocks `[start, start + num)`: waits for overlapping locks to go, then for every
    /// core's channel to finish the requests its module had before (the writes already past
    /// the lock). On a reactor.
    pub async fn lock_lba_range(&self, start: u64, num: u64) -> LbaRangeLock {
        let bdev = self.0.clone();
        let end = start.saturating_add(num);
        let id = loop {
            {
                let mut locks = bdev.locks.lock().unwrap();
                if !locks.iter().any(|r| overlaps(r, start, end)) {
                    let id = bdev.next_lock.fetch_add(1, Ordering::Relaxed);
                    locks.push(LockedRange { start, end, id });
                    bdev.lock_count.fetch_add(1, Ordering::SeqCst);
                    break id;
                }
            }
            ferrite_reactor::sleep(std::time::Duration::from_millis(1)).await;
        };
        let held = LbaRangeLock { bdev: bdev.clone(), id };
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        quiesce(&bdev, move || tx.send(()));
        let _ = rx.await;
        held
    }
}

impl Drop for LbaRangeLock {
    fn drop(&mut self) {
        {
            let mut locks = self.bdev.locks.lock().unwrap();
            locks.retain(|r| r.id != self.id);
            self.bdev.lock_count.fetch_sub(1, Ordering::SeqCst);
        }
        let bid = self.bdev.id;
        if ferrite_reactor::current().is_some() {
            let engine = ferrite_reactor::engine();
            for c in 0..engine.count() {
                engine.send(c, move || channel::retry_locked(bid));
            }
        }
    }
}
