//! The NVMe/TCP target at scale, on one reactor (`ferrite serve -m 0x1`), with a malloc bdev so
//! that data is checked:
//! - `a_thousand_io_queue_pairs_each_verified`: the hand-driven host of `nvmf_common` (our own
//!   test-side NVMe/TCP host; no real client writes a pattern per queue pair and reads it back)
//!   opens 10 controllers × 100 I/O queue pairs (1,010 connections with the admin queues) and,
//!   with a command outstanding on all 1,000 at once, writes a distinct pattern on every I/O
//!   queue pair (in the capsule and by R2T) and reads it back. `nvmf_subsystem_get_qpairs`
//!   lists them all; the target's RSS and descriptors are printed and bounded; once the host
//!   closes them the target is back to its idle descriptor count and a new host works.
//! - `spdk_nvme_perf_with_a_thousand_io_queue_pairs`: SPDK's `spdk_nvme_perf` (a real client)
//!   connects one controller with 1,000 I/O queue pairs (`-P 1000`) and runs random 4 KiB reads
//!   and writes with 1,000 commands in flight, which it spreads over the queue pairs in turn
//!   (perf does not check data; the test above does). Skipped without $SPDK_DIR.
//! - `attackers_are_timed_out_while_a_good_host_works`: 2,000 connections that never send
//!   ICReq, 200 that send ICReq and never Connect, 200 that send half a command capsule, 100
//!   that send half of Connect's data, and 5 connected queue pairs that queue 128 writes of
//!   128 KiB each and never send the data their R2Ts ask for (enough to take every large pool
//!   buffer and the heap budget). The target closes all of them (10 s without Connect, 10 s
//!   for a command's data) while a good host keeps working, its CPU stays low, and at the end
//!   its descriptors are back to idle.
//! - `out_of_descriptors_the_target_backs_off_and_recovers`: the daemon's descriptor limit is
//!   lowered to 256 (prlimit(2) on its PID) and 400 connections arrive: accept fails with
//!   EMFILE, the target says so in the log a few times (not once per retry), does not spin,
//!   and serves again once descriptors come back.
//! - `the_target_raises_its_descriptor_limit`: a daemon started with a soft limit of 512
//!   raises it to the hard limit when it starts listening (each connection is a descriptor).
//!
//! The tests of this file run one at a time (each measures one daemon's descriptors and CPU).

mod common;
mod nvmf_common;

use common::TempDir;
use ferrite_nvmf::spec::opcode::nvm;
use ferrite_nvmf::spec::sgl::SglDescriptor;
use ferrite_nvmf::tcp::{CapsuleCmd, Pdu};
use nvmf_common::*;
use serde_json::json;
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Block size of the malloc namespace.
const BS: u32 = 4096;
/// Blocks of the malloc namespace (64 MiB).
const BLOCKS: u64 = 16384;

/// One test of this file at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open descriptors of process `pid`.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// What process `pid`'s descriptors point at (sockets, files, anonymous inodes).
fn fd_targets(pid: i32) -> Vec<String> {
    let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    d.flatten().map(|e| std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default()).collect()
}

/// CPU time (user + system) of process `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    num(11) + num(12) // utime, stime (fields 14 and 15)
}

/// Clock ticks per second.
fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as u64
}

/// Polls `f` every 50 ms until it is true or `within` passed; returns whether it became true.
fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A one-reactor daemon with malloc bdev M0 as namespace 1 of [`SUBNQN`] (any host), listening.
fn setup(tag: &str, transport: serde_json::Value) -> (TempDir, NvmfDaemon) {
    let dir = TempDir::new(tag);
    let mut n = NvmfDaemon::start(&dir, "0x1", transport);
    n.malloc("M0", BLOCKS, BS);
    n.subsystem(SUBNQN, true);
    assert_eq!(n.add_ns(SUBNQN, "M0"), 1);
    n.listen(SUBNQN);
    (dir, n)
}

/// The target's idle state after a first host came and went (so that what any connection
/// costs once, e.g. the namespace's channel, is in the baseline): descriptors and RSS in KiB.
fn idle_baseline(n: &mut NvmfDaemon) -> (usize, u64) {
    assert_good_host(n.port, SUBNQN, 1, BS, 7);
    let pid = n.d.proc.pid();
    assert!(wait_until(Duration::from_secs(5), || n.qpairs(SUBNQN).is_empty()), "the first host's queues stay");
    std::thread::sleep(Duration::from_millis(200));
    (fd_count(pid), n.rss_kib())
}

