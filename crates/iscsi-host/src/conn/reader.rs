//! A connection's reader task: the login, then every PDU the target sends, decoded by the
//! streaming decoder from chunks of the reactor's provided buffer ring; Data-In data placed
//! straight into the command's buffers, other data (sense, ping data, rejected headers)
//! staged.
//!
//! Anything the target gets wrong ends the connection with a log line: a header the decoder
//! refuses (a header digest, a data segment over this end's MaxRecvDataSegmentLength, an
//! invalid field), a data digest mismatch, a PDU naming no outstanding task (a wrong ITT), a
//! Data-In out of order or past the command's length, an R2T outside its command, a PDU the
//! initiator did not ask for. Its outstanding commands are then sent again on a new
//! connection.

use super::task::{gen_of, slot_of, Ended};
use super::{login, out::pieces_in, Conn};
use crate::plan::{r2t_wrong, segments};
use crate::scsi::{response_sense, status};
use ferrite_iscsi::login::InitiatorLoginConfig;
use ferrite_iscsi::pdu::{
    async_event, DataOut, Decoder, Event, Header, NopIn, NopOut, Pdu, R2t, Role, Want, BHS_LEN, RESERVED_TAG,
};
use ferrite_target::host::place;
use ferrite_target::rx::Rx;
use smallvec::SmallVec;
use std::rc::Rc;

/// Why a reader stopped (the kit's): the connection closed or failed under it, or the login
/// failed; or the target broke the protocol.
pub(super) use ferrite_target::host::Stop;

/// Where the current PDU's data goes.
#[derive(Debug, Clone, Copy)]
enum Dest {
    /// Nowhere (still digested).
    Skip,
    /// The staging vector.
    Stage,
    /// Task `slot`'s read buffers from byte `at`.
    Task { slot: u16, at: u32 },
}

/// The reader task.
pub(super) async fn reader(c: Rc<Conn>, login: InitiatorLoginConfig) {
    match run(&c, login).await {
        Ok(()) => {}
        Err(Stop::Violation(e)) => {
            // Rate-limited: a target may break every connection right after its login.
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi host connection {} to {}: protocol error by the target: {e}; closing the connection",
                c.core.id,
                c.core.peer
            );
            *c.fault.borrow_mut() = Some(e);
        }
        Err(Stop::Closed(e)) => {
            if !c.is_closed() {
                ferrite_reactor::log_limited!(
                    log::Level::Info,
                    "iscsi host connection {} to {}: {e}",
                    c.core.id,
                    c.core.peer
                );
            }
        }
    }
    c.close();
    c.task_done();
}

async fn run(c: &Rc<Conn>, cfg: InitiatorLoginConfig) -> Result<(), Stop> {
    let mut rx = Rx::new(&c.core.sock);
    let mut dec = Decoder::new(Role::Initiator);
    login::run(c, &mut rx, &mut dec, cfg).await?;
    let mut staged: Vec<u8> = Vec::with_capacity(256);
    let mut dest = Dest::Skip;
    let mut cur: Option<Pdu> = None;
    loop {
        if c.is_closed() {
            return Ok(());
        }
        match dec.want() {
            Want::Closed => return Err(Stop::Closed("the decoder stopped".into())),
            Want::Bytes(_) => {
                let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                let fed = dec.feed(chunk).map_err(|e| Stop::Violation(format!("invalid PDU: {e}")))?;
                chunk.consume(fed.consumed);
                match fed.event {
                    None => {}
                    Some(Event::Header(h)) => {
                        dest = on_header(c, &h)?;
                        if let Dest::Stage = dest {
                            staged.clear();
                        }
                        if h.data_len == 0 {
                            on_end(c, &h.pdu, &staged)?;
                            dest = Dest::Skip;
                        } else {
                            cur = Some(h.pdu);
                        }
                    }
                    Some(Event::DataEnd) => {
                        if let Some(p) = cur.take() {
                            on_end(c, &p, &staged)?;
                        }
                        dest = Dest::Skip;
                    }
                    Some(Event::DataDigestError { received, computed }) => {
                        return Err(Stop::Violation(format!(
                            "data digest {received:#010x}, computed {computed:#010x}"
                        )));
                    }
                    Some(Event::Invalid(inv)) => return Err(Stop::Violation(format!("invalid PDU: {}", inv.error))),
                }
            }
            Want::Data(left) => {
                let left = left as usize;
                let ended = match dest {
                    Dest::Task { slot, at } => {
                        let ev = place(&c.tasks, u32::from(slot), &mut rx, at, left, "Data-In", |d| dec.data(d).event)
                            .await?;
                        dest = Dest::Task { slot, at: at + left as u32 };
                        ev
                    }
                    Dest::Stage | Dest::Skip => {
                        let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                        let k = chunk.len().min(left);
                        if let Dest::Stage = dest {
                            staged.extend_from_slice(&chunk[..k]);
                        }
                        let fed = dec.data(&chunk[..k]);
                        chunk.consume(fed.consumed);
                        fed.event
                    }
                };
                match ended {
                    None => {}
                    Some(Event::DataEnd) => {
                        if let Some(p) = cur.take() {
                            on_end(c, &p, &staged)?;
                        }
                        dest = Dest::Skip;
                    }
                    Some(Event::DataDigestError { received, computed }) => {
                        return Err(Stop::Violation(format!(
                            "data digest {received:#010x}, computed {computed:#010x}"
                        )));
                    }
                    Some(other) => return Err(Stop::Violation(format!("unexpected decoder event {other:?}"))),
                }
            }
        }
    }
}

