//! The error bdev: a passthru that injects faults on cue, as SPDK's `vbdev_error`, for testing
//! what sits above a bdev. `bdev_error_create {base_name}` makes `EE_<base_name>`;
//! `bdev_error_inject_error` arms, per I/O type (read, write, unmap, flush), one of:
//! - `failure`: the next `num` I/Os of the type fail (`Failed(EIO)`) without reaching the base;
//! - `nvme_failure`: the same with the NVMe status (`nvme_sct`, `nvme_sc`);
//! - `pending`: the next `num` are held until aborted (abort request, or a reset, which
//!   completes them as `Aborted`) or resumed (`bdev_error_resume_pending`);
//! - `corrupt_data`: the next `num` have the byte at `corrupt_offset` of their payload XORed with
//!   `corrupt_value`: a write's data on its way down (into a copy: the caller's buffer is left
//!   alone), a read's data on its way up;
//! - `nomem`: the next `num` answer NoMem, which the bdev layer retries, so the caller sees
//!   success, later.
//!
//! An injection fires only while the channel has at least `queue_depth` I/Os in flight to the
//! base (0: always). Counts are shared by every core; an I/O takes one with a compare-and-swap
//! only while the count is non-zero, so without injections the cost is one relaxed load.

pub mod rpc;

use super::passthru::base::BaseBdev;
use ferrite_bdev::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError};
use ferrite_bdev::channel::IoChannel;
use ferrite_bdev::io::{BdevIo, Completed, IoAux, IoRequest, IoStatus, IoType};
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "error";

/// What an injection does to the I/Os it catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorType {
    /// Fail them (`Failed(EIO)`).
    Failure = 1,
    /// Hold them until aborted, reset or resumed.
    Pending = 2,
    /// Flip a byte of their data.
    CorruptData = 3,
    /// Answer NoMem (the layer retries).
    NoMem = 4,
    /// Fail them with an NVMe status.
    NvmeFailure = 5,
}

impl ErrorType {
    fn from_u8(v: u8) -> Option<ErrorType> {
        Some(match v {
            1 => ErrorType::Failure,
            2 => ErrorType::Pending,
            3 => ErrorType::CorruptData,
            4 => ErrorType::NoMem,
            5 => ErrorType::NvmeFailure,
            _ => return None,
        })
    }
}

/// The I/O types an injection can name (SPDK's: read, write, unmap, flush).
pub const INJECTABLE: [IoType; 4] = [IoType::Read, IoType::Write, IoType::Unmap, IoType::Flush];

/// An injection request (`bdev_error_inject_error`).
#[derive(Debug, Clone, Copy)]
pub struct Injection {
    /// What to do.
    pub error_type: ErrorType,
    /// How many I/Os to catch (0 disarms).
    pub num: u32,
    /// Only while at least this many I/Os are in flight on the channel.
    pub queue_depth: u64,
    /// Byte of the payload to corrupt.
    pub corrupt_offset: u64,
    /// XOR mask for the corrupted byte (non-zero for `CorruptData`).
    pub corrupt_value: u8,
    /// NVMe status code type for `NvmeFailure`.
    pub nvme_sct: u8,
    /// NVMe status code for `NvmeFailure`.
    pub nvme_sc: u8,
}

impl Injection {
    /// `num` I/Os of `error_type`, with no queue-depth condition, corruption or NVMe status.
    pub fn of(error_type: ErrorType, num: u32) -> Self {
        Self { error_type, num, queue_depth: 0, corrupt_offset: 0, corrupt_value: 0, nvme_sct: 0, nvme_sc: 0 }
    }
}

/// One I/O type's armed injection, read by every core.
#[derive(Default)]
struct Slot {
    error_type: AtomicU8,
    num: AtomicU32,
    qd: AtomicU64,
    corrupt_offset: AtomicU64,
    corrupt_value: AtomicU8,
    nvme: AtomicU32,
}

struct ErrorDisk {
    base: Arc<BaseBdev>,
    slots: [Slot; 4],
    /// The error bdev's id, once registered.
    id: std::sync::OnceLock<u64>,
}

fn slot_index(t: IoType) -> Option<usize> {
    INJECTABLE.iter().position(|x| *x == t)
}

impl ErrorDisk {
    /// Takes one injection of `t`'s slot, if armed and the queue is deep enough.
    #[inline]
    fn take(&self, t: IoType, inflight: u64) -> Option<(ErrorType, &Slot)> {
        let s = &self.slots[slot_index(t)?];
        if s.num.load(Ordering::Relaxed) == 0 || inflight < s.qd.load(Ordering::Relaxed) {
            return None;
        }
        s.num.fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| n.checked_sub(1)).ok()?;
        Some((ErrorType::from_u8(s.error_type.load(Ordering::Relaxed))?, s))
    }
}

