//! More than one connection per session (MC/S, RFC 7143 sections 4.2 and 6.3) over raw
//! sockets with the test initiator of tests/iscsi_common (no initiator packaged for Debian does
//! MC/S: open-iscsi and libiscsi open one connection per session). The daemon runs two
//! reactors, so a joining connection is most often accepted on the other reactor than its
//! session's and moves there at its first Login Request.
//!
//! Checked: connections join up to MaxConnections and share the session's CmdSN window and
//! LUN (data written on one is read on the other); a command ahead of ExpCmdSN on one
//! connection waits for the one before it on another (served in CmdSN order); joins to an
//! unknown session, another initiator port, or past MaxConnections are refused with their
//! statuses; a connection that joins with a CID in use replaces it; a logout closes one
//! connection (this one or another by CID) or the whole session; an ABORT TASK on one
//! connection ends a task of another; a connection that fails takes the session with it
//! (ErrorRecoveryLevel 0).

mod common;
mod iscsi_common;

use common::TempDir;
use ferrite_iscsi::login::{InitiatorLoginError, LoginStatus};
use ferrite_iscsi::negotiate::InitiatorOptions;
use ferrite_iscsi::pdu::{
    logout_response, tmf_response, LogoutReason, LogoutRequest, Pdu, TaskMgmtRequest, TmfFunction,
};
use iscsi_common::{closed_within, pattern, Ini, IscsiDaemon};
use serde_json::json;
use std::time::Duration;

/// A daemon on two reactors with one target over a 16 MiB malloc LUN; its full name.
fn setup(dir: &TempDir) -> (IscsiDaemon, String) {
    let d = IscsiDaemon::start(dir, "0x3");
    d.malloc("Malloc0", 32768, 512);
    let iqn = d.target("disk1", "Malloc0", json!({}));
    (d, iqn)
}

/// Operational keys asking for up to `n` connections.
fn mcs(n: u16) -> InitiatorOptions {
    InitiatorOptions { max_connections: n, ..InitiatorOptions::default() }
}

/// A session's connections, with the CmdSN they share.
struct Session {
    conns: Vec<Ini>,
    cmd_sn: u32,
}

impl Session {
    /// A leading connection asking for `max` connections.
    fn lead(d: &IscsiDaemon, iqn: &str, max: u16) -> Session {
        let ini = Ini::login(d.port, Some(iqn), mcs(max)).expect("the leading connection logs in");
        assert_eq!(ini.negotiated.session.max_connections, max.min(2), "MaxConnections: min of both offers");
        let cmd_sn = ini.cmd_sn;
        Session { conns: vec![ini], cmd_sn }
    }

    /// A connection that joins the session with `cid` (and the leading one's ISID unless
    /// `isid` says otherwise).
    fn join_as(
        &self,
        d: &IscsiDaemon,
        iqn: &str,
        cid: u16,
        tsih: u16,
        isid: Option<[u8; 6]>,
    ) -> Result<Ini, InitiatorLoginError> {
        Ini::login_with(d.port, Some(iqn), |c| {
            c.options = mcs(2);
            c.tsih = tsih;
            c.cid = cid;
            c.cmd_sn = self.cmd_sn;
            if let Some(i) = isid {
                c.isid = ferrite_iscsi::pdu::Isid(i);
            }
        })
    }

    /// Joins connection `cid`; it becomes `conns[k]` for the next free `k`.
    fn join(&mut self, d: &IscsiDaemon, iqn: &str, cid: u16) {
        let tsih = self.conns[0].tsih;
        let mut ini = self.join_as(d, iqn, cid, tsih, None).expect("a second connection joins the session");
        assert_eq!(ini.tsih, tsih, "the joining connection is in the same session");
        // Leading-only keys were the leading connection's to negotiate.
        ini.negotiated.session = self.conns[0].negotiated.session.clone();
        assert_eq!(ini.cmd_sn, self.cmd_sn, "the final Login Response carries the session's ExpCmdSN");
        self.conns.push(ini);
    }

