//! Ferrite's NVMe/TCP host against a controller that lies. No real controller sends bad data
//! on purpose, so this one is a mock: a small NVMe/TCP controller in this file (one namespace
//! of 4 KiB blocks), honest for the admin queue, and for reads either honest or sending the
//! same first 4 KiB again and again at offset 0 until the read's length is reached. The host
//! must fail such a read, never complete it with the parts of its buffer that the data never
//! reached (they hold what the buffer held before: another volume's data). With data digests,
//! a read whose data fails its digest and whose response comes late: the host must hold the
//! read's command ID until that response, or a later command reusing the ID would be completed
//! by it.

mod common;
mod nbd_common;

use common::{Daemon, TempDir};
use nbd_common::{have, try_qemu_io};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const NQN: &str = "nqn.2016-06.io.ferrite:liar";
const BLOCKS: u64 = 4096;
/// The byte every honest read returns.
const HONEST: u8 = 0xa7;
/// What the host's buffers held before: a secret of another volume.
const SECRET: u8 = 0x5a;

#[derive(Clone, Copy)]
enum Reads {
    Honest,
    /// The first 4 KiB sent again at offset 0 until the read's length is reached; the last
    /// PDU with SUCCESS if true, else followed by a successful response capsule.
    Repeated {
        success: bool,
    },
    /// Data digests negotiated (if the host asks); every read's data carries a wrong digest
    /// and its successful response capsule follows `LATE` after it.
    BadDigestLateResponse,
    /// The first read of block `HELD_LBA` is never answered (its connection stays open and
    /// answers everything else). An Abort of it completes it as aborted if `honour_abort`;
    /// otherwise the controller answers that it could not abort it.
    Unanswered {
        honour_abort: bool,
    },
    /// The first read of each of the `MANY` blocks from `HELD_LBA` is never answered, and an
    /// Abort of one completes it as aborted. The controller takes one Abort at a time (ACL 0):
    /// it answers each after `ABORT_TAKES`, and an Abort sent before that answer with "Abort
    /// Command Limit Exceeded".
    ManyUnanswered,
    /// As `Unanswered`, and Keep Alive commands are never answered either.
    Mute,
    /// Identify is never answered.
    NoIdentify,
    /// Every I/O queue's Connect is refused (Connect Invalid Parameters), as a controller
    /// out of queues or refusing the queue's size does; the admin queue works.
    RefusedIoQueue,
    /// Honest, except that once, when a read comes after another on its connection, the
    /// earlier read's response is sent again first (a controller's bug).
    RepeatedResponse,
    /// Every I/O queue's Connect response is sent twice: each I/O queue pair fails as soon as
    /// it is connected (the repeated response names no outstanding command).
    RepeatedConnectResponse,
    /// A read's C2HData carries 4 KiB more than the read asked for.
    LongRead,
    /// Identify answers with 8 KiB of data, twice what the host asked for.
    LongIdentify,
    /// The ICResp says MAXH2CDATA 17 (it must be at least 4096, a multiple of 4).
    BadIcResp,
    /// No read is ever answered, and an Abort of one answers "not aborted"; everything else
    /// is answered (Keep Alive too: the controller is never lost).
    NoneAnswered,
}

/// The block whose first read `Reads::Unanswered` and `Reads::Mute` hold.
const HELD_LBA: u64 = 8;

/// How many reads `Reads::ManyUnanswered` holds.
const MANY: u64 = 6;

/// How long `Reads::ManyUnanswered` takes to answer an Abort.
const ABORT_TAKES: std::time::Duration = std::time::Duration::from_millis(100);

/// What a mock controller saw, for the test to check.
#[derive(Default)]
struct Seen {
    /// Admin queue Connects.
    admin_connects: std::sync::atomic::AtomicUsize,
    /// The held read: its queue, its CID and its connection.
    held: std::sync::Mutex<Option<(u16, u16, TcpStream)>>,
    /// Aborts: (SQID, CID).
    aborts: std::sync::Mutex<Vec<(u16, u16)>>,
    /// The reads `Reads::ManyUnanswered` holds: queue, CID, block and connection.
    many_held: std::sync::Mutex<Vec<(u16, u16, u64, TcpStream)>>,
    /// Aborts that came while another was outstanding.
    over_limit: std::sync::atomic::AtomicUsize,
    /// I/O queue Connects.
    io_connects: std::sync::atomic::AtomicUsize,
    /// `Reads::RepeatedResponse` has sent its repeated response.
    repeated: std::sync::atomic::AtomicBool,
}

