//! The NVMe/TCP target through a hand-driven host (`nvmf_common::Host`): data round trips in
//! capsule and by R2T at every size up to 1 MiB, with and without digests, on several I/O
//! queues; Write Zeroes, Deallocate and Compare; identify data, namespace lists, log pages and
//! asynchronous events; keep-alive expiry. Then bad input, each case followed by a
//! well-behaved host doing I/O on the same daemon (which must not have panicked): commands
//! before Connect, Connects that must fail, malformed PDUs, H2CData that answers no R2T, data
//! digest errors, LBAs past the end, more commands than the queue holds, hosts that vanish,
//! silent connections by the thousand, and a host that never reads its responses.

mod common;
mod nvmf_common;

use common::TempDir;
use ferrite_nvmf::spec::aer::AsyncEvent;
use ferrite_nvmf::spec::fabrics::{ConnectData, InvalidParameter, CNTLID_DYNAMIC};
use ferrite_nvmf::spec::features::fid;
use ferrite_nvmf::spec::identify::{cns, csi, NamespaceList, NsIdDescriptor};
use ferrite_nvmf::spec::identify_ctrl::{field_text, IdentifyController};
use ferrite_nvmf::spec::identify_ns::{nsattr, IdentifyNamespace};
use ferrite_nvmf::spec::log::{lid, ChangedNamespaceList};
use ferrite_nvmf::spec::opcode::nvm;
use ferrite_nvmf::spec::registers::{self, Cap, Csts, Vs};
use ferrite_nvmf::spec::status::{fabrics as fsc, generic, media, sct};
use ferrite_nvmf::tcp::{Fes, H2cData, Pdu};
use nvmf_common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Namespace 1: 512-byte blocks; namespace 2: 4096-byte blocks (8 MiB each).
const NS512: u32 = 1;
const NS4K: u32 = 2;
const NS512_BLOCKS: u64 = 16384;
const NS4K_BLOCKS: u64 = 2048;

/// How long a closing connection may take to close.
const CLOSE: Duration = Duration::from_secs(5);

/// A daemon on `cpumask` with the transport (`transport` parameters), subsystem [`SUBNQN`]
/// (any host) holding a 512-byte and a 4096-byte malloc namespace, listening.
fn setup(tag: &str, cpumask: &str, transport: Value) -> (TempDir, NvmfDaemon) {
    let dir = TempDir::new(tag);
    let mut n = NvmfDaemon::start(&dir, cpumask, transport);
    n.malloc("M512", NS512_BLOCKS, 512);
    n.malloc("M4K", NS4K_BLOCKS, 4096);
    n.subsystem(SUBNQN, true);
    assert_eq!(n.add_ns(SUBNQN, "M512"), NS512);
    assert_eq!(n.add_ns(SUBNQN, "M4K"), NS4K);
    n.listen(SUBNQN);
    (dir, n)
}

/// After a bad input: the daemon is alive and a new, well-behaved host does I/O on it.
fn still_serves(n: &mut NvmfDaemon, seed: u64) {
    n.assert_alive();
    assert_good_host(n.port, SUBNQN, NS4K, 4096, seed);
    assert_good_host(n.port, SUBNQN, NS512, 512, seed + 100);
    n.assert_alive();
}

/// Status of a completion as (SCT, SC).
fn status(c: &Completion) -> (u8, u8) {
    c.status()
}

// ---------------------------------------------------------------------------------------------
// (a) Round trips and commands
// ---------------------------------------------------------------------------------------------

/// Writes then reads back every size from 512 bytes to 1 MiB on both namespaces, spread over
/// three I/O queues (on two reactors), first one command at a time, then eight at once.
fn round_trips(tag: &str, opts: HostOpts) {
    let (_dir, mut n) = setup(tag, "0x3", json!({"max_io_size": 1 << 20}));
    let mut s = Session::open(n.port, SUBNQN, 3, opts, 4096);
    let sizes = [512usize, 4096, 8192, 12288, 65536, 131072, 131072 + 4096, 524288, 1 << 20];
    let mut seed = 1u64;
    for (nsid, bs) in [(NS512, 512u32), (NS4K, 4096u32)] {
        let mut lba = 0u64;
        for (i, &size) in sizes.iter().enumerate() {
            if size % bs as usize != 0 {
                continue;
            }
            let q = &mut s.io[i % 3];
            let data = pattern(seed, size);
            seed += 1;
            let r2ts = q.r2ts;
            let c = q.write(nsid, lba, &data, bs);
            assert!(c.cqe.status.is_success(), "write {size} bytes to ns {nsid}: {:?}", c.cqe);
            if size <= 4096 {
                assert_eq!(q.r2ts, r2ts, "a {size}-byte write goes in the capsule");
            } else {
                assert_eq!(q.r2ts, r2ts + 1, "a {size}-byte write is asked for with one R2T");
            }
            // Read it back through another queue (another reactor, most likely).
            let nlb = (size / bs as usize) as u32;
            let back = s.io[(i + 1) % 3].read(nsid, lba, nlb, bs);
            assert!(back.cqe.status.is_success(), "read {size} bytes from ns {nsid}: {:?}", back.cqe);
            assert!(back.data == data, "ns {nsid}: {size} bytes at LBA {lba} read back differ");
            assert_eq!(back.by_success_flag, opts.sqflow_off, "C2HData SUCCESS exactly when SQ flow control is off");
            lba += u64::from(nlb);
        }
        // Eight commands in flight on one queue: writes of mixed sizes, then reads of them.
        let q = &mut s.io[0];
        let base = lba;
        let mut expect = Vec::new();
        let mut cids = Vec::new();
        for k in 0..8u64 {
            let size = if k % 2 == 0 { 4096 } else { 65536 };
            let data = pattern(1000 + k, size);
            let nlb = (size / bs as usize) as u32;
            cids.push(q.submit(Host::rw_sqe(nvm::WRITE, nsid, lba, nlb), Some(&data), 0));
            expect.push((lba, nlb, data));
            lba += u64::from(nlb);
        }
        for cid in cids {
            q.wait(cid).ok("pipelined write");
        }
        let cids: Vec<u16> = expect
            .iter()
            .map(|(l, nlb, _)| q.submit(Host::rw_sqe(nvm::READ, nsid, *l, *nlb), None, nlb * bs))
            .collect();
        for (cid, (l, _, data)) in cids.into_iter().zip(&expect) {
            let c = q.wait(cid).ok("pipelined read");
            assert!(c.data == *data, "ns {nsid}: pipelined read at LBA {l} differs");
        }
        assert!(lba > base);
    }
    n.assert_alive();
}

#[test]
fn round_trips_without_digests() {
    round_trips("nvmfrt", HostOpts::default());
}

#[test]
fn round_trips_with_digests_padding_and_c2h_success() {
    // Header and data digests, data aligned to 32 bytes in C2H PDUs (HPDA 7), and SQ flow
    // control off so that reads may end with C2HData SUCCESS.
    round_trips("nvmfrtd", HostOpts { hpda: 7, sqflow_off: true, ..HostOpts::digests() });
}

#[test]
fn writes_beyond_the_r2t_budget_wait_for_their_turn() {
    // 32 writes of 1 MiB at once: a connection may hold 8 MiB of buffers for data it was asked
    // for and has not sent, so 8 R2Ts come first and each further one after data has come in.
    // Every write completes and reads back; none fails for want of memory.
    let dir = TempDir::new("nvmfbudget");
    let mut n = NvmfDaemon::start(&dir, "0x1", json!({"max_io_size": 1 << 20}));
    n.malloc("Big", 16384, 4096);
    n.subsystem(SUBNQN, true);
    let nsid = n.add_ns(SUBNQN, "Big");
    n.listen(SUBNQN);
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts { sqsize: 63, ..Default::default() }, 4096);
    let q = &mut s.io[0];
    let datas: Vec<Vec<u8>> = (0..32).map(|i| pattern(500 + i, 1 << 20)).collect();
    let cids: Vec<u16> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| q.submit(Host::rw_sqe(nvm::WRITE, nsid, i as u64 * 256, 256), Some(d), 0))
        .collect();
    // The first R2Ts: as many as the budget holds, and no more while no data has been sent.
    let mut first = Vec::new();
    q.s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    loop {
        match q.recv() {
            Ok(r) => first.push(r),
            Err(RecvError::TimedOut) => break,
            Err(e) => panic!("before any data: {e:?}"),
        }
    }
    q.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(first.iter().all(|r| matches!(r.pdu, Pdu::R2t(_))), "only R2Ts before any data");
    assert_eq!(first.len(), 8, "R2Ts before any data was sent");
    for r in first {
        q.handle(r);
    }
    for (i, &cid) in cids.iter().enumerate() {
        q.wait(cid).ok(&format!("1 MiB write {i}"));
    }
    assert_eq!(q.r2ts, 32, "one R2T per write");
    for (i, d) in datas.iter().enumerate() {
        assert!(q.read(nsid, i as u64 * 256, 256, 4096).ok("read back").data == *d, "write {i} reads back");
    }
    n.assert_alive();
}

#[test]
fn a_write_that_finds_no_buffer_in_time_fails_retryably() {
    // Writes over 2 MiB take their buffers from the reactor's heap budget (64 MiB). Eight
    // connections each hold one 8 MiB write by R2T and never send its data: the budget is spent
    // for the 10 s + 8 s the target waits for that data. A good host's 4 MiB write meanwhile
    // waits for a buffer; after 10 s + 4 s it fails as Command Interrupted (retryable), while
    // the hoarders are still there. Once they go, the same write succeeds and reads back.
    const BIG: u32 = 8 << 20;
    const GOOD: u32 = 4 << 20;
    let dir = TempDir::new("nvmfnobuf");
    let mut n = NvmfDaemon::start(&dir, "0x1", json!({"max_io_size": BIG}));
    n.malloc("Big", 16384, 4096);
    n.subsystem(SUBNQN, true);
    let nsid = n.add_ns(SUBNQN, "Big");
    n.listen(SUBNQN);
    let mut hoarders = Session::open(n.port, SUBNQN, 8, HostOpts::default(), 4096);
    for (k, q) in hoarders.io.iter_mut().enumerate() {
        let raw = Host::rw_sqe(nvm::WRITE, nsid, 2048 * (k as u64 % 4), BIG / 4096);
        q.send_capsule(&Host::with_transport_sgl(raw, 0x7000, BIG), &[]);
        let r = q.recv().unwrap_or_else(|e| panic!("hoarder {k}: no R2T for its 8 MiB write: {e:?}"));
        assert!(matches!(r.pdu, Pdu::R2t(_)), "hoarder {k}: expected an R2T, got {:?}", r.pdu);
    }
    let t0 = Instant::now();
    let mut good = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut good.io[0];
    let data = pattern(77, GOOD as usize);
    let slba = 2048 * 4;
    q.s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let cid = q.submit(Host::rw_sqe(nvm::WRITE, nsid, slba, GOOD / 4096), Some(&data), 0);
    let c = q.wait(cid);
    let waited = t0.elapsed();
    println!("the 4 MiB write ended {waited:?} after it came: {:?}", c.status());
    assert_eq!(c.status(), (sct::GENERIC, generic::COMMAND_INTERRUPTED), "a write that found no buffer");
    assert_eq!(q.r2ts, 0, "no R2T went out for it");
    assert!(waited >= Duration::from_secs(13), "it failed after {waited:?}, before its 14 s");
    // The hoarders' time (18 s) is not up: they were still holding the buffers.
    for (k, h) in hoarders.io.iter_mut().enumerate() {
        assert!(!h.closed_within(Duration::from_millis(10)), "hoarder {k} was closed before the write failed");
    }
    drop(hoarders);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cid = q.submit(Host::rw_sqe(nvm::WRITE, nsid, slba, GOOD / 4096), Some(&data), 0);
        let c = q.wait(cid);
        if c.cqe.status.is_success() {
            break;
        }
        assert_eq!(c.status(), (sct::GENERIC, generic::COMMAND_INTERRUPTED), "the retried write");
        assert!(Instant::now() < deadline, "the write still finds no buffer after the hoarders left");
    }
    assert!(q.read(nsid, slba, GOOD / 4096, 4096).ok("read back").data == data, "the retried write reads back");
    n.assert_alive();
    let log = n.d.proc.stderr();
    assert!(log.contains("found no buffer for their data in time"), "the target says why the write failed");
}

