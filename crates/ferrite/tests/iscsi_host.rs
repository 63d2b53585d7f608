//! Ferrite's iSCSI initiator (`bdev_iscsi_create`) against real targets, in separate
//! processes: Ferrite's own iSCSI target exporting malloc and file LUNs, and Linux's tgt
//! (tgtd with a file LUN; SKIP when tgt is not installed).
//!
//! Data is always checked: `ferrite perf -w verify` through the initiator (two reactors, two
//! sessions; queue depths above the target's CmdSN window; writes that go as immediate data
//! and on R2Ts; digests), and qemu-io patterns through an NBD export of the iSCSI bdev
//! (writes read back, flush, discard reaching the target as UNMAP). Also: CHAP (one-way,
//! mutual, wrong secrets), save_config round trips, bdev_iscsi_delete logging out, the RPCs'
//! errors, NOP-Ins answered (a target that drops silent initiators keeps the session), a
//! target's CHECK CONDITION reaching the bdev user as an error, reconnection after the target
//! is killed and restarted under I/O (nothing acknowledged lost, no failed I/O), I/O failing
//! within `timeout_sec` when the target stays away, and a target that breaks the protocol
//! (through a proxy that corrupts what it sends): the connection is dropped with a log line
//! and the I/O goes on after a new login. Against tgt also with its keys changed
//! (InitialR2T=No: unsolicited Data-Out; ImmediateData=No; 4 KiB data segments) and thin
//! provisioning (UNMAP).

mod common;
mod iscsi_common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::{have, qemu_io, run_tool, try_qemu_io, Tool};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INITIATOR: &str = "iqn.2016-06.io.ferrite:host-test";

/// A Ferrite iSCSI target on 127.0.0.1:`port` with one core: `setup` makes its bdevs, then
/// portal group 1 and an open initiator group 1.
fn ferrite_target(dir: &TempDir, sock: &str, port: u16, setup: impl Fn(&Daemon)) -> Daemon {
    let d = Daemon::start_with(dir, sock, "0x1", &["--no-pin"]);
    setup(&d);
    d.call(
        "iscsi_create_portal_group",
        Some(json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]})),
    );
    d.call("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})));
    d
}

/// Target node `name` with LUN 0 over `bdev` (and `extra` parameters); its full name.
fn node(d: &Daemon, name: &str, bdev: &str, extra: Value) -> String {
    let mut p = json!({"name": name, "alias_name": "", "luns": [{"bdev_name": bdev, "lun_id": 0}],
        "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 32});
    for (k, v) in extra.as_object().expect("node parameters") {
        p[k] = v.clone();
    }
    d.call("iscsi_create_target_node", Some(p));
    format!("{}:{name}", iscsi_common::BASE)
}

fn url(port: u16, iqn: &str, lun: u32) -> String {
    format!("iscsi://127.0.0.1:{port}/{iqn}/{lun}")
}

fn create_params(name: &str, url: &str) -> Value {
    json!({"name": name, "url": url, "initiator_iqn": INITIATOR})
}

/// Runs `ferrite perf -w verify` on two cores over bdev `name` attached from `url`, with
/// `bdev_iscsi_set_options` `options` first if given; checks no I/O failed or miscompared.
fn perf_verify(dir: &TempDir, url: &str, qd: u32, size: u32, options: Option<Value>) {
    let mut config = vec![];
    if let Some(o) = options {
        config.push(json!({"method": "bdev_iscsi_set_options", "params": o}));
    }
    config.push(json!({"method": "bdev_iscsi_create", "params": create_params("iSCSI0", url)}));
    let cfg = dir.write_json("host.json", &json!({"subsystems": [{"subsystem": "bdev", "config": config}]}));
    let res = dir.join("perf.json");
    let args = common::perf_verify_args(&cfg, "iSCSI0", qd, size, "0x3", &res);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_tool(dir, common::FERRITE, &args, Duration::from_secs(60));
    out.assert_ok("ferrite perf over bdev_iscsi");
    let what = format!("{url} QD {qd} {size} B");
    let iops = common::check_verify_results(&res, &what, &out.stderr);
    println!("{what}: {iops} IOPS");
}

/// A host daemon (two cores) with `name` attached from `url` and exported over NBD; returns
/// it and the NBD URI.
fn host_with_nbd(dir: &TempDir, name: &str, url: &str, options: Option<Value>) -> (Daemon, String) {
    let h = Daemon::start_with(dir, "host.sock", "0x3", &["--no-pin", "--wait-for-rpc"]);
    if let Some(o) = options {
        h.call("bdev_iscsi_set_options", Some(o));
    }
    h.call("framework_start_init", None);
    assert_eq!(h.call("bdev_iscsi_create", Some(create_params(name, url))), json!(name));
    let nbd = h.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = nbd["address"].as_str().unwrap().to_string();
    h.call("nbd_server_add_export", Some(json!({"bdev_name": name, "name": "e0"})));
    (h, format!("nbd://{addr}/e0"))
}

/// Waits until target `t` lists no connection (the initiator `h` logged out).
fn wait_no_connections(t: &Daemon, h: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.call("iscsi_get_connections", None) != json!([]) {
        assert!(
            Instant::now() < deadline,
            "connections left: {}\ninitiator:\n{}\ntarget:\n{}",
            t.call("iscsi_get_connections", None),
            h.proc.stderr(),
            t.proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bdev(d: &Daemon, name: &str) -> Value {
    d.call("bdev_get_bdevs", Some(json!({"name": name})))[0].clone()
}

fn iostat(d: &Daemon, name: &str) -> Value {
    d.call("bdev_get_iostat", Some(json!({"name": name})))["bdevs"][0].clone()
}

#[test]
fn verify_through_ferrite_target() {
    let dir = TempDir::new("iscsi-host-verify");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 65536, "block_size": 512})));
        d.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 8192, "block_size": 4096})));
        d.call("bdev_malloc_create", Some(json!({"name": "M2", "num_blocks": 8192, "block_size": 512})));
        d.call("bdev_malloc_create", Some(json!({"name": "M3", "num_blocks": 65536, "block_size": 512})));
    });
    let disk0 = node(&t, "disk0", "M0", json!({}));
    let disk1 = node(&t, "disk1", "M1", json!({}));
    // A CmdSN window of 4 commands per session: perf's 32 wait for it.
    let narrow = node(&t, "narrow", "M2", json!({"queue_depth": 4}));
    let digests = node(&t, "digests", "M3", json!({"header_digest": true, "data_digest": true}));
    for (iqn, qd, size) in [
        (&disk0, 1, 4096),
        (&disk0, 32, 4096),
        (&disk0, 16, 65536),
        (&disk0, 8, 1 << 20),
        (&disk1, 32, 16384),
        (&disk1, 4, 262144),
        (&narrow, 32, 8192),
        (&digests, 16, 131072),
    ] {
        perf_verify(&dir, &url(port, iqn, 0), qd, size, None);
    }
    // The initiator's sessions logged out when perf ended.
    wait_no_connections(&t, &t);
    t.assert_serving();
}

