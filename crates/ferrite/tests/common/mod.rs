//! Helpers shared by the `ferrite` binary's integration tests: temporary directories, a daemon
//! guard that always kills its process, child-process helpers and JSON-RPC shortcuts.
#![allow(dead_code)]

use ferrite_rpc::client::{CallError, RpcClient};
use ferrite_rpc::RpcError;
use serde_json::{json, Value};
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Path of the binary under test.
pub const FERRITE: &str = env!("CARGO_BIN_EXE_ferrite");

/// How long a daemon may take to start serving.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Timeout of every RPC reply in the tests.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `/tmp/ferrite-it-<pid>-<n>-<tag>` (short enough for unix socket paths).
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("ferrite-it-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates a file of `len` bytes, each `byte`, and returns its path.
    pub fn file_filled(&self, name: &str, len: usize, byte: u8) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, vec![byte; len]).expect("write backing file");
        p
    }

    /// Writes `doc` as JSON to `name` and returns its path.
    pub fn write_json(&self, name: &str, doc: &Value) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(doc).unwrap()).expect("write json");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A child process that is SIGKILLed (and reaped) on drop if it is still running, so that a
/// failed assertion never leaks a process.
pub struct Proc {
    pub child: Child,
    /// Where its stdout and stderr go (files, so the child never blocks on a full pipe).
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
    pub started: Instant,
}

impl Proc {
    /// Spawns `ferrite args...` with stdout and stderr captured to files in `dir`, named after
    /// `tag`.
    pub fn spawn(dir: &TempDir, tag: &str, args: &[&str]) -> Proc {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let stdout_path = dir.join(&format!("{tag}-{n}.stdout"));
        let stderr_path = dir.join(&format!("{tag}-{n}.stderr"));
        let child = Command::new(FERRITE)
            .args(args)
            .env_remove("FERRITE_LOG")
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path).unwrap())
            .stderr(File::create(&stderr_path).unwrap())
            .spawn()
            .expect("spawn ferrite");
        Proc { child, stdout_path, stderr_path, started: Instant::now() }
    }

    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Sends `sig` to the process (if it has not been reaped yet).
    pub fn signal(&mut self, sig: libc::c_int) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill with the pid of our own unreaped child.
            let rc = unsafe { libc::kill(self.pid(), sig) };
            assert_eq!(rc, 0, "kill({}, {sig}): {}", self.pid(), std::io::Error::last_os_error());
        }
    }

    /// Sends SIGTERM.
    pub fn sigterm(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `timeout` for the process to exit; panics (the guard then kills it) if it
    /// does not.
    pub fn expect_exit(&mut self, timeout: Duration, what: &str) -> ExitStatus {
        match self.wait_timeout(timeout) {
            Some(st) => st,
            None => panic!("{what}: still running after {timeout:?}; stderr:\n{}", self.stderr()),
        }
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill(); // SIGKILL
            let _ = self.child.wait();
        }
    }
}

/// A running `ferrite serve` with its own socket.
pub struct Daemon {
    pub proc: Proc,
    pub sock: PathBuf,
}

impl Daemon {
    /// Starts `ferrite serve -m 0x1 -r <dir>/rpc.sock --reactor-mode interrupt [extra...]` and
    /// waits until its socket accepts connections.
    pub fn start(dir: &TempDir, extra: &[&str]) -> Daemon {
        Self::start_with(dir, "rpc.sock", "0x1", extra)
    }

    /// Like [`Daemon::start`] with a chosen socket file name and core mask.
    pub fn start_with(dir: &TempDir, sock_name: &str, cpumask: &str, extra: &[&str]) -> Daemon {
        let mut d = Self::spawn(dir, sock_name, cpumask, extra);
        d.wait_ready();
        d
    }

    /// Spawns the daemon without waiting for it.
    pub fn spawn(dir: &TempDir, sock_name: &str, cpumask: &str, extra: &[&str]) -> Daemon {
        let sock = dir.join(sock_name);
        let sock_s = sock.to_str().unwrap().to_string();
        let mut args = vec!["serve", "-m", cpumask, "-r", &sock_s, "--reactor-mode", "interrupt"];
        args.extend_from_slice(extra);
        let tag = format!("serve-{}", sock_name.trim_end_matches(".sock").replace('/', "_"));
        Daemon { proc: Proc::spawn(dir, &tag, &args), sock }
    }

