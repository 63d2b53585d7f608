//! The NBD transmission phase under load from a hand-driven client: maximum-size requests,
//! deep pipelines of writes and reads (simple and structured), a half-closed client, hundreds of
//! connections, and clients that queue more replies than one `sendmsg` can carry or that do not
//! read their replies at all.

mod common;
mod nbd_common;

use common::TempDir;
use ferrite_nbd::proto::*;
use nbd_common::{pattern, request_bytes as req, NbdDaemon, Raw};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Sends `bytes` from another thread (so that a deep pipeline cannot deadlock against replies
/// the test has not read yet) and returns its handle.
fn send_async(r: &Raw, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
    let mut s = r.s.try_clone().unwrap();
    std::thread::spawn(move || std::io::Write::write_all(&mut s, &bytes).expect("send pipeline"))
}

#[test]
fn maximum_size_requests() {
    let dir = TempDir::new("nbdmax");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("X0", 64 * MIB / 4096, 4096);
    n.export("X0", "x0", false, "");
    let max = 32 * MIB as u32;
    let data = pattern(1, max as usize);

    let (mut r, info) = Raw::open(n.port, "x0", false);
    assert_eq!(info.max_block, max);
    let sender = send_async(&r, req(FLAG_FUA, CMD_WRITE, 1, 16 * MIB, max, &data));
    assert_eq!(r.simple_reply(), (0, 1));
    sender.join().unwrap();
    assert!(r.read_ok(2, 16 * MIB, max) == data, "32 MiB read differs from the 32 MiB write");
    r.request(0, CMD_READ, 3, 0, max + 4096, &[]);
    assert_eq!(r.simple_reply(), (EINVAL, 3), "a read above the maximum block size");
    r.disc();

    let (mut s, _) = Raw::open(n.port, "x0", true);
    s.request(0, CMD_READ, 4, 16 * MIB, max, &[]);
    let c = s.chunk();
    assert_eq!((c.flags, c.kind, c.cookie), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 4));
    assert_eq!(u64::from_be_bytes(c.payload[..8].try_into().unwrap()), 16 * MIB);
    assert!(c.payload[8..] == data[..], "32 MiB structured read differs");
    s.disc();
    n.assert_serves("x0");
}

#[test]
fn pipelined_writes_then_reads_round_trip() {
    let dir = TempDir::new("nbdpipe");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("P0", 64 * MIB / 512, 512);
    n.export("P0", "p0", false, "");

    // 200 writes of 512 B to 200 KiB (odd multiples of 512 cross staging-buffer boundaries),
    // back to back at distinct offsets, in one send; some with FUA.
    let mut extents = Vec::new();
    let mut off = 0u64;
    for i in 0..200u64 {
        let len = 512 * (1 + (i * 37 % 400));
        extents.push((off, len as u32, pattern(100 + i, len as usize)));
        off += len + 512 * (i % 3);
    }
    assert!(off < 64 * MIB);
    let (mut w, _) = Raw::open(n.port, "p0", false);
    let mut bytes = Vec::new();
    for (i, (o, l, d)) in extents.iter().enumerate() {
        bytes.extend(req(if i % 7 == 0 { FLAG_FUA } else { 0 }, CMD_WRITE, i as u64, *o, *l, d));
    }
    let sender = send_async(&w, bytes);
    let mut seen = BTreeMap::new();
    for _ in 0..extents.len() {
        let (err, cookie) = w.simple_reply();
        assert!(seen.insert(cookie, err).is_none(), "two replies for write {cookie}");
    }
    sender.join().unwrap();
    assert!(seen.iter().all(|(c, e)| *c < 200 && *e == 0), "{seen:?}");

    // Read everything back, pipelined, with simple replies on this connection...
    let mut bytes = Vec::new();
    for (i, (o, l, _)) in extents.iter().enumerate() {
        bytes.extend(req(0, CMD_READ, 1000 + i as u64, *o, *l, &[]));
    }
    let sender = send_async(&w, bytes);
    for _ in 0..extents.len() {
        let (err, cookie) = w.simple_reply();
        assert_eq!(err, 0, "read {cookie}");
        let (_, l, d) = &extents[(cookie - 1000) as usize];
        assert!(&w.read_n(*l as usize) == d, "read {cookie} returned other data");
    }
    sender.join().unwrap();
    w.disc();

    // ...and with structured replies on another (reactor).
    let (mut s, _) = Raw::open(n.port, "p0", true);
    let mut bytes = Vec::new();
    for (i, (o, l, _)) in extents.iter().enumerate() {
        bytes.extend(req(FLAG_DF, CMD_READ, 2000 + i as u64, *o, *l, &[]));
    }
    let sender = send_async(&s, bytes);
    for _ in 0..extents.len() {
        let c = s.chunk();
        assert_eq!((c.flags, c.kind), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA), "{:?}", c.cookie);
        let (o, _, d) = &extents[(c.cookie - 2000) as usize];
        assert_eq!(u64::from_be_bytes(c.payload[..8].try_into().unwrap()), *o);
        assert!(&c.payload[8..] == d, "structured read {} returned other data", c.cookie);
    }
    sender.join().unwrap();
    s.disc();
    n.assert_serves("p0");
}

