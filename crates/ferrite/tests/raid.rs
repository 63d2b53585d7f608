//! RAID bdevs through the daemon with real clients: every level under `ferrite perf -w verify`;
//! a raid1 whose member fails reads (the error bdev) still verifies, writes the good data back
//! to that member and fails it if the write-back fails too (SPDK's read-error correction); bad requests get SPDK's
//! JSON-RPC errors and the daemon goes on; save_config restores a RAID; a raid1 loses a member,
//! rebuilds a new one while qemu-io writes over NBD, and every write reads back from the
//! rebuilt member alone; and SPDK v26.05's RAID superblock both ways: a raid1 spdk_dd made and
//! wrote assembles in Ferrite by examine, and one Ferrite made and wrote is read by spdk_dd; a
//! raid5f spdk_dd made and wrote reads back in Ferrite, whole and without a member (SPDK's
//! parity). raid5f verifies under perf with full-stripe I/O, whole, degraded and while a member
//! is rebuilt.

mod common;
mod nbd_common;

use common::{Daemon, Proc, TempDir};
use nbd_common::{export_nbd, have, qemu_io_script, run_tool};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn m(method: &str, params: Value) -> Value {
    json!({"method": method, "params": params})
}

/// A config whose "bdev" subsystem runs `entries` in order.
fn config(dir: &TempDir, name: &str, entries: Vec<Value>) -> String {
    let mut e = entries;
    e.push(json!({"method": "bdev_wait_for_examine"}));
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": e}]});
    dir.write_json(name, &doc).to_str().unwrap().to_string()
}

fn malloc(name: &str, blocks: u64) -> Value {
    m("bdev_malloc_create", json!({"name": name, "num_blocks": blocks, "block_size": 512}))
}

/// `ferrite perf` verify on `bdev` of config `cfg`: no failed I/O, no verify error.
fn verify_ok(dir: &TempDir, tag: &str, cfg: &str, bdev: &str) {
    verify_ok_io(dir, tag, cfg, bdev, 16384)
}

/// As `verify_ok`, with I/O of `io_size` bytes.
fn verify_ok_io(dir: &TempDir, tag: &str, cfg: &str, bdev: &str, io_size: u32) {
    let io_size = io_size.to_string();
    let results = dir.join(&format!("{tag}.json"));
    let args = [
        "perf",
        "--json",
        cfg,
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
        &io_size,
        "-t",
        "2",
    ];
    let mut p = Proc::spawn(dir, tag, &args);
    let st = p.expect_exit(Duration::from_secs(30), tag);
    let out = format!("stdout:\n{}\nstderr:\n{}", p.stdout(), p.stderr());
    assert_eq!(st.code(), Some(0), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let r = &doc["results"][0];
    assert_eq!(r["job"], bdev, "{doc}");
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}\n{out}");
    assert_eq!(r["verify_errors"], 0, "{doc}\n{out}");
}

#[test]
fn every_level_verifies_under_perf() {
    let dir = TempDir::new("raid-verify");
    let cfg = config(
        &dir,
        "levels.json",
        vec![
            malloc("M0", 16384),
            malloc("M1", 16384),
            malloc("M2", 16384),
            malloc("M3", 16384),
            malloc("M4", 8192),
            malloc("M5", 4096),
            malloc("M6", 16384),
            malloc("M7", 16384),
            m(
                "bdev_raid_create",
                json!({"name": "R0", "raid_level": "raid0", "strip_size_kb": 4, "base_bdevs": ["M0", "M1", "M2"]}),
            ),
            m(
                "bdev_raid_create",
                json!({"name": "C0", "raid_level": "concat", "strip_size_kb": 64, "base_bdevs": ["M3", "M4", "M5"]}),
            ),
            m(
                "bdev_raid_create",
                json!({"name": "R1", "raid_level": "raid1", "base_bdevs": ["M6", "M7"], "superblock": true}),
            ),
        ],
    );
    for b in ["R0", "C0", "R1"] {
        verify_ok(&dir, &format!("verify-{b}"), &cfg, b);
    }
}

