//! The nexus (Mayastor's replicated volume) through the daemon with real clients: `ferrite perf
//! -w verify` over malloc children, one of which (the error bdev) fails writes mid-run; a child
//! that fails writes under qemu-io is faulted with its reason, brought back, partially rebuilt
//! (only the logged segments), and every child then holds the same bytes (the uring files
//! compared directly); a new child rebuilt fully while qemu-io writes; the health store: after
//! kill -9 the stale child is not a source and is rebuilt (a file store, and etcd); bad
//! requests get JSON-RPC errors and the daemon goes on; save_config keeps a nexus.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::{export_nbd, have, qemu_io_script};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn m(method: &str, params: Value) -> Value {
    json!({"method": method, "params": params})
}

fn config(dir: &TempDir, name: &str, entries: Vec<Value>) -> PathBuf {
    let mut e = entries;
    e.push(json!({"method": "bdev_wait_for_examine"}));
    dir.write_json(name, &json!({"subsystems": [{"subsystem": "bdev", "config": e}]}))
}

/// The nexus `name`, by nexus_get_nexuses.
fn nexus(d: &Daemon, name: &str) -> Value {
    d.call("nexus_get_nexuses", Some(json!({"name": name})))[0].clone()
}

fn child<'a>(n: &'a Value, uri: &str) -> &'a Value {
    n["children"].as_array().unwrap().iter().find(|c| c["uri"] == uri).unwrap_or_else(|| panic!("{uri} in {n}"))
}

/// Waits until `uri`'s rebuild in `name` has ended; its stats.
fn wait_rebuilt(d: &Daemon, name: &str, uri: &str, limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let s = d.call("nexus_rebuild_get_stats", Some(json!({"name": name, "uri": uri})));
        if s["state"] != "running" && s["state"] != "paused" {
            let n = nexus(d, name);
            if child(&n, uri)["state"] != "rebuilding" {
                return s;
            }
        }
        assert!(t0.elapsed() < limit, "rebuild of {uri} ends: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Empty files of `mib` MiB.
fn files(dir: &TempDir, names: &[&str], mib: u64) -> Vec<PathBuf> {
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            std::fs::File::create(&p).unwrap().set_len(mib * MIB).unwrap();
            p
        })
        .collect()
}

fn uring_uri(p: &Path) -> String {
    format!("uring://{}?blk_size=512", p.display())
}

/// Asserts the files hold the same bytes (the first difference named).
fn same_bytes(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert_eq!(x.len(), y.len());
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ at byte {i} ({:#x} vs {:#x})", a.display(), b.display(), x[i], y[i]);
    }
}

fn perf_verify(dir: &TempDir, tag: &str, cfg: &Path, bdev: &str, secs: &str) -> Value {
    let results = dir.join(&format!("{tag}.json"));
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "--reactor-mode",
        "interrupt",
        "--results-json",
        results.to_str().unwrap(),
        "-T",
        bdev,
        "-w",
        "verify",
        "-q",
        "16",
        "-o",
        "16384",
        "-t",
        secs,
    ];
    let mut p = common::Proc::spawn(dir, tag, &args);
    let st = p.expect_exit(Duration::from_secs(60), tag);
    let out = format!("stdout:\n{}\nstderr:\n{}", p.stdout(), p.stderr());
    assert_eq!(st.code(), Some(0), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let r = doc["results"][0].clone();
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}\n{out}");
    assert_eq!(r["verify_errors"], 0, "{doc}\n{out}");
    r
}

#[test]
fn perf_verifies_over_malloc_children_while_one_fails_writes_and_reads() {
    let dir = TempDir::new("nexus-verify");
    let store = dir.join("store.json");
    let store = store.to_str().unwrap();
    let cfg = config(
        &dir,
        "verify.json",
        vec![m(
            "nexus_create",
            json!({"name": "N0", "size": 16 * MIB, "store": store,
                "children": ["malloc:///m0?size_mb=16", "malloc:///m1?size_mb=16&blk_size=512"]}),
        )],
    );
    perf_verify(&dir, "plain", &cfg, "N0", "2");
    // Three children; the third, an error bdev, fails writes after the first ones, and reads.
    let cfg = config(
        &dir,
        "fault.json",
        vec![
            m("bdev_malloc_create", json!({"name": "B2", "num_blocks": 32768, "block_size": 512})),
            m("bdev_error_create", json!({"base_name": "B2"})),
            m(
                "nexus_create",
                json!({"name": "N1", "size": 16 * MIB, "store": store, "uuid": "5b7c3a1e-2f4d-4e6a-9b8c-7d6e5f4a3b21",
                    "children": ["malloc:///f0?size_mb=16", "malloc:///f1?size_mb=16", "bdev:///EE_B2"]}),
            ),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_B2", "io_type": "write", "error_type": "failure", "num": 1000000}),
            ),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_B2", "io_type": "read", "error_type": "failure", "num": 1000000}),
            ),
        ],
    );
    perf_verify(&dir, "fault", &cfg, "N1", "2");
    // The store recorded the failed child as out of date before its writes were acknowledged.
    let doc: Value = serde_json::from_slice(&std::fs::read(store).unwrap()).unwrap();
    let rec = &doc["/ferrite/nexus/5b7c3a1e-2f4d-4e6a-9b8c-7d6e5f4a3b21"];
    let kids = rec["children"].as_array().unwrap();
    assert_eq!(kids.iter().filter(|c| c["healthy"] == false).count(), 1, "{rec}");
    assert_eq!(kids[2]["uri"], "bdev:///EE_B2", "{rec}");
    assert_eq!(kids[2]["healthy"], false, "{rec}");
}

/// A daemon with uring children c0, c1 and an error bdev over c2's file; nexus NX over them,
/// exported over NBD.
struct Setup {
    dir: TempDir,
    d: Daemon,
    files: Vec<PathBuf>,
    uris: Vec<String>,
    nbd: String,
}

fn setup(tag: &str, store: Option<&str>) -> Setup {
    setup_with(tag, store, 0)
}