/// Per-core state, reached from a request's context while it is in flight.
struct ErrorCh {
    disk: Arc<ErrorDisk>,
    base: IoChannel,
    lends: bool,
    /// I/Os forwarded to the base and not back yet.
    inflight: Cell<u64>,
    /// I/Os held by `pending` injections.
    pending: RefCell<VecDeque<BdevIo>>,
}

ferrite_reactor::reactor_local! {
    /// This core's channels, for `bdev_error_resume_pending`.
    static CHANNELS: RefCell<Vec<(u64, Weak<ErrorCh>)>> = const { RefCell::new(Vec::new()) };
}

struct ErrorChannel(Rc<ErrorCh>);

/// A forwarded request's context: how to finish it when the base gives it back.
#[derive(Debug, Clone, Copy)]
enum Finish {
    /// As the base did.
    Plain,
    /// XOR byte `off` of the data read with `val`.
    CorruptRead { off: u64, val: u8 },
}

impl ErrorCh {
    /// Hands `io` itself on to the base; `mode` says how to finish it.
    fn forward(&self, mut io: BdevIo, finish: Finish) {
        io.set_ctx(finish);
        self.inflight.set(self.inflight.get() + 1);
        self.base.forward_then(io, forward_done);
    }

    /// Writes `req` (a corrupted copy of `io`'s data) to the base on behalf of `io`.
    fn write_copy(&self, io: BdevIo, req: IoRequest) {
        self.inflight.set(self.inflight.get() + 1);
        self.base.submit_child(io, req, copy_done);
    }

    fn submit(&self, io: BdevIo) {
        match io.req.io_type {
            IoType::Abort => return self.abort(io),
            // Pending I/Os were completed by reset_begins; the base gets the reset too.
            IoType::Reset => return self.forward(io, Finish::Plain),
            _ => {}
        }
        let Some((kind, slot)) = self.disk.take(io.req.io_type, self.inflight.get()) else {
            return self.forward(io, Finish::Plain);
        };
        match kind {
            ErrorType::Failure => io.complete_deferred(IoStatus::Failed(libc::EIO)),
            ErrorType::NvmeFailure => {
                let v = slot.nvme.load(Ordering::Relaxed);
                io.complete_deferred(IoStatus::nvme((v >> 8) as u8, v as u8))
            }
            ErrorType::NoMem => io.complete_deferred(IoStatus::NoMem),
            ErrorType::Pending => self.pending.borrow_mut().push_back(io),
            ErrorType::CorruptData => {
                let off = slot.corrupt_offset.load(Ordering::Relaxed);
                let val = slot.corrupt_value.load(Ordering::Relaxed);
                match io.req.io_type {
                    IoType::Write => {
                        // Corrupt a copy: the caller's buffer stays as it was.
                        let mut copy = ferrite_reactor::alloc_buf(io.req.payload_len());
                        let mut pos = 0;
                        for b in io.req.bufs.iter() {
                            copy[pos..pos + b.len()].copy_from_slice(b);
                            pos += b.len();
                        }
                        if let Some(byte) = copy.get_mut(off as usize) {
                            *byte ^= val;
                        }
                        let mut req = IoRequest::new(IoType::Write, io.req.offset_blocks, io.req.num_blocks);
                        req.flags = io.req.flags;
                        req.bufs.push(copy);
                        self.write_copy(io, req);
                    }
                    IoType::Read => self.forward(io, Finish::CorruptRead { off, val }),
                    _ => self.forward(io, Finish::Plain),
                }
            }
        }
    }

    /// Completes held I/Os the abort names; if none, passes the abort to the base.
    fn abort(&self, io: BdevIo) {
        let IoAux::Abort { completer, tag } = io.req.aux else {
            return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
        };
        // Every request of a completer may also be with the base: an abort of all goes on.
        if self.abort_held(&|r| r.is_named_by(completer, tag)) == 0 || tag == ferrite_bdev::io::ALL_TAGS {
            return self.base.forward(io);
        }
        io.complete_deferred(IoStatus::Success);
    }

    /// Completes, as Aborted, the held I/Os `pred` picks; how many.
    fn abort_held(&self, pred: &dyn Fn(&BdevIo) -> bool) -> usize {
        let victims: VecDeque<BdevIo> = {
            let mut p = self.pending.borrow_mut();
            let (v, keep) = std::mem::take(&mut *p).into_iter().partition(|r| pred(r));
            *p = keep;
            v
        };
        let n = victims.len();
        for v in victims {
            v.complete_deferred(IoStatus::Aborted);
        }
        n
    }

