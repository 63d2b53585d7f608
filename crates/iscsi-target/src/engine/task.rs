//! SCSI commands in their slots: from the SCSI Command PDU (CmdSN window, immediate data and
//! burst rules, the CDB with its extension, the LUN) to the SCSI layer once the data-out it
//! asks for is in, and back (the session's `TaskDone`, then [`super::datain`]).
//!
//! A command's phase (changed only through `ferrite_target::transition`):
//!
//! | phase | meaning |
//! |---|---|
//! | Free | the slot is free |
//! | Waiting | it needs data-out and waits for a buffer (and an R2T slot) before its R2T |
//! | Receiving | its data-out comes (immediate, unsolicited, or solicited by R2Ts) into its buffer |
//! | Running | with the SCSI layer |
//!
//! Free → Waiting | Receiving | Running; Waiting → Receiving | Free; Receiving → Running |
//! Free; Running → Free.

use super::conn::Conn;
use super::reader::{DataKind, Dest};
use super::seq::CmdSnVerdict;
use super::IMMEDIATE_SLOTS;
use ferrite_bdev::IoBufs;
use ferrite_iscsi::negotiate::SessionType;
use ferrite_iscsi::pdu::{Header, RejectReason, ScsiCommand, TaskAttr, BHS_LEN};
use ferrite_scsi::{Response, Task};
use smallvec::SmallVec;
use std::rc::Rc;

/// Where a command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The slot is free.
    Free,
    /// Waiting for a buffer for its data-out, before its R2T.
    Waiting,
    /// Receiving its data-out.
    Receiving,
    /// With the SCSI layer.
    Running,
}

impl ferrite_target::Phase for Phase {
    fn may_become(self, to: Phase) -> bool {
        use Phase::*;
        matches!(
            (self, to),
            (Free, Waiting | Receiving | Running)
                | (Waiting, Receiving | Free)
                | (Receiving, Running | Free)
                | (Running, Free)
        )
    }
}

/// A command in its slot.
pub(crate) struct Cmd {
    pub(crate) phase: Phase,
    /// Moves each time the slot is taken: an R2T's TTT names the slot and this, so that a
    /// Data-Out for an earlier command of the slot is not taken for the current one.
    pub(crate) gen: u16,
    pub(crate) itt: u32,
    /// The LUN field as received (R2Ts carry it back).
    pub(crate) lun_field: u64,
    /// The LUN number (u64::MAX for an address the SCSI layer does not know).
    pub(crate) lun: u64,
    pub(crate) cmd_sn: u32,
    pub(crate) immediate: bool,
    /// Expected Data Transfer Length.
    pub(crate) edtl: u32,
    pub(crate) cdb: ferrite_scsi::Cdb,
    pub(crate) attr: ferrite_scsi::TaskAttr,
    /// Data-out bytes the SCSI layer takes (the rest of what comes is dropped).
    pub(crate) need: u32,
    /// Their buffers, in offset order: the first burst's (`first` bytes: immediate data and
    /// unsolicited Data-Out, taken when the command came), then the rest's (taken under the
    /// budget before its R2Ts).
    pub(crate) bufs: IoBufs,
    /// Bytes of the first buffer when it holds the first burst (else 0).
    pub(crate) first: u32,
    /// Data-out bytes received so far: the offset the next Data-Out must start at.
    pub(crate) recv: u32,
    /// Bytes solicited so far: where the next R2T starts.
    pub(crate) solicit: u32,
    /// The end offsets of the sequences outstanding, oldest first: the unsolicited one (when
    /// `unsolicited`), then the R2Ts'.
    pub(crate) r2t_ends: SmallVec<[u32; 4]>,
    /// Its unsolicited Data-Out sequence (TTT 0xffffffff, InitialR2T=No) is outstanding, as
    /// `r2t_ends[0]`.
    pub(crate) unsolicited: bool,
    /// The DataSN the next Data-Out of the current sequence must carry.
    pub(crate) data_sn: u32,
    /// R2TSN and Data-In DataSN: PDUs of the command sent so far (ExpDataSN).
    pub(crate) sn: u32,
    /// Tick it began to wait on the initiator or for a buffer (0: it does not).
    pub(crate) since: u64,
    /// A data digest error was seen on its data-out: it ends with CHECK CONDITION.
    pub(crate) crc_error: bool,
    /// A Data-Out of it broke its sequence and was rejected: the rest of its data is dropped
    /// and it ends without an answer (the initiator took the Reject as its end).
    pub(crate) failed: bool,
    /// Bytes of its buffers counted against the connection's R2T budget.
    pub(crate) budget: u32,
    /// It counts among the connection's commands soliciting data.
    pub(crate) soliciting: bool,
    /// It waits in the connection's queue for its buffer.
    pub(crate) queued: bool,
}

