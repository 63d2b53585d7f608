//! Running commands: a capsule's checks (queue state, SGL, data length), where its data comes
//! from, and the Fabrics commands (Connect, Property Get/Set, Disconnect). Admin and I/O
//! commands go on to `admin` and `io`.

use super::ctrlr::Ctrlr;
use super::model::tables;
use super::qpair::{set_phase, Bound, Conn, Phase, Xfer, MAX_ADMIN_DATA};
use crate::spec::fabrics::{self, cattr, ConnectCommand, ConnectData, FabricsCommand, InvalidParameter};
use crate::spec::opcode::{self, DataTransfer};
use crate::spec::registers::{self, Cap, Cc, Csts, Vs};
use crate::spec::sgl::{sgl_subtype, sgl_type, SglDescriptor, SglFields};
use crate::spec::sqe::{Fuse, Sqe};
use crate::spec::status::{fabrics as fsc, generic, Status};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// PSDT of every command over fabrics: 01b, SGLs with a contiguous metadata buffer.
const PSDT_SGL: u8 = 0b01;

/// Where a capsule's data goes, for the reader (None: nothing to receive now).
pub(crate) type DataDest = Option<super::qpair::DestCmd>;

fn xfer_of(raw: &[u8; 64]) -> Xfer {
    let opc = raw[Sqe::OFFSET_OPCODE];
    let dir =
        if opc == opcode::FABRICS { DataTransfer::of(raw[fabrics::OFFSET_FCTYPE]) } else { DataTransfer::of(opc) };
    match dir {
        DataTransfer::None => Xfer::None,
        DataTransfer::HostToController => Xfer::ToCtrl,
        DataTransfer::ControllerToHost => Xfer::ToHost,
        // No command Ferrite runs moves data both ways; it fails as an invalid opcode.
        DataTransfer::Bidirectional => Xfer::None,
    }
}

