//! One reactor's way to one controller: its I/O queue pair (made when first needed, remade
//! after the controller reconnects) and the requests waiting for it.

use crate::ctrlr::HostCtrlr;
use crate::qpair::HostQpair;
use ferrite_bdev::{BdevIo, IoStatus};
use ferrite_nvme::spec::sqe::Sqe;
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
    /// The controller generation in which a queue pair of this path failed on its own (or
    /// could not be connected), and whether the controller is being reset for it: as SPDK's
    /// bdev_nvme, a failed I/O queue pair resets the controller, and the path waits for the
    /// next generation instead of connecting again on its own.
    failed_in: Cell<Option<(u64, bool)>>,
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
            failed_in: Cell::new(None),
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
        // Fail at once past the fast-fail or loss timeout while the controller is away (up, it
        // is tried: a recovery's clock may still run until its I/O queues have stayed up).
        let due = !self.ctrlr.is_up() && self.ctrlr.io_fail_due();
        if due || self.gave_up_until.get().is_some_and(|t| Instant::now() < t) {
            return io.complete_deferred(IoStatus::Failed(libc::EIO));
        }
        self.waiting.borrow_mut().push_back(Waiting { sqe, io, read, extra });
        self.connect();
    }

    /// Connects the queue pair unless connecting; sends what waits once connected. Waits
    /// while the controller is reset (or reconnects), and fails what waits once the
    /// controller's I/O is due to fail (`fast_io_fail_timeout_sec`, `ctrlr_loss_timeout_sec`).
    fn connect(self: &Rc<Self>) {
        if self.connecting.replace(true) {
            return;
        }
        let me = self.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                let c = &me.ctrlr;
                let gen = c.generation.load(Ordering::Acquire);
                let failed_here = me.failed_in.get().is_some_and(|(g, _)| g == gen);
                let away = c.resetting.load(Ordering::Acquire) || failed_here;
                if c.detached.load(Ordering::Acquire) || c.failed.load(Ordering::Acquire) || away && c.io_fail_due() {
                    me.give_up();
                    return;
                }
                let waiting_reset = match me.failed_in.get() {
                    Some((g, reset)) if g == gen => {
                        if !reset {
                            // No reset comes for it (`ctrlr_loss_timeout_sec` 0, and a reset
                            // already failed to bring the queues back): fail what waits; the
                            // next request after a reconnect delay tries once more.
                            me.failed_in.set(None);
                            me.give_up();
                            return;
                        }
                        true
                    }
                    _ => false,
                };
                if waiting_reset || c.resetting.load(Ordering::Acquire) {
                    // Its new I/O queue pair can be made as soon as it is up.
                    ferrite_reactor::sleep(Duration::from_millis(10)).await;
                    if me.waiting.borrow().is_empty() {
                        break;
                    }
                    continue;
                }
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
                let params = c.params(qid, c.io_entries(), c.cntlid.load(Ordering::Acquire));
                let res = match params {
                    Ok(params) => HostQpair::connect(&params).await,
                    Err(e) => Err(e),
                };
                match res {
                    Ok(qp) => {
                        me.use_qpair(qp.clone(), gen);
                        if qp.is_closed() {
                            // It failed at once (its requests came back): the controller is
                            // reset, as for any queue pair that fails.
                            me.queue_failed(gen);
                        }
                        if me.waiting.borrow().is_empty() {
                            break;
                        }
                    }
                    Err(e) => {
                        log::warn!("nvme controller {}: I/O queue {qid}: {e}", c.opts.name);
                        me.queue_failed(gen);
                    }
                }
            }
            me.connecting.set(false);
        })
        .detach();
    }

    /// A queue pair of controller generation `gen` failed on its own or could not be
    /// connected: the controller is reset (once per generation), or, if no reset comes, what
    /// waits fails.
    fn queue_failed(&self, gen: u64) {
        if self.failed_in.get().is_some_and(|(g, _)| g == gen) {
            return;
        }
        let reset = self.ctrlr.io_queue_failed(gen);
        self.failed_in.set(Some((gen, reset)));
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
        *self.qp.borrow_mut() = Some(qp.clone());
        self.qp_gen.set(gen);
        self.gave_up_until.set(None);
        self.failed_in.set(None);
        self.ctrlr.io_queue_connected(&qp, gen);
        // Set last: it runs at once if the queue pair has closed already.
        let path = Rc::downgrade(self);
        let q2 = Rc::downgrade(&qp);
        qp.on_close(move || {
            let Some(path) = path.upgrade() else { return };
            let ours = {
                let mut cur = path.qp.borrow_mut();
                let ours = cur.as_ref().is_some_and(|q| q2.upgrade().is_some_and(|x| Rc::ptr_eq(q, &x)));
                if ours {
                    *cur = None;
                }
                ours
            };
            // Still the path's: it failed on its own (the host takes a queue pair out of its
            // path before closing it), as SPDK's disconnected qpair callback sees it.
            if ours && !path.ctrlr.detached.load(Ordering::Acquire) {
                path.queue_failed(gen);
            }
        });
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
