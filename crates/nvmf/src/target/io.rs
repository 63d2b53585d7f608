//! NVM I/O commands through the bdev layer: Read (zero-copy where the bdev lends its memory),
//! Write (FUA), Flush, Write Zeroes, Dataset Management (deallocate), Compare and fused
//! Compare-and-Write. The command's slot is the bdev request's tag; each request carries the
//! controller's host (`Conn::who`), whose reservation the bdev layer enforces.

use super::qpair::{set_phase, Conn, Phase};
use crate::spec::opcode::nvm;
use crate::spec::sqe::Fuse;
use crate::spec::status::{generic, Status};
use ferrite_bdev::{
    Completed, FanOut, FanOutCompleter, FanOutDone, IoBufs, IoCompleter, IoFlags, IoRequest, IoStatus, IoType,
};
use std::rc::Rc;
use std::sync::atomic::Ordering;

/// Most ranges in one Dataset Management command.
const DSM_MAX_RANGES: usize = 256;
/// Dataset Management CDW11 Attribute - Deallocate (AD).
const DSM_DEALLOCATE: u32 = 1 << 2;

/// The NVMe status for a bdev status (`ferrite_bdev::translate::nvme_of`, where the rules
/// are). A status an NVMe device answered (Ferrite's host under a re-export) passes through
/// whole, Do Not Retry and More as the device set them.
pub(crate) fn status_of(s: IoStatus) -> Status {
    let n = ferrite_bdev::translate::nvme_of(s);
    let more = matches!(s, IoStatus::Nvme { more: true, .. });
    Status { sct: n.sct, sc: n.sc, crd: 0, more, dnr: n.dnr }
}

fn invalid_field() -> Status {
    Status::generic(generic::INVALID_FIELD).with_dnr()
}

/// Runs the I/O command in `slot` (its data is in).
pub(crate) fn run(c: &Rc<Conn>, slot: u16) {
    // The fields it needs, not a copy of the whole entry (the copy's loads stalled on the
    // stores that had just written it).
    let (opc, fuse, nsid, cdw10, cdw11, cdw12, len) = {
        let cmds = c.cmds.borrow();
        let cmd = &cmds[usize::from(slot)];
        let q = &cmd.sqe;
        (q.opcode, q.fuse, q.nsid, q.cdw10, q.cdw11, q.cdw12, cmd.len)
    };
    let ns = match c.namespace(nsid) {
        Ok(n) => n,
        Err(st) => return c.complete(slot, st, 0, None),
    };
    if let Some(st) = ns.inaccessible {
        return c.complete(slot, st, 0, None);
    }
    if super::resv::is_reservation(opc) && !c.opts.reservations_masked() {
        return super::resv::run(c, slot, ns);
    }
    let bs = u64::from(ns.block_size);
    let slba = u64::from(cdw10) | u64::from(cdw11) << 32;
    let nlb = u64::from(cdw12 & 0xffff) + 1;
    let fua = cdw12 & (1 << 30) != 0;
    let with_data = matches!(opc, nvm::READ | nvm::WRITE | nvm::COMPARE);
    if with_data && nlb * bs != u64::from(len) {
        return c.complete(slot, Status::generic(generic::DATA_SGL_LENGTH_INVALID).with_dnr(), 0, None);
    }
    let count = |read: bool| {
        if let Some(b) = c.bound.borrow().as_ref() {
            // Only this reactor writes these counters: no contended cache line.
            let s = &b.stats;
            let (n, bytes) = if read { (&s.reads, &s.read_bytes) } else { (&s.writes, &s.written_bytes) };
            n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            bytes.store(bytes.load(Ordering::Relaxed) + u64::from(len), Ordering::Relaxed);
        }
    };
    let req = match opc {
        nvm::READ => {
            count(true);
            IoRequest::read_zcopy(slba, nlb)
        }
        nvm::WRITE => {
            count(false);
            if fuse == Fuse::Second {
                return fused_ready(c, slot, ns);
            }
            let Some(buf) = c.cmds.borrow_mut()[usize::from(slot)].buf.take() else {
                return c.complete(slot, invalid_field(), 0, None);
            };
            let r = IoRequest::write(slba, nlb, buf);
            if fua {
                r.with_flags(IoFlags::FUA)
            } else {
                r
            }
        }
        nvm::COMPARE => {
            if fuse == Fuse::First {
                return fused_ready(c, slot, ns);
            }
            let Some(buf) = c.cmds.borrow_mut()[usize::from(slot)].buf.take() else {
                return c.complete(slot, invalid_field(), 0, None);
            };
            IoRequest::compare(slba, nlb, buf)
        }
        nvm::FLUSH => {
            if !ns.ns.bdev().supports(IoType::Flush) {
                let st = super::resv::unsubmitted_conflict(c, &ns, opc).unwrap_or(Status::SUCCESS);
                return c.complete(slot, st, 0, None);
            }
            IoRequest::no_payload(IoType::Flush, 0, 0)
        }
        nvm::WRITE_ZEROES => {
            let r = IoRequest::no_payload(IoType::WriteZeroes, slba, nlb);
            if fua {
                r.with_flags(IoFlags::FUA)
            } else {
                r
            }
        }
        nvm::DATASET_MANAGEMENT => return dsm(c, slot, ns, cdw10, cdw11),
        _ => {
            // Verify and Write Uncorrectable meet the reservation before being refused.
            let st = super::resv::unsubmitted_conflict(c, &ns, opc)
                .unwrap_or_else(|| Status::generic(generic::INVALID_OPCODE).with_dnr());
            return c.complete(slot, st, 0, None);
        }
    };
    let req = req.for_initiator(c.who.get());
    if fuse != Fuse::Normal {
        return c.complete(slot, invalid_field(), 0, None);
    }
    {
        let mut cmds = c.cmds.borrow_mut();
        let cmd = &mut cmds[usize::from(slot)];
        cmd.ns = Some(ns.clone());
    }
    ns.ch.submit(req, c.clone(), u64::from(slot));
}