/// Payloads over 64 KiB are received straight into their buffers (plain receives as the data
/// arrives, a ring receive for what is still missing), and what follows one comes by a plain
/// receive too. Payloads that trickle in, in pieces that end anywhere (inside a header, inside
/// data), and PDUs glued to a payload's last bytes must all land where they belong.
#[test]
fn large_payloads_that_trickle_in_or_come_glued_together() {
    let (_dir, mut n) = setup("nvmftrickle", "0x1", json!({"max_io_size": 1 << 20}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    let size = 192usize << 10;
    let nlb = (size / 4096) as u32;
    for round in 0..4u64 {
        // Two large writes at once; both R2Ts answered by one stream of H2CData PDUs.
        let datas = [pattern(100 + 2 * round, size), pattern(101 + 2 * round, size)];
        let lbas = [round * 2 * u64::from(nlb), round * 2 * u64::from(nlb) + u64::from(nlb)];
        let cids: Vec<u16> =
            (0..2).map(|i| q.submit(Host::rw_sqe(nvm::WRITE, NS4K, lbas[i], nlb), Some(&datas[i]), 0)).collect();
        let mut stream = Vec::new();
        for _ in 0..2 {
            let r = q.recv().expect("an R2T");
            let Pdu::R2t(t) = r.pdu else { panic!("expected an R2T, got {:?}", r.pdu) };
            let i = cids.iter().position(|&c| c == t.cccid).expect("R2T for one of ours");
            assert_eq!((t.r2to, t.r2tl), (0, size as u32));
            let mut off = 0u32;
            while off < t.r2tl {
                let len = (t.r2tl - off).min(q.params.maxh2cdata);
                let last = off + len == t.r2tl;
                let pdu = Pdu::H2cData(H2cData { cccid: t.cccid, ttag: t.ttag, datao: off, datal: len, last });
                stream.extend(q.frame(&pdu, &[&datas[i][off as usize..(off + len) as usize]]));
                off += len;
            }
        }
        // Round 0: all at once. Others: pieces of odd sizes with pauses between them.
        let cuts: &[usize] = match round {
            0 => &[],
            1 => &[10, 100, 70_000, 140_000, 200_000],
            2 => &[24, 5_000, 131_096, 131_120, 262_000],
            _ => &[1, 2, 65_536, 65_560, 300_000],
        };
        let mut at = 0;
        for &c in cuts {
            q.send_raw(&stream[at..c]);
            at = c;
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        q.send_raw(&stream[at..]);
        for cid in cids {
            q.wait(cid).ok("large write");
        }
        // A small write right after: the connection is back to ordinary commands.
        let small = pattern(900 + round, 4096);
        q.write(NS4K, NS4K_BLOCKS - 1 - round, &small, 4096).ok("small write after large ones");
        for i in 0..2 {
            let back = q.read(NS4K, lbas[i], nlb, 4096).ok("read back");
            assert!(back.data == datas[i], "round {round}: large write {i} read back differs");
        }
        assert!(q.read(NS4K, NS4K_BLOCKS - 1 - round, 1, 4096).ok("read back").data == small);
    }
    n.assert_alive();
}

/// In-capsule data that stops coming: the target waits 10 s for it, counted from when that wait
/// began, and then closes the connection. One timer bounds these waits and is kept from one
/// wait to the next (a timer per wait would allocate on the I/O path), so a first write whose
/// data comes in two pieces arms it; a second write 4 s later, whose data stops halfway, must
/// still get its whole 10 s (the kept timer fires 4 s early for it and is armed again). Another
/// host is served meanwhile.
#[test]
fn in_capsule_data_that_stops_coming_closes_the_connection_10_s_on() {
    let (_dir, mut n) = setup("nvmfstall", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    // A 4 KiB write of `data` to block `slba` with its data in the capsule, framed.
    let capsule = |q: &mut Host, slba: u64, data: &[u8]| -> (u16, Vec<u8>) {
        let cid = q.cid();
        let mut raw = Host::rw_sqe(nvm::WRITE, NS4K, slba, 1);
        raw[1] |= 0x40;
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        raw[24..40].copy_from_slice(&ferrite_nvmf::spec::sgl::SglDescriptor::in_capsule(0, 4096).to_bytes());
        (cid, q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[data]))
    };
    let first = pattern(31, 4096);
    let (cid, b) = capsule(q, 5, &first);
    q.send_raw(&b[..b.len() - 2000]);
    std::thread::sleep(Duration::from_millis(300));
    q.send_raw(&b[b.len() - 2000..]);
    q.wait(cid).ok("a write whose data came in two pieces");
    assert!(q.read(NS4K, 5, 1, 4096).ok("read back").data == first, "the write in two pieces reads back");

    std::thread::sleep(Duration::from_secs(4));
    let (_, b) = capsule(q, 6, &pattern(32, 4096));
    q.send_raw(&b[..b.len() - 2048]);
    let stalled = Instant::now();
    assert_good_host(n.port, SUBNQN, NS4K, 4096, 300);
    assert!(q.closed_within(Duration::from_secs(15)), "a connection whose data stopped coming is still open");
    let waited = stalled.elapsed();
    println!("closed {waited:?} after its data stopped");
    assert!(waited >= Duration::from_millis(9_500), "closed after {waited:?}, before the data's 10 s were up");
    assert!(n.d.proc.stderr().contains("did not arrive in time"), "the target says why it closed");
    still_serves(&mut n, 310);
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeroes() {
    let (_dir, mut n) = setup("nvmfzero", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    for (nsid, bs) in [(NS512, 512u32), (NS4K, 4096u32)] {
        let data = pattern(7, 16 * bs as usize);
        q.write(nsid, 100, &data, bs).ok("write");
        q.write_zeroes(nsid, 102, 4).ok("write zeroes");
        q.deallocate(nsid, &[(108, 3), (112, 2)]).ok("deallocate");
        let back = q.read(nsid, 100, 16, bs).ok("read").data;
        let b = bs as usize;
        let mut want = data.clone();
        want[2 * b..6 * b].fill(0);
        want[8 * b..11 * b].fill(0);
        want[12 * b..14 * b].fill(0);
        assert!(back == want, "ns {nsid}: write zeroes / deallocate did not read back as zeroes where asked only");
        // One range beyond the end fails the command with its status; the ranges are one
        // fan-out, so the command completes once, after every range.
        let c = q.deallocate(nsid, &[(100, 1), (1 << 40, 1), (101, 1)]);
        assert_eq!(status(&c), (sct::GENERIC, generic::LBA_OUT_OF_RANGE), "a range beyond the end: {:?}", c.cqe);
        let back = q.read(nsid, 100, 2, bs).ok("read").data;
        assert!(back == vec![0u8; 2 * b], "ns {nsid}: the ranges within the namespace were deallocated all the same");
    }
    n.assert_alive();
}

/// A thin lvol whose lvstore has run out of clusters, and an lvol snapshot: writes that
/// cannot be done answer Capacity Exceeded and Namespace is Write Protected, both with Do Not
/// Retry (hosts report "no space" and "read-only", where Internal Device Error is an I/O error
/// they retry); what was written before reads back, and the daemon serves on.
#[test]
fn a_full_thin_lvol_and_a_snapshot_refuse_writes_with_their_statuses() {
    let (_dir, mut n) = setup("nvmffull", "0x1", json!({}));
    // 8 MiB: the lvstore's metadata and 6 clusters of 1 MiB, less than the lvol's 8.
    n.malloc("Small", 2048, 4096);
    n.d.call(
        "bdev_lvol_create_lvstore",
        Some(json!({"bdev_name": "Small", "lvs_name": "lvs0", "cluster_sz": 1 << 20})),
    );
    let lvs = n.d.call("bdev_lvol_get_lvstores", Some(json!({"lvs_name": "lvs0"})));
    let free = lvs[0]["free_clusters"].as_u64().expect("free_clusters");
    assert!((1..8).contains(&free), "the test wants fewer free clusters than the lvol's 8: {lvs}");
    n.d.call(
        "bdev_lvol_create",
        Some(json!({"lvs_name": "lvs0", "lvol_name": "thin", "size_in_mib": 8, "thin_provision": true})),
    );
    let thin = n.add_ns(SUBNQN, "lvs0/thin");
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    // One block into each cluster: the first `free` allocate, the next one finds none.
    let blocks_per_cluster = 256;
    for c in 0..free {
        q.write(thin, c * blocks_per_cluster, &pattern(c, 4096), 4096).ok("a write that allocates");
    }
    let c = q.write(thin, free * blocks_per_cluster, &pattern(99, 4096), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::CAPACITY_EXCEEDED), "a write to a full lvstore: {:?}", c.cqe);
    assert!(c.cqe.status.dnr, "no space is not worth retrying");
    for c in 0..free {
        let back = q.read(thin, c * blocks_per_cluster, 1, 4096).ok("read back").data;
        assert!(back == pattern(c, 4096), "cluster {c} lost its block");
    }

    n.d.call("bdev_lvol_snapshot", Some(json!({"lvol_name": "lvs0/thin", "snapshot_name": "snap"})));
    let snap = n.add_ns(SUBNQN, "lvs0/snap");
    let c = q.write(snap, 0, &pattern(7, 4096), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::NAMESPACE_IS_WRITE_PROTECTED), "a write to a snapshot");
    assert!(c.cqe.status.dnr, "a snapshot stays read-only");
    let c = q.deallocate(snap, &[(0, 1)]);
    assert_eq!(status(&c), (sct::GENERIC, generic::NAMESPACE_IS_WRITE_PROTECTED), "a deallocate on a snapshot");
    assert!(q.read(snap, 0, 1, 4096).ok("read the snapshot").data == pattern(0, 4096), "the snapshot's block 0");
    for (nsid, want) in [(snap, nsattr::WRITE_PROTECTED), (thin, 0)] {
        let c = s.admin.identify(cns::NAMESPACE, nsid, csi::NVM).ok("identify namespace");
        let id = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
        assert_eq!(id.nsattr & nsattr::WRITE_PROTECTED, want, "NSATTR of namespace {nsid}");
    }
    drop(s);
    still_serves(&mut n, 40);
}

#[test]
fn an_lvol_made_read_only_raises_a_notice_and_turns_write_protected() {
    let (_dir, mut n) = setup("nvmfro", "0x1", json!({}));
    n.malloc("Base", 4096, 4096);
    n.d.call("bdev_lvol_create_lvstore", Some(json!({"bdev_name": "Base", "lvs_name": "lvs0", "cluster_sz": 1 << 20})));
    n.d.call("bdev_lvol_create", Some(json!({"lvs_name": "lvs0", "lvol_name": "vol", "size_in_mib": 4})));
    let vol = n.add_ns(SUBNQN, "lvs0/vol");
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    s.admin.set_features(fid::ASYNC_EVENT_CONFIGURATION, 1 << 8).ok("Set Features AEC");
    let aer = s.admin.submit_aer();
    let data = pattern(5, 4096);
    s.io[0].write(vol, 9, &data, 4096).ok("write while writable");
    assert!(s.admin.take_done(aer).is_none(), "an AER completed with no event");

    n.d.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs0/vol"})));
    let c = s.admin.wait(aer).ok("AER after set_read_only");
    assert_eq!(AsyncEvent::from_dw0(c.cqe.dw0), AsyncEvent::NS_ATTR_CHANGED);
    let c = s.admin.get_log_page(lid::CHANGED_NS_LIST, 4096, false).ok("changed namespace list");
    let changed = ChangedNamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(changed.iter().collect::<Vec<_>>(), vec![vol], "the lvol's namespace is listed");
    let c = s.admin.identify(cns::NAMESPACE, vol, csi::NVM).ok("identify namespace");
    let id = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(id.nsattr & nsattr::WRITE_PROTECTED, nsattr::WRITE_PROTECTED, "NSATTR after set_read_only");
    let q = &mut s.io[0];
    let c = q.write(vol, 9, &pattern(6, 4096), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::NAMESPACE_IS_WRITE_PROTECTED), "a write after set_read_only");
    assert!(c.cqe.status.dnr);
    assert!(q.read(vol, 9, 1, 4096).ok("read back").data == data, "the block written before");
    // Setting it read-only again changes nothing and tells nobody.
    let aer = s.admin.submit_aer();
    n.d.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs0/vol"})));
    s.admin.keep_alive().ok("keep alive");
    assert!(s.admin.take_done(aer).is_none(), "a second notice for no change");
    drop(s);

    // A passthru on an lvol follows it: its namespace is told and turns write-protected.
    n.d.call("bdev_lvol_create", Some(json!({"lvs_name": "lvs0", "lvol_name": "under", "size_in_mib": 4})));
    n.d.call("bdev_passthru_create", Some(json!({"base_bdev_name": "lvs0/under", "name": "over"})));
    let over = n.add_ns(SUBNQN, "over");
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    s.admin.set_features(fid::ASYNC_EVENT_CONFIGURATION, 1 << 8).ok("Set Features AEC");
    s.io[0].write(over, 3, &data, 4096).ok("write through the passthru");
    let aer = s.admin.submit_aer();
    n.d.call("bdev_lvol_set_read_only", Some(json!({"name": "lvs0/under"})));
    let c = s.admin.wait(aer).ok("AER for the passthru's namespace");
    assert_eq!(AsyncEvent::from_dw0(c.cqe.dw0), AsyncEvent::NS_ATTR_CHANGED);
    let c = s.admin.get_log_page(lid::CHANGED_NS_LIST, 4096, false).ok("changed namespace list");
    let changed = ChangedNamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(changed.iter().collect::<Vec<_>>(), vec![over], "the passthru's namespace is listed");
    let c = s.admin.identify(cns::NAMESPACE, over, csi::NVM).ok("identify namespace");
    let id = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(id.nsattr & nsattr::WRITE_PROTECTED, nsattr::WRITE_PROTECTED, "the passthru's NSATTR");
    let q = &mut s.io[0];
    let c = q.write(over, 3, &pattern(6, 4096), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::NAMESPACE_IS_WRITE_PROTECTED), "a write through the passthru");
    assert!(c.cqe.status.dnr);
    assert!(q.read(over, 3, 1, 4096).ok("read back").data == data, "the block written through the passthru");
    drop(s);
    still_serves(&mut n, 41);
}

#[test]
fn compare_success_and_miscompare() {
    let (_dir, mut n) = setup("nvmfcmp", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::digests(), 4096);
    let q = &mut s.io[0];
    let data = pattern(9, 8192);
    q.write(NS4K, 5, &data, 4096).ok("write");
    q.compare(NS4K, 5, &data, 4096).ok("compare of the same data");
    let mut other = data.clone();
    other[5000] ^= 1;
    let c = q.compare(NS4K, 5, &other, 4096);
    assert_eq!(status(&c), (sct::MEDIA_ERROR, media::COMPARE_FAILURE), "miscompare: {:?}", c.cqe);
    assert!(c.cqe.status.dnr, "a miscompare is not worth retrying");
    // In capsule on the 512-byte namespace.
    q.write(NS512, 3, &data[..512], 512).ok("write");
    q.compare(NS512, 3, &data[..512], 512).ok("compare");
    let c = q.compare(NS512, 3, &other[4096..4608], 512);
    assert_eq!(status(&c), (sct::MEDIA_ERROR, media::COMPARE_FAILURE));
    n.assert_alive();
}

#[test]
fn properties_identify_and_namespace_lists() {
    let (_dir, mut n) = setup("nvmfid", "0x1", json!({"max_io_size": 262144}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let a = &mut s.admin;
    let cap = Cap::from_u64(a.prop_get(registers::offset::CAP));
    assert_eq!(cap.mqes, 127, "MQES is max_queue_depth - 1");
    assert_eq!(Vs::from_u32(a.prop_get(registers::offset::VS) as u32).mjr, 1);
    assert!(Csts::from_u32(a.prop_get(registers::offset::CSTS) as u32).rdy);

    let c = a.identify(cns::CONTROLLER, 0, 0).ok("identify controller");
    assert_eq!(c.data.len(), 4096);
    let id = IdentifyController::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(field_text(&id.sn), SERIAL.as_bytes(), "SN from nvmf_create_subsystem");
    assert_eq!(field_text(&id.mn), MODEL.as_bytes(), "MN from nvmf_create_subsystem");
    assert_eq!(id.cntlid, s.admin.cntlid, "CNTLID is the one Connect returned");
    assert_eq!(id.mdts, 6, "MDTS: 256 KiB in 4 KiB pages is 2^6");
    assert_eq!(id.subnqn.as_str().unwrap(), SUBNQN);
    assert_eq!(id.ioccsz, (64 + 4096) / 16, "IOCCSZ: the SQE and 4 KiB of in-capsule data");
    assert_eq!(id.nn, 1024);

    let a = &mut s.admin;
    for (nsid, bs, blocks) in [(NS512, 512u32, NS512_BLOCKS), (NS4K, 4096, NS4K_BLOCKS)] {
        let c = a.identify(cns::NAMESPACE, nsid, 0).ok("identify namespace");
        let ns = IdentifyNamespace::decode(c.data[..4096].try_into().unwrap());
        assert_eq!(ns.nsze, blocks, "NSZE of ns {nsid}");
        assert_eq!(ns.ncap, blocks);
        let fmt = ns.lbaf[usize::from(ns.flbas & 0xf)];
        assert_eq!(fmt.block_size(), Some(bs), "LBA format of ns {nsid}");
        assert_eq!(fmt.ms, 0);
    }
    // An inactive NSID answers zeroes.
    let c = a.identify(cns::NAMESPACE, 77, 0).ok("identify inactive namespace");
    assert!(c.data.iter().all(|&b| b == 0));

    let c = a.identify(cns::ACTIVE_NS_LIST, 0, 0).ok("active namespace list");
    let list = NamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(list.iter().collect::<Vec<_>>(), vec![NS512, NS4K]);
    let c = a.identify(cns::ACTIVE_NS_LIST, NS512, 0).ok("active namespace list after 1");
    let list = NamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(list.iter().collect::<Vec<_>>(), vec![NS4K]);

    let c = a.identify(cns::NS_ID_DESCRIPTOR_LIST, NS4K, 0).ok("namespace identification descriptors");
    let descs: Vec<NsIdDescriptor> = NsIdDescriptor::read_list(&c.data).collect();
    let uuid = descs.iter().find_map(|d| if let NsIdDescriptor::Uuid(u) = d { Some(*u) } else { None });
    let uuid = uuid.unwrap_or_else(|| panic!("a UUID descriptor (the bdev's UUID): {descs:?}"));
    assert_ne!(uuid, [0; 16]);
    assert!(descs.contains(&NsIdDescriptor::Csi(csi::NVM)), "a CSI descriptor: {descs:?}");
    let bdev_uuid = n.d.bdevs().iter().find(|b| b["name"] == "M4K").unwrap()["uuid"].as_str().unwrap().replace('-', "");
    let got: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got, bdev_uuid, "the UUID descriptor is the bdev's UUID");
    let c = s.admin.identify(cns::NS_ID_DESCRIPTOR_LIST, 99, 0);
    assert_eq!(status(&c), (sct::GENERIC, generic::INVALID_NAMESPACE_OR_FORMAT));

    // Into a buffer larger than the structure: the structure, then zeroes to the buffer's end
    // (as SPDK's target sends), never a short transfer; with SQ flow control on and off.
    for sqflow_off in [false, true] {
        let opts = HostOpts { sqflow_off, ..HostOpts::default() };
        let mut s2 = Session::open(n.port, SUBNQN, 0, opts, 4096);
        let raw = Host::sqe(ferrite_nvmf::spec::opcode::admin::IDENTIFY, 0, |q| {
            ferrite_nvmf::spec::admin::IdentifyCommand { cns: cns::CONTROLLER, ..Default::default() }.apply(q)
        });
        let c = s2.admin.cmd(raw, None, 8192).ok("identify controller into 8 KiB");
        assert_eq!(c.data.len(), 8192, "the whole buffer is sent (SQ flow control off: {sqflow_off})");
        assert_eq!(c.by_success_flag, sqflow_off);
        let id = IdentifyController::decode(c.data[..4096].try_into().unwrap());
        assert_eq!(field_text(&id.sn), SERIAL.as_bytes());
        assert!(c.data[4096..].iter().all(|&b| b == 0), "zeroes after the structure");
    }
    n.assert_alive();
}

#[test]
fn namespace_added_while_connected_raises_an_aer_and_the_changed_list() {
    let (_dir, mut n) = setup("nvmfaer", "0x3", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let a = &mut s.admin;
    // Namespace attribute notices are asked for, as Linux does.
    a.set_features(fid::ASYNC_EVENT_CONFIGURATION, 1 << 8).ok("Set Features AEC");
    let aer = a.submit_aer();
    // Nothing is pending: the AER stays outstanding while other commands complete.
    a.keep_alive().ok("keep alive with an AER outstanding");
    assert!(a.take_done(aer).is_none(), "an AER completed with no event");

    n.malloc("M3", 1024, 4096);
    let nsid = n.add_ns(SUBNQN, "M3");
    assert_eq!(nsid, 3);
    let a = &mut s.admin;
    let c = a.wait(aer).ok("AER");
    assert_eq!(c.cqe.dw0, 0x0004_0002, "Namespace Attribute Changed (notice 0, log page 04h)");
    assert_eq!(AsyncEvent::from_dw0(c.cqe.dw0), AsyncEvent::NS_ATTR_CHANGED);
    let c = a.get_log_page(lid::CHANGED_NS_LIST, 4096, false).ok("changed namespace list");
    let changed = ChangedNamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(changed.iter().collect::<Vec<_>>(), vec![3], "the new namespace is listed");
    // Read, the list is cleared.
    let c = a.get_log_page(lid::CHANGED_NS_LIST, 4096, false).ok("changed namespace list again");
    assert!(c.data.iter().all(|&b| b == 0), "the list is cleared once read");
    let c = a.identify(cns::ACTIVE_NS_LIST, 0, 0).ok("active namespace list");
    let list = NamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(list.iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    // The new namespace does I/O on the queue that was connected before it existed.
    let q = &mut s.io[0];
    let data = pattern(3, 4096);
    q.write(3, 7, &data, 4096).ok("write to the new namespace");
    assert_eq!(q.read(3, 7, 1, 4096).ok("read").data, data);
    // At most AERL + 1 (4) AERs are outstanding; an Abort ends one.
    let aers: Vec<u16> = (0..4).map(|_| s.admin.submit_aer()).collect();
    let c = s.admin.cmd(Host::sqe(ferrite_nvmf::spec::opcode::admin::ASYNC_EVENT_REQUEST, 0, |_| {}), None, 0);
    assert_eq!(
        status(&c),
        (sct::COMMAND_SPECIFIC, ferrite_nvmf::spec::status::command_specific::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED),
        "a fifth AER"
    );
    let abort = Host::sqe(ferrite_nvmf::spec::opcode::admin::ABORT, 0, |sq| sq.cdw10 = u32::from(aers[3]) << 16);
    let c = s.admin.cmd(abort, None, 0).ok("Abort of an AER");
    assert_eq!(c.cqe.dw0 & 1, 0, "the AER was aborted");
    assert_eq!(status(&s.admin.wait(aers[3])), (sct::GENERIC, generic::ABORTED_BY_REQUEST));
    // A second event is delivered to an outstanding AER.
    let aer = aers[0];
    assert_eq!(n.d.call("nvmf_subsystem_remove_ns", Some(json!({"nqn": SUBNQN, "nsid": 3}))), json!(true));
    let c = s.admin.wait(aer).ok("AER after remove");
    assert_eq!(c.cqe.dw0, 0x0004_0002);
    let c = s.admin.get_log_page(lid::CHANGED_NS_LIST, 4096, false).ok("changed namespace list");
    let changed = ChangedNamespaceList::decode(c.data[..4096].try_into().unwrap());
    assert_eq!(changed.iter().collect::<Vec<_>>(), vec![3]);
    let c = s.io[0].read(3, 7, 1, 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::INVALID_NAMESPACE_OR_FORMAT), "I/O to a removed namespace");
    n.assert_alive();
}

#[test]
fn keep_alive_timeout_closes_the_controller() {
    let (_dir, mut n) = setup("nvmfkato", "0x3", json!({}));
    // A controller with a 1 s keep-alive timeout whose host keeps it alive for 2.5 s...
    let opts = HostOpts { kato: 1000, ..Default::default() };
    let mut s = Session::open(n.port, SUBNQN, 1, opts, 4096);
    let cntlid = s.cntlid();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        s.admin.keep_alive().ok("keep alive");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(n.controllers(SUBNQN).len(), 1, "kept alive, the controller stays");
    // ...then stops: the target ends the controller, closes both queues, and an I/O queue can
    // no longer connect to it.
    let t = Instant::now();
    assert!(s.admin.closed_within(Duration::from_secs(5)), "the admin queue is closed after the keep-alive timeout");
    println!("admin queue closed {:?} after the last keep-alive", t.elapsed());
    assert!(s.io[0].closed_within(Duration::from_secs(3)), "the I/O queue of the expired controller is closed");
    assert!(n.controllers(SUBNQN).is_empty(), "the controller is gone: {:?}", n.controllers(SUBNQN));
    let mut h = Host::initialized(n.port, HostOpts::default());
    let c = h.connect(SUBNQN, 1, cntlid);
    assert_eq!(
        status(&c),
        (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS),
        "I/O Connect to the dead controller"
    );
    let ip = InvalidParameter::from_dw0(c.cqe.dw0);
    assert_eq!((ip.iattr, ip.ipo), (1, ConnectData::OFFSET_CNTLID as u16));
    // A controller without a keep-alive timeout is not timed out.
    let mut s2 = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    std::thread::sleep(Duration::from_millis(2500));
    s2.admin.keep_alive().ok("a controller with KATO 0 lives on");
    still_serves(&mut n, 20);
}

// ---------------------------------------------------------------------------------------------
// (b) Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn commands_before_connect_fail_with_command_sequence_error() {
    let (_dir, mut n) = setup("nvmfseq", "0x1", json!({}));
    let mut h = Host::initialized(n.port, HostOpts::default());
    // A read, an identify, a property get and an in-capsule write, none connected.
    let c = h.read(NS4K, 0, 1, 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "read before Connect: {:?}", c.cqe);
    let c = h.identify(cns::CONTROLLER, 0, 0);
    assert_eq!(status(&c), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "identify before Connect");
    let c = h.cmd(
        {
            let mut raw = [0u8; 64];
            ferrite_nvmf::spec::fabrics::PropertyGetCommand { cid: 0, size: 1, ofst: 0 }.encode(&mut raw);
            raw
        },
        None,
        0,
    );
    assert_eq!(status(&c), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "property get before Connect");
    let c = h.write(NS512, 0, &pattern(1, 2048), 512);
    assert_eq!(status(&c), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "write before Connect");
    // A write that would need an R2T: no R2T, the error at once.
    let r2ts = h.r2ts;
    let c = h.write(NS4K, 0, &pattern(1, 65536), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR), "large write before Connect");
    assert_eq!(h.r2ts, r2ts, "no R2T for a command that cannot run");
    // The connection is still usable: Connect, enable, I/O.
    h.connect(SUBNQN, 0, CNTLID_DYNAMIC).ok("Connect after refused commands");
    h.enable();
    h.identify(cns::CONTROLLER, 0, 0).ok("identify after Connect");
    // An NVM Write on the admin queue is opcode 01h there (Create I/O Submission Queue),
    // which a fabrics controller does not have.
    let c = h.write(NS4K, 0, &pattern(1, 4096), 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::INVALID_OPCODE), "a write on the admin queue: {:?}", c.cqe);
    // I/O Connect before CC.EN: refused.
    let mut a = Host::initialized(n.port, HostOpts::default());
    a.connect(SUBNQN, 0, CNTLID_DYNAMIC).ok("admin Connect");
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c = q.connect(SUBNQN, 1, a.cntlid);
    assert!(!c.cqe.status.is_success(), "I/O Connect before the controller is enabled: {:?}", c.cqe);
    // Connect twice on one queue.
    let c = h.connect(SUBNQN, 0, CNTLID_DYNAMIC);
    assert!(!c.cqe.status.is_success(), "a second Connect on a connected queue: {:?}", c.cqe);
    still_serves(&mut n, 30);
}