    /// Sends every held I/O on (its injection is spent).
    fn resume_pending(&self) -> usize {
        let held = std::mem::take(&mut *self.pending.borrow_mut());
        let n = held.len();
        for io in held {
            self.forward(io, Finish::Plain);
        }
        n
    }
}

/// XORs byte `off` of the request's payload with `val`; a read-only (lent) segment is replaced
/// by a corrupted copy.
fn corrupt_payload(io: &mut BdevIo, off: u64, val: u8) {
    let mut off = off as usize;
    for b in io.req.bufs.iter_mut() {
        if off < b.len() {
            if b.is_read_only() {
                let mut copy = ferrite_reactor::alloc_buf(b.len());
                copy.copy_from_slice(b);
                *b = copy;
            }
            b[off] ^= val;
            return;
        }
        off -= b.len();
    }
}

/// The base gave back a request this channel sent on: one fewer in flight.
fn returned(io: &BdevIo) {
    let ch = io.module_channel::<ErrorCh>().expect("an error bdev's request returns to its channel");
    debug_assert!(ch.inflight.get() > 0, "a request returned that was not in flight");
    ch.inflight.set(ch.inflight.get() - 1);
}

/// The base completed a forwarded request: a read to corrupt is corrupted on its way up.
fn forward_done(mut io: BdevIo, status: IoStatus) {
    returned(&io);
    if let Some(&Finish::CorruptRead { off, val }) = io.ctx::<Finish>() {
        if status.is_ok() {
            corrupt_payload(&mut io, off, val);
        }
    }
    io.complete(status);
}

/// The base completed the corrupted copy of a write.
fn copy_done(parent: BdevIo, child: Completed) {
    returned(&parent);
    let status = child.status;
    drop(child); // the corrupted copy
    parent.complete(status);
}

impl BackendChannel for ErrorChannel {
    fn shared(&self) -> Option<Rc<dyn std::any::Any>> {
        Some(self.0.clone())
    }

    fn lends_reads(&self) -> bool {
        self.0.lends
    }

    #[inline]
    fn submit(&mut self, io: BdevIo) {
        self.0.submit(io);
    }

    fn reset_begins(&mut self) {
        let held = std::mem::take(&mut *self.0.pending.borrow_mut());
        for io in held {
            io.complete_deferred(IoStatus::Aborted);
        }
    }

    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        self.0.abort_held(named)
    }
}

struct ErrorBackend {
    disk: Arc<ErrorDisk>,
}

