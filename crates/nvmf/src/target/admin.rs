//! Admin commands: Identify, Get Log Page, Get/Set Features, Asynchronous Event Request, Keep
//! Alive and Abort (of AERs and of I/O commands, on whichever reactor holds them). Answers are built from the subsystem's tables (under their lock: the admin
//! queue is not a hot path) into a pool buffer and sent as C2HData.

use super::ctrlr::{Ctrlr, AER_LIMIT};
use super::model::{tables, Subsystem, Tables};
use super::qpair::{set_phase, Conn, Phase};
use crate::spec::aer::AsyncEvent;
use crate::spec::discovery::{adrfam, subtype, DiscoveryLogEntry, DiscoveryLogHeader};
use crate::spec::features::fid;
use crate::spec::identify::{cns, csi, NamespaceList, NsIdDescriptor, NSID_ALL};
use crate::spec::identify_ctrl::{self as ic, IdentifyController};
use crate::spec::identify_ns::{IdentifyNamespace, LbaFormat};
use crate::spec::log::{self, lid, AnaGroupDescriptor, AnaLogHeader, CommandEffectsLog, SmartLog, SupportedLogPages};
use crate::spec::nqn::NqnField;
use crate::spec::opcode::{admin as op, nvm};
use crate::spec::status::{command_specific, generic, Status};
use ferrite_bdev::IoType;
use smallvec::smallvec;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// AEC bits (Set Features Asynchronous Event Configuration) of the notices Ferrite raises.
pub(crate) mod aec {
    /// Namespace Attribute Notices.
    pub const NS_ATTR: u32 = 1 << 8;
    /// ANA Change Notices.
    pub const ANA_CHANGE: u32 = 1 << 11;
    /// Discovery Log Page Change Notification.
    pub const DISCOVERY_LOG_CHANGE: u32 = 1 << 31;
}

fn invalid_field() -> Status {
    Status::generic(generic::INVALID_FIELD).with_dnr()
}

/// Sends `bytes` (at most the command's length) as the command's data.
fn reply_data(c: &Rc<Conn>, slot: u16, bytes: &[u8]) {
    let mut b = ferrite_reactor::alloc_buf(bytes.len().max(1));
    b.set_len(bytes.len());
    b.copy_from_slice(bytes);
    c.complete(slot, Status::SUCCESS, 0, Some(smallvec![b]));
}

/// Runs the admin command in `slot`.
pub(crate) fn run(c: &Rc<Conn>, slot: u16) {
    let Some(ctrl) = c.ctrl() else { return c.complete(slot, invalid_field(), 0, None) };
    ctrl.touch();
    let sqe = c.cmds.borrow()[usize::from(slot)].sqe;
    let enabled = crate::spec::registers::Cc::from_u32(ctrl.regs.lock().unwrap().cc).en;
    if !enabled {
        return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
    }
    match sqe.opcode {
        op::IDENTIFY => identify(c, slot, &ctrl, &sqe),
        op::GET_LOG_PAGE => get_log_page(c, slot, &ctrl, &sqe),
        op::GET_FEATURES => get_features(c, slot, &ctrl, &sqe),
        op::SET_FEATURES => set_features(c, slot, &ctrl, &sqe),
        op::ASYNC_EVENT_REQUEST => {
            if c.aers.borrow().len() >= AER_LIMIT {
                return c.complete(
                    slot,
                    Status::command_specific(command_specific::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED).with_dnr(),
                    0,
                    None,
                );
            }
            set_phase(&mut c.cmds.borrow_mut()[usize::from(slot)], Phase::Ready, c.id, slot);
            c.aers.borrow_mut().push(slot);
            c.deliver_events();
        }
        op::KEEP_ALIVE => c.complete(slot, Status::SUCCESS, 0, None),
        op::ABORT => abort(c, slot, &sqe),
        _ => {
            ::log::debug!("nvmf controller {}: admin opcode {:#04x} not supported", ctrl.cntlid, sqe.opcode);
            c.complete(slot, Status::generic(generic::INVALID_OPCODE).with_dnr(), 0, None)
        }
    }
}

