//! Ferrite's vhost-user-blk front end (the virtio-user bdev) against SPDK v26.05's vhost target,
//! a malloc bdev behind it, SPDK on core 0 and Ferrite on core 1:
//!
//! 1. `ferrite perf -w verify` over a virtio-user bdev (its own process), at 4 KiB and at
//!    128 KiB: every block written is read back and compared;
//! 2. the daemon attaches the controller (`bdev_virtio_attach_controller`), exports the bdev
//!    over NBD, and a raw NBD client writes a pattern and reads it back in other sizes; SPDK's
//!    own statistics of its malloc bdev must show the bytes written;
//! 3. the daemon detaches and attaches again (a new vhost-user session with a new shared
//!    memory): the pattern reads back unchanged, so it was kept by SPDK, not by the client.
//!
//! SPDK's vhost maps the client's memory only when it is hugepage-backed (see
//! `ferrite_virtio_user::shm`): the test checks that the daemon's shared memory is of 2 MiB
//! pages and that SPDK's vhost is still running after each step (it crashed on 4 KiB pages).
//!
//! Needs SPDK in $SPDK_DIR (scripts/test.sh unpacks it) and root to reserve 2 MiB hugepages
//! (given back at the end); prints SKIP with the reason otherwise.

mod common;
mod nbd_common;

use common::{check_verify_results, find_bdev, perf_verify_args, Hugepages, Proc, TempDir};
use ferrite_rpc::client::RpcClient;
use nbd_common::{pattern, NbdDaemon, Raw};
use serde_json::{json, Value};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TEST: &str = "ferrite_virtio_user_verifies_against_spdk_vhost";
/// The malloc bdev behind SPDK's controller: 64 MiB of 4 KiB blocks.
const BLOCKS: u64 = 16384;
const BLOCK: u64 = 4096;
/// Where the pattern goes, and how much of it.
const PATTERN_AT: u64 = 8 << 20;
const PATTERN_BYTES: usize = 16 << 20;

/// SPDK's vhost app on core 0 with its sockets in a test directory; killed when dropped (and
/// when the test process dies).
struct SpdkVhost {
    child: Child,
    rpc: PathBuf,
    log: PathBuf,
}

impl SpdkVhost {
    fn start(spdk: &Path, dir: &TempDir) -> SpdkVhost {
        let rpc = dir.join("spdk.sock");
        let log = dir.join("spdk-vhost.log");
        let mut cmd = Command::new(spdk.join("build/bin/vhost"));
        cmd.args(["-m", "0x1", "-s", "256", "--disable-cpumask-locks", "-S"])
            .arg(dir.path())
            .arg("-r")
            .arg(&rpc)
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            // A core file, if it crashes, lands in the test directory and goes with it.
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&log).unwrap())
            .stderr(File::create(dir.join("spdk-vhost.stderr")).unwrap());
        // SAFETY: prctl in the child before exec: the app dies with the test.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let mut v = SpdkVhost { child: cmd.spawn().expect("SPDK's vhost starts"), rpc, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while RpcClient::connect(&v.rpc, Duration::from_secs(1)).is_err() {
            v.assert_alive("starting");
            assert!(Instant::now() < deadline, "SPDK's vhost serves no RPC within 30 s:\n{}", v.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        v
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn call(&self, method: &str, params: Value) -> Value {
        let mut c = RpcClient::connect(&self.rpc, Duration::from_secs(10)).expect("connect to SPDK's vhost");
        c.call(method, Some(params)).unwrap_or_else(|e| panic!("SPDK {method}: {e:?}\n{}", self.log()))
    }

    /// Panics (with the tail of its log) if the app has exited.
    fn assert_alive(&mut self, after: &str) {
        if let Some(st) = self.child.try_wait().expect("try_wait") {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "SPDK's vhost exited ({st}) {after}; its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

impl Drop for SpdkVhost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The trace file SPDK keeps in /dev/shm, which a killed app leaves behind.
        let _ = std::fs::remove_file(format!("/dev/shm/vhost_trace.pid{}", self.child.id()));
    }
}

fn attach_params(socket: &Path) -> Value {
    json!({"name": "V", "trtype": "user", "traddr": socket.to_str().unwrap(), "dev_type": "blk", "vq_count": 1})
}

/// Bytes SPDK's malloc bdev M0 has written so far, by SPDK's own `bdev_get_iostat`.
fn spdk_bytes_written(v: &SpdkVhost) -> u64 {
    let s = v.call("bdev_get_iostat", json!({}));
    let m0 = s["bdevs"].as_array().and_then(|b| find_bdev(b, "M0")).unwrap_or_else(|| panic!("bdev_get_iostat: {s}"));
    m0["bytes_written"].as_u64().unwrap_or_else(|| panic!("bdev_get_iostat: {s}"))
}

/// Attaches SPDK's controller to the daemon as bdev V, checks that its shared memory is of
/// 2 MiB pages, and exports it over NBD as "v".
fn attach_and_export(nd: &NbdDaemon, socket: &Path) {
    let names = nd.d.call("bdev_virtio_attach_controller", Some(attach_params(socket)));
    assert_eq!(names, json!(["V"]));
    let bdevs = nd.d.bdevs();
    let b = find_bdev(&bdevs, "V").expect("bdev V");
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(BLOCK), Some(BLOCKS)), "{b}");
    let v = &b["driver_specific"]["virtio"];
    assert_eq!(v["shared_page_size"], json!(2 << 20), "the shared memory is of 2 MiB hugepages: {v}");
    assert_eq!(v["connected"], json!(true), "{v}");
    nd.export("V", "v", false, "virtio-user to SPDK's vhost");
}

