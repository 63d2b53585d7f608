//! I/O requests, their statuses, and how they travel.
//!
//! A request lives in one `IoState`, taken from a per-thread cache at submission and handed by
//! pointer from hop to hop (caller, channel, module, deferred queue, completion, caller) as
//! SPDK hands its `bdev_io`: no copy of the request per hop and no allocation in steady state.
//! Modules see it as a [`BdevIo`]; callers get it back as a [`Completed`], whose drop returns the
//! state to the cache.

use crate::channel::ChannelInner;
use ferrite_reactor::IoBuf;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

/// Kinds of I/O a bdev may support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IoType {
    /// Read blocks into the request's buffers.
    Read = 0,
    /// Write blocks from the request's buffers.
    Write = 1,
    /// Make previous writes durable.
    Flush = 2,
    /// Discard blocks (reads afterwards return zeroes on every module Ferrite has).
    Unmap = 3,
    /// Write zeroes without a payload.
    WriteZeroes = 4,
    /// Wait until every request submitted earlier on the same channel has completed, then
    /// reach the module (which may reset its device).
    Reset = 5,
    /// Compare the blocks with the request's buffers (Miscompare if they differ).
    Compare = 6,
    /// Compare with `IoAux::Compare`, and if equal write the request's buffers, atomically
    /// against every other write through the bdev layer.
    CompareAndWrite = 7,
    /// Abort the outstanding request named by `IoAux::Abort`.
    Abort = 8,
    /// Copy `num_blocks` from `IoAux::CopyFrom` to `offset_blocks` inside the bdev.
    Copy = 9,
    /// NVMe I/O command passthrough (`IoAux::Nvme`).
    NvmeIo = 10,
    /// NVMe admin command passthrough (`IoAux::Nvme`).
    NvmeAdmin = 11,
    /// The first block at or after `offset_blocks` that is not allocated (`IoState::result`).
    SeekHole = 12,
    /// The first block at or after `offset_blocks` that is allocated (`IoState::result`).
    SeekData = 13,
}

impl IoType {
    /// Every I/O type, in bit order.
    pub const ALL: [IoType; 14] = [
        IoType::Read,
        IoType::Write,
        IoType::Flush,
        IoType::Unmap,
        IoType::WriteZeroes,
        IoType::Reset,
        IoType::Compare,
        IoType::CompareAndWrite,
        IoType::Abort,
        IoType::Copy,
        IoType::NvmeIo,
        IoType::NvmeAdmin,
        IoType::SeekHole,
        IoType::SeekData,
    ];

    /// SPDK's name of the type (keys of `supported_io_types`).
    pub fn name(self) -> &'static str {
        match self {
            IoType::Read => "read",
            IoType::Write => "write",
            IoType::Flush => "flush",
            IoType::Unmap => "unmap",
            IoType::WriteZeroes => "write_zeroes",
            IoType::Reset => "reset",
            IoType::Compare => "compare",
            IoType::CompareAndWrite => "compare_and_write",
            IoType::Abort => "abort",
            IoType::Copy => "copy",
            IoType::NvmeIo => "nvme_io",
            IoType::NvmeAdmin => "nvme_admin",
            IoType::SeekHole => "seek_hole",
            IoType::SeekData => "seek_data",
        }
    }

    /// True for the types whose `bufs` carry block data (`num_blocks × block size` bytes).
    #[inline]
    pub fn has_payload(self) -> bool {
        matches!(self, IoType::Read | IoType::Write | IoType::Compare | IoType::CompareAndWrite)
    }

    /// True for the types that change blocks.
    #[inline]
    pub fn writes(self) -> bool {
        matches!(self, IoType::Write | IoType::Unmap | IoType::WriteZeroes | IoType::CompareAndWrite | IoType::Copy)
    }

    /// True for the types that name a block range checked against the bdev's size.
    #[inline]
    pub fn has_range(self) -> bool {
        !matches!(self, IoType::Reset | IoType::Abort | IoType::NvmeIo | IoType::NvmeAdmin | IoType::Flush)
    }
}

/// A set of I/O types, as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoTypes(pub u16);

impl IoTypes {
    /// Builds a set from a list.
    pub const fn of(types: &[IoType]) -> Self {
        let mut m = 0u16;
        let mut i = 0;
        while i < types.len() {
            m |= 1 << types[i] as u8;
            i += 1;
        }
        Self(m)
    }

    /// True if `t` is in the set.
    #[inline]
    pub fn contains(self, t: IoType) -> bool {
        self.0 & (1 << t as u8) != 0
    }

    /// The set with `t` added.
    pub const fn with(self, t: IoType) -> Self {
        Self(self.0 | (1 << t as u8))
    }

    /// The set with `t` removed.
    pub const fn without(self, t: IoType) -> Self {
        Self(self.0 & !(1 << t as u8))
    }
}

/// Per-request flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoFlags(pub u8);

impl IoFlags {
    /// No flags.
    pub const NONE: IoFlags = IoFlags(0);
    /// Forced unit access: the write is durable when it completes.
    pub const FUA: IoFlags = IoFlags(1);

    /// True if every flag of `f` is set.
    #[inline]
    pub fn contains(self, f: IoFlags) -> bool {
        self.0 & f.0 == f.0
    }
}

/// Where a compare found the first byte that differs: its offset from the start of the compared
/// payload, when the layer or module that compared knows it (SCSI reports it in the sense
/// data's INFORMATION field, four bytes in fixed format). Four bytes, so that [`IoStatus`]
/// stays one word: offsets from 4 GiB - 1 on (a compare that large reads into one buffer of
/// that size, which the layer never does) are unknown.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct DiffOffset(Option<std::num::NonZeroU32>);

impl DiffOffset {
    /// The offset is not known (a module that compares natively and does not say).
    pub const UNKNOWN: DiffOffset = DiffOffset(None);

