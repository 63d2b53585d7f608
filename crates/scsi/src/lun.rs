//! A logical unit: a bdev opened through a descriptor, its identity, its mode pages, its
//! state (stopped, SPC-2 reservation) and the I_T nexuses that use it, each with its unit
//! attention conditions. Shared by every reactor (`Arc`); what commands read on every I/O is
//! in atomics, the rest behind mutexes that only the slow commands take.

use crate::inquiry::{ascii_field, BlockFacts, Identity};
use crate::mode::{Geometry, ModePages};
use crate::sense::asc;
use crate::ua::UnitAttention;
use ferrite_bdev::{Bdev, BdevDesc, BdevError, BdevEvent, Initiator, InitiatorId, IoType};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// How a logical unit is made.
#[derive(Debug, Clone)]
pub struct LunConfig {
    /// The bdev (name, alias or UUID).
    pub bdev: String,
    /// T10 vendor identification.
    pub vendor: String,
    /// Product identification (default: the bdev's product name).
    pub product: Option<String>,
    /// Product revision level.
    pub revision: String,
    /// Unit serial number (default: the bdev's name).
    pub serial: Option<String>,
    /// Write protected: the bdev is opened read-only and writes fail with DATA PROTECT.
    pub read_only: bool,
    /// Most bytes per READ or WRITE (the Block Limits page's MAXIMUM TRANSFER LENGTH).
    pub max_transfer_bytes: u32,
    /// Where the persistent reservations are kept while APTPL is on (none: APTPL is refused).
    pub aptpl_file: Option<PathBuf>,
}

impl LunConfig {
    /// Defaults for the bdev `bdev`.
    pub fn new(bdev: &str) -> LunConfig {
        LunConfig {
            bdev: bdev.into(),
            vendor: "FERRITE".into(),
            product: None,
            revision: "0001".into(),
            serial: None,
            read_only: false,
            max_transfer_bytes: 8 << 20,
            aptpl_file: None,
        }
    }
}

/// Most blocks per COMPARE AND WRITE.
pub const MAX_COMPARE_WRITE_BLOCKS: u8 = 255;
/// Most UNMAP block descriptors (what a 16-bit parameter list length holds).
pub const MAX_UNMAP_DESCRIPTORS: u32 = 4095;
/// Most blocks per WRITE SAME: LIO's limit (DA_MAX_WRITE_SAME_LEN), which a 16-bit count
/// holds; an initiator splits longer ranges (Linux sends UNMAP where the LUN takes it).
pub const MAX_WRITE_SAME_BLOCKS: u64 = 0xffff;

/// One I_T nexus that uses the logical unit: its session (on reactor `core`), who, and its unit
/// attention conditions here.
#[derive(Clone)]
pub(crate) struct NexusEntry {
    pub(crate) session: u64,
    pub(crate) core: usize,
    pub(crate) who: Initiator,
    pub(crate) ua: Arc<UnitAttention>,
}

/// The I_T nexus that holds an SPC-2 reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NexusKey {
    pub(crate) who: InitiatorId,
    pub(crate) port: u16,
}

/// A logical unit over a bdev.
pub struct Lun {
    bdev: Bdev,
    desc: Mutex<Option<BdevDesc>>,
    identity: Identity,
    read_only: bool,
    max_transfer_blocks: u32,
    pub(crate) aptpl_file: Option<PathBuf>,
    pub(crate) mode: Mutex<ModePages>,
    d_sense: AtomicBool,
    write_protected: AtomicBool,
    fua_writes: AtomicBool,
    stopped: AtomicBool,
    spc2_held: AtomicBool,
    pub(crate) spc2: Mutex<Option<NexusKey>>,
    pub(crate) nexuses: Mutex<Vec<NexusEntry>>,
}

