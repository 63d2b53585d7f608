//! Helpers shared by the NBD integration tests (`nbd_*.rs`): a daemon with NBD servers on a TCP
//! port and a unix socket, running real clients (qemu-io, nbdinfo, nbdcopy, qemu-img, fio) with
//! a time limit, and a raw NBD client speaking the protocol by hand.
//!
//! Test files use it with `mod common; mod nbd_common;`.
#![allow(dead_code)]

use crate::common::{Daemon, TempDir};
use ferrite_nbd::proto::*;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a raw client waits for any one reply.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(5);

/// True if every binary in `bins` is on the PATH; otherwise prints `SKIP <test>: <bin> not
/// installed` and returns false (the caller then returns).
pub fn have(test: &str, bins: &[&str]) -> bool {
    for b in bins {
        let found = Command::new("which")
            .arg(b)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !found {
            println!("SKIP {test}: {b} not installed");
            return false;
        }
    }
    true
}

/// The one in common, here too for the tests that import it from this module.
#[allow(unused_imports)]
pub use crate::common::free_port;

/// Starts `d`'s NBD server on a port of its choosing and exports `bdev` as `name`; the export's
/// nbd:// URI.
pub fn export_nbd(d: &Daemon, bdev: &str, name: &str) -> String {
    let s = d.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = s["address"].as_str().expect("the bound address").to_string();
    d.call("nbd_server_add_export", Some(json!({"bdev_name": bdev, "name": name})));
    format!("nbd://{addr}/{name}")
}

/// A running daemon with one NBD server on 127.0.0.1:`port` and one on the unix socket `unix`.
pub struct NbdDaemon {
    pub d: Daemon,
    pub port: u16,
    pub tcp: String,
    pub unix: PathBuf,
}

impl NbdDaemon {
    /// Starts `ferrite serve -m <cpumask> --no-pin` and NBD servers on a TCP port the kernel
    /// picks (port 0; the result tells which) and on `<dir>/nbd.sock`.
    pub fn start(dir: &TempDir, cpumask: &str) -> NbdDaemon {
        Self::start_opts(dir, cpumask, json!({}))
    }

    /// Like [`NbdDaemon::start`], with extra `nbd_server_start` parameters (e.g.
    /// `handshake_max_seconds`) for both servers.
    pub fn start_opts(dir: &TempDir, cpumask: &str, extra: Value) -> NbdDaemon {
        Self::start_full(dir, cpumask, extra, &["--no-pin"])
    }

    /// Like [`NbdDaemon::start_opts`], with these `ferrite serve` arguments.
    pub fn start_full(dir: &TempDir, cpumask: &str, extra: Value, args: &[&str]) -> NbdDaemon {
        let d = Daemon::start_with(dir, "rpc.sock", cpumask, args);
        let unix = dir.join("nbd.sock");
        let with = |address: &str| {
            let mut p = extra.clone();
            p["address"] = json!(address);
            p
        };
        let v = d.call("nbd_server_start", Some(with(unix.to_str().unwrap())));
        assert_eq!(v, json!({"address": unix.to_str().unwrap()}), "nbd_server_start on a unix path");
        let v = d.call("nbd_server_start", Some(with("127.0.0.1:0")));
        let tcp = v["address"].as_str().unwrap_or_else(|| panic!("nbd_server_start result {v}")).to_string();
        let port: u16 = tcp.strip_prefix("127.0.0.1:").and_then(|p| p.parse().ok()).expect("bound port");
        assert_ne!(port, 0, "{v}");
        NbdDaemon { d, port, tcp, unix }
    }

    /// Creates a malloc bdev.
    pub fn malloc(&self, name: &str, num_blocks: u64, block_size: u32) {
        self.d.call(
            "bdev_malloc_create",
            Some(json!({"name": name, "num_blocks": num_blocks, "block_size": block_size})),
        );
    }

    /// Exports `bdev` as `name` and returns the export name the daemon reports.
    pub fn export(&self, bdev: &str, name: &str, read_only: bool, description: &str) -> String {
        let v = self.d.call(
            "nbd_server_add_export",
            Some(json!({"bdev_name": bdev, "name": name, "read_only": read_only, "description": description})),
        );
        assert_eq!(v, json!(name), "nbd_server_add_export returns the export name");
        name.to_string()
    }

