//! One NVMe/TCP connection, which is one queue pair, owned by one reactor.
//!
//! Two local tasks share it. The reader decodes PDUs from chunks received into the reactor's
//! provided buffer ring: ICReq, command capsules (with in-capsule data placed in the command's
//! buffer), H2CData answering R2Ts; it runs commands (Fabrics, admin or I/O, see `exec`) when
//! their data is in. Completions queue the PDUs to send (R2T, C2HData, CapsuleResp); the
//! writer sends everything queued in one `sendmsg` (read data from the bdev's buffers, lent
//! memory for a zero-copy read, without a copy in Ferrite).

use super::ctrlr::Ctrlr;
use super::model::{Namespace, Trid};
use crate::rx::Rx;
use crate::spec::cqe::Cqe;
use crate::spec::sqe::Sqe;
use crate::spec::status::{generic, Status};
use crate::tcp::pdu::{CAPSULE_CMD_HLEN, CH_LEN};
use crate::tcp::{controller_accept, encode, ControllerConfig, Decoder, Event, Negotiated, Pdu, PduError, Role, Want};
use ferrite_bdev::IoChannel;
use ferrite_reactor::net::{SendCache, Socket};
use ferrite_reactor::IoBuf;
use ferrite_target::table::{ConnTable, Served, WatchdogOptions};
use ferrite_target::{ConnCore, SlotTable};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Time from accept to a successful Connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a batch of PDUs may take to be sent: this, plus 1 s per MiB.
const SEND_BASE_TIME: Duration = Duration::from_secs(30);
/// How long a command's data may take to arrive: this, plus 1 s per MiB.
const DATA_BASE_TIME: Duration = Duration::from_secs(10);
/// Bytes of write buffers one connection may hold for data it was asked for by R2T and has not
/// sent yet; past it, further writes wait for their R2T (`Conn::grant_buffers`), so that one
/// connection cannot take the whole pool by never sending (it would fail every other host's
/// writes until the data timeout closed it).
const R2T_BUDGET: usize = 8 << 20;
/// Largest admin command data (Get Log Page and Identify answers, Set Features data).
pub(crate) const MAX_ADMIN_DATA: u32 = 64 << 10;

/// Where a command stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The slot is free.
    Free,
    /// Waiting for a buffer for its data before its R2T goes out (the connection holds its
    /// budget of R2T buffers, or the pool is spent).
    Waiting,
    /// Waiting for its data (in-capsule or H2CData after an R2T).
    Receiving,
    /// Data in (or none); waiting for its fused partner.
    Ready,
    /// Running.
    Running,
}

/// Data direction of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Xfer {
    /// No data.
    None,
    /// Host to controller (the command's `buf`).
    ToCtrl,
    /// Controller to host.
    ToHost,
}

/// A command being served.
pub(crate) struct Cmd {
    pub(crate) sqe: Sqe,
    pub(crate) raw: [u8; 64],
    pub(crate) phase: Phase,
    pub(crate) xfer: Xfer,
    /// Data length from the SGL.
    pub(crate) len: u32,
    /// Host-to-controller data.
    pub(crate) buf: Option<IoBuf>,
    /// Bytes of `buf` received so far.
    pub(crate) got: u32,
    /// The namespace an I/O command addresses.
    pub(crate) ns: Option<Rc<NsChan>>,
    /// The fused partner's slot.
    pub(crate) partner: Option<u16>,
    /// A data digest error was seen on its data.
    pub(crate) digest_error: bool,
    /// A fused half whose other half did not follow it: it fails when it runs.
    pub(crate) fused_broken: bool,
    /// Tick at which it began to wait on the host (its R2T was queued, or its fused partner
    /// is missing); 0 while it does not. The watchdog bounds the wait.
    pub(crate) since: u64,
    /// Its buffer counts against the connection's R2T budget (`Conn::r2t_held`) until its
    /// data is in.
    pub(crate) budgeted: bool,
}

impl Cmd {
    fn free() -> Cmd {
        Cmd {
            sqe: Sqe::default(),
            raw: [0; 64],
            phase: Phase::Free,
            xfer: Xfer::None,
            len: 0,
            buf: None,
            got: 0,
            ns: None,
            partner: None,
            digest_error: false,
            fused_broken: false,
            since: 0,
            budgeted: false,
        }
    }
}

/// A namespace as one queue pair uses it: its channel on this reactor.
pub(crate) struct NsChan {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) ch: IoChannel,
    pub(crate) block_size: u32,
    /// I/O is refused with this path status (the listener's ANA state for the namespace's
    /// group is not optimized or non-optimized).
    pub(crate) inaccessible: Option<Status>,
}

/// PDUs ready to send for one command (or one R2T): a head, optional data with its digest,
/// and an optional response capsule after it.
pub(crate) struct Out {
    head: [u8; crate::tcp::encoder::MAX_HEAD_LEN],
    head_len: u8,
    data: SmallVec<[IoBuf; 2]>,
    ddgst: [u8; 4],
    has_ddgst: bool,
    resp: [u8; 32],
    resp_len: u8,
}

impl Out {
    fn empty() -> Out {
        Out {
            head: [0; crate::tcp::encoder::MAX_HEAD_LEN],
            head_len: 0,
            data: SmallVec::new(),
            ddgst: [0; 4],
            has_ddgst: false,
            resp: [0; 32],
            resp_len: 0,
        }
    }
}

/// State of the queue pair once connected.
pub(crate) struct Bound {
    pub(crate) ctrl: Arc<Ctrlr>,
    pub(crate) qid: u16,
    /// This queue pair's counters (read by the SMART log).
    pub(crate) stats: Arc<super::ctrlr::CtrlrStats>,
}

