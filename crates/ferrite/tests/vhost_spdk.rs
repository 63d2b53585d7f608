//! SPDK's own vhost-user front end (bdevperf over `bdev_virtio_attach_controller`, trtype user,
//! dev_type blk) against Ferrite's vhost-user-blk target: `-w verify` writes, reads back and
//! compares every block, on two queues, at 4 KiB on a 4 KiB-block bdev and at 128 KiB (many
//! segments per request) on a 512-byte-block bdev.
//!
//! Needs SPDK v26.05 in $SPDK_DIR and 2 MiB hugepages (SPDK's virtio-user shares its memory
//! from hugetlbfs): as root the test reserves them and gives them back; otherwise it prints SKIP
//! with the reason.

mod common;

use common::{Daemon, Hugepages, TempDir};
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs SPDK's bdevperf on core 1 against vhost-user socket `sock`: `-w verify` with `job`
/// arguments; returns its output with carriage returns made newlines.
fn bdevperf_verify(spdk: &Path, dir: &TempDir, sock: &Path, job: &[&str]) -> (bool, String) {
    let cfg = dir.write_json(
        "bdevperf.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_virtio_attach_controller",
            "params": {"name": "VirtioUser0", "trtype": "user", "traddr": sock.to_str().unwrap(), "dev_type": "blk",
                "vq_count": 2, "vq_size": 512}}]}]}),
    );
    let rpc = dir.join("bdevperf.sock");
    let mut args = vec!["--json", cfg.to_str().unwrap(), "-w", "verify", "-t", "3"];
    args.extend_from_slice(job);
    args.extend_from_slice(&[
        "-m",
        "0x2",
        "--disable-cpumask-locks",
        "--no-pci",
        "-g",
        "-s",
        "512",
        "-r",
        rpc.to_str().unwrap(),
    ]);
    let out = Command::new("timeout")
        .arg("60")
        .arg(spdk.join("build/examples/bdevperf"))
        .args(&args)
        .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
        .output()
        .expect("bdevperf runs");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).replace('\r', "\n");
    (out.status.success(), text)
}

/// IOPS and Fail/s of bdevperf's Total line.
fn total(text: &str) -> Option<(f64, f64)> {
    let line = text.lines().find(|l| l.trim_start().starts_with("Total"))?;
    let f: Vec<f64> = line.split(':').nth(1)?.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    Some((*f.first()?, *f.get(2)?))
}

#[test]
fn spdk_bdevperf_verifies_through_ferrite_vhost() {
    let spdk = match common::spdk_dir() {
        Ok(s) => s,
        Err(why) => {
            println!("SKIP spdk_bdevperf_verifies_through_ferrite_vhost: {why}");
            return;
        }
    };
    let _pages = match Hugepages::reserve(512) {
        Ok(p) => p,
        Err(why) => {
            println!("SKIP spdk_bdevperf_verifies_through_ferrite_vhost: {why}");
            return;
        }
    };
    let dir = TempDir::new("vhost-spdk");
    let sdir = dir.path().to_str().unwrap().to_string();
    let d = Daemon::start_with(&dir, "t.sock", "0x1", &["-S", &sdir]);
    for (name, bs, io) in [("V4k", 4096u32, "4096"), ("V512", 512, "131072")] {
        d.call(
            "bdev_malloc_create",
            Some(json!({"name": name, "num_blocks": (64u64 << 20) / bs as u64, "block_size": bs})),
        );
        let ctrlr = format!("vhost.{name}");
        d.call("vhost_create_blk_controller", Some(json!({"ctrlr": ctrlr, "dev_name": name})));
        let (ok, text) = bdevperf_verify(&spdk, &dir, &dir.join(&ctrlr), &["-q", "32", "-o", io]);
        assert!(ok, "bdevperf failed against {ctrlr}:\n{text}");
        for bad in ["Buffer mismatch", "miscompare", "Miscompare", "verify failed", "ERROR"] {
            assert!(!text.contains(bad), "{bad:?} in bdevperf's output against {ctrlr}:\n{text}");
        }
        let (iops, fails) = total(&text).unwrap_or_else(|| panic!("no Total line:\n{text}"));
        assert!(iops > 0.0 && fails == 0.0, "{ctrlr}: {iops} IOPS, {fails} failed/s\n{text}");
        println!("{ctrlr}: bdevperf verify {io} B: {iops:.0} IOPS");
        // The front end went away: the controller is free again and can be deleted.
        for _ in 0..100 {
            let c = d.call("vhost_get_controllers", Some(json!({"name": ctrlr})));
            if c[0]["sessions"].as_array().is_some_and(|s| s.is_empty()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        d.call("vhost_delete_controller", Some(json!({"ctrlr": ctrlr})));
        assert!(!dir.join(&ctrlr).exists(), "the socket of a deleted controller is gone");
    }
}
