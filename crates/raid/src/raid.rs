//! RAID bdevs and their members: the control plane (SPDK's bdev_raid.c). Everything here runs
//! on the engine's first core, one operation at a time (`ctl::lock`); the data path is in
//! `channel`.
//!
//! A RAID is `Configuring` until every member it expects has appeared (at create, or by
//! examine), then its bdev registers and it is `Online`; a raid0 or concat that loses a member,
//! or a raid1 that loses its last, is unregistered and `Offline`. Members are opened for writing
//! and claimed (module "raid").

use crate::channel::{Layout, RaidChannel};
use crate::ctl;
use crate::level::Level;
use crate::sb::{self, MemberState, Superblock};
use ferrite_bdev::{Bdev, BdevBackend, BdevDesc, BdevError, BdevEvent, BdevProps, IoStatus, IoType, IoTypes, Limits};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use uuid::Uuid;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "raid";
/// Product name of RAID bdevs, as SPDK's.
pub const PRODUCT: &str = "Raid Volume";

/// A RAID's state (`enum spdk_bdev_raid_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Registered and serving I/O.
    Online,
    /// Waiting for members.
    Configuring,
    /// Unregistered after losing members it cannot do without.
    Offline,
}

impl State {
    /// SPDK's name (`bdev_raid_get_bdevs` category).
    pub fn name(self) -> &'static str {
        match self {
            State::Online => "online",
            State::Configuring => "configuring",
            State::Offline => "offline",
        }
    }
}

/// One slot of a RAID.
#[derive(Default)]
pub(crate) struct Slot {
    /// The member's name, once known.
    pub(crate) name: Option<String>,
    /// The member's UUID (nil: not known).
    pub(crate) uuid: Uuid,
    /// The open, claimed member.
    pub(crate) desc: Option<BdevDesc>,
    /// Where its data region starts, in blocks.
    pub(crate) data_offset: u64,
    /// Its data region's size, in blocks.
    pub(crate) data_size: u64,
    /// Counted as discovered (SPDK's `is_configured`).
    pub(crate) configured: bool,
    /// Being rebuilt: takes writes, serves no reads.
    pub(crate) target: bool,
    /// Its removal is under way.
    pub(crate) removing: bool,
    /// It failed a request: reads stay away from it on every core at once (the layouts'
    /// refresh follows).
    pub(crate) failing: Arc<AtomicBool>,
}

/// A background process (rebuild) as the control plane sees it.
pub(crate) struct Process {
    pub(crate) target: usize,
    /// Blocks done.
    pub(crate) offset: Arc<std::sync::atomic::AtomicU64>,
    /// Set to stop it.
    pub(crate) cancel: Arc<std::sync::atomic::AtomicBool>,
    /// Told when it has stopped.
    pub(crate) done: Vec<ferrite_reactor::oneshot::Sender<()>>,
}

/// What can change about a RAID.
pub(crate) struct RaidState {
    pub(crate) state: State,
    pub(crate) block_size: u32,
    pub(crate) strip_blocks: u32,
    pub(crate) raid_blocks: u64,
    pub(crate) slots: Vec<Slot>,
    pub(crate) discovered: usize,
    pub(crate) operational: usize,
    pub(crate) sb: Option<Superblock>,
    pub(crate) bdev: Option<Bdev>,
    pub(crate) process: Option<Process>,
    pub(crate) deleting: bool,
}

/// A RAID bdev, registered or waiting for its members.
pub struct Raid {
    /// Its name.
    pub name: String,
    /// Its UUID.
    pub uuid: Uuid,
    /// Its level.
    pub level: Level,
    /// Strip size in KiB (0 for raid1).
    pub strip_size_kb: u32,
    /// With SPDK's superblock on its members.
    pub superblock: bool,
    min_operational: usize,
    pub(crate) st: Mutex<RaidState>,
}

#[derive(Default)]
struct Raids(Vec<Arc<Raid>>);

fn raids() -> ferrite_reactor::StateGuard<Raids> {
    ferrite_reactor::lock_state::<Raids>()
}

/// Every RAID, in creation order.
pub fn all() -> Vec<Arc<Raid>> {
    raids().0.clone()
}

/// The RAID named `name`.
pub fn find(name: &str) -> Option<Arc<Raid>> {
    raids().0.iter().find(|r| r.name == name).cloned()
}

