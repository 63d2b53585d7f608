//! SPDK's own NVMe/TCP hosts against Ferrite's NVMe-oF target, started as `ferrite serve -c
//! CONFIG` with an SPDK-format config (nvmf_create_transport, nvmf_create_subsystem,
//! nvmf_subsystem_add_ns, nvmf_subsystem_add_listener):
//! - spdk_nvme_perf: random reads and writes with and without header and data digests;
//! - bdevperf through bdev_nvme_attach_controller, `-w verify` at 4 KiB and 128 KiB, with and
//!   without digests: everything written is read back and compared (the data-integrity test);
//! - spdk_nvme_identify: the controller's serial and model number, the namespace's size, and the
//!   discovery log page;
//! - two subsystems with two namespaces each (null and malloc) on one listener;
//! - and the other way round, Ferrite's host (`ferrite perf -w verify` over bdev_nvme) against
//!   SPDK's nvmf_tgt.
//!
//! The digest tests relay the host's connections through a probe that reads each ICResp: an SPDK
//! host whose digest request the target ignores runs without digests and reports nothing, so the
//! probe checks that the target agreed to both.
//!
//! Needs SPDK v26.05 in $SPDK_DIR (../shared/anchors/spdk.sh); each test prints SKIP and returns
//! without it. NVMF_TARGET=spdk runs the same tests against SPDK's nvmf_tgt (how the clients and
//! the parsing here were proven before Ferrite had a target); the default is Ferrite. The tests
//! of this file run one at a time: each has a polling target on core 0 and a polling client on
//! core 1.

mod common;

use common::{free_port, TempDir, FERRITE};
use ferrite_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const NQN1: &str = "nqn.2016-06.io.spdk:cnode1";
const NQN2: &str = "nqn.2016-06.io.spdk:cnode2";
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
const SERIAL: &str = "FERRITE0001";
const MODEL: &str = "Ferrite NVMe/TCP test";

const NVMF_TGT: &str = "build/bin/nvmf_tgt";
const PERF: &str = "build/bin/spdk_nvme_perf";
const IDENTIFY: &str = "build/bin/spdk_nvme_identify";
const BDEVPERF: &str = "build/examples/bdevperf";
const DD: &str = "build/bin/spdk_dd";

/// How long a target may take until its listener accepts connections.
const TARGET_START: Duration = Duration::from_secs(30);
/// How long any client run may take (its own -t plus start-up and connecting).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// One test of this file at a time (a poisoned lock is fine: the test that panicked is over).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- what the tests run against ----------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ferrite,
    Spdk,
}

/// SPDK's directory and the target under test.
struct Env {
    spdk: PathBuf,
    kind: Kind,
}

impl Env {
    /// The environment, or None after printing why `test` is skipped.
    fn get(test: &str) -> Option<Env> {
        let kind = match std::env::var("NVMF_TARGET").as_deref() {
            Err(_) | Ok("") | Ok("ferrite") => Kind::Ferrite,
            Ok("spdk") => Kind::Spdk,
            Ok(other) => panic!("NVMF_TARGET={other}: expected ferrite or spdk"),
        };
        let spdk = match common::spdk_dir() {
            Ok(d) => d,
            Err(why) => {
                println!("SKIP {test}: {why}");
                return None;
            }
        };
        for bin in [NVMF_TGT, PERF, IDENTIFY, BDEVPERF] {
            if !spdk.join(bin).is_file() {
                println!("SKIP {test}: {} is missing", spdk.join(bin).display());
                return None;
            }
        }
        Some(Env { spdk, kind })
    }

    /// The core the SPDK clients run on: 1, away from the target, when there is one.
    fn client_core(&self) -> usize {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        usize::from(cpus >= 2)
    }

    fn client_mask(&self) -> String {
        format!("{:#x}", 1u32 << self.client_core())
    }
}

fn listen_address(port: u16) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
}

/// One subsystem of a config: its NQN, serial number, model number and namespaces (bdev names,
/// NSIDs 1, 2, ... in order).
struct Subsystem<'a> {
    nqn: &'a str,
    serial: &'a str,
    model: &'a str,
    namespaces: &'a [&'a str],
}

/// The SPDK-format config both targets load: `bdevs` (bdev subsystem entries), then the TCP
/// transport, the subsystems with their namespaces, and a listener on 127.0.0.1:`port` for each
/// (and for the discovery subsystem if `discovery_listener`).
fn config(bdevs: Vec<Value>, subsystems: &[Subsystem], port: u16, discovery_listener: bool) -> Value {
    let mut nvmf = vec![json!({"method": "nvmf_create_transport", "params": {"trtype": "TCP"}})];
    for s in subsystems {
        nvmf.push(json!({"method": "nvmf_create_subsystem", "params": {
            "nqn": s.nqn, "allow_any_host": true, "serial_number": s.serial, "model_number": s.model}}));
        for b in s.namespaces {
            nvmf.push(
                json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": s.nqn, "namespace": {"bdev_name": b}}}),
            );
        }
        nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
            "nqn": s.nqn, "listen_address": listen_address(port)}}));
    }
    if discovery_listener {
        // SPDK still lets a host reach the discovery subsystem on any listener, but warns that
        // this is deprecated: add the listener explicitly.
        nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
            "nqn": DISCOVERY_NQN, "listen_address": listen_address(port)}}));
    }
    json!({"subsystems": [
        {"subsystem": "bdev", "config": bdevs},
        {"subsystem": "nvmf", "config": nvmf},
    ]})
}

fn malloc(name: &str, num_blocks: u64, block_size: u32) -> Value {
    json!({"method": "bdev_malloc_create", "params": {"name": name, "num_blocks": num_blocks, "block_size": block_size}})
}

