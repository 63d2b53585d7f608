//! One iSCSI connection on its reactor (its session's reactor, [`super::session`]): its core (`ferrite_target::ConnCore`: socket, closing and dead flags, the two tasks'
//! wakers, send and receive progress), its command slots, its send queue, and the reactor's
//! table of connections whose watchdog bounds the login, the initiator's data, NOP-In answers,
//! stalled sends and logout requests.

use super::out::{OutQueue, SEND_PER_MIB};
use super::registry;
use super::seq::Seq;
use super::session::Session;
use super::task::{Cmd, Phase};
use super::{DATA_BASE_TIME, LOGIN_TIMEOUT, SEND_BASE_TIME};
use ferrite_iscsi::pdu::{EncodeError, LoginRequest, Pdu, PduParams, RejectReason, BHS_LEN};
use ferrite_reactor::net::Socket;
use ferrite_reactor::tsc::{duration_to_ticks, ticks};
use ferrite_target::table::{ConnTable, Served, WatchdogOptions};
use ferrite_target::{ConnCore, ConnPermit, SlotTable};
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Logging in.
    Login,
    /// Full feature phase.
    FullFeature,
    /// A logout is being answered: nothing new is taken.
    LoggingOut,
}

/// A NOP-In the target sent and the initiator has not answered: its TTT and when it went.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NopState {
    /// The outstanding NOP-In's TTT and send tick.
    pub(crate) outstanding: Option<(u32, u64)>,
    /// When the last NOP-In went (or the full feature phase began).
    pub(crate) last: u64,
}

/// The options a connection reads while it runs, taken from `iscsi_set_options` when it
/// comes (so that no command takes the registry's lock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnOptions {
    /// Commands soliciting data at once.
    pub(crate) max_r2t: u32,
    /// Seconds between NOP-Ins (0: none).
    pub(crate) nop_in_interval: i32,
    /// Seconds a NOP-In may go unanswered.
    pub(crate) nop_timeout: i32,
}

/// One connection.
pub(crate) struct Conn {
    core: ConnCore,
    /// The reactor it lives on.
    pub(crate) reactor: usize,
    /// The portal group it came through.
    pub(crate) pg_tag: u16,
    /// The address it connected to ("ip:port").
    pub(crate) local: String,
    /// The initiator's IP address.
    pub(crate) peer_ip: Option<IpAddr>,
    pub(crate) stage: Cell<Stage>,
    /// The login under way (dropped at its end).
    pub(crate) login: RefCell<Option<Box<super::login::LoginState>>>,
    /// The session, once logged in.
    pub(crate) sess: OnceCell<Rc<Session>>,
    /// Its CID.
    pub(crate) cid: Cell<u16>,
    /// Its index and the index's generation in its session (they name it in SCSI tags).
    pub(crate) member: Cell<(u16, u16)>,
    /// Its end does not fail the session: it logged out, or was replaced or closed with it.
    pub(crate) quiet_end: Cell<bool>,
    /// Where it goes at the end of its reader: the session it joins lives on another reactor.
    pub(crate) moving: RefCell<Option<super::login::Move>>,
    /// StatSN and the session's command window.
    pub(crate) seq: Seq,
    /// How PDUs are framed when sent (the peer's MaxRecvDataSegmentLength, digests).
    pub(crate) tx: Cell<PduParams>,
    /// Receive parameters the decoder takes from the next header on (set at login's end).
    pub(crate) rx_params: Cell<Option<PduParams>>,
    /// SCSI commands by slot.
    pub(crate) cmds: RefCell<SlotTable<Cmd>>,
    /// Commands in slots plus task management functions running: what a logout and the
    /// writer's end wait for.
    pub(crate) in_flight: Cell<u32>,
    /// PDUs queued for the writer.
    pub(crate) out: RefCell<OutQueue>,
    /// Bytes queued or being sent.
    unsent: Cell<usize>,
    /// Bytes of write buffers given to commands whose data is not all in.
    pub(crate) r2t_held: Cell<usize>,
    /// Commands soliciting data now (R2Ts out).
    pub(crate) r2t_active: Cell<u32>,
    /// Commands waiting for a buffer before their R2T, oldest first (slots).
    pub(crate) buf_wait: RefCell<VecDeque<u32>>,
    pub(crate) nop: Cell<NopState>,
    /// Full feature phase text exchanges.
    pub(crate) text: RefCell<Option<super::text::TextState>>,
    /// Target transfer tags for NOP-In and Text (never 0xffffffff).
    next_ttt: Cell<u32>,
    /// The tick by which an initiator asked to log out must have done so (0: not asked).
    pub(crate) logout_by: Cell<u64>,
    /// The queue depth and the commands' window size (set at login).
    pub(crate) queue_depth: Cell<u32>,
    /// Task management functions running (at most [`super::MAX_TMFS`]).
    pub(crate) tmfs: Cell<u32>,
    pub(crate) opts: ConnOptions,
}