#[test]
fn raid5f_verifies_whole_degraded_and_rebuilding_under_perf() {
    let dir = TempDir::new("raid5f-verify");
    let members = |p: &str| (0..3).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    let mut e: Vec<Value> =
        members("P").iter().chain(&members("Q")).chain(&members("B")).map(|n| malloc(n, 16384)).collect();
    // Strips of 8 KiB over three members: a stripe (the write unit) is 16 KiB.
    for (name, p) in [("F5", "P"), ("D5", "Q"), ("B5", "B")] {
        e.push(m(
            "bdev_raid_create",
            json!({"name": name, "raid_level": "raid5f", "strip_size_kb": 8, "base_bdevs": members(p), "superblock": true}),
        ));
    }
    // D5 loses a member: its reads of that member's strips are rebuilt from parity.
    e.push(m("bdev_raid_remove_base_bdev", json!({"name": "Q1"})));
    // B5 loses one and takes it back: rebuilt from the others (slowly) while perf verifies.
    e.push(m("bdev_raid_set_options", json!({"process_max_bandwidth_mb_sec": 4, "process_window_size_kb": 64})));
    e.push(m("bdev_raid_remove_base_bdev", json!({"name": "B2"})));
    e.push(m("bdev_raid_add_base_bdev", json!({"raid_bdev": "B5", "base_bdev": "B2"})));
    let cfg = config(&dir, "r5.json", e);
    verify_ok_io(&dir, "verify-F5", &cfg, "F5", 16384);
    verify_ok_io(&dir, "verify-D5", &cfg, "D5", 32768);
    verify_ok_io(&dir, "verify-B5", &cfg, "B5", 16384);
}

#[test]
fn raid1_reads_go_on_when_a_member_fails_them() {
    let dir = TempDir::new("raid-fault");
    let cfg = config(
        &dir,
        "fault.json",
        vec![
            malloc("F0", 16384),
            malloc("F1", 16384),
            m("bdev_error_create", json!({"base_name": "F1"})),
            m("bdev_raid_create", json!({"name": "RF", "raid_level": "raid1", "base_bdevs": ["F0", "EE_F1"]})),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_F1", "io_type": "read", "error_type": "failure", "num": 100000}),
            ),
        ],
    );
    verify_ok(&dir, "fault", &cfg, "RF");
}

