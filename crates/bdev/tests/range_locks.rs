//! LBA range locks, quiesce and compare-and-write on reactors: writes held on every core while
//! a lock is held and completed after it; overlapping locks granted in order by the release
//! that clears their way (no timer); quiesce under load on two cores, with no request reaching
//! the module while quiesced; compare-and-write atomic against another core's writes; a
//! compare-and-write lease taken once for many commands; SPDK's unquiesce errors.
//!
//! No assertion here bounds a duration: waits are for events, each bounded by `TIMEOUT` only
//! as a hang guard.

mod common;

use common::*;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoRequest, IoStatus, IoType,
    IoTypes, Limits,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{next_turn, Engine, ReactorMode};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn make_malloc(name: &str, num_blocks: u64) -> Bdev {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size: 512, ..Default::default() }).unwrap()
}

/// Lets every core run many turns (messages sent before this are handled, and whatever they
/// started had its chance to finish).
fn turns(e: &Engine, n: usize) {
    for core in 0..e.count() {
        run(e, core, move || async move {
            for _ in 0..n {
                next_turn().await;
            }
        });
    }
}

/// Polls `cond` from the test thread until it holds (a hang guard of `TIMEOUT`, not a timing
/// assertion).
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < TIMEOUT, "{what} never happened");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A block of 8-byte words all equal to `tag`.
fn tagged(tag: u64, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    for c in d.chunks_exact_mut(8) {
        c.copy_from_slice(&tag.to_le_bytes());
    }
    d
}

/// The tag of data whose words are all equal; panics (torn) if they are not.
fn tag_of(d: &[u8]) -> u64 {
    let t = u64::from_le_bytes(d[..8].try_into().unwrap());
    assert!(d == tagged(t, d.len()), "torn data: first word {t:#x}, not every word equal");
    t
}

#[test]
fn writes_wait_for_a_lock_on_every_core_then_complete() {
    let e = engine(2, ReactorMode::Poll);
    let b = run(&e, 0, || async { make_malloc("rl_hold", 256) });
    let lock = run(&e, 0, move || async move { b.lock_lba_range(10, 10).await });
    // A write on each core into the range, and one outside it.
    let write = |core: usize, block: u64, tag: u64| {
        e.run_async(core, move || async move {
            let d = Bdev::open("rl_hold", true, || {}).unwrap();
            let ch = d.channel().unwrap();
            io(&ch, IoRequest::write(block, 1, buf_from(&tagged(tag, 512)))).await.status
        })
    };
    let mut w0 = write(0, 12, 0xa0);
    let mut w1 = write(1, 19, 0xa1);
    let outside = write(1, 100, 0xa2);
    assert_eq!(wait_timeout(outside, TIMEOUT), Ok(IoStatus::Success), "a write outside the lock goes on");
    turns(&e, 200);
    assert!(w0.try_recv().is_none() && w1.try_recv().is_none(), "writes into a locked range wait on both cores");
    // Reads are not held back by a plain lock.
    run(&e, 1, || async {
        let d = Bdev::open("rl_hold", false, || {}).unwrap();
        let ch = d.channel().unwrap();
        io_ok(&ch, IoRequest::read(12, 1, buf_filled(512, 0))).await;
    });
    drop(lock);
    assert_eq!(wait_timeout(w0, TIMEOUT), Ok(IoStatus::Success));
    assert_eq!(wait_timeout(w1, TIMEOUT), Ok(IoStatus::Success));
    run(&e, 0, || async {
        let d = Bdev::open("rl_hold", false, || {}).unwrap();
        let ch = d.channel().unwrap();
        for (block, tag) in [(12, 0xa0), (19, 0xa1), (100, 0xa2)] {
            let got = io_ok(&ch, IoRequest::read(block, 1, buf_filled(512, 0))).await;
            assert_bytes_eq(&got, &tagged(tag, 512), "written after the lock went");
        }
    });
    unregister("rl_hold", None).unwrap();
    shutdown(e);
}