#[test]
fn unsolicited_data_outs_count_their_data_sn() {
    // FirstBurstLength 256 KiB (Ferrite's target: InitialR2T=No) with 64 KiB data segments:
    // a 200 KiB write goes as 64 KiB of immediate data and unsolicited Data-Outs of DataSN 0,
    // 1, 2 (all numbered 0 before: the target refused the second and the write failed).
    let dir = TempDir::new("iscsi-host-unsolicited");
    let t = iscsi_common::IscsiDaemon::start_with_options(&dir, "0x1", Some(json!({"first_burst_length": 262144})));
    t.malloc("M0", 65536, 512);
    let iqn = t.target("disk0", "M0", json!({}));
    for qd in [1, 8] {
        perf_verify(&dir, &t.url(&iqn, None), qd, 200 << 10, None);
    }
    assert!(!t.d.proc.stderr().contains("DataSN"), "{}", t.d.proc.stderr());
    t.d.assert_serving();
}

#[test]
fn patterns_flush_unmap_and_save_config_through_nbd() {
    if !have("patterns_flush_unmap_and_save_config_through_nbd", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-nbd");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 32768, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let u = url(port, &iqn, 0);
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &u, Some(json!({"timeout_sec": 20})));
    let b = bdev(&h, "iSCSI0");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(512), Some(32768)), "{b}");
    assert_eq!(b["product_name"], "iSCSI LUN", "{b}");
    assert_eq!(b["supported_io_types"]["unmap"], true, "the malloc LUN unmaps (LBPU): {b}");
    assert_eq!(b["supported_io_types"]["flush"], true, "{b}");
    let ds = &b["driver_specific"]["iscsi"];
    assert_eq!((ds["url"].as_str(), ds["initiator_name"].as_str()), (Some(u.as_str()), Some(INITIATOR)), "{b}");
    let cmds: Vec<String> = [
        "write -P 0x5a 0 1M",
        "write -P 0xa5 1M 64k",
        "write -P 0x33 4095k 1k",
        "flush",
        "read -P 0x5a 0 1M",
        "read -P 0xa5 1M 64k",
        "read -P 0x33 4095k 1k",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    qemu_io(&dir, &uri, &cmds);
    let before = iostat(&t, "M0");
    qemu_io(
        &dir,
        &uri,
        &["discard 0 512k".to_string(), "read -P 0 0 512k".to_string(), "read -P 0x5a 512k 512k".to_string()],
    );
    let after = iostat(&t, "M0");
    assert!(after["num_unmap_ops"].as_u64() > before["num_unmap_ops"].as_u64(), "no UNMAP reached the target: {after}");
    assert!(after["num_flush_ops"].as_u64() >= Some(1), "no SYNCHRONIZE CACHE reached the target: {after}");
    // save_config keeps the options and the bdev; a daemon started with it has the LUN again.
    let saved = h.call("save_config", None);
    let creates = common::saved_entries(&saved, "bdev_iscsi_create");
    assert_eq!(creates.len(), 1, "{saved}");
    assert_eq!(creates[0]["params"], create_params("iSCSI0", &u), "{saved}");
    let opts = common::saved_entries(&saved, "bdev_iscsi_set_options");
    assert_eq!(opts[0]["params"]["timeout_sec"], 20, "{saved}");
    // A clean stop: the sessions log out, the daemon exits 0.
    let mut h = h;
    h.proc.sigterm();
    let st = h.proc.expect_exit(Duration::from_secs(15), "host daemon after SIGTERM");
    assert!(st.success(), "{st}: {}", h.proc.stderr());
    // The bdev subsystem alone (the NBD export is made again below).
    let bdevs = |cfg: &Value| cfg["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "bdev").cloned();
    let cfg = dir.write_json("saved.json", &json!({"subsystems": [bdevs(&saved).unwrap()]}));
    let h2 = Daemon::start_with(&dir, "host2.sock", "0x1", &["--no-pin", "--json", cfg.to_str().unwrap()]);
    assert_eq!(bdev(&h2, "iSCSI0")["driver_specific"]["iscsi"]["timeout_sec"], 20);
    assert_eq!(bdevs(&h2.call("save_config", None)), bdevs(&saved), "save_config after a restart with it differs");
    let nbd = h2.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    h2.call("nbd_server_add_export", Some(json!({"bdev_name": "iSCSI0", "name": "e0"})));
    let uri2 = format!("nbd://{}/e0", nbd["address"].as_str().unwrap());
    qemu_io(&dir, &uri2, &["read -P 0xa5 1M 64k".to_string()]);
    t.assert_serving();
}

#[test]
fn chap_one_way_and_mutual() {
    let dir = TempDir::new("iscsi-host-chap");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 512})));
        d.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 2048, "block_size": 512})));
    });
    t.call(
        "iscsi_create_auth_group",
        Some(json!({"tag": 1, "secrets": [
            {"user": "alice", "secret": "alice-secret-1"},
            {"user": "bob", "secret": "bob-secret-22", "muser": "target", "msecret": "target-secret-333"}]})),
    );
    let one = node(&t, "oneway", "M0", json!({"require_chap": true, "chap_group": 1}));
    let mutual = node(&t, "mutual", "M1", json!({"require_chap": true, "mutual_chap": true, "chap_group": 1}));
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    let at = |cred: &str, iqn: &str, query: &str| format!("iscsi://{cred}127.0.0.1:{port}/{iqn}/0{query}");
    let ok =
        |name: &str, u: String| assert_eq!(h.call("bdev_iscsi_create", Some(create_params(name, &u))), json!(name));
    let refused = |u: String, what: &str| {
        let e = h.call_err("bdev_iscsi_create", Some(create_params("Bad", &u)));
        assert_eq!(e.code, -32602, "{what}: {e:?}");
        e.message
    };
    ok("A", at("alice%alice-secret-1@", &one, ""));
    let m = refused(at("alice%wrong-secret@", &one, ""), "a wrong secret");
    assert!(m.contains("authentication"), "{m}");
    refused(at("", &one, ""), "no CHAP to a node that requires it");
    ok("B", at("bob%bob-secret-22@", &mutual, "?target_user=target&target_password=target-secret-333"));
    let m = refused(
        at("bob%bob-secret-22@", &mutual, "?target_user=target&target_password=not-the-target"),
        "a target that does not know the mutual secret",
    );
    assert!(m.contains("CHAP"), "{m}");
    // I/O through both (each reactor's session logs in with CHAP too).
    let res = dir.join("perf.json");
    let saved = h.call("save_config", None);
    let cfg = dir.write_json("cfg.json", &saved);
    for b in ["A", "B"] {
        let args = common::perf_verify_args(&cfg, b, 8, 4096, "0x3", &res);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_tool(&dir, common::FERRITE, &args, Duration::from_secs(60));
        out.assert_ok("perf over CHAP");
        common::check_verify_results(&res, b, &out.stderr);
    }
    assert_eq!(h.bdev_names(), ["A", "B"]);
    t.assert_serving();
}

