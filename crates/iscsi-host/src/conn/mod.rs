//! One iSCSI connection (its session's only one) on one reactor: TCP, the login, then SCSI
//! commands in the full feature phase.
//!
//! As the NVMe/TCP host's queue pair, it stands on the target kit: a `ConnCore` (socket,
//! closing and dead flags, the writer's waker), a `SlotTable` of tasks bounded by the queue
//! depth (the slot is in the ITT), each task's phase (the kit's host `Flight`), a reader task
//! ([`reader`]: the login, then every PDU the target sends, Data-In placed by the kit's
//! `place`) and a writer task ([`out`]: the kit's `write_loop`, all that is queued in one
//! `sendmsg`). A task whose data is still being sent is not ended before that send is done,
//! whatever the target answers (its buffers must outlive the send).
//!
//! Commands are sent only inside the CmdSN window ([`crate::seq`]); a command that does not
//! fit (no slot, the window shut) is refused and waits with the connection's owner. When the
//! connection ends, once both tasks have stopped, the bdev requests it still had go back to
//! the owner in CmdSN order, to be sent again on the next connection; the connection's own
//! commands fail.

mod login;
pub(crate) mod out;
mod reader;
pub(crate) mod task;

use crate::command::Command;
use crate::plan::{plan_write, segments, Xfer};
use crate::scsi::{verdict, Verdict};
use crate::seq::Window;
use ferrite_bdev::BdevIo;
use ferrite_iscsi::login::InitiatorLoginConfig;
use ferrite_iscsi::pdu::{DataOut, LogoutReason, LogoutRequest, Pdu, PduParams, ScsiCommand, TaskAttr, RESERVED_TAG};
use ferrite_reactor::net::Socket;
use ferrite_reactor::{oneshot, IoBuf};
use ferrite_target::host::HostPhase;
use ferrite_target::{ConnCore, SlotTable};
use out::{pieces_in, Out};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};
use task::{Ended, Owner, Task};

pub(crate) use ferrite_target::host::with_deadline;

pub use task::Reply;

/// Connection IDs (the kit's), unique in the process.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// What a connection needs to log in.
#[derive(Clone)]
pub struct ConnectParams {
    /// The target's portal.
    pub addr: SocketAddr,
    /// The login: names, ISID, CHAP, the operational keys offered.
    pub login: InitiatorLoginConfig,
    /// The LUN field of its commands.
    pub lun: u64,
    /// Most commands outstanding.
    pub depth: u16,
    /// Time allowed for the TCP connect and the login.
    pub timeout: Duration,
}

/// What a connection tells its owner (the session that sends bdev requests on it).
pub(crate) trait ConnOwner {
    /// A slot or the CmdSN window opened: what waits may be sent.
    fn room(&self);
    /// A bdev request's command ended (its status says how).
    fn done(&self, io: BdevIo, v: Verdict);
    /// Connection `conn` ended with these bdev requests outstanding, in CmdSN order: they go
    /// back to be sent again.
    fn lost(&self, conn: u64, ios: Vec<BdevIo>);
}

/// A logged-in connection.
pub struct Conn {
    /// Socket, peer, the flags of its end, the writer's waker (the kit's).
    pub(crate) core: ConnCore,
    lun: u64,
    depth: u16,
    /// What the login settled for data transfers.
    xfer: Cell<Xfer>,
    /// How this end frames what it sends.
    tx: Cell<PduParams>,
    /// CmdSN window and StatSN.
    win: Cell<Window>,
    tasks: RefCell<SlotTable<Task>>,
    pub(crate) out: RefCell<Vec<Out>>,
    /// Tasks still running (reader, writer).
    running: Cell<u8>,
    login_wait: RefCell<Option<oneshot::Sender<Result<(), String>>>>,
    logout_wait: RefCell<Option<oneshot::Sender<()>>>,
    owner: RefCell<Option<Weak<dyn ConnOwner>>>,
    /// The owner's clock (ticks of its watchdog): when a task was sent.
    tick: Cell<u32>,
    /// What the target did wrong, if its protocol error ended the connection.
    fault: RefCell<Option<String>>,
    /// A caller waiting for room or for the connection to drain ([`Conn::wait_until`]).
    waiter: RefCell<Option<Waker>>,
    /// A NOP-Out answering a target's ping waits to be sent (no second one is queued).
    nop_waits: Cell<bool>,
    /// When the login completed.
    since: Cell<Instant>,
    /// A command ended with a SCSI status on it.
    answered: Cell<bool>,
}