pub(crate) fn find_by_uuid(u: &Uuid) -> Option<Arc<Raid>> {
    raids().0.iter().find(|r| &r.uuid == u).cloned()
}

fn forget(raid: &Arc<Raid>) {
    raids().0.retain(|r| !Arc::ptr_eq(r, raid));
}

/// A configuring RAID with a superblock, as examine makes it from one.
pub(crate) fn new_from_sb(
    name: &str,
    level: Level,
    n: usize,
    strip_size_kb: u32,
    uuid: Uuid,
) -> Result<Arc<Raid>, BdevError> {
    Raid::new(name, level, n, strip_size_kb, uuid, true)
}

/// What `bdev_raid_create` asks for.
pub struct CreateOpts {
    /// Name of the RAID bdev.
    pub name: String,
    /// Level.
    pub level: Level,
    /// Members, by name.
    pub base_bdevs: Vec<String>,
    /// Strip size in KiB (0 for raid1).
    pub strip_size_kb: u32,
    /// UUID (None or nil: a new one).
    pub uuid: Option<Uuid>,
    /// Write SPDK's superblock on the members.
    pub superblock: bool,
}

fn inval(msg: impl Into<String>) -> BdevError {
    BdevError::Errno(libc::EINVAL, msg.into())
}

impl Raid {
    fn new(
        name: &str,
        level: Level,
        n: usize,
        strip_size_kb: u32,
        uuid: Uuid,
        superblock: bool,
    ) -> Result<Arc<Raid>, BdevError> {
        if name.len() >= sb::NAME_LEN {
            return Err(inval(format!("Raid bdev name '{name}' exceeds {} characters", sb::NAME_LEN - 1)));
        }
        ferrite_bdev::bdev::check_name(name)?;
        if find(name).is_some() {
            return Err(BdevError::Errno(libc::EEXIST, format!("Duplicate raid bdev name found: {name}")));
        }
        if level == Level::Raid1 {
            if strip_size_kb != 0 {
                return Err(inval("Strip size is not supported by raid1"));
            }
        } else if !strip_size_kb.is_power_of_two() {
            return Err(inval(format!("Invalid strip size {strip_size_kb}")));
        }
        if n < level.min_members() {
            return Err(inval(format!("At least {} base devices required for {}", level.min_members(), level.name())));
        }
        if n > 255 {
            return Err(inval("At most 255 base devices"));
        }
        let slots = (0..n).map(|_| Slot::default()).collect();
        let raid = Arc::new(Raid {
            name: name.to_string(),
            uuid,
            level,
            strip_size_kb,
            superblock,
            min_operational: level.min_operational(n),
            st: Mutex::new(RaidState {
                state: State::Configuring,
                block_size: 0,
                strip_blocks: 0,
                raid_blocks: 0,
                slots,
                discovered: 0,
                operational: n,
                sb: None,
                bdev: None,
                process: None,
                deleting: false,
            }),
        });
        raids().0.push(raid.clone());
        Ok(raid)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, RaidState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its state.
    pub fn state(&self) -> State {
        self.lock().state
    }

    /// The members as a channel on this core sees them now.
    pub(crate) fn layout(&self) -> Result<Layout, BdevError> {
        let st = self.lock();
        let mut l = Layout::new(self.level, st.strip_blocks as u64);
        for s in &st.slots {
            let ch = match (&s.desc, s.configured && !s.removing) {
                (Some(d), true) => Some(d.channel()?),
                _ => None,
            };
            l.push(ch, s.data_offset, s.data_size, s.configured && !s.target && !s.removing, s.failing.clone());
        }
        Ok(l)
    }

    /// A member failed a request (from any core): it is removed, once.
    pub(crate) fn member_failed(self: &Arc<Self>, slot: usize, status: IoStatus) {
        let name = {
            let mut st = self.lock();
            let Some(s) = st.slots.get_mut(slot) else { return };
            if s.removing || !s.configured {
                return;
            }
            s.failing.store(true, Ordering::Release);
            s.removing = true;
            s.name.clone().unwrap_or_default()
        };
        log::warn!("raid {}: member {name} (slot {slot}) failed a request ({status}); removing it", self.name);
        let raid = self.clone();
        let run = move || {
            ferrite_reactor::spawn_local(async move {
                let _g = ctl::lock().await;
                if let Err(e) = remove_slot(&raid, slot, true).await {
                    log::warn!("raid {}: removing slot {slot}: {e}", raid.name);
                }
            })
            .detach();
        };
        match ferrite_reactor::current_engine() {
            Some(e) if ferrite_reactor::current() != Some(0) => e.send(0, run),
            _ => run(),
        }
    }

    /// `bdev_raid_get_bdevs`' object for this RAID (SPDK's `raid_bdev_write_info_json`, with the
    /// name first).
    pub fn info(&self) -> Value {
        let st = self.lock();
        let mut v = json!({
            "name": self.name,
            "uuid": self.uuid.to_string(),
            "strip_size_kb": self.strip_size_kb,
            "state": st.state.name(),
            "raid_level": self.level.name(),
            "superblock": self.superblock,
            "num_base_bdevs": st.slots.len(),
            "num_base_bdevs_discovered": st.discovered,
            "num_base_bdevs_operational": st.operational,
        });
        if let Some(p) = &st.process {
            let off = p.offset.load(std::sync::atomic::Ordering::Relaxed);
            let pct = if st.raid_blocks == 0 { 0 } else { (off as f64 * 100.0 / st.raid_blocks as f64) as u32 };
            v["process"] = json!({
                "type": "rebuild",
                "target": st.slots[p.target].name,
                "progress": {"blocks": off, "percent": pct},
            });
        }
        v["base_bdevs_list"] = st
            .slots
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "uuid": s.uuid.to_string(),
                    "is_configured": s.configured,
                    "data_offset": s.data_offset,
                    "data_size": s.data_size,
                })
            })
            .collect();
        v
    }

    /// The member bdevs open now.
    fn member_bdevs(&self) -> Vec<Bdev> {
        self.lock().slots.iter().filter_map(|s| s.desc.as_ref().map(|d| d.bdev().clone())).collect()
    }
}