/// Reads one whole PDU, its data into `staged` (login: at most 8192 bytes).
pub(super) async fn read_staged(rx: &mut Rx<'_>, dec: &mut Decoder, staged: &mut Vec<u8>) -> Result<Header, Stop> {
    staged.clear();
    let mut header = None;
    loop {
        match dec.want() {
            Want::Closed => return Err(Stop::Closed("the decoder stopped".into())),
            Want::Bytes(_) => {
                let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                let fed = dec.feed(chunk).map_err(|e| Stop::Violation(format!("invalid PDU: {e}")))?;
                chunk.consume(fed.consumed);
                match fed.event {
                    None => {}
                    Some(Event::Header(h)) if h.data_len == 0 => return Ok(h),
                    Some(Event::Header(h)) => header = Some(h),
                    Some(Event::DataEnd) => return header.ok_or(Stop::Closed("data without a header".into())),
                    Some(Event::DataDigestError { .. }) => return Err(Stop::Violation("data digest error".into())),
                    Some(Event::Invalid(inv)) => return Err(Stop::Violation(format!("invalid PDU: {}", inv.error))),
                }
            }
            Want::Data(left) => {
                let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                let k = chunk.len().min(left as usize);
                staged.extend_from_slice(&chunk[..k]);
                let fed = dec.data(&chunk[..k]);
                chunk.consume(fed.consumed);
                match fed.event {
                    Some(Event::DataEnd) => return header.ok_or(Stop::Closed("data without a header".into())),
                    Some(Event::DataDigestError { .. }) => return Err(Stop::Violation("data digest error".into())),
                    _ => {}
                }
            }
        }
    }
}

impl Conn {
    /// Takes ExpCmdSN and MaxCmdSN from a target PDU (and its StatSN if it carries a
    /// status); room made in the window goes to what waits.
    fn seen(&self, exp: u32, max: u32, stat_sn: Option<u32>) -> Result<(), Stop> {
        let mut w = self.win.get();
        let grew = w.update(exp, max);
        if let Some(sn) = stat_sn {
            w.status(sn);
        }
        if w.exp_beyond_sent() {
            return Err(Stop::Violation(format!(
                "ExpCmdSN {exp} acknowledges commands never sent (next CmdSN {})",
                w.next()
            )));
        }
        self.win.set(w);
        if grew {
            self.room();
        }
        Ok(())
    }

    /// The slot of the outstanding task `itt` names (sent, not yet answered).
    fn task_of(&self, itt: u32) -> Option<u16> {
        let slot = slot_of(itt);
        let tasks = self.tasks.borrow();
        let t = tasks.get(u32::from(slot))?;
        (t.flight.is_sent() && t.gen == gen_of(itt)).then_some(slot)
    }

