//! Virtual bdevs on reactors: delay measured against its configured latency (and updated on
//! every core), a three-deep stack (passthru over delay over error over malloc) round-tripping
//! data and showing injected faults, and a stack torn down by deleting its base under load.

mod common;

use common::*;
use ferrite_bdev::{lookup, unregister, Bdev, Completed, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_modules::delay::{self, Latencies, LatencyType};
use ferrite_modules::error::{self, ErrorType, Injection};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::passthru;
use ferrite_reactor::{IoBuf, ReactorMode};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

fn make_malloc(name: &str, num_blocks: u64) {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size: 512, ..Default::default() }).unwrap();
}

fn lat(avg_read: u64, avg_write: u64) -> Latencies {
    Latencies { avg_read, avg_write, p99_read: avg_read, p99_write: avg_write }
}

/// Deletes `name` from a plain thread and waits for the delete to finish.
fn delete(name: &str) {
    let rx = unregister(name, None).unwrap();
    assert!(wait_timeout(rx, TIMEOUT).is_ok(), "delete of {name} did not finish");
}

#[test]
fn delay_holds_each_io_for_at_least_its_latency_on_every_core() {
    let e = engine(2, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("vr_delay_m", 256);
        delay::create("vr_delay_m", "vr_delay", None, lat(3000, 5000)).unwrap();
    });
    let measure = |core: usize, ops: u32| {
        run(&e, core, move || async move {
            let desc = Bdev::open("vr_delay", true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            for i in 0..ops {
                let data = pattern(i as u64, 512);
                let t = Instant::now();
                io_ok(&ch, IoRequest::write(i as u64, 1, buf_from(&data))).await;
                writes.push(t.elapsed());
                let t = Instant::now();
                let got = io_ok(&ch, IoRequest::read(i as u64, 1, IoBuf::heap(512))).await;
                reads.push(t.elapsed());
                assert_bytes_eq(&got, &data, "read back through the delay bdev");
            }
            (reads, writes)
        })
    };
    let (reads, writes) = measure(0, 10);
    assert!(reads.iter().all(|d| *d >= Duration::from_micros(3000)), "reads: {reads:?}");
    assert!(writes.iter().all(|d| *d >= Duration::from_micros(5000)), "writes: {writes:?}");
    let avg = reads.iter().sum::<Duration>() / reads.len() as u32;
    assert!(avg < Duration::from_millis(20), "reads far slower than configured: {reads:?}");
    // An update reaches new I/O on every core.
    delay::update_latency("vr_delay", LatencyType::AvgRead, 12_000).unwrap();
    delay::update_latency("vr_delay", LatencyType::P99Read, 12_000).unwrap();
    for core in [0, 1] {
        let (reads, _) = measure(core, 2);
        assert!(reads.iter().all(|d| *d >= Duration::from_micros(12_000)), "core {core}: {reads:?}");
    }
    // Undelayed types pass straight through: with every latency at 5 s a flush still ends at once
    // (the margin is wide so that a loaded machine cannot fail it).
    for t in [LatencyType::AvgRead, LatencyType::P99Read, LatencyType::AvgWrite, LatencyType::P99Write] {
        delay::update_latency("vr_delay", t, 5_000_000).unwrap();
    }
    let flush = run(&e, 1, || async {
        let desc = Bdev::open("vr_delay", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let t = Instant::now();
        io_ok(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await;
        t.elapsed()
    });
    assert!(flush < Duration::from_millis(2500), "flush was delayed: {flush:?}");
    assert!(delay::update_latency("vr_delay_m", LatencyType::AvgRead, 1).is_err(), "not a delay bdev");
    assert!(delay::create("vr_delay_m", "vr_delay2", None, lat(1, 1)).is_err(), "the base is claimed");
    assert!(delay::create("vr_nope", "vr_delay3", None, lat(1, 1)).is_err());
    let bad = Latencies { avg_read: 10, p99_read: 5, avg_write: 1, p99_write: 1 };
    assert!(matches!(delay::create("vr_delay_m", "vr_delay4", None, bad), Err(ferrite_bdev::BdevError::Invalid(_))));
    delete("vr_delay");
    delete("vr_delay_m");
    shutdown(e);
}

#[test]
fn a_three_deep_stack_round_trips_data_and_shows_injected_faults() {
    let e = engine(1, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("vr_stack_m", 512);
        error::create("vr_stack_m", None).unwrap();
        delay::create("EE_vr_stack_m", "vr_stack_d", None, lat(100, 200)).unwrap();
        passthru::create("vr_stack_d", "vr_stack", None).unwrap();
        let top = lookup("vr_stack").unwrap();
        assert!(top.backend().zcopy(), "lending goes through the whole stack");
        let desc = Bdev::open("vr_stack", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        for i in 0..32u64 {
            let data = pattern(100 + i, 4096);
            let mut w = IoRequest::new(IoType::Write, i * 8, 8);
            w.bufs.push(buf_from(&data[..1536]));
            w.bufs.push(buf_from(&data[1536..]));
            io_ok(&ch, w).await;
            let got = io_ok(&ch, IoRequest::read(i * 8, 8, IoBuf::heap(4096))).await;
            assert_bytes_eq(&got, &data, "read back through three virtual bdevs");
            let c = io(&ch, IoRequest::read_zcopy(i * 8, 8)).await;
            assert_eq!(c.status, IoStatus::Success);
            assert!(c.req.bufs.iter().all(|b| b.is_lent()), "zero-copy through the stack");
            assert_bytes_eq(&payload(&c), &data, "zero-copy read through three virtual bdevs");
        }
        let inj = Injection::of(ErrorType::Failure, 2);
        error::inject("EE_vr_stack_m", Some(IoType::Write), inj).unwrap();
        let st: Vec<IoStatus> = {
            let mut v = Vec::new();
            for i in 0..3 {
                v.push(io(&ch, IoRequest::write(i, 1, buf_filled(512, 7))).await.status);
            }
            v
        };
        assert_eq!(st, [IoStatus::Failed(libc::EIO), IoStatus::Failed(libc::EIO), IoStatus::Success]);
        let nomem = Injection { error_type: ErrorType::NoMem, num: 5, ..inj };
        error::inject("EE_vr_stack_m", Some(IoType::Read), nomem).unwrap();
        let got = io_ok(&ch, IoRequest::read(2, 1, IoBuf::heap(512))).await;
        assert!(got.iter().all(|&b| b == 7), "NoMem retried to success through the stack");
    });
    for name in ["vr_stack", "vr_stack_d", "EE_vr_stack_m", "vr_stack_m"] {
        delete(name);
    }
    shutdown(e);
}

/// Keeps `depth` requests in flight until one fails; counts submissions and completions.
struct Load {
    ch: IoChannel,
    me: RefCell<Option<Rc<Load>>>,
    submitted: RefCell<u64>,
    completed: RefCell<u64>,
    failed: RefCell<Option<IoStatus>>,
    in_flight: RefCell<u32>,
}

impl Load {
    fn submit(self: &Rc<Self>, tag: u64) {
        *self.submitted.borrow_mut() += 1;
        *self.in_flight.borrow_mut() += 1;
        let req = if tag.is_multiple_of(2) {
            IoRequest::write(tag % 64, 1, buf_filled(512, tag as u8))
        } else {
            IoRequest::read(tag % 64, 1, IoBuf::heap(512))
        };
        self.ch.submit(req, self.clone(), tag);
    }
}

impl IoCompleter for Load {
    fn io_done(&self, tag: u64, io: Completed) {
        *self.completed.borrow_mut() += 1;
        *self.in_flight.borrow_mut() -= 1;
        if !io.status.is_ok() && self.failed.borrow().is_none() {
            *self.failed.borrow_mut() = Some(io.status);
        }
        drop(io);
        if self.failed.borrow().is_none() {
            let me = self.me.borrow().clone().expect("running");
            me.submit(tag + 2);
        }
    }
}

#[test]
fn deleting_the_base_under_load_tears_the_stack_down() {
    let e = engine(1, ReactorMode::Poll);
    let removed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r2 = removed.clone();
    run(&e, 0, || async {
        make_malloc("vr_tear_m", 256);
        error::create("vr_tear_m", None).unwrap();
        delay::create("EE_vr_tear_m", "vr_tear_d", None, lat(50, 50)).unwrap();
        passthru::create("vr_tear_d", "vr_tear", None).unwrap();
    });
    // Start the load (32 in flight) on reactor 0; it runs until its I/O starts failing.
    let load_done = e.run_async(0, move || async move {
        let desc = Bdev::open("vr_tear", true, move || r2.store(true, std::sync::atomic::Ordering::SeqCst)).unwrap();
        let load = Rc::new(Load {
            ch: desc.channel().unwrap(),
            me: RefCell::new(None),
            submitted: RefCell::new(0),
            completed: RefCell::new(0),
            failed: RefCell::new(None),
            in_flight: RefCell::new(0),
        });
        *load.me.borrow_mut() = Some(load.clone());
        for t in 0..32 {
            load.submit(t);
        }
        while load.failed.borrow().is_none() || *load.in_flight.borrow() > 0 {
            ferrite_reactor::sleep(Duration::from_millis(1)).await;
        }
        load.me.borrow_mut().take();
        drop(desc);
        let r = (*load.submitted.borrow(), *load.completed.borrow(), *load.failed.borrow());
        r
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    delete("vr_tear_m");
    let (submitted, completed, failed) = wait_timeout(load_done, TIMEOUT).expect("the load ended");
    assert!(submitted > 100, "the load ran: {submitted}");
    assert_eq!(submitted, completed, "every outstanding I/O completed");
    assert_eq!(failed, Some(IoStatus::Removed));
    assert!(removed.load(std::sync::atomic::Ordering::SeqCst), "the top's opener was told");
    for name in ["vr_tear", "vr_tear_d", "EE_vr_tear_m", "vr_tear_m"] {
        assert!(lookup(name).is_none(), "{name} is gone");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "teardown took {:?}", t.elapsed());
    shutdown(e);
}
