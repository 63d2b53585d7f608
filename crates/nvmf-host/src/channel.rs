//! A namespace bdev's channel on one reactor: turns bdev requests into NVMe commands and
//! chooses the path (controller) each goes to.
//!
//! The channel keeps this reactor's [`IoPath`] of every controller that reaches the namespace
//! and its choice among them; it chooses again only when the paths' generation moves (a
//! controller lost or back, an ANA change, a path added or removed), so a request costs one
//! atomic load and no lock. Active-passive (SPDK's default): the first optimized path, else
//! the first non-optimized one; active-active: round robin over the optimized paths (else the
//! non-optimized ones). With no usable path but a controller reconnecting, requests wait on
//! its path; with none at all (every path inaccessible) they are parked here and tried again
//! every 100 ms for up to [`PARK_LIMIT`].
//!
//! A request that fails for a path reason (its connection dropped, an ANA status) is sent
//! again, up to [`MAX_RETRIES`] times, through the same channel: the bdev user sees no error as
//! long as one path works.

use crate::bdev::NsShared;
use crate::ctrlr::HostCtrlr;
use crate::path::IoPath;
use ferrite_bdev::{BackendChannel, BdevIo, IoAux, IoFlags, IoStatus, IoType};
use ferrite_nvme::spec::io::DsmRange;
use ferrite_nvme::spec::log::ana_state;
use ferrite_nvme::spec::opcode::nvm;
use ferrite_nvme::spec::sqe::Sqe;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Times a request is sent again after a path failure before its error is given to the user.
pub const MAX_RETRIES: u64 = 32;
/// How long a request may wait here for a usable path.
pub const PARK_LIMIT: Duration = Duration::from_secs(5);

/// A request's context in this module.
#[derive(Debug, Clone, Copy, Default)]
struct HostIo {
    /// Times it was sent again after a path failure.
    retries: u64,
    /// The controller it was last sent to.
    ctrlr: u64,
    /// When it first waited for a usable path (0: never).
    parked: u64,
}

/// The request's context (a fresh one if the module has not set one on this trip).
fn host_io(io: &mut BdevIo) -> &mut HostIo {
    if io.ctx::<HostIo>().is_none() {
        io.set_ctx(HostIo::default());
    }
    io.ctx_mut::<HostIo>().expect("just set")
}

struct ChanPath {
    ctrlr: Arc<HostCtrlr>,
    path: Rc<IoPath>,
}

/// The choice made for the current generation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// Send to this path.
    One(usize),
    /// Round robin over `rr` (active-active).
    RoundRobin,
    /// No path can take it now: park it.
    Park,
    /// No path at all: fail.
    Fail,
}

/// The channel's state (shared with the retry and park timers by address).
pub(crate) struct NsChan {
    ns: Arc<NsShared>,
    seen: Cell<u64>,
    paths: RefCell<Vec<ChanPath>>,
    choice: Cell<Choice>,
    rr: RefCell<SmallVec<[usize; 4]>>,
    rr_next: Cell<usize>,
    parked: RefCell<VecDeque<BdevIo>>,
    park_armed: Cell<bool>,
    me: RefCell<std::rc::Weak<NsChan>>,
}

/// The bdev layer's handle on a [`NsChan`].
pub(crate) struct NsChannel(Rc<NsChan>);

impl NsChannel {
    pub(crate) fn new(ns: Arc<NsShared>) -> NsChannel {
        let c = Rc::new(NsChan {
            seen: Cell::new(ns.gen.load(Ordering::Acquire).wrapping_sub(1)),
            ns,
            paths: RefCell::new(Vec::new()),
            choice: Cell::new(Choice::Fail),
            rr: RefCell::new(SmallVec::new()),
            rr_next: Cell::new(0),
            parked: RefCell::new(VecDeque::new()),
            park_armed: Cell::new(false),
            me: RefCell::new(std::rc::Weak::new()),
        });
        *c.me.borrow_mut() = Rc::downgrade(&c);
        NsChannel(c)
    }
}

fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u64, fua: bool) -> Sqe {
    let mut sqe = Sqe::new(opcode, 0, nsid);
    sqe.cdw10 = lba as u32;
    sqe.cdw11 = (lba >> 32) as u32;
    sqe.cdw12 = (blocks.saturating_sub(1) as u32 & 0xffff) | if fua { 1 << 30 } else { 0 };
    sqe
}

/// The command for a request: (SQE, controller-to-host, data to send instead of the request's
/// buffers). None: the request is not an NVMe command.
fn command(io: &BdevIo, nsid: u32) -> Option<(Sqe, bool, Option<ferrite_reactor::IoBuf>)> {
    let r = &io.req;
    let fua = r.flags.contains(IoFlags::FUA);
    Some(match r.io_type {
        IoType::Read => (rw(nvm::READ, nsid, r.offset_blocks, r.num_blocks, false), true, None),
        IoType::Write => (rw(nvm::WRITE, nsid, r.offset_blocks, r.num_blocks, fua), false, None),
        IoType::Compare => (rw(nvm::COMPARE, nsid, r.offset_blocks, r.num_blocks, false), false, None),
        IoType::WriteZeroes => (rw(nvm::WRITE_ZEROES, nsid, r.offset_blocks, r.num_blocks, fua), false, None),
        IoType::Flush => (Sqe::new(nvm::FLUSH, 0, nsid), false, None),
        IoType::Unmap => {
            // One range per 2^32 - 1 blocks.
            let mut ranges = Vec::new();
            let (mut lba, mut left) = (r.offset_blocks, r.num_blocks);
            while left > 0 && ranges.len() < crate::bdev::DSM_MAX_RANGES as usize {
                let n = left.min(u64::from(u32::MAX));
                ranges.push(DsmRange { context_attributes: 0, nlb: n as u32, slba: lba });
                lba += n;
                left -= n;
            }
            debug_assert_eq!(left, 0, "the bdev layer splits unmaps to one command's ranges");
            let mut buf = ferrite_reactor::alloc_buf(ranges.len() * DsmRange::SIZE);
            DsmRange::write_all(&ranges, &mut buf);
            let mut sqe = Sqe::new(nvm::DATASET_MANAGEMENT, 0, nsid);
            sqe.cdw10 = (ranges.len() - 1) as u32;
            sqe.cdw11 = 1 << 2; // deallocate
            (sqe, false, Some(buf))
        }
        IoType::NvmeIo => return passthru(io, nsid),
        _ => return None,
    })
}