    /// `nbd://127.0.0.1:PORT/name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd://{}/{name}", self.tcp)
    }

    /// `nbd+unix:///name?socket=PATH`.
    pub fn unix_uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.unix.display())
    }

    /// `nbd_server_get_connections`.
    pub fn connections(&self) -> Vec<Value> {
        self.d.call("nbd_server_get_connections", None).as_array().expect("connections array").clone()
    }

    /// `nbd_server_get_exports`.
    pub fn exports(&self) -> Vec<Value> {
        self.d.call("nbd_server_get_exports", None).as_array().expect("exports array").clone()
    }

    /// Polls `nbd_server_get_connections` until `pred` holds (panics after 5 s).
    pub fn wait_connections(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.wait_connections_within(what, Duration::from_secs(5), pred)
    }

    /// Like [`NbdDaemon::wait_connections`], waiting at most `limit`.
    pub fn wait_connections_within(&self, what: &str, limit: Duration, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let c = self.connections();
            if pred(&c) {
                return c;
            }
            if Instant::now() >= deadline {
                panic!("{what}: connections are {c:?}; stderr:\n{}", self.d.proc.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts the NBD server still serves export `name` to a fresh client over TCP: a raw
    /// handshake with NBD_OPT_GO and one read of the first block succeed. Also checks the
    /// JSON-RPC server answers.
    pub fn assert_serves(&self, name: &str) {
        self.d.assert_serving();
        let (mut c, info) = Raw::open(self.port, name, false);
        let n = info.min_block.max(512);
        let _ = c.read_ok(0xfeed, 0, n);
        c.disc();
    }
}

/// What a finished client printed.
pub struct ToolOut {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl ToolOut {
    /// Panics with the whole output unless the tool exited 0.
    pub fn assert_ok(&self, what: &str) -> &Self {
        assert!(self.status.success(), "{what}: {}\nstdout:\n{}\nstderr:\n{}", self.status, self.stdout, self.stderr);
        self
    }
}

/// A client process, in its own process group, that is SIGKILLed (with everything it forked, such
/// as fio's job processes) on drop if still running.
pub struct Tool {
    pub child: Child,
    pub what: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Tool {
    /// Spawns `prog args...` in `dir`, in a new process group, with stdout and stderr going to
    /// files in `dir`.
    pub fn spawn(dir: &TempDir, prog: &str, args: &[&str]) -> Tool {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let stdout = dir.join(&format!("{prog}-{n}.stdout"));
        let stderr = dir.join(&format!("{prog}-{n}.stderr"));
        let child = Command::new(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .current_dir(dir.path()) // fio leaves *-verify.state files in its working directory
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
        Tool { child, what: format!("{prog} {}", args.join(" ")), stdout, stderr }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit; panics (killing it) if it does not.
    pub fn wait(mut self, timeout: Duration) -> ToolOut {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return ToolOut { status, stdout: read_lossy(&self.stdout), stderr: read_lossy(&self.stderr) };
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "{} did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                    self.what,
                    read_lossy(&self.stdout),
                    read_lossy(&self.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the process and its process group (children it forked), and reaps it.
    pub fn kill(&mut self) {
        if self.running() {
            // SAFETY: kill(2) on the process group of our own unreaped child (its pid).
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_lossy(p: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned()
}

/// Runs `prog args...` to completion within `timeout`.
pub fn run_tool(dir: &TempDir, prog: &str, args: &[&str], timeout: Duration) -> ToolOut {
    Tool::spawn(dir, prog, args).wait(timeout)
}

/// Runs `qemu-io -f raw -c cmd... uri` and returns its stdout, failing the test if it exits
/// non-zero or reports a failed pattern check or any failed command (qemu-io does not always
/// set its exit code for those).
pub fn qemu_io(dir: &TempDir, uri: &str, cmds: &[String]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(uri);
    let out = run_tool(dir, "qemu-io", &args, Duration::from_secs(60));
    out.assert_ok("qemu-io");
    let all = format!("{}\n{}", out.stdout, out.stderr);
    for bad in ["Pattern verification failed", "failed", "error", "Error"] {
        assert!(!all.contains(bad), "qemu-io on {uri} reported {bad:?}:\n{all}");
    }
    // Every command produced its line ("wrote", "read", "discard", ...): count the I/O ones.
    let io_cmds = cmds.iter().filter(|c| !c.contains("flush")).count();
    let io_lines = out.stdout.lines().filter(|l| l.contains(" bytes at offset ")).count();
    assert_eq!(io_lines, io_cmds, "qemu-io ran fewer commands than given:\n{all}");
    out.stdout
}

/// [`qemu_io`] with the commands in one string, separated by "; ".
pub fn qemu_io_script(dir: &TempDir, uri: &str, script: &str) -> String {
    let cmds: Vec<String> = script.split("; ").map(str::to_string).collect();
    qemu_io(dir, uri, &cmds)
}

/// Runs `qemu-io -f raw -c cmd uri` (one command, 60 s at most): whether it worked (exit 0, no
/// failure or error reported, an I/O line printed) and all it printed, for tests that expect
/// some commands to fail.
pub fn try_qemu_io(dir: &TempDir, uri: &str, cmd: &str) -> (bool, String) {
    let out = run_tool(dir, "qemu-io", &["-f", "raw", "-c", cmd, uri], Duration::from_secs(60));
    let all = format!("{}\n{}", out.stdout, out.stderr);
    let ok =
        out.status.success() && !all.contains("failed") && !all.contains("error") && all.contains(" bytes at offset ");
    (ok, all)
}

/// A running fio writing its JSON report to a file.
pub struct FioRun {
    pub tool: Tool,
    pub tag: String,
    json: PathBuf,
}

impl FioRun {
    /// Spawns fio with `args` plus JSON output to `<dir>/fio-<tag>.json`, its jobs as threads
    /// (`--thread`: fio's job processes would leave its process group, and outlive a kill).
    pub fn spawn(dir: &TempDir, tag: &str, args: &[&str]) -> FioRun {
        let json = dir.join(&format!("fio-{tag}.json"));
        let out_arg = format!("--output={}", json.display());
        let mut all: Vec<&str> = vec!["--thread"];
        all.extend_from_slice(args);
        all.push("--output-format=json");
        all.push(&out_arg);
        FioRun { tool: Tool::spawn(dir, "fio", &all), tag: tag.to_string(), json }
    }

    /// Waits for fio (at most `timeout`) and returns the parsed report, failing the test unless
    /// fio exited 0, reported no verify failure and every job has error 0.
    pub fn finish(self, timeout: Duration) -> Value {
        let tag = self.tag.clone();
        let json = self.json.clone();
        let out = self.tool.wait(timeout);
        let text = std::fs::read_to_string(&json).unwrap_or_default();
        assert!(
            out.status.success(),
            "fio {tag}: {}\nstdout:\n{}\nstderr:\n{}\nreport:\n{text}",
            out.status,
            out.stdout,
            out.stderr
        );
        assert!(!out.stderr.contains("verify:"), "fio {tag} reported a verify failure:\n{}", out.stderr);
        // The nbd engine logs "fio: connected to NBD server" into the report file first.
        let json_text = text.find("\n{").map_or(text.as_str(), |i| &text[i + 1..]);
        let v: Value =
            serde_json::from_str(json_text).unwrap_or_else(|e| panic!("fio {tag} report is not JSON ({e}):\n{text}"));
        for j in v["jobs"].as_array().expect("fio jobs") {
            assert_eq!(j["error"], 0, "fio {tag} job {} failed: {j}\nstderr:\n{}", j["jobname"], out.stderr);
        }
        v
    }
}

/// Runs fio with `args` to completion; see [`FioRun::finish`].
pub fn fio(dir: &TempDir, tag: &str, args: &[&str], timeout: Duration) -> Value {
    FioRun::spawn(dir, tag, args).finish(timeout)
}

/// `len` bytes of a deterministic pseudo-random sequence chosen by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Compares two files chunk by chunk; panics at the first difference.
pub fn assert_files_equal(a: &Path, b: &Path) {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (la, lb) = (fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    assert_eq!(la, lb, "{} and {} differ in size", a.display(), b.display());
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < la {
        let n = ((la - off) as usize).min(ba.len());
        fa.read_exact(&mut ba[..n]).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            let i = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y).unwrap();
            panic!("{} and {} differ at byte {}", a.display(), b.display(), off + i as u64);
        }
        off += n as u64;
    }
}

// ---------------------------------------------------------------------------------------------
// Raw protocol client
// ---------------------------------------------------------------------------------------------

/// One option reply.
#[derive(Debug, Clone)]
pub struct OptReply {
    pub option: u32,
    pub reply: u32,
    pub data: Vec<u8>,
}

/// What NBD_OPT_GO/NBD_OPT_INFO reported.
#[derive(Debug, Clone, Default)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub pref_block: u32,
    pub max_block: u32,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// One structured reply chunk.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

/// A hand-driven NBD client over TCP.
pub struct Raw {
    pub s: TcpStream,
}

impl Raw {
    /// Connects and reads the 18-byte greeting, checking its magics and flags.
    pub fn connect(port: u16) -> Raw {
        let mut r = Self::connect_only(port);
        let g = r.read_n(18);
        assert_eq!(&g[..8], b"NBDMAGIC", "greeting {g:?}");
        assert_eq!(&g[8..16], b"IHAVEOPT", "greeting {g:?}");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), FIXED_NEWSTYLE | NO_ZEROES, "handshake flags");
        r
    }

    /// Connects without reading anything.
    pub fn connect_only(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to port {port}: {e}"));
        s.set_read_timeout(Some(RAW_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    /// Connects, reads the greeting and sends the client flags `FIXED_NEWSTYLE | NO_ZEROES`.
    pub fn negotiating(port: u16) -> Raw {
        let mut r = Self::connect(port);
        r.send(&(C_FIXED_NEWSTYLE | C_NO_ZEROES).to_be_bytes());
        r
    }

    /// Full handshake: client flags, optionally NBD_OPT_STRUCTURED_REPLY, then NBD_OPT_GO for
    /// `name`.
    pub fn open(port: u16, name: &str, structured: bool) -> (Raw, ExportInfo) {
        let mut r = Self::negotiating(port);
        if structured {
            r.send_option(OPT_STRUCTURED_REPLY, &[]);
            let rep = r.option_reply();
            assert_eq!((rep.option, rep.reply), (OPT_STRUCTURED_REPLY, REP_ACK), "{rep:?}");
        }
        let info = r.go(name, &[]).unwrap_or_else(|e| panic!("NBD_OPT_GO {name}: {e:?}"));
        (r, info)
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send to the NBD server");
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap_or_else(|e| panic!("read {n} bytes from the NBD server: {e}"));
        b
    }

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_be_bytes([b[i], b[i + 1]])
    }

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_be_bytes(b[i..i + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], i: usize) -> u64 {
        u64::from_be_bytes(b[i..i + 8].try_into().unwrap())
    }

    /// Sends an option request with the right magic.
    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    /// Reads one option reply, checking its magic.
    pub fn option_reply(&mut self) -> OptReply {
        let h = self.read_n(20);
        assert_eq!(Self::u64_at(&h, 0), OPTION_REPLY_MAGIC, "option reply magic in {h:?}");
        let len = Self::u32_at(&h, 16) as usize;
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        OptReply { option: Self::u32_at(&h, 8), reply: Self::u32_at(&h, 12), data: self.read_n(len) }
    }

    /// The data of NBD_OPT_INFO / NBD_OPT_GO.
    pub fn info_request(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    /// Sends NBD_OPT_GO (or NBD_OPT_INFO) and collects the NBD_REP_INFO replies up to the ACK;
    /// an error reply is returned as Err.
    pub fn info_or_go(&mut self, option: u32, name: &str, requests: &[u16]) -> Result<ExportInfo, OptReply> {
        self.send_option(option, &Self::info_request(name, requests));
        let mut info = ExportInfo::default();
        let mut got_export = false;
        loop {
            let rep = self.option_reply();
            assert_eq!(rep.option, option, "reply to the wrong option: {rep:?}");
            match rep.reply {
                REP_ACK => {
                    assert!(got_export, "ACK without NBD_INFO_EXPORT");
                    return Ok(info);
                }
                REP_INFO => {
                    let d = &rep.data;
                    match Self::u16_at(d, 0) {
                        INFO_EXPORT => {
                            assert_eq!(d.len(), 12, "{rep:?}");
                            info.size = Self::u64_at(d, 2);
                            info.flags = Self::u16_at(d, 10);
                            got_export = true;
                        }
                        INFO_NAME => info.name = Some(String::from_utf8(d[2..].to_vec()).unwrap()),
                        INFO_DESCRIPTION => info.description = Some(String::from_utf8(d[2..].to_vec()).unwrap()),
                        INFO_BLOCK_SIZE => {
                            assert_eq!(d.len(), 14, "{rep:?}");
                            info.min_block = Self::u32_at(d, 2);
                            info.pref_block = Self::u32_at(d, 6);
                            info.max_block = Self::u32_at(d, 10);
                        }
                        other => panic!("unknown info type {other}: {rep:?}"),
                    }
                }
                r if r & REP_FLAG_ERROR != 0 => return Err(rep),
                _ => panic!("unexpected reply {rep:?}"),
            }
        }
    }

    /// NBD_OPT_GO.
    pub fn go(&mut self, name: &str, requests: &[u16]) -> Result<ExportInfo, OptReply> {
        self.info_or_go(OPT_GO, name, requests)
    }

    /// Sends one transmission request header (and `payload` right after it).
    pub fn request(&mut self, flags: u16, cmd: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        self.send(&request_bytes(flags, cmd, cookie, offset, length, payload));
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn simple_reply(&mut self) -> (u32, u64) {
        let h = self.read_n(16);
        assert_eq!(Self::u32_at(&h, 0), SIMPLE_REPLY_MAGIC, "simple reply magic in {h:?}");
        (Self::u32_at(&h, 4), Self::u64_at(&h, 8))
    }

    /// Reads one structured reply chunk.
    pub fn chunk(&mut self) -> Chunk {
        let h = self.read_n(20);
        assert_eq!(Self::u32_at(&h, 0), STRUCTURED_REPLY_MAGIC, "structured reply magic in {h:?}");
        let len = Self::u32_at(&h, 16) as usize;
        Chunk {
            flags: Self::u16_at(&h, 4),
            kind: Self::u16_at(&h, 6),
            cookie: Self::u64_at(&h, 8),
            payload: self.read_n(len),
        }
    }

    /// A simple-reply read that must succeed; returns the data.
    pub fn read_ok(&mut self, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        self.request(0, CMD_READ, cookie, offset, len, &[]);
        let (err, c) = self.simple_reply();
        assert_eq!((err, c), (0, cookie), "read {len} at {offset}");
        self.read_n(len as usize)
    }

    /// A simple-reply write that must succeed.
    pub fn write_ok(&mut self, cookie: u64, offset: u64, data: &[u8], flags: u16) {
        self.request(flags, CMD_WRITE, cookie, offset, data.len() as u32, data);
        let (err, c) = self.simple_reply();
        assert_eq!((err, c), (0, cookie), "write {} at {offset}", data.len());
    }

    /// Sends NBD_CMD_DISC.
    pub fn disc(&mut self) {
        self.request(0, CMD_DISC, 0xd15c, 0, 0, &[]);
    }

    /// Reads until the server closes the connection (EOF or reset); returns what arrived before.
    /// Panics if the connection stays open for `timeout`.
    pub fn expect_closed(&mut self, timeout: Duration) -> Vec<u8> {
        self.s.set_read_timeout(Some(timeout)).unwrap();
        let mut out = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    panic!("the server kept the connection open for {timeout:?} (received {} bytes)", out.len())
                }
                Err(_) => return out, // reset: closed with unread input
            }
        }
    }
}

/// The bytes of one transmission request header followed by `payload`.
pub fn request_bytes(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(28 + payload.len());
    b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&cmd.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(payload);
    b
}
