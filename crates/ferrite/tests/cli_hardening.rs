//! Command-line abuse: absurd perf arguments, a closed stdout, SIGHUP.

mod common;

use common::{run_ferrite, text, Daemon, TempDir};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn null_config(dir: &TempDir) -> String {
    let cfg = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 262144, "block_size": 512}}]}]});
    dir.write_json("null.json", &cfg).to_str().unwrap().to_string()
}

/// Runs `ferrite perf` with `args` (after the config); returns (exit code, stderr, seconds).
fn perf(cfg: &str, args: &[&str]) -> (Option<i32>, String, f64) {
    let mut all = vec!["perf", "--json", cfg, "--reactor-mode", "interrupt", "--no-pin"];
    all.extend_from_slice(args);
    let t0 = Instant::now();
    let out = run_ferrite(&all);
    (out.status.code(), text(&out.stderr), t0.elapsed().as_secs_f64())
}

#[test]
fn perf_refuses_absurd_arguments_up_front() {
    let dir = TempDir::new("perfargs");
    let cfg = null_config(&dir);
    for (args, needle) in [
        (&["-q", "1", "-o", "4096", "-w", "read", "-t", "18446744073709551615"][..], "run time"),
        (&["-q", "1", "-o", "4096", "-w", "read", "-t", "1e300"][..], "run time"),
        (&["-q", "1", "-o", "4096", "-w", "read", "-t", "nan"][..], "run time"),
        (&["-q", "4096", "-o", "2m", "-w", "read", "-t", "2"][..], "memory"),
        (&["-q", "1", "-o", "99999999999999999999k", "-w", "read", "-t", "1"][..], "size"),
        (&["-q", "1", "-o", "18014398509481984k", "-w", "read", "-t", "1"][..], "size"),
        (&["-q", "1", "-o", "0", "-w", "read", "-t", "1"][..], "size"),
        (&["-q", "1", "-o", "4096", "-w", "read", "-t", "1", "-S", "18446744073709551615"][..], "-S"),
    ] {
        let (code, err, secs) = perf(&cfg, args);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(code == Some(1) || code == Some(2), "{args:?}: exit {code:?}: {err}");
        assert!(
            err.to_lowercase().contains(&needle.to_lowercase()),
            "{args:?}: error does not mention {needle}: {err}"
        );
        assert!(secs < 3.0, "{args:?} took {secs:.1} s to refuse");
    }
}

#[test]
fn perf_ends_on_time() {
    let dir = TempDir::new("perftime");
    let cfg = null_config(&dir);
    let (code, err, secs) = perf(&cfg, &["-q", "256", "-o", "128k", "-w", "randread", "-t", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(secs < 4.0, "-t 1 took {secs:.1} s");
}

#[test]
fn rpc_output_into_a_closed_pipe_exits_quietly() {
    let dir = TempDir::new("pipe");
    let d = Daemon::start(&dir, &[]);
    for i in 0..20 {
        d.call("bdev_null_create", Some(json!({"name": format!("N{i}"), "num_blocks": 8, "block_size": 512})));
    }
    let mut child = Command::new(common::FERRITE)
        .args(["rpc", "-s", d.sock.to_str().unwrap(), "bdev_get_bdevs"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // like `| head -0`: the reader is gone before anything is written
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn perf_output_into_a_closed_pipe_is_dropped_quietly() {
    let dir = TempDir::new("perfpipe");
    let cfg = null_config(&dir);
    let mut child = Command::new(common::FERRITE)
        .args(["perf", "--json", &cfg, "--reactor-mode", "interrupt", "--no-pin"])
        .args(["-q", "4", "-o", "4096", "-w", "randread", "-t", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head -0`
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "the run finishes: {err}");
}

#[test]
fn sighup_stops_the_daemon_cleanly() {
    let dir = TempDir::new("sighup");
    let mut d = Daemon::start(&dir, &[]);
    d.proc.signal(libc::SIGHUP);
    let st = d.proc.expect_exit(Duration::from_secs(10), "daemon after SIGHUP");
    assert_eq!(st.code(), Some(0), "{st:?}; stderr:\n{}", d.proc.stderr());
    assert!(!d.sock.exists(), "socket left behind");
    assert!(d.proc.stderr().contains("SIGHUP"), "{}", d.proc.stderr());

    let mut d = Daemon::start_with(&dir, "b.sock", "0x1", &[]);
    assert_eq!(d.call("spdk_kill_instance", Some(json!({"sig_name": "SIGHUP"}))), json!(true));
    let st = d.proc.expect_exit(Duration::from_secs(10), "daemon after spdk_kill_instance SIGHUP");
    assert_eq!(st.code(), Some(0), "{st:?}; stderr:\n{}", d.proc.stderr());
    assert!(!d.sock.exists(), "socket left behind");
}
