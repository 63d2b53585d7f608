//! A remote LUN as a bdev: what its sessions share (where and how to log in, the LUN's
//! geometry and limits, counters), the bdev's backend (channels, `bdev_get_bdevs`'
//! driver-specific data, its `save_config` entry) and its registration.

use crate::channel::IscsiChannel;
use crate::command::UnmapLimits;
use crate::conn::ConnectParams;
use crate::scsi::{BlockLimits, Capacity, Inquiry};
use crate::url::IscsiUrl;
use ferrite_bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, IoType, IoTypes, Limits};
use ferrite_iscsi::chap::Credentials;
use ferrite_iscsi::login::InitiatorLoginConfig;
use ferrite_iscsi::negotiate::{DigestPolicy, InitiatorOptions};
use ferrite_iscsi::pdu::Isid;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The module name (SPDK's).
pub const MODULE: &str = "iscsi";
/// Commands outstanding per session at most (the target's CmdSN window may allow fewer).
pub const DEPTH: u16 = 128;
/// Bytes one read or write moves at most (larger ones are split by the bdev layer).
pub const MAX_IO_BYTES: u32 = 4 << 20;
/// The MaxRecvDataSegmentLength, MaxBurstLength and FirstBurstLength this end offers
/// (libiscsi's).
pub const OFFERED_LENGTH: u32 = 262_144;
/// Time allowed for a TCP connect and login.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// SPDK's MAXIMUM UNMAP LBA COUNT when the target gives none.
pub const DEFAULT_MAX_UNMAP: u32 = 32_768;

/// What the probe at attach learnt of the LUN.
#[derive(Debug, Clone)]
pub struct LunInfo {
    /// Standard INQUIRY data.
    pub inquiry: Inquiry,
    /// Capacity and block size.
    pub capacity: Capacity,
    /// Block Limits VPD page (defaults when the target has none).
    pub limits: BlockLimits,
    /// UNMAP is supported (Logical Block Provisioning VPD page's LBPU, else READ CAPACITY's
    /// LBPME).
    pub unmap: bool,
    /// The caching mode page's WCE.
    pub write_cache: bool,
}

/// What every reactor's session of a LUN bdev shares.
pub struct LunShared {
    /// Bdev name.
    pub name: String,
    /// The URL as given (written back by `save_config`).
    pub url: String,
    /// The initiator's name.
    pub initiator_iqn: String,
    /// The parsed URL.
    pub parsed: IscsiUrl,
    /// The portal's address (the URL's host, resolved at attach).
    pub addr: SocketAddr,
    /// `timeout_sec` of `bdev_iscsi_set_options` at attach.
    pub timeout_sec: u64,
    /// The first four ISID bytes (type "random" and 22 random bits); each session adds its
    /// qualifier.
    pub isid: [u8; 4],
    /// How UNMAP commands are cut.
    pub unmap: UnmapLimits,
    /// The bdev is being deleted: sessions stop logging in and fail what waits.
    pub removed: AtomicBool,
    /// Sessions logged in now.
    pub sessions: AtomicUsize,
    /// Logins after a lost connection, over all sessions.
    pub reconnects: AtomicU64,
    /// What the probe learnt.
    pub info: LunInfo,
}

impl LunShared {
    /// What a session (ISID qualifier `qualifier`) logs in with.
    pub fn connect_params(&self, qualifier: u16) -> ConnectParams {
        let u = &self.parsed;
        let mut login = InitiatorLoginConfig::new(&self.initiator_iqn, Some(&u.target));
        let q = qualifier.to_be_bytes();
        login.isid = Isid([self.isid[0], self.isid[1], self.isid[2], self.isid[3], q[0], q[1]]);
        login.options = InitiatorOptions {
            header_digest: u.header_digest.unwrap_or(DigestPolicy::Allowed),
            data_digest: u.data_digest.unwrap_or(DigestPolicy::Allowed),
            max_recv_data_segment_length: OFFERED_LENGTH,
            max_burst_length: OFFERED_LENGTH,
            first_burst_length: OFFERED_LENGTH,
            initial_r2t: false,
            immediate_data: true,
            ..InitiatorOptions::default()
        };
        if let (Some(name), Some(secret)) = (&u.user, &u.password) {
            login.chap = Some(Credentials { name: name.clone(), secret: secret.clone().into_bytes() });
        }
        if let (Some(name), Some(secret)) = (&u.target_user, &u.target_password) {
            login.mutual = Some(Credentials { name: name.clone(), secret: secret.clone().into_bytes() });
        }
        ConnectParams { addr: self.addr, login, lun: u.lun_field(), depth: DEPTH, timeout: LOGIN_TIMEOUT }
    }

    fn io_types(&self) -> IoTypes {
        let mut t = IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush, IoType::Reset]);
        if self.info.unmap {
            t = t.with(IoType::Unmap);
        }
        t
    }

    fn limits(&self) -> Limits {
        let c = self.info.capacity;
        let l = self.info.limits;
        let bs = c.block_size;
        let mut max_io = MAX_IO_BYTES / bs;
        if l.max_transfer > 0 {
            max_io = max_io.min(l.max_transfer);
        }
        Limits {
            physical_block_size: bs.checked_shl(u32::from(c.lbppbe)).filter(|&p| p <= 1 << 20).unwrap_or(bs),
            max_io_blocks: max_io.max(1),
            max_unmap_blocks: u64::from(self.unmap.per_descriptor),
            max_unmap_segments: self.unmap.descriptors,
            unmap_granularity: if self.info.unmap { l.unmap_granularity } else { 0 },
            unmap_alignment: if self.info.unmap { l.unmap_alignment.unwrap_or(0) } else { 0 },
            write_cache: self.info.write_cache,
            ..Limits::default()
        }
    }
}

