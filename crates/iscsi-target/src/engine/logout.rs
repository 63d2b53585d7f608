//! Logout (RFC 7143 sections 11.14 and 11.15): closing the session (all its connections), this
//! connection, or another connection of the session (by CID) waits for the commands of the
//! connections that end (at most [`super::LOGOUT_DRAIN`] each), answers, and ends this
//! connection once the answer is sent if it is one of them; removing a connection for recovery
//! is refused (ErrorRecoveryLevel 0). The target asks an
//! initiator to log out with an Asynchronous Message (`iscsi_target_node_request_logout`,
//! `iscsi_delete_target_node`) and drops it if it has not within
//! [`super::LOGOUT_REQUEST_WAIT`] seconds.

use super::conn::{Conn, Stage};
use ferrite_iscsi::pdu::{
    async_event, logout_response, AsyncMessage, LogoutReason, LogoutRequest, LogoutResponse, Pdu,
};
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

/// A Logout Request (its CmdSN accepted). False once the connection ends after the answer.
pub(crate) async fn on_request(c: &Rc<Conn>, l: &LogoutRequest) -> Result<bool, String> {
    let sess = c.session().cloned().ok_or("a Logout Request before login")?;
    let (response, ending) = match l.reason {
        LogoutReason::CloseSession => (logout_response::SUCCESS, sess.conns()),
        LogoutReason::CloseConnection => match sess.conn_by_cid(l.cid) {
            Some(x) => (logout_response::SUCCESS, vec![x]),
            None => (logout_response::CID_NOT_FOUND, Vec::new()),
        },
        LogoutReason::RemoveForRecovery => (logout_response::RECOVERY_NOT_SUPPORTED, Vec::new()),
    };
    let mut ends_self = false;
    for x in &ending {
        x.quiet_end.set(true);
        if Rc::ptr_eq(x, c) {
            ends_self = true;
            continue;
        }
        if x.stage.get() == Stage::LoggingOut {
            // It is answering a logout of its own, and ends after it.
            continue;
        }
        // Another connection of the session: it takes nothing new, its commands that wait on
        // the initiator end (it is logging out), those running end, then it closes.
        x.stop_taking();
        super::task::end_waiting(x);
        let drained = ferrite_target::close_gracefully(x, || x.drained(), super::LOGOUT_DRAIN).await;
        log::info!(
            "iscsi connection {}: connection {} (CID {}) logged out{}",
            c.id,
            x.id,
            x.cid.get(),
            if drained { "" } else { " with commands still running" }
        );
    }
    if ends_self {
        c.stage.set(Stage::LoggingOut);
        super::task::end_waiting(c);
        // The logout request itself is not counted; what else is in flight ends first.
        let mut timer = pin!(ferrite_reactor::sleep(super::LOGOUT_DRAIN));
        let drained = poll_fn(|cx| {
            if c.drained() || c.is_dead() {
                return Poll::Ready(c.drained());
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(false);
            }
            c.park_reader(cx);
            Poll::Pending
        })
        .await;
        if !drained {
            log::warn!(
                "iscsi connection {}: commands still running {:?} after a logout; closing",
                c.id,
                super::LOGOUT_DRAIN
            );
            c.close();
            return Ok(false);
        }
    }
    c.finished(l.immediate);
    let pdu = Pdu::LogoutResponse(LogoutResponse {
        response,
        itt: l.itt,
        stat_sn: c.seq.take_stat_sn(),
        exp_cmd_sn: c.seq.exp_cmd_sn(),
        max_cmd_sn: c.seq.max_cmd_sn(),
        time2wait: 0,
        time2retain: 0,
    });
    c.send_pdu(&pdu, &[]);
    if ends_self {
        log::info!("iscsi connection {} from {}: logged out", c.id, c.peer);
        c.stop_taking();
        return Ok(false);
    }
    Ok(true)
}

/// Asks the initiator of `c` to log out (once), and sets the deadline the watchdog holds it to.
pub(crate) fn request(c: &Conn) {
    if c.stage.get() != Stage::FullFeature || c.logout_by.get() != 0 || c.is_closing() {
        return;
    }
    let wait = Duration::from_secs(u64::from(super::LOGOUT_REQUEST_WAIT));
    c.logout_by.set(super::conn::now() + ferrite_reactor::tsc::duration_to_ticks(wait));
    let pdu = Pdu::AsyncMessage(AsyncMessage {
        lun: 0,
        stat_sn: c.seq.take_stat_sn(),
        exp_cmd_sn: c.seq.exp_cmd_sn(),
        max_cmd_sn: c.seq.max_cmd_sn(),
        async_event: async_event::LOGOUT_REQUEST,
        async_vcode: 0,
        parameter1: 0,
        parameter2: 0,
        parameter3: super::LOGOUT_REQUEST_WAIT,
    });
    log::info!("iscsi connection {} from {}: asked to log out", c.id, c.peer);
    c.send_pdu(&pdu, &[]);
}