#[test]
fn connects_that_must_fail() {
    let (_dir, mut n) = setup("nvmfconn", "0x1", json!({}));
    const CLOSED: &str = "nqn.2016-06.io.ferrite:closed";
    n.subsystem(CLOSED, false);
    n.add_ns(CLOSED, "M4K");
    n.listen(CLOSED);

    // An unknown subsystem: Connect Invalid Parameters pointing at SUBNQN in the data.
    let mut h = Host::initialized(n.port, HostOpts::default());
    let c = h.connect("nqn.2016-06.io.ferrite:nosuch", 0, CNTLID_DYNAMIC);
    assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS), "{:?}", c.cqe);
    let ip = InvalidParameter::from_dw0(c.cqe.dw0);
    assert_eq!((ip.iattr, ip.ipo), (1, ConnectData::OFFSET_SUBNQN as u16));

    // A host not allowed: Connect Invalid Host.
    let mut h = Host::initialized(n.port, HostOpts::default());
    h.hostnqn = "nqn.2016-06.io.ferrite:stranger".into();
    let c = h.connect(CLOSED, 0, CNTLID_DYNAMIC);
    assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_HOST), "{:?}", c.cqe);
    assert!(c.cqe.status.dnr);
    // Once added, it may.
    n.add_host(CLOSED, "nqn.2016-06.io.ferrite:stranger");
    let mut h = Host::initialized(n.port, HostOpts::default());
    h.hostnqn = "nqn.2016-06.io.ferrite:stranger".into();
    h.connect(CLOSED, 0, CNTLID_DYNAMIC).ok("Connect of an added host");
    h.enable();
    let cntlid = h.cntlid;
    // An I/O queue of that controller from another host NQN.
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c = q.connect(CLOSED, 1, cntlid);
    assert!(!c.cqe.status.is_success(), "I/O Connect under another host NQN: {:?}", c.cqe);
    // The same I/O queue twice, and a QID past max_qpairs_per_ctrlr.
    let mut admin = Host::admin(n.port, SUBNQN, HostOpts::default());
    let _q1 = Host::io(n.port, SUBNQN, admin.cntlid, 1, HostOpts::default(), 4096);
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c = q.connect(SUBNQN, 1, admin.cntlid);
    // Invalid Queue Identifier, as SPDK answers.
    let invalid_qid = (sct::COMMAND_SPECIFIC, ferrite_nvmf::spec::status::command_specific::INVALID_QUEUE_IDENTIFIER);
    assert_eq!(status(&c), invalid_qid, "QID 1 twice: {:?}", c.cqe);
    let c = q.connect(SUBNQN, 128, admin.cntlid);
    assert_eq!(status(&c), invalid_qid, "QID 128: {:?}", c.cqe);
    let _q2 = Host::io(n.port, SUBNQN, admin.cntlid, 127, HostOpts::default(), 4096);
    admin.keep_alive().ok("keep alive");
    // An I/O queue of a controller that does not exist.
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c = q.connect(SUBNQN, 1, 0x1234);
    assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS));
    let ip = InvalidParameter::from_dw0(c.cqe.dw0);
    assert_eq!((ip.iattr, ip.ipo), (1, ConnectData::OFFSET_CNTLID as u16));
    // An admin Connect with a static CNTLID.
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c = q.connect(SUBNQN, 0, 1);
    assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS));
    // SQSIZE 0, and more entries than the transport's queues have.
    for sqsize in [0u16, 128, 0xffff] {
        let mut q = Host::initialized(n.port, HostOpts { sqsize, ..Default::default() });
        let c = q.connect(SUBNQN, 0, CNTLID_DYNAMIC);
        assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS), "SQSIZE {sqsize}");
        let ip = InvalidParameter::from_dw0(c.cqe.dw0);
        assert_eq!((ip.iattr, ip.ipo), (0, 44), "SQSIZE {sqsize} is the field at fault");
    }
    // NQNs without their NUL, and a Connect whose data is short.
    let mut q = Host::initialized(n.port, HostOpts::default());
    let (raw, mut data) = q.connect_capsule(SUBNQN, 0, CNTLID_DYNAMIC);
    data[256..512].fill(b'a');
    let c = q.cmd(raw, Some(&data), 0);
    assert_eq!(status(&c), (sct::COMMAND_SPECIFIC, fsc::CONNECT_INVALID_PARAMETERS));
    let c = q.cmd(raw, Some(&data[..512]), 0);
    assert!(!c.cqe.status.is_success(), "Connect with 512 bytes of data: {:?}", c.cqe);
    // Connect data sent after an R2T instead of in the capsule works too.
    let mut q = Host::initialized(n.port, HostOpts::default());
    q.icd_limit = 0;
    let c = q.connect(SUBNQN, 0, CNTLID_DYNAMIC);
    assert!(c.cqe.status.is_success(), "Connect with its data by R2T: {:?}", c.cqe);
    assert_eq!(q.r2ts, 1);
    still_serves(&mut n, 40);
}