    /// The first differing byte is `offset` bytes into the payload (unknown from 4 GiB - 1).
    #[inline]
    pub const fn at(offset: u64) -> DiffOffset {
        if offset >= u32::MAX as u64 {
            return DiffOffset::UNKNOWN;
        }
        // Stored plus one, so that the unknown offset is the niche.
        DiffOffset(std::num::NonZeroU32::new(offset as u32 + 1))
    }

    /// The offset, if known.
    #[inline]
    pub const fn get(self) -> Option<u64> {
        match self.0 {
            Some(n) => Some(n.get() as u64 - 1),
            None => None,
        }
    }
}

impl std::fmt::Debug for DiffOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// How an I/O ended. One word (`Copy`), passed in a register: the details that do not fit
/// travel in the request's state (`IoState::result`: an NVMe completion's dword 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Done.
    Success,
    /// The range is beyond the end of the bdev (or zero-length).
    OutOfRange,
    /// The payload does not match the block count, breaks the bdev's declared alignment, or
    /// a write is not made of whole write units (`Limits::split_on_write_unit`).
    Misaligned,
    /// The bdev does not support this I/O type.
    Unsupported,
    /// The bdev is being deleted; no new I/O is accepted.
    Removed,
    /// The module failed the I/O with this errno.
    Failed(i32),
    /// The module (or the layer) is out of a resource for now. Modules answer it; the bdev layer
    /// never hands it to a caller: it queues the request and retries it when resources free.
    NoMem,
    /// Aborted before it finished (by an abort request, a timeout's callback, or teardown).
    Aborted,
    /// A compare found different data, first at `offset` bytes into the payload if known.
    Miscompare {
        /// The first differing byte (SCSI's sense INFORMATION field).
        offset: DiffOffset,
    },
    /// Did not finish within the descriptor's timeout (and was aborted).
    TimedOut,
    /// An NVMe status from an NVMe device or passthrough command, carried whole: with the
    /// completion's Do Not Retry and More bits (its dword 0 is in `IoState::result`).
    Nvme {
        /// Status code type.
        sct: u8,
        /// Status code.
        sc: u8,
        /// Do Not Retry: the device says the same command would fail again.
        dnr: bool,
        /// More: the device's Error Information log page has more about the command.
        more: bool,
    },
    /// A SCSI status and sense from a SCSI device, carried unchanged.
    Scsi {
        /// SCSI status (CHECK CONDITION 02h, RESERVATION CONFLICT 18h, ...).
        status: u8,
        /// Sense key.
        key: u8,
        /// Additional sense code.
        asc: u8,
        /// Additional sense code qualifier.
        ascq: u8,
    },
}

impl IoStatus {
    /// A miscompare whose first differing byte is not known.
    pub const MISCOMPARE: IoStatus = IoStatus::Miscompare { offset: DiffOffset::UNKNOWN };

    /// A request the bdev's reservation refuses to its initiator: NVMe's Reservation Conflict
    /// with Do Not Retry (SCSI's RESERVATION CONFLICT through `translate::scsi_of`).
    pub const RESERVATION_CONFLICT: IoStatus = IoStatus::Nvme {
        sct: crate::translate::codes::nvme::SCT_GENERIC,
        sc: crate::translate::codes::nvme::generic::RESERVATION_CONFLICT,
        dnr: true,
        more: false,
    };

    /// An NVMe status without Do Not Retry or More (a module that makes one up).
    #[inline]
    pub const fn nvme(sct: u8, sc: u8) -> IoStatus {
        IoStatus::Nvme { sct, sc, dnr: false, more: false }
    }

    /// True for `Success`.
    #[inline]
    pub fn is_ok(self) -> bool {
        self == IoStatus::Success
    }

    /// An errno for transports that only speak errno (NBD, FUSE): 0 for success.
    pub fn errno(self) -> i32 {
        match self {
            IoStatus::Success => 0,
            IoStatus::OutOfRange | IoStatus::Misaligned => libc::EINVAL,
            IoStatus::Unsupported => libc::EOPNOTSUPP,
            IoStatus::Removed => libc::ESHUTDOWN,
            IoStatus::Failed(e) => e,
            IoStatus::NoMem => libc::ENOMEM,
            IoStatus::Aborted => libc::ECANCELED,
            IoStatus::Miscompare { .. } => libc::EILSEQ,
            IoStatus::TimedOut => libc::ETIMEDOUT,
            // A remote NVMe namespace (the NVMe/TCP host's bdevs): generic Capacity Exceeded
            // (a full thin volume) and Namespace is Write Protected (a snapshot).
            IoStatus::Nvme { sct: 0, sc: 0x81, .. } => libc::ENOSPC,
            IoStatus::Nvme { sct: 0, sc: 0x20, .. } => libc::EROFS,
            IoStatus::Nvme { .. } | IoStatus::Scsi { .. } => libc::EIO,
        }
    }
}

impl std::fmt::Display for IoStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoStatus::Success => f.write_str("success"),
            IoStatus::OutOfRange => f.write_str("range beyond the end of the bdev"),
            IoStatus::Misaligned => f.write_str("payload does not match the block count or the write unit"),
            IoStatus::Unsupported => f.write_str("I/O type not supported by the bdev"),
            IoStatus::Removed => f.write_str("bdev is being removed"),
            IoStatus::Failed(e) => write!(f, "failed: {}", std::io::Error::from_raw_os_error(*e)),
            IoStatus::NoMem => f.write_str("out of resources"),
            IoStatus::Aborted => f.write_str("aborted"),
            IoStatus::Miscompare { offset } => match offset.get() {
                Some(o) => write!(f, "compare found different data at byte {o}"),
                None => f.write_str("compare found different data"),
            },
            IoStatus::TimedOut => f.write_str("timed out"),
            IoStatus::Nvme { sct, sc, dnr, more } => {
                write!(f, "NVMe status sct {sct:#x} sc {sc:#x}")?;
                if *dnr {
                    f.write_str(" (do not retry)")?;
                }
                if *more {
                    f.write_str(" (more in the error log)")?;
                }
                Ok(())
            }
            IoStatus::Scsi { status, key, asc, ascq } => {
                write!(f, "SCSI status {status:#x} sense {key:#x}/{asc:#x}/{ascq:#x}")
            }
        }
    }
}

