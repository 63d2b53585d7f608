//! The NVMe/TCP I/O path allocates nothing per I/O in steady state, on either side: Ferrite's
//! target (`ferrite_nvmf::target`) serving a malloc and a null bdev, and Ferrite's host
//! (`ferrite_nvmf_host`), whose namespaces are bdevs (`bdev_nvme_attach_controller`).
//!
//! Both run in this process, each on an engine of its own with one reactor, connected over TCP
//! on 127.0.0.1. A global allocator counts allocations per thread, so each reactor's count is
//! its own side's: no real client can report a server's allocations, nor a real server a
//! host's. The verifying driver (`verify_driver`) keeps 16 requests outstanding on a host bdev
//! and counts both reactors' allocations over 4 KiB random reads, 4 KiB random writes (data in
//! the command capsule), 128 KiB random reads (a 128 KiB C2HData PDU, received in many socket
//! reads) and writes (R2T, then H2CData), and reads and writes of both sizes mixed, every read
//! compared with what was written.
//!
//! To find where an allocation comes from, `FERRITE_ALLOC_TRACE=N` prints the backtraces of the
//! first N allocations on each reactor during each measured run.

mod verify_driver;

use serde_json::json;
use verify_driver::{cases, check_counting, host_side, listen_on_free_port, target_side, Side};

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

const NQN: &str = "nqn.2016-06.io.ferrite:no-alloc";

/// The target: a malloc bdev (namespace 1) and a null bdev (namespace 2) of one subsystem,
/// listening on 127.0.0.1; returns it and its port.
fn target() -> (Side, u16) {
    let t = target_side(ferrite_nvmf::target::rpc::register);
    t.rpc("nvmf_create_transport", json!({"trtype": "TCP"})).unwrap();
    t.rpc("nvmf_create_subsystem", json!({"nqn": NQN, "allow_any_host": true, "serial_number": "NOALLOC01"})).unwrap();
    for b in ["Malloc0", "Null0"] {
        t.rpc("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": b}})).unwrap();
    }
    let port = listen_on_free_port(|port| {
        let listen = json!({"nqn": NQN, "listen_address":
            {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}});
        t.rpc("nvmf_subsystem_add_listener", listen).is_ok()
    });
    (t, port)
}

/// The host, attached to the target on `port`: bdevs Nvme0n1 (the malloc) and Nvme0n2 (the
/// null).
fn host(port: u16) -> Side {
    let h = host_side(ferrite_nvmf_host::rpc::register);
    let names = h
        .rpc(
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                "trsvcid": port.to_string(), "subnqn": NQN}),
        )
        .unwrap();
    assert_eq!(names, json!(["Nvme0n1", "Nvme0n2"]), "the host's bdevs");
    h
}

#[test]
fn nvme_tcp_io_allocates_nothing_per_io_on_target_and_host() {
    let (t, port) = target();
    let h = host(port);
    check_counting(&h);
    let mut failures = cases(&t, &h, "Nvme0n1", true);
    failures.extend(cases(&t, &h, "Nvme0n2", false));
    h.engine.run_async(0, || async { ferrite_nvmf_host::rpc::shutdown().await }).wait().expect("reactor answers");
    t.engine
        .run_async(0, || async { ferrite_nvmf::target::rpc::shutdown(&ferrite_reactor::engine()).await })
        .wait()
        .expect("reactor answers");
    h.stop();
    t.stop();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
