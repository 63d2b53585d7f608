//! What a listener does when `accept` fails, and the descriptor limit every listener needs.
//!
//! Out of descriptors (`EMFILE`, `ENFILE`) the pending connection stays in the kernel's backlog
//! and every retry fails the same way until a descriptor is freed, so a listener that logged
//! each failure and retried at once would fill the log and a core. [`AcceptErrors`] says how
//! long to wait before the next try (10 ms, doubling to 200 ms while the failures go on) and
//! logs the first failure, then a count at most every 10 s, then the recovery.

use std::time::{Duration, Instant};

/// First wait after a failed accept.
const FIRST_WAIT: Duration = Duration::from_millis(10);
/// Longest wait between tries while accept keeps failing.
const MAX_WAIT: Duration = Duration::from_millis(200);
/// At most one log line per this while accept keeps failing.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A listener's run of failed accepts.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    /// Failures since the last successful accept.
    failed: u64,
    /// Failures not yet reported in the log.
    unlogged: u64,
    /// When the last line was logged.
    logged_at: Option<Instant>,
    /// The next wait.
    wait: Duration,
}

impl AcceptErrors {
    /// A listener whose accepts have not failed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a failed accept on listener `what`; returns how long to wait before trying again.
    pub fn failed(&mut self, what: &str, e: &std::io::Error) -> Duration {
        self.failed += 1;
        self.unlogged += 1;
        let now = Instant::now();
        if self.logged_at.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            if self.failed == 1 {
                log::warn!("{what}: accept: {e}; retrying");
            } else {
                log::warn!(
                    "{what}: accept: {e} ({} more failures, {} in all); retrying",
                    self.unlogged - 1,
                    self.failed
                );
            }
            self.unlogged = 0;
            self.logged_at = Some(now);
        }
        self.wait = if self.failed == 1 { FIRST_WAIT } else { (self.wait * 2).min(MAX_WAIT) };
        self.wait
    }

    /// Records a successful accept (logs the end of a run of failures).
    pub fn ok(&mut self, what: &str) {
        if self.failed > 0 {
            log::warn!("{what}: accepting again after {} failed accepts", self.failed);
            *self = Self::default();
        }
    }

    /// Failures since the last successful accept.
    pub fn failures(&self) -> u64 {
        self.failed
    }
}

/// Raises the soft limit of open descriptors to the hard limit, once per process: every
/// connection is a descriptor, and the usual soft limit (1,024) would stop a server far below
/// its connection limit. Returns the soft limit in force.
pub fn raise_fd_limit() -> u64 {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: getrlimit/setrlimit read and write the struct we own.
        unsafe {
            let mut r: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
                let old = r.rlim_cur;
                r.rlim_cur = r.rlim_max;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) == 0 {
                    log::info!("open file limit raised from {old} to {}", r.rlim_max);
                }
            }
        }
    });
    // SAFETY: as above.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_reset_on_success() {
        let mut a = AcceptErrors::new();
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let waits: Vec<Duration> = (0..8).map(|_| a.failed("test", &e)).collect();
        assert_eq!(waits[0], FIRST_WAIT);
        assert_eq!(waits[1], FIRST_WAIT * 2);
        assert_eq!(*waits.last().unwrap(), MAX_WAIT);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(a.failures(), 8);
        // Only the first failure was logged: the rest wait for LOG_EVERY.
        assert_eq!(a.unlogged, 7);
        a.ok("test");
        assert_eq!(a.failures(), 0);
        assert_eq!(a.failed("test", &e), FIRST_WAIT);
    }
}
