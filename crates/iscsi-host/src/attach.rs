//! `bdev_iscsi_create`'s work: parse the URL, find the portal, log in once to learn the LUN
//! (as SPDK's bdev_iscsi does with libiscsi: unit attentions cleared with TEST UNIT READY,
//! standard INQUIRY, the Logical Block Provisioning and Block Limits VPD pages, READ
//! CAPACITY (16), falling back to (10), and the caching mode page), log out, and register the
//! bdev. Each reactor's session then logs in on its own when the bdev is first used there.

use crate::conn::{Conn, Reply};
use crate::lun::{register_lun, unmap_limits, LunInfo, LunShared};
use crate::scsi::{self, key, status, BlockLimits, Capacity};
use crate::url::IscsiUrl;
use ferrite_bdev::{Bdev, BdevError};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

/// The ISID qualifier of the probe's session (reactors number theirs from 0).
const PROBE_QUALIFIER: u16 = 0xffff;
/// Time the target has to answer the probe's commands, all together.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What `bdev_iscsi_create` asks for.
#[derive(Debug, Clone)]
pub struct AttachOpts {
    /// Bdev name.
    pub name: String,
    /// libiscsi's URL of the LUN.
    pub url: String,
    /// The initiator's name.
    pub initiator_iqn: String,
    /// `timeout_sec` of `bdev_iscsi_set_options`.
    pub timeout_sec: u64,
}

/// Why an attach failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// The parameters are wrong (SPDK answers -EINVAL before connecting).
    Invalid(String),
    /// The bdev name is taken.
    Exists(String),
    /// The target could not be reached, refused the login, or has no usable LUN there.
    Failed(String),
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::Invalid(m) | AttachError::Exists(m) | AttachError::Failed(m) => f.write_str(m),
        }
    }
}

/// The portal's address: the host as an address, or its name resolved (off the reactor).
async fn resolve(u: &IscsiUrl) -> Result<SocketAddr, AttachError> {
    if let Ok(ip) = u.host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, u.port));
    }
    let (host, port) = (u.host.clone(), u.port);
    let found = ferrite_reactor::spawn_blocking(move || (host.as_str(), port).to_socket_addrs().map(|mut a| a.next()))
        .await
        .map_err(|e| AttachError::Failed(format!("name resolution failed: {e}")))?;
    match found {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(AttachError::Failed(format!("{} has no address", u.host))),
        Err(e) => Err(AttachError::Failed(format!("cannot resolve {}: {e}", u.host))),
    }
}

/// A command of the probe, sent again after unit attentions (a new nexus may have several).
async fn probe_cmd(c: &Conn, cdb: scsi::Cdb, len: u32) -> Result<Reply, AttachError> {
    let mut tries = 0;
    loop {
        let r = c.command(cdb, None, len).await.map_err(AttachError::Failed)?;
        let ua = r.status == status::CHECK_CONDITION && r.sense.is_some_and(|s| s.key == key::UNIT_ATTENTION);
        tries += 1;
        if !ua || tries > 8 {
            return Ok(r);
        }
    }
}

fn good(r: &Reply) -> bool {
    r.status == status::GOOD
}

/// Learns the LUN through a logged-in connection.
async fn probe(c: &Conn, lun: u16) -> Result<LunInfo, AttachError> {
    let tur = probe_cmd(c, scsi::test_unit_ready(), 0).await?;
    if tur.status == status::CHECK_CONDITION && tur.sense.is_some_and(|s| s.key == key::NOT_READY) {
        return Err(AttachError::Failed(format!("LUN {lun} is not ready ({:?})", tur.sense)));
    }
    let r = probe_cmd(c, scsi::inquiry(None, 96), 96).await?;
    let inquiry = scsi::parse_inquiry(&r.data)
        .filter(|_| good(&r))
        .ok_or_else(|| AttachError::Failed(format!("INQUIRY failed (status {:#04x}, {:?})", r.status, r.sense)))?;
    if inquiry.qualifier != 0 {
        return Err(AttachError::Failed(format!("the target has no LUN {lun}")));
    }
    if inquiry.device_type != 0 {
        return Err(AttachError::Failed(format!(
            "LUN {lun} is not a block device (peripheral device type {:#04x})",
            inquiry.device_type
        )));
    }
    let r = probe_cmd(c, scsi::inquiry(Some(0xb2), 64), 64).await?;
    let lbpu = if good(&r) { scsi::parse_lbpu(&r.data) } else { None };
    let r = probe_cmd(c, scsi::inquiry(Some(0xb0), 64), 64).await?;
    let limits = if good(&r) { scsi::parse_block_limits(&r.data).unwrap_or_default() } else { BlockLimits::default() };
    let r = probe_cmd(c, scsi::read_capacity16(), scsi::READ_CAPACITY16_LEN).await?;
    let capacity: Capacity = match good(&r).then(|| scsi::parse_capacity16(&r.data)).flatten() {
        Some(cap) => cap,
        None => {
            let r = probe_cmd(c, scsi::read_capacity10(), 8).await?;
            good(&r).then(|| scsi::parse_capacity10(&r.data)).flatten().ok_or_else(|| {
                AttachError::Failed(format!("READ CAPACITY failed (status {:#04x}, {:?})", r.status, r.sense))
            })?
        }
    };
    let bs = capacity.block_size;
    if !(512..=65536).contains(&bs) || !bs.is_multiple_of(512) {
        return Err(AttachError::Failed(format!("block size {bs} is not a multiple of 512 from 512 to 65536")));
    }
    if capacity.blocks == 0 {
        return Err(AttachError::Failed(format!("LUN {lun} has no blocks")));
    }
    let r = probe_cmd(c, scsi::mode_sense_caching(64), 64).await?;
    let write_cache = good(&r) && scsi::parse_wce(&r.data).unwrap_or(false);
    Ok(LunInfo { inquiry, capacity, limits, unmap: lbpu.unwrap_or(capacity.lbpme), write_cache })
}