impl Seen {
    fn admin_connects(&self) -> usize {
        self.admin_connects.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn held(&self) -> Option<(u16, u16)> {
        self.held.lock().unwrap().as_ref().map(|(q, c, _)| (*q, *c))
    }

    fn aborts(&self) -> Vec<(u16, u16)> {
        self.aborts.lock().unwrap().clone()
    }

    fn over_limit(&self) -> usize {
        self.over_limit.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Commands that came with the ID of a read whose response was still owed.
static CID_REUSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How late the response of a read with a bad data digest comes.
const LATE: std::time::Duration = std::time::Duration::from_millis(1500);

/// A common header.
fn ch(t: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut v = vec![t, flags, hlen, pdo];
    v.extend_from_slice(&plen.to_le_bytes());
    v
}

fn response(qid: u16, cid: u16, dw0: u32, dw1: u32) -> Vec<u8> {
    response_status(qid, cid, dw0, dw1, 0)
}

/// A response capsule with status field `status` (SC in bits 1-8, SCT in bits 9-11).
fn response_status(qid: u16, cid: u16, dw0: u32, dw1: u32, status: u16) -> Vec<u8> {
    let mut v = ch(5, 0, 24, 0, 24);
    v.extend_from_slice(&dw0.to_le_bytes());
    v.extend_from_slice(&dw1.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&qid.to_le_bytes());
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&status.to_le_bytes());
    v
}

/// Command specific status 82h of a Connect: Connect Invalid Parameters.
const CONNECT_INVALID_PARAMETERS: u16 = 1 << 9 | 0x82 << 1;
/// Status Aborted by Request (generic, 07h).
const ABORTED_BY_REQUEST: u16 = 0x07 << 1;
/// Command specific status 03h of an Abort: Abort Command Limit Exceeded.
const ABORT_LIMIT_EXCEEDED: u16 = 1 << 9 | 0x03 << 1;

fn c2h_data(cid: u16, datao: u32, data: &[u8], flags: u8) -> Vec<u8> {
    c2h_data_digest(cid, datao, data, flags, None)
}

/// A C2HData PDU; with `ddgst`, its data digest follows the data: the right one, or a wrong
/// one if `ddgst` is Some(false).
fn c2h_data_digest(cid: u16, datao: u32, data: &[u8], flags: u8, ddgst: Option<bool>) -> Vec<u8> {
    let extra = if ddgst.is_some() { 4 } else { 0 };
    let flags = flags | if ddgst.is_some() { DDGSTF } else { 0 };
    let mut v = ch(7, flags, 24, 24, 24 + data.len() as u32 + extra);
    v.extend_from_slice(&cid.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&datao.to_le_bytes());
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(data);
    if let Some(right) = ddgst {
        let d = ferrite_nvmf::tcp::digest::data_digest(&[data]) ^ u32::from(!right);
        v.extend_from_slice(&ferrite_nvmf::tcp::digest::to_wire(d));
    }
    v
}

const DDGSTF: u8 = 0x02;
const LAST: u8 = 0x04;
const SUCCESS: u8 = 0x08;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The controller's Identify data for CNS `cns`.
fn identify(cns: u32) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    match cns {
        1 => {
            d[4..24].copy_from_slice(b"LIAR0001            ");
            d[24..64].copy_from_slice(&[b' '; 40]);
            d[24..28].copy_from_slice(b"Liar");
            d[64..72].copy_from_slice(b"1.0     ");
            d[77] = 5; // MDTS: 128 KiB
            d[78..80].copy_from_slice(&1u16.to_le_bytes());
            d[80..84].copy_from_slice(&0x10400u32.to_le_bytes());
            d[516..520].copy_from_slice(&1u32.to_le_bytes()); // one namespace
            d[536..540].copy_from_slice(&(1u32 | 1 << 2).to_le_bytes()); // SGLs
            d[768..768 + NQN.len()].copy_from_slice(NQN.as_bytes());
            d[1792..1796].copy_from_slice(&(4u32 + 256).to_le_bytes()); // IOCCSZ
            d[1796..1800].copy_from_slice(&1u32.to_le_bytes()); // IORCSZ
        }
        0 => {
            for at in [0, 8, 16] {
                d[at..at + 8].copy_from_slice(&BLOCKS.to_le_bytes());
            }
            d[128..132].copy_from_slice(&(12u32 << 16).to_le_bytes()); // LBA format 0: 4 KiB
        }
        2 => d[0..4].copy_from_slice(&1u32.to_le_bytes()),
        _ => {}
    }
    d
}

/// Serves one connection until it closes.
fn serve(mut s: TcpStream, reads: Reads, seen: &Seen) -> std::io::Result<()> {
    let mut qid = 0u16;
    let mut cc = 0u64;
    // Data digests on this connection: Some(true) for right ones.
    let mut ddgst = None;
    // An Abort came before the answer to the one before it.
    let mut abort_over_limit = false;
    // The last read answered on this connection: (queue, CID).
    let mut last_read: Option<(u16, u16)> = None;
    loop {
        let mut h = [0u8; 8];
        s.read_exact(&mut h)?;
        let plen = u32_at(&h, 4) as usize;
        let mut rest = vec![0u8; plen.saturating_sub(8)];
        s.read_exact(&mut rest)?;
        match h[0] {
            0 => {
                // ICResp: PFV 0, CPDA 0, MAXH2CDATA 128 KiB; data digests if asked for in
                // the mode that has them, no header digests.
                let dgst = if matches!(reads, Reads::BadDigestLateResponse) { rest[3] & 0x02 } else { 0 };
                if dgst != 0 {
                    ddgst = Some(true);
                }
                let mut v = ch(1, 0, 128, 0, 128);
                v.extend_from_slice(&[0, 0, 0, dgst]);
                let maxh2cdata: u32 = if matches!(reads, Reads::BadIcResp) { 17 } else { 131072 };
                v.extend_from_slice(&maxh2cdata.to_le_bytes());
                v.resize(128, 0);
                s.write_all(&v)?;
                continue;
            }
            4 => {}
            _ => continue,
        }
        let sqe = &rest[..64];
        let (opc, cid) = (sqe[0], u16::from_le_bytes([sqe[2], sqe[3]]));
        let sgl_len = u32_at(sqe, 32) as usize;
        let (cdw10, cdw11) = (u32_at(sqe, 40), u32_at(sqe, 44));
        let mut out = Vec::new();
        if opc == 0x7f {
            match sqe[4] {
                1 => {
                    qid = u16::from_le_bytes([sqe[42], sqe[43]]);
                    if qid == 0 {
                        seen.admin_connects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    } else {
                        seen.io_connects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    out = if qid != 0 && matches!(reads, Reads::RefusedIoQueue) {
                        response_status(qid, cid, 0, 0, CONNECT_INVALID_PARAMETERS)
                    } else {
                        response(qid, cid, 1, 0)
                    };
                    if qid != 0 && matches!(reads, Reads::RepeatedConnectResponse) {
                        out.extend(response(qid, cid, 1, 0));
                    }
                }
                4 => {
                    let v: u64 = match u32_at(sqe, 44) {
                        0 => 127 | 1 << 16 | 1 << 24 | 1 << 37, // CAP
                        8 => 0x10400,                           // VS
                        0x14 => cc,
                        0x1c => cc & 1, // CSTS.RDY follows CC.EN
                        _ => 0,
                    };
                    out = response(qid, cid, v as u32, (v >> 32) as u32);
                }
                0 => {
                    if u32_at(sqe, 44) == 0x14 {
                        cc = u64::from_le_bytes(sqe[48..56].try_into().unwrap());
                    }
                    out = response(qid, cid, 0, 0);
                }
                _ => out = response(qid, cid, 0, 0),
            }
        } else if qid == 0 {
            match opc {
                0x06 if matches!(reads, Reads::NoIdentify) => {}
                0x06 if matches!(reads, Reads::LongIdentify) => {
                    let mut d = identify(cdw10 & 0xff);
                    d.resize(8192, 0);
                    out = c2h_data(cid, 0, &d, LAST);
                    out.extend(response(qid, cid, 0, 0));
                }
                0x06 => {
                    let d = identify(cdw10 & 0xff);
                    out = c2h_data_digest(cid, 0, &d[..sgl_len.min(4096)], LAST, ddgst);
                    out.extend(response(qid, cid, 0, 0));
                }
                0x0c => {}                                 // asynchronous event request: held
                0x18 if matches!(reads, Reads::Mute) => {} // Keep Alive: unanswered
                0x08 => {
                    let (sqid, acid) = (cdw10 as u16, (cdw10 >> 16) as u16);
                    seen.aborts.lock().unwrap().push((sqid, acid));
                    if std::mem::take(&mut abort_over_limit) {
                        seen.over_limit.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        s.write_all(&response_status(qid, cid, 0, 0, ABORT_LIMIT_EXCEEDED))?;
                        continue;
                    }
                    let aborted = match reads {
                        Reads::Unanswered { honour_abort: true } => {
                            let mut held = seen.held.lock().unwrap();
                            let hit = held.as_ref().is_some_and(|(q, c, _)| (*q, *c) == (sqid, acid));
                            if let (true, Some((q, c, conn))) = (hit, held.as_mut()) {
                                conn.write_all(&response_status(*q, *c, 0, 0, ABORTED_BY_REQUEST))?;
                            }
                            hit
                        }
                        Reads::ManyUnanswered => {
                            std::thread::sleep(ABORT_TAKES);
                            // One Abort at a time: the next must not be here yet.
                            s.set_nonblocking(true)?;
                            let mut next = [0u8; 9];
                            abort_over_limit = matches!(s.peek(&mut next), Ok(9)) && next[0] == 4 && next[8] == 0x08;
                            s.set_nonblocking(false)?;
                            let mut held = seen.many_held.lock().unwrap();
                            match held.iter_mut().find(|(q, c, _, _)| (*q, *c) == (sqid, acid)) {
                                Some((q, c, _, conn)) => {
                                    conn.write_all(&response_status(*q, *c, 0, 0, ABORTED_BY_REQUEST))?;
                                    // Answered: its ID may be used again.
                                    *c = u16::MAX;
                                    true
                                }
                                None => false,
                            }
                        }
                        _ => false,
                    };
                    // DW0 bit 0: the command was not aborted.
                    out = response(qid, cid, u32::from(!aborted), 0);
                }
                0x09 => out = response(qid, cid, cdw11, 0),
                0x02 => {
                    let numd = ((cdw10 >> 16) & 0xfff | (cdw11 & 0xffff) << 16) as usize + 1;
                    out = c2h_data_digest(cid, 0, &vec![0; (numd * 4).min(sgl_len)], LAST, ddgst);
                    out.extend(response(qid, cid, 0, 0));
                }
                _ => out = response(qid, cid, 0, 0),
            }
        } else if opc == 0x02 {
            let n = sgl_len;
            let slba = u64::from(cdw10) | u64::from(cdw11) << 32;
            if matches!(reads, Reads::ManyUnanswered) && (HELD_LBA..HELD_LBA + MANY).contains(&slba) {
                let mut held = seen.many_held.lock().unwrap();
                if !held.iter().any(|h| h.2 == slba) {
                    held.push((qid, cid, slba, s.try_clone()?));
                    continue;
                }
            }
            if matches!(reads, Reads::NoneAnswered) {
                continue;
            }
            if matches!(reads, Reads::Unanswered { .. } | Reads::Mute) && slba == HELD_LBA {
                let mut held = seen.held.lock().unwrap();
                if held.is_none() {
                    *held = Some((qid, cid, s.try_clone()?));
                    continue;
                }
            }
            match reads {
                Reads::LongRead => {
                    out = c2h_data(cid, 0, &vec![HONEST; n + 4096], LAST);
                    out.extend(response(qid, cid, 0, 0));
                }
                Reads::Unanswered { .. }
                | Reads::ManyUnanswered
                | Reads::Mute
                | Reads::NoIdentify
                | Reads::LongIdentify
                | Reads::BadIcResp
                | Reads::NoneAnswered => {
                    out = c2h_data(cid, 0, &vec![HONEST; n], LAST);
                    out.extend(response(qid, cid, 0, 0));
                }
                Reads::RepeatedResponse => {
                    if let Some((q, c)) = last_read {
                        if !seen.repeated.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            s.write_all(&response(q, c, 0, 0))?;
                        }
                    }
                    last_read = Some((qid, cid));
                    out = c2h_data(cid, 0, &vec![HONEST; n], LAST);
                    out.extend(response(qid, cid, 0, 0));
                }
                Reads::Honest | Reads::RefusedIoQueue | Reads::RepeatedConnectResponse => {
                    out = c2h_data(cid, 0, &vec![HONEST; n], LAST);
                    out.extend(response(qid, cid, 0, 0));
                }
                Reads::Repeated { success } => {
                    let k = n.div_ceil(4096);
                    for i in 0..k {
                        let last = i + 1 == k;
                        let flags = if last { LAST | if success { SUCCESS } else { 0 } } else { 0 };
                        out.extend(c2h_data(cid, 0, &[HONEST; 4096][..n.min(4096)], flags));
                    }
                    if !success {
                        out.extend(response(qid, cid, 0, 0));
                    }
                }
                Reads::BadDigestLateResponse => {
                    s.write_all(&c2h_data_digest(cid, 0, &vec![HONEST; n], LAST, ddgst.map(|_| false)))?;
                    std::thread::sleep(LATE);
                    // A command that came meanwhile must not reuse this one's ID: its response
                    // is still owed.
                    s.set_nonblocking(true)?;
                    let mut next = [0u8; 12];
                    if let Ok(12) = s.peek(&mut next) {
                        if next[0] == 4 && u16::from_le_bytes([next[10], next[11]]) == cid {
                            CID_REUSED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    s.set_nonblocking(false)?;
                    out = response(qid, cid, 0, 0);
                }
            }
        } else {
            out = response(qid, cid, 0, 0);
        }
        s.write_all(&out)?;
    }
}

/// The mock controller on a free port of 127.0.0.1, one thread per connection, for as long as
/// the test runs.
fn liar(reads: Reads) -> u16 {
    liar_seen(reads).0
}

/// As [`liar`], with what the controller sees.
fn liar_seen(reads: Reads) -> (u16, std::sync::Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(Seen::default());
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let seen = seen2.clone();
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let _ = serve(s, reads, &seen);
            });
        }
    });
    (port, seen)
}