impl Cmd {
    fn free() -> Cmd {
        Cmd {
            phase: Phase::Free,
            gen: 0,
            itt: 0,
            lun_field: 0,
            lun: 0,
            cmd_sn: 0,
            immediate: false,
            edtl: 0,
            cdb: ferrite_scsi::Cdb::new(&[]),
            attr: ferrite_scsi::TaskAttr::Simple,
            need: 0,
            bufs: IoBufs::new(),
            first: 0,
            recv: 0,
            solicit: 0,
            r2t_ends: SmallVec::new(),
            unsolicited: false,
            data_sn: 0,
            sn: 0,
            since: 0,
            crc_error: false,
            failed: false,
            budget: 0,
            soliciting: false,
            queued: false,
        }
    }

    /// The buffer that holds data-out byte `at`: its index in `bufs`, the offset in it, and the
    /// room left in it from there.
    pub(crate) fn segment(&self, at: u32) -> (usize, usize, u32) {
        if self.first > 0 && at < self.first {
            (0, at as usize, self.first - at)
        } else {
            (usize::from(self.first > 0), (at - self.first) as usize, self.need.saturating_sub(at))
        }
    }

    /// True once buffers cover all of `need`.
    pub(crate) fn has_buffers(&self) -> bool {
        self.bufs.iter().map(|b| b.len() as u64).sum::<u64>() == u64::from(self.need)
    }

    /// The TTT of its R2Ts.
    pub(crate) fn ttt(&self, slot: u32) -> u32 {
        debug_assert!(slot < 0xffff);
        (u32::from(self.gen) << 16) | slot
    }
}

/// Moves command `slot`'s phase to `to`.
#[inline(always)]
pub(crate) fn set_phase(cmd: &mut Cmd, to: Phase, conn: u64, slot: u32) {
    ferrite_target::transition(&mut cmd.phase, to, conn, slot);
}

/// The length of a CDB of up to 16 bytes from its group code (SAM-5 table 5), or 16 plus the
/// extension.
fn cdb_len(opcode: u8, ext: usize) -> usize {
    if ext > 0 {
        return 16 + ext;
    }
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        5 => 12,
        _ => 16,
    }
}

/// The LUN number of an 8-byte LUN field (single level), or u64::MAX (the SCSI layer then
/// answers LOGICAL UNIT NOT SUPPORTED).
pub(crate) fn lun_number(field: u64) -> u64 {
    ferrite_scsi::target::lun_from_bytes(&field.to_be_bytes()).unwrap_or(u64::MAX)
}

fn task_attr(a: TaskAttr) -> ferrite_scsi::TaskAttr {
    match a {
        TaskAttr::Untagged | TaskAttr::Simple => ferrite_scsi::TaskAttr::Simple,
        TaskAttr::Ordered => ferrite_scsi::TaskAttr::Ordered,
        TaskAttr::HeadOfQueue => ferrite_scsi::TaskAttr::HeadOfQueue,
        TaskAttr::Aca => ferrite_scsi::TaskAttr::Aca,
    }
}