/// The registered RAID bdev's backend.
struct RaidBackend {
    raid: Arc<Raid>,
}

impl BdevBackend for RaidBackend {
    fn create_channel(&self) -> Result<Box<dyn ferrite_bdev::BackendChannel>, BdevError> {
        Ok(Box::new(RaidChannel::new(self.raid.clone())?))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn driver_specific(&self) -> Value {
        let mut v = self.raid.info();
        if let Some(o) = v.as_object_mut() {
            o.remove("name");
        }
        json!({ "raid": v })
    }

    fn base_bdevs(&self) -> Vec<Bdev> {
        self.raid.member_bdevs()
    }

    /// Every opener has closed the RAID bdev: its members are closed (their claims released).
    /// Unless it is being deleted, the RAID stays listed, offline.
    fn destruct(&self, done: ferrite_bdev::Destructed) {
        let raid = &self.raid;
        let deleting = {
            let mut st = raid.lock();
            st.bdev = None;
            // A rebuild cannot go on without the RAID bdev's range locks.
            if let Some(p) = &st.process {
                p.cancel.store(true, std::sync::atomic::Ordering::Release);
            }
            if st.state == State::Online {
                st.state = State::Offline;
            }
            for s in st.slots.iter_mut() {
                s.desc = None;
                s.target = false;
                s.removing = false;
                if s.configured {
                    s.configured = false;
                }
            }
            st.discovered = 0;
            st.deleting
        };
        if deleting {
            forget(raid);
        }
        log::info!("raid {}: unregistered; members released", raid.name);
        done.finish();
    }

    /// SPDK's `raid_bdev_write_config_json`: nothing for a RAID with a superblock (examine
    /// assembles it), else `bdev_raid_create` with its members (`removed_base_bdev_N` for an
    /// empty slot).
    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let raid = &self.raid;
        if raid.superblock {
            return None;
        }
        let st = raid.lock();
        let names: Vec<String> = st
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| s.name.clone().unwrap_or_else(|| format!("removed_base_bdev_{i}")))
            .collect();
        let mut p = json!({"name": bdev.name(), "uuid": raid.uuid.to_string(), "raid_level": raid.level.name(), "base_bdevs": names});
        if raid.strip_size_kb != 0 {
            p["strip_size_kb"] = json!(raid.strip_size_kb);
        }
        Some(json!({"method": "bdev_raid_create", "params": p}))
    }
}

/// The RAID of a registered RAID bdev.
pub fn of_bdev(bdev: &Bdev) -> Option<Arc<Raid>> {
    bdev.backend().as_any()?.downcast_ref::<RaidBackend>().map(|b| b.raid.clone())
}

