//! The request contract: splitting and bouncing against random limits and segment layouts
//! (every byte lands where it should, and no request a module gets breaks its limits), NoMem
//! retried with nothing else in flight, resets that wait only for earlier requests, abort,
//! compare and compare-and-write. These run on the test thread without reactors (completions
//! are driven with `run_deferred`), with test modules written for the purpose: no real module
//! can be told to hold, fail or refuse a request on cue.

mod common;

use common::*;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, DiffOffset, IoBufs,
    IoRequest, IoStatus, IoType, IoTypes, Limits,
};
use ferrite_reactor::{IoBuf, Lender};
use proptest::prelude::*;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A RAM disk module that checks every request it gets against its limits.
struct Shaped {
    mem: Arc<Mutex<Vec<u8>>>,
    limits: Limits,
    bs: u32,
    violations: Arc<Mutex<Vec<String>>>,
    submits: Arc<AtomicU64>,
}

struct ShapedChannel {
    mem: Arc<Mutex<Vec<u8>>>,
    limits: Limits,
    bs: u32,
    violations: Arc<Mutex<Vec<String>>>,
    submits: Arc<AtomicU64>,
}

impl ShapedChannel {
    fn violations_of(&self, io: &BdevIo) -> Vec<String> {
        let l = &self.limits;
        let r = &io.req;
        let mut v = Vec::new();
        let (start, n) = (r.offset_blocks, r.num_blocks);
        if r.io_type.has_payload() {
            if l.max_io_blocks > 0 && n > l.max_io_blocks as u64 {
                v.push(format!("{n} blocks > max {}", l.max_io_blocks));
            }
            let unit = if l.split_on_write_unit { l.write_unit_size.max(1) as u64 } else { 0 };
            if r.io_type == IoType::Write && unit > 0 {
                if start % unit != 0 || n != unit {
                    v.push(format!("write [{start}, +{n}) is not one write unit of {unit}"));
                }
            } else if l.split_on_optimal_io_boundary && l.optimal_io_boundary > 0 {
                let b = l.optimal_io_boundary as u64;
                if start / b != (start + n - 1) / b {
                    v.push(format!("[{start}, +{n}) crosses the boundary {b}"));
                }
            }
            if l.max_segments > 0 && r.bufs.len() > l.max_segments as usize {
                v.push(format!("{} segments > max {}", r.bufs.len(), l.max_segments));
            }
            for b in &r.bufs {
                if l.max_segment_size > 0 && b.len() > l.max_segment_size as usize {
                    v.push(format!("segment of {} > max {}", b.len(), l.max_segment_size));
                }
                if !(b.as_ptr() as usize).is_multiple_of(l.buf_align as usize) {
                    v.push(format!("segment at {:p} breaks alignment {}", b.as_ptr(), l.buf_align));
                }
                if !b.len().is_multiple_of(l.seg_len_align as usize) {
                    v.push(format!("segment of {} breaks the length rule {}", b.len(), l.seg_len_align));
                }
            }
            if r.payload_len() as u64 != n * self.bs as u64 {
                v.push(format!("payload {} for {n} blocks", r.payload_len()));
            }
        }
        let max_unmap = l.max_unmap_blocks * l.max_unmap_segments.max(1) as u64;
        if r.io_type == IoType::Unmap && max_unmap > 0 && n > max_unmap {
            v.push(format!("unmap of {n} > max {max_unmap}"));
        }
        if r.io_type == IoType::Copy && l.max_copy_blocks > 0 && n > l.max_copy_blocks {
            v.push(format!("copy of {n} > max {}", l.max_copy_blocks));
        }
        v
    }
}

