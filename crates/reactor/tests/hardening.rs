//! The engine under stress and misuse: panics abort the process (checked in a child process),
//! busy reactors still stop, blocking work runs off the reactors, timers and messages cannot
//! wedge a reactor or a caller.

use ferrite_reactor::*;
use std::cell::Cell;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn two_cores() -> Vec<usize> {
    if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) >= 2 {
        vec![0, 1]
    } else {
        vec![0]
    }
}

fn engine(mode: ReactorMode) -> Engine {
    Engine::start(EngineConfig { cores: two_cores(), mode, ..Default::default() }).expect("engine starts")
}

fn shutdown(e: Engine) {
    e.stop();
    e.join();
}

// ---- panics ----------------------------------------------------------------------------------

const CHILD_ENV: &str = "FERRITE_REACTOR_PANIC_CHILD";

/// Runs in a child process (see `reactor_panics_abort_the_process`): makes a reactor panic in
/// the way the environment names, then waits long enough for the parent to notice a hang.
#[test]
fn panic_child() {
    let Ok(case) = std::env::var(CHILD_ENV) else { return };
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Adaptive, ..Default::default() }).unwrap();
    match case.as_str() {
        "message" => e.send(0, || panic!("boom in a message")),
        "task" => {
            e.send(0, || {
                spawn_local(async {
                    sleep(Duration::from_millis(10)).await;
                    panic!("boom in a task");
                })
                .detach()
            });
        }
        "poller" => {
            e.send(0, || {
                let n = Cell::new(0);
                register_poller(move || {
                    n.set(n.get() + 1);
                    if n.get() == 100 {
                        panic!("boom in a poller");
                    }
                    true
                });
            });
        }
        other => panic!("unknown case {other}"),
    }
    // A caller waiting on the dead reactor: without the abort it would wait forever.
    let _ = e.call(0, || ()).wait();
    std::thread::sleep(Duration::from_secs(30));
    unreachable!("the reactor panic did not end the process");
}

#[test]
fn reactor_panics_abort_the_process() {
    let exe = std::env::current_exe().unwrap();
    for (case, msg) in [("message", "boom in a message"), ("task", "boom in a task"), ("poller", "boom in a poller")] {
        let mut child = Command::new(&exe)
            .args(["--exact", "panic_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, case)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{case}: the process still runs 10 s after a reactor panicked");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{case}: {status:?}\n{err}");
        let line = err.lines().find(|l| l.contains("reactor 0 panicked at")).unwrap_or_else(|| panic!("{case}: {err}"));
        assert!(line.contains("crates/reactor/tests/hardening.rs:") || line.contains("tests/hardening.rs:"), "{line}");
        assert!(line.contains(msg) && line.ends_with("aborting"), "{case}: {line}");
    }
}

// ---- stop -----------------------------------------------------------------------------------

#[test]
fn a_reactor_that_always_has_work_still_stops() {
    for mode in [ReactorMode::Poll, ReactorMode::Adaptive, ReactorMode::Interrupt] {
        let e = engine(mode);
        let turns = Arc::new(AtomicUsize::new(0));
        for id in 0..e.count() {
            let t = turns.clone();
            e.call(id, move || {
                register_poller(move || {
                    t.fetch_add(1, Ordering::Relaxed);
                    true
                });
            })
            .wait()
            .unwrap();
        }
        // And a message stream that never ends (each message sends the next).
        fn again(e: Engine) {
            let e2 = e.clone();
            e.send(0, move || again(e2));
        }
        again(e.clone());
        std::thread::sleep(Duration::from_millis(50));
        assert!(turns.load(Ordering::Relaxed) > 0);
        let t0 = Instant::now();
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            shutdown(e);
            tx.send(t0.elapsed());
        });
        let took = wait_bounded(rx, Duration::from_secs(5)).unwrap_or_else(|| panic!("{mode:?}: stop hangs"));
        assert!(took < Duration::from_millis(500), "{mode:?}: stop took {took:?}");
    }
}

#[test]
fn calls_after_stop_are_canceled_not_hung() {
    let e = engine(ReactorMode::Interrupt);
    shutdown(e.clone());
    let limit = Duration::from_secs(2);
    assert_eq!(wait_bounded(e.call(0, || 1), limit), None, "a stopped reactor answered");
    let (tx, rx) = oneshot::channel();
    let e2 = e.clone();
    std::thread::spawn(move || tx.send(e2.run_async(0, || async { 1 }).wait().is_err()));
    assert_eq!(wait_bounded(rx, limit), Some(true), "run_async after stop hangs");
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || tx.send(e.call(0, || 1).wait().is_err()));
    assert_eq!(wait_bounded(rx, limit), Some(true), "call after stop hangs");
}

