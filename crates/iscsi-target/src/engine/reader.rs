//! A connection's reader task: PDUs decoded from chunks of the reactor's provided buffer ring
//! (`ferrite_target::rx::Rx`, an idle connection holds no buffer) by the streaming decoder,
//! each header dispatched by opcode, data placed where its header said: a command's buffer
//! (immediate data and Data-Out, straight at their offset), a staging vector (login, text and
//! NOP-Out data), or nowhere (skipped, still digested).
//!
//! During login only Login Requests are taken (anything else ends the connection). In the full
//! feature phase an invalid header is answered with a Reject carrying it (the decoder says
//! which reason) and skipped; a fatal error (header digest, a data segment over our
//! MaxRecvDataSegmentLength, a sequence error) ends the connection.

use super::conn::{Conn, Stage};
use super::seq::CmdSnVerdict;
use super::task::Phase;
use ferrite_iscsi::pdu::{Decoder, Event, Header, LoginRequest, Pdu, RejectReason, Role, Want, BHS_LEN};
use ferrite_reactor::IoBuf;
use ferrite_target::rx::Rx;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

/// What a command's data PDU is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataKind {
    /// Immediate data in the SCSI Command PDU.
    Immediate,
    /// A Data-Out PDU answering an R2T.
    DataOut {
        /// F: the last of its sequence.
        final_: bool,
    },
}

/// Where the current PDU's data goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dest {
    /// Nowhere (still digested).
    Skip,
    /// The staging vector; the header waits there for its data.
    Stage,
    /// Command `slot`'s buffer from `at`: `keep` bytes, the rest of the PDU's `len` skipped.
    Cmd {
        /// The slot.
        slot: u32,
        /// The command's generation (it may end while its data comes).
        gen: u16,
        /// Offset in its buffer of the next kept byte.
        at: u32,
        /// Bytes still to keep.
        keep: u32,
        /// The PDU's whole data length.
        len: u32,
        /// What it is.
        kind: DataKind,
    },
}

/// Reads and serves PDUs until the initiator goes, errs, logs out or the connection closes, or
/// it moves to its session's reactor (`c.moving`: the receive is stopped first, and no byte
/// may follow the Login Request that moves it). `first`: a Login Request read before the
/// connection moved here.
pub(crate) async fn run(c: &Rc<Conn>, first: Option<(LoginRequest, Vec<u8>)>) -> Result<(), String> {
    if let Some((req, data)) = first {
        if !super::login::on_moved_request(c, &req, &data)? {
            return Ok(());
        }
    }
    let mut rx = Rx::new(&c.sock);
    let r = serve_pdus(c, &mut rx).await;
    if r.is_ok() && c.moving.borrow().is_some() && rx.stop().await {
        c.moving.borrow_mut().take();
        return Err("bytes after a Login Request, before its response".into());
    }
    r
}

/// The CmdSN of a request that the session serves in CmdSN order (non-immediate ones).
fn ordered_cmd_sn(pdu: &Pdu) -> Option<u32> {
    let (sn, imm) = match pdu {
        Pdu::ScsiCommand(x) => (x.cmd_sn, x.immediate),
        Pdu::NopOut(x) => (x.cmd_sn, x.immediate),
        Pdu::TextRequest(x) => (x.cmd_sn, x.immediate),
        Pdu::TaskMgmtRequest(x) => (x.cmd_sn, x.immediate),
        Pdu::LogoutRequest(x) => (x.cmd_sn, x.immediate),
        _ => return None,
    };
    (!imm).then_some(sn)
}

