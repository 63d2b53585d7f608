//! Bdevs: named block devices, their backends (what a module implements), and the registry.

use crate::desc::{BdevDesc, BdevEvent, Claim, ClaimType, DescEntry};
use crate::io::{BdevIo, IoType, IoTypes};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Errors of the bdev layer's control operations (create, open, claim, delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BdevError {
    /// No bdev has this name or alias.
    NotFound(String),
    /// A bdev (or alias) with this name exists.
    Exists(String),
    /// A parameter is out of range or inconsistent.
    Invalid(String),
    /// Another module holds a claim, or a writer blocks the claim.
    Claimed(String),
    /// The bdev is being deleted.
    Removing(String),
    /// An operating-system error (file missing, permission, ...).
    Os(String),
    /// An operating-system error with its errno (answered as SPDK answers it: -errno).
    Errno(i32, String),
    /// Not enough memory.
    NoMemory(String),
    /// The bdev is in use in a way that forbids the change.
    Busy(String),
}

impl std::fmt::Display for BdevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BdevError::NotFound(n) => write!(f, "bdev {n} not found"),
            BdevError::Exists(n) => write!(f, "bdev {n} already exists"),
            BdevError::Invalid(m)
            | BdevError::Os(m)
            | BdevError::NoMemory(m)
            | BdevError::Busy(m)
            | BdevError::Errno(_, m) => f.write_str(m),
            BdevError::Claimed(m) => f.write_str(m),
            BdevError::Removing(n) => write!(f, "bdev {n} is being removed"),
        }
    }
}

impl std::error::Error for BdevError {}

impl BdevError {
    /// The errno SPDK would report for this error (used as the JSON-RPC error code).
    pub fn errno(&self) -> i32 {
        match self {
            BdevError::NotFound(_) => libc::ENODEV,
            BdevError::Exists(_) => libc::EEXIST,
            BdevError::Invalid(_) => libc::EINVAL,
            BdevError::Claimed(_) => libc::EPERM,
            BdevError::Removing(_) => libc::EBUSY,
            BdevError::Os(_) => libc::EIO,
            BdevError::Errno(e, _) => *e,
            BdevError::NoMemory(_) => libc::ENOMEM,
            BdevError::Busy(_) => libc::EBUSY,
        }
    }
}

/// The per-core half of a backend: receives requests on one core.
pub trait BackendChannel {
    /// Starts `io`. The module completes it later with `io.complete(..)` or
    /// `io.complete_deferred(..)`, exactly once, and never calls `complete` inside `submit`.
    fn submit(&mut self, io: BdevIo);
    /// True if the module serves zero-copy reads (`IoRequest::read_zcopy`) by lending its own
    /// memory; otherwise the bdev layer turns them into plain reads into a pool buffer.
    fn lends_reads(&self) -> bool {
        false
    }
    /// True if the module compares and writes in one pass once the layer has made the blocks
    /// its own: the layer then sends each compare-and-write, under its lease (no other write
    /// to the blocks reaches the module meanwhile, see `compare`), as one
    /// `IoType::CompareAndWrite` request instead of a read and a write. The module compares
    /// the blocks with the request's `IoAux::Compare` data ([`crate::first_difference`]),
    /// completes `IoStatus::Miscompare` with the offset if they differ and otherwise writes
    /// `bufs`. A module that is atomic by itself (an NVMe namespace's fused pair) lists
    /// `IoType::CompareAndWrite` in its I/O types instead. Asked once, when the channel is made.
    fn compares_in_place(&self) -> bool {
        false
    }
    /// Aborts the requests the module holds that `named` picks (an abort request of a caller),
    /// completing each with `IoStatus::Aborted`; returns how many. Modules that hold no request
    /// they could stop (the I/O is already with a device) keep the default. Modules that list
    /// `IoType::Abort` in their I/O types get abort requests in `submit` instead (virtual bdevs,
    /// which pass them on to their base bdev).
    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        let _ = named;
        0
    }
    /// A reset arrived on this channel; it reaches `submit` once every request handed to the
    /// module before it has completed. Modules that hold requests which would not complete on
    /// their own (pending fault injection, delayed completions) complete them now, as
    /// `IoStatus::Aborted` with `complete_deferred`, as SPDK's modules do on reset.
    fn reset_begins(&mut self) {}
    /// The channel a module that forwards every request unchanged (a passthru) forwards them
    /// to: the layer then forwards each request there itself with `IoChannel::forward`, which
    /// saves a call into the module per I/O, and never calls `submit`. Asked once, when the
    /// channel is made.
    fn forwards_to(&self) -> Option<crate::channel::IoChannel> {
        None
    }
    /// For a module that forwards the reads and writes of some of its blocks to one base bdev
    /// (same block size), moving only their offset (an lvol): that base's channel, and the
    /// counter that moves whenever the mapping may have changed. The layer then forwards the
    /// reads and writes that [`BackendChannel::linear_map`] covers itself, without a call into
    /// the module. Asked once, when the channel is made.
    fn linear_base(&self) -> Option<(crate::channel::IoChannel, Arc<AtomicU64>)> {
        None
    }
    /// The blocks the layer may forward to the `linear_base`, and how their offset moves, as
    /// the module's mapping is now (the module first brings its own view up to date): asked
    /// when the channel is made and whenever the counter moved. None: every request goes to
    /// `submit`. The answer holds until the counter moves.
    fn linear_map(&mut self) -> Option<LinearMap> {
        None
    }
    /// The module's per-core state that its requests may reach: a request held by the module
    /// gets it back, typed, with `IoState::module_channel` (in a completion path or a
    /// `forward_then` continuation), so that no module keeps a raw pointer to its channel in a
    /// request. Asked once, when the channel is made.
    fn shared(&self) -> Option<std::rc::Rc<dyn std::any::Any>> {
        None
    }
    /// The module's own channel state, for `Bdev::for_each_channel` callbacks to downcast.
    fn as_any(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

/// A linear part of a module's mapping of its bdev onto a base bdev
/// ([`BackendChannel::linear_map`]): blocks `0..end` of the bdev are blocks `shift..shift + end`
/// of the base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearMap {
    /// Added to the offset of a request within the range.
    pub shift: u64,
    /// The first block past the range.
    pub end: u64,
}

