//! Fuzzes the NVMe/TCP target's command handlers (crates/nvmf/src/target) over a real socket.
//!
//! Once per process an engine starts in-process (one reactor) with two malloc bdevs (512-byte
//! and 4 KiB blocks) and a null bdev as namespaces 1-3 of subsystem [`SUBNQN`], configured by
//! SPDK's RPCs through the same registry and config loader `ferrite serve` uses, listening on
//! 127.0.0.1. Each input is then one host's session:
//!
//! - byte 0, the setup: bit 0 asks for header digests, bit 1 for data digests, bit 2 leaves
//!   the controller disabled (no Property Set CC.EN), bit 3 makes the fuzzed connection an I/O
//!   queue (QID 1) of a controller whose admin queue is another connection, bit 4 disables SQ
//!   flow control (reads may end with C2HData SUCCESS), bits 5-7 are HPDA;
//! - the rest is sent as is after a valid prefix: ICReq, Connect (and CC.EN), so that the bytes
//!   reach the command handlers: capsules, in-capsule data, H2CData, anything.
//!
//! The host then reads whatever the target answers until it closes the connection or stays
//! silent for a few milliseconds, and goes. The target must never panic (a reactor panic
//! aborts the process, which libFuzzer reports as a crash). Seeds in fuzz/seeds/nvmf_target
//! are well-formed sessions: reads, writes in capsule and by R2T, identify, log pages,
//! features, AERs, keep-alive, DSM, compare, fused commands.

#![no_main]

use ferrite_nvmf::spec::fabrics::{
    cattr, ConnectCommand, ConnectData, PropertySetCommand, CNTLID_DYNAMIC, PROPERTY_SIZE_4,
};
use ferrite_nvmf::spec::nqn::NqnField;
use ferrite_nvmf::spec::registers::{offset, Cc};
use ferrite_nvmf::spec::sgl::SglDescriptor;
use ferrite_nvmf::tcp::{encode_contiguous, CapsuleCmd, Decoder, Event, IcReq, Negotiated, Pdu, Role, Want};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const SUBNQN: &str = "nqn.2016-06.io.ferrite:fuzz";
const HOSTNQN: &str = "nqn.2016-06.io.ferrite:fuzz-host";
/// Silence after which the target is taken to have answered all it will.
const QUIET: Duration = Duration::from_millis(5);
/// Most time one input may spend reading answers.
const MAX_READ: Duration = Duration::from_millis(300);
/// Timeout of the prefix's own exchanges (a stuck target fails the input loudly).
const PREFIX_TIMEOUT: Duration = Duration::from_secs(5);

struct Target {
    port: u16,
    ctx: ferrite_rpc::Ctx,
}

impl Target {
    /// Calls an RPC method on reactor 0.
    fn call(&self, method: &'static str, params: serde_json::Value) -> Result<serde_json::Value, String> {
        let c = self.ctx.clone();
        self.ctx
            .engine
            .run_async(0, move || async move {
                ferrite_rpc::Registry::call(&c, method, ferrite_rpc::Params(Some(params))).await
            })
            .wait()
            .expect("reactor 0 answers")
            .map_err(|e| e.to_string())
    }

    /// Waits until the target has torn down every queue pair of the last input (so that what
    /// the teardown does is charged to the input that caused it), at most a second.
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            match self.call("nvmf_subsystem_get_qpairs", json!({"nqn": SUBNQN})) {
                Ok(v) if v.as_array().is_some_and(|a| a.is_empty()) => break,
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        // A turn of the reactor for completions deferred to its next poll.
        let _ = self.ctx.engine.call(0, || ()).wait();
    }
}

static TARGET: OnceLock<Target> = OnceLock::new();

/// Starts the engine and configures the target; retries with another port if the one picked
/// was taken meanwhile.
fn start() -> Target {
    let engine =
        Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Adaptive, pin: false, ..Default::default() })
            .expect("engine starts");
    let registry = ferrite_rpc::app::registry(|reg| {
        ferrite_modules::register_builtin();
        ferrite_bdev::rpc::register(reg);
        ferrite_nvmf::target::rpc::register(reg);
    });
    let ctx = ferrite_rpc::Ctx { engine: engine.clone(), registry: Arc::new(registry) };
    let setup = json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "M512", "num_blocks": 8192, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "M4K", "num_blocks": 1024, "block_size": 4096}},
            {"method": "bdev_null_create", "params": {"name": "N0", "num_blocks": 65536, "block_size": 4096}}
        ]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP", "max_queue_depth": 32, "max_io_size": 262144}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": SUBNQN, "allow_any_host": true,
                "serial_number": "FUZZ0001", "model_number": "Ferrite fuzz"}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUBNQN, "namespace": {"bdev_name": "M512"}}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUBNQN, "namespace": {"bdev_name": "M4K"}}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUBNQN, "namespace": {"bdev_name": "N0"}}}
        ]}
    ]});
    let c = ctx.clone();
    engine
        .run_async(0, move || async move { ferrite_rpc::config::load(&c, &setup, false).await })
        .wait()
        .expect("reactor 0 answers")
        .expect("the target's config loads");
    let mut t = Target { port: 0, ctx };
    for _ in 0..50 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let params = json!({"nqn": SUBNQN, "listen_address":
            {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}});
        if t.call("nvmf_subsystem_add_listener", params).is_ok() {
            t.port = port;
            // The engine runs for the rest of the process.
            std::mem::forget(engine);
            return t;
        }
    }
    panic!("no port to listen on");
}

