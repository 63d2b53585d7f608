//! Logical volumes with real clients: an lvstore on a file-backed bdev, a thick and a thin lvol
//! written and read back over NBD with qemu-io, the lvols found again by examine after a clean
//! restart and after a kill -9 (recovery), `ferrite blobstore check` on the file, SPDK's
//! errors for bad requests; and SPDK v26.05's spdk_tgt opening the lvstore Ferrite wrote, with
//! the same names, sizes and data (read with spdk_dd); a grow cut short by kill -9, which both
//! load again; and images no lvstore loads from, for which examine says why.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use ferrite_nbd::proto;
use nbd_common::{have, run_tool};
use serde_json::{json, Value};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// The JSON-RPC code SPDK's lvol methods answer a failed operation with (INVALID_PARAMS).
const FAILED: i32 = -32602;

fn qemu_io(dir: &TempDir, uri: &str, cmd: &str) {
    // `cmd; flush` runs a flush after the command. Reads alone open the export read-only, as
    // they must for a snapshot's (its export says it is read-only, and qemu then refuses to
    // open it for writing).
    let mut args = vec!["-f", "raw"];
    if cmd.split("; ").all(|c| c.starts_with("read ")) {
        args.push("-r");
    }
    for c in cmd.split("; ") {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let out = run_tool(dir, "qemu-io", &args, Duration::from_secs(60));
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(
        out.status.success() && !all.contains("failed") && !all.contains("error") && all.contains(" bytes at offset "),
        "qemu-io {cmd}: {all}"
    );
}

/// A sparse file of `mib` MiB, `disk.img` in `dir`, for an lvstore.
fn sparse_image(dir: &TempDir, mib: u64) -> std::path::PathBuf {
    let img = dir.join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(mib * MIB).unwrap();
    img
}

/// A daemon with the file as bdev U0 (4 KiB blocks), examined.
fn daemon(dir: &TempDir, img: &std::path::Path) -> Daemon {
    let d = Daemon::start(dir, &[]);
    d.call("bdev_uring_create", Some(json!({"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    d
}

/// Stops the daemon cleanly (its lvstores are unloaded) and waits for it.
fn stop(mut d: Daemon) {
    d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    d.proc.expect_exit(Duration::from_secs(15), "clean shutdown");
}

fn lvols(d: &Daemon) -> Vec<Value> {
    let mut v = d.call("bdev_lvol_get_lvols", None).as_array().unwrap().clone();
    v.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
    v
}

fn nbd(d: &Daemon, bdev: &str, name: &str) -> String {
    let s = d.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = s["address"].as_str().unwrap().to_string();
    d.call("nbd_server_add_export", Some(json!({"bdev_name": bdev, "name": name})));
    format!("nbd://{addr}/{name}")
}

/// The port of an `nbd://host:port/name` URI.
fn nbd_port(uri: &str) -> u16 {
    uri.trim_start_matches("nbd://").split(['/', ':']).nth(1).unwrap().parse().unwrap()
}

/// The free clusters of the daemon's first lvstore.
fn free_clusters(d: &Daemon) -> u64 {
    d.call("bdev_lvol_get_lvstores", None)[0]["free_clusters"].as_u64().unwrap()
}

/// A sparse file of `mib` MiB as U0 in a new daemon, with lvstore lvs0 of 1 MiB clusters on it.
fn store_of_1mib_clusters(dir: &TempDir, mib: u64) -> (std::path::PathBuf, Daemon) {
    let img = sparse_image(dir, mib);
    let d = daemon(dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    (img, d)
}

fn check(dir: &TempDir, img: &std::path::Path) -> (bool, String) {
    let out = run_tool(dir, common::FERRITE, &["blobstore", "check", img.to_str().unwrap()], Duration::from_secs(30));
    (out.status.success(), format!("{}{}", out.stdout, out.stderr))
}

#[test]
fn lvols_written_over_nbd_come_back_after_restarts() {
    if !have("lvols_written_over_nbd_come_back_after_restarts", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol");
    let img = sparse_image(&dir, 256);
    let d = daemon(&dir, &img);
    let uuid = d.call(
        "bdev_lvol_create_lvstore",
        Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB, "clear_method": "unmap"})),
    );
    let lvs = d.call("bdev_lvol_get_lvstores", None);
    assert_eq!(lvs[0]["uuid"], uuid);
    assert_eq!((lvs[0]["cluster_size"].as_u64(), lvs[0]["block_size"].as_u64()), (Some(MIB), Some(4096)));
    let data_clusters = lvs[0]["total_data_clusters"].as_u64().unwrap();
    assert_eq!(lvs[0]["free_clusters"].as_u64(), Some(data_clusters));
    let thick = d.call("bdev_lvol_create", Some(json!({"lvol_name": "thick", "size_in_mib": 16, "lvs_name": "lvs0"})));
    let thin = d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "thin", "size_in_mib": 64, "uuid": uuid, "thin_provision": true})),
    );
    let lvs = d.call("bdev_lvol_get_lvstores", Some(json!({"lvs_name": "lvs0"})));
    assert_eq!(lvs[0]["free_clusters"].as_u64(), Some(data_clusters - 16), "a thick lvol takes its clusters");
    // bdev_get_bdevs: named by UUID, aliased lvs/lvol, SPDK's driver_specific.
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/thin"})));
    assert_eq!(b[0]["name"], thin);
    assert_eq!(b[0]["uuid"], thin);
    assert!(b[0]["aliases"].as_array().unwrap().contains(&json!("lvs0/thin")), "{b}");
    assert_eq!(b[0]["num_blocks"].as_u64(), Some(64 * MIB / 4096));
    assert_eq!(b[0]["driver_specific"]["lvol"]["lvol_store_uuid"], uuid);
    assert_eq!(b[0]["driver_specific"]["lvol"]["thin_provision"], json!(true));
    // Data through NBD: writes allocate the thin lvol's clusters; the rest reads as zeroes.
    let u_thin = nbd(&d, "lvs0/thin", "thin");
    let u_thick = u_thin.replace("/thin", "/thick");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": thick, "name": "thick"})));
    qemu_io(&dir, &u_thin, "write -P 0xab 1M 3M");
    qemu_io(&dir, &u_thin, "write -P 0xcd 40M 512k");
    qemu_io(&dir, &u_thin, "read -P 0xab 1M 3M");
    qemu_io(&dir, &u_thin, "read -P 0 8M 1M");
    qemu_io(&dir, &u_thick, "write -P 0x5a 0 16M");
    let l = lvols(&d);
    assert_eq!(l.len(), 2);
    assert_eq!((l[1]["alias"].as_str(), l[1]["num_allocated_clusters"].as_u64()), (Some("lvs0/thin"), Some(4)));
    assert_eq!(l[1]["is_thin_provisioned"], json!(true));
    assert_eq!(l[0]["num_allocated_clusters"].as_u64(), Some(16));
    // A clean restart: examine finds the lvstore and its lvols, data and all.
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok && out.contains("clean"), "after a clean shutdown: {out}");
    let mut d = daemon(&dir, &img);
    assert_eq!(lvols(&d), l, "the same lvols after a restart");
    let u_thin = nbd(&d, "lvs0/thin", "thin");
    qemu_io(&dir, &u_thin, "read -P 0xab 1M 3M");
    qemu_io(&dir, &u_thin, "read -P 0xcd 40M 512k");
    // Grow the thin lvol, write past the old end, delete the thick one; then kill -9.
    assert_eq!(d.call("bdev_lvol_resize", Some(json!({"name": "lvs0/thin", "size_in_mib": 96}))), json!(true));
    let b = d.call("bdev_get_bdevs", Some(json!({"name": thin})));
    assert_eq!(b[0]["num_blocks"].as_u64(), Some(96 * MIB / 4096));
    let u_thin = {
        d.call("nbd_server_remove_export", Some(json!({"name": "thin"})));
        d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/thin", "name": "thin"})));
        u_thin
    };
    // A flush (qemu-io's, through NBD) makes it durable before the kill.
    qemu_io(&dir, &u_thin, "write -P 0x77 80M 1M; flush");
    assert_eq!(d.call("bdev_lvol_delete", Some(json!({"name": "lvs0/thick"}))), json!(true));
    d.proc.signal(libc::SIGKILL);
    d.proc.expect_exit(Duration::from_secs(10), "killed");
    let out = run_tool(&dir, common::FERRITE, &["blobstore", "check", img.to_str().unwrap()], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(3), "after kill -9: dirty, only what the load repairs: {}", out.stdout);
    assert!(out.stdout.contains("not clean"), "{}", out.stdout);
    // The load recovers; everything flushed is there.
    let d = daemon(&dir, &img);
    assert!(d.proc.stderr().contains("recovering"), "{}", d.proc.stderr());
    let l = lvols(&d);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["alias"], json!("lvs0/thin"));
    let u_thin = nbd(&d, "lvs0/thin", "thin");
    qemu_io(&dir, &u_thin, "read -P 0x77 80M 1M");
    qemu_io(&dir, &u_thin, "read -P 0xab 1M 3M");
    let lvs = d.call("bdev_lvol_get_lvstores", None);
    assert_eq!(lvs[0]["free_clusters"].as_u64(), Some(data_clusters - 5), "the thick lvol's clusters are free");
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "after recovery and a clean shutdown: {out}");
}

/// qemu-io `cmd` must fail (a write to a read-only lvol).
fn qemu_io_fails(dir: &TempDir, uri: &str, cmd: &str) {
    let out = run_tool(dir, "qemu-io", &["-f", "raw", "-c", cmd, uri], Duration::from_secs(60));
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("failed") || !out.status.success(), "qemu-io {cmd} should fail: {all}");
}

fn lvol_named<'a>(l: &'a [Value], name: &str) -> &'a Value {
    l.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no lvol {name} in {l:?}"))
}

