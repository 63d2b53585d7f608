//! Stopping `ferrite serve` and `ferrite perf` with signals while they are busy.

mod common;

use common::{Daemon, Proc, TempDir};
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A thread calling bdev_get_iostat in a loop (on one connection, or a new connection per call)
/// until a call fails or `stop` is set. Returns the number of successful calls.
fn hammer(sock: PathBuf, reconnect: bool, ok: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let connect = || RpcClient::connect(&sock, Duration::from_secs(10));
        let mut client = match connect() {
            Ok(c) => c,
            Err(_) => return 0,
        };
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            if reconnect {
                client = match connect() {
                    Ok(c) => c,
                    Err(_) => break,
                };
            }
            match client.call("bdev_get_iostat", None) {
                Ok(v) => {
                    assert!(v["bdevs"].is_array(), "{v}");
                    n += 1;
                    ok.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) => break,
            }
        }
        n
    })
}

#[test]
fn sigterm_while_clients_hammer_the_daemon() {
    let dir = TempDir::new("hammer");
    let mut d = Daemon::start(&dir, &[]);
    d.call("bdev_malloc_create", Some(json!({"name": "H0", "num_blocks": 1024, "block_size": 512})));
    d.call("bdev_null_create", Some(json!({"name": "H1", "num_blocks": 1024, "block_size": 512})));

    let ok = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> =
        [false, false, true].iter().map(|&re| hammer(d.sock.clone(), re, ok.clone(), stop.clone())).collect();

    // Let them get going.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ok.load(Ordering::SeqCst) < 100 {
        assert!(Instant::now() < deadline, "only {} calls served in 5 s", ok.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(10));
    }

    d.proc.sigterm();
    let t = Instant::now();
    let st = d.proc.wait_timeout(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    let counts: Vec<u64> = threads.into_iter().map(|t| t.join().expect("hammer thread panicked")).collect();
    let st = st.unwrap_or_else(|| panic!("daemon still running 5 s after SIGTERM; stderr:\n{}", d.proc.stderr()));
    assert_eq!(st.code(), Some(0), "exit {st:?} after {:?}; stderr:\n{}", t.elapsed(), d.proc.stderr());
    assert!(counts.iter().all(|&n| n > 0), "some hammer never got an answer: {counts:?}");
    assert!(!d.sock.exists(), "socket left behind");
    let err = d.proc.stderr();
    assert!(err.contains("SIGTERM"), "{err}");
}

#[test]
fn sigint_and_sigquit_stop_the_daemon_cleanly() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGQUIT, "SIGQUIT")] {
        let dir = TempDir::new("sigint");
        let mut d = Daemon::start(&dir, &[]);
        d.call("bdev_malloc_create", Some(json!({"num_blocks": 64, "block_size": 512})));
        // An idle open connection does not hold the daemon up.
        let _idle = d.client();
        d.proc.signal(sig);
        let st = d.proc.expect_exit(Duration::from_secs(5), name);
        assert_eq!(st.code(), Some(0), "{name}: {st:?}; stderr:\n{}", d.proc.stderr());
        assert!(!d.sock.exists(), "{name}: socket left behind");
    }
}

#[test]
fn sigterm_stops_perf_early_with_results() {
    let dir = TempDir::new("perfterm");
    let cfg = dir.write_json(
        "m.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Busy0", "num_blocks": 32768, "block_size": 512}}]}]}),
    );
    let results = dir.join("results.json");
    let sock = dir.join("perf.sock");
    let mut p = Proc::spawn(
        &dir,
        "perf-term",
        &[
            "perf",
            "--json",
            cfg.to_str().unwrap(),
            "-r",
            sock.to_str().unwrap(),
            "-w",
            "randrw",
            "-q",
            "32",
            "-o",
            "4096",
            "-t",
            "30",
            "--results-json",
            results.to_str().unwrap(),
        ],
    );
    // Wait until the run is under way (progress lines are for terminals only), and a second
    // of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.stdout().contains("Running I/O for") {
        assert!(p.child.try_wait().unwrap().is_none(), "perf exited early; stderr:\n{}", p.stderr());
        assert!(Instant::now() < deadline, "the run did not start in 10 s; stdout:\n{}", p.stdout());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1200));
    p.sigterm();
    let t = Instant::now();
    let st = p.expect_exit(Duration::from_secs(5), "perf after SIGTERM");
    let stdout = p.stdout();
    let stderr = p.stderr();
    assert_eq!(st.code(), Some(0), "exit {st:?} after {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", t.elapsed());
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(stdout.contains("Job: Busy0 "), "{stdout}");
    assert!(stdout.contains("randrw, depth: 32, IO size: 4096"), "{stdout}");
    assert!(stdout.lines().any(|l| l.trim_start().starts_with("Total") && l.contains(':')), "{stdout}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let r = &doc["results"][0];
    let runtime = r["runtime"].as_f64().unwrap();
    assert!(runtime > 0.5 && runtime < 10.0, "runtime {runtime} of a run stopped after ~1 s: {doc}");
    assert!(r["iops"].as_f64().unwrap() > 0.0, "{doc}");
    assert_eq!(r["io_failed"], 0, "{doc}");
    assert!(!sock.exists(), "perf left its socket behind");
}