    fn no_task(&self, what: &str, itt: u32) -> Stop {
        Stop::Violation(format!("{what} for ITT {itt:#010x}, which names no outstanding command"))
    }

    /// Answers an R2T with Data-Out PDUs from the command's buffers.
    fn answer_r2t(&self, r: &R2t) -> Result<(), Stop> {
        let slot = self.task_of(r.itt).ok_or_else(|| self.no_task("an R2T", r.itt))?;
        let x = self.xfer.get();
        let mut list: SmallVec<[(*const u8, usize); 4]> = SmallVec::new();
        {
            let mut tasks = self.tasks.borrow_mut();
            let t = &mut tasks[usize::from(slot)];
            if t.read {
                return Err(Stop::Violation(format!("an R2T for ITT {:#010x}, a read", r.itt)));
            }
            if let Some(e) = r2t_wrong(t.len, &x, &t.r2ts, r.r2t_sn, r.buffer_offset, r.desired_data_transfer_length) {
                return Err(Stop::Violation(e));
            }
            t.r2ts.take(r.buffer_offset, r.desired_data_transfer_length);
            t.data_pieces(&mut list);
        }
        let params = self.tx.get();
        let exp_stat_sn = self.win.get().exp_stat_sn();
        let end = r.buffer_offset + r.desired_data_transfer_length;
        let mut piece = SmallVec::new();
        for (data_sn, (off, n, last)) in segments(r.buffer_offset, end, x.max_send_segment).enumerate() {
            let pdu = Pdu::DataOut(DataOut {
                final_: last,
                lun: self.lun,
                itt: r.itt,
                ttt: r.ttt,
                exp_stat_sn,
                data_sn: data_sn as u32,
                buffer_offset: off,
            });
            pieces_in(&list, off, n, &mut piece);
            if !self.queue(slot, &params, &pdu, &piece, true, last) {
                return Err(Stop::Violation("cannot queue a Data-Out".into()));
            }
        }
        Ok(())
    }

    /// Answers a NOP-In that asks for it (a TTT) with a NOP-Out without data: a target's ping
    /// carries no data to echo (RFC 7143 section 11.19: its data segment is empty; libiscsi
    /// does not echo either). At most one answer waits to be sent: a target pinging faster
    /// than this end sends is answered once (the TTT of the first ping waiting).
    fn answer_nop(&self, n: &NopIn) {
        if self.nop_waits.get() {
            return;
        }
        let w = self.win.get();
        let pdu = Pdu::NopOut(NopOut {
            immediate: true,
            lun: n.lun,
            itt: RESERVED_TAG,
            ttt: n.ttt,
            cmd_sn: w.next(),
            exp_stat_sn: w.exp_stat_sn(),
        });
        match super::out::Out::owned(&self.tx.get(), &pdu, Vec::new()) {
            Ok(mut o) => {
                o.slot = Some(super::out::NOP_ANSWER);
                self.nop_waits.set(true);
                self.push(o);
            }
            Err(e) => log::warn!("iscsi host connection {}: cannot answer a NOP-In: {e}", self.core.id),
        }
    }
}

