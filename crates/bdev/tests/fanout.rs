//! The public fan-out (`ferrite_bdev::FanOut`): one parent carried out as children on several
//! bdevs, every child's status reported once all are done, children slicing the parent's
//! scatter-gather list. A caller's fan-out (a target's command) and a module's own (a toy
//! mirror module, as RAID1 would be), with children failing and completing out of order.

mod common;

use common::{assert_bytes_eq, bufs_from, engine, io_ok, pattern, run, shutdown};
use ferrite_bdev::io::IoBufs;
use ferrite_bdev::{
    register, BackendChannel, Bdev, BdevBackend, BdevDesc, BdevError, BdevIo, BdevProps, FanOut, FanOutCompleter,
    FanOutDone, IoChannel, IoRequest, IoStatus, IoType, IoTypes, Limits,
};
use ferrite_modules::{delay, error, malloc};
use ferrite_reactor::{IoBuf, ReactorMode};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

fn make_malloc(name: &str, blocks: u64) {
    let opts =
        malloc::MallocOpts { name: Some(name.into()), num_blocks: blocks, block_size: 512, ..Default::default() };
    malloc::create(opts).unwrap();
}

/// Waits for one caller fan-out's end, and counts how often it was told.
#[derive(Default)]
struct Wait {
    done: RefCell<Option<FanOutDone>>,
    calls: RefCell<u32>,
    waker: RefCell<Option<Waker>>,
}