impl BdevBackend for ErrorBackend {
    fn destruct(&self, done: ferrite_bdev::Destructed) {
        // Every opener has closed the bdev: the base's descriptor (and its claim) can go.
        self.disk.base.close();
        done.finish();
    }

    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let base = self.disk.base.channel()?;
        let bdev_id = self.disk.id.get().copied().unwrap_or(0);
        let ch = Rc::new(ErrorCh {
            disk: self.disk.clone(),
            base,
            lends: self.disk.base.lends_reads(),
            inflight: Cell::new(0),
            pending: RefCell::new(VecDeque::new()),
        });
        CHANNELS.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|(_, w)| w.strong_count() > 0);
            c.push((bdev_id, Rc::downgrade(&ch)));
        });
        Ok(Box::new(ErrorChannel(ch)))
    }

    fn zcopy(&self) -> bool {
        self.disk.base.lends_reads()
    }

    fn base_bdevs(&self) -> Vec<Bdev> {
        vec![self.disk.base.bdev().clone()]
    }

    fn driver_specific(&self) -> Value {
        json!({"error_disk": {"base_bdev": self.disk.base.bdev().name()}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        Some(json!({"method": "bdev_error_create", "params": {
            "base_name": self.disk.base.bdev().name(), "uuid": bdev.uuid().to_string()}}))
    }
}

/// Error disks by bdev id, for injection (per engine).
#[derive(Default)]
struct Disks(Vec<(u64, std::sync::Weak<ErrorDisk>)>);

fn disks() -> ferrite_reactor::StateGuard<Disks> {
    ferrite_reactor::lock_state::<Disks>()
}

fn disk_of(name: &str) -> Result<Arc<ErrorDisk>, BdevError> {
    let b = ferrite_bdev::bdev::lookup(name)
        .filter(|b| b.module() == MODULE)
        .ok_or_else(|| BdevError::NotFound(format!("{name} (no error bdev has this name)")))?;
    let disks = disks();
    disks
        .0
        .iter()
        .find(|(id, _)| *id == b.id())
        .and_then(|(_, w)| w.upgrade())
        .ok_or_else(|| BdevError::NotFound(name.to_string()))
}

/// Creates `EE_<base_name>` over `base_name` (which it opens for writing and claims).
pub fn create(base_name: &str, uuid: Option<&str>) -> Result<Bdev, BdevError> {
    let name = format!("EE_{base_name}");
    ferrite_bdev::bdev::check_name(&name)?;
    let uuid = super::parse_uuid(uuid)?;
    if ferrite_bdev::bdev::lookup(&name).is_some() {
        return Err(BdevError::Exists(name));
    }
    let base = BaseBdev::open(base_name, MODULE)?;
    let props = base.props(name, uuid, "Error Injection Disk", MODULE);
    let disk = Arc::new(ErrorDisk { base: base.clone(), slots: Default::default(), id: Default::default() });
    let bdev = register(props, Arc::new(ErrorBackend { disk: disk.clone() }))?;
    let _ = disk.id.set(bdev.id());
    {
        let mut d = disks();
        d.0.retain(|(_, w)| w.strong_count() > 0);
        d.0.push((bdev.id(), Arc::downgrade(&disk)));
    }
    // Held (pending) I/O would keep the bdev's openers waiting forever once it is being deleted:
    // every core completes its held I/O as Aborted.
    base.on_vbdev_removed(|id| match ferrite_reactor::current() {
        Some(_) => {
            // Fire and forget: each core completes its own held I/O.
            drop(ferrite_reactor::engine().on_all(move |_| abort_pending_here(id)));
        }
        None => {
            abort_pending_here(id);
        }
    });
    base.attach(&bdev);
    Ok(bdev)
}

/// Completes this core's held I/Os of error bdev `bdev_id` as Aborted; returns how many.
fn abort_pending_here(bdev_id: u64) -> usize {
    let chans: Vec<Rc<ErrorCh>> = CHANNELS
        .with(|c| c.borrow().iter().filter(|(id, _)| *id == bdev_id).filter_map(|(_, w)| w.upgrade()).collect());
    let mut n = 0;
    for c in chans {
        for io in std::mem::take(&mut *c.pending.borrow_mut()) {
            io.complete_deferred(IoStatus::Aborted);
            n += 1;
        }
    }
    n
}

/// Arms `inj` for `io_type` (None: every injectable type) of error bdev `name`.
pub fn inject(name: &str, io_type: Option<IoType>, inj: Injection) -> Result<(), BdevError> {
    if inj.error_type == ErrorType::CorruptData && inj.corrupt_value == 0 {
        return Err(BdevError::Invalid("corrupt_value must be non-zero (XOR with 0 corrupts nothing)".into()));
    }
    let disk = disk_of(name)?;
    let idx: Vec<usize> = match io_type {
        None => (0..INJECTABLE.len()).collect(),
        Some(t) => vec![slot_index(t).ok_or_else(|| BdevError::Invalid(format!("cannot inject errors into {t:?}")))?],
    };
    for i in idx {
        let s = &disk.slots[i];
        // Disarm while the other fields change, then publish the count last.
        s.num.store(0, Ordering::Release);
        s.error_type.store(inj.error_type as u8, Ordering::Relaxed);
        s.qd.store(inj.queue_depth, Ordering::Relaxed);
        s.corrupt_offset.store(inj.corrupt_offset, Ordering::Relaxed);
        s.corrupt_value.store(inj.corrupt_value, Ordering::Relaxed);
        s.nvme.store(((inj.nvme_sct as u32) << 8) | inj.nvme_sc as u32, Ordering::Relaxed);
        s.num.store(inj.num, Ordering::Release);
    }
    Ok(())
}

/// Disarms every injection of error bdev `name` (SPDK's io_type "clear").
pub fn clear(name: &str) -> Result<(), BdevError> {
    let disk = disk_of(name)?;
    for s in &disk.slots {
        s.num.store(0, Ordering::Release);
    }
    Ok(())
}

/// Disarms `pending` injections of error bdev `name`; returns its id, for
/// [`resume_pending_here`] on every core.
pub fn disarm_pending(name: &str) -> Result<u64, BdevError> {
    let disk = disk_of(name)?;
    for s in &disk.slots {
        if s.error_type.load(Ordering::Relaxed) == ErrorType::Pending as u8 {
            s.num.store(0, Ordering::Release);
        }
    }
    Ok(ferrite_bdev::bdev::lookup(name).map_or(0, |b| b.id()))
}

/// Sends this core's held I/Os of error bdev `bdev_id` on to the base; returns how many.
pub fn resume_pending_here(bdev_id: u64) -> usize {
    let chans: Vec<Rc<ErrorCh>> = CHANNELS
        .with(|c| c.borrow().iter().filter(|(id, _)| *id == bdev_id).filter_map(|(_, w)| w.upgrade()).collect());
    chans.iter().map(|c| c.resume_pending()).sum()
}