/// The common header of a PDU: type, flags, HLEN, PDO, PLEN.
fn ch(t: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut b = vec![t, flags, hlen, pdo];
    b.extend_from_slice(&plen.to_le_bytes());
    b
}

/// Expects a C2HTermReq with `fes` and then the close.
fn expect_term_req(h: &mut Host, fes: Fes, what: &str) {
    let got = h.expect_closed(CLOSE, what);
    let term = got.iter().find_map(|r| if let Pdu::C2hTermReq(t) = r.pdu { Some(t) } else { None });
    let t = term.unwrap_or_else(|| panic!("{what}: no C2HTermReq before the close; got {got:?}"));
    assert_eq!(t.fes, fes.to_u16(), "{what}: FES {:#x}", t.fes);
}

#[test]
fn malformed_pdus_end_the_connection_with_a_termination_request() {
    let (_dir, mut n) = setup("nvmfpdu", "0x3", json!({}));
    // PLEN 4 GiB - 1 on a command capsule, before and after the IC exchange.
    let mut h = Host::new(n.port, HostOpts::default());
    let mut b = ch(0x04, 0, 72, 0, u32::MAX);
    b.resize(72, 0);
    h.send_raw(&b);
    let got = h.expect_closed(CLOSE, "capsule before ICReq");
    assert!(got.iter().all(|r| matches!(r.pdu, Pdu::C2hTermReq(_))), "{got:?}");
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let mut b = ch(0x04, 0, 72, 72, u32::MAX);
    let mut sqe = Host::rw_sqe(nvm::WRITE, NS4K, 0, 1);
    sqe[24..40].copy_from_slice(&ferrite_nvmf::spec::sgl::SglDescriptor::in_capsule(0, u32::MAX - 72).to_bytes());
    b.extend_from_slice(&sqe);
    s.io[0].send_raw(&b);
    s.io[0].send_raw(&[0xab; 4096]);
    expect_term_req(&mut s.io[0], Fes::DataTransferLimitExceeded, "capsule with PLEN 4 GiB");
    // An ICReq with PLEN 4 GiB.
    let mut h = Host::new(n.port, HostOpts::default());
    let mut b = ch(0x00, 0, 128, 0, 0xffff_ffff);
    b.resize(128, 0);
    h.send_raw(&b);
    let got = h.expect_closed(CLOSE, "ICReq with PLEN 4 GiB");
    assert!(!got.is_empty(), "a termination request for a bad ICReq");
    n.assert_alive();

    // Unknown PDU types, each on a fresh initialized connection (0x08 is reserved, 0x0a+
    // belong to later revisions, 0xff is nothing).
    for t in [0x08u8, 0x0a, 0x0e, 0x7f, 0xff] {
        let mut h = Host::initialized(n.port, HostOpts::default());
        let mut b = ch(t, 0, 24, 0, 24);
        b.resize(24, 0);
        h.send_raw(&b);
        expect_term_req(&mut h, Fes::InvalidHeaderField, &format!("PDU type {t:#04x}"));
    }
    // A C2H type sent by a host.
    let mut h = Host::initialized(n.port, HostOpts::default());
    let mut b = ch(0x05, 0, 24, 0, 24);
    b.resize(24, 0);
    h.send_raw(&b);
    let got = h.expect_closed(CLOSE, "CapsuleResp from a host");
    assert!(got.iter().any(|r| matches!(r.pdu, Pdu::C2hTermReq(_))), "{got:?}");

    // A wrong header digest with digests on: C2HTermReq (Header Digest Error), then close.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::digests(), 4096);
    let mut b = s.io[0]
        .frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: Host::rw_sqe(nvm::READ, NS4K, 0, 1) }), &[]);
    b[72] ^= 0x55;
    s.io[0].send_raw(&b);
    expect_term_req(&mut s.io[0], Fes::HeaderDigestError, "wrong header digest");
    // Its admin queue is unaffected.
    s.admin.keep_alive().ok("the admin queue lives on");
    // A header digest on a connection that did not negotiate one.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let p = ferrite_nvmf::tcp::Negotiated { header_digest: true, ..s.io[0].params };
    let b =
        frame(&p, &Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: Host::rw_sqe(nvm::READ, NS4K, 0, 1) }), &[]);
    s.io[0].send_raw(&b);
    expect_term_req(&mut s.io[0], Fes::InvalidHeaderField, "header digest not negotiated");
    // A second ICReq.
    let mut h = Host::initialized(n.port, HostOpts::default());
    let req = h.icreq;
    h.send_pdu(&Pdu::IcReq(req), &[]);
    expect_term_req(&mut h, Fes::PduSequenceError, "a second ICReq");
    // An H2CTermReq: the target closes.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let mut buf = [0u8; 256];
    let k = ferrite_nvmf::tcp::encode_term_req(
        &mut buf,
        ferrite_nvmf::tcp::Role::Host,
        Fes::InvalidHeaderField,
        0,
        &[1, 2, 3],
    )
    .unwrap();
    s.io[0].send_raw(&buf[..k]);
    assert!(s.io[0].closed_within(CLOSE), "the target closes after an H2CTermReq");
    // Half a header, then the host goes away.
    let mut h = Host::initialized(n.port, HostOpts::default());
    h.send_raw(&ch(0x04, 0, 72, 0, 72)[..6]);
    drop(h);
    still_serves(&mut n, 50);
    // An in-capsule write larger than the I/O queue's in-capsule size.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    s.io[0].write(NS4K, 0, &pattern(1, 4096), 4096).ok("a first command");
    s.io[0].icd_limit = 8192;
    s.io[0].submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 2), Some(&pattern(2, 8192)), 0);
    let got = s.io[0].expect_closed(CLOSE, "8 KiB in capsule on an I/O queue taking 4 KiB");
    assert!(got.iter().any(|r| matches!(r.pdu, Pdu::C2hTermReq(_))), "{got:?}");
    still_serves(&mut n, 60);
}