/// Payload segments of a request (inline for up to two).
pub type IoBufs = SmallVec<[IoBuf; 2]>;

/// A 64-byte NVMe submission queue entry, for passthrough.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmeCmd(pub [u32; 16]);

/// Arguments that only some I/O types have.
#[derive(Debug, Default)]
pub enum IoAux {
    /// None.
    #[default]
    None,
    /// Compare-and-write: the data to compare with (`bufs` holds the data to write). Boxed so
    /// that every request stays small.
    Compare(Box<IoBufs>),
    /// Copy: the first source block.
    CopyFrom(u64),
    /// Abort: the request to abort, named by its completer (`Rc::as_ptr` address) and tag.
    Abort {
        /// Address of the completer the request was submitted with.
        completer: usize,
        /// Its tag.
        tag: u64,
    },
    /// NVMe passthrough: the command.
    Nvme(Box<NvmeCmd>),
}

/// What a caller asks of a bdev.
#[derive(Debug)]
pub struct IoRequest {
    /// The operation.
    pub io_type: IoType,
    /// Flags (FUA).
    pub flags: IoFlags,
    /// The initiator a target submits it for (see [`IoRequest::for_initiator`]): the layer
    /// checks it against the bdev's reservations. None (internal requests, NBD, a virtual
    /// bdev's children): not checked.
    pub initiator: Option<crate::InitiatorId>,
    /// First block.
    pub offset_blocks: u64,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Payload segments, in order: a scatter-gather list whose total length is
    /// `num_blocks × block size`. Segments may be pool buffers, slices of a shared buffer, lent
    /// or external memory (see `IoBuf`); their lengths need not be block multiples.
    pub bufs: IoBufs,
    /// Separate metadata (DIX), when the bdev has it; none today. Boxed so that every request
    /// stays small.
    pub md: Option<Box<IoBuf>>,
    /// Type-specific arguments.
    pub aux: IoAux,
}

impl IoRequest {
    /// A request of any type, without payload or flags.
    pub fn new(io_type: IoType, offset_blocks: u64, num_blocks: u64) -> Self {
        Self {
            io_type,
            flags: IoFlags::NONE,
            initiator: None,
            offset_blocks,
            num_blocks,
            bufs: IoBufs::new(),
            md: None,
            aux: IoAux::None,
        }
    }

    /// A read of `num_blocks` at `offset_blocks` into `buf`.
    pub fn read(offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self::with_payload(IoType::Read, offset_blocks, num_blocks, buf)
    }

    #[inline]
    fn with_payload(io_type: IoType, offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self {
            io_type,
            flags: IoFlags::NONE,
            initiator: None,
            offset_blocks,
            num_blocks,
            bufs: smallvec::smallvec![buf],
            md: None,
            aux: IoAux::None,
        }
    }

    /// The same request on behalf of `who`: submitted by [`crate::IoChannel::submit`] (or a
    /// fan-out's child), it is refused with [`IoStatus::RESERVATION_CONFLICT`] when the bdev's
    /// reservation forbids `who` its access ([`crate::Access::of`]). Forwarded to a base bdev
    /// it is not checked again.
    #[inline]
    pub fn for_initiator(mut self, who: Option<crate::InitiatorId>) -> Self {
        self.initiator = who;
        self
    }

    /// A zero-copy read of `num_blocks` at `offset_blocks`: the request carries no buffer, and
    /// completes with one or more read-only buffers that the module lends (`IoBuf::is_lent`),
    /// as SPDK's zcopy with populate. Modules that cannot lend get a pool buffer and a plain
    /// read from the bdev layer, so callers need not know which they talk to. Lent data is the
    /// bdev's live memory: a write that lands while the caller still holds it shows through,
    /// as it would for a read racing that write.
    pub fn read_zcopy(offset_blocks: u64, num_blocks: u64) -> Self {
        Self::new(IoType::Read, offset_blocks, num_blocks)
    }

    /// True for a zero-copy read (a read without buffers; see `read_zcopy`).
    #[inline]
    pub fn is_zcopy_read(&self) -> bool {
        self.io_type == IoType::Read && self.bufs.is_empty()
    }

    /// A write of `num_blocks` at `offset_blocks` from `buf`.
    pub fn write(offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self::with_payload(IoType::Write, offset_blocks, num_blocks, buf)
    }

    /// A request without payload (flush, unmap, write zeroes, reset, seek).
    pub fn no_payload(io_type: IoType, offset_blocks: u64, num_blocks: u64) -> Self {
        Self::new(io_type, offset_blocks, num_blocks)
    }

    /// A compare of `num_blocks` at `offset_blocks` with `buf`.
    pub fn compare(offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self::new(IoType::Compare, offset_blocks, num_blocks).with_buf(buf)
    }

    /// Compare `num_blocks` at `offset_blocks` with `cmp`, and if equal write `data` there.
    pub fn compare_and_write(offset_blocks: u64, num_blocks: u64, cmp: IoBuf, data: IoBuf) -> Self {
        let mut r = Self::new(IoType::CompareAndWrite, offset_blocks, num_blocks).with_buf(data);
        r.aux = IoAux::Compare(Box::new(smallvec::smallvec![cmp]));
        r
    }

    /// Copy `num_blocks` from `src_blocks` to `dst_blocks`.
    pub fn copy(dst_blocks: u64, src_blocks: u64, num_blocks: u64) -> Self {
        let mut r = Self::new(IoType::Copy, dst_blocks, num_blocks);
        r.aux = IoAux::CopyFrom(src_blocks);
        r
    }