async fn serve_pdus(c: &Rc<Conn>, rx: &mut Rx<'_>) -> Result<(), String> {
    let mut dec = Decoder::new(Role::Target);
    let mut dest = Dest::Skip;
    let mut stage: Vec<u8> = Vec::new();
    let mut pending: Option<Header> = None;
    loop {
        if c.is_closing() {
            return Ok(());
        }
        // Back-pressure: the initiator is not reading what it asked for.
        if c.unsent() > super::MAX_UNSENT && !rx.has_buffered() {
            rx.pause();
            poll_fn(|cx| {
                if c.is_closing() || c.unsent() <= super::MAX_UNSENT {
                    return Poll::Ready(());
                }
                c.park_reader(cx);
                Poll::Pending
            })
            .await;
            continue;
        }
        // The login ended: the negotiated digests and data limit hold from this header on.
        if let Some(p) = c.rx_params.take() {
            dec.set_params(p);
        }
        match dec.want() {
            Want::Closed => return Err("the decoder stopped".into()),
            Want::Bytes(_) => {
                let chunk = rx.chunk().await?;
                let fed = dec.feed(chunk).map_err(|e| format!("protocol error: {e}"))?;
                chunk.consume(fed.consumed);
                match fed.event {
                    None => {}
                    Some(Event::Header(h)) => {
                        // A request ahead of ExpCmdSN waits for those before it to come on the
                        // session's other connections.
                        if let (Some(sn), Some(w)) = (ordered_cmd_sn(&h.pdu), c.seq.window()) {
                            if w.ahead(sn, false)
                                && !w
                                    .reach(sn, |cx| {
                                        c.is_closing() || {
                                            c.park_reader(cx);
                                            false
                                        }
                                    })
                                    .await
                            {
                                if c.is_closing() {
                                    // The connection ends while the request waited: it is not served.
                                    return Ok(());
                                }
                                ferrite_reactor::log_limited!(
                                    log::Level::Info,
                                    "iscsi connection {}: CmdSN {sn} waited {:?} for ExpCmdSN {}; the gap is skipped",
                                    c.id,
                                    super::seq::GAP_WAIT,
                                    w.exp_cmd_sn()
                                );
                            }
                        }
                        dest = on_header(c, &dec, h)?;
                        if h.data_len == 0 {
                            // No data follows (and no DataEnd): the PDU is whole now.
                            match std::mem::replace(&mut dest, Dest::Skip) {
                                Dest::Stage => {
                                    if !staged(c, &dec, &h, &[]).await? {
                                        return Ok(());
                                    }
                                }
                                Dest::Cmd { slot, gen, len, kind, .. } => {
                                    super::r2t::data_end(c, slot, gen, len, kind, true, dec.bhs())
                                }
                                Dest::Skip => {}
                            }
                        } else if let Dest::Stage = dest {
                            stage.clear();
                            pending = Some(h);
                        }
                    }
                    Some(ev @ (Event::DataEnd | Event::DataDigestError { .. })) => {
                        let ok = ev == Event::DataEnd;
                        if let Event::DataDigestError { received, computed } = ev {
                            ferrite_reactor::log_limited!(
                                log::Level::Warn,
                                "iscsi connection {}: data digest {received:#010x}, computed {computed:#010x}",
                                c.id
                            );
                            if c.stage.get() == Stage::Login {
                                return Err("a data digest error during login".into());
                            }
                        }
                        if !data_end(c, &dec, &mut dest, &mut pending, &stage, ok).await? {
                            return Ok(());
                        }
                    }
                    Some(Event::Invalid(inv)) => {
                        if c.stage.get() == Stage::Login {
                            return Err(format!("an invalid PDU during login: {}", inv.error));
                        }
                        let reason = inv.error.reject_reason().unwrap_or(RejectReason::ProtocolError);
                        c.reject(reason, &inv.bhs, &format!("{}", inv.error));
                        dest = Dest::Skip;
                    }
                }
            }
            Want::Data(left) => {
                let left = left as usize;
                match dest {
                    Dest::Cmd { slot, gen, at, keep, len, kind } if keep > 0 => {
                        // The buffer that holds offset `at` (immediate data's, or the rest's),
                        // taken out while the data is received into it.
                        let taken = {
                            let mut cmds = c.cmds.borrow_mut();
                            cmds.get_mut(slot).filter(|x| x.gen == gen && x.phase == Phase::Receiving).and_then(|x| {
                                let (i, local, room) = x.segment(at);
                                let b = x.bufs.get_mut(i)?;
                                Some((i, local, room, std::mem::replace(b, IoBuf::empty())))
                            })
                        };
                        let Some((i, local, room, buf)) = taken else {
                            // The command ended meanwhile: the rest of its data is skipped.
                            dest = Dest::Cmd { slot, gen, at, keep: 0, len, kind };
                            continue;
                        };
                        debug_assert!(keep <= room, "a data PDU across two buffers");
                        let n = left.min(keep.min(room) as usize);
                        let allowance = Some(super::DATA_BASE_TIME + Duration::from_secs((n >> 20) as u64));
                        c.receiving.begin(n);
                        let (res, buf) = rx.fill(buf, local, n, allowance).await;
                        c.receiving.end();
                        let fed = dec.data(&buf[local..local + n]);
                        {
                            let mut cmds = c.cmds.borrow_mut();
                            if let Some(b) = cmds
                                .get_mut(slot)
                                .filter(|x| x.gen == gen && x.phase == Phase::Receiving)
                                .and_then(|x| x.bufs.get_mut(i))
                            {
                                *b = buf;
                            }
                        }
                        res?;
                        let n = n as u32;
                        let keep = if n < keep.min(room) { keep - n } else { 0 };
                        dest = Dest::Cmd { slot, gen, at: at + n, keep, len, kind };
                        if let Some(ev) = fed.event {
                            let ok = matches!(ev, Event::DataEnd);
                            if !data_end(c, &dec, &mut dest, &mut pending, &stage, ok).await? {
                                return Ok(());
                            }
                        }
                    }
                    _ => {
                        let chunk = rx.chunk().await?;
                        let k = chunk.len().min(left);
                        if let Dest::Stage = dest {
                            stage.extend_from_slice(&chunk[..k]);
                        }
                        let fed = dec.data(&chunk[..k]);
                        chunk.consume(fed.consumed);
                        if let Some(ev) = fed.event {
                            let ok = matches!(ev, Event::DataEnd);
                            if !data_end(c, &dec, &mut dest, &mut pending, &stage, ok).await? {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A PDU's data is all in (`ok`: its digest matched, if there is one). False once the
/// connection ends (a logout answered, a login failed).
async fn data_end(
    c: &Rc<Conn>,
    dec: &Decoder,
    dest: &mut Dest,
    pending: &mut Option<Header>,
    stage: &[u8],
    ok: bool,
) -> Result<bool, String> {
    match std::mem::replace(dest, Dest::Skip) {
        Dest::Skip => {
            if !ok {
                c.reject(RejectReason::DataDigestError, dec.bhs(), "a data digest error");
            }
            Ok(true)
        }
        Dest::Stage => {
            let h = pending.take().ok_or("data without its header")?;
            if !ok {
                // A non-data PDU with a digest error is discarded (RFC 7143 section 7.8).
                c.reject(RejectReason::DataDigestError, dec.bhs(), "a data digest error");
                if !h.pdu.immediate() {
                    c.finished(false);
                }
                return Ok(true);
            }
            staged(c, dec, &h, stage).await
        }
        Dest::Cmd { slot, gen, len, kind, .. } => {
            super::r2t::data_end(c, slot, gen, len, kind, ok, dec.bhs());
            Ok(true)
        }
    }
}

/// Checks a request's CmdSN: Ok(true) to serve it, Ok(false) to ignore it, Err to end the
/// connection.
fn cmd_sn(c: &Conn, pdu: &Pdu, cmd_sn: u32) -> Result<bool, String> {
    let nop = matches!(pdu, Pdu::NopOut(_));
    match c.seq.check(cmd_sn, pdu.immediate(), nop) {
        CmdSnVerdict::Accept => Ok(true),
        CmdSnVerdict::Drop => {
            ferrite_reactor::log_limited!(
                log::Level::Info,
                "iscsi connection {}: {} with CmdSN {cmd_sn} outside {}..={}; ignored",
                c.id,
                pdu.opcode(),
                c.seq.exp_cmd_sn(),
                c.seq.max_cmd_sn()
            );
            Ok(false)
        }
        CmdSnVerdict::Fatal => {
            Err(format!("an immediate {} with CmdSN {cmd_sn}, ExpCmdSN {}", pdu.opcode(), c.seq.exp_cmd_sn()))
        }
    }
}

/// A header arrived: serves it, or says where its data goes first.
fn on_header(c: &Rc<Conn>, dec: &Decoder, h: Header) -> Result<Dest, String> {
    if c.stage.get() == Stage::Login {
        return match h.pdu {
            Pdu::LoginRequest(_) => Ok(Dest::Stage),
            other => Err(format!("{} during login", other.opcode())),
        };
    }
    let bhs = dec.bhs();
    match h.pdu {
        Pdu::ScsiCommand(cmd) => super::task::on_command(c, &cmd, &h, dec.ahs(), bhs),
        Pdu::DataOut(d) => super::r2t::on_data_out(c, &d, h.data_len, bhs),
        Pdu::NopOut(n) => Ok(if cmd_sn(c, &h.pdu, n.cmd_sn)? { Dest::Stage } else { Dest::Skip }),
        Pdu::TextRequest(t) => Ok(if cmd_sn(c, &h.pdu, t.cmd_sn)? { Dest::Stage } else { Dest::Skip }),
        Pdu::TaskMgmtRequest(t) => {
            if cmd_sn(c, &h.pdu, t.cmd_sn)? {
                super::tmf::on_request(c, &t, bhs);
            }
            Ok(Dest::Skip)
        }
        Pdu::LogoutRequest(l) => Ok(if cmd_sn(c, &h.pdu, l.cmd_sn)? { Dest::Stage } else { Dest::Skip }),
        Pdu::LoginRequest(_) => {
            c.reject(RejectReason::ProtocolError, bhs, "a Login Request in the full feature phase");
            Ok(Dest::Skip)
        }
        Pdu::Snack(_) => {
            c.reject(RejectReason::ProtocolError, bhs, "a SNACK at ErrorRecoveryLevel 0");
            Ok(Dest::Skip)
        }
        other => {
            // The decoder lets only initiator opcodes through.
            c.reject(RejectReason::ProtocolError, bhs, &format!("{} from an initiator", other.opcode()));
            Ok(Dest::Skip)
        }
    }
}

/// A staged request with its whole data. False once the connection ends.
async fn staged(c: &Rc<Conn>, dec: &Decoder, h: &Header, data: &[u8]) -> Result<bool, String> {
    let bhs: &[u8; BHS_LEN] = dec.bhs();
    match h.pdu {
        Pdu::LoginRequest(req) => super::login::on_request(c, &req, data),
        Pdu::NopOut(n) => {
            super::nop::on_nop_out(c, &n, data);
            Ok(true)
        }
        Pdu::TextRequest(t) => {
            super::text::on_request(c, &t, data, bhs);
            Ok(true)
        }
        Pdu::LogoutRequest(l) => super::logout::on_request(c, &l).await,
        _ => Ok(true),
    }
}