/// Reads the pattern back over NBD in 192 KiB pieces (not a multiple of the client's 128 KiB
/// bounce slots, so requests are split differently from the writes) and compares it.
fn read_back(port: u16, want: &[u8], what: &str) {
    let (mut c, info) = Raw::open(port, "v", false);
    assert_eq!(info.size, BLOCKS * BLOCK, "{what}: export size");
    let piece = 192 << 10;
    let mut got = Vec::with_capacity(want.len());
    for (i, at) in (0..want.len()).step_by(piece).enumerate() {
        let len = piece.min(want.len() - at);
        got.extend_from_slice(&c.read_ok(i as u64, PATTERN_AT + at as u64, len as u32));
    }
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {} (device offset {}) differs", at, PATTERN_AT + at as u64);
    }
    c.disc();
}

#[test]
fn ferrite_virtio_user_verifies_against_spdk_vhost() {
    let spdk = match common::spdk_dir() {
        Ok(s) if s.join("build/bin/vhost").exists() => s,
        Ok(s) => return println!("SKIP {TEST}: {} has no build/bin/vhost", s.display()),
        Err(why) => return println!("SKIP {TEST}: {why}"),
    };
    // SPDK's -s 256 (128 pages) and the client's shared memory (11 pages per process).
    let _pages = match Hugepages::reserve(384) {
        Ok(p) => p,
        Err(why) => return println!("SKIP {TEST}: {why}"),
    };
    let dir = TempDir::new("vu-spdk");
    let mut vhost = SpdkVhost::start(&spdk, &dir);
    vhost.call("bdev_malloc_create", json!({"name": "M0", "num_blocks": BLOCKS, "block_size": BLOCK}));
    vhost.call("vhost_create_blk_controller", json!({"ctrlr": "vhost.0", "dev_name": "M0"}));
    let socket = dir.join("vhost.0");
    assert!(socket.exists(), "SPDK made no socket for vhost.0:\n{}", vhost.log());

    // 1. ferrite perf -w verify, a process of its own, on core 1.
    let cfg = dir.write_json(
        "virtio.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_virtio_attach_controller", "params": attach_params(&socket)},
            {"method": "bdev_wait_for_examine"}]}]}),
    );
    for (qd, size) in [(32, 4096), (8, 128 << 10)] {
        let res = dir.join(&format!("perf-{size}.json"));
        // Pinned to core 1 (no --no-pin): SPDK's reactor polls core 0 without a pause.
        let args = perf_verify_args(&cfg, "V", qd, size, "0x2", &res);
        let args: Vec<&str> = args.iter().map(String::as_str).filter(|&a| a != "--no-pin").collect();
        let mut p = Proc::spawn(&dir, "perf", &args);
        let st = p.expect_exit(Duration::from_secs(60), "ferrite perf -w verify over virtio-user");
        let log = format!("stdout:\n{}\nstderr:\n{}", p.stdout(), p.stderr());
        vhost.assert_alive(&format!("during ferrite perf -w verify -o {size}"));
        assert_eq!(st.code(), Some(0), "ferrite perf failed\n{log}");
        let iops = check_verify_results(&res, &format!("verify {size} B QD {qd}"), &log);
        println!("ferrite perf -w verify -o {size} -q {qd} through SPDK's vhost: {iops:.0} IOPS");
    }

    // 2. The daemon writes a pattern through SPDK's vhost and reads it back.
    let nd = NbdDaemon::start_full(&dir, "0x2", json!({}), &[]);
    attach_and_export(&nd, &socket);
    vhost.assert_alive("after the daemon's SET_MEM_TABLE");
    let mut want = pattern(0x5bd1, PATTERN_BYTES);
    let written_before = spdk_bytes_written(&vhost);
    {
        let (mut c, _) = Raw::open(nd.port, "v", false);
        // 1 MiB writes (the client splits them into 128 KiB requests), then single blocks
        // overwritten with other bytes (a 4 KiB request each).
        for (i, chunk) in want.chunks(1 << 20).enumerate() {
            c.write_ok(i as u64, PATTERN_AT + (i << 20) as u64, chunk, 0);
        }
        for k in 0..64u64 {
            let at = (k * 37 % (PATTERN_BYTES as u64 / BLOCK)) * BLOCK;
            let block = pattern(k + 1, BLOCK as usize);
            c.write_ok(1000 + k, PATTERN_AT + at, &block, 0);
            want[at as usize..(at + BLOCK) as usize].copy_from_slice(&block);
        }
        c.disc();
    }
    let written = spdk_bytes_written(&vhost) - written_before;
    assert!(
        written >= PATTERN_BYTES as u64 + 64 * BLOCK,
        "SPDK's malloc bdev wrote {written} bytes, {} were sent",
        PATTERN_BYTES as u64 + 64 * BLOCK
    );
    read_back(nd.port, &want, "read back in the same session");

    // 3. A new session with new shared memory reads what SPDK's bdev holds.
    nd.d.call("nbd_server_remove_export", Some(json!({"name": "v"})));
    nd.d.call("bdev_virtio_detach_controller", Some(json!({"name": "V"})));
    assert!(find_bdev(&nd.d.bdevs(), "V").is_none(), "V is gone after the detach");
    attach_and_export(&nd, &socket);
    read_back(nd.port, &want, "read back after detaching and attaching again");
    vhost.assert_alive("at the end");
    nd.d.assert_serving();
}
