//! The virtual bdevs (passthru, delay, error) over malloc, driven on the test thread without
//! reactors (completions run with `run_deferred`): data round trips, zero-copy reads through a
//! passthru, claims, abort passed through, fault injection of each kind with its status and
//! count, NoMem retried to success, and deleting a base under a stack.

mod common;

use common::*;
use ferrite_bdev::io::run_deferred;
use ferrite_bdev::{lookup, unregister, Bdev, IoChannel, IoRequest, IoStatus, IoType};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::passthru;
use ferrite_reactor::IoBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

fn heap(d: &[u8]) -> IoBuf {
    let mut b = IoBuf::heap(d.len());
    b.copy_from_slice(d);
    b
}

fn make_malloc(name: &str, num_blocks: u64) -> Bdev {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size: 512, ..Default::default() }).unwrap()
}

/// Writes `data` at `off` (in segments of the given lengths) and reads it back through `ch`
/// into differently cut segments; both must succeed and match.
fn write_read_back(ch: &IoChannel, off: u64, data: &[u8], wlens: &[usize], rlens: &[usize]) {
    let n = (data.len() / 512) as u64;
    let mut w = IoRequest::new(IoType::Write, off, n);
    let mut pos = 0;
    for &l in wlens {
        w.bufs.push(heap(&data[pos..pos + l]));
        pos += l;
    }
    assert_eq!(run_one(ch, w).status, IoStatus::Success, "write at {off}");
    let mut r = IoRequest::new(IoType::Read, off, n);
    for &l in rlens {
        r.bufs.push(IoBuf::heap(l));
    }
    let c = run_one(ch, r);
    assert_eq!(c.status, IoStatus::Success, "read at {off}");
    assert_bytes_eq(&payload(&c), data, "read back");
}