impl std::ops::Deref for Conn {
    type Target = ConnCore;
    fn deref(&self) -> &ConnCore {
        &self.core
    }
}

ferrite_reactor::reactor_local! {
    /// This reactor's connections by id.
    static LIVE: RefCell<ConnTable<Conn>> = const { RefCell::new(ConnTable::new()) };
}

/// Connection ids, unique in the process.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// The watchdog looks once a second.
const WATCHDOG: WatchdogOptions = WatchdogOptions { period: Duration::from_secs(1), proto: "iscsi" };

impl Conn {
    /// The session (in the full feature phase).
    pub(crate) fn session(&self) -> Option<&Rc<Session>> {
        self.sess.get()
    }

    /// The SCSI nexus, if the session has one.
    pub(crate) fn nexus(&self) -> Option<Rc<ferrite_scsi::Session>> {
        self.sess.get().and_then(|s| s.nexus())
    }

    /// The SCSI tag of command `slot` of this connection.
    pub(crate) fn tag(&self, slot: u32, immediate: bool) -> u64 {
        Session::tag(self.member.get(), slot, immediate)
    }

    /// True once nothing is outstanding.
    pub(crate) fn drained(&self) -> bool {
        self.in_flight.get() == 0
    }

    /// One more thing in flight.
    pub(crate) fn hold(&self) {
        self.in_flight.set(self.in_flight.get() + 1);
    }

    /// One thing in flight ended; a logout or a close waiting for the last one is woken.
    pub(crate) fn unhold(&self) {
        debug_assert!(self.in_flight.get() > 0, "connection {}: more ends than starts", self.id);
        self.in_flight.set(self.in_flight.get() - 1);
        if self.in_flight.get() == 0 && (self.is_closing() || self.stage.get() == Stage::LoggingOut) {
            self.wake();
        }
    }

    /// A fresh target transfer tag.
    pub(crate) fn next_ttt(&self) -> u32 {
        let t = self.next_ttt.get();
        self.next_ttt.set(if t >= 0xfffe { 1 } else { t + 1 });
        t
    }

    /// Queues PDUs made by `f` and wakes the writer. An encoding error (a bug: every PDU
    /// made here fits the limits) is logged and ends the connection.
    pub(crate) fn queue(&self, f: impl FnOnce(&mut OutQueue, &PduParams) -> Result<(), EncodeError>) {
        if self.is_dead() {
            return;
        }
        let tx = self.tx.get();
        let mut q = self.out.borrow_mut();
        let before = q.bytes();
        let r = f(&mut q, &tx);
        let added = q.bytes() - before;
        drop(q);
        self.unsent.set(self.unsent.get() + added);
        if let Err(e) = r {
            log::error!("iscsi connection {}: cannot frame a PDU: {e}; closing", self.id);
            self.close();
            return;
        }
        self.wake_writer();
    }

    /// Queues one PDU with `data`.
    pub(crate) fn send_pdu(&self, pdu: &Pdu, data: &[u8]) {
        self.queue(|q, tx| q.single(tx, pdu, data));
    }

    /// The writer sent `bytes`.
    pub(crate) fn sent(&self, bytes: usize) {
        self.unsent.set(self.unsent.get().saturating_sub(bytes));
        self.wake_reader();
    }

    /// Bytes queued or being sent.
    pub(crate) fn unsent(&self) -> usize {
        self.unsent.get()
    }

    /// Answers a PDU with a Reject carrying its header (`bhs`), and logs why (rate-limited:
    /// an initiator can send bad PDUs at will).
    pub(crate) fn reject(&self, reason: RejectReason, bhs: &[u8; BHS_LEN], why: &str) {
        ferrite_reactor::log_limited!(
            log::Level::Warn,
            "iscsi connection {} from {}: {why}; Reject ({reason:?})",
            self.id,
            self.peer
        );
        let pdu = Pdu::Reject(ferrite_iscsi::pdu::Reject {
            reason: reason as u8,
            stat_sn: self.seq.take_stat_sn(),
            exp_cmd_sn: self.seq.exp_cmd_sn(),
            max_cmd_sn: self.seq.max_cmd_sn(),
            data_sn: 0,
        });
        self.send_pdu(&pdu, bhs);
    }