/// A host daemon whose buffers held SECRET (written to and read back from a malloc volume over
/// NBD), attached to the mock controller, its namespace exported over NBD as `liar`.
fn host(dir: &TempDir, port: u16) -> (Daemon, String) {
    host_with(dir, port, json!({}))
}

/// As [`host`], with more `bdev_nvme_attach_controller` parameters.
fn host_with(dir: &TempDir, port: u16, more: serde_json::Value) -> (Daemon, String) {
    host_opts(dir, port, None, more)
}

/// As [`host_with`], after `bdev_nvme_set_options` with `options`, if given.
fn host_opts(
    dir: &TempDir,
    port: u16,
    options: Option<serde_json::Value>,
    more: serde_json::Value,
) -> (Daemon, String) {
    let d = Daemon::start(dir, &[]);
    if let Some(o) = options {
        d.call("bdev_nvme_set_options", Some(o));
    }
    d.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 1024, "block_size": 4096})));
    let nbd = d.call("nbd_server_start", Some(json!({"address": "127.0.0.1:0"})));
    let addr = nbd["address"].as_str().unwrap().to_string();
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "M0", "name": "m0"})));
    for _ in 0..4 {
        let (ok, out) = try_qemu_io(dir, &format!("nbd://{addr}/m0"), &format!("write -P {SECRET} 0 1M"));
        assert!(ok, "{out}");
        let (ok, out) = try_qemu_io(dir, &format!("nbd://{addr}/m0"), &format!("read -P {SECRET} 0 1M"));
        assert!(ok, "{out}");
    }
    let mut params = json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN, "ctrlr_loss_timeout_sec": 2, "reconnect_delay_sec": 1});
    for (k, v) in more.as_object().expect("parameters").iter() {
        params[k] = v.clone();
    }
    let names = d.call("bdev_nvme_attach_controller", Some(params));
    assert_eq!(names, json!(["Liarn1"]), "bdev names");
    d.call("nbd_server_add_export", Some(json!({"bdev_name": "Liarn1", "name": "liar"})));
    (d, format!("nbd://{addr}/liar"))
}

