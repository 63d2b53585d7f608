//! Controller teardown through the raw NVMe/TCP host (`nvmf_common::Host`), run against
//! Ferrite's target and, when `SPDK_DIR` points at SPDK v26.05, the same script against SPDK's
//! nvmf_tgt (the reference for these behaviours; without it the SPDK half prints SKIP):
//! - `nvmf_subsystem_remove_host` destroys the removed host's controllers: with a cntlid range
//!   of 1-2, rounds of add host / connect / remove host / close leave no controller behind and
//!   never run out of controller IDs;
//! - a controller reset (CC.EN 1 -> 0) deletes the I/O queues before CSTS.RDY reads 0 (their
//!   connections are closed), and after re-enabling QID 1 connects again;
//! - a shutdown (CC.SHN) closes the I/O queues before CSTS.SHST reads complete.

mod common;
mod nvmf_common;

use common::TempDir;
use ferrite_nvmf::spec::opcode::nvm;
use ferrite_nvmf::spec::registers::{self, shn, shst, Cc, Csts};
use ferrite_nvmf::tcp::Pdu;
use ferrite_rpc::client::RpcClient;
use nvmf_common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a closing connection or a register change may take.
const WITHIN: Duration = Duration::from_secs(5);
const NQN: &str = "nqn.2016-06.io.ferrite:lifecycle";
const BS: u32 = 4096;

/// SPDK's nvmf_tgt, killed on drop.
struct Spdk {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl Drop for Spdk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The target under test: Ferrite's daemon or SPDK's nvmf_tgt, configured by the same RPCs.
enum Tgt {
    Ferrite(NvmfDaemon),
    Spdk(Spdk),
}

struct Target {
    _dir: TempDir,
    tgt: Tgt,
    port: u16,
}

impl Target {
    /// Ferrite on two reactors (an I/O queue may live on another reactor than its admin queue).
    fn ferrite(tag: &str) -> Target {
        let dir = TempDir::new(tag);
        let n = NvmfDaemon::start(&dir, "0x3", json!({}));
        Target { _dir: dir, tgt: Tgt::Ferrite(n), port: 0 }
    }

