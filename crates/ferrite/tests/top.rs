//! `ferrite top` against a loaded daemon, read off a tmux pane: the reactors tab lists a row
//! per reactor, the bdevs tab the bdev under I/O with a non-zero IOPS and, once `h` enabled the
//! bdevs' histograms, its p99 latency (which `h` and quitting turn off again), the targets tab
//! the NBD connections, and `q` ends it.

mod common;
mod nbd_common;

use common::{TempDir, FERRITE};
use nbd_common::{have, NbdDaemon};
use serde_json::json;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `tmux -L <server> args...`; its stdout.
fn tmux(server: &str, args: &[&str]) -> String {
    let out = Command::new("tmux").args(["-L", server]).args(args).stderr(Stdio::inherit()).output().expect("run tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Captures the pane until `pred` holds on it (panics with the last screen after 15 s).
fn wait_screen(server: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let screen = tmux(server, &["capture-pane", "-p", "-t", "top"]);
        if pred(&screen) {
            return screen;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{what}; the screen:\n{screen}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cells of the first screen line that holds `name` (the table's borders left out).
fn row<'a>(screen: &'a str, name: &str) -> Vec<&'a str> {
    let line = screen.lines().find(|l| l.contains(name)).unwrap_or("");
    line.split(|c: char| c.is_whitespace() || c == '│').filter(|s| !s.is_empty()).collect()
}

#[test]
fn top_shows_reactors_bdevs_and_targets_of_a_loaded_daemon() {
    if !have("top_shows_reactors_bdevs_and_targets_of_a_loaded_daemon", &["tmux", "nbdcopy"]) {
        return;
    }
    let dir = TempDir::new("top");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("Malloc7", 16384, 4096);
    n.export("Malloc7", "exp", false, "");
    // Load: nbdcopy reads the whole export to null, again and again, until the test ends.
    let stop = Arc::new(AtomicBool::new(false));
    let loader = {
        let (stop, uri) = (stop.clone(), n.uri("exp"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ =
                    Command::new("nbdcopy").args([&uri, "null:"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
            }
        })
    };
    let server = format!("ferrite-top-{}", std::process::id());
    let cmd = format!("{FERRITE} top -s {}", n.d.sock.display());
    tmux(&server, &["new-session", "-d", "-s", "top", "-x", "160", "-y", "40", &cmd]);
    let result = std::panic::catch_unwind(|| {
        let screen = wait_screen(&server, "a row per reactor", |s| s.contains("reactor_0") && s.contains("reactor_1"));
        assert!(screen.contains("Busy %") && screen.contains("Loops/s"), "{screen}");
        let r0 = row(&screen, "reactor_0");
        assert!(r0.len() >= 5 && ["polling", "sleeping"].contains(&r0[4]), "{r0:?} in\n{screen}");
        tmux(&server, &["send-keys", "-t", "top", "2"]);
        let screen = wait_screen(&server, "Malloc7 with I/O flowing", |s| {
            row(s, "Malloc7").get(1).and_then(|v| v.parse::<f64>().ok()).is_some_and(|iops| iops > 0.0)
        });
        assert!(screen.contains("IOPS") && screen.contains("MiB/s") && screen.contains("Queue depth"), "{screen}");
        let cells = row(&screen, "Malloc7");
        // No histogram enabled yet: no p99.
        assert!(cells.len() == 6 && cells[4] == "-" && cells[5].parse::<u64>().is_ok(), "{cells:?} in\n{screen}");
        // `h` enables the histograms; the next refresh shows the p99 of its interval.
        tmux(&server, &["send-keys", "-t", "top", "h"]);
        let screen = wait_screen(&server, "a p99 for Malloc7", |s| {
            row(s, "Malloc7").get(4).and_then(|v| v.parse::<f64>().ok()).is_some_and(|p99| p99 > 0.0)
        });
        assert!(screen.contains("p99 lat (us)") && screen.contains("histograms enabled by top on"), "{screen}");
        let h = n.d.call("bdev_get_histogram", Some(json!({"name": "Malloc7"})));
        assert!(h["histogram"].as_str().is_some_and(|b| !b.is_empty()), "{h}");
        // `h` again turns off what top turned on.
        tmux(&server, &["send-keys", "-t", "top", "h"]);
        wait_screen(&server, "no p99 once the histogram is off", |s| row(s, "Malloc7").get(4) == Some(&"-"));
        n.d.call_err("bdev_get_histogram", Some(json!({"name": "Malloc7"})));
        tmux(&server, &["send-keys", "-t", "top", "h"]);
        wait_screen(&server, "a p99 again", |s| row(s, "Malloc7").get(4).is_some_and(|v| v.parse::<f64>().is_ok()));
        // `s` moves the sort mark to the next column.
        tmux(&server, &["send-keys", "-t", "top", "s"]);
        wait_screen(&server, "sorted by IOPS", |s| s.contains("IOPS *"));
        tmux(&server, &["send-keys", "-t", "top", "3"]);
        wait_screen(&server, "an NBD connection row", |s| {
            s.contains("Connections") && row(s, "nbd").first() == Some(&"nbd") && s.contains("reactor_")
        });
        tmux(&server, &["send-keys", "-t", "top", "q"]);
        let t0 = Instant::now();
        while !tmux(&server, &["list-sessions"]).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(5), "ferrite top did not quit on q");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Quitting disabled the histogram top had enabled.
        n.d.call_err("bdev_get_histogram", Some(json!({"name": "Malloc7"})));
    });
    let _ = Command::new("tmux").args(["-L", &server, "kill-server"]).stderr(Stdio::null()).status();
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// A daemon that goes away while top watches it: the status line says so, and quitting then
/// exits 1 (a script that runs top learns that it lost the daemon).
#[test]
fn top_exits_nonzero_after_losing_its_daemon() {
    if !have("top_exits_nonzero_after_losing_its_daemon", &["tmux"]) {
        return;
    }
    let dir = TempDir::new("top-lost");
    let mut d = common::Daemon::start_with(&dir, "rpc.sock", "0x1", &["--no-pin"]);
    let rc_file = dir.join("rc");
    let server = format!("ferrite-top-lost-{}", std::process::id());
    let cmd = format!("{FERRITE} top -d 0.2 -s {}; echo $? > {}", d.sock.display(), rc_file.display());
    tmux(&server, &["new-session", "-d", "-s", "top", "-x", "160", "-y", "40", &cmd]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_screen(&server, "a row for reactor_0", |s| s.contains("reactor_0"));
        d.proc.sigterm();
        d.proc.expect_exit(Duration::from_secs(10), "the daemon after SIGTERM");
        wait_screen(&server, "the lost daemon on the status line", |s| s.contains(&format!("{}:", d.sock.display())));
        tmux(&server, &["send-keys", "-t", "top", "q"]);
        let t0 = Instant::now();
        while !rc_file.exists() {
            assert!(t0.elapsed() < Duration::from_secs(5), "ferrite top did not quit on q");
            std::thread::sleep(Duration::from_millis(100));
        }
        let rc = std::fs::read_to_string(&rc_file).unwrap();
        assert_eq!(rc.trim(), "1", "exit code of top after losing its daemon");
    }));
    let _ = Command::new("tmux").args(["-L", &server, "kill-server"]).stderr(Stdio::null()).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