/// One connection: a queue pair.
pub(crate) struct Conn {
    /// Id, socket, peer, the flags of its end, its tasks' wakers, its send's progress.
    core: ConnCore,
    /// The listener it came through.
    pub(crate) trid: Trid,
    pub(crate) reactor: usize,
    /// Abort commands of this (admin) queue still being answered.
    pub(crate) aborts: Cell<u32>,
    /// What ICReq settled.
    pub(crate) params: Cell<Negotiated>,
    /// The controller and queue ID after Connect.
    pub(crate) bound: RefCell<Option<Bound>>,
    /// Queue entries (SQSIZE + 1) after Connect.
    pub(crate) sq_entries: Cell<u16>,
    sq_head: Cell<u16>,
    /// The host disabled SQ flow control and the transport allows C2HData SUCCESS.
    pub(crate) c2h_success: Cell<bool>,
    /// The controller's host as the bdev layer's reservation check knows it (set by
    /// Connect): each I/O request is stamped with it.
    pub(crate) who: Cell<Option<ferrite_bdev::InitiatorId>>,
    /// Commands by slot.
    pub(crate) cmds: RefCell<SlotTable<Cmd>>,
    pub(crate) in_flight: Cell<u32>,
    out: RefCell<Vec<Out>>,
    /// Bytes queued or being sent.
    unsent_bytes: Cell<usize>,
    /// Namespaces this queue pair used, by NSID, valid while the subsystem's epoch is.
    ns_cache: RefCell<Vec<(u32, Rc<NsChan>)>>,
    ns_epoch: Cell<u64>,
    /// Outstanding Asynchronous Event Requests (slots), admin queue only.
    pub(crate) aers: RefCell<Vec<u16>>,
    /// The last fused first command to arrive, until its second arrives (slot).
    pub(crate) fused_first: Cell<Option<u16>>,
    /// A protocol error found past the decoder, to report in a C2HTermReq.
    pub(crate) pending_term: Cell<Option<PduError>>,
    /// In-capsule data limit to apply from the next capsule (set by Connect).
    icd_limit: Cell<Option<u32>>,
    /// Bytes of write buffers given to commands whose R2T went out and whose data is not all
    /// in: what the host could hold by never sending (bounded by `R2T_BUDGET`).
    r2t_held: Cell<usize>,
    /// Commands waiting for a buffer before their R2T, oldest first (slots).
    buf_wait: RefCell<std::collections::VecDeque<u16>>,
    pub(crate) opts: super::model::TransportOpts,
}

ferrite_reactor::reactor_local! {
    /// This reactor's connections by ID.
    static LIVE: RefCell<ConnTable<Conn>> = const { RefCell::new(ConnTable::new()) };
}

impl std::ops::Deref for Conn {
    type Target = ConnCore;
    fn deref(&self) -> &ConnCore {
        &self.core
    }
}

/// Moves command `slot`'s phase to `to`, checking the change is one a command can make (see
/// [`Phase`]'s table).
#[inline(always)]
pub(crate) fn set_phase(cmd: &mut Cmd, to: Phase, conn: u64, slot: u16) {
    ferrite_target::transition(&mut cmd.phase, to, conn, u32::from(slot));
}

impl ferrite_target::Phase for Phase {
    fn may_become(self, to: Phase) -> bool {
        use Phase::*;
        matches!(
            (self, to),
            (Free, Running)
                | (Running, Receiving | Waiting | Ready | Free)
                | (Waiting, Receiving | Free)
                | (Receiving, Running | Free)
                | (Ready, Running | Free)
        )
    }
}

/// Connection IDs, unique in the process.
static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What `nvmf_subsystem_get_qpairs` shows of a connection.
#[derive(Debug, Clone)]
pub struct QpairInfo {
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller ID.
    pub cntlid: u16,
    /// Queue ID.
    pub qid: u16,
    /// Peer address.
    pub peer: String,
    /// Listener.
    pub trid: Trid,
    /// Reactor.
    pub reactor: usize,
}

/// This reactor's connected queue pairs.
pub(crate) fn local_qpairs() -> Vec<QpairInfo> {
    LIVE.with(|l| {
        l.borrow()
            .all()
            .iter()
            .filter_map(|c| {
                c.bound.borrow().as_ref().map(|b| QpairInfo {
                    subnqn: b.ctrl.subnqn.clone(),
                    cntlid: b.ctrl.cntlid,
                    qid: b.qid,
                    peer: c.peer.clone(),
                    trid: c.trid.clone(),
                    reactor: c.reactor,
                })
            })
            .collect()
    })
}

/// Closes this reactor's connections that `pred` selects; returns how many.
pub(crate) fn close_local(pred: &dyn Fn(&Conn) -> bool) -> usize {
    ferrite_target::table::close_where(&LIVE, pred)
}

/// Drops every cached namespace of this reactor's queue pairs (a namespace was removed: its
/// channels must go so that its bdev can close).
pub(crate) fn purge_namespaces_local() {
    let cs: Vec<Rc<Conn>> = LIVE.with(|l| l.borrow().all());
    for c in cs {
        c.ns_cache.borrow_mut().clear();
    }
}

/// A command of this reactor a Preempt and Abort waits for: (connection ID, slot, CID).
pub(crate) type Waited = (u64, u16, u16);

/// The commands of this reactor's queue pairs of subsystem `subnqn` whose host is one of
/// `hosts` and that address namespace `nsid`, whatever their phase: what a Preempt and Abort
/// waits for (SPDK's `poll_group_reservation_build_io_waiting`, which leaves out Reservation
/// Register, Acquire and Release: they would wait for each other).
pub(crate) fn preempted_in_flight(subnqn: &str, nsid: u32, hosts: &[ferrite_bdev::InitiatorId]) -> Vec<Waited> {
    use crate::spec::opcode::nvm;
    let cs: Vec<Rc<Conn>> = LIVE.with(|l| l.borrow().all());
    let mut out = Vec::new();
    for c in cs {
        let ours = c.bound.borrow().as_ref().is_some_and(|b| b.qid != 0 && b.ctrl.subnqn == subnqn)
            && c.who.get().is_some_and(|w| hosts.contains(&w));
        if !ours {
            continue;
        }
        for (i, x) in c.cmds.borrow().iter() {
            let waits = !matches!(
                x.sqe.opcode,
                nvm::RESERVATION_REGISTER | nvm::RESERVATION_ACQUIRE | nvm::RESERVATION_RELEASE
            );
            if x.phase != Phase::Free && x.sqe.nsid == nsid && waits {
                out.push((c.id, i as u16, x.sqe.cid));
            }
        }
    }
    out
}

/// Those of `waited` (found by `preempted_in_flight` on this reactor) not completed yet: the
/// connection is open and the slot still holds the command (busy, same CID).
pub(crate) fn still_in_flight(waited: &[Waited]) -> Vec<Waited> {
    waited
        .iter()
        .copied()
        .filter(|&(conn, slot, cid)| {
            LIVE.with(|l| l.borrow().get(conn)).is_some_and(|c| {
                !c.is_dead()
                    && c.cmds.borrow().get(u32::from(slot)).is_some_and(|x| x.phase != Phase::Free && x.sqe.cid == cid)
            })
        })
        .collect()
}

