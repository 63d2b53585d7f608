//! The virtual bdevs through the daemon and `ferrite perf`: verify runs over stacks on malloc and
//! on a uring file, injected faults seen by perf and in iostat with their status, delay seen in
//! perf's latency, save_config of a stack restarting, and bad parameters answered with JSON-RPC
//! errors.

mod common;

use common::{Daemon, Proc, TempDir};
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::time::Duration;

/// A config whose "bdev" subsystem runs `entries` in order.
fn config(dir: &TempDir, name: &str, entries: Vec<Value>) -> String {
    let mut e = entries;
    e.push(json!({"method": "bdev_wait_for_examine"}));
    let doc = json!({"subsystems": [{"subsystem": "bdev", "config": e}]});
    dir.write_json(name, &doc).to_str().unwrap().to_string()
}

fn m(method: &str, params: Value) -> Value {
    json!({"method": method, "params": params})
}

/// Runs `ferrite perf --json cfg args... --results-json R` (at most 30 s); returns exit code,
/// stderr and the results document.
fn perf(dir: &TempDir, tag: &str, cfg: &str, args: &[&str]) -> (Option<i32>, String, Value) {
    let results = dir.join(&format!("{tag}.json"));
    let mut all =
        vec!["perf", "--json", cfg, "--reactor-mode", "interrupt", "--results-json", results.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut p = Proc::spawn(dir, tag, &all);
    let st = p.expect_exit(Duration::from_secs(30), tag);
    let doc = std::fs::read_to_string(&results).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(Value::Null);
    (st.code(), format!("stdout:\n{}\nstderr:\n{}", p.stdout(), p.stderr()), doc)
}

fn verify_ok(dir: &TempDir, tag: &str, cfg: &str, bdev: &str) {
    let (code, out, doc) = perf(dir, tag, cfg, &["-T", bdev, "-w", "verify", "-q", "16", "-o", "4096", "-t", "2"]);
    assert_eq!(code, Some(0), "{out}");
    let r = &doc["results"][0];
    assert_eq!(r["job"], bdev, "{doc}");
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}");
    assert_eq!(r["verify_errors"], 0, "{doc}");
}

#[test]
fn perf_verify_through_stacks_on_malloc_and_on_a_uring_file() {
    let dir = TempDir::new("vbverify");
    let cfg = config(
        &dir,
        "malloc.json",
        vec![
            m("bdev_malloc_create", json!({"name": "M0", "num_blocks": 32768, "block_size": 512})),
            m("bdev_error_create", json!({"base_name": "M0"})),
            m(
                "bdev_delay_create",
                json!({"base_bdev_name": "EE_M0", "name": "D0", "avg_read_latency": 20,
                "p99_read_latency": 50, "avg_write_latency": 20, "p99_write_latency": 50}),
            ),
            m("bdev_passthru_create", json!({"base_bdev_name": "D0", "name": "P0"})),
        ],
    );
    verify_ok(&dir, "stack-malloc", &cfg, "P0");
    let img = dir.file_filled("disk.img", 16 << 20, 0);
    let cfg = config(
        &dir,
        "uring.json",
        vec![
            m("bdev_uring_create", json!({"name": "U0", "filename": img.to_str().unwrap()})),
            m("bdev_passthru_create", json!({"base_bdev_name": "U0", "name": "UP0"})),
            m("bdev_error_create", json!({"base_name": "UP0"})),
            m(
                "bdev_delay_create",
                json!({"base_bdev_name": "EE_UP0", "name": "UD0", "avg_read_latency": 10,
                "p99_read_latency": 10, "avg_write_latency": 10, "p99_write_latency": 10}),
            ),
        ],
    );
    verify_ok(&dir, "stack-uring", &cfg, "UD0");
    let data = std::fs::read(&img).unwrap();
    assert!(data.iter().any(|&b| b != 0), "verify's writes reached the file");
}

