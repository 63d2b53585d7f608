//! Simulation tests of the bdev layer: every reactor of an engine on one thread, in an order a
//! seed decides, on a simulated clock (`ferrite_reactor::Sim`). Each test runs many seeds
//! (`SIM_SEEDS=<n>` sets how many); a failure names its seed, and `SIM_SEED=<n>` replays that
//! one exactly.
//!
//! Invariants checked after every seed: every I/O completes (no task hangs), with success or
//! the status the teardown explains (Removed, Aborted); every successful read returns what was
//! written; deleted bdevs leave the registry and release their claims; no channel is left on any
//! core.

mod common;

use common::{buf_filled, buf_from, io, pattern, payload};
use ferrite_bdev::channel::live_channels;
use ferrite_bdev::module::{register_module, wait_for_examine};
use ferrite_bdev::{lookup, unregister, Bdev, BdevDesc, BdevEvent, BdevModule, ClaimType, ExamineDone};
use ferrite_bdev::{IoRequest, IoStatus};
use ferrite_modules::passthru::base::delete_vbdev;
use ferrite_modules::{delay, error, malloc, null, passthru};
use ferrite_reactor::sim::{for_seeds, seeds};
use ferrite_reactor::{spawn_local, Sim};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most steps any wait of a simulation may take before it counts as a hang.
const MAX_STEPS: u64 = 2_000_000;

/// What one reactor's load saw.
#[derive(Debug, Default, Clone, PartialEq)]
struct LoadResult {
    ok: u64,
    failed: Vec<IoStatus>,
    mismatches: Vec<String>,
}

impl LoadResult {
    fn merge(&mut self, o: LoadResult) {
        self.ok += o.ok;
        self.failed.extend(o.failed);
        self.mismatches.extend(o.mismatches);
    }
}

/// Writes and reads back one block per lane of `name` from `lanes` concurrent lanes on this
/// reactor, `rounds` times each, stopping when the bdev is being removed; then lets go of it.
async fn load(name: &'static str, core: u64, lanes: u64, rounds: u64) -> LoadResult {
    let removed = Arc::new(AtomicBool::new(false));
    let r2 = removed.clone();
    let desc = match Bdev::open_ext(name, true, move |e| {
        if e == BdevEvent::Remove {
            r2.store(true, Ordering::SeqCst)
        }
    }) {
        Ok(d) => d,
        Err(_) => return LoadResult::default(), // already gone
    };
    let ch = desc.channel().expect("a channel of an open bdev");
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let (ch, removed) = (ch.clone(), removed.clone());
        tasks.push(spawn_local(async move {
            let lba = core * lanes + lane;
            let mut res = LoadResult::default();
            for round in 0..rounds {
                if removed.load(Ordering::SeqCst) {
                    break;
                }
                let data = pattern(core << 40 | lane << 20 | round, 512);
                let c = io(&ch, IoRequest::write(lba, 1, buf_from(&data))).await;
                if c.status != IoStatus::Success {
                    res.failed.push(c.status);
                    continue;
                }
                res.ok += 1;
                // The lane owns the block: a read after its write must return that write.
                let c = io(&ch, IoRequest::read(lba, 1, buf_filled(512, 0xee))).await;
                if c.status != IoStatus::Success {
                    res.failed.push(c.status);
                    continue;
                }
                res.ok += 1;
                if payload(&c) != data {
                    res.mismatches.push(format!("core {core} lane {lane} round {round}: read back other data"));
                }
            }
            res
        }));
    }
    let mut all = LoadResult::default();
    for t in tasks {
        all.merge(t.await);
    }
    drop(ch);
    drop(desc);
    all
}

thread_local! {
    /// I/Os that succeeded, and that failed because of the teardown, over every seed run on
    /// this thread (to show the tests really remove bdevs with I/O in flight).
    static SUCCEEDED: AtomicU64 = const { AtomicU64::new(0) };
    static TORN: AtomicU64 = const { AtomicU64::new(0) };
}

/// Checks what the loads saw: no wrong data, and only failures teardown explains.
fn check_loads(results: &[LoadResult]) {
    for r in results {
        SUCCEEDED.with(|n| n.fetch_add(r.ok, Ordering::Relaxed));
        TORN.with(|n| n.fetch_add(r.failed.len() as u64, Ordering::Relaxed));
    }
    for (core, r) in results.iter().enumerate() {
        assert!(r.mismatches.is_empty(), "core {core}: {:?}", r.mismatches);
        for s in &r.failed {
            assert!(matches!(s, IoStatus::Removed | IoStatus::Aborted), "core {core}: unexpected status {s:?}");
        }
    }
}

/// Asserts that no core keeps a channel.
fn check_no_channels(sim: &mut Sim, cores: usize) {
    for c in 0..cores {
        let n = sim.on(c, live_channels);
        assert_eq!(n, 0, "core {c} still has {n} channel(s)");
    }
}

fn make_malloc(sim: &mut Sim, name: &str, blocks: u64) {
    let opts =
        malloc::MallocOpts { name: Some(name.into()), num_blocks: blocks, block_size: 512, ..Default::default() };
    sim.on(0, || malloc::create(opts)).expect("malloc bdev");
}

fn latencies(sim: &mut Sim) -> delay::Latencies {
    let avg = 1 + sim.rng().below(30);
    delay::Latencies { avg_read: avg, avg_write: avg, p99_read: avg * 2, p99_write: avg * 2 }
}

/// Starts a load on every core against `name`; returns the receivers of their results.
fn start_loads(sim: &mut Sim, cores: usize, name: &'static str) -> Vec<ferrite_reactor::oneshot::Receiver<LoadResult>> {
    let lanes = 1 + sim.rng().below(4);
    let rounds = 5 + sim.rng().below(60);
    let e = sim.engine();
    (0..cores).map(|c| e.run_async(c, move || load(name, c as u64, lanes, rounds))).collect()
}