impl BackendChannel for ShapedChannel {
    fn submit(&mut self, mut io: BdevIo) {
        self.submits.fetch_add(1, Ordering::Relaxed);
        let v = self.violations_of(&io);
        self.violations.lock().unwrap().extend(v);
        let off = io.offset_bytes() as usize;
        let len = io.len_bytes() as usize;
        let mut mem = self.mem.lock().unwrap();
        match io.req.io_type {
            IoType::Read => {
                let mut pos = off;
                for b in io.req.bufs.iter_mut() {
                    let n = b.len();
                    b.copy_from_slice(&mem[pos..pos + n]);
                    pos += n;
                }
            }
            IoType::Write => {
                let mut pos = off;
                for b in io.req.bufs.iter() {
                    mem[pos..pos + b.len()].copy_from_slice(b);
                    pos += b.len();
                }
            }
            IoType::Unmap | IoType::WriteZeroes => mem[off..off + len].fill(0),
            IoType::Copy => {
                let Some(src) = (match io.req.aux {
                    ferrite_bdev::IoAux::CopyFrom(s) => Some(s * self.bs as u64),
                    _ => None,
                }) else {
                    panic!("a copy names its source")
                };
                mem.copy_within(src as usize..src as usize + len, off);
            }
            _ => {}
        }
        drop(mem);
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for Shaped {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(ShapedChannel {
            mem: self.mem.clone(),
            limits: self.limits,
            bs: self.bs,
            violations: self.violations.clone(),
            submits: self.submits.clone(),
        }))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn props(name: &str, bs: u32, num_blocks: u64, io_types: IoTypes, limits: Limits) -> BdevProps {
    BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: bs,
        num_blocks,
        product_name: "Test disk",
        module: "test",
        io_types,
        limits,
    }
}

/// Segments over `data` with the given lengths, each placed at `skew` bytes past an aligned
/// start inside its own backing vector (so addresses break alignment when skew > 0). Writable
/// external memory, kept alive by the segment.
fn segments(data: &[u8], lens: &[usize], skews: &[usize]) -> IoBufs {
    let mut pos = 0;
    lens.iter()
        .zip(skews.iter().cycle())
        .map(|(&n, &skew)| {
            let mut backing = vec![0u8; n + skew + 4096];
            let base = backing.as_mut_ptr() as usize;
            let start = base.next_multiple_of(4096) - base + skew;
            backing[start..start + n].copy_from_slice(&data[pos..pos + n]);
            pos += n;
            let backing = Rc::new(RefCell::new(backing));
            let ptr = NonNull::new(unsafe { backing.borrow_mut().as_mut_ptr().add(start) }).unwrap();
            // SAFETY: `ptr` is valid for n bytes for as long as the lender keeps `backing`.
            unsafe { IoBuf::external(ptr, n, Rc::new(Lender::new(backing))) }
        })
        .collect()
}

/// Splits `total` into lengths given by the cut points `cuts` (each in 1..total).
fn lens_from_cuts(total: usize, cuts: &[usize]) -> Vec<usize> {
    let mut c: Vec<usize> = cuts.iter().map(|x| 1 + x % (total.max(2) - 1)).filter(|&x| x < total).collect();
    c.sort_unstable();
    c.dedup();
    let mut out = Vec::new();
    let mut prev = 0;
    for x in c.into_iter().chain(std::iter::once(total)) {
        out.push(x - prev);
        prev = x;
    }
    out
}

fn limits_strategy() -> impl Strategy<Value = Limits> {
    (
        (
            prop_oneof![Just(1u32), Just(8), Just(512)],
            prop_oneof![Just(1u32), Just(8), Just(512)],
            prop_oneof![Just(0u32), 1u32..9],
            prop_oneof![Just(0u32), Just(4), Just(8)],
            prop_oneof![Just(0u32), 1u32..5],
            0u32..4,
        ),
        (
            prop_oneof![Just(0u64), 1u64..6],
            prop_oneof![Just(0u32), 1u32..4],
            prop_oneof![Just(0u32), Just(2), Just(4)],
            prop_oneof![Just(0u64), 1u64..6],
        ),
    )
        .prop_map(
            |(
                (buf_align, seg_len_align, max_io_blocks, boundary, max_segments, seg_blocks),
                (max_unmap_blocks, max_unmap_segments, write_unit, max_copy_blocks),
            )| {
                let mut l = Limits {
                    buf_align,
                    seg_len_align,
                    max_io_blocks,
                    optimal_io_boundary: boundary,
                    split_on_optimal_io_boundary: boundary > 0,
                    max_segments,
                    max_segment_size: seg_blocks, // scaled by the block size below
                    max_unmap_blocks,
                    max_unmap_segments,
                    write_unit_size: write_unit,
                    split_on_write_unit: write_unit > 0,
                    max_copy_blocks,
                    ..Limits::default()
                };
                // What registration refuses: a write unit that no child could carry.
                if write_unit > 0 {
                    if l.max_io_blocks > 0 {
                        l.max_io_blocks = l.max_io_blocks.max(write_unit);
                    }
                    if l.max_segments > 0 && l.max_segment_size > 0 && l.max_segments * l.max_segment_size < write_unit
                    {
                        l.max_segment_size = 0;
                    }
                }
                l
            },
        )
}

static CASE: AtomicUsize = AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Writes and reads through random segment layouts under random limits land every byte
    /// where it belongs, and the module never gets a request that breaks its limits; also
    /// through a passthru, whose layer fits the request before forwarding it (so the base's
    /// layer finds nothing left to do, and a bounce is undone by the layer that made it).
    #[test]
    fn split_and_bounce_put_every_byte_in_place(
        limits in limits_strategy(),
        through_passthru in any::<bool>(),
        bs in prop_oneof![Just(512u32), Just(1536), Just(4096)],
        ops in proptest::collection::vec((0u64..48, 1u64..16, proptest::collection::vec(0usize..100_000, 0..6),
            proptest::collection::vec(0usize..9, 1..4), 0u8..4, any::<u8>()), 1..8),
    ) {
        const BLOCKS: u64 = 64;
        let mut limits = limits;
        limits.max_segment_size *= bs;
        let name = format!("contract_split_{}", CASE.fetch_add(1, Ordering::Relaxed));
        let mem = Arc::new(Mutex::new(vec![0u8; (BLOCKS * bs as u64) as usize]));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let backend = Shaped { mem: mem.clone(), limits, bs, violations: violations.clone(), submits: Arc::default() };
        let all = IoTypes::of(&[IoType::Read, IoType::Write, IoType::Unmap, IoType::Copy]);
        register(props(&name, bs, BLOCKS, all, limits), Arc::new(backend)).unwrap();
        let top = if through_passthru {
            let pt = format!("{name}_pt");
            ferrite_modules::passthru::create(&name, &pt, None).unwrap();
            pt
        } else {
            name.clone()
        };
        let desc = Bdev::open(&top, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let mut model = vec![0u8; (BLOCKS * bs as u64) as usize];
        let unit = if limits.split_on_write_unit { limits.write_unit_size.max(1) as u64 } else { 1 };
        for (i, (off, n, cuts, skews, kind, seed)) in ops.into_iter().enumerate() {
            let n = n.min(BLOCKS - off);
            let (o, len) = ((off * bs as u64) as usize, (n * bs as u64) as usize);
            if kind == 1 {
                let c = run_one(&ch, IoRequest::no_payload(IoType::Unmap, off, n));
                prop_assert_eq!(c.status, IoStatus::Success);
                model[o..o + len].fill(0);
                continue;
            }
            if kind == 2 {
                // Copy from lower blocks, the ranges apart (the model copies as the children do,
                // in order, which is the same then).
                let src = (seed as u64) % (off + 1);
                let n = n.min(off - src);
                if n == 0 {
                    continue;
                }
                let c = run_one(&ch, IoRequest::copy(off, src, n));
                prop_assert_eq!(c.status, IoStatus::Success);
                let step = if limits.max_copy_blocks > 0 { limits.max_copy_blocks } else { n };
                let mut done = 0;
                while done < n {
                    let k = step.min(n - done);
                    let (from, to) = (((src + done) * bs as u64) as usize, ((off + done) * bs as u64) as usize);
                    model.copy_within(from..from + (k * bs as u64) as usize, to);
                    done += k;
                }
                continue;
            }
            let data = pattern(seed as u64 * 1000 + i as u64, len);
            let lens = lens_from_cuts(len, &cuts);
            let mut w = IoRequest::new(IoType::Write, off, n);
            w.bufs = segments(&data, &lens, &skews);
            let c = run_one(&ch, w);
            if off % unit != 0 || n % unit != 0 {
                prop_assert_eq!(c.status, IoStatus::Misaligned, "a write of part of a unit fails");
                continue;
            }
            prop_assert_eq!(c.status, IoStatus::Success, "write of {} blocks at {} in {:?}", n, off, lens);
            model[o..o + len].copy_from_slice(&data);
            // Read the same range back through another layout.
            let mut r = IoRequest::new(IoType::Read, off, n);
            let rlens = lens_from_cuts(len, &cuts.iter().map(|c| c / 3 + 7).collect::<Vec<_>>());
            r.bufs = segments(&vec![0xee; len], &rlens, &[skews[0] + 1]);
            let c = run_one(&ch, r);
            prop_assert_eq!(c.status, IoStatus::Success);
            let got: Vec<u8> = c.req.bufs.iter().flat_map(|b| b.iter().copied()).collect();
            prop_assert!(got == data, "read back differs ({:?} / {:?} under {:?})", lens, rlens, limits);
        }
        prop_assert!(*mem.lock().unwrap() == model, "the disk differs from the model");
        let v = violations.lock().unwrap().clone();
        prop_assert!(v.is_empty(), "limits broken: {:?} under {:?}", v, limits);
        drop(ch);
        drop(desc);
        if through_passthru {
            unregister(&top, None).unwrap();
        }
        unregister(&name, None).unwrap();
    }
}

/// A large request is split on the optimal I/O boundary of a real malloc bdev and the data is
/// the same as written unsplit.
#[test]
fn malloc_with_an_optimal_io_boundary_splits_and_keeps_data() {
    use ferrite_modules::malloc::{self, MallocOpts};
    let b = malloc::create(MallocOpts {
        name: Some("contract_malloc_boundary".into()),
        num_blocks: 256,
        block_size: 512,
        optimal_io_boundary: Some(16),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(b.limits().optimal_io_boundary, 16);
    let desc = Bdev::open(b.name(), true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(9, 100 * 512);
    let c = run_one(&ch, IoRequest::write(7, 100, IoBuf::heap(0)).with_flags(Default::default()));
    assert_eq!(c.status, IoStatus::Misaligned, "payload checked before anything");
    let mut w = IoRequest::new(IoType::Write, 7, 100);
    w.bufs = segments(&data, &[1000, 50_200], &[3]);
    assert!(run_one(&ch, w).status.is_ok());
    let mut r = IoRequest::new(IoType::Read, 7, 100);
    r.bufs.push(IoBuf::heap(100 * 512));
    let c = run_one(&ch, r);
    assert!(c.status.is_ok());
    assert_bytes_eq(&c.req.bufs[0], &data, "read after a split write");
    drop((ch, desc));
    unregister("contract_malloc_boundary", None).unwrap();
}

thread_local! {
    /// Requests held by the `Holding` module of this thread, and the abort calls it got.
    static HELD: RefCell<Vec<BdevIo>> = const { RefCell::new(Vec::new()) };
    static SEEN: RefCell<Vec<IoType>> = const { RefCell::new(Vec::new()) };
}

/// A module that holds every request until the test completes it, answers NoMem to the first
/// `nomem` submissions, and can abort what it holds.
struct Holding {
    nomem: Arc<AtomicU64>,
}

struct HoldingChannel {
    nomem: Arc<AtomicU64>,
}

impl BackendChannel for HoldingChannel {
    fn submit(&mut self, io: BdevIo) {
        SEEN.with(|s| s.borrow_mut().push(io.req.io_type));
        if self.nomem.load(Ordering::Relaxed) > 0 {
            self.nomem.fetch_sub(1, Ordering::Relaxed);
            io.complete_deferred(IoStatus::NoMem);
            return;
        }
        HELD.with(|h| h.borrow_mut().push(io));
    }

    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        let victims: Vec<BdevIo> = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let (v, keep): (Vec<_>, Vec<_>) = h.drain(..).partition(|io| named(io));
            *h = keep;
            v
        });
        let n = victims.len();
        for v in victims {
            v.complete_deferred(IoStatus::Aborted);
        }
        n
    }
}

impl BdevBackend for Holding {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(HoldingChannel { nomem: self.nomem.clone() }))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn holding(name: &str, nomem: u64) -> (Arc<AtomicU64>, ferrite_bdev::BdevDesc) {
    let n = Arc::new(AtomicU64::new(nomem));
    let types = IoTypes::of(&[IoType::Read, IoType::Write, IoType::Reset]);
    register(props(name, 512, 1024, types, Limits::default()), Arc::new(Holding { nomem: n.clone() })).unwrap();
    (n, Bdev::open(name, true, || {}).unwrap())
}

fn release_held(offset: u64) {
    let io = HELD.with(|h| {
        let mut h = h.borrow_mut();
        let i = h.iter().position(|io| io.req.offset_blocks == offset).expect("held request");
        h.remove(i)
    });
    io.complete_deferred(IoStatus::Success);
}

/// NoMem from the module with nothing else in flight on the channel: the layer retries on its
/// own (no completion will come to trigger it), and the caller sees one success.
#[test]
fn nomem_is_retried_with_nothing_in_flight() {
    let (_, desc) = holding("contract_nomem", 3);
    let ch = desc.channel().unwrap();
    let c = Rc::new(Collect::default());
    ch.submit(IoRequest::read(5, 1, IoBuf::heap(512)), c.clone(), 1);
    settle();
    assert!(c.take(1).is_none(), "NoMem never reaches the caller");
    assert_eq!(SEEN.with(|s| s.borrow().len()), 4, "three NoMem answers, then held");
    // Submitted after the NoMem ones: queued behind them, not ahead.
    ch.submit(IoRequest::read(6, 1, IoBuf::heap(512)), c.clone(), 2);
    settle();
    release_held(5);
    release_held(6);
    settle();
    assert_eq!(c.take(1).unwrap().status, IoStatus::Success);
    assert_eq!(c.take(2).unwrap().status, IoStatus::Success);
    SEEN.with(|s| s.borrow_mut().clear());
    drop((ch, desc));
    unregister("contract_nomem", None).unwrap();
}

/// A write the module answered NoMem for no longer counts as with the module, so a range lock
/// taken meanwhile does not wait for it: its retry must then wait for the lock, and reach the
/// module only once the lock is gone. On a reactor (off the reactors a lock has no drain).
#[test]
fn a_write_retried_after_nomem_waits_for_a_lock_taken_meanwhile() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let e = engine(1, ferrite_reactor::ReactorMode::Poll);
    run(&e, 0, || async {
        let (_, desc) = holding("contract_nomem_lock", 1);
        let ch = desc.channel().unwrap();
        let c = Rc::new(Collect::default());
        ch.submit(IoRequest::write(5, 1, IoBuf::heap(512)), c.clone(), 1);
        let bdev = desc.bdev().clone();
        let mut lock = Box::pin(bdev.lock_lba_range(0, 8));
        let mut cx = Context::from_waker(Waker::noop());
        let held = loop {
            if let Poll::Ready(l) = lock.as_mut().poll(&mut cx) {
                break l;
            }
            ferrite_reactor::next_turn().await;
        };
        // Long enough for many NoMem retries (every 100 µs) to have come and gone.
        ferrite_reactor::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(SEEN.with(|s| s.borrow().len()), 1, "the retried write waits for the lock");
        assert!(c.take(1).is_none());
        drop(held);
        for _ in 0..50 {
            ferrite_reactor::next_turn().await;
        }
        assert_eq!(SEEN.with(|s| s.borrow().len()), 2, "the write reaches the module once the lock is gone");
        release_held(5);
        for _ in 0..50 {
            ferrite_reactor::next_turn().await;
        }
        assert_eq!(c.take(1).unwrap().status, IoStatus::Success);
        SEEN.with(|s| s.borrow_mut().clear());
        drop((ch, desc));
        unregister("contract_nomem_lock", None).unwrap();
    });
    shutdown(e);
}

