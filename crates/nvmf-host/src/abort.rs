//! Abort of an outstanding request (a bdev abort request, or a descriptor timeout's): a request
//! still waiting on this reactor (parked, or for its queue pair) completes as Aborted at once;
//! one with the controller gets an NVMe Abort (admin opcode 08h, CDW10 = SQID | CID << 16) on
//! the controller's admin queue. The controller may answer "not aborted" (CQE DW0 bit 0 set: the
//! command had finished, or its target could not stop it): the abort then fails and the request
//! completes as it will. Ferrite's and SPDK's targets abort an I/O command their bdev holds.
//!
//! A controller takes at most its Abort Command Limit (Identify ACL + 1) at once and answers
//! more with "Abort Command Limit Exceeded". Aborts beyond it wait here ([`AbortGate`]), as in
//! SPDK's `queued_aborts`; unlike SPDK's, a waiting Abort is dropped if its command completed
//! meanwhile, as the command's ID may by then name another command.

use crate::channel::NsChan;
use crate::ctrlr::HostCtrlr;
use crate::qpair::HostQpair;
use ferrite_bdev::{BdevIo, IoAux, IoStatus};
use ferrite_nvme::spec::opcode::admin as op;
use ferrite_nvme::spec::sqe::Sqe;
use ferrite_reactor::oneshot;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// Aborts a controller takes at once at most, whatever its ACL says: its admin queue (32
/// entries) also carries keep-alives, the event requests and the commands of RPCs.
const MOST_AT_ONCE: u16 = 8;

/// Counts a controller's outstanding Aborts against its limit; the ones beyond it wait in
/// order. Aborts are rare: the lock is never taken on the I/O path.
pub(crate) struct AbortGate {
    state: Mutex<GateState>,
}

struct GateState {
    limit: u16,
    outstanding: u16,
    waiting: VecDeque<oneshot::Sender<AbortPermit>>,
}

/// Leave to have one Abort outstanding; dropping it lets the next one go.
pub(crate) struct AbortPermit(Arc<AbortGate>);

impl AbortGate {
    /// A gate for one Abort at once (ACL 0) until the controller is identified.
    pub(crate) fn new() -> Arc<AbortGate> {
        Arc::new(AbortGate { state: Mutex::new(GateState { limit: 1, outstanding: 0, waiting: VecDeque::new() }) })
    }

    /// Sets the limit from Identify Controller's ACL (0-based).
    pub(crate) fn set_acl(self: &Arc<Self>, acl: u8) {
        let limit = (u16::from(acl) + 1).min(MOST_AT_ONCE);
        let mut more = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            st.limit = limit;
            while st.outstanding < st.limit {
                let Some(w) = st.waiting.pop_front() else { break };
                st.outstanding += 1;
                more.push(w);
            }
        }
        for w in more {
            w.send(AbortPermit(self.clone()));
        }
    }

    /// Waits for leave to send an Abort.
    pub(crate) async fn permit(self: &Arc<Self>) -> AbortPermit {
        let rx = {
            let mut st = self.state.lock().unwrap();
            if st.outstanding < st.limit {
                st.outstanding += 1;
                return AbortPermit(self.clone());
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.push_back(tx);
            rx
        };
        match rx.await {
            Ok(p) => p,
            // The gate never drops a waiter's sender unsent; if it did, go on without leave
            // rather than never.
            Err(_) => {
                self.state.lock().unwrap().outstanding += 1;
                AbortPermit(self.clone())
            }
        }
    }

    /// (outstanding, waiting, limit), for tests and logs.
    #[cfg(test)]
    fn counts(&self) -> (u16, usize, u16) {
        let st = self.state.lock().unwrap();
        (st.outstanding, st.waiting.len(), st.limit)
    }
}

impl Drop for AbortPermit {
    fn drop(&mut self) {
        let next = {
            let mut st = self.0.state.lock().unwrap();
            if st.outstanding > st.limit {
                // The limit went down: this leave is not passed on.
                st.outstanding -= 1;
                None
            } else if let Some(w) = st.waiting.pop_front() {
                Some(w)
            } else {
                st.outstanding -= 1;
                None
            }
        };
        // Sent outside the lock: a waiter that has gone drops the permit, which passes it on.
        if let Some(w) = next {
            w.send(AbortPermit(self.0.clone()));
        }
    }
}

/// How an Abort ended.
pub(crate) enum Outcome {
    /// Not sent: the command was no longer outstanding (or its queue pair had closed).
    Gone,
    /// The controller aborted the command.
    Aborted,
    /// The admin queue closed under the Abort (a detach, or the controller lost): what closed
    /// it deals with the command.
    Closed,
    /// The controller answered that it did not abort the command, or refused the Abort.
    NotAborted,
    /// The Abort could not be sent.
    Failed,
}

