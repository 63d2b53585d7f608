//! The reactor's io_uring: submission with a completion handler per entry, batched submits,
//! and the sleep that waits for a completion, the doorbell or a timeout.

use io_uring::{opcode, squeue, types, IoUring};
use std::rc::Rc;
use std::time::Duration;

/// Receives the completion of an entry pushed with [`Ring::push`].
pub trait CqeHandler {
    /// Called on the reactor that pushed the entry, with the tag given at push time and the
    /// kernel's result (a byte count or a negated errno).
    fn complete(&self, tag: u64, result: i32);
}

/// The submission queue is full and could not be drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

const DOORBELL_TOKEN: u64 = u64::MAX;
/// Size of each ring's fixed file table.
const FILE_SLOTS: u32 = 64;

struct Slot {
    handler: Option<Rc<dyn CqeHandler>>,
    tag: u64,
    /// Completed by an io-wq worker thread rather than inline or by an interrupt.
    worker: bool,
}

/// One reactor's io_uring with its handler table.
pub struct Ring {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    pending: u32,
    doorbell_fd: i32,
    doorbell_armed: bool,
    doorbell_buf: Box<u64>,
    free_files: Vec<u32>,
    worker_ops: u32,
    /// Number of io_uring_enter calls (for counting syscalls per I/O).
    pub enters: u64,
}

