//! Deterministic simulation: every reactor of an engine on the calling thread, run turn by turn
//! in an order chosen by a seeded generator, against a simulated clock.
//!
//! Each step picks a reactor and runs a slice of its loop (a few mailbox messages, a few ready
//! tasks, its pollers once, its due timers); how many of each, and which reactor, the seed
//! decides. When no reactor has work the clock jumps to the earliest timer. Each turn advances the
//! clock by a little (the seed decides how much), so timeouts fire in the middle of the work as
//! they would on real cores. The reactors' thread-local state ([`crate::reactor_local!`]) is
//! swapped in and out with them, so layers above see one reactor at a time exactly as on real
//! threads. `spawn_blocking` jobs run at once on the simulator's thread.
//!
//! What a simulation leaves out: io_uring (modules that submit to the kernel are not simulated)
//! and real threads. What it gives: a failing interleaving is found by trying many seeds and
//! replays exactly from its seed ([`Sim::trace`] digests the schedule to prove it).
//!
//! SPDK's `ut_multithread` (threads polled one at a time by a unit test) and TigerBeetle's
//! simulator are the models.

use crate::local::{self, Stash};
use crate::oneshot::{Canceled, Receiver};
use crate::reactor::{set_current, Engine, EngineConfig, Local, ReactorMode};
use crate::{tsc, BufPoolConfig};
use std::rc::Rc;
use std::time::Duration;

/// Where the simulated clock starts (nanoseconds): far from zero, so code subtracting small
/// durations from "now" behaves as on a machine that has been up for a while.
const EPOCH: u64 = 1_000_000_000_000;

/// The longest a busy turn advances the clock, in nanoseconds.
const MAX_TURN_NANOS: u64 = 2_000;

/// A small, fast, seedable generator (SplitMix64): the same seed gives the same sequence on every
/// machine.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// A simulated engine and its scheduler. Not `Send`: it lives on the thread that made it.
pub struct Sim {
    engine: Engine,
    locals: Vec<Rc<Local>>,
    /// Each switched-out reactor's thread-local state.
    stashes: Vec<Stash>,
    rng: SimRng,
    seed: u64,
    now: u64,
    steps: u64,
    trace: u64,
    /// Per reactor: messages, tasks, poller passes with work and timers run.
    work: Vec<[u64; 4]>,
}

impl Sim {
    /// An engine of `reactors` reactors whose schedule follows `seed`. The calling thread is
    /// entered into it (see [`crate::context`]) and its clock is simulated until the `Sim` drops.
    pub fn new(seed: u64, reactors: usize) -> std::io::Result<Sim> {
        let cfg = EngineConfig {
            cores: (0..reactors).collect(),
            mode: ReactorMode::Poll,
            ring_entries: 32,
            ring_handlers: 64,
            bufs: BufPoolConfig {
                small_count: 256,
                large_count: 16,
                jumbo_count: 8,
                heap_budget: 16 << 20,
                ..Default::default()
            },
            // Sockets are not simulated: no receive ring.
            recv_bufs: crate::RecvBufConfig { count: 0, ..Default::default() },
            pin: false,
            ..Default::default()
        };
        let engine = Engine::simulated(&cfg)?;
        let locals = (0..reactors).map(|id| Local::new(&engine, id, &cfg)).collect::<std::io::Result<Vec<_>>>()?;
        tsc::sim_begin(EPOCH);
        crate::context::enter_unguarded(&engine);
        Ok(Sim {
            engine,
            stashes: (0..reactors).map(|_| Stash::default()).collect(),
            locals,
            rng: SimRng::new(seed),
            seed,
            now: EPOCH,
            steps: 0,
            trace: seed,
            work: vec![[0; 4]; reactors],
        })
    }

    /// The simulated engine (send it messages, give it to layers as any engine).
    pub fn engine(&self) -> Engine {
        self.engine.clone()
    }

    /// The seed this simulation follows.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Simulated time since the simulation began.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now - EPOCH)
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// A digest of every scheduling decision and its outcome so far: two runs of one seed that
    /// took the same path have the same trace.
    pub fn trace(&self) -> u64 {
        self.trace
    }

    /// The simulation's random generator, for tests that choose their actions from the seed too.
    pub fn rng(&mut self) -> &mut SimRng {
        &mut self.rng
    }

    /// Runs `f` as reactor `id` (its thread-local state, `current()`, `spawn_local`, timers).
    pub fn on<R>(&mut self, id: usize, f: impl FnOnce() -> R) -> R {
        self.switch_in(id);
        let r = f();
        self.switch_out(id);
        r
    }

