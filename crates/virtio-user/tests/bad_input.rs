//! Attaches that cannot work answer a clear JSON-RPC error, without a panic or a hang: no
//! socket, a socket that is not a vhost-user device (garbage, silence), a device with no
//! request queue, and parameters this module does not serve.

mod common;

use common::*;
use ferrite_reactor::ReactorMode;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

const INVALID_PARAMS: i32 = -32602;

fn attach(socket: &str) -> Value {
    json!({"name": "bad0", "trtype": "user", "traddr": socket, "dev_type": "blk"})
}

/// Serves one connection on `listener` with `serve`, on a thread.
fn serve_one(listener: UnixListener, serve: impl FnOnce(UnixStream) + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        serve(s)
    })
}

/// Reads one vhost-user message: request code and payload (None once the peer closed).
fn next_message(s: &mut UnixStream) -> Option<(u32, Vec<u8>)> {
    let mut hdr = [0u8; 12];
    s.read_exact(&mut hdr).ok()?;
    let code = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
    let size = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0u8; size];
    s.read_exact(&mut body).ok()?;
    Some((code, body))
}

fn reply(s: &mut UnixStream, code: u32, body: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&code.to_le_bytes());
    m.extend_from_slice(&0x5u32.to_le_bytes()); // version 1, reply
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    s.write_all(&m).unwrap();
}

/// A vhost-user-blk device whose configuration space (and GET_QUEUE_NUM) says it has no
/// request queue: answers the setup messages up to GET_CONFIG.
fn zero_queue_device(mut s: UnixStream) {
    const GET_FEATURES: u32 = 1;
    const GET_PROTOCOL_FEATURES: u32 = 15;
    const GET_QUEUE_NUM: u32 = 17;
    const GET_CONFIG: u32 = 24;
    // VERSION_1, PROTOCOL_FEATURES, MQ, BLK_SIZE.
    let features: u64 = 1 << 32 | 1 << 30 | 1 << 12 | 1 << 6;
    // MQ, CONFIG.
    let protocol: u64 = 0x1 | 0x200;
    while let Some((code, body)) = next_message(&mut s) {
        match code {
            GET_FEATURES => reply(&mut s, code, &features.to_le_bytes()),
            GET_PROTOCOL_FEATURES => reply(&mut s, code, &protocol.to_le_bytes()),
            GET_QUEUE_NUM => reply(&mut s, code, &0u64.to_le_bytes()),
            GET_CONFIG => {
                let mut space = vec![0u8; body.len() - 12];
                space[0..8].copy_from_slice(&2048u64.to_le_bytes());
                space[20..24].copy_from_slice(&512u32.to_le_bytes());
                // num_queues (offset 34) stays 0.
                let mut answer = body[..12].to_vec();
                answer.extend_from_slice(&space);
                reply(&mut s, code, &answer);
            }
            _ => {}
        }
    }
}

#[test]
fn unusable_sockets_and_parameters_answer_clear_errors() {
    let dir = TempDir::new("bad");
    let side = Side::start(1, ReactorMode::Interrupt);

    let missing = dir.0.join("nobody-listens.sock").display().to_string();
    let (code, msg) = side.rpc("bdev_virtio_attach_controller", attach(&missing)).unwrap_err();
    assert_eq!(code, INVALID_PARAMS);
    assert!(msg.contains(&missing) && msg.contains("cannot connect"), "{msg}");

    // Something that answers with garbage.
    let path = dir.0.join("garbage.sock");
    let t = serve_one(UnixListener::bind(&path).unwrap(), |mut s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let (code, msg) = side.rpc("bdev_virtio_attach_controller", attach(&path.display().to_string())).unwrap_err();
    t.join().unwrap();
    assert_eq!(code, INVALID_PARAMS);
    // The peer's close races the first messages: SET_OWNER or GET_FEATURES is the one that fails.
    assert!(
        (msg.contains("GET_FEATURES failed") || msg.contains("SET_OWNER failed")) && msg.contains("vhost-user"),
        "{msg}"
    );

    // Something that never answers: the attach gives up instead of hanging.
    let path = dir.0.join("silent.sock");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = serve_one(UnixListener::bind(&path).unwrap(), move |s| {
        let _ = rx.recv();
        drop(s);
    });
    let start = Instant::now();
    let (code, msg) = side.rpc("bdev_virtio_attach_controller", attach(&path.display().to_string())).unwrap_err();
    let took = start.elapsed();
    tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(code, INVALID_PARAMS);
    assert!(msg.contains("GET_FEATURES failed"), "{msg}");
    assert!(took < Duration::from_secs(15), "bounded by the socket timeout, took {took:?}");

    // A device with no request queue.
    let path = dir.0.join("zero.sock");
    let t = serve_one(UnixListener::bind(&path).unwrap(), zero_queue_device);
    let (code, msg) = side.rpc("bdev_virtio_attach_controller", attach(&path.display().to_string())).unwrap_err();
    t.join().unwrap();
    assert_eq!(code, INVALID_PARAMS);
    assert!(msg.contains("0 request queues"), "{msg}");

    // Parameters this module does not serve.
    let sock = dir.0.join("x.sock").display().to_string();
    let cases = [
        (
            json!({"name": "p", "trtype": "pci", "traddr": "0000:00:04.0", "dev_type": "blk"}),
            "trtype pci is not supported",
        ),
        (json!({"name": "p", "trtype": "user", "traddr": sock, "dev_type": "scsi"}), "dev_type scsi is not supported"),
        (json!({"name": "p", "trtype": "user", "traddr": sock, "dev_type": "blk", "vq_size": 1000}), "vq_size 1000"),
        (
            json!({"name": "p", "trtype": "user", "traddr": sock, "dev_type": "blk", "vq_count": 70000}),
            "vq_count 70000",
        ),
    ];
    for (params, want) in cases {
        let (code, msg) = side.rpc("bdev_virtio_attach_controller", params).unwrap_err();
        assert_eq!(code, INVALID_PARAMS, "{msg}");
        assert!(msg.contains(want), "{msg} (wanted {want:?})");
    }
    let (code, _) = side.rpc("bdev_virtio_attach_controller", json!({"name": "p", "trtype": "user"})).unwrap_err();
    assert_eq!(code, INVALID_PARAMS, "missing traddr and dev_type");
    let (code, msg) = side.rpc("bdev_virtio_detach_controller", json!({"name": "nothing"})).unwrap_err();
    assert_eq!(code, -libc::ENODEV, "{msg}");
    assert!(side.rpc("bdev_get_bdevs", json!({})).unwrap().as_array().unwrap().is_empty(), "no bdev was left");
    side.shutdown();
}
