//! The lifecycle half of the bdev contract: an asynchronous destruct that runs once the last
//! opener closed, queue depth, abort of every request of a completer, the outstanding requests
//! a channel can list, and media and fault events delivered to openers.

// The tests hand unregister's receiver out of a reactor task to wait for it on the test thread.
#![allow(clippy::async_yields_async)]

mod common;

use common::{buf_from, engine, pattern, run, shutdown, wait_timeout, TIMEOUT};
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevEvent, BdevIo, BdevProps, Completed,
    Destructed, IoCompleter, IoRequest, IoStatus, IoType, IoTypes, Limits, MediaEvent,
};
use ferrite_modules::{error, malloc};
use ferrite_reactor::{IoBuf, ReactorMode};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn make_malloc(name: &str, blocks: u64) {
    let opts =
        malloc::MallocOpts { name: Some(name.into()), num_blocks: blocks, block_size: 512, ..Default::default() };
    malloc::create(opts).unwrap();
}

/// A module whose destruct finishes 30 ms later, on a timer, and counts its calls.
struct SlowEnd {
    calls: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

struct Nothing;

impl BackendChannel for Nothing {
    fn submit(&mut self, io: BdevIo) {
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for SlowEnd {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(Nothing))
    }

    fn destruct(&self, done: Destructed) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let finished = self.finished.clone();
        ferrite_reactor::after(Duration::from_millis(30), move || {
            finished.fetch_add(1, Ordering::SeqCst);
            done.finish();
        });
    }

    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn props(name: &str) -> BdevProps {
    BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: 512,
        num_blocks: 64,
        product_name: "test",
        module: "test_slow_end",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write]),
        limits: Limits::default(),
    }
}

#[test]
fn destruct_runs_once_after_the_last_opener_and_unregister_waits_for_it() {
    let e = engine(2, ReactorMode::Poll);
    let (calls, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c2, f2) = (calls.clone(), finished.clone());
    run(&e, 0, move || async move {
        register(props("cl_slow"), Arc::new(SlowEnd { calls: c2, finished: f2 })).unwrap();
    });
    // Openers on both cores, each with I/O done and a channel.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<usize>();
    let holders: Vec<_> = (0..2)
        .map(|core| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let opened_tx = opened_tx.clone();
            let opened = e.run_async(core, move || async move {
                let desc = Bdev::open("cl_slow", true, || {}).unwrap();
                let ch = desc.channel().unwrap();
                let c = common::io(&ch, IoRequest::write(0, 1, buf_from(&[1; 512]))).await;
                assert_eq!(c.status, IoStatus::Success);
                opened_tx.send(core).unwrap();
                // Hold both until told.
                while rx.try_recv().is_err() {
                    ferrite_reactor::sleep(Duration::from_millis(2)).await;
                }
                drop((ch, desc));
            });
            (tx, opened)
        })
        .collect();
    for _ in 0..2 {
        opened_rx.recv_timeout(TIMEOUT).expect("both cores opened the bdev");
    }
    let gone = run(&e, 0, || async { unregister("cl_slow", None).unwrap() });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no destruct while the bdev is open");
    let mut holders = holders.into_iter();
    let (tx0, done0) = holders.next().unwrap();
    tx0.send(()).unwrap();
    wait_timeout(done0, TIMEOUT).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "one opener is left");
    let (tx1, done1) = holders.next().unwrap();
    tx1.send(()).unwrap();
    wait_timeout(done1, TIMEOUT).unwrap();
    wait_timeout(gone, TIMEOUT).expect("unregister ends once the module finished its destruct");
    assert_eq!(finished.load(Ordering::SeqCst), 1, "unregister waited for the module's own finish");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "destruct runs exactly once");
    // Without openers, destruct runs at unregister.
    let (c3, f3) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c4, f4) = (c3.clone(), f3.clone());
    let gone = run(&e, 1, move || async move {
        register(props("cl_slow2"), Arc::new(SlowEnd { calls: c4, finished: f4 })).unwrap();
        unregister("cl_slow2", None).unwrap()
    });
    wait_timeout(gone, TIMEOUT).unwrap();
    assert_eq!((c3.load(Ordering::SeqCst), f3.load(Ordering::SeqCst)), (1, 1));
    shutdown(e);
}

/// Collects completions by tag.
#[derive(Default)]
struct Tags(RefCell<Vec<(u64, IoStatus)>>);

impl IoCompleter for Tags {
    fn io_done(&self, tag: u64, io: Completed) {
        self.0.borrow_mut().push((tag, io.status));
    }
}