/// A header arrived: checks it against the session and says where its data goes.
fn on_header(c: &Conn, h: &Header) -> Result<Dest, Stop> {
    match &h.pdu {
        Pdu::DataIn(d) => {
            c.seen(d.exp_cmd_sn, d.max_cmd_sn, d.status_present.then_some(d.stat_sn))?;
            let slot = c.task_of(d.itt).ok_or_else(|| c.no_task("Data-In", d.itt))?;
            let mut tasks = c.tasks.borrow_mut();
            let t = &mut tasks[usize::from(slot)];
            if !t.read {
                return Err(Stop::Violation(format!("Data-In for ITT {:#010x}, which reads nothing", d.itt)));
            }
            if let Some(e) = t.progress.take(t.len, d.data_sn, d.buffer_offset, h.data_len) {
                return Err(Stop::Violation(e));
            }
            Ok(if h.data_len > 0 { Dest::Task { slot, at: d.buffer_offset } } else { Dest::Skip })
        }
        Pdu::ScsiResponse(r) => {
            c.seen(r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn))?;
            c.task_of(r.itt).ok_or_else(|| c.no_task("a SCSI Response", r.itt))?;
            Ok(Dest::Stage)
        }
        Pdu::R2t(r) => {
            c.seen(r.exp_cmd_sn, r.max_cmd_sn, None)?;
            c.answer_r2t(r)?;
            Ok(Dest::Skip)
        }
        Pdu::NopIn(n) => {
            c.seen(n.exp_cmd_sn, n.max_cmd_sn, (n.itt != RESERVED_TAG).then_some(n.stat_sn))?;
            // Its data (none from a conforming target) is not kept.
            Ok(Dest::Skip)
        }
        Pdu::Reject(r) => {
            c.seen(r.exp_cmd_sn, r.max_cmd_sn, Some(r.stat_sn))?;
            Ok(Dest::Stage)
        }
        Pdu::AsyncMessage(a) => {
            c.seen(a.exp_cmd_sn, a.max_cmd_sn, Some(a.stat_sn))?;
            Ok(Dest::Skip)
        }
        Pdu::LogoutResponse(l) => {
            c.seen(l.exp_cmd_sn, l.max_cmd_sn, Some(l.stat_sn))?;
            if l.itt != super::task::LOGOUT_ITT || c.logout_wait.borrow().is_none() {
                return Err(Stop::Violation("a Logout Response to no Logout Request".into()));
            }
            Ok(Dest::Skip)
        }
        other => Err(Stop::Violation(format!("{}, which the initiator did not ask for", other.opcode()))),
    }
}

/// A PDU ended (its data, if any, placed or staged in `staged`).
fn on_end(c: &Conn, pdu: &Pdu, staged: &[u8]) -> Result<(), Stop> {
    match pdu {
        Pdu::DataIn(d) if d.status_present => {
            if let Some(slot) = c.task_of(d.itt) {
                c.finish(slot, Ended::Status { status: d.status, sense: None });
            }
        }
        Pdu::ScsiResponse(r) => {
            let Some(slot) = c.task_of(r.itt) else { return Ok(()) };
            if r.response != 0 {
                ferrite_reactor::log_limited!(
                    log::Level::Warn,
                    "iscsi host connection {}: the target failed ITT {:#010x} (iSCSI response {:#04x})",
                    c.core.id,
                    r.itt,
                    r.response
                );
                c.finish(slot, Ended::Refused);
            } else {
                let sense = if r.status == status::CHECK_CONDITION { response_sense(staged) } else { None };
                c.finish(slot, Ended::Status { status: r.status, sense });
            }
        }
        Pdu::NopIn(n) if n.ttt != RESERVED_TAG => c.answer_nop(n),
        Pdu::Reject(r) => {
            let Some(bhs) = staged.get(..BHS_LEN) else {
                return Err(Stop::Violation(format!("a Reject without the rejected header ({} bytes)", staged.len())));
            };
            let opcode = bhs[0] & 0x3f;
            let itt = u32::from_be_bytes([bhs[16], bhs[17], bhs[18], bhs[19]]);
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi host connection {}: the target rejected a PDU (opcode {opcode:#04x}, ITT {itt:#010x}): reason {:#04x}",
                c.core.id,
                r.reason
            );
            if r.reason == ferrite_iscsi::pdu::RejectReason::WaitingForLogout as u8 {
                return Err(Stop::Closed("the target waits for a logout".into()));
            }
            // A rejected command or Data-Out ends its command (RFC 7143 section 7.2).
            if opcode == 0x01 || opcode == 0x05 {
                if let Some(slot) = c.task_of(itt) {
                    c.finish(slot, Ended::Refused);
                }
            }
        }
        Pdu::AsyncMessage(a) => match a.async_event {
            async_event::LOGOUT_REQUEST => return Err(Stop::Closed("the target asked for a logout".into())),
            async_event::CONNECTION_DROP | async_event::SESSION_DROP => {
                return Err(Stop::Closed(format!("the target drops the connection (event {})", a.async_event)))
            }
            e => log::info!("iscsi host connection {}: asynchronous event {e} from the target", c.core.id),
        },
        Pdu::LogoutResponse(_) => {
            if let Some(w) = c.logout_wait.borrow_mut().take() {
                w.send(());
            }
        }
        _ => {}
    }
    Ok(())
}
