//! The NBD server's control plane and lifecycle: RPC errors, the export and connection tables,
//! save_config and restart, removing an export or deleting its bdev under connected clients, a
//! client killed mid-I/O next to a verifying one, and SIGTERM with clients connected.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use ferrite_nbd::proto::*;
use nbd_common::{have, pattern, run_tool, FioRun, NbdDaemon, Raw, Tool};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn export_named<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|e| e["name"] == name)
}

#[test]
fn rpc_errors_and_server_start_stop() {
    let dir = TempDir::new("nbdrpc");
    let n = NbdDaemon::start(&dir, "0x1");
    let d = &n.d;
    n.malloc("E0", 256, 512);

    // Exports: a missing bdev, a duplicate name, an empty name, an unknown parameter.
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "nosuch"})));
    assert_eq!(e.code, -19, "{e:?}");
    assert!(e.message.contains("nosuch"), "{e:?}");
    n.export("E0", "e0", false, "first");
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "E0", "name": "e0"})));
    assert_eq!(e.code, -17, "{e:?}");
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "E0", "name": ""})));
    assert_eq!(e.code, -22, "{e:?}");
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "E0", "name": "x", "bogus": 1})));
    assert_eq!(e.code, -32602, "{e:?}");
    // Without a name the export is named after the bdev (a second export of the same bdev).
    assert_eq!(d.call("nbd_server_add_export", Some(json!({"bdev_name": "E0"}))), json!("E0"));
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "E0"})));
    assert_eq!(e.code, -17, "{e:?}");

    let list = n.exports();
    assert_eq!(list.len(), 2, "{list:?}");
    let e0 = export_named(&list, "e0").expect("e0 listed");
    assert_eq!(
        e0,
        &json!({"name": "e0", "bdev_name": "E0", "read_only": false, "description": "first", "connections": 0})
    );
    assert_eq!(export_named(&list, "E0").unwrap()["description"], "");

    // Removing: unknown names fail, known ones go away.
    let e = d.call_err("nbd_server_remove_export", Some(json!({"name": "nosuch"})));
    assert_eq!(e.code, -2, "{e:?}");
    assert_eq!(d.call("nbd_server_remove_export", Some(json!({"name": "E0"}))), json!(true));
    let e = d.call_err("nbd_server_remove_export", Some(json!({"name": "E0"})));
    assert_eq!(e.code, -2, "{e:?}");
    assert_eq!(n.exports().len(), 1);

    // Servers: the same address twice, an address another socket holds, bad addresses.
    let e = d.call_err("nbd_server_start", Some(json!({"address": n.tcp})));
    assert_eq!(e.code, -22, "{e:?}");
    let e = d.call_err("nbd_server_start", Some(json!({"address": n.unix.to_str().unwrap()})));
    assert_eq!(e.code, -22, "{e:?}");
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_addr = held.local_addr().unwrap().to_string();
    let e = d.call_err("nbd_server_start", Some(json!({"address": held_addr})));
    assert_eq!(e.code, -22, "{e:?}");
    assert!(e.message.contains("in use") || e.message.contains("cannot listen"), "{e:?}");
    drop(held);
    for bad in ["nonsense", "relative/path.sock", "127.0.0.1:99999", ""] {
        let e = d.call_err("nbd_server_start", Some(json!({"address": bad})));
        assert_eq!(e.code, -22, "{bad:?}: {e:?}");
    }
    let e = d.call_err("nbd_server_start", Some(json!({})));
    assert_eq!(e.code, -32602, "{e:?}");

    // Stopping: unknown addresses fail.
    let e = d.call_err("nbd_server_stop", Some(json!({"address": "127.0.0.1:1"})));
    assert_eq!(e.code, -2, "{e:?}");

    // Stopping a listener keeps its connections; new ones are refused; it can start again.
    let (mut c, info) = Raw::open(n.port, "e0", false);
    assert_eq!(info.size, 256 * 512);
    let data = pattern(1, 4096);
    c.write_ok(1, 0, &data, 0);
    assert_eq!(d.call("nbd_server_stop", Some(json!({"address": n.tcp}))), json!(true));
    let e = d.call_err("nbd_server_stop", Some(json!({"address": n.tcp})));
    assert_eq!(e.code, -2, "{e:?}");
    assert_eq!(c.read_ok(2, 0, 4096), data, "a connection outlives its listener");
    assert!(std::net::TcpStream::connect(("127.0.0.1", n.port)).is_err(), "a stopped listener still accepts");
    assert_eq!(d.call("nbd_server_start", Some(json!({"address": n.tcp}))), json!({"address": n.tcp}));
    let (mut c2, _) = Raw::open(n.port, "e0", false);
    assert_eq!(c2.read_ok(3, 0, 4096), data);
    c2.disc();
    c.disc();

    // A stopped unix server removes its socket file.
    assert!(n.unix.exists());
    assert_eq!(d.call("nbd_server_stop", Some(json!({"address": n.unix.to_str().unwrap()}))), json!(true));
    assert!(!n.unix.exists(), "socket file left behind");
    n.assert_serves("e0");
}