    /// Polls the socket until it accepts a connection (panics after [`START_TIMEOUT`] or if the
    /// daemon exits first).
    pub fn wait_ready(&mut self) {
        wait_for_socket(&mut self.proc, &self.sock, START_TIMEOUT);
    }

    /// A new connection.
    pub fn client(&self) -> RpcClient {
        RpcClient::connect(&self.sock, RPC_TIMEOUT).expect("connect to daemon")
    }

    /// Calls `method` on a new connection and expects success.
    pub fn call(&self, method: &str, params: Option<Value>) -> Value {
        call(&mut self.client(), method, params)
    }

    /// Calls `method` on a new connection and expects a JSON-RPC error.
    pub fn call_err(&self, method: &str, params: Option<Value>) -> RpcError {
        call_err(&mut self.client(), method, params)
    }

    /// Every bdev, by `bdev_get_bdevs`.
    pub fn bdevs(&self) -> Vec<Value> {
        self.call("bdev_get_bdevs", None).as_array().expect("bdev_get_bdevs returns an array").clone()
    }

    /// Names of every bdev.
    pub fn bdev_names(&self) -> Vec<String> {
        self.bdevs().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect()
    }

    /// Asserts the daemon still serves: `bdev_get_bdevs` on a new connection succeeds.
    pub fn assert_serving(&self) {
        let mut c = RpcClient::connect(&self.sock, RPC_TIMEOUT)
            .unwrap_or_else(|e| panic!("daemon refuses connections: {e}; stderr:\n{}", self.proc.stderr()));
        let v = c
            .call("bdev_get_bdevs", None)
            .unwrap_or_else(|e| panic!("daemon stopped serving: {e}; stderr:\n{}", self.proc.stderr()));
        assert!(v.is_array(), "{v}");
    }

    /// Runs `ferrite rpc -s <sock> args...`.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut all = vec!["rpc", "-s", self.sock.to_str().unwrap(), "-t", "10"];
        all.extend_from_slice(args);
        run_ferrite(&all)
    }
}

