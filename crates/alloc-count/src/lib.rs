//! A global allocator for tests that proves a path allocates nothing: it forwards to the
//! system allocator and counts each thread's allocations (and reallocations). A test binary
//! installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: ferrite_alloc_count::Counting = ferrite_alloc_count::Counting;
//! ```
//!
//! and reads [`allocs`] on the thread it watches (a reactor's) before and after a measured run.
//! To find where an allocation comes from, [`trace_next`] prints the backtraces of the next N
//! allocations of the calling thread.

#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator.
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Backtraces still to print for this thread's allocations.
    static TRACE_LEFT: Cell<u32> = const { Cell::new(0) };
    /// Set while a backtrace is taken: its own allocations are neither counted nor traced.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// Allocations this thread has made so far.
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Prints the backtraces of this thread's next `n` allocations (0: stop).
pub fn trace_next(n: u32) {
    TRACE_LEFT.with(|t| t.set(n));
}

/// `FERRITE_ALLOC_TRACE` as a number of backtraces to print (0 when unset).
pub fn trace_from_env() -> u32 {
    std::env::var("FERRITE_ALLOC_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Counts an allocation of `size` bytes on this thread (and prints where it came from while
/// this thread traces). Touches only const thread-locals, so it never allocates itself, and
/// does nothing once they are gone (thread exit).
fn count(size: usize) {
    let _ = IN_TRACE.try_with(|busy| {
        if busy.get() {
            return;
        }
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        let _ = TRACE_LEFT.try_with(|left| {
            if left.get() > 0 {
                left.set(left.get() - 1);
                busy.set(true);
                let bt = std::backtrace::Backtrace::force_capture();
                eprintln!("allocation of {size} bytes on {:?}:\n{bt}", std::thread::current().name());
                busy.set(false);
            }
        });
    });
}

// SAFETY: forwards to the system allocator; counting touches only const thread-local cells
// (tracing, a test-only diagnostic, allocates with counting turned off).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded; `p` came from this allocator, so from `System`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count(n);
        // SAFETY: forwarded; `p` came from this allocator, so from `System`.
        unsafe { System.realloc(p, l, n) }
    }
}
