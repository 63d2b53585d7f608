//! Ferrite's NVMe/TCP host (bdev_nvme_attach_controller) against Ferrite's NVMe/TCP target, in
//! two processes: `ferrite perf -w verify` through the host at queue depths 1 to 128 and I/O
//! sizes 4 KiB to 1 MiB on two cores (two I/O queue pairs), with and without digests, and with
//! SQ flow control disabled (reads answered by their C2HData alone); the host
//! reconnecting after the target is killed and restarted (data written before is read back
//! after, through NBD with qemu-io); and I/O failing cleanly once ctrlr_loss_timeout_sec has
//! passed with the target gone.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::{free_port, have, run_tool, try_qemu_io};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2016-06.io.ferrite:host-test";

/// A target daemon serving `bdevs` (already created by `setup`) as namespaces of NQN on
/// 127.0.0.1:`port`.
fn target(dir: &TempDir, sock: &str, port: u16, setup: impl Fn(&Daemon)) -> Daemon {
    target_with(dir, sock, port, json!({}), setup)
}

/// As [`target`], with more `nvmf_create_transport` parameters.
fn target_with(dir: &TempDir, sock: &str, port: u16, transport: Value, setup: impl Fn(&Daemon)) -> Daemon {
    let d = Daemon::start_with(dir, sock, "0x1", &["--no-pin"]);
    setup(&d);
    let mut t = json!({"trtype": "TCP", "max_io_size": 1048576});
    for (k, v) in transport.as_object().expect("transport parameters") {
        t[k] = v.clone();
    }
    d.call("nvmf_create_transport", Some(t));
    d.call("nvmf_create_subsystem", Some(json!({"nqn": NQN, "allow_any_host": true, "serial_number": "HOSTTEST01"})));
    for b in d.bdev_names() {
        d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": b}})));
    }
    d.call(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string()}})),
    );
    d
}

fn attach_params(port: u16, extra: Value) -> Value {
    let mut p = json!({"name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            p[k] = v;
        }
    }
    p
}

/// Runs `ferrite perf -w verify` through the host, attached with the `extra` parameters, and
/// checks it found no error.
fn perf_verify(dir: &TempDir, port: u16, bdev: &str, qd: u32, size: u32, extra: Value) {
    let cfg = dir.write_json(
        "host.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
            "params": attach_params(port, extra.clone())}]}]}),
    );
    let res = dir.join("perf.json");
    let args = common::perf_verify_args(&cfg, bdev, qd, size, "0x3", &res);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_tool(dir, common::FERRITE, &args, Duration::from_secs(60));
    out.assert_ok("ferrite perf over bdev_nvme");
    let what = format!("{bdev} QD {qd} {size} B {extra}");
    let iops = common::check_verify_results(&res, &what, &out.stderr);
    println!("{what}: {iops} IOPS");
}

#[test]
fn host_verifies_through_ferrite_target() {
    let dir = TempDir::new("nvmf-host-verify");
    let port = free_port();
    let t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 131072, "block_size": 512})));
        d.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 16384, "block_size": 4096})));
    });
    for (bdev, qd, size) in [
        ("Nvme0n1", 1, 4096),
        ("Nvme0n1", 32, 4096),
        ("Nvme0n1", 128, 4096),
        ("Nvme0n1", 16, 131072),
        ("Nvme0n2", 8, 1048576),
        ("Nvme0n2", 32, 16384),
    ] {
        perf_verify(&dir, port, bdev, qd, size, json!({}));
    }
    let digests = json!({"hdgst": true, "ddgst": true});
    perf_verify(&dir, port, "Nvme0n2", 32, 65536, digests.clone());
    perf_verify(&dir, port, "Nvme0n1", 16, 4096, digests);
    // SQ flow control off: the target answers each successful read with its C2HData alone.
    for (bdev, qd, size) in [("Nvme0n1", 1, 4096), ("Nvme0n2", 32, 131072)] {
        perf_verify(&dir, port, bdev, qd, size, json!({"disable_sq_flow_control": true}));
    }
    perf_verify(&dir, port, "Nvme0n1", 8, 8192, json!({"disable_sq_flow_control": true, "ddgst": true}));
    // save_config keeps the parameter when set, and leaves it out otherwise (SPDK v26.05 would
    // refuse it).
    let h = Daemon::start_with(&dir, "host.sock", "0x1", &["--no-pin"]);
    for set in [true, false] {
        let p = attach_params(port, if set { json!({"disable_sq_flow_control": true}) } else { json!({}) });
        assert_eq!(h.call("bdev_nvme_attach_controller", Some(p)), json!(["Nvme0n1", "Nvme0n2"]));
        let cfg = h.call("save_config", None);
        let attach = *common::saved_entries(&cfg, "bdev_nvme_attach_controller")
            .first()
            .unwrap_or_else(|| panic!("no attach in {cfg}"));
        let want = if set { json!(true) } else { Value::Null };
        assert_eq!(attach["params"]["disable_sq_flow_control"], want, "{attach}");
        h.call("bdev_nvme_detach_controller", Some(json!({"name": "Nvme0"})));
    }
    drop(h);
    t.assert_serving();
    // Every host disconnected: no controller is left behind.
    let ctrls = t.call("nvmf_subsystem_get_controllers", Some(json!({"nqn": NQN})));
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ctrls = ctrls;
    while ctrls.as_array().is_some_and(|a| !a.is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        ctrls = t.call("nvmf_subsystem_get_controllers", Some(json!({"nqn": NQN})));
    }
    assert_eq!(ctrls, json!([]), "controllers left after the hosts went");
}