/// Hot removal with I/O in flight on every core: a delay bdev over malloc under load, and
/// either the delay bdev or (cascading) the malloc bdev under it deleted at a random moment.
fn hot_removal(seed: u64) -> u64 {
    let cores = 2 + (seed % 3) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "M", 64);
    let lat = latencies(&mut sim);
    sim.on(0, || delay::create("M", "D", None, lat)).expect("delay bdev");
    let loads = start_loads(&mut sim, cores, "D");
    let at = sim.rng().below(4_000);
    sim.run_until_idle(at);
    let remove_base = sim.rng().chance(1, 2);
    let e = sim.engine();
    let gone = if remove_base {
        sim.on(0, || unregister("M", None)).expect("M is registered")
    } else {
        e.run_async(0, || async { delete_vbdev("D", delay::MODULE).await.expect("D deletes") })
    };
    let results: Vec<LoadResult> = loads.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).unwrap()).collect();
    sim.block_on(gone, MAX_STEPS).expect("the deleted bdev is released");
    sim.run_until_idle(MAX_STEPS);
    check_loads(&results);
    assert!(lookup("D").is_none(), "D is gone (remove_base {remove_base})");
    if remove_base {
        assert!(lookup("M").is_none());
    } else {
        let m = lookup("M").expect("M stays");
        assert!(m.claims().is_empty(), "D's claim on M is released: {:?}", m.claims());
        assert_eq!(m.open_count(), 0);
        let gone = unregister("M", None).unwrap();
        sim.block_on(gone, MAX_STEPS).unwrap();
    }
    check_no_channels(&mut sim, cores);
    let ok: u64 = results.iter().map(|r| r.ok).sum();
    sim.trace() ^ ok.rotate_left(32)
}

#[test]
fn hot_removal_with_io_in_flight_on_every_core() {
    for_seeds(200, hot_removal);
    let (ok, torn) = (SUCCEEDED.with(|n| n.load(Ordering::Relaxed)), TORN.with(|n| n.load(Ordering::Relaxed)));
    eprintln!("I/Os over all seeds: {ok} succeeded, {torn} ended by the removal");
    if seeds(200).len() >= 20 {
        assert!(ok > 0 && torn > 0, "the seeds never caught I/O in flight: {ok} ok, {torn} torn");
    }
}

#[test]
fn a_failing_seed_would_replay_exactly() {
    for seed in [3, 41, 977] {
        assert_eq!(hot_removal(seed), hot_removal(seed), "seed {seed} took two paths");
    }
}

/// malloc M, passthru P over it, delay D over P, error EE_D over D, all under load on every
/// core, and one of the four deleted at a random moment: every bdev above it goes too, every
/// bdev below stays with its claims as they should be.
fn stacked_teardown(seed: u64) -> u64 {
    let cores = 2 + (seed % 2) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "M", 64);
    let lat = latencies(&mut sim);
    sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
        passthru::create("M", "P", None)?;
        delay::create("P", "D", None, lat)?;
        error::create("D", None)?;
        Ok(())
    })
    .expect("the stack builds");
    let stack = [("M", "malloc"), ("P", passthru::MODULE), ("D", delay::MODULE), ("EE_D", error::MODULE)];
    let loads = start_loads(&mut sim, cores, "EE_D");
    let at = sim.rng().below(4_000);
    sim.run_until_idle(at);
    let victim = sim.rng().below(4) as usize;
    let (name, module) = stack[victim];
    let e = sim.engine();
    let gone = if victim == 0 {
        sim.on(0, || unregister(name, None)).expect("registered")
    } else {
        e.run_async(0, move || async move { delete_vbdev(name, module).await.expect("deletes") })
    };
    let results: Vec<LoadResult> = loads.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).unwrap()).collect();
    sim.block_on(gone, MAX_STEPS).expect("the victim is released");
    sim.run_until_idle(MAX_STEPS);
    check_loads(&results);
    for (i, (n, _)) in stack.iter().enumerate() {
        let b = lookup(n);
        if i >= victim {
            assert!(b.is_none(), "{n} is gone (victim {name})");
            continue;
        }
        let b = b.unwrap_or_else(|| panic!("{n} stays (victim {name})"));
        if i + 1 == victim {
            assert!(b.claims().is_empty(), "{n}'s claim is released: {:?}", b.claims());
            // A virtual bdev keeps one descriptor on itself: the watch that closes its base.
            let own_watch = usize::from(i > 0);
            assert_eq!(b.open_count(), own_watch, "{n} is closed");
        } else {
            assert_eq!(b.claims().len(), 1, "{n} keeps the claim of the bdev above it");
        }
    }
    // Tear the rest down from the top and check nothing is left.
    for i in (0..victim).rev() {
        let (n, m) = stack[i];
        let rx = if i == 0 {
            unregister(n, None).unwrap()
        } else {
            e.run_async(0, move || async move { delete_vbdev(n, m).await.expect("deletes") })
        };
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    sim.run_until_idle(MAX_STEPS);
    let left: Vec<String> = ferrite_bdev::list().iter().map(|b| b.name().to_string()).collect();
    assert!(left.is_empty(), "bdevs left: {left:?}");
    check_no_channels(&mut sim, cores);
    sim.trace()
}

#[test]
fn three_deep_stack_torn_down_under_load() {
    for_seeds(150, stacked_teardown);
}

/// A module that claims bdevs named `c*` when they register, and reads `s*` ones "from disk"
/// (a real read through the bdev layer, then a wait) before its examine finishes.
#[derive(Default)]
struct Examiner {
    claimed: Mutex<Vec<String>>,
    held: Mutex<Vec<BdevDesc>>,
    disk_started: AtomicUsize,
    disk_done: AtomicUsize,
}

