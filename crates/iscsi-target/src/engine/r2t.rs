//! A command's data-out: immediate data, unsolicited Data-Out (InitialR2T=No, up to
//! FirstBurstLength) and Data-Out solicited by R2Ts (at most MaxOutstandingR2T at a time, each
//! at most MaxBurstLength, R2TSN counting from 0), placed straight into the command's buffer
//! at its offset by the reader (`ferrite_target::rx::Rx::fill`). Only the bytes the SCSI
//! layer takes are kept; what an initiator sends beyond them (an expected length above the
//! command's transfer) is received and dropped.
//!
//! Sequences must come in order (DataSequenceInOrder and DataPDUInOrder are Yes): each
//! Data-Out continues exactly where the last ended, with the DataSN its sequence expects, and
//! ends its sequence (F) exactly at its R2T's end. Anything else is a protocol error that ends
//! the connection (ErrorRecoveryLevel 0); a Data-Out for no command is rejected.
//!
//! Buffers: a command whose data comes with it (immediate or unsolicited) takes its buffer at
//! once; one that waits for an R2T takes it in arrival order while the connection holds less
//! than [`super::R2T_BUDGET`] of data it solicited and fewer than `max_r2t_per_connection`
//! commands are soliciting, so that an initiator cannot take the pool by never sending.

use super::conn::Conn;
use super::reader::{DataKind, Dest};
use super::task::{set_phase, Phase};
use super::R2T_BUDGET;
use ferrite_iscsi::negotiate::SessionType;
use ferrite_iscsi::pdu::{DataOut, Pdu, R2t, RejectReason, BHS_LEN, RESERVED_TAG};
use std::rc::Rc;

/// The command in `slot` needs data-out and has none yet: it waits for a buffer, then its R2T.
pub(crate) fn wait_for_buffer(c: &Rc<Conn>, slot: u32) {
    {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        set_phase(x, Phase::Waiting, c.id, slot);
        x.since = super::conn::now();
    }
    c.buf_wait.borrow_mut().push_back(slot);
    grant_buffers(c);
}

/// Gives waiting commands their buffers and R2Ts, oldest first, while the budget, the
/// soliciting limit and the pool allow (one command may exceed the budget alone).
pub(crate) fn grant_buffers(c: &Conn) {
    let max_active = crate::options().max_r2t_per_connection.max(1);
    loop {
        if c.is_closing() {
            return;
        }
        let Some(slot) = c.buf_wait.borrow().front().copied() else { return };
        let need = c.cmds.borrow()[slot as usize].need as usize;
        let held = c.r2t_held.get();
        if c.r2t_active.get() >= max_active || (held > 0 && held + need > R2T_BUDGET) {
            return;
        }
        let Some(mut buf) = ferrite_reactor::try_alloc_buf(need) else {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi connection {}: no memory for {need} bytes of write data; the command waits",
                c.id
            );
            return;
        };
        buf.set_len(need);
        c.buf_wait.borrow_mut().pop_front();
        {
            let mut cmds = c.cmds.borrow_mut();
            let x = &mut cmds[slot as usize];
            x.buf = Some(buf);
            x.budgeted = true;
            set_phase(x, Phase::Receiving, c.id, slot);
        }
        c.r2t_held.set(held + need);
        send_r2ts(c, slot);
    }
}

/// The buffer of the command in `slot` no longer counts against the budget (its data is all
/// in, or it ended), nor does it solicit; waiting commands may go on.
pub(crate) fn release_budget(c: &Conn, slot: u32) {
    let (budget, soliciting) = {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        let b = if std::mem::take(&mut x.budgeted) { x.need as usize } else { 0 };
        (b, std::mem::take(&mut x.soliciting))
    };
    if budget > 0 {
        c.r2t_held.set(c.r2t_held.get() - budget);
    }
    if soliciting {
        c.r2t_active.set(c.r2t_active.get() - 1);
    }
    if budget > 0 || soliciting {
        grant_buffers(c);
    }
}

/// Queues the R2Ts the command in `slot` may have outstanding for the data it still needs.
fn send_r2ts(c: &Conn, slot: u32) {
    let Some(s) = c.session() else { return };
    let max_burst = s.params.max_burst_length.max(512);
    let max_out = usize::from(s.params.max_outstanding_r2t.max(1));
    let mut pdus: smallvec::SmallVec<[R2t; 2]> = smallvec::SmallVec::new();
    {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        x.solicit = x.solicit.max(x.recv);
        while x.r2t_ends.len() < max_out && x.solicit < x.need {
            let len = max_burst.min(x.need - x.solicit);
            pdus.push(R2t {
                lun: x.lun_field,
                itt: x.itt,
                ttt: x.ttt(slot),
                stat_sn: c.seq.stat_sn(),
                exp_cmd_sn: c.seq.exp_cmd_sn(),
                max_cmd_sn: c.seq.max_cmd_sn(),
                r2t_sn: x.sn,
                buffer_offset: x.solicit,
                desired_data_transfer_length: len,
            });
            x.sn = x.sn.wrapping_add(1);
            x.solicit += len;
            x.r2t_ends.push(x.solicit);
        }
        if !pdus.is_empty() {
            x.since = super::conn::now();
            if !x.soliciting {
                x.soliciting = true;
                c.r2t_active.set(c.r2t_active.get() + 1);
            }
        }
    }
    for p in pdus {
        c.send_pdu(&Pdu::R2t(p), &[]);
    }
}

