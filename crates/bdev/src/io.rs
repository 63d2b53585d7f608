//! I/O requests, their statuses, and how completions reach the caller.

use crate::channel::ChannelInner;
use ferrite_reactor::IoBuf;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::VecDeque;
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
    /// Wait until every request submitted earlier on the same channel has completed (handled
    /// by the bdev layer; it never reaches a module).
    Reset = 5,
}

impl IoType {
    /// Every I/O type, in bit order.
    pub const ALL: [IoType; 6] =
        [IoType::Read, IoType::Write, IoType::Flush, IoType::Unmap, IoType::WriteZeroes, IoType::Reset];

    /// SPDK's name of the type (keys of `supported_io_types`).
    pub fn name(self) -> &'static str {
        match self {
            IoType::Read => "read",
            IoType::Write => "write",
            IoType::Flush => "flush",
            IoType::Unmap => "unmap",
            IoType::WriteZeroes => "write_zeroes",
            IoType::Reset => "reset",
        }
    }

    /// True for the types that carry a payload.
    #[inline]
    pub fn has_payload(self) -> bool {
        matches!(self, IoType::Read | IoType::Write)
    }
}

/// A set of I/O types, as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoTypes(pub u8);

impl IoTypes {
    /// Builds a set from a list.
    pub fn of(types: &[IoType]) -> Self {
        Self(types.iter().fold(0, |m, t| m | (1 << *t as u8)))
    }

    /// True if `t` is in the set.
    #[inline]
    pub fn contains(self, t: IoType) -> bool {
        self.0 & (1 << t as u8) != 0
    }
}

/// How an I/O ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Done.
    Success,
    /// The range is beyond the end of the bdev (or zero-length).
    OutOfRange,
    /// The payload does not match the block count or block size.
    Misaligned,
    /// The bdev does not support this I/O type.
    Unsupported,
    /// The bdev is being deleted; no new I/O is accepted.
    Removed,
    /// The module failed the I/O with this errno.
    Failed(i32),
}

impl IoStatus {
    /// True for `Success`.
    #[inline]
    pub fn is_ok(self) -> bool {
        self == IoStatus::Success
    }
}

impl std::fmt::Display for IoStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoStatus::Success => f.write_str("success"),
            IoStatus::OutOfRange => f.write_str("range beyond the end of the bdev"),
            IoStatus::Misaligned => f.write_str("payload does not match the block count"),
            IoStatus::Unsupported => f.write_str("I/O type not supported by the bdev"),
            IoStatus::Removed => f.write_str("bdev is being removed"),
            IoStatus::Failed(e) => write!(f, "failed: {}", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

/// Payload buffers of a request (inline for the common single-buffer case).
pub type IoBufs = SmallVec<[IoBuf; 1]>;

/// What a caller asks of a bdev.
#[derive(Debug)]
pub struct IoRequest {
    /// The operation.
    pub io_type: IoType,
    /// First block.
    pub offset_blocks: u64,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Payload for reads and writes, in order; total length = num_blocks × block size.
    pub bufs: IoBufs,
}

impl IoRequest {
    /// A read of `num_blocks` at `offset_blocks` into `buf`.
    pub fn read(offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self { io_type: IoType::Read, offset_blocks, num_blocks, bufs: smallvec::smallvec![buf] }
    }

    /// A zero-copy read of `num_blocks` at `offset_blocks`: the request carries no buffer, and
    /// completes with one or more read-only buffers that the module lends (`IoBuf::is_lent`),
    /// as SPDK's zcopy with populate. Modules that cannot lend get a pool buffer and a plain
    /// read from the bdev layer, so callers need not know which they talk to. Lent data is the
    /// bdev's live memory: a write that lands while the caller still holds it shows through,
    /// as it would for a read racing that write.
    pub fn read_zcopy(offset_blocks: u64, num_blocks: u64) -> Self {
        Self { io_type: IoType::Read, offset_blocks, num_blocks, bufs: IoBufs::new() }
    }

    /// True for a zero-copy read (a read without buffers; see `read_zcopy`).
    #[inline]
    pub fn is_zcopy_read(&self) -> bool {
        self.io_type == IoType::Read && self.bufs.is_empty()
    }

    /// A write of `num_blocks` at `offset_blocks` from `buf`.
    pub fn write(offset_blocks: u64, num_blocks: u64, buf: IoBuf) -> Self {
        Self { io_type: IoType::Write, offset_blocks, num_blocks, bufs: smallvec::smallvec![buf] }
    }

    /// A request without payload (flush, unmap, write zeroes, reset).
    pub fn no_payload(io_type: IoType, offset_blocks: u64, num_blocks: u64) -> Self {
        Self { io_type, offset_blocks, num_blocks, bufs: IoBufs::new() }
    }

    /// Total payload length in bytes.
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }
}

