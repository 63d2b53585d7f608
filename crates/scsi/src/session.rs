//! An I_T nexus on the reactor that owns its connection: submits tasks, tracks them until
//! they end, and runs the task management functions.
//!
//! Every task takes a slot of the session's table (bounded: beyond it TASK SET FULL) from
//! submission to its response, so a task management function finds it. READ and WRITE
//! (6/10/12/16) go straight to the bdev with the slot as the request's tag and end in
//! [`IoCompleter::io_done`]: no allocation, lock or syscall of their own (the checks are relaxed
//! loads of the logical unit's atomics). Every other command runs as a local task
//! (`exec::run`). An aborted task ends with [`Response::aborted`] set once whatever it had in
//! flight has ended; the function that aborted it answers then.

use crate::cdb::{self, op, Command, Rw};
use crate::exec;
use crate::inquiry::PortInfo;
use crate::lun::{Lun, NexusEntry, NexusKey};
use crate::sense::{asc, Fault, SENSE_DATA_PROTECT, SENSE_ILLEGAL_REQUEST, SENSE_NOT_READY, SENSE_UNIT_ATTENTION};
use crate::target::Target;
use crate::task::{Residual, Response, Task};
use crate::ua::UnitAttention;
use ferrite_bdev::{
    Completed, Initiator, InitiatorId, InitiatorRef, IoChannel, IoCompleter, IoFlags, IoRequest, IoType,
};
use ferrite_target::slots::SlotTable;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

/// Where a session's tasks end: called on the session's reactor, once per submitted task,
/// never from inside [`Session::submit`].
pub trait TaskDone {
    /// The task submitted with `tag` ended with `resp`.
    fn task_done(&self, tag: u64, resp: Response);
}

/// A task management function's answer (SAM-5 7.1; iSCSI maps them to its responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfResponse {
    /// FUNCTION COMPLETE: every task it named has ended.
    Complete,
    /// The task named does not exist (or has already ended).
    NoSuchTask,
    /// The logical unit does not exist.
    NoSuchLun,
}

/// Most tasks a session has at once, by default.
pub const DEFAULT_MAX_TASKS: usize = 1024;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

ferrite_reactor::reactor_local! {
    /// This reactor's sessions, by id (for task management functions sent from other cores).
    static SESSIONS: RefCell<HashMap<u64, Weak<Inner>>> = RefCell::new(HashMap::new());
}

/// What a slot's task is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A read of `len` bytes with the bdev.
    Read { len: u64 },
    /// A write of `len` bytes with the bdev.
    Write { len: u64 },
    /// A command run as a local task.
    Slow,
}

struct Slot {
    tag: u64,
    lun: u64,
    /// Moves each time the slot is taken: (slot, generation) names one task.
    gen: u64,
    live: bool,
    aborted: bool,
    expected: u32,
    kind: Kind,
    /// Where the response goes instead of the session's `TaskDone` (`Session::execute`).
    once: Option<Once>,
}

/// A logical unit as a session sees it.
#[derive(Clone)]
pub(crate) struct LunSlot {
    pub(crate) id: u64,
    pub(crate) lun: Arc<Lun>,
    pub(crate) ua: Arc<UnitAttention>,
    pub(crate) ch: Option<IoChannel>,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) core: usize,
    pub(crate) target: Arc<Target>,
    pub(crate) who: Initiator,
    who_ref: InitiatorRef,
    pub(crate) port: PortInfo,
    gen: Cell<u64>,
    pub(crate) luns: RefCell<Vec<LunSlot>>,
    slots: RefCell<SlotTable<Slot>>,
    max_tasks: usize,
    done: Rc<dyn TaskDone>,
    me: Weak<Inner>,
    waiters: RefCell<Vec<Waker>>,
    closed: Cell<bool>,
}

/// An I_T nexus: one initiator port through one target port, on the calling reactor. Dropping
/// it is the nexus's loss (its tasks are aborted, an SPC-2 reservation it holds is released).
pub struct Session {
    inner: Rc<Inner>,
}

