//! The panic policy of reactor threads: a panic on a reactor aborts the process.
//!
//! A reactor that unwound would leave its peers and every caller waiting on it (RPC clients,
//! `Engine::call`) hanging, and its tasks, pollers and `RefCell`s in an unknown state. So
//! [`install_hook`] (called by `Engine::start`) chains a process-wide panic hook: after the
//! previous hook ran (the default one prints the message, location and, with
//! `RUST_BACKTRACE=1`, a backtrace), a panic on a reactor thread logs
//! `reactor N panicked at FILE:LINE:COL: MESSAGE; aborting` (through `log` if an error-level
//! logger is installed, else straight to stderr) and calls `abort()`: nothing is unwound, the
//! process ends at once with SIGABRT. Panics on other threads (blocking workers, control
//! threads) are left to the previous hook and unwind as usual.

use std::cell::Cell;
use std::io::Write;
use std::sync::Once;

thread_local! {
    /// The reactor index of this thread, for the hook (set for the whole life of the thread).
    static REACTOR: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the calling thread as reactor `id`: from now on a panic on it aborts the process.
pub(crate) fn mark_reactor(id: usize) {
    REACTOR.with(|r| r.set(Some(id)));
}

/// The text of a panic's payload.
pub(crate) fn payload_text(p: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = p.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s
    } else {
        "Box<dyn Any>"
    }
}

/// Installs the hook (once per process; later calls do nothing).
pub(crate) fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            prev(info);
            let Some(id) = REACTOR.try_with(|r| r.get()).ok().flatten() else { return };
            let loc = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_else(|| "an unknown location".into());
            let msg = format!("reactor {id} panicked at {loc}: {}; aborting", payload_text(info.payload()));
            if log::log_enabled!(log::Level::Error) {
                log::error!("{msg}");
                log::logger().flush();
            } else {
                // Not eprintln!: that would go to a test harness's capture buffer, lost on abort.
                let _ = writeln!(std::io::stderr(), "{msg}");
            }
            std::process::abort();
        }));
    });
}