impl Conn {
    /// Connects to the portal and logs in (on the reactor that will use the connection).
    pub async fn connect(p: &ConnectParams) -> Result<Rc<Conn>, String> {
        Conn::connect_owned(p, None).await
    }

    pub(crate) async fn connect_owned(
        p: &ConnectParams,
        owner: Option<Weak<dyn ConnOwner>>,
    ) -> Result<Rc<Conn>, String> {
        let deadline = Instant::now() + p.timeout;
        let sock = Socket::connect_by(p.addr, deadline).await.map_err(|e| format!("connect to {}: {e}", p.addr))?;
        ferrite_reactor::net::set_nodelay(sock.raw_fd());
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let c = Rc::new(Conn {
            core: ConnCore::new("iscsi host", id, sock, p.addr.to_string()),
            lun: p.lun,
            depth: p.depth.clamp(1, 4096),
            xfer: Cell::new(Xfer {
                immediate_data: false,
                initial_r2t: true,
                first_burst: 0,
                max_burst: 0,
                max_send_segment: 8192,
                max_r2t: 1,
            }),
            tx: Cell::new(PduParams::LOGIN),
            win: Cell::new(Window::new(1, 0, 0)),
            tasks: RefCell::new(SlotTable::default()),
            out: RefCell::new(Vec::new()),
            running: Cell::new(2),
            login_wait: RefCell::new(None),
            logout_wait: RefCell::new(None),
            owner: RefCell::new(owner),
            tick: Cell::new(0),
            fault: RefCell::new(None),
            waiter: RefCell::new(None),
            nop_waits: Cell::new(false),
            since: Cell::new(Instant::now()),
            answered: Cell::new(false),
        });
        let (tx, rx) = oneshot::channel();
        *c.login_wait.borrow_mut() = Some(tx);
        ferrite_reactor::spawn_local(reader::reader(c.clone(), p.login.clone())).detach();
        ferrite_reactor::spawn_local(out::writer(c.clone())).detach();
        match with_deadline(rx, deadline).await {
            Some(Ok(Ok(()))) => {
                c.since.set(Instant::now());
                Ok(c)
            }
            Some(Ok(Err(e))) => {
                c.close();
                Err(e)
            }
            Some(Err(_)) => {
                c.close();
                Err("the connection closed during the login".into())
            }
            None => {
                c.close();
                Err(format!("{}: no login within {:?}", p.addr, p.timeout))
            }
        }
    }

    /// The connection's id (the kit's), for the log.
    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// True if the connection was of use: a command ended with a status on it, or it lived a
    /// second or more after its login (a target that logs in and drops the connection at
    /// once is logged in to again only after a back-off).
    pub(crate) fn was_useful(&self) -> bool {
        self.answered.get() || self.since.get().elapsed() >= Duration::from_secs(1)
    }

    /// Sets the owner's clock: tasks sent from now on carry `tick`.
    pub(crate) fn set_tick(&self, tick: u32) {
        self.tick.set(tick);
    }

    /// True if a task sent at least `limit` ticks before `now` is still outstanding.
    pub(crate) fn stuck(&self, now: u32, limit: u32) -> bool {
        let tasks = self.tasks.borrow();
        let stuck = tasks.iter().any(|(_, t)| t.flight.is_sent() && now.wrapping_sub(t.tick) >= limit);
        stuck
    }

    /// True if a bdev request on the connection (sent, not yet answered) satisfies `f`.
    pub(crate) fn any_request(&self, f: impl Fn(&BdevIo) -> bool) -> bool {
        let tasks = self.tasks.borrow();
        let any = tasks.iter().any(|(_, t)| t.flight.is_sent() && matches!(&t.owner, Some(Owner::Bdev(io)) if f(io)));
        any
    }

    /// True once closed for good.
    pub fn is_closed(&self) -> bool {
        self.core.is_dead()
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.tasks.borrow().live()
    }

    /// True if a command may be sent now: a free slot and room in the CmdSN window.
    pub(crate) fn can_send(&self) -> bool {
        !self.core.is_closing() && self.win.get().open() && self.tasks.borrow().live() < usize::from(self.depth)
    }