/// Abort (cdw10: SQID, CID): an outstanding AER of the admin queue ends at once; an I/O
/// command is looked up on its queue pair's reactor and the bdev layer asked to abort it
/// (`IoType::Abort`: requests the layer queues, and those a module holds, such as a delay
/// bdev's). A command still receiving its data is waited for up to the transport's
/// `abort_timeout_sec`, as SPDK does. DW0 bit 0 answers "not aborted" when nothing was stopped:
/// the command had completed, or its bdev could not stop it (it completes on its own).
/// Identify Controller's Abort Command Limit (0's based: this many plus one at a time).
pub(crate) const ABORT_LIMIT: u8 = 3;

fn abort(c: &Rc<Conn>, slot: u16, sqe: &crate::spec::sqe::Sqe) {
    let sqid = sqe.cdw10 as u16;
    let cid = (sqe.cdw10 >> 16) as u16;
    if sqid == 0 {
        let aer = {
            let cmds = c.cmds.borrow();
            c.aers.borrow().iter().copied().find(|&s| cmds[usize::from(s)].sqe.cid == cid)
        };
        if let Some(a) = aer {
            c.aers.borrow_mut().retain(|&s| s != a);
            c.complete(a, Status::generic(generic::ABORTED_BY_REQUEST), 0, None);
            return c.complete(slot, Status::SUCCESS, 0, None);
        }
        return c.complete(slot, Status::SUCCESS, 1, None);
    }
    let at = c.ctrl().and_then(|ctrl| ctrl.qids.lock().unwrap().get(&sqid).copied());
    let Some(at) = at else {
        return c.complete(slot, Status::SUCCESS, 1, None);
    };
    // At most ACL + 1 Aborts are answered at a time (Identify Controller's 0's based limit).
    if c.aborts.get() > u32::from(ABORT_LIMIT) {
        return c.complete(
            slot,
            Status::command_specific(crate::spec::status::command_specific::ABORT_COMMAND_LIMIT_EXCEEDED),
            0,
            None,
        );
    }
    c.aborts.set(c.aborts.get() + 1);
    let wait = std::time::Duration::from_secs(u64::from(c.opts.abort_timeout_sec));
    let answer =
        ferrite_reactor::engine().run_async(at.reactor, move || super::qpair::abort_command(at.conn, cid, wait));
    let c = c.clone();
    ferrite_reactor::spawn_local(async move {
        let aborted = answer.await.unwrap_or(false);
        c.aborts.set(c.aborts.get() - 1);
        // Each command aborted is worth a line; the misses (which a host can ask for at will)
        // only at debug.
        let level = if aborted { ::log::Level::Info } else { ::log::Level::Debug };
        ::log::log!(
            level,
            "nvmf connection {}: Abort of command {cid} on queue {sqid}: {}",
            c.id,
            if aborted { "aborted" } else { "not aborted" }
        );
        c.complete(slot, Status::SUCCESS, u32::from(!aborted), None);
    })
    .detach();
}

/// MDTS for `max_io_size` with 4 KiB pages.
fn mdts(max_io: u32) -> u8 {
    let pages = (max_io / 4096).max(1);
    (31 - pages.leading_zeros()) as u8
}