/// `bdev_raid_create`: makes the RAID and configures the members there are; it goes online
/// once every member is there (now, or when the rest appear).
pub async fn create(o: CreateOpts) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    if o.base_bdevs.iter().any(|n| n.is_empty()) {
        return Err(inval("The base bdev name cannot be empty"));
    }
    let uuid = o.uuid.filter(|u| !u.is_nil()).unwrap_or_else(Uuid::new_v4);
    let raid = Raid::new(&o.name, o.level, o.base_bdevs.len(), o.strip_size_kb, uuid, o.superblock)?;
    {
        let mut st = raid.lock();
        for (s, n) in st.slots.iter_mut().zip(&o.base_bdevs) {
            s.name = Some(n.clone());
        }
    }
    for i in 0..o.base_bdevs.len() {
        match configure_member(&raid, i, true).await {
            Ok(()) => {}
            Err(BdevError::NotFound(n)) => log::info!("raid {}: base bdev {n} doesn't exist now", raid.name),
            Err(e) => {
                release_all(&raid);
                forget(&raid);
                return Err(e);
            }
        }
    }
    if let Err(e) = maybe_configure(&raid).await {
        release_all(&raid);
        forget(&raid);
        return Err(e);
    }
    Ok(())
}

/// Closes every member (releasing the claims) of a RAID that is not registered.
fn release_all(raid: &Raid) {
    let mut st = raid.lock();
    for s in st.slots.iter_mut() {
        s.desc = None;
        s.configured = false;
    }
    st.discovered = 0;
}

/// Opens and claims the member of slot `i` (by its name), checks it against the RAID, and
/// counts it as discovered (SPDK's `raid_bdev_configure_base_bdev`). With `check_sb`, a member
/// that holds another RAID's superblock is refused (EEXIST).
pub(crate) async fn configure_member(raid: &Arc<Raid>, i: usize, check_sb: bool) -> Result<(), BdevError> {
    let (name, want_uuid) = {
        let st = raid.lock();
        let s = &st.slots[i];
        debug_assert!(s.desc.is_none(), "a slot is configured once");
        (s.name.clone(), s.uuid)
    };
    let name = match name {
        Some(n) => n,
        None => ferrite_bdev::lookup(&want_uuid.to_string())
            .map(|b| b.name().to_string())
            .ok_or_else(|| BdevError::NotFound(want_uuid.to_string()))?,
    };
    let weak = Arc::downgrade(raid);
    let desc = Bdev::open_ext(&name, true, move |ev| {
        if ev == BdevEvent::Remove {
            member_removed(&weak, i);
        }
    })?;
    let bdev = desc.bdev().clone();
    if !want_uuid.is_nil() && want_uuid != bdev.uuid() {
        return Err(inval(format!("UUID mismatch for base bdev '{name}'")));
    }
    desc.claim(MODULE).map_err(|e| {
        BdevError::Errno(libc::EPERM, format!("Unable to claim this bdev as it is already claimed: {e}"))
    })?;
    let bs = bdev.block_size();
    {
        let st = raid.lock();
        if st.block_size != 0 && st.block_size != bs {
            return Err(inval(format!(
                "Raid bdev '{}' blocklen {} differs from base bdev '{name}' blocklen {bs}",
                raid.name, st.block_size
            )));
        }
    }
    if check_sb {
        let ch = desc.channel()?;
        if let Ok(Some(found)) = crate::examine::read_sb(&ch, bs).await {
            if found.uuid != raid.uuid {
                return Err(BdevError::Errno(
                    libc::EEXIST,
                    format!("Superblock of a different raid bdev found on bdev {name}"),
                ));
            }
        }
    }
    let mut st = raid.lock();
    let s = &st.slots[i];
    let mut data_offset = s.data_offset;
    if raid.superblock && data_offset == 0 {
        data_offset = sb::MIN_DATA_OFFSET_BYTES.div_ceil(bs as u64);
        let b = bdev.limits().optimal_io_boundary as u64;
        if b != 0 {
            data_offset = data_offset.div_ceil(b) * b;
        }
    }
    if data_offset >= bdev.num_blocks() {
        return Err(inval(format!(
            "Data offset {data_offset} exceeds base bdev capacity {} on bdev '{name}'",
            bdev.num_blocks()
        )));
    }
    let data_size = if s.data_size == 0 {
        bdev.num_blocks() - data_offset
    } else if data_offset + s.data_size > bdev.num_blocks() {
        return Err(inval(format!(
            "Data offset and size exceeds base bdev capacity {} on bdev '{name}'",
            bdev.num_blocks()
        )));
    } else {
        s.data_size
    };
    st.block_size = bs;
    let online = st.state == State::Online;
    let s = &mut st.slots[i];
    s.name = Some(name.clone());
    s.uuid = bdev.uuid();
    s.data_offset = data_offset;
    s.data_size = data_size;
    s.desc = Some(desc);
    s.configured = true;
    s.target = online;
    s.removing = false;
    // A new member: layouts made from now on see it healthy; older ones keep the old flag.
    s.failing = Arc::new(AtomicBool::new(false));
    st.discovered += 1;
    debug_assert!(st.discovered <= st.slots.len());
    log::info!("raid {}: base bdev {name} is claimed (slot {i})", raid.name);
    Ok(())
}