    /// A non-immediate request was finished (answered or dropped): the window opens.
    pub(crate) fn finished(&self, immediate: bool) {
        if !immediate {
            self.seq.open();
        }
    }
}

impl Served for Conn {
    fn core(&self) -> &ConnCore {
        &self.core
    }

    fn watch(&self, now: u64) {
        let by = self.logout_by.get();
        if by != 0 && now > by {
            log::warn!("iscsi connection {} from {}: asked to log out, did not; closing", self.id, self.peer);
            self.close();
            return;
        }
        if self.stage.get() == Stage::FullFeature && !self.nop_due(now) {
            return;
        }
        if !self.is_dead() {
            self.bound_data_waits(now);
        }
        if self.sending.stalled(now, SEND_BASE_TIME, SEND_PER_MIB) {
            log::warn!(
                "iscsi connection {} from {}: the initiator has not read its data in time; closing",
                self.id,
                self.peer
            );
            self.close();
        }
    }
}

impl Conn {
    /// Sends a NOP-In every `nop_in_interval` seconds and closes the connection when one goes
    /// unanswered for `nop_timeout` seconds (SPDK's options). False if it closed.
    fn nop_due(&self, now: u64) -> bool {
        let o = self.opts;
        if o.nop_in_interval <= 0 {
            return true;
        }
        let st = self.nop.get();
        if let Some((_, since)) = st.outstanding {
            let limit = Duration::from_secs(o.nop_timeout.max(1) as u64);
            if now.saturating_sub(since) > duration_to_ticks(limit) {
                log::warn!(
                    "iscsi connection {} from {}: no answer to a NOP-In in {limit:?}; closing",
                    self.id,
                    self.peer
                );
                self.close();
                return false;
            }
            return true;
        }
        if now.saturating_sub(st.last) >= duration_to_ticks(Duration::from_secs(o.nop_in_interval as u64)) {
            super::nop::ping(self, now);
        }
        true
    }

    /// Bounds what waits on the initiator: solicited data that has not all come within 10 s
    /// plus 1 s/MiB of its R2T closes the connection (it holds a write buffer); a command that
    /// found no buffer in that time ends with BUSY (the initiator retries it).
    fn bound_data_waits(&self, now: u64) {
        if self.in_flight.get() == 0 || self.unsent.get() > super::MAX_UNSENT {
            return;
        }
        // Buffers other connections gave back to the pool since.
        super::r2t::grant_buffers(self);
        let mut late = None;
        let mut busy = Vec::new();
        for (i, x) in self.cmds.borrow().iter() {
            if x.since == 0 || !matches!(x.phase, Phase::Receiving | Phase::Waiting) {
                continue;
            }
            let limit = duration_to_ticks(DATA_BASE_TIME + Duration::from_secs(u64::from(x.need >> 20)));
            if now.saturating_sub(x.since) <= limit {
                continue;
            }
            if x.queued {
                busy.push(i);
            } else {
                late = Some((x.itt, x.recv, x.need));
            }
        }
        if let Some((itt, got, need)) = late {
            log::warn!(
                "iscsi connection {} from {}: command {itt:#x} has {got} of its {need} bytes of data too late; closing",
                self.id,
                self.peer
            );
            self.close();
            return;
        }
        if !busy.is_empty() {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "iscsi connection {}: {} writes found no buffer for their data in time; answered BUSY",
                self.id,
                busy.len()
            );
        }
        for slot in busy {
            super::task::busy(self, slot);
        }
    }
}

/// Closes this reactor's connection `id`, if it is here.
pub(crate) fn close_local(id: u64) {
    if let Some(c) = LIVE.with(|l| l.borrow().get(id)) {
        c.close();
    }
}

/// Runs `f` on this reactor's connection `id`, if it is here.
pub(crate) fn with_local(id: u64, f: impl FnOnce(&Rc<Conn>)) {
    if let Some(c) = LIVE.with(|l| l.borrow().get(id)) {
        f(&c);
    }
}

/// This reactor's connections (for LUN events).
pub(crate) fn all_local() -> Vec<Rc<Conn>> {
    LIVE.with(|l| l.borrow().all())
}