impl BdevModule for Examiner {
    fn name(&self) -> &'static str {
        "sim_examiner"
    }
    fn examine_config(&self, bdev: &Bdev) {
        if !bdev.name().starts_with('c') {
            return;
        }
        // A competitor may have opened it for writing, or claimed it, first: then no claim.
        let Ok(d) = Bdev::open(bdev.name(), false, || {}) else { return };
        if d.claim_as(self.name(), ClaimType::ExclusiveWrite, 0).is_ok() {
            self.claimed.lock().unwrap().push(bdev.name().to_string());
            self.held.lock().unwrap().push(d);
        }
    }
    fn examine_disk(&self, bdev: &Bdev, done: ExamineDone) {
        if !bdev.name().starts_with('s') {
            return done.finish();
        }
        self.disk_started.fetch_add(1, Ordering::SeqCst);
        let me = EXAMINER.with(|e| e.clone());
        let name = bdev.name().to_string();
        let wait = Duration::from_micros(name.len() as u64 * 7);
        spawn_local(async move {
            if let Ok(d) = Bdev::open(&name, false, || {}) {
                if let Ok(ch) = d.channel() {
                    let c = io(&ch, IoRequest::read(0, 1, buf_filled(512, 0))).await;
                    assert!(matches!(c.status, IoStatus::Success | IoStatus::Removed), "{:?}", c.status);
                }
            }
            ferrite_reactor::sleep(wait).await;
            me.disk_done.fetch_add(1, Ordering::SeqCst);
            done.finish();
        })
        .detach();
    }
}

thread_local! {
    /// The examiner of the simulation running on this thread.
    static EXAMINER: Arc<Examiner> = Arc::default();
}