/// What a bdev module implements for each bdev it creates.
pub trait BdevBackend: Send + Sync + 'static {
    /// Makes this core's channel. Called on the core that will submit through it.
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError>;
    /// The backend itself, for its module's RPCs to downcast (e.g. a rescan).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
    /// True if the module lends its memory for zero-copy reads (`zcopy` in `bdev_get_bdevs`).
    fn zcopy(&self) -> bool {
        false
    }
    /// The `driver_specific` object of `bdev_get_bdevs`.
    fn driver_specific(&self) -> Value {
        Value::Object(Default::default())
    }
    /// The bdevs this one stands on and forwards to (a passthru's base), so that callers can
    /// find what is stacked over a bdev ([`stacked_over`]).
    fn base_bdevs(&self) -> Vec<Bdev> {
        Vec::new()
    }
    /// Releases the bdev's resources (its base descriptors, its memory): called once, after
    /// the bdev was unregistered and its last descriptor closed, on the core that closed it.
    /// The module finishes `done` when it is through, now or later (an asynchronous release);
    /// `unregister`'s receiver fires then. The default releases nothing.
    fn destruct(&self, done: crate::lifecycle::Destructed) {
        done.finish();
    }
    /// The `{"method":..,"params":..}` entry that recreates this bdev in a saved config (or an
    /// array of such entries, written in order: a module whose calls make several bdevs).
    fn config_entry(&self, bdev: &Bdev) -> Option<Value>;
}