    /// Abort every request submitted on the same channel with `completer` (any tag): what waits
    /// in the layer and what the module holds and can stop completes as Aborted; what is already
    /// with a device or the kernel completes as it would. For a target that tears a session
    /// down (SCSI ABORT TASK SET, a vhost device reset). The abort itself succeeds.
    pub fn abort_all<C: IoCompleter + ?Sized>(completer: &Rc<C>) -> Self {
        Self::abort(completer, ALL_TAGS)
    }

    /// Abort the request submitted on the same channel with `completer` and `tag`.
    pub fn abort<C: IoCompleter + ?Sized>(completer: &Rc<C>, tag: u64) -> Self {
        let mut r = Self::new(IoType::Abort, 0, 0);
        r.aux = IoAux::Abort { completer: Rc::as_ptr(completer) as *const () as usize, tag };
        r
    }

    /// Adds a payload segment.
    pub fn with_buf(mut self, buf: IoBuf) -> Self {
        self.bufs.push(buf);
        self
    }

    /// Sets flags.
    pub fn with_flags(mut self, flags: IoFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Total payload length in bytes.
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }
}

/// The tag of an abort that names every request of its completer ([`IoRequest::abort_all`]).
pub const ALL_TAGS: u64 = u64::MAX;

/// Receives completions. Called on the core that submitted, never from inside `submit`.
pub trait IoCompleter {
    /// The request submitted with `tag` is done.
    fn io_done(&self, tag: u64, io: Completed);
}

/// Where a request goes when it completes.
pub(crate) enum Done {
    /// Nowhere (a state in the cache).
    None,
    /// To the caller's completer.
    Caller(Rc<dyn IoCompleter>, u64),
    /// To the module of a virtual bdev that submitted it on behalf of `parent`.
    Parent(BdevIo, fn(BdevIo, Completed)),
    /// To a fan-out, as its child number `.1` (see `fanout`; the layer's own splits too).
    Fan(Rc<crate::fanout::FanState>, u32),
}

/// What the outer layer of a forwarded request set aside while an inner layer has it (see
/// `IoChannel::forward`): its per-trip fields, restored when the inner layer completes, and
/// what happens then. The request's `done` stays the outermost layer's throughout. The layer's
/// flags are not kept: a request a module holds has been dispatched (`counted` and `fitted`),
/// and the others only matter before dispatch.
pub(crate) struct Frame {
    ch: Option<Rc<ChannelInner>>,
    epoch: u64,
    track: u32,
    /// Called with the parent back (`forward_then`, whose module context is in `saved_ctx`);
    /// none: the parent completes as the inner layer did, and its module never sees it again.
    then: Option<fn(BdevIo, IoStatus)>,
}

impl Frame {
    const EMPTY: Frame = Frame { ch: None, epoch: 0, track: 0, then: None };
}

/// The frames of a forwarded request, innermost on top. The top one lives in the state itself,
/// so a virtual bdev over a base bdev (one frame) touches no memory but the state's: a frame
/// vector's buffer was one more cache line per request, missed at every completion under load
/// (the data copies of the other requests in flight evict it). Deeper stacks keep the older
/// frames in `below`, whose capacity stays across trips (no allocation in steady state).
pub(crate) struct FrameStack {
    depth: u32,
    /// The innermost frame while `depth > 0` (else empty: no channel held).
    top: Frame,
    below: Vec<Frame>,
}

impl FrameStack {
    fn new() -> Self {
        FrameStack { depth: 0, top: Frame::EMPTY, below: Vec::new() }
    }

    /// How many frames are stacked.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.depth as usize
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.depth == 0
    }

    /// The innermost frame, if any.
    #[inline(always)]
    fn top(&self) -> Option<&Frame> {
        (self.depth > 0).then_some(&self.top)
    }

    /// Makes room for a new innermost frame and returns it (empty) for the caller to fill in
    /// place.
    #[inline(always)]
    fn push_slot(&mut self) -> &mut Frame {
        if self.depth > 0 {
            self.push_below();
        }
        self.depth += 1;
        &mut self.top
    }

    #[cold]
    fn push_below(&mut self) {
        let old = std::mem::replace(&mut self.top, Frame::EMPTY);
        self.below.push(old);
    }

    /// Drops the innermost frame (its fields already taken out); the next one comes on top.
    #[inline(always)]
    fn pop(&mut self) {
        debug_assert!(self.depth > 0 && self.top.ch.is_none(), "popped a frame not taken out");
        self.depth -= 1;
        if self.depth > 0 {
            self.pop_below();
        }
    }

    #[cold]
    fn pop_below(&mut self) {
        self.top = self.below.pop().expect("frames below the top match the depth");
    }

    fn clear(&mut self) {
        self.top = Frame::EMPTY;
        self.below.clear();
        self.depth = 0;
    }
}

/// Bytes of per-I/O context a module may keep in a request (see [`IoState::set_ctx`]).
pub const MODULE_CTX_BYTES: usize = 64;

/// A module's per-I/O context: a plain value (`Copy`, at most [`MODULE_CTX_BYTES`] bytes,
/// aligned to at most 8) that travels with the request, so that no module keeps a table keyed
/// by tag. Every `Copy + 'static` type is one; the bounds on size and alignment are checked
/// when the module is compiled.
pub trait IoCtx: Copy + 'static {}

impl<T: Copy + 'static> IoCtx for T {}

/// Room for one module's context, and the type of the value in it. The type travels with the
/// value, so a module gets back only what it put in, typed.
#[derive(Clone, Copy)]
pub(crate) struct CtxSlot {
    ty: Option<std::any::TypeId>,
    words: [std::mem::MaybeUninit<u64>; MODULE_CTX_BYTES / 8],
}

impl CtxSlot {
    const EMPTY: CtxSlot = CtxSlot { ty: None, words: [std::mem::MaybeUninit::uninit(); MODULE_CTX_BYTES / 8] };