#[test]
fn h2c_data_outside_an_r2t_closes_the_connection() {
    let (_dir, mut n) = setup("nvmfh2c", "0x3", json!({}));
    let data = pattern(5, 16384);
    // Each case: a 16 KiB write, its R2T, then a bad H2CData.
    type Bad = fn(u16, u16) -> H2cData;
    let cases: [(&str, Bad); 6] = [
        ("DATAO past the R2T's start", |cid, ttag| H2cData { cccid: cid, ttag, datao: 8192, datal: 4096, last: false }),
        ("DATAL past the command's end", |cid, ttag| H2cData { cccid: cid, ttag, datao: 0, datal: 20480, last: true }),
        ("a TTAG never issued", |cid, _| H2cData { cccid: cid, ttag: 999, datao: 0, datal: 4096, last: false }),
        ("the TTAG of another slot", |cid, ttag| H2cData {
            cccid: cid,
            ttag: ttag.wrapping_add(1),
            datao: 0,
            datal: 4096,
            last: false,
        }),
        ("another command's CCCID", |cid, ttag| H2cData {
            cccid: cid.wrapping_add(7),
            ttag,
            datao: 0,
            datal: 4096,
            last: false,
        }),
        ("DATAO 4 GiB - 4096", |cid, ttag| H2cData {
            cccid: cid,
            ttag,
            datao: u32::MAX - 4095,
            datal: 4096,
            last: true,
        }),
    ];
    for (what, bad) in cases {
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        let q = &mut s.io[0];
        let cid = q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 4), Some(&data), 0);
        let r = q.recv().unwrap_or_else(|e| panic!("{what}: no R2T: {e:?}"));
        let Pdu::R2t(t) = r.pdu else { panic!("{what}: expected R2T, got {:?}", r.pdu) };
        assert_eq!((t.cccid, t.r2to, t.r2tl), (cid, 0, 16384), "{what}: the R2T asks for everything");
        let h = bad(cid, t.ttag);
        let chunk = vec![0x5a; h.datal as usize];
        if !q.try_send_raw(&q.frame(&Pdu::H2cData(h), &[&chunk])) {
            // Closed while sending: fine.
        }
        let got = q.expect_closed(CLOSE, what);
        println!("{what}: closed after {:?}", got.iter().map(|r| r.pdu.pdu_type()).collect::<Vec<_>>());
        // Told why, as the transport spec asks (FES 01h or 04h), before the close.
        assert!(
            got.iter().any(|r| matches!(r.pdu, Pdu::C2hTermReq(_))),
            "{what}: closed without a C2HTermReq ({:?})",
            got.iter().map(|r| r.pdu.pdu_type()).collect::<Vec<_>>()
        );
        // The admin queue of that controller lives on.
        s.admin.keep_alive().ok("admin queue after its I/O queue was closed");
    }
    // H2CData when no R2T was ever sent.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    let b = q.frame(&Pdu::H2cData(H2cData { cccid: 1, ttag: 0, datao: 0, datal: 4096, last: true }), &[&[0u8; 4096]]);
    let _ = q.try_send_raw(&b);
    q.expect_closed(CLOSE, "H2CData without an R2T");
    // H2CData aimed at a read in flight: the C2HTermReq is the last PDU the host gets, whenever
    // the read completes (its data and response, if they come, come before it). Raced a few
    // times: the read completes around the time the TermReq is sent.
    for round in 0..12 {
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        let q = &mut s.io[0];
        let cid = q.submit(Host::rw_sqe(nvm::READ, NS4K, 0, 32), None, 128 << 10);
        let b =
            q.frame(&Pdu::H2cData(H2cData { cccid: cid, ttag: 0, datao: 0, datal: 4096, last: true }), &[&[0u8; 4096]]);
        let _ = q.try_send_raw(&b);
        let got = q.expect_closed(CLOSE, "H2CData for a read");
        let kinds: Vec<_> = got.iter().map(|r| r.pdu.pdu_type()).collect();
        assert!(
            matches!(got.last().map(|r| &r.pdu), Some(Pdu::C2hTermReq(_))),
            "round {round}: the C2HTermReq is not the last PDU before the close: {kinds:?}"
        );
    }
    // The data written so far never reached the namespace: the good host's data is intact.
    still_serves(&mut n, 70);
}

/// LAST_PDU is set on the H2CData PDU that ends the R2T's range and on no other: complete data
/// without it, or LAST_PDU on a PDU that leaves data missing, is an Invalid PDU Header Field
/// at FLAGS (FES 01h, FEI 1) and closes the connection at once (not after the data timeout);
/// the same data split over two PDUs with LAST_PDU on the second is written.
#[test]
fn h2c_data_last_pdu_must_mark_the_end_of_the_transfer() {
    let (_dir, mut n) = setup("nvmflastpdu", "0x1", json!({}));
    let data = pattern(6, 16384);
    // (DATAO, DATAL, LAST_PDU) of each H2CData PDU.
    type Pdus = &'static [(u32, u32, bool)];
    let cases: [(&str, Pdus); 2] =
        [("all the data without LAST_PDU", &[(0, 16384, false)]), ("LAST_PDU half-way", &[(0, 8192, true)])];
    for (what, pdus) in cases {
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        let q = &mut s.io[0];
        let cid = q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 4), Some(&data), 0);
        let Pdu::R2t(t) = q.recv().unwrap_or_else(|e| panic!("{what}: no R2T: {e:?}")).pdu else {
            panic!("{what}: expected an R2T")
        };
        for &(datao, datal, last) in pdus {
            let h = H2cData { cccid: cid, ttag: t.ttag, datao, datal, last };
            let _ = q.try_send_raw(&q.frame(&Pdu::H2cData(h), &[&data[datao as usize..(datao + datal) as usize]]));
        }
        let start = Instant::now();
        let got = q.expect_closed(CLOSE, what);
        let term = got.iter().find_map(|r| if let Pdu::C2hTermReq(t) = r.pdu { Some(t) } else { None });
        let term = term.unwrap_or_else(|| panic!("{what}: no C2HTermReq before the close; got {got:?}"));
        assert_eq!((term.fes, term.fei), (Fes::InvalidHeaderField.to_u16(), 1), "{what}: FES/FEI");
        assert!(!got.iter().any(|r| matches!(r.pdu, Pdu::CapsuleResp(_))), "{what}: the write completed: {got:?}");
        println!("{what}: C2HTermReq after {:?}", start.elapsed());
        s.admin.keep_alive().ok("admin queue after its I/O queue was closed");
    }
    // Two PDUs, LAST_PDU on the second only: written.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    let raw = Host::with_transport_sgl(Host::rw_sqe(nvm::WRITE, NS4K, 8, 4), 0x56, 16384);
    q.send_capsule(&raw, &[]);
    let Pdu::R2t(t) = q.recv().expect("R2T").pdu else { panic!("expected an R2T") };
    for (datao, last) in [(0u32, false), (8192, true)] {
        let h = H2cData { cccid: 0x56, ttag: t.ttag, datao, datal: 8192, last };
        q.send_pdu(&Pdu::H2cData(h), &[&data[datao as usize..datao as usize + 8192]]);
    }
    q.wait(0x56).ok("write in two H2CData PDUs");
    assert_eq!(q.read(NS4K, 8, 4, 4096).ok("read back").data, data);
    still_serves(&mut n, 75);
}

#[test]
fn wrong_data_digest_fails_the_command_and_keeps_the_connection() {
    let (_dir, mut n) = setup("nvmfddgst", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::digests(), 4096);
    let q = &mut s.io[0];
    let old = pattern(1, 65536);
    q.write(NS4K, 0, &old, 4096).ok("write");
    // In capsule, the digest flipped.
    let new = pattern(2, 4096);
    let mut raw = Host::rw_sqe(nvm::WRITE, NS4K, 0, 1);
    raw[2..4].copy_from_slice(&0x4321u16.to_le_bytes());
    raw[1] |= 0x40;
    raw[24..40].copy_from_slice(&ferrite_nvmf::spec::sgl::SglDescriptor::in_capsule(0, 4096).to_bytes());
    let (mut b, at) =
        frame_with_digest_at(&q.params, &Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[&new]);
    b[at.expect("a data digest")] ^= 0xff;
    q.send_raw(&b);
    let r = q.recv().expect("a response");
    let Pdu::CapsuleResp(resp) = r.pdu else { panic!("expected a response, got {:?}", r.pdu) };
    let cqe = ferrite_nvmf::spec::cqe::Cqe::decode(&resp.cqe);
    assert_eq!(cqe.cid, 0x4321);
    assert_eq!(
        st(cqe.status),
        (sct::GENERIC, generic::TRANSIENT_TRANSPORT_ERROR),
        "in-capsule data digest error: {cqe:?}"
    );
    // By R2T, the second H2CData's digest flipped.
    let cid = q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 16), Some(&pattern(3, 65536)), 0);
    let r = q.recv().expect("R2T");
    let Pdu::R2t(t) = r.pdu else { panic!("expected R2T, got {:?}", r.pdu) };
    let all = pattern(3, 65536);
    for (i, part) in all.chunks(16384).enumerate() {
        let h = H2cData { cccid: cid, ttag: t.ttag, datao: (i * 16384) as u32, datal: 16384, last: i == 3 };
        let (mut b, at) = frame_with_digest_at(&q.params, &Pdu::H2cData(h), &[part]);
        if i == 1 {
            b[at.unwrap()] ^= 1;
        }
        q.send_raw(&b);
    }
    let c = q.wait(cid);
    assert_eq!(status(&c), (sct::GENERIC, generic::TRANSIENT_TRANSPORT_ERROR), "H2CData digest error: {:?}", c.cqe);
    // The connection goes on; the failed writes changed nothing.
    assert!(
        q.read(NS4K, 0, 16, 4096).ok("read after digest errors").data == old,
        "a write with a bad digest was applied"
    );
    q.write(NS4K, 0, &new, 4096).ok("a good write on the same connection");
    assert_eq!(q.read(NS4K, 0, 1, 4096).ok("read").data, new);
    still_serves(&mut n, 80);
}