#[test]
fn snapshots_and_clones_over_nbd() {
    if !have("snapshots_and_clones_over_nbd", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-snap");
    let img = sparse_image(&dir, 128);
    let d = daemon(&dir, &img);
    d.call(
        "bdev_lvol_create_lvstore",
        Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB, "clear_method": "unmap"})),
    );
    let free0 = free_clusters(&d);
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "base", "size_in_mib": 16, "lvs_name": "lvs0", "thin_provision": true})),
    );
    let u = nbd(&d, "lvs0/base", "base");
    qemu_io(&dir, &u, "write -P 0xaa 0 8M; flush");
    // The snapshot holds the data; the lvol becomes its clone.
    let snap = d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/base", "snapshot_name": "snap"})));
    let l = lvols(&d);
    assert_eq!(
        (lvol_named(&l, "snap")["uuid"].clone(), lvol_named(&l, "snap")["is_snapshot"].clone()),
        (snap.clone(), json!(true))
    );
    assert_eq!(lvol_named(&l, "base")["is_clone"], json!(true));
    assert_eq!(lvol_named(&l, "base")["num_allocated_clusters"].as_u64(), Some(0));
    assert_eq!(lvol_named(&l, "snap")["num_allocated_clusters"].as_u64(), Some(8));
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/base"})));
    assert_eq!(b[0]["driver_specific"]["lvol"]["base_snapshot"], json!("snap"), "{b}");
    assert_eq!(b[0]["driver_specific"]["lvol"]["clone"], json!(true));
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/snap"})));
    assert_eq!(b[0]["driver_specific"]["lvol"]["clones"], json!(["base"]), "{b}");
    assert_eq!(b[0]["driver_specific"]["lvol"]["snapshot"], json!(true));
    // A partial write to the clone copies the rest of its cluster from the snapshot.
    qemu_io(&dir, &u, "write -P 0xbb 1M 64k; flush");
    qemu_io(&dir, &u, "read -P 0xaa 0 1M");
    qemu_io(&dir, &u, "read -P 0xbb 1M 64k");
    qemu_io(&dir, &u, "read -P 0xaa 1088k 960k");
    qemu_io(&dir, &u, "read -P 0 8M 8M");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/snap", "name": "snap"})));
    let us = u.replace("/base", "/snap");
    qemu_io(&dir, &us, "read -P 0xaa 0 8M");
    qemu_io_fails(&dir, &us, "write -P 0x11 0 4k");
    // The snapshot takes no writes, so its export says it is read-only.
    if have("snapshots_and_clones_over_nbd (nbdinfo part)", &["nbdinfo"]) {
        let out = run_tool(&dir, "nbdinfo", &["--json", &us], Duration::from_secs(20));
        out.assert_ok("nbdinfo --json of the snapshot's export");
        let info: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
        let e = &info["exports"][0];
        assert_eq!((e["is_read_only"].clone(), e["can_trim"].clone()), (json!(true), json!(false)), "{info}");
    }
    // A clone of the snapshot writes on its own.
    let e = d.call_err("bdev_lvol_clone", Some(json!({"snapshot_name": "lvs0/base", "clone_name": "x"})));
    assert_eq!(e.code, FAILED, "only a read-only lvol is cloned: {e:?}");
    d.call("bdev_lvol_clone", Some(json!({"snapshot_name": "lvs0/snap", "clone_name": "cl"})));
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/cl", "name": "cl"})));
    let uc = u.replace("/base", "/cl");
    qemu_io(&dir, &uc, "write -P 0xcc 4M 4k; flush");
    qemu_io(&dir, &uc, "read -P 0xaa 0 4M");
    qemu_io(&dir, &uc, "read -P 0xcc 4M 4k");
    qemu_io(&dir, &u, "read -P 0xaa 4M 4k");
    let e = d.call_err("bdev_lvol_delete", Some(json!({"name": "lvs0/snap"})));
    // SPDK's bdev_lvol_delete answers a failed delete with -32603.
    assert_eq!((e.code, e.message.contains("2 clones")), (-32603, true), "a snapshot with two clones stays: {e:?}");
    let e = d.call_err("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/cl", "snapshot_name": "base"})));
    assert_eq!((e.code, e.message.contains("exists")), (FAILED, true), "{e:?}");
    // Renames: the lvol's alias and every alias of a renamed lvstore.
    d.call("bdev_lvol_rename", Some(json!({"old_name": "lvs0/cl", "new_name": "cl2"})));
    d.call("bdev_lvol_rename_lvstore", Some(json!({"old_name": "lvs0", "new_name": "lvs1"})));
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs1/cl2"})));
    assert!(b[0]["aliases"].as_array().unwrap().contains(&json!("lvs1/cl2")), "{b}");
    assert_eq!(d.call_err("bdev_get_bdevs", Some(json!({"name": "lvs0/cl"}))).code, -libc::ENODEV);
    // A clean restart: the same family, names and bytes.
    let before = lvols(&d);
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
    let d2 = daemon(&dir, &img);
    assert_eq!(lvols(&d2), before);
    let u = nbd(&d2, "lvs1/base", "base");
    qemu_io(&dir, &u, "read -P 0xbb 1M 64k");
    qemu_io(&dir, &u, "read -P 0xaa 1088k 960k");
    d2.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs1/cl2", "name": "cl"})));
    qemu_io(&dir, &u.replace("/base", "/cl"), "read -P 0xcc 4M 4k");
    // The clone goes; then the snapshot, whose last clone takes its clusters.
    d2.call("nbd_server_remove_export", Some(json!({"name": "cl"})));
    assert_eq!(d2.call("bdev_lvol_delete", Some(json!({"name": "lvs1/cl2"}))), json!(true));
    assert_eq!(d2.call("bdev_lvol_delete", Some(json!({"name": "lvs1/snap"}))), json!(true));
    let l = lvols(&d2);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!((l[0]["is_clone"].clone(), l[0]["num_allocated_clusters"].as_u64()), (json!(false), Some(8)));
    qemu_io(&dir, &u, "read -P 0xaa 0 1M");
    qemu_io(&dir, &u, "read -P 0xbb 1M 64k");
    qemu_io(&dir, &u, "read -P 0xaa 1088k 7104k");
    let free = d2.call("bdev_lvol_get_lvstores", None)[0]["free_clusters"].as_u64().unwrap();
    assert_eq!(free, free0 - 8, "no cluster leaked");
    // Snapshot again, then decouple (no grandparent: no parent left) and inflate (thick).
    d2.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs1/base", "snapshot_name": "s2"})));
    qemu_io(&dir, &u, "write -P 0xdd 0 4k; flush");
    d2.call("bdev_lvol_decouple_parent", Some(json!({"name": "lvs1/base"})));
    let l = lvols(&d2);
    assert_eq!(
        (lvol_named(&l, "base")["is_clone"].clone(), lvol_named(&l, "s2")["is_snapshot"].clone()),
        (json!(false), json!(false))
    );
    qemu_io(&dir, &u, "read -P 0xdd 0 4k");
    qemu_io(&dir, &u, "read -P 0xaa 4k 1020k");
    d2.call("bdev_lvol_inflate", Some(json!({"name": "lvs1/base"})));
    let l = lvols(&d2);
    assert_eq!(lvol_named(&l, "base")["is_thin_provisioned"], json!(false));
    assert_eq!(lvol_named(&l, "base")["num_allocated_clusters"].as_u64(), Some(16));
    qemu_io(&dir, &u, "read -P 0xbb 1M 64k");
    qemu_io(&dir, &u, "read -P 0 8M 8M");
    // A new thin lvol takes the snapshot as parent and reads it.
    d2.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "t", "size_in_mib": 16, "lvs_name": "lvs1", "thin_provision": true})),
    );
    d2.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "t8", "size_in_mib": 8, "lvs_name": "lvs1", "thin_provision": true})),
    );
    let e = d2.call_err("bdev_lvol_set_parent", Some(json!({"lvol_name": "lvs1/t", "parent_name": "lvs1/base"})));
    assert_eq!(e.code, FAILED, "the parent must be read-only: {e:?}");
    let e = d2.call_err("bdev_lvol_set_parent", Some(json!({"lvol_name": "lvs1/t8", "parent_name": "lvs1/s2"})));
    assert_eq!(e.code, FAILED, "sizes differ: {e:?}");
    d2.call("bdev_lvol_set_parent", Some(json!({"lvol_name": "lvs1/t", "parent_name": "lvs1/s2"})));
    assert_eq!(lvol_named(&lvols(&d2), "t")["is_clone"], json!(true));
    d2.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs1/t", "name": "t"})));
    let ut = u.replace("/base", "/t");
    qemu_io(&dir, &ut, "read -P 0xaa 0 1M");
    qemu_io(&dir, &ut, "read -P 0xbb 1M 64k");
    qemu_io(&dir, &ut, "read -P 0 8M 8M");
    // Read-only: writes fail from then on, also on a connection opened before.
    let port = nbd_port(&u);
    let (mut raw, _) = nbd_common::Raw::open(port, "base", false);
    raw.write_ok(1, 0, &[0xdd; 4096], 0);
    d2.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs1/base"})));
    raw.request(0, proto::CMD_WRITE, 2, 0, 4096, &[0x11; 4096]);
    assert_eq!(raw.simple_reply(), (proto::EPERM, 2), "a write on the connection opened before");
    raw.request(0, proto::CMD_WRITE_ZEROES, 3, 0, 4096, &[]);
    assert_eq!(raw.simple_reply(), (proto::EPERM, 3), "write zeroes on the connection opened before");
    assert_eq!(raw.read_ok(4, 0, 4096), vec![0xdd; 4096], "the refused writes changed nothing");
    raw.disc();
    let exports = d2.call("nbd_server_get_exports", None);
    let base = exports.as_array().unwrap().iter().find(|e| e["name"] == "base").unwrap();
    assert_eq!(base["read_only"], json!(true), "the export of a read-only lvol says so: {exports}");
    let b = d2.call("bdev_get_bdevs", Some(json!({"name": "lvs1/base"})));
    let types = &b[0]["supported_io_types"];
    assert_eq!(
        (types["read"].clone(), types["write"].clone(), types["unmap"].clone()),
        (json!(true), json!(false), json!(false)),
        "{b}"
    );
    qemu_io_fails(&dir, &u, "write -P 0x11 0 4k");
    qemu_io(&dir, &u, "read -P 0xdd 0 4k");
    d2.assert_serving();
    drop(d2);
}

#[test]
fn a_thick_lvol_writes_to_new_clusters_after_a_snapshot() {
    // A thick lvol's channel computes where its back-to-back clusters start. A snapshot moves
    // those clusters to the snapshot under a connection that stays open (its channel too):
    // the lvol's next writes must go to new clusters, not over the snapshot's.
    if !have("a_thick_lvol_writes_to_new_clusters_after_a_snapshot", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-thick-snap");
    let (_img, d) = store_of_1mib_clusters(&dir, 64);
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "vol", "size_in_mib": 4, "lvs_name": "lvs0"})));
    let u = nbd(&d, "lvs0/vol", "vol");
    let port = nbd_port(&u);
    let (mut raw, _) = nbd_common::Raw::open(port, "vol", false);
    let m = MIB as usize;
    let before: Vec<u8> = (0..4 * m).map(|i| 0x10 + (i / m) as u8).collect();
    for (n, chunk) in before.chunks(256 << 10).enumerate() {
        raw.write_ok(n as u64, (n * chunk.len()) as u64, chunk, 0);
    }
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/vol", "snapshot_name": "snap"})));
    raw.write_ok(100, MIB, &[0x44; 4096], 0);
    raw.write_ok(101, 3 * MIB + 8192, &[0x55; 4096], 0);
    let mut after = before.clone();
    after[m..m + 4096].fill(0x44);
    after[3 * m + 8192..3 * m + 12288].fill(0x55);
    for c in 0..4 {
        assert_eq!(
            raw.read_ok(200 + c, c * MIB, MIB as u32),
            after[c as usize * m..(c as usize + 1) * m],
            "lvol cluster {c}"
        );
    }
    raw.disc();
    let s = nbd(&d, "lvs0/snap", "snap");
    qemu_io(&dir, &s, "read -P 0x10 0 1M; read -P 0x11 1M 1M; read -P 0x12 2M 1M; read -P 0x13 3M 1M");
    assert_eq!(lvol_named(&lvols(&d), "vol")["num_allocated_clusters"].as_u64(), Some(2));
    stop(d);
}

#[test]
fn racing_first_writes_into_one_cluster_of_a_thin_lvol() {
    // Writes to different blocks of clusters not yet allocated, all in flight at once (qemu-io's
    // aio_write over one NBD connection): the first write to a cluster allocates it and the
    // others wait for it and land in the same cluster. Every block reads back, the rest of each
    // cluster reads as zeroes, one cluster per cluster written is allocated, and all of it is
    // there again after a restart.
    if !have("racing_first_writes_into_one_cluster_of_a_thin_lvol", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-race");
    let img = sparse_image(&dir, 64);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "r", "cluster_sz": MIB})));
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "t", "size_in_mib": 16, "lvs_name": "r", "thin_provision": true})),
    );
    let u = nbd(&d, "r/t", "t");
    // Clusters 1, 2, 5 and 6; eight blocks in each, spread over the cluster, each its own pattern.
    let blocks: Vec<(u64, u8)> = [1u64, 2, 5, 6]
        .iter()
        .flat_map(|&c| (0..8u64).map(move |k| (c * MIB + k * (MIB / 8) + (k % 3) * 4096, (0x10 + c * 8 + k) as u8)))
        .collect();
    let mut writes: Vec<String> = blocks.iter().map(|(off, p)| format!("aio_write -P {p} {off} 4k")).collect();
    writes.push("aio_flush".into());
    qemu_io(&dir, &u, &writes.join("; "));
    let reads = |u: &str| {
        let mut r: Vec<String> = blocks.iter().map(|(off, p)| format!("read -P {p} {off} 4k")).collect();
        // The block after each written one is zeroes (none of the writes overlap it).
        r.extend(blocks.iter().map(|(off, _)| format!("read -P 0 {} 4k", off + 4096)));
        // Clusters never written read as zeroes.
        r.push(format!("read -P 0 0 {MIB}"));
        r.push(format!("read -P 0 {} {}", 3 * MIB, 2 * MIB));
        qemu_io(&dir, u, &r.join("; "));
    };
    reads(&u);
    let l = lvols(&d);
    assert_eq!(l[0]["num_allocated_clusters"], json!(4), "one cluster per cluster written: {l:?}");
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "the lvstore checks clean after the racing writes: {out}");
    let d = daemon(&dir, &img);
    let u = nbd(&d, "r/t", "t");
    reads(&u);
    assert_eq!(lvols(&d)[0]["num_allocated_clusters"], json!(4));
    d.assert_serving();
}

#[test]
fn copy_on_write_on_a_malloc_base() {
    // A malloc base copies clusters itself (the bdev's copy request): a clone's first partial
    // write keeps the rest of the cluster from the snapshot.
    if !have("copy_on_write_on_a_malloc_base", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-cow-malloc");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "m", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "v", "size_in_mib": 8, "lvs_name": "m"})));
    let u = nbd(&d, "m/v", "v");
    qemu_io(&dir, &u, "write -P 0x71 0 8M");
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "m/v", "snapshot_name": "s"})));
    qemu_io(&dir, &u, "write -P 0x72 3M 4k");
    qemu_io(&dir, &u, "read -P 0x71 0 3M");
    qemu_io(&dir, &u, "read -P 0x72 3M 4k");
    qemu_io(&dir, &u, "read -P 0x71 3076k 1020k");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "m/s", "name": "s"})));
    qemu_io(&dir, &u.replace("/v", "/s"), "read -P 0x71 0 8M");
    d.assert_serving();
}

