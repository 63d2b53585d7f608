//! Cross-core messages cost no heap allocation in steady state: small closures travel in the
//! target's preallocated ring. Checked with a global allocator that counts allocations per
//! thread, on the sending thread and on the reactors.

use ferrite_reactor::mailbox::INLINE_BYTES;
use ferrite_reactor::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;

fn allocs() -> u64 {
    ferrite_alloc_count::allocs()
}

fn reactor_allocs(e: &Engine, id: usize) -> u64 {
    e.call(id, allocs).wait().expect("reactor answers")
}

fn engine() -> Engine {
    let cores =
        if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) >= 2 { vec![0, 1] } else { vec![0] };
    Engine::start(EngineConfig { cores, mode: ReactorMode::Poll, ..Default::default() }).expect("engine starts")
}

/// Sends `n` messages to reactor 0 in batches that fit its ring, each made by `make`, and
/// waits until all ran. Returns the allocations of this thread and of the reactor meanwhile.
fn send_batches<F: FnOnce() + Send + 'static>(
    e: &Engine,
    n: u64,
    done: &AtomicU64,
    mut make: impl FnMut() -> F,
) -> (u64, u64) {
    let r0 = reactor_allocs(e, 0);
    let base = done.load(Ordering::SeqCst);
    let t0 = allocs();
    let mut sent = 0;
    while sent < n {
        for _ in 0..512 {
            e.send(0, make());
        }
        sent += 512;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < base + sent {
            assert!(Instant::now() < deadline, "messages not run");
            std::hint::spin_loop();
        }
    }
    let mine = allocs() - t0;
    (mine, reactor_allocs(e, 0) - r0)
}

#[test]
fn small_messages_allocate_nothing() {
    let e = engine();
    let done = Arc::new(AtomicU64::new(0));
    let payload = [7u64; 3];
    let make = || {
        let d = done.clone();
        move || {
            d.fetch_add(payload[2] - 6, Ordering::SeqCst);
        }
    };
    send_batches(&e, 4096, &done, make); // warm up
    let (sender, reactor) = send_batches(&e, 100_000, &done, make);
    assert_eq!(sender, 0, "the sender allocated {sender} times for 100k messages");
    assert_eq!(reactor, 0, "the reactor allocated {reactor} times running 100k messages");

    // The counter does see allocations: a closure too big to sit in a slot is boxed, once.
    let big = [1u64; INLINE_BYTES / 8 + 1];
    let make_big = || {
        let d = done.clone();
        move || {
            d.fetch_add(big[0], Ordering::SeqCst);
        }
    };
    let (sender, _) = send_batches(&e, 1024, &done, make_big);
    assert_eq!(sender, 1024, "big closures are boxed once each");
    e.stop();
    e.join();
}

#[test]
fn reactor_to_reactor_ping_pong_allocates_nothing() {
    let e = engine();
    if e.count() < 2 {
        return;
    }
    const ROUNDS: u64 = 50_000;
    fn ping(e: Engine, left: u64, done: Arc<AtomicU64>) {
        let to = 1 - current().unwrap();
        if left == 0 {
            done.store(1, Ordering::SeqCst);
            return;
        }
        let e2 = e.clone();
        e.send(to, move || ping(e2, left - 1, done));
    }
    let run = |rounds: u64| {
        let done = Arc::new(AtomicU64::new(0));
        let (e2, d) = (e.clone(), done.clone());
        e.send(0, move || ping(e2, rounds, d));
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "ping-pong stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    run(1000); // warm up
    let before = (reactor_allocs(&e, 0), reactor_allocs(&e, 1));
    run(ROUNDS);
    let after = (reactor_allocs(&e, 0), reactor_allocs(&e, 1));
    assert_eq!(after.0 - before.0, 0, "reactor 0 allocated for {ROUNDS} messages");
    assert_eq!(after.1 - before.1, 0, "reactor 1 allocated for {ROUNDS} messages");
    e.stop();
    e.join();
}