/// Registers the RAID bdev once every operational member is there (SPDK's
/// `raid_bdev_configure`): sizes the members' data regions for the level, writes the
/// superblock, registers.
pub(crate) async fn maybe_configure(raid: &Arc<Raid>) -> Result<(), BdevError> {
    let (bs, sb_bytes) = {
        let mut st = raid.lock();
        if st.state != State::Configuring || st.discovered != st.operational {
            return Ok(());
        }
        let bs = st.block_size;
        let strip = (raid.strip_size_kb as u64 * 1024 / bs as u64) as u32;
        if strip == 0 && raid.level.striped() {
            return Err(inval("Strip size cannot be smaller than the device block size"));
        }
        st.strip_blocks = strip;
        let sizes: Vec<u64> = st.slots.iter().filter(|s| s.data_size > 0).map(|s| s.data_size).collect();
        let min = sizes.iter().copied().min().unwrap_or(0);
        let n = st.slots.len() as u64;
        let raid_blocks = match raid.level {
            Level::Raid0 => {
                let per = min / strip as u64 * strip as u64;
                st.slots.iter_mut().for_each(|s| s.data_size = per);
                per * n
            }
            Level::Raid1 => {
                st.slots.iter_mut().filter(|s| s.data_size > 0).for_each(|s| s.data_size = min);
                min
            }
            Level::Raid5f => {
                // SPDK's raid5f_start: whole strips on every member, one of each stripe parity.
                let per = min / strip as u64 * strip as u64;
                st.slots.iter_mut().for_each(|s| s.data_size = per);
                per * (n - 1)
            }
            Level::Concat => st
                .slots
                .iter_mut()
                .map(|s| {
                    s.data_size = s.data_size / strip as u64 * strip as u64;
                    s.data_size
                })
                .sum(),
        };
        if raid_blocks == 0 {
            return Err(inval("the members leave no room for data"));
        }
        st.raid_blocks = raid_blocks;
        let sb_bytes = if raid.superblock {
            match &st.sb {
                None => st.sb = Some(new_superblock(raid, &st)),
                Some(sb) => {
                    if sb.block_size != bs {
                        return Err(inval("blocklen does not match value in superblock"));
                    }
                    if sb.raid_size != raid_blocks {
                        return Err(inval("blockcnt does not match value in superblock"));
                    }
                }
            }
            true
        } else {
            false
        };
        (bs, sb_bytes)
    };
    if sb_bytes {
        write_superblock(raid).await?;
    }
    let props = {
        let st = raid.lock();
        let members: Vec<Bdev> = st.slots.iter().filter_map(|s| s.desc.as_ref().map(|d| d.bdev().clone())).collect();
        let mut io_types = IoTypes::of(&[IoType::Read, IoType::Write]);
        // raid5f has no flush, unmap or write zeroes (SPDK's has no null-payload path).
        let null_payload = if raid.level == Level::Raid5f {
            &[][..]
        } else {
            &[IoType::Flush, IoType::Unmap, IoType::WriteZeroes][..]
        };
        for &t in null_payload {
            if members.iter().all(|b| b.supports(t)) {
                io_types = io_types.with(t);
            }
        }
        let mut limits = Limits {
            buf_align: members.iter().map(|b| b.limits().buf_align).max().unwrap_or(1),
            seg_len_align: members.iter().map(|b| b.limits().seg_len_align).max().unwrap_or(1),
            physical_block_size: members.iter().map(|b| b.limits().physical_block_size).max().unwrap_or(0),
            write_cache: members.iter().any(|b| b.limits().write_cache),
            ..Limits::default()
        };
        if raid.level == Level::Concat || (raid.level == Level::Raid0 && st.slots.len() > 1) {
            limits.optimal_io_boundary = st.strip_blocks;
        }
        if raid.level == Level::Raid5f {
            // SPDK's raid5f_start: reads are split at strips, writes into whole stripes (and a
            // write that is not whole stripes fails in the layer).
            limits.optimal_io_boundary = st.strip_blocks;
            limits.split_on_optimal_io_boundary = true;
            limits.write_unit_size = st.strip_blocks * (st.slots.len() as u32 - 1);
            limits.split_on_write_unit = true;
        }
        BdevProps {
            name: raid.name.clone(),
            aliases: vec![],
            uuid: Some(raid.uuid),
            block_size: bs,
            num_blocks: st.raid_blocks,
            product_name: PRODUCT,
            module: MODULE,
            io_types,
            limits,
        }
    };
    let bdev = ferrite_bdev::register(props, Arc::new(RaidBackend { raid: raid.clone() }))?;
    {
        let mut st = raid.lock();
        st.state = State::Online;
        st.bdev = Some(bdev);
    }
    log::info!("raid {}: online ({}, {} blocks)", raid.name, raid.level.name(), raid.lock().raid_blocks);
    Ok(())
}