/// A reset waits only for the requests handed to the module before it: it reaches the module
/// while requests submitted after it are still outstanding, so steady load cannot starve it.
#[test]
fn reset_waits_only_for_earlier_requests() {
    let (_, desc) = holding("contract_reset", 0);
    let ch = desc.channel().unwrap();
    let c = Rc::new(Collect::default());
    ch.submit(IoRequest::read(1, 1, IoBuf::heap(512)), c.clone(), 1);
    ch.submit(IoRequest::no_payload(IoType::Reset, 0, 0), c.clone(), 100);
    for i in 2..10 {
        ch.submit(IoRequest::read(i, 1, IoBuf::heap(512)), c.clone(), i);
    }
    settle();
    assert!(!SEEN.with(|s| s.borrow().contains(&IoType::Reset)), "the reset waits for the earlier read");
    release_held(1);
    settle();
    assert!(SEEN.with(|s| s.borrow().contains(&IoType::Reset)), "the reset reached the module");
    let held = HELD.with(|h| h.borrow().iter().map(|io| io.req.io_type).collect::<Vec<_>>());
    assert!(held.contains(&IoType::Reset) && held.len() == 9, "the later reads are still outstanding: {held:?}");
    HELD.with(|h| h.borrow_mut().drain(..).collect::<Vec<_>>()).into_iter().for_each(|io| {
        io.complete_deferred(IoStatus::Success);
    });
    settle();
    assert_eq!(c.take(100).unwrap().status, IoStatus::Success);
    SEEN.with(|s| s.borrow_mut().clear());
    drop((ch, desc));
    unregister("contract_reset", None).unwrap();
}