/// Attaches the LUN as a bdev (on the reactor that runs the RPC).
pub async fn attach(o: AttachOpts) -> Result<Bdev, AttachError> {
    ferrite_bdev::bdev::check_name(&o.name).map_err(|e| AttachError::Invalid(e.to_string()))?;
    if o.initiator_iqn.is_empty() {
        return Err(AttachError::Invalid("initiator_iqn is empty".into()));
    }
    let parsed = IscsiUrl::parse(&o.url).map_err(|e| AttachError::Invalid(format!("could not parse URL: {e}")))?;
    if parsed.user.is_some() && parsed.password.is_none() {
        return Err(AttachError::Invalid("the URL has a CHAP user without a secret (user%secret@)".into()));
    }
    if ferrite_bdev::lookup(&o.name).is_some() {
        return Err(AttachError::Exists(format!("bdev {} already exists", o.name)));
    }
    let addr = resolve(&parsed).await?;
    let mut isid = [0u8; 4];
    ferrite_iscsi::chap::system_random(&mut isid[1..]);
    // ISID type 10b (random): T in the two high bits, then 22 random bits.
    isid[0] = 0x80;
    let mut lun = LunShared {
        name: o.name.clone(),
        url: o.url.clone(),
        initiator_iqn: o.initiator_iqn.clone(),
        parsed,
        addr,
        timeout_sec: o.timeout_sec,
        isid,
        unmap: unmap_limits(&BlockLimits::default()),
        removed: AtomicBool::new(false),
        sessions: AtomicUsize::new(0),
        reconnects: AtomicU64::new(0),
        info: LunInfo {
            inquiry: scsi::Inquiry { qualifier: 0, device_type: 0, vendor: String::new(), product: String::new() },
            capacity: Capacity { blocks: 0, block_size: 512, lbppbe: 0, lbpme: false },
            limits: BlockLimits::default(),
            unmap: false,
            write_cache: false,
        },
    };
    let conn = Conn::connect(&lun.connect_params(PROBE_QUALIFIER))
        .await
        .map_err(|e| AttachError::Failed(format!("iSCSI login to {addr} failed: {e}")))?;
    let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
    let info = crate::conn::with_deadline(probe(&conn, lun.parsed.lun), deadline)
        .await
        .unwrap_or_else(|| Err(AttachError::Failed(format!("the target did not answer within {PROBE_TIMEOUT:?}"))));
    conn.logout(Duration::from_secs(2)).await;
    let info = info?;
    lun.unmap = unmap_limits(&info.limits);
    log::info!(
        "iscsi bdev {}: {} LUN {} at {addr}: {} {}, {} blocks of {} B{}{}",
        lun.name,
        lun.parsed.target,
        lun.parsed.lun,
        info.inquiry.vendor,
        info.inquiry.product,
        info.capacity.blocks,
        info.capacity.block_size,
        if info.unmap { ", unmap" } else { "" },
        if info.write_cache { ", write cache" } else { "" }
    );
    lun.info = info;
    register_lun(Arc::new(lun)).map_err(|e| match e {
        BdevError::Exists(m) => AttachError::Exists(format!("bdev {m} already exists")),
        e => AttachError::Failed(e.to_string()),
    })
}