fn identify_controller(c: &Conn, ctrl: &Ctrlr, t: &Tables) -> IdentifyController {
    let s = t.subsystem(&ctrl.subnqn);
    let o = &c.opts;
    let mut id = IdentifyController {
        fr: ic::ascii_field(env!("CARGO_PKG_VERSION")),
        rab: 6,
        cmic: 0,
        mdts: mdts(o.max_io_size),
        cntlid: ctrl.cntlid,
        ver: crate::spec::registers::Vs::V1_3.to_u32(),
        ctratt: ic::ctratt::HOST_ID_128,
        acl: ABORT_LIMIT,
        aerl: (AER_LIMIT - 1) as u8,
        frmw: ic::frmw::SLOT1_RO | (1 << 1),
        lpa: ic::lpa::COMMAND_EFFECTS | ic::lpa::EXTENDED_DATA,
        elpe: 0,
        kas: 10,
        sqes: ic::entry_sizes(6, 6),
        cqes: ic::entry_sizes(4, 4),
        maxcmd: o.max_queue_depth,
        sgls: ic::sgls::SUPPORTED | ic::sgls::OFFSET | ic::sgls::TRANSPORT,
        subnqn: NqnField::new(&ctrl.subnqn).unwrap_or_default(),
        ioccsz: (64 + o.in_capsule_data_size) / 16,
        iorcsz: 1,
        icdoff: 0,
        msdbd: 1,
        ..IdentifyController::default()
    };
    match s {
        Some(s) if !s.discovery => {
            id.sn = ic::ascii_field(&s.serial);
            id.mn = ic::ascii_field(&s.model);
            id.cntrltype = ic::cntrltype::IO;
            id.cmic = ic::cmic::MULTI_PORT | ic::cmic::MULTI_CTRL;
            id.oaes = ic::oaes::NS_ATTRIBUTE;
            if s.ana_reporting {
                id.cmic |= ic::cmic::ANA_REPORTING;
                id.oaes |= ic::oaes::ANA_CHANGE;
                id.anatt = 10;
                id.anacap = ic::anacap::OPTIMIZED
                    | ic::anacap::NON_OPTIMIZED
                    | ic::anacap::INACCESSIBLE
                    | ic::anacap::PERSISTENT_LOSS
                    | ic::anacap::CHANGE
                    | ic::anacap::NON_ZERO_ANAGRPID;
                id.anagrpmax = s.max_namespaces;
                id.nanagrpid = s.max_namespaces;
            }
            id.nn = s.max_namespaces;
            // Linux refuses a controller with ANA reporting whose MNAN is 0 or above NN.
            id.mnan = s.max_namespaces;
            id.oncs = ic::oncs::COMPARE | ic::oncs::DSM | ic::oncs::WRITE_ZEROES;
            if !o.reservations_masked() {
                id.oncs |= ic::oncs::RESERVATIONS;
            }
            id.fuses = ic::fuses::COMPARE_AND_WRITE;
            id.vwc = ic::vwc::PRESENT | ic::vwc::FLUSH_BROADCAST_NOT_SUPPORTED;
        }
        _ => {
            id.sn = ic::ascii_field("Ferrite discovery");
            id.mn = ic::ascii_field("Ferrite discovery controller");
            id.cntrltype = ic::cntrltype::DISCOVERY;
            id.oaes = ic::oaes::DISCOVERY_LOG_CHANGE;
            id.maxcmd = o.max_aq_depth;
        }
    }
    id
}

fn identify_namespace(s: &Subsystem, nsid: u32) -> Option<IdentifyNamespace> {
    let ns = s.namespaces.get(&nsid)?;
    let b = ns.bdev();
    let blocks = b.num_blocks();
    let lbads = b.block_size().trailing_zeros() as u8;
    let mut id = IdentifyNamespace {
        nsze: blocks,
        ncap: blocks,
        nuse: blocks,
        nlbaf: 0,
        flbas: 0,
        nmic: crate::spec::identify_ns::nmic::SHARED,
        nvmcap: u128::from(b.size_bytes()),
        nguid: ns.nguid,
        eui64: ns.eui64,
        ..IdentifyNamespace::default()
    };
    id.lbaf[0] = LbaFormat::new(lbads);
    if !b.supports(IoType::Write) {
        // A read-only bdev (an lvol snapshot): hosts make the disk read-only.
        id.nsattr |= crate::spec::identify_ns::nsattr::WRITE_PROTECTED;
    }
    if b.supports(IoType::Unmap) {
        id.nsfeat |= crate::spec::identify_ns::nsfeat::THIN_PROVISIONING;
        // Every Ferrite module reads zeroes after deallocate and write zeroes.
        id.dlfeat =
            crate::spec::identify_ns::dlfeat::READ_ZEROES | crate::spec::identify_ns::dlfeat::WRITE_ZEROES_DEALLOCATE;
    }
    if s.ana_reporting {
        id.anagrpid = ns.anagrpid;
    }
    id.rescap = super::resv::rescap(ns);
    Some(id)
}