#[test]
fn reads_across_clusters_of_a_malloc_base() {
    // Malloc lends its memory for zero-copy reads (NBD's): a read across a cluster boundary must
    // still be split there, or its second part comes from the blocks after the first cluster
    // (another lvol's). Thin lvols written in turns so that no lvol's clusters are adjacent;
    // a power-of-two cluster and one that is not.
    if !have("reads_across_clusters_of_a_malloc_base", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-span-malloc");
    let d = Daemon::start(&dir, &[]);
    for (m, lvs, c) in [("M0", "p", MIB), ("M1", "q", 12288)] {
        d.call("bdev_malloc_create", Some(json!({"name": m, "num_blocks": 4096, "block_size": 4096})));
        d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": m, "lvs_name": lvs, "cluster_sz": c})));
        for v in ["x", "y"] {
            let p = json!({"lvol_name": v, "size_in_mib": 4, "lvs_name": lvs, "thin_provision": true});
            d.call("bdev_lvol_create", Some(p));
        }
        let ux = nbd(&d, &format!("{lvs}/x"), &format!("{lvs}x"));
        let uy = nbd(&d, &format!("{lvs}/y"), &format!("{lvs}y"));
        // x: clusters 0 and 1 with 0x41, 3 with 0x43; y: cluster 0 with 0x42, in between.
        qemu_io(&dir, &ux, &format!("write -P 0x41 0 {c}"));
        qemu_io(&dir, &uy, &format!("write -P 0x42 0 {c}"));
        qemu_io(&dir, &ux, &format!("write -P 0x41 {c} {c}"));
        qemu_io(&dir, &ux, &format!("write -P 0x43 {} {c}", 3 * c));
        // Each read below crosses at least one cluster boundary in one request.
        qemu_io(&dir, &ux, &format!("read -P 0x41 0 {}", 2 * c));
        qemu_io(&dir, &ux, &format!("read -P 0x41 {} 8k", c - 4096));
        qemu_io(&dir, &ux, &format!("read -P 0 {} {c}", 2 * c));
        qemu_io(&dir, &ux, &format!("read -P 0 {} 8k", 3 * c - 4096 - 4096));
        qemu_io(&dir, &ux, &format!("read -P 0x43 {} {c}", 3 * c));
        qemu_io(&dir, &uy, &format!("read -P 0x42 0 {c}"));
        qemu_io(&dir, &uy, &format!("read -P 0 {c} {}", 3 * c));
        qemu_io(&dir, &uy, &format!("read -P 0x42 {} 4k", c - 4096));
        qemu_io(&dir, &uy, &format!("read -P 0 {c} 8k"));
    }
    d.assert_serving();
}

#[test]
fn bad_lvol_requests_get_spdks_errors() {
    let dir = TempDir::new("lvol-bad");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})));
    d.call("bdev_malloc_create", Some(json!({"name": "Tiny", "num_blocks": 64, "block_size": 4096})));
    let e =
        d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "x", "cluster_sz": 6000})));
    assert_eq!(e.code, -libc::EINVAL, "cluster size not a multiple of the block: {e:?}");
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "Tiny", "lvs_name": "x"})));
    assert_eq!(e.code, FAILED, "a bdev smaller than a cluster: {e:?}");
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "Nope", "lvs_name": "x"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let long = "n".repeat(64);
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": long})));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    // Control characters: an lvstore so named took no lvol (its aliases are bdev names).
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "x\ny"})));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    assert!(e.message.contains("control characters"), "{e:?}");
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "lvs", "cluster_sz": MIB})));
    for (m, p, code) in [
        ("bdev_lvol_rename_lvstore", json!({"old_name": "lvs", "new_name": "l\tvs"}), FAILED),
        ("bdev_lvol_create", json!({"lvol_name": "a\u{1b}", "size_in_mib": 4, "lvs_name": "lvs"}), -libc::EINVAL),
    ] {
        let e = d.call_err(m, Some(p));
        assert_eq!((e.code, e.message.contains("control characters")), (code, true), "{m}: {e:?}");
    }
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "other"})));
    assert_eq!(e.code, -libc::EPERM, "the base is claimed: {e:?}");
    let e = d.call_err("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "Tiny", "lvs_name": "lvs"})));
    assert_eq!(e.code, -libc::EEXIST, "name taken: {e:?}");
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "a", "size_in_mib": 4, "lvs_name": "lvs"})));
    let e = d.call_err("bdev_lvol_create", Some(json!({"lvol_name": "a", "size_in_mib": 4, "lvs_name": "lvs"})));
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    let e = d.call_err("bdev_lvol_create", Some(json!({"lvol_name": "b", "size_in_mib": 4096, "lvs_name": "lvs"})));
    assert_eq!(e.code, FAILED, "thick beyond the free clusters: {e:?}");
    let e = d.call_err("bdev_lvol_create", Some(json!({"lvol_name": "c", "size_in_mib": 4, "lvs_name": "none"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = d.call_err("bdev_lvol_create", Some(json!({"lvol_name": "c", "size_in_mib": 4})));
    assert_eq!(e.code, -libc::EINVAL, "no lvstore named: {e:?}");
    let e = d.call_err(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "c", "size_in_mib": 4, "lvs_name": "lvs", "clear_method": "shred"})),
    );
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    let e = d.call_err("bdev_lvol_delete", Some(json!({"name": "lvs/zz"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    // A resize to 0 is refused before anything changes (the lvol keeps its clusters).
    let e = d.call_err("bdev_lvol_resize", Some(json!({"name": "lvs/a", "size_in_mib": 0})));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    let a = d.call("bdev_lvol_get_lvols", Some(json!({"lvs_name": "lvs"})));
    assert_eq!(a[0]["num_allocated_clusters"].as_u64(), Some(4), "{a}");
    // An lvol that holds an lvstore stays writable (the inner store writes its metadata
    // there); one made read-only is not resized, and says why.
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "outer", "size_in_mib": 8, "lvs_name": "lvs"})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "lvs/outer", "lvs_name": "inner", "cluster_sz": MIB})));
    let e = d.call_err("bdev_lvol_set_read_only", Some(json!({"name": "lvs/outer"})));
    assert_eq!(e.code, FAILED, "{e:?}");
    assert!(e.message.contains("holds an lvstore"), "{e:?}");
    // Also through a passthru and a delay bdev stacked over the lvol.
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "under", "size_in_mib": 8, "lvs_name": "lvs"})));
    d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "lvs/under", "name": "pt_under"})));
    d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "pt_under", "name": "dl_under", "avg_read_latency": 0,
            "p99_read_latency": 0, "avg_write_latency": 0, "p99_write_latency": 0})),
    );
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "dl_under", "lvs_name": "over", "cluster_sz": MIB})));
    let e = d.call_err("bdev_lvol_set_read_only", Some(json!({"name": "lvs/under"})));
    assert_eq!((e.code, e.message.contains("holds an lvstore")), (FAILED, true), "{e:?}");
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "o", "size_in_mib": 2, "lvs_name": "over"})));
    assert_eq!(d.call("bdev_lvol_delete_lvstore", Some(json!({"lvs_name": "over"}))), json!(true));
    d.call("bdev_delay_delete", Some(json!({"name": "dl_under"})));
    // With nothing over it but a passthru, it may be made read-only (the passthru follows).
    d.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs/under"})));
    let pt = d.call("bdev_get_bdevs", Some(json!({"name": "pt_under"})));
    assert_eq!(pt[0]["supported_io_types"]["write"], json!(false), "{pt}");
    d.call("bdev_passthru_delete", Some(json!({"name": "pt_under"})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "in", "size_in_mib": 2, "lvs_name": "inner"})));
    d.call("bdev_lvol_set_read_only", Some(json!({"name": "inner/in"})));
    let e = d.call_err("bdev_lvol_resize", Some(json!({"name": "inner/in", "size_in_mib": 4})));
    assert_eq!(e.code, FAILED, "{e:?}");
    assert!(e.message.contains("lvol in is read-only"), "{e:?}");
    for m in ["bdev_lvol_inflate", "bdev_lvol_decouple_parent"] {
        let e = d.call_err(m, Some(json!({"name": "inner/in"})));
        assert_eq!((e.code, e.message.contains("lvol in is read-only")), (FAILED, true), "{m}: {e:?}");
    }
    assert_eq!(d.call("bdev_lvol_delete_lvstore", Some(json!({"lvs_name": "inner"}))), json!(true));
    // A thin lvol far larger than the store works; the whole store stays consistent.
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "big", "size_in_mib": 1 << 20, "lvs_name": "lvs", "thin_provision": true})),
    );
    assert_eq!(d.call("bdev_lvol_delete_lvstore", Some(json!({"lvs_name": "lvs"}))), json!(true));
    assert!(d.call("bdev_lvol_get_lvstores", None).as_array().unwrap().is_empty());
    assert_eq!(d.bdev_names().len(), 2, "the lvol bdevs are gone with their lvstore");
    // The base is free again.
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "again"})));
    // A rename whose aliases would meet another lvol's ("again" + "x/y" and "again/x" + "y")
    // is refused before anything changes.
    d.call("bdev_malloc_create", Some(json!({"name": "M2", "num_blocks": 16384, "block_size": 4096})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M2", "lvs_name": "t", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "y", "size_in_mib": 4, "lvs_name": "t"})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "x/y", "size_in_mib": 4, "lvs_name": "again"})));
    let e = d.call_err("bdev_lvol_rename_lvstore", Some(json!({"old_name": "t", "new_name": "again/x"})));
    assert_eq!((e.code, e.message.contains("again/x")), (FAILED, true), "{e:?}");
    assert_eq!(d.call("bdev_get_bdevs", Some(json!({"name": "t/y"})))[0]["aliases"][1], json!("t/y"));
    d.assert_serving();
}

/// SPDK's spdk_tgt on its own socket in `dir`, with rpc.py to talk to it; killed on drop.
struct SpdkTgt {
    spdk: std::path::PathBuf,
    sock: std::path::PathBuf,
    child: std::process::Child,
}

impl SpdkTgt {
    fn start(spdk: &std::path::Path, dir: &TempDir) -> SpdkTgt {
        let sock = dir.join("spdk.sock");
        let child = std::process::Command::new(spdk.join("build/bin/spdk_tgt"))
            .args(["-m", "0x1", "--no-huge", "-s", "1024", "--disable-cpumask-locks", "-r", sock.to_str().unwrap()])
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spdk_tgt starts");
        let t = SpdkTgt { spdk: spdk.to_path_buf(), sock, child };
        for _ in 0..100 {
            if t.sock.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(t.sock.exists(), "spdk_tgt did not start");
        std::thread::sleep(Duration::from_millis(300));
        t
    }

    /// Runs rpc.py with `args`, expects success, returns its JSON output (or null).
    fn rpc(&self, args: &[&str]) -> Value {
        let out = std::process::Command::new("python3")
            .arg(self.spdk.join("scripts/rpc.py"))
            .args(["-s", self.sock.to_str().unwrap(), "-t", "30"])
            .args(args)
            .env("PYTHONPATH", self.spdk.join("python"))
            .output()
            .expect("rpc.py runs");
        assert!(out.status.success(), "rpc.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Stops it cleanly (its lvstores are unloaded).
    fn stop(mut self) {
        let _ = self.rpc(&["spdk_kill_instance", "SIGTERM"]);
        let _ = self.child.wait();
    }
}

impl Drop for SpdkTgt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs spdk_dd with the file as aio bdev A0 and `args`; expects success.
fn spdk_dd(spdk: &std::path::Path, dir: &TempDir, img: &std::path::Path, args: &[&str]) {
    let conf = dir.write_json(
        "dd.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_aio_create",
            "params": {"name": "A0", "filename": img.to_str().unwrap(), "block_size": 4096}}]}]}),
    );
    let out = std::process::Command::new(spdk.join("build/bin/spdk_dd"))
        .args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "--no-rpc-server", "--json"])
        .arg(&conf)
        .args(args)
        .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
        .output()
        .expect("spdk_dd runs");
    assert!(
        out.status.success(),
        "spdk_dd: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn spdk_opens_the_lvstore_ferrite_wrote() {
    let test = "spdk_opens_the_lvstore_ferrite_wrote";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-spdk");
    let img = sparse_image(&dir, 128);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "thick", "size_in_mib": 4, "lvs_name": "lvs0"})));
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "thin", "size_in_mib": 16, "lvs_name": "lvs0", "thin_provision": true})),
    );
    let u = nbd(&d, "lvs0/thin", "thin");
    qemu_io(&dir, &u, "write -P 0x3c 2M 2M; flush");
    // The thick lvol's clusters lie back to back, so Ferrite computes where each starts
    // instead of loading it from the map: a pattern per cluster, which SPDK reads back below.
    let t = nbd(&d, "lvs0/thick", "thick");
    qemu_io(&dir, &t, "write -P 0x11 0 1M; write -P 0x22 1M 1M; write -P 0x33 2M 1M; write -P 0x44 3M 1M; flush");
    let ours = lvols(&d);
    stop(d);
    // spdk_tgt with the file as an aio bdev: examine finds the same lvstore and lvols.
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_wait_for_examine"]);
    let mut theirs = tgt.rpc(&["bdev_lvol_get_lvols"]).as_array().unwrap().clone();
    theirs.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
    tgt.stop();
    assert_eq!(theirs.len(), ours.len(), "SPDK's lvols: {theirs:?}");
    for (t, o) in theirs.iter().zip(&ours) {
        for k in ["alias", "uuid", "name", "is_thin_provisioned", "num_allocated_clusters"] {
            assert_eq!(t[k], o[k], "{k}: SPDK {t} vs Ferrite {o}");
        }
        assert_eq!(t["lvs"]["uuid"], o["lvs"]["uuid"]);
    }
    // spdk_dd reads the thin lvol: the written range and zeroes around it.
    let out_file = dir.join("thin.bin");
    let of = format!("--of={}", out_file.display());
    spdk_dd(&spdk, &dir, &img, &["--ib=lvs0/thin", &of, "--bs=1048576", "--count=16"]);
    let data = std::fs::read(&out_file).unwrap();
    assert_eq!(data.len() as u64, 16 * MIB);
    let m = MIB as usize;
    assert!(data[2 * m..4 * m].iter().all(|&b| b == 0x3c), "the written range");
    assert!(data[..2 * m].iter().chain(&data[4 * m..]).all(|&b| b == 0), "the rest reads zeroes");
    let thick_file = dir.join("thick.bin");
    let of = format!("--of={}", thick_file.display());
    spdk_dd(&spdk, &dir, &img, &["--ib=lvs0/thick", &of, "--bs=1048576", "--count=4"]);
    let data = std::fs::read(&thick_file).unwrap();
    assert_eq!(data.len() as u64, 4 * MIB);
    for (i, want) in [0x11u8, 0x22, 0x33, 0x44].into_iter().enumerate() {
        assert!(data[i * m..(i + 1) * m].iter().all(|&b| b == want), "thick cluster {i} holds {want:#x}");
    }
    // And SPDK left it consistent for us.
    let (ok, out) = check(&dir, &img);
    assert!(ok, "after SPDK: {out}");
}