/// A finished request handed back to its caller.
#[derive(Debug)]
pub struct Completed {
    /// Outcome.
    pub status: IoStatus,
    /// The request, with its buffers (filled, for a successful read).
    pub req: IoRequest,
    /// Ticks from submission to completion (see `ferrite_reactor::tsc`).
    pub latency_ticks: u64,
}

/// Receives completions. Called on the core that submitted, never from inside `submit`.
pub trait IoCompleter {
    /// The request submitted with `tag` is done.
    fn io_done(&self, tag: u64, io: Completed);
}

/// A request in flight inside the bdev layer and its module.
pub struct BdevIo {
    /// The request.
    pub req: IoRequest,
    pub(crate) ch: Rc<ChannelInner>,
    pub(crate) done: Rc<dyn IoCompleter>,
    pub(crate) tag: u64,
    pub(crate) submit_tick: u64,
    /// True once handed to the module (counted in the channel's in-flight requests).
    pub(crate) counted: bool,
}

impl BdevIo {
    /// The block size of the bdev the request is for.
    #[inline]
    pub fn block_size(&self) -> u32 {
        self.ch.block_size
    }

    /// Byte offset of the request.
    #[inline]
    pub fn offset_bytes(&self) -> u64 {
        self.req.offset_blocks * self.ch.block_size as u64
    }

    /// Byte length of the request.
    #[inline]
    pub fn len_bytes(&self) -> u64 {
        self.req.num_blocks * self.ch.block_size as u64
    }

    /// Completes the request now. Modules call this from a completion path (an io_uring
    /// completion, a poller, a message), never from inside their `submit`.
    pub fn complete(self, status: IoStatus) {
        let now = ferrite_reactor::tsc::ticks();
        let latency_ticks = now.wrapping_sub(self.submit_tick);
        self.ch.account(&self.req, status, latency_ticks);
        if self.counted {
            self.ch.finished();
        }
        let BdevIo { req, ch, done, tag, .. } = self;
        drop(ch);
        // Requests submitted from inside the callback take `now` as their submit time instead
        // of reading the counter again (it costs ~13 ns in a VM); their latency is overstated
        // by the callback's own run time, never understated.
        COMPLETION_TICK.with(|t| t.set(now));
        done.io_done(tag, Completed { status, req, latency_ticks });
        COMPLETION_TICK.with(|t| t.set(0));
    }

    /// Completes the request on this core's next loop turn (for modules that finish inside
    /// `submit`, such as null and malloc).
    pub fn complete_deferred(self, status: IoStatus) {
        defer(self, status);
    }
}

thread_local! {
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

thread_local! {
    static DEFERRED: RefCell<VecDeque<(BdevIo, IoStatus)>> = const { RefCell::new(VecDeque::new()) };
    static DEFERRED_POLLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn drain() -> usize {
    // Only the completions queued before this turn: new ones (from resubmissions) wait for the
    // next turn, so a busy caller cannot starve the loop.
    let batch = DEFERRED.with(|d| d.borrow().len());
    for _ in 0..batch {
        let Some((io, status)) = DEFERRED.with(|d| d.borrow_mut().pop_front()) else { break };
        io.complete(status);
    }
    batch
}

#[inline]
fn defer(io: BdevIo, status: IoStatus) {
    DEFERRED.with(|d| d.borrow_mut().push_back((io, status)));
    if !DEFERRED_POLLER.with(|p| p.replace(true)) && ferrite_reactor::current().is_some() {
        ferrite_reactor::register_poller(|| drain() > 0);
    }
}

/// Completes every deferred request of the calling thread now (for threads without a reactor
/// loop, such as unit tests). Returns how many completed.
pub fn run_deferred() -> usize {
    drain()
}
