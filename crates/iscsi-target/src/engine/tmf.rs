//! Task management functions (RFC 7143 sections 11.5 and 11.6) onto the SCSI layer's, over
//! the tasks of all the session's connections (one I_T nexus): ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, and the target resets (a logical
//! unit reset of every LUN; a cold reset then drops the target's connections, as RFC 7143
//! section 11.5.1 asks). Commands still waiting for their data-out are ended here (they never
//! reached the SCSI layer); those with it are ended by it, and the response goes out once they
//! have. Aborted commands get no response. The other functions are answered "not supported"
//! (TASK REASSIGN: "allegiance reassignment not supported", ErrorRecoveryLevel 0), an unknown
//! one "function rejected".

use super::conn::Conn;
use super::seq::sn_lt;
use super::task::{end_receiving, lun_number, Phase};
use ferrite_iscsi::negotiate::SessionType;
use ferrite_iscsi::pdu::{tmf_response, Pdu, RejectReason, TaskMgmtRequest, TaskMgmtResponse, TmfFunction, BHS_LEN};
use ferrite_scsi::TmfResponse;
use std::rc::Rc;

/// The iSCSI response of a SCSI function's answer.
fn code(r: TmfResponse) -> u8 {
    match r {
        TmfResponse::Complete => tmf_response::COMPLETE,
        TmfResponse::NoSuchTask => tmf_response::TASK_DOES_NOT_EXIST,
        TmfResponse::NoSuchLun => tmf_response::LUN_DOES_NOT_EXIST,
    }
}

/// Queues the response to `t`.
fn respond(c: &Conn, t: &TaskMgmtRequest, response: u8) {
    c.finished(t.immediate);
    let pdu = Pdu::TaskMgmtResponse(TaskMgmtResponse {
        response,
        itt: t.itt,
        stat_sn: c.seq.take_stat_sn(),
        exp_cmd_sn: c.seq.exp_cmd_sn(),
        max_cmd_sn: c.seq.max_cmd_sn(),
    });
    c.send_pdu(&pdu, &[]);
}

/// Which SCSI function runs, once the commands still receiving are ended.
#[derive(Clone, Copy)]
enum Run {
    AbortTask(u64, u64),
    AbortTaskSet(u64),
    ClearTaskSet(u64),
    LunReset(u64),
    TargetReset { cold: bool },
}

/// A Task Management Function Request (its CmdSN accepted).
pub(crate) fn on_request(c: &Rc<Conn>, t: &TaskMgmtRequest, bhs: &[u8; BHS_LEN]) {
    let Some(sess) = c.session() else { return };
    if sess.kind == SessionType::Discovery {
        c.finished(t.immediate);
        c.reject(RejectReason::ProtocolError, bhs, "a task management request in a discovery session");
        return;
    }
    let lun = lun_number(t.lun);
    let run = match TmfFunction::from_u8(t.function) {
        None => return respond(c, t, tmf_response::REJECTED),
        Some(TmfFunction::AbortTask) => {
            // The task may have come on any connection of the session.
            let found = sess.conns().into_iter().find_map(|o| {
                let hit = o
                    .cmds
                    .borrow()
                    .iter()
                    .find(|(_, x)| x.phase != Phase::Free && x.itt == t.referenced_task_tag && x.lun == lun)
                    .map(|(i, x)| (i, x.phase, x.immediate));
                hit.map(|h| (o, h))
            });
            match found {
                Some((o, (slot, Phase::Running, immediate))) => Run::AbortTask(lun, o.tag(slot, immediate)),
                Some((o, _)) => {
                    end_receiving(&o, |x| x.itt == t.referenced_task_tag && x.lun == lun);
                    return respond(c, t, tmf_response::COMPLETE);
                }
                None => {
                    // RFC 7143 section 11.5.1: a task never received whose CmdSN is in the
                    // window (and before the function's) counts as received and aborted.
                    let never_came = c.seq.in_window(t.ref_cmd_sn) && sn_lt(t.ref_cmd_sn, t.cmd_sn);
                    let r = if never_came { tmf_response::COMPLETE } else { tmf_response::TASK_DOES_NOT_EXIST };
                    return respond(c, t, r);
                }
            }
        }
        Some(TmfFunction::AbortTaskSet) => Run::AbortTaskSet(lun),
        Some(TmfFunction::ClearTaskSet) => Run::ClearTaskSet(lun),
        Some(TmfFunction::LogicalUnitReset) => Run::LunReset(lun),
        Some(TmfFunction::TargetWarmReset) => Run::TargetReset { cold: false },
        Some(TmfFunction::TargetColdReset) => Run::TargetReset { cold: true },
        Some(TmfFunction::TaskReassign) => return respond(c, t, tmf_response::REASSIGNMENT_NOT_SUPPORTED),
        Some(
            TmfFunction::ClearAca
            | TmfFunction::QueryTask
            | TmfFunction::QueryTaskSet
            | TmfFunction::ItNexusReset
            | TmfFunction::QueryAsyncEvent,
        ) => return respond(c, t, tmf_response::NOT_SUPPORTED),
    };
    if c.tmfs.get() >= super::MAX_TMFS {
        ferrite_reactor::log_limited!(
            log::Level::Warn,
            "iscsi connection {}: {} task management functions running; one more rejected",
            c.id,
            super::MAX_TMFS
        );
        return respond(c, t, tmf_response::REJECTED);
    }
    // Commands of the session's connections still receiving their data end here.
    for o in sess.conns() {
        match run {
            Run::AbortTask(..) => {}
            Run::AbortTaskSet(l) | Run::ClearTaskSet(l) | Run::LunReset(l) => {
                end_receiving(&o, |x| x.lun == l);
            }
            Run::TargetReset { .. } => {
                end_receiving(&o, |_| true);
            }
        }
    }
    let Some(nexus) = c.nexus() else { return respond(c, t, tmf_response::REJECTED) };
    c.tmfs.set(c.tmfs.get() + 1);
    let luns = sess.target.as_ref().map(|x| x.scsi.lun_ids()).unwrap_or_default();
    let target = sess.target.as_ref().map(|x| x.name.clone());
    let (c, t) = (c.clone(), *t);
    c.hold();
    ferrite_reactor::spawn_local(async move {
        let r = match run {
            Run::AbortTask(lun, tag) => nexus.abort_task(lun, tag).await,
            Run::AbortTaskSet(lun) => nexus.abort_task_set(lun).await,
            Run::ClearTaskSet(lun) => nexus.clear_task_set(lun).await,
            Run::LunReset(lun) => nexus.lun_reset(lun).await,
            Run::TargetReset { .. } => {
                for id in luns {
                    nexus.lun_reset(id).await;
                }
                TmfResponse::Complete
            }
        };
        drop(nexus);
        c.tmfs.set(c.tmfs.get() - 1);
        c.unhold();
        respond(&c, &t, code(r));
        if let (Run::TargetReset { cold: true }, Some(name)) = (run, target) {
            log::info!("iscsi connection {}: target cold reset of {name}; its connections close", c.id);
            super::registry::close_target(&name, c.id);
            // This one ends once its response is out.
            c.stop_taking();
        }
    })
    .detach();
}
