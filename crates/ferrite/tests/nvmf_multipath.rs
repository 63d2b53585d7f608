//! The NVMe/TCP host's second path, against Ferrite's target in another process: failover
//! (an alternate path taken when the active one's listener is removed, with `ferrite perf -w
//! verify` running through it and data written before read back after, over NBD with qemu-io),
//! multipath (two controllers, one bdev, I/O following ANA state changes, as the target's
//! per-controller counters show), SPDK's refusals of a second attach, detach of one path,
//! save_config writing both paths, and an abort of a command the target holds (answered "not
//! aborted").

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::{free_port, have, Tool};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2016-06.io.ferrite:multipath-test";

fn listen_addr(port: u16) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
}

/// A target daemon serving two malloc namespaces of NQN on two ports: n1 for `ferrite perf`
/// (which writes all of it), n2 for the data the tests write and read back over NBD.
fn target(dir: &TempDir, sock: &str, ports: [u16; 2], ana: bool) -> Daemon {
    let d = Daemon::start_with(dir, sock, "0x1", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 512})));
    d.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 32768, "block_size": 512})));
    d.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    d.call(
        "nvmf_create_subsystem",
        Some(json!({"nqn": NQN, "allow_any_host": true, "serial_number": "MPATH01", "ana_reporting": ana})),
    );
    for b in ["M0", "M1"] {
        d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": b}})));
    }
    for p in ports {
        d.call("nvmf_subsystem_add_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(p)})));
    }
    d
}

fn attach(port: u16, extra: Value) -> Value {
    let mut p = json!({"name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            p[k] = v;
        }
    }
    p
}

fn qemu_io(dir: &TempDir, uri: &str, cmd: &str) {
    let (ok, all) = nbd_common::try_qemu_io(dir, uri, cmd);
    assert!(ok, "qemu-io {cmd}: {all}");
}

fn nbd_export(h: &Daemon) -> String {
    let nbd = h.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "Nvme0n2", "name": "n2"})));
    format!("nbd://{}/n2", nbd["address"].as_str().unwrap())
}

/// Starts `ferrite perf -w verify` on Nvme0n1 with `attaches` as its config, for `secs`.
fn perf_start(dir: &TempDir, tag: &str, attaches: &[Value], secs: u32) -> (Tool, std::path::PathBuf) {
    let cfg: Vec<Value> =
        attaches.iter().map(|p| json!({"method": "bdev_nvme_attach_controller", "params": p})).collect();
    let cfg = dir.write_json(&format!("{tag}.json"), &json!({"subsystems": [{"subsystem": "bdev", "config": cfg}]}));
    let res = dir.join(&format!("{tag}-results.json"));
    let secs = secs.to_string();
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-T",
        "Nvme0n1",
        "-q",
        "16",
        "-o",
        "4096",
        "-w",
        "verify",
        "-t",
        &secs,
        "-m",
        "0x1",
        "--no-pin",
        "--results-json",
        res.to_str().unwrap(),
    ];
    (Tool::spawn(dir, common::FERRITE, &args), res)
}