#[test]
fn lba_ranges_past_the_end_fail_with_lba_out_of_range() {
    let (_dir, mut n) = setup("nvmflba", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    let oor = (sct::GENERIC, generic::LBA_OUT_OF_RANGE);
    assert_eq!(status(&q.read(NS4K, NS4K_BLOCKS, 1, 4096)), oor, "read at NSZE");
    assert_eq!(status(&q.read(NS4K, NS4K_BLOCKS - 1, 2, 4096)), oor, "read across the end");
    assert_eq!(status(&q.read(NS512, u64::MAX, 1, 512)), oor, "read at LBA 2^64 - 1");
    assert_eq!(status(&q.read(NS512, u64::MAX - 1, 8, 512)), oor, "read wrapping past 2^64");
    assert_eq!(status(&q.write(NS4K, NS4K_BLOCKS - 1, &pattern(1, 8192), 4096)), oor, "write across the end");
    assert_eq!(status(&q.write(NS512, u64::MAX, &pattern(1, 512), 512)), oor, "write at 2^64 - 1");
    assert_eq!(status(&q.write(NS4K, NS4K_BLOCKS, &pattern(1, 65536), 4096)), oor, "R2T write past the end");
    assert_eq!(status(&q.write_zeroes(NS4K, NS4K_BLOCKS - 2, 3)), oor, "write zeroes across the end");
    assert_eq!(status(&q.compare(NS4K, NS4K_BLOCKS, &pattern(1, 4096), 4096)), oor, "compare past the end");
    let c = q.deallocate(NS4K, &[(NS4K_BLOCKS - 1, 2)]);
    assert_eq!(status(&c), oor, "deallocate across the end");
    let c = q.deallocate(NS4K, &[(u64::MAX, 1)]);
    assert_eq!(status(&c), oor, "deallocate at 2^64 - 1");
    // The last block itself is fine.
    q.write(NS4K, NS4K_BLOCKS - 1, &pattern(2, 4096), 4096).ok("write of the last block");
    // Data length and NLB that disagree, an unknown namespace, an unknown opcode.
    let c = q.cmd(Host::rw_sqe(nvm::READ, NS4K, 0, 2), None, 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::DATA_SGL_LENGTH_INVALID), "NLB 2 with 4096 bytes");
    assert_eq!(status(&q.read(77, 0, 1, 4096)), (sct::GENERIC, generic::INVALID_NAMESPACE_OR_FORMAT));
    assert_eq!(status(&q.read(0xffff_ffff, 0, 1, 4096)), (sct::GENERIC, generic::INVALID_NAMESPACE_OR_FORMAT));
    let c = q.cmd(Host::sqe(0x7e, NS4K, |_| {}), None, 0);
    assert_eq!(status(&c), (sct::GENERIC, generic::INVALID_OPCODE));
    // A read larger than MDTS.
    let c = q.read(NS4K, 0, 64, 4096);
    assert_eq!(status(&c), (sct::GENERIC, generic::DATA_SGL_LENGTH_INVALID), "a read past max_io_size: {:?}", c.cqe);
    still_serves(&mut n, 90);
}

#[test]
fn more_commands_than_the_queue_holds() {
    let (_dir, mut n) = setup("nvmfsq", "0x1", json!({}));
    // SQSIZE 3: four entries. Writes whose R2T the host never answers stay outstanding.
    let admin = Host::admin(n.port, SUBNQN, HostOpts::default());
    let mut q = Host::io(n.port, SUBNQN, admin.cntlid, 1, HostOpts { sqsize: 3, ..Default::default() }, 4096);
    for i in 0..4 {
        let raw = Host::with_transport_sgl(Host::rw_sqe(nvm::WRITE, NS4K, 4 * i, 4), 100 + i as u16, 16384);
        q.send_capsule(&raw, &[]);
        let r = q.recv().unwrap_or_else(|e| panic!("R2T {i}: {e:?}"));
        assert!(matches!(r.pdu, Pdu::R2t(_)), "R2T {i}: {:?}", r.pdu);
    }
    // A fifth breaks SQ flow control: a C2HTermReq (PDU Sequence Error), then the close.
    let _ = q.try_send_raw(
        &q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: Host::rw_sqe(nvm::READ, NS4K, 0, 1) }), &[]),
    );
    expect_term_req(&mut q, Fes::PduSequenceError, "a fifth command on a 4-entry queue");
    drop(q);
    drop(admin);
    still_serves(&mut n, 100);
}

#[test]
fn hosts_that_vanish_mid_command() {
    let (_dir, mut n) = setup("nvmfvanish", "0x3", json!({"max_io_size": 1 << 20}));
    for round in 0..3 {
        // A write capsule asking for 1 MiB, the R2T read, then the host goes.
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        let q = &mut s.io[0];
        q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 256), Some(&pattern(1, 1 << 20)), 0);
        let r = q.recv().expect("R2T");
        assert!(matches!(r.pdu, Pdu::R2t(_)), "{:?}", r.pdu);
        drop(s);
        // The same, having sent half the data.
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::digests(), 4096);
        let q = &mut s.io[0];
        let cid = q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 256), Some(&pattern(1, 1 << 20)), 0);
        let r = q.recv().expect("R2T");
        let Pdu::R2t(t) = r.pdu else { panic!("{:?}", r.pdu) };
        let h = H2cData { cccid: cid, ttag: t.ttag, datao: 0, datal: 131072, last: false };
        let b = q.frame(&Pdu::H2cData(h), &[&pattern(2, 131072)]);
        q.send_raw(&b[..b.len() / 2]);
        drop(s);
        // A write capsule whose in-capsule data never comes.
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        let q = &mut s.io[0];
        let mut raw = Host::rw_sqe(nvm::WRITE, NS4K, 0, 1);
        raw[1] |= 0x40;
        raw[24..40].copy_from_slice(&ferrite_nvmf::spec::sgl::SglDescriptor::in_capsule(0, 4096).to_bytes());
        let b = q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[&[7u8; 4096]]);
        q.send_raw(&b[..72 + 100]);
        drop(s);
        n.assert_alive();
        println!("round {round} ok");
    }
    still_serves(&mut n, 110);
}

#[test]
fn hosts_that_vanish_with_io_in_flight() {
    // Reads and writes still running in the bdev when their host disconnects: a delay bdev
    // (20 ms) holds them.
    let (_dir, mut n) = setup("nvmfinflight", "0x3", json!({"max_io_size": 1 << 20}));
    n.malloc("MD", 1024, 4096);
    n.d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "MD", "name": "D0", "avg_read_latency": 20000, "p99_read_latency": 20000,
            "avg_write_latency": 20000, "p99_write_latency": 20000})),
    );
    const DNQN: &str = "nqn.2016-06.io.ferrite:delayed";
    n.subsystem(DNQN, true);
    let nsid = n.add_ns(DNQN, "D0");
    n.listen(DNQN);
    for round in 0..10 {
        let mut s = Session::open(n.port, DNQN, 2, HostOpts::default(), 4096);
        // Sanity: the delayed namespace works.
        if round == 0 {
            let d = pattern(4, 4096);
            s.io[0].write(nsid, 1, &d, 4096).ok("write through the delay bdev");
            assert_eq!(s.io[0].read(nsid, 1, 1, 4096).ok("read").data, d);
        }
        for q in s.io.iter_mut() {
            for k in 0..8u64 {
                q.submit(Host::rw_sqe(nvm::READ, nsid, k, 1), None, 4096);
                q.submit(Host::rw_sqe(nvm::WRITE, nsid, 100 + k, 1), Some(&[k as u8; 4096]), 0);
            }
        }
        // Gone before any of them completes: the admin queue first in odd rounds.
        if round % 2 == 1 {
            drop(s.admin);
            std::thread::sleep(Duration::from_millis(2));
            drop(s.io);
        } else {
            drop(s);
        }
        std::thread::sleep(Duration::from_millis(60));
        n.assert_alive();
    }
    // A host that closes right after a read on the plain malloc namespace (completed on the
    // next poll), many times.
    for _ in 0..50 {
        let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
        s.io[0].submit(Host::rw_sqe(nvm::READ, NS4K, 0, 1), None, 4096);
        s.io[0].submit(Host::rw_sqe(nvm::WRITE, NS4K, 1, 1), Some(&[1u8; 4096]), 0);
        let _ = s.io[0].s.shutdown(std::net::Shutdown::Both);
    }
    std::thread::sleep(Duration::from_millis(200));
    still_serves(&mut n, 120);
}

/// The target closing connections itself while their I/O runs: removing the host, deleting
/// the subsystem.
#[test]
fn the_target_closes_connections_with_io_in_flight() {
    let (_dir, mut n) = setup("nvmftgtclose", "0x3", json!({}));
    n.malloc("MD", 1024, 4096);
    n.d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "MD", "name": "D0", "avg_read_latency": 50000, "p99_read_latency": 50000,
            "avg_write_latency": 50000, "p99_write_latency": 50000})),
    );
    const DNQN: &str = "nqn.2016-06.io.ferrite:delayed";
    n.subsystem(DNQN, false);
    n.add_host(DNQN, HOSTNQN);
    let nsid = n.add_ns(DNQN, "D0");
    n.listen(DNQN);
    let mut s = Session::open(n.port, DNQN, 1, HostOpts::default(), 4096);
    for k in 0..8u64 {
        s.io[0].submit(Host::rw_sqe(nvm::READ, nsid, k, 1), None, 4096);
    }
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(n.d.call("nvmf_subsystem_remove_host", Some(json!({"nqn": DNQN, "host": HOSTNQN}))), json!(true));
    std::thread::sleep(Duration::from_millis(200));
    n.assert_alive();
    n.add_host(DNQN, HOSTNQN);
    let mut s = Session::open(n.port, DNQN, 1, HostOpts::default(), 4096);
    for k in 0..8u64 {
        s.io[0].submit(Host::rw_sqe(nvm::WRITE, nsid, k, 1), Some(&[3u8; 4096]), 0);
    }
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(n.d.call("nvmf_delete_subsystem", Some(json!({"nqn": DNQN}))), json!(true));
    std::thread::sleep(Duration::from_millis(200));
    still_serves(&mut n, 125);
}

#[test]
fn a_thousand_silent_connections() {
    let limit = raise_nofile();
    if limit < 2500 {
        println!("SKIP a_thousand_silent_connections: open file limit {limit}");
        return;
    }
    let (_dir, mut n) = setup("nvmf1k", "0x3", json!({}));
    let t0 = Instant::now();
    let mut silent: Vec<std::net::TcpStream> = (0..1000).map(|_| Host::tcp(n.port)).collect();
    // Some say ICReq and then nothing more.
    let mut half: Vec<Host> = (0..20).map(|_| Host::initialized(n.port, HostOpts::default())).collect();
    println!("1,020 connections in {:?}", t0.elapsed());
    // The daemon serves others meanwhile.
    let t = Instant::now();
    still_serves(&mut n, 130);
    println!("a good host ran in {:?} beside them", t.elapsed());
    // Within the Connect timeout (10 s) plus the watchdog's period, they are closed.
    let deadline = t0 + Duration::from_secs(16);
    let left = deadline.saturating_duration_since(Instant::now());
    let mut one = silent.pop().unwrap();
    assert!(closed_within(&mut one, left), "a connection that never sent Connect is still open after 16 s");
    println!("a silent connection was closed after {:?}", t0.elapsed());
    let left = (t0 + Duration::from_secs(18)).saturating_duration_since(Instant::now());
    assert!(half[0].closed_within(left.max(Duration::from_secs(1))), "a connection that sent only ICReq is still open");
    // All of them.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut open = 0;
    for s in silent.iter_mut().step_by(50) {
        if !closed_within(s, deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10))) {
            open += 1;
        }
    }
    assert_eq!(open, 0, "{open} of 20 sampled silent connections are still open");
    drop(half);
    drop(silent);
    still_serves(&mut n, 140);
}