#[test]
fn host_sizes_its_io_queues_to_what_the_target_allows() {
    // A target whose I/O queues hold 32 entries (CAP.MQES 31): the host asks for 128 by
    // default and must connect with 32 instead, and keep at most 31 commands outstanding
    // while perf asks for 64.
    let dir = TempDir::new("nvmf-host-small-queues");
    let port = free_port();
    let t = target_with(&dir, "tgt.sock", port, json!({"max_queue_depth": 32}), |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})));
    });
    perf_verify(&dir, port, "Nvme0n1", 1, 4096, json!({}));
    perf_verify(&dir, port, "Nvme0n1", 64, 4096, json!({}));
    perf_verify(&dir, port, "Nvme0n1", 40, 131072, json!({}));
    t.assert_serving();
    drop(t);

    // A target that grants one I/O queue per controller: perf on two cores gets its I/O done
    // on the first, and on the second fails it at once, without a Connect the target would
    // refuse and without hanging.
    let port = free_port();
    let t = target_with(&dir, "tgt2.sock", port, json!({"max_qpairs_per_ctrlr": 2}), |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})));
    });
    let cfg = dir.write_json(
        "host-one-queue.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
            "params": attach_params(port, json!({}))}]}]}),
    );
    let res = dir.join("perf-one-queue.json");
    let mut args = common::perf_verify_args(&cfg, "Nvme0n1", 8, 4096, "0x3", &res);
    args.extend(["--log-level".to_string(), "info".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let out = run_tool(&dir, common::FERRITE, &args, Duration::from_secs(60));
    assert!(started.elapsed() < Duration::from_secs(15), "perf took {:?}: {}", started.elapsed(), out.stderr);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&res).expect("results")).expect("results json");
    let jobs = doc["results"].as_array().expect("results");
    assert_eq!(jobs.len(), 2, "{doc}");
    let (ok, failing): (Vec<&Value>, Vec<&Value>) = jobs.iter().partition(|j| j["io_failed"] == json!(0));
    assert_eq!((ok.len(), failing.len()), (1, 1), "one job served, one failing: {doc}");
    assert_eq!(ok[0]["verify_errors"], json!(0), "{doc}");
    assert!(ok[0]["iops"].as_f64().unwrap_or(0.0) > 0.0, "{doc}");
    assert!(out.stderr.contains("grants 1 I/O queues"), "the host says why: {}", out.stderr);
    assert!(out.stderr.contains("no I/O queue 2"), "{}", out.stderr);
    assert!(!out.stderr.contains("I/O queue 2: "), "the host tried a queue it was not granted: {}", out.stderr);
    t.assert_serving();
}

/// A host daemon attached to the target and exporting the namespace over NBD; returns it and
/// the NBD URI.
fn host_with_nbd(dir: &TempDir, port: u16, extra: Value) -> (Daemon, String) {
    let h = Daemon::start_with(dir, "host.sock", "0x1", &["--no-pin"]);
    let names = h.call("bdev_nvme_attach_controller", Some(attach_params(port, extra)));
    assert_eq!(names, json!(["Nvme0n1"]), "bdev names");
    let ctrls = h.call("bdev_nvme_get_controllers", None);
    assert_eq!(ctrls[0]["name"], "Nvme0", "{ctrls}");
    let nbd = h.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = nbd["address"].as_str().unwrap().to_string();
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "Nvme0n1", "name": "n1"})));
    (h, format!("nbd://{addr}/n1"))
}