/// One half of a fused Compare and Write has its data: it waits for the other half, or, if
/// that one is ready too, both run as one compare-and-write of the bdev layer. The halves were
/// paired when their capsules arrived (`Conn::pair_fused`).
fn fused_ready(c: &Rc<Conn>, slot: u16, ns: Rc<super::qpair::NsChan>) {
    let (partner, broken) = {
        let mut cmds = c.cmds.borrow_mut();
        let cmd = &mut cmds[usize::from(slot)];
        set_phase(cmd, Phase::Ready, c.id, slot);
        cmd.since = ferrite_reactor::tsc::ticks();
        cmd.ns = Some(ns);
        (cmd.partner, cmd.fused_broken)
    };
    if broken {
        return c.complete(slot, Status::generic(generic::ABORTED_MISSING_FUSED), 0, None);
    }
    let Some(partner) = partner else {
        // A first whose second has not arrived yet waits for it (pair_fused links them, or
        // breaks this one when something else comes next).
        return;
    };
    if c.cmds.borrow()[usize::from(partner)].phase != Phase::Ready {
        return; // the other half runs both once its data is in
    }
    let (first, second) =
        if c.cmds.borrow()[usize::from(slot)].sqe.fuse == Fuse::First { (slot, partner) } else { (partner, slot) };
    let (f, s, cmp, data, ns) = {
        let mut cmds = c.cmds.borrow_mut();
        let f = cmds[usize::from(first)].sqe;
        let cmp = cmds[usize::from(first)].buf.take();
        set_phase(&mut cmds[usize::from(first)], Phase::Running, c.id, first);
        let sc = &mut cmds[usize::from(second)];
        set_phase(sc, Phase::Running, c.id, second);
        (f, sc.sqe, cmp, sc.buf.take(), sc.ns.clone())
    };
    let range = |q: &crate::spec::sqe::Sqe| (q.nsid, u64::from(q.cdw10) | u64::from(q.cdw11) << 32, q.cdw12 & 0xffff);
    let valid = f.opcode == nvm::COMPARE && s.opcode == nvm::WRITE && range(&f) == range(&s);
    match (cmp, data, ns) {
        // A compare-and-write writes: the bdev layer refuses it as the host's writes
        // (`io_done` answers the halves).
        (Some(cmp), Some(data), Some(ns)) if valid => {
            let (_, slba, nlb) = range(&s);
            ns.ch.submit(
                IoRequest::compare_and_write(slba, u64::from(nlb) + 1, cmp, data).for_initiator(c.who.get()),
                c.clone(),
                u64::from(second),
            );
        }
        _ => {
            c.unpair(first);
            c.complete(first, invalid_field(), 0, None);
            c.complete(second, Status::generic(generic::ABORTED_FAILED_FUSED), 0, None);
        }
    }
}

