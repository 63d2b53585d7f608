//! Examine (SPDK's `raid_bdev_examine`): every new bdev is looked at for a RAID superblock. A
//! member of a RAID that is not there yet makes it (from its superblock, configuring) and the
//! other members already registered are examined too; the RAID goes online once every member
//! the superblock calls configured is there. The newest superblock wins: a RAID made from an
//! older copy is made again from the newer one while configuring, and a member whose copy is
//! older than the RAID's is taken as the RAID's copy describes it: a member the RAID no longer
//! counts is ignored while configuring, and rebuilt into an online RAID (as SPDK re-adds it).
//! A bdev without a superblock is claimed by a configuring RAID (without superblock) that
//! names it.

use crate::ctl;
use crate::level::Level;
use crate::raid::{self, configure_member, maybe_configure, Raid, State};
use crate::sb::{MemberState, SbError, Superblock};
use ferrite_bdev::{Bdev, BdevError, ExamineDone, IoChannel, IoRequest};
use std::sync::Arc;
use std::time::Duration;

/// How long a superblock read may take before examine gives the bdev up.
const READ_TIMEOUT: Duration = ferrite_bdev::module::EXAMINE_READ_TIMEOUT;

/// Reads the superblock at the start of the bdev of `ch`: None if there is none.
pub(crate) async fn read_sb(ch: &IoChannel, bs: u32) -> Result<Option<Superblock>, BdevError> {
    let bs = bs as usize;
    let mut len = crate::sb::HEADER_LEN.div_ceil(bs) * bs;
    loop {
        if (len / bs) as u64 > ch.num_blocks() {
            return Ok(None);
        }
        let req = IoRequest::read(0, (len / bs) as u64, ferrite_reactor::alloc_buf(len));
        let c = ch
            .submit_wait_within(req, READ_TIMEOUT)
            .await
            .ok_or_else(|| BdevError::Errno(libc::ETIMEDOUT, "superblock read timed out".into()))?;
        if !c.status.is_ok() {
            return Err(BdevError::Errno(libc::EIO, format!("superblock read: {}", c.status)));
        }
        let bytes: Vec<u8> = c.req.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        match Superblock::decode(&bytes) {
            Ok(sb) => return Ok(Some(sb)),
            Err(SbError::Invalid(why)) => {
                log::debug!("no raid superblock: {why}");
                return Ok(None);
            }
            Err(SbError::Short(n)) => len = n.div_ceil(bs) * bs,
        }
    }
}

/// Reads the superblock of the bdev `name` through a read-only descriptor.
async fn load_sb(name: &str) -> Result<(Bdev, Option<Superblock>), BdevError> {
    let desc = Bdev::open_ext(name, false, |_| {})?;
    let bdev = desc.bdev().clone();
    let ch = desc.channel()?;
    let sb = read_sb(&ch, bdev.block_size()).await?;
    Ok((bdev, sb))
}

/// The module's examine of `bdev`: runs on the engine's first core; `done` when finished.
pub(crate) fn examine(bdev: Bdev, done: ExamineDone) {
    let run = move || {
        ferrite_reactor::spawn_local(async move {
            if let Err(e) = examine_bdev(&bdev).await {
                log::warn!("raid examine of {}: {e}", bdev.name());
            }
            done.finish();
        })
        .detach();
    };
    match ferrite_reactor::current_engine() {
        Some(e) if ferrite_reactor::current() != Some(0) => e.send(0, run),
        _ => run(),
    }
}

