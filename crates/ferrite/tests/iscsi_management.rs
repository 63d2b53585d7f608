//! The management plane's view of the iSCSI engine and its requests, with the tests' own
//! initiator: `iscsi_get_connections` and `iscsi_get_stats` list logged-in connections as SPDK
//! does; NOP-Ins go out every `nop_in_interval` seconds and an initiator that does not answer
//! within `nop_timeout` is dropped (one that answers stays); `iscsi_target_node_request_logout`
//! and `iscsi_delete_target_node` ask the initiator to log out with an Asynchronous Message,
//! and the delete returns once it has.

mod common;
mod iscsi_common;

use common::TempDir;
use ferrite_iscsi::negotiate::InitiatorOptions;
use ferrite_iscsi::pdu::{LogoutReason, LogoutRequest, Pdu, RESERVED_TAG};
use iscsi_common::{closed_within, Ini, IscsiDaemon};
use serde_json::json;
use std::time::{Duration, Instant};

/// Waits for the Asynchronous Message asking for a logout (answering NOP-Ins meanwhile), then
/// logs out; the target answers and closes.
fn log_out_when_asked(ini: &mut Ini) {
    loop {
        let g = ini.recv();
        match g.pdu {
            Pdu::AsyncMessage(a) => {
                assert_eq!(a.async_event, 1, "a logout request");
                break;
            }
            Pdu::NopIn(n) if n.itt == RESERVED_TAG => ini.answer_nop(&n),
            other => panic!("expected an Asynchronous Message, got {other:?}"),
        }
    }
    let itt = ini.itt();
    let l = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CloseSession,
        itt,
        cid: 0,
        cmd_sn: ini.cmd_sn,
        exp_stat_sn: ini.exp_stat_sn,
    };
    ini.send(&Pdu::LogoutRequest(l), &[]);
    let Pdu::LogoutResponse(r) = ini.recv().pdu else { panic!("expected a Logout Response") };
    assert_eq!((r.itt, r.response), (itt, 0));
    assert!(closed_within(&mut ini.s, Duration::from_secs(5)), "the connection stays after the logout");
}

#[test]
fn connections_nop_ins_and_logout_requests() {
    let dir = TempDir::new("iscsi-mgmt");
    let d = IscsiDaemon::start_with_options(&dir, "0x3", Some(json!({"nop_in_interval": 1, "nop_timeout": 2})));
    d.malloc("Malloc0", 2048, 512);
    d.malloc("Malloc1", 2048, 512);
    let one = d.target("disk1", "Malloc0", json!({}));
    let two = d.target("disk2", "Malloc1", json!({}));
    let mut a = Ini::login(d.port, Some(&one), InitiatorOptions::default()).unwrap();
    let conns = d.connections();
    assert_eq!(conns.len(), 1, "{conns:?}");
    let c = &conns[0];
    assert_eq!(c["target_node_name"], "disk1");
    assert_eq!(c["login_phase"], "full_feature_phase");
    assert_eq!(c["initiator_addr"], "127.0.0.1");
    assert_eq!(c["state"], "running");
    assert!(c["tsih"].as_u64().is_some_and(|t| t > 0), "{c}");
    let stats = d.d.call("iscsi_get_stats", None);
    assert_eq!(stats["running"], 1, "{stats}");
    // An initiator that does not answer NOP-Ins is dropped; one that does stays (its commands
    // in between answer them).
    let mut silent = iscsi_common::Ini::login_with(d.port, Some(&two), |c| {
        c.isid = ferrite_iscsi::pdu::Isid([0x80, 0, 0, 9, 0, 0]);
    })
    .unwrap();
    let t0 = Instant::now();
    let mut saw_nop = false;
    while t0.elapsed() < Duration::from_secs(5) {
        assert_eq!(a.tur(), 0);
        std::thread::sleep(Duration::from_millis(200));
        saw_nop = true;
    }
    assert!(saw_nop);
    let g = silent.recv();
    let Pdu::NopIn(n) = g.pdu else { panic!("expected a NOP-In, got {:?}", g.pdu) };
    assert!(n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG);
    assert!(closed_within(&mut silent.s, Duration::from_secs(5)), "an initiator that does not answer NOP-Ins stays");
    assert_eq!(a.tur(), 0, "the answering initiator stays");
    // The management plane asks for a logout.
    d.d.call("iscsi_target_node_request_logout", Some(json!({"name": one})));
    log_out_when_asked(&mut a);
    d.wait_connections(0, Duration::from_secs(5));
    // Deleting a node with a session: the initiator is asked to log out; the delete returns
    // once it has.
    let mut b = Ini::login(d.port, Some(&two), InitiatorOptions::default()).unwrap();
    assert_eq!(b.tur(), 0);
    let sock = d.d.sock.clone();
    let two_name = two.clone();
    let deleter = std::thread::spawn(move || {
        let mut c = ferrite_rpc::client::RpcClient::connect(&sock, Duration::from_secs(60)).unwrap();
        c.call("iscsi_delete_target_node", Some(json!({"name": two_name}))).map_err(|e| e.to_string())
    });
    log_out_when_asked(&mut b);
    assert_eq!(deleter.join().unwrap(), Ok(json!(true)));
    assert!(Ini::login(d.port, Some(&two), InitiatorOptions::default()).is_err(), "the deleted node still logs in");
    d.d.assert_serving();
}