/// Waits until the target has no queue pair and at most `fds` descriptors; panics after
/// `within` with what is left.
fn expect_idle(n: &mut NvmfDaemon, fds: usize, within: Duration, what: &str) -> Duration {
    let pid = n.d.proc.pid();
    let t = Instant::now();
    // Descriptors are counted without RPCs in between: each RPC is a connection of its own,
    // which the daemon may not have closed yet when a busy machine runs the count.
    let ok = wait_until(within, || n.qpairs(SUBNQN).is_empty()) && wait_until(within, || fd_count(pid) <= fds);
    assert!(
        ok,
        "{what}: not idle after {within:?}: {} queue pairs, {} descriptors (idle: {fds}): {:?}",
        n.qpairs(SUBNQN).len(),
        fd_count(pid),
        fd_targets(pid)
    );
    t.elapsed()
}

#[test]
fn a_thousand_io_queue_pairs_each_verified() {
    let _one = one_at_a_time();
    const CTRLS: usize = 10;
    const PER_CTRL: u16 = 100;
    let limit = raise_nofile();
    if limit < 2500 {
        println!("SKIP a_thousand_io_queue_pairs_each_verified: open file limit {limit} (needs 2,500)");
        return;
    }
    let (_dir, mut n) = setup("nvmfscale", json!({"max_qpairs_per_ctrlr": PER_CTRL + 1}));
    let pid = n.d.proc.pid();
    let (fds0, rss0) = idle_baseline(&mut n);
    let t = Instant::now();
    let mut sessions: Vec<Session> =
        (0..CTRLS).map(|_| Session::open(n.port, SUBNQN, PER_CTRL, HostOpts::default(), 4096)).collect();
    let connected = t.elapsed();
    let total = CTRLS * (usize::from(PER_CTRL) + 1);
    let qpairs = n.qpairs(SUBNQN);
    assert_eq!(qpairs.len(), total, "nvmf_subsystem_get_qpairs lists every queue pair");
    assert_eq!(n.controllers(SUBNQN).len(), CTRLS);
    let (fds1, rss1) = (fd_count(pid), n.rss_kib());
    println!(
        "{total} queue pairs ({} I/O) connected in {connected:?}; target: {fds0} -> {fds1} descriptors, \
         RSS {} -> {} MiB ({:.1} KiB per queue pair)",
        CTRLS * usize::from(PER_CTRL),
        rss0 / 1024,
        rss1 / 1024,
        rss1.saturating_sub(rss0) as f64 / total as f64
    );
    assert!(fds1 <= fds0 + total + 16, "{fds1} descriptors for {total} connections (idle: {fds0})");

    // Each I/O queue pair k owns blocks 5k..5k+5: one written in the capsule, four by R2T.
    let ios: Vec<&mut Host> = sessions.iter_mut().flat_map(|s| s.io.iter_mut()).collect();
    let mut ios = ios;
    let data = |k: usize| pattern(1_000_000 + k as u64, 5 * BS as usize);
    let t = Instant::now();
    for round in 0..2 {
        // Every queue pair has its command out before any is waited for.
        let cids: Vec<u16> = ios
            .iter_mut()
            .enumerate()
            .map(|(k, q)| {
                let d = data(k);
                let lba = 5 * k as u64;
                let (slba, bytes) = if round == 0 { (lba, &d[..BS as usize]) } else { (lba + 1, &d[BS as usize..]) };
                let nlb = (bytes.len() / BS as usize) as u32;
                q.submit(Host::rw_sqe(nvm::WRITE, 1, slba, nlb), Some(bytes), 0)
            })
            .collect();
        for (q, cid) in ios.iter_mut().zip(cids) {
            q.wait(cid).ok("write");
        }
    }
    let cids: Vec<u16> = ios
        .iter_mut()
        .enumerate()
        .map(|(k, q)| q.submit(Host::rw_sqe(nvm::READ, 1, 5 * k as u64, 5), None, 5 * BS))
        .collect();
    for (k, (q, cid)) in ios.iter_mut().zip(cids).enumerate() {
        let got = q.wait(cid).ok("read").data;
        assert!(got == data(k), "queue pair {k} (QID {}) reads back what it wrote", q.qid);
    }
    let rss2 = n.rss_kib();
    println!(
        "3,000 commands (1,000 at a time) with data checked on all 1,000 I/O queue pairs in {:?}; RSS {} MiB",
        t.elapsed(),
        rss2 / 1024
    );
    // 1,000 idle queue pairs cost little: a few KiB each, no receive buffer.
    assert!(rss2 < rss0 + 64 * 1024, "RSS {rss2} KiB with 1,010 queue pairs (idle: {rss0} KiB)");
    n.assert_alive();

    drop(ios);
    drop(sessions);
    let took = expect_idle(&mut n, fds0, Duration::from_secs(10), "after 1,010 hosts closed");
    println!(
        "idle again {took:?} after the hosts closed: {} descriptors, RSS {} MiB",
        fd_count(pid),
        n.rss_kib() / 1024
    );
    assert_good_host(n.port, SUBNQN, 1, BS, 9);
    n.assert_alive();
}

