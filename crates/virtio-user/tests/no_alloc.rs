//! The virtio-user data path allocates nothing per I/O in steady state: a driver on the
//! reactor keeps 16 requests outstanding on a bdev attached to qemu-storage-daemon, each slot
//! resubmitting its request from its completion with the slot's own pool buffer. A global
//! allocator counts allocations per thread; the reactor's count is read before and after a run
//! of writes and a run of reads. Each slot writes only its own region, filled with its own
//! byte, and every read is checked against that byte.

mod common;

use common::*;
use ferrite_bdev::{Bdev, BdevDesc, Completed, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_reactor::ReactorMode;
use serde_json::json;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

const DEPTH: u64 = 16;
/// Blocks (of 512 B) each slot owns.
const REGION: u64 = 512;
const IO_BLOCKS: u64 = 8;

/// What the test thread reads of the driver.
#[derive(Default)]
struct Progress {
    done: AtomicU64,
    failed: AtomicU64,
    miscompared: AtomicU64,
}

/// Keeps `DEPTH` requests outstanding, each resubmitted from its completion.
struct Driver {
    ch: IoChannel,
    me: RefCell<Weak<Driver>>,
    /// Submissions still to make in this run.
    left: Cell<u64>,
    /// Requests each slot has made: its next offset walks its region.
    made: [Cell<u64>; DEPTH as usize],
    progress: Arc<Progress>,
}

impl Driver {
    fn next_offset(&self, slot: u64) -> u64 {
        let made = &self.made[slot as usize];
        made.set(made.get() + 1);
        slot * REGION + made.get() % (REGION / IO_BLOCKS) * IO_BLOCKS
    }

    fn submit(&self, slot: u64, mut req: IoRequest) {
        req.offset_blocks = self.next_offset(slot);
        let me: Rc<dyn IoCompleter> = self.me.borrow().upgrade().expect("the driver lives");
        self.ch.submit(req, me, slot);
    }
}

impl IoCompleter for Driver {
    fn io_done(&self, slot: u64, mut c: Completed) {
        if c.status != IoStatus::Success {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
        } else if c.req.io_type == IoType::Read && c.req.bufs[0].iter().any(|&b| b != slot as u8 + 1) {
            self.progress.miscompared.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if self.left.get() > 0 {
            self.left.set(self.left.get() - 1);
            let req = c.take_req();
            self.submit(slot, req);
        }
    }
}

thread_local! {
    static DRIVER: RefCell<Option<(Rc<Driver>, BdevDesc)>> = const { RefCell::new(None) };
}

/// Starts a run of `total` requests of `io_type` on reactor 0's driver (made on first use).
fn start_run(name: &'static str, io_type: IoType, total: u64, progress: Arc<Progress>) {
    DRIVER.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            let desc = Bdev::open(name, true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            let drv = Rc::new(Driver {
                ch,
                me: RefCell::new(Weak::new()),
                left: Cell::new(0),
                made: Default::default(),
                progress: progress.clone(),
            });
            *drv.me.borrow_mut() = Rc::downgrade(&drv);
            *d = Some((drv, desc));
        }
        let drv = &d.as_ref().unwrap().0;
        drv.left.set(total - DEPTH);
        for slot in 0..DEPTH {
            let mut buf = ferrite_reactor::alloc_buf((IO_BLOCKS * 512) as usize);
            buf.fill(slot as u8 + 1);
            let mut req = IoRequest::new(io_type, 0, IO_BLOCKS);
            req.bufs.push(buf);
            drv.submit(slot, req);
        }
    });
}

fn allocs(side: &Side) -> u64 {
    wait(side.engine.call(0, ferrite_alloc_count::allocs))
}

/// Runs `total` requests of `io_type`; returns the reactor's allocations during the run.
fn measured_run(side: &Side, io_type: IoType, total: u64, progress: &Arc<Progress>) -> u64 {
    let before_done = progress.done.load(Ordering::Relaxed);
    let before = allocs(side);
    let p = progress.clone();
    wait(side.engine.call(0, move || start_run("na0", io_type, total, p)));
    let deadline = Instant::now() + TIMEOUT;
    while progress.done.load(Ordering::Relaxed) < before_done + total {
        assert!(Instant::now() < deadline, "the run did not finish within {TIMEOUT:?}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    allocs(side) - before
}

#[test]
fn steady_state_io_allocates_nothing() {
    let dir = TempDir::new("noalloc");
    let (image, _) = image_with_pattern(&dir.0, (DEPTH * REGION) as usize * 512, 4);
    let Some(qsd) = Qsd::start(&dir.0, &image, 1) else { return };
    let side = Side::start(1, ReactorMode::Interrupt);
    side.rpc(
        "bdev_virtio_attach_controller",
        json!({"name": "na0", "trtype": "user",
        "traddr": qsd.socket_str(), "dev_type": "blk"}),
    )
    .unwrap();
    let progress = Arc::new(Progress::default());
    // Warm-up: the channel, the pools and caches, the call eventfd's watch. Its writes cover
    // every block of every region (each slot walks its 64 offsets about 60 times).
    measured_run(&side, IoType::Write, 64 * 60, &progress);
    measured_run(&side, IoType::Read, 2000, &progress);
    let writes = measured_run(&side, IoType::Write, 20_000, &progress);
    // The writes reached the file: each region holds its slot's byte (the page cache the
    // daemon writes through is what this read sees).
    let file = std::fs::read(&image).unwrap();
    for (slot, region) in file.chunks((REGION * 512) as usize).enumerate() {
        assert!(region.iter().all(|&b| b == slot as u8 + 1), "region {slot} of the file");
    }
    let reads = measured_run(&side, IoType::Read, 20_000, &progress);
    assert_eq!(progress.failed.load(Ordering::Relaxed), 0, "failed requests");
    assert_eq!(progress.miscompared.load(Ordering::Relaxed), 0, "reads that did not find their slot's byte");
    assert_eq!((writes, reads), (0, 0), "allocations on the reactor during 20000 writes and 20000 reads");
    wait(side.engine.call(0, || DRIVER.with(|d| d.borrow_mut().take().map(|_| ()))));
    side.rpc("bdev_virtio_detach_controller", json!({"name": "na0"})).unwrap();
    side.shutdown();
}
