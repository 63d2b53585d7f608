//! A command's data-out: its first burst (immediate data, then with InitialR2T=No the
//! unsolicited Data-Out sequence, TTT 0xffffffff, up to FirstBurstLength or the expected
//! length), then Data-Out solicited by R2Ts (at most MaxOutstandingR2T at a time, each at most
//! MaxBurstLength, R2TSN counting from 0), placed straight into the command's buffers at their
//! offset by the reader (`ferrite_target::rx::Rx::fill`). Only the bytes the SCSI layer takes
//! are kept; what an initiator sends beyond them (an expected length above the command's
//! transfer) is received and dropped.
//!
//! Sequences must come in order (DataSequenceInOrder and DataPDUInOrder are Yes): each
//! Data-Out continues exactly where the last ended, with the DataSN its sequence expects, and
//! ends its sequence (F) exactly at its R2T's end. A Data-Out that does not is rejected
//! (protocol error, as SPDK answers); libiscsi and Linux then take the command as failed, so
//! the target drops the rest of its data and ends it without an answer. A Data-Out for no
//! command is rejected (invalid PDU field) and its data skipped.
//!
//! Buffers: the immediate data's buffer is taken when the command comes (at most
//! FirstBurstLength); the rest's is taken, in arrival order, before its R2Ts, while the
//! connection holds less than [`super::R2T_BUDGET`] of buffers for data it solicited and fewer
//! than `max_r2t_per_connection` commands are soliciting: an initiator cannot take the pool by
//! never sending (the watchdog answers a command that waited too long BUSY).

use super::conn::Conn;
use super::reader::{DataKind, Dest};
use super::task::{set_phase, Phase};
use super::R2T_BUDGET;
use ferrite_iscsi::negotiate::SessionType;
use ferrite_iscsi::pdu::{DataOut, Pdu, R2t, RejectReason, BHS_LEN};
use std::rc::Rc;

/// The command in `slot` needs buffers for the data-out still to come: it waits for them in
/// the connection's queue, then gets its R2Ts.
pub(crate) fn wait_for_buffer(c: &Conn, slot: u32) {
    {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        if x.phase == Phase::Free {
            set_phase(x, Phase::Waiting, c.id, slot);
        }
        debug_assert!(!x.queued, "connection {}: command {slot} queued twice", c.id);
        x.queued = true;
        x.since = super::conn::now();
    }
    c.buf_wait.borrow_mut().push_back(slot);
    grant_buffers(c);
}

/// Gives waiting commands their buffers and R2Ts, oldest first, while the budget, the
/// soliciting limit and the pool allow (one command may exceed the budget alone).
pub(crate) fn grant_buffers(c: &Conn) {
    let max_active = c.opts.max_r2t;
    loop {
        if c.is_closing() {
            return;
        }
        let Some(slot) = c.buf_wait.borrow().front().copied() else { return };
        let rest = {
            let cmds = c.cmds.borrow();
            let x = &cmds[slot as usize];
            (x.need - x.first) as usize
        };
        let held = c.r2t_held.get();
        if c.r2t_active.get() >= max_active || (held > 0 && held + rest > R2T_BUDGET) {
            return;
        }
        let Some(mut buf) = ferrite_reactor::try_alloc_buf(rest) else {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi connection {}: no memory for {rest} bytes of write data; the command waits",
                c.id
            );
            return;
        };
        buf.set_len(rest);
        c.buf_wait.borrow_mut().pop_front();
        {
            let mut cmds = c.cmds.borrow_mut();
            let x = &mut cmds[slot as usize];
            x.bufs.push(buf);
            x.budget = rest as u32;
            x.queued = false;
            debug_assert!(x.has_buffers());
            if x.phase == Phase::Waiting {
                set_phase(x, Phase::Receiving, c.id, slot);
            }
        }
        c.r2t_held.set(held + rest);
        send_r2ts(c, slot);
    }
}