impl FanOutCompleter for Wait {
    fn fan_out_done(&self, tag: u64, done: FanOutDone) {
        assert_eq!(tag, 42);
        *self.calls.borrow_mut() += 1;
        *self.done.borrow_mut() = Some(done);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

struct WaitFuture(Rc<Wait>);

impl Future for WaitFuture {
    type Output = FanOutDone;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FanOutDone> {
        match self.0.done.borrow_mut().take() {
            Some(d) => Poll::Ready(d),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Runs a caller fan-out: `children` are (channel, request, payload bytes), in order.
async fn fan_out(bufs: IoBufs, children: Vec<(IoChannel, IoRequest, std::ops::Range<usize>)>) -> FanOutDone {
    let w = Rc::new(Wait::default());
    let fan = FanOut::for_caller(bufs, w.clone(), 42);
    for (i, (ch, req, bytes)) in children.into_iter().enumerate() {
        assert_eq!(fan.submit(&ch, req, bytes), i, "children are numbered in submission order");
    }
    fan.finish();
    assert!(w.done.borrow().is_none(), "the parent heard inside the submission");
    let d = WaitFuture(w.clone()).await;
    // Give late, duplicate calls a chance to show.
    ferrite_reactor::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(*w.calls.borrow(), 1, "the parent hears exactly once");
    d
}

fn concat(bufs: &IoBufs) -> Vec<u8> {
    bufs.iter().flat_map(|b| b.to_vec()).collect()
}

#[test]
fn a_caller_fan_out_reports_every_childs_status_and_slices_its_payload() {
    let e = engine(1, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("fo_m1", 64);
        make_malloc("fo_m2", 64);
        // A slow child (delay) and a failing one (error): completions come out of order.
        let lat = delay::Latencies { avg_read: 3000, avg_write: 3000, p99_read: 3000, p99_write: 3000 };
        delay::create("fo_m1", "fo_d", None, lat).unwrap();
        error::create("fo_m2", None).unwrap();
        let slow = Bdev::open("fo_d", true, || {}).unwrap();
        let failing = Bdev::open("EE_fo_m2", true, || {}).unwrap();
        let (sc, fc) = (slow.channel().unwrap(), failing.channel().unwrap());

        // A mirrored write of 8 blocks from three odd segments; the error bdev fails its copy.
        let data = pattern(1, 4096);
        let lens = [700, 1300, 2096];
        error::inject("EE_fo_m2", Some(IoType::Write), error::Injection::of(error::ErrorType::Failure, 1)).unwrap();
        let d = fan_out(
            bufs_from(&data, &lens),
            vec![
                (sc.clone(), IoRequest::new(IoType::Write, 8, 8), 0..4096),
                (fc.clone(), IoRequest::new(IoType::Write, 8, 8), 0..4096),
            ],
        )
        .await;
        assert_eq!(d.statuses.as_slice(), &[IoStatus::Success, IoStatus::Failed(libc::EIO)]);
        assert_eq!(d.first_failure(), IoStatus::Failed(libc::EIO));
        assert_eq!(d.succeeded(), 1);
        assert_eq!(d.bufs.iter().map(|b| b.len()).collect::<Vec<_>>(), lens, "the caller's segments come back whole");
        assert_bytes_eq(&concat(&d.bufs), &data, "the caller's payload is untouched");
        assert_bytes_eq(&io_ok(&sc, IoRequest::read(8, 8, IoBuf::heap(4096))).await, &data, "the mirror copy");

        // Again without the failure: both copies land.
        let d = fan_out(
            bufs_from(&data, &lens),
            vec![
                (sc.clone(), IoRequest::new(IoType::Write, 8, 8), 0..4096),
                (fc.clone(), IoRequest::new(IoType::Write, 8, 8), 0..4096),
            ],
        )
        .await;
        assert_eq!(d.statuses.as_slice(), &[IoStatus::Success, IoStatus::Success]);
        assert_bytes_eq(&io_ok(&fc, IoRequest::read(8, 8, IoBuf::heap(4096))).await, &data, "the second copy");

        // A striped read into one parent list: blocks 8..11 from the slow child into bytes
        // 0..1536, blocks 11..16 from the fast one into the rest; the fast one ends first.
        let out = bufs_from(&[0xeeu8; 4096], &lens);
        let d = fan_out(
            out,
            vec![
                (sc.clone(), IoRequest::new(IoType::Read, 8, 3), 0..1536),
                (fc.clone(), IoRequest::new(IoType::Read, 11, 5), 1536..4096),
            ],
        )
        .await;
        assert_eq!(d.first_failure(), IoStatus::Success);
        assert_bytes_eq(&concat(&d.bufs), &data, "both stripes landed in the parent's segments");

        // Payload-free children (a multi-range unmap) and a failure among them.
        error::inject("EE_fo_m2", Some(IoType::Unmap), error::Injection::of(error::ErrorType::Failure, 1)).unwrap();
        let d = fan_out(
            IoBufs::new(),
            vec![
                (fc.clone(), IoRequest::new(IoType::Unmap, 0, 1), 0..0),
                (fc.clone(), IoRequest::new(IoType::Unmap, 9, 2), 0..0),
                (sc.clone(), IoRequest::new(IoType::Unmap, 30, 2), 0..0),
            ],
        )
        .await;
        assert_eq!(d.statuses.len(), 3);
        assert_eq!(d.statuses.iter().filter(|s| !s.is_ok()).count(), 1, "{:?}", d.statuses);
        // A child refused by the layer (beyond the end) has its own status; others go on.
        let d = fan_out(
            IoBufs::new(),
            vec![
                (sc.clone(), IoRequest::new(IoType::Unmap, 0, 1), 0..0),
                (sc.clone(), IoRequest::new(IoType::Unmap, 1000, 1), 0..0),
            ],
        )
        .await;
        assert_eq!(d.statuses.as_slice(), &[IoStatus::Success, IoStatus::OutOfRange]);
        // No children: the parent still hears, on a later turn.
        let d = fan_out(IoBufs::new(), vec![]).await;
        assert!(d.statuses.is_empty() && d.first_failure().is_ok());
        drop((sc, fc, slow, failing));
        for (n, m) in [("fo_d", delay::MODULE), ("EE_fo_m2", error::MODULE)] {
            ferrite_modules::passthru::base::delete_vbdev(n, m).await.unwrap();
        }
        for n in ["fo_m1", "fo_m2"] {
            let _ = ferrite_bdev::unregister(n, None).unwrap().await;
        }
    });
    shutdown(e);
}

#[test]
fn reads_that_would_fill_the_same_bytes_are_refused() {
    // On the test's own thread (a reactor aborts on a panic): the layer runs without one.
    make_malloc("fo_ov", 16);
    let desc = Bdev::open("fo_ov", true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let w = Rc::new(Wait::default());
    let fan = FanOut::for_caller(bufs_from(&[0u8; 1024], &[1024]), w.clone(), 42);
    fan.submit(&ch, IoRequest::new(IoType::Read, 0, 1), 0..512);
    let overlapping = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fan.submit(&ch, IoRequest::new(IoType::Read, 1, 1), 256..768);
    }));
    let beyond = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fan.submit(&ch, IoRequest::new(IoType::Write, 1, 3), 0..1536);
    }));
    assert!(overlapping.is_err(), "a read overlapping an earlier read's bytes");
    assert!(beyond.is_err(), "a range beyond the parent's payload");
    fan.finish();
    common::settle();
    let d = w.done.borrow_mut().take().expect("the fan-out ended");
    assert_eq!(d.statuses.as_slice(), &[IoStatus::Success], "refused children were never submitted");
    drop((ch, desc));
    drop(ferrite_bdev::unregister("fo_ov", None).unwrap());
    common::settle();
}