#[test]
fn exports_and_connections_list_connected_clients() {
    let dir = TempDir::new("nbdconns");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("C0", 1024, 4096);
    n.export("C0", "c0", false, "");
    assert!(n.connections().is_empty());

    let (a, _) = Raw::open(n.port, "c0", false);
    let b = Raw::connect(n.port); // stays in the handshake
    let conns = n.wait_connections("two clients", |c| c.len() == 2 && c.iter().any(|x| x["export"] == "c0"));
    let peer_a = a.s.local_addr().unwrap().to_string();
    let peer_b = b.s.local_addr().unwrap().to_string();
    let ca = conns.iter().find(|c| c["peer"] == peer_a.as_str()).unwrap_or_else(|| panic!("{peer_a}: {conns:?}"));
    let cb = conns.iter().find(|c| c["peer"] == peer_b.as_str()).unwrap_or_else(|| panic!("{peer_b}: {conns:?}"));
    assert_eq!(ca["export"], "c0", "{ca}");
    assert_eq!(cb["export"], Value::Null, "a client still negotiating has no export: {cb}");
    for c in [ca, cb] {
        assert_eq!(c["listen"], n.tcp.as_str(), "{c}");
        assert!(c["id"].as_u64().is_some(), "{c}");
    }
    assert_ne!(ca["id"], cb["id"]);
    // Consecutive connections go to different reactors.
    let mut reactors = vec![ca["reactor"].as_u64().unwrap(), cb["reactor"].as_u64().unwrap()];
    reactors.sort();
    assert_eq!(reactors, [0, 1], "{conns:?}");

    let list = n.exports();
    assert_eq!(export_named(&list, "c0").unwrap()["connections"], 1, "{list:?}");

    // Disconnects leave the tables.
    drop(a);
    n.wait_connections("a left", |c| c.len() == 1 && c[0]["peer"] == peer_b.as_str());
    assert_eq!(export_named(&n.exports(), "c0").unwrap()["connections"], 0);
    drop(b);
    n.wait_connections("b left", |c| c.is_empty());
}

