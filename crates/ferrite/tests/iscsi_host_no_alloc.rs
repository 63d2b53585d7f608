//! The iSCSI initiator's I/O path allocates nothing per I/O in steady state (nor does the
//! target it talks to): Ferrite's iSCSI target serving a malloc and a null bdev as LUNs 0 and
//! 1 of a node, and Ferrite's initiator (`ferrite_iscsi_host`), whose LUNs are bdevs
//! (`bdev_iscsi_create`).
//!
//! Both run in this process, each on an engine of its own with one reactor, connected over TCP
//! on 127.0.0.1. A global allocator counts allocations per thread, so each reactor's count is
//! its own side's. The verifying driver (`verify_driver`) keeps 16 requests outstanding on an
//! iSCSI bdev and counts both reactors' allocations over 4 KiB random reads and writes
//! (immediate data), 128 KiB random reads (several Data-In PDUs) and writes (immediate data,
//! then an R2T and Data-Out PDUs), and reads and writes of both sizes mixed, every read
//! compared with what was written. The target's CmdSN window (its node's queue depth, 8) is
//! narrower than the driver's queue depth, so requests also wait for the window.
//!
//! `FERRITE_ALLOC_TRACE=N` prints the backtraces of the first N allocations on each reactor
//! during each measured run.

mod verify_driver;

use serde_json::json;
use verify_driver::{cases, check_counting, host_side, listen_on_free_port, target_side, Side};

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

const IQN: &str = "iqn.2016-06.io.spdk:noalloc";

/// The target: a malloc bdev (LUN 0) and a null bdev (LUN 1) of one node, listening on
/// 127.0.0.1; returns it and its port.
fn target() -> (Side, u16) {
    let t = target_side(ferrite_iscsi_target::register);
    // The target's engine listens on its portal groups (this thread is entered into it).
    ferrite_iscsi_target::engine::install();
    t.rpc("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})).unwrap();
    let port = listen_on_free_port(|port| {
        let pg = json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]});
        t.rpc("iscsi_create_portal_group", pg).is_ok()
    });
    t.rpc(
        "iscsi_create_target_node",
        json!({"name": "noalloc", "alias_name": "", "luns": [{"bdev_name": "Malloc0", "lun_id": 0},
            {"bdev_name": "Null0", "lun_id": 1}], "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 8}),
    )
    .unwrap();
    (t, port)
}

/// The host, with the target's LUNs on `port` as bdevs iSCSI0 (the malloc) and iSCSI1 (the
/// null).
fn host(port: u16) -> Side {
    let h = host_side(ferrite_iscsi_host::rpc::register);
    for lun in 0..2 {
        let name = format!("iSCSI{lun}");
        let url = format!("iscsi://127.0.0.1:{port}/{IQN}/{lun}");
        let got = h
            .rpc(
                "bdev_iscsi_create",
                json!({"name": name, "url": url, "initiator_iqn": "iqn.2016-06.io.ferrite:noalloc"}),
            )
            .unwrap();
        assert_eq!(got, json!(name));
    }
    h
}

#[test]
fn iscsi_initiator_io_allocates_nothing_per_io() {
    let (t, port) = target();
    let h = host(port);
    check_counting(&h);
    let mut failures = cases(&t, &h, "iSCSI0", true);
    failures.extend(cases(&t, &h, "iSCSI1", false));
    h.engine.call(0, ferrite_iscsi_host::rpc::shutdown).wait().expect("reactor answers");
    t.engine
        .run_async(0, || async {
            ferrite_iscsi_target::shutdown();
            ferrite_iscsi_target::engine::shutdown().await
        })
        .wait()
        .expect("reactor answers");
    h.stop();
    t.stop();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
