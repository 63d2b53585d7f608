//! The inbound message queue of a reactor: lock-free, many producers, one consumer, with an
//! eventfd doorbell that is rung only when the reactor sleeps.

use crossbeam_queue::SegQueue;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};

/// A message: a closure run once on the receiving reactor.
pub type Message = Box<dyn FnOnce() + Send + 'static>;

/// One reactor's inbound queue and doorbell.
pub struct Mailbox {
    queue: SegQueue<Message>,
    sleeping: AtomicBool,
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
            queue: SegQueue::new(),
            sleeping: AtomicBool::new(false),
            // SAFETY: fd is a new descriptor that nothing else owns.
            doorbell: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Queues a message; rings the doorbell if the owner is asleep.
    pub fn post(&self, msg: Message) {
        self.queue.push(msg);
        // Pairs with the fence in `prepare_sleep`: either the owner sees the message, or we see
        // that it sleeps and wake it.
        fence(Ordering::SeqCst);
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

    /// Takes the next message, if any.
    #[inline]
    pub fn pop(&self) -> Option<Message> {
        self.queue.pop()
    }

    /// Announces that the owner is about to sleep; returns false (and cancels) if messages arrived.
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !self.queue.is_empty() {
            self.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Marks the owner awake again.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
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