fn dsm(c: &Rc<Conn>, slot: u16, ns: Rc<super::qpair::NsChan>, cdw10: u32, cdw11: u32) {
    if let Some(st) = super::resv::unsubmitted_conflict(c, &ns, nvm::DATASET_MANAGEMENT) {
        // Refused whether or not it would reach the bdev (a hint does not).
        return c.complete(slot, st, 0, None);
    }
    let deallocate = cdw11 & DSM_DEALLOCATE != 0;
    let nr = (cdw10 & 0xff) as usize + 1;
    let buf = c.cmds.borrow_mut()[usize::from(slot)].buf.take();
    let Some(buf) = buf.filter(|b| b.len() >= nr * 16) else {
        return c.complete(slot, Status::generic(generic::DATA_SGL_LENGTH_INVALID).with_dnr(), 0, None);
    };
    if deallocate && !ns.ns.bdev().supports(IoType::Write) {
        // Deallocating changes what reads return: refused as the namespace's writes are.
        return c.complete(slot, Status::generic(generic::NAMESPACE_IS_WRITE_PROTECTED).with_dnr(), 0, None);
    }
    if !deallocate || !ns.ns.bdev().supports(IoType::Unmap) {
        // Attributes other than deallocate are hints.
        return c.complete(slot, Status::SUCCESS, 0, None);
    }
    let ranges: smallvec::SmallVec<[(u64, u64); 8]> = crate::spec::io::DsmRange::iter(&buf, nr.min(DSM_MAX_RANGES))
        .filter(|r| r.nlb > 0)
        .map(|r| (r.slba, u64::from(r.nlb)))
        .collect();
    if ranges.is_empty() {
        return c.complete(slot, Status::SUCCESS, 0, None);
    }
    c.cmds.borrow_mut()[usize::from(slot)].ns = Some(ns.clone());
    // One unmap per range, as children of one fan-out: the command completes once, when the
    // last range is done, with the first failure if any.
    let fan = FanOut::for_caller(IoBufs::new(), c.clone(), u64::from(slot));
    for (lba, n) in ranges {
        fan.submit(&ns.ch, IoRequest::no_payload(IoType::Unmap, lba, n).for_initiator(c.who.get()), 0..0);
    }
}

impl FanOutCompleter for Conn {
    fn fan_out_done(&self, tag: u64, done: FanOutDone) {
        let slot = tag as u16;
        let running = self.cmds.borrow().get(u32::from(slot)).is_some_and(|c| c.phase == Phase::Running);
        if !running {
            log::warn!("nvmf connection {}: a fan-out ended for idle slot {slot}; dropped", self.id);
            return;
        }
        let status = done.first_failure();
        if !status.is_ok() {
            log::debug!("nvmf connection {}: dataset management failed: {status}", self.id);
        }
        self.complete(slot, status_of(status), 0, None);
    }
}

