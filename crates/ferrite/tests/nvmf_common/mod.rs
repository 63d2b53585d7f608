//! A small synchronous NVMe/TCP host for the NVMe-oF target's tests, and a daemon configured
//! for it by SPDK's `nvmf_*` RPCs.
//!
//! This is a mock client, on purpose: no real NVMe/TCP host (the Linux kernel's, SPDK's
//! `spdk_nvme_perf`, `nvme-cli`) sends malformed PDUs, half a write, commands before Connect,
//! more commands than its queue holds or H2CData for a transfer tag never issued, and none lets
//! a test say exactly which bytes go out when. [`Host`] speaks the protocol with the crate's
//! own codec (`ferrite_nvmf::tcp`, the same one the target uses, which has its own byte-vector
//! tests against the spec's layouts) and NVMe structures (`ferrite_nvmf::spec`): ICReq with
//! optional header and data digests and any HPDA, Fabrics Connect (admin queue with CNTLID
//! FFFFh, I/O queues with the CNTLID it returned), Property Get/Set, the admin and NVM
//! commands, reads (C2HData with or without SUCCESS, then the response capsule) and writes
//! (in-capsule up to the queue's limit, else R2T answered by H2CData split at MAXH2CDATA), and
//! raw bytes for everything a well-behaved host would never send.
//!
//! Every socket read and write has a timeout, so a target that does not answer fails the test
//! instead of hanging it.
//!
//! Test files use it with `mod common; mod nvmf_common;`.
#![allow(dead_code)]