impl Session {
    /// A session of `who` (a SCSI initiator port) through target port `port` of `target`,
    /// whose tasks end in `done`. Must be called on the reactor that will submit its tasks.
    pub fn new(
        target: &Arc<Target>,
        who: Initiator,
        port: u16,
        done: Rc<dyn TaskDone>,
    ) -> Result<Session, crate::target::TargetError> {
        let port = target.port(port).ok_or(crate::target::TargetError::NoSuchPort(port))?;
        let core = ferrite_reactor::current().unwrap_or(0);
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let who_ref = who.intern();
        let inner = Rc::new_cyclic(|me| Inner {
            id,
            core,
            target: target.clone(),
            who,
            who_ref,
            port,
            gen: Cell::new(u64::MAX),
            luns: RefCell::new(Vec::new()),
            slots: RefCell::new(SlotTable::default()),
            max_tasks: DEFAULT_MAX_TASKS,
            done,
            me: me.clone(),
            waiters: RefCell::new(Vec::new()),
            closed: Cell::new(false),
        });
        inner.refresh();
        SESSIONS.with(|s| s.borrow_mut().insert(id, Rc::downgrade(&inner)));
        Ok(Session { inner })
    }

    /// The session's id (unique in the process).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The bytes of data-out the transport must gather for `cdb` to LUN `lun` before
    /// submitting it (R2T): at most `expected` (the transport's expected length), and none
    /// when the CDB will be refused whatever data comes (bad CDB, a length beyond the
    /// expected one, an unknown LUN).
    pub fn data_out_len(&self, lun: u64, cdb: &[u8], expected: u32) -> u32 {
        let s = &self.inner;
        s.refresh();
        let luns = s.luns.borrow();
        let Some(ls) = luns.iter().find(|l| l.id == lun) else { return 0 };
        match cdb::decode(cdb) {
            Ok(c) => {
                let bs = ls.lun.bdev().block_size();
                c.fit_data_out(expected, bs).map_or(0, |run| run.data_out_len(bs) as u32)
            }
            Err(_) => 0,
        }
    }

    /// Follows the target's logical units now (attaches new ones; lets removed ones go, with
    /// their channels) instead of at the next command: a transport calls it when it learns
    /// that a logical unit was removed, so that an idle nexus does not keep it.
    pub fn refresh(&self) {
        self.inner.refresh()
    }

    /// Runs `task`; its response goes to the session's [`TaskDone`] with `tag`.
    pub fn submit(&self, task: Task, tag: u64) {
        self.inner.submit(task, tag, None)
    }

    /// Runs `task` and waits for its response, which does not go to the [`TaskDone`] (for
    /// tests and simple callers: allocates; `tag` names it for [`Session::abort_task`]).
    pub async fn execute(&self, task: Task, tag: u64) -> Response {
        let (tx, rx) = ferrite_reactor::oneshot::channel();
        self.inner.submit(task, tag, Some(Box::new(move |r| tx.send(r))));
        rx.await.unwrap_or_default()
    }

    /// ABORT TASK: ends the task submitted with `tag` to `lun`.
    pub async fn abort_task(&self, lun: u64, tag: u64) -> TmfResponse {
        let s = &self.inner;
        if !s.has_lun(lun) {
            return TmfResponse::NoSuchLun;
        }
        let marked = s.mark(|t| t.lun == lun && t.tag == tag);
        if marked.is_empty() {
            return TmfResponse::NoSuchTask;
        }
        s.wait_gone(marked).await;
        TmfResponse::Complete
    }

    /// ABORT TASK SET: ends every task of this nexus on `lun`.
    pub async fn abort_task_set(&self, lun: u64) -> TmfResponse {
        let s = &self.inner;
        if !s.has_lun(lun) {
            return TmfResponse::NoSuchLun;
        }
        let marked = s.mark(|t| t.lun == lun);
        s.wait_gone(marked).await;
        TmfResponse::Complete
    }