#[test]
fn injected_failures_are_seen_by_perf_with_their_status() {
    let dir = TempDir::new("vbinject");
    let sock = dir.join("perf.sock");
    let cfg = config(
        &dir,
        "err.json",
        vec![
            m("bdev_malloc_create", json!({"name": "M1", "num_blocks": 16384, "block_size": 512})),
            m("bdev_error_create", json!({"base_name": "M1"})),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_M1", "io_type": "write", "error_type": "failure", "num": 5}),
            ),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_M1", "io_type": "read", "error_type": "nvme_failure",
                "num": 3, "nvme_sct": 1, "nvme_sc": 2}),
            ),
            m("bdev_error_inject_error", json!({"name": "EE_M1", "io_type": "flush", "error_type": "nomem", "num": 4})),
        ],
    );
    let results = dir.join("inject.json");
    let mut p = Proc::spawn(
        &dir,
        "inject",
        &[
            "perf",
            "--json",
            &cfg,
            "-r",
            sock.to_str().unwrap(),
            "--reactor-mode",
            "interrupt",
            "-T",
            "EE_M1",
            "-w",
            "randrw",
            "-M",
            "50",
            "-q",
            "8",
            "-o",
            "4096",
            "-t",
            "2",
            "--results-json",
            results.to_str().unwrap(),
        ],
    );
    common::wait_for_socket(&mut p, &sock, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(800));
    let mut c = RpcClient::connect(&sock, common::RPC_TIMEOUT).unwrap();
    let st = common::call(&mut c, "bdev_get_iostat", Some(json!({"name": "EE_M1"})));
    let errors = &st["bdevs"][0]["io_error"];
    assert_eq!(errors["failed"], 5, "{st}");
    assert_eq!(errors["nvme_error"], 3, "{st}");
    drop(c);
    let status = p.expect_exit(Duration::from_secs(20), "perf with injected errors");
    assert_eq!(status.code(), Some(1), "failed I/O makes perf fail; stderr:\n{}", p.stderr());
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(doc["results"][0]["io_failed"], 8, "exactly the injected failures: {doc}");
}

#[test]
fn delay_shows_in_perfs_latency() {
    let dir = TempDir::new("vbdelay");
    let cfg = config(
        &dir,
        "delay.json",
        vec![
            m("bdev_null_create", json!({"name": "N0", "num_blocks": 65536, "block_size": 512})),
            m(
                "bdev_delay_create",
                json!({"base_bdev_name": "N0", "name": "ND0", "avg_read_latency": 2000,
                "p99_read_latency": 2000, "avg_write_latency": 3000, "p99_write_latency": 3000}),
            ),
        ],
    );
    let (code, out, doc) =
        perf(&dir, "delay", &cfg, &["-T", "ND0", "-w", "randread", "-q", "4", "-o", "4096", "-t", "1"]);
    assert_eq!(code, Some(0), "{out}");
    let r = &doc["results"][0];
    let (min, avg) = (r["min_latency_us"].as_f64().unwrap(), r["avg_latency_us"].as_f64().unwrap());
    assert!(min >= 2000.0, "min latency {min} us < the configured 2000 us: {doc}");
    assert!(avg < 4000.0, "average {avg} us far above the configured 2000 us: {doc}");
    let iops = r["iops"].as_f64().unwrap();
    assert!(iops < 4.0 / 0.002 * 1.05, "QD 4 at 2 ms cannot exceed 2000 IOPS: {iops}");
}