/// [`setup`], with the nexus's `auto_online_ms`.
fn setup_with(tag: &str, store: Option<&str>, auto_online_ms: u32) -> Setup {
    let dir = TempDir::new(tag);
    let files = files(&dir, &["c0.img", "c1.img", "c2.img", "c3.img"], 32);
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_uring_create", Some(json!({"name": "U2", "filename": files[2].to_str().unwrap(), "block_size": 512})));
    d.call("bdev_error_create", Some(json!({"base_name": "U2"})));
    let store_s = dir.join("store.json").to_str().unwrap().to_string();
    let uris = vec![uring_uri(&files[0]), uring_uri(&files[1]), "bdev:///EE_U2".to_string()];
    d.call(
        "nexus_create",
        Some(json!({"name": "NX", "uuid": "1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "size": 32 * MIB,
            "children": uris, "store": store.unwrap_or(&store_s), "auto_online_ms": auto_online_ms})),
    );
    let nbd = export_nbd(&d, "NX", "nx");
    Setup { dir, d, files, uris, nbd }
}

#[test]
fn a_child_that_fails_writes_is_faulted_then_partially_rebuilt() {
    if !have("a_child_that_fails_writes_is_faulted_then_partially_rebuilt", &["qemu-io"]) {
        return;
    }
    let s = setup("nexus-partial", None);
    let (d, dir) = (&s.d, &s.dir);
    assert_eq!(nexus(d, "NX")["state"], "online");
    qemu_io_script(dir, &s.nbd, "write -P 0x11 0 32M; flush");
    d.call(
        "bdev_error_inject_error",
        Some(json!({"name": "EE_U2", "io_type": "write", "error_type": "failure", "num": 1000})),
    );
    // No error reaches the client: the others complete the writes.
    qemu_io_script(
        dir,
        &s.nbd,
        "write -P 0x22 1M 64k; write -P 0x33 9M 2M; flush; read -P 0x22 1M 64k; read -P 0x33 9M 2M",
    );
    let n = nexus(d, "NX");
    assert_eq!(n["state"], "degraded", "{n}");
    let c = child(&n, "bdev:///EE_U2");
    assert_eq!(c["state"], "faulted", "{n}");
    assert!(c["reason"].as_str().unwrap().starts_with("io_error"), "{n}");
    assert!(n["logged_segments"].as_u64().unwrap() >= 3, "{n}");
    // Reads go on from the healthy children; more writes while it is away.
    qemu_io_script(dir, &s.nbd, "write -P 0x44 20M 1M; read -P 0x11 0 1M; read -P 0x44 20M 1M");
    // It is back (the error cleared): only the logged segments are copied.
    d.call("bdev_error_inject_error", Some(json!({"name": "EE_U2", "io_type": "clear", "error_type": "failure"})));
    assert_eq!(d.call("nexus_online_child", Some(json!({"name": "NX", "uri": "bdev:///EE_U2"}))), json!(true));
    let st = wait_rebuilt(d, "NX", "bdev:///EE_U2", Duration::from_secs(30));
    assert_eq!(st["state"], "completed", "{st}");
    assert_eq!(st["is_partial"], true, "{st}");
    let copied = st["blocks_recovered"].as_u64().unwrap();
    assert!((4 * 2048..=8 * 2048).contains(&copied), "only the logged segments: {st}");
    assert!(copied * 4 < 32 * 2048, "far less than the whole: {st}");
    let n = nexus(d, "NX");
    assert_eq!(n["state"], "online", "{n}");
    assert_eq!(n["logged_segments"], 0, "{n}");
    qemu_io_script(
        dir,
        &s.nbd,
        "read -P 0x11 0 1M; read -P 0x22 1M 64k; read -P 0x33 9M 2M; read -P 0x44 20M 1M; flush",
    );
    for f in &s.files[1..3] {
        same_bytes(&s.files[0], f);
    }
    d.assert_serving();
}