#[test]
fn rpc_errors_and_delete() {
    let dir = TempDir::new("iscsi-host-rpc");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    let err = |p: Value| h.call_err("bdev_iscsi_create", Some(p));
    let e = err(create_params("X", "http://127.0.0.1/iqn/0"));
    assert!(e.code == -libc::EINVAL && e.message.contains("URL"), "{e:?}");
    let e = err(json!({"name": "X", "url": url(port, &iqn, 0), "initiator_iqn": ""}));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    let e = err(json!({"name": "X", "url": url(port, &iqn, 0)}));
    assert_eq!(e.code, -32603, "SPDK's decode error: {e:?}");
    let e = err(create_params("X", &url(port, &iqn, 3)));
    assert!(e.code == -32602 && e.message.contains("LUN 3"), "no such LUN: {e:?}");
    let e = err(create_params("X", &url(port, "iqn.2016-06.io.spdk:nothere", 0)));
    assert_eq!(e.code, -32602, "unknown target: {e:?}");
    let closed = iscsi_common::free_port();
    let e = err(create_params("X", &url(closed, &iqn, 0)));
    assert_eq!(e.code, -32602, "nothing listens: {e:?}");
    assert_eq!(h.call("bdev_iscsi_create", Some(create_params("X", &url(port, &iqn, 0)))), json!("X"));
    let e = err(create_params("X", &url(port, &iqn, 0)));
    assert!(e.code == -32602 && e.message.contains("exists"), "{e:?}");
    // Only the probe's session logged in; it logged out.
    wait_no_connections(&t, &h);
    // I/O opens a session on the daemon's reactor; delete logs it out.
    h.call("bdev_malloc_create", Some(json!({"name": "Mx", "num_blocks": 8, "block_size": 512})));
    let nbd = h.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "X", "name": "x"})));
    if have("rpc_errors_and_delete", &["qemu-io"]) {
        let uri = format!("nbd://{}/x", nbd["address"].as_str().unwrap());
        qemu_io(&dir, &uri, &["write -P 0x11 0 4k".to_string(), "read -P 0x11 0 4k".to_string()]);
    }
    assert_eq!(h.call("bdev_iscsi_delete", Some(json!({"name": "X"}))), json!(true));
    assert!(!h.bdev_names().contains(&"X".to_string()));
    wait_no_connections(&t, &h);
    let e = h.call_err("bdev_iscsi_delete", Some(json!({"name": "X"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = h.call_err("bdev_iscsi_delete", Some(json!({"name": "Mx"})));
    assert_eq!(e.code, -libc::ENODEV, "not an iSCSI bdev: {e:?}");
    h.assert_serving();
}

#[test]
fn nop_ins_are_answered_and_target_errors_reach_the_bdev() {
    if !have("nop_ins_are_answered_and_target_errors_reach_the_bdev", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-nop");
    // A NOP-In every second, to be answered within 2 s.
    let t = iscsi_common::IscsiDaemon::start_with_options(
        &dir,
        "0x1",
        Some(json!({"nop_in_interval": 1, "nop_timeout": 2})),
    );
    t.malloc("M0", 8192, 512);
    // An error bdev under the LUN: its failures come back as CHECK CONDITION.
    t.d.call("bdev_error_create", Some(json!({"base_name": "M0"})));
    let iqn = t.target("disk0", "EE_M0", json!({}));
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &t.url(&iqn, None), None);
    // A client that stays connected (and so keeps the session) while it sleeps 6 s: several
    // NOP-In rounds, every one answered, no connection dropped.
    let ids = |c: Vec<Value>| -> Vec<Value> { c.iter().map(|c| c["id"].clone()).collect() };
    let client = Tool::spawn(
        &dir,
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x61 0 64k", "-c", "sleep 6000", "-c", "read -P 0x61 0 64k", &uri],
    );
    std::thread::sleep(Duration::from_secs(1));
    let before = ids(t.connections());
    assert!(!before.is_empty(), "no session while the client is connected");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(ids(t.connections()), before, "a session was dropped:\n{}", t.d.proc.stderr());
    let out = client.wait(Duration::from_secs(30));
    out.assert_ok("qemu-io across NOP-Ins");
    assert!(!out.stdout.contains("fail"), "{}", out.stdout);
    assert_eq!(bdev(&h, "iSCSI0")["driver_specific"]["iscsi"]["reconnects"], 0);
    t.d.call(
        "bdev_error_inject_error",
        Some(json!({"name": "EE_M0", "io_type": "write", "error_type": "failure", "num": 1})),
    );
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0x62 0 4k");
    assert!(!ok, "a write the target failed succeeded: {out}");
    qemu_io(&dir, &uri, &["write -P 0x63 0 4k".to_string(), "read -P 0x63 0 4k".to_string()]);
    assert_eq!(bdev(&h, "iSCSI0")["driver_specific"]["iscsi"]["reconnects"], 0, "an error status dropped a connection");
    h.assert_serving();
}

/// A target over a file (the data outlives the process) on `port`.
fn file_target(dir: &TempDir, port: u16, img: &Path) -> (Daemon, String) {
    let img = img.to_str().unwrap().to_string();
    let t = ferrite_target(dir, "tgt.sock", port, |d| {
        d.call("bdev_uring_create", Some(json!({"name": "U0", "filename": img, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "U0", json!({}));
    (t, iqn)
}

fn kill_target(t: &mut Daemon) {
    t.proc.signal(libc::SIGKILL);
    t.proc.expect_exit(Duration::from_secs(10), "killed target");
    std::fs::remove_file(&t.sock).ok();
}

#[test]
fn reconnects_after_the_target_restarts_under_io() {
    let dir = TempDir::new("iscsi-host-restart");
    let port = iscsi_common::free_port();
    let img = dir.file_filled("disk.img", 32 << 20, 0);
    let (mut t, iqn) = file_target(&dir, port, &img);
    // perf (the initiator, in its own process) writes, reads back and compares for 12 s; the
    // target is killed 3 s in and comes back 3 s later. Nothing may fail or miscompare.
    let u = url(port, &iqn, 0);
    let config = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_iscsi_create", "params": create_params("iSCSI0", &u)}]}]});
    let cfg = dir.write_json("host.json", &config);
    let res = dir.join("perf.json");
    let mut args = common::perf_verify_args(&cfg, "iSCSI0", 16, 16384, "0x3", &res);
    let t_at = args.iter().position(|a| a == "-t").unwrap();
    args[t_at + 1] = "12".into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let perf = Tool::spawn(&dir, common::FERRITE, &args);
    std::thread::sleep(Duration::from_secs(3));
    kill_target(&mut t);
    std::thread::sleep(Duration::from_secs(3));
    let (t2, _) = file_target(&dir, port, &img);
    let out = perf.wait(Duration::from_secs(60));
    out.assert_ok("ferrite perf across a target restart");
    common::check_verify_results(&res, "verify across a target restart", &out.stderr);
    // perf logs warnings only: the failed logins while the target was away.
    assert!(out.stderr.contains("login to 127.0.0.1"), "the target's absence went unnoticed:\n{}", out.stderr);
    // Through a daemon: data written before a restart is read back after it; the bdev stays.
    if !have("reconnects_after_the_target_restarts_under_io", &["qemu-io"]) {
        return;
    }
    let mut t2 = t2;
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &u, None);
    qemu_io(&dir, &uri, &["write -P 0xab 1M 1M".to_string()]);
    kill_target(&mut t2);
    std::thread::sleep(Duration::from_secs(1));
    // A read while the target is away waits for it (up to timeout_sec).
    let reader = Tool::spawn(&dir, "qemu-io", &["-f", "raw", "-c", "read -P 0xab 1M 1M", &uri]);
    std::thread::sleep(Duration::from_secs(2));
    let _t3 = file_target(&dir, port, &img);
    let r = reader.wait(Duration::from_secs(40));
    let all = format!("{}\n{}", r.stdout, r.stderr);
    assert!(
        r.status.success() && !all.contains("fail") && all.contains(" bytes at offset "),
        "read across the restart: {all}\nhost:\n{}",
        h.proc.stderr()
    );
    let b = bdev(&h, "iSCSI0");
    assert!(b["driver_specific"]["iscsi"]["reconnects"].as_u64() >= Some(1), "{b}");
    h.assert_serving();
}

#[test]
fn io_fails_within_timeout_sec_when_the_target_stays_away() {
    if !have("io_fails_within_timeout_sec_when_the_target_stays_away", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-gone");
    let port = iscsi_common::free_port();
    let img = dir.file_filled("disk.img", 8 << 20, 0);
    let (mut t, iqn) = file_target(&dir, port, &img);
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &url(port, &iqn, 0), Some(json!({"timeout_sec": 3})));
    qemu_io(&dir, &uri, &["write -P 0x77 0 64k".to_string()]);
    kill_target(&mut t);
    let started = Instant::now();
    let (ok, out) = try_qemu_io(&dir, &uri, "read 0 64k");
    assert!(!ok, "a read succeeded with the target gone: {out}");
    assert!(started.elapsed() < Duration::from_secs(15), "the failed read took {:?}", started.elapsed());
    assert!(h.proc.stderr().contains("failed after waiting"), "{}", h.proc.stderr());
    // The bdev stays; it works again once the target is back.
    assert!(h.bdev_names().contains(&"iSCSI0".to_string()));
    let _t2 = file_target(&dir, port, &img);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = try_qemu_io(&dir, &uri, "read -P 0x77 0 64k");
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "no read after the target came back: {out}\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(500));
    }
    h.assert_serving();
}

/// What the proxy does to the next PDU the target sends after it is armed.
const INJECT_NONE: u8 = 0;
/// A Data-In or SCSI Response with its ITT changed.
const INJECT_WRONG_ITT: u8 = 1;
/// A PDU header announcing a data segment over the initiator's MaxRecvDataSegmentLength.
const INJECT_OVERSIZE: u8 = 2;
/// A header with an undefined opcode.
const INJECT_BAD_OPCODE: u8 = 3;
/// After a SCSI Response, a flood of NOP-Ins asking for an answer (TTT [`FLOOD_TTT`]) with
/// ping data.
const INJECT_NOP_FLOOD: u8 = 4;
/// Every Data-In and SCSI Response with its ITT changed (not disarmed).
const INJECT_WRONG_ITT_ALWAYS: u8 = 5;
/// Every SCSI Response's status made BUSY (not disarmed).
const INJECT_BUSY_ALWAYS: u8 = 6;
/// Every Data-In and SCSI Response dropped: a silent target (not disarmed).
const INJECT_SILENT: u8 = 7;
/// SCSI Responses the proxy made BUSY.
static BUSY_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// NOP-Ins in a flood.
const FLOOD_PINGS: u64 = 20_000;
/// The TTT of the flood's NOP-Ins: the NOP-Outs answering them are counted and not forwarded.
const FLOOD_TTT: u32 = 0x5eed_5eed;
/// NOP-Outs answering the flood, and the data bytes they carried.
static FLOOD_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static FLOOD_ANSWER_DATA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Reads one PDU (no digests) from `s`; None at end of stream.
fn read_pdu(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut pdu = vec![0u8; 48];
    s.read_exact(&mut pdu).ok()?;
    let ahs = usize::from(pdu[4]) * 4;
    let data = u32::from_be_bytes([0, pdu[5], pdu[6], pdu[7]]) as usize;
    let rest = ahs + data.div_ceil(4) * 4;
    pdu.resize(48 + rest, 0);
    s.read_exact(&mut pdu[48..]).ok()?;
    Some(pdu)
}

/// A TCP proxy to the target on `target_port` that corrupts the target's next SCSI Response or
/// Data-In as `inject` says (armed by storing a mode; it disarms itself). Returns its port and
/// the count of connections it took.
fn spawn_proxy(target_port: u16, inject: Arc<AtomicU8>) -> (u16, Arc<std::sync::atomic::AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let conns = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = conns.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(mut client) = client else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let Ok(mut target) = TcpStream::connect(("127.0.0.1", target_port)) else { continue };
            let (mut c2, mut t2) = (client.try_clone().unwrap(), target.try_clone().unwrap());
            std::thread::spawn(move || {
                while let Some(pdu) = read_pdu(&mut c2) {
                    if pdu[0] & 0x3f == 0x00 && pdu[20..24] == FLOOD_TTT.to_be_bytes() {
                        FLOOD_ANSWERS.fetch_add(1, Ordering::SeqCst);
                        let data = u32::from_be_bytes([0, pdu[5], pdu[6], pdu[7]]);
                        FLOOD_ANSWER_DATA.fetch_add(u64::from(data), Ordering::SeqCst);
                        continue;
                    }
                    if t2.write_all(&pdu).is_err() {
                        break;
                    }
                }
                let _ = t2.shutdown(std::net::Shutdown::Both);
            });
            let inject = inject.clone();
            std::thread::spawn(move || {
                while let Some(mut pdu) = read_pdu(&mut target) {
                    let opcode = pdu[0] & 0x3f;
                    if opcode == 0x21 && inject.load(Ordering::SeqCst) == INJECT_NOP_FLOOD {
                        inject.store(INJECT_NONE, Ordering::SeqCst);
                        // The response first, then the pings (with its ExpCmdSN and MaxCmdSN).
                        if client.write_all(&pdu).is_err() {
                            break;
                        }
                        let mut nop = vec![0u8; 48 + 512];
                        nop[0] = 0x20;
                        nop[1] = 0x80;
                        nop[5..8].copy_from_slice(&[0, 2, 0]);
                        nop[16..20].copy_from_slice(&[0xff; 4]);
                        nop[20..24].copy_from_slice(&FLOOD_TTT.to_be_bytes());
                        nop[24..36].copy_from_slice(&pdu[24..36]);
                        nop[48..].fill(0xab);
                        let flood: Vec<u8> = (0..FLOOD_PINGS).flat_map(|_| nop.iter().copied()).collect();
                        if client.write_all(&flood).is_err() {
                            break;
                        }
                        continue;
                    }
                    if (opcode == 0x21 || opcode == 0x25) && inject.load(Ordering::SeqCst) == INJECT_SILENT {
                        continue;
                    }
                    if opcode == 0x21 && inject.load(Ordering::SeqCst) == INJECT_BUSY_ALWAYS {
                        pdu[3] = 0x08;
                        BUSY_ANSWERS.fetch_add(1, Ordering::SeqCst);
                    } else if (opcode == 0x21 || opcode == 0x25)
                        && inject.load(Ordering::SeqCst) == INJECT_WRONG_ITT_ALWAYS
                    {
                        pdu[16..20].copy_from_slice(&0x7777_7777u32.to_be_bytes());
                    } else if opcode == 0x21 || opcode == 0x25 {
                        match inject.swap(INJECT_NONE, Ordering::SeqCst) {
                            INJECT_WRONG_ITT => pdu[16..20].copy_from_slice(&0x7777_7777u32.to_be_bytes()),
                            INJECT_OVERSIZE => {
                                let mut bad = pdu[..48].to_vec();
                                bad[5..8].copy_from_slice(&[0xff, 0xff, 0xf0]);
                                let _ = client.write_all(&bad);
                            }
                            INJECT_BAD_OPCODE => {
                                let mut bad = vec![0u8; 48];
                                bad[0] = 0x3d;
                                bad[1] = 0x80;
                                let _ = client.write_all(&bad);
                            }
                            _ => {}
                        }
                    }
                    if client.write_all(&pdu).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (port, conns)
}

#[test]
fn a_target_that_breaks_the_protocol_is_dropped_and_io_goes_on() {
    if !have("a_target_that_breaks_the_protocol_is_dropped_and_io_goes_on", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-hostile");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let inject = Arc::new(AtomicU8::new(INJECT_NONE));
    let (proxy, _) = spawn_proxy(port, inject.clone());
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &url(proxy, &iqn, 0), None);
    qemu_io(&dir, &uri, &["write -P 0x42 0 256k".to_string()]);
    for (mode, what) in [
        (INJECT_WRONG_ITT, "names no outstanding command"),
        (INJECT_OVERSIZE, "MaxRecvDataSegmentLength"),
        (INJECT_BAD_OPCODE, "opcode"),
    ] {
        // The protocol error's log line is rate-limited to one a second.
        std::thread::sleep(Duration::from_millis(1100));
        inject.store(mode, Ordering::SeqCst);
        // The corrupted answer drops the connection; the command is sent again after a new
        // login, and the read sees the data.
        qemu_io(&dir, &uri, &["read -P 0x42 0 256k".to_string()]);
        assert_eq!(inject.load(Ordering::SeqCst), INJECT_NONE, "the proxy injected nothing");
        let log = h.proc.stderr();
        assert!(log.contains("protocol error by the target") && log.contains(what), "mode {mode}: {log}");
    }
    qemu_io(&dir, &uri, &["write -P 0x43 64k 64k".to_string(), "read -P 0x43 64k 64k".to_string()]);
    assert!(bdev(&h, "iSCSI0")["driver_specific"]["iscsi"]["reconnects"].as_u64() >= Some(3));
    h.assert_serving();
    t.assert_serving();
}

#[test]
fn a_nop_in_flood_is_answered_without_data_and_not_once_per_ping() {
    if !have("a_nop_in_flood_is_answered_without_data_and_not_once_per_ping", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-nop-flood");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let inject = Arc::new(AtomicU8::new(INJECT_NONE));
    let (proxy, _) = spawn_proxy(port, inject.clone());
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &url(proxy, &iqn, 0), None);
    // A client that keeps the session while the flood comes (after its write's response; armed
    // once the attach's own commands are over, their connections closing).
    let client = Tool::spawn(
        &dir,
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "sleep 1500",
            "-c",
            "write -P 0x42 0 64k",
            "-c",
            "sleep 3000",
            "-c",
            "read -P 0x42 0 64k",
            &uri,
        ],
    );
    std::thread::sleep(Duration::from_millis(700));
    inject.store(INJECT_NOP_FLOOD, Ordering::SeqCst);
    // The pings arrive faster than the answers go: a NOP-Out waiting to be sent answers them
    // all (one answer queued at most, none echoing the 10 MB of ping data).
    let deadline = Instant::now() + Duration::from_secs(10);
    while FLOOD_ANSWERS.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the pings were not answered:\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(inject.load(Ordering::SeqCst), INJECT_NONE, "no flood sent");
    let out = client.wait(Duration::from_secs(30));
    out.assert_ok("qemu-io across a NOP-In flood");
    assert!(!out.stdout.contains("fail"), "{}", out.stdout);
    let answers = FLOOD_ANSWERS.load(Ordering::SeqCst);
    assert_eq!(FLOOD_ANSWER_DATA.load(Ordering::SeqCst), 0, "ping data echoed");
    assert!(answers < FLOOD_PINGS / 4, "{answers} NOP-Outs for {FLOOD_PINGS} pings");
    qemu_io(&dir, &uri, &["read -P 0x42 0 64k".to_string()]);
    assert_eq!(bdev(&h, "iSCSI0")["driver_specific"]["iscsi"]["reconnects"], 0, "the flood dropped a connection");
    h.assert_serving();
}

#[test]
fn a_target_that_breaks_each_connection_at_once_is_logged_in_to_with_a_back_off() {
    if !have("a_target_that_breaks_each_connection_at_once_is_logged_in_to_with_a_back_off", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-storm");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let inject = Arc::new(AtomicU8::new(INJECT_NONE));
    let (proxy, conns) = spawn_proxy(port, inject.clone());
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &url(proxy, &iqn, 0), Some(json!({"timeout_sec": 4})));
    qemu_io(&dir, &uri, &["write -P 0x42 0 4k".to_string()]);
    // Every connection now logs in, then breaks on the first answer: the read is sent again
    // on new connections until it fails, 4 s on.
    inject.store(INJECT_WRONG_ITT_ALWAYS, Ordering::SeqCst);
    let before = conns.load(Ordering::SeqCst);
    let started = Instant::now();
    let (ok, out) = try_qemu_io(&dir, &uri, "read 0 4k");
    let took = started.elapsed();
    let logins = conns.load(Ordering::SeqCst) - before;
    inject.store(INJECT_NONE, Ordering::SeqCst);
    assert!(!ok, "a read succeeded through a broken target: {out}");
    assert!(took < Duration::from_secs(15), "the failed read took {took:?}");
    // Back-off 0.1, 0.2, 0.4, 0.8, then 1 s: about 8 logins in 4-5 s (thousands without).
    assert!(logins <= 20, "{logins} logins in {took:?}");
    let log = h.proc.stderr();
    let lines = log.lines().filter(|l| l.contains("logged in again")).count();
    assert!(lines <= 12, "{lines} 'logged in again' lines");
    // A useful connection resets the back-off: the I/O goes on at once.
    qemu_io(&dir, &uri, &["read -P 0x42 0 4k".to_string()]);
    h.assert_serving();
    t.assert_serving();
}

#[test]
fn requests_fail_within_timeout_sec_against_a_silent_or_busy_target() {
    if !have("requests_fail_within_timeout_sec_against_a_silent_or_busy_target", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("iscsi-host-busy");
    let port = iscsi_common::free_port();
    let t = ferrite_target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 512})));
    });
    let iqn = node(&t, "disk0", "M0", json!({}));
    let inject = Arc::new(AtomicU8::new(INJECT_NONE));
    let (proxy, _) = spawn_proxy(port, inject.clone());
    let (h, uri) = host_with_nbd(&dir, "iSCSI0", &url(proxy, &iqn, 0), Some(json!({"timeout_sec": 3})));
    qemu_io(&dir, &uri, &["write -P 0x42 0 4k".to_string()]);
    // A silent target: the command is unanswered, its connection dropped, the command sent
    // again, unanswered again... until 3 s after its submission: then it fails.
    inject.store(INJECT_SILENT, Ordering::SeqCst);
    let started = Instant::now();
    let (ok, out) = try_qemu_io(&dir, &uri, "read 0 4k");
    let took = started.elapsed();
    assert!(!ok, "a read succeeded through a silent target: {out}");
    assert!(took < Duration::from_secs(10), "the read failed after {took:?}");
    // A target answering BUSY forever: sent again after 1-10 ms (not at once), until 3 s after
    // its submission.
    inject.store(INJECT_BUSY_ALWAYS, Ordering::SeqCst);
    let started = Instant::now();
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0x43 0 4k");
    let took = started.elapsed();
    let busy = BUSY_ANSWERS.load(Ordering::SeqCst);
    inject.store(INJECT_NONE, Ordering::SeqCst);
    assert!(!ok, "a write succeeded through a BUSY target: {out}");
    assert!(took < Duration::from_secs(10), "the write failed after {took:?}");
    assert!((10..=3000).contains(&busy), "{busy} BUSY answers in {took:?}");
    // The target answering again, the I/O goes on (the writes answered BUSY by the proxy were
    // the target's to do: it did them).
    qemu_io(&dir, &uri, &["read -P 0x43 0 4k".to_string()]);
    h.assert_serving();
    t.assert_serving();
}

/// A private tgtd (tgt's target daemon) with one file LUN.
struct Tgtd {
    proc: Tool,
    ctl: String,
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        // tgtd ignores SIGTERM: shut it down through its control socket; the guard kills it.
        let _ = std::process::Command::new("tgtadm")
            .args(["-C", &self.ctl, "--lld", "iscsi", "--op", "delete", "--mode", "system"])
            .output();
        std::thread::sleep(Duration::from_millis(200));
        self.proc.kill();
    }
}

fn tgtadm(ctl: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["-C", ctl, "--lld", "iscsi"];
    all.extend_from_slice(args);
    let out = std::process::Command::new("tgtadm").args(&all).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("tgtadm {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Starts tgtd on 127.0.0.1:`port` with target `iqn`, LUN 1 over `img`; Err says why not.
fn start_tgtd(dir: &TempDir, port: u16, iqn: &str, img: &Path) -> Result<Tgtd, String> {
    let ctl = (20000 + port % 10000).to_string();
    let portal = format!("portal=127.0.0.1:{port}");
    let proc = Tool::spawn(dir, "tgtd", &["-f", "-C", &ctl, "--iscsi", &portal]);
    let t = Tgtd { proc, ctl };
    let deadline = Instant::now() + Duration::from_secs(5);
    while tgtadm(&t.ctl, &["--op", "show", "--mode", "sys"]).is_err() {
        if Instant::now() > deadline {
            return Err("tgtd did not start".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tgtadm(&t.ctl, &["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn])?;
    tgtadm(&t.ctl, &["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", img.to_str().unwrap()])?;
    tgtadm(&t.ctl, &["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"])?;
    Ok(t)
}

/// tgt installed, or installed now (scripts/test.sh installs it; the test tries apt-get once).
fn have_tgt() -> Result<(), String> {
    let found = |b: &str| iscsi_common::tool(b).is_some();
    if found("tgtd") && found("tgtadm") {
        return Ok(());
    }
    let _ =
        std::process::Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends", "tgt"]).output();
    if found("tgtd") && found("tgtadm") {
        Ok(())
    } else {
        Err("tgt (tgtd, tgtadm) is not installed and apt-get could not install it".into())
    }
}

#[test]
fn against_tgt() {
    if let Err(why) = have_tgt() {
        println!("SKIP against_tgt: {why}");
        return;
    }
    let dir = TempDir::new("iscsi-host-tgt");
    let port = iscsi_common::free_port();
    let img: PathBuf = dir.file_filled("lun1.raw", 64 << 20, 0);
    let iqn = "iqn.2024-01.io.ferrite:tgt1";
    let tgt = match start_tgtd(&dir, port, iqn, &img) {
        Ok(t) => t,
        Err(why) => {
            println!("SKIP against_tgt: {why}");
            return;
        }
    };
    // LUN 0 is tgt's controller, not a disk.
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    let e = h.call_err("bdev_iscsi_create", Some(create_params("C", &url(port, iqn, 0))));
    assert!(e.code == -32602 && e.message.contains("not a block device"), "{e:?}");
    drop(h);
    for (qd, size) in [(1, 4096), (32, 4096), (16, 65536), (4, 1 << 20)] {
        perf_verify(&dir, &url(port, iqn, 1), qd, size, None);
    }
    // tgt's keys changed (each perf run logs in anew): immediate data, then unsolicited
    // Data-Out in 4 KiB PDUs (InitialR2T=No), then R2Ts; then no immediate data at all.
    let ctl = tgt.ctl.clone();
    let set = |k: &str, v: &str| {
        tgtadm(&ctl, &["--op", "update", "--mode", "target", "--tid", "1", "--name", k, "--value", v])
    };
    set("InitialR2T", "No").unwrap();
    set("MaxRecvDataSegmentLength", "4096").unwrap();
    perf_verify(&dir, &url(port, iqn, 1), 8, 131072, None);
    set("InitialR2T", "Yes").unwrap();
    set("ImmediateData", "No").unwrap();
    set("MaxRecvDataSegmentLength", "8192").unwrap();
    perf_verify(&dir, &url(port, iqn, 1), 8, 65536, None);
    if !have("against_tgt", &["qemu-io"]) {
        return;
    }
    // Thin provisioning: tgt reports LBPME and LBPU, and punches holes for UNMAP.
    tgtadm(
        &ctl,
        &["--op", "update", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "--params", "thin_provisioning=1"],
    )
    .unwrap();
    let (h, uri) = host_with_nbd(&dir, "Tgt1", &url(port, iqn, 1), None);
    let cmds = [
        "write -P 0x9c 3M 1M",
        "flush",
        "read -P 0x9c 3M 1M",
        "write -P 0x9d 8M 1M",
        "discard 8M 1M",
        "read -P 0 8M 1M",
    ];
    qemu_io(&dir, &uri, &cmds.map(String::from));
    let b = bdev(&h, "Tgt1");
    assert_eq!(b["driver_specific"]["iscsi"]["vendor"], "IET", "{b}");
    assert_eq!(b["supported_io_types"]["unmap"], true, "{b}");
    h.assert_serving();
    drop(h);
    // The data is in tgt's file.
    let data = std::fs::read(&img).unwrap();
    assert!(data[3 << 20..4 << 20].iter().all(|&b| b == 0x9c), "the write is not in tgt's backing file");
}