/// What a module can take in one request; the bdev layer splits and bounces requests to fit, so
/// callers never have to. Zero means "no limit" for every count and size. Each field names its
/// SPDK counterpart (`struct spdk_bdev`), which is what a SCSI or virtio target advertises
/// (Block Limits VPD page, virtio-blk config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per physical block (0: the logical block size). SPDK: `phys_blocklen`.
    pub physical_block_size: u32,
    /// Required alignment, in bytes, of every segment's address (1: none; a power of two).
    /// Segments that break it are bounced through aligned pool buffers, one by one. SPDK:
    /// `required_alignment` (as a power of two).
    pub buf_align: u32,
    /// Every segment's length must be a multiple of this many bytes (1: any length; a power of
    /// two), apart from the address rule: O_DIRECT needs both, a module that only needs its
    /// buffers' starts aligned does not. Segments that break it are bounced as misaligned ones.
    /// SPDK has no field of its own for it (its `max_segment_size` and SGL rules cover it).
    pub seg_len_align: u32,
    /// Optimal I/O boundary in blocks (0: none). SPDK: `optimal_io_boundary`.
    pub optimal_io_boundary: u32,
    /// Split reads and writes that cross the optimal I/O boundary. SPDK:
    /// `split_on_optimal_io_boundary`.
    pub split_on_optimal_io_boundary: bool,
    /// Most blocks per read or write. SPDK: `max_rw_size`.
    pub max_io_blocks: u32,
    /// Most payload segments per request. SPDK: `max_num_segments`.
    pub max_segments: u32,
    /// Most bytes per segment (a multiple of the block size). SPDK: `max_segment_size`.
    pub max_segment_size: u32,
    /// Most blocks per unmap range. SPDK: `max_unmap`.
    pub max_unmap_blocks: u64,
    /// Most ranges per unmap command the module sends (an NVMe Dataset Management command's
    /// ranges, a SCSI UNMAP's block descriptors; 0: one). An unmap request covers at most
    /// `max_unmap_blocks × max_unmap_segments` blocks; longer ones are split. SPDK:
    /// `max_unmap_segments`.
    pub max_unmap_segments: u32,
    /// Unmaps free space in units of this many blocks (0: no preference): a smaller or
    /// unaligned unmap may free nothing (an lvol frees whole clusters). Advertised, not
    /// enforced. SPDK: `preferred_unmap_granularity`.
    pub unmap_granularity: u32,
    /// The first unit of `unmap_granularity` starts at this block. Advertised, not enforced.
    /// SPDK: `preferred_unmap_alignment`.
    pub unmap_alignment: u32,
    /// Most blocks per write-zeroes. SPDK: `max_write_zeroes`.
    pub max_write_zeroes_blocks: u64,
    /// Blocks per write unit (0 or 1: one block). SPDK: `write_unit_size`.
    pub write_unit_size: u32,
    /// Writes must be made of whole write units: a write whose offset or length is not a
    /// multiple of `write_unit_size` fails (`IoStatus::Misaligned`, SPDK fails it too), and a
    /// longer one is split into one child per unit (a RAID5f full-stripe write). For writes the
    /// unit replaces the optimal I/O boundary, as in SPDK. SPDK: `split_on_write_unit`.
    pub split_on_write_unit: bool,
    /// Most blocks per copy; longer copies are split into children of this size, as SPDK's
    /// `bdev_copy_split` does. SPDK: `max_copy`.
    pub max_copy_blocks: u64,
    /// Blocks written atomically (0 or 1: one block). SPDK: `acwu` (compare and write).
    pub atomic_write_unit: u32,
    /// The bdev has a volatile write cache (flush makes writes durable). SPDK: `write_cache`.
    pub write_cache: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            physical_block_size: 0,
            buf_align: 1,
            seg_len_align: 1,
            optimal_io_boundary: 0,
            split_on_optimal_io_boundary: false,
            max_io_blocks: 0,
            max_segments: 0,
            max_segment_size: 0,
            max_unmap_blocks: 0,
            max_unmap_segments: 0,
            unmap_granularity: 0,
            unmap_alignment: 0,
            max_write_zeroes_blocks: 0,
            write_unit_size: 0,
            split_on_write_unit: false,
            max_copy_blocks: 0,
            atomic_write_unit: 0,
            write_cache: false,
        }
    }
}

impl Limits {
    /// True if a read or write may need fitting (alignment, boundary, write unit, size or
    /// segment limits).
    pub(crate) fn shape_payload(&self) -> bool {
        self.buf_align > 1
            || self.seg_len_align > 1
            || self.split_boundary() > 0
            || self.split_on_write_unit
            || self.max_io_blocks > 0
            || self.max_segments > 0
            || self.max_segment_size > 0
    }

    /// The optimal I/O boundary requests are split at (0: none).
    pub(crate) fn split_boundary(&self) -> u64 {
        if self.split_on_optimal_io_boundary {
            self.optimal_io_boundary as u64
        } else {
            0
        }
    }

    /// The write unit writes are split at and checked against (0: none).
    #[inline]
    pub(crate) fn write_unit(&self) -> u64 {
        if self.split_on_write_unit {
            u64::from(self.write_unit_size.max(1))
        } else {
            0
        }
    }

    /// The masks a segment's address and length must clear (zero: no rule), as the channel
    /// keeps them for the bounce check of every read and write it fits.
    #[inline]
    pub(crate) fn seg_masks(&self) -> (usize, usize) {
        (self.buf_align as usize - 1, self.seg_len_align as usize - 1)
    }

    /// Most blocks per unmap request (0: no limit): the ranges of one command.
    #[inline]
    pub(crate) fn max_unmap_request(&self) -> u64 {
        self.max_unmap_blocks.saturating_mul(u64::from(self.max_unmap_segments.max(1)))
    }

    /// True if splitting at the boundary is the only thing that shapes payloads (no alignment,
    /// write unit, size or segment limit), as for an lvol.
    pub(crate) fn boundary_only(&self) -> bool {
        self.split_boundary() > 0
            && self.buf_align <= 1
            && self.seg_len_align <= 1
            && !self.split_on_write_unit
            && self.max_io_blocks == 0
            && self.max_segments == 0
            && self.max_segment_size == 0
    }