#[test]
fn an_honest_mock_controller_reads_back() {
    // The mock itself works: the host reads its data as it sends it.
    if !have("an_honest_mock_controller_reads_back", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-honest");
    let (d, uri) = host(&dir, liar(Reads::Honest));
    for len in ["4k", "128k"] {
        let (ok, out) = try_qemu_io(&dir, &uri, &format!("read -P {HONEST} 0 {len}"));
        assert!(ok, "honest read of {len}: {out}");
    }
    d.assert_serving();
}

#[test]
fn a_read_whose_data_repeats_fails_and_shows_nothing_old() {
    // The same 4 KiB at offset 0 again and again adds up to the read's length, but the rest of
    // the buffer was never written: the host must refuse the data, not complete the read.
    if !have("a_read_whose_data_repeats_fails_and_shows_nothing_old", &["qemu-io"]) {
        return;
    }
    for success in [true, false] {
        let dir = TempDir::new("host-liar-repeat");
        let (d, uri) = host(&dir, liar(Reads::Repeated { success }));
        // 4 KiB reads are honest here (one PDU, at offset 0).
        let (ok, out) = try_qemu_io(&dir, &uri, &format!("read -P {HONEST} 0 4k"));
        assert!(ok, "a 4 KiB read: {out}");
        let (ok, out) = try_qemu_io(&dir, &uri, "read 0 128k");
        assert!(!ok, "a 128 KiB read of repeated data succeeded (SUCCESS flag {success}): {out}");
        assert!(out.contains("Input/output error"), "the read fails with an I/O error (SUCCESS flag {success}): {out}");
        d.assert_serving();
    }
}

#[test]
fn a_read_whose_data_fails_its_digest_ends_with_its_response() {
    // The read fails (Transient Transport Error), but only once the controller's response for
    // it came: until then its command ID is not free. Completing it at the digest error let the
    // next command take the ID and be completed by the late response (an attacker pass found
    // writes acknowledged that the controller never did, behind flipped bits).
    if !have("a_read_whose_data_fails_its_digest_ends_with_its_response", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-ddgst");
    let (d, uri) = host_with(&dir, liar(Reads::BadDigestLateResponse), json!({"ddgst": true}));
    // Reads one after the other: each next one would come while the last one's response is
    // still owed if the host completed the last one at its digest error.
    for round in 0..3 {
        let started = std::time::Instant::now();
        let (ok, out) = try_qemu_io(&dir, &uri, &format!("read {}k 4k", 4 * round));
        let took = started.elapsed();
        assert!(!ok, "round {round}: a read whose data failed its digest succeeded: {out}");
        assert!(out.contains("Input/output error"), "round {round}: the read fails with an I/O error: {out}");
        assert!(took >= LATE, "round {round}: the read failed after {took:?}, before its response ({LATE:?})");
    }
    assert_eq!(
        CID_REUSED.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a command reused the ID of a read whose response was still owed"
    );
    let log = d.proc.stderr();
    assert!(!log.contains("data bytes"), "a late response completed another command:\n{log}");
    d.assert_serving();
}

/// Reads block `HELD_LBA` through `uri` with qemu-io: (succeeded, its output, how long it took).
fn read_held(dir: &TempDir, uri: &str) -> (bool, String, std::time::Duration) {
    let started = std::time::Instant::now();
    let (ok, out) = try_qemu_io(dir, uri, &format!("read -P {HONEST} {}k 4k", HELD_LBA * 4));
    (ok, out, started.elapsed())
}

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

#[test]
fn a_read_past_its_timeout_resets_the_controller_and_is_sent_again() {
    // action_on_timeout "reset": the controller is reset, the read goes back to its channel
    // and is sent on the new queue pair, where it is answered. The held Asynchronous Event
    // Request is never timed.
    if !have("a_read_past_its_timeout_resets_the_controller_and_is_sent_again", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-timeout-reset");
    let (port, seen) = liar_seen(Reads::Unanswered { honour_abort: false });
    let options = json!({"timeout_us": TIMEOUT.as_micros() as u64, "action_on_timeout": "reset"});
    let (d, uri) = host_opts(&dir, port, Some(options), json!({}));
    assert_eq!(seen.admin_connects(), 1);
    let (ok, out, took) = read_held(&dir, &uri);
    assert!(ok, "the read sent again after the reset: {out}");
    assert!(seen.held().is_some(), "the mock held no read");
    assert!(took >= TIMEOUT, "the read came back after {took:?}, before its timeout");
    assert!(took < TIMEOUT * 6, "the read came back after {took:?}");
    assert_eq!(seen.aborts(), vec![], "action reset sends no Abort");
    assert_eq!(seen.admin_connects(), 2, "one reset");
    let log = d.proc.stderr();
    assert!(log.contains("timed out"), "{log}");
    // bdev_nvme_set_options as SPDK checks it: not with controllers attached, and never an
    // admin timeout without an I/O one.
    let e = d.call_err("bdev_nvme_set_options", Some(json!({"timeout_us": 0})));
    assert_eq!(e.code, -libc::EPERM, "{e:?}");
    let e = d.call_err("bdev_nvme_set_options", Some(json!({"timeout_us": 0, "timeout_admin_us": 5})));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    // A retry count below -1 (SPDK's EINVAL; it was kept and saved, a config SPDK refuses).
    let e = d.call_err("bdev_nvme_set_options", Some(json!({"bdev_retry_count": -2})));
    assert_eq!(e.code, -libc::EINVAL, "{e:?}");
    // num_io_queues 0 or above 65536, as SPDK bounds it.
    for n in [0u64, 65537] {
        let e = d.call_err(
            "bdev_nvme_attach_controller",
            Some(json!({"name": "Q", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                "trsvcid": port.to_string(), "subnqn": NQN, "num_io_queues": n})),
        );
        assert_eq!((e.code, e.message.contains("num_io_queues")), (-libc::EINVAL, true), "{n}: {e:?}");
    }
    // An attach's loss timeout is SPDK's int32: a larger one is refused, not wrapped (2^55 s
    // wrapped to a loss timeout that had passed at the loss).
    let e = d.call_err(
        "bdev_nvme_attach_controller",
        Some(json!({"name": "Other", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN, "ctrlr_loss_timeout_sec": 1u64 << 55,
            "reconnect_delay_sec": 1})),
    );
    assert_eq!(e.code, -32602, "{e:?}");
    d.assert_serving();
}

#[test]
fn a_read_past_its_timeout_is_aborted() {
    // action_on_timeout "abort", and the controller aborts the command: the read fails (an
    // aborted command is not sent again, as with SPDK), no reset.
    if !have("a_read_past_its_timeout_is_aborted", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-timeout-abort");
    let (port, seen) = liar_seen(Reads::Unanswered { honour_abort: true });
    let options = json!({"timeout_us": TIMEOUT.as_micros() as u64, "action_on_timeout": "abort"});
    let (d, uri) = host_opts(&dir, port, Some(options), json!({}));
    let (ok, out, took) = read_held(&dir, &uri);
    assert!(!ok, "an aborted read succeeded: {out}");
    assert!(out.contains("Input/output error"), "{out}");
    assert!(took >= TIMEOUT && took < TIMEOUT * 6, "the read failed after {took:?}");
    let held = seen.held().expect("the mock held a read");
    assert_eq!(seen.aborts(), vec![held], "one Abort, of the held read");
    assert_eq!(seen.admin_connects(), 1, "no reset");
    // The next read of that block is answered.
    let (ok, out, _) = read_held(&dir, &uri);
    assert!(ok, "{out}");
    d.assert_serving();
}

#[test]
fn reads_past_their_timeout_are_aborted_within_the_controllers_abort_limit() {
    // action_on_timeout "abort" with more reads timing out together than the controller takes
    // Aborts at once (its ACL): the host sends the Aborts one after the other, every read is
    // aborted, and nothing is reset. Before the gate, the second Abort got "Abort Command
    // Limit Exceeded" and the host reset the controller.
    if !have("reads_past_their_timeout_are_aborted_within_the_controllers_abort_limit", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-abort-limit");
    let (port, seen) = liar_seen(Reads::ManyUnanswered);
    let options = json!({"timeout_us": TIMEOUT.as_micros() as u64, "action_on_timeout": "abort"});
    let (d, uri) = host_opts(&dir, port, Some(options), json!({}));
    let started = std::time::Instant::now();
    let outcomes: Vec<(bool, String)> = std::thread::scope(|sc| {
        let reads: Vec<_> = (0..MANY)
            .map(|i| {
                let (dir, uri) = (&dir, &uri);
                sc.spawn(move || try_qemu_io(dir, uri, &format!("read -P {HONEST} {}k 4k", (HELD_LBA + i) * 4)))
            })
            .collect();
        reads.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let took = started.elapsed();
    for (ok, out) in &outcomes {
        assert!(!ok, "an aborted read succeeded: {out}");
        assert!(out.contains("Input/output error"), "{out}");
    }
    assert!(took < TIMEOUT * 8, "the reads took {took:?}");
    assert_eq!(seen.over_limit(), 0, "Aborts beyond the controller's limit: {:?}", seen.aborts());
    let mut held: Vec<_> = seen.many_held.lock().unwrap().iter().map(|h| h.2).collect();
    held.sort();
    assert_eq!(held, (HELD_LBA..HELD_LBA + MANY).collect::<Vec<_>>(), "the mock held every read");
    assert_eq!(seen.aborts().len(), MANY as usize, "one Abort per read: {:?}", seen.aborts());
    assert_eq!(seen.admin_connects(), 1, "no reset");
    // Every block reads back now.
    for i in 0..MANY {
        let (ok, out) = try_qemu_io(&dir, &uri, &format!("read -P {HONEST} {}k 4k", (HELD_LBA + i) * 4));
        assert!(ok, "{out}");
    }
    d.assert_serving();
}

#[test]
fn a_read_whose_abort_is_refused_resets_the_controller() {
    // action_on_timeout "abort", and the controller answers that it could not abort the
    // command: as SPDK, the host resets the controller, and the read is sent again.
    if !have("a_read_whose_abort_is_refused_resets_the_controller", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-timeout-refused");
    let (port, seen) = liar_seen(Reads::Unanswered { honour_abort: false });
    let options = json!({"timeout_us": TIMEOUT.as_micros() as u64, "action_on_timeout": "abort"});
    let (d, uri) = host_opts(&dir, port, Some(options), json!({}));
    let (ok, out, took) = read_held(&dir, &uri);
    assert!(ok, "the read sent again after the reset: {out}");
    assert!(took >= TIMEOUT && took < TIMEOUT * 6, "the read came back after {took:?}");
    let held = seen.held().expect("the mock held a read");
    assert_eq!(seen.aborts(), vec![held], "one Abort, of the held read");
    assert_eq!(seen.admin_connects(), 2, "one reset");
    d.assert_serving();
}

#[test]
fn a_controller_that_answers_nothing_is_lost_at_its_keep_alive_timeout() {
    // No command timeouts set: a controller that stops answering Keep Alive is lost once the
    // keep-alive timeout passes (bdev_nvme_set_options keep_alive_timeout_ms, 2 s here); its
    // I/O queue pairs go with the admin queue, and the read they held is sent again once the
    // host has reconnected.
    if !have("a_controller_that_answers_nothing_is_lost_at_its_keep_alive_timeout", &["qemu-io"]) {
        return;
    }
    // With ctrlr_loss_timeout_sec 0 (SPDK's default: no reconnection after the first try) the
    // read waits for that one try too, as with SPDK, instead of failing at the loss.
    for loss in [2, 0] {
        let dir = TempDir::new("host-liar-mute");
        let (port, seen) = liar_seen(Reads::Mute);
        let more = json!({"ctrlr_loss_timeout_sec": loss, "reconnect_delay_sec": loss.min(1)});
        let (d, uri) = host_opts(&dir, port, Some(json!({"keep_alive_timeout_ms": 2000})), more);
        let (ok, out, took) = read_held(&dir, &uri);
        assert!(ok, "loss timeout {loss}: the read sent again after the reconnection: {out}");
        assert!(seen.held().is_some(), "the mock held no read");
        assert!(took >= std::time::Duration::from_secs(2), "loss timeout {loss}: the read came back after {took:?}");
        assert!(took < std::time::Duration::from_secs(12), "loss timeout {loss}: the read came back after {took:?}");
        assert!(seen.admin_connects() >= 2, "loss timeout {loss}: the admin queue was not reconnected");
        let log = d.proc.stderr();
        assert!(log.contains("keep-alive unanswered"), "{log}");
        d.assert_serving();
    }
}

#[test]
fn an_attach_to_a_controller_that_never_identifies_fails_in_30_s() {
    // A controller that accepts the Connect and then answers nothing: the attach fails once
    // the initialization's 30 s (SPDK's default admin timeout) pass, and the daemon serves on.
    let dir = TempDir::new("host-liar-noidentify");
    let (port, seen) = liar_seen(Reads::NoIdentify);
    let d = Daemon::start(&dir, &[]);
    let started = std::time::Instant::now();
    let mut client =
        ferrite_rpc::client::RpcClient::connect(&d.sock, std::time::Duration::from_secs(60)).expect("connect");
    let e = common::call_err(
        &mut client,
        "bdev_nvme_attach_controller",
        Some(json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN})),
    );
    let took = started.elapsed();
    assert!(e.message.contains("initialization"), "{e:?}");
    assert!(took >= std::time::Duration::from_secs(30) && took < std::time::Duration::from_secs(40), "{took:?}");
    assert_eq!(seen.admin_connects(), 1);
    assert!(d.call("bdev_nvme_get_controllers", None).as_array().unwrap().is_empty());
    d.assert_serving();
}

#[test]
fn a_detach_does_not_wait_for_ever_on_a_command_never_answered() {
    // No command timeouts, and a controller that answers everything but one read (Keep Alive
    // too, so it is never lost): the detach lets the read have 5 s, then closes the
    // connections, which fails it; the bdev's user (NBD here) lets go and the detach ends.
    if !have("a_detach_does_not_wait_for_ever_on_a_command_never_answered", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-detach");
    let (port, seen) = liar_seen(Reads::Unanswered { honour_abort: false });
    let (d, uri) = host_opts(&dir, port, None, json!({}));
    std::thread::scope(|s| {
        let reader = s.spawn(|| read_held(&dir, &uri));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while seen.held().is_none() {
            assert!(std::time::Instant::now() < deadline, "the read never reached the controller");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let started = std::time::Instant::now();
        d.call("bdev_nvme_detach_controller", Some(json!({"name": "Liar"})));
        let took = started.elapsed();
        assert!(took >= std::time::Duration::from_secs(5), "the detach ended after {took:?}, before its grace");
        assert!(took < std::time::Duration::from_secs(9), "the detach took {took:?}");
        let (ok, out, _) = reader.join().unwrap();
        assert!(!ok, "a read the controller never answered succeeded: {out}");
    });
    assert!(d.call("bdev_nvme_get_controllers", None).as_array().unwrap().is_empty());
    let log = d.proc.stderr();
    assert!(log.contains("closing the connections"), "{log}");
    d.assert_serving();
}

/// Runs `ferrite perf` (randread, QD 8, 4 KiB, one core) for `secs` on the mock controller's
/// namespace, attached with `more` parameters: its output, how long it took and its results
/// (JSON; null if it wrote none).
fn perf(
    dir: &TempDir,
    port: u16,
    more: serde_json::Value,
    secs: u32,
) -> (nbd_common::ToolOut, std::time::Duration, serde_json::Value) {
    let mut params = json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN});
    for (k, v) in more.as_object().expect("parameters").iter() {
        params[k] = v.clone();
    }
    let cfg = dir.write_json(
        "host.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
            "params": params}]}]}),
    );
    let res = dir.join("perf.json");
    let (cfg, res_s, t) = (cfg.to_str().unwrap(), res.to_str().unwrap(), secs.to_string());
    let args = ["perf", "--json", cfg, "-T", "Liarn1", "-q", "8", "-o", "4096", "-w", "randread", "-t", &t];
    let args: Vec<&str> = args.iter().chain(&["-m", "0x1", "--no-pin", "--results-json", res_s]).copied().collect();
    let started = std::time::Instant::now();
    let out = nbd_common::run_tool(dir, common::FERRITE, &args, std::time::Duration::from_secs(90));
    let took = started.elapsed();
    let doc = std::fs::read_to_string(&res).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    (out, took, doc)
}