/// Polls `sock` until it accepts a connection; panics if `owner` exits first or after `timeout`.
pub fn wait_for_socket(owner: &mut Proc, sock: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if UnixStream::connect(sock).is_ok() {
            return;
        }
        if let Some(st) = owner.child.try_wait().expect("try_wait") {
            panic!("ferrite exited ({st}) before {} accepted connections; stderr:\n{}", sock.display(), owner.stderr());
        }
        if Instant::now() >= deadline {
            panic!("{} did not accept connections within {timeout:?}; stderr:\n{}", sock.display(), owner.stderr());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `ferrite args...` to completion (bounded by the process's own behaviour; used for
/// short-lived commands such as `ferrite rpc`).
pub fn run_ferrite(args: &[&str]) -> Output {
    Command::new(FERRITE).args(args).env_remove("FERRITE_LOG").stdin(Stdio::null()).output().expect("run ferrite")
}

/// Calls and expects success.
pub fn call(c: &mut RpcClient, method: &str, params: Option<Value>) -> Value {
    match c.call(method, params.clone()) {
        Ok(v) => v,
        Err(e) => panic!("{method} {params:?} failed: {e}"),
    }
}

/// Calls and expects a JSON-RPC error response.
pub fn call_err(c: &mut RpcClient, method: &str, params: Option<Value>) -> RpcError {
    match c.call(method, params.clone()) {
        Ok(v) => panic!("{method} {params:?} succeeded with {v}, expected an error"),
        Err(CallError::Rpc(e)) => e,
        Err(e) => panic!("{method} {params:?}: expected an error response, got {e}"),
    }
}

/// The bdev named `name` in a `bdev_get_bdevs` result.
pub fn find_bdev<'a>(bdevs: &'a [Value], name: &str) -> Option<&'a Value> {
    bdevs.iter().find(|b| b["name"] == name)
}

/// Decodes stdout/stderr of a finished command.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// SPDK v26.05 unpacked by ../shared/anchors/spdk.sh ($SPDK_DIR), if it is set, and its
/// programs run on this CPU (a build made with -march of a CPU with AVX-512 dies of SIGILL
/// before main on one without: the tests that need its programs then say SKIP with that reason).
pub fn spdk_dir() -> Result<PathBuf, String> {
    static RUNS: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    RUNS.get_or_init(|| {
        let dir = spdk_python_dir()?;
        let tgt = dir.join("build/bin/spdk_tgt");
        let status = Command::new(&tgt)
            .arg("--help")
            .env("LD_LIBRARY_PATH", dir.join("build/lib"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("{}: {e}", tgt.display()))?;
        match std::os::unix::process::ExitStatusExt::signal(&status) {
            Some(sig) => Err(format!(
                "SPDK's programs do not run on this CPU ({} --help: killed by signal {sig}; the build uses \
                 instructions this CPU lacks, e.g. AVX-512)",
                tgt.display()
            )),
            None => Ok(dir),
        }
    })
    .clone()
}

/// [`spdk_dir`] for test `test`, or None after printing why it is skipped.
pub fn spdk_or_skip(test: &str) -> Option<PathBuf> {
    match spdk_dir() {
        Ok(d) => Some(d),
        Err(why) => {
            println!("SKIP {test}: {why}");
            None
        }
    }
}

/// $SPDK_DIR when it holds an SPDK build, for what needs only its python client (rpc.py), which
/// runs on any CPU.
pub fn spdk_python_dir() -> Result<PathBuf, String> {
    let dir = std::env::var("SPDK_DIR").map_err(|_| "SPDK_DIR is not set (scripts/test.sh sets it)".to_string())?;
    let dir = PathBuf::from(dir);
    if !dir.join("build/bin/spdk_tgt").exists() {
        return Err(format!("{} has no build/bin/spdk_tgt", dir.display()));
    }
    Ok(dir)
}

/// Writes `request` on a new connection to `sock` and returns the first reply line, raw (so
/// that tests can check the exact bytes, e.g. of a large id).
pub fn raw_call(sock: &Path, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(RPC_TIMEOUT)).unwrap();
    s.write_all(request).expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.contains(&b'\n') {
        let n = s.read(&mut chunk).unwrap_or_else(|e| panic!("no reply to {}: {e}", text(request)));
        assert!(n > 0, "connection closed before a reply to {}", text(request));
        buf.extend_from_slice(&chunk[..n]);
    }
    let end = buf.iter().position(|&b| b == b'\n').unwrap();
    text(&buf[..end])
}

/// The arguments of `ferrite perf -w verify -t 2` on `bdev` (from the JSON config `cfg`) at
/// queue depth `qd` and I/O size `size`, on the cores of `mask`, writing its results to `res`.
pub fn perf_verify_args(cfg: &Path, bdev: &str, qd: u32, size: u32, mask: &str, res: &Path) -> Vec<String> {
    let (cfg, res) = (cfg.to_str().unwrap(), res.to_str().unwrap());
    let (qd, size) = (qd.to_string(), size.to_string());
    let args = ["perf", "--json", cfg, "-T", bdev, "-q", &qd, "-o", &size, "-w", "verify", "-t", "2", "-m", mask];
    args.iter().chain(&["--no-pin", "--results-json", res]).map(|s| s.to_string()).collect()
}

/// Checks the results `ferrite perf -w verify` wrote to `res` (`what` names the run, `log` is
/// its output, shown on failure): no failed I/O, no miscompare, some I/O on every job. Returns
/// the total IOPS.
pub fn check_verify_results(res: &Path, what: &str, log: &str) -> f64 {
    let text = std::fs::read_to_string(res).unwrap_or_else(|e| panic!("{what}: no results ({e}):\n{log}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: results: {e}\n{log}"));
    for r in doc["results"].as_array().expect("results") {
        assert_eq!(r["io_failed"], Value::from(0), "{what}: failed I/O: {r}\n{log}");
        assert_eq!(r["verify_errors"], Value::from(0), "{what}: miscompares: {r}");
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{what}: no I/O: {r}");
    }
    doc["total"]["iops"].as_f64().unwrap_or(0.0)
}

/// The entries of method `method` in a `save_config` answer, in order.
pub fn saved_entries<'a>(saved: &'a Value, method: &str) -> Vec<&'a Value> {
    saved["subsystems"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["config"].as_array().into_iter().flatten())
        .filter(|e| e["method"] == method)
        .collect()
}

/// Hugepages reserved for a test, given back when dropped (`nr_hugepages` is set back to what
/// it was).
pub struct Hugepages {
    before: u64,
}