/// Waits until `name` has `n` members discovered and no rebuild runs; the raid.
fn wait_whole(d: &Daemon, name: &str, n: u64) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let r = raid(d, name);
        if r["num_base_bdevs_discovered"] == n && r.get("process").is_none_or(Value::is_null) {
            return r;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{name} whole again: {r}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SPDK's bdevperf verifies over NVMe/TCP on raid1 and raid5f (full stripes) while a member
/// starts failing its writes mid-run: no error reaches bdevperf, the member is dropped; a new
/// member is rebuilt, and then with each member out in turn the volume reads the same (every
/// member, parity included, holds what it should).
#[test]
fn spdk_bdevperf_verifies_over_nvmf_while_a_member_fails() {
    let test = "spdk_bdevperf_verifies_over_nvmf_while_a_member_fails";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-img"]) {
        return;
    }
    for (level, members, io_size, strip) in [("raid1", 2, 4096, 0), ("raid5f", 3, 131072, 64)] {
        let dir = TempDir::new(&format!("raid-bdevperf-{level}"));
        let d = Daemon::start(&dir, &[]);
        let names: Vec<String> = (0..members).map(|i| format!("M{i}")).collect();
        for n in names.iter().chain([&"N0".to_string()]) {
            d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 16384, "block_size": 512})));
        }
        d.call("bdev_error_create", Some(json!({"base_name": "M1"})));
        let mut base: Vec<String> = names.clone();
        base[1] = "EE_M1".into();
        let mut p = json!({"name": "RB", "raid_level": level, "base_bdevs": base});
        if strip > 0 {
            p["strip_size_kb"] = json!(strip);
        }
        d.call("bdev_raid_create", Some(p));
        let nqn = format!("nqn.2016-06.io.spdk:{level}");
        let port = common::nvmf_export(&d, "RB", &nqn);
        common::bdevperf_verify_over_nvmf(&spdk, &dir, port, &nqn, io_size, 6, Duration::from_secs(3), || {
            d.call(
                "bdev_error_inject_error",
                Some(json!({"name": "EE_M1", "io_type": "write", "error_type": "failure", "num": 1000000})),
            );
        });
        let r = raid(&d, "RB");
        assert_eq!(r["num_base_bdevs_discovered"], members - 1, "{level}: the failing member is dropped: {r}");
        d.call("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "RB", "base_bdev": "N0"})));
        wait_whole(&d, "RB", members);
        let u = export_nbd(&d, "RB", "rb");
        let whole = nbd_read(&dir, &u, usize::MAX);
        let members_now: Vec<String> = raid(&d, "RB")["base_bdevs_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap().to_string())
            .collect();
        for m in &members_now {
            assert_eq!(d.call("bdev_raid_remove_base_bdev", Some(json!({"name": m}))), json!(true));
            assert!(nbd_read(&dir, &u, usize::MAX) == whole, "{level}: the volume without {m} reads the same");
            d.call("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "RB", "base_bdev": m})));
            wait_whole(&d, "RB", members);
        }
        d.assert_serving();
    }
}

/// The daemon's RAID, by bdev_raid_get_bdevs.
fn raid(d: &Daemon, name: &str) -> Value {
    let all = d.call("bdev_raid_get_bdevs", Some(json!({"category": "all"})));
    all.as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap_or(Value::Null)
}

#[test]
fn bad_raid_requests_get_errors_and_the_daemon_goes_on() {
    let dir = TempDir::new("raid-bad");
    let d = Daemon::start(&dir, &[]);
    for (n, bs) in [("B0", 512), ("B1", 512), ("B2", 512), ("K0", 4096)] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 8192 * 512 / bs, "block_size": bs})));
    }
    let create = |p: Value| d.call_err("bdev_raid_create", Some(p));
    let e = create(json!({"name": "X", "raid_level": "raid6", "base_bdevs": ["B0", "B1"]}));
    assert_eq!(e.code, -32700, "unknown level: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid0", "strip_size_kb": 3, "base_bdevs": ["B0", "B1"]}));
    assert!(e.code == -libc::EINVAL && e.message.contains("Failed to create RAID bdev X"), "strip size: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid1", "strip_size_kb": 64, "base_bdevs": ["B0", "B1"]}));
    assert_eq!(e.code, -libc::EINVAL, "raid1 with a strip: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid0", "strip_size_kb": 64, "base_bdevs": ["B0", "K0"]}));
    assert!(e.code == -libc::EINVAL && e.message.contains("blocklen"), "block sizes: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid5f", "strip_size_kb": 64, "base_bdevs": ["B0", "B1"]}));
    assert!(e.code == -libc::EINVAL && e.message.contains("At least 3 base devices"), "raid5f of two: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid5f", "base_bdevs": ["B0", "B1", "B2"]}));
    assert!(e.code == -libc::EINVAL && e.message.contains("Invalid strip size 0"), "raid5f without a strip: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid1"}));
    assert_eq!(e.code, -32700, "no members: {e:?}");
    let e = create(json!({"name": "X", "raid_level": "raid1", "base_bdevs": ["B0", ""]}));
    assert_eq!(e.code, -libc::EINVAL, "an empty name: {e:?}");
    assert_eq!(
        d.call("bdev_raid_create", Some(json!({"name": "OK", "raid_level": "raid1", "base_bdevs": ["B0", "B1"]}))),
        json!(true)
    );
    let e = create(json!({"name": "X", "raid_level": "raid1", "base_bdevs": ["B1", "B2"]}));
    assert_eq!(e.code, -libc::EPERM, "a claimed member: {e:?}");
    assert!(raid(&d, "X").is_null(), "nothing left of a failed create");
    let e = d.call_err("bdev_malloc_delete", Some(json!({"name": "nosuch"})));
    assert!(e.code != 0);
    // A member that is not there yet: configuring (SPDK's behaviour), online once it is.
    assert_eq!(
        d.call("bdev_raid_create", Some(json!({"name": "W", "raid_level": "raid1", "base_bdevs": ["B2", "Later"]}))),
        json!(true)
    );
    assert_eq!(raid(&d, "W")["state"], "configuring");
    assert_eq!(d.call("bdev_raid_get_bdevs", Some(json!({"category": "configuring"}))).as_array().unwrap().len(), 1);
    d.call("bdev_malloc_create", Some(json!({"name": "Later", "num_blocks": 8192, "block_size": 512})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(raid(&d, "W")["state"], "online");
    let e = d.call_err("bdev_raid_get_bdevs", Some(json!({"category": "sideways"})));
    assert_eq!(e.code, -32700, "{e:?}");
    let e = d.call_err("bdev_raid_delete", Some(json!({"name": "nosuch"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = d.call_err("bdev_raid_remove_base_bdev", Some(json!({"name": "nosuch"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = d.call_err("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "nosuch", "base_bdev": "B2"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    let e = d.call_err("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "OK", "base_bdev": "K0"})));
    assert_eq!(e.code, -libc::EINVAL, "no empty slot: {e:?}");
    // The members are claimed: not deletable under the RAID's feet for writing by others.
    let e = d.call_err("bdev_passthru_create", Some(json!({"base_bdev_name": "B0", "name": "P"})));
    assert!(e.code != 0, "{e:?}");
    assert_eq!(d.call("bdev_raid_delete", Some(json!({"name": "OK"}))), json!(true));
    assert_eq!(d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "B0", "name": "P"}))), json!("P"));
    d.assert_serving();
}

#[test]
fn save_config_restores_a_raid() {
    let dir = TempDir::new("raid-save");
    let d = Daemon::start(&dir, &[]);
    for n in ["S0", "S1"] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 8192, "block_size": 512})));
    }
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "RS", "raid_level": "raid0", "strip_size_kb": 16, "base_bdevs": ["S0", "S1"]})),
    );
    d.call("bdev_raid_set_options", Some(json!({"process_window_size_kb": 512})));
    let saved = d.call("save_config", None);
    let entries = common::saved_entries(&saved, "bdev_raid_create");
    assert_eq!(entries.len(), 1, "{saved}");
    assert_eq!(entries[0]["params"]["base_bdevs"], json!(["S0", "S1"]));
    assert_eq!(common::saved_entries(&saved, "bdev_raid_set_options")[0]["params"]["process_window_size_kb"], 512);
    let before = raid(&d, "RS");
    drop(d);
    let cfg = dir.write_json("saved.json", &saved);
    let d2 = Daemon::start_with(&dir, "again.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    let after = raid(&d2, "RS");
    for k in ["uuid", "state", "strip_size_kb", "raid_level", "num_base_bdevs_discovered"] {
        assert_eq!(after[k], before[k], "{k}");
    }
    assert_eq!(d2.call("save_config", None), saved);
}