    fn check(&self, block_size: u32) -> Result<(), BdevError> {
        let pbs = self.physical_block_size;
        if pbs != 0 && (pbs < block_size || !pbs.is_multiple_of(block_size)) {
            return Err(BdevError::Invalid(format!(
                "physical_block_size {pbs} must be a multiple of the block size {block_size}"
            )));
        }
        for (name, a) in [("buffer alignment", self.buf_align), ("segment length alignment", self.seg_len_align)] {
            if !a.is_power_of_two() || a > 65536 {
                return Err(BdevError::Invalid(format!("{name} {a} must be a power of two")));
            }
        }
        if !block_size.is_multiple_of(self.seg_len_align) {
            return Err(BdevError::Invalid(format!(
                "segment length alignment {} must divide the block size {block_size}",
                self.seg_len_align
            )));
        }
        if self.max_segment_size != 0 && !self.max_segment_size.is_multiple_of(block_size) {
            return Err(BdevError::Invalid(format!(
                "max_segment_size {} must be a multiple of the block size {block_size}",
                self.max_segment_size
            )));
        }
        let unit = self.write_unit();
        if unit > 1 && self.max_io_blocks != 0 && u64::from(self.max_io_blocks) < unit {
            return Err(BdevError::Invalid(format!(
                "max_rw_size {} is smaller than the write unit {unit}",
                self.max_io_blocks
            )));
        }
        if unit > 1 && self.max_segment_size != 0 && self.max_segments != 0 {
            let most = u64::from(self.max_segment_size) * u64::from(self.max_segments);
            if most < unit * u64::from(block_size) {
                return Err(BdevError::Invalid(format!(
                    "{} segments of {} bytes cannot carry a write unit of {unit} blocks",
                    self.max_segments, self.max_segment_size
                )));
            }
        }
        Ok(())
    }
}

/// Properties a module gives when it registers a bdev.
#[derive(Debug, Clone)]
pub struct BdevProps {
    /// Unique name.
    pub name: String,
    /// Other names it can be opened by.
    pub aliases: Vec<String>,
    /// Stable identity; random when not given.
    pub uuid: Option<uuid::Uuid>,
    /// Bytes per block (a multiple of 512, from 512 to 64 KiB).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Human-readable kind, e.g. "Malloc disk".
    pub product_name: &'static str,
    /// Module that owns it, e.g. "malloc".
    pub module: &'static str,
    /// I/O types the module serves.
    pub io_types: IoTypes,
    /// What one request may be.
    pub limits: Limits,
}

/// A registered bdev's state, shared by every core. Laid out in declaration order, with what
/// every request's checks read first (one cache line, with the `Arc`'s counts; see
/// `ChannelInner` for why lines count).
#[repr(C)]
pub(crate) struct BdevShared {
    pub(crate) num_blocks: AtomicU64,
    /// The types the layer admits (`IoTypes` bits): those the bdev serves ([`Bdev::supports`])
    /// while it is not being removed, none from then on. Every channel's check reads it (one
    /// load, one branch), so a type the bdev stops serving is refused at once, on channels
    /// made before too. Bits are only ever cleared.
    pub(crate) admits: AtomicU16,
    /// The module's I/O types (`IoTypes` bits): only ever fewer ([`Bdev::stop_serving`]).
    pub(crate) io_types: AtomicU16,
    pub(crate) block_size: u32,
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) aliases: Mutex<Vec<String>>,
    pub(crate) uuid: uuid::Uuid,
    pub(crate) product_name: &'static str,
    pub(crate) module: &'static str,
    pub(crate) limits: Limits,
    pub(crate) backend: Arc<dyn BdevBackend>,
    pub(crate) removing: AtomicBool,
    pub(crate) state: Mutex<OpenState>,
    /// Held and requested LBA range locks (see `range_lock`): touched when a lock is taken or
    /// released and when a channel is made, never by I/O.
    pub(crate) locks: Mutex<crate::range_lock::LockTable>,
    /// The engine it was registered on (None off the reactors): where its locks' messages go.
    pub(crate) engine: Option<ferrite_reactor::Engine>,
    /// QoS rate limits (see `qos`).
    pub(crate) qos: crate::qos::QosShared,
    /// The latency histogram setting (see `histogram`).
    pub(crate) histogram: crate::histogram::HistShared,
    /// Descriptors' I/O timeouts (see `timeout`).
    pub(crate) timeouts: crate::timeout::TimeoutShared,
    /// Persistent reservations (see `reservation`).
    pub(crate) reservations: crate::reservation::Reservations,
    /// The bdev that made this one for its own use (a nexus's `uring:///` child), if any: its
    /// own config entry makes this one again, so save_config leaves this one out.
    pub(crate) made_for: Mutex<Option<String>>,
}

/// Who has the bdev open, who claims it, and who waits for its removal.
#[derive(Default)]
pub(crate) struct OpenState {
    pub(crate) descs: Vec<DescEntry>,
    pub(crate) claims: Vec<Claim>,
    pub(crate) removed_waiters: Vec<ferrite_reactor::oneshot::Sender<()>>,
    /// The module's destruct was called (see `lifecycle`).
    pub(crate) destruct_started: bool,
}

/// A registered block device. Cheap to clone; immutable properties are readable from any core.
#[derive(Clone)]
pub struct Bdev(pub(crate) Arc<BdevShared>);

impl Bdev {
    /// Unique name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// Aliases.
    pub fn aliases(&self) -> Vec<String> {
        self.0.aliases.lock().unwrap().clone()
    }