/// Bdevs registered from the test thread and from every core while a module claims some in its
/// examine and a competitor on every core tries to open and claim them too, and while some are
/// deleted mid-examine: each `c*` bdev ends with exactly one claim, and `bdev_wait_for_examine`
/// answers only once every disk examine finished.
fn claims_and_examine(seed: u64) -> u64 {
    let cores = 2 + (seed % 3) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    let ex = EXAMINER.with(|e| e.clone());
    *ex.claimed.lock().unwrap() = Vec::new();
    ex.disk_started.store(0, Ordering::SeqCst);
    ex.disk_done.store(0, Ordering::SeqCst);
    register_module(ex.clone()).unwrap();
    let e = sim.engine();
    let count = 4 + sim.rng().below(8) as usize;
    let names: Vec<(&'static str, &'static str)> = (0..count)
        .map(|i| {
            let c: &'static str = Box::leak(format!("c{i}").into_boxed_str());
            let s: &'static str = Box::leak(format!("s{i}").into_boxed_str());
            (c, s)
        })
        .collect();
    // Competitors: each core tries to open every c* bdev for writing and claim it.
    let all_c: Arc<Vec<&'static str>> = Arc::new(names.iter().map(|(c, _)| *c).collect());
    let competitors: Vec<_> = (0..cores)
        .map(|core| {
            let all_c = all_c.clone();
            e.run_async(core, move || async move {
                let mut held = Vec::new();
                let mut won = Vec::new();
                for n in all_c.iter() {
                    let mut tries = 0;
                    let d = loop {
                        if let Some(b) = lookup(n) {
                            break Some(b);
                        }
                        tries += 1;
                        if tries > 2_000 {
                            break None;
                        }
                        ferrite_reactor::sleep(Duration::from_micros(1)).await;
                    };
                    if d.is_none() {
                        continue;
                    }
                    if let Ok(d) = Bdev::open(n, true, || {}) {
                        if d.claim(&format!("competitor{core}")).is_ok() {
                            won.push(n.to_string());
                        }
                        held.push(d);
                    }
                }
                (won, held)
            })
        })
        .collect();
    let mut removed = Vec::new();
    for (i, (c, s)) in names.iter().enumerate() {
        let (c, s) = (*c, *s);
        let steps = sim.rng().below(40);
        sim.run_until_idle(steps);
        let make = move |name: &str| {
            null::create(null::NullOpts { name: name.into(), num_blocks: 16, block_size: 512, ..Default::default() })
                .expect("null bdev")
        };
        if sim.rng().chance(1, 2) {
            // From the test thread: examined on reactor 0, later.
            make(c);
            make(s);
        } else {
            let core = sim.rng().below(cores as u64) as usize;
            sim.block_on(e.call(core, move || (make(c), make(s))), MAX_STEPS).unwrap();
        }
        if sim.rng().chance(1, 4) {
            let steps = sim.rng().below(20);
            sim.run_until_idle(steps);
            if let Ok(rx) = unregister(s, None) {
                removed.push((i, rx));
            }
        }
    }
    let waited = wait_for_examine();
    sim.block_on(waited, MAX_STEPS).unwrap();
    assert_eq!(
        ex.disk_done.load(Ordering::SeqCst),
        ex.disk_started.load(Ordering::SeqCst),
        "bdev_wait_for_examine answered with disk examines in progress"
    );
    let outcomes: Vec<(Vec<String>, Vec<BdevDesc>)> =
        competitors.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).unwrap()).collect();
    for (c, _) in &names {
        let b = lookup(c).expect("c bdevs stay");
        let by_examiner = ex.claimed.lock().unwrap().iter().any(|n| n == c);
        let by_competitors = outcomes.iter().filter(|(won, _)| won.iter().any(|n| n == c)).count();
        assert_eq!(
            usize::from(by_examiner) + by_competitors,
            1,
            "{c}: examiner {by_examiner}, competitors {by_competitors}, claims {:?}",
            b.claims()
        );
        assert_eq!(b.claims().len(), 1, "{c}: {:?}", b.claims());
    }
    // Release everything and delete every bdev.
    drop(outcomes);
    sim.on(0, || ex.held.lock().unwrap().clear());
    for (_, rx) in removed {
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    for b in ferrite_bdev::list() {
        let rx = unregister(b.name(), None).unwrap();
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    sim.run_until_idle(MAX_STEPS);
    assert!(ferrite_bdev::list().is_empty());
    check_no_channels(&mut sim, cores);
    sim.trace()
}

#[test]
fn claims_and_examine_race_registration() {
    for_seeds(150, claims_and_examine);
}

/// A completer that keeps the completion for the lane awaiting it, and counts deliveries.
#[derive(Default)]
struct Slot {
    done: std::cell::RefCell<Option<ferrite_bdev::Completed>>,
    waker: std::cell::RefCell<Option<std::task::Waker>>,
    calls: std::cell::Cell<u32>,
}

impl ferrite_bdev::IoCompleter for Slot {
    fn io_done(&self, _tag: u64, io: ferrite_bdev::Completed) {
        self.calls.set(self.calls.get() + 1);
        *self.done.borrow_mut() = Some(io);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// This core's requests in flight, each with its completer and tag (what an abort names).
type InFlight = std::rc::Rc<std::cell::RefCell<Vec<(std::rc::Rc<Slot>, u64)>>>;

/// Submits `req` with `tag` through a fresh slot listed in `inflight` (so another task can
/// abort it) and waits for its completion.
async fn tracked(
    ch: &ferrite_bdev::IoChannel,
    inflight: &InFlight,
    req: IoRequest,
    tag: u64,
) -> ferrite_bdev::Completed {
    let slot = std::rc::Rc::new(Slot::default());
    inflight.borrow_mut().push((slot.clone(), tag));
    ch.submit(req, slot.clone(), tag);
    let c = std::future::poll_fn(|cx| match slot.done.borrow_mut().take() {
        Some(c) => std::task::Poll::Ready(c),
        None => {
            *slot.waker.borrow_mut() = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    })
    .await;
    inflight.borrow_mut().retain(|(s, _)| !std::rc::Rc::ptr_eq(s, &slot));
    // Let anything wrongly delivered twice show up before counting.
    ferrite_reactor::sleep(Duration::from_micros(1)).await;
    assert_eq!(slot.calls.get(), 1, "request {tag:#x} completed {} times", slot.calls.get());
    c
}

/// What one core's mixed load saw.
#[derive(Debug, Default)]
struct MixedResult {
    statuses: std::collections::BTreeMap<String, u64>,
    mismatches: Vec<String>,
    resets: u64,
    aborts_sent: u64,
}

/// On this core: lanes writing and reading back their own blocks, a task aborting random
/// requests in flight, and a task resetting the bdev now and then, all on one channel.
/// `abort_us` and `reset_us` bound the random pause before each abort and each reset (None:
/// none of them, so held requests must end by timing out).
async fn mixed(
    name: &'static str,
    core: u64,
    lanes: u64,
    rounds: u64,
    seed: u64,
    abort_us: Option<u64>,
    reset_us: Option<u64>,
) -> MixedResult {
    use std::cell::RefCell;
    use std::rc::Rc;
    let desc = Bdev::open(name, true, || {}).expect("open");
    // Requests outstanding for 1 s (simulated) are aborted by the timeout's callback.
    desc.set_timeout(1, |_| true);
    let ch = desc.channel().expect("channel");
    let inflight: InFlight = Rc::default();
    let result = Rc::new(RefCell::new(MixedResult::default()));
    let lanes_left = Rc::new(std::cell::Cell::new(lanes));
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let (ch, inflight, result, left) = (ch.clone(), inflight.clone(), result.clone(), lanes_left.clone());
        tasks.push(spawn_local(async move {
            let lba = core * lanes + lane;
            // What the block may hold: the last successful write, and any write since that
            // ended otherwise (it may or may not have landed).
            // (Malloc memory starts zeroed.)
            let mut candidates: Vec<Vec<u8>> = vec![vec![0; 512]];
            let mut hist: Vec<String> = Vec::new();
            for round in 0..rounds {
                let tag = core << 40 | lane << 20 | round << 1;
                let data = pattern(seed ^ tag, 512);
                let c = tracked(&ch, &inflight, IoRequest::write(lba, 1, buf_from(&data)), tag).await;
                *result.borrow_mut().statuses.entry(format!("write {:?}", c.status)).or_default() += 1;
                hist.push(format!("r{round} write {:?} at {:?}", c.status, ferrite_reactor::tsc::ticks()));
                if c.status == IoStatus::Success {
                    candidates = vec![data];
                } else {
                    candidates.push(data);
                }
                let c = tracked(&ch, &inflight, IoRequest::read(lba, 1, buf_filled(512, 0xee)), tag | 1).await;
                *result.borrow_mut().statuses.entry(format!("read {:?}", c.status)).or_default() += 1;
                hist.push(format!("r{round} read {:?}", c.status));
                if c.status == IoStatus::Success {
                    let got = payload(&c);
                    if !candidates.contains(&got) {
                        let from = (0..round).find(|r| pattern(seed ^ (core << 40 | lane << 20 | r << 1), 512) == got);
                        result.borrow_mut().mismatches.push(format!(
                            "core {core} lane {lane} round {round}: read holds round {from:?}'s write; history {:?}",
                            &hist[hist.len().saturating_sub(8)..]
                        ));
                    }
                }
            }
            left.set(left.get() - 1);
        }));
    }
    // The aborter: every few microseconds, abort one request in flight on this channel.
    if let Some(abort_us) = abort_us {
        let (ch, inflight, result, left) = (ch.clone(), inflight.clone(), result.clone(), lanes_left.clone());
        tasks.push(spawn_local(async move {
            let mut n = seed;
            while left.get() > 0 {
                n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ferrite_reactor::sleep(Duration::from_micros(5 + (n >> 33) % abort_us)).await;
                let victim = {
                    let f = inflight.borrow();
                    if f.is_empty() {
                        None
                    } else {
                        Some(f[(n >> 40) as usize % f.len()].clone())
                    }
                };
                if let Some((slot, tag)) = victim {
                    let c = io(&ch, IoRequest::abort(&slot, tag)).await;
                    // Found and aborted, or already gone: both are answers; nothing else is.
                    assert!(matches!(c.status, IoStatus::Success | IoStatus::Failed(_)), "abort: {:?}", c.status);
                    result.borrow_mut().aborts_sent += 1;
                }
            }
        }));
    }
    // The resetter: a reset now and then; each must finish despite the steady load.
    if let Some(reset_us) = reset_us {
        let (ch, result, left) = (ch.clone(), result.clone(), lanes_left.clone());
        tasks.push(spawn_local(async move {
            let mut n = seed ^ 0x5eed;
            while left.get() > 0 {
                n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ferrite_reactor::sleep(Duration::from_micros(50 + (n >> 33) % reset_us)).await;
                let c = io(&ch, IoRequest::no_payload(ferrite_bdev::IoType::Reset, 0, 0)).await;
                assert_eq!(c.status, IoStatus::Success, "reset");
                result.borrow_mut().resets += 1;
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    drop(ch);
    drop(desc);
    match Rc::try_unwrap(result) {
        Ok(r) => r.into_inner(),
        Err(_) => panic!("a task of this core still holds the result"),
    }
}

/// Reset, abort, timeouts, held and NoMem-answered requests together under load: a delay bdev
/// over malloc holds requests, an error bdev over it holds some until they are aborted, reset
/// or time out, and answers NoMem to others (the layer retries them); every request completes
/// once, with a status one of those explains, and reads return a write that may have landed.
fn reset_abort_timeout(seed: u64) -> u64 {
    let cores = 2 + (seed % 2) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "M", 64);
    let avg = 20 + sim.rng().below(300);
    let lat = delay::Latencies { avg_read: avg, avg_write: avg, p99_read: avg * 3, p99_write: avg * 3 };
    sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
        delay::create("M", "D", None, lat)?;
        error::create("D", None)?;
        Ok(())
    })
    .expect("stack");
    let pending = sim.rng().below(6) as u32;
    let nomem = sim.rng().below(20) as u32;
    let inj = error::Injection::of;
    error::inject("EE_D", Some(ferrite_bdev::IoType::Read), inj(error::ErrorType::Pending, pending)).unwrap();
    error::inject("EE_D", Some(ferrite_bdev::IoType::Write), inj(error::ErrorType::NoMem, nomem)).unwrap();
    let lanes = 1 + sim.rng().below(3);
    let rounds = 5 + sim.rng().below(40);
    // How hard to abort and reset: often, now and then, or never (then held requests time out).
    let mut intensity = |often: u64, rarely: u64| match sim.rng().below(3) {
        0 => Some(often),
        1 => Some(rarely),
        _ => None,
    };
    let abort_us = intensity(200, 5_000);
    let reset_us = intensity(2_000, 500_000);
    let e = sim.engine();
    let runs: Vec<_> = (0..cores)
        .map(|c| e.run_async(c, move || mixed("EE_D", c as u64, lanes, rounds, seed, abort_us, reset_us)))
        .collect();
    let results: Vec<MixedResult> = runs.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).unwrap()).collect();
    MIXED_SEEN.with(|m| {
        let mut m = m.borrow_mut();
        for r in &results {
            for (k, v) in &r.statuses {
                *m.entry(k.clone()).or_default() += v;
            }
            *m.entry("resets".into()).or_default() += r.resets;
            *m.entry("aborts sent".into()).or_default() += r.aborts_sent;
        }
    });
    let allowed = ["Success", "Aborted", "TimedOut"];
    for (core, r) in results.iter().enumerate() {
        assert!(r.mismatches.is_empty(), "core {core}: {:?}", r.mismatches);
        for (what, n) in &r.statuses {
            assert!(allowed.iter().any(|a| what.ends_with(a)), "core {core}: {n} x {what}");
        }
        let total: u64 = r.statuses.values().sum();
        assert_eq!(total, 2 * lanes * rounds, "core {core}: every request completed: {:?}", r.statuses);
    }
    for (name, module) in [("EE_D", error::MODULE), ("D", delay::MODULE)] {
        let rx = e.run_async(0, move || async move { delete_vbdev(name, module).await.expect("deletes") });
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    let rx = unregister("M", None).unwrap();
    sim.block_on(rx, MAX_STEPS).unwrap();
    sim.run_until_idle(MAX_STEPS);
    check_no_channels(&mut sim, cores);
    let mut digest = sim.trace();
    for r in &results {
        for (k, v) in &r.statuses {
            digest = digest.rotate_left(7) ^ (k.len() as u64) ^ v;
        }
        digest ^= r.resets << 20 ^ r.aborts_sent;
    }
    digest
}

thread_local! {
    /// Statuses, resets and aborts over every seed run on this thread.
    static MIXED_SEEN: std::cell::RefCell<std::collections::BTreeMap<String, u64>> = Default::default();
}

#[test]
fn reset_abort_and_timeouts_under_load() {
    for_seeds(150, reset_abort_timeout);
    let seen = MIXED_SEEN.with(|m| m.borrow().clone());
    eprintln!("over all seeds: {seen:?}");
    if seeds(150).len() >= 20 {
        for k in ["read Aborted", "read TimedOut", "write Aborted", "write Success", "resets", "aborts sent"] {
            assert!(seen.get(k).copied().unwrap_or(0) > 0, "no seed produced {k}: {seen:?}");
        }
    }
}

/// A request whose timeout's callback asks for an abort is aborted wherever it waits: held by
/// the error module of the bdev the timeout is on, or held by a delay bdev below it (the abort
/// travels down the stack as any abort does). Before the fix the layer looked only in its own
/// queues and the top module's, found nothing, and the request hung for ever.
#[test]
fn timed_out_requests_are_aborted_where_they_wait_in_the_stack() {
    for below in [false, true] {
        let mut sim = Sim::new(1, 2).unwrap();
        make_malloc(&mut sim, "M", 64);
        let two_s = 2_000_000;
        let lat = delay::Latencies { avg_read: two_s, avg_write: two_s, p99_read: two_s, p99_write: two_s };
        sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
            delay::create("M", "D", None, lat)?;
            error::create("D", None)?;
            Ok(())
        })
        .unwrap();
        if !below {
            let inj = error::Injection::of(error::ErrorType::Pending, 1);
            error::inject("EE_D", Some(ferrite_bdev::IoType::Read), inj).unwrap();
        }
        let e = sim.engine();
        let rx = e.run_async(1, || async {
            let desc = Bdev::open("EE_D", true, || {}).unwrap();
            let reported = Arc::new(AtomicUsize::new(0));
            let r2 = reported.clone();
            desc.set_timeout(1, move |_| {
                r2.fetch_add(1, Ordering::SeqCst);
                true
            });
            let ch = desc.channel().unwrap();
            let t0 = ferrite_reactor::tsc::ticks();
            let c = io(&ch, IoRequest::read(0, 1, buf_filled(512, 0))).await;
            let took = Duration::from_nanos(ferrite_reactor::tsc::ticks() - t0);
            (c.status, took, reported.load(Ordering::SeqCst))
        });
        let (status, took, reported) = sim.block_on(rx, 100_000).unwrap();
        assert_eq!(status, IoStatus::TimedOut, "held {}", if below { "below" } else { "on top" });
        assert_eq!(reported, 1);
        assert!(took < Duration::from_millis(1_200), "aborted at the timeout, not at the end of the delay: {took:?}");
    }
}

/// NoMem answered below a delay bdev, with many requests in flight: the layer retries every one
/// and the load finishes (it once stalled for good at queue depth 64).
fn nomem_below_delay(seed: u64) -> u64 {
    let cores = 1 + (seed % 2) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "M", 1024);
    let lat = latencies(&mut sim);
    sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
        error::create("M", None)?;
        delay::create("EE_M", "D", None, lat)?;
        Ok(())
    })
    .expect("stack");
    let num = 1 + sim.rng().below(1000) as u32;
    let inj = error::Injection::of(error::ErrorType::NoMem, num);
    error::inject("EE_M", Some(ferrite_bdev::IoType::Write), inj).unwrap();
    let lanes = 1 + sim.rng().below(64);
    let e = sim.engine();
    let loads: Vec<_> = (0..cores).map(|c| e.run_async(c, move || load("D", c as u64, lanes, 20))).collect();
    let results: Vec<LoadResult> = loads.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).unwrap()).collect();
    for (core, r) in results.iter().enumerate() {
        assert!(r.mismatches.is_empty(), "core {core}: {:?}", r.mismatches);
        assert!(r.failed.is_empty(), "core {core}: NoMem reached the caller as {:?}", r.failed);
        assert_eq!(r.ok, 2 * lanes * 20, "core {core}");
    }
    for (name, module) in [("D", delay::MODULE), ("EE_M", error::MODULE)] {
        let rx = e.run_async(0, move || async move { delete_vbdev(name, module).await.expect("deletes") });
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    sim.block_on(unregister("M", None).unwrap(), MAX_STEPS).unwrap();
    check_no_channels(&mut sim, cores);
    sim.trace()
}