/// A SCSI Command arrived: returns where its immediate data goes.
pub(crate) fn on_command(
    c: &Rc<Conn>,
    cmd: &ScsiCommand,
    h: &Header,
    ahs: &[u8],
    bhs: &[u8; BHS_LEN],
) -> Result<Dest, String> {
    let sess = c.session().ok_or("a SCSI Command before login")?;
    if sess.kind == SessionType::Discovery {
        c.reject(RejectReason::ProtocolError, bhs, "a SCSI Command in a discovery session");
        return Ok(Dest::Skip);
    }
    match c.seq.check(cmd.cmd_sn, cmd.immediate, false) {
        CmdSnVerdict::Accept => {}
        CmdSnVerdict::Drop => {
            ferrite_reactor::log_limited!(
                log::Level::Info,
                "iscsi connection {}: SCSI Command with CmdSN {} outside {}..={}; ignored",
                c.id,
                cmd.cmd_sn,
                c.seq.exp_cmd_sn(),
                c.seq.max_cmd_sn()
            );
            return Ok(Dest::Skip);
        }
        CmdSnVerdict::Fatal => {
            return Err(format!("an immediate SCSI Command with CmdSN {}, ExpCmdSN {}", cmd.cmd_sn, c.seq.exp_cmd_sn()))
        }
    }
    let p = &sess.params;
    let imm = h.data_len;
    let edtl = cmd.expected_data_transfer_length;
    let bad = if imm > 0 && !cmd.write {
        Some("data on a command that does not write")
    } else if imm > 0 && !p.immediate_data {
        Some("immediate data, negotiated off")
    } else if imm > p.first_burst_length || imm > edtl {
        Some("more immediate data than FirstBurstLength or the expected length")
    } else if !cmd.final_ && (p.initial_r2t || !cmd.write) {
        Some("unsolicited Data-Out announced under InitialR2T=Yes or for a command that does not write")
    } else if !cmd.final_ && imm >= p.first_burst_length.min(edtl) {
        Some("unsolicited Data-Out announced after a whole first burst of immediate data")
    } else {
        None
    };
    if let Some(why) = bad {
        c.reject(RejectReason::ProtocolError, bhs, why);
        c.finished(cmd.immediate);
        return Ok(Dest::Skip);
    }
    let cap = c.queue_depth.get() as usize + IMMEDIATE_SLOTS;
    let Some(slot) = c.cmds.borrow_mut().take(cap, Cmd::free) else {
        let reason =
            if cmd.immediate { RejectReason::ImmediateCommandReject } else { RejectReason::LongOperationReject };
        c.reject(reason, bhs, "no command slot free");
        c.finished(cmd.immediate);
        return Ok(Dest::Skip);
    };
    c.hold();
    let full = h.ahs.cdb(&cmd.cdb, ahs);
    let mut bytes = [0u8; ferrite_scsi::task::CDB_MAX];
    let n = full.copy_to(&mut bytes).min(cdb_len(cmd.cdb[0], full.ext.len()));
    let cdb = ferrite_scsi::Cdb::new(&bytes[..n]);
    let lun = lun_number(cmd.lun);
    let need = match (cmd.write, c.nexus()) {
        (true, Some(n)) => n.data_out_len(lun, cdb.as_slice(), edtl),
        _ => 0,
    };
    let gen = {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        debug_assert_eq!(x.phase, Phase::Free, "a slot taken while in use");
        x.gen = x.gen.wrapping_add(1);
        x.itt = cmd.itt;
        x.lun_field = cmd.lun;
        x.lun = lun;
        x.cmd_sn = cmd.cmd_sn;
        x.immediate = cmd.immediate;
        x.edtl = edtl;
        x.cdb = cdb;
        x.attr = task_attr(cmd.attr);
        x.need = need;
        x.bufs.clear();
        x.first = 0;
        x.recv = 0;
        x.solicit = 0;
        x.r2t_ends.clear();
        x.unsolicited = false;
        x.data_sn = 0;
        x.sn = 0;
        x.since = 0;
        x.crc_error = false;
        x.failed = false;
        x.budget = 0;
        x.soliciting = false;
        x.queued = false;
        // The first burst: the immediate data, and with F 0 the unsolicited Data-Out that
        // follows up to FirstBurstLength or the expected length (RFC 7143 section 4.2.5.2).
        let burst = if cmd.final_ { imm } else { p.first_burst_length.min(edtl) };
        if burst > 0 {
            // It comes now: its buffer is taken now (bounded by FirstBurstLength per
            // command); the rest's waits for the budget, and R2Ts start after it.
            let first = burst.min(need);
            if first > 0 {
                let mut b = ferrite_reactor::alloc_buf(first as usize);
                b.set_len(first as usize);
                x.bufs.push(b);
                x.first = first;
            }
            x.solicit = burst;
            if !cmd.final_ {
                x.r2t_ends.push(burst);
                x.unsolicited = true;
            }
            x.since = super::conn::now();
            set_phase(x, Phase::Receiving, c.id, slot);
        }
        x.gen
    };
    if imm > 0 {
        return Ok(Dest::Cmd { slot, gen, at: 0, keep: imm.min(need), len: imm, kind: DataKind::Immediate });
    }
    if !cmd.final_ {
        // Its unsolicited Data-Out comes next.
        return Ok(Dest::Skip);
    }
    if need > 0 {
        super::r2t::wait_for_buffer(c, slot);
    } else {
        submit(c, slot);
    }
    Ok(Dest::Skip)
}

