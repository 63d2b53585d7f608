//! Helpers of the iSCSI target's tests: a daemon with a portal group and an open initiator
//! group, target nodes over malloc bdevs, the real initiators (libiscsi's tools, qemu-img:
//! SKIP when missing), and a small synchronous initiator on the crate's own codec for what
//! well-behaved initiators never send.
//!
//! Test files use it with `mod common; mod iscsi_common;`.
#![allow(dead_code)]

use crate::common::{Daemon, TempDir};
use ferrite_iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginError, InitiatorStep};
use ferrite_iscsi::negotiate::{InitiatorOptions, Negotiated};
use ferrite_iscsi::pdu::{
    decode_whole, encode_to_vec, frame_status, DataOut, FrameStatus, Pdu, PduParams, Role, ScsiCommand, TaskAttr,
    BHS_LEN, RESERVED_TAG,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for any one PDU or tool.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The node base target names get.
pub const BASE: &str = "iqn.2016-06.io.spdk";

/// The one in common, here too for the tests that import it from this module.
#[allow(unused_imports)]
pub use crate::common::free_port;

/// `name` on the PATH, if there.
pub fn tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}

/// The paths of `names`, or None after printing why `test` is skipped.
pub fn tools(test: &str, names: &[&str]) -> Option<Vec<PathBuf>> {
    let mut out = Vec::new();
    for n in names {
        match tool(n) {
            Some(p) => out.push(p),
            None => {
                println!(
                    "SKIP {test}: {n} is not installed (scripts/test.sh installs libiscsi-bin and qemu-block-extra)"
                );
                return None;
            }
        }
    }
    Some(out)
}

/// Runs `cmd` with `envs` to its end, killing it after `timeout`.
pub fn run(cmd: &PathBuf, args: &[&str], envs: &[(&str, &str)], timeout: Duration) -> Output {
    let mut c = Command::new(cmd);
    c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", cmd.display()));
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{} {args:?} did not finish in {timeout:?}; stdout:\n{}\nstderr:\n{}",
                cmd.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon with portal group 1 on 127.0.0.1:`port` and initiator group 1 (any name, any
/// address).
pub struct IscsiDaemon {
    pub d: Daemon,
    pub port: u16,
}

impl IscsiDaemon {
    /// Starts `ferrite serve -m <cpumask> --no-pin` with the groups made.
    pub fn start(dir: &TempDir, cpumask: &str) -> IscsiDaemon {
        IscsiDaemon::start_with_options(dir, cpumask, None)
    }

    /// As [`IscsiDaemon::start`], with `iscsi_set_options` called with `options` first (at
    /// startup, as SPDK takes it).
    pub fn start_with_options(dir: &TempDir, cpumask: &str, options: Option<Value>) -> IscsiDaemon {
        let d = match options {
            None => Daemon::start_with(dir, "rpc.sock", cpumask, &["--no-pin"]),
            Some(o) => {
                let d = Daemon::start_with(dir, "rpc.sock", cpumask, &["--no-pin", "--wait-for-rpc"]);
                d.call("iscsi_set_options", Some(o));
                d.call("framework_start_init", None);
                d
            }
        };
        let port = free_port();
        d.call(
            "iscsi_create_portal_group",
            Some(json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]})),
        );
        d.call("iscsi_create_initiator_group", Some(json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]})));
        IscsiDaemon { d, port }
    }

    /// Malloc bdev `name`.
    pub fn malloc(&self, name: &str, num_blocks: u64, block_size: u32) {
        self.d.call(
            "bdev_malloc_create",
            Some(json!({"name": name, "num_blocks": num_blocks, "block_size": block_size})),
        );
    }

    /// Target node `name` with LUN 0 over `bdev`, reached through portal group 1, with more
    /// parameters from `extra`; returns its full name.
    pub fn target(&self, name: &str, bdev: &str, extra: Value) -> String {
        let mut p = json!({"name": name, "alias_name": "", "luns": [{"bdev_name": bdev, "lun_id": 0}],
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 32});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p[k] = v;
            }
        }
        self.d.call("iscsi_create_target_node", Some(p));
        format!("{BASE}:{name}")
    }

    /// libiscsi's URL of LUN 0 of `iqn` (with `user` and `secret` for CHAP).
    pub fn url(&self, iqn: &str, chap: Option<(&str, &str)>) -> String {
        match chap {
            Some((u, s)) => format!("iscsi://{u}%{s}@127.0.0.1:{}/{iqn}/0", self.port),
            None => format!("iscsi://127.0.0.1:{}/{iqn}/0", self.port),
        }
    }

    /// `iscsi_get_connections`.
    pub fn connections(&self) -> Vec<Value> {
        self.d.call("iscsi_get_connections", None).as_array().unwrap().clone()
    }

    /// Waits until `iscsi_get_connections` lists `n` connections (panics after `within`).
    pub fn wait_connections(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let got = self.connections().len();
            if got == n {
                return;
            }
            assert!(Instant::now() < deadline, "{got} connections listed after {within:?}, expected {n}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A received PDU with its data.
pub struct Got {
    pub pdu: Pdu,
    pub bhs: [u8; BHS_LEN],
    pub data: Vec<u8>,
}

/// A minimal synchronous initiator over the crate's codec.
pub struct Ini {
    pub s: TcpStream,
    pub rx: PduParams,
    pub tx: PduParams,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub next_itt: u32,
    pub max_cmd_sn: u32,
    pub negotiated: Negotiated,
    /// The session's TSIH.
    pub tsih: u16,
}

/// A TCP connection to the portal with timeouts set.
pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the portal");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one whole PDU under `params`; None at end of stream.
pub fn read_pdu(s: &mut TcpStream, params: &PduParams) -> Option<Got> {
    let mut buf = Vec::new();
    loop {
        let need = match frame_status(&buf, params).expect("a frame the target may send") {
            FrameStatus::Complete { .. } => break,
            FrameStatus::Need(n) => n,
        };
        let at = buf.len();
        buf.resize(at + need, 0);
        if let Err(e) = s.read_exact(&mut buf[at..]) {
            assert!(
                matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset),
                "receive: {e}"
            );
            return None;
        }
    }
    let d = decode_whole(Role::Initiator, params, &buf).unwrap().expect("a valid PDU from the target");
    assert!(!matches!(d.data_digest, ferrite_iscsi::pdu::DigestCheck::Mismatch { .. }), "data digest mismatch");
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(&buf[..BHS_LEN]);
    Some(Got { pdu: d.header.pdu, bhs, data: d.data.to_vec() })
}

/// True if the peer closed `s` (reads end of stream) within `within`.
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if Instant::now() > deadline {
            return false;
        }
    }
}