#[test]
fn save_config_then_restart_serves_the_exports_again() {
    let dir = TempDir::new("nbdsave");
    let img = dir.file_filled("p.img", 4 << 20, 0);
    let mut n = NbdDaemon::start(&dir, "0x1");
    n.d.call("bdev_uring_create", Some(json!({"name": "P0", "filename": img.to_str().unwrap(), "block_size": 512})));
    n.malloc("S0", 2048, 4096);
    n.export("P0", "persist", false, "kept across restarts");
    n.export("S0", "scratch", true, "read-only scratch");
    let data = pattern(42, 64 << 10);
    let (mut c, _) = Raw::open(n.port, "persist", false);
    c.write_ok(1, 1 << 20, &data, FLAG_FUA);
    c.disc();
    drop(c);

    let saved = n.d.call("save_config", None);
    let subs = saved["subsystems"].as_array().expect("subsystems");
    let pos =
        |name: &str| subs.iter().position(|s| s["subsystem"] == name).unwrap_or_else(|| panic!("{name}: {saved}"));
    assert!(pos("bdev") < pos("nbd"), "nbd must load after bdev: {saved}");
    let cfg = subs[pos("nbd")]["config"].as_array().expect("nbd config").clone();
    assert_eq!(n.d.call("framework_get_config", Some(json!({"name": "nbd"}))), Value::Array(cfg.clone()));
    let starts: Vec<&Value> = cfg.iter().filter(|e| e["method"] == "nbd_server_start").collect();
    let adds: Vec<&Value> = cfg.iter().filter(|e| e["method"] == "nbd_server_add_export").collect();
    assert_eq!(starts.len(), 2, "{cfg:?}");
    assert!(starts.iter().any(|e| e["params"]["address"] == n.tcp.as_str()), "{cfg:?}");
    assert!(starts.iter().any(|e| e["params"]["address"] == n.unix.to_str().unwrap()), "{cfg:?}");
    assert_eq!(adds.len(), 2, "{cfg:?}");
    assert!(adds
        .contains(&&json!({"method": "nbd_server_add_export", "params": {"bdev_name": "P0", "name": "persist",
        "read_only": false, "description": "kept across restarts"}})));
    assert!(adds
        .contains(&&json!({"method": "nbd_server_add_export", "params": {"bdev_name": "S0", "name": "scratch",
        "read_only": true, "description": "read-only scratch"}})));
    let exports_before = n.exports();

    let cfg_path = dir.write_json("saved.json", &saved);
    n.d.proc.sigterm();
    let st = n.d.proc.expect_exit(Duration::from_secs(5), "daemon after SIGTERM");
    assert_eq!(st.code(), Some(0), "{st:?}");

    let d2 = Daemon::start_with(&dir, "rpc2.sock", "0x1", &["--no-pin", "-c", cfg_path.to_str().unwrap()]);
    let n2 = NbdDaemon { d: d2, port: n.port, tcp: n.tcp.clone(), unix: n.unix.clone() };
    assert_eq!(n2.exports(), exports_before);
    let (mut c, info) = Raw::open(n2.port, "persist", false);
    assert_eq!(info.size, 4 << 20);
    assert_eq!(c.read_ok(2, 1 << 20, data.len() as u32), data, "the uring file kept the data");
    c.disc();
    if have("save_config_then_restart_serves_the_exports_again (nbdinfo part)", &["nbdinfo"]) {
        let out = run_tool(&dir, "nbdinfo", &["--list", "--json", &n2.unix_uri("")], Duration::from_secs(20));
        out.assert_ok("nbdinfo --list after restart");
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        let ex = v["exports"].as_array().unwrap();
        let p = ex.iter().find(|e| e["export-name"] == "persist").unwrap_or_else(|| panic!("{v}"));
        assert_eq!(p["description"], "kept across restarts");
        assert_eq!(p["export-size"], 4 << 20);
        let s = ex.iter().find(|e| e["export-name"] == "scratch").unwrap_or_else(|| panic!("{v}"));
        assert_eq!(s["is_read_only"], true);
    }
    n2.assert_serves("scratch");
}