// ---- spawn_blocking ---------------------------------------------------------------------------

#[test]
fn blocking_work_does_not_stop_the_reactor() {
    let e = engine(ReactorMode::Adaptive);
    let (result, polls, ticks, reactor_after, job_thread, reactor_cpus, worker_cpus) = e
        .run_async(0, || async {
            let polls = Rc::new(Cell::new(0u64));
            let p = polls.clone();
            let poller = register_poller(move || {
                p.set(p.get() + 1);
                false
            });
            // A second task that ticks every millisecond while the job sleeps.
            let ticks = Rc::new(Cell::new(0u32));
            let t = ticks.clone();
            let ticker = spawn_local(async move {
                loop {
                    sleep(Duration::from_millis(1)).await;
                    t.set(t.get() + 1);
                }
            });
            let job = spawn_blocking(|| {
                std::thread::sleep(Duration::from_millis(300));
                (current(), std::thread::current().name().map(str::to_string), blocking::allowed_cpus())
            });
            let reactor_cpus = blocking::allowed_cpus();
            let (on, name, worker_cpus) = job.await.expect("no panic");
            unregister_poller(poller);
            drop(ticker);
            (on, polls.get(), ticks.get(), current(), name, reactor_cpus, worker_cpus)
        })
        .wait()
        .unwrap();
    assert_eq!(result, None, "the closure ran on a reactor");
    assert!(job_thread.unwrap().starts_with("blocking_"));
    // Started by a pinned reactor, the worker does not stay on the reactor's core.
    assert_eq!(reactor_cpus, 1, "the reactor is pinned");
    assert_eq!(worker_cpus, blocking::allowed_cpus(), "the worker stayed on the reactor's core");
    assert_eq!(reactor_after, Some(0), "the result did not come back to reactor 0");
    assert!(polls > 100, "pollers stalled while the job slept ({polls} turns)");
    assert!(ticks >= 50, "the other task stalled while the job slept ({ticks} ticks in 300 ms)");
    shutdown(e);
}

#[test]
fn blocking_results_come_back_to_the_calling_reactor() {
    let e = engine(ReactorMode::Interrupt);
    let got = e
        .on_all(|id| {
            let (tx, rx) = oneshot::channel();
            spawn_local(async move {
                let mut ok = true;
                for i in 0..20u64 {
                    let v = spawn_blocking(move || i * 3).await.unwrap();
                    ok &= v == i * 3 && current() == Some(id);
                }
                tx.send(ok)
            })
            .detach();
            rx
        })
        .wait()
        .unwrap();
    for (id, rx) in got.into_iter().enumerate() {
        assert!(rx.wait().unwrap(), "reactor {id} got a result elsewhere");
    }
    shutdown(e);
}

#[test]
fn a_blocking_panic_is_an_error() {
    let e = engine(ReactorMode::Interrupt);
    let res = e
        .run_async(0, || async {
            let r: Result<u32, BlockingPanic> = spawn_blocking(|| panic!("disk on fire")).await;
            // The pool still works afterwards.
            (r, spawn_blocking(|| 7).await)
        })
        .wait()
        .unwrap();
    assert_eq!(res.0, Err(BlockingPanic("disk on fire".into())));
    assert_eq!(res.1, Ok(7));
    shutdown(e);
}