#[test]
fn nomem_below_a_delay_bdev_is_retried_at_any_depth() {
    for_seeds(100, nomem_below_delay);
}

/// A timeout set on a passthru aborts a request held by the error bdev below it: the abort goes
/// down through the passthru as any abort does.
#[test]
fn a_timeout_on_a_passthru_aborts_what_its_base_holds() {
    let mut sim = Sim::new(2, 1).unwrap();
    make_malloc(&mut sim, "M", 64);
    sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
        error::create("M", None)?;
        passthru::create("EE_M", "P", None)?;
        Ok(())
    })
    .unwrap();
    let inj = error::Injection::of(error::ErrorType::Pending, 1);
    error::inject("EE_M", Some(ferrite_bdev::IoType::Read), inj).unwrap();
    let rx = sim.engine().run_async(0, || async {
        let desc = Bdev::open("P", true, || {}).unwrap();
        desc.set_timeout(1, |_| true);
        let ch = desc.channel().unwrap();
        io(&ch, IoRequest::read(0, 1, buf_filled(512, 0))).await.status
    });
    assert_eq!(sim.block_on(rx, 100_000).unwrap(), IoStatus::TimedOut);
}

/// Fan-outs on every core, each a mirrored write to a delay bdev (completing late, in an order
/// the seed picks) and an error bdev (failing some writes), then a striped read back across
/// both: every fan-out hears once, with each child's status in submission order, and the
/// stripes land in the parent's segments in place.
fn fan_outs(seed: u64) -> u64 {
    use ferrite_bdev::fanout::{FanOut, FanOutCompleter, FanOutDone};
    use ferrite_bdev::{IoBufs, IoType};
    use std::cell::RefCell;
    use std::rc::Rc;

    #[derive(Default)]
    struct Heard(RefCell<Vec<(u64, FanOutDone)>>);
    impl FanOutCompleter for Heard {
        fn fan_out_done(&self, tag: u64, done: FanOutDone) {
            self.0.borrow_mut().push((tag, done));
        }
    }

    let cores = 1 + (seed % 3) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "FA", 256);
    make_malloc(&mut sim, "FB", 256);
    let lat = latencies(&mut sim);
    sim.on(0, || -> Result<(), ferrite_bdev::BdevError> {
        delay::create("FA", "FD", None, lat)?;
        error::create("FB", None)?;
        Ok(())
    })
    .expect("stack");
    let fail = sim.rng().below(4) as u32;
    let inj = error::Injection::of(error::ErrorType::Failure, fail);
    if fail > 0 {
        error::inject("EE_FB", Some(IoType::Write), inj).unwrap();
    }
    let rounds = 2 + sim.rng().below(6);
    let e = sim.engine();
    let runs: Vec<_> = (0..cores)
        .map(|c| {
            e.run_async(c, move || async move {
                let (da, db) = (Bdev::open("FD", true, || {}).unwrap(), Bdev::open("EE_FB", true, || {}).unwrap());
                let (ca, cb) = (da.channel().unwrap(), db.channel().unwrap());
                let (mut failed_writes, mut mismatches) = (0u32, 0u32);
                for r in 0..rounds {
                    let lba = (c as u64 * 16 + r * 2) % 240;
                    let data = pattern(c as u64 * 1000 + r, 2048);
                    let heard = Rc::new(Heard::default());
                    let segs: IoBufs = [700usize, 1348]
                        .iter()
                        .scan(0, |pos, &n| {
                            let b = buf_from(&data[*pos..*pos + n]);
                            *pos += n;
                            Some(b)
                        })
                        .collect();
                    let fan = FanOut::for_caller(segs, heard.clone(), r);
                    fan.submit(&ca, IoRequest::new(IoType::Write, lba, 4), 0..2048);
                    fan.submit(&cb, IoRequest::new(IoType::Write, lba, 4), 0..2048);
                    fan.finish();
                    while heard.0.borrow().is_empty() {
                        ferrite_reactor::sleep(std::time::Duration::from_micros(50)).await;
                    }
                    let (tag, done) = heard.0.borrow_mut().pop().unwrap();
                    assert_eq!(tag, r);
                    assert_eq!(done.statuses.len(), 2);
                    assert!(done.statuses[0].is_ok(), "the delay child: {:?}", done.statuses);
                    match done.statuses[1] {
                        IoStatus::Success => {}
                        IoStatus::Failed(_) => {
                            failed_writes += 1;
                            continue;
                        }
                        s => panic!("unexpected status {s:?}"),
                    }
                    // Both copies hold the data: read it back striped, two blocks from each.
                    let out: IoBufs = [1000usize, 1048].iter().map(|&n| buf_filled(n, 0xee)).collect();
                    let fan = FanOut::for_caller(out, heard.clone(), 100 + r);
                    fan.submit(&cb, IoRequest::new(IoType::Read, lba + 2, 2), 1024..2048);
                    fan.submit(&ca, IoRequest::new(IoType::Read, lba, 2), 0..1024);
                    drop(fan);
                    while heard.0.borrow().is_empty() {
                        ferrite_reactor::sleep(std::time::Duration::from_micros(50)).await;
                    }
                    let (_, done) = heard.0.borrow_mut().pop().unwrap();
                    assert!(done.statuses.iter().all(|s| s.is_ok()), "{:?}", done.statuses);
                    let got: Vec<u8> = done.bufs.iter().flat_map(|b| b.to_vec()).collect();
                    if got != data {
                        mismatches += 1;
                    }
                    assert!(heard.0.borrow().is_empty(), "heard twice");
                }
                (failed_writes, mismatches)
            })
        })
        .collect();
    let mut failed = 0;
    for rx in runs {
        let (f, m) = sim.block_on(rx, MAX_STEPS).expect("the fan-outs end");
        assert_eq!(m, 0, "a striped read did not return what both copies hold");
        failed += f;
    }
    assert!(failed <= fail, "{failed} writes failed, {fail} were injected");
    for (name, module) in [("FD", delay::MODULE), ("EE_FB", error::MODULE)] {
        let rx = e.run_async(0, move || async move { delete_vbdev(name, module).await.expect("deletes") });
        sim.block_on(rx, MAX_STEPS).unwrap();
    }
    for n in ["FA", "FB"] {
        sim.block_on(unregister(n, None).unwrap(), MAX_STEPS).unwrap();
    }
    sim.run_until_idle(MAX_STEPS);
    check_no_channels(&mut sim, cores);
    sim.trace() ^ u64::from(failed)
}