#[test]
fn removing_an_export_closes_only_its_connections() {
    let dir = TempDir::new("nbdrm");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("R0", 1024, 4096);
    n.malloc("R1", 1024, 4096);
    n.export("R0", "gone", false, "");
    n.export("R1", "kept", false, "");
    let d0 = pattern(10, 8192);
    let d1 = pattern(11, 8192);
    // Two clients of "gone" (one per reactor) and one of "kept".
    let (mut a1, _) = Raw::open(n.port, "gone", false);
    let (mut a2, _) = Raw::open(n.port, "gone", false);
    let (mut b, _) = Raw::open(n.port, "kept", false);
    a1.write_ok(1, 0, &d0, 0);
    assert_eq!(a2.read_ok(2, 0, 8192), d0);
    b.write_ok(3, 0, &d1, 0);
    n.wait_connections("three clients", |c| c.iter().filter(|x| !x["export"].is_null()).count() == 3);

    let t = Instant::now();
    assert_eq!(n.d.call("nbd_server_remove_export", Some(json!({"name": "gone"}))), json!(true));
    assert!(t.elapsed() < Duration::from_secs(3), "remove_export took {:?}", t.elapsed());
    assert!(a1.expect_closed(Duration::from_secs(5)).is_empty());
    assert!(a2.expect_closed(Duration::from_secs(5)).is_empty());
    // The other export's client is untouched.
    assert_eq!(b.read_ok(4, 0, 8192), d1);
    b.write_ok(5, 8192, &d0, 0);
    assert_eq!(b.read_ok(6, 8192, 8192), d0);
    let conns = n.wait_connections("only b left", |c| c.len() == 1);
    assert_eq!(conns[0]["export"], "kept");
    let list = n.exports();
    assert!(export_named(&list, "gone").is_none(), "{list:?}");

    // A new client asking for the removed export is refused.
    let mut r = Raw::negotiating(n.port);
    let err = r.go("gone", &[]).expect_err("GO for a removed export");
    assert_eq!(err.reply, REP_ERR_UNKNOWN, "{err:?}");
    // Exporting the bdev again serves what was written before.
    n.export("R0", "gone", false, "");
    let info = r.go("gone", &[]).expect("GO after re-adding");
    assert_eq!(info.size, 1024 * 4096);
    assert_eq!(r.read_ok(7, 0, 8192), d0);
    r.disc();
    b.disc();
    n.assert_serves("kept");
}

#[test]
fn deleting_a_bdev_under_connected_clients_does_not_hang() {
    let dir = TempDir::new("nbddel");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("D0", 16384, 4096);
    n.malloc("O0", 1024, 4096);
    n.export("D0", "d0", false, "");
    n.export("O0", "other", false, "");
    let (mut a, _) = Raw::open(n.port, "d0", false);
    let (mut a2, _) = Raw::open(n.port, "d0", false);
    let (mut o, _) = Raw::open(n.port, "other", false);
    let mut neg = Raw::negotiating(n.port); // negotiating, no export yet
    let od = pattern(3, 4096);
    o.write_ok(1, 0, &od, 0);
    a.write_ok(2, 0, &od, 0);

    // fio keeps 32 requests in flight on the bdev while it is deleted.
    let with_fio = have("deleting_a_bdev_under_connected_clients_does_not_hang (fio part)", &["fio"]);
    let mut fio = None;
    if with_fio {
        let uri = format!("--uri={}", n.uri("d0"));
        let args = [
            "--thread",
            "--name=busy",
            "--ioengine=nbd",
            &uri,
            "--rw=randrw",
            "--bs=4k",
            "--size=32m",
            "--iodepth=32",
            "--time_based",
            "--runtime=30",
        ];
        fio = Some(Tool::spawn(&dir, "fio", &args));
        n.wait_connections("fio connected", |c| c.iter().filter(|x| x["export"] == "d0").count() == 3);
        std::thread::sleep(Duration::from_millis(300));
    }

    let t = Instant::now();
    assert_eq!(n.d.call("bdev_malloc_delete", Some(json!({"name": "D0"}))), json!(true));
    assert!(t.elapsed() < Duration::from_secs(3), "bdev_malloc_delete took {:?}", t.elapsed());
    assert!(a.expect_closed(Duration::from_secs(5)).is_empty());
    assert!(a2.expect_closed(Duration::from_secs(5)).is_empty());
    if let Some(f) = fio {
        let out = f.wait(Duration::from_secs(10));
        assert!(!out.status.success(), "fio went on without its bdev:\n{}", out.stdout);
    }
    assert!(!n.d.bdev_names().contains(&"D0".to_string()));
    n.wait_connections("d0's clients gone", |c| c.iter().all(|x| x["export"] != "d0"));

    // The negotiating client is refused that export, and can still pick another.
    let err = neg.go("d0", &[]).expect_err("GO for an export whose bdev is gone");
    assert_eq!(err.reply, REP_ERR_UNKNOWN, "{err:?}");
    neg.go("other", &[]).expect("GO other");
    assert_eq!(neg.read_ok(3, 0, 4096), od);
    neg.disc();
    // The other export's client never noticed.
    assert_eq!(o.read_ok(4, 0, 4096), od);
    o.disc();
    n.assert_serves("other");
}