impl Ring {
    /// Creates a ring of `entries` submission entries and arms the doorbell poll.
    pub fn new(entries: u32, doorbell_fd: i32) -> std::io::Result<Self> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
            .or_else(|_| IoUring::new(entries))?;
        let cap = (entries * 2) as usize;
        let mut r = Self {
            ring,
            slots: (0..cap).map(|_| Slot { handler: None, tag: 0, worker: false }).collect(),
            free: (0..cap as u32).rev().collect(),
            pending: 0,
            doorbell_fd,
            doorbell_armed: false,
            doorbell_buf: Box::new(0),
            free_files: Vec::new(),
            worker_ops: 0,
            enters: 0,
        };
        if r.ring.submitter().register_files_sparse(FILE_SLOTS).is_ok() {
            r.free_files = (0..FILE_SLOTS).rev().collect();
        }
        r.arm_doorbell();
        Ok(r)
    }

    /// Registers memory regions as fixed buffers (index = position in `regions`).
    pub fn register_buffers(&mut self, regions: &[libc::iovec]) -> std::io::Result<()> {
        if regions.is_empty() {
            return Ok(());
        }
        // SAFETY: the regions are mappings owned by the reactor's buffer pool, which lives
        // as long as the reactor and therefore as long as this ring.
        unsafe { self.ring.submitter().register_buffers(regions) }
    }

    /// Installs `fd` in the ring's fixed file table; returns its index, or None if the table is
    /// full or unsupported (callers then use the plain descriptor).
    pub fn install_file(&mut self, fd: i32) -> Option<u32> {
        let slot = self.free_files.pop()?;
        match self.ring.submitter().register_files_update(slot, &[fd]) {
            Ok(_) => Some(slot),
            Err(e) => {
                log::debug!("fixed file registration failed: {e}");
                self.free_files.push(slot);
                None
            }
        }
    }

    /// Removes a file installed with `install_file`.
    pub fn remove_file(&mut self, slot: u32) {
        if self.ring.submitter().register_files_update(slot, &[-1]).is_ok() {
            self.free_files.push(slot);
        }
    }

    fn arm_doorbell(&mut self) {
        // A plain read of the eventfd: it completes when the doorbell rings and drains it.
        let e = opcode::Read::new(types::Fd(self.doorbell_fd), &mut *self.doorbell_buf as *mut u64 as *mut u8, 8)
            .build()
            .user_data(DOORBELL_TOKEN);
        if self.push_raw(e).is_ok() {
            self.doorbell_armed = true;
        }
    }

    fn push_raw(&mut self, e: squeue::Entry) -> Result<(), RingFull> {
        // SAFETY: callers guarantee that the buffers named by `e` live until its completion.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.submit();
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                return Err(RingFull);
            }
        }
        self.pending += 1;
        Ok(())
    }

    /// Queues an entry; `handler.complete(tag, res)` runs when it completes. The entry is
    /// submitted at the end of the current loop turn (or earlier if the queue fills).
    ///
    /// # Safety
    /// Every buffer and file descriptor the entry refers to must stay valid until the handler
    /// is called.
    pub unsafe fn push(&mut self, e: squeue::Entry, handler: Rc<dyn CqeHandler>, tag: u64) -> Result<(), RingFull> {
        // SAFETY: forwarded from the caller.
        unsafe { self.push_as(e, handler, tag, false) }
    }

    /// Like [`Ring::push`], for an entry that the kernel is expected to hand to an io-wq worker
    /// (e.g. O_DIRECT on a file system without async direct I/O). While such entries are in
    /// flight an adaptive reactor sleeps rather than spins, so the worker gets the core.
    ///
    /// # Safety
    /// As for [`Ring::push`].
    pub unsafe fn push_worker_bound(
        &mut self,
        e: squeue::Entry,
        handler: Rc<dyn CqeHandler>,
        tag: u64,
    ) -> Result<(), RingFull> {
        // SAFETY: forwarded from the caller.
        unsafe { self.push_as(e, handler, tag, true) }
    }

    unsafe fn push_as(
        &mut self,
        e: squeue::Entry,
        handler: Rc<dyn CqeHandler>,
        tag: u64,
        worker: bool,
    ) -> Result<(), RingFull> {
        let Some(slot) = self.free.pop() else { return Err(RingFull) };
        self.slots[slot as usize] = Slot { handler: Some(handler), tag, worker };
        if let Err(full) = self.push_raw(e.user_data(slot as u64)) {
            self.slots[slot as usize].handler = None;
            self.free.push(slot);
            return Err(full);
        }
        self.worker_ops += worker as u32;
        Ok(())
    }

    /// True while entries pushed with `push_worker_bound` are in flight.
    pub fn waits_on_workers(&self) -> bool {
        self.worker_ops > 0
    }

    /// Runs completion work the kernel left for this thread (socket operations complete that
    /// way). With cooperative task running the kernel does not interrupt a polling reactor; it
    /// raises a flag instead, and any io_uring_enter runs the work. Returns true if it entered.
    pub fn run_task_work(&mut self) -> bool {
        if !self.ring.submission().taskrun() {
            return false;
        }
        self.enters += 1;
        let n = self.ring.submitter().submit().unwrap_or(0);
        self.pending -= (n as u32).min(self.pending);
        true
    }

    /// Entries queued but not yet submitted.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Entries that can still be pushed before the handler table is full.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Submits queued entries without waiting. Returns how many were submitted.
    pub fn submit(&mut self) -> usize {
        if self.pending == 0 {
            return 0;
        }
        self.enters += 1;
        match self.ring.submit() {
            Ok(n) => {
                self.pending -= (n as u32).min(self.pending);
                n
            }
            Err(e) => {
                log::warn!("io_uring submit failed: {e}");
                0
            }
        }
    }

    /// Blocks until a completion (or the doorbell) arrives, or `timeout` passes.
    pub fn wait(&mut self, timeout: Option<Duration>) {
        if !self.doorbell_armed {
            self.arm_doorbell();
        }
        if !self.ring.completion().is_empty() {
            self.submit();
        } else {
            self.enters += 1;
            let res = match timeout {
                Some(t) => {
                    let ts = types::Timespec::from(t);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                None => self.ring.submit_and_wait(1),
            };
            match res {
                Ok(n) => self.pending -= (n as u32).min(self.pending),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => {}
                Err(e) => log::warn!("io_uring wait failed: {e}"),
            }
        }
    }

    /// Takes completed entries and runs their handlers. Returns how many completed.
    pub fn reap(this: &std::cell::RefCell<Self>) -> usize {
        let mut total = 0;
        loop {
            let mut batch: [(u64, i32); 32] = [(0, 0); 32];
            let n = {
                let mut r = this.borrow_mut();
                let mut n = 0;
                for cqe in r.ring.completion() {
                    batch[n] = (cqe.user_data(), cqe.result());
                    n += 1;
                    if n == batch.len() {
                        break;
                    }
                }
                n
            };
            if n == 0 {
                return total;
            }
            total += n;
            for &(token, res) in &batch[..n] {
                if token == DOORBELL_TOKEN {
                    let mut r = this.borrow_mut();
                    r.doorbell_armed = false;
                    r.arm_doorbell();
                    continue;
                }
                let (handler, tag) = {
                    let mut r = this.borrow_mut();
                    let slot = &mut r.slots[token as usize];
                    let h = slot.handler.take().expect("completion for an empty ring slot");
                    let tag = slot.tag;
                    let worker = slot.worker;
                    r.worker_ops -= worker as u32;
                    r.free.push(token as u32);
                    (h, tag)
                };
                handler.complete(tag, res);
            }
        }
    }

    /// True if any entry is in flight (other than the doorbell).
    pub fn busy(&self) -> bool {
        self.free.len() < self.slots.len()
    }
}

pub use io_uring::{opcode as uring_opcode, squeue::Entry as SqEntry, types as uring_types};