#[test]
fn ferrite_opens_an_lvstore_spdk_wrote() {
    let test = "ferrite_opens_an_lvstore_spdk_wrote";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-from-spdk");
    let img = sparse_image(&dir, 128);
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_lvol_create_lvstore", "A0", "lvs0", "-c", "1048576"]);
    tgt.rpc(&["bdev_lvol_create", "-l", "lvs0", "thick", "4"]);
    tgt.rpc(&["bdev_lvol_create", "-l", "lvs0", "-t", "thin", "16"]);
    let mut theirs = tgt.rpc(&["bdev_lvol_get_lvols"]).as_array().unwrap().clone();
    let lvs_theirs = tgt.rpc(&["bdev_lvol_get_lvstores"]);
    tgt.stop();
    // spdk_dd writes a pattern into the thin lvol (SPDK allocates its clusters).
    let pattern: Vec<u8> = (0..2 * MIB).map(|i| (i % 251) as u8).collect();
    let src = dir.join("pattern.bin");
    std::fs::write(&src, &pattern).unwrap();
    let inp = format!("--if={}", src.display());
    spdk_dd(&spdk, &dir, &img, &[&inp, "--ob=lvs0/thin", "--bs=1048576", "--count=2", "--seek=5"]);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "SPDK's lvstore checks clean: {out}");
    // Ferrite finds the lvstore by examine, with SPDK's names, UUIDs and sizes.
    let d = daemon(&dir, &img);
    let lvs_ours = d.call("bdev_lvol_get_lvstores", None);
    for k in ["uuid", "name", "cluster_size", "block_size", "total_data_clusters"] {
        assert_eq!(lvs_ours[0][k], lvs_theirs[0][k], "{k}");
    }
    theirs.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
    let ours = lvols(&d);
    assert_eq!(ours.len(), 2, "{ours:?}");
    for (t, o) in theirs.iter().zip(&ours) {
        for k in ["alias", "uuid", "name", "is_thin_provisioned"] {
            assert_eq!(t[k], o[k], "{k}: SPDK {t} vs Ferrite {o}");
        }
    }
    assert_eq!(ours[1]["num_allocated_clusters"].as_u64(), Some(2), "spdk_dd's writes allocated two clusters");
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/thin"})));
    assert_eq!(b[0]["num_blocks"].as_u64(), Some(16 * MIB / 4096));
    // The bytes SPDK wrote, through Ferrite's NBD export.
    let u = nbd(&d, "lvs0/thin", "thin");
    let out = dir.join("read.bin");
    let r = run_tool(
        &dir,
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &u, out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(r.status.success(), "qemu-img convert: {}", r.stderr);
    let data = std::fs::read(&out).unwrap();
    let m = MIB as usize;
    assert_eq!(&data[5 * m..7 * m], &pattern[..], "the data spdk_dd wrote");
    assert!(data[..5 * m].iter().chain(&data[7 * m..]).all(|&b| b == 0), "unwritten clusters read zeroes");
}

#[test]
fn an_lvstore_grows_with_its_base() {
    if !have("an_lvstore_grows_with_its_base", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-grow");
    let img = dir.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 * MIB).unwrap();
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "a", "size_in_mib": 32, "lvs_name": "lvs0"})));
    let u = nbd(&d, "lvs0/a", "a");
    qemu_io(&dir, &u, "write -P 0x61 0 32M; flush");
    let before = d.call("bdev_lvol_get_lvstores", None)[0].clone();
    // Nothing to grow yet.
    assert_eq!(d.call("bdev_lvol_grow_lvstore", Some(json!({"lvs_name": "lvs0"}))), json!(true));
    assert_eq!(d.call("bdev_lvol_get_lvstores", None)[0], before);
    let e = d.call_err("bdev_lvol_create", Some(json!({"lvol_name": "b", "size_in_mib": 100, "lvs_name": "lvs0"})));
    assert_eq!((e.code, e.message.contains("clusters wanted")), (FAILED, true), "{e:?}");
    // The file grows, the bdev sees it, the lvstore takes it.
    f.set_len(256 * MIB).unwrap();
    d.call("bdev_uring_rescan", Some(json!({"name": "U0"})));
    assert_eq!(d.call("bdev_lvol_grow_lvstore", Some(json!({"uuid": before["uuid"]}))), json!(true));
    let after = d.call("bdev_lvol_get_lvstores", None)[0].clone();
    let grown = after["total_data_clusters"].as_u64().unwrap() - before["total_data_clusters"].as_u64().unwrap();
    assert_eq!(grown, 192, "{before} -> {after}");
    assert_eq!(after["free_clusters"].as_u64().unwrap(), before["free_clusters"].as_u64().unwrap() + 192);
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "b", "size_in_mib": 200, "lvs_name": "lvs0"})));
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/b", "name": "b"})));
    qemu_io(&dir, &u.replace("/a", "/b"), "write -P 0x62 199M 1M; flush");
    // Past what the cluster mask has room for: ENOSPC, nothing changes.
    f.set_len(40 << 30).unwrap();
    d.call("bdev_uring_rescan", Some(json!({"name": "U0"})));
    let e = d.call_err("bdev_lvol_grow_lvstore", Some(json!({"lvs_name": "lvs0"})));
    assert_eq!((e.code, e.message.contains("no space")), (FAILED, true), "{e:?}");
    let now = d.call("bdev_lvol_get_lvstores", None)[0].clone();
    assert_eq!(now["total_data_clusters"], after["total_data_clusters"]);
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
    // Loaded again: the grown size, both lvols, their data.
    let d2 = daemon(&dir, &img);
    assert_eq!(d2.call("bdev_lvol_get_lvstores", None)[0]["total_data_clusters"], after["total_data_clusters"]);
    let u = nbd(&d2, "lvs0/a", "a");
    qemu_io(&dir, &u, "read -P 0x61 0 32M");
    d2.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/b", "name": "b"})));
    qemu_io(&dir, &u.replace("/a", "/b"), "read -P 0x62 199M 1M");
}

#[test]
fn clones_of_an_external_bdev() {
    if !have("clones_of_an_external_bdev", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-esnap");
    let img = sparse_image(&dir, 128);
    let golden = dir.join("golden.img");
    // The external snapshot: 6 MiB of data (not a whole number of 4 MiB clusters).
    std::fs::File::create(&golden).unwrap().set_len(6 * MIB).unwrap();
    let d = daemon(&dir, &img);
    d.call("bdev_uring_create", Some(json!({"name": "G", "filename": golden.to_str().unwrap(), "block_size": 4096})));
    let u = nbd(&d, "G", "g");
    qemu_io(&dir, &u, "write -P 0x47 0 6M; flush");
    d.call("nbd_server_remove_export", Some(json!({"name": "g"})));
    let g_uuid = d.call("bdev_get_bdevs", Some(json!({"name": "G"})))[0]["uuid"].clone();
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0"})));
    let e = d.call_err("bdev_lvol_clone_bdev", Some(json!({"bdev": "nope", "lvs_name": "lvs0", "clone_name": "c"})));
    assert_eq!((e.code, e.message.contains("nope")), (FAILED, true), "SPDK's code: {e:?}");
    d.call("bdev_lvol_clone_bdev", Some(json!({"bdev": "G", "lvs_name": "lvs0", "clone_name": "ec"})));
    let l = lvols(&d);
    assert_eq!((l[0]["is_esnap_clone"].clone(), l[0]["is_thin_provisioned"].clone()), (json!(true), json!(true)));
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/ec"})));
    assert_eq!(b[0]["num_blocks"].as_u64(), Some(8 * MIB / 4096), "6 MiB rounded up to 4 MiB clusters");
    assert_eq!(b[0]["driver_specific"]["lvol"]["external_snapshot_name"], json!("G"), "{b}");
    // Nobody writes the external snapshot while clones read it.
    let e = d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "G", "name": "g"})));
    assert!(e.code < 0, "{e:?}");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/ec", "name": "ec"})));
    let ue = u.replace("/g", "/ec");
    qemu_io(&dir, &ue, "read -P 0x47 0 6M");
    qemu_io(&dir, &ue, "read -P 0 6M 2M");
    qemu_io(&dir, &ue, "write -P 0x65 5M 4k; flush");
    qemu_io(&dir, &ue, "read -P 0x47 4M 1M");
    qemu_io(&dir, &ue, "read -P 0x65 5M 4k");
    qemu_io(&dir, &ue, "read -P 0x47 5124k 1020k");
    // A snapshot and a clone of it keep reading through to the external snapshot.
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/ec", "snapshot_name": "es"})));
    d.call("bdev_lvol_clone", Some(json!({"snapshot_name": "lvs0/es", "clone_name": "ec2"})));
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/ec2", "name": "ec2"})));
    qemu_io(&dir, &u.replace("/g", "/ec2"), "read -P 0x47 0 1M");
    qemu_io(&dir, &u.replace("/g", "/ec2"), "read -P 0x65 5M 4k");
    // The bytes of the external snapshot are untouched.
    assert!(std::fs::read(&golden).unwrap().iter().all(|&b| b == 0x47));
    // Restarted without it: the clones are degraded (listed, no bdev); it appears: they attach.
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
    let d2 = daemon(&dir, &img);
    let l = lvols(&d2);
    assert_eq!(l.len(), 3, "{l:?}");
    let es = l.iter().find(|v| v["name"] == "es").unwrap();
    assert_eq!((es["is_degraded"].clone(), es["is_esnap_clone"].clone()), (json!(true), json!(true)), "{es}");
    assert_eq!(d2.call_err("bdev_get_bdevs", Some(json!({"name": "lvs0/es"}))).code, -libc::ENODEV);
    d2.call(
        "bdev_uring_create",
        Some(json!({"name": "G2", "filename": golden.to_str().unwrap(), "block_size": 4096, "uuid": g_uuid})),
    );
    assert_eq!(d2.call("bdev_wait_for_examine", None), json!(true));
    let l = lvols(&d2);
    assert!(l.iter().all(|v| v["is_degraded"] == json!(false)), "{l:?}");
    let u = nbd(&d2, "lvs0/ec2", "ec2");
    qemu_io(&dir, &u, "read -P 0x47 0 5M");
    qemu_io(&dir, &u, "read -P 0x65 5M 4k");
    // The external snapshot's bdev goes while clones read it: the delete finishes, the lvols
    // over it are degraded; it comes back: they attach again.
    d2.call("nbd_server_remove_export", Some(json!({"name": "ec2"})));
    assert_eq!(d2.call("bdev_uring_delete", Some(json!({"name": "G2"}))), json!(true));
    let l = lvols(&d2);
    assert_eq!(l.iter().filter(|v| v["is_degraded"] == json!(true)).count(), 3, "{l:?}");
    d2.call(
        "bdev_uring_create",
        Some(json!({"name": "G3", "filename": golden.to_str().unwrap(), "block_size": 4096, "uuid": g_uuid})),
    );
    assert_eq!(d2.call("bdev_wait_for_examine", None), json!(true));
    assert!(lvols(&d2).iter().all(|v| v["is_degraded"] == json!(false)));
    d2.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/ec2", "name": "ec2"})));
    qemu_io(&dir, &u, "read -P 0x47 0 5M");
    // Inflate: the clone holds every byte itself.
    d2.call("bdev_lvol_inflate", Some(json!({"name": "lvs0/ec2"})));
    let l = lvols(&d2);
    let ec2 = l.iter().find(|v| v["name"] == "ec2").unwrap();
    assert_eq!((ec2["is_clone"].clone(), ec2["is_esnap_clone"].clone()), (json!(false), json!(false)), "{ec2}");
    qemu_io(&dir, &u, "read -P 0x47 0 5M");
    qemu_io(&dir, &u, "read -P 0 6M 2M");
    // Degraded lvols (no bdev) are deleted as SPDK finds them: by lvs_name/lvol_name (the
    // snapshot, into its one clone) and by UUID; nothing leaks, the inflated clone is whole.
    assert_eq!(d2.call("bdev_uring_delete", Some(json!({"name": "G3"}))), json!(true));
    let l = lvols(&d2);
    assert_eq!(l.iter().filter(|v| v["is_degraded"] == json!(true)).count(), 2, "{l:?}");
    // Their names stay theirs (they come back under them).
    let e = d2.call_err("bdev_lvol_create", Some(json!({"lvol_name": "ec", "size_in_mib": 4, "lvs_name": "lvs0"})));
    assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    let e = d2.call_err("bdev_lvol_rename", Some(json!({"old_name": "lvs0/ec2", "new_name": "es"})));
    assert_eq!((e.code, e.message.contains("exists")), (FAILED, true), "{e:?}");
    // A clean shutdown with degraded lvols leaves the lvstore clean; they are degraded again.
    stop(d2);
    let (ok, out) = check(&dir, &img);
    assert!(ok && out.contains(", clean"), "{out}");
    let d2 = daemon(&dir, &img);
    let l = lvols(&d2);
    assert_eq!(l.iter().filter(|v| v["is_degraded"] == json!(true)).count(), 2, "{l:?}");
    let u = nbd(&d2, "lvs0/ec2", "ec2");
    let ec_uuid = l.iter().find(|v| v["name"] == "ec").unwrap()["uuid"].as_str().unwrap().to_string();
    let free = free_clusters;
    let before = free(&d2);
    assert_eq!(d2.call("bdev_lvol_delete", Some(json!({"name": "lvs0/es"}))), json!(true));
    let e = d2.call_err("bdev_lvol_delete", Some(json!({"name": "lvs0/es"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    assert_eq!(d2.call("bdev_lvol_delete", Some(json!({"name": ec_uuid}))), json!(true));
    let l = lvols(&d2);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["name"], json!("ec2"));
    assert!(free(&d2) > before, "the deleted lvols' clusters are free again");
    qemu_io(&dir, &u, "read -P 0x47 0 5M");
    qemu_io(&dir, &u, "read -P 0x65 5M 4k");
    d2.assert_serving();
    stop(d2);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
    let d3 = daemon(&dir, &img);
    let l = lvols(&d3);
    assert_eq!((l.len(), l[0]["is_degraded"].clone()), (1, json!(false)), "{l:?}");
}

#[test]
fn an_external_snapshot_that_goes_and_returns_at_once() {
    // The external snapshot's bdev is deleted and created again (same UUID) at the same time,
    // while a reader keeps one clone busy (so its bdev takes a while to go): once it is back,
    // every clone is whole and reads it. (Found by the break-it round: the removal, finishing
    // after the return, forgot the new device, and clones stayed degraded or read zeroes.)
    if !have("an_external_snapshot_that_goes_and_returns_at_once", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-esnap-flap");
    let img = sparse_image(&dir, 64);
    let golden = dir.join("golden.img");
    let bytes: Vec<u8> = (0..1024).flat_map(|i| vec![(i % 250 + 1) as u8; 4096]).collect();
    std::fs::write(&golden, &bytes).unwrap();
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "s", "cluster_sz": MIB})));
    let m = json!({"name": "M", "filename": golden.to_str().unwrap(), "block_size": 4096,
        "uuid": "77777777-2222-4333-8444-555555555555"});
    d.call("bdev_uring_create", Some(m.clone()));
    for n in ["e1", "e2", "e3"] {
        d.call("bdev_lvol_clone_bdev", Some(json!({"bdev": "M", "lvs_name": "s", "clone_name": n})));
    }
    let u1 = nbd(&d, "s/e1", "e1");
    for round in 0..8 {
        let _ = d.client().call("nbd_server_add_export", Some(json!({"bdev_name": "s/e1", "name": "e1"})));
        let mut reader = std::process::Command::new("qemu-io")
            .args(["-f", "raw", &u1])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let stdin = reader.stdin.as_mut().unwrap();
            for _ in 0..200 {
                let _ = writeln!(stdin, "read 0 64k");
            }
        }
        std::thread::sleep(Duration::from_millis(20 * (round % 4)));
        let created = std::thread::scope(|t| {
            let del = t.spawn(|| d.client().call("bdev_uring_delete", Some(json!({"name": "M"}))));
            let created = d.client().call("bdev_uring_create", Some(m.clone())).is_ok();
            assert_eq!(del.join().unwrap().ok(), Some(json!(true)), "round {round}: the delete");
            created
        });
        if !created {
            // The create came first (the name was still taken): again, now that it is gone.
            d.call("bdev_uring_create", Some(m.clone()));
        }
        let _ = reader.kill();
        let _ = reader.wait();
        // The clones attach when the snapshot is back; give the attach its turn.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while lvols(&d).iter().any(|v| v["is_degraded"] == json!(true)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let l = lvols(&d);
        assert!(l.iter().all(|v| v["is_degraded"] == json!(false)), "round {round}: {l:?}");
    }
    for (i, n) in ["e1", "e2", "e3"].iter().enumerate() {
        let u = nbd(&d, &format!("s/{n}"), &format!("x{i}"));
        qemu_io(&dir, &u, "read -P 0x01 0 4k");
        qemu_io(&dir, &u, "read -P 0x03 8k 4k");
        // The first write copies the cluster from the snapshot, which must be there.
        qemu_io(&dir, &u, "write -P 0x99 4k 4k; flush");
        qemu_io(&dir, &u, "read -P 0x01 0 4k");
        qemu_io(&dir, &u, "read -P 0x99 4k 4k");
    }
    d.assert_serving();
}