/// raid5f has no Flush (nothing volatile to flush, as SPDK's): qemu-io's writes, which carry
/// FUA (its cache mode is writethrough), complete without the flush the NBD server would add
/// for them, and whole stripes read back.
#[test]
fn raid5f_takes_qemu_io_fua_writes_of_whole_stripes_over_nbd() {
    if !have("raid5f_takes_qemu_io_fua_writes_of_whole_stripes_over_nbd", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid5f-fua");
    let d = Daemon::start(&dir, &[]);
    for n in ["F0", "F1", "F2"] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 4096, "block_size": 4096})));
    }
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "R5", "raid_level": "raid5f", "base_bdevs": ["F0", "F1", "F2"], "strip_size_kb": 64})),
    );
    assert_eq!(d.bdevs().iter().find(|b| b["name"] == "R5").unwrap()["supported_io_types"]["flush"], false);
    let u = export_nbd(&d, "R5", "r5");
    qemu_io_script(
        &dir,
        &u,
        "write -P 0x5f 0 128k; write -P 0x60 256k 256k; read -P 0x5f 0 128k; read -P 0x60 256k 256k",
    );
    d.assert_serving();
}

#[test]
fn raid1_rebuilds_a_new_member_while_writes_go_on() {
    if !have("raid1_rebuilds_a_new_member_while_writes_go_on", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid-rebuild");
    let d = Daemon::start(&dir, &[]);
    for n in ["D0", "D1", "D2"] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 32768 + 2048, "block_size": 512})));
    }
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "RR", "raid_level": "raid1", "base_bdevs": ["D0", "D1"], "superblock": true})),
    );
    let u = export_nbd(&d, "RR", "rr");
    qemu_io_script(&dir, &u, "write -P 0x11 0 8M; write -P 0x22 8M 8M; flush");
    assert_eq!(d.call("bdev_raid_remove_base_bdev", Some(json!({"name": "D0"}))), json!(true));
    let r = raid(&d, "RR");
    assert_eq!((r["state"].as_str(), r["num_base_bdevs_operational"].as_u64()), (Some("online"), Some(1)), "{r}");
    assert!(r["base_bdevs_list"][0]["name"].is_null(), "{r}");
    qemu_io_script(&dir, &u, "write -P 0x33 4M 1M; flush");
    // A slow rebuild (8 MB/s of 16 MiB), in 64 KiB windows, with writes during it.
    d.call("bdev_raid_set_options", Some(json!({"process_window_size_kb": 64, "process_max_bandwidth_mb_sec": 8})));
    assert_eq!(d.call("bdev_raid_add_base_bdev", Some(json!({"raid_bdev": "RR", "base_bdev": "D2"}))), json!(true));
    let r = raid(&d, "RR");
    assert_eq!(r["process"]["type"], "rebuild", "{r}");
    assert_eq!(r["process"]["target"], "D2", "{r}");
    qemu_io_script(&dir, &u, "write -P 0x44 12M 2M; write -P 0x55 100k 64k; flush");
    let t0 = Instant::now();
    let mut seen = vec![];
    loop {
        let r = raid(&d, "RR");
        match r.get("process") {
            Some(p) => seen.push(p["progress"]["percent"].as_u64().unwrap()),
            None => break,
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the rebuild ends: {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(seen.len() >= 3 && seen.windows(2).all(|w| w[0] <= w[1]), "progress grows: {seen:?}");
    assert!(t0.elapsed() >= Duration::from_millis(1200), "the rate bound holds: {:?}", t0.elapsed());
    let r = raid(&d, "RR");
    assert_eq!(r["num_base_bdevs_discovered"], 2, "{r}");
    // With the old member gone, every read comes from the rebuilt one.
    assert_eq!(d.call("bdev_raid_remove_base_bdev", Some(json!({"name": "D1"}))), json!(true));
    qemu_io_script(
        &dir,
        &u,
        "read -P 0x11 0 100k; read -P 0x55 100k 64k; read -P 0x11 164k 3932k; read -P 0x33 4M 1M; read -P 0x11 5M 3M; read -P 0x22 8M 4M; read -P 0x44 12M 2M; read -P 0x22 14M 2M",
    );
    d.assert_serving();
}

/// Runs spdk_dd with `entries` as its bdev config and `args`; expects success.
fn spdk_dd(spdk: &Path, dir: &TempDir, entries: Vec<Value>, args: &[&str]) {
    let out = spdk_dd_run(spdk, dir, entries, args);
    assert!(
        out.status.success(),
        "spdk_dd: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs spdk_dd with `entries` as its bdev config and `args`.
fn spdk_dd_run(spdk: &Path, dir: &TempDir, entries: Vec<Value>, args: &[&str]) -> std::process::Output {
    let mut e = entries;
    e.push(json!({"method": "bdev_wait_for_examine"}));
    let conf = dir.write_json("dd.json", &json!({"subsystems": [{"subsystem": "bdev", "config": e}]}));
    let out = std::process::Command::new(spdk.join("build/bin/spdk_dd"))
        .args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "--no-rpc-server", "--json"])
        .arg(&conf)
        .args(args)
        .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
        .output()
        .expect("spdk_dd runs");
    out
}

fn files(dir: &TempDir) -> Vec<std::path::PathBuf> {
    files_n(dir, 2)
}

fn files_n(dir: &TempDir, n: usize) -> Vec<std::path::PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(&format!("m{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(32 * MIB).unwrap();
            p
        })
        .collect()
}

/// The files' bdevs' UUIDs, the same in SPDK and in Ferrite: the superblock names members by
/// UUID (SPDK's aio bdev makes a random one when none is given).
const MEMBER_UUIDS: [&str; 3] = [
    "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e40",
    "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e41",
    "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e42",
];

fn aio(files: &[std::path::PathBuf]) -> Vec<Value> {
    files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            m(
                "bdev_aio_create",
                json!({"name": format!("A{i}"), "filename": f.to_str().unwrap(), "block_size": 512, "uuid": MEMBER_UUIDS[i]}),
            )
        })
        .collect()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i / 512) as u8).wrapping_mul(31) ^ (i as u8)).collect()
}

