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

/// The entry could not be queued: the submission queue is full and could not be drained, or
/// the handler table reached [`MAX_HANDLERS`]. Retry after completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

const DOORBELL_TOKEN: u64 = u64::MAX;
/// Size of each ring's fixed file table.
const FILE_SLOTS: u32 = 64;
/// Upper bound of a handler table (operations in flight on one ring). The table starts at the
/// configured size and doubles up to this when more operations are outstanding (an idle
/// connection keeps a receive pending, so thousands of them need thousands of entries).
pub const MAX_HANDLERS: usize = 1 << 20;
/// Upper bound of the completion queue size asked from the kernel (its own limit is 2^17 on
/// current kernels; the ring falls back to the default if refused).
const MAX_CQ_ENTRIES: u32 = 1 << 16;

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
    /// Entries with a handler that have not completed yet.
    in_flight: usize,
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
    /// Creates a ring of `entries` submission entries whose handler table starts with `handlers`
    /// entries (it grows on demand up to [`MAX_HANDLERS`]), and arms the doorbell poll. The
    /// completion queue is sized for the handler table (at least twice the submission queue), so
    /// that many operations completing at once do not overflow it.
    pub fn new(entries: u32, handlers: usize, doorbell_fd: i32) -> std::io::Result<Self> {
        let handlers = handlers.clamp(1, MAX_HANDLERS);
        let cq = (handlers as u32).clamp(entries.saturating_mul(2), MAX_CQ_ENTRIES.max(entries.saturating_mul(2)));
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq)
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(entries))
            .or_else(|_| IoUring::new(entries))?;
        let mut r = Self {
            ring,
            slots: (0..handlers).map(|_| Slot { handler: None, tag: 0, worker: false }).collect(),
            free: (0..handlers as u32).rev().collect(),
            in_flight: 0,
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
        let slot = self.take_slot(handler, tag, worker)?;
        if let Err(full) = self.push_raw(e.user_data(slot as u64)) {
            self.put_slot(slot);
            return Err(full);
        }
        Ok(())
    }

    /// Takes a free handler slot for `handler`, growing the table if every slot is in use.
    fn take_slot(&mut self, handler: Rc<dyn CqeHandler>, tag: u64, worker: bool) -> Result<u32, RingFull> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let slot = self.free.pop().ok_or(RingFull)?;
        self.slots[slot as usize] = Slot { handler: Some(handler), tag, worker };
        self.in_flight += 1;
        self.worker_ops += worker as u32;
        Ok(slot)
    }

    /// Gives back a slot whose entry never reached the submission queue.
    fn put_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.handler = None;
        self.worker_ops -= s.worker as u32;
        self.in_flight -= 1;
        self.free.push(slot);
    }

    /// Doubles the handler table (up to MAX_HANDLERS). Slot numbers are the entries'
    /// `user_data`, so existing slots keep their index.
    fn grow(&mut self) -> Result<(), RingFull> {
        let old = self.slots.len();
        let new = (old * 2).clamp(1, MAX_HANDLERS);
        if new <= old {
            return Err(RingFull);
        }
        self.slots.resize_with(new, || Slot { handler: None, tag: 0, worker: false });
        self.free.extend((old as u32..new as u32).rev());
        log::info!("io_uring handler table grown from {old} to {new} entries ({} in flight)", self.in_flight);
        Ok(())
    }

    /// Queues `first` linked (`IOSQE_IO_LINK`) to `second`, each with its handler and tag, as
    /// two adjacent submission entries: `second` starts only when `first` completes, or (for a
    /// `LinkTimeout`) bounds how long `first` may take. Either both are queued or neither.
    ///
    /// # Safety
    /// As for [`Ring::push`], for both entries.
    pub unsafe fn push_linked(
        &mut self,
        first: (squeue::Entry, Rc<dyn CqeHandler>, u64),
        second: (squeue::Entry, Rc<dyn CqeHandler>, u64),
    ) -> Result<(), RingFull> {
        if self.sq_room() < 2 {
            self.submit();
            if self.sq_room() < 2 {
                return Err(RingFull);
            }
        }
        let a = self.take_slot(first.1, first.2, false)?;
        let b = match self.take_slot(second.1, second.2, false) {
            Ok(b) => b,
            Err(full) => {
                self.put_slot(a);
                return Err(full);
            }
        };
        let ea = first.0.user_data(a as u64).flags(squeue::Flags::IO_LINK);
        let eb = second.0.user_data(b as u64);
        // SAFETY: the caller guarantees the entries' memory; there is room for both, so neither
        // push fails and the two are adjacent.
        unsafe {
            let mut sq = self.ring.submission();
            let ok = sq.push(&ea).is_ok() && sq.push(&eb).is_ok();
            debug_assert!(ok, "room for two entries was checked");
        }
        self.pending += 2;
        Ok(())
    }

    /// Free submission queue entries right now.
    fn sq_room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Asks the kernel to cancel every operation in flight on descriptor `fd`
    /// (`IORING_OP_ASYNC_CANCEL` with `IORING_ASYNC_CANCEL_FD | ALL`). The cancelled operations
    /// complete with `-ECANCELED` (or with their result, if they finished first); `handler` gets
    /// the cancel's own result (how many were found, or a negated errno).
    pub fn cancel_fd(&mut self, fd: i32, handler: Rc<dyn CqeHandler>, tag: u64) -> Result<(), RingFull> {
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all()).build();
        // SAFETY: a cancel names no memory, only a descriptor number to match.
        unsafe { self.push(e, handler, tag) }
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

    /// Entries that can still be pushed before the handler table reaches [`MAX_HANDLERS`].
    pub fn free_slots(&self) -> usize {
        MAX_HANDLERS - self.in_flight
    }

    /// Entries with a handler in flight (pushed and not yet completed).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Current size of the handler table.
    pub fn handler_capacity(&self) -> usize {
        self.slots.len()
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
                    r.in_flight -= 1;
                    r.free.push(token as u32);
                    (h, tag)
                };
                handler.complete(tag, res);
            }
        }
    }

    /// True if any entry is in flight (other than the doorbell).
    pub fn busy(&self) -> bool {
        self.in_flight > 0
    }
}

pub use io_uring::{opcode as uring_opcode, squeue::Entry as SqEntry, types as uring_types};