    /// The window's state, for the log and tests: (next CmdSN, MaxCmdSN).
    pub fn window(&self) -> (u32, u32) {
        let w = self.win.get();
        (w.next(), w.max_cmd_sn())
    }

    /// Closes the connection at once: what is outstanding goes back to the owner (bdev
    /// requests) or fails (the connection's own commands) once both tasks have stopped.
    pub fn close(&self) {
        self.core.close();
        self.notify();
    }

    /// Wakes a caller of [`Conn::wait_until`].
    fn notify(&self) {
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    /// Waits until `cond` holds, the connection closes, or `limit` passes; returns `cond()`.
    async fn wait_until(&self, cond: impl Fn() -> bool, limit: Option<Duration>) -> bool {
        let mut timer = limit.map(|l| Box::pin(ferrite_reactor::sleep(l)));
        poll_fn(|cx| {
            if cond() || self.core.is_dead() {
                return Poll::Ready(());
            }
            if let Some(t) = timer.as_mut() {
                if t.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            *self.waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        cond()
    }

    /// Logs out: sends nothing new, waits up to `limit` for what is outstanding, sends a
    /// Logout Request (close the session) and waits up to `limit` for its response, then
    /// closes.
    pub async fn logout(&self, limit: Duration) {
        if self.core.is_closing() {
            self.close();
            return;
        }
        self.core.stop_taking();
        let drained = self.wait_until(|| self.outstanding() == 0, Some(limit)).await;
        if drained && !self.core.is_dead() {
            let (tx, rx) = oneshot::channel();
            *self.logout_wait.borrow_mut() = Some(tx);
            let w = self.win.get();
            let pdu = Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::CloseSession,
                itt: task::LOGOUT_ITT,
                cid: 0,
                cmd_sn: w.next(),
                exp_stat_sn: w.exp_stat_sn(),
            });
            if let Ok(o) = Out::owned(&self.tx.get(), &pdu, Vec::new()) {
                self.push(o);
                let _ = with_deadline(rx, Instant::now() + limit).await;
            }
        }
        self.close();
    }

    fn push(&self, o: Out) {
        self.out.borrow_mut().push(o);
        self.core.wake_writer();
    }

    fn take_slot(&self) -> Option<u16> {
        let i = self.tasks.borrow_mut().take(usize::from(self.depth), Task::default)?;
        Some(i as u16)
    }

    /// Sends bdev request `io` as `cmd`; gives it back if it cannot be sent now (no slot, the
    /// window shut, the connection closing).
    pub(crate) fn submit_io(&self, io: BdevIo, cmd: Command) -> Result<(), BdevIo> {
        if !self.can_send() {
            return Err(io);
        }
        let Some(slot) = self.take_slot() else { return Err(io) };
        self.start(slot, Owner::Bdev(io), cmd);
        Ok(())
    }

    /// Sends a command of the connection's own: `cmd` with its CDB and direction, `out` the
    /// data it writes (its length is the transfer) or `in_len` bytes to read; waits for its
    /// end.
    pub async fn command(&self, cdb: crate::scsi::Cdb, out: Option<IoBuf>, in_len: u32) -> Result<Reply, String> {
        let (tx, rx) = oneshot::channel();
        // Waits for the window (commands of its own are few and sent one at a time).
        self.wait_until(|| self.core.is_closing() || self.can_send(), None).await;
        if self.core.is_closing() {
            return Err("connection closed".into());
        }
        let Some(slot) = self.take_slot() else { return Err("no free task slot".into()) };
        let (len, read) = match &out {
            Some(b) => (b.len() as u32, false),
            None => (in_len, in_len > 0),
        };
        let inb = read.then(|| {
            let mut b = ferrite_reactor::alloc_buf(in_len as usize);
            b.zero();
            b
        });
        let cmd = Command { cdb, read, len, extra: None };
        self.start(slot, Owner::Wait { tx, out, inb }, cmd);
        rx.await.unwrap_or_else(|_| Err("connection closed".into()))
    }

    /// Starts task `slot`: the command PDU with its immediate data, then its unsolicited
    /// Data-Out PDUs.
    fn start(&self, slot: u16, owner: Owner, cmd: Command) {
        let x = self.xfer.get();
        let params = self.tx.get();
        let mut w = self.win.get();
        let cmd_sn = w.take();
        self.win.set(w);
        let write = !cmd.read && cmd.len > 0;
        let plan =
            if write { plan_write(cmd.len, &x) } else { crate::plan::WritePlan { immediate: 0, unsolicited_end: 0 } };
        let mut list: SmallVec<[(*const u8, usize); 4]> = SmallVec::new();
        let itt = {
            let mut tasks = self.tasks.borrow_mut();
            let t = &mut tasks[usize::from(slot)];
            t.flight.start(self.core.id, u32::from(slot));
            t.begin(owner, cmd.len, cmd.read, cmd.extra, cmd_sn, self.tick.get());
            t.r2ts = crate::plan::R2ts::after(plan.unsolicited_end);
            if write {
                t.data_pieces(&mut list);
            }
            t.itt(slot)
        };
        let pdu = Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: plan.final_bit(),
            read: cmd.read,
            write,
            attr: TaskAttr::Simple,
            lun: self.lun,
            itt,
            expected_data_transfer_length: cmd.len,
            cmd_sn,
            exp_stat_sn: w.exp_stat_sn(),
            cdb: cmd.cdb,
        });
        let mut piece: SmallVec<[(*const u8, usize); 4]> = SmallVec::new();
        pieces_in(&list, 0, plan.immediate, &mut piece);
        if !self.queue(slot, &params, &pdu, &piece, plan.immediate > 0, false) {
            return;
        }
        // The unsolicited Data-Outs are one sequence: DataSN 0, 1, 2... (RFC 7143 11.7.5).
        for (data_sn, (off, n, last)) in segments(plan.immediate, plan.unsolicited_end, x.max_send_segment).enumerate()
        {
            let pdu = Pdu::DataOut(DataOut {
                final_: last,
                lun: self.lun,
                itt,
                ttt: RESERVED_TAG,
                exp_stat_sn: w.exp_stat_sn(),
                data_sn: data_sn as u32,
                buffer_offset: off,
            });
            pieces_in(&list, off, n, &mut piece);
            if !self.queue(slot, &params, &pdu, &piece, true, false) {
                return;
            }
        }
    }

