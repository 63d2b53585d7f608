//! RAID I/O that lands on one member allocates nothing per I/O in steady state: a raid0 whose
//! strips (256 KiB) hold every request of the verifying driver (4 KiB and 128 KiB, aligned)
//! forwards each request to its member with the offset moved (`IoChannel::forward_then`), as a
//! raid1 read does. The driver (`verify_driver`) keeps 16 requests outstanding on the RAID bdev
//! and counts the reactor's allocations over 4 KiB and 128 KiB random reads and writes, every
//! read compared with what was written. (A request over several members goes out as a
//! fan-out, whose shared state is one allocation per request by design.)
//!
//! `FERRITE_ALLOC_TRACE=N` prints the backtraces of the first N allocations during each
//! measured run.

#[allow(dead_code)] // the host side and the port finder are the initiators' tests'
mod verify_driver;

use serde_json::json;
use verify_driver::{cases, check_counting, target_side};

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

#[test]
fn raid0_io_on_one_member_allocates_nothing_per_io() {
    let s = target_side(ferrite_raid::register);
    // Two members of half the driver's geometry (that of its Malloc0).
    let blocks = s.rpc("bdev_get_bdevs", json!({"name": "Malloc0"})).unwrap()[0]["num_blocks"].as_u64().unwrap();
    for m in ["Malloc1", "Malloc2"] {
        s.rpc("bdev_malloc_create", json!({"name": m, "num_blocks": blocks / 2, "block_size": 4096})).unwrap();
    }
    s.rpc(
        "bdev_raid_create",
        json!({"name": "Raid0", "raid_level": "raid0", "strip_size_kb": 256, "base_bdevs": ["Malloc1", "Malloc2"]}),
    )
    .unwrap();
    check_counting(&s);
    let failures = cases(&s, &s, "Raid0", true);
    s.stop();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
