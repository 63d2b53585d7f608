//! `ferrite perf`: verify runs on each module, data really reaching a uring file, config
//! errors, and a bdev deleted by RPC in the middle of a run.

mod common;

use common::{Proc, TempDir};
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// A config that runs one create call.
fn config_with(dir: &TempDir, name: &str, method: &str, params: Value) -> String {
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": method, "params": params},
        {"method": "bdev_wait_for_examine"}]}]});
    dir.write_json(name, &doc).to_str().unwrap().to_string()
}

struct PerfRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `ferrite perf --json cfg args...` and waits at most `limit` (then kills it and fails).
fn run_perf(dir: &TempDir, tag: &str, cfg: &str, args: &[&str], limit: Duration) -> PerfRun {
    let mut all = vec!["perf", "--json", cfg];
    all.extend_from_slice(args);
    let mut p = Proc::spawn(dir, tag, &all);
    let st = p.expect_exit(limit, &format!("ferrite perf {tag}"));
    PerfRun { code: st.code(), stdout: p.stdout(), stderr: p.stderr(), elapsed: p.started.elapsed() }
}

/// Checks a successful verify run: exit 0, the result table with a Total row, and results JSON
/// with I/O done and no errors.
fn check_verify_run(run: &PerfRun, results: &Path, bdev: &str) {
    assert_eq!(run.code, Some(0), "perf failed\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stdout.lines().any(|l| l.trim_start().starts_with("Total") && l.contains(':')), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("Job: {bdev} ")), "{}", run.stdout);
    assert!(run.stdout.contains("verify, depth: 16, IO size: 4096"), "{}", run.stdout);
    assert!(!run.stdout.contains("Verify errors"), "{}", run.stdout);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(results).expect("results file written"))
        .expect("results file is JSON");
    let r = &doc["results"][0];
    assert_eq!(r["job"], bdev, "{doc}");
    assert_eq!(r["workload"], "verify", "{doc}");
    assert_eq!(r["queue_depth"], 16, "{doc}");
    assert_eq!(r["io_size"], 4096, "{doc}");
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(r["verify_errors"], 0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}");
    assert!(run.elapsed >= Duration::from_millis(1900), "a 2 s run ended after {:?}", run.elapsed);
    let runtime = r["runtime"].as_f64().unwrap();
    assert!((1.5..10.0).contains(&runtime), "runtime {runtime}: {doc}");
    assert!(doc["total"]["iops"].as_f64().unwrap() > 0.0, "{doc}");
}

fn verify_args(results: &Path, extra: &'static [&'static str]) -> Vec<String> {
    let mut v: Vec<String> =
        ["-w", "verify", "-q", "16", "-o", "4096", "-t", "2", "--results-json"].iter().map(|s| s.to_string()).collect();
    v.push(results.to_str().unwrap().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn verify_null_bdev() {
    let dir = TempDir::new("perfnull");
    let cfg = config_with(
        &dir,
        "null.json",
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 65536, "block_size": 512}),
    );
    let results = dir.join("results.json");
    // bdevperf's default: polling reactors.
    let args = verify_args(&results, &[]);
    let run = run_perf(&dir, "null", &cfg, &strs(&args), Duration::from_secs(20));
    check_verify_run(&run, &results, "Null0");
}

#[test]
fn verify_malloc_bdev() {
    let dir = TempDir::new("perfmalloc");
    let cfg = config_with(
        &dir,
        "malloc.json",
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 16384, "block_size": 512}),
    );
    let results = dir.join("results.json");
    let args = verify_args(&results, &["--reactor-mode", "interrupt"]);
    let run = run_perf(&dir, "malloc", &cfg, &strs(&args), Duration::from_secs(20));
    check_verify_run(&run, &results, "Malloc0");
}

/// A file of `size` bytes of `byte` in `dir`, and a config that makes it the uring bdev Uring0.
fn uring_disk(dir: &TempDir, size: usize, byte: u8) -> (std::path::PathBuf, String) {
    let img = dir.file_filled("disk.img", size, byte);
    let cfg = config_with(
        dir,
        "uring.json",
        "bdev_uring_create",
        json!({"name": "Uring0", "filename": img.to_str().unwrap()}),
    );
    (img, cfg)
}

/// True for each 4 KiB block that is still entirely `byte`.
fn untouched_blocks(data: &[u8], byte: u8) -> usize {
    data.chunks(4096).filter(|c| c.iter().all(|&b| b == byte)).count()
}