/// Delivers a controller's pending asynchronous events to its outstanding AERs (runs on the
/// admin queue's reactor).
pub(crate) fn deliver_events(ctrl: &Arc<Ctrlr>) {
    let Some(c) = LIVE.with(|l| l.borrow().get(ctrl.admin_conn)) else { return };
    c.deliver_events();
}

impl Conn {
    /// The controller, once connected.
    pub(crate) fn ctrl(&self) -> Option<Arc<Ctrlr>> {
        self.bound.borrow().as_ref().map(|b| b.ctrl.clone())
    }

    /// The queue ID, once connected.
    pub(crate) fn qid(&self) -> Option<u16> {
        self.bound.borrow().as_ref().map(|b| b.qid)
    }

    fn take_slot(&self) -> Option<u16> {
        let cap = usize::from(self.sq_entries.get().max(1));
        let i = self.cmds.borrow_mut().take(cap, Cmd::free)?;
        self.in_flight.set(self.in_flight.get() + 1);
        Some(i as u16)
    }

    fn release(&self, slot: u16) {
        // A buffer it still held against the R2T budget goes back (and may go to a waiting
        // command) once the slot is free.
        let (partner, was_waiting) = {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            let was_waiting = c.phase == Phase::Waiting;
            set_phase(c, Phase::Free, self.id, slot);
            c.buf = None;
            c.ns = None;
            (c.partner.take(), was_waiting)
        };
        if was_waiting {
            self.buf_wait.borrow_mut().retain(|&s| s != slot);
        }
        if self.fused_first.get() == Some(slot) {
            self.fused_first.set(None);
        }
        // A fused half that ends on its own leaves the other one without its pair.
        if let Some(p) = partner {
            let linked = self.cmds.borrow().get(u32::from(p)).is_some_and(|x| x.partner == Some(slot));
            if linked {
                self.cmds.borrow_mut()[usize::from(p)].partner = None;
                self.break_fused(p);
            }
        }
        self.cmds.borrow_mut().release(u32::from(slot));
        self.in_flight.set(self.in_flight.get() - 1);
        if self.is_closing() && self.in_flight.get() == 0 {
            self.wake();
        }
        self.release_budget(slot);
    }

    /// The command in `slot` waits for a buffer for its data; the buffer and the R2T come in
    /// arrival order, as the connection's budget and the pool allow (`grant_buffers`).
    pub(crate) fn wait_for_buffer(&self, slot: u16) {
        {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            set_phase(c, Phase::Waiting, self.id, slot);
            c.since = ferrite_reactor::tsc::ticks();
        }
        self.buf_wait.borrow_mut().push_back(slot);
        self.grant_buffers();
    }

    /// Gives the waiting commands their buffers and sends their R2Ts, oldest first, while the
    /// connection's R2T budget and the pool last (one command at a time may exceed the budget
    /// alone). What is left waits for this connection's data to come in, or for the watchdog's
    /// next look (when other connections gave buffers back to the pool).
    pub(crate) fn grant_buffers(&self) {
        loop {
            if self.is_closing() || self.is_dead() {
                return;
            }
            let Some(slot) = self.buf_wait.borrow().front().copied() else { return };
            let len = self.cmds.borrow()[usize::from(slot)].len as usize;
            let held = self.r2t_held.get();
            if held > 0 && held + len > R2T_BUDGET {
                return;
            }
            let Some(buf) = ferrite_reactor::try_alloc_buf(len) else {
                ferrite_reactor::log_limited!(
                    log::Level::Warn,
                    "nvmf connection {}: no memory for {len} bytes of write data; the command waits",
                    self.id
                );
                return;
            };
            self.buf_wait.borrow_mut().pop_front();
            {
                let mut cmds = self.cmds.borrow_mut();
                let c = &mut cmds[usize::from(slot)];
                c.buf = Some(buf);
                set_phase(c, Phase::Receiving, self.id, slot);
                c.budgeted = true;
            }
            self.r2t_held.set(held + len);
            self.start_receive(slot, false);
        }
    }

    /// The buffer of the command in `slot` no longer counts against the R2T budget (its data is
    /// all in, or the command ended), and waiting commands may get theirs.
    pub(crate) fn release_budget(&self, slot: u16) {
        let budget = {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            if std::mem::take(&mut c.budgeted) {
                c.len as usize
            } else {
                0
            }
        };
        if budget > 0 {
            self.r2t_held.set(self.r2t_held.get() - budget);
            self.grant_buffers();
        }
    }

    /// Pairs fused halves as their capsules arrive (NVMe: the second immediately follows the
    /// first in the queue), whatever order their data comes in.
    pub(crate) fn pair_fused(&self, slot: u16, fuse: crate::spec::sqe::Fuse) {
        use crate::spec::sqe::Fuse;
        match fuse {
            Fuse::First => {
                if let Some(prev) = self.fused_first.replace(Some(slot)) {
                    self.break_fused(prev);
                }
            }
            Fuse::Second => match self.fused_first.take() {
                Some(first) => {
                    let mut cmds = self.cmds.borrow_mut();
                    cmds[usize::from(first)].partner = Some(slot);
                    cmds[usize::from(slot)].partner = Some(first);
                }
                None => self.cmds.borrow_mut()[usize::from(slot)].fused_broken = true,
            },
            _ => {
                if let Some(prev) = self.fused_first.take() {
                    self.break_fused(prev);
                }
            }
        }
    }

    /// A fused half lost its pair: it fails with Aborted Missing Fused now if it waits, or
    /// when its data is in.
    fn break_fused(&self, slot: u16) {
        let waiting = {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            c.fused_broken = true;
            c.partner = None;
            c.phase == Phase::Ready
        };
        if waiting {
            self.complete(slot, Status::generic(generic::ABORTED_MISSING_FUSED), 0, None);
        }
    }

    /// Unlinks a fused pair that completes together.
    pub(crate) fn unpair(&self, slot: u16) {
        let mut cmds = self.cmds.borrow_mut();
        if let Some(p) = cmds[usize::from(slot)].partner.take() {
            cmds[usize::from(p)].partner = None;
        }
    }

    /// The next SQHD (SPDK advances it as each response goes out).
    fn next_sqhd(&self) -> u16 {
        let n = self.sq_entries.get().max(1);
        let h = (self.sq_head.get() + 1) % n;
        self.sq_head.set(h);
        h
    }