/// A Data-Out header arrived: returns where its data goes, or Err for a sequence error.
pub(crate) fn on_data_out(c: &Rc<Conn>, d: &DataOut, len: u32, bhs: &[u8; BHS_LEN]) -> Result<Dest, String> {
    let sess = c.session().ok_or("a Data-Out before login")?;
    if sess.kind == SessionType::Discovery {
        c.reject(RejectReason::ProtocolError, bhs, "a Data-Out in a discovery session");
        return Ok(Dest::Skip);
    }
    let found = {
        let cmds = c.cmds.borrow();
        if d.ttt == RESERVED_TAG {
            cmds.iter()
                .find(|(_, x)| x.phase == Phase::Receiving && x.itt == d.itt && x.unsolicited.is_some())
                .map(|(i, _)| i)
        } else {
            let slot = d.ttt & 0xffff;
            cmds.get(slot)
                .filter(|x| {
                    x.phase == Phase::Receiving
                        && u32::from(x.gen) == d.ttt >> 16
                        && x.itt == d.itt
                        && !x.r2t_ends.is_empty()
                })
                .map(|_| slot)
        }
    };
    let Some(slot) = found else {
        c.reject(RejectReason::InvalidPduField, bhs, "a Data-Out for no command waiting for data");
        return Ok(Dest::Skip);
    };
    let mut cmds = c.cmds.borrow_mut();
    let x = &mut cmds[slot as usize];
    let end = match (d.ttt == RESERVED_TAG, x.unsolicited, x.r2t_ends.first()) {
        (true, Some(end), _) => end,
        (false, _, Some(&end)) => end,
        _ => return Err(format!("Data-Out (ITT {:#x}, TTT {:#x}) for no sequence", d.itt, d.ttt)),
    };
    if d.buffer_offset != x.recv || d.data_sn != x.data_sn {
        return Err(format!(
            "Data-Out (ITT {:#x}) at offset {} with DataSN {}, expected offset {} and DataSN {}",
            d.itt, d.buffer_offset, d.data_sn, x.recv, x.data_sn
        ));
    }
    let to = u64::from(x.recv) + u64::from(len);
    let solicited = d.ttt != RESERVED_TAG;
    if to > u64::from(end) || (solicited && d.final_ != (to == u64::from(end))) {
        return Err(format!(
            "Data-Out (ITT {:#x}) of {len} bytes at {} (F {}) does not end its sequence at {end}",
            d.itt, x.recv, d.final_
        ));
    }
    let keep = x.need.saturating_sub(x.recv).min(len);
    Ok(Dest::Cmd { slot, gen: x.gen, at: x.recv, keep, len, kind: DataKind::DataOut { final_: d.final_, solicited } })
}

/// A command's data PDU ended (its data all placed, `digest_ok` if its digest matched).
pub(crate) fn data_end(
    c: &Rc<Conn>,
    slot: u32,
    gen: u16,
    len: u32,
    kind: DataKind,
    digest_ok: bool,
    bhs: &[u8; BHS_LEN],
) {
    let live = c.cmds.borrow().get(slot).is_some_and(|x| x.gen == gen && x.phase == Phase::Receiving);
    if !live {
        // Ended meanwhile (an abort): the data was dropped.
        return;
    }
    if !digest_ok {
        c.reject(RejectReason::DataDigestError, bhs, "a data digest error");
        if kind == DataKind::Immediate {
            // RFC 7143 section 7.8: a command PDU with a digest error is discarded whole.
            let immediate = c.cmds.borrow()[slot as usize].immediate;
            super::task::release(c, slot);
            c.finished(immediate);
            return;
        }
    }
    {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        x.crc_error |= !digest_ok;
        x.recv += len;
        x.since = super::conn::now();
        match kind {
            DataKind::Immediate => {}
            DataKind::DataOut { final_, solicited } => {
                x.data_sn = x.data_sn.wrapping_add(1);
                if final_ {
                    x.data_sn = 0;
                    if solicited {
                        x.r2t_ends.remove(0);
                    } else {
                        x.unsolicited = None;
                    }
                } else if !solicited && x.unsolicited == Some(x.recv) {
                    // The unsolicited burst is whole (its F is missing: the limit ends it).
                    x.unsolicited = None;
                    x.data_sn = 0;
                }
            }
        }
    }
    progress(c, slot);
}

/// Moves the command in `slot` on once data came: more R2Ts, or the SCSI layer once all is in.
pub(crate) fn progress(c: &Rc<Conn>, slot: u32) {
    let (unsolicited, missing, outstanding) = {
        let cmds = c.cmds.borrow();
        let x = &cmds[slot as usize];
        (x.unsolicited.is_some(), x.recv < x.need, !x.r2t_ends.is_empty())
    };
    if unsolicited {
        return;
    }
    if missing {
        send_r2ts(c, slot);
        return;
    }
    if outstanding {
        return;
    }
    release_budget(c, slot);
    super::task::submit(c, slot);
}
