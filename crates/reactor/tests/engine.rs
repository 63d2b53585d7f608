//! Engine behaviour: messages, tasks, timers, pollers, every-core calls, io_uring and shutdown.

use ferrite_reactor::ring::{uring_opcode, uring_types, CqeHandler};
use ferrite_reactor::*;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn engine(mode: ReactorMode) -> Engine {
    let cores =
        if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) >= 2 { vec![0, 1] } else { vec![0] };
    Engine::start(EngineConfig { cores, mode, ..Default::default() }).expect("engine starts")
}

fn shutdown(e: Engine) {
    e.stop();
    e.join();
}

#[test]
fn messages_run_on_their_reactor_in_order() {
    for mode in [ReactorMode::Poll, ReactorMode::Interrupt, ReactorMode::Adaptive] {
        let e = engine(mode);
        for id in 0..e.count() {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            for i in 0..1000 {
                let seen = seen.clone();
                e.send(id, move || seen.lock().unwrap().push((current(), i)));
            }
            e.call(id, || ()).wait().unwrap();
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1000);
            assert!(seen.iter().enumerate().all(|(i, &(r, v))| r == Some(id) && v == i), "{mode:?}");
        }
        shutdown(e);
    }
}

#[test]
fn messages_between_reactors_wake_a_sleeping_peer() {
    let e = engine(ReactorMode::Interrupt);
    let last = e.count() - 1;
    // Reactor 0 sends to the last reactor and waits for the answer inside a task.
    let got = e
        .run_async(0, move || async move {
            let mut sum = 0;
            for i in 0..100u64 {
                std::thread::sleep(Duration::from_micros(50)); // let the peer fall asleep
                sum += ferrite_reactor::engine().call(last, move || i * 2).await.unwrap();
            }
            sum
        })
        .wait()
        .unwrap();
    assert_eq!(got, (0..100u64).map(|i| i * 2).sum::<u64>());
    shutdown(e);
}

#[test]
fn on_all_runs_once_per_reactor() {
    let e = engine(ReactorMode::Adaptive);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let res = e
        .on_all(move |id| {
            h.fetch_add(1, Ordering::SeqCst);
            (id, current().unwrap())
        })
        .wait()
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), e.count());
    assert_eq!(res, (0..e.count()).map(|i| (i, i)).collect::<Vec<_>>());
    shutdown(e);
}

#[test]
fn timers_fire_in_order_and_not_early() {
    let e = engine(ReactorMode::Interrupt);
    let (order, took) = e
        .run_async(0, || async {
            let order = Rc::new(std::cell::RefCell::new(Vec::new()));
            for (i, ms) in [(2, 30u64), (0, 10), (1, 20)] {
                let o = order.clone();
                after(Duration::from_millis(ms), move || o.borrow_mut().push(i));
            }
            let t0 = Instant::now();
            sleep(Duration::from_millis(40)).await;
            let v = order.borrow().clone();
            (v, t0.elapsed())
        })
        .wait()
        .unwrap();
    assert_eq!(order, vec![0, 1, 2]);
    assert!(took >= Duration::from_millis(40), "slept only {took:?}");
    shutdown(e);
}

#[test]
fn pollers_run_until_unregistered() {
    let e = engine(ReactorMode::Adaptive);
    let count = e
        .run_async(0, || async {
            let n = Rc::new(Cell::new(0u32));
            let n2 = n.clone();
            let id = register_poller(move || {
                n2.set(n2.get() + 1);
                false
            });
            sleep(Duration::from_millis(20)).await;
            unregister_poller(id);
            let at_stop = n.get();
            sleep(Duration::from_millis(20)).await;
            (at_stop, n.get())
        })
        .wait()
        .unwrap();
    assert!(count.0 > 0, "poller never ran");
    assert_eq!(count.0, count.1, "poller ran after unregister");
    shutdown(e);
}

