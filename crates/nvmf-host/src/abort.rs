//! Abort of an outstanding request (a bdev abort request, or a descriptor timeout's): a request
//! still waiting on this reactor (parked, or for its queue pair) completes as Aborted at once;
//! one with the controller gets an NVMe Abort (admin opcode 08h, CDW10 = SQID | CID << 16) on
//! the controller's admin queue. The controller may answer "not aborted" (CQE DW0 bit 0 set: the
//! command had finished, or its target could not stop it): the abort then fails and the request
//! completes as it will. Ferrite's and SPDK's targets abort an I/O command their bdev holds.

use crate::channel::NsChan;
use ferrite_bdev::{BdevIo, IoAux, IoStatus};
use ferrite_nvmf::spec::opcode::admin as op;
use ferrite_nvmf::spec::sqe::Sqe;

/// Handles abort request `io` on channel `ch`.
pub(crate) fn abort(ch: &NsChan, io: BdevIo) {
    let IoAux::Abort { completer, tag } = io.req.aux else {
        return io.complete_deferred(IoStatus::Failed(libc::EINVAL));
    };
    let named = |r: &BdevIo| r.is_named_by(completer, tag);
    if ch.abort_waiting(&named) > 0 {
        return io.complete_deferred(IoStatus::Success);
    }
    let mut found = None;
    ch.each_path(&mut |c, p| {
        if found.is_none() {
            if let Some(qp) = p.qpair() {
                if let Some(cid) = qp.find_command(&named) {
                    found = Some((c.clone(), qp.qid(), cid));
                }
            }
        }
    });
    let Some((ctrlr, sqid, cid)) = found else {
        log::debug!("nvme: abort: no request of this channel has that name");
        return io.complete_deferred(IoStatus::Failed(libc::ENOENT));
    };
    ferrite_reactor::spawn_local(async move {
        let mut sqe = Sqe::new(op::ABORT, 0, 0);
        sqe.cdw10 = u32::from(sqid) | u32::from(cid) << 16;
        let status = match ctrlr.admin_command(sqe).await {
            Ok(r) if r.cqe.status.is_success() && r.cqe.dw0 & 1 == 0 => {
                log::info!("nvme controller {}: command {cid} of queue {sqid} aborted", ctrlr.opts.name);
                IoStatus::Success
            }
            Ok(r) => {
                log::info!(
                    "nvme controller {}: command {cid} of queue {sqid} not aborted (dw0 {:#x}, sct {:#x} sc {:#x})",
                    ctrlr.opts.name,
                    r.cqe.dw0,
                    r.cqe.status.sct,
                    r.cqe.status.sc
                );
                IoStatus::Failed(libc::EBUSY)
            }
            Err(e) => {
                log::info!("nvme controller {}: Abort: {e}", ctrlr.opts.name);
                IoStatus::Failed(libc::EIO)
            }
        };
        io.complete(status);
    })
    .detach();
}