fn perf_check(tool: Tool, res: &std::path::Path, what: &str) {
    let out = tool.wait(Duration::from_secs(90));
    out.assert_ok(what);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(res).expect("results json")).expect("json");
    for r in doc["results"].as_array().expect("results") {
        assert_eq!(r["io_failed"], json!(0), "{what}: failed I/O: {r}\n{}", out.stderr);
        assert_eq!(r["verify_errors"], json!(0), "{what}: verify errors: {r}");
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{what}: no I/O: {r}");
    }
    println!("{what}: {} IOPS", doc["total"]["iops"]);
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn failover_survives_listener_removal() {
    if !have("failover_survives_listener_removal", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-failover");
    let (pa, pb) = (free_port(), free_port());
    let t = target(&dir, "tgt.sock", [pa, pb], false);
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    let fo = json!({"multipath": "failover", "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1});
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pa, fo.clone()))), json!(["Nvme0n1", "Nvme0n2"]));
    // SPDK answers no bdev for an alternate path.
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pb, fo.clone()))), json!([]));
    let c = h.call("bdev_nvme_get_controllers", Some(json!({"name": "Nvme0"})));
    assert_eq!(c[0]["ctrlrs"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c[0]["ctrlrs"][0]["trid"]["trsvcid"], json!(pa.to_string()), "{c}");
    assert_eq!(c[0]["ctrlrs"][0]["alternate_trids"][0]["trsvcid"], json!(pb.to_string()), "{c}");
    assert_eq!(h.bdev_names(), vec!["Nvme0n1".to_string(), "Nvme0n2".to_string()]);
    // save_config writes both paths, the second as failover.
    let cfg = h.call("save_config", None);
    let attaches = common::saved_entries(&cfg, "bdev_nvme_attach_controller");
    assert_eq!(attaches.len(), 2, "{cfg}");
    assert_eq!(attaches[1]["params"]["trsvcid"], json!(pb.to_string()));
    assert_eq!(attaches[1]["params"]["multipath"], json!("failover"));
    let uri = nbd_export(&h);
    qemu_io(&dir, &uri, "write -P 0x11 0 4M");

    // Path A goes away under load: perf (its own host, both paths from its config) and the
    // daemon's host both move to B without an error.
    let (perf, res) = perf_start(&dir, "perf-a", &[attach(pa, fo.clone()), attach(pb, fo.clone())], 6);
    std::thread::sleep(Duration::from_millis(2000));
    t.call("nvmf_subsystem_remove_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(pa)})));
    perf_check(perf, &res, "perf while path A is removed");
    qemu_io(&dir, &uri, "read -P 0x11 0 4M");
    qemu_io(&dir, &uri, "write -P 0x22 4M 4M");
    qemu_io(&dir, &uri, "read -P 0x22 4M 4M");
    let c = h.call("bdev_nvme_get_controllers", None);
    assert_eq!(c[0]["ctrlrs"][0]["trid"]["trsvcid"], json!(pb.to_string()), "now on B: {c}");
    assert_eq!(c[0]["ctrlrs"][0]["alternate_trids"][0]["trsvcid"], json!(pa.to_string()), "{c}");

    // A back, B gone: back to A.
    t.call("nvmf_subsystem_add_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(pa)})));
    let (perf, res) = perf_start(&dir, "perf-b", &[attach(pb, fo.clone()), attach(pa, fo.clone())], 6);
    std::thread::sleep(Duration::from_millis(2000));
    t.call("nvmf_subsystem_remove_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(pb)})));
    perf_check(perf, &res, "perf while path B is removed");
    qemu_io(&dir, &uri, "read -P 0x11 0 4M");
    qemu_io(&dir, &uri, "read -P 0x22 4M 4M");
    qemu_io(&dir, &uri, "write -P 0x33 8M 1M");
    qemu_io(&dir, &uri, "read -P 0x33 8M 1M");
    let c = h.call("bdev_nvme_get_controllers", None);
    assert_eq!(c[0]["ctrlrs"][0]["trid"]["trsvcid"], json!(pa.to_string()), "back on A: {c}");

    // Detaching the alternate path leaves the active one; an unknown path is ENXIO.
    let e = h
        .call_err("bdev_nvme_detach_controller", Some(json!({"name": "Nvme0", "traddr": "127.0.0.1", "trsvcid": "1"})));
    assert_eq!(e.code, -libc::ENXIO, "{e:?}");
    assert_eq!(
        h.call(
            "bdev_nvme_detach_controller",
            Some(json!({"name": "Nvme0", "traddr": "127.0.0.1", "trsvcid": pb.to_string()}))
        ),
        json!(true)
    );
    let c = h.call("bdev_nvme_get_controllers", None);
    assert!(c[0]["ctrlrs"][0].get("alternate_trids").is_none(), "{c}");
    qemu_io(&dir, &uri, "read -P 0x33 8M 1M");
    h.assert_serving();
    assert_eq!(h.call("bdev_nvme_detach_controller", Some(json!({"name": "Nvme0"}))), json!(true));
    assert!(h.bdev_names().is_empty());
}

/// The target's controllers: cntlid → (read ops, write ops).
fn target_ops(t: &Daemon) -> std::collections::HashMap<u64, (u64, u64)> {
    t.call("nvmf_subsystem_get_controllers", Some(json!({"nqn": NQN})))
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = &c["io_stats"];
            (c["cntlid"].as_u64().unwrap(), (s["read_ops"].as_u64().unwrap(), s["write_ops"].as_u64().unwrap()))
        })
        .collect()
}

fn set_ana(t: &Daemon, port: u16, state: &str) {
    t.call(
        "nvmf_subsystem_listener_set_ana_state",
        Some(json!({"nqn": NQN, "listen_address": listen_addr(port), "ana_state": state})),
    );
}

/// The ANA state of each path of Nvme0n2 as the host sees it, by cntlid.
fn host_ana(h: &Daemon) -> Vec<(u64, String)> {
    let b = h.call("bdev_get_bdevs", Some(json!({"name": "Nvme0n2"})));
    b[0]["driver_specific"]["nvme"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (p["ctrlr_data"]["cntlid"].as_u64().unwrap(), p["ns_data"]["ana_state"].as_str().unwrap_or("").to_string())
        })
        .collect()
}

