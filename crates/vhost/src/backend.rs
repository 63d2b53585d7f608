//! One front end's session with a controller: the vhost-user messages (parsed and answered by
//! the `vhost` crate) applied to the device. It runs on the control thread; rings run on the
//! reactors, so starting, stopping and re-memorying a ring is a message to the ring's reactor,
//! whose answer the session waits for (bounded by [`RING_OP_TIMEOUT`]).
//!
//! A ring starts once it has a size, addresses, a kick eventfd and guest memory, and is
//! enabled (at once when the protocol features were not negotiated, else by
//! VHOST_USER_SET_VRING_ENABLE); VHOST_USER_GET_VRING_BASE stops it after its requests in
//! flight complete, and answers where the driver's available ring was left.
//!
//! Packed rings (VIRTIO_F_RING_PACKED) are offered by controllers made with `packed_ring`; a
//! packed ring's addresses are its descriptor ring, driver area and device area, its base the
//! slot and wrap counter of the available position in bits 0-15 (SET_VRING_BASE; the used
//! position is the same, as the ring was left with nothing in flight, so bits 16-31 are not
//! read, as DPDK does not) and of both positions (GET_VRING_BASE, as QEMU reads them), and its
//! inflight area DPDK's packed layout.

use crate::blk;
use crate::dirty::DirtyLog;
use crate::inflight::InflightArea;
use crate::memory::Memory;
use crate::vring::{self, Device, Setup};
use ferrite_reactor::Engine;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use vhost::vhost_user::message::*;
use vhost::vhost_user::{Backend, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};
use vhost::VhostUserMemoryRegionBase;

/// Most queues a controller serves (SPDK's SPDK_VHOST_MAX_VQUEUES).
pub const MAX_QUEUES: usize = 256;
/// Largest ring (virtio's limit for split and packed rings).
pub const MAX_RING: u32 = 32768;
/// How long the control thread waits for a reactor to start or stop a ring.
pub const RING_OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes per data segment (SPDK: 128 KiB where the bdev needs no alignment).
pub const SIZE_MAX: u32 = 128 * 1024;
/// Most data segments per request (SPDK: SPDK_VHOST_IOVS_MAX - 3).
pub const SEG_MAX: u32 = 126;

/// What a session needs of its controller.
pub struct CtrlrInfo {
    /// Unique id in the process.
    pub id: u64,
    /// The device's description, shared with its rings.
    pub dev: Arc<Device>,
    /// Reactors (by index) its rings go to, in turn.
    pub reactors: Vec<usize>,
    /// The engine of those reactors.
    pub engine: Engine,
}

/// A ring's setup as the messages build it.
#[derive(Default)]
struct Ring {
    size: u16,
    /// Descriptor table, available and used ring, as guest-physical addresses.
    addrs: Option<(u64, u64, u64)>,
    /// VHOST_USER_SET_VRING_BASE's value, then what the ring answered when it stopped.
    base: u32,
    kick: Option<File>,
    call: Option<File>,
    enabled: bool,
    /// The reactor it runs on.
    running_on: Option<usize>,
}

/// A session: the device state one front end's messages build.
pub struct Session {
    ctrlr: Arc<CtrlrInfo>,
    acked: u64,
    mem: Option<Arc<Memory>>,
    rings: Vec<Ring>,
    /// The front end's inflight area (INFLIGHT_SHMFD), once asked for or handed back.
    inflight: Option<Arc<InflightArea>>,
    /// The dirty log (VHOST_USER_SET_LOG_BASE); written while VHOST_F_LOG_ALL is acked.
    log: Option<Arc<DirtyLog>>,
}

fn invalid(why: String) -> Error {
    log::warn!("vhost: {why}");
    Error::InvalidParam
}

impl Session {
    /// A fresh session with controller `ctrlr`.
    pub fn new(ctrlr: Arc<CtrlrInfo>) -> Self {
        Session {
            ctrlr,
            acked: 0,
            mem: None,
            rings: (0..MAX_QUEUES).map(|_| Ring::default()).collect(),
            inflight: None,
            log: None,
        }
    }

