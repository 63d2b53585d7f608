//! A vhost-user-blk device as a bdev (SPDK's `bdev_virtio_blk` over a virtio-user transport):
//! the device (shared region, queues, socket) and its channels.
//!
//! Each channel (one per reactor that opens the bdev) takes one of the device's virtqueues for
//! as long as it lives and polls it from a reactor poller. When every queue is taken, a further
//! channel is refused (as SPDK refuses it: "Couldn't get an unused queue"): attach with a
//! `vq_count` of at least the number of reactors that submit.
//!
//! The poller busy-polls while requests are in flight, then (after [`SPIN_TURNS`] idle turns
//! with requests still out) asks the device to signal the queue's call eventfd and lets the
//! reactor sleep; the signal's completion on the reactor's ring wakes it. Under load the device
//! is never asked to signal.
//!
//! A device that goes away (its socket closes: target killed or export removed) is seen by a
//! watch on the socket: every request in flight then fails with `EIO`, and so does every later
//! one. The bdev stays, as SPDK's does, until `bdev_virtio_detach_controller` removes it.

use crate::handshake::{self, DeviceConfig, QueueSetup};
use crate::queue::{BlkQueue, QueueLayout, QueueStats, MAX_TRANSFER};
use crate::shm::SharedMem;
use ferrite_bdev::{
    register, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoStatus, IoType, IoTypes, Limits,
};
use ferrite_reactor::{FdWatch, Lender, PollerId};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use vhost::vhost_user::Frontend;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// The module name (SPDK's).
pub const MODULE: &str = "virtio_blk";

/// Idle poller turns with requests in flight before the device is asked to signal completions
/// and the reactor may sleep.
pub const SPIN_TURNS: u32 = 512;

/// What `bdev_virtio_attach_controller` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachOpts {
    /// Bdev name (SPDK names the blk bdev after the controller).
    pub name: String,
    /// Path of the vhost-user socket.
    pub socket: String,
    /// Request queues wanted (fewer if the device has fewer).
    pub vq_count: u16,
    /// Entries per queue (a power of two).
    pub vq_size: u16,
}

/// A connected device: its shared memory, queues and socket.
pub struct Device {
    opts: AttachOpts,
    config: DeviceConfig,
    /// Kept for the device's lifetime: it maps the rings and buffers, and closing it ends the
    /// session.
    frontend: Mutex<Option<Frontend>>,
    /// A duplicate of the socket, to watch it and to shut it down at detach.
    socket: OwnedFd,
    /// Each queue, while no channel holds it.
    queues: Vec<Mutex<Option<BlkQueue>>>,
    stats: Vec<Arc<QueueStats>>,
    /// Bytes one read or write moves at most.
    slot_bytes: usize,
    /// The device went away: every request fails.
    dead: AtomicBool,
    /// Detached: the socket watch stops.
    detached: AtomicBool,
    /// Where to wake reactors when the device dies (their pollers fail the requests).
    engine: Option<ferrite_reactor::Engine>,
    /// Declared last: unmapped after every queue that points into it.
    shm: SharedMem,
}