use crate::common::{Daemon, TempDir};
use ferrite_nvmf::spec::admin::{GetLogPageCommand, IdentifyCommand, SetFeaturesCommand};
use ferrite_nvmf::spec::cqe::Cqe;
use ferrite_nvmf::spec::fabrics::{
    self, cattr, ConnectCommand, ConnectData, PropertyGetCommand, PropertySetCommand, CNTLID_DYNAMIC, PROPERTY_SIZE_4,
    PROPERTY_SIZE_8,
};
use ferrite_nvmf::spec::io::{DsmRange, RwCommand};
use ferrite_nvmf::spec::nqn::NqnField;
use ferrite_nvmf::spec::opcode::{admin as aop, nvm};
use ferrite_nvmf::spec::registers::{self, Cc, Csts};
use ferrite_nvmf::spec::sgl::SglDescriptor;
use ferrite_nvmf::spec::sqe::Sqe;
use ferrite_nvmf::spec::status::Status;
use ferrite_nvmf::tcp::{
    encode, encode_contiguous, host_accept, Decoder, Event, Header, IcReq, IcResp, Negotiated, Pdu, PduError, Role,
    Want,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long the host waits for any one PDU (or for a write to go out).
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The subsystem NQN the tests use unless they need more.
pub const SUBNQN: &str = "nqn.2016-06.io.ferrite:cnode1";
/// The host NQN of well-behaved hosts.
pub const HOSTNQN: &str = "nqn.2016-06.io.ferrite:host-good";
/// Serial number and model number given to test subsystems.
pub const SERIAL: &str = "FERRITE-SN-0001";
pub const MODEL: &str = "Ferrite NVMe test controller";

/// The one in common, here too for the tests that import it from this module.
#[allow(unused_imports)]
pub use crate::common::free_port;

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

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {s}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Raises this process's soft limit of open files to the hard limit and returns it.
pub fn raise_nofile() -> u64 {
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

// ---------------------------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------------------------

/// A running `ferrite serve` with the NVMe/TCP transport created and a port for listeners.
pub struct NvmfDaemon {
    pub d: Daemon,
    /// The port every subsystem listens on (127.0.0.1), once one does.
    pub port: u16,
}

impl NvmfDaemon {
    /// Starts `ferrite serve -m <cpumask> --no-pin` and creates the TCP transport with
    /// `transport` (more `nvmf_create_transport` parameters; `trtype` is added).
    pub fn start(dir: &TempDir, cpumask: &str, transport: Value) -> NvmfDaemon {
        let d = Daemon::start_with(dir, "rpc.sock", cpumask, &["--no-pin"]);
        let mut p = if transport.is_object() { transport } else { json!({}) };
        p["trtype"] = json!("TCP");
        assert_eq!(d.call("nvmf_create_transport", Some(p)), json!(true));
        NvmfDaemon { d, port: 0 }
    }

    /// Creates malloc bdev `name`.
    pub fn malloc(&self, name: &str, num_blocks: u64, block_size: u32) {
        self.d.call(
            "bdev_malloc_create",
            Some(json!({"name": name, "num_blocks": num_blocks, "block_size": block_size})),
        );
    }

    /// Creates null bdev `name`.
    pub fn null(&self, name: &str, num_blocks: u64, block_size: u32) {
        self.d
            .call("bdev_null_create", Some(json!({"name": name, "num_blocks": num_blocks, "block_size": block_size})));
    }

    /// Creates subsystem `nqn` (serial [`SERIAL`], model [`MODEL`]).
    pub fn subsystem(&self, nqn: &str, allow_any_host: bool) {
        let v = self.d.call(
            "nvmf_create_subsystem",
            Some(json!({"nqn": nqn, "serial_number": SERIAL, "model_number": MODEL, "allow_any_host": allow_any_host})),
        );
        assert_eq!(v, json!(true));
    }

    /// Adds `bdev` to `nqn` as a namespace; returns its NSID.
    pub fn add_ns(&self, nqn: &str, bdev: &str) -> u32 {
        let v = self.d.call("nvmf_subsystem_add_ns", Some(json!({"nqn": nqn, "namespace": {"bdev_name": bdev}})));
        v.as_u64().unwrap_or_else(|| panic!("nvmf_subsystem_add_ns returned {v}")) as u32
    }

    /// Allows `host` to connect to `nqn`.
    pub fn add_host(&self, nqn: &str, host: &str) {
        assert_eq!(self.d.call("nvmf_subsystem_add_host", Some(json!({"nqn": nqn, "host": host}))), json!(true));
    }

    /// Makes `nqn` listen on 127.0.0.1:[`NvmfDaemon::port`] (a free port is picked the first
    /// time; a port taken meanwhile by someone else is replaced by another).
    pub fn listen(&mut self, nqn: &str) {
        for _ in 0..20 {
            let port = if self.port == 0 { free_port() } else { self.port };
            let p = json!({"nqn": nqn, "listen_address":
                {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}});
            match self.d.client().call("nvmf_subsystem_add_listener", Some(p)) {
                Ok(_) => {
                    self.port = port;
                    return;
                }
                Err(e) if self.port == 0 => println!("port {port}: {e}; trying another"),
                Err(e) => panic!("nvmf_subsystem_add_listener {nqn} on port {port}: {e}"),
            }
        }
        panic!("no free port for the NVMe/TCP listener");
    }

    /// Asserts the daemon is alive (did not panic: a reactor panic aborts it) and serves RPCs.
    pub fn assert_alive(&mut self) {
        if let Some(st) = self.d.proc.child.try_wait().expect("try_wait") {
            panic!("the daemon exited ({st}); stderr:\n{}", self.d.proc.stderr());
        }
        self.d.assert_serving();
        let err = self.d.proc.stderr();
        assert!(!err.contains("panicked"), "the daemon panicked:\n{err}");
    }

    /// The daemon's resident set size in KiB; panics (with its stderr) if it died.
    pub fn rss_kib(&mut self) -> u64 {
        if let Some(st) = self.d.proc.child.try_wait().expect("try_wait") {
            panic!("the daemon exited ({st}); stderr:\n{}", self.d.proc.stderr());
        }
        status_kib(self.d.proc.pid(), "VmRSS")
    }

    /// `nvmf_subsystem_get_qpairs` of `nqn`.
    pub fn qpairs(&self, nqn: &str) -> Vec<Value> {
        self.d.call("nvmf_subsystem_get_qpairs", Some(json!({"nqn": nqn}))).as_array().unwrap().clone()
    }

    /// `nvmf_subsystem_get_controllers` of `nqn`.
    pub fn controllers(&self, nqn: &str) -> Vec<Value> {
        self.d.call("nvmf_subsystem_get_controllers", Some(json!({"nqn": nqn}))).as_array().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The host
// ---------------------------------------------------------------------------------------------

/// What a host asks for in ICReq and Connect.
#[derive(Clone, Copy, Debug)]
pub struct HostOpts {
    /// Header digests.
    pub hdgst: bool,
    /// Data digests.
    pub ddgst: bool,
    /// HPDA (0's based dwords: data in C2H PDUs at multiples of (hpda + 1) * 4 bytes).
    pub hpda: u8,
    /// CATTR Disable SQ Flow Control: the target may then end reads with C2HData SUCCESS and
    /// no response capsule.
    pub sqflow_off: bool,
    /// Keep Alive Timeout in Connect (admin queue), milliseconds; 0 disables it.
    pub kato: u32,
    /// SQSIZE in Connect (0's based).
    pub sqsize: u16,
}

impl Default for HostOpts {
    fn default() -> Self {
        HostOpts { hdgst: false, ddgst: false, hpda: 0, sqflow_off: false, kato: 0, sqsize: 31 }
    }
}

impl HostOpts {
    /// Header and data digests on.
    pub fn digests() -> HostOpts {
        HostOpts { hdgst: true, ddgst: true, ..Default::default() }
    }
}

/// Why receiving stopped.
#[derive(Debug)]
pub enum RecvError {
    /// The target closed the connection (EOF or reset).
    Closed,
    /// Nothing arrived within the read timeout.
    TimedOut,
    /// The target sent bytes the host's decoder refuses.
    Protocol(PduError),
}

/// One PDU received, with its data.
#[derive(Debug, Clone)]
pub struct Received {
    pub pdu: Pdu,
    pub data: Vec<u8>,
    /// False if the data digest did not match.
    pub digest_ok: bool,
}

/// A finished command.
#[derive(Debug, Clone)]
pub struct Completion {
    pub cqe: Cqe,
    /// Data the target sent for it (C2HData), placed at DATAO.
    pub data: Vec<u8>,
    /// True if it ended with a C2HData carrying SUCCESS instead of a response capsule.
    pub by_success_flag: bool,
}

impl Completion {
    /// The status as (SCT, SC).
    pub fn status(&self) -> (u8, u8) {
        (self.cqe.status.sct, self.cqe.status.sc)
    }

    /// Panics with `what` unless the command succeeded.
    pub fn ok(self, what: &str) -> Completion {
        assert!(self.cqe.status.is_success(), "{what}: status {:?} (cqe {:?})", self.cqe.status, self.cqe);
        self
    }
}

/// Shorthand for a status as (SCT, SC).
pub fn st(s: Status) -> (u8, u8) {
    (s.sct, s.sc)
}

/// One NVMe/TCP connection (one queue pair), driven synchronously.
pub struct Host {
    pub s: TcpStream,
    pub opts: HostOpts,
    /// ICReq as sent.
    pub icreq: IcReq,
    /// ICResp as received (after the IC exchange).
    pub icresp: Option<IcResp>,
    /// Parameters in force (after the IC exchange).
    pub params: Negotiated,
    dec: Decoder,
    rbuf: Vec<u8>,
    rpos: usize,
    /// Controller ID after Connect.
    pub cntlid: u16,
    /// Queue ID after Connect.
    pub qid: u16,
    /// In-capsule data this queue takes (8 KiB on the admin queue; set for I/O queues).
    pub icd_limit: u32,
    next_cid: u16,
    writes: HashMap<u16, Vec<u8>>,
    reads: HashMap<u16, Vec<u8>>,
    done: HashMap<u16, Completion>,
    /// R2Ts received so far.
    pub r2ts: u32,
    /// Reads that ended with the C2HData SUCCESS flag.
    pub success_flags: u32,
    /// Asynchronous completions (of AERs) seen while waiting for something else.
    pub hostnqn: String,
    pub hostid: [u8; 16],
}

impl Host {
    /// Opens a TCP connection to 127.0.0.1:`port` without sending anything.
    pub fn tcp(port: u16) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to port {port}: {e}"));
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// A host on a fresh connection, before ICReq.
    pub fn new(port: u16, opts: HostOpts) -> Host {
        let icreq = IcReq { pfv: 0, hpda: opts.hpda, hdgst: opts.hdgst, ddgst: opts.ddgst, maxr2t: 0 };
        Host {
            s: Self::tcp(port),
            opts,
            icreq,
            icresp: None,
            params: Negotiated::INITIAL,
            dec: Decoder::new(Role::Host),
            rbuf: Vec::new(),
            rpos: 0,
            cntlid: 0,
            qid: 0,
            icd_limit: fabrics_icd(),
            next_cid: 1,
            writes: HashMap::new(),
            reads: HashMap::new(),
            done: HashMap::new(),
            r2ts: 0,
            success_flags: 0,
            hostnqn: HOSTNQN.to_string(),
            hostid: *b"ferrite-testhost",
        }
    }

    /// A host on a fresh connection that has exchanged ICReq/ICResp.
    pub fn initialized(port: u16, opts: HostOpts) -> Host {
        let mut h = Host::new(port, opts);
        h.ic_exchange();
        h
    }

    /// Sends ICReq and checks ICResp (digests as asked, MAXH2CDATA sane).
    pub fn ic_exchange(&mut self) {
        let req = self.icreq;
        self.send_pdu(&Pdu::IcReq(req), &[]);
        let r = self.recv().unwrap_or_else(|e| panic!("no ICResp: {e:?}"));
        let Pdu::IcResp(resp) = r.pdu else { panic!("expected ICResp, got {:?}", r.pdu) };
        let params = host_accept(&req, &resp).unwrap_or_else(|e| panic!("ICResp {resp:?}: {e}"));
        assert_eq!(resp.hdgst, req.hdgst, "the target enables the header digest the host asks for");
        assert_eq!(resp.ddgst, req.ddgst, "the target enables the data digest the host asks for");
        assert!(resp.maxh2cdata >= 4096 && resp.maxh2cdata % 4 == 0, "MAXH2CDATA {}", resp.maxh2cdata);
        self.dec.set_params(params);
        self.params = params;
        self.icresp = Some(resp);
    }

    // ----------------------------------------------------------------- bytes and PDUs

    /// Sends raw bytes.
    pub fn send_raw(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap_or_else(|e| panic!("send {} bytes: {e}", b.len()));
    }

    /// Sends raw bytes; false if the target is gone.
    pub fn try_send_raw(&mut self, b: &[u8]) -> bool {
        self.s.write_all(b).is_ok()
    }

    /// Frames `pdu` with `data` under the negotiated parameters.
    pub fn frame(&self, pdu: &Pdu, data: &[&[u8]]) -> Vec<u8> {
        frame(&self.params, pdu, data)
    }

    /// Frames and sends `pdu`.
    pub fn send_pdu(&mut self, pdu: &Pdu, data: &[&[u8]]) {
        let b = self.frame(pdu, data);
        self.send_raw(&b);
    }

    fn fill(&mut self) -> Result<(), RecvError> {
        if self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        }
        let mut tmp = [0u8; 64 * 1024];
        match self.s.read(&mut tmp) {
            Ok(0) => Err(RecvError::Closed),
            Ok(n) => {
                self.rbuf.extend_from_slice(&tmp[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(RecvError::TimedOut),
            Err(_) => Err(RecvError::Closed),
        }
    }

    /// Receives one PDU (and its data).
    pub fn recv(&mut self) -> Result<Received, RecvError> {
        let mut header: Option<Header> = None;
        let mut data = Vec::new();
        loop {
            if self.rpos == self.rbuf.len() {
                self.fill()?;
            }
            let avail = &self.rbuf[self.rpos..];
            match self.dec.want() {
                Want::Closed => return Err(RecvError::Protocol(self.dec.failure().expect("a failure"))),
                Want::Data(n) => {
                    let k = (n as usize).min(avail.len());
                    data.extend_from_slice(&avail[..k]);
                    let fed = self.dec.data(&avail[..k]);
                    self.rpos += fed.consumed;
                    if let Some(Event::DataEnd) = fed.event {
                        let h = header.expect("data after a header");
                        return Ok(Received { pdu: h.pdu, data, digest_ok: true });
                    }
                }
                Want::Bytes(_) => {
                    let fed = self.dec.feed(avail).map_err(RecvError::Protocol)?;
                    self.rpos += fed.consumed;
                    match fed.event {
                        None => {}
                        Some(Event::Header(h)) => {
                            if h.data_len == 0 {
                                return Ok(Received { pdu: h.pdu, data, digest_ok: true });
                            }
                            data.reserve(h.data_len as usize);
                            header = Some(h);
                        }
                        Some(Event::DataEnd) => {
                            let h = header.expect("data after a header");
                            return Ok(Received { pdu: h.pdu, data, digest_ok: true });
                        }
                        Some(Event::DataDigestError { .. }) => {
                            let h = header.expect("data after a header");
                            return Ok(Received { pdu: h.pdu, data, digest_ok: false });
                        }
                    }
                }
            }
        }
    }

    /// Reads until the target closes the connection; returns the PDUs that came first (a
    /// C2HTermReq, typically). Panics if the connection is still open after `within`.
    pub fn expect_closed(&mut self, within: Duration, what: &str) -> Vec<Received> {
        self.s.set_read_timeout(Some(within)).unwrap();
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        loop {
            match self.recv() {
                Ok(r) => got.push(r),
                Err(RecvError::Closed) => return got,
                // The target's bytes after a termination request are none of the host's
                // business; what matters is that it closes.
                Err(RecvError::Protocol(_)) => {
                    self.dec = Decoder::new(Role::Host);
                    self.rbuf.clear();
                    self.rpos = 0;
                    if drain_until_closed(&mut self.s, deadline) {
                        return got;
                    }
                    panic!("{what}: connection still open after {within:?}; received {got:?}");
                }
                Err(RecvError::TimedOut) => panic!("{what}: connection still open after {within:?}; received {got:?}"),
            }
            if Instant::now() > deadline {
                panic!("{what}: connection still open after {within:?}; received {got:?}");
            }
        }
    }

    /// True if the target closes the connection within `within` (whatever it sends first).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        self.rbuf.clear();
        self.rpos = 0;
        drain_until_closed(&mut self.s, deadline)
    }

    // ----------------------------------------------------------------- commands

    /// A fresh command identifier.
    pub fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        c
    }

    /// `raw` (a Read or Write SQE) with command ID `cid`, PSDT set to SGL and a transport SGL
    /// of `len` bytes: its data moves by R2T or C2HData that this host does not track (for
    /// tests that drive the exchange by hand, or never send the data).
    pub fn with_transport_sgl(mut raw: [u8; 64], cid: u16, len: u32) -> [u8; 64] {
        raw[1] |= 0x40;
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        raw[24..40].copy_from_slice(&SglDescriptor::transport(len).to_bytes());
        raw
    }

    /// Sends a command capsule exactly as given (`raw` untouched) with in-capsule data `icd`.
    pub fn send_capsule(&mut self, raw: &[u8; 64], icd: &[u8]) {
        let pdu = Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: *raw });
        if icd.is_empty() {
            self.send_pdu(&pdu, &[]);
        } else {
            self.send_pdu(&pdu, &[icd]);
        }
    }

    /// Submits command `raw` (its CID and data pointer are filled in; PSDT is set to SGL, as
    /// Linux and SPDK hosts do for every command, Fabrics ones included): `write` data goes in
    /// the capsule when it fits the queue's in-capsule limit, else the target asks for it with
    /// R2T; `read_len` bytes are expected back. Returns the CID.
    pub fn submit(&mut self, mut raw: [u8; 64], write: Option<&[u8]>, read_len: u32) -> u16 {
        let cid = self.cid();
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        raw[1] = (raw[1] & 0x3f) | 0x40;
        let icd: &[u8] = match write {
            Some(w) if w.len() as u32 <= self.icd_limit && !w.is_empty() => {
                raw[24..40].copy_from_slice(&SglDescriptor::in_capsule(0, w.len() as u32).to_bytes());
                w
            }
            Some(w) => {
                raw[24..40].copy_from_slice(&SglDescriptor::transport(w.len() as u32).to_bytes());
                self.writes.insert(cid, w.to_vec());
                &[]
            }
            None => {
                raw[24..40].copy_from_slice(&SglDescriptor::transport(read_len).to_bytes());
                &[]
            }
        };
        if read_len > 0 {
            self.reads.insert(cid, Vec::new());
        }
        self.send_capsule(&raw, icd);
        cid
    }

    /// Sends the H2CData PDUs answering an R2T for the data of `cid` from `from` (`len` bytes),
    /// split at MAXH2CDATA.
    pub fn answer_r2t(&mut self, cid: u16, ttag: u16, from: u32, len: u32) {
        let data =
            self.writes.get(&cid).unwrap_or_else(|| panic!("R2T for CID {cid}, which has no data to send")).clone();
        assert!(
            u64::from(from) + u64::from(len) <= data.len() as u64,
            "R2T for CID {cid} asks for {len} bytes at {from}; the command has {}",
            data.len()
        );
        let max = self.params.maxh2cdata;
        let mut off = from;
        let end = from + len;
        while off < end {
            let n = (end - off).min(max);
            let chunk = &data[off as usize..(off + n) as usize];
            let last = off + n == end;
            let pdu = Pdu::H2cData(ferrite_nvmf::tcp::H2cData { cccid: cid, ttag, datao: off, datal: n, last });
            self.send_pdu(&pdu, &[chunk]);
            off += n;
        }
    }

    /// Handles one received PDU for the command state: R2Ts answered, C2HData placed,
    /// responses filed. Returns the CID it completed, if any; panics on anything a target
    /// must not send a host mid-session.
    pub fn handle(&mut self, r: Received) -> Option<u16> {
        match r.pdu {
            Pdu::R2t(t) => {
                self.r2ts += 1;
                self.answer_r2t(t.cccid, t.ttag, t.r2to, t.r2tl);
                None
            }
            Pdu::C2hData(d) => {
                assert!(r.digest_ok, "C2HData for CID {} with a bad data digest", d.cccid);
                let buf = self
                    .reads
                    .get_mut(&d.cccid)
                    .unwrap_or_else(|| panic!("C2HData for CID {}, which reads nothing", d.cccid));
                let end = d.datao as usize + r.data.len();
                if buf.len() < end {
                    buf.resize(end, 0);
                }
                buf[d.datao as usize..end].copy_from_slice(&r.data);
                if d.success {
                    assert!(d.last, "SUCCESS without LAST_PDU");
                    assert!(self.opts.sqflow_off, "C2HData SUCCESS although the host kept SQ flow control");
                    self.success_flags += 1;
                    let data = self.reads.remove(&d.cccid).unwrap_or_default();
                    self.writes.remove(&d.cccid);
                    let cqe = Cqe::new(d.cccid, Status::SUCCESS);
                    self.done.insert(d.cccid, Completion { cqe, data, by_success_flag: true });
                    return Some(d.cccid);
                }
                None
            }
            Pdu::CapsuleResp(c) => {
                let cqe = Cqe::decode(&c.cqe);
                let data = self.reads.remove(&cqe.cid).unwrap_or_default();
                self.writes.remove(&cqe.cid);
                if !self.opts.sqflow_off {
                    assert_ne!(cqe.sqhd, 0xffff, "SQHD FFFFh although SQ flow control is on");
                }
                self.done.insert(cqe.cid, Completion { cqe, data, by_success_flag: false });
                Some(cqe.cid)
            }
            Pdu::C2hTermReq(t) => {
                panic!("the target terminated the connection: FES {:#x} FEI {:#x}, data {:02x?}", t.fes, t.fei, r.data)
            }
            other => panic!("unexpected PDU from the target: {other:?}"),
        }
    }

    /// Waits for command `cid`, serving R2Ts and filing other completions on the way.
    pub fn try_wait(&mut self, cid: u16) -> Result<Completion, RecvError> {
        loop {
            if let Some(c) = self.done.remove(&cid) {
                return Ok(c);
            }
            let r = self.recv()?;
            self.handle(r);
        }
    }

    /// Waits for command `cid`; panics if the connection closes or stays silent.
    pub fn wait(&mut self, cid: u16) -> Completion {
        self.try_wait(cid).unwrap_or_else(|e| panic!("waiting for CID {cid} on queue {}: {e:?}", self.qid))
    }

    /// A completion already received, if any.
    pub fn take_done(&mut self, cid: u16) -> Option<Completion> {
        self.done.remove(&cid)
    }

    /// Submits and waits.
    pub fn cmd(&mut self, raw: [u8; 64], write: Option<&[u8]>, read_len: u32) -> Completion {
        let cid = self.submit(raw, write, read_len);
        self.wait(cid)
    }

    // ----------------------------------------------------------------- Fabrics

    /// The Connect command and data for this host (queue `qid`, controller `cntlid`, SQSIZE
    /// and KATO from the options; PSDT 01b).
    pub fn connect_capsule(&self, subnqn: &str, qid: u16, cntlid: u16) -> ([u8; 64], [u8; 1024]) {
        let mut raw = [0u8; 64];
        ConnectCommand {
            cid: 0,
            sgl1: SglDescriptor::in_capsule(0, 1024),
            recfmt: 0,
            qid,
            sqsize: self.opts.sqsize,
            cattr: if self.opts.sqflow_off { cattr::DISABLE_SQ_FLOW_CONTROL } else { 0 },
            kato: if qid == 0 { self.opts.kato } else { 0 },
        }
        .encode(&mut raw);
        // PSDT 01b (SGL), as Linux's and SPDK's hosts send in every command.
        raw[1] = 0x40;
        let data = ConnectData {
            hostid: self.hostid,
            cntlid,
            subnqn: NqnField::new(subnqn).expect("subsystem NQN fits"),
            hostnqn: NqnField::new(&self.hostnqn).expect("host NQN fits"),
        }
        .to_bytes();
        (raw, data)
    }

    /// Sends Connect and returns its completion (success or not).
    pub fn connect(&mut self, subnqn: &str, qid: u16, cntlid: u16) -> Completion {
        let (raw, data) = self.connect_capsule(subnqn, qid, cntlid);
        let c = self.cmd(raw, Some(&data), 0);
        if c.cqe.status.is_success() {
            self.cntlid = fabrics::ConnectSuccess::from_dw0(c.cqe.dw0).cntlid;
            self.qid = qid;
        }
        c
    }

    /// Property Get; panics unless it succeeds.
    pub fn prop_get(&mut self, ofst: u32) -> u64 {
        let size = if registers::property_size(ofst) == Some(8) { PROPERTY_SIZE_8 } else { PROPERTY_SIZE_4 };
        let mut raw = [0u8; 64];
        PropertyGetCommand { cid: 0, size, ofst }.encode(&mut raw);
        let c = self.cmd(raw, None, 0).ok("Property Get");
        c.cqe.result_u64()
    }

    /// Property Set; returns the completion.
    pub fn prop_set(&mut self, ofst: u32, value: u64) -> Completion {
        let size = if registers::property_size(ofst) == Some(8) { PROPERTY_SIZE_8 } else { PROPERTY_SIZE_4 };
        let mut raw = [0u8; 64];
        PropertySetCommand { cid: 0, size, ofst, value }.encode(&mut raw);
        self.cmd(raw, None, 0)
    }

    /// CC.EN = 1 with IOSQES 6 and IOCQES 4, then waits for CSTS.RDY.
    pub fn enable(&mut self) {
        let cc = Cc { en: true, iosqes: 6, iocqes: 4, ..Cc::default() };
        self.prop_set(registers::offset::CC, u64::from(cc.to_u32())).ok("Property Set CC.EN=1");
        let deadline = Instant::now() + IO_TIMEOUT;
        while !Csts::from_u32(self.prop_get(registers::offset::CSTS) as u32).rdy {
            assert!(Instant::now() < deadline, "CSTS.RDY not set after CC.EN");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A full admin queue: ICReq, Connect (QID 0, CNTLID FFFFh), CC.EN, CSTS.RDY.
    pub fn admin(port: u16, subnqn: &str, opts: HostOpts) -> Host {
        let mut h = Host::initialized(port, opts);
        h.connect(subnqn, 0, CNTLID_DYNAMIC).ok("admin Connect");
        h.enable();
        h
    }

    /// A full I/O queue `qid` of controller `cntlid`.
    pub fn io(port: u16, subnqn: &str, cntlid: u16, qid: u16, opts: HostOpts, icd_limit: u32) -> Host {
        let mut h = Host::initialized(port, opts);
        let c = h.connect(subnqn, qid, cntlid).ok("I/O Connect");
        assert_eq!(fabrics::ConnectSuccess::from_dw0(c.cqe.dw0).cntlid, cntlid, "I/O Connect answers the controller");
        h.icd_limit = icd_limit;
        h
    }

    // ----------------------------------------------------------------- admin commands

    /// An SQE's bytes.
    pub fn sqe(opcode: u8, nsid: u32, f: impl FnOnce(&mut Sqe)) -> [u8; 64] {
        let mut s = Sqe::new(opcode, 0, nsid);
        f(&mut s);
        s.to_bytes()
    }

    /// Identify with `cns` for `nsid` (CSI `csi`); 4096 bytes back.
    pub fn identify(&mut self, cns: u8, nsid: u32, csi: u8) -> Completion {
        let raw = Self::sqe(aop::IDENTIFY, nsid, |s| IdentifyCommand { cns, csi, ..Default::default() }.apply(s));
        self.cmd(raw, None, 4096)
    }

    /// Keep Alive.
    pub fn keep_alive(&mut self) -> Completion {
        self.cmd(Self::sqe(aop::KEEP_ALIVE, 0, |_| {}), None, 0)
    }

    /// Get Log Page `lid`, `len` bytes (a multiple of 4), RAE as given.
    pub fn get_log_page(&mut self, lid: u8, len: u32, rae: bool) -> Completion {
        let raw = Self::sqe(aop::GET_LOG_PAGE, 0xffff_ffff, |s| {
            let mut g = GetLogPageCommand { lid, rae, ..Default::default() };
            g.set_transfer_len(u64::from(len));
            g.apply(s)
        });
        self.cmd(raw, None, len)
    }

    /// Set Features `fid` to `value` (CDW11).
    pub fn set_features(&mut self, fid: u8, value: u32) -> Completion {
        let raw = Self::sqe(aop::SET_FEATURES, 0, |s| {
            SetFeaturesCommand { fid, cdw11: value, ..Default::default() }.apply(s)
        });
        self.cmd(raw, None, 0)
    }

    /// Submits an Asynchronous Event Request; returns its CID.
    pub fn submit_aer(&mut self) -> u16 {
        self.submit(Self::sqe(aop::ASYNC_EVENT_REQUEST, 0, |_| {}), None, 0)
    }

    // ----------------------------------------------------------------- NVM commands

    /// The SQE of a Read, Write or Compare of `nlb` blocks at `slba`.
    pub fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> [u8; 64] {
        assert!((1..=65536).contains(&nlb), "NLB {nlb}");
        Self::sqe(opcode, nsid, |s| RwCommand { slba, nlb: (nlb - 1) as u16, ..Default::default() }.apply(s))
    }

    /// Reads `nlb` blocks of `bs` bytes at `slba`.
    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32, bs: u32) -> Completion {
        self.cmd(Self::rw_sqe(nvm::READ, nsid, slba, nlb), None, nlb * bs)
    }

    /// Writes `data` (whole blocks of `bs`) at `slba`.
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], bs: u32) -> Completion {
        let nlb = (data.len() / bs as usize) as u32;
        self.cmd(Self::rw_sqe(nvm::WRITE, nsid, slba, nlb), Some(data), 0)
    }

    /// Compares `data` with the blocks at `slba`.
    pub fn compare(&mut self, nsid: u32, slba: u64, data: &[u8], bs: u32) -> Completion {
        let nlb = (data.len() / bs as usize) as u32;
        self.cmd(Self::rw_sqe(nvm::COMPARE, nsid, slba, nlb), Some(data), 0)
    }

    /// Write Zeroes of `nlb` blocks at `slba`.
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32) -> Completion {
        let raw = Self::sqe(nvm::WRITE_ZEROES, nsid, |s| {
            s.cdw10 = slba as u32;
            s.cdw11 = (slba >> 32) as u32;
            s.cdw12 = nlb - 1;
        });
        self.cmd(raw, None, 0)
    }

    /// Dataset Management with Deallocate of `ranges` (slba, nlb).
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Completion {
        let rs: Vec<DsmRange> =
            ranges.iter().map(|&(slba, nlb)| DsmRange { context_attributes: 0, nlb, slba }).collect();
        let mut data = vec![0u8; rs.len() * DsmRange::SIZE];
        DsmRange::write_all(&rs, &mut data);
        let raw = Self::sqe(nvm::DATASET_MANAGEMENT, nsid, |s| {
            s.cdw10 = (rs.len() - 1) as u32;
            s.cdw11 = 1 << 2;
        });
        self.cmd(raw, Some(&data), 0)
    }
}

