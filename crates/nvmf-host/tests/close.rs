//! A host queue pair's two ends, against a fake controller (a plain TCP listener that answers
//! ICReq and Connect, then each command as the test says): a graceful close sends nothing new,
//! waits for the commands outstanding (an Asynchronous Event Request aside) and then closes; a
//! forced close, or a graceful one past its bound, fails each outstanding command once, with
//! the made-up completion of a connection that closed.

mod common;

use ferrite_nvme::spec::cqe::Cqe;
use ferrite_nvme::spec::opcode::admin;
use ferrite_nvme::spec::sqe::Sqe;
use ferrite_nvme::spec::status::Status;
use ferrite_nvme::tcp::pdu::{CapsuleResp, IcResp, Pdu};
use ferrite_nvme::tcp::{encode_contiguous, Negotiated};
use ferrite_nvmf_host::qpair::{HostQpair, Reply};
use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

fn send(s: &mut TcpStream, pdu: &Pdu) {
    let mut out = [0u8; 256];
    let n = encode_contiguous(&mut out, &Negotiated::INITIAL, pdu, &[]).unwrap();
    s.write_all(&out[..n]).unwrap();
}

fn answer(s: &mut TcpStream, cid: u16) {
    let mut cqe = [0u8; 16];
    Cqe::new(cid, Status::SUCCESS).encode(&mut cqe);
    send(s, &Pdu::CapsuleResp(CapsuleResp { cqe }));
}

/// Reads the next command capsule: its opcode and CID (None once the host has gone).
fn next_command(s: &mut TcpStream) -> Option<(u8, u16)> {
    let mut ch = [0u8; 8];
    s.read_exact(&mut ch).ok()?;
    let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; plen - 8];
    s.read_exact(&mut rest).ok()?;
    Some((rest[0], u16::from_le_bytes([rest[2], rest[3]])))
}

/// A controller that connects the host, then answers each command of an opcode in `delayed`
/// after that delay (one at a time, in arrival order) and never answers the others; returns
/// the opcodes it saw.
fn fake_controller(l: TcpListener, delayed: Vec<(u8, Duration)>) -> Vec<u8> {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut icreq = [0u8; 128];
    s.read_exact(&mut icreq).unwrap();
    send(&mut s, &Pdu::IcResp(IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 131072 }));
    let (_, cid) = next_command(&mut s).expect("Connect");
    answer(&mut s, cid);
    let mut seen = Vec::new();
    while let Some((op, cid)) = next_command(&mut s) {
        seen.push(op);
        if let Some((_, d)) = delayed.iter().find(|(o, _)| *o == op) {
            std::thread::sleep(*d);
            answer(&mut s, cid);
        }
    }
    seen
}

/// Connects an admin queue pair to a fake controller answering as `delayed` says, runs `test`
/// on it on a reactor, and returns what the test returned and the opcodes the controller saw.
fn with_qpair<T: Send + 'static, F, Fut>(delayed: Vec<(u8, Duration)>, test: F) -> (T, Vec<u8>)
where
    F: FnOnce(Rc<HostQpair>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let fake = std::thread::spawn(move || fake_controller(l, delayed));
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Interrupt, ..Default::default() }).unwrap();
    let params = common::fake_params(addr, 0);
    let out = e
        .run_async(0, move || async move {
            let qp = HostQpair::connect(&params).await.expect("connected to the fake controller");
            let out = test(qp.clone()).await;
            qp.close();
            out
        })
        .wait()
        .unwrap();
    let seen = fake.join().unwrap();
    e.stop();
    e.join();
    (out, seen)
}

/// Sends `n` commands of opcode `op` on `qp`, each from a task of its own; their replies come
/// back on the returned receivers.
fn send_commands(
    qp: &Rc<HostQpair>,
    op: u8,
    n: usize,
) -> Vec<ferrite_reactor::oneshot::Receiver<Result<Reply, String>>> {
    (0..n)
        .map(|_| {
            let (tx, rx) = ferrite_reactor::oneshot::channel();
            let qp = qp.clone();
            ferrite_reactor::spawn_local(async move { tx.send(qp.submit_wait(Sqe::new(op, 0, 0), None, 0).await) })
                .detach();
            rx
        })
        .collect()
}

/// What each command's reply was: answered by the controller, or failed by the close.
#[derive(Debug, PartialEq, Clone)]
enum Got {
    Answered,
    Closed,
    Refused,
}

async fn replies(rxs: Vec<ferrite_reactor::oneshot::Receiver<Result<Reply, String>>>) -> Vec<Got> {
    let mut out = Vec::new();
    for rx in rxs {
        out.push(match rx.await.expect("every command gets a reply") {
            Ok(r) if r.closed.is_none() && r.cqe.status.is_success() => Got::Answered,
            Ok(r) if r.closed.is_some() => Got::Closed,
            Ok(r) => panic!("unexpected completion {:?}", r.cqe),
            Err(_) => Got::Refused,
        });
    }
    out
}

#[test]
fn a_graceful_close_waits_for_the_outstanding_commands() {
    let ((drained, got, late, took), seen) =
        with_qpair(vec![(admin::KEEP_ALIVE, Duration::from_millis(300))], |qp| async move {
            let rxs = send_commands(&qp, admin::KEEP_ALIVE, 2);
            // An Asynchronous Event Request, which the controller answers only when something
            // happens (here never): not waited for.
            let aer = send_commands(&qp, admin::ASYNC_EVENT_REQUEST, 1);
            ferrite_reactor::sleep(Duration::from_millis(20)).await;
            assert_eq!(qp.outstanding(), 3);
            let start = Instant::now();
            let mut close = std::pin::pin!(qp.close_gracefully(Duration::from_secs(30)));
            // Sent from a task that runs once this one waits: after the close began.
            let late = send_commands(&qp, admin::KEEP_ALIVE, 1);
            let drained = close.as_mut().await;
            let took = start.elapsed();
            let mut got = replies(rxs).await;
            got.extend(replies(aer).await);
            (drained, got, replies(late).await, took)
        });
    assert!(drained, "both commands were answered before the bound");
    assert_eq!(got, vec![Got::Answered, Got::Answered, Got::Closed], "the AER fails at the close");
    assert_eq!(late, vec![Got::Refused]);
    assert!(took < Duration::from_secs(20), "the close ended when the last answer came ({took:?})");
    assert_eq!(seen.iter().filter(|&&o| o == admin::KEEP_ALIVE).count(), 2, "nothing sent after the close began");
}

#[test]
fn a_forced_close_fails_each_outstanding_command_once() {
    let (got, _) = with_qpair(vec![], |qp| async move {
        let rxs = send_commands(&qp, admin::KEEP_ALIVE, 5);
        ferrite_reactor::sleep(Duration::from_millis(20)).await;
        assert_eq!(qp.outstanding(), 5);
        qp.close();
        let got = replies(rxs).await;
        assert_eq!(qp.outstanding(), 0, "every slot is free");
        got
    });
    assert_eq!(got, vec![Got::Closed; 5]);
}

#[test]
fn a_graceful_close_past_its_bound_fails_what_is_left() {
    let ((drained, got), _) = with_qpair(vec![], |qp| async move {
        let rxs = send_commands(&qp, admin::KEEP_ALIVE, 3);
        ferrite_reactor::sleep(Duration::from_millis(20)).await;
        let drained = qp.close_gracefully(Duration::from_millis(200)).await;
        assert!(qp.is_closed());
        (drained, replies(rxs).await)
    });
    assert!(!drained, "the controller never answered");
    assert_eq!(got, vec![Got::Closed; 3]);
}