#[test]
fn io_sent_again_after_its_queue_was_refused_fails_and_does_not_hang() {
    // `ferrite perf` sends each failed read again from its completion. The I/O queue's
    // Connect is refused and the single path gives up (ctrlr_loss_timeout_sec 0): the reads
    // sent again must fail too, not wait for a connection attempt that has ended, and the
    // host must not try the queue again for each of them.
    let (port, seen) = liar_seen(Reads::RefusedIoQueue);
    let dir = TempDir::new("host-liar-refused-io-queue");
    let (out, took, doc) = perf(&dir, port, json!({}), 3);
    assert!(
        !out.stderr.contains("did not stop") && !out.stdout.contains("did not stop"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(took < std::time::Duration::from_secs(10), "perf took {took:?}:\n{}{}", out.stdout, out.stderr);
    let failed = doc["total"]["io_failed"].as_f64().unwrap_or(0.0);
    assert!(failed > 8.0, "reads sent again did not fail: {doc}");
    // One attempt per reconnect delay (1 s at least), not one per read sent again.
    let tries = seen.io_connects.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..=6).contains(&tries), "{tries} I/O queue Connects in {took:?} for {failed} failed reads");
    println!("{failed} failed reads, {tries} I/O queue Connects, in {took:?}");
}

#[test]
fn a_repeated_completion_completes_no_other_command() {
    // The controller sends one read's response twice, the second time when the next read is
    // outstanding, which (one at a time) took the same slot. Its CID must not name the new
    // read: the host drops the connection as the controller's error, reconnects and sends the
    // read again, and every read returns the controller's data.
    if !have("a_repeated_completion_completes_no_other_command", &["qemu-io"]) {
        return;
    }
    let dir = TempDir::new("host-liar-repeated-response");
    let (port, seen) = liar_seen(Reads::RepeatedResponse);
    let (d, uri) = host(&dir, port);
    let io_connects = || seen.io_connects.load(std::sync::atomic::Ordering::SeqCst);
    let connects = io_connects();
    for off in ["0", "4k", "8k", "12k"] {
        let (ok, out) = try_qemu_io(&dir, &uri, &format!("read -P {HONEST} {off} 4k"));
        assert!(ok, "read at {off}: {out}");
    }
    assert!(seen.repeated.load(std::sync::atomic::Ordering::SeqCst), "the mock repeated no response");
    assert!(io_connects() > connects, "the host did not drop the I/O queue for the repeated response");
    d.assert_serving();
}

