//! One reactor's way to one controller: its I/O queue pair (made when first needed, remade
//! after the controller reconnects) and the requests waiting for it.

use crate::ctrlr::HostCtrlr;
use crate::qpair::HostQpair;
use ferrite_bdev::{BdevIo, IoStatus};
use ferrite_nvmf::spec::sqe::Sqe;
use ferrite_reactor::IoBuf;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request waiting for the I/O queue pair.
struct Waiting {
    sqe: Sqe,
    io: BdevIo,
    read: bool,
    extra: Option<IoBuf>,
}

/// One reactor's way to a controller.
pub struct IoPath {
    /// The controller.
    pub ctrlr: Arc<HostCtrlr>,
    qp: RefCell<Option<Rc<HostQpair>>>,
    /// The controller generation the queue pair was connected in.
    qp_gen: Cell<u64>,
    waiting: RefCell<VecDeque<Waiting>>,
    connecting: Cell<bool>,
    /// A connect gave up: until then, requests fail at once instead of starting another
    /// (one attempt per reconnect delay, not one per request a caller sends again).
    gave_up_until: Cell<Option<Instant>>,
    /// When the last queue pair was connected, and in which controller generation: another
    /// in the same generation (the last one failed on its own, e.g. for the controller's
    /// protocol error) waits for the reconnect delay since then, so that a controller whose
    /// queue pairs fail at once is not connected to in a tight loop.
    last_connect: Cell<Option<(Instant, u64)>>,
}

impl IoPath {
    pub(crate) fn new(ctrlr: Arc<HostCtrlr>) -> Rc<IoPath> {
        Rc::new(IoPath {
            ctrlr,
            qp: RefCell::new(None),
            qp_gen: Cell::new(0),
            waiting: RefCell::new(VecDeque::new()),
            connecting: Cell::new(false),
            gave_up_until: Cell::new(None),
            last_connect: Cell::new(None),
        })
    }

    /// The connected queue pair, if any.
    pub(crate) fn qpair(&self) -> Option<Rc<HostQpair>> {
        self.qp.borrow().clone().filter(|q| !q.is_closed())
    }

    /// Sends a request, or keeps it until the queue pair is connected. Called from a channel's
    /// submit: completes only deferred.
    pub(crate) fn submit(self: &Rc<Self>, sqe: Sqe, io: BdevIo, read: bool, extra: Option<IoBuf>) {
        if self.ctrlr.detached.load(Ordering::Acquire) {
            return io.complete_deferred(IoStatus::Removed);
        }
        if let Some(qp) = self.qpair() {
            if let Err(io) = qp.submit_io(sqe, io, read, extra) {
                // The queue is full: the bdev layer retries when something completes.
                io.complete_deferred(IoStatus::NoMem);
            }
            return;
        }
        if self.ctrlr.io_fail_due() || self.gave_up_until.get().is_some_and(|t| Instant::now() < t) {
            return io.complete_deferred(IoStatus::Failed(libc::EIO));
        }
        self.waiting.borrow_mut().push_back(Waiting { sqe, io, read, extra });
        self.connect();
    }