#[test]
fn uring_write_reaches_the_file_then_verify() {
    const SIZE: usize = 16 << 20;
    let dir = TempDir::new("perfuring");
    let (img, cfg) = uring_disk(&dir, SIZE, 0xAB);

    let run = run_perf(
        &dir,
        "uring-write",
        &cfg,
        &["-w", "write", "-q", "8", "-o", "4096", "-t", "1", "--reactor-mode", "interrupt"],
        Duration::from_secs(20),
    );
    assert_eq!(run.code, Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("write, depth: 8, IO size: 4096"), "{}", run.stdout);
    let data = std::fs::read(&img).unwrap();
    assert_eq!(data.len(), SIZE, "write changed the file's size");
    let untouched = untouched_blocks(&data, 0xAB);
    assert!(untouched < SIZE / 4096, "no 4 KiB block of the file changed");
    // Sequential writes start at block 0.
    assert_ne!(&data[..4096], &[0xABu8; 4096][..], "the first block was not written");

    let results = dir.join("results.json");
    let args = verify_args(&results, &["--reactor-mode", "interrupt"]);
    let run = run_perf(&dir, "uring-verify", &cfg, &strs(&args), Duration::from_secs(20));
    check_verify_run(&run, &results, "Uring0");
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(meta.len(), SIZE as u64, "verify changed the file's size");
    let data = std::fs::read(&img).unwrap();
    assert_eq!(data.len(), SIZE);
}

#[test]
fn fill_writes_every_block_before_a_read_run() {
    // 9 MiB and 4 KiB: the last fill write is shorter than 1 MiB.
    const SIZE: usize = (9 << 20) + 4096;
    let dir = TempDir::new("perffill");
    let (img, cfg) = uring_disk(&dir, SIZE, 0);
    let run = run_perf(
        &dir,
        "fill-randread",
        &cfg,
        &["-w", "randread", "-q", "4", "-o", "4096", "-t", "1", "--fill", "--reactor-mode", "interrupt"],
        Duration::from_secs(20),
    );
    assert_eq!(run.code, Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("Filled Uring0: 9 MiB"), "{}", run.stdout);
    assert!(run.stdout.contains("randread, depth: 4, IO size: 4096"), "{}", run.stdout);
    let data = std::fs::read(&img).unwrap();
    assert_eq!(data.len(), SIZE, "the fill changed the file's size");
    assert_eq!(untouched_blocks(&data, 0), 0, "blocks the fill did not write");
}

#[test]
fn fill_leaves_a_claimed_base_to_its_lvstore_and_reads_it_as_it_is() {
    // An lvol and the base its lvstore claims, read in one run: the fill writes the lvol (all
    // but the lvstore's metadata at the front of the file) and says it leaves the base alone.
    const SIZE: usize = 16 << 20;
    let dir = TempDir::new("perffillclaimed");
    let img = dir.file_filled("disk.img", SIZE, 0);
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_uring_create", "params": {"name": "U0", "filename": img.to_str().unwrap()}},
        {"method": "bdev_lvol_create_lvstore", "params": {"bdev_name": "U0", "lvs_name": "lvs0", "cluster_sz": 1 << 20}},
        {"method": "bdev_lvol_create", "params": {"lvs_name": "lvs0", "lvol_name": "l0", "size_in_mib": 8}},
        {"method": "bdev_wait_for_examine"}]}]});
    let cfg = dir.write_json("lvol.json", &doc).to_str().unwrap().to_string();
    let args = ["-T", "U0", "-T", "lvs0/l0", "-w", "randread", "-q", "4", "-o", "4096", "-t", "1", "--fill"];
    let run = run_perf(&dir, "fill-claimed", &cfg, &args, Duration::from_secs(30));
    assert_eq!(run.code, Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("Not filled U0: claimed by module lvol"), "{}", run.stdout);
    assert!(run.stdout.contains("Filled lvs0/l0: 8 MiB"), "{}", run.stdout);
    assert!(run.stdout.contains("Job: U0 ") && run.stdout.contains("Job: lvs0/l0 "), "{}", run.stdout);
    let data = std::fs::read(&img).unwrap();
    // The lvol's 8 clusters were written; the 7 MiB past them were not.
    let written = SIZE / 4096 - untouched_blocks(&data, 0);
    assert!(((8 << 20) / 4096..(9 << 20) / 4096).contains(&written), "{written} blocks written");
    assert_eq!(untouched_blocks(&data[SIZE - (7 << 20)..], 0), (7 << 20) / 4096, "the fill wrote past the lvol");
}

#[test]
fn missing_uring_file_fails_with_its_path() {
    let dir = TempDir::new("perfmissing");
    let missing = dir.join("no-such-disk.img");
    let cfg = config_with(
        &dir,
        "uring.json",
        "bdev_uring_create",
        json!({"name": "U0", "filename": missing.to_str().unwrap()}),
    );
    let run = run_perf(
        &dir,
        "missing",
        &cfg,
        &["-w", "verify", "-q", "16", "-o", "4096", "-t", "2", "--reactor-mode", "interrupt"],
        Duration::from_secs(10),
    );
    assert!(matches!(run.code, Some(c) if c != 0), "exit {:?}; stderr:\n{}", run.code, run.stderr);
    assert!(run.stderr.contains(missing.to_str().unwrap()), "stderr does not name the path:\n{}", run.stderr);
    assert!(!run.stdout.contains("Total"), "{}", run.stdout);
}

