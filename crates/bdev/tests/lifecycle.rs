//! Descriptors, claims, hot removal under load, and I/O statistics across cores.

mod common;

use common::*;
use ferrite_bdev::channel::local_iostat;
use ferrite_bdev::{
    lookup, unregister, Bdev, BdevError, Completed, IoChannel, IoCompleter, IoRequest, IoStat, IoStatus, IoType,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{alloc_buf, sleep, ReactorMode};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn malloc_bdev(name: &str, num_blocks: u64) -> Bdev {
    malloc::create(MallocOpts {
        name: Some(name.into()),
        num_blocks,
        block_size: 512,
        uuid: None,
        ..Default::default()
    })
    .unwrap()
}

fn claimed(r: Result<impl Sized, BdevError>, what: &str) {
    match r {
        Err(BdevError::Claimed(_)) => {}
        Err(e) => panic!("{what}: expected Claimed, got {e:?}"),
        Ok(_) => panic!("{what}: succeeded"),
    }
}

#[test]
fn claims_are_exclusive_and_released_on_close() {
    const NAME: &str = "life_claims";
    let bdev = malloc_bdev(NAME, 64);
    let a = Bdev::open(NAME, true, || {}).unwrap();
    assert!(a.writable());
    assert_eq!(bdev.open_count(), 1);
    a.claim("mod_a").expect("first claim");
    assert_eq!(bdev.claimed_by().as_deref(), Some("mod_a"));
    claimed(a.claim("mod_a"), "second claim through the same descriptor");
    claimed(Bdev::open(NAME, true, || {}), "open for writing while claimed");
    let ro = Bdev::open(NAME, false, || {}).expect("read-only open while claimed");
    assert!(!ro.writable());
    claimed(ro.claim("mod_b"), "claim by another module");
    assert_eq!(bdev.claimed_by().as_deref(), Some("mod_a"), "a failed claim changes nothing");
    assert_eq!(bdev.open_count(), 2);

    // Closing a descriptor that does not hold the claim keeps it.
    drop(ro);
    assert_eq!(bdev.claimed_by().as_deref(), Some("mod_a"));
    claimed(Bdev::open(NAME, true, || {}), "open for writing while still claimed");

    // Closing the claiming descriptor releases it.
    drop(a);
    assert_eq!(bdev.claimed_by(), None);
    assert_eq!(bdev.open_count(), 0);
    let w1 = Bdev::open(NAME, true, || {}).expect("open for writing after release");
    let w2 = Bdev::open(NAME, true, || {}).expect("two writers without a claim");
    claimed(w1.claim("mod_b"), "claim while another descriptor can write");
    drop(w2);
    let ro = Bdev::open(NAME, false, || {}).unwrap();
    w1.claim("mod_b").expect("claim with only readers besides");
    assert_eq!(bdev.claimed_by().as_deref(), Some("mod_b"));
    drop(ro);
    drop(w1);
    assert_eq!(bdev.claimed_by(), None);

    // A read-only descriptor may claim too; then nobody else may open for writing.
    let r = Bdev::open(NAME, false, || {}).unwrap();
    r.claim("mod_c").unwrap();
    claimed(Bdev::open(NAME, true, || {}), "open for writing while claimed by a reader");
    drop(r);
    drop(Bdev::open(NAME, true, || {}).unwrap());

    assert!(matches!(Bdev::open("life_claims_nope", false, || {}), Err(BdevError::NotFound(_))));
    unregister(NAME, Some("malloc")).unwrap();
}

const QD: u64 = 32;
/// Blocks per I/O: 4 KiB on 512-byte blocks. Slot `s` owns blocks `s*8 .. s*8+8`.
const IO_BLOCKS: u64 = 8;

/// Tags: slot in the low byte, sequence number above.
fn tag(slot: u64, seq: u64) -> u64 {
    (seq << 8) | slot
}

/// Keeps QD writes and reads in flight, resubmitting on completion, until each slot's I/O
/// completes with `Removed`. Each slot alternates a write of a new pattern and a read-back.
struct Load {
    me: Weak<Load>,
    ch: RefCell<Option<IoChannel>>,
    /// Tag of each I/O in flight -> whether it was submitted after on_remove had run.
    in_flight: RefCell<HashMap<u64, bool>>,
    seq: Cell<u64>,
    /// Last pattern seed written by each slot.
    written: RefCell<Vec<u64>>,
    active_slots: Cell<u64>,
    submitted: Cell<u64>,
    completed: Cell<u64>,
    removed: Cell<u64>,
    removed_after_notice: Cell<u64>,
    problems: RefCell<Vec<String>>,
    notice: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
}

impl Load {
    fn submit(&self, slot: u64, write: bool) {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        let t = tag(slot, seq);
        let len = (IO_BLOCKS * 512) as usize;
        let req = if write {
            self.written.borrow_mut()[slot as usize] = seq;
            IoRequest::write(slot * IO_BLOCKS, IO_BLOCKS, buf_from(&pattern(seq, len)))
        } else {
            IoRequest::read(slot * IO_BLOCKS, IO_BLOCKS, buf_filled(len, 0xee))
        };
        let after = self.notice.load(Ordering::SeqCst);
        self.in_flight.borrow_mut().insert(t, after);
        self.submitted.set(self.submitted.get() + 1);
        let ch = self.ch.borrow().clone().expect("channel while loading");
        ch.submit(req, self.me.upgrade().unwrap(), t);
    }

    fn problem(&self, p: String) {
        let mut v = self.problems.borrow_mut();
        if v.len() < 20 {
            v.push(p);
        }
    }
}

impl IoCompleter for Load {
    fn io_done(&self, t: u64, io: Completed) {
        let slot = t & 0xff;
        let Some(after) = self.in_flight.borrow_mut().remove(&t) else {
            self.problem(format!("tag {t:#x} completed twice or was never submitted"));
            return;
        };
        self.completed.set(self.completed.get() + 1);
        self.progress.fetch_add(1, Ordering::SeqCst);
        match io.status {
            IoStatus::Success if after => {
                self.problem(format!("I/O {t:#x} submitted after on_remove ran completed with Success"))
            }
            IoStatus::Success => {
                if io.req.io_type == IoType::Read {
                    let want = pattern(self.written.borrow()[slot as usize], (IO_BLOCKS * 512) as usize);
                    if payload(&io) != want {
                        self.problem(format!("slot {slot}: read-back differs from the last write"));
                    }
                }
                // Alternate: a write is followed by its read-back, a read by a new write.
                self.submit(slot, io.req.io_type == IoType::Read);
                return;
            }
            IoStatus::Removed => {
                self.removed.set(self.removed.get() + 1);
                if after {
                    self.removed_after_notice.set(self.removed_after_notice.get() + 1);
                }
            }
            s => self.problem(format!("I/O {t:#x} failed with {s}")),
        }
        self.active_slots.set(self.active_slots.get() - 1);
    }
}

#[derive(Debug)]
struct LoadResult {
    submitted: u64,
    completed: u64,
    removed: u64,
    removed_after_notice: u64,
    in_flight_left: usize,
    problems: Vec<String>,
    status_after: Vec<IoStatus>,
    timed_out: bool,
}

/// Runs the hot-removal scenario; `from_main` selects who calls `unregister`: the test's main
/// thread, or reactor 1.
fn hot_remove_under_load(name: &'static str, from_main: bool) {
    let e = engine(2, ReactorMode::Interrupt);
    let bdev = malloc_bdev(name, QD * IO_BLOCKS);
    let old_id = bdev.id();
    drop(bdev);

    let notice = Arc::new(AtomicBool::new(false));
    let notice_cores = Arc::new(Mutex::new(Vec::new()));
    let progress = Arc::new(AtomicU64::new(0));
    let (n, nc, p) = (notice.clone(), notice_cores.clone(), progress.clone());
    let loaded = e.run_async(0, move || async move {
        let n2 = n.clone();
        let desc = Bdev::open(name, true, move || {
            nc.lock().unwrap().push(ferrite_reactor::current());
            n2.store(true, Ordering::SeqCst);
        })
        .unwrap();
        let ch = desc.channel().unwrap();
        let load = Rc::new_cyclic(|me| Load {
            me: me.clone(),
            ch: RefCell::new(Some(ch.clone())),
            in_flight: RefCell::new(HashMap::new()),
            seq: Cell::new(0),
            written: RefCell::new(vec![0; QD as usize]),
            active_slots: Cell::new(QD),
            submitted: Cell::new(0),
            completed: Cell::new(0),
            removed: Cell::new(0),
            removed_after_notice: Cell::new(0),
            problems: RefCell::new(Vec::new()),
            notice: n,
            progress: p,
        });
        for slot in 0..QD {
            load.submit(slot, true);
        }
        // Wait (bounded) until every slot has seen Removed and nothing is in flight.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut timed_out = false;
        while load.active_slots.get() > 0 || !load.in_flight.borrow().is_empty() {
            if Instant::now() > deadline {
                timed_out = true;
                break;
            }
            sleep(Duration::from_millis(1)).await;
        }
        // Once on_remove has run, new requests of every kind fail at once with Removed.
        let notice_deadline = Instant::now() + Duration::from_secs(20);
        while !load.notice.load(Ordering::SeqCst) && Instant::now() < notice_deadline {
            sleep(Duration::from_millis(1)).await;
        }
        let mut status_after = Vec::new();
        for req in [
            IoRequest::read(0, 1, alloc_buf(512)),
            IoRequest::write(8, 8, buf_filled(4096, 1)),
            IoRequest::no_payload(IoType::Unmap, 0, 8),
            IoRequest::no_payload(IoType::Flush, 0, 0),
        ] {
            status_after.push(io(&ch, req).await.status);
        }
        load.ch.borrow_mut().take();
        drop(ch);
        let r = LoadResult {
            submitted: load.submitted.get(),
            completed: load.completed.get(),
            removed: load.removed.get(),
            removed_after_notice: load.removed_after_notice.get(),
            in_flight_left: load.in_flight.borrow().len(),
            problems: load.problems.borrow().clone(),
            status_after,
            timed_out,
        };
        (r, desc)
    });

    // Let the load run for a while.
    let start = Instant::now();
    while progress.load(Ordering::SeqCst) < 20_000 {
        assert!(start.elapsed() < TIMEOUT, "the load does not progress");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(unregister(name, Some("null")), Err(BdevError::NotFound(_))), "wrong module");
    let removed_rx = if from_main {
        unregister(name, Some("malloc")).expect("unregister")
    } else {
        run(&e, 1, move || async move { unregister(name, Some("malloc")) }).expect("unregister")
    };
    // The name is free at once; the old bdev cannot be opened any more.
    assert!(lookup(name).is_none());
    assert!(matches!(Bdev::open(name, false, || {}), Err(BdevError::NotFound(_))));

    let (r, desc) = match wait_timeout(loaded, TIMEOUT) {
        Ok(v) => v,
        Err(_) => panic!("the load task on reactor 0 failed or hung"),
    };
    assert!(!r.timed_out, "I/O still in flight 20 s after removal: {r:?}");
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    assert_eq!(r.in_flight_left, 0, "{r:?}");
    assert_eq!(r.submitted, r.completed, "every submitted I/O completes exactly once: {r:?}");
    assert_eq!(r.removed, QD, "each slot stops at its first Removed: {r:?}");
    assert!(r.submitted > 20_000 + QD, "{r:?}");
    assert_eq!(r.status_after, vec![IoStatus::Removed; 4], "I/O submitted after on_remove ran");
    assert!(r.removed_after_notice <= r.removed);
    assert!(notice.load(Ordering::SeqCst));
    assert_eq!(*notice_cores.lock().unwrap(), vec![Some(0)], "on_remove runs once, on the opening core (reactor 0)");

    // The removal completes only when the last descriptor closes.
    let (tx, fired) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(removed_rx.wait());
    });
    assert!(fired.recv_timeout(Duration::from_millis(200)).is_err(), "removal finished with a descriptor open");
    drop(desc);
    assert_eq!(fired.recv_timeout(TIMEOUT), Ok(Ok(())), "removal did not finish after the descriptor closed");

    // The name can be used again, by a new bdev.
    let again = malloc_bdev(name, 8);
    assert_ne!(again.id(), old_id);
    assert_eq!(lookup(name).map(|b| b.id()), Some(again.id()));
    run(&e, 0, move || async move {
        let desc = Bdev::open(name, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let data = pattern(5, 4096);
        io_ok(&ch, IoRequest::write(0, 8, buf_from(&data))).await;
        assert_bytes_eq(&io_ok(&ch, IoRequest::read(0, 8, alloc_buf(4096))).await, &data, "new bdev");
    });
    let rx = unregister(name, None).unwrap();
    assert_eq!(wait_timeout(rx, TIMEOUT).ok(), Some(()), "removal without openers finishes at once");
    shutdown(e);
}