#[test]
fn fan_outs_hear_once_with_every_childs_status_on_every_core() {
    for_seeds(100, fan_outs);
}

/// A passthru deleted while every core opens and closes it and runs I/O through it: its
/// module's destruct runs exactly once, after the last opener closed, and closes the base (the
/// base's claim goes); opens after the delete began are refused.
fn destruct_races_opens(seed: u64) -> u64 {
    let cores = 2 + (seed % 2) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "DM", 64);
    sim.on(0, || passthru::create("DM", "DP", None)).expect("passthru");
    let e = sim.engine();
    let opens = 1 + sim.rng().below(6);
    let churn: Vec<_> = (0..cores)
        .map(|c| {
            e.run_async(c, move || async move {
                let mut refused = 0u64;
                for i in 0..opens {
                    let Ok(d) = Bdev::open("DP", true, || {}) else {
                        refused += 1;
                        continue;
                    };
                    if let Ok(ch) = d.channel() {
                        let data = pattern(c as u64 * 100 + i, 512);
                        let lba = c as u64 * 8 + i % 8;
                        let w = io(&ch, IoRequest::write(lba, 1, buf_from(&data))).await;
                        if w.status.is_ok() {
                            let r = io(&ch, IoRequest::read(lba, 1, buf_filled(512, 0))).await;
                            assert!(!r.status.is_ok() || payload(&r) == data, "core {c}: read back differs");
                        }
                    }
                    ferrite_reactor::sleep(std::time::Duration::from_micros(10 * (i + 1))).await;
                }
                refused
            })
        })
        .collect();
    let at = sim.rng().below(2_000);
    sim.run_until_idle(at);
    let gone = e.run_async(0, || async { delete_vbdev("DP", passthru::MODULE).await.expect("DP deletes") });
    for rx in churn {
        sim.block_on(rx, MAX_STEPS).expect("the openers end");
    }
    sim.block_on(gone, MAX_STEPS).expect("the delete ends");
    let m = lookup("DM").expect("the base stays");
    assert!(m.claims().is_empty(), "the destruct released the base's claim: {:?}", m.claims());
    assert_eq!(m.open_count(), 0, "the destruct closed the base");
    sim.block_on(unregister("DM", None).unwrap(), MAX_STEPS).unwrap();
    sim.run_until_idle(MAX_STEPS);
    check_no_channels(&mut sim, cores);
    sim.trace()
}