/// Sends an NVMe Abort of command `cid` of `qp` once the controller's Abort Command Limit
/// allows, if `still(qp)` holds then (the command is still the one meant), and logs how it
/// ended.
pub(crate) async fn send_abort(
    ctrlr: &Arc<HostCtrlr>,
    qp: &Rc<HostQpair>,
    cid: u16,
    still: impl Fn(&HostQpair) -> bool,
) -> Outcome {
    let (name, sqid) = (&ctrlr.opts.name, qp.qid());
    let reply = {
        let _leave = ctrlr.aborts.permit().await;
        if qp.is_closed() || !still(qp) {
            log::info!("nvme controller {name}: command {cid} of queue {sqid} is no longer outstanding; no Abort sent");
            return Outcome::Gone;
        }
        let mut sqe = Sqe::new(op::ABORT, 0, 0);
        sqe.cdw10 = u32::from(sqid) | u32::from(cid) << 16;
        ctrlr.admin_command(sqe).await
    };
    match reply {
        Ok(r) if r.cqe.status.is_success() && r.cqe.dw0 & 1 == 0 => {
            log::info!("nvme controller {name}: command {cid} of queue {sqid} aborted");
            Outcome::Aborted
        }
        Ok(r) if crate::qpair::connection_failed(&r.cqe) => {
            log::info!(
                "nvme controller {name}: the admin queue closed before command {cid} of queue {sqid} was aborted"
            );
            Outcome::Closed
        }
        Ok(r) => {
            log::info!(
                "nvme controller {name}: command {cid} of queue {sqid} not aborted (dw0 {:#x}, sct {:#x} sc {:#x})",
                r.cqe.dw0,
                r.cqe.status.sct,
                r.cqe.status.sc
            );
            Outcome::NotAborted
        }
        Err(e) => {
            log::info!("nvme controller {name}: Abort of command {cid} of queue {sqid}: {e}");
            Outcome::Failed
        }
    }
}

/// Handles abort request `io` on channel `ch`.
pub(crate) fn abort(ch: &NsChan, io: BdevIo) {
    let IoAux::Abort { completer, tag } = io.req.aux else {
        return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
    };
    let named = move |r: &BdevIo| r.is_named_by(completer, tag);
    if tag == ferrite_bdev::io::ALL_TAGS {
        return abort_all(ch, io, named);
    }
    if ch.abort_waiting(&named) > 0 {
        return io.complete_deferred(IoStatus::Success);
    }
    let mut found = None;
    ch.each_path(&mut |c, p| {
        if found.is_none() {
            if let Some(qp) = p.qpair() {
                if let Some(cid) = qp.find_command(&named) {
                    found = Some((c.clone(), qp, cid));
                }
            }
        }
    });
    let Some((ctrlr, qp, cid)) = found else {
        log::debug!("nvme: abort: no request of this channel has that name");
        return io.complete_deferred(IoStatus::Failed(libc::ENOENT));
    };
    ferrite_reactor::spawn_local(async move {
        let status = match send_abort(&ctrlr, &qp, cid, |qp| qp.find_command(&named) == Some(cid)).await {
            Outcome::Gone => IoStatus::Failed(libc::ENOENT),
            Outcome::Aborted => IoStatus::Success,
            Outcome::NotAborted => IoStatus::Failed(libc::EBUSY),
            Outcome::Closed | Outcome::Failed => IoStatus::Failed(libc::EIO),
        };
        io.complete(status);
    })
    .detach();
}

/// An abort of every request of a completer: what waits here ends at once, and each command of
/// it on a controller gets an NVMe Abort (as many at a time as the controller's limit allows);
/// the abort request itself succeeds once they have all been answered.
fn abort_all(ch: &NsChan, io: BdevIo, named: impl Fn(&BdevIo) -> bool + Clone + 'static) {
    ch.abort_waiting(&named);
    let mut sent = Vec::new();
    ch.each_path(&mut |c, p| {
        if let Some(qp) = p.qpair() {
            for cid in qp.find_commands(&named) {
                sent.push((c.clone(), qp.clone(), cid));
            }
        }
    });
    if sent.is_empty() {
        return io.complete_deferred(IoStatus::Success);
    }
    ferrite_reactor::spawn_local(async move {
        for (ctrlr, qp, cid) in sent {
            let named = named.clone();
            let _ = send_abort(&ctrlr, &qp, cid, move |qp| qp.find_commands(&named).contains(&cid)).await;
        }
        io.complete(IoStatus::Success);
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    #[test]
    fn aborts_beyond_the_limit_wait_and_go_in_order() {
        let gate = AbortGate::new();
        gate.set_acl(1);
        let a = block_on(gate.permit());
        let b = block_on(gate.permit());
        assert_eq!(gate.counts(), (2, 0, 2));
        // A third waits until one of the two is done.
        let g = gate.clone();
        let third = std::thread::spawn(move || block_on(g.permit()));
        while gate.counts().1 == 0 {
            std::thread::yield_now();
        }
        assert_eq!(gate.counts(), (2, 1, 2));
        drop(a);
        let c = third.join().unwrap();
        assert_eq!(gate.counts(), (2, 0, 2), "the leave passed on");
        drop((b, c));
        assert_eq!(gate.counts(), (0, 0, 2));
        // A limit above the admin queue's share is cut.
        gate.set_acl(255);
        assert_eq!(gate.counts().2, MOST_AT_ONCE);
    }

    #[test]
    fn a_waiter_that_went_away_passes_its_leave_on() {
        let gate = AbortGate::new();
        let a = block_on(gate.permit());
        {
            let mut fut = Box::pin(gate.permit());
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(gate.counts(), (1, 1, 1));
        drop(a);
        assert_eq!(gate.counts(), (0, 0, 1), "the gone waiter's leave came back");
    }

    /// Runs a future to its end on this thread.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::yield_now();
        }
    }
}