#[test]
fn an_lvstore_on_an_lvol_shuts_down_and_comes_back() {
    // An lvstore whose base is another lvstore's lvol: a clean shutdown unloads the inner one
    // first (the outer lvol's bdev cannot go while the inner store holds it: the shutdown used
    // to wait for it forever), both are clean, and both come back by examine with their bytes.
    if !have("an_lvstore_on_an_lvol_shuts_down_and_comes_back", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-nested");
    let img = sparse_image(&dir, 64);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "outer", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "base", "size_in_mib": 32, "lvs_name": "outer"})));
    d.call(
        "bdev_lvol_create_lvstore",
        Some(json!({"bdev_name": "outer/base", "lvs_name": "inner", "cluster_sz": MIB})),
    );
    let p = json!({"lvol_name": "v", "size_in_mib": 8, "lvs_name": "inner", "thin_provision": true});
    d.call("bdev_lvol_create", Some(p));
    let u = nbd(&d, "inner/v", "v");
    qemu_io(&dir, &u, "write -P 0x5e 1M 2M; flush");
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok && out.contains(", clean"), "{out}");
    let d = daemon(&dir, &img);
    let names: Vec<Value> = lvols(&d).iter().map(|l| l["alias"].clone()).collect();
    assert_eq!(names, vec![json!("outer/base"), json!("inner/v")], "both lvstores came back");
    let u = nbd(&d, "inner/v", "v");
    qemu_io(&dir, &u, "read -P 0x5e 1M 2M");
    qemu_io(&dir, &u, "read -P 0 0 1M");
    stop(d);
}

/// The fields of `bdev_lvol_get_lvols` both implementations must agree on.
const FAMILY_KEYS: [&str; 7] =
    ["alias", "uuid", "name", "is_thin_provisioned", "is_snapshot", "is_clone", "num_allocated_clusters"];

/// Reads `len` MiB of bdev `name` from the lvstore file with spdk_dd.
fn spdk_read(spdk: &std::path::Path, dir: &TempDir, img: &std::path::Path, name: &str, len: u64) -> Vec<u8> {
    let out = dir.join(&format!("{}.bin", name.replace('/', "_")));
    let ib = format!("--ib={name}");
    let of = format!("--of={}", out.display());
    let count = format!("--count={len}");
    spdk_dd(spdk, dir, img, &[&ib, &of, "--bs=1048576", &count]);
    std::fs::read(&out).unwrap()
}

/// Reads a whole bdev through Ferrite's NBD export `export`.
fn nbd_read(dir: &TempDir, uri: &str) -> Vec<u8> {
    let out = dir.join("nbd-read.bin");
    let _ = std::fs::remove_file(&out);
    let r = run_tool(
        dir,
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", uri, out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(r.status.success(), "qemu-img convert: {}", r.stderr);
    std::fs::read(&out).unwrap()
}

fn filled(len: u64, runs: &[(u64, u64, u8)]) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    for &(at, n, b) in runs {
        v[at as usize..(at + n) as usize].fill(b);
    }
    v
}

#[test]
fn snapshot_families_cross_between_spdk_and_ferrite() {
    // Both ways: a thin lvol with data, its snapshot, a clone of the snapshot with writes of its
    // own, shrunk to 3 MiB and grown back to 16 (its write beyond 3 MiB is gone, and the grown
    // range reads the snapshot's data again, as SPDK does), and a resized thick lvol, made by
    // one implementation, open in the other with the same names, UUIDs, flags, sizes and bytes.
    let test = "snapshot_families_cross_between_spdk_and_ferrite";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-io", "qemu-img"]) {
        return;
    }
    let m = MIB;
    // The bytes each lvol must hold (16 MiB each; thick is 8 MiB).
    let snap_data = filled(16 * m, &[(2 * m, 2 * m, 0x3c)]);
    let thin_data = filled(16 * m, &[(2 * m, 2 * m, 0x3c), (3 * m, 64 << 10, 0x4d)]);
    let clone_data = filled(16 * m, &[(m, 4096, 0x5e), (2 * m, 2 * m, 0x3c)]);

    // 1. SPDK makes the family; Ferrite opens it.
    let dir = TempDir::new("lvol-family-spdk");
    let img = sparse_image(&dir, 128);
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_lvol_create_lvstore", "A0", "lvs0", "-c", "1048576"]);
    tgt.rpc(&["bdev_lvol_create", "-l", "lvs0", "thick", "4"]);
    tgt.rpc(&["bdev_lvol_create", "-l", "lvs0", "-t", "thin", "16"]);
    tgt.stop();
    let src = dir.join("src.bin");
    std::fs::write(&src, vec![0x3cu8; 2 * MIB as usize]).unwrap();
    let inp = format!("--if={}", src.display());
    spdk_dd(&spdk, &dir, &img, &[&inp, "--ob=lvs0/thin", "--bs=1048576", "--count=2", "--seek=2"]);
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_wait_for_examine"]);
    tgt.rpc(&["bdev_lvol_snapshot", "lvs0/thin", "snap"]);
    tgt.rpc(&["bdev_lvol_clone", "lvs0/snap", "cl"]);
    tgt.rpc(&["bdev_lvol_resize", "lvs0/thick", "8"]);
    tgt.stop();
    std::fs::write(&src, vec![0x4du8; 64 << 10]).unwrap();
    spdk_dd(&spdk, &dir, &img, &[&inp, "--ob=lvs0/thin", "--bs=65536", "--count=1", "--seek=48"]);
    std::fs::write(&src, vec![0x5eu8; 4096]).unwrap();
    spdk_dd(&spdk, &dir, &img, &[&inp, "--ob=lvs0/cl", "--bs=4096", "--count=1", "--seek=256"]);
    spdk_dd(&spdk, &dir, &img, &[&inp, "--ob=lvs0/cl", "--bs=4096", "--count=1", "--seek=2560"]);
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_wait_for_examine"]);
    tgt.rpc(&["bdev_lvol_resize", "lvs0/cl", "3"]);
    tgt.rpc(&["bdev_lvol_resize", "lvs0/cl", "16"]);
    let mut theirs = tgt.rpc(&["bdev_lvol_get_lvols"]).as_array().unwrap().clone();
    theirs.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
    tgt.stop();
    let (ok, out) = check(&dir, &img);
    assert!(ok, "SPDK's family checks clean: {out}");
    let d = daemon(&dir, &img);
    let ours = lvols(&d);
    assert_eq!(ours.len(), 4, "{ours:?}");
    for (t, o) in theirs.iter().zip(&ours) {
        for k in FAMILY_KEYS {
            assert_eq!(t[k], o[k], "{k}: SPDK {t} vs Ferrite {o}");
        }
    }
    let b = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/thick"})));
    assert_eq!(b[0]["num_blocks"].as_u64(), Some(8 * MIB / 4096), "the resize");
    let u = nbd(&d, "lvs0/thin", "thin");
    for (name, want) in [("thin", &thin_data), ("snap", &snap_data), ("cl", &clone_data)] {
        if name != "thin" {
            d.call("nbd_server_add_export", Some(json!({"bdev_name": format!("lvs0/{name}"), "name": name})));
        }
        let got = nbd_read(&dir, &u.replace("/thin", &format!("/{name}")));
        assert!(got == *want, "lvol {name}: Ferrite reads other bytes than SPDK wrote");
    }
    drop(d);

    // 2. Ferrite makes the same family; SPDK opens it.
    let dir = TempDir::new("lvol-family-ferrite");
    let img = sparse_image(&dir, 128);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "thick", "size_in_mib": 4, "lvs_name": "lvs0"})));
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "thin", "size_in_mib": 16, "lvs_name": "lvs0", "thin_provision": true})),
    );
    let u = nbd(&d, "lvs0/thin", "thin");
    qemu_io(&dir, &u, "write -P 0x3c 2M 2M; flush");
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/thin", "snapshot_name": "snap"})));
    d.call("bdev_lvol_clone", Some(json!({"snapshot_name": "lvs0/snap", "clone_name": "cl"})));
    d.call("bdev_lvol_resize", Some(json!({"name": "lvs0/thick", "size_in_mib": 8})));
    qemu_io(&dir, &u, "write -P 0x4d 3M 64k; flush");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/cl", "name": "cl"})));
    qemu_io(&dir, &u.replace("/thin", "/cl"), "write -P 0x5e 1M 4k; write -P 0x5e 10M 4k; flush");
    // Shrinking waits until nothing has the clone open.
    d.call("nbd_server_remove_export", Some(json!({"name": "cl"})));
    d.call("bdev_lvol_resize", Some(json!({"name": "lvs0/cl", "size_in_mib": 3})));
    d.call("bdev_lvol_resize", Some(json!({"name": "lvs0/cl", "size_in_mib": 16})));
    let ours = lvols(&d);
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "Ferrite's family checks clean: {out}");
    let tgt = SpdkTgt::start(&spdk, &dir);
    tgt.rpc(&["bdev_aio_create", img.to_str().unwrap(), "A0", "4096"]);
    tgt.rpc(&["bdev_wait_for_examine"]);
    let mut theirs = tgt.rpc(&["bdev_lvol_get_lvols"]).as_array().unwrap().clone();
    theirs.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
    let thick = tgt.rpc(&["bdev_get_bdevs", "-b", "lvs0/thick"]);
    tgt.stop();
    assert_eq!(theirs.len(), 4, "{theirs:?}");
    for (t, o) in theirs.iter().zip(&ours) {
        for k in FAMILY_KEYS {
            assert_eq!(t[k], o[k], "{k}: SPDK {t} vs Ferrite {o}");
        }
    }
    assert_eq!(thick[0]["num_blocks"].as_u64(), Some(8 * MIB / 4096));
    for (name, want) in [("thin", &thin_data), ("snap", &snap_data), ("cl", &clone_data)] {
        let got = spdk_read(&spdk, &dir, &img, &format!("lvs0/{name}"), 16);
        assert!(got == *want, "lvol {name}: SPDK reads other bytes than Ferrite wrote");
    }
    let (ok, out) = check(&dir, &img);
    assert!(ok, "after SPDK: {out}");
}