    /// CLEAR TASK SET: ends every task on `lun`, of every nexus; the other nexuses that lost
    /// tasks get COMMANDS CLEARED BY ANOTHER INITIATOR (TAS is 0).
    pub async fn clear_task_set(&self, lun: u64) -> TmfResponse {
        let Some(l) = self.inner.lun_slot(lun) else { return TmfResponse::NoSuchLun };
        let marked = self.inner.mark(|t| t.lun == lun);
        let others = abort_elsewhere(&l.lun, lun, self.inner.id, |_| true).await;
        self.inner.wait_gone(marked).await;
        for sid in others {
            if let Some(n) = l.lun.nexuses.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|n| n.session == sid) {
                n.ua.establish((0x2f, 0x00));
            }
        }
        TmfResponse::Complete
    }

    /// LOGICAL UNIT RESET: ends every task on `lun` of every nexus, releases an SPC-2
    /// reservation, puts the mode pages back to their defaults, and establishes BUS DEVICE
    /// RESET FUNCTION OCCURRED for every nexus. Persistent reservations stay (SPC-4).
    pub async fn lun_reset(&self, lun: u64) -> TmfResponse {
        let Some(l) = self.inner.lun_slot(lun) else { return TmfResponse::NoSuchLun };
        let marked = self.inner.mark(|t| t.lun == lun);
        abort_elsewhere(&l.lun, lun, self.inner.id, |_| true).await;
        self.inner.wait_gone(marked).await;
        reset_lun(&l.lun);
        TmfResponse::Complete
    }

    /// Tasks in flight.
    pub fn tasks(&self) -> usize {
        self.inner.slots.borrow().live()
    }
}

/// What a logical unit reset does to the unit itself.
pub(crate) fn reset_lun(lun: &Lun) {
    lun.set_spc2(None);
    {
        let mut m = lun.mode.lock().unwrap_or_else(|p| p.into_inner());
        m.reset();
        lun.publish_mode(&m);
    }
    lun.establish_all(asc::BUS_DEVICE_RESET, None);
}

/// Aborts the tasks on `lun` (number `lun_id`) of the sessions other than `except` whose
/// initiator `pick` selects, on their reactors, and waits until they have ended. Returns the
/// sessions that had tasks.
pub(crate) async fn abort_elsewhere(
    lun: &Lun,
    lun_id: u64,
    except: u64,
    pick: impl Fn(&Initiator) -> bool,
) -> Vec<u64> {
    let engine = ferrite_reactor::engine();
    let mut waits = Vec::new();
    for (sid, core, who) in lun.sessions(except) {
        if !pick(&who) {
            continue;
        }
        let rx = engine.run_async(core, move || async move {
            let Some(s) = SESSIONS.with(|m| m.borrow().get(&sid).and_then(Weak::upgrade)) else { return 0 };
            let marked = s.mark(|t| t.lun == lun_id);
            let n = marked.len();
            s.wait_gone(marked).await;
            n
        });
        waits.push((sid, rx));
    }
    let mut had = Vec::new();
    for (sid, rx) in waits {
        if rx.await.unwrap_or(0) > 0 {
            had.push(sid);
        }
    }
    had
}

impl Drop for Session {
    fn drop(&mut self) {
        self.inner.close();
    }
}

/// Where one task's response goes instead of the session's [`TaskDone`].
type Once = Box<dyn FnOnce(Response)>;

/// The transfer-length field's byte in a READ or WRITE CDB of `len` bytes.
fn length_field(len: usize) -> u16 {
    match len {
        6 => 4,
        10 => 7,
        12 => 6,
        _ => 10,
    }
}

impl Inner {
    fn rc(&self) -> Rc<Inner> {
        self.me.upgrade().expect("a live session")
    }

    pub(crate) fn who_id(&self) -> InitiatorId {
        self.who_ref.id()
    }

    pub(crate) fn nexus_key(&self) -> NexusKey {
        NexusKey { who: self.who_ref.id(), port: self.port.rel_id }
    }

    /// Follows the target's LUN set: attaches to new logical units, leaves removed ones.
    #[inline]
    fn refresh(&self) {
        let g = self.target.generation();
        if g != self.gen.get() {
            self.rebuild(g);
        }
    }

    #[cold]
    fn rebuild(&self, g: u64) {
        let now: Vec<(u64, Arc<Lun>)> = {
            let st = self.target.state.lock().unwrap_or_else(|p| p.into_inner());
            st.luns.iter().map(|(k, v)| (*k, v.clone())).collect()
        };
        let mut luns = self.luns.borrow_mut();
        luns.retain(|l| {
            let keep = now.iter().any(|(id, lun)| *id == l.id && Arc::ptr_eq(lun, &l.lun));
            if !keep {
                l.lun.detach(self.id);
            }
            keep
        });
        for (id, lun) in now {
            if luns.iter().any(|l| l.id == id) {
                continue;
            }
            let ua = Arc::new(UnitAttention::default());
            lun.attach(NexusEntry { session: self.id, core: self.core, who: self.who.clone(), ua: ua.clone() });
            let ch = lun.channel().ok();
            luns.push(LunSlot { id, lun, ua, ch });
        }
        self.gen.set(g);
    }