/// A sleep hook runs before each sleep (interrupt mode sleeps after every idle turn); one that
/// reports work keeps the reactor up for the pollers' next turn, and none runs after it is
/// unregistered. In poll mode the reactor never sleeps, so no hook runs.
#[test]
fn sleep_hooks_run_before_sleeping_and_can_keep_the_reactor_up() {
    let e = engine(ReactorMode::Interrupt);
    let (seen, after_unregister) = e
        .run_async(0, || async {
            let polls = Rc::new(Cell::new(0u32));
            // The poll count and time of each hook call; the first three calls report work.
            let seen = Rc::new(std::cell::RefCell::new(Vec::new()));
            let (p, s) = (polls.clone(), seen.clone());
            let id = ferrite_reactor::register_sleep_hook(move || {
                s.borrow_mut().push((p.get(), Instant::now()));
                s.borrow().len() <= 3
            });
            let p = polls.clone();
            let poller = register_poller(move || {
                p.set(p.get() + 1);
                false
            });
            sleep(Duration::from_millis(20)).await;
            ferrite_reactor::unregister_sleep_hook(id);
            let at = seen.borrow().len();
            sleep(Duration::from_millis(20)).await;
            unregister_poller(poller);
            let v: Vec<(u32, Instant)> = seen.borrow().clone();
            let after = v.len() - at;
            (v, after)
        })
        .wait()
        .unwrap();
    assert!(seen.len() >= 4, "hooks ran {} times", seen.len());
    for w in seen[..4].windows(2) {
        assert!(w[1].0 > w[0].0, "no poller turn between a hook that found work and the next sleep: {seen:?}");
    }
    // Kept up, not woken: the 20 ms timer is the only wake-up, and the first four hook calls
    // come well before it.
    let span = seen[3].1 - seen[0].1;
    assert!(span < Duration::from_millis(10), "the reactor slept between hooks that found work ({span:?})");
    assert_eq!(after_unregister, 0, "a hook ran after it was unregistered");
    shutdown(e);
    let e = engine(ReactorMode::Poll);
    let ran = e
        .run_async(0, || async {
            let n = Rc::new(Cell::new(0u32));
            let n2 = n.clone();
            let id = ferrite_reactor::register_sleep_hook(move || {
                n2.set(n2.get() + 1);
                false
            });
            sleep(Duration::from_millis(20)).await;
            ferrite_reactor::unregister_sleep_hook(id);
            n.get()
        })
        .wait()
        .unwrap();
    assert_eq!(ran, 0, "a poll-mode reactor never sleeps, so no hook runs");
    shutdown(e);
}

#[test]
fn next_turn_lets_the_pollers_run_first() {
    for mode in [ReactorMode::Adaptive, ReactorMode::Poll, ReactorMode::Interrupt] {
        let e = engine(mode);
        let (runs, woke_first) = e
            .run_async(0, || async {
                let n = Rc::new(Cell::new(0u32));
                let n2 = n.clone();
                // A task the poller wakes on its first run after each request: it must run
                // before the task that waited in next_turn goes on.
                let flag = Rc::new(Cell::new(0u32));
                let id = register_poller(move || {
                    n2.set(n2.get() + 1);
                    false
                });
                let mut runs = Vec::new();
                let mut woke_first = 0;
                for _ in 0..20 {
                    let before = n.get();
                    let f = flag.clone();
                    let seen = f.get();
                    spawn_local(async move { f.set(f.get() + 1) }).detach();
                    next_turn().await;
                    runs.push(n.get() - before);
                    if flag.get() == seen + 1 {
                        woke_first += 1;
                    }
                }
                unregister_poller(id);
                (runs, woke_first)
            })
            .wait()
            .unwrap();
        assert!(runs.iter().all(|&r| r >= 1), "{mode:?}: a poller run between each wait and its end: {runs:?}");
        assert_eq!(woke_first, 20, "{mode:?}: tasks queued before the wait ran first");
        shutdown(e);
    }
}

struct Done(Rc<Cell<Option<(u64, i32)>>>);
impl CqeHandler for Done {
    fn complete(&self, tag: u64, result: i32) {
        self.0.set(Some((tag, result)));
    }
}