#[test]
fn host_reconnects_after_target_restart() {
    if !have("host_reconnects_after_target_restart", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-reconnect");
    let port = free_port();
    // A file-backed namespace, so the data outlives the target process.
    let img = dir.file_filled("disk.img", 16 << 20, 0);
    let setup = |d: &Daemon| {
        d.call("bdev_uring_create", Some(json!({"name": "U0", "filename": img.to_str().unwrap(), "block_size": 512})));
    };
    let mut t = target(&dir, "tgt.sock", port, setup);
    let (h, uri) = host_with_nbd(&dir, port, json!({"ctrlr_loss_timeout_sec": 30, "reconnect_delay_sec": 1}));
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0xab 65536 1M");
    assert!(ok, "write through the host: {out}");
    t.proc.signal(libc::SIGKILL);
    t.proc.expect_exit(Duration::from_secs(10), "killed target");
    std::fs::remove_file(&t.sock).ok();
    std::thread::sleep(Duration::from_secs(2));
    let _t2 = target(&dir, "tgt.sock", port, setup);
    // The host reconnects by itself; a read then sees what was written before the restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = try_qemu_io(&dir, &uri, "read -P 0xab 65536 1M");
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no successful read after the restart: {out}\nhost log:\n{}",
            h.proc.stderr()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0xcd 0 64k");
    assert!(ok, "write after reconnecting: {out}");
    let (ok, out) = try_qemu_io(&dir, &uri, "read -P 0xcd 0 64k");
    assert!(ok, "read back after reconnecting: {out}");
    h.assert_serving();
}

#[test]
fn host_fails_io_after_ctrlr_loss_timeout() {
    if !have("host_fails_io_after_ctrlr_loss_timeout", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-loss");
    let port = free_port();
    let mut t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 32768, "block_size": 512})));
    });
    let (h, uri) = host_with_nbd(&dir, port, json!({"ctrlr_loss_timeout_sec": 3, "reconnect_delay_sec": 1}));
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0x5a 0 64k");
    assert!(ok, "write: {out}");
    t.proc.signal(libc::SIGKILL);
    t.proc.expect_exit(Duration::from_secs(10), "killed target");
    // Past the loss timeout, I/O fails (an error, not a hang) and the daemon serves on.
    std::thread::sleep(Duration::from_secs(5));
    let started = Instant::now();
    let (ok, out) = try_qemu_io(&dir, &uri, "read 0 64k");
    assert!(!ok, "a read succeeded with the target gone: {out}");
    assert!(started.elapsed() < Duration::from_secs(20), "the failed read took {:?}", started.elapsed());
    h.assert_serving();
    // As SPDK does, the controller given up on is deleted, and its bdev with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.bdev_names().contains(&"Nvme0n1".to_string()) || h.call("bdev_nvme_get_controllers", None) != json!([]) {
        assert!(Instant::now() < deadline, "the lost controller was not deleted:\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = h.call_err("bdev_nvme_detach_controller", Some(json!({"name": "Nvme0"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
}

/// The controller ID the host has for Nvme0.
fn host_cntlid(h: &Daemon) -> u64 {
    let c = h.call("bdev_nvme_get_controllers", Some(json!({"name": "Nvme0"})));
    c[0]["ctrlrs"][0]["cntlid"].as_u64().unwrap_or_else(|| panic!("no cntlid in {c}"))
}

/// The controller IDs the target has for NQN.
fn target_cntlids(t: &Daemon) -> Vec<u64> {
    let c = t.call("nvmf_subsystem_get_controllers", Some(json!({"nqn": NQN})));
    c.as_array().unwrap().iter().map(|x| x["cntlid"].as_u64().unwrap()).collect()
}

