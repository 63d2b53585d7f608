//! SPDK JSON configs: save_config, restart with --json, SPDK-written configs, bad configs.

mod common;

use common::{find_bdev, Daemon, Proc, TempDir};
use serde_json::{json, Value};
use std::time::Duration;

/// The `config` array of subsystem `name` in a save_config document.
fn subsystem_config<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["subsystems"]
        .as_array()
        .unwrap_or_else(|| panic!("no subsystems array: {doc}"))
        .iter()
        .find(|s| s["subsystem"] == name)
        .unwrap_or_else(|| panic!("no {name} subsystem: {doc}"))
        .get("config")
        .unwrap_or_else(|| panic!("{name} has no config: {doc}"))
}

/// (name, block_size, num_blocks, uuid, product_name) of every bdev, sorted by name.
fn identity(bdevs: &[Value]) -> Vec<(String, u64, u64, String, String)> {
    let mut v: Vec<_> = bdevs
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["block_size"].as_u64().unwrap(),
                b["num_blocks"].as_u64().unwrap(),
                b["uuid"].as_str().unwrap().to_string(),
                b["product_name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn save_config_then_restart_with_it() {
    let dir = TempDir::new("saverestore");
    let img = dir.file_filled("u.img", 4 << 20, 0);
    let mut d = Daemon::start(&dir, &[]);
    let mut c = d.client();
    common::call(&mut c, "bdev_malloc_create", Some(json!({"num_blocks": 512, "block_size": 4096})));
    common::call(
        &mut c,
        "bdev_malloc_create",
        Some(
            json!({"name": "Mx", "num_blocks": 300, "block_size": 512, "uuid": "5f0c7a51-34a8-4f1e-9d6b-0c2e4b1a7d90"}),
        ),
    );
    common::call(&mut c, "bdev_null_create", Some(json!({"name": "N0", "num_blocks": 1 << 20, "block_size": 512})));
    common::call(
        &mut c,
        "bdev_uring_create",
        Some(json!({"name": "U0", "filename": img.to_str().unwrap(), "block_size": 4096})),
    );
    let before = d.bdevs();
    assert_eq!(before.len(), 4);

    let saved = common::call(&mut c, "save_config", None);
    // framework_get_config of "bdev" is exactly save_config's bdev entry.
    let bdev_cfg = common::call(&mut c, "framework_get_config", Some(json!({"name": "bdev"})));
    assert_eq!(&bdev_cfg, subsystem_config(&saved, "bdev"));
    let methods: Vec<&str> = bdev_cfg.as_array().unwrap().iter().map(|e| e["method"].as_str().unwrap()).collect();
    assert_eq!(methods.iter().filter(|m| m.ends_with("_create")).count(), 4, "{bdev_cfg}");
    // An unknown subsystem is an error.
    let e = common::call_err(&mut c, "framework_get_config", Some(json!({"name": "nosuch"})));
    assert_eq!(e.code, -32602, "{e:?}");
    drop(c);

    let cfg_path = dir.write_json("saved.json", &saved);
    // The file reads back as what was saved.
    let reread: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    assert_eq!(reread, saved);

    d.proc.sigterm();
    let st = d.proc.expect_exit(Duration::from_secs(5), "daemon after SIGTERM");
    assert_eq!(st.code(), Some(0), "{st:?}; stderr:\n{}", d.proc.stderr());
    assert!(!d.sock.exists());

    let d2 = Daemon::start_with(&dir, "second.sock", "0x1", &["--json", cfg_path.to_str().unwrap()]);
    let after = d2.bdevs();
    assert_eq!(identity(&after), identity(&before));
    assert_eq!(find_bdev(&after, "U0").unwrap()["driver_specific"]["uring"]["filename"], img.to_str().unwrap());
    // And saving again gives the same config.
    assert_eq!(d2.call("save_config", None), saved);
}

/// The text of a config as SPDK's save_config writes it, with subsystems Ferrite does not have.
const SPDK_CONFIG: &str = r#"
{
  "subsystems": [
    {"subsystem": "keyring", "config": []},
    {"subsystem": "iobuf", "config": [
      {"method": "iobuf_set_options", "params": {
        "small_pool_count": 8192, "large_pool_count": 1024,
        "small_bufsize": 8192, "large_bufsize": 135168}}]},
    {"subsystem": "sock", "config": [
      {"method": "sock_set_default_impl", "params": {"impl_name": "posix"}},
      {"method": "sock_impl_set_options", "params": {
        "impl_name": "ssl", "recv_buf_size": 4096, "send_buf_size": 4096,
        "enable_recv_pipe": true, "enable_quickack": false, "enable_placement_id": 0,
        "enable_zerocopy_send_server": true, "enable_zerocopy_send_client": false,
        "zerocopy_threshold": 0, "tls_version": 0, "enable_ktls": false}},
      {"method": "sock_impl_set_options", "params": {
        "impl_name": "posix", "recv_buf_size": 2097152, "send_buf_size": 2097152,
        "enable_recv_pipe": true, "enable_quickack": false, "enable_placement_id": 0,
        "enable_zerocopy_send_server": true, "enable_zerocopy_send_client": false,
        "zerocopy_threshold": 0, "tls_version": 0, "enable_ktls": false}}]},
    {"subsystem": "vmd", "config": []},
    {"subsystem": "accel", "config": [
      {"method": "accel_set_options", "params": {
        "small_cache_size": 128, "large_cache_size": 16, "task_count": 2048, "sequence_count": 2048,
        "buf_count": 2048}}]},
    {"subsystem": "bdev", "config": [
      {"method": "bdev_set_options", "params": {
        "bdev_io_pool_size": 65535, "bdev_io_cache_size": 256,
        "bdev_auto_examine": true, "iobuf_small_cache_size": 128, "iobuf_large_cache_size": 16}},
      {"method": "bdev_raid_set_options", "params": {"process_window_size_kb": 1024}},
      {"method": "bdev_iscsi_set_options", "params": {"timeout_sec": 30}},
      {"method": "bdev_nvme_set_options", "params": {
        "action_on_timeout": "none", "timeout_us": 0, "timeout_admin_us": 0, "keep_alive_timeout_ms": 10000,
        "arbitration_burst": 0, "low_priority_weight": 0, "medium_priority_weight": 0,
        "high_priority_weight": 0, "nvme_adminq_poll_period_us": 10000, "nvme_ioq_poll_period_us": 0,
        "io_queue_requests": 0, "delay_cmd_submit": true, "transport_retry_count": 4, "bdev_retry_count": 3,
        "transport_ack_timeout": 0, "ctrlr_loss_timeout_sec": 0, "reconnect_delay_sec": 0,
        "fast_io_fail_timeout_sec": 0, "disable_auto_failback": false, "generate_uuids": false,
        "transport_tos": 0, "nvme_error_stat": false, "rdma_srq_size": 0, "io_path_stat": false,
        "allow_accel_sequence": false, "rdma_max_cq_size": 0, "rdma_cm_event_timeout_ms": 0,
        "dhchap_digests": ["sha256", "sha384", "sha512"],
        "dhchap_dhgroups": ["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]}},
      {"method": "bdev_nvme_set_hotplug", "params": {"period_us": 100000, "enable": false}},
      {"method": "bdev_malloc_create", "params": {
        "name": "Malloc0", "num_blocks": 8192, "block_size": 4096, "physical_block_size": 4096,
        "uuid": "c5ad3e6c-28f0-4c4b-9a5a-2c8d3c7c2e11", "optimal_io_boundary": 0, "md_size": 0,
        "dif_type": 0, "dif_is_head_of_md": false, "dif_pi_format": 0}},
      {"method": "bdev_wait_for_examine"}]},
    {"subsystem": "scheduler", "config": [
      {"method": "framework_set_scheduler", "params": {"name": "static"}}]},
    {"subsystem": "nvmf", "config": [
      {"method": "nvmf_set_config", "params": {
        "discovery_filter": "match_any", "admin_cmd_passthru": {"identify_ctrlr": false},
        "dhchap_digests": ["sha256", "sha384", "sha512"],
        "dhchap_dhgroups": ["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]}},
      {"method": "nvmf_set_max_subsystems", "params": {"max_subsystems": 1024}}]}
  ]
}
"#;

/// A config as SPDK's save_config writes it, with the subsystems Ferrite does not have.
fn spdk_written_config() -> Value {
    serde_json::from_str(SPDK_CONFIG).expect("SPDK_CONFIG is JSON")
}

#[test]
fn spdk_written_config_loads() {
    let dir = TempDir::new("spdkcfg");
    let cfg = dir.write_json("spdk.json", &spdk_written_config());
    let d = Daemon::start(&dir, &["--json", cfg.to_str().unwrap()]);
    let bdevs = d.bdevs();
    assert_eq!(bdevs.len(), 1, "{bdevs:?}");
    let m = &bdevs[0];
    assert_eq!(m["name"], "Malloc0");
    assert_eq!(m["block_size"], 4096);
    assert_eq!(m["num_blocks"], 8192);
    assert_eq!(m["uuid"], "c5ad3e6c-28f0-4c4b-9a5a-2c8d3c7c2e11");
    assert_eq!(m["product_name"], "Malloc disk");
    // framework_get_config and save_config agree on what was loaded.
    let saved = d.call("save_config", None);
    let bdev_cfg = d.call("framework_get_config", Some(json!({"name": "bdev"})));
    assert_eq!(&bdev_cfg, subsystem_config(&saved, "bdev"));
    assert!(bdev_cfg
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["method"] == "bdev_malloc_create" && e["params"]["uuid"] == "c5ad3e6c-28f0-4c4b-9a5a-2c8d3c7c2e11"));
}

/// Runs `ferrite serve` with a config that must fail; returns its stderr.
fn serve_must_fail(dir: &TempDir, cfg: &Value) -> String {
    let path = dir.write_json("bad.json", cfg);
    let sock = dir.join("bad.sock");
    let mut p = Proc::spawn(
        dir,
        "serve-bad",
        &[
            "serve",
            "-m",
            "0x1",
            "-r",
            sock.to_str().unwrap(),
            "--reactor-mode",
            "interrupt",
            "--json",
            path.to_str().unwrap(),
        ],
    );
    let st = p.expect_exit(Duration::from_secs(10), "serve with a bad config");
    assert!(!st.success(), "serve succeeded with a bad config; stderr:\n{}", p.stderr());
    assert!(!sock.exists(), "serve left a socket behind after failing");
    p.stderr()
}

#[test]
fn unknown_config_method_fails_startup() {
    let dir = TempDir::new("unknowncfg");
    let cfg = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 128, "block_size": 512}},
        {"method": "bdev_frobnicate", "params": {"name": "M0"}},
        {"method": "bdev_wait_for_examine"}]}]});
    let err = serve_must_fail(&dir, &cfg);
    assert!(err.contains("bdev_frobnicate"), "stderr does not name the method:\n{err}");
}

#[test]
fn failing_config_entry_fails_startup() {
    let dir = TempDir::new("failcfg");
    let missing = dir.join("missing.img");
    let cfg = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_uring_create", "params": {"name": "U0", "filename": missing.to_str().unwrap()}}]}]});
    let err = serve_must_fail(&dir, &cfg);
    assert!(err.contains(missing.to_str().unwrap()), "stderr does not name the file:\n{err}");

    // Not JSON at all.
    let path = dir.join("garbage.json");
    std::fs::write(&path, "{\"subsystems\": [").unwrap();
    let sock = dir.join("g.sock");
    let mut p = Proc::spawn(
        &dir,
        "serve-garbage",
        &[
            "serve",
            "-m",
            "0x1",
            "-r",
            sock.to_str().unwrap(),
            "--reactor-mode",
            "interrupt",
            "--json",
            path.to_str().unwrap(),
        ],
    );
    let st = p.expect_exit(Duration::from_secs(10), "serve with a truncated config");
    assert!(!st.success());
    assert!(p.stderr().contains("garbage.json"), "{}", p.stderr());
}