#[test]
fn save_config_of_a_stack_restarts_and_bad_params_get_errors() {
    let dir = TempDir::new("vbrpc");
    let d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "B0", "num_blocks": 2048, "block_size": 512})));
    assert_eq!(d.call("bdev_error_create", Some(json!({"base_name": "B0"}))), json!(true));
    let r = d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "EE_B0", "name": "BD0", "avg_read_latency": 5, "p99_read_latency": 9,
            "avg_write_latency": 6, "p99_write_latency": 10})),
    );
    assert_eq!(r, json!("BD0"));
    let r = d.call(
        "bdev_passthru_create",
        Some(json!({"base_bdev_name": "BD0", "name": "BP0",
        "uuid": "6d1c1a2e-8c4b-4b59-9d7e-0e6a3c2f1b11"})),
    );
    assert_eq!(r, json!("BP0"));
    assert_eq!(
        d.call(
            "bdev_delay_update_latency",
            Some(json!({"delay_bdev_name": "BD0",
        "latency_type": "p99_write", "latency_us": 40}))
        ),
        json!(true)
    );
    let bdevs = d.bdevs();
    let claimed = |n: &str| common::find_bdev(&bdevs, n).unwrap()["claimed"].clone();
    assert_eq!(
        (claimed("B0"), claimed("EE_B0"), claimed("BD0"), claimed("BP0")),
        (json!(true), json!(true), json!(true), json!(false))
    );
    let bp = common::find_bdev(&bdevs, "BP0").unwrap();
    assert_eq!(bp["product_name"], "passthru");
    assert_eq!(bp["driver_specific"]["passthru"]["base_bdev_name"], "BD0");
    assert_eq!(common::find_bdev(&bdevs, "BD0").unwrap()["driver_specific"]["delay"]["p99_write_latency"], 40);

    // Bad parameters: JSON-RPC errors, never a crash.
    let bad: Vec<(&str, Value, i32)> = vec![
        ("bdev_passthru_create", json!({"base_bdev_name": "B0"}), -32602),
        ("bdev_passthru_create", json!({"base_bdev_name": "B0", "name": "X", "bogus": 1}), -32602),
        ("bdev_passthru_create", json!({"base_bdev_name": "B0", "name": "X"}), -libc::EPERM),
        ("bdev_passthru_create", json!({"base_bdev_name": "BP0", "name": "BP0"}), -libc::EEXIST),
        ("bdev_passthru_create", json!({"base_bdev_name": "BP0", "name": "X", "uuid": "zz"}), -libc::EINVAL),
        ("bdev_passthru_delete", json!({"name": "B0"}), -libc::ENODEV),
        (
            "bdev_delay_create",
            json!({"base_bdev_name": "BP0", "name": "X", "avg_read_latency": 10,
            "p99_read_latency": 5, "avg_write_latency": 1, "p99_write_latency": 1}),
            -libc::EINVAL,
        ),
        (
            "bdev_delay_create",
            json!({"base_bdev_name": "BP0", "name": "X", "avg_read_latency": -1,
            "p99_read_latency": 5, "avg_write_latency": 1, "p99_write_latency": 1}),
            -32602,
        ),
        (
            "bdev_delay_update_latency",
            json!({"delay_bdev_name": "BD0", "latency_type": "p50", "latency_us": 1}),
            -32602,
        ),
        (
            "bdev_delay_update_latency",
            json!({"delay_bdev_name": "BP0", "latency_type": "avg_read", "latency_us": 1}),
            -libc::ENODEV,
        ),
        ("bdev_delay_delete", json!({"name": "nope"}), -libc::ENODEV),
        ("bdev_error_inject_error", json!({"name": "EE_B0", "io_type": "bogus", "error_type": "failure"}), -32602),
        ("bdev_error_inject_error", json!({"name": "EE_B0", "io_type": "read", "error_type": "explode"}), -32602),
        (
            "bdev_error_inject_error",
            json!({"name": "EE_B0", "io_type": "read", "error_type": "corrupt_data"}),
            -libc::EINVAL,
        ),
        (
            "bdev_error_inject_error",
            json!({"name": "EE_B0", "io_type": "read", "error_type": "corrupt_data",
            "corrupt_value": 256}),
            -32602,
        ),
        (
            "bdev_error_inject_error",
            json!({"name": "EE_B0", "io_type": "read", "error_type": "nvme_failure"}),
            -libc::EINVAL,
        ),
        ("bdev_error_inject_error", json!({"name": "BD0", "io_type": "read", "error_type": "failure"}), -libc::ENODEV),
        ("bdev_error_resume_pending", json!({"name": "BD0"}), -libc::ENODEV),
        ("bdev_error_delete", json!({}), -32602),
    ];
    for (method, params, code) in bad {
        let e = d.call_err(method, Some(params.clone()));
        assert_eq!(e.code, code, "{method} {params}: {e:?}");
    }
    d.assert_serving();

    // save_config lists each create after its base's, and the saved config restarts.
    let saved = d.call("save_config", None);
    let bdev = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "bdev").unwrap();
    let methods: Vec<&str> = bdev["config"].as_array().unwrap().iter().map(|e| e["method"].as_str().unwrap()).collect();
    assert_eq!(
        methods,
        [
            "bdev_malloc_create",
            "bdev_error_create",
            "bdev_delay_create",
            "bdev_passthru_create",
            "bdev_wait_for_examine"
        ]
    );
    let cfg = dir.write_json("saved.json", &saved);
    let d2 = Daemon::start_with(&dir, "second.sock", "0x1", &["--json", cfg.to_str().unwrap()]);
    assert_eq!(d2.call("save_config", None), saved, "the restarted daemon has the same stack");
    // Deleting the bottom tears the stack down; the delete answers once it is gone.
    assert_eq!(d2.call("bdev_malloc_delete", Some(json!({"name": "B0"}))), json!(true));
    assert!(d2.bdev_names().is_empty(), "{:?}", d2.bdev_names());
    // Deleting from the top works too.
    assert_eq!(d.call("bdev_passthru_delete", Some(json!({"name": "BP0"}))), json!(true));
    assert_eq!(d.call("bdev_delay_delete", Some(json!({"name": "BD0"}))), json!(true));
    assert_eq!(d.call("bdev_error_delete", Some(json!({"name": "EE_B0"}))), json!(true));
    assert_eq!(d.bdev_names(), ["B0"]);
    assert!(!common::find_bdev(&d.bdevs(), "B0").unwrap()["claimed"].as_bool().unwrap());
}