/// Deletes `name` and waits (with the deferred queue running) until every opener closed it.
fn delete_and_wait(name: &str) {
    let rx = unregister(name, None).unwrap();
    let (tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rx.wait());
    });
    let t = Instant::now();
    while done.try_recv().is_err() {
        run_deferred();
        assert!(t.elapsed() < TIMEOUT, "delete of {name} never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (running deferred completions) until `cond` holds; fails after [`TIMEOUT`].
fn eventually(cond: impl Fn() -> bool, what: &str) {
    let t = Instant::now();
    while !cond() {
        run_deferred();
        assert!(t.elapsed() < TIMEOUT, "{what}: never happened");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn passthru_round_trips_data_and_mirrors_its_base() {
    let m = make_malloc("vb_pt_rt_m", 256);
    let pt = passthru::create("vb_pt_rt_m", "vb_pt_rt", None).unwrap();
    assert_eq!((pt.block_size(), pt.num_blocks()), (m.block_size(), m.num_blocks()));
    assert_eq!(pt.module(), "passthru");
    for t in [IoType::Read, IoType::Write, IoType::Unmap, IoType::WriteZeroes, IoType::Flush, IoType::Copy] {
        assert_eq!(pt.supports(t), m.supports(t), "{t:?}");
    }
    assert!(pt.backend().zcopy(), "a passthru over malloc lends reads too");
    assert_eq!(m.claimed_by().as_deref(), Some("passthru"));
    let desc = Bdev::open("vb_pt_rt", true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(1, 8 * 512);
    write_read_back(&ch, 3, &data, &[1000, 3096], &[512, 3584]);
    // The data is in the base, where it belongs.
    let mdesc = Bdev::open("vb_pt_rt_m", false, || {}).unwrap();
    let mch = mdesc.channel().unwrap();
    let c = run_one(&mch, IoRequest::read(3, 8, IoBuf::heap(4096)));
    assert_bytes_eq(&payload(&c), &data, "base after a write through the passthru");
    // Unmap, write zeroes and copy pass through.
    assert!(run_one(&ch, IoRequest::copy(100, 3, 8)).status.is_ok());
    let c = run_one(&ch, IoRequest::read(100, 8, IoBuf::heap(4096)));
    assert_bytes_eq(&payload(&c), &data, "after copy");
    assert!(run_one(&ch, IoRequest::no_payload(IoType::Unmap, 3, 4)).status.is_ok());
    assert!(run_one(&ch, IoRequest::no_payload(IoType::WriteZeroes, 7, 4)).status.is_ok());
    let c = run_one(&ch, IoRequest::read(3, 8, IoBuf::heap(4096)));
    assert!(payload(&c).iter().all(|&b| b == 0), "unmap and write zeroes through the passthru");
    assert!(run_one(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).status.is_ok());
    assert!(run_one(&ch, IoRequest::no_payload(IoType::Reset, 0, 0)).status.is_ok());
    // Compare and compare-and-write (the base's layer does them).
    write_read_back(&ch, 20, &data, &[4096], &[4096]);
    assert_eq!(run_one(&ch, IoRequest::compare(20, 8, heap(&data))).status, IoStatus::Success);
    let other = pattern(2, 4096);
    let first = data.iter().zip(&other).position(|(a, b)| a != b).unwrap() as u64;
    let st = run_one(&ch, IoRequest::compare(20, 8, heap(&other))).status;
    assert_eq!(st, IoStatus::Miscompare { offset: ferrite_bdev::DiffOffset::at(first) });
    let c = run_one(&ch, IoRequest::compare_and_write(20, 8, heap(&data), heap(&other)));
    assert_eq!(c.status, IoStatus::Success);
    let c = run_one(&ch, IoRequest::read(20, 8, IoBuf::heap(4096)));
    assert_bytes_eq(&payload(&c), &other, "after compare-and-write");
    // Checks happen at the passthru too.
    assert_eq!(run_one(&ch, IoRequest::read(250, 8, IoBuf::heap(4096))).status, IoStatus::OutOfRange);
    let st = ferrite_bdev::channel::local_iostat(pt.id());
    assert!(st.num_write_ops >= 2 && st.num_read_ops >= 4 && st.io_errors == 2, "{st:?}");
    drop((ch, desc, mch, mdesc, c));
    delete_and_wait("vb_pt_rt");
    assert!(lookup("vb_pt_rt").is_none());
    eventually(|| m.claimed_by().is_none(), "deleting the passthru releases its claim");
    delete_and_wait("vb_pt_rt_m");
}

#[test]
fn zero_copy_reads_through_a_passthru_are_the_bases_memory() {
    make_malloc("vb_pt_zc_m", 64);
    passthru::create("vb_pt_zc_m", "vb_pt_zc", None).unwrap();
    let desc = Bdev::open("vb_pt_zc", true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(3, 4 * 512);
    write_read_back(&ch, 8, &data, &[2048], &[2048]);
    let c = run_one(&ch, IoRequest::read_zcopy(8, 4));
    assert_eq!(c.status, IoStatus::Success);
    assert!(!c.req.bufs.is_empty() && c.req.bufs.iter().all(|b| b.is_lent()), "lent buffers reach the caller");
    assert_bytes_eq(&payload(&c), &data, "zero-copy read through the passthru");
    drop((c, ch, desc));
    delete_and_wait("vb_pt_zc");
    delete_and_wait("vb_pt_zc_m");
}

#[test]
fn the_claim_keeps_other_writers_off_the_base() {
    make_malloc("vb_pt_claim_m", 64);
    let other_writer = Bdev::open("vb_pt_claim_m", true, || {}).unwrap();
    let e = passthru::create("vb_pt_claim_m", "vb_pt_claim", None).err().unwrap();
    assert!(matches!(e, ferrite_bdev::BdevError::Claimed(_)), "{e}");
    assert!(lookup("vb_pt_claim").is_none(), "a failed create leaves nothing behind");
    drop(other_writer);
    passthru::create("vb_pt_claim_m", "vb_pt_claim", None).unwrap();
    let e = Bdev::open("vb_pt_claim_m", true, || {}).err().expect("a second writer is refused");
    assert!(matches!(e, ferrite_bdev::BdevError::Claimed(_)), "{e}");
    let e = passthru::create("vb_pt_claim_m", "vb_pt_claim2", None).err().unwrap();
    assert!(matches!(e, ferrite_bdev::BdevError::Claimed(_)), "{e}");
    let reader = Bdev::open("vb_pt_claim_m", false, || {}).expect("readers are welcome");
    drop(reader);
    // Name clashes, missing bases and bad names fail cleanly.
    assert!(matches!(passthru::create("vb_pt_claim_m", "vb_pt_claim", None), Err(ferrite_bdev::BdevError::Exists(_))));
    assert!(matches!(passthru::create("vb_nope", "vb_pt_x", None), Err(ferrite_bdev::BdevError::NotFound(_))));
    assert!(matches!(passthru::create("vb_pt_claim_m", "", None), Err(ferrite_bdev::BdevError::Invalid(_))));
    delete_and_wait("vb_pt_claim");
    eventually(|| Bdev::open("vb_pt_claim_m", true, || {}).is_ok(), "writable again once the passthru is gone");
    delete_and_wait("vb_pt_claim_m");
}

#[test]
fn deleting_the_base_removes_the_passthru_and_waits_for_it() {
    make_malloc("vb_pt_del_m", 64);
    passthru::create("vb_pt_del_m", "vb_pt_del", None).unwrap();
    let removed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r2 = removed.clone();
    let desc = Bdev::open("vb_pt_del", true, move || r2.store(true, std::sync::atomic::Ordering::SeqCst)).unwrap();
    let ch = desc.channel().unwrap();
    let c = Rc::new(Collect::default());
    for i in 0..16 {
        ch.submit(IoRequest::write(i, 1, heap(&pattern(i, 512))), c.clone(), i);
    }
    let rx = unregister("vb_pt_del_m", None).unwrap();
    assert!(removed.load(std::sync::atomic::Ordering::SeqCst), "the passthru's opener was told");
    assert!(lookup("vb_pt_del").is_none(), "the passthru left the registry with its base");
    settle();
    assert_eq!(c.len(), 16, "every outstanding I/O completed");
    // New I/O fails; the base's delete waits for the passthru's opener.
    let late = run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512)));
    assert_eq!(late.status, IoStatus::Removed);
    drop((ch, desc, late));
    assert!(wait_timeout(rx, TIMEOUT).is_ok(), "the base's delete finished once the passthru was gone");
}

use ferrite_modules::error::{self, ErrorType, Injection};

/// A malloc bdev `<tag>_m` with `EE_<tag>_m` over it, and a writable channel to the latter.
fn error_over_malloc(tag: &str) -> (String, ferrite_bdev::BdevDesc, IoChannel) {
    let base = format!("{tag}_m");
    make_malloc(&base, 128);
    let ee = error::create(&base, None).unwrap();
    assert_eq!(ee.name(), format!("EE_{base}"));
    assert_eq!(ee.product_name(), "Error Injection Disk");
    let desc = Bdev::open(ee.name(), true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    (ee.name().to_string(), desc, ch)
}

fn teardown(ee: &str, desc: ferrite_bdev::BdevDesc, ch: IoChannel) {
    drop((ch, desc));
    let base = ee.trim_start_matches("EE_").to_string();
    delete_and_wait(ee);
    delete_and_wait(&base);
}

#[test]
fn error_failure_fails_exactly_num_ios_of_the_type() {
    let (ee, desc, ch) = error_over_malloc("vb_ee_fail");
    let old = pattern(10, 512);
    write_read_back(&ch, 0, &old, &[512], &[512]);
    write_read_back(&ch, 1, &old, &[512], &[512]);
    error::inject(&ee, Some(IoType::Write), Injection::of(ErrorType::Failure, 2)).unwrap();
    let new = pattern(11, 512);
    assert_eq!(run_one(&ch, IoRequest::write(0, 1, heap(&new))).status, IoStatus::Failed(libc::EIO));
    // Reads are not armed.
    let c = run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512)));
    assert_bytes_eq(&payload(&c), &old, "a failed write changes nothing");
    assert_eq!(run_one(&ch, IoRequest::write(1, 1, heap(&new))).status, IoStatus::Failed(libc::EIO));
    write_read_back(&ch, 0, &new, &[512], &[512]);
    let bdev = lookup(&ee).unwrap();
    let st = ferrite_bdev::channel::local_iostat(bdev.id());
    assert_eq!(st.errors[0], 2, "two failures counted: {st:?}");
    // "all" arms reads too; NVMe statuses pass unchanged.
    error::inject(&ee, None, Injection::of(ErrorType::Failure, 1)).unwrap();
    assert_eq!(run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512))).status, IoStatus::Failed(libc::EIO));
    assert_eq!(run_one(&ch, IoRequest::no_payload(IoType::Unmap, 0, 1)).status, IoStatus::Failed(libc::EIO));
    assert!(run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512))).status.is_ok(), "one each");
    let mut n = Injection::of(ErrorType::NvmeFailure, 1);
    (n.nvme_sct, n.nvme_sc) = (1, 0x81);
    error::inject(&ee, Some(IoType::Flush), n).unwrap();
    let c = run_one(&ch, IoRequest::no_payload(IoType::Flush, 0, 0));
    assert_eq!(c.status, IoStatus::nvme(1, 0x81));
    // Clear disarms; num 0 disarms.
    error::inject(&ee, Some(IoType::Read), Injection::of(ErrorType::Failure, 5)).unwrap();
    error::clear(&ee).unwrap();
    assert!(run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512))).status.is_ok());
    error::inject(&ee, Some(IoType::Read), Injection::of(ErrorType::Failure, 0)).unwrap();
    assert!(run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512))).status.is_ok());
    // Bad requests.
    assert!(matches!(
        error::inject("vb_ee_fail_m", None, Injection::of(ErrorType::Failure, 1)),
        Err(ferrite_bdev::BdevError::NotFound(_))
    ));
    assert!(matches!(
        error::inject(&ee, Some(IoType::Read), Injection::of(ErrorType::CorruptData, 1)),
        Err(ferrite_bdev::BdevError::Invalid(_))
    ));
    assert!(matches!(
        error::inject(&ee, Some(IoType::Reset), Injection::of(ErrorType::Failure, 1)),
        Err(ferrite_bdev::BdevError::Invalid(_))
    ));
    assert!(matches!(error::create("vb_ee_fail_m", None), Err(ferrite_bdev::BdevError::Exists(_))));
    drop(c);
    teardown(&ee, desc, ch);
}

