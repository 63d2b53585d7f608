//! The module framework: typed claims, examine (synchronous and asynchronous, and waiting for
//! it), events (remove, resize), and running a closure on every core's channel.

mod common;

use common::*;
use ferrite_bdev::module::{register_module, wait_for_examine};
use ferrite_bdev::{
    unregister, Bdev, BdevError, BdevEvent, BdevModule, ClaimType, ExamineDone, IoRequest, IoStatus, IoType, IoTypes,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::null::{self, NullOpts};
use ferrite_reactor::ReactorMode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn null_bdev(name: &str, num_blocks: u64) -> Bdev {
    null::create(NullOpts { name: name.into(), num_blocks, block_size: 512, ..Default::default() }).unwrap()
}

#[track_caller]
fn refused<T>(r: Result<T, BdevError>, what: &str) {
    assert!(matches!(r, Err(BdevError::Claimed(_))), "{what}: not refused as Claimed");
}

#[test]
fn claim_types_follow_spdk() {
    let b = null_bdev("fw_claims", 64);
    let open = |w: bool| Bdev::open("fw_claims", w, || {}).unwrap();

    // read_many_write_one: a read-only descriptor claims and gets write access; readers may
    // still open, writers may not; no other claim of any kind.
    let owner = open(false);
    owner.claim_as("raid", ClaimType::ReadManyWriteOne, 0).unwrap();
    assert!(owner.writable(), "the claim gives write access");
    assert_eq!(b.claim_type(), Some(ClaimType::ReadManyWriteOne));
    let reader = open(false);
    refused(Bdev::open("fw_claims", true, || {}), "open for writing");
    refused(reader.claim_as("x", ClaimType::ReadManyWriteOne, 0), "a second RWO claim");
    refused(reader.claim_as("x", ClaimType::ReadManyWriteNone, 0), "an RWN claim beside RWO");
    drop((owner, reader));
    assert_eq!(b.claim_type(), None);

    // read_many_write_none: several read-only claimants; a writable descriptor cannot claim it.
    let (r1, r2) = (open(false), open(false));
    r1.claim_as("snap", ClaimType::ReadManyWriteNone, 0).unwrap();
    r2.claim_as("clone", ClaimType::ReadManyWriteNone, 0).unwrap();
    assert!(!r1.writable() && !r2.writable());
    assert_eq!(b.claims().len(), 2);
    refused(open(false).claim_as("w", ClaimType::ExclusiveWrite, 0), "exclusive beside RWN");
    drop((r1, r2));
    let w = open(true);
    refused(w.claim_as("snap", ClaimType::ReadManyWriteNone, 0), "RWN through a writable descriptor");
    drop(w);

    // read_many_write_shared: claimants with the same key all write; another key is refused.
    let (p1, p2, p3) = (open(false), open(false), open(false));
    p1.claim_as("nexus", ClaimType::ReadManyWriteShared, 7).unwrap();
    p2.claim_as("nexus", ClaimType::ReadManyWriteShared, 7).unwrap();
    assert!(p1.writable() && p2.writable());
    refused(p3.claim_as("nexus", ClaimType::ReadManyWriteShared, 8), "RWS with another key");
    drop((p1, p2, p3));

    // A claim is refused while a descriptor that is not a claimant can write.
    let (w, r) = (open(true), open(false));
    refused(r.claim_as("raid", ClaimType::ReadManyWriteOne, 0), "RWO beside a writer");
    w.claim("lvol").unwrap();
    assert_eq!(b.claim_type(), Some(ClaimType::ExclusiveWrite));
    drop((w, r));
    unregister("fw_claims", None).unwrap();
}

/// A module that claims bdevs named `fw_examine_claim*` when it sees them, and reads
/// `fw_examine_slow*` ones "from disk" for a while before finishing.
struct Examiner {
    seen: Mutex<Vec<String>>,
    disk_done: AtomicUsize,
    held: Mutex<Vec<ferrite_bdev::BdevDesc>>,
}

impl BdevModule for Examiner {
    fn name(&self) -> &'static str {
        "fw_examiner"
    }
    fn examine_config(&self, bdev: &Bdev) {
        self.seen.lock().unwrap().push(bdev.name().to_string());
        if bdev.name().starts_with("fw_examine_claim") {
            let d = Bdev::open(bdev.name(), false, || {}).unwrap();
            d.claim_as("fw_examiner", ClaimType::ReadManyWriteOne, 0).unwrap();
            self.held.lock().unwrap().push(d);
        }
    }
    fn examine_disk(&self, bdev: &Bdev, done: ExamineDone) {
        if !bdev.name().starts_with("fw_examine_slow") {
            return done.finish();
        }
        let me = EXAMINER.get().unwrap().clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            me.disk_done.fetch_add(1, Ordering::SeqCst);
            done.finish();
        });
    }
}