#[test]
fn host_reset_controller_connects_a_new_controller_under_io() {
    if !have("host_reset_controller_connects_a_new_controller_under_io", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-reset");
    let port = free_port();
    let t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 32768, "block_size": 512})));
    });
    let (h, uri) = host_with_nbd(&dir, port, json!({}));
    let (ok, out) = try_qemu_io(&dir, &uri, "write -P 0xab 0 1M");
    assert!(ok, "write: {out}");
    // Writes and read-backs run through the host while it resets its controller three times.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (uri, stop) = (uri.clone(), stop.clone());
        std::thread::spawn(move || {
            let dir = TempDir::new("nvmf-host-reset-load");
            let mut rounds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let pat = 0x10 + (rounds % 0x40) as u8;
                let off = (2 + rounds % 8) << 20;
                let (ok, out) = try_qemu_io(&dir, &uri, &format!("write -P {pat} {off} 512k"));
                assert!(ok, "write during resets (round {rounds}): {out}");
                let (ok, out) = try_qemu_io(&dir, &uri, &format!("read -P {pat} {off} 512k"));
                assert!(ok, "read back during resets (round {rounds}): {out}");
                rounds += 1;
            }
            rounds
        })
    };
    let mut seen = vec![host_cntlid(&h)];
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(h.call("bdev_nvme_reset_controller", Some(json!({"name": "Nvme0"}))), json!(true));
        let now = host_cntlid(&h);
        assert!(!seen.contains(&now), "the reset reconnected to an old controller {now} (had {seen:?})");
        seen.push(now);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = load.join().expect("the I/O during the resets succeeded");
    assert!(rounds > 0, "no I/O ran during the resets");
    // The target keeps only the newest controller (the old ones went with their queues).
    let newest = *seen.last().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while target_cntlids(&t) != vec![newest] {
        assert!(Instant::now() < deadline, "target controllers {:?}, want [{newest}]", target_cntlids(&t));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, out) = try_qemu_io(&dir, &uri, "read -P 0xab 0 1M");
    assert!(ok, "data written before the resets: {out}");
    // SPDK's errors: an unknown name or controller ID is ENODEV.
    let e = h.call_err("bdev_nvme_reset_controller", Some(json!({"name": "Nvme9"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = h.call_err("bdev_nvme_reset_controller", Some(json!({"name": "Nvme0", "cntlid": 999})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = h.call_err("bdev_nvme_reset_controller", Some(json!({"nmae": "Nvme0"})));
    assert_eq!(e.code, -32602, "{e:?}");
    assert_eq!(h.call("bdev_nvme_reset_controller", Some(json!({"name": "Nvme0", "cntlid": newest}))), json!(true));
    h.assert_serving();
    t.assert_serving();
}

#[test]
fn perf_reset_workload_resets_the_remote_controller_without_failing_io() {
    let dir = TempDir::new("nvmf-host-perf-reset");
    let port = free_port();
    let _t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 32768, "block_size": 512})));
    });
    let cfg = dir.write_json(
        "host.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
            "params": attach_params(port, json!({}))}]}]}),
    );
    let res = dir.join("perf.json");
    // bdevperf's reset workload: verify, with a bdev reset every 10 s (so one in 12 s).
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
        "reset",
        "-t",
        "12",
        "-m",
        "0x1",
        "--no-pin",
        "--results-json",
        res.to_str().unwrap(),
    ];
    let out = run_tool(&dir, common::FERRITE, &args, Duration::from_secs(60));
    out.assert_ok("ferrite perf -w reset over bdev_nvme");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&res).expect("results json")).expect("json");
    let r = &doc["results"][0];
    assert_eq!(r["workload"], json!("reset"), "{r}");
    assert_eq!(r["io_failed"], json!(0), "failed I/O: {r}");
    assert_eq!(r["verify_errors"], json!(0), "verify errors: {r}");
    assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "no I/O: {r}");
    assert!(
        out.stderr.contains("reset: connecting a new controller"),
        "no controller reset was logged:\n{}",
        out.stderr
    );
}

/// The host's bdevs and their sizes in blocks.
fn host_bdevs(h: &Daemon) -> std::collections::BTreeMap<String, u64> {
    let b = h.call("bdev_get_bdevs", None);
    b.as_array()
        .unwrap()
        .iter()
        .map(|x| (x["name"].as_str().unwrap().to_string(), x["num_blocks"].as_u64().unwrap()))
        .collect()
}

