//! The iSCSI target's connection engine: portals, connections, login, and the full feature
//! phase over the SCSI layer (`ferrite_scsi`). It plugs into the management plane through the
//! hooks ([`crate::hooks`]): [`install`] registers its [`crate::PortalListener`] and
//! [`crate::Sessions`] once, at startup.
//!
//! - [`portal`]: one listening socket per portal of a portal group, on the first reactor;
//!   connections go to the reactors in turn (`ferrite_target::spawn_acceptor`).
//! - [`conn`]: one connection on its reactor: its core (`ferrite_target::ConnCore`), its
//!   reactor's table and watchdog, the reader task ([`reader`]) and the writer task
//!   ([`out`]), its end.
//! - [`login`]: the login phase through `ferrite_iscsi::login::TargetLogin` with a
//!   `LoginContext` over the model (targets, access, CHAP secrets, sessions), and the session
//!   it leads to or joins ([`session`]; a joining connection moves to its session's reactor).
//! - [`seq`]: StatSN, and the session's ExpCmdSN and MaxCmdSN (the command window), in
//!   CmdSN order across a session's connections.
//! - [`task`]: SCSI commands in their slots, from the header to the SCSI layer; [`r2t`]: their
//!   Data-Out (immediate, unsolicited, solicited by R2T) placed straight into their buffers;
//!   [`datain`]: Data-In and SCSI Response.
//! - [`tmf`], [`nop`], [`text`], [`logout`]: the other requests.
//! - [`registry`]: every connection and session of the engine (logins, reinstatement, the
//!   RPCs' view), and the SCSI target of each target node ([`scsi`]).
//!
//! Limits: ErrorRecoveryLevel 0 (SNACKs are rejected; a sequence error ends the connection,
//! a failed connection its session), a session's connections on one reactor (its leading
//! connection's; see [`session`]), in-order data PDUs and sequences.

mod conn;
mod datain;
mod login;
mod logout;
mod nop;
mod out;
mod portal;
mod r2t;
mod reader;
mod registry;
mod scsi;
mod seq;
mod session;
mod task;
mod text;
mod tmf;

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time from accept to the end of a successful login.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a batch of PDUs may take to be sent: this, plus 1 s per MiB.
pub const SEND_BASE_TIME: Duration = Duration::from_secs(30);
/// How long a command's solicited data may take to arrive after its R2T: this, plus 1 s per
/// MiB.
pub const DATA_BASE_TIME: Duration = Duration::from_secs(10);
/// Bytes of write buffers one connection may hold for data it solicited and has not received;
/// further writes wait for their buffer and R2T.
pub const R2T_BUDGET: usize = 8 << 20;
/// Queued bytes past which the reader stops reading (the initiator must read first).
pub const MAX_UNSENT: usize = 8 << 20;
/// Connections a portal serves at once; more are accepted and closed.
pub const MAX_CONNECTIONS: usize = 16_384;
/// Command slots beyond the queue depth, for immediate commands (outside the CmdSN window).
pub const IMMEDIATE_SLOTS: usize = 16;
/// Task management functions a connection may have running at once (they are immediate, so
/// outside the command window); more are answered "function rejected".
pub const MAX_TMFS: u32 = 16;
/// How long a logout waits for the connection's commands to end before it answers.
pub const LOGOUT_DRAIN: Duration = Duration::from_secs(10);
/// Seconds an initiator asked to log out (an Asynchronous Message) has before it is dropped.
pub const LOGOUT_REQUEST_WAIT: u16 = 30;

/// Registers the engine's hooks in the calling thread's engine (the daemon does it at startup,
/// before its configuration is loaded).
pub fn install() {
    crate::hooks::set_sessions(Arc::new(registry::EngineSessions));
    crate::hooks::set_portal_listener(Arc::new(portal::Portals));
}

/// Daemon shutdown (on the first reactor, after [`crate::shutdown`] stopped the portals):
/// every connection closes (waiting at most 2 s for them to go), and the SCSI devices with
/// them, so that the LUNs' bdevs can be deleted.
pub async fn shutdown() {
    let engine = ferrite_reactor::engine();
    let _ = engine
        .on_all(|_| {
            for c in conn::all_local() {
                c.close();
            }
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while registry::count() > 0 && Instant::now() < deadline {
        ferrite_reactor::sleep(Duration::from_millis(10)).await;
    }
    scsi::clear();
}