static EXAMINER: std::sync::OnceLock<Arc<Examiner>> = std::sync::OnceLock::new();

#[test]
fn examine_offers_every_bdev_and_can_be_waited_for() {
    let ex = EXAMINER
        .get_or_init(|| {
            Arc::new(Examiner { seen: Mutex::default(), disk_done: AtomicUsize::new(0), held: Mutex::default() })
        })
        .clone();
    register_module(ex.clone()).unwrap();
    let b = null_bdev("fw_examine_claim0", 8);
    assert!(ex.seen.lock().unwrap().iter().any(|n| n == "fw_examine_claim0"), "offered at registration");
    assert_eq!(b.claimed_by().as_deref(), Some("fw_examiner"), "claimed by the module's examine");
    refused(Bdev::open("fw_examine_claim0", true, || {}), "open for writing a bdev an examine claimed");

    let start = Instant::now();
    null_bdev("fw_examine_slow0", 8);
    let rx = wait_for_examine();
    rx.wait().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(290), "waited for the disk examine");
    assert_eq!(ex.disk_done.load(Ordering::SeqCst), 1);
    ex.held.lock().unwrap().clear();
    unregister("fw_examine_claim0", None).unwrap();
    unregister("fw_examine_slow0", None).unwrap();
}

#[test]
fn resize_grows_and_tells_openers() {
    let e = engine(1, ReactorMode::Adaptive);
    null_bdev("fw_resize", 2048); // 1 MiB
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let statuses = run(&e, 0, move || async move {
        let d = Bdev::open_ext("fw_resize", true, move |e| ev.lock().unwrap().push(e)).unwrap();
        let ch = d.channel().unwrap();
        let before = io(&ch, IoRequest::read(3000, 1, buf_filled(512, 0))).await.status;
        null::resize("fw_resize", 2).unwrap();
        ferrite_reactor::sleep(Duration::from_millis(20)).await;
        let after = io(&ch, IoRequest::read(3000, 1, buf_filled(512, 0))).await.status;
        let shrink = null::resize("fw_resize", 1).err();
        drop((ch, d));
        (before, after, shrink)
    });
    assert_eq!(statuses.0, IoStatus::OutOfRange);
    assert_eq!(statuses.1, IoStatus::Success, "the new blocks are there");
    assert!(matches!(statuses.2, Some(BdevError::Busy(_))), "no shrinking while open");
    assert_eq!(*events.lock().unwrap(), vec![BdevEvent::Resize]);
    null::resize("fw_resize", 1).expect("shrinks once closed");
    assert_eq!(ferrite_bdev::lookup("fw_resize").unwrap().num_blocks(), 2048);
    unregister("fw_resize", None).unwrap();
    shutdown(e);
}

