//! A cheap monotonic tick counter (the CPU's time-stamp counter on x86_64) and its rate.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Simulations alive in the process; while none is, `ticks` never looks at the simulated clock.
static SIMULATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The simulated clock of the simulation running on this thread, in nanoseconds.
    static SIM_NOW: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The simulated time of this thread's simulation, if one runs here. Outside simulations this
/// is one load of a shared counter that never changes and a branch never taken; the rest is
/// out of line.
#[inline(always)]
fn sim_now() -> Option<u64> {
    if SIMULATIONS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    sim_now_slow()
}

#[cold]
#[inline(never)]
fn sim_now_slow() -> Option<u64> {
    SIM_NOW.try_with(|c| c.get()).ok().flatten()
}

/// Makes this thread's clock simulated (ticks are then nanoseconds), starting at `now`.
pub(crate) fn sim_begin(now: u64) {
    SIMULATIONS.fetch_add(1, Ordering::Relaxed);
    SIM_NOW.with(|c| c.set(Some(now)));
}

/// Moves this thread's simulated clock.
pub(crate) fn sim_set(now: u64) {
    SIM_NOW.with(|c| c.set(Some(now)));
}

/// Gives this thread back the real clock.
pub(crate) fn sim_end() {
    SIM_NOW.with(|c| c.set(None));
    SIMULATIONS.fetch_sub(1, Ordering::Relaxed);
}

/// Reads the tick counter. On x86_64 this is `rdtsc` (about 20 cycles, no syscall); elsewhere it
/// falls back to nanoseconds since the first call. On a thread that runs a simulation it reads
/// the simulated clock.
#[inline(always)]
pub fn ticks() -> u64 {
    if let Some(t) = sim_now() {
        return t;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions; every x86_64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Ticks per second, measured once against the monotonic clock (about 20 ms on first use);
/// exactly 10^9 in a simulation, so that a seed replays the same deadlines.
#[inline]
pub fn ticks_per_sec() -> u64 {
    if sim_now().is_some() {
        return 1_000_000_000;
    }
    static RATE: OnceLock<u64> = OnceLock::new();
    *RATE.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") {
            return 1_000_000_000;
        }
        let (t0, i0) = clock_pair();
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = clock_pair();
        let nanos = (i1 - i0).as_nanos().max(1);
        ((t1.wrapping_sub(t0) as u128) * 1_000_000_000 / nanos) as u64
    })
}

/// A tick count and the monotonic clock at the same moment: the tick read bracketed by two
/// clock reads, the tightest bracket of a few tries, its midpoint. A pair read one after the
/// other could straddle a preemption and skew the rate by tens of ppm (a delay bdev's 12 ms
/// then ends a fraction of a µs early by the wall clock).
fn clock_pair() -> (u64, Instant) {
    let mut best: Option<(Duration, u64, Instant)> = None;
    for _ in 0..16 {
        let a = Instant::now();
        let t = ticks();
        let b = Instant::now();
        let width = b - a;
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, t, a + width / 2));
        }
    }
    let (_, t, at) = best.expect("sampled at least once");
    (t, at)
}

/// Converts a tick count into nanoseconds.
#[inline]
pub fn ticks_to_nanos(t: u64) -> u64 {
    ((t as u128) * 1_000_000_000 / ticks_per_sec() as u128) as u64
}

/// Converts a duration into ticks.
pub fn duration_to_ticks(d: Duration) -> u64 {
    ((d.as_nanos()) * ticks_per_sec() as u128 / 1_000_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_at_the_measured_rate() {
        let rate = ticks_per_sec();
        assert!(rate > 1_000_000, "implausible tick rate {rate}");
        let t0 = ticks();
        std::thread::sleep(Duration::from_millis(30));
        let ns = ticks_to_nanos(ticks() - t0);
        assert!(ns >= 25_000_000, "30 ms sleep measured as {ns} ns");
        assert_eq!(duration_to_ticks(Duration::from_secs(1)), rate);
    }
}