#[test]
fn destruct_runs_once_the_last_opener_closes_while_cores_open_and_write() {
    for_seeds(100, destruct_races_opens);
}

/// One core's share of [`caw_counter`]: increments the counter in block 0 of `D` by
/// compare-and-write (read it, compare-and-write it plus one, again on a miscompare) `rounds`
/// times, with a plain write to a block of its own next to it before each (in the same lease
/// chunk: every core's writes there make the others give their leases up). Returns how many
/// compare-and-writes succeeded.
async fn caw_load(core: u64, rounds: u64) -> u64 {
    let desc = Bdev::open("D", true, || {}).expect("D is open");
    let ch = desc.channel().expect("a channel");
    let block = |v: u64| {
        let mut d = vec![0u8; 512];
        for c in d.chunks_exact_mut(8) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        d
    };
    let mut done = 0;
    while done < rounds {
        let c = io(&ch, IoRequest::read(0, 1, buf_filled(512, 0))).await;
        assert_eq!(c.status, IoStatus::Success, "core {core}: read");
        let cur = payload(&c);
        let v = u64::from_le_bytes(cur[..8].try_into().unwrap());
        let c = io(&ch, IoRequest::write(1 + core, 1, buf_from(&block(v)))).await;
        assert_eq!(c.status, IoStatus::Success, "core {core}: noise write");
        let c = io(&ch, IoRequest::compare_and_write(0, 1, buf_from(&cur), buf_from(&block(v + 1)))).await;
        match c.status {
            IoStatus::Success => done += 1,
            IoStatus::Miscompare { .. } => {}
            s => panic!("core {core}: compare-and-write failed: {s}"),
        }
    }
    done
}