#[test]
fn io_queues_that_fail_at_once_are_reconnected_once_per_delay() {
    // Each I/O queue pair fails right after its Connect (the controller repeats the Connect's
    // response). The host must not reconnect in a tight loop: each failure resets the
    // controller, the first at once, then one per reconnect delay (1 s here).
    let (port, seen) = liar_seen(Reads::RepeatedConnectResponse);
    let dir = TempDir::new("host-liar-repeated-connect-response");
    let d = Daemon::start(&dir, &[]);
    let params = json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
        "trsvcid": port.to_string(), "subnqn": NQN, "ctrlr_loss_timeout_sec": 10, "reconnect_delay_sec": 1});
    assert_eq!(d.call("bdev_nvme_attach_controller", Some(params)), json!(["Liarn1"]));
    // The examine of the new bdev reads it: that I/O needs an I/O queue.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let tries = seen.io_connects.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..=6).contains(&tries), "{tries} I/O queue Connects in 3 s");
    d.call("bdev_nvme_detach_controller", Some(json!({"name": "Liar"})));
    d.assert_serving();
}

/// The daemon log's WARN lines.
fn warnings(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" WARN ")).collect()
}

#[test]
fn read_data_longer_than_asked_is_warned_as_the_controllers_error() {
    // A C2HData with more data than the read asked for: the host drops the connection, at WARN,
    // in words that say what the controller did (it was an INFO "not the next data of a read").
    let dir = TempDir::new("host-liar-long-read");
    let (out, _, doc) = perf(&dir, liar(Reads::LongRead), json!({}), 1);
    let log = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(doc["total"]["iops"].as_f64().unwrap_or(0.0), 0.0, "reads answered with too much data succeeded: {log}");
    assert!(
        warnings(&log).iter().any(|l| l.contains("protocol error by the controller")
            && l.contains("8192 bytes at offset 0, past the 4096 bytes the command asked for")),
        "{log}"
    );
    assert!(!log.contains("not the next data of a read"), "{log}");
}