#[test]
fn stop_serving_tells_openers_once_and_refuses_on_open_channels() {
    let e = engine(1, ReactorMode::Adaptive);
    let b = malloc::create(MallocOpts {
        name: Some("fw_stop".into()),
        num_blocks: 64,
        block_size: 512,
        ..Default::default()
    })
    .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let write = IoTypes::of(&[IoType::Write, IoType::WriteZeroes]);
    let seen = run(&e, 0, move || async move {
        let d = Bdev::open_ext("fw_stop", true, move |e| ev.lock().unwrap().push(e)).unwrap();
        // A channel made before the change.
        let ch = d.channel().unwrap();
        let first = ch.submit_wait(IoRequest::write(0, 1, buf_filled(512, 0x5a))).await.status;
        let b = d.bdev().clone();
        b.stop_serving(write);
        // Types it no longer serves: nothing changes, nobody is told again.
        b.stop_serving(write);
        ferrite_reactor::sleep(Duration::from_millis(20)).await;
        let supports = (b.supports(IoType::Write), b.supports(IoType::WriteZeroes), b.supports(IoType::Read));
        let refused = (
            ch.submit_wait(IoRequest::write(0, 1, buf_filled(512, 0xa5))).await.status,
            ch.submit_wait(IoRequest::no_payload(IoType::WriteZeroes, 0, 1)).await.status,
            ch.submit_wait(IoRequest::compare_and_write(0, 1, buf_filled(512, 0x5a), buf_filled(512, 0xa5)))
                .await
                .status,
        );
        // Compare is the layer's own over reads, so it stays.
        let compared = ch.submit_wait(IoRequest::compare(0, 1, buf_filled(512, 0x5a))).await.status;
        let back = ch.submit_wait(IoRequest::read(0, 1, buf_filled(512, 0))).await;
        let data = (back.status, payload(&back));
        drop((back, ch, d));
        (first, supports, refused, compared, data)
    });
    let (first, supports, refused, compared, (read, data)) = seen;
    assert_eq!(first, IoStatus::Success, "written before the change");
    assert_eq!(supports, (false, false, true), "write and write zeroes gone, read kept");
    assert_eq!(
        refused,
        (IoStatus::Failed(libc::EROFS), IoStatus::Failed(libc::EROFS), IoStatus::Failed(libc::EROFS)),
        "the channel made before refuses write, write zeroes and compare-and-write as a read-only bdev"
    );
    assert_eq!(compared, IoStatus::Success, "compare still served, and the data matches");
    assert_eq!(read, IoStatus::Success);
    assert_bytes_eq(&data, &[0x5a; 512], "the data written before, untouched by the refused requests");
    assert_eq!(*events.lock().unwrap(), vec![BdevEvent::IoTypesChanged], "one event for the one change");
    drop(b);
    unregister("fw_stop", None).unwrap();
    shutdown(e);
}

#[test]
fn for_each_channel_runs_on_every_core_with_a_channel() {
    let e = engine(2, ReactorMode::Adaptive);
    let b = null_bdev("fw_each", 64);
    // Channels on both cores, kept open until the round is over.
    let keep: Vec<_> = (0..2)
        .map(|c| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
            e.send(c, move || {
                let d = Bdev::open("fw_each", false, || {}).unwrap();
                let ch = d.channel().unwrap();
                ready_tx.send(()).unwrap();
                ferrite_reactor::spawn_local(async move {
                    while rx.try_recv().is_err() {
                        ferrite_reactor::sleep(Duration::from_millis(5)).await;
                    }
                    drop((ch, d));
                })
                .detach();
            });
            ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            tx
        })
        .collect();
    let cores = Arc::new(Mutex::new(Vec::new()));
    let c2 = cores.clone();
    let n =
        b.for_each_channel(&e, move |_| c2.lock().unwrap().push(ferrite_reactor::current().unwrap())).wait().unwrap();
    assert_eq!(n, 2);
    let mut seen = cores.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, vec![0, 1], "each on its own core");
    for tx in keep {
        tx.send(()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    unregister("fw_each", None).unwrap();
    shutdown(e);
}
