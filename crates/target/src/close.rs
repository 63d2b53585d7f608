//! The two ends of a connection, for targets and the host alike. A graceful close takes no new
//! work, waits until what is outstanding has ended (or a bound has passed), then closes. A
//! forced close ends every command still in the connection's slots, each exactly once (its
//! bdev request completes with the caller's error), after the connection has stopped taking
//! new ones.

use crate::conn::ConnCore;
use crate::slots::SlotTable;
use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

/// Closes `core` gracefully: no new work is taken ([`ConnCore::stop_taking`]); once `idle()`
/// holds (its outstanding commands have ended) or `limit` has passed, the connection is closed
/// for good ([`ConnCore::close`]). The connection wakes the wait ([`ConnCore::wake`]) when its
/// last command ends while it is closing. True if it drained within `limit`; what is left then
/// is for the caller's forced close ([`end_all`]) once its tasks have stopped.
pub async fn close_gracefully(core: &ConnCore, idle: impl Fn() -> bool, limit: Duration) -> bool {
    core.stop_taking();
    let mut timer = pin!(ferrite_reactor::sleep(limit));
    let drained = poll_fn(|cx| {
        if idle() {
            return Poll::Ready(true);
        }
        if core.is_dead() || timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(idle());
        }
        core.park_closer(cx);
        Poll::Pending
    })
    .await;
    core.close();
    drained
}

/// Forced close of the commands still in `slots`: `end(i)` is called once for each slot taken
/// now, with the table released (ending a command completes its bdev request, whose callback
/// may submit again elsewhere), and must release the slot. The connection must take no new
/// work by then ([`ConnCore::stop_taking`] or [`ConnCore::close`]): a command taken meanwhile
/// could reuse a slot still to be ended. Returns how many were ended.
pub fn end_all<T>(core: &ConnCore, slots: &RefCell<SlotTable<T>>, mut end: impl FnMut(u32)) -> usize {
    debug_assert!(core.is_closing(), "connection {}: commands ended while it still takes new ones", core.id);
    let taken = slots.borrow().taken();
    for &i in &taken {
        end(i);
        debug_assert!(!slots.borrow().is_taken(i), "connection {}: slot {i} was not released by its end", core.id);
    }
    taken.len()
}