/// A daemon with the files as uring bdevs U0, U1, ... (512-byte blocks), examined.
fn daemon_on(dir: &TempDir, files: &[std::path::PathBuf]) -> Daemon {
    let d = Daemon::start(dir, &[]);
    for (i, f) in files.iter().enumerate() {
        let p = json!({"name": format!("U{i}"), "filename": f.to_str().unwrap(), "block_size": 512, "uuid": MEMBER_UUIDS[i]});
        d.call("bdev_uring_create", Some(p));
    }
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    d
}

fn nbd_read(dir: &TempDir, uri: &str, len: usize) -> Vec<u8> {
    let out = dir.join("nbd-read.bin");
    let _ = std::fs::remove_file(&out);
    let r = run_tool(
        dir,
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", uri, out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(r.status.success(), "qemu-img convert: {}", r.stderr);
    let mut v = std::fs::read(&out).unwrap();
    v.truncate(len);
    v
}

#[test]
fn a_raid1_spdk_made_assembles_in_ferrite() {
    let test = "a_raid1_spdk_made_assembles_in_ferrite";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-img"]) {
        return;
    }
    let dir = TempDir::new("raid-from-spdk");
    let f = files(&dir);
    let data = pattern(4 * MIB as usize);
    let src = dir.join("pattern.bin");
    std::fs::write(&src, &data).unwrap();
    // spdk_dd makes the raid1 (superblock) on aio bdevs over the files and writes the pattern.
    let mut conf = aio(&f);
    conf.push(m(
        "bdev_raid_create",
        json!({"name": "SR", "raid_level": "raid1", "base_bdevs": ["A0", "A1"], "superblock": true,
        "uuid": "7d2b1f7e-8a0c-4b8e-9d3f-2a4e5c6b7a80"}),
    ));
    let inp = format!("--if={}", src.display());
    spdk_dd(&spdk, &dir, conf, &[&inp, "--ob=SR", "--bs=1048576", "--count=4", "--seek=2"]);
    // Ferrite finds it by examine, online, with SPDK's geometry.
    let d = daemon_on(&dir, &f);
    let r = raid(&d, "SR");
    assert_eq!(r["state"], "online", "{r}");
    assert_eq!(r["uuid"], "7d2b1f7e-8a0c-4b8e-9d3f-2a4e5c6b7a80");
    assert_eq!(r["superblock"], true);
    assert_eq!(r["num_base_bdevs_discovered"], 2, "{r}");
    assert_eq!(r["base_bdevs_list"][0]["data_offset"], 2048, "{r}");
    let u = export_nbd(&d, "SR", "sr");
    let got = nbd_read(&dir, &u, 6 * MIB as usize);
    assert!(got[..2 * MIB as usize].iter().all(|&b| b == 0));
    assert!(got[2 * MIB as usize..] == data[..], "the pattern SPDK wrote");
}