    /// Replaces alias `old` by `new` (SPDK's `spdk_bdev_alias_del` and `_add`, as an lvol
    /// rename does). Fails if `new` names another bdev or alias, or `old` is not an alias.
    pub fn rename_alias(&self, old: &str, new: &str) -> Result<(), BdevError> {
        let mut reg = registry();
        if !self.0.aliases.lock().unwrap().iter().any(|a| a == old) {
            return Err(BdevError::NotFound(format!("{old} (not an alias of {})", self.name())));
        }
        if old == new {
            return Ok(());
        }
        if reg.by_name.contains_key(new) || reg.aliases.contains_key(new) {
            return Err(BdevError::Exists(new.to_string()));
        }
        if reg.by_name.get(self.name()).is_some_and(|b| b.id() == self.id()) {
            reg.aliases.remove(old);
            reg.aliases.insert(new.to_string(), self.name().to_string());
        }
        let mut a = self.0.aliases.lock().unwrap();
        for x in a.iter_mut().filter(|x| *x == old) {
            *x = new.to_string();
        }
        Ok(())
    }
    /// Records that `owner` made this bdev for its own use and makes it again from its own
    /// config entry: save_config then leaves this bdev out (else, after a restart, the bdev would
    /// exist before its owner, which would find it instead of making it, and not remove it).
    pub fn set_made_for(&self, owner: &str) {
        *self.0.made_for.lock().unwrap() = Some(owner.to_string());
    }
    /// The bdev that made this one for its own use ([`Bdev::set_made_for`]), if any.
    pub fn made_for(&self) -> Option<String> {
        self.0.made_for.lock().unwrap().clone()
    }
    /// UUID.
    pub fn uuid(&self) -> uuid::Uuid {
        self.0.uuid
    }
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.0.block_size
    }
    /// Number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.0.num_blocks.load(Ordering::Relaxed)
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks() * self.0.block_size as u64
    }
    /// Product name.
    pub fn product_name(&self) -> &'static str {
        self.0.product_name
    }
    /// Owning module.
    pub fn module(&self) -> &'static str {
        self.0.module
    }
    /// True if the bdev serves `t`: its module does, or the bdev layer does it for the module
    /// (reset and abort always; compare and compare-and-write from reads and writes).
    pub fn supports(&self, t: IoType) -> bool {
        served_types(self.module_io_types()).contains(t)
    }
    /// The I/O types its module serves now.
    pub(crate) fn module_io_types(&self) -> IoTypes {
        IoTypes(self.0.io_types.load(Ordering::Relaxed))
    }
    /// The bdev no longer serves `types` (an lvol made read-only no longer writes): what it
    /// reports changes now, the layer refuses them from now on on every channel (see
    /// `ChannelInner::refused`), and every opener gets an `IoTypesChanged` event if it served
    /// any of them.
    /// Requests already handed to the module finish there.
    pub fn stop_serving(&self, types: IoTypes) {
        let notify = {
            let st = self.0.state.lock().unwrap();
            let before = self.0.io_types.fetch_and(!types.0, Ordering::Relaxed);
            let gone = IoTypes(before & types.0);
            if gone.0 == 0 {
                return;
            }
            // Cleared, never set: a removal's zero stays.
            let kept = served_types(IoTypes(before & !types.0));
            self.0.admits.fetch_and(kept.0, Ordering::Relaxed);
            let names: Vec<&str> = IoType::ALL.iter().filter(|t| gone.contains(**t)).map(|t| t.name()).collect();
            log::info!("bdev {} no longer serves {}", self.name().escape_debug(), names.join(", "));
            st.descs.iter().map(|d| (d.core.clone(), d.on_event.clone())).collect::<Vec<_>>()
        };
        notify_all(notify, BdevEvent::IoTypesChanged);
    }
    /// What one request may be.
    pub fn limits(&self) -> &Limits {
        &self.0.limits
    }
    /// Bytes per physical block.
    pub fn physical_block_size(&self) -> u32 {
        match self.0.limits.physical_block_size {
            0 => self.0.block_size,
            p => p,
        }
    }
    /// Internal identity (unique for the life of the process).
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// The module that holds the (first) claim, if any.
    pub fn claimed_by(&self) -> Option<String> {
        self.0.state.lock().unwrap().claims.first().map(|c| c.module.clone())
    }
    /// The kind of the claims held, if any (all claims on a bdev are of one kind).
    pub fn claim_type(&self) -> Option<ClaimType> {
        self.0.state.lock().unwrap().claims.first().map(|c| c.kind)
    }
    /// Every claim held: module and kind.
    pub fn claims(&self) -> Vec<(String, ClaimType)> {
        self.0.state.lock().unwrap().claims.iter().map(|c| (c.module.clone(), c.kind)).collect()
    }
    /// The backend (for `driver_specific` and config).
    pub fn backend(&self) -> &Arc<dyn BdevBackend> {
        &self.0.backend
    }
    /// True once deletion started.
    pub fn is_removing(&self) -> bool {
        self.0.removing.load(Ordering::Relaxed)
    }
    /// The bdev's persistent reservations, shared by every target that exports it.
    pub fn reservations(&self) -> &crate::reservation::Reservations {
        &self.0.reservations
    }
    /// Number of open descriptors.
    pub fn open_count(&self) -> usize {
        self.0.state.lock().unwrap().descs.len()
    }

    /// Opens the bdev by name or alias. `on_remove` runs on the opening core when the bdev starts
    /// being deleted; the opener must then stop submitting, let in-flight I/O finish, and drop the
    /// descriptor.
    pub fn open(name: &str, write: bool, on_remove: impl Fn() + Send + Sync + 'static) -> Result<BdevDesc, BdevError> {
        Self::open_ext(name, write, move |e| {
            if e == BdevEvent::Remove {
                on_remove()
            }
        })
    }

    /// Opens the bdev by name, alias or UUID with an event callback (remove, resize), run on
    /// the opening core (SPDK's `spdk_bdev_open_ext`).
    pub fn open_ext(
        name: &str,
        write: bool,
        on_event: impl Fn(BdevEvent) + Send + Sync + 'static,
    ) -> Result<BdevDesc, BdevError> {
        let bdev = lookup(name).ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        BdevDesc::open(bdev, write, Arc::new(on_event))
    }

    /// Changes the block count (a module whose device grew or shrank calls it) and tells every
    /// opener with a `Resize` event. Shrinking is refused while the bdev is open (requests
    /// beyond the new end could be in flight), as SPDK does.
    pub fn notify_resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        check_geometry(self.block_size(), num_blocks)?;
        let notify = {
            let st = self.0.state.lock().unwrap();
            if num_blocks < self.num_blocks() && !st.descs.is_empty() {
                return Err(BdevError::Busy(format!("bdev {} is open; it cannot shrink", self.name())));
            }
            self.0.num_blocks.store(num_blocks, Ordering::SeqCst);
            st.descs.iter().map(|d| (d.core.clone(), d.on_event.clone())).collect::<Vec<_>>()
        };
        log::info!("bdev {} resized to {num_blocks} blocks", self.name().escape_debug());
        notify_all(notify, BdevEvent::Resize);
        Ok(())
    }

    /// The bdev's queue depth over every core ([`crate::IoChannel::queue_depth`] summed):
    /// resolves once each core has answered.
    pub fn queue_depth(&self, engine: &ferrite_reactor::Engine) -> ferrite_reactor::oneshot::Receiver<u64> {
        let id = self.id();
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        let round = Arc::new((AtomicU64::new(0), AtomicU64::new(engine.count() as u64), Mutex::new(Some(tx))));
        for core in 0..engine.count() {
            let round = round.clone();
            engine.send(core, move || {
                round.0.fetch_add(crate::channel::local_queue_depth(id), Ordering::AcqRel);
                // The last core to answer sends the sum.
                if round.1.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(tx) = round.2.lock().unwrap().take() {
                        tx.send(round.0.load(Ordering::Acquire));
                    }
                }
            });
        }
        rx
    }

    /// Reports media events (blocks found bad or relocated) to every opener: each descriptor
    /// keeps them until its opener takes them, and is told with `BdevEvent::MediaManagement`
    /// (SPDK's `spdk_bdev_push_media_events`). Returns how many openers were told.
    pub fn push_media_events(&self, events: &[crate::desc::MediaEvent]) -> usize {
        if events.is_empty() {
            return 0;
        }
        let notify = {
            let st = self.0.state.lock().unwrap();
            for d in &st.descs {
                let mut q = d.media.lock().unwrap_or_else(|p| p.into_inner());
                events.iter().for_each(|e| q.push(*e));
            }
            st.descs.iter().map(|d| (d.core.clone(), d.on_event.clone())).collect::<Vec<_>>()
        };
        log::info!("bdev {}: {} media event(s) reported", self.name().escape_debug(), events.len());
        let n = notify.len();
        notify_all(notify, BdevEvent::MediaManagement);
        n
    }

    /// Tells every opener that a part the bdev stands on failed and the bdev goes on degraded
    /// (`BdevEvent::Fault`): a RAID member or a replica was faulted. Returns how many openers
    /// were told.
    pub fn notify_fault(&self, why: &str) -> usize {
        let notify = {
            let st = self.0.state.lock().unwrap();
            st.descs.iter().map(|d| (d.core.clone(), d.on_event.clone())).collect::<Vec<_>>()
        };
        log::warn!("bdev {}: degraded: {}", self.name().escape_debug(), why.escape_debug());
        let n = notify.len();
        notify_all(notify, BdevEvent::Fault);
        n
    }

    /// Runs `f` on every core's channel of this bdev (on that core), then resolves with how
    /// many channels it ran on (SPDK's `spdk_for_each_channel`). Modules reach their own channel
    /// state through `BackendChannel::as_any`.
    pub fn for_each_channel(
        &self,
        engine: &ferrite_reactor::Engine,
        f: impl Fn(&mut dyn BackendChannel) + Send + Sync + 'static,
    ) -> ferrite_reactor::oneshot::Receiver<usize> {
        use std::sync::atomic::AtomicUsize;
        struct Round<F> {
            f: F,
            ran: AtomicUsize,
            left: AtomicUsize,
            done: Mutex<Option<ferrite_reactor::oneshot::Sender<usize>>>,
        }
        let id = self.id();
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        let round = Arc::new(Round {
            f,
            ran: AtomicUsize::new(0),
            left: AtomicUsize::new(engine.count()),
            done: Mutex::new(Some(tx)),
        });
        for core in 0..engine.count() {
            let round = round.clone();
            engine.send(core, move || {
                if crate::channel::with_backend(id, &round.f) {
                    round.ran.fetch_add(1, Ordering::AcqRel);
                }
                // The last core to finish answers.
                if round.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(tx) = round.done.lock().unwrap().take() {
                        tx.send(round.ran.load(Ordering::Acquire));
                    }
                }
            });
        }
        rx
    }
}