    fn has_lun(&self, lun: u64) -> bool {
        self.refresh();
        self.luns.borrow().iter().any(|l| l.id == lun)
    }

    pub(crate) fn lun_slot(&self, lun: u64) -> Option<LunSlot> {
        self.refresh();
        self.luns.borrow().iter().find(|l| l.id == lun).cloned()
    }

    fn d_sense(&self, lun: u64) -> bool {
        self.luns.borrow().iter().find(|l| l.id == lun).is_some_and(|l| l.lun.d_sense())
    }

    fn submit(&self, task: Task, tag: u64, once: Option<Once>) {
        self.refresh();
        let luns = self.luns.borrow();
        let Some(ls) = luns.iter().find(|l| l.id == task.lun) else {
            drop(luns);
            return self.start_slow(task, tag, None, once, None);
        };
        let cdb = task.cdb.as_slice();
        let opcode = cdb.first().copied().unwrap_or(0xff);
        let expected = task.expected_len;
        let d = ls.lun.d_sense();
        if ls.ua.pending() && !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
            if let Some(code) = ls.ua.take() {
                drop(luns);
                let f = Fault::check(SENSE_UNIT_ATTENTION, code);
                return self.reply(tag, once, fault_response(f, d, expected, 0));
            }
        }
        let cmd = match cdb::decode(cdb) {
            Ok(c) => c,
            Err(f) => {
                drop(luns);
                return self.reply(tag, once, fault_response(f, d, expected, 0));
            }
        };
        // The data-out the command has (`need`) and the command that runs on what the
        // expected length lets through (`run`: a WRITE may be cut to it).
        let need = cmd.data_out_len(ls.lun.bdev().block_size());
        let Some(run) = cmd.fit_data_out(expected, ls.lun.bdev().block_size()) else {
            // Neither asked for nor written: the command fails whole, with the length the
            // expected one disagrees with as the residual. COMPARE AND WRITE's length is its
            // NUMBER OF LOGICAL BLOCKS field, so that field is invalid (as LIO answers; the
            // 8-bit field holds 256 blocks as 0); otherwise the command IU's length is.
            drop(luns);
            let f = if matches!(cmd, Command::CompareAndWrite(_)) {
                Fault::invalid_cdb(13, None)
            } else {
                Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CMD_IU)
            };
            return self.reply(tag, once, fault_response(f, d, expected, need));
        };
        if let Err(f) = crate::pr::conflict(&ls.lun, self.nexus_key(), self.who_id(), &cmd) {
            drop(luns);
            return self.reply(tag, once, fault_response(f, d, expected, 0));
        }
        let (rw, blocks, write) = match (cmd, run) {
            (Command::Read(rw), _) => (rw, rw.blocks, false),
            (Command::Write(rw), Command::Write(cut)) => (rw, cut.blocks, true),
            (_, run) => {
                drop(luns);
                return self.start_slow(task, tag, Some(run), once, (run != cmd).then_some(need));
            }
        };
        let checked = self.check_rw(ls, rw, blocks, cdb.len(), &task, write);
        drop(luns);
        let ch = match checked {
            Ok(Some(ch)) => ch,
            Ok(None) => {
                return self.reply(tag, once, Response { residual: Residual::of(expected, need), ..Default::default() })
            }
            Err(f) => return self.reply(tag, once, fault_response(f, d, expected, need)),
        };
        // A write's residual counts against the CDB's length, not the part written.
        let kind = if write {
            Kind::Write { len: need }
        } else {
            Kind::Read { len: u64::from(rw.blocks) * u64::from(ch.block_size()) }
        };
        let Some(idx) = self.take_slot(task.lun, tag, expected, kind, once) else {
            return self.task_set_full(tag, expected);
        };
        let mut req = if write {
            let mut r = IoRequest::new(IoType::Write, rw.lba, u64::from(blocks));
            r.bufs = task.data_out;
            if rw.fua || self.fua_writes(task.lun) {
                r.flags = IoFlags::FUA;
            }
            r
        } else {
            IoRequest::read_zcopy(rw.lba, u64::from(rw.blocks))
        };
        req.initiator = Some(self.who_id());
        ch.submit(req, self.rc(), u64::from(idx));
    }

    fn fua_writes(&self, lun: u64) -> bool {
        self.luns.borrow().iter().find(|l| l.id == lun).is_some_and(|l| l.lun.fua_writes())
    }

    /// The checks of a READ or WRITE `rw` that moves `blocks` of its blocks (fewer when the
    /// expected length cut a write); its channel, or None for a transfer of no blocks (GOOD
    /// once checked).
    fn check_rw(
        &self,
        ls: &LunSlot,
        rw: Rw,
        blocks: u32,
        cdb_len: usize,
        task: &Task,
        write: bool,
    ) -> Result<Option<IoChannel>, Fault> {
        let lun = &ls.lun;
        if write && lun.write_protected() {
            return Err(Fault::check(SENSE_DATA_PROTECT, asc::WRITE_PROTECTED));
        }
        if lun.stopped() {
            return Err(Fault::check(SENSE_NOT_READY, asc::NOT_READY_INIT_REQUIRED));
        }
        let Some(ch) = &ls.ch else { return Err(Fault::of_io(ferrite_bdev::IoStatus::Removed)) };
        if rw.lba.checked_add(u64::from(rw.blocks)).is_none_or(|end| end > ch.num_blocks()) {
            return Err(Fault::lba_out_of_range());
        }
        if rw.blocks > lun.max_transfer_blocks() {
            return Err(Fault::invalid_cdb(length_field(cdb_len), None));
        }
        if blocks == 0 {
            return Ok(None);
        }
        let len = u64::from(blocks) * u64::from(ch.block_size());
        if write && task.data_out.iter().map(|b| b.len() as u64).sum::<u64>() != len {
            return Err(Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CMD_IU));
        }
        Ok(Some(ch.clone()))
    }

    fn task_set_full(&self, tag: u64, expected: u32) {
        let f = Fault {
            sense: ferrite_bdev::translate::Sense {
                status: crate::sense::STATUS_TASK_SET_FULL,
                key: 0,
                asc: 0,
                ascq: 0,
            },
            info: None,
            field: None,
        };
        self.reply(tag, None, fault_response(f, false, expected, 0));
    }

    fn take_slot(&self, lun: u64, tag: u64, expected: u32, kind: Kind, once: Option<Once>) -> Option<u32> {
        let mut slots = self.slots.borrow_mut();
        let idx = slots.take(self.max_tasks, || Slot {
            tag: 0,
            lun: 0,
            gen: 0,
            live: false,
            aborted: false,
            expected: 0,
            kind: Kind::Slow,
            once: None,
        })?;
        let s = &mut slots[idx as usize];
        debug_assert!(!s.live, "a slot taken while in use");
        s.tag = tag;
        s.lun = lun;
        s.gen += 1;
        s.live = true;
        s.aborted = false;
        s.expected = expected;
        s.kind = kind;
        s.once = once;
        Some(idx)
    }

    /// Runs `cmd` as a local task. `would`: the data-out length of the CDB when `cmd` is
    /// the CDB's command cut to the expected length; the residual counts against it.
    fn start_slow(&self, task: Task, tag: u64, cmd: Option<Command>, once: Option<Once>, would: Option<u64>) {
        let expected = task.expected_len;
        let Some(idx) = self.take_slot(task.lun, tag, expected, Kind::Slow, once) else {
            return self.task_set_full(tag, expected);
        };
        let me = self.rc();
        ferrite_reactor::spawn_local(async move {
            let mut resp = exec::run(&me, task, cmd).await;
            if let Some(w) = would {
                resp.residual = Residual::of(expected, w);
            }
            me.finish(idx, resp);
        })
        .detach();
    }

    /// Ends the task in slot `idx` with `resp` (or as aborted).
    fn finish(&self, idx: u32, mut resp: Response) {
        let (tag, once) = {
            let mut slots = self.slots.borrow_mut();
            let s = &mut slots[idx as usize];
            debug_assert!(s.live, "a task ends once");
            s.live = false;
            if s.aborted {
                resp = Response { aborted: true, status: crate::sense::STATUS_TASK_ABORTED, ..Default::default() };
            }
            let r = (s.tag, s.once.take());
            slots.release(idx);
            r
        };
        self.reply(tag, once, resp);
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    fn reply(&self, tag: u64, once: Option<Once>, resp: Response) {
        match once {
            Some(f) => f(resp),
            None if self.closed.get() => {}
            None => self.done.task_done(tag, resp),
        }
    }

    /// Marks the live tasks `pick` selects aborted and asks the bdev layer to stop the
    /// requests they have with it; returns them (slot, generation).
    fn mark(&self, pick: impl Fn(&Slot) -> bool) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let mut aborts = Vec::new();
        {
            let mut slots = self.slots.borrow_mut();
            for (i, s) in slots.iter_mut() {
                if s.live && !s.aborted && pick(s) {
                    s.aborted = true;
                    out.push((i, s.gen));
                    if s.kind != Kind::Slow {
                        aborts.push((s.lun, i));
                    }
                }
            }
        }
        if !aborts.is_empty() {
            struct Ignore;
            impl IoCompleter for Ignore {
                fn io_done(&self, _tag: u64, _io: Completed) {}
            }
            let me: Rc<Inner> = self.rc();
            let ignore: Rc<dyn IoCompleter> = Rc::new(Ignore);
            for (lun, i) in aborts {
                if let Some(ch) = self.luns.borrow().iter().find(|l| l.id == lun).and_then(|l| l.ch.clone()) {
                    ch.submit(IoRequest::abort(&me, u64::from(i)), ignore.clone(), 0);
                }
            }
        }
        out
    }

    /// Waits until every task of `marked` has ended.
    async fn wait_gone(&self, marked: Vec<(u32, u64)>) {
        std::future::poll_fn(|cx| {
            let slots = self.slots.borrow();
            let busy = marked.iter().any(|&(i, g)| slots.get(i).is_some_and(|s| s.live && s.gen == g));
            if busy {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await
    }

    /// The nexus is lost: its tasks are aborted (their responses dropped), an SPC-2
    /// reservation it holds is released, and it leaves its logical units.
    fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        self.mark(|_| true);
        let key = self.nexus_key();
        for l in self.luns.borrow().iter() {
            let held = *l.lun.spc2.lock().unwrap_or_else(|p| p.into_inner()) == Some(key);
            if held {
                l.lun.set_spc2(None);
            }
            l.lun.detach(self.id);
        }
        let _ = SESSIONS.try_with(|s| s.borrow_mut().remove(&self.id));
    }
}

impl IoCompleter for Inner {
    fn io_done(&self, tag: u64, mut io: Completed) {
        let idx = tag as u32;
        let (lun, expected, kind) = {
            let slots = self.slots.borrow();
            let s = &slots[idx as usize];
            (s.lun, s.expected, s.kind)
        };
        let resp = if io.status.is_ok() {
            match kind {
                Kind::Read { len } => {
                    let bufs = std::mem::take(&mut io.req.bufs);
                    Response {
                        data: bufs,
                        data_len: len.min(u64::from(expected)) as u32,
                        residual: Residual::of(expected, len),
                        ..Default::default()
                    }
                }
                Kind::Write { len } => Response { residual: Residual::of(expected, len), ..Default::default() },
                Kind::Slow => unreachable!("slow tasks do not use the session's completer"),
            }
        } else {
            let would = match kind {
                Kind::Write { len } => len,
                _ => 0,
            };
            fault_response(Fault::of_io(io.status), self.d_sense(lun), expected, would)
        };
        drop(io);
        self.finish(idx, resp);
    }
}

/// The response of a failed task: its status, its sense data (in descriptor format with
/// `d_sense`), no data, and the residual of a command that would have moved `would` bytes.
pub(crate) fn fault_response(f: Fault, d_sense: bool, expected: u32, would: u64) -> Response {
    Response {
        status: f.sense.status,
        sense: if f.has_sense() { f.encode(d_sense) } else { Default::default() },
        residual: Residual::of(expected, would),
        ..Default::default()
    }
}