impl Lun {
    /// Opens `cfg.bdev` as a logical unit. A resize of the bdev establishes CAPACITY DATA HAS
    /// CHANGED for every nexus; its removal closes the descriptor (commands then fail).
    /// Restores the persistent reservations from `cfg.aptpl_file` if it holds any.
    pub fn new(cfg: LunConfig) -> Result<Arc<Lun>, BdevError> {
        let me: Arc<OnceLock<Weak<Lun>>> = Arc::new(OnceLock::new());
        let cell = me.clone();
        let desc = Bdev::open_ext(&cfg.bdev, !cfg.read_only, move |e| {
            let Some(lun) = cell.get().and_then(Weak::upgrade) else { return };
            match e {
                BdevEvent::Resize => lun.establish_all(asc::CAPACITY_DATA_CHANGED, None),
                BdevEvent::Remove => drop(lun.desc.lock().unwrap_or_else(|p| p.into_inner()).take()),
                _ => {}
            }
        })?;
        let bdev = desc.bdev().clone();
        if let Some(f) = &cfg.aptpl_file {
            ferrite_bdev::reservation::persist::load(&bdev, f).map_err(BdevError::Invalid)?;
        }
        let uuid = *bdev.uuid().as_bytes();
        let identity = Identity {
            vendor: ascii_field(&cfg.vendor),
            product: ascii_field(cfg.product.as_deref().unwrap_or(bdev.product_name())),
            revision: ascii_field(&cfg.revision),
            serial: cfg.serial.clone().unwrap_or_else(|| bdev.name().to_string()),
            uuid,
        };
        let geo = Geometry {
            num_blocks: bdev.num_blocks(),
            block_size: bdev.block_size(),
            write_cache: bdev.limits().write_cache,
            read_only: cfg.read_only,
        };
        let mode = ModePages::new(&geo);
        let lun = Arc::new(Lun {
            max_transfer_blocks: (cfg.max_transfer_bytes / bdev.block_size()).max(1),
            bdev,
            desc: Mutex::new(Some(desc)),
            identity,
            read_only: cfg.read_only,
            aptpl_file: cfg.aptpl_file,
            d_sense: AtomicBool::new(mode.d_sense()),
            write_protected: AtomicBool::new(cfg.read_only || mode.swp()),
            fua_writes: AtomicBool::new(geo.write_cache && !mode.wce()),
            mode: Mutex::new(mode),
            stopped: AtomicBool::new(false),
            spc2_held: AtomicBool::new(false),
            spc2: Mutex::new(None),
            nexuses: Mutex::new(Vec::new()),
        });
        let _ = me.set(Arc::downgrade(&lun));
        Ok(lun)
    }