#[test]
fn overlapping_locks_are_granted_in_order_by_the_release() {
    let e = engine(2, ReactorMode::Poll);
    let b = run(&e, 0, || async { make_malloc("rl_order", 64) });
    let b2 = b.clone();
    let a = run(&e, 0, move || async move { b2.lock_lba_range(0, 10).await });
    let order = Arc::new(Mutex::new(Vec::new()));
    let (release_b, release_c) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let waiter = |core: usize, name: &'static str, start: u64, num: u64, release: Arc<AtomicBool>| {
        let (b, order) = (b.clone(), order.clone());
        e.run_async(core, move || async move {
            let held = b.lock_lba_range(start, num).await;
            order.lock().unwrap().push(name);
            while !release.load(Ordering::Acquire) {
                next_turn().await;
            }
            drop(held);
        })
    };
    let rb = waiter(1, "b", 5, 10, release_b.clone());
    wait_until("b waiting", || b.lock_stats().waiting == 1);
    let rc = waiter(0, "c", 8, 4, release_c.clone());
    wait_until("c waiting", || b.lock_stats().waiting == 2);
    // Waiting arms no timer on either core: the release wakes the waiter.
    for core in 0..2 {
        assert_eq!(run(&e, core, || async { ferrite_reactor::pending_timers() }), 0, "core {core}: no timer");
    }
    turns(&e, 100);
    assert!(order.lock().unwrap().is_empty(), "nothing granted while a is held");
    assert_eq!(b.lock_stats().woken, 0);
    drop(a);
    wait_until("b granted", || order.lock().unwrap().len() == 1);
    turns(&e, 100);
    assert_eq!(*order.lock().unwrap(), ["b"], "c overlaps b: it waits for b's release");
    assert_eq!(b.lock_stats().woken, 1, "b was woken by a's release");
    release_b.store(true, Ordering::Release);
    wait_until("c granted", || order.lock().unwrap().len() == 2);
    assert_eq!(*order.lock().unwrap(), ["b", "c"]);
    release_c.store(true, Ordering::Release);
    wait_timeout(rb, TIMEOUT).unwrap();
    wait_timeout(rc, TIMEOUT).unwrap();
    let st = b.lock_stats();
    assert_eq!((st.held, st.waiting, st.woken), (0, 0, 2));
    unregister("rl_order", None).unwrap();
    shutdown(e);
}

/// A RAM disk that counts what reaches it and completes every request a turn later, through
/// a timer (so that requests are in flight when a quiesce starts).
struct Counting {
    mem: Arc<Mutex<Vec<u8>>>,
    submitted: Arc<AtomicU64>,
    in_module: Arc<AtomicU64>,
}

struct CountingChannel {
    mem: Arc<Mutex<Vec<u8>>>,
    submitted: Arc<AtomicU64>,
    in_module: Arc<AtomicU64>,
}

impl BackendChannel for CountingChannel {
    fn submit(&mut self, mut io: BdevIo) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        self.in_module.fetch_add(1, Ordering::Relaxed);
        let off = io.offset_bytes() as usize;
        let t = io.req.io_type;
        {
            let mut mem = self.mem.lock().unwrap();
            let mut pos = off;
            for b in io.req.bufs.iter_mut() {
                let n = b.len();
                match t {
                    IoType::Read => b.copy_from_slice(&mem[pos..pos + n]),
                    IoType::Write => mem[pos..pos + n].copy_from_slice(b),
                    _ => {}
                }
                pos += n;
            }
        }
        let in_module = self.in_module.clone();
        ferrite_reactor::after(std::time::Duration::from_micros(50), move || {
            in_module.fetch_sub(1, Ordering::Relaxed);
            io.complete(IoStatus::Success);
        });
    }
}