    /// SPDK's nvmf_tgt with the TCP transport, or None (SKIP printed) without SPDK_DIR.
    fn spdk(tag: &str, test: &str) -> Option<(Target, std::sync::MutexGuard<'static, ()>)> {
        // One nvmf_tgt at a time (each takes its 1 GiB and polls its core).
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let spdk = match common::spdk_dir() {
            Ok(d) => d,
            Err(why) => {
                println!("SKIP {test} against SPDK's nvmf_tgt: {why}");
                return None;
            }
        };
        let guard = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = TempDir::new(tag);
        let sock = dir.join("spdk.sock");
        let log = dir.join("spdk.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(spdk.join("build/bin/nvmf_tgt"))
            .args(["--no-huge", "-s", "1024", "-m", "0x1", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .env("LD_LIBRARY_PATH", spdk.join("build/lib"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn nvmf_tgt");
        let mut s = Spdk { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while RpcClient::connect(&s.sock, Duration::from_secs(1)).is_err() {
            if let Some(st) = s.child.try_wait().unwrap() {
                panic!("nvmf_tgt exited ({st}): {}", std::fs::read_to_string(&s.log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "nvmf_tgt's RPC socket did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        let t = Target { _dir: dir, tgt: Tgt::Spdk(s), port: 0 };
        // SPDK ends reads with C2HData SUCCESS even under SQ flow control, which the test host
        // refuses: ask for response capsules.
        t.call("nvmf_create_transport", json!({"trtype": "TCP", "c2h_success": false}));
        Some((t, guard))
    }

    fn name(&self) -> &'static str {
        match self.tgt {
            Tgt::Ferrite(_) => "Ferrite",
            Tgt::Spdk(_) => "SPDK",
        }
    }

    fn call(&self, method: &str, params: Value) -> Value {
        let sock = match &self.tgt {
            Tgt::Ferrite(n) => n.d.sock.clone(),
            Tgt::Spdk(s) => s.sock.clone(),
        };
        let mut c = RpcClient::connect(&sock, Duration::from_secs(10)).expect("RPC socket");
        common::call(&mut c, method, Some(params))
    }

    /// The target's log so far.
    fn log(&self) -> String {
        match &self.tgt {
            Tgt::Ferrite(n) => n.d.proc.stderr(),
            Tgt::Spdk(s) => std::fs::read_to_string(&s.log).unwrap_or_default(),
        }
    }

    /// Subsystem [`NQN`] with a 16 MiB malloc namespace (NSID 1), listening on 127.0.0.1.
    fn subsystem(&mut self, allow_any_host: bool, cntlids: Option<(u16, u16)>) {
        self.call("bdev_malloc_create", json!({"name": "Mal0", "num_blocks": 4096, "block_size": BS}));
        let mut p =
            json!({"nqn": NQN, "serial_number": SERIAL, "model_number": MODEL, "allow_any_host": allow_any_host});
        if let Some((min, max)) = cntlids {
            p["min_cntlid"] = json!(min);
            p["max_cntlid"] = json!(max);
        }
        self.call("nvmf_create_subsystem", p);
        self.call("nvmf_subsystem_add_ns", json!({"nqn": NQN, "namespace": {"bdev_name": "Mal0", "nsid": 1}}));
        for _ in 0..20 {
            let port = free_port();
            let p = json!({"nqn": NQN, "listen_address":
                {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}});
            let sock = match &self.tgt {
                Tgt::Ferrite(n) => n.d.sock.clone(),
                Tgt::Spdk(s) => s.sock.clone(),
            };
            let mut c = RpcClient::connect(&sock, Duration::from_secs(10)).unwrap();
            if c.call("nvmf_subsystem_add_listener", Some(p)).is_ok() {
                self.port = port;
                return;
            }
        }
        panic!("no port for the listener");
    }

    fn controllers(&self) -> Vec<Value> {
        self.call("nvmf_subsystem_get_controllers", json!({"nqn": NQN})).as_array().unwrap().clone()
    }

    /// Waits until the subsystem has no controller; panics with what is left.
    fn wait_no_controllers(&self, what: &str) {
        let deadline = Instant::now() + WITHIN;
        loop {
            let c = self.controllers();
            if c.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "{}: {what}: controllers left after {WITHIN:?}: {c:?}", self.name());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One write and its read back on `q`.
fn io_works(q: &mut Host, seed: u64, what: &str) {
    let data = pattern(seed, BS as usize);
    q.write(1, seed % 64, &data, BS).ok(&format!("{what}: write"));
    assert_eq!(q.read(1, seed % 64, 1, BS).ok(&format!("{what}: read")).data, data, "{what}: read back");
}

/// Expects the target to close `h` within [`WITHIN`] without completing anything more.
fn expect_closed_silently(h: &mut Host, what: &str) {
    let got = h.expect_closed(WITHIN, what);
    let answered: Vec<_> =
        got.iter().filter(|r| matches!(r.pdu, Pdu::CapsuleResp(_) | Pdu::C2hData(_))).map(|r| &r.pdu).collect();
    assert!(answered.is_empty(), "{what}: the deleted queue still answered: {answered:?}");
}

// ---------------------------------------------------------------------------------------------
// nvmf_subsystem_remove_host
// ---------------------------------------------------------------------------------------------

fn remove_host_destroys_its_controllers(mut t: Target) {
    let name = t.name();
    // Two controller IDs: a leak of two controllers refuses every later Connect as busy.
    t.subsystem(false, Some((1, 2)));
    for round in 0..4 {
        let what = format!("{name} round {round}");
        t.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN}));
        let mut s = Session::open(t.port, NQN, 1, HostOpts::default(), 4096);
        io_works(&mut s.io[0], round, &what);
        assert_eq!(t.controllers().len(), 1, "{what}: one controller while connected");
        t.call("nvmf_subsystem_remove_host", json!({"nqn": NQN, "host": HOSTNQN}));
        // The removed host's queues are closed by the target.
        s.admin.expect_closed(WITHIN, &format!("{what}: admin queue after remove_host"));
        s.io[0].expect_closed(WITHIN, &format!("{what}: I/O queue after remove_host"));
        drop(s);
        t.wait_no_controllers(&format!("{what}: after remove_host and close"));
    }
    // Controller IDs are all free: an allowed host connects and works.
    t.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOSTNQN}));
    for k in 0..2 {
        let mut s = Session::open(t.port, NQN, 1, HostOpts::default(), 4096);
        io_works(&mut s.io[0], 100 + k, &format!("{name}: allowed host after the removals"));
    }
    t.wait_no_controllers("after the allowed hosts closed");
    if let Tgt::Ferrite(n) = &mut t.tgt {
        n.assert_alive();
        let destroyed = t.log().matches("destroyed").count();
        assert!(destroyed >= 6, "Ferrite logged {destroyed} controllers destroyed, expected 6:\n{}", t.log());
    }
}

#[test]
fn remove_host_destroys_its_controllers_ferrite() {
    remove_host_destroys_its_controllers(Target::ferrite("nvmflcrmhost"));
}

#[test]
fn remove_host_destroys_its_controllers_spdk() {
    if let Some((t, _one)) = Target::spdk("nvmflcrmhosts", "remove_host_destroys_its_controllers") {
        remove_host_destroys_its_controllers(t);
    }
}

// ---------------------------------------------------------------------------------------------
// Controller reset and shutdown
// ---------------------------------------------------------------------------------------------

fn cc_enabled() -> Cc {
    Cc { en: true, iosqes: 6, iocqes: 4, ..Cc::default() }
}

/// Polls CSTS until `done` says so; panics after [`WITHIN`].
fn wait_csts(admin: &mut Host, what: &str, done: impl Fn(Csts) -> bool) -> Csts {
    let deadline = Instant::now() + WITHIN;
    loop {
        let csts = Csts::from_u32(admin.prop_get(registers::offset::CSTS) as u32);
        if done(csts) {
            return csts;
        }
        assert!(Instant::now() < deadline, "{what}: CSTS {csts:?} after {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn reset_deletes_the_io_queues(mut t: Target) {
    let name = t.name();
    t.subsystem(true, None);
    let mut s = Session::open(t.port, NQN, 2, HostOpts::default(), 4096);
    let cntlid = s.cntlid();
    for (i, q) in s.io.iter_mut().enumerate() {
        io_works(q, i as u64, &format!("{name}: before the reset"));
    }
    // Reset: CC.EN 1 -> 0. Once CSTS.RDY reads 0, the I/O queues are gone.
    let cc = Cc { en: false, ..cc_enabled() };
    s.admin.prop_set(registers::offset::CC, u64::from(cc.to_u32())).ok("Property Set CC.EN=0");
    wait_csts(&mut s.admin, &format!("{name}: reset"), |c| !c.rdy);
    for (i, q) in s.io.iter_mut().enumerate() {
        // A read on the old queue gets no answer: the queue is closed.
        let raw = Host::with_transport_sgl(Host::rw_sqe(nvm::READ, 1, 0, 1), 77, BS);
        let _ = q.try_send_raw(&q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[]));
        expect_closed_silently(q, &format!("{name}: I/O queue {} after the reset", i + 1));
    }
    // Enabled again, the controller takes QID 1 and 2 again.
    s.admin.enable();
    for qid in 1..=2u16 {
        let mut q = Host::io(t.port, NQN, cntlid, qid, HostOpts::default(), 4096);
        io_works(&mut q, 10 + u64::from(qid), &format!("{name}: QID {qid} after the reset"));
    }
    s.admin.keep_alive().ok("admin queue after the reset");
    if let Tgt::Ferrite(n) = &mut t.tgt {
        n.assert_alive();
    }
}

#[test]
fn reset_deletes_the_io_queues_ferrite() {
    reset_deletes_the_io_queues(Target::ferrite("nvmflcreset"));
}

#[test]
fn reset_deletes_the_io_queues_spdk() {
    if let Some((t, _one)) = Target::spdk("nvmflcresets", "reset_deletes_the_io_queues") {
        reset_deletes_the_io_queues(t);
    }
}

fn shutdown_closes_the_io_queues(mut t: Target) {
    let name = t.name();
    t.subsystem(true, None);
    let mut s = Session::open(t.port, NQN, 1, HostOpts::default(), 4096);
    io_works(&mut s.io[0], 3, &format!("{name}: before the shutdown"));
    let cc = Cc { shn: shn::NORMAL, ..cc_enabled() };
    s.admin.prop_set(registers::offset::CC, u64::from(cc.to_u32())).ok("Property Set CC.SHN=01b");
    wait_csts(&mut s.admin, &format!("{name}: shutdown"), |c| c.shst == shst::COMPLETE);
    let q = &mut s.io[0];
    let raw = Host::with_transport_sgl(Host::rw_sqe(nvm::READ, 1, 0, 1), 78, BS);
    let _ = q.try_send_raw(&q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[]));
    expect_closed_silently(q, &format!("{name}: I/O queue after the shutdown"));
    s.admin.prop_get(registers::offset::CSTS);
    if let Tgt::Ferrite(n) = &mut t.tgt {
        n.assert_alive();
    }
}

#[test]
fn shutdown_closes_the_io_queues_ferrite() {
    shutdown_closes_the_io_queues(Target::ferrite("nvmflcshn"));
}

#[test]
fn shutdown_closes_the_io_queues_spdk() {
    if let Some((t, _one)) = Target::spdk("nvmflcshns", "shutdown_closes_the_io_queues") {
        shutdown_closes_the_io_queues(t);
    }
}