impl Hugepages {
    /// Raises `/proc/sys/vm/nr_hugepages` to `pages` (2 MiB each) if it is lower, mounting
    /// hugetlbfs at /dev/hugepages if none is mounted; fails (with the reason, for a SKIP) when
    /// it cannot (not root) or when fewer than half of them are free afterwards.
    pub fn reserve(pages: u64) -> Result<Hugepages, String> {
        let path = "/proc/sys/vm/nr_hugepages";
        let before: u64 =
            std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?.trim().parse().unwrap_or(0);
        if !Path::new("/dev/hugepages").exists() {
            std::fs::create_dir_all("/dev/hugepages").map_err(|e| format!("/dev/hugepages: {e}"))?;
        }
        let mounted = std::fs::read_to_string("/proc/mounts").unwrap_or_default().contains("hugetlbfs");
        if !mounted {
            let ok = Command::new("mount")
                .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err("cannot mount hugetlbfs at /dev/hugepages (not root?)".into());
            }
        }
        if before < pages {
            std::fs::write(path, pages.to_string())
                .map_err(|e| format!("cannot reserve hugepages: {e} (not root?)"))?;
        }
        let free: u64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("HugePages_Free:").map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0);
        let h = Hugepages { before };
        if free < pages / 2 {
            return Err(format!("only {free} hugepages free after asking for {pages}"));
        }
        Ok(h)
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", self.before.to_string());
    }
}

/// SPDK's bdevperf, `-w verify -q 32 -o IO_SIZE` for `secs` seconds on core 1, attached over
/// NVMe/TCP to 127.0.0.1:`port`, subsystem `nqn`; `mid_run` runs `after` into the run (a fault
/// injected while the I/O goes on). Checks that bdevperf verified: exit status 0, no
/// miscompare or error line, some I/O, no failed or timed-out I/O. Returns its output.
#[allow(clippy::too_many_arguments)]
pub fn bdevperf_verify_over_nvmf(
    spdk: &Path,
    dir: &TempDir,
    port: u16,
    nqn: &str,
    io_size: u32,
    secs: u32,
    after: Duration,
    mid_run: impl FnOnce(),
) -> String {
    let cfg = dir.write_json(
        "bdevperf.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "TCP", "adrfam": "IPv4",
                "traddr": "127.0.0.1", "trsvcid": port.to_string(), "subnqn": nqn}},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    let proc = Command::new(spdk.join("build/examples/bdevperf"))
        .args([
            "--json",
            cfg.to_str().unwrap(),
            "-q",
            "32",
            "-o",
            &io_size.to_string(),
            "-w",
            "verify",
            "-t",
            &secs.to_string(),
        ])
        .args(["-m", "0x2", "--disable-cpumask-locks", "--no-pci", "--no-huge", "-s", "1024"])
        .arg("-r")
        .arg(dir.join("bdevperf.sock"))
        .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bdevperf runs");
    std::thread::sleep(after);
    mid_run();
    let out = proc.wait_with_output().expect("bdevperf ends");
    let text = format!("{}{}", text(&out.stdout), text(&out.stderr)).replace('\r', "\n");
    assert!(out.status.success(), "bdevperf: {text}");
    for bad in ["Buffer mismatch", "miscompare", "Miscompare", "verify failed", "ERROR"] {
        assert!(!text.contains(bad), "{bad:?} in bdevperf's output:\n{text}");
    }
    let total = text
        .lines()
        .rfind(|l| l.trim_start().starts_with("Total") && l.contains(':'))
        .unwrap_or_else(|| panic!("no Total line:\n{text}"));
    let v: Vec<f64> = total.split(':').nth(1).unwrap().split_whitespace().filter_map(|x| x.parse().ok()).collect();
    assert!(v.len() >= 4 && v[0] > 0.0 && v[2] == 0.0 && v[3] == 0.0, "IOPS, MiB/s, Fail/s, TO/s: {total}");
    text
}

/// Exports `bdev` of the daemon `d` over NVMe/TCP on 127.0.0.1 as subsystem `nqn` (any host);
/// the port, a free one.
pub fn nvmf_export(d: &Daemon, bdev: &str, nqn: &str) -> u16 {
    let port = free_port();
    d.call("nvmf_create_transport", Some(json!({"trtype": "TCP"})));
    d.call("nvmf_create_subsystem", Some(json!({"nqn": nqn, "allow_any_host": true, "serial_number": "FERRITE01"})));
    d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": nqn, "namespace": {"bdev_name": bdev}})));
    d.call(
        "nvmf_subsystem_add_listener",
        Some(json!({"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string()}})),
    );
    port
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}