    /// Connects the queue pair unless connecting; sends what waits once connected.
    fn connect(self: &Rc<Self>) {
        if self.connecting.replace(true) {
            return;
        }
        let me = self.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                let c = &me.ctrlr;
                if c.detached.load(Ordering::Acquire) {
                    me.give_up();
                    return;
                }
                let delay = me.reconnect_delay();
                if let Some((at, g)) = me.last_connect.get() {
                    let next = at + delay;
                    if g == c.generation.load(Ordering::Acquire) && Instant::now() < next {
                        ferrite_reactor::sleep(next - Instant::now()).await;
                        continue;
                    }
                }
                if !c.resetting.load(Ordering::Acquire) {
                    let qid = ferrite_reactor::current().unwrap_or(0) as u16 + 1;
                    let granted = c.info.lock().unwrap().io_queues;
                    if granted != 0 && qid > granted {
                        log::info!(
                            "nvme controller {}: no I/O queue {qid} (the controller grants {granted}): I/O on this reactor fails",
                            c.opts.name
                        );
                        me.give_up();
                        return;
                    }
                    let gen = c.generation.load(Ordering::Acquire);
                    let params = c.params(qid, c.io_entries(), c.cntlid.load(Ordering::Acquire));
                    match params {
                        Ok(params) => match HostQpair::connect(&params).await {
                            Ok(qp) => {
                                me.last_connect.set(Some((Instant::now(), gen)));
                                me.use_qpair(qp, gen);
                                if me.waiting.borrow().is_empty() {
                                    break;
                                }
                                // It closed at once and its requests came back: again, after
                                // the delay.
                                continue;
                            }
                            Err(e) => log::info!("nvme controller {}: I/O queue {qid}: {e}", c.opts.name),
                        },
                        Err(e) => log::info!("nvme controller {}: {e}", c.opts.name),
                    }
                }
                let single = c.trids.lock().unwrap().len() < 2;
                if c.io_fail_due()
                    || single && c.opts.ctrlr_loss_timeout_sec == 0 && !c.resetting.load(Ordering::Acquire)
                {
                    me.give_up();
                    return;
                }
                // While the controller reconnects, look again soon (its new I/O queue pair can
                // be made as soon as it is up); after a failed connect, wait the delay.
                let delay = if c.resetting.load(Ordering::Acquire) {
                    Duration::from_millis(10)
                } else {
                    me.reconnect_delay()
                };
                ferrite_reactor::sleep(delay).await;
                if me.waiting.borrow().is_empty() {
                    break;
                }
            }
            me.connecting.set(false);
        })
        .detach();
    }

    /// Time between connection attempts: `reconnect_delay_sec`, at least 1 s.
    fn reconnect_delay(&self) -> Duration {
        Duration::from_secs(self.ctrlr.opts.reconnect_delay_sec.max(1))
    }

    /// The connect task ends without a queue pair: what waits fails. The task is marked
    /// ended first, so that a request sent again from a failed one's completion is not left
    /// waiting for a task that has gone; it fails too, at once, for a reconnect delay.
    fn give_up(&self) {
        let delay = self.reconnect_delay();
        self.gave_up_until.set(Some(Instant::now() + delay));
        self.connecting.set(false);
        self.fail_waiting();
    }

    fn use_qpair(self: &Rc<Self>, qp: Rc<HostQpair>, gen: u64) {
        qp.icd_max.set(self.ctrlr.info.lock().unwrap().icd_max);
        self.ctrlr.watch(&qp);
        let path = Rc::downgrade(self);
        let q2 = Rc::downgrade(&qp);
        qp.on_close(move || {
            let Some(path) = path.upgrade() else { return };
            let mut cur = path.qp.borrow_mut();
            if cur.as_ref().is_some_and(|q| q2.upgrade().is_some_and(|x| Rc::ptr_eq(q, &x))) {
                *cur = None;
            }
        });
        *self.qp.borrow_mut() = Some(qp.clone());
        self.qp_gen.set(gen);
        self.gave_up_until.set(None);
        let waiting: Vec<Waiting> = self.waiting.borrow_mut().drain(..).collect();
        for w in waiting {
            if let Err(io) = qp.submit_io(w.sqe, w.io, w.read, w.extra) {
                if qp.is_closed() {
                    // Closed already (the controller's error): sent again, a retry counted,
                    // so that a request fails after so many instead of going round for ever.
                    crate::channel::retry(io, IoStatus::Failed(libc::EIO));
                } else {
                    io.complete(IoStatus::NoMem);
                }
            }
        }
    }

    /// The controller reconnected: a queue pair of an older controller is dropped (its
    /// commands go back to their channels) and what waits is sent on a new one.
    pub(crate) fn kick(self: &Rc<Self>) {
        let stale = self
            .qp
            .borrow()
            .as_ref()
            .is_some_and(|_| self.qp_gen.get() != self.ctrlr.generation.load(Ordering::Acquire));
        if stale {
            if let Some(qp) = self.qp.borrow_mut().take() {
                qp.close();
            }
        }
        self.gave_up_until.set(None);
        if !self.waiting.borrow().is_empty() {
            self.connect();
        }
    }

    /// The controller was lost: what waits here goes back to its channels to choose a path
    /// again (another controller of the subsystem may take it; if not, it comes back here).
    pub(crate) fn give_back_waiting(&self) {
        let waiting: Vec<Waiting> = self.waiting.borrow_mut().drain(..).collect();
        for w in waiting {
            crate::channel::resubmit(w.io);
        }
    }

    /// Completes, as Aborted, the waiting requests `named` picks; how many.
    pub(crate) fn abort_waiting(&self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        let picked: Vec<Waiting> = {
            let mut q = self.waiting.borrow_mut();
            let (p, keep): (VecDeque<Waiting>, VecDeque<Waiting>) =
                std::mem::take(&mut *q).into_iter().partition(|w| named(&w.io));
            *q = keep;
            p.into_iter().collect()
        };
        let n = picked.len();
        for w in picked {
            w.io.complete_deferred(IoStatus::Aborted);
        }
        n
    }

    /// Fails every waiting request.
    pub(crate) fn fail_waiting(&self) {
        let waiting: Vec<Waiting> = self.waiting.borrow_mut().drain(..).collect();
        for w in waiting {
            w.io.complete(IoStatus::Failed(libc::EIO));
        }
    }

    /// Closes the queue pair (the controller is detached, or lost); its commands and what
    /// waits go back to their channels, which send them again, on another controller or on
    /// this one once it is back, or fail them.
    pub(crate) fn close(&self) {
        if let Some(qp) = self.qp.borrow_mut().take() {
            qp.close();
        }
        self.give_back_waiting();
    }
}