/// What a SCSI command ended with.
#[derive(Debug)]
pub struct ScsiResult {
    pub status: u8,
    pub data: Vec<u8>,
    pub sense: Vec<u8>,
    pub residual: u32,
    pub underflow: bool,
    pub overflow: bool,
}

impl Ini {
    /// Logs in to `target` (None: discovery) with `opts`.
    pub fn login(port: u16, target: Option<&str>, opts: InitiatorOptions) -> Result<Ini, InitiatorLoginError> {
        Ini::login_with(port, target, |c| c.options = opts)
    }

    /// Logs in with the configuration `f` makes.
    pub fn login_with(
        port: u16,
        target: Option<&str>,
        f: impl FnOnce(&mut InitiatorLoginConfig),
    ) -> Result<Ini, InitiatorLoginError> {
        let mut s = connect(port);
        let mut cfg = InitiatorLoginConfig::new("iqn.2026-01.io.ferrite:test-initiator", target);
        f(&mut cfg);
        let mut login = InitiatorLogin::new(cfg);
        let mut step = login.start();
        loop {
            match step {
                InitiatorStep::Send { request, data } => {
                    let wire = encode_to_vec(&PduParams::LOGIN, &Pdu::LoginRequest(request), &[], &data).unwrap();
                    s.write_all(&wire).unwrap();
                    let got = read_pdu(&mut s, &PduParams::LOGIN).expect("a Login Response");
                    let Pdu::LoginResponse(r) = got.pdu else { panic!("expected a Login Response, got {:?}", got.pdu) };
                    step = login.on_response(&r, &got.data, &mut ferrite_iscsi::chap::system_random)?;
                }
                InitiatorStep::Done(done) => {
                    let c = done.negotiated.connection;
                    return Ok(Ini {
                        s,
                        rx: c.rx(),
                        tx: c.tx(),
                        cmd_sn: done.exp_cmd_sn,
                        exp_stat_sn: done.exp_stat_sn,
                        next_itt: 1,
                        max_cmd_sn: done.max_cmd_sn,
                        negotiated: done.negotiated.clone(),
                        tsih: done.tsih,
                    });
                }
            }
        }
    }

    /// Sends `pdu` with `data`.
    pub fn send(&mut self, pdu: &Pdu, data: &[u8]) {
        let wire = encode_to_vec(&self.tx, pdu, &[], data).unwrap();
        self.s.write_all(&wire).unwrap();
    }

