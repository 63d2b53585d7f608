//! The NBD server under attack and at scale: idle connections that never finish the handshake,
//! a connection limit, a client that queues huge reads and vanishes, exports outliving their
//! server or bdev, port 0, and thousands of idle connections beside a verifying workload.

mod common;
mod nbd_common;

use common::TempDir;
use ferrite_nbd::proto::*;
use nbd_common::{have, pattern, qemu_io, request_bytes, FioRun, NbdDaemon, Raw};
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Raises this process's soft limit of open files to the hard limit (thousands of client
/// sockets) and returns the new soft limit.
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: i32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {s}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Connects `n` TCP clients that send nothing (they stay in the handshake).
fn idle_connects(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("idle connection {i}: {e}")))
        .collect()
}

/// Reads until EOF or reset; true if the server closed the connection within `timeout`.
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Polls `nbd_server_get_connections` until `pred` holds on the number of connections (panics
/// after 10 s with the count, not the whole list: there are thousands).
fn wait_count(n: &NbdDaemon, what: &str, pred: impl Fn(usize) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let k = n.connections().len();
        if pred(k) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {k} connections");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `data` at `offset` and reads it back through `c`, comparing.
/// Shrinks the client's receive buffer, so that replies it does not read back up quickly.
fn small_rcvbuf(s: &TcpStream) {
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt reads the int we own.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &small as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn write_read_back(c: &mut Raw, cookie: u64, offset: u64, data: &[u8]) {
    c.write_ok(cookie, offset, data, 0);
    assert_eq!(c.read_ok(cookie + 1, offset, data.len() as u32), data, "read back at {offset}");
}

#[test]
fn idle_handshakes_neither_stall_connected_clients_nor_stay_forever() {
    raise_nofile();
    let dir = TempDir::new("nbdidlehs");
    // One reactor: every connection shares its ring.
    let n = NbdDaemon::start_opts(&dir, "0x1", json!({"handshake_max_seconds": 3}));
    n.malloc("H0", 4096, 4096);
    n.export("H0", "h0", false, "");
    let (mut before, _) = Raw::open(n.port, "h0", false);
    let t0 = Instant::now();
    // More idle connections than the old handler table (1,024) held.
    let mut idle = idle_connects(n.port, 1100);
    wait_count(&n, "idle clients accepted", |k| k >= 1101);
    // A client connected before them and one connecting after them both work, with real data.
    write_read_back(&mut before, 1, 0, &pattern(1, 65536));
    let (mut after, _) = Raw::open(n.port, "h0", false);
    write_read_back(&mut after, 10, 1 << 20, &pattern(2, 65536));
    assert_eq!(before.read_ok(20, 1 << 20, 65536), pattern(2, 65536), "one client sees the other's write");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the check ran past the handshake timeout; too slow to mean anything"
    );

    // The handshake timeout closes every idle one (not the connected ones).
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(10)),
            "idle connection {i} still open after the handshake timeout"
        );
    }
    assert!(t0.elapsed() >= Duration::from_millis(2900), "idle connections closed before the timeout");
    wait_count(&n, "only the two clients left", |k| k == 2);
    write_read_back(&mut before, 30, 8192, &pattern(3, 4096));
    write_read_back(&mut after, 40, 16384, &pattern(4, 4096));
    before.disc();
    after.disc();
    let log = n.d.proc.stderr();
    assert!(
        log.contains("handshake not finished within 3s"),
        "no log line for the timeout:\n{}",
        &log[..log.len().min(4000)]
    );
}