    #[inline(always)]
    fn fits<T: IoCtx>() {
        const {
            assert!(std::mem::size_of::<T>() <= MODULE_CTX_BYTES, "a module context is at most 64 bytes");
            assert!(std::mem::align_of::<T>() <= 8, "a module context is aligned to at most 8");
        }
    }

    #[inline(always)]
    fn set<T: IoCtx>(&mut self, v: T) {
        Self::fits::<T>();
        // SAFETY: the words hold at least size_of::<T>() bytes, aligned to 8 >= align_of::<T>().
        unsafe { self.words.as_mut_ptr().cast::<T>().write(v) };
        self.ty = Some(std::any::TypeId::of::<T>());
    }

    #[inline(always)]
    fn get<T: IoCtx>(&self) -> Option<&T> {
        Self::fits::<T>();
        // SAFETY: `ty` names T only after `set::<T>` wrote a T there, and a T is Copy (no drop).
        (self.ty == Some(std::any::TypeId::of::<T>())).then(|| unsafe { &*self.words.as_ptr().cast::<T>() })
    }

    #[inline(always)]
    fn get_mut<T: IoCtx>(&mut self) -> Option<&mut T> {
        Self::fits::<T>();
        // SAFETY: as in `get`.
        (self.ty == Some(std::any::TypeId::of::<T>())).then(|| unsafe { &mut *self.words.as_mut_ptr().cast::<T>() })
    }
}

/// A request with everything that travels with it.
pub struct IoState {
    /// The request.
    pub req: IoRequest,
    /// Outcome, once completed.
    pub status: IoStatus,
    /// Ticks from submission to completion, once completed (see `ferrite_reactor::tsc`).
    pub latency_ticks: u64,
    /// A result besides the status: the block found by a seek, or an NVMe command's dword 0
    /// (of passthrough, and of every command an NVMe device completed, failed or not, as SPDK
    /// keeps `cdw0` beside the status; a split request gets its first failed child's).
    pub result: u64,
    /// The module's per-I/O context ([`IoState::set_ctx`]). Each layer of a forwarded request
    /// has its own: a virtual bdev finds its context as it left it when the base hands the
    /// request back (`IoChannel::forward_then`).
    ctx: CtxSlot,
    pub(crate) ch: Option<Rc<ChannelInner>>,
    pub(crate) done: Done,
    pub(crate) submit_tick: u64,
    /// The channel epoch it was handed to the module in (see `channel::Epochs`).
    pub(crate) epoch: u64,
    /// True while it is with the module (counted in the channel's epochs).
    pub(crate) counted: bool,
    /// The layer already split or bounced it: a retry after NoMem goes straight to the module.
    pub(crate) fitted: bool,
    /// The caller's segments while a bounce buffer stands in for them.
    pub(crate) bounced: Option<IoBufs>,
    /// A write of a compare-and-write, which holds the range lock it would otherwise wait for.
    pub(crate) lock_bypass: bool,
    /// The id of the compare-and-write lease it runs under (0: none; see `compare`).
    pub(crate) range_lock: u64,
    /// Its slot + 1 in the channel's table of outstanding requests (0: not tracked; see `timeout`).
    pub(crate) track: u32,
    /// Already let through by the QoS limits (see `qos`).
    pub(crate) qos_passed: bool,
    /// The outer layers of a forwarded request, outermost first (see `IoChannel::forward`).
    pub(crate) frames: FrameStack,
    /// The contexts of the modules that forwarded with `forward_then`, innermost last: each gets
    /// its own back (the inner modules may write theirs).
    saved_ctx: Vec<CtxSlot>,
    /// How many frames stood below the layer that bounced the request (`bounced`): only that
    /// layer gives the caller's segments back.
    pub(crate) bounce_depth: u8,
}

ferrite_reactor::reactor_local! {
    /// Boxed on purpose: a state's address is what travels (and what io_uring carries).
    #[allow(clippy::vec_box)]
    static CACHE: RefCell<Vec<Box<IoState>>> = const { RefCell::new(Vec::new()) };
}

/// Most states a thread keeps for reuse.
const CACHE_MAX: usize = 4096;

/// Makes a used state (from the cache, or a completed request) ready for a new trip through
/// the layer: everything but the request and the module's context is set afresh. With
/// `BdevIo::forwarding` and `pop_frame` (a layer's trip inside another's), the places that know
/// the per-trip fields.
///
/// The new `done` is `Done::None`: callers set it right after, where they build it. (Passed in,
/// a `Done` was spilled and copied back by wider loads than the stores that wrote it, which the
/// store buffer cannot forward: a stall of several ns per request.)
#[inline(always)]
fn restart(s: &mut IoState, ch: Option<Rc<ChannelInner>>, submit_tick: u64) {
    s.status = IoStatus::Success;
    s.latency_ticks = 0;
    s.result = 0;
    s.ch = ch;
    s.done = Done::None;
    s.submit_tick = submit_tick;
    s.counted = false;
    s.fitted = false;
    s.lock_bypass = false;
    s.range_lock = 0;
    s.track = 0;
    s.qos_passed = false;
    s.ctx.ty = None;
    debug_assert!(s.bounced.is_none(), "a state between trips holds no bounce buffer");
    debug_assert!(s.frames.is_empty() && s.saved_ctx.is_empty(), "a state between trips is forwarded by nobody");
}

fn take_state(req: IoRequest, ch: Option<Rc<ChannelInner>>, submit_tick: u64) -> Box<IoState> {
    match CACHE.with(|c| c.borrow_mut().pop()) {
        Some(mut s) => {
            s.req = req;
            restart(&mut s, ch, submit_tick);
            s
        }
        None => Box::new(IoState {
            req,
            status: IoStatus::Success,
            latency_ticks: 0,
            result: 0,
            ctx: CtxSlot::EMPTY,
            ch,
            done: Done::None,
            submit_tick,
            epoch: 0,
            counted: false,
            fitted: false,
            bounced: None,
            lock_bypass: false,
            range_lock: 0,
            track: 0,
            qos_passed: false,
            frames: FrameStack::new(),
            saved_ctx: Vec::new(),
            bounce_depth: 0,
        }),
    }
}

