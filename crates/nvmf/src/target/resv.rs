//! NVMe reservations on the bdev's shared registry (`ferrite_bdev::reservation`), as SPDK's
//! target serves them: Reservation Register (0Dh), Report (0Eh), Acquire (11h) and Release
//! (15h); the Reservation Conflict status for I/O the access matrix refuses; the Reservation
//! Notification log page (80h) with its asynchronous event; features 82h (notification mask)
//! and 83h (Persist Through Power Loss); and the namespace's `ptpl_file`, SPDK's JSON copy of
//! the registry that a namespace added again (after a restart) is restored from.
//!
//! The host is its Host Identifier from Connect (`Ctrlr::initiator`). Its I/O requests carry
//! the identity interned (`Ctrlr::initiator_ref`, `IoRequest::for_initiator`), and the bdev layer
//! refuses those the reservation forbids, for every target alike; the target itself checks
//! only the commands it answers without the bdev layer (`unsubmitted_conflict`).

use super::ctrlr::Ctrlr;
use super::model::{tables, Namespace};
use super::qpair::{Conn, NsChan};
use crate::spec::aer::{event_type, io_command_set, AsyncEvent};
use crate::spec::log::lid;
use crate::spec::opcode::nvm;
use crate::spec::status::{generic, Status};
use ferrite_bdev::reservation::{Access, Initiator, InitiatorId, Notice, Notices, ResvError, ResvType};
use smallvec::smallvec;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a Preempt and Abort waits for the preempted hosts' commands before it answers
/// Command Interrupted (SPDK's `NS_RESERVATION_IO_WAIT_TIMEOUT_S`).
const PREEMPT_ABORT_WAIT: Duration = Duration::from_secs(10);

/// Entries a controller keeps in its Reservation Notification log (SPDK's 255; further
/// notices only move the last entry's count, so the host sees that it missed some).
const LOG_MAX: usize = 255;
/// Bytes of one Reservation Notification log entry.
const LOG_ENTRY: usize = 64;
/// Bytes of the extended Reservation Status header and of each registrant's entry.
const REPORT_ENTRY: usize = 64;

/// Reservation Log Page Available (I/O command set event, log page 80h).
const RESERVATION_LOG_EVENT: AsyncEvent = AsyncEvent {
    event_type: event_type::IO_COMMAND_SET,
    info: io_command_set::RESERVATION_LOG_AVAILABLE,
    log_page: lid::RESERVATION_NOTIFICATION,
};

/// A controller's Reservation Notification log: entries not yet read.
#[derive(Default)]
pub struct NoticeLog {
    /// Log Page Count of the latest notice (wraps past 2^64 - 1 to 1).
    count: u64,
    /// (Log Page Count, notice type, NSID), oldest first.
    entries: VecDeque<(u64, u8, u32)>,
}

impl NoticeLog {
    fn push(&mut self, notice: Notice, nsid: u32) {
        self.count = if self.count == u64::MAX { 1 } else { self.count + 1 };
        if self.entries.len() >= LOG_MAX {
            if let Some(last) = self.entries.back_mut() {
                last.0 = self.count;
            }
            return;
        }
        self.entries.push_back((self.count, notice as u8, nsid));
    }

    /// The log page's first `upto` bytes, for a read of those from `offset` on. A read removes
    /// the entries it returned whole, and those before `offset` (skipped, as SPDK drops them);
    /// an entry it returns only part of (the length or the offset is not a multiple of 64
    /// bytes) stays, for the next read to return whole. (SPDK drops it too.)
    pub(crate) fn take(&mut self, offset: u64, upto: u64) -> Vec<u8> {
        if offset >= (self.entries.len() * LOG_ENTRY) as u64 {
            // Past the entries there are: nothing is read, so nothing goes (SPDK refuses such a
            // read and keeps its entries too).
            return Vec::new();
        }
        let mut page = Vec::new();
        let mut i = 0;
        while (page.len() as u64) < upto && i < self.entries.len() {
            let (count, kind, nsid) = self.entries[i];
            let start = page.len() as u64;
            let end = start + LOG_ENTRY as u64;
            let mut e = [0u8; LOG_ENTRY];
            e[0..8].copy_from_slice(&count.to_le_bytes());
            e[8] = kind;
            // Number of Available Log Pages: the entries after this one.
            e[9] = (self.entries.len() - i - 1).min(255) as u8;
            e[12..16].copy_from_slice(&nsid.to_le_bytes());
            page.extend_from_slice(&e);
            let whole_or_skipped = end <= offset || (start >= offset && end <= upto);
            if whole_or_skipped {
                self.entries.remove(i);
            } else {
                i += 1;
            }
        }
        page
    }
}

