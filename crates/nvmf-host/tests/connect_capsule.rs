//! What the host puts on the wire for Fabrics Connect, seen by a fake controller (a plain TCP
//! listener in this test; no real target shows how a capsule was framed): the Connect of an I/O
//! queue carries its 1 KiB of data in the capsule (SGL Data Block, offset subtype), as the admin
//! queue's does, instead of asking for an R2T that strict targets refuse.

mod common;

use ferrite_nvme::spec::cqe::Cqe;
use ferrite_nvme::spec::status::Status;
use ferrite_nvme::tcp::pdu::{CapsuleResp, IcResp, Pdu};
use ferrite_nvme::tcp::{encode_contiguous, Negotiated};
use ferrite_nvmf_host::qpair::{ConnectParams, HostQpair};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// Accepts one connection, answers ICReq, reads the Connect capsule and answers it with
/// success; returns the capsule's SQE and its in-capsule data length.
fn fake_controller(l: TcpListener) -> ([u8; 64], usize) {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut icreq = [0u8; 128];
    s.read_exact(&mut icreq).unwrap();
    assert_eq!(icreq[0], 0x00, "ICReq first");
    let mut out = [0u8; 256];
    let n = encode_contiguous(
        &mut out,
        &Negotiated::INITIAL,
        &Pdu::IcResp(IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 131072 }),
        &[],
    )
    .unwrap();
    s.write_all(&out[..n]).unwrap();
    let mut ch = [0u8; 8];
    s.read_exact(&mut ch).unwrap();
    assert_eq!(ch[0], 0x04, "a CapsuleCmd");
    let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
    let pdo = ch[3] as usize;
    let mut rest = vec![0u8; plen - 8];
    s.read_exact(&mut rest).unwrap();
    let mut sqe = [0u8; 64];
    sqe.copy_from_slice(&rest[..64]);
    let data_len = if pdo == 0 { 0 } else { plen - pdo };
    let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
    let mut cqe = [0u8; 16];
    Cqe::new(cid, Status::SUCCESS).encode(&mut cqe);
    let n = encode_contiguous(&mut out, &Negotiated::INITIAL, &Pdu::CapsuleResp(CapsuleResp { cqe }), &[]).unwrap();
    s.write_all(&out[..n]).unwrap();
    // Hold the connection until the host is done with it.
    let _ = s.read(&mut [0u8; 64]);
    (sqe, data_len)
}

fn connect_capsule(qid: u16, disable_sqflow: bool) -> ([u8; 64], usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let fake = std::thread::spawn(move || fake_controller(l));
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Interrupt, ..Default::default() }).unwrap();
    let params = ConnectParams { disable_sqflow, ..common::fake_params(addr, qid) };
    let ok = e
        .run_async(0, move || async move {
            let r = HostQpair::connect(&params).await;
            if let Ok(q) = &r {
                q.close();
            }
            r.map(|_| ())
        })
        .wait()
        .unwrap();
    let seen = fake.join().unwrap();
    e.stop();
    e.join();
    ok.expect("the host's Connect succeeds against the fake controller");
    seen
}

#[test]
fn connect_data_goes_in_the_capsule_on_admin_and_io_queues() {
    for qid in [0u16, 1, 3] {
        let (sqe, data_len) = connect_capsule(qid, false);
        assert_eq!(sqe[0], 0x7f, "qid {qid}: a Fabrics command");
        assert_eq!(sqe[4], 0x01, "qid {qid}: Connect");
        // SGL1 identifier (byte 15 of the descriptor at 24): Data Block (0h), Offset (1h).
        assert_eq!(sqe[24 + 15], 0x01, "qid {qid}: SGL identifier {:#04x}", sqe[24 + 15]);
        assert_eq!(u32::from_le_bytes(sqe[32..36].try_into().unwrap()), 1024, "qid {qid}: SGL length");
        assert_eq!(data_len, 1024, "qid {qid}: the Connect data is in the capsule");
        // CATTR (byte 46): nothing asked for unless disable_sq_flow_control is set.
        assert_eq!(sqe[46], 0, "qid {qid}: CATTR {:#04x}", sqe[46]);
    }
}

#[test]
fn disable_sq_flow_control_sets_cattr_bit_2_on_every_queue() {
    for qid in [0u16, 1] {
        let (sqe, _) = connect_capsule(qid, true);
        assert_eq!(sqe[4], 0x01, "qid {qid}: Connect");
        assert_eq!(sqe[46], 1 << 2, "qid {qid}: CATTR {:#04x}", sqe[46]);
    }
}