fn recycle(mut s: Box<IoState>) {
    // Drop what the state still holds before caching it (buffers go back to their pools).
    s.req.bufs.clear();
    s.req.md = None;
    s.req.aux = IoAux::None;
    s.ch = None;
    s.done = Done::None;
    s.bounced = None;
    s.frames.clear();
    s.saved_ctx.clear();
    let _ = CACHE.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < CACHE_MAX {
            c.push(s);
        }
    });
}

/// A request in flight inside the bdev layer and its module. Dereferences to its [`IoState`].
pub struct BdevIo(ManuallyDrop<Box<IoState>>);

/// A finished request handed back to its caller: status, latency and the request with its
/// buffers (filled, for a successful read). Dereferences to its [`IoState`]; dropping it recycles
/// the state (and drops the buffers still in it).
pub struct Completed(ManuallyDrop<Box<IoState>>);

impl Deref for BdevIo {
    type Target = IoState;
    #[inline]
    fn deref(&self) -> &IoState {
        &self.0
    }
}

impl DerefMut for BdevIo {
    #[inline]
    fn deref_mut(&mut self) -> &mut IoState {
        &mut self.0
    }
}

impl Deref for Completed {
    type Target = IoState;
    #[inline]
    fn deref(&self) -> &IoState {
        &self.0
    }
}

impl DerefMut for Completed {
    #[inline]
    fn deref_mut(&mut self) -> &mut IoState {
        &mut self.0
    }
}

impl Drop for Completed {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        recycle(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

impl Completed {
    /// Takes the request out (its buffers with it).
    pub fn take_req(&mut self) -> IoRequest {
        std::mem::replace(&mut self.req, IoRequest::new(IoType::Read, 0, 0))
    }
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed").field("status", &self.status).field("req", &self.req).finish()
    }
}

impl IoState {
    /// The block size of the bdev the request is for.
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.ch.as_ref().map_or(512, |c| c.block_size)
    }

    /// Byte offset of the request.
    #[inline]
    pub fn offset_bytes(&self) -> u64 {
        self.req.offset_blocks * self.block_size() as u64
    }

    /// Byte length of the request.
    #[inline]
    pub fn len_bytes(&self) -> u64 {
        self.req.num_blocks * self.block_size() as u64
    }

    /// Address of the completer and tag the caller submitted with (what `IoAux::Abort` names).
    pub(crate) fn caller_id(&self) -> Option<(usize, u64)> {
        match &self.done {
            Done::Caller(c, tag) => Some((Rc::as_ptr(c) as *const () as usize, *tag)),
            Done::Parent(p, _) => p.caller_id(),
            _ => None,
        }
    }

    /// Puts the module's per-I/O context in the request (replacing what was there).
    #[inline(always)]
    pub fn set_ctx<T: IoCtx>(&mut self, v: T) {
        self.ctx.set(v)
    }

    /// The module's per-I/O context, if this layer put a `T` in it on this trip.
    #[inline(always)]
    pub fn ctx<T: IoCtx>(&self) -> Option<&T> {
        self.ctx.get()
    }

    /// The module's per-I/O context, to change in place, if this layer put a `T` in it on this
    /// trip.
    #[inline(always)]
    pub fn ctx_mut<T: IoCtx>(&mut self) -> Option<&mut T> {
        self.ctx.get_mut()
    }

    /// The per-core state the module of the request's current layer shares with its requests
    /// ([`crate::BackendChannel::shared`]), if it is a `T`: how a completion path or a
    /// continuation finds its channel without a raw pointer in the request.
    #[inline]
    pub fn module_channel<T: std::any::Any>(&self) -> Option<Rc<T>> {
        let shared = self.ch.as_ref()?.shared.as_ref()?;
        shared.clone().downcast::<T>().ok()
    }

    /// True if an abort of (`completer`, `tag`) names this request.
    pub fn is_named_by(&self, completer: usize, tag: u64) -> bool {
        match self.caller_id() {
            Some((c, t)) => c == completer && (t == tag || tag == ALL_TAGS),
            None => false,
        }
    }
}

impl BdevIo {
    /// A fresh state for `req` on `ch`, whose `done` (`Done::None`) the caller sets next.
    #[inline]
    pub(crate) fn new(req: IoRequest, ch: Rc<ChannelInner>, submit_tick: u64) -> Self {
        BdevIo(ManuallyDrop::new(take_state(req, Some(ch), submit_tick)))
    }

    /// `parent` itself, set up for a trip through `ch` on its behalf: the parent's per-trip
    /// fields go onto its frame stack (and with `then`, its module's context aside), and once
    /// `ch` completes it `then(parent, status)` runs (or, without `then`, the parent completes
    /// with the same status). Nothing is taken from the cache and the request does not move.
    #[inline(always)]
    pub(crate) fn forwarding(mut parent: BdevIo, then: Option<fn(BdevIo, IoStatus)>, ch: Rc<ChannelInner>) -> Self {
        let s = &mut **parent.0;
        debug_assert!(s.counted && s.fitted, "only a request its module holds is forwarded");
        if then.is_some() {
            s.saved_ctx.push(s.ctx);
        }
        // Each field is written straight into the frame's slot: a frame built aside was copied in
        // by wider loads than the stores that built it, which cannot be forwarded from the store
        // buffer (a stall of ~10 ns per forward).
        let outer = s.ch.replace(ch);
        let (epoch, track) = (s.epoch, std::mem::take(&mut s.track));
        let slot = s.frames.push_slot();
        debug_assert!(slot.ch.is_none(), "an empty frame holds no channel");
        slot.ch = outer;
        slot.epoch = epoch;
        slot.track = track;
        slot.then = then;
        s.status = IoStatus::Success;
        s.result = 0;
        s.ctx.ty = None;
        s.counted = false;
        s.fitted = false;
        s.lock_bypass = false;
        s.qos_passed = false;
        parent
    }