/// Polls the state of `uri` in the nexus NX until `pred` holds (at most `limit`); the nexus.
fn wait_child(d: &Daemon, uri: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let n = nexus(d, "NX");
        if pred(child(&n, uri)) {
            return n;
        }
        assert!(t0.elapsed() < limit, "child {uri} within {limit:?}: {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_auto_online_a_child_that_answers_again_is_rebuilt_without_being_asked() {
    let test = "with_auto_online_a_child_that_answers_again_is_rebuilt_without_being_asked";
    if !have(test, &["qemu-io"]) {
        return;
    }
    let s = setup_with("nexus-auto-online", None, 100);
    let (d, dir) = (&s.d, &s.dir);
    qemu_io_script(dir, &s.nbd, "write -P 0x51 0 32M; flush");
    d.call(
        "bdev_error_inject_error",
        Some(json!({"name": "EE_U2", "io_type": "write", "error_type": "failure", "num": 100000})),
    );
    qemu_io_script(dir, &s.nbd, "write -P 0x52 2M 1M; flush; read -P 0x52 2M 1M");
    wait_child(d, "bdev:///EE_U2", Duration::from_secs(5), |c| c["state"] == "faulted");
    // Its reads work, so it is tried; its writes still fail, so every rebuild fails, and the
    // tries back off (100 ms, 200, 400, ...): a few in 3 s, not 30.
    let n = wait_child(d, "bdev:///EE_U2", Duration::from_secs(10), |c| {
        c["reason"].as_str().is_some_and(|r| r.starts_with("rebuild_failed"))
    });
    assert_eq!(n["state"], "degraded", "{n}");
    let errors = || -> u64 {
        let s = d.call("bdev_get_iostat", Some(json!({"name": "EE_U2"})));
        s["bdevs"][0]["io_error"].as_object().unwrap_or_else(|| panic!("{s}")).values().filter_map(Value::as_u64).sum()
    };
    let before = errors();
    std::thread::sleep(Duration::from_secs(3));
    let tries = errors() - before;
    assert!(tries <= 10, "each failed rebuild is one failed write: {tries} in 3 s is no back-off");
    let failed = child(&nexus(d, "NX"), "bdev:///EE_U2").clone();
    assert_ne!(failed["state"], "online", "{failed}");
    qemu_io_script(dir, &s.nbd, "write -P 0x53 20M 1M; flush");
    // The errors clear: the next try rebuilds it (partially: the log holds what it missed).
    d.call("bdev_error_inject_error", Some(json!({"name": "EE_U2", "io_type": "clear", "error_type": "failure"})));
    let n = wait_child(d, "bdev:///EE_U2", Duration::from_secs(30), |c| c["state"] == "online");
    assert_eq!(n["state"], "online", "{n}");
    let st = wait_rebuilt(d, "NX", "bdev:///EE_U2", Duration::from_secs(10));
    assert_eq!((st["state"].as_str(), st["is_partial"].as_bool()), (Some("completed"), Some(true)), "{st}");
    qemu_io_script(dir, &s.nbd, "read -P 0x51 0 2M; read -P 0x52 2M 1M; read -P 0x53 20M 1M; flush");
    for f in &s.files[1..3] {
        same_bytes(&s.files[0], f);
    }
    // A child the client faults is left alone.
    d.call("nexus_fault_child", Some(json!({"name": "NX", "uri": "bdev:///EE_U2"})));
    std::thread::sleep(Duration::from_secs(1));
    let c = child(&nexus(d, "NX"), "bdev:///EE_U2").clone();
    assert_eq!((c["state"].as_str(), c["reason"].as_str()), (Some("faulted"), Some("by_client")), "{c}");
    // save_config keeps the setting.
    let cfg = d.call("save_config", None).to_string();
    assert!(cfg.contains("\"auto_online_ms\":100"), "{cfg}");
    d.assert_serving();
}

#[test]
fn a_new_child_is_rebuilt_fully_while_qemu_io_writes() {
    if !have("a_new_child_is_rebuilt_fully_while_qemu_io_writes", &["qemu-io"]) {
        return;
    }
    let s = setup("nexus-full", None);
    let (d, dir) = (&s.d, &s.dir);
    qemu_io_script(dir, &s.nbd, "write -P 0x51 0 16M; write -P 0x52 16M 16M; flush");
    d.call("nexus_set_rebuild_rate", Some(json!({"name": "NX", "max_mb_sec": 16})));
    let new = uring_uri(&s.files[3]);
    assert_eq!(d.call("nexus_add_child", Some(json!({"name": "NX", "uri": new}))), json!(true));
    let e = d.call_err("nexus_add_child", Some(json!({"name": "NX", "uri": new})));
    assert_eq!(e.code, -libc::EEXIST, "a child added twice: {e:?}");
    assert_eq!(child(&nexus(d, "NX"), &new)["state"], "rebuilding");
    // Writes during the rebuild, pause and resume.
    qemu_io_script(dir, &s.nbd, "write -P 0x53 30M 1M; write -P 0x54 100k 64k; flush");
    d.call("nexus_rebuild_pause", Some(json!({"name": "NX", "uri": new})));
    let p = d.call("nexus_rebuild_get_stats", Some(json!({"name": "NX", "uri": new})));
    assert_eq!(p["state"], "paused", "{p}");
    qemu_io_script(dir, &s.nbd, "write -P 0x55 5M 1M; flush");
    d.call("nexus_rebuild_resume", Some(json!({"name": "NX", "uri": new})));
    let st = wait_rebuilt(d, "NX", &new, Duration::from_secs(30));
    assert_eq!((st["state"].as_str(), st["is_partial"].as_bool()), (Some("completed"), Some(false)), "{st}");
    assert_eq!(st["blocks_recovered"], 32 * 2048, "{st}");
    assert_eq!(nexus(d, "NX")["state"], "online");
    // Every write reads back from the new child alone.
    for u in &s.uris {
        d.call("nexus_fault_child", Some(json!({"name": "NX", "uri": u})));
    }
    let n = nexus(d, "NX");
    assert_eq!(child(&n, &new)["state"], "online", "{n}");
    qemu_io_script(
        dir,
        &s.nbd,
        "read -P 0x51 0 100k; read -P 0x54 100k 64k; read -P 0x51 164k 4956k; read -P 0x55 5M 1M; read -P 0x51 6M 10M; read -P 0x52 16M 14M; read -P 0x53 30M 1M; read -P 0x52 31M 1M",
    );
    let e = d.call_err("nexus_remove_child", Some(json!({"name": "NX", "uri": new})));
    assert_eq!(e.code, -libc::EBUSY, "the last healthy child stays: {e:?}");
    let e = d.call_err("nexus_fault_child", Some(json!({"name": "NX", "uri": new})));
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert_eq!(d.call("nexus_remove_child", Some(json!({"name": "NX", "uri": s.uris[0]}))), json!(true));
    d.assert_serving();
}

/// Runs the crash scenario against `store`: a child faulted, writes, kill -9, restart with the
/// same config: the stale child is rebuilt from the current ones, never used as a source.
fn crash_and_reassemble(tag: &str, store: Option<&str>) {
    let s = setup(tag, store);
    let (d, dir) = (&s.d, &s.dir);
    qemu_io_script(dir, &s.nbd, "write -P 0x61 0 32M; flush");
    // The bdev subsystem of the saved config (the NBD export is made again below).
    let mut saved = d.call("save_config", None);
    saved["subsystems"].as_array_mut().unwrap().retain(|s| s["subsystem"] == "bdev");
    let cfg = dir.write_json("saved.json", &saved);
    assert_eq!(d.call("nexus_fault_child", Some(json!({"name": "NX", "uri": s.uris[0]}))), json!(true));
    qemu_io_script(dir, &s.nbd, "write -P 0x62 3M 2M; write -P 0x63 17M 1M; flush");
    let mut d = s.d;
    d.proc.signal(libc::SIGKILL);
    d.proc.expect_exit(Duration::from_secs(10), "killed");
    // c0 is stale: its file lacks the writes after the fault.
    let c0 = std::fs::read(&s.files[0]).unwrap();
    assert!(c0[3 * MIB as usize..5 * MIB as usize].iter().all(|&b| b == 0x61), "c0 missed the writes");
    let d = Daemon::start_with(dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    let n = nexus(&d, "NX");
    let c = child(&n, &s.uris[0]);
    assert!(c["state"] == "rebuilding" || c["state"] == "online", "the stale child is rebuilt: {n}");
    // Not shut down cleanly: of the two current children, the local one (bdev:///) is the
    // reference and the other is rebuilt from it too (writes in flight at the crash may differ
    // between them).
    assert_eq!(child(&n, &s.uris[2])["state"], "online", "{n}");
    assert_ne!(child(&n, &s.uris[1])["state"], "faulted", "{n}");
    for u in [&s.uris[0], &s.uris[1]] {
        let st = wait_rebuilt(&d, "NX", u, Duration::from_secs(30));
        assert_eq!(
            (st["source"].as_str(), st["is_partial"].as_bool()),
            (Some(s.uris[2].as_str()), Some(false)),
            "{st}"
        );
    }
    assert_eq!(nexus(&d, "NX")["state"], "online");
    let u = export_nbd(&d, "NX", "nx");
    qemu_io_script(
        dir,
        &u,
        "read -P 0x61 0 3M; read -P 0x62 3M 2M; read -P 0x61 5M 12M; read -P 0x63 17M 1M; read -P 0x61 18M 14M; flush",
    );
    for f in &s.files[1..3] {
        same_bytes(&s.files[0], f);
    }
    d.assert_serving();
}

#[test]
fn after_a_clean_shutdown_every_current_child_is_trusted_without_a_rebuild() {
    if !have("after_a_clean_shutdown_every_current_child_is_trusted_without_a_rebuild", &["qemu-io"]) {
        return;
    }
    let s = setup("nexus-clean", None);
    let (d, dir) = (&s.d, &s.dir);
    qemu_io_script(dir, &s.nbd, "write -P 0x71 0 32M; flush; write -P 0x72 4M 1M");
    let mut saved = d.call("save_config", None);
    saved["subsystems"].as_array_mut().unwrap().retain(|s| s["subsystem"] == "bdev");
    let cfg = dir.write_json("saved.json", &saved);
    let mut d = s.d;
    d.proc.sigterm();
    d.proc.expect_exit(Duration::from_secs(20), "SIGTERM");
    let store: Value = serde_json::from_slice(&std::fs::read(dir.join("store.json")).unwrap()).unwrap();
    let rec = store.as_object().unwrap().values().next().unwrap_or_else(|| panic!("{store}")).clone();
    assert_eq!(rec["clean_shutdown"], true, "{store}");
    // The write that was not flushed by the client was flushed at shutdown.
    for f in &s.files[1..3] {
        same_bytes(&s.files[0], f);
    }
    let d = Daemon::start_with(dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    let n = nexus(&d, "NX");
    assert_eq!(n["state"], "online", "all trusted: {n}");
    for u in &s.uris {
        let e = d.call_err("nexus_rebuild_get_stats", Some(json!({"name": "NX", "uri": u})));
        assert_eq!(e.code, -libc::ENOENT, "no rebuild of {u}: {e:?}");
    }
    let u = export_nbd(&d, "NX", "nx");
    qemu_io_script(dir, &u, "read -P 0x71 0 4M; read -P 0x72 4M 1M; read -P 0x71 5M 27M");
    d.assert_serving();
}

#[test]
fn after_kill_9_a_stale_child_is_rebuilt_from_the_file_store() {
    if !have("after_kill_9_a_stale_child_is_rebuilt_from_the_file_store", &["qemu-io"]) {
        return;
    }
    crash_and_reassemble("nexus-crash-file", None);
}

/// An etcd on free loopback ports in `dir`, killed on drop.
struct Etcd(std::process::Child, String);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_etcd(dir: &TempDir) -> Etcd {
    let (cp, pp) = (nbd_common::free_port(), nbd_common::free_port());
    let client = format!("http://127.0.0.1:{cp}");
    let peer = format!("http://127.0.0.1:{pp}");
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = std::process::Command::new("etcd")
        .args([
            "--data-dir",
            dir.join("etcd").to_str().unwrap(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("etcd starts");
    let e = Etcd(child, format!("127.0.0.1:{cp}"));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&e.1).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "etcd listens");
        std::thread::sleep(Duration::from_millis(100));
    }
    e
}

#[test]
fn after_kill_9_a_stale_child_is_rebuilt_from_etcd() {
    let test = "after_kill_9_a_stale_child_is_rebuilt_from_etcd";
    if !have(test, &["qemu-io", "etcd"]) {
        return;
    }
    let edir = TempDir::new("nexus-etcd-server");
    let e = start_etcd(&edir);
    crash_and_reassemble("nexus-crash-etcd", Some(&format!("etcd://{}", e.1)));
    drop(e);
}

#[test]
fn bad_nexus_requests_get_errors_and_the_daemon_goes_on() {
    let dir = TempDir::new("nexus-bad");
    let d = Daemon::start(&dir, &[]);
    let store = dir.join("store.json");
    let store = store.to_str().unwrap();
    for (n, blocks, bs) in [("A", 8192, 512), ("B", 8192, 512), ("S", 4096, 512), ("K", 1024, 4096)] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": blocks, "block_size": bs})));
    }
    let create = |p: Value| d.call_err("nexus_create", Some(p));
    let with = |children: Value| json!({"name": "X", "size": 0, "children": children, "store": store});
    for (p, code, what) in [
        (with(json!(["frob:///A"])), -libc::EINVAL, "unknown scheme"),
        (with(json!(["bdev://host/A"])), -libc::EINVAL, "a host in bdev:///"),
        (with(json!(["malloc:///z"])), -libc::EINVAL, "malloc without a size"),
        (with(json!([])), -libc::EINVAL, "no children"),
        (with(json!(["bdev:///A", "bdev:///A"])), -libc::EEXIST, "a child twice"),
        (with(json!(["bdev:///A", "bdev:///S"])), -libc::EINVAL, "sizes differ"),
        (with(json!(["bdev:///A", "bdev:///K"])), -libc::EINVAL, "block sizes differ"),
        (with(json!(["bdev:///nosuch"])), -libc::ENODEV, "no such bdev"),
        (with(json!(["nvmf://127.0.0.1:1/nqn.2019-05.io.x:none"])), -libc::ENODEV, "nothing listens"),
        (
            json!({"name": "X", "size": 100, "children": ["bdev:///A"], "store": store}),
            -libc::EINVAL,
            "size not in blocks",
        ),
        (
            json!({"name": "X", "size": 8 * MIB, "children": ["bdev:///A"], "store": store}),
            -libc::EINVAL,
            "size too big",
        ),
        (json!({"name": "X", "children": ["bdev:///A"], "store": "relative"}), -32602, "a bad store"),
        (json!({"name": "X", "children": ["bdev:///A"], "frob": 1}), -32602, "an unknown param"),
        (json!({"children": ["bdev:///A"]}), -32602, "no name"),
        (
            with(json!(["malloc:///z1?size_mb=8&blk_size=4096", "malloc:///z2?size_mb=16&blk_size=4096"])),
            -libc::EINVAL,
            "children it makes of different sizes",
        ),
    ] {
        let e = create(p);
        assert_eq!(e.code, code, "{what}: {e:?}");
    }
    // What a failed create made is gone: the corrected request finds no leftover.
    assert!(!d.bdev_names().iter().any(|n| n.starts_with('z')), "{:?}", d.bdev_names());
    d.call("nexus_create", Some(with(json!(["malloc:///z2?size_mb=8&blk_size=4096"]))));
    d.call("nexus_destroy", Some(json!({"name": "X"})));
    // Nothing is left claimed by the failed creates.
    assert_eq!(d.call("nexus_get_nexuses", None), json!([]));
    assert_eq!(d.call("bdev_get_bdevs", Some(json!({"name": "A"})))[0]["claimed"], false);
    assert_eq!(
        d.call(
            "nexus_create",
            Some(json!({"name": "OK", "size": 2 * MIB, "children": ["bdev:///A", "bdev:///B"], "store": store}))
        ),
        json!("OK")
    );
    let e = create(json!({"name": "OK", "children": ["bdev:///S"], "store": store}));
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    let e = create(json!({"name": "Y", "children": ["bdev:///A"], "store": store}));
    assert_eq!(e.code, -libc::EPERM, "a claimed child: {e:?}");
    let e = d.call_err("nexus_remove_child", Some(json!({"name": "OK", "uri": "bdev:///nosuch"})));
    assert_eq!(e.code, -libc::ENOENT, "{e:?}");
    let e = d.call_err("nexus_online_child", Some(json!({"name": "OK", "uri": "bdev:///A"})));
    assert_eq!(e.code, -libc::EBUSY, "online of a healthy child: {e:?}");
    let e = d.call_err("nexus_rebuild_get_stats", Some(json!({"name": "OK", "uri": "bdev:///A"})));
    assert_eq!(e.code, -libc::ENOENT, "{e:?}");
    let e = d.call_err("nexus_destroy", Some(json!({"name": "nosuch"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = d.call_err("nexus_add_child", Some(json!({"name": "OK", "uri": "bdev:///S"})));
    assert_eq!(e.code, -libc::EINVAL, "a child of another size: {e:?}");
    assert_eq!(d.call("bdev_get_bdevs", Some(json!({"name": "S"})))[0]["claimed"], false);
    // save_config keeps the nexus; a restart from it brings it back.
    let saved = d.call("save_config", None);
    let entries = common::saved_entries(&saved, "nexus_create");
    assert_eq!(entries.len(), 1, "{saved}");
    assert_eq!(entries[0]["params"]["children"], json!(["bdev:///A", "bdev:///B"]));
    assert_eq!(d.call("nexus_destroy", Some(json!({"name": "OK"}))), json!(true));
    assert_eq!(d.call("bdev_get_bdevs", Some(json!({"name": "A"})))[0]["claimed"], false);
    d.assert_serving();
    drop(d);
    let cfg = dir.write_json("saved.json", &saved);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    let n = nexus(&d2, "OK");
    assert_eq!((n["state"].as_str(), n["size"].as_u64()), (Some("online"), Some(2 * MIB)), "{n}");
}

/// Children the nexus makes (uring://, malloc:///) are the nexus's: save_config writes no
/// create call of their own, so after a restart the nexus makes them again and nexus_destroy
/// removes them, as before the restart.
#[test]
fn children_the_nexus_made_stay_its_own_across_save_config_and_a_restart() {
    let dir = TempDir::new("nexus-made");
    let d = Daemon::start(&dir, &[]);
    let img = files(&dir, &["u.img"], 8).remove(0);
    let (u, mu) = (uring_uri(&img), "malloc:///Mz?size_mb=8&blk_size=512".to_string());
    let store = dir.join("store.json");
    d.call("nexus_create", Some(json!({"name": "NM", "children": [u, mu], "store": store})));
    let made = |d: &Daemon| {
        let names = d.bdev_names();
        (names.iter().any(|n| n == img.to_str().unwrap()), names.iter().any(|n| n == "Mz"))
    };
    assert_eq!(made(&d), (true, true));
    let saved = d.call("save_config", None);
    assert!(common::saved_entries(&saved, "bdev_uring_create").is_empty(), "{saved}");
    assert!(common::saved_entries(&saved, "bdev_malloc_create").is_empty(), "{saved}");
    assert_eq!(common::saved_entries(&saved, "nexus_create").len(), 1, "{saved}");
    drop(d);
    let cfg = dir.write_json("saved.json", &saved);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    assert_eq!(nexus(&d2, "NM")["state"], "online");
    assert_eq!(made(&d2), (true, true));
    assert_eq!(d2.call("nexus_destroy", Some(json!({"name": "NM"}))), json!(true));
    assert_eq!(made(&d2), (false, false), "{:?}", d2.bdev_names());
    d2.assert_serving();
}

#[test]
fn an_nvmf_child_over_a_second_daemon_takes_the_writes_and_serves_reads() {
    if !have("an_nvmf_child_over_a_second_daemon_takes_the_writes_and_serves_reads", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nexus-nvmf");
    let nqn = "nqn.2019-05.io.openebs:replica1";
    let port = nbd_common::free_port();
    let t = Daemon::start_with(&dir, "target.sock", "0x1", &["--no-pin"]);
    t.call("bdev_malloc_create", Some(json!({"name": "R1", "num_blocks": 32768, "block_size": 512})));
    t.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    t.call("nvmf_create_subsystem", Some(json!({"nqn": nqn, "allow_any_host": true, "serial_number": "NEXUS01"})));
    t.call("nvmf_subsystem_add_ns", Some(json!({"nqn": nqn, "namespace": {"bdev_name": "R1"}})));
    t.call(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string()}})),
    );
    let d = Daemon::start_with(&dir, "nexus.sock", "0x1", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "L0", "num_blocks": 32768, "block_size": 512})));
    let remote = format!("nvmf://127.0.0.1:{port}/{nqn}");
    let store = dir.join("store.json");
    d.call(
        "nexus_create",
        Some(json!({"name": "NV", "size": 16 * MIB, "children": ["bdev:///L0", remote], "local_first": true,
            "store": store.to_str().unwrap()})),
    );
    let n = nexus(&d, "NV");
    assert_eq!(n["state"], "online", "{n}");
    let u = export_nbd(&d, "NV", "nv");
    qemu_io_script(&dir, &u, "write -P 0x71 0 8M; write -P 0x72 8M 8M; flush; read -P 0x71 0 8M");
    // With the local child out, every read comes from the remote one.
    d.call("nexus_fault_child", Some(json!({"name": "NV", "uri": "bdev:///L0"})));
    qemu_io_script(&dir, &u, "read -P 0x71 0 8M; read -P 0x72 8M 8M; write -P 0x73 1M 1M; read -P 0x73 1M 1M");
    d.call("nexus_online_child", Some(json!({"name": "NV", "uri": "bdev:///L0"})));
    let st = wait_rebuilt(&d, "NV", "bdev:///L0", Duration::from_secs(30));
    assert_eq!((st["state"].as_str(), st["is_partial"].as_bool()), (Some("completed"), Some(true)), "{st}");
    assert_eq!(st["source"], remote, "{st}");
    d.call("nexus_fault_child", Some(json!({"name": "NV", "uri": remote})));
    qemu_io_script(&dir, &u, "read -P 0x71 0 1M; read -P 0x73 1M 1M; read -P 0x71 2M 6M; read -P 0x72 8M 8M");
    d.call("nbd_server_remove_export", Some(json!({"name": "nv"})));
    assert_eq!(d.call("nexus_destroy", Some(json!({"name": "NV"}))), json!(true));
    assert_eq!(d.call("bdev_nvme_get_controllers", None), json!([]), "the attach made for the child is gone");
    d.assert_serving();
    t.assert_serving();
}