impl Device {
    /// Connects to the socket, sets the device up and starts its queues. Blocks on the socket:
    /// call it off the reactors.
    pub fn connect(opts: AttachOpts) -> Result<Device, BdevError> {
        if !opts.vq_size.is_power_of_two() || !(4..=1024).contains(&opts.vq_size) {
            return Err(BdevError::Invalid(format!("vq_size {} must be a power of two from 4 to 1024", opts.vq_size)));
        }
        if opts.vq_count == 0 {
            return Err(BdevError::Invalid("vq_count must be at least 1".into()));
        }
        let (mut fe, config, deadline) = handshake::connect(&opts.socket, opts.vq_count)?;
        let queue_count = opts.vq_count.min(config.num_queues);
        if queue_count < opts.vq_count {
            log::warn!(
                "{}: requested {} request queues but only {} available",
                opts.name.escape_debug(),
                opts.vq_count,
                config.num_queues
            );
        }
        // One data descriptor per request: at most SIZE_MAX bytes, whole blocks.
        let bs = config.block_size as usize;
        let mut slot_bytes = MAX_TRANSFER.max(bs);
        if let Some(size_max) = config.size_max {
            slot_bytes = slot_bytes.min((size_max as usize / bs).max(1) * bs);
        }
        let layout = QueueLayout::of(opts.vq_size, slot_bytes);
        let shm = SharedMem::new(&opts.name, layout.bytes * queue_count as usize)
            .map_err(|e| BdevError::NoMemory(format!("cannot make the shared region: {e}")))?;
        let event_idx = config.has(VIRTIO_RING_F_EVENT_IDX);
        let mut queues = Vec::with_capacity(queue_count as usize);
        for i in 0..queue_count as usize {
            let flush_after_fua = config.has(VIRTIO_BLK_F_FLUSH);
            let q = BlkQueue::new(&shm, i * layout.bytes, opts.vq_size, layout, event_idx, flush_after_fua)
                .map_err(|e| BdevError::Os(format!("cannot make the queue's eventfds: {e}")))?;
            queues.push(q);
        }
        let setups: Vec<QueueSetup<'_>> = queues
            .iter()
            .map(|q| QueueSetup {
                size: q.ring().size(),
                rings: q.ring().addrs(),
                kick: q.kick_fd(),
                call: q.call_fd(),
            })
            .collect();
        handshake::start_queues(&mut fe, &opts.socket, &shm, &setups).map_err(|e| deadline.explain(e))?;
        drop(setups);
        drop(deadline);
        // SAFETY: dup of the frontend's open socket; the result is a new descriptor we own.
        let dup = unsafe { libc::fcntl(fe.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(BdevError::Os(format!("cannot duplicate the socket: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: `dup` is a fresh descriptor nobody else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(dup) };
        log::info!(
            "{}: vhost-user-blk device at {}: {} x {} B, {} queue(s) of {}, features {:#x}, {} MiB shared in {} KiB pages",
            opts.name.escape_debug(),
            opts.socket.escape_debug(),
            config.capacity_sectors * 512 / config.block_size as u64,
            config.block_size,
            queue_count,
            opts.vq_size,
            config.features,
            shm.len() >> 20,
            shm.backing().page_size() >> 10
        );
        Ok(Device {
            stats: queues.iter().map(|q| q.stats().clone()).collect(),
            queues: queues.into_iter().map(|q| Mutex::new(Some(q))).collect(),
            opts,
            config,
            frontend: Mutex::new(Some(fe)),
            socket,
            slot_bytes,
            dead: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            engine: None,
            shm,
        })
    }

    /// Negotiated configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Queues started.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Bytes copied through the bounce buffers so far, over every queue.
    pub fn copied_bytes(&self) -> u64 {
        self.stats.iter().map(|s| s.copied_bytes.load(Ordering::Relaxed)).sum()
    }

    /// Flushes sent after FUA writes so far, over every queue.
    pub fn fua_flushes(&self) -> u64 {
        self.stats.iter().map(|s| s.fua_flushes.load(Ordering::Relaxed)).sum()
    }

    /// Times a channel asked the device to signal completions and let its reactor sleep.
    pub fn waits(&self) -> u64 {
        self.stats.iter().map(|s| s.waits.load(Ordering::Relaxed)).sum()
    }

    /// Bytes lent to zero-copy readers so far, over every queue.
    pub fn lent_bytes(&self) -> u64 {
        self.stats.iter().map(|s| s.lent_bytes.load(Ordering::Relaxed)).sum()
    }

    /// Kicks sent so far, over every queue.
    pub fn kicks(&self) -> u64 {
        self.stats.iter().map(|s| s.kicks.load(Ordering::Relaxed)).sum()
    }

    /// True once the device went away.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// The device went away: every request fails from now on; each reactor is woken so that
    /// its poller fails the requests it has in flight.
    fn mark_dead(&self, why: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!("{}: vhost-user device gone ({why}); its I/O fails from now on", self.opts.name.escape_debug());
        if let Some(e) = &self.engine {
            for core in 0..e.count() {
                e.send(core, || {});
            }
        }
    }

    fn io_types(&self) -> IoTypes {
        let c = &self.config;
        let mut t = IoTypes::of(&[IoType::Read, IoType::Reset]);
        if !c.has(VIRTIO_BLK_F_RO) {
            t = t.with(IoType::Write);
            if c.has(VIRTIO_BLK_F_DISCARD) {
                t = t.with(IoType::Unmap);
            }
            if c.has(VIRTIO_BLK_F_WRITE_ZEROES) {
                t = t.with(IoType::WriteZeroes);
            }
        }
        if c.has(VIRTIO_BLK_F_FLUSH) {
            t = t.with(IoType::Flush);
        }
        t
    }

    /// What one request may be. Payloads are bounced into one contiguous buffer, so the
    /// device's segment limits (SEG_MAX, SIZE_MAX) bound the transfer size, not the caller's
    /// segments.
    fn limits(&self) -> Limits {
        let c = &self.config;
        let bs = u64::from(c.block_size);
        // Sectors (512 B) to blocks, 0 (no limit given) to the most one segment can say.
        let blocks = |sectors: u32| {
            let s = if sectors == 0 { u64::from(u32::MAX) } else { u64::from(sectors) };
            (s * 512 / bs).max(1)
        };
        Limits {
            physical_block_size: c.block_size << c.physical_block_exp,
            optimal_io_boundary: c.opt_io_size,
            max_io_blocks: (self.slot_bytes as u64 / bs) as u32,
            max_unmap_blocks: blocks(c.max_discard_sectors),
            max_unmap_segments: 1,
            unmap_granularity: (u64::from(c.discard_sector_alignment) * 512 / bs) as u32,
            max_write_zeroes_blocks: blocks(c.max_write_zeroes_sectors),
            write_cache: c.has(VIRTIO_BLK_F_FLUSH),
            ..Limits::default()
        }
    }

    /// Watches the socket from the calling reactor: when it closes (or says anything: a
    /// vhost-user device sends nothing unasked on it), the device is gone.
    fn watch_socket(self: &Arc<Self>) -> std::io::Result<()> {
        let fd = self.socket.try_clone()?;
        let watch = FdWatch::new(fd)?;
        let dev = Arc::downgrade(self);
        ferrite_reactor::spawn_local(async move {
            loop {
                let ready = watch.readable().await;
                let Some(d) = dev.upgrade() else { return };
                if d.detached.load(Ordering::Acquire) {
                    return;
                }
                match ready {
                    Err(e) => return d.mark_dead(&format!("socket watch failed: {e}")),
                    Ok(()) => match peek(watch.as_fd()) {
                        Peek::Closed => return d.mark_dead("socket closed"),
                        Peek::Unexpected => return d.mark_dead("unexpected message on the socket"),
                        Peek::Nothing => {}
                    },
                }
            }
        })
        .detach();
        Ok(())
    }
}

enum Peek {
    Closed,
    Unexpected,
    Nothing,
}

/// What is waiting on the socket, without taking it.
fn peek(fd: std::os::fd::BorrowedFd<'_>) -> Peek {
    let mut b = [0u8; 1];
    // SAFETY: recv of at most one byte into a local, on a descriptor the caller keeps open.
    let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match n {
        0 => Peek::Closed,
        n if n > 0 => Peek::Unexpected,
        _ => match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Peek::Nothing,
            _ => Peek::Closed,
        },
    }
}

/// The bdev's backend.
struct VirtioBackend {
    dev: Arc<Device>,
}

impl BdevBackend for VirtioBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let taken = self.dev.queues.iter().enumerate().find_map(|(i, q)| q.lock().unwrap().take().map(|q| (i, q)));
        let Some((index, queue)) = taken else {
            return Err(BdevError::Busy(format!(
                "{}: all {} virtqueues are in use by other reactors (attach with a larger vq_count)",
                self.dev.opts.name,
                self.dev.queues.len()
            )));
        };
        VirtioChannel::new(self.dev.clone(), index, queue).map(|c| Box::new(c) as Box<dyn BackendChannel>)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn zcopy(&self) -> bool {
        true
    }

    fn driver_specific(&self) -> Value {
        let d = &self.dev;
        json!({"virtio": {"vq_count": d.queues.len(), "vq_size": d.opts.vq_size, "type": "user",
            "socket": d.opts.socket, "features": d.config.features, "connected": !d.is_dead(),
            "shared_bytes": d.shm.len(), "shared_page_size": d.shm.backing().page_size(), "bounce_copied_bytes": d.copied_bytes(), "kicks": d.kicks(),
            "fua_flushes": d.fua_flushes(), "waits": d.waits(), "lent_bytes": d.lent_bytes()}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let d = &self.dev;
        Some(json!({"method": "bdev_virtio_attach_controller", "params": {
            "name": bdev.name(), "dev_type": "blk", "trtype": "user", "traddr": d.opts.socket,
            "vq_count": d.queues.len(), "vq_size": d.opts.vq_size}}))
    }

    fn destruct(&self, done: ferrite_bdev::Destructed) {
        let d = &self.dev;
        d.detached.store(true, Ordering::Release);
        // Ends the session: the device stops its rings; the socket watch wakes and stops.
        // SAFETY: shutdown of our own open descriptor.
        unsafe { libc::shutdown(d.socket.as_raw_fd(), libc::SHUT_RDWR) };
        d.frontend.lock().unwrap().take();
        log::info!("{}: detached from {}", d.opts.name.escape_debug(), d.opts.socket.escape_debug());
        done.finish();
    }
}

/// A channel's state, shared by its `submit` and its poller.
struct ChannelState {
    queue: Option<BlkQueue>,
    /// The queue's call eventfd, watched on this reactor while the device is asked to signal.
    call: FdWatch,
    /// Idle poller turns in a row with requests in flight.
    idle_turns: u32,
    /// The requests in flight were failed because the device died.
    failed: bool,
    /// One lender per slot, for zero-copy reads: a slot is free again once the channel holds
    /// its lender alone.
    lenders: Box<[Rc<Lender>]>,
}

/// One reactor's channel: one virtqueue, polled.
struct VirtioChannel {
    dev: Arc<Device>,
    index: usize,
    state: Rc<RefCell<ChannelState>>,
    poller: Option<PollerId>,
}

impl VirtioChannel {
    fn new(dev: Arc<Device>, index: usize, queue: BlkQueue) -> Result<VirtioChannel, BdevError> {
        let give_back = |q: BlkQueue| *dev.queues[index].lock().unwrap() = Some(q);
        let call = match queue.call_fd().try_clone().map(|e| {
            // SAFETY: the clone is a fresh descriptor; ownership moves to the OwnedFd.
            unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(e)) }
        }) {
            Ok(fd) => fd,
            Err(e) => {
                give_back(queue);
                return Err(BdevError::Os(format!("cannot duplicate the call eventfd: {e}")));
            }
        };
        let call = match FdWatch::new(call) {
            Ok(w) => w,
            Err(e) => {
                give_back(queue);
                return Err(BdevError::Os(format!("cannot watch the call eventfd: {e}")));
            }
        };
        let slots = queue.slots();
        let lenders = (0..slots).map(|_| Rc::new(Lender::new(dev.clone()))).collect();
        let state =
            Rc::new(RefCell::new(ChannelState { queue: Some(queue), call, idle_turns: 0, failed: false, lenders }));
        let poller = {
            let state = state.clone();
            let dev = dev.clone();
            // Completed requests, taken out of the state before they complete (a completion
            // may submit again on this channel). Its capacity is the slot count: no allocation.
            let mut done: Vec<(BdevIo, IoStatus)> = Vec::with_capacity(slots);
            ferrite_reactor::register_poller(move || {
                let busy = poll(&dev, &mut state.borrow_mut(), &mut done);
                for (io, status) in done.drain(..) {
                    io.complete(status);
                }
                busy
            })
        };
        Ok(VirtioChannel { dev, index, state, poller: Some(poller) })
    }
}

/// One poller turn: takes completions (or fails everything if the device died) into `done`;
/// returns true if there was work or requests are still expected soon.
fn poll(dev: &Device, st: &mut ChannelState, done: &mut Vec<(BdevIo, IoStatus)>) -> bool {
    let Some(q) = st.queue.as_mut() else { return false };
    if dev.is_dead() {
        if !st.failed {
            st.failed = true;
            return q.fail_all(done) > 0;
        }
        return false;
    }
    if q.lent() > 0 {
        q.reclaim(&st.lenders);
    }
    if q.reap(done, &st.lenders) > 0 {
        st.idle_turns = 0;
        if q.ring().notify_on() {
            q.ring_mut().set_notify(false);
        } else {
            q.ring_mut().keep_quiet();
        }
        return true;
    }
    if q.in_flight() == 0 {
        return false;
    }
    if st.idle_turns < SPIN_TURNS {
        st.idle_turns += 1;
        return true;
    }
    // The wish names the completions taken so far (they move while it is on: a request that
    // went back to the device, a FUA write's flush, is taken without ending the wait).
    q.wait_for_signal();
    // A completion that arrived before the wish was visible is taken on the next turn.
    if q.ring().has_used() {
        return true;
    }
    // Arms the watch; its completion wakes the reactor. A signal already there (from an earlier
    // wish) is drained, and the watch armed again, so that none is lost.
    while st.call.take_ready().unwrap_or(false) {
        let _ = st.call.drain();
        if q.ring().has_used() {
            return true;
        }
    }
    false
}

impl BackendChannel for VirtioChannel {
    fn lends_reads(&self) -> bool {
        true
    }

    fn submit(&mut self, io: BdevIo) {
        if io.req.io_type == IoType::Reset {
            // Reaches the module once earlier requests completed: nothing more to do.
            io.complete_deferred(IoStatus::Success);
            return;
        }
        if self.dev.is_dead() {
            io.complete_deferred(IoStatus::Failed(libc::EIO));
            return;
        }
        let mut st = self.state.borrow_mut();
        let Some(q) = st.queue.as_mut() else {
            drop(st);
            io.complete_deferred(IoStatus::Failed(libc::ENXIO));
            return;
        };
        if let Err((io, status)) = q.submit(io) {
            drop(st);
            io.complete_deferred(status);
        }
    }
}

impl Drop for VirtioChannel {
    fn drop(&mut self) {
        if let Some(p) = self.poller.take() {
            ferrite_reactor::unregister_poller(p);
        }
        let mut st = self.state.borrow_mut();
        st.call.close();
        if let Some(mut q) = st.queue.take() {
            q.reclaim(&st.lenders);
            if q.lent() > 0 {
                // Views still held by their readers: those slots stay out of use for good (the
                // next channel has lenders of its own and cannot tell when they go).
                log::warn!(
                    "{}: {} lent read buffer(s) outlive their channel; their slots are retired",
                    self.dev.opts.name.escape_debug(),
                    q.lent()
                );
            }
            debug_assert!(
                q.in_flight() == 0 || self.dev.is_dead(),
                "a channel goes away only once its requests completed"
            );
            *self.dev.queues[self.index].lock().unwrap() = Some(q);
        }
    }
}

/// Connects to the device (off the reactor) and registers its bdev. Call it on a reactor: the
/// socket is watched from there.
pub async fn attach(opts: AttachOpts) -> Result<Bdev, BdevError> {
    ferrite_bdev::bdev::check_name(&opts.name)?;
    if ferrite_bdev::lookup(&opts.name).is_some() {
        return Err(BdevError::Exists(opts.name));
    }
    let mut dev = ferrite_reactor::spawn_blocking(move || Device::connect(opts))
        .await
        .map_err(|e| BdevError::Os(format!("the attach thread failed: {e}")))??;
    dev.engine = ferrite_reactor::current_engine();
    let dev = Arc::new(dev);
    let c = dev.config;
    let props = BdevProps {
        name: dev.opts.name.clone(),
        aliases: vec![],
        uuid: None,
        block_size: c.block_size,
        num_blocks: c.capacity_sectors * 512 / u64::from(c.block_size),
        product_name: "VirtioBlk Disk",
        module: MODULE,
        io_types: dev.io_types(),
        limits: dev.limits(),
    };
    let bdev = register(props, Arc::new(VirtioBackend { dev: dev.clone() }))?;
    if let Err(e) = dev.watch_socket() {
        log::warn!("{}: cannot watch the socket ({e}); a vanished device is not noticed", bdev.name().escape_debug());
    }
    Ok(bdev)
}

/// The device behind a virtio-user bdev, for tests and diagnostics.
pub fn device(bdev: &Bdev) -> Option<Weak<Device>> {
    let b = bdev.backend().as_any()?.downcast_ref::<VirtioBackend>()?;
    Some(Arc::downgrade(&b.dev))
}
