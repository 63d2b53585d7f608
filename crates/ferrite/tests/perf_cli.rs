//! A bdevperf command line, flags and all, runs unchanged under `ferrite perf`.

mod common;

use common::{run_ferrite, TempDir};
use serde_json::{json, Value};

#[test]
fn bdevperf_command_line_works_unchanged() {
    let dir = TempDir::new("perfcli");
    let cfg = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 8192, "block_size": 512}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let results = dir.join("results.json");
    // As in SPDK's docs: bdevperf --json FILE -q 8 -o 4096 -w rw -M 70 -t 1 -m 0x3 -C -S 1,
    // plus the app options people pass to SPDK (-s, --no-huge).
    let out = run_ferrite(&[
        "perf",
        "--json",
        cfg.to_str().unwrap(),
        "-q",
        "8",
        "-o",
        "4k",
        "-w",
        "rw",
        "-M",
        "70",
        "-t",
        "1",
        "-m",
        "0x3",
        "-C",
        "-S",
        "1",
        "-s",
        "512",
        "--no-huge",
        "--no-pin",
        "--results-json",
        results.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Running I/O for 1 seconds"), "{stdout}");
    assert!(stdout.contains("Core Mask 0x1") && stdout.contains("Core Mask 0x2"), "one job per core: {stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let jobs = doc["results"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        assert_eq!(j["workload"], "rw");
        assert_eq!(j["io_size"], 4096);
        assert_eq!(j["queue_depth"], 8);
        assert!(j["iops"].as_f64().unwrap() > 0.0);
        assert_eq!(j["io_failed"], 0);
    }
    // A flag bdevperf has but Ferrite does not (-z, wait for perform_tests) is refused clearly.
    let out =
        run_ferrite(&["perf", "--json", cfg.to_str().unwrap(), "-q", "1", "-o", "4096", "-w", "read", "-t", "1", "-z"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-z"));
}