#[test]
fn a_host_that_never_reads_does_not_grow_the_daemon_without_bound() {
    let (_dir, mut n) = setup("nvmfnoread", "0x1", json!({}));
    n.null("N0", 1 << 20, 4096);
    const NNQN: &str = "nqn.2016-06.io.ferrite:null";
    n.subsystem(NNQN, true);
    let nsid = n.add_ns(NNQN, "N0");
    n.listen(NNQN);
    // Warm up: one good host, so the baseline includes what any connection costs once.
    assert_good_host(n.port, SUBNQN, NS4K, 4096, 1);
    std::thread::sleep(Duration::from_millis(200));
    let rss0 = n.rss_kib();
    // 128 KiB reads, pipelined, never reading a byte of the answers, for 4 seconds (or until
    // the target stops taking commands): 20,000 of them would be 2.5 GiB of answers.
    let s = Session::open(n.port, NNQN, 1, HostOpts { sqsize: 127, ..Default::default() }, 4096);
    let Session { admin, io } = s;
    let mut q = io.into_iter().next().unwrap();
    q.s.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut sent = 0u32;
    let mut peak = rss0;
    let t = Instant::now();
    let mut stalled = false;
    while t.elapsed() < Duration::from_secs(4) && sent < 20000 {
        // Paced, so that the target has completed each batch before the next arrives (a
        // burst of more commands than the queue holds would only get the queue closed).
        std::thread::sleep(Duration::from_millis(5));
        let mut batch = Vec::new();
        for k in 0..16u64 {
            let raw = Host::with_transport_sgl(
                Host::rw_sqe(nvm::READ, nsid, (u64::from(sent) + k) % 1000 * 32, 32),
                ((sent as u64 + k) % 60000) as u16,
                131072,
            );
            batch.extend_from_slice(&q.frame(&Pdu::CapsuleCmd(ferrite_nvmf::tcp::CapsuleCmd { sqe: raw }), &[]));
        }
        match std::io::Write::write_all(&mut q.s, &batch) {
            Ok(()) => sent += 16,
            Err(_) => {
                stalled = true;
                break;
            }
        }
        peak = peak.max(n.rss_kib());
    }
    // Keep measuring a little while the target works off what it took.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(n.rss_kib());
    }
    let grown = peak.saturating_sub(rss0) / 1024;
    println!(
        "sent {sent} reads of 128 KiB ({} MiB asked) in {:?}; stalled: {stalled}; RSS {} MiB -> peak {} MiB (+{grown} MiB)",
        u64::from(sent) * 128 / 1024,
        t.elapsed(),
        rss0 / 1024,
        peak / 1024
    );
    let st = n.d.call("bdev_get_iostat", Some(json!({"name": "N0"})));
    let served = st["bdevs"][0]["num_read_ops"].as_u64().unwrap_or(0);
    println!("the target ran {served} of the {sent} reads before it stopped reading the host's commands");
    assert!(grown < 160, "the daemon grew by {grown} MiB for a host that reads nothing");
    // Other hosts are served while that one is stuck.
    still_serves(&mut n, 150);
    drop(q);
    drop(admin);
    still_serves(&mut n, 160);
}

/// A fused Compare (first) + Write (second) of 2 blocks at LBA 10 of the 4 KiB namespace.
fn fused(opcode: u8, fuse: u8) -> [u8; 64] {
    let mut raw = Host::rw_sqe(opcode, NS4K, 10, 2);
    raw[1] |= fuse;
    raw
}

#[test]
fn fused_compare_and_write() {
    let (_dir, mut n) = setup("nvmffused", "0x1", json!({"in_capsule_data_size": 8192}));
    // 8 KiB in capsule, so that each command's data comes with it.
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 8192);
    let q = &mut s.io[0];
    let old = pattern(1, 8192);
    let new = pattern(2, 8192);
    q.write(NS4K, 10, &old, 4096).ok("write");
    // Compare (first) + Write (second), the compare matching: the write lands.
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&old), 0);
    let b = q.submit(fused(nvm::WRITE, 2), Some(&new), 0);
    q.wait(a).ok("fused compare");
    q.wait(b).ok("fused write");
    assert!(q.read(NS4K, 10, 2, 4096).ok("read").data == new, "the fused write landed");
    // The compare failing: the write is aborted and the data stays.
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&old), 0);
    let b = q.submit(fused(nvm::WRITE, 2), Some(&pattern(3, 8192)), 0);
    let (ca, cb) = (q.wait(a), q.wait(b));
    assert_eq!(status(&ca), (sct::MEDIA_ERROR, media::COMPARE_FAILURE), "{:?}", ca.cqe);
    assert_eq!(status(&cb), (sct::GENERIC, generic::ABORTED_FAILED_FUSED), "{:?}", cb.cqe);
    assert!(q.read(NS4K, 10, 2, 4096).ok("read").data == new, "an aborted fused write changed the data");
    // A first without its second: aborted when the next command is not the second.
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&new), 0);
    q.read(NS4K, 0, 1, 4096).ok("a read after a lone fused first");
    assert_eq!(status(&q.wait(a)), (sct::GENERIC, generic::ABORTED_MISSING_FUSED));
    // A second without a first.
    let c = q.cmd(fused(nvm::WRITE, 2), Some(&new), 0);
    assert_eq!(status(&c), (sct::GENERIC, generic::ABORTED_MISSING_FUSED), "{:?}", c.cqe);
    // Both by R2T, the host sending the data in order.
    q.icd_limit = 4096;
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&new), 0);
    let b = q.submit(fused(nvm::WRITE, 2), Some(&old), 0);
    q.wait(a).ok("fused compare by R2T");
    q.wait(b).ok("fused write by R2T");
    assert!(q.read(NS4K, 10, 2, 4096).ok("read").data == old);
    still_serves(&mut n, 170);
}

/// Fused commands pair by their order in the submission queue (NVMe: the second immediately
/// follows the first), not by the order their data arrives, which R2T leaves to the host.
/// SPDK pairs them when the capsules arrive (`nvmf_tcp_check_fused_ordering`) and runs the
/// pair once both have their data.
#[test]
fn fused_commands_pair_by_submission_order_not_by_data_arrival() {
    let (_dir, mut n) = setup("nvmffusedr2t", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let q = &mut s.io[0];
    q.s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let old = pattern(1, 8192);
    let new = pattern(2, 8192);
    q.write(NS4K, 10, &old, 4096).ok("write");
    // Both need R2T; the host answers the second's R2T first (the protocol lets it).
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&old), 0);
    let b = q.submit(fused(nvm::WRITE, 2), Some(&new), 0);
    let mut r2ts = Vec::new();
    while r2ts.len() < 2 {
        let r = q.recv().unwrap_or_else(|e| panic!("R2Ts: {e:?}"));
        let Pdu::R2t(t) = r.pdu else { panic!("expected R2T, got {:?}", r.pdu) };
        r2ts.push(t);
    }
    for t in r2ts.iter().rev() {
        q.answer_r2t(t.cccid, t.ttag, t.r2to, t.r2tl);
    }
    let cb = q.try_wait(b);
    let ca = q.try_wait(a);
    assert!(
        matches!((&ca, &cb), (Ok(x), Ok(y)) if x.cqe.status.is_success() && y.cqe.status.is_success()),
        "fused pair whose second's data came first: compare {ca:?}, write {cb:?}"
    );
    // A lone first whose data comes by R2T, then a read: the read is not its second, so the
    // first is aborted (Missing Fused) rather than left waiting.
    let a = q.submit(fused(nvm::COMPARE, 1), Some(&new), 0);
    let r = q.read(NS4K, 0, 1, 4096);
    assert!(r.cqe.status.is_success());
    let ca = q.try_wait(a);
    assert!(
        matches!(&ca, Ok(c) if c.status() == (sct::GENERIC, generic::ABORTED_MISSING_FUSED)),
        "a lone fused first (data by R2T) followed by a read: {ca:?}"
    );
    still_serves(&mut n, 175);
}

/// Fabrics commands have no PSDT: byte 1 of a Fabrics command is reserved (NVMe-oF 1.1,
/// "Fabrics Command" figure), so 0 there is what the spec says to send (and what
/// `ConnectCommand::encode` writes). SPDK's target reads SGL1 without looking at byte 1.
/// PSDT other than 01b (SGLs) fails as Invalid Field with DNR on every queue and command kind,
/// Fabrics ones included (as Linux's nvmet answers; Linux's, SPDK's and Ferrite's hosts send
/// 01b everywhere), and the queue goes on serving.
#[test]
fn psdt_other_than_sgl_is_an_invalid_field() {
    let (_dir, mut n) = setup("nvmfpsdt", "0x1", json!({}));
    let invalid = (sct::GENERIC, generic::INVALID_FIELD);
    let with_psdt = |mut raw: [u8; 64], psdt: u8, cid: u16| {
        raw[1] = (raw[1] & 0x3f) | psdt << 6;
        raw[2..4].copy_from_slice(&cid.to_le_bytes());
        raw
    };
    // Connect (admin queue, before any controller exists).
    let mut h = Host::initialized(n.port, HostOpts::default());
    let (raw, data) = h.connect_capsule(SUBNQN, 0, CNTLID_DYNAMIC);
    assert_eq!(raw[1], 0x40, "the test host's Connect has PSDT 01b");
    for (k, psdt) in [0b00u8, 0b10, 0b11].into_iter().enumerate() {
        let cid = 9 + k as u16;
        h.send_capsule(&with_psdt(raw, psdt, cid), &data);
        let c = h.wait(cid);
        assert_eq!(status(&c), invalid, "Connect with PSDT {psdt:02b}: {:?}", c.cqe);
        assert!(c.cqe.status.dnr, "Connect with PSDT {psdt:02b}: DNR");
    }
    h.connect(SUBNQN, 0, CNTLID_DYNAMIC).ok("Connect with PSDT 01b after the refused ones");
    h.enable();
    // Property Get, an admin command, then an I/O command.
    let mut pg = [0u8; 64];
    ferrite_nvmf::spec::fabrics::PropertyGetCommand {
        cid: 0,
        size: ferrite_nvmf::spec::fabrics::PROPERTY_SIZE_4,
        ofst: registers::offset::CSTS,
    }
    .encode(&mut pg);
    let ka = Host::sqe(ferrite_nvmf::spec::opcode::admin::KEEP_ALIVE, 0, |_| {});
    for (what, raw) in [("Property Get", pg), ("Keep Alive", ka)] {
        for psdt in [0b00u8, 0b10, 0b11] {
            h.send_capsule(&with_psdt(raw, psdt, 40 + u16::from(psdt)), &[]);
            let c = h.wait(40 + u16::from(psdt));
            assert_eq!(status(&c), invalid, "{what} with PSDT {psdt:02b}: {:?}", c.cqe);
        }
    }
    h.keep_alive().ok("admin queue after the refused commands");
    let mut q = Host::io(n.port, SUBNQN, h.cntlid, 1, HostOpts::default(), 4096);
    let read = Host::with_transport_sgl(Host::rw_sqe(nvm::READ, NS4K, 0, 1), 0, 4096);
    for psdt in [0b00u8, 0b10, 0b11] {
        q.send_capsule(&with_psdt(read, psdt, 60 + u16::from(psdt)), &[]);
        let c = q.wait(60 + u16::from(psdt));
        assert_eq!(status(&c), invalid, "Read with PSDT {psdt:02b}: {:?}", c.cqe);
    }
    assert_eq!(q.read(NS4K, 0, 1, 4096).ok("Read with PSDT 01b").data.len(), 4096);
    still_serves(&mut n, 180);
}