// A toy mirror module, as a RAID1 would be built on the fan-out: writes go to every base,
// reads are striped across them block by block ranges; the parent fails with the first
// failure, and every child's status is recorded for the test to see.

static SEEN: Mutex<Vec<Vec<IoStatus>>> = Mutex::new(Vec::new());

struct Mirror {
    bases: Vec<BdevDesc>,
}

struct MirrorCh {
    bases: Vec<IoChannel>,
}

impl BdevBackend for Mirror {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let bases = self.bases.iter().map(|d| d.channel()).collect::<Result<_, _>>()?;
        Ok(Box::new(MirrorCh { bases }))
    }

    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn mirror_done(parent: BdevIo, done: FanOutDone) {
    SEEN.lock().unwrap().push(done.statuses.to_vec());
    parent.complete(done.first_failure());
}

impl BackendChannel for MirrorCh {
    fn submit(&mut self, io: BdevIo) {
        let (t, off, n) = (io.req.io_type, io.req.offset_blocks, io.req.num_blocks);
        let len = io.len_bytes() as usize;
        let fan = FanOut::for_io(io, mirror_done);
        match t {
            IoType::Write => {
                for ch in &self.bases {
                    fan.submit(ch, IoRequest::new(t, off, n), 0..len);
                }
            }
            IoType::Read => {
                // Block i comes from base i % bases, in one child per block.
                for i in 0..n {
                    let ch = &self.bases[(off + i) as usize % self.bases.len()];
                    let at = i as usize * 512;
                    fan.submit(ch, IoRequest::new(t, off + i, 1), at..at + 512);
                }
            }
            _ => {}
        }
    }
}

#[test]
fn a_module_fans_out_its_own_requests() {
    let e = engine(2, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("fo_a", 32);
        make_malloc("fo_b", 32);
        error::create("fo_b", None).unwrap();
        let bases = vec![Bdev::open("fo_a", true, || {}).unwrap(), Bdev::open("EE_fo_b", true, || {}).unwrap()];
        let props = BdevProps {
            name: "fo_mirror".into(),
            aliases: vec![],
            uuid: None,
            block_size: 512,
            num_blocks: 32,
            product_name: "test mirror",
            module: "test_mirror",
            io_types: IoTypes::of(&[IoType::Read, IoType::Write]),
            limits: Limits::default(),
        };
        register(props, Arc::new(Mirror { bases })).unwrap();
    });
    // From both cores, each its own blocks.
    for core in [0usize, 1] {
        run(&e, core, move || async move {
            let desc = Bdev::open("fo_mirror", true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            let a = Bdev::open("fo_a", false, || {}).unwrap().channel().unwrap();
            let data = pattern(core as u64, 2048);
            let at = core as u64 * 8;
            io_ok(&ch, IoRequest::write(at, 4, common::buf_from(&data))).await;
            assert_bytes_eq(&io_ok(&a, IoRequest::read(at, 4, IoBuf::heap(2048))).await, &data, "base a's copy");
            // Read back in two segments: four children, alternating bases, into the parent's list.
            let mut req = IoRequest::new(IoType::Read, at, 4);
            req.bufs = bufs_from(&[0u8; 2048], &[1000, 1048]);
            let c = common::io(&ch, req).await;
            assert_eq!(c.status, IoStatus::Success);
            assert_bytes_eq(&common::payload(&c), &data, "striped read through the mirror");
        });
    }
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    assert!(seen.contains(&vec![IoStatus::Success; 2]) && seen.contains(&vec![IoStatus::Success; 4]), "{seen:?}");
    // One base fails a write: the parent fails with it, and the module saw both statuses.
    run(&e, 1, || async {
        error::inject("EE_fo_b", Some(IoType::Write), error::Injection::of(error::ErrorType::Failure, 1)).unwrap();
        let desc = Bdev::open("fo_mirror", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let c = common::io(&ch, IoRequest::write(20, 1, common::buf_from(&[7u8; 512]))).await;
        assert_eq!(c.status, IoStatus::Failed(libc::EIO));
    });
    assert_eq!(SEEN.lock().unwrap().last(), Some(&vec![IoStatus::Success, IoStatus::Failed(libc::EIO)]));
    run(&e, 0, || async {
        let _ = ferrite_bdev::unregister("fo_mirror", None).unwrap().await;
    });
    shutdown(e);
}
