//! Logging that a remote peer cannot turn into a flood: [`log_limited!`] logs a call site's
//! message at most once per second and counts the ones it drops, saying how many in the next
//! line it logs. For messages an attacker can trigger at will (connections that never log in,
//! malformed input); not for the data path.

use std::sync::atomic::{AtomicU64, Ordering};

/// One call site's budget: the second it last logged in, and what it dropped since.
pub struct RateLimit {
    last_sec: AtomicU64,
    dropped: AtomicU64,
}

impl RateLimit {
    /// A fresh budget (for a `static`).
    pub const fn new() -> Self {
        Self { last_sec: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    /// `Some(dropped)` if this call may log (with how many were dropped since the last that
    /// did), `None` if it must not.
    pub fn admit(&self) -> Option<u64> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) + 1;
        let last = self.last_sec.load(Ordering::Relaxed);
        if last != now && self.last_sec.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.dropped.swap(0, Ordering::Relaxed));
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// `log_limited!(log::Level::Warn, "format", args...)`: logs at most once per second from this
/// call site, noting how many similar messages were dropped.
#[macro_export]
macro_rules! log_limited {
    ($lvl:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::ratelog::RateLimit = $crate::ratelog::RateLimit::new();
        if let Some(dropped) = LIMIT.admit() {
            if dropped > 0 {
                ::log::log!($lvl, "{} ({} similar messages dropped)", format_args!($($arg)+), dropped);
            } else {
                ::log::log!($lvl, $($arg)+);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_one_per_second_and_counts_the_rest() {
        let l = RateLimit::new();
        assert_eq!(l.admit(), Some(0));
        for _ in 0..5 {
            assert_eq!(l.admit(), None);
        }
        // Pretend a second went by.
        l.last_sec.store(1, Ordering::Relaxed);
        assert_eq!(l.admit(), Some(5));
    }
}