#[test]
fn snapshots_under_a_verify_workload_lose_no_write() {
    // ferrite perf's verify workload (write, read back, compare) runs on a thin lvol while
    // snapshots are taken under it, then a clone, a decouple and an inflate: every write that
    // completed reads back, before and after each of them (writes wait while clusters move).
    let dir = TempDir::new("lvol-snap-verify");
    let img = sparse_image(&dir, 512);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": 256 << 10})));
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "vol", "size_in_mib": 64, "lvs_name": "lvs0", "thin_provision": true})),
    );
    stop(d);
    let cfg = dir.write_json(
        "perf.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_uring_create", "params": {"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let sock = dir.join("perf.sock");
    let res = dir.join("res.json");
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-T",
        "lvs0/vol",
        "-q",
        "32",
        "-o",
        "4096",
        "-w",
        "verify",
        "-t",
        "8",
        "-m",
        "0x1",
        "-r",
        sock.to_str().unwrap(),
        "--results-json",
        res.to_str().unwrap(),
    ];
    let mut p = common::Proc::spawn(&dir, "perf", &args);
    let rpc = |args: &[&str]| {
        let mut a = vec!["rpc", "-s", sock.to_str().unwrap()];
        a.extend_from_slice(args);
        let out = run_tool(&dir, common::FERRITE, &a, Duration::from_secs(30));
        assert!(out.status.success(), "rpc {args:?}: {}{}", out.stdout, out.stderr);
    };
    std::thread::sleep(Duration::from_millis(1500));
    for n in 0..3 {
        rpc(&["bdev_lvol_snapshot", "--lvol-name", "lvs0/vol", "--snapshot-name", &format!("s{n}")]);
        std::thread::sleep(Duration::from_millis(700));
    }
    rpc(&["bdev_lvol_clone", "--snapshot-name", "lvs0/s2", "--clone-name", "c"]);
    rpc(&["bdev_lvol_decouple_parent", "--name", "lvs0/vol"]);
    std::thread::sleep(Duration::from_millis(500));
    rpc(&["bdev_lvol_inflate", "--name", "lvs0/vol"]);
    p.expect_exit(Duration::from_secs(60), "perf ends");
    let r: Value = serde_json::from_slice(&std::fs::read(&res).unwrap()).unwrap();
    let job = &r["results"][0];
    assert_eq!(job["verify_errors"].as_u64(), Some(0), "{r}");
    assert_eq!(job["io_failed"].as_u64(), Some(0), "{r}");
    assert!(r["total"]["iops"].as_f64().unwrap() > 0.0, "{r}");
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}\nperf's log:\n{}", p.stderr());
}

#[test]
fn kill_9_under_a_verify_workload_on_a_thin_lvol_recovers() {
    // ferrite perf loads the lvstore from the file (examine) and runs verify on a thin lvol,
    // allocating clusters as it goes; it is killed mid-run, three times. Each time the next
    // load recovers a blobstore that the offline checker finds consistent after a clean
    // shutdown, and the lvol is still there with the clusters it had.
    let dir = TempDir::new("lvol-kill9");
    let img = sparse_image(&dir, 256);
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": 256 << 10})));
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "thin", "size_in_mib": 128, "lvs_name": "lvs0", "thin_provision": true})),
    );
    stop(d);
    let cfg = dir.write_json(
        "perf.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_uring_create", "params": {"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let mut allocated = 0;
    let mut recovered = 0;
    for round in 0..3 {
        let args = [
            "perf",
            "--json",
            cfg.to_str().unwrap(),
            "-T",
            "lvs0/thin",
            "-q",
            "32",
            "-o",
            "4096",
            "-w",
            "verify",
            "-t",
            "30",
            "-m",
            "0x1",
        ];
        let mut p = common::Proc::spawn(&dir, &format!("perf-{round}"), &args);
        std::thread::sleep(Duration::from_millis(1500));
        assert!(matches!(p.child.try_wait(), Ok(None)), "perf ended early: {}", p.stderr());
        p.signal(libc::SIGKILL);
        p.expect_exit(Duration::from_secs(10), "killed perf");
        let d = daemon(&dir, &img);
        // A run that allocated clusters left the blobstore dirty: this load recovered it.
        recovered += usize::from(d.proc.stderr().contains("recovering"));
        let l = lvols(&d);
        assert_eq!(l.len(), 1, "{l:?}");
        let now = l[0]["num_allocated_clusters"].as_u64().unwrap();
        assert!(now >= allocated, "round {round}: {now} clusters, had {allocated}");
        allocated = now;
        stop(d);
        let (ok, out) = check(&dir, &img);
        assert!(ok, "round {round}: {out}");
    }
    assert!(allocated > 0, "the verify runs allocated clusters");
    assert!(recovered > 0, "no run was killed with metadata changed (nothing recovered)");
    // Once more on a clone of a snapshot of it: its first writes copy from the snapshot.
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/thin", "snapshot_name": "snap"})));
    d.call("bdev_lvol_clone", Some(json!({"snapshot_name": "lvs0/snap", "clone_name": "cl"})));
    let snap_clusters = lvols(&d).iter().find(|l| l["name"] == "snap").unwrap()["num_allocated_clusters"].clone();
    stop(d);
    let args = [
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-T",
        "lvs0/cl",
        "-q",
        "32",
        "-o",
        "4096",
        "-w",
        "verify",
        "-t",
        "30",
        "-m",
        "0x1",
    ];
    let mut p = common::Proc::spawn(&dir, "perf-clone", &args);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(matches!(p.child.try_wait(), Ok(None)), "perf ended early: {}", p.stderr());
    p.signal(libc::SIGKILL);
    p.expect_exit(Duration::from_secs(10), "killed perf");
    let d = daemon(&dir, &img);
    let l = lvols(&d);
    assert_eq!(l.len(), 3, "{l:?}");
    let cl = l.iter().find(|v| v["name"] == "cl").unwrap();
    assert_eq!(cl["is_clone"], json!(true));
    assert!(cl["num_allocated_clusters"].as_u64().unwrap() > 0, "the clone copied clusters: {cl}");
    let snap = l.iter().find(|v| v["name"] == "snap").unwrap();
    assert_eq!(snap["num_allocated_clusters"], snap_clusters, "the snapshot is unchanged");
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "after the clone's run: {out}");
}

#[test]
fn renamed_lvols_keep_their_exports_and_the_saved_config_loads() {
    // Exports and namespaces are of the bdev, not of the alias they were named by: a rename of
    // the lvol or its lvstore keeps them, and the config saved after it loads (it names the
    // lvol by its bdev name, the UUID, as SPDK saves it).
    let test = "renamed_lvols_keep_their_exports_and_the_saved_config_loads";
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-rename-exports");
    let (_img, d) = store_of_1mib_clusters(&dir, 64);
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "lvs0", "lvol_name": "v", "size_in_mib": 8})));
    let uuid = d.call("bdev_get_bdevs", Some(json!({"name": "lvs0/v"})))[0]["name"].as_str().unwrap().to_string();
    let u = nbd(&d, "lvs0/v", "v");
    qemu_io(&dir, &u, "write -P 0x71 0 64k; flush");
    let nqn = "nqn.2016-06.io.spdk:rename";
    d.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    d.call("nvmf_create_subsystem", Some(json!({"nqn": nqn, "allow_any_host": true})));
    d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": nqn, "namespace": {"bdev_name": "lvs0/v"}})));

    d.call("bdev_lvol_rename_lvstore", Some(json!({"old_name": "lvs0", "new_name": "lvs1"})));
    d.call("bdev_lvol_rename", Some(json!({"old_name": "lvs1/v", "new_name": "w"})));
    let exports = d.call("nbd_server_get_exports", None);
    assert_eq!(exports.as_array().map(|a| a.len()), Some(1), "the export went with the rename: {exports}");
    qemu_io(&dir, &u, "read -P 0x71 0 64k");
    let subs = d.call("nvmf_get_subsystems", None);
    let ns = subs.as_array().unwrap().iter().find(|s| s["nqn"] == json!(nqn)).unwrap()["namespaces"].clone();
    assert_eq!(ns[0]["bdev_name"], json!(uuid), "the namespace names its bdev, not the old alias: {ns}");

    let cfg = dir.join("saved.json");
    std::fs::write(&cfg, serde_json::to_vec(&d.call("save_config", None)).unwrap()).unwrap();
    stop(d);
    let d2 = Daemon::start(&dir, &["--json", cfg.to_str().unwrap()]);
    let subs = d2.call("nvmf_get_subsystems", None);
    let ns =
        subs.as_array().unwrap().iter().find(|s| s["nqn"] == json!(nqn)).expect("subsystem back")["namespaces"].clone();
    assert_eq!(ns[0]["bdev_name"], json!(uuid), "{ns}");
    let b = d2.call("bdev_get_bdevs", Some(json!({"name": "lvs1/w"})));
    assert_eq!(b[0]["name"], json!(uuid), "{b}");
    let exports = d2.call("nbd_server_get_exports", None);
    assert_eq!(exports.as_array().map(|a| a.len()), Some(1), "the export is back: {exports}");
    stop(d2);
}

#[test]
fn an_lvol_offers_unmap_and_write_zeroes_only_if_its_base_does() {
    let dir = TempDir::new("lvol-base-types");
    let img = sparse_image(&dir, 64);
    let d = Daemon::start(&dir, &[]);
    // An aio bdev without fallocate does neither.
    d.call("bdev_aio_create", Some(json!({"name": "A0", "filename": img.to_str().unwrap(), "block_size": 4096})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "A0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "lvs0", "lvol_name": "v", "size_in_mib": 8})));
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 4096, "block_size": 4096})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "M0", "lvs_name": "lvs1", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "lvs1", "lvol_name": "v", "size_in_mib": 8})));
    for (name, want) in [("A0", false), ("lvs0/v", false), ("M0", true), ("lvs1/v", true)] {
        let b = d.call("bdev_get_bdevs", Some(json!({"name": name})));
        let t = &b[0]["supported_io_types"];
        assert_eq!((t["unmap"].clone(), t["write_zeroes"].clone()), (json!(want), json!(want)), "{name}: {t}");
    }
    stop(d);
}

#[test]
fn shutdown_unloads_stores_stacked_through_other_bdevs_cleanly() {
    // Stores that stand on each other other than directly: one on a passthru over another's
    // lvol, and one whose clone has another store's lvol as external snapshot (made after
    // it). SIGTERM unloads every store cleanly: the upper ones first, nothing left waiting.
    let dir = TempDir::new("lvol-stack-stop");
    let mut d = Daemon::start(&dir, &[]);
    for (m, blocks) in [("m", 131072), ("m1", 65536), ("m2", 65536)] {
        d.call("bdev_malloc_create", Some(json!({"name": m, "num_blocks": blocks, "block_size": 512})));
    }
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "m", "lvs_name": "L", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "L", "lvol_name": "p1", "size_in_mib": 32})));
    d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "L/p1", "name": "pt1"})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "pt1", "lvs_name": "PT", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "PT", "lvol_name": "q1", "size_in_mib": 4})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "m1", "lvs_name": "X", "cluster_sz": MIB})));
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "m2", "lvs_name": "Y", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvs_name": "X", "lvol_name": "ext", "size_in_mib": 8})));
    d.call("bdev_lvol_clone_bdev", Some(json!({"bdev": "X/ext", "lvs_name": "Y", "clone_name": "ec"})));
    d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    d.proc.expect_exit(Duration::from_secs(15), "shutdown with stacked stores");
    let log = d.proc.stderr();
    for s in ["PT", "L", "X", "Y"] {
        assert!(log.contains(&format!("lvstore {s} unloaded")), "lvstore {s} not unloaded cleanly:\n{log}");
    }
    assert!(!log.contains("still open at shutdown"), "something waited for its deadline:\n{log}");
}

