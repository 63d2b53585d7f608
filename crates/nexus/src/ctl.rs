//! One control operation at a time: creates, destroys and child changes of nexuses run
//! on the engine's first core as tasks that await I/O (the store, quiesce), and each holds
//! this lock from start to end, as SPDK's single app thread runs them one after another.

use ferrite_reactor::{TurnGuard, TurnLock};

thread_local! {
    static CTL: TurnLock = TurnLock::new();
}

/// Held control lock; dropping it lets the next operation in.
pub(crate) type Guard = TurnGuard;

/// Waits for the control lock.
pub(crate) async fn lock() -> Guard {
    CTL.with(TurnLock::clone).lock().await
}