/// As SPDK's: a virtual bdev created over a base that does not exist yet is remembered and
/// appears when the base registers; it comes back when its base is hot-removed and made again;
/// its delete method forgets it (also while it waits).
#[test]
fn vbdevs_over_a_missing_base_appear_when_it_does() {
    let dir = TempDir::new("vbdefer");
    let d = Daemon::start(&dir, &[]);
    let names = |d: &Daemon| d.bdev_names();
    assert_eq!(d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "Later", "name": "P"}))), json!("P"));
    let lat = json!({"base_bdev_name": "P", "name": "D", "avg_read_latency": 1, "p99_read_latency": 2,
        "avg_write_latency": 1, "p99_write_latency": 2});
    assert_eq!(d.call("bdev_delay_create", Some(lat.clone())), json!("D"));
    assert_eq!(d.call("bdev_error_create", Some(json!({"base_name": "D"}))), json!(true));
    let e = d.call_err("bdev_passthru_create", Some(json!({"base_bdev_name": "Other", "name": "P"})));
    assert_eq!(e.code, -libc::EEXIST, "a waiting name is taken: {e:?}");
    assert!(names(&d).is_empty(), "nothing appears before the base: {:?}", names(&d));

    // The base arrives: the whole stack appears, each claiming the one below.
    d.call("bdev_malloc_create", Some(json!({"name": "Later", "num_blocks": 2048, "block_size": 512})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(names(&d), ["Later", "P", "D", "EE_D"]);
    let bdevs = d.bdevs();
    for n in ["Later", "P", "D"] {
        assert_eq!(common::find_bdev(&bdevs, n).unwrap()["claimed"], json!(true), "{n} is claimed");
    }

    // Hot removal of the base takes the stack away; the base made again brings it back.
    d.call("bdev_malloc_delete", Some(json!({"name": "Later"})));
    assert!(names(&d).is_empty(), "the stack went with its base: {:?}", names(&d));
    d.call("bdev_malloc_create", Some(json!({"name": "Later", "num_blocks": 2048, "block_size": 512})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(names(&d), ["Later", "P", "D", "EE_D"]);

    // Deleting forgets: top down, then the base again; nothing comes back.
    assert_eq!(d.call("bdev_error_delete", Some(json!({"name": "EE_D"}))), json!(true));
    assert_eq!(d.call("bdev_delay_delete", Some(json!({"name": "D"}))), json!(true));
    assert_eq!(d.call("bdev_passthru_delete", Some(json!({"name": "P"}))), json!(true));
    d.call("bdev_malloc_delete", Some(json!({"name": "Later"})));
    d.call("bdev_malloc_create", Some(json!({"name": "Later", "num_blocks": 2048, "block_size": 512})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(names(&d), ["Later"]);

    // A waiting one can be deleted too; a name nobody configured still gets -ENODEV.
    assert_eq!(d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "Nope", "name": "W"}))), json!("W"));
    assert_eq!(d.call("bdev_passthru_delete", Some(json!({"name": "W"}))), json!(true));
    let e = d.call_err("bdev_passthru_delete", Some(json!({"name": "W"})));
    assert_eq!(e.code, -libc::ENODEV, "{e:?}");
    d.assert_serving();
}

/// Waiting virtual bdevs obey the stack depth limit of registered ones (a chain of 1,000 once
/// overflowed reactor 0's stack when its base arrived), and a cycle of waiting ones is refused.
#[test]
fn waiting_chains_are_bounded_and_cycles_refused() {
    let dir = TempDir::new("vbchain");
    let d = Daemon::start(&dir, &[]);
    let mut made = 0;
    for i in 1..=40 {
        let p = json!({"base_bdev_name": format!("C{}", i - 1), "name": format!("C{i}")});
        match d.client().call("bdev_passthru_create", Some(p)) {
            Ok(_) => made += 1,
            Err(ferrite_rpc::client::CallError::Rpc(e)) => {
                assert_eq!(e.code, -libc::EINVAL, "{e:?}");
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(made, 32, "32 levels wait; the 33rd is refused");
    d.call("bdev_malloc_create", Some(json!({"name": "C0", "num_blocks": 256, "block_size": 512})));
    assert_eq!(d.call("bdev_wait_for_examine", None), json!(true));
    assert_eq!(d.bdev_names().len(), 33, "the base and 32 levels over it");
    assert!(d.bdev_names().contains(&"C32".to_string()));

    assert_eq!(d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "Y", "name": "X"}))), json!("X"));
    let e = d.call_err("bdev_passthru_create", Some(json!({"base_bdev_name": "X", "name": "Y"})));
    assert_eq!(e.code, -libc::EINVAL, "a cycle of waiting bdevs: {e:?}");
    d.assert_serving();
}