    /// The next PDU (panics at end of stream).
    pub fn recv(&mut self) -> Got {
        let rx = self.rx;
        let g = read_pdu(&mut self.s, &rx).expect("a PDU, not the end of the connection");
        if let Some((stat_sn, max)) = status_of(&g.pdu) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
            self.max_cmd_sn = max;
        }
        g
    }

    /// A fresh ITT.
    pub fn itt(&mut self) -> u32 {
        self.next_itt += 1;
        self.next_itt
    }

    /// Sends a SCSI command (immediate data as the session allows, the rest by R2T) and returns
    /// what it ended with.
    pub fn scsi(&mut self, cdb: &[u8], read: u32, write: &[u8]) -> ScsiResult {
        self.scsi_lun(0, cdb, read, write)
    }

    /// As [`Ini::scsi`], to LUN `lun` (below 256: peripheral addressing).
    pub fn scsi_lun(&mut self, lun: u8, cdb: &[u8], read: u32, write: &[u8]) -> ScsiResult {
        let lun_field = u64::from(lun) << 48;
        let itt = self.itt();
        let imm_max = if self.negotiated.session.immediate_data {
            self.negotiated.session.first_burst_length.min(self.tx.max_data_segment) as usize
        } else {
            0
        };
        let imm = write.len().min(imm_max);
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: read > 0,
            write: !write.is_empty(),
            attr: TaskAttr::Simple,
            lun: lun_field,
            itt,
            expected_data_transfer_length: if write.is_empty() { read } else { write.len() as u32 },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(&Pdu::ScsiCommand(cmd), &write[..imm]);
        let mut data = vec![0u8; read as usize];
        loop {
            let g = self.recv();
            match g.pdu {
                Pdu::R2t(r) => {
                    assert_eq!(r.itt, itt);
                    let (mut off, end) = (r.buffer_offset, r.buffer_offset + r.desired_data_transfer_length);
                    let mut sn = 0;
                    while off < end {
                        let n = (end - off).min(self.tx.max_data_segment);
                        let d = DataOut {
                            final_: off + n == end,
                            lun: lun_field,
                            itt,
                            ttt: r.ttt,
                            exp_stat_sn: self.exp_stat_sn,
                            data_sn: sn,
                            buffer_offset: off,
                        };
                        self.send(&Pdu::DataOut(d), &write[off as usize..(off + n) as usize]);
                        off += n;
                        sn += 1;
                    }
                }
                Pdu::DataIn(d) => {
                    assert_eq!(d.itt, itt);
                    let at = d.buffer_offset as usize;
                    data[at..at + g.data.len()].copy_from_slice(&g.data);
                    if d.status_present {
                        return ScsiResult {
                            status: d.status,
                            data,
                            sense: Vec::new(),
                            residual: d.residual_count,
                            underflow: d.underflow,
                            overflow: d.overflow,
                        };
                    }
                }
                Pdu::ScsiResponse(r) => {
                    assert_eq!(r.itt, itt);
                    let sense = if g.data.len() >= 2 { g.data[2..].to_vec() } else { Vec::new() };
                    return ScsiResult {
                        status: r.status,
                        data,
                        sense,
                        residual: r.residual_count,
                        underflow: r.underflow,
                        overflow: r.overflow,
                    };
                }
                Pdu::NopIn(n) if n.itt == RESERVED_TAG => self.answer_nop(&n),
                other => panic!("unexpected {other:?} for a SCSI command"),
            }
        }
    }

    /// Answers the target's NOP-In (its TTT back, ITT 0xffffffff, immediate).
    pub fn answer_nop(&mut self, n: &ferrite_iscsi::pdu::NopIn) {
        let out = ferrite_iscsi::pdu::NopOut {
            immediate: true,
            lun: n.lun,
            itt: RESERVED_TAG,
            ttt: n.ttt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        self.send(&Pdu::NopOut(out), &[]);
    }

    /// A WRITE(10) of `blocks` 512-byte blocks at `lba` with F as `final_` and the next CmdSN
    /// (for a test that sends its data itself).
    pub fn write_cmd(&mut self, itt: u32, lba: u32, blocks: u16, final_: bool) -> ScsiCommand {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let cmd = ScsiCommand {
            immediate: false,
            final_,
            read: false,
            write: true,
            attr: TaskAttr::Simple,
            lun: 0,
            itt,
            expected_data_transfer_length: u32::from(blocks) * 512,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        cmd
    }

    /// TEST UNIT READY; its status.
    pub fn tur(&mut self) -> u8 {
        self.scsi(&[0; 6], 0, &[]).status
    }

    /// WRITE(10) of `data` at `lba` (512-byte blocks).
    pub fn write10(&mut self, lba: u32, data: &[u8]) -> ScsiResult {
        let blocks = (data.len() / 512) as u16;
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        self.scsi(&cdb, 0, data)
    }

    /// READ(10) of `blocks` 512-byte blocks at `lba`.
    pub fn read10(&mut self, lba: u32, blocks: u16) -> ScsiResult {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        self.scsi(&cdb, u32::from(blocks) * 512, &[])
    }
}

/// StatSN and MaxCmdSN of a PDU that carries status.
fn status_of(p: &Pdu) -> Option<(u32, u32)> {
    match p {
        Pdu::ScsiResponse(r) => Some((r.stat_sn, r.max_cmd_sn)),
        Pdu::DataIn(d) if d.status_present => Some((d.stat_sn, d.max_cmd_sn)),
        Pdu::NopIn(n) if n.itt != RESERVED_TAG => Some((n.stat_sn, n.max_cmd_sn)),
        Pdu::TaskMgmtResponse(r) => Some((r.stat_sn, r.max_cmd_sn)),
        Pdu::TextResponse(r) => Some((r.stat_sn, r.max_cmd_sn)),
        Pdu::LogoutResponse(r) => Some((r.stat_sn, r.max_cmd_sn)),
        Pdu::Reject(r) => Some((r.stat_sn, r.max_cmd_sn)),
        _ => None,
    }
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
