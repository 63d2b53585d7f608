//! One control operation at a time: creates, destroys and child changes of nexuses run
//! on the engine's first core as tasks that await I/O (the store, quiesce), and each holds
//! this lock from start to end, as SPDK's single app thread runs them one after another.

use std::cell::RefCell;
use std::task::{Poll, Waker};

#[derive(Default)]
struct Ctl {
    held: bool,
    waiters: Vec<Waker>,
}

thread_local! {
    static CTL: RefCell<Ctl> = RefCell::new(Ctl::default());
}

/// Held control lock; dropping it lets the next operation in.
pub(crate) struct Guard(());

/// Waits for the control lock. Every waiter is woken when it is released (a waiter that gave
/// up never holds up the others).
pub(crate) async fn lock() -> Guard {
    std::future::poll_fn(|cx| {
        CTL.with(|c| {
            let mut c = c.borrow_mut();
            if c.held {
                c.waiters.push(cx.waker().clone());
                Poll::Pending
            } else {
                c.held = true;
                Poll::Ready(Guard(()))
            }
        })
    })
    .await
}

impl Drop for Guard {
    fn drop(&mut self) {
        let waiters = CTL.with(|c| {
            let mut c = c.borrow_mut();
            debug_assert!(c.held, "a guard stands for a held lock");
            c.held = false;
            std::mem::take(&mut c.waiters)
        });
        for w in waiters {
            w.wake();
        }
    }
}