#[test]
fn an_identify_answer_longer_than_asked_is_warned_as_the_controllers_error() {
    // Identify answered with 8 KiB for 4 KiB: the attach fails saying so (it said "status sct
    // 0x3 sc 0x70", the host path error the dropped connection made up), and the log says it
    // at WARN.
    let dir = TempDir::new("host-liar-long-identify");
    let port = liar(Reads::LongIdentify);
    let d = Daemon::start(&dir, &[]);
    let e = d.call_err(
        "bdev_nvme_attach_controller",
        Some(json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN})),
    );
    assert!(e.message.contains("past the 4096 bytes the command asked for"), "{e:?}");
    assert!(!e.message.contains("sct 0x3"), "{e:?}");
    let log = d.proc.stderr();
    assert!(
        warnings(&log).iter().any(|l| l.contains("protocol error by the controller")
            && l.contains("8192 bytes at offset 0, past the 4096 bytes the command asked for")),
        "{log}"
    );
    assert!(d.call("bdev_nvme_get_controllers", None).as_array().unwrap().is_empty());
    d.assert_serving();
}

#[test]
fn an_invalid_icresp_is_warned_as_the_controllers_error() {
    // An ICResp with MAXH2CDATA 17: the attach fails saying so (it said "connection closed"),
    // and the log says it at WARN.
    let dir = TempDir::new("host-liar-bad-icresp");
    let port = liar(Reads::BadIcResp);
    let d = Daemon::start(&dir, &[]);
    let e = d.call_err(
        "bdev_nvme_attach_controller",
        Some(json!({"name": "Liar", "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": port.to_string(), "subnqn": NQN})),
    );
    assert!(e.message.contains("invalid ICResp: MAXH2CDATA 17"), "{e:?}");
    let log = d.proc.stderr();
    assert!(
        warnings(&log)
            .iter()
            .any(|l| l.contains("protocol error by the controller") && l.contains("invalid ICResp: MAXH2CDATA 17")),
        "{log}"
    );
    d.assert_serving();
}