#[test]
fn while_the_store_is_unreachable_only_writes_a_child_missed_wait_then_fail() {
    let test = "while_the_store_is_unreachable_only_writes_a_child_missed_wait_then_fail";
    if !have(test, &["qemu-io", "etcd"]) {
        return;
    }
    let edir = TempDir::new("nexus-etcd-gone");
    let e = start_etcd(&edir);
    let s = setup("nexus-store-gone", Some(&format!("etcd://{}", e.1)));
    let (d, dir) = (&s.d, &s.dir);
    qemu_io_script(dir, &s.nbd, "write -P 0x81 0 4M; flush");
    drop(e);
    // Every child takes these: they complete as usual without the store.
    let t0 = Instant::now();
    qemu_io_script(dir, &s.nbd, "write -P 0x82 0 1M; flush; read -P 0x82 0 1M");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // A write the third child misses cannot be acknowledged before the store records it: it
    // waits (bounded) and fails.
    d.call(
        "bdev_error_inject_error",
        Some(json!({"name": "EE_U2", "io_type": "write", "error_type": "failure", "num": 1000})),
    );
    let t0 = Instant::now();
    let (ok, out) = nbd_common::try_qemu_io(dir, &s.nbd, "write -P 0x83 2M 64k");
    let waited = t0.elapsed();
    assert!(!ok, "the write fails: {out}");
    assert!(waited >= Duration::from_secs(9), "it waited for the store: {waited:?}");
    let n = nexus(d, "NX");
    assert_eq!(child(&n, "bdev:///EE_U2")["state"], "faulted", "{n}");
    d.assert_serving();
}