/// True for the four reservation opcodes.
pub(crate) fn is_reservation(opc: u8) -> bool {
    matches!(
        opc,
        nvm::RESERVATION_REGISTER | nvm::RESERVATION_REPORT | nvm::RESERVATION_ACQUIRE | nvm::RESERVATION_RELEASE
    )
}

/// Reservation Conflict (with Do Not Retry: the same command would meet it again).
fn conflict() -> Status {
    Status::generic(generic::RESERVATION_CONFLICT).with_dnr()
}

fn invalid_field() -> Status {
    Status::generic(generic::INVALID_FIELD).with_dnr()
}

/// What an NVM command `opc` does to the medium, for the access matrix (None: not checked).
fn access_of(opc: u8) -> Option<Access> {
    match opc {
        nvm::READ | nvm::COMPARE | nvm::VERIFY => Some(Access::Read),
        nvm::WRITE | nvm::WRITE_ZEROES | nvm::DATASET_MANAGEMENT | nvm::FLUSH | nvm::WRITE_UNCORRECTABLE => {
            Some(Access::Write)
        }
        _ => None,
    }
}

/// The status a command `opc` that the target answers without the bdev layer (a Flush the
/// bdev does not need, a Dataset Management hint, an opcode it does not serve) gets from the
/// namespace's reservation, if it is refused: the same answer the layer gives the commands
/// it sees. One atomic load while no reservation is held.
pub(crate) fn unsubmitted_conflict(c: &Conn, ns: &NsChan, opc: u8) -> Option<Status> {
    let r = ns.ns.bdev().reservations();
    if !r.is_held() {
        return None;
    }
    r.check_id(c.who.get()?, access_of(opc)?).err()?;
    refused(c, ns.ns.nsid, opc);
    Some(conflict())
}

/// Logs (rate-limited) that the reservation refused command `opc` of this queue pair's host.
#[cold]
pub(crate) fn refused(c: &Conn, nsid: u32, opc: u8) {
    let Some(who) = c.who.get() else { return };
    let access = access_of(opc).map_or("I/O", |a| if a == Access::Read { "read" } else { "write" });
    ferrite_reactor::log_limited!(
        log::Level::Info,
        "nvmf connection {}: {access} command {opc:#04x} to namespace {nsid} refused: reservation conflict for {who}",
        c.id,
    );
}

