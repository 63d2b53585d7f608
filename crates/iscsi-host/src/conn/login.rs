//! The login over a connection: `ferrite_iscsi`'s [`InitiatorLogin`] state machine driven by
//! Login Responses the reader receives; at its end the connection takes the negotiated
//! digests, data limits and transfer rules, and the CmdSN window of the final response.

use super::reader::{read_staged, Stop};
use super::{out::Out, Conn};
use crate::plan::Xfer;
use crate::seq::Window;
use ferrite_iscsi::chap::system_random;
use ferrite_iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginError, InitiatorStep};
use ferrite_iscsi::pdu::{Decoder, Pdu, PduParams};
use ferrite_target::rx::Rx;

/// Why a login failed, in words for the caller (an RPC's answer, the log).
fn failure(e: &InitiatorLoginError) -> String {
    match e {
        InitiatorLoginError::Status(s) if s.class == 2 && s.detail == 1 => {
            format!("login refused: authentication failed ({s})")
        }
        e => e.to_string(),
    }
}

/// Logs in; on success the connection is in the full feature phase and its connect call is
/// told. A refusal is told to the connect call too, and ends the reader.
pub(super) async fn run(c: &Conn, rx: &mut Rx<'_>, dec: &mut Decoder, cfg: InitiatorLoginConfig) -> Result<(), Stop> {
    let mut login = InitiatorLogin::new(cfg);
    let mut step = login.start();
    let mut staged = Vec::new();
    loop {
        let res = match step {
            InitiatorStep::Send { request, data } => {
                let o = Out::owned(&PduParams::LOGIN, &Pdu::LoginRequest(request), data)
                    .map_err(|e| Stop::Closed(format!("cannot frame a Login Request: {e}")))?;
                c.push(o);
                None
            }
            InitiatorStep::Done(res) => Some(res),
        };
        if let Some(res) = res {
            let n = &res.negotiated;
            if n.session.error_recovery_level != 0 {
                return Err(refuse(
                    c,
                    format!("ErrorRecoveryLevel {} (only 0 is supported)", n.session.error_recovery_level),
                ));
            }
            c.xfer.set(Xfer::of(n));
            c.tx.set(n.connection.tx());
            dec.set_params(n.connection.rx());
            c.win.set(Window::new(res.exp_cmd_sn, res.max_cmd_sn, res.exp_stat_sn));
            log::debug!(
                "iscsi host connection {} to {}: logged in (TSIH {}, {:?}, {:?})",
                c.core.id,
                c.core.peer,
                res.tsih,
                n.session,
                n.connection
            );
            if let Some(w) = c.login_wait.borrow_mut().take() {
                w.send(Ok(()));
            }
            return Ok(());
        }
        let h = read_staged(rx, dec, &mut staged).await?;
        let Pdu::LoginResponse(resp) = h.pdu else {
            return Err(Stop::Violation(format!("{} during the login", h.pdu.opcode())));
        };
        step = match login.on_response(&resp, &staged, &mut system_random) {
            Ok(s) => s,
            Err(e) => return Err(refuse(c, failure(&e))),
        };
    }
}

/// Tells the connect call why the login failed; the reader then ends.
fn refuse(c: &Conn, why: String) -> Stop {
    if let Some(w) = c.login_wait.borrow_mut().take() {
        w.send(Err(why.clone()));
    }
    Stop::Closed(format!("login failed: {why}"))
}
