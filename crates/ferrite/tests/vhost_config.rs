//! SPDK's vhost configs load unchanged: the `vhost_blk` subsystem exactly as SPDK v26.05's vhost
//! app saves it (`cpumask` in its hexadecimal form without `0x`, `readonly`, `transport`, and a
//! `vhost_controller_set_coalescing` entry), plus its empty `vhost_scsi` subsystem, makes the
//! same controller, whose socket appears in `serve -S DIR`; Ferrite's save_config writes it
//! back so that it loads again to the same state. Bad parameters get JSON-RPC errors.

mod common;

use common::{Daemon, TempDir};
use serde_json::{json, Value};

/// What SPDK v26.05's vhost app saved after `bdev_malloc_create -b M0 16 4096`,
/// `vhost_create_blk_controller vhost.0 M0 -r` and `vhost_controller_set_coalescing vhost.0 50
/// 80000` (its save_config, vhost subsystems copied as they came).
fn spdk_config() -> Value {
    json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 4096, "block_size": 4096}}]},
        {"subsystem": "vhost_blk", "config": [
            {"method": "vhost_create_blk_controller", "params": {"ctrlr": "vhost.0", "dev_name": "M0", "cpumask": "1",
                "readonly": true, "transport": "vhost_user_blk"}},
            {"method": "vhost_controller_set_coalescing", "params": {"ctrlr": "vhost.0", "delay_base_us": 50,
                "iops_threshold": 80000}}]},
        {"subsystem": "vhost_scsi", "config": []}]})
}

fn controller(d: &Daemon) -> Value {
    let c = d.call("vhost_get_controllers", None);
    assert_eq!(c.as_array().map(Vec::len), Some(1), "{c}");
    c[0].clone()
}

#[test]
fn spdk_vhost_configs_load_and_save_config_round_trips() {
    let dir = TempDir::new("vhost-config");
    let cfg = dir.write_json("spdk.json", &spdk_config());
    let sdir = dir.path().to_str().unwrap().to_string();
    let d = Daemon::start_with(&dir, "t.sock", "0x1", &["-S", &sdir, "-c", cfg.to_str().unwrap()]);
    let c = controller(&d);
    assert_eq!(c["ctrlr"], "vhost.0");
    assert_eq!(c["backend_specific"]["block"], json!({"readonly": true, "bdev": "M0", "transport": "vhost_user_blk"}));
    assert_eq!((c["delay_base_us"].as_u64(), c["iops_threshold"].as_u64()), (Some(50), Some(80000)));
    assert_eq!(c["socket"], dir.join("vhost.0").to_str().unwrap());
    assert!(dir.join("vhost.0").exists(), "the socket is in the -S folder");

    // save_config writes it back; a second daemon loads that to the same controller.
    let saved = d.call("save_config", None);
    let vb = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "vhost_blk").unwrap();
    let methods: Vec<&str> = vb["config"].as_array().unwrap().iter().map(|e| e["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["vhost_create_blk_controller", "vhost_controller_set_coalescing"]);
    drop(d);
    let dir2 = TempDir::new("vhost-config2");
    let cfg2 = dir2.write_json("saved.json", &saved);
    let sdir2 = dir2.path().to_str().unwrap().to_string();
    let d2 = Daemon::start_with(&dir2, "t.sock", "0x1", &["-S", &sdir2, "-c", cfg2.to_str().unwrap()]);
    let mut c2 = controller(&d2);
    c2["socket"] = c["socket"].clone();
    assert_eq!(c2, c, "the saved config loads to the same controller");

    // Bad parameters: clear errors, nothing made.
    for (params, what) in [
        (json!({"ctrlr": "x", "dev_name": "nope"}), "a bdev that does not exist"),
        (json!({"ctrlr": "a/b", "dev_name": "M0"}), "a name that is a path"),
        (json!({"ctrlr": "vhost.0", "dev_name": "M0", "readonly": true}), "a name taken"),
        (json!({"ctrlr": "y", "dev_name": "M0", "cpumask": "0x10"}), "a cpumask without a reactor"),
        (json!({"ctrlr": "y", "dev_name": "M0", "transport": "vfio_user_virtio_blk"}), "another transport"),
        (json!({"ctrlr": "y", "dev_name": "M0", "bogus": 1}), "an unknown parameter"),
    ] {
        let e = d2.call_err("vhost_create_blk_controller", Some(params));
        assert!(!e.message.is_empty(), "{what}: {e:?}");
    }
    for (params, what) in [
        (json!({"ctrlr": "vhost.0", "delay_base_us": 50, "iops_threshold": 99}), "a threshold under 100"),
        (json!({"ctrlr": "nope", "delay_base_us": 50, "iops_threshold": 1000}), "no such controller"),
    ] {
        let e = d2.call_err("vhost_controller_set_coalescing", Some(params));
        assert!(!e.message.is_empty(), "{what}: {e:?}");
    }
    assert_eq!(d2.call("vhost_get_controllers", None).as_array().map(Vec::len), Some(1), "nothing else was made");

    // packed_ring: accepted, and kept by save_config (only when set: SPDK writes no such key).
    d2.call(
        "vhost_create_blk_controller",
        Some(json!({"ctrlr": "vhost.p", "dev_name": "M0", "readonly": true, "packed_ring": true})),
    );
    let saved = d2.call("save_config", None);
    let vb = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "vhost_blk").unwrap();
    let params: Vec<&Value> = vb["config"].as_array().unwrap().iter().map(|e| &e["params"]).collect();
    let p = params.iter().find(|p| p["ctrlr"] == "vhost.p").expect("the packed controller is saved");
    assert_eq!(p["packed_ring"], json!(true));
    let split = params.iter().find(|p| p["ctrlr"] == "vhost.0").unwrap();
    assert!(split.get("packed_ring").is_none(), "a split controller's entry is SPDK's: {split}");
    d2.call("vhost_delete_controller", Some(json!({"ctrlr": "vhost.p"})));
    d2.call_err("vhost_delete_controller", Some(json!({"ctrlr": "nope"})));
    d2.call("vhost_delete_controller", Some(json!({"ctrlr": "vhost.0"})));
    assert!(!dir2.join("vhost.0").exists(), "the socket goes with its controller");
    assert_eq!(d2.call("vhost_get_controllers", None), json!([]));
}