fn new_superblock(raid: &Raid, st: &RaidState) -> Superblock {
    Superblock {
        minor: sb::VERSION_MINOR,
        flags: 0,
        uuid: raid.uuid,
        name: raid.name.clone(),
        raid_size: st.raid_blocks,
        block_size: st.block_size,
        level: raid.level.number(),
        strip_size: st.strip_blocks,
        state: 0,
        seq_number: 0,
        num_base_bdevs: st.slots.len() as u8,
        members: st
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| sb::Member {
                uuid: s.uuid,
                data_offset: s.data_offset,
                data_size: s.data_size,
                state: if s.configured { MemberState::Configured } else { MemberState::Missing },
                flags: 0,
                slot: i as u8,
            })
            .collect(),
    }
}

/// Writes the superblock, its sequence number one higher, to every configured member (SPDK's
/// `raid_bdev_write_superblock`).
pub(crate) async fn write_superblock(raid: &Arc<Raid>) -> Result<(), BdevError> {
    let (bytes, chans) = {
        let mut st = raid.lock();
        let bs = st.block_size as usize;
        let Some(sb) = st.sb.as_mut() else { return Ok(()) };
        sb.seq_number += 1;
        let len = sb.len().div_ceil(bs) * bs;
        let bytes = sb.encode(len);
        let chans: Vec<_> = st
            .slots
            .iter()
            .filter(|s| s.configured && !s.removing)
            .filter_map(|s| s.desc.as_ref().map(|d| (d.bdev().name().to_string(), d.channel())))
            .collect();
        (bytes, chans)
    };
    write_on_members(bytes, chans, &raid.name).await
}