#[test]
fn half_closed_client_gets_replies_to_what_it_sent() {
    let dir = TempDir::new("nbdhalfclose");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("H0", 1024, 4096);
    n.export("H0", "h0", false, "");
    let (mut r, _) = Raw::open(n.port, "h0", false);
    let data = pattern(5, 32768);
    r.write_ok(1, 0, &data, 0);
    for i in 0..8u64 {
        r.request(0, CMD_READ, 10 + i, i * 4096, 4096, &[]);
    }
    r.request(0, CMD_READ, 99, 1 << 40, 4096, &[]);
    // No NBD_CMD_DISC: the client just stops sending.
    r.s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = BTreeMap::new();
    for _ in 0..9 {
        let (err, cookie) = r.simple_reply();
        if err == 0 {
            let i = (cookie - 10) as usize;
            assert_eq!(r.read_n(4096), data[i * 4096..(i + 1) * 4096], "read {cookie}");
        }
        got.insert(cookie, err);
    }
    assert_eq!(got.len(), 9);
    assert_eq!(got[&99], EINVAL);
    assert!(r.expect_closed(Duration::from_secs(5)).is_empty());
    n.wait_connections("half-closed client gone", |c| c.is_empty());
    n.assert_serves("h0");
}

#[test]
fn two_hundred_connections_across_reactors() {
    let dir = TempDir::new("nbdmany");
    let n = NbdDaemon::start(&dir, "0x3");
    n.malloc("Y0", 1024, 4096);
    n.export("Y0", "y0", false, "");
    let mut cs: Vec<Raw> = (0..200).map(|_| Raw::open(n.port, "y0", false).0).collect();
    for (i, c) in cs.iter_mut().enumerate() {
        c.write_ok(i as u64, i as u64 * 4096, &pattern(i as u64, 4096), 0);
    }
    // Every connection sees every other connection's block.
    for (i, c) in cs.iter_mut().enumerate() {
        let j = (i * 7 + 3) % 200;
        assert_eq!(c.read_ok(1000 + i as u64, j as u64 * 4096, 4096), pattern(j as u64, 4096), "{i} reads {j}");
    }
    let conns = n.connections();
    assert_eq!(conns.len(), 200);
    let on_1 = conns.iter().filter(|c| c["reactor"] == 1).count();
    assert_eq!(on_1, 100, "connections alternate between the two reactors");
    let list = n.exports();
    assert_eq!(list[0]["connections"], 200, "{list:?}");

    let t = Instant::now();
    n.d.call("nbd_server_remove_export", Some(serde_json::json!({"name": "y0"})));
    for c in cs.iter_mut() {
        assert!(c.expect_closed(Duration::from_secs(5)).is_empty());
    }
    assert!(t.elapsed() < Duration::from_secs(5), "closing 200 connections took {:?}", t.elapsed());
    n.wait_connections("all closed", |c| c.is_empty());
    n.d.assert_serving();
}

#[test]
fn more_than_1024_queued_replies_are_all_sent() {
    let dir = TempDir::new("nbdiov");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("V0", 2048, 512);
    n.export("V0", "v0", false, "");
    // NBD_CMD_CACHE is advertised and answered at once; 1100 of them in one send queue 1100
    // replies before the writer runs. Invalid requests do the same.
    for (what, cmd, offset) in [("cache", CMD_CACHE, 0u64), ("out-of-range read", CMD_READ, 1 << 40)] {
        let (mut r, _) = Raw::open(n.port, "v0", false);
        let mut bytes = Vec::new();
        for i in 0..1100u64 {
            bytes.extend(req(0, cmd, i, offset, 512, &[]));
        }
        r.send(&bytes);
        let want = if cmd == CMD_CACHE { 0 } else { EINVAL };
        for i in 0..1100u64 {
            let mut h = [0u8; 16];
            if let Err(e) = std::io::Read::read_exact(&mut r.s, &mut h) {
                let log: Vec<String> =
                    n.d.proc.stderr().lines().filter(|l| l.contains("send failed")).map(str::to_string).collect();
                panic!("{what}: connection lost after {i} of 1100 replies ({e}); daemon log: {log:?}");
            }
            assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), want, "{what} reply {i}");
        }
        r.disc();
    }
    n.assert_serves("v0");
}

fn rss_mib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 =
        s.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

#[test]
fn a_client_not_reading_replies_is_back_pressured() {
    let dir = TempDir::new("nbdflood");
    let n = NbdDaemon::start(&dir, "0x1");
    n.malloc("F0", 64 * MIB / 4096, 4096);
    n.export("F0", "f0", false, "");
    let base = rss_mib(n.d.proc.pid());
    let (mut r, _) = Raw::open(n.port, "f0", false);
    let data = pattern(9, MIB as usize);
    r.write_ok(1, 0, &data, 0);
    let mut bytes = Vec::new();
    for i in 0..1500u64 {
        bytes.extend(req(0, CMD_READ, 100 + i, 0, MIB as u32, &[]));
    }
    r.send(&bytes); // 42 KB of requests; the replies would be 1.5 GiB
    std::thread::sleep(Duration::from_millis(1500));
    let grown = rss_mib(n.d.proc.pid()).saturating_sub(base);
    assert!(grown < 640, "the daemon buffered {grown} MiB for a client that reads no replies");
    // Then every reply arrives, with the right data.
    for _ in 0..1500 {
        let (err, cookie) = r.simple_reply();
        assert_eq!(err, 0, "read {cookie}");
        assert!(r.read_n(MIB as usize) == data, "read {cookie}");
    }
    r.disc();
    n.assert_serves("f0");
}