/// Frames `pdu` with `data` under `params` into one buffer.
pub fn frame(params: &Negotiated, pdu: &Pdu, data: &[&[u8]]) -> Vec<u8> {
    let len: usize = data.iter().map(|d| d.len()).sum();
    let mut b = vec![0u8; 160 + len + 4];
    let n = encode_contiguous(&mut b, params, pdu, data).unwrap_or_else(|e| panic!("frame {pdu:?}: {e}"));
    b.truncate(n);
    b
}

/// Frames `pdu` with `data` and returns (bytes, where the data digest sits) so that a test can
/// corrupt it; None if the PDU has no data digest.
pub fn frame_with_digest_at(params: &Negotiated, pdu: &Pdu, data: &[&[u8]]) -> (Vec<u8>, Option<usize>) {
    let mut head = [0u8; 160];
    let f = encode(&mut head, params, pdu, data).unwrap_or_else(|e| panic!("frame {pdu:?}: {e}"));
    let b = frame(params, pdu, data);
    (b, f.data_digest.map(|_| f.plen as usize - 4))
}

/// The in-capsule limit of Fabrics commands and of the admin queue.
pub fn fabrics_icd() -> u32 {
    ferrite_nvmf::tcp::pdu::ADMIN_MAX_ICD
}

/// True if the peer closes `s` within `within` (bytes it sends first are dropped).
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    drain_until_closed(s, Instant::now() + within)
}