#[test]
fn error_queue_depth_arms_only_deep_queues() {
    let (ee, desc, ch) = error_over_malloc("vb_ee_qd");
    let mut i = Injection::of(ErrorType::Failure, 1);
    i.queue_depth = 2;
    error::inject(&ee, Some(IoType::Read), i).unwrap();
    assert!(run_one(&ch, IoRequest::read(0, 1, IoBuf::heap(512))).status.is_ok(), "queue depth 1 < 2");
    let c = Rc::new(Collect::default());
    for t in 0..3 {
        ch.submit(IoRequest::read(t, 1, IoBuf::heap(512)), c.clone(), t);
    }
    let got: Vec<IoStatus> = (0..3).map(|t| wait_for(&c, t).status).collect();
    assert_eq!(got, [IoStatus::Success, IoStatus::Success, IoStatus::Failed(libc::EIO)]);
    teardown(&ee, desc, ch);
}

#[test]
fn error_pending_holds_until_abort_or_reset_and_abort_passes_through_a_passthru() {
    let (ee, desc, ch) = error_over_malloc("vb_ee_pend");
    error::inject(&ee, Some(IoType::Read), Injection::of(ErrorType::Pending, 2)).unwrap();
    let c = Rc::new(Collect::default());
    for t in 0..3 {
        ch.submit(IoRequest::read(t, 1, IoBuf::heap(512)), c.clone(), t);
    }
    settle();
    assert_eq!(c.take(2).map(|x| x.status), Some(IoStatus::Success), "the third read passes");
    assert_eq!(c.len(), 0, "two reads are held");
    let a = Rc::new(Collect::default());
    ch.submit(IoRequest::abort(&c, 0), a.clone(), 100);
    assert_eq!(wait_for(&a, 100).status, IoStatus::Success);
    assert_eq!(wait_for(&c, 0).status, IoStatus::Aborted);
    ch.submit(IoRequest::abort(&c, 0), a.clone(), 101);
    assert_eq!(wait_for(&a, 101).status, IoStatus::Failed(libc::ENOENT), "nothing left to abort");
    assert_eq!(c.len(), 0);
    // A reset completes what is still held (instead of waiting for it forever).
    let r = run_one(&ch, IoRequest::no_payload(IoType::Reset, 0, 0));
    assert_eq!(r.status, IoStatus::Success);
    assert_eq!(wait_for(&c, 1).status, IoStatus::Aborted);
    // bdev_error_resume_pending's work: held I/Os go on to the base and succeed.
    error::inject(&ee, Some(IoType::Read), Injection::of(ErrorType::Pending, 1)).unwrap();
    ch.submit(IoRequest::read(9, 1, IoBuf::heap(512)), c.clone(), 60);
    settle();
    assert!(c.take(60).is_none());
    let id = error::disarm_pending(&ee).unwrap();
    assert_eq!(error::resume_pending_here(id), 1);
    assert_eq!(wait_for(&c, 60).status, IoStatus::Success);
    drop((ch, desc, r));
    // Through a passthru on top: the abort travels down and finds the held child.
    passthru::create(&ee, "vb_ee_pend_pt", None).unwrap();
    let pdesc = Bdev::open("vb_ee_pend_pt", true, || {}).unwrap();
    let pch = pdesc.channel().unwrap();
    error::inject(&ee, Some(IoType::Write), Injection::of(ErrorType::Pending, 1)).unwrap();
    pch.submit(IoRequest::write(5, 1, heap(&pattern(5, 512))), c.clone(), 50);
    settle();
    assert!(c.take(50).is_none(), "held below the passthru");
    pch.submit(IoRequest::abort(&c, 50), a.clone(), 102);
    assert_eq!(wait_for(&a, 102).status, IoStatus::Success);
    assert_eq!(wait_for(&c, 50).status, IoStatus::Aborted);
    drop((pch, pdesc));
    delete_and_wait("vb_ee_pend_pt");
    eventually(|| lookup(&ee).unwrap().claimed_by().is_none(), "the passthru let go of the error bdev");
    delete_and_wait(&ee);
    delete_and_wait("vb_ee_pend_m");
}