fn identify(c: &Rc<Conn>, slot: u16, ctrl: &Ctrlr, sqe: &crate::spec::sqe::Sqe) {
    let cns_v = sqe.cdw10 as u8;
    let csi_v = (sqe.cdw11 >> 24) as u8;
    let nsid = sqe.nsid;
    let t = tables();
    let Some(s) = t.subsystem(&ctrl.subnqn) else { return c.complete(slot, invalid_field(), 0, None) };
    let mut page = [0u8; 4096];
    match cns_v {
        cns::CONTROLLER => identify_controller(c, ctrl, &t).encode(&mut page),
        cns::NAMESPACE => {
            if nsid == 0 || nsid == NSID_ALL {
                drop(t);
                return c.complete(slot, Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(), 0, None);
            }
            // An inactive NSID answers zeroes.
            if let Some(id) = identify_namespace(s, nsid) {
                id.encode(&mut page);
            }
        }
        cns::ACTIVE_NS_LIST => {
            if nsid >= 0xffff_fffe {
                drop(t);
                return c.complete(slot, Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(), 0, None);
            }
            NamespaceList::after(s.namespaces.keys().copied(), nsid).encode(&mut page);
        }
        cns::ACTIVE_NS_LIST_IOCS if csi_v == csi::NVM => {
            NamespaceList::after(s.namespaces.keys().copied(), nsid).encode(&mut page);
        }
        cns::NS_ID_DESCRIPTOR_LIST => {
            let Some(ns) = s.namespaces.get(&nsid) else {
                drop(t);
                return c.complete(slot, Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(), 0, None);
            };
            let mut d = Vec::new();
            if ns.eui64 != [0; 8] {
                d.push(NsIdDescriptor::Eui64(ns.eui64));
            }
            if ns.nguid != [0; 16] {
                d.push(NsIdDescriptor::Nguid(ns.nguid));
            }
            if ns.uuid != [0; 16] {
                d.push(NsIdDescriptor::Uuid(ns.uuid));
            }
            d.push(NsIdDescriptor::Csi(csi::NVM));
            NsIdDescriptor::write_list(&d, &mut page);
        }
        // The NVM command set's own structures: nothing Ferrite reports is non-zero in them.
        cns::NS_IOCS if csi_v == csi::NVM && s.namespaces.contains_key(&nsid) => {}
        cns::CTRLR_IOCS if csi_v == csi::NVM => {}
        cns::NS_IOCS_INDEPENDENT => {
            if let Some(ns) = s.namespaces.get(&nsid) {
                let mut id = crate::spec::identify::IoCsIndependentNamespace {
                    nmic: crate::spec::identify_ns::nmic::SHARED,
                    nstat: crate::spec::identify::NSTAT_READY,
                    ..Default::default()
                };
                if s.ana_reporting {
                    id.anagrpid = ns.anagrpid;
                }
                let mut b = [0u8; crate::spec::identify::IoCsIndependentNamespace::SIZE];
                id.encode(&mut b);
                page[..b.len()].copy_from_slice(&b);
            }
        }
        _ => {
            drop(t);
            return c.complete(slot, invalid_field(), 0, None);
        }
    }
    drop(t);
    reply_data(c, slot, &page);
}

