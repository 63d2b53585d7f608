//! The simulator: reactors on one thread under a seeded schedule, with a simulated clock.

use ferrite_reactor::{engine_state, reactor_local, Sim};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

reactor_local! {
    static COUNT: Cell<u64> = Cell::new(0);
}

reactor_local! {
    static SEEN: RefCell<Vec<usize>> = RefCell::new(Vec::new());
}

/// Message ping-pong between reactors plus timers; returns the order in which work ran.
fn workload(seed: u64) -> (u64, Vec<(usize, u32)>) {
    let mut sim = Sim::new(seed, 3).unwrap();
    let e = sim.engine();
    let log: Arc<Mutex<Vec<(usize, u32)>>> = Arc::default();
    for i in 0..30u32 {
        let (e2, log) = (e.clone(), log.clone());
        e.send((i % 3) as usize, move || {
            let me = ferrite_reactor::current().unwrap();
            log.lock().unwrap().push((me, i));
            let log2 = log.clone();
            e2.send((me + 1) % 3, move || log2.lock().unwrap().push((ferrite_reactor::current().unwrap(), 100 + i)));
            let log3 = log.clone();
            ferrite_reactor::after(Duration::from_micros(u64::from(i) * 3), move || {
                log3.lock().unwrap().push((ferrite_reactor::current().unwrap(), 200 + i))
            });
        });
    }
    sim.run_until_idle(100_000);
    let order = log.lock().unwrap().clone();
    (sim.trace(), order)
}

#[test]
fn a_seed_replays_exactly_and_seeds_differ() {
    let (t1, o1) = workload(7);
    let (t2, o2) = workload(7);
    assert_eq!(t1, t2, "same seed, same schedule digest");
    assert_eq!(o1, o2, "same seed, same order of work");
    assert_eq!(o1.len(), 90, "every message, reply and timer ran: {o1:?}");
    let distinct: std::collections::HashSet<Vec<(usize, u32)>> = (0..20).map(|s| workload(s).1).collect();
    assert!(distinct.len() > 10, "20 seeds gave only {} orders", distinct.len());
}

#[test]
fn every_reactor_sees_its_own_reactor_locals() {
    let mut sim = Sim::new(3, 4).unwrap();
    let e = sim.engine();
    for round in 0..25 {
        for r in 0..4 {
            e.send(r, move || {
                COUNT.with(|c| c.set(c.get() + 1));
                SEEN.with(|s| s.borrow_mut().push(round));
            });
        }
    }
    sim.run_until_idle(100_000);
    for r in 0..4 {
        let (count, seen) = sim.on(r, || (COUNT.with(|c| c.get()), SEEN.with(|s| s.borrow().clone())));
        assert_eq!(count, 25, "reactor {r} counted only its own messages");
        assert_eq!(seen, (0..25).collect::<Vec<_>>(), "reactor {r} saw its messages in order");
    }
    // Off the reactors the thread-local is the default, not a reactor's.
    assert_eq!(COUNT.with(|c| c.get()), 0);
}

#[test]
fn timers_run_on_simulated_time() {
    let mut sim = Sim::new(11, 2).unwrap();
    let e = sim.engine();
    let wall = Instant::now();
    let rx = e.run_async(1, || async {
        let t0 = ferrite_reactor::tsc::ticks();
        ferrite_reactor::sleep(Duration::from_secs(3600)).await;
        ferrite_reactor::tsc::ticks() - t0
    });
    let waited = sim.block_on(rx, 10_000).unwrap();
    assert!(waited >= 3_600_000_000_000, "slept {waited} simulated ns");
    assert!(sim.elapsed() >= Duration::from_secs(3600));
    assert!(wall.elapsed() < Duration::from_secs(5), "an hour of simulated time took {:?}", wall.elapsed());
}

#[test]
fn blocking_jobs_run_inline_and_state_is_per_engine() {
    #[derive(Default)]
    struct Counter(AtomicU64);
    let mut sim = Sim::new(5, 2).unwrap();
    let e = sim.engine();
    let rx = e.run_async(0, || async {
        engine_state::<Counter>().0.fetch_add(1, Ordering::Relaxed);
        ferrite_reactor::spawn_blocking(|| 6 * 7).await.unwrap()
    });
    assert_eq!(sim.block_on(rx, 1_000).unwrap(), 42);
    // The simulator's thread is entered into its engine: same state as on its reactors.
    assert_eq!(engine_state::<Counter>().0.load(Ordering::Relaxed), 1);
    drop(sim);
    // Afterwards this thread is off every engine: the process default, untouched.
    assert_eq!(engine_state::<Counter>().0.load(Ordering::Relaxed), 0);
}

#[test]
fn a_hang_is_reported_with_its_seed() {
    let mut sim = Sim::new(99, 1).unwrap();
    let (tx, rx) = ferrite_reactor::oneshot::channel::<()>();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.block_on(rx, 100)));
    let msg = r.unwrap_err();
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("seed 99"), "{msg}");
    drop(tx);
}