/// The command in `slot` has its data-out (or needs none): to the SCSI layer.
pub(crate) fn submit(c: &Rc<Conn>, slot: u32) {
    let (task, crc, immediate) = {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        set_phase(x, Phase::Running, c.id, slot);
        x.since = 0;
        debug_assert!(x.has_buffers(), "connection {}: command {slot} submitted without its data-out", c.id);
        let data_out = std::mem::take(&mut x.bufs);
        (Task { lun: x.lun, cdb: x.cdb, attr: x.attr, expected_len: x.edtl, data_out }, x.crc_error, x.immediate)
    };
    if crc {
        // RFC 7143 section 7.8: the data had a digest error and was not retransmitted.
        let f = ferrite_scsi::Fault::check(ferrite_scsi::sense::SENSE_ABORTED_COMMAND, (0x47, 0x05));
        let resp = Response { status: f.sense.status, sense: f.encode(false), ..Default::default() };
        return super::datain::respond(c, slot, resp);
    }
    match c.nexus() {
        Some(n) => n.submit(task, c.tag(slot, immediate)),
        None => {
            drop(task);
            // A normal session always has a nexus; answer rather than leave the slot taken.
            debug_assert!(false, "connection {}: a command without a SCSI nexus", c.id);
        }
    }
}

/// Frees slot `slot` (its command ended, answered or not): its buffer and budget go back,
/// waiting commands may get theirs.
pub(crate) fn release(c: &Conn, slot: u32) {
    let queued = {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        set_phase(x, Phase::Free, c.id, slot);
        x.bufs.clear();
        x.r2t_ends.clear();
        x.unsolicited = false;
        x.since = 0;
        std::mem::take(&mut x.queued)
    };
    if queued {
        c.buf_wait.borrow_mut().retain(|&s| s != slot);
    }
    super::r2t::release_budget(c, slot);
    c.cmds.borrow_mut().release(slot);
    c.unhold();
}

/// A command that waited too long for a buffer ends with BUSY (the initiator retries it).
pub(crate) fn busy(c: &Conn, slot: u32) {
    let resp = Response { status: ferrite_scsi::sense::STATUS_BUSY, ..Default::default() };
    super::datain::respond(c, slot, resp);
}

/// Ends, without an answer, every command that waits on the initiator (its data, a buffer):
/// the connection is going, or a task management function ended them. `pick` chooses by LUN.
pub(crate) fn end_receiving(c: &Conn, pick: impl Fn(&Cmd) -> bool) -> usize {
    let slots: Vec<u32> = c
        .cmds
        .borrow()
        .iter()
        .filter(|(_, x)| matches!(x.phase, Phase::Waiting | Phase::Receiving) && pick(x))
        .map(|(i, _)| i)
        .collect();
    for &slot in &slots {
        let immediate = c.cmds.borrow()[slot as usize].immediate;
        release(c, slot);
        c.finished(immediate);
    }
    slots.len()
}

/// The connection ends: commands waiting on the initiator end.
pub(crate) fn end_waiting(c: &Conn) {
    end_receiving(c, |_| true);
}