fn wait_bdevs(h: &Daemon, what: &str, want: impl Fn(&std::collections::BTreeMap<String, u64>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let b = host_bdevs(h);
        if want(&b) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: host bdevs {b:?}\nhost log:\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn host_follows_namespaces_added_removed_and_resized_on_the_target() {
    if !have("host_follows_namespaces_added_removed_and_resized_on_the_target", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-rescan");
    let port = free_port();
    let t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_null_create", Some(json!({"name": "N0", "num_blocks": 16384, "block_size": 512})));
    });
    let (h, uri1) = host_with_nbd(&dir, port, json!({}));
    assert_eq!(host_bdevs(&h).get("Nvme0n1"), Some(&16384));
    // A namespace added on the target becomes a bdev on the host (namespace attribute notice).
    t.call("bdev_malloc_create", Some(json!({"name": "M1", "num_blocks": 8192, "block_size": 512})));
    t.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "M1"}})));
    wait_bdevs(&h, "namespace 2 added", |b| b.get("Nvme0n2") == Some(&8192));
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "Nvme0n2", "name": "n2"})));
    let uri2 = uri1.replace("/n1", "/n2");
    let (ok, out) = try_qemu_io(&dir, &uri2, "write -P 0x6c 0 1M");
    assert!(ok, "write to the added namespace: {out}");
    let (ok, out) = try_qemu_io(&dir, &uri2, "read -P 0x6c 0 1M");
    assert!(ok, "read back from the added namespace: {out}");
    // A bdev that grows on the target grows on the host (NBD keeps it open: growing is allowed).
    t.call("bdev_null_resize", Some(json!({"name": "N0", "new_size": 16})));
    wait_bdevs(&h, "namespace 1 resized", |b| b.get("Nvme0n1") == Some(&32768));
    // A namespace removed on the target takes its bdev on the host away; the other stays.
    h.call("nbd_server_remove_export", Some(json!({"name": "n2"})));
    t.call("nvmf_subsystem_remove_ns", Some(json!({"nqn": NQN, "nsid": 2})));
    wait_bdevs(&h, "namespace 2 removed", |b| !b.contains_key("Nvme0n2") && b.contains_key("Nvme0n1"));
    let (ok, out) = try_qemu_io(&dir, &uri1, "read 0 64k");
    assert!(ok, "namespace 1 after the others changed: {out}");
    h.assert_serving();
    t.assert_serving();
}

/// Thin lvols on the target as the host sees them: an lvol snapshot's namespace (NSATTR
/// write-protected) becomes a bdev that takes no writes, exported read-only over NBD; a write
/// to a thin lvol whose lvstore is full ends as ENOSPC at the NBD client (the target's Capacity
/// Exceeded, passed through the host), and what was written before reads back.
#[test]
fn host_sees_snapshots_read_only_and_a_full_lvstore_as_no_space() {
    if !have("host_sees_snapshots_read_only_and_a_full_lvstore_as_no_space", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nvmf-host-lvol");
    let port = free_port();
    let t = target(&dir, "tgt.sock", port, |_| {});
    // 8 MiB: the lvstore's metadata and fewer than the lvol's 8 clusters of 1 MiB.
    t.call("bdev_malloc_create", Some(json!({"name": "Small", "num_blocks": 2048, "block_size": 4096})));
    t.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "Small", "lvs_name": "lvs0", "cluster_sz": 1 << 20})));
    let lvol = json!({"lvs_name": "lvs0", "lvol_name": "thin", "size_in_mib": 8, "thin_provision": true});
    t.call("bdev_lvol_create", Some(lvol));
    t.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "lvs0/thin"}})));
    let (h, uri1) = host_with_nbd(&dir, port, json!({}));
    let (ok, out) = try_qemu_io(&dir, &uri1, "write -P 0x5a 0 64k");
    assert!(ok, "write to the thin lvol: {out}");

    t.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/thin", "snapshot_name": "snap"})));
    t.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "lvs0/snap"}})));
    wait_bdevs(&h, "the snapshot's namespace", |b| b.contains_key("Nvme0n2"));
    let b = h.call("bdev_get_bdevs", Some(json!({"name": "Nvme0n2"})));
    let types = &b[0]["supported_io_types"];
    assert_eq!(
        (types["read"].clone(), types["write"].clone(), types["unmap"].clone()),
        (json!(true), json!(false), json!(false)),
        "{b}"
    );
    h.call("nbd_server_add_export", Some(json!({"bdev_name": "Nvme0n2", "name": "n2"})));
    let uri2 = uri1.replace("/n1", "/n2");
    let out =
        run_tool(&dir, "qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x5a 0 64k", &uri2], Duration::from_secs(30));
    assert!(out.status.success() && !out.stdout.contains("failed"), "read the snapshot: {}{}", out.stdout, out.stderr);
    let (ok, out) = try_qemu_io(&dir, &uri2, "write -P 0x11 0 4k");
    assert!(!ok, "a write to the snapshot's export succeeded: {out}");

    // One block into each cluster until the lvstore has none left.
    let free =
        t.call("bdev_lvol_get_lvstores", Some(json!({"lvs_name": "lvs0"})))[0]["free_clusters"].as_u64().unwrap();
    assert!((1..8).contains(&free), "the test wants fewer free clusters than the lvol's 8: {free}");
    for c in 0..free {
        let (ok, out) = try_qemu_io(&dir, &uri1, &format!("write -P {} {}M 4k", 0x20 + c, c));
        assert!(ok, "write into cluster {c} of {free} free: {out}");
    }
    let (ok, out) = try_qemu_io(&dir, &uri1, &format!("write -P 0x77 {free}M 4k"));
    assert!(!ok && out.contains("No space left on device"), "a write to the full lvstore: {out}");
    for c in 0..free {
        let (ok, out) = try_qemu_io(&dir, &uri1, &format!("read -P {} {}M 4k", 0x20 + c, c));
        assert!(ok, "cluster {c} read back: {out}");
    }

    // The lvol made read-only on the target: the host hears of it (a namespace attribute
    // notice) and its bdev stops offering writes.
    t.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs0/thin"})));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let b = h.call("bdev_get_bdevs", Some(json!({"name": "Nvme0n1"})));
        if b[0]["supported_io_types"]["write"] == json!(false) {
            break;
        }
        assert!(Instant::now() < deadline, "the host's bdev still writable: {b}\nhost log:\n{}", h.proc.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The NBD export, opened anew, now says read-only at the handshake: qemu refuses to open
    // it for writing.
    let (ok, out) = try_qemu_io(&dir, &uri1, "write -P 0x66 0 4k");
    assert!(!ok && out.contains("Permission denied"), "a write to the read-only lvol's export: {out}");
    let out =
        run_tool(&dir, "qemu-io", &["-f", "raw", "-r", "-c", "read -P 0x5a 4k 60k", &uri1], Duration::from_secs(30));
    assert!(out.status.success() && !out.stdout.contains("failed"), "read back: {}{}", out.stdout, out.stderr);
    h.assert_serving();
    t.assert_serving();
}

