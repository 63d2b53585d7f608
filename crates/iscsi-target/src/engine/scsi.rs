//! The SCSI target device of each target node (`ferrite_scsi::Target`), shared by all its
//! sessions on every reactor (reservations, unit attentions and task sets are per device):
//! made at the first login, kept in step with the node's LUNs at each login (a LUN can only be
//! added while nobody is logged in, as in SPDK) and when a LUN's bdev goes; one target port per
//! portal group the node is reached through, named `<node>,t,0x<tpgt>` as iSCSI names ports.

use crate::model::TargetNode;
use ferrite_scsi::{Lun, LunConfig, PortInfo, Target};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// SPC-4's protocol identifier of iSCSI.
const PROTOCOL_ISCSI: u8 = 5;

#[derive(Default)]
struct Devices(Mutex<HashMap<u64, Arc<Target>>>);

fn devices() -> Arc<Devices> {
    ferrite_reactor::engine_state::<Devices>()
}

/// The port name of portal group `tag` of `node`.
fn port_name(node: &str, tag: u16) -> String {
    format!("{node},t,{tag:#06x}")
}

/// The SCSI target of `node` with its LUNs as the node has them now, and the relative port id
/// of portal group `pg_tag`.
pub(crate) fn target_for(node: &TargetNode, pg_tag: u16) -> Result<(Arc<Target>, u16), String> {
    let live: Vec<u64> = crate::targets().iter().map(|t| t.id).collect();
    let d = devices();
    let mut map = d.0.lock().unwrap_or_else(|p| p.into_inner());
    // Devices of deleted nodes go (their sessions keep their own references meanwhile).
    map.retain(|id, _| live.contains(id) || *id == node.id);
    let t = map.entry(node.id).or_insert_with(|| Target::new(&node.name)).clone();
    // Under the lock: two logins on two reactors do not both open a LUN.
    sync_luns(&t, node);
    drop(map);
    let name = port_name(&node.name, pg_tag);
    let ports = t.ports();
    let rel = match ports.iter().find(|p| p.name == name) {
        Some(p) => p.rel_id,
        None => {
            let rel =
                ports.iter().map(|p| p.rel_id).max().unwrap_or(0).checked_add(1).ok_or("too many target ports")?;
            t.add_port(PortInfo { rel_id: rel, group: 1, name, protocol: Some(PROTOCOL_ISCSI) })
                .map_err(|e| e.to_string())?;
            rel
        }
    };
    Ok((t, rel))
}

/// Makes `t`'s logical units those of `node`: a LUN whose bdev changed, or that the node no
/// longer has, goes; one the device does not have yet is opened.
fn sync_luns(t: &Target, node: &TargetNode) {
    for id in t.lun_ids() {
        let same = node.lun(id as u32).zip(t.lun(id)).is_some_and(|(m, l)| l.bdev().name() == m.bdev_name);
        if !same {
            t.remove_lun(id);
        }
    }
    for l in &node.luns {
        let id = u64::from(l.id);
        if t.lun(id).is_some() {
            continue;
        }
        match Lun::new(LunConfig::new(&l.bdev_name)) {
            Ok(lun) => {
                if let Err(e) = t.add_lun(id, lun) {
                    log::warn!("iscsi: target {}: LUN {id}: {e}", node.name);
                }
            }
            Err(e) => log::warn!("iscsi: target {}: LUN {id} (bdev {}): {e}", node.name, l.bdev_name),
        }
    }
}

/// LUN `lun_id` of target node `target` is gone (its bdev is being deleted).
pub(crate) fn remove_lun(target: &str, lun_id: u32) {
    let d = devices();
    let map = d.0.lock().unwrap_or_else(|p| p.into_inner());
    for t in map.values().filter(|t| crate::name::same(t.name(), target)) {
        t.remove_lun(u64::from(lun_id));
    }
}

/// Every SCSI device goes (shutdown; sessions that still hold one keep it until they end).
pub(crate) fn clear() {
    devices().0.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