/// A command capsule arrived with `icd` bytes of in-capsule data after it.
pub(crate) fn capsule(c: &Rc<Conn>, raw: &[u8; 64], icd: u32) -> Result<DataDest, String> {
    // Fields are read from the bytes as needed (the slot keeps the decoded entry): building
    // the entry's enums and copying them about stalled loads on every command.
    let opc = raw[Sqe::OFFSET_OPCODE];
    let fuse = Fuse::from_bits(raw[Sqe::OFFSET_FLAGS]);
    let xfer = xfer_of(raw);
    let admin = c.qid().is_none_or(|q| q == 0);
    // Over fabrics the data pointer is always SGL1 (PSDT must say so: checked below).
    let sgl1: &[u8; SglDescriptor::SIZE] =
        raw[Sqe::OFFSET_DPTR..Sqe::OFFSET_DPTR + SglDescriptor::SIZE].try_into().expect("16 bytes");
    let sgl = SglFields::read(sgl1);
    // The data length the command says, and whether the capsule carries it.
    let (len, in_capsule, sgl_ok) = match xfer {
        Xfer::None => (0, false, icd == 0),
        _ if sgl.sgl_type == sgl_type::DATA_BLOCK && sgl.subtype == sgl_subtype::OFFSET => {
            (sgl.length, true, sgl.address == 0 && sgl.length == icd && xfer == Xfer::ToCtrl)
        }
        _ if sgl.sgl_type == sgl_type::TRANSPORT_DATA_BLOCK => (sgl.length, false, icd == 0),
        _ => (0, false, false),
    };
    let limit = if admin { MAX_ADMIN_DATA.max(c.opts.max_io_size) } else { c.opts.max_io_size };
    let slot = c.new_cmd(raw, if sgl_ok { xfer } else { Xfer::None }, if sgl_ok { len } else { 0 });
    let Some(slot) = slot else {
        // The host broke SQ flow control: a transport error, reported before the close.
        c.pending_term.set(Some(crate::tcp::PduError::QueueFull { entries: c.sq_entries.get() }));
        return Err(format!("the host sent more commands than its queue holds ({}); closing", c.sq_entries.get()));
    };
    let fail = |status: Status| -> Result<DataDest, String> {
        c.complete(slot, status, 0, None);
        // Any in-capsule data is read and dropped.
        Ok(None)
    };
    if raw[Sqe::OFFSET_FLAGS] >> 6 != PSDT_SGL {
        // NVMe over Fabrics: PSDT is 01b (SGLs, MPTR a contiguous buffer) in every command,
        // Fabrics commands included; Linux's nvmet refuses anything else the same way, and
        // Linux's, SPDK's and Ferrite's hosts all send 01b. SPDK's target does not look.
        let cid = c.cmds.borrow()[usize::from(slot)].sqe.cid;
        ferrite_reactor::log_limited!(
            log::Level::Info,
            "nvmf connection {}: command {opc:#04x} cid {cid} with PSDT {:02b}, not 01b (SGL)",
            c.id,
            raw[Sqe::OFFSET_FLAGS] >> 6
        );
        return fail(Status::generic(generic::INVALID_FIELD).with_dnr());
    }
    if !sgl_ok {
        let cid = c.cmds.borrow()[usize::from(slot)].sqe.cid;
        let sgl = SglDescriptor::decode(sgl1);
        log::info!("nvmf connection {}: command {opc:#04x} cid {cid}: bad SGL {sgl:?}", c.id);
        return fail(Status::generic(generic::SGL_DESCRIPTOR_TYPE_INVALID).with_dnr());
    }
    if len > limit {
        return fail(Status::generic(generic::DATA_SGL_LENGTH_INVALID).with_dnr());
    }
    if c.bound.borrow().is_none() {
        let connect = opc == opcode::FABRICS && raw[fabrics::OFFSET_FCTYPE] == fabrics::fctype::CONNECT;
        if !connect {
            log::info!("nvmf connection {}: command {opc:#04x} before Connect", c.id);
            return fail(Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr());
        }
    }
    if fuse == Fuse::Reserved || (admin && fuse != Fuse::Normal) {
        return fail(Status::generic(generic::INVALID_FIELD).with_dnr());
    }
    if !admin {
        c.pair_fused(slot, fuse);
    }
    if xfer == Xfer::ToCtrl && len > 0 {
        if !in_capsule {
            // Data by R2T: a buffer first, within the connection's budget (it may wait).
            c.wait_for_buffer(slot);
            return Ok(None);
        }
        // In-capsule data is bounded by the in-capsule size and the queue's depth.
        let buf = ferrite_reactor::alloc_buf(len as usize);
        {
            let mut cmds = c.cmds.borrow_mut();
            let cmd = &mut cmds[usize::from(slot)];
            cmd.buf = Some(buf);
            set_phase(cmd, Phase::Receiving, c.id, slot);
        }
        return Ok(Some(super::qpair::DestCmd { slot }));
    }
    run(c, slot);
    Ok(None)
}

/// The data of the command in `slot` is all in.
pub(crate) fn data_ready(c: &Rc<Conn>, slot: u16) {
    c.release_budget(slot);
    let digest_error = {
        let mut cmds = c.cmds.borrow_mut();
        let cmd = &mut cmds[usize::from(slot)];
        set_phase(cmd, Phase::Running, c.id, slot);
        cmd.digest_error
    };
    if digest_error {
        c.complete(slot, Status::generic(generic::TRANSIENT_TRANSPORT_ERROR), 0, None);
        return;
    }
    run(c, slot);
}

/// Runs the command in `slot` (its data, if any, is in).
fn run(c: &Rc<Conn>, slot: u16) {
    let opc = c.cmds.borrow()[usize::from(slot)].sqe.opcode;
    if opc == opcode::FABRICS {
        let raw = c.cmds.borrow()[usize::from(slot)].raw;
        return fabrics_cmd(c, slot, &raw);
    }
    match c.qid() {
        Some(0) => super::admin::run(c, slot),
        Some(_) => super::io::run(c, slot),
        None => c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None),
    }
}

