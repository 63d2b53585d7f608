//! Descriptor timeouts (SPDK's `spdk_bdev_set_timeout`): a request held past the timeout is
//! reported on its core and, if the callback asks, aborted with TimedOut; requests that finish
//! in time are never reported; requests of another descriptor are not reported; a callback that
//! declines leaves the request running.

mod common;

use common::*;
use ferrite_bdev::timeout::TimedOutIo;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoRequest, IoStatus, IoType,
    IoTypes, Limits,
};
use ferrite_reactor::ReactorMode;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Completes requests at block 0..10 after 100 ms; holds the others until aborted or released.
struct Holding;

struct HoldingChannel(Rc<RefCell<Vec<BdevIo>>>);

thread_local! {
    static HELD: Rc<RefCell<Vec<BdevIo>>> = Rc::default();
}

impl BackendChannel for HoldingChannel {
    fn submit(&mut self, io: BdevIo) {
        if io.req.offset_blocks < 10 {
            ferrite_reactor::after(Duration::from_millis(100), move || io.complete(IoStatus::Success));
        } else {
            self.0.borrow_mut().push(io);
        }
    }
    fn abort(&mut self, named: &dyn Fn(&BdevIo) -> bool) -> usize {
        let mut held = self.0.borrow_mut();
        let (hit, keep): (Vec<_>, Vec<_>) = held.drain(..).partition(|io| named(io));
        *held = keep;
        let n = hit.len();
        hit.into_iter().for_each(|io| io.complete_deferred(IoStatus::Aborted));
        n
    }
}

impl BdevBackend for Holding {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(HoldingChannel(HELD.with(|h| h.clone()))))
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
        io_types: IoTypes::of(&[IoType::Read, IoType::Write]),
        limits: Limits::default(),
    };
    register(props, Arc::new(Holding)).unwrap();
}

type Reports = Arc<Mutex<Vec<TimedOutIo>>>;

#[test]
fn a_request_held_past_the_timeout_is_reported_and_aborted_with_timed_out() {
    let e = engine(2, ReactorMode::Adaptive);
    holding("to_abort");
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let (held, quick, other) = run(&e, 1, move || async move {
        let d = Bdev::open("to_abort", true, || {}).unwrap();
        d.set_timeout(1, move |io| {
            r.lock().unwrap().push(*io);
            true
        });
        // A second descriptor without a timeout: its held request is never reported.
        let d2 = Bdev::open("to_abort", true, || {}).unwrap();
        let (ch, ch2) = (d.channel().unwrap(), d2.channel().unwrap());
        let held = ferrite_reactor::spawn_local({
            let ch = ch.clone();
            async move { io(&ch, IoRequest::read(100, 1, buf_filled(512, 0))).await.status }
        });
        let other = ferrite_reactor::spawn_local({
            let ch2 = ch2.clone();
            async move { io(&ch2, IoRequest::read(200, 1, buf_filled(512, 0))).await.status }
        });
        let quick = io(&ch, IoRequest::read(1, 1, buf_filled(512, 0))).await.status;
        let held = held.await;
        // Release the other descriptor's request by hand.
        let waiting: Vec<BdevIo> = HELD.with(|h| h.borrow_mut().drain(..).collect());
        waiting.into_iter().for_each(|io| io.complete_deferred(IoStatus::Success));
        let other = other.await;
        drop((ch, ch2, d, d2));
        (held, quick, other)
    });
    assert_eq!(held, IoStatus::TimedOut, "aborted by the timeout");
    assert_eq!(quick, IoStatus::Success);
    assert_eq!(other, IoStatus::Success, "the other descriptor's request ran on");
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1, "only the held request: {reports:?}");
    let rep = reports[0];
    assert_eq!((rep.io_type, rep.offset_blocks, rep.num_blocks, rep.tag), (IoType::Read, 100, 1, Some(7)));
    assert_eq!(rep.core, Some(1), "reported on the submitting core");
    assert!(rep.outstanding >= Duration::from_secs(1) && rep.outstanding < Duration::from_secs(2), "{rep:?}");
    unregister("to_abort", None).unwrap();
    shutdown(e);
}

#[test]
fn nothing_is_reported_when_every_request_finishes_in_time_and_declining_lets_it_run() {
    let e = engine(1, ReactorMode::Adaptive);
    holding("to_quiet");
    let reports: Reports = Arc::default();
    let (r, seen) = (reports.clone(), reports.clone());
    let (statuses, reported_in_time, declined) = run(&e, 0, move || async move {
        let d = Bdev::open("to_quiet", true, || {}).unwrap();
        let ch = d.channel().unwrap();
        d.set_timeout(1, move |io| {
            r.lock().unwrap().push(*io);
            false // report only
        });
        let mut statuses = Vec::new();
        for i in 0..10 {
            statuses.push(io(&ch, IoRequest::read(i, 1, buf_filled(512, 0))).await.status);
        }
        ferrite_reactor::sleep(Duration::from_millis(1200)).await;
        let reported_in_time = seen.lock().unwrap().len();
        // Now one held past the timeout, declined: it keeps running until released.
        let held = ferrite_reactor::spawn_local({
            let ch = ch.clone();
            async move { io(&ch, IoRequest::read(500, 1, buf_filled(512, 0))).await.status }
        });
        ferrite_reactor::sleep(Duration::from_millis(1500)).await;
        let waiting: Vec<BdevIo> = HELD.with(|h| h.borrow_mut().drain(..).collect());
        assert_eq!(waiting.len(), 1, "still held after being reported");
        waiting.into_iter().for_each(|io| io.complete_deferred(IoStatus::Success));
        let declined = held.await;
        d.clear_timeout();
        drop((ch, d));
        (statuses, reported_in_time, declined)
    });
    assert!(statuses.iter().all(|s| *s == IoStatus::Success));
    assert_eq!(reported_in_time, 0, "requests that finish in time are never reported");
    assert_eq!(declined, IoStatus::Success, "a declined report leaves the request alone");
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1, "the held request, reported once: {reports:?}");
    assert_eq!(reports[0].offset_blocks, 500);
    unregister("to_quiet", None).unwrap();
    shutdown(e);
}