/// An NVMe I/O command passed through (`IoAux::Nvme`, as SPDK's `bdev_nvme_io_passthru`):
/// sent on the I/O queue to this namespace, whatever NSID the caller set; its data direction
/// is the opcode's (bits 1:0): host to controller sends the request's buffers, controller to
/// host fills them. Bidirectional commands are not served.
fn passthru(io: &BdevIo, nsid: u32) -> Option<(Sqe, bool, Option<ferrite_reactor::IoBuf>)> {
    let IoAux::Nvme(cmd) = &io.req.aux else { return None };
    let mut raw = [0u8; Sqe::SIZE];
    for (i, d) in cmd.0.iter().enumerate() {
        raw[4 * i..4 * i + 4].copy_from_slice(&d.to_le_bytes());
    }
    let mut sqe = Sqe::decode(&raw);
    sqe.nsid = nsid;
    sqe.fuse = Default::default();
    match sqe.opcode & 3 {
        0 => Some((sqe, false, None)),
        1 => {
            let len: usize = io.req.bufs.iter().map(|b| b.len()).sum();
            let mut buf = ferrite_reactor::alloc_buf(len);
            buf.set_len(len);
            let mut at = 0;
            for b in &io.req.bufs {
                buf[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
            Some((sqe, false, Some(buf)))
        }
        2 => Some((sqe, true, None)),
        _ => None,
    }
}

impl NsChan {
    /// Chooses the paths for the current generation (rare: takes locks, may allocate).
    fn choose(&self) {
        let gen = self.ns.gen.load(Ordering::Acquire);
        self.seen.set(gen);
        let ctrlrs: Vec<Arc<HostCtrlr>> = self.ns.ctrlrs.lock().unwrap().clone();
        let mut paths = self.paths.borrow_mut();
        paths.retain(|p| ctrlrs.iter().any(|c| Arc::ptr_eq(c, &p.ctrlr)));
        for c in &ctrlrs {
            if !paths.iter().any(|p| Arc::ptr_eq(&p.ctrlr, c)) {
                paths.push(ChanPath { ctrlr: c.clone(), path: c.path() });
            }
        }
        // Keep the namespace's order (the order the paths were attached in).
        paths.sort_by_key(|p| ctrlrs.iter().position(|c| Arc::ptr_eq(c, &p.ctrlr)));
        let nsid = self.ns.nsid;
        let (mut opt, mut nonopt, mut waiting): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>, Option<usize>) =
            Default::default();
        let mut any_alive = false;
        for (i, p) in paths.iter().enumerate() {
            let c = &p.ctrlr;
            if c.detached.load(Ordering::Acquire) || c.failed.load(Ordering::Acquire) {
                continue;
            }
            any_alive = true;
            if c.resetting.load(Ordering::Acquire) {
                waiting.get_or_insert(i);
                continue;
            }
            match c.ana.state(nsid) {
                ana_state::OPTIMIZED => opt.push(i),
                ana_state::NON_OPTIMIZED => nonopt.push(i),
                _ => {}
            }
        }
        let best = if opt.is_empty() { nonopt } else { opt };
        let choice = if best.is_empty() {
            match waiting {
                Some(i) => Choice::One(i),
                None if any_alive => Choice::Park,
                None => Choice::Fail,
            }
        } else if self.ns.active_active.load(Ordering::Acquire) && best.len() > 1 {
            *self.rr.borrow_mut() = best;
            Choice::RoundRobin
        } else {
            Choice::One(best[0])
        };
        self.choice.set(choice);
    }

    /// Sends `io` on the chosen path (or parks or fails it). Completes only deferred.
    fn submit(&self, mut io: BdevIo) {
        if self.ns.gen.load(Ordering::Acquire) != self.seen.get() {
            self.choose();
        }
        let paths = self.paths.borrow();
        let p = match self.choice.get() {
            Choice::One(i) => &paths[i],
            Choice::RoundRobin => {
                let rr = self.rr.borrow();
                let n = self.rr_next.get();
                self.rr_next.set(n.wrapping_add(1));
                &paths[rr[n % rr.len()]]
            }
            Choice::Park => {
                drop(paths);
                return self.park(io);
            }
            Choice::Fail => return io.complete_deferred(IoStatus::Failed(libc::EIO)),
        };
        let Some((sqe, read, extra)) = command(&io, self.ns.nsid) else {
            return io.complete_deferred(IoStatus::Unsupported);
        };
        host_io(&mut io).ctrlr = p.ctrlr.id;
        let path = p.path.clone();
        drop(paths);
        path.submit(sqe, io, read, extra);
    }

    /// Keeps `io` until a path is usable (every 100 ms), at most [`PARK_LIMIT`].
    fn park(&self, mut io: BdevIo) {
        let now = ferrite_reactor::tsc::ticks();
        let h = host_io(&mut io);
        if h.parked == 0 {
            h.parked = now.max(1);
        } else if ferrite_reactor::tsc::ticks_to_nanos(now.saturating_sub(h.parked)) >= PARK_LIMIT.as_nanos() as u64 {
            return io.complete_deferred(IoStatus::Failed(libc::EIO));
        }
        self.parked.borrow_mut().push_back(io);
        // Someone must learn the states: ask every controller to re-read its ANA log.
        for p in self.paths.borrow().iter() {
            p.ctrlr.refresh_ana();
        }
        if !self.park_armed.replace(true) {
            let me = self.me.borrow().clone();
            ferrite_reactor::after(Duration::from_millis(100), move || {
                if let Some(c) = me.upgrade() {
                    c.park_armed.set(false);
                    let parked: Vec<BdevIo> = c.parked.borrow_mut().drain(..).collect();
                    for io in parked {
                        c.submit(io);
                    }
                }
            });
        }
    }

    fn abort_held(&self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        let picked: Vec<BdevIo> = {
            let mut q = self.parked.borrow_mut();
            let (p, keep): (VecDeque<BdevIo>, VecDeque<BdevIo>) =
                std::mem::take(&mut *q).into_iter().partition(|io| named(io));
            *q = keep;
            p.into_iter().collect()
        };
        let mut n = picked.len();
        picked.into_iter().for_each(|io| io.complete_deferred(IoStatus::Aborted));
        for p in self.paths.borrow().iter() {
            n += p.path.abort_waiting(named);
        }
        n
    }
}

impl BackendChannel for NsChannel {
    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.0.clone())
    }

    fn submit(&mut self, mut io: BdevIo) {
        match io.req.io_type {
            IoType::Reset => return reset(&self.0.ns, io),
            IoType::Abort => return crate::abort::abort(&self.0, io),
            _ => {}
        }
        io.set_ctx(HostIo::default());
        self.0.submit(io);
    }

    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        self.0.abort_held(named)
    }
}