/// A connection of the fuzzing host.
struct Conn {
    s: TcpStream,
    params: Negotiated,
    dec: Decoder,
    buf: Vec<u8>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the target");
        s.set_nodelay(true).unwrap();
        s.set_write_timeout(Some(PREFIX_TIMEOUT)).unwrap();
        s.set_read_timeout(Some(PREFIX_TIMEOUT)).unwrap();
        // Reset on close: no TIME_WAIT pile-up over millions of inputs.
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt reads one linger struct we own.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        Conn { s, params: Negotiated::INITIAL, dec: Decoder::new(Role::Host), buf: Vec::new() }
    }

    fn send(&mut self, pdu: &Pdu, data: &[&[u8]]) {
        let mut b = vec![0u8; 256 + data.iter().map(|d| d.len()).sum::<usize>()];
        let n = encode_contiguous(&mut b, &self.params, pdu, data).expect("frame the prefix");
        self.s.write_all(&b[..n]).expect("send the prefix");
    }

    /// The next PDU of the prefix's exchanges (header only; data is skipped).
    fn recv(&mut self) -> Pdu {
        let deadline = Instant::now() + PREFIX_TIMEOUT;
        let mut header = None;
        loop {
            assert!(Instant::now() < deadline, "the target did not answer the prefix");
            if self.buf.is_empty() {
                let mut tmp = [0u8; 4096];
                let n = self.s.read(&mut tmp).expect("the target answers the prefix");
                assert!(n > 0, "the target closed during the prefix");
                self.buf.extend_from_slice(&tmp[..n]);
            }
            match self.dec.want() {
                Want::Data(n) => {
                    let k = (n as usize).min(self.buf.len());
                    let fed = self.dec.data(&self.buf[..k]);
                    self.buf.drain(..fed.consumed);
                    if let Some(Event::DataEnd) = fed.event {
                        return header.expect("a header");
                    }
                }
                Want::Bytes(_) => {
                    let fed = self.dec.feed(&self.buf).expect("the target's prefix answers decode");
                    self.buf.drain(..fed.consumed);
                    match fed.event {
                        Some(Event::Header(h)) if h.data_len == 0 => return h.pdu,
                        Some(Event::Header(h)) => header = Some(h.pdu),
                        Some(_) => return header.expect("a header"),
                        None => {}
                    }
                }
                Want::Closed => panic!("the target's answers to the prefix do not decode"),
            }
        }
    }

    /// ICReq/ICResp.
    fn ic(&mut self, setup: u8) {
        let req = IcReq { pfv: 0, hpda: setup >> 5, hdgst: setup & 1 != 0, ddgst: setup & 2 != 0, maxr2t: 0 };
        self.send(&Pdu::IcReq(req), &[]);
        let Pdu::IcResp(resp) = self.recv() else { panic!("expected ICResp") };
        self.params = ferrite_nvmf::tcp::host_accept(&req, &resp).expect("a valid ICResp");
        self.dec.set_params(self.params);
    }

    /// A command with in-capsule data, waiting for its response; returns CQE dword 0 and
    /// whether it succeeded.
    fn command(&mut self, mut sqe: [u8; 64], icd: &[u8]) -> (u32, bool) {
        sqe[1] |= 0x40;
        if !icd.is_empty() {
            sqe[24..40].copy_from_slice(&SglDescriptor::in_capsule(0, icd.len() as u32).to_bytes());
            self.send(&Pdu::CapsuleCmd(CapsuleCmd { sqe }), &[icd]);
        } else {
            self.send(&Pdu::CapsuleCmd(CapsuleCmd { sqe }), &[]);
        }
        loop {
            if let Pdu::CapsuleResp(r) = self.recv() {
                let cqe = ferrite_nvmf::spec::cqe::Cqe::decode(&r.cqe);
                return (cqe.dw0, cqe.status.is_success());
            }
        }
    }

    /// Connect as queue `qid` of controller `cntlid`; returns the controller ID.
    fn connect(&mut self, setup: u8, qid: u16, cntlid: u16) -> u16 {
        let mut sqe = [0u8; 64];
        ConnectCommand {
            cid: 1,
            sgl1: SglDescriptor::in_capsule(0, 1024),
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: if setup & 0x10 != 0 { cattr::DISABLE_SQ_FLOW_CONTROL } else { 0 },
            kato: 0,
        }
        .encode(&mut sqe);
        let data = ConnectData {
            hostid: *b"ferrite-fuzzhost",
            cntlid,
            subnqn: NqnField::new(SUBNQN).unwrap(),
            hostnqn: NqnField::new(HOSTNQN).unwrap(),
        }
        .to_bytes();
        let (dw0, ok) = self.command(sqe, &data);
        assert!(ok, "Connect of the prefix failed");
        dw0 as u16
    }

    /// Property Set CC.EN = 1.
    fn enable(&mut self) {
        let mut sqe = [0u8; 64];
        let cc = Cc { en: true, iosqes: 6, iocqes: 4, ..Default::default() };
        PropertySetCommand { cid: 2, size: PROPERTY_SIZE_4, ofst: offset::CC, value: u64::from(cc.to_u32()) }
            .encode(&mut sqe);
        let (_, ok) = self.command(sqe, &[]);
        assert!(ok, "CC.EN of the prefix failed");
    }

    /// Reads what the target sends until it closes or is quiet. Everything it sends before a
    /// C2HTermReq must decode under the negotiated parameters, data digests included (after
    /// one, the connection is ending and the rest is not looked at).
    fn drain(&mut self) {
        self.s.set_read_timeout(Some(QUIET)).unwrap();
        let verbose = std::env::var_os("NVMF_FUZZ_VERBOSE").is_some();
        let start = Instant::now();
        let mut tmp = [0u8; 64 * 1024];
        let mut terminated = false;
        let mut pending = std::mem::take(&mut self.buf);
        loop {
            if !terminated {
                let mut at = 0;
                while at < pending.len() {
                    match self.dec.want() {
                        Want::Data(n) => {
                            let k = (n as usize).min(pending.len() - at);
                            at += self.dec.data(&pending[at..at + k]).consumed;
                        }
                        Want::Bytes(_) => {
                            let fed = match self.dec.feed(&pending[at..]) {
                                Ok(f) => f,
                                Err(e) => panic!("the target sent a PDU its host cannot decode: {e}"),
                            };
                            at += fed.consumed;
                            match fed.event {
                                Some(Event::Header(h)) => {
                                    if verbose {
                                        match h.pdu {
                                            Pdu::CapsuleResp(r) => {
                                                eprintln!("  {:?}", ferrite_nvmf::spec::cqe::Cqe::decode(&r.cqe))
                                            }
                                            p => eprintln!("  {p:?} + {} bytes", h.data_len),
                                        }
                                    }
                                    if matches!(h.pdu, Pdu::C2hTermReq(_)) {
                                        terminated = true;
                                        break;
                                    }
                                }
                                Some(Event::DataDigestError { .. }) => {
                                    panic!("the target sent data whose digest does not match")
                                }
                                _ => {}
                            }
                        }
                        Want::Closed => unreachable!("a decoder error panics first"),
                    }
                }
            }
            if start.elapsed() >= MAX_READ {
                return;
            }
            match self.s.read(&mut tmp) {
                Ok(0) => return,
                Ok(n) => pending = tmp[..n].to_vec(),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return,
                Err(_) => return,
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, bytes)) = data.split_first() else { return };
    let target = TARGET.get_or_init(start);
    let port = target.port;
    let mut admin = Conn::open(port);
    admin.ic(setup);
    let cntlid = admin.connect(setup, 0, CNTLID_DYNAMIC);
    if setup & 4 == 0 || setup & 8 != 0 {
        admin.enable();
    }
    let mut io = None;
    if setup & 8 != 0 {
        let mut q = Conn::open(port);
        q.ic(setup);
        q.connect(setup, 1, cntlid);
        io = Some(q);
    }
    let fuzzed = io.as_mut().unwrap_or(&mut admin);
    fuzzed.s.set_write_timeout(Some(Duration::from_millis(100))).unwrap();
    // The target may close the connection at any point of the bytes: fine.
    if fuzzed.s.write_all(bytes).is_ok() {
        fuzzed.drain();
    }
    drop(io);
    drop(admin);
    target.settle();
});