/// Allocated clusters and free clusters of lvol `name` and its lvstore, once the releases
/// under way have drained (a released cluster is free shortly after its unmap completes).
fn space_settled(d: &Daemon, name: &str, want_allocated: u64) -> (u64, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let l = lvols(d);
        let a = lvol_named(&l, name)["num_allocated_clusters"].as_u64().unwrap();
        let free = free_clusters(d);
        let draining = d.call("bdev_lvol_get_lvstores", None)[0]["draining_clusters"].as_u64().unwrap_or(0);
        if (a == want_allocated && draining == 0) || std::time::Instant::now() > deadline {
            return (a, free);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unmaps_of_whole_clusters_give_a_thin_lvols_space_back() {
    // The issue's case: a fully written thin 8 MiB lvol (1 MiB clusters) unmapped over NBD with
    // qemu-io's discard and write -z has no cluster left, and the lvstore has them free again.
    // Partial unmaps, a clone's clusters its snapshot also holds, and thick lvols keep theirs.
    if !have("unmaps_of_whole_clusters_give_a_thin_lvols_space_back", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("lvol-release");
    let (img, d) = store_of_1mib_clusters(&dir, 64);
    let free0 = free_clusters(&d);
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "vol", "size_in_mib": 8, "lvs_name": "lvs0", "thin_provision": true})),
    );
    let u = nbd(&d, "lvs0/vol", "vol");
    qemu_io(&dir, &u, "write -P 0x11 0 8M; flush");
    assert_eq!(space_settled(&d, "vol", 8), (8, free0 - 8));
    qemu_io(&dir, &u, "discard 0 4M");
    assert_eq!(space_settled(&d, "vol", 4), (4, free0 - 4), "discard 0 4M gave 4 clusters back");
    qemu_io(&dir, &u, "write -z 4M 4M");
    assert_eq!(space_settled(&d, "vol", 0), (0, free0), "write -z 4M 4M gave the other 4 back");
    qemu_io(&dir, &u, "read -P 0 0 8M");
    // Written again: new clusters, the data reads back.
    qemu_io(&dir, &u, "write -P 0x22 0 3M; flush");
    qemu_io(&dir, &u, "read -P 0x22 0 3M");
    assert_eq!(space_settled(&d, "vol", 3).0, 3);
    // Part of a cluster: unmapped in place, the cluster stays.
    qemu_io(&dir, &u, "discard 0 512k");
    qemu_io(&dir, &u, "write -z 1M 1020k");
    qemu_io(&dir, &u, "read -P 0 1M 1020k");
    qemu_io(&dir, &u, "read -P 0x22 2044k 1028k");
    assert_eq!(space_settled(&d, "vol", 3).0, 3, "partial unmaps keep their clusters");
    // A clone keeps the clusters its snapshot holds (0-2), gives back its own (5).
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/vol", "snapshot_name": "snap"})));
    qemu_io(&dir, &u, "write -P 0x33 0 1M; write -P 0x44 5M 1M; flush");
    assert_eq!(space_settled(&d, "vol", 2).0, 2);
    qemu_io(&dir, &u, "discard 0 1M; discard 5M 1M");
    assert_eq!(space_settled(&d, "vol", 1).0, 1, "cluster 5 released, cluster 0 kept");
    qemu_io(&dir, &u, "read -P 0 5M 1M");
    qemu_io(&dir, &u, "read -P 0x22 2044k 1028k");
    // A thick lvol keeps its clusters.
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "thick", "size_in_mib": 2, "lvs_name": "lvs0"})));
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "lvs0/thick", "name": "thick"})));
    let ut = u.replace("/vol", "/thick");
    qemu_io(&dir, &ut, "write -P 0x55 0 2M; discard 0 2M");
    assert_eq!(space_settled(&d, "thick", 2).0, 2, "a thick lvol keeps its clusters");
    let free = free_clusters(&d);
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
    // The space given back stays given back.
    let d = daemon(&dir, &img);
    assert_eq!(free_clusters(&d), free);
    assert_eq!(lvol_named(&lvols(&d), "vol")["num_allocated_clusters"].as_u64(), Some(1));
    stop(d);
}

/// One qemu-io command of the kill -9 run: a whole-cluster write of a tag, or a discard.
#[derive(Clone, Copy, Debug)]
enum ClusterOp {
    Write(u64, u8),
    Discard(u64),
}

#[test]
fn kill_9_while_unmaps_release_clusters_recovers_what_was_acknowledged() {
    // qemu-io writes whole clusters of a thin lvol and discards them (each discard releases its
    // cluster) in a seeded order; the daemon is killed -9 mid-run, three times. After each
    // restart every cluster reads what the acknowledged commands left (the one in flight may or
    // may not have happened), the lvol has exactly the clusters that hold data (nothing leaked,
    // nothing lost), and after a clean stop the offline checker finds the lvstore consistent.
    if !have("kill_9_while_unmaps_release_clusters_recovers_what_was_acknowledged", &["qemu-io", "qemu-img"]) {
        return;
    }
    const CLUSTERS: u64 = 12;
    let dir = TempDir::new("lvol-release-kill9");
    let (img, d) = store_of_1mib_clusters(&dir, 64);
    let free0 = free_clusters(&d);
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "vol", "size_in_mib": CLUSTERS, "lvs_name": "lvs0", "thin_provision": true})),
    );
    stop(d);
    let mut state = vec![0u8; CLUSTERS as usize];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for round in 0..3u64 {
        let d = daemon(&dir, &img);
        let u = nbd(&d, "lvs0/vol", "vol");
        let ops: Vec<ClusterOp> = (0..2000)
            .map(|_| match next(3) {
                0 => ClusterOp::Discard(next(CLUSTERS)),
                _ => ClusterOp::Write(next(CLUSTERS), 1 + next(254) as u8),
            })
            .collect();
        let cmds: Vec<String> = ops
            .iter()
            .map(|op| match *op {
                ClusterOp::Write(c, v) => format!("write -P {v} {} 1M", c * MIB),
                ClusterOp::Discard(c) => format!("discard {} 1M", c * MIB),
            })
            .collect();
        let mut args = vec!["-f", "raw"];
        for c in &cmds {
            args.extend(["-c", c.as_str()]);
        }
        args.push(&u);
        let tool = nbd_common::Tool::spawn(&dir, "qemu-io", &args);
        std::thread::sleep(Duration::from_millis(400 + 300 * round));
        let mut d = d;
        d.proc.signal(libc::SIGKILL);
        d.proc.expect_exit(Duration::from_secs(10), "killed daemon");
        let out = tool.wait(Duration::from_secs(60));
        // qemu-io runs its commands in order: the acknowledged ones are the first lines that
        // say so, and the next command was in flight.
        // (Each prints its line, then a line of timings; the first failure ends the list.)
        let done = out
            .stdout
            .lines()
            .chain(out.stderr.lines())
            .take_while(|l| !l.contains("failed") && !l.contains("rror"))
            .filter(|l| l.starts_with("wrote 1048576/1048576") || l.starts_with("discard 1048576/1048576"))
            .count();
        assert!(done > 0 && done < ops.len(), "round {round}: {done} of {} commands done: {}", ops.len(), out.stderr);
        eprintln!("round {round}: {done} commands acknowledged before the kill");
        for op in &ops[..done] {
            match *op {
                ClusterOp::Write(c, v) => state[c as usize] = v,
                ClusterOp::Discard(c) => state[c as usize] = 0,
            }
        }
        let d = daemon(&dir, &img);
        let u = nbd(&d, "lvs0/vol", "vol");
        let data = nbd_read(&dir, &u);
        let in_flight = ops[done];
        for c in 0..CLUSTERS {
            let got = &data[(c * MIB) as usize..((c + 1) * MIB) as usize];
            let v = got[0];
            assert!(got.iter().all(|&b| b == v), "round {round}: cluster {c} is torn");
            let maybe = match in_flight {
                ClusterOp::Write(x, w) if x == c => Some(w),
                ClusterOp::Discard(x) if x == c => Some(0),
                _ => None,
            };
            assert!(
                v == state[c as usize] || Some(v) == maybe,
                "round {round}: cluster {c} reads {v:#x}, acknowledged {:#x}, in flight {in_flight:?}",
                state[c as usize]
            );
            state[c as usize] = v;
        }
        let with_data = state.iter().filter(|&&v| v != 0).count() as u64;
        let l = lvols(&d);
        let allocated = lvol_named(&l, "vol")["num_allocated_clusters"].as_u64().unwrap();
        // The command in flight may have left its cluster allocated and reading zeroes: a
        // discard that unmapped it without releasing it yet, or a first write whose allocation
        // was recorded before its data landed.
        let (ClusterOp::Write(c, _) | ClusterOp::Discard(c)) = in_flight;
        let slack = u64::from(state[c as usize] == 0);
        assert!(
            allocated >= with_data && allocated <= with_data + slack,
            "round {round}: {allocated} clusters allocated, {with_data} hold data (in flight {in_flight:?})"
        );
        let free = free_clusters(&d);
        assert_eq!(free, free0 - allocated, "round {round}: the lvstore's free clusters");
        stop(d);
        let (ok, report) = check(&dir, &img);
        assert!(ok, "round {round}: {report}");
    }
}

#[test]
fn an_inflate_without_room_fails_at_once_and_changes_nothing() {
    // The issue's case: a 1 GiB lvstore (1 MiB clusters), a thick 900 MiB lvol and its
    // snapshot; the clone needs 900 clusters to inflate and about 119 are free. The inflate and
    // the decouple fail with ENOSPC naming what they needed, and take no cluster (they used to
    // leave 96 allocated, which made other thin lvols run out early).
    let dir = TempDir::new("lvol-inflate-nospc");
    let (img, d) = store_of_1mib_clusters(&dir, 1024);
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "vol", "size_in_mib": 900, "lvs_name": "lvs0"})));
    d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/vol", "snapshot_name": "snap"})));
    let free = || free_clusters(&d);
    let before = free();
    assert!(before < 900, "{before} free");
    for m in ["bdev_lvol_inflate", "bdev_lvol_decouple_parent"] {
        let e = d.call_err(m, Some(json!({"name": "lvs0/vol"})));
        assert_eq!(e.code, FAILED, "{m}: {e:?}");
        assert!(e.message.contains(&format!("needs 900 clusters, {before} free")), "{m}: {e:?}");
        assert_eq!(free(), before, "{m} took no cluster");
        let l = lvols(&d);
        assert_eq!(lvol_named(&l, "vol")["num_allocated_clusters"].as_u64(), Some(0), "{m}");
        assert_eq!(lvol_named(&l, "vol")["is_clone"], json!(true), "{m}");
    }
    // A thin lvol can still use every free cluster.
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "thin", "size_in_mib": 2048, "lvs_name": "lvs0", "thin_provision": true})),
    );
    let e = d.call_err("bdev_lvol_resize", Some(json!({"name": "lvs0/snap", "size_in_mib": 2000})));
    assert_eq!(e.code, FAILED, "a snapshot is not resized: {e:?}");
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "t2", "size_in_mib": before, "lvs_name": "lvs0"})));
    assert_eq!(free(), 0, "a thick lvol took every free cluster");
    stop(d);
    let (ok, out) = check(&dir, &img);
    assert!(ok, "{out}");
}