fn fabrics_cmd(c: &Rc<Conn>, slot: u16, raw: &[u8; 64]) {
    match FabricsCommand::decode(raw) {
        Some(FabricsCommand::Connect(cmd)) => connect(c, slot, &cmd),
        Some(FabricsCommand::PropertyGet(p)) => {
            let Some(ctrl) = c.ctrl().filter(|_| c.qid() == Some(0)) else {
                return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
            };
            match property_get(c, &ctrl, p.ofst, p.size) {
                Some(v) => {
                    let mut cqe = crate::spec::cqe::Cqe::new(0, Status::SUCCESS);
                    cqe.set_result_u64(v);
                    complete_dw01(c, slot, cqe.dw0, cqe.dw1)
                }
                None => c.complete(slot, Status::generic(generic::INVALID_FIELD).with_dnr(), 0, None),
            }
        }
        Some(FabricsCommand::PropertySet(p)) => {
            let Some(ctrl) = c.ctrl().filter(|_| c.qid() == Some(0)) else {
                return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
            };
            let st = property_set(&ctrl, p.ofst, p.size, p.value);
            c.complete(slot, st, 0, None)
        }
        Some(FabricsCommand::Disconnect(_)) if c.qid() == Some(0) => {
            // Disconnect deletes I/O queues; the admin queue goes with its controller.
            c.complete(slot, Status::command_specific(fsc::INVALID_QUEUE_TYPE).with_dnr(), 0, None)
        }
        Some(FabricsCommand::Disconnect(_)) => {
            c.complete(slot, Status::SUCCESS, 0, None);
            c.stop_taking();
        }
        _ => c.complete(slot, Status::generic(generic::INVALID_OPCODE).with_dnr(), 0, None),
    }
}

/// Completes with a 64-bit result (Property Get of CAP).
fn complete_dw01(c: &Rc<Conn>, slot: u16, dw0: u32, dw1: u32) {
    // The response capsule carries DW1 too; only Property Get uses it.
    c.complete_with_dw1(slot, dw0, dw1);
}

fn cap(c: &Conn) -> Cap {
    Cap {
        mqes: c.opts.max_queue_depth.saturating_sub(1),
        cqr: true,
        to: 15,
        css: registers::cap_css::NVM,
        ..Cap::default()
    }
}

fn property_get(c: &Conn, ctrl: &Ctrlr, ofst: u32, size: u8) -> Option<u64> {
    if registers::property_size(ofst)? != fabrics::property_size_bytes(size)? {
        return None;
    }
    let r = ctrl.regs.lock().unwrap();
    Some(match ofst {
        registers::offset::CAP => cap(c).to_u64(),
        registers::offset::VS => u64::from(Vs::V1_3.to_u32()),
        registers::offset::CC => u64::from(r.cc),
        registers::offset::CSTS => u64::from(r.csts),
        _ => 0,
    })
}

fn property_set(ctrl: &Arc<Ctrlr>, ofst: u32, size: u8, value: u64) -> Status {
    let invalid = Status::generic(generic::INVALID_FIELD).with_dnr();
    if registers::property_size(ofst).is_none() || registers::property_size(ofst) != fabrics::property_size_bytes(size)
    {
        return invalid;
    }
    if ofst != registers::offset::CC {
        // Every other writable property is PCIe-only (NSSR is not supported over fabrics here).
        return invalid;
    }
    let mut r = ctrl.regs.lock().unwrap();
    let old = Cc::from_u32(r.cc);
    let new = Cc::from_u32(value as u32);
    let mut csts = Csts::from_u32(r.csts);
    let disable = !new.en && old.en;
    let shutdown = new.shn != 0 && old.shn == 0;
    if new.en && !old.en {
        // IOSQES/IOCQES other than 64/16 bytes make I/O Connects fail (as in SPDK).
        csts.rdy = true;
    }
    if shutdown {
        csts.shst = registers::shst::OCCURRING;
    } else if new.shn == 0 && csts.shst == registers::shst::COMPLETE && new.en {
        csts.shst = registers::shst::NORMAL;
    }
    r.cc = new.to_u32();
    r.csts = csts.to_u32();
    drop(r);
    if disable || shutdown {
        // RDY clears (SHST reads complete) once the I/O queues are gone.
        delete_io_queues(ctrl, disable, shutdown);
    }
    Status::SUCCESS
}

