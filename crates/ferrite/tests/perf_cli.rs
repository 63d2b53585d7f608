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

/// `--interleave`: the bdevs run one at a time in turns, each for the whole -t in total, and the
/// report gives every round's IOPS and the median of the per-round quotients.
#[test]
fn interleave_runs_bdevs_in_turns_and_reports_per_round_quotients() {
    let dir = TempDir::new("perfab");
    let cfg = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "A0", "num_blocks": 4096, "block_size": 4096}},
            {"method": "bdev_malloc_create", "params": {"name": "B0", "num_blocks": 4096, "block_size": 4096}},
            {"method": "bdev_malloc_create", "params": {"name": "Unused", "num_blocks": 256, "block_size": 4096}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let results = dir.join("results.json");
    let cfg = cfg.to_str().unwrap();
    let t0 = std::time::Instant::now();
    // verify: every write is read back and compared, in every turn.
    let out = run_ferrite(&[
        "perf",
        "--json",
        cfg,
        "-T",
        "A0",
        "-T",
        "B0",
        "-q",
        "4",
        "-o",
        "4096",
        "-w",
        "verify",
        "-t",
        "1",
        "--interleave",
        "0.25",
        "--results-json",
        results.to_str().unwrap(),
    ]);
    let wall = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Interleaved: 4 rounds of 0.250 s turns"), "{stdout}");
    assert!(stdout.contains("B0 / A0: median"), "{stdout}");
    // Two bdevs one after the other for 1 s each: 2 s at least, where running together takes 1.
    assert!(wall >= 2.0, "the turns overlapped: {wall} s");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let jobs = doc["results"].as_array().unwrap();
    let names: Vec<&str> = jobs.iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(names, ["A0", "B0"], "only the -T bdevs run");
    for j in jobs {
        let runtime = j["runtime"].as_f64().unwrap();
        assert!((0.95..1.5).contains(&runtime), "each bdev runs -t in total: {j}");
        assert_eq!(j["verify_errors"], 0);
        assert_eq!(j["io_failed"], 0);
    }
    let rounds = doc["interleave"]["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 4);
    let mut q: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let (a, b) = (r["A0"].as_f64().unwrap(), r["B0"].as_f64().unwrap());
            assert!(a > 0.0 && b > 0.0, "{r}");
            b / a
        })
        .collect();
    q.sort_by(f64::total_cmp);
    let median = (q[1] + q[2]) / 2.0;
    let reported = doc["interleave"]["quotients"]["B0"].as_f64().unwrap();
    assert!((reported - median).abs() < 1e-9, "{reported} against {median} from {q:?}");
    // Turns that are not positive or longer than the run are refused before anything runs.
    for bad in ["0", "2", "nan"] {
        let out = run_ferrite(&[
            "perf",
            "--json",
            cfg,
            "-T",
            "A0",
            "-q",
            "1",
            "-o",
            "4096",
            "-w",
            "read",
            "-t",
            "1",
            "--interleave",
            bad,
        ]);
        assert!(!out.status.success(), "--interleave {bad} accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--interleave"), "--interleave {bad}");
    }
    // A bdev named twice would be two jobs under one name: refused.
    let out =
        run_ferrite(&["perf", "--json", cfg, "-T", "A0", "-T", "A0", "-q", "1", "-o", "4096", "-w", "read", "-t", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bdev A0 is named twice with -T"));
}

/// `-w compare_and_write,randwrite`: core 0 compare-and-writes (no miscompare: each unit holds
/// the version the job wrote), core 1 writes; `--hold-lock` holds a range lock on a block no job
/// writes through the run, and the run reports the bdev's lock counters.
#[test]
fn compare_and_write_per_core_workloads_and_a_held_lock() {
    let dir = TempDir::new("perfcaw");
    let cfg = dir.write_json(
        "bdevs.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 2049, "block_size": 4096}}]}]}),
    );
    let results = dir.join("results.json");
    let cfg = cfg.to_str().unwrap();
    let args = ["perf", "--json", cfg, "-q", "8", "-o", "4096", "-t", "1", "-m", "0x3", "--no-pin"];
    let caw = ["-w", "compare_and_write,randwrite", "--hold-lock", "2048", "--results-json", results.to_str().unwrap()];
    let out = run_ferrite(&[&args[..], &caw[..]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Holding an LBA range lock on block 2048"), "{stdout}");
    assert!(stdout.contains("Range locks of Malloc0:"), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let mut jobs: Vec<(String, Value)> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["core_mask"].as_str().unwrap().to_string(), j.clone()))
        .collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(jobs[0].1["workload"], "compare_and_write");
    assert_eq!(jobs[1].1["workload"], "randwrite");
    for (_, j) in &jobs {
        assert!(j["iops"].as_f64().unwrap() > 0.0, "{j}");
        assert_eq!(j["io_failed"], 0, "{j}");
        assert_eq!(j["verify_errors"], 0, "{j}");
    }
    // A lock past the end is refused.
    let out = run_ferrite(&[&args[..], &["-w", "randwrite", "--hold-lock", "2049"]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("past the end"));
}
