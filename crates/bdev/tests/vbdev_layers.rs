//! A request forwarded by a passthru is one request on two bdevs, and each bdev's layer does its
//! own work on it: statistics and latency histograms count it on both, QoS limits of either bdev
//! hold it back, a reset on the passthru waits for it at the base, and a timeout set on the
//! passthru reports it while the base holds it.

mod common;

use common::*;
use ferrite_bdev::histogram;
use ferrite_bdev::qos::{self, QosUpdate};
use ferrite_bdev::timeout::TimedOutIo;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoRequest, IoStatus, IoType,
    IoTypes, Limits,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::passthru;
use ferrite_reactor::{Engine, ReactorMode};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn malloc_bdev(name: &str, num_blocks: u64) -> Bdev {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size: 512, ..Default::default() }).unwrap()
}

/// Deletes the passthru, then its base, each once its openers are gone.
fn delete_stack(top: &str, base: &str) {
    for name in [top, base] {
        let rx = unregister(name, None).unwrap();
        wait_timeout(rx, TIMEOUT).expect("delete finishes");
    }
}

#[test]
fn each_layer_counts_and_times_its_own_io() {
    let e = engine(1, ReactorMode::Adaptive);
    let m = malloc_bdev("vl_stats_m", 256);
    let pt = passthru::create("vl_stats_m", "vl_stats", None).unwrap();
    for b in [&m, &pt] {
        let (e2, b) = (e.clone(), b.clone());
        run(&e, 0, move || async move { histogram::enable(&e2, &b, Some((None, 7, 0, u64::MAX))).await });
    }
    let (pt_id, m_id) = (pt.id(), m.id());
    let (top, base) = run(&e, 0, move || async move {
        let d = Bdev::open("vl_stats", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        for i in 0..20 {
            io_ok(&ch, IoRequest::write(i, 1, buf_filled(512, i as u8))).await;
            io_ok(&ch, IoRequest::read(i, 1, buf_filled(512, 0))).await;
        }
        // Refused by the passthru's own checks: never reaches the base.
        assert_eq!(io(&ch, IoRequest::read(300, 1, buf_filled(512, 0))).await.status, IoStatus::OutOfRange);
        drop((ch, d));
        (ferrite_bdev::channel::local_iostat(pt_id), ferrite_bdev::channel::local_iostat(m_id))
    });
    assert_eq!((top.num_write_ops, top.num_read_ops, top.io_errors), (20, 20, 1), "{top:?}");
    assert_eq!((base.num_write_ops, base.num_read_ops, base.io_errors), (20, 20, 0), "{base:?}");
    assert_eq!((top.bytes_read, base.bytes_read), (20 * 512, 20 * 512));
    assert!(top.read_latency_ticks > 0 && base.read_latency_ticks > 0, "both layers time the reads");
    for (b, want) in [(&pt, 41), (&m, 40)] {
        let (e2, b2) = (e.clone(), b.clone());
        let h = run(&e, 0, move || async move { histogram::merged(&e2, &b2).await }).unwrap();
        assert_eq!(h.total(), want, "histogram of {}", b.name());
    }
    delete_stack("vl_stats", "vl_stats_m");
    shutdown(e);
}

/// Reads through `name` at queue depth 16 for `secs`; how many completed.
fn reads_for(e: &Engine, name: &'static str, secs: f64) -> u64 {
    run(e, 0, move || async move {
        let d = Bdev::open(name, false, || {}).unwrap();
        let ch = d.channel().unwrap();
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let done = Rc::new(RefCell::new(0u64));
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let (ch, done) = (ch.clone(), done.clone());
                ferrite_reactor::spawn_local(async move {
                    while Instant::now() < end {
                        io_ok(&ch, IoRequest::read(i, 1, buf_filled(512, 0))).await;
                        *done.borrow_mut() += 1;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        drop((ch, d));
        let n = *done.borrow();
        n
    })
}

#[test]
fn qos_limits_of_either_bdev_hold_back_what_goes_through_a_passthru() {
    let e = engine(1, ReactorMode::Adaptive);
    let m = malloc_bdev("vl_qos_m", 256);
    let pt = passthru::create("vl_qos_m", "vl_qos", None).unwrap();
    let set = |b: &Bdev, iops: u64| {
        qos::set_limits(b, QosUpdate { rw_ios_per_sec: Some(iops), ..Default::default() }).unwrap();
        let (e2, b) = (e.clone(), b.clone());
        run(&e, 0, move || async move { qos::apply_everywhere(&e2, &b).await });
    };
    for limited in [&m, &pt] {
        set(limited, 2000);
        let n = reads_for(&e, "vl_qos", 1.0);
        assert!((1400..=2600).contains(&n), "{} I/Os in 1 s under 2000/s on {}", n, limited.name());
        set(limited, 0);
    }
    assert!(reads_for(&e, "vl_qos", 0.2) > 2000, "unlimited again");
    delete_stack("vl_qos", "vl_qos_m");
    shutdown(e);
}

/// Holds every read until released with `release`; everything else completes at once.
struct Holding;

struct HoldingChannel;

thread_local! {
    static HELD: RefCell<Vec<BdevIo>> = const { RefCell::new(Vec::new()) };
}

impl BackendChannel for HoldingChannel {
    fn submit(&mut self, io: BdevIo) {
        if io.req.io_type == IoType::Read {
            HELD.with(|h| h.borrow_mut().push(io));
        } else {
            io.complete_deferred(IoStatus::Success);
        }
    }
}

impl BdevBackend for Holding {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(HoldingChannel))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn holding(name: &str) {
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: 512,
        num_blocks: 1024,
        product_name: "Holding disk",
        module: "test",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write, IoType::Reset]),
        limits: Limits::default(),
    };
    register(props, Arc::new(Holding)).unwrap();
}

/// Completes the reads held on this core.
fn release() {
    let held: Vec<BdevIo> = HELD.with(|h| h.borrow_mut().drain(..).collect());
    held.into_iter().for_each(|io| io.complete_deferred(IoStatus::Success));
}

#[test]
fn a_reset_of_a_passthru_waits_at_the_base_for_the_requests_before_it() {
    let e = engine(1, ReactorMode::Adaptive);
    holding("vl_reset_h");
    passthru::create("vl_reset_h", "vl_reset", None).unwrap();
    let order = run(&e, 0, || async {
        let d = Bdev::open("vl_reset", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        let order = Rc::new(RefCell::new(Vec::new()));
        let spawn = |req: IoRequest, what: &'static str| {
            let (ch, order) = (ch.clone(), order.clone());
            ferrite_reactor::spawn_local(async move {
                assert_eq!(io(&ch, req).await.status, IoStatus::Success);
                order.borrow_mut().push(what);
            })
        };
        let read = spawn(IoRequest::read(5, 1, buf_filled(512, 0)), "read");
        let reset = spawn(IoRequest::no_payload(IoType::Reset, 0, 0), "reset");
        ferrite_reactor::sleep(Duration::from_millis(50)).await;
        assert!(order.borrow().is_empty(), "the reset waits for the read the base holds");
        release();
        read.await;
        reset.await;
        drop((ch, d));
        let o = order.borrow().clone();
        o
    });
    assert_eq!(order, ["read", "reset"]);
    delete_stack("vl_reset", "vl_reset_h");
    shutdown(e);
}

#[test]
fn a_timeout_on_a_passthru_reports_a_request_its_base_holds() {
    let e = engine(1, ReactorMode::Adaptive);
    holding("vl_to_h");
    passthru::create("vl_to_h", "vl_to", None).unwrap();
    let reports: Arc<Mutex<Vec<TimedOutIo>>> = Arc::default();
    let r = reports.clone();
    let status = run(&e, 0, move || async move {
        let d = Bdev::open("vl_to", true, || {}).unwrap();
        d.set_timeout(1, move |io| {
            r.lock().unwrap().push(*io);
            false
        });
        let ch = d.channel().unwrap();
        let held = ferrite_reactor::spawn_local({
            let ch = ch.clone();
            async move { io(&ch, IoRequest::read(9, 1, buf_filled(512, 0))).await.status }
        });
        ferrite_reactor::sleep(Duration::from_millis(1300)).await;
        release();
        let s = held.await;
        drop((ch, d));
        s
    });
    assert_eq!(status, IoStatus::Success, "reported, not aborted: it ran on");
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!((reports[0].io_type, reports[0].offset_blocks), (IoType::Read, 9));
    delete_stack("vl_to", "vl_to_h");
    shutdown(e);
}