/// Abort stops a request the module holds and one that waits in the layer (after NoMem); an
/// abort that names nothing fails.
#[test]
fn abort_stops_held_and_queued_requests() {
    let (nomem, desc) = holding("contract_abort", 0);
    let ch = desc.channel().unwrap();
    let c = Rc::new(Collect::default());
    ch.submit(IoRequest::read(1, 1, IoBuf::heap(512)), c.clone(), 1);
    nomem.store(1_000_000, Ordering::Relaxed);
    ch.submit(IoRequest::read(2, 1, IoBuf::heap(512)), c.clone(), 2);
    settle();
    let a = Rc::new(Collect::default());
    ch.submit(IoRequest::abort(&c, 1), a.clone(), 11);
    ch.submit(IoRequest::abort(&c, 2), a.clone(), 12);
    ch.submit(IoRequest::abort(&c, 99), a.clone(), 13);
    settle();
    assert_eq!(c.take(1).unwrap().status, IoStatus::Aborted, "held by the module");
    assert_eq!(c.take(2).unwrap().status, IoStatus::Aborted, "queued after NoMem");
    assert_eq!(a.take(11).unwrap().status, IoStatus::Success);
    assert_eq!(a.take(12).unwrap().status, IoStatus::Success);
    assert_eq!(a.take(13).unwrap().status, IoStatus::Failed(libc::ENOENT));
    nomem.store(0, Ordering::Relaxed);
    SEEN.with(|s| s.borrow_mut().clear());
    drop((ch, desc));
    unregister("contract_abort", None).unwrap();
}