/// The buffers of the command in `slot` no longer count against the budget (its data is all
/// in, or it ended), nor does it solicit; waiting commands may go on.
pub(crate) fn release_budget(c: &Conn, slot: u32) {
    let (budget, soliciting) = {
        let mut cmds = c.cmds.borrow_mut();
        let x = &mut cmds[slot as usize];
        (std::mem::take(&mut x.budget) as usize, std::mem::take(&mut x.soliciting))
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

/// The Target Transfer Tag of unsolicited Data-Out.
const UNSOLICITED_TTT: u32 = 0xffff_ffff;

/// The slot of the command a Data-Out is for: one receiving the sequence the Data-Out belongs
/// to, its unsolicited one (TTT 0xffffffff; the command is found by its ITT) or one an R2T
/// solicited (the TTT names the slot and its generation).
fn data_out_slot(c: &Conn, d: &DataOut) -> Option<u32> {
    let cmds = c.cmds.borrow();
    let ours = |x: &super::task::Cmd| x.phase == Phase::Receiving && x.itt == d.itt && !x.r2t_ends.is_empty();
    if d.ttt == UNSOLICITED_TTT {
        return cmds.iter().find(|(_, x)| ours(x) && x.unsolicited).map(|(i, _)| i);
    }
    let slot = d.ttt & 0xffff;
    cmds.get(slot).filter(|x| ours(x) && !x.unsolicited && u32::from(x.gen) == d.ttt >> 16).map(|_| slot)
}

/// A Data-Out header arrived: returns where its data goes.
pub(crate) fn on_data_out(c: &Rc<Conn>, d: &DataOut, len: u32, bhs: &[u8; BHS_LEN]) -> Result<Dest, String> {
    let sess = c.session().ok_or("a Data-Out before login")?;
    if sess.kind == SessionType::Discovery {
        c.reject(RejectReason::ProtocolError, bhs, "a Data-Out in a discovery session");
        return Ok(Dest::Skip);
    }
    let Some(slot) = data_out_slot(c, d) else {
        c.reject(RejectReason::InvalidPduField, bhs, "a Data-Out for no command waiting for data");
        return Ok(Dest::Skip);
    };
    let mut cmds = c.cmds.borrow_mut();
    let x = &mut cmds[slot as usize];
    let kind = DataKind::DataOut { final_: d.final_ };
    let end = x.r2t_ends[0];
    let to = u64::from(x.recv) + u64::from(len);
    let wrong = if x.failed {
        None
    } else if d.buffer_offset != x.recv {
        Some(format!("a Data-Out at offset {}, expected {}", d.buffer_offset, x.recv))
    } else if d.data_sn != x.data_sn {
        Some(format!("a Data-Out with DataSN {}, expected {}", d.data_sn, x.data_sn))
    } else if to > u64::from(end) || d.final_ != (to == u64::from(end)) {
        Some(format!("a Data-Out of {len} bytes at {} (F {}) past or short of its R2T's end {end}", x.recv, d.final_))
    } else {
        None
    };
    let gen = x.gen;
    if let Some(why) = wrong {
        x.failed = true;
        drop(cmds);
        c.reject(RejectReason::ProtocolError, bhs, &format!("{why} (ITT {:#x})", d.itt));
        return Ok(Dest::Cmd { slot, gen, at: 0, keep: 0, len, kind });
    }
    let keep = if x.failed { 0 } else { x.need.saturating_sub(x.recv).min(len) };
    Ok(Dest::Cmd { slot, gen, at: x.recv, keep, len, kind })
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
        x.recv = x.recv.saturating_add(len);
        x.since = super::conn::now();
        if let DataKind::DataOut { final_ } = kind {
            x.data_sn = x.data_sn.wrapping_add(1);
            if final_ && !x.r2t_ends.is_empty() {
                x.r2t_ends.remove(0);
                x.unsolicited = false;
                x.data_sn = 0;
            }
        }
    }
    progress(c, slot);
}

/// Moves the command in `slot` on once data came: a buffer and R2Ts for the rest, or the SCSI
/// layer once all is in (a failed command ends silently once its R2Ts are answered).
fn progress(c: &Rc<Conn>, slot: u32) {
    let (failed, missing, buffered, queued, outstanding, immediate) = {
        let cmds = c.cmds.borrow();
        let x = &cmds[slot as usize];
        (x.failed, x.recv < x.need, x.has_buffers(), x.queued, !x.r2t_ends.is_empty(), x.immediate)
    };
    if failed {
        if !outstanding {
            super::task::release(c, slot);
            c.finished(immediate);
        }
        return;
    }
    if missing {
        if !buffered {
            if !queued {
                wait_for_buffer(c, slot);
            }
        } else {
            send_r2ts(c, slot);
        }
        return;
    }
    if outstanding {
        return;
    }
    release_budget(c, slot);
    super::task::submit(c, slot);
}