/// UNMAP limits from the Block Limits page (SPDK's default LBA count when none is given).
pub fn unmap_limits(l: &BlockLimits) -> UnmapLimits {
    let per_descriptor = match l.max_unmap_lbas {
        0 => DEFAULT_MAX_UNMAP,
        n => n,
    };
    let descriptors = l.max_unmap_descriptors.clamp(1, crate::scsi::MAX_UNMAP_DESCRIPTORS);
    UnmapLimits { per_descriptor, descriptors }
}

/// The bdev's backend.
pub(crate) struct LunBackend {
    pub(crate) lun: Arc<LunShared>,
}

impl BdevBackend for LunBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(IscsiChannel::new(self.lun.clone())))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn driver_specific(&self) -> Value {
        let l = &self.lun;
        // SPDK's two members, then Ferrite's.
        json!({"iscsi": {"initiator_name": l.initiator_iqn, "url": l.url,
            "target": l.parsed.target, "lun": l.parsed.lun, "portal": l.addr.to_string(),
            "vendor": l.info.inquiry.vendor, "product": l.info.inquiry.product,
            "sessions": l.sessions.load(Ordering::Relaxed), "reconnects": l.reconnects.load(Ordering::Relaxed),
            "timeout_sec": l.timeout_sec}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let l = &self.lun;
        Some(json!({"method": "bdev_iscsi_create", "params": {"name": bdev.name(),
            "initiator_iqn": l.initiator_iqn, "url": l.url}}))
    }

    fn destruct(&self, done: ferrite_bdev::Destructed) {
        self.lun.removed.store(true, Ordering::Release);
        log::info!("iscsi bdev {}: removed", self.lun.name);
        done.finish();
    }
}

/// Registers the bdev of `lun`.
pub fn register_lun(lun: Arc<LunShared>) -> Result<Bdev, BdevError> {
    let c = lun.info.capacity;
    let props = BdevProps {
        name: lun.name.clone(),
        aliases: vec![],
        uuid: None,
        block_size: c.block_size,
        num_blocks: c.blocks,
        product_name: "iSCSI LUN",
        module: MODULE,
        io_types: lun.io_types(),
        limits: lun.limits(),
    };
    register(props, Arc::new(LunBackend { lun }))
}

/// The shared state behind an iSCSI bdev.
pub fn lun_of(bdev: &Bdev) -> Option<Arc<LunShared>> {
    let b = bdev.backend().as_any()?.downcast_ref::<LunBackend>()?;
    Some(b.lun.clone())
}