#[test]
fn blocking_pool_is_bounded_and_queues_the_rest() {
    let e = engine(ReactorMode::Adaptive);
    assert_eq!(e.blocking_threads(), 0, "the pool is not lazy");
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (running.clone(), peak.clone());
    let t0 = Instant::now();
    // More jobs than the queue holds: the surplus waits for room without blocking the reactor.
    let n = blocking::BLOCKING_QUEUE + 100;
    let sum = e
        .run_async(0, move || async move {
            let jobs: Vec<_> = (0..n)
                .map(|i| {
                    let (r, p) = (r.clone(), p.clone());
                    spawn_blocking(move || {
                        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                        p.fetch_max(now, Ordering::SeqCst);
                        if i < 8 {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        r.fetch_sub(1, Ordering::SeqCst);
                        i
                    })
                })
                .collect();
            let mut sum = 0;
            for j in jobs {
                sum += j.await.unwrap();
            }
            sum
        })
        .wait()
        .unwrap();
    assert_eq!(sum, (0..n).sum::<usize>());
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= blocking::MAX_BLOCKING_THREADS, "{peak} jobs ran at once");
    assert!(e.blocking_threads_started() <= blocking::MAX_BLOCKING_THREADS);
    // 8 sleeps of 50 ms on at most 4 threads: at least 100 ms.
    assert!(t0.elapsed() >= Duration::from_millis(100), "{:?}", t0.elapsed());
    shutdown(e.clone());
    let t1 = Instant::now();
    while e.blocking_threads() > 0 {
        assert!(t1.elapsed() < Duration::from_secs(2), "blocking workers did not exit after stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---- timers and tasks ---------------------------------------------------------------------------

#[test]
fn a_huge_delay_never_fires_and_a_dropped_sleep_cancels_its_timer() {
    let e = engine(ReactorMode::Interrupt);
    let (fired, before, after_drop) = e
        .run_async(0, || async {
            let fired = Rc::new(Cell::new(false));
            let f = fired.clone();
            after(Duration::MAX, move || f.set(true));
            let base = pending_timers();
            {
                let mut s = std::pin::pin!(sleep(Duration::from_secs(3600)));
                // Poll once so it registers its timer, then drop it.
                std::future::poll_fn(|cx| {
                    let _ = s.as_mut().poll(cx);
                    std::task::Poll::Ready(())
                })
                .await;
                assert_eq!(pending_timers(), base + 1);
            }
            let after_drop = pending_timers();
            sleep(Duration::from_millis(30)).await;
            (fired.get(), base, after_drop)
        })
        .wait()
        .unwrap();
    assert!(!fired, "a timer of Duration::MAX fired");
    assert_eq!(after_drop, before, "a dropped sleep left its timer behind");
    shutdown(e);
}

#[test]
fn a_sleep_polled_by_another_task_wakes_that_task() {
    let e = engine(ReactorMode::Interrupt);
    let took = e.run_async(0, || async {
        let t0 = Instant::now();
        let s = Rc::new(std::cell::RefCell::new(Box::pin(sleep(Duration::from_millis(30)))));
        // Task A polls the sleep once (registering its waker) and goes away.
        let s2 = s.clone();
        spawn_local(async move {
            std::future::poll_fn(|cx| {
                let _ = s2.borrow_mut().as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
        })
        .await;
        // Task B (this one) now waits on it: it must be woken, not A.
        std::future::poll_fn(|cx| s.borrow_mut().as_mut().poll(cx)).await;
        t0.elapsed()
    });
    let took = wait_bounded(took, Duration::from_secs(5)).expect("the sleep never woke its new waiter");
    assert!(took >= Duration::from_millis(30));
    shutdown(e);
}

#[test]
fn timers_that_add_due_timers_do_not_wedge_the_reactor() {
    let e = engine(ReactorMode::Poll);
    let n = e.run_async(0, || async {
        let count = Rc::new(Cell::new(0u64));
        fn rearm(c: Rc<Cell<u64>>) {
            c.set(c.get() + 1);
            after(Duration::ZERO, move || rearm(c));
        }
        rearm(count.clone());
        sleep(Duration::from_millis(20)).await;
        count.get()
    });
    assert!(wait_bounded(n, Duration::from_secs(5)).expect("reactor wedged") > 1);
    shutdown(e);
}

#[test]
fn spawn_local_off_reactor_fails_loudly() {
    let r = std::panic::catch_unwind(|| spawn_local(async {}).detach());
    assert!(r.is_err(), "spawn_local worked off a reactor");
    // And from a reactor it works, including for a task woken from another thread.
    let e = engine(ReactorMode::Interrupt);
    let (tx, rx) = oneshot::channel::<u32>();
    let got = e.run_async(1.min(e.count() - 1), move || async move { rx.await.unwrap() + 1 });
    std::thread::sleep(Duration::from_millis(20));
    tx.send(41);
    assert_eq!(wait_bounded(got, Duration::from_secs(5)), Some(42));
    shutdown(e);
}

/// Waits for a receiver at most `limit` (on a helper thread, so a hang fails the test).
fn wait_bounded<T: Send + 'static>(rx: oneshot::Receiver<T>, limit: Duration) -> Option<T> {
    let out = Arc::new(Mutex::new(None));
    let o = out.clone();
    std::thread::spawn(move || *o.lock().unwrap() = rx.wait().ok());
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(v) = out.lock().unwrap().take() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}
