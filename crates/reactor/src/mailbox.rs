//! The inbound message queue of a reactor: lock-free, many producers, one consumer, with an
//! eventfd doorbell that is rung only when the reactor sleeps.
//!
//! Messages are closures stored in place ([`InlineMsg`]): a closure of up to
//! [`INLINE_BYTES`] bytes travels without a heap allocation, in a slot of a preallocated ring of
//! [`RING_SLOTS`] entries. Bigger closures are boxed (one allocation) and the box travels in a
//! slot. If the ring is full, messages go to an unbounded overflow queue (which allocates in
//! blocks); while the overflow holds anything every sender uses it too, and the consumer takes
//! ring entries before overflow ones, so messages from one sender still run in sending order.

use crossbeam_queue::{ArrayQueue, SegQueue};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

/// A boxed message: a closure run once on the receiving reactor. ([`Mailbox::post`] takes one;
/// [`Mailbox::post_fn`] avoids the box for small closures.)
pub type Message = Box<dyn FnOnce() + Send + 'static>;

const INLINE_WORDS: usize = 6;
/// Closures up to this size (and at most pointer-aligned) are stored without an allocation.
pub const INLINE_BYTES: usize = INLINE_WORDS * std::mem::size_of::<usize>();
/// Slots of each mailbox's preallocated ring.
pub const RING_SLOTS: usize = 1024;

/// A `FnOnce() + Send` closure stored in place (boxed first if it is too big to fit).
pub struct InlineMsg {
    /// Moves the closure out of `data` and runs it (`true`) or drops it (`false`).
    shim: unsafe fn(*mut u8, bool),
    data: MaybeUninit<[usize; INLINE_WORDS]>,
}

// SAFETY: an InlineMsg only ever holds a closure that is `Send` (checked by `InlineMsg::new`).
unsafe impl Send for InlineMsg {}

/// # Safety
/// `p` must point to a valid `F` written by `InlineMsg::store`, which is moved out here and
/// must not be used again.
unsafe fn shim<F: FnOnce()>(p: *mut u8, run: bool) {
    // SAFETY: guaranteed by the caller.
    let f = unsafe { std::ptr::read(p as *mut F) };
    if run {
        f();
    }
}

impl InlineMsg {
    /// True if closures of type `F` are stored without an allocation.
    pub const fn fits<F>() -> bool {
        std::mem::size_of::<F>() <= INLINE_BYTES && std::mem::align_of::<F>() <= std::mem::align_of::<usize>()
    }

    /// Wraps `f`: in place if it fits, else in a box (one allocation).
    #[inline]
    pub fn new<F: FnOnce() + Send + 'static>(f: F) -> Self {
        if Self::fits::<F>() {
            Self::store(f)
        } else {
            let b = Box::new(f);
            Self::store(b)
        }
    }

    #[inline]
    fn store<F: FnOnce() + Send + 'static>(f: F) -> Self {
        assert!(Self::fits::<F>());
        let mut data = MaybeUninit::<[usize; INLINE_WORDS]>::uninit();
        // SAFETY: `data` is large and aligned enough for F (asserted above, a constant check
        // the compiler removes) and uninitialized, so nothing is overwritten.
        unsafe { std::ptr::write(data.as_mut_ptr() as *mut F, f) };
        Self { shim: shim::<F>, data }
    }

    /// Runs the closure.
    #[inline]
    pub fn run(self) {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `data` holds the closure `shim` was made for; ManuallyDrop keeps Drop from
        // touching it again after it is moved out.
        unsafe { (me.shim)(me.data.as_mut_ptr() as *mut u8, true) }
    }
}

impl Drop for InlineMsg {
    fn drop(&mut self) {
        // SAFETY: an InlineMsg that was not run still holds its closure; drop it once.
        unsafe { (self.shim)(self.data.as_mut_ptr() as *mut u8, false) }
    }
}

/// One reactor's inbound queue and doorbell.
pub struct Mailbox {
    ring: ArrayQueue<InlineMsg>,
    overflow: SegQueue<InlineMsg>,
    /// Messages in (or being pushed to) `overflow`.
    overflow_len: AtomicUsize,
    sleeping: AtomicBool,
    closed: AtomicBool,
    doorbell: OwnedFd,
}

impl Mailbox {
    /// Creates an empty mailbox with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the returned fd is checked and owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            ring: ArrayQueue::new(RING_SLOTS),
            overflow: SegQueue::new(),
            overflow_len: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            // SAFETY: fd is a new descriptor that nothing else owns.
            doorbell: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Queues a boxed message; rings the doorbell if the owner is asleep.
    pub fn post(&self, msg: Message) {
        self.push(InlineMsg::new(msg));
    }