    fn push_out(&self, o: Out) {
        let bytes = o.head_len as usize
            + o.data.iter().map(|d| d.len()).sum::<usize>()
            + if o.has_ddgst { 4 } else { 0 }
            + o.resp_len as usize;
        self.unsent_bytes.set(self.unsent_bytes.get() + bytes);
        self.out.borrow_mut().push(o);
        self.wake_writer();
    }

    /// Completes the command in `slot` with `status` (and `dw0`); `data` is what a successful
    /// controller-to-host command returns (at most the command's length is sent). Frees the
    /// slot.
    pub(crate) fn complete(&self, slot: u16, status: Status, dw0: u32, data: Option<SmallVec<[IoBuf; 2]>>) {
        self.complete_full(slot, status, dw0, 0, data)
    }

    /// Completes with a 64-bit result (Property Get of an 8-byte property).
    pub(crate) fn complete_with_dw1(&self, slot: u16, dw0: u32, dw1: u32) {
        self.complete_full(slot, Status::SUCCESS, dw0, dw1, None)
    }

    fn complete_full(&self, slot: u16, status: Status, dw0: u32, dw1: u32, data: Option<SmallVec<[IoBuf; 2]>>) {
        let (cid, xfer, len) = {
            let cmds = self.cmds.borrow();
            let c = &cmds[usize::from(slot)];
            (c.sqe.cid, c.xfer, c.len)
        };
        if !status.is_success() {
            if let Some(ctrl) = self.ctrl() {
                ctrl.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.release(slot);
        if self.is_dead() {
            return;
        }
        let params = self.params.get();
        let mut o = Out::empty();
        let mut send_resp = true;
        if let (true, Xfer::ToHost, Some(mut bufs)) = (status.is_success(), xfer, data) {
            // Send at most what the host asked for.
            let mut left = len as usize;
            for b in bufs.iter_mut() {
                if b.len() > left {
                    trim(b, left);
                }
                left -= b.len();
            }
            bufs.retain(|b| !b.is_empty());
            let mut total: usize = bufs.iter().map(|b| b.len()).sum();
            if total > 0 && total < len as usize {
                // An answer shorter than the host's buffer (an Identify into 8 KiB): zeroes to
                // its end, as SPDK's target sends, so that the host sees its whole buffer
                // written and not a short transfer.
                let mut pad = ferrite_reactor::alloc_buf(len as usize - total);
                pad.set_len(len as usize - total);
                pad.fill(0);
                bufs.push(pad);
                total = len as usize;
            }
            if total > 0 {
                let success = self.c2h_success.get() && dw0 == 0;
                let pdu = Pdu::C2hData(crate::tcp::C2hData {
                    cccid: cid,
                    datao: 0,
                    datal: total as u32,
                    last: true,
                    success,
                });
                let pieces: SmallVec<[&[u8]; 2]> = bufs.iter().map(|b| &b[..]).collect();
                match encode(&mut o.head, &params, &pdu, &pieces) {
                    Ok(f) => {
                        o.head_len = f.head_len as u8;
                        if let Some(d) = f.data_digest {
                            o.ddgst = d;
                            o.has_ddgst = true;
                        }
                        drop(pieces);
                        o.data = bufs;
                        send_resp = !success;
                    }
                    Err(e) => {
                        log::warn!("nvmf connection {}: cannot frame C2HData: {e}", self.id);
                    }
                }
            }
        }
        if send_resp {
            let mut cqe = Cqe::new(cid, status);
            cqe.dw0 = dw0;
            cqe.dw1 = dw1;
            cqe.sqid = self.qid().unwrap_or(0);
            cqe.sqhd = if self.c2h_success.get() { 0xffff } else { self.next_sqhd() };
            let pdu = Pdu::CapsuleResp(crate::tcp::CapsuleResp { cqe: cqe.to_bytes() });
            match encode(&mut o.resp, &params, &pdu, &[]) {
                Ok(f) => o.resp_len = f.head_len as u8,
                Err(e) => log::warn!("nvmf connection {}: cannot frame a response: {e}", self.id),
            }
        } else if !self.c2h_success.get() {
            self.next_sqhd();
        }
        self.push_out(o);
    }

    /// Queues an R2T asking for the rest of the data of the command in `slot`.
    fn send_r2t(&self, slot: u16) {
        let (cid, got, len) = {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            c.since = ferrite_reactor::tsc::ticks();
            (c.sqe.cid, c.got, c.len)
        };
        let pdu = Pdu::R2t(crate::tcp::R2t { cccid: cid, ttag: slot, r2to: got, r2tl: len - got });
        let mut o = Out::empty();
        match encode(&mut o.head, &self.params.get(), &pdu, &[]) {
            Ok(f) => o.head_len = f.head_len as u8,
            Err(e) => {
                log::warn!("nvmf connection {}: cannot frame R2T: {e}", self.id);
                return;
            }
        }
        self.push_out(o);
    }

    /// Completes pending AERs with pending events.
    pub(crate) fn deliver_events(&self) {
        let Some(ctrl) = self.ctrl() else { return };
        loop {
            if self.aers.borrow().is_empty() {
                return;
            }
            let Some(ev) = ctrl.regs.lock().unwrap().pending.pop_front() else { return };
            let slot = self.aers.borrow_mut().remove(0);
            self.complete(slot, Status::SUCCESS, ev.to_dw0(), None);
        }
    }

    /// The namespace `nsid` as this queue pair uses it, or the status to fail the command with.
    pub(crate) fn namespace(&self, nsid: u32) -> Result<Rc<NsChan>, Status> {
        // The controller is borrowed, not cloned: its reference count is shared with queue
        // pairs on other cores, and an atomic add per I/O would bounce its cache line.
        let epoch = match self.bound.borrow().as_ref() {
            Some(b) => b.ctrl.subsys.epoch.load(Ordering::Acquire),
            None => return Err(Status::generic(generic::COMMAND_SEQUENCE_ERROR)),
        };
        if epoch != self.ns_epoch.get() {
            self.ns_cache.borrow_mut().clear();
            self.ns_epoch.set(epoch);
        }
        // A queue pair uses few namespaces: a short list beats hashing on every I/O.
        if let Some((_, n)) = self.ns_cache.borrow().iter().find(|(id, _)| *id == nsid) {
            return Ok(n.clone());
        }
        let ctrl = self.ctrl().ok_or(Status::generic(generic::COMMAND_SEQUENCE_ERROR))?;
        let invalid = Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr();
        let (ns, state) = {
            let t = super::model::tables();
            let s = t.subsystem(&ctrl.subnqn).ok_or(invalid)?;
            let ns = s.namespaces.get(&nsid).cloned().ok_or(invalid)?;
            let state = s.listener(&self.trid).map(|l| l.ana_state(ns.anagrpid));
            (ns, state)
        };
        let inaccessible = match state {
            None => Some(Status::path(crate::spec::status::path::ASYMMETRIC_ACCESS_INACCESSIBLE)),
            Some(s) if !s.serves_io() => Some(Status::path(match s {
                super::model::AnaState::PersistentLoss => crate::spec::status::path::ASYMMETRIC_ACCESS_PERSISTENT_LOSS,
                super::model::AnaState::Change => crate::spec::status::path::ASYMMETRIC_ACCESS_TRANSITION,
                _ => crate::spec::status::path::ASYMMETRIC_ACCESS_INACCESSIBLE,
            })),
            Some(_) => None,
        };
        let ch = ns.desc.channel().map_err(|e| {
            log::warn!("nvmf connection {}: namespace {nsid}: {e}", self.id);
            Status::generic(generic::NAMESPACE_NOT_READY)
        })?;
        let n = Rc::new(NsChan { block_size: ns.bdev().block_size(), ns, ch, inaccessible });
        self.ns_cache.borrow_mut().push((nsid, n.clone()));
        Ok(n)
    }
}

/// Shortens a buffer to `len` bytes (a slice of it when it is shared or lent).
fn trim(b: &mut IoBuf, len: usize) {
    b.set_len(len);
}

/// The reactor's watchdog: once a second it closes connections that did not connect in time,
/// whose controller is gone or whose keep-alive expired, and those whose host stopped reading.
const WATCHDOG: WatchdogOptions = WatchdogOptions { period: Duration::from_secs(1), proto: "nvmf" };

impl Served for Conn {
    fn core(&self) -> &ConnCore {
        &self.core
    }

    fn watch(&self, now: u64) {
        let bound = self.bound.borrow().as_ref().map(|b| (b.ctrl.clone(), b.qid));
        if let Some((ctrl, qid)) = bound {
            if ctrl.is_dead() {
                self.close();
            } else if qid == 0 && ctrl.keep_alive_expired() {
                log::warn!(
                    "nvmf controller {} of {} (host {}): keep-alive timeout expired; closing it",
                    ctrl.cntlid,
                    ctrl.subnqn,
                    ctrl.hostnqn
                );
                super::exec::destroy_ctrlr(&ctrl);
                self.close();
            }
        }
        if !self.is_dead() {
            self.bound_host_waits(now);
        }
        if self.sending.stalled(now, SEND_BASE_TIME, Duration::from_secs(1)) {
            log::warn!("nvmf connection {}: the host has not read its data in time; closing", self.id);
            self.close();
        }
    }
}

impl Conn {
    /// Bounds what waits on the host (once a second, from the watchdog): a command whose R2T
    /// went out and whose data has not all come within 10 s + 1 s/MiB closes the connection
    /// (it holds a write buffer from the pool or the heap budget, and a host could hold them
    /// all by never answering); a fused half whose partner has not come in that time fails as
    /// Aborted Missing Fused. Not while the reader is paused (the host is not reading; the send
    /// watchdog bounds that).
    fn bound_host_waits(&self, now: u64) {
        use ferrite_reactor::tsc::duration_to_ticks;
        if self.in_flight.get() == 0 || self.unsent_bytes.get() > MAX_UNSENT {
            return;
        }
        // Buffers other connections gave back to the pool since.
        self.grant_buffers();
        let admin = self.qid().is_none_or(|q| q == 0);
        let mut late_data = None;
        let mut late_fused = SmallVec::<[u16; 4]>::new();
        let mut late_buffer = SmallVec::<[u16; 4]>::new();
        for (i, x) in self.cmds.borrow().iter() {
            if x.since == 0 {
                continue;
            }
            let limit = duration_to_ticks(DATA_BASE_TIME + Duration::from_secs(u64::from(x.len >> 20)));
            if now.saturating_sub(x.since) <= limit {
                continue;
            }
            match x.phase {
                Phase::Receiving => late_data = Some((x.sqe.cid, x.got, x.len)),
                Phase::Waiting => late_buffer.push(i as u16),
                Phase::Ready if !admin && x.partner.is_none() => late_fused.push(i as u16),
                _ => {}
            }
        }
        if let Some((cid, got, len)) = late_data {
            log::warn!(
                "nvmf connection {} from {}: command {cid} has {got} of its {len} bytes of data {:?} after its R2T; closing",
                self.id,
                self.peer,
                DATA_BASE_TIME + Duration::from_secs(u64::from(len >> 20)),
            );
            self.close();
            return;
        }
        if !late_buffer.is_empty() {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "nvmf connection {}: {} writes found no buffer for their data in time; failed as Command Interrupted",
                self.id,
                late_buffer.len()
            );
        }
        for slot in late_buffer {
            // Retryable: the host sends it again later.
            self.complete(slot, Status::generic(crate::spec::status::generic::COMMAND_INTERRUPTED), 0, None);
        }
        for slot in late_fused {
            log::info!("nvmf connection {}: a fused command waited too long for its other half", self.id);
            if self.fused_first.get() == Some(slot) {
                self.fused_first.set(None);
            }
            self.break_fused(slot);
        }
    }
}

/// Serves one accepted connection to the end (a task on the reactor that owns it); `_slot`
/// (the listener's connection count) is given back when it ends.
pub(crate) async fn serve<G>(sock: Socket, peer: String, trid: Trid, _slot: G) {
    let reactor = ferrite_reactor::current().unwrap_or(0);
    let opts = super::model::tables().transport_opts();
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let c = Rc::new(Conn {
        core: ConnCore::new("nvmf", id, sock, peer.clone()),
        trid,
        reactor,
        aborts: Cell::new(0),
        params: Cell::new(Negotiated::INITIAL),
        bound: RefCell::new(None),
        sq_entries: Cell::new(1),
        sq_head: Cell::new(0),
        c2h_success: Cell::new(false),
        who: Cell::new(None),
        cmds: RefCell::new(SlotTable::default()),
        in_flight: Cell::new(0),
        out: RefCell::new(Vec::new()),
        unsent_bytes: Cell::new(0),
        ns_cache: RefCell::new(Vec::new()),
        ns_epoch: Cell::new(u64::MAX),
        aers: RefCell::new(Vec::new()),
        fused_first: Cell::new(None),
        pending_term: Cell::new(None),
        icd_limit: Cell::new(None),
        r2t_held: Cell::new(0),
        buf_wait: RefCell::new(std::collections::VecDeque::new()),
        opts,
    });
    // Connect must come in time (the kit's watchdog closes the connection otherwise).
    c.handshake_within(CONNECT_TIMEOUT);
    ferrite_target::table::register(&LIVE, c.clone(), WATCHDOG);
    log::info!("nvmf connection {id} from {peer} on reactor {reactor}");
    let writer_task = ferrite_reactor::spawn_local(writer(c.clone()));
    if let Err(e) = reader(&c).await {
        if !c.is_closing() {
            log::info!("nvmf connection {id}: {e}");
        }
        // The host is gone or broke the protocol: nothing more is sent, and a send blocked on
        // a host that does not read ends now.
        c.close();
    }
    c.stop_taking();
    // Commands that wait on the host (AERs, a fused first, data still to come) end here.
    let waiting: Vec<u16> = c
        .cmds
        .borrow()
        .iter()
        .filter(|(_, x)| matches!(x.phase, Phase::Ready | Phase::Receiving | Phase::Waiting))
        .map(|(i, _)| i as u16)
        .collect();
    c.aers.borrow_mut().clear();
    c.fused_first.set(None);
    for slot in waiting {
        c.release(slot);
    }
    // Requests still waiting (for memory, in a delay bdev) are asked to end. A request caught
    // between two layers at that instant (a delay bdev's, on its way back from its base and
    // not yet held) is not found: ask again a few times while the writer waits for them.
    abort_in_flight(&c);
    let again = c.clone();
    ferrite_reactor::spawn_local(async move {
        for ms in [1, 10, 100, 1000] {
            ferrite_reactor::sleep(Duration::from_millis(ms)).await;
            if again.in_flight.get() == 0 {
                return;
            }
            abort_in_flight(&again);
        }
    })
    .detach();
    c.wake();
    writer_task.await;
    c.sock.shutdown();
    super::exec::disconnected(&c);
    // The command table stays: requests still in the bdev layer complete into it (and are
    // dropped, the connection being dead).
    c.ns_cache.borrow_mut().clear();
    ferrite_target::table::unregister(&LIVE, id);
    log::info!("nvmf connection {id} closed");
}

/// Aborts command `cid` of connection `conn` of this reactor (an Abort from its admin queue):
/// a running command's bdev requests are asked to end (they complete as Aborted By Request
/// through the usual path); one still receiving its data, or waiting for its fused partner,
/// is waited for up to `wait`. True if something was aborted.
pub(crate) async fn abort_command(conn: u64, cid: u16, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut poll = Duration::from_millis(1);
    loop {
        let Some(c) = LIVE.with(|l| l.borrow().get(conn)) else { return false };
        if c.is_dead() {
            return false;
        }
        let found = c
            .cmds
            .borrow()
            .iter()
            .find(|(_, x)| x.phase != Phase::Free && x.sqe.cid == cid)
            .map(|(i, x)| (i as u16, x.phase, x.ns.clone()));
        match found {
            Some((slot, Phase::Running, Some(n))) => {
                let done = n.ch.submit_wait(ferrite_bdev::IoRequest::abort(&c, u64::from(slot))).await;
                return done.status.is_ok();
            }
            Some((_, Phase::Waiting | Phase::Receiving | Phase::Ready, _)) if Instant::now() < deadline => {
                drop(c);
                // Looks again soon, then less and less often (up to every 32 ms).
                ferrite_reactor::sleep(poll).await;
                poll = (poll * 2).min(Duration::from_millis(32));
            }
            _ => return false,
        }
    }
}

/// Asks the bdev layer to abort every request of the connection still in flight: one abort of
/// all per namespace channel its running commands use.
fn abort_in_flight(c: &Rc<Conn>) {
    let mut chans: SmallVec<[IoChannel; 4]> = SmallVec::new();
    let mut seen: SmallVec<[*const NsChan; 4]> = SmallVec::new();
    for (_, x) in c.cmds.borrow().iter() {
        if let (Phase::Running, Some(n)) = (x.phase, &x.ns) {
            if !seen.contains(&Rc::as_ptr(n)) {
                seen.push(Rc::as_ptr(n));
                chans.push(n.ch.clone());
            }
        }
    }
    ferrite_target::abort_all(c, &chans);
}

/// Sends every queued PDU, batch by batch, until the connection closes and drains.
async fn writer(c: Rc<Conn>) {
    let mut batch: Vec<Out> = Vec::new();
    let mut parts: Vec<(*const u8, usize)> = Vec::new();
    let cache = SendCache::default();
    loop {
        let done = poll_fn(|cx| {
            if !c.out.borrow().is_empty() {
                return Poll::Ready(false);
            }
            if c.is_closing() && (c.in_flight.get() == 0 || c.is_dead()) {
                return Poll::Ready(true);
            }
            c.park_writer(cx);
            Poll::Pending
        })
        .await;
        if done {
            return;
        }
        std::mem::swap(&mut *c.out.borrow_mut(), &mut batch);
        let bytes = c.unsent_bytes.replace(0);
        if c.is_dead() {
            batch.clear();
            continue;
        }
        parts.clear();
        for o in &batch {
            parts.push((o.head.as_ptr(), o.head_len as usize));
            for d in &o.data {
                ferrite_reactor::buf::warm_lent(d);
                parts.push((d.as_ptr(), d.len()));
            }
            if o.has_ddgst {
                parts.push((o.ddgst.as_ptr(), 4));
            }
        }
        // Response capsules go after all the batch's data PDUs (each still after its own
        // command's data): a host that reads its socket in fixed chunks (SPDK's reads 8 C2HData
        // PDUs of 4 KiB at a time) then finds whole data PDUs in them instead of PDUs cut by
        // 24-byte responses, and SPDK's host ends a polling pass at a cut PDU: with responses
        // between the data it took 8 completions per pass and sent 8 commands per send, at
        // any queue depth.
        for o in &batch {
            parts.push((o.resp.as_ptr(), o.resp_len as usize));
        }
        c.sending.begin(bytes);
        // SAFETY: every part points into `batch` (arrays inside its heap buffer, data in
        // buffers it owns), which send_parts keeps until the send completes.
        let (res, b) = unsafe { c.sock.send_parts(&cache, &parts, batch).await };
        c.sending.end();
        batch = b;
        batch.clear();
        c.wake_reader();
        if let Err(e) = res {
            if !c.is_closing() {
                log::info!("nvmf connection {}: send failed: {e}", c.id);
            }
            c.close();
        }
    }
}

/// Queued bytes past which the reader stops reading (the host must read its data first).
const MAX_UNSENT: usize = 8 << 20;

/// Data a connection's receive is waiting to place.
#[derive(Clone, Copy)]
enum Dest {
    /// A command's buffer from this offset.
    Cmd { slot: u16, at: u32 },
    /// Nowhere (a failed command's data, a TermReq's copy of a header).
    Skip,
}

/// Sends a C2HTermReq for `e` (its data: the offending header) and ends the connection.
async fn terminate(c: &Conn, dec: &Decoder, e: PduError) -> String {
    let mut buf = [0u8; 256];
    // Not in the middle of the writer's send (the two would interleave on the wire): wait until
    // it is idle, at most a second (a host that does not read gets no TermReq).
    let deadline = Instant::now() + Duration::from_secs(1);
    while (!c.out.borrow().is_empty() || c.sending.get().is_some()) && Instant::now() < deadline {
        ferrite_reactor::sleep(Duration::from_millis(1)).await;
    }
    let idle = c.out.borrow().is_empty() && c.sending.get().is_none();
    // The TermReq is the last PDU: commands that complete from here on send nothing (a
    // read's data after it would reach a host that takes the connection as ended).
    c.set_dead();
    if let (true, Some(fes)) = (idle, e.fes()) {
        if let Ok(n) = crate::tcp::encode_term_req(&mut buf, Role::Controller, fes, e.fei(), dec.received_header()) {
            let _ = c.sock.send_all_by(buf[..n].to_vec(), Instant::now() + Duration::from_secs(1)).await;
        }
    }
    format!("protocol error: {e}; sent C2HTermReq")
}

/// Commands served before the reader lets the rest of a turn run (see `reader`).
const HANDOFF_MIN: usize = 16;
/// A command capsule without data (what `reader` counts a chunk's remaining bytes in).
const CAPSULE_LEN: usize = CAPSULE_CMD_HLEN as usize;

/// A header passed the decoder but not the command state (`msg` says why): a termination
/// request names it, when one applies. Returns why the connection ends.
async fn refused(c: &Conn, dec: &Decoder, msg: String) -> String {
    match c.pending_term.take() {
        Some(e) => format!("{msg}; {}", terminate(c, dec, e).await),
        None => msg,
    }
}

/// Reads and runs commands until the host disconnects, errs or the connection closes.
async fn reader(c: &Rc<Conn>) -> Result<(), String> {
    let mut rx = Rx::new(&c.sock);
    let mut dec = Decoder::new(Role::Controller);
    let mut dest = Dest::Skip;
    // Commands taken from the chunks since the reader last let the turn end.
    let mut served = 0usize;
    loop {
        if c.is_closing() {
            return Ok(());
        }
        // Back-pressure: the host is not reading what it asked for.
        if c.unsent_bytes.get() > MAX_UNSENT && !rx.has_buffered() {
            rx.pause();
            poll_fn(|cx| {
                if c.is_closing() || c.unsent_bytes.get() <= MAX_UNSENT {
                    return Poll::Ready(());
                }
                c.park_reader(cx);
                Poll::Pending
            })
            .await;
            continue;
        }
        // Connect set the queue's in-capsule limit: it holds from the next header on.
        if let Some(limit) = c.icd_limit.take() {
            dec.set_max_icd(limit);
        }
        match dec.want() {
            Want::Closed => return Err("decoder stopped".into()),
            Want::Bytes(_) => {
                let chunk = rx.chunk().await?;
                // Most PDUs are command capsules whose header is all in the chunk: run them
                // from it (the decoder checks as `feed` would; anything else goes through it).
                if let Some((n, icd)) = dec.capsule_in_place(chunk) {
                    let raw: &[u8; 64] = chunk[CH_LEN..CH_LEN + 64].try_into().expect("64 bytes");
                    let res = super::exec::capsule(c, raw, icd);
                    chunk.consume(n);
                    match res {
                        Ok(d) => dest = d.map_or(Dest::Skip, |d| Dest::Cmd { slot: d.slot, at: 0 }),
                        Err(msg) => return Err(refused(c, &dec, msg).await),
                    }
                    // A receive that brought many commands without data (reads) is served
                    // in halves: after half of them (16 at least) the reader lets the turn
                    // end, so the first half's completions (the bdev layer runs them in this
                    // turn's pollers) are sent while the rest run. Served all at once, a host
                    // at QD 32 got its 32 replies in one piece and sent its next 32 in one
                    // piece: the two ends took turns, each idle while the other worked.
                    // Commands with data are not counted (each brings its own receive work,
                    // and splitting their batches only made more, smaller sends).
                    let left = chunk.len() / CAPSULE_LEN;
                    served = if icd == 0 { served + 1 } else { 0 };
                    if served >= HANDOFF_MIN && served >= left {
                        served = 0;
                        ferrite_reactor::next_turn().await;
                    } else if left == 0 {
                        served = 0;
                    }
                    continue;
                }
                let fed = match dec.feed(chunk) {
                    Ok(f) => f,
                    Err(e) => return Err(terminate(c, &dec, e).await),
                };
                chunk.consume(fed.consumed);
                match fed.event {
                    None => {}
                    Some(Event::Header(h)) => match on_header(c, &mut dec, h) {
                        Ok(Some(d)) => dest = d,
                        Ok(None) => dest = Dest::Skip,
                        Err(msg) => return Err(refused(c, &dec, msg).await),
                    },
                    Some(Event::DataEnd) => data_end(c, dest, false),
                    Some(Event::DataDigestError { received, computed, .. }) => {
                        ferrite_reactor::log_limited!(
                            log::Level::Warn,
                            "nvmf connection {}: data digest {received:#010x}, computed {computed:#010x}",
                            c.id
                        );
                        data_end(c, dest, true)
                    }
                }
            }
            Want::Data(left) => {
                let left = left as usize;
                match dest {
                    Dest::Skip => {
                        // Show the skipped bytes to the decoder (for its digest).
                        let chunk = rx.chunk().await?;
                        let k = chunk.len().min(left);
                        let fed = dec.data(&chunk[..k]);
                        chunk.consume(fed.consumed);
                        if let Some(ev) = fed.event {
                            if matches!(ev, Event::DataEnd) {
                                data_end(c, dest, false);
                            }
                        }
                    }
                    Dest::Cmd { slot, at } => {
                        let buf = c.cmds.borrow_mut()[usize::from(slot)].buf.take();
                        let Some(buf) = buf else { return Err("data for a command without a buffer".into()) };
                        let deadline = Some(DATA_BASE_TIME + Duration::from_secs((left >> 20) as u64));
                        let (res, buf) = rx.fill(buf, at as usize, left, deadline).await;
                        let fed = dec.data(&buf[at as usize..at as usize + left]);
                        {
                            let mut cmds = c.cmds.borrow_mut();
                            let cmd = &mut cmds[usize::from(slot)];
                            cmd.buf = Some(buf);
                            cmd.got += left as u32;
                        }
                        res?;
                        dest = Dest::Cmd { slot, at: at + left as u32 };
                        if let Some(Event::DataEnd) = fed.event {
                            data_end(c, dest, false);
                        }
                    }
                }
            }
        }
    }
}

/// A header arrived: returns where its data goes.
fn on_header(c: &Rc<Conn>, dec: &mut Decoder, h: crate::tcp::Header) -> Result<Option<Dest>, String> {
    match h.pdu {
        Pdu::IcReq(req) => {
            let o = &c.opts;
            let cfg = ControllerConfig { header_digest: true, data_digest: true, cpda: 0, maxh2cdata: o.max_h2c_data };
            let (resp, params) = controller_accept(&req, &cfg);
            let mut out = Out::empty();
            let f = encode(&mut out.head, &Negotiated::INITIAL, &Pdu::IcResp(resp), &[])
                .map_err(|e| format!("cannot frame ICResp: {e}"))?;
            out.head_len = f.head_len as u8;
            dec.set_params(params);
            dec.set_max_icd(crate::tcp::pdu::ADMIN_MAX_ICD);
            c.params.set(params);
            log::debug!(
                "nvmf connection {}: ICReq: header digest {}, data digest {}",
                c.id,
                params.header_digest,
                params.data_digest
            );
            c.push_out(out);
            Ok(None)
        }
        Pdu::H2cTermReq(t) => Err(format!("host sent H2CTermReq (FES {:#x}, FEI {:#x})", t.fes, t.fei)),
        Pdu::CapsuleCmd(cmd) => {
            let dest = super::exec::capsule(c, &cmd.sqe, h.data_len)?;
            Ok(dest.map(|d| Dest::Cmd { slot: d.slot, at: 0 }))
        }
        Pdu::H2cData(d) => {
            use crate::tcp::pdu::offset;
            use crate::tcp::PduType;
            let slot = d.ttag;
            // What is wrong with it, as the termination request's FES/FEI say it.
            let wrong = {
                let cmds = c.cmds.borrow();
                match cmds.get(u32::from(slot)).filter(|x| x.phase == Phase::Receiving && x.buf.is_some()) {
                    None => Some(PduError::InvalidField {
                        pdu_type: PduType::H2cData,
                        offset: offset::TTAG,
                        value: u32::from(d.ttag),
                    }),
                    Some(x) if x.sqe.cid != d.cccid => Some(PduError::InvalidField {
                        pdu_type: PduType::H2cData,
                        offset: offset::CCCID,
                        value: u32::from(d.cccid),
                    }),
                    Some(x)
                        if d.datao != x.got
                            || u64::from(d.datao) + u64::from(d.datal) > u64::from(x.len)
                            || d.datal != h.data_len =>
                    {
                        Some(PduError::OutOfRange { pdu_type: PduType::H2cData, offset: d.datao, len: d.datal })
                    }
                    // LAST_PDU marks the PDU that ends the R2T's range (the command's rest:
                    // one R2T per command), and only that one. Without it the target would
                    // take complete data from a host that says more follows, and an early
                    // one left the command waiting for data the host will never send.
                    Some(x) if d.last != (u64::from(d.datao) + u64::from(d.datal) == u64::from(x.len)) => {
                        Some(PduError::Flags {
                            pdu_type: PduType::H2cData,
                            flags: dec.received_header().get(usize::from(offset::FLAGS)).copied().unwrap_or(0),
                        })
                    }
                    Some(_) => None,
                }
            };
            if let Some(e) = wrong {
                c.pending_term.set(Some(e));
                return Err(format!(
                    "H2CData (CCCID {}, TTAG {}, DATAO {}, DATAL {}, LAST_PDU {}) does not match an R2T",
                    d.cccid, d.ttag, d.datao, d.datal, d.last
                ));
            }
            Ok(Some(Dest::Cmd { slot, at: d.datao }))
        }
        other => Err(format!("unexpected {} from a host", other.pdu_type())),
    }
}

/// A PDU's data is all in.
fn data_end(c: &Rc<Conn>, dest: Dest, digest_error: bool) {
    let Dest::Cmd { slot, .. } = dest else { return };
    let ready = {
        let mut cmds = c.cmds.borrow_mut();
        let cmd = &mut cmds[usize::from(slot)];
        cmd.digest_error |= digest_error;
        cmd.got >= cmd.len
    };
    if ready {
        super::exec::data_ready(c, slot);
    }
}

/// A command whose in-capsule data follows its header.
pub(crate) struct DestCmd {
    /// Its slot.
    pub(crate) slot: u16,
}

impl Conn {
    /// Sets the in-capsule data limit for the capsules after this one.
    pub(crate) fn set_icd_limit(&self, limit: u32) {
        self.icd_limit.set(Some(limit));
    }

    /// Starts receiving the data of the command in `slot`: it came in the capsule (the decoder
    /// says so), or an R2T asks for it.
    pub(crate) fn start_receive(&self, slot: u16, in_capsule: bool) {
        if !in_capsule {
            self.send_r2t(slot);
        }
    }

    /// Takes a slot for a new command.
    pub(crate) fn new_cmd(&self, raw: &[u8; 64], xfer: Xfer, len: u32) -> Option<u16> {
        let slot = self.take_slot()?;
        let mut cmds = self.cmds.borrow_mut();
        let c = &mut cmds[usize::from(slot)];
        // The target reads SGL1 from `raw` (`exec::capsule`), never `sqe.dptr`.
        c.sqe = Sqe::decode_fields(raw);
        c.raw = *raw;
        c.xfer = xfer;
        c.len = len;
        c.got = 0;
        c.buf = None;
        c.ns = None;
        c.partner = None;
        c.digest_error = false;
        c.fused_broken = false;
        c.since = 0;
        set_phase(c, Phase::Running, self.id, slot);
        Some(slot)
    }
}