/// SPDK's bdevperf (`-w verify`) over NVMe/TCP to a published nexus while one child starts
/// failing its writes mid-run: bdevperf sees no failed I/O and no miscompare; the child is
/// faulted, then rebuilt, and every child holds the same bytes.
#[test]
fn spdk_bdevperf_verifies_over_nvmf_to_a_published_nexus_while_a_child_fails() {
    let test = "spdk_bdevperf_verifies_over_nvmf_to_a_published_nexus_while_a_child_fails";
    let spdk = match common::spdk_dir() {
        Ok(d) => d,
        Err(why) => {
            println!("SKIP {test}: {why}");
            return;
        }
    };
    let s = setup("nexus-bdevperf", None);
    let (d, dir) = (&s.d, &s.dir);
    let port = nbd_common::free_port();
    let uri = d.call("nexus_publish", Some(json!({"name": "NX", "trsvcid": port.to_string()})));
    let nqn = uri.as_str().and_then(|u| u.rsplit('/').next()).unwrap_or_else(|| panic!("{uri}")).to_string();
    common::bdevperf_verify_over_nvmf(&spdk, dir, port, &nqn, 4096, 8, Duration::from_secs(4), || {
        d.call(
            "bdev_error_inject_error",
            Some(json!({"name": "EE_U2", "io_type": "write", "error_type": "failure", "num": 1000000})),
        );
    });
    let n = nexus(d, "NX");
    let c = child(&n, "bdev:///EE_U2");
    assert!(c["state"] == "faulted" && c["reason"].as_str().unwrap().starts_with("io_error"), "{n}");
    d.call("bdev_error_inject_error", Some(json!({"name": "EE_U2", "io_type": "clear", "error_type": "failure"})));
    d.call("nexus_online_child", Some(json!({"name": "NX", "uri": "bdev:///EE_U2"})));
    let st = wait_rebuilt(d, "NX", "bdev:///EE_U2", Duration::from_secs(60));
    assert_eq!(st["state"], "completed", "{st}");
    for f in &s.files[1..3] {
        same_bytes(&s.files[0], f);
    }
    d.assert_serving();
}