/// How long a reset or shutdown waits for the I/O queues' connections to close.
const DELETE_IO_QUEUES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A reset (CC.EN 1 -> 0) or a shutdown (CC.SHN) deletes every I/O queue of the controller,
/// as NVMe says and SPDK does: their connections close, on whatever reactor owns them (a new
/// I/O Connect is refused meanwhile: CC.EN is 0, or was for the shutdown's host). Once none is
/// left, CSTS.RDY clears (reset) and CSTS.SHST reads complete (shutdown); a host that reads
/// them then finds no I/O queue answering, and QIDs free for its next Connects.
fn delete_io_queues(ctrl: &Arc<Ctrlr>, disable: bool, shutdown: bool) {
    let ctrl = ctrl.clone();
    let Some(engine) = ferrite_reactor::current_engine() else {
        // No engine to reach the queues through (not on a reactor): nothing else runs.
        return io_queues_deleted(&ctrl, disable, shutdown);
    };
    ferrite_reactor::spawn_local(async move {
        let target = ctrl.clone();
        let _ = engine
            .on_all(move |_| {
                super::qpair::close_local(&|c: &super::qpair::Conn| {
                    c.bound.borrow().as_ref().is_some_and(|b| b.qid != 0 && Arc::ptr_eq(&b.ctrl, &target))
                })
            })
            .await;
        // Each connection leaves the queue table when its tasks end.
        let deadline = std::time::Instant::now() + DELETE_IO_QUEUES_TIMEOUT;
        let mut poll = std::time::Duration::from_millis(1);
        while !ctrl.qids.lock().unwrap().is_empty() && !ctrl.is_dead() {
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "nvmf controller {} of {}: I/O queues still open {DELETE_IO_QUEUES_TIMEOUT:?} after a {}",
                    ctrl.cntlid,
                    ctrl.subnqn,
                    if shutdown { "shutdown" } else { "reset" }
                );
                break;
            }
            ferrite_reactor::sleep(poll).await;
            poll = (poll * 2).min(std::time::Duration::from_millis(16));
        }
        io_queues_deleted(&ctrl, disable, shutdown);
    })
    .detach();
}

/// The I/O queues of a reset or shut down controller are gone: CSTS says so.
fn io_queues_deleted(ctrl: &Ctrlr, disable: bool, shutdown: bool) {
    let mut r = ctrl.regs.lock().unwrap();
    let cc = Cc::from_u32(r.cc);
    let mut csts = Csts::from_u32(r.csts);
    // A host that enabled the controller again meanwhile keeps it ready.
    if disable && !cc.en {
        csts.rdy = false;
        csts.shst = registers::shst::NORMAL;
    }
    if shutdown && cc.shn != 0 {
        csts.shst = registers::shst::COMPLETE;
    }
    r.csts = csts.to_u32();
    drop(r);
    log::info!(
        "nvmf controller {} of {}: {}; its I/O queues are deleted",
        ctrl.cntlid,
        ctrl.subnqn,
        if shutdown { "shut down" } else { "reset" }
    );
}

fn connect_error(c: &Rc<Conn>, slot: u16, p: InvalidParameter) {
    let cqe = p.to_cqe(0);
    c.complete(slot, cqe.status, cqe.dw0, None);
}