#[test]
fn failing_io_queues_reset_the_controller_and_io_fails_at_fast_io_fail() {
    // Every I/O queue pair fails as soon as it is connected, the admin queue stays healthy. As
    // SPDK's bdev_nvme, the host resets the controller (admin queue and I/O queues again) once
    // a reconnect delay while that does not bring the I/O queues back, and I/O fails at
    // fast_io_fail_timeout_sec (2 s) after the first failure, not after the channel's 32
    // retries, one per delay (~33 s, which made `ferrite perf` overrun its -t by ~12 s).
    let (port, seen) = liar_seen(Reads::RepeatedConnectResponse);
    let dir = TempDir::new("host-liar-io-queues-fail");
    let more = json!({"ctrlr_loss_timeout_sec": 30, "reconnect_delay_sec": 1, "fast_io_fail_timeout_sec": 2});
    let (out, took, doc) = perf(&dir, port, more, 4);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(took < std::time::Duration::from_secs(4 + 3), "perf -t 4 took {took:?}:\n{all}");
    assert!(!all.contains("did not stop"), "{all}");
    let failed = doc["total"]["io_failed"].as_f64().unwrap_or(0.0);
    assert!(failed >= 8.0, "the reads did not fail: {doc}\n{all}");
    assert!(all.contains("resetting the controller for its failed I/O queue"), "{all}");
    // The first reset at once, then one per reconnect delay: a few in 4 s, not a tight loop.
    let (admin, io) = (seen.admin_connects(), seen.io_connects.load(std::sync::atomic::Ordering::SeqCst));
    assert!((3..=8).contains(&admin), "{admin} admin queue Connects in {took:?}:\n{all}");
    assert!(io <= admin + 1, "{io} I/O queue Connects for {admin} admin queue Connects:\n{all}");
    println!("{failed} failed reads, {admin} admin and {io} I/O queue Connects, in {took:?}");
}

#[test]
fn perf_ends_on_time_while_the_controller_is_reset_for_ever() {
    // I/O queues that fail at once, and a host told to reconnect for ever with no fast-fail
    // time (ctrlr_loss_timeout_sec -1, fast_io_fail_timeout_sec 0): I/O waits for a controller
    // that never comes back, as SPDK's would. `ferrite perf -t 3` still ends on time: 2 s
    // after the run's end each job aborts what it still has outstanding (the host completes
    // the waiting reads as aborted), and reports. It waited 2 s + 10 s before giving up with
    // "did not stop", and no results.
    let (port, _seen) = liar_seen(Reads::RepeatedConnectResponse);
    let dir = TempDir::new("host-liar-perf-on-time");
    let more = json!({"ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1});
    let (out, took, doc) = perf(&dir, port, more, 3);
    let all = format!("{}{}", out.stdout, out.stderr);
    // (+2 s: perf waits for examine first, as bdevperf does, and examine's read of the
    // namespace waits for the controller like the run's reads.)
    assert!(took < std::time::Duration::from_secs(3 + 4 + 2), "perf -t 3 took {took:?}:\n{all}");
    assert!(!all.contains("did not stop"), "{all}");
    assert!(all.contains("aborting them"), "{all}");
    let failed = doc["total"]["io_failed"].as_f64().unwrap_or(0.0);
    assert!(failed >= 8.0, "no results, or the waiting reads were not aborted: {doc}\n{all}");
    assert!(!out.status.success(), "failed reads, and perf exited 0:\n{all}");
    println!("{failed} failed reads in {took:?}");
}

#[test]
fn perf_gives_up_on_reads_a_controller_never_answers_and_will_not_abort() {
    // Reads the controller never answers and refuses to abort, no command timeouts, and a
    // controller that answers Keep Alive (never lost): nothing completes them. `ferrite perf
    // -t 1` aborts them 2 s after its end, the controller does not, and 3 s later the run gives
    // up, naming the stuck I/O: it ends on time whatever the controller does.
    let dir = TempDir::new("host-liar-perf-held");
    let (out, took, _) = perf(&dir, liar(Reads::NoneAnswered), json!({}), 1);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("aborting them"), "{all}");
    assert!(all.contains("did not stop"), "{all}");
    assert!(!out.status.success(), "{all}");
    // (+2 s: perf waits for examine first, whose read of the namespace is not answered either.)
    assert!(took < std::time::Duration::from_secs(1 + 5 + 3 + 2), "perf -t 1 took {took:?}:\n{all}");
    println!("perf -t 1 ended after {took:?}");
}