#[test]
fn spdk_nvme_perf_with_a_thousand_io_queue_pairs() {
    let _one = one_at_a_time();
    let spdk = match common::spdk_dir() {
        Ok(d) => d,
        Err(why) => {
            println!("SKIP spdk_nvme_perf_with_a_thousand_io_queue_pairs: {why}");
            return;
        }
    };
    let perf = spdk.join("build/bin/spdk_nvme_perf");
    if !perf.is_file() {
        println!("SKIP spdk_nvme_perf_with_a_thousand_io_queue_pairs: {} is missing", perf.display());
        return;
    }
    const QPAIRS: usize = 1000;
    let (dir, mut n) = setup("nvmfscaleperf", json!({"max_qpairs_per_ctrlr": QPAIRS + 1}));
    let pid = n.d.proc.pid();
    let (fds0, rss0) = idle_baseline(&mut n);
    let cpus = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let mask = format!("{:#x}", 1u32 << usize::from(cpus >= 2));
    let trid = format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{} subnqn:{SUBNQN}", n.port);
    let (so, se) = (dir.join("perf.stdout"), dir.join("perf.stderr"));
    // --io-queue-size 4: each queue pair holds few requests (perf's memory, not the target's).
    let args = [
        "--no-huge",
        "-s",
        "1024",
        "-c",
        &mask,
        "-i",
        "7",
        "-P",
        "1000",
        "-q",
        "1000",
        "--io-queue-size",
        "4",
        "-o",
        "4096",
        "-w",
        "randrw",
        "-M",
        "50",
        "-t",
        "4",
        "-r",
        &trid,
    ];
    let child = std::process::Command::new(&perf)
        .args(args)
        .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .expect("spawn spdk_nvme_perf");
    let mut p = KillOnDrop(child);
    let t = Instant::now();
    let (mut most, mut fds1, mut rss1) = (0, 0, 0);
    let status = loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "spdk_nvme_perf still runs after 60 s");
        let q = n.qpairs(SUBNQN).len();
        if q > most {
            most = q;
            (fds1, rss1) = (fd_count(pid), n.rss_kib());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = std::fs::read_to_string(&so).unwrap_or_default();
    let err = std::fs::read_to_string(&se).unwrap_or_default();
    let text = format!("{out}\n{err}");
    assert!(status.success(), "spdk_nvme_perf: {status}\n{text}");
    for bad in ["completed with error", "starting I/O failed", "ERROR: "] {
        assert!(!text.contains(bad), "spdk_nvme_perf: {bad:?} in its output:\n{text}");
    }
    let total = out.lines().find(|l| l.starts_with("Total")).unwrap_or_else(|| panic!("no Total line:\n{text}"));
    let iops: f64 = total.rsplit_once(':').and_then(|(_, r)| r.split_whitespace().next()?.parse().ok()).unwrap_or(0.0);
    println!("spdk_nvme_perf -P 1000: {}", total.split_whitespace().collect::<Vec<_>>().join(" "));
    println!(
        "while it ran: {most} queue pairs listed; target {fds0} -> {fds1} descriptors, RSS {} -> {} MiB \
         ({:.1} KiB per queue pair)",
        rss0 / 1024,
        rss1 / 1024,
        rss1.saturating_sub(rss0) as f64 / most.max(1) as f64
    );
    assert!(iops > 0.0, "no I/O:\n{text}");
    assert_eq!(most, QPAIRS + 1, "nvmf_subsystem_get_qpairs lists the admin and 1,000 I/O queue pairs");
    assert!(fds1 <= fds0 + QPAIRS + 1 + 16, "{fds1} descriptors for {} connections", QPAIRS + 1);
    let took = expect_idle(&mut n, fds0, Duration::from_secs(10), "after spdk_nvme_perf");
    println!("idle again {took:?} after perf ended");
    assert_good_host(n.port, SUBNQN, 1, BS, 11);
    n.assert_alive();
}

