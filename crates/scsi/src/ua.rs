//! Unit attention conditions of one I_T nexus on one logical unit (SAM-5 5.14, SPC-4 5.9):
//! a short queue, oldest first, each condition reported once by the next command that is not
//! INQUIRY, REPORT LUNS or REQUEST SENSE (which reports it and clears it). The pending flag is
//! an atomic, so a command checks it with one relaxed load; a condition is established from
//! any thread.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most conditions kept per nexus: a condition already queued is not queued twice, and past
/// this the oldest go (SAM-5 lets a logical unit drop conditions it has no room for).
pub const UA_MAX: usize = 8;

/// The unit attention conditions of one I_T_L nexus.
#[derive(Default)]
pub struct UnitAttention {
    pending: AtomicBool,
    queue: Mutex<VecDeque<(u8, u8)>>,
}

impl UnitAttention {
    /// Establishes the condition `(asc, ascq)`, unless it is queued already. A reset condition
    /// (ASC 29h) replaces every older one: they described a state the reset ended.
    pub fn establish(&self, code: (u8, u8)) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if code.0 == 0x29 {
            q.clear();
        }
        if !q.contains(&code) {
            if q.len() == UA_MAX {
                q.pop_front();
            }
            q.push_back(code);
        }
        debug_assert!(q.len() <= UA_MAX);
        self.pending.store(true, Ordering::Release);
    }

    /// True while a condition is pending (one relaxed load).
    #[inline]
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Takes the oldest condition (it is reported now, and so cleared).
    pub fn take(&self) -> Option<(u8, u8)> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let c = q.pop_front();
        self.pending.store(!q.is_empty(), Ordering::Release);
        c
    }

    /// Drops every condition.
    pub fn clear(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.clear();
        self.pending.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_come_once_in_order_and_a_reset_replaces_older_ones() {
        let ua = UnitAttention::default();
        assert!(!ua.pending());
        ua.establish((0x2a, 0x01));
        ua.establish((0x2a, 0x09));
        ua.establish((0x2a, 0x01));
        assert!(ua.pending());
        assert_eq!(ua.take(), Some((0x2a, 0x01)));
        assert_eq!(ua.take(), Some((0x2a, 0x09)));
        assert_eq!(ua.take(), None);
        assert!(!ua.pending());
        ua.establish((0x2a, 0x01));
        ua.establish((0x29, 0x03));
        assert_eq!(ua.take(), Some((0x29, 0x03)));
        assert!(!ua.pending());
    }
}