/// The discovery log page for `ctrl`'s host: every listener of every subsystem it may use,
/// the current discovery controller on the listener it connected through, and the referrals.
pub(crate) fn discovery_log(t: &Tables, ctrl: &Ctrlr) -> (DiscoveryLogHeader, Vec<DiscoveryLogEntry>) {
    let fam = |f: &str| if f.eq_ignore_ascii_case("ipv6") { adrfam::IPV6 } else { adrfam::IPV4 };
    let asqsz = t.transport_opts().max_aq_depth;
    let mut entries = Vec::new();
    let l = &ctrl.listener;
    let mut cur = DiscoveryLogEntry::tcp(
        NqnField::new(crate::spec::nqn::DISCOVERY_NQN).unwrap_or_default(),
        fam(&l.adrfam),
        &l.traddr,
        &l.trsvcid,
        0,
        asqsz,
    );
    cur.subtype = subtype::DISCOVERY_CURRENT;
    cur.eflags = crate::spec::discovery::eflags::DUPRETINFO;
    entries.push(cur);
    for s in t.subsystems.values().filter(|s| !s.discovery && s.host_allowed(&ctrl.hostnqn)) {
        let Ok(nqn) = NqnField::new(&s.nqn) else { continue };
        for (port, lst) in s.listeners.iter().enumerate() {
            let tr = &lst.trid;
            entries.push(DiscoveryLogEntry::tcp(nqn, fam(&tr.adrfam), &tr.traddr, &tr.trsvcid, port as u16, asqsz));
        }
    }
    for r in &t.referrals {
        let Ok(nqn) = NqnField::new(&r.subnqn) else { continue };
        let mut e = DiscoveryLogEntry::tcp(nqn, fam(&r.trid.adrfam), &r.trid.traddr, &r.trid.trsvcid, 0, asqsz);
        e.subtype = subtype::DISCOVERY_REFERRAL;
        if r.secure_channel {
            e.treq = crate::spec::discovery::treq::SECURE_CHANNEL_REQUIRED;
        }
        entries.push(e);
    }
    let h = DiscoveryLogHeader { genctr: t.genctr, numrec: entries.len() as u64, recfmt: 0, ..Default::default() };
    (h, entries)
}

fn smart_log(ctrl: &Ctrlr) -> SmartLog {
    let (reads, writes, read_bytes, written_bytes) = ctrl.totals();
    // Data units are thousands of 512-byte units, rounded up.
    let units = |b: u64| u128::from(b.div_ceil(512_000));
    SmartLog {
        temperature: 273 + 25,
        available_spare: 100,
        available_spare_threshold: 10,
        data_units_read: units(read_bytes),
        data_units_written: units(written_bytes),
        host_read_commands: u128::from(reads),
        host_write_commands: u128::from(writes),
        power_cycles: 1,
        num_error_info_log_entries: u128::from(ctrl.errors.load(Ordering::Relaxed)),
        ..SmartLog::default()
    }
}

fn effects_log(reservations: bool) -> CommandEffectsLog {
    use crate::spec::log::effects::{CSUPP, LBCC};
    let mut e = CommandEffectsLog { acs: [0; 256], iocs: [0; 256] };
    for o in [
        op::GET_LOG_PAGE,
        op::IDENTIFY,
        op::ABORT,
        op::SET_FEATURES,
        op::GET_FEATURES,
        op::ASYNC_EVENT_REQUEST,
        op::KEEP_ALIVE,
    ] {
        e.acs[usize::from(o)] = CSUPP;
    }
    e.iocs[usize::from(nvm::FLUSH)] = CSUPP | LBCC;
    e.iocs[usize::from(nvm::WRITE)] = CSUPP | LBCC;
    e.iocs[usize::from(nvm::READ)] = CSUPP;
    e.iocs[usize::from(nvm::COMPARE)] = CSUPP;
    e.iocs[usize::from(nvm::WRITE_ZEROES)] = CSUPP | LBCC;
    e.iocs[usize::from(nvm::DATASET_MANAGEMENT)] = CSUPP | LBCC;
    if reservations {
        for o in
            [nvm::RESERVATION_REGISTER, nvm::RESERVATION_REPORT, nvm::RESERVATION_ACQUIRE, nvm::RESERVATION_RELEASE]
        {
            e.iocs[usize::from(o)] = CSUPP;
        }
    }
    e
}