#[test]
fn connection_limit_refuses_extra_clients_with_a_log_line() {
    let dir = TempDir::new("nbdlimit");
    let n = NbdDaemon::start_opts(&dir, "0x1", json!({"max_connections": 3}));
    n.malloc("L0", 1024, 4096);
    n.export("L0", "l0", false, "");
    let (mut a, _) = Raw::open(n.port, "l0", false);
    let b = Raw::connect(n.port);
    let c = Raw::connect(n.port);
    n.wait_connections("three clients", |c| c.len() == 3);
    // The fourth is accepted by the kernel, then closed by the server without a greeting.
    let mut d = Raw::connect_only(n.port);
    assert!(d.expect_closed(Duration::from_secs(5)).is_empty(), "a refused client got bytes");
    let log = n.d.proc.stderr();
    assert!(log.contains("connection limit (3) reached"), "no log line for the limit:\n{log}");
    write_read_back(&mut a, 1, 0, &pattern(5, 4096));
    // One leaves; a new client gets in.
    drop(b);
    n.wait_connections("one left", |c| c.len() == 2);
    let (mut e, _) = Raw::open(n.port, "l0", false);
    assert_eq!(e.read_ok(3, 0, 4096), pattern(5, 4096));
    assert!(n.d.proc.stderr().contains("accepting again; 1 connection(s) were refused"));
    drop(c);
    e.disc();
    a.disc();
}

#[test]
fn a_client_that_queues_huge_reads_and_vanishes_stays_within_the_payload_bound() {
    let dir = TempDir::new("nbdvanish");
    let img = dir.file_filled("v.img", 64 << 20, 0x5a);
    let n = NbdDaemon::start(&dir, "0x1");
    // A uring bdev: every read fills its own buffer (malloc would lend its memory instead).
    n.d.call("bdev_uring_create", Some(json!({"name": "V0", "filename": img.to_str().unwrap(), "block_size": 4096})));
    n.export("V0", "v0", true, "");
    let pid = n.d.proc.pid();
    // Warm up: one 32 MiB read, so the baseline includes what a single read costs.
    let (mut w, _) = Raw::open(n.port, "v0", false);
    assert!(w.read_ok(1, 0, 32 << 20).iter().all(|&b| b == 0x5a));
    w.disc();
    drop(w);
    n.wait_connections("warm-up client gone", |c| c.is_empty());
    let base = status_kib(pid, "VmHWM");

    for round in 0..3 {
        let (mut c, _) = Raw::open(n.port, "v0", false);
        let mut reqs = Vec::new();
        for i in 0..24u64 {
            reqs.extend_from_slice(&request_bytes(0, CMD_READ, i, (i % 2) * (32 << 20), 32 << 20, &[]));
        }
        c.send(&reqs);
        std::thread::sleep(Duration::from_millis(300));
        // Close without reading a byte, with a reset.
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt reads the linger struct we own.
        unsafe {
            libc::setsockopt(
                c.s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        drop(c);
        n.wait_connections(&format!("round {round}: the vanished client's connection closed"), |c| c.is_empty());
    }
    let peak = status_kib(pid, "VmHWM");
    let grown_mib = peak.saturating_sub(base) / 1024;
    // At most 64 MiB of payload per connection (two 32 MiB reads), plus slack.
    assert!(grown_mib < 160, "peak RSS grew by {grown_mib} MiB (from {} MiB) after clients vanished", base / 1024);
    n.assert_serves("v0");
}

/// Found by the attacker: clients that queued big reads on a non-lending bdev, read nothing and
/// left, stayed as connections for good (their readers were paused by back-pressure and never
/// saw them go) while their reads waited for memory, and every later read on that reactor hung.
#[test]
fn clients_that_leave_while_their_reads_wait_for_memory_are_cleaned_up() {
    let dir = TempDir::new("nbdstarve");
    let n = NbdDaemon::start(&dir, "0x1");
    n.d.call("bdev_null_create", Some(json!({"name": "Z0", "num_blocks": 262144, "block_size": 4096})));
    n.export("Z0", "z0", true, "");
    let clients: Vec<_> = (0..3)
        .map(|k| {
            let (mut c, _) = Raw::open(n.port, "z0", false);
            small_rcvbuf(&c.s);
            let mut reqs = Vec::new();
            for i in 0..3u64 {
                reqs.extend_from_slice(&request_bytes(0, CMD_READ, k * 10 + i, i * (32 << 20), 32 << 20, &[]));
            }
            c.send(&reqs);
            c
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    drop(clients);
    n.wait_connections("the clients that left are gone", |c| c.is_empty());
    let (mut c, _) = Raw::open(n.port, "z0", false);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(c.read_ok(1, 0, 4096).iter().all(|&b| b == 0), "a new client's read is served");
    c.disc();
}

/// Found by the attacker: export names with newlines were accepted (and went raw into logs and
/// export lists), and a claimed bdev could be exported writable though no client could open it.
#[test]
fn export_names_and_claimed_bdevs_are_checked_at_add() {
    let dir = TempDir::new("nbdaddchecks");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("B0", 64, 512);
    let e = n.d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "B0", "name": "a\nb"})));
    assert!(e.message.contains("control"), "{e:?}");
    n.d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "B0", "name": "P0"})));
    let e = n.d.call_err("nbd_server_add_export", Some(json!({"bdev_name": "B0"})));
    assert_eq!(e.code, -libc::EPERM, "{e:?}");
    n.d.call("nbd_server_add_export", Some(json!({"bdev_name": "B0", "read_only": true})));
    n.export("P0", "p0", false, "");
    n.assert_serves("p0");
    assert_eq!(n.exports().len(), 2);
}