fn null(name: &str, num_blocks: u64, block_size: u32) -> Value {
    json!({"method": "bdev_null_create", "params": {"name": name, "num_blocks": num_blocks, "block_size": block_size}})
}

/// The simplest setup: subsystem NQN1 with one 64 MiB malloc namespace (4 KiB blocks).
fn malloc_config(port: u16) -> Value {
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &["Malloc0"] };
    config(vec![malloc("Malloc0", 16384, 4096)], &[s], port, false)
}

// ---- the target ---------------------------------------------------------------------------

/// A running NVMe/TCP target listening on 127.0.0.1:`port`; SIGKILLed on drop.
struct Target {
    child: Child,
    kind: Kind,
    log: PathBuf,
}

impl Target {
    /// Starts the target of `env` with `config` (which listens on `port`) on core 0, and waits
    /// until the listener accepts connections. Panics with the target's own message if it
    /// cannot load the config (as Ferrite does before its target exists: "Method not found").
    fn start(env: &Env, dir: &TempDir, config: &Value, port: u16) -> Target {
        let cfg = dir.write_json("target.json", config);
        let sock = dir.join("target.sock");
        let log = dir.join("target.log");
        let mut cmd = match env.kind {
            Kind::Ferrite => {
                let mut c = Command::new(FERRITE);
                c.args(["serve", "-m", "0x1", "-r"]).arg(&sock).arg("-c").arg(&cfg);
                c.args(["--log-level", "warn"]).env_remove("FERRITE_LOG");
                c
            }
            Kind::Spdk => {
                let mut c = Command::new(env.spdk.join(NVMF_TGT));
                c.args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "-r"]).arg(&sock);
                c.arg("--json").arg(&cfg).env("LD_LIBRARY_PATH", env.spdk.join("build/lib"));
                c
            }
        };
        let out = File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {:?} target: {e}", env.kind));
        let mut t = Target { child, kind: env.kind, log };
        let deadline = Instant::now() + TARGET_START;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            if let Some(st) = t.child.try_wait().unwrap() {
                let log = t.log();
                if let Some(line) = log.lines().find(|l| l.contains("Method not found")) {
                    panic!(
                        "the {:?} target cannot serve the NVMe/TCP config yet ({st}): {line}\n\
                         (NVMF_TARGET=spdk runs these tests against SPDK's nvmf_tgt)",
                        t.kind
                    );
                }
                panic!("the {:?} target exited while starting ({st}); its log:\n{log}", t.kind);
            }
            // Ready once the listener accepts a connection (closed again before any PDU) and
            // the RPC socket accepts one: Ferrite binds its RPC socket after the config loaded,
            // so the listener can be up a moment before it.
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                && std::os::unix::net::UnixStream::connect(&sock).is_ok()
            {
                return t;
            }
            assert!(Instant::now() < deadline, "nothing listens on {addr} after {TARGET_START:?}; log:\n{}", t.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Panics (with the target's log) if the target is no longer running.
    fn assert_running(&mut self, after: &str) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("the {:?} target died ({st}) during {after}; its log:\n{}", self.kind, self.log());
        }
    }

    /// SIGTERM; the target must exit with status 0 within 10 s.
    fn stop(mut self) {
        self.assert_running("the test");
        // SAFETY: kill(2) on our own child, which has not been reaped (it is running).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "the {:?} target exited with {st} on SIGTERM; log:\n{}", self.kind, self.log());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the {:?} target ignored SIGTERM for 10 s; log:\n{}",
                self.kind,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `-r` transport ID of an SPDK NVMe host for subsystem `nqn` (through `port`).
    fn trid(port: u16, nqn: &str) -> String {
        format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---- SPDK's clients -----------------------------------------------------------------------

/// A finished client run.
struct Out {
    what: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    /// Both streams, with bdevperf's carriage returns turned into line breaks.
    fn text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr).replace('\r', "\n")
    }

    fn assert_ok(&self) -> &Self {
        assert!(self.status.success(), "{} failed ({}):\n{}", self.what, self.status, self.text());
        self
    }
}

/// A client process, SIGKILLed on drop (a failed assertion or a timeout never leaks one).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs SPDK's `bin` (relative to $SPDK_DIR) with `args` to completion within CLIENT_TIMEOUT.
fn run_spdk(env: &Env, dir: &TempDir, bin: &str, args: &[String]) -> Out {
    let mut cmd = Command::new(env.spdk.join(bin));
    cmd.env("LD_LIBRARY_PATH", env.spdk.join("build/lib"));
    run_client(dir, cmd, args)
}