fn ana_log(s: &Subsystem, ctrl: &Ctrlr, rgo: bool) -> Vec<u8> {
    let listener = s.listener(&ctrl.listener);
    let groups = s.ana_groups();
    let chgcnt = ctrl.subsys.epoch.load(Ordering::Acquire);
    let mut out = vec![0u8; AnaLogHeader::SIZE];
    let hdr = AnaLogHeader { chgcnt, ngrps: groups.len() as u16 };
    let mut h = [0u8; AnaLogHeader::SIZE];
    hdr.encode(&mut h);
    out.copy_from_slice(&h);
    for g in groups {
        let nsids: Vec<u32> =
            if rgo { Vec::new() } else { s.namespaces.values().filter(|n| n.anagrpid == g).map(|n| n.nsid).collect() };
        let state = listener.map(|l| l.ana_state(g).code()).unwrap_or(log::ana_state::INACCESSIBLE);
        let d = AnaGroupDescriptor { grpid: g, nnsids: nsids.len() as u32, chgcnt, state };
        let mut b = [0u8; AnaGroupDescriptor::SIZE];
        d.encode(&mut b);
        out.extend_from_slice(&b);
        for n in nsids {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    out
}

fn get_log_page(c: &Rc<Conn>, slot: u16, ctrl: &Arc<Ctrlr>, sqe: &crate::spec::sqe::Sqe) {
    let lid_v = sqe.cdw10 as u8;
    let lsp = ((sqe.cdw10 >> 8) & 0x7f) as u8;
    let rae = sqe.cdw10 & (1 << 15) != 0;
    let numd = (u64::from(sqe.cdw11 & 0xffff) << 16 | u64::from(sqe.cdw10 >> 16)) + 1;
    let offset = u64::from(sqe.cdw12) | u64::from(sqe.cdw13) << 32;
    let len = (numd * 4) as usize;
    let cmd_len = c.cmds.borrow()[usize::from(slot)].len as usize;
    if len > cmd_len || offset & 3 != 0 {
        return c.complete(slot, invalid_field(), 0, None);
    }
    let page: Vec<u8> = {
        let mut t = tables();
        let discovery = ctrl.discovery;
        match lid_v {
            lid::DISCOVERY if discovery => {
                let (h, entries) = discovery_log(&t, ctrl);
                let mut out = vec![0u8; DiscoveryLogHeader::SIZE + entries.len() * DiscoveryLogEntry::SIZE];
                let mut hb = [0u8; DiscoveryLogHeader::SIZE];
                h.encode(&mut hb);
                out[..DiscoveryLogHeader::SIZE].copy_from_slice(&hb);
                for (i, e) in entries.iter().enumerate() {
                    let mut eb = [0u8; DiscoveryLogEntry::SIZE];
                    e.encode(&mut eb);
                    let at = DiscoveryLogHeader::SIZE + i * DiscoveryLogEntry::SIZE;
                    out[at..at + DiscoveryLogEntry::SIZE].copy_from_slice(&eb);
                }
                out
            }
            lid::ERROR => vec![0u8; 64],
            lid::HEALTH_INFORMATION if !discovery => {
                let mut b = [0u8; SmartLog::SIZE];
                smart_log(ctrl).encode(&mut b);
                b.to_vec()
            }
            lid::FIRMWARE_SLOT if !discovery => {
                let mut f = log::FirmwareSlotLog { afi: log::FirmwareSlotLog::afi(1, 0), frs: [[0; 8]; 7] };
                f.frs[0] = ic::ascii_field(env!("CARGO_PKG_VERSION"));
                let mut b = [0u8; log::FirmwareSlotLog::SIZE];
                f.encode(&mut b);
                b.to_vec()
            }
            lid::CHANGED_NS_LIST if !discovery => {
                let mut r = ctrl.regs.lock().unwrap();
                let mut b = [0u8; log::ChangedNamespaceList::SIZE];
                r.changed_ns.encode(&mut b);
                if !rae {
                    r.changed_ns = Default::default();
                }
                b.to_vec()
            }
            lid::COMMAND_EFFECTS if !discovery => {
                let mut b = [0u8; CommandEffectsLog::SIZE];
                effects_log(!c.opts.reservations_masked()).encode(&mut b);
                b.to_vec()
            }
            lid::SUPPORTED_LOG_PAGES => {
                let mut p = SupportedLogPages { lids: [0; 256] };
                let lids: &[u8] = if discovery {
                    &[lid::SUPPORTED_LOG_PAGES, lid::ERROR, lid::DISCOVERY]
                } else {
                    &[
                        lid::SUPPORTED_LOG_PAGES,
                        lid::ERROR,
                        lid::HEALTH_INFORMATION,
                        lid::FIRMWARE_SLOT,
                        lid::CHANGED_NS_LIST,
                        lid::COMMAND_EFFECTS,
                        lid::ANA,
                        lid::RESERVATION_NOTIFICATION,
                    ]
                };
                for &l in lids {
                    p.lids[usize::from(l)] = SupportedLogPages::LSUPP;
                }
                let mut b = [0u8; SupportedLogPages::SIZE];
                p.encode(&mut b);
                b.to_vec()
            }
            lid::RESERVATION_NOTIFICATION if !discovery => {
                drop(t);
                ctrl.resv_log.lock().unwrap().take(offset, offset + len as u64)
            }
            lid::ANA if !discovery => match t.subsystems.get_mut(&ctrl.subnqn) {
                Some(s) if s.ana_reporting => ana_log(s, ctrl, lsp & log::ANA_LSP_RGO != 0),
                _ => {
                    drop(t);
                    return c.complete(
                        slot,
                        Status::command_specific(command_specific::INVALID_LOG_PAGE).with_dnr(),
                        0,
                        None,
                    );
                }
            },
            _ => {
                drop(t);
                return c.complete(
                    slot,
                    Status::command_specific(command_specific::INVALID_LOG_PAGE).with_dnr(),
                    0,
                    None,
                );
            }
        }
    };
    if !rae {
        ctrl.log_read(lid_v);
    }
    // Past the end of the page the host reads zeroes: nvme-cli reads the ANA log in 4 KiB
    // pieces up to the size Identify allows for (NANAGRPID and MNAN), far past the log itself.
    let mut out = vec![0u8; len];
    if offset < page.len() as u64 {
        let from = &page[offset as usize..];
        let k = from.len().min(len);
        out[..k].copy_from_slice(&from[..k]);
    }
    reply_data(c, slot, &out);
}

fn get_features(c: &Rc<Conn>, slot: u16, ctrl: &Ctrlr, sqe: &crate::spec::sqe::Sqe) {
    let f = sqe.cdw10 as u8;
    let sel = ((sqe.cdw10 >> 8) & 7) as u8;
    if sel == crate::spec::admin::select::SUPPORTED_CAPABILITIES {
        // Every feature Ferrite has is changeable and not saveable.
        return c.complete(slot, Status::SUCCESS, 1 << 2, None);
    }
    let default_only = sel == crate::spec::admin::select::DEFAULT;
    let r = ctrl.regs.lock().unwrap();
    let stored = |id: u8| if default_only { None } else { r.features.get(&id).copied() };
    let v = match f {
        fid::ARBITRATION => stored(f).unwrap_or(crate::spec::features::Arbitration::BURST_UNLIMITED as u32),
        fid::POWER_MANAGEMENT => stored(f).unwrap_or(0),
        fid::TEMPERATURE_THRESHOLD => stored(f).unwrap_or(273 + 70),
        fid::VOLATILE_WRITE_CACHE => stored(f).unwrap_or(1),
        fid::NUMBER_OF_QUEUES => {
            let n = u32::from(c.opts.max_qpairs_per_ctrlr.saturating_sub(2));
            n | n << 16
        }
        fid::INTERRUPT_COALESCING => stored(f).unwrap_or(0),
        fid::ASYNC_EVENT_CONFIGURATION => {
            if default_only {
                0
            } else {
                r.aec
            }
        }
        fid::KEEP_ALIVE_TIMER => {
            if default_only {
                0
            } else {
                r.kato_ms
            }
        }
        fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE => {
            drop(r);
            let v = if f == fid::RESERVATION_NOTIFICATION_MASK {
                super::resv::get_mask(ctrl, sqe.nsid)
            } else {
                super::resv::get_persistence(ctrl, sqe.nsid)
            };
            return match v {
                Ok(v) => c.complete(slot, Status::SUCCESS, v, None),
                Err(st) => c.complete(slot, st, 0, None),
            };
        }
        fid::HOST_IDENTIFIER => {
            drop(r);
            let cdw11 = sqe.cdw11;
            if cdw11 & 1 == 0 {
                // Ferrite's hosts give the 128-bit identifier in Connect.
                return c.complete(slot, invalid_field(), 0, None);
            }
            return reply_data(c, slot, &ctrl.hostid);
        }
        _ => {
            drop(r);
            return c.complete(slot, invalid_field(), 0, None);
        }
    };
    drop(r);
    c.complete(slot, Status::SUCCESS, v, None)
}

fn set_features(c: &Rc<Conn>, slot: u16, ctrl: &Ctrlr, sqe: &crate::spec::sqe::Sqe) {
    let f = sqe.cdw10 as u8;
    let save = sqe.cdw10 & (1 << 31) != 0;
    if save {
        return c.complete(
            slot,
            Status::command_specific(command_specific::FEATURE_ID_NOT_SAVEABLE).with_dnr(),
            0,
            None,
        );
    }
    let v = sqe.cdw11;
    let mut r = ctrl.regs.lock().unwrap();
    let dw0 = match f {
        fid::ARBITRATION | fid::POWER_MANAGEMENT | fid::INTERRUPT_COALESCING | fid::TEMPERATURE_THRESHOLD => {
            r.features.insert(f, v);
            0
        }
        fid::VOLATILE_WRITE_CACHE => {
            r.features.insert(f, v & 1);
            0
        }
        fid::NUMBER_OF_QUEUES => {
            if v & 0xffff == 0xffff || v >> 16 == 0xffff {
                drop(r);
                return c.complete(slot, invalid_field(), 0, None);
            }
            // Granted: what the transport allows (0's based, admin queue not counted).
            let n = u32::from(c.opts.max_qpairs_per_ctrlr.saturating_sub(2));
            r.io_queues = (n + 1) as u16;
            n | n << 16
        }
        fid::ASYNC_EVENT_CONFIGURATION => {
            r.aec = v;
            0
        }
        fid::KEEP_ALIVE_TIMER => {
            // Rounded up to the granularity Ferrite checks at (1 s, KAS is 100 ms).
            r.kato_ms = v;
            0
        }
        fid::HOST_IDENTIFIER => {
            drop(r);
            // Over fabrics the Host Identifier is Connect's; NVMe-oF and SPDK refuse a Set so.
            return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
        }
        fid::RESERVATION_NOTIFICATION_MASK | fid::RESERVATION_PERSISTENCE => {
            drop(r);
            let done = if f == fid::RESERVATION_NOTIFICATION_MASK {
                super::resv::set_mask(ctrl, sqe.nsid, v)
            } else {
                super::resv::set_persistence(ctrl, sqe.nsid, v)
            };
            return c.complete(slot, done.err().unwrap_or(Status::SUCCESS), 0, None);
        }
        _ => {
            drop(r);
            return c.complete(slot, invalid_field(), 0, None);
        }
    };
    drop(r);
    c.complete(slot, Status::SUCCESS, dw0, None)
}

/// Raises Namespace Attribute Changed for `nsid` on every controller of subsystem `s`.
pub(crate) fn notify_ns_changed(s: &Subsystem, nsid: u32) {
    for ctrl in s.ctrlrs.values() {
        ctrl.regs.lock().unwrap().changed_ns.push(nsid);
        ctrl.raise(AsyncEvent::NS_ATTR_CHANGED, aec::NS_ATTR);
    }
}

/// Raises ANA Change on every controller of subsystem `s`.
pub(crate) fn notify_ana_changed(s: &Subsystem) {
    if !s.ana_reporting {
        return;
    }
    for ctrl in s.ctrlrs.values() {
        ctrl.raise(AsyncEvent::ANA_CHANGE, aec::ANA_CHANGE);
    }
}

/// Raises Discovery Log Change on every discovery controller (the log changed).
pub(crate) fn notify_discovery_changed(t: &mut Tables) {
    t.genctr += 1;
    if let Some(d) = t.subsystems.get(crate::spec::nqn::DISCOVERY_NQN) {
        for ctrl in d.ctrlrs.values() {
            ctrl.raise(AsyncEvent::DISCOVERY_LOG_CHANGE, aec::DISCOVERY_LOG_CHANGE);
        }
    }
}