    /// Runs `f` on connection `i` with the session's next CmdSN.
    fn on<R>(&mut self, i: usize, f: impl FnOnce(&mut Ini) -> R) -> R {
        let c = &mut self.conns[i];
        c.cmd_sn = self.cmd_sn;
        let r = f(c);
        self.cmd_sn = c.cmd_sn;
        r
    }

    /// A WRITE(10) of `data` at `lba` sent on connection `i` with CmdSN `sn`, with its data as
    /// immediate data if `imm` (nothing more is sent for it), else none; its ITT.
    fn send_write(&mut self, i: usize, sn: u32, lba: u32, data: &[u8], imm: bool) -> u32 {
        let c = &mut self.conns[i];
        let itt = c.itt();
        c.cmd_sn = sn;
        let cmd = c.write_cmd(itt, lba, (data.len() / 512) as u16, true);
        c.send(&Pdu::ScsiCommand(cmd), if imm { data } else { &[] });
        itt
    }

    /// Sends an immediate ABORT TASK of task `referenced` (RefCmdSN `ref_cmd_sn`) on connection
    /// `i` with CmdSN `sn`; its response (the ITT checked).
    fn abort_task(&mut self, i: usize, sn: u32, referenced: u32, ref_cmd_sn: u32) -> u8 {
        let c = &mut self.conns[i];
        let itt = c.itt();
        let t = TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::AbortTask as u8,
            lun: 0,
            itt,
            referenced_task_tag: referenced,
            cmd_sn: sn,
            exp_stat_sn: c.exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: 0,
        };
        c.send(&Pdu::TaskMgmtRequest(t), &[]);
        let g = c.recv();
        let Pdu::TaskMgmtResponse(r) = g.pdu else { panic!("expected a TMF response, got {:?}", g.pdu) };
        assert_eq!(r.itt, itt);
        r.response
    }

    /// Sends a Logout Request for `reason` (and `cid`) on connection `i`; its response code.
    fn logout(&mut self, i: usize, reason: LogoutReason, cid: u16) -> u8 {
        let sn = self.cmd_sn;
        self.cmd_sn += 1;
        let c = &mut self.conns[i];
        let itt = c.itt();
        let l = LogoutRequest { immediate: false, reason, itt, cid, cmd_sn: sn, exp_stat_sn: c.exp_stat_sn };
        c.send(&Pdu::LogoutRequest(l), &[]);
        let g = c.recv();
        let Pdu::LogoutResponse(r) = g.pdu else { panic!("expected a Logout Response, got {:?}", g.pdu) };
        assert_eq!(r.itt, itt);
        r.response
    }
}

