//! SPDK's `iobuf_set_options` sizes the reactors' buffer pools: values given before the
//! framework starts (`--wait-for-rpc`, or a startup config) make the pools, shared among the
//! reactors; after the start the method is refused as SPDK refuses it.

mod common;

use common::{run_ferrite, Daemon, TempDir};
use serde_json::{json, Value};

/// Each reactor's `buffers` object from thread_get_stats.
fn pools(d: &Daemon) -> Vec<Value> {
    let s = d.call("thread_get_stats", None);
    s["threads"].as_array().unwrap().iter().map(|t| t["buffers"].clone()).collect()
}

#[test]
fn iobuf_set_options_before_framework_start_sizes_every_reactor_s_pool() {
    let dir = TempDir::new("iobuf");
    let d = Daemon::start_with(&dir, "rpc.sock", "0x3", &["--no-pin", "--wait-for-rpc"]);
    // SPDK's minimums, with SPDK's answer (-EINVAL); Ferrite's own limit on buffer sizes.
    for (bad, what) in [
        (json!({"small_pool_count": 63}), "small_pool_count"),
        (json!({"large_pool_count": 7}), "large_pool_count"),
        (json!({"small_bufsize": 1024}), "small_bufsize"),
        (json!({"large_bufsize": 8191}), "large_bufsize"),
        (json!({"large_bufsize": 4 << 20}), "large_bufsize"),
    ] {
        let e = d.call_err("iobuf_set_options", Some(bad));
        assert_eq!(e.code, -22, "{e:?}");
        assert!(e.message.contains(what), "{e:?}");
    }
    // Two calls, as SPDK merges them: the counts first, then the sizes.
    let opts = json!({"small_pool_count": 256, "large_pool_count": 16});
    assert_eq!(d.call("iobuf_set_options", Some(opts)), json!(true));
    let sizes = json!({"small_bufsize": 8192, "large_bufsize": 65536, "enable_numa": false});
    assert_eq!(d.call("iobuf_set_options", Some(sizes)), json!(true));
    assert_eq!(d.call("framework_start_init", None), json!(true));

    let p = pools(&d);
    assert_eq!(p.len(), 2);
    for b in &p {
        // SPDK's counts are for the whole application: each of the 2 reactors has half.
        assert_eq!(b["small_count"], 128, "{b}");
        assert_eq!(b["large_count"], 8, "{b}");
        assert_eq!(b["small_bufsize"], 8192, "{b}");
        assert_eq!(b["large_bufsize"], 65536, "{b}");
        assert_eq!(b["small_free"], 128, "an idle pool has every buffer free: {b}");
        assert_eq!(b["large_free"], 8, "{b}");
        assert_eq!(b["registered"], true, "{b}");
    }
    // After the start it is refused as SPDK refuses every startup method then.
    let e = d.call_err("iobuf_set_options", Some(json!({"small_pool_count": 1024})));
    assert_eq!(e.code, -1, "{e:?}");
    assert!(e.message.contains("before framework is initialized"), "{e:?}");
    assert_eq!(pools(&d)[0]["small_count"], 128, "nothing changed");
    // The accepted values are saved (merged), so the config reproduces the pools.
    let saved = d.call("framework_get_config", Some(json!({"name": "iobuf"})));
    assert_eq!(
        saved,
        json!([{"method": "iobuf_set_options", "params": {"small_pool_count": 256, "large_pool_count": 16,
            "small_bufsize": 8192, "large_bufsize": 65536, "enable_numa": false}}])
    );
}

#[test]
fn a_startup_config_sizes_the_pools_and_io_runs_on_them() {
    let dir = TempDir::new("iobufcfg");
    let img = dir.join("u.img");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    let cfg = dir.write_json(
        "cfg.json",
        &json!({"subsystems": [
            {"subsystem": "iobuf", "config": [{"method": "iobuf_set_options",
                "params": {"small_pool_count": 64, "large_pool_count": 8, "small_bufsize": 16384, "large_bufsize": 262144}}]},
            {"subsystem": "bdev", "config": [
                {"method": "bdev_uring_create", "params": {"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096}}]}]}),
    );
    let d = Daemon::start(&dir, &["--json", cfg.to_str().unwrap()]);
    let b = &pools(&d)[0];
    assert_eq!((b["small_count"].as_u64(), b["small_bufsize"].as_u64()), (Some(64), Some(16384)), "{b}");
    assert_eq!((b["large_count"].as_u64(), b["large_bufsize"].as_u64()), (Some(8), Some(262144)), "{b}");
    drop(d);
    // The same config under `ferrite perf`: verified I/O through the uring bdev, whose requests
    // use the resized pools (16 KiB requests: the small class, a registered fixed buffer).
    let out = run_ferrite(&[
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-q",
        "8",
        "-o",
        "16384",
        "-w",
        "verify",
        "-t",
        "1",
        "-m",
        "0x1",
        "--no-pin",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn pools_beyond_the_machine_fail_the_start_and_leave_the_startup_state() {
    let dir = TempDir::new("iobufbig");
    let d = Daemon::start(&dir, &["--wait-for-rpc"]);
    let huge = json!({"large_pool_count": 1u64 << 40, "large_bufsize": 135168});
    assert_eq!(d.call("iobuf_set_options", Some(huge)), json!(true));
    let e = d.call_err("framework_start_init", None);
    assert!(e.message.contains("half of this machine's memory"), "{e:?}");
    // Still in the startup state: fix the options and start.
    assert_eq!(d.call("iobuf_set_options", Some(json!({"large_pool_count": 64}))), json!(true));
    assert_eq!(d.call("framework_start_init", None), json!(true));
    assert_eq!(pools(&d)[0]["large_count"], 64);
}