/// A child process killed (and reaped) on drop.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A connected I/O queue pair that queues `count` writes of 128 KiB (the target answers each
/// with an R2T) and never sends their data.
fn abandon_writes(q: &mut Host, count: u16) {
    let mut batch = Vec::new();
    for k in 0..count {
        let raw = Host::with_transport_sgl(Host::rw_sqe(nvm::WRITE, 1, u64::from(k) * 32, 32), k + 1, 128 * 1024);
        batch.extend_from_slice(&q.frame(&Pdu::CapsuleCmd(CapsuleCmd { sqe: raw }), &[]));
    }
    q.send_raw(&batch);
}

/// Counts the R2Ts `q` receives within `wait` (stops early at `want`, then looks 200 ms more
/// for any beyond it).
fn r2ts_within(q: &mut Host, want: usize, wait: Duration) -> usize {
    let mut n = 0;
    let end = Instant::now() + wait;
    let mut extra = None;
    q.s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    while Instant::now() < extra.unwrap_or(end) {
        match q.recv() {
            Ok(r) if matches!(r.pdu, Pdu::R2t(_)) => n += 1,
            Ok(r) => panic!("expected only R2Ts, got {:?}", r.pdu),
            Err(RecvError::TimedOut) => {}
            Err(e) => panic!("while counting R2Ts: {e:?}"),
        }
        if n >= want && extra.is_none() {
            extra = Some(Instant::now() + Duration::from_millis(200));
        }
    }
    q.s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    n
}

/// Writes 128 KiB by R2T and reads it back; the status of the write if it failed.
fn big_write_status(port: u16, seed: u64) -> Result<(), (u8, u8)> {
    let mut s = Session::open(port, SUBNQN, 1, HostOpts::default(), 4096);
    let d = pattern(seed, 128 * 1024);
    let c = s.io[0].write(1, 8192, &d, BS);
    if !c.cqe.status.is_success() {
        return Err(c.status());
    }
    assert!(s.io[0].read(1, 8192, 32, BS).ok("read").data == d, "128 KiB read back");
    Ok(())
}

/// A good host whose data comes in the capsule (no R2T buffer): a new controller writes 4 KiB,
/// reads it back and identifies the controller.
fn small_good_host(port: u16, seed: u64) {
    let mut s = Session::open(port, SUBNQN, 1, HostOpts::default(), 4096);
    let d = pattern(seed, BS as usize);
    s.io[0].write(1, 9000, &d, BS).ok("good host: in-capsule write");
    assert!(s.io[0].read(1, 9000, 1, BS).ok("good host: read").data == d, "good host reads back its write");
    s.admin.identify(ferrite_nvmf::spec::identify::cns::CONTROLLER, 0, 0).ok("good host: identify");
}