/// The CIDs of the connections `iscsi_get_connections` lists in session `tsih`, once they are
/// `want` (within 5 s; panics otherwise). They all run on one reactor (the session's).
fn listed(d: &IscsiDaemon, tsih: u16, want: &[i64]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let conns: Vec<serde_json::Value> =
            d.connections().into_iter().filter(|c| c["tsih"].as_i64() == Some(i64::from(tsih))).collect();
        let mut cids: Vec<i64> = conns.iter().map(|c| c["cid"].as_i64().unwrap()).collect();
        cids.sort();
        if cids == want {
            let threads: Vec<&str> = conns.iter().map(|c| c["thread_name"].as_str().unwrap()).collect();
            assert!(
                threads.windows(2).all(|w| w[0] == w[1]),
                "a session's connections on several reactors: {threads:?}"
            );
            return;
        }
        assert!(std::time::Instant::now() < deadline, "session {tsih:#x} lists CIDs {cids:?}, expected {want:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The status a refused login failed with.
fn refused(r: Result<Ini, InitiatorLoginError>) -> LoginStatus {
    match r {
        Err(InitiatorLoginError::Status(s)) => s,
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("the login was accepted"),
    }
}

#[test]
fn two_connections_share_one_session_and_its_lun() {
    let dir = TempDir::new("iscsi-mcs-share");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    listed(&d, s.conns[0].tsih, &[0, 1]);
    // The portal hands connections to the reactors in turn: the second went to the other
    // reactor and moved to its session's.
    assert!(d.d.proc.stderr().contains("moves to reactor"), "no connection moved:\n{}", d.d.proc.stderr());
    for round in 0..4u64 {
        let (w, r) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        let data = pattern(round, 32 << 10);
        let lba = 100 + round as u32 * 64;
        assert_eq!(s.on(w, |c| c.write10(lba, &data)).status, 0);
        let got = s.on(r, |c| c.read10(lba, 64));
        assert_eq!(got.status, 0);
        assert!(got.data == data, "round {round}: what connection {w} wrote differs when read on connection {r}");
    }
    // The window is the session's: both connections see ExpCmdSN move with the other's
    // commands.
    let before = s.cmd_sn;
    s.on(0, |c| c.tur());
    s.on(1, |c| c.tur());
    assert_eq!(s.cmd_sn, before + 2);
}

#[test]
fn commands_are_served_in_cmdsn_order_across_connections() {
    let dir = TempDir::new("iscsi-mcs-order");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    let (first, second) = (pattern(1, 4096), pattern(2, 4096));
    let sn = s.cmd_sn;
    // The later command comes first, on the second connection: it must wait for CmdSN `sn`.
    let late = s.send_write(1, sn + 1, 500, &second, true);
    s.conns[1].s.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
    let mut b = [0u8; 1];
    let early = s.conns[1].s.peek(&mut b);
    assert!(early.is_err(), "a command ahead of ExpCmdSN was answered before the one before it came");
    s.conns[1].s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let first_itt = s.send_write(0, sn, 500, &first, true);
    s.cmd_sn = sn + 2;
    for (i, itt) in [(0, first_itt), (1, late)] {
        let g = s.conns[i].recv();
        let Pdu::ScsiResponse(r) = g.pdu else { panic!("expected a SCSI Response, got {:?}", g.pdu) };
        assert_eq!((r.itt, r.status), (itt, 0));
    }
    // Served in CmdSN order: the second write (CmdSN sn + 1) is what the LBA holds.
    let got = s.on(0, |c| c.read10(500, 8));
    assert!(got.data == second, "the writes were not served in CmdSN order");
}

#[test]
fn joins_are_refused_past_max_connections_and_to_other_sessions() {
    let dir = TempDir::new("iscsi-mcs-refuse");
    let (d, iqn) = setup(&dir);
    // An initiator that asks for one connection gets one.
    let one = Session::lead(&d, &iqn, 1);
    let tsih = one.conns[0].tsih;
    assert_eq!(refused(one.join_as(&d, &iqn, 1, tsih, None)), LoginStatus::TOO_MANY_CONNECTIONS);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    let tsih = s.conns[0].tsih;
    assert_eq!(refused(s.join_as(&d, &iqn, 2, tsih, None)), LoginStatus::TOO_MANY_CONNECTIONS);
    assert_eq!(refused(s.join_as(&d, &iqn, 2, tsih ^ 0x4000, None)), LoginStatus::SESSION_DOES_NOT_EXIST);
    assert_eq!(
        refused(s.join_as(&d, &iqn, 2, tsih, Some([0x80, 0, 0, 9, 9, 9]))),
        LoginStatus::SESSION_DOES_NOT_EXIST,
        "another initiator port may not join the session"
    );
    // The session goes on.
    let data = pattern(7, 8192);
    assert_eq!(s.on(1, |c| c.write10(8, &data)).status, 0);
    assert!(s.on(0, |c| c.read10(8, 16)).data == data);
}

#[test]
fn a_join_with_a_cid_in_use_replaces_that_connection() {
    let dir = TempDir::new("iscsi-mcs-reinstate");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    let mut old = s.conns.pop().unwrap();
    s.join(&d, &iqn, 1);
    assert!(closed_within(&mut old.s, Duration::from_secs(5)), "the replaced connection was not closed");
    listed(&d, s.conns[0].tsih, &[0, 1]);
    let data = pattern(3, 8192);
    assert_eq!(s.on(1, |c| c.write10(40, &data)).status, 0);
    assert!(s.on(0, |c| c.read10(40, 16)).data == data, "the session serves on after the replacement");
}

#[test]
fn logouts_close_one_connection_or_the_session() {
    let dir = TempDir::new("iscsi-mcs-logout");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    let tsih = s.conns[0].tsih;
    // Closing another connection by its CID: it goes, this one stays.
    assert_eq!(s.logout(0, LogoutReason::CloseConnection, 1), logout_response::SUCCESS);
    let mut gone = s.conns.pop().unwrap();
    assert!(closed_within(&mut gone.s, Duration::from_secs(5)), "connection 1 was not closed");
    assert_eq!(s.logout(0, LogoutReason::CloseConnection, 7), logout_response::CID_NOT_FOUND);
    assert_eq!(s.on(0, |c| c.tur()), 0, "the connection that asked goes on");
    // A connection joins again, then the whole session logs out from it.
    s.join(&d, &iqn, 2);
    listed(&d, tsih, &[0, 2]);
    assert_eq!(s.logout(1, LogoutReason::CloseSession, 2), logout_response::SUCCESS);
    for (i, c) in s.conns.iter_mut().enumerate() {
        assert!(closed_within(&mut c.s, Duration::from_secs(5)), "connection {i} outlived its session's logout");
    }
    d.wait_connections(0, Duration::from_secs(5));
}

#[test]
fn abort_task_reaches_a_task_of_another_connection() {
    let dir = TempDir::new("iscsi-mcs-abort");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    // A write on connection 1 whose data never comes: it waits after its R2T.
    let sn = s.cmd_sn;
    let itt = s.send_write(1, sn, 64, &pattern(8, 4096), false);
    // No immediate data and F 1: the R2T asks for it.
    let g = s.conns[1].recv();
    assert!(matches!(g.pdu, Pdu::R2t(_)), "expected an R2T, got {:?}", g.pdu);
    s.cmd_sn = sn + 1;
    let r = s.abort_task(0, s.cmd_sn, itt, sn);
    assert_eq!(r, tmf_response::COMPLETE, "the task of connection 1 was found");
    // Both connections serve on.
    let data = pattern(9, 4096);
    assert_eq!(s.on(0, |c| c.write10(64, &data)).status, 0);
    assert!(s.on(1, |c| c.read10(64, 8)).data == data);
}

#[test]
fn a_connection_that_fails_takes_its_session() {
    let dir = TempDir::new("iscsi-mcs-fail");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    assert_eq!(s.on(1, |c| c.tur()), 0);
    let b = s.conns.pop().unwrap();
    b.s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(b);
    assert!(
        closed_within(&mut s.conns[0].s, Duration::from_secs(5)),
        "at ErrorRecoveryLevel 0 the session ends with a failed connection"
    );
    d.wait_connections(0, Duration::from_secs(5));
    // The initiator logs in again (session recovery) and is served.
    let mut again = Session::lead(&d, &iqn, 2);
    let data = pattern(11, 4096);
    assert_eq!(again.on(0, |c| c.write10(0, &data)).status, 0);
    assert!(again.on(0, |c| c.read10(0, 8)).data == data);
}

/// CHAP credentials of the test initiator.
fn alice(secret: &str) -> Option<ferrite_iscsi::chap::Credentials> {
    Some(ferrite_iscsi::chap::Credentials { name: "alice".into(), secret: secret.as_bytes().to_vec() })
}

#[test]
fn a_join_that_fails_authentication_replaces_nothing() {
    let dir = TempDir::new("iscsi-mcs-chap");
    let (d, iqn) = setup(&dir);
    d.d.call(
        "iscsi_create_auth_group",
        Some(json!({"tag": 1, "secrets": [{"user": "alice", "secret": "s3cretpassw0rd"}]})),
    );
    d.d.call("iscsi_target_node_set_auth", Some(json!({"name": iqn, "chap_group": 1, "require_chap": true})));
    let lead = Ini::login_with(d.port, Some(&iqn), |c| {
        c.options = mcs(2);
        c.chap = alice("s3cretpassw0rd");
    })
    .expect("the leading connection logs in with CHAP");
    let mut s = Session { cmd_sn: lead.cmd_sn, conns: vec![lead] };
    let tsih = s.conns[0].tsih;
    let joined = Ini::login_with(d.port, Some(&iqn), |c| {
        c.options = mcs(2);
        c.chap = alice("s3cretpassw0rd");
        c.tsih = tsih;
        c.cid = 1;
        c.cmd_sn = s.cmd_sn;
    })
    .expect("a second connection joins with CHAP");
    s.conns.push(joined);
    s.conns[1].negotiated.session = s.conns[0].negotiated.session.clone();
    // Someone who knows the session's TSIH, ISID and names but not the secret joins with
    // CID 0 and with CID 1 (both in use): refused, and neither connection is replaced.
    for cid in [0, 1] {
        let r = Ini::login_with(d.port, Some(&iqn), |c| {
            c.options = mcs(2);
            c.chap = alice("wrong-secret-123");
            c.tsih = tsih;
            c.cid = cid;
        });
        assert_eq!(refused(r), LoginStatus::AUTHENTICATION_FAILURE, "a wrong secret is refused");
    }
    let data = pattern(21, 8192);
    assert_eq!(s.on(1, |c| c.write10(16, &data)).status, 0, "connection 1 still serves");
    assert!(s.on(0, |c| c.read10(16, 16)).data == data, "connection 0 still serves");
    listed(&d, tsih, &[0, 1]);
}

#[test]
fn a_join_through_another_portal_group_is_refused() {
    let dir = TempDir::new("iscsi-mcs-pg");
    let (d, iqn) = setup(&dir);
    let port2 = iscsi_common::free_port();
    d.d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": port2.to_string()}]})),
    );
    d.d.call(
        "iscsi_target_node_add_pg_ig_maps",
        Some(json!({"name": iqn, "pg_ig_maps": [{"pg_tag": 2, "ig_tag": 1}]})),
    );
    let s = Session::lead(&d, &iqn, 2);
    let tsih = s.conns[0].tsih;
    let r = Ini::login_with(port2, Some(&iqn), |c| {
        c.options = mcs(2);
        c.tsih = tsih;
        c.cid = 1;
    });
    assert_eq!(refused(r), LoginStatus::SESSION_DOES_NOT_EXIST, "a session's connections share one portal group");
}

#[test]
fn immediate_requests_may_run_ahead_of_exp_cmd_sn_in_a_session_of_two() {
    let dir = TempDir::new("iscsi-mcs-immediate");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    // CmdSN `sn` went (as far as the initiator knows) on connection 1 and has not arrived;
    // an immediate TMF on connection 0 carries the initiator's current CmdSN, `sn + 1`.
    let sn = s.cmd_sn;
    // Served (the ITT checked), not taken as a protocol error: a task whose CmdSN is in the
    // window and not received counts as received and aborted (RFC 7143 section 11.5.1).
    assert_eq!(s.abort_task(0, sn + 1, 0x1234, sn), tmf_response::COMPLETE);
    assert_eq!(s.on(1, |c| c.tur()), 0);
    assert_eq!(s.on(0, |c| c.tur()), 0);
}

#[test]
fn a_session_logout_ends_a_write_waiting_for_data_on_another_connection() {
    let dir = TempDir::new("iscsi-mcs-logout-r2t");
    let (d, iqn) = setup(&dir);
    let mut s = Session::lead(&d, &iqn, 2);
    s.join(&d, &iqn, 1);
    let sn = s.cmd_sn;
    s.send_write(1, sn, 64, &pattern(5, 4096), false);
    let g = s.conns[1].recv();
    assert!(matches!(g.pdu, Pdu::R2t(_)), "expected an R2T, got {:?}", g.pdu);
    s.cmd_sn = sn + 1;
    let started = std::time::Instant::now();
    assert_eq!(s.logout(0, LogoutReason::CloseSession, 0), logout_response::SUCCESS);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the logout waited {:?} for data that never comes",
        started.elapsed()
    );
    d.wait_connections(0, Duration::from_secs(5));
}
