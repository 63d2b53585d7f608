//! A lock for tasks of one reactor that must run one after another across their awaits (SPDK's
//! single app thread runs control operations so): `TurnLock::lock` waits until no other task
//! holds it. Not `Send`: the lock and its guards stay on the reactor that made them.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};

#[derive(Default)]
struct Inner {
    held: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

/// A reactor-local lock held across awaits (a handle: clones share the lock).
#[derive(Clone, Default)]
pub struct TurnLock(Rc<Inner>);

/// A held [`TurnLock`]; dropping it lets the next task in.
pub struct TurnGuard(Rc<Inner>);

impl TurnLock {
    /// A free lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for the lock. Every waiter is woken when it is released (a waiter that gave up
    /// never holds up the others).
    pub async fn lock(&self) -> TurnGuard {
        std::future::poll_fn(|cx| {
            if self.0.held.get() {
                self.0.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            } else {
                self.0.held.set(true);
                Poll::Ready(TurnGuard(self.0.clone()))
            }
        })
        .await
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        debug_assert!(self.0.held.get(), "a guard stands for a held lock");
        self.0.held.set(false);
        let waiters = std::mem::take(&mut *self.0.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }
}