#[test]
fn a_raid5f_spdk_made_reads_back_in_ferrite_whole_and_degraded() {
    let test = "a_raid5f_spdk_made_reads_back_in_ferrite_whole_and_degraded";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-img"]) {
        return;
    }
    let dir = TempDir::new("raid5f-from-spdk");
    let f = files_n(&dir, 3);
    let data = pattern(4 * MIB as usize);
    let src = dir.join("pattern.bin");
    std::fs::write(&src, &data).unwrap();
    // spdk_dd makes the raid5f (strips of 64 KiB, superblock) and writes the pattern in whole
    // stripes: SPDK's data layout and parity.
    let mut conf = aio(&f);
    conf.push(m(
        "bdev_raid_create",
        json!({"name": "S5", "raid_level": "raid5f", "strip_size_kb": 64, "base_bdevs": ["A0", "A1", "A2"],
        "superblock": true, "uuid": "7d2b1f7e-8a0c-4b8e-9d3f-2a4e5c6b7a85"}),
    ));
    let inp = format!("--if={}", src.display());
    let out = spdk_dd_run(&spdk, &dir, conf, &[&inp, "--ob=S5", "--bs=1048576", "--count=4", "--seek=2"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if text.contains("Unsupported raid level") {
        // SPDK builds raid5f only with --with-raid5f (CONFIG_RAID5F).
        println!("SKIP {test}: this SPDK build has no raid5f (configure --with-raid5f)");
        return;
    }
    assert!(out.status.success(), "spdk_dd: {text}");
    let d = daemon_on(&dir, &f);
    let r = raid(&d, "S5");
    assert_eq!(r["state"], "online", "{r}");
    assert_eq!((r["raid_level"].as_str(), r["strip_size_kb"].as_u64()), (Some("raid5f"), Some(64)), "{r}");
    assert_eq!(r["num_base_bdevs_discovered"], 3, "{r}");
    let u = export_nbd(&d, "S5", "s5");
    let got = nbd_read(&dir, &u, 6 * MIB as usize);
    assert!(got[..2 * MIB as usize].iter().all(|&b| b == 0));
    assert!(got[2 * MIB as usize..] == data[..], "the pattern SPDK wrote");
    // Without a member, its strips come from SPDK's parity.
    assert_eq!(d.call("bdev_raid_remove_base_bdev", Some(json!({"name": "U1"}))), json!(true));
    assert_eq!(raid(&d, "S5")["num_base_bdevs_discovered"], 2);
    let got = nbd_read(&dir, &u, 6 * MIB as usize);
    assert!(got[2 * MIB as usize..] == data[..], "the pattern, rebuilt from SPDK's parity");
    d.assert_serving();
}

#[test]
fn spdk_reads_a_raid1_ferrite_made() {
    let test = "spdk_reads_a_raid1_ferrite_made";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid-to-spdk");
    let f = files(&dir);
    let d = daemon_on(&dir, &f);
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "FR", "raid_level": "raid1", "base_bdevs": ["U0", "U1"], "superblock": true})),
    );
    let u = export_nbd(&d, "FR", "fr");
    qemu_io_script(&dir, &u, "write -P 0x5a 1M 2M; write -P 0xa5 3M 1M; flush");
    d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    let mut d = d;
    d.proc.expect_exit(Duration::from_secs(15), "clean shutdown");
    // spdk_dd's examine assembles the raid from the superblocks Ferrite wrote.
    let out = dir.join("fr.bin");
    let of = format!("--of={}", out.display());
    spdk_dd(&spdk, &dir, aio(&f), &["--ib=FR", &of, "--bs=1048576", "--count=5"]);
    let got = std::fs::read(&out).unwrap();
    let mib = MIB as usize;
    assert!(got[..mib].iter().all(|&b| b == 0));
    assert!(got[mib..3 * mib].iter().all(|&b| b == 0x5a), "the first write");
    assert!(got[3 * mib..4 * mib].iter().all(|&b| b == 0xa5), "the second write");
}