fn connect(c: &Rc<Conn>, slot: u16, cmd: &ConnectCommand) {
    if c.bound.borrow().is_some() {
        return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
    }
    let data = {
        let cmds = c.cmds.borrow();
        cmds[usize::from(slot)].buf.as_ref().filter(|b| b.len() == ConnectData::SIZE).map(|b| {
            let mut a = [0u8; ConnectData::SIZE];
            a.copy_from_slice(b);
            ConnectData::decode(&a)
        })
    };
    let Some(data) = data else {
        return c.complete(slot, Status::generic(generic::DATA_SGL_LENGTH_INVALID).with_dnr(), 0, None);
    };
    if cmd.recfmt != 0 {
        return c.complete(slot, Status::command_specific(fsc::INCOMPATIBLE_FORMAT).with_dnr(), 0, None);
    }
    let (subnqn, hostnqn) = match data.names() {
        Ok(n) => n,
        Err((p, e)) => {
            log::info!("nvmf connection {}: Connect with a bad NQN: {e}", c.id);
            return connect_error(c, slot, p);
        }
    };
    let (subnqn, hostnqn) = (subnqn.to_string(), hostnqn.to_string());
    let qid = cmd.qid;
    let entries = u32::from(cmd.sqsize) + 1;
    let max = if qid == 0 { c.opts.max_aq_depth } else { c.opts.max_queue_depth };
    if cmd.sqsize == 0 || entries > u32::from(max) {
        log::info!("nvmf connection {}: Connect qid {qid} with SQSIZE {} (most {max} entries)", c.id, cmd.sqsize);
        return connect_error(c, slot, InvalidParameter::in_command(ConnectCommand::OFFSET_SQSIZE as u16));
    }
    let kato = cmd.kato;
    let mut t = tables();
    let Some(sub) = t.subsystems.get_mut(&subnqn) else {
        log::info!("nvmf connection {}: Connect to unknown subsystem {subnqn}", c.id);
        return connect_error(c, slot, InvalidParameter::in_data(ConnectData::OFFSET_SUBNQN as u16));
    };
    if !sub.discovery && !sub.listens_on(&c.trid) {
        log::info!("nvmf connection {}: subsystem {subnqn} does not listen on {}", c.id, c.trid.socket_addr());
        return connect_error(c, slot, InvalidParameter::in_data(ConnectData::OFFSET_SUBNQN as u16));
    }
    if !sub.host_allowed(&hostnqn) {
        log::warn!("nvmf connection {}: host {hostnqn} may not connect to {subnqn}", c.id);
        drop(t);
        return c.complete(slot, Status::command_specific(fsc::CONNECT_INVALID_HOST).with_dnr(), 0, None);
    }
    let ctrl = if qid == 0 {
        if data.cntlid != fabrics::CNTLID_DYNAMIC {
            drop(t);
            return connect_error(c, slot, InvalidParameter::in_data(ConnectData::OFFSET_CNTLID as u16));
        }
        let Some(cntlid) = sub.take_cntlid() else {
            drop(t);
            return c.complete(slot, Status::command_specific(fsc::CONTROLLER_BUSY), 0, None);
        };
        let ctrl = Arc::new(Ctrlr::new(
            cntlid,
            &subnqn,
            &hostnqn,
            data.hostid,
            sub.discovery,
            c.trid.clone(),
            sub.shared.clone(),
            c.reactor,
            c.id,
            // A discovery controller without keep-alive is fine (nvme discover connects briefly).
            kato,
            cmd.cattr & cattr::DISABLE_SQ_FLOW_CONTROL != 0,
        ));
        sub.ctrlrs.insert(cntlid, ctrl.clone());
        log::info!(
            "nvmf connection {}: controller {cntlid} of {subnqn} for host {hostnqn} (keep-alive {kato} ms{})",
            c.id,
            if ctrl.sqflow_disabled { ", SQ flow control off" } else { "" }
        );
        ctrl
    } else {
        let Some(ctrl) = sub.ctrlrs.get(&data.cntlid).cloned() else {
            drop(t);
            log::info!("nvmf connection {}: I/O Connect to unknown controller {}", c.id, data.cntlid);
            return connect_error(c, slot, InvalidParameter::in_data(ConnectData::OFFSET_CNTLID as u16));
        };
        drop(t);
        if ctrl.hostnqn != hostnqn || ctrl.is_dead() {
            return connect_error(c, slot, InvalidParameter::in_data(ConnectData::OFFSET_HOSTNQN as u16));
        }
        let cc = Cc::from_u32(ctrl.regs.lock().unwrap().cc);
        if !cc.en {
            return c.complete(slot, Status::generic(generic::COMMAND_SEQUENCE_ERROR).with_dnr(), 0, None);
        }
        if cc.iosqes != 6 || cc.iocqes != 4 {
            // Only 64-byte SQEs and 16-byte CQEs exist over fabrics (SPDK refuses the same).
            log::info!("nvmf connection {}: I/O Connect with CC.IOSQES {} IOCQES {}", c.id, cc.iosqes, cc.iocqes);
            return connect_error(c, slot, InvalidParameter::in_command(ConnectCommand::OFFSET_QID as u16));
        }
        if qid >= c.opts.max_qpairs_per_ctrlr || ctrl.discovery {
            return c.complete(
                slot,
                Status::command_specific(crate::spec::status::command_specific::INVALID_QUEUE_IDENTIFIER).with_dnr(),
                0,
                None,
            );
        }
        let at = super::ctrlr::QpairAt { reactor: c.reactor, conn: c.id };
        let taken = match ctrl.qids.lock().unwrap().entry(qid) {
            std::collections::btree_map::Entry::Occupied(_) => true,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(at);
                false
            }
        };
        if taken {
            log::info!("nvmf connection {}: controller {} already has queue {qid}", c.id, ctrl.cntlid);
            return c.complete(
                slot,
                Status::command_specific(crate::spec::status::command_specific::INVALID_QUEUE_IDENTIFIER).with_dnr(),
                0,
                None,
            );
        }
        ctrl.io_qpairs.fetch_add(1, Ordering::Relaxed);
        ctrl
    };
    let cntlid = ctrl.cntlid;
    let stats = ctrl.new_stats();
    c.who.set(Some(ctrl.initiator_ref.id()));
    *c.bound.borrow_mut() = Some(Bound { ctrl, qid, stats });
    c.handshake_done();
    c.sq_entries.set(entries as u16);
    c.c2h_success.set(c.opts.c2h_success && cmd.cattr & cattr::DISABLE_SQ_FLOW_CONTROL != 0);
    c.set_icd_limit(if qid == 0 { crate::tcp::pdu::ADMIN_MAX_ICD } else { c.opts.in_capsule_data_size });
    let ok = fabrics::ConnectSuccess { cntlid, atr: false, ascr: false };
    c.complete(slot, Status::SUCCESS, ok.to_dw0(), None);
}