#[test]
fn perf_waits_for_examine_before_it_looks_for_its_bdevs() {
    // A config with only the lvstore's base bdev (no bdev_wait_for_examine): as bdevperf,
    // `ferrite perf -T lvs0/vol` finds the lvol that examine registers, and verifies through it.
    let dir = TempDir::new("lvol-perf-examine");
    let (img, d) = store_of_1mib_clusters(&dir, 64);
    d.call(
        "bdev_lvol_create",
        Some(json!({"lvol_name": "vol", "size_in_mib": 16, "lvs_name": "lvs0", "thin_provision": true})),
    );
    stop(d);
    let cfg = dir.write_json(
        "perf.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_uring_create", "params": {"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096}}]}]}),
    );
    let args =
        ["perf", "--json", cfg.to_str().unwrap(), "-T", "lvs0/vol", "-q", "8", "-o", "4096", "-w", "verify", "-t", "1"];
    let out = run_tool(&dir, common::FERRITE, &args, Duration::from_secs(60));
    out.assert_ok("ferrite perf -T lvs0/vol");
    assert!(out.stdout.contains("lvs0/vol") || out.stdout.contains("Job"), "{}", out.stdout);
    let d = daemon(&dir, &img);
    assert!(lvol_named(&lvols(&d), "vol")["num_allocated_clusters"].as_u64().unwrap() > 0, "the run wrote");
    stop(d);
}

/// The outcome of one call: Ok, or the JSON-RPC error code.
fn outcome(sock: &std::path::Path, method: &str, params: &Value) -> Result<(), i32> {
    let mut c = ferrite_rpc::client::RpcClient::connect(sock, Duration::from_secs(30)).expect("connect");
    match c.call(method, Some(params.clone())) {
        Ok(_) => Ok(()),
        Err(ferrite_rpc::client::CallError::Rpc(e)) => Err(e.code),
        Err(e) => panic!("{method}: {e}"),
    }
}

#[test]
fn lvol_failures_answer_spdks_json_rpc_codes() {
    // The same requests to SPDK v26.05's spdk_tgt and to Ferrite: every failure gets the code
    // SPDK gives (a negative errno for what its RPC checks before the operation starts, -32602
    // or -32603 for what the operation's completion reports), so a client that branches on the
    // code behaves the same. Ferrite's messages stay its own.
    let test = "lvol_failures_answer_spdks_json_rpc_codes";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    let dir = TempDir::new("lvol-codes");
    let s = SpdkTgt::start(&spdk, &dir);
    let d = Daemon::start(&dir, &[]);
    let setup = [
        ("bdev_malloc_create", json!({"name": "M0", "num_blocks": 16384, "block_size": 4096})),
        ("bdev_malloc_create", json!({"name": "M1", "num_blocks": 16384, "block_size": 4096})),
        ("bdev_malloc_create", json!({"name": "Tiny", "num_blocks": 64, "block_size": 4096})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "M1", "lvs_name": "lvs0", "cluster_sz": MIB})),
        ("bdev_lvol_create", json!({"lvol_name": "v", "size_in_mib": 4, "lvs_name": "lvs0"})),
        ("bdev_lvol_create", json!({"lvol_name": "w", "size_in_mib": 4, "lvs_name": "lvs0"})),
        ("bdev_lvol_inflate", json!({"name": "lvs0/v"})),
    ];
    for (m, p) in &setup {
        assert_eq!(outcome(&s.sock, m, p), Ok(()), "SPDK: {m} {p}");
        assert_eq!(outcome(&d.sock, m, p), Ok(()), "Ferrite: {m} {p}");
    }
    let failing = [
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "M0", "lvs_name": "x", "cluster_sz": 6000})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "Tiny", "lvs_name": "x"})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "Nope", "lvs_name": "x"})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "M0", "lvs_name": "n".repeat(64)})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "M1", "lvs_name": "other"})),
        ("bdev_lvol_create_lvstore", json!({"bdev_name": "M0", "lvs_name": "lvs0"})),
        ("bdev_lvol_create", json!({"lvol_name": "v", "size_in_mib": 4, "lvs_name": "lvs0"})),
        ("bdev_lvol_create", json!({"lvol_name": "b", "size_in_mib": 4096, "lvs_name": "lvs0"})),
        ("bdev_lvol_create", json!({"lvol_name": "c", "size_in_mib": 4, "lvs_name": "none"})),
        ("bdev_lvol_create", json!({"lvol_name": "c", "size_in_mib": 4})),
        ("bdev_lvol_delete", json!({"name": "lvs0/zz"})),
        ("bdev_lvol_resize", json!({"name": "lvs0/zz", "size_in_mib": 4})),
        ("bdev_lvol_resize", json!({"name": "lvs0/v", "size_in_mib": 4096})),
        ("bdev_lvol_snapshot", json!({"lvol_name": "lvs0/zz", "snapshot_name": "s"})),
        ("bdev_lvol_snapshot", json!({"lvol_name": "lvs0/v", "snapshot_name": "w"})),
        ("bdev_lvol_clone", json!({"snapshot_name": "lvs0/v", "clone_name": "c2"})),
        ("bdev_lvol_decouple_parent", json!({"name": "lvs0/v"})),
        ("bdev_lvol_rename", json!({"old_name": "lvs0/v", "new_name": "w"})),
        ("bdev_lvol_rename_lvstore", json!({"old_name": "nope", "new_name": "x"})),
        ("bdev_lvol_delete_lvstore", json!({"lvs_name": "nope"})),
        ("bdev_lvol_grow_lvstore", json!({"lvs_name": "nope"})),
        ("bdev_lvol_set_read_only", json!({"name": "lvs0/zz"})),
        ("bdev_lvol_get_lvols", json!({"lvs_name": "nope"})),
        ("bdev_lvol_get_lvstores", json!({"lvs_name": "nope"})),
        ("bdev_lvol_set_parent", json!({"lvol_name": "lvs0/v", "parent_name": "lvs0/w"})),
        ("bdev_lvol_clone_bdev", json!({"bdev": "Nope", "lvs_name": "lvs0", "clone_name": "c3"})),
    ];
    // Sizes of 0: SPDK makes an lvol bdev of 0 blocks; Ferrite refuses (EINVAL, see
    // docs/ARCHITECTURE.md): no target can serve a bdev without blocks.
    for (m, p) in [
        ("bdev_lvol_create", json!({"lvol_name": "zero", "size_in_mib": 0, "lvs_name": "lvs0"})),
        ("bdev_lvol_resize", json!({"name": "lvs0/w", "size_in_mib": 0})),
    ] {
        assert_eq!(outcome(&s.sock, m, &p), Ok(()), "SPDK: {m} {p}");
        assert_eq!(outcome(&d.sock, m, &p), Err(-libc::EINVAL), "Ferrite: {m} {p}");
    }
    let mut differ = Vec::new();
    for (m, p) in &failing {
        let (want, got) = (outcome(&s.sock, m, p), outcome(&d.sock, m, p));
        assert!(want.is_err(), "SPDK accepted {m} {p}");
        if want != got {
            differ.push(format!("{m} {p}: SPDK {want:?}, Ferrite {got:?}"));
        }
    }
    assert!(differ.is_empty(), "codes differ:\n{}", differ.join("\n"));
    s.stop();
}
/// `ferrite blobstore check` on `img`: its exit status and output.
fn check_code(dir: &TempDir, img: &std::path::Path) -> (Option<i32>, String) {
    let out = run_tool(dir, common::FERRITE, &["blobstore", "check", img.to_str().unwrap()], Duration::from_secs(30));
    (out.status.code(), out.stdout)
}

/// A copy of `src` named `name` in `dir` with its super block edited (the CRC recomputed).
fn edited_copy(
    dir: &TempDir,
    src: &std::path::Path,
    name: &str,
    edit: impl FnOnce(&mut ferrite_blob::format::SuperBlock),
) -> std::path::PathBuf {
    use std::os::unix::fs::FileExt;
    let dst = dir.join(name);
    std::fs::copy(src, &dst).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&dst).unwrap();
    let mut page = vec![0u8; 4096];
    f.read_exact_at(&mut page, 0).unwrap();
    let mut sb = ferrite_blob::format::SuperBlock::decode(&page).unwrap();
    edit(&mut sb);
    f.write_all_at(&sb.encode(), 0).unwrap();
    dst
}

#[test]
fn a_grow_cut_short_by_kill_9_loads_again() {
    let test = "a_grow_cut_short_by_kill_9_loads_again";
    let dir = TempDir::new("lvol-growkill");
    let img = dir.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 * MIB).unwrap();
    let d = daemon(&dir, &img);
    d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": MIB})));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "a", "size_in_mib": 8, "lvs_name": "lvs0"})));
    stop(d);
    // The grow writes the super block (256 clusters, not clean); the cluster mask keeps its 64
    // bits until the unload, which a kill -9 never reaches.
    f.set_len(256 * MIB).unwrap();
    let mut d = daemon(&dir, &img);
    d.call("bdev_uring_rescan", Some(json!({"name": "U0"})));
    assert_eq!(d.call("bdev_lvol_grow_lvstore", Some(json!({"lvs_name": "lvs0"}))), json!(true));
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "b", "size_in_mib": 100, "lvs_name": "lvs0"})));
    let grown = d.call("bdev_lvol_get_lvstores", None)[0]["total_data_clusters"].clone();
    assert_eq!(grown.as_u64(), Some(255), "{grown}");
    d.proc.signal(libc::SIGKILL);
    d.proc.expect_exit(Duration::from_secs(10), "killed");
    let (code, out) = check_code(&dir, &img);
    assert_eq!(code, Some(3), "a grow cut short is what the next load repairs: {out}");
    assert!(out.contains("used cluster mask covers 64 of 256 clusters (a grow cut short)"), "{out}");
    // SPDK v26.05 loads it (it recovers a store not unloaded cleanly), with the grown size.
    if let Some(spdk) = common::spdk_or_skip(test) {
        let copy = dir.join("spdk.img");
        std::fs::copy(&img, &copy).unwrap();
        let tgt = SpdkTgt::start(&spdk, &dir);
        tgt.rpc(&["bdev_aio_create", copy.to_str().unwrap(), "A0", "4096"]);
        tgt.rpc(&["bdev_wait_for_examine"]);
        let lvs = tgt.rpc(&["bdev_lvol_get_lvstores"]);
        let lvols = tgt.rpc(&["bdev_lvol_get_lvols"]);
        tgt.stop();
        assert_eq!(lvs[0]["total_data_clusters"], grown, "SPDK: {lvs}");
        assert_eq!(lvols.as_array().map(|l| l.len()), Some(2), "SPDK: {lvols}");
        let (code, out) = check_code(&dir, &copy);
        assert_eq!(code, Some(0), "after SPDK: {out}");
    }
    // So does Ferrite; after a clean stop the store checks clean.
    let d = daemon(&dir, &img);
    assert!(d.proc.stderr().contains("recovering"), "{}", d.proc.stderr());
    assert_eq!(d.call("bdev_lvol_get_lvstores", None)[0]["total_data_clusters"], grown);
    assert_eq!(lvols(&d).len(), 2);
    stop(d);
    let (code, out) = check_code(&dir, &img);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn examine_says_why_no_lvstore_loads() {
    let test = "examine_says_why_no_lvstore_loads";
    let dir = TempDir::new("lvol-noload");
    let (img, d) = store_of_1mib_clusters(&dir, 64);
    d.call("bdev_lvol_create", Some(json!({"lvol_name": "a", "size_in_mib": 4, "lvs_name": "lvs0"})));
    stop(d);
    let none = edited_copy(&dir, &img, "none.img", |sb| sb.super_blob = ferrite_blob::format::BLOBID_INVALID);
    // Md page 0x40 starts no blob (the store has two, at pages 0 and 1).
    let stray = edited_copy(&dir, &img, "stray.img", |sb| sb.super_blob = 0x1_0000_0040);
    let iou = edited_copy(&dir, &img, "iou.img", |sb| sb.io_unit_size = 1);
    let cases = [
        ("B1", &none, "the super block names no super blob", "super block names no super blob"),
        ("B2", &stray, "super blob 0x100000040 is not a blob of this store", "super blob 0x100000040 is not a blob"),
        ("B3", &iou, "the blobstore's I/O unit (1 B) is not the device's block (4096 B)", "io_unit_size 1 is not"),
    ];
    for (_, path, _, problem) in &cases {
        let (code, out) = check_code(&dir, path);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains(problem), "{out}");
    }
    let d = Daemon::start(&dir, &[]);
    for (name, path, _, _) in &cases {
        d.call(
            "bdev_uring_create",
            Some(json!({"name": name, "filename": path.to_str().unwrap(), "block_size": 4096})),
        );
    }
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(d.call("bdev_lvol_get_lvstores", None), json!([]));
    d.assert_serving();
    let log = d.proc.stderr();
    for (name, _, why, _) in &cases {
        let line = log.lines().find(|l| l.contains(&format!("lvol examine of {name}: ")));
        let line = line.unwrap_or_else(|| panic!("no examine line for {name}: {log}"));
        assert!(line.contains("WARN") && line.contains("no lvstore loads from it: ") && line.contains(why), "{line}");
    }
    assert!(!log.contains("panicked"), "{log}");
    stop(d);
    // SPDK v26.05: no lvstore from either super blob; from io_unit_size 1 it does load one, but
    // its lvol is a bdev of 1-byte blocks whose I/O fails (the check calls that a problem too).
    if let Some(spdk) = common::spdk_or_skip(test) {
        let tgt = SpdkTgt::start(&spdk, &dir);
        for (name, path, _, _) in &cases {
            tgt.rpc(&["bdev_aio_create", path.to_str().unwrap(), name, "4096"]);
        }
        tgt.rpc(&["bdev_wait_for_examine"]);
        let lvs = tgt.rpc(&["bdev_lvol_get_lvstores"]);
        let lvols = tgt.rpc(&["bdev_lvol_get_lvols"]);
        let bdevs = tgt.rpc(&["bdev_get_bdevs"]);
        drop(tgt); // killed: its shutdown with such an lvol is not ours to wait for
        let bases: Vec<&Value> = lvs.as_array().unwrap().iter().map(|l| &l["base_bdev"]).collect();
        assert_eq!(bases, vec![&json!("B3")], "SPDK's lvstores: {lvs}");
        let alias = lvols[0]["alias"].as_str().unwrap();
        let lvol = bdevs.as_array().unwrap().iter().find(|b| b["aliases"].as_array().unwrap().contains(&json!(alias)));
        assert_eq!(lvol.unwrap()["block_size"], json!(1), "{bdevs}");
    }
}