#[test]
fn attackers_are_timed_out_while_a_good_host_works() {
    let _one = one_at_a_time();
    let limit = raise_nofile();
    if limit < 4000 {
        println!("SKIP attackers_are_timed_out_while_a_good_host_works: open file limit {limit} (needs 4,000)");
        return;
    }
    let (_dir, mut n) = setup("nvmfattack", json!({}));
    let pid = n.d.proc.pid();
    let (fds0, rss0) = idle_baseline(&mut n);
    let t0 = Instant::now();
    // Connected queue pairs that take write buffers and never send the data.
    let mut hoarder = Session::open(n.port, SUBNQN, 5, HostOpts { sqsize: 127, ..Default::default() }, 4096);
    for q in hoarder.io.iter_mut() {
        abandon_writes(q, 128);
    }
    // A fused Compare (first half) whose second half never comes: it holds its data buffer.
    let mut lonely = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let mut first = Host::rw_sqe(nvm::COMPARE, 1, 10, 1);
    first[1] |= 1; // FUSE: first command
    let lonely_cid = lonely.io[0].submit(first, Some(&pattern(3, BS as usize)), 0);
    // Connections that never say anything, say ICReq only, or stop half-way through a command.
    let silent: Vec<TcpStream> = (0..2000).map(|_| Host::tcp(n.port)).collect();
    let ic_only: Vec<Host> = (0..200).map(|_| Host::initialized(n.port, HostOpts::default())).collect();
    let half_capsule: Vec<Host> = (0..200)
        .map(|_| {
            let mut h = Host::initialized(n.port, HostOpts::default());
            let (raw, data) = h.connect_capsule(SUBNQN, 0, 0xffff);
            let mut raw = raw;
            raw[24..40].copy_from_slice(&SglDescriptor::in_capsule(0, 1024).to_bytes());
            let b = h.frame(&Pdu::CapsuleCmd(CapsuleCmd { sqe: raw }), &[&data]);
            h.send_raw(&b[..36]);
            h
        })
        .collect();
    let half_data: Vec<Host> = (0..100)
        .map(|_| {
            let mut h = Host::initialized(n.port, HostOpts::default());
            let (mut raw, data) = h.connect_capsule(SUBNQN, 0, 0xffff);
            raw[24..40].copy_from_slice(&SglDescriptor::in_capsule(0, 1024).to_bytes());
            let b = h.frame(&Pdu::CapsuleCmd(CapsuleCmd { sqe: raw }), &[&data]);
            h.send_raw(&b[..72 + 512]);
            h
        })
        .collect();
    let opened = t0.elapsed();
    let attackers = 5 + 2000 + 200 + 200 + 100;
    let (fds1, rss1) = (fd_count(pid), n.rss_kib());
    println!(
        "{attackers} attacking connections in {opened:?}; target: {fds0} -> {fds1} descriptors, RSS {} -> {} MiB",
        rss0 / 1024,
        rss1 / 1024
    );
    // Each hoarding queue pair holds at most its R2T budget (8 MiB: 64 of its 128 writes got
    // an R2T, the rest wait), so buffers are left for a good host's writes by R2T.
    for (k, q) in hoarder.io.iter_mut().enumerate() {
        let r2ts = r2ts_within(q, 64, Duration::from_secs(2));
        assert_eq!(r2ts, 64, "hoarding queue pair {k}: R2Ts for its 128 writes of 128 KiB");
    }
    big_write_status(n.port, 22).unwrap_or_else(|st| panic!("a good host's 128 KiB write beside the hoarders: {st:?}"));
    // Meanwhile a good host works, and the target does not burn its core on idle sockets.
    let cpu0 = cpu_ticks(pid);
    let tc = Instant::now();
    let mut worst = Duration::ZERO;
    let mut runs = 0;
    while t0.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        small_good_host(n.port, 30 + runs);
        worst = worst.max(t.elapsed());
        runs += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / clk_tck() as f64 / tc.elapsed().as_secs_f64();
    println!(
        "{runs} good hosts (connect, write, read, identify) beside them, slowest {worst:?}; target CPU {:.1}%",
        cpu * 100.0
    );
    assert!(cpu < 0.5, "the target used {:.0}% of a core with idle attackers", cpu * 100.0);

    // All of them are closed by the target: no Connect within 10 s, a command's data not in
    // 10 s after its R2T (the watchdog looks once a second).
    let deadline = t0 + Duration::from_secs(16);
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(20));
    for (k, q) in hoarder.io.iter_mut().enumerate() {
        assert!(q.closed_within(left()), "I/O queue pair {k} that never sent its write data is still open");
    }
    let mut open = 0;
    for mut s in silent {
        open += usize::from(!closed_within(&mut s, left()));
    }
    for mut h in ic_only.into_iter().chain(half_capsule).chain(half_data) {
        open += usize::from(!h.closed_within(left()));
    }
    assert_eq!(open, 0, "{open} attacking connections still open after {:?}", t0.elapsed());
    println!("every attacker was closed by the target {:?} after they came", t0.elapsed());
    // The lonely fused half failed as Aborted Missing Fused; its queue pair stays.
    let c = lonely.io[0].wait(lonely_cid);
    assert_eq!(c.status(), (0, 0x0a), "a fused half without its partner fails after 10 s");
    small_good_host(n.port, 60);
    drop(lonely);
    // The hoarders' admin queue is a plain idle controller: the host closes it.
    drop(hoarder);
    let took = expect_idle(&mut n, fds0, Duration::from_secs(5), "after the attackers");
    println!("idle again ({} descriptors, RSS {} MiB) {took:?} later", fd_count(pid), n.rss_kib() / 1024);
    big_write_status(n.port, 40).unwrap_or_else(|st| panic!("a 128 KiB write after the attack failed: {st:?}"));
    n.assert_alive();
    let log = n.d.proc.stderr();
    assert!(log.contains("after its R2T; closing"), "the target says why it closed the hoarders");
}