/// True if this SPDK build has raid5f (configure --with-raid5f): its code is in spdk_dd or in
/// a library beside it.
fn spdk_has_raid5f(spdk: &Path) -> bool {
    let mut files = vec![spdk.join("build/bin/spdk_dd")];
    if let Ok(rd) = std::fs::read_dir(spdk.join("build/lib")) {
        files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().contains("raid")));
    }
    files.iter().any(|f| std::fs::read(f).is_ok_and(|b| b.windows(12).any(|w| w == b"raid5f_start")))
}

#[test]
fn spdk_reads_a_raid5f_ferrite_made() {
    let test = "spdk_reads_a_raid5f_ferrite_made";
    let Some(spdk) = common::spdk_or_skip(test) else { return };
    if !spdk_has_raid5f(&spdk) {
        println!("SKIP {test}: this SPDK build has no raid5f (configure --with-raid5f; see ../shared/anchors)");
        return;
    }
    if !have(test, &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid5f-to-spdk");
    let f = files_n(&dir, 3);
    let d = daemon_on(&dir, &f);
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "F5", "raid_level": "raid5f", "strip_size_kb": 64, "base_bdevs": ["U0", "U1", "U2"],
            "superblock": true})),
    );
    let u = export_nbd(&d, "F5", "f5");
    // Whole stripes (2 x 64 KiB of data): Ferrite's layout and parity.
    qemu_io_script(&dir, &u, "write -P 0x5a 1M 2M; write -P 0xa5 3M 1M; flush");
    d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    let mut d = d;
    d.proc.expect_exit(Duration::from_secs(15), "clean shutdown");
    let mib = MIB as usize;
    let check = |got: &[u8], what: &str| {
        assert!(got[..mib].iter().all(|&b| b == 0), "{what}: the first MiB was never written");
        assert!(got[mib..3 * mib].iter().all(|&b| b == 0x5a), "{what}: the first write");
        assert!(got[3 * mib..4 * mib].iter().all(|&b| b == 0xa5), "{what}: the second write");
    };
    // spdk_dd's examine assembles the raid5f from the superblocks Ferrite wrote.
    let out = dir.join("f5.bin");
    let of = format!("--of={}", out.display());
    spdk_dd(&spdk, &dir, aio(&f), &["--ib=F5", &of, "--bs=1048576", "--count=5"]);
    check(&std::fs::read(&out).unwrap(), "SPDK reading Ferrite's raid5f");
    // Member 1 leaves in Ferrite and a write follows: its strips of that write exist only as
    // Ferrite's parity, and the superblocks say member 1 is out. SPDK assembles the raid
    // degraded (member 1's superblock is older) and reads them from the parity.
    let d = daemon_on(&dir, &f);
    assert_eq!(d.call("bdev_raid_remove_base_bdev", Some(json!({"name": "U1"}))), json!(true));
    let u = export_nbd(&d, "F5", "f5");
    qemu_io_script(&dir, &u, "write -P 0x3c 1M 1M; flush");
    d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})));
    let mut d = d;
    d.proc.expect_exit(Duration::from_secs(15), "clean shutdown");
    let out = dir.join("f5-degraded.bin");
    let of = format!("--of={}", out.display());
    spdk_dd(&spdk, &dir, aio(&f), &["--ib=F5", &of, "--bs=1048576", "--count=5"]);
    let got = std::fs::read(&out).unwrap();
    assert!(got[mib..2 * mib].iter().all(|&b| b == 0x3c), "the write made without member 1");
    assert!(got[2 * mib..3 * mib].iter().all(|&b| b == 0x5a), "the first write's rest");
    assert!(got[3 * mib..4 * mib].iter().all(|&b| b == 0xa5), "the second write");
}

#[test]
fn raid1_drops_a_member_that_fails_writes_and_verifies_on() {
    let dir = TempDir::new("raid-wfault");
    let cfg = config(
        &dir,
        "wfault.json",
        vec![
            malloc("G0", 16384),
            malloc("G1", 16384),
            m("bdev_error_create", json!({"base_name": "G1"})),
            m("bdev_raid_create", json!({"name": "RW", "raid_level": "raid1", "base_bdevs": ["G0", "EE_G1"]})),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_G1", "io_type": "write", "error_type": "failure", "num": 1}),
            ),
        ],
    );
    verify_ok(&dir, "wfault", &cfg, "RW");
}

