//! SPDK's own JSON-RPC client (scripts/rpc.py, published on PyPI as `spdk` with the `spdk-rpc`
//! command) against the real daemon: the same commands an SPDK user types must work unchanged.
//!
//! The client comes from $SPDK_RPC, or `spdk-rpc` on PATH (scripts/test.sh installs it in a
//! virtualenv). Without it the test prints why it is skipped.

mod common;

use common::{find_bdev, Daemon, TempDir};
use serde_json::Value;
use std::process::{Command, Output};

fn spdk_rpc() -> Option<String> {
    if let Ok(p) = std::env::var("SPDK_RPC") {
        return Some(p);
    }
    let found = Command::new("spdk-rpc").arg("--help").output().map(|o| o.status.success()).unwrap_or(false);
    found.then(|| "spdk-rpc".to_string())
}

fn rpc(bin: &str, d: &Daemon, args: &[&str]) -> Output {
    Command::new(bin).arg("-s").arg(&d.sock).args(args).output().expect("spdk-rpc runs")
}

fn ok(bin: &str, d: &Daemon, args: &[&str]) -> String {
    let out = rpc(bin, d, args);
    assert!(
        out.status.success(),
        "spdk-rpc {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn spdk_rpc_py_drives_ferrite() {
    let Some(bin) = spdk_rpc() else {
        eprintln!(
            "SKIP spdk_rpc_py_drives_ferrite: SPDK's rpc.py (spdk-rpc) not found; set SPDK_RPC or run scripts/test.sh"
        );
        return;
    };
    let dir = TempDir::new("spdkrpc");
    let d = Daemon::start(&dir, &[]);
    let file = dir.file_filled("disk.img", 8 << 20, 0);

    assert!(ok(&bin, &d, &["spdk_get_version"]).contains("Ferrite"));
    // rpc.py's own argument forms: size in MiB for malloc, positional name/blocks/size for null.
    assert_eq!(
        ok(&bin, &d, &["bdev_malloc_create", "-b", "M0", "-u", "11111111-2222-3333-4444-555555555555", "16", "4096"])
            .trim(),
        "M0"
    );
    assert_eq!(ok(&bin, &d, &["bdev_null_create", "N0", "64", "512"]).trim(), "N0");
    assert_eq!(ok(&bin, &d, &["bdev_uring_create", file.to_str().unwrap(), "U0", "4096"]).trim(), "U0");

    let bdevs: Value = serde_json::from_str(&ok(&bin, &d, &["bdev_get_bdevs"])).unwrap();
    let bdevs = bdevs.as_array().unwrap().clone();
    let m0 = find_bdev(&bdevs, "M0").expect("M0 listed");
    assert_eq!(m0["num_blocks"], 4096);
    assert_eq!(m0["block_size"], 4096);
    assert_eq!(m0["uuid"], "11111111-2222-3333-4444-555555555555");
    assert_eq!(find_bdev(&bdevs, "U0").unwrap()["num_blocks"], 2048);
    let one: Value = serde_json::from_str(&ok(&bin, &d, &["bdev_get_bdevs", "-b", "N0"])).unwrap();
    assert_eq!(one[0]["product_name"], "Null disk");

    let stat: Value = serde_json::from_str(&ok(&bin, &d, &["bdev_get_iostat", "--names", "M0"])).unwrap();
    assert_eq!(stat["bdevs"][0]["name"], "M0");
    let reactors: Value = serde_json::from_str(&ok(&bin, &d, &["framework_get_reactors"])).unwrap();
    assert_eq!(reactors["reactors"].as_array().unwrap().len(), 1);

    // rpc.py builds save_config client-side from framework_get_subsystems/framework_get_config.
    let saved = ok(&bin, &d, &["save_config"]);
    let doc: Value = serde_json::from_str(&saved).unwrap();
    let ours = d.call("save_config", None);
    assert_eq!(doc, ours, "rpc.py's save_config differs from Ferrite's");

    // Delete everything, then load_config restores it (rpc.py checks each method against
    // rpc_get_methods first).
    ok(&bin, &d, &["bdev_malloc_delete", "M0"]);
    ok(&bin, &d, &["bdev_null_delete", "N0"]);
    ok(&bin, &d, &["bdev_uring_delete", "U0"]);
    assert!(d.bdev_names().is_empty());
    let cfg = dir.join("saved.json");
    std::fs::write(&cfg, &saved).unwrap();
    let out = Command::new(&bin)
        .arg("-s")
        .arg(&d.sock)
        .arg("load_config")
        .stdin(std::fs::File::open(&cfg).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "load_config: {}", String::from_utf8_lossy(&out.stderr));
    let mut names = d.bdev_names();
    names.sort();
    assert_eq!(names, ["M0", "N0", "U0"]);

    // Errors come back as rpc.py expects: non-zero exit, SPDK's code and our message.
    let out = rpc(&bin, &d, &["bdev_get_bdevs", "-b", "missing"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-19") && err.contains("missing"), "{err}");

    ok(&bin, &d, &["spdk_kill_instance", "SIGTERM"]);
    let mut p = d;
    let status = p.proc.expect_exit(std::time::Duration::from_secs(10), "daemon after spdk_kill_instance");
    assert!(status.success(), "exit status {status:?}");
}