async fn until(f: impl Fn() -> bool) {
    for _ in 0..5_000 {
        if f() {
            return;
        }
        ferrite_reactor::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition not reached within 5 s");
}

#[test]
fn queue_depth_for_each_io_and_abort_all_see_what_is_outstanding() {
    let e = engine(2, ReactorMode::Poll);
    run(&e, 0, || async {
        make_malloc("cl_m", 64);
        error::create("cl_m", None).unwrap();
    });
    let bdev_depth = run(&e, 1, || async {
        let desc = Bdev::open("EE_cl_m", true, || {}).unwrap();
        desc.track_io();
        let ch = desc.channel().unwrap();
        // Five writes of one completer and two of another are held by the error bdev.
        error::inject("EE_cl_m", Some(IoType::Write), error::Injection::of(error::ErrorType::Pending, 7)).unwrap();
        let (a, b) = (Rc::new(Tags::default()), Rc::new(Tags::default()));
        for t in 0..5u64 {
            ch.submit(IoRequest::write(t, 1, buf_from(&pattern(t, 512))), a.clone(), t);
        }
        for t in 0..2u64 {
            ch.submit(IoRequest::write(10 + t, 1, buf_from(&pattern(t, 512))), b.clone(), 100 + t);
        }
        ferrite_reactor::sleep(Duration::from_millis(5)).await;
        assert_eq!(ch.queue_depth(), 7, "seven writes held by the module");
        let mut seen = Vec::new();
        assert_eq!(ch.for_each_io(&mut |io| seen.push((io.tag, io.offset_blocks, io.io_type))), 7);
        seen.sort_by_key(|s| (s.0, s.1));
        assert_eq!(seen[0], (Some(0), 0, IoType::Write));
        assert_eq!(seen[6], (Some(101), 11, IoType::Write));
        let depth = Bdev::open("EE_cl_m", false, || {}).unwrap().bdev().queue_depth(&ferrite_reactor::engine());
        let bdev_depth = depth.await.unwrap();
        // Abort every request of `a`: its five end Aborted, `b`'s two stay held.
        let aborter = Rc::new(Tags::default());
        ch.submit(IoRequest::abort_all(&a), aborter.clone(), 900);
        until(|| a.0.borrow().len() == 5 && aborter.0.borrow().len() == 1).await;
        assert!(a.0.borrow().iter().all(|(_, s)| *s == IoStatus::Aborted), "{:?}", a.0.borrow());
        assert_eq!(aborter.0.borrow()[0], (900, IoStatus::Success));
        ferrite_reactor::sleep(Duration::from_millis(5)).await;
        assert!(b.0.borrow().is_empty(), "another completer's requests are not touched");
        assert_eq!(ch.queue_depth(), 2);
        assert_eq!(ch.for_each_io(&mut |io| assert!(io.tag.unwrap() >= 100)), 2);
        // The held writes of `b` go on once resumed... by an abort of all of them here.
        ch.submit(IoRequest::abort_all(&b), aborter.clone(), 901);
        until(|| b.0.borrow().len() == 2).await;
        until(|| ch.queue_depth() == 0).await;
        assert_eq!(ch.for_each_io(&mut |_| {}), 0);
        // A request that is not held completes as usual, and reads back.
        let c = common::io(&ch, IoRequest::write(20, 1, buf_from(&pattern(20, 512)))).await;
        assert_eq!(c.status, IoStatus::Success);
        let c = common::io(&ch, IoRequest::read(20, 1, IoBuf::heap(512))).await;
        assert_eq!(common::payload(&c), pattern(20, 512));
        bdev_depth
    });
    assert_eq!(bdev_depth, 7, "the bdev's depth sums the cores'");
    shutdown(e);
}

#[test]
fn media_events_and_faults_reach_every_opener() {
    let e = engine(2, ReactorMode::Poll);
    run(&e, 0, || async { make_malloc("cl_ev", 64) });
    let events: Arc<Mutex<Vec<(usize, BdevEvent)>>> = Arc::default();
    let descs: Vec<_> = (0..2)
        .map(|core| {
            let ev = events.clone();
            run(&e, core, move || async move {
                let desc = Bdev::open_ext("cl_ev", false, move |x| ev.lock().unwrap().push((core, x))).unwrap();
                Arc::new(Mutex::new(Some(desc)))
            })
        })
        .collect();
    let told = run(&e, 0, || async {
        let b = ferrite_bdev::lookup("cl_ev").unwrap();
        let evs: Vec<MediaEvent> = (0..70).map(|i| MediaEvent { offset_blocks: i, num_blocks: 1 }).collect();
        (b.push_media_events(&evs[..3]), b.push_media_events(&evs[3..]), b.notify_fault("member 1 failed"))
    });
    assert_eq!(told, (2, 2, 2), "both openers were told each time");
    std::thread::sleep(Duration::from_millis(50));
    let got = events.lock().unwrap().clone();
    for core in [0, 1] {
        let mine: Vec<_> = got.iter().filter(|(c, _)| *c == core).map(|(_, e)| *e).collect();
        assert_eq!(mine, vec![BdevEvent::MediaManagement, BdevEvent::MediaManagement, BdevEvent::Fault], "core {core}");
    }
    for d in &descs {
        let guard = d.lock().unwrap();
        let (evs, dropped) = guard.as_ref().unwrap().take_media_events();
        assert_eq!(evs.len(), ferrite_bdev::desc::MEDIA_EVENTS_MAX, "the queue is bounded");
        assert_eq!(dropped, 70 - ferrite_bdev::desc::MEDIA_EVENTS_MAX as u64, "the oldest were dropped, counted");
        assert_eq!(evs[0].offset_blocks, 6, "the newest are kept");
        assert_eq!(guard.as_ref().unwrap().take_media_events(), (vec![], 0), "taken once");
    }
    drop(descs);
    run(&e, 0, || async { drop(unregister("cl_ev", None).unwrap()) });
    shutdown(e);
}