async fn write_on_members(
    bytes: Vec<u8>,
    chans: Vec<(String, Result<ferrite_bdev::IoChannel, BdevError>)>,
    raid: &str,
) -> Result<(), BdevError> {
    let mut failed = None;
    for (name, ch) in chans {
        let ch = ch?;
        let bs = ch.block_size() as u64;
        let mut buf = ferrite_reactor::alloc_buf(bytes.len());
        buf.copy_from_slice(&bytes);
        let c = ch.submit_wait(ferrite_bdev::IoRequest::write(0, bytes.len() as u64 / bs, buf)).await;
        if !c.status.is_ok() {
            log::error!("raid {raid}: failed to save superblock on bdev {name}: {}", c.status);
            failed = Some(BdevError::Errno(libc::EIO, format!("Failed to save superblock on bdev {name}")));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// A member started going away (its `Remove` event, on the first core).
fn member_removed(weak: &Weak<Raid>, slot: usize) {
    let Some(raid) = weak.upgrade() else { return };
    {
        let mut st = raid.lock();
        if st.state != State::Online {
            // Not serving I/O: let it go now.
            let s = &mut st.slots[slot];
            s.desc = None;
            if std::mem::take(&mut s.configured) {
                st.discovered -= 1;
            }
            return;
        }
    }
    ferrite_reactor::spawn_local(async move {
        let _g = ctl::lock().await;
        if let Err(e) = remove_slot(&raid, slot, false).await {
            log::warn!("raid {}: removing slot {slot}: {e}", raid.name);
        }
    })
    .detach();
}

/// `bdev_raid_remove_base_bdev`: removes the member named `name` from its RAID.
pub async fn remove_base_bdev(name: &str) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let found = all().into_iter().find_map(|r| {
        let i = r.lock().slots.iter().position(|s| s.desc.as_ref().is_some_and(|d| d.bdev().name() == name));
        i.map(|i| (r, i))
    });
    let (raid, slot) =
        found.ok_or_else(|| BdevError::Errno(libc::ENODEV, format!("bdev to remove '{name}' not found")))?;
    remove_slot(&raid, slot, false).await
}

/// Removes the member of `slot` (SPDK's `_raid_bdev_remove_base_bdev`): a RAID not online
/// just lets it go; a raid0 or concat goes offline; a raid1 goes on degraded, with the
/// member's entry in the superblock marked missing (or failed), unless it was the last.
pub(crate) async fn remove_slot(raid: &Arc<Raid>, slot: usize, failed: bool) -> Result<(), BdevError> {
    let (state, bdev) = {
        let mut st = raid.lock();
        if st.slots[slot].desc.is_none() {
            return Err(BdevError::Errno(libc::ENODEV, "no such member".into()));
        }
        st.slots[slot].removing = true;
        (st.state, st.bdev.clone())
    };
    if state != State::Online {
        let mut st = raid.lock();
        let s = &mut st.slots[slot];
        s.desc = None;
        s.removing = false;
        if std::mem::take(&mut s.configured) {
            st.discovered -= 1;
        }
        if st.state == State::Offline && st.discovered == 0 {
            drop(st);
            forget(raid);
        }
        return Ok(());
    }
    let bdev = bdev.expect("an online RAID has its bdev");
    // A rebuild stops first (it reads from or writes to the member); a target it left half
    // rebuilt goes too.
    if let Some(target) = crate::process::stop(raid).await {
        if target != slot {
            drop_member(raid, &bdev, target, false).await?;
        }
    }
    let last = {
        let st = raid.lock();
        let readable = st.slots.iter().filter(|s| s.configured && !s.target && s.desc.is_some()).count();
        let is_reader = st.slots[slot].configured && !st.slots[slot].target;
        raid.min_operational == st.slots.len() || (is_reader && readable <= raid.min_operational)
    };
    if last {
        log::warn!("raid {}: cannot go on without base bdev at slot {slot}; going offline", raid.name);
        raid.lock().operational -= 1;
        let gone = ferrite_bdev::unregister(bdev.name(), Some(MODULE))?;
        let _ = gone.await;
        return Ok(());
    }
    drop_member(raid, &bdev, slot, failed).await
}

/// Takes member `slot` out of an online RAID that goes on without it: with the RAID quiesced,
/// closes it, marks its superblock entry missing (or failed) and tells every channel.
async fn drop_member(raid: &Arc<Raid>, bdev: &Bdev, slot: usize, failed: bool) -> Result<(), BdevError> {
    bdev.quiesce().await?;
    let was_target = {
        let mut st = raid.lock();
        let s = &mut st.slots[slot];
        let was_target = s.target;
        s.desc = None;
        s.configured = false;
        s.target = false;
        s.removing = false;
        s.name = None;
        s.uuid = Uuid::nil();
        st.discovered -= 1;
        st.operational -= 1;
        if let Some(sb) = st.sb.as_mut() {
            for m in sb.members.iter_mut().filter(|m| m.slot as usize == slot && m.state == MemberState::Configured) {
                m.state = if failed { MemberState::Failed } else { MemberState::Missing };
            }
        }
        debug_assert!(st.operational >= raid.min_operational, "an online RAID keeps its minimum");
        was_target
    };
    let written = if was_target { Ok(()) } else { write_superblock(raid).await };
    refresh_channels(bdev).await;
    bdev.unquiesce().await?;
    log::info!("raid {}: base bdev at slot {slot} removed; degraded", raid.name);
    written
}

/// Every core's channel of the RAID takes the members as they are now.
pub(crate) async fn refresh_channels(bdev: &Bdev) {
    let rx = bdev.for_each_channel(&ferrite_reactor::engine(), |ch| {
        if let Some(c) = ch.as_any().and_then(|a| a.downcast_mut::<RaidChannel>()) {
            c.refresh();
        }
    });
    let _ = rx.await;
}

/// True if a member added to an online RAID of `level` is rebuilt: raid1's (`process`) and
/// raid5f's (`rebuild5f`).
pub(crate) fn rebuilds(level: Level) -> bool {
    matches!(level, Level::Raid1 | Level::Raid5f)
}

/// Starts rebuilding member `slot` (configured as a target) of an online RAID, as its level
/// rebuilds.
pub(crate) async fn start_rebuild(raid: &Arc<Raid>, slot: usize, opts: crate::process::Opts) -> Result<(), BdevError> {
    debug_assert!(rebuilds(raid.level));
    match raid.level {
        Level::Raid5f => crate::rebuild5f::start(raid, slot, opts).await,
        _ => crate::process::start_rebuild(raid, slot, opts).await,
    }
}

/// `bdev_raid_add_base_bdev`: puts `base` in an empty slot of `raid_name`; into an online
/// raid1 or raid5f it comes as a rebuild target.
pub async fn add_base_bdev(raid_name: &str, base: &str, opts: crate::process::Opts) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let raid = find(raid_name)
        .ok_or_else(|| BdevError::Errno(libc::ENODEV, format!("raid bdev {raid_name} is not found in config")))?;
    let slot = {
        let mut st = raid.lock();
        if st.process.is_some() {
            return Err(BdevError::Errno(libc::EPERM, format!("raid bdev '{raid_name}' is in process")));
        }
        let by_uuid = match (st.state, ferrite_bdev::lookup(base)) {
            (State::Configuring, Some(b)) => st.slots.iter().position(|s| s.name.is_none() && s.uuid == b.uuid()),
            _ => None,
        };
        if st.state == State::Online && !rebuilds(raid.level) {
            return Err(BdevError::Errno(
                libc::ENOTSUP,
                format!("raid bdev '{raid_name}' is online and {} members are not rebuilt", raid.level.name()),
            ));
        }
        let slot = by_uuid.or_else(|| st.slots.iter().position(|s| s.name.is_none() && s.uuid.is_nil()));
        let Some(slot) = slot else {
            return Err(inval(format!("no empty slot found in raid bdev '{raid_name}' for new base bdev '{base}'")));
        };
        st.slots[slot].name = Some(base.to_string());
        slot
    };
    let state = raid.state();
    match configure_member(&raid, slot, true).await {
        Ok(()) => {}
        Err(BdevError::NotFound(_)) if state == State::Configuring => return Ok(()),
        Err(e) => {
            raid.lock().slots[slot].name = None;
            return Err(e);
        }
    }
    match state {
        State::Online => {
            raid.lock().operational += 1;
            start_rebuild(&raid, slot, opts).await
        }
        _ => maybe_configure(&raid).await,
    }
}

/// `bdev_raid_delete`: unregisters the RAID (if online) and releases its members; with
/// `clear_sb`, their superblocks are wiped first.
pub async fn delete(name: &str, clear_sb: bool) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    let raid = find(name).ok_or_else(|| BdevError::Errno(libc::ENODEV, format!("raid bdev {name} not found")))?;
    delete_raid(&raid, clear_sb).await
}

pub(crate) async fn delete_raid(raid: &Arc<Raid>, clear_sb: bool) -> Result<(), BdevError> {
    crate::process::stop(raid).await;
    if clear_sb && raid.superblock {
        let (len, chans) = {
            let st = raid.lock();
            let bs = st.block_size.max(512) as usize;
            let len = st.sb.as_ref().map_or(sb::HEADER_LEN, |s| s.len()).div_ceil(bs) * bs;
            let chans: Vec<_> = st
                .slots
                .iter()
                .filter_map(|s| s.desc.as_ref().map(|d| (d.bdev().name().to_string(), d.channel())))
                .collect();
            (len, chans)
        };
        if let Err(e) = write_on_members(vec![0u8; len], chans, &raid.name).await {
            log::warn!("raid {}: clearing superblocks: {e}", raid.name);
        }
    }
    let bdev = {
        let mut st = raid.lock();
        st.deleting = true;
        st.bdev.clone()
    };
    match bdev {
        Some(b) => {
            let gone = ferrite_bdev::unregister(b.name(), Some(MODULE))?;
            let _ = gone.await;
        }
        None => {
            release_all(raid);
            forget(raid);
        }
    }
    log::info!("raid {}: deleted", raid.name);
    Ok(())
}