#[test]
fn portal_groups_wait_start_and_delete() {
    let dir = TempDir::new("iscsi-pg");
    let d = IscsiDaemon::start(&dir, "0x1");
    d.malloc("Malloc0", 2048, 512);
    let iqn = d.target("disk1", "Malloc0", json!({}));
    // A second portal group made with `wait`: bound (its port taken) but not accepting.
    let port = iscsi_common::free_port();
    d.d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": port.to_string()}], "wait": true})),
    );
    d.d.call(
        "iscsi_target_node_add_pg_ig_maps",
        Some(json!({"name": iqn, "pg_ig_maps": [{"pg_tag": 2, "ig_tag": 1}]})),
    );
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err(), "the paused portal is not bound");
    let waiting = std::thread::spawn(move || {
        Ini::login(port, Some(&format!("{}:disk1", iscsi_common::BASE)), InitiatorOptions::default())
            .map(|mut i| i.tur())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "a paused portal group answered a login");
    d.d.call("iscsi_start_portal_group", Some(json!({"tag": 2})));
    assert_eq!(waiting.join().unwrap().expect("login once started"), 0);
    // Deleting the group stops its listener.
    d.d.call("iscsi_delete_portal_group", Some(json!({"tag": 2})));
    std::thread::sleep(Duration::from_millis(100));
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "a deleted portal group still listens");
    d.d.assert_serving();
}

#[test]
fn a_removed_lun_leaves_its_sessions() {
    let dir = TempDir::new("iscsi-lun");
    let d = IscsiDaemon::start(&dir, "0x3");
    d.malloc("Malloc0", 2048, 512);
    d.malloc("Malloc1", 2048, 512);
    let iqn = d.target(
        "disk1",
        "Malloc0",
        json!({"luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}]}),
    );
    let mut ini = Ini::login(d.port, Some(&iqn), InitiatorOptions::default()).unwrap();
    assert_eq!(ini.scsi_lun(1, &[0; 6], 0, &[]).status, 0);
    d.d.call("bdev_malloc_delete", Some(json!({"name": "Malloc1"})));
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.d.bdev_names().contains(&"Malloc1".to_string()) {
        assert!(Instant::now() < deadline, "the bdev of a LUN with a session was not deleted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = ini.scsi_lun(1, &[0; 6], 0, &[]);
    assert_eq!(r.status, 2);
    assert_eq!((r.sense[2] & 0x0f, r.sense[12]), (0x05, 0x25), "LOGICAL UNIT NOT SUPPORTED: {:02x?}", r.sense);
    // LUN 0's nexus hears of it.
    let r = ini.scsi(&[0; 6], 0, &[]);
    assert_eq!((r.status, r.sense[12], r.sense[13]), (2, 0x3f, 0x0e), "REPORTED LUNS DATA HAS CHANGED");
    assert_eq!(ini.tur(), 0);
}

#[test]
fn logins_follow_the_access_rules() {
    use ferrite_iscsi::login::{InitiatorLoginError, LoginStatus};
    let dir = TempDir::new("iscsi-access");
    let d = IscsiDaemon::start(&dir, "0x1");
    for b in ["M0", "M1", "M2"] {
        d.malloc(b, 1024, 512);
    }
    let open = d.target("open", "M0", json!({}));
    d.d.call(
        "iscsi_create_initiator_group",
        Some(json!({"tag": 2, "initiators": ["iqn.2026-01.io.ferrite:someone-else"], "netmasks": ["ANY"]})),
    );
    let only = d.target("only", "M1", json!({"pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]}));
    let moved = d.target("moved", "M2", json!({}));
    d.d.call(
        "iscsi_target_node_set_redirect",
        Some(json!({"name": moved, "pg_tag": 1, "redirect_host": "127.0.0.1", "redirect_port": "3999"})),
    );
    let status = |r: Result<Ini, InitiatorLoginError>| match r {
        Ok(_) => panic!("the login succeeded"),
        Err(InitiatorLoginError::Status(s)) => s,
        Err(e) => panic!("login failed otherwise: {e}"),
    };
    assert_eq!(
        status(Ini::login(d.port, Some(&only), InitiatorOptions::default())),
        LoginStatus::AUTHORIZATION_FAILURE
    );
    let nowhere = format!("{}:nowhere", iscsi_common::BASE);
    assert_eq!(status(Ini::login(d.port, Some(&nowhere), InitiatorOptions::default())), LoginStatus::NOT_FOUND);
    match Ini::login(d.port, Some(&moved), InitiatorOptions::default()) {
        Err(InitiatorLoginError::Redirect { status, address }) => {
            assert_eq!(status, LoginStatus::TARGET_MOVED_TEMPORARILY);
            assert_eq!(address.as_deref(), Some("127.0.0.1:3999"));
        }
        Err(e) => panic!("expected a redirection, got {e}"),
        Ok(_) => panic!("expected a redirection, got a session"),
    }
    // One connection per session: joining a session is refused.
    let mut a = Ini::login(d.port, Some(&open), InitiatorOptions::default()).unwrap();
    let tsih = d.connections()[0]["tsih"].as_u64().unwrap() as u16;
    let join = Ini::login_with(d.port, Some(&open), |c| {
        c.tsih = tsih;
        c.cid = 1;
    });
    assert_eq!(status(join), LoginStatus::TOO_MANY_CONNECTIONS);
    let join = Ini::login_with(d.port, Some(&open), |c| {
        c.tsih = tsih.wrapping_add(100);
        c.cid = 1;
    });
    assert_eq!(status(join), LoginStatus::SESSION_DOES_NOT_EXIST);
    assert_eq!(a.tur(), 0);
}