/// Serves one accepted connection to its end (a task on the reactor that owns it); `permit`
/// (the portal's connection count) is given back when it ends. `first`: the first Login
/// Request, read on another reactor before the connection moved here (its session lives here).
pub(crate) async fn serve(
    sock: Socket,
    peer: String,
    pg_tag: u16,
    permit: ConnPermit,
    first: Option<(LoginRequest, Vec<u8>)>,
) {
    let reactor = ferrite_reactor::current().unwrap_or(0);
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let local = ferrite_reactor::net::local_name(sock.raw_fd()).unwrap_or_default();
    let peer_ip = peer.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    let o = crate::options();
    let opts = ConnOptions {
        max_r2t: o.max_r2t_per_connection.max(1),
        nop_in_interval: o.nop_in_interval,
        nop_timeout: o.nop_timeout,
    };
    let c = Rc::new(Conn {
        core: ConnCore::new("iscsi", id, sock, peer.clone()),
        reactor,
        pg_tag,
        local,
        peer_ip,
        stage: Cell::new(Stage::Login),
        login: RefCell::new(None),
        sess: OnceCell::new(),
        cid: Cell::new(0),
        member: Cell::new((0, 0)),
        quiet_end: Cell::new(false),
        moving: RefCell::new(None),
        seq: Seq::default(),
        tx: Cell::new(PduParams::LOGIN),
        rx_params: Cell::new(None),
        cmds: RefCell::new(SlotTable::default()),
        in_flight: Cell::new(0),
        out: RefCell::new(OutQueue::default()),
        unsent: Cell::new(0),
        r2t_held: Cell::new(0),
        r2t_active: Cell::new(0),
        buf_wait: RefCell::new(VecDeque::new()),
        nop: Cell::new(NopState::default()),
        text: RefCell::new(None),
        next_ttt: Cell::new(1),
        logout_by: Cell::new(0),
        queue_depth: Cell::new(1),
        tmfs: Cell::new(0),
        opts,
    });
    *c.login.borrow_mut() = Some(Box::new(super::login::LoginState::new(&c)));
    // The login must end in time (the kit's watchdog closes the connection otherwise).
    c.handshake_within(LOGIN_TIMEOUT);
    ferrite_target::table::register(&LIVE, c.clone(), WATCHDOG);
    registry::accepted(&c);
    log::debug!("iscsi connection {id} from {peer} (portal group {pg_tag}) on reactor {reactor}");
    let writer = ferrite_reactor::spawn_local(super::out::writer(c.clone()));
    match super::reader::run(&c, first).await {
        Ok(()) => {}
        Err(e) => {
            if c.is_closing() {
            } else if e.contains("closed the connection") {
                // Initiators often just close (iscsi-ls, a normal session without logout).
                log::debug!("iscsi connection {id} from {}: {e}", c.peer);
            } else {
                // What ends a connection, as fast as peers connect: rate-limited.
                ferrite_reactor::log_limited!(log::Level::Info, "iscsi connection {id} from {}: {e}", c.peer);
            }
            c.close();
        }
    }
    c.stop_taking();
    // Commands that wait on the initiator end here; those with the SCSI layer end with its
    // nexus (their responses are dropped).
    super::task::end_waiting(&c);
    c.wake();
    writer.await;
    let moving = c.moving.borrow_mut().take();
    // A connection that moves keeps its socket open (a copy of its descriptor goes along).
    let handoff = moving.and_then(|m| {
        // SAFETY: the descriptor is the socket's, open for as long as `c` holds it.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(c.sock.raw_fd()) };
        match fd.try_clone_to_owned() {
            Ok(fd) => Some((m, fd)),
            Err(e) => {
                log::warn!("iscsi connection {id}: cannot move it to reactor {}: {e}", m.reactor);
                None
            }
        }
    });
    if handoff.is_none() {
        c.sock.shutdown();
    }
    if let Some(s) = c.session() {
        s.leave(&c, !c.quiet_end.get());
    }
    *c.text.borrow_mut() = None;
    *c.login.borrow_mut() = None;
    registry::closed(&c);
    ferrite_target::table::unregister(&LIVE, id);
    match handoff {
        Some((m, fd)) => {
            log::info!("iscsi connection {id} from {peer} moves to reactor {}, its session's", m.reactor);
            let first = Some((m.req, m.data));
            ferrite_reactor::engine().send(m.reactor, move || {
                ferrite_reactor::spawn_local(serve(Socket::new(fd), peer, pg_tag, permit, first)).detach();
            });
        }
        None => log::debug!("iscsi connection {id} closed"),
    }
}

/// The current tick.
pub(crate) fn now() -> u64 {
    ticks()
}