#[test]
fn bad_options_and_io_sizes_fail() {
    let dir = TempDir::new("perfbadopts");
    let cfg = config_with(
        &dir,
        "m.json",
        "bdev_malloc_create",
        json!({"name": "M4k", "num_blocks": 256, "block_size": 4096}),
    );
    let base = ["--reactor-mode", "interrupt", "-w", "randread", "-t", "1"];
    // Queue depth 0.
    let mut a = base.to_vec();
    a.extend(["-q", "0", "-o", "4096"]);
    let run = run_perf(&dir, "qd0", &cfg, &a, Duration::from_secs(10));
    assert!(matches!(run.code, Some(c) if c != 0), "{}", run.stderr);
    assert!(run.stderr.contains("queue depth"), "{}", run.stderr);
    // An I/O size that is not a multiple of the block size.
    let mut a = base.to_vec();
    a.extend(["-q", "4", "-o", "512"]);
    let run = run_perf(&dir, "io512", &cfg, &a, Duration::from_secs(10));
    assert!(matches!(run.code, Some(c) if c != 0), "{}", run.stderr);
    assert!(run.stderr.contains("block size"), "{}", run.stderr);
    // A bdev that the config does not create.
    let mut a = base.to_vec();
    a.extend(["-q", "4", "-o", "4096", "-T", "Nope0"]);
    let run = run_perf(&dir, "nobdev", &cfg, &a, Duration::from_secs(10));
    assert!(matches!(run.code, Some(c) if c != 0), "{}", run.stderr);
    assert!(run.stderr.contains("Nope0"), "{}", run.stderr);
}

#[test]
fn bdev_deleted_during_run() {
    let dir = TempDir::new("perfdelete");
    let cfg = config_with(
        &dir,
        "m.json",
        "bdev_malloc_create",
        json!({"name": "Victim0", "num_blocks": 32768, "block_size": 512}),
    );
    let sock = dir.join("perf.sock");
    let mut p = Proc::spawn(
        &dir,
        "perf-delete",
        &[
            "perf",
            "--json",
            &cfg,
            "-r",
            sock.to_str().unwrap(),
            "-w",
            "randrw",
            "-M",
            "50",
            "-q",
            "32",
            "-o",
            "4096",
            "-t",
            "5",
        ],
    );
    common::wait_for_socket(&mut p, &sock, Duration::from_secs(10));
    let socket_seen = Instant::now();
    let mut c = RpcClient::connect(&sock, common::RPC_TIMEOUT).unwrap();
    // The bdev is there and busy.
    let b = common::call(&mut c, "bdev_get_bdevs", Some(json!({"name": "Victim0"})));
    assert_eq!(b[0]["num_blocks"], 32768);
    std::thread::sleep(Duration::from_secs(1));
    let st = common::call(&mut c, "bdev_get_iostat", Some(json!({"name": "Victim0"})));
    let ops = st["bdevs"][0]["num_read_ops"].as_u64().unwrap() + st["bdevs"][0]["num_write_ops"].as_u64().unwrap();
    assert!(ops > 0, "no I/O after 1 s: {st}");

    let t = Instant::now();
    let r = common::call(&mut c, "bdev_malloc_delete", Some(json!({"name": "Victim0"})));
    assert_eq!(r, json!(true));
    let rpc_time = t.elapsed();
    assert!(rpc_time < Duration::from_secs(4), "bdev_malloc_delete took {rpc_time:?}");
    let deleted_at = Instant::now();

    // Bounded wait: a hang fails the test (the guard kills the process).
    let status = p.expect_exit(Duration::from_secs(20), "perf after its bdev was deleted");
    let exit_delay = deleted_at.elapsed();
    let since_socket = socket_seen.elapsed();
    let stderr = p.stderr();
    assert!(
        exit_delay < Duration::from_secs(3),
        "perf took {exit_delay:?} to exit after the delete ({since_socket:?} after its socket appeared); \
         status {status:?}; stderr:\n{stderr}"
    );
    assert!(since_socket < Duration::from_millis(4800), "perf ran its full time: {since_socket:?}");
    assert!(stderr.contains("Victim0") && stderr.contains("deleted"), "no message about the deletion:\n{stderr}");
    assert!(!sock.exists(), "perf left its socket behind");
}

#[test]
fn verify_never_has_two_slots_on_one_block_when_some_requests_are_slow() {
    // 17 units of 4 KiB for 16 slots, behind a delay bdev whose latencies vary (1 in 100 takes
    // 20 ms): the cursor wraps past slow slots all the time. A unit still being written or read
    // back by one slot must not be given to another (as bdevperf's outstanding array), or a
    // read-back sees the other slot's pattern and counts a verify error that is no data error.
    let dir = TempDir::new("perfoverlap");
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 17, "block_size": 4096}},
        {"method": "bdev_delay_create", "params": {"base_bdev_name": "M0", "name": "D0",
            "avg_read_latency": 5, "p99_read_latency": 20000, "avg_write_latency": 5, "p99_write_latency": 20000}},
        {"method": "bdev_wait_for_examine"}]}]});
    let cfg = dir.write_json("delay.json", &doc).to_str().unwrap().to_string();
    let results = dir.join("results.json");
    let args = verify_args(&results, &["-T", "D0"]);
    let run = run_perf(&dir, "overlap", &cfg, &strs(&args), Duration::from_secs(20));
    check_verify_run(&run, &results, "D0");
}