    /// Frames and queues one PDU of task `slot` (counted in its sends if it carries its
    /// data; `r2t_last`: the last Data-Out answering an R2T). False if it could not be framed
    /// or counted (the connection is then dropped: a PDU this end cannot frame is a bug, not
    /// the target's fault, but nothing else is safe).
    fn queue(
        &self,
        slot: u16,
        params: &PduParams,
        pdu: &Pdu,
        pieces: &[(*const u8, usize)],
        data: bool,
        r2t_last: bool,
    ) -> bool {
        // SAFETY: the pieces point into the task's buffers (its request's, its extra data, its
        // own command's), which stay with the task until `sent` has counted this PDU.
        match unsafe { Out::frame(params, pdu, pieces) } {
            Ok(mut o) => {
                if data {
                    if !self.tasks.borrow_mut()[usize::from(slot)].flight.queued() {
                        log::error!(
                            "iscsi host connection {}: too many PDUs queued for one command; closing",
                            self.core.id
                        );
                        *self.fault.borrow_mut() = Some("too many Data-Out PDUs asked for one command".into());
                        self.close();
                        return false;
                    }
                    o.slot = Some(slot);
                    o.r2t_last = r2t_last;
                }
                self.push(o);
                true
            }
            Err(e) => {
                log::error!("iscsi host connection {}: cannot frame a PDU: {e}; closing", self.core.id);
                self.close();
                false
            }
        }
    }

    /// A PDU carrying a task's data has been sent (`tag`: its slot, with
    /// [`out::R2T_LAST`] if it was the last Data-Out answering an R2T).
    pub(crate) fn sent(&self, tag: u16) {
        if tag == out::NOP_ANSWER {
            self.nop_waits.set(false);
            return;
        }
        let slot = tag & !out::R2T_LAST;
        let done = {
            let mut tasks = self.tasks.borrow_mut();
            let t = &mut tasks[usize::from(slot)];
            if tag & out::R2T_LAST != 0 {
                t.r2ts.answered();
            }
            t.flight.sent()
        };
        if let Some(e) = done {
            self.finish(slot, e);
        }
    }