#[test]
fn multipath_follows_ana_states() {
    if !have("multipath_follows_ana_states", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-multipath");
    let (pa, pb) = (free_port(), free_port());
    let t = target(&dir, "tgt.sock", [pa, pb], true);
    set_ana(&t, pa, "optimized");
    set_ana(&t, pb, "non_optimized");
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    let mp = json!({"multipath": "multipath", "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1});
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pa, mp.clone()))), json!(["Nvme0n1", "Nvme0n2"]));
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pb, mp.clone()))), json!(["Nvme0n1", "Nvme0n2"]));
    let c = h.call("bdev_nvme_get_controllers", None);
    let ctrlrs = c[0]["ctrlrs"].as_array().unwrap().clone();
    assert_eq!(ctrlrs.len(), 2, "{c}");
    let (ca, cb) = (ctrlrs[0]["cntlid"].as_u64().unwrap(), ctrlrs[1]["cntlid"].as_u64().unwrap());
    assert_ne!(ca, cb, "two controllers: {c}");
    assert_eq!(ctrlrs[1]["trid"]["trsvcid"], json!(pb.to_string()));
    assert_eq!(h.bdev_names(), vec!["Nvme0n1".to_string(), "Nvme0n2".to_string()]);
    assert_eq!(host_ana(&h), vec![(ca, "optimized".into()), (cb, "non_optimized".into())]);
    let uri = nbd_export(&h);

    // Active-passive: everything goes to A, the optimized path.
    let before = target_ops(&t);
    qemu_io(&dir, &uri, "write -P 0x44 0 2M");
    qemu_io(&dir, &uri, "read -P 0x44 0 2M");
    let after = target_ops(&t);
    assert!(after[&ca].1 > before[&ca].1 && after[&ca].0 > before[&ca].0, "A took no I/O: {before:?} {after:?}");
    assert_eq!(after[&cb], before[&cb], "B took I/O while non-optimized");

    // B optimized, A inaccessible: the host hears it (ANA change AEN) and I/O moves to B.
    set_ana(&t, pb, "optimized");
    set_ana(&t, pa, "inaccessible");
    wait_for("the host to see the ANA change", Duration::from_secs(10), || {
        host_ana(&h) == vec![(ca, "inaccessible".into()), (cb, "optimized".into())]
    });
    let before = target_ops(&t);
    qemu_io(&dir, &uri, "write -P 0x55 2M 2M");
    qemu_io(&dir, &uri, "read -P 0x55 2M 2M");
    qemu_io(&dir, &uri, "read -P 0x44 0 2M");
    let after = target_ops(&t);
    assert!(after[&cb].1 > before[&cb].1, "B took no I/O: {before:?} {after:?}");
    assert_eq!(after[&ca], before[&ca], "A took I/O while inaccessible");

    // ANA flips under a verify load (perf's own host with both controllers): no error.
    let (perf, res) = perf_start(&dir, "perf-ana", &[attach(pa, mp.clone()), attach(pb, mp.clone())], 6);
    for (i, (a, b)) in [("optimized", "inaccessible"), ("inaccessible", "optimized"), ("optimized", "non_optimized")]
        .into_iter()
        .enumerate()
    {
        std::thread::sleep(Duration::from_millis(1500));
        // Make the new path usable before the old one goes.
        if i % 2 == 0 {
            set_ana(&t, pa, a);
            set_ana(&t, pb, b);
        } else {
            set_ana(&t, pb, b);
            set_ana(&t, pa, a);
        }
    }
    perf_check(perf, &res, "perf while ANA states change");

    // Active-active: both optimized, round robin uses both.
    set_ana(&t, pb, "optimized");
    wait_for("both optimized", Duration::from_secs(10), || {
        host_ana(&h) == vec![(ca, "optimized".into()), (cb, "optimized".into())]
    });
    h.call("bdev_nvme_set_multipath_policy", Some(json!({"name": "Nvme0n2", "policy": "active_active"})));
    let before = target_ops(&t);
    qemu_io(&dir, &uri, "write -P 0x66 4M 2M");
    qemu_io(&dir, &uri, "read -P 0x66 4M 2M");
    let after = target_ops(&t);
    assert!(
        after[&ca].1 > before[&ca].1 && after[&cb].1 > before[&cb].1,
        "round robin did not use both: {before:?} {after:?}"
    );
    h.call("bdev_nvme_set_multipath_policy", Some(json!({"name": "Nvme0n2", "policy": "active_passive"})));

    // Path B lost: I/O goes on through A.
    t.call("nvmf_subsystem_remove_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(pb)})));
    qemu_io(&dir, &uri, "read -P 0x66 4M 2M");
    qemu_io(&dir, &uri, "write -P 0x77 6M 1M");
    qemu_io(&dir, &uri, "read -P 0x77 6M 1M");

    // Detaching B's controller leaves the bdev on A.
    assert_eq!(
        h.call(
            "bdev_nvme_detach_controller",
            Some(json!({"name": "Nvme0", "traddr": "127.0.0.1", "trsvcid": pb.to_string()}))
        ),
        json!(true)
    );
    let c = h.call("bdev_nvme_get_controllers", None);
    assert_eq!(c[0]["ctrlrs"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(h.bdev_names(), vec!["Nvme0n1".to_string(), "Nvme0n2".to_string()]);
    qemu_io(&dir, &uri, "read -P 0x44 0 2M");
    h.assert_serving();
}

#[test]
fn second_attach_refusals() {
    let dir = TempDir::new("nvmf-mp-refuse");
    let (pa, pb) = (free_port(), free_port());
    let t = target(&dir, "tgt.sock", [pa, pb], false);
    // Another target process with the same NQN but another namespace (another NGUID).
    let (pc, pd) = (free_port(), free_port());
    let _other = target(&dir, "tgt2.sock", [pc, pd], false);
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    // The default mode is SPDK's: multipath.
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pa, json!({})))), json!(["Nvme0n1", "Nvme0n2"]));
    let err = |p: Value| h.call_err("bdev_nvme_attach_controller", Some(p));
    let e = err(attach(pa, json!({})));
    assert_eq!(
        (e.code, e.message.as_str()),
        (-114, "A controller named Nvme0 already exists with the specified network path")
    );
    let e = err(attach(pb, json!({"multipath": "disable"})));
    assert_eq!(
        (e.code, e.message.as_str()),
        (-114, "A controller named Nvme0 already exists and multipath is disabled")
    );
    let e = err(attach(pb, json!({"subnqn": "nqn.2016-06.io.ferrite:other"})));
    assert_eq!(e.code, -22, "{e:?}");
    assert_eq!(e.message, format!("A controller named Nvme0 already exists, but uses a different subnqn ({NQN})"));
    // Failover onto a multipath name: the modes must match.
    let e = err(attach(pb, json!({"multipath": "failover"})));
    assert_eq!(e.code, -22, "{e:?}");
    // Bad parameters.
    let e = err(attach(pb, json!({"multipath": "sometimes"})));
    assert_eq!(e.code, -32602, "{e:?}");
    let e = err(attach(pb, json!({"trsvcid": {"port": 1}})));
    assert_eq!(e.code, -32602, "{e:?}");
    let e = h.call_err("bdev_nvme_detach_controller", Some(json!({"name": "Nvme9"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");

    // A failover path that reaches other namespaces (same NQN, another target: other NGUIDs)
    // is refused.
    let fo = json!({"name": "Nvme1", "multipath": "failover"});
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pc, fo.clone()))), json!(["Nvme1n1", "Nvme1n2"]));
    let e = err(attach(pb, fo.clone()));
    assert_eq!((e.code, e.message.as_str()), (-22, "Invalid argument"), "{e:?}");
    // And as a second multipath controller of Nvme0: its namespaces are not the same, so (as in
    // SPDK) it attaches without them, adding no path to Nvme0's bdevs; then it is detached.
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(pd, json!({})))), json!([]));
    let c = h.call("bdev_nvme_get_controllers", Some(json!({"name": "Nvme0"})));
    assert_eq!(c[0]["ctrlrs"].as_array().unwrap().len(), 2, "{c}");
    let b = h.call("bdev_get_bdevs", Some(json!({"name": "Nvme0n1"})));
    assert_eq!(b[0]["driver_specific"]["nvme"].as_array().unwrap().len(), 1, "a path to another namespace: {b}");
    let detach = json!({"name": "Nvme0", "traddr": "127.0.0.1", "trsvcid": pd.to_string()});
    assert_eq!(h.call("bdev_nvme_detach_controller", Some(detach)), json!(true));
    // A path already attached under another name.
    let e = err(attach(pc, json!({"name": "Nvme2"})));
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    let c = h.call("bdev_nvme_get_controllers", None);
    assert_eq!(c.as_array().unwrap().len(), 2, "{c}");
    for g in c.as_array().unwrap() {
        assert_eq!(g["ctrlrs"].as_array().unwrap().len(), 1, "{c}");
        assert!(g["ctrlrs"][0].get("alternate_trids").is_none(), "{c}");
    }
    let mut names = h.bdev_names();
    names.sort();
    assert_eq!(names, ["Nvme0n1", "Nvme0n2", "Nvme1n1", "Nvme1n2"]);
    // Still serving: I/O through both names.
    if have("second_attach_refusals", &["qemu-io"]) {
        let uri = nbd_export(&h);
        qemu_io(&dir, &uri, "write -P 0x5a 0 1M");
        qemu_io(&dir, &uri, "read -P 0x5a 0 1M");
    }
    h.assert_serving();
    t.assert_serving();
}