#[test]
fn deleting_members_degrades_a_raid1_and_takes_a_raid0_offline() {
    if !have("deleting_members_degrades_a_raid1_and_takes_a_raid0_offline", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid-hotremove");
    let d = Daemon::start(&dir, &[]);
    for n in ["H0", "H1", "H2", "H3"] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 8192, "block_size": 512})));
    }
    d.call("bdev_raid_create", Some(json!({"name": "HM", "raid_level": "raid1", "base_bdevs": ["H0", "H1"]})));
    d.call(
        "bdev_raid_create",
        Some(json!({"name": "HS", "raid_level": "raid0", "strip_size_kb": 8, "base_bdevs": ["H2", "H3"]})),
    );
    let u = export_nbd(&d, "HM", "hm");
    qemu_io_script(&dir, &u, "write -P 0x61 0 2M; flush");
    assert_eq!(d.call("bdev_malloc_delete", Some(json!({"name": "H0"}))), json!(true));
    let r = raid(&d, "HM");
    assert_eq!((r["state"].as_str(), r["num_base_bdevs_discovered"].as_u64()), (Some("online"), Some(1)), "{r}");
    qemu_io_script(&dir, &u, "read -P 0x61 0 2M; write -P 0x62 1M 64k; read -P 0x62 1M 64k");
    assert_eq!(d.call("bdev_malloc_delete", Some(json!({"name": "H3"}))), json!(true));
    assert_eq!(raid(&d, "HS")["state"], "offline");
    assert!(!d.bdev_names().contains(&"HS".to_string()));
    assert!(d.call("bdev_get_bdevs", Some(json!({"name": "H2"})))[0]["claimed"] == false, "members released");
    assert_eq!(d.call("bdev_raid_delete", Some(json!({"name": "HS"}))), json!(true));
    assert!(raid(&d, "HS").is_null());
    d.assert_serving();
}

fn write_ops(d: &Daemon, bdev: &str) -> u64 {
    let v = d.call("bdev_get_iostat", Some(json!({"name": bdev})));
    v["bdevs"][0]["num_write_ops"].as_u64().unwrap_or_else(|| panic!("bdev_get_iostat {bdev}: {v}"))
}

#[test]
fn raid1_writes_back_what_a_member_failed_to_read_and_fails_it_if_that_fails() {
    if !have("raid1_writes_back_what_a_member_failed_to_read_and_fails_it_if_that_fails", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("raid-readfix");
    let d = Daemon::start(&dir, &[]);
    for n in ["E0", "E1"] {
        d.call("bdev_malloc_create", Some(json!({"name": n, "num_blocks": 8192, "block_size": 512})));
    }
    d.call("bdev_error_create", Some(json!({"base_name": "E1"})));
    // The error bdev first: with nothing else outstanding, reads go to the first member.
    d.call("bdev_raid_create", Some(json!({"name": "RE", "raid_level": "raid1", "base_bdevs": ["EE_E1", "E0"]})));
    let u = export_nbd(&d, "RE", "re");
    qemu_io_script(&dir, &u, "write -P 0x5a 0 1M");
    // Three reads fail on EE_E1: E0 serves them, and each is written back to EE_E1 (SPDK's
    // raid1_correct_read_error); EE_E1 stays a member.
    let before = write_ops(&d, "EE_E1");
    d.call(
        "bdev_error_inject_error",
        Some(json!({"name": "EE_E1", "io_type": "read", "error_type": "failure", "num": 3})),
    );
    qemu_io_script(&dir, &u, "read -P 0x5a 0 64k; read -P 0x5a 64k 64k; read -P 0x5a 128k 64k");
    assert_eq!(write_ops(&d, "EE_E1") - before, 3, "each failed read written back");
    assert_eq!(raid(&d, "RE")["num_base_bdevs_discovered"], 2);
    qemu_io_script(&dir, &u, "read -P 0x5a 0 1M");
    // Now the write-back fails too: EE_E1 is failed out, the read still succeeds.
    for t in ["read", "write"] {
        d.call(
            "bdev_error_inject_error",
            Some(json!({"name": "EE_E1", "io_type": t, "error_type": "failure", "num": 1})),
        );
    }
    qemu_io_script(&dir, &u, "read -P 0x5a 256k 64k");
    let deadline = Instant::now() + Duration::from_secs(10);
    while raid(&d, "RE")["num_base_bdevs_discovered"] != 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = raid(&d, "RE");
    assert_eq!((r["state"].as_str(), r["num_base_bdevs_discovered"].as_u64()), (Some("online"), Some(1)), "{r}");
    assert!(!r["base_bdevs_list"].to_string().contains("EE_E1"), "{r}");
    qemu_io_script(&dir, &u, "read -P 0x5a 0 1M; write -P 0x5b 0 64k; read -P 0x5b 0 64k");
    d.assert_serving();
}