    /// Task `slot` ended (its status, or a refusal).
    fn finish(&self, slot: u16, e: Ended) {
        let (owner, len, got) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(t) = tasks.get_mut(u32::from(slot)) else { return };
            if t.flight.phase() == HostPhase::Free {
                return;
            }
            // Its data may still be with the kernel: then it ends when the send is done.
            if t.flight.answer(e, self.core.id, u32::from(slot)).is_none() {
                return;
            }
            t.extra = None;
            let owner = t.owner.take();
            let (len, got) = (if t.read { t.len } else { 0 }, t.progress.got);
            tasks.release(u32::from(slot));
            (owner, len, got)
        };
        if matches!(e, Ended::Status { .. }) {
            self.answered.set(true);
        }
        // A logout waiting for the connection to drain, a command waiting for room.
        self.notify();
        match owner {
            Some(Owner::Bdev(io)) => {
                let v = match e {
                    Ended::Refused => Verdict::Fail(ferrite_bdev::IoStatus::Failed(libc::EIO)),
                    Ended::Status { status, sense } => match verdict(status, sense) {
                        Verdict::Success if got < len => {
                            ferrite_reactor::log_limited!(
                                log::Level::Warn,
                                "iscsi host connection {}: a read of {len} bytes ended GOOD with {got} of them",
                                self.core.id
                            );
                            Verdict::Fail(ferrite_bdev::IoStatus::Failed(libc::EIO))
                        }
                        v => v,
                    },
                };
                match self.owner() {
                    Some(o) => o.done(io, v),
                    None => io.complete(ferrite_bdev::IoStatus::Failed(libc::EIO)),
                }
            }
            Some(Owner::Wait { tx, inb, .. }) => {
                let r = match e {
                    Ended::Refused => Err("the target refused the command".to_string()),
                    Ended::Status { status, sense } => {
                        let data = inb.map(|b| b[..got as usize].to_vec()).unwrap_or_default();
                        Ok(Reply { status, sense, data })
                    }
                };
                tx.send(r);
            }
            None => {}
        }
        self.room();
    }

    fn owner(&self) -> Option<Rc<dyn ConnOwner>> {
        self.owner.borrow().as_ref().and_then(Weak::upgrade)
    }

    /// Room opened (a slot, the window): the owner sends what waits, a command of the
    /// connection's own waiting for the window is woken.
    fn room(&self) {
        if self.core.is_closing() {
            return;
        }
        self.notify();
        if let Some(o) = self.owner() {
            o.room();
        }
    }

    /// Why the connection ended: the target's protocol error, or that it closed.
    fn close_reason(&self) -> String {
        match &*self.fault.borrow() {
            Some(f) => format!("the target broke the protocol: {f}"),
            None => "connection closed".into(),
        }
    }

    /// One of the two tasks stopped; after the second, what is outstanding goes back (bdev
    /// requests, to the owner) or fails (commands of its own).
    pub(crate) fn task_done(&self) {
        self.running.set(self.running.get() - 1);
        if self.running.get() > 0 {
            return;
        }
        if let Some(w) = self.login_wait.borrow_mut().take() {
            w.send(Err(self.close_reason()));
        }
        self.logout_wait.borrow_mut().take();
        self.notify();
        let mut lost: Vec<(u32, BdevIo)> = Vec::new();
        let why = self.close_reason();
        ferrite_target::end_all(&self.core, &self.tasks, |slot| {
            let owner = {
                let mut tasks = self.tasks.borrow_mut();
                let t = &mut tasks[slot as usize];
                t.flight.end(self.core.id, slot);
                t.extra = None;
                let owner = t.owner.take().map(|o| (t.cmd_sn, o));
                tasks.release(slot);
                owner
            };
            match owner {
                Some((sn, Owner::Bdev(io))) => lost.push((sn, io)),
                Some((_, Owner::Wait { tx, .. })) => tx.send(Err(why.clone())),
                None => {}
            }
        });
        let base = self.win.get().next();
        // In CmdSN order (serial arithmetic: by distance back from the next CmdSN).
        lost.sort_by_key(|(sn, _)| std::cmp::Reverse(base.wrapping_sub(*sn)));
        let ios: Vec<BdevIo> = lost.into_iter().map(|(_, io)| io).collect();
        match self.owner() {
            Some(o) => o.lost(self.core.id, ios),
            None => ios.into_iter().for_each(|io| io.complete(ferrite_bdev::IoStatus::Failed(libc::EIO))),
        }
    }
}
