//! The NBD transmission path allocates nothing per I/O on the reactor in steady state.
//!
//! The server runs in this process, on a one-reactor engine, behind a global allocator that
//! counts allocations per thread; a minimal client on the test thread (written here: no real
//! client can report the server's allocations) does the fixed newstyle handshake and then
//! pipelined reads and writes, and the reactor's count is compared before and after. It runs
//! twice: with the reactor's receive ring (multishot receive) and without it (one-shot receives
//! into the connection's own buffer, the path of kernels without multishot receive).

use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_nbd::export::{self, Export};
use ferrite_nbd::proto::*;
use ferrite_nbd::transmission::REQUEST_LEN;
use ferrite_reactor::{Engine, EngineConfig, ReactorMode, RecvBufConfig};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

const BS: u64 = 4096;
const BLOCKS: u64 = 1024;

fn reactor_allocs(e: &Engine) -> u64 {
    e.run_async(0, || async { ferrite_alloc_count::allocs() }).wait().expect("reactor answers")
}

/// Fixed newstyle handshake with NBD_OPT_GO on export `name`, no structured replies.
fn handshake(s: &mut UnixStream, name: &str) {
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(greeting[..8], NBDMAGIC.to_be_bytes());
    s.write_all(&(C_FIXED_NEWSTYLE | C_NO_ZEROES).to_be_bytes()).unwrap();
    let mut opt = Vec::new();
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&OPT_GO.to_be_bytes());
    opt.extend_from_slice(&(4 + name.len() as u32 + 2).to_be_bytes());
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name.as_bytes());
    opt.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&opt).unwrap();
    loop {
        let mut hdr = [0u8; 20];
        s.read_exact(&mut hdr).unwrap();
        let kind = u32::from_be_bytes(hdr[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(hdr[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).unwrap();
        assert!(kind & REP_FLAG_ERROR == 0, "NBD_OPT_GO refused: type {kind:#x}");
        if kind == REP_ACK {
            return;
        }
    }
}

fn request(cmd: u16, cookie: u64, block: u64) -> [u8; REQUEST_LEN] {
    let mut r = [0u8; REQUEST_LEN];
    r[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    r[6..8].copy_from_slice(&cmd.to_be_bytes());
    r[8..16].copy_from_slice(&cookie.to_be_bytes());
    r[16..24].copy_from_slice(&(block * BS).to_be_bytes());
    r[24..28].copy_from_slice(&(BS as u32).to_be_bytes());
    r
}

fn payload(seed: u8, block: u64) -> Vec<u8> {
    (0..BS).map(|i| seed ^ (block as u8) ^ (i as u8).wrapping_mul(31)).collect()
}

/// Writes (`write`) or reads and checks every block once, `qd` requests in flight; returns when
/// every reply arrived (and, for reads, matched the pattern of `seed`).
fn every_block(s: &mut UnixStream, write: bool, qd: u64, seed: u8) {
    let (mut sent, mut done) = (0, 0);
    while done < BLOCKS {
        while sent < BLOCKS && sent - done < qd {
            if write {
                s.write_all(&request(CMD_WRITE, sent, sent)).unwrap();
                s.write_all(&payload(seed, sent)).unwrap();
            } else {
                s.write_all(&request(CMD_READ, sent, sent)).unwrap();
            }
            sent += 1;
        }
        let mut reply = [0u8; 16];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_be_bytes(reply[..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC, "simple reply magic");
        assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0, "error in reply");
        let block = u64::from_be_bytes(reply[8..16].try_into().unwrap());
        if !write {
            let mut data = vec![0u8; BS as usize];
            s.read_exact(&mut data).unwrap();
            assert!(data == payload(seed, block), "block {block} reads back what was written");
        }
        done += 1;
    }
}

#[test]
fn steady_state_transmission_allocates_nothing_per_io() {
    // One after the other: the bdev and export tables are process-wide.
    one_engine("A0", RecvBufConfig::default(), true);
    one_engine("A1", RecvBufConfig { count: 0, ..Default::default() }, false);
}

fn one_engine(name: &'static str, recv_bufs: RecvBufConfig, multishot: bool) {
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, recv_bufs, ..Default::default() })
        .expect("engine starts");
    let ring = e.run_async(0, || async { ferrite_reactor::recv_buf_stats().is_some() }).wait().unwrap();
    assert_eq!(ring, multishot, "receive ring present");
    let dir = std::env::temp_dir().join(format!("ferrite-nbd-noalloc-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nbd.sock");
    let addr = sock.to_str().unwrap().to_string();
    e.run_async(0, move || async move {
        let bdev = malloc::create(MallocOpts {
            name: Some(name.into()),
            num_blocks: BLOCKS,
            block_size: BS as u32,
            uuid: None,
            ..Default::default()
        })
        .expect("malloc bdev");
        export::add(Export {
            name: name.into(),
            bdev: name.into(),
            bdev_id: bdev.id(),
            read_only: false,
            description: String::new(),
        })
        .expect("export");
        ferrite_nbd::server::start(&addr, Default::default()).expect("server starts");
    })
    .wait()
    .expect("setup ran");

    let mut s = UnixStream::connect(&sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    handshake(&mut s, name);
    // Warm up: buffer pools, the connection's slot and reply tables, the socket's cached slots.
    every_block(&mut s, true, 8, 1);
    every_block(&mut s, false, 8, 1);
    let before = reactor_allocs(&e);
    for seed in 2..4 {
        every_block(&mut s, true, 8, seed);
        every_block(&mut s, false, 8, seed);
    }
    let after = reactor_allocs(&e);
    const N: u64 = 4 * BLOCKS;
    // Reading the counter spawns a task on the reactor (a few allocations); the I/O must add
    // nothing that grows with N.
    let per_io = (after - before) as f64 / N as f64;
    eprintln!("{} allocations on the reactor for {N} I/Os (multishot receive: {multishot})", after - before);
    assert!(after - before < 16, "{} allocations on the reactor for {N} I/Os ({per_io:.2} per I/O)", after - before);
    s.write_all(&request(CMD_DISC, 0, 0)).unwrap();
    drop(s);
    e.stop();
    e.join();
    let _ = std::fs::remove_dir_all(&dir);
}