/// Compare-and-write counters on every core of a delay bdev over malloc (requests in flight a
/// while), with plain writes next to the counter on every core, while core 0 takes a range
/// lock over the counter and then quiesces the whole bdev at a random moment: every
/// increment shows in the end (none lost to a write between a compare and its write), every
/// request completes, and no range stays held.
fn caw_counter(seed: u64) -> u64 {
    let cores = 2 + (seed % 2) as usize;
    let mut sim = Sim::new(seed, cores).unwrap();
    make_malloc(&mut sim, "M", 64);
    let lat = latencies(&mut sim);
    sim.on(0, || delay::create("M", "D", None, lat)).expect("delay bdev");
    let e = sim.engine();
    let rounds = 3 + sim.rng().below(12);
    let runs: Vec<_> = (0..cores).map(|c| e.run_async(c, move || caw_load(c as u64, rounds))).collect();
    let at = sim.rng().below(3_000);
    sim.run_until_idle(at);
    let hold_us = 1 + sim.rng().below(200);
    let ctl = e.run_async(0, move || async move {
        let b = lookup("D").expect("D");
        let held = b.lock_lba_range(0, 2).await;
        ferrite_reactor::sleep(Duration::from_micros(hold_us)).await;
        drop(held);
        b.quiesce().await.expect("quiesce");
        ferrite_reactor::sleep(Duration::from_micros(hold_us)).await;
        b.unquiesce().await.expect("unquiesce");
    });
    let done: u64 = runs.into_iter().map(|rx| sim.block_on(rx, MAX_STEPS).expect("a core's counter load")).sum();
    sim.block_on(ctl, MAX_STEPS).expect("lock and quiesce");
    let value = e.run_async(0, || async {
        let d = Bdev::open("D", false, || {}).unwrap();
        let ch = d.channel().unwrap();
        let c = io(&ch, IoRequest::read(0, 1, buf_filled(512, 0))).await;
        u64::from_le_bytes(payload(&c)[..8].try_into().unwrap())
    });
    let value = sim.block_on(value, MAX_STEPS).unwrap();
    assert_eq!(value, done, "every successful compare-and-write counted (seed {seed})");
    sim.run_until_idle(MAX_STEPS);
    let held = sim.on(0, || lookup("D").unwrap().lock_stats());
    assert_eq!((held.held, held.waiting), (0, 0), "no range stays held once the channels are gone: {held:?}");
    let rx = e.run_async(0, || async { delete_vbdev("D", delay::MODULE).await.expect("D deletes") });
    sim.block_on(rx, MAX_STEPS).unwrap();
    let rx = unregister("M", None).unwrap();
    sim.block_on(rx, MAX_STEPS).unwrap();
    sim.run_until_idle(MAX_STEPS);
    check_no_channels(&mut sim, cores);
    sim.trace() ^ value
}

#[test]
fn compare_and_write_counters_with_a_lock_and_a_quiesce() {
    for_seeds(150, caw_counter);
}