#[test]
fn ring_reads_a_file_into_a_pool_buffer() {
    let path = std::env::temp_dir().join(format!("ferrite-ring-{}", std::process::id()));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let e = engine(ReactorMode::Interrupt);
    let p = path.clone();
    let got = e
        .run_async(0, move || async move {
            let file = std::fs::File::open(&p).unwrap();
            let mut buf = alloc_buf(4096);
            let done = Rc::new(Cell::new(None));
            let entry = uring_opcode::Read::new(
                uring_types::Fd(std::os::fd::AsRawFd::as_raw_fd(&file)),
                buf.as_mut_ptr(),
                4096,
            )
            .offset(4096)
            .build();
            // SAFETY: buf and file live until the completion is observed below.
            unsafe { with_ring(|r| r.push(entry, Rc::new(Done(done.clone())), 42)).unwrap() };
            while done.get().is_none() {
                sleep(Duration::from_millis(1)).await;
            }
            (done.get().unwrap(), buf.to_vec())
        })
        .wait()
        .unwrap();
    assert_eq!(got.0, (42, 4096));
    assert_eq!(got.1, data[4096..]);
    std::fs::remove_file(path).unwrap();
    shutdown(e);
}

#[test]
fn a_resized_pool_is_registered_in_place_of_the_old_one() {
    let path = std::env::temp_dir().join(format!("ferrite-resize-{}", std::process::id()));
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let e = engine(ReactorMode::Interrupt);
    let p = path.clone();
    let (old_fixed, stats, res, got) = e
        .run_async(0, move || async move {
            let old = alloc_buf(4096);
            assert_eq!(old.fixed_index(), Some(0));
            let cfg = BufPoolConfig { small_count: 3, large_count: 2, small_size: 8192, ..Default::default() };
            resize_buf_pool(cfg).expect("resized");
            let stats = buf_pool().unwrap().stats();
            let mut buf = alloc_buf(8192);
            let index = buf.fixed_index().expect("the new pool is registered");
            let file = std::fs::File::open(&p).unwrap();
            let done = Rc::new(Cell::new(None));
            let entry = uring_opcode::ReadFixed::new(
                uring_types::Fd(std::os::fd::AsRawFd::as_raw_fd(&file)),
                buf.as_mut_ptr(),
                8192,
                index,
            )
            .offset(8192)
            .build();
            // SAFETY: buf and file live until the completion is observed below.
            unsafe { with_ring(|r| r.push(entry, Rc::new(Done(done.clone())), 7)).unwrap() };
            while done.get().is_none() {
                sleep(Duration::from_millis(1)).await;
            }
            (old.fixed_index(), stats, done.get().unwrap(), buf.to_vec())
        })
        .wait()
        .unwrap();
    assert_eq!(old_fixed, None, "a buffer of the replaced pool is no longer a fixed buffer");
    assert_eq!((stats.small_count, stats.small_size, stats.small_free, stats.large_count), (3, 8192, 3, 2));
    assert!(stats.registered);
    assert_eq!(res, (7, 8192), "a fixed read into the new pool");
    assert_eq!(got, data[8192..]);
    std::fs::remove_file(path).unwrap();
    shutdown(e);
}

#[test]
fn idle_interrupt_reactors_sleep_and_stop_promptly() {
    let e = engine(ReactorMode::Adaptive);
    std::thread::sleep(Duration::from_millis(200));
    let stats = e.stats();
    for s in &stats {
        assert!(s.sleeps > 0, "reactor {} never slept", s.id);
        assert!(s.idle_ticks > s.busy_ticks, "reactor {} busy while idle: {s:?}", s.id);
    }
    let t0 = Instant::now();
    shutdown(e);
    assert!(t0.elapsed() < Duration::from_millis(500), "stop took {:?}", t0.elapsed());
}

#[test]
fn bad_core_is_a_clear_error() {
    let err =
        Engine::start(EngineConfig { cores: vec![1000], ..Default::default() }).err().expect("core 1000 rejected");
    assert!(err.to_string().contains("core 1000"), "{err}");
}
