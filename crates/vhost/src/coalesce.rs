//! Interrupt coalescing (SPDK's `vhost_controller_set_coalescing`): under load, a queue delays
//! its signals to the driver, by `delay_base_us × (rate − threshold) / threshold` where `rate`
//! is the queue's requests per 10 ms and `threshold` the IOPS threshold's share of 10 ms. A
//! `delay_base_us` of 0 (the default) signals at once. A delayed signal is sent before the
//! reactor sleeps (its sleep hook), so an idle queue never holds one back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often a queue measures its rate (SPDK: SPDK_VHOST_STATS_CHECK_INTERVAL_MS).
pub const INTERVAL: Duration = Duration::from_millis(10);
/// SPDK's default IOPS threshold.
pub const DEFAULT_IOPS_THRESHOLD: u32 = 60_000;

/// A controller's setting, read by its queues on their reactors.
#[derive(Debug)]
pub struct Coalescing {
    /// (delay_base_us << 32) | iops_threshold: one load reads both.
    packed: AtomicU64,
}

impl Default for Coalescing {
    fn default() -> Self {
        Coalescing { packed: AtomicU64::new(DEFAULT_IOPS_THRESHOLD as u64) }
    }
}

impl Coalescing {
    /// Checks and sets a new setting (the RPC's rules: the delay must fit the tick counter's
    /// 32 bits as SPDK has it, and the threshold be at least one request per interval).
    pub fn set(&self, delay_base_us: u32, iops_threshold: u32) -> Result<(), String> {
        let ticks = ferrite_reactor::tsc::duration_to_ticks(Duration::from_micros(delay_base_us as u64));
        if ticks >= u32::MAX as u64 {
            return Err(format!("Delay time of {delay_base_us} is too big"));
        }
        let per_interval = iops_threshold as u64 * INTERVAL.as_millis() as u64 / 1000;
        if per_interval == 0 {
            return Err(format!("IOPS rate of {iops_threshold} is too low. Min is {}", 1000 / INTERVAL.as_millis()));
        }
        self.packed.store((delay_base_us as u64) << 32 | iops_threshold as u64, Ordering::Relaxed);
        Ok(())
    }

    /// (delay_base_us, iops_threshold).
    pub fn get(&self) -> (u32, u32) {
        let p = self.packed.load(Ordering::Relaxed);
        ((p >> 32) as u32, p as u32)
    }
}

/// One queue's coalescing state.
#[derive(Debug, Default)]
pub struct QueueCoalescing {
    /// Requests taken since the last measure.
    taken: u64,
    next_measure: u64,
    /// Ticks to hold signals back by, from the last measure.
    delay: u64,
    /// No signal before this tick.
    next_signal: u64,
}

impl QueueCoalescing {
    /// A request was taken.
    #[inline]
    pub fn taken(&mut self) {
        self.taken += 1;
    }

    /// Whether a signal may go now (and, if so, when the next may).
    pub fn may_signal(&mut self, setting: &Coalescing) -> bool {
        let (base_us, threshold) = setting.get();
        if base_us == 0 {
            return true;
        }
        let now = ferrite_reactor::tsc::ticks();
        if now >= self.next_measure {
            let interval = ferrite_reactor::tsc::duration_to_ticks(INTERVAL);
            let rate = (threshold as u64 * INTERVAL.as_millis() as u64 / 1000).max(1);
            let base = ferrite_reactor::tsc::duration_to_ticks(Duration::from_micros(base_us as u64));
            self.delay = if self.taken > rate { base * (self.taken - rate) / rate } else { 0 };
            self.taken = 0;
            self.next_measure = now + interval;
            self.next_signal = self.next_signal.min(now + self.delay);
        }
        if now < self.next_signal {
            return false;
        }
        self.next_signal = now + self.delay;
        true
    }

    /// The delay signals are held back by now, in ticks.
    pub fn delay_ticks(&self) -> u64 {
        self.delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_follows_spdk_rules() {
        let c = Coalescing::default();
        assert_eq!(c.get(), (0, 60_000));
        assert!(c.set(50, 99).is_err(), "fewer than one request per 10 ms");
        assert!(c.set(u32::MAX, 60_000).is_err(), "a delay that does not fit 32 bits of ticks");
        c.set(50, 100).unwrap();
        assert_eq!(c.get(), (50, 100));
    }

    #[test]
    fn signals_go_at_once_below_the_threshold_and_are_spaced_above_it() {
        let c = Coalescing::default();
        let mut q = QueueCoalescing::default();
        assert!(q.may_signal(&c) && q.may_signal(&c), "off: every signal goes");
        c.set(10_000, 100).unwrap(); // 1 request per 10 ms; 10 ms base
                                     // A measure with one request: no delay.
        q.taken();
        q.next_measure = 0;
        assert!(q.may_signal(&c));
        assert_eq!(q.delay_ticks(), 0);
        // Ten requests in the interval: a delay of 9 × 10 ms; the next signal waits.
        for _ in 0..10 {
            q.taken();
        }
        q.next_measure = 0;
        assert!(q.may_signal(&c), "the first signal after the measure goes");
        assert!(!q.may_signal(&c), "the next one is held back");
        assert!(q.delay_ticks() >= ferrite_reactor::tsc::duration_to_ticks(Duration::from_millis(80)));
    }
}