impl IoCompleter for Conn {
    fn io_done(&self, tag: u64, mut io: Completed) {
        let slot = tag as u16;
        let (status, partner, opc, nsid) = {
            let mut cmds = self.cmds.borrow_mut();
            let Some(cmd) = cmds.get_mut(u32::from(slot)).filter(|c| c.phase == Phase::Running) else {
                log::warn!("nvmf connection {}: a completion for idle slot {slot}; dropped", self.id);
                return;
            };
            (io.status, cmd.partner, cmd.sqe.opcode, cmd.sqe.nsid)
        };
        let is_read = opc == nvm::READ;
        if status == IoStatus::RESERVATION_CONFLICT {
            super::resv::refused(self, nsid, opc);
        }
        if let Some(first) = partner {
            // Fused Compare-and-Write: the compare's outcome is the first command's; the write
            // is aborted when the compare failed, or when the reservation refused the pair
            // (the conflict is the first's).
            self.unpair(slot);
            let (s1, s2) = match status {
                IoStatus::Success => (Status::SUCCESS, Status::SUCCESS),
                IoStatus::Miscompare { .. } | IoStatus::RESERVATION_CONFLICT => {
                    (status_of(status), Status::generic(generic::ABORTED_FAILED_FUSED))
                }
                other => (status_of(other), status_of(other)),
            };
            self.complete(first, s1, 0, None);
            return self.complete(slot, s2, 0, None);
        }
        // An NVMe device's dword 0 (zero from every other module) goes back with its status.
        let dw0 = io.result as u32;
        if is_read && status.is_ok() {
            let bufs = std::mem::take(&mut io.req.bufs);
            return self.complete(slot, Status::SUCCESS, dw0, Some(bufs));
        }
        if !status.is_ok() {
            log::debug!("nvmf connection {}: I/O failed: {status}", self.id);
        }
        self.complete(slot, status_of(status), dw0, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::status::media;

    #[test]
    fn full_and_read_only_volumes_have_their_own_statuses() {
        let full = status_of(IoStatus::Failed(libc::ENOSPC));
        assert_eq!((full.sct, full.sc, full.dnr), (0, generic::CAPACITY_EXCEEDED, true));
        let ro = status_of(IoStatus::Failed(libc::EROFS));
        assert_eq!((ro.sct, ro.sc, ro.dnr), (0, generic::NAMESPACE_IS_WRITE_PROTECTED, true));
        let other = status_of(IoStatus::Failed(libc::EIO));
        assert_eq!((other.sct, other.sc, other.dnr), (0, generic::INTERNAL_DEVICE_ERROR, false));
    }

    #[test]
    fn a_remote_status_passes_through_whole() {
        let wp =
            status_of(IoStatus::Nvme { sct: 0, sc: generic::NAMESPACE_IS_WRITE_PROTECTED, dnr: true, more: false });
        assert_eq!((wp.sct, wp.sc, wp.dnr, wp.more), (0, generic::NAMESPACE_IS_WRITE_PROTECTED, true, false));
        let internal = status_of(IoStatus::Nvme { sct: 0, sc: generic::INTERNAL_DEVICE_ERROR, dnr: true, more: true });
        assert!(internal.dnr && internal.more, "the device's bits, not a guess");
        let retry = status_of(IoStatus::nvme(0, generic::CAPACITY_EXCEEDED));
        assert!(!retry.dnr, "a device that allows a retry is not overruled");
        let path = status_of(IoStatus::nvme(3, 2));
        assert!(!path.dnr, "a path status is for the host to retry elsewhere");
    }

    #[test]
    fn a_scsi_backend_status_is_translated() {
        let s = status_of(IoStatus::Scsi { status: 2, key: 5, asc: 0x21, ascq: 0 });
        assert_eq!((s.sct, s.sc, s.dnr), (0, generic::LBA_OUT_OF_RANGE, true));
        let s = status_of(IoStatus::Scsi { status: 0x18, key: 0, asc: 0, ascq: 0 });
        assert_eq!((s.sct, s.sc), (0, generic::RESERVATION_CONFLICT));
    }

    #[test]
    fn a_miscompare_is_a_compare_failure_wherever_it_was() {
        let s = status_of(IoStatus::Miscompare { offset: ferrite_bdev::DiffOffset::at(17) });
        assert_eq!((s.sct, s.sc, s.dnr), (2, media::COMPARE_FAILURE, true));
    }
}