    /// The virtio features this device offers.
    pub fn offered(&self) -> u64 {
        let dev = &self.ctrlr.dev;
        let mut f = blk::F_VERSION_1
            | blk::F_PROTOCOL_FEATURES
            | blk::F_SIZE_MAX
            | blk::F_SEG_MAX
            | blk::F_BLK_SIZE
            | blk::F_TOPOLOGY
            | blk::F_MQ
            | blk::F_INDIRECT_DESC
            | blk::F_EVENT_IDX;
        if dev.packed_ring {
            // Live migration is split rings only: a packed ring's used descriptors overwrite
            // the chains a dirty log would need at completion. Without LOG_ALL, QEMU refuses to
            // migrate the guest rather than lose its data.
            f |= blk::F_RING_PACKED;
        } else {
            f |= blk::F_LOG_ALL;
        }
        let bdev = ferrite_bdev::lookup(&dev.bdev);
        let supports = |t| bdev.as_ref().is_some_and(|b| b.supports(t));
        if supports(ferrite_bdev::IoType::Flush) {
            // The driver may turn the cache to writethrough (each write then flushed here).
            f |= blk::F_FLUSH | blk::F_CONFIG_WCE;
        }
        if dev.readonly {
            f |= blk::F_RO;
        } else {
            if supports(ferrite_bdev::IoType::Unmap) {
                f |= blk::F_DISCARD;
            }
            if supports(ferrite_bdev::IoType::WriteZeroes) {
                f |= blk::F_WRITE_ZEROES;
            }
        }
        f
    }

    /// The configuration space, from the bdev as it is now.
    pub fn config(&self) -> blk::Config {
        let dev = &self.ctrlr.dev;
        let Some(b) = ferrite_bdev::lookup(&dev.bdev) else {
            // As SPDK: a device of no blocks, which the guest's driver leaves alone.
            return blk::Config { num_queues: MAX_QUEUES as u16, ..Default::default() };
        };
        let bs = b.block_size();
        let l = b.limits();
        let pbs = b.physical_block_size().max(bs);
        let sectors_per_block = bs / blk::SECTOR as u32;
        let mut c = blk::Config {
            capacity: b.num_blocks() * bs as u64 / blk::SECTOR,
            size_max: SIZE_MAX,
            seg_max: SEG_MAX,
            blk_size: bs,
            physical_block_exp: (pbs / bs).trailing_zeros() as u8,
            min_io_size: 1,
            opt_io_size: l.optimal_io_boundary,
            writeback: dev.writeback.load(std::sync::atomic::Ordering::Relaxed) as u8,
            num_queues: MAX_QUEUES as u16,
            ..Default::default()
        };
        if !dev.readonly && b.supports(ferrite_bdev::IoType::Unmap) {
            c.max_discard_sectors = 32768;
            c.max_discard_seg = 1;
            c.discard_sector_alignment = sectors_per_block;
        }
        if !dev.readonly && b.supports(ferrite_bdev::IoType::WriteZeroes) {
            c.max_write_zeroes_sectors = 32768;
            c.max_write_zeroes_seg = 1;
        }
        c
    }

    fn ring(&mut self, index: u32) -> Result<&mut Ring> {
        let name = self.ctrlr.dev.ctrlr.clone();
        self.rings.get_mut(index as usize).ok_or_else(|| invalid(format!("controller {name}: no ring {index}")))
    }