    /// A completed request's state, ready to be submitted again as it is on `ch`; the caller
    /// sets its `done` (`Done::None`) next.
    #[inline(always)]
    pub(crate) fn reuse(c: Completed, ch: Rc<ChannelInner>, submit_tick: u64) -> Self {
        let mut c = ManuallyDrop::new(c);
        // SAFETY: `c` is never dropped, so its state is taken exactly once.
        let mut s = unsafe { ManuallyDrop::take(&mut c.0) };
        restart(&mut s, Some(ch), submit_tick);
        BdevIo(ManuallyDrop::new(s))
    }

    fn into_box(self) -> Box<IoState> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the box is moved out exactly once.
        unsafe { ManuallyDrop::take(&mut me.0) }
    }

    /// Completes the request now. Modules call this from a completion path (an io_uring
    /// completion, a poller, a timer, a message), never from inside their `submit`.
    pub fn complete(self, status: IoStatus) {
        let mut st = self.into_box();
        let mut status = status;
        let mut now = 0;
        // A request forwarded by virtual bdevs that complete it as their base did
        // (`IoChannel::forward`) completes on each of their layers in turn, here: no callback.
        loop {
            let Some(ch) = st.ch.take() else {
                st.status = status;
                deliver(st);
                return;
            };
            if matches!(status, IoStatus::NoMem) {
                st.ch = Some(ch.clone());
                ch.retry_later(BdevIo(ManuallyDrop::new(st)));
                return;
            }
            status = if st.track != 0 { crate::timeout::untrack(&ch, &mut st, status) } else { status };
            if now == 0 {
                // Inside another request's completion (a virtual bdev's child completing its
                // parent), that completion's tick serves: one counter read per completion chain.
                now = match COMPLETION_TICK.with(|t| t.get()) {
                    0 => ferrite_reactor::tsc::ticks(),
                    t => t,
                };
            }
            st.latency_ticks = now.wrapping_sub(st.submit_tick);
            if st.counted {
                st.counted = false;
                ch.finished(st.epoch);
            }
            if st.bounced.is_some() && st.bounce_depth as usize == st.frames.len() {
                st.status = status;
                crate::fit::unbounce(&mut st);
            }
            // A split's children are counted as their parent, at the layer that split it, and
            // so is the request a compare-and-write becomes for a module that compares in place.
            let counted = match &st.done {
                Done::Fan(f, _) => !(st.frames.is_empty() && f.is_split()),
                Done::Parent(..) => st.req.io_type != IoType::CompareAndWrite,
                _ => true,
            };
            if counted {
                ch.account(&st.req, status, st.latency_ticks);
            }
            drop(ch);
            match st.frames.top() {
                Some(f) if f.then.is_none() => pop_frame(&mut st),
                _ => break,
            };
        }
        // Stored once, not at each layer: only `unbounce` reads it inside the loop.
        st.status = status;
        // Requests submitted from inside the callback take `now` as their submit time instead
        // of reading the counter again (it costs ~13 ns in a VM); their latency is overstated
        // by the callback's own run time, never understated.
        let outer = COMPLETION_TICK.with(|t| t.replace(now));
        if st.frames.is_empty() {
            deliver(st);
        } else {
            let then = pop_frame(&mut st).expect("a frame left by the loop has a callback");
            then(BdevIo(ManuallyDrop::new(st)), status);
        }
        COMPLETION_TICK.with(|t| t.set(outer));
    }

    /// Completes the request on this core's next loop turn (for modules that finish inside
    /// `submit`, such as null and malloc).
    #[inline]
    pub fn complete_deferred(mut self, status: IoStatus) {
        self.status = status;
        defer(self);
    }

    /// Gives the request up as a raw pointer, for a module that hands it to the kernel as the
    /// io_uring `user_data` (its per-I/O context instead of a table keyed by tag). Get it back
    /// with [`BdevIo::from_raw`], exactly once.
    pub fn into_raw(self) -> u64 {
        Box::into_raw(self.into_box()) as u64
    }

    /// Takes back a request given up with [`BdevIo::into_raw`].
    ///
    /// # Safety
    /// `raw` must come from `into_raw` and not have been taken back before.
    pub unsafe fn from_raw(raw: u64) -> BdevIo {
        // SAFETY: the caller passes a pointer made by Box::into_raw, once.
        BdevIo(ManuallyDrop::new(unsafe { Box::from_raw(raw as *mut IoState) }))
    }

    /// The channel the request runs on.
    pub(crate) fn channel(&self) -> &Rc<ChannelInner> {
        self.ch.as_ref().expect("request in flight has a channel")
    }
}

impl Drop for BdevIo {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        let st = unsafe { ManuallyDrop::take(&mut self.0) };
        if std::thread::panicking() {
            return;
        }
        // A module that drops a request without completing it would leave its caller waiting
        // forever: fail it instead, and say so.
        log::error!("a {:?} request was dropped without completion; failing it", st.req.io_type);
        BdevIo(ManuallyDrop::new(st)).complete(IoStatus::Failed(libc::EIO));
    }
}

/// Gives a forwarded request back to the layer that forwarded it: that layer's fields (and its
/// module's context, if set aside) come off the stacks. Returns the frame's callback.
#[inline(always)]
fn pop_frame(st: &mut IoState) -> Option<fn(BdevIo, IoStatus)> {
    // Moved out field by field, in place: a frame popped whole was copied through the stack and
    // read back by loads straddling the stores that copied it, which stalls.
    debug_assert!(!st.frames.is_empty(), "a forwarded request has its parent's frame");
    let f = &mut st.frames.top;
    st.ch = f.ch.take();
    st.epoch = f.epoch;
    st.track = f.track;
    let then = f.then;
    st.frames.pop();
    if then.is_some() {
        st.ctx = st.saved_ctx.pop().expect("forward_then set the context aside");
    }
    st.counted = true;
    st.fitted = true;
    then
}