/// A daemon exporting a malloc bdev `bdev` of 16 MiB over NVMe/TCP as `nqn`; its port.
fn nvmf_target(t: &Daemon, bdev: &str, nqn: &str) -> u16 {
    t.call("bdev_malloc_create", Some(json!({"name": bdev, "num_blocks": 32768, "block_size": 512})));
    common::nvmf_export(t, bdev, nqn)
}

#[test]
fn a_nexus_preempted_by_a_new_one_is_fenced_off_the_remote_child() {
    let test = "a_nexus_preempted_by_a_new_one_is_fenced_off_the_remote_child";
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nexus-fence");
    let nqn = "nqn.2019-05.io.openebs:fenced";
    let t = Daemon::start_with(&dir, "target.sock", "0x1", &["--no-pin"]);
    let port = nvmf_target(&t, "R", nqn);
    let remote = format!("nvmf://127.0.0.1:{port}/{nqn}");
    let store = |n: &str| dir.join(&format!("store-{n}.json")).to_str().unwrap().to_string();
    // The first nexus, on daemon A: a local child and the remote one, key 0xa1.
    let a = Daemon::start_with(&dir, "a.sock", "0x1", &["--no-pin"]);
    a.call("bdev_malloc_create", Some(json!({"name": "LA", "num_blocks": 32768, "block_size": 512})));
    a.call(
        "nexus_create",
        Some(json!({"name": "N1", "size": 16 * MIB, "children": ["bdev:///LA", remote], "resv_key": 0xa1,
            "store": store("a")})),
    );
    let ua = export_nbd(&a, "N1", "n1");
    qemu_io_script(&dir, &ua, "write -P 0x11 0 4M; flush; read -P 0x11 0 4M");
    // Daemon B: a nexus that asks for an exclusive reservation without preempting is refused
    // (A holds one), and leaves nothing attached behind.
    let b = Daemon::start_with(&dir, "b.sock", "0x1", &["--no-pin"]);
    let e = b.call_err(
        "nexus_create",
        Some(json!({"name": "N2", "children": [remote], "resv_key": 0xb2, "resv_type": 1, "store": store("b")})),
    );
    assert_eq!(e.code, -libc::EACCES, "{e:?}");
    assert!(e.message.contains("reservation acquire"), "{e:?}");
    assert_eq!(b.call("bdev_nvme_get_controllers", None), json!([]));
    // With A's key to preempt, B's nexus takes the reservation.
    b.call(
        "nexus_create",
        Some(json!({"name": "N2", "children": [remote], "resv_key": 0xb2, "preempt_key": 0xa1, "store": store("b")})),
    );
    assert_eq!(nexus(&b, "N2")["state"], "online");
    let ub = export_nbd(&b, "N2", "n2");
    qemu_io_script(&dir, &ub, "read -P 0x11 0 4M; write -P 0x22 0 2M; flush; read -P 0x22 0 2M");
    // A, which does not know it was replaced, writes: the remote child refuses (reservation
    // conflict) and is faulted for it; the write completes on A's local child alone.
    qemu_io_script(&dir, &ua, "write -P 0x33 0 1M; write -P 0x34 3M 1M; flush; read -P 0x33 0 1M; read -P 0x34 3M 1M");
    let n = nexus(&a, "N1");
    let c = child(&n, &remote);
    assert_eq!(c["state"], "faulted", "{n}");
    assert!(c["reason"].as_str().unwrap().starts_with("reservation_conflict"), "{n}");
    assert_eq!(n["state"], "degraded", "{n}");
    // Nothing of A's reached the remote child: B reads its own data and A's from before.
    qemu_io_script(&dir, &ub, "read -P 0x22 0 2M; read -P 0x11 2M 2M; read -P 0x11 4M 0");
    // A cannot bring the child back by onlining it.
    let e = a.call_err("nexus_online_child", Some(json!({"name": "N1", "uri": remote})));
    assert_eq!(e.code, -libc::EACCES, "{e:?}");
    // B's nexus keeps serving; what it wrote reads back after A's attempts.
    qemu_io_script(&dir, &ub, "write -P 0x44 1M 1M; flush; read -P 0x22 0 1M; read -P 0x44 1M 1M; read -P 0x11 2M 2M");
    // save_config keeps the keys.
    let saved = b.call("save_config", None);
    let entries = common::saved_entries(&saved, "nexus_create");
    assert_eq!(
        (&entries[0]["params"]["resv_key"], &entries[0]["params"]["preempt_key"], &entries[0]["params"]["resv_type"]),
        (&json!(0xb2), &json!(0xa1), &json!(5)),
        "{saved}"
    );
    for (d, e, n) in [(&a, "n1", "N1"), (&b, "n2", "N2")] {
        d.call("nbd_server_remove_export", Some(json!({"name": e})));
        assert_eq!(d.call("nexus_destroy", Some(json!({"name": n}))), json!(true));
        d.assert_serving();
    }
    // B's destroy left the reservation: a third nexus takes it without preempting.
    b.call(
        "nexus_create",
        Some(json!({"name": "N3", "children": [remote], "resv_key": 0xc3, "resv_type": 1, "store": store("c")})),
    );
    assert_eq!(nexus(&b, "N3")["state"], "online");
    t.assert_serving();
}