    /// Starts ring `index` if it has all it needs and is not running.
    fn maybe_start(&mut self, index: usize) -> Result<()> {
        let protocol_acked = self.acked & blk::F_PROTOCOL_FEATURES != 0;
        let event_idx = self.acked & blk::F_EVENT_IDX != 0;
        let packed = self.acked & blk::F_RING_PACKED != 0;
        let Some(mem) = self.mem.clone() else { return Ok(()) };
        let ctrlr = self.ctrlr.clone();
        let log = self.logging();
        let r = &mut self.rings[index];
        let Some((desc, avail, used)) = r.addrs else { return Ok(()) };
        if r.running_on.is_some() || r.kick.is_none() || r.size == 0 || (protocol_acked && !r.enabled) {
            return Ok(());
        }
        let reactor = ctrlr.reactors[index % ctrlr.reactors.len()];
        let setup = Setup {
            ctrlr_id: ctrlr.id,
            index: index as u16,
            size: r.size,
            desc,
            avail,
            used,
            next_avail: r.base as u16,
            packed,
            event_idx,
            kick: r.kick.take().expect("checked"),
            call: r.call.as_ref().and_then(|c| c.try_clone().ok()),
            mem,
            dev: ctrlr.dev.clone(),
            inflight: self.inflight.as_ref().and_then(|a| a.queue(index as u16, r.size)),
            log,
        };
        let has_inflight = setup.inflight.is_some();
        let mut rx = ctrlr.engine.call(reactor, move || vring::start(setup));
        match rx.wait_for(RING_OP_TIMEOUT) {
            Some(Ok(Ok(()))) => {
                r.running_on = Some(reactor);
                log::info!(
                    "vhost controller {}: queue {index} runs on reactor {reactor}{}",
                    ctrlr.dev.ctrlr,
                    if has_inflight { ", its requests in flight kept in the inflight area" } else { "" }
                );
                Ok(())
            }
            Some(Ok(Err(e))) => Err(invalid(format!("controller {}: {e}", ctrlr.dev.ctrlr))),
            _ => Err(invalid(format!("controller {}: reactor {reactor} did not start queue {index}", ctrlr.dev.ctrlr))),
        }
    }

    /// Stops ring `index` if it runs; returns where it was left (GET_VRING_BASE's value).
    fn stop(&mut self, index: usize) -> u32 {
        let ctrlr = self.ctrlr.clone();
        let r = &mut self.rings[index];
        let Some(reactor) = r.running_on.take() else { return r.base };
        let (tx, mut rx) = ferrite_reactor::oneshot::channel();
        let (id, i) = (ctrlr.id, index as u16);
        ctrlr.engine.send(reactor, move || vring::stop(id, i, tx));
        match rx.wait_for(RING_OP_TIMEOUT) {
            Some(Ok(next)) => r.base = next,
            _ => log::error!(
                "vhost controller {}: queue {index} did not drain within {RING_OP_TIMEOUT:?}; its requests are abandoned",
                ctrlr.dev.ctrlr
            ),
        }
        r.base
    }

    /// Stops every ring (the front end went away, or the controller is deleted).
    pub fn stop_all(&mut self) {
        for i in 0..self.rings.len() {
            if self.rings[i].running_on.is_some() {
                self.stop(i);
            }
        }
    }

    /// The dirty log the rings write, if a migration asks for one now.
    fn logging(&self) -> Option<Arc<DirtyLog>> {
        self.log.clone().filter(|_| self.acked & blk::F_LOG_ALL != 0)
    }

    /// Tells every running ring whether to log, and where (after SET_FEATURES or SET_LOG_BASE).
    fn push_log(&mut self) {
        let log = self.logging();
        let mut reactors: Vec<usize> = self.rings.iter().filter_map(|r| r.running_on).collect();
        reactors.sort_unstable();
        reactors.dedup();
        for reactor in reactors {
            let (id, l) = (self.ctrlr.id, log.clone());
            let mut rx = self.ctrlr.engine.call(reactor, move || vring::set_log(id, l));
            if rx.wait_for(RING_OP_TIMEOUT).is_none() {
                log::error!("vhost controller {}: reactor {reactor} did not take the dirty log", self.ctrlr.dev.ctrlr);
            }
        }
    }

    /// Rings running now.
    pub fn running(&self) -> usize {
        self.rings.iter().filter(|r| r.running_on.is_some()).count()
    }
}