#[test]
fn a_path_that_drops_now_and_then_but_serves_between_is_not_given_up() {
    // The target removes the host and adds it back in a loop (every connection drops, the
    // host is refused for a moment, then reconnects and serves) for longer than the loss
    // timeout. As in SPDK, whose clock starts again at every reset that brings the queues
    // back, the controller is kept: the run of ferrite perf -w verify ends well, its bdev never
    // deleted. It was given up ctrlr_loss_timeout_sec after the first drop, though I/O had
    // flowed between the drops.
    let dir = TempDir::new("nvmf-host-flap");
    let port = free_port();
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-1111-2222-3333-444455556666";
    let t = target(&dir, "tgt.sock", port, |d| {
        d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})));
    });
    t.call("nvmf_subsystem_allow_any_host", Some(json!({"nqn": NQN, "allow_any_host": false})));
    t.call("nvmf_subsystem_add_host", Some(json!({"nqn": NQN, "host": hostnqn})));
    let extra = json!({"hostnqn": hostnqn, "ctrlr_loss_timeout_sec": 4, "reconnect_delay_sec": 1,
        "fast_io_fail_timeout_sec": 3});
    let cfg = dir.write_json(
        "host.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
            "params": attach_params(port, extra)}]}]}),
    );
    let res = dir.join("perf.json");
    let args = ["perf", "--json", cfg.to_str().unwrap(), "-T", "Nvme0n1", "-q", "8", "-o", "4096", "-w", "verify"];
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["-t", "10", "-m", "0x1", "--no-pin", "--results-json", res.to_str().unwrap()])
        .collect();
    let perf = nbd_common::Tool::spawn(&dir, common::FERRITE, &args);
    std::thread::sleep(Duration::from_millis(1500));
    let end = Instant::now() + Duration::from_secs(7);
    let mut drops = 0;
    while Instant::now() < end {
        t.call("nvmf_subsystem_remove_host", Some(json!({"nqn": NQN, "host": hostnqn})));
        std::thread::sleep(Duration::from_millis(300));
        t.call("nvmf_subsystem_add_host", Some(json!({"nqn": NQN, "host": hostnqn})));
        drops += 1;
        std::thread::sleep(Duration::from_millis(1700));
    }
    let out = perf.wait(Duration::from_secs(40));
    assert!(drops >= 3, "{drops} drops");
    assert!(!out.stderr.contains("giving up"), "the controller was given up:\n{}", out.stderr);
    out.assert_ok("ferrite perf across the drops");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&res).unwrap()).unwrap();
    let r = &doc["results"][0];
    assert_eq!(r["verify_errors"], json!(0), "{r}");
    assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
}