#[test]
fn abort_reaches_the_target_and_the_held_read_is_aborted() {
    if !have("abort_reaches_the_target_and_the_held_read_is_aborted", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-abort");
    let (port, front) = (free_port(), free_port());
    // Reads take 2 s on the target (a delay bdev), so one is with the controller when it is
    // aborted.
    let t = Daemon::start_with(&dir, "tgt.sock", "0x1", &["--no-pin"]);
    t.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 8192, "block_size": 512})));
    t.call(
        "bdev_delay_create",
        Some(
            json!({"base_bdev_name": "M0", "name": "D0", "avg_read_latency": 2_000_000, "p99_read_latency": 2_000_000,
            "avg_write_latency": 10, "p99_write_latency": 10}),
        ),
    );
    t.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    t.call("nvmf_create_subsystem", Some(json!({"nqn": NQN, "allow_any_host": true})));
    t.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "D0"}})));
    t.call("nvmf_subsystem_add_listener", Some(json!({"nqn": NQN, "listen_address": listen_addr(port)})));
    // The host daemon serves its Nvme0n1 again over NVMe/TCP: when a host of it goes away,
    // its target aborts the requests in flight, which reach the NVMe module as abort requests.
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    assert_eq!(h.call("bdev_nvme_attach_controller", Some(attach(port, json!({})))), json!(["Nvme0n1"]));
    let nbd = h.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "Nvme0n1", "name": "n1"})));
    let uri = format!("nbd://{}/n1", nbd["address"].as_str().unwrap());
    qemu_io(&dir, &uri, "write -P 0x12 0 4k");
    let front_nqn = "nqn.2016-06.io.ferrite:front";
    h.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    h.call("nvmf_create_subsystem", Some(json!({"nqn": front_nqn, "allow_any_host": true})));
    h.call("nvmf_subsystem_add_ns", Some(json!({"nqn": front_nqn, "namespace": {"bdev_name": "Nvme0n1"}})));
    h.call("nvmf_subsystem_add_listener", Some(json!({"nqn": front_nqn, "listen_address": listen_addr(front)})));
    let p = json!({"name": "Front", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": front.to_string(), "subnqn": front_nqn});
    let cfg = json!({"method": "bdev_nvme_attach_controller", "params": p});
    let cfg = dir.write_json("front.json", &json!({"subsystems": [{"subsystem": "bdev", "config": [cfg]}]}));
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-T",
        "Frontn1",
        "-q",
        "4",
        "-o",
        "4096",
        "-w",
        "randread",
        "-t",
        "30",
        "-m",
        "0x1",
        "--no-pin",
    ];
    let mut perf = Tool::spawn(&dir, common::FERRITE, &args);
    std::thread::sleep(Duration::from_millis(1500));
    perf.kill();
    // The host sent NVMe Abort for the reads its front target's requests left with the
    // controller; the target finds each on its queue pair and has its delay bdev end it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let aborted = |log: &str| log.lines().any(|l| l.contains(" of queue ") && l.ends_with(" aborted"));
    while !aborted(&h.proc.stderr()) {
        assert!(Instant::now() < deadline, "no abort reported in the host's log:\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        t.proc.stderr().lines().any(|l| l.contains("Abort of command") && l.ends_with(": aborted")),
        "the target did not abort the read:\n{}",
        t.proc.stderr()
    );
    // The data written before reads back (the aborted reads changed nothing).
    qemu_io(&dir, &uri, "read -P 0x12 0 4k");
    h.assert_serving();
    t.assert_serving();
}