/// A reset of the namespace's bdev resets each of its controllers in turn (as SPDK's reset
/// I/O does; a controller already resetting is waited for), on the first reactor; the request
/// completes here once they are all up again, or failed if one could not be reconnected.
fn reset(ns: &Arc<NsShared>, io: BdevIo) {
    let ctrlrs: Vec<Arc<HostCtrlr>> = ns.ctrlrs.lock().unwrap().clone();
    let Some(engine) = ctrlrs.first().map(|c| c.engine.clone()) else {
        return io.complete_deferred(IoStatus::Success);
    };
    let rx = engine.run_async(0, move || async move {
        for c in ctrlrs {
            c.reset_or_join().await?;
        }
        Ok::<(), i32>(())
    });
    ferrite_reactor::spawn_local(async move {
        let status = match rx.await {
            Ok(Ok(())) => IoStatus::Success,
            Ok(Err(e)) => IoStatus::Failed(e),
            Err(_) => IoStatus::Failed(libc::ENODEV),
        };
        io.complete(status);
    })
    .detach();
}

impl NsChan {
    /// This reactor's paths of the namespace, for an abort to look through.
    pub(crate) fn each_path(&self, f: &mut dyn FnMut(&Arc<HostCtrlr>, &Rc<IoPath>)) {
        for p in self.paths.borrow().iter() {
            f(&p.ctrlr, &p.path);
        }
    }

    /// Completes, as Aborted, the requests waiting here or on a path that `named` picks.
    pub(crate) fn abort_waiting(&self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        self.abort_held(named)
    }
}

/// `io` (sent by a channel of this module) failed for a path reason with `status`: it goes
/// through its channel again, unless it already did [`MAX_RETRIES`] times.
pub(crate) fn retry(mut io: BdevIo, status: IoStatus) {
    let h = host_io(&mut io);
    if h.retries >= MAX_RETRIES {
        return io.complete(status);
    }
    h.retries += 1;
    resubmit(io);
}

/// Sends `io` through its channel again (its path was lost before it was sent).
pub(crate) fn resubmit(io: BdevIo) {
    let ch = io.module_channel::<NsChan>().expect("a request of this module returns to its channel");
    ch.submit(io);
}

/// `io` failed with an ANA status on its controller: that controller's state for the
/// namespace is taken from the status until its ANA log is read again (asked for here).
pub(crate) fn ana_failed(io: &BdevIo, state: u8) {
    let Some(ch) = io.module_channel::<NsChan>() else { return };
    let id = io.ctx::<HostIo>().map_or(0, |h| h.ctrlr);
    for p in ch.paths.borrow().iter() {
        if p.ctrlr.id == id {
            if p.ctrlr.ana.set(ch.ns.nsid, state) {
                p.ctrlr.paths_changed();
            }
            p.ctrlr.refresh_ana();
        }
    }
}
