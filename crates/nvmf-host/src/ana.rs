//! ANA (asymmetric namespace access) on the host: a controller's state per namespace, read
//! from the ANA log page when the controller comes up, when it raises an ANA change notice
//! (an asynchronous event request completes) and when an I/O fails with an ANA status; and the
//! outstanding asynchronous event request, whose namespace attribute notices rescan the
//! namespaces.

use crate::ctrlr::HostCtrlr;
use crate::qpair::HostQpair;
use ferrite_nvme::spec::aer::{event_type, notice, AsyncEvent};
use ferrite_nvme::spec::log::{ana_state, lid, read_ana_log};
use ferrite_nvme::spec::opcode::admin as op;
use ferrite_nvme::spec::sqe::Sqe;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A controller's ANA state per NSID. A namespace the log does not list (or a controller
/// without ANA reporting) counts as optimized.
#[derive(Default)]
pub struct AnaTable(Mutex<HashMap<u32, u8>>);

impl AnaTable {
    /// The state of `nsid` ([`ana_state`] codes).
    pub fn state(&self, nsid: u32) -> u8 {
        self.0.lock().unwrap().get(&nsid).copied().unwrap_or(ana_state::OPTIMIZED)
    }

    /// Replaces the table; true if a state changed.
    pub fn replace(&self, new: HashMap<u32, u8>) -> bool {
        let mut t = self.0.lock().unwrap();
        let changed = *t != new;
        *t = new;
        changed
    }

    /// Sets one namespace's state (an I/O failed with an ANA status); true if it changed.
    pub fn set(&self, nsid: u32, state: u8) -> bool {
        self.0.lock().unwrap().insert(nsid, state) != Some(state)
    }
}

/// The name SPDK uses for an ANA state.
pub fn state_name(s: u8) -> &'static str {
    match s {
        ana_state::OPTIMIZED => "optimized",
        ana_state::NON_OPTIMIZED => "non_optimized",
        ana_state::INACCESSIBLE => "inaccessible",
        ana_state::PERSISTENT_LOSS => "persistent_loss",
        ana_state::CHANGE => "change",
        _ => "unknown",
    }
}

/// True if I/O may go to a namespace in state `s`.
pub fn usable(s: u8) -> bool {
    s == ana_state::OPTIMIZED || s == ana_state::NON_OPTIMIZED
}

/// Reads the ANA log page (clearing the controller's ANA notice mask): state per NSID.
pub async fn read_log(admin: &HostQpair) -> Result<HashMap<u32, u8>, String> {
    const LEN: u32 = 4096;
    let mut sqe = Sqe::new(op::GET_LOG_PAGE, 0, 0xffff_ffff);
    let numd = LEN / 4 - 1;
    sqe.cdw10 = u32::from(lid::ANA) | (numd & 0xffff) << 16;
    sqe.cdw11 = numd >> 16;
    let r = admin.submit_wait(sqe, None, LEN).await?;
    crate::ctrlr::check(&r, "Get Log Page ANA")?;
    let (_, groups) = read_ana_log(&r.data).ok_or("short ANA log page")?;
    let mut out = HashMap::new();
    for (d, nsids) in groups {
        for nsid in nsids.iter() {
            out.insert(nsid, d.state);
        }
    }
    Ok(out)
}

/// Reads the ANA log of `ctrlr` on `admin` and publishes a change (the group's paths are
/// chosen again).
pub async fn update(ctrlr: &Arc<HostCtrlr>, admin: &HostQpair) {
    match read_log(admin).await {
        Ok(map) => {
            log::info!("nvme controller {} (cntlid {}): ANA states {:?}", ctrlr.opts.name, admin.cntlid.get(), map);
            if ctrlr.ana.replace(map) {
                ctrlr.paths_changed();
            }
        }
        Err(e) => log::info!("nvme controller {}: ANA log: {e}", ctrlr.opts.name),
    }
    ctrlr.ana_updating.store(false, Ordering::Release);
}

/// Keeps one Asynchronous Event Request outstanding on `admin` until it closes; an ANA change
/// notice re-reads the ANA log, other notices read their log page to unmask them.
pub fn start_aer(ctrlr: &Arc<HostCtrlr>, admin: &Rc<HostQpair>) {
    let (c, admin) = (ctrlr.clone(), admin.clone());
    ferrite_reactor::spawn_local(async move {
        loop {
            let r = match admin.submit_wait(Sqe::new(op::ASYNC_EVENT_REQUEST, 0, 0), None, 0).await {
                Ok(r) if r.cqe.status.is_success() => r,
                _ => return,
            };
            if c.detached.load(Ordering::Acquire) {
                return;
            }
            let ev = AsyncEvent::from_dw0(r.cqe.dw0);
            if ev.event_type == event_type::NOTICE && ev.info == notice::ANA_CHANGE {
                update(&c, &admin).await;
            } else if ev.event_type == event_type::NOTICE && ev.info == notice::NS_ATTR_CHANGED {
                // Read (and so unmask) the changed namespace list, then look at every namespace.
                let mut sqe = Sqe::new(op::GET_LOG_PAGE, 0, 0xffff_ffff);
                sqe.cdw10 = u32::from(lid::CHANGED_NS_LIST) | (1023 << 16);
                let _ = admin.submit_wait(sqe, None, 4096).await;
                c.rescan(&admin).await;
            } else if ev.log_page != 0 {
                // Read (and so unmask) the page; Ferrite has no use for its content.
                let mut sqe = Sqe::new(op::GET_LOG_PAGE, 0, 0xffff_ffff);
                sqe.cdw10 = u32::from(ev.log_page) | (1023 << 16);
                let _ = admin.submit_wait(sqe, None, 4096).await;
            }
        }
    })
    .detach();
}