#[test]
fn client_killed_mid_io_does_not_disturb_a_verifying_one() {
    if !have("client_killed_mid_io_does_not_disturb_a_verifying_one", &["fio"]) {
        return;
    }
    let dir = TempDir::new("nbdkill");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("K0", 16384, 4096);
    n.export("K0", "k0", false, "");
    let uri = format!("--uri={}", n.uri("k0"));
    let mut victim = Tool::spawn(
        &dir,
        "fio",
        &[
            "--thread",
            "--name=victim",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=16m",
            "--iodepth=32",
            "--time_based",
            "--runtime=30",
        ],
    );
    let survivor = FioRun::spawn(
        &dir,
        "survivor",
        &[
            "--name=survivor",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--offset=32m",
            "--size=16m",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_backlog=256",
            "--verify_fatal=1",
            "--time_based",
            "--runtime=3",
        ],
    );
    // (Each fio first opens and closes a probe connection; then its job's connection stays.)
    n.wait_connections("both fio connected", |c| c.iter().filter(|x| x["export"] == "k0").count() == 2);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(n.connections().len(), 2, "both fio jobs connected");
    assert!(victim.running(), "the victim fio ended early");
    victim.kill(); // SIGKILL with 32 requests in flight
    let mut survivor = survivor;
    assert!(survivor.tool.running(), "the survivor should still be running when the victim dies");
    n.wait_connections("victim's connection closed", |c| c.len() == 1);
    let v = survivor.finish(Duration::from_secs(30));
    let j = &v["jobs"][0];
    assert!(j["read"]["io_bytes"].as_u64().unwrap() > 0, "nothing verified: {j}");
    n.wait_connections("all closed", |c| c.is_empty());
    // The victim's region still works.
    let (mut c, _) = Raw::open(n.port, "k0", false);
    let data = pattern(5, 65536);
    c.write_ok(1, 4096, &data, 0);
    assert_eq!(c.read_ok(2, 4096, 65536), data);
    c.disc();
}

#[test]
fn sigterm_with_connected_clients_exits_promptly() {
    let dir = TempDir::new("nbdterm");
    let mut n = NbdDaemon::start(&dir, "0x3");
    n.malloc("T0", 16384, 4096);
    n.export("T0", "t0", false, "");
    let (mut a, _) = Raw::open(n.port, "t0", false);
    let (mut b, _) = Raw::open(n.port, "t0", false);
    let mut c = Raw::connect(n.port); // mid-handshake
    let mut expected = 3;
    let mut fio = None;
    if have("sigterm_with_connected_clients_exits_promptly (fio part)", &["fio"]) {
        let uri = format!("--uri={}", n.uri("t0"));
        let args = [
            "--thread",
            "--name=busy",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=32m",
            "--iodepth=32",
            "--time_based",
            "--runtime=30",
        ];
        fio = Some(Tool::spawn(&dir, "fio", &args));
        expected += 1;
    }
    n.wait_connections("clients connected", |cs| cs.len() == expected);
    if fio.is_some() {
        std::thread::sleep(Duration::from_millis(300));
    }
    n.d.proc.sigterm();
    let t = Instant::now();
    let st = n.d.proc.expect_exit(Duration::from_secs(5), "daemon after SIGTERM with NBD clients");
    assert_eq!(st.code(), Some(0), "{st:?} after {:?}; stderr:\n{}", t.elapsed(), n.d.proc.stderr());
    for r in [&mut a, &mut b, &mut c] {
        r.expect_closed(Duration::from_secs(2));
    }
    if let Some(f) = fio {
        let _ = f.wait(Duration::from_secs(10));
    }
}