/// Compare and compare-and-write on a malloc bdev (done by the layer): equal data passes, and
/// a compare-and-write that miscompares writes nothing.
#[test]
fn compare_and_compare_and_write() {
    use ferrite_modules::malloc::{self, MallocOpts};
    let b = malloc::create(MallocOpts {
        name: Some("contract_compare".into()),
        num_blocks: 64,
        block_size: 512,
        ..Default::default()
    })
    .unwrap();
    assert!(b.supports(IoType::Compare) && b.supports(IoType::CompareAndWrite));
    let desc = Bdev::open(b.name(), true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let old = pattern(1, 1024);
    let new = pattern(2, 1024);
    let heap = |d: &[u8]| {
        let mut b = IoBuf::heap(d.len());
        b.copy_from_slice(d);
        b
    };
    assert!(run_one(&ch, IoRequest::write(4, 2, heap(&old))).status.is_ok());
    assert_eq!(run_one(&ch, IoRequest::compare(4, 2, heap(&old))).status, IoStatus::Success);
    let at = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y).map(|p| p as u64);
    let miscompare_at = |o: Option<u64>| IoStatus::Miscompare { offset: DiffOffset::at(o.unwrap()) };
    assert_eq!(run_one(&ch, IoRequest::compare(4, 2, heap(&new))).status, miscompare_at(at(&old, &new)));
    let c = run_one(&ch, IoRequest::compare_and_write(4, 2, heap(&new), heap(&new)));
    assert_eq!(c.status, miscompare_at(at(&old, &new)));
    // The first differing byte, counted across segments (SCSI's sense INFORMATION field).
    let mut near = old.clone();
    near[700] ^= 0xff;
    near[900] ^= 0xff;
    let two = IoRequest::compare(4, 2, heap(&near[..512])).with_buf(heap(&near[512..]));
    assert_eq!(run_one(&ch, two).status, miscompare_at(Some(700)));
    let mut cmp = smallvec::smallvec![heap(&near[..300]), heap(&near[300..])];
    let mut caw = IoRequest::compare_and_write(4, 2, heap(&old), heap(&new));
    if let ferrite_bdev::IoAux::Compare(c) = &mut caw.aux {
        std::mem::swap(&mut **c, &mut cmp);
    }
    assert_eq!(run_one(&ch, caw).status, miscompare_at(Some(700)), "compare-and-write says where too");
    assert_eq!(run_one(&ch, IoRequest::compare(4, 2, heap(&old))).status, IoStatus::Success, "nothing written");
    let c = run_one(&ch, IoRequest::compare_and_write(4, 2, heap(&old), heap(&new)));
    assert_eq!(c.status, IoStatus::Success);
    let r = run_one(&ch, IoRequest::read(4, 2, IoBuf::heap(1024)));
    assert_bytes_eq(&r.req.bufs[0], &new, "after compare-and-write");
    let st = ferrite_bdev::channel::local_iostat(b.id());
    assert_eq!(st.errors[2], 4, "the miscompares counted as such");
    drop((ch, desc, r));
    unregister("contract_compare", None).unwrap();
}