impl VhostUserBackendReqHandlerMut for Session {
    fn set_owner(&mut self) -> Result<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.stop_all();
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        self.stop_all();
        self.acked = 0;
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(self.offered())
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        if features & !self.offered() != 0 {
            return Err(invalid(format!(
                "controller {}: features {features:#x} include some not offered ({:#x})",
                self.ctrlr.dev.ctrlr,
                features & !self.offered()
            )));
        }
        let was = self.acked & blk::F_LOG_ALL;
        self.acked = features;
        if features & blk::F_LOG_ALL != was {
            log::info!(
                "vhost controller {}: dirty page logging {}",
                self.ctrlr.dev.ctrlr,
                if was == 0 { "starts (a migration)" } else { "stops" }
            );
            self.push_log();
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        let mem = Arc::new(
            Memory::map(ctx, files).map_err(|e| invalid(format!("controller {}: {e}", self.ctrlr.dev.ctrlr)))?,
        );
        log::info!("vhost controller {}: guest memory of {} region(s)", self.ctrlr.dev.ctrlr, mem.regions());
        let running: Vec<usize> = self.rings.iter().filter_map(|r| r.running_on).collect();
        let mut seen = running.clone();
        seen.sort_unstable();
        seen.dedup();
        for reactor in seen {
            let (id, m) = (self.ctrlr.id, mem.clone());
            let mut rx = self.ctrlr.engine.call(reactor, move || vring::set_memory(id, m));
            let _ = rx.wait_for(RING_OP_TIMEOUT);
        }
        self.mem = Some(mem);
        for i in 0..self.rings.len() {
            self.maybe_start(i)?;
        }
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        // A packed ring's size need not be a power of two.
        let packed = self.acked & blk::F_RING_PACKED != 0;
        if num == 0 || num > MAX_RING || !(packed || num.is_power_of_two()) {
            return Err(invalid(format!("controller {}: ring size {num}", self.ctrlr.dev.ctrlr)));
        }
        self.ring(index)?.size = num as u16;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        let name = self.ctrlr.dev.ctrlr.clone();
        let Some(mem) = self.mem.clone() else {
            return Err(invalid(format!("controller {name}: ring addresses before the memory table")));
        };
        let gpa = |va: u64| {
            mem.va_to_gpa(va)
                .ok_or_else(|| invalid(format!("controller {name}: ring address {va:#x} is not in guest memory")))
        };
        let addrs = (gpa(descriptor)?, gpa(available)?, gpa(used)?);
        self.ring(index)?.addrs = Some(addrs);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        self.ring(index)?.base = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        self.ring(index)?;
        let next = self.stop(index as usize);
        let r = &mut self.rings[index as usize];
        r.kick = None;
        Ok(VhostUserVringState::new(index, next))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let Some(fd) = fd else {
            return Err(invalid(format!(
                "controller {}: a ring without a kick eventfd (polling front end)",
                self.ctrlr.dev.ctrlr
            )));
        };
        let r = self.ring(index as u32)?;
        if r.running_on.is_some() {
            return Err(invalid(format!(
                "controller {}: a new kick eventfd for running ring {index}",
                self.ctrlr.dev.ctrlr
            )));
        }
        r.kick = Some(fd);
        self.maybe_start(index as usize)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let ctrlr = self.ctrlr.clone();
        let r = self.ring(index as u32)?;
        if let Some(reactor) = r.running_on {
            let call = fd.as_ref().and_then(|c| c.try_clone().ok()).map(OwnedFd::from);
            let id = ctrlr.id;
            let mut rx = ctrlr.engine.call(reactor, move || vring::set_call(id, index as u16, call));
            let _ = rx.wait_for(RING_OP_TIMEOUT);
        }
        self.ring(index as u32)?.call = fd;
        Ok(())
    }