/// Reads and drops bytes until EOF/reset (true) or `deadline` (false).
fn drain_until_closed(s: &mut TcpStream, deadline: Instant) -> bool {
    let mut b = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A controller with its queues
// ---------------------------------------------------------------------------------------------

/// A controller as a host sees it: the admin queue and `n` I/O queues (QIDs 1..=n).
pub struct Session {
    pub admin: Host,
    pub io: Vec<Host>,
}

impl Session {
    /// Connects the admin queue and `n` I/O queues of a new controller of `subnqn`. The I/O
    /// queues take `icd` bytes in the capsule (the transport's in_capsule_data_size).
    pub fn open(port: u16, subnqn: &str, n: u16, opts: HostOpts, icd: u32) -> Session {
        let admin = Host::admin(port, subnqn, opts);
        let cntlid = admin.cntlid;
        let io = (1..=n).map(|q| Host::io(port, subnqn, cntlid, q, opts, icd)).collect();
        Session { admin, io }
    }

    /// The controller ID.
    pub fn cntlid(&self) -> u16 {
        self.admin.cntlid
    }
}

/// The well-behaved host's check, used after each bad input: a new controller with one I/O
/// queue writes a pattern in capsule and by R2T, reads both back, and reads the identify data.
pub fn assert_good_host(port: u16, subnqn: &str, nsid: u32, bs: u32, seed: u64) {
    let mut s = Session::open(port, subnqn, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    let small = pattern(seed, bs as usize);
    let large = pattern(seed + 1, 16 * 1024);
    q.write(nsid, 0, &small, bs).ok("good host: in-capsule write");
    q.write(nsid, 8, &large[..(large.len() / bs as usize) * bs as usize], bs).ok("good host: R2T write");
    assert_eq!(q.read(nsid, 0, 1, bs).ok("good host: read").data, small, "good host reads back its write");
    let n = (large.len() / bs as usize) as u32;
    assert_eq!(q.read(nsid, 8, n, bs).ok("good host: read").data, large[..(n * bs) as usize], "good host read");
    s.admin.identify(ferrite_nvmf::spec::identify::cns::CONTROLLER, 0, 0).ok("good host: identify");
    s.admin.keep_alive().ok("good host: keep alive");
}
