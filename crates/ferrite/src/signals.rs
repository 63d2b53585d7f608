//! Shutdown signals: blocked in every thread, then awaited by the main thread with sigwait.

/// The signals that ask the daemon to stop (SIGHUP too: a daemon has no terminal to reload
/// for, and SPDK's spdk_kill_instance SIGHUP must not kill it without cleanup).
const STOP_SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGHUP];

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the stop signals in the calling thread and every thread it starts afterwards.
pub fn block() {
    let set = stop_set();
    // SAFETY: set is a valid, initialised signal set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits for a stop signal and returns its name.
pub fn wait() -> &'static str {
    let set = stop_set();
    let mut sig = 0;
    // SAFETY: set and sig are valid for the call.
    unsafe { libc::sigwait(&set, &mut sig) };
    name(sig)
}

fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "SIGQUIT",
    }
}