/// Sets process `pid`'s descriptor limit (soft and hard) to `n`.
fn set_nofile(pid: i32, n: u64) {
    let r = libc::rlimit { rlim_cur: n, rlim_max: n };
    // SAFETY: prlimit reads `r` and writes nothing (old limit pointer is null).
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &r, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit({pid}, RLIMIT_NOFILE, {n}): {}", std::io::Error::last_os_error());
}

#[test]
fn out_of_descriptors_the_target_backs_off_and_recovers() {
    let _one = one_at_a_time();
    raise_nofile();
    let (_dir, mut n) = setup("nvmfemfile", json!({}));
    let pid = n.d.proc.pid();
    let (fds0, _) = idle_baseline(&mut n);
    const LIMIT: u64 = 256;
    set_nofile(pid, LIMIT);
    // More connections than descriptors: the target takes what it can, the rest wait in the
    // listen backlog and accept fails with EMFILE until descriptors come back.
    let mut conns: Vec<TcpStream> = (0..400).map(|_| Host::tcp(n.port)).collect();
    assert!(
        wait_until(Duration::from_secs(5), || n.d.proc.stderr().contains("Too many open files")),
        "no EMFILE in the log with {} descriptors open; stderr:\n{}",
        fd_count(pid),
        n.d.proc.stderr()
    );
    let cpu0 = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / clk_tck() as f64 / t.elapsed().as_secs_f64();
    let lines = n.d.proc.stderr().lines().filter(|l| l.contains("Too many open files")).count();
    println!(
        "out of descriptors ({} open, limit {LIMIT}): target CPU {:.1}% over 2 s, {lines} log line(s) about it",
        fd_count(pid),
        cpu * 100.0
    );
    assert!(cpu < 0.2, "the target used {:.0}% of a core retrying accept", cpu * 100.0);
    assert!(lines <= 3, "{lines} log lines about EMFILE in 2 s");
    // The clients go: the target releases their descriptors, takes the backlog (closed
    // already) and serves again.
    for c in conns.iter_mut() {
        let _ = c.flush();
    }
    drop(conns);
    let took = expect_idle(&mut n, fds0, Duration::from_secs(10), "after the clients left");
    assert!(
        wait_until(Duration::from_secs(5), || n.d.proc.stderr().contains("accepting again")),
        "the target does not say it accepts again"
    );
    println!("idle again {took:?} after the clients left");
    assert_good_host(n.port, SUBNQN, 1, BS, 50);
    n.assert_alive();
}

/// Process `pid`'s descriptor limit (soft, hard).
fn nofile(pid: i32) -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit writes the old limit into `r` and sets nothing (new limit pointer null).
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut r) };
    assert_eq!(rc, 0, "prlimit({pid}): {}", std::io::Error::last_os_error());
    (r.rlim_cur, r.rlim_max)
}

#[test]
fn the_target_raises_its_descriptor_limit() {
    let _one = one_at_a_time();
    let hard = raise_nofile();
    if hard < 1024 {
        println!("SKIP the_target_raises_its_descriptor_limit: hard limit {hard}");
        return;
    }
    let dir = TempDir::new("nvmfnofile");
    let mut n = NvmfDaemon::start(&dir, "0x1", json!({}));
    let pid = n.d.proc.pid();
    let r = libc::rlimit { rlim_cur: 512, rlim_max: hard };
    // SAFETY: prlimit reads `r`.
    assert_eq!(unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &r, std::ptr::null_mut()) }, 0);
    n.malloc("M0", BLOCKS, BS);
    n.subsystem(SUBNQN, true);
    n.add_ns(SUBNQN, "M0");
    n.listen(SUBNQN);
    assert_eq!(nofile(pid), (hard, hard), "the soft limit is raised to the hard limit");
    assert_good_host(n.port, SUBNQN, 1, BS, 70);
}