    /// One step: a slice of one reactor's loop, or, when no reactor has work, a jump of the
    /// clock to the earliest timer. False when nothing is left to do at all.
    pub fn step(&mut self) -> bool {
        self.steps += 1;
        let n = self.locals.len();
        let first = self.rng.below(n as u64) as usize;
        for k in 0..n {
            let id = (first + k) % n;
            let work = self.turn(id);
            self.mix(id as u64, work as u64);
            if work > 0 {
                let d = self.rng.below(MAX_TURN_NANOS);
                self.advance_to(self.now + d);
                return true;
            }
        }
        match self.locals.iter().filter_map(|l| l.next_timer()).min() {
            Some(t) => {
                self.mix(u64::MAX, t);
                self.advance_to(t.max(self.now));
                true
            }
            None => false,
        }
    }

    /// Steps until nothing is left to do or `max_steps` were taken; the steps taken.
    pub fn run_until_idle(&mut self, max_steps: u64) -> u64 {
        let start = self.steps;
        while self.steps - start < max_steps && self.step() {}
        self.steps - start
    }

    /// Steps until `rx` has its value. Panics (naming the seed) if the simulation runs out of
    /// work or of `max_steps` first: in a simulation that is a hang.
    pub fn block_on<T>(&mut self, mut rx: Receiver<T>, max_steps: u64) -> Result<T, Canceled> {
        let start = self.steps;
        loop {
            if let Some(v) = rx.try_recv() {
                return v;
            }
            if self.steps - start >= max_steps {
                panic!("seed {}: no answer after {max_steps} steps ({})", self.seed, self.describe());
            }
            if !self.step() {
                panic!(
                    "seed {}: every reactor is idle and the awaited answer never came (a hang; {})",
                    self.seed,
                    self.describe()
                );
            }
        }
    }

    /// Steps until the simulated clock has advanced by `d` (or nothing is left to do).
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64);
        while self.now < until {
            if !self.step() {
                self.advance_to(until);
            }
        }
    }

    /// Simulated time and each reactor's work so far (messages, tasks, poller passes with work,
    /// timers), for hang reports.
    pub fn describe(&self) -> String {
        let per: Vec<String> = self
            .work
            .iter()
            .enumerate()
            .map(|(i, w)| format!("r{i}: {} msgs {} tasks {} polls {} timers", w[0], w[1], w[2], w[3]))
            .collect();
        format!("{:?} simulated; {}", self.elapsed(), per.join("; "))
    }

    fn turn(&mut self, id: usize) -> usize {
        let messages = 1 + self.rng.below(4) as usize;
        let tasks = 1 + self.rng.below(4);
        self.switch_in(id);
        let l = self.locals[id].clone();
        let msgs = self.engine.mailbox(id).drain(messages, |m| m.run());
        let mut ran = 0;
        for _ in 0..tasks {
            if !l.run_one_task() {
                break;
            }
            ran += 1;
        }
        let polls = l.run_pollers();
        let timers = l.run_timers(self.now);
        let w = &mut self.work[id];
        for (i, n) in [msgs, ran, polls, timers].into_iter().enumerate() {
            w[i] += n as u64;
        }
        let work = msgs + ran + polls + timers;
        self.switch_out(id);
        work
    }

    fn switch_in(&mut self, id: usize) {
        local::put_all(std::mem::take(&mut self.stashes[id]));
        set_current(Some(&self.locals[id]));
    }

    fn switch_out(&mut self, id: usize) {
        debug_assert_eq!(crate::current(), Some(self.locals[id].index()));
        self.stashes[id] = local::take_all();
        set_current(None);
    }

    fn advance_to(&mut self, t: u64) {
        self.now = t;
        tsc::sim_set(t);
    }

    fn mix(&mut self, a: u64, b: u64) {
        self.trace = (self.trace ^ a).wrapping_mul(0x100_0000_01b3).rotate_left(17) ^ b;
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.engine.stop();
        if std::thread::panicking() {
            // A step panicked: the reactors' state may be mid-change, so it is leaked rather than
            // dropped (a second panic would abort the test process).
            set_current(None);
            std::mem::forget(std::mem::take(&mut self.locals));
            std::mem::forget(std::mem::take(&mut self.stashes));
            std::mem::forget(local::take_all());
        } else {
            for id in 0..self.locals.len() {
                self.switch_in(id);
                self.locals[id].wind_down();
                // The reactor's thread-local state drops as that reactor.
                drop(local::take_all());
                set_current(None);
            }
        }
        crate::context::leave(&self.engine);
        self.engine.extensions().clear();
        tsc::sim_end();
    }
}

/// The seeds a simulation test runs: `SIM_SEED` alone if set, else `SIM_SEEDS` (or `default`)
/// seeds from 0.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n = std::env::var("SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    (0..n).collect()
}

/// Runs `f` for every seed of [`seeds`] and returns the (wrapping) sum of what it returned; a failure
/// panics naming its seed and how to replay it.
pub fn for_seeds(default: u64, f: impl Fn(u64) -> u64) -> u64 {
    let mut total = 0u64;
    for seed in seeds(default) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed))) {
            Ok(n) => total = total.wrapping_add(n),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("seed {seed} failed (replay: SIM_SEED={seed}): {msg}");
            }
        }
    }
    total
}
