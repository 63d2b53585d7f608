//! A panic on a reactor ends the daemon at once (SIGABRT, with the panic's message and location
//! on stderr) instead of leaving it wedged with RPC clients waiting forever. The panic comes from
//! the test-only method enabled by FERRITE_TEST_PANIC_ON.

mod common;

use common::{wait_for_socket, Proc, TempDir, FERRITE, START_TIMEOUT};
use ferrite_rpc::client::RpcClient;
use serde_json::json;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const METHOD: &str = "ferrite_test_panic";

fn spawn_daemon(dir: &TempDir, cpumask: &str) -> (Proc, std::path::PathBuf) {
    let sock = dir.join("rpc.sock");
    let (out, err) = (dir.join("serve.stdout"), dir.join("serve.stderr"));
    let child = Command::new(FERRITE)
        .args(["serve", "-m", cpumask, "-r", sock.to_str().unwrap(), "--reactor-mode", "adaptive"])
        .env_remove("FERRITE_LOG")
        .env("FERRITE_TEST_PANIC_ON", METHOD)
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .expect("spawn ferrite");
    let mut p = Proc { child, stdout_path: out, stderr_path: err, started: Instant::now() };
    wait_for_socket(&mut p, &sock, START_TIMEOUT);
    (p, sock)
}

fn panic_ends_the_daemon(cpumask: &str, reactor: u64) {
    let dir = TempDir::new("rpanic");
    let (mut p, sock) = spawn_daemon(&dir, cpumask);
    // Working normally first.
    let mut c = RpcClient::connect(&sock, Duration::from_secs(30)).unwrap();
    c.call("bdev_null_create", Some(json!({"name": "N0", "num_blocks": 1024, "block_size": 512}))).unwrap();

    let t0 = Instant::now();
    let res = c.call(METHOD, Some(json!({"reactor": reactor})));
    let answered = t0.elapsed();
    assert!(res.is_err(), "the panicking method answered: {res:?}");
    assert!(answered < Duration::from_secs(5), "the client waited {answered:?} for a dead reactor");

    let status = p.expect_exit(Duration::from_secs(5), "daemon after a reactor panic");
    let err = p.stderr();
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}; stderr:\n{err}");
    let line = err
        .lines()
        .find(|l| l.contains(&format!("reactor {reactor} panicked at")))
        .unwrap_or_else(|| panic!("no panic report on stderr:\n{err}"));
    assert!(line.contains("crates/ferrite/src/serve.rs:"), "no location: {line}");
    assert!(line.contains(&format!("requested panic on reactor {reactor}; aborting")), "{line}");
}

#[test]
fn a_panic_on_the_rpc_reactor_ends_the_daemon() {
    panic_ends_the_daemon("0x1", 0);
}

#[test]
fn a_panic_on_another_reactor_ends_the_daemon() {
    if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) < 2 {
        return;
    }
    panic_ends_the_daemon("0x3", 1);
}

#[test]
fn without_the_variable_the_method_does_not_exist() {
    let dir = TempDir::new("rpanic-off");
    let mut d = common::Daemon::start(&dir, &[]);
    let e = d.call_err(METHOD, None);
    assert_eq!(e.code, -32601, "{e:?}");
    d.proc.sigterm();
    assert!(d.proc.expect_exit(Duration::from_secs(10), "daemon").success());
}