/// `host` attaches `uri` (nvmf://addr:port/nqn) as controller `name` and exports its
/// namespace over NBD as `export`; the NBD URI.
fn attach_and_export(host: &Daemon, uri: &str, name: &str, export: &str) -> String {
    let rest = uri.strip_prefix("nvmf://").unwrap();
    let (addr, nqn) = rest.split_once('/').unwrap();
    let (traddr, port) = addr.split_once(':').unwrap();
    let bdevs = host.call(
        "bdev_nvme_attach_controller",
        Some(json!({"name": name, "trtype": "tcp", "adrfam": "ipv4", "traddr": traddr, "trsvcid": port,
            "subnqn": nqn})),
    );
    assert_eq!(bdevs, json!([format!("{name}n1")]));
    export_nbd(host, &format!("{name}n1"), export)
}

#[test]
fn a_published_nexus_serves_a_host_over_nvmf_and_save_config_keeps_the_publication() {
    let test = "a_published_nexus_serves_a_host_over_nvmf_and_save_config_keeps_the_publication";
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("nexus-publish");
    let fs = files(&dir, &["p0.img", "p1.img"], 16);
    let uris = [uring_uri(&fs[0]), uring_uri(&fs[1])];
    let store = dir.join("store.json");
    let uuid = "7e1a0c5d-2b3c-4d5e-8f90-a1b2c3d4e5f6";
    let nqn = format!("nqn.2019-05.io.openebs:{uuid}");
    let a = Daemon::start_with(&dir, "a.sock", "0x1", &["--no-pin"]);
    a.call(
        "nexus_create",
        Some(json!({"name": "NP", "uuid": uuid, "children": uris, "store": store.to_str().unwrap()})),
    );
    // Bad requests first: another protocol, a bad ANA state, an unknown nexus.
    for (p, code) in [
        (json!({"name": "NP", "protocol": "iscsi"}), -32602),
        (json!({"name": "NP", "ana_state": "sideways"}), -32602),
        (json!({"name": "nosuch"}), -libc::ENODEV),
    ] {
        assert_eq!(a.call_err("nexus_publish", Some(p.clone())).code, code, "{p}");
    }
    let port = nbd_common::free_port();
    let uri = a.call("nexus_publish", Some(json!({"name": "NP", "protocol": "nvmf", "trsvcid": port})));
    assert_eq!(uri, json!(format!("nvmf://127.0.0.1:{port}/{nqn}")));
    assert_eq!(nexus(&a, "NP")["published"], json!([uri]));
    let sub = &a.call("nvmf_get_subsystems", Some(json!({"nqn": nqn})))[0];
    assert_eq!((&sub["namespaces"][0]["bdev_name"], &sub["namespaces"][0]["uuid"]), (&json!("NP"), &json!(uuid)));
    // Published under another NQN as well: refused.
    let e = a.call_err("nexus_publish", Some(json!({"name": "NP", "nqn": "nqn.2016-06.io.x:other", "trsvcid": port})));
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    // A host (Ferrite's NVMe/TCP host on another daemon) writes and reads back.
    let h = Daemon::start_with(&dir, "h.sock", "0x1", &["--no-pin"]);
    let u = attach_and_export(&h, uri.as_str().unwrap(), "H0", "h0");
    qemu_io_script(&dir, &u, "write -P 0x5a 0 4M; write -P 0x5b 4M 4M; flush; read -P 0x5a 0 4M; read -P 0x5b 4M 4M");
    // The listener's ANA state moves (the nexus about to move elsewhere); non-optimized still
    // serves.
    a.call("nexus_publish", Some(json!({"name": "NP", "trsvcid": port.to_string(), "ana_state": "non_optimized"})));
    let ls = a.call("nvmf_subsystem_get_listeners", Some(json!({"nqn": nqn})));
    assert_eq!(ls[0]["ana_states"][0]["ana_state"], "non_optimized", "{ls}");
    qemu_io_script(&dir, &u, "read -P 0x5a 0 4M; write -P 0x5c 1M 1M; read -P 0x5c 1M 1M");
    // Each child holds what the host wrote: reads from one, then from the other.
    a.call("nexus_fault_child", Some(json!({"name": "NP", "uri": uris[0]})));
    qemu_io_script(&dir, &u, "read -P 0x5a 0 1M; read -P 0x5c 1M 1M; read -P 0x5a 2M 2M; read -P 0x5b 4M 4M");
    a.call("nexus_online_child", Some(json!({"name": "NP", "uri": uris[0]})));
    wait_rebuilt(&a, "NP", &uris[0], Duration::from_secs(30));
    a.call("nexus_fault_child", Some(json!({"name": "NP", "uri": uris[1]})));
    qemu_io_script(&dir, &u, "read -P 0x5a 0 1M; read -P 0x5c 1M 1M; read -P 0x5a 2M 2M; read -P 0x5b 4M 4M");
    a.call("nexus_online_child", Some(json!({"name": "NP", "uri": uris[1]})));
    wait_rebuilt(&a, "NP", &uris[1], Duration::from_secs(30));
    same_bytes(&fs[0], &fs[1]);
    // save_config keeps the publication (the target's entries, after the nexus's); a restart
    // from it serves the host again with the same data.
    let saved = a.call("save_config", None);
    let subs = common::saved_entries(&saved, "nvmf_create_subsystem");
    assert_eq!((subs.len(), &subs[0]["params"]["nqn"]), (1, &json!(nqn)), "{saved}");
    assert_eq!(common::saved_entries(&saved, "nvmf_subsystem_add_ns")[0]["params"]["namespace"]["bdev_name"], "NP");
    h.call("nbd_server_remove_export", Some(json!({"name": "h0"})));
    h.call("bdev_nvme_detach_controller", Some(json!({"name": "H0"})));
    drop(a);
    let cfg = dir.write_json("saved.json", &saved);
    let a = Daemon::start_with(&dir, "a2.sock", "0x1", &["--no-pin", "--json", cfg.to_str().unwrap()]);
    assert_eq!(nexus(&a, "NP")["published"], json!([uri]));
    let u = attach_and_export(&h, uri.as_str().unwrap(), "H1", "h1");
    qemu_io_script(&dir, &u, "read -P 0x5a 0 1M; read -P 0x5c 1M 1M; read -P 0x5a 2M 2M; read -P 0x5b 4M 4M");
    h.call("nbd_server_remove_export", Some(json!({"name": "h1"})));
    h.call("bdev_nvme_detach_controller", Some(json!({"name": "H1"})));
    // Unpublished: the subsystem goes; destroy unpublishes too.
    assert_eq!(a.call("nexus_unpublish", Some(json!({"name": "NP"}))), json!(true));
    assert_eq!(nexus(&a, "NP")["published"], json!([]));
    assert!(a.call_err("nvmf_get_subsystems", Some(json!({"nqn": nqn}))).code != 0);
    a.call("nexus_publish", Some(json!({"name": "NP", "port": port})));
    assert_eq!(a.call("nexus_destroy", Some(json!({"name": "NP"}))), json!(true));
    assert!(a.call_err("nvmf_get_subsystems", Some(json!({"nqn": nqn}))).code != 0);
    a.assert_serving();
    h.assert_serving();
}