/// The types a bdev whose module serves `module` serves: those, plus what the layer does for
/// it (reset and abort always; compare over reads; compare-and-write over reads and writes).
fn served_types(module: IoTypes) -> IoTypes {
    let mut s = module.with(IoType::Reset).with(IoType::Abort);
    if module.contains(IoType::Read) {
        s = s.with(IoType::Compare);
        if module.contains(IoType::Write) {
            s = s.with(IoType::CompareAndWrite);
        }
    }
    s
}

/// Runs each opener's event callback on its core (or here, for openers off the reactors).
fn notify_all(openers: Vec<(Option<(usize, ferrite_reactor::Engine)>, crate::desc::EventCallback)>, e: BdevEvent) {
    for (core, cb) in openers {
        match core {
            Some((c, engine)) => engine.send(c, move || cb(e)),
            None => cb(e),
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The bdevs of one engine (see `ferrite_reactor::context`).
#[derive(Default)]
struct Registry {
    by_name: BTreeMap<String, Bdev>,
    aliases: BTreeMap<String, String>,
    /// Ids in registration order (SPDK lists bdevs in creation order).
    order: Vec<(u64, String)>,
}

fn registry() -> ferrite_reactor::StateGuard<Registry> {
    ferrite_reactor::lock_state::<Registry>()
}

/// Largest bdev, in bytes: 2^63 - 1 would overflow signed 64-bit sizes in clients (nbdinfo
/// showed a 2^63-byte null bdev as negative), so stop one exabyte-scale step below: 2^62.
pub const MAX_BDEV_BYTES: u64 = 1 << 62;

/// Checks the properties shared by every module's create call.
pub fn check_geometry(block_size: u32, num_blocks: u64) -> Result<(), BdevError> {
    if !(512..=65536).contains(&block_size) || !block_size.is_multiple_of(512) {
        return Err(BdevError::Invalid(format!("block_size {block_size} must be a multiple of 512 from 512 to 65536")));
    }
    if num_blocks == 0 {
        return Err(BdevError::Invalid("num_blocks must be greater than 0".into()));
    }
    match num_blocks.checked_mul(block_size as u64) {
        Some(n) if n <= MAX_BDEV_BYTES => Ok(()),
        _ => Err(BdevError::Invalid(format!(
            "{num_blocks} blocks of {block_size} bytes exceed the largest bdev ({MAX_BDEV_BYTES} bytes)"
        ))),
    }
}

/// Checks a bdev name or alias: not empty, at most 255 bytes, no control characters (they would
/// go raw into logs), and not a UUID (SPDK refuses those: the UUID would then find the wrong bdev).
pub fn check_name(name: &str) -> Result<(), BdevError> {
    if name.is_empty() {
        return Err(BdevError::Invalid("bdev name must not be empty".into()));
    }
    if name.len() > 255 {
        return Err(BdevError::Invalid("bdev name is longer than 255 bytes".into()));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(BdevError::Invalid(format!("bdev name {name:?} contains control characters")));
    }
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(BdevError::Invalid(format!("bdev name {name} is a UUID; UUIDs name bdevs by their uuid only")));
    }
    Ok(())
}

/// Registers a bdev made by a module.
pub fn register(props: BdevProps, backend: Arc<dyn BdevBackend>) -> Result<Bdev, BdevError> {
    check_geometry(props.block_size, props.num_blocks)?;
    // A name that is a UUID is allowed only as the bdev's own UUID (lvols are named so).
    let own_uuid = props.uuid.is_some_and(|u| uuid::Uuid::parse_str(&props.name).ok() == Some(u));
    if !own_uuid {
        check_name(&props.name)?;
    }
    for a in &props.aliases {
        check_name(a)?;
    }
    props.limits.check(props.block_size)?;
    let mut reg = registry();
    for n in std::iter::once(&props.name).chain(props.aliases.iter()) {
        if reg.by_name.contains_key(n) || reg.aliases.contains_key(n) {
            return Err(BdevError::Exists(n.clone()));
        }
    }
    let uuid = props.uuid.unwrap_or_else(uuid::Uuid::new_v4);
    if reg.by_name.values().any(|b| b.uuid() == uuid) {
        return Err(BdevError::Exists(format!("with uuid {uuid}")));
    }
    let bdev = Bdev(Arc::new(BdevShared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        name: props.name.clone(),
        aliases: Mutex::new(props.aliases.clone()),
        uuid,
        block_size: props.block_size,
        num_blocks: AtomicU64::new(props.num_blocks),
        product_name: props.product_name,
        module: props.module,
        io_types: AtomicU16::new(props.io_types.0),
        admits: AtomicU16::new(served_types(props.io_types).0),
        limits: props.limits,
        backend,
        removing: AtomicBool::new(false),
        state: Mutex::new(OpenState::default()),
        locks: Mutex::new(Default::default()),
        engine: ferrite_reactor::current_engine(),
        qos: Default::default(),
        histogram: Default::default(),
        timeouts: Default::default(),
        reservations: Default::default(),
        made_for: Mutex::new(None),
    }));
    for a in &props.aliases {
        reg.aliases.insert(a.clone(), props.name.clone());
    }
    reg.by_name.insert(props.name.clone(), bdev.clone());
    reg.order.push((bdev.id(), props.name.clone()));
    drop(reg);
    log::info!("registered bdev {} ({}, {} x {} B)", props.name, props.module, props.num_blocks, props.block_size);
    crate::module::on_register(&bdev);
    Ok(bdev)
}

/// Finds a bdev by name, alias or UUID string.
pub fn lookup(name: &str) -> Option<Bdev> {
    let reg = registry();
    if let Some(b) = reg.by_name.get(name) {
        return Some(b.clone());
    }
    if let Some(n) = reg.aliases.get(name) {
        return reg.by_name.get(n).cloned();
    }
    let uuid = uuid::Uuid::parse_str(name).ok()?;
    reg.by_name.values().find(|b| b.uuid() == uuid).cloned()
}

/// Every registered bdev, in registration order.
pub fn list() -> Vec<Bdev> {
    let reg = registry();
    reg.order.iter().filter_map(|(_, n)| reg.by_name.get(n).cloned()).collect()
}

/// The bdevs stacked over `bdev`, at any depth, through the modules that say what they stand on
/// ([`BdevBackend::base_bdevs`]): a passthru over it, a delay bdev over that passthru, and so on.
pub fn stacked_over(bdev: &Bdev) -> Vec<Bdev> {
    let all = list();
    let mut found: Vec<Bdev> = Vec::new();
    let mut todo = vec![bdev.id()];
    while let Some(id) = todo.pop() {
        for b in &all {
            let on_it = b.backend().base_bdevs().iter().any(|base| base.id() == id);
            if on_it && !found.iter().any(|f| f.id() == b.id()) {
                todo.push(b.id());
                found.push(b.clone());
            }
        }
    }
    found
}

/// Starts deleting a bdev: it leaves the registry (its name is free again at once), new I/O on it
/// fails with `Removed`, and every opener is told. The returned receiver fires once every
/// descriptor is closed, which is when the module's resources can go.
pub fn unregister(name: &str, module: Option<&str>) -> Result<ferrite_reactor::oneshot::Receiver<()>, BdevError> {
    let bdev = {
        let mut reg = registry();
        let bdev = reg.by_name.get(name).cloned().ok_or_else(|| BdevError::NotFound(name.to_string()))?;
        if let Some(m) = module {
            if bdev.module() != m {
                return Err(BdevError::NotFound(format!("{name} (it is a {} bdev, not {m})", bdev.module())));
            }
        }
        reg.by_name.remove(name);
        reg.order.retain(|(id, _)| *id != bdev.id());
        for a in bdev.0.aliases.lock().unwrap().iter() {
            reg.aliases.remove(a);
        }
        bdev
    };
    bdev.0.removing.store(true, Ordering::SeqCst);
    bdev.0.admits.store(0, Ordering::SeqCst);
    let (tx, rx) = ferrite_reactor::oneshot::channel();
    let notify = {
        let mut st = bdev.0.state.lock().unwrap();
        st.removed_waiters.push(tx);
        st.descs.iter().map(|d| (d.core.clone(), d.on_event.clone())).collect::<Vec<_>>()
    };
    log::info!("unregistering bdev {}: {} opener(s) notified", name.escape_debug(), notify.len());
    notify_all(notify, BdevEvent::Remove);
    // With no opener, the module's destruct runs now (else when the last one closes).
    crate::lifecycle::maybe_destruct(&bdev.0);
    Ok(rx)
}