/// The I/O queue's in-capsule data limit (in_capsule_data_size, IOCCSZ) holds from the first
/// command after Connect, as from every later one.
#[test]
fn the_in_capsule_limit_holds_from_the_first_io_command() {
    let (_dir, mut n) = setup("nvmficd", "0x1", json!({}));
    let admin = Host::admin(n.port, SUBNQN, HostOpts::default());
    let mut q = Host::io(n.port, SUBNQN, admin.cntlid, 1, HostOpts::default(), 8192);
    let cid = q.submit(Host::rw_sqe(nvm::WRITE, NS4K, 0, 2), Some(&pattern(2, 8192)), 0);
    match q.recv() {
        Ok(r) => match r.pdu {
            Pdu::C2hTermReq(t) => assert_eq!(t.fes, Fes::DataTransferLimitExceeded.to_u16()),
            Pdu::CapsuleResp(c) => {
                let cqe = ferrite_nvmf::spec::cqe::Cqe::decode(&c.cqe);
                assert!(
                    !cqe.status.is_success(),
                    "the first command on an I/O queue carried 8 KiB in capsule (in_capsule_data_size 4096) and ran \
                     (CID {cid}: {cqe:?}); the second such command gets a C2HTermReq"
                );
            }
            other => panic!("unexpected {other:?}"),
        },
        Err(RecvError::Closed) => {}
        Err(e) => panic!("{e:?}"),
    }
    drop(q);
    drop(admin);
    still_serves(&mut n, 190);
}

/// Disconnect deletes an I/O queue; on the admin queue it fails with Invalid Queue Type
/// (NVMe-oF 1.1 Disconnect command; `spec::fabrics::DisconnectCommand` says so too).
#[test]
fn disconnect_on_the_admin_queue_is_an_invalid_queue_type() {
    let (_dir, mut n) = setup("nvmfdisc", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let mut raw = [0u8; 64];
    ferrite_nvmf::spec::fabrics::DisconnectCommand { cid: 0, recfmt: 0 }.encode(&mut raw);
    // On an I/O queue: success, then the queue is gone.
    s.io[0].cmd(raw, None, 0).ok("Disconnect on an I/O queue");
    assert!(s.io[0].closed_within(CLOSE), "the I/O queue closes after Disconnect");
    s.admin.keep_alive().ok("the controller lives on");
    let c = s.admin.cmd(raw, None, 0);
    assert_eq!(
        status(&c),
        (sct::COMMAND_SPECIFIC, fsc::INVALID_QUEUE_TYPE),
        "Disconnect on the admin queue: {:?}",
        c.cqe
    );
    still_serves(&mut n, 200);
}

/// SPDK refuses I/O queues of a controller enabled with IOSQES other than 6 (64-byte SQEs) or
/// IOCQES other than 4 (16-byte CQEs), the only sizes over fabrics.
#[test]
fn io_queues_need_64_byte_sqes_and_16_byte_cqes() {
    let (_dir, mut n) = setup("nvmfsqes", "0x1", json!({}));
    let mut a = Host::initialized(n.port, HostOpts::default());
    a.connect(SUBNQN, 0, CNTLID_DYNAMIC).ok("admin Connect");
    let cc = registers::Cc { en: true, iosqes: 0, iocqes: 0, ..Default::default() };
    let c = a.prop_set(registers::offset::CC, u64::from(cc.to_u32()));
    let mut q = Host::initialized(n.port, HostOpts::default());
    let c2 = q.connect(SUBNQN, 1, a.cntlid);
    assert!(
        !c.cqe.status.is_success() || !c2.cqe.status.is_success(),
        "CC.EN with IOSQES 0 and IOCQES 0 accepted, and an I/O queue connected to it: {:?} / {:?}",
        c.cqe,
        c2.cqe
    );
    still_serves(&mut n, 210);
}

/// A connection that broke the protocol is closed, even when its host does not read what it
/// asked for (the C2HTermReq cannot go out then; the target must not wait for it forever).
#[test]
fn a_protocol_error_closes_the_connection_of_a_host_that_does_not_read() {
    let (_dir, mut n) = setup("nvmfdeadsend", "0x1", json!({"max_io_size": 1 << 20}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    // 16 MiB of reads the host does not read: more than the sockets buffer.
    for k in 0..16u64 {
        s.io[0].submit(Host::rw_sqe(nvm::READ, NS4K, k * 128, 256), None, 1 << 20);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(n.qpairs(SUBNQN).len(), 2);
    // An unknown PDU type.
    let mut b = vec![0x0eu8, 0, 24, 0, 24, 0, 0, 0];
    b.resize(24, 0);
    s.io[0].send_raw(&b);
    // Either the reader sees the bad PDU at once, or it had paused (back-pressure: more than
    // 8 MiB unsent) and does not read it; then the send watchdog closes the connection when the
    // batch has not gone out within 30 s + 1 s/MiB.
    let t = Instant::now();
    while n.qpairs(SUBNQN).len() == 2 {
        assert!(
            t.elapsed() < Duration::from_secs(50),
            "the I/O queue that sent an unknown PDU type is still there after 50 s ({:?})",
            n.qpairs(SUBNQN)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("closed {:?} after the protocol error", t.elapsed());
    still_serves(&mut n, 220);
}

/// Abort: a read held by a delay bdev (1.5 s) on an I/O queue of another reactor is aborted
/// from the admin queue at once (the Abort answers "aborted", the read Aborted By Request);
/// aborts of a command that is not outstanding, of a queue that does not exist and of an
/// admin command that is not an AER answer "not aborted"; data written before reads back.
#[test]
fn abort_of_an_io_command_held_by_the_bdev() {
    use ferrite_nvmf::spec::opcode::admin::ABORT;
    let (_dir, mut n) = setup("nvmfabort", "0x3", json!({}));
    n.malloc("MA", 1024, 4096);
    n.d.call(
        "bdev_delay_create",
        Some(
            json!({"base_bdev_name": "MA", "name": "DA", "avg_read_latency": 1_500_000, "p99_read_latency": 1_500_000,
            "avg_write_latency": 10, "p99_write_latency": 10}),
        ),
    );
    const ANQN: &str = "nqn.2016-06.io.ferrite:abort";
    n.subsystem(ANQN, true);
    let nsid = n.add_ns(ANQN, "DA");
    n.listen(ANQN);
    let mut s = Session::open(n.port, ANQN, 2, HostOpts::default(), 4096);
    let data = pattern(31, 8192);
    s.io[1].write(nsid, 4, &data, 4096).ok("write through the delay bdev");
    let abort = |sqid: u16, cid: u16| Host::sqe(ABORT, 0, |q| q.cdw10 = u32::from(sqid) | u32::from(cid) << 16);

    let t0 = Instant::now();
    let read = s.io[1].submit(Host::rw_sqe(nvm::READ, nsid, 4, 2), None, 8192);
    std::thread::sleep(Duration::from_millis(50));
    let a = s.admin.cmd(abort(2, read), None, 0).ok("Abort");
    assert_eq!(a.cqe.dw0 & 1, 0, "the held read is aborted: {:?}", a.cqe);
    let r = s.io[1].wait(read);
    assert_eq!(status(&r), (sct::GENERIC, generic::ABORTED_BY_REQUEST), "the aborted read: {:?}", r.cqe);
    assert!(t0.elapsed() < Duration::from_millis(1200), "aborted before the delay ran out: {:?}", t0.elapsed());

    // Nothing outstanding with that CID, a queue that does not exist, a Keep Alive's CID.
    let a = s.admin.cmd(abort(2, read), None, 0).ok("Abort of a completed command");
    assert_eq!(a.cqe.dw0 & 1, 1, "nothing to abort: {:?}", a.cqe);
    let a = s.admin.cmd(abort(9, 1), None, 0).ok("Abort on a queue that does not exist");
    assert_eq!(a.cqe.dw0 & 1, 1, "no such queue: {:?}", a.cqe);
    let a = s.admin.cmd(abort(0, 0xfff0), None, 0).ok("Abort of an admin command that is not outstanding");
    assert_eq!(a.cqe.dw0 & 1, 1, "nothing to abort on the admin queue: {:?}", a.cqe);

    // A read that is aborted on the first queue while the second keeps working.
    let held = s.io[0].submit(Host::rw_sqe(nvm::READ, nsid, 4, 1), None, 4096);
    std::thread::sleep(Duration::from_millis(20));
    let a = s.admin.cmd(abort(1, held), None, 0).ok("Abort on queue 1");
    assert_eq!(a.cqe.dw0 & 1, 0, "aborted on queue 1: {:?}", a.cqe);
    assert_eq!(status(&s.io[0].wait(held)), (sct::GENERIC, generic::ABORTED_BY_REQUEST));
    // Not aborted: the data reads back whole (after the delay).
    assert_eq!(s.io[1].read(nsid, 4, 2, 4096).ok("read back").data, data, "data written before the aborts");
    still_serves(&mut n, 140);
}

#[test]
fn reads_queued_just_before_a_disconnect_are_aborted() {
    // The reads reach a delay bdev (60 s) in the same instant the host closes: the close must
    // still abort every one of them (some are on their way back from the delay bdev's base and
    // not yet held when the first abort looks), or they would pin the connection and the
    // bdev for a minute.
    let (_dir, mut n) = setup("nvmfheld", "0x1", json!({}));
    n.d.call("bdev_null_create", Some(json!({"name": "NH", "num_blocks": 131072, "block_size": 512})));
    n.d.call(
        "bdev_delay_create",
        Some(json!({"base_bdev_name": "NH", "name": "DH", "avg_read_latency": 60_000_000,
            "p99_read_latency": 60_000_000, "avg_write_latency": 10, "p99_write_latency": 10})),
    );
    const HNQN: &str = "nqn.2016-06.io.ferrite:held";
    n.subsystem(HNQN, true);
    let nsid = n.add_ns(HNQN, "DH");
    n.listen(HNQN);
    for _ in 0..5 {
        let mut s = Session::open(n.port, HNQN, 1, HostOpts::default(), 4096);
        // As many as the queue holds (a host that sends more is cut off by the target).
        for i in 0..24 {
            s.io[0].submit(Host::rw_sqe(nvm::READ, nsid, i * 8, 8), None, 4096);
        }
        drop(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    // Nothing is held: the delay bdev deletes at once.
    let t0 = Instant::now();
    assert_eq!(n.d.call("bdev_delay_delete", Some(json!({"name": "DH"}))), json!(true));
    assert!(t0.elapsed() < Duration::from_secs(5), "bdev_delay_delete waited {:?}", t0.elapsed());
    still_serves(&mut n, 141);
}

#[test]
fn aborts_beyond_the_abort_command_limit_are_refused() {
    use ferrite_nvmf::spec::opcode::admin::ABORT;
    use ferrite_nvmf::spec::status::command_specific::ABORT_COMMAND_LIMIT_EXCEEDED;
    let (_dir, mut n) = setup("nvmfacl", "0x1", json!({}));
    let mut s = Session::open(n.port, SUBNQN, 1, HostOpts::default(), 4096);
    let id = s.admin.identify(cns::CONTROLLER, 0, 0).ok("Identify Controller");
    let acl = u32::from(id.data[258]);
    assert_eq!(acl, 3, "ACL");
    // Writes whose data (past the in-capsule size) the host never sends: they wait in
    // Receiving, and an Abort of one waits for it (abort_timeout_sec, 1 s).
    let data = pattern(7, 8192);
    let writes: Vec<u16> =
        (0..6).map(|i| s.io[0].submit(Host::rw_sqe(nvm::WRITE, NS4K, i * 2, 2), Some(&data), 0)).collect();
    std::thread::sleep(Duration::from_millis(50));
    let abort = |cid: u16| Host::sqe(ABORT, 0, |q| q.cdw10 = 1 | u32::from(cid) << 16);
    let aborts: Vec<u16> = writes.iter().map(|&w| s.admin.submit(abort(w), None, 0)).collect();
    let t0 = Instant::now();
    // ACL + 1 are answered; the others at once with Abort Command Limit Exceeded.
    for &a in &aborts[acl as usize + 1..] {
        let r = s.admin.wait(a);
        assert_eq!(status(&r), (sct::COMMAND_SPECIFIC, ABORT_COMMAND_LIMIT_EXCEEDED), "{:?}", r.cqe);
    }
    assert!(t0.elapsed() < Duration::from_millis(900), "the refusals waited {:?}", t0.elapsed());
    for &a in &aborts[..=acl as usize] {
        let r = s.admin.wait(a);
        assert_eq!(status(&r), (sct::GENERIC, generic::SUCCESS), "{:?}", r.cqe);
    }
    // The limit is free again: another Abort is answered (nothing by that CID: not aborted).
    let r = s.admin.cmd(abort(0xfff0), None, 0).ok("Abort after the others");
    assert_eq!(r.cqe.dw0 & 1, 1, "{:?}", r.cqe);
    drop(s);
    still_serves(&mut n, 142);
}