#[test]
fn hot_removal_under_load_from_another_reactor() {
    hot_remove_under_load("life_hot_remove_r1", false);
}

#[test]
fn hot_removal_under_load_from_a_plain_thread() {
    hot_remove_under_load("life_hot_remove_main", true);
}

#[test]
fn iostat_sums_over_cores() {
    const NAME: &str = "life_iostat";
    const OTHER: &str = "life_iostat_other";
    let e = engine(2, ReactorMode::Adaptive);
    let bdev = malloc_bdev(NAME, 1024);
    let other = malloc_bdev(OTHER, 64);
    let id = bdev.id();
    // (reads, writes, failed) per reactor, 4 KiB each.
    let plan = [(37u64, 11u64, 3u64), (23, 19, 2)];
    for (r, &(reads, writes, failed)) in plan.iter().enumerate() {
        run(&e, r, move || async move {
            let desc = Bdev::open(NAME, true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            for i in 0..writes {
                io_ok(&ch, IoRequest::write((i % 128) * 8, 8, buf_filled(4096, i as u8))).await;
            }
            for i in 0..reads {
                io_ok(&ch, IoRequest::read((i % 128) * 8, 8, alloc_buf(4096))).await;
            }
            for _ in 0..failed {
                let s = io(&ch, IoRequest::read(1020, 8, alloc_buf(4096))).await.status;
                assert_eq!(s, IoStatus::OutOfRange);
            }
            if r == 1 {
                // Other types, and a permission failure through a read-only descriptor.
                for (t, off, nb) in [(IoType::Unmap, 0, 16), (IoType::WriteZeroes, 16, 4), (IoType::Flush, 0, 0)] {
                    assert_eq!(io(&ch, IoRequest::no_payload(t, off, nb)).await.status, IoStatus::Success);
                }
                let ro = Bdev::open(NAME, false, || {}).unwrap();
                let s = io(&ro.channel().unwrap(), IoRequest::write(0, 8, alloc_buf(4096))).await.status;
                assert_eq!(s, IoStatus::Failed(libc::EBADF));
            }
            // Another bdev's I/O does not count.
            let od = Bdev::open(OTHER, true, || {}).unwrap();
            io_ok(&od.channel().unwrap(), IoRequest::read(0, 8, alloc_buf(4096))).await;
        });
    }
    let per_core = wait_timeout(e.on_all(move |_| local_iostat(id)), TIMEOUT).expect("on_all");
    let mut sum = IoStat::default();
    for s in &per_core {
        sum.add(s);
    }
    let (reads, writes, failed) = plan.iter().fold((0, 0, 0), |a, p| (a.0 + p.0, a.1 + p.1, a.2 + p.2));
    assert_eq!((per_core[0].num_read_ops, per_core[1].num_read_ops), (plan[0].0, plan[1].0), "per core");
    assert_eq!((sum.num_read_ops, sum.bytes_read), (reads, reads * 4096));
    assert_eq!((sum.num_write_ops, sum.bytes_written), (writes, writes * 4096));
    assert_eq!((sum.num_unmap_ops, sum.bytes_unmapped), (1, 16 * 512));
    assert_eq!((sum.num_write_zeroes_ops, sum.bytes_write_zeroes), (1, 4 * 512));
    assert_eq!((sum.num_flush_ops, sum.num_reset_ops), (1, 0));
    assert_eq!(sum.io_errors, failed + 1, "out-of-range reads and the EBADF write");
    assert!(sum.max_read_latency_ticks <= sum.read_latency_ticks);
    assert!(sum.max_write_latency_ticks <= sum.write_latency_ticks);
    assert!(sum.read_latency_ticks > 0 && sum.write_latency_ticks > 0);

    let oid = other.id();
    let others = wait_timeout(e.on_all(move |_| local_iostat(oid)), TIMEOUT).expect("on_all");
    assert_eq!(others.iter().map(|s| s.num_read_ops).sum::<u64>(), 2);
    assert_eq!(others.iter().map(|s| s.num_write_ops + s.io_errors).sum::<u64>(), 0);
    // Off-reactor, and for a bdev never used: zeroes.
    assert_eq!(local_iostat(id), IoStat::default());
    unregister(NAME, None).unwrap();
    unregister(OTHER, None).unwrap();
    shutdown(e);
}