async fn examine_bdev(bdev: &Bdev) -> Result<(), BdevError> {
    let _g = ctl::lock().await;
    if bdev.is_removing() || bdev.claimed_by().is_some() {
        return Ok(());
    }
    let (bdev, sb) = match load_sb(bdev.name()).await {
        Ok(x) => x,
        Err(BdevError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    match sb {
        Some(sb) => examine_sb(sb, &bdev, true).await,
        None => examine_no_sb(&bdev).await,
    }
}

/// A bdev without a superblock: a configuring RAID without one that names it claims it.
async fn examine_no_sb(bdev: &Bdev) -> Result<(), BdevError> {
    for r in raid::all() {
        if r.superblock || r.state() != State::Configuring {
            continue;
        }
        let slot = r.lock().slots.iter().position(|s| {
            s.desc.is_none() && (s.name.as_deref() == Some(bdev.name()) || (!s.uuid.is_nil() && s.uuid == bdev.uuid()))
        });
        if let Some(i) = slot {
            configure_member(&r, i, false).await?;
            return maybe_configure(&r).await;
        }
    }
    Ok(())
}

/// A bdev with a superblock (SPDK's `raid_bdev_examine_sb`).
async fn examine_sb(mut sb: Superblock, bdev: &Bdev, others: bool) -> Result<(), BdevError> {
    if sb.block_size != bdev.block_size() {
        log::warn!(
            "bdev {} block size ({}) does not match the value in its raid superblock ({})",
            bdev.name(),
            bdev.block_size(),
            sb.block_size
        );
        return Ok(());
    }
    if sb.uuid.is_nil() {
        log::warn!("nil raid UUID in the superblock on bdev {}", bdev.name());
        return Ok(());
    }
    let mut raid = raid::find_by_uuid(&sb.uuid);
    if let Some(r) = raid.clone() {
        let Some(theirs) = r.lock().sb.clone() else { return Ok(()) };
        if sb.seq_number > theirs.seq_number {
            if r.state() != State::Configuring {
                log::warn!(
                    "newer superblock of raid {} found on bdev {} but the raid is not configuring",
                    r.name,
                    bdev.name()
                );
                return Ok(());
            }
            log::info!(
                "raid {}: newer superblock on {} ({} > {}); made again from it",
                r.name,
                bdev.name(),
                sb.seq_number,
                theirs.seq_number
            );
            raid::delete_raid(&r, false).await?;
            raid = None;
        } else if sb.seq_number < theirs.seq_number {
            log::info!(
                "raid {}: superblock on {} is older ({} < {}); the raid's is trusted",
                r.name,
                bdev.name(),
                sb.seq_number,
                theirs.seq_number
            );
            sb = theirs;
        }
    }
    let Some(entry) = sb.member(&bdev.uuid()).cloned() else {
        log::debug!("raid superblock on {} does not contain this bdev's uuid", bdev.name());
        return Ok(());
    };
    let created = raid.is_none();
    let raid = match raid {
        Some(r) => r,
        None => create_from_sb(&sb)?,
    };
    if raid.state() == State::Online {
        if !crate::raid::rebuilds(raid.level) {
            log::info!(
                "bdev {} comes back to online raid bdev {}, whose members are not rebuilt; ignoring it",
                bdev.name(),
                raid.name
            );
            return Ok(());
        }
        let slot = entry.slot as usize;
        {
            let mut st = raid.lock();
            let s = &mut st.slots[slot];
            if s.configured || s.desc.is_some() || !s.uuid.is_nil() {
                return Ok(());
            }
            s.uuid = bdev.uuid();
            s.name = None;
        }
        log::info!("re-adding bdev {} to raid bdev {}", bdev.name(), raid.name);
        if let Err(e) = configure_member(&raid, slot, false).await {
            raid.lock().slots[slot].uuid = uuid::Uuid::nil();
            return Err(e);
        }
        raid.lock().operational += 1;
        return crate::raid::start_rebuild(&raid, slot, crate::options::current()).await;
    }
    if entry.state != MemberState::Configured {
        log::info!("bdev {} is not an active member of raid bdev {}; ignoring it", bdev.name(), raid.name);
        return Ok(());
    }
    let slot = raid.lock().slots.iter().position(|s| s.uuid == bdev.uuid());
    let Some(slot) = slot else { return Ok(()) };
    if raid.lock().slots[slot].configured {
        return Ok(());
    }
    configure_member(&raid, slot, false).await?;
    maybe_configure(&raid).await?;
    if created && others {
        // The other members that registered before this one.
        let uuids: Vec<uuid::Uuid> =
            raid.lock().slots.iter().filter(|s| !s.configured && !s.uuid.is_nil()).map(|s| s.uuid).collect();
        for u in uuids {
            let Some(b) = ferrite_bdev::lookup(&u.to_string()) else { continue };
            if b.claimed_by().is_some() {
                continue;
            }
            if let Ok((b, Some(other))) = load_sb(b.name()).await {
                if let Err(e) = Box::pin(examine_sb(other, &b, false)).await {
                    log::warn!("raid {}: examining member {}: {e}", raid.name, b.name());
                }
            }
        }
    }
    Ok(())
}

/// A configuring RAID from a superblock (SPDK's `raid_bdev_create_from_sb`).
fn create_from_sb(sb: &Superblock) -> Result<Arc<Raid>, BdevError> {
    let level = Level::from_number(sb.level).ok_or_else(|| {
        BdevError::Errno(libc::EINVAL, format!("raid {}: level {} is not supported", sb.name, sb.level))
    })?;
    let strip_kb = (sb.strip_size as u64 * sb.block_size as u64 / 1024) as u32;
    let raid = raid::new_from_sb(&sb.name, level, sb.num_base_bdevs as usize, strip_kb, sb.uuid)?;
    {
        let mut st = raid.lock();
        st.sb = Some(sb.clone());
        let mut operational = 0;
        for e in &sb.members {
            let s = &mut st.slots[e.slot as usize];
            if e.state == MemberState::Configured {
                s.uuid = e.uuid;
                operational += 1;
            }
            s.data_offset = e.data_offset;
            s.data_size = e.data_size;
        }
        st.operational = operational;
    }
    log::info!("raid {}: found by its superblock (seq {})", sb.name, sb.seq_number);
    Ok(raid)
}