fn deliver(mut st: Box<IoState>) {
    match std::mem::replace(&mut st.done, Done::None) {
        Done::Caller(cb, tag) => cb.io_done(tag, Completed(ManuallyDrop::new(st))),
        Done::Parent(parent, f) => f(parent, Completed(ManuallyDrop::new(st))),
        Done::Fan(fan, index) => fan.child_done(index, Completed(ManuallyDrop::new(st))),
        Done::None => recycle(st),
    }
}

ferrite_reactor::reactor_local! {
    /// The tick of the completion whose callback is running, or 0.
    static COMPLETION_TICK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The submit time of a new request: the running completion's tick, or the counter now.
#[inline]
pub(crate) fn submit_tick() -> u64 {
    match COMPLETION_TICK.with(|t| t.get()) {
        0 => ferrite_reactor::tsc::ticks(),
        t => t,
    }
}

ferrite_reactor::reactor_local! {
    /// Functions to run on the next run of the deferred queue.
    static DEFERRED_FNS: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
}

ferrite_reactor::reactor_local! {
    /// Completions waiting for the deferred-queue poller.
    static DEFERRED: RefCell<VecDeque<BdevIo>> = const { RefCell::new(VecDeque::new()) };
}

ferrite_reactor::reactor_local! {
    /// True once this core registered the deferred-queue poller.
    static DEFERRED_POLLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` on the next run of the deferred queue: the core's next loop turn on a reactor,
/// `run_deferred` elsewhere.
pub(crate) fn defer_fn(f: Box<dyn FnOnce()>) {
    DEFERRED_FNS.with(|d| d.borrow_mut().push(f));
    ensure_poller();
}

fn drain() -> usize {
    let fns = DEFERRED_FNS.with(|d| std::mem::take(&mut *d.borrow_mut()));
    let nfns = fns.len();
    for f in fns {
        f();
    }
    // Only the completions queued before this turn: new ones (from resubmissions) wait for the
    // next turn, so a busy caller cannot starve the loop.
    let batch = DEFERRED.with(|d| d.borrow().len());
    if batch == 0 {
        return nfns;
    }
    // One counter read for the whole batch: they all finished by now.
    let outer = COMPLETION_TICK.with(|t| t.replace(ferrite_reactor::tsc::ticks()));
    for _ in 0..batch {
        let Some(io) = DEFERRED.with(|d| d.borrow_mut().pop_front()) else { break };
        let status = io.status;
        io.complete(status);
    }
    COMPLETION_TICK.with(|t| t.set(outer));
    batch + nfns
}

#[inline]
fn defer(io: BdevIo) {
    DEFERRED.with(|d| d.borrow_mut().push_back(io));
    ensure_poller();
}

/// Registers this core's deferred-queue poller once (on a reactor). The check is all a request
/// pays once the poller runs; the registration is out of line.
#[inline(always)]
fn ensure_poller() {
    if !DEFERRED_POLLER.with(|p| p.get()) {
        start_poller();
    }
}

#[cold]
#[inline(never)]
fn start_poller() {
    if ferrite_reactor::current().is_some() {
        DEFERRED_POLLER.with(|p| p.set(true));
        ferrite_reactor::register_poller(|| drain() > 0);
    }
}

/// Completes every deferred request of the calling thread now (for threads without a reactor
/// loop, such as unit tests). Returns how many completed.
pub fn run_deferred() -> usize {
    drain()
}

#[cfg(test)]
mod tests {
    use super::CtxSlot;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct A(u64, u8);
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct B([u32; 16]);

    /// A module gets back only the type it put in, typed; another type reads as none.
    #[test]
    fn a_context_comes_back_only_as_its_own_type() {
        let mut slot = CtxSlot::EMPTY;
        assert!(slot.get::<A>().is_none(), "an empty slot holds nothing");
        slot.set(A(7, 1));
        assert_eq!(slot.get::<A>(), Some(&A(7, 1)));
        assert!(slot.get::<B>().is_none() && slot.get::<u64>().is_none(), "another type reads as none");
        slot.get_mut::<A>().unwrap().0 = 9;
        let saved = slot;
        slot.set(B([3; 16]));
        assert_eq!(slot.get::<B>(), Some(&B([3; 16])), "the whole 64 bytes are room");
        assert!(slot.get::<A>().is_none());
        slot = saved;
        assert_eq!(slot.get::<A>(), Some(&A(9, 1)), "a saved context comes back as it was");
    }

    /// The request is moved once per I/O (into its pooled state): keep it small.
    #[test]
    fn request_stays_small() {
        let n = std::mem::size_of::<super::IoRequest>();
        assert!(n <= 144, "IoRequest grew to {n} bytes");
    }

    /// A status is passed by value through every completion: one word, in a register.
    #[test]
    fn status_stays_one_word() {
        assert_eq!(std::mem::size_of::<super::IoStatus>(), 8);
        assert_eq!(std::mem::size_of::<super::DiffOffset>(), 4);
    }

    #[test]
    fn a_miscompare_offset_round_trips() {
        use super::DiffOffset;
        assert_eq!(DiffOffset::UNKNOWN.get(), None);
        assert_eq!(DiffOffset::default(), DiffOffset::UNKNOWN);
        for o in [0, 1, 511, 4096, u32::MAX as u64 - 1] {
            assert_eq!(DiffOffset::at(o).get(), Some(o));
        }
        assert_eq!(DiffOffset::at(u32::MAX as u64).get(), None, "beyond four bytes: unknown");
        assert_eq!(DiffOffset::at(u64::MAX).get(), None);
    }
}
