//! The NVMe-oF target's RPCs: what they refuse (SPDK refuses the same), and save_config of the
//! "nvmf" subsystem loading back into a fresh daemon unchanged.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::free_port;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.ferrite:rpc-test";

fn listen(port: &str, fam: &str, addr: &str) -> Value {
    json!({"trtype": "TCP", "adrfam": fam, "traddr": addr, "trsvcid": port})
}

#[test]
fn nvmf_rpcs_refuse_what_spdk_refuses() {
    let dir = TempDir::new("nvmf-rpc-rules");
    let d = Daemon::start_with(&dir, "rpc.sock", "0x1", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 512})));
    // A listener before the transport exists.
    d.call("nvmf_create_subsystem", Some(json!({"nqn": NQN, "allow_any_host": true})));
    let port = free_port().to_string();
    d.call_err(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen(&port, "IPv4", "127.0.0.1")})),
    );
    // Sizes that are no sizes are refused, and leave no transport behind.
    for bad in [json!({"io_unit_size": 0}), json!({"max_io_size": 0}), json!({"in_capsule_data_size": 100})] {
        let mut p = bad.clone();
        p["trtype"] = json!("TCP");
        let e = d.call_err("nvmf_create_transport", Some(p));
        assert!(e.message.contains("Invalid parameters"), "{bad}: {e:?}");
    }
    d.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    d.call_err("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    d.call_err("nvmf_create_transport", Some(json!({"trtype": "RDMA"})));
    // Bad NQNs, a duplicate subsystem, bad serial numbers and cntlid ranges.
    d.call_err("nvmf_create_subsystem", Some(json!({"nqn": "not-an-nqn"})));
    d.call_err("nvmf_create_subsystem", Some(json!({"nqn": NQN})));
    d.call_err(
        "nvmf_create_subsystem",
        Some(json!({"nqn": "nqn.2016-06.io.ferrite:x", "serial_number": "a".repeat(21)})),
    );
    d.call_err(
        "nvmf_create_subsystem",
        Some(json!({"nqn": "nqn.2016-06.io.ferrite:y", "min_cntlid": 10, "max_cntlid": 5})),
    );
    // A bdev is one namespace of a subsystem at most (its identifiers would repeat).
    assert_eq!(d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "M0"}}))), json!(1));
    d.call_err("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "M0"}})));
    d.call_err("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "nope"}})));
    // Blocks that are not a power of two cannot be told to hosts (LBADS): refused, and the bdev
    // is left unopened (it can be deleted at once).
    d.call("bdev_null_create", Some(json!({"name": "N1536", "num_blocks": 4096, "block_size": 1536})));
    let e = d.call_err("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "N1536"}})));
    assert!(e.message.contains("power of two"), "{e:?}");
    assert_eq!(d.call("bdev_null_delete", Some(json!({"name": "N1536"}))), json!(true));
    // Port 0 (hosts would be told 0), an address of the other family, a busy port.
    d.call_err(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen("0", "IPv4", "127.0.0.1")})),
    );
    d.call_err(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen(&port, "IPv4", "::1")})),
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    d.call_err(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen(&busy_port, "IPv4", "127.0.0.1")})),
    );
    d.call(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen(&port, "IPv4", "127.0.0.1")})),
    );
    d.call_err(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": NQN, "listen_address": listen(&port, "IPv4", "127.0.0.1")})),
    );
    // ANA states need ANA reporting (hosts could not read them otherwise).
    d.call_err(
        "nvmf_subsystem_listener_set_ana_state",
        Some(json!({"nqn": NQN, "listen_address": listen(&port, "IPv4", "127.0.0.1"), "ana_state": "inaccessible"})),
    );
    // Removing what is not there.
    d.call_err("nvmf_subsystem_remove_ns", Some(json!({"nqn": NQN, "nsid": 7})));
    d.call_err("nvmf_delete_subsystem", Some(json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery"})));
    d.call_err("nvmf_delete_subsystem", Some(json!({"nqn": "nqn.2016-06.io.ferrite:none"})));
    d.assert_serving();
}

/// Everything but the live parts (controllers) of nvmf_get_subsystems.
fn subsystems(d: &Daemon) -> Value {
    d.call("nvmf_get_subsystems", None)
}

#[test]
fn nvmf_config_round_trips_through_save_config() {
    let dir = TempDir::new("nvmf-rpc-config");
    let d = Daemon::start_with(&dir, "a.sock", "0x1", &["--no-pin"]);
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 512})));
    d.call("bdev_null_create", Some(json!({"name": "N0", "num_blocks": 4096, "block_size": 4096})));
    d.call(
        "nvmf_create_transport",
        Some(json!({"trtype": "TCP", "in_capsule_data_size": 8192, "max_io_size": 262144})),
    );
    d.call(
        "nvmf_create_subsystem",
        Some(json!({"nqn": NQN, "serial_number": "RT0001", "model_number": "Round trip", "ana_reporting": true,
            "max_namespaces": 8, "min_cntlid": 3, "max_cntlid": 300})),
    );
    d.call("nvmf_subsystem_add_host", Some(json!({"nqn": NQN, "host": "nqn.2016-06.io.ferrite:h1"})));
    d.call(
        "nvmf_subsystem_add_ns",
        Some(json!({"nqn": NQN, "namespace": {"bdev_name": "M0", "nsid": 5, "nguid": "00112233445566778899AABBCCDDEEFF"}})),
    );
    d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": NQN, "namespace": {"bdev_name": "N0", "anagrpid": 2}})));
    let port = free_port().to_string();
    let la = listen(&port, "IPv4", "127.0.0.1");
    d.call("nvmf_subsystem_add_listener", Some(json!({"nqn": NQN, "listen_address": la})));
    d.call(
        "nvmf_subsystem_listener_set_ana_state",
        Some(json!({"nqn": NQN, "listen_address": la, "ana_state": "non_optimized", "anagrpid": 2})),
    );
    d.call(
        "nvmf_discovery_add_referral",
        Some(json!({"address": listen("4430", "IPv4", "127.0.0.2"), "subnqn": "nqn.2014-08.org.nvmexpress.discovery"})),
    );
    let before = subsystems(&d);
    let listeners = d.call("nvmf_subsystem_get_listeners", Some(json!({"nqn": NQN})));
    let transports = d.call("nvmf_get_transports", None);
    let referrals = d.call("nvmf_discovery_get_referrals", None);
    let cfg = d.call("save_config", None);
    drop(d); // stops the first daemon (its port is free again)
    std::thread::sleep(std::time::Duration::from_millis(300));
    let file = dir.write_json("saved.json", &cfg);
    let d2 = Daemon::start_with(&dir, "b.sock", "0x1", &["--no-pin", "--json", file.to_str().unwrap()]);
    assert_eq!(subsystems(&d2), before, "nvmf_get_subsystems after reloading save_config");
    assert_eq!(d2.call("nvmf_subsystem_get_listeners", Some(json!({"nqn": NQN}))), listeners);
    assert_eq!(d2.call("nvmf_get_transports", None), transports);
    assert_eq!(d2.call("nvmf_discovery_get_referrals", None), referrals);
    // And the same config saves the same way again.
    assert_eq!(d2.call("save_config", None), cfg, "save_config of the reloaded daemon");
}