    fn set_vring_err(&mut self, _index: u8, _fd: Option<File>) -> Result<()> {
        Ok(())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::LOG_SHMFD)
    }

    fn set_protocol_features(&mut self, _features: u64) -> Result<()> {
        // The vhost crate keeps what was acked and checks each message against it.
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(MAX_QUEUES as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        self.ring(index)?.enabled = enable;
        if enable {
            self.maybe_start(index as usize)?;
        }
        Ok(())
    }

    fn get_config(&mut self, offset: u32, size: u32, _flags: VhostUserConfigFlags) -> Result<Vec<u8>> {
        let c = self.config();
        log::debug!("vhost controller {}: config bytes {offset}+{size} of {c:?}", self.ctrlr.dev.ctrlr);
        c.read(offset, size).ok_or_else(|| invalid(format!("config bytes {offset}+{size}")))
    }

    fn set_config(&mut self, offset: u32, buf: &[u8], _flags: VhostUserConfigFlags) -> Result<()> {
        // The one writable field: the cache mode (CONFIG_WCE).
        let name = &self.ctrlr.dev.ctrlr;
        match (offset as usize, buf) {
            (blk::WRITEBACK_OFFSET, &[mode @ (0 | 1)]) if self.acked & blk::F_CONFIG_WCE != 0 => {
                log::info!(
                    "vhost controller {name}: the driver sets the cache to {}",
                    ["writethrough", "writeback"][mode as usize]
                );
                self.ctrlr.dev.writeback.store(mode == 1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            _ => Err(invalid(format!(
                "controller {name}: config bytes {offset}+{} are not writable ({buf:?})",
                buf.len()
            ))),
        }
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {
        // The `vhost` crate has no sender for BACKEND_CONFIG_CHANGE_MSG: the control thread
        // keeps its own copy of this channel (see `control::peek_backend_channel`).
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        Err(Error::InvalidOperation("gpu"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        Err(Error::InvalidOperation("shared objects"))
    }

    fn get_inflight_fd(&mut self, inflight: &VhostUserInflight) -> Result<(VhostUserInflight, File)> {
        let name = &self.ctrlr.dev.ctrlr;
        // The layout follows the ring kind (the front end sets the features first).
        let packed = self.acked & blk::F_RING_PACKED != 0;
        let create = if packed { InflightArea::create_packed } else { InflightArea::create };
        let (area, file) =
            create(inflight.num_queues, inflight.queue_size).map_err(|e| invalid(format!("controller {name}: {e}")))?;
        let size = area.size();
        log::info!(
            "vhost controller {name}: inflight area for {} {} queues of {}",
            inflight.num_queues,
            if packed { "packed" } else { "split" },
            inflight.queue_size
        );
        self.inflight = Some(area);
        Ok((VhostUserInflight::new(size, 0, inflight.num_queues, inflight.queue_size), file))
    }

    fn set_inflight_fd(&mut self, inflight: &VhostUserInflight, file: File) -> Result<()> {
        let name = &self.ctrlr.dev.ctrlr;
        let packed = self.acked & blk::F_RING_PACKED != 0;
        let open = if packed { InflightArea::open_packed } else { InflightArea::open };
        let area = open(&file, inflight.mmap_offset, inflight.mmap_size, inflight.num_queues, inflight.queue_size)
            .map_err(|e| invalid(format!("controller {name}: {e}")))?;
        log::info!(
            "vhost controller {name}: inflight area handed over ({} {} queues of {})",
            inflight.num_queues,
            if packed { "packed" } else { "split" },
            inflight.queue_size
        );
        self.inflight = Some(area);
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        Ok(crate::memory::MAX_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        Err(Error::InvalidOperation("memory slots"))
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        Err(Error::InvalidOperation("memory slots"))
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        Err(Error::InvalidOperation("device state"))
    }

    fn check_device_state(&mut self) -> Result<()> {
        Err(Error::InvalidOperation("device state"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        Err(Error::InvalidOperation("shared memory"))
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> Result<()> {
        let name = self.ctrlr.dev.ctrlr.clone();
        let map = DirtyLog::map(&file, log.mmap_size, log.mmap_offset)
            .map_err(|e| invalid(format!("controller {name}: {e}")))?;
        log::info!("vhost controller {name}: dirty log of {} bytes", log.mmap_size);
        self.log = Some(Arc::new(map));
        self.push_log();
        Ok(())
    }
}