#[test]
fn error_corrupt_data_flips_one_byte_of_writes_and_reads() {
    let (ee, desc, ch) = error_over_malloc("vb_ee_corrupt");
    let data = pattern(20, 1024);
    let mut i = Injection::of(ErrorType::CorruptData, 1);
    (i.corrupt_offset, i.corrupt_value) = (700, 0x5a);
    error::inject(&ee, Some(IoType::Write), i).unwrap();
    let mut w = IoRequest::new(IoType::Write, 4, 2);
    w.bufs.push(heap(&data[..600]));
    w.bufs.push(heap(&data[600..]));
    let c = run_one(&ch, w);
    assert!(c.status.is_ok());
    assert_bytes_eq(&payload(&c), &data, "the caller's write buffers are left alone");
    let mut want = data.clone();
    want[700] ^= 0x5a;
    let r = run_one(&ch, IoRequest::read(4, 2, IoBuf::heap(1024)));
    assert_bytes_eq(&payload(&r), &want, "the write landed with one byte flipped");
    write_read_back(&ch, 4, &data, &[1024], &[1024]);
    // Reads: flipped on the way up, once; the disk keeps the right data.
    (i.corrupt_offset, i.corrupt_value) = (513, 0x0f);
    error::inject(&ee, Some(IoType::Read), i).unwrap();
    let r = run_one(&ch, IoRequest::read(4, 2, IoBuf::heap(1024)));
    let mut want = data.clone();
    want[513] ^= 0x0f;
    assert_bytes_eq(&payload(&r), &want, "a corrupted read");
    let r = run_one(&ch, IoRequest::read(4, 2, IoBuf::heap(1024)));
    assert_bytes_eq(&payload(&r), &data, "the next read is clean");
    // A zero-copy read gets a corrupted copy, never a change to the base's memory.
    error::inject(&ee, Some(IoType::Read), i).unwrap();
    let r = run_one(&ch, IoRequest::read_zcopy(4, 2));
    assert_bytes_eq(&payload(&r), &want, "a corrupted zero-copy read");
    let r = run_one(&ch, IoRequest::read_zcopy(4, 2));
    assert_bytes_eq(&payload(&r), &data, "the base's memory is intact");
    // An offset past the payload corrupts nothing.
    i.corrupt_offset = 5000;
    error::inject(&ee, Some(IoType::Read), i).unwrap();
    let r = run_one(&ch, IoRequest::read(4, 2, IoBuf::heap(1024)));
    assert_bytes_eq(&payload(&r), &data, "offset beyond the payload");
    drop((c, r));
    teardown(&ee, desc, ch);
}

#[test]
fn error_nomem_is_retried_by_the_layer_until_it_succeeds() {
    let (ee, desc, ch) = error_over_malloc("vb_ee_nomem");
    let base = lookup("vb_ee_nomem_m").unwrap();
    let before = ferrite_bdev::channel::local_iostat(base.id()).num_write_ops;
    error::inject(&ee, Some(IoType::Write), Injection::of(ErrorType::NoMem, 3)).unwrap();
    let data = pattern(30, 512);
    let c = run_one(&ch, IoRequest::write(2, 1, heap(&data)));
    assert_eq!(c.status, IoStatus::Success, "the caller sees success");
    assert_eq!(ferrite_bdev::channel::local_iostat(base.id()).num_write_ops, before + 1, "the base got one write");
    let st = ferrite_bdev::channel::local_iostat(lookup(&ee).unwrap().id());
    assert_eq!(st.io_errors, 0, "NoMem is no error: {st:?}");
    // All three injections were used: the next write goes straight through.
    write_read_back(&ch, 2, &data, &[512], &[512]);
    assert_eq!(ferrite_bdev::channel::local_iostat(base.id()).num_write_ops, before + 2);
    drop(c);
    teardown(&ee, desc, ch);
}