/// A connection ended: an admin queue takes its controller with it; an I/O queue leaves it.
pub(crate) fn disconnected(c: &Conn) {
    let Some(b) = c.bound.borrow_mut().take() else { return };
    if b.qid == 0 {
        destroy_ctrlr(&b.ctrl);
    } else {
        b.ctrl.qids.lock().unwrap().remove(&b.qid);
        b.ctrl.io_qpairs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends a controller: removed from its subsystem; its queue pairs close (each reactor's
/// watchdog sees it dead within a second; those on this reactor close now).
pub(crate) fn destroy_ctrlr(ctrl: &Arc<Ctrlr>) {
    if ctrl.dead.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut t = tables();
    if let Some(s) = t.subsystems.get_mut(&ctrl.subnqn) {
        if s.ctrlrs.get(&ctrl.cntlid).is_some_and(|x| Arc::ptr_eq(x, ctrl)) {
            s.ctrlrs.remove(&ctrl.cntlid);
        }
    }
    drop(t);
    log::info!("nvmf controller {} of {} (host {}) destroyed", ctrl.cntlid, ctrl.subnqn, ctrl.hostnqn);
    let id = ctrl.cntlid;
    let nqn = ctrl.subnqn.clone();
    super::qpair::close_local(&|c: &Conn| {
        c.bound.borrow().as_ref().is_some_and(|b| b.ctrl.cntlid == id && b.ctrl.subnqn == nqn && b.qid != 0)
    });
}