/// Runs `cmd` (a client: SPDK's, or `ferrite perf`) with `args` to completion within
/// CLIENT_TIMEOUT, in `dir`.
fn run_client(dir: &TempDir, mut cmd: Command, args: &[String]) -> Out {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let program = PathBuf::from(cmd.get_program());
    let name = program.file_name().unwrap().to_str().unwrap().to_string();
    let (so, se) = (dir.join(&format!("{name}-{n}.stdout")), dir.join(&format!("{name}-{n}.stderr")));
    let what = format!("{name} {}", args.join(" "));
    let child = cmd
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(File::create(&so).unwrap())
        .stderr(File::create(&se).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut p = Running(child);
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return Out { what, status, stdout: read(&so), stderr: read(&se) };
        }
        if Instant::now() >= deadline {
            drop(p);
            panic!("{what} did not finish within {CLIENT_TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}", read(&so), read(&se));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// spdk_nvme_perf's results: IOPS per namespace (NSID) and the Total line.
#[derive(Debug)]
struct Perf {
    namespaces: Vec<(u32, f64)>,
    iops: f64,
    mib_s: f64,
    mean_us: f64,
}

/// Numbers after the last ':' of a report line.
fn numbers_after_colon(line: &str) -> Vec<f64> {
    line.rsplit_once(':')
        .map(|(_, r)| r.split_whitespace().filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default()
}

/// Parses spdk_nvme_perf's report:
/// `TCP (addr:127.0.0.1 subnqn:NQN) NSID 1 from core  1:  IOPS  MiB/s  Average  min  max`
/// per namespace, then `Total  :  IOPS  MiB/s  Average  min  max` (latencies in microseconds).
fn parse_perf(stdout: &str) -> Option<Perf> {
    let mut namespaces = Vec::new();
    let mut total = None;
    for line in stdout.lines() {
        if let Some(rest) = line.split_once(" NSID ").map(|(_, r)| r) {
            if !rest.contains(" from core ") {
                continue; // "Associating ... NSID 1 with lcore 1"
            }
            let nsid = rest.split_whitespace().next()?.parse().ok()?;
            let v = numbers_after_colon(line);
            namespaces.push((nsid, *v.first()?));
        } else if line.starts_with("Total") && line.contains(':') {
            let v = numbers_after_colon(line);
            if v.len() >= 3 {
                total = Some((v[0], v[1], v[2]));
            }
        }
    }
    let (iops, mib_s, mean_us) = total?;
    Some(Perf { namespaces, iops, mib_s, mean_us })
}

/// Runs spdk_nvme_perf (on the client core, no hugepages) against `trid` with `args` and checks
/// it: exit status 0, no failed I/O, a report with nonzero IOPS for every namespace in it.
fn perf(env: &Env, dir: &TempDir, trid: &str, args: &[&str]) -> Perf {
    let mask = env.client_mask();
    let mut all = strings(&["--no-huge", "-s", "1024", "-c", &mask]);
    all.extend(strings(args));
    all.extend(["-r".to_string(), trid.to_string()]);
    let out = run_spdk(env, dir, PERF, &all);
    out.assert_ok();
    let text = out.text();
    for bad in ["completed with error", "starting I/O failed", "ERROR: "] {
        assert!(!text.contains(bad), "{}: {bad:?} in its output:\n{text}", out.what);
    }
    let p = parse_perf(&out.stdout).unwrap_or_else(|| panic!("{}: no report in its output:\n{text}", out.what));
    assert!(p.iops > 0.0 && p.mib_s > 0.0 && p.mean_us > 0.0, "{}: {p:?}\n{text}", out.what);
    assert!(!p.namespaces.is_empty(), "{}: no per-namespace lines:\n{text}", out.what);
    for (nsid, iops) in &p.namespaces {
        assert!(*iops > 0.0, "{}: NSID {nsid} did no I/O:\n{text}", out.what);
    }
    p
}

/// bdevperf's Total line: IOPS, MiB/s, failed and timed-out I/O per second.
#[derive(Debug)]
struct BdevperfTotal {
    iops: f64,
    fail_s: f64,
    timeout_s: f64,
}

/// Parses bdevperf's report (lines start with a carriage return; `text` has them as breaks):
/// ` Total  :  IOPS  MiB/s  Fail/s  TO/s  Average  min  max`.
fn parse_bdevperf(text: &str) -> Option<BdevperfTotal> {
    let line = text.lines().rfind(|l| l.trim_start().starts_with("Total") && l.contains(':'))?;
    let v = numbers_after_colon(line);
    (v.len() >= 4).then(|| BdevperfTotal { iops: v[0], fail_s: v[2], timeout_s: v[3] })
}

/// bdevperf (SPDK's bdev layer and bdev_nvme, the host an SPDK user runs) attached over NVMe/TCP
/// to `port`, subsystem NQN1, as bdev Nvme0n1: `-w verify -q 32 -o SIZE -t 3` writes, reads back
/// and compares every block. Checks it: exit status 0, no miscompare, no failed or timed-out I/O.
fn bdevperf_verify(env: &Env, dir: &TempDir, port: u16, size: u32, digests: bool) -> BdevperfTotal {
    let mut attach = json!({});
    if digests {
        attach["hdgst"] = json!(true);
        attach["ddgst"] = json!(true);
    }
    let size = size.to_string();
    let (out, text) = bdevperf(env, dir, port, attach, &["-q", "32", "-o", &size, "-w", "verify", "-t", "3"]);
    assert_verified(&out, &text, "Nvme0n1")
}

/// Checks a bdevperf `-w verify` run on `bdev`: exit status 0, no miscompare, no failed or
/// timed-out I/O, some I/O done.
fn assert_verified(out: &Out, text: &str, bdev: &str) -> BdevperfTotal {
    out.assert_ok();
    for bad in ["Buffer mismatch", "miscompare", "Miscompare", "verify failed"] {
        assert!(!text.contains(bad), "{}: {bad:?} in its output:\n{text}", out.what);
    }
    assert!(text.contains(bdev), "{}: no job on {bdev}:\n{text}", out.what);
    let t = parse_bdevperf(text).unwrap_or_else(|| panic!("{}: no Total line:\n{text}", out.what));
    assert!(t.iops > 0.0 && t.fail_s == 0.0 && t.timeout_s == 0.0, "{}: {t:?}\n{text}", out.what);
    t
}

/// bdev_nvme_attach_controller's parameters for controller Nvme0: NVMe/TCP to 127.0.0.1:`port`,
/// subsystem NQN1.
fn attach_params(port: u16) -> Value {
    json!({"name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN1})
}

/// A host's config (SPDK's format, for bdevperf or `ferrite perf`): controller Nvme0 attached
/// over NVMe/TCP to `port`, subsystem NQN1, with the attach parameters in `extra` added.
fn host_config(port: u16, extra: &Value) -> Value {
    let mut attach = attach_params(port);
    if let Value::Object(m) = extra {
        for (k, v) in m {
            attach[k] = v.clone();
        }
    }
    json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_nvme_attach_controller", "params": attach}]}]})
}

/// Runs bdevperf with `job` (its workload flags) on bdev Nvme0n1 of [`host_config`]`(port,
/// extra)`, on the client's core, without hugepages. Its output and the output's text.
fn bdevperf(env: &Env, dir: &TempDir, port: u16, extra: Value, job: &[&str]) -> (Out, String) {
    let cfg = dir.write_json("bdevperf.json", &host_config(port, &extra));
    let sock = dir.join("bdevperf.sock");
    let mask = env.client_mask();
    let mut args = strings(&["--json", cfg.to_str().unwrap()]);
    args.extend(strings(job));
    args.extend(strings(&[
        "-m",
        &mask,
        "--disable-cpumask-locks",
        "--no-pci",
        "--no-huge",
        "-s",
        "1024",
        "-r",
        sock.to_str().unwrap(),
    ]));
    let out = run_spdk(env, dir, BDEVPERF, &args);
    let text = out.text();
    (out, text)
}

/// The value of the first line `Key:   value` (trimmed) in spdk_nvme_identify's output.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.trim_start().strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// The entries of the Discovery Log Page in spdk_nvme_identify's output, each as its lines.
fn discovery_entries(text: &str) -> Vec<String> {
    let Some((_, log)) = text.split_once("Discovery Log Page") else { return Vec::new() };
    log.split("Discovery Log Entry ").skip(1).map(str::to_string).collect()
}

// ---- the digest probe ---------------------------------------------------------------------

/// A TCP relay in front of the target that records, for every connection, the DGST byte of the
/// target's ICResp (the first PDU it sends: 128 bytes, PDU type 0x01, DGST at offset 11, bit 0
/// header digest, bit 1 data digest). Everything else passes through unchanged.
struct DigestProbe {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

impl DigestProbe {
    fn start(target_port: u16) -> DigestProbe {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the probe");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((host, _)) => {
                        host.set_nonblocking(false).unwrap();
                        let Ok(target) = TcpStream::connect(("127.0.0.1", target_port)) else { continue };
                        let _ = host.set_nodelay(true);
                        let _ = target.set_nodelay(true);
                        let seen = seen2.clone();
                        let (h2, t2) = (host.try_clone().unwrap(), target.try_clone().unwrap());
                        std::thread::spawn(move || relay(host, target, None));
                        std::thread::spawn(move || relay(t2, h2, Some(seen)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        DigestProbe { port, seen, stop }
    }

    /// The DGST bytes of the ICResps so far, one per connection.
    fn icresp_digests(&self) -> Vec<u8> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for DigestProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes; with `icresp`, first records the DGST byte of the
/// ICResp at the head of the stream.
fn relay(mut from: TcpStream, mut to: TcpStream, icresp: Option<Arc<Mutex<Vec<u8>>>>) {
    if let Some(seen) = icresp {
        let mut pdu = [0u8; 128];
        if from.read_exact(&mut pdu).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        // Not an ICResp (type 0x01, header length 128): record an impossible value.
        seen.lock().unwrap().push(if pdu[0] == 0x01 && pdu[2] == 128 { pdu[11] } else { 0xff });
        if to.write_all(&pdu).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Asserts that the target agreed to header and data digests on every connection the probe saw
/// (at least `min` of them: the admin queue and an I/O queue).
fn assert_digests_agreed(probe: &DigestProbe, min: usize, what: &str) {
    let d = probe.icresp_digests();
    assert!(d.len() >= min, "{what}: the probe saw {} connection(s), expected at least {min}", d.len());
    assert!(
        d.iter().all(|&b| b == 0x03),
        "{what}: ICResp DGST bytes {d:02x?}: the target did not agree to header and data digests (0x03) everywhere"
    );
}

/// `ferrite perf -w verify` (Ferrite's host: bdev_nvme_attach_controller in its config) on
/// `bdev` of controller Nvme0, attached to `port` with the parameters in `extra` added: `-q QD
/// -o SIZE -t 2` on the client's core. Checks its results: no failed I/O, no miscompare, some
/// I/O done. Returns the IOPS.
fn ferrite_perf_verify(env: &Env, dir: &TempDir, port: u16, bdev: &str, qd: u32, size: u32, extra: &Value) -> f64 {
    let cfg = dir.write_json("ferrite-host.json", &host_config(port, extra));
    let res = dir.join("ferrite-perf.json");
    let _ = std::fs::remove_file(&res);
    let args = common::perf_verify_args(&cfg, bdev, qd, size, &env.client_mask(), &res);
    let out = run_client(dir, Command::new(FERRITE), &args);
    out.assert_ok();
    common::check_verify_results(&res, &format!("ferrite perf verify {bdev} QD {qd} {size} B {extra}"), &out.text())
}

// ---- the tests ----------------------------------------------------------------------------

#[test]
fn perf_randrw_malloc() {
    let Some(env) = Env::get("perf_randrw_malloc") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-perf");
    let port = free_port();
    let mut t = Target::start(&env, &dir, &malloc_config(port), port);
    let p =
        perf(&env, &dir, &Target::trid(port, NQN1), &["-q", "32", "-o", "4096", "-w", "randrw", "-M", "50", "-t", "2"]);
    assert_eq!(p.namespaces.iter().map(|n| n.0).collect::<Vec<_>>(), [1], "{p:?}");
    println!("{:?} target, 4 KiB randrw QD 32: {:.0} IOPS", env.kind, p.iops);
    t.assert_running("spdk_nvme_perf");
    t.stop();
}

#[test]
fn perf_randrw_malloc_with_digests() {
    let Some(env) = Env::get("perf_randrw_malloc_with_digests") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-perf-dgst");
    let port = free_port();
    let mut t = Target::start(&env, &dir, &malloc_config(port), port);
    let probe = DigestProbe::start(port);
    let args = ["-q", "32", "-o", "4096", "-w", "randrw", "-M", "50", "-t", "2", "-H", "-I"];
    let p = perf(&env, &dir, &Target::trid(probe.port, NQN1), &args);
    assert_digests_agreed(&probe, 2, "spdk_nvme_perf -H -I");
    println!("{:?} target, 4 KiB randrw QD 32 with digests: {:.0} IOPS", env.kind, p.iops);
    t.assert_running("spdk_nvme_perf -H -I");
    t.stop();
}

#[test]
fn bdevperf_verify_4k_and_128k() {
    let Some(env) = Env::get("bdevperf_verify_4k_and_128k") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-verify");
    let port = free_port();
    let mut t = Target::start(&env, &dir, &malloc_config(port), port);
    for size in [4096, 131072] {
        let r = bdevperf_verify(&env, &dir, port, size, false);
        println!("{:?} target, bdevperf verify {size} B QD 32: {:.0} IOPS", env.kind, r.iops);
        t.assert_running("bdevperf -w verify");
    }
    t.stop();
}

#[test]
fn bdevperf_verify_with_digests() {
    let Some(env) = Env::get("bdevperf_verify_with_digests") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-verify-dgst");
    let port = free_port();
    let mut t = Target::start(&env, &dir, &malloc_config(port), port);
    for size in [4096, 131072] {
        let probe = DigestProbe::start(port);
        let r = bdevperf_verify(&env, &dir, probe.port, size, true);
        assert_digests_agreed(&probe, 2, &format!("bdevperf verify {size} B with hdgst/ddgst"));
        println!("{:?} target, bdevperf verify {size} B QD 32 with digests: {:.0} IOPS", env.kind, r.iops);
        t.assert_running("bdevperf -w verify with digests");
    }
    t.stop();
}

/// The other direction: Ferrite's NVMe/TCP host (`ferrite perf` over bdev_nvme) writes, reads
/// back and compares through SPDK's nvmf_tgt, whatever NVMF_TARGET says: queue depths 1 to 128,
/// 4 KiB to 1 MiB, 4 KiB and 512 B blocks, with header and data digests (the probe checks
/// SPDK agreed), and with SQ flow control disabled.
#[test]
fn ferrite_host_verifies_through_spdk_nvmf_tgt() {
    let Some(env) = Env::get("ferrite_host_verifies_through_spdk_nvmf_tgt") else { return };
    let env = Env { kind: Kind::Spdk, ..env };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-ferrite-host");
    let port = free_port();
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &["Malloc0", "Malloc1"] };
    let cfg = config(vec![malloc("Malloc0", 16384, 4096), malloc("Malloc1", 131072, 512)], &[s], port, false);
    let mut t = Target::start(&env, &dir, &cfg, port);
    let none = json!({});
    for (bdev, qd, size) in [
        ("Nvme0n1", 1, 4096),
        ("Nvme0n1", 32, 4096),
        ("Nvme0n1", 128, 4096),
        ("Nvme0n1", 16, 131072),
        ("Nvme0n1", 4, 1048576),
        ("Nvme0n2", 32, 8192),
    ] {
        let iops = ferrite_perf_verify(&env, &dir, port, bdev, qd, size, &none);
        println!("SPDK target, ferrite perf verify {bdev} QD {qd} {size} B: {iops:.0} IOPS");
        t.assert_running("ferrite perf -w verify");
    }
    let probe = DigestProbe::start(port);
    let digests = json!({"hdgst": true, "ddgst": true});
    let iops = ferrite_perf_verify(&env, &dir, probe.port, "Nvme0n1", 32, 65536, &digests);
    assert_digests_agreed(&probe, 2, "ferrite perf verify with hdgst/ddgst");
    println!("SPDK target, ferrite perf verify 64 KiB QD 32 with digests: {iops:.0} IOPS");
    let sqflow = json!({"disable_sq_flow_control": true});
    let iops = ferrite_perf_verify(&env, &dir, port, "Nvme0n1", 8, 4096, &sqflow);
    println!("SPDK target, ferrite perf verify 4 KiB QD 8 with SQ flow control disabled: {iops:.0} IOPS");
    t.stop();
    // A target whose I/O queues hold 64 entries (CAP.MQES 63) refuses the 128 the host asks
    // for by default: the host must size its queues to the target's.
    let port = free_port();
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &["Malloc0"] };
    let mut cfg = config(vec![malloc("Malloc0", 16384, 4096)], &[s], port, false);
    cfg["subsystems"][1]["config"][0]["params"]["max_queue_depth"] = json!(64);
    let t = Target::start(&env, &dir, &cfg, port);
    let iops = ferrite_perf_verify(&env, &dir, port, "Nvme0n1", 128, 4096, &none);
    println!("SPDK target with max_queue_depth 64, ferrite perf verify 4 KiB QD 128: {iops:.0} IOPS");
    t.stop();
}

#[test]
fn identify_controller_namespace_and_discovery() {
    let Some(env) = Env::get("identify_controller_namespace_and_discovery") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-identify");
    let port = free_port();
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &["Malloc0"] };
    // 40 MiB of 512-byte blocks: the namespace's size and LBA format both come from the bdev.
    let cfg = config(vec![malloc("Malloc0", 81920, 512)], &[s], port, true);
    let mut t = Target::start(&env, &dir, &cfg, port);
    // spdk_nvme_identify runs without hugepages (--no-huge), like the other clients.
    let core = env.client_core().to_string();
    let identify = |nqn: &str| {
        let args = strings(&["--no-huge", "-s", "1024", "-p", &core, "-r", &Target::trid(port, nqn)]);
        let out = run_spdk(&env, &dir, IDENTIFY, &args);
        out.assert_ok();
        out.stdout
    };

    let ctrlr = identify(NQN1);
    assert_eq!(field(&ctrlr, "Serial Number"), Some(SERIAL), "{ctrlr}");
    assert_eq!(field(&ctrlr, "Model Number"), Some(MODEL), "{ctrlr}");
    assert_eq!(field(&ctrlr, "Subsystem NQN"), Some(NQN1), "{ctrlr}");
    assert!(ctrlr.contains("Namespace ID:1"), "namespace 1 is not listed:\n{ctrlr}");
    // "Size (in LBAs):  81920 (0GiB)"
    let size = field(&ctrlr, "Size (in LBAs)").unwrap_or_else(|| panic!("no namespace size:\n{ctrlr}"));
    assert_eq!(size.split_whitespace().next(), Some("81920"), "{ctrlr}");
    let format =
        ctrlr.lines().find(|l| l.starts_with("LBA Format #00")).unwrap_or_else(|| panic!("no LBA format:\n{ctrlr}"));
    assert_eq!(format.split_whitespace().nth(5), Some("512"), "LBA format: {format}");
    assert!(!ctrlr.contains("Namespace ID:2"), "one namespace expected:\n{ctrlr}");

    let disc = identify(DISCOVERY_NQN);
    assert_eq!(field(&disc, "Subsystem NQN"), Some(DISCOVERY_NQN), "{disc}");
    let entries = discovery_entries(&disc);
    let ours: Vec<&String> =
        entries.iter().filter(|e| field(e, "NVM Subsystem Qualified Name") == Some(NQN1)).collect();
    assert_eq!(ours.len(), 1, "the discovery log page lists {NQN1} {} times:\n{disc}", ours.len());
    let e = ours[0];
    assert!(field(e, "Transport Type").is_some_and(|v| v.starts_with("3 ")), "not TCP: {e}");
    assert!(field(e, "Address Family").is_some_and(|v| v.starts_with("1 ")), "not IPv4: {e}");
    assert!(field(e, "Subsystem Type").is_some_and(|v| v.starts_with("2 ")), "not an NVM subsystem: {e}");
    assert_eq!(field(e, "Transport Address"), Some("127.0.0.1"), "{e}");
    assert_eq!(field(e, "Transport Service Identifier"), Some(port.to_string().as_str()), "{e}");
    t.assert_running("spdk_nvme_identify");
    t.stop();
}

/// bdevperf's aborts (`-k 1 -X`: an I/O outstanding for a second is aborted through bdev_nvme,
/// which sends NVMe Abort on the admin queue) against a namespace whose reads a delay bdev holds
/// for 3 s: the host sees its reads end with Aborted By Request (SPDK's host prints each such
/// completion), long before the delay ran out, and the target keeps serving.
#[test]
fn bdevperf_aborts_reads_held_by_a_delay_bdev() {
    let Some(env) = Env::get("bdevperf_aborts_reads_held_by_a_delay_bdev") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-abort");
    let port = free_port();
    let delay = json!({"method": "bdev_delay_create", "params": {"base_bdev_name": "Malloc0", "name": "Delay0",
        "avg_read_latency": 3_000_000, "p99_read_latency": 3_000_000, "avg_write_latency": 100, "p99_write_latency": 100}});
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &["Delay0"] };
    let mut t = Target::start(&env, &dir, &config(vec![malloc("Malloc0", 4096, 4096), delay], &[s], port, false), port);
    let started = Instant::now();
    let job = ["-q", "4", "-o", "4096", "-w", "randread", "-t", "2", "-k", "1", "-X", "-f"];
    let (out, text) = bdevperf(&env, &dir, port, json!({}), &job);
    out.assert_ok();
    let aborted = text.lines().filter(|l| l.contains("ABORTED - BY REQUEST (00/07)")).count();
    println!("{:?} target: {aborted} reads aborted by request in {:?}", env.kind, started.elapsed());
    assert!(aborted >= 4, "{}: the held reads were not aborted by request:\n{text}", out.what);
    let t_out = parse_bdevperf(&text).unwrap_or_else(|| panic!("{}: no Total line:\n{text}", out.what));
    assert!(t_out.timeout_s > 0.0, "{}: bdevperf saw no timeout, so it sent no abort: {t_out:?}", out.what);
    t.assert_running("bdevperf's aborts");
    t.stop();
}

#[test]
fn two_subsystems_two_namespaces_each() {
    let Some(env) = Env::get("two_subsystems_two_namespaces_each") else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-two");
    let port = free_port();
    let bdevs = vec![
        null("Null1", 131072, 512), // 64 MiB of 512-byte blocks
        malloc("Malloc1", 8192, 4096),
        null("Null2", 16384, 4096),
        malloc("Malloc2", 65536, 512),
    ];
    let subsystems = [
        Subsystem { nqn: NQN1, serial: "FERRITE0001", model: MODEL, namespaces: &["Null1", "Malloc1"] },
        Subsystem { nqn: NQN2, serial: "FERRITE0002", model: MODEL, namespaces: &["Null2", "Malloc2"] },
    ];
    let mut t = Target::start(&env, &dir, &config(bdevs, &subsystems, port, false), port);
    for nqn in [NQN1, NQN2] {
        let p = perf(
            &env,
            &dir,
            &Target::trid(port, nqn),
            &["-q", "16", "-o", "4096", "-w", "randrw", "-M", "50", "-t", "2"],
        );
        let mut ids: Vec<u32> = p.namespaces.iter().map(|n| n.0).collect();
        ids.sort();
        assert_eq!(ids, [1, 2], "{nqn}: both namespaces must do I/O: {p:?}");
        println!("{:?} target, {nqn}: {:?}", env.kind, p.namespaces);
        t.assert_running("spdk_nvme_perf");
    }
    t.stop();
}

/// Calls `method` on the target's RPC socket (Ferrite's or SPDK's: the same JSON-RPC) and
/// expects success.
fn target_rpc(dir: &TempDir, method: &str, params: Value) -> Value {
    let mut c = RpcClient::connect(&dir.join("target.sock"), Duration::from_secs(30)).expect("connect to the target");
    common::call(&mut c, method, Some(params))
}

/// Writes done on `bdev` so far, by the target's `bdev_get_iostat`.
fn writes_done(dir: &TempDir, bdev: &str) -> u64 {
    let v = target_rpc(dir, "bdev_get_iostat", json!({"names": [bdev]}));
    v["bdevs"][0]["num_write_ops"].as_u64().unwrap_or_else(|| panic!("bdev_get_iostat {bdev}: {v}"))
}

/// Waits until more than `than` writes reached `bdev` (I/O is flowing); the new count.
fn writes_beyond(dir: &TempDir, bdev: &str, than: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = writes_done(dir, bdev);
        if n > than {
            return n;
        }
        assert!(Instant::now() < deadline, "no write reached {bdev} in 20 s (still {n})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything namespace `bdev` (Nvme0nN) of subsystem NQN1 reads, copied by SPDK's spdk_dd
/// (bdev_nvme over NVMe/TCP) into a file, and that file's bytes.
fn dd_read(env: &Env, dir: &TempDir, port: u16, bdev: &str) -> Vec<u8> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let attach = attach_params(port);
    let cfg = dir.write_json(
        "dd.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_nvme_attach_controller", "params": attach}]}]}),
    );
    let file = dir.join(&format!("{bdev}-{}.img", NEXT.fetch_add(1, Ordering::SeqCst)));
    let mask = env.client_mask();
    let args = strings(&[
        "--no-huge",
        "-s",
        "1024",
        "-m",
        &mask,
        "--disable-cpumask-locks",
        "--no-rpc-server",
        "--json",
        cfg.to_str().unwrap(),
        "--ib",
        bdev,
        "--of",
        file.to_str().unwrap(),
        "--bs",
        "1048576",
    ]);
    run_spdk(env, dir, DD, &args).assert_ok();
    std::fs::read(&file).unwrap_or_else(|e| panic!("spdk_dd wrote no {}: {e}", file.display()))
}

/// Thin lvols over NVMe/TCP, as Mayastor serves them: SPDK's bdevperf verifies a thin lvol
/// (bdev_nvme, 4 KiB, QD 32) while the test takes three snapshots of it under that load (each
/// once writes are seen flowing, and writes must flow again after it). Then a clone of the last
/// snapshot and the snapshot itself are added as namespaces 2 and 3 while nothing is connected;
/// spdk_dd reads them over NVMe/TCP: the clone reads exactly as the snapshot (which holds the
/// verify's data). bdevperf then verifies the clone with data of its own, after which the
/// snapshot and the lvol read exactly as before and the clone differs.
#[test]
fn thin_lvol_snapshots_under_verify_and_a_clone_over_nvmf() {
    let test = "thin_lvol_snapshots_under_verify_and_a_clone_over_nvmf";
    let Some(env) = Env::get(test) else { return };
    let _serial = one_at_a_time();
    let dir = TempDir::new("nvmf-lvol");
    let port = free_port();
    let s = Subsystem { nqn: NQN1, serial: SERIAL, model: MODEL, namespaces: &[] };
    // 256 MiB: room for the lvol's 24 clusters four times over (each snapshot keeps what the
    // lvol had, and the verify writes it all again).
    let mut t = Target::start(&env, &dir, &config(vec![malloc("Malloc0", 65536, 4096)], &[s], port, false), port);
    let lvs = json!({"bdev_name": "Malloc0", "lvs_name": "lvs0", "cluster_sz": 1048576});
    target_rpc(&dir, "bdev_lvol_create_lvstore", lvs);
    let vol = json!({"lvs_name": "lvs0", "lvol_name": "vol", "size_in_mib": 24, "thin_provision": true});
    target_rpc(&dir, "bdev_lvol_create", vol);
    let add_ns =
        |bdev: &str| target_rpc(&dir, "nvmf_subsystem_add_ns", json!({"nqn": NQN1, "namespace": {"bdev_name": bdev}}));
    assert_eq!(add_ns("lvs0/vol"), json!(1));

    let job = ["-q", "32", "-o", "4096", "-w", "verify", "-t", "8", "-T", "Nvme0n1"];
    let (out, text) = std::thread::scope(|scope| {
        let run = scope.spawn(|| bdevperf(&env, &dir, port, json!({}), &job));
        writes_beyond(&dir, "lvs0/vol", 0);
        for i in 1..=3 {
            let snap = json!({"lvol_name": "lvs0/vol", "snapshot_name": format!("snap{i}")});
            target_rpc(&dir, "bdev_lvol_snapshot", snap);
            writes_beyond(&dir, "lvs0/vol", writes_done(&dir, "lvs0/vol"));
            std::thread::sleep(Duration::from_secs(1));
        }
        run.join().expect("the bdevperf thread")
    });
    let r = assert_verified(&out, &text, "Nvme0n1");
    println!("{:?} target: bdevperf verify on a thin lvol across 3 snapshots: {:.0} IOPS", env.kind, r.iops);
    t.assert_running("bdevperf verify across snapshots");

    target_rpc(&dir, "bdev_lvol_clone", json!({"snapshot_name": "lvs0/snap3", "clone_name": "clone"}));
    assert_eq!(add_ns("lvs0/clone"), json!(2));
    assert_eq!(add_ns("lvs0/snap3"), json!(3));
    let snap = dd_read(&env, &dir, port, "Nvme0n3");
    let clone = dd_read(&env, &dir, port, "Nvme0n2");
    let vol = dd_read(&env, &dir, port, "Nvme0n1");
    assert_eq!(snap.len(), 24 << 20, "the snapshot's size");
    assert!(snap.iter().filter(|&&b| b != 0).count() > snap.len() / 8, "the verify left little data in the snapshot");
    assert!(clone == snap, "the clone does not read as its snapshot");

    // -U: data of its own for every write (the verify's pattern otherwise depends on the offset
    // alone, and would write into the clone what it already holds).
    let job = ["-q", "32", "-o", "4096", "-w", "verify", "-t", "2", "-U", "-T", "Nvme0n2"];
    let (out, text) = bdevperf(&env, &dir, port, json!({}), &job);
    assert_verified(&out, &text, "Nvme0n2");
    assert!(dd_read(&env, &dir, port, "Nvme0n3") == snap, "the clone's writes changed its snapshot");
    assert!(dd_read(&env, &dir, port, "Nvme0n1") == vol, "the clone's writes changed the lvol");
    assert!(dd_read(&env, &dir, port, "Nvme0n2") != clone, "the verify left the clone as it was");
    t.assert_running("the clone's verify");
    t.stop();
}

// ---- the parsers, on output captured from SPDK v26.05 (run without SPDK too) --------------

#[test]
fn parsers_read_spdk_output() {
    let perf_out = "Initializing NVMe Controllers
Attached to NVMeoF Controller at TCP (addr:127.0.0.1 subnqn:nqn.2016-06.io.spdk:cnode1)
Associating TCP (addr:127.0.0.1 subnqn:nqn.2016-06.io.spdk:cnode1) NSID 1 with lcore 1
Associating TCP (addr:127.0.0.1 subnqn:nqn.2016-06.io.spdk:cnode1) NSID 2 with lcore 1
Initialization complete. Launching workers.
========================================================
                                                                                                              Latency(us)
Device Information                                                        :       IOPS      MiB/s    Average        min        max
TCP (addr:127.0.0.1 subnqn:nqn.2016-06.io.spdk:cnode1) NSID 1 from core  1:   37642.33     147.04      26.55      14.82    8062.97
TCP (addr:127.0.0.1 subnqn:nqn.2016-06.io.spdk:cnode1) NSID 2 from core  1:   37000.00     144.53      27.00      14.00    8000.00
========================================================
Total                                                                     :   74642.33     291.57      26.77      14.00    8062.97
";
    let p = parse_perf(perf_out).unwrap();
    assert_eq!(p.namespaces, [(1, 37642.33), (2, 37000.0)]);
    assert_eq!((p.iops, p.mib_s, p.mean_us), (74642.33, 291.57, 26.77));
    assert!(parse_perf("Initializing NVMe Controllers\n").is_none());

    let bdevperf_out = "Running I/O for 3 seconds...\r    10648.00 IOPS,  1331.00 MiB/s\r
                                                                                                Latency(us)
 Device Information          : runtime(s)       IOPS      MiB/s     Fail/s     TO/s    Average        min        max
Job: Nvme0n1 (Core Mask 0x2, workload: verify, depth: 32, IO size: 131072)
\t Verification LBA range: start 0x0 length 0x200
\t Nvme0n1             :       3.00   12149.63    1518.70       0.00     0.00    2616.01     217.73   13631.77
 ===================================================================================================================
 Total                       :              12149.63    1518.70       0.00     0.00    2616.01     217.73   13631.77
"
    .replace('\r', "\n");
    let t = parse_bdevperf(&bdevperf_out).unwrap();
    assert_eq!((t.iops, t.fail_s, t.timeout_s), (12149.63, 0.0, 0.0));
    let failing =
        bdevperf_out.replace("1518.70       0.00     0.00    2616.01", "1518.70      12.50     0.00    2616.01");
    assert_eq!(parse_bdevperf(&failing).unwrap().fail_s, 12.5);

    let identify_out = "Serial Number:                         FERRITE0001
Model Number:                          Ferrite test
Discovery Log Page
==================
Discovery Log Entry 0
----------------------
Subsystem Type:                        3 (Current Discovery Subsystem)
NVM Subsystem Qualified Name:          nqn.2014-08.org.nvmexpress.discovery
Discovery Log Entry 1
----------------------
Subsystem Type:                        2 (NVM Subsystem)
Transport Service Identifier:          4520                            
NVM Subsystem Qualified Name:          nqn.2016-06.io.spdk:cnode1
Transport Address:                     127.0.0.1                                  
";
    assert_eq!(field(identify_out, "Serial Number"), Some("FERRITE0001"));
    assert_eq!(field(identify_out, "Model Number"), Some("Ferrite test"));
    let e = discovery_entries(identify_out);
    assert_eq!(e.len(), 2);
    assert_eq!(field(&e[1], "Transport Service Identifier"), Some("4520"));
    assert_eq!(field(&e[1], "NVM Subsystem Qualified Name"), Some(NQN1));
    assert_eq!(field(&e[1], "Transport Address"), Some("127.0.0.1"));
}