impl BdevBackend for Counting {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(CountingChannel {
            mem: self.mem.clone(),
            submitted: self.submitted.clone(),
            in_module: self.in_module.clone(),
        }))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn make_counting(name: &str, num_blocks: u64) -> (Bdev, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (submitted, in_module) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let backend = Counting {
        mem: Arc::new(Mutex::new(vec![0; num_blocks as usize * 512])),
        submitted: submitted.clone(),
        in_module: in_module.clone(),
    };
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: 512,
        num_blocks,
        product_name: "Counting disk",
        module: "test",
        io_types: IoTypes::default().with(IoType::Read).with(IoType::Write),
        limits: Limits::default(),
    };
    (register(props, Arc::new(backend)).unwrap(), submitted, in_module)
}

/// On `core`, keeps 4 write-then-read-back loops going over blocks `[first, first + 16)` until
/// `stop`; each read is compared. Counts completed pairs in `done`.
fn load(
    e: &Engine,
    core: usize,
    first: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<ferrite_reactor::oneshot::Receiver<()>> {
    (0..4u64)
        .map(|slot| {
            let (stop, done) = (stop.clone(), done.clone());
            e.run_async(core, move || async move {
                let d = Bdev::open("rl_quiesce", true, || {}).unwrap();
                let ch = d.channel().unwrap();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let block = first + (slot * 4 + n % 4);
                    let tag = (core as u64) << 48 | slot << 32 | n;
                    io_ok(&ch, IoRequest::write(block, 1, buf_from(&tagged(tag, 512)))).await;
                    let got = io_ok(&ch, IoRequest::read(block, 1, buf_filled(512, 0))).await;
                    assert_eq!(tag_of(&got), tag, "read back what this loop wrote");
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect()
}

#[test]
fn quiesce_holds_all_io_on_two_cores_and_unquiesce_resumes_it() {
    let e = engine(2, ReactorMode::Poll);
    let (b, submitted, in_module) = run(&e, 0, || async { make_counting("rl_quiesce", 64) });
    let stop = Arc::new(AtomicBool::new(false));
    let done: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut loops = load(&e, 0, 0, stop.clone(), done[0].clone());
    loops.extend(load(&e, 1, 32, stop.clone(), done[1].clone()));
    wait_until("load running on both cores", || done.iter().all(|d| d.load(Ordering::Relaxed) > 10));

    // The whole bdev: nothing reaches the module from the moment the quiesce completes.
    let b2 = b.clone();
    run(&e, 1, move || async move { b2.quiesce().await }).unwrap();
    assert_eq!(in_module.load(Ordering::Relaxed), 0, "what was in flight completed before the quiesce did");
    let before = submitted.load(Ordering::Relaxed);
    let pairs: Vec<u64> = done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
    turns(&e, 300);
    assert_eq!(submitted.load(Ordering::Relaxed), before, "no request reached the module while quiesced");
    assert_eq!(pairs, done.iter().map(|d| d.load(Ordering::Relaxed)).collect::<Vec<_>>());
    let b2 = b.clone();
    run(&e, 0, move || async move { b2.unquiesce().await }).unwrap();
    wait_until("both cores resumed", || done.iter().zip(&pairs).all(|(d, p)| d.load(Ordering::Relaxed) > p + 10));

    // A range: the core working elsewhere goes on, the one in the range waits.
    let b2 = b.clone();
    run(&e, 0, move || async move { b2.quiesce_range(0, 16).await }).unwrap();
    let held = done[0].load(Ordering::Relaxed);
    let other = done[1].load(Ordering::Relaxed);
    wait_until("core 1 goes on outside the range", || done[1].load(Ordering::Relaxed) > other + 10);
    assert_eq!(done[0].load(Ordering::Relaxed), held, "core 0's loops wait in the quiesced range");
    let b2 = b.clone();
    run(&e, 1, move || async move { b2.unquiesce_range(0, 16).await }).unwrap();
    wait_until("core 0 resumed", || done[0].load(Ordering::Relaxed) > held + 10);

    stop.store(true, Ordering::Release);
    for l in loops {
        wait_timeout(l, TIMEOUT).expect("every loop ends, all its reads compared");
    }
    assert_eq!(b.lock_stats().held, 0);
    unregister("rl_quiesce", None).unwrap();
    shutdown(e);
}

#[test]
fn compare_and_write_is_atomic_against_another_cores_writes() {
    const ROUNDS: u64 = 400;
    const LEN: usize = 64 * 512;
    let e = engine(2, ReactorMode::Poll);
    run(&e, 0, || async {
        let b = make_malloc("rl_caw", 256);
        let d = Bdev::open(b.name(), true, || {}).unwrap();
        let ch = d.channel().unwrap();
        io_ok(&ch, IoRequest::write(0, 64, buf_from(&tagged(1, LEN)))).await;
    });
    // Core 0: read the 64 blocks under a lock (a plain read racing a write may see both, which
    // says nothing of the data), check they hold one tag, and compare-and-write them from it to
    // a tag of its own.
    let caw = e.run_async(0, || async {
        let d = Bdev::open("rl_caw", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        let (mut ok, mut miss) = (0u64, 0u64);
        for i in 0..ROUNDS {
            let held = d.bdev().lock_lba_range(0, 64).await;
            let cur = io_ok(&ch, IoRequest::read(0, 64, buf_filled(LEN, 0))).await;
            drop(held);
            let t = tag_of(&cur);
            let new = 0xc000_0000 | i;
            let c = io(&ch, IoRequest::compare_and_write(0, 64, buf_from(&cur), buf_from(&tagged(new, LEN)))).await;
            match c.status {
                IoStatus::Success => ok += 1,
                IoStatus::Miscompare { .. } => miss += 1,
                s => panic!("compare-and-write failed: {s} (over tag {t:#x})"),
            }
        }
        (ok, miss)
    });
    // Core 1: plain writes of the same 64 blocks.
    let writes = e.run_async(1, || async {
        let d = Bdev::open("rl_caw", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        for i in 0..ROUNDS {
            io_ok(&ch, IoRequest::write(0, 64, buf_from(&tagged(0xd000_0000 | i, LEN)))).await;
        }
    });
    let (ok, miss) = wait_timeout(caw, TIMEOUT).expect("compare-and-writes finish");
    wait_timeout(writes, TIMEOUT).expect("writes finish");
    assert!(ok > 0, "some compare-and-writes succeeded ({miss} miscompared)");
    let last = run(&e, 1, || async {
        let d = Bdev::open("rl_caw", false, || {}).unwrap();
        let ch = d.channel().unwrap();
        tag_of(&io_ok(&ch, IoRequest::read(0, 64, buf_filled(LEN, 0))).await)
    });
    assert!(last >> 28 == 0xc || last >> 28 == 0xd, "the final data is a compare-and-write's or a write's: {last:#x}");
    unregister("rl_caw", None).unwrap();
    shutdown(e);
}

#[test]
fn compare_and_writes_on_one_core_share_one_lease() {
    let e = engine(2, ReactorMode::Poll);
    let b = run(&e, 0, || async { make_malloc("rl_lease", 64) });
    let b2 = b.clone();
    let granted = run(&e, 0, move || async move {
        let d = Bdev::open("rl_lease", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        io_ok(&ch, IoRequest::write(3, 1, buf_from(&tagged(0, 512)))).await;
        for v in 0..200u64 {
            let c =
                io(&ch, IoRequest::compare_and_write(3, 1, buf_from(&tagged(v, 512)), buf_from(&tagged(v + 1, 512))))
                    .await;
            assert_eq!(c.status, IoStatus::Success, "heartbeat {v}");
        }
        b2.lock_stats().granted
    });
    assert_eq!(granted, 1, "200 compare-and-writes of one core took one lease");
    // Another core's write into the lease's chunk makes the owner give it up, and goes on.
    run(&e, 1, || async {
        let d = Bdev::open("rl_lease", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        io_ok(&ch, IoRequest::write(3, 1, buf_from(&tagged(7, 512)))).await;
        let got = io_ok(&ch, IoRequest::read(3, 1, buf_filled(512, 0))).await;
        assert_eq!(tag_of(&got), 7);
    });
    wait_until("lease given up", || b.lock_stats().held == 0);
    unregister("rl_lease", None).unwrap();
    shutdown(e);
}

#[test]
fn unquiesce_errors_are_spdks() {
    let e = engine(1, ReactorMode::Poll);
    run(&e, 0, || async {
        let b = make_malloc("rl_errors", 64);
        let einval = |r: Result<(), BdevError>| r.expect_err("refused").errno();
        assert_eq!(einval(b.unquiesce().await), libc::EINVAL, "nothing is quiesced");
        assert_eq!(einval(b.quiesce_range(60, 8).await), libc::EINVAL, "past the end");
        assert_eq!(einval(b.quiesce_range(u64::MAX, 2).await), libc::EINVAL, "overflow");
        b.quiesce_range(0, 8).await.unwrap();
        assert_eq!(einval(b.unquiesce_range(0, 4).await), libc::EINVAL, "not the range quiesced");
        assert_eq!(einval(b.unquiesce().await), libc::EINVAL, "the whole bdev is not quiesced");
        b.unquiesce_range(0, 8).await.unwrap();
        assert_eq!(einval(b.unquiesce_range(0, 8).await), libc::EINVAL, "already unquiesced");
        b.quiesce().await.unwrap();
        b.unquiesce().await.unwrap();
        unregister("rl_errors", None).unwrap();
        assert_eq!(b.quiesce().await.expect_err("deleted").errno(), libc::ENODEV, "deleted, no opener");
    });
    shutdown(e);
}

/// A malloc bdev compares and writes in place (one request under the lease); a passthru over
/// another malloc has the layer emulate it (a read and a write). Both give the same results:
/// scattered compare and write data, the offset of the first differing byte, and the blocks
/// unchanged after a miscompare.
#[test]
fn compare_and_write_in_place_and_emulated_agree() {
    const LEN: usize = 4 * 512;
    let e = engine(1, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("rl_inplace", 64);
        make_malloc("rl_emul_base", 64);
        ferrite_modules::passthru::create("rl_emul_base", "rl_emul", None).unwrap();
        for name in ["rl_inplace", "rl_emul"] {
            let d = Bdev::open(name, true, || {}).unwrap();
            let ch = d.channel().unwrap();
            let old = pattern(1, LEN);
            io_ok(&ch, IoRequest::write(8, 4, buf_from(&old))).await;
            // Scattered differently: the compare data in three pieces, the new data in two.
            let new = pattern(2, LEN);
            let mut caw = vectored(IoType::CompareAndWrite, 8, 4, bufs_from(&new, &[1536, 512]));
            caw.aux = ferrite_bdev::IoAux::Compare(Box::new(bufs_from(&old, &[100, 1000, 948])));
            assert_eq!(io(&ch, caw).await.status, IoStatus::Success, "{name}: compare-and-write of equal data");
            let got = io_ok(&ch, IoRequest::read(8, 4, buf_filled(LEN, 0))).await;
            assert_bytes_eq(&got, &new, &format!("{name}: the new data after a compare-and-write"));
            // A compare that differs at byte 1111 writes nothing.
            let mut wrong = new.clone();
            wrong[1111] ^= 0x40;
            let mut caw = vectored(IoType::CompareAndWrite, 8, 4, bufs_from(&pattern(3, LEN), &[LEN]));
            caw.aux = ferrite_bdev::IoAux::Compare(Box::new(bufs_from(&wrong, &[1024, 1024])));
            match io(&ch, caw).await.status {
                IoStatus::Miscompare { offset } => assert_eq!(offset.get(), Some(1111), "{name}: first differing byte"),
                s => panic!("{name}: a differing compare gave {s}"),
            }
            let got = io_ok(&ch, IoRequest::read(8, 4, buf_filled(LEN, 0))).await;
            assert_bytes_eq(&got, &new, &format!("{name}: the blocks after a miscompare"));
        }
        unregister("rl_emul", None).unwrap();
        unregister("rl_emul_base", None).unwrap();
        unregister("rl_inplace", None).unwrap();
    });
    shutdown(e);
}

/// A quiesce whose future is dropped while it waits (behind a held lock) is given up: nothing
/// stays quiesced that no one would unquiesce, and writes to the range go on.
#[test]
fn a_dropped_quiesce_is_given_up() {
    let e = engine(1, ReactorMode::Poll);
    run(&e, 0, || async {
        let b = make_malloc("rl_drop_quiesce", 64);
        let d = Bdev::open(b.name(), true, || {}).unwrap();
        let ch = d.channel().unwrap();
        let lock = b.lock_lba_range(0, 8).await;
        {
            let mut q = std::pin::pin!(b.quiesce_range(0, 16));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(q.as_mut().poll(&mut cx).is_pending(), "the quiesce waits behind the lock");
            assert_eq!(b.lock_stats().waiting, 1);
        }
        assert_eq!(b.lock_stats().waiting, 0, "the dropped quiesce no longer waits");
        drop(lock);
        for _ in 0..100 {
            next_turn().await;
        }
        assert_eq!(b.lock_stats().held, 0, "nothing is held once the lock went");
        io_ok(&ch, IoRequest::write(4, 1, buf_from(&tagged(9, 512)))).await;
        assert_eq!(tag_of(&io_ok(&ch, IoRequest::read(4, 1, buf_filled(512, 0))).await), 9);
        drop((ch, d));
        unregister("rl_drop_quiesce", None).unwrap();
    });
    shutdown(e);
}

/// A lock held elsewhere in a compare-and-write's lease chunk (a rebuild's range, held for
/// minutes) does not hold the compare-and-write back: its lease shrinks to its own blocks.
#[test]
fn a_lock_elsewhere_in_the_chunk_does_not_stall_compare_and_write() {
    let e = engine(1, ReactorMode::Poll);
    let held = Arc::new(Mutex::new(None));
    let h = held.clone();
    run(&e, 0, move || async move {
        let b = make_malloc("rl_pinned", 256);
        let d = Bdev::open(b.name(), true, || {}).unwrap();
        io_ok(&d.channel().unwrap(), IoRequest::write(5, 1, buf_from(&tagged(1, 512)))).await;
        *h.lock().unwrap() = Some(b.lock_lba_range(200, 1).await);
    });
    let caw = e.run_async(0, || async {
        let d = Bdev::open("rl_pinned", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        let c = io(&ch, IoRequest::compare_and_write(5, 1, buf_from(&tagged(1, 512)), buf_from(&tagged(2, 512)))).await;
        let first = (c.status, tag_of(&io_ok(&ch, IoRequest::read(5, 1, buf_filled(512, 0))).await));
        // Many blocks on both sides of the lock: one lease each side, not one per block.
        let granted = d.bdev().lock_stats().granted;
        for block in (10..40).chain(210..240) {
            io_ok(&ch, IoRequest::write(block, 1, buf_from(&tagged(block, 512)))).await;
            let c = io(
                &ch,
                IoRequest::compare_and_write(block, 1, buf_from(&tagged(block, 512)), buf_from(&tagged(7, 512))),
            )
            .await;
            assert_eq!(c.status, IoStatus::Success, "block {block}");
        }
        (first, d.bdev().lock_stats().granted - granted)
    });
    let got = wait_timeout(caw, std::time::Duration::from_secs(10));
    drop(held.lock().unwrap().take());
    let (first, leases) = got.expect("the compare-and-writes complete while the lock elsewhere is held");
    assert_eq!(first, (IoStatus::Success, 2));
    assert!(leases <= 1, "the lease below the lock serves blocks 10-39, one more serves 210-239: {leases} granted");
    unregister("rl_pinned", None).unwrap();
    shutdown(e);
}
