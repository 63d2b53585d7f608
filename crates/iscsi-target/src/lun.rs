//! LUNs' bdevs: opened (writable) when a LUN is added, as SPDK's LUN opens its bdev, and
//! watched. A bdev being deleted takes its LUNs out of their target node (SPDK removes the LUN
//! from its SCSI device; the node stays, even without LUN 0); a resize is passed on. Either is
//! then told to the engine ([`crate::Sessions::lun_event`]).

use crate::hooks::{sessions, LunEvent};
use crate::model::{Lun, Refused};
use ferrite_bdev::{Bdev, BdevEvent};

/// Opens bdev `name` for LUN `id` of target node `target_id`.
pub(crate) fn open(target_id: u64, id: u32, name: &str) -> Result<Lun, Refused> {
    // The bdev's own name, not an alias (as SPDK lists and saves it).
    let own = ferrite_bdev::lookup(name).map_or_else(|| name.to_string(), |b| b.name().to_string());
    let watched = own.clone();
    let desc = Bdev::open_ext(name, true, move |ev| match ev {
        BdevEvent::Remove => ferrite_reactor::engine().send(0, move || removed(target_id)),
        BdevEvent::Resize => {
            let bdev = watched.clone();
            ferrite_reactor::engine().send(0, move || resized(target_id, &bdev));
        }
        BdevEvent::IoTypesChanged | BdevEvent::MediaManagement | BdevEvent::Fault => {}
    })
    .map_err(|e| Refused::new(libc::ENODEV, format!("bdev {name} cannot be opened: {e}")))?;
    Ok(Lun::new(id, own, desc))
}

/// A bdev under target node `target_id` is being deleted: its LUNs go.
fn removed(target_id: u64) {
    let gone = crate::state::with_write(|s| s.remove_luns(target_id, |l| l.desc().bdev().is_removing()));
    let Some((target, luns)) = gone else { return };
    for l in &luns {
        log::warn!("iscsi: target {target}: bdev {} removed; LUN {} removed", l.bdev_name, l.id);
    }
    if let Some(s) = sessions() {
        for l in &luns {
            s.lun_event(&target, l.id, LunEvent::Removed);
        }
    }
    // The descriptors close when the last snapshot holding them goes.
    drop(luns);
}

/// Bdev `bdev` under target node `target_id` changed size.
fn resized(target_id: u64, bdev: &str) {
    let found = crate::state::with_read(|s| {
        s.target_by_id(target_id).map(|t| {
            let ids: Vec<u32> = t.luns.iter().filter(|l| l.bdev_name == bdev).map(|l| l.id).collect();
            (t.name.clone(), ids)
        })
    });
    let Some((target, ids)) = found else { return };
    for id in ids {
        log::info!("iscsi: target {target}: LUN {id} (bdev {bdev}) resized");
        if let Some(s) = sessions() {
            s.lun_event(&target, id, LunEvent::Resized);
        }
    }
}
