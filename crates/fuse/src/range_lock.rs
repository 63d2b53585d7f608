//! A lock over byte ranges for one reactor: writes whose ranges overlap run one at a time, in the
//! order they arrived; writes to disjoint ranges run side by side.
//!
//! FUSE writes that are not block aligned are read-modify-written. Without this lock an aligned
//! write (or an unmap) landing on the same block between the read and the write-back would be
//! overwritten by stale bytes: an acknowledged write lost.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// One holder or waiter, in arrival order.
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    waker: Option<Waker>,
}

/// Ranges held and waited for on this reactor (not `Send`: one lock per reactor).
#[derive(Default)]
pub struct RangeLock {
    next_id: Cell<u64>,
    /// Arrival order; an entry holds its range once no earlier entry overlaps it.
    entries: RefCell<Vec<Entry>>,
}

/// Holds `[start, end)` of a [`RangeLock`] until dropped.
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Waits until `[start, end)` overlaps no range held or asked for earlier, then holds it.
    pub async fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        assert!(start < end, "empty range {start}..{end}");
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.entries.borrow_mut().push(Entry { id, start, end, waker: None });
        // The guard exists from here on, so a caller dropped while waiting still leaves the queue.
        let guard = RangeGuard { lock: self, id };
        poll_fn(|cx| {
            let mut entries = self.entries.borrow_mut();
            let at = entries.iter().position(|e| e.id == id).expect("own entry queued");
            if entries[..at].iter().any(|e| e.start < end && start < e.end) {
                entries[at].waker = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        guard
    }

    /// Entries holding or waiting (for tests and assertions).
    pub fn queued(&self) -> usize {
        self.entries.borrow().len()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let wakers: Vec<Waker> = {
            let mut entries = self.lock.entries.borrow_mut();
            entries.retain(|e| e.id != self.id);
            // Few writes are in flight per export; waking every waiter lets each re-check.
            entries.iter_mut().filter_map(|e| e.waker.take()).collect()
        };
        for w in wakers {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn disjoint_ranges_are_held_together() {
        let l = RangeLock::default();
        let mut a = pin!(l.lock(0, 4096));
        let mut b = pin!(l.lock(4096, 8192));
        let Poll::Ready(ga) = poll_once(a.as_mut()) else { panic!("free range") };
        let Poll::Ready(gb) = poll_once(b.as_mut()) else { panic!("disjoint from the held range") };
        assert_eq!(l.queued(), 2);
        drop((ga, gb));
        assert_eq!(l.queued(), 0);
    }

    #[test]
    fn overlapping_ranges_wait_in_arrival_order() {
        let l = RangeLock::default();
        let mut first = pin!(l.lock(0, 8192));
        let Poll::Ready(g1) = poll_once(first.as_mut()) else { panic!("first lock must be granted") };
        let mut second = pin!(l.lock(4096, 12288));
        let mut third = pin!(l.lock(8192, 16384));
        assert!(poll_once(second.as_mut()).is_pending(), "overlaps the held range");
        // The third overlaps only the waiting second: it must not overtake it.
        assert!(poll_once(third.as_mut()).is_pending(), "overlaps an earlier waiter");
        drop(g1);
        let Poll::Ready(g2) = poll_once(second.as_mut()) else { panic!("second granted after the first") };
        assert!(poll_once(third.as_mut()).is_pending(), "still overlaps the second");
        drop(g2);
        assert!(poll_once(third.as_mut()).is_ready());
    }

    #[test]
    fn a_waiter_dropped_before_its_turn_leaves_the_queue() {
        let l = RangeLock::default();
        let g = {
            let mut f = pin!(l.lock(0, 10));
            match poll_once(f.as_mut()) {
                Poll::Ready(g) => g,
                Poll::Pending => panic!("free range"),
            }
        };
        {
            let mut w = pin!(l.lock(5, 15));
            assert!(poll_once(w.as_mut()).is_pending());
        }
        assert_eq!(l.queued(), 1, "the abandoned waiter is gone");
        drop(g);
        assert_eq!(l.queued(), 0);
        let mut again = pin!(l.lock(0, 20));
        assert!(poll_once(again.as_mut()).is_ready());
    }
}