fn nbd_config(n: &NbdDaemon) -> Vec<Value> {
    n.d.call("framework_get_config", Some(json!({"name": "nbd"}))).as_array().expect("nbd config").clone()
}

#[test]
fn stopping_the_last_server_removes_its_exports() {
    let dir = TempDir::new("nbdstopall");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("S0", 1024, 4096);
    n.export("S0", "s0", false, "");
    let (mut c, _) = Raw::open(n.port, "s0", false);
    write_read_back(&mut c, 1, 0, &pattern(7, 8192));
    // One of two servers stopped: the exports stay, and so does the client.
    assert_eq!(n.d.call("nbd_server_stop", Some(json!({"address": n.tcp}))), json!(true));
    assert_eq!(n.exports().len(), 1);
    write_read_back(&mut c, 3, 8192, &pattern(8, 8192));
    // The last one stopped: nothing is exported, or saved, and the client is let go.
    assert_eq!(n.d.call("nbd_server_stop", Some(json!({"address": n.unix.to_str().unwrap()}))), json!(true));
    assert!(n.exports().is_empty(), "{:?}", n.exports());
    assert_eq!(nbd_config(&n), Vec::<Value>::new());
    let saved = n.d.call("save_config", None);
    let nbd = saved["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "nbd").cloned();
    assert!(nbd.is_none_or(|s| s["config"].as_array().is_none_or(|a| a.is_empty())), "{saved}");
    assert!(c.expect_closed(Duration::from_secs(5)).is_empty());
    // A new server starts with no exports; the bdev kept its data.
    let v = n.d.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let port: u16 = v["address"].as_str().unwrap().rsplit_once(':').unwrap().1.parse().unwrap();
    let mut r = Raw::negotiating(port);
    assert_eq!(r.go("s0", &[]).expect_err("GO for a removed export").reply, REP_ERR_UNKNOWN);
    n.export("S0", "s0", false, "");
    assert_eq!(r.go("s0", &[]).expect("GO").size, 1024 * 4096);
    assert_eq!(r.read_ok(5, 8192, 8192), pattern(8, 8192));
    r.disc();
}

#[test]
fn an_export_goes_with_its_bdev_and_never_serves_a_new_bdev_of_that_name() {
    let dir = TempDir::new("nbdbdevgone");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("B0", 1024, 4096);
    n.malloc("K0", 1024, 4096);
    n.export("B0", "b0", false, "");
    n.export("K0", "k0", false, "");
    let (mut c, _) = Raw::open(n.port, "b0", false);
    write_read_back(&mut c, 1, 0, &pattern(9, 4096));
    assert_eq!(n.d.call("bdev_malloc_delete", Some(json!({"name": "B0"}))), json!(true));
    assert!(c.expect_closed(Duration::from_secs(5)).is_empty());
    let names: Vec<Value> = n.exports().iter().map(|e| e["name"].clone()).collect();
    assert_eq!(names, vec![json!("k0")], "the deleted bdev's export is still listed");
    let cfg = nbd_config(&n);
    assert!(cfg.iter().all(|e| e["params"]["bdev_name"] != "B0"), "{cfg:?}");
    // A new bdev under the old name: the old export does not come back to serve it.
    n.malloc("B0", 2048, 4096);
    let mut r = Raw::negotiating(n.port);
    assert_eq!(r.go("b0", &[]).expect_err("GO b0 after its bdev was replaced").reply, REP_ERR_UNKNOWN);
    assert!(n.exports().iter().all(|e| e["name"] != "b0"));
    // Exported again explicitly, it serves the new bdev (its size, its zeroes).
    n.export("B0", "b0", false, "");
    assert_eq!(r.go("b0", &[]).expect("GO").size, 2048 * 4096);
    assert_eq!(r.read_ok(2, 0, 4096), vec![0u8; 4096]);
    r.disc();
    n.assert_serves("k0");
}

#[test]
fn port_zero_reports_the_bound_port() {
    let dir = TempDir::new("nbdport0");
    let n = NbdDaemon::start(&dir, "0x1"); // itself started on 127.0.0.1:0
    n.malloc("P0", 256, 4096);
    n.export("P0", "p0", false, "");
    // A second server on port 0 gets another port; both serve; each stops by its address.
    let v = n.d.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = v["address"].as_str().unwrap().to_string();
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_ne!(port, 0);
    assert_ne!(port, n.port);
    let (mut a, _) = Raw::open(port, "p0", false);
    let (mut b, _) = Raw::open(n.port, "p0", false);
    write_read_back(&mut a, 1, 0, &pattern(11, 4096));
    assert_eq!(b.read_ok(3, 0, 4096), pattern(11, 4096));
    let cfg = nbd_config(&n);
    assert!(cfg.iter().any(|e| e["params"]["address"] == addr.as_str()), "saved with its real port: {cfg:?}");
    // Two servers were started as 127.0.0.1:0: that name is ambiguous for stop.
    assert_eq!(n.d.call_err("nbd_server_stop", Some(json!({"address": "127.0.0.1:0"}))).code, -2);
    assert_eq!(n.d.call("nbd_server_stop", Some(json!({"address": addr}))), json!(true));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    a.disc();
    b.disc();
}

#[test]
fn two_thousand_idle_connections_beside_a_verify_workload() {
    let limit = raise_nofile();
    if limit < 4500 {
        println!("SKIP two_thousand_idle_connections_beside_a_verify_workload: open file limit {limit}");
        return;
    }
    let dir = TempDir::new("nbd2k");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("I0", 16384, 4096);
    n.export("I0", "i0", false, "");
    // One connection first, so that the baseline has what any connection costs once (the
    // reactor's receive ring touched, the connection tables' first growth).
    let (mut first, _) = Raw::open(n.port, "i0", false);
    write_read_back(&mut first, 1, 0, &pattern(7, 4096));
    first.disc();
    drop(first);
    wait_count(&n, "the first client gone", |k| k == 0);
    std::thread::sleep(Duration::from_millis(200));
    let pid = n.d.proc.pid();
    let rss0 = status_kib(pid, "VmRSS");
    // 2,000 clients that finished the handshake and sit idle, each with a receive armed.
    let t = Instant::now();
    let mut idle: Vec<Raw> = (0..2000).map(|_| Raw::open(n.port, "i0", false).0).collect();
    println!("2,000 handshakes in {:?}", t.elapsed());
    wait_count(&n, "2,000 idle clients", |k| k == 2000);
    std::thread::sleep(Duration::from_millis(200));
    let rss1 = status_kib(pid, "VmRSS");
    let per_conn = rss1.saturating_sub(rss0) as f64 / 2000.0;
    println!("RSS {rss0} KiB -> {rss1} KiB with 2,000 idle connections: {per_conn:.1} KiB per connection");
    // An idle connection holds no receive buffer (it was ~146 KiB with its own 128 KiB one):
    // what is left is its tasks, tables and socket bookkeeping.
    assert!(per_conn < 16.0, "{per_conn:.1} KiB of RSS per idle connection");

    if have("two_thousand_idle_connections_beside_a_verify_workload (fio)", &["fio"]) {
        let uri = format!("--uri={}", n.uri("i0"));
        let v = FioRun::spawn(
            &dir,
            "verify2k",
            &[
                "--name=verify",
                "--ioengine=nbd",
                &uri,
                "--rw=randwrite",
                "--bs=4k",
                "--size=32m",
                "--iodepth=16",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_backlog=512",
                "--verify_fatal=1",
                "--time_based",
                "--runtime=4",
            ],
        )
        .finish(Duration::from_secs(60));
        let j = &v["jobs"][0];
        assert!(j["read"]["io_bytes"].as_u64().unwrap() > 0, "nothing verified: {j}");
        assert!(j["write"]["io_bytes"].as_u64().unwrap() > 0, "nothing written: {j}");
    } else if have("two_thousand_idle_connections_beside_a_verify_workload (qemu-io)", &["qemu-io"]) {
        let cmds: Vec<String> = (0..16)
            .flat_map(|i| {
                let off = i * (1 << 20);
                [format!("write -P {} {off} 1M", 0x10 + i), format!("read -P {} {off} 1M", 0x10 + i)]
            })
            .collect();
        qemu_io(&dir, &n.uri("i0"), &cmds);
    } else {
        // No client tools: a raw client does the same write-then-verify.
        let (mut c, _) = Raw::open(n.port, "i0", false);
        for i in 0..64u64 {
            write_read_back(&mut c, i * 2, i * 65536, &pattern(100 + i, 65536));
        }
        c.disc();
    }
    // The idle ones are still connected, and any of them still works.
    wait_count(&n, "the idle clients stayed", |k| k == 2000);
    for (k, i) in [0usize, 999, 1999].into_iter().enumerate() {
        let data = pattern(200 + i as u64, 4096);
        let off = (48 << 20) + (k as u64) * 4096;
        write_read_back(&mut idle[i], 1000 + 2 * k as u64, off, &data);
    }
    let mut out = Vec::new();
    for c in &mut idle {
        out.extend_from_slice(&request_bytes(0, CMD_DISC, 0, 0, 0, &[]));
        c.s.write_all(&out).unwrap();
        out.clear();
    }
    drop(idle);
    wait_count(&n, "all gone", |k| k == 0);
}

/// Found by the attacker: a 28-byte write header announcing 32 MiB made the daemon hold a 32 MiB
/// buffer, outside the heap budget and with no deadline, for as long as the client liked (20
/// such clients held 753 MiB). Payload buffers now come from the pool or the reactor's heap
/// budget (past it the connection waits), and a payload that does not arrive in time closes
/// its connection.
#[test]
fn write_headers_without_their_payload_hold_no_more_than_the_budget_and_time_out() {
    let dir = TempDir::new("nbdpin");
    let n = NbdDaemon::start(&dir, "0x1");
    n.d.call("bdev_malloc_create", Some(json!({"name": "W0", "num_blocks": 16384, "block_size": 4096})));
    n.export("W0", "w0", false, "");
    let pid = n.d.proc.pid();
    let base = status_kib(pid, "VmRSS");
    // 20 clients announce 32 MiB writes and send 5,000 bytes of each; 10 announce 1 MiB writes
    // (a deadline of 11 s) and send nothing.
    let mut big = Vec::new();
    for k in 0..20u64 {
        let (mut c, _) = Raw::open(n.port, "w0", false);
        let mut req = request_bytes(0, CMD_WRITE, k, 0, 32 << 20, &[]);
        req.extend_from_slice(&[0xab; 5000]);
        c.send(&req);
        big.push(c);
    }
    let mut small = Vec::new();
    for k in 0..10u64 {
        let (mut c, _) = Raw::open(n.port, "w0", false);
        c.send(&request_bytes(0, CMD_WRITE, k, 0, 1 << 20, &[]));
        small.push(c);
    }
    std::thread::sleep(Duration::from_secs(1));
    let grown_mib = status_kib(pid, "VmRSS").saturating_sub(base) / 1024;
    // The heap budget is 64 MiB by default (the pool's buffers are resident from the start).
    assert!(grown_mib < 96, "RSS grew by {grown_mib} MiB for 30 stalled write payloads");
    // Another client's writes still go through (small payloads come from the pool) and read back.
    let (mut c, _) = Raw::open(n.port, "w0", false);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write_read_back(&mut c, 7, 4096 * 100, &pattern(9, 65536));
    c.disc();
    // The 1 MiB payloads that never came: their connections are closed after 11 s.
    for (i, s) in small.iter_mut().enumerate() {
        assert!(closed_within(&mut s.s, Duration::from_secs(20)), "stalled 1 MiB write {i} was not timed out");
    }
    drop(big);
    n.assert_serves("w0");
}

/// Found by the attacker: a write larger than any buffer the reactor could ever give
/// (`--buf-heap-budget 4`, 16 MiB) waited for one forever, its connection spinning at 40% of a
/// core and listed after its client left; and writes of 128 KiB or less had no deadline, so
/// clients that announced them and stopped sending held the pool and the heap budget for good,
/// and everyone else's writes waited behind them.
#[test]
fn writes_waiting_for_memory_are_bounded_in_size_and_time() {
    let dir = TempDir::new("nbdhoard");
    let n = NbdDaemon::start_full(&dir, "0x1", json!({}), &["--no-pin", "--buf-heap-budget", "1"]);
    n.d.call("bdev_malloc_create", Some(json!({"name": "H0", "num_blocks": 16384, "block_size": 4096})));
    n.export("H0", "h0", false, "");
    let (mut huge, _) = Raw::open(n.port, "h0", false);
    huge.send(&request_bytes(0, CMD_WRITE, 1, 0, 16 << 20, &[]));
    assert!(closed_within(&mut huge.s, Duration::from_secs(5)), "a write no buffer can hold was left waiting");
    // More 128 KiB writes begun and abandoned than the large buffers (64) and the 1 MiB heap
    // budget hold: those that got a buffer time out after 10 s, then those that waited for one.
    let mut hoarders: Vec<Raw> = (0..80u64)
        .map(|k| {
            let (mut c, _) = Raw::open(n.port, "h0", false);
            let mut req = request_bytes(0, CMD_WRITE, k, 0, 128 << 10, &[]);
            req.extend_from_slice(&[0x5a; 100]);
            c.send(&req);
            c
        })
        .collect();
    let t0 = Instant::now();
    for (i, c) in hoarders.iter_mut().enumerate() {
        let left = Duration::from_secs(40).saturating_sub(t0.elapsed()).max(Duration::from_millis(1));
        assert!(closed_within(&mut c.s, left), "abandoned 128 KiB write {i} still open after {:?}", t0.elapsed());
    }
    eprintln!("80 abandoned writes closed within {:?}", t0.elapsed());
    let (mut c, _) = Raw::open(n.port, "h0", false);
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write_read_back(&mut c, 7, 4096 * 64, &pattern(5, 128 << 10));
    c.disc();
    n.wait_connections("no connection is left behind", |c| c.is_empty());
}

/// Found by the attacker: clients that never read their replies kept them (and the reactor's
/// memory) for as long as they stayed connected, and two such clients stalled everyone's reads
/// on the same reactor. A batch of replies must now be taken within 30 s plus 1 s per MiB.
#[test]
fn a_client_that_never_reads_its_replies_is_closed() {
    let dir = TempDir::new("nbdnoread");
    let n = NbdDaemon::start(&dir, "0x1");
    n.d.call("bdev_null_create", Some(json!({"name": "Q0", "num_blocks": 65536, "block_size": 4096})));
    n.export("Q0", "q0", true, "");
    let (mut c, _) = Raw::open(n.port, "q0", false);
    small_rcvbuf(&c.s);
    // 12 MiB of replies: more than the kernel's socket buffers take, so a send blocks.
    let mut reqs = Vec::new();
    for i in 0..3u64 {
        reqs.extend_from_slice(&request_bytes(0, CMD_READ, i, i * (4 << 20), 4 << 20, &[]));
    }
    c.send(&reqs);
    let t0 = Instant::now();
    // Never read a reply byte: after 30 s (plus 1 s per MiB) of a blocked send the daemon gives
    // up on the client.
    n.wait_connections_within("the non-reading client closed", Duration::from_secs(120), |c| c.is_empty());
    assert!(t0.elapsed() >= Duration::from_secs(25), "closed too early: {:?}", t0.elapsed());
    n.assert_serves("q0");
}