    /// Queues a closure, without an allocation if it fits in [`INLINE_BYTES`] and the ring has
    /// room; rings the doorbell if the owner is asleep.
    #[inline]
    pub fn post_fn<F: FnOnce() + Send + 'static>(&self, f: F) {
        self.push(InlineMsg::new(f));
    }

    /// Queues a message; rings the doorbell if the owner is asleep. After [`Mailbox::close`]
    /// the message is dropped (on the calling thread) instead.
    pub fn push(&self, msg: InlineMsg) {
        // Once the overflow holds anything, new messages go there too (keeping each sender's
        // order); the consumer takes ring entries first.
        let rejected =
            if self.overflow_len.load(Ordering::SeqCst) == 0 { self.ring.push(msg).err() } else { Some(msg) };
        if let Some(msg) = rejected {
            self.overflow_len.fetch_add(1, Ordering::SeqCst);
            self.overflow.push(msg);
        }
        // Pairs with the fence in `prepare_sleep`: either the owner sees the message, or we see
        // that it sleeps and wake it. Likewise with `close`: either the owner's final drain sees
        // the message or we see `closed` and drop it ourselves.
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) {
            self.discard();
            return;
        }
        if self.sleeping.load(Ordering::Relaxed) {
            self.ring();
        }
    }

    /// Wakes the owner unconditionally.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd.
        unsafe { libc::write(self.doorbell.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    /// Takes up to about `max` messages in order and passes each to `f` (the owner only).
    /// Returns how many were taken.
    #[inline]
    pub fn drain(&self, max: usize, mut f: impl FnMut(InlineMsg)) -> usize {
        // Fast path for the common empty case: plain loads, no fence (a pop that finds the
        // queue empty issues a full fence). A message missed here is seen on the next turn, and
        // `prepare_sleep` checks with a fence before sleeping.
        if self.ring.is_empty() && self.overflow_len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut n = 0;
        while n < max {
            if let Some(m) = self.ring.pop() {
                f(m);
                n += 1;
                continue;
            }
            if self.overflow_len.load(Ordering::SeqCst) == 0 {
                break;
            }
            // A sender may have counted its message but not pushed it yet: try next turn.
            let Some(m) = self.overflow.pop() else { break };
            // Ring entries visible now were sent before `m` by its sender, or concurrently by
            // others (senders use the overflow while it is counted non-empty): they go first.
            while let Some(r) = self.ring.pop() {
                f(r);
                n += 1;
            }
            self.overflow_len.fetch_sub(1, Ordering::SeqCst);
            f(m);
            n += 1;
        }
        n
    }

    /// Takes the next message, if any (the owner only).
    pub fn pop(&self) -> Option<InlineMsg> {
        let mut got = None;
        self.drain(1, |m| got = Some(m));
        got
    }

    /// True if no message is queued.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.overflow_len.load(Ordering::SeqCst) == 0
    }

    /// Announces that the owner is about to sleep; returns false (and cancels) if messages arrived.
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !self.is_empty() {
            self.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Marks the owner awake again.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Marks the mailbox closed (its owner is exiting) and drops every queued message, on the
    /// calling thread. Messages posted later are dropped by their sender, so a caller waiting
    /// for an answer sees its sender dropped instead of waiting forever.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.discard();
    }

    /// True once [`Mailbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn discard(&self) {
        while self.ring.pop().is_some() {}
        while self.overflow.pop().is_some() {
            self.overflow_len.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Drains the doorbell's counter.
    pub fn clear_doorbell(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.doorbell.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
    }

    /// The doorbell's file descriptor, for polling by the owner's io_uring.
    pub fn doorbell_fd(&self) -> i32 {
        self.doorbell.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn small_closures_fit_and_big_ones_are_boxed() {
        let a = [0u64; 6];
        let small = move || assert_eq!(a[0], 0);
        let b = [0u64; 7];
        let big = move || assert_eq!(b[0], 0);
        assert!(InlineMsg::fits::<fn()>());
        assert!(fits_val(&small));
        assert!(!fits_val(&big));
        // Both run, and captured values are dropped exactly once whether run or not.
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (h1, h2) = (hits.clone(), hits.clone());
        let pad = [1u64; 16];
        InlineMsg::new(move || h1.lock().unwrap().push(1)).run();
        InlineMsg::new(move || h2.lock().unwrap().push(pad[0] as i32 + 1)).run();
        let h3 = hits.clone();
        drop(InlineMsg::new(move || h3.lock().unwrap().push(99)));
        assert_eq!(*hits.lock().unwrap(), vec![1, 2]);
        assert_eq!(Arc::strong_count(&hits), 1, "a closure was leaked");
    }

    fn fits_val<F>(_: &F) -> bool {
        InlineMsg::fits::<F>()
    }

    #[test]
    fn overflow_keeps_each_senders_order() {
        let mb = Arc::new(Mailbox::new().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let total = RING_SLOTS * 3;
        let senders: Vec<_> = (0..2)
            .map(|s| {
                let (mb, seen) = (mb.clone(), seen.clone());
                std::thread::spawn(move || {
                    for i in 0..total {
                        let seen = seen.clone();
                        mb.post_fn(move || seen.lock().unwrap().push((s, i)));
                    }
                })
            })
            .collect();
        let mut taken = 0;
        while taken < 2 * total {
            taken += mb.drain(100, |m| m.run());
            // Consume slowly at first so the ring fills and the overflow is used.
            if taken < total {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        for s in senders {
            s.join().unwrap();
        }
        assert!(mb.is_empty());
        let seen = seen.lock().unwrap();
        for s in 0..2 {
            let order: Vec<usize> = seen.iter().filter(|(x, _)| *x == s).map(|(_, i)| *i).collect();
            assert_eq!(order, (0..total).collect::<Vec<_>>(), "sender {s} out of order");
        }
    }

    #[test]
    fn closed_mailbox_drops_messages() {
        let mb = Mailbox::new().unwrap();
        let token = Arc::new(());
        let t = token.clone();
        mb.post_fn(move || drop(t));
        mb.close();
        assert_eq!(Arc::strong_count(&token), 1, "queued message not dropped by close");
        let t = token.clone();
        mb.post_fn(move || drop(t));
        assert_eq!(Arc::strong_count(&token), 1, "message posted after close not dropped");
        assert!(mb.is_empty());
    }
}