    /// The bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// This core's I/O channel (made on first use on each core); fails once the bdev is gone.
    pub fn channel(&self) -> Result<ferrite_bdev::IoChannel, BdevError> {
        match &*self.desc.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(d) => d.channel(),
            None => Err(BdevError::Removing(self.bdev.name().to_string())),
        }
    }

    /// The inquiry identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Most blocks per READ or WRITE.
    pub fn max_transfer_blocks(&self) -> u32 {
        self.max_transfer_blocks
    }

    /// Sense data in descriptor format (the control mode page's D_SENSE).
    #[inline]
    pub fn d_sense(&self) -> bool {
        self.d_sense.load(Ordering::Relaxed)
    }

    /// Writes are refused (read-only logical unit, or SWP).
    #[inline]
    pub fn write_protected(&self) -> bool {
        self.write_protected.load(Ordering::Relaxed)
    }

    /// Writes go with FUA (the bdev caches writes and WCE is off).
    #[inline]
    pub fn fua_writes(&self) -> bool {
        self.fua_writes.load(Ordering::Relaxed)
    }

    /// Stopped by START STOP UNIT: medium access is NOT READY.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub(crate) fn set_stopped(&self, v: bool) {
        self.stopped.store(v, Ordering::Relaxed);
    }

    /// True while an SPC-2 reservation is held (one relaxed load).
    #[inline]
    pub(crate) fn spc2_held(&self) -> bool {
        self.spc2_held.load(Ordering::Relaxed)
    }

    pub(crate) fn set_spc2(&self, v: Option<NexusKey>) {
        let mut s = self.spc2.lock().unwrap_or_else(|p| p.into_inner());
        *s = v;
        self.spc2_held.store(v.is_some(), Ordering::Relaxed);
    }

    /// Takes the SPC-2 reservation for `me`: false if another nexus holds it.
    pub(crate) fn spc2_reserve(&self, me: NexusKey) -> bool {
        let mut s = self.spc2.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_some_and(|h| h != me) {
            return false;
        }
        *s = Some(me);
        self.spc2_held.store(true, Ordering::Relaxed);
        true
    }

    /// Releases the SPC-2 reservation if `me` holds it.
    pub(crate) fn spc2_release(&self, me: NexusKey) {
        let mut s = self.spc2.lock().unwrap_or_else(|p| p.into_inner());
        if *s == Some(me) {
            *s = None;
            self.spc2_held.store(false, Ordering::Relaxed);
        }
    }

    /// The nexus holding the SPC-2 reservation, if any.
    pub(crate) fn spc2_holder(&self) -> Option<NexusKey> {
        if !self.spc2_held() {
            return None;
        }
        *self.spc2.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mode pages' facts, for MODE SENSE and MODE SELECT.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            num_blocks: self.bdev.num_blocks(),
            block_size: self.bdev.block_size(),
            write_cache: self.bdev.limits().write_cache,
            read_only: self.read_only,
        }
    }

    /// Mirrors the mode pages' switches into the atomics commands read.
    pub(crate) fn publish_mode(&self, m: &ModePages) {
        self.d_sense.store(m.d_sense(), Ordering::Relaxed);
        self.write_protected.store(self.read_only || m.swp(), Ordering::Relaxed);
        self.fua_writes.store(self.bdev.limits().write_cache && !m.wce(), Ordering::Relaxed);
    }

    /// Everything the block VPD pages and READ CAPACITY show.
    pub fn block_facts(&self) -> BlockFacts {
        let l = self.bdev.limits();
        let bs = self.bdev.block_size();
        let pbs = if l.physical_block_size == 0 { bs } else { l.physical_block_size };
        let lbppbe = (pbs / bs).max(1).trailing_zeros() as u8;
        let unmap = self.bdev.supports(IoType::Unmap) && !self.read_only;
        BlockFacts {
            lbppbe,
            max_transfer: self.max_transfer_blocks,
            opt_granularity: 1u16 << lbppbe.min(15),
            opt_transfer: l.optimal_io_boundary,
            max_compare_write: MAX_COMPARE_WRITE_BLOCKS,
            unmap,
            // Every module Ferrite has reads unmapped blocks as zeroes.
            lbprz: unmap,
            max_unmap_lba: u32::MAX,
            max_unmap_descriptors: MAX_UNMAP_DESCRIPTORS,
            unmap_granularity: l.unmap_granularity,
            unmap_alignment: l.unmap_alignment,
            max_write_same: MAX_WRITE_SAME_BLOCKS,
        }
    }

    /// Establishes `code` for every nexus (but `except`'s session).
    pub(crate) fn establish_all(&self, code: (u8, u8), except: Option<u64>) {
        for n in self.nexuses.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if Some(n.session) != except {
                n.ua.establish(code);
            }
        }
    }

    /// Establishes `code` for every nexus of initiator port `who` (any target port).
    pub(crate) fn establish_for(&self, who: &Initiator, code: (u8, u8)) {
        for n in self.nexuses.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if n.who == *who {
                n.ua.establish(code);
            }
        }
    }

    pub(crate) fn attach(&self, e: NexusEntry) {
        let mut v = self.nexuses.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert!(v.iter().all(|n| n.session != e.session), "a session attaches once");
        v.push(e);
    }

    pub(crate) fn detach(&self, session: u64) {
        self.nexuses.lock().unwrap_or_else(|p| p.into_inner()).retain(|n| n.session != session);
    }

    /// The sessions (and their cores) attached, but `except`.
    pub(crate) fn sessions(&self, except: u64) -> Vec<(u64, usize, Initiator)> {
        self.nexuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|n| n.session != except)
            .map(|n| (n.session, n.core, n.who.clone()))
            .collect()
    }
}