/// Found by trying to break it: with I/O that never completes (held by a pending injection),
/// `ferrite perf` ran past -t for ever and ignored SIGTERM. It then gave up 10 s after stopping
/// the jobs, with an error naming the stuck I/O; now each job aborts what is still outstanding
/// 2 s after the run's end (the error module gives up its pending I/O), and the run reports
/// it as failed. (I/O that no abort reaches: nvmf_host_hostile.rs, `perf_gives_up_...`.)
#[test]
fn perf_gives_up_on_io_that_never_completes() {
    let dir = TempDir::new("vbstuck");
    let cfg = config(
        &dir,
        "stuck.json",
        vec![
            m("bdev_malloc_create", json!({"name": "M", "num_blocks": 1024, "block_size": 512})),
            m("bdev_error_create", json!({"base_name": "M"})),
            m(
                "bdev_error_inject_error",
                json!({"name": "EE_M", "io_type": "all", "error_type": "pending", "num": 100000}),
            ),
        ],
    );
    let t0 = std::time::Instant::now();
    let (code, out, _) =
        perf(&dir, "stuck", &cfg, &["-T", "EE_M", "-w", "randread", "-q", "4", "-o", "4096", "-t", "1"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("aborting them"), "{out}");
    assert!(!out.contains("did not stop"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(8), "took {:?}", t0.elapsed());
}