fn status_of(e: ResvError) -> Status {
    match e {
        ResvError::Conflict => conflict(),
        ResvError::Invalid(_) => invalid_field(),
        // SPDK answers a full registrant table so.
        ResvError::Full => Status::generic(generic::INTERNAL_DEVICE_ERROR).with_dnr(),
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Runs the reservation command in `slot` on namespace `ns` (its data, if any, is in).
pub(crate) fn run(c: &Rc<Conn>, slot: u16, ns: Rc<NsChan>) {
    let (opc, cdw10, cdw11, len, buf) = {
        let mut cmds = c.cmds.borrow_mut();
        let cmd = &mut cmds[usize::from(slot)];
        (cmd.sqe.opcode, cmd.sqe.cdw10, cmd.sqe.cdw11, cmd.len, cmd.buf.take())
    };
    let Some(ctrl) = c.ctrl() else {
        return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
    };
    if opc == nvm::RESERVATION_REPORT {
        return report(c, slot, &ctrl, &ns.ns, cdw10, cdw11, len);
    }
    let data: &[u8] = buf.as_deref().unwrap_or(&[]);
    let need = if opc == nvm::RESERVATION_RELEASE { 8 } else { 16 };
    let result = if data.len() < need {
        Err(ResvError::Invalid("the command's data is shorter than its keys"))
    } else {
        match opc {
            nvm::RESERVATION_REGISTER => register(&ctrl.initiator, &ns.ns, cdw10, data),
            nvm::RESERVATION_ACQUIRE => acquire(&ctrl.initiator, &ns.ns, cdw10, data),
            _ => release(&ctrl.initiator, &ns.ns, cdw10, data),
        }
    };
    match result {
        Ok(notices) => {
            let abort = opc == nvm::RESERVATION_ACQUIRE && cdw10 & 7 == 2;
            let preempted: Vec<InitiatorId> = if abort { preempted_hosts(&notices) } else { Vec::new() };
            notify(&ctrl, ns.ns.nsid, notices);
            if !persist(&ns.ns) {
                return c.complete(slot, Status::generic(generic::INTERNAL_DEVICE_ERROR), 0, None);
            }
            if preempted.is_empty() {
                return c.complete(slot, Status::SUCCESS, 0, None);
            }
            let (c, subnqn, nsid) = (c.clone(), ctrl.subnqn.clone(), ns.ns.nsid);
            ferrite_reactor::spawn_local(async move {
                let st = if wait_preempted(subnqn, nsid, preempted).await {
                    Status::SUCCESS
                } else {
                    log::warn!(
                        "nvmf connection {}: Preempt and Abort on namespace {nsid}: the preempted hosts' commands \
                         did not complete within {PREEMPT_ABORT_WAIT:?}",
                        c.id
                    );
                    Status::generic(generic::COMMAND_INTERRUPTED)
                };
                c.complete(slot, st, 0, None);
            })
            .detach();
        }
        Err(e) => {
            log::info!(
                "nvmf controller {} of {}: reservation command {opc:#04x} (cdw10 {cdw10:#x}) on namespace {}: {e}",
                ctrl.cntlid,
                ctrl.subnqn,
                ns.ns.nsid
            );
            c.complete(slot, status_of(e), 0, None)
        }
    }
}

/// The NVMe hosts a preempt unregistered (SPDK waits for their commands only); a host with no
/// controller left is not interned and has no command to wait for.
fn preempted_hosts(notices: &Notices) -> Vec<InitiatorId> {
    notices
        .iter()
        .filter(|(w, n)| *n == Notice::RegistrationPreempted && matches!(w, Initiator::Nvme { .. }))
        .filter_map(|(w, _)| w.lookup())
        .collect()
}

/// Preempt and Abort, as SPDK v26.05 does it: the command completes once every command of
/// the preempted hosts' queue pairs on this namespace that was outstanding when the
/// reservation changed has completed. They are not cancelled: they finish (or end as the
/// bdev ends them); commands they send afterwards meet the new reservation. False if some
/// are still outstanding after [`PREEMPT_ABORT_WAIT`] (SPDK then answers Command Interrupted).
async fn wait_preempted(subnqn: String, nsid: u32, hosts: Vec<InitiatorId>) -> bool {
    let engine = ferrite_reactor::engine();
    let hosts = Arc::new(hosts);
    let Ok(mut left) = engine.on_all(move |_| super::qpair::preempted_in_flight(&subnqn, nsid, &hosts)).await else {
        return true;
    };
    let n: usize = left.iter().map(Vec::len).sum();
    if n > 0 {
        log::info!("nvmf: Preempt and Abort on namespace {nsid} waits for {n} command(s) of the preempted hosts");
    }
    let deadline = Instant::now() + PREEMPT_ABORT_WAIT;
    let mut poll = Duration::from_millis(1);
    while left.iter().any(|v| !v.is_empty()) {
        if Instant::now() >= deadline {
            return false;
        }
        // Looks again soon, then less and less often (up to every 32 ms).
        ferrite_reactor::sleep(poll).await;
        poll = (poll * 2).min(Duration::from_millis(32));
        let prev = Arc::new(left);
        left = engine.on_all(move |r| super::qpair::still_in_flight(&prev[r])).await.unwrap_or_default();
    }
    true
}

/// Register, Unregister or Replace (RREGA), then the CPTPL change.
fn register(who: &Initiator, ns: &Namespace, cdw10: u32, data: &[u8]) -> Result<Notices, ResvError> {
    let r = ns.bdev().reservations();
    let (rrega, iekey, cptpl) = (cdw10 & 7, cdw10 & (1 << 3) != 0, cdw10 >> 30);
    let (crkey, nrkey) = (u64_at(data, 0), u64_at(data, 8));
    if cptpl == 3 && ns.ptpl_file.is_none() {
        return Err(ResvError::Invalid("Persist Through Power Loss needs the namespace's ptpl_file"));
    }
    let notices = match rrega {
        0 => r.register(who, nrkey).map(|()| Vec::new()),
        1 => r.unregister(who, crkey, iekey),
        2 => r.replace(who, crkey, nrkey, iekey).map(|()| Vec::new()),
        _ => Err(ResvError::Invalid("reserved RREGA")),
    }?;
    // CPTPL 00b: no change; 01b: reserved (ignored, as SPDK does).
    match cptpl {
        2 => r.set_aptpl(false),
        3 => r.set_aptpl(true),
        _ => {}
    }
    Ok(notices)
}

/// Acquire, Preempt or Preempt and Abort (RACQA). Preempt and Abort changes the registry as
/// Preempt does; `run` then waits for the preempted hosts' commands (`wait_preempted`).
fn acquire(who: &Initiator, ns: &Namespace, cdw10: u32, data: &[u8]) -> Result<Notices, ResvError> {
    let r = ns.bdev().reservations();
    let (racqa, iekey) = (cdw10 & 7, cdw10 & (1 << 3) != 0);
    if iekey {
        // SPDK refuses IEKEY in Acquire (NVMe 2.0 made the bit reserved there).
        return Err(ResvError::Invalid("IEKEY set in Reservation Acquire"));
    }
    let rtype = ResvType::from_code((cdw10 >> 8) as u8).ok_or(ResvError::Invalid("invalid RTYPE"))?;
    let (crkey, prkey) = (u64_at(data, 0), u64_at(data, 8));
    match racqa {
        0 => r.acquire(who, crkey, rtype).map(|()| Vec::new()),
        1 | 2 => r.preempt(who, crkey, prkey, rtype),
        _ => Err(ResvError::Invalid("reserved RACQA")),
    }
}

/// Release or Clear (RRELA).
fn release(who: &Initiator, ns: &Namespace, cdw10: u32, data: &[u8]) -> Result<Notices, ResvError> {
    let r = ns.bdev().reservations();
    let (rrela, iekey, rtype) = (cdw10 & 7, cdw10 & (1 << 3) != 0, (cdw10 >> 8) as u8);
    if iekey {
        return Err(ResvError::Invalid("IEKEY set in Reservation Release"));
    }
    let crkey = u64_at(data, 0);
    match rrela {
        0 => r.release(who, crkey, rtype),
        1 => r.clear(who, crkey),
        _ => Err(ResvError::Invalid("reserved RRELA")),
    }
}

/// Reservation Report: the extended data structure (64-byte header, 64 bytes per registrant
/// with its 128-bit Host Identifier). EDS=0 asks for 64-bit host identifiers, which fabrics
/// hosts do not have: Host Identifier Inconsistent Format, as NVMe says and SPDK and Linux's
/// target answer.
fn report(c: &Rc<Conn>, slot: u16, ctrl: &Ctrlr, ns: &Namespace, cdw10: u32, cdw11: u32, len: u32) {
    if cdw11 & 1 == 0 {
        log::info!(
            "nvmf controller {} of {}: Reservation Report without EDS (64-bit host IDs) refused",
            ctrl.cntlid,
            ctrl.subnqn
        );
        return c.complete(slot, Status::generic(generic::HOSTID_INCONSISTENT_FORMAT).with_dnr(), 0, None);
    }
    if len == 0 {
        return c.complete(slot, invalid_field(), 0, None);
    }
    let rep = ns.bdev().reservations().report();
    // Each registrant's controller: a live one of its host in this subsystem (FFFFh: none).
    let cntlids: Vec<u16> = {
        let t = tables();
        let ctrlrs = t.subsystem(&ctrl.subnqn).map(|s| s.ctrlrs.values().cloned().collect::<Vec<_>>());
        let ctrlrs = ctrlrs.unwrap_or_default();
        rep.registrants
            .iter()
            .map(|r| ctrlrs.iter().find(|x| x.initiator == r.who).map_or(0xffff, |x| x.cntlid))
            .collect()
    };
    let mut page = vec![0u8; REPORT_ENTRY * (1 + rep.registrants.len())];
    page[0..4].copy_from_slice(&rep.generation.to_le_bytes());
    page[4] = rep.rtype.map_or(0, ResvType::code);
    page[5..7].copy_from_slice(&(rep.registrants.len() as u16).to_le_bytes());
    page[9] = u8::from(rep.aptpl);
    for (i, (r, cntlid)) in rep.registrants.iter().zip(cntlids).enumerate() {
        let e = &mut page[REPORT_ENTRY * (i + 1)..REPORT_ENTRY * (i + 2)];
        e[0..2].copy_from_slice(&cntlid.to_le_bytes());
        e[2] = u8::from(r.holder);
        e[8..16].copy_from_slice(&r.key.to_le_bytes());
        if let Initiator::Nvme { hostid, .. } = &r.who {
            e[16..32].copy_from_slice(hostid);
        }
    }
    // NUMD dwords at most, within the command's buffer; the rest reads zeroes.
    let numd_bytes = (u64::from(cdw10) + 1) * 4;
    let want = (u64::from(len).min(numd_bytes) as usize).min(page.len());
    let mut b = ferrite_reactor::alloc_buf(len as usize);
    b.set_len(len as usize);
    b.fill(0);
    b[..want].copy_from_slice(&page[..want]);
    c.complete(slot, Status::SUCCESS, 0, Some(smallvec![b]));
}

/// Queues each notice in the log of the controllers of its host in this subsystem (unless
/// masked there) and raises Reservation Log Page Available.
fn notify(ctrl: &Ctrlr, nsid: u32, notices: Notices) {
    if notices.is_empty() {
        return;
    }
    let ctrlrs: Vec<Arc<Ctrlr>> = {
        let t = tables();
        t.subsystem(&ctrl.subnqn).map(|s| s.ctrlrs.values().cloned().collect()).unwrap_or_default()
    };
    for (who, notice) in notices {
        for x in ctrlrs.iter().filter(|x| x.initiator == who) {
            post(x, nsid, notice);
        }
    }
}

fn post(ctrl: &Arc<Ctrlr>, nsid: u32, notice: Notice) {
    let mask = {
        let r = ctrl.regs.lock().unwrap();
        r.resv_mask.get(&nsid).copied().unwrap_or(r.resv_mask_default)
    };
    // Mask bits 1, 2, 3: Registration Preempted, Reservation Released, Reservation Preempted.
    if mask & (1 << notice as u8) != 0 {
        return;
    }
    log::info!(
        "nvmf controller {} of {}: reservation notice {notice:?} for namespace {nsid}",
        ctrl.cntlid,
        ctrl.subnqn
    );
    ctrl.resv_log.lock().unwrap().push(notice, nsid);
    ctrl.raise(RESERVATION_LOG_EVENT, 0);
}

/// Identify Namespace RESCAP: every type, IEKEY, and PTPL with a `ptpl_file`.
pub(crate) fn rescap(ns: &Namespace) -> u8 {
    use crate::spec::identify_ns::rescap as r;
    let ptpl = if ns.ptpl_file.is_some() { r::PTPL } else { 0 };
    ptpl | r::WRITE_EXCLUSIVE
        | r::EXCLUSIVE_ACCESS
        | r::WRITE_EXCLUSIVE_REG_ONLY
        | r::EXCLUSIVE_ACCESS_REG_ONLY
        | r::WRITE_EXCLUSIVE_ALL_REGS
        | r::EXCLUSIVE_ACCESS_ALL_REGS
        | r::IGNORE_EXISTING_KEY
}

/// Get Features 82h (Reservation Notification Mask) of namespace `nsid`.
pub(crate) fn get_mask(ctrl: &Ctrlr, nsid: u32) -> Result<u32, Status> {
    let known = tables().subsystem(&ctrl.subnqn).is_some_and(|s| s.namespaces.contains_key(&nsid));
    if !known {
        // NSID FFFFFFFFh included, as SPDK answers.
        return Err(invalid_field());
    }
    let r = ctrl.regs.lock().unwrap();
    Ok(r.resv_mask.get(&nsid).copied().unwrap_or(r.resv_mask_default))
}

/// Set Features 82h: NSID FFFFFFFFh sets every namespace's mask.
pub(crate) fn set_mask(ctrl: &Ctrlr, nsid: u32, v: u32) -> Result<(), Status> {
    let v = v & 0b1110;
    if nsid == crate::spec::identify::NSID_ALL {
        let mut r = ctrl.regs.lock().unwrap();
        r.resv_mask.clear();
        r.resv_mask_default = v;
        return Ok(());
    }
    let known = tables().subsystem(&ctrl.subnqn).is_some_and(|s| s.namespaces.contains_key(&nsid));
    if !known {
        return Err(invalid_field());
    }
    ctrl.regs.lock().unwrap().resv_mask.insert(nsid, v);
    Ok(())
}

/// The namespaces feature 83h addresses: `nsid`, or every one for FFFFFFFFh.
fn addressed(ctrl: &Ctrlr, nsid: u32) -> Vec<Arc<Namespace>> {
    let t = tables();
    let Some(s) = t.subsystem(&ctrl.subnqn) else { return Vec::new() };
    if nsid == crate::spec::identify::NSID_ALL {
        s.namespaces.values().cloned().collect()
    } else {
        s.namespaces.get(&nsid).cloned().into_iter().collect()
    }
}

/// Get Features 83h (Reservation Persistence): PTPL of namespace `nsid`.
pub(crate) fn get_persistence(ctrl: &Ctrlr, nsid: u32) -> Result<u32, Status> {
    if nsid == crate::spec::identify::NSID_ALL {
        return Err(invalid_field());
    }
    let ns = addressed(ctrl, nsid).pop().ok_or_else(invalid_field)?;
    Ok(u32::from(ns.bdev().reservations().report().aptpl))
}

/// Set Features 83h: PTPL on or off, for namespaces with a `ptpl_file` (others refuse it,
/// as SPDK's do).
pub(crate) fn set_persistence(ctrl: &Ctrlr, nsid: u32, v: u32) -> Result<(), Status> {
    let nss = addressed(ctrl, nsid);
    let capable: Vec<_> = nss.iter().filter(|n| n.ptpl_file.is_some()).collect();
    if capable.is_empty() || (nsid != crate::spec::identify::NSID_ALL && capable.len() != nss.len()) {
        log::info!(
            "nvmf controller {}: Set Features Reservation Persistence: namespace {nsid} has no ptpl_file",
            ctrl.cntlid
        );
        return Err(invalid_field());
    }
    let mut written = true;
    for n in capable {
        n.bdev().reservations().set_aptpl(v & 1 != 0);
        written &= persist(n);
    }
    if !written {
        return Err(Status::generic(generic::INTERNAL_DEVICE_ERROR));
    }
    Ok(())
}

/// Writes the namespace's registry to its `ptpl_file` in SPDK's format (an empty file when
/// PTPL is off, as SPDK leaves it). Written beside and renamed, so a crash leaves the old or
/// the new copy.
/// False if the file could not be written (the command then answers Internal Device Error,
/// as SPDK's does: the host must not believe its reservation will survive a power loss).
pub(crate) fn persist(ns: &Namespace) -> bool {
    let Some(file) = &ns.ptpl_file else { return true };
    let text = ptpl_json(ns).map(|v| v.to_string()).unwrap_or_default();
    let tmp = format!("{file}.tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, file)) {
        log::error!("nvmf namespace {} (bdev {}): cannot write ptpl_file {file}: {e}", ns.nsid, ns.bdev_name);
        return false;
    }
    true
}

fn uuid_of(hostid: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*hostid).hyphenated().to_string()
}

/// SPDK's `nvmf_ns_reservation_store_json` document, or None while PTPL is off.
fn ptpl_json(ns: &Namespace) -> Option<serde_json::Value> {
    let rep = ns.bdev().reservations().report();
    if !rep.aptpl {
        return None;
    }
    let all = rep.rtype.is_some_and(ResvType::all_registrants);
    let holder = rep.registrants.iter().find(|r| r.holder && !all);
    let host = |w: &Initiator| match w {
        Initiator::Nvme { hostid, .. } => Some(uuid_of(hostid)),
        Initiator::Scsi { .. } => None,
    };
    let regs: Vec<serde_json::Value> = rep
        .registrants
        .iter()
        .filter_map(|r| host(&r.who).map(|h| serde_json::json!({"rkey": r.key, "host_uuid": h})))
        .collect();
    Some(serde_json::json!({
        "ptpl": true,
        "rtype": rep.rtype.map_or(0, ResvType::code),
        "crkey": rep.holder_key,
        "bdev_uuid": ns.bdev().uuid().hyphenated().to_string(),
        "holder_uuid": holder.and_then(|h| host(&h.who)).unwrap_or_default(),
        "registrants": regs,
    }))
}

/// Restores a bdev's registry from a `ptpl_file` written by SPDK or Ferrite (nvmf_subsystem_add_ns):
/// nothing if the file is missing, empty or has PTPL off; an error if it is malformed or
/// describes another bdev.
pub(crate) fn restore(bdev: &ferrite_bdev::Bdev, file: &str) -> Result<(), String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read ptpl_file {file}: {e}")),
    };
    if text.trim().is_empty() {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    struct Reg {
        rkey: u64,
        host_uuid: String,
    }
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        ptpl: bool,
        #[serde(default)]
        rtype: u8,
        #[serde(default)]
        crkey: u64,
        bdev_uuid: String,
        #[serde(default)]
        holder_uuid: String,
        registrants: Vec<Reg>,
    }
    let d: Doc = serde_json::from_str(&text).map_err(|e| format!("ptpl_file {file} is not valid: {e}"))?;
    if !d.ptpl || d.registrants.is_empty() {
        return Ok(());
    }
    let parse =
        |s: &str| uuid::Uuid::parse_str(s).map(|u| *u.as_bytes()).map_err(|e| format!("ptpl_file {file}: {s}: {e}"));
    if parse(&d.bdev_uuid)? != *bdev.uuid().as_bytes() {
        return Err(format!("ptpl_file {file} is for bdev {}, not {}", d.bdev_uuid, bdev.uuid()));
    }
    if d.crkey != 0 && !d.registrants.iter().any(|r| r.rkey == d.crkey) {
        return Err(format!("ptpl_file {file}: the reservation key is no registrant's"));
    }
    // The registry is the bdev's, shared by every namespace on it: a file must not replace
    // reservations that hosts hold right now through another namespace.
    let live = bdev.reservations().report();
    if !live.registrants.is_empty() {
        return Err(format!(
            "ptpl_file {file}: bdev {} already has {} registrant(s) through another namespace;              restoring would replace their reservations",
            bdev.name(),
            live.registrants.len()
        ));
    }
    let who = |hostid: [u8; 16]| Initiator::Nvme { hostid, hostnqn: String::new() };
    let mut regs: Vec<(Initiator, u64)> = Vec::new();
    for r in &d.registrants {
        let id = parse(&r.host_uuid)?;
        if regs.iter().any(|(i, _)| matches!(i, Initiator::Nvme { hostid, .. } if *hostid == id)) {
            return Err(format!("ptpl_file {file}: host {} is listed twice", r.host_uuid));
        }
        regs.push((who(id), r.rkey));
    }
    let rtype = if d.rtype == 0 {
        None
    } else {
        Some(ResvType::from_code(d.rtype).ok_or_else(|| format!("ptpl_file {file}: rtype {}", d.rtype))?)
    };
    let holder = if d.holder_uuid.is_empty() { None } else { Some(who(parse(&d.holder_uuid)?)) };
    bdev.reservations().restore(regs, rtype, holder.as_ref(), true).map_err(|e| format!("ptpl_file {file}: {e}"))?;
    log::info!("bdev {}: reservations restored from {file}", bdev.name());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_log_keeps_255_entries_and_counts_the_rest() {
        let mut l = NoticeLog::default();
        for _ in 0..300 {
            l.push(Notice::ReservationReleased, 1);
        }
        let page = l.take(0, u64::MAX);
        assert_eq!(page.len(), LOG_MAX * LOG_ENTRY);
        let last = &page[(LOG_MAX - 1) * LOG_ENTRY..];
        assert_eq!(u64::from_le_bytes(last[0..8].try_into().unwrap()), 300, "the last entry carries the count");
        assert_eq!(page[8], 2);
        assert_eq!(page[9], 254, "entries after the first");
        assert!(l.take(0, u64::MAX).is_empty(), "read once");
    }

    #[test]
    fn a_short_read_consumes_only_what_it_returned() {
        let mut l = NoticeLog::default();
        l.push(Notice::RegistrationPreempted, 1);
        l.push(Notice::ReservationPreempted, 2);
        let first = l.take(0, 64);
        assert_eq!((first.len(), first[8], first[9], first[12]), (64, 1, 1, 1));
        let second = l.take(0, 64);
        assert_eq!((second[8], second[9], second[12]), (3, 0, 2));
    }

    #[test]
    fn an_entry_returned_in_part_is_not_consumed() {
        let mut l = NoticeLog::default();
        l.push(Notice::RegistrationPreempted, 1);
        l.push(Notice::ReservationReleased, 2);
        l.push(Notice::ReservationPreempted, 3);
        // 100 bytes: the first entry whole, 36 bytes of the second.
        let page = l.take(0, 100);
        assert_eq!((page[8], page[64 + 8]), (1, 2));
        // An offset inside an entry: the second is returned in part again, the third whole.
        let page = l.take(32, 32 + 64 + 32);
        assert_eq!((page[8], page[64 + 8], page[64 + 9]), (2, 3, 0));
        assert_eq!(l.entries.len(), 1, "only the third was returned whole");
        let page = l.take(0, 64);
        assert_eq!((page[8], page[9], page[12]), (2, 0, 2), "the second, whole at last");
        assert!(l.take(0, 64).is_empty());
    }

    #[test]
    fn a_read_past_the_entries_consumes_none() {
        let mut l = NoticeLog::default();
        for nsid in 1..=5 {
            l.push(Notice::RegistrationPreempted, nsid);
        }
        assert!(l.take(640, 64 * 16).is_empty(), "nothing at offset 640 of 320 bytes");
        assert!(l.take(320, 64).is_empty());
        assert_eq!(l.entries.len(), 5, "every notice kept");
        let page = l.take(0, 64 * 5);
        assert_eq!((page[12], page[4 * 64 + 12]), (1, 5));
    }
}
